//! On a GPU machine: the reference trainer (which records its own GPU work through
//! perfkit-profiler) run with the injection library as well, so one run yields both views, and
//! the two must agree where they see the same thing: copies (and bytes), the kernels of the
//! trainer's own module (by name), and the synchronizations the trainer asks for. The injected
//! view sees more than the trainer's calls: cuBLAS may launch several kernels per gemm
//! (split-K), and cudarc waits on events of its own; those are bounded from below only.
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

/// What one trace holds.
#[derive(Debug, Default)]
struct Tally {
    /// (count, bytes) of each GPU operation kind.
    kinds: BTreeMap<&'static str, (u64, u64)>,
    /// Kernels by name.
    kernels: BTreeMap<String, u64>,
    /// Synchronizations of a stream, and those of no stream (event or context).
    stream_syncs: u64,
    other_syncs: u64,
    complete: bool,
    op_stacks: u64,
}

fn tally(path: &Path) -> Tally {
    let mut r = TraceReader::open(path).unwrap();
    let mut t = Tally::default();
    for rec in r.by_ref() {
        match rec.unwrap() {
            Record::Gpu(g) => {
                let e = t.kinds.entry(g.kind.as_str()).or_default();
                e.0 += 1;
                e.1 += g.bytes;
                if let Some(k) = &g.kernel {
                    *t.kernels.entry(k.name.to_string()).or_default() += 1;
                }
                if g.kind == GpuOpKind::Synchronize {
                    if g.stream.is_some() {
                        t.stream_syncs += 1;
                    } else {
                        t.other_syncs += 1;
                    }
                }
            }
            Record::OpStack(_) => t.op_stacks += 1,
            _ => {}
        }
    }
    t.complete = matches!(r.status(), TraceStatus::Complete(_));
    t
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
    let inj = tally(injected[0]);
    let mine = tally(own[0]);
    eprintln!("own instrumentation: {mine:?}\ninjection:           {inj:?}");
    assert!(inj.complete, "the injected trace ends with an End record");
    for kind in [GpuOpKind::MemcpyHtoD, GpuOpKind::MemcpyDtoH] {
        let k = kind.as_str();
        assert_eq!(
            inj.kinds.get(k),
            mine.kinds.get(k),
            "{k}: injection vs the trainer's own instrumentation"
        );
    }
    // The kernels of the trainer's own module: one launch, one kernel, same name.
    for name in perfkit_kernels::nvrtc::KERNEL_NAMES {
        assert_eq!(
            inj.kernels.get(name),
            mine.kernels.get(name),
            "kernel {name}: injection vs the trainer's own instrumentation"
        );
        assert!(mine.kernels.contains_key(name), "{name} never ran");
    }
    // cuBLAS: at least one kernel per gemm the trainer issued.
    let own_module = |n: &String| perfkit_kernels::nvrtc::KERNEL_NAMES.contains(&n.as_str());
    let count = |t: &Tally, blas: bool| -> u64 {
        t.kernels
            .iter()
            .filter(|(n, _)| own_module(n) != blas)
            .map(|(_, c)| c)
            .sum()
    };
    assert!(
        count(&inj, true) >= count(&mine, true) && count(&mine, true) > 0,
        "cuBLAS kernels: injected {} < gemm calls {}",
        count(&inj, true),
        count(&mine, true)
    );
    // Synchronizations: every one the trainer recorded is seen by CUPTI (stream syncs as
    // stream syncs, its event waits as event syncs); CUPTI also sees cudarc's own.
    assert!(mine.stream_syncs > 0 && mine.other_syncs > 0, "{mine:?}");
    assert!(
        inj.stream_syncs >= mine.stream_syncs,
        "stream syncs: {inj:?} vs {mine:?}"
    );
    assert!(
        inj.other_syncs >= mine.other_syncs,
        "event syncs: {inj:?} vs {mine:?}"
    );
    assert!(inj.op_stacks > 0, "host call stacks are recorded");
}
