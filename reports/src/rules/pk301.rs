//! PK301 loader-without-workers, measured.
//!
//! ## What it does
//! Measures how long the GPU is idle while a thread that issues GPU work is inside a
//! data-loading span (`loader-spans`, default `data`, `load_batch`, `dataloader`,
//! `data_loading`, `next_batch`), between the first and the last GPU operation, and reports
//! it when it reaches `loader-idle-share` (default 5 %) of the median step. The finding
//! points at the source line that opens the loader span that took the longest (`tracing`
//! records every span's callsite), or names the span where the trace has no location.
//!
//! ## Why is this bad?
//! When the training thread loads (or waits for) its next batch while the GPU has nothing
//! queued, the GPU idles for the whole loading time. Loader workers that prepare batches
//! ahead (burn's `num_workers`, PyTorch's `DataLoader(num_workers>0)`) hide it.
//!
//! ## Compared with nsys and HTA
//! nsys' `gpu_gaps` rule finds idle stretches but does not say what the host was doing; HTA's
//! idle-time breakdown classifies GPU idle time as host-wait, kernel-wait or other. PK301 is
//! the part of the idle time spent inside named data-loading spans on the GPU-driving thread.
//!
//! Thresholds: `loader-spans`, `loader-idle-share`.

use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK301",
    name: "loader-without-workers",
    severity: Severity::Warning,
    help: "load batches ahead of the step in worker threads (num_workers > 1, prefetch) so the GPU never waits for data",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    let Some(scan) = cx.scan else {
        // Needs the span intervals.
        return;
    };
    if cx.steps == 0 || scan.loader_idle_ns == 0 || cx.median_ns == 0 {
        return;
    }
    let per_step = scan.loader_idle_ns / cx.steps;
    if (per_step as f64) < cx.cfg.loader_idle_share * cx.median_ns as f64 {
        return;
    }
    let mut f = cx.finding(
        &RULE,
        format!(
            "the GPU is idle for {} per step while the training thread is in data loading ({})",
            format::duration(per_step),
            scan.loader_names.join(", ")
        ),
        Some(per_step),
    );
    // The loader span's own source line when the trace has it (tracing records each span's
    // callsite), else its name.
    f.location = scan
        .loader_location
        .clone()
        .or_else(|| scan.loader_names.first().map(|n| format!("span `{n}`")));
    out.push(f);
}
