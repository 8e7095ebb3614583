//! `perfkit demo` on the CPU, and the commands of `docs/ci.md` run as written.
//!
//! Both profile real runs of the reference trainer (linked into `perfkit`, started as
//! `perfkit demo --run-trainer`), on the CPU: no GPU is needed.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;

use assert_cmd::Command;
use predicates::prelude::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn perfkit() -> Command {
    let mut c = Command::cargo_bin("perfkit").expect("perfkit binary");
    c.env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("PERFKIT_TRACE");
    c
}

fn findings_of(summary: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(summary).expect("summary.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("summary is JSON");
    v["findings"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("summary.json has no findings array: {v}"))
}

#[test]
fn demo_profiles_lints_and_diffs_the_reference_trainer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("demo");
    perfkit()
        .current_dir(root())
        .args(["demo", "--device", "cpu", "--steps", "4", "--out"])
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("perfkit demo: where to look"))
        .stdout(predicate::str::contains("== diff: median step"))
        .stdout(predicate::str::contains(
            "a CPU run: the runtime rules measure GPU work",
        ))
        .stdout(predicate::str::contains(
            "== measured on the CPU (the anti-pattern run against the tuned one, per step)",
        ))
        .stdout(predicate::str::contains("PK301 loader-without-workers"))
        .stdout(predicate::str::contains("PK202 alloc-in-step-loop"))
        .stdout(predicate::str::contains(
            "needs a GPU to be measured: PK101, PK102",
        ));

    for file in [
        "tuned/report.html",
        "tuned/summary.json",
        "anti-patterns/report.html",
        "anti-patterns/summary.json",
        "diff/diff.html",
        "diff/diff.json",
        "diff/diff.txt",
        "lint.txt",
        "lint.sarif",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }

    // The trainer's lint findings are in the report, at the anti-pattern functions' lines.
    let findings = findings_of(&out.join("anti-patterns/summary.json"));
    assert!(
        findings.iter().any(|f| f["code"] == "PK101"
            && f["origin"] == "lint"
            && f["location"]
                .as_str()
                .is_some_and(|l| l.starts_with("kernels/src/antipatterns.rs:"))),
        "{findings:#?}"
    );
    // A CPU run has no GPU work: no runtime finding, in either run.
    for run in ["tuned", "anti-patterns"] {
        let f = findings_of(&out.join(run).join("summary.json"));
        assert!(f.iter().all(|x| x["origin"] != "runtime"), "{run}: {f:#?}");
    }
    let html = std::fs::read_to_string(out.join("anti-patterns/report.html")).expect("html");
    assert!(html.contains("PK101"));

    let sarif = std::fs::read_to_string(out.join("lint.sarif")).expect("sarif");
    assert!(sarif.contains("\"PK102\""));

    // The demo's runs are valid inputs to the gate: a run against itself passes.
    perfkit()
        .args(["check", "--baseline"])
        .arg(out.join("tuned"))
        .arg("--candidate")
        .arg(out.join("tuned"))
        .assert()
        .code(0)
        .stdout(predicate::str::contains("perfkit check: PASS"));
}

