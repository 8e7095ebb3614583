//! The injection library's runtime: `InitializeInjection`, the CUPTI callbacks, the activity
//! buffers, the flusher thread and the exit handler.
//!
//! Every `extern "C"` function here catches panics: nothing unwinds into CUPTI or the driver.
//! `InitializeInjection` makes no CUDA driver call; it loads libcupti, checks its version,
//! subscribes, enables the activity kinds and starts a perfkit recording session.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use cudarc::cupti::sys::{self, CUptiResult};
use perfkit_profiler::model::GpuOpKind;
use perfkit_profiler::recorder::{GpuOp, KernelLaunch, Recorder};

use crate::calls::{self, Domain, StackPolicy, Watch};
use crate::decode;
use crate::join::{CallInfo, Clock, Joiner, Op, PyFrames};
use crate::python::{self, Python};
use crate::stack;
use perfkit_profiler::model::ModuleInfo;
use perfkit_profiler::recorder::StrId;

/// Size of each activity buffer handed to CUPTI.
const BUFFER_SIZE: usize = 8 << 20;
/// Alignment CUPTI requires for activity buffers.
const BUFFER_ALIGN: usize = 8;
/// How often the flusher thread asks CUPTI for completed records.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Highest callback id probed for a name (the 13.x headers stop below 1000).
const MAX_CBID: u32 = 4096;

static STARTED: AtomicBool = AtomicBool::new(false);
/// Process that started recording: a forked child (DataLoader workers) inherits the state but
/// not the threads, and must neither flush nor finish the parent's trace.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
/// The CUPTI subscriber handle once subscribed (0: none), to let go of CUPTI on a failed start.
static SUBSCRIBER: AtomicUsize = AtomicUsize::new(0);
static STATE: OnceLock<State> = OnceLock::new();
static GUARD: Mutex<Option<perfkit_profiler::Guard>> = Mutex::new(None);
/// Activity kinds enabled so far, to switch off again if the start fails half-way.
static ENABLED_KINDS: Mutex<Vec<sys::CUpti_ActivityKind>> = Mutex::new(Vec::new());
/// The flusher thread, joined by the exit handler before its own flush.
static FLUSHER: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);
/// How long the exit handler waits for the flusher thread to stop.
const FLUSHER_STOP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Counters {
    copies: AtomicU64,
    kernels: AtomicU64,
    syncs: AtomicU64,
    other_ops: AtomicU64,
    unjoined: AtomicU64,
    decode_errors: AtomicU64,
    cupti_dropped: AtomicU64,
    trace_dropped: AtomicU64,
    /// Activity buffers dropped because the CUPTI timestamp (to place their records on the
    /// trace clock) could not be read, and the records they held.
    untimed_buffers: AtomicU64,
    untimed_records: AtomicU64,
    /// Calls whose Python frames were read, and calls made without the GIL (no frames).
    python_frames: AtomicU64,
    python_no_gil: AtomicU64,
}

struct State {
    rec: Recorder,
    joiner: Mutex<Joiner>,
    stack_depth: usize,
    stack_policy: StackPolicy,
    /// The CPython interpreter of the process, when there is one and frames are wanted.
    python: Option<Python<StrId>>,
    python_depth: usize,
    driver_watch: Vec<Option<Watch>>,
    runtime_watch: Vec<Option<Watch>>,
    flush: (Mutex<FlushRequest>, Condvar),
    counters: Counters,
    first_decode_error: Mutex<Option<String>>,
}

impl State {
    /// Why the function `cbid` of `domain` is watched, if it is.
    fn watch(&self, domain: Domain, cbid: u32) -> Option<Watch> {
        let table = match domain {
            Domain::Driver => &self.driver_watch,
            Domain::Runtime => &self.runtime_watch,
        };
        table.get(cbid as usize).copied().flatten()
    }

    /// Whether an API record is of a function that issues GPU work or blocks the host.
    fn watched(&self, api: &decode::ApiRecord) -> bool {
        matches!(
            self.watch(api.domain, api.cbid),
            Some(Watch::Work | Watch::Launch | Watch::GraphLaunch)
        )
    }
}

#[derive(Default)]
struct FlushRequest {
    forced: bool,
    stop: bool,
    /// Set by the flusher thread as its last act.
    stopped: bool,
}

thread_local! {
    /// Correlation id of the watched runtime call this thread is inside (0: none).
    static OUTER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Scratch buffer for stack capture.
    static IPS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Scratch buffer for Python frames.
    static PY_FRAMES: std::cell::RefCell<Vec<python::Frame<StrId>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn say(msg: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "perfkit-inject: {msg}");
}

fn result_name(r: CUptiResult) -> String {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: a valid out-pointer; the string is static in libcupti.
    let ok = unsafe { sys::cuptiGetResultString(r, &mut s) } == CUptiResult::CUPTI_SUCCESS;
    if ok && !s.is_null() {
        // SAFETY: NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    }
}

fn check(what: &str, r: CUptiResult) -> Result<(), String> {
    if r == CUptiResult::CUPTI_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {}", result_name(r)))
    }
}

