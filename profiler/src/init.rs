//! Starting a recording: [`init`], [`Builder`] and the flush [`Guard`].

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing_subscriber::Registry;
use tracing_subscriber::layer::SubscriberExt;

use crate::layer::PerfLayer;
use crate::model::{EndReason, Header};
use crate::session::{Config, Shared};
use crate::writer::Writer;

/// Environment variable naming where traces go: a directory (one file per process,
/// `<dir>/<program>-<pid>.pktrace`) or a file path ending in `.pktrace`.
pub const TRACE_ENV: &str = "PERFKIT_TRACE";

/// A layer users add to the subscriber next to perfkit's (for example `fmt::layer().boxed()`).
pub type BoxedLayer = Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync + 'static>;

/// Why recording could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The trace directory or file could not be created.
    #[error("cannot create trace file {path}: {source}")]
    Create {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the trace writer thread: {0}")]
    Thread(#[source] io::Error),
    /// Another global `tracing` subscriber is already installed.
    #[error(
        "a global tracing subscriber is already installed; use Builder::build() and add the PerfLayer to it"
    )]
    SubscriberExists,
}

/// Starts recording if `PERFKIT_TRACE` is set, and returns the guard that finishes the trace when
/// dropped. Keep it alive for the whole program: `let _perfkit = perfkit_profiler::init();`.
///
/// Without `PERFKIT_TRACE` this does nothing (no thread, no subscriber). Problems (for example an
/// unwritable directory) are reported once on stderr and the program runs on unrecorded; use
/// [`Builder::try_init`] to handle them yourself.
pub fn init() -> Guard {
    Builder::new().init()
}

