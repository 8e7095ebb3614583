//! `perfkit check`: the lint gate over the lint fixtures and the profile gate over synthetic
//! runs (traces written with the profiler's `TraceWriter`, GPU timings from the simulator in
//! `reports/tests/synth`, not from a GPU).

#[path = "../reports/tests/synth/mod.rs"]
mod synth;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;
use synth::{Synth, Workload, trace_bytes};

fn perfkit() -> Command {
    let mut c = Command::cargo_bin("perfkit").expect("perfkit binary");
    c.env_remove("GITHUB_STEP_SUMMARY");
    c
}

/// `perfkit check --baseline BASE --candidate CANDIDATE`, for more arguments to be added.
fn check(baseline: impl AsRef<std::ffi::OsStr>, candidate: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = perfkit();
    c.args(["check", "--baseline"])
        .arg(baseline)
        .arg("--candidate")
        .arg(candidate);
    c
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> PathBuf {
    root().join("fixtures/lint").join(name)
}

/// Writes a run directory holding one synthetic trace.
fn run_dir(root: &Path, name: &str, wl: &Workload) -> PathBuf {
    let dir = root.join(name).join("trace");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("train-7.pktrace"),
        trace_bytes("train", 7, None, 0, wl),
    )
    .expect("write trace");
    dir
}

#[test]
fn lint_gate_fails_on_warnings_and_passes_on_clean_code() {
    perfkit()
        .args(["check", "--lint"])
        .arg(fixture("pk102-sync-in-step-loop"))
        .assert()
        .code(1)
        .stdout(predicate::str::contains("PK102"))
        .stdout(predicate::str::contains("perfkit check: FAIL"));

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("lib.rs"),
        "pub fn add(a: u32, b: u32) -> u32 { a + b }\n",
    )
    .expect("write");
    perfkit()
        .args(["check", "--lint"])
        .arg(dir.path())
        .assert()
        .code(0)
        .stdout(predicate::str::contains("perfkit check: PASS"));
}

#[test]
fn fail_level_decides_which_findings_fail() {
    // PK202 is a note by default: it fails only with --fail-on note.
    let pk202 = fixture("pk202-alloc-in-step-loop");
    perfkit()
        .args(["check", "--fail-on", "error", "--lint"])
        .arg(&pk202)
        .assert()
        .code(0);
    perfkit()
        .args(["check", "--fail-on", "note", "--lint"])
        .arg(&pk202)
        .assert()
        .code(1);
}

#[test]
fn github_format_sarif_and_step_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sarif = dir.path().join("lint.sarif");
    let summary = dir.path().join("summary.md");
    std::fs::write(&summary, "previous step\n").expect("write");
    let out = perfkit()
        .env("GITHUB_STEP_SUMMARY", &summary)
        .args(["check", "--format", "github", "--sarif"])
        .arg(&sarif)
        .arg("--lint")
        .arg(fixture("pk101-host-readback-in-step-loop"))
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let stdout = String::from_utf8(out).expect("utf-8");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("::warning file=") && l.contains("PK101")),
        "{stdout}"
    );
    let log: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sarif).expect("sarif written"))
            .expect("sarif is JSON");
    assert_eq!(log["version"], "2.1.0");
    let results = log["runs"][0]["results"].as_array().expect("results");
    assert!(
        results.iter().any(|r| r["ruleId"] == "PK101"),
        "{results:#?}"
    );
    let md = std::fs::read_to_string(&summary).expect("summary");
    assert!(md.starts_with("previous step\n## perfkit check"), "{md}");
    assert!(
        md.contains("| PK101 |") && md.contains("**result: FAIL**"),
        "{md}"
    );
}

