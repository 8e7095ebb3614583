//! `perfkit report` and `perfkit diff` end to end: the built binary over synthetic traces
//! (written with the profiler's trace writer; GPU timings from a small simulator, not a GPU).

#[path = "../reports/tests/synth/mod.rs"]
mod synth;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;
use synth::{Workload, trace_bytes};

fn perfkit(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("perfkit").expect("the perfkit binary is built");
    cmd.current_dir(dir);
    cmd.env_remove("CI");
    cmd
}

/// A run directory holding one trace of `wl`.
fn run_dir(root: &Path, name: &str, wl: &Workload) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).expect("run dir");
    std::fs::write(
        d.join("train-1.pktrace"),
        trace_bytes("train", 1, None, 1_700_000_000_000_000_000, wl),
    )
    .expect("trace");
    d
}

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run perfkit");
    assert!(
        out.status.success(),
        "perfkit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs a command perfkit must refuse (exit status 2): its stdout and stderr.
fn refused(cmd: &mut Command) -> (String, String) {
    let out = cmd.output().expect("run perfkit");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

#[test]
fn report_writes_every_format_and_prints_the_summary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "anti", &Workload::anti_patterns());
    let out = stdout(perfkit(tmp.path()).args(["report", "anti", "--out", "out"]));
    for name in [
        "summary.json",
        "summary.md",
        "stacks-host.folded",
        "stacks-gpu.folded",
        "flamegraph-host.svg",
        "flamegraph-gpu.svg",
        "trace.chrome.json",
        "report.html",
    ] {
        assert!(
            tmp.path().join("out").join(name).is_file(),
            "{name} written"
        );
        assert!(
            out.contains(&format!("wrote out/{name}")),
            "{name} listed:\n{out}"
        );
    }
    assert!(out.contains("steps: 20"), "{out}");
    assert!(
        out.contains("data") && out.contains("% wall"),
        "span table:\n{out}"
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("out/summary.json")).expect("read"),
    )
    .expect("json");
    assert_eq!(summary["schema"], "perfkit-summary");
    assert_eq!(summary["version"], 1);
    assert_eq!(summary["steps"]["count"], 20);
    assert_eq!(summary["analysis"]["processes"][0]["syncs"]["count"], 21);
    // Runtime findings are measured and reported: the per-step loss readback is PK101.
    let findings = summary["findings"].as_array().expect("findings");
    assert!(
        findings
            .iter()
            .any(|f| f["code"] == "PK101" && f["location"] == "src/train.rs:72"),
        "{findings:?}"
    );
    assert!(out.contains("PK101"), "findings printed:\n{out}");
}

#[test]
fn report_defaults_to_the_run_directory_and_honours_format() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = run_dir(tmp.path(), "tuned", &Workload::tuned());
    stdout(perfkit(tmp.path()).args(["report", "tuned/train-1.pktrace", "--format", "json,md"]));
    let mut names: Vec<String> = std::fs::read_dir(&run)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // `.perfkit-run` marks the reports as perfkit's, so that the next report may replace them.
    assert_eq!(
        names,
        [
            ".perfkit-run",
            "summary.json",
            "summary.md",
            "train-1.pktrace"
        ]
    );
}

