//! Streaming trace reader.
//!
//! [`TraceReader`] reads the header when it is opened, then hands out [`Record`]s one at a time
//! (it is an [`Iterator`]), holding at most one chunk (normally 64 KiB, at most 16 MiB) plus the
//! interned names in memory, so arbitrarily long traces are read in bounded memory.
//!
//! A trace cut short (the process was killed) simply ends after its last complete chunk;
//! [`TraceReader::status`] then says [`TraceStatus::Cut`] and where. A damaged trace yields one
//! [`ReadError::Corrupt`] naming the byte offset, then the iterator ends. The reader never panics
//! on bad input.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, Cursor, DecodeError, gpu_flag, tag, value};
use crate::model::*;

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Reading the file failed.
    #[error("{path}: cannot read trace: {source}")]
    Io {
        /// The trace file.
        path: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file does not start with the trace magic bytes.
    #[error("{path}: not a perfkit trace (bad magic bytes at offset 0)")]
    NotATrace {
        /// The file.
        path: String,
    },
    /// The file was written in a major format version this reader does not know.
    #[error(
        "{path}: trace format version {major}.{minor} is not supported (this perfkit reads version {}.x); use the perfkit version that recorded it",
        format::FORMAT_MAJOR
    )]
    UnsupportedVersion {
        /// The file.
        path: String,
        /// Its major version.
        major: u16,
        /// Its minor version.
        minor: u16,
    },
    /// The bytes at `offset` are not valid trace data.
    #[error("{path}: corrupt trace at byte offset {offset}: {what}")]
    Corrupt {
        /// The file.
        path: String,
        /// Byte offset of the problem from the start of the file.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The file ends before its header (or, in strict mode, inside a chunk or without an end record).
    #[error("{path}: trace cut short at byte offset {offset}: {what}")]
    Truncated {
        /// The file.
        path: String,
        /// Byte offset where the data stops.
        offset: u64,
        /// What is missing.
        what: String,
    },
}

impl ReadError {
    /// The byte offset the error refers to, when there is one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            ReadError::Corrupt { offset, .. } | ReadError::Truncated { offset, .. } => {
                Some(*offset)
            }
            ReadError::NotATrace { .. } => Some(0),
            _ => None,
        }
    }
}

/// How far a trace has been read, and how it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceStatus {
    /// Not all records have been read yet.
    Reading,
    /// The end record was read: the process finished the trace.
    Complete(TraceEnd),
    /// The trace ends without an end record (the process was killed or is still running).
    /// Everything up to `valid_up_to` was read; `discarded_bytes` of an incomplete last chunk
    /// after it were ignored.
    Cut {
        /// Offset just after the last complete chunk.
        valid_up_to: u64,
        /// Bytes of an incomplete chunk after it.
        discarded_bytes: u64,
    },
    /// Reading stopped at a corrupt chunk or record (the error was returned by the iterator).
    Corrupt {
        /// Offset of the problem.
        offset: u64,
    },
}

impl TraceStatus {
    /// Whether the trace was finished cleanly.
    pub fn is_complete(&self) -> bool {
        matches!(self, TraceStatus::Complete(_))
    }
}

/// Streaming reader of one trace file. See the [module docs](self).
pub struct TraceReader<R: Read> {
    src: R,
    path: String,
    header: Header,
    /// Current chunk payload and read position in it.
    chunk: Vec<u8>,
    pos: usize,
    /// File offset of `chunk[0]`.
    chunk_base: u64,
    /// File offset after the current chunk.
    next_offset: u64,
    strings: Vec<Arc<str>>,
    callsites: Vec<Arc<Callsite>>,
    locations: Vec<SourceLocation>,
    ctx: Option<ThreadIndex>,
    last_ts: u64,
    last_span: u64,
    status: TraceStatus,
    strict: bool,
    done: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens a trace file and reads its header.
    ///
    /// A path that is not a regular file (after following symbolic links) is refused before it
    /// is opened: reading a FIFO, a socket or a device would block, or never end.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io_err = |source| ReadError::Io {
            path: name.clone(),
            source,
        };
        require_regular_file(path).map_err(io_err)?;
        let f = File::open(path).map_err(io_err)?;
        TraceReader::from_reader(BufReader::with_capacity(128 << 10, f), &name)
    }
}

