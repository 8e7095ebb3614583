//! Regression tests for what perfkit promises when the world is not kind: nothing it did not
//! write is lost, and nothing goes wrong without saying so (`--force`, shared output
//! directories, concurrent runs, incomplete runs, suppressions inside strings, ...).
#![cfg(unix)]

#[path = "../reports/tests/synth/mod.rs"]
mod synth;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PERFKIT: &str = env!("CARGO_BIN_EXE_perfkit");

fn perfkit() -> Command {
    let mut cmd = Command::new(PERFKIT);
    cmd.env("NO_COLOR", "1").env_remove("PERFKIT_TRACE");
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run perfkit");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Profiles a program that copies a good trace into `$PERFKIT_TRACE` and then runs `then` (a
/// shell command, or nothing), with `flags` before `--out OUT`.
fn profile_copying_good_trace(
    tmp: &Path,
    out: &Path,
    flags: &[&str],
    then: Option<&str>,
) -> (i32, String, String) {
    let good = write(&tmp.join("good.pktrace"), good_trace());
    let mut script = format!("cp '{}' \"$PERFKIT_TRACE/\"", good.display());
    if let Some(then) = then {
        script.push_str(" && ");
        script.push_str(then);
    }
    run(perfkit()
        .arg("profile")
        .args(flags)
        .arg("--out")
        .arg(out)
        .args(["--", "sh", "-c", &script]))
}

fn write(path: &Path, text: impl AsRef<[u8]>) -> PathBuf {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// The first bytes of a perfkit trace file (magic and version).
fn trace_magic() -> Vec<u8> {
    let mut bytes = perfkit_profiler::format::MAGIC.to_vec();
    bytes.extend_from_slice(&[1, 0, 0, 0]);
    bytes
}

// 1. `--force` deletes only what perfkit can prove it wrote.

#[test]
fn force_keeps_a_source_file_in_trace_and_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let source = write(&dir.join("trace/main.rs"), "fn main() {}\n");
    let trace = write(&dir.join("trace/old.pktrace"), trace_magic());
    let (code, _, stderr) = run(perfkit()
        .args(["profile", "--quiet", "--force", "--out"])
        .arg(dir)
        .args(["--", "true"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("main.rs"),
        "the refusal names the file: {stderr}"
    );
    assert_eq!(std::fs::read_to_string(&source).unwrap(), "fn main() {}\n");
    assert!(trace.exists(), "a refused run removes nothing");
}

#[test]
fn force_never_follows_the_list_of_reports_in_a_previous_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(&dir.join("Cargo.toml"), "[package]\nname = \"mine\"\n");
    write(&dir.join("README.md"), "# mine\n");
    // A first run makes the directory perfkit's own.
    let (code, _, stderr) = run(perfkit()
        .args(["profile", "--quiet", "--out"])
        .arg(dir)
        .args(["--", "true"]));
    assert_eq!(code, 0, "{stderr}");
    // A summary that lists the user's files as reports: not the one perfkit wrote, so it is in
    // the way itself.
    let forged =
        r#"{"files": {"summary": "summary.json", "reports": ["Cargo.toml", "README.md"]}}"#;
    write(&dir.join("summary.json"), forged);
    let force = || {
        run(perfkit()
            .args(["profile", "--quiet", "--force", "--out"])
            .arg(dir)
            .args(["--", "true"]))
    };
    let (code, _, stderr) = force();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("summary.json"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("summary.json")).unwrap(),
        forged
    );
    // Even with the marker forged to record it as perfkit's, its list is not followed.
    let marker = dir.join(".perfkit-run");
    let mut text: String = std::fs::read_to_string(&marker)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("wrote summary.json "))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(&format!(
        "wrote summary.json {} {:08x}\n",
        forged.len(),
        crc32(forged.as_bytes())
    ));
    write(&marker, text);
    let (code, _, stderr) = force();
    assert_eq!(code, 0, "{stderr}");
    assert!(dir.join("Cargo.toml").is_file());
    assert!(dir.join("README.md").is_file());
}

/// CRC-32 (that of zlib and gzip), as `.perfkit-run` records the files perfkit wrote.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

// 2. One run per directory; a user's own files named like reports are not overwritten.

