//! [`ProfiledStream`]: a cudarc stream whose copies, launches, library calls,
//! allocations and synchronizations are recorded into the trace.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits, sys,
};

use super::error::{CudaError, driver};
use super::host::{HostBuffer, bytes_of};
use super::timing::{
    Resolved, Timeline, TimingEvents, anchor_time, bound_by_host_return, returns_when_done,
};
use crate::model::{GpuOpKind, HostMemory, Nanos};
use crate::recorder::{GpuOp, KernelLaunch, Recorder};

/// Most timing events one stream keeps alive (in the pool or in flight). Past this,
/// operations are still recorded, without GPU times, rather than waiting for the GPU.
const EVENT_CAPACITY: usize = 4096;

/// How long to poll a reference event recorded on a stream that should be idle (new,
/// or just synchronized) before giving up.
const ANCHOR_WAIT_NS: Nanos = 2_000_000;

/// How long to poll a reference event recorded before an operation when the stream
/// had none (recording started after the stream was created): if the stream is busy,
/// give up quickly and try again at the next synchronize.
const ANCHOR_WAIT_BUSY_NS: Nanos = 50_000;
/// Reference events tried at most, each time the recorder anchors.
const ANCHOR_TRIES: usize = 3;
/// An observation window this narrow is kept at once.
const ANCHOR_GOOD_WINDOW_NS: Nanos = 20_000;

/// A host-clock reference is refreshed after a synchronize once it is this old, so
/// the drift between the GPU and host clocks never accumulates over a long run.
const REANCHOR_AFTER_NS: Nanos = 1_000_000_000;

/// Minimum interval between two device memory samples (`cuMemGetInfo` takes microseconds:
/// after every allocation of a loop that allocates per sample it would dominate the cost
/// of the allocations the reports measure).
const MEMORY_SAMPLE_NS: Nanos = 10_000_000;

struct State {
    /// Operations waiting for their GPU times, recorded as soon as they are known.
    timeline: Timeline<CudaEvent, GpuOp>,
    anchored_at: Option<Nanos>,
    /// Whether an operation already tried (and failed) to anchor a busy stream.
    anchor_tried: bool,
    /// Kernel names by function handle (asked from the driver once). Interned per
    /// launch because interned ids belong to one recording session.
    kernel_names: HashMap<usize, Arc<str>>,
    last_memory_sample: Option<Nanos>,
    device_announced: bool,
    resolved: Vec<Resolved<GpuOp>>,
}

/// What a timed operation runs, for kernel names.
enum KernelSpec {
    /// Not a kernel (copy, memset).
    None,
    /// A kernel launched through the launch builder.
    Launch {
        func: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
    },
    /// A library routine (cuBLAS).
    Named(&'static str),
}

/// The CUDA events of one stream, as the timeline sees them.
struct StreamEvents<'a> {
    stream: &'a Arc<CudaStream>,
}

impl TimingEvents for StreamEvents<'_> {
    type Event = CudaEvent;

    fn create(&self) -> Result<CudaEvent, CudaError> {
        // `new_event(None)` would disable timing: ask for the default flags.
        self.stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("cuEventCreate"))
    }

    fn record(&self, event: &CudaEvent) -> Result<(), CudaError> {
        event.record(self.stream).map_err(driver("cuEventRecord"))
    }

    fn is_complete(&self, event: &CudaEvent) -> Result<bool, CudaError> {
        event.try_is_complete().map_err(driver("cuEventQuery"))
    }

    fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32, CudaError> {
        // cudarc's `CudaEvent::elapsed_ms` synchronizes both events first; these are
        // known to be complete, so ask the driver directly.
        // SAFETY: both events were created in this stream's context, are alive (borrowed),
        // and were recorded and seen complete.
        unsafe { cudarc::driver::result::event::elapsed(start.cu_event(), end.cu_event()) }
            .map_err(driver("cuEventElapsedTime"))
    }
}

/// A cudarc [`CudaStream`] whose operations are recorded into the perfkit trace.
///
/// The methods mirror cudarc's names and signatures (`clone_htod`, `memcpy_htod`,
/// `clone_dtoh`, `memcpy_dtoh`, `memcpy_dtod`, `memset_zeros`, `alloc_zeros`,
/// `synchronize`, `launch_builder`), plus [`ProfiledStream::gemm`] for cuBLAS. Each one
/// records the caller's source line (`#[track_caller]`), its bytes and whether the host
/// side is pinned, the host time of the call and the innermost span entered on the
/// calling thread. Copies, memsets, kernels and cuBLAS calls are bracketed by two
/// timing-enabled CUDA events from a pool; their GPU times are resolved later by
/// polling (`cuEventQuery`) whenever the stream is used again or synchronized, so the
/// recorder never waits for the GPU itself. GPU timestamps are put on the host clock
/// through a reference event recorded on the idle stream.
///
/// When the process is not recording (`PERFKIT_TRACE` unset), every method is the
/// plain cudarc call plus one atomic load.
pub struct ProfiledStream {
    stream: Arc<CudaStream>,
    device: u32,
    handle: u64,
    state: Mutex<State>,
}

