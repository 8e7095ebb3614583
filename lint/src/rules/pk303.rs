//! PK303 pageable-upload-in-step-loop.

use crate::analysis::patterns::root_name;
use crate::analysis::{CallFact, CrateContext, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::pk203::is_upload;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a host-to-device copy from ordinary (pageable) host memory inside a training step loop:
    /// cudarc `memcpy_htod`/`clone_htod` from a `Vec` or slice, a candle or burn tensor built from host
    /// data on the device, a tch `Tensor::from_slice(..).to_device(..)` without `pin_memory`.
    ///
    /// ## Why is this bad?
    /// The GPU can only copy from page-locked (pinned) memory. From a plain `Vec`, the driver first
    /// copies the data into a pinned staging buffer on the host and then transfers it, synchronously:
    /// the copy runs at a fraction of the bus bandwidth and cannot overlap with compute. Per step,
    /// that is time the GPU spends waiting for its input. It is a note because small models may not
    /// notice; `perfkit profile` measures how much it costs.
    ///
    /// ## Example
    /// ```rust,ignore
    /// for batch in loader {
    ///     let input = stream.clone_htod(&batch.pixels)?; // Vec<f32>: pageable
    ///     model.backward(&stream, &input)?;
    ///     opt.step(&stream)?;
    /// }
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let mut staging = unsafe { ctx.alloc_pinned::<f32>(batch_len) }?;
    /// let mut input = stream.alloc_zeros::<f32>(batch_len)?;
    /// for batch in loader {
    ///     staging.as_mut_slice()?.copy_from_slice(&batch.pixels);
    ///     stream.memcpy_htod(&staging, &mut input)?; // pinned: asynchronous, full bandwidth
    ///     model.backward(&stream, &input)?;
    ///     opt.step(&stream)?;
    /// }
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags a batch from a `DataLoader` built without `pin_memory=True`,
    /// copied with `.to(device)` / `.cuda()` in the step loop; or a batch from pinned memory copied
    /// without `non_blocking=True`.
    ///
    /// ```python
    /// loader = DataLoader(dataset, batch_size=64, num_workers=8)
    /// for x, y in loader:
    ///     x, y = x.to(device), y.to(device)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// loader = DataLoader(dataset, batch_size=64, num_workers=8, pin_memory=True)
    /// for x, y in loader:
    ///     x = x.to(device, non_blocking=True)
    ///     y = y.to(device, non_blocking=True)
    /// ```
    pub PageableUploadInStepLoop {
        code: "PK303",
        name: "pageable-upload-in-step-loop",
        severity: Note,
        fixable: false,
    }
}

impl Rule for PageableUploadInStepLoop {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for (file, call) in cx.calls() {
            let Some(help) = pageable_upload(cx, file, call) else {
                continue;
            };
            // Uploading before the loop (the whole data set, once) is the cure, not the problem; a CPU
            // "device" has no transfer at all.
            let Some(hit) = cx.upload_step_loop(file, call) else {
                continue;
            };
            let what = call.shown();
            out.push(
                Finding::new(
                    file,
                    cx.region(call.call.name_span()),
                    format!("`{what}` copies from pageable host memory inside the step loop"),
                    help,
                )
                .in_step_loop(cx, &hit),
            );
        }
    }
}

fn pageable_upload(
    cx: &CrateContext<'_>,
    file: FileId,
    call: &CallFact<'_>,
) -> Option<&'static str> {
    if call.call.is_method() && cx.uses(file, Framework::Cudarc) {
        let is_copy = matches!(
            call.name,
            "memcpy_htod"
                | "clone_htod"
                | "memcpy_stod"
                | "htod_copy"
                | "htod_sync_copy"
                | "htod_sync_copy_into"
                | "htod_copy_into"
        );
        let source = call.call.args().first()?;
        if !is_copy || is_pinned(cx, file, call, source) {
            return None;
        }
        return Some(
            "stage the data in a pinned buffer (`CudaContext::alloc_pinned`) reused across steps \
             and copy from it, or upload the data set once before the loop",
        );
    }
    if is_upload(cx, file, call) {
        return Some(if cx.uses(file, Framework::Tch) {
            "call `pin_memory(device)` on the host tensor before `to_device`, or move the data set \
             to the device once before the loop"
        } else {
            "upload the data set once before the loop and slice batches on the device, or prefetch \
             the next batch while the current step runs"
        });
    }
    None
}

