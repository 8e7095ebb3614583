//! PK102 sync-in-step-loop.

use crate::analysis::{CallFact, CrateContext, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags an explicit device synchronization (`synchronize()` on a candle device or a cudarc
    /// stream/context/event, burn `device.sync()` / `B::sync(&device)`, tch `Cuda::synchronize`)
    /// inside a training step loop.
    ///
    /// The receiver decides: a device, stream, context or event, by the type the crate declares
    /// for it (`&CudaStream`, `Device`) or, when none is declared, by its name (`device`, `stream`,
    /// `ctx`, `done_event`). A logger's, a metric item's or a file's `sync` is not a device
    /// synchronization.
    ///
    /// ## Why is this bad?
    /// A synchronize makes the host wait until every kernel queued so far has finished. While it waits
    /// it cannot queue the next step's work, so the GPU drains its queue and idles between steps.
    /// Training code rarely needs one: the next readback (or the end of the epoch) synchronizes
    /// anyway, and timing code should use CUDA events instead. Syncs that run only every N steps
    /// (`if step % N == 0`) or once per epoch are reported as notes.
    ///
    /// A cudarc event waited on before the same function records it again (`slot_free.synchronize()`
    /// ... `slot_free.record(&stream)`) is not flagged: it waits for work queued in an earlier
    /// iteration, the way a double-buffered upload waits for the copy that last read its buffer, and
    /// blocks only when the host runs that far ahead of the GPU.
    ///
    /// ## Example
    /// ```rust,ignore
    /// for batch in batches {
    ///     let loss = model.forward(&batch)?;
    ///     opt.backward_step(&loss)?;
    ///     device.synchronize()?; // the GPU runs dry after every step
    /// }
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// for batch in batches {
    ///     let loss = model.forward(&batch)?;
    ///     opt.backward_step(&loss)?;
    /// }
    /// device.synchronize()?; // once, where the host really needs the results
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `torch.cuda.synchronize()`, `stream.synchronize()` and
    /// `event.synchronize()` inside a step loop.
    ///
    /// ```python
    /// for x, y in loader:
    ///     loss = criterion(model(x), y)
    ///     loss.backward()
    ///     opt.step()
    ///     torch.cuda.synchronize()  # to time the step
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    /// start.record()
    /// for x, y in loader:
    ///     loss = criterion(model(x), y)
    ///     loss.backward()
    ///     opt.step()
    /// end.record()
    /// end.synchronize()  # once
    /// print(start.elapsed_time(end))
    /// ```
    pub SyncInStepLoop {
        code: "PK102",
        name: "sync-in-step-loop",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for SyncInStepLoop {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for (file, call) in cx.calls() {
            let Some(what) = sync_call(cx, file, call) else {
                continue;
            };
            // Waiting for an earlier iteration's event is flow control, not a drain.
            if waits_for_an_earlier_iteration(cx, file, call) {
                continue;
            }
            // Not in (or called from) a step loop: a final synchronize is what it is for. A CPU device has
            // nothing to wait for.
            let Some(hit) = cx.device_step_loop(file, call) else {
                continue;
            };
            out.push(
                Finding::new(
                    file,
                    cx.region(call.call.name_span()),
                    format!("`{what}` blocks the host until the GPU is idle, inside the step loop"),
                    "remove it: the next readback or the end of the epoch synchronizes anyway; to \
                     time GPU work use CUDA events or `perfkit profile`",
                )
                .in_step_loop(cx, &hit),
            );
        }
    }
}

/// The synchronization a call performs, named as the finding shows it.
fn sync_call(cx: &CrateContext<'_>, file: FileId, call: &CallFact<'_>) -> Option<String> {
    let any_gpu_framework = cx.uses(file, Framework::Candle)
        || cx.uses(file, Framework::Cudarc)
        || cx.uses(file, Framework::Tch)
        || cx.uses(file, Framework::Burn);
    let name = call.name;
    let is_sync = match (name, call.call.is_method()) {
        // candle `device.synchronize()`, cudarc `stream.synchronize()` / `ctx.synchronize()` /
        // `event.synchronize()`.
        ("synchronize", true) => {
            any_gpu_framework && call.call.args().is_empty() && is_device_receiver(call)
        }
        // tch `Cuda::synchronize(0)`, cudarc `result::stream::synchronize(s)`.
        ("synchronize", false) => cx.uses(file, Framework::Tch) || cx.uses(file, Framework::Cudarc),
        // burn: `device.sync()` (current API), `B::sync(&device)` (0.21's `Backend::sync`). A
        // logger's or a metric item's `sync` is not a device synchronization.
        ("sync", true) => {
            cx.uses(file, Framework::Burn)
                && call.call.args().is_empty()
                && is_device_receiver(call)
        }
        ("sync", false) => {
            cx.uses(file, Framework::Burn)
                && call.call.args().len() == 1
                && call.call.qualifier().is_some_and(|q| {
                    let q = q.to_string();
                    q == "Backend" || q.len() <= 2 && q.chars().all(|c| c.is_ascii_uppercase())
                })
        }
        _ => false,
    };
    if !is_sync {
        return None;
    }
    Some(call.shown())
}

/// Whether a method's receiver is a device, stream, context or event: by the type the crate
/// declares for it, else by its name (`device`, `dev`, `stream`, `ctx`, `self.gpu`, `done_event`).
fn is_device_receiver(call: &CallFact<'_>) -> bool {
    const WORDS: &[&str] = &[
        "device", "dev", "stream", "ctx", "context", "event", "cuda", "gpu",
    ];
    let has_word = |name: &str| {
        let lower = name.to_ascii_lowercase();
        WORDS.iter().any(|w| lower.contains(w))
    };
    if let Some(ty) = call.recv_ty.name() {
        return has_word(ty);
    }
    let Some(receiver) = call.call.receiver() else {
        return false;
    };
    match crate::analysis::patterns::root_name(receiver) {
        Some(name) => has_word(&name),
        // `Device::new_cuda(0)?.synchronize()`, `B::Device::default().sync()`: a device expression.
        None => true,
    }
}

/// Whether `call` is `event.synchronize()` in a cudarc file whose function records the same
/// `event` again after it: the wait is for the previous recording, made an iteration earlier.
fn waits_for_an_earlier_iteration(
    cx: &CrateContext<'_>,
    file: FileId,
    call: &CallFact<'_>,
) -> bool {
    if !cx.uses(file, Framework::Cudarc) || !call.call.is_method() {
        return false;
    }
    let (Some(event), Some(function)) = (call.call.receiver(), call.fn_idx) else {
        return false;
    };
    let position = |c: &CallFact<'_>| {
        let at = c.call.name_span().start();
        (at.line, at.column)
    };
    let waited_at = position(call);
    cx.file(file).facts.calls.iter().any(|other| {
        other.fn_idx == Some(function)
            && other.is("record")
            && other.call.is_method()
            && other.call.receiver() == Some(event)
            && position(other) > waited_at
    })
}

/// PK102's Python form: `torch.cuda.synchronize()`, `stream.synchronize()`, `event.synchronize()`
/// in a step loop.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named(&["synchronize"]) {
        let alias = if call.method == Some("synchronize") {
            None
        } else {
            match synchronize_alias(cx, file, call) {
                Some(target) => Some(target),
                None => continue,
            }
        };
        let Some(hit) = cx.step_hit(file, call) else {
            continue;
        };
        let what = call.path.as_deref().unwrap_or(".synchronize");
        let message = match &alias {
            Some(target) => {
                format!("`{what}()` (`{target}`) waits for the GPU inside the step loop")
            }
            None => format!("`{what}()` waits for the GPU inside the step loop"),
        };
        out.push(
            cx.finding(
                file,
                PyContext::callee_range(call),
                message,
                "remove it (CUDA orders work on a stream by itself); to time a step, record \
                 `torch.cuda.Event`s and read them after the loop, or use `perfkit profile`",
            )
            .in_py_step_loop(cx, &hit),
        );
    }
}

/// `synchronize()` where the name is bound to a synchronize function:
/// `synchronize = torch.cuda.synchronize`, or one of the two alternatives of
/// `synchronize = torch.cuda.synchronize if device_type == "cuda" else lambda: None`. The function
/// it stands for, when it is one.
fn synchronize_alias(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> Option<String> {
    if !matches!(&*call.call.func, PyExpr::Name(_)) {
        return None;
    }
    let assign = cx.binding(file, call.fn_idx, &call.call.func, call.start)?;
    let alternatives: Vec<&PyExpr> = match assign.value {
        PyExpr::If(choice) => vec![&*choice.body, &*choice.orelse],
        value => vec![value],
    };
    alternatives
        .into_iter()
        .filter_map(facts::dotted)
        .find(|path| path.ends_with(".synchronize"))
}
