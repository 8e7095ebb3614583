//! Python frames of the thread that issues a CUDA call, read at callback time.
//!
//! In a process with a CPython interpreter (3.9 or newer), the API callback reads the innermost
//! frames of the calling thread with CPython's own C API, found at start-up with
//! `dlsym(RTLD_DEFAULT, ...)`: `PyThreadState_GetFrame`, `PyFrame_GetCode`,
//! `PyFrame_GetLineNumber`, `PyFrame_GetBack`, and `co_filename` / `co_name` of each code
//! object. It does so only when the calling thread holds the GIL (`PyGILState_Check() == 1`):
//! the frames of a thread are then its own and stay put while they are read. A thread that
//! released the GIL around the CUDA call (PyTorch does for some operations; ctypes does for every
//! `CDLL` call) or a native thread with no Python state gets no frames, and the call is marked so
//! ([`crate::join::PyFrames::GilNotHeld`]). The GIL is never acquired from the callback: the
//! thread that holds it may be waiting for this very CUDA call (a deadlock).
//!
//! File and function names are read once per code object and cached (the cache keeps a
//! reference to the code object so that its address cannot be reused by another one); the names
//! are interned in the trace once. Any Python exception pending when a name is read is kept as it
//! was.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Mutex;

/// Default number of Python frames kept per call (`PERFKIT_INJECT_PYTHON_DEPTH`).
pub const DEFAULT_DEPTH: usize = 32;
/// Most code objects whose names are cached (the rest are read at every call).
const CACHE_MAX: usize = 1 << 16;

type Obj = *mut c_void;

/// The CPython functions used, found in the running process.
struct Api {
    is_initialized: unsafe extern "C" fn() -> c_int,
    gil_check: unsafe extern "C" fn() -> c_int,
    /// `PyThreadState_GetUnchecked` (3.13) or `_PyThreadState_UncheckedGet` (3.5-3.12); else
    /// `PyGILState_GetThisThreadState`. None of them fails when there is no thread state.
    current_tstate: unsafe extern "C" fn() -> Obj,
    get_frame: unsafe extern "C" fn(Obj) -> Obj,
    frame_code: unsafe extern "C" fn(Obj) -> Obj,
    frame_line: unsafe extern "C" fn(Obj) -> c_int,
    frame_back: unsafe extern "C" fn(Obj) -> Obj,
    getattr: unsafe extern "C" fn(Obj, *const c_char) -> Obj,
    utf8: unsafe extern "C" fn(Obj) -> *const c_char,
    incref: unsafe extern "C" fn(Obj),
    decref: unsafe extern "C" fn(Obj),
    err_fetch: unsafe extern "C" fn(*mut Obj, *mut Obj, *mut Obj),
    err_restore: unsafe extern "C" fn(Obj, Obj, Obj),
}

/// A symbol of the process's global scope.
fn sym(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// What reading the frames gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The interpreter is not (or no longer) running, or the callback re-entered itself.
    NotRead,
    /// The calling thread does not hold the GIL: nothing was read.
    GilNotHeld,
    /// The frames were read (possibly none: a thread holding the GIL outside any Python code).
    Frames,
}

/// One frame, its names interned by the caller's interner.
pub type Frame<S> = (S, S, u32);

/// The CPython interpreter of this process, if there is one.
pub struct Python<S: Copy> {
    api: Api,
    /// Code object address -> interned (file, function).
    names: Mutex<HashMap<usize, (S, S)>>,
}