impl std::fmt::Debug for ProfiledStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfiledStream")
            .field("device", &self.device)
            .field("stream", &format_args!("{:#x}", self.handle))
            .finish_non_exhaustive()
    }
}

impl ProfiledStream {
    /// Wraps `stream`. When recording, announces the device and records the reference
    /// event that aligns GPU time with the host clock (the stream should be idle).
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the reference event cannot be created or recorded.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, CudaError> {
        let device = u32::try_from(stream.context().ordinal()).unwrap_or(u32::MAX);
        let handle = stream.cu_stream() as usize as u64;
        let this = Self {
            stream,
            device,
            handle,
            state: Mutex::new(State {
                timeline: Timeline::new(EVENT_CAPACITY),
                anchored_at: None,
                anchor_tried: false,
                kernel_names: HashMap::new(),
                last_memory_sample: None,
                device_announced: false,
                resolved: Vec::new(),
            }),
        };
        if let Some(rec) = crate::recorder() {
            let mut st = this.lock();
            this.announce_device(&rec, &mut st);
            this.anchor(&rec, &mut st, ANCHOR_WAIT_NS)?;
        }
        Ok(this)
    }

    /// A new stream on `ctx`, wrapped.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the stream cannot be created.
    pub fn new_on(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        Self::new(ctx.new_stream().map_err(driver("cuStreamCreate"))?)
    }

