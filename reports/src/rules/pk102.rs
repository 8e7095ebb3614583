//! PK102 sync-in-step-loop, measured.
//!
//! ## What it does
//! Reports each source line that explicitly synchronizes (device, stream, context or event)
//! in at least `min-step-fraction` of the steps. The cost is the host time blocked in those
//! synchronizations per step.
//!
//! ## Why is this bad?
//! A synchronization makes the host wait until the GPU has drained its queue; inside the
//! step loop it removes the overlap of host work (data loading, the next launches) with GPU
//! work, so every step pays the launch latency again.
//!
//! ## Compared with nsys and HTA
//! nsys' `cuda_api_sync` expert rule lists every synchronization API call
//! (`cudaDeviceSynchronize`, `cudaStreamSynchronize`, ...) with its duration, including the
//! ones outside the loop; HTA shows their effect as host-wait GPU idle time. PK102 reports only
//! synchronizations that recur per step, grouped by the caller's source line, with their
//! blocked time per step and share of the step.
//!
//! Thresholds: `min-step-fraction`, `min-share`.

use super::scan::SiteKind;
use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK102",
    name: "sync-in-step-loop",
    severity: Severity::Warning,
    help: "remove the synchronization from the step loop: stream order already serializes the work; synchronize only before reading results on the host or timing",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    for (site, per_step) in cx.recurring_sites(SiteKind::Sync) {
        let mut f = cx.finding(
            &RULE,
            format!(
                "{} synchronizations in {} of {} steps block the host for {} per step",
                site.count,
                site.steps_hit,
                cx.steps,
                format::duration(per_step)
            ),
            Some(per_step),
        );
        f.location = Some(site.location.clone());
        f.count = Some(site.count);
        out.push(f);
    }
}
