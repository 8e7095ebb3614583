//! Checks against a real libcupti (no GPU needed): the NVIDIA `nvidia-cuda-cupti` wheel or a
//! toolkit's copy, named by `PERFKIT_TEST_CUPTI` (the `libcupti.so.13` file). Run with
//! `PERFKIT_TEST_CUPTI=/path/to/libcupti.so.13 cargo test -p perfkit-inject --test real_cupti -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

use perfkit_inject::calls::{self, Domain, Watch};
use perfkit_inject::locate::{self, ProbeError, SearchEnv};
use perfkit_inject::version;

fn cupti() -> PathBuf {
    let p = std::env::var_os("PERFKIT_TEST_CUPTI")
        .map(PathBuf::from)
        .expect("set PERFKIT_TEST_CUPTI to a libcupti.so.13 (pip install nvidia-cuda-cupti)");
    assert!(p.is_file(), "{} is not a file", p.display());
    p
}

fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[test]
#[ignore = "needs a real libcupti: set PERFKIT_TEST_CUPTI (pip install nvidia-cuda-cupti)"]
fn the_search_finds_a_wheel_and_reads_its_major_without_loading_it() {
    let lib = cupti();
    assert_eq!(locate::elf_soname(&lib).as_deref(), Some("libcupti.so.13"));
    assert_eq!(version::check_major(13), Ok(()));
    // In the wheel layout (site-packages/nvidia/cu13/lib/libcupti.so.13) the search finds it
    // through its site-packages directory.
    let lib_dir = lib.parent().unwrap();
    if lib_dir.ends_with("nvidia/cu13/lib") {
        let site = lib_dir.ancestors().nth(3).unwrap().to_path_buf();
        let env = SearchEnv {
            site_packages: vec![site],
            root: PathBuf::from("/nonexistent-root"),
            ..SearchEnv::default()
        };
        let r = locate::search(&env);
        assert_eq!(
            r.found.as_deref(),
            Some(lib.as_path()),
            "{}",
            r.looked_lines()
        );
    }
}

#[test]
#[ignore = "needs a real libcupti: set PERFKIT_TEST_CUPTI (pip install nvidia-cuda-cupti)"]
fn probing_reads_the_version_or_explains_the_missing_driver() {
    let lib = cupti();
    match locate::probe_version(&lib) {
        Ok(v) => {
            // CUPTI 13.0 answers without a driver too (13.5 does not): the version is read
            // either way, and the injection library refuses on its own check of the driver.
            version::check(v).unwrap();
            assert_eq!(version::major(v), Some(13));
        }
        Err(e @ ProbeError::Call { code: 999, .. }) => {
            assert!(!driver_present(), "{e}");
            assert!(e.to_string().contains("is a CUDA driver installed?"), "{e}");
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "needs a real libcupti: set PERFKIT_TEST_CUPTI (pip install nvidia-cuda-cupti)"]
fn the_injection_library_loads_the_named_libcupti_and_refuses_cleanly_without_a_driver() {
    if std::env::var_os("PERFKIT_INJECT_TEST_CHILD").is_some() {
        return child_main();
    }
    if driver_present() {
        // With a driver the library records; that path is covered by the GPU tests.
        return;
    }
    let lib = cupti();
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let inject = [dir, dir.parent().unwrap()]
        .iter()
        .map(|d| d.join("libperfkit_inject.so"))
        .find(|p| p.is_file())
        .expect("libperfkit_inject.so built");
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("trace");
    let out = Command::new(exe.as_path())
        .args([
            "the_injection_library_loads_the_named_libcupti_and_refuses_cleanly_without_a_driver",
            "--exact",
            "--nocapture",
            "--ignored",
        ])
        .env("PERFKIT_INJECT_TEST_CHILD", "1")
        .env("PERFKIT_INJECT_TEST_LIB", &inject)
        .env("PERFKIT_TRACE", &trace)
        .env("PERFKIT_CUPTI_PATH", &lib)
        .env("PERFKIT_TEST_CUPTI", &lib)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("returned 1"), "{stdout}");
    assert!(
        stderr.contains("not recording: libcupti cannot initialise without a CUDA driver"),
        "{stderr}"
    );
    assert!(!Path::new(&trace).exists());
}

/// In the child process: load the injection library and call its entry point.
fn child_main() {
    let path = std::env::var_os("PERFKIT_INJECT_TEST_LIB").unwrap();
    // SAFETY: loading the injection library; its initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    // SAFETY: `int InitializeInjection(void)`.
    let init =
        unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"InitializeInjection\0") }.unwrap();
    // SAFETY: as the driver calls it.
    println!("returned {}", unsafe { init() });
    std::mem::forget(lib);
}

