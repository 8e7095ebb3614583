//! The built injection library, loaded by a separate process the way the CUDA driver loads it
//! (dlopen + `InitializeInjection`), in the situations that need no GPU: it must return 1,
//! explain why it does not record, and never crash its host process.

use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "PERFKIT_INJECT_TEST_CHILD";

/// `libperfkit_inject.so` next to this test executable (cargo builds the cdylib there).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    for d in [dir, dir.parent().unwrap()] {
        let p = d.join("libperfkit_inject.so");
        if p.is_file() {
            return p;
        }
    }
    panic!("libperfkit_inject.so not built next to {}", exe.display());
}

/// In the child: load the library and call its entry point twice.
fn child_main() {
    let path = std::env::var_os("PERFKIT_INJECT_TEST_LIB").unwrap();
    // SAFETY: loading the injection library; its initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    // SAFETY: the exported signature `int InitializeInjection(void)`.
    let init =
        unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"InitializeInjection\0") }.unwrap();
    // SAFETY: as the driver calls it.
    let first = unsafe { init() };
    // SAFETY: a second call must be harmless.
    let second = unsafe { init() };
    println!("returned {first} {second}");
    std::mem::forget(lib);
}

fn run_child(test: &str, env: &[(&str, &Path)], unset: &[&str]) -> (String, String, bool) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("PERFKIT_INJECT_TEST_LIB", library());
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn without_a_trace_destination_it_explains_and_returns_1() {
    if std::env::var_os(CHILD).is_some() {
        return child_main();
    }
    let (out, err, ok) = run_child(
        "without_a_trace_destination_it_explains_and_returns_1",
        &[],
        &["PERFKIT_TRACE"],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("returned 1 1"), "{out}");
    assert!(
        err.contains("perfkit-inject: not recording: PERFKIT_TRACE is not set"),
        "{err}"
    );
    assert_eq!(
        err.matches("perfkit-inject:").count(),
        1,
        "second call is silent: {err}"
    );
}

#[test]
fn a_missing_libcupti_is_named_and_nothing_is_written() {
    if std::env::var_os(CHILD).is_some() {
        return child_main();
    }
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("trace");
    let missing = t.path().join("no/libcupti.so.13");
    let (out, err, ok) = run_child(
        "a_missing_libcupti_is_named_and_nothing_is_written",
        &[("PERFKIT_TRACE", &trace), ("PERFKIT_CUPTI_PATH", &missing)],
        &[],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("returned 1 1"), "{out}");
    assert!(err.contains("not recording: cannot load"), "{err}");
    assert!(err.contains("no/libcupti.so.13"), "{err}");
    assert!(
        !trace.exists(),
        "no trace is started before CUPTI is usable"
    );
}

#[test]
fn a_library_that_is_not_cupti_is_refused() {
    if std::env::var_os(CHILD).is_some() {
        return child_main();
    }
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("trace");
    // A real shared library without CUPTI's symbols: the C library itself.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
        "/usr/lib/libc.so.6",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.is_file())
    .expect("a libc.so.6");
    let (out, err, ok) = run_child(
        "a_library_that_is_not_cupti_is_refused",
        &[("PERFKIT_TRACE", &trace), ("PERFKIT_CUPTI_PATH", libc)],
        &[],
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("returned 1 1"), "{out}");
    assert!(err.contains("perfkit-inject: not recording:"), "{err}");
    assert!(!trace.exists());
}
