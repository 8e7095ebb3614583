//! The background writer thread: drains the per-thread rings, encodes records into chunks and
//! writes them to the trace file at least every flush interval (50 ms by default), on request
//! (guard, panic hook) and at the end, where it adds the end record.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::Metadata;

use crate::encode::{Enc, GpuIds, write_chunk};
use crate::format::tag;
use crate::model::{CallsiteKind, EndReason, Header, HostMemory, Level};
use crate::session::{RAW_SPAN, Ring, Shared, Side, Slot, kind, vtype};

const CHUNK_TARGET: usize = 64 << 10;
const MIN_SLEEP: Duration = Duration::from_micros(500);
const MAX_SLEEP: Duration = Duration::from_millis(20);

struct WRing {
    ring: Arc<Ring>,
    dropped_seen: u64,
    /// Ring position up to which span-creation records have been entered in `spans`.
    scanned: usize,
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    file: File,
    path: PathBuf,
    enc: Enc,
    callsites: HashMap<usize, u32, PtrHash>,
    locations: HashMap<usize, u32, PtrHash>,
    heads: Vec<usize>,
    rings: Vec<WRing>,
    slots: Vec<Slot>,
    text: Vec<u8>,
    /// Tracing ids of live spans -> trace span ids, from span-creation records. Records that
    /// carry only a tracing id (a span used on another thread than the one that created it)
    /// are resolved here.
    spans: SpanMap,
    /// Spans closed lately, (tracing id, trace id), direct-mapped by tracing id: a record of
    /// another thread that names a span (it happened before the close) may be drained after
    /// the close has removed the span from `spans`.
    closed: Box<[(u64, u64)]>,
    /// Trace ids for spans whose creation record was lost (dropped): [next, end).
    fresh: (u64, u64),
    records: u64,
    global_dropped_seen: u64,
    last_write: Instant,
    failed: bool,
}

impl Writer {
    /// Creates the writer and writes the preamble and header.
    pub fn new(
        shared: Arc<Shared>,
        mut file: File,
        path: PathBuf,
        header: &Header,
    ) -> std::io::Result<Writer> {
        file.write_all(&crate::format::preamble())?;
        let mut enc = Enc::default();
        enc.header(header);
        let n = write_chunk(&mut file, &enc.buf)?;
        shared
            .bytes_written
            .store(n + crate::format::PREAMBLE_LEN as u64, Ordering::Relaxed);
        enc.reset();
        Ok(Writer {
            shared,
            file,
            path,
            enc,
            callsites: HashMap::default(),
            locations: HashMap::default(),
            heads: Vec::new(),
            rings: Vec::new(),
            slots: Vec::with_capacity(64),
            text: Vec::new(),
            spans: SpanMap::new(),
            closed: vec![(0, 0); SpanMap::SLOTS].into_boxed_slice(),
            fresh: (0, 0),
            records: 0,
            global_dropped_seen: 0,
            last_write: Instant::now(),
            failed: false,
        })
    }

    /// The writer thread's main loop.
    pub fn run(mut self) {
        let mut sleep = MIN_SLEEP;
        let flush_every = self.shared.config.flush_interval;
        loop {
            let (shutdown, flush_req) = match self.shared.ctl.lock() {
                Ok(c) => (c.shutdown, c.flush_requested),
                Err(_) => (Some(EndReason::GuardDropped), 0),
            };
            let got = self.pass();
            if let Some(reason) = shutdown {
                // Threads may still be finishing a record: one more pass, then the end.
                self.pass();
                self.finish(reason);
                return;
            }
            if self.enc.buf.len() >= CHUNK_TARGET
                || (!self.enc.buf.is_empty() && self.last_write.elapsed() >= flush_every)
            {
                self.write_chunk();
            }
            if flush_req > 0 {
                let done = self.shared.ctl.lock().map(|c| c.flush_done).unwrap_or(0);
                if done < flush_req {
                    self.pass();
                    self.write_chunk();
                    if let Ok(mut c) = self.shared.ctl.lock() {
                        c.flush_done = flush_req;
                    }
                    self.shared.ctl_cv.notify_all();
                }
            }
            sleep = if got > 0 {
                MIN_SLEEP
            } else {
                (sleep * 2).min(MAX_SLEEP)
            };
            std::thread::park_timeout(sleep);
        }
    }

