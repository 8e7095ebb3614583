//! Which libcupti versions this build can read.
//!
//! CUPTI writes activity records as the structs of the `cupti_activity.h` it was built from.
//! This crate decodes the layouts of the CUPTI 13.0 headers (`CUpti_ActivityMemcpy6`,
//! `CUpti_ActivityKernel10`, `CUpti_ActivityMemset4`, `CUpti_ActivityMemory4`,
//! `CUpti_ActivitySynchronization2`, `CUpti_ActivityAPI`, `CUpti_ActivityMemcpyPtoP4`). The 13.x headers (13.0 to 13.4) only
//! append fields to those records (`CUpti_ActivityKernel11..13` and `CUpti_ActivityMemcpy7` /
//! `CUpti_ActivityMemset5` keep the 13.0 prefix), so any CUPTI 13.x is read correctly. CUPTI 12.x
//! and older use other layouts (CUPTI 12.8's `CUpti_ActivityMemcpy6` differs from 13.0's), and
//! a future major may change them again: both are refused with a message instead of misread.

use cudarc::cupti::sys;

/// The `CUPTI_API_VERSION` of the headers the record layouts come from.
pub const BUILT_FOR: u32 = sys::CUPTI_API_VERSION;

/// A libcupti this build must not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Older than the layouts this build reads.
    #[error(
        "libcupti {loaded} is older than CUPTI {built}: its activity records have other layouts; \
         use the CUPTI of a CUDA 13 toolkit (or the `nvidia-cuda-cupti` 13.x wheel) with a CUDA 13 driver"
    )]
    TooOld {
        /// The loaded version, as text.
        loaded: String,
        /// The version the layouts come from, as text.
        built: String,
    },
    /// A newer major version whose layouts are unknown to this build.
    #[error(
        "libcupti {loaded} is newer than the CUPTI {built} layouts this perfkit was built for; \
         refusing to misread its records (update perfkit, or point PERFKIT_CUPTI_PATH at a CUPTI 13.x)"
    )]
    TooNew {
        /// The loaded version, as text.
        loaded: String,
        /// The version the layouts come from, as text.
        built: String,
    },
}

/// Human-readable form of a `CUPTI_API_VERSION` value: `13.0.1` for the 13.x scheme
/// (`major * 10000 + minor * 100 + patch`), `API version 28 (CUDA 12.x or older)` before it.
pub fn describe(version: u32) -> String {
    if version >= 10_000 {
        format!(
            "{}.{}.{}",
            version / 10_000,
            (version / 100) % 100,
            version % 100
        )
    } else {
        format!("API version {version} (CUDA 12.x or older)")
    }
}

/// Major CUDA version of a `CUPTI_API_VERSION` value in the 13.x scheme, None before it.
pub fn major(version: u32) -> Option<u32> {
    (version >= 10_000).then_some(version / 10_000)
}

/// Checks a loaded libcupti's `cuptiGetVersion` against the layouts of this build.
pub fn check(loaded: u32) -> Result<(), VersionError> {
    let built_major = major(BUILT_FOR);
    let err_args = || (describe(loaded), describe(BUILT_FOR));
    match (major(loaded), built_major) {
        (Some(l), Some(b)) if l == b => Ok(()),
        (Some(l), Some(b)) if l > b => {
            let (loaded, built) = err_args();
            Err(VersionError::TooNew { loaded, built })
        }
        _ => {
            let (loaded, built) = err_args();
            Err(VersionError::TooOld { loaded, built })
        }
    }
}

/// Checks only a major version (from a library's soname, read without loading it): the same
/// major as the layouts is accepted here and checked exactly once the library is loaded.
pub fn check_major(loaded_major: u32) -> Result<(), VersionError> {
    let built = major(BUILT_FOR).unwrap_or(0);
    // Year-style library versions (libcupti.so.2024.x) predate the 13.x scheme.
    let text = |m: u32| {
        if m >= 1000 {
            format!("{m}.x (CUDA 12.x or older)")
        } else {
            format!("{m}.x")
        }
    };
    if loaded_major == built {
        Ok(())
    } else if loaded_major > built && loaded_major < 1000 {
        Err(VersionError::TooNew {
            loaded: text(loaded_major),
            built: describe(BUILT_FOR),
        })
    } else {
        Err(VersionError::TooOld {
            loaded: text(loaded_major),
            built: describe(BUILT_FOR),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_for_cuda_13() {
        assert_eq!(major(BUILT_FOR), Some(13));
        assert_eq!(describe(BUILT_FOR), "13.0.1");
    }

    #[test]
    fn accepts_every_13x() {
        for v in [130001, 130101, 130202, 130301, 130401, 139999] {
            assert_eq!(check(v), Ok(()), "{v}");
        }
    }

    #[test]
    fn refuses_12x_and_older() {
        for v in [14, 18, 26, 28] {
            let e = check(v).unwrap_err();
            assert!(matches!(e, VersionError::TooOld { .. }), "{v}");
            let msg = e.to_string();
            assert!(msg.contains("(CUDA 12.x or older)"), "{msg}");
            assert!(msg.contains("13.0.1"), "{msg}");
        }
    }

    #[test]
    fn refuses_next_major() {
        let e = check(140001).unwrap_err();
        assert!(matches!(e, VersionError::TooNew { .. }));
        assert!(e.to_string().contains("libcupti 14.0.1 is newer"), "{e}");
    }

    #[test]
    fn major_only_checks() {
        assert_eq!(check_major(13), Ok(()));
        assert!(matches!(check_major(12), Err(VersionError::TooOld { .. })));
        assert!(matches!(
            check_major(2024),
            Err(VersionError::TooOld { .. })
        ));
        let e = check_major(14).unwrap_err();
        assert!(e.to_string().contains("libcupti 14.x is newer"), "{e}");
    }

    #[test]
    fn describes_versions() {
        assert_eq!(describe(130401), "13.4.1");
        assert_eq!(describe(28), "API version 28 (CUDA 12.x or older)");
    }
}
