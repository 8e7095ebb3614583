//! Errors of the CUDA recorder.

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

/// Why a CUDA operation could not be done.
///
/// No driver and no device are ordinary outcomes on machines without a GPU: callers
/// match on them to fall back to the CPU.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `libcuda` could not be loaded (no NVIDIA driver on this machine).
    #[error("no CUDA driver found (libcuda.so could not be loaded)")]
    NoDriver,
    /// The driver is older than the CUDA API this build uses.
    #[error(
        "the CUDA driver supports CUDA {}.{}, perfkit needs a driver for CUDA {}.{} or newer \
         (update the NVIDIA driver)",
        found / 1000, found % 1000 / 10, required / 1000, required % 1000 / 10
    )]
    DriverTooOld {
        /// `cuDriverGetVersion` (e.g. 12040 for 12.4).
        found: i32,
        /// The minimum (e.g. 12080 for 12.8).
        required: i32,
    },
    /// A CUDA library the work needs (`libcublas`) could not be loaded.
    #[error(
        "{library} not found: install the CUDA {library} library (for CUDA 13) or put it on LD_LIBRARY_PATH"
    )]
    NoLibrary {
        /// The library, e.g. `cuBLAS`.
        library: &'static str,
    },
    /// The driver is there but the requested device is not.
    #[error("no CUDA device {requested}: {available} device(s) visible")]
    NoDevice {
        /// Ordinal asked for.
        requested: usize,
        /// Devices the driver reports.
        available: usize,
    },
    /// A driver call failed.
    #[error("CUDA driver call `{op}` failed: {source}")]
    Driver {
        /// The operation (cudarc method or driver function).
        op: &'static str,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// The cuBLAS handle given to [`crate::cuda::ProfiledStream::gemm`] runs on another
    /// stream than the profiled one and could not be bound to it, so its GEMMs would not be
    /// timed where they run.
    #[error(
        "the cuBLAS handle runs on another stream than the profiled stream and could not be bound to it (make it with ProfiledStream::new_blas)"
    )]
    BlasOtherStream,
    /// A cuBLAS call failed.
    #[error("cuBLAS call `{op}` failed: {source}")]
    Blas {
        /// The operation.
        op: &'static str,
        /// cuBLAS's status code.
        #[source]
        source: CublasError,
    },
    /// A copy whose destination is smaller than its source.
    #[error("`{op}`: the destination holds {dst} elements but the source has {src}")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// Source elements.
        src: usize,
        /// Destination elements.
        dst: usize,
    },
}

impl CudaError {
    /// Whether this error means "there is no usable GPU here" (no driver, a driver too
    /// old, no device, or a CUDA library missing), as opposed to a failure of a GPU that
    /// exists.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CudaError::NoDriver
                | CudaError::NoDevice { .. }
                | CudaError::DriverTooOld { .. }
                | CudaError::NoLibrary { .. }
        )
    }
}

/// Attaches the operation name to a driver error.
pub(crate) fn driver(op: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |source| CudaError::Driver { op, source }
}