/// Entry point called by the CUDA driver (inside `cuInit`) for the library named by
/// `CUDA_INJECTION64_PATH`. Returns 1; on any problem it prints why and records nothing, and the
/// program runs unchanged.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    if STARTED.swap(true, Ordering::SeqCst) {
        return 1;
    }
    match catch_unwind(start) {
        Ok(Ok(line)) => say(format_args!("{line}")),
        Ok(Err(msg)) => {
            let _ = catch_unwind(abandon);
            say(format_args!("not recording: {msg}"));
        }
        Err(_) => {
            let _ = catch_unwind(abandon);
            say(format_args!(
                "not recording: internal error during start-up"
            ));
        }
    }
    1
}

/// Loads libcupti (the file named by `PERFKIT_CUPTI_PATH` first), returns the path it was
/// loaded from and its version.
fn load_cupti() -> Result<(String, u32), String> {
    if let Some(p) = std::env::var_os(crate::locate::CUPTI_PATH_ENV).filter(|p| !p.is_empty()) {
        let c = std::ffi::CString::new(p.as_encoded_bytes())
            .map_err(|_| format!("{} contains a NUL byte", crate::locate::CUPTI_PATH_ENV))?;
        // SAFETY: dlopen of a path; the handle is kept for the life of the process so the
        // bindings' lookup by soname finds this copy.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            // SAFETY: dlerror returns a thread-local string or null.
            let err = unsafe { libc::dlerror() };
            let why = if err.is_null() {
                "unknown error".to_string()
            } else {
                // SAFETY: see above.
                unsafe { CStr::from_ptr(err) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!(
                "cannot load {} ({}): {why}",
                PathBuf::from(p).display(),
                crate::locate::CUPTI_PATH_ENV
            ));
        }
    }
    // SAFETY: only probes dlopen candidates.
    if !unsafe { sys::is_culib_present() } {
        let report = crate::locate::search(&crate::locate::SearchEnv::from_process());
        return Err(format!(
            "libcupti not found; looked in:\n{}\nset {} to the libcupti file",
            report.looked_lines(),
            crate::locate::CUPTI_PATH_ENV
        ));
    }
    // SAFETY: present (checked above), so this does not panic; the library stays loaded.
    let lib = unsafe { sys::culib() };
    type GetVersion = unsafe extern "C" fn(*mut u32) -> CUptiResult;
    // SAFETY: the documented signature of cuptiGetVersion.
    let f = unsafe { lib.get::<GetVersion>(b"cuptiGetVersion\0") }
        .map_err(|e| format!("libcupti has no cuptiGetVersion: {e}"))?;
    let addr = *f as *const c_void;
    let mut version = 0u32;
    // SAFETY: valid out-pointer.
    let r = unsafe { f(&mut version) };
    // Without a driver CUPTI 13.5 fails here with CUPTI_ERROR_UNKNOWN; CUPTI 13.0 answers and
    // fails later, at cuptiSubscribe, where the same check is made.
    if r == CUptiResult::CUPTI_ERROR_UNKNOWN {
        no_driver()?;
    }
    check("cuptiGetVersion", r)?;
    let path = loaded_from(addr).unwrap_or_else(|| "libcupti".to_string());
    if let Some(p) = std::env::var_os(crate::locate::CUPTI_PATH_ENV).filter(|p| !p.is_empty()) {
        let want = std::fs::canonicalize(&p).ok();
        let got = std::fs::canonicalize(&path).ok();
        if want.is_some() && got.is_some() && want != got {
            return Err(format!(
                "{} names {}, but {} was loaded first (two CUPTI libraries in one process)",
                crate::locate::CUPTI_PATH_ENV,
                PathBuf::from(p).display(),
                path
            ));
        }
    }
    Ok((path, version))
}

/// The file the code at `addr` was loaded from.
/// The error for a CUPTI call that failed because there is no CUDA driver to initialise
/// against; Ok when a driver library is there (the failure has another cause).
fn no_driver() -> Result<(), String> {
    // SAFETY: only probes dlopen candidates.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err("libcupti cannot initialise without a CUDA driver (libcuda.so.1 not found)".into())
    }
}

