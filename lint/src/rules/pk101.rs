//! PK101 host-readback-in-step-loop.

use crate::analysis::format::Trait;
use crate::analysis::{CallFact, CrateContext, DeviceKind, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a device-to-host readback (`to_scalar`, `to_vec1`, `into_scalar`, `into_data`,
    /// `double_value`, `clone_dtoh`, ...) inside a training step loop, and a loss (the value the
    /// loop differentiates) formatted into text there (`println!("{loss}")`, `format!("{:?}", loss)`):
    /// a tensor's `Display`, and candle's and tch's `Debug` of a scalar, copy its values to the
    /// host.
    ///
    /// ## Why is this bad?
    /// Reading a value back to the host waits for every queued kernel to finish and then copies a few
    /// bytes over PCIe. Done on every step, the GPU idles while the host waits, and the host idles
    /// while the GPU refills its queue: the same problem as `loss.item()` in a PyTorch loop.
    /// Readbacks that run only every N steps (`if step % 100 == 0`) or once per epoch are reported
    /// as notes. A readback whose value an environment takes for its next step is not reported:
    /// the action a policy chose, passed (directly, through bindings or through the values of the
    /// functions that return it) to `env.step(..)`, or to a method of a game or simulator that the
    /// same function advances with `update()`/`tick()`/`advance()`/`step()`. The host needs that
    /// value every step; a value read for a log, a metric or a running total is still reported.
    ///
    /// ## Example
    /// ```rust,ignore
    /// for (step, batch) in batches.enumerate() {
    ///     let loss = model.forward(&batch)?;
    ///     opt.backward_step(&loss)?;
    ///     total += loss.to_scalar::<f32>()?; // waits for the GPU on every step
    /// }
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let mut total = Tensor::zeros((), DType::F32, &device)?;
    /// for (step, batch) in batches.enumerate() {
    ///     let loss = model.forward(&batch)?;
    ///     opt.backward_step(&loss)?;
    ///     total = (total + loss.detach())?; // stays on the device
    /// }
    /// println!("mean loss {}", total.to_scalar::<f32>()? / n as f32);
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags `.item()`, `.cpu()`, `.numpy()`, `.tolist()`,
    /// `float(t)`/`int(t)`/`bool(t)`, `print(t)` of a tensor, a tensor formatted into text
    /// (`f"{loss:.4f}"`, `"%.4f" % loss`, `"{}".format(loss)`: formatting calls the tensor's
    /// `__format__`, which reads it back), a tensor tested for truth (`if torch.isnan(loss):`,
    /// `if loss > 100:`, `assert torch.isfinite(loss)`), a tensor handed to TensorBoard's
    /// `add_scalar` or to
    /// `wandb.log` (they convert it on the host) and `t.to("cpu")` inside a step loop (a
    /// Lightning `training_step` is one; its `self.log(..)` keeps values on the device).
    ///
    /// ```python
    /// for step, (x, y) in enumerate(loader):
    ///     loss = criterion(model(x), y)
    ///     loss.backward()
    ///     opt.step()
    ///     total += loss.item()  # waits for the GPU on every step
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// total = torch.zeros((), device=device)
    /// for step, (x, y) in enumerate(loader):
    ///     loss = criterion(model(x), y)
    ///     loss.backward()
    ///     opt.step()
    ///     total += loss.detach()
    /// print(total.item() / (step + 1))
    /// ```
    pub HostReadbackInStepLoop {
        code: "PK101",
        name: "host-readback-in-step-loop",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for HostReadbackInStepLoop {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for crate_file in cx.files() {
            let file = crate_file.id;
            for (index, call) in crate_file.facts.calls.iter().enumerate() {
                helper_readback(cx, file, index, call, out);
            }
        }
        for crate_file in cx.files() {
            formatted_losses(cx, crate_file.id, &crate_file.facts, out);
        }
        for (file, call) in cx.calls() {
            let Some(what) = readback(cx, file, call) else {
                continue;
            };
            // Not in (or called from) a step loop: a readback after training is fine. On a device that is
            // statically the CPU nothing crosses PCIe.
            let Some(hit) = cx.device_step_loop(file, call) else {
                continue;
            };
            // The action a policy chose, read back for the environment's next step: the host
            // needs it every step, and reading it less often is not an option.
            if cx.feeds_environment(file, call) {
                continue;
            }
            let finding = Finding::new(
                file,
                cx.region(call.call.name_span()),
                format!("`{what}` reads a tensor back to the host inside the step loop"),
                "keep the value on the device (accumulate it in a tensor) and read it back after \
                 the loop or every N steps",
            )
            .in_step_loop(cx, &hit);
            out.push(finding);
        }
    }
}

/// A step loop that calls an output helper (`log_loss(&loss)`, `save_image(&t, ..)`) which reads a
/// tensor back: reported at the call, where the fix goes (call it every N steps), not inside the
/// helper, whose purpose the readback is.
fn helper_readback(
    cx: &CrateContext<'_>,
    file: FileId,
    index: usize,
    call: &CallFact<'_>,
    out: &mut Vec<Finding>,
) {
    let mut helpers = cx.helper_targets(file, index).peekable();
    if helpers.peek().is_none() {
        return;
    }
    let Some(hit) = cx.device_step_loop(file, call) else {
        return;
    };
    for (helper_file, helper) in helpers {
        let fn_idx = cx
            .file(helper_file)
            .facts
            .fns
            .iter()
            .position(|f| std::ptr::eq(f, helper));
        let inner =
            cx.file(helper_file).facts.calls.iter().find(|c| {
                c.fn_idx == fn_idx && !c.in_test && readback(cx, helper_file, c).is_some()
            });
        let Some(inner) = inner else { continue };
        let what = readback(cx, helper_file, inner).unwrap_or_default();
        let at = format!(
            "{}:{}",
            cx.file(helper_file).path().display(),
            cx.region(inner.call.name_span()).line
        );
        out.push(
            Finding::new(
                file,
                cx.region(call.call.name_span()),
                format!(
                    "`{}` reads a tensor back to the host inside the step loop",
                    call.shown()
                ),
                "call it after the loop or every N steps, or keep the value on the device \
                 (accumulate it in a tensor) until then",
            )
            .with_note(format!("it calls `{what}` at {at}"))
            .in_step_loop(cx, &hit),
        );
        return;
    }
}

/// A loss (a value the function differentiates: `loss.backward()`, `opt.backward_step(&loss)`)
/// formatted in a step loop: `println!("{loss}")`. A tensor's `Display` copies its values to the
/// host (candle, burn and tch alike); candle's and tch's `Debug` do too for a scalar or a short
/// vector, which a loss is (burn's derived `Debug` shows the handle, not the values).
fn formatted_losses(
    cx: &CrateContext<'_>,
    file: FileId,
    facts: &crate::analysis::FileFacts<'_>,
    out: &mut Vec<Finding>,
) {
    for fmt in &facts.formats {
        let Some(&(_, call)) = facts.losses.iter().find(|(b, _)| *b == fmt.binding) else {
            continue;
        };
        let debug = fmt.how == Trait::Debug;
        if debug && !(cx.uses(file, Framework::Candle) || cx.uses(file, Framework::Tch)) {
            continue;
        }
        // Where the macro is, with the loss's device: the step-loop and device questions are
        // those of a readback call written there.
        let at = CallFact {
            fn_idx: fmt.fn_idx,
            loop_idx: fmt.loop_idx,
            guard: fmt.guard,
            guard_kind: fmt.guard_kind,
            in_test: fmt.in_test,
            on_failure: fmt.on_failure,
            in_macro: true,
            operand: fmt.dev,
            ..facts.calls[call]
        };
        let Some(hit) = cx.device_step_loop(file, &at) else {
            continue;
        };
        let (spec, by) = if debug {
            ("{:?}", "`Debug`")
        } else {
            ("{}", "`Display`")
        };
        out.push(
            Finding::new(
                file,
                fmt.region,
                format!(
                    "formatting the loss `{}` with `{spec}` reads it back to the host inside the \
                     step loop",
                    fmt.name
                ),
                "keep the value on the device (accumulate it in a tensor) and format it after the \
                 loop or every N steps",
            )
            .with_note(format!(
                "the tensor's {by} implementation copies its values to the host"
            ))
            .in_step_loop(cx, &hit),
        );
    }
}

/// The readback a call performs, if it is one, named as the finding shows it.
fn readback(cx: &CrateContext<'_>, file: FileId, call: &CallFact<'_>) -> Option<String> {
    let name = call.name;
    let uses = |framework| cx.uses(file, framework);
    let is_readback = match (name, call.call.is_method()) {
        ("to_scalar" | "to_vec0" | "to_vec1" | "to_vec2" | "to_vec3", true) => {
            uses(Framework::Candle)
        }
        (
            "into_scalar" | "into_data" | "to_data" | "into_scalar_async" | "into_data_async"
            | "to_data_async",
            true,
        ) => uses(Framework::Burn),
        ("double_value" | "int64_value" | "f_double_value" | "f_int64_value", true) => {
            uses(Framework::Tch)
        }
        (
            "clone_dtoh"
            | "memcpy_dtoh"
            | "memcpy_dtov"
            | "dtoh_sync_copy"
            | "dtoh_sync_copy_into"
            | "sync_reclaim",
            true,
        ) => uses(Framework::Cudarc),
        // candle `t.to_device(&Device::Cpu)`, tch `t.to_device(Device::Cpu)` / `t.to(Device::Cpu)`.
        (name, true) if crate::analysis::values::is_transfer(name) => {
            (uses(Framework::Candle) || uses(Framework::Tch) || uses(Framework::Burn))
                && call.call.args().len() == 1
                && cx.device_of(&call.call.args()[0]) == DeviceKind::Cpu
        }
        // tch `f64::try_from(&t)`, `Vec::<f32>::try_from(&t)`, `f64::from(&t)` (`from` only on a
        // reference: `f64::from(x)` of a number is ordinary arithmetic).
        ("try_from" | "from", false) => {
            uses(Framework::Tch)
                && call.call.args().len() == 1
                && (name == "try_from" || matches!(call.call.args()[0], syn::Expr::Reference(_)))
                && call.call.qualifier().is_some_and(|q| {
                    matches!(
                        q.to_string().as_str(),
                        "f64" | "f32" | "i64" | "i32" | "bool" | "u8" | "Vec" | "ArrayD"
                    )
                })
        }
        _ => false,
    };
    if !is_readback {
        return None;
    }
    Some(call.shown())
}

/// Whether a value is a tensor already copied to the host: `t.cpu()`, `t.to("cpu")`, `t.numpy()`,
/// or what a method computes from one (`host.float().max()`), through subscripts and the
/// bindings of names.
fn on_host(
    cx: &PyContext<'_>,
    file: usize,
    fn_idx: Option<usize>,
    expr: &PyExpr,
    offset: usize,
    depth: usize,
) -> bool {
    if depth > 4 {
        return false;
    }
    match expr {
        PyExpr::Subscript(sub) => on_host(cx, file, fn_idx, &sub.value, offset, depth + 1),
        PyExpr::Name(_) => cx
            .binding(file, fn_idx, expr, offset)
            .filter(|a| !a.loop_target)
            .is_some_and(|a| on_host(cx, file, a.fn_idx, a.value, a.at, depth + 1)),
        PyExpr::Call(c) => {
            let PyExpr::Attribute(attr) = &*c.func else {
                return false;
            };
            let args = &c.arguments;
            match attr.attr.as_str() {
                "cpu" | "numpy" => args.is_empty(),
                "to" => {
                    args.args.len() == 1
                        && cx.device_of(file, fn_idx, &args.args[0], offset) == Device::Cpu
                }
                "cuda" | "to_device" | "pin_memory" => false,
                // Any other method of a host tensor computes on the host (`host.float().max()`).
                _ => on_host(cx, file, fn_idx, &attr.value, offset, depth + 1),
            }
        }
        _ => false,
    }
}

/// PK101's Python form: `.item()`, `.cpu()`, `.numpy()`, `.tolist()`, `float(t)`/`int(t)`/`bool(t)`,
/// `print(t)` of a tensor, `t.to("cpu")` in a step loop.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    let names = [
        "item", "cpu", "numpy", "tolist", "to", "float", "int", "bool", "print",
    ];
    for (file, call) in cx.calls_named(&names) {
        // Outside step loops (after training, in evaluation) a readback is fine. Asked first: it
        // reads the facts only, while what the value is may follow bindings through the package.
        let Some(hit) = cx.step_hit(file, call) else {
            continue;
        };
        let Some(what) = python_readback(cx, file, call) else {
            continue;
        };
        // A program that never names an accelerator keeps its tensors on the CPU: nothing to
        // read back. Asked last: it reads the text of every file of the package (once).
        if cx.cpu_only_program() {
            return;
        }
        out.push(
            cx.finding(
                file,
                PyContext::callee_range(call),
                format!("`{what}` reads a tensor back to the host inside the step loop"),
                "keep the value on the device (accumulate `loss.detach()` in a tensor) and read it \
                 back after the loop or every N steps",
            )
            .in_py_step_loop(cx, &hit),
        );
    }
    check_python_formatting(cx, out);
    check_python_loggers(cx, out);
    check_python_truth_tests(cx, out);
}

