//! PK403 `checkpoint-load-without-device`: tch loaders that restore tensors to their saved device.

use crate::analysis::{CrateContext, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags tch checkpoint loaders that restore tensors to the device they were saved from.
    ///
    /// These are the loaders without a device argument: `CModule::load`, `CModule::load_data`,
    /// `Tensor::load`, `Tensor::load_from_stream`, `Tensor::load_multi` and
    /// `Tensor::load_multi_from_stream`.
    ///
    /// Only files that use tch are looked at (`Tensor::load` means something else elsewhere).
    /// Not flagged: the `_on_device` / `_with_device` forms, `TrainableCModule::load` (it loads onto
    /// its `VarStore`'s device), `VarStore::load` (it copies into variables that already live on the
    /// store's device), and test code.
    ///
    /// ## Why is this bad?
    /// These loaders put every tensor back on the device it was saved from. A checkpoint written on
    /// `cuda:1` of the training machine fails to load on a machine without that GPU, or lands on a
    /// GPU other than the one the rest of the program uses; a GPU checkpoint loaded for CPU
    /// inference first allocates and fills GPU memory. It is the Rust form of PyTorch's advice to
    /// load checkpoints with `map_location`.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let model = tch::CModule::load("model.pt")?;
    /// let ema = tch::Tensor::load_multi("ema.ot")?;
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let model = tch::CModule::load_on_device("model.pt", device)?;
    /// let ema = tch::Tensor::load_multi_with_device("ema.ot", device)?;
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `torch.load(path)` and `torch.jit.load(path)` without
    /// `map_location`.
    ///
    /// ```python
    /// state = torch.load("checkpoint.pt")
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// state = torch.load("checkpoint.pt", map_location=device)
    /// ```
    pub CheckpointLoadWithoutDevice {
        code: "PK403",
        name: "checkpoint-load-without-device",
        severity: Note,
        fixable: false,
    }
}

impl Rule for CheckpointLoadWithoutDevice {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for (file, path, ty, name) in cx.qualified_calls() {
            let help = match (ty.as_str(), name.as_str()) {
                ("CModule", "load") => {
                    "choose the device when loading: `CModule::load_on_device(path, device)`"
                }
                ("CModule", "load_data") => {
                    "choose the device when loading: `CModule::load_data_on_device(reader, device)`"
                }
                ("Tensor", "load_multi") => {
                    "choose the device when loading: `Tensor::load_multi_with_device(path, device)`"
                }
                ("Tensor", "load_multi_from_stream") => {
                    "choose the device when loading: \
                     `Tensor::load_multi_from_stream_with_device(stream, device)`"
                }
                ("Tensor", "load" | "load_from_stream") => {
                    "tch has no device-taking form of this loader: save with `Tensor::save_multi` \
                     and load with `Tensor::load_multi_with_device(path, device)`"
                }
                _ => continue,
            };
            // `Tensor::load` of another library is not tch's.
            if !cx.uses(file, Framework::Tch) {
                continue;
            }
            out.push(Finding::new(
                file,
                cx.region_of(path),
                format!("`{ty}::{name}` restores tensors to the device they were saved from"),
                help,
            ));
        }
    }
}

/// PK403's Python form: `torch.load(..)` / `torch.jit.load(..)` without `map_location`.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named(&["load"]) {
        let Some(path @ ("torch.load" | "torch.jit.load")) = call.path.as_deref() else {
            continue;
        };
        if call.in_test || call.has_double_star() {
            continue;
        }
        let given = call.keyword("map_location").is_some() || call.call.arguments.args.len() >= 2;
        if given {
            continue;
        }
        out.push(cx.finding(
            file,
            PyContext::callee_range(call),
            format!("`{path}` restores tensors to the device they were saved from"),
            "choose the device when loading: `torch.load(path, map_location=device)`",
        ));
    }
}
