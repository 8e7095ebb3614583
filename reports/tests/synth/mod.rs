//! Synthetic traces for tests and the benchmark, written through the profiler's own
//! `TraceWriter`. They are clearly synthetic: the GPU timings come from a tiny simulator
//! (launch cost, bandwidth, stream queues) below, not from a GPU.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use perfkit_profiler::TraceWriter;
use perfkit_profiler::model::{
    Callsite, CallsiteKind, DeviceInfo, Dropped, EndReason, Field, FieldValue, GpuEvent, GpuOpKind,
    GpuTiming, Header, HostMemory, KernelInfo, Record, SourceLocation, SpanEdge, SpanId, SpanNew,
    ThreadInfo, TraceEnd,
};

/// Stream of the compute kernels.
pub const COMPUTE: u64 = 7;
/// Stream of the asynchronous uploads.
pub const UPLOAD: u64 = 9;

/// A trace being written, with a simulated host clock and GPU stream queues.
pub struct Synth<W: Write> {
    w: TraceWriter<W>,
    /// Host clock, ns since the trace origin.
    pub t: u64,
    stream_free: HashMap<u64, u64>,
    next_span: u64,
    next_id: u64,
    callsites: HashMap<String, Arc<Callsite>>,
    stacks: HashMap<u32, Vec<SpanId>>,
    late: Vec<(u64, u64, u64)>,
    records: u64,
    dropped: u64,
    /// Device memory held by the simulated program.
    pub mem: u64,
    /// Readbacks have their GPU end at the host return (as the recorder marks a blocking
    /// copy whose end event completed after the call returned).
    pub readback_end_at_host_return: bool,
}

/// Where a call came from.
pub fn loc(file: &str, line: u32) -> Option<SourceLocation> {
    Some(SourceLocation {
        file: file.into(),
        line,
        column: 9,
    })
}

impl<W: Write> Synth<W> {
    /// Starts a trace for a process.
    pub fn new(out: W, program: &str, pid: u32, rank: Option<u32>, start_unix_ns: u64) -> Self {
        let mut h = Header::new(program, pid);
        h.host = "synthetic-host".to_owned();
        h.command_line = vec![program.to_owned(), "--synthetic".to_owned()];
        h.start_unix_ns = start_unix_ns;
        h.rank = rank;
        h.world_size = rank.map(|_| 4);
        h.mark_synthetic();
        let w = TraceWriter::new(out, &h).expect("write header");
        let mut s = Self {
            w,
            t: 1_000,
            stream_free: HashMap::new(),
            next_span: 1,
            next_id: 1,
            callsites: HashMap::new(),
            stacks: HashMap::new(),
            late: Vec::new(),
            records: 0,
            dropped: 0,
            mem: 0,
            readback_end_at_host_return: false,
        };
        s.rec(Record::Thread(ThreadInfo::new(0, 4242, Some("main"))));
        s.rec(Record::Device(DeviceInfo::new(
            0,
            "simulated device",
            16 << 30,
            (9, 0),
        )));
        s
    }

    fn rec(&mut self, r: Record) {
        self.records += 1;
        self.w.write(&r).expect("write record");
    }

    /// Announces another host thread.
    pub fn thread(&mut self, index: u32, name: &str) {
        self.rec(Record::Thread(ThreadInfo::new(
            index,
            5000 + u64::from(index),
            Some(name),
        )));
    }

    fn callsite(&mut self, name: &str, fields: &[&str]) -> Arc<Callsite> {
        self.callsites
            .entry(name.to_owned())
            .or_insert_with(|| {
                let mut callsite = Callsite::new(name, "synthetic", CallsiteKind::Span, fields);
                // Where the training loop's spans would be opened (`tracing` records each
                // callsite's file and line); other names have no location.
                let line = match name {
                    "step" => Some(40),
                    "data" => Some(44),
                    "forward" => Some(50),
                    "backward" => Some(56),
                    "optimizer" => Some(62),
                    _ => None,
                };
                if let Some(line) = line {
                    callsite.file = Some("src/train.rs".into());
                    callsite.line = Some(line);
                }
                Arc::new(callsite)
            })
            .clone()
    }

