//! `summary.json` (schema `perfkit-summary`, version 1), `summary.md` and the terminal table.
//!
//! The schema is documented in `docs/summary-format.md`. Fields are only ever added within
//! a version; a reader accepts any file whose `version` it knows.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::findings::Finding;
use crate::format;
use crate::model::{Analysis, ProcessAnalysis, RankComparison};

/// The value of the `schema` field.
pub const SCHEMA: &str = perfkit_profiler::summary::SCHEMA;
/// The schema version this crate writes.
pub const VERSION: u32 = perfkit_profiler::summary::VERSION;

/// The core of `summary.json` (run, steps, span tables per process), built by the profiler.
pub type CoreSummary = perfkit_profiler::summary::Summary;

/// The content of `summary.json`: the profiler's core fields at the top level, plus the
/// `analysis` and `findings` sections added by the reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Run, steps and spans (schema, version, run, steps, spans, processes, files, ...).
    #[serde(flatten)]
    pub core: CoreSummary,
    /// The full analysis: GPU, copies, kernels, syncs, memory, stacks, ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisSection>,
    /// Findings (runtime and lint); an empty list means none.
    #[serde(default)]
    pub findings: Vec<Finding>,
}

/// The `analysis` section of `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnalysisSection {
    /// Tool that wrote it, e.g. `perfkit 0.1.0`.
    pub generator: String,
    /// Where the traces came from.
    pub source: String,
    /// `synthetic (simulated GPU timings)` when a trace says its GPU timings were simulated;
    /// absent for a recorded run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<String>,
    /// Wall-clock start of the run (Unix epoch, ns).
    pub start_unix_ns: u64,
    /// Run duration, ns.
    pub duration_ns: u64,
    /// False when a trace was cut short.
    pub complete: bool,
    /// Per process.
    pub processes: Vec<ProcessAnalysis>,
    /// Per-rank step comparison.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<RankComparison>,
    /// Trace files that could not be read at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<crate::model::UnreadableTrace>,
    /// Why the run is incomplete, one sentence each (empty when complete).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incomplete_reasons: Vec<String>,
    /// What the reports leave out or show in part without the run being incomplete (stacks
    /// cut at the depth limit, malformed GPU records), one sentence each; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl AnalysisSection {
    /// The section of an analysis.
    pub fn new(analysis: &Analysis) -> Self {
        Self {
            generator: format!("perfkit {}", env!("CARGO_PKG_VERSION")),
            source: analysis.source.clone(),
            timings: analysis
                .is_synthetic()
                .then(|| crate::model::SYNTHETIC_NOTE.to_owned()),
            start_unix_ns: analysis.start_unix_ns,
            duration_ns: analysis.duration_ns,
            complete: analysis.complete,
            processes: analysis.processes.clone(),
            ranks: analysis.ranks.clone(),
            unreadable: analysis.unreadable.clone(),
            incomplete_reasons: analysis.incomplete_reasons(),
            notes: analysis.notes(),
        }
    }
}

impl Summary {
    /// The summary of an analysis, around the profiler's core summary of the same traces.
    pub fn new(analysis: &Analysis, core: CoreSummary, findings: &[Finding]) -> Self {
        Self {
            core,
            analysis: Some(AnalysisSection::new(analysis)),
            findings: findings.to_vec(),
        }
    }

    /// The core summary of the traces an analysis was read from (a pass of the profiler's
    /// own span aggregation over the same files).
    pub fn core_of(analysis: &Analysis) -> Result<CoreSummary> {
        let step = analysis
            .processes
            .first()
            .map(|p| p.steps.span_name.clone());
        CoreSummary::from_traces(&analysis.source_path, step.as_deref()).map_err(|e| {
            Error::Summary {
                path: analysis.source_path.clone(),
                message: e.to_string(),
            }
        })
    }

