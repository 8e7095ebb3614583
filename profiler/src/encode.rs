//! Record encoder: the one place that knows how records become bytes (see `docs/trace-format.md`).
//!
//! [`TraceWriter`] writes a trace synchronously from [`Record`]s (for tools and tests that build
//! traces); the background writer of the `tracing` layer uses the same encoder underneath.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

use crate::format::{self, put_delta, put_opt, put_str, put_varint, tag, value};
use crate::model::{
    Callsite, CallsiteKind, Field, FieldValue, GpuEvent, GpuSample, Header, HostMemory, Record,
    SourceLocation, ThreadIndex,
};

/// GPU operation with its strings already interned (what [`Enc::gpu`] needs).
pub(crate) struct GpuIds {
    pub kind: u8,
    pub id: u64,
    pub device: u32,
    pub stream: Option<u64>,
    pub bytes: u64,
    pub host_memory: Option<HostMemory>,
    pub host_start: u64,
    pub host_end: u64,
    pub gpu_start: Option<u64>,
    pub gpu_end: Option<u64>,
    pub gpu_end_at_host_return: bool,
    pub span: Option<u64>,
    pub location: Option<u32>,
    /// (name string id, grid, block, shared memory bytes)
    pub kernel: Option<(u32, [u32; 3], [u32; 3], u32)>,
}

/// Chunk payload encoder with the per-chunk delta state.
#[derive(Default)]
pub(crate) struct Enc {
    pub buf: Vec<u8>,
    ctx: Option<ThreadIndex>,
    last_ts: u64,
    last_span: u64,
    /// Reused for the bodies of extension records.
    scratch: Vec<u8>,
}

