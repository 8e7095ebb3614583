//! Runtime findings: the rules of perfkit's catalog measured in a trace.
//!
//! [`evaluate`] turns an [`Analysis`] (and one more pass over the trace of the process that
//! sets the run's pace) into [`Finding`]s with their measured cost: time per step, share of
//! the median step, bytes, count, the caller's source line and the rule's help. Thresholds are
//! the fields of [`ProfileConfig`] (`perfkit.toml`, table `[profile]`).
//!
//! | code | name | measured |
//! |---|---|---|
//! | PK101 | host-readback-in-step-loop | small device-to-host copies from one line in most steps, host time blocked |
//! | PK102 | sync-in-step-loop | explicit synchronizations from one line in most steps, host time blocked |
//! | PK202 | alloc-in-step-loop | device allocations from one line in most steps |
//! | PK203 | per-sample-upload | many tiny host-to-device copies from one line per step |
//! | PK303 | pageable-upload-in-step-loop | pageable host-to-device copies per step, against the run's pinned bandwidth |
//! | PK301 | loader-without-workers | GPU idle while the GPU-driving thread is inside data loading |
//! | PK601 | gpu-idle-gaps | GPU idle share of step time |
//! | PK602 | launch-bound-kernels | kernels shorter than their launch call |
//! | PK603 | low-gpu-utilization | steps whose GPU time-utilization is below the threshold |
//! | PK604 | memory-near-capacity | peak device memory against the card |
//!
//! A trace with no GPU work (a CPU run) gets none of these: every rule needs GPU operations.
//! Without trace files (an analysis read back from `summary.json`) only PK602, PK603 and PK604,
//! which need nothing but the analysis, are evaluated.

pub(crate) mod config;
mod confirm;
mod pk101;
mod pk102;
mod pk202;
mod pk203;
mod pk301;
mod pk303;
mod pk601;
mod pk602;
mod pk603;
mod pk604;
pub mod scan;
#[cfg(test)]
mod tests;

pub use config::{ConfigError, ProfileConfig};
pub use confirm::{confirm, same_line};

use std::fmt::Write as _;

use crate::findings::{Finding, Severity};
use crate::format;
use crate::model::{Analysis, ProcessAnalysis};
use scan::{Scan, Site, SiteKind};

/// A runtime rule: its identity and the advice shown with each finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeRule {
    /// Code, e.g. `PK101`.
    pub code: &'static str,
    /// Name, e.g. `host-readback-in-step-loop`.
    pub name: &'static str,
    /// Default severity.
    pub severity: Severity,
    /// What to do (the help of each finding).
    pub help: &'static str,
}

impl RuntimeRule {
    /// The rule's documentation in Markdown (`## What it does`, `## Why is this bad?`,
    /// `## Compared with nsys and HTA`, thresholds): the doc comment of its module.
    pub fn doc(&self) -> String {
        let source = match self.code {
            "PK101" => include_str!("pk101.rs"),
            "PK102" => include_str!("pk102.rs"),
            "PK202" => include_str!("pk202.rs"),
            "PK203" => include_str!("pk203.rs"),
            "PK301" => include_str!("pk301.rs"),
            "PK303" => include_str!("pk303.rs"),
            "PK601" => include_str!("pk601.rs"),
            "PK602" => include_str!("pk602.rs"),
            "PK603" => include_str!("pk603.rs"),
            "PK604" => include_str!("pk604.rs"),
            _ => "",
        };
        let mut lines: Vec<&str> = source
            .lines()
            .map_while(|l| l.strip_prefix("//!"))
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .skip(1) // the title line
            .collect();
        while lines.first().is_some_and(|l| l.is_empty()) {
            lines.remove(0);
        }
        let mut doc = lines.join("\n");
        doc.push('\n');
        doc
    }

    /// The first sentence of `## What it does`.
    pub fn summary(&self) -> String {
        let doc = self.doc();
        let text = doc
            .split("## What it does")
            .nth(1)
            .unwrap_or_default()
            .split("\n\n")
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        match text.find(". ") {
            Some(i) => text[..=i].to_owned(),
            None => text,
        }
    }
}

/// Every runtime rule, by code.
pub const RULES: [RuntimeRule; 10] = [
    pk101::RULE,
    pk102::RULE,
    pk202::RULE,
    pk203::RULE,
    pk301::RULE,
    pk303::RULE,
    pk601::RULE,
    pk602::RULE,
    pk603::RULE,
    pk604::RULE,
];

/// What the rules look at.
pub(crate) struct Cx<'a> {
    pub process: &'a ProcessAnalysis,
    pub scan: Option<&'a Scan>,
    pub cfg: &'a ProfileConfig,
    /// Median step wall time (0 without steps).
    pub median_ns: u64,
    /// Steps (from the scan when there is one, else from the analysis).
    pub steps: u64,
}

