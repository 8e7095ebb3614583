//! PK402 `visible-devices-after-cuda-init`: `CUDA_VISIBLE_DEVICES` changed once it no longer counts.

use std::collections::HashMap;

use syn::Expr;

use crate::analysis::{CallFact, CallRef, CrateContext, FileId, path_text};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::pk201::strip_ref;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags `std::env::set_var("CUDA_VISIBLE_DEVICES", ..)` (or `remove_var`) that runs after the
    /// process has initialised CUDA.
    ///
    /// Detected: a CUDA initialisation earlier in the same function, either directly (candle
    /// `Device::new_cuda`/`cuda_if_available`, tch `Cuda::is_available`/`device_count`/
    /// `Device::cuda_if_available`, burn `Device::cuda`/`CudaDevice::new`, cudarc `CudaContext::new`/
    /// `device_count`/`result::init`) or through a function of the same crate called earlier that
    /// (transitively) does one; and a helper that sets the variable when its caller has initialised
    /// CUDA before calling it.
    ///
    /// Not detected: initialisation in another thread, in a caller's caller, or hidden behind a
    /// trait object or a closure stored for later; the variable name held in a constant. Branches
    /// are not told apart: an initialisation in one arm of an `if` counts for code after the `if`.
    /// Setting the variable on a child process (`Command::env`) is never flagged.
    ///
    /// ## Why is this bad?
    /// The CUDA driver reads `CUDA_VISIBLE_DEVICES` once, when it is initialised. Changing it later
    /// does nothing for the running process: the program keeps seeing (and using) every GPU, so a
    /// per-rank or per-job GPU assignment silently does not happen and several workers pile onto
    /// the same card. tch's `Cuda::is_available()` and cudarc's `device_count()` initialise the
    /// driver too, so even "just checking" first is too late.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let dev = Device::cuda_if_available(0)?;
    /// unsafe { std::env::set_var("CUDA_VISIBLE_DEVICES", rank.to_string()) };
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// // First thing in `main`, before any CUDA call (or `Command::new(..).env(..)` for a child).
    /// unsafe { std::env::set_var("CUDA_VISIBLE_DEVICES", rank.to_string()) };
    /// let dev = Device::cuda_if_available(0)?;
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `os.environ["CUDA_VISIBLE_DEVICES"] = ...` (or
    /// `os.environ.setdefault`, `os.putenv`) after a call that initialises CUDA
    /// (`torch.cuda.is_available()`, `device_count()`, `set_device`, `.cuda()`) earlier in the same
    /// function or at module level. A bare `import torch` does not initialise CUDA.
    ///
    /// ```python
    /// if torch.cuda.is_available():
    ///     os.environ["CUDA_VISIBLE_DEVICES"] = "1"  # too late
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// os.environ["CUDA_VISIBLE_DEVICES"] = "1"  # first
    /// if torch.cuda.is_available():
    ///     ...
    /// ```
    pub VisibleDevicesAfterCudaInit {
        code: "PK402",
        name: "visible-devices-after-cuda-init",
        severity: Error,
        fixable: false,
    }
}

impl Rule for VisibleDevicesAfterCudaInit {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        // Cheap filter: most crates never touch the variable.
        let sets: Vec<(FileId, &CallFact<'_>)> = cx
            .calls()
            .filter(|(_, call)| !call.in_test && is_visible_devices_write(call))
            .collect();
        if sets.is_empty() {
            return;
        }
        let mut graph = InitGraph::new(cx);
        let mut reported: Vec<(FileId, usize)> = Vec::new();
        for &(file, set) in &sets {
            let Some(f) = set.fn_idx else {
                continue;
            };
            let at = set.call.span().byte_range().start;
            if let Some(event) = graph.first_init_before(file, f, at) {
                reported.push((file, at));
                out.push(finding(cx, file, set, event.note()));
            }
        }
        // A helper that sets the variable, called after its caller initialised CUDA.
        for &(file, set) in &sets {
            let Some(g) = set.fn_idx else {
                continue;
            };
            let at = set.call.span().byte_range().start;
            if reported.contains(&(file, at)) {
                continue;
            }
            let callers = graph.callers_of((file, g));
            for (caller_file, caller_fn, call_at, call_line) in callers {
                let Some(event) = graph.first_init_before(caller_file, caller_fn, call_at) else {
                    continue;
                };
                let caller = cx.file(caller_file);
                let caller_name = caller.facts.fns[caller_fn].name.to_string();
                let note = format!(
                    "called from `{caller_name}` at {}:{call_line}, where {}",
                    caller.path().display(),
                    event.note()
                );
                reported.push((file, at));
                out.push(finding(cx, file, set, note));
                break;
            }
        }
    }
}

