//! PK104 empty-cache-in-step-loop: `torch.cuda.empty_cache()` in a step loop.

use crate::analysis::CrateContext;
use crate::python::PyContext;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags `torch.cuda.empty_cache()` (and `torch.mps.empty_cache()`, `torch.xpu.empty_cache()`)
    /// inside a training step loop.
    ///
    /// Calls that run only every N steps (`if step % 100 == 0`) or once per epoch are reported as
    /// notes. This rule has no Rust form: candle, burn, tch-rs and cudarc have no caching allocator
    /// to empty from the training loop.
    ///
    /// ## Why is this bad?
    /// PyTorch's caching allocator keeps freed device memory to hand it out again without a
    /// `cudaMalloc`. `empty_cache()` gives those blocks back to the driver, and the next step asks
    /// for the same memory again: every step pays `cudaFree` and `cudaMalloc` (which synchronize the
    /// device) and the allocator's fragmentation gets worse, not better. It frees nothing that the
    /// training itself could use; it only helps another process on the same GPU.
    ///
    /// ## Example
    /// ```python
    /// for batch in loader:
    ///     loss = model(batch).loss
    ///     loss.backward()
    ///     opt.step()
    ///     opt.zero_grad()
    ///     torch.cuda.empty_cache()  # frees the cache, which the next step refills
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// for batch in loader:
    ///     loss = model(batch).loss
    ///     loss.backward()
    ///     opt.step()
    ///     opt.zero_grad(set_to_none=True)
    /// torch.cuda.empty_cache()  # once, after training, if another process needs the memory
    /// ```
    pub EmptyCacheInStepLoop {
        code: "PK104",
        name: "empty-cache-in-step-loop",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for EmptyCacheInStepLoop {
    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, _cx: &CrateContext<'_>, _out: &mut Vec<Finding>) {
        // No Rust form: the Rust frameworks have no caching allocator to empty.
    }

    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        for (file, call) in cx.calls_named(&["empty_cache"]) {
            let Some(path) = call.path.as_deref() else {
                continue;
            };
            if !matches!(
                path,
                "torch.cuda.empty_cache" | "torch.mps.empty_cache" | "torch.xpu.empty_cache"
            ) {
                continue;
            }
            let Some(hit) = cx.step_hit(file, call) else {
                continue;
            };
            out.push(
                cx.finding(
                    file,
                    PyContext::callee_range(call),
                    format!("`{path}()` empties the caching allocator inside the step loop"),
                    "remove it: the next step allocates the same memory again; call it once after \
                     training if another process needs the memory",
                )
                .in_py_step_loop(cx, &hit),
            );
        }
    }
}