enum Fill {
    Full,
    Eof(usize),
}

fn fill(src: &mut impl Read, buf: &mut [u8]) -> io::Result<Fill> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => return Ok(Fill::Eof(n)),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Fill::Full)
}

impl<R: Read> TraceReader<R> {
    /// Reads the preamble and header from `src`; `path` names the source in error messages.
    pub fn from_reader(mut src: R, path: &str) -> Result<Self, ReadError> {
        let path = path.to_string();
        let mut pre = [0u8; format::PREAMBLE_LEN];
        match fill(&mut src, &mut pre).map_err(|source| ReadError::Io {
            path: path.clone(),
            source,
        })? {
            Fill::Full => {}
            Fill::Eof(n) => {
                if n < 8 && pre[..n] != format::MAGIC[..n] || n >= 8 && pre[..8] != format::MAGIC {
                    return Err(ReadError::NotATrace { path });
                }
                return Err(ReadError::Truncated {
                    path,
                    offset: n as u64,
                    what: "the file ends inside its 12-byte preamble".into(),
                });
            }
        }
        if pre[..8] != format::MAGIC {
            return Err(ReadError::NotATrace { path });
        }
        let major = u16::from_le_bytes([pre[8], pre[9]]);
        let minor = u16::from_le_bytes([pre[10], pre[11]]);
        if major != format::FORMAT_MAJOR {
            return Err(ReadError::UnsupportedVersion { path, major, minor });
        }
        let mut r = TraceReader {
            src,
            path,
            header: Header::new("", 0),
            chunk: Vec::new(),
            pos: 0,
            chunk_base: 0,
            next_offset: format::PREAMBLE_LEN as u64,
            strings: Vec::new(),
            callsites: Vec::new(),
            locations: Vec::new(),
            ctx: None,
            last_ts: 0,
            last_span: 0,
            status: TraceStatus::Reading,
            strict: false,
            done: false,
        };
        match r.next_chunk()? {
            true => {}
            false => {
                let offset = r.next_offset;
                let what = match &r.status {
                    TraceStatus::Cut {
                        discarded_bytes, ..
                    } if *discarded_bytes > 0 => "the header chunk is incomplete",
                    _ => "the file has no header chunk",
                };
                return Err(ReadError::Truncated {
                    path: r.path,
                    offset,
                    what: what.into(),
                });
            }
        }
        let chunk = std::mem::take(&mut r.chunk);
        let mut c = Cursor::new(&chunk, r.chunk_base);
        let decoded = decode_header(&mut c, major, minor);
        let end = c.offset();
        r.chunk = chunk;
        let header = decoded.map_err(|e| r.corrupt(e))?;
        r.pos = (end - r.chunk_base) as usize;
        r.header = header;
        Ok(r)
    }

    /// In strict mode a trace that ends without an end record (or inside a chunk) yields a final
    /// [`ReadError::Truncated`] instead of ending quietly.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The per-process header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The file name used in error messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// How the trace ends, once all records have been read ([`TraceStatus::Reading`] before).
    pub fn status(&self) -> &TraceStatus {
        &self.status
    }

    /// File offset of the next byte to decode.
    pub fn offset(&self) -> u64 {
        self.chunk_base + self.pos as u64
    }

    fn corrupt(&mut self, e: DecodeError) -> ReadError {
        self.done = true;
        self.status = TraceStatus::Corrupt { offset: e.offset };
        ReadError::Corrupt {
            path: self.path.clone(),
            offset: e.offset,
            what: e.what,
        }
    }

