//! Joining activity records to the API calls that issued them, and converting them to trace
//! operations.
//!
//! Every GPU activity record carries the correlation id of the driver (and, for copies, the
//! runtime) API call that issued it. The API callbacks record, per correlation id, the issuing
//! thread, the host start and end of the call on the trace clock and the id of its host call
//! stack ([`CallInfo`]); `DRIVER`/`RUNTIME` activity records fill in calls the callbacks did not
//! see. [`Joiner::convert`] turns one decoded record plus its call into an [`Op`], with GPU
//! times moved from the CUPTI clock to the trace clock by a [`Clock`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use perfkit_profiler::model::{GpuOpKind, HostMemory, Nanos, ThreadIndex};

use crate::decode::{Activity, ApiRecord, CopyKind, MemoryKind, PeerCopyRecord, SyncKind};

/// What the API callbacks know about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallInfo {
    /// Issuing thread (trace thread index), when the callback saw it.
    pub thread: Option<ThreadIndex>,
    /// Host start on the trace clock.
    pub host_start: Nanos,
    /// Host end on the trace clock (equal to the start until the call returns).
    pub host_end: Nanos,
    /// Id of the host call stack captured at the call, if any.
    pub stack: Option<u64>,
    /// Correlation id of the enclosing runtime call, for a driver call made inside one.
    pub outer: Option<u32>,
    /// Correlation id of the driver call made inside this runtime call, when it has its own.
    pub inner: Option<u32>,
    /// Several operations carry this call's correlation id (a CUDA graph launch: every node
    /// of the replay), so the call stays in the table after the first one.
    pub repeats: bool,
    /// The Python frames of the issuing thread.
    pub py: PyFrames,
}

/// The Python frames of the thread that issued a call (see `docs/injection.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PyFrames {
    /// Not read: no Python interpreter in the process, Python frames turned off, or a call
    /// known only from an API activity record.
    #[default]
    NotRead,
    /// The thread did not hold the GIL (it released it around the CUDA call, or is a native
    /// thread): no frames were read, on purpose.
    GilNotHeld,
    /// The id of the recorded Python stack.
    Stack(u64),
}

/// Maps CUPTI timestamps to the trace clock: `trace = cupti + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    offset: i128,
}

impl Clock {
    /// From one pair of readings taken at the same moment.
    pub fn from_pair(trace_now: Nanos, cupti_now: u64) -> Clock {
        Clock {
            offset: i128::from(trace_now) - i128::from(cupti_now),
        }
    }

    /// From several `(trace_before, cupti, trace_after)` readings: the one with the tightest
    /// bracket wins, its trace time taken at the middle of the bracket.
    pub fn calibrate(samples: &[(Nanos, u64, Nanos)]) -> Option<Clock> {
        let (before, cupti, after) = samples
            .iter()
            .filter(|(b, _, a)| a >= b)
            .min_by_key(|(b, _, a)| a - b)?;
        Some(Clock::from_pair(before + (after - before) / 2, *cupti))
    }

    /// A CUPTI timestamp on the trace clock; None for 0 (CUPTI's "unknown") or a time before
    /// the trace origin.
    pub fn to_trace(&self, cupti: u64) -> Option<Nanos> {
        if cupti == 0 {
            return None;
        }
        u64::try_from(i128::from(cupti) + self.offset).ok()
    }
}

/// Kernel details of an [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelOut {
    /// Kernel name (empty when CUPTI gave none).
    pub name: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_mem_bytes: u32,
}

/// One GPU operation ready to be written to the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What it is.
    pub kind: GpuOpKind,
    /// Issuing thread, when known.
    pub thread: Option<ThreadIndex>,
    /// Device ordinal.
    pub device: u32,
    /// CUPTI stream id.
    pub stream: Option<u64>,
    /// Bytes moved, set or allocated.
    pub bytes: u64,
    /// Pinned or pageable host side of a copy.
    pub host_memory: Option<HostMemory>,
    /// Host start of the issuing call (trace clock).
    pub host_start: Nanos,
    /// Host end of the issuing call (trace clock).
    pub host_end: Nanos,
    /// GPU start (trace clock).
    pub gpu_start: Option<Nanos>,
    /// GPU end (trace clock).
    pub gpu_end: Option<Nanos>,
    /// Kernel details.
    pub kernel: Option<KernelOut>,
    /// Host call stack id.
    pub stack: Option<u64>,
    /// Python frames of the issuing thread.
    pub py: PyFrames,
    /// Whether the issuing call was found (false: host times are the GPU start).
    pub joined: bool,
}