    fn finish(&mut self, reason: EndReason) {
        let ts = self.shared.now_ns();
        let dropped = self.shared.dropped_total.load(Ordering::Relaxed);
        self.enc.end(
            ts,
            crate::sys::unix_now_ns(),
            reason.code(),
            self.records + 1,
            dropped,
        );
        self.records += 1;
        self.shared
            .records_written
            .store(self.records, Ordering::Relaxed);
        self.write_chunk();
        self.shared
            .writer_cpu_ns
            .store(crate::sys::thread_cpu_ns(), Ordering::Relaxed);
        if !self.failed {
            let _ = self.file.sync_data();
        }
        if let Ok(mut c) = self.shared.ctl.lock() {
            c.finished = true;
            c.flush_done = c.flush_requested;
        }
        self.shared.ctl_cv.notify_all();
    }

    fn write_chunk(&mut self) {
        self.last_write = Instant::now();
        if self.enc.buf.is_empty() {
            return;
        }
        if !self.failed {
            match write_chunk(&mut self.file, &self.enc.buf) {
                Ok(n) => {
                    self.shared.bytes_written.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    self.failed = true;
                    self.shared.active.store(false, Ordering::Release);
                    eprintln!(
                        "perfkit: cannot write trace file {}: {e}; recording stopped",
                        self.path.display()
                    );
                }
            }
        }
        self.enc.reset();
    }

    /// Drains everything available; returns the number of records encoded.
    fn pass(&mut self) -> u64 {
        self.take_new_rings();
        // Snapshot the heads first, then take the interned strings: every string id a record
        // below refers to was interned before that record was published.
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        heads.extend(
            self.rings
                .iter()
                .map(|r| r.ring.head.0.load(Ordering::Acquire)),
        );
        // Side records are taken before the interned strings, for the same reason: a side
        // record that names strings (a Python stack) was pushed after they were interned.
        let side: Vec<Side> = match self.shared.side.lock() {
            Ok(mut s) if !s.is_empty() => std::mem::take(&mut *s),
            _ => Vec::new(),
        };
        self.drain_interned();
        let before = self.records;
        for s in side {
            self.side(s);
        }
        for (i, &h) in heads.iter().enumerate() {
            self.drain_ring(i, h);
            if self.enc.buf.len() >= CHUNK_TARGET {
                self.write_chunk();
            }
        }
        self.heads = heads;
        // Dropped counts.
        let now = self.shared.now_ns();
        for i in 0..self.rings.len() {
            let d = self.rings[i].ring.dropped.load(Ordering::Relaxed);
            if d > self.rings[i].dropped_seen {
                let delta = d - self.rings[i].dropped_seen;
                self.rings[i].dropped_seen = d;
                let t = self.rings[i].ring.thread;
                self.enc.dropped(Some(t), now, delta);
                self.shared
                    .dropped_total
                    .fetch_add(delta, Ordering::Relaxed);
                self.records += 1;
            }
        }
        let g = self.shared.global_dropped.load(Ordering::Relaxed);
        if g > self.global_dropped_seen {
            let delta = g - self.global_dropped_seen;
            self.global_dropped_seen = g;
            self.enc.dropped(None, now, delta);
            self.shared
                .dropped_total
                .fetch_add(delta, Ordering::Relaxed);
            self.records += 1;
        }
        // Forget rings of exited threads once drained.
        self.rings.retain(|r| {
            !(r.ring.closed.load(Ordering::Acquire)
                && r.ring.tail.0.load(Ordering::Relaxed) == r.ring.head.0.load(Ordering::Acquire)
                && r.ring.dropped.load(Ordering::Relaxed) == r.dropped_seen)
        });
        self.shared
            .records_written
            .store(self.records, Ordering::Relaxed);
        self.shared
            .writer_cpu_ns
            .store(crate::sys::thread_cpu_ns(), Ordering::Relaxed);
        self.records - before
    }