thread_local! {
    /// Set while this thread reads its frames (a CUDA call made from inside would skip).
    static BUSY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<S: Copy> Python<S> {
    /// The interpreter of this process. `Ok(None)`: no CPython in the process (its symbols are
    /// not in the global scope). `Err`: a CPython too old for the frame API (names what is
    /// missing).
    pub fn find() -> Result<Option<Python<S>>, String> {
        let Some(is_initialized) = sym(c"Py_IsInitialized") else {
            return Ok(None);
        };
        let mut missing = Vec::new();
        let mut get = |name: &'static CStr| {
            let p = sym(name);
            if p.is_none() {
                missing.push(name.to_string_lossy().into_owned());
            }
            p.unwrap_or(std::ptr::null_mut())
        };
        let gil_check = get(c"PyGILState_Check");
        let get_frame = get(c"PyThreadState_GetFrame");
        let frame_code = get(c"PyFrame_GetCode");
        let frame_line = get(c"PyFrame_GetLineNumber");
        let frame_back = get(c"PyFrame_GetBack");
        let getattr = get(c"PyObject_GetAttrString");
        let utf8 = get(c"PyUnicode_AsUTF8");
        let incref = get(c"Py_IncRef");
        let decref = get(c"Py_DecRef");
        let err_fetch = get(c"PyErr_Fetch");
        let err_restore = get(c"PyErr_Restore");
        let current_tstate = sym(c"PyThreadState_GetUnchecked")
            .or_else(|| sym(c"_PyThreadState_UncheckedGet"))
            .unwrap_or_else(|| get(c"PyGILState_GetThisThreadState"));
        if !missing.is_empty() {
            return Err(format!(
                "this Python has no {} (Python frames need CPython 3.9 or newer)",
                missing.join(", ")
            ));
        }
        // SAFETY: each pointer is the non-null address of the CPython function of that name,
        // whose C signature (Python's stable ABI) is the one it is given here.
        let api = unsafe {
            use std::mem::transmute as t;
            Api {
                is_initialized: t::<*mut c_void, unsafe extern "C" fn() -> c_int>(is_initialized),
                gil_check: t::<*mut c_void, unsafe extern "C" fn() -> c_int>(gil_check),
                current_tstate: t::<*mut c_void, unsafe extern "C" fn() -> Obj>(current_tstate),
                get_frame: t::<*mut c_void, unsafe extern "C" fn(Obj) -> Obj>(get_frame),
                frame_code: t::<*mut c_void, unsafe extern "C" fn(Obj) -> Obj>(frame_code),
                frame_line: t::<*mut c_void, unsafe extern "C" fn(Obj) -> c_int>(frame_line),
                frame_back: t::<*mut c_void, unsafe extern "C" fn(Obj) -> Obj>(frame_back),
                getattr: t::<*mut c_void, unsafe extern "C" fn(Obj, *const c_char) -> Obj>(getattr),
                utf8: t::<*mut c_void, unsafe extern "C" fn(Obj) -> *const c_char>(utf8),
                incref: t::<*mut c_void, unsafe extern "C" fn(Obj)>(incref),
                decref: t::<*mut c_void, unsafe extern "C" fn(Obj)>(decref),
                err_fetch: t::<*mut c_void, unsafe extern "C" fn(*mut Obj, *mut Obj, *mut Obj)>(
                    err_fetch,
                ),
                err_restore: t::<*mut c_void, unsafe extern "C" fn(Obj, Obj, Obj)>(err_restore),
            }
        };
        Ok(Some(Python {
            api,
            names: Mutex::new(HashMap::new()),
        }))
    }

    /// Reads the innermost `depth` frames of the calling thread into `out` (innermost first),
    /// interning file and function names with `intern` the first time a code object is seen.
    /// Reads nothing unless this thread holds the GIL.
    pub fn frames(
        &self,
        depth: usize,
        intern: &dyn Fn(&str) -> S,
        out: &mut Vec<Frame<S>>,
    ) -> Read {
        out.clear();
        if BUSY.with(|b| b.replace(true)) {
            return Read::NotRead;
        }
        // SAFETY: see `walk`.
        let r = unsafe { self.walk(depth, intern, out) };
        BUSY.with(|b| b.set(false));
        r
    }

    /// # Safety
    /// Calls into CPython; sound because every call below is made only while this thread
    /// holds the GIL (checked first), on this thread's own frames, with references counted as
    /// the C API documents (`PyThreadState_GetFrame`, `PyFrame_GetCode` and `PyFrame_GetBack`
    /// return new references).
    unsafe fn walk(
        &self,
        depth: usize,
        intern: &dyn Fn(&str) -> S,
        out: &mut Vec<Frame<S>>,
    ) -> Read {
        let a = &self.api;
        // SAFETY (whole function): see above.
        unsafe {
            if (a.is_initialized)() == 0 {
                return Read::NotRead;
            }
            if (a.gil_check)() != 1 {
                return Read::GilNotHeld;
            }
            let tstate = (a.current_tstate)();
            if tstate.is_null() {
                return Read::GilNotHeld;
            }
            let mut frame = (a.get_frame)(tstate);
            while !frame.is_null() && out.len() < depth {
                let code = (a.frame_code)(frame);
                let line = (a.frame_line)(frame);
                if !code.is_null() {
                    let (file, function) = self.names(code, intern);
                    out.push((file, function, u32::try_from(line).unwrap_or(0)));
                    (a.decref)(code);
                }
                let back = (a.frame_back)(frame);
                (a.decref)(frame);
                frame = back;
            }
            if !frame.is_null() {
                (a.decref)(frame);
            }
        }
        Read::Frames
    }

    /// The interned (file, function) of a code object, cached.
    ///
    /// # Safety
    /// The GIL is held and `code` is a live code object.
    unsafe fn names(&self, code: Obj, intern: &dyn Fn(&str) -> S) -> (S, S) {
        let mut cache = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&n) = cache.get(&(code as usize)) {
            return n;
        }
        let a = &self.api;
        // SAFETY: GIL held (caller); the pending exception, if any, is put back as it was, and
        // one raised by the attribute reads below is discarded with it.
        let (file, function) = unsafe {
            let (mut t, mut v, mut tb) = (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            (a.err_fetch)(&mut t, &mut v, &mut tb);
            let file = self.attr(code, c"co_filename");
            let function = self.attr(code, c"co_name");
            (a.err_restore)(t, v, tb);
            (file, function)
        };
        let n = (
            intern(file.as_deref().unwrap_or("<unknown>")),
            intern(function.as_deref().unwrap_or("<unknown>")),
        );
        if cache.len() < CACHE_MAX {
            // The cache keeps the code object alive: its address stays its own.
            // SAFETY: GIL held; a live object.
            unsafe { (a.incref)(code) };
            cache.insert(code as usize, n);
        }
        n
    }

    /// A string attribute of `obj`.
    ///
    /// # Safety
    /// The GIL is held and `obj` is a live object.
    unsafe fn attr(&self, obj: Obj, name: &CStr) -> Option<String> {
        let a = &self.api;
        // SAFETY: GIL held (caller); `s` is a new reference released below, and the UTF-8
        // buffer it owns is copied before that.
        unsafe {
            let s = (a.getattr)(obj, name.as_ptr());
            if s.is_null() {
                return None;
            }
            let p = (a.utf8)(s);
            let out = (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned());
            (a.decref)(s);
            out
        }
    }
}