/// A tensor tested for truth inside a step loop (`if torch.isnan(loss):`, `if loss > 10:`,
/// `while not converged.all():`, `assert torch.isfinite(loss)`): Python calls `bool()` on it,
/// which reads the tensor back, as `bool(t)` does.
fn check_python_truth_tests(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, unit) in cx.units.iter().enumerate() {
        for test in &unit.facts.tests {
            let Some(hit) =
                cx.step_hit_at(file, test.fn_idx, &test.loops, test.guard, test.in_test)
            else {
                continue;
            };
            if cx.bounded_in_step_loop(file, &test.loops, test.bounded) {
                continue;
            }
            let at = test.test.start().to_usize();
            let Some(tensor) = tensor_truth(cx, file, test.fn_idx, at, test.test) else {
                continue;
            };
            if cx.cpu_only_program() {
                return;
            }
            out.push(
                cx.finding(
                    file,
                    tensor.range(),
                    format!(
                        "`{}` tests a tensor's truth, which reads it back to the host inside the \
                         step loop",
                        test.statement
                    ),
                    "test it on the device and read the result back every N steps (or after the \
                     loop); `torch.nan_to_num`, `torch.where` or a flag tensor keep the step \
                     asynchronous",
                )
                .in_py_step_loop(cx, &hit),
            );
        }
    }
}

