//! PK202 alloc-in-step-loop.

use crate::analysis::patterns::{is_tensor_fn, last_arg_device};
use crate::analysis::{CallFact, CrateContext, DeviceKind, FileId, Framework};
use crate::rules::{Finding, Rule, RuleMeta};

/// Tensor constructors that allocate without copying host data and whose content does not change
/// from step to step (so the tensor could be made once). Random constructors (`randn`, `rand`,
/// `random`) are left out: fresh noise every step is their point, and the frameworks offer no
/// in-place refill.
const ALLOCATING_CONSTRUCTORS: &[&str] = &[
    "zeros",
    "ones",
    "full",
    "arange",
    "arange_step",
    "empty",
    "eye",
    "zeros_like",
    "ones_like",
];

crate::declare_rule! {
    /// ## What it does
    /// Flags a device allocation inside a training step loop: cudarc `alloc_zeros`/`alloc`, or a
    /// tensor constructor with step-invariant content (`Tensor::zeros`, `ones`, `full`, `arange`,
    /// `eye`, ...) on an accelerator.
    ///
    /// ## Why is this bad?
    /// A fresh buffer every step costs an allocation (and with cudarc a real `cuMemAlloc`, which can
    /// synchronize the device) plus a fill kernel, for data whose shape does not change between
    /// steps. Allocating once before the loop and reusing the buffer removes both. Tensor libraries
    /// with caching allocators make this cheaper but not free, so the rule is a note by default.
    /// Random tensors (`randn`, `rand`, `random`) are not reported: new noise every step is the point.
    ///
    /// ## Example
    /// ```rust,ignore
    /// for batch in batches {
    ///     let mut grads = stream.alloc_zeros::<f32>(n)?; // a new device buffer per step
    ///     backward(&stream, &batch, &mut grads)?;
    ///     opt.step(&stream, &mut weights, &grads)?;
    /// }
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let mut grads = stream.alloc_zeros::<f32>(n)?;
    /// for batch in batches {
    ///     stream.memset_zeros(&mut grads)?;
    ///     backward(&stream, &batch, &mut grads)?;
    ///     opt.step(&stream, &mut weights, &grads)?;
    /// }
    /// ```
    pub AllocInStepLoop {
        code: "PK202",
        name: "alloc-in-step-loop",
        severity: Note,
        fixable: false,
    }
}

impl Rule for AllocInStepLoop {
    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for (file, call) in cx.calls() {
            let Some((what, help)) = allocation(cx, file, call) else {
                continue;
            };
            // Outside step loops, allocating is how buffers are made; host memory is not a device
            // allocation.
            let Some(hit) = cx.device_step_loop(file, call) else {
                continue;
            };
            out.push(
                Finding::new(
                    file,
                    cx.region(call.call.name_span()),
                    format!("`{what}` allocates device memory on every step"),
                    help,
                )
                .in_step_loop(cx, &hit),
            );
        }
    }
}

fn allocation(
    cx: &CrateContext<'_>,
    file: FileId,
    call: &CallFact<'_>,
) -> Option<(String, &'static str)> {
    let name = call.name;
    if call.call.is_method() {
        // cudarc `stream.alloc_zeros::<f32>(n)` / `unsafe { stream.alloc::<f32>(n) }`.
        let is_alloc = matches!(name, "alloc_zeros" | "alloc")
            && cx.uses(file, Framework::Cudarc)
            && call.call.args().len() == 1;
        return is_alloc.then(|| {
            (
                name.to_string(),
                "allocate the buffer once before the loop and reuse it (clear it with \
                 `memset_zeros` if it must start at zero)",
            )
        });
    }
    let tensor_framework = cx.uses(file, Framework::Candle)
        || cx.uses(file, Framework::Burn)
        || cx.uses(file, Framework::Tch);
    if !tensor_framework || !is_tensor_fn(call, ALLOCATING_CONSTRUCTORS) {
        return None;
    }
    // The device argument is the CPU: host memory.
    if last_arg_device(&call.call) == DeviceKind::Cpu {
        return None;
    }
    Some((
        format!("Tensor::{name}"),
        "create the tensor once before the loop and reuse it, or derive it from an existing \
         device tensor (`zeros_like`) outside the loop",
    ))
}
