//! Whole processes: a program that exits without dropping its guard still finishes its trace,
//! and a program killed with SIGKILL leaves a readable trace that ends shortly before the kill.
//!
//! The child processes are this test binary itself, re-run with `PERFKIT_TEST_CHILD` set.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use perfkit_profiler::model::{EndReason, Record};
use perfkit_profiler::{TRACE_ENV, TraceStatus};

const CHILD_ENV: &str = "PERFKIT_TEST_CHILD";

/// The child side: does nothing in a normal test run.
#[test]
fn child_process_body() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
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
    match mode.as_str() {
        "exit" => {
            for step in 0..10u64 {
                let _s = tracing::info_span!("step", step).entered();
            }
            // Leave without dropping the guard: the exit handler must finish the trace.
            std::mem::forget(guard);
            std::process::exit(0);
        }
        "run" => {
            eprintln!("child recording");
            for step in 0u64.. {
                let _s = tracing::info_span!("step", step).entered();
                std::thread::sleep(Duration::from_millis(1));
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

fn child(mode: &str, trace_dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_process_body",
        "--nocapture",
        "--test-threads",
        "1",
    ])
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
    let dir = tempfile::tempdir().unwrap();
    let out = child("fork", dir.path())
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
    // Waiting for a writer thread that does not run in the child took the 2 s timeout.
    assert!(ms < 1_000, "forked child took {ms} ms to exit");
    // The parent's trace is finished as usual.
    let (_, _, status) = common::read_all(&only_trace(dir.path()));
    assert!(matches!(status, TraceStatus::Complete(_)), "{status:?}");
}

#[test]
fn exiting_without_dropping_the_guard_still_finishes_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let status = child("exit", dir.path()).status().unwrap();
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

#[cfg(unix)]
#[test]
fn a_killed_process_leaves_a_readable_trace_up_to_shortly_before_the_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut proc = child("run", dir.path()).spawn().unwrap();
    // Wait until the child has written its header, then let it record for a while.
    let deadline = Instant::now() + Duration::from_secs(30);
    while perfkit_profiler::trace_files(dir.path()).map_or(true, |f| f.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "the child never started recording"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(600));
    let killed_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    proc.kill().unwrap(); // SIGKILL: no handler, no flush
    proc.wait().unwrap();

    let path = only_trace(dir.path());
    let (header, records, status) = common::read_all(&path);
    assert!(matches!(status, TraceStatus::Cut { .. }), "{status:?}");
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::SpanClose(_)))
        .count();
    assert!(steps > 50, "only {steps} steps recorded");
    let last = records.iter().filter_map(Record::ts).max().unwrap();
    let gap_ms = (killed_at.saturating_sub(header.start_unix_ns + last)) as f64 / 1e6;
    eprintln!("last record {gap_ms:.1} ms before the kill");
    // The writer flushes every 50 ms; the records of one 1 ms step are ~20 bytes, so without the
    // periodic flush nothing would reach the file for seconds (a chunk holds 64 KiB). The bound
    // is loose because the test machine may be busy.
    assert!(gap_ms < 500.0, "last record {gap_ms:.1} ms before the kill");
}

#[test]
fn user_layers_share_the_subscriber_with_perfkit() {
    let dir = tempfile::tempdir().unwrap();
    let status = child("layers", dir.path()).status().unwrap();
    assert!(status.success(), "the child's own checks failed");
    let (_, records, status) = common::read_all(&only_trace(dir.path()));
    assert!(status.is_complete());
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::SpanNew(s) if &*s.callsite.name == "step"))
        .count();
    assert_eq!(steps, 5);
}