#[test]
fn a_second_run_into_the_same_directory_is_refused_with_the_first_ones_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut first = perfkit()
        .args(["profile", "--quiet", "--out"])
        .arg(&dir)
        .args(["--", "sleep", "30"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let marker = dir.join(".perfkit-run");
    let wanted = format!("pid {}", first.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&marker).is_ok_and(|t| t.contains(&wanted)) {
        assert!(
            Instant::now() < deadline,
            "the first run never took the directory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = run(perfkit()
        .args(["profile", "--quiet", "--force", "--out"])
        .arg(&dir)
        .args(["--", "true"]));
    let _ = Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status();
    let _ = first.wait();
    let (code, _, stderr) = second;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&wanted),
        "names the other run's pid: {stderr}"
    );
}

#[test]
fn a_users_own_report_html_is_not_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mine = write(&dir.join("report.html"), "<p>my report</p>");
    for force in [false, true] {
        let mut cmd = perfkit();
        cmd.args(["profile", "--quiet", "--out"]).arg(dir);
        if force {
            cmd.arg("--force");
        }
        let (code, _, stderr) = run(cmd.args(["--", "true"]));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("report.html"), "{stderr}");
    }
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "<p>my report</p>");
}

// 9. Suppressions count only in comments.

const READBACK_IN_LOOP: &str = r#"use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, VarBuilder, VarMap};

pub const NOTE: &str = "see: // perfkit: allow-file(PK101) in the docs";

pub fn train(batches: &[(Tensor, Tensor)], device: &Device) -> candle_core::Result<f32> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::BF16, device);
    let model = candle_nn::linear(784, 10, vb)?;
    let mut opt = AdamW::new_lr(varmap.all_vars(), 1e-3)?;
    let mut last = 0.0;
    for (images, labels) in batches {
        let logits = images.apply(&model)?;
        let loss = candle_nn::loss::cross_entropy(&logits, labels)?;
        opt.backward_step(&loss)?;
        last = loss.to_scalar::<f32>()?;
    }
    Ok(last)
}
"#;

#[test]
fn a_suppression_inside_a_string_literal_suppresses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("src/train.rs"), READBACK_IN_LOOP);
    let (code, stdout, stderr) = run(perfkit()
        .current_dir(tmp.path())
        .args(["lint", "src", "--format", "json"]));
    assert_eq!(code, 1, "{stdout}{stderr}");
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let codes: Vec<&str> = value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["PK101"], "{stdout}");
}

// 3. One unreadable trace does not block the run.

const START: u64 = 1_700_000_000_000_000_000;

fn good_trace() -> Vec<u8> {
    synth::trace_bytes("train", 7, None, START, &synth::Workload::tuned())
}

/// A run directory with one good trace, an empty one and a garbage one.
fn run_with_unreadable_traces(root: &Path) -> PathBuf {
    let dir = root.join("run");
    write(&dir.join("trace/train-7.pktrace"), good_trace());
    write(&dir.join("trace/worker-9.pktrace"), b"");
    write(
        &dir.join("trace/garbage-3.pktrace"),
        b"this is not a trace at all",
    );
    dir
}

