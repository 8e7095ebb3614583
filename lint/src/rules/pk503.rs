//! PK503 `multi-device-instead-of-ddp`: burn's multi-device strategy where DDP is available.

use crate::analysis::CrateContext;
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags burn multi-GPU training that uses the multi-device strategy instead of distributed
    /// data parallel (DDP).
    ///
    /// Recognized: `ExecutionStrategy::MultiDevice(..)` and `ExecutionStrategy::multi(..)` (burn 0.20
    /// and later), and `LearningStrategy::MultiDeviceNaive(..)` (burn 0.19).
    ///
    /// Not flagged: `ExecutionStrategy::ddp(..)`, single-device strategies, match patterns on the
    /// strategy, test code. burn 0.18's `LearnerBuilder::devices(..)` is not flagged either: that
    /// version has no DDP to switch to.
    ///
    /// ## Why is this bad?
    /// The multi-device strategy runs the backward pass on each device but funnels the gradients
    /// through burn's non-DDP path: with `OptimMainDevice` every step gathers all gradients on one
    /// elected device and runs the optimizer there, so that device does more work and more
    /// transfers than the others and the step waits on it. DDP keeps a model replica per device and
    /// all-reduces the gradients with collective operations, so every device does the same work. It
    /// is the Rust form of PyTorch's advice to prefer `DistributedDataParallel` over `DataParallel`.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let strategy = ExecutionStrategy::multi(devices, MultiDeviceOptim::OptimMainDevice);
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// // burn's `ddp` feature
    /// let strategy = ExecutionStrategy::ddp(
    ///     devices,
    ///     DistributedConfig { all_reduce_op: ReduceOperation::Mean },
    /// );
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `nn.DataParallel(model)` and Lightning's `strategy="dp"` (and
    /// the older `distributed_backend="dp"` / `accelerator="dp"`).
    ///
    /// ```python
    /// model = nn.DataParallel(model)
    /// trainer = pl.Trainer(devices=2, strategy="dp")
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// model = DistributedDataParallel(model, device_ids=[local_rank])  # one process per GPU (torchrun)
    /// trainer = pl.Trainer(devices=2, strategy="ddp")
    /// ```
    pub MultiDeviceInsteadOfDdp {
        code: "PK503",
        name: "multi-device-instead-of-ddp",
        severity: Note,
        fixable: false,
    }
}

impl Rule for MultiDeviceInsteadOfDdp {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for (file, path, ty, name) in cx.qualified_calls() {
            let help = match (ty.as_str(), name.as_str()) {
                ("ExecutionStrategy", "MultiDevice" | "multi") => {
                    "use `ExecutionStrategy::ddp(devices, DistributedConfig { .. })` (burn's `ddp` \
                     feature): one model replica per device, gradients all-reduced"
                }
                ("LearningStrategy", "MultiDeviceNaive") => {
                    "use `LearningStrategy::DistributedDataParallel { .. }` (`burn::train::ddp(devices, \
                     config)`, burn's `ddp` feature): one model replica per device, gradients \
                     all-reduced"
                }
                _ => continue,
            };
            out.push(Finding::new(
                file,
                cx.region_of(path),
                format!(
                    "multi-GPU training uses `{ty}::{name}` instead of distributed data parallel"
                ),
                help,
            ));
        }
    }
}

/// `nn.DataParallel(..)` (and any callee named `..DataParallel` but `DistributedDataParallel`).
fn python_data_parallel(call: &PyCall<'_>) -> bool {
    let path = call.path.as_deref().unwrap_or("");
    path.ends_with("DataParallel") && !path.ends_with("DistributedDataParallel")
}

/// PK503's Python form: `nn.DataParallel(..)`, Lightning `strategy="dp"` /
/// `distributed_backend="dp"` / `accelerator="dp"`.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named_ending(&["DataParallel"]) {
        if call.in_test || !python_data_parallel(call) {
            continue;
        }
        out.push(cx.finding(
            file,
            PyContext::callee_range(call),
            "`DataParallel` runs one process that scatters each batch and gathers the outputs on GPU 0",
            "use `DistributedDataParallel` (one process per GPU, started with `torchrun`)",
        ));
    }
    for (file, call) in cx.literal_calls() {
        if !call.string_arg {
            continue;
        }
        if python_data_parallel(call) {
            // Reported above, as `DataParallel`.
            continue;
        }
        for keyword in ["strategy", "distributed_backend", "accelerator"] {
            if let Some(PyExpr::StringLiteral(s)) = call.keyword(keyword)
                && s.value.to_str() == "dp"
            {
                out.push(cx.finding(
                    file,
                    s.range(),
                    format!(
                        "`{keyword}=\"dp\"` is Lightning's DataParallel: one process for all GPUs"
                    ),
                    "use `strategy=\"ddp\"` (one process per GPU)",
                ));
            }
        }
    }
}
