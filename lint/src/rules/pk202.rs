//! PK202 alloc-in-step-loop.

use crate::analysis::patterns::{is_tensor_fn, last_arg_device};
use crate::analysis::{CallFact, CrateContext, DeviceKind, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
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
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `torch.zeros`, `torch.ones`, `torch.empty` and `torch.full`
    /// with `device=` a GPU, of a shape that does not change from step to step, inside a step loop.
    ///
    /// ```python
    /// for x, y in loader:
    ///     state = torch.zeros(64, hidden, device=device)
    ///     loss = criterion(model(x, state), y)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// state = torch.zeros(64, hidden, device=device)
    /// for x, y in loader:
    ///     state.zero_()
    ///     loss = criterion(model(x, state), y)
    /// ```
    pub AllocInStepLoop {
        code: "PK202",
        name: "alloc-in-step-loop",
        severity: Note,
        fixable: false,
    }
}

impl Rule for AllocInStepLoop {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

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

/// PK202's Python form: `torch.zeros/ones/empty/full(..., device=...)` of a loop-invariant shape
/// in a step loop.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named(python_names::ALLOCATORS) {
        let Some(path) = call.path.as_deref() else {
            continue;
        };
        let Some(name) = path.strip_prefix("torch.") else {
            continue;
        };
        if !python_names::ALLOCATORS.contains(&name) {
            continue;
        }
        // Only device allocations: a CPU tensor is PK201's business, if it is copied.
        let Some(device) = python_keyword(call.call, "device") else {
            continue;
        };
        if cx.device_of(file, call.fn_idx, device, call.start) == Device::Cpu {
            continue;
        }
        let Some(hit) = cx.step_hit(file, call) else {
            continue;
        };
        let step_loop = call
            .loops
            .iter()
            .rev()
            .copied()
            .find(|&l| cx.is_step_loop(file, l));
        let shape: Vec<&PyExpr> = match name {
            "full" => call.call.arguments.args.iter().take(1).collect(),
            _ => call.call.arguments.args.iter().collect(),
        };
        if shape.is_empty()
            || !shape
                .iter()
                .all(|e| invariant(cx, file, call, step_loop, e))
        {
            continue;
        }
        out.push(
            cx.finding(
                file,
                PyContext::callee_range(call),
                format!("`{path}` allocates a tensor of the same shape on the device on every step"),
                "allocate it once before the loop and reuse it (`.zero_()` / `.fill_()` it in place)",
            )
            .in_py_step_loop(cx, &hit),
        );
    }
}

/// Whether a shape expression has the same value on every step: literals, and names and
/// attributes not bound inside the step loop (in a step body: only literals and `self.` fields).
fn invariant(
    cx: &PyContext<'_>,
    file: usize,
    call: &PyCall<'_>,
    step_loop: Option<usize>,
    expr: &PyExpr,
) -> bool {
    match expr {
        PyExpr::NumberLiteral(_) => true,
        PyExpr::Tuple(t) => t
            .elts
            .iter()
            .all(|e| invariant(cx, file, call, step_loop, e)),
        PyExpr::List(t) => t
            .elts
            .iter()
            .all(|e| invariant(cx, file, call, step_loop, e)),
        PyExpr::BinOp(b) => {
            invariant(cx, file, call, step_loop, &b.left)
                && invariant(cx, file, call, step_loop, &b.right)
        }
        PyExpr::Attribute(a) => match &*a.value {
            PyExpr::Name(n) if n.id.as_str() == "self" => a.attr.as_str() != "shape",
            _ => a.attr.as_str() != "shape" && invariant(cx, file, call, step_loop, &a.value),
        },
        PyExpr::Name(_) => {
            let Some(l) = step_loop else {
                // A step body's parameters change on every call.
                return false;
            };
            let range = cx.units[file].facts.loops[l].range;
            match cx.binding(file, call.fn_idx, expr, call.start) {
                Some(assign) if assign.fn_idx == call.fn_idx => {
                    assign.at < range.start().to_usize() && !assign.loop_target
                }
                Some(_) => true,
                // A parameter of the function: the same for every step of this loop.
                None => true,
            }
        }
        _ => false,
    }
}
