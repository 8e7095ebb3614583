//! `perfkit check`: a CI gate over lint findings and over regressions between runs.
//!
//! ```text
//! perfkit check --lint src/                                       # fail on findings at warning or above
//! perfkit check --baseline base/ --candidate new/
//! perfkit check --baseline b1/ b2/ b3/ --candidate n1/ n2/ n3/ --max-regression 5%
//! perfkit check --repeat 3 --baseline-program old/train -- new/train --steps 100
//! perfkit check --lint src/ --baseline base/summary.json --candidate new/ --format github --sarif lint.sarif
//! ```
//!
//! Runs are compared in two steps (the models live in `perfkit_reports::gate`):
//!
//! 1. per-step counters (copies, synchronizations, uploads, allocations, launches, span
//!    entries; median over steps): any growth beyond the `[check.counters]` allowance fails,
//!    naming the rule and the source lines of the new operations;
//! 2. timing (median step time, GPU idle share, copy time per step), each run reduced to its
//!    median: with two or more runs per side Welch's t-test plus the minimum effect
//!    (`--max-regression`); with one run per side the noise floor, and the verdict is weak.
//!
//! Improvements and changes within noise pass. An incomplete run (a trace cut short or
//! unreadable, the program ended by a signal) fails unless `--allow-incomplete`. Exit codes:
//! 0 pass, 1 fail, 2 error.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use perfkit_lint::output::{self, Format, RenderOptions};
use perfkit_lint::{Diagnostic, LintOptions, LintReport, RuleMeta, Severity as LintSeverity};
use perfkit_reports::diff::{Run, RunInput};
use perfkit_reports::gate::{
    CheckConfig, TimingComparison, TimingOptions, Verdict, compare_counters, compare_timing,
};
use perfkit_reports::model::ProcessAnalysis;
use perfkit_reports::stats::Distribution;
use perfkit_reports::summary::pace_process;
use perfkit_reports::{AnalyzeOptions, Finding, Severity};

/// Arguments of `perfkit check`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 when every gate passes, 1 when one fails, 2 on an error \
(bad flag, unreadable run, a file that could not be linted). BASE and NEW are trace files, run \
directories or summary.json files written by `perfkit profile` or `perfkit report`."
)]
pub struct CheckArgs {
    /// Lint these files or directories and fail on findings at or above `--fail-on`.
    #[arg(long, value_name = "PATH", num_args = 1..)]
    lint: Vec<PathBuf>,
    /// Configuration file: its lint settings and its `[check]` table (default: perfkit.toml or
    /// Cargo.toml metadata found upward from the current directory).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Lowest lint severity that fails the check.
    #[arg(long, value_enum, default_value_t = FailOn::Warning)]
    fail_on: FailOn,
    /// The reference run(s): give several (`--baseline a/ b/ c/`) to measure run-to-run noise.
    #[arg(long, value_name = "BASE", num_args = 1.., requires = "candidate")]
    baseline: Vec<PathBuf>,
    /// The run(s) to check against the baseline.
    #[arg(long, value_name = "NEW", num_args = 1.., requires = "baseline")]
    candidate: Vec<PathBuf>,
    /// Compare runs even when one is incomplete (a trace cut short or unreadable, the program
    /// ended by a signal); without it an incomplete run fails the check.
    #[arg(long, requires = "baseline")]
    allow_incomplete: bool,
    /// Minimum effect: a timing change below this share of the baseline step never fails
    /// (`5%` or `5`; default `min-effect` of `[check]`, else 5%).
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    max_regression: Option<f64>,
    /// With one run per side, a timing change counts only beyond this share of the baseline
    /// step (default `noise-floor` of `[check]`, else 50%).
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    noise_floor: Option<f64>,
    /// Record the runs to compare instead of reading them: run the baseline program and
    /// PROGRAM (the candidate) N times each, interleaved (baseline, candidate, baseline, ...),
    /// each under `perfkit profile`, then compare the N runs of each side.
    #[arg(
        long,
        value_name = "N",
        requires = "baseline_program",
        conflicts_with_all = ["baseline", "candidate"],
        value_parser = clap::value_parser!(u32).range(1..=100)
    )]
    repeat: Option<u32>,
    /// With `--repeat`: the baseline's program, run with the same ARGS as PROGRAM.
    #[arg(long, value_name = "PATH", requires = "repeat")]
    baseline_program: Option<PathBuf>,
    /// With `--repeat`: where the runs are written (`DIR/baseline-1`, `DIR/candidate-1`, ...;
    /// default `perfkit-out/check`).
    #[arg(long, value_name = "DIR", requires = "repeat")]
    out: Option<PathBuf>,
    /// With `--repeat`: replace the runs of an earlier check in --out DIR (only files perfkit
    /// can prove it wrote, as `perfkit profile --force`)
    #[arg(long, requires = "repeat")]
    force: bool,
    /// With `--repeat`: the candidate program and the arguments both programs get.
    #[arg(
        value_name = "PROGRAM",
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        requires = "repeat"
    )]
    command: Vec<std::ffi::OsString>,
    /// Output on stdout: `text`, or `github` (workflow-command annotations).
    #[arg(long, value_enum, default_value_t = CheckFormat::Text)]
    format: CheckFormat,
    /// Also write the lint findings as SARIF 2.1.0 to FILE (for code scanning).
    #[arg(long, value_name = "FILE")]
    sarif: Option<PathBuf>,
}