    /// The wrapped cudarc stream (operations issued on it directly are not recorded).
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream's context.
    #[must_use]
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// A cuBLAS handle bound to this stream, for [`ProfiledStream::gemm`].
    ///
    /// # Errors
    /// [`CudaError::NoLibrary`] when `libcublas` cannot be loaded (cudarc would panic),
    /// [`CudaError::Blas`] when it cannot be initialised.
    pub fn new_blas(&self) -> Result<CudaBlas, CudaError> {
        // SAFETY: only tries to load the library by its usual names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::NoLibrary { library: "cuBLAS" });
        }
        CudaBlas::new(self.stream.clone()).map_err(|source| CudaError::Blas {
            op: "cublasCreate",
            source,
        })
    }

    /// Operations recorded without GPU times so far because every timing event was
    /// in flight.
    #[must_use]
    pub fn untimed_ops(&self) -> u64 {
        self.lock().timeline.untimed()
    }

    /// Operations whose GPU times are still being waited for.
    #[must_use]
    pub fn pending_ops(&self) -> usize {
        self.lock().timeline.pending()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent if a panic interrupted a holder: entries are moved
        // whole between the pool and the queue.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn events(&self) -> StreamEvents<'_> {
        StreamEvents {
            stream: &self.stream,
        }
    }

    fn announce_device(&self, rec: &Recorder, st: &mut State) {
        if st.device_announced {
            return;
        }
        st.device_announced = true;
        match super::probe::describe(self.stream.context()) {
            Ok(info) => rec.device(&info),
            Err(CudaError::Driver { source, .. }) => self.hand_back(source),
            Err(_) => {}
        }
        self.sample_memory(rec, st);
    }

    fn sample_memory(&self, rec: &Recorder, st: &mut State) {
        match self.stream.context().mem_get_info() {
            Ok((free, total)) => {
                rec.device_memory(self.device, total.saturating_sub(free) as u64, total as u64);
                st.last_memory_sample = Some(rec.now());
            }
            Err(e) => self.hand_back(e),
        }
    }

    /// Hands a driver error of a best-effort call back to cudarc. cudarc keeps errors that
    /// happen where it cannot return them (freeing a buffer on drop) and returns them from
    /// the next call that binds the context, which may be one of the recorder's own: given
    /// back, the program's next CUDA call reports it, as it would without the recorder.
    fn hand_back(&self, error: cudarc::driver::DriverError) {
        self.stream.context().record_err::<()>(Err(error));
    }

    /// Records a reference event and polls it until complete (the stream is expected
    /// to be idle, so this takes microseconds); its host time is the middle of the
    /// observation window. Gives up after `max_wait`, leaving the previous
    /// reference in place.
    fn anchor(&self, rec: &Recorder, st: &mut State, max_wait: Nanos) -> Result<(), CudaError> {
        // The host time is known to within the observation window. A wide one (the first
        // event of a context, a preempted thread) is tried again, and the narrowest kept.
        let mut best: Option<(CudaEvent, Nanos, Nanos)> = None;
        for _ in 0..ANCHOR_TRIES {
            let observed = match self.observe_anchor(rec, st, max_wait) {
                Ok(o) => o,
                Err(e) => {
                    // The best event so far goes back to the pool (dropped, it would be
                    // destroyed while still counted against the stream's capacity).
                    if let Some((event, ..)) = best {
                        st.timeline.put_back(event);
                    }
                    return Err(e);
                }
            };
            let Some((event, host_ns, window)) = observed else {
                break;
            };
            match &best {
                Some((_, _, w)) if *w <= window => st.timeline.put_back(event),
                _ => {
                    if let Some((old, ..)) = best.replace((event, host_ns, window)) {
                        st.timeline.put_back(old);
                    }
                }
            }
            if best.as_ref().is_some_and(|b| b.2 <= ANCHOR_GOOD_WINDOW_NS) {
                break;
            }
        }
        if let Some((event, host_ns, window)) = best {
            // How far the previous reference had drifted, for the trace: what the reports'
            // GPU intervals may be off by at the end of a reference's life.
            match st.timeline.drift_to(&self.events(), &event, host_ns) {
                Ok(Some(d)) => tracing::event!(
                    name: "perfkit.clock_drift",
                    target: "perfkit_profiler",
                    tracing::Level::INFO,
                    device = self.device,
                    stream = self.handle,
                    drift_ns = d.drift_ns,
                    over_ns = d.over_ns,
                    window_ns = window,
                ),
                Ok(None) => {}
                Err(CudaError::Driver { source, .. }) => self.hand_back(source),
                Err(_) => {}
            }
            st.timeline.set_anchor(event, host_ns);
            st.anchored_at = Some(host_ns);
        }
        Ok(())
    }

    /// Records one reference event and polls it until complete: the event, its host time
    /// and the width of the window it was observed in; `None` when it did not complete
    /// within `max_wait` or no event was free.
    fn observe_anchor(
        &self,
        rec: &Recorder,
        st: &mut State,
        max_wait: Nanos,
    ) -> Result<Option<(CudaEvent, Nanos, Nanos)>, CudaError> {
        let events = self.events();
        let Some(event) = st.timeline.take_event(&events)? else {
            return Ok(None);
        };
        let before = rec.now();
        if let Err(e) = events.record(&event) {
            st.timeline.put_back(event);
            return Err(e);
        }
        loop {
            match events.is_complete(&event) {
                Ok(true) => break,
                Ok(false) if rec.now().saturating_sub(before) < max_wait => std::hint::spin_loop(),
                Ok(false) => {
                    st.timeline.put_back(event);
                    return Ok(None);
                }
                Err(e) => {
                    st.timeline.put_back(event);
                    return Err(e);
                }
            }
        }
        let (host_ns, window) = anchor_time(before, rec.now());
        Ok(Some((event, host_ns, window)))
    }

    /// Resolves finished operations and writes them to the trace.
    fn drain(&self, rec: &Recorder, st: &mut State) -> Result<(), CudaError> {
        let events = self.events();
        let mut resolved = std::mem::take(&mut st.resolved);
        let result = st.timeline.poll(&events, &mut resolved);
        for r in resolved.drain(..) {
            self.emit(rec, &r.payload, Some((r.gpu_start, r.gpu_end)));
        }
        st.resolved = resolved;
        result
    }

    /// Writes `op` with its GPU times, if known. A blocking copy's end is bounded by the host
    /// return (and marked so in the trace): its end event was recorded after the call came
    /// back, so the event's time would count the host round trip as GPU time.
    fn emit(&self, rec: &Recorder, op: &GpuOp, gpu: Option<(Nanos, Nanos)>) {
        let mut op = *op;
        op.gpu_start = gpu.map(|g| g.0);
        op.gpu_end = gpu.map(|g| g.1);
        if let Some((start, end)) = gpu
            && returns_when_done(op.kind, op.host_memory)
        {
            let (start, end, bounded) = bound_by_host_return(start, end, op.host_end);
            op.gpu_start = Some(start);
            op.gpu_end = Some(end);
            op.gpu_end_at_host_return = bounded;
        }
        rec.gpu(&op);
    }

    /// An operation of this stream issued now by the calling thread, its host times still
    /// to be filled in.
    fn meta(
        &self,
        rec: &Recorder,
        kind: GpuOpKind,
        bytes: u64,
        host_memory: Option<HostMemory>,
        location: &'static Location<'static>,
    ) -> GpuOp {
        GpuOp {
            id: rec.next_id(),
            thread: rec.current_thread(),
            device: self.device,
            stream: Some(self.handle),
            bytes,
            host_memory,
            span: rec.current_span(),
            location: Some(location),
            ..GpuOp::new(kind)
        }
    }

    /// Runs `op` (work enqueued on the stream) bracketed by timing events.
    fn timed<R>(
        &self,
        kind: GpuOpKind,
        bytes: u64,
        host_memory: Option<HostMemory>,
        location: &'static Location<'static>,
        kernel: KernelSpec,
        op: impl FnOnce(&Arc<CudaStream>) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let Some(rec) = crate::recorder() else {
            return op(&self.stream);
        };
        let mut meta = self.meta(&rec, kind, bytes, host_memory, location);
        let mut st = self.lock();
        if !st.device_announced {
            self.announce_device(&rec, &mut st);
        }
        if !st.timeline.has_anchor() && !st.anchor_tried {
            // Recording started after the stream was created. One short try; if the
            // stream is busy the next synchronize anchors it, and until then
            // operations are recorded without GPU times.
            st.anchor_tried = true;
            // A failure here only leaves the operation untimed; the operation still runs,
            // and reports the error if it was the driver's.
            if let Err(CudaError::Driver { source, .. }) =
                self.anchor(&rec, &mut st, ANCHOR_WAIT_BUSY_NS)
            {
                self.hand_back(source);
            }
        }
        meta.kernel = match kernel {
            KernelSpec::None => None,
            KernelSpec::Launch {
                func,
                grid,
                block,
                shared_mem_bytes,
            } => {
                let name = st
                    .kernel_names
                    .entry(func as usize)
                    .or_insert_with(|| driver_kernel_name(func).into());
                Some(KernelLaunch {
                    name: rec.intern(name),
                    grid,
                    block,
                    shared_mem_bytes,
                })
            }
            KernelSpec::Named(name) => Some(KernelLaunch {
                name: rec.intern(name),
                grid: [0; 3],
                block: [0; 3],
                shared_mem_bytes: 0,
            }),
        };
        let events = self.events();
        let mut resolved = std::mem::take(&mut st.resolved);
        meta.host_start = rec.now();
        let bracket = st.timeline.begin(&events, &mut resolved);
        let result = op(&self.stream);
        meta.host_end = rec.now();
        for r in resolved.drain(..) {
            self.emit(&rec, &r.payload, Some((r.gpu_start, r.gpu_end)));
        }
        st.resolved = resolved;
        match (bracket, &result) {
            (Ok(Some(bracket)), Ok(_)) => st.timeline.end(&events, meta, bracket)?,
            (Ok(Some(bracket)), Err(_)) => {
                st.timeline.abandon(bracket);
                self.emit(&rec, &meta, None);
            }
            (Ok(None), _) => self.emit(&rec, &meta, None),
            (Err(e), _) => {
                self.emit(&rec, &meta, None);
                // The operation itself ran; report the event failure only if it succeeded.
                result?;
                return Err(e);
            }
        }
        // Cheap: one `cuEventQuery` on the oldest operation when nothing finished yet.
        self.drain(&rec, &mut st)?;
        if result.is_ok() && returns_when_done(meta.kind, meta.host_memory) {
            // A blocking copy returned: everything before it is done, and what is left is at
            // most its end event, so a stale reference is renewed in microseconds.
            let idle = st.timeline.pending() <= 1;
            self.reanchor_if_stale(&rec, &mut st, meta.host_end, idle)?;
            self.drain(&rec, &mut st)?;
        }
        result
    }

    /// Runs a host-side operation (allocation, free) and records its host time.
    fn host_only<R>(
        &self,
        kind: GpuOpKind,
        bytes: u64,
        location: &'static Location<'static>,
        op: impl FnOnce(&Arc<CudaStream>) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let Some(rec) = crate::recorder() else {
            return op(&self.stream);
        };
        let mut meta = self.meta(&rec, kind, bytes, None, location);
        meta.host_start = rec.now();
        let result = op(&self.stream);
        meta.host_end = rec.now();
        self.emit(&rec, &meta, None);
        if kind == GpuOpKind::Alloc && result.is_ok() {
            let mut st = self.lock();
            if memory_sample_due(st.last_memory_sample, meta.host_end) {
                self.sample_memory(&rec, &mut st);
            }
        }
        result
    }

    /// Allocates `len` elements of uninitialised device memory (recorded as an
    /// allocation).
    ///
    /// # Safety
    /// As cudarc's `CudaStream::alloc`: the memory is not initialised.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub unsafe fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>, CudaError> {
        // SAFETY: forwarded to the caller.
        self.host_only(
            GpuOpKind::Alloc,
            bytes_of::<T>(len),
            Location::caller(),
            |s| unsafe { s.alloc::<T>(len).map_err(driver("alloc")) },
        )
    }

    /// Allocates `len` zeroed elements: recorded as an allocation and a memset.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        let location = Location::caller();
        // SAFETY: every byte is set to zero right below before the slice is handed out.
        let mut dst =
            self.host_only(GpuOpKind::Alloc, bytes_of::<T>(len), location, |s| unsafe {
                s.alloc::<T>(len).map_err(driver("alloc_zeros"))
            })?;
        self.memset_zeros_at(&mut dst, location)?;
        Ok(dst)
    }

    /// Sets every byte of `dst` to zero.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub fn memset_zeros<T: DeviceRepr + ValidAsZeroBits, Dst: DevicePtrMut<T>>(
        &self,
        dst: &mut Dst,
    ) -> Result<(), CudaError> {
        self.memset_zeros_at(dst, Location::caller())
    }

    fn memset_zeros_at<T: DeviceRepr + ValidAsZeroBits, Dst: DevicePtrMut<T>>(
        &self,
        dst: &mut Dst,
        location: &'static Location<'static>,
    ) -> Result<(), CudaError> {
        let bytes = dst.num_bytes() as u64;
        self.timed(
            GpuOpKind::Memset,
            bytes,
            None,
            location,
            KernelSpec::None,
            |s| s.memset_zeros(dst).map_err(driver("memset_zeros")),
        )
    }

    /// Releases a device buffer now, recording the release.
    #[track_caller]
    pub fn free<T>(&self, slice: CudaSlice<T>) {
        let bytes = slice.num_bytes() as u64;
        let _ = self.host_only(GpuOpKind::Free, bytes, Location::caller(), |_| {
            drop(slice);
            Ok(())
        });
    }

    /// Copies a host buffer into a new device buffer: recorded as an allocation and a
    /// host-to-device copy.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub fn clone_htod<T: DeviceRepr, Src: HostBuffer<T> + ?Sized>(
        &self,
        src: &Src,
    ) -> Result<CudaSlice<T>, CudaError> {
        let location = Location::caller();
        let len = src.len();
        // SAFETY: the copy right below overwrites all `len` elements before the slice
        // is handed out; on error the slice is dropped unread.
        let mut dst =
            self.host_only(GpuOpKind::Alloc, bytes_of::<T>(len), location, |s| unsafe {
                s.alloc::<T>(len).map_err(driver("clone_htod"))
            })?;
        self.memcpy_htod_at(src, &mut dst, location)?;
        Ok(dst)
    }

    /// Copies a host buffer into an existing device buffer.
    ///
    /// # Errors
    /// [`CudaError::LengthMismatch`] when `dst` is shorter than `src`, [`CudaError::Driver`].
    #[track_caller]
    pub fn memcpy_htod<T: DeviceRepr, Src: HostBuffer<T> + ?Sized, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), CudaError> {
        self.memcpy_htod_at(src, dst, Location::caller())
    }

    fn memcpy_htod_at<T: DeviceRepr, Src: HostBuffer<T> + ?Sized, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
        location: &'static Location<'static>,
    ) -> Result<(), CudaError> {
        fits("memcpy_htod", src.len(), dst.len())?;
        let bytes = bytes_of::<T>(src.len());
        self.timed(
            GpuOpKind::MemcpyHtoD,
            bytes,
            Some(src.host_memory()),
            location,
            KernelSpec::None,
            |s| s.memcpy_htod(src, dst).map_err(driver("memcpy_htod")),
        )
    }

    /// Copies a device buffer into a new `Vec` (pageable host memory). The call returns
    /// once the data is on the host, so it waits for all earlier work on the stream.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub fn clone_dtoh<T: DeviceRepr, Src: DevicePtr<T>>(
        &self,
        src: &Src,
    ) -> Result<Vec<T>, CudaError> {
        let bytes = bytes_of::<T>(src.len());
        self.timed(
            GpuOpKind::MemcpyDtoH,
            bytes,
            Some(HostMemory::Pageable),
            Location::caller(),
            KernelSpec::None,
            |s| s.clone_dtoh(src).map_err(driver("clone_dtoh")),
        )
    }

    /// Copies a device buffer into an existing host buffer.
    ///
    /// # Errors
    /// [`CudaError::LengthMismatch`] when `dst` is shorter than `src`, [`CudaError::Driver`].
    #[track_caller]
    pub fn memcpy_dtoh<T: DeviceRepr, Src: DevicePtr<T>, Dst: HostBuffer<T> + ?Sized>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), CudaError> {
        fits("memcpy_dtoh", src.len(), dst.len())?;
        let bytes = bytes_of::<T>(src.len());
        let host_memory = dst.host_memory();
        self.timed(
            GpuOpKind::MemcpyDtoH,
            bytes,
            Some(host_memory),
            Location::caller(),
            KernelSpec::None,
            |s| s.memcpy_dtoh(src, dst).map_err(driver("memcpy_dtoh")),
        )
    }

    /// Copies between device buffers.
    ///
    /// # Errors
    /// [`CudaError::LengthMismatch`] when `dst` is shorter than `src`, [`CudaError::Driver`].
    #[track_caller]
    pub fn memcpy_dtod<T, Src: DevicePtr<T>, Dst: DevicePtrMut<T>>(
        &self,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), CudaError> {
        fits("memcpy_dtod", src.len(), dst.len())?;
        let bytes = src.num_bytes() as u64;
        self.timed(
            GpuOpKind::MemcpyDtoD,
            bytes,
            None,
            Location::caller(),
            KernelSpec::None,
            |s| s.memcpy_dtod(src, dst).map_err(driver("memcpy_dtod")),
        )
    }

    /// Blocks until all work on the stream is done; records the host time blocked,
    /// then resolves every outstanding operation.
    ///
    /// # Errors
    /// [`CudaError::Driver`] (including errors of earlier asynchronous work).
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let Some(rec) = crate::recorder() else {
            return self
                .stream
                .synchronize()
                .map_err(driver("cuStreamSynchronize"));
        };
        let mut meta = self.meta(&rec, GpuOpKind::Synchronize, 0, None, Location::caller());
        meta.host_start = rec.now();
        let result = self
            .stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"));
        meta.host_end = rec.now();
        self.emit(&rec, &meta, None);
        result?;
        let mut st = self.lock();
        self.drain(&rec, &mut st)?;
        // The stream is idle right now: a fresh reference costs microseconds.
        let idle = st.timeline.pending() == 0;
        self.reanchor_if_stale(&rec, &mut st, meta.host_end, idle)?;
        if memory_sample_due(st.last_memory_sample, meta.host_end) {
            self.sample_memory(&rec, &mut st);
        }
        Ok(())
    }

    /// Waits on the host for `event` (`cuEventSynchronize`), recorded as a synchronization
    /// with no stream (as CUPTI reports an event synchronization): the host stall of, say, a
    /// pinned staging buffer waiting for its last upload. When the stream is idle afterwards
    /// and the clock reference is stale, it is renewed here as after [`Self::synchronize`].
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub fn wait_event(&self, event: &CudaEvent) -> Result<(), CudaError> {
        let Some(rec) = crate::recorder() else {
            return event.synchronize().map_err(driver("cuEventSynchronize"));
        };
        let mut meta = self.meta(&rec, GpuOpKind::Synchronize, 0, None, Location::caller());
        meta.stream = None;
        meta.host_start = rec.now();
        let result = event.synchronize().map_err(driver("cuEventSynchronize"));
        meta.host_end = rec.now();
        self.emit(&rec, &meta, None);
        result?;
        let mut st = self.lock();
        self.drain(&rec, &mut st)?;
        let idle = st.timeline.pending() == 0;
        self.reanchor_if_stale(&rec, &mut st, meta.host_end, idle)
    }

    /// Renews the clock reference when it is stale (or was never taken) and the stream is
    /// `idle` (nothing in flight but, at most, the end event of a blocking copy), so that
    /// long runs that rarely synchronize do not drift. The drift of the reference replaced
    /// is recorded (`perfkit.clock_drift`).
    fn reanchor_if_stale(
        &self,
        rec: &Recorder,
        st: &mut State,
        now: Nanos,
        idle: bool,
    ) -> Result<(), CudaError> {
        if should_reanchor(st.anchored_at, now, idle) {
            self.anchor(rec, st, ANCHOR_WAIT_NS)?;
        }
        Ok(())
    }

    /// Resolves the operations that have finished so far, without waiting.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when an event query fails (for example after a kernel fault).
    pub fn poll(&self) -> Result<(), CudaError> {
        let Some(rec) = crate::recorder() else {
            return Ok(());
        };
        let mut st = self.lock();
        self.drain(&rec, &mut st)
    }

    /// A kernel launch builder, as cudarc's `CudaStream::launch_builder`; the launch
    /// is recorded with the kernel's name, grid and block.
    #[must_use]
    pub fn launch_builder<'a>(&'a self, func: &'a CudaFunction) -> ProfiledLaunch<'a> {
        ProfiledLaunch {
            owner: self,
            func,
            args: self.stream.launch_builder(func),
        }
    }

    /// A cuBLAS matrix product on this stream (`blas` must be bound to it, see
    /// [`ProfiledStream::new_blas`]), recorded as a kernel named after the routine.
    ///
    /// # Safety
    /// As cudarc's `Gemm::gemm`: the configuration must match the buffers.
    ///
    /// # Errors
    /// [`CudaError::Blas`].
    #[track_caller]
    pub unsafe fn gemm<T: 'static, A: DevicePtr<T>, B: DevicePtr<T>, C: DevicePtrMut<T>>(
        &self,
        blas: &CudaBlas,
        cfg: GemmConfig<T>,
        a: &A,
        b: &B,
        c: &mut C,
    ) -> Result<(), CudaError>
    where
        CudaBlas: Gemm<T>,
    {
        let location = Location::caller();
        let name = gemm_name::<T>();
        // The GEMM is timed on this stream: a handle bound to another one would run it
        // outside the bracketing events (and outside the stream's order).
        let mut bound: cudarc::cublas::sys::cudaStream_t = std::ptr::null_mut();
        // SAFETY: a live handle and a valid out-pointer.
        unsafe { cudarc::cublas::sys::cublasGetStream_v2(*blas.handle(), &mut bound) }
            .result()
            .map_err(|source| CudaError::Blas {
                op: "cublasGetStream_v2",
                source,
            })?;
        if !same_stream(bound as usize, self.stream.cu_stream() as usize) {
            // Bound elsewhere (a handle made for another stream): bind it to this one, whose
            // events bracket the GEMM. Binding to the stream it already runs on is harmless.
            // SAFETY: a live handle and this profiled stream, alive for the call.
            unsafe {
                cudarc::cublas::sys::cublasSetStream_v2(
                    *blas.handle(),
                    self.stream.cu_stream() as cudarc::cublas::sys::cudaStream_t,
                )
            }
            .result()
            .map_err(|_| CudaError::BlasOtherStream)?;
        }
        self.timed(
            GpuOpKind::Kernel,
            0,
            None,
            location,
            KernelSpec::Named(name),
            |_| {
                // SAFETY: forwarded to the caller.
                unsafe { blas.gemm(cfg, a, b, c) }
                    .map_err(|source| CudaError::Blas { op: name, source })
            },
        )
    }
}

