//! The analysis of a run: what every report format renders.
//!
//! All times are nanoseconds. Process-relative times count from the process's own trace
//! start; `offset_ns` places a process on the run's common wall clock.

use serde::{Deserialize, Serialize};

use crate::stats::Distribution;

/// The analysis of a run: one or several traced processes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Analysis {
    /// Where the traces came from (as given on the command line).
    pub source: String,
    /// Wall-clock start of the earliest process (Unix epoch, nanoseconds).
    pub start_unix_ns: u64,
    /// From the earliest process start to the latest process end.
    pub duration_ns: u64,
    /// False when any trace was cut short (the program crashed or was killed).
    pub complete: bool,
    /// One entry per traced process, ordered by rank, then start time.
    pub processes: Vec<ProcessAnalysis>,
    /// Per-rank step comparison when several processes ran steps.
    pub ranks: Option<RankComparison>,
    /// A few steps of the primary process, event by event, for the timeline.
    pub timeline: Timeline,
    /// The trace file of each process (same order as `processes`; empty when the analysis
    /// was not read from files).
    #[serde(skip)]
    pub files: Vec<std::path::PathBuf>,
    /// The trace file or run directory analysed (empty when not read from files).
    #[serde(skip)]
    pub source_path: std::path::PathBuf,
    /// Trace files that could not be read at all (left out of the analysis; the run is then
    /// incomplete).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableTrace>,
}

/// A trace file that could not be read at all (empty, not a trace, damaged header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreadableTrace {
    /// The file, as found.
    pub file: String,
    /// Why it could not be read.
    pub error: String,
}

impl UnreadableTrace {
    /// `unreadable trace left out: <error>`, the error naming the file (added when it does
    /// not).
    pub fn describe(&self) -> String {
        if self.error.contains(&self.file) {
            format!("unreadable trace left out: {}", self.error)
        } else {
            format!("unreadable trace left out: {}: {}", self.file, self.error)
        }
    }
}

/// What every output says of a run whose GPU timings were simulated.
pub const SYNTHETIC_NOTE: &str = "synthetic (simulated GPU timings)";

impl Analysis {
    /// Whether a trace of the run says its GPU timings were simulated, not measured.
    pub fn is_synthetic(&self) -> bool {
        self.processes.iter().any(|p| p.meta.synthetic)
    }

    /// Why the run is incomplete, one sentence each; empty for a complete run. The one list
    /// every output shows.
    pub fn incomplete_reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.processes {
            if let Some(err) = &p.read_error {
                out.push(format!(
                    "{}: {err} (reporting what was read before it)",
                    p.meta.file
                ));
            } else if !p.complete {
                out.push(format!(
                    "{}: the trace was cut short (the program was killed?); reporting what was recorded",
                    p.meta.file
                ));
            }
        }
        for u in &self.unreadable {
            out.push(u.describe());
        }
        out
    }

    /// What the reports of a complete run leave out or show in part, one sentence each (empty
    /// when nothing): stacks cut at [`crate::ingest::MAX_STACK_DEPTH`] frames, malformed GPU
    /// records. Unlike [`Analysis::incomplete_reasons`], they do not make the run incomplete.
    pub fn notes(&self) -> Vec<String> {
        process_notes(&self.processes)
    }
}

/// [`Analysis::notes`] of these processes.
pub fn process_notes(processes: &[ProcessAnalysis]) -> Vec<String> {
    let limit = crate::ingest::MAX_STACK_DEPTH;
    let mut out = Vec::new();
    for p in processes {
        if let Some(depth) = p.deepest_stack {
            out.push(format!(
                "{}: span stacks up to {depth} frames deep; the frames below the {limit}th are \
                 folded into one `{}` frame in the folded stacks, flamegraphs and summary stacks, \
                 and the timeline shows at most {limit} levels",
                p.meta.file,
                crate::ingest::deeper_frame(depth.saturating_sub(limit as u64)),
            ));
        }
        if p.invalid_gpu_ops > 0 {
            out.push(format!(
                "{}: {} malformed GPU record{} left out (a GPU end before its start, or a time \
                 before the trace began)",
                p.meta.file,
                p.invalid_gpu_ops,
                if p.invalid_gpu_ops == 1 { "" } else { "s" }
            ));
        }
    }
    out
}

/// Identity of a traced process, as its trace header records it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessMeta {
    /// The trace file name (relative to the analysed directory).
    pub file: String,
    /// Operating-system process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Program and arguments.
    pub command: Vec<String>,
    /// `RANK` of a distributed job, when set.
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, when set.
    pub local_rank: Option<u32>,
    /// `WORLD_SIZE`, when set.
    pub world_size: Option<u32>,
    /// Wall-clock start of the trace (Unix epoch, nanoseconds).
    pub start_unix_ns: u64,
    /// The trace says its GPU timings were simulated, not measured on a GPU.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub synthetic: bool,
}