impl Cx<'_> {
    /// A finding of `rule` with its cost per step and share of the median step.
    pub fn finding(
        &self,
        rule: &RuntimeRule,
        message: String,
        cost_per_step_ns: Option<u64>,
    ) -> Finding {
        Finding {
            code: rule.code.to_owned(),
            name: rule.name.to_owned(),
            severity: rule.severity,
            message,
            help: rule.help.to_owned(),
            location: None,
            origin: "runtime".to_owned(),
            confirmed: false,
            cost_per_step_ns,
            share_of_step_percent: cost_per_step_ns.and_then(|c| self.share_percent(c)),
            bytes: None,
            count: None,
        }
    }

    /// A finding of `rule` about a source line: its location, bytes and operation count.
    pub fn site_finding(
        &self,
        rule: &RuntimeRule,
        site: &Site,
        message: String,
        cost_per_step_ns: u64,
    ) -> Finding {
        let mut f = self.finding(rule, message, Some(cost_per_step_ns));
        f.location = Some(site.location.clone());
        f.bytes = Some(site.bytes);
        f.count = Some(site.count);
        f
    }

    /// The source lines of `kind` that fire in enough steps to be per step and whose host
    /// time per step is large enough to report, each with that host time per step. Empty
    /// without a scan (the per-step attribution of source lines).
    pub fn recurring_sites(&self, kind: SiteKind) -> impl Iterator<Item = (&Site, u64)> {
        self.scan
            .into_iter()
            .flat_map(|scan| &scan.sites)
            .filter(move |s| s.kind == kind && self.per_step(s.steps_hit))
            .map(|s| (s, s.host_ns / self.steps.max(1)))
            .filter(|&(_, per_step)| self.worth_reporting(per_step))
    }

    /// `cost` as a percentage of the median step, two decimals.
    pub fn share_percent(&self, cost: u64) -> Option<f64> {
        (self.median_ns > 0)
            .then(|| (cost as f64 / self.median_ns as f64 * 10_000.0).round() / 100.0)
    }

    /// Whether a per-step cost is large enough to report.
    pub fn worth_reporting(&self, cost_per_step: u64) -> bool {
        self.median_ns > 0 && cost_per_step as f64 >= self.cfg.min_share * self.median_ns as f64
    }

    /// Whether a source line fired in enough steps to be per step.
    pub fn per_step(&self, steps_hit: u64) -> bool {
        self.steps > 0 && steps_hit as f64 >= self.cfg.min_step_fraction * self.steps as f64
    }

    /// Whether the process did any GPU work.
    pub fn has_gpu(&self) -> bool {
        self.process.gpu.busy_ns > 0
            || self.process.copies.total.count > 0
            || self.process.kernels.iter().any(|k| k.count > 0)
            || self
                .scan
                .is_some_and(|s| s.timed_gpu_ops > 0 || !s.sites.is_empty())
    }
}

/// Runs every runtime rule over the process that sets the run's pace. Findings are sorted by
/// cost per step (largest first), then code.
///
/// Reads that process's trace file once more (the analysis keeps no per-step attribution of
/// source lines); a trace whose header cannot be read is an error, and damage later in the file
/// ends the reading there, as it ends the analysis.
pub fn evaluate(analysis: &Analysis, cfg: &ProfileConfig) -> crate::Result<Vec<Finding>> {
    let Some(i) = crate::summary::pace_index(&analysis.processes) else {
        // Nothing traced.
        return Ok(Vec::new());
    };
    let process = &analysis.processes[i];
    let scan = match analysis.files.get(i) {
        Some(path) => Some(scan::scan_file(
            path,
            Some(&process.steps.span_name)
                .filter(|s| !s.is_empty())
                .map(String::as_str),
            &cfg.loader_spans,
            cfg.gap_ns,
        )?),
        None => None,
    };
    Ok(evaluate_process(process, scan.as_ref(), cfg))
}

/// Runs every runtime rule over one process, with the result of [`scan::scan_file`] over its
/// trace when there is one.
pub fn evaluate_process(
    process: &ProcessAnalysis,
    scan: Option<&Scan>,
    cfg: &ProfileConfig,
) -> Vec<Finding> {
    let steps = scan.map_or(process.steps.duration.count, |s| s.steps);
    let cx = Cx {
        process,
        scan,
        cfg,
        median_ns: process.steps.duration.median_ns,
        steps,
    };
    let mut out = Vec::new();
    if !cx.has_gpu() {
        // A CPU run: none of the rules applies.
        return out;
    }
    pk101::check(&cx, &mut out);
    pk102::check(&cx, &mut out);
    pk202::check(&cx, &mut out);
    pk203::check(&cx, &mut out);
    pk301::check(&cx, &mut out);
    pk303::check(&cx, &mut out);
    pk601::check(&cx, &mut out);
    pk602::check(&cx, &mut out);
    pk603::check(&cx, &mut out);
    pk604::check(&cx, &mut out);
    sort(&mut out);
    out
}

fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.cost_per_step_ns
            .unwrap_or(0)
            .cmp(&a.cost_per_step_ns.unwrap_or(0))
            .then_with(|| a.code.cmp(&b.code))
            .then_with(|| a.location.cmp(&b.location))
    });
}

/// The findings as a terminal table: lint and runtime side by side, confirmed ones marked.
pub fn terminal_findings(findings: &[Finding]) -> String {
    let mut s = String::new();
    if findings.is_empty() {
        s.push_str("findings: none\n");
        return s;
    }
    let _ = writeln!(s, "findings ({}):", findings.len());
    let _ = writeln!(
        s,
        "  {:<7} {:<8} {:<7} {:>11} {:>7}  {:<40} message",
        "code", "severity", "origin", "cost/step", "share", "location"
    );
    for f in findings {
        let origin = if f.confirmed {
            "lint+run"
        } else {
            f.origin.as_str()
        };
        let cost = f
            .cost_per_step_ns
            .map_or_else(|| "-".to_owned(), format::duration);
        let share = f
            .share_of_step_percent
            .map_or_else(|| "-".to_owned(), |p| format!("{p:.1}%"));
        let _ = writeln!(
            s,
            "  {:<7} {:<8} {:<7} {:>11} {:>7}  {:<40} {}",
            f.code,
            f.severity.as_str(),
            origin,
            cost,
            share,
            f.location.as_deref().unwrap_or("-"),
            f.message
        );
    }
    s
}