/// The copy's source is a pinned buffer: bound from `alloc_pinned`/`pin_memory` in the function, or
/// named as one (`pinned`, `staging_pinned`, `pinned_buf`).
fn is_pinned(cx: &CrateContext<'_>, file: FileId, call: &CallFact<'_>, source: &syn::Expr) -> bool {
    let Some(name) = root_name(source) else {
        return false;
    };
    if name.to_ascii_lowercase().contains("pinned") {
        return true;
    }
    cx.fn_of(file, call)
        .is_some_and(|f| f.pinned_bindings.contains(&name))
}

/// PK303's Python form: a batch from a `DataLoader` built without `pin_memory=True` copied with
/// `.to(device)` / `.cuda()` in the step loop; or, from pinned memory, without `non_blocking=True`.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    // `x, y = x.to(dev), y.to(dev)`: one finding per line.
    let mut seen = std::collections::HashSet::new();
    for (file, call) in cx.calls_named(&["to", "cuda"]) {
        let (Some(method @ ("to" | "cuda")), Some(recv)) = (call.method, call.receiver) else {
            continue;
        };
        if method == "to" {
            let Some(device) = call
                .call
                .arguments
                .args
                .first()
                .or_else(|| python_keyword(call.call, "device"))
            else {
                continue;
            };
            if cx.device_of(file, call.fn_idx, device, call.start) != Device::Accelerator {
                continue;
            }
        }
        let Some(hit) = cx.step_hit(file, call) else {
            continue;
        };
        // The batch: a loop target over a loader (`x` of `for x, y in loader`, `batch["ids"]`).
        let base = match recv {
            PyExpr::Subscript(sub) => &*sub.value,
            other => other,
        };
        let Some(assign) = cx.binding(file, call.fn_idx, base, call.start) else {
            continue;
        };
        if !assign.loop_target {
            continue;
        }
        let Some(loader) = cx.loader_of(file, assign.fn_idx, assign.value, assign.at) else {
            continue;
        };
        // `DataLoader(ds, **kwargs)` may pass `pin_memory` in the dict: nothing is known.
        if loader.arguments.keywords.iter().any(|k| k.arg.is_none()) {
            continue;
        }
        let pinned = match python_keyword(loader, "pin_memory") {
            None => false,
            Some(PyExpr::BooleanLiteral(b)) => b.value,
            Some(_) => true,
        };
        let non_blocking = matches!(python_keyword(call.call, "non_blocking"), Some(PyExpr::BooleanLiteral(b)) if b.value)
            || python_keyword(call.call, "non_blocking")
                .is_some_and(|e| !matches!(e, PyExpr::BooleanLiteral(_)));
        let line = cx.file(file).line_name(loader.start().to_usize());
        let finding = if !pinned {
            cx.finding(
                file,
                PyContext::callee_range(call),
                format!("`.{method}(..)` copies a batch from pageable memory: its `DataLoader` ({line}) has no `pin_memory=True`"),
                "pass `pin_memory=True` to the `DataLoader` and copy with `.to(device, non_blocking=True)`",
            )
        } else if !non_blocking {
            cx.finding(
                file,
                PyContext::callee_range(call),
                format!("`.{method}(..)` copies a pinned batch without `non_blocking=True`, so the host waits for the copy"),
                "copy with `.to(device, non_blocking=True)` so the copy overlaps with the host's work",
            )
        } else {
            continue;
        };
        if !seen.insert((file, finding.region.line)) {
            continue;
        }
        out.push(finding.in_py_step_loop(cx, &hit));
    }
}
