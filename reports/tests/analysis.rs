//! Analysis of synthetic traces (written with the profiler's trace writer; the GPU timings
//! come from a small simulator, not from a GPU).

mod synth;

use std::path::{Path, PathBuf};

use perfkit_reports::model::Direction;
use perfkit_reports::{AnalyzeOptions, analyze_path};
use synth::{Synth, Workload, trace_bytes, write_run};

const START: u64 = 1_700_000_000_000_000_000;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write trace");
    p
}

#[test]
fn tuned_trace_figures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "train.pktrace",
        &trace_bytes("train", 10, None, START, &Workload::tuned()),
    );
    let a = analyze_path(&p, &AnalyzeOptions::default()).expect("analyze");
    assert_eq!(a.processes.len(), 1);
    let pa = &a.processes[0];
    assert!(pa.complete);
    assert_eq!(pa.steps.duration.count, 20);
    assert_eq!(pa.steps.series.len(), 20);
    assert_eq!(
        pa.steps.series[3].index, 3,
        "step index from the `step` field"
    );
    // Span totals: the step span holds its children; self times add up to the step total.
    let span = |n: &str| pa.spans.iter().find(|s| s.name == n).expect(n).clone();
    let step = span("step");
    assert_eq!(step.calls, 20);
    let children: u64 = ["data", "forward", "backward", "optimizer"]
        .iter()
        .map(|n| span(n).total_ns)
        .sum();
    assert_eq!(step.self_ns, step.total_ns - children);
    // Kernels: late timings (every other forward kernel) are attributed too.
    let k = pa
        .kernels
        .iter()
        .find(|k| k.name == "gemm_fwd")
        .expect("gemm_fwd");
    assert_eq!(k.count, 20);
    assert!(k.min_ns >= 300_000 && k.max_ns < 310_000, "{k:?}");
    assert!(k.total_ns >= 20 * 300_000);
    // Copies: 20 pinned uploads of 8 MiB at the simulated 24 GB/s.
    let h2d = &pa.copies.by_kind[0];
    assert_eq!((h2d.direction, h2d.pinned), (Direction::H2D, Some(true)));
    assert_eq!(h2d.totals.count, 20);
    assert_eq!(h2d.totals.bytes, 20 * (8 << 20));
    assert!(
        (h2d.bandwidth_gbps - 24.0).abs() < 0.1,
        "{}",
        h2d.bandwidth_gbps
    );
    assert_eq!(pa.copies.by_site[0].location, "src/data.rs:31");
    // One final sync; memory peak is the 256 MiB buffer; device size from the device record.
    assert_eq!(pa.syncs.count, 1);
    assert_eq!(pa.memory.peak_bytes, 256 << 20);
    assert_eq!(pa.memory.device_total_bytes, 16 << 30);
    // GPU busy: parts of each step partition the step time.
    for s in &pa.steps.series {
        let b = &s.breakdown;
        assert_eq!(
            b.kernel_ns + b.copy_ns + b.sync_wait_ns + b.idle_ns,
            b.wall_ns
        );
    }
    assert!(
        pa.gpu.utilization_percent > 50.0,
        "tuned run keeps the GPU busy: {}",
        pa.gpu.utilization_percent
    );
    // GPU time attributed to the issuing stack.
    let fwd = pa
        .stacks
        .iter()
        .find(|s| s.frames == ["step", "forward"])
        .expect("step;forward");
    assert_eq!(fwd.gpu_ns, k.total_ns);
    // Timeline of chosen steps: a host thread track and two stream tracks.
    assert!(!a.timeline.windows.is_empty());
    let names: Vec<&str> = a.timeline.tracks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["thread main", "stream 7", "stream 9"]);
}

#[test]
fn anti_pattern_trace_figures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "train.pktrace",
        &trace_bytes("train", 11, None, START, &Workload::anti_patterns()),
    );
    let a = analyze_path(&p, &AnalyzeOptions::default()).expect("analyze");
    let pa = &a.processes[0];
    let h2d = pa
        .copies
        .by_kind
        .iter()
        .find(|c| c.direction == Direction::H2D)
        .expect("h2d");
    assert_eq!(h2d.pinned, Some(false));
    assert!(
        (h2d.bandwidth_gbps - 6.0).abs() < 0.1,
        "{}",
        h2d.bandwidth_gbps
    );
    let d2h = pa
        .copies
        .by_site
        .iter()
        .find(|c| c.direction == Direction::D2H)
        .expect("d2h");
    assert_eq!(
        (d2h.location.as_str(), d2h.totals.count, d2h.totals.bytes),
        ("src/train.rs:72", 20, 80)
    );
    assert_eq!(pa.syncs.count, 21);
    assert_eq!(pa.syncs.by_site[0].location, "src/train.rs:75");
    assert!(pa.syncs.blocked_ns > 0);
    assert_eq!(pa.memory.allocs, 21);
    assert_eq!(pa.memory.peak_bytes, (256 << 20) + (32 << 20));
    assert!(pa.steps.total.sync_blocked_ns > 0);
}