#[test]
fn sarif_replaces_only_its_own_log_and_never_writes_through_a_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lint = fixture("pk101-host-readback-in-step-loop");
    let check = |sarif: &std::path::Path| {
        let mut cmd = perfkit();
        cmd.args(["check", "--sarif"])
            .arg(sarif)
            .arg("--lint")
            .arg(&lint);
        cmd.assert()
    };
    // A log of perfkit's own (an earlier check) is replaced.
    let own = dir.path().join("lint.sarif");
    check(&own).code(1);
    let first = std::fs::read(&own).expect("written");
    check(&own).code(1);
    assert_eq!(std::fs::read(&own).unwrap(), first);
    // Any other file stays as it was, and the run fails naming it.
    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, "keep me\n").expect("write");
    let out = check(&foreign).code(2).get_output().stderr.clone();
    let stderr = String::from_utf8_lossy(&out);
    assert!(
        stderr.contains("not a SARIF log written by perfkit"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "keep me\n");
    // A symbolic link is not written through, even to a log of perfkit's.
    let link = dir.path().join("link.sarif");
    std::os::unix::fs::symlink(&own, &link).expect("symlink");
    let out = check(&link).code(2).get_output().stderr.clone();
    assert!(String::from_utf8_lossy(&out).contains("symbolic link"));
    assert_eq!(std::fs::read(&own).unwrap(), first);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".perfkit-sarif")
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn anti_pattern_run_fails_against_the_tuned_baseline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = run_dir(dir.path(), "tuned", &Workload::tuned());
    let new = run_dir(dir.path(), "anti", &Workload::anti_patterns());
    let summary = dir.path().join("summary.md");
    perfkit()
        .env("GITHUB_STEP_SUMMARY", &summary)
        .args(["check", "--max-regression", "5%", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&new)
        .assert()
        .code(1)
        .stdout(predicate::str::is_match("median step time: .* regression").expect("regex"))
        .stdout(predicate::str::is_match("copy time per step: .* regression").expect("regex"))
        .stdout(predicate::str::contains("perfkit check: FAIL"));
    let md = std::fs::read_to_string(&summary).expect("summary");
    assert!(
        md.contains("| median step time |") && md.contains("**regression**"),
        "{md}"
    );

    // The other way round is an improvement, which passes.
    check(&new, &base)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("improved"))
        .stdout(predicate::str::contains("perfkit check: PASS"));
}

#[test]
fn tuned_run_passes_against_itself_and_against_a_rerun() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = run_dir(dir.path(), "tuned", &Workload::tuned());
    let rerun = run_dir(
        dir.path(),
        "rerun",
        &Workload {
            seed: 99,
            ..Workload::tuned()
        },
    );
    for candidate in [&base, &rerun] {
        check(&base, candidate)
            .assert()
            .code(0)
            .stdout(predicate::str::contains("perfkit check: PASS"));
    }
    // With --format github a passing gate writes no annotation.
    perfkit()
        .args(["check", "--format", "github", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&rerun)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("::error").not());
}

/// One run given several times on a side would look like runs with no spread, and any change
/// would test significant: refused, naming the run.
#[test]
fn a_run_given_twice_on_one_side_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = run_dir(dir.path(), "tuned", &Workload::tuned());
    let other = run_dir(dir.path(), "other", &Workload::tuned());
    let spelled_again = dir.path().join("tuned/../tuned/trace");
    perfkit()
        .args(["check", "--baseline"])
        .arg(&base)
        .arg(&spelled_again)
        .arg("--candidate")
        .arg(&other)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("are the same run"));
    perfkit()
        .args(["check", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&other)
        .arg(&other)
        .arg(&base)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--candidate:"));
}

