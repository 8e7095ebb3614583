//! The trace model: what a trace file holds, as the [`reader`](crate::reader) hands it out.
//!
//! A trace is one [`Header`] followed by a stream of [`Record`]s. All timestamps are nanoseconds on
//! the process's monotonic host clock, counted from the trace origin (the instant the header's
//! [`Header::start_unix_ns`] was taken), so `start_unix_ns + ts` is a wall-clock time that lines up
//! the traces of several processes.
//!
//! Names and paths are interned in the file; the reader resolves them into shared
//! [`Arc<str>`]s, so cloning a record's strings is cheap.

use std::fmt;
use std::sync::Arc;

/// Nanoseconds since the trace origin on the host's monotonic clock.
pub type Nanos = u64;

/// Index of a host thread inside one trace (0, 1, 2, ... in order of first appearance).
///
/// It is not the operating system's thread id; see [`ThreadInfo::os_tid`] for that.
pub type ThreadIndex = u32;

/// Identifier of a span, unique within one trace file (never reused, unlike `tracing::span::Id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub u64);

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Per-process metadata, written first in every trace file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Header {
    /// Major version of the file format (the reader refuses majors it does not know).
    pub format_major: u16,
    /// Minor version of the file format (newer minors only add skippable records).
    pub format_minor: u16,
    /// Version of `perfkit-profiler` that wrote the file.
    pub writer_version: String,
    /// Process id.
    pub pid: u32,
    /// Host name (empty when it could not be read).
    pub host: String,
    /// Program name: the file name of the executable.
    pub program: String,
    /// Full command line, program first.
    pub command_line: Vec<String>,
    /// Wall-clock time of the trace origin, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// `RANK` of a distributed job, when set.
    pub rank: Option<u32>,
    /// `LOCAL_RANK` of a distributed job, when set.
    pub local_rank: Option<u32>,
    /// `WORLD_SIZE` of a distributed job, when set.
    pub world_size: Option<u32>,
    /// Name of the spans that mark one training step (default `step`).
    pub step_span_name: String,
    /// Host clock source the timestamps come from (for example `tsc` or `monotonic`).
    pub clock: String,
    /// Free-form extra metadata (key, value), in the order written.
    pub extra: Vec<(String, String)>,
}

impl Header {
    /// A header for the current process: pid, host, program, command line, start time now,
    /// distributed-rank variables from the environment.
    pub fn for_current_process(step_span_name: &str) -> Header {
        let command_line: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        Header {
            format_major: crate::format::FORMAT_MAJOR,
            format_minor: crate::format::FORMAT_MINOR,
            writer_version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            host: crate::sys::host_name(),
            program: crate::sys::program_name(),
            command_line,
            start_unix_ns: crate::sys::unix_now_ns(),
            rank: env_u32("RANK"),
            local_rank: env_u32("LOCAL_RANK"),
            world_size: env_u32("WORLD_SIZE"),
            step_span_name: step_span_name.to_string(),
            clock: String::new(),
            extra: Vec::new(),
        }
    }

    /// An empty header (format version filled in), mostly useful to build synthetic traces.
    pub fn new(program: &str, pid: u32) -> Header {
        Header {
            format_major: crate::format::FORMAT_MAJOR,
            format_minor: crate::format::FORMAT_MINOR,
            writer_version: env!("CARGO_PKG_VERSION").to_string(),
            pid,
            host: String::new(),
            program: program.to_string(),
            command_line: vec![program.to_string()],
            start_unix_ns: 0,
            rank: None,
            local_rank: None,
            world_size: None,
            step_span_name: "step".to_string(),
            clock: String::new(),
            extra: Vec::new(),
        }
    }
}

/// The `extra` header entry that says where the trace's timings come from. A trace whose GPU
/// timings were simulated (report tests, benchmarks, examples) carries
/// `("perfkit.timings", "synthetic")`; a recorded trace has no such entry.
pub const TIMINGS_KEY: &str = "perfkit.timings";
/// The [`TIMINGS_KEY`] value of a trace whose GPU timings were simulated.
pub const SYNTHETIC_TIMINGS: &str = "synthetic";

