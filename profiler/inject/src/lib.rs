//! perfkit-inject: zero-code GPU capture for any CUDA program.
//!
//! Built as a shared library (`libperfkit_inject.so`) that the CUDA driver loads when
//! `CUDA_INJECTION64_PATH` names it: its `InitializeInjection` subscribes to CUPTI, records
//! copies (with pageable/pinned host memory), kernels, memsets, synchronizations, allocations
//! and the driver/runtime calls that issued them (joined by correlation id, with the host call
//! stack of each call), and writes them through perfkit-profiler into the same trace format a
//! linked program writes, so every report works unchanged. `perfkit profile` sets it up
//! automatically for programs that do not link perfkit-profiler (see [`host`]).
//!
//! - [`decode`]: CUPTI activity records -> plain Rust values (no GPU needed to test).
//! - [`join`]: records + API calls -> trace operations, CUPTI clock -> trace clock.
//! - [`version`]: which libcupti versions this build reads.
//! - [`locate`]: finding libcupti and reading its version.
//! - [`host`]: what the launcher calls.
//! - [`calls`], [`stack`]: watched API functions; host call stacks.
//! - `python`: the Python frames of the calling thread (Linux).

#![deny(missing_docs)]

pub mod calls;
pub mod decode;
#[cfg(target_os = "linux")]
mod entry;
#[cfg(target_os = "linux")]
pub mod host;
pub mod join;
pub mod locate;
#[cfg(target_os = "linux")]
pub mod python;
pub mod stack;
pub mod version;

#[cfg(target_os = "linux")]
pub use entry::InitializeInjection;
