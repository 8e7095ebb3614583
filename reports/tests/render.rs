//! Every output format, written for synthetic traces (GPU timings from a simulator).

mod synth;

use std::path::{Path, PathBuf};

use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};
use serde_json::Value;
use synth::{Workload, trace_bytes};

const START: u64 = 1_700_000_000_000_000_000;

fn run_dir(dir: &Path, wl: &Workload, ranks: u32) -> PathBuf {
    for rank in 0..ranks {
        let bytes = trace_bytes(
            "train",
            40 + rank,
            (ranks > 1).then_some(rank),
            START + u64::from(rank) * 500_000,
            wl,
        );
        std::fs::write(dir.join(format!("train-{rank}.pktrace")), bytes).expect("write");
    }
    dir.to_path_buf()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn writes_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = run_dir(dir.path(), &Workload::tuned(), 1);
    let out = dir.path().join("out");
    let a = analyze_path(&input, &AnalyzeOptions::default()).expect("analyze");
    let written =
        write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    let names: Vec<String> = written
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "summary.json",
            "summary.md",
            "stacks-host.folded",
            "stacks-gpu.folded",
            "flamegraph-host.svg",
            "flamegraph-gpu.svg",
            "trace.chrome.json",
            "report.html"
        ]
    );
    // `perfkit report --out` checks exactly these names before it writes.
    let listed: Vec<&str> = perfkit_reports::render::Format::ALL
        .iter()
        .flat_map(|f| f.files())
        .copied()
        .collect();
    assert_eq!(names, listed);
    // `perfkit profile --force` replaces exactly these names, and no others.
    #[cfg(unix)]
    assert_eq!(names, perfkit_profiler::launch::REPORT_FILES);
    // The flamegraphs are inferno SVGs naming the spans.
    let svg = read(&out.join("flamegraph-gpu.svg"));
    assert!(
        svg.contains("<svg") && svg.contains("forward"),
        "GPU flamegraph shows the issuing span"
    );
    // summary.json round-trips through the reader.
    let s = perfkit_reports::Summary::load(&out.join("summary.json")).expect("summary reads back");
    assert_eq!(s.processes()[0].steps.duration.count, 20);
    // One set of figures: the core's step statistics and the analysis agree.
    assert_eq!(s.core.steps.count, 20);
    assert_eq!(
        s.core.steps.median_ns,
        Some(s.processes()[0].steps.duration.median_ns)
    );
    assert_eq!(
        s.core.steps.p95_ns,
        Some(s.processes()[0].steps.duration.p95_ns)
    );
    let core_fwd = s
        .core
        .spans
        .iter()
        .find(|x| x.name == "forward")
        .expect("core span");
    let fwd = s.processes()[0]
        .spans
        .iter()
        .find(|x| x.name == "forward")
        .expect("span");
    assert_eq!(
        (core_fwd.calls, core_fwd.total_ns, core_fwd.self_ns),
        (fwd.calls, fwd.total_ns, fwd.self_ns)
    );
    // The HTML is one self-contained file.
    let html = read(&out.join("report.html"));
    assert!(html.contains("http-equiv=\"Content-Security-Policy\""));
    assert!(html.contains("default-src 'none'"));
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no outside loads"
    );
}

#[test]
fn chrome_trace_has_processes_threads_streams_and_flows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = run_dir(dir.path(), &Workload::anti_patterns(), 2);
    let a = analyze_path(&input, &AnalyzeOptions::default()).expect("analyze");
    let out = dir.path().join("out");
    write_all(&a, &out, &[Format::Chrome], &[], &RenderOptions::default()).expect("render");
    let v: Value = serde_json::from_str(&read(&out.join("trace.chrome.json"))).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let meta = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == name)
            .count()
    };
    assert_eq!(meta("process_name"), 2, "a process per rank");
    let threads: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(
        threads.contains(&"main") && threads.contains(&"CUDA stream 7"),
        "{threads:?}"
    );
    // Spans are complete events: 5 per step, 20 steps, 2 processes; the step index is kept.
    let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
    let spans: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e.get("cat").is_none())
        .collect();
    assert_eq!(spans.len(), 2 * 20 * 5);
    assert_eq!(
        spans
            .iter()
            .filter(|e| e["name"] == "step" && e["args"]["step"].is_u64())
            .count(),
        40
    );
    // A flow from each launch or copy to its GPU work: starts and finishes pair up by id.
    let gpu_work = events.iter().filter(|e| e["cat"] == "gpu").count();
    assert_eq!(count("s"), gpu_work);
    assert_eq!(count("f"), gpu_work);
    // Per process: 3 kernels + 1 upload + 1 readback per step, 20 steps.
    assert_eq!(gpu_work, 2 * 20 * 5);
    // Ranks are placed on the common wall clock.
    let first_ts = |pid: u64| {
        events
            .iter()
            .filter(|e| e["pid"] == pid && e["ph"] == "X" && e["name"] == "step")
            .filter_map(|e| e["ts"].as_f64())
            .fold(f64::MAX, f64::min)
    };
    assert!(
        (first_ts(2) - first_ts(1) - 500.0).abs() < 1.0,
        "rank 1 starts 500 us later"
    );
}

