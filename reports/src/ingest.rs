//! Streaming accumulation of one process's events into a [`ProcessAnalysis`].
//!
//! Host spans are aggregated on the fly (per thread a stack of open spans, per distinct
//! span stack one node); memory therefore grows with the number of distinct stacks, span
//! names, kernel names and source lines, plus 16 bytes per GPU operation and per step
//! (the GPU intervals are kept to compute exact busy/idle unions at the end).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::event::{Event, GpuOp, OpKind, PyFrames};
use crate::model::{
    CopyGroup, CopySite, CopyStats, CounterSite, Direction, GpuTime, KernelStats, MemoryStats,
    OpTotals, ProcessAnalysis, ProcessMeta, STEP_COUNTERS, SpanStats, StackTime, StepBreakdown,
    StepCounter, StepPoint, StepSummary, SyncSite, SyncStats, ThreadInfo,
};
use crate::source::ReadOutcome;
use crate::stats::{Distribution, IntervalUnion};

const NO_PARENT: u32 = u32::MAX;
/// The name id of the marker frame that stands for the frames below [`MAX_STACK_DEPTH`].
const DEEPER: u32 = u32::MAX - 1;
/// Most frames of one stack (spans, then the Python frames of GPU work) kept in the folded
/// stacks, the flamegraphs and `stacks`: the frames below the 256th are folded into one frame
/// `[N deeper frames]` (N: the most frames it stands for). Real programs nest a few tens of
/// spans; without a limit, a stack N spans deep gives N stacks of up to N frames (a trace of
/// 20,000 nested spans, 300 KB, would fold into gigabytes).
pub const MAX_STACK_DEPTH: usize = 256;
/// The flamegraph frame of GPU work issued by a Python thread that did not hold the GIL.
pub const NO_GIL_FRAME: &str = "[Python: GIL released, no frames]";
/// Points kept in the memory series before it is halved.
const MEMORY_POINTS: usize = 2048;

/// Options that change what the analysis counts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AnalyzeOptions {
    /// Name of the span that marks one training step. Default `None`: the name the
    /// recorder wrote into the trace header (itself `step` unless configured).
    pub step_span: Option<String>,
    /// Most entries in the per-step series; more steps are averaged in buckets. Default 2000.
    pub max_step_series: usize,
    /// Most stacks kept in the folded output (the largest by host + GPU time). Default 20000.
    pub max_stacks: usize,
    /// Most timeline items per chosen step window. Default 4000.
    pub max_timeline_items: usize,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        Self {
            step_span: None,
            max_step_series: 2000,
            max_stacks: 20_000,
            max_timeline_items: 4000,
        }
    }
}

#[derive(Debug)]
struct Node {
    parent: u32,
    /// A name id, or [`DEEPER`] for the marker of the frames below [`MAX_STACK_DEPTH`].
    name: u32,
    host_self_ns: u64,
    gpu_ns: u64,
    /// For the marker: the most frames it stands for.
    folded: u64,
}

#[derive(Debug)]
struct Frame {
    span: u64,
    node: u32,
    name: u32,
    /// Frames of the stack up to this one (1: outermost).
    depth: usize,
    start: u64,
    child_ns: u64,
    step: Option<u64>,
}

#[derive(Debug, Default, Clone)]
struct NameAcc {
    calls: u64,
    exits: u64,
    total: u64,
    self_ns: u64,
    max: u64,
}

/// A copy site: source line, direction, pinned.
type SiteKey = (String, Direction, Option<bool>);

#[derive(Debug, Clone, Copy)]
enum GpuTarget {
    Kernel(u32),
    Copy { kind: u32, site: u32 },
    Memset,
}

#[derive(Debug, Default)]
struct KernelAcc {
    count: u64,
    timed: u64,
    total: u64,
    min: u64,
    max: u64,
    launch: u64,
}

/// Index into [`STEP_COUNTERS`].
mod counter {
    pub const D2H_COPIES: u8 = 0;
    pub const SYNCS: u8 = 1;
    pub const H2D_COPIES: u8 = 2;
    pub const H2D_BYTES: u8 = 3;
    pub const H2D_COPIES_PAGEABLE: u8 = 4;
    pub const H2D_BYTES_PAGEABLE: u8 = 5;
    pub const DEVICE_ALLOCS: u8 = 6;
    pub const KERNEL_LAUNCHES: u8 = 7;
    pub const SPAN_ENTRIES: u8 = 8;
}

/// A per-step counter: which counter, the span name id for span entries (else `NO_PARENT`).
type CounterKey = (u8, u32);

/// Counts of the step open on one thread.
#[derive(Debug, Default)]
struct OpenStep {
    /// The step span's id.
    span: u64,
    /// Per counter and caller location id: the count so far in this step.
    counts: HashMap<(CounterKey, u32), u64>,
}

/// Per-step counts of the completed steps.
#[derive(Debug, Default)]
struct StepCounting {
    /// Steps folded in.
    steps: u64,
    /// Per thread, the step open on it.
    open: HashMap<u64, OpenStep>,
    /// Caller locations (`file:line`) by id.
    locations: Vec<String>,
    location_ids: HashMap<String, u32>,
    /// Per counter: how many steps had each non-zero count.
    histograms: HashMap<CounterKey, BTreeMap<u64, u64>>,
    /// Per counter and location: total, steps in which it happened.
    sites: HashMap<(CounterKey, u32), (u64, u64)>,
}

impl StepCounting {
    fn location(&mut self, file: Option<&str>, line: u32) -> u32 {
        let text = match file {
            Some(f) if !f.is_empty() => format!("{f}:{line}"),
            _ => "unknown".to_owned(),
        };
        if let Some(&id) = self.location_ids.get(&text) {
            return id;
        }
        let id = self.locations.len() as u32;
        self.locations.push(text.clone());
        self.location_ids.insert(text, id);
        id
    }

