//! Comparing two runs: per-span and per-operation deltas, the step-time change against a
//! noise estimate, and differential flamegraphs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::flame::{self, FlameKind};
use crate::format;
use crate::html::escape_text;
use crate::ingest::round3;
use crate::model::Analysis;
use crate::model::ProcessAnalysis;
use crate::summary::{Summary, pace_process, pinned_label};

/// One side of a comparison: the analysed processes of a run.
#[derive(Debug, Clone)]
pub struct Run {
    /// Where the run came from.
    pub source: String,
    /// Its processes.
    pub processes: Vec<ProcessAnalysis>,
    /// Why the run is incomplete, one sentence each (empty when complete).
    pub incomplete: Vec<String>,
}

impl Run {
    /// The run of an analysis.
    pub fn of_analysis(a: &Analysis) -> Self {
        Self {
            source: a.source.clone(),
            processes: a.processes.clone(),
            incomplete: a.incomplete_reasons(),
        }
    }

    /// The run of a `summary.json` (its `analysis` section, which must be present).
    pub fn of_summary(s: &Summary, path: &Path) -> Result<Self> {
        match &s.analysis {
            Some(a) => {
                let mut incomplete = crate::summary::incomplete_reasons(s);
                if incomplete.is_empty() && !a.complete {
                    incomplete.push("a trace was cut short".to_owned());
                }
                Ok(Self {
                    // The file given, not the traces it was made from: those were not read.
                    source: path.display().to_string(),
                    processes: a.processes.clone(),
                    incomplete,
                })
            }
            // A run with no trace has nothing `perfkit report` could read: say how to record one.
            None if !s.core.instrumented => Err(Error::Summary {
                path: path.to_path_buf(),
                message: format!(
                    "the run wrote no trace, so it has no measurements to compare: the program is not \
                     instrumented with perfkit-profiler (or never called `perfkit_profiler::init()`), \
                     and no CUDA activity was captured through CUPTI injection (`perfkit profile` \
                     injects it into a CUDA program unless `--no-inject` is given). To record it:\n{}",
                    perfkit_profiler::summary::INSTRUMENT_HINT
                ),
            }),
            None => Err(Error::Summary {
                path: path.to_path_buf(),
                message: "the summary has no `analysis` section; run `perfkit report` on the run's traces first".to_owned(),
            }),
        }
    }
}

/// The value of the `schema` field of `diff.json`.
pub const SCHEMA: &str = "perfkit-diff";
/// The schema version of `diff.json`.
pub const VERSION: u32 = 1;

/// How many standard errors a step-time change must exceed to count as real.
pub const NOISE_SIGMAS: f64 = 2.0;

/// The comparison of two runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiffReport {
    /// Always `perfkit-diff`.
    pub schema: String,
    /// Schema version.
    pub version: u32,
    /// The base run.
    pub base: String,
    /// The new run.
    pub new: String,
    /// Step-time change, when both runs have steps.
    pub steps: Option<StepDelta>,
    /// Whole-run GPU and operation totals.
    pub operations: Vec<Delta>,
    /// Per span name: host self time (time in the span minus its child spans, so a change
    /// shows in the span where it happens), per step when both runs have steps.
    ///
    /// A per-step figure (`ns/step`) is per process: the run's total divided by the steps of
    /// all its processes (each rank's step counts once), so a span of a two-rank run is not
    /// shown twice as long as the step. How the processes that step differ is given apart, in
    /// each row's `base_ranks` / `new_ranks`.
    pub spans: Vec<Delta>,
    /// Per kernel (GPU time).
    pub kernels: Vec<Delta>,
    /// Per copy source line and kind (GPU time).
    pub copies: Vec<Delta>,
    /// Per synchronization source line (host blocked time).
    pub syncs: Vec<Delta>,
    /// Why the base run is incomplete (empty when complete).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base_incomplete: Vec<String>,
    /// Why the new run is incomplete (empty when complete).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_incomplete: Vec<String>,
    /// Events the base run's recorder dropped (its figures undercount); absent when none.
    #[serde(default, skip_serializing_if = "crate::model::is_zero")]
    pub base_dropped_events: u64,
    /// Events the new run's recorder dropped (its figures undercount); absent when none.
    #[serde(default, skip_serializing_if = "crate::model::is_zero")]
    pub new_dropped_events: u64,
    /// What the base run's figures leave out or show in part without it being incomplete
    /// (stacks cut at the depth limit, malformed GPU records); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base_notes: Vec<String>,
    /// The same for the new run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub new_notes: Vec<String>,
}

