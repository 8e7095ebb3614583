//! Hand-made and hostile input: span stacks thousands of frames deep, spans without a name,
//! GPU records whose times cannot be, trace paths that are not regular files.

mod synth;

use std::path::{Path, PathBuf};

use perfkit_profiler::model::{GpuEvent, GpuOpKind, GpuTiming, KernelInfo, Record};
use perfkit_reports::ingest::MAX_STACK_DEPTH;
use perfkit_reports::render::{self, Format, RenderOptions};
use perfkit_reports::{AnalyzeOptions, analyze_path};
use synth::Synth;

const START: u64 = 1_700_000_000_000_000_000;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write trace");
    p
}

/// A trace of one thread whose spans each open inside the previous one, `depth` deep, each
/// with 1 us of self time before and after its child; the innermost is a step.
fn nested_chain(depth: usize) -> Vec<u8> {
    let mut s = Synth::new(Vec::new(), "deep", 7, None, START);
    for i in 0..depth {
        s.work(1_000);
        s.enter(0, if i + 1 == depth { "step" } else { "inner" }, None);
    }
    for _ in 0..depth {
        s.work(1_000);
        s.exit(0);
    }
    s.finish(false)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_deep_span_chain_is_cut_at_the_depth_limit_in_every_stack_output() {
    let depth = 20_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = write(dir.path(), "deep.pktrace", &nested_chain(depth));
    let a = analyze_path(&trace, &AnalyzeOptions::default()).expect("analyze");
    let p = &a.processes[0];

    // One stack per depth kept, plus the marker; none longer than the limit and the marker.
    assert_eq!(p.deepest_stack, Some(depth as u64));
    assert_eq!(p.stacks.len(), MAX_STACK_DEPTH + 1);
    assert!(
        p.stacks
            .iter()
            .all(|s| s.frames.len() <= MAX_STACK_DEPTH + 1)
    );
    let deepest = p
        .stacks
        .iter()
        .max_by_key(|s| s.frames.len())
        .expect("stacks");
    let marker = format!("[{} deeper frames]", depth - MAX_STACK_DEPTH);
    assert_eq!(deepest.frames.last(), Some(&marker));
    assert_eq!(
        deepest.frames[..MAX_STACK_DEPTH - 1],
        vec!["inner"; 255][..]
    );
    // No time is lost: the marker holds the self time of every frame it stands for, and all
    // of it adds up to the outermost span.
    // (each frame's 1 us before and after its child; the innermost has no child)
    assert_eq!(
        deepest.host_ns,
        2_000 * (depth - MAX_STACK_DEPTH) as u64 - 1_000
    );
    let host: u64 = p.stacks.iter().map(|s| s.host_ns).sum();
    let inner = p.spans.iter().find(|s| s.name == "inner").expect("inner");
    assert_eq!(
        host, inner.total_ns,
        "recursion is counted once in the total"
    );
    assert_eq!(inner.calls, depth as u64 - 1);
    assert_eq!(p.steps.duration.count, 1);
    // The spans, steps and the run stay exact and complete: a note, not an incomplete run.
    assert!(a.complete && a.incomplete_reasons().is_empty());
    let notes = a.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("20000 frames deep") && notes[0].contains(&marker),
        "{notes:?}"
    );

    // The timeline draws a row per level: the outermost levels only, the others counted as
    // not shown.
    let items = a.timeline.tracks.iter().flat_map(|t| &t.items);
    assert!(items.clone().count() > 0);
    assert!(items.clone().all(|i| (i.depth as usize) < MAX_STACK_DEPTH));
    assert!(a.timeline.windows.iter().any(|w| w.truncated > 0));

    // Every format renders (no recursion as deep as the input), in output sizes that do not
    // grow with the square of the depth, and says so where stacks are shown.
    let out = dir.path().join("out");
    let written =
        render::write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    assert_eq!(written.len(), 8, "{written:?}");
    let total: u64 = written
        .iter()
        .map(|f| std::fs::metadata(f).expect("written").len())
        .sum();
    assert!(
        total < 8 << 20,
        "{total} bytes written for a 20000-deep chain"
    );
    let folded = read(&out.join("stacks-host.folded"));
    assert_eq!(folded.lines().count(), MAX_STACK_DEPTH + 1);
    assert!(
        folded.contains(&format!(";{marker} ")),
        "marker in the folded stacks"
    );
    assert!(read(&out.join("flamegraph-host.svg")).contains("stacks cut at 256 frames"));
    let summary = read(&out.join("summary.json"));
    let json: serde_json::Value = serde_json::from_str(&summary).expect("summary.json");
    assert_eq!(json["analysis"]["notes"][0], notes[0].as_str());
    assert_eq!(json["analysis"]["processes"][0]["deepest_stack"], depth);
    assert_eq!(json["run"]["incomplete"], false);
    assert!(read(&out.join("summary.md")).contains("**Notes:**"));
    assert!(read(&out.join("report.html")).contains("20000 frames deep"));
}