impl Enc {
    /// Starts a new chunk: clears the payload and the delta state.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.ctx = None;
        self.last_ts = 0;
        self.last_span = 0;
    }

    /// Switches the thread context (and resets the deltas) when `t` is not the current one.
    #[inline]
    pub fn thread_ctx(&mut self, t: ThreadIndex) {
        if self.ctx != Some(t) {
            self.buf.push(tag::THREAD_CONTEXT);
            put_varint(&mut self.buf, u64::from(t));
            self.ctx = Some(t);
            self.last_ts = 0;
            self.last_span = 0;
        }
    }

    #[inline]
    fn ts(&mut self, ts: u64) {
        put_delta(&mut self.buf, ts, self.last_ts);
        self.last_ts = ts;
    }

    #[inline]
    fn span_ref(&mut self, id: u64) {
        put_delta(&mut self.buf, id, self.last_span);
        self.last_span = id;
    }

    fn opt_span_ref(&mut self, id: Option<u64>) {
        match id {
            None => self.buf.push(0),
            Some(id) => {
                let z = format::zigzag(id.wrapping_sub(self.last_span) as i64);
                put_varint(&mut self.buf, z.wrapping_add(1));
                self.last_span = id;
            }
        }
    }

    pub fn header(&mut self, h: &Header) {
        let b = &mut self.buf;
        b.push(tag::HEADER);
        put_str(b, &h.writer_version);
        put_varint(b, u64::from(h.pid));
        put_str(b, &h.host);
        put_str(b, &h.program);
        put_varint(b, h.command_line.len() as u64);
        for a in &h.command_line {
            put_str(b, a);
        }
        put_varint(b, h.start_unix_ns);
        put_opt(b, h.rank.map(u64::from));
        put_opt(b, h.local_rank.map(u64::from));
        put_opt(b, h.world_size.map(u64::from));
        put_str(b, &h.step_span_name);
        put_str(b, &h.clock);
        put_varint(b, h.extra.len() as u64);
        for (k, v) in &h.extra {
            put_str(b, k);
            put_str(b, v);
        }
    }

    pub fn string_def(&mut self, id: u32, s: &str) {
        self.buf.push(tag::STRING);
        put_varint(&mut self.buf, u64::from(id));
        put_str(&mut self.buf, s);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn callsite_def(
        &mut self,
        id: u32,
        name: u32,
        target: u32,
        file: Option<u32>,
        line: Option<u32>,
        level: u8,
        kind: CallsiteKind,
        fields: &[u32],
    ) {
        let b = &mut self.buf;
        b.push(tag::CALLSITE);
        put_varint(b, u64::from(id));
        put_varint(b, u64::from(name));
        put_varint(b, u64::from(target));
        put_opt(b, file.map(u64::from));
        put_opt(b, line.map(u64::from));
        b.push(level | if kind == CallsiteKind::Event { 0x80 } else { 0 });
        put_varint(b, fields.len() as u64);
        for &f in fields {
            put_varint(b, u64::from(f));
        }
    }

    pub fn location_def(&mut self, id: u32, file: u32, line: u32, col: u32) {
        let b = &mut self.buf;
        b.push(tag::LOCATION);
        put_varint(b, u64::from(id));
        put_varint(b, u64::from(file));
        put_varint(b, u64::from(line));
        put_varint(b, u64::from(col));
    }

    pub fn thread(&mut self, index: ThreadIndex, os_tid: u64, name: Option<&str>) {
        let b = &mut self.buf;
        b.push(tag::THREAD);
        put_varint(b, u64::from(index));
        put_varint(b, os_tid);
        match name {
            None => b.push(0),
            Some(n) => {
                put_varint(b, n.len() as u64 + 1);
                b.extend_from_slice(n.as_bytes());
            }
        }
    }

    /// Span creation; the caller appends the field count and values right after.
    #[inline]
    pub fn span_new(
        &mut self,
        thread: ThreadIndex,
        ts: u64,
        id: u64,
        parent: Option<u64>,
        callsite: u32,
    ) {
        self.thread_ctx(thread);
        self.buf.push(tag::SPAN_NEW);
        self.ts(ts);
        self.span_ref(id);
        match parent {
            None => self.buf.push(0),
            Some(p) => put_varint(
                &mut self.buf,
                format::zigzag(id.wrapping_sub(p) as i64).wrapping_add(1),
            ),
        }
        put_varint(&mut self.buf, u64::from(callsite));
    }

    /// Span enter, exit or close (`tag` says which).
    #[inline]
    pub fn span_edge(&mut self, tag: u8, thread: ThreadIndex, ts: u64, id: u64) {
        self.thread_ctx(thread);
        self.buf.push(tag);
        self.ts(ts);
        self.span_ref(id);
    }

    /// Values recorded into a span; the caller appends the field count and values.
    pub fn span_record(&mut self, thread: ThreadIndex, ts: u64, id: u64, callsite: u32) {
        self.thread_ctx(thread);
        self.buf.push(tag::SPAN_RECORD);
        self.ts(ts);
        self.span_ref(id);
        put_varint(&mut self.buf, u64::from(callsite));
    }

    /// A `tracing` event; the caller appends the field count and values.
    pub fn event(&mut self, thread: ThreadIndex, ts: u64, span: Option<u64>, callsite: u32) {
        self.thread_ctx(thread);
        self.buf.push(tag::EVENT);
        self.ts(ts);
        self.opt_span_ref(span);
        put_varint(&mut self.buf, u64::from(callsite));
    }

    pub fn value_u64(&mut self, index: u32, v: u64) {
        put_varint(&mut self.buf, u64::from(index));
        self.buf.push(value::U64);
        put_varint(&mut self.buf, v);
    }

    pub fn value_i64(&mut self, index: u32, v: i64) {
        put_varint(&mut self.buf, u64::from(index));
        self.buf.push(value::I64);
        put_varint(&mut self.buf, format::zigzag(v));
    }

    pub fn value_f64(&mut self, index: u32, v: f64) {
        put_varint(&mut self.buf, u64::from(index));
        self.buf.push(value::F64);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn value_bool(&mut self, index: u32, v: bool) {
        put_varint(&mut self.buf, u64::from(index));
        self.buf.push(if v { value::TRUE } else { value::FALSE });
    }

    pub fn value_str(&mut self, index: u32, v: &str) {
        put_varint(&mut self.buf, u64::from(index));
        self.buf.push(value::STR);
        put_str(&mut self.buf, v);
    }

    pub fn values(&mut self, fields: &[Field]) {
        put_varint(&mut self.buf, fields.len() as u64);
        for f in fields {
            match &f.value {
                FieldValue::U64(v) => self.value_u64(f.index, *v),
                FieldValue::I64(v) => self.value_i64(f.index, *v),
                FieldValue::F64(v) => self.value_f64(f.index, *v),
                FieldValue::Bool(v) => self.value_bool(f.index, *v),
                FieldValue::Str(v) => self.value_str(f.index, v),
            }
        }
    }

    pub fn gpu(&mut self, thread: ThreadIndex, g: &GpuIds) {
        use format::gpu_flag as fl;
        self.thread_ctx(thread);
        let mut flags = 0u64;
        if g.gpu_start.is_some() {
            flags |= fl::GPU_START;
        }
        if g.gpu_end.is_some() {
            flags |= fl::GPU_END;
        }
        if g.stream.is_some() {
            flags |= fl::STREAM;
        }
        if g.span.is_some() {
            flags |= fl::SPAN;
        }
        if g.location.is_some() {
            flags |= fl::LOCATION;
        }
        if g.kernel.is_some() {
            flags |= fl::KERNEL;
        }
        if g.gpu_end_at_host_return {
            flags |= fl::GPU_END_AT_HOST_RETURN;
        }
        match g.host_memory {
            Some(HostMemory::Pinned) => flags |= fl::PINNED,
            Some(HostMemory::Pageable) => flags |= fl::PAGEABLE,
            None => {}
        }
        self.buf.push(tag::GPU);
        self.buf.push(g.kind);
        put_varint(&mut self.buf, flags);
        self.ts(g.host_start);
        put_varint(&mut self.buf, g.host_end.wrapping_sub(g.host_start));
        if let Some(s) = g.gpu_start {
            put_delta(&mut self.buf, s, g.host_start);
        }
        if let Some(e) = g.gpu_end {
            put_delta(&mut self.buf, e, g.gpu_start.unwrap_or(g.host_start));
        }
        put_varint(&mut self.buf, g.id);
        put_varint(&mut self.buf, u64::from(g.device));
        if let Some(s) = g.stream {
            put_varint(&mut self.buf, s);
        }
        put_varint(&mut self.buf, g.bytes);
        if let Some(s) = g.span {
            self.span_ref(s);
        }
        if let Some(l) = g.location {
            put_varint(&mut self.buf, u64::from(l));
        }
        if let Some((name, grid, block, shmem)) = g.kernel {
            put_varint(&mut self.buf, u64::from(name));
            for v in grid.iter().chain(block.iter()) {
                put_varint(&mut self.buf, u64::from(*v));
            }
            put_varint(&mut self.buf, u64::from(shmem));
        }
    }

    pub fn gpu_timing(&mut self, id: u64, start: u64, end: u64) {
        self.buf.push(tag::GPU_TIMING);
        put_varint(&mut self.buf, id);
        put_varint(&mut self.buf, start);
        put_varint(&mut self.buf, end.wrapping_sub(start));
    }

    pub fn device(&mut self, device: u32, name: &str, total: u64, cc: (u32, u32)) {
        self.buf.push(tag::DEVICE);
        put_varint(&mut self.buf, u64::from(device));
        put_str(&mut self.buf, name);
        put_varint(&mut self.buf, total);
        put_varint(&mut self.buf, u64::from(cc.0));
        put_varint(&mut self.buf, u64::from(cc.1));
    }

    pub fn device_memory(&mut self, ts: u64, device: u32, used: u64, total: u64) {
        self.buf.push(tag::DEVICE_MEMORY);
        put_varint(&mut self.buf, ts);
        put_varint(&mut self.buf, u64::from(device));
        put_varint(&mut self.buf, used);
        put_varint(&mut self.buf, total);
    }

    pub fn gpu_sample(&mut self, s: &GpuSample) {
        let b = &mut self.buf;
        b.push(tag::GPU_SAMPLE);
        put_varint(b, s.ts);
        put_varint(b, u64::from(s.device));
        put_opt(b, s.gpu_util_pct.map(u64::from));
        put_opt(b, s.mem_util_pct.map(u64::from));
        put_opt(b, s.memory_used);
        put_opt(b, s.memory_total);
        put_opt(b, s.sm_clock_mhz.map(u64::from));
        put_opt(b, s.power_mw.map(u64::from));
    }

    pub fn stack(&mut self, id: u64, ips: &[u64]) {
        let b = &mut self.buf;
        b.push(tag::STACK);
        put_varint(b, id);
        put_varint(b, ips.len() as u64);
        let mut prev = 0u64;
        for &ip in ips {
            put_delta(b, ip, prev);
            prev = ip;
        }
    }

    pub fn module(&mut self, path: &str, base: u64, size: u64) {
        self.buf.push(tag::MODULE);
        put_str(&mut self.buf, path);
        put_varint(&mut self.buf, base);
        put_varint(&mut self.buf, size);
    }

    pub fn op_stack(&mut self, op: u64, stack: u64) {
        self.buf.push(tag::OP_STACK);
        put_varint(&mut self.buf, op);
        put_varint(&mut self.buf, stack);
    }

    /// An extension record: tag, body length, body (written by `body`).
    fn extension(&mut self, tag: u8, body: impl FnOnce(&mut Vec<u8>)) {
        let mut b = std::mem::take(&mut self.scratch);
        b.clear();
        body(&mut b);
        self.buf.push(tag);
        put_varint(&mut self.buf, b.len() as u64);
        self.buf.extend_from_slice(&b);
        self.scratch = b;
    }

    /// PY_STACK: id, frame count, then (file string id, function string id, line) per frame.
    pub fn py_stack(&mut self, id: u64, frames: &[(u32, u32, u32)]) {
        self.extension(tag::PY_STACK, |b| {
            put_varint(b, id);
            put_varint(b, frames.len() as u64);
            for &(file, function, line) in frames {
                put_varint(b, u64::from(file));
                put_varint(b, u64::from(function));
                put_varint(b, u64::from(line));
            }
        });
    }

    /// OP_PY_STACK: operation id, Python stack id (0: none, the thread did not hold the GIL).
    pub fn op_py_stack(&mut self, op: u64, stack: Option<u64>) {
        self.extension(tag::OP_PY_STACK, |b| {
            put_varint(b, op);
            put_varint(b, stack.unwrap_or(0));
        });
    }

    pub fn dropped(&mut self, thread: Option<ThreadIndex>, ts: u64, count: u64) {
        self.buf.push(tag::DROPPED);
        put_opt(&mut self.buf, thread.map(u64::from));
        put_varint(&mut self.buf, ts);
        put_varint(&mut self.buf, count);
    }

    pub fn panic(
        &mut self,
        thread: Option<ThreadIndex>,
        ts: u64,
        message: &str,
        location: Option<(&str, u32, u32)>,
    ) {
        self.buf.push(tag::PANIC);
        put_opt(&mut self.buf, thread.map(u64::from));
        put_varint(&mut self.buf, ts);
        put_str(&mut self.buf, message);
        match location {
            None => self.buf.push(0),
            Some((file, line, col)) => {
                self.buf.push(1);
                put_str(&mut self.buf, file);
                put_varint(&mut self.buf, u64::from(line));
                put_varint(&mut self.buf, u64::from(col));
            }
        }
    }

    pub fn end(&mut self, ts: u64, unix_ns: u64, reason: u8, records: u64, dropped: u64) {
        self.buf.push(tag::END);
        put_varint(&mut self.buf, ts);
        put_varint(&mut self.buf, unix_ns);
        self.buf.push(reason);
        put_varint(&mut self.buf, records);
        put_varint(&mut self.buf, dropped);
    }
}

/// Writes one chunk (header + payload) to `out`; returns the bytes written.
pub(crate) fn write_chunk(out: &mut impl Write, payload: &[u8]) -> io::Result<u64> {
    let h = format::chunk_header(payload);
    out.write_all(&h)?;
    out.write_all(payload)?;
    Ok((h.len() + payload.len()) as u64)
}

/// Writes a trace file synchronously from [`Record`]s.
///
/// The `tracing` layer does not use this type (it has its own background writer); it is for
/// tools and tests that build traces, for example synthetic traces for report benchmarks.
/// Records are buffered into chunks of about 64 KiB; call [`TraceWriter::finish`] at the end.
///
/// ```
/// use perfkit_profiler::model::*;
/// use perfkit_profiler::{TraceReader, TraceWriter};
/// use std::sync::Arc;
///
/// let mut w = TraceWriter::new(Vec::new(), &Header::new("demo", 1)).unwrap();
/// let step = Arc::new(Callsite::new("step", "demo", CallsiteKind::Span, &[]));
/// w.write(&Record::Thread(ThreadInfo::new(0, 7, Some("main")))).unwrap();
/// w.write(&Record::SpanNew(SpanNew {
///     thread: 0, ts: 10, id: SpanId(1), parent: None, callsite: step, fields: vec![],
/// })).unwrap();
/// let bytes = w.finish().unwrap();
/// let mut r = TraceReader::from_reader(&bytes[..], "demo.pktrace").unwrap();
/// assert_eq!(r.header().program, "demo");
/// assert_eq!(r.by_ref().count(), 2);
/// ```
pub struct TraceWriter<W: Write> {
    out: W,
    enc: Enc,
    strings: HashMap<Arc<str>, u32>,
    callsites: HashMap<Callsite, u32>,
    locations: HashMap<SourceLocation, u32>,
    chunk_target: usize,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the preamble and the header to `out`.
    pub fn new(mut out: W, header: &Header) -> io::Result<TraceWriter<W>> {
        out.write_all(&format::preamble())?;
        let mut enc = Enc::default();
        enc.header(header);
        write_chunk(&mut out, &enc.buf)?;
        enc.reset();
        Ok(TraceWriter {
            out,
            enc,
            strings: HashMap::new(),
            callsites: HashMap::new(),
            locations: HashMap::new(),
            chunk_target: 64 << 10,
        })
    }

    /// Sets the payload size after which a chunk is written out (default 64 KiB).
    pub fn chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_target = bytes.clamp(1, (format::MAX_CHUNK_PAYLOAD / 2) as usize);
        self
    }

    fn string(&mut self, s: &Arc<str>) -> u32 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.strings.len() as u32 + 1;
        self.strings.insert(s.clone(), id);
        self.enc.string_def(id, s);
        id
    }

    fn callsite(&mut self, c: &Callsite) -> u32 {
        if let Some(&id) = self.callsites.get(c) {
            return id;
        }
        let name = self.string(&c.name);
        let target = self.string(&c.target);
        let file = c.file.as_ref().map(|f| self.string(f));
        let fields: Vec<u32> = c.fields.iter().map(|f| self.string(f)).collect();
        let id = self.callsites.len() as u32 + 1;
        self.callsites.insert(c.clone(), id);
        self.enc.callsite_def(
            id,
            name,
            target,
            file,
            c.line,
            c.level.code(),
            c.kind,
            &fields,
        );
        id
    }

    fn location(&mut self, l: &SourceLocation) -> u32 {
        if let Some(&id) = self.locations.get(l) {
            return id;
        }
        let file = self.string(&l.file);
        let id = self.locations.len() as u32 + 1;
        self.locations.insert(l.clone(), id);
        self.enc.location_def(id, file, l.line, l.column);
        id
    }

    fn gpu_ids(&mut self, g: &GpuEvent) -> GpuIds {
        let location = g.location.as_ref().map(|l| self.location(l));
        let kernel = g
            .kernel
            .as_ref()
            .map(|k| (self.string(&k.name), k.grid, k.block, k.shared_mem_bytes));
        GpuIds {
            kind: g.kind.code(),
            id: g.id,
            device: g.device,
            stream: g.stream,
            bytes: g.bytes,
            host_memory: g.host_memory,
            host_start: g.host_start,
            host_end: g.host_end,
            gpu_start: g.gpu_start,
            gpu_end: g.gpu_end,
            gpu_end_at_host_return: g.gpu_end_at_host_return,
            span: g.span.map(|s| s.0),
            location,
            kernel,
        }
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        match record {
            Record::Thread(t) => self.enc.thread(t.index, t.os_tid, t.name.as_deref()),
            Record::SpanNew(s) => {
                let cs = self.callsite(&s.callsite);
                self.enc
                    .span_new(s.thread, s.ts, s.id.0, s.parent.map(|p| p.0), cs);
                self.enc.values(&s.fields);
            }
            Record::SpanEnter(e) => self
                .enc
                .span_edge(tag::SPAN_ENTER, e.thread, e.ts, e.span.0),
            Record::SpanExit(e) => self.enc.span_edge(tag::SPAN_EXIT, e.thread, e.ts, e.span.0),
            Record::SpanClose(e) => self
                .enc
                .span_edge(tag::SPAN_CLOSE, e.thread, e.ts, e.span.0),
            Record::SpanRecord(r) => {
                let cs = self.callsite(&r.callsite);
                self.enc.span_record(r.thread, r.ts, r.span.0, cs);
                self.enc.values(&r.fields);
            }
            Record::Event(e) => {
                let cs = self.callsite(&e.callsite);
                self.enc.event(e.thread, e.ts, e.span.map(|s| s.0), cs);
                self.enc.values(&e.fields);
            }
            Record::Gpu(g) => {
                let ids = self.gpu_ids(g);
                self.enc.gpu(g.thread, &ids);
            }
            Record::GpuTiming(t) => self.enc.gpu_timing(t.id, t.gpu_start, t.gpu_end),
            Record::Device(d) => {
                self.enc
                    .device(d.device, &d.name, d.total_memory, d.compute_capability)
            }
            Record::DeviceMemory(m) => self.enc.device_memory(m.ts, m.device, m.used, m.total),
            Record::GpuSample(g) => self.enc.gpu_sample(g),
            Record::Stack(s) => self.enc.stack(s.id, &s.ips),
            Record::Module(m) => self.enc.module(&m.path, m.base, m.size),
            Record::OpStack(o) => self.enc.op_stack(o.op, o.stack),
            Record::PyStack(p) => {
                let frames: Vec<(u32, u32, u32)> = p
                    .frames
                    .iter()
                    .map(|f| (self.string(&f.file), self.string(&f.function), f.line))
                    .collect();
                self.enc.py_stack(p.id, &frames);
            }
            Record::OpPyStack(o) => self.enc.op_py_stack(o.op, o.stack),
            Record::Dropped(d) => self.enc.dropped(d.thread, d.ts, d.count),
            Record::Panic(p) => self.enc.panic(
                p.thread,
                p.ts,
                &p.message,
                p.location.as_ref().map(|l| (&*l.file, l.line, l.column)),
            ),
            Record::End(e) => {
                self.enc
                    .end(e.ts, e.end_unix_ns, e.reason.code(), e.records, e.dropped)
            }
        }
        if self.enc.buf.len() >= self.chunk_target {
            self.flush_chunk()?;
        }
        Ok(())
    }

    /// Writes the records buffered so far as one chunk.
    pub fn flush_chunk(&mut self) -> io::Result<()> {
        if !self.enc.buf.is_empty() {
            write_chunk(&mut self.out, &self.enc.buf)?;
            self.enc.reset();
        }
        Ok(())
    }

    /// Writes the last chunk, flushes and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush_chunk()?;
        self.out.flush()?;
        Ok(self.out)
    }
}
