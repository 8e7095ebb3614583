//! Decoding of CUPTI activity records.
//!
//! CUPTI fills buffers with activity records laid out as the C structs of `cupti_activity.h`
//! (`CUpti_ActivityMemcpy6`, `CUpti_ActivityKernel10`, ...). The decoder reads each field at the
//! offset the bindings' own struct gives it (`offset_of!` on `cudarc::cupti::sys` types), as plain
//! integers: it never materialises an enum from bytes it did not write, so a value a newer CUPTI
//! adds is reported as unknown instead of being undefined behaviour. A record shorter than the
//! fields read is an error, never a read past the buffer.
//!
//! The layouts are those of the CUPTI 13.0 headers; [`crate::version`] refuses a libcupti whose
//! records could differ.

use std::ffi::{CStr, c_char};
use std::mem::{offset_of, size_of};

use cudarc::cupti::sys;

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is shorter than the fields the decoder reads.
    #[error("activity record of kind {kind} is {len} bytes long, its layout needs {needed}")]
    Short {
        /// Activity kind (`CUpti_ActivityKind` value).
        kind: u32,
        /// Bytes available from the start of the record.
        len: usize,
        /// Bytes the decoded fields need.
        needed: usize,
    },
    /// Not even the 4-byte kind is there.
    #[error("activity record cut short: {len} bytes, not even its kind")]
    NoKind {
        /// Bytes available.
        len: usize,
    },
}

/// The API domain of an API activity record: the callbacks' [`Domain`](crate::calls::Domain).
pub use crate::calls::Domain as ApiDomain;

/// Direction of a memory copy (`CUpti_ActivityMemcpyKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyKind {
    /// Host to device.
    HtoD,
    /// Device to host.
    DtoH,
    /// Host to CUDA array.
    HtoA,
    /// CUDA array to host.
    AtoH,
    /// Array to array.
    AtoA,
    /// Array to device.
    AtoD,
    /// Device to array.
    DtoA,
    /// Device to device.
    DtoD,
    /// Host to host.
    HtoH,
    /// Peer to peer (between devices).
    PtoP,
    /// A value this decoder does not know.
    Unknown(u8),
}

impl CopyKind {
    fn from_raw(v: u8) -> CopyKind {
        use sys::CUpti_ActivityMemcpyKind as K;
        match u32::from(v) {
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD as u32 => CopyKind::HtoD,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_DTOH as u32 => CopyKind::DtoH,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_HTOA as u32 => CopyKind::HtoA,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_ATOH as u32 => CopyKind::AtoH,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_ATOA as u32 => CopyKind::AtoA,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_ATOD as u32 => CopyKind::AtoD,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_DTOA as u32 => CopyKind::DtoA,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_DTOD as u32 => CopyKind::DtoD,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_HTOH as u32 => CopyKind::HtoH,
            x if x == K::CUPTI_ACTIVITY_MEMCPY_KIND_PTOP as u32 => CopyKind::PtoP,
            _ => CopyKind::Unknown(v),
        }
    }
}

/// Kind of memory on one side of a copy or of an allocation (`CUpti_ActivityMemoryKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Not known to CUPTI.
    Unknown,
    /// Pageable host memory.
    Pageable,
    /// Pinned (page-locked) host memory.
    Pinned,
    /// Device memory.
    Device,
    /// CUDA array.
    Array,
    /// Managed (unified) memory.
    Managed,
    /// Static device memory.
    DeviceStatic,
    /// Static managed memory.
    ManagedStatic,
    /// A value this decoder does not know.
    Other(u32),
}

impl MemoryKind {
    fn from_raw(v: u32) -> MemoryKind {
        use sys::CUpti_ActivityMemoryKind as K;
        match v {
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN as u32 => MemoryKind::Unknown,
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE as u32 => MemoryKind::Pageable,
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_PINNED as u32 => MemoryKind::Pinned,
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE as u32 => MemoryKind::Device,
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_ARRAY as u32 => MemoryKind::Array,
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_MANAGED as u32 => MemoryKind::Managed,
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC as u32 => {
                MemoryKind::DeviceStatic
            }
            x if x == K::CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC as u32 => {
                MemoryKind::ManagedStatic
            }
            other => MemoryKind::Other(other),
        }
    }
}

