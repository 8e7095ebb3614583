//! The injection library's whole runtime — `InitializeInjection`, the API callbacks, activity
//! buffers, correlation joins, host stacks, flushes and the exit path — driven without a GPU
//! through a stand-in libcupti (`tests/support/fake_cupti.c`, compiled here with `cc`) that
//! plays API callbacks and delivers activity buffers the way CUPTI does. The records delivered
//! are the bindings' own structs. The trace written is read back with perfkit's reader.
//!
//! Each scenario runs in a child process (the library initialises once per process and
//! finishes its trace at exit).

use std::ffi::CString;
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudarc::cupti::sys;
use perfkit_profiler::model::{GpuEvent, GpuOpKind, HostMemory, Record};
use perfkit_profiler::{TraceReader, TraceStatus};

const CHILD: &str = "PERFKIT_FAKE_CUPTI_CHILD";

fn inject_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    [dir, dir.parent().unwrap()]
        .iter()
        .map(|d| d.join("libperfkit_inject.so"))
        .find(|p| p.is_file())
        .expect("libperfkit_inject.so built next to the tests")
}

/// Compiles the stand-in libcupti into `dir` (soname libcupti.so.13).
fn build_fake(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake_cupti.c");
    let out = dir.join("libcupti.so.13");
    let status = Command::new("cc")
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-Wl,-soname,libcupti.so.13",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) to build the stand-in libcupti");
    assert!(status.success());
    out
}