    /// Counts `n` of `key` at a caller location, when a step is open on `thread`.
    fn count(&mut self, thread: u64, key: CounterKey, file: Option<&str>, line: u32, n: u64) {
        if !self.open.contains_key(&thread) {
            return;
        }
        let loc = self.location(file, line);
        if let Some(open) = self.open.get_mut(&thread) {
            let count = open.counts.entry((key, loc)).or_insert(0);
            *count = count.saturating_add(n);
        }
    }

    /// Folds the step open on `thread` into the totals, when `span` is that step.
    fn close(&mut self, thread: u64, span: u64, completed: bool) {
        if self.open.get(&thread).is_none_or(|o| o.span != span) {
            return;
        }
        let Some(open) = self.open.remove(&thread) else {
            return;
        };
        // A step cut short by the end of the trace is not a step.
        if !completed {
            return;
        }
        self.steps += 1;
        let mut per_key: HashMap<CounterKey, u64> = HashMap::new();
        for ((key, loc), n) in open.counts {
            let count = per_key.entry(key).or_insert(0);
            *count = count.saturating_add(n);
            let site = self.sites.entry((key, loc)).or_insert((0, 0));
            site.0 = site.0.saturating_add(n);
            site.1 += 1;
        }
        for (key, n) in per_key {
            *self
                .histograms
                .entry(key)
                .or_default()
                .entry(n)
                .or_insert(0) += 1;
        }
    }

    fn finish(self, names: &[String]) -> Vec<StepCounter> {
        let mut out: Vec<StepCounter> = self
            .histograms
            .iter()
            .map(|(&(kind, name), hist)| {
                let mut sites: Vec<CounterSite> = self
                    .sites
                    .iter()
                    .filter(|((key, _), _)| *key == (kind, name))
                    .map(|((_, loc), &(total, steps))| CounterSite {
                        location: self.locations[*loc as usize].clone(),
                        total,
                        steps,
                    })
                    .collect();
                sites.sort_by(|a, b| b.total.cmp(&a.total).then(a.location.cmp(&b.location)));
                StepCounter {
                    counter: STEP_COUNTERS[kind as usize].0.to_owned(),
                    span: (name != NO_PARENT).then(|| names[name as usize].clone()),
                    per_step: histogram_median(hist, self.steps),
                    max_per_step: hist.keys().next_back().copied().unwrap_or(0),
                    total: hist
                        .iter()
                        .fold(0u64, |sum, (v, n)| sum.saturating_add(v.saturating_mul(*n))),
                    sites,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            let index = |c: &StepCounter| STEP_COUNTERS.iter().position(|k| k.0 == c.counter);
            index(a).cmp(&index(b)).then_with(|| a.span.cmp(&b.span))
        });
        out
    }
}

/// Median of `steps` values of which those listed in `hist` (value -> steps) are non-zero and
/// the others 0; for an even count the mean of the two middle values.
fn histogram_median(hist: &BTreeMap<u64, u64>, steps: u64) -> f64 {
    if steps == 0 {
        return 0.0;
    }
    let zeros = steps.saturating_sub(hist.values().sum());
    // The value at ascending rank `r` (0-based).
    let at = |r: u64| -> u64 {
        if r < zeros {
            return 0;
        }
        let mut seen = zeros;
        for (&v, &n) in hist {
            seen += n;
            if r < seen {
                return v;
            }
        }
        hist.keys().next_back().copied().unwrap_or(0)
    };
    if steps % 2 == 1 {
        at(steps / 2) as f64
    } else {
        (at(steps / 2 - 1) as f64 + at(steps / 2) as f64) / 2.0
    }
}

/// One process's accumulator.
#[derive(Debug)]
pub struct ProcessIngest {
    step_name: String,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    name_acc: Vec<NameAcc>,
    nodes: Vec<Node>,
    children: HashMap<(u32, u32), u32>,
    stacks: HashMap<u64, Vec<Frame>>,
    thread_names: HashMap<u64, String>,
    /// Open span id -> node and depth, for GPU operations that name their enclosing span.
    open_spans: HashMap<u64, (u32, usize)>,
    /// Per thread and name id: frames of that name on the thread's stack (a span is counted
    /// into its name's total only where it is the outermost of its name).
    open_names: HashMap<(u64, u32), u32>,
    /// The deepest stack, when it passed [`MAX_STACK_DEPTH`] (else 0).
    deepest: u64,
    /// GPU operations (or late timings) left out as malformed.
    invalid_gpu: u64,
    /// Span id -> name id of spans entered and not yet closed (a call is counted at close).
    unclosed: HashMap<u64, u32>,
    steps: Vec<(u64, u64, u64)>,
    step_ordinal: u64,
    /// Set while `finish` closes the spans still open at the end of the trace.
    closing_at_end: bool,
    kernels_iv: Vec<(u64, u64)>,
    copies_iv: Vec<(u64, u64)>,
    syncs_iv: Vec<(u64, u64)>,
    kernels: Vec<(String, KernelAcc)>,
    kernel_ids: HashMap<String, u32>,
    copy_kinds: Vec<((Direction, Option<bool>), OpTotals)>,
    copy_kind_ids: HashMap<(Direction, Option<bool>), u32>,
    copy_sites: Vec<(SiteKey, OpTotals)>,
    /// Per copy site: copies whose GPU end is the host return.
    copy_sites_at_host_return: Vec<u64>,
    copy_site_ids: HashMap<SiteKey, u32>,
    pending: HashMap<u64, (Option<u32>, GpuTarget)>,
    device_total: u64,
    sampled_peak: u64,
    samples: Vec<(u64, u64)>,
    memsets: OpTotals,
    sync_sites: HashMap<String, (u64, u64)>,
    sync_count: u64,
    sync_blocked: u64,
    mem_current: i128,
    memory: MemoryStats,
    mem_bucket_ns: u64,
    streams: BTreeSet<u64>,
    first_ts: Option<u64>,
    last_ts: u64,
    dropped: u64,
    counting: StepCounting,
}

impl ProcessIngest {
    /// A fresh accumulator; `step_span` names the spans that mark steps.
    pub fn new(step_span: &str) -> Self {
        Self {
            step_name: step_span.to_owned(),
            names: Vec::new(),
            name_ids: HashMap::new(),
            name_acc: Vec::new(),
            nodes: Vec::new(),
            children: HashMap::new(),
            stacks: HashMap::new(),
            thread_names: HashMap::new(),
            open_spans: HashMap::new(),
            open_names: HashMap::new(),
            deepest: 0,
            invalid_gpu: 0,
            unclosed: HashMap::new(),
            steps: Vec::new(),
            step_ordinal: 0,
            closing_at_end: false,
            kernels_iv: Vec::new(),
            copies_iv: Vec::new(),
            syncs_iv: Vec::new(),
            kernels: Vec::new(),
            kernel_ids: HashMap::new(),
            copy_kinds: Vec::new(),
            copy_kind_ids: HashMap::new(),
            copy_sites: Vec::new(),
            copy_sites_at_host_return: Vec::new(),
            copy_site_ids: HashMap::new(),
            pending: HashMap::new(),
            device_total: 0,
            sampled_peak: 0,
            samples: Vec::new(),
            memsets: OpTotals::default(),
            sync_sites: HashMap::new(),
            sync_count: 0,
            sync_blocked: 0,
            mem_current: 0,
            memory: MemoryStats::default(),
            mem_bucket_ns: 0,
            streams: BTreeSet::new(),
            first_ts: None,
            last_ts: 0,
            dropped: 0,
            counting: StepCounting::default(),
        }
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.name_ids.insert(name.to_owned(), id);
        self.name_acc.push(NameAcc::default());
        id
    }