impl Header {
    /// Marks the trace as synthetic: its GPU timings come from a simulator, not a GPU.
    pub fn mark_synthetic(&mut self) {
        if !self.is_synthetic() {
            self.extra
                .push((TIMINGS_KEY.to_owned(), SYNTHETIC_TIMINGS.to_owned()));
        }
    }

    /// Whether the trace says its GPU timings were simulated (see [`TIMINGS_KEY`]).
    pub fn is_synthetic(&self) -> bool {
        self.extra
            .iter()
            .any(|(k, v)| k == TIMINGS_KEY && v == SYNTHETIC_TIMINGS)
    }
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Severity level of a span or event callsite (mirrors `tracing::Level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// `TRACE`
    Trace,
    /// `DEBUG`
    Debug,
    /// `INFO`
    Info,
    /// `WARN`
    Warn,
    /// `ERROR`
    Error,
}

impl Level {
    pub(crate) fn from_tracing(level: &tracing::Level) -> Level {
        match *level {
            tracing::Level::TRACE => Level::Trace,
            tracing::Level::DEBUG => Level::Debug,
            tracing::Level::INFO => Level::Info,
            tracing::Level::WARN => Level::Warn,
            _ => Level::Error,
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Level::Trace => 0,
            Level::Debug => 1,
            Level::Info => 2,
            Level::Warn => 3,
            Level::Error => 4,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Level> {
        Some(match code {
            0 => Level::Trace,
            1 => Level::Debug,
            2 => Level::Info,
            3 => Level::Warn,
            4 => Level::Error,
            _ => return None,
        })
    }
}

/// Whether a callsite is a span or an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallsiteKind {
    /// A `span!` callsite.
    Span,
    /// An `event!` callsite (`info!`, `warn!`, ...).
    Event,
}

/// Static description of a span or event callsite (from `tracing::Metadata`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Callsite {
    /// Span or event name (for events, usually `event file:line`).
    pub name: Arc<str>,
    /// Target (module path unless overridden).
    pub target: Arc<str>,
    /// Source file, when known.
    pub file: Option<Arc<str>>,
    /// Source line, when known.
    pub line: Option<u32>,
    /// Level.
    pub level: Level,
    /// Span or event.
    pub kind: CallsiteKind,
    /// Names of the callsite's fields; [`Field::index`] points into this list.
    pub fields: Arc<[Arc<str>]>,
}

impl Callsite {
    /// A callsite description (used to build synthetic traces).
    pub fn new(name: &str, target: &str, kind: CallsiteKind, fields: &[&str]) -> Callsite {
        Callsite {
            name: name.into(),
            target: target.into(),
            file: None,
            line: None,
            level: Level::Info,
            kind,
            fields: fields.iter().map(|f| Arc::<str>::from(*f)).collect(),
        }
    }
}

/// The value of a recorded field.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    /// Unsigned integer.
    U64(u64),
    /// Signed integer.
    I64(i64),
    /// Floating point number.
    F64(f64),
    /// Boolean.
    Bool(bool),
    /// String, or the `Debug` rendering of any other value (truncated to 4 KiB).
    Str(String),
}

impl FieldValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            FieldValue::U64(v) => Some(v),
            FieldValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldValue::U64(v) => write!(f, "{v}"),
            FieldValue::I64(v) => write!(f, "{v}"),
            FieldValue::F64(v) => write!(f, "{v}"),
            FieldValue::Bool(v) => write!(f, "{v}"),
            FieldValue::Str(v) => f.write_str(v),
        }
    }
}

/// One recorded field of a span or event.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// Index of the field name in [`Callsite::fields`].
    pub index: u32,
    /// Field name (resolved from the callsite).
    pub name: Arc<str>,
    /// Value.
    pub value: FieldValue,
}

/// A host thread, announced before its first record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// Index used by the records of this thread.
    pub index: ThreadIndex,
    /// Operating-system thread id (Linux `gettid`), 0 when unknown.
    pub os_tid: u64,
    /// Thread name, when the thread has one.
    pub name: Option<String>,
}

impl ThreadInfo {
    /// Describes a thread (used to build synthetic traces).
    pub fn new(index: ThreadIndex, os_tid: u64, name: Option<&str>) -> ThreadInfo {
        ThreadInfo {
            index,
            os_tid,
            name: name.map(str::to_string),
        }
    }
}

/// A span was created.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanNew {
    /// Thread that created it.
    pub thread: ThreadIndex,
    /// Creation time.
    pub ts: Nanos,
    /// The new span.
    pub id: SpanId,
    /// Its parent (explicit, or the span current on the creating thread), if any.
    pub parent: Option<SpanId>,
    /// Its callsite (name, target, source location).
    pub callsite: Arc<Callsite>,
    /// Field values given at creation (`step = 12`).
    pub fields: Vec<Field>,
}

/// A span was entered, exited or closed on a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanEdge {
    /// The thread it happened on.
    pub thread: ThreadIndex,
    /// When.
    pub ts: Nanos,
    /// The span.
    pub span: SpanId,
}

/// Values recorded into an existing span after its creation (`span.record("loss", 0.3)`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    /// The thread that recorded them.
    pub thread: ThreadIndex,
    /// When.
    pub ts: Nanos,
    /// The span.
    pub span: SpanId,
    /// The span's callsite.
    pub callsite: Arc<Callsite>,
    /// The values (indices into the span's callsite fields).
    pub fields: Vec<Field>,
}

/// A `tracing` event (`info!`, `warn!`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The thread it happened on.
    pub thread: ThreadIndex,
    /// When.
    pub ts: Nanos,
    /// The enclosing span, if any.
    pub span: Option<SpanId>,
    /// Its callsite.
    pub callsite: Arc<Callsite>,
    /// Its fields (the text of the event is the field named `message`).
    pub fields: Vec<Field>,
}

/// Kind of a GPU operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuOpKind {
    /// Host-to-device copy.
    MemcpyHtoD,
    /// Device-to-host copy.
    MemcpyDtoH,
    /// Device-to-device copy.
    MemcpyDtoD,
    /// Memory set (for example `memset_zeros`).
    Memset,
    /// Kernel launch (including library calls such as cuBLAS, named by [`KernelInfo::name`]).
    Kernel,
    /// Host synchronization (stream, event or device); host time blocked = `host_end - host_start`.
    Synchronize,
    /// Device memory allocation.
    Alloc,
    /// Device memory release.
    Free,
}

impl GpuOpKind {
    /// All kinds, in code order.
    pub const ALL: [GpuOpKind; 8] = [
        GpuOpKind::MemcpyHtoD,
        GpuOpKind::MemcpyDtoH,
        GpuOpKind::MemcpyDtoD,
        GpuOpKind::Memset,
        GpuOpKind::Kernel,
        GpuOpKind::Synchronize,
        GpuOpKind::Alloc,
        GpuOpKind::Free,
    ];

    /// Short stable name (`htod`, `dtoh`, `dtod`, `memset`, `kernel`, `sync`, `alloc`, `free`).
    pub fn as_str(self) -> &'static str {
        match self {
            GpuOpKind::MemcpyHtoD => "htod",
            GpuOpKind::MemcpyDtoH => "dtoh",
            GpuOpKind::MemcpyDtoD => "dtod",
            GpuOpKind::Memset => "memset",
            GpuOpKind::Kernel => "kernel",
            GpuOpKind::Synchronize => "sync",
            GpuOpKind::Alloc => "alloc",
            GpuOpKind::Free => "free",
        }
    }

    /// Whether this kind is a copy between memories.
    pub fn is_copy(self) -> bool {
        matches!(
            self,
            GpuOpKind::MemcpyHtoD | GpuOpKind::MemcpyDtoH | GpuOpKind::MemcpyDtoD
        )
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            GpuOpKind::MemcpyHtoD => 0,
            GpuOpKind::MemcpyDtoH => 1,
            GpuOpKind::MemcpyDtoD => 2,
            GpuOpKind::Memset => 3,
            GpuOpKind::Kernel => 4,
            GpuOpKind::Synchronize => 5,
            GpuOpKind::Alloc => 6,
            GpuOpKind::Free => 7,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<GpuOpKind> {
        GpuOpKind::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for GpuOpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Host side of a copy: page-locked (pinned) or ordinary pageable memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostMemory {
    /// Ordinary pageable memory (`Vec`, slice): the driver stages it, the copy is synchronous.
    Pageable,
    /// Page-locked memory (`PinnedHostSlice`): DMA straight from it, can be asynchronous.
    Pinned,
}

/// Source location of the code that issued an operation (from `#[track_caller]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceLocation {
    /// File path as the compiler saw it.
    pub file: Arc<str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Kernel launch details, where known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// Kernel (or library routine) name.
    pub name: Arc<str>,
    /// Grid dimensions (blocks), `[0, 0, 0]` when unknown.
    pub grid: [u32; 3],
    /// Block dimensions (threads), `[0, 0, 0]` when unknown.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_mem_bytes: u32,
}

/// A GPU operation issued by the host: copy, memset, kernel, synchronize, alloc or free.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuEvent {
    /// Host thread that issued it.
    pub thread: ThreadIndex,
    /// What it was.
    pub kind: GpuOpKind,
    /// Correlation id (unique per trace, 0 when none): [`GpuTiming`] records refer to it.
    pub id: u64,
    /// Device ordinal.
    pub device: u32,
    /// Stream handle, when the operation was on a stream.
    pub stream: Option<u64>,
    /// Bytes moved, set or allocated (0 for kernels and synchronizations).
    pub bytes: u64,
    /// Host memory kind for copies to or from the host.
    pub host_memory: Option<HostMemory>,
    /// Host time when the API call started.
    pub host_start: Nanos,
    /// Host time when the API call returned (for a synchronize: end of the blocked time).
    pub host_end: Nanos,
    /// Start of the work on the GPU, on the host clock after alignment (None until resolved).
    pub gpu_start: Option<Nanos>,
    /// End of the work on the GPU, on the host clock after alignment (None until resolved).
    pub gpu_end: Option<Nanos>,
    /// Whether `gpu_end` is the host time the call returned, not a CUDA event's time: a
    /// blocking copy (device to pageable host memory) was over by then, and the event
    /// recorded after it would count the host round trip as GPU time.
    pub gpu_end_at_host_return: bool,
    /// The innermost span entered on the issuing thread, if any.
    pub span: Option<SpanId>,
    /// Source location of the caller.
    pub location: Option<SourceLocation>,
    /// Kernel details for [`GpuOpKind::Kernel`].
    pub kernel: Option<KernelInfo>,
}

