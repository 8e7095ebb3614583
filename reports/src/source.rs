//! Reading perfkit trace files (through `perfkit-profiler`'s streaming reader) as [`Event`]s.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use perfkit_profiler::model::{FieldValue, GpuOpKind, HostMemory, PyFrame, Record};
use perfkit_profiler::{TraceReader, TraceStatus};

use crate::error::{Error, Result};
use crate::event::{Event, GpuOp, OpKind, PyFrames};
use crate::model::{Direction, ProcessMeta};

/// How reading a trace ended.
#[derive(Debug, Clone, Default)]
pub struct ReadOutcome {
    /// The end record was read.
    pub complete: bool,
    /// Reading stopped at a damaged record: the reader's message without the file's path (it
    /// names the byte offset).
    pub error: Option<String>,
    /// Records read.
    pub records: u64,
}

/// One trace file, opened, its header read.
pub struct TraceSource {
    reader: TraceReader<BufReader<File>>,
    meta: ProcessMeta,
    step_span: String,
}

/// What the reader keeps of an open span.
struct SpanInfo {
    name: Arc<str>,
    step: Option<u64>,
    file: Option<Arc<str>>,
    line: u32,
}

/// Name of the field that numbers a step span (`info_span!("step", step = 12)`).
const STEP_FIELD: &str = "step";

fn step_field(fields: &[perfkit_profiler::model::Field]) -> Option<u64> {
    fields
        .iter()
        .find(|f| &*f.name == STEP_FIELD)
        .and_then(|f| match &f.value {
            FieldValue::Str(s) => s.trim().parse().ok(),
            v => v.as_u64(),
        })
}

impl TraceSource {
    /// Opens `path` and reads its header.
    pub fn open(path: &Path) -> Result<Self> {
        let reader = TraceReader::open(path).map_err(|e| trace_error(path, &e))?;
        let h = reader.header();
        let meta = ProcessMeta {
            file: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid: h.pid,
            host: h.host.clone(),
            command: h.command_line.clone(),
            rank: h.rank,
            local_rank: h.local_rank,
            world_size: h.world_size,
            start_unix_ns: h.start_unix_ns,
            synthetic: h.is_synthetic(),
        };
        let step_span = if h.step_span_name.is_empty() {
            perfkit_profiler::summary::DEFAULT_STEP_SPAN.to_owned()
        } else {
            h.step_span_name.clone()
        };
        Ok(Self {
            reader,
            meta,
            step_span,
        })
    }

    /// The process described by the header.
    pub fn meta(&self) -> &ProcessMeta {
        &self.meta
    }

    /// The role of an auxiliary trace (for example `gpu-sampler`), written by an auxiliary process
    /// rather than by the traced program; `None` for a program's trace.
    pub fn role(&self) -> Option<&str> {
        self.reader
            .header()
            .extra
            .iter()
            .find(|(k, _)| k == perfkit_profiler::summary::ROLE_KEY)
            .map(|(_, v)| v.as_str())
    }

    /// The step span name the recorder was configured with.
    pub fn step_span(&self) -> &str {
        &self.step_span
    }