fn loaded_from(addr: *const c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: NUL-terminated string owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn watch_table(domain: Domain) -> Vec<Option<Watch>> {
    let cb_domain = match domain {
        Domain::Driver => sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
        Domain::Runtime => sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RUNTIME_API,
    };
    let mut table = Vec::new();
    for cbid in 0..MAX_CBID {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: valid out-pointer; invalid ids return an error code.
        let r = unsafe { sys::cuptiGetCallbackName(cb_domain, cbid, &mut name) };
        let w = if r == CUptiResult::CUPTI_SUCCESS && !name.is_null() {
            // SAFETY: NUL-terminated static string in libcupti.
            let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            calls::classify(domain, &n)
        } else {
            None
        };
        table.push(w);
    }
    while table.last() == Some(&None) {
        table.pop();
    }
    table
}

fn start() -> Result<String, String> {
    if std::env::var_os(perfkit_profiler::TRACE_ENV).is_none_or(|v| v.is_empty()) {
        return Err(format!(
            "{} is not set (run the program under `perfkit profile`)",
            perfkit_profiler::TRACE_ENV
        ));
    }
    let (cupti_path, version) = load_cupti()?;
    crate::version::check(version).map_err(|e| e.to_string())?;

    let stack_depth = match std::env::var("PERFKIT_INJECT_STACK_DEPTH") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("PERFKIT_INJECT_STACK_DEPTH={v:?} is not a number of frames"))?,
        Err(_) => stack::DEFAULT_DEPTH,
    };
    let stack_policy = StackPolicy::parse(std::env::var("PERFKIT_INJECT_STACKS").ok().as_deref())?;
    let python_depth = match std::env::var("PERFKIT_INJECT_PYTHON_DEPTH") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("PERFKIT_INJECT_PYTHON_DEPTH={v:?} is not a number of frames"))?,
        Err(_) => python::DEFAULT_DEPTH,
    };
    let python = if python_depth == 0 {
        None
    } else {
        match Python::find() {
            Ok(p) => p,
            Err(why) => {
                say(format_args!("warning: no Python frames recorded: {why}"));
                None
            }
        }
    };
    // Subscribe: fails when another CUPTI client (Nsight Systems, torch.profiler) holds CUPTI.
    let mut subscriber: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer and callback.
    let r =
        unsafe { sys::cuptiSubscribe(&mut subscriber, Some(api_callback), std::ptr::null_mut()) };
    if r == CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED {
        return Err(
            "another CUPTI client (Nsight Systems, torch.profiler, ...) already holds CUPTI in this \
             process; run without it or use `perfkit profile --no-inject`"
                .into(),
        );
    }
    if r != CUptiResult::CUPTI_SUCCESS {
        no_driver()?;
    }
    check("cuptiSubscribe", r)?;
    SUBSCRIBER.store(subscriber as usize, Ordering::SeqCst);
    // Only now (CUPTI is ours) is the trace file created.
    let Some(output) = output_path() else {
        return Err(format!("{} is not set", perfkit_profiler::TRACE_ENV));
    };
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let guard = trace_builder(&output)
        .try_init()
        .map_err(|e| format!("cannot start the trace: {e}"))?;
    let Some(rec) = guard.recorder() else {
        return Err("the trace session did not start".into());
    };
    let trace_path = guard
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();

    let state = State {
        rec,
        joiner: Mutex::new(Joiner::new()),
        stack_depth,
        stack_policy,
        python,
        python_depth,
        driver_watch: watch_table(Domain::Driver),
        runtime_watch: watch_table(Domain::Runtime),
        flush: (Mutex::new(FlushRequest::default()), Condvar::new()),
        counters: Counters::default(),
        first_decode_error: Mutex::new(None),
    };
    OWNER_PID.store(std::process::id(), Ordering::SeqCst);
    if STATE.set(state).is_err() {
        return Err("started twice".into());
    }
    let Some(state) = STATE.get() else {
        return Err("state lost".into());
    };
    *GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);

    for (domain, table) in [
        (
            sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
            &state.driver_watch,
        ),
        (
            sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RUNTIME_API,
            &state.runtime_watch,
        ),
    ] {
        for (cbid, w) in table.iter().enumerate() {
            if w.is_some() {
                // SAFETY: a valid subscriber and a callback id CUPTI named.
                let r = unsafe { sys::cuptiEnableCallback(1, subscriber, domain, cbid as u32) };
                check("cuptiEnableCallback", r)?;
            }
        }
    }

    // SAFETY: the callbacks have the required signatures and catch panics.
    check("cuptiActivityRegisterCallbacks", unsafe {
        sys::cuptiActivityRegisterCallbacks(Some(buffer_requested), Some(buffer_completed))
    })?;
    use sys::CUpti_ActivityKind as K;
    let kinds = vec![
        K::CUPTI_ACTIVITY_KIND_MEMCPY,
        K::CUPTI_ACTIVITY_KIND_MEMCPY2,
        K::CUPTI_ACTIVITY_KIND_MEMSET,
        K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        K::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
        K::CUPTI_ACTIVITY_KIND_MEMORY2,
    ];
    let api_records = std::env::var("PERFKIT_INJECT_API_RECORDS").map_or(true, |v| v != "0");
    let (enabled, failed) = enable_each(&kinds, |k| {
        // SAFETY: plain enable call.
        check(&format!("cuptiActivityEnable({k:?})"), unsafe {
            sys::cuptiActivityEnable(k)
        })
    })?;
    ENABLED_KINDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(enabled);
    if !failed.is_empty() {
        let failed = failed.join("; ");
        say(format_args!(
            "warning: {failed}; the other kinds of activity are recorded"
        ));
        tracing::event!(
            name: "perfkit.inject_not_enabled",
            target: "perfkit_inject",
            tracing::Level::WARN,
            failed = failed.as_str()
        );
    }

    if api_records {
        enable_api_records(state)?;
    }

    let handle = std::thread::Builder::new()
        .name("perfkit-cupti-flush".into())
        .spawn(flusher)
        .map_err(|e| format!("cannot start the flusher thread: {e}"))?;
    *FLUSHER.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    // SAFETY: registering a plain extern "C" function.
    if unsafe { libc::atexit(at_exit) } != 0 {
        say(format_args!(
            "warning: atexit registration failed; records still in CUPTI at exit may be lost"
        ));
    }
    Ok(format!(
        "recording CUDA activity with CUPTI {} ({cupti_path}) into {trace_path}",
        crate::version::describe(version)
    ))
}

