//! PK501 `full-precision-training`: a GPU training crate with no 16-bit floats anywhere.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use crate::analysis::{CallRef, CrateContext, FileId, Framework};
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags, once per crate, GPU training code that never uses 16-bit floats or mixed precision.
    ///
    /// The crate has a step loop (or launches burn's `SupervisedTraining`/`LearnerBuilder`), names
    /// a GPU device or backend, and mentions no 16-bit float type or mixed precision anywhere
    /// (candle `DType::BF16`/`F16`, burn `f16`/`bf16` elements or `FloatDType::BF16`/`F16`, tch
    /// `Kind::Half`/`Kind::BFloat16`, `vs.half()`/`vs.bfloat16()` or `tch::autocast`, the `half`
    /// crate's types).
    ///
    /// The finding points at the first explicit 32-bit dtype of the crate (`DType::F32`,
    /// `Kind::Float`, `kind::FLOAT_CPU`, a backend's `f32` element such as `Cuda<f32, i32>`), or at
    /// the function that holds the step loop when the dtype is left to the default.
    ///
    /// Not flagged: crates without a step loop (inference, libraries), crates that only ever use the
    /// CPU, and crates that mention a 16-bit type anywhere, even in code that may not be on the hot
    /// path (the rule cannot tell, and prefers silence).
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
    pub FullPrecisionTraining {
        code: "PK501",
        name: "full-precision-training",
        severity: Note,
        fixable: false,
    }
}

impl Rule for FullPrecisionTraining {
    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        // A crate that never names an accelerator trains on the CPU, where 16-bit floats do not help.
        let gpu = cx.files().iter().any(|f| {
            f.facts.device.gpu > 0 || f.facts.fns.iter().any(|g| !g.is_test && g.device.gpu > 0)
        });
        if !gpu {
            return;
        }
        let Some(entry) = training_entry(cx) else {
            return;
        };
        if has_reduced_precision(cx) {
            return;
        }
        let (file, span, what) = match first_full_precision_dtype(cx) {
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
                "training uses {what} throughout: no f16, bf16 or autocast anywhere in the crate"
            ),
            help(cx),
        );
        if let Some(note) = entry.note {
            finding = finding.with_note(note);
        }
        out.push(finding);
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

/// Where the crate trains: the function holding the first step loop (or launching burn's learner).
struct Entry {
    file: FileId,
    span: Span,
    note: Option<String>,
}

fn training_entry(cx: &CrateContext<'_>) -> Option<Entry> {
    let markers = &cx.config().step_markers;
    for (file, call) in cx.calls() {
        if call.in_test {
            continue;
        }
        let name = call.name;
        // burn's learner runs the step loop for the crate.
        if let CallRef::Path(_, path) = call.call
            && name == "new"
            && call
                .call
                .qualifier()
                .is_some_and(|q| q == "SupervisedTraining" || q == "LearnerBuilder")
        {
            let span = cx
                .fn_of(file, call)
                .map(|f| f.name.span())
                .unwrap_or_else(|| path.span());
            return Some(Entry {
                file,
                span,
                note: Some(format!(
                    "the crate trains through burn's learner at {}:{}",
                    cx.file(file).path().display(),
                    cx.region(path.span()).line
                )),
            });
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
        let loop_file = cx.file(hit.loop_file);
        // The function that holds the loop: the innermost one whose body contains its keyword.
        let span = loop_file
            .facts
            .loops
            .iter()
            .find(|l| cx.region(l.span) == hit.loop_region)
            .and_then(|l| l.fn_idx)
            .map(|f| loop_file.facts.fns[f].name.span())?;
        return Some(Entry {
            file: hit.loop_file,
            span,
            note: Some(format!(
                "the step loop is at {}:{}",
                loop_file.path().display(),
                hit.loop_region.line
            )),
        });
    }
    None
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

fn has_reduced_precision(cx: &CrateContext<'_>) -> bool {
    cx.files().iter().any(|file| {
        let source = file.source();
        if !REDUCED_HINTS.iter().any(|hint| source.contains(hint)) {
            return false;
        }
        let mut finder = ReducedFinder { found: false };
        finder.visit_file(file.ast());
        finder.found
    })
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

/// The first explicit 32/64-bit float dtype outside test code, in file order.
fn first_full_precision_dtype(cx: &CrateContext<'_>) -> Option<(FileId, Span)> {
    for file in cx.files() {
        let source = file.source();
        let hints = [
            "F32", "F64", "Float", "FLOAT_", "Double", "DOUBLE_", "f32", "f64",
        ];
        if !hints.iter().any(|hint| source.contains(hint)) {
            continue;
        }
        let mut finder = DtypeFinder { found: Vec::new() };
        finder.visit_file(file.ast());
        let first = finder
            .found
            .into_iter()
            .filter(|span| !cx.is_test_code(file.id, *span))
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