    fn io(&mut self, source: io::Error) -> ReadError {
        self.done = true;
        ReadError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Loads the next chunk. Ok(false) at the end of the data (status set to Cut).
    fn next_chunk(&mut self) -> Result<bool, ReadError> {
        let at = self.next_offset;
        let mut h = [0u8; format::CHUNK_HEADER_LEN];
        match fill(&mut self.src, &mut h).map_err(|e| self.io(e))? {
            Fill::Full => {}
            Fill::Eof(n) => {
                self.status = TraceStatus::Cut {
                    valid_up_to: at,
                    discarded_bytes: n as u64,
                };
                return Ok(false);
            }
        }
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let hcrc = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if format::crc32(&h[0..8]) != hcrc {
            return Err(self.corrupt(DecodeError {
                offset: at,
                what: "chunk header checksum mismatch".into(),
            }));
        }
        if len == 0 || len > format::MAX_CHUNK_PAYLOAD {
            return Err(self.corrupt(DecodeError {
                offset: at,
                what: format!("chunk length {len} is out of range"),
            }));
        }
        self.chunk.resize(len as usize, 0);
        match fill(&mut self.src, &mut self.chunk).map_err(|e| self.io(e))? {
            Fill::Full => {}
            Fill::Eof(n) => {
                self.status = TraceStatus::Cut {
                    valid_up_to: at,
                    discarded_bytes: (format::CHUNK_HEADER_LEN + n) as u64,
                };
                self.chunk.clear();
                return Ok(false);
            }
        }
        if format::crc32(&self.chunk) != crc {
            return Err(self.corrupt(DecodeError {
                offset: at,
                what: format!(
                    "chunk checksum mismatch (payload bytes {}..{})",
                    at + format::CHUNK_HEADER_LEN as u64,
                    at + format::CHUNK_HEADER_LEN as u64 + u64::from(len)
                ),
            }));
        }
        self.chunk_base = at + format::CHUNK_HEADER_LEN as u64;
        self.next_offset = self.chunk_base + u64::from(len);
        self.pos = 0;
        self.ctx = None;
        self.last_ts = 0;
        self.last_span = 0;
        Ok(true)
    }

    /// Reads the next record; `Ok(None)` at the end of the trace.
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        loop {
            if self.done {
                return Ok(None);
            }
            if self.pos >= self.chunk.len() {
                if !self.next_chunk()? {
                    self.done = true;
                    if self.strict {
                        let (offset, discarded) = match self.status {
                            TraceStatus::Cut {
                                valid_up_to,
                                discarded_bytes,
                            } => (valid_up_to, discarded_bytes),
                            _ => (self.next_offset, 0),
                        };
                        let what = if discarded > 0 {
                            format!(
                                "the last chunk is incomplete ({discarded} bytes) and there is no end record"
                            )
                        } else {
                            "the trace has no end record (the process did not finish it)".into()
                        };
                        return Err(ReadError::Truncated {
                            path: self.path.clone(),
                            offset,
                            what,
                        });
                    }
                    return Ok(None);
                }
                continue;
            }
            let chunk = std::mem::take(&mut self.chunk);
            let mut c = Cursor::new(&chunk[self.pos..], self.chunk_base + self.pos as u64);
            let res = self.decode_one(&mut c);
            let consumed = (c.offset() - self.chunk_base) as usize;
            self.chunk = chunk;
            match res {
                Ok(rec) => {
                    self.pos = consumed;
                    if let Some(rec) = rec {
                        if let Record::End(end) = &rec {
                            self.status = TraceStatus::Complete(*end);
                            self.done = true;
                        }
                        return Ok(Some(rec));
                    }
                }
                Err(e) => return Err(self.corrupt(e)),
            }
        }
    }

    fn string(&self, c: &Cursor<'_>, id: u64) -> Result<Arc<str>, DecodeError> {
        id.checked_sub(1)
            .and_then(|i| self.strings.get(i as usize))
            .cloned()
            .ok_or_else(|| c.err(format!("reference to undefined string {id}")))
    }

    fn callsite(&self, c: &Cursor<'_>, id: u64) -> Result<Arc<Callsite>, DecodeError> {
        id.checked_sub(1)
            .and_then(|i| self.callsites.get(i as usize))
            .cloned()
            .ok_or_else(|| c.err(format!("reference to undefined callsite {id}")))
    }

    fn thread(&self, c: &Cursor<'_>) -> Result<ThreadIndex, DecodeError> {
        self.ctx
            .ok_or_else(|| c.err("thread record before any thread context in its chunk"))
    }

