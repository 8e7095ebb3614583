//! perfkit-sampler: what the GPUs are doing, through NVML.
//!
//! - [`devices::query`]: each GPU's name, memory, utilization, clocks and power, the driver
//!   and CUDA versions, and a suggested `CUDA_VISIBLE_DEVICES` order (for `perfkit devices`).
//! - [`Sampler`]: samples every GPU every 100 ms (utilization, memory used, SM clock, power)
//!   into a trace file of its own while `perfkit profile` runs the program.
//!
//! NVML (`libnvidia-ml.so.1`, part of the NVIDIA driver) is loaded at run time: on a machine
//! without the driver every entry point returns [`NvmlUnavailable`]-style errors that say so,
//! and nothing panics.

#![deny(missing_docs)]

pub mod devices;
pub mod ordinals;
mod sampler;

pub use sampler::{
    SAMPLER_PROGRAM, SAMPLER_ROLE, SampleWriter, Sampler, SamplerError, SamplerOptions,
    SamplerStats,
};

/// Why NVML could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlUnavailable {
    /// The NVIDIA driver (and with it NVML) is not installed.
    #[error("no NVIDIA driver found ({detail})")]
    NoDriver {
        /// The loader's or NVML's message.
        detail: String,
    },
    /// NVML loaded but failed.
    #[error("NVML failed: {0}")]
    Nvml(String),
}

/// Initialises NVML, classifying the failure.
pub(crate) fn init_nvml() -> Result<nvml_wrapper::Nvml, NvmlUnavailable> {
    use nvml_wrapper::error::NvmlError;
    nvml_wrapper::Nvml::init().map_err(|e| match e {
        NvmlError::LibloadingError(l) => NvmlUnavailable::NoDriver {
            detail: l.to_string(),
        },
        NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => NvmlUnavailable::NoDriver {
            detail: e.to_string(),
        },
        other => NvmlUnavailable::Nvml(other.to_string()),
    })
}
