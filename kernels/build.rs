//! Detects whether NVRTC (`libnvrtc`) can be loaded on the build machine, so the
//! NVRTC compile test runs as a normal test where it can and is reported as ignored
//! (with the reason) where it cannot. `PERFKIT_REQUIRE_NVRTC=1` forces the test to
//! run, and fail, when the library is missing.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(perfkit_nvrtc_test)");
    println!("cargo::rerun-if-env-changed=LD_LIBRARY_PATH");
    println!("cargo::rerun-if-env-changed=PERFKIT_REQUIRE_NVRTC");
    println!("cargo::rerun-if-changed=build.rs");
    // The names cudarc's dynamic loader tries first for CUDA 13 (see
    // `cudarc::get_lib_name_candidates`); the full list also has 32-bit and Windows forms.
    let candidates = [
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11",
        "libnvrtc.so.1",
    ];
    let found = candidates.iter().any(|name| {
        // SAFETY: loading NVRTC runs its library initialisers, which have no
        // preconditions; the handle is dropped (unloaded) right away.
        unsafe { libloading::Library::new(*name) }.is_ok()
    });
    let required = std::env::var("PERFKIT_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if found || required {
        println!("cargo::rustc-cfg=perfkit_nvrtc_test");
    }
}