    /// Takes over the rings of threads that started recording since the last look.
    fn take_new_rings(&mut self) {
        let new_rings = match self.shared.rings.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(_) => Vec::new(),
        };
        for r in new_rings {
            self.enc.thread(r.thread, r.os_tid, r.name.as_deref());
            self.records += 1;
            self.rings.push(WRing {
                ring: r,
                dropped_seen: 0,
                scanned: 0,
            });
        }
    }

    /// Enters the span-creation record in `slots` into the map of live spans.
    fn register_new(&mut self, s0: Slot, s1: Slot) {
        if s0[0] & 0xff == kind::NEW && s1[2] != 0 {
            self.spans.insert(s1[2], s0[1]);
        }
    }

    /// The trace id of the live span with tracing id `raw`.
    ///
    /// Its creation record happened before the record naming it, so if it is not known yet it
    /// is in some ring at most up to that ring's current head: scan the rings up to their
    /// heads, loaded now, for creation records. A span whose creation record was dropped gets
    /// a fresh trace id (kept until its close).
    fn resolve(&mut self, raw: u64) -> u64 {
        if let Some(sid) = self.spans.get(raw) {
            return sid;
        }
        self.take_new_rings();
        for j in 0..self.rings.len() {
            let ring = self.rings[j].ring.clone();
            let tail = ring.tail.0.load(Ordering::Relaxed);
            let mut pos = self.rings[j].scanned;
            if (tail.wrapping_sub(pos) as isize) > 0 {
                pos = tail;
            }
            let head = ring.head.0.load(Ordering::Acquire);
            while pos != head {
                // SAFETY: pos is in [tail, head) after the acquire load of head; this thread
                // is the ring's only consumer and has not released these slots.
                let s0 = unsafe { ring.read(pos) };
                let n = ((s0[0] >> 8) & 0xffff) as usize;
                if n == 0 || n > head.wrapping_sub(pos) {
                    break;
                }
                if s0[0] & 0xff == kind::NEW && n >= 2 {
                    // SAFETY: as above, pos + 1 < head.
                    let s1 = unsafe { ring.read(pos.wrapping_add(1)) };
                    self.register_new(s0, s1);
                }
                pos = pos.wrapping_add(n);
            }
            self.rings[j].scanned = pos;
        }
        if let Some(sid) = self.spans.get(raw) {
            return sid;
        }
        let recent = self.closed[SpanMap::index(raw)];
        if recent.0 == raw {
            return recent.1;
        }
        if self.fresh.0 == self.fresh.1 {
            let base = self.shared.span_block();
            self.fresh = (base, base + crate::session::SPAN_BLOCK);
        }
        let sid = self.fresh.0;
        self.fresh.0 += 1;
        self.spans.insert(raw, sid);
        sid
    }

    /// `sid` if known, else the writer's resolution of tracing id `raw`.
    #[inline]
    fn span_of(&mut self, sid: u64, raw: u64) -> u64 {
        if sid != 0 || raw == 0 {
            sid
        } else {
            self.resolve(raw)
        }
    }

    fn drain_interned(&mut self) {
        let pending = match self.shared.interner.lock() {
            Ok(mut i) if !i.pending.is_empty() => std::mem::take(&mut i.pending),
            _ => Vec::new(),
        };
        for (id, s) in pending {
            self.enc.string_def(id, &s);
        }
    }

    /// Interns a string for the writer's own use, emitting its definition in order.
    fn intern(&mut self, s: &str) -> u32 {
        let Ok(mut i) = self.shared.interner.lock() else {
            return 0;
        };
        for (id, p) in std::mem::take(&mut i.pending) {
            self.enc.string_def(id, &p);
        }
        let (id, new) = i.intern(s);
        if new {
            self.enc.string_def(id, s);
        }
        id
    }

    fn side(&mut self, s: Side) {
        match s {
            Side::Panic {
                thread,
                ts,
                message,
                location,
            } => self.enc.panic(
                thread,
                ts,
                &message,
                location.as_ref().map(|(f, l, c)| (f.as_str(), *l, *c)),
            ),
            Side::Device(d) => {
                self.enc
                    .device(d.device, &d.name, d.total_memory, d.compute_capability)
            }
            Side::GpuSample(g) => self.enc.gpu_sample(&g),
            Side::Stack(id, ips) => self.enc.stack(id, &ips),
            Side::Module(m) => self.enc.module(&m.path, m.base, m.size),
            Side::OpStack(op, stack) => self.enc.op_stack(op, stack),
            Side::PyStack(id, frames) => self.enc.py_stack(id, &frames),
            Side::OpPyStack(op, stack) => self.enc.op_py_stack(op, stack),
        }
        self.records += 1;
    }

    fn callsite(&mut self, ptr: u64) -> u32 {
        if let Some(&id) = self.callsites.get(&(ptr as usize)) {
            return id;
        }
        // SAFETY: the layer stores `&'static Metadata<'static>` pointers only.
        let meta: &'static Metadata<'static> =
            unsafe { &*(ptr as usize as *const Metadata<'static>) };
        let name = self.intern(meta.name());
        let target = self.intern(meta.target());
        let file = meta.file().map(|f| self.intern(f));
        let fields: Vec<u32> = meta
            .fields()
            .iter()
            .map(|f| self.intern(f.name()))
            .collect();
        let id = self.callsites.len() as u32 + 1;
        self.callsites.insert(ptr as usize, id);
        let kind = if meta.is_event() {
            CallsiteKind::Event
        } else {
            CallsiteKind::Span
        };
        self.enc.callsite_def(
            id,
            name,
            target,
            file,
            meta.line(),
            Level::from_tracing(meta.level()).code(),
            kind,
            &fields,
        );
        id
    }

    fn location(&mut self, ptr: u64) -> u32 {
        if let Some(&id) = self.locations.get(&(ptr as usize)) {
            return id;
        }
        // SAFETY: recorders store `&'static Location<'static>` pointers only.
        let loc: &'static std::panic::Location<'static> =
            unsafe { &*(ptr as usize as *const std::panic::Location<'static>) };
        let file = self.intern(loc.file());
        let id = self.locations.len() as u32 + 1;
        self.locations.insert(ptr as usize, id);
        self.enc.location_def(id, file, loc.line(), loc.column());
        id
    }

    fn drain_ring(&mut self, i: usize, head: usize) {
        let ring = self.rings[i].ring.clone();
        let thread = ring.thread;
        let mut tail = ring.tail.0.load(Ordering::Relaxed);
        while tail != head {
            // SAFETY: tail is in [tail, head) after the acquire load of head.
            let s0 = unsafe { ring.read(tail) };
            let n = ((s0[0] >> 8) & 0xffff) as usize;
            let avail = head.wrapping_sub(tail);
            if n == 0 || n > avail {
                // Cannot happen with a well-behaved producer; skip what is there.
                tail = head;
                break;
            }
            self.slots.clear();
            self.slots.push(s0);
            for k in 1..n {
                // SAFETY: as above, k < n <= head - tail.
                self.slots.push(unsafe { ring.read(tail.wrapping_add(k)) });
            }
            // Creation records not entered in the span map by an earlier scan.
            let scanned = self.rings[i].scanned;
            if (tail.wrapping_sub(scanned) as isize) >= 0 {
                if n >= 2 {
                    self.register_new(s0, self.slots[1]);
                }
                self.rings[i].scanned = tail.wrapping_add(n);
            }
            tail = tail.wrapping_add(n);
            self.encode(thread);
            self.records += 1;
        }
        ring.tail.0.store(tail, Ordering::Release);
        ring.wake.store(false, Ordering::Relaxed);
    }

    /// Encodes the record in `self.slots`.
    fn encode(&mut self, thread: u32) {
        let s0 = self.slots[0];
        let k = s0[0] & 0xff;
        match k {
            kind::ENTER | kind::EXIT | kind::CLOSE => {
                let t = match k {
                    kind::ENTER => tag::SPAN_ENTER,
                    kind::EXIT => tag::SPAN_EXIT,
                    _ => tag::SPAN_CLOSE,
                };
                let ts = self.shared.raw_to_ns(s0[2]);
                let sid = self.span_of(s0[1], s0[3]);
                if k == kind::CLOSE && s0[3] != 0 {
                    self.spans.remove(s0[3], sid);
                    self.closed[SpanMap::index(s0[3])] = (s0[3], sid);
                }
                self.enc.span_edge(t, thread, ts, sid);
            }
            kind::NEW => {
                let Some(&s1) = self.slots.get(1) else {
                    return;
                };
                let cs = self.callsite(s1[0]);
                let ts = self.shared.raw_to_ns(s0[3]);
                let parent = self.span_of(s0[2], s1[3]);
                let parent = (parent != 0).then_some(parent);
                self.enc.span_new(thread, ts, s0[1], parent, cs);
                self.values(2, s1[1]);
            }
            kind::RECORD | kind::EVENT => {
                let cs = self.callsite(s0[3]);
                let ts = self.shared.raw_to_ns(s0[2]);
                let sid = if s0[0] & RAW_SPAN != 0 {
                    self.span_of(0, s0[1])
                } else {
                    s0[1]
                };
                if k == kind::RECORD {
                    self.enc.span_record(thread, ts, sid, cs);
                } else {
                    self.enc.event(thread, ts, (sid != 0).then_some(sid), cs);
                }
                self.values(1, (s0[0] >> 24) & 0xffff);
            }
            kind::GPU => self.gpu(thread),
            kind::TIMING => self.enc.gpu_timing(s0[1], s0[2], s0[3]),
            kind::DEVMEM => self
                .enc
                .device_memory(s0[1], (s0[0] >> 32) as u32, s0[2], s0[3]),
            _ => {}
        }
    }

    fn values(&mut self, mut at: usize, count: u64) {
        // Count the values actually present first (a record always carries whole values).
        crate::format::put_varint(&mut self.enc.buf, count);
        for _ in 0..count {
            let Some(&v) = self.slots.get(at) else {
                return;
            };
            let vt = v[0] & 0xff;
            let idx = ((v[0] >> 8) & 0xff_ffff) as u32;
            at += 1;
            match vt {
                vtype::U64 => self.enc.value_u64(idx, v[1]),
                vtype::I64 => self.enc.value_i64(idx, v[1] as i64),
                vtype::F64 => self.enc.value_f64(idx, f64::from_bits(v[1])),
                vtype::BOOL => self.enc.value_bool(idx, v[1] != 0),
                _ => {
                    let len = (v[0] >> 32) as usize;
                    self.text.clear();
                    for w in &v[1..4] {
                        self.text.extend_from_slice(&w.to_le_bytes());
                    }
                    while self.text.len() < len {
                        let Some(&c) = self.slots.get(at) else {
                            break;
                        };
                        at += 1;
                        for w in &c {
                            self.text.extend_from_slice(&w.to_le_bytes());
                        }
                    }
                    self.text.truncate(len);
                    let s = String::from_utf8_lossy(&self.text).into_owned();
                    self.enc.value_str(idx, &s);
                }
            }
        }
    }

    fn gpu(&mut self, thread: u32) {
        if self.slots.len() < 4 {
            return;
        }
        let [s0, s1, s2, s3] = [self.slots[0], self.slots[1], self.slots[2], self.slots[3]];
        let flags = (s0[0] >> 40) & 0xff;
        let op_kind = ((s0[0] >> 24) & 0xff) as u8;
        let host_memory = match (s0[0] >> 32) & 0xff {
            1 => Some(HostMemory::Pageable),
            2 => Some(HostMemory::Pinned),
            _ => None,
        };
        let t = if s0[2] == u64::MAX {
            thread
        } else {
            s0[2] as u32
        };
        let location = if flags & GF_LOCATION != 0 {
            Some(self.location(s2[3]))
        } else {
            None
        };
        let kernel = (flags & GF_KERNEL != 0).then(|| {
            (
                s3[0] as u32,
                [s3[1] as u32, (s3[1] >> 32) as u32, s3[2] as u32],
                [(s3[2] >> 32) as u32, s3[3] as u32, (s3[3] >> 32) as u32],
                (s3[0] >> 32) as u32,
            )
        });
        let ids = GpuIds {
            kind: op_kind,
            id: s0[1],
            device: s0[3] as u32,
            stream: (flags & GF_STREAM != 0).then_some(s1[0]),
            bytes: s1[1],
            host_memory,
            host_start: s1[2],
            host_end: s1[3],
            gpu_start: (flags & GF_GPU_START != 0).then_some(s2[0]),
            gpu_end: (flags & GF_GPU_END != 0).then_some(s2[1]),
            gpu_end_at_host_return: flags & GF_GPU_END_AT_HOST_RETURN != 0,
            span: (flags & GF_SPAN != 0).then_some(s2[2]),
            location,
            kernel,
        };
        self.enc.gpu(t, &ids);
    }
}

/// Tracing id -> trace id of live spans: a direct-mapped table (one probe for the few spans
/// alive at a time in most programs) with a hash map for the entries that collide.
struct SpanMap {
    table: Box<[(u64, u64)]>,
    more: HashMap<u64, u64, PtrHash>,
}

impl SpanMap {
    const SLOTS: usize = 4096;

    fn new() -> SpanMap {
        SpanMap {
            table: vec![(0, 0); Self::SLOTS].into_boxed_slice(),
            more: HashMap::default(),
        }
    }

    #[inline]
    fn index(raw: u64) -> usize {
        (raw.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize & (Self::SLOTS - 1)
    }

    /// Maps `raw` to `sid`, replacing an earlier span with the same tracing id.
    fn insert(&mut self, raw: u64, sid: u64) {
        let e = &mut self.table[Self::index(raw)];
        if e.0 == 0 || e.0 == raw {
            *e = (raw, sid);
            if !self.more.is_empty() {
                self.more.remove(&raw);
            }
        } else {
            self.more.insert(raw, sid);
        }
    }

    #[inline]
    fn get(&self, raw: u64) -> Option<u64> {
        let e = self.table[Self::index(raw)];
        if e.0 == raw {
            Some(e.1)
        } else if self.more.is_empty() {
            None
        } else {
            self.more.get(&raw).copied()
        }
    }

    /// Forgets `raw` if it still names span `sid`.
    fn remove(&mut self, raw: u64, sid: u64) {
        let e = &mut self.table[Self::index(raw)];
        if *e == (raw, sid) {
            *e = (0, 0);
        } else if self.more.get(&raw) == Some(&sid) {
            self.more.remove(&raw);
        }
    }
}

pub(crate) const GF_GPU_START: u64 = 1;
pub(crate) const GF_GPU_END: u64 = 2;
pub(crate) const GF_STREAM: u64 = 4;
pub(crate) const GF_SPAN: u64 = 8;
pub(crate) const GF_LOCATION: u64 = 16;
pub(crate) const GF_KERNEL: u64 = 32;
pub(crate) const GF_GPU_END_AT_HOST_RETURN: u64 = 64;

/// Hasher for pointer keys (callsite metadata, source locations): one multiply.
#[derive(Default, Clone, Copy)]
pub(crate) struct PtrHash;

impl std::hash::BuildHasher for PtrHash {
    type Hasher = PtrHasher;
    fn build_hasher(&self) -> PtrHasher {
        PtrHasher(0)
    }
}

/// See [`PtrHash`].
pub(crate) struct PtrHasher(u64);

impl std::hash::Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(26);
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (v as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(26);
    }
}
