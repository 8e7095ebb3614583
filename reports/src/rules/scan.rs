//! One pass over a process trace collecting what the per-source-line rules need and the
//! analysis does not keep: operations attributed to the step that issued them, allocation
//! sites, data-loading spans on the threads that drive the GPU, and GPU gaps inside steps.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::event::{Event, OpKind};
use crate::model::Direction;
use crate::source::TraceSource;
use crate::stats::IntervalUnion;

/// What the operations of a [`Site`] are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteKind {
    /// Device-to-host copies.
    D2H,
    /// Host-to-device copies from pinned (`true`) or pageable (`false`) host memory;
    /// `None` when the recorder did not know.
    H2D(Option<bool>),
    /// Explicit synchronizations.
    Sync,
    /// Device allocations.
    Alloc,
}

/// Operations of one kind issued from one source line inside steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// What they are.
    pub kind: SiteKind,
    /// `file:line` of the caller, or `unknown`.
    pub location: String,
    /// Operations issued inside a step.
    pub count: u64,
    /// Distinct steps in which this line issued at least one operation.
    pub steps_hit: u64,
    /// Bytes copied or allocated.
    pub bytes: u64,
    /// Host time spent in the calls (for a synchronization: the time the host was blocked).
    pub host_ns: u64,
    /// GPU time of the operations (copies), 0 when not measured.
    pub gpu_ns: u64,
    /// Copies whose GPU end is the host return of the blocking call (an upper bound of
    /// their GPU time; see [`crate::event::GpuOp::gpu_end_at_host_return`]).
    pub gpu_end_at_host_return: u64,
}

/// What one pass over a process trace found.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Step spans seen (each entered interval of a span named like the step span).
    pub steps: u64,
    /// Wall time inside steps.
    pub step_ns: u64,
    /// Per source line and kind, sorted by host time, largest first.
    pub sites: Vec<Site>,
    /// GPU operations with a measured GPU time (kernels, copies, memsets).
    pub timed_gpu_ops: u64,
    /// Time the GPU was idle inside steps (between the first and the last GPU operation).
    pub idle_in_steps_ns: u64,
    /// Idle gaps inside steps at least `gap_ns` long.
    pub gaps: u64,
    /// Longest idle gap inside a step.
    pub longest_gap_ns: u64,
    /// Time inside data-loading spans on threads that issue GPU work (union).
    pub loader_ns: u64,
    /// Part of `loader_ns` during which the GPU was idle.
    pub loader_idle_ns: u64,
    /// Names of the data-loading spans seen on those threads.
    pub loader_names: Vec<String>,
    /// `file:line` of the data-loading span that took the most time on those threads, when
    /// its callsite's location is recorded.
    pub loader_location: Option<String>,
    /// Pinned host-to-device copies of the whole run: bytes and GPU time (for the bandwidth).
    pub pinned_h2d_bytes: u64,
    /// GPU time of those copies.
    pub pinned_h2d_gpu_ns: u64,
}

struct Op {
    kind: SiteKind,
    site: u32,
    host_start: u64,
    host_end: u64,
    bytes: u64,
    gpu_ns: u64,
    gpu_end_at_host_return: bool,
}