/// What a synchronization record waited for (`CUpti_ActivitySynchronizationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncKind {
    /// `cuEventSynchronize` / `cudaEventSynchronize`.
    Event,
    /// `cuStreamWaitEvent`: a GPU-side wait, the host is not blocked.
    StreamWaitEvent,
    /// `cuStreamSynchronize` / `cudaStreamSynchronize`.
    Stream,
    /// `cuCtxSynchronize` / `cudaDeviceSynchronize`.
    Context,
    /// Unknown to CUPTI or to this decoder.
    Unknown(u32),
}

impl SyncKind {
    fn from_raw(v: u32) -> SyncKind {
        use sys::CUpti_ActivitySynchronizationType as K;
        match v {
            x if x == K::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE as u32 => {
                SyncKind::Event
            }
            x if x == K::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT as u32 => {
                SyncKind::StreamWaitEvent
            }
            x if x == K::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE as u32 => {
                SyncKind::Stream
            }
            x if x == K::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE as u32 => {
                SyncKind::Context
            }
            other => SyncKind::Unknown(other),
        }
    }
}

/// A memory copy (`CUPTI_ACTIVITY_KIND_MEMCPY`, `CUpti_ActivityMemcpy6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcpyRecord {
    /// Direction.
    pub copy_kind: CopyKind,
    /// Memory kind of the source.
    pub src_kind: MemoryKind,
    /// Memory kind of the destination.
    pub dst_kind: MemoryKind,
    /// Bytes copied.
    pub bytes: u64,
    /// GPU start (CUPTI clock, ns).
    pub start: u64,
    /// GPU end (CUPTI clock, ns).
    pub end: u64,
    /// Device id.
    pub device: u32,
    /// Context id.
    pub context: u32,
    /// Stream id.
    pub stream: u32,
    /// Correlation id of the driver API call that issued it.
    pub correlation: u32,
    /// Correlation id of the runtime API call that issued it (0 when none).
    pub runtime_correlation: u32,
}

/// A peer-to-peer copy between two devices (`CUPTI_ACTIVITY_KIND_MEMCPY2`,
/// `CUpti_ActivityMemcpyPtoP4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCopyRecord {
    /// The copy itself (`device`/`context` are those the copy ran on; the record has no runtime
    /// correlation id, so `runtime_correlation` is 0).
    pub copy: MemcpyRecord,
    /// Device copied from.
    pub src_device: u32,
    /// Context copied from.
    pub src_context: u32,
    /// Device copied to.
    pub dst_device: u32,
    /// Context copied to.
    pub dst_context: u32,
}

/// A kernel execution (`CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`, `CUpti_ActivityKernel10`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRecord {
    /// Kernel (function) name as CUPTI reports it (mangled for C++ kernels).
    pub name: Option<String>,
    /// GPU start (CUPTI clock, ns).
    pub start: u64,
    /// GPU end (CUPTI clock, ns).
    pub end: u64,
    /// Device id.
    pub device: u32,
    /// Context id.
    pub context: u32,
    /// Stream id.
    pub stream: u32,
    /// Grid dimensions.
    pub grid: [i32; 3],
    /// Block dimensions.
    pub block: [i32; 3],
    /// Static shared memory per block, bytes.
    pub static_shared_memory: i32,
    /// Dynamic shared memory per block, bytes.
    pub dynamic_shared_memory: i32,
    /// Correlation id of the API call that launched it.
    pub correlation: u32,
}

/// A memset (`CUPTI_ACTIVITY_KIND_MEMSET`, `CUpti_ActivityMemset4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemsetRecord {
    /// Bytes set.
    pub bytes: u64,
    /// Value set.
    pub value: u32,
    /// GPU start (CUPTI clock, ns).
    pub start: u64,
    /// GPU end (CUPTI clock, ns).
    pub end: u64,
    /// Device id.
    pub device: u32,
    /// Context id.
    pub context: u32,
    /// Stream id.
    pub stream: u32,
    /// Correlation id of the API call that issued it.
    pub correlation: u32,
    /// Kind of the memory set.
    pub memory_kind: MemoryKind,
}