    fn ts(&mut self, c: &mut Cursor<'_>) -> Result<u64, DecodeError> {
        let ts = c.delta(self.last_ts)?;
        self.last_ts = ts;
        Ok(ts)
    }

    fn span_ref(&mut self, c: &mut Cursor<'_>) -> Result<SpanId, DecodeError> {
        let id = c.delta(self.last_span)?;
        self.last_span = id;
        Ok(SpanId(id))
    }

    fn values(&self, c: &mut Cursor<'_>, cs: &Callsite) -> Result<Vec<Field>, DecodeError> {
        let n = c.varint()?;
        let mut out = Vec::with_capacity(n.min(64) as usize);
        for _ in 0..n {
            let at = c.offset();
            let index = c.u32()?;
            let name = cs
                .fields
                .get(index as usize)
                .cloned()
                .ok_or_else(|| DecodeError {
                    offset: at,
                    what: format!(
                        "field index {index} out of range for callsite `{}` ({} fields)",
                        cs.name,
                        cs.fields.len()
                    ),
                })?;
            let t = c.u8()?;
            let value = match t {
                value::U64 => FieldValue::U64(c.varint()?),
                value::I64 => FieldValue::I64(format::unzigzag(c.varint()?)),
                value::F64 => FieldValue::F64(c.f64()?),
                value::FALSE => FieldValue::Bool(false),
                value::TRUE => FieldValue::Bool(true),
                value::STR => FieldValue::Str(c.str()?.to_string()),
                other => return Err(c.err(format!("unknown field value type {other}"))),
            };
            out.push(Field { index, name, value });
        }
        Ok(out)
    }

