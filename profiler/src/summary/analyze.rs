//! Streaming analysis of a run's trace files.

use std::path::Path;

use crate::model::Record;
use crate::reader::{ReadError, TraceReader, TraceStatus, trace_files};

use super::stats::SpanAggregator;
use super::{Files, ProcessSummary};

/// Why a trace directory could not be analysed at all. Problems with single files do not fail
/// the analysis; they are reported in [`TraceDirAnalysis::unreadable`] and in the processes'
/// [`ProcessSummary::error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalyzeError {
    /// The directory could not be listed.
    #[error(transparent)]
    List(#[from] ReadError),
}

/// The figures of every trace file in a run's trace directory.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TraceDirAnalysis {
    /// One entry per readable trace file of the program's processes, in file name order
    /// (traces of perfkit's own recorders, such as the GPU sampler, are listed in `files` only).
    pub processes: Vec<ProcessSummary>,
    /// Index in `processes` of the primary process (see [`super::Summary::primary_pid`]).
    pub primary: Option<usize>,
    /// Trace files whose header could not be read (the process died before writing it, or the
    /// file is not a trace), with the reason.
    pub unreadable: Vec<(String, String)>,
    /// The run's files.
    pub files: Files,
}

/// Options of [`analyze_trace_dir`]. Build with `AnalyzeOptions::default()` and set fields.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AnalyzeOptions {
    /// The pid of the program perfkit started: its process is the primary one when traced.
    /// Default: none (rank 0, else the earliest process).
    pub launched_pid: Option<u32>,
    /// The denominator of the span table's percentages, in ns. Default: each process's time
    /// from its trace origin (`init()`) to its last record.
    pub wall_ns: Option<u64>,
    /// The name of the step span. Default: the one each trace header names (`step` unless the
    /// program configured another).
    pub step_span: Option<String>,
}

/// Reads every trace file in `trace_dir` (a directory, or a single trace file) and computes each
/// process's figures.
///
/// `run_dir` is the directory that will hold `summary.json`: file names in the result are
/// relative to it.
///
/// Memory stays bounded for long runs: each file is streamed record by record; what is kept is
/// one aggregate per span name, the spans open at a time, and one integer per step.
///
/// # Errors
/// [`AnalyzeError::List`] when `trace_dir` cannot be listed.
pub fn analyze_trace_dir(
    trace_dir: &Path,
    run_dir: &Path,
    options: &AnalyzeOptions,
) -> Result<TraceDirAnalysis, AnalyzeError> {
    let paths = match trace_files(trace_dir) {
        Ok(paths) => paths,
        // A directory the program never created means "no trace", not an error.
        Err(ReadError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Vec::new()
        }
        Err(e) => return Err(e.into()),
    };
    let mut processes = Vec::new();
    let mut unreadable = Vec::new();
    let mut trace_bytes = 0;
    let mut names = Vec::new();
    for path in &paths {
        let rel = relative(path, run_dir);
        trace_bytes += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        names.push(rel.clone());
        match analyze_file(path, &rel, options) {
            Ok(Some(p)) => processes.push(p),
            Ok(None) => {}
            Err(e) => unreadable.push((rel, e.to_string())),
        }
    }
    let primary = primary_process(&processes, options.launched_pid);
    Ok(TraceDirAnalysis {
        processes,
        primary,
        unreadable,
        files: Files {
            trace_dir: relative(trace_dir, run_dir),
            trace_files: names,
            trace_bytes,
            summary: super::SUMMARY_FILE.to_owned(),
            reports: Vec::new(),
            summary_error: None,
            reports_error: None,
        },
    })
}

/// The launched program if traced, else rank 0, else the earliest-starting process. One process
/// can have two traces (its own and one written by CUPTI injection): the one with the most
/// steps, then the most span names, is its primary trace.
fn primary_process(processes: &[ProcessSummary], launched_pid: Option<u32>) -> Option<usize> {
    let best = |keep: &dyn Fn(&ProcessSummary) -> bool| {
        processes
            .iter()
            .enumerate()
            .filter(|(_, p)| keep(p))
            // max_by_key keeps the last of equal keys: reverse to keep the first file.
            .rev()
            .max_by_key(|(_, p)| (p.steps.count, p.spans.len()))
            .map(|(i, _)| i)
    };
    if let Some(pid) = launched_pid
        && let Some(i) = best(&|p| p.pid == pid)
    {
        return Some(i);
    }
    if let Some(i) = best(&|p| p.rank == Some(0)) {
        return Some(i);
    }
    processes
        .iter()
        .enumerate()
        .min_by_key(|(_, p)| p.start_unix_ns)
        .map(|(i, _)| i)
}

