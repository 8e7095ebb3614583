//! perfkit-symbolize: turns the host call stacks of a trace into functions and source lines,
//! after the run.
//!
//! A trace captured through CUPTI injection holds, per GPU operation, the instruction pointers
//! of the calling stack (`Stack` / `OpStack` records) and the objects loaded in the process
//! (`Module` records, `base` = load bias). An instruction pointer belongs to the module whose
//! `[base, base + size)` holds it; `ip - base` is its address inside that file, which the file's
//! DWARF debug info (`addr2line`) resolves to a function, file and line. [`Symbolizer::caller`]
//! picks the first frame in the program's own code, skipping CUDA, CUPTI, system libraries and
//! dependencies, so a finding can point at the user's source line.
//!
//! ```no_run
//! use perfkit_profiler::model::ModuleInfo;
//! let modules: Vec<ModuleInfo> = Vec::new(); // the trace's Module records
//! let mut sym = perfkit_symbolize::Symbolizer::new(modules);
//! if let Some(frame) = sym.caller(&[0x5555_5555_1234, 0x5555_5555_0042]) {
//!     println!("{}:{}", frame.file.unwrap_or_default(), frame.line.unwrap_or(0));
//! }
//! ```

#![deny(missing_docs)]

use std::collections::HashMap;

use perfkit_profiler::model::ModuleInfo;

/// One resolved frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name, when known.
    pub function: Option<String>,
    /// Source file, when the module has line information.
    pub file: Option<String>,
    /// Source line.
    pub line: Option<u32>,
    /// Path of the module the address is in.
    pub module: String,
}

/// Resolves instruction pointers against a trace's module map, loading each module's debug
/// info once (modules that cannot be read are remembered and skipped).
pub struct Symbolizer {
    modules: Vec<ModuleInfo>,
    loaders: HashMap<String, Option<addr2line::Loader>>,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("modules", &self.modules.len())
            .field("loaded", &self.loaders.len())
            .finish()
    }
}

/// Object files whose frames are never the program's own code: the CUDA stack, the injection
/// library, C/C++ runtimes, Python and PyTorch.
const RUNTIME_LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libcupti.so",
    "libcudart.so",
    "libcublas",
    "libcudnn",
    "libnccl",
    "libperfkit_inject.so",
    "libc.so",
    "libstdc++.so",
    "libgcc_s.so",
    "libpthread.so",
    "ld-linux",
    "libpython",
    "libtorch",
    "libc10",
];

/// Source paths of code that is not the program's: the Rust standard library and dependencies
/// from crates.io or git.
const DEPENDENCY_SOURCES: &[&str] = &[
    "/rustc/",
    "/.cargo/registry/",
    "/.cargo/git/",
    "/library/std/",
    "/library/core/",
];

impl Symbolizer {
    /// A symbolizer over the given modules (the trace's `Module` records).
    pub fn new(modules: impl IntoIterator<Item = ModuleInfo>) -> Symbolizer {
        let mut modules: Vec<ModuleInfo> = modules.into_iter().filter(|m| m.size > 0).collect();
        modules.sort_by_key(|m| m.base);
        Symbolizer {
            modules,
            loaders: HashMap::new(),
        }
    }

    /// The module holding `ip`.
    pub fn module_of(&self, ip: u64) -> Option<&ModuleInfo> {
        let i = self.modules.partition_point(|m| m.base <= ip);
        // The candidates start at or below ip; ranges of different objects do not overlap, but
        // a load bias of 0 (fixed-address executables) makes a wide range: check a few.
        self.modules[..i]
            .iter()
            .rev()
            .find(|m| ip < m.base.saturating_add(m.size))
    }

    /// The frames at `ip` (innermost inlined frame first; empty when the address is in no
    /// module or its module has no debug info or symbols). `ip` is a return address as
    /// unwinders report them: the call instruction before it is what is resolved.
    pub fn resolve(&mut self, ip: u64) -> Vec<Frame> {
        let Some(m) = self.module_of(ip).cloned() else {
            return Vec::new();
        };
        let probe = ip.saturating_sub(1).saturating_sub(m.base);
        let loader = self
            .loaders
            .entry(m.path.clone())
            .or_insert_with(|| addr2line::Loader::new(&m.path).ok());
        let Some(loader) = loader.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Ok(mut frames) = loader.find_frames(probe) {
            while let Ok(Some(f)) = frames.next() {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok())
                    .map(|n| n.into_owned());
                let (file, line) = f
                    .location
                    .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
                out.push(Frame {
                    function,
                    file,
                    line,
                    module: m.path.clone(),
                });
            }
        }
        if out.is_empty()
            && let Some(sym) = loader.find_symbol(probe)
        {
            out.push(Frame {
                function: Some(demangle(sym)),
                file: None,
                line: None,
                module: m.path.clone(),
            });
        }
        out
    }

    /// The first frame of `ips` (innermost first) in the program's own code: in a module that
    /// is not a runtime library, with a source file outside the standard library and
    /// dependencies. For an inlined call, the outermost frame of the program's own code at that
    /// address.
    pub fn caller(&mut self, ips: &[u64]) -> Option<Frame> {
        for &ip in ips {
            let Some(m) = self.module_of(ip) else {
                continue;
            };
            if is_runtime_library(&m.path) {
                continue;
            }
            let frames = self.resolve(ip);
            if let Some(f) = frames.into_iter().find(|f| {
                f.file
                    .as_deref()
                    .is_some_and(|file| !DEPENDENCY_SOURCES.iter().any(|d| file.contains(d)))
            }) {
                return Some(f);
            }
        }
        None
    }
}

