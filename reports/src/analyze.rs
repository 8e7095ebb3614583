//! Analysis of a run: discover the trace files, stream each one, align the processes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ingest::{AnalyzeOptions, ProcessIngest};
use crate::model::{Analysis, ProcessAnalysis, RankComparison, RankRow, Timeline};
use crate::source::TraceSource;
use crate::stats::Distribution;
use crate::timeline::TimelineCollector;

/// The trace files of `path`: the file itself, the trace files directly inside a directory
/// (sorted by name), or those of its `trace/` subdirectory (a run directory written by
/// `perfkit profile`).
pub fn discover(path: &Path) -> Result<Vec<PathBuf>> {
    let files = list_traces(path)?;
    if !files.is_empty() {
        return Ok(files);
    }
    let sub = path.join(RUN_TRACE_DIR);
    let files = if sub.is_dir() {
        list_traces(&sub)?
    } else {
        Vec::new()
    };
    if files.is_empty() {
        return Err(Error::NoTrace {
            path: path.to_path_buf(),
        });
    }
    Ok(files)
}

/// The subdirectory of a run directory that holds its traces.
pub const RUN_TRACE_DIR: &str = perfkit_profiler::summary::TRACE_DIR;

/// [`perfkit_profiler::trace_files`], its I/O error named by `path`.
fn list_traces(path: &Path) -> Result<Vec<PathBuf>> {
    perfkit_profiler::trace_files(path).map_err(|e| match e {
        perfkit_profiler::ReadError::Io { source, .. } => Error::io(path, source),
        // Listing a directory only does I/O.
        other => Error::io(path, std::io::Error::other(other.to_string())),
    })
}

/// Most processes shown in the timeline of a multi-process run.
pub const MAX_TIMELINE_PROCESSES: usize = 8;

/// Analyses one trace file (first pass).
pub fn analyze_file(path: &Path, options: &AnalyzeOptions) -> Result<ProcessAnalysis> {
    analyze_source(TraceSource::open(path)?, options)
}

/// [`analyze_file`] of a trace already opened.
fn analyze_source(src: TraceSource, options: &AnalyzeOptions) -> Result<ProcessAnalysis> {
    let step = options
        .step_span
        .clone()
        .unwrap_or_else(|| src.step_span().to_owned());
    let meta = src.meta().clone();
    let mut ingest = ProcessIngest::new(&step);
    let outcome = src.run(&mut |event| ingest.push(event));
    Ok(ingest.finish(meta, outcome, options))
}

/// Analyses a trace file or a directory of trace files (one per process) as one run.
pub fn analyze_path(path: &Path, options: &AnalyzeOptions) -> Result<Analysis> {
    let files = discover(path)?;
    let mut processes = Vec::with_capacity(files.len());
    // Each analysis's trace file, found again after `assemble` reorders the processes.
    let mut origin: Vec<(PathBuf, String, u32)> = Vec::with_capacity(files.len());
    let mut unreadable = Vec::new();
    let mut first_error = None;
    for file in &files {
        // One unreadable file (a worker killed before its first write) does not hide the
        // others: it is named, and the run is incomplete.
        let src = match TraceSource::open(file) {
            Ok(src) => src,
            Err(err) => {
                unreadable.push(crate::model::UnreadableTrace {
                    file: file.display().to_string(),
                    error: err.to_string(),
                });
                first_error.get_or_insert(err);
                continue;
            }
        };
        // Auxiliary traces (a GPU sampler's) are not processes of the program.
        if files.len() > 1 && src.role().is_some() {
            continue;
        }
        let p = analyze_source(src, options)?;
        origin.push((file.clone(), p.meta.file.clone(), p.meta.pid));
        processes.push(p);
    }
    if processes.is_empty()
        && let Some(err) = first_error
    {
        return Err(err);
    }
    let mut analysis = assemble(path.display().to_string(), processes);
    analysis.source_path = path.to_path_buf();
    analysis.complete &= unreadable.is_empty();
    analysis.unreadable = unreadable;
    analysis.files = analysis
        .processes
        .iter()
        .filter_map(|a| {
            origin
                .iter()
                .find(|(_, file, pid)| *file == a.meta.file && *pid == a.meta.pid)
                .map(|(path, ..)| path.clone())
        })
        .collect();
    // The primary process: the first (by rank, then start) that ran steps. Its chosen steps
    // are shown for it and, on the common wall clock, for up to `MAX_TIMELINE_PROCESSES - 1`
    // other processes.
    let primary_index = analysis
        .processes
        .iter()
        .position(|p| !p.timeline_windows.is_empty());
    if let Some(i) = primary_index
        && analysis.files.len() == analysis.processes.len()
    {
        let primary = &analysis.processes[i];
        let windows = primary.timeline_windows.clone();
        let several = analysis.processes.len() > 1;
        let mut order: Vec<usize> = vec![i];
        order.extend((0..analysis.processes.len()).filter(|&j| j != i));
        order.truncate(MAX_TIMELINE_PROCESSES);
        let mut timeline = crate::model::Timeline {
            process: primary.meta.label(),
            windows: windows.clone(),
            tracks: Vec::new(),
        };
        if order.len() > 1 {
            timeline.process = format!(
                "{} and {} more (aligned on the wall clock)",
                timeline.process,
                order.len() - 1
            );
        }
        let base = primary.offset_ns;
        for j in order {
            let p = &analysis.processes[j];
            // Window times on this process's own clock.
            let shift = |t: u64| (t + base).saturating_sub(p.offset_ns);
            let local: Vec<_> = windows
                .iter()
                .map(|w| crate::model::TimelineWindow {
                    start_ns: shift(w.start_ns),
                    end_ns: shift(w.end_ns),
                    ..w.clone()
                })
                .collect();
            let mut collector = TimelineCollector::new(local, options.max_timeline_items);
            TraceSource::open(&analysis.files[j])?.run(&mut |event| collector.push(event));
            let part = collector.finish(p.meta.label());
            for (w, pw) in timeline.windows.iter_mut().zip(&part.windows) {
                w.truncated += pw.truncated;
            }
            for mut track in part.tracks {
                if several {
                    track.name = format!("{} {}", p.meta.label(), track.name);
                }
                for item in &mut track.items {
                    item.start_ns = (item.start_ns + p.offset_ns).saturating_sub(base);
                }
                timeline.tracks.push(track);
            }
        }
        analysis.timeline = timeline;
    }
    Ok(analysis)
}

