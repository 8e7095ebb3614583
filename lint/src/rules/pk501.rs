//! PK501 `full-precision-training`: a GPU training crate with no 16-bit floats anywhere.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use crate::analysis::{CallRef, CrateContext, CrateFile, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags, once per training function, GPU training code whose program never uses 16-bit floats
    /// or mixed precision.
    ///
    /// A program is a build target (the library, each binary, each example). The function holds a
    /// step loop (or launches burn's `SupervisedTraining`/`LearnerBuilder`), its program names a GPU
    /// device or backend, and none of the program's files mentions a 16-bit float type or mixed
    /// precision (candle `DType::BF16`/`F16`, burn `f16`/`bf16` elements or
    /// `FloatDType::BF16`/`F16`, tch `Kind::Half`/`Kind::BFloat16`, `vs.half()`/`vs.bfloat16()` or
    /// `tch::autocast`, the `half` crate's types).
    ///
    /// The finding points where full precision is chosen: the first explicit 32-bit dtype in the
    /// training function (`VarBuilder::from_varmap(&vm, DType::F32, &dev)`, `Kind::Float`), else
    /// at item level in the program (a backend's `f32` element such as `type B = Cuda<f32, i32>;`),
    /// else the training function itself when the dtype is left to the default.
    ///
    /// Not flagged: programs without a step loop (inference, libraries), programs that only ever
    /// use the CPU, and programs that mention a 16-bit type anywhere, even in code that may not be
    /// on the hot path (the rule cannot tell, and prefers silence). A 16-bit option in the library
    /// of the package does not count for an example that never uses it.
    ///
    /// ## Why is this bad?
    /// Tensor cores run bf16/f16 matrix multiplications many times faster than f32, and 16-bit
    /// activations halve the memory traffic and the memory footprint (so batches can grow). Mixed
    /// precision (16-bit compute, f32 master weights and loss) is the standard way to train on
    /// current GPUs and usually converges like f32. Staying in f32 leaves most of the GPU's
    /// throughput unused.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let vb = VarBuilder::from_varmap(&varmap, DType::BF16, &dev);
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags Lightning's `Trainer(precision=32)` / `"32-true"` (also
    /// `Fabric`), and an optimizer built in a package where no autocast, bfloat16 or half precision
    /// appears anywhere (reported once per package, at the optimizer).
    ///
    /// ```python
    /// opt = torch.optim.AdamW(model.parameters())
    /// for x, y in loader:
    ///     loss = criterion(model(x), y)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// opt = torch.optim.AdamW(model.parameters())
    /// for x, y in loader:
    ///     with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    ///         loss = criterion(model(x), y)
    /// ```
    pub FullPrecisionTraining {
        code: "PK501",
        name: "full-precision-training",
        severity: Note,
        fixable: false,
    }
}