/// Enables each of `kinds` with `enable`, keeping those that work: one kind this CUPTI refuses
/// (a device or driver without it) leaves the others recorded. Returns the kinds enabled and
/// the failures; an error only when none could be enabled.
fn enable_each<K: Copy>(
    kinds: &[K],
    mut enable: impl FnMut(K) -> Result<(), String>,
) -> Result<(Vec<K>, Vec<String>), String> {
    let mut enabled = Vec::with_capacity(kinds.len());
    let mut failed = Vec::new();
    for &k in kinds {
        match enable(k) {
            Ok(()) => enabled.push(k),
            Err(e) => failed.push(e),
        }
    }
    if enabled.is_empty() && !kinds.is_empty() {
        return Err(failed.join("; "));
    }
    Ok((enabled, failed))
}

/// API activity records (calls the callbacks did not see) only for the functions that issue
/// GPU work: per callback id (`cuptiActivityEnableDriverApi` / `...RuntimeApi`), so that CUPTI
/// neither writes nor hands over records of the program's other calls. Where a per-id enable
/// fails, the whole kind is enabled instead and the decoder keeps only the watched ones.
fn enable_api_records(state: &State) -> Result<(), String> {
    use sys::CUpti_ActivityKind as K;
    for (kind, table, per_id) in [
        (
            K::CUPTI_ACTIVITY_KIND_DRIVER,
            &state.driver_watch,
            sys::cuptiActivityEnableDriverApi as unsafe fn(u32, u8) -> CUptiResult,
        ),
        (
            K::CUPTI_ACTIVITY_KIND_RUNTIME,
            &state.runtime_watch,
            sys::cuptiActivityEnableRuntimeApi,
        ),
    ] {
        // Listed first, so that a failed start switches the kind off again.
        ENABLED_KINDS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(kind);
        let all_per_id = table.iter().enumerate().all(|(cbid, w)| {
            if !matches!(w, Some(Watch::Work | Watch::Launch | Watch::GraphLaunch)) {
                return true;
            }
            // SAFETY: a callback id CUPTI named; plain enable call.
            let r = unsafe { per_id(cbid as u32, 1) };
            r == CUptiResult::CUPTI_SUCCESS
        });
        if !all_per_id {
            // SAFETY: plain enable call.
            check(&format!("cuptiActivityEnable({kind:?})"), unsafe {
                sys::cuptiActivityEnable(kind)
            })?;
        }
    }
    Ok(())
}

/// The trace file: `<dir>/<program>-<pid>-inject.pktrace` for `PERFKIT_TRACE=<dir>`, or
/// `<name>-<pid>-inject.pktrace` next to `PERFKIT_TRACE=<name>.pktrace`: every process the
/// library is injected into (a launcher and its workers, forked or spawned, all inherit the
/// variable) writes a file of its own, named by its pid. The `-inject` suffix keeps it apart
/// from the trace a program that also links perfkit-profiler writes itself.
fn output_path() -> Option<PathBuf> {
    let v = std::env::var_os(perfkit_profiler::TRACE_ENV).filter(|v| !v.is_empty())?;
    Some(inject_trace_path(
        std::path::Path::new(&v),
        &program_name(),
        std::process::id(),
    ))
}

/// See [`output_path`].
pub(crate) fn inject_trace_path(trace_env: &std::path::Path, program: &str, pid: u32) -> PathBuf {
    let ext = perfkit_profiler::format::TRACE_EXTENSION;
    if trace_env.extension().is_some_and(|e| e == ext) {
        let stem = trace_env
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        trace_env.with_file_name(format!("{stem}-{pid}-inject.{ext}"))
    } else {
        trace_env.join(format!("{program}-{pid}-inject.{ext}"))
    }
}

/// The recorder of the injected trace at `output`. Like every perfkit recorder it never
/// overwrites a file: when `output` exists, the trace goes beside it under a name of its own
/// (the guard's `path()` says which).
fn trace_builder(output: &std::path::Path) -> perfkit_profiler::Builder {
    perfkit_profiler::Builder::new()
        .output(output)
        .record_events(true)
        // Operations are written from CUPTI's buffer thread (never the program's), in bursts of
        // up to a whole activity buffer: wait for the writer rather than drop.
        .wait_when_full(Duration::from_millis(200))
}