/// Explicit control over recording. Defaults are documented on each method.
#[must_use = "a Builder does nothing until init(), try_init() or build() is called"]
pub struct Builder {
    output: Option<PathBuf>,
    step_span_name: String,
    buffer_size: usize,
    wait_when_full: Duration,
    flush_interval: Duration,
    record_events: bool,
    layers: Vec<BoxedLayer>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("output", &self.output)
            .field("step_span_name", &self.step_span_name)
            .field("buffer_size", &self.buffer_size)
            .field("wait_when_full", &self.wait_when_full)
            .field("flush_interval", &self.flush_interval)
            .field("record_events", &self.record_events)
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// A builder whose output comes from `PERFKIT_TRACE` (unset: record nothing).
    pub fn new() -> Builder {
        Builder {
            output: std::env::var_os(TRACE_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            step_span_name: "step".to_string(),
            buffer_size: 1 << 16,
            wait_when_full: Duration::ZERO,
            flush_interval: Duration::from_millis(50),
            record_events: true,
            layers: Vec::new(),
        }
    }

    /// Where to write: a directory (created if needed; the file is `<program>-<pid>.pktrace`)
    /// or a path ending in `.pktrace`. Overrides `PERFKIT_TRACE`.
    pub fn output(mut self, path: impl Into<PathBuf>) -> Builder {
        self.output = Some(path.into());
        self
    }

    /// Records nothing even when `PERFKIT_TRACE` is set.
    pub fn no_output(mut self) -> Builder {
        self.output = None;
        self
    }

    /// Name of the spans that mark a training step (default `step`), written into the header.
    pub fn step_span_name(mut self, name: &str) -> Builder {
        self.step_span_name = name.to_string();
        self
    }

    /// Capacity of each thread's buffer in 32-byte slots (default 65,536, i.e. 2 MiB per thread;
    /// rounded up to a power of two, at least 64). A span takes five slots over its life.
    pub fn buffer_size(mut self, slots: usize) -> Builder {
        self.buffer_size = slots;
        self
    }

    /// How long a recording thread may wait for room when its buffer is full before the record
    /// is dropped (default 0: drop at once, never block).
    pub fn wait_when_full(mut self, wait: Duration) -> Builder {
        self.wait_when_full = wait;
        self
    }

    /// How often the writer writes what it has to the file (default 50 ms, at most 100 ms), which
    /// bounds what a killed process loses.
    pub fn flush_interval(mut self, every: Duration) -> Builder {
        self.flush_interval = every.clamp(Duration::from_millis(1), Duration::from_millis(100));
        self
    }

    /// Whether `tracing` events (`info!`, ...) are recorded too (default true).
    pub fn record_events(mut self, yes: bool) -> Builder {
        self.record_events = yes;
        self
    }

    /// Adds a layer of your own (for example `tracing_subscriber::fmt::layer().boxed()`) to the
    /// subscriber that [`init`](Builder::init) installs. With layers and no output, the
    /// subscriber is installed with your layers only.
    pub fn with_layer(mut self, layer: BoxedLayer) -> Builder {
        self.layers.push(layer);
        self
    }

    /// Like [`try_init`](Builder::try_init), but reports problems on stderr and returns an
    /// inactive guard instead of failing.
    pub fn init(self) -> Guard {
        match self.try_init() {
            Ok(g) => g,
            Err(e) => {
                eprintln!("perfkit: not recording: {e}");
                Guard::inactive()
            }
        }
    }

    /// Installs the global subscriber (registry + your layers + [`PerfLayer`]) and starts
    /// recording when an output is configured.
    pub fn try_init(mut self) -> Result<Guard, InitError> {
        let layers = std::mem::take(&mut self.layers);
        let Some((layer, guard)) = self.start(true)? else {
            if !layers.is_empty() {
                let subscriber = Registry::default().with(layers);
                tracing::subscriber::set_global_default(subscriber)
                    .map_err(|_| InitError::SubscriberExists)?;
            }
            return Ok(Guard::inactive());
        };
        // (An empty Vec of layers would veto every callsite: add it only when it has layers.)
        let installed = if layers.is_empty() {
            tracing::subscriber::set_global_default(Registry::default().with(layer))
        } else {
            tracing::subscriber::set_global_default(Registry::default().with(layers).with(layer))
        };
        if installed.is_err() {
            guard.discard();
            return Err(InitError::SubscriberExists);
        }
        Ok(guard)
    }

    /// Starts recording and hands back the layer and its guard, for programs that assemble
    /// their subscriber themselves. `Ok(None)` when no output is configured (add nothing then;
    /// `Option<PerfLayer>` is itself a layer). The session becomes the one [`recorder()`] returns
    /// (unless another recording session already is).
    ///
    /// [`recorder()`]: crate::recorder()
    pub fn build(self) -> Result<Option<(PerfLayer, Guard)>, InitError> {
        self.start(true)
    }

    /// Like [`build`](Builder::build) but the session is not made the process-wide one (several
    /// independent sessions, for example in tests).
    pub fn build_local(self) -> Result<Option<(PerfLayer, Guard)>, InitError> {
        self.start(false)
    }

    fn start(self, global: bool) -> Result<Option<(PerfLayer, Guard)>, InitError> {
        let Some(output) = self.output else {
            return Ok(None);
        };
        let mut header = Header::for_current_process(&self.step_span_name);
        let (file, path) = create_trace_file(&output, &header.program, header.pid)?;
        let clock = quanta::Clock::new();
        header.clock = clock_name(&clock);
        let tsc = header.clock == "tsc";
        let config = Config {
            capacity: self.buffer_size,
            wait_when_full: self.wait_when_full,
            record_events: self.record_events,
            flush_interval: self.flush_interval,
        };
        let shared = Shared::new(config, clock, tsc);
        // The header's wall-clock time is the origin: take it right after the raw origin, with
        // the host's monotonic clock (lines up processes of one host even if the wall clock jumps).
        header.start_unix_ns = crate::sys::unix_now_ns();
        if let Some(mono) = crate::sys::monotonic_ns() {
            header
                .extra
                .push(("clock.monotonic_origin_ns".to_string(), mono.to_string()));
        }
        let writer =
            Writer::new(shared.clone(), file, path.clone(), &header).map_err(|source| {
                InitError::Create {
                    path: path.clone(),
                    source,
                }
            })?;
        let handle = std::thread::Builder::new()
            .name("perfkit-writer".into())
            .spawn(move || writer.run())
            .map_err(InitError::Thread)?;
        let _ = shared.writer.set(handle.thread().clone());
        shared
            .writer_pid
            .store(std::process::id(), std::sync::atomic::Ordering::Release);
        crate::session::register_session(&shared, global);
        let guard = Guard {
            shared: Some(shared.clone()),
            handle: Some(handle),
            path: Some(path),
        };
        Ok(Some((PerfLayer { shared }, guard)))
    }
}

fn clock_name(clock: &quanta::Clock) -> String {
    // quanta reads the TSC when it is invariant, else the OS monotonic clock (raw = nanoseconds).
    match crate::sys::monotonic_ns() {
        Some(mono) if clock.raw().abs_diff(mono) < 1_000_000_000 => "monotonic".to_string(),
        Some(_) => "tsc".to_string(),
        None => "unknown".to_string(),
    }
}

/// Creates the trace file for `output` (directory or `.pktrace` path).
fn create_trace_file(output: &Path, program: &str, pid: u32) -> Result<(File, PathBuf), InitError> {
    let err = |path: &Path, source| InitError::Create {
        path: path.to_path_buf(),
        source,
    };
    let is_file = output
        .extension()
        .is_some_and(|e| e == crate::format::TRACE_EXTENSION);
    if is_file {
        if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| err(parent, e))?;
        }
        // An existing file is never overwritten: it may be an earlier trace, or not a trace
        // at all. The trace then goes next to it, under a name of its own.
        match OpenOptions::new().write(true).create_new(true).open(output) {
            Ok(f) => return Ok((f, output.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(output, e)),
        }
        let stem = output
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (f, path) = create_numbered(output, &format!("{stem}-{pid}"), |name| {
            output.with_file_name(name)
        })?;
        eprintln!(
            "perfkit: `{}` already exists and is left as it is; recording into `{}`",
            output.display(),
            path.display()
        );
        return Ok((f, path));
    }
    std::fs::create_dir_all(output).map_err(|e| err(output, e))?;
    let safe: String = program
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    create_numbered(output, &format!("{safe}-{pid}"), |name| output.join(name))
}