/// A host synchronization (`CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`, `CUpti_ActivitySynchronization2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRecord {
    /// What was waited for.
    pub sync_kind: SyncKind,
    /// Start of the blocking call (CUPTI clock, ns).
    pub start: u64,
    /// End of the blocking call (CUPTI clock, ns).
    pub end: u64,
    /// Correlation id of the API call.
    pub correlation: u32,
    /// Context id.
    pub context: u32,
    /// Stream id (for stream synchronization; `u32::MAX` when it does not apply).
    pub stream: u32,
}

/// An allocation or release (`CUPTI_ACTIVITY_KIND_MEMORY2`, `CUpti_ActivityMemory4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRecord {
    /// True for an allocation, false for a release.
    pub allocation: bool,
    /// Kind of memory.
    pub memory_kind: MemoryKind,
    /// Address.
    pub address: u64,
    /// Bytes.
    pub bytes: u64,
    /// When (CUPTI clock, ns).
    pub timestamp: u64,
    /// Device id.
    pub device: u32,
    /// Context id.
    pub context: u32,
    /// Stream id (stream-ordered allocators).
    pub stream: u32,
    /// Correlation id of the API call.
    pub correlation: u32,
}

/// A driver or runtime API call (`CUPTI_ACTIVITY_KIND_DRIVER` / `RUNTIME`, `CUpti_ActivityAPI`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRecord {
    /// Driver or runtime.
    pub domain: ApiDomain,
    /// Callback id of the function (`CUpti_driver_api_trace_cbid` / `CUpti_runtime_api_trace_cbid`).
    pub cbid: u32,
    /// Host start (CUPTI clock, ns).
    pub start: u64,
    /// Host end (CUPTI clock, ns).
    pub end: u64,
    /// Process id.
    pub process: u32,
    /// OS thread id.
    pub thread: u32,
    /// Correlation id.
    pub correlation: u32,
    /// Return value of the call.
    pub return_value: u32,
}

/// One decoded activity record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// A memory copy.
    Memcpy(MemcpyRecord),
    /// A peer-to-peer copy.
    PeerCopy(PeerCopyRecord),
    /// A kernel.
    Kernel(KernelRecord),
    /// A memset.
    Memset(MemsetRecord),
    /// A synchronization.
    Sync(SyncRecord),
    /// An allocation or release.
    Memory(MemoryRecord),
    /// A driver or runtime API call.
    Api(ApiRecord),
    /// A kind this decoder does not read (skipped, counted by the caller).
    Other {
        /// `CUpti_ActivityKind` value.
        kind: u32,
    },
}

/// `CUpti_ActivityKind` values of the kinds the decoder reads.
pub mod kind {
    use cudarc::cupti::sys::CUpti_ActivityKind as K;
    /// `CUPTI_ACTIVITY_KIND_MEMCPY`.
    pub const MEMCPY: u32 = K::CUPTI_ACTIVITY_KIND_MEMCPY as u32;
    /// `CUPTI_ACTIVITY_KIND_MEMCPY2` (peer-to-peer copies).
    pub const MEMCPY2: u32 = K::CUPTI_ACTIVITY_KIND_MEMCPY2 as u32;
    /// `CUPTI_ACTIVITY_KIND_MEMSET`.
    pub const MEMSET: u32 = K::CUPTI_ACTIVITY_KIND_MEMSET as u32;
    /// `CUPTI_ACTIVITY_KIND_KERNEL` (serialised kernels; same record as concurrent ones).
    pub const KERNEL: u32 = K::CUPTI_ACTIVITY_KIND_KERNEL as u32;
    /// `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`.
    pub const CONCURRENT_KERNEL: u32 = K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32;
    /// `CUPTI_ACTIVITY_KIND_DRIVER`.
    pub const DRIVER: u32 = K::CUPTI_ACTIVITY_KIND_DRIVER as u32;
    /// `CUPTI_ACTIVITY_KIND_RUNTIME`.
    pub const RUNTIME: u32 = K::CUPTI_ACTIVITY_KIND_RUNTIME as u32;
    /// `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`.
    pub const SYNCHRONIZATION: u32 = K::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION as u32;
    /// `CUPTI_ACTIVITY_KIND_MEMORY2`.
    pub const MEMORY2: u32 = K::CUPTI_ACTIVITY_KIND_MEMORY2 as u32;
}