#[test]
fn ranks_are_aligned_and_the_straggler_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    for rank in 0..4u32 {
        let mut wl = Workload::tuned();
        wl.seed = u64::from(rank) + 3;
        if rank == 2 {
            wl.data_ns = 2_500_000; // slow data loading on one rank
        }
        let start = START + u64::from(rank) * 1_000_000;
        write(
            dir.path(),
            &format!("train-{rank}.pktrace"),
            &trace_bytes("train", 100 + rank, Some(rank), start, &wl),
        );
    }
    let a = analyze_path(dir.path(), &AnalyzeOptions::default()).expect("analyze");
    assert_eq!(a.processes.len(), 4);
    assert_eq!(
        a.processes[3].offset_ns, 3_000_000,
        "aligned on the wall clock"
    );
    let r = a.ranks.expect("rank comparison");
    assert_eq!(r.straggler, "rank 2");
    assert!(
        r.straggler_excess_percent > 50.0,
        "{}",
        r.straggler_excess_percent
    );
    assert_eq!(r.rows[2].slowest_in_steps, 20);
    // The timeline shows the chosen steps of rank 0 for every rank, on the common clock.
    let names: Vec<&str> = a.timeline.tracks.iter().map(|t| t.name.as_str()).collect();
    assert!(
        names.contains(&"rank 0 thread main") && names.contains(&"rank 3 stream 7"),
        "{names:?}"
    );
    let w = &a.timeline.windows[0];
    let rank3 = a
        .timeline
        .tracks
        .iter()
        .find(|t| t.name == "rank 3 thread main")
        .expect("rank 3 track");
    assert!(
        rank3
            .items
            .iter()
            .filter(|i| i.window == 0)
            .all(|i| i.start_ns + i.dur_ns >= w.start_ns && i.start_ns <= w.end_ns),
        "items overlap their window on the primary clock"
    );
}

#[test]
fn cut_and_corrupt_traces_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Synth::new(Vec::new(), "train", 12, None, START);
    let mut wl = Workload::tuned();
    wl.steps = 5;
    write_run(&mut s, &wl);
    s.enter(0, "step", Some(5));
    s.work(1_000);
    s.dropped(17);
    let bytes = s.finish(true);
    let p = write(dir.path(), "cut.pktrace", &bytes);
    let a = analyze_path(&p, &AnalyzeOptions::default()).expect("analyze cut trace");
    let pa = &a.processes[0];
    assert!(!pa.complete && !a.complete);
    assert_eq!(pa.dropped_events, 17);
    assert_eq!(pa.unclosed_spans, 1);
    assert_eq!(
        pa.steps.duration.count, 5,
        "the step still open at the end was cut short: not a step (as in the profiler's summary)"
    );

    let mut bad = bytes.clone();
    let at = bad.len() / 2;
    for b in &mut bad[at..at + 16] {
        *b ^= 0xA5;
    }
    let p = write(dir.path(), "bad.pktrace", &bad);
    let a = analyze_path(&p, &AnalyzeOptions::default())
        .expect("a damaged trace still reports what it read");
    let err = a.processes[0]
        .read_error
        .as_deref()
        .expect("read error recorded");
    assert!(err.contains("offset"), "{err}");

    let p = write(dir.path(), "not.pktrace", b"hello");
    let err = analyze_path(&p, &AnalyzeOptions::default()).expect_err("not a trace");
    assert!(err.to_string().contains("not.pktrace"), "{err}");
    let empty = tempfile::tempdir().expect("tempdir");
    let err = analyze_path(empty.path(), &AnalyzeOptions::default()).expect_err("no trace");
    assert!(err.to_string().contains("no perfkit trace found"), "{err}");
}