/// Runs `scenario` in a child process with the stand-in CUPTI; returns (stdout, stderr, trace dir).
fn run_child(scenario: &str, test: &str) -> (String, String, tempfile::TempDir) {
    let t = tempfile::tempdir().unwrap();
    let fake = build_fake(t.path());
    let trace = t.path().join("trace");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("PERFKIT_INJECT_TEST_LIB", inject_library())
        .env("PERFKIT_CUPTI_PATH", &fake)
        .env("PERFKIT_TRACE", &trace)
        .env_remove("PERFKIT_INJECT_STACKS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    (stdout, stderr, t)
}

/// Records laid out as in a CUPTI buffer, with their offsets.
#[derive(Default)]
struct Records {
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl Records {
    fn push<T: Copy>(&mut self, rec: &T) {
        let at = self.bytes.len().next_multiple_of(8);
        self.bytes.resize(at + size_of::<T>(), 0);
        // SAFETY: in bounds (resized above); T is a plain C struct.
        unsafe {
            std::ptr::write_unaligned(self.bytes.as_mut_ptr().add(at) as *mut T, *rec);
        }
        self.offsets.push(at);
    }
}

fn zeroed<T>() -> T {
    // SAFETY: CUPTI record structs: integers, pointers, unions and enums with a 0 variant.
    unsafe { std::mem::zeroed() }
}

const DRIVER: i32 = 1;
const RUNTIME: i32 = 2;
const ENTER: i32 = 0;
const EXIT: i32 = 1;
/// CUPTI clock at the moment the library calibrates (the stand-in's timestamp).
const NOW: u64 = 1_000_000_000;

type FakeApi = unsafe extern "C" fn(i32, u32, u32, i32) -> i32;
type FakeDeliver = unsafe extern "C" fn(*const u8, usize, *const usize, usize, usize) -> i32;

/// The child side: initialise the library, play a training step's calls and records, exit.
fn child(scenario: &str) {
    let fake_path = std::env::var_os("PERFKIT_CUPTI_PATH").unwrap();
    // SAFETY: the stand-in has no initialisers.
    let fake = unsafe { libloading::Library::new(&fake_path) }.unwrap();
    if scenario == "clash" {
        // SAFETY: plain C function.
        unsafe { fake.get::<unsafe extern "C" fn()>(b"fake_hold\0").unwrap()() };
    }
    if scenario == "no-driver-13.0" {
        // SAFETY: plain C function.
        unsafe {
            fake.get::<unsafe extern "C" fn()>(b"fake_as_13_0_without_driver\0")
                .unwrap()()
        };
    }
    if scenario == "half-start" {
        // Driver API records can be enabled neither per function nor as a kind: the start
        // fails after the activity kinds were enabled.
        // SAFETY: plain C functions.
        unsafe {
            fake.get::<unsafe extern "C" fn()>(b"fake_fail_api_records\0")
                .unwrap()();
            fake.get::<unsafe extern "C" fn(i32)>(b"fake_fail_kind\0")
                .unwrap()(sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_DRIVER as i32)
        };
    }
    if scenario == "one-kind-refused" {
        // SAFETY: plain C function.
        unsafe {
            fake.get::<unsafe extern "C" fn(i32)>(b"fake_fail_kind\0")
                .unwrap()(
                sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION as i32
            )
        };
    }
    // SAFETY: loading the injection library.
    let lib =
        unsafe { libloading::Library::new(std::env::var_os("PERFKIT_INJECT_TEST_LIB").unwrap()) }
            .unwrap();
    // SAFETY: `int InitializeInjection(void)`.
    let rc = unsafe {
        lib.get::<unsafe extern "C" fn() -> i32>(b"InitializeInjection\0")
            .unwrap()()
    };
    println!("initialize returned {rc}");
    if scenario == "clash" || scenario == "no-driver-13.0" {
        return;
    }
    if scenario == "slow-flush" {
        // SAFETY: plain C functions of the stand-in.
        unsafe {
            fake.get::<unsafe extern "C" fn(i32)>(b"fake_slow_flush\0")
                .unwrap()(300);
            let in_flush = fake
                .get::<unsafe extern "C" fn() -> i32>(b"fake_in_flush\0")
                .unwrap();
            // Exit while the flusher thread is inside a (periodic) flush.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while in_flush() == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            println!("exiting inside a flush {}", in_flush());
        }
        std::mem::forget(lib);
        std::mem::forget(fake);
        return;
    }
    if scenario == "one-kind-refused" {
        // SAFETY: plain C function of the stand-in.
        let enabled = unsafe {
            fake.get::<unsafe extern "C" fn(i32) -> i32>(b"fake_kind_enabled\0")
                .unwrap()
        };
        use sys::CUpti_ActivityKind as K;
        // SAFETY: as above.
        let (memcpy, sync) = unsafe {
            (
                enabled(K::CUPTI_ACTIVITY_KIND_MEMCPY as i32),
                enabled(K::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION as i32),
            )
        };
        println!("kinds enabled: memcpy {memcpy}, synchronization {sync}");
        std::mem::forget(lib);
        std::mem::forget(fake);
        return;
    }
    if scenario == "half-start" {
        // SAFETY: plain C functions of the stand-in.
        let (any_kind, subscribed) = unsafe {
            (
                fake.get::<unsafe extern "C" fn() -> i32>(b"fake_any_kind_enabled\0")
                    .unwrap()(),
                fake.get::<unsafe extern "C" fn() -> i32>(b"fake_subscribed\0")
                    .unwrap()(),
            )
        };
        println!("after a failed start: kinds enabled {any_kind}, subscribed {subscribed}");
        return;
    }
    // SAFETY: the stand-in's functions, with these C signatures.
    // SAFETY: plain C function of the stand-in.
    let api_records = unsafe {
        *fake
            .get::<unsafe extern "C" fn(i32, u32) -> i32>(b"fake_api_records_enabled\0")
            .unwrap()
    };
    // Driver 1..3 and runtime 1..2 are watched; driver 4 (cuCtxGetCurrent) and 5
    // (cuProfilerStop) issue no GPU work.
    for (domain, cbid) in [
        (DRIVER, 1),
        (DRIVER, 2),
        (DRIVER, 3),
        (DRIVER, 4),
        (DRIVER, 5),
    ]
    .into_iter()
    .chain([(RUNTIME, 1), (RUNTIME, 2)])
    {
        // SAFETY: as above.
        println!("api records {domain}/{cbid} enabled {}", unsafe {
            api_records(domain, cbid)
        });
    }
    let (api, deliver, kind_enabled, flushes) = unsafe {
        (
            *fake.get::<FakeApi>(b"fake_api\0").unwrap(),
            *fake.get::<FakeDeliver>(b"fake_deliver\0").unwrap(),
            *fake
                .get::<unsafe extern "C" fn(i32) -> i32>(b"fake_kind_enabled\0")
                .unwrap(),
            *fake
                .get::<unsafe extern "C" fn() -> i32>(b"fake_forced_flushes\0")
                .unwrap(),
        )
    };
    use sys::CUpti_ActivityKind as K;
    if scenario == "untimed-buffer" {
        // The timestamp read fails when the buffer comes back: its records cannot be placed.
        // SAFETY: plain C function of the stand-in.
        unsafe {
            fake.get::<unsafe extern "C" fn()>(b"fake_fail_timestamp\0")
                .unwrap()()
        };
    }
    for (name, k) in [
        ("MEMCPY", K::CUPTI_ACTIVITY_KIND_MEMCPY),
        ("MEMCPY2", K::CUPTI_ACTIVITY_KIND_MEMCPY2),
        (
            "CONCURRENT_KERNEL",
            K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        ),
        ("SYNCHRONIZATION", K::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION),
        ("MEMSET", K::CUPTI_ACTIVITY_KIND_MEMSET),
        ("MEMORY2", K::CUPTI_ACTIVITY_KIND_MEMORY2),
        ("DRIVER", K::CUPTI_ACTIVITY_KIND_DRIVER),
        ("RUNTIME", K::CUPTI_ACTIVITY_KIND_RUNTIME),
    ] {
        // SAFETY: plain C function.
        println!("kind {name} enabled {}", unsafe { kind_enabled(k as i32) });
    }
    // SAFETY (all calls below): the stand-in's C functions with valid arguments.
    unsafe {
        // cudaMemcpy (runtime 10) with the driver's cuMemcpyHtoD (11) inside it.
        api(RUNTIME, 1, 10, ENTER); // the upload's call site
        api(DRIVER, 1, 11, ENTER);
        api(DRIVER, 1, 11, EXIT);
        api(RUNTIME, 1, 10, EXIT);
        // cuLaunchKernel (20).
        api(DRIVER, 2, 20, ENTER);
        api(DRIVER, 2, 20, EXIT);
        // cuStreamSynchronize (30), blocking 3 ms.
        api(DRIVER, 3, 30, ENTER);
        std::thread::sleep(std::time::Duration::from_millis(3));
        api(DRIVER, 3, 30, EXIT);
        // cuCtxGetCurrent is not watched: its callback must not be enabled.
        println!("unwatched callback enabled {}", api(DRIVER, 4, 40, ENTER));
    }

    let name = CString::new("_Z10fake_gemmPfS_").unwrap();
    let mut r = Records::default();
    let mut m: sys::CUpti_ActivityMemcpy6 = zeroed();
    m.kind = K::CUPTI_ACTIVITY_KIND_MEMCPY;
    m.copyKind = sys::CUpti_ActivityMemcpyKind::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD as u8;
    m.srcKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE as u8;
    m.dstKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE as u8;
    m.bytes = 1 << 20;
    m.start = NOW - 500_000;
    m.end = NOW - 400_000;
    m.streamId = 7;
    m.correlationId = 11;
    m.runtimeCorrelationId = 10;
    r.push(&m);
    let mut k: sys::CUpti_ActivityKernel10 = zeroed();
    k.kind = K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.start = NOW - 390_000;
    k.end = NOW - 140_000;
    k.streamId = 7;
    k.gridX = 64;
    k.gridY = 1;
    k.gridZ = 1;
    k.blockX = 256;
    k.blockY = 1;
    k.blockZ = 1;
    k.dynamicSharedMemory = 2048;
    k.correlationId = 20;
    k.name = name.as_ptr();
    r.push(&k);
    let mut s: sys::CUpti_ActivitySynchronization2 = zeroed();
    s.kind = K::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    s.type_ = sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
    s.start = NOW - 380_000;
    s.end = NOW - 100_000;
    s.correlationId = 30;
    s.streamId = 7;
    r.push(&s);
    let mut a: sys::CUpti_ActivityAPI = zeroed();
    a.kind = K::CUPTI_ACTIVITY_KIND_DRIVER;
    a.cbid = 4; // unwatched: ignored
    a.start = NOW - 50_000;
    a.end = NOW - 40_000;
    a.correlationId = 40;
    r.push(&a);
    let mut mem: sys::CUpti_ActivityMemory4 = zeroed();
    mem.kind = K::CUPTI_ACTIVITY_KIND_MEMORY2;
    mem.memoryOperationType =
        sys::CUpti_ActivityMemoryOperationType::CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
    mem.memoryKind = sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
    mem.bytes = 8 << 20;
    mem.timestamp = NOW - 600_000;
    r.push(&mem);
    // SAFETY: bytes/offsets describe `r`; `name` outlives the call.
    let ok = unsafe {
        deliver(
            r.bytes.as_ptr(),
            r.bytes.len(),
            r.offsets.as_ptr(),
            r.offsets.len(),
            3,
        )
    };
    println!("delivered {ok}");
    // cuProfilerStop (driver 5) asks for a forced flush on the flusher thread; the periodic
    // flushes are not forced.
    // SAFETY: as above.
    println!("forced flushes before profiler stop {}", unsafe {
        flushes()
    });
    // SAFETY: as above.
    unsafe { api(DRIVER, 5, 50, EXIT) };
    // The forced flush runs on the flusher thread: wait for the stand-in to count it (the
    // deadline only keeps a flush that never comes from hanging the test).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // SAFETY: as above.
    while unsafe { flushes() } == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: as above.
    println!("forced flushes after profiler stop {}", unsafe {
        flushes()
    });
    std::mem::forget(lib);
    std::mem::forget(fake);
    // Normal exit: the library's atexit handler flushes and finishes the trace.
}

fn gpu_events(path: &Path) -> (Vec<GpuEvent>, Vec<Record>, bool) {
    let mut r = TraceReader::open(path).unwrap();
    let recs: Vec<Record> = r.by_ref().map(|x| x.unwrap()).collect();
    let complete = matches!(r.status(), TraceStatus::Complete(_));
    let gpu = recs
        .iter()
        .filter_map(|x| match x {
            Record::Gpu(g) => Some(g.clone()),
            _ => None,
        })
        .collect();
    (gpu, recs, complete)
}

#[test]
fn a_step_played_through_a_stand_in_cupti_lands_in_the_trace() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    let (stdout, stderr, t) = run_child(
        "step",
        "a_step_played_through_a_stand_in_cupti_lands_in_the_trace",
    );
    assert!(stdout.contains("initialize returned 1"), "{stdout}");
    assert!(
        stderr.contains("perfkit-inject: recording CUDA activity with CUPTI 13.5.0"),
        "{stderr}"
    );
    for kind in [
        "MEMCPY",
        "MEMCPY2",
        "CONCURRENT_KERNEL",
        "SYNCHRONIZATION",
        "MEMSET",
        "MEMORY2",
    ] {
        assert!(
            stdout.contains(&format!("kind {kind} enabled 1")),
            "{kind}: {stdout}"
        );
    }
    // API records only for the watched functions, not the whole API kinds.
    for kind in ["DRIVER", "RUNTIME"] {
        assert!(
            stdout.contains(&format!("kind {kind} enabled 0")),
            "{kind}: {stdout}"
        );
    }
    for (id, on) in [
        ("1/1", 1),
        ("1/2", 1),
        ("1/3", 1),
        ("1/4", 0),
        ("1/5", 0),
        ("2/1", 1),
        ("2/2", 1),
    ] {
        assert!(
            stdout.contains(&format!("api records {id} enabled {on}")),
            "{id}: {stdout}"
        );
    }
    assert!(stdout.contains("unwatched callback enabled 0"), "{stdout}");
    assert!(stdout.contains("delivered 1"), "{stdout}");
    assert!(
        stdout.contains("forced flushes before profiler stop 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("forced flushes after profiler stop 1"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "perfkit-inject: 1 copies, 1 kernels, 1 synchronizations, 1 other operations recorded, CUPTI dropped 3 records"
        ),
        "{stderr}"
    );

    let files = perfkit_profiler::trace_files(t.path().join("trace")).unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-inject.pktrace"), "{name}");
    let (gpu, recs, complete) = gpu_events(&files[0]);
    assert!(complete, "the exit handler finished the trace");
    let kinds: Vec<GpuOpKind> = gpu.iter().map(|g| g.kind).collect();
    assert_eq!(
        kinds,
        vec![
            GpuOpKind::MemcpyHtoD,
            GpuOpKind::Kernel,
            GpuOpKind::Synchronize,
            GpuOpKind::Alloc
        ]
    );
    let (copy, kernel, sync, alloc) = (&gpu[0], &gpu[1], &gpu[2], &gpu[3]);

    // The copy: joined to the runtime call (host times), pageable, GPU times on the trace clock.
    assert_eq!(copy.bytes, 1 << 20);
    assert_eq!(copy.host_memory, Some(HostMemory::Pageable));
    assert_eq!(copy.stream, Some(7));
    assert!(copy.host_start <= copy.host_end);
    let (gs, ge) = (copy.gpu_start.unwrap(), copy.gpu_end.unwrap());
    assert_eq!(ge - gs, 100_000, "GPU duration kept exactly");
    // The kernel: name and launch shape; its GPU start 110 us after the copy's on both clocks.
    let k = kernel.kernel.as_ref().unwrap();
    assert_eq!(&*k.name, "_Z10fake_gemmPfS_");
    assert_eq!(
        (k.grid, k.block, k.shared_mem_bytes),
        ([64, 1, 1], [256, 1, 1], 2048)
    );
    assert_eq!(kernel.gpu_start.unwrap() - gs, 110_000);
    assert!(kernel.host_start >= copy.host_end, "calls in issue order");
    // The sync: its host times are those of its own enter and exit callbacks, after the
    // kernel's, and span the child's 3 ms sleep between them (a sleep lasts at least as
    // long as asked, so this is a lower bound that cannot fail on a slow machine).
    assert!(sync.host_start >= kernel.host_end, "calls in issue order");
    assert!(sync.host_end - sync.host_start >= 3_000_000, "{sync:?}");
    assert_eq!(sync.thread, copy.thread, "same issuing thread");
    // The allocation: one timestamp, no GPU interval.
    assert_eq!((alloc.bytes, alloc.gpu_start), (8 << 20, None));

    // Host stacks: copies and syncs have one (default policy), kernel launches do not.
    let op_stacks: Vec<(u64, u64)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::OpStack(o) => Some((o.op, o.stack)),
            _ => None,
        })
        .collect();
    let has_stack = |g: &GpuEvent| op_stacks.iter().any(|(op, _)| *op == g.id);
    assert!(
        has_stack(copy) && has_stack(sync) && !has_stack(kernel),
        "{op_stacks:?}"
    );
    let stacks: Vec<&Vec<u64>> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Stack(s) => Some(&s.ips),
            _ => None,
        })
        .collect();
    assert!(!stacks.is_empty() && stacks.iter().all(|s| s.len() > 3));
    // Every stack frame of the test program lies in a recorded module.
    let modules: Vec<(u64, u64, String)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Module(m) => Some((m.base, m.size, m.path.clone())),
            _ => None,
        })
        .collect();
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let in_exe = stacks[0].iter().any(|ip| {
        modules.iter().any(|(base, size, path)| {
            *ip >= *base && *ip < base + size && std::fs::canonicalize(path).is_ok_and(|p| p == exe)
        })
    });
    assert!(
        in_exe,
        "a frame of the calling program is mapped to its file"
    );

    // Symbolised after the fact, the upload's stack points at the line that issued it.
    let mut sym = perfkit_symbolize::Symbolizer::new(recs.iter().filter_map(|r| match r {
        Record::Module(m) => Some(m.clone()),
        _ => None,
    }));
    let stack_id = op_stacks.iter().find(|(op, _)| *op == copy.id).unwrap().1;
    let ips = recs
        .iter()
        .find_map(|r| match r {
            Record::Stack(s) if s.id == stack_id => Some(s.ips.clone()),
            _ => None,
        })
        .unwrap();
    let frame = sym.caller(&ips).expect("the issuing line");
    let want = include_str!("fake_cupti.rs")
        .lines()
        .position(|l| l.contains("// the upload's call site"))
        .unwrap() as u32
        + 1;
    assert!(
        frame.file.as_deref().unwrap().ends_with("fake_cupti.rs"),
        "{frame:?}"
    );
    assert_eq!(frame.line, Some(want), "{frame:?}");
}

