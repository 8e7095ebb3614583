//! Host call stacks: instruction pointers captured at each CUDA API call (no symbol lookup on
//! the calling thread; the trace stores each distinct stack once), and the map of loaded objects
//! needed to symbolise them later (an address belongs to the object whose range holds it; its offset in
//! the file is `ip - bias`, which `addr2line` resolves with the file's debug info).

/// Default number of frames kept per stack.
pub const DEFAULT_DEPTH: usize = 32;

/// Captures the instruction pointers of the calling thread's stack, innermost first, at most
/// `depth` of them. Unwinds with the platform unwinder; resolves nothing.
pub fn capture(depth: usize, out: &mut Vec<u64>) {
    out.clear();
    // SAFETY: trace_unsynchronized only walks the current thread's stack; it is not re-entered
    // from the callback below.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            out.push(frame.ip() as usize as u64);
            out.len() < depth
        });
    }
}

/// One loaded object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// File path (the executable's own path for the main program).
    pub path: String,
    /// Load bias: `ip - bias` is the address in the file's own address space.
    pub bias: u64,
    /// First mapped address.
    pub start: u64,
    /// One past the last mapped address.
    pub end: u64,
}

/// The objects loaded in this process now (`dl_iterate_phdr`).
#[cfg(target_os = "linux")]
pub fn loaded_modules() -> Vec<Module> {
    use std::ffi::{CStr, c_int, c_void};

    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info, and data is the Vec given below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<Module>)) };
        let mut lo = u64::MAX;
        let mut hi = 0u64;
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: dlpi_phdr has dlpi_phnum entries.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD {
                lo = lo.min(ph.p_vaddr);
                hi = hi.max(ph.p_vaddr + ph.p_memsz);
            }
        }
        if lo >= hi {
            return 0;
        }
        let name = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }
                .to_string_lossy()
                .into_owned()
        };
        let path = if name.is_empty() {
            std::fs::read_link("/proc/self/exe")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            name
        };
        let bias = info.dlpi_addr;
        out.push(Module {
            path,
            bias,
            start: bias.wrapping_add(lo),
            end: bias.wrapping_add(hi),
        });
        0
    }

    let mut out: Vec<Module> = Vec::new();
    // SAFETY: the callback only reads what the loader passes and appends to `out`.
    unsafe {
        libc::dl_iterate_phdr(Some(each), &mut out as *mut Vec<Module> as *mut c_void);
    }
    out
}

/// The objects loaded in this process (not available on this platform: none).
#[cfg(not(target_os = "linux"))]
pub fn loaded_modules() -> Vec<Module> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn deeper(n: usize, out: &mut Vec<u64>) {
        if n == 0 {
            capture(DEFAULT_DEPTH, out);
        } else {
            deeper(n - 1, out);
        }
        std::hint::black_box(n);
    }

    #[test]
    fn captures_this_thread_and_symbolises_later() {
        let mut ips = Vec::new();
        deeper(3, &mut ips);
        assert!(ips.len() >= 4, "{ips:?}");
        assert!(ips.len() <= DEFAULT_DEPTH);
        // The captured addresses resolve to this test's functions (the test binary has debug
        // info): symbolisation works after the fact from the raw pointers.
        let mut names = Vec::new();
        for ip in &ips {
            backtrace::resolve(*ip as usize as *mut std::ffi::c_void, |s| {
                if let Some(n) = s.name() {
                    names.push(n.to_string());
                }
            });
        }
        assert!(
            names.iter().any(|n| n.contains("deeper")),
            "symbols: {names:?}"
        );
    }

    #[test]
    fn depth_limit() {
        let mut ips = Vec::new();
        capture(2, &mut ips);
        assert_eq!(ips.len(), 2);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn module_map_holds_this_code() {
        let mods = loaded_modules();
        let here = module_map_holds_this_code as *const () as usize as u64;
        let m = mods
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .expect("the test binary is in the module map");
        assert!(!m.path.is_empty());
        assert!(std::path::Path::new(&m.path).exists(), "{}", m.path);
        assert!(mods.iter().any(|m| m.path.contains("libc.so")));
    }
}
