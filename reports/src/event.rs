//! The neutral event stream the analysis consumes.
//!
//! [`crate::source`] turns the records of a perfkit trace file into these events; the
//! analysis never sees the file format, so it is tested on its own and any other
//! recorder could feed it.

use crate::model::Direction;

/// What a GPU-side operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A kernel launch.
    Kernel,
    /// A memory copy.
    Copy(Direction),
    /// A memset.
    Memset,
    /// A synchronization (device, stream, context or event).
    Sync,
    /// A device allocation.
    Alloc,
    /// A device free.
    Free,
}

/// A GPU-side operation and the host call that issued it.
#[derive(Debug, Clone, Copy)]
pub struct GpuOp<'a> {
    /// What it was.
    pub kind: OpKind,
    /// Host thread that issued it.
    pub thread: u64,
    /// CUDA stream, when the operation ran on one.
    pub stream: Option<u64>,
    /// Host call start (process clock, ns).
    pub host_start_ns: u64,
    /// Host call end.
    pub host_end_ns: u64,
    /// GPU start, when measured (already on the host clock).
    pub gpu_start_ns: Option<u64>,
    /// GPU end, when measured.
    pub gpu_end_ns: Option<u64>,
    /// Whether the GPU end is the host return of a blocking copy (its end event completed
    /// after the call came back): the copy was over by then, so its GPU time is an upper bound.
    pub gpu_end_at_host_return: bool,
    /// Bytes copied, set, allocated or freed.
    pub bytes: u64,
    /// Host memory was pinned (copies involving the host).
    pub pinned: Option<bool>,
    /// Kernel name (empty for other kinds).
    pub name: &'a str,
    /// Caller source file, when recorded.
    pub file: Option<&'a str>,
    /// Caller source line.
    pub line: u32,
    /// Id of the enclosing span when the recorder knows it (else the thread's current span is used).
    pub span: Option<u64>,
    /// Correlation id (0 when none): a later [`Event::GpuTiming`] with this id carries the
    /// GPU start and end when they were not known at issue time.
    pub id: u64,
    /// The Python frames of the issuing thread, when the trace recorded them (a Python program
    /// captured through CUPTI injection).
    pub python: PyFrames<'a>,
}

/// The Python frames of the thread that issued a GPU operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PyFrames<'a> {
    /// None recorded (not a Python program, or not captured).
    #[default]
    None,
    /// The issuing thread did not hold the GIL: no frames were read.
    GilNotHeld,
    /// Innermost first.
    Frames(&'a [perfkit_profiler::model::PyFrame]),
}

impl GpuOp<'_> {
    /// GPU duration, 0 when not measured.
    pub fn gpu_ns(&self) -> u64 {
        match (self.gpu_start_ns, self.gpu_end_ns) {
            (Some(s), Some(e)) if e > s => e - s,
            _ => 0,
        }
    }
}

/// One event of a process trace, in file order.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A thread's name became known.
    Thread {
        /// Thread id.
        thread: u64,
        /// Name.
        name: &'a str,
    },
    /// A span was entered on a thread.
    Enter {
        /// Thread.
        thread: u64,
        /// Span id (unique among the spans open at the same time).
        span: u64,
        /// Span name.
        name: &'a str,
        /// The span's `step` field when it has one.
        step: Option<u64>,
        /// Source file of the span's callsite, when recorded.
        file: Option<&'a str>,
        /// Source line of the span's callsite (0 when unknown).
        line: u32,
        /// Timestamp, process clock.
        ts_ns: u64,
    },
    /// A span was exited on a thread.
    Exit {
        /// Thread.
        thread: u64,
        /// Span id.
        span: u64,
        /// Timestamp, process clock.
        ts_ns: u64,
    },
    /// A span was closed (its last handle dropped): one call of it is complete, however
    /// many times it was entered.
    Close {
        /// Span id.
        span: u64,
    },
    /// A GPU-side operation.
    Gpu(GpuOp<'a>),
    /// GPU start and end of an earlier [`Event::Gpu`], resolved later.
    GpuTiming {
        /// The operation's [`GpuOp::id`].
        id: u64,
        /// GPU start (host clock).
        gpu_start_ns: u64,
        /// GPU end (host clock).
        gpu_end_ns: u64,
    },
    /// A device and its memory size.
    Device {
        /// Total device memory, bytes.
        total_bytes: u64,
    },
    /// A sample of device memory in use.
    DeviceMemory {
        /// When.
        ts_ns: u64,
        /// Bytes in use.
        used_bytes: u64,
        /// Total bytes.
        total_bytes: u64,
    },
    /// A GPU operation, or the late timing of one, whose GPU times cannot be (the end before
    /// the start, or a time that wrapped around past [`crate::source::MAX_TIME_NS`]): malformed
    /// input, left out of every figure and counted.
    InvalidGpu,
    /// The recorder dropped `count` events.
    Dropped {
        /// Number dropped.
        count: u64,
    },
    /// Any other record (counted, otherwise ignored).
    Other {
        /// Its timestamp, when it has one.
        ts_ns: Option<u64>,
    },
}
