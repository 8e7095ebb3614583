//! PK601 gpu-idle-gaps.
//!
//! ## What it does
//! Measures the time the GPU does nothing inside steps (between the first and the last GPU
//! operation of the run) and reports it when it reaches `idle-share` (default 20 %) of the
//! time inside steps. Gaps of at least `gap-ns` (default 100 µs) are counted and the longest
//! is shown.
//!
//! ## Why is this bad?
//! Idle GPU time inside the training loop is time paid for and not used: the host is too slow
//! to feed the GPU (launch overhead, data loading, synchronizations, Python/host work).
//!
//! ## Compared with nsys and HTA
//! nsys' `gpu_gaps` expert rule reports every gap longer than a threshold (500 ms by default)
//! over the whole run; HTA's idle-time breakdown (`get_idle_time_breakdown`) reports idle
//! time per stream and classifies it as host wait, kernel wait or other. PK601
//! counts idle time only inside steps (set-up and evaluation do not count), relative to step
//! time, with a much shorter gap threshold suited to millisecond steps.
//!
//! Thresholds: `idle-share`, `gap-ns`.

use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK601",
    name: "gpu-idle-gaps",
    severity: Severity::Warning,
    help: "look at what the host does in the gaps (timeline of the report): remove per-step synchronizations and readbacks, load data ahead, fuse small kernels",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    let Some(scan) = cx.scan else {
        // Needs the GPU intervals inside steps.
        return;
    };
    if cx.steps == 0 || scan.step_ns == 0 || scan.timed_gpu_ops == 0 {
        return;
    }
    let share = scan.idle_in_steps_ns as f64 / scan.step_ns as f64;
    if share < cx.cfg.idle_share {
        return;
    }
    let per_step = scan.idle_in_steps_ns / cx.steps;
    let mut f = cx.finding(
        &RULE,
        format!(
            "the GPU is idle {:.1}% of the time inside steps ({} per step); {} gaps of at least {}, the longest {}",
            share * 100.0,
            format::duration(per_step),
            scan.gaps,
            format::duration(cx.cfg.gap_ns),
            format::duration(scan.longest_gap_ns)
        ),
        Some(per_step),
    );
    f.count = Some(scan.gaps);
    out.push(f);
}