    /// Decodes one record; Ok(None) for records consumed internally (definitions).
    fn decode_one(&mut self, c: &mut Cursor<'_>) -> Result<Option<Record>, DecodeError> {
        let at = c.offset();
        let t = c.u8()?;
        Ok(Some(match t {
            tag::STRING => {
                let id = c.varint()?;
                let s = c.str()?;
                if id != self.strings.len() as u64 + 1 {
                    return Err(DecodeError {
                        offset: at,
                        what: format!(
                            "string {id} defined out of order (expected {})",
                            self.strings.len() + 1
                        ),
                    });
                }
                self.strings.push(Arc::from(s));
                return Ok(None);
            }
            tag::CALLSITE => {
                let id = c.varint()?;
                let name = c.varint()?;
                let name = self.string(c, name)?;
                let target = c.varint()?;
                let target = self.string(c, target)?;
                let file = match c.opt()? {
                    None => None,
                    Some(f) => Some(self.string(c, f)?),
                };
                let line = c.opt_u32()?;
                let lk = c.u8()?;
                let level = Level::from_code(lk & 0x7f)
                    .ok_or_else(|| c.err(format!("unknown level code {}", lk & 0x7f)))?;
                let kind = if lk & 0x80 != 0 {
                    CallsiteKind::Event
                } else {
                    CallsiteKind::Span
                };
                let n = c.varint()?;
                let mut fields = Vec::with_capacity(n.min(64) as usize);
                for _ in 0..n {
                    let f = c.varint()?;
                    fields.push(self.string(c, f)?);
                }
                if id != self.callsites.len() as u64 + 1 {
                    return Err(DecodeError {
                        offset: at,
                        what: format!("callsite {id} defined out of order"),
                    });
                }
                self.callsites.push(Arc::new(Callsite {
                    name,
                    target,
                    file,
                    line,
                    level,
                    kind,
                    fields: fields.into(),
                }));
                return Ok(None);
            }
            tag::LOCATION => {
                let id = c.varint()?;
                let file = c.varint()?;
                let file = self.string(c, file)?;
                let line = c.u32()?;
                let column = c.u32()?;
                if id != self.locations.len() as u64 + 1 {
                    return Err(DecodeError {
                        offset: at,
                        what: format!("location {id} defined out of order"),
                    });
                }
                self.locations.push(SourceLocation { file, line, column });
                return Ok(None);
            }
            tag::THREAD_CONTEXT => {
                self.ctx = Some(c.u32()?);
                self.last_ts = 0;
                self.last_span = 0;
                return Ok(None);
            }
            tag::THREAD => {
                let index = c.u32()?;
                let os_tid = c.varint()?;
                let name = match c.varint()? {
                    0 => None,
                    n => {
                        let b = c.bytes(usize::try_from(n - 1).unwrap_or(usize::MAX))?;
                        Some(String::from_utf8_lossy(b).into_owned())
                    }
                };
                Record::Thread(ThreadInfo {
                    index,
                    os_tid,
                    name,
                })
            }
            tag::SPAN_NEW => {
                let thread = self.thread(c)?;
                let ts = self.ts(c)?;
                let id = self.span_ref(c)?;
                let parent = match c.varint()? {
                    0 => None,
                    p => Some(SpanId(id.0.wrapping_sub(format::unzigzag(p - 1) as u64))),
                };
                let cs = c.varint()?;
                let callsite = self.callsite(c, cs)?;
                let fields = self.values(c, &callsite)?;
                Record::SpanNew(SpanNew {
                    thread,
                    ts,
                    id,
                    parent,
                    callsite,
                    fields,
                })
            }
            tag::SPAN_ENTER | tag::SPAN_EXIT | tag::SPAN_CLOSE => {
                let thread = self.thread(c)?;
                let ts = self.ts(c)?;
                let span = self.span_ref(c)?;
                let e = SpanEdge { thread, ts, span };
                match t {
                    tag::SPAN_ENTER => Record::SpanEnter(e),
                    tag::SPAN_EXIT => Record::SpanExit(e),
                    _ => Record::SpanClose(e),
                }
            }
            tag::SPAN_RECORD => {
                let thread = self.thread(c)?;
                let ts = self.ts(c)?;
                let span = self.span_ref(c)?;
                let cs = c.varint()?;
                let callsite = self.callsite(c, cs)?;
                let fields = self.values(c, &callsite)?;
                Record::SpanRecord(SpanRecord {
                    thread,
                    ts,
                    span,
                    callsite,
                    fields,
                })
            }
            tag::EVENT => {
                let thread = self.thread(c)?;
                let ts = self.ts(c)?;
                let span = match c.varint()? {
                    0 => None,
                    z => {
                        let id = self.last_span.wrapping_add(format::unzigzag(z - 1) as u64);
                        self.last_span = id;
                        Some(SpanId(id))
                    }
                };
                let cs = c.varint()?;
                let callsite = self.callsite(c, cs)?;
                let fields = self.values(c, &callsite)?;
                Record::Event(Event {
                    thread,
                    ts,
                    span,
                    callsite,
                    fields,
                })
            }
            tag::GPU => Record::Gpu(self.gpu(c)?),
            tag::GPU_TIMING => {
                let id = c.varint()?;
                let gpu_start = c.varint()?;
                let gpu_end = gpu_start.wrapping_add(c.varint()?);
                Record::GpuTiming(GpuTiming {
                    id,
                    gpu_start,
                    gpu_end,
                })
            }
            tag::DEVICE => {
                let device = c.u32()?;
                let name = c.str()?.to_string();
                let total_memory = c.varint()?;
                let major = c.u32()?;
                let minor = c.u32()?;
                Record::Device(DeviceInfo {
                    device,
                    name,
                    total_memory,
                    compute_capability: (major, minor),
                })
            }
            tag::DEVICE_MEMORY => {
                let ts = c.varint()?;
                let device = c.u32()?;
                let used = c.varint()?;
                let total = c.varint()?;
                Record::DeviceMemory(DeviceMemory {
                    ts,
                    device,
                    used,
                    total,
                })
            }
            tag::GPU_SAMPLE => {
                let ts = c.varint()?;
                let device = c.u32()?;
                let gpu_util_pct = c.opt_u32()?;
                let mem_util_pct = c.opt_u32()?;
                let memory_used = c.opt()?;
                let memory_total = c.opt()?;
                let sm_clock_mhz = c.opt_u32()?;
                let power_mw = c.opt_u32()?;
                Record::GpuSample(GpuSample {
                    ts,
                    device,
                    gpu_util_pct,
                    mem_util_pct,
                    memory_used,
                    memory_total,
                    sm_clock_mhz,
                    power_mw,
                })
            }
            tag::STACK => {
                let id = c.varint()?;
                let n = c.varint()?;
                if n > c.remaining() as u64 {
                    return Err(c.err(format!(
                        "stack of {n} frames runs past the end of its chunk"
                    )));
                }
                let mut ips = Vec::with_capacity(n as usize);
                let mut prev = 0u64;
                for _ in 0..n {
                    prev = c.delta(prev)?;
                    ips.push(prev);
                }
                Record::Stack(StackInfo { id, ips })
            }
            tag::MODULE => {
                let path = c.str()?.to_string();
                let base = c.varint()?;
                let size = c.varint()?;
                Record::Module(ModuleInfo { path, base, size })
            }
            tag::OP_STACK => {
                let op = c.varint()?;
                let stack = c.varint()?;
                Record::OpStack(OpStack { op, stack })
            }
            tag::DROPPED => {
                let thread = c.opt_u32()?;
                let ts = c.varint()?;
                let count = c.varint()?;
                Record::Dropped(Dropped { thread, ts, count })
            }
            tag::PANIC => {
                let thread = c.opt_u32()?;
                let ts = c.varint()?;
                let message = c.str()?.to_string();
                let location = match c.u8()? {
                    0 => None,
                    _ => {
                        let file: Arc<str> = Arc::from(c.str()?);
                        let line = c.u32()?;
                        let column = c.u32()?;
                        Some(SourceLocation { file, line, column })
                    }
                };
                Record::Panic(PanicInfo {
                    thread,
                    ts,
                    message,
                    location,
                })
            }
            tag::END => {
                let ts = c.varint()?;
                let end_unix_ns = c.varint()?;
                let rc = c.u8()?;
                let reason = EndReason::from_code(rc)
                    .ok_or_else(|| c.err(format!("unknown end reason {rc}")))?;
                let records = c.varint()?;
                let dropped = c.varint()?;
                Record::End(TraceEnd {
                    ts,
                    end_unix_ns,
                    reason,
                    records,
                    dropped,
                })
            }
            t if t >= tag::EXTENSION_FIRST => {
                let len = c.varint()?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                let base = c.offset();
                let body = c.bytes(len)?;
                // Known extension records are decoded from their body; bytes after the fields
                // known here (added by a later minor version) are skipped.
                let mut b = Cursor::new(body, base);
                match t {
                    tag::PY_STACK => {
                        let id = b.varint()?;
                        let n = b.varint()?;
                        if n > b.remaining() as u64 {
                            return Err(b.err(format!(
                                "Python stack of {n} frames runs past the end of its record"
                            )));
                        }
                        let mut frames = Vec::with_capacity(n as usize);
                        for _ in 0..n {
                            let file = b.varint()?;
                            let file = self.string(&b, file)?;
                            let function = b.varint()?;
                            let function = self.string(&b, function)?;
                            let line = b.u32()?;
                            frames.push(PyFrame {
                                file,
                                function,
                                line,
                            });
                        }
                        Record::PyStack(PyStackInfo { id, frames })
                    }
                    tag::OP_PY_STACK => {
                        let op = b.varint()?;
                        let stack = b.varint()?;
                        Record::OpPyStack(OpPyStack {
                            op,
                            stack: (stack != 0).then_some(stack),
                        })
                    }
                    _ => return Ok(None),
                }
            }
            other => {
                return Err(DecodeError {
                    offset: at,
                    what: format!("unknown record tag 0x{other:02x}"),
                });
            }
        }))
    }