impl DiffReport {
    /// One line per incomplete run (`base run INCOMPLETE: ...`), per run whose recorder
    /// dropped events (`UNDERCOUNTS`) and per run with notes (`NOTE`).
    pub fn incomplete_lines(&self) -> Vec<String> {
        [
            ("base", &self.base_incomplete),
            ("new", &self.new_incomplete),
        ]
        .into_iter()
        .filter(|(_, reasons)| !reasons.is_empty())
        .map(|(which, reasons)| format!("{which} run INCOMPLETE: {}", reasons.join("; ")))
        .chain(
            [
                ("base", self.base_dropped_events),
                ("new", self.new_dropped_events),
            ]
            .into_iter()
            .filter(|(_, dropped)| *dropped > 0)
            .map(|(which, dropped)| format!("{which} run UNDERCOUNTS: {}", dropped_line(dropped))),
        )
        .chain(
            [("base", &self.base_notes), ("new", &self.new_notes)]
                .into_iter()
                .filter(|(_, notes)| !notes.is_empty())
                .map(|(which, notes)| format!("{which} run NOTE: {}", notes.join("; "))),
        )
        .collect()
    }
}

/// Why a run's figures undercount, when its recorder dropped `dropped` events.
pub fn dropped_line(dropped: u64) -> String {
    format!(
        "the recorder dropped {dropped} event{} (its queue was full), so its figures undercount",
        if dropped == 1 { "" } else { "s" }
    )
}

impl Run {
    /// What the run's figures leave out or show in part without it being incomplete (see
    /// [`Analysis::notes`]).
    pub fn notes(&self) -> Vec<String> {
        crate::model::process_notes(&self.processes)
    }

    /// Events the run's recorders dropped, over all its processes.
    pub fn dropped_events(&self) -> u64 {
        self.processes
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.dropped_events))
    }
}

/// Change of the median step time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepDelta {
    /// Steps in the base run.
    pub base_count: u64,
    /// Steps in the new run.
    pub new_count: u64,
    /// Base median step time.
    pub base_median_ns: u64,
    /// New median step time.
    pub new_median_ns: u64,
    /// `new - base`.
    pub delta_ns: i64,
    /// `new / base - 1`; absent when the base median is 0 (no ratio to give).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<f64>,
    /// The change that run-to-run variation could explain: the noise floor of `perfkit check`
    /// (one run per side: `noise-floor` of `[check]`, default 50 % of the base median), or
    /// [`NOISE_SIGMAS`] standard errors of the difference of the medians from each run's
    /// per-step spread where that is wider.
    pub noise_ns: u64,
    /// `slower`, `faster` or `within noise`, as `perfkit check` decides it (a change must
    /// exceed the noise and the minimum effect).
    pub verdict: String,
    /// Why, in one sentence (the test, the noise, the thresholds).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub evidence: String,
}

/// The change of one measured quantity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Delta {
    /// What is measured (span or kernel name, `file:line H2D pageable`, ...).
    pub name: String,
    /// Unit of `base` and `new`: `ns`, `ns/step`, `bytes`, `count`, `share`.
    pub unit: String,
    /// Value in the base run.
    pub base: f64,
    /// Value in the new run.
    pub new: f64,
    /// `new - base`.
    pub delta: f64,
    /// `new / base - 1` (absent when the base is 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<f64>,
    /// The spread of a per-step figure across the base run's processes that step (present
    /// when two or more do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ranks: Option<Spread>,
    /// The same for the new run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_ranks: Option<Spread>,
}