/// File stem of argv[0] (`python3`, `train`), `process` when unknown.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "process".into())
}

/// Lets go of CUPTI (after a failed start): switches off the activity kinds already enabled,
/// hands back what CUPTI recorded meanwhile, unsubscribes, and finishes the trace if one was
/// started, so that the program runs on as if perfkit were not there.
fn abandon() {
    let kinds = std::mem::take(&mut *ENABLED_KINDS.lock().unwrap_or_else(|e| e.into_inner()));
    for &k in &kinds {
        // SAFETY: plain disable call for a kind enabled by this library.
        let _ = unsafe { sys::cuptiActivityDisable(k) };
    }
    if !kinds.is_empty() {
        flush_cupti(true);
    }
    let subscriber = SUBSCRIBER.swap(0, Ordering::SeqCst);
    if subscriber != 0 {
        // SAFETY: a handle returned by cuptiSubscribe, unsubscribed once.
        let _ = unsafe { sys::cuptiUnsubscribe(subscriber as sys::CUpti_SubscriberHandle) };
    }
    finish_session();
}

fn finish_session() {
    if let Some(g) = GUARD.lock().unwrap_or_else(|e| e.into_inner()).take() {
        g.finish();
    }
}

fn flusher() {
    let Some(state) = STATE.get() else { return };
    let (lock, cv) = &state.flush;
    flush_until_stopped(state);
    lock.lock().unwrap_or_else(|e| e.into_inner()).stopped = true;
    cv.notify_all();
}

fn flush_until_stopped(state: &State) {
    let (lock, cv) = &state.flush;
    loop {
        let (forced, stop) = {
            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
            let (mut g, _) = cv
                .wait_timeout_while(g, FLUSH_EVERY, |r| !r.forced && !r.stop)
                .unwrap_or_else(|e| e.into_inner());
            let out = (g.forced, g.stop);
            g.forced = false;
            out
        };
        if stop {
            return;
        }
        let _ = catch_unwind(|| flush_cupti(forced));
        if forced {
            state.rec.flush();
        }
    }
}

fn flush_cupti(forced: bool) {
    let flag = if forced {
        sys::CUpti_ActivityFlag::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED as u32
    } else {
        0
    };
    // SAFETY: plain flush; completed buffers come back through buffer_completed.
    let _ = unsafe { sys::cuptiActivityFlushAll(flag) };
}

extern "C" fn at_exit() {
    if OWNER_PID.load(Ordering::SeqCst) != std::process::id() {
        return;
    }
    let _ = catch_unwind(|| {
        let Some(state) = STATE.get() else { return };
        // The flusher may be inside cuptiActivityFlushAll or processing a buffer: stop it
        // and wait for it before the last flush and the end of the trace.
        if stop_flusher(state) {
            flush_cupti(true);
        } else {
            say(format_args!(
                "warning: the flusher thread did not stop within {} s; records still in CUPTI are \
                 not flushed",
                FLUSHER_STOP_TIMEOUT.as_secs()
            ));
        }
        for m in stack::loaded_modules() {
            // base = load bias, so `ip - base` is the address inside the file for any object
            // (PIE, shared library or fixed-address executable).
            state.rec.module(&ModuleInfo {
                path: m.path,
                base: m.bias,
                size: m.end.saturating_sub(m.bias),
            });
        }
        let c = &state.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // Recorded from a thread of its own: the exiting thread's thread-locals may be gone
        // already (they are in a Python process), and an event recorded there is dropped.
        std::thread::scope(|s| {
            let _ = std::thread::Builder::new()
                .name("perfkit-inject-exit".into())
                .spawn_scoped(s, || {
                    tracing::event!(
                        name: "perfkit.inject_stats",
                        target: "perfkit_inject",
                        tracing::Level::INFO,
                        copies = get(&c.copies),
                        kernels = get(&c.kernels),
                        syncs = get(&c.syncs),
                        other_ops = get(&c.other_ops),
                        unjoined = get(&c.unjoined),
                        decode_errors = get(&c.decode_errors),
                        cupti_dropped = get(&c.cupti_dropped),
                        trace_dropped = get(&c.trace_dropped),
                        untimed_buffers = get(&c.untimed_buffers),
                        untimed_records = get(&c.untimed_records),
                        python_frames = get(&c.python_frames),
                        python_no_gil = get(&c.python_no_gil)
                    );
                });
        });
        finish_session();
        say(format_args!(
            "{} copies, {} kernels, {} synchronizations, {} other operations recorded{}{}{}",
            get(&c.copies),
            get(&c.kernels),
            get(&c.syncs),
            get(&c.other_ops),
            nonzero(", CUPTI dropped ", get(&c.cupti_dropped), " records"),
            nonzero(
                ", ",
                get(&c.trace_dropped),
                " operations dropped by the trace writer"
            ),
            nonzero(", ", get(&c.decode_errors), " records could not be decoded"),
        ));
        if state.python.is_some() {
            say(format_args!(
                "Python frames read at {} calls; {} calls were made without the GIL held (no \
                 Python frames)",
                get(&c.python_frames),
                get(&c.python_no_gil)
            ));
        }
        if get(&c.untimed_buffers) > 0 {
            say(format_args!(
                "warning: {} activity buffers ({} records) were dropped: the CUPTI timestamp \
                 that places them on the trace clock could not be read",
                get(&c.untimed_buffers),
                get(&c.untimed_records)
            ));
        }
        if let Some(e) = state
            .first_decode_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            say(format_args!("first decoding error: {e}"));
        }
    });
}

