//! Whole processes: a program that exits without dropping its guard still finishes its trace,
//! and a program killed with SIGKILL leaves a readable trace holding everything the periodic
//! flush wrote before the kill. (How long before the kill the last record lies is a figure of
//! the `kill_gap` benchmark, not a bound checked here.)
//!
//! Each test's child process is this test binary re-running that same test with
//! `PERFKIT_TEST_CHILD` set, which then plays the child's part instead of the parent's.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use perfkit_profiler::model::{EndReason, Record};
use perfkit_profiler::{TRACE_ENV, TraceStatus};

const CHILD_ENV: &str = "PERFKIT_TEST_CHILD";

/// Plays the child's part when this process is a child a test started; returns whether it was.
fn is_child() -> bool {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return false;
    };
    child_body(&mode);
    true
}

/// The child side of the tests below.
fn child_body(mode: &str) {
    if mode == "layers" {
        // A user layer composed into the same subscriber sees the same spans.
        let guard = perfkit_profiler::Builder::new()
            .with_layer(Box::new(Counting))
            .init();
        assert!(guard.is_recording());
        for step in 0..5u64 {
            let _s = tracing::info_span!("step", step).entered();
        }
        assert_eq!(SEEN.load(Ordering::Relaxed), 5);
        return;
    }
    let guard = perfkit_profiler::init();
    assert!(guard.is_recording(), "PERFKIT_TRACE is set for the child");
    match mode {
        "exit" => {
            for step in 0..10u64 {
                let _s = tracing::info_span!("step", step).entered();
            }
            // Leave without dropping the guard: the exit handler must finish the trace.
            std::mem::forget(guard);
            std::process::exit(0);
        }
        "run" => {
            for step in 0u64.. {
                {
                    let _s = tracing::info_span!("step", step).entered();
                    std::thread::sleep(Duration::from_millis(1));
                }
                // The readiness line the parent waits for: this step's span is closed.
                println!("closed step {step}");
            }
        }
        "fork" => {
            let _s = tracing::info_span!("step", step = 0u64).entered();
            let t0 = Instant::now();
            // SAFETY: the forked child only calls exit(); the parent waits for it.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                // SAFETY: leaves through the C runtime's exit handlers, as a worker does.
                unsafe { libc::exit(0) };
            }
            let mut status = 0;
            // SAFETY: waits for the child forked above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            println!("forked child exited in {} ms", t0.elapsed().as_millis());
        }
        "layers" => {}
        other => panic!("unknown child mode {other}"),
    }
}

static SEEN: AtomicUsize = AtomicUsize::new(0);

/// A user layer that counts the spans it is shown.
struct Counting;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counting {
    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        SEEN.fetch_add(1, Ordering::Relaxed);
    }
}

/// The calling test, re-run as a child process in `mode`.
fn child(test: &str, mode: &str, trace_dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, mode)
        .env(TRACE_ENV, trace_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

fn only_trace(dir: &Path) -> std::path::PathBuf {
    let files = perfkit_profiler::trace_files(dir).unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[test]
fn a_forked_child_leaving_through_exit_does_not_wait_for_the_parents_writer() {
    if is_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = child(
        "a_forked_child_leaving_through_exit_does_not_wait_for_the_parents_writer",
        "fork",
        dir.path(),
    )
    .stdout(Stdio::piped())
    .output()
    .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ms: u64 = stdout
        .lines()
        .find_map(|l| l.split_once("forked child exited in ").map(|(_, r)| r))
        .and_then(|l| l.strip_suffix(" ms"))
        .unwrap_or_else(|| panic!("no report from the child: {stdout}"))
        .parse()
        .unwrap();
    // Not a speed check: waiting for a writer thread that does not run in the child took the
    // whole 2 s timeout, so a child that waits can never exit sooner than that.
    assert!(
        ms < 2_000,
        "forked child took {ms} ms to exit: it waited for the parent's writer"
    );
    // The parent's trace is finished as usual.
    let (_, _, status) = common::read_all(&only_trace(dir.path()));
    assert!(matches!(status, TraceStatus::Complete(_)), "{status:?}");
}

#[test]
fn exiting_without_dropping_the_guard_still_finishes_the_trace() {
    if is_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = child(
        "exiting_without_dropping_the_guard_still_finishes_the_trace",
        "exit",
        dir.path(),
    )
    .status()
    .unwrap();
    assert!(status.success());
    let path = only_trace(dir.path());
    let (header, records, status) = common::read_all(&path);
    let TraceStatus::Complete(end) = status else {
        panic!("{status:?}")
    };
    assert_eq!(end.reason, EndReason::ProcessExit);
    assert_ne!(header.pid, std::process::id());
    assert!(
        path.to_str()
            .unwrap()
            .ends_with(&format!("-{}.pktrace", header.pid))
    );
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::SpanNew(s) if &*s.callsite.name == "step"))
        .count();
    assert_eq!(steps, 10);
}

/// The step spans in a trace, and how many of them were closed.
fn steps_in(path: &Path) -> (usize, usize, TraceStatus) {
    let (_, records, status) = common::read_all(path);
    let opened = records
        .iter()
        .filter(|r| matches!(r, Record::SpanNew(s) if &*s.callsite.name == "step"))
        .count();
    let closed = records
        .iter()
        .filter(|r| matches!(r, Record::SpanClose(_)))
        .count();
    (opened, closed, status)
}

#[cfg(unix)]
#[test]
fn a_killed_process_leaves_a_readable_trace_with_all_it_flushed() {
    if is_child() {
        return;
    }
    const STEPS: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let mut proc = child(
        "a_killed_process_leaves_a_readable_trace_with_all_it_flushed",
        "run",
        dir.path(),
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    // Wait for the child to say it has closed its first STEPS steps.
    let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
    let want = format!("closed step {}", STEPS - 1);
    loop {
        let line = lines
            .next()
            .expect("the child stopped before closing its steps")
            .unwrap();
        if line == want {
            break;
        }
    }
    // Then for the periodic flush (nothing asks for one) to bring them to the file. A
    // 1 ms step makes ~20 bytes of records; a chunk is written when it holds 64 KiB, so
    // without the periodic flush these steps would not reach the file for many seconds. The
    // deadline only keeps a broken writer from hanging the test.
    let path = only_trace(dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    let before_kill = loop {
        let (_, closed, _) = steps_in(&path);
        if closed >= STEPS {
            break closed;
        }
        assert!(
            Instant::now() < deadline,
            "{closed} of {STEPS} closed steps reached the file: no periodic flush"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    proc.kill().unwrap(); // SIGKILL: no handler, no flush
    proc.wait().unwrap();

    let (opened, closed, status) = steps_in(&path);
    assert!(matches!(status, TraceStatus::Cut { .. }), "{status:?}");
    // Everything the file held before the kill still reads back, and nothing is lost in the
    // middle: every step but the last few that were in flight was closed.
    assert!(closed >= before_kill, "{closed} < {before_kill}");
    assert!(
        opened >= closed && opened <= closed + 1,
        "{opened} opened, {closed} closed"
    );
}

#[test]
fn user_layers_share_the_subscriber_with_perfkit() {
    if is_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = child(
        "user_layers_share_the_subscriber_with_perfkit",
        "layers",
        dir.path(),
    )
    .status()
    .unwrap();
    assert!(status.success(), "the child's own checks failed");
    let (_, records, status) = common::read_all(&only_trace(dir.path()));
    assert!(status.is_complete());
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::SpanNew(s) if &*s.callsite.name == "step"))
        .count();
    assert_eq!(steps, 5);
}
