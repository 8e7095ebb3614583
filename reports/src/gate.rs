//! The regression gate's two models, shared by `perfkit check` and `perfkit diff`.
//!
//! 1. **Per-step counters** ([`compare_counters`]): device-to-host copies, explicit
//!    synchronizations, host-to-device copies and bytes (pinned, pageable), device allocations,
//!    kernel launches and span entries, each the median over a process's completed steps. They
//!    are the same on every run of the same code and data, on any machine, so a growth is a
//!    change of the code, never noise: it fails at once (allowance per counter in `[check]`).
//! 2. **Timing against run-to-run noise** ([`compare_timing`]): each run is summarised by its
//!    median (step time, copy time per step, GPU idle share); with two or more runs per side
//!    the per-run medians are compared with Welch's t-test, and a change must also reach the
//!    minimum effect; with one run per side only a change beyond the noise floor counts, and
//!    the verdict says that it is weak.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{ProcessAnalysis, STEP_COUNTERS, StepCounter};
use crate::rules::ConfigError;
use crate::rules::config::{ConfigTable, discover_table, table_from_file, table_from_toml};

/// The `[check]` table of `perfkit.toml` (or `metadata.perfkit.check` of a `Cargo.toml`).
///
/// ```toml
/// [check]
/// min-effect = 0.05      # a timing change below 5 % of the baseline step never fails
/// noise-floor = 0.5      # one run per side: a change must exceed 50 % to count
/// alpha = 0.05           # two or more runs per side: significance level of Welch's t-test
///
/// [check.counters]       # per-step growth allowed per counter (default 0: any growth fails)
/// kernel-launches = 2
/// span-entries = inf     # not gated
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[non_exhaustive]
pub struct CheckConfig {
    /// Smallest timing change, as a share of the baseline's step time (0.05 = 5 %), that can
    /// fail; smaller changes pass whatever the test says. Default `0.05`. `--max-regression`
    /// overrides it.
    pub min_effect: f64,
    /// With one run on a side there is no run-to-run spread to measure: a timing change counts
    /// only beyond this share of the baseline's step time. Default `0.5`, from the 20-run
    /// benchmark of `bench/gate.sh` (see docs/ci.md). `--noise-floor` overrides it.
    pub noise_floor: f64,
    /// Significance level of the two-sided Welch t-test over per-run medians (two or more
    /// runs per side). Default `0.05`.
    pub alpha: f64,
    /// Per counter id (`d2h-copies`, `syncs`, `h2d-copies`, `h2d-bytes`, `h2d-copies-pageable`,
    /// `h2d-bytes-pageable`, `device-allocs`, `kernel-launches`,
    /// `span-entries`): the growth per step allowed before the gate fails. Default 0 for
    /// each; `inf` turns a counter's gate off.
    pub counters: BTreeMap<String, f64>,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            min_effect: 0.05,
            noise_floor: 0.5,
            alpha: 0.05,
            counters: BTreeMap::new(),
        }
    }
}

impl CheckConfig {
    /// The growth per step allowed for `counter` (0 unless configured).
    pub fn allowed(&self, counter: &str) -> f64 {
        self.counters.get(counter).copied().unwrap_or(0.0)
    }

    /// Parses a configuration file's `[check]` table; `path` names the file in errors.
    pub fn from_toml(text: &str, is_cargo: bool, path: &Path) -> Result<Self, ConfigError> {
        table_from_toml(text, is_cargo, path)
    }

    /// Reads the `[check]` table of a `perfkit.toml` or `Cargo.toml`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        table_from_file(path)
    }

    /// The configuration for `start` (a directory): the nearest `perfkit.toml` upward, else
    /// the nearest `Cargo.toml` with a `metadata.perfkit.check` table; defaults when neither
    /// has one. Also returns the file read.
    pub fn discover(start: &Path) -> Result<(Self, Option<PathBuf>), ConfigError> {
        discover_table(start)
    }
}

impl ConfigTable for CheckConfig {
    const TABLE: &'static str = "check";

