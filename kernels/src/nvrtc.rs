//! Run-time compilation of the CUDA C sources with NVRTC, once per process.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::Ptx;

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
        "NVRTC (libnvrtc.so) not found: install the CUDA toolkit or \
         `pip install 'nvidia-cuda-nvrtc==13.0.88'`, and put the directory holding libnvrtc.so.13 \
         on LD_LIBRARY_PATH"
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

/// Compute capabilities this crate can name: `(major, minor, real arch, virtual arch)`.
const ARCHS: [(i32, i32, &str, &str); 22] = [
    (5, 0, "sm_50", "compute_50"),
    (5, 2, "sm_52", "compute_52"),
    (5, 3, "sm_53", "compute_53"),
    (6, 0, "sm_60", "compute_60"),
    (6, 1, "sm_61", "compute_61"),
    (6, 2, "sm_62", "compute_62"),
    (7, 0, "sm_70", "compute_70"),
    (7, 2, "sm_72", "compute_72"),
    (7, 5, "sm_75", "compute_75"),
    (8, 0, "sm_80", "compute_80"),
    (8, 6, "sm_86", "compute_86"),
    (8, 7, "sm_87", "compute_87"),
    (8, 9, "sm_89", "compute_89"),
    (9, 0, "sm_90", "compute_90"),
    (10, 0, "sm_100", "compute_100"),
    (10, 1, "sm_101", "compute_101"),
    (10, 3, "sm_103", "compute_103"),
    (11, 0, "sm_110", "compute_110"),
    (12, 0, "sm_120", "compute_120"),
    (12, 1, "sm_121", "compute_121"),
    (12, 2, "sm_122", "compute_122"),
    (12, 3, "sm_123", "compute_123"),
];

/// The real `--gpu-architecture` value for a compute capability, e.g. `sm_90` for 9.0
/// (H100, H200).
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str, NvrtcError> {
    ARCHS
        .iter()
        .find(|(ma, mi, _, _)| *ma == major && *mi == minor)
        .map(|(_, _, arch, _)| *arch)
        .ok_or(NvrtcError::UnsupportedArch { major, minor })
}

/// What to compile for a device of compute capability `major.minor`, given the
/// architectures the loaded NVRTC supports (`nvrtcGetSupportedArchs`, e.g. `90` for
/// `sm_90`).
///
/// A known architecture NVRTC supports gets a CUBIN (`sm_XX`): machine code that any
/// driver of the same CUDA major version loads, whatever NVRTC's minor version. Only a
/// device this crate or NVRTC does not know gets PTX (`compute_XX`, the newest
/// supported architecture below it), which the driver compiles itself and which it
/// rejects when NVRTC is newer than the driver.
pub fn target_for(major: i32, minor: i32, supported: &[i32]) -> Result<&'static str, NvrtcError> {
    let code = |ma: i32, mi: i32| ma * 10 + mi;
    if let Ok(arch) = arch_for(major, minor)
        && supported.contains(&code(major, minor))
    {
        return Ok(arch);
    }
    ARCHS
        .iter()
        .rev()
        .find(|(ma, mi, _, _)| (*ma, *mi) <= (major, minor) && supported.contains(&code(*ma, *mi)))
        .map(|(_, _, _, virt)| *virt)
        .ok_or(NvrtcError::UnsupportedArch { major, minor })
}

/// The architectures the loaded NVRTC can compile for (`nvrtcGetSupportedArchs`), empty
/// when it cannot be loaded or does not answer.
#[must_use]
pub fn supported_archs() -> Vec<i32> {
    use cudarc::nvrtc::sys::{self, nvrtcResult::NVRTC_SUCCESS};
    if !nvrtc_available() {
        return Vec::new();
    }
    let mut n = 0;
    // SAFETY: the library is present; the pointer is valid for one write.
    if unsafe { sys::nvrtcGetNumSupportedArchs(&raw mut n) } != NVRTC_SUCCESS || n <= 0 {
        return Vec::new();
    }
    let mut archs = vec![0; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `archs` holds the `n` ints NVRTC writes.
    if unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) } != NVRTC_SUCCESS {
        return Vec::new();
    }
    archs
}

/// What to compile for a device of compute capability `major.minor` with the loaded
/// NVRTC: [`target_for`] over [`supported_archs`].
pub fn target(major: i32, minor: i32) -> Result<&'static str, NvrtcError> {
    target_for(major, minor, &supported_archs())
}

/// Compiled kernels: a CUBIN for a real architecture (`sm_XX`), PTX for a virtual one
/// (`compute_XX`). The PTX text is kept in both cases.
#[derive(Clone, Debug)]
pub struct Image {
    arch: &'static str,
    ptx: String,
    cubin: Option<Vec<u8>>,
}

