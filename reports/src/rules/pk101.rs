//! PK101 host-readback-in-step-loop, measured.
//!
//! ## What it does
//! Reports each source line that copies a small amount of data from the device to the host
//! (mean size at most `small-copy-bytes`, default 64 KiB) in at least `min-step-fraction` of
//! the steps (default half). The cost is the host time spent in those copy calls per step:
//! a device-to-host copy into pageable memory returns only when the GPU has finished all the
//! work queued before it, so that time is the host waiting for the GPU.
//!
//! ## Why is this bad?
//! Reading a loss or a metric back every step (`.item()` in PyTorch; `to_scalar`, `to_vec0`,
//! `into_scalar`, `clone_dtoh` in Rust) drains the launch queue: the host cannot run ahead
//! and the GPU idles while the host prepares the next step.
//!
//! ## Compared with nsys and HTA
//! nsys' `cuda_memcpy_sync` expert rule lists every synchronous memcpy call, whatever its
//! size or place in the program; HTA's idle-time breakdown shows the GPU idle time such waits
//! cause as "host wait" without naming the call. PK101 keeps only small device-to-host copies
//! that recur per step (the `.item()` pattern), groups them by the caller's source line and
//! prices them in step time.
//!
//! A blocking copy whose end event completed only after the call returned has its GPU end
//! set to the host return (the copy was over by then); the finding says how many of its
//! copies are timed so, as their GPU time is then an upper bound, not a measurement.
//!
//! Thresholds: `small-copy-bytes`, `min-step-fraction`, `min-share`.

use super::scan::SiteKind;
use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK101",
    name: "host-readback-in-step-loop",
    severity: Severity::Warning,
    help: "keep per-step values on the device (accumulate losses/metrics in a device tensor) and read them back every N steps or after the loop",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    for (site, per_step) in cx.recurring_sites(SiteKind::D2H) {
        if site.bytes / site.count.max(1) > cx.cfg.small_copy_bytes {
            continue;
        }
        let mut message = format!(
            "{} small device-to-host copies ({} each) in {} of {} steps block the host for {} per step",
            site.count,
            format::bytes(site.bytes / site.count.max(1)),
            site.steps_hit,
            cx.steps,
            format::duration(per_step)
        );
        message.push_str(&host_return_note(site.count, site.gpu_end_at_host_return));
        out.push(cx.site_finding(&RULE, site, message, per_step));
    }
}

/// The sentence added to a readback finding when some of its `count` copies have their GPU
/// end at the host return (`bounded` of them); empty when none has.
pub(crate) fn host_return_note(count: u64, bounded: u64) -> String {
    match bounded {
        0 => String::new(),
        b if b >= count => {
            "; their GPU time ends at the host return (an upper bound: each copy was over when the call returned)".to_owned()
        }
        b => format!(
            "; the GPU time of {b} of them ends at the host return (an upper bound: the copy was over when the call returned)"
        ),
    }
}