/// Two runs with steps but no GPU work (CPU runs): the step time is compared, and the gates
/// that need GPU work say that they were not applied instead of vanishing.
#[test]
fn cpu_runs_say_which_gates_were_not_applied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cpu_run = |name: &str, step_ns: u64| {
        let trace = dir.path().join(name).join("trace");
        std::fs::create_dir_all(&trace).expect("mkdir");
        let mut s = Synth::new(Vec::new(), "train", 3, None, 0);
        for step in 0..30 {
            s.enter(0, "step", Some(step));
            s.work(step_ns + (step % 3) * 1_000);
            s.exit(0);
        }
        std::fs::write(trace.join("train-3.pktrace"), s.finish(false)).expect("write trace");
        trace
    };
    let base = cpu_run("base", 1_000_000);
    let slower = cpu_run("slower", 2_000_000);
    let summary = dir.path().join("summary.md");
    check(&base, &slower)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("median step time"))
        .stdout(predicate::str::contains(
            "GPU idle share of step time: not compared, neither run recorded GPU work",
        ))
        .stdout(predicate::str::contains(
            "copy time per step: not compared, neither run recorded a copy",
        ))
        .stdout(predicate::str::contains("perfkit check: FAIL"));
    let md = std::fs::read_to_string(&summary).expect("step summary");
    assert!(
        md.contains("_GPU idle share of step time: not compared"),
        "{md}"
    );
}

#[test]
fn a_slower_run_beyond_noise_fails_and_github_annotates_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = run_dir(dir.path(), "tuned", &Workload::tuned());
    let slower = run_dir(
        dir.path(),
        "slower",
        &Workload {
            // Host-bound: data loading now takes longer than the GPU work of a step.
            data_ns: 1_500_000,
            seed: 5,
            ..Workload::tuned()
        },
    );
    perfkit()
        .args(["check", "--format", "github", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&slower)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "::error title=perfkit check::median step time",
        ));
    // A generous allowance lets the same change pass.
    perfkit()
        .args(["check", "--max-regression", "200", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&slower)
        .assert()
        .code(0);
}

