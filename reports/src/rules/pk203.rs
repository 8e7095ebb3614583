//! PK203 per-sample-upload, measured.
//!
//! ## What it does
//! Reports each source line that issues many tiny host-to-device copies per step: at least
//! `tiny-copies-per-step` (default 16) copies per step whose mean size is at most
//! `tiny-copy-bytes` (default 64 KiB). The cost is the host time spent in those copy calls
//! per step (their GPU time is shown in the message).
//!
//! ## Why is this bad?
//! Each copy pays a fixed launch and DMA set-up cost of several microseconds whatever its
//! size; uploading a batch sample by sample pays it once per sample instead of once per batch,
//! and the tiny transfers never reach the link's bandwidth.
//!
//! ## Compared with nsys and HTA
//! nsys has no expert rule for it: its memory-operation summaries (`cuda_gpu_mem_size_sum`,
//! `cuda_gpu_mem_time_sum`) give counts and sizes for the whole run, and HTA's trace views show
//! the copies one by one. PK203 counts tiny uploads per step and per source line.
//!
//! Thresholds: `tiny-copy-bytes`, `tiny-copies-per-step`, `min-share`.

use super::scan::SiteKind;
use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK203",
    name: "per-sample-upload",
    severity: Severity::Warning,
    help: "assemble the batch in one host buffer (ideally pinned) and upload it with one copy per step",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    let Some(scan) = cx.scan else {
        // Needs the per-step attribution of source lines.
        return;
    };
    if cx.steps == 0 {
        return;
    }
    for site in scan
        .sites
        .iter()
        .filter(|s| matches!(s.kind, SiteKind::H2D(_)))
    {
        let per_step_count = site.count as f64 / cx.steps as f64;
        if per_step_count < cx.cfg.tiny_copies_per_step
            || site.bytes / site.count.max(1) > cx.cfg.tiny_copy_bytes
        {
            continue;
        }
        let per_step = site.host_ns / cx.steps;
        if !cx.worth_reporting(per_step) {
            continue;
        }
        out.push(cx.site_finding(
            &RULE,
            site,
            format!(
                "{:.0} tiny host-to-device copies per step ({} each) cost {} of host time and {} of GPU time per step",
                per_step_count,
                format::bytes(site.bytes / site.count.max(1)),
                format::duration(per_step),
                format::duration(site.gpu_ns / cx.steps)
            ),
            per_step,
        ));
    }
}