/// `--fail-on` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FailOn {
    /// Notes, warnings and errors fail.
    Note,
    /// Warnings and errors fail.
    Warning,
    /// Only errors fail.
    Error,
}

impl FailOn {
    fn severity(self) -> LintSeverity {
        match self {
            FailOn::Note => LintSeverity::Note,
            FailOn::Warning => LintSeverity::Warning,
            FailOn::Error => LintSeverity::Error,
        }
    }
}

/// `--format` values of `perfkit check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CheckFormat {
    /// Human-readable lines.
    Text,
    /// GitHub Actions annotations (`::error ...`).
    Github,
}

/// Parses `5%`, `5` or `2.5%` into a fraction (`0.05`).
fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let number = t.strip_suffix('%').unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v / 100.0),
        _ => Err(format!(
            "`{s}` is not a percentage (expected for example `5%`)"
        )),
    }
}

/// Lints `paths` and puts its findings beside the `runtime` ones, a lint finding marked confirmed
/// (with the measured cost) where the run saw the same rule at the same source line. Also
/// returns the files that could not be linted (missing, unreadable, unparsable), for the caller
/// to report as `perfkit lint` does.
pub fn with_lint_findings(
    paths: &[std::path::PathBuf],
    runtime: Vec<Finding>,
) -> Result<(Vec<Finding>, Vec<perfkit_lint::FileError>), perfkit_lint::LintError> {
    let report = perfkit_lint::lint(&perfkit_lint::LintOptions::new(paths.to_vec()))?;
    let lint = lint_to_findings(&report.diagnostics);
    Ok((
        perfkit_reports::rules::confirm(lint, runtime),
        report.errors,
    ))
}

/// Names on stderr the files `--lint` could not lint, each as `perfkit lint` prints it, prefixed
/// (`perfkit: error: --lint: src/a.rs:1: syntax error: ...`), then how many there were.
pub fn print_lint_errors(errors: &[perfkit_lint::FileError]) {
    for error in errors {
        let line = error.line.map(|l| format!(":{l}")).unwrap_or_default();
        crate::eprintln_lossy!(
            "perfkit: error: --lint: {}{line}: {}",
            error.path.display(),
            error.message
        );
    }
    if !errors.is_empty() {
        crate::eprintln_lossy!(
            "perfkit: --lint: {} file{} could not be linted",
            errors.len(),
            if errors.len() == 1 { "" } else { "s" }
        );
    }
}

/// The cargo workspace root of source files, cached per directory: the nearest directory above
/// a file whose Cargo.toml has a `[workspace]` table, else the nearest holding a Cargo.toml.
#[derive(Default)]
struct WorkspaceRoots {
    by_dir: std::collections::HashMap<PathBuf, Option<PathBuf>>,
}