/// The demo from a copy of the binary in a directory of its own, run from another directory with
/// no perfkit source tree: it lints the sources built into it, and everything it prints or
/// writes is relative to where it ran.
#[test]
fn demo_works_from_an_installed_binary_without_the_source_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::fs::create_dir_all(&work).expect("mkdir");
    let exe = bin.join("perfkit");
    std::fs::copy(assert_cmd::cargo::cargo_bin("perfkit"), &exe).expect("copy perfkit");
    let out = StdCommand::new(&exe)
        .args(["demo", "--device", "cpu", "--steps", "3"])
        .current_dir(&work)
        .env_remove("PERFKIT_TRACE")
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .expect("run the copied perfkit");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Nothing names the source tree perfkit was built from, nor the absolute work directory.
    let source_tree = root().display().to_string();
    let work_dir = work.display().to_string();
    for text in [&stdout, &stderr] {
        assert!(!text.contains(&source_tree), "{text}");
        assert!(!text.contains(&work_dir), "{text}");
    }
    assert!(
        stdout.contains("  lint            perfkit-out/demo/lint.txt"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "linting the sources built into perfkit, written to perfkit-out/demo/sources"
        ),
        "{stderr}"
    );
    let demo = work.join("perfkit-out/demo");
    assert!(demo.join("sources/.perfkit-demo-sources").is_file());
    assert!(demo.join("sources/kernels/src/antipatterns.rs").is_file());
    // The lint findings are there, at the copies' paths relative to the work directory.
    let lint = std::fs::read_to_string(demo.join("lint.txt")).expect("lint.txt");
    assert!(
        lint.contains("--> perfkit-out/demo/sources/kernels/src/antipatterns.rs:"),
        "{lint}"
    );
    assert!(
        lint.contains("[PK101]") && lint.contains("[PK202]"),
        "{lint}"
    );
    for line in lint.lines().filter(|l| l.trim_start().starts_with("-->")) {
        assert!(
            line.trim_start()
                .starts_with("--> perfkit-out/demo/sources/"),
            "{line}"
        );
    }
    assert!(
        stdout.contains("findings in the trainer (perfkit-out/demo/sources/kernels)"),
        "{stdout}"
    );
    // In the report, lint findings are located relative to their workspace, as the trainer's
    // recorded source lines are, so that a GPU run confirms them.
    let findings = findings_of(&demo.join("anti-patterns/summary.json"));
    assert!(
        findings.iter().any(|f| f["code"] == "PK101"
            && f["origin"] == "lint"
            && f["location"]
                .as_str()
                .is_some_and(|l| l.starts_with("kernels/src/antipatterns.rs:"))),
        "{findings:#?}"
    );
    // A second demo into the same place replaces its own copies.
    let again = StdCommand::new(&exe)
        .args(["demo", "--device", "cpu", "--steps", "2"])
        .current_dir(&work)
        .env_remove("PERFKIT_TRACE")
        .output()
        .expect("run again");
    assert!(again.status.success(), "{again:?}");
    // A `sources/` directory the demo did not write is never overwritten.
    let other = work.join("elsewhere");
    std::fs::create_dir_all(other.join("sources")).expect("mkdir");
    std::fs::write(other.join("sources/mine.rs"), "fn main() {}\n").expect("write");
    let refused = StdCommand::new(&exe)
        .args([
            "demo",
            "--device",
            "cpu",
            "--steps",
            "2",
            "--out",
            "elsewhere",
        ])
        .current_dir(&work)
        .env_remove("PERFKIT_TRACE")
        .output()
        .expect("run refused");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("elsewhere/sources exists and was not written by `perfkit demo`"),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read_to_string(other.join("sources/mine.rs")).expect("read"),
        "fn main() {}\n"
    );
}

/// The `run:` commands of the workflow in docs/ci.md, by step name, and the lines of the
/// "Recording the baseline" block.
fn ci_doc() -> (Vec<(String, String)>, Vec<String>) {
    let text = std::fs::read_to_string(root().join("docs/ci.md")).expect("docs/ci.md");
    let mut steps = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(n) = t.strip_prefix("- name: ") {
            name = n.to_owned();
        } else if let Some(cmd) = t.strip_prefix("run: ") {
            steps.push((name.clone(), cmd.to_owned()));
        }
    }
    let baseline_block = text
        .split("## Recording the baseline")
        .nth(1)
        .and_then(|s| s.split("```sh").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("baseline block");
    let baseline = baseline_block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    (steps, baseline)
}

fn step<'a>(steps: &'a [(String, String)], name: &str) -> &'a str {
    &steps
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no step `{name}` in docs/ci.md: {steps:?}"))
        .1
}

/// Runs a documented command with `sh`, `perfkit` on the PATH. Profiled runs are shortened to
/// 3 steps (the debug build is slow), nothing else is changed.
fn sh(work: &Path, bin: &Path, cmd: &str) -> std::process::Output {
    let cmd = cmd.replace("--steps 100", "--steps 3");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    StdCommand::new("sh")
        .arg("-c")
        .arg(&cmd)
        .current_dir(work)
        .env("PATH", path)
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("PERFKIT_TRACE")
        .output()
        .expect("run sh")
}

