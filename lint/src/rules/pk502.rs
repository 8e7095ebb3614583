//! PK502 `small-batch-size`: a literal training batch size below `min-batch-size`.

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Expr, Token};

use crate::analysis::patterns::binding_name;
use crate::analysis::{CallRef, CrateContext, CrateFile, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::pk301::{int_literal, shuffle_off};
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a literal training batch size below the configured minimum (`min-batch-size`,
    /// default 16).
    ///
    /// Recognized forms:
    ///
    /// - a builder call: `.batch_size(8)` (burn `DataLoaderBuilder`, candle `Batcher`, ...),
    ///   `.with_batch_size(8)` (burn `Config`), `.set_batch_size(8)`;
    /// - tch data iterators: `dataset.train_iter(8)`, `Iter2::new(&xs, &ys, 8)`;
    /// - a constant, static or struct field named like a batch size (`batch_size`, `BATCH_SIZE`,
    ///   `train_batch_size`, ...) set to a literal: `const BATCH_SIZE: usize = 8;`,
    ///   `Config { batch_size: 8, .. }`; a local `let batch_size = 8;` in a function that has a
    ///   step loop (or is called from one);
    /// - the default of such a field: burn's `#[config(default = 8)]`, clap's
    ///   `#[arg(default_value_t = 8)]` / `#[arg(default_value = "8")]`.
    ///
    /// Not flagged: crates that only ever name CPU devices; names that say the batches are not
    /// training batches (containing `valid`, `val_`, `eval`, `test`, `infer`, `predict`) or are
    /// deliberately small (`micro`, used with gradient accumulation); a batch size that is not a
    /// literal; zero (usually "unset"); test code.
    ///
    /// ## Why is this bad?
    /// With a handful of samples per step, each kernel gets too little work to fill the GPU, and the
    /// fixed cost of a step (kernel launches, the optimizer update, gradient bookkeeping, data loading
    /// and host synchronisation) is paid for very few samples: throughput falls far below what the
    /// hardware can do. Larger batches (tuned up to what memory and convergence allow, with the
    /// learning rate scaled accordingly, or gradient accumulation when memory is the limit) keep the
    /// device busy.
    ///
    /// ## Configuration
    /// `min-batch-size` in `perfkit.toml` (or `[package.metadata.perfkit]`) sets the threshold; a
    /// batch size equal to it is not flagged.
    ///
    /// ## Example
    /// ```rust,ignore
    /// const BATCH_SIZE: usize = 4;
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// const BATCH_SIZE: usize = 64;
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags a literal `batch_size` below `min-batch-size` in a
    /// `DataLoader` (keyword or positional), a `batch_size=` keyword of any call (a DataModule,
    /// `TrainingArguments(per_device_train_batch_size=..)`), or an argparse `--batch-size` default; not
    /// when gradient accumulation appears in the package, nor for evaluation loaders (`shuffle=False`),
    /// nor for a loader that only the function building it iterates, outside any step loop (a pass
    /// computing a data set's statistics), nor in a program that trains nothing (a `__main__`
    /// guard, no step loop reached, no call naming training, an optimizer, `backward` or `fit`:
    /// an evaluation script's defaults).
    ///
    /// ```python
    /// loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=8)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)
    /// ```
    pub SmallBatchSize {
        code: "PK502",
        name: "small-batch-size",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for SmallBatchSize {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        let min = u64::try_from(cx.min_batch_size()).unwrap_or(u64::MAX);
        // A crate that names only CPU devices does not feed a GPU: small batches are its own choice.
        let (mut cpu, mut gpu) = (0, 0);
        for file in cx.files() {
            cpu += file.facts.device.cpu;
            gpu += file.facts.device.gpu;
            for f in file.facts.fns.iter().filter(|f| !f.is_test) {
                cpu += f.device.cpu;
                gpu += f.device.gpu;
            }
        }
        if cpu > 0 && gpu == 0 {
            return;
        }
        let report = |out: &mut Vec<Finding>, file: FileId, span: Span, value: u64| {
            if value == 0 || value >= min || cx.is_test_code(file, span) {
                return;
            }
            let crate_file = cx.file(file);
            // Inference code (a KV cache, a generation demo, an evaluation binary) sizes batches for
            // latency, not training throughput.
            if is_inference_path(cx.package_path(file)) {
                return;
            }
            let at = span.byte_range().start;
            if let Some(f) = crate_file.facts.innermost_fn(at) {
                let function = &crate_file.facts.fns[f];
                if is_inference_name(&function.name.to_string())
                    || function.self_ty.as_deref().is_some_and(is_inference_name)
                {
                    return;
                }
                // The same function configures gradient accumulation.
                let body = cx.text(file, function.block.span());
                if mentions_accumulation(body) {
                    return;
                }
            } else if mentions_accumulation(crate_file.source()) {
                // A constant or configuration default in a file that also configures gradient
                // accumulation: `grads_accumulation(6)`, `gradient_accumulation_steps`, `accum_steps`.
                return;
            }
            out.push(Finding::new(
                file,
                cx.region(span),
                format!("batch size {value} is below {min}: the GPU does little work per step"),
                format!(
                    "train with at least {min} samples per step (scale the batch up until memory or \
                     convergence limits it, or accumulate gradients), or lower `min-batch-size` in \
                     perfkit.toml if small batches are intended"
                ),
            ));
        };
        for crate_file in cx.files() {
            let file = crate_file.id;
            let tch = cx.uses(file, Framework::Tch);
            for call in &crate_file.facts.calls {
                if call.in_test || call.in_macro {
                    continue;
                }
                let arg = match call.call {
                    CallRef::Method(m) => match call.name {
                        "batch_size" | "with_batch_size" | "set_batch_size"
                            if m.args.len() == 1 =>
                        {
                            m.args.first()
                        }
                        "train_iter" if tch && m.args.len() == 1 => m.args.first(),
                        _ => None,
                    },
                    CallRef::Path(c, path) => {
                        let n = path.segments.len();
                        let is_iter2 = tch
                            && n >= 2
                            && path.segments[n - 2].ident == "Iter2"
                            && path.segments[n - 1].ident == "new";
                        if is_iter2 && c.args.len() == 3 {
                            c.args.last()
                        } else {
                            None
                        }
                    }
                };
                if let Some(arg) = arg
                    && let Some(value) = int_literal(arg)
                {
                    report(out, file, arg.span(), value);
                }
            }
            for (span, value, local) in named_batch_sizes(crate_file) {
                // A local `let batch_size = 1;` is only a training batch size in a function that
                // trains: elsewhere it is usually an inference or tensor-shape detail.
                if local && !in_training_fn(cx, crate_file, span) {
                    continue;
                }
                report(out, file, span, value);
            }
        }
    }
}

/// Whether source text names gradient accumulation (`grads_accumulation`, `accum_steps`,
/// `gradient_accumulation_steps`, `accumulate_grad_batches`).
fn mentions_accumulation(text: &str) -> bool {
    let bytes = text.as_bytes();
    memchr::memmem::find(bytes, b"accum").is_some()
        || memchr::memmem::find(bytes, b"ACCUM").is_some()
}

/// Words that mark inference, generation or evaluation code.
const INFERENCE_WORDS: &[&str] = &[
    "infer", "generat", "sampl", "predict", "serve", "server", "cache", "eval", "bench",
];

fn is_inference_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    INFERENCE_WORDS.iter().any(|w| lower.contains(w))
}

/// A file whose path names inference (`src/inference/cache.rs`, `examples/inference_demo.rs`).
fn is_inference_path(path: &std::path::Path) -> bool {
    path.components().any(|c| match c {
        std::path::Component::Normal(part) => part.to_str().is_some_and(is_inference_name),
        _ => false,
    })
}

/// Whether a name designates a training batch size.
fn is_batch_size_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let named = lower == "batch_size"
        || lower.ends_with("_batch_size")
        || lower.starts_with("batch_size_")
        || lower == "minibatch_size"
        || lower == "mini_batch_size";
    let excluded = ["valid", "val_", "eval", "test", "infer", "predict", "micro"]
        .iter()
        .any(|word| lower.contains(word));
    named && !excluded
}