/// The tensor whose truth a test reads, if any: the test itself when it is one (a comparison
/// with a tensor, `loss > 10`, is one: see [`PyContext::value_kind`]), under `not` and in
/// `and`/`or` (each operand's truth is read). By binding, as for formatting (see
/// `check_python_formatting`).
fn tensor_truth<'e>(
    cx: &PyContext<'_>,
    file: usize,
    fn_idx: Option<usize>,
    at: usize,
    test: &'e PyExpr,
) -> Option<&'e PyExpr> {
    let is_tensor = |expr: &PyExpr| cx.value_kind_bound(file, fn_idx, expr, at).is_tensor();
    match test {
        PyExpr::UnaryOp(unary) if unary.op == ruff_python_ast::UnaryOp::Not => {
            tensor_truth(cx, file, fn_idx, at, &unary.operand)
        }
        PyExpr::BoolOp(bool_op) => bool_op
            .values
            .iter()
            .find_map(|value| tensor_truth(cx, file, fn_idx, at, value)),
        other => is_tensor(other).then_some(other),
    }
}

/// A tensor handed to a logger that reads it back to the host: TensorBoard's
/// `writer.add_scalar(tag, loss, step)` (it converts the value with `.cpu().numpy()`) and
/// `wandb.log({"loss": loss})` or `wandb.log(dict(loss=loss))` (it converts tensors to numbers). Lightning's `self.log(..)` keeps
/// the value on the device until the epoch ends: not reported.
fn check_python_loggers(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named(&["add_scalar", "log"]) {
        let args = &call.call.arguments;
        let values: Vec<&PyExpr> = match call.method {
            Some("add_scalar") => call
                .keyword("scalar_value")
                .or(args.args.get(1))
                .into_iter()
                .collect(),
            Some("log") if call.path.as_deref() == Some("wandb.log") => match args.args.first() {
                Some(PyExpr::Dict(dict)) => dict.items.iter().map(|item| &item.value).collect(),
                // `wandb.log(dict(loss=loss, lr=lr))`.
                Some(PyExpr::Call(built)) if matches!(&*built.func, PyExpr::Name(name) if name.id.as_str() == "dict") => {
                    built.arguments.keywords.iter().map(|k| &k.value).collect()
                }
                _ => Vec::new(),
            },
            _ => continue,
        };
        if values.is_empty() {
            continue;
        }
        let Some(hit) = cx.step_hit(file, call) else {
            continue;
        };
        // By binding, as for formatting: loggers are handed many numbers named like losses.
        let Some(tensor) = values.into_iter().find(|value| {
            cx.value_kind_bound(file, call.fn_idx, value, call.start)
                .is_tensor()
        }) else {
            continue;
        };
        if cx.cpu_only_program() {
            return;
        }
        let logger = call.display_name();
        out.push(
            cx.finding(
                file,
                tensor.range(),
                format!("`{logger}` reads this tensor back to the host inside the step loop"),
                "log a number read back every N steps (`loss.item()` under an `if step % N == \
                 0:`), and keep the value on the device until then",
            )
            .in_py_step_loop(cx, &hit),
        );
    }
}

