//! perfkit-profiler: records what a training program does, with almost no overhead.
//!
//! Add three lines to a program and run it under `perfkit profile`:
//!
//! ```no_run
//! let _perfkit = perfkit_profiler::init(); // first line of main; keep the guard alive
//! for step in 0..10 {
//!     let _s = tracing::info_span!("step", step).entered();
//!     // ... one training step ...
//! }
//! ```
//!
//! With `PERFKIT_TRACE` set, [`init`] installs a `tracing` subscriber whose [`PerfLayer`] records
//! every span into per-thread buffers; a background thread writes them to a trace file (format in
//! `docs/trace-format.md`), read back by [`TraceReader`]. Without `PERFKIT_TRACE` it does nothing.
//!
//! - [`model`]: what a trace holds ([`Header`], [`Record`] and the GPU event kinds).
//! - [`reader`]: streaming reader with byte-offset errors; [`trace_files`] lists a trace directory.
//! - [`mod@recorder`]: record GPU operations (and other external events) from any thread.
//! - [`encode::TraceWriter`]: write traces synchronously (tools, tests, synthetic traces).
//! - [`pystep`]: training steps of a Python trace without step spans, from its optimizer steps.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod encode;
pub mod format;
mod init;
#[cfg(unix)]
pub mod launch;
mod layer;
pub mod model;
pub mod pystep;
pub mod reader;
pub mod recorder;
mod session;
pub mod summary;
mod sys;
mod writer;

/// The `tracing` crate whose spans perfkit records, re-exported so that an instrumented program
/// needs no dependency of its own: `use perfkit_profiler::tracing::info_span;`.
pub use tracing;

pub use encode::TraceWriter;
pub use init::{BoxedLayer, Builder, Guard, InitError, Stats, TRACE_ENV, init};
pub use layer::PerfLayer;
pub use model::{Header, Record, SpanId};
pub use reader::{ReadError, TraceReader, TraceStatus, trace_files};
pub use recorder::recorder;