/// How a per-step figure differs across the processes (ranks) of one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    /// Processes that step.
    pub processes: u32,
    /// The lowest per-step value of one process.
    pub min: f64,
    /// The highest per-step value of one process.
    pub max: f64,
}

impl Delta {
    fn new(name: String, unit: &str, base: f64, new: f64) -> Self {
        Self {
            name,
            unit: unit.to_owned(),
            base: round3(base),
            new: round3(new),
            delta: round3(new - base),
            change: (base != 0.0).then(|| round3(new / base - 1.0)),
            base_ranks: None,
            new_ranks: None,
        }
    }

    fn with_spread(mut self, base: Option<Spread>, new: Option<Spread>) -> Self {
        self.base_ranks = base;
        self.new_ranks = new;
        self
    }

    /// `min..max` across the ranks of the base and new runs (`-` for a run with one).
    fn show_ranks(&self) -> String {
        let one = |s: &Option<Spread>| match s {
            Some(s) => format!("{}..{}", self.show(s.min), self.show(s.max)),
            None => "-".to_owned(),
        };
        format!("{} | {}", one(&self.base_ranks), one(&self.new_ranks))
    }

    fn show(&self, v: f64) -> String {
        match self.unit.as_str() {
            "ns" | "ns/step" => format::duration(v.max(0.0) as u64),
            "bytes" => format::bytes(v.max(0.0) as u64),
            "share" => format::percent(v),
            _ => format!("{v}"),
        }
    }

    fn show_delta(&self) -> String {
        match self.unit.as_str() {
            "ns" | "ns/step" => format::signed_duration(self.delta as i128),
            "bytes" => {
                let sign = if self.delta < 0.0 { "-" } else { "+" };
                format!("{sign}{}", format::bytes(self.delta.abs() as u64))
            }
            "share" => format!("{:+.1} pt", self.delta * 100.0),
            _ => format!("{:+}", self.delta),
        }
    }
}

/// Where a run to compare comes from.
#[derive(Debug)]
pub enum RunInput {
    /// A `summary.json` file, or a directory holding one and no traces.
    Summary(PathBuf),
    /// A trace file or a directory of traces.
    Traces(PathBuf),
}

impl RunInput {
    /// Classifies a path given on the command line.
    pub fn classify(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            let has_traces = crate::analyze::discover(path).is_ok();
            let summary = path.join("summary.json");
            if !has_traces && summary.is_file() {
                return Ok(RunInput::Summary(summary));
            }
            return Ok(RunInput::Traces(path.to_path_buf()));
        }
        if path.extension().is_some_and(|e| e == "json") {
            Ok(RunInput::Summary(path.to_path_buf()))
        } else {
            Ok(RunInput::Traces(path.to_path_buf()))
        }
    }

    /// Loads the run (analysing traces when needed).
    pub fn load(&self, options: &crate::AnalyzeOptions) -> Result<Run> {
        match self {
            RunInput::Summary(p) => Run::of_summary(&Summary::load(p)?, p),
            RunInput::Traces(p) => {
                let mut run = Run::of_analysis(&crate::analyze::analyze_path(p, options)?);
                // The traces cannot tell how the program ended; the summary that `perfkit
                // profile` wrote beside them can.
                if let Ok(summary) = Summary::load(&p.join("summary.json"))
                    && let Some(exit) = &summary.core.run.exit
                    && exit.signal.is_some()
                {
                    run.incomplete.insert(
                        0,
                        format!(
                            "the program was ended by {}",
                            exit.description.trim_start_matches("signal ")
                        ),
                    );
                }
                Ok(run)
            }
        }
    }
}

/// Each process's steps (0 for one that does not step).
fn steps_of(processes: &[ProcessAnalysis]) -> Vec<u64> {
    processes.iter().map(|p| p.steps.duration.count).collect()
}