    /// The analysed processes (empty when the file has no `analysis` section).
    pub fn processes(&self) -> &[ProcessAnalysis] {
        self.analysis.as_ref().map_or(&[], |a| &a.processes)
    }

    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            // Serialising plain data cannot fail; keep a valid document if it ever does.
            format!("{{\"error\":{}}}", serde_json::Value::String(e.to_string()))
        });
        s.push('\n');
        s
    }

    /// Parses a `summary.json`, checking schema and version.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::Summary {
            path: path.to_path_buf(),
            message: format!("not valid JSON: {e}"),
        })?;
        if value.get("schema").and_then(|v| v.as_str()) != Some(SCHEMA) {
            return Err(Error::Summary {
                path: path.to_path_buf(),
                message: format!("not a perfkit summary (missing `\"schema\": \"{SCHEMA}\"`)"),
            });
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version != u64::from(VERSION) {
            return Err(Error::Summary {
                path: path.to_path_buf(),
                message: format!(
                    "summary version {version} is not supported (this perfkit reads version {VERSION})"
                ),
            });
        }
        serde_json::from_value(value).map_err(|e| Error::Summary {
            path: path.to_path_buf(),
            message: format!("invalid summary: {e}"),
        })
    }

    /// Reads and parses a `summary.json` file.
    ///
    /// A path that is not a regular file (a FIFO, a device) is refused before it is opened:
    /// reading it would block.
    pub fn load(path: &Path) -> Result<Self> {
        let text = perfkit_profiler::reader::require_regular_file(path)
            .and_then(|()| std::fs::read_to_string(path))
            .map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }
}

/// The process with the slowest median step (the straggler), else the first process.
pub fn pace_process(processes: &[ProcessAnalysis]) -> Option<&ProcessAnalysis> {
    pace_index(processes).map(|i| &processes[i])
}

/// The index of [`pace_process`].
pub fn pace_index(processes: &[ProcessAnalysis]) -> Option<usize> {
    processes
        .iter()
        .enumerate()
        .filter(|(_, p)| p.steps.duration.count > 0)
        .max_by_key(|(_, p)| p.steps.duration.median_ns)
        .map(|(i, _)| i)
        .or((!processes.is_empty()).then_some(0))
}

fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '`' => out.push('\''),
            '\n' | '\r' => out.push(' '),
            '*' | '_' | '[' | ']' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Why the run is incomplete: the launcher's reasons (how the program ended, every trace
/// that was cut short, damaged or unreadable), then what the analysis found that they do not
/// name already.
pub fn incomplete_reasons(summary: &Summary) -> Vec<String> {
    let mut out = summary.core.run.incomplete_reasons.clone();
    if let Some(analysis) = &summary.analysis {
        for u in &analysis.unreadable {
            let name = std::path::Path::new(&u.file)
                .file_name()
                .map_or(u.file.clone(), |n| n.to_string_lossy().into_owned());
            if !out.iter().any(|r| r.contains(&name)) {
                out.push(u.describe());
            }
        }
        if out.is_empty() {
            out.extend(analysis.incomplete_reasons.iter().cloned());
        }
    }
    out
}