    fn validate(&self) -> Result<(), String> {
        for (key, v) in [
            ("min-effect", self.min_effect),
            ("noise-floor", self.noise_floor),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "in [check]: `{key}` must be a share of the step time (0.05 = 5 %), got {v}"
                ));
            }
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(format!(
                "in [check]: `alpha` must be between 0 and 1, got {}",
                self.alpha
            ));
        }
        for (key, v) in &self.counters {
            if !STEP_COUNTERS.iter().any(|c| c.0 == key) {
                let known: Vec<&str> = STEP_COUNTERS.iter().map(|c| c.0).collect();
                return Err(format!(
                    "in [check.counters]: unknown counter `{key}` (expected one of {})",
                    known.join(", ")
                ));
            }
            if v.is_nan() || *v < 0.0 {
                return Err(format!(
                    "in [check.counters]: `{key}` must be a growth per step of 0 or more (or inf), got {v}"
                ));
            }
        }
        Ok(())
    }
}

/// The rule whose anti-pattern a growing counter points at.
pub fn counter_rule(counter: &str) -> Option<&'static str> {
    match counter {
        "d2h-copies" => Some("PK101"),
        "syncs" => Some("PK102"),
        "h2d-bytes" => Some("PK201"),
        "device-allocs" => Some("PK202"),
        "h2d-copies" => Some("PK203"),
        "h2d-copies-pageable" | "h2d-bytes-pageable" => Some("PK303"),
        _ => None,
    }
}

/// The words for a counter id (`device-to-host copies`).
pub fn counter_description(counter: &str) -> &'static str {
    STEP_COUNTERS
        .iter()
        .find(|c| c.0 == counter)
        .map_or("operations", |c| c.1)
}

/// One per-step counter compared between baseline and candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterGate {
    /// The process (`rank 0`, `pid 12`); empty when each side has one stepping process.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub process: String,
    /// Counter id (`d2h-copies`, ...).
    pub counter: String,
    /// Span name, for `span-entries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<String>,
    /// The rule the counter belongs to, when one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Per step in the baseline (median over steps; over runs, the median of the runs).
    pub base: f64,
    /// Per step in the candidate.
    pub new: f64,
    /// Growth per step allowed.
    pub allowed: f64,
    /// Whether the counter is gated (a span the baseline never entered is shown, not gated).
    pub gated: bool,
    /// Where the candidate does more: `new at FILE:LINE` or `more at FILE:LINE (a -> b per step)`.
    pub sources: Vec<String>,
}

impl CounterGate {
    /// The candidate counts more than the baseline plus the allowance.
    pub fn failed(&self) -> bool {
        self.gated && self.new - self.base > self.allowed
    }

    fn show(&self, v: f64) -> String {
        if self.counter.starts_with("h2d-bytes") {
            crate::format::bytes(v.max(0.0).round() as u64)
        } else if v.fract() == 0.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    }

    /// `PK101: device-to-host copies per step 0 -> 1, new at src/train.rs:88: FAIL`.
    pub fn line(&self) -> String {
        let mut s = String::new();
        if let Some(code) = &self.code {
            let _ = write!(s, "{code}: ");
        }
        let _ = write!(s, "{}", counter_description(&self.counter));
        if let Some(span) = &self.span {
            let _ = write!(s, " `{span}`");
        }
        let _ = write!(
            s,
            " per step {} -> {}",
            self.show(self.base),
            self.show(self.new)
        );
        if !self.process.is_empty() {
            let _ = write!(s, " ({})", self.process);
        }
        if !self.sources.is_empty() {
            let _ = write!(s, ", {}", self.sources.join(", "));
        }
        let verdict = if self.failed() {
            "FAIL".to_owned()
        } else if !self.gated {
            "not gated (a span the baseline has not)".to_owned()
        } else if self.new > self.base {
            format!("pass (growth allowed: {})", self.show(self.allowed))
        } else if self.new < self.base {
            "pass (fewer)".to_owned()
        } else {
            "same".to_owned()
        };
        let _ = write!(s, ": {verdict}");
        s
    }
}