#[test]
fn stacks_of_ordinary_depth_are_kept_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = write(dir.path(), "t.pktrace", &nested_chain(MAX_STACK_DEPTH));
    let a = analyze_path(&trace, &AnalyzeOptions::default()).expect("analyze");
    let p = &a.processes[0];
    assert_eq!(p.deepest_stack, None);
    assert_eq!(p.stacks.len(), MAX_STACK_DEPTH);
    let deepest = p.stacks.iter().map(|s| s.frames.len()).max();
    assert_eq!(deepest, Some(MAX_STACK_DEPTH));
    assert!(
        !p.stacks
            .iter()
            .flat_map(|s| &s.frames)
            .any(|f| f.contains("deeper"))
    );
    assert!(a.notes().is_empty());
}

#[test]
fn a_summary_with_deeper_stacks_is_cut_when_folded() {
    // A `summary.json` written by an older perfkit (or by hand) can hold any depth.
    let stack = perfkit_reports::model::StackTime {
        frames: (0..1000).map(|i| format!("f{i}")).collect(),
        host_ns: 5,
        gpu_ns: 0,
    };
    let mut folded = std::collections::BTreeMap::new();
    perfkit_reports::flame::add_stacks(
        &mut folded,
        &[stack],
        perfkit_reports::flame::FlameKind::Host,
        None,
    );
    let (key, count) = folded.into_iter().next().expect("one stack");
    assert_eq!(count, 5);
    let frames: Vec<&str> = key.split(';').collect();
    assert_eq!(frames.len(), MAX_STACK_DEPTH + 1);
    assert_eq!(frames[MAX_STACK_DEPTH - 1], "f255");
    assert_eq!(frames[MAX_STACK_DEPTH], "[744 deeper frames]");
}

#[test]
fn spans_without_a_name_are_shown_and_drawn_under_a_placeholder() {
    let mut s = Synth::new(Vec::new(), "unnamed", 8, None, START);
    for _ in 0..3 {
        s.enter(0, "", None);
        s.work(1_000_000);
        s.exit(0);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = write(dir.path(), "t.pktrace", &s.finish(false));
    let a = analyze_path(&trace, &AnalyzeOptions::default()).expect("analyze");
    let span = &a.processes[0].spans[0];
    assert_eq!((span.name.as_str(), span.calls), ("<unnamed>", 3));
    let out = dir.path().join("out");
    let written = render::write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default())
        .expect("an empty span name does not fail the report");
    assert_eq!(written.len(), 8, "{written:?}");
    assert_eq!(read(&out.join("stacks-host.folded")), "<unnamed> 3000000\n");
    let svg = read(&out.join("flamegraph-host.svg"));
    assert!(svg.contains("&lt;unnamed&gt;") && !svg.contains("nothing drawn"));
    // The core summary (the profiler's own span table) counts them under the same name.
    let json: serde_json::Value =
        serde_json::from_str(&read(&out.join("summary.json"))).expect("summary.json");
    assert_eq!(json["spans"][0]["name"], "<unnamed>");
    assert_eq!(json["spans"][0]["calls"], 3);
}

fn kernel(id: u64, host: u64, gpu: Option<(u64, u64)>) -> Record {
    Record::Gpu(GpuEvent {
        thread: 0,
        kind: GpuOpKind::Kernel,
        id,
        device: 0,
        stream: Some(7),
        bytes: 0,
        host_memory: None,
        host_start: host,
        host_end: host + 5_000,
        gpu_start: gpu.map(|g| g.0),
        gpu_end: gpu.map(|g| g.1),
        gpu_end_at_host_return: false,
        span: None,
        location: None,
        kernel: Some(KernelInfo {
            name: "k".into(),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
        }),
    })
}