/// `summary.md`: a compact Markdown report for pull requests and `$GITHUB_STEP_SUMMARY`.
pub fn markdown(summary: &Summary, top: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## perfkit report\n");
    if summary
        .analysis
        .as_ref()
        .is_some_and(|a| a.timings.is_some() || a.processes.iter().any(|p| p.meta.synthetic))
    {
        let _ = writeln!(
            md,
            "**{}:** not measured on a GPU.\n",
            crate::model::SYNTHETIC_NOTE
        );
    }
    let processes = summary.processes();
    let run = &summary.core.run;
    let exit = run
        .exit
        .as_ref()
        .map_or(String::new(), |e| format!(", {}", e.description));
    let _ = writeln!(
        md,
        "`{}`: {} process{}, {} wall{exit}{}\n",
        run.program.replace('`', "'"),
        processes.len(),
        if processes.len() == 1 { "" } else { "es" },
        format::duration(run.wall_time_ns),
        if incomplete_reasons(summary).is_empty() && !run.incomplete {
            ""
        } else {
            " (incomplete run)"
        }
    );
    let reasons = incomplete_reasons(summary);
    if !reasons.is_empty() {
        let _ = writeln!(md, "**Incomplete run:**\n");
        for reason in &reasons {
            let _ = writeln!(md, "- {}", md_escape(reason));
        }
        let _ = writeln!(md);
    }
    let notes = summary.analysis.as_ref().map_or(&[][..], |a| &a.notes[..]);
    if !notes.is_empty() {
        let _ = writeln!(md, "**Notes:**\n");
        for note in notes {
            let _ = writeln!(md, "- {}", md_escape(note));
        }
        let _ = writeln!(md);
    }
    for p in processes {
        process_markdown(&mut md, p, processes.len() > 1, top);
    }
    if let Some(ranks) = summary.analysis.as_ref().and_then(|a| a.ranks.as_ref()) {
        let _ = writeln!(md, "### Ranks\n");
        let _ = writeln!(
            md,
            "Straggler: **{}** (median step {} slower than the others' median)\n",
            md_escape(&ranks.straggler),
            format::signed_percent(ranks.straggler_excess_percent / 100.0)
        );
        let _ = writeln!(
            md,
            "| process | host | steps | median | p95 | slowest in steps |"
        );
        let _ = writeln!(md, "|---|---|---:|---:|---:|---:|");
        for r in &ranks.rows {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                md_escape(&r.label),
                md_escape(&r.host),
                r.steps.count,
                format::duration(r.steps.median_ns),
                format::duration(r.steps.p95_ns),
                r.slowest_in_steps
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "### Findings\n");
    if summary.findings.is_empty() {
        let _ = writeln!(md, "No findings.");
    } else {
        let _ = writeln!(md, "| code | severity | where | message | cost per step |");
        let _ = writeln!(md, "|---|---|---|---|---:|");
        for f in &summary.findings {
            let _ = writeln!(
                md,
                "| {} {} | {} | {} | {} | {} |",
                md_escape(&f.code),
                md_escape(&f.name),
                f.severity.as_str(),
                md_escape(f.location.as_deref().unwrap_or("")),
                md_escape(&f.message),
                f.cost_per_step_ns.map(format::duration).unwrap_or_default()
            );
        }
    }
    md
}

fn process_markdown(md: &mut String, p: &ProcessAnalysis, several: bool, top: usize) {
    if several {
        let _ = writeln!(
            md,
            "### {} ({})\n",
            md_escape(&p.meta.label()),
            md_escape(&p.meta.host)
        );
    }
    let s = &p.steps.duration;
    if s.count > 0 {
        let _ = writeln!(
            md,
            "| steps | mean | median | p95 | min | max | spread (MAD) |\n|---:|---:|---:|---:|---:|---:|---:|\n| {} | {} | {} | {} | {} | {} | {} |\n",
            s.count,
            format::duration(s.mean_ns),
            format::duration(s.median_ns),
            format::duration(s.p95_ns),
            format::duration(s.min_ns),
            format::duration(s.max_ns),
            format::duration(s.mad_ns)
        );
    } else {
        let _ = writeln!(
            md,
            "No `{}` spans recorded: step statistics unavailable.\n",
            md_escape(&p.steps.span_name)
        );
    }
    let g = &p.gpu;
    if g.busy_ns > 0 || !p.kernels.is_empty() || p.copies.total.count > 0 {
        let t = &g.in_steps;
        let share = |v: u64| {
            if t.wall_ns == 0 {
                "-".to_owned()
            } else {
                format::percent(v as f64 / t.wall_ns as f64)
            }
        };
        let _ = writeln!(
            md,
            "GPU busy {} of {} ({}), longest idle gap {}.\n",
            format::duration(g.busy_ns),
            format::duration(g.window_ns),
            format::percent(g.utilization_percent / 100.0),
            format::duration(g.longest_gap_ns)
        );
        let _ = writeln!(
            md,
            "| in steps | kernels | copies | sync wait | idle | host blocked in syncs |\n|---|---:|---:|---:|---:|---:|\n| share of step time | {} | {} | {} | {} | {} |\n",
            share(t.kernel_ns),
            share(t.copy_ns),
            share(t.sync_wait_ns),
            share(t.idle_ns),
            share(t.sync_blocked_ns)
        );
    }
    if !p.spans.is_empty() {
        let _ = writeln!(
            md,
            "| span | calls | total | self | mean |\n|---|---:|---:|---:|---:|"
        );
        for sp in p.spans.iter().take(top) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                md_escape(&sp.name),
                sp.calls,
                format::duration(sp.total_ns),
                format::duration(sp.self_ns),
                format::duration(sp.mean_ns)
            );
        }
        md.push('\n');
    }
    if !p.kernels.is_empty() {
        let _ = writeln!(
            md,
            "| kernel | count | total | mean | min | max |\n|---|---:|---:|---:|---:|---:|"
        );
        for k in p.kernels.iter().take(top) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                md_escape(&k.name),
                k.count,
                format::duration(k.total_ns),
                format::duration(k.mean_ns),
                format::duration(k.min_ns),
                format::duration(k.max_ns)
            );
        }
        md.push('\n');
    }
    if !p.copies.by_kind.is_empty() {
        let _ = writeln!(
            md,
            "| copies | count | bytes | GPU time | bandwidth |\n|---|---:|---:|---:|---:|"
        );
        for c in &p.copies.by_kind {
            let _ = writeln!(
                md,
                "| {} {} | {} | {} | {} | {} |",
                c.direction.as_str(),
                pinned_label(c.pinned),
                c.totals.count,
                format::bytes(c.totals.bytes),
                format::duration(c.totals.gpu_ns),
                format::rate_gbps(c.bandwidth_gbps)
            );
        }
        md.push('\n');
        let _ = writeln!(
            md,
            "| copy site | kind | count | bytes | GPU time |\n|---|---|---:|---:|---:|"
        );
        let mut bounded = false;
        for c in p.copies.by_site.iter().take(top) {
            let mark = if c.gpu_end_at_host_return > 0 {
                bounded = true;
                " ≤"
            } else {
                ""
            };
            let _ = writeln!(
                md,
                "| {} | {} {} | {} | {} | {}{} |",
                md_escape(&c.location),
                c.direction.as_str(),
                pinned_label(c.pinned),
                c.totals.count,
                format::bytes(c.totals.bytes),
                format::duration(c.totals.gpu_ns),
                mark
            );
        }
        md.push('\n');
        if bounded {
            let _ = writeln!(
                md,
                "≤: the GPU time of some of these blocking copies ends at the host return (an upper bound: the copy was over when the call returned).\n"
            );
        }
    }
    if p.syncs.count > 0 {
        let _ = writeln!(
            md,
            "{} synchronizations blocked the host for {}.\n",
            p.syncs.count,
            format::duration(p.syncs.blocked_ns)
        );
    }
    if p.memory.allocs > 0 {
        let _ = writeln!(
            md,
            "Device memory high-water mark: {} ({} allocations, {} frees).\n",
            format::bytes(p.memory.peak_bytes),
            p.memory.allocs,
            p.memory.frees
        );
    }
    if p.dropped_events > 0 {
        let _ = writeln!(
            md,
            "**{} events were dropped** by the recorder (its queue was full); totals undercount.\n",
            p.dropped_events
        );
    }
}

