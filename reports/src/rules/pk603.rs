//! PK603 low-gpu-utilization.
//!
//! ## What it does
//! Computes each step's GPU time-utilization (time in which a kernel, copy or memset ran,
//! divided by the step's wall time) from the per-step series of the analysis, and reports the
//! run when at least `low-utilization-steps` (default 25 %) of the steps are below
//! `utilization` (default 50 %). The cost per step is the mean idle time of those steps.
//!
//! ## Why is this bad?
//! A GPU that is busy less than half of each step is paid for twice what it does; the
//! run is bound by the host, data loading or synchronization.
//!
//! ## Compared with nsys and HTA
//! nsys' `gpu_time_util` expert rule splits the run into chunks (10 % of its length) and
//! flags chunks whose time-utilization is below 50 %; HTA's temporal breakdown
//! (`get_temporal_breakdown`) gives idle, compute and non-compute time per rank. PK603 uses the training step as the unit instead of
//! fixed chunks, so warm-up and evaluation do not dilute it.
//!
//! Thresholds: `utilization`, `low-utilization-steps`.

use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK603",
    name: "low-gpu-utilization",
    severity: Severity::Warning,
    help: "find what the host does while the GPU waits (timeline, PK601/PK101/PK102/PK301 findings) and overlap it with GPU work",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    let series = &cx.process.steps.series;
    if series.is_empty() {
        return;
    }
    let weight = cx.process.steps.series_bucket.max(1);
    let (mut low, mut idle_sum, mut util_sum) = (0u64, 0u64, 0f64);
    for p in series {
        let b = &p.breakdown;
        if b.wall_ns == 0 {
            continue;
        }
        let busy = b.kernel_ns + b.copy_ns;
        let util = busy as f64 / b.wall_ns as f64;
        if util < cx.cfg.utilization {
            low += weight;
            idle_sum += (b.wall_ns - busy.min(b.wall_ns)) * weight;
            util_sum += util * weight as f64;
        }
    }
    let total = series.len() as u64 * weight;
    if low == 0 || (low as f64) < cx.cfg.low_utilization_steps * total as f64 {
        return;
    }
    let per_low_step = idle_sum / low;
    let mut f = cx.finding(
        &RULE,
        format!(
            "{low} of {total} steps keep the GPU busy less than {:.0}% of the time (mean {:.1}%, {} idle per such step)",
            cx.cfg.utilization * 100.0,
            util_sum / low as f64 * 100.0,
            format::duration(per_low_step)
        ),
        Some(per_low_step),
    );
    f.count = Some(low);
    out.push(f);
}