fn finding(cx: &CrateContext<'_>, file: FileId, set: &CallFact<'_>, note: String) -> Finding {
    let what = if set.call.name() == "remove_var" {
        "remove_var(\"CUDA_VISIBLE_DEVICES\")"
    } else {
        "set_var(\"CUDA_VISIBLE_DEVICES\", ..)"
    };
    Finding::new(
        file,
        cx.region(set.call.name_span()),
        format!(
            "`{what}` runs after CUDA was initialised, so it does not change which GPUs this \
             process uses"
        ),
        "set it before the first CUDA call (first thing in `main`), or give it to a child process \
         with `Command::env`",
    )
    .with_note(note)
}

/// `set_var("CUDA_VISIBLE_DEVICES", ..)` / `remove_var("CUDA_VISIBLE_DEVICES")`.
fn is_visible_devices_write(call: &CallFact<'_>) -> bool {
    let CallRef::Path(c, _) = call.call else {
        return false;
    };
    if call.name != "set_var" && call.name != "remove_var" {
        return false;
    }
    matches!(
        c.args.first().map(strip_ref),
        Some(Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })) if s.value() == "CUDA_VISIBLE_DEVICES"
    )
}

/// A call that initialises CUDA in the calling process.
fn is_cuda_init(call: &CallFact<'_>) -> bool {
    let CallRef::Path(c, path) = call.call else {
        return false;
    };
    let n = path.segments.len();
    if n < 2 {
        return false;
    }
    let qualifier = &path.segments[n - 2].ident;
    let is = |q: &str| qualifier == q;
    match call.name {
        // tch: every `Cuda::` query goes through the CUDA runtime.
        _ if is("Cuda") => true,
        // candle
        "new_cuda" | "new_cuda_with_stream" | "cuda_if_available" => is("Device"),
        // burn (current and 0.21)
        "cuda" => is("Device"),
        // burn's `CudaDevice::new`, cudarc's `CudaContext::new`
        "new" => is("CudaDevice") || is("CudaContext"),
        "device_count" => is("CudaContext"),
        // cudarc
        "init" => is("result") && c.args.is_empty(),
        _ => false,
    }
}

/// A CUDA initialisation that happens before some point of a function.
struct InitEvent {
    line: usize,
    /// What initialises: the call itself or the crate function that does it.
    what: String,
    via_fn: bool,
}

impl InitEvent {
    fn note(&self) -> String {
        if self.via_fn {
            format!(
                "CUDA is initialised at line {}, inside the call to `{}`",
                self.line, self.what
            )
        } else {
            format!(
                "CUDA is initialised at line {} by `{}`",
                self.line, self.what
            )
        }
    }
}

type FnKey = (FileId, usize);

/// Which functions of the crate (transitively) initialise CUDA, and who calls whom.
struct InitGraph<'c, 'a> {
    cx: &'c CrateContext<'a>,
    by_name: HashMap<String, Vec<FnKey>>,
    state: HashMap<FnKey, Visit>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    InProgress,
    Done(bool),
}

impl<'c, 'a> InitGraph<'c, 'a> {
    fn new(cx: &'c CrateContext<'a>) -> Self {
        let mut by_name: HashMap<String, Vec<FnKey>> = HashMap::new();
        for file in cx.files() {
            for (i, f) in file.facts.fns.iter().enumerate() {
                if !f.is_test {
                    by_name
                        .entry(f.name.to_string())
                        .or_default()
                        .push((file.id, i));
                }
            }
        }
        InitGraph {
            cx,
            by_name,
            state: HashMap::new(),
        }
    }

    /// The crate functions a call may resolve to (by name; `Type::f` by its `impl` type).
    fn resolve(&self, caller: FnKey, call: &CallFact<'_>) -> Vec<FnKey> {
        let Some(candidates) = self.by_name.get(call.name) else {
            return Vec::new();
        };
        let caller_ty = self.cx.file(caller.0).facts.fns[caller.1].self_ty.clone();
        let wanted_ty: Option<Option<String>> = match call.call {
            CallRef::Method(_) => None,
            CallRef::Path(_, path) => {
                let n = path.segments.len();
                if n == 1 {
                    Some(None)
                } else {
                    let q = path.segments[n - 2].ident.to_string();
                    Some(Some(if q == "Self" {
                        caller_ty.unwrap_or(q)
                    } else {
                        q
                    }))
                }
            }
        };
        candidates
            .iter()
            .copied()
            .filter(|&(file, i)| {
                let f = &self.cx.file(file).facts.fns[i];
                match &wanted_ty {
                    // `x.method()`: any method of that name.
                    None => f.self_ty.is_some(),
                    // `helper()`: a free function (or one in scope through `use`).
                    Some(None) => f.self_ty.is_none(),
                    Some(Some(ty)) => f.self_ty.as_deref() == Some(ty.as_str()),
                }
            })
            .collect()
    }

    /// Whether a crate function initialises CUDA (directly or through the functions it calls).
    fn inits(&mut self, key: FnKey) -> bool {
        match self.state.get(&key) {
            Some(Visit::Done(v)) => return *v,
            // A cycle: the function is being looked at already; it adds nothing new.
            Some(Visit::InProgress) => return false,
            None => {}
        }
        self.state.insert(key, Visit::InProgress);
        let cx = self.cx;
        let facts = &cx.file(key.0).facts;
        let mut result = false;
        for call in facts.calls.iter().filter(|c| c.fn_idx == Some(key.1)) {
            if is_cuda_init(call) {
                result = true;
                break;
            }
            let targets = self.resolve(key, call);
            if targets.into_iter().any(|t| t != key && self.inits(t)) {
                result = true;
                break;
            }
        }
        self.state.insert(key, Visit::Done(result));
        result
    }

