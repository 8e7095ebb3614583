//! GPU operations that carry the Python frames of the thread that issued them (trace format
//! 1.1, written by the injection library in a Python program): runtime findings point at the
//! program's own line, a lint finding on that line is confirmed, flamegraphs show the frames.
//! The trace is written with the profiler's `TraceWriter`.

use std::sync::Arc;

use perfkit_profiler::TraceWriter;
use perfkit_profiler::model::*;
use perfkit_reports::flame::{self, FlameKind};
use perfkit_reports::rules::{self, ProfileConfig};
use perfkit_reports::{AnalyzeOptions, Finding, Severity, analyze_path};

const STEPS: u64 = 10;
const STEP_NS: u64 = 1_000_000;

fn frame(file: &str, function: &str, line: u32) -> PyFrame {
    PyFrame {
        file: Arc::from(file),
        function: Arc::from(function),
        line,
    }
}

fn gpu(kind: GpuOpKind, id: u64, start: u64, host_ns: u64, bytes: u64) -> GpuEvent {
    GpuEvent {
        thread: 0,
        kind,
        id,
        device: 0,
        stream: Some(7),
        bytes,
        host_memory: matches!(kind, GpuOpKind::MemcpyDtoH | GpuOpKind::MemcpyHtoD)
            .then_some(HostMemory::Pageable),
        host_start: start,
        host_end: start + host_ns,
        gpu_start: (kind != GpuOpKind::Synchronize).then_some(start + 1_000),
        gpu_end: (kind != GpuOpKind::Synchronize).then_some(start + 100_000),
        gpu_end_at_host_return: false,
        span: None,
        location: None,
        kernel: None,
    }
}

/// A Python training loop seen through injection: `STEPS` step spans; in each, a kernel and a
/// small readback whose innermost frame is in an installed package (`torch/_tensor.py`) and
/// whose caller is `train.py:42`, and a synchronization made without the GIL held. With
/// `optimizer`, the kernel is launched inside an optimizer's `step`.
fn trace(optimizer: bool) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &Header::new("python3", 7)).expect("header");
    let step = Arc::new(Callsite::new("step", "train", CallsiteKind::Span, &[]));
    let mut records = vec![
        Record::Thread(ThreadInfo::new(0, 1, Some("MainThread"))),
        Record::PyStack(PyStackInfo {
            id: 1,
            frames: vec![
                frame(
                    "/venv/lib/python3.12/site-packages/torch/_tensor.py",
                    "item",
                    1000,
                ),
                frame("train.py", "train_step", 42),
                frame("train.py", "main", 60),
            ],
        }),
        Record::PyStack(PyStackInfo {
            id: 2,
            frames: optimizer
                .then(|| {
                    frame(
                        "/venv/lib/python3.12/site-packages/torch/optim/sgd.py",
                        "step",
                        9,
                    )
                })
                .into_iter()
                .chain([
                    frame("train.py", "train_step", 40),
                    frame("train.py", "main", 60),
                ])
                .collect(),
        }),
    ];
    let mut id = 0;
    for s in 0..STEPS {
        let t0 = 1_000_000 + s * STEP_NS;
        let span = SpanId(s + 1);
        let edge = |ts| SpanEdge {
            thread: 0,
            ts,
            span,
        };
        records.push(Record::SpanNew(SpanNew {
            thread: 0,
            ts: t0,
            id: span,
            parent: None,
            callsite: step.clone(),
            fields: vec![],
        }));
        records.push(Record::SpanEnter(edge(t0)));
        for (kind, stack, at, host_ns, bytes) in [
            (GpuOpKind::Kernel, Some(2), 10_000, 5_000, 0),
            (GpuOpKind::MemcpyDtoH, Some(1), 100_000, 400_000, 4),
            (GpuOpKind::Synchronize, None, 600_000, 300_000, 0),
        ] {
            id += 1;
            records.push(Record::OpPyStack(OpPyStack { op: id, stack }));
            records.push(Record::Gpu(gpu(kind, id, t0 + at, host_ns, bytes)));
        }
        records.push(Record::SpanExit(edge(t0 + STEP_NS - 1)));
        records.push(Record::SpanClose(edge(t0 + STEP_NS - 1)));
    }
    for r in &records {
        w.write(r).expect("record");
    }
    w.finish().expect("finish")
}