#[test]
fn report_reports_what_is_readable_and_names_what_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_with_unreadable_traces(tmp.path());
    let (code, _, stderr) = run(perfkit().arg("report").arg(&dir));
    assert_eq!(code, 0, "{stderr}");
    for name in ["worker-9.pktrace", "garbage-3.pktrace"] {
        assert!(stderr.contains(name), "terminal names {name}: {stderr}");
        let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert!(md.contains(name), "summary.md names {name}:\n{md}");
        let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
        assert!(html.contains(name), "report.html names {name}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["run"]["incomplete"], true, "{summary:#}");
    assert_eq!(summary["analysis"]["complete"], false);
    assert_eq!(
        summary["analysis"]["unreadable"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn profile_writes_the_reports_beside_an_empty_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let (code, _, stderr) = profile_copying_good_trace(
        tmp.path(),
        &out,
        &["--no-lint", "--no-inject"],
        Some(": > \"$PERFKIT_TRACE/worker-9.pktrace\""),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(out.join("report.html").is_file(), "{stderr}");
    assert!(stderr.contains("worker-9.pktrace"), "{stderr}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("worker-9.pktrace"));
}

// 6. An incomplete run is named by diff and fails check unless allowed.

fn cut_run(root: &Path) -> PathBuf {
    let mut s = synth::Synth::new(Vec::new(), "train", 8, None, START);
    synth::write_run(&mut s, &synth::Workload::tuned());
    let bytes = s.finish(true);
    write(&root.join("cut/trace/train-8.pktrace"), bytes);
    root.join("cut")
}

fn good_run(root: &Path) -> PathBuf {
    write(&root.join("good/trace/train-7.pktrace"), good_trace());
    root.join("good")
}

#[test]
fn check_fails_on_an_incomplete_candidate_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cut) = (good_run(tmp.path()), cut_run(tmp.path()));
    let (code, stdout, stderr) = run(perfkit()
        .env_remove("GITHUB_STEP_SUMMARY")
        .args(["check", "--max-regression", "1000%", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&cut));
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("candidate run incomplete"), "{stdout}");
    let (code, stdout, stderr) = run(perfkit()
        .env_remove("GITHUB_STEP_SUMMARY")
        .args([
            "check",
            "--allow-incomplete",
            "--max-regression",
            "1000%",
            "--baseline",
        ])
        .arg(&base)
        .arg("--candidate")
        .arg(&cut));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("candidate run incomplete"), "{stdout}");
    // The verdict itself says that it rests on a partial run, and so does the pull request.
    assert!(
        stdout.contains("perfkit check: PASS (with an incomplete run: --allow-incomplete)"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run(perfkit()
        .env_remove("GITHUB_STEP_SUMMARY")
        .args([
            "check",
            "--allow-incomplete",
            "--format",
            "github",
            "--max-regression",
            "1000%",
            "--baseline",
        ])
        .arg(&base)
        .arg("--candidate")
        .arg(&cut));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("::warning title=perfkit check::candidate run incomplete")),
        "{stdout}"
    );
}

#[test]
fn check_fails_on_a_candidate_ended_by_sigint() {
    let tmp = tempfile::tempdir().unwrap();
    let base = good_run(tmp.path());
    let out = tmp.path().join("stopped");
    let (code, _, stderr) = profile_copying_good_trace(
        tmp.path(),
        &out,
        &["--quiet", "--no-lint", "--no-inject"],
        // The program ends itself by SIGINT, whatever disposition it inherited: a shell started
        // with SIGINT ignored (a background job of a non-interactive shell) cannot be killed by
        // `kill -INT $$`, so the signal's default action is restored before it is raised.
        Some(
            "exec python3 -c 'import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); \
             os.kill(os.getpid(), signal.SIGINT)'",
        ),
    );
    assert_eq!(code, 130, "{stderr}");
    // Its trace is whole, but the run is not: the reports of the run say so too (summary.md
    // goes into pull requests), not only summary.json.
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("the program was ended by SIGINT"), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("the program was ended by SIGINT"),
        "report.html"
    );
    assert!(html.contains("\"complete\":false"), "report.html");
    let (code, stdout, stderr) = run(perfkit()
        .env_remove("GITHUB_STEP_SUMMARY")
        .args(["check", "--max-regression", "1000%", "--baseline"])
        .arg(&base)
        .arg("--candidate")
        .arg(&out));
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("SIGINT"), "{stdout}");
}

#[test]
fn diff_names_an_incomplete_run_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cut) = (good_run(tmp.path()), cut_run(tmp.path()));
    for format in ["text", "json", "html"] {
        let (code, stdout, stderr) = run(perfkit()
            .args(["diff", "--format", format])
            .arg(&base)
            .arg(&cut));
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("cut short"), "{format}: {stdout}");
    }
}

// 4. `--lint PATH` problems are reported as `perfkit lint` reports them.

#[test]
fn report_lint_names_a_missing_path_and_an_unparsable_file_and_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_run(tmp.path());
    let broken = write(&tmp.path().join("src/broken.rs"), "fn x( {\n");
    let missing = tmp.path().join("no/such/path");
    let (code, stdout, stderr) = run(perfkit()
        .arg("report")
        .arg(&dir)
        .arg("--lint")
        .arg(&missing)
        .arg("--lint")
        .arg(&broken));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("no/such/path"), "{stderr}");
    assert!(stderr.contains("broken.rs"), "{stderr}");
    assert!(
        dir.join("report.html").is_file(),
        "the reports are still written"
    );
}