/// The callback names of a `cupti_*_cbid.h` header (`CUPTI_DRIVER_TRACE_CBID_<name> = <id>`).
fn header_names(path: &Path, prefix: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the wheel ships include/ next to lib/)",
            path.display()
        )
    });
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(prefix))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|n| *n != "INVALID" && *n != "SIZE" && *n != "FORCE_INT")
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs a real libcupti: set PERFKIT_TEST_CUPTI (pip install nvidia-cuda-cupti)"]
fn the_watched_calls_from_the_real_callback_names() {
    let lib = cupti();
    let include = lib.parent().unwrap().parent().unwrap().join("include");
    let driver = header_names(
        &include.join("cupti_driver_cbid.h"),
        "CUPTI_DRIVER_TRACE_CBID_",
    );
    let runtime = header_names(
        &include.join("cupti_runtime_cbid.h"),
        "CUPTI_RUNTIME_TRACE_CBID_",
    );
    assert!(
        driver.len() > 500 && runtime.len() > 300,
        "{} {}",
        driver.len(),
        runtime.len()
    );
    let class = |d: Domain, n: &str| calls::classify(d, n);
    for n in &driver {
        let c = class(Domain::Driver, n);
        if n.starts_with("cuMemcpy") || n.starts_with("cuMemset") {
            assert_eq!(c, Some(Watch::Work), "{n}");
        }
        if n.starts_with("cuLaunchKernel") {
            assert_eq!(c, Some(Watch::Launch), "{n}");
        }
        if n.starts_with("cuGraphLaunch") {
            assert_eq!(c, Some(Watch::GraphLaunch), "{n}");
        }
        if n.starts_with("cuMemAllocHost")
            || n.starts_with("cuMemHostAlloc")
            || n.starts_with("cuCtxGet")
        {
            assert_eq!(c, None, "{n}");
        }
    }
    for n in &runtime {
        let c = class(Domain::Runtime, n);
        if n.starts_with("cudaMemcpy") || n.starts_with("cudaMemset") {
            assert_eq!(c, Some(Watch::Work), "{n}");
        }
        if n.starts_with("cudaLaunchKernel") {
            assert_eq!(c, Some(Watch::Launch), "{n}");
        }
        if n.starts_with("cudaGraphLaunch") {
            assert_eq!(c, Some(Watch::GraphLaunch), "{n}");
        }
        if n.starts_with("cudaMallocHost")
            || n.starts_with("cudaHostAlloc")
            || n.starts_with("cudaGetDevice")
        {
            assert_eq!(c, None, "{n}");
        }
    }
    for (d, names, must) in [
        (
            Domain::Driver,
            &driver,
            [
                "cuStreamSynchronize",
                "cuCtxSynchronize",
                "cuEventSynchronize",
                "cuMemAlloc_v2",
                "cuMemFree_v2",
                "cuMemAllocAsync",
            ],
        ),
        (
            Domain::Runtime,
            &runtime,
            [
                "cudaStreamSynchronize_v3020",
                "cudaDeviceSynchronize_v3020",
                "cudaEventSynchronize_v3020",
                "cudaMalloc_v3020",
                "cudaFree_v3020",
                "cudaMallocAsync_v11020",
            ],
        ),
    ] {
        for n in must {
            assert!(names.iter().any(|x| x == n), "{n} not in the header");
            assert_eq!(class(d, n), Some(Watch::Work), "{n}");
        }
    }
    assert_eq!(
        class(Domain::Driver, "cuProfilerStop"),
        Some(Watch::ProfilerStop)
    );
    assert!(driver.iter().any(|n| n == "cuProfilerStop"));
}

/// The CUDA headers `cupti_activity.h` includes (`cuda.h`, `crt/host_defines.h`, ...), from the
/// `nvidia-cuda-runtime` and `nvidia-cuda-crt` wheels, named by `PERFKIT_TEST_CUDA_INCLUDE`.
fn cuda_include() -> PathBuf {
    let p = std::env::var_os("PERFKIT_TEST_CUDA_INCLUDE")
        .map(PathBuf::from)
        .expect(
            "set PERFKIT_TEST_CUDA_INCLUDE to an include directory holding cuda.h and crt/ \
             (pip install --target DIR nvidia-cuda-runtime nvidia-cuda-crt; DIR/nvidia/cu13/include)",
        );
    assert!(p.join("cuda.h").is_file(), "no cuda.h in {}", p.display());
    p
}

