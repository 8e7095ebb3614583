//! PK303 pageable-upload-in-step-loop.

use crate::analysis::patterns::root_name;
use crate::analysis::{CallFact, CrateContext, FileId, Framework};
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
    pub PageableUploadInStepLoop {
        code: "PK303",
        name: "pageable-upload-in-step-loop",
        severity: Note,
        fixable: false,
    }
}

impl Rule for PageableUploadInStepLoop {
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