#[test]
fn report_errors_name_the_flag_or_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "run", &Workload::tuned());
    let out = perfkit(tmp.path())
        .args(["report", "run", "--format", "html,pdf"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--format") && err.contains("pdf"), "{err}");

    let out = perfkit(tmp.path())
        .args(["report", "missing-dir"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing-dir"));

    std::fs::write(tmp.path().join("junk.pktrace"), b"not a trace").expect("write");
    let out = perfkit(tmp.path())
        .args(["report", "junk.pktrace"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("junk.pktrace") && err.contains("not a perfkit trace"),
        "{err}"
    );
}

#[test]
fn diff_shows_the_change_where_it_is() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "tuned", &Workload::tuned());
    run_dir(tmp.path(), "anti", &Workload::anti_patterns());
    let text = stdout(perfkit(tmp.path()).args(["diff", "tuned", "anti"]));
    assert!(text.contains(": slower (noise"), "{text}");
    assert!(text.contains("src/data.rs:31 H2D pageable"), "{text}");

    let json: Value = serde_json::from_str(&stdout(
        perfkit(tmp.path()).args(["diff", "tuned", "anti", "--format", "json", "--out", "d"]),
    ))
    .expect("json");
    assert_eq!(json["steps"]["verdict"], "slower");
    assert_eq!(
        json["spans"][0]["name"], "data",
        "largest self-time change first"
    );
    for name in [
        "diff.json",
        "diff.html",
        "diff-flamegraph-host.svg",
        "diff-flamegraph-gpu.svg",
    ] {
        assert!(tmp.path().join("d").join(name).is_file(), "{name}");
    }
    // Against itself through summary.json files: no change beyond noise.
    stdout(perfkit(tmp.path()).args(["report", "tuned", "--format", "json"]));
    let same: Value = serde_json::from_str(&stdout(perfkit(tmp.path()).args([
        "diff",
        "tuned/summary.json",
        "tuned/summary.json",
        "--format",
        "json",
    ])))
    .expect("json");
    assert_eq!(same["steps"]["verdict"], "within noise");
    assert_eq!(same["steps"]["delta_ns"], 0);
}

/// How the program ended is known from the summary `perfkit profile` wrote, not from the
/// traces: `perfkit report` into the run directory keeps it, replacing the reports perfkit
/// wrote there; and a later `perfkit profile --force` still replaces everything perfkit wrote.
#[cfg(unix)]
#[test]
fn report_keeps_how_the_program_ended_from_an_earlier_summary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let traces = run_dir(tmp.path(), "traces", &Workload::tuned());
    stdout(perfkit(tmp.path()).args(["report", "traces", "--format", "json"]));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(traces.join("summary.json")).expect("read"))
            .expect("json");
    assert!(
        v["run"]["exit"].is_null(),
        "traces alone do not say how the program ended"
    );
    // A program that leaves that trace and exits with 3, under `perfkit profile`.
    let copy_and_exit = format!(
        "cp '{}' \"$PERFKIT_TRACE/\" && exit 3",
        traces.join("train-1.pktrace").display()
    );
    let profile = |force: bool, script: &str| {
        let mut cmd = perfkit(tmp.path());
        cmd.args(["profile", "--quiet", "--no-lint", "--out", "run"]);
        if force {
            cmd.arg("--force");
        }
        cmd.args(["--", "sh", "-c", script]).output().expect("run")
    };
    let out = profile(false, &copy_and_exit);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = tmp.path().join("run/summary.json");
    for _ in 0..2 {
        stdout(perfkit(tmp.path()).args(["report", "run", "--format", "json,md"]));
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(
            v["run"]["exit"]["description"], "exit code 3",
            "{}",
            v["run"]
        );
        assert!(v["analysis"]["processes"].is_array());
        let md = std::fs::read_to_string(tmp.path().join("run/summary.md")).expect("md");
        assert!(md.contains("exit code 3"), "{md}");
    }
    // With another step span the steps are counted anew, and how the program ended is kept.
    stdout(perfkit(tmp.path()).args([
        "report",
        "run",
        "--format",
        "json",
        "--step-span",
        "forward",
    ]));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    assert_eq!(
        v["run"]["exit"]["description"], "exit code 3",
        "{}",
        v["run"]
    );
    assert_eq!(v["steps"]["span"], "forward", "{}", v["steps"]);
    // The reports of the run and of `perfkit report` are perfkit's: --force replaces them.
    let out = profile(true, "true");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tmp.path().join("run/report.html").exists());
    assert!(!tmp.path().join("run/summary.md").exists());
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    assert_eq!(v["run"]["exit"]["code"], 0, "{}", v["run"]);
}