/// `path` relative to `base` with `/` separators, or `path` as is when not below `base`.
fn relative(path: &Path, base: &Path) -> String {
    let rel = path.strip_prefix(base).unwrap_or(path);
    let s = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/");
    if s.is_empty() { ".".to_owned() } else { s }
}

/// The `extra` header entry that marks a trace written by one of perfkit's own recorders rather than by a
/// process of the program (the GPU sampler writes `("perfkit.role", "gpu-sampler")`).
pub const ROLE_KEY: &str = "perfkit.role";

/// Streams one trace file through the aggregator. `None` for a trace that is not a process of
/// the program (see [`ROLE_KEY`]).
///
/// # Errors
/// Only when the file's preamble or header cannot be read; damage later in the file ends the
/// reading there and is reported in [`ProcessSummary::error`].
pub(super) fn analyze_file(
    path: &Path,
    rel: &str,
    options: &AnalyzeOptions,
) -> Result<Option<ProcessSummary>, ReadError> {
    let mut reader = TraceReader::open(path)?;
    let header = reader.header().clone();
    if header.extra.iter().any(|(k, _)| k == ROLE_KEY) {
        return Ok(None);
    }
    // A header without a step span name means the default one, as the reports read it.
    let step_span = match options.step_span.as_deref() {
        Some(name) => name,
        None if header.step_span_name.is_empty() => super::DEFAULT_STEP_SPAN,
        None => &header.step_span_name,
    };
    let mut agg = SpanAggregator::new(step_span);
    // A Python trace without step spans: steps from its optimizer steps (see `pystep`).
    let mut real_steps = false;
    let mut py_steps = crate::pystep::PyStepInference::new();
    let mut py_stacks: std::collections::HashMap<u64, Vec<crate::model::PyFrame>> =
        std::collections::HashMap::new();
    let mut op_py: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    // Inferred steps begun and not yet ended: span -> (thread, start). Only ended ones are
    // counted (the last one is unfinished, not a span left open).
    let mut py_open: std::collections::HashMap<u64, (u64, u64)> = std::collections::HashMap::new();
    let mut events = 0u64;
    let mut dropped = 0u64;
    let mut first_ts = None::<u64>;
    let mut last_ts = 0u64;
    let mut panic = None;
    let mut error = None;
    loop {
        let record = match reader.next_record() {
            Ok(Some(record)) => record,
            Ok(None) => break,
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        };
        events += 1;
        if let Some(ts) = record.ts() {
            first_ts = Some(first_ts.map_or(ts, |f| f.min(ts)));
            last_ts = last_ts.max(ts);
        }
        match record {
            Record::SpanNew(r) => {
                real_steps |= *r.callsite.name == *step_span;
                agg.new_span(r.id.0, &r.callsite.name);
            }
            Record::PyStack(p) => {
                py_stacks.insert(p.id, p.frames);
            }
            Record::OpPyStack(o) => {
                if let Some(stack) = o.stack {
                    op_py.insert(o.op, stack);
                }
            }
            Record::Gpu(g) if !real_steps => {
                let boundary = op_py
                    .remove(&g.id)
                    .and_then(|id| py_stacks.get(&id))
                    .and_then(|frames| py_steps.op(g.thread, frames, g.host_end));
                if let Some(b) = boundary {
                    let thread = u64::from(b.thread);
                    if let Some((thread, start)) = b.ended.and_then(|s| py_open.remove(&s)) {
                        let span = b.ended.unwrap_or(0);
                        agg.new_span(span, step_span);
                        agg.enter(thread, span, start);
                        agg.exit(thread, span, b.at);
                        agg.close(span);
                    }
                    py_open.insert(b.begun, (thread, b.at));
                }
            }
            Record::SpanEnter(r) => agg.enter(u64::from(r.thread), r.span.0, r.ts),
            Record::SpanExit(r) => agg.exit(u64::from(r.thread), r.span.0, r.ts),
            Record::SpanClose(r) => agg.close(r.span.0),
            Record::Dropped(d) => dropped = dropped.saturating_add(d.count),
            Record::Panic(p) => {
                let at = p
                    .location
                    .map(|l| format!(" at {}:{}:{}", l.file, l.line, l.column))
                    .unwrap_or_default();
                panic = Some(format!("{}{at}", p.message));
            }
            Record::End(end) => dropped = dropped.max(end.dropped),
            _ => {}
        }
    }
    let (complete, cut_at) = match reader.status() {
        TraceStatus::Complete(_) => (true, None),
        TraceStatus::Cut { valid_up_to, .. } => (false, Some(*valid_up_to)),
        TraceStatus::Corrupt { .. } | TraceStatus::Reading => (false, None),
    };
    let traced_ns = last_ts.saturating_sub(first_ts.unwrap_or(0));
    let threads = agg.threads();
    let open_spans = agg.open_spans();
    let (spans, steps) = agg.finish(options.wall_ns.unwrap_or(last_ts));
    Ok(Some(ProcessSummary {
        pid: header.pid,
        host: header.host,
        argv: header.command_line,
        rank: header.rank,
        local_rank: header.local_rank,
        world_size: header.world_size,
        start_unix_ns: header.start_unix_ns,
        trace_file: rel.to_owned(),
        complete,
        cut_at_byte: cut_at,
        error,
        panic,
        events,
        dropped_events: dropped,
        threads,
        open_spans,
        traced_ns,
        last_record_ns: last_ts,
        steps,
        spans,
    }))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::TraceWriter;
    use crate::model::{
        Callsite, CallsiteKind, Dropped, EndReason, Header, SpanEdge, SpanId, SpanNew, TraceEnd,
    };

    fn span_new(id: u64, name: &str, ts: u64) -> Record {
        Record::SpanNew(SpanNew {
            thread: 0,
            ts,
            id: SpanId(id),
            parent: None,
            callsite: Arc::new(Callsite::new(name, "test", CallsiteKind::Span, &[])),
            fields: Vec::new(),
        })
    }

    fn edge(ts: u64, id: u64) -> SpanEdge {
        SpanEdge {
            thread: 0,
            ts,
            span: SpanId(id),
        }
    }

    /// Writes `steps` steps of 10 ms, each with a 4 ms `forward` child, as one chunk per step.
    fn write_trace(path: &Path, pid: u32, steps: u64, end: bool) {
        let file = std::fs::File::create(path).unwrap();
        let mut header = Header::new("train", pid);
        header.rank = Some(0);
        let mut w = TraceWriter::new(file, &header).unwrap();
        let ms = 1_000_000;
        for i in 0..steps {
            let t = i * 10 * ms;
            let (step, fwd) = (2 * i + 1, 2 * i + 2);
            for r in [
                span_new(step, "step", t),
                Record::SpanEnter(edge(t, step)),
                span_new(fwd, "forward", t + ms),
                Record::SpanEnter(edge(t + ms, fwd)),
                Record::SpanExit(edge(t + 5 * ms, fwd)),
                Record::SpanClose(edge(t + 5 * ms, fwd)),
                Record::SpanExit(edge(t + 10 * ms, step)),
                Record::SpanClose(edge(t + 10 * ms, step)),
            ] {
                w.write(&r).unwrap();
            }
            w.flush_chunk().unwrap();
        }
        w.write(&Record::Dropped(Dropped {
            thread: Some(0),
            ts: steps * 10 * ms,
            count: 3,
        }))
        .unwrap();
        if end {
            w.write(&Record::End(TraceEnd {
                ts: steps * 10 * ms,
                end_unix_ns: 0,
                reason: EndReason::GuardDropped,
                records: 0,
                dropped: 3,
            }))
            .unwrap();
        }
        w.finish().unwrap();
    }

    fn temp_run(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("perfkit-analyze-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("trace")).unwrap();
        dir
    }

    #[test]
    fn complete_trace_gives_steps_spans_and_drops() {
        let run = temp_run("complete");
        write_trace(&run.join("trace/train-41.pktrace"), 41, 20, true);
        let a = analyze_trace_dir(&run.join("trace"), &run, &opts(Some(41), Some(400_000_000)))
            .unwrap();
        assert_eq!(a.primary, Some(0));
        assert!(a.unreadable.is_empty());
        assert_eq!(a.files.trace_files, ["trace/train-41.pktrace"]);
        assert_eq!(a.files.trace_dir, "trace");
        let p = &a.processes[0];
        assert!(p.complete && p.error.is_none());
        assert_eq!(p.dropped_events, 3);
        assert_eq!(p.steps.count, 20);
        assert_eq!(p.steps.median_ns, Some(10_000_000));
        let step = &p.spans[0];
        assert_eq!((step.name.as_str(), step.calls), ("step", 20));
        assert_eq!(step.self_ns, 20 * 6_000_000);
        assert_eq!(step.percent_of_wall, 50.0);
        let summary = super::super::Summary::new(run_info(), a);
        assert!(
            !summary.run.incomplete,
            "{:?}",
            summary.run.incomplete_reasons
        );
        assert_eq!(summary.dropped_events, 3);
        let json = run.join("summary.json");
        summary.write_json(&json).unwrap();
        assert_eq!(super::super::Summary::read_json(&json).unwrap(), summary);
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn cut_trace_reads_up_to_its_last_chunk_and_marks_the_run_incomplete() {
        let run = temp_run("cut");
        let path = run.join("trace/train-42.pktrace");
        write_trace(&path, 42, 10, false);
        // Cut the last chunk in half, as a SIGKILL during a write would.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        // A GPU sampler's trace is not a process of the program.
        let mut sampler = Header::new("perfkit-gpu-sampler", 99);
        sampler.extra.push((ROLE_KEY.into(), "gpu-sampler".into()));
        let file = std::fs::File::create(run.join("trace/perfkit-gpu-sampler-99.pktrace")).unwrap();
        TraceWriter::new(file, &sampler).unwrap().finish().unwrap();
        // And a file from a process killed before it wrote its header.
        std::fs::write(run.join("trace/other-43.pktrace"), b"PKTR").unwrap();
        let a = analyze_trace_dir(&run.join("trace"), &run, &opts(Some(7), None)).unwrap();
        assert_eq!(a.unreadable.len(), 1);
        assert_eq!(a.processes.len(), 1, "the sampler is not a process");
        assert_eq!(a.files.trace_files.len(), 3);
        assert_eq!(
            a.primary,
            Some(0),
            "rank 0 when the launched pid is not traced"
        );
        let p = &a.processes[0];
        assert!(!p.complete);
        assert!(p.cut_at_byte.is_some());
        assert_eq!(p.steps.count, 10, "all complete steps survive the cut");
        let summary = super::super::Summary::new(run_info(), a);
        assert!(summary.run.incomplete);
        assert_eq!(
            summary.run.incomplete_reasons.len(),
            2,
            "{:?}",
            summary.run.incomplete_reasons
        );
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn the_trace_with_steps_is_the_primary_one_of_a_process() {
        let run = temp_run("two-traces");
        // Same pid: an injection trace (no spans) sorts before the program's own trace.
        let file = std::fs::File::create(run.join("trace/train-45-inject.pktrace")).unwrap();
        TraceWriter::new(file, &Header::new("train", 45))
            .unwrap()
            .finish()
            .unwrap();
        write_trace(&run.join("trace/train-45.pktrace"), 45, 3, true);
        let a = analyze_trace_dir(&run.join("trace"), &run, &opts(Some(45), None)).unwrap();
        assert_eq!(a.processes.len(), 2);
        assert_eq!(a.primary, Some(1));
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn summary_from_traces_alone() {
        let run = temp_run("from-traces");
        write_trace(&run.join("trace/train-44.pktrace"), 44, 4, true);
        let from_run_dir = super::super::Summary::from_traces(&run, None).unwrap();
        assert_eq!(from_run_dir.run.exit, None);
        assert_eq!(from_run_dir.run.program, "train");
        assert_eq!(from_run_dir.run.wall_time_ns, 40_000_000);
        assert_eq!(from_run_dir.steps.count, 4);
        assert_eq!(from_run_dir.spans[0].percent_of_wall, 100.0);
        assert_eq!(from_run_dir.files.trace_files, ["trace/train-44.pktrace"]);
        let from_file = super::super::Summary::from_traces(
            &run.join("trace/train-44.pktrace"),
            Some("forward"),
        )
        .unwrap();
        assert_eq!(from_file.steps.span, "forward");
        assert_eq!(from_file.steps.count, 4);
        assert_eq!(from_file.steps.median_ns, Some(4_000_000));
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn missing_trace_dir_is_an_uninstrumented_run() {
        let run = temp_run("none");
        let a = analyze_trace_dir(&run.join("nothing"), &run, &opts(Some(1), None)).unwrap();
        assert!(a.processes.is_empty());
        let summary = super::super::Summary::new(run_info(), a);
        assert!(!summary.instrumented);
        assert_eq!(summary.steps.count, 0);
        let mut text = Vec::new();
        summary.write_text(&mut text, "out").unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("not instrumented"), "{text}");
        assert!(text.contains("perfkit_profiler::init()"), "{text}");
        std::fs::remove_dir_all(&run).unwrap();
    }

    fn opts(launched_pid: Option<u32>, wall_ns: Option<u64>) -> AnalyzeOptions {
        AnalyzeOptions {
            launched_pid,
            wall_ns,
            step_span: None,
        }
    }

    fn run_info() -> super::super::RunInfo {
        super::super::RunInfo {
            program: "train".into(),
            args: Vec::new(),
            started_at: "2026-01-01T00:00:00.000Z".into(),
            wall_time_ns: 400_000_000,
            exit: Some(super::super::ExitInfo {
                code: Some(0),
                signal: None,
                signal_name: None,
                core_dumped: false,
                exit_code: 0,
                description: "exit code 0".into(),
            }),
            signals: Vec::new(),
            incomplete: false,
            incomplete_reasons: Vec::new(),
        }
    }
}