/// One run's figure from its per-process values (`(steps, value)` per process): per step, the
/// total over the steps of every process that steps, with the spread across those processes;
/// else the plain total.
fn figure(values: &[(u64, u64)], per_step: bool) -> (f64, Option<Spread>) {
    let total: u64 = values.iter().map(|&(_, v)| v).sum();
    let steps: u64 = values.iter().map(|&(s, _)| s).sum();
    if !per_step || steps == 0 {
        return (total as f64, None);
    }
    let each: Vec<f64> = values
        .iter()
        .filter(|&&(s, _)| s > 0)
        .map(|&(s, v)| v as f64 / s as f64)
        .collect();
    let spread = (each.len() > 1).then(|| Spread {
        processes: each.len() as u32,
        min: round3(each.iter().copied().fold(f64::INFINITY, f64::min)),
        max: round3(each.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
    });
    (total as f64 / steps as f64, spread)
}

/// Compares two runs.
pub fn diff(base: &Run, new: &Run) -> DiffReport {
    diff_with(
        base,
        new,
        crate::gate::TimingOptions::from(&crate::gate::CheckConfig::default()),
    )
}

/// [`diff`] with the timing model's settings (`[check]` of `perfkit.toml`), so that
/// "slower", "faster" and "within noise" mean what they mean to `perfkit check`.
pub fn diff_with(base: &Run, new: &Run, timing: crate::gate::TimingOptions) -> DiffReport {
    let base_steps = steps_of(&base.processes);
    let new_steps = steps_of(&new.processes);
    let per_step = base_steps.iter().any(|&s| s > 0) && new_steps.iter().any(|&s| s > 0);
    let unit = if per_step { "ns/step" } else { "ns" };
    // A delta of one measure, from each run's per-process values.
    let measure = |name: String, u: &str, b: Vec<u64>, n: Vec<u64>, normalise: bool| {
        let side = |steps: &[u64], values: Vec<u64>| {
            let pairs: Vec<(u64, u64)> = steps.iter().copied().zip(values).collect();
            figure(&pairs, normalise && per_step)
        };
        let (bv, bspread) = side(&base_steps, b);
        let (nv, nspread) = side(&new_steps, n);
        Delta::new(name, u, bv, nv).with_spread(bspread, nspread)
    };

    let steps = match (pace_process(&base.processes), pace_process(&new.processes)) {
        (Some(b), Some(n)) if per_step => {
            let (db, dn) = (&b.steps.duration, &n.steps.duration);
            let se = (db.median_standard_error_ns().powi(2)
                + dn.median_standard_error_ns().powi(2))
            .sqrt();
            // The same model as `perfkit check`: one run per side is judged against the
            // noise floor (or the runs' own per-step spread where that is wider).
            let cmp = crate::gate::compare_timing(
                &[db.median_ns as f64],
                &[dn.median_ns as f64],
                db.median_ns as f64,
                se,
                timing,
            );
            let noise = (cmp.noise * db.median_ns as f64).round() as u64;
            let delta = dn.median_ns as i64 - db.median_ns as i64;
            let verdict = cmp.verdict.as_str();
            Some(StepDelta {
                base_count: db.count,
                new_count: dn.count,
                base_median_ns: db.median_ns,
                new_median_ns: dn.median_ns,
                delta_ns: delta,
                change: (db.median_ns > 0)
                    .then(|| round3(dn.median_ns as f64 / db.median_ns as f64 - 1.0)),
                noise_ns: noise,
                verdict: verdict.to_owned(),
                evidence: cmp.reason,
            })
        }
        _ => None,
    };

    // Keyed values of both runs, one map per process.
    fn collect<F>(ps: &[ProcessAnalysis], f: F) -> Vec<BTreeMap<String, u64>>
    where
        F: Fn(&ProcessAnalysis, &mut BTreeMap<String, u64>),
    {
        ps.iter()
            .map(|p| {
                let mut m = BTreeMap::new();
                f(p, &mut m);
                m
            })
            .collect()
    }
    let pair = |b: Vec<BTreeMap<String, u64>>, n: Vec<BTreeMap<String, u64>>| {
        let mut keys: Vec<&String> = b.iter().chain(&n).flat_map(|m| m.keys()).collect();
        keys.sort();
        keys.dedup();
        let values = |side: &[BTreeMap<String, u64>], k: &String| -> Vec<u64> {
            side.iter()
                .map(|m| m.get(k).copied().unwrap_or(0))
                .collect()
        };
        let mut out: Vec<Delta> = keys
            .into_iter()
            .map(|k| measure(k.clone(), unit, values(&b, k), values(&n, k), true))
            .collect();
        out.sort_by(|a, b| {
            b.delta
                .abs()
                .total_cmp(&a.delta.abs())
                .then(a.name.cmp(&b.name))
        });
        out
    };
    let span_totals = |p: &ProcessAnalysis, m: &mut BTreeMap<String, u64>| {
        for s in &p.spans {
            *m.entry(s.name.clone()).or_insert(0) += s.self_ns;
        }
    };
    let kernel_totals = |p: &ProcessAnalysis, m: &mut BTreeMap<String, u64>| {
        for k in &p.kernels {
            *m.entry(k.name.clone()).or_insert(0) += k.total_ns;
        }
    };
    let copy_totals = |p: &ProcessAnalysis, m: &mut BTreeMap<String, u64>| {
        for c in &p.copies.by_site {
            let key = format!(
                "{} {} {}",
                c.location,
                c.direction.as_str(),
                pinned_label(c.pinned)
            );
            *m.entry(key.trim_end().to_owned()).or_insert(0) += c.totals.gpu_ns;
        }
    };
    let sync_totals = |p: &ProcessAnalysis, m: &mut BTreeMap<String, u64>| {
        for s in &p.syncs.by_site {
            *m.entry(s.location.clone()).or_insert(0) += s.blocked_ns;
        }
    };

    let each =
        |ps: &[ProcessAnalysis], f: &dyn Fn(&ProcessAnalysis) -> u64| ps.iter().map(f).collect();
    let mut operations = Vec::new();
    type Measure<'a> = (&'a str, &'a dyn Fn(&ProcessAnalysis) -> u64, &'a str, bool);
    let ops: [Measure<'_>; 8] = [
        ("GPU busy", &|p| p.gpu.busy_ns, unit, true),
        (
            "kernel time",
            &|p| p.kernels.iter().map(|k| k.total_ns).sum(),
            unit,
            true,
        ),
        ("copy time", &|p| p.copies.total.gpu_ns, unit, true),
        ("copied bytes", &|p| p.copies.total.bytes, "bytes", false),
        ("copies", &|p| p.copies.total.count, "count", false),
        ("host blocked in syncs", &|p| p.syncs.blocked_ns, unit, true),
        ("synchronizations", &|p| p.syncs.count, "count", false),
        (
            "device memory peak",
            &|p| p.memory.peak_bytes,
            "bytes",
            false,
        ),
    ];
    for (name, f, u, normalise) in ops {
        let (b, n): (Vec<u64>, Vec<u64>) = (each(&base.processes, f), each(&new.processes, f));
        if b.iter().chain(&n).all(|&v| v == 0) {
            continue;
        }
        operations.push(measure(name.to_owned(), u, b, n, normalise));
    }
    let idle_share = |p: Option<&ProcessAnalysis>| {
        p.map_or(0.0, |p| {
            let t = &p.gpu.in_steps;
            if t.wall_ns == 0 {
                0.0
            } else {
                t.idle_ns as f64 / t.wall_ns as f64
            }
        })
    };
    let has_gpu = |s: &Run| s.processes.iter().any(|p| p.gpu.busy_ns > 0);
    if per_step && (has_gpu(base) || has_gpu(new)) {
        operations.push(Delta::new(
            "GPU idle share of step time".to_owned(),
            "share",
            idle_share(pace_process(&base.processes)),
            idle_share(pace_process(&new.processes)),
        ));
    }

    DiffReport {
        schema: SCHEMA.to_owned(),
        version: VERSION,
        base: base.source.clone(),
        new: new.source.clone(),
        base_incomplete: base.incomplete.clone(),
        new_incomplete: new.incomplete.clone(),
        base_dropped_events: base.dropped_events(),
        new_dropped_events: new.dropped_events(),
        base_notes: base.notes(),
        new_notes: new.notes(),
        steps,
        operations,
        spans: pair(
            collect(&base.processes, span_totals),
            collect(&new.processes, span_totals),
        ),
        kernels: pair(
            collect(&base.processes, kernel_totals),
            collect(&new.processes, kernel_totals),
        ),
        copies: pair(
            collect(&base.processes, copy_totals),
            collect(&new.processes, copy_totals),
        ),
        syncs: pair(
            collect(&base.processes, sync_totals),
            collect(&new.processes, sync_totals),
        ),
    }
}