#[test]
fn profile_lint_names_a_missing_path() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let missing = tmp.path().join("no/such/path");
    let missing = missing.to_str().expect("a UTF-8 path");
    let (code, _, stderr) = profile_copying_good_trace(
        tmp.path(),
        &out,
        &["--quiet", "--no-inject", "--lint", missing],
        None,
    );
    assert_eq!(code, 0, "the program's own exit status: {stderr}");
    assert!(stderr.contains("no/such/path"), "{stderr}");
    assert!(stderr.contains("could not be linted"), "{stderr}");
}

// 7. A step cut short is not a step, in every output.

#[test]
fn a_step_cut_short_is_counted_nowhere() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = synth::Synth::new(Vec::new(), "train", 5, None, START);
    s.thread(0, "main");
    for i in 0..5 {
        s.enter(0, "step", Some(i));
        s.work(1_000_000);
        s.exit(0);
    }
    s.enter(0, "step", Some(5));
    s.work(3_000_000);
    let dir = tmp.path().join("run");
    write(&dir.join("trace/train-5.pktrace"), s.finish(true));
    let (code, stdout, stderr) = run(perfkit().arg("report").arg(&dir));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("steps: 5 "), "terminal: {stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"]["count"], 5, "top level");
    assert_eq!(
        summary["analysis"]["processes"][0]["steps"]["duration"]["count"], 5,
        "analysis section"
    );
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("\n| 5 |"), "summary.md: {md}");
}

// 8. A span entered many times counts each entry.

#[test]
fn a_span_entered_three_times_is_three_calls_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = synth::Synth::new(Vec::new(), "train", 6, None, START);
    s.enter(0, "step", Some(0));
    let linear = s.enter(0, "linear", None);
    s.work(1_000_000);
    s.exit_only(0);
    for ns in [2_000_000, 3_000_000] {
        s.reenter(0, linear);
        s.work(ns);
        s.exit_only(0);
    }
    s.close(0, linear);
    s.exit(0);
    let dir = tmp.path().join("run");
    write(&dir.join("trace/train-6.pktrace"), s.finish(false));
    let (code, stdout, stderr) = run(perfkit().arg("report").arg(&dir));
    assert_eq!(code, 0, "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let find = |spans: &serde_json::Value| {
        spans
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "linear")
            .cloned()
            .unwrap()
    };
    let top = find(&summary["spans"]);
    assert_eq!(top["calls"], 3, "top level: {top}");
    assert_eq!(top["mean_ns"], 2_000_000);
    let analysed = find(&summary["analysis"]["processes"][0]["spans"]);
    assert_eq!(analysed["calls"], 3, "analysis: {analysed}");
    assert!(analysed["mean_ns"].as_u64() <= analysed["max_ns"].as_u64());
    assert!(stdout.contains("linear"), "{stdout}");
}

// 5. Per-step figures of a multi-process run are per process, the spread across ranks apart.

#[test]
fn diff_per_step_figures_are_per_rank_with_the_spread_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let one = good_run(tmp.path());
    let wl = synth::Workload::tuned();
    let ranks = tmp.path().join("ranks");
    for rank in 0..2 {
        let pid = 20 + rank;
        let slow = synth::Workload {
            data_ns: wl.data_ns * (1 + u64::from(rank)),
            ..synth::Workload::tuned()
        };
        write(
            &ranks.join(format!("trace/train-{pid}.pktrace")),
            synth::trace_bytes("train", pid, Some(rank), START, &slow),
        );
    }
    let (code, stdout, stderr) = run(perfkit()
        .args(["diff", "--format", "json"])
        .arg(&one)
        .arg(&ranks));
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let span = |name: &str| {
        report["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no span {name}: {report:#}"))
    };
    // Every rank runs the same forward pass as the one-process run: the same per-step time.
    let forward = span("forward");
    assert_eq!(forward["unit"], "ns/step");
    assert_eq!(forward["base"], forward["new"], "{forward}");
    assert!(forward.get("base_ranks").is_none(), "{forward}");
    assert_eq!(forward["new_ranks"]["processes"], 2, "{forward}");
    // A span no longer than the step it runs in, and the slower rank shown apart.
    let median = report["steps"]["new_median_ns"].as_f64().unwrap();
    let data = span("data");
    assert!(data["new"].as_f64().unwrap() < median, "{data} vs {median}");
    let (min, max) = (
        data["new_ranks"]["min"].as_f64().unwrap(),
        data["new_ranks"]["max"].as_f64().unwrap(),
    );
    assert!(min < data["new"].as_f64().unwrap(), "{data}");
    assert!(max > 1.5 * min, "{data}");
    let (code, stdout, stderr) = run(perfkit().arg("diff").arg(&one).arg(&ranks));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("across ranks"), "{stdout}");
}

