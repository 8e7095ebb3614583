//! A real CPU run recorded by the profiler's `tracing` layer, then analysed.

use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};
use tracing_subscriber::layer::SubscriberExt;

/// A fixed amount of CPU work (`n` rounds), whatever time it takes on this machine.
fn busy(n: u64) -> u64 {
    let mut x = 0u64;
    for _ in 0..n {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
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
                sink ^= busy(30_000);
            }
            {
                let _f = tracing::info_span!("forward").entered();
                sink ^= busy(60_000);
            }
            {
                let _b = tracing::info_span!("backward").entered();
                sink ^= busy(90_000);
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
    // What was recorded adds up (durations depend on the machine, so none is bounded): the
    // steps' series sums to their total, and the step spans hold their children's time.
    let series_total: u64 = p.steps.series.iter().map(|s| s.breakdown.wall_ns).sum();
    assert_eq!(p.steps.total.wall_ns, series_total);
    assert!(p.steps.duration.min_ns > 0, "{:?}", p.steps.duration);
    let span = |n: &str| {
        p.spans
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("span {n}"))
    };
    for name in ["data", "forward", "backward"] {
        assert_eq!(span(name).calls, 12);
        assert!(span(name).total_ns > 0, "{name}: {:?}", span(name));
        assert_eq!(span(name).mean_ns, span(name).total_ns / 12, "{name}");
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
    assert!(step.total_ns >= children, "{step:?}: children {children}");
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
    // A recorded run is not called synthetic anywhere.
    assert!(!a.is_synthetic());
    for name in ["summary.md", "summary.json", "report.html"] {
        let text = std::fs::read_to_string(out.join(name)).expect("output");
        assert!(!text.contains("simulated GPU timings"), "{name}");
    }
    let terminal = perfkit_reports::summary::terminal_table(&a, 5);
    assert!(!terminal.contains("simulated GPU timings"), "{terminal}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("json"))
            .expect("json");
    assert!(json["analysis"].get("timings").is_none(), "{json}");
}
