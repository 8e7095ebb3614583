//! Finding the CUDA driver and devices without ever letting cudarc panic.
//!
//! cudarc (with dynamic loading) panics at the first driver call when `libcuda` is
//! missing, so every entry point here checks [`driver_present`] first.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::error::{CudaError, driver};
use crate::model::DeviceInfo;

/// Whether `libcuda` can be loaded in this process.
#[must_use]
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library under its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Oldest driver API version this build can use: cudarc is built for the CUDA 13.0
/// API, whose event timing entry point (`cuEventElapsedTime_v2`) first shipped with
/// CUDA 12.8 drivers; older drivers would make cudarc panic on a missing symbol.
pub const MIN_DRIVER_VERSION: i32 = 12080;

/// The CUDA version the installed driver supports (`cuDriverGetVersion`, e.g. 13000).
///
/// # Errors
/// [`CudaError::NoDriver`], or [`CudaError::Driver`] when the driver cannot answer.
pub fn driver_version() -> Result<i32, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    let mut version = 0;
    // SAFETY: the driver library is loaded (checked above) and `version` is a valid
    // out-pointer; `cuDriverGetVersion` needs no prior `cuInit`.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(driver("cuDriverGetVersion"))?;
    Ok(version)
}

/// Number of CUDA devices visible to this process.
///
/// # Errors
/// [`CudaError::NoDriver`] when `libcuda` cannot be loaded, [`CudaError::DriverTooOld`]
/// below [`MIN_DRIVER_VERSION`], [`CudaError::Driver`] when the driver fails to
/// initialise (for example a driver/kernel module mismatch).
pub fn device_count() -> Result<usize, CudaError> {
    let found = driver_version()?;
    if found < MIN_DRIVER_VERSION {
        return Err(CudaError::DriverTooOld {
            found,
            required: MIN_DRIVER_VERSION,
        });
    }
    let n = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Opens (retains the primary context of) device `ordinal`.
///
/// # Errors
/// [`CudaError::NoDriver`], [`CudaError::NoDevice`] when `ordinal` is not below
/// [`device_count`], or [`CudaError::Driver`].
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    let available = device_count()?;
    if ordinal >= available {
        return Err(CudaError::NoDevice {
            requested: ordinal,
            available,
        });
    }
    CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))
}

/// Describes the device of `ctx` (name, memory, compute capability).
///
/// # Errors
/// [`CudaError::Driver`] when the driver cannot answer.
pub fn describe(ctx: &CudaContext) -> Result<DeviceInfo, CudaError> {
    let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
    let total = ctx.total_mem().map_err(driver("cuDeviceTotalMem"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(driver("cuDeviceGetAttribute"))?;
    Ok(DeviceInfo::new(
        u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX),
        &name,
        total as u64,
        (
            u32::try_from(major).unwrap_or(0),
            u32::try_from(minor).unwrap_or(0),
        ),
    ))
}

/// Describes every visible device.
///
/// # Errors
/// As [`open_device`].
pub fn devices() -> Result<Vec<DeviceInfo>, CudaError> {
    (0..device_count()?)
        .map(|i| open_device(i).and_then(|ctx| describe(&ctx)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_every_entry_point_reports_no_driver() {
        if driver_present() {
            // With a driver, the answer is a count or a driver error, never "no driver".
            assert!(!matches!(device_count(), Err(CudaError::NoDriver)));
            return;
        }
        assert!(matches!(device_count(), Err(CudaError::NoDriver)));
        assert!(matches!(open_device(0), Err(CudaError::NoDriver)));
        assert!(matches!(devices(), Err(CudaError::NoDriver)));
        let err = open_device(0).unwrap_err();
        assert!(err.is_unavailable());
        assert_eq!(
            err.to_string(),
            "no CUDA driver found (libcuda.so could not be loaded)"
        );
    }

    #[test]
    fn an_old_driver_is_reported_with_both_versions() {
        let err = CudaError::DriverTooOld {
            found: 12040,
            required: MIN_DRIVER_VERSION,
        };
        assert_eq!(
            err.to_string(),
            "the CUDA driver supports CUDA 12.4, perfkit needs a driver for CUDA 12.8 or newer \
             (update the NVIDIA driver)"
        );
        assert!(err.is_unavailable());
        if !driver_present() {
            assert!(matches!(driver_version(), Err(CudaError::NoDriver)));
        }
    }

    #[test]
    fn a_missing_device_names_the_ordinal_and_the_count() {
        let err = CudaError::NoDevice {
            requested: 3,
            available: 1,
        };
        assert_eq!(err.to_string(), "no CUDA device 3: 1 device(s) visible");
        assert!(err.is_unavailable());
    }
}