impl DiffReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The one-line verdict on step time.
    pub fn headline(&self) -> String {
        match &self.steps {
            Some(s) => format!(
                "median step {} -> {} ({}, {}): {} (noise +/- {})",
                format::duration(s.base_median_ns),
                format::duration(s.new_median_ns),
                format::signed_duration(i128::from(s.delta_ns)),
                s.change.map_or("from 0".to_owned(), format::signed_percent),
                s.verdict,
                format::duration(s.noise_ns)
            ),
            None => "no steps in one of the runs: totals compared over the whole run".to_owned(),
        }
    }

    /// Plain-text rendering (top `top` rows per table).
    pub fn to_text(&self, top: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "base: {}\nnew:  {}\n{}",
            self.base,
            self.new,
            self.headline()
        );
        if let Some(steps) = self.steps.as_ref().filter(|s| !s.evidence.is_empty()) {
            let _ = writeln!(out, "  {}", steps.evidence);
        }
        for line in self.incomplete_lines() {
            let _ = writeln!(out, "{line}");
        }
        for (title, rows) in [
            ("operations", &self.operations),
            ("spans", &self.spans),
            ("kernels", &self.kernels),
            ("copies by source line", &self.copies),
            ("synchronizations by source line", &self.syncs),
        ] {
            let rows: Vec<&Delta> = rows
                .iter()
                .filter(|d| d.delta != 0.0 || d.base != 0.0)
                .take(top)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let width = rows
                .iter()
                .map(|d| d.name.chars().count())
                .max()
                .unwrap_or(4)
                .clamp(4, 48);
            let _ = writeln!(out, "\n{title}:");
            // Per-step figures are per process; how the ranks differ is shown apart.
            let ranks = rows
                .iter()
                .any(|d| d.base_ranks.is_some() || d.new_ranks.is_some());
            let _ = write!(
                out,
                "  {:<width$}  {:>14}  {:>14}  {:>14}  {:>9}",
                "name", "base", "new", "delta", "change"
            );
            let _ = writeln!(
                out,
                "{}",
                if ranks {
                    "  across ranks (base | new)"
                } else {
                    ""
                }
            );
            for d in rows {
                let name: String = d
                    .name
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .take(48)
                    .collect();
                let _ = write!(
                    out,
                    "  {:<width$}  {:>14}  {:>14}  {:>14}  {:>9}",
                    name,
                    d.show(d.base),
                    d.show(d.new),
                    d.show_delta(),
                    d.change.map_or("from 0".to_owned(), format::signed_percent)
                );
                if ranks {
                    let _ = write!(out, "  {}", d.show_ranks());
                }
                out.push('\n');
            }
        }
        out
    }

    /// A self-contained HTML page (no script at all), with the differential flamegraphs
    /// embedded as images.
    pub fn to_html(&self, flamegraphs: &[(&str, &[u8])]) -> String {
        let mut h = String::new();
        let nonce = crate::html::nonce();
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'none'; style-src 'nonce-{nonce}'; img-src data:; base-uri 'none'; form-action 'none'\">\n<title>perfkit diff</title><style nonce=\"{nonce}\">"
        );
        h.push_str(DIFF_CSS);
        h.push_str("</style></head><body>\n<h1>perfkit diff</h1>\n");
        let _ = writeln!(
            h,
            "<p>base: <code>{}</code><br>new: <code>{}</code></p>\n<p class=\"headline\">{}</p>",
            escape_text(&self.base),
            escape_text(&self.new),
            escape_text(&self.headline())
        );
        for line in self.incomplete_lines() {
            let _ = writeln!(
                h,
                "<p class=\"headline\"><strong>{}</strong></p>",
                escape_text(&line)
            );
        }
        for (title, rows) in [
            ("Operations", &self.operations),
            ("Spans", &self.spans),
            ("Kernels", &self.kernels),
            ("Copies by source line", &self.copies),
            ("Synchronizations by source line", &self.syncs),
        ] {
            if rows.is_empty() {
                continue;
            }
            let ranks = rows
                .iter()
                .any(|d| d.base_ranks.is_some() || d.new_ranks.is_some());
            let _ = writeln!(
                h,
                "<h2>{title}</h2><table><tr><th>name</th><th>base</th><th>new</th><th>delta</th><th>change</th>{}</tr>",
                if ranks {
                    "<th>across ranks (base | new)</th>"
                } else {
                    ""
                }
            );
            for d in rows.iter().take(100) {
                let cls = if d.delta > 0.0 {
                    "up"
                } else if d.delta < 0.0 {
                    "down"
                } else {
                    ""
                };
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{cls}\">{}</td><td class=\"{cls}\">{}</td>{}</tr>",
                    escape_text(&d.name),
                    escape_text(&d.show(d.base)),
                    escape_text(&d.show(d.new)),
                    escape_text(&d.show_delta()),
                    d.change.map_or("from 0".to_owned(), format::signed_percent),
                    if ranks {
                        format!("<td>{}</td>", escape_text(&d.show_ranks()))
                    } else {
                        String::new()
                    }
                );
            }
            h.push_str("</table>\n");
        }
        for (title, svg) in flamegraphs {
            let _ = writeln!(
                h,
                "<h2>{}</h2><p>Shape of the new run; red frames grew, blue frames shrank.</p><img alt=\"differential flamegraph\" src=\"data:image/svg+xml;base64,{}\">",
                escape_text(title),
                base64(svg)
            );
        }
        h.push_str("</body></html>\n");
        h
    }
}

