//! Run-time compilation of the CUDA C sources with NVRTC, once per process.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{CompileOptions, Ptx};

/// The CUDA C source of every kernel of the reference workload.
pub const MLP_SOURCE: &str = include_str!("cuda/mlp.cu");

/// Names of the kernels defined in [`MLP_SOURCE`] (all `extern "C"`).
pub const KERNEL_NAMES: [&str; 7] = [
    "fill_uniform",
    "synth_batch",
    "bias_act_fwd",
    "bias_act_bwd",
    "softmax_xent_fwd",
    "softmax_xent_bwd",
    "sgd_momentum",
];

/// Block height of `bias_act_bwd` (`PK_BWD_ROWS` in the source).
pub const BIAS_BWD_ROWS: u32 = 8;
/// Threads of the single block of `softmax_xent_fwd` (`PK_XENT_THREADS` in the source).
pub const XENT_THREADS: u32 = 256;

/// Why the kernels could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// `libnvrtc` could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so) not found: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`, \
         and put the directory holding libnvrtc.so.13 on LD_LIBRARY_PATH"
    )]
    NotFound,
    /// The architecture is not one this crate knows how to name.
    #[error(
        "unsupported GPU architecture sm_{major}{minor}: expected compute capability 5.0 to 12.x"
    )]
    UnsupportedArch {
        /// Compute capability major version.
        major: i32,
        /// Compute capability minor version.
        minor: i32,
    },
    /// NVRTC rejected the source; the log names the line.
    #[error("NVRTC failed to compile the kernels for {arch}: {message}")]
    Compile {
        /// The `--gpu-architecture` passed.
        arch: &'static str,
        /// NVRTC's error and log.
        message: String,
    },
}

/// Whether `libnvrtc` can be loaded by cudarc's dynamic loader in this process.
#[must_use]
pub fn nvrtc_available() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The loaded NVRTC's version as `major * 1000 + minor * 10` (13000 for 13.0), `None` when
/// it cannot be loaded or does not answer.
#[must_use]
pub fn version() -> Option<i32> {
    if !nvrtc_available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&raw mut major, &raw mut minor) };
    (rc == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some(major * 1000 + minor * 10)
}

/// The `--gpu-architecture` value for a compute capability, e.g. `sm_90` for 9.0
/// (H100, H200).
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str, NvrtcError> {
    const ARCHS: [(i32, i32, &str); 22] = [
        (5, 0, "sm_50"),
        (5, 2, "sm_52"),
        (5, 3, "sm_53"),
        (6, 0, "sm_60"),
        (6, 1, "sm_61"),
        (6, 2, "sm_62"),
        (7, 0, "sm_70"),
        (7, 2, "sm_72"),
        (7, 5, "sm_75"),
        (8, 0, "sm_80"),
        (8, 6, "sm_86"),
        (8, 7, "sm_87"),
        (8, 9, "sm_89"),
        (9, 0, "sm_90"),
        (10, 0, "sm_100"),
        (10, 1, "sm_101"),
        (10, 3, "sm_103"),
        (11, 0, "sm_110"),
        (12, 0, "sm_120"),
        (12, 1, "sm_121"),
        (12, 2, "sm_122"),
        (12, 3, "sm_123"),
    ];
    ARCHS
        .iter()
        .find(|(ma, mi, _)| *ma == major && *mi == minor)
        .map(|(_, _, arch)| *arch)
        .ok_or(NvrtcError::UnsupportedArch { major, minor })
}

/// Compiles [`MLP_SOURCE`] to PTX for `arch` (e.g. `"sm_90"`), once per process and
/// architecture; later calls return the cached PTX.
pub fn compile_mlp(arch: &'static str) -> Result<Ptx, NvrtcError> {
    static CACHE: OnceLock<Mutex<HashMap<&'static str, Ptx>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked while compiling; the map
    // itself is still consistent (entries are inserted whole).
    let mut cache = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(ptx) = cache.get(arch) {
        return Ok(ptx.clone());
    }
    let ptx = compile_source(MLP_SOURCE, "mlp.cu", arch)?;
    cache.insert(arch, ptx.clone());
    Ok(ptx)
}

/// Compiles any CUDA C `source` (named `name` in messages) to PTX for `arch` with the
/// options the workload uses. Not cached.
pub fn compile_source(source: &str, name: &str, arch: &'static str) -> Result<Ptx, NvrtcError> {
    if !nvrtc_available() {
        return Err(NvrtcError::NotFound);
    }
    let opts = CompileOptions {
        arch: Some(arch),
        // Keep IEEE division and square roots so the kernels match their CPU twins.
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        name: Some(name.to_string()),
        ..CompileOptions::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| NvrtcError::Compile {
        arch,
        message: describe(&e),
    })
}

/// NVRTC's error with its compile log as text (cudarc's `Display` prints the log as
/// escaped bytes).
fn describe(error: &cudarc::nvrtc::CompileError) -> String {
    match error {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            format!("{nvrtc:?}\n{}", log.to_string_lossy().trim_end())
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hopper_maps_to_sm_90() {
        assert_eq!(arch_for(9, 0).ok(), Some("sm_90"));
        assert_eq!(arch_for(8, 0).ok(), Some("sm_80"));
        assert!(matches!(
            arch_for(4, 0),
            Err(NvrtcError::UnsupportedArch { major: 4, minor: 0 })
        ));
    }

    #[test]
    fn every_kernel_name_is_defined_extern_c_in_the_source() {
        for name in KERNEL_NAMES {
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert!(MLP_SOURCE.contains(&decl), "{name} missing from mlp.cu");
        }
        assert_eq!(MLP_SOURCE.matches("__global__").count(), KERNEL_NAMES.len());
    }

    #[test]
    fn launch_constants_match_the_source() {
        assert!(MLP_SOURCE.contains(&format!("#define PK_BWD_ROWS {BIAS_BWD_ROWS}")));
        assert!(MLP_SOURCE.contains(&format!("#define PK_XENT_THREADS {XENT_THREADS}")));
    }
}