#[test]
fn gpu_records_whose_times_cannot_be_are_left_out_and_counted() {
    let mut s = Synth::new(Vec::new(), "gpu", 9, None, START);
    s.enter(0, "step", Some(0));
    let t = s.t;
    // A valid kernel of 100 us.
    s.raw(kernel(1, t, Some((t + 10_000, t + 110_000))));
    // Its end before its start.
    s.raw(kernel(2, t + 20_000, Some((t + 30_000, t + 25_000))));
    // An end that went below the trace origin and wrapped around (a negative delta).
    s.raw(kernel(
        3,
        t + 40_000,
        Some((t + 50_000, t.wrapping_sub(1_000_000))),
    ));
    // A late timing whose end wrapped around below its start.
    s.raw(kernel(4, t + 60_000, None));
    s.raw(Record::GpuTiming(GpuTiming {
        id: 4,
        gpu_start: t + 70_000,
        gpu_end: t + 65_000,
    }));
    s.work(1_000_000);
    s.exit(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = write(dir.path(), "t.pktrace", &s.finish(false));
    let a = analyze_path(&trace, &AnalyzeOptions::default()).expect("analyze");
    let p = &a.processes[0];
    assert_eq!(p.invalid_gpu_ops, 3);
    assert_eq!(p.gpu.busy_ns, 100_000, "{:?}", p.gpu);
    assert!(p.gpu.window_ns < 10_000_000, "{:?}", p.gpu);
    // The late-timed kernel was launched (counted) but has no GPU time.
    assert_eq!((p.kernels[0].count, p.kernels[0].total_ns), (2, 100_000));
    let notes = a.notes();
    assert!(
        notes.len() == 1 && notes[0].contains("3 malformed GPU records left out"),
        "{notes:?}"
    );
    let table = perfkit_reports::summary::terminal_table(&a, 10);
    assert!(table.contains("GPU busy 100.00 us"), "{table}");
}

#[test]
fn a_dangling_trace_link_in_a_run_directory_is_unreadable_not_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "a.pktrace", &nested_chain(3));
    std::os::unix::fs::symlink(
        dir.path().join("gone.pktrace"),
        dir.path().join("b.pktrace"),
    )
    .expect("symlink");
    let a = analyze_path(dir.path(), &AnalyzeOptions::default()).expect("analyze");
    assert_eq!(a.processes.len(), 1);
    assert!(!a.complete);
    assert_eq!(a.unreadable.len(), 1);
    assert!(
        a.unreadable[0].file.ends_with("b.pktrace"),
        "{:?}",
        a.unreadable
    );
    let reasons = a.incomplete_reasons();
    assert!(
        reasons.iter().any(|r| r.contains("b.pktrace")),
        "{reasons:?}"
    );
    // The core summary says the same.
    let core = perfkit_reports::Summary::core_of(&a).expect("core");
    assert!(core.run.incomplete, "{:?}", core.run);
    // A link to a regular trace is read as the trace.
    let linked = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        dir.path().join("a.pktrace"),
        linked.path().join("l.pktrace"),
    )
    .expect("symlink");
    let a = analyze_path(linked.path(), &AnalyzeOptions::default()).expect("analyze link");
    assert!(a.complete && a.unreadable.is_empty());
}

/// Runs `f` on a thread and gives up after a few seconds: what is tested must not block.
fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("blocked on a file that is not a regular file")
}

#[test]
fn a_fifo_given_as_a_trace_or_summary_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("f.pktrace");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let path = fifo.clone();
    let err = within_seconds(move || {
        analyze_path(&path, &AnalyzeOptions::default())
            .map(|_| ())
            .expect_err("a FIFO is not a trace")
            .to_string()
    });
    assert!(
        err.contains("f.pktrace") && err.contains("not a regular file (a named pipe)"),
        "{err}"
    );
    let json = dir.path().join("summary.json");
    std::fs::rename(&fifo, &json).expect("rename");
    let err = within_seconds(move || {
        perfkit_reports::Summary::load(&json)
            .map(|_| ())
            .expect_err("a FIFO is not a summary")
            .to_string()
    });
    assert!(
        err.contains("summary.json") && err.contains("not a regular file"),
        "{err}"
    );
}

/// A trace cut short makes an incomplete run: every output says so, not only the summaries (the
/// folded stacks with a labelled frame of their own, the flamegraphs in their titles, the Chrome
/// trace with a global marker and `otherData`).
#[test]
fn an_incomplete_run_is_labelled_in_every_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = nested_chain(8);
    // Cut in the middle of the records: the trace lacks its end.
    let trace = write(dir.path(), "cut.pktrace", &whole[..whole.len() * 2 / 3]);
    let a = analyze_path(&trace, &AnalyzeOptions::default()).expect("analyze");
    assert!(!a.incomplete_reasons().is_empty());
    let out = dir.path().join("out");
    render::write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    let folded = read(&out.join("stacks-host.folded"));
    assert!(
        folded
            .lines()
            .any(|l| l == format!("{} 1", perfkit_reports::flame::INCOMPLETE_FRAME)),
        "{folded}"
    );
    for svg in ["flamegraph-host.svg", "flamegraph-gpu.svg"] {
        assert!(read(&out.join(svg)).contains("INCOMPLETE run"), "{svg}");
    }
    let chrome: serde_json::Value =
        serde_json::from_str(&read(&out.join("trace.chrome.json"))).expect("chrome JSON");
    assert!(
        !chrome["otherData"]["perfkit_incomplete"]
            .as_array()
            .expect("reasons")
            .is_empty()
    );
    assert!(
        chrome["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["s"] == "g" && e["name"].as_str().is_some_and(|n| n.contains("INCOMPLETE")))
    );
    assert!(read(&out.join("report.html")).contains("ncomplete"));

    // A complete run carries none of these labels.
    let fine = write(dir.path(), "fine.pktrace", &whole);
    let a = analyze_path(&fine, &AnalyzeOptions::default()).expect("analyze");
    let out = dir.path().join("fine");
    render::write_all(&a, &out, &Format::ALL, &[], &RenderOptions::default()).expect("render");
    assert!(!read(&out.join("stacks-host.folded")).contains("INCOMPLETE"));
    assert!(!read(&out.join("flamegraph-host.svg")).contains("INCOMPLETE"));
    assert!(!read(&out.join("trace.chrome.json")).contains("INCOMPLETE"));
}