impl ProcessMeta {
    /// A short label: `rank 3` or `pid 1234`.
    pub fn label(&self) -> String {
        match self.rank {
            Some(r) => format!("rank {r}"),
            None => format!("pid {}", self.pid),
        }
    }
}

/// Everything measured in one process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessAnalysis {
    /// Identity of the process.
    pub meta: ProcessMeta,
    /// Start of this process on the run's clock (relative to the earliest process).
    pub offset_ns: u64,
    /// Traced duration (first to last timestamp).
    pub duration_ns: u64,
    /// Records read from the trace file.
    pub events: u64,
    /// Events the recorder had to drop (its queue was full).
    pub dropped_events: u64,
    /// False when the trace ends without its end record.
    pub complete: bool,
    /// Reading stopped early at a damaged record: the reader's message (with the byte offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_error: Option<String>,
    /// Spans still open when the trace ended (closed at the last timestamp).
    pub unclosed_spans: u64,
    /// The depth of the deepest stack (spans, then Python frames), present only when it passed
    /// [`crate::ingest::MAX_STACK_DEPTH`]: the frames below that depth are folded into one frame
    /// `[N deeper frames]` in `stacks` (and so in the folded stacks and flamegraphs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deepest_stack: Option<u64>,
    /// GPU operations (or late GPU timings) left out as malformed: a GPU end before its start,
    /// or a time that wrapped around (see [`crate::source::gpu_times_valid`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub invalid_gpu_ops: u64,
    /// Host threads seen.
    pub threads: Vec<ThreadInfo>,
    /// CUDA streams seen.
    pub streams: Vec<u64>,
    /// Per span name: calls, total and self time, sorted by total time.
    pub spans: Vec<SpanStats>,
    /// Step statistics.
    pub steps: StepSummary,
    /// GPU busy and idle time.
    pub gpu: GpuTime,
    /// Memory copies.
    pub copies: CopyStats,
    /// Kernels by name, sorted by total GPU time.
    pub kernels: Vec<KernelStats>,
    /// Memsets by stream-less aggregate.
    pub memsets: OpTotals,
    /// Synchronizations and the host time they blocked.
    pub syncs: SyncStats,
    /// Device memory.
    pub memory: MemoryStats,
    /// Folded stacks: host self time and GPU time per span stack.
    pub stacks: Vec<StackTime>,
    /// Operations counted per step (median over the completed steps): what `perfkit check`
    /// compares first, since these counts do not depend on the machine's speed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_counters: Vec<StepCounter>,
    /// Steps chosen for the event-level timeline (an early, the median and the slowest step),
    /// picked from the exact per-step list; not serialised.
    #[serde(skip)]
    pub timeline_windows: Vec<TimelineWindow>,
}

/// What a per-step counter counts.
///
/// Operations count toward a step when the thread that issued them (or entered the span) is
/// inside a step span at the time; work of other threads (data workers) is not counted.
pub const STEP_COUNTERS: [(&str, &str); 9] = [
    ("d2h-copies", "device-to-host copies"),
    ("syncs", "explicit synchronizations"),
    ("h2d-copies", "host-to-device copies"),
    ("h2d-bytes", "host-to-device bytes"),
    (
        "h2d-copies-pageable",
        "host-to-device copies from pageable memory",
    ),
    (
        "h2d-bytes-pageable",
        "host-to-device bytes from pageable memory",
    ),
    ("device-allocs", "device allocations"),
    ("kernel-launches", "kernel launches"),
    ("span-entries", "entries of span"),
];

/// One operation counted per step in one process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepCounter {
    /// What is counted: one of the ids of [`STEP_COUNTERS`] (`d2h-copies`, `span-entries`, ...).
    pub counter: String,
    /// For `span-entries`: the span's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<String>,
    /// Median over the completed steps (a step without it counts 0).
    pub per_step: f64,
    /// The most in one step.
    pub max_per_step: u64,
    /// Sum over the completed steps.
    pub total: u64,
    /// Where it happened: the caller's source line (`file:line`, or `unknown`), most first.
    pub sites: Vec<CounterSite>,
}

/// The share of a [`StepCounter`] that comes from one source line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CounterSite {
    /// `file:line` of the caller, or `unknown`.
    pub location: String,
    /// Sum over the completed steps.
    pub total: u64,
    /// Steps in which it happened at least once.
    pub steps: u64,
}

/// A host thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Thread id as recorded.
    pub id: u64,
    /// Thread name, when known.
    pub name: String,
}