    /// The node of frame `name` below `parent`, `depth` frames deep (1: outermost). Below
    /// [`MAX_STACK_DEPTH`] frames, every frame is one marker node under the last frame kept.
    fn child(&mut self, parent: u32, name: u32, depth: usize) -> u32 {
        let name = if depth > MAX_STACK_DEPTH {
            self.deepest = self.deepest.max(depth as u64);
            let folded = (depth - MAX_STACK_DEPTH) as u64;
            if let Some(p) = self.nodes.get_mut(parent as usize)
                && p.name == DEEPER
            {
                p.folded = p.folded.max(folded);
                return parent;
            }
            DEEPER
        } else {
            name
        };
        let id = match self.children.get(&(parent, name)) {
            Some(&n) => n,
            None => {
                let id = self.nodes.len() as u32;
                self.nodes.push(Node {
                    parent,
                    name,
                    host_self_ns: 0,
                    gpu_ns: 0,
                    folded: 0,
                });
                self.children.insert((parent, name), id);
                id
            }
        };
        if name == DEEPER {
            let n = &mut self.nodes[id as usize];
            n.folded = n.folded.max((depth - MAX_STACK_DEPTH) as u64);
        }
        id
    }

    fn see_ts(&mut self, ts: u64) {
        if self.first_ts.is_none_or(|f| ts < f) {
            self.first_ts = Some(ts);
        }
        self.last_ts = self.last_ts.max(ts);
    }

    /// Feeds one event.
    pub fn push(&mut self, event: &Event<'_>) {
        match *event {
            Event::Thread { thread, name } => {
                self.thread_names.insert(thread, name.to_owned());
            }
            Event::Enter {
                thread,
                span,
                name,
                step,
                file,
                line,
                ts_ns,
            } => {
                self.see_ts(ts_ns);
                let name = self.intern(name);
                if self.names[name as usize] == self.step_name {
                    // The outermost step span of the thread opens a step.
                    self.counting
                        .open
                        .entry(thread)
                        .or_insert_with(|| OpenStep {
                            span,
                            counts: HashMap::new(),
                        });
                } else {
                    self.counting
                        .count(thread, (counter::SPAN_ENTRIES, name), file, line, 1);
                }
                let (parent, depth) = self
                    .stacks
                    .get(&thread)
                    .and_then(|s| s.last())
                    .map_or((NO_PARENT, 1), |f| (f.node, f.depth + 1));
                let node = self.child(parent, name, depth);
                self.open_spans.insert(span, (node, depth));
                self.unclosed.insert(span, name);
                self.thread_names.entry(thread).or_default();
                *self.open_names.entry((thread, name)).or_insert(0) += 1;
                self.stacks.entry(thread).or_default().push(Frame {
                    span,
                    node,
                    name,
                    depth,
                    start: ts_ns,
                    child_ns: 0,
                    step,
                });
            }
            Event::Exit {
                thread,
                span,
                ts_ns,
            } => {
                self.see_ts(ts_ns);
                let Some(stack) = self.stacks.get(&thread) else {
                    // An exit without its enter (the trace began mid-span): nothing to close.
                    return;
                };
                let Some(pos) = stack.iter().rposition(|f| f.span == span) else {
                    return;
                };
                // Spans above the one exited were left open (out-of-order exit): close them too.
                while self.stacks.get(&thread).is_some_and(|s| s.len() > pos) {
                    self.close_top(thread, ts_ns);
                }
            }
            Event::Close { span } => {
                if let Some(name) = self.unclosed.remove(&span) {
                    self.name_acc[name as usize].calls += 1;
                }
            }
            Event::Gpu(op) => self.gpu(&op),
            Event::GpuTiming {
                id,
                gpu_start_ns,
                gpu_end_ns,
            } => {
                if let Some((node, target)) = self.pending.remove(&id) {
                    self.gpu_time(node, target, gpu_start_ns, gpu_end_ns);
                }
            }
            Event::Device { total_bytes } => {
                self.device_total = self.device_total.max(total_bytes);
            }
            Event::DeviceMemory {
                ts_ns,
                used_bytes,
                total_bytes,
            } => {
                self.see_ts(ts_ns);
                self.device_total = self.device_total.max(total_bytes);
                if used_bytes > self.sampled_peak {
                    self.sampled_peak = used_bytes;
                }
                if self.samples.len() < MEMORY_POINTS * 4 {
                    self.samples.push((ts_ns, used_bytes));
                }
            }
            Event::Dropped { count } => self.dropped = self.dropped.saturating_add(count),
            Event::InvalidGpu => self.invalid_gpu += 1,
            Event::Other { ts_ns } => {
                if let Some(ts) = ts_ns {
                    self.see_ts(ts);
                }
            }
        }
    }