#[test]
fn bad_input_is_an_error_with_exit_code_2() {
    perfkit()
        .arg("check")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("nothing to check"));
    perfkit()
        .args([
            "check",
            "--baseline",
            "no/such/run",
            "--candidate",
            "no/such/run",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no/such/run"));
    perfkit()
        .args(["check", "--baseline", "a"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--candidate"));
    perfkit()
        .args(["check", "--max-regression", "lots", "--lint", "."])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a percentage"));
}

/// A synthetic trace shaped like what `train --readback-every-step --pageable` records on a
/// GPU (written with the profiler's `TraceWriter`; the timings are made up, not measured): per
/// step, a pageable upload of the batch from the lines of `upload_pageable`, a kernel, and a
/// 4-byte loss readback from the line of `read_loss_every_step`.
fn readback_pageable_trace(steps: u64) -> Vec<u8> {
    gpu_step_trace(steps, true, false)
}

/// The trace of [`readback_pageable_trace`], with the loss readback (line 29) and a stream
/// synchronization at the end of each step (line 38, as `--sync-every-step` issues it) on or
/// off.
fn gpu_step_trace(steps: u64, readback: bool, sync: bool) -> Vec<u8> {
    use perfkit_profiler::TraceWriter;
    use perfkit_profiler::model::{
        Callsite, CallsiteKind, EndReason, GpuEvent, GpuOpKind, Header, HostMemory, KernelInfo,
        Record, SourceLocation, SpanEdge, SpanId, SpanNew, ThreadInfo, TraceEnd,
    };
    use std::sync::Arc;

    let mut w = TraceWriter::new(Vec::new(), &Header::new("train", 11)).expect("header");
    w.write(&Record::Thread(ThreadInfo::new(0, 1, Some("main"))))
        .expect("write");
    let step_cs = Arc::new(Callsite::new("step", "train", CallsiteKind::Span, &[]));
    let at = |line: u32| {
        Some(SourceLocation {
            file: "kernels/src/antipatterns.rs".into(),
            line,
            column: 12,
        })
    };
    let gpu = |id: u64, kind, bytes, mem, host: (u64, u64), dev: (u64, u64), loc| GpuEvent {
        thread: 0,
        kind,
        id,
        device: 0,
        stream: Some(1),
        bytes,
        host_memory: mem,
        host_start: host.0,
        host_end: host.1,
        gpu_start: Some(dev.0),
        gpu_end: Some(dev.1),
        gpu_end_at_host_return: false,
        span: None,
        location: loc,
        kernel: (kind == GpuOpKind::Kernel).then(|| KernelInfo {
            name: "bias_act_fwd".into(),
            grid: [64, 1, 1],
            block: [256, 1, 1],
            shared_mem_bytes: 0,
        }),
    };
    let mut t = 1_000u64;
    let mut id = 1u64;
    for step in 0..steps {
        let span = SpanId(step + 1);
        w.write(&Record::SpanNew(SpanNew {
            thread: 0,
            ts: t,
            id: span,
            parent: None,
            callsite: step_cs.clone(),
            fields: Vec::new(),
        }))
        .expect("write");
        w.write(&Record::SpanEnter(SpanEdge {
            thread: 0,
            ts: t,
            span,
        }))
        .expect("write");
        let mut ops = vec![
            // Pageable upload of the batch (802,816 bytes) and of the labels.
            gpu(
                id,
                GpuOpKind::MemcpyHtoD,
                802_816,
                Some(HostMemory::Pageable),
                (t, t + 150_000),
                (t + 10_000, t + 140_000),
                at(118),
            ),
            gpu(
                id + 1,
                GpuOpKind::MemcpyHtoD,
                1_024,
                Some(HostMemory::Pageable),
                (t + 150_000, t + 160_000),
                (t + 152_000, t + 155_000),
                at(119),
            ),
            gpu(
                id + 2,
                GpuOpKind::Kernel,
                0,
                None,
                (t + 160_000, t + 165_000),
                (t + 165_000, t + 465_000),
                None,
            ),
        ];
        if readback {
            // The readback waits for the kernel.
            ops.push(gpu(
                id + 3,
                GpuOpKind::MemcpyDtoH,
                4,
                Some(HostMemory::Pageable),
                (t + 165_000, t + 470_000),
                (t + 466_000, t + 468_000),
                at(29),
            ));
        }
        if sync {
            ops.push(GpuEvent {
                gpu_start: None,
                gpu_end: None,
                ..gpu(
                    0,
                    GpuOpKind::Synchronize,
                    0,
                    None,
                    (t + 470_000, t + 480_000),
                    (0, 0),
                    at(38),
                )
            });
        }
        id += 4;
        t += 500_000;
        for op in ops {
            w.write(&Record::Gpu(op)).expect("write");
        }
        w.write(&Record::SpanExit(SpanEdge {
            thread: 0,
            ts: t,
            span,
        }))
        .expect("write");
        w.write(&Record::SpanClose(SpanEdge {
            thread: 0,
            ts: t,
            span,
        }))
        .expect("write");
    }
    w.write(&Record::End(TraceEnd {
        ts: t,
        end_unix_ns: 0,
        reason: EndReason::GuardDropped,
        records: 0,
        dropped: 0,
    }))
    .expect("write");
    w.finish().expect("finish")
}

#[test]
fn lint_findings_of_the_trainer_are_confirmed_by_a_run_that_executes_their_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("train-11.pktrace");
    std::fs::write(&trace, readback_pageable_trace(20)).expect("write");
    let out = dir.path().join("out");
    // The trainer's lint findings beside the measured ones, as `perfkit report --lint` (and
    // `perfkit profile`, `perfkit demo`) put them: `path:line:column`, paths relative to the
    // workspace root.
    perfkit()
        .current_dir(root())
        .arg("report")
        .arg(&trace)
        .args(["--format", "json", "--out"])
        .arg(&out)
        .arg("--lint")
        .arg(root().join("kernels"))
        .assert()
        .success();
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
    )
    .expect("summary JSON");
    let merged = summary["findings"].as_array().expect("findings");
    let lint = |f: &&serde_json::Value| f["origin"] == "lint";
    assert!(
        merged.iter().filter(lint).any(|f| f["code"] == "PK101"),
        "{merged:#?}"
    );
    for (code, line) in [("PK101", ":29:"), ("PK303", ":118:")] {
        let f = merged
            .iter()
            .filter(lint)
            .find(|f| {
                f["code"] == code
                    && f["location"]
                        .as_str()
                        .is_some_and(|l| l.starts_with("kernels/") && l.contains(line))
            })
            .unwrap_or_else(|| panic!("{code} lint finding missing: {merged:#?}"));
        assert_eq!(f["confirmed"], true, "{code} not confirmed: {merged:#?}");
        let cost = f["cost_per_step_ns"].as_u64().expect("cost");
        assert!(cost > 0 && f["share_of_step_percent"].is_number(), "{f:#?}");
    }
    // PK101: the host waited 305 us per step on a 500 us step.
    let pk101 = merged
        .iter()
        .find(|f| f["code"] == "PK101" && f["confirmed"] == true)
        .expect("pk101");
    assert_eq!(pk101["cost_per_step_ns"], 305_000);
    assert_eq!(pk101["share_of_step_percent"], 61.0);
    // Lines that never ran (the other anti-pattern switches) stay unconfirmed.
    assert!(
        merged
            .iter()
            .any(|f| f["code"] == "PK202" && f["confirmed"] == false)
    );
}

#[test]
fn runs_without_steps_cannot_be_compared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = synth::Synth::new(Vec::new(), "train", 3, None, 0);
    s.kernel(0, "gemm_fwd", synth::COMPUTE, 100_000, false);
    let trace = dir.path().join("nosteps.pktrace");
    std::fs::write(&trace, s.finish(false)).expect("write");
    check(&trace, &trace)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("need step spans"));
}