/// Whether `span` lies in a function that has a step loop (or is called from one).
fn in_training_fn(cx: &CrateContext<'_>, file: &CrateFile<'_>, span: Span) -> bool {
    let at = span.byte_range().start;
    let Some(f) = file.facts.innermost_fn(at) else {
        return false;
    };
    file.facts
        .calls
        .iter()
        .filter(|c| c.fn_idx == Some(f))
        .any(|c| cx.step_loop(file.id, c).is_some())
}

/// Literal batch sizes bound to batch-size names in a file: (span of the literal, value, whether it
/// is a local `let`).
fn named_batch_sizes(file: &CrateFile<'_>) -> Vec<(Span, u64, bool)> {
    let source = file.source();
    // Cheap filter: no such name, no need to walk the tree.
    let bytes = source.as_bytes();
    if memchr::memmem::find(bytes, b"batch_size").is_none()
        && memchr::memmem::find(bytes, b"BATCH_SIZE").is_none()
    {
        return Vec::new();
    }
    let mut finder = NamedFinder {
        found: Vec::new(),
        structs: Vec::new(),
    };
    finder.visit_file(file.ast());
    finder.found
}

struct NamedFinder {
    found: Vec<(Span, u64, bool)>,
    /// Types of the struct literals being visited, innermost last.
    structs: Vec<String>,
}