impl ProfiledStream {
    /// Destroys a cuBLAS handle made by [`ProfiledStream::new_blas`]. After a sticky fault
    /// (an illegal address, a failed launch) `cublasDestroy` fails, and cudarc's drop of the
    /// handle panics on that status; the handle is then leaked on purpose (the context is
    /// unusable anyway, and its memory goes with the process) and the fault handed back to
    /// cudarc, which reports it from the program's next call.
    pub fn release_blas(&self, blas: CudaBlas) {
        // SAFETY: the stream is alive; cuStreamQuery only reads its state.
        let r = unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) };
        if is_sticky(r) {
            std::mem::forget(blas);
            self.hand_back(cudarc::driver::DriverError(r));
        } else {
            drop(blas);
        }
    }
}

/// Whether `bound` (the stream a cuBLAS handle runs on) is `ours` (both null: the default
/// stream).
fn same_stream(bound: usize, ours: usize) -> bool {
    bound == ours
}

/// Whether a driver status is a sticky fault: the context cannot be used again, and every
/// later call of it fails with the same status.
fn is_sticky(r: cudarc::driver::sys::CUresult) -> bool {
    use cudarc::driver::sys::CUresult as R;
    matches!(
        r,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
            | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

impl Drop for ProfiledStream {
    fn drop(&mut self) {
        let Some(rec) = crate::recorder() else {
            return;
        };
        let mut st = self.lock();
        // Whatever finished is written with its GPU times; the rest without (never wait).
        let _ = self.drain(&rec, &mut st);
        for meta in st.timeline.discard_pending() {
            self.emit(&rec, &meta, None);
        }
    }
}

/// Whether to take a new clock reference at `now`: the stream is idle and the reference
/// (taken at `anchored_at`) is missing or older than [`REANCHOR_AFTER_NS`].
fn should_reanchor(anchored_at: Option<Nanos>, now: Nanos, idle: bool) -> bool {
    idle && anchored_at.is_none_or(|t| now.saturating_sub(t) > REANCHOR_AFTER_NS)
}

/// Whether device memory may be sampled again at `now`, the last sample taken at `last`.
fn memory_sample_due(last: Option<Nanos>, now: Nanos) -> bool {
    last.is_none_or(|t| now.saturating_sub(t) > MEMORY_SAMPLE_NS)
}

/// [`CudaError::LengthMismatch`] for `op` when the destination (`dst` elements) is shorter
/// than the source (`src` elements).
fn fits(op: &'static str, src: usize, dst: usize) -> Result<(), CudaError> {
    if dst < src {
        return Err(CudaError::LengthMismatch { op, src, dst });
    }
    Ok(())
}

/// The kernel's name from `cuFuncGetName` (CUDA 12.3+ drivers), or `"kernel"`.
fn driver_kernel_name(func: sys::CUfunction) -> String {
    static HAS_FUNC_GET_NAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let available = *HAS_FUNC_GET_NAME.get_or_init(|| {
        type GetName =
            unsafe extern "C" fn(*mut *const std::ffi::c_char, sys::CUfunction) -> sys::CUresult;
        // SAFETY: a driver is loaded (a function exists); looking a symbol up has no
        // side effects. cudarc would panic on a missing symbol, so check first.
        unsafe {
            cudarc::driver::sys::culib()
                .get::<GetName>(b"cuFuncGetName")
                .is_ok()
        }
    });
    if !available {
        return "kernel".to_string();
    }
    let mut ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `func` is a live function handle (borrowed by the launch builder) and
    // `ptr` is a valid out-pointer.
    let rc = unsafe { sys::cuFuncGetName(&mut ptr, func) };
    if rc != sys::CUresult::CUDA_SUCCESS || ptr.is_null() {
        return "kernel".to_string();
    }
    // SAFETY: the driver returns a NUL-terminated string owned by the module.
    unsafe { std::ffi::CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// The cuBLAS routine a `gemm::<T>` call runs.
fn gemm_name<T: 'static>() -> &'static str {
    use std::any::TypeId;
    let t = TypeId::of::<T>();
    if t == TypeId::of::<f32>() {
        "cublasSgemm"
    } else if t == TypeId::of::<f64>() {
        "cublasDgemm"
    } else {
        "cublasGemmEx"
    }
}

/// A kernel launch being built on a [`ProfiledStream`] (see
/// [`ProfiledStream::launch_builder`]); mirrors cudarc's `LaunchArgs`.
pub struct ProfiledLaunch<'a> {
    owner: &'a ProfiledStream,
    func: &'a CudaFunction,
    args: LaunchArgs<'a>,
}

impl std::fmt::Debug for ProfiledLaunch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfiledLaunch")
            .field("stream", self.owner)
            .finish_non_exhaustive()
    }
}

impl<'a> ProfiledLaunch<'a> {
    /// Adds a kernel argument (anything cudarc's launch builder accepts).
    pub fn arg<T>(&mut self, arg: T) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<T>,
    {
        self.args.arg(arg);
        self
    }

    /// Launches the kernel, recording it with its name, grid and block.
    ///
    /// # Safety
    /// As cudarc's `LaunchArgs::launch`: the arguments must match the kernel.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[track_caller]
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), CudaError> {
        let grid = [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2];
        let block = [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2];
        let kernel = KernelSpec::Launch {
            func: self.func.cu_function(),
            grid,
            block,
            shared_mem_bytes: cfg.shared_mem_bytes,
        };
        let args = &mut self.args;
        self.owner.timed(
            GpuOpKind::Kernel,
            0,
            None,
            Location::caller(),
            kernel,
            |_| {
                // SAFETY: forwarded to the caller.
                unsafe { args.launch(cfg) }
                    .map(|_| ())
                    .map_err(driver("cuLaunchKernel"))
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_faults_are_told_from_ordinary_statuses() {
        use cudarc::driver::sys::CUresult as R;
        assert!(is_sticky(R::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(is_sticky(R::CUDA_ERROR_LAUNCH_FAILED));
        // A busy stream, or no error, leaves the handle to cudarc's own drop.
        assert!(!is_sticky(R::CUDA_SUCCESS));
        assert!(!is_sticky(R::CUDA_ERROR_NOT_READY));
        assert!(!is_sticky(R::CUDA_ERROR_OUT_OF_MEMORY));
    }

    #[test]
    fn a_blas_handle_on_another_stream_is_not_ours() {
        assert!(same_stream(0x1000, 0x1000));
        assert!(!same_stream(0x2000, 0x1000));
        assert!(!same_stream(0, 0x1000));
        // Both on the default stream.
        assert!(same_stream(0, 0));
        assert!(
            CudaError::BlasOtherStream
                .to_string()
                .contains("could not be bound to it")
        );
    }

    #[test]
    fn a_reference_is_renewed_only_when_stale_and_the_stream_idle() {
        let second = REANCHOR_AFTER_NS;
        assert!(should_reanchor(None, 0, true), "never anchored");
        assert!(!should_reanchor(None, 0, false), "busy stream");
        assert!(
            !should_reanchor(Some(10), 10 + second, true),
            "not stale yet"
        );
        assert!(should_reanchor(Some(10), 11 + second, true));
        assert!(!should_reanchor(Some(10), 11 + second, false));
        // A clock read before the reference never underflows.
        assert!(!should_reanchor(Some(10), 5, true));
    }

    #[test]
    fn device_memory_is_sampled_at_most_every_interval() {
        assert!(memory_sample_due(None, 0));
        // A thousand allocations within one interval ask the driver once.
        let asked = (0..1000u64)
            .scan(None, |last, i| {
                let now = i * 1_000; // one allocation per microsecond
                let due = memory_sample_due(*last, now);
                if due {
                    *last = Some(now);
                }
                Some(due)
            })
            .filter(|&d| d)
            .count();
        assert_eq!(asked, 1);
        assert!(memory_sample_due(Some(0), MEMORY_SAMPLE_NS + 1));
    }
}
