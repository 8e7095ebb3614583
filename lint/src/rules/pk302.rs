//! PK302 `loader-default-batch-size`: a burn data loader built without a batch size.

use crate::analysis::CrateContext;
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::pk301::loader_chains;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a burn `DataLoaderBuilder` chain that reaches `build(..)` without a `batch_size(..)`
    /// call.
    ///
    /// The chain is followed through `let` bindings in the same block. A builder that is returned or
    /// passed on before `build` is not judged (its caller may set the batch size).
    ///
    /// ## Why is this bad?
    /// burn's `DataLoaderBuilder` falls back to a batch size of 1 when none is set, silently. Every
    /// step then runs the model on a single item: the kernels are launched with almost no work each,
    /// per-step overheads (optimizer update, gradient bookkeeping, host synchronisation) are paid once
    /// per item, and the accelerator sits mostly idle. Training is also noisier than the
    /// hyper-parameters suggest.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let loader = DataLoaderBuilder::new(batcher)
    ///     .shuffle(42)
    ///     .num_workers(8)
    ///     .build(dataset);
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let loader = DataLoaderBuilder::new(batcher)
    ///     .batch_size(config.batch_size)
    ///     .shuffle(42)
    ///     .num_workers(8)
    ///     .build(dataset);
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags a `DataLoader` without `batch_size` (nor a positional batch
    /// size or a `batch_sampler`): PyTorch's default is 1.
    ///
    /// ```python
    /// loader = DataLoader(dataset, shuffle=True, num_workers=8)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8)
    /// ```
    pub LoaderDefaultBatchSize {
        code: "PK302",
        name: "loader-default-batch-size",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for LoaderDefaultBatchSize {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for chain in loader_chains(cx) {
            if chain.method_args("batch_size").is_some() {
                continue;
            }
            out.push(Finding::new(
                chain.file,
                chain.region_of_new(cx),
                "data loader is built without a batch size, so every batch holds one item",
                "set `.batch_size(n)` on the builder (burn defaults to 1 when it is missing)",
            ));
        }
    }
}

/// PK302's Python form: `DataLoader(..)` without `batch_size` (PyTorch's default is 1).
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named_ending(&["DataLoader"]) {
        if call.in_test
            || !call
                .path
                .as_deref()
                .is_some_and(|p| p.ends_with("DataLoader"))
            || call.has_double_star()
            || !cx.builds_torch_data_loader(call)
        {
            continue;
        }
        let given = python_keyword(call.call, "batch_size").is_some()
            || python_keyword(call.call, "batch_sampler").is_some()
            || call.call.arguments.args.len() >= 2;
        if given {
            continue;
        }
        out.push(cx.finding(
            file,
            PyContext::callee_range(call),
            "`DataLoader` without `batch_size` yields batches of one sample",
            "pass `batch_size=` (as large as the GPU memory allows)",
        ));
    }
}