/// Source of a candle training loop whose per-step readback sits at line 72, the line the
/// synthetic anti-pattern trace records its small device-to-host copies from.
fn training_source_with_readback_at_line_72() -> String {
    let mut lines: Vec<String> = vec![
        "use candle_core::{Device, Tensor};".into(),
        "use candle_nn::{Optimizer, VarMap, SGD};".into(),
        "".into(),
        "pub fn train(dev: &Device, varmap: &VarMap, batches: &[Tensor]) -> candle_core::Result<()> {".into(),
        "    let mut opt = SGD::new(varmap.all_vars(), 0.05)?;".into(),
        "    for batch in batches {".into(),
        "        let loss = batch.to_device(dev)?.sqr()?.mean_all()?;".into(),
        "        opt.backward_step(&loss)?;".into(),
    ];
    while lines.len() < 71 {
        lines.push("        // ...".into());
    }
    lines.push("        let value = loss.to_scalar::<f32>()?;".into());
    lines.push("        println!(\"loss {value}\");".into());
    lines.push("    }".into());
    lines.push("    Ok(())".into());
    lines.push("}".into());
    lines.join("\n") + "\n"
}

#[test]
fn report_lint_puts_lint_findings_beside_the_measured_ones_and_confirms_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "anti", &Workload::anti_patterns());
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("src dir");
    std::fs::write(
        src.join("train.rs"),
        training_source_with_readback_at_line_72(),
    )
    .expect("write source");
    std::fs::write(
        tmp.path().join("Cargo.toml"),
        "[package]\nname = \"trainer\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[lib]\npath = \"src/train.rs\"\n",
    )
    .expect("write manifest");

    stdout(perfkit(tmp.path()).args([
        "report", "anti", "--out", "out", "--format", "json", "--lint", "src",
    ]));
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("out/summary.json")).expect("summary.json"),
    )
    .expect("summary JSON");
    let findings = summary["findings"].as_array().expect("findings");
    let lint_pk101 = findings
        .iter()
        .find(|f| f["origin"] == "lint" && f["code"] == "PK101")
        .unwrap_or_else(|| panic!("a lint PK101 finding: {findings:#?}"));
    assert_eq!(lint_pk101["location"], "src/train.rs:72:26");
    assert_eq!(lint_pk101["confirmed"], true, "{lint_pk101:#}");
    assert!(
        lint_pk101["cost_per_step_ns"]
            .as_u64()
            .is_some_and(|ns| ns > 0),
        "a confirmed finding carries the measured cost: {lint_pk101:#}"
    );
    assert!(
        findings
            .iter()
            .any(|f| f["origin"] == "runtime" && f["code"] == "PK101"),
        "the measured PK101 stays listed: {findings:#?}"
    );

    // From elsewhere, the location is still relative to the package (as the recorder's
    // `#[track_caller]` paths are), not to where perfkit ran.
    let elsewhere = tmp.path().join("ci/job");
    std::fs::create_dir_all(&elsewhere).expect("another directory");
    stdout(
        perfkit(&elsewhere)
            .arg("report")
            .arg(tmp.path().join("anti"))
            .args(["--out", "out", "--format", "json", "--lint"])
            .arg(&src),
    );
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(elsewhere.join("out/summary.json")).expect("summary.json"),
    )
    .expect("summary JSON");
    let located: Vec<&Value> = summary["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["origin"] == "lint" && f["code"] == "PK101")
        .map(|f| &f["location"])
        .collect();
    assert_eq!(located, ["src/train.rs:72:26"]);

    // Without --lint there are no lint findings.
    stdout(perfkit(tmp.path()).args(["report", "anti", "--out", "out2", "--format", "json"]));
    let plain: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("out2/summary.json")).expect("summary.json"),
    )
    .expect("summary JSON");
    assert!(
        plain["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .all(|f| f["origin"] != "lint")
    );
}

