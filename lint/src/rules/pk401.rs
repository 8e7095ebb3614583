//! PK401 `hardcoded-cuda-device`: a literal CUDA ordinal with no availability check or fallback.

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use crate::analysis::{CallFact, CallRef, CrateContext, CrateFile};
use crate::rules::pk201::strip_result;
use crate::rules::pk301::int_literal;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a CUDA device chosen by a literal ordinal with no availability check or CPU fallback.
    ///
    /// Recognized: candle `Device::new_cuda(0)`, tch `Device::Cuda(0)` and `kind::FLOAT_CUDA` (and
    /// the other `kind::*_CUDA` constants), burn `Device::cuda(0)`, `CudaDevice::new(0)` and
    /// `LibTorchDevice::Cuda(0)`, cudarc `CudaContext::new(0)`, each in a function that neither
    /// checks that a GPU is available nor falls back to the CPU.
    ///
    /// Not flagged: an ordinal that is not a literal (a rank, a configuration value); a function that
    /// also checks for a GPU (`cuda_is_available()`, `Cuda::is_available()`, `cuda_if_available`,
    /// `CudaContext::device_count()`, `is_culib_present()`, `Device::enumerate(..)`) or mentions a
    /// CPU device as fallback; a call whose error is handled by `unwrap_or`, `unwrap_or_else`,
    /// `or_else`, `or` or `ok`; match patterns; test code. The check is per function: a check in the
    /// caller is not seen.
    ///
    /// ## Why is this bad?
    /// The program cannot run where GPU 0 does not exist: on a laptop or CI runner without a GPU it
    /// stops at start-up with a driver error instead of falling back or saying what is missing. On a
    /// shared multi-GPU machine every job that hard-codes 0 lands on the same card, which then runs
    /// out of memory or time-slices between jobs while the other cards idle; the well-known advice is
    /// to pick the GPU at run time (by availability or free memory) or take it from the scheduler's
    /// configuration.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let dev = Device::new_cuda(0)?;
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let dev = Device::cuda_if_available(args.gpu)?;
    /// ```
    pub HardcodedCudaDevice {
        code: "PK401",
        name: "hardcoded-cuda-device",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for HardcodedCudaDevice {
    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for crate_file in cx.files() {
            let file = crate_file.id;
            for call in &crate_file.facts.calls {
                if call.in_test {
                    continue;
                }
                let CallRef::Path(expr, path) = call.call else {
                    continue;
                };
                let Some(pattern) = device_pattern(call.name, path) else {
                    continue;
                };
                let Some(ordinal) = expr.args.first().and_then(int_literal) else {
                    // A rank or configuration value: the choice is made at run time.
                    continue;
                };
                if expr.args.len() != 1 {
                    continue;
                }
                if fn_has_fallback(crate_file, call.fn_idx) || error_is_handled(crate_file, call) {
                    continue;
                }
                out.push(Finding::new(
                    file,
                    cx.region_of(path),
                    format!(
                        "CUDA device {ordinal} is hard-coded with no availability check or fallback"
                    ),
                    pattern.help(),
                ));
            }
            kind_constants(cx, crate_file, out);
        }
    }
}

/// Which device constructor a path is.
#[derive(Clone, Copy)]
enum Pattern {
    Candle,
    Tch,
    Burn,
    BurnBackend,
    Cudarc,
}

impl Pattern {
    fn help(self) -> String {
        match self {
            Pattern::Candle => {
                "use `Device::cuda_if_available(ordinal)?`, which falls back to the CPU, \
                                and take the ordinal from the configuration or the process rank"
            }
            Pattern::Tch => {
                "use `Device::cuda_if_available()` or check `Cuda::is_available()` and fall \
                             back to `Device::Cpu`; take the ordinal from the configuration"
            }
            Pattern::Burn => {
                "pick the device from `Device::enumerate(..)` (or the configuration) and \
                              fall back to `Device::cpu()` when no GPU is present"
            }
            Pattern::BurnBackend => {
                "take the device index from the configuration and fall back to a \
                                     CPU backend when no GPU is present"
            }
            Pattern::Cudarc => {
                "check `is_culib_present()` and `CudaContext::device_count()` first \
                                (report a clear error when there is no GPU) and take the ordinal \
                                from the configuration"
            }
        }
        .to_string()
    }
}