/// Per-span-name totals.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpanStats {
    /// Span name.
    pub name: String,
    /// Entries (busy intervals, enter to exit): a span entered many times counts each.
    pub calls: u64,
    /// Wall time inside the span (outermost occurrences only, so recursion is not counted twice).
    pub total_ns: u64,
    /// Wall time inside the span minus time in its child spans.
    pub self_ns: u64,
    /// Mean wall time per call.
    pub mean_ns: u64,
    /// Longest call.
    pub max_ns: u64,
}

/// Steps of one process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StepSummary {
    /// Name of the span that marks a step.
    pub span_name: String,
    /// Distribution of step wall times.
    pub duration: Distribution,
    /// Sum over steps of the breakdown.
    pub total: StepBreakdown,
    /// Per-step breakdown; at most [`crate::AnalyzeOptions::max_step_series`] entries
    /// (consecutive steps averaged into buckets beyond that).
    pub series: Vec<StepPoint>,
    /// Steps averaged in each `series` entry (1 when every step is listed).
    pub series_bucket: u64,
}

/// How a step's wall time splits by what the GPU (or, when idle, the host) was doing.
///
/// The four parts partition the step's wall time, with priority kernel > copy > sync wait > idle:
/// `copy_ns` counts copies that do not overlap a kernel, `sync_wait_ns` counts time in which the
/// GPU is idle while the host is blocked in a synchronization, `idle_ns` is the rest.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StepBreakdown {
    /// Wall time of the step(s).
    pub wall_ns: u64,
    /// A kernel was running.
    pub kernel_ns: u64,
    /// A copy or memset was running and no kernel.
    pub copy_ns: u64,
    /// The GPU was idle and the host blocked in a synchronization.
    pub sync_wait_ns: u64,
    /// The GPU was idle otherwise.
    pub idle_ns: u64,
    /// Host time blocked in synchronizations (whatever the GPU did meanwhile).
    pub sync_blocked_ns: u64,
}

/// One entry of the per-step series.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StepPoint {
    /// Index of the (first) step: the span's `step` field when recorded, else its ordinal.
    pub index: u64,
    /// Start on the process clock.
    pub start_ns: u64,
    /// Breakdown (averaged over the bucket).
    #[serde(flatten)]
    pub breakdown: StepBreakdown,
}

/// GPU time over the whole trace and inside steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuTime {
    /// Window considered: the traced duration.
    pub window_ns: u64,
    /// Some GPU work (kernel, copy, memset) was running.
    pub busy_ns: u64,
    /// A kernel was running.
    pub kernel_ns: u64,
    /// `window_ns - busy_ns`.
    pub idle_ns: u64,
    /// `busy_ns / window_ns` in percent, two decimals (0 when there is no GPU work).
    pub utilization_percent: f64,
    /// The same, counting only time inside steps.
    pub in_steps: StepBreakdown,
    /// Longest stretch without GPU work between the first and the last GPU operation.
    pub longest_gap_ns: u64,
}

/// Direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Direction {
    /// Host to device.
    H2D,
    /// Device to host.
    D2H,
    /// Device to device.
    D2D,
}

impl Direction {
    /// `H2D`, `D2H` or `D2D`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::H2D => "H2D",
            Direction::D2H => "D2H",
            Direction::D2D => "D2D",
        }
    }
}

/// Totals of a group of GPU operations.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OpTotals {
    /// Operations.
    pub count: u64,
    /// Bytes moved or set.
    pub bytes: u64,
    /// GPU time (end minus start, summed).
    pub gpu_ns: u64,
    /// Host time spent in the enqueuing calls.
    pub host_ns: u64,
}

impl OpTotals {
    /// Achieved bandwidth in GB/s (bytes per GPU nanosecond), 0 when no time was measured.
    pub fn bandwidth_gbps(&self) -> f64 {
        if self.gpu_ns == 0 {
            0.0
        } else {
            self.bytes as f64 / self.gpu_ns as f64
        }
    }
}

/// Copies grouped by direction and host memory kind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CopyGroup {
    /// Direction.
    pub direction: Direction,
    /// Host memory was pinned (page-locked); `None` for device-to-device.
    pub pinned: Option<bool>,
    /// Totals.
    #[serde(flatten)]
    pub totals: OpTotals,
    /// Achieved bandwidth, GB/s.
    pub bandwidth_gbps: f64,
}

