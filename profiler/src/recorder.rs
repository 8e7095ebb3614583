//! Recording events from outside the `tracing` layer: GPU operations, device descriptions and
//! memory samples, from any thread, parented to the span current on the calling thread.
//!
//! ```
//! use perfkit_profiler::model::{GpuOpKind, HostMemory};
//! use perfkit_profiler::recorder::GpuOp;
//!
//! // `recorder()` is None unless a recording session is active: the check costs one atomic load.
//! if let Some(rec) = perfkit_profiler::recorder() {
//!     let start = rec.now();
//!     // ... enqueue a copy ...
//!     let op = GpuOp {
//!         bytes: 4096,
//!         host_memory: Some(HostMemory::Pinned),
//!         stream: Some(1),
//!         host_start: start,
//!         host_end: rec.now(),
//!         span: rec.current_span(),
//!         location: Some(std::panic::Location::caller()),
//!         ..GpuOp::new(GpuOpKind::MemcpyHtoD)
//!     };
//!     rec.gpu(&op);
//! }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::model::{
    DeviceInfo, GpuOpKind, GpuSample, HostMemory, ModuleInfo, Nanos, SpanId, ThreadIndex,
};
use crate::session::{Shared, Side, kind, with_producer};
use crate::writer::{
    GF_GPU_END, GF_GPU_END_AT_HOST_RETURN, GF_GPU_START, GF_KERNEL, GF_LOCATION, GF_SPAN, GF_STREAM,
};

/// An interned string (for example a kernel name); get one from [`Recorder::intern`] once and
/// reuse it. Valid only within the session that interned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StrId(pub(crate) u32);

/// Kernel launch details for [`GpuOp::kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    /// Kernel name, interned with [`Recorder::intern`].
    pub name: StrId,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_mem_bytes: u32,
}

/// A GPU operation to record (the write-side twin of [`GpuEvent`](crate::model::GpuEvent)).
#[derive(Clone, Copy, Debug)]
pub struct GpuOp {
    /// What it is.
    pub kind: GpuOpKind,
    /// Correlation id from [`Recorder::next_id`] (0: none).
    pub id: u64,
    /// Issuing thread; None means the calling thread (see [`Recorder::current_thread`]).
    pub thread: Option<ThreadIndex>,
    /// Device ordinal.
    pub device: u32,
    /// Stream handle, if on a stream.
    pub stream: Option<u64>,
    /// Bytes moved, set or allocated.
    pub bytes: u64,
    /// Pinned or pageable host side of a copy.
    pub host_memory: Option<HostMemory>,
    /// Host time the API call started ([`Recorder::now`]).
    pub host_start: Nanos,
    /// Host time the API call returned.
    pub host_end: Nanos,
    /// GPU start on the host clock, once known.
    pub gpu_start: Option<Nanos>,
    /// GPU end on the host clock, once known.
    pub gpu_end: Option<Nanos>,
    /// Whether `gpu_end` is the host time the call returned rather than an event's time: a
    /// blocking copy (device to pageable host memory) ends before its call returns, and an
    /// event recorded after it would add the host round trip to its GPU time.
    pub gpu_end_at_host_return: bool,
    /// Enclosing span (usually [`Recorder::current_span`] taken when the call was issued).
    pub span: Option<SpanId>,
    /// Caller location (`std::panic::Location::caller()` inside a `#[track_caller]` function).
    pub location: Option<&'static std::panic::Location<'static>>,
    /// Kernel details.
    pub kernel: Option<KernelLaunch>,
}

impl GpuOp {
    /// An operation of `kind` with every other field empty (device 0).
    pub fn new(kind: GpuOpKind) -> GpuOp {
        GpuOp {
            kind,
            id: 0,
            thread: None,
            device: 0,
            stream: None,
            bytes: 0,
            host_memory: None,
            host_start: 0,
            host_end: 0,
            gpu_start: None,
            gpu_end: None,
            gpu_end_at_host_return: false,
            span: None,
            location: None,
            kernel: None,
        }
    }
}

