//! On a GPU machine: the reference trainer (which records its own GPU work through
//! perfkit-profiler) run with the injection library as well, so one run yields both views, and
//! the injected view must count the same copies (and bytes), kernels and synchronizations.
//!
//! Needs the CUDA driver, a CUDA 13 libcupti (found by the usual search or PERFKIT_CUPTI_PATH)
//! and the trainer built: `cargo build -p perfkit-kernels --bin train`, then
//! `cargo test -p perfkit-inject --test gpu -- --ignored --nocapture`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use perfkit_inject::locate::{self, SearchEnv};
use perfkit_profiler::model::{GpuOpKind, Record};
use perfkit_profiler::{TraceReader, TraceStatus};

fn target_dir_file(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps, deps.parent().unwrap()] {
        let p = d.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{name} not found next to {}: build it first (cargo build -p perfkit-kernels --bin train)",
        exe.display()
    );
}

/// (count, bytes) of each GPU operation kind, and whether the trace ended cleanly.
fn tally(path: &Path) -> (BTreeMap<&'static str, (u64, u64)>, bool, u64) {
    let mut r = TraceReader::open(path).unwrap();
    let mut out: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let mut stacks = 0;
    for rec in r.by_ref() {
        match rec.unwrap() {
            Record::Gpu(g) => {
                let e = out.entry(g.kind.as_str()).or_default();
                e.0 += 1;
                e.1 += g.bytes;
            }
            Record::OpStack(_) => stacks += 1,
            _ => {}
        }
    }
    (out, matches!(r.status(), TraceStatus::Complete(_)), stacks)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn injected_view_of_the_reference_trainer_matches_its_own_instrumentation() {
    let train = target_dir_file("train");
    let inject = target_dir_file("libperfkit_inject.so");
    let report = locate::search(&SearchEnv::from_process());
    let cupti = report
        .found
        .clone()
        .unwrap_or_else(|| panic!("libcupti not found:\n{}", report.looked_lines()));
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(&train)
        .args(["--device", "cuda", "--steps", "50"])
        .env("PERFKIT_TRACE", t.path())
        .env("CUDA_INJECTION64_PATH", &inject)
        .env("PERFKIT_CUPTI_PATH", &cupti)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("perfkit-inject: recording CUDA activity"),
        "{stderr}"
    );

    let files = perfkit_profiler::trace_files(t.path()).unwrap();
    let (injected, own): (Vec<_>, Vec<_>) = files.iter().partition(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with("-inject.pktrace"))
    });
    assert_eq!((injected.len(), own.len()), (1, 1), "{files:?}");
    let (inj, inj_complete, op_stacks) = tally(injected[0]);
    let (mine, _, _) = tally(own[0]);
    eprintln!("own instrumentation: {mine:?}\ninjection:           {inj:?}");
    assert!(inj_complete, "the injected trace ends with an End record");
    for kind in [
        GpuOpKind::MemcpyHtoD,
        GpuOpKind::MemcpyDtoH,
        GpuOpKind::Kernel,
        GpuOpKind::Synchronize,
    ] {
        let k = kind.as_str();
        assert_eq!(
            inj.get(k),
            mine.get(k),
            "{k}: injection vs the trainer's own instrumentation"
        );
    }
    assert!(op_stacks > 0, "host call stacks are recorded");
}