// 10. A note names a file as the primary location does.

#[test]
fn a_note_shows_its_path_as_the_primary_location_does() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("src/train.rs"), READBACK_IN_LOOP);
    for format in ["text", "sarif"] {
        let (code, stdout, stderr) = run(perfkit().current_dir(tmp.path()).args([
            "lint",
            "./src/../src",
            "--format",
            format,
        ]));
        assert_eq!(code, 1, "{stdout}{stderr}");
        assert!(
            stdout.contains("step loop at src/train.rs:"),
            "{format}: {stdout}"
        );
        assert!(!stdout.contains("./src"), "{format}: {stdout}");
    }
}

// 10. The list of files names only what was written.

#[test]
fn the_files_list_says_when_the_summary_was_not_written() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    // The program leaves a directory where summary.json goes: it cannot be written.
    let (code, _, stderr) = profile_copying_good_trace(
        tmp.path(),
        &out,
        &["--no-lint", "--no-inject"],
        Some("mkdir \"$PERFKIT_TRACE/../summary.json\""),
    );
    assert_eq!(code, 0, "{stderr}");
    let files = &stderr[stderr.rfind("\nfiles").expect("a list of files")..];
    assert!(files.contains("summary    not written"), "{files}");
    assert!(!files.contains("summary.json\n"), "{files}");
}

// 10. `lint --fix` never rewrites a read-only file.

const FIXABLE: &str = r#"use candle_core::{Device, Tensor};

fn main() -> candle_core::Result<()> {
    let dev = Device::new_cuda(0)?;
    let t = Tensor::zeros(2, candle_core::DType::F32, &Device::Cpu)?.to_device(&dev)?;
    println!("{t}");
    Ok(())
}
"#;

#[test]
fn fix_refuses_a_read_only_file_and_names_it() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let file = write(&tmp.path().join("src/main.rs"), FIXABLE);
    let writable = write(&tmp.path().join("src/bin/other.rs"), FIXABLE);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
    let (code, stdout, stderr) = run(perfkit()
        .current_dir(tmp.path())
        .args(["lint", "src", "--fix"]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("main.rs"), "{stderr}");
    assert!(stderr.contains("read-only"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), FIXABLE);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o444);
    assert_ne!(
        std::fs::read_to_string(&writable).unwrap(),
        FIXABLE,
        "the writable file is fixed"
    );
}

// 10. `lint -j N` starts no more workers than it has files.

#[test]
fn lint_with_65535_jobs_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("src/train.rs"), READBACK_IN_LOOP);
    let mut child = perfkit()
        .current_dir(tmp.path())
        .args(["lint", "src", "-j", "65535", "--format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A deadline against hanging forever, far above what one file takes.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("perfkit lint -j 65535 did not finish");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1), "one finding");
}

// 11. A trace damaged in its middle is reported up to the damage, by every reader of it.

#[test]
fn a_byte_flipped_in_the_middle_of_a_trace_reports_what_was_read_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let good = good_trace();
    let middle = good.len() / 2;
    for at in middle - 32..middle + 32 {
        let mut bytes = good.clone();
        bytes[at] ^= 0x5a;
        let dir = tmp.path().join(format!("flip-{at}"));
        write(&dir.join("trace/train-7.pktrace"), bytes);
        let (code, stdout, stderr) = run(perfkit().arg("report").arg(&dir));
        assert_eq!(code, 0, "byte {at}: {stdout}{stderr}");
        assert!(
            stderr.contains("corrupt trace at byte offset"),
            "byte {at}: the damage is named: {stderr}"
        );
        let text = std::fs::read_to_string(dir.join("summary.json"))
            .unwrap_or_else(|e| panic!("byte {at}: summary.json: {e}\n{stderr}"));
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(summary["run"]["incomplete"], true, "byte {at}");
        assert!(text.contains("corrupt trace at byte offset"), "byte {at}");
        // The file is named once per message, not once by each layer that passes it on.
        for line in stderr.lines() {
            assert!(
                line.matches("train-7.pktrace").count() <= 1,
                "byte {at}: the path twice: {line}"
            );
        }
    }
}