/// `pinned`, `pageable` or empty (device to device).
pub fn pinned_label(pinned: Option<bool>) -> &'static str {
    match pinned {
        Some(true) => "pinned",
        Some(false) => "pageable",
        None => "",
    }
}

/// The terminal summary: steps and a span table in the style of Lightning's SimpleProfiler.
pub fn terminal_table(analysis: &Analysis, top: usize) -> String {
    let mut out = String::new();
    if analysis.is_synthetic() {
        let _ = writeln!(
            out,
            "{}: not measured on a GPU",
            crate::model::SYNTHETIC_NOTE
        );
    }
    for p in &analysis.processes {
        if analysis.processes.len() > 1 {
            let _ = writeln!(out, "{} ({}):", p.meta.label(), p.meta.host);
        }
        let s = &p.steps.duration;
        if s.count > 0 {
            let _ = writeln!(
                out,
                "steps: {}  mean {}  median {}  p95 {}  spread (MAD) {}",
                s.count,
                format::duration(s.mean_ns),
                format::duration(s.median_ns),
                format::duration(s.p95_ns),
                format::duration(s.mad_ns)
            );
        }
        if p.gpu.busy_ns > 0 {
            let _ = writeln!(
                out,
                "GPU busy {} ({}), copies {} in {} ops, syncs blocked {}",
                format::duration(p.gpu.busy_ns),
                format::percent(p.gpu.utilization_percent / 100.0),
                format::bytes(p.copies.total.bytes),
                p.copies.total.count,
                format::duration(p.syncs.blocked_ns)
            );
        }
        let wall = p.duration_ns.max(1) as f64;
        let width = p
            .spans
            .iter()
            .take(top)
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(6)
            .clamp(6, 40);
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>9}  {:>12}  {:>12}  {:>7}",
            "Action", "Mean", "Calls", "Total", "Self", "% wall"
        );
        for sp in p.spans.iter().take(top) {
            let name: String = sp
                .name
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .take(40)
                .collect();
            let _ = writeln!(
                out,
                "{:<width$}  {:>12}  {:>9}  {:>12}  {:>12}  {:>6.1}%",
                name,
                format::duration(sp.mean_ns),
                sp.calls,
                format::duration(sp.total_ns),
                format::duration(sp.self_ns),
                sp.total_ns as f64 / wall * 100.0
            );
        }
        if p.dropped_events > 0 {
            let _ = writeln!(out, "dropped events: {}", p.dropped_events);
        }
    }
    if let Some(r) = &analysis.ranks {
        let _ = writeln!(
            out,
            "straggler: {} (median step {} vs the others)",
            r.straggler,
            format::signed_percent(r.straggler_excess_percent / 100.0)
        );
    }
    out
}