/// Copies issued from one source line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CopySite {
    /// `file:line` of the caller, or `unknown`.
    pub location: String,
    /// Direction.
    pub direction: Direction,
    /// Host memory was pinned; `None` for device-to-device or mixed.
    pub pinned: Option<bool>,
    /// Totals.
    #[serde(flatten)]
    pub totals: OpTotals,
    /// Achieved bandwidth, GB/s.
    pub bandwidth_gbps: f64,
    /// Copies whose GPU end is the host return of the blocking call, so that their GPU time
    /// is an upper bound (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_end_at_host_return: u64,
}

/// For `skip_serializing_if`: a count that is zero is left out.
pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// All copies.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CopyStats {
    /// Sum over every copy.
    pub total: OpTotals,
    /// By direction and pinned/pageable.
    pub by_kind: Vec<CopyGroup>,
    /// By caller source line, sorted by GPU time.
    pub by_site: Vec<CopySite>,
}

/// Kernels of one name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelStats {
    /// Kernel name.
    pub name: String,
    /// Launches.
    pub count: u64,
    /// GPU time, summed.
    pub total_ns: u64,
    /// Mean GPU time.
    pub mean_ns: u64,
    /// Shortest launch.
    pub min_ns: u64,
    /// Longest launch.
    pub max_ns: u64,
    /// Host time spent in the launch calls, summed.
    pub launch_ns: u64,
}

/// Synchronizations.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SyncStats {
    /// Number of synchronizations.
    pub count: u64,
    /// Host time blocked in them.
    pub blocked_ns: u64,
    /// By caller source line, sorted by blocked time.
    pub by_site: Vec<SyncSite>,
}

/// Synchronizations issued from one source line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SyncSite {
    /// `file:line` of the caller, or `unknown`.
    pub location: String,
    /// Number of synchronizations.
    pub count: u64,
    /// Host time blocked.
    pub blocked_ns: u64,
}

/// Device memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryStats {
    /// High-water mark of device memory: the highest of the bytes held through recorded
    /// allocations and of the in-use samples (`cuMemGetInfo`), when there are any.
    pub peak_bytes: u64,
    /// Total memory of the device (0 when unknown).
    pub device_total_bytes: u64,
    /// When the peak was reached (process clock).
    pub peak_at_ns: u64,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Bytes allocated, summed.
    pub allocated_bytes: u64,
    /// Allocated bytes over time, `(time_ns, bytes)`, downsampled keeping each bucket's maximum
    /// (from the in-use samples when no allocation was recorded).
    pub series: Vec<(u64, u64)>,
}

/// Time attributed to one span stack.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StackTime {
    /// Frames, outermost first.
    pub frames: Vec<String>,
    /// Host wall time spent directly in the innermost span (self time).
    pub host_ns: u64,
    /// GPU time of the work issued while this stack was current.
    pub gpu_ns: u64,
}

/// Steps compared across ranks (processes) of one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankComparison {
    /// One row per process that ran steps.
    pub rows: Vec<RankRow>,
    /// Label of the slowest process by median step time.
    pub straggler: String,
    /// How much slower the straggler's median step is than the median of the other
    /// processes' medians, in percent (two decimals).
    pub straggler_excess_percent: f64,
}

/// Step times of one rank.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankRow {
    /// `rank N` or `pid N`.
    pub label: String,
    /// Host.
    pub host: String,
    /// Step time distribution.
    pub steps: Distribution,
    /// Steps in which this rank was the slowest of all (steps matched by index).
    pub slowest_in_steps: u64,
}

/// Event-level view of a few steps of the primary process.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// Label of the process shown.
    pub process: String,
    /// The chosen step windows.
    pub windows: Vec<TimelineWindow>,
    /// Tracks: host threads first, then CUDA streams.
    pub tracks: Vec<TimelineTrack>,
}

/// One chosen step.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimelineWindow {
    /// Why it was chosen (`median step`, `slowest step`, ...).
    pub label: String,
    /// Step index.
    pub step: u64,
    /// Start on the process clock.
    pub start_ns: u64,
    /// End on the process clock.
    pub end_ns: u64,
    /// Items dropped because the window held more than the per-window cap.
    pub truncated: u64,
}

/// One track of the timeline.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimelineTrack {
    /// `thread main` or `stream 7`.
    pub name: String,
    /// Items on the track (all windows together), ascending start.
    pub items: Vec<TimelineItem>,
}

/// One span or GPU operation on a track.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimelineItem {
    /// Window this item belongs to (index into `windows`).
    pub window: u32,
    /// Start on the process clock.
    pub start_ns: u64,
    /// Duration.
    pub dur_ns: u64,
    /// Nesting depth on its track.
    pub depth: u32,
    /// `span`, `kernel`, `H2D`, `D2H`, `D2D`, `memset`, `sync`.
    pub kind: String,
    /// Span or kernel name.
    pub name: String,
}