/// `perfkit report RUN | head` and `perfkit diff A B | head`: a closed standard output is a
/// normal end (exit 0, no panic), and the files asked for are still written.
#[test]
fn a_closed_stdout_ends_report_and_diff_quietly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "tuned", &Workload::tuned());
    run_dir(tmp.path(), "anti", &Workload::anti_patterns());
    for (args, written) in [
        (
            &["report", "tuned", "--out", "r", "--format", "json"][..],
            "r/summary.json",
        ),
        (&["diff", "tuned", "anti", "--out", "d"][..], "d/diff.json"),
        (
            &["diff", "tuned", "anti", "--format", "html", "--out", "h"][..],
            "h/diff.html",
        ),
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("perfkit"))
            .current_dir(tmp.path())
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run perfkit");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(tmp.path().join(written).is_file(), "{args:?}: {written}");
    }
}

/// `report --out DIR` and `diff --out DIR` into a directory that holds files perfkit did not
/// write under the names it would write: refused, naming the file, and nothing is replaced. A
/// directory perfkit wrote its reports into is its own: reporting into it again replaces them.
#[test]
fn report_and_diff_never_replace_files_they_did_not_write() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "tuned", &Workload::tuned());
    run_dir(tmp.path(), "anti", &Workload::anti_patterns());
    for (args, dir, name) in [
        (
            &["report", "tuned", "--out", "mine"][..],
            "mine",
            "report.html",
        ),
        (
            &["report", "tuned", "--out", "mine-json", "--format", "json"][..],
            "mine-json",
            "summary.json",
        ),
        (
            &["diff", "tuned", "anti", "--out", "d"][..],
            "d",
            "diff.json",
        ),
    ] {
        let dir = tmp.path().join(dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join(name), "my own file\n").expect("write");
        let out = perfkit(tmp.path()).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(name), "{args:?}: the file is named: {err}");
        assert_eq!(
            std::fs::read_to_string(dir.join(name)).expect("read"),
            "my own file\n",
            "{args:?}"
        );
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, [name], "{args:?}: nothing else is written");
    }
    // Into a fresh directory, twice: the second run replaces what the first one wrote.
    for _ in 0..2 {
        stdout(perfkit(tmp.path()).args(["report", "tuned", "--out", "fresh"]));
        stdout(perfkit(tmp.path()).args(["diff", "tuned", "anti", "--out", "fresh-diff"]));
    }
    // The default output of a run directory that holds no reports yet.
    for _ in 0..2 {
        stdout(perfkit(tmp.path()).args(["report", "anti", "--format", "json"]));
    }
}

/// The reproducer of a hostile test: `perfkit report run.pktrace` writes its reports beside
/// the trace; the user replaces `summary.md` with notes of their own; a second `perfkit report`
/// must not write over them, though the directory carries perfkit's marker. Nor over a report
/// the user edited after perfkit wrote it.
#[test]
fn report_never_replaces_a_report_the_user_wrote_or_edited_since() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let proj = run_dir(tmp.path(), "proj", &Workload::tuned());
    stdout(perfkit(&proj).args(["report", "train-1.pktrace"]));
    assert!(proj.join(".perfkit-run").is_file());
    std::fs::remove_file(proj.join("summary.md")).expect("rm");
    std::fs::write(proj.join("summary.md"), "# my notes\n").expect("write");
    let (out, err) = refused(perfkit(&proj).args(["report", "train-1.pktrace", "--format", "md"]));
    assert!(
        err.contains("already holds `./summary.md`, which perfkit did not write or cannot prove"),
        "{err}"
    );
    assert!(!out.contains("wrote"));
    assert_eq!(
        std::fs::read_to_string(proj.join("summary.md")).expect("read"),
        "# my notes\n"
    );
    // A report perfkit wrote, edited by the user since: refused, naming it, and kept.
    let html = proj.join("report.html");
    let mut edited = std::fs::read_to_string(&html).expect("read");
    edited.push_str("<!-- my note -->\n");
    std::fs::write(&html, &edited).expect("write");
    let (_, err) =
        refused(perfkit(&proj).args(["report", "train-1.pktrace", "--format", "html,json"]));
    assert!(err.contains("report.html"), "{err}");
    assert!(
        !err.contains("summary.json"),
        "the summary is still perfkit's: {err}"
    );
    assert_eq!(std::fs::read_to_string(&html).expect("read"), edited);
    // The reports perfkit wrote and nobody touched are still replaced, without --force.
    stdout(perfkit(&proj).args(["report", "train-1.pktrace", "--format", "json,svg,folded"]));
}