    fn close_top(&mut self, thread: u64, ts: u64) {
        let Some(stack) = self.stacks.get_mut(&thread) else {
            return;
        };
        let Some(frame) = stack.pop() else {
            return;
        };
        let dur = ts.saturating_sub(frame.start);
        let self_ns = dur.saturating_sub(frame.child_ns);
        // The outermost frame of its name on this thread (counted without a walk of the
        // stack, which can be deep).
        let outermost = match self.open_names.get_mut(&(thread, frame.name)) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.open_names.remove(&(thread, frame.name));
                true
            }
        };
        if let Some(parent) = stack.last_mut() {
            parent.child_ns = parent.child_ns.saturating_add(dur);
        }
        self.open_spans.remove(&frame.span);
        let node = &mut self.nodes[frame.node as usize].host_self_ns;
        *node = node.saturating_add(self_ns);
        let acc = &mut self.name_acc[frame.name as usize];
        acc.exits += 1;
        acc.self_ns = acc.self_ns.saturating_add(self_ns);
        acc.max = acc.max.max(dur);
        if outermost {
            acc.total = acc.total.saturating_add(dur);
        }
        self.counting
            .close(thread, frame.span, !self.closing_at_end);
        if self.names[frame.name as usize] == self.step_name && !self.closing_at_end {
            let index = frame.step.unwrap_or(self.step_ordinal);
            self.step_ordinal += 1;
            self.steps.push((index, frame.start, ts.max(frame.start)));
        }
    }

    /// Counts an operation toward the step open on its thread.
    fn count_in_step(&mut self, op: &GpuOp<'_>) {
        use counter::*;
        let mut counts: [(u8, u64); 4] = [(u8::MAX, 0); 4];
        match op.kind {
            OpKind::Copy(Direction::D2H) => counts[0] = (D2H_COPIES, 1),
            OpKind::Copy(Direction::H2D) => {
                counts[0] = (H2D_COPIES, 1);
                counts[1] = (H2D_BYTES, op.bytes);
                // Host memory not known to be pinned counts as pageable.
                if op.pinned != Some(true) {
                    counts[2] = (H2D_COPIES_PAGEABLE, 1);
                    counts[3] = (H2D_BYTES_PAGEABLE, op.bytes);
                }
            }
            OpKind::Sync => counts[0] = (SYNCS, 1),
            OpKind::Alloc => counts[0] = (DEVICE_ALLOCS, 1),
            OpKind::Kernel => counts[0] = (KERNEL_LAUNCHES, 1),
            OpKind::Copy(Direction::D2D) | OpKind::Memset | OpKind::Free => return,
        }
        for (kind, n) in counts {
            if kind != u8::MAX {
                self.counting
                    .count(op.thread, (kind, NO_PARENT), op.file, op.line, n);
            }
        }
    }

    fn location(op: &GpuOp<'_>) -> String {
        match op.file {
            Some(f) if !f.is_empty() => format!("{f}:{}", op.line),
            _ => "unknown".to_owned(),
        }
    }

    fn kernel_index(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.kernel_ids.get(name) {
            return i;
        }
        let i = self.kernels.len() as u32;
        self.kernels.push((name.to_owned(), KernelAcc::default()));
        self.kernel_ids.insert(name.to_owned(), i);
        i
    }

    fn copy_kind_index(&mut self, key: (Direction, Option<bool>)) -> u32 {
        if let Some(&i) = self.copy_kind_ids.get(&key) {
            return i;
        }
        let i = self.copy_kinds.len() as u32;
        self.copy_kinds.push((key, OpTotals::default()));
        self.copy_kind_ids.insert(key, i);
        i
    }

    fn copy_site_index(&mut self, key: SiteKey) -> u32 {
        if let Some(&i) = self.copy_site_ids.get(&key) {
            return i;
        }
        let i = self.copy_sites.len() as u32;
        self.copy_sites.push((key.clone(), OpTotals::default()));
        self.copy_sites_at_host_return.push(0);
        self.copy_site_ids.insert(key, i);
        i
    }

    fn gpu(&mut self, op: &GpuOp<'_>) {
        self.see_ts(op.host_start_ns);
        self.see_ts(op.host_end_ns);
        if let Some(stream) = op.stream
            && !matches!(op.kind, OpKind::Alloc | OpKind::Free | OpKind::Sync)
        {
            self.streams.insert(stream);
        }
        let host_ns = op.host_end_ns.saturating_sub(op.host_start_ns);
        self.count_in_step(op);
        // The issuing host stack: the enclosing span the recorder named, else the thread's top.
        let node = op
            .span
            .and_then(|s| self.open_spans.get(&s).copied())
            .or_else(|| {
                self.stacks
                    .get(&op.thread)
                    .and_then(|s| s.last())
                    .map(|f| (f.node, f.depth))
            });
        let depth = node.map_or(0, |(_, d)| d);
        let node = node.map(|(n, _)| n);
        // Below the span stack, the Python frames of the issuing thread (outermost first).
        let node = match op.python {
            PyFrames::None => node,
            PyFrames::GilNotHeld => {
                let name = self.intern(NO_GIL_FRAME);
                Some(self.child(node.unwrap_or(NO_PARENT), name, depth + 1))
            }
            PyFrames::Frames(frames) => {
                let mut n = node.unwrap_or(NO_PARENT);
                // The frames kept by name; those below the depth limit all go to the marker,
                // which only needs the depth of the innermost.
                let named = frames.len().min(MAX_STACK_DEPTH.saturating_sub(depth));
                for (i, f) in frames.iter().rev().take(named).enumerate() {
                    let name = self.intern(&crate::source::python_frame_name(f));
                    n = self.child(n, name, depth + i + 1);
                }
                if named < frames.len() {
                    n = self.child(n, DEEPER, depth + frames.len());
                }
                (n != NO_PARENT).then_some(n)
            }
        };
        let target = match op.kind {
            OpKind::Kernel => {
                let k = self.kernel_index(op.name);
                let acc = &mut self.kernels[k as usize].1;
                acc.count += 1;
                acc.launch = acc.launch.saturating_add(host_ns);
                GpuTarget::Kernel(k)
            }
            OpKind::Copy(direction) => {
                let pinned = if direction == Direction::D2D {
                    None
                } else {
                    op.pinned
                };
                let kind = self.copy_kind_index((direction, pinned));
                let site = self.copy_site_index((Self::location(op), direction, pinned));
                let t = &mut self.copy_kinds[kind as usize].1;
                t.count += 1;
                t.bytes = t.bytes.saturating_add(op.bytes);
                t.host_ns = t.host_ns.saturating_add(host_ns);
                let t = &mut self.copy_sites[site as usize].1;
                t.count += 1;
                t.bytes = t.bytes.saturating_add(op.bytes);
                t.host_ns = t.host_ns.saturating_add(host_ns);
                self.copy_sites_at_host_return[site as usize] +=
                    u64::from(op.gpu_end_at_host_return);
                GpuTarget::Copy { kind, site }
            }
            OpKind::Memset => {
                self.memsets.count += 1;
                self.memsets.bytes = self.memsets.bytes.saturating_add(op.bytes);
                self.memsets.host_ns = self.memsets.host_ns.saturating_add(host_ns);
                GpuTarget::Memset
            }
            OpKind::Sync => {
                self.sync_count += 1;
                self.sync_blocked = self.sync_blocked.saturating_add(host_ns);
                let site = self.sync_sites.entry(Self::location(op)).or_default();
                site.0 += 1;
                site.1 = site.1.saturating_add(host_ns);
                if host_ns > 0 {
                    self.syncs_iv.push((op.host_start_ns, op.host_end_ns));
                }
                return;
            }
            OpKind::Alloc => {
                self.memory.allocs += 1;
                self.memory.allocated_bytes = self.memory.allocated_bytes.saturating_add(op.bytes);
                self.mem_current += i128::from(op.bytes);
                self.memory_point(op.host_end_ns);
                return;
            }
            OpKind::Free => {
                self.memory.frees += 1;
                self.mem_current -= i128::from(op.bytes);
                self.memory_point(op.host_end_ns);
                return;
            }
        };
        match (op.gpu_start_ns, op.gpu_end_ns) {
            (Some(s), Some(e)) => self.gpu_time(node, target, s, e),
            _ if op.id != 0 => {
                self.pending.insert(op.id, (node, target));
            }
            _ => {}
        }
    }

    /// Accounts the GPU time of an operation (at issue, or when its timing arrives).
    fn gpu_time(&mut self, node: Option<u32>, target: GpuTarget, start: u64, end: u64) {
        self.see_ts(start);
        self.see_ts(end);
        let gpu_ns = end.saturating_sub(start);
        if gpu_ns > 0 {
            let node = match node {
                Some(n) => n,
                None => {
                    let root = self.intern("[no span]");
                    self.child(NO_PARENT, root, 1)
                }
            };
            let total = &mut self.nodes[node as usize].gpu_ns;
            *total = total.saturating_add(gpu_ns);
        }
        match target {
            GpuTarget::Kernel(k) => {
                let acc = &mut self.kernels[k as usize].1;
                if acc.timed == 0 || gpu_ns < acc.min {
                    acc.min = gpu_ns;
                }
                acc.timed += 1;
                acc.total = acc.total.saturating_add(gpu_ns);
                acc.max = acc.max.max(gpu_ns);
                if gpu_ns > 0 {
                    self.kernels_iv.push((start, end));
                }
            }
            GpuTarget::Copy { kind, site } => {
                let total = &mut self.copy_kinds[kind as usize].1.gpu_ns;
                *total = total.saturating_add(gpu_ns);
                let total = &mut self.copy_sites[site as usize].1.gpu_ns;
                *total = total.saturating_add(gpu_ns);
                if gpu_ns > 0 {
                    self.copies_iv.push((start, end));
                }
            }
            GpuTarget::Memset => {
                self.memsets.gpu_ns = self.memsets.gpu_ns.saturating_add(gpu_ns);
                if gpu_ns > 0 {
                    self.copies_iv.push((start, end));
                }
            }
        }
    }

    fn memory_point(&mut self, ts: u64) {
        let current = self.mem_current.max(0) as u64;
        if current > self.memory.peak_bytes {
            self.memory.peak_bytes = current;
            self.memory.peak_at_ns = ts;
        }
        let series = &mut self.memory.series;
        // Same bucket as the last point: keep the maximum.
        if let Some(last) = series.last_mut()
            && self.mem_bucket_ns > 0
            && ts / self.mem_bucket_ns == last.0 / self.mem_bucket_ns
        {
            last.1 = last.1.max(current);
            return;
        }
        series.push((ts, current));
        if series.len() >= MEMORY_POINTS {
            self.mem_bucket_ns = (self.mem_bucket_ns * 2).max(ts / MEMORY_POINTS as u64 + 1);
            let bucket = self.mem_bucket_ns;
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(MEMORY_POINTS / 2);
            for &(t, b) in series.iter() {
                match merged.last_mut() {
                    Some(last) if t / bucket == last.0 / bucket => last.1 = last.1.max(b),
                    _ => merged.push((t, b)),
                }
            }
            *series = merged;
        }
    }

    /// Closes open spans and computes the analysis of this process.
    pub fn finish(
        mut self,
        meta: ProcessMeta,
        outcome: ReadOutcome,
        options: &AnalyzeOptions,
    ) -> ProcessAnalysis {
        let ReadOutcome {
            complete,
            error: read_error,
            records,
        } = outcome;
        let end = self.last_ts;
        let mut unclosed = 0u64;
        // A step still open at the end was cut short: it is not a step (the one definition
        // every output shares: completed steps only).
        self.closing_at_end = true;
        let threads: Vec<u64> = self.stacks.keys().copied().collect();
        for thread in threads {
            while self.stacks.get(&thread).is_some_and(|s| !s.is_empty()) {
                self.close_top(thread, end);
                unclosed += 1;
            }
        }
        // Spans entered but never closed (trace cut short, or never dropped) count once.
        for (_, name) in std::mem::take(&mut self.unclosed) {
            self.name_acc[name as usize].calls += 1;
        }
        let start = self.first_ts.unwrap_or(0);
        let duration_ns = end.saturating_sub(start);

        // Spans by name.
        let mut spans: Vec<SpanStats> = self
            .names
            .iter()
            .zip(&self.name_acc)
            .filter(|(_, a)| a.exits > 0)
            .map(|(name, a)| SpanStats {
                name: name.clone(),
                // Each busy interval (enter to exit) is a call, as the profiler's summary
                // counts them: a span entered many times is not one call.
                calls: a.exits,
                total_ns: a.total,
                self_ns: a.self_ns,
                mean_ns: a.total / a.exits.max(1),
                max_ns: a.max,
            })
            .collect();
        spans.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));

        // GPU unions.
        let kernels_u = IntervalUnion::build(std::mem::take(&mut self.kernels_iv));
        let copies_u = IntervalUnion::build(std::mem::take(&mut self.copies_iv));
        let syncs_u = IntervalUnion::build(std::mem::take(&mut self.syncs_iv));
        let busy_u = kernels_u.merge(&copies_u);
        let busy_sync_u = busy_u.merge(&syncs_u);
        let breakdown = |a: u64, b: u64| {
            let wall = b.saturating_sub(a);
            let kernel = kernels_u.covered(a, b);
            let busy = busy_u.covered(a, b);
            let with_sync = busy_sync_u.covered(a, b);
            StepBreakdown {
                wall_ns: wall,
                kernel_ns: kernel,
                copy_ns: busy - kernel,
                sync_wait_ns: with_sync - busy,
                idle_ns: wall.saturating_sub(with_sync),
                sync_blocked_ns: syncs_u.covered(a, b),
            }
        };

        // Steps.
        self.steps.sort_by_key(|s| s.1);
        let durations: Vec<u64> = self.steps.iter().map(|s| s.2 - s.1).collect();
        let mut total = StepBreakdown::default();
        let per_step: Vec<StepPoint> = self
            .steps
            .iter()
            .map(|&(index, a, b)| {
                let bd = breakdown(a, b);
                add_breakdown(&mut total, &bd);
                StepPoint {
                    index,
                    start_ns: a,
                    breakdown: bd,
                }
            })
            .collect();
        let timeline_windows = crate::timeline::choose_windows(&per_step);
        let bucket = per_step
            .len()
            .div_ceil(options.max_step_series.max(1))
            .max(1);
        let series = per_step
            .chunks(bucket)
            .map(|chunk| {
                let mut sum = StepBreakdown::default();
                for p in chunk {
                    add_breakdown(&mut sum, &p.breakdown);
                }
                let n = chunk.len() as u64;
                StepPoint {
                    index: chunk[0].index,
                    start_ns: chunk[0].start_ns,
                    breakdown: StepBreakdown {
                        wall_ns: sum.wall_ns / n,
                        kernel_ns: sum.kernel_ns / n,
                        copy_ns: sum.copy_ns / n,
                        sync_wait_ns: sum.sync_wait_ns / n,
                        idle_ns: sum.idle_ns / n,
                        sync_blocked_ns: sum.sync_blocked_ns / n,
                    },
                }
            })
            .collect();
        let steps = StepSummary {
            span_name: self.step_name.clone(),
            duration: Distribution::of(&durations),
            total,
            series,
            series_bucket: bucket as u64,
        };

        let busy = busy_u.covered(start, end.max(start));
        let longest_gap_ns = match (busy_u.iter().next(), busy_u.iter().last()) {
            (Some((first, _)), Some((_, last))) => busy_u
                .gaps(first, last)
                .iter()
                .map(|(a, b)| b - a)
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        let gpu = GpuTime {
            window_ns: duration_ns,
            busy_ns: busy,
            kernel_ns: kernels_u.covered(start, end.max(start)),
            idle_ns: duration_ns.saturating_sub(busy),
            utilization_percent: if duration_ns > 0 && !busy_u.is_empty() {
                round2(busy as f64 / duration_ns as f64 * 100.0)
            } else {
                0.0
            },
            in_steps: steps.total.clone(),
            longest_gap_ns,
        };

        // Copies.
        let mut copies = CopyStats::default();
        let mut by_kind: Vec<CopyGroup> = std::mem::take(&mut self.copy_kinds)
            .into_iter()
            .map(|((direction, pinned), totals)| {
                add_totals(&mut copies.total, &totals);
                CopyGroup {
                    direction,
                    pinned,
                    bandwidth_gbps: round_sig(totals.bandwidth_gbps()),
                    totals,
                }
            })
            .collect();
        by_kind.sort_by(|a, b| {
            (a.direction, a.pinned.map(|p| !p)).cmp(&(b.direction, b.pinned.map(|p| !p)))
        });
        copies.by_kind = by_kind;
        let at_host_return = std::mem::take(&mut self.copy_sites_at_host_return);
        let mut by_site: Vec<CopySite> = std::mem::take(&mut self.copy_sites)
            .into_iter()
            .zip(at_host_return)
            .map(
                |(((location, direction, pinned), totals), bounded)| CopySite {
                    location,
                    direction,
                    pinned,
                    bandwidth_gbps: round_sig(totals.bandwidth_gbps()),
                    totals,
                    gpu_end_at_host_return: bounded,
                },
            )
            .collect();
        by_site.sort_by(|a, b| {
            b.totals
                .gpu_ns
                .cmp(&a.totals.gpu_ns)
                .then(b.totals.bytes.cmp(&a.totals.bytes))
                .then(a.location.cmp(&b.location))
                .then(a.direction.cmp(&b.direction))
        });
        copies.by_site = by_site;

        // Kernels.
        let mut kernels: Vec<KernelStats> = std::mem::take(&mut self.kernels)
            .into_iter()
            .map(|(name, k)| KernelStats {
                name,
                count: k.count,
                total_ns: k.total,
                mean_ns: k.total / k.timed.max(1),
                min_ns: k.min,
                max_ns: k.max,
                launch_ns: k.launch,
            })
            .collect();
        kernels.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));

        // Syncs.
        let mut sync_sites: Vec<SyncSite> = self
            .sync_sites
            .into_iter()
            .map(|(location, (count, blocked_ns))| SyncSite {
                location,
                count,
                blocked_ns,
            })
            .collect();
        sync_sites.sort_by(|a, b| {
            b.blocked_ns
                .cmp(&a.blocked_ns)
                .then(a.location.cmp(&b.location))
        });

        // Folded stacks.
        let mut stacks: Vec<StackTime> = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.host_self_ns == 0 && node.gpu_ns == 0 {
                continue;
            }
            let mut frames = Vec::new();
            let mut cur = i as u32;
            while cur != NO_PARENT {
                let n = &self.nodes[cur as usize];
                frames.push(if n.name == DEEPER {
                    deeper_frame(n.folded)
                } else {
                    self.names[n.name as usize].clone()
                });
                cur = n.parent;
            }
            frames.reverse();
            stacks.push(StackTime {
                frames,
                host_ns: node.host_self_ns,
                gpu_ns: node.gpu_ns,
            });
        }
        if stacks.len() > options.max_stacks {
            stacks.sort_by_key(|s| std::cmp::Reverse(s.host_ns + s.gpu_ns));
            stacks.truncate(options.max_stacks);
        }
        stacks.sort_by(|a, b| a.frames.cmp(&b.frames));

        let step_counters = std::mem::take(&mut self.counting).finish(&self.names);
        let mut memory = std::mem::take(&mut self.memory);
        memory.device_total_bytes = self.device_total;
        if self.sampled_peak > memory.peak_bytes {
            memory.peak_bytes = self.sampled_peak;
            memory.peak_at_ns = self
                .samples
                .iter()
                .find(|s| s.1 == self.sampled_peak)
                .map_or(0, |s| s.0);
        }
        if memory.series.is_empty() && !self.samples.is_empty() {
            let step = self.samples.len().div_ceil(MEMORY_POINTS).max(1);
            memory.series = self
                .samples
                .chunks(step)
                .map(|c| (c[0].0, c.iter().map(|s| s.1).max().unwrap_or(0)))
                .collect();
        }
        let mut threads: Vec<ThreadInfo> = self
            .thread_names
            .into_iter()
            .map(|(id, name)| ThreadInfo { id, name })
            .collect();
        threads.sort_by_key(|t| t.id);

        ProcessAnalysis {
            meta,
            offset_ns: 0,
            duration_ns,
            // Records read: one record can become two events.
            events: records,
            dropped_events: self.dropped,
            complete,
            read_error,
            unclosed_spans: unclosed,
            deepest_stack: (self.deepest > 0).then_some(self.deepest),
            invalid_gpu_ops: self.invalid_gpu,
            threads,
            streams: self.streams.into_iter().collect(),
            spans,
            steps,
            gpu,
            copies,
            kernels,
            memsets: self.memsets,
            syncs: SyncStats {
                count: self.sync_count,
                blocked_ns: self.sync_blocked,
                by_site: sync_sites,
            },
            memory,
            stacks,
            step_counters,
            timeline_windows,
        }
    }
}