    /// Enters a new span on `thread` now.
    pub fn enter(&mut self, thread: u32, name: &str, step: Option<u64>) -> SpanId {
        let id = SpanId(self.next_span);
        self.next_span += 1;
        let fields: &[&str] = if step.is_some() { &["step"] } else { &[] };
        let callsite = self.callsite(name, fields);
        let parent = self.stacks.get(&thread).and_then(|s| s.last().copied());
        let fields = step
            .map(|s| {
                vec![Field {
                    index: 0,
                    name: "step".into(),
                    value: FieldValue::U64(s),
                }]
            })
            .unwrap_or_default();
        let ts = self.t;
        self.rec(Record::SpanNew(SpanNew {
            thread,
            ts,
            id,
            parent,
            callsite,
            fields,
        }));
        self.rec(Record::SpanEnter(SpanEdge {
            thread,
            ts,
            span: id,
        }));
        self.stacks.entry(thread).or_default().push(id);
        id
    }

    /// Exits and closes the innermost span of `thread` now.
    pub fn exit(&mut self, thread: u32) {
        let Some(id) = self.stacks.get_mut(&thread).and_then(Vec::pop) else {
            return;
        };
        let ts = self.t;
        self.rec(Record::SpanExit(SpanEdge {
            thread,
            ts,
            span: id,
        }));
        self.rec(Record::SpanClose(SpanEdge {
            thread,
            ts,
            span: id,
        }));
    }

    /// Exits the innermost span of `thread` now without closing it (it may be entered again,
    /// as candle's traced `Linear` does with its one span).
    pub fn exit_only(&mut self, thread: u32) -> Option<SpanId> {
        let id = self.stacks.get_mut(&thread).and_then(Vec::pop)?;
        let ts = self.t;
        self.rec(Record::SpanExit(SpanEdge {
            thread,
            ts,
            span: id,
        }));
        Some(id)
    }

    /// Enters an existing span `id` again on `thread` now.
    pub fn reenter(&mut self, thread: u32, id: SpanId) {
        let ts = self.t;
        self.rec(Record::SpanEnter(SpanEdge {
            thread,
            ts,
            span: id,
        }));
        self.stacks.entry(thread).or_default().push(id);
    }

    /// Closes span `id` (its last handle dropped) now.
    pub fn close(&mut self, thread: u32, id: SpanId) {
        let ts = self.t;
        self.rec(Record::SpanClose(SpanEdge {
            thread,
            ts,
            span: id,
        }));
    }

    /// Host work of `ns` nanoseconds.
    pub fn work(&mut self, ns: u64) {
        self.t += ns;
    }

    fn current(&self, thread: u32) -> Option<SpanId> {
        self.stacks.get(&thread).and_then(|s| s.last().copied())
    }

    #[allow(clippy::too_many_arguments)]
    fn gpu(
        &mut self,
        thread: u32,
        kind: GpuOpKind,
        stream: Option<u64>,
        bytes: u64,
        host_memory: Option<HostMemory>,
        host: (u64, u64),
        gpu: Option<(u64, u64)>,
        late: bool,
        location: Option<SourceLocation>,
        kernel: Option<&str>,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let (gpu_start, gpu_end) = match gpu {
            Some((s, e)) if late => {
                self.late.push((id, s, e));
                (None, None)
            }
            Some((s, e)) => (Some(s), Some(e)),
            None => (None, None),
        };
        let ev = GpuEvent {
            thread,
            kind,
            id,
            device: 0,
            stream,
            bytes,
            host_memory,
            host_start: host.0,
            host_end: host.1,
            gpu_start,
            gpu_end,
            gpu_end_at_host_return: kind == GpuOpKind::MemcpyDtoH
                && self.readback_end_at_host_return
                && gpu_end.is_some(),
            span: self.current(thread),
            location,
            kernel: kernel.map(|k| KernelInfo {
                name: k.into(),
                grid: [128, 1, 1],
                block: [256, 1, 1],
                shared_mem_bytes: 0,
            }),
        };
        self.rec(Record::Gpu(ev));
    }

    /// A driver call with host time only (from `h0` to now), issued from `src/train.rs:line`.
    fn host_call(&mut self, thread: u32, kind: GpuOpKind, bytes: u64, h0: u64, line: u32) {
        self.gpu(
            thread,
            kind,
            None,
            bytes,
            None,
            (h0, self.t),
            None,
            false,
            loc("src/train.rs", line),
            None,
        );
    }

