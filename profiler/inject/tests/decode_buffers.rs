//! Activity buffers laid out exactly as CUPTI lays them out (the bindings' own record structs,
//! back to back, 8-byte aligned, in an 8-byte aligned buffer), decoded without a GPU, then
//! joined and converted to trace operations.

use std::ffi::CString;
use std::mem::size_of;

use cudarc::cupti::sys;
use perfkit_inject::decode::{self, Activity, ApiDomain, CopyKind, MemoryKind, SyncKind};
use perfkit_inject::join::{CallInfo, Clock, Joiner, PyFrames};
use perfkit_profiler::model::{GpuOpKind, HostMemory};

/// An 8-byte aligned byte buffer records are appended to.
struct Buffer {
    words: Vec<u64>,
    len: usize,
}

impl Buffer {
    fn new() -> Buffer {
        Buffer {
            words: vec![0; 4096],
            len: 0,
        }
    }

    /// Appends a record struct the way CUPTI stores it: its bytes at the next 8-byte boundary.
    fn push<T: Copy>(&mut self, rec: &T) {
        let at = self.len.next_multiple_of(8);
        let size = size_of::<T>();
        assert!(at + size <= self.words.len() * 8);
        // SAFETY: in bounds (checked above); T is a plain C struct.
        unsafe {
            let dst = (self.words.as_mut_ptr() as *mut u8).add(at);
            std::ptr::write_unaligned(dst as *mut T, *rec);
        }
        self.len = at + size;
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: len bytes of the words are initialised.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }
}

fn zeroed<T>() -> T {
    // SAFETY: used for the CUPTI record structs, whose every field (integers, raw pointers,
    // unions, and enums that all have a 0 variant) is valid as zero.
    unsafe { std::mem::zeroed() }
}

fn memcpy(
    copy: sys::CUpti_ActivityMemcpyKind,
    src: sys::CUpti_ActivityMemoryKind,
    dst: sys::CUpti_ActivityMemoryKind,
    bytes: u64,
    correlation: u32,
) -> sys::CUpti_ActivityMemcpy6 {
    let mut r: sys::CUpti_ActivityMemcpy6 = zeroed();
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY;
    r.copyKind = copy as u8;
    r.srcKind = src as u8;
    r.dstKind = dst as u8;
    r.bytes = bytes;
    r.start = 1_000_000;
    r.end = 1_000_000 + bytes / 10;
    r.deviceId = 0;
    r.contextId = 1;
    r.streamId = 13;
    r.correlationId = correlation;
    r.runtimeCorrelationId = correlation - 1;
    r.channelType = sys::CUpti_ChannelType::CUPTI_CHANNEL_TYPE_ASYNC_MEMCPY;
    r.copyCount = 1;
    r
}

fn kernel(name: &CString, correlation: u32) -> sys::CUpti_ActivityKernel10 {
    let mut r: sys::CUpti_ActivityKernel10 = zeroed();
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    r.start = 2_000_000;
    r.end = 2_000_750;
    r.completed = 2_000_750;
    r.deviceId = 1;
    r.contextId = 2;
    r.streamId = 7;
    r.gridX = 80;
    r.gridY = 2;
    r.gridZ = 1;
    r.blockX = 256;
    r.blockY = 1;
    r.blockZ = 1;
    r.staticSharedMemory = 1024;
    r.dynamicSharedMemory = 4096;
    r.correlationId = correlation;
    r.gridId = 99;
    r.name = name.as_ptr();
    r.queued = 1_999_000;
    r.submitted = 1_999_500;
    r.graphNodeId = 0;
    r.clusterX = 1;
    r
}

fn sync(
    ty: sys::CUpti_ActivitySynchronizationType,
    correlation: u32,
) -> sys::CUpti_ActivitySynchronization2 {
    let mut r: sys::CUpti_ActivitySynchronization2 = zeroed();
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    r.type_ = ty;
    r.start = 3_000_000;
    r.end = 3_400_000;
    r.correlationId = correlation;
    r.contextId = 1;
    r.streamId = 13;
    r.cudaEventId = u32::MAX;
    r
}

fn memset(correlation: u32) -> sys::CUpti_ActivityMemset4 {
    let mut r: sys::CUpti_ActivityMemset4 = zeroed();
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET;
    r.value = 0;
    r.bytes = 1 << 16;
    r.start = 4_000_000;
    r.end = 4_000_100;
    r.deviceId = 0;
    r.contextId = 1;
    r.streamId = 13;
    r.correlationId = correlation;
    r.memoryKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE as u16;
    r
}