#[test]
fn long_runs_are_bucketed_but_keep_a_timeline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wl = Workload::tuned();
    wl.steps = 250;
    let p = write(
        dir.path(),
        "long.pktrace",
        &trace_bytes("train", 13, None, START, &wl),
    );
    let mut opts = AnalyzeOptions::default();
    opts.max_step_series = 100;
    let a = analyze_path(&p, &opts).expect("analyze");
    let steps = &a.processes[0].steps;
    assert_eq!(steps.duration.count, 250);
    assert_eq!(steps.series_bucket, 3);
    assert_eq!(steps.series.len(), 84);
    assert_eq!(
        steps.series[1].index, 3,
        "each entry starts at its bucket's first step"
    );
    assert_eq!(
        a.timeline.windows.len(),
        3,
        "windows chosen from the exact steps"
    );
    assert!(a.timeline.tracks.iter().all(|t| !t.items.is_empty()));
}

#[test]
fn auxiliary_sampler_traces_are_not_processes() {
    use perfkit_profiler::model::{DeviceMemory, Header, Record};
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "train-1.pktrace",
        &trace_bytes("train", 1, None, START + 5_000, &Workload::tuned()),
    );
    // A GPU sampler's trace starts first and holds only samples.
    let mut h = Header::new("perfkit-sampler", 2);
    h.start_unix_ns = START;
    h.extra.push((
        perfkit_profiler::summary::ROLE_KEY.to_owned(),
        "gpu-sampler".to_owned(),
    ));
    let mut w = perfkit_profiler::TraceWriter::new(Vec::new(), &h).expect("header");
    w.write(&Record::DeviceMemory(DeviceMemory {
        ts: 10,
        device: 0,
        used: 1 << 30,
        total: 16 << 30,
    }))
    .expect("record");
    write(dir.path(), "sampler.pktrace", &w.finish().expect("finish"));
    let a = analyze_path(dir.path(), &AnalyzeOptions::default()).expect("analyze");
    assert_eq!(a.processes.len(), 1);
    assert_eq!(a.processes[0].meta.pid, 1);
    assert!(
        !a.timeline.windows.is_empty(),
        "timeline of the program, not of the sampler"
    );
}

/// CUDA C++ kernels (cuBLAS, PyTorch's ATen) come out of CUPTI mangled; the analysis shows
/// them as `c++filt` would, and leaves plain C names alone.
#[test]
fn mangled_kernel_names_are_demangled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wl = Workload {
        kernels: [
            "_Z8gemm_fwdPKfS0_Pfiii",
            "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
            "adam_update",
        ],
        ..Workload::tuned()
    };
    let p = write(
        dir.path(),
        "train.pktrace",
        &trace_bytes("train", 3, None, START, &wl),
    );
    let a = analyze_path(&p, &AnalyzeOptions::default()).expect("analyze");
    let mut names: Vec<&str> = a.processes[0]
        .kernels
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "adam_update",
            "gemm_fwd(float const*, float const*, float*, int, int, int)",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, \
             at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, \
             at::detail::Array<char*, 1>)",
        ]
    );
}

/// A trace whose figures add up past `u64::MAX` (a damaged or hand-made one: two copies of
/// 2^63 bytes each): the sums saturate, never overflow (a panic in a debug build, a wrapped,
/// wrong total in a release build).
#[test]
fn sums_past_u64_max_saturate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Synth::new(Vec::new(), "train", 14, None, START);
    s.thread(0, "main");
    for step in 0..3 {
        s.enter(0, "step", Some(step));
        s.upload(0, 1 << 63, true, 7, 10);
        s.upload(0, 1 << 63, true, 7, 10);
        s.exit(0);
    }
    let p = write(dir.path(), "huge.pktrace", &s.finish(false));
    let a = analyze_path(&p, &AnalyzeOptions::default()).expect("analyze");
    let copies = &a.processes[0].copies;
    assert_eq!(copies.total.bytes, u64::MAX);
    assert_eq!(copies.total.count, 6);
    let findings =
        perfkit_reports::rules::evaluate(&a, &perfkit_reports::rules::ProfileConfig::default())
            .expect("evaluate");
    // And every report renders.
    let formats = perfkit_reports::render::Format::ALL;
    let options = perfkit_reports::render::RenderOptions::default();
    perfkit_reports::render::write_all(&a, &dir.path().join("out"), &formats, &findings, &options)
        .expect("render");
}