/// GPU start and end of an earlier [`GpuEvent`] whose timing was resolved later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuTiming {
    /// The event's [`GpuEvent::id`].
    pub id: u64,
    /// GPU start on the host clock.
    pub gpu_start: Nanos,
    /// GPU end on the host clock.
    pub gpu_end: Nanos,
}

/// Description of a CUDA device used by the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub device: u32,
    /// Device name (for example `NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

impl DeviceInfo {
    /// Describes a device.
    pub fn new(
        device: u32,
        name: &str,
        total_memory: u64,
        compute_capability: (u32, u32),
    ) -> DeviceInfo {
        DeviceInfo {
            device,
            name: name.to_string(),
            total_memory,
            compute_capability,
        }
    }
}

/// A sample of device memory in use (for example from `cuMemGetInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// When it was sampled.
    pub ts: Nanos,
    /// Device ordinal.
    pub device: u32,
    /// Bytes in use.
    pub used: u64,
    /// Total bytes.
    pub total: u64,
}

/// A sample of device activity (for example from NVML, every 100 ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSample {
    /// When it was sampled.
    pub ts: Nanos,
    /// Device ordinal.
    pub device: u32,
    /// Percent of time a kernel was running, when known.
    pub gpu_util_pct: Option<u32>,
    /// Percent of time device memory was read or written, when known.
    pub mem_util_pct: Option<u32>,
    /// Device memory in use, bytes, when known.
    pub memory_used: Option<u64>,
    /// Device memory in total, bytes, when known.
    pub memory_total: Option<u64>,
    /// SM clock in MHz, when known.
    pub sm_clock_mhz: Option<u32>,
    /// Power draw in milliwatts, when known.
    pub power_mw: Option<u32>,
}