    fn gpu(&mut self, c: &mut Cursor<'_>) -> Result<GpuEvent, DecodeError> {
        let thread = self.thread(c)?;
        let kc = c.u8()?;
        let kind =
            GpuOpKind::from_code(kc).ok_or_else(|| c.err(format!("unknown GPU op kind {kc}")))?;
        let flags = c.varint()?;
        let host_start = self.ts(c)?;
        let host_end = host_start.wrapping_add(c.varint()?);
        let gpu_start = if flags & gpu_flag::GPU_START != 0 {
            Some(c.delta(host_start)?)
        } else {
            None
        };
        let gpu_end = if flags & gpu_flag::GPU_END != 0 {
            Some(c.delta(gpu_start.unwrap_or(host_start))?)
        } else {
            None
        };
        let id = c.varint()?;
        let device = c.u32()?;
        let stream = if flags & gpu_flag::STREAM != 0 {
            Some(c.varint()?)
        } else {
            None
        };
        let bytes = c.varint()?;
        let span = if flags & gpu_flag::SPAN != 0 {
            Some(self.span_ref(c)?)
        } else {
            None
        };
        let location = if flags & gpu_flag::LOCATION != 0 {
            let lid = c.varint()?;
            Some(
                lid.checked_sub(1)
                    .and_then(|i| self.locations.get(i as usize))
                    .cloned()
                    .ok_or_else(|| c.err(format!("reference to undefined location {lid}")))?,
            )
        } else {
            None
        };
        let kernel = if flags & gpu_flag::KERNEL != 0 {
            let n = c.varint()?;
            let name = self.string(c, n)?;
            let mut dims = [0u32; 6];
            for d in &mut dims {
                *d = c.u32()?;
            }
            let shared_mem_bytes = c.u32()?;
            Some(KernelInfo {
                name,
                grid: [dims[0], dims[1], dims[2]],
                block: [dims[3], dims[4], dims[5]],
                shared_mem_bytes,
            })
        } else {
            None
        };
        let host_memory = if flags & gpu_flag::PINNED != 0 {
            Some(HostMemory::Pinned)
        } else if flags & gpu_flag::PAGEABLE != 0 {
            Some(HostMemory::Pageable)
        } else {
            None
        };
        Ok(GpuEvent {
            thread,
            kind,
            id,
            device,
            stream,
            bytes,
            host_memory,
            host_start,
            host_end,
            gpu_start,
            gpu_end,
            gpu_end_at_host_return: flags & gpu_flag::GPU_END_AT_HOST_RETURN != 0,
            span,
            location,
            kernel,
        })
    }
}

