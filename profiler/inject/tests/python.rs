//! Python frames at CUDA-call time, tested from a real Python process without a GPU.
//!
//! `python3` runs `tests/support/python_step.py`, which loads the stand-in CUDA driver (whose
//! `cuInit` loads the injection library named by `CUDA_INJECTION64_PATH`, as the real driver
//! does) and plays API callbacks through the stand-in CUPTI from known lines of the script:
//! through `ctypes.PyDLL` (the GIL stays held) and through `ctypes.CDLL` (ctypes releases the
//! GIL around the call), and from a second Python thread. The trace is read back.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use perfkit_profiler::model::{GpuEvent, GpuOpKind, PyFrame, Record};
use perfkit_profiler::{TraceReader, TraceStatus};

const SUPPORT: &str = "tests/support";
#[path = "support/python_scenario.rs"]
mod python_scenario;
use python_scenario::{STEPS, site};

fn inject_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    [dir, dir.parent().unwrap()]
        .iter()
        .map(|d| d.join("libperfkit_inject.so"))
        .find(|p| p.is_file())
        .expect("libperfkit_inject.so built next to the tests")
}

/// Runs the script under injection; returns stderr and the records of its trace.
fn run_script(dir: &Path, extra_env: &[(&str, &str)]) -> (String, Vec<Record>) {
    let cupti = python_scenario::build_fakes(dir);
    let records = dir.join("records.bin");
    std::fs::write(&records, python_scenario::records_file()).unwrap();
    let trace = dir.join("trace");
    let mut cmd = Command::new("python3");
    cmd.arg(python_scenario::script())
        .arg(&records)
        .arg(STEPS.to_string())
        .env("CUDA_INJECTION64_PATH", inject_library())
        .env("PERFKIT_CUPTI_PATH", &cupti)
        .env("PERFKIT_TRACE", &trace)
        .env("LD_LIBRARY_PATH", dir)
        .env_remove("PERFKIT_INJECT_PYTHON_DEPTH")
        .env_remove("PERFKIT_INJECT_STACKS");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("python3 to run the script");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "python3 failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("python_step: {STEPS} steps played")),
        "{stdout}"
    );
    let files = perfkit_profiler::trace_files(&trace).unwrap();
    assert_eq!(files.len(), 1, "{files:?}\n{stderr}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("python3-"), "{name}");
    let mut r = TraceReader::open(&files[0]).unwrap();
    assert_eq!(r.header().format_minor, 1);
    let recs: Vec<Record> = r.by_ref().map(|x| x.unwrap()).collect();
    assert!(matches!(r.status(), TraceStatus::Complete(_)), "{stderr}");
    (stderr, recs)
}

/// Each GPU operation with its Python frames: None when none were linked, Some(None) when the
/// thread did not hold the GIL.
fn ops_with_frames(recs: &[Record]) -> Vec<(GpuEvent, Option<Option<Vec<PyFrame>>>)> {
    let mut stacks: HashMap<u64, Vec<PyFrame>> = HashMap::new();
    let mut links: HashMap<u64, Option<u64>> = HashMap::new();
    let mut out = Vec::new();
    for r in recs {
        match r {
            Record::PyStack(p) => {
                stacks.insert(p.id, p.frames.clone());
            }
            Record::OpPyStack(o) => {
                links.insert(o.op, o.stack);
            }
            Record::Gpu(g) => {
                // Written before the operation, so a streaming reader knows it.
                let link = links.remove(&g.id);
                let frames = link.map(|s| s.map(|id| stacks[&id].clone()));
                out.push((g.clone(), frames));
            }
            _ => {}
        }
    }
    out
}

fn script_frame(f: &PyFrame) -> bool {
    f.file.ends_with("python_step.py")
}