impl NamedFinder {
    fn literal(&mut self, expr: &Expr) {
        if let Some(value) = int_literal(expr) {
            self.found.push((expr.span(), value, false));
        }
    }

    /// `#[config(default = 8)]`, `#[arg(long, default_value_t = 8)]`, `#[arg(default_value = "8")]`.
    fn default_attr(&mut self, attr: &syn::Attribute) {
        if let Some((span, value)) = attr_default(attr) {
            self.found.push((span, value, false));
        }
    }
}

/// The integer default a field's attribute gives it, with the literal's span: burn's
/// `#[config(default = 8)]`, clap's `#[arg(long, default_value_t = 8)]` or
/// `#[arg(default_value = "8")]` (structopt, argh and `option` likewise).
pub(super) fn attr_default(attr: &syn::Attribute) -> Option<(Span, u64)> {
    let last = attr.path().segments.last()?;
    let known = ["config", "arg", "clap", "structopt", "argh", "option"]
        .iter()
        .any(|name| last.ident == name);
    if !known {
        return None;
    }
    let metas = attr
        .parse_args_with(Punctuated::<syn::Meta, Token![,]>::parse_terminated)
        .ok()?;
    for meta in metas {
        let syn::Meta::NameValue(nv) = meta else {
            continue;
        };
        let is_default = ["default", "default_value_t", "default_value"]
            .iter()
            .any(|name| nv.path.is_ident(name));
        if !is_default {
            continue;
        }
        return match &nv.value {
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => s.value().trim().parse::<u64>().ok().map(|v| (s.span(), v)),
            value => int_literal(value).map(|v| (value.span(), v)),
        };
    }
    None
}

impl<'ast> Visit<'ast> for NamedFinder {
    fn visit_local(&mut self, local: &'ast syn::Local) {
        if let Some(name) = binding_name(&local.pat)
            && is_batch_size_name(&name)
            && let Some(init) = &local.init
            && let Some(value) = int_literal(&init.expr)
        {
            self.found.push((init.expr.span(), value, true));
        }
        visit::visit_local(self, local);
    }

    fn visit_item_const(&mut self, item: &'ast syn::ItemConst) {
        if is_batch_size_name(&item.ident.to_string()) {
            self.literal(&item.expr);
        }
        visit::visit_item_const(self, item);
    }

    fn visit_item_static(&mut self, item: &'ast syn::ItemStatic) {
        if is_batch_size_name(&item.ident.to_string()) {
            self.literal(&item.expr);
        }
        visit::visit_item_static(self, item);
    }

    fn visit_impl_item_const(&mut self, item: &'ast syn::ImplItemConst) {
        if is_batch_size_name(&item.ident.to_string()) {
            self.literal(&item.expr);
        }
        visit::visit_impl_item_const(self, item);
    }

