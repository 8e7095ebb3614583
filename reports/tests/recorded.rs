//! A real CPU run recorded by the profiler's `tracing` layer, then analysed.

use std::time::{Duration, Instant};

use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};
use tracing_subscriber::layer::SubscriberExt;

/// Burns CPU for `d` (sleeping would be as good for wall time, but this is a step loop).
fn busy(d: Duration) -> u64 {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    x
}

#[test]
fn recorded_cpu_run_is_analysed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("train.pktrace");
    let (layer, guard) = perfkit_profiler::Builder::new()
        .output(&path)
        .build_local()
        .expect("profiler session")
        .expect("output configured");
    let subscriber = tracing_subscriber::registry().with(layer);
    let mut sink = 0u64;
    tracing::subscriber::with_default(subscriber, || {
        for step in 0..12u64 {
            let _step = tracing::info_span!("step", step).entered();
            {
                let _d = tracing::info_span!("data").entered();
                sink ^= busy(Duration::from_micros(300));
            }
            {
                let _f = tracing::info_span!("forward").entered();
                sink ^= busy(Duration::from_micros(600));
            }
            {
                let _b = tracing::info_span!("backward").entered();
                sink ^= busy(Duration::from_micros(900));
            }
        }
    });
    drop(guard);
    assert_ne!(sink, 1, "keep the work");

    let a = analyze_path(&path, &AnalyzeOptions::default()).expect("analyze recorded trace");
    let p = &a.processes[0];
    assert!(p.complete, "the guard wrote the end record");
    assert_eq!(p.dropped_events, 0);
    assert_eq!(p.steps.duration.count, 12);
    assert_eq!(
        p.steps.series.iter().map(|s| s.index).collect::<Vec<_>>(),
        (0..12).collect::<Vec<_>>()
    );
    // Each step holds at least the 1.8 ms of work of its children.
    assert!(
        p.steps.duration.min_ns >= 1_800_000,
        "{:?}",
        p.steps.duration
    );
    let span = |n: &str| {
        p.spans
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("span {n}"))
    };
    for (name, at_least) in [
        ("data", 300_000u64),
        ("forward", 600_000),
        ("backward", 900_000),
    ] {
        assert_eq!(span(name).calls, 12);
        assert!(span(name).mean_ns >= at_least, "{name}: {:?}", span(name));
        assert_eq!(
            span(name).self_ns,
            span(name).total_ns,
            "leaf spans: self = total"
        );
    }
    let step = span("step");
    let children: u64 = ["data", "forward", "backward"]
        .iter()
        .map(|n| span(n).total_ns)
        .sum();
    assert_eq!(step.self_ns, step.total_ns - children);
    // No GPU work recorded: nothing invented.
    assert_eq!(
        (p.gpu.busy_ns, p.kernels.len(), p.copies.total.count),
        (0, 0, 0)
    );
    let folded: Vec<String> = p.stacks.iter().map(|s| s.frames.join(";")).collect();
    assert_eq!(
        folded,
        ["step", "step;backward", "step;data", "step;forward"]
    );

    let out = dir.path().join("out");
    let written =
        write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    assert_eq!(written.len(), 8);
    let md = std::fs::read_to_string(out.join("summary.md")).expect("md");
    assert!(md.contains("| backward | 12 |"), "{md}");
}