/// Puts analysed processes together: orders them (rank, then start), aligns them on the
/// wall clock and compares their steps.
pub fn assemble(source: String, mut processes: Vec<ProcessAnalysis>) -> Analysis {
    processes.sort_by(|a, b| {
        (
            a.meta.rank.is_none(),
            a.meta.rank,
            a.meta.start_unix_ns,
            &a.meta.file,
        )
            .cmp(&(
                b.meta.rank.is_none(),
                b.meta.rank,
                b.meta.start_unix_ns,
                &b.meta.file,
            ))
    });
    let start = processes
        .iter()
        .map(|p| p.meta.start_unix_ns)
        .min()
        .unwrap_or(0);
    let mut end = 0;
    for p in &mut processes {
        p.offset_ns = p.meta.start_unix_ns - start;
        end = end.max(p.offset_ns + p.duration_ns);
    }
    let ranks = compare_ranks(&processes);
    Analysis {
        source,
        start_unix_ns: start,
        duration_ns: end,
        complete: processes.iter().all(|p| p.complete),
        processes,
        ranks,
        timeline: Timeline::default(),
        files: Vec::new(),
        source_path: std::path::PathBuf::new(),
        unreadable: Vec::new(),
    }
}

fn compare_ranks(processes: &[ProcessAnalysis]) -> Option<RankComparison> {
    let with_steps: Vec<&ProcessAnalysis> = processes
        .iter()
        .filter(|p| p.steps.duration.count > 0)
        .collect();
    if with_steps.len() < 2 {
        return None;
    }
    // Per step index, which process was slowest (only exact per-step series).
    let mut slowest: HashMap<u64, (u64, usize)> = HashMap::new();
    for (i, p) in with_steps.iter().enumerate() {
        if p.steps.series_bucket != 1 {
            continue;
        }
        for s in &p.steps.series {
            let e = slowest.entry(s.index).or_insert((0, i));
            if s.breakdown.wall_ns > e.0 {
                *e = (s.breakdown.wall_ns, i);
            }
        }
    }
    let mut counts = vec![0u64; with_steps.len()];
    for (_, i) in slowest.values() {
        counts[*i] += 1;
    }
    let rows: Vec<RankRow> = with_steps
        .iter()
        .zip(counts)
        .map(|(p, slowest_in_steps)| RankRow {
            label: p.meta.label(),
            host: p.meta.host.clone(),
            steps: p.steps.duration.clone(),
            slowest_in_steps,
        })
        .collect();
    let (worst, _) = rows
        .iter()
        .enumerate()
        .max_by_key(|(i, r)| (r.steps.median_ns, std::cmp::Reverse(*i)))?;
    let others: Vec<u64> = rows
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != worst)
        .map(|(_, r)| r.steps.median_ns)
        .collect();
    let typical = Distribution::of(&others).median_ns;
    let excess = if typical > 0 {
        rows[worst].steps.median_ns as f64 / typical as f64 - 1.0
    } else {
        0.0
    };
    Some(RankComparison {
        straggler: rows[worst].label.clone(),
        straggler_excess_percent: crate::ingest::round2(excess * 100.0),
        rows,
    })
}