/// Bytes a record of `kind` occupies in a CUPTI buffer (the size of its struct), or None for a
/// kind this decoder does not read. CUPTI itself walks buffers with `cuptiActivityGetNextRecord`;
/// this is for laying out and walking buffers without it (tests, offline tools).
pub fn record_size(kind: u32) -> Option<usize> {
    Some(match kind {
        kind::MEMCPY => size_of::<sys::CUpti_ActivityMemcpy6>(),
        kind::MEMCPY2 => size_of::<sys::CUpti_ActivityMemcpyPtoP4>(),
        kind::MEMSET => size_of::<sys::CUpti_ActivityMemset4>(),
        kind::KERNEL | kind::CONCURRENT_KERNEL => size_of::<sys::CUpti_ActivityKernel10>(),
        kind::DRIVER | kind::RUNTIME => size_of::<sys::CUpti_ActivityAPI>(),
        kind::SYNCHRONIZATION => size_of::<sys::CUpti_ActivitySynchronization2>(),
        kind::MEMORY2 => size_of::<sys::CUpti_ActivityMemory4>(),
        _ => return None,
    })
}

/// Reads plain integers at fixed offsets of one record, with bounds checked once per record.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl Fields<'_> {
    fn u8(&self, off: usize) -> u8 {
        self.bytes[off]
    }
    fn u16(&self, off: usize) -> u16 {
        u16::from_ne_bytes([self.bytes[off], self.bytes[off + 1]])
    }
    fn u32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.bytes[off..off + 4]);
        u32::from_ne_bytes(b)
    }
    fn i32(&self, off: usize) -> i32 {
        self.u32(off) as i32
    }
    fn u64(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.bytes[off..off + 8]);
        u64::from_ne_bytes(b)
    }
    fn ptr(&self, off: usize) -> usize {
        let mut b = [0u8; size_of::<usize>()];
        b.copy_from_slice(&self.bytes[off..off + size_of::<usize>()]);
        usize::from_ne_bytes(b)
    }
}

/// End (exclusive) of the last field each decoder reads: the minimum record length it accepts.
/// A shorter record (an older struct version) is refused instead of read past its end.
macro_rules! end_of {
    ($t:ty, $f:ident, $size:expr) => {
        offset_of!($t, $f) + $size
    };
}

fn need(kind: u32, bytes: &[u8], needed: usize) -> Result<Fields<'_>, DecodeError> {
    if bytes.len() < needed {
        return Err(DecodeError::Short {
            kind,
            len: bytes.len(),
            needed,
        });
    }
    Ok(Fields { bytes })
}

/// Decodes the record at the start of `bytes` (which may extend past it, up to the end of the
/// valid part of the buffer).
///
/// # Safety
/// The kernel-name pointer inside a kernel record is dereferenced: `bytes` must come from a
/// buffer CUPTI filled (and has not yet been given back), or from a test that stores a pointer
/// to a live NUL-terminated string there (or a null pointer).
pub unsafe fn decode(bytes: &[u8]) -> Result<Activity, DecodeError> {
    if bytes.len() < 4 {
        return Err(DecodeError::NoKind { len: bytes.len() });
    }
    let k = Fields { bytes }.u32(0);
    match k {
        kind::MEMCPY => decode_memcpy(k, bytes).map(Activity::Memcpy),
        kind::MEMCPY2 => decode_peer_copy(k, bytes).map(Activity::PeerCopy),
        kind::KERNEL | kind::CONCURRENT_KERNEL => {
            // SAFETY: forwarded from the caller's contract.
            unsafe { decode_kernel(k, bytes) }.map(Activity::Kernel)
        }
        kind::MEMSET => decode_memset(k, bytes).map(Activity::Memset),
        kind::SYNCHRONIZATION => decode_sync(k, bytes).map(Activity::Sync),
        kind::MEMORY2 => decode_memory(k, bytes).map(Activity::Memory),
        kind::DRIVER | kind::RUNTIME => decode_api(k, bytes).map(Activity::Api),
        other => Ok(Activity::Other { kind: other }),
    }
}