// 11. Each cause of an error is printed once.

#[test]
fn an_os_error_is_printed_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no/such/run");
    for sub in ["report", "diff"] {
        let mut cmd = perfkit();
        cmd.arg(sub).arg(&missing);
        if sub == "diff" {
            cmd.arg(&missing);
        }
        let (code, stdout, stderr) = run(&mut cmd);
        assert_eq!(code, 2, "{sub}: {stdout}{stderr}");
        assert!(stderr.contains("no/such/run"), "{sub}: {stderr}");
        assert_eq!(
            stderr.matches("(os error 2)").count(),
            1,
            "{sub}: the cause once: {stderr}"
        );
    }
}

// 12. A step span that matches nothing is named, with the spans that exist.

#[test]
fn a_step_span_that_matches_no_span_is_named_with_the_spans_that_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = good_run(tmp.path());
    let (code, _, stderr) = run(perfkit()
        .arg("report")
        .arg(&dir)
        .args(["--step-span", "no-such-span"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("--step-span `no-such-span` matches no span"),
        "{stderr}"
    );
    assert!(stderr.contains("`forward`"), "names the spans: {stderr}");
    let (code, _, stderr) = run(perfkit()
        .arg("report")
        .arg(&dir)
        .args(["--step-span", "forward"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("matches no span"), "{stderr}");
}

// 13. The advice for a run with no trace is advice that can be followed.

#[test]
fn check_on_a_run_with_no_trace_says_how_to_record_one() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bare");
    let (code, _, stderr) = run(perfkit()
        .args(["profile", "--quiet", "--no-lint", "--no-inject", "--out"])
        .arg(&out)
        .args(["--", "true"]));
    assert_eq!(code, 0, "{stderr}");
    let mut check = perfkit();
    check
        .env_remove("GITHUB_STEP_SUMMARY")
        .args(["check", "--baseline"])
        .arg(&out)
        .arg("--candidate")
        .arg(&out);
    let mut diff = perfkit();
    diff.arg("diff").arg(&out).arg(&out);
    for cmd in [&mut check, &mut diff] {
        let (code, stdout, stderr) = run(cmd);
        assert_eq!(code, 2, "{stdout}{stderr}");
        assert!(!stderr.contains("perfkit report"), "{stderr}");
        assert!(stderr.contains("wrote no trace"), "{stderr}");
        assert!(stderr.contains("perfkit_profiler::init()"), "{stderr}");
        assert!(stderr.contains("CUPTI injection"), "{stderr}");
    }
}

// 14. A file too large to lint in sane memory is named with the limit, and the rest is linted.

#[test]
fn a_file_over_the_size_limit_is_named_with_the_limit_and_the_rest_is_linted() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("src/train.rs"), READBACK_IN_LOOP);
    let line = "pub fn generated(x: f32) -> f32 { x * 2.0 + 1.0 }\n";
    let big = line.repeat((4 << 20) / line.len() + 1);
    write(&tmp.path().join("src/generated.rs"), big);
    let (code, stdout, stderr) = run(perfkit()
        .current_dir(tmp.path())
        .args(["lint", "src", "--format", "json"]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let errors = value["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{stdout}");
    assert!(
        errors[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("generated.rs"),
        "{stdout}"
    );
    let message = errors[0]["message"].as_str().unwrap();
    assert!(message.contains("file too large"), "{message}");
    assert!(message.contains("4 MiB"), "names the limit: {message}");
    assert_eq!(
        value["findings"][0]["code"], "PK101",
        "the other file is linted"
    );
}