/// The processes of a run that ran steps, in rank order.
fn stepping(processes: &[ProcessAnalysis]) -> Vec<&ProcessAnalysis> {
    processes
        .iter()
        .filter(|p| p.steps.duration.count > 0)
        .collect()
}

/// Per counter key: the per-run per-step values, and per site (total, steps) summed over runs.
type CounterKey = (String, Option<String>);
#[derive(Default)]
struct Side {
    values: BTreeMap<CounterKey, Vec<f64>>,
    sites: BTreeMap<CounterKey, BTreeMap<String, (u64, u64)>>,
    steps: u64,
    runs: usize,
}

impl Side {
    fn add(&mut self, p: &ProcessAnalysis) {
        let key = |c: &StepCounter| (c.counter.clone(), c.span.clone());
        for c in &p.step_counters {
            let v = self.values.entry(key(c)).or_default();
            // Runs that did not count it: 0.
            v.resize(self.runs, 0.0);
            v.push(c.per_step);
            let sites = self.sites.entry(key(c)).or_default();
            for s in &c.sites {
                let e = sites.entry(s.location.clone()).or_insert((0, 0));
                e.0 += s.total;
            }
        }
        self.steps += p.steps.duration.count;
        self.runs += 1;
    }

    fn median(&self, key: &CounterKey) -> f64 {
        let mut v = self.values.get(key).cloned().unwrap_or_default();
        v.resize(self.runs, 0.0);
        median_f64(&mut v)
    }

    fn per_step_at(&self, key: &CounterKey, location: &str) -> f64 {
        let total = self
            .sites
            .get(key)
            .and_then(|s| s.get(location))
            .map_or(0, |s| s.0);
        total as f64 / self.steps.max(1) as f64
    }
}

/// Median of a slice (mean of the two middle values for an even count; 0 when empty).
pub fn median_f64(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Compares the per-step counters of baseline runs with candidate runs (each a run's
/// processes). Processes are matched by position among those that ran steps (rank order);
/// when the sides have different numbers of them, the first of each is compared and a note
/// says so.
pub fn compare_counters(
    base: &[&[ProcessAnalysis]],
    new: &[&[ProcessAnalysis]],
    cfg: &CheckConfig,
) -> (Vec<CounterGate>, Vec<String>) {
    let mut notes = Vec::new();
    let count =
        |runs: &[&[ProcessAnalysis]]| runs.iter().map(|r| stepping(r).len()).min().unwrap_or(0);
    let (nb, nn) = (count(base), count(new));
    let pairs = if nb == nn {
        nb
    } else {
        notes.push(format!(
            "per-step counters: the baseline has {nb} processes that step and the candidate {nn}; only the first of each is compared"
        ));
        nb.min(nn).min(1)
    };
    let mut gates = Vec::new();
    for i in 0..pairs {
        let mut b = Side::default();
        let mut n = Side::default();
        for r in base {
            b.add(stepping(r)[i]);
        }
        for r in new {
            n.add(stepping(r)[i]);
        }
        let process = if pairs > 1 {
            stepping(new[0])[i].meta.label()
        } else {
            String::new()
        };
        let mut keys: Vec<&CounterKey> = b.values.keys().chain(n.values.keys()).collect();
        keys.sort_by_key(|k| (STEP_COUNTERS.iter().position(|c| c.0 == k.0), k.1.clone()));
        keys.dedup();
        for key in keys {
            let (vb, vn) = (b.median(key), n.median(key));
            let mut sources: Vec<(f64, String)> = Vec::new();
            if vn > vb {
                for loc in n.sites.get(key).map(|s| s.keys()).into_iter().flatten() {
                    let (sb, sn) = (b.per_step_at(key, loc), n.per_step_at(key, loc));
                    if sn <= sb {
                        continue;
                    }
                    let text = if sb == 0.0 {
                        format!("new at {loc}")
                    } else {
                        format!("more at {loc} ({sb:.1} -> {sn:.1} per step)")
                    };
                    sources.push((sn - sb, text));
                }
                sources.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                sources.truncate(5);
            }
            let gated = key.0 != "span-entries" || b.values.contains_key(key);
            gates.push(CounterGate {
                process: process.clone(),
                counter: key.0.clone(),
                span: key.1.clone(),
                code: counter_rule(&key.0).map(str::to_owned),
                base: vb,
                new: vn,
                allowed: cfg.allowed(&key.0),
                gated,
                sources: sources.into_iter().map(|s| s.1).collect(),
            });
        }
    }
    (gates, notes)
}

/// What a timing comparison concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The candidate is slower: beyond the noise and at least the minimum effect.
    Slower,
    /// The candidate is faster, by the same standard.
    Faster,
    /// The change is within run-to-run noise or below the minimum effect.
    WithinNoise,
}

impl Verdict {
    /// `slower`, `faster`, `within noise`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Slower => "slower",
            Verdict::Faster => "faster",
            Verdict::WithinNoise => "within noise",
        }
    }
}

