//! PK604 memory-near-capacity.
//!
//! ## What it does
//! Reports a run whose peak device memory (allocations held, or the in-use samples) reaches
//! `memory-share` (default 90 %) of the card's memory.
//!
//! ## Why is this bad?
//! Near capacity, the next larger batch, a longer sequence or memory fragmentation ends the
//! run with an out-of-memory error, and caching allocators start freeing and re-allocating
//! (synchronizing) to make room.
//!
//! ## Compared with nsys and HTA
//! nsys records memory usage over time without an expert rule for it; HTA's memory timeline
//! shows the same curve. PK604 turns the peak into a finding with the headroom left.
//!
//! Thresholds: `memory-share`.

use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK604",
    name: "memory-near-capacity",
    severity: Severity::Note,
    help: "leave headroom: lower the batch size or use gradient accumulation, 16-bit precision or activation checkpointing",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    let m = &cx.process.memory;
    if m.device_total_bytes == 0 {
        // Card size unknown.
        return;
    }
    let share = m.peak_bytes as f64 / m.device_total_bytes as f64;
    if share < cx.cfg.memory_share {
        return;
    }
    let mut f = cx.finding(
        &RULE,
        format!(
            "peak device memory {} is {:.1}% of the card's {} ({} left)",
            format::bytes(m.peak_bytes),
            share * 100.0,
            format::bytes(m.device_total_bytes),
            format::bytes(m.device_total_bytes.saturating_sub(m.peak_bytes))
        ),
        None,
    );
    f.bytes = Some(m.peak_bytes);
    out.push(f);
}
