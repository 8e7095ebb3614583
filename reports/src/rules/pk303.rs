//! PK303 pageable-upload-in-step-loop, measured.
//!
//! ## What it does
//! Reports each source line that copies from pageable (not page-locked) host memory to the
//! device in at least `min-step-fraction` of the steps. The measured time of those copies per
//! step is the larger of the host time in the copy calls and their GPU time. When the same run
//! also has pinned host-to-device copies, their achieved bandwidth gives the time the same
//! bytes would take from pinned memory, and the cost reported is the difference (what pinning
//! would save); otherwise the cost is the whole measured time.
//!
//! ## Why is this bad?
//! The driver cannot DMA from pageable memory: it copies the data into an internal pinned
//! staging buffer first, the copy is synchronous for the host, and it reaches a fraction of
//! the bandwidth a pinned buffer gets. Pinned staging buffers (PyTorch's `pin_memory=True`)
//! also let the copy overlap compute.
//!
//! ## Compared with nsys and HTA
//! nsys' `cuda_memcpy_async` expert rule flags asynchronous memcpy calls that use pageable
//! memory (they silently become synchronous), for every call; HTA has no analysis of its own
//! for it. PK303 reports pageable
//! uploads that recur per step (synchronous ones too), grouped by source line, and prices
//! them against the pinned bandwidth measured in the same run.
//!
//! Thresholds: `min-step-fraction`, `min-share`.

use super::scan::SiteKind;
use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK303",
    name: "pageable-upload-in-step-loop",
    severity: Severity::Note,
    help: "stage uploads through a pinned (page-locked) host buffer allocated once, and copy asynchronously from it",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    let Some(scan) = cx.scan else {
        // Needs the per-step attribution of source lines.
        return;
    };
    if cx.steps == 0 {
        return;
    }
    // Bytes per GPU nanosecond = GB/s.
    let pinned_gbps = (scan.pinned_h2d_gpu_ns > 0)
        .then(|| scan.pinned_h2d_bytes as f64 / scan.pinned_h2d_gpu_ns as f64);
    for site in scan
        .sites
        .iter()
        .filter(|s| s.kind == SiteKind::H2D(Some(false)))
    {
        if !cx.per_step(site.steps_hit) {
            continue;
        }
        let measured = site.host_ns.max(site.gpu_ns) / cx.steps;
        let bytes_per_step = site.bytes / cx.steps;
        let pageable_gbps = (site.gpu_ns > 0).then(|| site.bytes as f64 / site.gpu_ns as f64);
        let (cost, detail) = match pinned_gbps {
            Some(bw) => {
                let pinned_ns = (bytes_per_step as f64 / bw).round() as u64;
                (
                    measured.saturating_sub(pinned_ns),
                    format!(
                        "pinned copies in this run reached {bw:.2} GB/s: {} per step from pinned memory",
                        format::duration(pinned_ns)
                    ),
                )
            }
            None => (
                measured,
                "the run has no pinned copies to compare with".to_owned(),
            ),
        };
        if !cx.worth_reporting(cost) {
            continue;
        }
        let achieved = pageable_gbps.map_or_else(String::new, |g| format!(" at {g:.2} GB/s"));
        out.push(cx.site_finding(
            &RULE,
            site,
            format!(
                "pageable host-to-device copies of {} per step take {}{achieved}; {detail}",
                format::bytes(bytes_per_step),
                format::duration(measured)
            ),
            cost,
        ));
    }
}