/// Options of the timing model (from `[check]` and the flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimingOptions {
    /// See [`CheckConfig::min_effect`].
    pub min_effect: f64,
    /// See [`CheckConfig::noise_floor`].
    pub noise_floor: f64,
    /// See [`CheckConfig::alpha`].
    pub alpha: f64,
}

impl From<&CheckConfig> for TimingOptions {
    fn from(c: &CheckConfig) -> Self {
        Self {
            min_effect: c.min_effect,
            noise_floor: c.noise_floor,
            alpha: c.alpha,
        }
    }
}

/// One timed quantity compared between baseline and candidate runs, with the evidence.
///
/// Changes are shares of `scale` (the baseline's mean step time, or 1 for a share of the
/// step such as the GPU idle share), so one minimum effect and one noise floor serve every
/// quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingComparison {
    /// Baseline runs.
    pub base_runs: usize,
    /// Candidate runs.
    pub new_runs: usize,
    /// Mean of the baseline's per-run medians.
    pub base: f64,
    /// Mean of the candidate's per-run medians.
    pub new: f64,
    /// `(new - base) / scale`.
    pub change: f64,
    /// The run-to-run noise, as a share of `scale`: the standard deviation of one run's median
    /// estimated from the runs (pooled over both sides), or the noise floor with one run.
    pub noise: f64,
    /// `welch-t` or `noise-floor`.
    pub test: String,
    /// Two-sided p-value of the test (Welch only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    /// `1 - alpha` confidence interval of `change` (Welch only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<(f64, f64)>,
    /// The verdict.
    pub verdict: Verdict,
    /// True when a side has a single run: no spread could be measured.
    pub weak: bool,
    /// Why: the evidence in one sentence.
    pub reason: String,
}