impl WorkspaceRoots {
    fn of(&mut self, file: &Path) -> Option<&Path> {
        let dir = file.parent()?.to_path_buf();
        self.by_dir
            .entry(dir)
            .or_insert_with_key(|dir| {
                let mut package = None;
                for candidate in dir.ancestors() {
                    let Ok(text) = std::fs::read_to_string(candidate.join("Cargo.toml")) else {
                        continue;
                    };
                    let manifest: Option<toml::Table> = text.parse().ok();
                    if manifest.is_some_and(|m| m.contains_key("workspace")) {
                        return Some(candidate.to_path_buf());
                    }
                    package.get_or_insert_with(|| candidate.to_path_buf());
                }
                package
            })
            .as_deref()
    }
}

/// Lint diagnostics as report findings (`origin` = `lint`). Their paths are relative to their
/// cargo workspace's root, as the recorder's `#[track_caller]` locations are
/// (`kernels/src/train.rs`), so that a report reads the same wherever it was written or is
/// opened; a file in no cargo package keeps the path the linter shows.
pub fn lint_to_findings(diagnostics: &[Diagnostic]) -> Vec<Finding> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut roots = WorkspaceRoots::default();
    diagnostics
        .iter()
        .map(|d| {
            let absolute = cwd.join(&d.path);
            let in_workspace = roots
                .of(&absolute)
                .and_then(|root| absolute.strip_prefix(root).ok());
            lint_to_finding(d, in_workspace.unwrap_or(&d.path))
        })
        .collect()
}

/// A lint diagnostic as a report finding, located at `path` (shown as the linter shows paths).
fn lint_to_finding(d: &Diagnostic, path: &Path) -> Finding {
    Finding {
        code: d.code.to_owned(),
        name: d.name.to_owned(),
        severity: match d.severity {
            LintSeverity::Note => Severity::Note,
            LintSeverity::Warning => Severity::Warning,
            LintSeverity::Error => Severity::Error,
        },
        message: d.message.clone(),
        help: d.help.clone(),
        location: Some(format!(
            "{}:{}:{}",
            output::display_path(path),
            d.region.line,
            d.region.column
        )),
        origin: "lint".to_owned(),
        confirmed: false,
        cost_per_step_ns: None,
        share_of_step_percent: None,
        bytes: None,
        count: None,
    }
}

/// One timed quantity compared between the runs of both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// What is compared.
    pub what: &'static str,
    /// Unit: `ns` or `share` (fraction of step time).
    pub unit: &'static str,
    /// The comparison and its evidence.
    pub cmp: TimingComparison,
}

impl Gate {
    /// The candidate is slower beyond the noise and by at least the minimum effect.
    pub fn failed(&self) -> bool {
        self.cmp.verdict == Verdict::Slower
    }

    fn verdict(&self) -> &'static str {
        match self.cmp.verdict {
            Verdict::Slower => "regression",
            Verdict::Faster => "improved",
            Verdict::WithinNoise => "within noise",
        }
    }

    fn show(&self, v: f64) -> String {
        match self.unit {
            "share" => format!("{:.1}%", v * 100.0),
            _ => perfkit_reports::format::duration(v.max(0.0).round() as u64),
        }
    }

    fn show_delta(&self) -> String {
        let v = self.cmp.new - self.cmp.base;
        match self.unit {
            "share" => format!("{:+.1} pt", v * 100.0),
            _ => perfkit_reports::format::signed_duration(v.round() as i128),
        }
    }

    /// The change as a share of the baseline step (`+4.1 %`, or percentage points).
    fn show_change(&self) -> String {
        match self.unit {
            "share" => format!("{:+.1} pt", self.cmp.change * 100.0),
            _ => format!("{:+.1}% of the baseline step", self.cmp.change * 100.0),
        }
    }

    fn line(&self) -> String {
        format!(
            "{}: {} -> {} {} ({}): {}; {}",
            self.what,
            self.show(self.cmp.base),
            self.show(self.cmp.new),
            self.show_delta(),
            self.show_change(),
            self.verdict(),
            self.cmp.reason
        )
    }
}

/// Median and standard error of the median of a per-step quantity (values scaled to integers).
fn median_and_se(values: &[f64], scale: f64) -> (f64, f64) {
    let ints: Vec<u64> = values
        .iter()
        .map(|v| (v * scale).max(0.0).round() as u64)
        .collect();
    let d = Distribution::of(&ints);
    (
        d.median_ns as f64 / scale,
        d.median_standard_error_ns() / scale,
    )
}