fn memory(alloc: bool, correlation: u32) -> sys::CUpti_ActivityMemory4 {
    let mut r: sys::CUpti_ActivityMemory4 = zeroed();
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY2;
    r.memoryOperationType = if alloc {
        sys::CUpti_ActivityMemoryOperationType::CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
    } else {
        sys::CUpti_ActivityMemoryOperationType::CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE
    };
    r.memoryKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
    r.correlationId = correlation;
    r.address = 0x7f00_0000_0000;
    r.bytes = 64 << 20;
    r.timestamp = 500_000;
    r.PC = 0x1234;
    r.processId = 42;
    r.deviceId = 0;
    r.contextId = 1;
    r.streamId = 0;
    r
}

fn api(driver: bool, cbid: u32, correlation: u32) -> sys::CUpti_ActivityAPI {
    let mut r: sys::CUpti_ActivityAPI = zeroed();
    r.kind = if driver {
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER
    } else {
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_RUNTIME
    };
    r.cbid = cbid;
    r.start = 900_000;
    r.end = 950_000;
    r.processId = 42;
    r.threadId = 4242;
    r.correlationId = correlation;
    r.returnValue = 0;
    r
}

#[test]
fn every_kind_decodes_from_a_cupti_laid_out_buffer() {
    use sys::CUpti_ActivityMemcpyKind as C;
    use sys::CUpti_ActivityMemoryKind as M;
    let name = CString::new("_Z4gemmPfS_S_i").unwrap();
    let mut b = Buffer::new();
    b.push(&api(false, 31, 10));
    b.push(&memcpy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD,
        M::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
        M::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        4 << 20,
        11,
    ));
    b.push(&kernel(&name, 20));
    b.push(&memcpy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_DTOH,
        M::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        M::CUPTI_ACTIVITY_MEMORY_KIND_PINNED,
        4,
        31,
    ));
    b.push(&sync(sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE, 40));
    b.push(&memset(50));
    b.push(&memory(true, 60));
    b.push(&memory(false, 61));
    b.push(&api(true, 440, 11));

    // SAFETY: the only pointer in the buffer is `name`, alive for the whole test.
    let out = unsafe { decode::walk(b.bytes()) };
    let recs: Vec<Activity> = out.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 9);

    let Activity::Api(a) = &recs[0] else {
        panic!("{:?}", recs[0])
    };
    assert_eq!(
        (a.domain, a.cbid, a.correlation, a.thread, a.process),
        (ApiDomain::Runtime, 31, 10, 4242, 42)
    );
    assert_eq!((a.start, a.end), (900_000, 950_000));

    let Activity::Memcpy(m) = &recs[1] else {
        panic!("{:?}", recs[1])
    };
    assert_eq!(m.copy_kind, CopyKind::HtoD);
    assert_eq!(
        (m.src_kind, m.dst_kind),
        (MemoryKind::Pageable, MemoryKind::Device)
    );
    assert_eq!(m.bytes, 4 << 20);
    assert_eq!((m.start, m.end), (1_000_000, 1_000_000 + (4 << 20) / 10));
    assert_eq!(
        (m.stream, m.correlation, m.runtime_correlation),
        (13, 11, 10)
    );

    let Activity::Kernel(k) = &recs[2] else {
        panic!("{:?}", recs[2])
    };
    assert_eq!(k.name.as_deref(), Some("_Z4gemmPfS_S_i"));
    assert_eq!((k.grid, k.block), ([80, 2, 1], [256, 1, 1]));
    assert_eq!(
        (k.static_shared_memory, k.dynamic_shared_memory),
        (1024, 4096)
    );
    assert_eq!(
        (k.device, k.context, k.stream, k.correlation),
        (1, 2, 7, 20)
    );
    assert_eq!((k.start, k.end), (2_000_000, 2_000_750));

    let Activity::Memcpy(m) = &recs[3] else {
        panic!("{:?}", recs[3])
    };
    assert_eq!(
        (m.copy_kind, m.dst_kind, m.bytes),
        (CopyKind::DtoH, MemoryKind::Pinned, 4)
    );

    let Activity::Sync(s) = &recs[4] else {
        panic!("{:?}", recs[4])
    };
    assert_eq!(
        (s.sync_kind, s.start, s.end, s.correlation, s.stream),
        (SyncKind::Stream, 3_000_000, 3_400_000, 40, 13)
    );

    let Activity::Memset(m) = &recs[5] else {
        panic!("{:?}", recs[5])
    };
    assert_eq!(
        (m.bytes, m.correlation, m.memory_kind, m.stream),
        (1 << 16, 50, MemoryKind::Device, 13)
    );

    let Activity::Memory(m) = &recs[6] else {
        panic!("{:?}", recs[6])
    };
    assert!(m.allocation);
    assert_eq!(
        (m.bytes, m.address, m.timestamp, m.correlation),
        (64 << 20, 0x7f00_0000_0000, 500_000, 60)
    );
    let Activity::Memory(m) = &recs[7] else {
        panic!("{:?}", recs[7])
    };
    assert!(!m.allocation);

    let Activity::Api(a) = &recs[8] else {
        panic!("{:?}", recs[8])
    };
    assert_eq!((a.domain, a.cbid), (ApiDomain::Driver, 440));
}

