//! `perfkit profile` end to end: the real binary runs the instrumented example program
//! (`profiler/examples/train_cpu.rs`) and plain shell commands.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use assert_cmd::Command as Cmd;
use perfkit_profiler::model::Record;
use perfkit_profiler::{TraceReader, TraceStatus};
use serde_json::Value;

const PERFKIT: &str = env!("CARGO_BIN_EXE_perfkit");

/// The example program, built once per test run with the cargo that runs the tests.
fn example() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let out = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "perfkit-profiler",
                "--example",
                "train_cpu",
            ])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--message-format=json-render-diagnostics")
            .stderr(Stdio::inherit())
            .output()
            .expect("run cargo to build the example");
        assert!(out.status.success(), "building the example failed");
        let stdout = String::from_utf8(out.stdout).expect("cargo output is UTF-8");
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "train_cpu")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reports the example's executable")
    })
}

fn read_summary(run: &Path) -> Value {
    let text = std::fs::read_to_string(run.join("summary.json")).expect("summary.json written");
    serde_json::from_str(&text).expect("summary.json is JSON")
}

fn span<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["spans"]
        .as_array()
        .expect("spans is an array")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span {name} in {}", summary["spans"]))
}

fn ns(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not a count of ns: {v}"))
}

/// A background `perfkit profile` that is stopped (SIGTERM, forwarded to the program) if the
/// test fails before it ends.
struct Running(Option<Child>);