impl Rule for FullPrecisionTraining {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        // Each program (build target: the library, each binary, each example) decides its own
        // precision: a 16-bit option in the library does not make an example's f32 training mixed.
        let mut programs: Vec<usize> = cx.files().iter().map(|f| cx.program(f.id)).collect();
        programs.sort_unstable();
        programs.dedup();
        for program in programs {
            let files: Vec<&CrateFile<'_>> = cx
                .files()
                .iter()
                .filter(|f| cx.program(f.id) == program)
                .collect();
            // A program that never names an accelerator trains on the CPU, where 16-bit floats
            // do not help (a program that names no device at all takes the crate's word).
            let gpu = |files: &[&CrateFile<'_>]| {
                files.iter().any(|f| {
                    f.facts.device.gpu > 0
                        || f.facts.fns.iter().any(|g| !g.is_test && g.device.gpu > 0)
                })
            };
            let names_device = files.iter().any(|f| {
                !f.facts.device.is_empty()
                    || f.facts
                        .fns
                        .iter()
                        .any(|g| !g.is_test && !g.device.is_empty())
            });
            let on_gpu = if names_device {
                gpu(&files)
            } else {
                gpu(&cx.files().iter().collect::<Vec<_>>())
            };
            if !on_gpu || files.iter().any(|f| has_reduced_precision(f)) {
                continue;
            }
            for entry in training_entries(cx, program) {
                // Raw cudarc kernels choose their precision in CUDA C, where the frameworks'
                // dtypes do not reach.
                let framework = cx.uses(entry.file, Framework::Candle)
                    || cx.uses(entry.file, Framework::Burn)
                    || cx.uses(entry.file, Framework::Tch);
                if !framework {
                    continue;
                }
                let (file, span, what) = match full_precision_dtype(cx, &files, &entry) {
                    Some((file, span)) => (file, span, format!("`{}`", cx.text(file, span).trim())),
                    None => (
                        entry.file,
                        entry.span,
                        "the default 32-bit floats".to_string(),
                    ),
                };
                let mut finding = Finding::new(
                    file,
                    cx.region(span),
                    format!(
                        "training uses {what} throughout: no f16, bf16 or autocast anywhere in \
                         this program"
                    ),
                    help(cx),
                );
                if let Some(note) = entry.note {
                    finding = finding.with_note(note);
                }
                out.push(finding);
            }
        }
    }
}

fn help(cx: &CrateContext<'_>) -> String {
    let frameworks = cx.crate_frameworks();
    let mut parts = Vec::new();
    if frameworks.contains(Framework::Candle) {
        parts.push("candle: build the model and inputs in `DType::BF16` (keep the loss in f32)");
    }
    if frameworks.contains(Framework::Burn) {
        parts
            .push("burn: use a `bf16`/`f16` float element or `device.configure(FloatDType::BF16)`");
    }
    if frameworks.contains(Framework::Tch) {
        parts.push(
            "tch: run the forward pass under `tch::autocast(true, || ..)` or convert with \
             `vs.bfloat16()`",
        );
    }
    if parts.is_empty() {
        "train in mixed precision: 16-bit (bf16 or f16) compute with f32 master weights".to_string()
    } else {
        format!("train in mixed precision; {}", parts.join("; "))
    }
}

/// Where a program trains: a function holding a step loop (or launching burn's learner).
struct Entry {
    file: FileId,
    /// The function's index in its file's facts.
    fn_idx: usize,
    span: Span,
    note: Option<String>,
}

/// The functions of a program that train: each holds a step loop or launches burn's learner.
fn training_entries(cx: &CrateContext<'_>, program: usize) -> Vec<Entry> {
    let markers = &cx.config().step_markers;
    let mut entries: Vec<Entry> = Vec::new();
    let mut push = |entry: Entry| {
        if !entries
            .iter()
            .any(|e| e.file == entry.file && e.fn_idx == entry.fn_idx)
        {
            entries.push(entry);
        }
    };
    for (file, call) in cx.calls() {
        if call.in_test || cx.program(file) != program {
            continue;
        }
        let name = call.name;
        // burn's learner runs the step loop for the program.
        if let CallRef::Path(_, path) = call.call
            && name == "new"
            && call
                .call
                .qualifier()
                .is_some_and(|q| q == "SupervisedTraining" || q == "LearnerBuilder")
            && let Some(fn_idx) = call.fn_idx
        {
            push(Entry {
                file,
                fn_idx,
                span: cx.file(file).facts.fns[fn_idx].name.span(),
                note: Some(format!(
                    "the program trains through burn's learner at {}:{}",
                    cx.file(file).path().display(),
                    cx.region(path.span()).line
                )),
            });
            continue;
        }
        let is_marker = matches!(
            name,
            "backward" | "backward_step" | "zero_grad" | "step" | "update"
        ) || markers.iter().any(|m| m == name);
        if !is_marker {
            continue;
        }
        let Some(hit) = cx.step_loop(file, call) else {
            continue;
        };
        if cx.program(hit.loop_file) != program {
            continue;
        }
        let loop_file = cx.file(hit.loop_file);
        // The function that holds the loop: the innermost one whose body contains its keyword.
        let Some(fn_idx) = loop_file
            .facts
            .loops
            .iter()
            .find(|l| cx.region(l.span) == hit.loop_region)
            .and_then(|l| l.fn_idx)
        else {
            continue;
        };
        // A `TrainStep::step` body trains where the program launches burn's learner.
        if loop_file.facts.fns[fn_idx].is_learner_step() {
            continue;
        }
        push(Entry {
            file: hit.loop_file,
            fn_idx,
            span: loop_file.facts.fns[fn_idx].name.span(),
            note: Some(format!(
                "the step loop is at {}:{}",
                loop_file.path().display(),
                hit.loop_region.line
            )),
        });
    }
    entries
}