fn steps_of(run: &Run) -> Option<&ProcessAnalysis> {
    pace_process(&run.processes).filter(|p| p.steps.duration.count > 0)
}

/// What the runs could not be compared on, and why: a CPU run has no GPU idle share and no
/// copies, and a gate that silently vanished would read as a pass.
pub fn not_compared(base: &[Run], new: &[Run]) -> Vec<String> {
    let all: Vec<&ProcessAnalysis> = base.iter().chain(new).filter_map(steps_of).collect();
    if all.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    if all.iter().all(|p| p.gpu.busy_ns == 0) {
        out.push(
            "GPU idle share of step time: not compared, neither run recorded GPU work".to_owned(),
        );
    }
    if all.iter().all(|p| p.copies.total.count == 0) {
        out.push("copy time per step: not compared, neither run recorded a copy".to_owned());
    }
    out
}

/// The share of each step the GPU was idle (or waited in a synchronization).
fn idle_shares(p: &ProcessAnalysis) -> Vec<f64> {
    p.steps
        .series
        .iter()
        .filter(|s| s.breakdown.wall_ns > 0)
        .map(|s| {
            (s.breakdown.idle_ns + s.breakdown.sync_wait_ns) as f64 / s.breakdown.wall_ns as f64
        })
        .collect()
}

/// The GPU time per step spent copying while no kernel ran.
fn copy_times(p: &ProcessAnalysis) -> Vec<f64> {
    p.steps
        .series
        .iter()
        .map(|s| s.breakdown.copy_ns as f64)
        .collect()
}

/// Compares the runs of both sides: median step time, GPU idle share, copy time per step,
/// each summarised per run by its median and judged by [`compare_timing`].
pub fn compare(base: &[Run], new: &[Run], opts: TimingOptions) -> anyhow::Result<Vec<Gate>> {
    let mut b = Vec::new();
    let mut n = Vec::new();
    for (runs, out) in [(base, &mut b), (new, &mut n)] {
        for run in runs {
            let Some(p) = steps_of(run) else {
                bail!(
                    "both sides need step spans to compare (`{}` has none): wrap each training step in a `step` span (or the name set with the recorder's `step_span_name`)",
                    run.source
                );
            };
            out.push(p);
        }
    }
    // The standard error of the difference of two single runs' values, from their own
    // per-step spread (it only matters where it exceeds the noise floor: very short runs).
    let within = |f: &dyn Fn(&ProcessAnalysis) -> (f64, f64)| -> f64 {
        let (_, seb) = f(b[0]);
        let (_, sen) = f(n[0]);
        (seb * seb + sen * sen).sqrt()
    };
    let values = |side: &[&ProcessAnalysis], f: &dyn Fn(&ProcessAnalysis) -> (f64, f64)| {
        side.iter().map(|p| f(p).0).collect::<Vec<f64>>()
    };
    let step = |p: &ProcessAnalysis| {
        let d = &p.steps.duration;
        (d.median_ns as f64, d.median_standard_error_ns())
    };
    let base_steps = values(&b, &step);
    let scale = base_steps.iter().sum::<f64>() / base_steps.len() as f64;
    let mut gates = vec![Gate {
        what: "median step time",
        unit: "ns",
        cmp: compare_timing(&base_steps, &values(&n, &step), scale, within(&step), opts),
    }];
    let has_gpu = |p: &&ProcessAnalysis| p.gpu.busy_ns > 0;
    if b.iter().any(has_gpu) || n.iter().any(has_gpu) {
        let idle = |p: &ProcessAnalysis| {
            if p.gpu.busy_ns == 0 {
                return (0.0, 0.0);
            }
            median_and_se(&idle_shares(p), 1e6)
        };
        gates.push(Gate {
            what: "GPU idle share of step time",
            unit: "share",
            cmp: compare_timing(
                &values(&b, &idle),
                &values(&n, &idle),
                1.0,
                within(&idle),
                opts,
            ),
        });
    }
    let copies = |p: &&ProcessAnalysis| p.copies.total.count > 0;
    if b.iter().any(copies) || n.iter().any(copies) {
        let copy = |p: &ProcessAnalysis| median_and_se(&copy_times(p), 1.0);
        gates.push(Gate {
            what: "copy time per step",
            unit: "ns",
            cmp: compare_timing(
                &values(&b, &copy),
                &values(&n, &copy),
                scale,
                within(&copy),
                opts,
            ),
        });
    }
    Ok(gates)
}

