//! PK401 `hardcoded-cuda-device`: a literal CUDA ordinal with no availability check or fallback.

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use crate::analysis::{CallFact, CallRef, CrateContext, CrateFile, DeviceKind};
#[allow(unused_imports)]
use crate::python::prelude::*;
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
    /// `CudaContext::device_count()`, `is_culib_present()`, `Device::enumerate(..)`); a CPU device
    /// offered as the alternative for the same value (the other branch of an `if`/`else` or `match`
    /// that picks the device); a call whose error is handled (`unwrap_or`, `unwrap_or_else`,
    /// `or_else`, `or`, `ok`, `if let Ok(..) =`, `match`); constant definitions (`pub const
    /// FLOAT_CUDA: .. = (.., Device::Cuda(0))` is a definition; its uses are checked); match
    /// patterns; test code. A CPU device elsewhere in the function does not silence it. The check is
    /// per function: a check in the caller is not seen.
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
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `"cuda:0"`, `.cuda(0)`, `torch.device("cuda", 0)` and
    /// `torch.cuda.set_device(0)` in a module that never checks `torch.cuda.is_available()` or
    /// `torch.cuda.device_count()`.
    ///
    /// ```python
    /// device = torch.device("cuda:0")
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    /// ```
    pub HardcodedCudaDevice {
        code: "PK401",
        name: "hardcoded-cuda-device",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for HardcodedCudaDevice {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

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
                // A definition (`const`, `static` at item level) is not a choice of device: its uses
                // may be.
                let Some(fn_idx) = call.fn_idx else {
                    continue;
                };
                let at = call.call.span().byte_range();
                if fn_checks_for_gpu(crate_file, fn_idx)
                    || error_is_handled(crate_file, call)
                    || has_cpu_alternative(crate_file, fn_idx, at)
                {
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

/// The function checks that a GPU is there (`cuda_is_available()`, `device_count()`, ...).
/// `cuda_if_available` is not a check but a device of its own: another value's fallback does not
/// cover this one.
fn fn_checks_for_gpu(file: &CrateFile<'_>, f: usize) -> bool {
    file.facts
        .calls
        .iter()
        .any(|c| c.fn_idx == Some(f) && is_availability_check(c) && c.name != "cuda_if_available")
}

/// Whether the device at byte range `at` of function `f` has a CPU alternative for the same value:
/// another branch of an enclosing `if`/`else` or `match` evaluates to a CPU device
/// (`if cuda { Device::new_cuda(0)? } else { Device::Cpu }`), or the call is what an `if let` or
/// `match` tests (`if let Ok(dev) = Device::new_cuda(0) { .. }`). A CPU device elsewhere in the
/// function (a comparison tensor, a snapshot buffer) is not an alternative.
fn has_cpu_alternative(file: &CrateFile<'_>, f: usize, at: std::ops::Range<usize>) -> bool {
    let mut finder = Alternatives { at, found: false };
    finder.visit_block(file.facts.fns[f].block);
    finder.found
}

struct Alternatives {
    at: std::ops::Range<usize>,
    found: bool,
}

impl Alternatives {
    fn contains(&self, node: &impl Spanned) -> bool {
        let range = node.span().byte_range();
        range.start <= self.at.start && self.at.end <= range.end
    }
    fn is_target(&self, expr: &syn::Expr) -> bool {
        strip_result(expr).span().byte_range() == self.at
    }
}

impl<'ast> Visit<'ast> for Alternatives {
    fn visit_expr_if(&mut self, e: &'ast syn::ExprIf) {
        if let Some((_, other)) = &e.else_branch {
            if self.contains(&e.then_branch) && value_is_cpu_expr(other) {
                self.found = true;
            }
            if self.contains(&**other) && value_is_cpu_block(&e.then_branch) {
                self.found = true;
            }
        }
        visit::visit_expr_if(self, e);
    }

    fn visit_expr_let(&mut self, e: &'ast syn::ExprLet) {
        // `if let Ok(dev) = Device::new_cuda(0)`: the failure takes the other path.
        if self.is_target(&e.expr) {
            self.found = true;
        }
        visit::visit_expr_let(self, e);
    }

    fn visit_expr_match(&mut self, e: &'ast syn::ExprMatch) {
        if self.is_target(&e.expr) {
            self.found = true;
        }
        if let Some(mine) = e.arms.iter().position(|arm| self.contains(&*arm.body))
            && e.arms
                .iter()
                .enumerate()
                .any(|(i, arm)| i != mine && value_is_cpu_expr(&arm.body))
        {
            self.found = true;
        }
        visit::visit_expr_match(self, e);
    }
}

/// Whether an expression evaluates to a CPU device: `Device::Cpu`, `Ok(Device::Cpu)`, a block or
/// `if` whose value is one.
fn value_is_cpu_expr(expr: &syn::Expr) -> bool {
    match expr {
        syn::Expr::Block(b) => value_is_cpu_block(&b.block),
        syn::Expr::If(i) => {
            value_is_cpu_block(&i.then_branch)
                || i.else_branch
                    .as_ref()
                    .is_some_and(|(_, e)| value_is_cpu_expr(e))
        }
        syn::Expr::Paren(p) => value_is_cpu_expr(&p.expr),
        syn::Expr::Return(r) => r.expr.as_deref().is_some_and(value_is_cpu_expr),
        syn::Expr::Call(c) if matches!(&*c.func, syn::Expr::Path(p) if p.path.is_ident("Ok") || p.path.is_ident("Some")) => {
            c.args.first().is_some_and(value_is_cpu_expr)
        }
        _ => crate::analysis::device::device_of_expr(expr) == DeviceKind::Cpu,
    }
}

fn value_is_cpu_block(block: &syn::Block) -> bool {
    match block.stmts.last() {
        Some(syn::Stmt::Expr(e, None)) => value_is_cpu_expr(e),
        _ => false,
    }
}

/// `Device::new_cuda(0).unwrap_or(Device::Cpu)`, `CudaContext::new(0).ok()?`: the failure is
/// handled. `CudaContext::new(0).is_ok()` (or `is_err()`) is the availability check itself.
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
            "is_ok",
            "is_err",
            "is_ok_and",
            "is_err_and",
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
    let mut finder = KindFinder {
        found: Vec::new(),
        tch: cx.uses(crate_file.id, crate::analysis::Framework::Tch),
    };
    finder.visit_file(crate_file.ast());
    for path in finder.found {
        let span = path.span();
        if cx.is_test_code(crate_file.id, span) {
            continue;
        }
        let at = span.byte_range().start;
        // The innermost function around the constant; a constant defined in terms of another
        // (`const DEV: (Kind, Device) = kind::FLOAT_CUDA;`) is a definition, not a choice.
        let Some(fn_idx) = crate_file.facts.innermost_fn(at) else {
            continue;
        };
        if fn_checks_for_gpu(crate_file, fn_idx)
            || has_cpu_alternative(crate_file, fn_idx, span.byte_range())
        {
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
    /// The file uses tch, so an upper-case `*_CUDA` name is one of its `kind` constants.
    tch: bool,
}

impl<'ast> Visit<'ast> for KindFinder<'ast> {
    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        let segs = &e.path.segments;
        let n = segs.len();
        let last = segs[n - 1].ident.to_string();
        // `kind::FLOAT_CUDA`, or the constant imported (`use tch::kind::FLOAT_CUDA;`).
        let qualified = n >= 2 && segs[n - 2].ident == "kind";
        let imported = n == 1
            && self.tch
            && last
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if (qualified || imported) && last.ends_with("_CUDA") {
            self.found.push(&e.path);
        }
        visit::visit_expr_path(self, e);
    }
}

/// PK401's Python form: `"cuda:0"`, `.cuda(0)`, `torch.device("cuda", 0)`,
/// `torch.cuda.set_device(0)` in a module that never checks `torch.cuda.is_available()` or
/// `torch.cuda.device_count()`.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.literal_calls() {
        let unit = &cx.units[file];
        if unit.file.test_file || cx.checks_devices(file) {
            continue;
        }
        let args = &call.call.arguments;
        let literal_index = |e: &PyExpr| matches!(e, PyExpr::NumberLiteral(_));
        let hardcoded: Option<TextRange> = match (call.path.as_deref(), call.method) {
            (Some("torch.device"), _) if args.args.len() == 2 && literal_index(&args.args[1]) => {
                Some(call.call.range())
            }
            (Some("torch.cuda.set_device"), _) if args.args.first().is_some_and(literal_index) => {
                Some(call.call.range())
            }
            (_, Some("cuda")) if args.args.first().is_some_and(literal_index) => {
                Some(PyContext::callee_range(call))
            }
            _ => args
                .args
                .iter()
                .chain(args.keywords.iter().map(|k| &k.value))
                .find(|e| cuda_index_literal(e))
                .map(Ranged::range),
        };
        let Some(range) = hardcoded else { continue };
        let text = unit.file.text(range).to_string();
        out.push(cx.finding(
            file,
            range,
            format!("`{text}` hardcodes a GPU index with no availability check"),
            "choose the device at run time: `torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")`, or the process's `LOCAL_RANK`",
        ));
    }
}

/// `"cuda:0"`, `"cuda:1"`, ...
fn cuda_index_literal(expr: &PyExpr) -> bool {
    let PyExpr::StringLiteral(s) = expr else {
        return false;
    };
    s.value
        .to_str()
        .strip_prefix("cuda:")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}