/// Identifiers that mean 16-bit (or narrower) floats or mixed precision.
const REDUCED: &[&str] = &[
    "F16",
    "BF16",
    "f16",
    "bf16",
    "Half",
    "BFloat16",
    "autocast",
    "Flex32",
    "flex32",
    "F8E4M3",
    "F8E5M2",
    "Float8e4m3fn",
    "Float8e5m2",
    "Float8e4m3fnuz",
    "Float8e5m2fnuz",
    "HalfPrecisionAdapter",
];

/// Text fragments one of which a file must contain to possibly hold a [`REDUCED`] identifier.
const REDUCED_HINTS: &[&str] = &[
    "16", "Half", "half", "autocast", "lex32", "F8E", "Float8", "bfloat",
];

fn has_reduced_precision(file: &CrateFile<'_>) -> bool {
    let source = file.source();
    if !REDUCED_HINTS.iter().any(|hint| source.contains(hint)) {
        return false;
    }
    let mut finder = ReducedFinder { found: false };
    finder.visit_file(file.ast());
    finder.found
}

struct ReducedFinder {
    found: bool,
}

impl<'ast> Visit<'ast> for ReducedFinder {
    fn visit_ident(&mut self, ident: &'ast proc_macro2::Ident) {
        if !self.found && REDUCED.iter().any(|name| ident == name) {
            self.found = true;
        }
    }

    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        // tch `vs.half()` / `vs.bfloat16()`, `t.to_kind(Kind::Half)` (seen through its path).
        if m.method == "half" || m.method == "bfloat16" {
            self.found = true;
        }
        if !self.found {
            visit::visit_expr_method_call(self, m);
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // `vec![DType::BF16; n]`, `candle::bail!(..)`: look at the raw tokens.
        if !self.found && tokens_have_reduced(&mac.tokens) {
            self.found = true;
        }
    }
}

fn tokens_have_reduced(tokens: &proc_macro2::TokenStream) -> bool {
    tokens.clone().into_iter().any(|tree| match tree {
        proc_macro2::TokenTree::Ident(ident) => REDUCED.iter().any(|name| ident == name),
        proc_macro2::TokenTree::Group(group) => tokens_have_reduced(&group.stream()),
        _ => false,
    })
}