#[test]
fn a_profile_table_in_perfkit_toml_does_not_break_the_lint_gate() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("perfkit.toml"),
        "[profile]\nidle-share = 0.3\nloader-spans = [\"fetch\"]\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("lib.rs"),
        "pub fn add(a: u32, b: u32) -> u32 { a + b }\n",
    )
    .expect("write");
    perfkit()
        .current_dir(dir.path())
        .args(["check", "--lint", "."])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("perfkit check: PASS"));
}

/// Writes `trace` as the one trace of a run directory `root/name`.
fn trace_run(root: &Path, name: &str, trace: Vec<u8>) -> PathBuf {
    let dir = root.join(name).join("trace");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("train-11.pktrace"), trace).expect("write trace");
    dir
}

/// A candidate that adds a per-step readback and a per-step synchronization fails on the
/// counters, naming the rules and the lines the new operations come from, whatever the timing.
#[test]
fn a_new_per_step_readback_or_sync_fails_the_counter_gate_with_its_source_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = trace_run(dir.path(), "base", gpu_step_trace(20, false, false));
    let readback = trace_run(dir.path(), "readback", gpu_step_trace(20, true, false));
    let both = trace_run(dir.path(), "both", gpu_step_trace(20, true, true));
    perfkit()
        .args(["check", "--format", "github", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&readback)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "PK101: device-to-host copies per step 0 -> 1, new at kernels/src/antipatterns.rs:29: FAIL",
        ))
        .stdout(predicate::str::contains(
            "::error title=perfkit check::PK101: device-to-host copies per step 0 -> 1",
        ))
        .stdout(predicate::str::contains("PK102").not())
        .stdout(predicate::str::contains("perfkit check: FAIL"));
    check(&readback, &both)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "PK102: explicit synchronizations per step 0 -> 1, new at kernels/src/antipatterns.rs:38: FAIL",
        ))
        .stdout(predicate::str::contains(
            "PK101: device-to-host copies per step 1 -> 1: same",
        ));
    // Removing them passes the counters (and the step got no slower).
    check(&both, &base)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("0 grew: pass"))
        .stdout(predicate::str::contains("perfkit check: PASS"));
    // An allowance in `[check.counters]` lets one readback per step through.
    std::fs::write(
        dir.path().join("perfkit.toml"),
        "[check.counters]\nd2h-copies = 1\n",
    )
    .expect("write");
    check(&base, &readback)
        .current_dir(dir.path())
        .assert()
        .code(0)
        .stdout(predicate::str::contains(
            "PK101: device-to-host copies per step 0 -> 1, new at kernels/src/antipatterns.rs:29: pass (growth allowed: 1)",
        ));
    // A bad key in the table is an error that names the file and the key.
    std::fs::write(
        dir.path().join("perfkit.toml"),
        "[check.counters]\nreadbacks = 1\n",
    )
    .expect("write");
    check(&base, &readback)
        .current_dir(dir.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("perfkit.toml"))
        .stderr(predicate::str::contains("unknown counter `readbacks`"));
}