#[test]
fn truncated_records_are_errors_not_reads_past_the_end() {
    use sys::CUpti_ActivityMemcpyKind as C;
    use sys::CUpti_ActivityMemoryKind as M;
    let mut b = Buffer::new();
    b.push(&memcpy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD,
        M::CUPTI_ACTIVITY_MEMORY_KIND_PINNED,
        M::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        8,
        2,
    ));
    let full = b.bytes();
    for cut in [0usize, 3, 4, 16, 40] {
        // SAFETY: memcpy records hold no pointers that are followed.
        let r = unsafe { decode::decode(&full[..cut]) };
        assert!(r.is_err(), "cut at {cut}: {r:?}");
    }
    // SAFETY: as above.
    let e = unsafe { decode::decode(&full[..40]) }.unwrap_err();
    assert!(e.to_string().contains("is 40 bytes long"), "{e}");
}

#[test]
fn unknown_values_are_kept_not_trusted() {
    use sys::CUpti_ActivityMemcpyKind as C;
    use sys::CUpti_ActivityMemoryKind as M;
    let mut r = memcpy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD,
        M::CUPTI_ACTIVITY_MEMORY_KIND_PINNED,
        M::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        8,
        2,
    );
    r.copyKind = 200;
    r.srcKind = 77;
    let mut b = Buffer::new();
    b.push(&r);
    // SAFETY: no pointers followed.
    let Ok(Activity::Memcpy(m)) = (unsafe { decode::decode(b.bytes()) }) else {
        panic!()
    };
    assert_eq!(m.copy_kind, CopyKind::Unknown(200));
    assert_eq!(m.src_kind, MemoryKind::Other(77));

    // A kind the decoder does not read: reported, and the walk stops (its size is unknown).
    let mut raw = Buffer::new();
    let device = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DEVICE as u32;
    raw.push(&[device, 0, 0, 0]);
    // SAFETY: no pointers followed.
    let out = unsafe { decode::walk(raw.bytes()) };
    assert_eq!(out, vec![Ok(Activity::Other { kind: device })]);
}

#[test]
fn a_decoded_step_becomes_trace_operations() {
    use sys::CUpti_ActivityMemcpyKind as C;
    use sys::CUpti_ActivityMemoryKind as M;
    let name = CString::new("step_kernel").unwrap();
    let mut b = Buffer::new();
    // Upload (runtime call 10 -> driver 11), kernel (20), readback (30 -> 31), stream sync (40).
    b.push(&memcpy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD,
        M::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
        M::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        1 << 20,
        11,
    ));
    b.push(&kernel(&name, 20));
    b.push(&memcpy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_DTOH,
        M::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        M::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
        4,
        31,
    ));
    b.push(&sync(sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE, 40));
    b.push(&sync(sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT, 41));

    let mut j = Joiner::new();
    let call = |t: u64, stack: u64| CallInfo {
        thread: Some(1),
        host_start: t,
        host_end: t + 500,
        stack: Some(stack),
        outer: None,
        inner: None,
        repeats: false,
        py: PyFrames::NotRead,
    };
    for (corr, t, s) in [(10, 100, 1), (20, 200, 2), (30, 300, 3), (40, 400, 4)] {
        j.call_enter(corr, call(t, s));
        j.call_exit(corr, t + 500);
    }
    // Trace origin is 500_000 ns after the CUPTI epoch.
    let clock = Clock::from_pair(0, 500_000);
    // SAFETY: `name` is alive.
    let recs = unsafe { decode::walk(b.bytes()) };
    let ops: Vec<_> = recs
        .iter()
        .filter_map(|r| j.convert(r.as_ref().unwrap(), &clock).ok())
        .collect();
    let kinds: Vec<_> = ops.iter().map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        vec![
            GpuOpKind::MemcpyHtoD,
            GpuOpKind::Kernel,
            GpuOpKind::MemcpyDtoH,
            GpuOpKind::Synchronize
        ]
    );
    assert_eq!(ops[0].host_memory, Some(HostMemory::Pageable));
    assert_eq!(
        (ops[0].host_start, ops[0].stack),
        (100, Some(1)),
        "joined through runtimeCorrelationId"
    );
    assert_eq!(ops[0].gpu_start, Some(500_000));
    assert_eq!(ops[1].kernel.as_ref().unwrap().name, "step_kernel");
    assert_eq!(ops[1].gpu_end, Some(1_500_750));
    assert_eq!(
        (ops[2].bytes, ops[2].host_memory, ops[2].stack),
        (4, Some(HostMemory::Pageable), Some(3))
    );
    assert_eq!((ops[3].host_start, ops[3].host_end), (400, 900));
    assert!(ops.iter().all(|o| o.joined && o.thread == Some(1)));
}