fn lint(code: &str, location: &str) -> Finding {
    Finding {
        code: code.to_owned(),
        name: "host-readback-in-step-loop".to_owned(),
        severity: Severity::Warning,
        message: "m".to_owned(),
        help: "h".to_owned(),
        location: Some(location.to_owned()),
        origin: "lint".to_owned(),
        confirmed: false,
        cost_per_step_ns: None,
        share_of_step_percent: None,
        bytes: None,
        count: None,
    }
}

#[test]
fn python_frames_locate_findings_confirm_lint_and_fill_flamegraphs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("python3-7-inject.pktrace");
    std::fs::write(&path, trace(false)).expect("write trace");
    let analysis = analyze_path(&path, &AnalyzeOptions::default()).expect("analyse");
    let runtime = rules::evaluate(&analysis, &ProfileConfig::default()).expect("evaluate");

    // The readback is located at the program's line, not inside torch.
    let pk101: Vec<&Finding> = runtime.iter().filter(|f| f.code == "PK101").collect();
    assert_eq!(pk101.len(), 1, "{runtime:#?}");
    assert_eq!(pk101[0].location.as_deref(), Some("train.py:42"));
    // The synchronization was made without the GIL: no Python line to point at.
    let pk102: Vec<&Finding> = runtime.iter().filter(|f| f.code == "PK102").collect();
    assert!(
        pk102
            .iter()
            .all(|f| f.location.as_deref() != Some("train.py:42")),
        "{pk102:#?}"
    );

    // A lint finding on that line (the linter's path is relative to where it ran) is confirmed.
    let merged = rules::confirm(
        vec![
            lint("PK101", "./train.py:42:19"),
            lint("PK101", "train.py:43:19"),
        ],
        runtime,
    );
    assert!(merged[0].confirmed, "{merged:#?}");
    assert_eq!(merged[0].location.as_deref(), Some("./train.py:42:19"));
    assert_eq!(merged[0].count, Some(STEPS));
    assert!(!merged[1].confirmed);

    // GPU flamegraph: step span, then the Python frames outermost first.
    let folded = flame::folded(&analysis.processes, FlameKind::Gpu);
    let keys: Vec<&String> = folded.keys().collect();
    assert!(
        keys.iter().any(|k| k.as_str()
            == "step;main (train.py:60);train_step (train.py:42);item (torch/_tensor.py:1000)"),
        "{keys:#?}"
    );
    assert!(
        keys.iter()
            .any(|k| k.as_str() == "step;main (train.py:60);train_step (train.py:40)"),
        "{keys:#?}"
    );
    // Each readback's GPU time (99 us) is attributed to its Python stack.
    let readback = folded
        .iter()
        .find(|(k, _)| k.ends_with("item (torch/_tensor.py:1000)"))
        .map(|(_, v)| *v);
    assert_eq!(readback, Some(STEPS * 99_000));
}

#[test]
fn library_frames_are_skipped_for_the_callers_line() {
    use perfkit_reports::source::{python_caller, python_library_file};
    for lib in [
        "/usr/lib/python3.12/threading.py",
        "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
        "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
        "<frozen importlib._bootstrap>",
        "C:\\Python312\\Lib\\python3.12\\x.py",
    ] {
        assert!(python_library_file(lib), "{lib}");
    }
    for own in [
        "train.py",
        "/home/me/project/lib/data.py",
        "/home/me/python/train.py",
        "/srv/libpython/train.py",
    ] {
        assert!(!python_library_file(own), "{own}");
    }
    let frames = [
        frame("/usr/lib/python3.12/threading.py", "run", 1),
        frame("/home/me/project/lib/data.py", "load", 2),
    ];
    assert_eq!(python_caller(&frames).map(|f| f.line), Some(2));
    // Only library frames: the innermost stands for the operation.
    assert_eq!(python_caller(&frames[..1]).map(|f| f.line), Some(1));
    assert_eq!(python_caller(&[]), None);
}