/// The fields a memcpy record and a peer copy record share (same names in both CUPTI structs),
/// read at `$t`'s offsets.
macro_rules! memcpy_record {
    ($t:ty, $f:expr, $runtime_correlation:expr) => {
        MemcpyRecord {
            copy_kind: CopyKind::from_raw($f.u8(offset_of!($t, copyKind))),
            src_kind: MemoryKind::from_raw(u32::from($f.u8(offset_of!($t, srcKind)))),
            dst_kind: MemoryKind::from_raw(u32::from($f.u8(offset_of!($t, dstKind)))),
            bytes: $f.u64(offset_of!($t, bytes)),
            start: $f.u64(offset_of!($t, start)),
            end: $f.u64(offset_of!($t, end)),
            device: $f.u32(offset_of!($t, deviceId)),
            context: $f.u32(offset_of!($t, contextId)),
            stream: $f.u32(offset_of!($t, streamId)),
            correlation: $f.u32(offset_of!($t, correlationId)),
            runtime_correlation: $runtime_correlation,
        }
    };
}

fn decode_memcpy(k: u32, bytes: &[u8]) -> Result<MemcpyRecord, DecodeError> {
    type T = sys::CUpti_ActivityMemcpy6;
    let f = need(k, bytes, end_of!(T, runtimeCorrelationId, 4))?;
    Ok(memcpy_record!(
        T,
        f,
        f.u32(offset_of!(T, runtimeCorrelationId))
    ))
}

fn decode_peer_copy(k: u32, bytes: &[u8]) -> Result<PeerCopyRecord, DecodeError> {
    type T = sys::CUpti_ActivityMemcpyPtoP4;
    let f = need(k, bytes, end_of!(T, correlationId, 4))?;
    Ok(PeerCopyRecord {
        // A peer copy record has no runtime correlation id.
        copy: memcpy_record!(T, f, 0),
        src_device: f.u32(offset_of!(T, srcDeviceId)),
        src_context: f.u32(offset_of!(T, srcContextId)),
        dst_device: f.u32(offset_of!(T, dstDeviceId)),
        dst_context: f.u32(offset_of!(T, dstContextId)),
    })
}

/// # Safety
/// See [`decode`].
unsafe fn decode_kernel(k: u32, bytes: &[u8]) -> Result<KernelRecord, DecodeError> {
    type T = sys::CUpti_ActivityKernel10;
    let f = need(k, bytes, end_of!(T, name, size_of::<usize>()))?;
    let name_ptr = f.ptr(offset_of!(T, name));
    let name = if name_ptr == 0 {
        None
    } else {
        // SAFETY: the caller guarantees the pointer is a live NUL-terminated string.
        let c = unsafe { CStr::from_ptr(name_ptr as *const c_char) };
        Some(c.to_string_lossy().into_owned())
    };
    Ok(KernelRecord {
        name,
        start: f.u64(offset_of!(T, start)),
        end: f.u64(offset_of!(T, end)),
        device: f.u32(offset_of!(T, deviceId)),
        context: f.u32(offset_of!(T, contextId)),
        stream: f.u32(offset_of!(T, streamId)),
        grid: [
            f.i32(offset_of!(T, gridX)),
            f.i32(offset_of!(T, gridY)),
            f.i32(offset_of!(T, gridZ)),
        ],
        block: [
            f.i32(offset_of!(T, blockX)),
            f.i32(offset_of!(T, blockY)),
            f.i32(offset_of!(T, blockZ)),
        ],
        static_shared_memory: f.i32(offset_of!(T, staticSharedMemory)),
        dynamic_shared_memory: f.i32(offset_of!(T, dynamicSharedMemory)),
        correlation: f.u32(offset_of!(T, correlationId)),
    })
}