/// A host call stack (instruction pointers, innermost first), written once per distinct stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackInfo {
    /// Identifier that [`OpStack`] records refer to (unique per trace).
    pub id: u64,
    /// Instruction pointers, innermost frame first.
    pub ips: Vec<u64>,
}

/// A loaded object (executable or shared library), to map instruction pointers to files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Path of the object.
    pub path: String,
    /// Address it is loaded at.
    pub base: u64,
    /// Size of its mapping in bytes.
    pub size: u64,
}

/// Links a GPU operation (by its [`GpuEvent::id`]) to the host stack that issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpStack {
    /// The GPU operation's correlation id.
    pub op: u64,
    /// The [`StackInfo::id`].
    pub stack: u64,
}

/// One frame of a Python call stack: the code's file, the function and the line executing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// `co_filename` of the frame's code object, as the interpreter has it (relative to the
    /// program's working directory when the script was started by a relative path).
    pub file: Arc<str>,
    /// `co_name` of the frame's code object (`<module>` for a script's top level).
    pub function: Arc<str>,
    /// The line executing in that frame (0 when unknown).
    pub line: u32,
}

/// The Python call stack of a thread that issued GPU work, innermost frame first, written once
/// per distinct stack (format 1.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyStackInfo {
    /// Identifier that [`OpPyStack`] records refer to (unique per trace, its own id space).
    pub id: u64,
    /// Frames, innermost first.
    pub frames: Vec<PyFrame>,
}