/// A Python loop captured through injection has no step spans: its steps are inferred from the
/// optimizer steps in the Python frames (each `step` of an optimizer module ends one).
fn stepless_trace(iterations: u64) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &Header::new("python3", 8)).expect("header");
    let mut records = vec![Record::Thread(ThreadInfo::new(0, 1, Some("MainThread")))];
    let stacks: [(u64, Vec<PyFrame>); 3] = [
        (1, vec![frame("train.py", "main", 40)]),
        (
            2,
            vec![
                frame(
                    "/venv/lib/python3.12/site-packages/torch/optim/sgd.py",
                    "_single_tensor_sgd",
                    300,
                ),
                frame(
                    "/venv/lib/python3.12/site-packages/torch/optim/sgd.py",
                    "step",
                    120,
                ),
                frame("train.py", "main", 44),
            ],
        ),
        (3, vec![frame("train.py", "main", 46)]),
    ];
    for (id, frames) in stacks {
        records.push(Record::PyStack(PyStackInfo { id, frames }));
    }
    let mut id = 0;
    for i in 0..iterations {
        let t0 = 1_000_000 + i * STEP_NS;
        for (kind, stack, at, host_ns, bytes) in [
            (GpuOpKind::Kernel, 1, 10_000, 5_000, 0),
            (GpuOpKind::Kernel, 2, 100_000, 5_000, 0),
            (GpuOpKind::Kernel, 2, 110_000, 5_000, 0),
            (GpuOpKind::MemcpyDtoH, 3, 200_000, 400_000, 4),
        ] {
            id += 1;
            records.push(Record::OpPyStack(OpPyStack {
                op: id,
                stack: Some(stack),
            }));
            records.push(Record::Gpu(gpu(kind, id, t0 + at, host_ns, bytes)));
        }
    }
    for r in &records {
        w.write(r).expect("record");
    }
    w.finish().expect("finish")
}

#[test]
fn steps_of_a_python_trace_without_step_spans_come_from_optimizer_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("python3-8-inject.pktrace");
    std::fs::write(&path, stepless_trace(10)).expect("write trace");
    let analysis = analyze_path(&path, &AnalyzeOptions::default()).expect("analyse");
    let steps = &analysis.processes[0].steps.duration;
    // Ten optimizer steps: nine complete steps between them (the last is still open at the end).
    assert_eq!(steps.count, 9, "{steps:#?}");
    assert_eq!(
        steps.median_ns, STEP_NS,
        "from one optimizer step's end to the next"
    );
    let runtime = rules::evaluate(&analysis, &ProfileConfig::default()).expect("evaluate");
    let pk101: Vec<&Finding> = runtime.iter().filter(|f| f.code == "PK101").collect();
    assert_eq!(pk101.len(), 1, "{runtime:#?}");
    assert_eq!(pk101[0].location.as_deref(), Some("train.py:46"));
    assert!(
        pk101[0].message.contains("in 9 of 9 steps"),
        "{}",
        pk101[0].message
    );
}

#[test]
fn step_spans_of_the_trace_win_over_inferred_steps() {
    // The trace of the first test, its kernels launched inside an optimizer step: it still
    // counts its own ten step spans, not steps inferred from the optimizer.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("python3-7-inject.pktrace");
    std::fs::write(&path, trace(true)).expect("write trace");
    let analysis = analyze_path(&path, &AnalyzeOptions::default()).expect("analyse");
    assert_eq!(analysis.processes[0].steps.duration.count, STEPS);
    use perfkit_reports::source::python_optimizer_step;
    assert!(python_optimizer_step(&frame(
        "/x/site-packages/torch/optim/adamw.py",
        "step",
        1
    )));
    assert!(python_optimizer_step(&frame(
        "/x/site-packages/transformers/optimization.py",
        "step",
        1
    )));
    assert!(!python_optimizer_step(&frame("train.py", "step", 1)));
    assert!(!python_optimizer_step(&frame(
        "/x/site-packages/torch/optim/optimizer.py",
        "zero_grad",
        1
    )));
}