impl Image {
    /// The `--gpu-architecture` it was compiled for.
    #[must_use]
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// NVRTC's PTX for the program.
    #[must_use]
    pub fn ptx(&self) -> &str {
        &self.ptx
    }

    /// The CUBIN (an ELF image), for a real architecture.
    #[must_use]
    pub fn cubin(&self) -> Option<&[u8]> {
        self.cubin.as_deref()
    }

    /// What the driver loads: the CUBIN where there is one, else the PTX.
    #[must_use]
    pub fn module(&self) -> Ptx {
        match &self.cubin {
            Some(cubin) => Ptx::from_binary(cubin.clone()),
            None => Ptx::from_src(self.ptx.clone()),
        }
    }
}

/// Compiles [`MLP_SOURCE`] for `arch` (`sm_90`: CUBIN; `compute_90`: PTX only), once per
/// process and architecture; later calls return the cached image.
pub fn compile_mlp(arch: &'static str) -> Result<Image, NvrtcError> {
    static CACHE: OnceLock<Mutex<HashMap<&'static str, Image>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked while compiling; the map
    // itself is still consistent (entries are inserted whole).
    let mut cache = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(image) = cache.get(arch) {
        return Ok(image.clone());
    }
    let image = compile_source(MLP_SOURCE, "mlp.cu", arch)?;
    cache.insert(arch, image.clone());
    Ok(image)
}

/// Compiles any CUDA C `source` (named `name` in messages) for `arch` with the options
/// the workload uses: a CUBIN and PTX for `sm_XX`, PTX for `compute_XX`. Not cached.
pub fn compile_source(source: &str, name: &str, arch: &'static str) -> Result<Image, NvrtcError> {
    use cudarc::nvrtc::result;
    use cudarc::nvrtc::sys::{self, nvrtcResult::NVRTC_SUCCESS};

    if !nvrtc_available() {
        return Err(NvrtcError::NotFound);
    }
    let fail = |message: String| NvrtcError::Compile { arch, message };
    let src = CString::new(source).map_err(|_| fail("the source holds a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| fail("the name holds a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| fail(format!("{e:?}")))?;
    let program = Program(prog);
    let options = [
        // Keep IEEE division and square roots so the kernels match their CPU twins.
        "--ftz=false".to_string(),
        "--prec-sqrt=true".to_string(),
        "--prec-div=true".to_string(),
        format!("--gpu-architecture={arch}"),
    ];
    // SAFETY: `program.0` was created above and is destroyed only by `Program::drop`.
    if let Err(e) = unsafe { result::compile_program(program.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program.0) }.unwrap_or_default();
        return Err(fail(format!("{e:?}\n{}", text(&log).trim_end())));
    }
    // SAFETY: as above; the program compiled.
    let ptx = unsafe { result::get_ptx(program.0) }.map_err(|e| fail(format!("{e:?}")))?;
    let cubin = if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: as above; `size` is valid for one write.
        if unsafe { sys::nvrtcGetCUBINSize(program.0, &raw mut size) } != NVRTC_SUCCESS {
            return Err(fail("nvrtcGetCUBINSize failed".into()));
        }
        let mut bytes = vec![0u8; size];
        // SAFETY: `bytes` holds the `size` bytes NVRTC writes.
        if unsafe { sys::nvrtcGetCUBIN(program.0, bytes.as_mut_ptr().cast()) } != NVRTC_SUCCESS {
            return Err(fail("nvrtcGetCUBIN failed".into()));
        }
        Some(bytes)
    } else {
        None
    };
    Ok(Image {
        arch,
        ptx: text(&ptx),
        cubin,
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(cudarc::nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(self.0) };
    }
}

/// A NUL-terminated C string from NVRTC as text.
fn text(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c.cast_unsigned())
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
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
    fn a_known_supported_device_gets_a_cubin_and_an_unknown_one_ptx() {
        // NVRTC 13.0's list.
        let nvrtc13 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(target_for(9, 0, &nvrtc13).ok(), Some("sm_90"));
        assert_eq!(target_for(8, 0, &nvrtc13).ok(), Some("sm_80"));
        // A device newer than anything known: PTX for the newest architecture below it.
        assert_eq!(target_for(13, 0, &nvrtc13).ok(), Some("compute_121"));
        assert_eq!(target_for(9, 5, &nvrtc13).ok(), Some("compute_90"));
        // Known here but dropped by this NVRTC, with nothing older it supports.
        assert!(matches!(
            target_for(7, 0, &nvrtc13),
            Err(NvrtcError::UnsupportedArch { major: 7, minor: 0 })
        ));
        assert!(target_for(9, 0, &[]).is_err());
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