    fn queue(&mut self, stream: u64, ready: u64, dur: u64) -> (u64, u64) {
        let free = self.stream_free.entry(stream).or_insert(0);
        let start = (*free).max(ready);
        *free = start + dur;
        (start, start + dur)
    }

    /// Launches a kernel of `gpu_ns` on `stream` (launch costs 5 us of host time). With `late`,
    /// its timing is written later (at the next synchronization), as the recorder does.
    pub fn kernel(&mut self, thread: u32, name: &str, stream: u64, gpu_ns: u64, late: bool) {
        let h0 = self.t;
        // A full launch queue blocks the launching call (at most 1.5 ms of queued work).
        let ahead = self.stream_free.get(&stream).copied().unwrap_or(0);
        self.t = self.t.max(ahead.saturating_sub(1_500_000));
        self.t += 5_000;
        let g = self.queue(stream, self.t, gpu_ns);
        self.gpu(
            thread,
            GpuOpKind::Kernel,
            Some(stream),
            0,
            None,
            (h0, self.t),
            Some(g),
            late,
            loc("src/model.rs", 40),
            Some(name),
        );
    }

    /// A host-to-device copy: pinned ones are asynchronous at 24 GB/s on `stream`, pageable
    /// ones block the host and run at 6 GB/s.
    pub fn upload(&mut self, thread: u32, bytes: u64, pinned: bool, stream: u64, line: u32) {
        let h0 = self.t;
        let (memory, g) = if pinned {
            self.t += 4_000;
            (HostMemory::Pinned, self.queue(stream, self.t, bytes / 24))
        } else {
            self.t += 10_000; // staging
            let g = self.queue(stream, self.t, bytes / 6);
            self.t = g.1 + 2_000;
            (HostMemory::Pageable, g)
        };
        self.gpu(
            thread,
            GpuOpKind::MemcpyHtoD,
            Some(stream),
            bytes,
            Some(memory),
            (h0, self.t),
            Some(g),
            false,
            loc("src/data.rs", line),
            None,
        );
    }

    /// A blocking device-to-host read of `bytes` after the work queued on `stream`.
    pub fn readback(&mut self, thread: u32, bytes: u64, stream: u64, line: u32) {
        let h0 = self.t;
        let g = self.queue(stream, self.t + 3_000, 2_000 + bytes / 6);
        self.t = g.1 + 3_000;
        self.gpu(
            thread,
            GpuOpKind::MemcpyDtoH,
            Some(stream),
            bytes,
            Some(HostMemory::Pageable),
            (h0, self.t),
            Some(g),
            false,
            loc("src/train.rs", line),
            None,
        );
    }

    /// Synchronizes the device: the host blocks until every stream is idle; late timings
    /// are written afterwards.
    pub fn sync(&mut self, thread: u32, line: u32) {
        let h0 = self.t;
        let busy = self.stream_free.values().copied().max().unwrap_or(0);
        self.t = self.t.max(busy) + 2_000;
        self.host_call(thread, GpuOpKind::Synchronize, 0, h0, line);
        self.flush_late();
    }

    /// Writes pending late timings.
    pub fn flush_late(&mut self) {
        for (id, s, e) in std::mem::take(&mut self.late) {
            self.rec(Record::GpuTiming(GpuTiming {
                id,
                gpu_start: s,
                gpu_end: e,
            }));
        }
    }

    /// A device allocation.
    pub fn alloc(&mut self, thread: u32, bytes: u64, line: u32) {
        let h0 = self.t;
        self.t += 20_000;
        self.mem += bytes;
        self.host_call(thread, GpuOpKind::Alloc, bytes, h0, line);
    }

    /// A device free.
    pub fn free(&mut self, thread: u32, bytes: u64, line: u32) {
        let h0 = self.t;
        self.t += 3_000;
        self.mem = self.mem.saturating_sub(bytes);
        self.host_call(thread, GpuOpKind::Free, bytes, h0, line);
    }

    /// Records `count` dropped events.
    pub fn dropped(&mut self, count: u64) {
        self.dropped += count;
        let ts = self.t;
        self.rec(Record::Dropped(Dropped {
            thread: Some(0),
            ts,
            count,
        }));
    }

    /// Ends the trace (with its end record unless `cut`) and returns the output.
    pub fn finish(mut self, cut: bool) -> W {
        self.flush_late();
        if !cut {
            let ts = self.t;
            let records = self.records;
            let dropped = self.dropped;
            self.rec(Record::End(TraceEnd {
                ts,
                end_unix_ns: 0,
                reason: EndReason::GuardDropped,
                records,
                dropped,
            }));
        }
        self.w.finish().expect("finish trace")
    }