impl Running {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    fn wait_with_output(mut self) -> std::process::Output {
        let child = self.0.take().expect("not waited yet");
        child.wait_with_output().expect("wait for perfkit")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

/// Starts `perfkit profile --out <run> -- example <args>` in the background; the example stops
/// by itself after a minute at most.
fn spawn_profile(run: &Path, args: &[&str]) -> Running {
    let child = Command::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(run)
        .arg("--")
        .arg(example())
        .args(args)
        .args(["--max-seconds", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start perfkit");
    Running(Some(child))
}

/// Waits until the run's trace file exists and holds at least one chunk after the header,
/// then returns its path and the traced process's pid (from the trace header).
fn wait_for_trace(run: &Path) -> (PathBuf, u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "no trace appeared in {}",
            run.display()
        );
        let files = perfkit_profiler::trace_files(run.join("trace")).unwrap_or_default();
        if let Some(file) = files.first()
            && let Ok(mut reader) = TraceReader::open(file)
        {
            let pid = reader.header().pid;
            if reader
                .by_ref()
                .filter_map(Result::ok)
                .any(|r| matches!(r, Record::SpanClose(_)))
            {
                return (file.clone(), pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

#[test]
fn profiles_the_example_and_writes_trace_and_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(&run)
        .arg("--")
        .arg(example())
        .args(["--steps", "30", "--print-every", "10"])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    // The program's own output passes through untouched.
    assert!(stdout.contains("step     30  loss"), "{stdout}");
    assert!(stdout.contains("trained 30 steps"), "{stdout}");
    // The terminal summary.
    assert!(stderr.contains("ended with exit code 0"), "{stderr}");
    assert!(stderr.contains("steps      30   mean"), "{stderr}");
    for column in [
        "Action",
        "Mean duration",
        "Num calls",
        "Total time",
        "Self time",
        "% of wall",
    ] {
        assert!(stderr.contains(column), "missing {column}: {stderr}");
    }
    for name in ["data", "forward", "backward", "optimizer"] {
        assert!(
            stderr
                .lines()
                .any(|l| l.trim_start().starts_with(name) && l.contains(" 30 ")),
            "no row for {name} with 30 calls: {stderr}"
        );
    }
    assert!(stderr.contains("summary.json"), "{stderr}");

    let s = read_summary(&run);
    assert_eq!(s["schema"], "perfkit-summary");
    assert_eq!(s["version"], 1);
    assert_eq!(s["instrumented"], true);
    assert_eq!(s["run"]["incomplete"], false, "{}", s["run"]);
    assert_eq!(s["run"]["exit"]["code"], 0);
    assert_eq!(s["steps"]["count"], 30);
    let (mean, median, p95) = (
        ns(&s["steps"]["mean_ns"]),
        ns(&s["steps"]["median_ns"]),
        ns(&s["steps"]["p95_ns"]),
    );
    assert!(
        ns(&s["steps"]["min_ns"]) <= median && median <= p95,
        "{}",
        s["steps"]
    );
    assert!(
        mean > 0 && p95 <= ns(&s["steps"]["max_ns"]),
        "{}",
        s["steps"]
    );
    // Every child span ran once per step; the step's self time is exactly what its children
    // do not cover.
    let step = span(&s, "step");
    assert_eq!(step["calls"], 30);
    let children: u64 = ["data", "forward", "backward", "optimizer"]
        .iter()
        .map(|n| {
            let row = span(&s, n);
            assert_eq!(row["calls"], 30, "{row}");
            assert!(ns(&row["self_ns"]) <= ns(&row["total_ns"]));
            ns(&row["total_ns"])
        })
        .sum();
    assert_eq!(ns(&step["self_ns"]), ns(&step["total_ns"]) - children);
    assert_eq!(ns(&step["total_ns"]), ns(&s["steps"]["total_ns"]));
    assert!(ns(&step["total_ns"]) <= ns(&s["run"]["wall_time_ns"]));
    // The typed reader accepts the file, with the sections the reports add.
    let typed = perfkit_profiler::summary::Summary::read_json(&run.join("summary.json"))
        .expect("summary.json reads back as a perfkit summary");
    assert_eq!(typed.steps.count, 30);
    assert!(
        s.get("analysis").is_some(),
        "the reports add their analysis"
    );
    // The reports rendered at the end of the run are listed and exist.
    let reports: Vec<&str> = s["files"]["reports"]
        .as_array()
        .expect("files.reports is an array")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(reports.contains(&"report.html"), "{reports:?}");
    for report in &reports {
        assert!(run.join(report).is_file(), "{report} listed but missing");
    }
    assert!(stderr.contains("report.html"), "{stderr}");
    // The trace file is where the summary says, and complete.
    let files = s["files"]["trace_files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    let trace = run.join(files[0].as_str().unwrap());
    let mut reader = TraceReader::open(&trace).unwrap();
    assert_eq!(s["primary_pid"], reader.header().pid);
    let closes = reader
        .by_ref()
        .filter(|r| matches!(r, Ok(Record::SpanClose(_))))
        .count();
    assert_eq!(closes, 30 * 5);
    assert!(reader.status().is_complete());
}

#[test]
fn each_process_writes_its_own_trace_and_rank_0_is_the_primary() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let ex = example().display().to_string();
    // The launched shell is not traced; its two children are, as two ranks.
    let script = format!(
        "RANK=1 '{ex}' --steps 3 --print-every 0 & RANK=0 '{ex}' --steps 4 --print-every 0; wait"
    );
    Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(&run)
        .args(["--", "sh", "-c", &script])
        .assert()
        .success()
        .stderr(predicates::str::contains("2 traced processes"));
    let s = read_summary(&run);
    assert_eq!(s["files"]["trace_files"].as_array().map(Vec::len), Some(2));
    let processes = s["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 2);
    let rank0 = processes.iter().find(|p| p["rank"] == 0).unwrap();
    let rank1 = processes.iter().find(|p| p["rank"] == 1).unwrap();
    assert_eq!(s["primary_pid"], rank0["pid"]);
    assert_eq!(s["steps"]["count"], 4);
    assert_eq!(rank1["steps"]["count"], 3);
    assert_ne!(rank0["pid"], rank1["pid"]);
}

#[test]
fn program_exit_code_is_perfkits_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    Cmd::new(PERFKIT)
        .args(["profile", "--quiet", "--out"])
        .arg(&run)
        .arg("--")
        .arg(example())
        .args(["--steps", "3", "--exit-code", "3"])
        .assert()
        .code(3);
    let s = read_summary(&run);
    assert_eq!(s["run"]["exit"]["code"], 3);
    assert_eq!(s["run"]["exit"]["exit_code"], 3);
    assert_eq!(s["steps"]["count"], 3);
    assert_eq!(s["run"]["incomplete"], false);
}

#[test]
fn a_panicking_program_is_summarised_up_to_the_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    Cmd::new(PERFKIT)
        .args(["profile", "--quiet", "--out"])
        .arg(&run)
        .arg("--")
        .arg(example())
        .args(["--steps", "20", "--panic-at", "5"])
        .assert()
        .code(101);
    let s = read_summary(&run);
    // Steps 0..=4 completed; step 5's span was closed while the panic unwound through it.
    assert_eq!(s["steps"]["count"], 6);
    assert_eq!(
        span(&s, "backward")["calls"],
        5,
        "step 5 panicked before backward"
    );
    assert_eq!(span(&s, "forward")["calls"], 6);
    assert_eq!(s["run"]["incomplete"], true);
    assert_eq!(
        s["processes"][0]["complete"], true,
        "the trace itself was finished"
    );
    let panic = s["processes"][0]["panic"].as_str().unwrap_or_default();
    assert!(
        panic.contains("injected panic at step 5"),
        "{}",
        s["processes"][0]
    );
}

#[test]
fn sigterm_to_perfkit_reaches_the_program() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let child = spawn_profile(&run, &["--steps", "10000000", "--print-every", "0"]);
    wait_for_trace(&run);
    kill(child.id(), "TERM");
    let out = child.wait_with_output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The example does not handle SIGTERM, so it dies of it, and perfkit says so in its code.
    assert_eq!(out.status.code(), Some(128 + 15), "{stderr}");
    assert!(stderr.contains("forwarded it to the program"), "{stderr}");
    let s = read_summary(&run);
    assert_eq!(s["run"]["exit"]["signal"], 15);
    assert_eq!(s["run"]["signals"][0]["name"], "SIGTERM");
    assert_eq!(s["run"]["signals"][0]["forwarded"], true);
    assert_eq!(s["run"]["incomplete"], true);
    assert!(ns(&s["steps"]["count"]) > 0, "{}", s["steps"]);
}

/// Counts the records of a trace that read back, and says how it ended.
fn count_records(trace: &Path) -> (u64, TraceStatus) {
    let mut reader = TraceReader::open(trace).unwrap();
    let mut records = 0u64;
    for record in reader.by_ref() {
        record.expect("a killed trace reads back without error");
        records += 1;
    }
    (records, reader.status().clone())
}

#[test]
fn sigkill_mid_run_leaves_a_readable_trace_with_all_it_flushed() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let child = spawn_profile(&run, &["--steps", "10000000", "--print-every", "0"]);
    let (trace, pid) = wait_for_trace(&run);
    // Wait (on the file, not the clock) until several periodic flushes have brought records.
    let deadline = Instant::now() + Duration::from_secs(60);
    let before_kill = loop {
        // The file is being written: a chunk in flight may not read yet.
        let records =
            TraceReader::open(&trace).map_or(0, |r| r.filter_map(Result::ok).count() as u64);
        if records > 100 {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "only {records} records reached the file"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    kill(pid, "KILL");
    let out = child.wait_with_output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "{stderr}");
    assert!(stderr.contains("run incomplete"), "{stderr}");

    // Everything that reached the file before the kill still reads back. (How long before
    // the kill the last record lies is measured by the profiler's `kill_gap` benchmark.)
    let (records, status) = count_records(&trace);
    assert!(matches!(status, TraceStatus::Cut { .. }), "{status:?}");
    assert!(records >= before_kill, "{records} < {before_kill}");

    let s = read_summary(&run);
    assert_eq!(s["run"]["incomplete"], true);
    assert_eq!(s["run"]["exit"]["signal_name"], "SIGKILL");
    assert_eq!(s["processes"][0]["complete"], false);
    assert!(ns(&s["steps"]["count"]) > 0);
}

#[test]
fn an_uninstrumented_program_is_reported_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(&run)
        .args(["--", "sh", "-c", "echo hello; exit 4"])
        .assert()
        .code(4)
        .stdout("hello\n")
        .stderr(predicates::str::contains("not instrumented"))
        .stderr(predicates::str::contains(
            "let _perfkit = perfkit_profiler::init();",
        ))
        .stderr(predicates::str::contains("ended with exit code 4"));
    let s = read_summary(&run);
    assert_eq!(s["instrumented"], false);
    assert_eq!(s["steps"]["count"], 0);
    assert_eq!(s["run"]["exit"]["code"], 4);
    assert_eq!(s["files"]["trace_files"].as_array().map(Vec::len), Some(0));
}

#[test]
fn stdin_passes_through() {
    let tmp = tempfile::tempdir().unwrap();
    Cmd::new(PERFKIT)
        .args(["profile", "--quiet", "--out"])
        .arg(tmp.path().join("run"))
        .args(["--", "cat"])
        .write_stdin("fed through\n")
        .assert()
        .success()
        .stdout("fed through\n");
}

#[test]
fn missing_or_unexecutable_program_follows_shell_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(&run)
        .args(["--", "perfkit-test-no-such-program"])
        .assert()
        .code(127)
        .stderr(predicates::str::contains(
            "program not found: `perfkit-test-no-such-program`",
        ));
    let script = tmp.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(tmp.path().join("run2"))
        .arg("--")
        .arg(&script)
        .assert()
        .code(126)
        .stderr(predicates::str::contains("cannot execute"))
        .stderr(predicates::str::contains("not-executable.sh"));
    // A script whose interpreter is missing is there: 127 as in a shell, but not "not found".
    let script = tmp.path().join("bad-interpreter.sh");
    std::fs::write(&script, "#!/perfkit-test/no-such-interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(tmp.path().join("run3"))
        .arg("--")
        .arg(&script)
        .assert()
        .code(127)
        .stderr(predicates::str::contains("bad-interpreter.sh"))
        .stderr(predicates::str::contains("interpreter"));
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(!err.contains("program not found"), "{err}");
}

/// An option `perfkit profile` does not have, before the program: a usage error (exit 2)
/// naming the option, not "program not found" (127), and nothing is written.
#[test]
fn an_unknown_option_is_a_usage_error_not_a_missing_program() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(&run)
        .args(["--step-span", "train_step", "--", "true"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("unknown option `--step-span`"));
    assert!(!run.exists(), "nothing is written");
}

#[test]
fn default_output_dir_and_reuse_of_out() {
    let tmp = tempfile::tempdir().unwrap();
    Cmd::new(PERFKIT)
        .current_dir(tmp.path())
        .args(["profile", "--quiet", "--", "true"])
        .assert()
        .success();
    let runs: Vec<_> = std::fs::read_dir(tmp.path().join("perfkit-out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].starts_with("true-20"), "{runs:?}");
    assert!(
        tmp.path()
            .join("perfkit-out")
            .join(&runs[0])
            .join("summary.json")
            .is_file()
    );

    // An --out that already holds a run is refused unless --force.
    let run = tmp.path().join("perfkit-out").join(&runs[0]);
    Cmd::new(PERFKIT)
        .args(["profile", "--out"])
        .arg(&run)
        .args(["--", "true"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--force"));
    Cmd::new(PERFKIT)
        .args(["profile", "--quiet", "--force", "--out"])
        .arg(&run)
        .args(["--", "true"])
        .assert()
        .success();
}

/// Ctrl-C typed at a terminal reaches the whole foreground process group: the program gets it
/// from the terminal, and perfkit must not send it a second one. `script` (util-linux) gives
/// the run a pseudo-terminal whose line discipline turns the byte 0x03 into SIGINT.
#[cfg(target_os = "linux")]
#[test]
fn ctrl_c_at_a_terminal_reaches_the_program_exactly_once() {
    use std::io::Write as _;

    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let ready = tmp.path().join("ready");
    let log = tmp.path().join("terminal.log");
    // Counts SIGINTs; after the first, waits long enough for a duplicate to arrive.
    let program = tmp.path().join("count-sigint.sh");
    std::fs::write(
        &program,
        format!(
            "n=0\ntrap 'n=$((n+1))' INT\ntouch '{}'\nwhile [ $n -eq 0 ]; do sleep 0.05; done\n\
             sleep 0.5\necho \"SIGINT x$n\"\nexit 7\n",
            ready.display()
        ),
    )
    .unwrap();
    // `exec`: whatever shell `script` starts (`$SHELL`, or dash where it is unset) must not
    // stay in the foreground process group, where a non-interactive dash dies of the SIGINT
    // itself and `script` would report that instead of perfkit's exit code.
    let command = format!(
        "exec '{PERFKIT}' profile --out '{}' -- sh '{}'",
        run.display(),
        program.display()
    );
    let mut script = Command::new("script");
    // A terminal's shell starts its jobs with SIGINT at its default action; a test run started
    // with SIGINT ignored (a background job of a non-interactive shell) would hand that on, and
    // perfkit, like a shell, leaves an ignored SIGINT ignored.
    // SAFETY: `signal` is async-signal-safe, as code between fork and exec must be.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut script, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut script = script
        .env("SHELL", "/bin/sh")
        .args(["-qec", &command])
        .arg(&log)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("`script` (util-linux) runs a command in a pseudo-terminal");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Keep stdin open until the end: closing it would hang up the terminal.
    let mut stdin = script.stdin.take().unwrap();
    stdin.write_all(b"\x03").unwrap();
    stdin.flush().unwrap();
    let status = script.wait().unwrap();
    drop(stdin);
    let terminal = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(7), "{terminal}");
    assert!(terminal.contains("SIGINT x1"), "{terminal}");
    let s = read_summary(&run);
    assert_eq!(s["run"]["signals"][0]["from"], "terminal", "{}", s["run"]);
    assert_eq!(s["run"]["signals"][0]["forwarded"], false);
    assert_eq!(s["run"]["exit"]["code"], 7);
}

#[test]
fn lint_findings_are_shown_next_to_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/lint/pk101-host-readback-in-step-loop");
    let out = Cmd::new(PERFKIT)
        .args(["profile", "--lint"])
        .arg(&fixture)
        .arg("--out")
        .arg(&run)
        .arg("--")
        .arg(example())
        .args(["--steps", "3", "--print-every", "0"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("PK101") && l.contains("lint")),
        "{stderr}"
    );
    let s = read_summary(&run);
    let findings = s["findings"].as_array().expect("findings is an array");
    assert!(
        findings
            .iter()
            .any(|f| f["code"] == "PK101" && f["origin"] == "lint"),
        "{findings:?}"
    );
}

/// A cargo workspace in `root` whose member `crates/app` (package `app-kernels`) declares the
/// bin `trainer`, with a step loop that reads the loss back every step; `target/debug/trainer`
/// is a link to the example program, as if cargo had built it there.
fn fake_workspace(root: &Path) -> PathBuf {
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "Cargo.toml",
        "[workspace]\nmembers = [\"crates/*\"]\nresolver = \"3\"\n",
    );
    write(
        "crates/app/Cargo.toml",
        "[package]\nname = \"app-kernels\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
         [[bin]]\nname = \"trainer\"\npath = \"src/trainer.rs\"\n\n\
         [dependencies]\ncandle-core = \"0.9\"\ncandle-nn = \"0.9\"\n",
    );
    write(
        "crates/app/src/trainer.rs",
        "use candle_core::Tensor;\n\
         use candle_nn::Optimizer;\n\
         \n\
         pub fn train(opt: &mut candle_nn::AdamW, batches: &[Tensor]) -> candle_core::Result<()> {\n\
         \x20   for (step, xs) in batches.iter().enumerate() {\n\
         \x20       let loss = xs.sqr()?.mean_all()?;\n\
         \x20       opt.backward_step(&loss)?;\n\
         \x20       println!(\"step {step}: loss {}\", loss.to_scalar::<f32>()?);\n\
         \x20   }\n\
         \x20   Ok(())\n\
         }\n\
         \n\
         fn main() {}\n",
    );
    // Another binary of the package, with a finding of its own: not the program that ran.
    write(
        "crates/app/src/bin/other.rs",
        "use candle_core::Tensor;\n\
         \n\
         pub fn train(opt: &mut candle_nn::AdamW, batches: &[Tensor]) -> candle_core::Result<()> {\n\
         \x20   for xs in batches {\n\
         \x20       let loss = xs.sqr()?.mean_all()?;\n\
         \x20       opt.backward_step(&loss)?;\n\
         \x20       println!(\"{}\", loss.to_scalar::<f32>()?);\n\
         \x20   }\n\
         \x20   Ok(())\n\
         }\n\
         \n\
         fn main() {}\n",
    );
    let exe = root.join("target/debug/trainer");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(example(), &exe).unwrap();
    exe
}

#[test]
fn without_lint_the_package_that_built_the_program_is_linted() {
    let tmp = tempfile::tempdir().unwrap();
    // The canonical path, as the current directory perfkit sees is one.
    let root = tmp.path().canonicalize().unwrap();
    let exe = fake_workspace(&root.join("ws"));
    let run = root.join("run");
    let out = Cmd::new(PERFKIT)
        .current_dir(&root)
        .args(["profile", "--out"])
        .arg(&run)
        .arg("--")
        .arg(&exe)
        .args(["--steps", "3", "--print-every", "0"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr
            .lines()
            .any(|l| l == "lint: ws/crates/app/src/trainer.rs (package app-kernels, from target/debug/trainer)"),
        "{stderr}"
    );
    let s = read_summary(&run);
    let findings = s["findings"].as_array().expect("findings is an array");
    assert!(
        findings.iter().any(|f| f["code"] == "PK101"
            && f["origin"] == "lint"
            && f["location"]
                .as_str()
                .is_some_and(|l| l.contains("trainer.rs:8"))),
        "{findings:?}"
    );
    // Only the target that ran: the package's other binary is not linted with it.
    assert!(
        !findings.iter().any(|f| f["location"]
            .as_str()
            .is_some_and(|l| l.contains("other.rs"))),
        "{findings:?}"
    );
}

#[test]
fn no_lint_lints_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    // The canonical path, as the current directory perfkit sees is one.
    let root = tmp.path().canonicalize().unwrap();
    let exe = fake_workspace(&root.join("ws"));
    let run = root.join("run");
    let out = Cmd::new(PERFKIT)
        .current_dir(&root)
        .args(["profile", "--no-lint", "--out"])
        .arg(&run)
        .arg("--")
        .arg(&exe)
        .args(["--steps", "3", "--print-every", "0"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(!stderr.lines().any(|l| l.starts_with("lint: ")), "{stderr}");
    let s = read_summary(&run);
    let findings = s["findings"].as_array().expect("findings is an array");
    assert!(
        !findings.iter().any(|f| f["origin"] == "lint"),
        "{findings:?}"
    );
}

/// `--lint PATH` with a program that records nothing (not instrumented, no CUDA to capture):
/// the lint findings are still shown, and a path that cannot be linted is still named; they
/// were passed over without a word.
#[test]
fn lint_findings_are_shown_for_an_uninstrumented_program_too() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/lint/pk101-host-readback-in-step-loop");
    let out = Cmd::new(PERFKIT)
        .args(["profile", "--no-inject", "--out"])
        .arg(tmp.path().join("run"))
        .arg("--lint")
        .arg(&fixture)
        .arg("--lint")
        .arg(tmp.path().join("missing.rs"))
        .args(["--", "true"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains("PK101"), "{stderr}");
    assert!(
        stderr.contains("perfkit: error: --lint: ") && stderr.contains("missing.rs"),
        "{stderr}"
    );
}
