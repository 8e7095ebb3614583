//! PK602 launch-bound-kernels.
//!
//! ## What it does
//! Reports kernels whose mean GPU time is shorter than the mean host time of their launch
//! call, launched at least once per step on average, in a run whose GPU is idle at least
//! `idle-share` of the time inside steps (a launch call that blocks because the launch queue
//! is full is long too, but then the GPU is saturated, not starved). The cost per step is the
//! launch time not covered by the kernel's own GPU time: `(launch - duration) x launches / steps`.
//!
//! ## Why is this bad?
//! When a kernel runs for less time than the host needs to launch it, the GPU finishes each
//! kernel before the next one arrives: the run is bound by launch overhead, not by compute.
//! Fuse the kernels, use bigger batches, or capture the step in a CUDA graph.
//!
//! ## Compared with nsys and HTA
//! HTA's "short kernels" analysis (`get_cuda_kernel_launch_stats`) flags kernels whose
//! duration is below a fixed cutoff and compares launch delay with duration; nsys has no
//! expert rule for it. PK602 uses each kernel's own launch cost as the cutoff, so it adapts
//! to the host and the API in use.
//!
//! Thresholds: `idle-share`, `min-share`.

use super::{Cx, RuntimeRule};
use crate::findings::{Finding, Severity};
use crate::format;

pub(super) const RULE: RuntimeRule = RuntimeRule {
    code: "PK602",
    name: "launch-bound-kernels",
    severity: Severity::Note,
    help: "fuse small kernels, raise the batch size, or capture the step in a CUDA graph so launches stop dominating",
};

pub(super) fn check(cx: &Cx<'_>, out: &mut Vec<Finding>) {
    if cx.steps == 0 {
        return;
    }
    let idle_share = match cx.scan {
        Some(s) if s.step_ns > 0 => s.idle_in_steps_ns as f64 / s.step_ns as f64,
        _ => {
            let b = &cx.process.steps.total;
            if b.wall_ns == 0 {
                return;
            }
            (b.idle_ns + b.sync_wait_ns) as f64 / b.wall_ns as f64
        }
    };
    if idle_share < cx.cfg.idle_share {
        // The GPU is kept busy: long launch calls are back-pressure, not launch overhead.
        return;
    }
    for k in &cx.process.kernels {
        if k.count < cx.steps || k.total_ns == 0 {
            // Not launched every step, or not timed on the GPU.
            continue;
        }
        let launch_mean = k.launch_ns / k.count;
        if k.mean_ns >= launch_mean {
            continue;
        }
        let per_step = (launch_mean - k.mean_ns) * k.count / cx.steps;
        if !cx.worth_reporting(per_step) {
            continue;
        }
        let mut f = cx.finding(
            &RULE,
            format!(
                "kernel `{}` runs {} on the GPU but its launch takes {} on the host ({} launches, {:.1} per step)",
                k.name,
                format::duration(k.mean_ns),
                format::duration(launch_mean),
                k.count,
                k.count as f64 / cx.steps as f64
            ),
            Some(per_step),
        );
        f.location = Some(format!("kernel `{}`", k.name));
        f.count = Some(k.count);
        out.push(f);
    }
}