#[test]
fn another_cupti_client_is_reported_and_nothing_is_written() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    let (stdout, stderr, t) = run_child(
        "clash",
        "another_cupti_client_is_reported_and_nothing_is_written",
    );
    assert!(stdout.contains("initialize returned 1"), "{stdout}");
    assert!(
        stderr
            .contains("not recording: another CUPTI client (Nsight Systems, torch.profiler, ...)"),
        "{stderr}"
    );
    assert!(!t.path().join("trace").exists());
}

#[test]
fn an_activity_kind_refused_leaves_the_others_recorded_and_is_named() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    let (stdout, stderr, _t) = run_child(
        "one-kind-refused",
        "an_activity_kind_refused_leaves_the_others_recorded_and_is_named",
    );
    assert!(stdout.contains("initialize returned 1"), "{stdout}");
    assert!(
        stdout.contains("kinds enabled: memcpy 1, synchronization 0"),
        "{stdout}"
    );
    assert!(
        stderr.contains("cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) failed"),
        "{stderr}"
    );
    assert!(stderr.contains("recording CUDA activity"), "{stderr}");
}

#[test]
fn a_start_that_fails_half_way_leaves_cupti_as_it_found_it() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    let (stdout, stderr, _t) = run_child(
        "half-start",
        "a_start_that_fails_half_way_leaves_cupti_as_it_found_it",
    );
    assert!(stdout.contains("initialize returned 1"), "{stdout}");
    assert!(
        stderr.contains("not recording: cuptiActivityEnable"),
        "{stderr}"
    );
    assert!(
        stdout.contains("after a failed start: kinds enabled 0, subscribed 0"),
        "{stdout}"
    );
}