/// Asks the flusher thread to stop and joins it; false when it did not stop within
/// [`FLUSHER_STOP_TIMEOUT`] (it is then left running, unjoined).
fn stop_flusher(state: &State) -> bool {
    let Some(handle) = FLUSHER.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return true;
    };
    let (lock, cv) = &state.flush;
    let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
    g.stop = true;
    cv.notify_all();
    let (g, _) = cv
        .wait_timeout_while(g, FLUSHER_STOP_TIMEOUT, |r| !r.stopped)
        .unwrap_or_else(|e| e.into_inner());
    let stopped = g.stopped;
    drop(g);
    if stopped {
        let _ = handle.join();
    }
    stopped
}

fn nonzero(before: &str, n: u64, after: &str) -> String {
    if n == 0 {
        String::new()
    } else {
        format!("{before}{n}{after}")
    }
}

unsafe extern "C" fn api_callback(
    _userdata: *mut c_void,
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    cbdata: *const c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(state) = STATE.get() else { return };
        let dom = match domain {
            sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API => Domain::Driver,
            sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RUNTIME_API => Domain::Runtime,
            _ => return,
        };
        let Some(watch) = state.watch(dom, cbid) else {
            return;
        };
        if cbdata.is_null() {
            return;
        }
        let data = cbdata as *const sys::CUpti_CallbackData;
        // SAFETY: for API domains cbdata points to a CUpti_CallbackData; the site is read as
        // a plain integer (0 enter, 1 exit).
        let (site, correlation) = unsafe {
            (
                std::ptr::read(std::ptr::addr_of!((*data).callbackSite) as *const u32),
                (*data).correlationId,
            )
        };
        let enter = site == sys::CUpti_ApiCallbackSite::CUPTI_API_ENTER as u32;
        match watch {
            Watch::ProfilerStop => {
                if !enter {
                    let (lock, cv) = &state.flush;
                    lock.lock().unwrap_or_else(|e| e.into_inner()).forced = true;
                    cv.notify_all();
                }
            }
            Watch::Work | Watch::Launch | Watch::GraphLaunch => {
                if enter {
                    on_enter(state, dom, correlation, watch);
                } else {
                    on_exit(state, dom, correlation);
                }
            }
        }
    }));
}

fn on_enter(state: &State, dom: Domain, correlation: u32, watch: Watch) {
    let outer = OUTER.with(|o| o.get());
    if dom == Domain::Driver && outer == correlation {
        // The driver call shares the runtime call's id: that call's entry stands for both
        // (`Joiner::call_enter` would drop this one), so skip the clock and the lock.
        return;
    }
    let host_start = state.rec.now();
    let thread = state.rec.current_thread();
    // Python frames, read before anything is locked (see `python`); a driver call inside a
    // watched runtime call shares the runtime call's.
    let py = if dom == Domain::Driver && outer != 0 {
        PyFrames::NotRead
    } else {
        python_frames(state)
    };
    // A driver call inside a watched runtime call shares the runtime call's stack.
    let stack = if state.stack_depth == 0
        || !state.stack_policy.wants(watch)
        || (dom == Domain::Driver && outer != 0)
    {
        None
    } else {
        IPS.with(|ips| {
            let mut ips = ips.borrow_mut();
            stack::capture(state.stack_depth, &mut ips);
            // 0: the stack table is unavailable (session finished).
            let id = state.rec.stack(&ips);
            (id != 0).then_some(id)
        })
    };
    let info = CallInfo {
        thread,
        host_start,
        host_end: host_start,
        stack,
        outer: (dom == Domain::Driver && outer != 0).then_some(outer),
        inner: None,
        repeats: watch == Watch::GraphLaunch,
        py,
    };
    state
        .joiner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .call_enter(correlation, info);
    if dom == Domain::Runtime && outer == 0 {
        OUTER.with(|o| o.set(correlation));
    }
}

