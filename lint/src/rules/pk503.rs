//! PK503 `multi-device-instead-of-ddp`: burn's multi-device strategy where DDP is available.

use crate::analysis::CrateContext;
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
    pub MultiDeviceInsteadOfDdp {
        code: "PK503",
        name: "multi-device-instead-of-ddp",
        severity: Note,
        fixable: false,
    }
}

impl Rule for MultiDeviceInsteadOfDdp {
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
