//! PK202 alloc-in-step-loop, measured.
//!
//! ## What it does
//! Reports each source line that allocates device memory in at least `min-step-fraction` of
//! the steps. The cost is the host time spent in the allocation calls per step; the bytes
//! are the bytes allocated inside steps.
//!
//! ## Why is this bad?
//! Device allocations are expensive driver calls (`cuMemAlloc` may synchronize the device)
//! and fragment memory; buffers whose shape does not change belong outside the loop, or in
//! a caching allocator.
//!
//! ## Compared with nsys and HTA
//! nsys lists `cudaMalloc`/`cuMemAlloc` calls in its CUDA API summary but has no expert rule
//! for allocations in a loop; HTA reports memory over time. PK202 groups allocations by the
//! caller's source line and reports the ones that recur per step.
//!
//! Thresholds: `min-step-fraction`, `min-share`.

use super::scan::SiteKind;
use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK202",
    name: "alloc-in-step-loop",
    severity: Severity::Note,
    help: "allocate the buffers once before the loop and reuse them every step (or use a caching allocator)",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    for (site, per_step) in cx.recurring_sites(SiteKind::Alloc) {
        out.push(cx.site_finding(
            &RULE,
            site,
            format!(
                "{} device allocations ({} in all) in {} of {} steps cost {} of host time per step",
                site.count,
                format::bytes(site.bytes),
                site.steps_hit,
                cx.steps,
                format::duration(per_step)
            ),
            per_step,
        ));
    }
}