/// Whether `path` is one of the runtime libraries whose frames are never
/// the program's own.
pub fn is_runtime_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    RUNTIME_LIBRARIES.iter().any(|l| name.starts_with(l))
}

/// Demangles a Rust or C++ symbol (CUDA kernel names from C++ are mangled:
/// `_Z4gemmPfS_S_i` -> `gemm(float*, float*, float*, int)`); other names are returned as is.
pub fn demangle(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules() -> Vec<ModuleInfo> {
        perfkit_inject::stack::loaded_modules()
            .into_iter()
            .map(|m| ModuleInfo {
                path: m.path,
                base: m.bias,
                size: m.end.saturating_sub(m.bias),
            })
            .collect()
    }

    #[inline(never)]
    fn user_code(out: &mut Vec<u64>) {
        perfkit_inject::stack::capture(64, out); // the line the caller must point at
        std::hint::black_box(&out);
    }

    #[test]
    fn a_captured_stack_resolves_to_this_file_and_line() {
        let mut ips = Vec::new();
        user_code(&mut ips);
        let mut sym = Symbolizer::new(modules());
        // In a real capture the unwinder's frames are in libperfkit_inject.so, a runtime library;
        // here they are linked into the test executable: drop them.
        let after_capture = ips
            .iter()
            .take_while(|&&ip| {
                let frames = sym.resolve(ip);
                frames.is_empty()
                    || frames.iter().any(|f| {
                        f.function.as_deref().is_some_and(|n| {
                            n.contains("stack::capture") || n.starts_with("backtrace::")
                        })
                    })
            })
            .count();
        let frame = sym
            .caller(&ips[after_capture..])
            .expect("a frame of this test");
        assert!(
            frame.file.as_deref().unwrap().ends_with("lib.rs"),
            "{frame:?}"
        );
        let src = include_str!("lib.rs");
        let want = src
            .lines()
            .position(|l| l.contains("the line the caller must point at"))
            .unwrap() as u32
            + 1;
        assert_eq!(frame.line, Some(want), "{frame:?}");
        assert!(
            frame.function.as_deref().unwrap().contains("user_code"),
            "{frame:?}"
        );
    }

    #[test]
    fn addresses_outside_every_module_resolve_to_nothing() {
        let mut sym = Symbolizer::new(modules());
        assert!(sym.resolve(8).is_empty());
        assert_eq!(sym.caller(&[8, 16]), None);
        let none = Symbolizer::new(Vec::new());
        assert!(none.module_of(0x1234).is_none());
    }

    #[test]
    fn module_lookup_and_unreadable_modules() {
        let mut sym = Symbolizer::new(vec![
            ModuleInfo {
                path: "/nonexistent/libfoo.so".into(),
                base: 0x7000_0000,
                size: 0x1000,
            },
            ModuleInfo {
                path: "/nonexistent/app".into(),
                base: 0,
                size: 0x50_0000,
            },
        ]);
        assert_eq!(
            sym.module_of(0x7000_0800).unwrap().path,
            "/nonexistent/libfoo.so"
        );
        assert_eq!(sym.module_of(0x40_1000).unwrap().path, "/nonexistent/app");
        assert!(sym.module_of(0x7000_1000).is_none());
        assert!(
            sym.resolve(0x7000_0800).is_empty(),
            "unreadable: no frames, no panic"
        );
    }

    #[test]
    fn runtime_libraries_and_demangling() {
        assert!(is_runtime_library("/usr/lib/x86_64-linux-gnu/libcuda.so.1"));
        assert!(is_runtime_library(
            "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"
        ));
        assert!(!is_runtime_library("/home/me/train/target/release/train"));
        assert_eq!(
            demangle("_Z4gemmPfS_S_i"),
            "gemm(float*, float*, float*, int)"
        );
        assert_eq!(demangle("synth_batch"), "synth_batch");
    }
}