/// Compares per-run values (`base`, `new`: one per run) of a quantity whose changes are read
/// as shares of `scale`. `within_se` is the standard error of each side's value from the
/// spread inside its run (used with one run per side, where it can only widen the noise).
pub fn compare_timing(
    base: &[f64],
    new: &[f64],
    scale: f64,
    within_se: f64,
    opts: TimingOptions,
) -> TimingComparison {
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (mb, mn) = (mean(base), mean(new));
    let change = (mn - mb) / scale;
    let pct = |v: f64| format!("{:.1} %", v * 100.0);
    let mut c = TimingComparison {
        base_runs: base.len(),
        new_runs: new.len(),
        base: mb,
        new: mn,
        change,
        noise: 0.0,
        test: String::new(),
        p_value: None,
        interval: None,
        verdict: Verdict::WithinNoise,
        weak: false,
        reason: String::new(),
    };
    if base.len() >= 2 && new.len() >= 2 {
        let var = |v: &[f64], m: f64| {
            v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
        };
        let (vb, vn) = (var(base, mb), var(new, mn));
        let (nb, nn) = (base.len() as f64, new.len() as f64);
        let se = (vb / nb + vn / nn).sqrt();
        let pooled_sd = (((nb - 1.0) * vb + (nn - 1.0) * vn) / (nb + nn - 2.0)).sqrt();
        c.noise = pooled_sd / scale;
        c.test = "welch-t".to_owned();
        let (p, half) = if se > 0.0 {
            let df = (vb / nb + vn / nn).powi(2)
                / ((vb / nb).powi(2) / (nb - 1.0) + (vn / nn).powi(2) / (nn - 1.0));
            let t = (mn - mb) / se;
            (
                t_two_sided_p(t, df),
                t_quantile(1.0 - opts.alpha / 2.0, df) * se / scale,
            )
        } else {
            // Identical runs on both sides: any difference is exact.
            (if mn == mb { 1.0 } else { 0.0 }, 0.0)
        };
        c.p_value = Some(p);
        c.interval = Some((change - half, change + half));
        let significant = p < opts.alpha;
        let big = change.abs() >= opts.min_effect;
        c.verdict = match (significant && big, change > 0.0) {
            (true, true) => Verdict::Slower,
            (true, false) => Verdict::Faster,
            _ => Verdict::WithinNoise,
        };
        c.reason = format!(
            "Welch t-test over per-run medians ({} vs {} runs, run-to-run sd {}): p = {:.3} {} alpha {}, {:.0} % interval of the change {} .. {}; change {} {} the minimum effect {}",
            base.len(),
            new.len(),
            pct(c.noise),
            p,
            if significant { "<" } else { ">=" },
            opts.alpha,
            (1.0 - opts.alpha) * 100.0,
            pct(change - half),
            pct(change + half),
            pct(change),
            if big { ">=" } else { "<" },
            pct(opts.min_effect)
        );
    } else {
        c.weak = true;
        c.test = "noise-floor".to_owned();
        let within = 2.0 * within_se / scale;
        c.noise = opts.noise_floor.max(within);
        let threshold = c.noise.max(opts.min_effect);
        c.verdict = if change > threshold {
            Verdict::Slower
        } else if change < -threshold {
            Verdict::Faster
        } else {
            Verdict::WithinNoise
        };
        c.reason = format!(
            "weak verdict: {} vs {} runs, so no run-to-run spread could be measured; a change counts only beyond the noise floor {} (minimum effect {}); change {} (give two or more runs per side for a test)",
            base.len(),
            new.len(),
            pct(c.noise),
            pct(opts.min_effect),
            pct(change),
        );
    }
    c
}

/// `ln Γ(x)` (Lanczos, g = 7), for `x > 0`.
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized incomplete beta function `I_x(a, b)` (continued fraction).
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The continued fraction converges fast for x < (a + 1) / (a + b + 2).
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(1.0 - x, b, a);
    }
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    if d.abs() < tiny {
        d = tiny;
    }
    d = 1.0 / d;
    let mut f = d;
    for m in 1..300 {
        let m = f64::from(m);
        let num = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 + num * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = 1.0 + num / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        f *= c * d;
        let num = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 + num * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = 1.0 + num / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-12 {
            break;
        }
    }
    front * f / a
}

/// Two-sided p-value of Student's t with `df` degrees of freedom: `P(|T| >= |t|)`.
pub fn t_two_sided_p(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return 0.0;
    }
    incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// The `q` quantile of Student's t with `df` degrees of freedom (`q` in 0.5..1).