fn decode_memset(k: u32, bytes: &[u8]) -> Result<MemsetRecord, DecodeError> {
    type T = sys::CUpti_ActivityMemset4;
    let f = need(k, bytes, end_of!(T, memoryKind, 2))?;
    Ok(MemsetRecord {
        bytes: f.u64(offset_of!(T, bytes)),
        value: f.u32(offset_of!(T, value)),
        start: f.u64(offset_of!(T, start)),
        end: f.u64(offset_of!(T, end)),
        device: f.u32(offset_of!(T, deviceId)),
        context: f.u32(offset_of!(T, contextId)),
        stream: f.u32(offset_of!(T, streamId)),
        correlation: f.u32(offset_of!(T, correlationId)),
        memory_kind: MemoryKind::from_raw(u32::from(f.u16(offset_of!(T, memoryKind)))),
    })
}

fn decode_sync(k: u32, bytes: &[u8]) -> Result<SyncRecord, DecodeError> {
    // The fields read are the common prefix of CUpti_ActivitySynchronization and ...2.
    type T = sys::CUpti_ActivitySynchronization2;
    let f = need(k, bytes, end_of!(T, streamId, 4))?;
    Ok(SyncRecord {
        sync_kind: SyncKind::from_raw(f.u32(offset_of!(T, type_))),
        start: f.u64(offset_of!(T, start)),
        end: f.u64(offset_of!(T, end)),
        correlation: f.u32(offset_of!(T, correlationId)),
        context: f.u32(offset_of!(T, contextId)),
        stream: f.u32(offset_of!(T, streamId)),
    })
}

fn decode_memory(k: u32, bytes: &[u8]) -> Result<MemoryRecord, DecodeError> {
    type T = sys::CUpti_ActivityMemory4;
    let f = need(k, bytes, end_of!(T, streamId, 4))?;
    let op = f.u32(offset_of!(T, memoryOperationType));
    let alloc =
        sys::CUpti_ActivityMemoryOperationType::CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
            as u32;
    Ok(MemoryRecord {
        allocation: op == alloc,
        memory_kind: MemoryKind::from_raw(f.u32(offset_of!(T, memoryKind))),
        address: f.u64(offset_of!(T, address)),
        bytes: f.u64(offset_of!(T, bytes)),
        timestamp: f.u64(offset_of!(T, timestamp)),
        device: f.u32(offset_of!(T, deviceId)),
        context: f.u32(offset_of!(T, contextId)),
        stream: f.u32(offset_of!(T, streamId)),
        correlation: f.u32(offset_of!(T, correlationId)),
    })
}

fn decode_api(k: u32, bytes: &[u8]) -> Result<ApiRecord, DecodeError> {
    type T = sys::CUpti_ActivityAPI;
    let f = need(k, bytes, end_of!(T, returnValue, 4))?;
    Ok(ApiRecord {
        domain: if k == kind::DRIVER {
            ApiDomain::Driver
        } else {
            ApiDomain::Runtime
        },
        cbid: f.u32(offset_of!(T, cbid)),
        start: f.u64(offset_of!(T, start)),
        end: f.u64(offset_of!(T, end)),
        process: f.u32(offset_of!(T, processId)),
        thread: f.u32(offset_of!(T, threadId)),
        correlation: f.u32(offset_of!(T, correlationId)),
        return_value: f.u32(offset_of!(T, returnValue)),
    })
}

/// Walks a buffer of back-to-back records laid out with [`record_size`] strides (8-byte
/// aligned), decoding each; stops at the first record it cannot size (its kind is returned as
/// [`Activity::Other`] and the walk ends, since its length is unknown).
///
/// # Safety
/// As for [`decode`].
pub unsafe fn walk(buffer: &[u8]) -> Vec<Result<Activity, DecodeError>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < buffer.len() {
        let rest = &buffer[at..];
        // SAFETY: forwarded from the caller's contract.
        let rec = unsafe { decode(rest) };
        let stop = !matches!(
            rec,
            Ok(Activity::Memcpy(_)
                | Activity::Kernel(_)
                | Activity::Memset(_)
                | Activity::Sync(_)
                | Activity::Memory(_)
                | Activity::Api(_))
        );
        let k = if rest.len() >= 4 {
            Fields { bytes: rest }.u32(0)
        } else {
            0
        };
        out.push(rec);
        let Some(size) = record_size(k) else { break };
        if stop {
            break;
        }
        at += size.next_multiple_of(8);
    }
    out
}