#[test]
fn ci_doc_commands_work_as_written() {
    let (steps, baseline) = ci_doc();
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path().join("repo");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(work.join("src")).expect("mkdir");
    std::fs::create_dir_all(work.join("target/release")).expect("mkdir");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let exe = assert_cmd::cargo::cargo_bin("perfkit");
    std::os::unix::fs::symlink(&exe, bin.join("perfkit")).expect("link perfkit");
    // The documented `cargo build --release --bin train` stands for the user's program; here it
    // is the reference trainer linked into perfkit.
    let train = work.join("target/release/train");
    std::fs::write(
        &train,
        format!(
            "#!/bin/sh\nexec '{}' demo --run-trainer \"$@\"\n",
            exe.display()
        ),
    )
    .expect("write train");
    std::fs::set_permissions(&train, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    // Lint gate: clean code passes and writes SARIF ...
    let lint = step(&steps, "Lint gate");
    std::fs::write(
        work.join("src/lib.rs"),
        "pub fn add(a: u32, b: u32) -> u32 { a + b }\n",
    )
    .expect("write");
    let o = sh(&work, &bin, lint);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(work.join("perfkit.sarif").is_file());
    // ... and a step loop that reads a value back every step fails with an annotation.
    let fixture = root().join("fixtures/lint/pk101-host-readback-in-step-loop/src");
    for entry in std::fs::read_dir(&fixture).expect("fixture") {
        let p = entry.expect("entry").path();
        // The fixture's files (its module directories are not needed for the gate to fail).
        if p.is_file() {
            std::fs::copy(&p, work.join("src").join(p.file_name().expect("name"))).expect("copy");
        }
    }
    let o = sh(&work, &bin, lint);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("::warning file=src/"), "{stdout}");
    let sarif = std::fs::read_to_string(work.join("perfkit.sarif")).expect("sarif");
    assert!(sarif.contains("\"PK101\""));

    // Recording the baseline, then the profile and the profile gate of the workflow.
    for line in &baseline {
        let o = sh(&work, &bin, line);
        assert!(o.status.success(), "{line}: {o:?}");
    }
    assert!(work.join(".perfkit/baseline.json").is_file());
    let o = sh(&work, &bin, step(&steps, "Profile"));
    assert!(o.status.success(), "{o:?}");
    let o = sh(&work, &bin, step(&steps, "Profile gate"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // Two separate CPU runs: pass or fail depends on the machine, an error never; whichever
    // it is, the exit code, the verdict line and the annotations agree.
    assert!(stdout.contains("median step time: "), "{stdout}");
    if stdout.contains("perfkit check: PASS") {
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        assert!(!stdout.contains("::error"), "{stdout}");
    } else {
        assert!(stdout.contains("perfkit check: FAIL"), "{stdout}");
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(
            stdout.contains("::error title=perfkit check::"),
            "a failing gate is annotated: {stdout}"
        );
    }

    // The baseline against the run it was recorded from passes.
    let o = sh(
        &work,
        &bin,
        "perfkit check --baseline .perfkit/baseline.json --candidate perfkit-out/baseline --max-regression 10% --format github",
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

/// `perfkit demo --out DIR` never writes over a file it did not write: `lint.sarif` of your
/// own in DIR, or a `report.html` of your own in `DIR/tuned/`, stops it before any run, and
/// the file is named and left as it was.
#[test]
fn demo_never_replaces_files_it_did_not_write() {
    for (file, other) in [("lint.sarif", "tuned"), ("tuned/report.html", "lint.sarif")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mine = dir.path().join("out").join(file);
        std::fs::create_dir_all(mine.parent().expect("parent")).expect("mkdir");
        std::fs::write(&mine, "my own file\n").expect("write");
        let out = perfkit()
            .current_dir(root())
            .args(["demo", "--device", "cpu", "--steps", "2", "--out"])
            .arg(dir.path().join("out"))
            .output()
            .expect("run demo");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {err}");
        assert!(err.contains(file), "{file}: the file is named: {err}");
        assert!(!err.contains("profiling"), "{file}: nothing ran: {err}");
        assert_eq!(
            std::fs::read_to_string(&mine).expect("read"),
            "my own file\n",
            "{file}"
        );
        for other in [other, ".perfkit-run"] {
            assert!(
                !dir.path().join("out").join(other).exists(),
                "{file}: nothing else written, {other}"
            );
        }
    }
}

/// `perfkit demo --steps 0` would measure nothing and print it as measured costs (`+0 ns`): a
/// usage error naming the flag, before anything runs.
#[test]
fn demo_without_steps_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    perfkit()
        .current_dir(dir.path())
        .args(["demo", "--device", "cpu", "--steps", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--steps"));
    assert!(!dir.path().join("perfkit-out").exists(), "nothing written");
}