    /// The first CUDA initialisation in function `f` of `file` that starts before byte `before`.
    fn first_init_before(&mut self, file: FileId, f: usize, before: usize) -> Option<InitEvent> {
        let cx = self.cx;
        let facts = &cx.file(file).facts;
        let mut calls: Vec<&CallFact<'_>> = facts
            .calls
            .iter()
            .filter(|c| c.fn_idx == Some(f) && c.call.span().byte_range().start < before)
            .collect();
        calls.sort_by_key(|c| c.call.span().byte_range().start);
        for call in calls {
            let line = cx.region(call.call.name_span()).line;
            if is_cuda_init(call) {
                return Some(InitEvent {
                    line,
                    what: call_text(call),
                    via_fn: false,
                });
            }
            let targets = self.resolve((file, f), call);
            if targets.into_iter().any(|t| t != (file, f) && self.inits(t)) {
                return Some(InitEvent {
                    line,
                    what: call.name.to_string(),
                    via_fn: true,
                });
            }
        }
        None
    }

    /// Call sites of function `target` in other functions: (file, fn, byte offset, line).
    fn callers_of(&self, target: FnKey) -> Vec<(FileId, usize, usize, usize)> {
        let mut sites = Vec::new();
        for (file, call) in self.cx.calls() {
            let Some(f) = call.fn_idx else {
                continue;
            };
            if call.in_test || (file, f) == target {
                continue;
            }
            if self.resolve((file, f), call).contains(&target) {
                let at = call.call.span().byte_range().start;
                sites.push((file, f, at, self.cx.region(call.call.name_span()).line));
            }
        }
        sites
    }
}

/// `CudaContext::new`, `Cuda::is_available`: the last two path segments.
fn call_text(call: &CallFact<'_>) -> String {
    match call.call {
        CallRef::Path(_, path) => path_text(path),
        CallRef::Method(m) => m.method.to_string(),
    }
}

/// PK402's Python form: `os.environ["CUDA_VISIBLE_DEVICES"] = ..` (or `os.environ.setdefault`,
/// `os.putenv`) after a call that initialises CUDA (`torch.cuda.is_available()`, `device_count()`,
/// `set_device`, `.cuda()`) earlier in the same function or at module level. A bare `import torch`
/// does not initialise CUDA.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    let setters: Vec<(usize, &PyCall<'_>)> = cx
        .calls_named(&["setdefault", "putenv"])
        .filter(|(_, call)| matches!(call.path.as_deref(), Some(p) if p.ends_with("environ.setdefault") || p == "os.putenv"))
        .collect();
    for (file, unit) in cx.units.iter().enumerate() {
        let mut sets: Vec<(TextRange, Option<usize>)> = Vec::new();
        for (target, key, range, fn_idx) in &unit.facts.subscript_assigns {
            if facts::dotted(target).is_some_and(|p| p.ends_with("environ")) && visible_devices(key)
            {
                sets.push((*range, *fn_idx));
            }
        }
        for (_, call) in setters.iter().filter(|(f, _)| *f == file) {
            if call
                .call
                .arguments
                .args
                .first()
                .is_some_and(visible_devices)
            {
                sets.push((call.call.range(), call.fn_idx));
            }
        }
        for (range, fn_idx) in sets {
            let at = range.start().to_usize();
            let init = unit.facts.calls.iter().find(|c| {
                c.start < at && (c.fn_idx == fn_idx || c.fn_idx.is_none()) && initialises_cuda(c)
            });
            let Some(init) = init else { continue };
            let line = unit.file.line_name(init.start);
            let what = init.display_name();
            out.push(cx.finding(
                file,
                range,
                format!("`CUDA_VISIBLE_DEVICES` is set after `{what}()` on {line} initialised CUDA, so it has no effect"),
                "set it before anything touches CUDA (first thing in the program, or in the shell that starts it)",
            ));
        }
    }
}

fn visible_devices(expr: &PyExpr) -> bool {
    matches!(expr, PyExpr::StringLiteral(s) if s.value.to_str() == "CUDA_VISIBLE_DEVICES")
}

fn initialises_cuda(call: &PyCall<'_>) -> bool {
    if call.method == Some("cuda") {
        return true;
    }
    matches!(
        call.path.as_deref(),
        Some(
            "torch.cuda.is_available"
                | "torch.cuda.device_count"
                | "torch.cuda.set_device"
                | "torch.cuda.init"
                | "torch.cuda.current_device"
                | "torch.cuda.get_device_name"
                | "torch.cuda.mem_get_info"
                | "torch.cuda.get_device_properties"
        )
    )
}