    /// Writes any record as it is (hand-made, possibly malformed, input).
    pub fn raw(&mut self, r: Record) {
        self.rec(r);
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }
}

/// How a synthetic training run behaves.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Steps.
    pub steps: u64,
    /// Batch bytes uploaded per step.
    pub batch_bytes: u64,
    /// Pinned (asynchronous) uploads, else pageable.
    pub pinned: bool,
    /// Read the loss back to the host every step (a blocking 4-byte D2H copy).
    pub readback_every_step: bool,
    /// Synchronize the device every step.
    pub sync_every_step: bool,
    /// Allocate a scratch buffer every step.
    pub alloc_every_step: bool,
    /// Extra host time in data loading per step (ns).
    pub data_ns: u64,
    /// Kernel names: forward, backward, optimizer.
    pub kernels: [&'static str; 3],
    /// Span names: data, forward, backward, optimizer.
    pub spans: [&'static str; 4],
    /// Deterministic jitter seed.
    pub seed: u64,
    /// Extra forward kernels per step (to make large traces).
    pub extra_kernels: u32,
}

impl Workload {
    /// The tuned run: pinned uploads, no per-step readback or sync.
    pub fn tuned() -> Self {
        Self {
            steps: 20,
            batch_bytes: 8 << 20,
            pinned: true,
            readback_every_step: false,
            sync_every_step: false,
            alloc_every_step: false,
            data_ns: 150_000,
            kernels: ["gemm_fwd", "gemm_bwd", "adam_update"],
            spans: ["data", "forward", "backward", "optimizer"],
            seed: 1,
            extra_kernels: 0,
        }
    }

    /// The same run with the anti-patterns on: pageable uploads, a loss readback, a sync
    /// and an allocation every step.
    pub fn anti_patterns() -> Self {
        Self {
            pinned: false,
            readback_every_step: true,
            sync_every_step: true,
            alloc_every_step: true,
            ..Self::tuned()
        }
    }
}

/// Writes a whole synthetic training run.
pub fn write_run<W: Write>(s: &mut Synth<W>, wl: &Workload) {
    let mut rng = wl.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut jitter = |range: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % range.max(1)
    };
    s.alloc(0, 256 << 20, 12);
    for step in 0..wl.steps {
        s.enter(0, "step", Some(step));
        s.enter(0, wl.spans[0], None);
        s.work(wl.data_ns + jitter(20_000));
        s.upload(
            0,
            wl.batch_bytes,
            wl.pinned,
            if wl.pinned { UPLOAD } else { COMPUTE },
            31,
        );
        s.exit(0);
        s.enter(0, wl.spans[1], None);
        s.work(20_000);
        s.kernel(
            0,
            wl.kernels[0],
            COMPUTE,
            300_000 + jitter(10_000),
            step % 2 == 1,
        );
        for _ in 0..wl.extra_kernels {
            s.kernel(0, "elementwise", COMPUTE, 4_000, false);
        }
        s.exit(0);
        s.enter(0, wl.spans[2], None);
        s.work(15_000);
        s.kernel(0, wl.kernels[1], COMPUTE, 450_000 + jitter(10_000), false);
        if wl.alloc_every_step {
            s.alloc(0, 32 << 20, 57);
        }
        s.exit(0);
        s.enter(0, wl.spans[3], None);
        s.kernel(0, wl.kernels[2], COMPUTE, 80_000, false);
        if wl.readback_every_step {
            s.readback(0, 4, COMPUTE, 72);
        }
        if wl.sync_every_step {
            s.sync(0, 75);
        }
        s.exit(0);
        if wl.alloc_every_step {
            s.free(0, 32 << 20, 80);
        }
        s.exit(0);
    }
    s.sync(0, 90);
    s.free(0, 256 << 20, 91);
}

/// A complete synthetic trace as bytes.
pub fn trace_bytes(
    program: &str,
    pid: u32,
    rank: Option<u32>,
    start_unix_ns: u64,
    wl: &Workload,
) -> Vec<u8> {
    let mut s = Synth::new(Vec::new(), program, pid, rank, start_unix_ns);
    write_run(&mut s, wl);
    s.finish(false)
}