/// Links a GPU operation (by its [`GpuEvent::id`]) to the Python stack of the thread that issued
/// it (format 1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpPyStack {
    /// The GPU operation's correlation id.
    pub op: u64,
    /// The [`PyStackInfo::id`]; None when no Python frames were read because the issuing
    /// thread did not hold the GIL (it released it around the CUDA call, or is a native thread
    /// with no Python state).
    pub stack: Option<u64>,
}

/// Events that were not recorded because a buffer was full (or recording was impossible).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Thread whose events were dropped (None: not attributable to one thread).
    pub thread: Option<ThreadIndex>,
    /// When the writer noticed.
    pub ts: Nanos,
    /// How many records were dropped since the previous `Dropped` record of the same thread.
    pub count: u64,
}

/// A panic happened in the traced process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PanicInfo {
    /// The panicking thread, when known.
    pub thread: Option<ThreadIndex>,
    /// When.
    pub ts: Nanos,
    /// Panic message.
    pub message: String,
    /// Where it panicked.
    pub location: Option<SourceLocation>,
}

/// How the trace was finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The guard returned by `init()` was dropped (the normal end).
    GuardDropped,
    /// The process exited (`std::process::exit` or the end of `main` without dropping the guard).
    ProcessExit,
    /// A panic was being handled.
    Panic,
}