const DIFF_CSS: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#1d2330}table{border-collapse:collapse;margin-bottom:16px}td,th{padding:3px 8px;border-bottom:1px solid #e3e6ea;text-align:right}td:first-child,th:first-child{text-align:left;word-break:break-all}.up{color:#b42318}.down{color:#067647}.headline{font-size:16px;font-weight:600}img{max-width:100%;border:1px solid #e3e6ea}";

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// Differential flamegraph SVGs (host, GPU) of two runs; a kind with no samples in either
/// run is left out.
pub fn differential_flamegraphs(base: &Run, new: &Run) -> Result<Vec<(FlameKind, Vec<u8>)>> {
    let mut out = Vec::new();
    for (kind, title) in [
        (FlameKind::Host, "Host wall time: differential"),
        (
            FlameKind::Gpu,
            "GPU time by issuing host stack: differential",
        ),
    ] {
        let b = flame::folded(&base.processes, kind);
        let n = flame::folded(&new.processes, kind);
        if b.is_empty() && n.is_empty() {
            continue;
        }
        let mut svg = Vec::new();
        let title = if base.incomplete.is_empty() && new.incomplete.is_empty() {
            title.to_string()
        } else {
            format!("{title}{}", flame::INCOMPLETE_TITLE)
        };
        flame::write_differential_svg(&b, &n, &title, &mut svg)?;
        out.push((kind, svg));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_known_values() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