/// Why a record produced no operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// An API record: it only feeds the call table.
    Api,
    /// A host-to-host copy: no GPU work.
    HostToHost,
    /// `cuStreamWaitEvent`: the GPU waits, the host does not.
    GpuSideWait,
    /// A pinned host allocation or release.
    HostMemory,
    /// A kind not read.
    Other,
}

/// How many calls the table keeps before forgetting the oldest (calls whose activity never
/// arrives, e.g. failed calls, would otherwise accumulate).
pub const CALL_WINDOW: usize = 1 << 20;

/// How many correlation ids already used by an operation are remembered, so that an API
/// record arriving after its activity record is dropped rather than kept for ever.
pub const CONSUMED_WINDOW: usize = 1 << 16;

/// Correlation id -> call, bounded.
#[derive(Debug, Default)]
pub struct Joiner {
    calls: BTreeMap<u32, CallInfo>,
    /// Calls known only from API activity records (no callback), kept apart so a callback's
    /// information always wins. Bounded: the oldest go first.
    api_only: BTreeMap<u32, CallInfo>,
    /// Correlation ids an operation already carried (joined or not), newest last.
    consumed: HashSet<u32>,
    consumed_order: VecDeque<u32>,
    /// Device of each CUDA context, learnt from the records that carry both (synchronization
    /// records carry only the context).
    context_devices: HashMap<u32, u32>,
}

impl Joiner {
    /// An empty table.
    pub fn new() -> Joiner {
        Joiner::default()
    }

    /// Records a call seen by the callbacks at its entry. A driver call made inside a runtime
    /// call is linked to it: whichever of the two ids the activity record carries, the
    /// operation gets the runtime call's thread, host times and stack, and both entries go.
    pub fn call_enter(&mut self, correlation: u32, info: CallInfo) {
        if let Some(outer) = info.outer {
            if outer == correlation {
                // Both calls share one id: the runtime call's entry stands for both.
                return;
            }
            if let Some(o) = self.calls.get_mut(&outer) {
                o.inner = Some(correlation);
            }
        }
        self.calls.insert(correlation, info);
        if self.calls.len() > CALL_WINDOW {
            self.calls.pop_first();
        }
    }

    /// Marks the end of a call seen by the callbacks.
    pub fn call_exit(&mut self, correlation: u32, host_end: Nanos) {
        if let Some(c) = self.calls.get_mut(&correlation) {
            c.host_end = host_end.max(c.host_start);
        }
    }

    /// Number of correlation ids remembered as used.
    pub fn consumed_len(&self) -> usize {
        self.consumed.len()
    }

    /// Number of calls held.
    pub fn len(&self) -> usize {
        self.calls.len() + self.api_only.len()
    }