/// A `.perfkit-run` copied from another directory vouches for nothing there: a report of the
/// user's own under a name perfkit writes is not replaced. One written by an older perfkit
/// (which recorded no files) proves no report file either, and the refusal says what to do.
#[test]
fn a_copied_or_older_marker_proves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "tuned", &Workload::tuned());
    stdout(perfkit(tmp.path()).args(["report", "tuned", "--out", "first"]));
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).expect("mkdir");
    std::fs::copy(
        tmp.path().join("first/.perfkit-run"),
        mine.join(".perfkit-run"),
    )
    .expect("copy");
    std::fs::write(mine.join("report.html"), "<p>my own report</p>\n").expect("write");
    let (_, err) = refused(perfkit(tmp.path()).args(["report", "tuned", "--out", "mine"]));
    assert!(err.contains("mine/report.html"), "{err}");
    assert_eq!(
        std::fs::read_to_string(mine.join("report.html")).expect("read"),
        "<p>my own report</p>\n"
    );
    assert!(!mine.join("summary.json").exists(), "nothing is written");
    // An older perfkit's marker: its first two lines only.
    std::fs::write(mine.join(".perfkit-run"), "perfkit run directory\npid 1\n").expect("write");
    let (_, err) =
        refused(perfkit(tmp.path()).args(["report", "tuned", "--out", "mine", "--format", "html"]));
    for said in [
        "mine/report.html",
        "older perfkit",
        "did not record the files it wrote",
        "move or remove these yourself, or choose another --out",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(mine.join("report.html")).expect("read"),
        "<p>my own report</p>\n"
    );
}

/// A run with GPU work against one without (the same trainer on a CPU): the GPU differential
/// flamegraph has one side only, and `diff --out` / `--format html` still write everything.
#[test]
fn diff_of_a_gpu_run_and_a_cpu_run_writes_its_flamegraphs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "gpu", &Workload::tuned());
    let cpu = tmp.path().join("cpu");
    std::fs::create_dir_all(&cpu).expect("dir");
    let mut s = synth::Synth::new(Vec::new(), "train", 2, None, 1_700_000_000_000_000_000);
    s.thread(0, "main");
    for step in 0..20 {
        s.enter(0, "step", Some(step));
        s.work(1_000_000);
        s.exit(0);
    }
    std::fs::write(cpu.join("train-2.pktrace"), s.finish(false)).expect("trace");
    for (base, new) in [("gpu", "cpu"), ("cpu", "gpu")] {
        let out = format!("d-{base}-{new}");
        stdout(perfkit(tmp.path()).args(["diff", base, new, "--out", &out]));
        for name in [
            "diff.html",
            "diff-flamegraph-host.svg",
            "diff-flamegraph-gpu.svg",
        ] {
            assert!(tmp.path().join(&out).join(name).is_file(), "{out}/{name}");
        }
        let html = stdout(perfkit(tmp.path()).args(["diff", base, new, "--format", "html"]));
        assert!(html.contains("</html>"), "{base} -> {new}");
    }
}