/// Handle to the active recording session; cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Recorder {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("session", &self.shared.id)
            .finish()
    }
}

/// The recorder of the process-wide session (the one started by [`init`](crate::init) or
/// [`Builder`](crate::Builder)), or None when nothing is being recorded.
pub fn recorder() -> Option<Recorder> {
    crate::session::global().map(|shared| Recorder { shared })
}

impl Recorder {
    /// Whether the session is still recording.
    pub fn is_active(&self) -> bool {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// Now, in nanoseconds since the trace origin (the clock of every timestamp in the trace).
    #[inline]
    pub fn now(&self) -> Nanos {
        self.shared.now_ns()
    }

    /// The innermost span entered on the calling thread, if any. None too when that span was
    /// created on another thread: its trace id is then only known to the writer.
    pub fn current_span(&self) -> Option<SpanId> {
        crate::session::with_existing_producer(&self.shared, |p| p.current_span())
            .flatten()
            .map(SpanId)
    }

    /// The calling thread's index in the trace (registers the thread if needed).
    pub fn current_thread(&self) -> Option<ThreadIndex> {
        with_producer(&self.shared, |p| p.ring.thread)
    }

    /// A new correlation id, unique in this trace.
    pub fn next_id(&self) -> u64 {
        self.shared.next_correlation()
    }

    /// Interns `s` (takes a lock: do it once per distinct name and keep the id).
    pub fn intern(&self, s: &str) -> StrId {
        StrId(self.shared.intern(s))
    }

    /// Records a GPU operation into the calling thread's buffer (no lock, no allocation).
    /// Returns false when it was dropped (buffer full or session finished); drops are counted.
    pub fn gpu(&self, op: &GpuOp) -> bool {
        if !self.is_active() {
            return false;
        }
        let mut flags = 0u64;
        let mut set = |cond: bool, bit: u64| {
            if cond {
                flags |= bit;
            }
        };
        set(op.gpu_start.is_some(), GF_GPU_START);
        set(op.gpu_end.is_some(), GF_GPU_END);
        set(op.stream.is_some(), GF_STREAM);
        set(op.span.is_some(), GF_SPAN);
        set(op.location.is_some(), GF_LOCATION);
        set(op.kernel.is_some(), GF_KERNEL);
        set(op.gpu_end_at_host_return, GF_GPU_END_AT_HOST_RETURN);
        let mem = match op.host_memory {
            None => 0u64,
            Some(HostMemory::Pageable) => 1,
            Some(HostMemory::Pinned) => 2,
        };
        let w0 =
            kind::GPU | (4 << 8) | (u64::from(op.kind.code()) << 24) | (mem << 32) | (flags << 40);
        let thread = op.thread.map_or(u64::MAX, u64::from);
        let loc = op
            .location
            .map_or(0, |l| l as *const std::panic::Location<'static> as u64);
        let k = op.kernel.unwrap_or(KernelLaunch {
            name: StrId(0),
            grid: [0; 3],
            block: [0; 3],
            shared_mem_bytes: 0,
        });
        let pair = |a: u32, b: u32| u64::from(a) | (u64::from(b) << 32);
        let slots = [
            [w0, op.id, thread, u64::from(op.device)],
            [op.stream.unwrap_or(0), op.bytes, op.host_start, op.host_end],
            [
                op.gpu_start.unwrap_or(0),
                op.gpu_end.unwrap_or(0),
                op.span.map_or(0, |s| s.0),
                loc,
            ],
            [
                pair(k.name.0, k.shared_mem_bytes),
                pair(k.grid[0], k.grid[1]),
                pair(k.grid[2], k.block[0]),
                pair(k.block[1], k.block[2]),
            ],
        ];
        with_producer(&self.shared, |p| {
            p.scratch.clear();
            p.scratch.extend_from_slice(&slots);
            p.push_scratch()
        })
        .unwrap_or(false)
    }

    /// Records the GPU start and end of an operation recorded earlier with correlation `id`.
    pub fn gpu_timing(&self, id: u64, gpu_start: Nanos, gpu_end: Nanos) -> bool {
        if !self.is_active() {
            return false;
        }
        with_producer(&self.shared, |p| {
            p.push1([kind::TIMING | (1 << 8), id, gpu_start, gpu_end])
        })
        .unwrap_or(false)
    }

    /// Records a device description (once per device).
    pub fn device(&self, info: &DeviceInfo) {
        if self.is_active() {
            self.shared.push_side(Side::Device(info.clone()));
        }
    }

    /// Records a device memory sample taken now.
    pub fn device_memory(&self, device: u32, used: u64, total: u64) -> bool {
        if !self.is_active() {
            return false;
        }
        let ts = self.now();
        with_producer(&self.shared, |p| {
            p.push1([
                kind::DEVMEM | (1 << 8) | (u64::from(device) << 32),
                ts,
                used,
                total,
            ])
        })
        .unwrap_or(false)
    }

    /// Records a device activity sample.
    pub fn gpu_sample(&self, sample: &GpuSample) {
        if self.is_active() {
            self.shared.push_side(Side::GpuSample(*sample));
        }
    }

    /// Returns the id of the host call stack `ips` (innermost frame first), recording the stack
    /// the first time it is seen (takes a lock).
    pub fn stack(&self, ips: &[u64]) -> u64 {
        let Ok(mut stacks) = self.shared.stacks.lock() else {
            return 0;
        };
        if let Some(&id) = stacks.get(ips) {
            return id;
        }
        let id = stacks.len() as u64 + 1;
        stacks.insert(ips.to_vec(), id);
        drop(stacks);
        if self.is_active() {
            self.shared.push_side(Side::Stack(id, ips.to_vec()));
        }
        id
    }

    /// Links the GPU operation with correlation id `op` to the host stack `stack`.
    pub fn op_stack(&self, op: u64, stack: u64) {
        if self.is_active() {
            self.shared.push_side(Side::OpStack(op, stack));
        }
    }

    /// Returns the id of the Python stack `frames` (innermost first: file and function
    /// interned with [`Recorder::intern`], and the line), recording the stack the first time it
    /// is seen (takes a lock). 0 when the session is finished.
    pub fn py_stack(&self, frames: &[(StrId, StrId, u32)]) -> u64 {
        let key: Vec<(u32, u32, u32)> = frames.iter().map(|&(f, n, l)| (f.0, n.0, l)).collect();
        let Ok(mut stacks) = self.shared.py_stacks.lock() else {
            return 0;
        };
        if let Some(&id) = stacks.get(&key) {
            return id;
        }
        let id = stacks.len() as u64 + 1;
        stacks.insert(key.clone(), id);
        drop(stacks);
        if self.is_active() {
            self.shared.push_side(Side::PyStack(id, key));
        }
        id
    }

    /// Links the GPU operation with correlation id `op` to the Python stack `stack` (from
    /// [`Recorder::py_stack`]); None records that no Python frames were read because the
    /// issuing thread did not hold the GIL. Write it before the operation itself: readers that
    /// stream the trace then know an operation's Python stack when they meet it.
    pub fn op_py_stack(&self, op: u64, stack: Option<u64>) {
        if self.is_active() {
            self.shared.push_side(Side::OpPyStack(op, stack));
        }
    }

    /// Records a loaded object (to map instruction pointers to files at report time).
    pub fn module(&self, module: &ModuleInfo) {
        if self.is_active() {
            self.shared.push_side(Side::Module(module.clone()));
        }
    }

    /// Asks the writer to write out everything recorded so far and waits for it (up to 1 s).
    pub fn flush(&self) -> bool {
        self.shared
            .flush_and_wait(std::time::Duration::from_secs(1))
    }
}