#[test]
fn each_call_carries_the_python_frames_of_the_thread_that_issued_it() {
    let t = tempfile::tempdir().unwrap();
    let (stderr, recs) = run_script(t.path(), &[]);
    assert!(
        stderr.contains("perfkit-inject: recording CUDA activity"),
        "{stderr}"
    );
    // Nothing dropped, and the exit statistics recorded (from a thread of their own: the
    // exiting Python thread's thread-locals are gone by then).
    let dropped: Vec<&Record> = recs
        .iter()
        .filter(|r| matches!(r, Record::Dropped(_)))
        .collect();
    assert!(dropped.is_empty(), "{dropped:?}");
    let stats = recs.iter().find_map(|r| match r {
        Record::Event(e) if &*e.callsite.name == "perfkit.inject_stats" => Some(e),
        _ => None,
    });
    let stats = stats.expect("perfkit.inject_stats recorded at exit");
    let field = |name: &str| {
        stats
            .fields
            .iter()
            .find(|f| &*f.name == name)
            .and_then(|f| f.value.as_u64())
    };
    assert_eq!(field("python_frames"), Some(u64::from(STEPS) * 5 + 1));
    assert_eq!(field("python_no_gil"), Some(u64::from(STEPS)));
    let ops = ops_with_frames(&recs);
    // Per step: upload, two kernels, readback, two syncs; and the second thread's copy.
    assert_eq!(ops.len(), STEPS as usize * 6 + 1, "{ops:#?}");
    assert!(
        ops.iter()
            .all(|(g, _)| g.kind == GpuOpKind::Synchronize || g.gpu_start.is_some()),
        "GPU times on the trace clock: {ops:#?}"
    );

    let innermost = |(g, frames): &(GpuEvent, Option<Option<Vec<PyFrame>>>)| {
        let frames = frames
            .as_ref()
            .unwrap_or_else(|| panic!("no Python link for {g:?}"))
            .as_ref()
            .unwrap_or_else(|| panic!("no frames for {g:?}"));
        (frames[0].clone(), frames.clone())
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for op in &ops {
        let (g, frames) = op;
        let name = match (g.kind, g.bytes) {
            (GpuOpKind::MemcpyHtoD, _) => "upload",
            (GpuOpKind::Kernel, _) if frames_start_in(frames, "step") => "update",
            (GpuOpKind::Kernel, _) => "launch",
            (GpuOpKind::MemcpyDtoH, _) if frames_start_in(frames, "background_copy") => "thread",
            (GpuOpKind::MemcpyDtoH, _) => "readback",
            (GpuOpKind::Synchronize, _) if matches!(frames, Some(None)) => "released",
            (GpuOpKind::Synchronize, _) => "sync",
            other => panic!("unexpected operation {other:?}"),
        };
        *seen.entry(name).or_default() += 1;
        if name == "released" {
            // ctypes.CDLL released the GIL: no frames, and the operation says so.
            continue;
        }
        let (inner, all) = innermost(op);
        assert_eq!(inner.line, site(name), "{name}: {all:#?}");
        if name == "update" {
            // Inside the optimizer module, called from the script's step.
            assert!(inner.file.ends_with("optim/sgd.py"), "{all:#?}");
            assert_eq!(&*all[1].function, "train_step");
            assert_eq!(all[1].line, site("optimizer"));
            assert_eq!(&*all[2].function, "main");
            assert_eq!(all.len(), 4, "{all:#?}");
            continue;
        }
        assert!(script_frame(&inner), "{name}: {all:#?}");
        if name == "thread" {
            assert_eq!(&*inner.function, "background_copy", "{all:#?}");
            // The thread's own stack: its target, then threading's bootstrap; not main's.
            assert!(
                all.iter().any(|f| f.file.ends_with("threading.py")),
                "{all:#?}"
            );
            assert!(!all.iter().any(|f| &*f.function == "main"), "{all:#?}");
        } else {
            // train_step, called from main's loop line, called from the module's top level.
            assert_eq!(&*inner.function, "train_step", "{all:#?}");
            assert_eq!(&*all[1].function, "main");
            assert_eq!(all[1].line, site("loop"));
            assert!(script_frame(&all[1]));
            assert_eq!(&*all[2].function, "<module>");
            assert_eq!(all.len(), 3, "{all:#?}");
        }
    }
    for (name, n) in [
        ("upload", STEPS),
        ("launch", STEPS),
        ("update", STEPS),
        ("readback", STEPS),
        ("released", STEPS),
        ("sync", STEPS),
        ("thread", 1),
    ] {
        assert_eq!(
            seen.get(name).copied(),
            Some(n as usize),
            "{name}: {seen:?}"
        );
    }
    // Each distinct stack is written once: every step's calls share them.
    let py_stacks = recs
        .iter()
        .filter(|r| matches!(r, Record::PyStack(_)))
        .count();
    assert_eq!(
        py_stacks, 6,
        "upload, launch, update, readback, sync, thread"
    );
    assert!(
        stderr.contains(&format!(
            "Python frames read at {} calls; {} calls were made without the GIL held",
            STEPS * 5 + 1,
            STEPS
        )),
        "{stderr}"
    );
}

/// Whether an operation's innermost Python frame is in the function `function`.
fn frames_start_in(frames: &Option<Option<Vec<PyFrame>>>, function: &str) -> bool {
    matches!(frames, Some(Some(f)) if f.first().is_some_and(|f| &*f.function == function))
}

#[test]
fn python_frames_can_be_limited_or_turned_off() {
    let t = tempfile::tempdir().unwrap();
    let (_, recs) = run_script(t.path(), &[("PERFKIT_INJECT_PYTHON_DEPTH", "1")]);
    for (g, frames) in ops_with_frames(&recs) {
        if let Some(Some(f)) = frames {
            assert_eq!(f.len(), 1, "{g:?}: {f:#?}");
        }
    }
    let t = tempfile::tempdir().unwrap();
    let (stderr, recs) = run_script(t.path(), &[("PERFKIT_INJECT_PYTHON_DEPTH", "0")]);
    assert!(
        !recs
            .iter()
            .any(|r| matches!(r, Record::PyStack(_) | Record::OpPyStack(_))),
        "no Python records when turned off"
    );
    assert!(!stderr.contains("Python frames read"), "{stderr}");
    // The operations themselves are all there.
    let gpu = recs.iter().filter(|r| matches!(r, Record::Gpu(_))).count();
    assert_eq!(gpu, STEPS as usize * 6 + 1);
}