    /// Streams every record as an [`Event`] to `f`.
    pub fn run(mut self, f: &mut dyn FnMut(&Event<'_>)) -> ReadOutcome {
        // span id -> name, `step` field, callsite source file and line
        let mut spans: HashMap<u64, SpanInfo> = HashMap::new();
        let unknown: Arc<str> = Arc::from("[unknown span]");
        // A span whose callsite has no name: shown under a name one can see (and that a
        // flamegraph can draw), the one the profiler's summary counts it under.
        let unnamed: Arc<str> = Arc::from(perfkit_profiler::summary::UNNAMED_SPAN);
        // Kernel names as the reports show them: C++ kernels (every CUDA C++ library, PyTorch's
        // ATen) arrive mangled from CUPTI. Demangled once per distinct name.
        let mut kernel_names: HashMap<Arc<str>, Arc<str>> = HashMap::new();
        let no_name: Arc<str> = Arc::from("");
        let mut dropped_seen = 0u64;
        // Python stacks by id, and the stack of each operation not yet met (its OP_PY_STACK
        // comes before it).
        let mut py_stacks: HashMap<u64, Vec<PyFrame>> = HashMap::new();
        let mut op_py: HashMap<u64, Option<u64>> = HashMap::new();
        // Steps inferred from optimizer steps in Python frames, per thread, while the trace
        // has no step spans of its own.
        let mut real_steps = false;
        let mut py_steps = perfkit_profiler::pystep::PyStepInference::new();
        let step_name = self.step_span.clone();
        let mut outcome = ReadOutcome::default();
        loop {
            let record = match self.reader.next_record() {
                Ok(Some(r)) => {
                    outcome.records += 1;
                    r
                }
                Ok(None) => break,
                Err(e) => {
                    outcome.error = Some(strip_path(&e.to_string(), self.reader.path()));
                    break;
                }
            };
            match record {
                Record::Thread(t) => {
                    let name = t
                        .name
                        .clone()
                        .unwrap_or_else(|| format!("tid {}", t.os_tid));
                    f(&Event::Thread {
                        thread: u64::from(t.index),
                        name: &name,
                    });
                }
                Record::SpanNew(n) => {
                    if *n.callsite.name == *step_name {
                        real_steps = true;
                    }
                    let name = if n.callsite.name.is_empty() {
                        unnamed.clone()
                    } else {
                        n.callsite.name.clone()
                    };
                    spans.insert(
                        n.id.0,
                        SpanInfo {
                            name,
                            step: step_field(&n.fields),
                            file: n.callsite.file.clone(),
                            line: n.callsite.line.unwrap_or(0),
                        },
                    );
                    f(&Event::Other { ts_ns: Some(n.ts) });
                }
                Record::SpanRecord(r) => {
                    if let Some(step) = step_field(&r.fields)
                        && let Some(entry) = spans.get_mut(&r.span.0)
                    {
                        entry.step = Some(step);
                    }
                    f(&Event::Other { ts_ns: Some(r.ts) });
                }
                Record::SpanEnter(e) => {
                    let info = spans.get(&e.span.0);
                    f(&Event::Enter {
                        thread: u64::from(e.thread),
                        span: e.span.0,
                        name: info.map_or(&unknown, |i| &i.name),
                        step: info.and_then(|i| i.step),
                        file: info.and_then(|i| i.file.as_deref()),
                        line: info.map_or(0, |i| i.line),
                        ts_ns: e.ts,
                    });
                }
                Record::SpanExit(e) => f(&Event::Exit {
                    thread: u64::from(e.thread),
                    span: e.span.0,
                    ts_ns: e.ts,
                }),
                Record::SpanClose(e) => {
                    spans.remove(&e.span.0);
                    f(&Event::Close { span: e.span.0 });
                    f(&Event::Other { ts_ns: Some(e.ts) });
                }
                // GPU times that cannot be (see `gpu_times_valid`): the record is malformed,
                // and left out whole rather than counted with a time that wrapped around.
                Record::Gpu(g) if !gpu_times_valid(g.gpu_start, g.gpu_end) => {
                    op_py.remove(&g.id);
                    f(&Event::InvalidGpu);
                }
                Record::Gpu(g) => {
                    let kind = match g.kind {
                        GpuOpKind::MemcpyHtoD => OpKind::Copy(Direction::H2D),
                        GpuOpKind::MemcpyDtoH => OpKind::Copy(Direction::D2H),
                        GpuOpKind::MemcpyDtoD => OpKind::Copy(Direction::D2D),
                        GpuOpKind::Memset => OpKind::Memset,
                        GpuOpKind::Kernel => OpKind::Kernel,
                        GpuOpKind::Synchronize => OpKind::Sync,
                        GpuOpKind::Alloc => OpKind::Alloc,
                        GpuOpKind::Free => OpKind::Free,
                    };
                    let name: Arc<str> = match &g.kernel {
                        Some(k) => match kernel_names.get(&*k.name) {
                            Some(n) => n.clone(),
                            None => {
                                let n: Arc<str> = perfkit_symbolize::demangle(&k.name).into();
                                kernel_names.insert(Arc::clone(&k.name), n.clone());
                                n
                            }
                        },
                        None => no_name.clone(),
                    };
                    let python = match op_py.remove(&g.id) {
                        None => PyFrames::None,
                        Some(None) => PyFrames::GilNotHeld,
                        Some(Some(id)) => py_stacks
                            .get(&id)
                            .map_or(PyFrames::None, |f| PyFrames::Frames(f)),
                    };
                    // A Python operation's source line is that of its caller in the program's
                    // own code (a recorded Rust caller location wins).
                    let py_caller = match python {
                        PyFrames::Frames(f) if g.location.is_none() => python_caller(f),
                        _ => None,
                    };
                    if let PyFrames::Frames(frames) = python
                        && !real_steps
                        && let Some(b) = py_steps.op(g.thread, frames, g.host_end)
                    {
                        let thread = u64::from(b.thread);
                        if let Some(span) = b.ended {
                            f(&Event::Exit {
                                thread,
                                span,
                                ts_ns: b.at,
                            });
                            f(&Event::Close { span });
                        }
                        f(&Event::Enter {
                            thread,
                            span: b.begun,
                            name: &step_name,
                            step: Some(b.number),
                            file: None,
                            line: 0,
                            ts_ns: b.at,
                        });
                    }
                    let (file, line) = match (&g.location, py_caller) {
                        (Some(l), _) => (Some(&*l.file), l.line),
                        (None, Some(f)) => (Some(&*f.file), f.line),
                        (None, None) => (None, 0),
                    };
                    let op = GpuOp {
                        kind,
                        thread: u64::from(g.thread),
                        stream: g.stream,
                        host_start_ns: g.host_start,
                        host_end_ns: g.host_end.max(g.host_start),
                        gpu_start_ns: g.gpu_start,
                        gpu_end_ns: g.gpu_end,
                        gpu_end_at_host_return: g.gpu_end_at_host_return,
                        bytes: g.bytes,
                        pinned: g.host_memory.map(|m| m == HostMemory::Pinned),
                        name: &name,
                        file,
                        line,
                        span: g.span.map(|s| s.0),
                        id: g.id,
                        python,
                    };
                    f(&Event::Gpu(op));
                }
                Record::GpuTiming(t) if !gpu_times_valid(Some(t.gpu_start), Some(t.gpu_end)) => {
                    f(&Event::InvalidGpu);
                }
                Record::GpuTiming(t) => f(&Event::GpuTiming {
                    id: t.id,
                    gpu_start_ns: t.gpu_start,
                    gpu_end_ns: t.gpu_end,
                }),
                Record::Device(d) => f(&Event::Device {
                    total_bytes: d.total_memory,
                }),
                Record::DeviceMemory(m) => f(&Event::DeviceMemory {
                    ts_ns: m.ts,
                    used_bytes: m.used,
                    total_bytes: m.total,
                }),
                Record::Dropped(d) => {
                    dropped_seen += d.count;
                    f(&Event::Dropped { count: d.count });
                }
                Record::PyStack(p) => {
                    py_stacks.insert(p.id, p.frames);
                    f(&Event::Other { ts_ns: None });
                }
                Record::OpPyStack(o) => {
                    op_py.insert(o.op, o.stack);
                    f(&Event::Other { ts_ns: None });
                }
                Record::End(end) => {
                    // The end record's total covers drops that had no record of their own.
                    if end.dropped > dropped_seen {
                        f(&Event::Dropped {
                            count: end.dropped - dropped_seen,
                        });
                        dropped_seen = end.dropped;
                    }
                    f(&Event::Other {
                        ts_ns: Some(end.ts),
                    });
                }
                other => f(&Event::Other { ts_ns: other.ts() }),
            }
        }
        outcome.complete = matches!(self.reader.status(), TraceStatus::Complete(_));
        outcome
    }
}

/// The latest time a trace may hold, in ns after its origin (292 years). Times are deltas with
/// wrapping arithmetic (see the trace format): a later one can only be a time before the
/// origin, or an end before its start, that wrapped around.
pub const MAX_TIME_NS: u64 = i64::MAX as u64;

/// Whether the GPU times of an operation can be: each, when present, at most [`MAX_TIME_NS`],
/// and the end not before the start.
pub fn gpu_times_valid(gpu_start: Option<u64>, gpu_end: Option<u64>) -> bool {
    let in_range = |t: Option<u64>| t.is_none_or(|t| t <= MAX_TIME_NS);
    in_range(gpu_start)
        && in_range(gpu_end)
        && match (gpu_start, gpu_end) {
            (Some(s), Some(e)) => e >= s,
            _ => true,
        }
}

/// Whether a Python frame is an optimizer's `step` (see [`perfkit_profiler::pystep`]): in a
/// Python trace without step spans, each optimizer step ends a training step.
pub fn python_optimizer_step(f: &PyFrame) -> bool {
    perfkit_profiler::pystep::is_optimizer_step(f)
}

/// Whether a Python source file belongs to a library rather than to the program: installed
/// packages (`site-packages`, `dist-packages`), the standard library (`lib/python3.X/`) and the
/// interpreter's own frozen modules (`<frozen ...>`).
pub fn python_library_file(file: &str) -> bool {
    if file.starts_with("<frozen") {
        return true;
    }
    let parts: Vec<&str> = file.split(['/', '\\']).collect();
    parts
        .iter()
        .any(|p| *p == "site-packages" || *p == "dist-packages")
        || parts.windows(2).any(|w| {
            w[0].eq_ignore_ascii_case("lib")
                && w[1]
                    .strip_prefix("python")
                    .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        })
}

/// The frame of a Python stack (innermost first) that stands for the operation in the program:
/// the innermost frame in the program's own code (not in a library, see
/// [`python_library_file`]), else the innermost frame.
pub fn python_caller(frames: &[PyFrame]) -> Option<&PyFrame> {
    frames
        .iter()
        .find(|f| !python_library_file(&f.file))
        .or_else(|| frames.first())
}

/// How a Python frame is named in flamegraphs: `function (file:line)`, the file shortened to
/// its path inside `site-packages` for installed packages.
pub fn python_frame_name(f: &PyFrame) -> String {
    let file = &*f.file;
    let short = ["site-packages/", "dist-packages/"]
        .iter()
        .filter_map(|m| file.rfind(m).map(|i| &file[i + m.len()..]))
        .next()
        .unwrap_or(file);
    format!("{} ({short}:{})", f.function, f.line)
}

fn trace_error(path: &Path, e: &perfkit_profiler::ReadError) -> Error {
    Error::Trace {
        path: PathBuf::from(path),
        message: strip_path(&e.to_string(), &path.display().to_string()),
    }
}

/// The reader's messages start with the path (as the reader names it); whoever shows the
/// message adds it again.
fn strip_path(message: &str, path: &str) -> String {
    message
        .strip_prefix(path)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(message)
        .to_owned()
}