#[test]
fn snapshots_of_summary_markdown_and_folded_stacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = run_dir(dir.path(), &Workload::anti_patterns(), 1);
    let a = analyze_path(&input, &AnalyzeOptions::default()).expect("analyze");
    let out = dir.path().join("out");
    write_all(
        &a,
        &out,
        &[Format::Json, Format::Md, Format::Folded],
        &[],
        &RenderOptions::default(),
    )
    .expect("render");
    // The temporary directory's name shows in paths: replace it.
    let tmp = dir.path().display().to_string();
    let base = dir
        .path()
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let text = read(&out.join("summary.json"))
        .replace(&tmp, "[run dir]")
        .replace(&base, "[run dir]");
    let summary: Value = serde_json::from_str(&text).expect("json");
    insta::assert_json_snapshot!("summary_anti_patterns", summary);
    insta::assert_snapshot!("summary_md_anti_patterns", read(&out.join("summary.md")));
    insta::assert_snapshot!(
        "folded_host_anti_patterns",
        read(&out.join("stacks-host.folded"))
    );
    insta::assert_snapshot!(
        "folded_gpu_anti_patterns",
        read(&out.join("stacks-gpu.folded"))
    );
}

#[test]
fn a_trace_without_spans_still_renders_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = synth::Synth::new(Vec::new(), "idle", 3, None, START);
    std::fs::write(dir.path().join("idle.pktrace"), s.finish(false)).expect("write");
    let a = analyze_path(dir.path(), &AnalyzeOptions::default()).expect("analyze");
    assert_eq!(a.processes[0].steps.duration.count, 0);
    let out = dir.path().join("out");
    let written =
        write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    assert_eq!(written.len(), 8);
    let md = read(&out.join("summary.md"));
    assert!(md.contains("No `step` spans recorded"), "{md}");
    assert!(read(&out.join("flamegraph-host.svg")).contains("no samples"));
    let chrome: Value = serde_json::from_str(&read(&out.join("trace.chrome.json"))).expect("json");
    assert!(
        chrome["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    );
}

#[test]
fn names_from_the_program_are_escaped_in_every_format() {
    const SCRIPT: &str = "<script>alert(1)</script>";
    const IMG: &str = "\"><img src=x onerror=alert(1)>";
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wl = Workload::tuned();
    wl.spans = [SCRIPT, IMG, "forward;\nsplit", "optimizer"];
    wl.kernels = [SCRIPT, IMG, "adam_update"];
    let input = run_dir(dir.path(), &wl, 1);
    let a = analyze_path(&input, &AnalyzeOptions::default()).expect("analyze");
    let out = dir.path().join("out");
    write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    for name in [
        "report.html",
        "flamegraph-host.svg",
        "flamegraph-gpu.svg",
        "summary.md",
    ] {
        let text = read(&out.join(name));
        assert!(
            !text.contains(SCRIPT) && !text.contains("<img src=x"),
            "{name} holds a raw payload"
        );
    }
    // Folded stacks stay one stack per line with `;` only between frames.
    let folded = read(&out.join("stacks-host.folded"));
    assert!(
        folded
            .lines()
            .any(|l| l.starts_with("step;forward: split ")),
        "{folded}"
    );
    // JSON outputs keep the names exactly.
    let chrome: Value = serde_json::from_str(&read(&out.join("trace.chrome.json"))).expect("json");
    let events = chrome["traceEvents"].as_array().expect("events");
    assert!(
        events
            .iter()
            .any(|e| e["name"] == SCRIPT && e["cat"] == "gpu")
    );
    assert!(events.iter().any(|e| e["name"] == IMG));
}

/// A run rendered from simulated GPU timings says so wherever people read it: the HTML
/// banner, `summary.md`, the terminal summary and `summary.json`.
#[test]
fn synthetic_run_says_so_in_every_output() {
    use perfkit_reports::model::SYNTHETIC_NOTE;
    let dir = tempfile::tempdir().expect("tempdir");
    let input = run_dir(dir.path(), &Workload::anti_patterns(), 1);
    let out = dir.path().join("out");
    let a = analyze_path(&input, &AnalyzeOptions::default()).expect("analyze");
    assert!(a.is_synthetic(), "the simulator marks its traces");
    write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");

    let html = read(&out.join("report.html"));
    let header =
        &html[html.find("<header>").expect("header")..html.find("</header>").expect("end")];
    assert!(header.contains(SYNTHETIC_NOTE), "{header}");
    let md = read(&out.join("summary.md"));
    let first = md.lines().take(4).collect::<Vec<_>>().join("\n");
    assert!(first.contains(SYNTHETIC_NOTE), "{md}");
    let terminal = perfkit_reports::summary::terminal_table(&a, 5);
    assert!(
        terminal
            .lines()
            .next()
            .is_some_and(|l| l.contains(SYNTHETIC_NOTE)),
        "{terminal}"
    );
    let json: Value = serde_json::from_str(&read(&out.join("summary.json"))).expect("json");
    assert_eq!(json["analysis"]["timings"], SYNTHETIC_NOTE, "{json}");
    assert_eq!(json["analysis"]["processes"][0]["meta"]["synthetic"], true);
}