fn lint_paths(args: &CheckArgs) -> anyhow::Result<LintReport> {
    let mut options = LintOptions::new(args.lint.clone());
    options.config_file = args.config.clone();
    Ok(perfkit_lint::lint(&options)?)
}

/// Runs `perfkit check`.
pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    if args.lint.is_empty() && args.baseline.is_empty() && args.repeat.is_none() {
        bail!(
            "nothing to check: give `--lint PATH` and/or `--baseline BASE... --candidate NEW...` (or `--repeat N --baseline-program PATH -- PROGRAM [ARGS]`)"
        );
    }
    let (baseline, candidate) = match args.repeat {
        Some(n) => record_runs(&args, n)?,
        None => (args.baseline.clone(), args.candidate.clone()),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(super::PipeTolerant::new(stdout.lock()));
    let mut failed = false;
    let mut errors = false;
    // An incomplete run compared anyway (--allow-incomplete): the verdict says so.
    let mut compared_incomplete = false;
    let mut md = String::from("## perfkit check\n\n");

    // Lint gate.
    if !args.lint.is_empty() {
        let report = lint_paths(&args)?;
        let rules: Vec<&RuleMeta> = perfkit_lint::rules().iter().map(|r| r.meta()).collect();
        let level = args.fail_on.severity();
        let failing = report
            .diagnostics
            .iter()
            .filter(|d| d.severity >= level && d.code != "PK000")
            .count();
        let (format, what) = match args.format {
            CheckFormat::Text => (Format::Text, "report"),
            CheckFormat::Github => (Format::Github, "annotations"),
        };
        output::render(format, &mut out, &report, &rules, &RenderOptions::default())
            .with_context(|| format!("cannot write the lint {what}"))?;
        if let Some(path) = &args.sarif {
            write_sarif(path, &report, &rules)?;
        }
        if !report.errors.is_empty() {
            errors = true;
        }
        let verdict = if failing > 0 { "FAIL" } else { "pass" };
        writeln!(
            out,
            "lint: {} findings, {failing} at {} or above, {} files not linted: {verdict}",
            report.diagnostics.len(),
            args.fail_on.severity().as_str(),
            report.errors.len()
        )?;
        let _ = writeln!(
            md,
            "**lint** ({}): {} findings, {failing} at {} or above, {} files not linted\n",
            verdict,
            report.diagnostics.len(),
            args.fail_on.severity().as_str(),
            report.errors.len()
        );
        if !report.diagnostics.is_empty() {
            md.push_str("| code | severity | location | message |\n|---|---|---|---|\n");
            for d in report.diagnostics.iter().take(50) {
                let f = lint_to_finding(d, &d.path);
                let _ = writeln!(
                    md,
                    "| {} | {} | `{}` | {} |",
                    f.code,
                    f.severity.as_str(),
                    f.location.unwrap_or_default(),
                    f.message.replace('|', "\\|")
                );
            }
            md.push('\n');
        }
        failed |= failing > 0;
    } else if args.sarif.is_some() {
        bail!("`--sarif` writes lint findings: give `--lint PATH` too");
    }

    // Profile gate.
    if !baseline.is_empty() {
        let (mut config, _) = match &args.config {
            Some(file) => (CheckConfig::from_file(file)?, Some(file.clone())),
            None => CheckConfig::discover(Path::new("."))?,
        };
        if let Some(v) = args.max_regression {
            config.min_effect = v;
        }
        if let Some(v) = args.noise_floor {
            config.noise_floor = v;
        }
        for (flag, runs) in [("--baseline", &baseline), ("--candidate", &candidate)] {
            refuse_repeated_runs(flag, runs)?;
        }
        let options = AnalyzeOptions::default();
        let base: Vec<Run> = baseline
            .iter()
            .map(|p| load(p, &options))
            .collect::<anyhow::Result<_>>()?;
        let new: Vec<Run> = candidate
            .iter()
            .map(|p| load(p, &options))
            .collect::<anyhow::Result<_>>()?;
        let sides = [("baseline", &base), ("candidate", &new)];
        for (which, runs) in sides {
            for run in runs.iter() {
                if run.incomplete.is_empty() {
                    continue;
                }
                let verdict = if args.allow_incomplete {
                    "allowed by --allow-incomplete"
                } else {
                    failed = true;
                    "FAIL (pass --allow-incomplete to compare it anyway)"
                };
                let name = if runs.len() > 1 {
                    format!("{which} run {}", run.source)
                } else {
                    format!("{which} run")
                };
                let line = format!(
                    "{name} incomplete: {}: {verdict}",
                    run.incomplete.join("; ")
                );
                writeln!(out, "{line}")?;
                compared_incomplete |= args.allow_incomplete;
                if args.format == CheckFormat::Github {
                    // Allowed or not, the pull request hears of it.
                    let level = if args.allow_incomplete {
                        "warning"
                    } else {
                        "error"
                    };
                    writeln!(
                        out,
                        "::{level} title=perfkit check::{}",
                        output::github::escape_data(&line)
                    )?;
                }
                let _ = writeln!(md, "**{name} incomplete**: {}\n", run.incomplete.join("; "));
            }
            // Dropped records: the counters and times undercount. Said, not failed.
            for run in runs.iter().filter(|r| r.dropped_events() > 0) {
                let name = if runs.len() > 1 {
                    format!("{which} run {}", run.source)
                } else {
                    format!("{which} run")
                };
                let reason = perfkit_reports::diff::dropped_line(run.dropped_events());
                let line = format!("{name} undercounts: {reason}");
                writeln!(out, "{line}")?;
                if args.format == CheckFormat::Github {
                    writeln!(
                        out,
                        "::warning title=perfkit check::{}",
                        output::github::escape_data(&line)
                    )?;
                }
                let _ = writeln!(md, "**{name} undercounts**: {reason}\n");
            }
            // What its figures leave out (malformed GPU records) or show in part. Said, not
            // failed.
            for run in runs.iter() {
                let notes = run.notes();
                if notes.is_empty() {
                    continue;
                }
                let name = if runs.len() > 1 {
                    format!("{which} run {}", run.source)
                } else {
                    format!("{which} run")
                };
                let line = format!("{name} note: {}", notes.join("; "));
                writeln!(out, "{line}")?;
                if args.format == CheckFormat::Github {
                    writeln!(
                        out,
                        "::notice title=perfkit check::{}",
                        output::github::escape_data(&line)
                    )?;
                }
                let _ = writeln!(md, "**{name} note**: {}\n", notes.join("; "));
            }
        }

        // Counters first: they do not depend on the machine.
        let pb: Vec<&[ProcessAnalysis]> = base.iter().map(|r| r.processes.as_slice()).collect();
        let pn: Vec<&[ProcessAnalysis]> = new.iter().map(|r| r.processes.as_slice()).collect();
        let (counters, notes) = compare_counters(&pb, &pn, &config);
        let steps = |runs: &[Run]| -> u64 {
            runs.iter()
                .filter_map(steps_of)
                .map(|p| p.steps.duration.count)
                .sum()
        };
        let grew = counters.iter().filter(|c| c.failed()).count();
        writeln!(
            out,
            "per-step counters (median over steps; {} baseline and {} candidate steps): {} compared, {grew} grew: {}",
            steps(&base),
            steps(&new),
            counters.iter().filter(|c| c.gated).count(),
            if grew > 0 { "FAIL" } else { "pass" }
        )?;
        let _ = writeln!(
            md,
            "**per-step counters**: {} compared, {grew} grew\n\n| counter | baseline | candidate | verdict |\n|---|---|---|---|",
            counters.iter().filter(|c| c.gated).count()
        );
        for c in &counters {
            let line = c.line();
            writeln!(out, "  {line}")?;
            if c.failed() && args.format == CheckFormat::Github {
                writeln!(
                    out,
                    "::error title=perfkit check::{}",
                    output::github::escape_data(&line)
                )?;
            }
            let name = match (&c.code, &c.span) {
                (_, Some(span)) => format!("span `{span}` entries"),
                (Some(code), None) => format!("{code} {}", c.counter),
                (None, None) => c.counter.clone(),
            };
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} |",
                c.base,
                c.new,
                if c.failed() {
                    format!("**FAIL** {}", c.sources.join(", "))
                } else {
                    "pass".to_owned()
                }
            );
            failed |= c.failed();
        }
        md.push('\n');
        for note in notes {
            writeln!(out, "{note}")?;
            let _ = writeln!(md, "_{note}_\n");
        }

        // Then timing, against run-to-run noise.
        let gates = compare(&base, &new, TimingOptions::from(&config))?;
        md.push_str("| quantity | baseline | candidate | change | runs | noise | test | verdict |\n|---|---|---|---|---|---|---|---|\n");
        for g in &gates {
            writeln!(out, "{}", g.line())?;
            if g.failed() && args.format == CheckFormat::Github {
                writeln!(
                    out,
                    "::error title=perfkit check::{}",
                    output::github::escape_data(&g.line())
                )?;
            }
            let test = match (g.cmp.p_value, g.cmp.weak) {
                (Some(p), _) => format!("Welch t, p = {p:.3}"),
                (None, true) => "noise floor (weak)".to_owned(),
                (None, false) => g.cmp.test.clone(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} vs {} | {:.1}% | {test} | {} |",
                g.what,
                g.show(g.cmp.base),
                g.show(g.cmp.new),
                g.show_change(),
                g.cmp.base_runs,
                g.cmp.new_runs,
                g.cmp.noise * 100.0,
                if g.failed() {
                    "**regression**"
                } else {
                    g.verdict()
                }
            );
            failed |= g.failed();
        }
        for line in not_compared(&base, &new) {
            writeln!(out, "{line}")?;
            let _ = writeln!(md, "\n_{line}_");
        }
        md.push('\n');
    }

    let result = if errors {
        "ERROR"
    } else if failed {
        "FAIL"
    } else if compared_incomplete {
        // A pass that rests on a partial run says so.
        "PASS (with an incomplete run: --allow-incomplete)"
    } else {
        "PASS"
    };
    writeln!(out, "perfkit check: {result}")?;
    out.flush()?;
    let _ = writeln!(md, "**result: {result}**");
    if let Some(summary) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()) {
        append(Path::new(&summary), &md)?;
    }
    Ok(if errors {
        ExitCode::from(2)
    } else if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// One run given twice on one side (`--baseline a/ a/ a/`, or `a/` and `a/summary.json`) would
/// count as several runs with no spread between them, and the timing test would find any change
/// significant: an error that names it.
fn refuse_repeated_runs(flag: &str, runs: &[PathBuf]) -> anyhow::Result<()> {
    let identity = |path: &Path| {
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        match resolved.file_name() {
            Some(name) if name == "summary.json" && resolved.is_file() => {
                resolved.parent().map(Path::to_path_buf).unwrap_or(resolved)
            }
            _ => resolved,
        }
    };
    let mut seen: Vec<(PathBuf, &Path)> = Vec::new();
    for run in runs {
        let id = identity(run);
        if let Some((_, first)) = seen.iter().find(|(other, _)| *other == id) {
            bail!(
                "{flag}: `{}` and `{}` are the same run; give each run once (several runs \
                 measure run-to-run noise only when they are different runs)",
                first.display(),
                run.display()
            );
        }
        seen.push((id, run));
    }
    Ok(())
}

/// `--repeat N`: profiles the baseline program and the candidate N times each, interleaved,
/// with `perfkit profile`, and returns the run directories of each side.
fn record_runs(args: &CheckArgs, n: u32) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let Some((program, program_args)) = args.command.split_first() else {
        bail!(
            "--repeat needs the candidate program: `perfkit check --repeat N --baseline-program PATH -- PROGRAM [ARGS]`"
        );
    };
    let Some(base_program) = &args.baseline_program else {
        bail!("--repeat needs --baseline-program PATH");
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("perfkit-out/check"));
    let exe = std::env::current_exe().context("cannot find the perfkit executable")?;
    let (mut base, mut new) = (Vec::new(), Vec::new());
    for i in 1..=n {
        for (which, prog, runs) in [
            ("baseline", base_program.as_os_str(), &mut base),
            ("candidate", program.as_os_str(), &mut new),
        ] {
            let dir = out.join(format!("{which}-{i}"));
            crate::eprintln_lossy!(
                "perfkit check: {which} run {i} of {n}: {} -> {}",
                Path::new(prog).display(),
                dir.display()
            );
            let mut profile = std::process::Command::new(&exe);
            profile.args(["profile", "--quiet", "--no-lint"]);
            if args.force {
                profile.arg("--force");
            }
            let status = profile
                .arg("--out")
                .arg(&dir)
                .arg("--")
                .arg(prog)
                .args(program_args)
                .stdout(std::process::Stdio::null())
                .status()
                .with_context(|| format!("cannot run {}", exe.display()))?;
            if !status.success() {
                bail!(
                    "--repeat: the {which} run {i} ({}) failed: {status} (its errors are above; its trace and summary, if it got that far, are in {})",
                    Path::new(prog).display(),
                    dir.display()
                );
            }
            runs.push(dir);
        }
    }
    Ok((base, new))
}