/// The Python frames of the calling thread, recorded as a Python stack of the trace.
fn python_frames(state: &State) -> PyFrames {
    let Some(py) = &state.python else {
        return PyFrames::NotRead;
    };
    PY_FRAMES.with(|frames| {
        let Ok(mut frames) = frames.try_borrow_mut() else {
            return PyFrames::NotRead;
        };
        let intern = |s: &str| state.rec.intern(s);
        match py.frames(state.python_depth, &intern, &mut frames) {
            python::Read::NotRead => PyFrames::NotRead,
            python::Read::GilNotHeld => {
                state.counters.python_no_gil.fetch_add(1, Ordering::Relaxed);
                PyFrames::GilNotHeld
            }
            python::Read::Frames => {
                // 0: the session is finished.
                let id = state.rec.py_stack(&frames);
                if id == 0 {
                    return PyFrames::NotRead;
                }
                state.counters.python_frames.fetch_add(1, Ordering::Relaxed);
                PyFrames::Stack(id)
            }
        }
    })
}

fn on_exit(state: &State, dom: Domain, correlation: u32) {
    let now = state.rec.now();
    state
        .joiner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .call_exit(correlation, now);
    if dom == Domain::Runtime {
        OUTER.with(|o| {
            if o.get() == correlation {
                o.set(0);
            }
        });
    }
}

unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_num_records: *mut usize,
) {
    let _ = catch_unwind(|| {
        let Ok(layout) = std::alloc::Layout::from_size_align(BUFFER_SIZE, BUFFER_ALIGN) else {
            return;
        };
        // SAFETY: non-zero size; freed in buffer_completed with the same layout.
        let p = unsafe { std::alloc::alloc(layout) };
        // SAFETY: CUPTI passes valid out-pointers.
        unsafe {
            *buffer = p;
            *size = if p.is_null() { 0 } else { BUFFER_SIZE };
            *max_num_records = 0;
        }
    });
}

unsafe extern "C" fn buffer_completed(
    context: cudarc::driver::sys::CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid_size: usize,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(state) = STATE.get() {
            // SAFETY: CUPTI hands back a buffer it filled with valid_size bytes of records.
            unsafe { process_buffer(state, buffer, valid_size) };
            let mut dropped = 0usize;
            // SAFETY: valid out-pointer.
            let r =
                unsafe { sys::cuptiActivityGetNumDroppedRecords(context, stream_id, &mut dropped) };
            if r == CUptiResult::CUPTI_SUCCESS && dropped > 0 {
                state
                    .counters
                    .cupti_dropped
                    .fetch_add(dropped as u64, Ordering::Relaxed);
                tracing::event!(
                    name: "perfkit.cupti_dropped",
                    target: "perfkit_inject",
                    tracing::Level::WARN,
                    count = dropped as u64
                );
            }
        }
    }));
    if !buffer.is_null()
        && size == BUFFER_SIZE
        && let Ok(layout) = std::alloc::Layout::from_size_align(BUFFER_SIZE, BUFFER_ALIGN)
    {
        // SAFETY: allocated in buffer_requested with this layout.
        unsafe { std::alloc::dealloc(buffer, layout) };
    }
}

fn clock_now(rec: &Recorder) -> Option<Clock> {
    let mut samples = [(0u64, 0u64, 0u64); 5];
    for s in &mut samples {
        let before = rec.now();
        let mut ts = 0u64;
        // SAFETY: valid out-pointer.
        if unsafe { sys::cuptiGetTimestamp(&mut ts) } != CUptiResult::CUPTI_SUCCESS {
            return None;
        }
        *s = (before, ts, rec.now());
    }
    Clock::calibrate(&samples)
}

/// The records in a CUPTI activity buffer.
///
/// # Safety
/// `buffer` holds `valid` bytes of CUPTI activity records.
unsafe fn count_records(buffer: *mut u8, valid: usize) -> u64 {
    let end = buffer as usize + valid;
    let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
    let mut n = 0;
    loop {
        // SAFETY: buffer/valid as given by CUPTI; record is CUPTI's cursor.
        let r = unsafe { sys::cuptiActivityGetNextRecord(buffer, valid, &mut record) };
        if r != CUptiResult::CUPTI_SUCCESS || record.is_null() {
            return n;
        }
        let at = record as usize;
        if at < buffer as usize || at >= end {
            return n;
        }
        n += 1;
    }
}