/// A CPU run has no GPU counters, but its span entries per step are counted: a loader that
/// now fetches twice per step fails, naming the line of the new span entries.
#[test]
fn cpu_runs_gate_span_entries_per_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cpu_run = |name: &str, fetches: u64| {
        let trace = dir.path().join(name).join("trace");
        std::fs::create_dir_all(&trace).expect("mkdir");
        let mut s = Synth::new(Vec::new(), "train", 3, None, 0);
        for step in 0..30 {
            s.enter(0, "step", Some(step));
            for _ in 0..fetches {
                s.enter(0, "fetch", None);
                s.work(100_000);
                s.exit(0);
            }
            s.work(1_000_000);
            s.exit(0);
        }
        std::fs::write(trace.join("train-3.pktrace"), s.finish(false)).expect("write trace");
        trace
    };
    let base = cpu_run("base", 1);
    let twice = cpu_run("twice", 2);
    check(&base, &twice)
        .assert()
        .code(1)
        .stdout(predicate::str::is_match(r"entries of span `fetch` per step 1 -> 2, more at \S+ \(1\.0 -> 2\.0 per step\): FAIL").expect("regex"))
        .stdout(predicate::str::contains("perfkit check: FAIL"));
}

/// Two CPU runs of the reference trainer (the same binary, the same arguments) count the same
/// operations per step: the counter gate passes, whatever the machine did to the timing.
#[test]
fn two_runs_of_the_reference_trainer_count_the_same_per_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The reference trainer is linked into perfkit (`perfkit demo --run-trainer`).
    let perfkit_exe = assert_cmd::cargo::cargo_bin("perfkit");
    for name in ["a", "b"] {
        perfkit()
            .args(["profile", "--no-lint", "--out"])
            .arg(dir.path().join(name))
            .arg("--")
            .arg(&perfkit_exe)
            .args(["demo", "--run-trainer", "--device", "cpu", "--steps", "6"])
            .assert()
            .success();
    }
    perfkit()
        .args(["check", "--baseline"])
        .arg(dir.path().join("a"))
        .arg("--candidate")
        .arg(dir.path().join("b"))
        .assert()
        .stdout(predicate::str::contains(
            "(median over steps; 6 baseline and 6 candidate steps): 4 compared, 0 grew: pass",
        ))
        .stdout(predicate::str::contains(
            "entries of span `forward` per step 1 -> 1: same",
        ));
}