fn decode_header(c: &mut Cursor<'_>, major: u16, minor: u16) -> Result<Header, DecodeError> {
    let t = c.u8()?;
    if t != tag::HEADER {
        return Err(DecodeError {
            offset: c.offset() - 1,
            what: format!("first record is tag 0x{t:02x}, expected the header (0x01)"),
        });
    }
    let writer_version = c.str()?.to_string();
    let pid = c.u32()?;
    let host = c.str()?.to_string();
    let program = c.str()?.to_string();
    let argc = c.varint()?;
    let mut command_line = Vec::with_capacity(argc.min(256) as usize);
    for _ in 0..argc {
        command_line.push(c.str()?.to_string());
    }
    let start_unix_ns = c.varint()?;
    let rank = c.opt_u32()?;
    let local_rank = c.opt_u32()?;
    let world_size = c.opt_u32()?;
    let step_span_name = c.str()?.to_string();
    let clock = c.str()?.to_string();
    let n = c.varint()?;
    let mut extra = Vec::with_capacity(n.min(256) as usize);
    for _ in 0..n {
        let k = c.str()?.to_string();
        let v = c.str()?.to_string();
        extra.push((k, v));
    }
    Ok(Header {
        format_major: major,
        format_minor: minor,
        writer_version,
        pid,
        host,
        program,
        command_line,
        start_unix_ns,
        rank,
        local_rank,
        world_size,
        step_span_name,
        clock,
        extra,
    })
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Record, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

impl<R: Read> std::iter::FusedIterator for TraceReader<R> {}

/// The trace files at `path`: the file itself, or every `*.pktrace` entry of a directory that
/// is not a directory itself (not recursive), sorted by name. Entries that are not regular
/// files (a dangling symbolic link, a FIFO) are listed too: [`TraceReader::open`] refuses them
/// with an error that names them.
pub fn trace_files(path: impl AsRef<Path>) -> Result<Vec<PathBuf>, ReadError> {
    let path = path.as_ref();
    let io_err = |source| ReadError::Io {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let p = entry.path();
        if p.extension().is_none_or(|e| e != format::TRACE_EXTENSION) {
            continue;
        }
        // Every `*.pktrace` but a directory: a symbolic link that leads nowhere, a FIFO or a
        // socket is listed, so that opening it names it as unreadable instead of the run
        // looking complete without it.
        let is_dir = match entry.file_type() {
            Ok(t) if t.is_symlink() => std::fs::metadata(&p).is_ok_and(|m| m.is_dir()),
            Ok(t) => t.is_dir(),
            Err(_) => false,
        };
        if !is_dir {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Succeeds when `path` is a regular file, or a symbolic link to one; otherwise (a FIFO, a
/// socket, a device, a directory) an [`io::ErrorKind::InvalidInput`] error that says what it
/// is. Reading a FIFO or a character device blocks until something writes to it, or never
/// ends, so readers check this before they open a path they were given.
///
/// # Errors
/// The error of [`std::fs::metadata`] (a missing file; for a symbolic link that leads nowhere,
/// an error that names where it leads), or the one above.
pub fn require_regular_file(path: &Path) -> io::Result<()> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        // A symbolic link that leads nowhere: say so, and where it leads.
        Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::read_link(path) {
            Ok(target) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "a symbolic link to {}, which does not exist",
                        target.display()
                    ),
                ));
            }
            Err(_) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    if meta.is_file() {
        return Ok(());
    }
    let what = file_kind(&meta.file_type());
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({what})"),
    ))
}