/// # Safety
/// `buffer` holds `valid` bytes of CUPTI activity records.
unsafe fn process_buffer(state: &State, buffer: *mut u8, valid: usize) {
    if buffer.is_null() || valid == 0 {
        return;
    }
    let Some(clock) = clock_now(&state.rec) else {
        // Without the clock the records cannot be placed on the trace's time line: they are
        // dropped, but counted (perfkit.inject_stats and the exit summary).
        // SAFETY: as below, the cursor only walks the valid part of the buffer.
        let records = unsafe { count_records(buffer, valid) };
        state
            .counters
            .untimed_buffers
            .fetch_add(1, Ordering::Relaxed);
        state
            .counters
            .untimed_records
            .fetch_add(records, Ordering::Relaxed);
        return;
    };
    let end = buffer as usize + valid;
    // Decoded first, without the call table's lock: the program's CUDA calls take it in
    // their callbacks, and must not wait while a whole buffer is decoded.
    let mut activities: Vec<decode::Activity> = Vec::new();
    {
        let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
        loop {
            // SAFETY: buffer/valid as given by CUPTI; record is CUPTI's cursor.
            let r = unsafe { sys::cuptiActivityGetNextRecord(buffer, valid, &mut record) };
            if r != CUptiResult::CUPTI_SUCCESS || record.is_null() {
                break;
            }
            let at = record as usize;
            if at < buffer as usize || at >= end {
                break;
            }
            // SAFETY: the record lies inside the valid part of the buffer.
            let bytes = unsafe { std::slice::from_raw_parts(record as *const u8, end - at) };
            // SAFETY: a CUPTI-filled buffer that has not been given back yet.
            match unsafe { decode::decode(bytes) } {
                // API records only matter for the calls that issue GPU work (the others would
                // fill the call table with calls no activity ever refers to).
                Ok(decode::Activity::Api(api)) if !state.watched(&api) => {}
                Ok(a) => activities.push(a),
                Err(e) => {
                    state.counters.decode_errors.fetch_add(1, Ordering::Relaxed);
                    let mut first = state
                        .first_decode_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if first.is_none() {
                        *first = Some(e.to_string());
                    }
                }
            }
        }
    }
    let ops: Vec<Op> = {
        let mut joiner = state.joiner.lock().unwrap_or_else(|e| e.into_inner());
        activities
            .iter()
            .filter_map(|a| joiner.convert(a, &clock).ok())
            .collect()
    };
    for op in &ops {
        emit(state, op);
    }
}

fn emit(state: &State, op: &Op) {
    let c = &state.counters;
    match op.kind {
        k if k.is_copy() => &c.copies,
        GpuOpKind::Kernel => &c.kernels,
        GpuOpKind::Synchronize => &c.syncs,
        _ => &c.other_ops,
    }
    .fetch_add(1, Ordering::Relaxed);
    if !op.joined {
        c.unjoined.fetch_add(1, Ordering::Relaxed);
    }
    let rec = &state.rec;
    let kernel = op.kernel.as_ref().map(|k| KernelLaunch {
        // The recorder's interner returns the id a name already has.
        name: rec.intern(&k.name),
        grid: k.grid,
        block: k.block,
        shared_mem_bytes: k.shared_mem_bytes,
    });
    let id = rec.next_id();
    // Before the operation: a reader that streams the trace meets the Python stack first.
    match op.py {
        PyFrames::NotRead => {}
        PyFrames::GilNotHeld => rec.op_py_stack(id, None),
        PyFrames::Stack(s) => rec.op_py_stack(id, Some(s)),
    }
    let mut g = GpuOp::new(op.kind);
    g.id = id;
    g.thread = op.thread;
    g.device = op.device;
    g.stream = op.stream;
    g.bytes = op.bytes;
    g.host_memory = op.host_memory;
    g.host_start = op.host_start;
    g.host_end = op.host_end;
    g.gpu_start = op.gpu_start;
    g.gpu_end = op.gpu_end;
    g.kernel = kernel;
    if !rec.gpu(&g) {
        c.trace_dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if let Some(stack) = op.stack {
        rec.op_stack(id, stack);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn one_activity_kind_refused_leaves_the_others_enabled() {
        let enable = |k: u32| {
            if k == 2 {
                Err(format!("cuptiActivityEnable({k}) failed: not supported"))
            } else {
                Ok(())
            }
        };
        let (enabled, failed) = enable_each(&[1, 2, 3], enable).unwrap();
        assert_eq!(enabled, vec![1, 3]);
        assert_eq!(failed, vec!["cuptiActivityEnable(2) failed: not supported"]);
        // Nothing enabled: the injection does not start, and says why.
        let err = enable_each(&[2], enable).unwrap_err();
        assert!(err.contains("not supported"), "{err}");
    }

    #[test]
    fn trace_names_keep_clear_of_the_programs_own() {
        assert_eq!(
            inject_trace_path(Path::new("out/run"), "python3", 42),
            Path::new("out/run/python3-42-inject.pktrace")
        );
        assert_eq!(
            inject_trace_path(Path::new("out/t.pktrace"), "python3", 42),
            Path::new("out/t-42-inject.pktrace")
        );
        // Two processes given the same file write two files.
        assert_ne!(
            inject_trace_path(Path::new("out/t.pktrace"), "python3", 42),
            inject_trace_path(Path::new("out/t.pktrace"), "python3", 43)
        );
    }

    #[test]
    fn an_existing_file_at_the_trace_path_is_never_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let taken = inject_trace_path(t.path(), "python3", 42);
        std::fs::write(&taken, "not perfkit's").unwrap();
        let (_layer, guard) = trace_builder(&taken)
            .build_local()
            .unwrap()
            .expect("a trace session");
        let path = guard.path().expect("a trace file").to_path_buf();
        drop(guard);
        assert_eq!(std::fs::read_to_string(&taken).unwrap(), "not perfkit's");
        assert_ne!(path, taken);
        assert_eq!(path.parent(), taken.parent(), "beside it");
    }
}