#[test]
fn the_exit_handler_waits_for_the_flusher_before_its_own_flush() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    let (stdout, stderr, t) = run_child(
        "slow-flush",
        "the_exit_handler_waits_for_the_flusher_before_its_own_flush",
    );
    assert!(stdout.contains("exiting inside a flush 1"), "{stdout}");
    // The exit handler's forced flush ran, and never while the flusher's was running.
    assert!(
        stderr.contains("fake-cupti: 0 overlapping flushes, 1 forced"),
        "{stderr}"
    );
    let files = perfkit_profiler::trace_files(t.path().join("trace")).unwrap();
    let (_, _, complete) = gpu_events(&files[0]);
    assert!(complete, "the exit handler finished the trace");
}

#[test]
fn a_cupti_that_answers_its_version_without_a_driver_is_refused_for_the_missing_driver() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    // SAFETY: only tries to dlopen libcuda.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        // With a driver, a failed subscribe is reported as such (the clash test).
        return;
    }
    let (stdout, stderr, t) = run_child(
        "no-driver-13.0",
        "a_cupti_that_answers_its_version_without_a_driver_is_refused_for_the_missing_driver",
    );
    assert!(stdout.contains("initialize returned 1"), "{stdout}");
    assert!(
        stderr.contains("not recording: libcupti cannot initialise without a CUDA driver"),
        "{stderr}"
    );
    assert!(!t.path().join("trace").exists());
}

#[test]
fn a_buffer_whose_timestamp_cannot_be_read_is_counted_and_reported() {
    if let Ok(s) = std::env::var(CHILD) {
        return child(&s);
    }
    let (stdout, stderr, t) = run_child(
        "untimed-buffer",
        "a_buffer_whose_timestamp_cannot_be_read_is_counted_and_reported",
    );
    assert!(stdout.contains("delivered 1"), "{stdout}");
    assert!(
        stderr
            .contains("warning: 1 activity buffers (5 records) were dropped: the CUPTI timestamp"),
        "{stderr}"
    );
    let files = perfkit_profiler::trace_files(t.path().join("trace")).unwrap();
    let (gpu, recs, complete) = gpu_events(&files[0]);
    assert!(complete);
    assert!(gpu.iter().all(|g| g.gpu_start.is_none()), "{gpu:?}");
    let stats = format!("{recs:?}");
    assert!(stats.contains("untimed_buffers"), "{stats}");
    assert!(stats.contains("untimed_records"), "{stats}");
}