/// Which device constructor a path call is; `name` is its last segment (the called name).
fn device_pattern(name: &str, path: &syn::Path) -> Option<Pattern> {
    // Filter on the (already interned) name first: most calls are none of these.
    if !matches!(
        name,
        "new_cuda" | "new_cuda_with_stream" | "Cuda" | "cuda" | "new"
    ) {
        return None;
    }
    let n = path.segments.len();
    if n < 2 {
        return None;
    }
    let ty = &path.segments[n - 2].ident;
    let is = |t: &str| ty == t;
    match name {
        "new_cuda" | "new_cuda_with_stream" if is("Device") => Some(Pattern::Candle),
        // candle's `Device::Cuda` wraps a `CudaDevice`, so a literal argument means tch.
        "Cuda" if is("Device") => Some(Pattern::Tch),
        "cuda" if is("Device") => Some(Pattern::Burn),
        "new" if is("CudaDevice") => Some(Pattern::BurnBackend),
        "Cuda" if is("LibTorchDevice") => Some(Pattern::BurnBackend),
        "new" if is("CudaContext") => Some(Pattern::Cudarc),
        _ => None,
    }
}

/// Calls that check for a GPU before using one.
fn is_availability_check(call: &CallFact<'_>) -> bool {
    match call.name {
        "cuda_is_available" | "is_available" | "has_cuda" | "cuda_if_available"
        | "device_count" | "is_culib_present" | "get_count" | "cudnn_is_available" => true,
        "enumerate" => call.call.qualifier().is_some_and(|q| q == "Device"),
        _ => false,
    }
}

/// The function checks for a GPU, or names a CPU device it can fall back to.
fn fn_has_fallback(file: &CrateFile<'_>, fn_idx: Option<usize>) -> bool {
    let Some(f) = fn_idx else {
        // Item level (`const`, `static`): nothing can check.
        return false;
    };
    if file.facts.fns[f].device.cpu > 0 {
        return true;
    }
    file.facts
        .calls
        .iter()
        .any(|c| c.fn_idx == Some(f) && is_availability_check(c))
}

/// `Device::new_cuda(0).unwrap_or(Device::Cpu)`, `CudaContext::new(0).ok()?`: the failure is handled.
fn error_is_handled(file: &CrateFile<'_>, call: &CallFact<'_>) -> bool {
    let at = call.call.span().byte_range();
    file.facts.calls.iter().any(|c| {
        let CallRef::Method(m) = c.call else {
            return false;
        };
        let handles = [
            "unwrap_or",
            "unwrap_or_else",
            "unwrap_or_default",
            "or_else",
            "or",
            "ok",
        ]
        .iter()
        .any(|name| m.method == name);
        handles && c.fn_idx == call.fn_idx && strip_result(&m.receiver).span().byte_range() == at
    })
}

/// tch `kind::FLOAT_CUDA` and friends: `(Kind::Float, Device::Cuda(0))` in disguise.
fn kind_constants(cx: &CrateContext<'_>, crate_file: &CrateFile<'_>, out: &mut Vec<Finding>) {
    // Cheap filter before walking the tree.
    if memchr::memmem::find(crate_file.source().as_bytes(), b"_CUDA").is_none() {
        return;
    }
    let mut finder = KindFinder { found: Vec::new() };
    finder.visit_file(crate_file.ast());
    for path in finder.found {
        let span = path.span();
        if cx.is_test_code(crate_file.id, span) {
            continue;
        }
        let at = span.byte_range().start;
        // The innermost function around the constant.
        let fn_idx = crate_file.facts.innermost_fn(at);
        if fn_has_fallback(crate_file, fn_idx) {
            continue;
        }
        let name = path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        out.push(Finding::new(
            crate_file.id,
            cx.region_of(path),
            format!(
                "`kind::{name}` hard-codes CUDA device 0 with no availability check or fallback"
            ),
            "pass `(Kind::Float, device)` with a device from `Device::cuda_if_available()` instead",
        ));
    }
}

struct KindFinder<'ast> {
    found: Vec<&'ast syn::Path>,
}

impl<'ast> Visit<'ast> for KindFinder<'ast> {
    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        let segs = &e.path.segments;
        let n = segs.len();
        if n >= 2 && segs[n - 2].ident == "kind" && segs[n - 1].ident.to_string().ends_with("_CUDA")
        {
            self.found.push(&e.path);
        }
        visit::visit_expr_path(self, e);
    }
}