/// What kind of file a non-regular file is, in words.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
    }
    "a special file"
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("mkfifo");
        assert!(status.success());
    }

    /// Runs `f` on a thread and gives up after a while: a FIFO must be refused, not opened
    /// (opening it for reading blocks until a writer comes).
    fn without_blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .expect("blocked opening a FIFO")
    }

    #[test]
    fn a_fifo_is_refused_by_name_before_it_is_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("f.pktrace");
        mkfifo(&fifo);
        let path = fifo.clone();
        let err = without_blocking(move || {
            TraceReader::open(&path)
                .map(|_| ())
                .expect_err("a FIFO is not a trace")
                .to_string()
        });
        assert_eq!(
            err,
            format!(
                "{}: cannot read trace: not a regular file (a named pipe)",
                fifo.display()
            )
        );
        let err = require_regular_file(dir.path()).expect_err("a directory");
        assert_eq!(err.to_string(), "not a regular file (a directory)");
        // A symbolic link to a regular file is read as the file.
        let file = dir.path().join("t.txt");
        std::fs::write(&file, b"x").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        require_regular_file(&link).expect("a link to a file");
    }

    #[test]
    fn trace_files_lists_dangling_links_and_fifos_so_that_they_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.pktrace"), b"").expect("write");
        std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("b.pktrace"))
            .expect("symlink");
        mkfifo(&dir.path().join("c.pktrace"));
        std::fs::create_dir(dir.path().join("d.pktrace")).expect("mkdir");
        std::os::unix::fs::symlink(dir.path().join("d.pktrace"), dir.path().join("e.pktrace"))
            .expect("symlink");
        std::fs::write(dir.path().join("notes.txt"), b"").expect("write");
        let names: Vec<String> = trace_files(dir.path())
            .expect("list")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.pktrace", "b.pktrace", "c.pktrace"]);
        // Reading the run names them as unreadable.
        let run = crate::summary::analyze_trace_dir(
            dir.path(),
            dir.path(),
            &crate::summary::AnalyzeOptions::default(),
        )
        .expect("analyze");
        let unreadable: Vec<&str> = run.unreadable.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(unreadable, ["a.pktrace", "b.pktrace", "c.pktrace"]);
        let link = &run.unreadable[1].1;
        assert!(link.contains("gone, which does not exist"), "{link}");
        assert!(
            run.unreadable[2]
                .1
                .contains("not a regular file (a named pipe)")
        );
    }

    #[test]
    fn a_fifo_summary_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("summary.json");
        mkfifo(&fifo);
        let err = without_blocking(move || {
            crate::summary::Summary::read_json(&fifo)
                .map(|_| ())
                .expect_err("a FIFO is not a summary")
                .to_string()
        });
        assert!(err.contains("not a regular file (a named pipe)"), "{err}");
    }
}