/// The marker frame that stands for `n` frames below [`MAX_STACK_DEPTH`].
pub fn deeper_frame(n: u64) -> String {
    if n == 1 {
        "[1 deeper frame]".to_owned()
    } else {
        format!("[{n} deeper frames]")
    }
}

fn add_breakdown(sum: &mut StepBreakdown, b: &StepBreakdown) {
    sum.wall_ns = sum.wall_ns.saturating_add(b.wall_ns);
    sum.kernel_ns = sum.kernel_ns.saturating_add(b.kernel_ns);
    sum.copy_ns = sum.copy_ns.saturating_add(b.copy_ns);
    sum.sync_wait_ns = sum.sync_wait_ns.saturating_add(b.sync_wait_ns);
    sum.idle_ns = sum.idle_ns.saturating_add(b.idle_ns);
    sum.sync_blocked_ns = sum.sync_blocked_ns.saturating_add(b.sync_blocked_ns);
}

fn add_totals(sum: &mut OpTotals, t: &OpTotals) {
    sum.count = sum.count.saturating_add(t.count);
    sum.bytes = sum.bytes.saturating_add(t.bytes);
    sum.gpu_ns = sum.gpu_ns.saturating_add(t.gpu_ns);
    sum.host_ns = sum.host_ns.saturating_add(t.host_ns);
}