    fn visit_expr_struct(&mut self, e: &'ast syn::ExprStruct) {
        let name = e
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        self.structs.push(name);
        visit::visit_expr_struct(self, e);
        self.structs.pop();
    }

    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        // A cache's or a sampler's own batch size is not a training batch size.
        if is_inference_name(&item.ident.to_string()) {
            return;
        }
        visit::visit_item_struct(self, item);
    }

    fn visit_field_value(&mut self, field: &'ast syn::FieldValue) {
        if let syn::Member::Named(ident) = &field.member
            && field.colon_token.is_some()
            && is_batch_size_name(&ident.to_string())
            && !self.structs.last().is_some_and(|s| is_inference_name(s))
        {
            self.literal(&field.expr);
        }
        visit::visit_field_value(self, field);
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        if let Some(ident) = &field.ident
            && is_batch_size_name(&ident.to_string())
        {
            for attr in &field.attrs {
                self.default_attr(attr);
            }
        }
        visit::visit_field(self, field);
    }
}

/// PK502's Python form: a literal `batch_size` below `min-batch-size` in a `DataLoader`, a
/// `batch_size=` keyword of any call (a DataModule, `TrainingArguments`) or an argparse default,
/// unless gradient accumulation appears in the package. Evaluation loaders (`shuffle=False`,
/// `val_`/`test_`/`eval_` keywords) are not training batches.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    // The package-wide text scan (gradient accumulation) only once there is something to report.
    let start = out.len();
    let min = cx.config.min_batch_size;
    for (file, call) in cx.literal_calls() {
        // A batch size is reported only where it is a number literal.
        if !call.number_arg {
            continue;
        }
        let mut literal: Option<&PyExpr> = None;
        for keyword in &call.call.arguments.keywords {
            let Some(arg) = &keyword.arg else { continue };
            if matches!(
                arg.as_str(),
                "batch_size" | "train_batch_size" | "per_device_train_batch_size"
            ) {
                literal = Some(&keyword.value);
            }
        }
        let path = call.path.as_deref().unwrap_or("");
        if literal.is_none() && path.ends_with("DataLoader") && cx.builds_torch_data_loader(call) {
            literal = call.call.arguments.args.get(1);
        }
        if literal.is_none() && call.method == Some("add_argument") {
            let flag = call.call.arguments.args.first().and_then(|e| match e {
                PyExpr::StringLiteral(s) => Some(s.value.to_str().to_string()),
                _ => None,
            });
            if flag.is_some_and(|f| {
                matches!(f.as_str(), "--batch-size" | "--batch_size" | "--bs" | "-b")
            }) {
                literal = call.keyword("default");
            }
        }
        let Some(PyExpr::NumberLiteral(n)) = literal else {
            continue;
        };
        let Some(value) = n.value.as_int().and_then(|i| i.as_u64()) else {
            continue;
        };
        if value as usize >= min {
            continue;
        }
        if shuffle_off(call)
            || is_inference_call(path, call.method)
            || (path.ends_with("DataLoader")
                && super::pk301::evaluation_loader(cx, file, call).is_some())
            || program_trains_nothing(cx, file)
        {
            continue;
        }
        out.push(cx.finding(
            file,
            n.range(),
            format!("batch size {value} is below {min}: the GPU does little work per step"),
            "use a larger batch (as memory allows), or accumulate gradients over several batches",
        ));
    }
    if out.len() > start && cx.grad_accumulation() {
        out.truncate(start);
    }
}

/// Whether a file is a program (a `__main__` guard) that trains nothing: none of its loops is a
/// step loop, none of its functions reaches one, and none of its calls names training (`train`,
/// an optimizer, `backward`, `fit`: `TrainLoop(..)`, `model.train()`, `optim.AdamW(..)`,
/// `trainer.fit(..)`). Its batch sizes (an evaluation script's defaults, handed to argparse as a
/// plain `dict(..)`) size evaluation or sampling passes, not training steps. A script that hands
/// its model to a training loop of another module (`TrainLoop(..).run_loop()`) names it, and keeps
/// its findings.
pub(crate) fn program_trains_nothing(cx: &PyContext<'_>, file: usize) -> bool {
    let source = &cx.file(file).source;
    if memchr::memmem::find(source.as_bytes(), b"__main__").is_none()
        || cx.file_reaches_step_loop(file)
    {
        return false;
    }
    !cx.units[file].facts.calls.iter().any(|call| {
        let name = call
            .method
            .or_else(|| {
                call.path
                    .as_deref()
                    .map(|p| p.rsplit('.').next().unwrap_or(p))
            })
            .unwrap_or("");
        names_training(name)
    })
}

