//! Chrome trace event JSON (opens in Perfetto and `chrome://tracing`).
//!
//! One process per traced process or rank, one thread track per host thread and one per
//! CUDA stream, flow arrows from each launch or copy call to its GPU work, and a counter
//! track of allocated device memory. Written while the trace streams, so memory stays flat
//! (open spans and GPU work awaiting its timing only).

use std::collections::HashMap;
use std::io::Write;

use crate::event::{Event, OpKind};
use crate::model::ProcessAnalysis;

/// Stream tracks get thread ids from this base upwards (`base + stream`).
pub const STREAM_TID_BASE: u64 = 1 << 40;

/// Writes the JSON of a run, process by process.
pub struct ChromeWriter<W: Write> {
    w: W,
    pid: u64,
    offset_ns: u64,
    flow: u64,
    mem: i128,
    last_ts: u64,
    err: Option<std::io::Error>,
    /// JSON string literals of names already seen.
    names: HashMap<String, std::sync::Arc<str>>,
    /// Per thread: open spans.
    open: HashMap<u64, Vec<OpenSpan>>,
    pending: HashMap<u64, PendingGpu>,
    /// Reused buffer for one event line.
    line: Vec<u8>,
    /// JSON strings of source locations, by line then file.
    sources: HashMap<u32, Vec<SourceJson>>,
    /// Why the run is incomplete (see [`ChromeWriter::set_incomplete`]); empty when it is not.
    incomplete: Vec<String>,
}

/// A source file and the JSON string of `file:line`.
type SourceJson = (Box<str>, std::sync::Arc<str>);

/// An open span: id, JSON name, start, step index.
type OpenSpan = (u64, std::sync::Arc<str>, u64, Option<u64>);