pub fn t_quantile(q: f64, df: f64) -> f64 {
    let target = 2.0 * (1.0 - q);
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t_two_sided_p(hi, df) > target && hi < 1e6 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if t_two_sided_p(mid, df) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_distribution_matches_tables() {
        // Two-sided critical values of Student's t at 5 %: df 4 -> 2.776, df 10 -> 2.228.
        assert!((t_two_sided_p(2.776, 4.0) - 0.05).abs() < 5e-4);
        assert!((t_two_sided_p(2.228, 10.0) - 0.05).abs() < 5e-4);
        assert!((t_two_sided_p(2.0, 4.0) - 0.1161).abs() < 5e-4);
        assert!((t_two_sided_p(0.0, 3.0) - 1.0).abs() < 1e-9);
        assert!((t_quantile(0.975, 4.0) - 2.776).abs() < 1e-3);
        assert!((t_quantile(0.975, 1000.0) - 1.962).abs() < 1e-3);
    }

    fn opts() -> TimingOptions {
        TimingOptions::from(&CheckConfig::default())
    }

    #[test]
    fn one_run_per_side_is_judged_against_the_noise_floor() {
        let c = compare_timing(&[100.0], &[140.0], 100.0, 0.0, opts());
        assert_eq!(c.verdict, Verdict::WithinNoise, "{c:?}");
        assert!(c.weak && c.test == "noise-floor" && c.reason.contains("weak verdict"));
        let c = compare_timing(&[100.0], &[160.0], 100.0, 0.0, opts());
        assert_eq!(c.verdict, Verdict::Slower);
        // The runs' own per-step spread widens the noise where it is wider than the floor.
        let c = compare_timing(&[100.0], &[160.0], 100.0, 40.0, opts());
        assert_eq!(c.verdict, Verdict::WithinNoise, "{c:?}");
        let c = compare_timing(&[100.0], &[40.0], 100.0, 0.0, opts());
        assert_eq!(c.verdict, Verdict::Faster);
    }

    #[test]
    fn several_runs_need_significance_and_the_minimum_effect() {
        // 10 % slower with 1 % spread: significant and large.
        let c = compare_timing(
            &[100.0, 101.0, 99.0],
            &[110.0, 111.0, 109.0],
            100.0,
            0.0,
            opts(),
        );
        assert_eq!(c.verdict, Verdict::Slower, "{c:?}");
        assert!(c.p_value.is_some_and(|p| p < 0.01) && !c.weak);
        let (lo, hi) = c.interval.expect("interval");
        assert!(lo < 0.10 && hi > 0.10);
        // 2 % slower, clearly significant, but below the 5 % minimum effect.
        let c = compare_timing(
            &[100.0, 100.1, 99.9],
            &[102.0, 102.1, 101.9],
            100.0,
            0.0,
            opts(),
        );
        assert_eq!(c.verdict, Verdict::WithinNoise, "{c:?}");
        // 10 % apart but the runs spread by 20 %: not significant.
        let c = compare_timing(
            &[80.0, 120.0, 100.0],
            &[90.0, 130.0, 110.0],
            100.0,
            0.0,
            opts(),
        );
        assert_eq!(c.verdict, Verdict::WithinNoise, "{c:?}");
    }

    #[test]
    fn check_table_parses_and_rejects_bad_values() {
        let p = Path::new("perfkit.toml");
        let c = CheckConfig::from_toml(
            "[check]\nmin-effect = 0.1\n[check.counters]\nkernel-launches = 2\nspan-entries = inf\n",
            false,
            p,
        )
        .expect("valid");
        assert_eq!(c.min_effect, 0.1);
        assert_eq!(c.allowed("kernel-launches"), 2.0);
        assert_eq!(c.allowed("d2h-copies"), 0.0);
        assert!(c.allowed("span-entries").is_infinite());
        let err = CheckConfig::from_toml("[check.counters]\nreadbacks = 1\n", false, p)
            .expect_err("unknown counter");
        assert!(
            err.to_string().contains("unknown counter `readbacks`"),
            "{err}"
        );
        let err = CheckConfig::from_toml("[check]\nalpha = 2\n", false, p).expect_err("alpha");
        assert!(err.to_string().contains("`alpha`"), "{err}");
        let err =
            CheckConfig::from_toml("[check]\nnoise = 2\n", false, p).expect_err("unknown key");
        assert!(err.to_string().contains("noise"), "{err}");
        assert_eq!(
            CheckConfig::from_toml("[profile]\nidle-share = 0.3\n", false, p).expect("no table"),
            CheckConfig::default()
        );
    }
}
