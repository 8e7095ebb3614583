//! The CUDA recorder: cudarc operations timed with CUDA events and written into the
//! trace (feature `cuda`, on by default).
//!
//! Wrap a stream in [`ProfiledStream`] and issue work through it instead of through
//! the `CudaStream`; the method names and signatures are cudarc's:
//!
//! ```no_run
//! # fn main() -> Result<(), perfkit_profiler::cuda::CudaError> {
//! use perfkit_profiler::cuda::{self, ProfiledStream};
//!
//! let _perfkit = perfkit_profiler::init();
//! let ctx = cuda::open_device(0)?; // a clear error, not a panic, without a GPU
//! let stream = ProfiledStream::new(ctx.default_stream())?;
//! let x = stream.clone_htod(&vec![1.0f32; 1024])?; // recorded: H2D, 4096 bytes, pageable
//! stream.synchronize()?; // recorded: host time blocked
//! # drop(x);
//! # Ok(())
//! # }
//! ```
//!
//! What is recorded per operation: kind (H2D, D2H, D2D, memset, kernel, synchronize,
//! alloc, free), bytes, pinned or pageable host memory, stream, host start and end of
//! the call, GPU start and end (CUDA events, on the host clock), the caller's source
//! location and the innermost `tracing` span entered on the calling thread.
//!
//! How GPU times are measured:
//! - Copies, memsets, kernels and cuBLAS calls are bracketed by two timing-enabled
//!   events (`CU_EVENT_DEFAULT`; cudarc's `new_event(None)` would disable timing) taken
//!   from a pool of at most 4096 per stream. When all are in flight, operations are
//!   still recorded, without GPU times ([`ProfiledStream::untimed_ops`]).
//! - Finished operations are found by `cuEventQuery` on the oldest one whenever the
//!   stream is used, polled ([`ProfiledStream::poll`]) or synchronized: the recorder
//!   never blocks on the GPU by itself.
//! - GPU timestamps are `elapsed(reference, event)` after a reference event whose host
//!   time is known: it is recorded on the idle stream and polled until complete (a few
//!   microseconds), and its host time is the middle of that window. The reference is
//!   refreshed once it is more than a second old (clock drift) whenever the stream is
//!   idle: after a synchronize, an event wait or a blocking copy; the drift of the reference
//!   replaced is written to the trace as a `perfkit.clock_drift` event,
//!   and a resolved event more than a second after it becomes the new reference, so
//!   `f32` milliseconds never span long intervals.
//! - A copy to pageable host memory (`clone_dtoh`, `memcpy_dtoh` into a `Vec`) returns only
//!   once it is over, so its end event, recorded after the call, would add the host round
//!   trip: its GPU end is bounded by the host return, and the trace says so
//!   ([`GpuEvent::gpu_end_at_host_return`](crate::model::GpuEvent::gpu_end_at_host_return)).
//! - Synchronizations and allocations have host times only; device memory in use is
//!   sampled after allocations and synchronizations, at most every 10 ms.
//!
//! cudarc panics at the first driver call when `libcuda` is missing, so the entry
//! points ([`open_device`], [`device_count`], [`devices`]) check for the driver first
//! and return [`CudaError::NoDriver`] or [`CudaError::NoDevice`], which
//! [`CudaError::is_unavailable`] tells apart from failures of a GPU that exists.

#![warn(missing_docs)]

mod error;
mod host;
mod probe;
mod stream;
mod timing;

pub use error::CudaError;
pub use host::HostBuffer;
pub use probe::{
    MIN_DRIVER_VERSION, describe, device_count, devices, driver_present, driver_version,
    open_device,
};
pub use stream::{ProfiledLaunch, ProfiledStream};