    /// Whether no call is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn api_record(&mut self, r: &ApiRecord, clock: &Clock) {
        // Its operation already went out (the activity record came first): nothing will
        // ever ask for it.
        if self.calls.contains_key(&r.correlation) || self.consumed.contains(&r.correlation) {
            return;
        }
        let (Some(s), Some(e)) = (clock.to_trace(r.start), clock.to_trace(r.end)) else {
            return;
        };
        self.api_only.insert(
            r.correlation,
            CallInfo {
                thread: None,
                host_start: s,
                host_end: e.max(s),
                stack: None,
                outer: None,
                inner: None,
                repeats: false,
                py: PyFrames::NotRead,
            },
        );
        if self.api_only.len() > CALL_WINDOW {
            self.api_only.pop_first();
        }
    }

    /// Remembers that an operation carried `correlation` (bounded to [`CONSUMED_WINDOW`]).
    fn consume(&mut self, correlation: u32) {
        if correlation == 0 || !self.consumed.insert(correlation) {
            return;
        }
        self.consumed_order.push_back(correlation);
        if self.consumed_order.len() > CONSUMED_WINDOW
            && let Some(old) = self.consumed_order.pop_front()
        {
            self.consumed.remove(&old);
        }
    }

    /// A call of the callback table, removed unless more operations will carry its id.
    fn use_call(&mut self, correlation: u32) -> Option<CallInfo> {
        let c = *self.calls.get(&correlation)?;
        if !c.repeats {
            self.calls.remove(&correlation);
        }
        Some(c)
    }

    /// The call for a correlation id, resolved to its outermost call (the runtime call a
    /// driver call was made in). Removes the entry and the one linked to it (the driver call
    /// inside a runtime call, or the runtime call around a driver call): a correlation id
    /// issues one operation, except a graph launch's.
    fn take_call(&mut self, correlation: u32) -> Option<CallInfo> {
        if correlation == 0 {
            return None;
        }
        let Some(c) = self
            .use_call(correlation)
            .or_else(|| self.api_only.remove(&correlation))
        else {
            // Unjoined: an API record arriving later is of no use.
            self.consume(correlation);
            return None;
        };
        if !c.repeats {
            self.consume(correlation);
        }
        if let Some(outer) = c.outer {
            if let Some(o) = self.use_call(outer) {
                if !o.repeats {
                    self.consume(outer);
                }
                return Some(CallInfo {
                    thread: o.thread.or(c.thread),
                    host_start: o.host_start,
                    host_end: o.host_end,
                    stack: o.stack.or(c.stack),
                    outer: None,
                    inner: None,
                    repeats: o.repeats || c.repeats,
                    py: if o.py == PyFrames::NotRead {
                        c.py
                    } else {
                        o.py
                    },
                });
            }
        } else if let Some(inner) = c.inner {
            self.use_call(inner);
            self.consume(inner);
        }
        Some(c)
    }

    /// Converts one record (an API record only updates the table).
    pub fn convert(&mut self, a: &Activity, clock: &Clock) -> Result<Op, Skip> {
        let (context, device) = match a {
            Activity::Memcpy(m) | Activity::PeerCopy(PeerCopyRecord { copy: m, .. }) => {
                (m.context, m.device)
            }
            Activity::Kernel(k) => (k.context, k.device),
            Activity::Memset(m) => (m.context, m.device),
            Activity::Memory(m) => (m.context, m.device),
            _ => (0, 0),
        };
        if context != 0 {
            self.context_devices.insert(context, device);
        }
        match a {
            Activity::Api(r) => {
                self.api_record(r, clock);
                Err(Skip::Api)
            }
            Activity::Memcpy(m) | Activity::PeerCopy(PeerCopyRecord { copy: m, .. }) => {
                let (kind, host_side) = match m.copy_kind {
                    CopyKind::HtoD | CopyKind::HtoA => (GpuOpKind::MemcpyHtoD, Some(m.src_kind)),
                    CopyKind::DtoH | CopyKind::AtoH => (GpuOpKind::MemcpyDtoH, Some(m.dst_kind)),
                    CopyKind::HtoH => return Err(Skip::HostToHost),
                    CopyKind::DtoD
                    | CopyKind::AtoA
                    | CopyKind::AtoD
                    | CopyKind::DtoA
                    | CopyKind::PtoP
                    | CopyKind::Unknown(_) => (GpuOpKind::MemcpyDtoD, None),
                };
                let host_memory = host_side.and_then(|k| match k {
                    MemoryKind::Pageable => Some(HostMemory::Pageable),
                    MemoryKind::Pinned => Some(HostMemory::Pinned),
                    _ => None,
                });
                let call = if m.runtime_correlation != 0 {
                    self.take_call(m.runtime_correlation)
                        .or_else(|| self.take_call(m.correlation))
                } else {
                    self.take_call(m.correlation)
                };
                Ok(self.op(
                    kind,
                    call,
                    m.device,
                    Some(m.stream),
                    m.bytes,
                    host_memory,
                    (m.start, m.end),
                    clock,
                ))
            }
            Activity::Kernel(k) => {
                let call = self.take_call(k.correlation);
                let dim = |d: [i32; 3]| d.map(|x| u32::try_from(x).unwrap_or(0));
                let mut op = self.op(
                    GpuOpKind::Kernel,
                    call,
                    k.device,
                    Some(k.stream),
                    0,
                    None,
                    (k.start, k.end),
                    clock,
                );
                op.kernel = Some(KernelOut {
                    name: k.name.clone().unwrap_or_default(),
                    grid: dim(k.grid),
                    block: dim(k.block),
                    shared_mem_bytes: u32::try_from(k.dynamic_shared_memory).unwrap_or(0),
                });
                Ok(op)
            }
            Activity::Memset(m) => {
                let call = self.take_call(m.correlation);
                Ok(self.op(
                    GpuOpKind::Memset,
                    call,
                    m.device,
                    Some(m.stream),
                    m.bytes,
                    None,
                    (m.start, m.end),
                    clock,
                ))
            }
            Activity::Sync(s) => {
                if s.sync_kind == SyncKind::StreamWaitEvent {
                    return Err(Skip::GpuSideWait);
                }
                let call = self.take_call(s.correlation);
                let (start, end) = match call {
                    Some(c) => (c.host_start, c.host_end),
                    None => {
                        let s0 = clock.to_trace(s.start).unwrap_or(0);
                        (s0, clock.to_trace(s.end).unwrap_or(s0).max(s0))
                    }
                };
                Ok(Op {
                    kind: GpuOpKind::Synchronize,
                    thread: call.and_then(|c| c.thread),
                    // The context's device when a record named it; else the first device.
                    device: self.context_devices.get(&s.context).copied().unwrap_or(0),
                    stream: (s.sync_kind == SyncKind::Stream).then_some(u64::from(s.stream)),
                    bytes: 0,
                    host_memory: None,
                    host_start: start,
                    host_end: end,
                    gpu_start: None,
                    gpu_end: None,
                    kernel: None,
                    stack: call.and_then(|c| c.stack),
                    joined: call.is_some(),
                    py: call.map_or(PyFrames::NotRead, |c| c.py),
                })
            }
            Activity::Memory(m)
                if matches!(m.memory_kind, MemoryKind::Pinned | MemoryKind::Pageable) =>
            {
                // cudaMallocHost and friends: host memory, not a device allocation.
                self.take_call(m.correlation);
                Err(Skip::HostMemory)
            }
            Activity::Memory(m) => {
                let call = self.take_call(m.correlation);
                let kind = if m.allocation {
                    GpuOpKind::Alloc
                } else {
                    GpuOpKind::Free
                };
                Ok(self.op(
                    kind,
                    call,
                    m.device,
                    None,
                    m.bytes,
                    None,
                    (m.timestamp, 0),
                    clock,
                ))
            }
            Activity::Other { .. } => Err(Skip::Other),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn op(
        &self,
        kind: GpuOpKind,
        call: Option<CallInfo>,
        device: u32,
        stream: Option<u32>,
        bytes: u64,
        host_memory: Option<HostMemory>,
        (gpu_start, gpu_end): (u64, u64),
        clock: &Clock,
    ) -> Op {
        let gs = clock.to_trace(gpu_start);
        let ge = clock
            .to_trace(gpu_end)
            .filter(|e| gs.is_none_or(|s| *e >= s));
        // Allocations carry one timestamp: it is the host time of the call.
        let is_point = matches!(kind, GpuOpKind::Alloc | GpuOpKind::Free);
        let (host_start, host_end) = match call {
            Some(c) => (c.host_start, c.host_end),
            None => (gs.unwrap_or(0), gs.unwrap_or(0)),
        };
        Op {
            kind,
            thread: call.and_then(|c| c.thread),
            device,
            stream: stream.map(u64::from),
            bytes,
            host_memory,
            host_start,
            host_end,
            gpu_start: if is_point { None } else { gs },
            gpu_end: if is_point { None } else { ge },
            kernel: None,
            stack: call.and_then(|c| c.stack),
            joined: call.is_some(),
            py: call.map_or(PyFrames::NotRead, |c| c.py),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::*;

    fn memcpy(kind: CopyKind, src: MemoryKind, dst: MemoryKind, corr: u32, rt: u32) -> Activity {
        Activity::Memcpy(MemcpyRecord {
            copy_kind: kind,
            src_kind: src,
            dst_kind: dst,
            bytes: 4096,
            start: 10_000,
            end: 12_000,
            device: 1,
            context: 1,
            stream: 7,
            correlation: corr,
            runtime_correlation: rt,
        })
    }

    fn call(thread: u32, start: u64, end: u64, stack: u64) -> CallInfo {
        CallInfo {
            thread: Some(thread),
            host_start: start,
            host_end: end,
            stack: Some(stack),
            outer: None,
            inner: None,
            repeats: false,
            py: PyFrames::NotRead,
        }
    }

    #[test]
    fn clock_maps_and_rejects_unknown() {
        let c = Clock::from_pair(1_000, 500_000);
        assert_eq!(c.to_trace(500_100), Some(1_100));
        assert_eq!(c.to_trace(0), None);
        assert_eq!(c.to_trace(1), None, "before the trace origin");
    }

    #[test]
    fn calibration_takes_the_tightest_bracket() {
        let c = Clock::calibrate(&[(100, 1_000, 300), (400, 1_290, 410), (500, 0, 400)]).unwrap();
        assert_eq!(c.to_trace(1_290), Some(405));
        assert_eq!(Clock::calibrate(&[]), None);
    }

    #[test]
    fn pageable_upload_joined_to_its_runtime_call() {
        let mut j = Joiner::new();
        j.call_enter(41, call(3, 50, 50, 9));
        j.call_exit(41, 80);
        let clock = Clock::from_pair(0, 0);
        let op = j
            .convert(
                &memcpy(
                    CopyKind::HtoD,
                    MemoryKind::Pageable,
                    MemoryKind::Device,
                    42,
                    41,
                ),
                &clock,
            )
            .unwrap();
        assert_eq!(op.kind, GpuOpKind::MemcpyHtoD);
        assert_eq!(op.host_memory, Some(HostMemory::Pageable));
        assert_eq!((op.host_start, op.host_end), (50, 80));
        assert_eq!((op.gpu_start, op.gpu_end), (Some(10_000), Some(12_000)));
        assert_eq!(op.thread, Some(3));
        assert_eq!(op.stack, Some(9));
        assert_eq!(op.stream, Some(7));
        assert_eq!(op.device, 1);
        assert!(op.joined);
        assert!(j.is_empty(), "the call is consumed");
    }

    #[test]
    fn pinned_download_and_driver_call_inside_runtime_call() {
        let mut j = Joiner::new();
        j.call_enter(10, call(2, 100, 100, 1));
        j.call_enter(
            11,
            CallInfo {
                thread: Some(2),
                host_start: 110,
                host_end: 110,
                stack: None,
                outer: Some(10),
                inner: None,
                repeats: false,
                py: PyFrames::NotRead,
            },
        );
        j.call_exit(11, 150);
        j.call_exit(10, 160);
        let op = j
            .convert(
                &memcpy(
                    CopyKind::DtoH,
                    MemoryKind::Device,
                    MemoryKind::Pinned,
                    11,
                    0,
                ),
                &Clock::from_pair(0, 0),
            )
            .unwrap();
        assert_eq!(op.kind, GpuOpKind::MemcpyDtoH);
        assert_eq!(op.host_memory, Some(HostMemory::Pinned));
        assert_eq!((op.host_start, op.host_end), (100, 160), "outermost call");
        assert_eq!(op.stack, Some(1));
        assert!(j.is_empty(), "both calls are consumed");
    }

    fn driver_inside(outer: u32, at: u64) -> CallInfo {
        CallInfo {
            thread: Some(2),
            host_start: at,
            host_end: at,
            stack: None,
            outer: Some(outer),
            inner: None,
            repeats: false,
            py: PyFrames::NotRead,
        }
    }

    fn kernel(correlation: u32) -> Activity {
        Activity::Kernel(KernelRecord {
            name: Some("k".into()),
            start: 5_000,
            end: 6_000,
            device: 0,
            context: 1,
            stream: 3,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            static_shared_memory: 0,
            dynamic_shared_memory: 0,
            correlation,
        })
    }

    #[test]
    fn a_record_with_the_runtime_id_consumes_the_driver_call_inside_it_too() {
        let mut j = Joiner::new();
        j.call_enter(20, call(2, 100, 100, 5));
        j.call_enter(21, driver_inside(20, 105));
        j.call_exit(21, 120);
        j.call_exit(20, 130);
        let op = j.convert(&kernel(20), &Clock::from_pair(0, 0)).unwrap();
        assert!(op.joined);
        assert_eq!((op.host_start, op.host_end, op.stack), (100, 130, Some(5)));
        assert!(j.is_empty(), "no driver entry is left behind");
    }

    #[test]
    fn a_driver_call_sharing_the_runtime_calls_id_keeps_the_runtime_entry() {
        let mut j = Joiner::new();
        j.call_enter(30, call(2, 100, 100, 6));
        j.call_enter(30, driver_inside(30, 105));
        j.call_exit(30, 120);
        j.call_exit(30, 140);
        let op = j.convert(&kernel(30), &Clock::from_pair(0, 0)).unwrap();
        assert_eq!(
            (op.host_start, op.host_end, op.stack),
            (100, 140, Some(6)),
            "the runtime call's start and stack survive"
        );
        assert!(j.is_empty());
    }

    #[test]
    fn every_node_of_a_graph_replay_joins_its_launch() {
        let mut j = Joiner::new();
        j.call_enter(
            50,
            CallInfo {
                repeats: true,
                py: PyFrames::NotRead,
                ..call(4, 300, 300, 8)
            },
        );
        j.call_exit(50, 310);
        let clock = Clock::from_pair(0, 0);
        for _ in 0..3 {
            let op = j.convert(&kernel(50), &clock).unwrap();
            assert!(op.joined);
            assert_eq!((op.thread, op.host_start, op.host_end), (Some(4), 300, 310));
        }
        assert_eq!(j.len(), 1, "the launch stays for the next nodes");
        // A later ordinary call is still consumed by its one operation.
        j.call_enter(51, call(4, 400, 400, 9));
        j.convert(&kernel(51), &clock).unwrap();
        assert_eq!(j.len(), 1);
    }

    #[test]
    fn unjoined_kernel_uses_gpu_start_and_an_earlier_api_record_fills_in() {
        let clock = Clock::from_pair(1_000, 2_000);
        let kernel_with = |correlation: u32| {
            Activity::Kernel(KernelRecord {
                name: Some("gemm".into()),
                start: 5_000,
                end: 6_000,
                device: 0,
                context: 1,
                stream: 3,
                grid: [4, 1, -1],
                block: [128, 1, 1],
                static_shared_memory: 0,
                dynamic_shared_memory: 256,
                correlation,
            })
        };
        let api_for = |correlation: u32| {
            Activity::Api(ApiRecord {
                domain: ApiDomain::Runtime,
                cbid: 211,
                start: 4_500,
                end: 4_900,
                process: 1,
                thread: 1,
                correlation,
                return_value: 0,
            })
        };
        let mut j = Joiner::new();
        let op = j.convert(&kernel_with(77), &clock).unwrap();
        assert!(!op.joined);
        assert_eq!((op.host_start, op.host_end), (4_000, 4_000));
        let kern = op.kernel.unwrap();
        assert_eq!(kern.grid, [4, 1, 0], "negative dimensions clamp to 0");
        assert_eq!(kern.shared_mem_bytes, 256);
        // Its API record, arriving after the kernel went out, is dropped, not kept.
        assert_eq!(j.convert(&api_for(77), &clock), Err(Skip::Api));
        assert!(j.is_empty(), "a late API record is not held");

        // An API record ahead of its kernel joins it, once.
        assert_eq!(j.convert(&api_for(78), &clock), Err(Skip::Api));
        assert_eq!(j.len(), 1);
        let op = j.convert(&kernel_with(78), &clock).unwrap();
        assert!(op.joined);
        assert_eq!((op.host_start, op.host_end), (3_500, 3_900));
        assert_eq!(op.thread, None);
        assert!(j.is_empty());
        // A second API record for the same id (driver and runtime) is dropped too.
        assert_eq!(j.convert(&api_for(78), &clock), Err(Skip::Api));
        assert!(j.is_empty());
    }

    #[test]
    fn late_api_records_never_accumulate() {
        let clock = Clock::from_pair(1_000, 2_000);
        let mut j = Joiner::new();
        for corr in 1..=10_000u32 {
            j.convert(&kernel(corr), &clock).unwrap();
            let api = Activity::Api(ApiRecord {
                domain: ApiDomain::Driver,
                cbid: 307,
                start: 4_500,
                end: 4_900,
                process: 1,
                thread: 1,
                correlation: corr,
                return_value: 0,
            });
            assert_eq!(j.convert(&api, &clock), Err(Skip::Api));
        }
        assert!(j.is_empty(), "{} calls held", j.len());
        assert_eq!(j.consumed_len(), 10_000);
        for corr in 10_001..=(10_001 + CONSUMED_WINDOW as u32) {
            j.consume(corr);
        }
        assert_eq!(
            j.consumed_len(),
            CONSUMED_WINDOW,
            "the memory of used ids is bounded"
        );
    }

    #[test]
    fn syncs_allocs_and_skips() {
        let clock = Clock::from_pair(0, 0);
        let mut j = Joiner::new();
        j.call_enter(5, call(0, 1_000, 1_000, 2));
        j.call_exit(5, 9_000);
        let s = Activity::Sync(SyncRecord {
            sync_kind: SyncKind::Stream,
            start: 1_010,
            end: 8_990,
            correlation: 5,
            context: 1,
            stream: 14,
        });
        let op = j.convert(&s, &clock).unwrap();
        assert_eq!(op.kind, GpuOpKind::Synchronize);
        assert_eq!(op.host_end - op.host_start, 8_000);
        assert_eq!(op.stream, Some(14));
        assert_eq!(op.device, 0, "context 1's device is not known yet");
        // A copy names context 1's device (the test copies run on device 1); later syncs in
        // that context are on it.
        j.convert(
            &memcpy(CopyKind::DtoD, MemoryKind::Device, MemoryKind::Device, 0, 0),
            &clock,
        )
        .unwrap();
        let again = Activity::Sync(SyncRecord {
            correlation: 0,
            ..match &s {
                Activity::Sync(r) => r.clone(),
                _ => unreachable!(),
            }
        });
        assert_eq!(j.convert(&again, &clock).unwrap().device, 1);

        let wait = Activity::Sync(SyncRecord {
            sync_kind: SyncKind::StreamWaitEvent,
            start: 1,
            end: 2,
            correlation: 6,
            context: 1,
            stream: 1,
        });
        assert_eq!(j.convert(&wait, &clock), Err(Skip::GpuSideWait));
        let h2h = memcpy(
            CopyKind::HtoH,
            MemoryKind::Pageable,
            MemoryKind::Pinned,
            7,
            0,
        );
        assert_eq!(j.convert(&h2h, &clock), Err(Skip::HostToHost));

        let free = Activity::Memory(MemoryRecord {
            allocation: false,
            memory_kind: MemoryKind::Device,
            address: 0xdead_0000,
            bytes: 1 << 20,
            timestamp: 3_000,
            device: 0,
            context: 1,
            stream: 0,
            correlation: 0,
        });
        let op = j.convert(&free, &clock).unwrap();
        assert_eq!(op.kind, GpuOpKind::Free);
        let pinned = Activity::Memory(MemoryRecord {
            allocation: true,
            memory_kind: MemoryKind::Pinned,
            ..match &free {
                Activity::Memory(m) => m.clone(),
                _ => unreachable!(),
            }
        });
        assert_eq!(j.convert(&pinned, &clock), Err(Skip::HostMemory));
        assert_eq!(op.bytes, 1 << 20);
        assert_eq!((op.host_start, op.gpu_start), (3_000, None));
    }

    #[test]
    fn call_window_is_bounded() {
        let mut j = Joiner::new();
        for i in 0..(CALL_WINDOW as u32 + 10) {
            j.call_enter(i + 1, call(0, 1, 1, 0));
        }
        assert_eq!(j.len(), CALL_WINDOW);
        assert!(j.take_call(1).is_none(), "oldest forgotten");
        assert!(j.take_call(CALL_WINDOW as u32 + 10).is_some());
    }
}