/// Where full precision is chosen for a training function: the first explicit 32/64-bit float
/// dtype in its body (`VarBuilder::from_varmap(&vm, DType::F32, &dev)`), else at item level in the
/// program's files (`type B = Cuda<f32, i32>;`).
fn full_precision_dtype(
    cx: &CrateContext<'_>,
    files: &[&CrateFile<'_>],
    entry: &Entry,
) -> Option<(FileId, Span)> {
    let hints = [
        "F32", "F64", "Float", "FLOAT_", "Double", "DOUBLE_", "f32", "f64",
    ];
    let file = cx.file(entry.file);
    let block = file.facts.fns[entry.fn_idx].block;
    let mut finder = DtypeFinder { found: Vec::new() };
    finder.visit_block(block);
    if let Some(span) = finder
        .found
        .into_iter()
        .min_by_key(|s| s.byte_range().start)
    {
        return Some((entry.file, span));
    }
    for file in files {
        if !hints.iter().any(|hint| file.source().contains(hint)) {
            continue;
        }
        let mut finder = DtypeFinder { found: Vec::new() };
        finder.visit_file(file.ast());
        let first = finder
            .found
            .into_iter()
            .filter(|span| {
                !cx.is_test_code(file.id, *span)
                    && file.facts.innermost_fn(span.byte_range().start).is_none()
            })
            .min_by_key(|span| span.byte_range().start);
        if let Some(span) = first {
            return Some((file.id, span));
        }
    }
    None
}

struct DtypeFinder {
    found: Vec<Span>,
}

/// Backend types whose first generic argument is the float element (burn 0.21 and earlier).
const BACKENDS: &[&str] = &[
    "Cuda", "CudaJit", "Wgpu", "Vulkan", "Metal", "Rocm", "Hip", "LibTorch", "Candle", "NdArray",
];

impl<'ast> Visit<'ast> for DtypeFinder {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let n = path.segments.len();
        if n >= 2 {
            let ty = &path.segments[n - 2].ident;
            let name = path.segments[n - 1].ident.to_string();
            let full = (ty == "DType" || ty == "FloatDType") && (name == "F32" || name == "F64")
                || ty == "Kind" && (name == "Float" || name == "Double")
                || ty == "kind" && (name.starts_with("FLOAT_") || name.starts_with("DOUBLE_"));
            if full {
                self.found.push(path.span());
            }
        }
        if let Some(last) = path.segments.last()
            && BACKENDS.iter().any(|b| last.ident == b)
            && let syn::PathArguments::AngleBracketed(args) = &last.arguments
            && let Some(syn::GenericArgument::Type(syn::Type::Path(elem))) = args.args.first()
            && (elem.path.is_ident("f32") || elem.path.is_ident("f64"))
        {
            self.found.push(elem.span());
        }
        visit::visit_path(self, path);
    }
}

/// PK501's Python form: Lightning `Trainer(precision=32)` / `"32-true"` (also `Fabric`), or an
/// optimizer built in a package where no autocast, bfloat16 or half precision appears anywhere.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    let trainers = cx.calls_named_ending(&["Trainer", "Fabric"]);
    for (file, call) in trainers {
        if call.in_test {
            continue;
        }
        let path = call.path.as_deref().unwrap_or("");
        if path.ends_with("Trainer") || path.ends_with("Fabric") {
            let Some(precision) = call.keyword("precision") else {
                continue;
            };
            let full = match precision {
                PyExpr::NumberLiteral(n) => n
                    .value
                    .as_int()
                    .and_then(|i| i.as_u64())
                    .is_some_and(|v| v == 32 || v == 64),
                PyExpr::StringLiteral(s) => {
                    matches!(s.value.to_str(), "32" | "32-true" | "64" | "64-true")
                }
                _ => false,
            };
            if full {
                let text = cx.file(file).text(precision.range()).to_string();
                out.push(cx.finding(
                    file,
                    precision.range(),
                    format!("`precision={text}` trains in full precision"),
                    "use `precision=\"bf16-mixed\"` (or `\"16-mixed\"` on GPUs without bfloat16)",
                ));
            }
        }
    }
    // The first optimizer built outside tests stands for the package (a trainer is not one). The
    // package-wide text scans last: they read every file of the package.
    let optimizer = cx.first_optimizer();
    if let Some((file, call)) = optimizer
        && !cx.mixed_precision()
        && !cx.cpu_only_program()
    {
        out.push(cx.finding(
            file,
            PyContext::callee_range(call),
            "this training runs in full precision: no autocast, bfloat16 or half precision anywhere in the package",
            "wrap the forward pass and loss in `torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16)`",
        ));
    }
}