/// Several runs per side: per-run medians are compared with Welch's t-test and the output
/// gives the evidence; one run per side is judged against the noise floor and says the
/// verdict is weak.
#[test]
fn several_runs_per_side_are_judged_by_a_test_one_run_by_the_noise_floor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cpu_run = |name: &str, step_ns: u64| {
        let trace = dir.path().join(name).join("trace");
        std::fs::create_dir_all(&trace).expect("mkdir");
        let mut s = Synth::new(Vec::new(), "train", 3, None, 0);
        for step in 0..30 {
            s.enter(0, "step", Some(step));
            s.work(step_ns + (step % 3) * 1_000);
            s.exit(0);
        }
        std::fs::write(trace.join("train-3.pktrace"), s.finish(false)).expect("write trace");
        trace
    };
    // Baseline runs spread by about 1 %; the candidate runs are 12 % slower.
    let base: Vec<PathBuf> = [1_000_000, 1_010_000, 990_000]
        .iter()
        .enumerate()
        .map(|(i, &ns)| cpu_run(&format!("base{i}"), ns))
        .collect();
    let slow: Vec<PathBuf> = [1_120_000, 1_130_000, 1_110_000]
        .iter()
        .enumerate()
        .map(|(i, &ns)| cpu_run(&format!("slow{i}"), ns))
        .collect();
    perfkit()
        .args(["check", "--baseline"])
        .args(&base)
        .arg("--candidate")
        .args(&slow)
        .assert()
        .code(1)
        .stdout(predicate::str::is_match(r"median step time: .* regression; Welch t-test over per-run medians \(3 vs 3 runs, run-to-run sd 1\.0 %\): p = 0\.00\d < alpha 0\.05, 95 % interval of the change").expect("regex"))
        .stdout(predicate::str::contains("perfkit check: FAIL"));
    // The same 12 % with one run per side is within the 50 % noise floor: a weak pass.
    perfkit()
        .args(["check", "--baseline"])
        .arg(&base[0])
        .arg("--candidate")
        .arg(&slow[0])
        .assert()
        .code(0)
        .stdout(predicate::str::contains(
            "within noise; weak verdict: 1 vs 1 runs",
        ));
    // A lower noise floor makes it count.
    perfkit()
        .args(["check", "--noise-floor", "10%", "--baseline"])
        .arg(&base[0])
        .arg("--candidate")
        .arg(&slow[0])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("regression; weak verdict"));
    // Runs of the baseline against each other pass.
    perfkit()
        .args(["check", "--baseline"])
        .args(&base[..2])
        .arg("--candidate")
        .args(&base[1..])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("within noise; Welch t-test"));
}

/// `--repeat N --baseline-program P -- PROGRAM ARGS` records N runs of each side, interleaved,
/// and compares them with the test over per-run medians.
#[test]
fn repeat_records_interleaved_runs_of_both_programs_and_compares_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("runs");
    // The reference trainer is linked into perfkit (`perfkit demo --run-trainer`).
    let perfkit_exe = assert_cmd::cargo::cargo_bin("perfkit");
    let assert = perfkit()
        .args(["check", "--repeat", "2", "--out"])
        .arg(&out)
        .arg("--baseline-program")
        .arg(&perfkit_exe)
        .arg("--")
        .arg(&perfkit_exe)
        .args(["demo", "--run-trainer", "--device", "cpu", "--steps", "4"])
        .assert()
        .stdout(predicate::str::contains(
            "(median over steps; 8 baseline and 8 candidate steps): 4 compared, 0 grew: pass",
        ))
        .stdout(predicate::str::contains(
            "Welch t-test over per-run medians (2 vs 2 runs, run-to-run sd",
        ))
        .stderr(predicate::str::contains("candidate run 2 of 2"));
    // Pass or fail depends on this machine's timing; an error (2) never.
    assert_ne!(assert.get_output().status.code(), Some(2));
    for run in ["baseline-1", "candidate-1", "baseline-2", "candidate-2"] {
        assert!(out.join(run).join("summary.json").is_file(), "{run}");
    }
    // Again into the same --out: refused (the runs are kept), naming the flag that replaces
    // them, and that flag does.
    let again = |force: bool| {
        let mut c = perfkit();
        c.args(["check", "--repeat", "1", "--out"]).arg(&out);
        if force {
            c.arg("--force");
        }
        c.arg("--baseline-program")
            .arg(&perfkit_exe)
            .arg("--")
            .arg(&perfkit_exe)
            .args(["demo", "--run-trainer", "--device", "cpu", "--steps", "2"])
            .output()
            .expect("run check")
    };
    let refused = again(false);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("pass --force"), "{err}");
    let replaced = again(true);
    assert_ne!(
        replaced.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );
    // A failing program is an error that names the run.
    perfkit()
        .args(["check", "--repeat", "1", "--out"])
        .arg(dir.path().join("bad"))
        .arg("--baseline-program")
        .arg(&perfkit_exe)
        .arg("--")
        .arg(&perfkit_exe)
        .args(["demo", "--run-trainer", "--steps", "not-a-number"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("the baseline run 1"));
}