/// A summary.json copied away from its run (a CI baseline) is named as given: `diff` does not
/// show the directory it was recorded in, which it never read.
#[test]
fn diff_names_a_summary_by_the_path_given() {
    let tmp = tempfile::tempdir().expect("tempdir");
    run_dir(tmp.path(), "tuned", &Workload::tuned());
    stdout(perfkit(tmp.path()).args(["report", "tuned", "--format", "json"]));
    std::fs::create_dir_all(tmp.path().join("ci")).expect("dir");
    std::fs::copy(
        tmp.path().join("tuned/summary.json"),
        tmp.path().join("ci/baseline.json"),
    )
    .expect("copy");
    std::fs::remove_dir_all(tmp.path().join("tuned")).expect("remove the run");
    let text = stdout(perfkit(tmp.path()).args(["diff", "ci/baseline.json", "ci/baseline.json"]));
    assert!(
        text.starts_with("base: ci/baseline.json\nnew:  ci/baseline.json\n"),
        "{text}"
    );
}

/// A base run whose median step is 0 ns (steps that record no time): the change is no
/// percentage, so the text says `from 0` and the JSON leaves `change` out, as it does for
/// every other figure, instead of claiming `+0.0 %`.
#[test]
fn a_step_change_from_zero_is_not_a_percentage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = |name: &str, step_ns: u64| {
        let mut s = synth::Synth::new(Vec::new(), "train", 4, None, 1_700_000_000_000_000_000);
        s.thread(0, "main");
        for step in 0..10 {
            s.enter(0, "step", Some(step));
            s.work(step_ns);
            s.exit(0);
            s.work(1_000);
        }
        std::fs::write(tmp.path().join(name), s.finish(false)).expect("trace");
    };
    trace("zero.pktrace", 0);
    trace("ms.pktrace", 1_000_000);
    let text = stdout(perfkit(tmp.path()).args(["diff", "zero.pktrace", "ms.pktrace"]));
    let headline = text.lines().nth(2).expect("headline");
    assert!(headline.contains("from 0"), "{headline}");
    assert!(!headline.contains("+0.0 %"), "{headline}");
    let json: Value = serde_json::from_str(&stdout(perfkit(tmp.path()).args([
        "diff",
        "zero.pktrace",
        "ms.pktrace",
        "--format",
        "json",
    ])))
    .expect("json");
    assert_eq!(json["steps"]["base_median_ns"], 0);
    assert!(json["steps"].get("change").is_none(), "{}", json["steps"]);
}

/// A run whose recorder dropped events undercounts every figure: `diff` and `check` say so
/// (a per-step readback lost to a full queue must not pass the gate unremarked).
#[test]
fn diff_and_check_say_when_a_run_dropped_events() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = |name: &str, dropped: u64| {
        let mut s = synth::Synth::new(Vec::new(), "train", 5, None, 1_700_000_000_000_000_000);
        s.thread(0, "main");
        for step in 0..10 {
            s.enter(0, "step", Some(step));
            s.work(1_000_000);
            s.exit(0);
        }
        if dropped > 0 {
            s.dropped(dropped);
        }
        std::fs::write(tmp.path().join(name), s.finish(false)).expect("trace");
    };
    trace("base.pktrace", 0);
    trace("lossy.pktrace", 4321);
    let text = stdout(perfkit(tmp.path()).args(["diff", "base.pktrace", "lossy.pktrace"]));
    assert!(
        text.contains("new run UNDERCOUNTS: the recorder dropped 4321 events"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&stdout(perfkit(tmp.path()).args([
        "diff",
        "base.pktrace",
        "lossy.pktrace",
        "--format",
        "json",
    ])))
    .expect("json");
    assert_eq!(json["new_dropped_events"], 4321);
    assert!(json.get("base_dropped_events").is_none(), "{json}");
    let out = perfkit(tmp.path())
        .args([
            "check",
            "--format",
            "github",
            "--baseline",
            "base.pktrace",
            "--candidate",
            "lossy.pktrace",
        ])
        .output()
        .expect("check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l
            .starts_with("::warning title=perfkit check::candidate run undercounts: the recorder dropped 4321 events")),
        "{text}"
    );
}