/// Reads `path` once. `step_span`: the step span name (`None`: the one in the trace header);
/// `loader_spans`: names of data-loading spans; `gap_ns`: shortest gap counted.
pub fn scan_file(
    path: &Path,
    step_span: Option<&str>,
    loader_spans: &[String],
    gap_ns: u64,
) -> crate::Result<Scan> {
    let source = TraceSource::open(path)?;
    let step_name = step_span.map_or_else(|| source.step_span().to_owned(), str::to_owned);
    let mut open: HashMap<u64, (u64, u64, u8)> = HashMap::new(); // span -> (thread, enter ts, 1 step / 2 loader)
    let mut steps: Vec<(u64, u64)> = Vec::new();
    let mut loaders: Vec<(u64, u64, u64, u32)> = Vec::new(); // thread, start, end, loader index
    // Distinct loader spans: name and callsite location.
    let mut loader_kinds: Vec<(String, Option<String>)> = Vec::new();
    let mut open_loaders: HashMap<u64, u32> = HashMap::new();
    let mut busy: Vec<(u64, u64)> = Vec::new();
    let mut pending: HashMap<u64, usize> = HashMap::new(); // op id -> index in ops awaiting timing
    let mut pending_busy: HashSet<u64> = HashSet::new();
    let mut gpu_threads: HashSet<u64> = HashSet::new();
    let mut site_ids: HashMap<(SiteKind, String), u32> = HashMap::new();
    let mut site_keys: Vec<(SiteKind, String)> = Vec::new();
    let mut ops: Vec<Op> = Vec::new();
    let mut scan = Scan::default();

    // Damage in the file ends the scan at the last good record, as it ends the analysis (which
    // names the damage): the rules judge what was read before it.
    source.run(&mut |ev| match ev {
        Event::Enter {
            thread,
            span,
            name,
            file,
            line,
            ts_ns,
            ..
        } => {
            if *name == step_name {
                open.insert(*span, (*thread, *ts_ns, 1));
            } else if loader_spans.iter().any(|l| l == name) {
                open.insert(*span, (*thread, *ts_ns, 2));
                let location = file.map(|f| format!("{f}:{line}"));
                let index = match loader_kinds
                    .iter()
                    .position(|(n, l)| n == name && *l == location)
                {
                    Some(i) => i,
                    None => {
                        loader_kinds.push(((*name).to_owned(), location));
                        loader_kinds.len() - 1
                    }
                };
                open_loaders.insert(*span, index as u32);
            }
        }
        Event::Exit { span, ts_ns, .. } => {
            if let Some((thread, start, what)) = open.remove(span) {
                if what == 1 {
                    steps.push((start, (*ts_ns).max(start)));
                } else if let Some(index) = open_loaders.remove(span) {
                    loaders.push((thread, start, (*ts_ns).max(start), index));
                }
            }
        }
        Event::Gpu(op) => {
            gpu_threads.insert(op.thread);
            let gpu_ns = op.gpu_ns();
            let timed = op.gpu_start_ns.is_some() && op.gpu_end_ns.is_some();
            if matches!(op.kind, OpKind::Kernel | OpKind::Copy(_) | OpKind::Memset) {
                if let (Some(s), Some(e)) = (op.gpu_start_ns, op.gpu_end_ns) {
                    busy.push((s, e));
                    scan.timed_gpu_ops += 1;
                } else if op.id != 0 {
                    pending_busy.insert(op.id);
                }
            }
            if op.kind == OpKind::Copy(Direction::H2D) && op.pinned == Some(true) && timed {
                scan.pinned_h2d_bytes = scan.pinned_h2d_bytes.saturating_add(op.bytes);
                scan.pinned_h2d_gpu_ns = scan.pinned_h2d_gpu_ns.saturating_add(gpu_ns);
            }
            let kind = match op.kind {
                OpKind::Copy(Direction::D2H) => SiteKind::D2H,
                OpKind::Copy(Direction::H2D) => SiteKind::H2D(op.pinned),
                OpKind::Sync => SiteKind::Sync,
                OpKind::Alloc => SiteKind::Alloc,
                _ => return,
            };
            let location = match op.file {
                Some(f) => format!("{f}:{}", op.line),
                None => "unknown".to_owned(),
            };
            let key = (kind, location);
            let next = site_keys.len() as u32;
            let site = *site_ids.entry(key.clone()).or_insert_with(|| {
                site_keys.push(key);
                next
            });
            if !timed && op.id != 0 && matches!(kind, SiteKind::D2H | SiteKind::H2D(_)) {
                pending.insert(op.id, ops.len());
            }
            ops.push(Op {
                kind,
                site,
                host_start: op.host_start_ns,
                host_end: op.host_end_ns,
                bytes: op.bytes,
                gpu_ns,
                gpu_end_at_host_return: op.gpu_end_at_host_return,
            });
        }
        Event::GpuTiming {
            id,
            gpu_start_ns,
            gpu_end_ns,
        } => {
            if pending_busy.remove(id) {
                busy.push((*gpu_start_ns, *gpu_end_ns));
                scan.timed_gpu_ops += 1;
            }
            if let Some(i) = pending.remove(id) {
                ops[i].gpu_ns = gpu_end_ns.saturating_sub(*gpu_start_ns);
            }
        }
        _ => {}
    });

    steps.sort_unstable();
    scan.steps = steps.len() as u64;
    scan.step_ns = steps.iter().map(|(s, e)| e - s).sum();
    let busy = IntervalUnion::build(busy);

    // Operations, attributed to the step whose interval holds their host start.
    let step_of = |t: u64| -> Option<usize> {
        let i = steps.partition_point(|&(s, _)| s <= t);
        (i > 0 && t < steps[i - 1].1).then(|| i - 1)
    };
    let mut acc: Vec<Site> = site_keys
        .iter()
        .map(|(kind, location)| Site {
            kind: *kind,
            location: location.clone(),
            count: 0,
            steps_hit: 0,
            bytes: 0,
            host_ns: 0,
            gpu_ns: 0,
            gpu_end_at_host_return: 0,
        })
        .collect();
    let mut hit: HashSet<(u32, usize)> = HashSet::new();
    for op in &ops {
        let Some(step) = step_of(op.host_start) else {
            // Outside every step (set-up, evaluation): not a per-step cost.
            continue;
        };
        let s = &mut acc[op.site as usize];
        debug_assert_eq!(s.kind, op.kind);
        s.count += 1;
        s.bytes = s.bytes.saturating_add(op.bytes);
        s.host_ns = s
            .host_ns
            .saturating_add(op.host_end.saturating_sub(op.host_start));
        s.gpu_ns = s.gpu_ns.saturating_add(op.gpu_ns);
        s.gpu_end_at_host_return += u64::from(op.gpu_end_at_host_return);
        if hit.insert((op.site, step)) {
            s.steps_hit += 1;
        }
    }
    acc.retain(|s| s.count > 0);
    acc.sort_by(|a, b| {
        b.host_ns
            .cmp(&a.host_ns)
            .then_with(|| a.location.cmp(&b.location))
    });
    scan.sites = acc;

    // GPU idle inside steps, between the first and the last GPU operation.
    if let (Some((first, _)), Some((_, last))) = (busy.iter().next(), busy.iter().last()) {
        for &(s, e) in &steps {
            let (a, b) = (s.max(first), e.min(last));
            if b <= a {
                continue;
            }
            for (gs, ge) in busy.gaps(a, b) {
                let len = ge - gs;
                scan.idle_in_steps_ns += len;
                if len >= gap_ns {
                    scan.gaps += 1;
                    scan.longest_gap_ns = scan.longest_gap_ns.max(len);
                }
            }
        }
        // Data loading on the threads that drive the GPU.
        // Time per distinct loader span on those threads; `None` where it never ran there.
        let mut time_per_kind: Vec<Option<u64>> = vec![None; loader_kinds.len()];
        let driving: Vec<(u64, u64)> = loaders
            .iter()
            .filter(|(t, ..)| gpu_threads.contains(t))
            .map(|&(_, s, e, index)| {
                *time_per_kind[index as usize].get_or_insert(0) += e - s;
                (s, e)
            })
            .collect();
        let mut names: Vec<String> = Vec::new();
        for ((name, _), time) in loader_kinds.iter().zip(&time_per_kind) {
            if time.is_some() && !names.contains(name) {
                names.push(name.clone());
            }
        }
        // The first of the longest, so that ties resolve in file order.
        scan.loader_location = loader_kinds
            .iter()
            .zip(&time_per_kind)
            .enumerate()
            .filter_map(|(i, ((_, location), time))| Some((time.as_ref()?, i, location.as_ref()?)))
            .max_by_key(|&(time, i, _)| (*time, std::cmp::Reverse(i)))
            .map(|(_, _, location)| location.clone());
        let loading = IntervalUnion::build(driving);
        scan.loader_ns = loading.total();
        scan.loader_idle_ns = loading
            .iter()
            .map(|(a, b)| {
                // Only between the first and the last GPU operation: before the first
                // launch nothing could have run anyway.
                let (a, b) = (a.max(first), b.min(last));
                if b <= a {
                    0
                } else {
                    (b - a) - busy.covered(a, b)
                }
            })
            .sum();
        names.sort();
        scan.loader_names = names;
    }
    Ok(scan)
}
