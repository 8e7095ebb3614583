//! Compiles every kernel source with NVRTC, the way the GPU path does at run time.
//!
//! This needs `libnvrtc` but no GPU. The build script checks whether the library can
//! be loaded: where it can (or where `PERFKIT_REQUIRE_NVRTC=1` is set) these are
//! ordinary tests; where it cannot, they are reported as ignored with the reason,
//! never as passed. With `PERFKIT_REQUIRE_NVRTC=1` and no library they fail.

use perfkit_kernels::nvrtc::{self, KERNEL_NAMES, NvrtcError};

fn require_nvrtc() {
    assert!(
        nvrtc::nvrtc_available(),
        "libnvrtc cannot be loaded by cudarc (searched libnvrtc.so, libnvrtc.so.13, ... on \
         LD_LIBRARY_PATH and the system paths); install it with `pip install nvidia-cuda-nvrtc==13.0.88` \
         and add site-packages/nvidia/cu13/lib to LD_LIBRARY_PATH"
    );
}

#[test]
#[cfg_attr(
    not(perfkit_nvrtc_test),
    ignore = "libnvrtc not found at build time: pip install nvidia-cuda-nvrtc==13.0.88, add nvidia/cu13/lib to LD_LIBRARY_PATH"
)]
fn every_kernel_compiles_to_a_cubin_for_hopper_and_ampere() {
    require_nvrtc();
    for arch in ["sm_90", "sm_80"] {
        let image = nvrtc::compile_mlp(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(image.arch(), arch);
        // Machine code, which a driver of the same CUDA major version loads whatever
        // NVRTC's minor version; PTX from a newer NVRTC is rejected by an older driver.
        let cubin = image.cubin().unwrap_or_else(|| panic!("{arch}: no CUBIN"));
        assert_eq!(
            &cubin[..4],
            b"\x7fELF",
            "{arch}: the CUBIN is not an ELF image"
        );
        let ptx = image.ptx();
        assert!(
            ptx.contains(&format!(".target {arch}")),
            "{arch}: PTX has the wrong target"
        );
        for name in KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch}: no entry for {name}"
            );
            assert!(
                cubin.windows(name.len()).any(|w| w == name.as_bytes()),
                "{arch}: no symbol {name} in the CUBIN"
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(perfkit_nvrtc_test),
    ignore = "libnvrtc not found at build time: pip install nvidia-cuda-nvrtc==13.0.88, add nvidia/cu13/lib to LD_LIBRARY_PATH"
)]
fn hopper_gets_a_cubin_from_the_loaded_nvrtc_and_an_unknown_device_ptx() {
    require_nvrtc();
    let supported = nvrtc::supported_archs();
    assert!(
        supported.contains(&90),
        "NVRTC does not list sm_90: {supported:?}"
    );
    // What `GpuKernels::load` compiles for an H100/H200.
    assert_eq!(nvrtc::target(9, 0).expect("target"), "sm_90");
    // A device newer than any this crate names falls back to PTX, compiled by the driver.
    let fallback = nvrtc::target(99, 0).expect("target");
    assert!(fallback.starts_with("compute_"), "{fallback}");
    let image = nvrtc::compile_mlp(fallback).expect("compile");
    assert!(image.cubin().is_none());
    assert!(image.ptx().contains(".entry sgd_momentum("));
}

#[test]
#[cfg_attr(
    not(perfkit_nvrtc_test),
    ignore = "libnvrtc not found at build time: pip install nvidia-cuda-nvrtc==13.0.88, add nvidia/cu13/lib to LD_LIBRARY_PATH"
)]
fn compiled_images_are_cached_per_process() {
    require_nvrtc();
    let first = nvrtc::compile_mlp("sm_90").expect("compile");
    let second = nvrtc::compile_mlp("sm_90").expect("compile");
    assert_eq!(first.ptx(), second.ptx());
    assert_eq!(first.cubin(), second.cubin());
}

#[test]
#[cfg_attr(
    not(perfkit_nvrtc_test),
    ignore = "libnvrtc not found at build time: pip install nvidia-cuda-nvrtc==13.0.88, add nvidia/cu13/lib to LD_LIBRARY_PATH"
)]
fn a_compile_error_names_the_line_of_the_source() {
    require_nvrtc();
    let broken = "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n";
    let err = nvrtc::compile_source(broken, "broken.cu", "sm_90").expect_err("must not compile");
    let NvrtcError::Compile { arch, message } = err else {
        panic!("unexpected error {err}");
    };
    assert_eq!(arch, "sm_90");
    assert!(
        message.contains("broken.cu(2)"),
        "log does not name the line: {message}"
    );
    assert!(
        message.contains("undefined_name"),
        "log does not name the identifier: {message}"
    );
}

#[test]
#[cfg_attr(
    not(perfkit_nvrtc_test),
    ignore = "libnvrtc not found at build time: pip install nvidia-cuda-nvrtc==13.0.88, add nvidia/cu13/lib to LD_LIBRARY_PATH"
)]
fn the_nvrtc_version_is_read_for_the_driver_check() {
    require_nvrtc();
    let v = nvrtc::version().expect("nvrtcVersion answers");
    // The PTX it writes is what a driver must be new enough to load: CUDA 13 here.
    assert!((13000..14000).contains(&v), "NVRTC {v}");
    assert_eq!(v % 10, 0, "major * 1000 + minor * 10: {v}");
}