impl EndReason {
    pub(crate) fn code(self) -> u8 {
        match self {
            EndReason::GuardDropped => 0,
            EndReason::ProcessExit => 1,
            EndReason::Panic => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<EndReason> {
        Some(match code {
            0 => EndReason::GuardDropped,
            1 => EndReason::ProcessExit,
            2 => EndReason::Panic,
            _ => return None,
        })
    }
}

/// The last record of a complete trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEnd {
    /// When the trace was finished.
    pub ts: Nanos,
    /// Wall-clock time at the end, nanoseconds since the Unix epoch.
    pub end_unix_ns: u64,
    /// Why it ended.
    pub reason: EndReason,
    /// Records written over the whole trace.
    pub records: u64,
    /// Records dropped over the whole trace (sum of all [`Dropped`] counts).
    pub dropped: u64,
}

/// One record of a trace, in file order.
///
/// Records of one thread appear in the order they happened. Records of different threads are
/// interleaved in the order the writer collected them, so a record may refer to a span whose
/// [`Record::SpanNew`] comes a little later in the file (when the span was created on another
/// thread); consumers should tolerate that, and also spans never seen at all after a
/// [`Record::Dropped`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Record {
    /// A thread is announced (before its first record).
    Thread(ThreadInfo),
    /// A span was created.
    SpanNew(SpanNew),
    /// A span was entered.
    SpanEnter(SpanEdge),
    /// A span was exited.
    SpanExit(SpanEdge),
    /// A span was closed (the last handle dropped); it is never referred to again.
    SpanClose(SpanEdge),
    /// Values recorded into an existing span.
    SpanRecord(SpanRecord),
    /// A `tracing` event.
    Event(Event),
    /// A GPU operation.
    Gpu(GpuEvent),
    /// Late GPU timing of an earlier GPU operation.
    GpuTiming(GpuTiming),
    /// A device description.
    Device(DeviceInfo),
    /// A device memory sample.
    DeviceMemory(DeviceMemory),
    /// A device activity sample.
    GpuSample(GpuSample),
    /// A host call stack.
    Stack(StackInfo),
    /// A loaded object.
    Module(ModuleInfo),
    /// The host stack of a GPU operation.
    OpStack(OpStack),
    /// A Python call stack (format 1.1).
    PyStack(PyStackInfo),
    /// The Python stack of a GPU operation (format 1.1).
    OpPyStack(OpPyStack),
    /// Records were dropped.
    Dropped(Dropped),
    /// A panic happened.
    Panic(PanicInfo),
    /// The trace was finished cleanly (always the last record of a complete trace).
    End(TraceEnd),
}

impl Record {
    /// The record's host timestamp (for GPU events: the start of the API call), if it has one.
    pub fn ts(&self) -> Option<Nanos> {
        Some(match self {
            Record::SpanNew(r) => r.ts,
            Record::SpanEnter(r) | Record::SpanExit(r) | Record::SpanClose(r) => r.ts,
            Record::SpanRecord(r) => r.ts,
            Record::Event(r) => r.ts,
            Record::Gpu(r) => r.host_start,
            Record::DeviceMemory(r) => r.ts,
            Record::GpuSample(r) => r.ts,
            Record::Dropped(r) => r.ts,
            Record::Panic(r) => r.ts,
            Record::End(r) => r.ts,
            Record::Thread(_)
            | Record::GpuTiming(_)
            | Record::Device(_)
            | Record::Stack(_)
            | Record::Module(_)
            | Record::OpStack(_)
            | Record::PyStack(_)
            | Record::OpPyStack(_) => return None,
        })
    }

    /// The host thread of the record, if it belongs to one.
    pub fn thread(&self) -> Option<ThreadIndex> {
        match self {
            Record::Thread(r) => Some(r.index),
            Record::SpanNew(r) => Some(r.thread),
            Record::SpanEnter(r) | Record::SpanExit(r) | Record::SpanClose(r) => Some(r.thread),
            Record::SpanRecord(r) => Some(r.thread),
            Record::Event(r) => Some(r.thread),
            Record::Gpu(r) => Some(r.thread),
            Record::Dropped(r) => r.thread,
            Record::Panic(r) => r.thread,
            _ => None,
        }
    }
}