fn peer_copy(correlation: u32) -> sys::CUpti_ActivityMemcpyPtoP4 {
    let mut r: sys::CUpti_ActivityMemcpyPtoP4 = zeroed();
    r.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY2;
    r.copyKind = sys::CUpti_ActivityMemcpyKind::CUPTI_ACTIVITY_MEMCPY_KIND_PTOP as u8;
    r.srcKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE as u8;
    r.dstKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE as u8;
    r.bytes = 1 << 24;
    r.start = 2_000_000;
    r.end = 2_100_000;
    r.deviceId = 1;
    r.contextId = 2;
    r.streamId = 7;
    r.srcDeviceId = 1;
    r.srcContextId = 2;
    r.dstDeviceId = 0;
    r.dstContextId = 1;
    r.correlationId = correlation;
    r.channelType = sys::CUpti_ChannelType::CUPTI_CHANNEL_TYPE_ASYNC_MEMCPY;
    r
}

#[test]
fn peer_copy_layout_is_cupti_13s() {
    // Offsets and size of `CUpti_ActivityMemcpyPtoP4` in cupti_activity.h of CUPTI 13.0.85
    // (nvidia-cuda-cupti 13.0.85, 64-bit: no `pad` before `reserved0`).
    use std::mem::offset_of;
    type T = sys::CUpti_ActivityMemcpyPtoP4;
    let fields = [
        (offset_of!(T, kind), 0),
        (offset_of!(T, copyKind), 4),
        (offset_of!(T, srcKind), 5),
        (offset_of!(T, dstKind), 6),
        (offset_of!(T, flags), 7),
        (offset_of!(T, bytes), 8),
        (offset_of!(T, start), 16),
        (offset_of!(T, end), 24),
        (offset_of!(T, deviceId), 32),
        (offset_of!(T, contextId), 36),
        (offset_of!(T, streamId), 40),
        (offset_of!(T, srcDeviceId), 44),
        (offset_of!(T, srcContextId), 48),
        (offset_of!(T, dstDeviceId), 52),
        (offset_of!(T, dstContextId), 56),
        (offset_of!(T, correlationId), 60),
        (offset_of!(T, reserved0), 64),
        (offset_of!(T, graphNodeId), 72),
        (offset_of!(T, graphId), 80),
        (offset_of!(T, channelID), 84),
        (offset_of!(T, channelType), 88),
    ];
    for (i, (got, want)) in fields.iter().enumerate() {
        assert_eq!(got, want, "field {i}");
    }
    assert_eq!(size_of::<T>(), 96);
    assert_eq!(decode::record_size(decode::kind::MEMCPY2), Some(96));
}

#[test]
fn a_peer_copy_decodes_and_becomes_a_device_copy() {
    let mut b = Buffer::new();
    b.push(&peer_copy(50));
    // SAFETY: peer copy records hold no pointers that are followed.
    let recs = unsafe { decode::walk(b.bytes()) };
    assert_eq!(recs.len(), 1);
    let a = recs[0].as_ref().unwrap();
    let Activity::PeerCopy(p) = a else {
        panic!("{a:?}")
    };
    assert_eq!(p.copy.copy_kind, CopyKind::PtoP);
    assert_eq!(
        (p.copy.bytes, p.copy.start, p.copy.end),
        (1 << 24, 2_000_000, 2_100_000)
    );
    assert_eq!((p.copy.device, p.copy.context, p.copy.stream), (1, 2, 7));
    assert_eq!((p.copy.correlation, p.copy.runtime_correlation), (50, 0));
    assert_eq!((p.src_device, p.src_context), (1, 2));
    assert_eq!((p.dst_device, p.dst_context), (0, 1));

    let full = b.bytes();
    // SAFETY: as above.
    let e = unsafe { decode::decode(&full[..60]) }.unwrap_err();
    assert!(e.to_string().contains("is 60 bytes long"), "{e}");

    let mut j = Joiner::new();
    j.call_enter(
        50,
        CallInfo {
            thread: Some(1),
            host_start: 100,
            host_end: 600,
            stack: Some(9),
            outer: None,
            inner: None,
            repeats: false,
            py: PyFrames::NotRead,
        },
    );
    j.call_exit(50, 600);
    let op = j.convert(a, &Clock::from_pair(0, 500_000)).unwrap();
    assert_eq!(op.kind, GpuOpKind::MemcpyDtoD);
    assert_eq!(
        (op.bytes, op.host_memory, op.stack),
        (1 << 24, None, Some(9))
    );
    assert_eq!(op.gpu_start, Some(1_500_000));
    assert!(op.joined);
}