/// Creates `<base>.pktrace`, else `<base>-2.pktrace`, ... (never an existing file), at the
/// path `place` gives for each name.
fn create_numbered(
    output: &Path,
    base: &str,
    place: impl Fn(&str) -> PathBuf,
) -> Result<(File, PathBuf), InitError> {
    let err = |path: &Path, source| InitError::Create {
        path: path.to_path_buf(),
        source,
    };
    for n in 1u32.. {
        let name = if n == 1 {
            format!("{base}.{}", crate::format::TRACE_EXTENSION)
        } else {
            format!("{base}-{n}.{}", crate::format::TRACE_EXTENSION)
        };
        let path = place(&name);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 10_000 => continue,
            Err(e) => return Err(err(&path, e)),
        }
    }
    Err(err(output, io::Error::other("no free trace file name")))
}

/// Statistics of a finished (or running) recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Records written to the file (including thread announcements and the end record).
    pub records: u64,
    /// Records dropped because a buffer was full or recording was impossible.
    pub dropped: u64,
    /// Bytes written to the file.
    pub bytes: u64,
    /// CPU time used by the writer thread, in nanoseconds (0 where the platform cannot tell).
    pub writer_cpu_ns: u64,
}

/// Finishes the trace when dropped: the writer drains every buffer, writes an end record and
/// closes the file. Keep it alive as long as the program records.
#[must_use = "dropping the guard finishes the trace at once; bind it: `let _perfkit = ...`"]
pub struct Guard {
    shared: Option<Arc<Shared>>,
    handle: Option<std::thread::JoinHandle<()>>,
    path: Option<PathBuf>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("recording", &self.is_recording())
            .field("path", &self.path)
            .finish()
    }
}

impl Guard {
    fn inactive() -> Guard {
        Guard {
            shared: None,
            handle: None,
            path: None,
        }
    }

    /// The trace file being written, if recording.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether this guard's session is recording.
    pub fn is_recording(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.active.load(Ordering::Relaxed))
    }

    /// Writes out everything recorded so far and waits for it (up to 5 s); returns whether the
    /// writer confirmed.
    pub fn flush(&self) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|s| s.flush_and_wait(Duration::from_secs(5)))
    }

    /// Statistics so far (final after [`finish`](Guard::finish)).
    pub fn stats(&self) -> Stats {
        self.shared.as_ref().map_or(Stats::default(), |s| Stats {
            records: s.records_written.load(Ordering::Relaxed),
            dropped: s.dropped_total.load(Ordering::Relaxed),
            bytes: s.bytes_written.load(Ordering::Relaxed),
            writer_cpu_ns: s.writer_cpu_ns.load(Ordering::Relaxed),
        })
    }

    /// A recorder for this guard's session (GPU events and the like), if recording.
    pub fn recorder(&self) -> Option<crate::recorder::Recorder> {
        self.shared
            .clone()
            .filter(|s| s.active.load(Ordering::Relaxed))
            .map(|shared| crate::recorder::Recorder { shared })
    }

    /// Finishes the trace now and returns the final statistics.
    pub fn finish(mut self) -> Stats {
        self.finish_inner();
        self.stats()
    }

    fn finish_inner(&mut self) {
        let Some(shared) = self.shared.as_ref() else {
            return;
        };
        let reason = if std::thread::panicking() {
            EndReason::Panic
        } else {
            EndReason::GuardDropped
        };
        let done = shared.finish(reason, Duration::from_secs(10));
        crate::session::unregister_global(shared);
        if let Some(h) = self.handle.take()
            && done
        {
            let _ = h.join();
        }
    }

    /// Stops the writer without waiting (used when installing the subscriber failed).
    fn discard(mut self) {
        if let Some(shared) = self.shared.take() {
            shared.finish(EndReason::GuardDropped, Duration::from_secs(2));
            crate::session::unregister_global(&shared);
        }
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.finish_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_trace_path_is_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let existing = tmp.path().join("existing.pktrace");
        std::fs::write(&existing, b"precious").unwrap();
        let (_f, path) = create_trace_file(&existing, "train", 42).unwrap();
        assert_eq!(std::fs::read(&existing).unwrap(), b"precious");
        assert_eq!(path, tmp.path().join("existing-42.pktrace"));
        let (_f, again) = create_trace_file(&existing, "train", 42).unwrap();
        assert_eq!(again, tmp.path().join("existing-42-2.pktrace"));
    }
}