/// GPU work whose timing arrives later.
struct PendingGpu {
    thread: u64,
    host_start: u64,
    stream: u64,
    name: std::sync::Arc<str>,
    bytes: u64,
    pinned: Option<bool>,
    source: Option<std::sync::Arc<str>>,
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// Appends the decimal digits of `v`.
fn push_u64(buf: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.extend_from_slice(&tmp[i..]);
}

/// Appends nanoseconds as microseconds with three decimals (Chrome's `ts` unit).
fn push_us(buf: &mut Vec<u8>, ns: u64) {
    push_u64(buf, ns / 1000);
    let frac = ns % 1000;
    buf.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// The head every timed event starts with: `,\n{"ph":<phase>,"pid":..,"tid":..,"ts":..`
/// (`phase` is JSON text; the time in nanoseconds, written in microseconds).
fn push_event_head(buf: &mut Vec<u8>, phase: &[u8], pid: u64, tid: u64, ts_ns: u64) {
    buf.extend_from_slice(b",\n{\"ph\":");
    buf.extend_from_slice(phase);
    buf.extend_from_slice(b",\"pid\":");
    push_u64(buf, pid);
    buf.extend_from_slice(b",\"tid\":");
    push_u64(buf, tid);
    buf.extend_from_slice(b",\"ts\":");
    push_us(buf, ts_ns);
}

/// The head of a complete (`X`) event up to its duration; the caller writes the rest and the
/// closing brace.
fn push_complete(buf: &mut Vec<u8>, pid: u64, tid: u64, ts_ns: u64, dur_ns: u64) {
    push_event_head(buf, b"\"X\"", pid, tid, ts_ns);
    buf.extend_from_slice(b",\"dur\":");
    push_us(buf, dur_ns);
}

/// One whole flow event of a launch arrow; `phase` is `"s"` at the launch call and
/// `"f","bp":"e"` bound to the GPU slice.
fn push_launch_flow(buf: &mut Vec<u8>, phase: &[u8], pid: u64, tid: u64, ts_ns: u64, id: u64) {
    push_event_head(buf, phase, pid, tid, ts_ns);
    buf.extend_from_slice(b",\"id\":");
    push_u64(buf, id);
    buf.extend_from_slice(b",\"cat\":\"launch\",\"name\":\"launch\"}");
}

/// Microseconds with nanosecond precision, as Chrome's `ts` expects.
struct Us(u64);

impl std::fmt::Display for Us {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

impl<W: Write> ChromeWriter<W> {
    /// Starts the document.
    pub fn new(mut w: W) -> std::io::Result<Self> {
        w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"trace_writer\",\"args\":{\"name\":\"perfkit\"}}")?;
        Ok(Self {
            w,
            pid: 0,
            offset_ns: 0,
            flow: 0,
            mem: 0,
            last_ts: 0,
            err: None,
            names: HashMap::new(),
            open: HashMap::new(),
            pending: HashMap::new(),
            line: Vec::with_capacity(512),
            sources: HashMap::new(),
            incomplete: Vec::new(),
        })
    }

    fn keep(&mut self, r: std::io::Result<()>) {
        if let Err(e) = r
            && self.err.is_none()
        {
            self.err = Some(e);
        }
    }

    fn name(&mut self, s: &str) -> std::sync::Arc<str> {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n: std::sync::Arc<str> = json_str(s).into();
        self.names.insert(s.to_owned(), n.clone());
        n
    }

    /// The JSON string of `file:line`, cached per line.
    fn source(&mut self, file: &str, line: u32) -> std::sync::Arc<str> {
        let entries = self.sources.entry(line).or_default();
        if let Some((_, json)) = entries.iter().find(|(f, _)| &**f == file) {
            return json.clone();
        }
        let json: std::sync::Arc<str> = json_str(&format!("{file}:{line}")).into();
        entries.push((file.into(), json.clone()));
        json
    }

    /// Begins a process: its name and the names of its threads and streams.
    pub fn begin_process(&mut self, index: usize, p: &ProcessAnalysis) {
        self.end_process();
        self.pid = p.meta.rank.map_or(index as u64 + 1, |r| u64::from(r) + 1);
        self.offset_ns = p.offset_ns;
        self.mem = 0;
        self.last_ts = 0;
        let pid = self.pid;
        let name = json_str(&format!(
            "{} {} ({})",
            p.meta.label(),
            p.meta.host,
            p.meta.file
        ));
        let mut r = write!(
            self.w,
            ",\n{{\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"name\":\"process_name\",\"args\":{{\"name\":{name}}}}},\n{{\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{index}}}}}"
        );
        for t in &p.threads {
            let label = if t.name.is_empty() {
                format!("thread {}", t.id)
            } else {
                t.name.clone()
            };
            r = r.and_then(|()| {
                write!(
                    self.w,
                    ",\n{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
                    t.id,
                    json_str(&label)
                )
            });
        }
        for s in &p.streams {
            let tid = STREAM_TID_BASE + s;
            r = r.and_then(|()| {
                write!(
                    self.w,
                    ",\n{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":\"CUDA stream {s}\"}}}},\n{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_sort_index\",\"args\":{{\"sort_index\":{}}}}}",
                    1_000_000 + s
                )
            });
        }
        self.keep(r);
    }

    /// Ends the current process: spans still open are closed at its last timestamp.
    fn end_process(&mut self) {
        let open = std::mem::take(&mut self.open);
        let end = self.last_ts;
        for (thread, stack) in open {
            for (_, name, start, step) in stack.into_iter().rev() {
                self.span(thread, &name, start, end, step);
            }
        }
        self.pending.clear();
    }

    fn span(&mut self, thread: u64, name: &str, start: u64, end: u64, step: Option<u64>) {
        let mut b = std::mem::take(&mut self.line);
        b.clear();
        push_complete(
            &mut b,
            self.pid,
            thread,
            self.offset_ns + start,
            end.saturating_sub(start),
        );
        b.extend_from_slice(b",\"name\":");
        b.extend_from_slice(name.as_bytes());
        if let Some(st) = step {
            b.extend_from_slice(b",\"args\":{\"step\":");
            push_u64(&mut b, st);
            b.push(b'}');
        }
        b.push(b'}');
        let r = self.w.write_all(&b);
        self.line = b;
        self.keep(r);
    }

    fn gpu_work(&mut self, p: &PendingGpu, s: u64, e: u64) {
        let (pid, off) = (self.pid, self.offset_ns);
        let tid = STREAM_TID_BASE + p.stream;
        self.flow += 1;
        let id = self.flow;
        let mut b = std::mem::take(&mut self.line);
        b.clear();
        // Flow start at the launch call.
        push_launch_flow(&mut b, b"\"s\"", pid, p.thread, off + p.host_start, id);
        // The GPU work on its stream track.
        push_complete(&mut b, pid, tid, off + s, e.saturating_sub(s));
        b.extend_from_slice(b",\"cat\":\"gpu\",\"name\":");
        b.extend_from_slice(p.name.as_bytes());
        b.extend_from_slice(b",\"args\":{\"bytes\":");
        push_u64(&mut b, p.bytes);
        match p.pinned {
            Some(true) => b.extend_from_slice(b",\"pinned\":true"),
            Some(false) => b.extend_from_slice(b",\"pinned\":false"),
            None => {}
        }
        if let Some(src) = &p.source {
            b.extend_from_slice(b",\"source\":");
            b.extend_from_slice(src.as_bytes());
        }
        b.extend_from_slice(b"}}");
        // Flow end, bound to the GPU slice.
        push_launch_flow(&mut b, b"\"f\",\"bp\":\"e\"", pid, tid, off + s, id);
        let r = self.w.write_all(&b);
        self.line = b;
        self.keep(r);
    }

    /// Writes one event of the current process.
    pub fn push(&mut self, event: &Event<'_>) {
        let (pid, off) = (self.pid, self.offset_ns);
        match *event {
            Event::Enter {
                thread,
                span,
                name,
                step,
                ts_ns,
                ..
            } => {
                self.last_ts = self.last_ts.max(ts_ns);
                let name = self.name(name);
                self.open
                    .entry(thread)
                    .or_default()
                    .push((span, name, ts_ns, step));
            }
            Event::Exit {
                thread,
                span,
                ts_ns,
            } => {
                self.last_ts = self.last_ts.max(ts_ns);
                let Some(stack) = self.open.get_mut(&thread) else {
                    return;
                };
                let Some(pos) = stack.iter().rposition(|o| o.0 == span) else {
                    return;
                };
                let closed: Vec<_> = stack.drain(pos..).collect();
                for (_, name, start, step) in closed.into_iter().rev() {
                    self.span(thread, &name, start, ts_ns, step);
                }
            }
            Event::Gpu(op) => {
                self.last_ts = self.last_ts.max(op.host_end_ns);
                let api = match op.kind {
                    OpKind::Kernel => "\"launch kernel\"",
                    OpKind::Copy(d) => match d {
                        crate::model::Direction::H2D => "\"memcpy H2D\"",
                        crate::model::Direction::D2H => "\"memcpy D2H\"",
                        crate::model::Direction::D2D => "\"memcpy D2D\"",
                    },
                    OpKind::Memset => "\"memset\"",
                    OpKind::Sync => "\"synchronize\"",
                    OpKind::Alloc | OpKind::Free => {
                        self.mem += if op.kind == OpKind::Alloc {
                            i128::from(op.bytes)
                        } else {
                            -i128::from(op.bytes)
                        };
                        let r = write!(
                            self.w,
                            ",\n{{\"ph\":\"C\",\"pid\":{pid},\"tid\":0,\"ts\":{},\"name\":\"device memory\",\"args\":{{\"bytes\":{}}}}}",
                            Us(off + op.host_end_ns),
                            self.mem.max(0)
                        );
                        self.keep(r);
                        return;
                    }
                };
                let mut b = std::mem::take(&mut self.line);
                b.clear();
                push_complete(
                    &mut b,
                    pid,
                    op.thread,
                    off + op.host_start_ns,
                    op.host_end_ns.saturating_sub(op.host_start_ns),
                );
                b.extend_from_slice(b",\"cat\":\"cuda_api\",\"name\":");
                b.extend_from_slice(api.as_bytes());
                b.push(b'}');
                let r = self.w.write_all(&b);
                self.line = b;
                self.keep(r);
                let Some(stream) = op.stream else {
                    return;
                };
                if op.kind == OpKind::Sync {
                    return;
                }
                let name = match op.kind {
                    OpKind::Kernel => self.name(op.name),
                    OpKind::Copy(crate::model::Direction::H2D) => self.name("memcpy H2D"),
                    OpKind::Copy(crate::model::Direction::D2H) => self.name("memcpy D2H"),
                    OpKind::Copy(crate::model::Direction::D2D) => self.name("memcpy D2D"),
                    _ => self.name("memset"),
                };
                let source = op.file.map(|f| self.source(f, op.line));
                let pending = PendingGpu {
                    thread: op.thread,
                    host_start: op.host_start_ns,
                    stream,
                    name,
                    bytes: op.bytes,
                    pinned: op.pinned,
                    source,
                };
                match (op.gpu_start_ns, op.gpu_end_ns) {
                    (Some(s), Some(e)) => self.gpu_work(&pending, s, e),
                    _ if op.id != 0 => {
                        self.pending.insert(op.id, pending);
                    }
                    _ => {}
                }
            }
            Event::GpuTiming {
                id,
                gpu_start_ns,
                gpu_end_ns,
            } => {
                if let Some(p) = self.pending.remove(&id) {
                    self.gpu_work(&p, gpu_start_ns, gpu_end_ns);
                }
            }
            Event::Other { ts_ns: Some(ts) } => self.last_ts = self.last_ts.max(ts),
            Event::Thread { .. }
            | Event::Close { .. }
            | Event::Dropped { .. }
            | Event::InvalidGpu
            | Event::Other { .. }
            | Event::Device { .. }
            | Event::DeviceMemory { .. } => {}
        }
    }

    /// Labels the trace as the trace of an incomplete run: a global instant event at the start,
    /// which trace viewers draw across every track, and `otherData.perfkit_incomplete` with the
    /// reasons.
    pub fn set_incomplete(&mut self, reasons: &[String]) {
        self.incomplete = reasons.to_vec();
    }

    /// Ends the document and returns the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.end_process();
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        if !self.incomplete.is_empty() {
            let label = serde_json::json!({
                "ph": "i", "s": "g", "ts": 0, "pid": 0, "tid": 0,
                "name": "perfkit: INCOMPLETE run, some time is missing (see summary.json)",
                "args": { "reasons": self.incomplete },
            });
            let other = serde_json::json!({ "perfkit_incomplete": self.incomplete });
            write!(self.w, ",\n{label}\n],\"otherData\":{other}}}\n")?;
            self.w.flush()?;
            return Ok(self.w);
        }
        self.w.write_all(b"\n]}\n")?;
        self.w.flush()?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        let mut b = Vec::new();
        push_u64(&mut b, 0);
        b.push(b' ');
        push_u64(&mut b, u64::MAX);
        b.push(b' ');
        push_us(&mut b, 1_234_567);
        b.push(b' ');
        push_us(&mut b, 5);
        assert_eq!(
            String::from_utf8_lossy(&b),
            "0 18446744073709551615 1234.567 0.005"
        );
        assert_eq!(Us(1_000_020).to_string(), "1000.020");
    }
}