fn load(path: &Path, options: &AnalyzeOptions) -> anyhow::Result<Run> {
    RunInput::classify(path)
        .and_then(|input| input.load(options))
        .with_context(|| format!("cannot read the run {}", path.display()))
}

/// Writes the SARIF log to `path`, which must not exist or must be a SARIF log of perfkit's (an
/// earlier check's): perfkit does not overwrite a file it cannot prove it wrote, and does not
/// write through a symbolic link. The log is written to a temporary file beside it and renamed, so
/// that a reader never sees half of it.
fn write_sarif(path: &Path, report: &LintReport, rules: &[&RuleMeta]) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(error)
                .with_context(|| format!("cannot write the SARIF file {}", path.display()));
        }
        Ok(meta) if meta.file_type().is_symlink() => bail!(
            "--sarif {}: a symbolic link; perfkit does not write through it (give the file's own path)",
            path.display()
        ),
        Ok(meta) if !meta.is_file() => {
            bail!("--sarif {}: not a regular file; left alone", path.display())
        }
        Ok(_) if !is_perfkit_sarif(path) => bail!(
            "--sarif {}: the file exists and is not a SARIF log written by perfkit; left alone \
             (remove it or choose another path)",
            path.display()
        ),
        Ok(_) => {}
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let context = || format!("cannot write the SARIF file {}", path.display());
    let mut builder = tempfile::Builder::new();
    builder.prefix(".perfkit-sarif");
    // Created as `File::create` creates a file: readable by others unless the umask says not.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut temp = builder.tempfile_in(dir).with_context(context)?;
    {
        let mut out = std::io::BufWriter::new(temp.as_file_mut());
        output::sarif::render(&mut out, report, rules)
            .and_then(|()| out.flush())
            .with_context(context)?;
    }
    temp.persist(path)
        .map_err(|error| error.error)
        .with_context(context)?;
    Ok(())
}

/// Whether `path` holds a SARIF log whose tool is perfkit.
fn is_perfkit_sarif(path: &Path) -> bool {
    let Ok(text) = std::fs::read(path) else {
        return false;
    };
    let Ok(log) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return false;
    };
    log["version"] == "2.1.0"
        && log["runs"].as_array().is_some_and(|runs| {
            !runs.is_empty()
                && runs
                    .iter()
                    .all(|run| run["tool"]["driver"]["name"] == "perfkit")
        })
}

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open $GITHUB_STEP_SUMMARY ({})", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write $GITHUB_STEP_SUMMARY ({})", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_parse_with_or_without_sign() {
        assert_eq!(parse_percent("5%"), Ok(0.05));
        assert_eq!(parse_percent("2.5"), Ok(0.025));
        assert!(parse_percent("five").is_err());
        assert!(parse_percent("-3%").is_err());
    }
}