/// Whether `print(..)` is given a tensor itself (`print(loss)`); what it formats first
/// (`print(f"{loss}")`, `print("%f" % loss)`) is the formatting check's.
fn prints_tensor(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> bool {
    call.call.arguments.args.iter().any(|arg| {
        !facts::is_formatting(arg)
            && cx
                .value_kind(file, call.fn_idx, arg, call.start)
                .is_tensor()
    })
}

/// A tensor formatted into text inside a step loop (`print(f"norm {norm:.4f}")`,
/// `log("%.3f" % loss)`, `"{}".format(loss)`): formatting calls `Tensor.__format__`, which reads
/// the value back (`.item()` for one element), as `print(t)` does.
fn check_python_formatting(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.formatting_calls() {
        let Some(hit) = cx.step_hit(file, call) else {
            continue;
        };
        // What a value is bound to, not what it is called: a number named `batch_loss` is
        // formatted in many a log line.
        let bound = |expr| cx.value_kind_bound(file, call.fn_idx, expr, call.start);
        let is_tensor = |expr| bound(expr).is_tensor();
        let args = &call.call.arguments;
        let passed = args
            .args
            .iter()
            .chain(args.keywords.iter().map(|k| &k.value));
        // `print(loss, f"{loss}")` is reported once, as `print(..)`.
        if call.func_name == Some("print") && prints_tensor(cx, file, call) {
            continue;
        }
        let values: Vec<&PyExpr> = if call.method == Some("format")
            && matches!(call.receiver, Some(PyExpr::StringLiteral(_)))
        {
            // `"{}".format(loss)`: every argument is formatted.
            passed.collect()
        } else {
            passed.flat_map(facts::formatted_values).collect()
        };
        let Some(tensor) = values.into_iter().find(|value| is_tensor(value)) else {
            continue;
        };
        if cx.cpu_only_program() {
            return;
        }
        let text = &cx.units[file].file.source[crate::python::byte_range(tensor)];
        // A long or multi-line expression is pointed at, not quoted.
        let shown = if text.len() <= 60 && !text.contains('\n') {
            format!("`{text}`")
        } else {
            "a tensor".to_string()
        };
        out.push(
            cx.finding(
                file,
                tensor.range(),
                format!(
                    "formatting {shown} into text reads a tensor back to the host inside the \
                     step loop"
                ),
                "format a number read back every N steps (or after the loop), and keep the \
                 value on the device until then",
            )
            .in_py_step_loop(cx, &hit),
        );
    }
}

/// Whether `recv` was accumulated into (`total += ..`) earlier in the call's function: a name
/// that starts as the number `0.` and has tensors added to it is a tensor by the time `.item()`
/// is called on it (a Python number has no `.item()`).
fn accumulated(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>, recv: &PyExpr) -> bool {
    let Some(name) = facts::dotted(recv) else {
        return false;
    };
    cx.units[file].facts.accumulates.iter().any(|a| {
        a.fn_idx == call.fn_idx
            && a.range.start().to_usize() < call.start
            && facts::dotted(a.target).as_deref() == Some(name.as_str())
    })
}

fn python_readback(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> Option<String> {
    let args = &call.call.arguments;
    let kind = |expr| cx.value_kind(file, call.fn_idx, expr, call.start);
    let is_tensor = |expr| kind(expr).is_tensor();
    if let (Some(method), Some(recv)) = (call.method, call.receiver) {
        // The method name first: it is in the facts, the receiver is in the syntax tree.
        if !matches!(method, "item" | "cpu" | "numpy" | "tolist" | "to") {
            return None;
        }
        // `t.cpu().numpy()` is one readback, reported at its first step; when nothing tells
        // what `t` is (a parameter, a loop variable), the chain itself does: only a tensor has
        // `.cpu()` then `.numpy()`, so the readback is reported at `.numpy()`.
        if let PyExpr::Call(inner) = recv
            && let PyExpr::Attribute(attr) = &*inner.func
            && (python_names::READBACK_METHODS.contains(&attr.attr.as_str())
                || attr.attr.as_str() == "to")
        {
            if method == "numpy"
                && args.is_empty()
                && attr.attr.as_str() == "cpu"
                && inner.arguments.is_empty()
                && !is_tensor(&attr.value)
            {
                return Some(".cpu().numpy()".into());
            }
            return None;
        }
        // A tensor copied to the host earlier (`x = out.to("cpu")`, then `x[i].tolist()`): the
        // readback was the copy, reported there.
        if on_host(cx, file, call.fn_idx, recv, call.start, 0) {
            return None;
        }
        return match method {
            "item"
                if args.is_empty()
                    && (kind(recv) != ValueKind::Host || accumulated(cx, file, call, recv)) =>
            {
                Some(".item()".into())
            }
            "cpu" | "numpy" | "tolist" if args.is_empty() && is_tensor(recv) => {
                Some(format!(".{method}()"))
            }
            "to" if args.args.len() == 1
                && cx.device_of(file, call.fn_idx, &args.args[0], call.start) == Device::Cpu
                && is_tensor(recv) =>
            {
                Some(".to(\"cpu\")".into())
            }
            _ => None,
        };
    }
    match call.func_name? {
        name @ ("float" | "int" | "bool") if args.args.len() == 1 && is_tensor(&args.args[0]) => {
            Some(format!("{name}(..)"))
        }
        "print" if prints_tensor(cx, file, call) => Some("print(..)".into()),
        _ => None,
    }
}