/// Whether a callee's name names training: one of its words (split at `_` and at capitals) is
/// `fit` or `backward`, starts with `optim`, or starts with `train` or `pretrain` (`Trainer`,
/// `training`, `pretrain_model`) without ending in `trained` (`load_pretrained_weights` loads
/// weights). A word that only contains the letters (`constrain`) does not count.
pub(crate) fn names_training(name: &str) -> bool {
    crate::analysis::values::words(name).any(|word| {
        let word = word.to_ascii_lowercase();
        word == "fit"
            || word == "backward"
            || ((word.starts_with("train") || word.starts_with("pretrain"))
                && !word.ends_with("trained"))
            || word.starts_with("optim")
    })
}

/// A call that exports or runs a trained model (`export_onnx(.., batch_size=1)`,
/// `predict(.., batch_size=1)`): its batch size is not a training batch.
fn is_inference_call(path: &str, method: Option<&str>) -> bool {
    let name = method
        .unwrap_or_else(|| path.rsplit('.').next().unwrap_or(path))
        .to_ascii_lowercase();
    ["export", "onnx", "predict", "infer"]
        .iter()
        .any(|word| name.contains(word))
}

#[cfg(test)]
mod tests {
    #[test]
    fn callee_names_name_training_by_their_words() {
        for name in [
            "train",
            "fit",
            "backward",
            "TrainLoop",
            "train_one_epoch",
            "run_training",
            "Trainer",
            "pretrain_model",
            "optimizer_step",
        ] {
            assert!(super::names_training(name), "{name}");
        }
        for name in [
            "load_pretrained_weights",
            "load_trained_model",
            "constrain_shape",
            "evaluate",
            "",
        ] {
            assert!(!super::names_training(name), "{name}");
        }
    }

    use crate::{LintOptions, lint};

    const SOURCE: &str = "const BATCH_SIZE: usize = 8;\nconst EVAL_BATCH_SIZE: usize = 1;\n\
                          pub fn loader(b: Builder) -> Builder { b.batch_size(12) }\n";

    fn pk502_lines(config: Option<&str>) -> Vec<usize> {
        pk502_lines_of(SOURCE, config)
    }

    fn pk502_lines_of(source: &str, config: Option<&str>) -> Vec<usize> {
        let tmp = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            tmp.path().join("Cargo.toml"),
            "[package]\nname = \"t\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
        )
        .expect("manifest");
        if let Some(config) = config {
            std::fs::write(tmp.path().join("perfkit.toml"), config).expect("config");
        }
        std::fs::create_dir(tmp.path().join("src")).expect("src");
        std::fs::write(tmp.path().join("src/lib.rs"), source).expect("source");
        let report = lint(&LintOptions::new([tmp.path()])).expect("lint runs");
        report
            .diagnostics
            .iter()
            .filter(|d| d.code == "PK502")
            .map(|d| d.region.line)
            .collect()
    }

    #[test]
    fn default_threshold_is_sixteen() {
        assert_eq!(pk502_lines(None), vec![1, 3]);
    }

    #[test]
    fn threshold_comes_from_the_configuration() {
        assert_eq!(pk502_lines(Some("min-batch-size = 10\n")), vec![1]);
        assert_eq!(
            pk502_lines(Some("min-batch-size = 8\n")),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn cpu_only_crate_is_not_flagged() {
        let cpu = format!(
            "{SOURCE}pub fn device() -> candle_core::Device {{ candle_core::Device::Cpu }}\n"
        );
        assert_eq!(pk502_lines_of(&cpu, None), Vec::<usize>::new());
        let gpu = format!(
            "{SOURCE}pub fn device() -> candle_core::Device {{ candle_core::Device::cuda_if_available(0).unwrap() }}\n"
        );
        assert_eq!(pk502_lines_of(&gpu, None), vec![1, 3]);
    }
}