/// `(C expression, value the decoder uses)` for each struct field the decoder reads, and for
/// each record size it walks buffers with. The C side is compiled against the wheel's own
/// `cupti_activity.h`; the Rust side is what `perfkit_inject::decode` reads from.
fn decoder_layout() -> Vec<(String, usize)> {
    use cudarc::cupti::sys;
    use perfkit_inject::decode::{self, kind};
    use std::mem::offset_of;

    let mut v: Vec<(String, usize)> = Vec::new();
    macro_rules! fields {
        ($t:ident: $($f:ident $(as $c:literal)?),+ $(,)?) => {
            $(
                let c_field = fields!(@name $f $(, $c)?);
                v.push((
                    format!("offsetof({}, {})", stringify!($t), c_field),
                    offset_of!(sys::$t, $f),
                ));
            )+
        };
        (@name $f:ident) => { stringify!($f) };
        (@name $f:ident, $c:literal) => { $c };
    }
    fields!(CUpti_ActivityMemcpy6: copyKind, srcKind, dstKind, bytes, start, end, deviceId,
        contextId, streamId, correlationId, runtimeCorrelationId);
    fields!(CUpti_ActivityMemcpyPtoP4: copyKind, srcKind, dstKind, bytes, start, end, deviceId,
        contextId, streamId, correlationId, srcDeviceId, srcContextId, dstDeviceId, dstContextId);
    fields!(CUpti_ActivityKernel10: name, start, end, deviceId, contextId, streamId, gridX, gridY,
        gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, correlationId);
    fields!(CUpti_ActivityMemset4: bytes, value, start, end, deviceId, contextId, streamId,
        correlationId, memoryKind);
    fields!(CUpti_ActivitySynchronization2: type_ as "type", start, end, correlationId,
        contextId, streamId);
    fields!(CUpti_ActivityMemory4: memoryOperationType, memoryKind, address, bytes, timestamp,
        deviceId, contextId, streamId, correlationId);
    fields!(CUpti_ActivityAPI: cbid, start, end, processId, threadId, correlationId,
        returnValue);
    for (k, c_struct) in [
        (kind::MEMCPY, "CUpti_ActivityMemcpy6"),
        (kind::MEMCPY2, "CUpti_ActivityMemcpyPtoP4"),
        (kind::MEMSET, "CUpti_ActivityMemset4"),
        (kind::KERNEL, "CUpti_ActivityKernel10"),
        (kind::CONCURRENT_KERNEL, "CUpti_ActivityKernel10"),
        (kind::DRIVER, "CUpti_ActivityAPI"),
        (kind::RUNTIME, "CUpti_ActivityAPI"),
        (kind::SYNCHRONIZATION, "CUpti_ActivitySynchronization2"),
        (kind::MEMORY2, "CUpti_ActivityMemory4"),
    ] {
        let size = decode::record_size(k).expect("a kind the decoder reads");
        v.push((format!("sizeof({c_struct})"), size));
    }
    // The kind numbers the decoder dispatches on.
    for (k, c_name) in [
        (kind::MEMCPY, "CUPTI_ACTIVITY_KIND_MEMCPY"),
        (kind::MEMCPY2, "CUPTI_ACTIVITY_KIND_MEMCPY2"),
        (kind::MEMSET, "CUPTI_ACTIVITY_KIND_MEMSET"),
        (kind::KERNEL, "CUPTI_ACTIVITY_KIND_KERNEL"),
        (
            kind::CONCURRENT_KERNEL,
            "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
        ),
        (kind::DRIVER, "CUPTI_ACTIVITY_KIND_DRIVER"),
        (kind::RUNTIME, "CUPTI_ACTIVITY_KIND_RUNTIME"),
        (kind::SYNCHRONIZATION, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"),
        (kind::MEMORY2, "CUPTI_ACTIVITY_KIND_MEMORY2"),
    ] {
        v.push((format!("(size_t){c_name}"), k as usize));
    }
    v
}

#[test]
#[ignore = "needs a real libcupti: set PERFKIT_TEST_CUPTI (pip install nvidia-cuda-cupti) and PERFKIT_TEST_CUDA_INCLUDE"]
fn the_decoders_record_layouts_match_the_wheels_cupti_activity_h() {
    let lib = cupti();
    let cupti_include = lib.parent().unwrap().parent().unwrap().join("include");
    assert!(
        cupti_include.join("cupti_activity.h").is_file(),
        "no cupti_activity.h beside {}",
        lib.display()
    );
    let layout = decoder_layout();
    let dir = tempfile::tempdir().unwrap();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <cupti_activity.h>\nint main(void) {\n",
    );
    for (expr, _) in &layout {
        c.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    let src = dir.path().join("layout.c");
    std::fs::write(&src, c).unwrap();
    let exe = dir.path().join("layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-I")
        .arg(&cupti_include)
        .arg("-I")
        .arg(cuda_include())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed on the header:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let header: Vec<usize> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(header.len(), layout.len());
    let wrong: Vec<String> = layout
        .iter()
        .zip(&header)
        .filter(|((_, ours), theirs)| ours != *theirs)
        .map(|((expr, ours), theirs)| format!("{expr}: decoder {ours}, header {theirs}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} disagrees with the decoder:\n{}",
        cupti_include.join("cupti_activity.h").display(),
        wrong.join("\n")
    );
}