/// Rounds to four significant digits (bandwidths span KB/s to TB/s).
pub(crate) fn round_sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return 0.0;
    }
    let scale = 10f64.powi(3 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// Rounds to two decimals (percentages in JSON).
pub(crate) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Rounds to three decimals (stable JSON output).
pub(crate) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enter(ingest: &mut ProcessIngest, span: u64, ts_ns: u64) {
        ingest.push(&Event::Enter {
            thread: 1,
            span,
            name: "f",
            step: None,
            file: None,
            line: 0,
            ts_ns,
        });
    }

    /// A kernel on thread 1 whose Python thread did not hold the GIL.
    fn kernel(start: u64, end: u64) -> GpuOp<'static> {
        GpuOp {
            kind: OpKind::Kernel,
            thread: 1,
            stream: Some(1),
            host_start_ns: start,
            host_end_ns: start + 1,
            gpu_start_ns: Some(start),
            gpu_end_ns: Some(end),
            gpu_end_at_host_return: false,
            bytes: 0,
            pinned: None,
            name: "k",
            file: None,
            line: 0,
            span: None,
            id: 0,
            python: PyFrames::GilNotHeld,
        }
    }

    /// Frames below [`MAX_STACK_DEPTH`] (spans, and the Python frames below them) fold into
    /// one marker frame that keeps their host and GPU time.
    #[test]
    fn frames_below_the_depth_limit_fold_into_one_marker() {
        let mut ingest = ProcessIngest::new("step");
        let depth = MAX_STACK_DEPTH as u64 + 44;
        for i in 0..depth {
            enter(&mut ingest, i + 1, i * 10);
        }
        ingest.push(&Event::Gpu(kernel(5_000, 5_100)));
        for i in (0..depth).rev() {
            ingest.push(&Event::Exit {
                thread: 1,
                span: i + 1,
                ts_ns: 10_000 + (depth - i) * 10,
            });
        }
        let outcome = ReadOutcome {
            complete: true,
            ..ReadOutcome::default()
        };
        let p = ingest.finish(ProcessMeta::default(), outcome, &AnalyzeOptions::default());
        // The GIL frame is one deeper than the deepest span.
        assert_eq!(p.deepest_stack, Some(depth + 1));
        assert_eq!(p.stacks.len(), MAX_STACK_DEPTH + 1);
        let marker = p.stacks.last().expect("stacks");
        assert_eq!(marker.frames.len(), MAX_STACK_DEPTH + 1);
        assert_eq!(marker.frames[MAX_STACK_DEPTH], "[45 deeper frames]");
        assert_eq!(marker.gpu_ns, 100);
        // 43 frames of 20 ns of self time, and the innermost span's.
        assert_eq!(marker.host_ns, 43 * 20 + (10_010 - 2_990));
        // The span table is exact: every call, and the outermost call's time once.
        let f = &p.spans[0];
        assert_eq!((f.calls, f.total_ns), (depth, 10_000 + depth * 10));

        // At an ordinary depth, the frames are kept as they are.
        let mut ingest = ProcessIngest::new("step");
        enter(&mut ingest, 1, 0);
        ingest.push(&Event::Gpu(kernel(10, 20)));
        let p = ingest.finish(
            ProcessMeta::default(),
            ReadOutcome::default(),
            &AnalyzeOptions::default(),
        );
        assert_eq!(p.deepest_stack, None);
        let gpu: Vec<&Vec<String>> = p
            .stacks
            .iter()
            .filter(|s| s.gpu_ns > 0)
            .map(|s| &s.frames)
            .collect();
        assert_eq!(gpu, [&vec!["f".to_owned(), NO_GIL_FRAME.to_owned()]]);

        // Python frames count toward the limit below the span stack.
        let frames: Vec<perfkit_profiler::model::PyFrame> = (0..300u32)
            .map(|i| perfkit_profiler::model::PyFrame {
                file: "train.py".into(),
                function: format!("f{i}").into(),
                line: i,
            })
            .collect();
        let mut ingest = ProcessIngest::new("step");
        enter(&mut ingest, 1, 0);
        ingest.push(&Event::Gpu(GpuOp {
            python: PyFrames::Frames(&frames),
            ..kernel(10, 20)
        }));
        let p = ingest.finish(
            ProcessMeta::default(),
            ReadOutcome::default(),
            &AnalyzeOptions::default(),
        );
        assert_eq!(p.deepest_stack, Some(301));
        let gpu = p.stacks.iter().find(|s| s.gpu_ns > 0).expect("GPU stack");
        assert_eq!(gpu.frames.len(), MAX_STACK_DEPTH + 1);
        // The span, then the outermost Python frames (innermost first in the trace).
        assert_eq!(gpu.frames[1], "f299 (train.py:299)");
        assert_eq!(gpu.frames[MAX_STACK_DEPTH - 1], "f45 (train.py:45)");
        assert_eq!(gpu.frames[MAX_STACK_DEPTH], "[45 deeper frames]");
    }

    #[test]
    fn histogram_median_counts_the_steps_left_out_as_zero() {
        // 5 steps: counts 0, 0, 1, 1, 3 -> median 1.
        let hist = BTreeMap::from([(1, 2), (3, 1)]);
        assert_eq!(histogram_median(&hist, 5), 1.0);
        // 6 steps: 0, 0, 0, 1, 1, 3 -> (0 + 1) / 2.
        assert_eq!(histogram_median(&hist, 6), 0.5);
        // A first step that does something once: median 0.
        assert_eq!(histogram_median(&BTreeMap::from([(4, 1)]), 10), 0.0);
        assert_eq!(histogram_median(&BTreeMap::new(), 0), 0.0);
    }
}
