//! PK201 `cpu-tensor-then-copy`: a tensor built on the CPU only to be copied to the accelerator.

use proc_macro2::{TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Expr, ExprCall, ExprMethodCall};

use crate::analysis::{
    CallFact, CallRef, CrateContext, DeviceKind, FileId, FnFact, Framework, path_text,
};
use crate::diagnostic::{Edit, Fix};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a tensor that is created on the CPU and then copied to an accelerator.
    ///
    /// Both forms are recognized: one chain (`Tensor::zeros(.., &Device::Cpu)?.to_device(&dev)?`,
    /// also through arithmetic: `(Tensor::rand(.., kind::FLOAT_CPU) * 2.0 - 1.0).to_device(d)`)
    /// and a binding whose only use is that copy. For raw cudarc code it flags a host buffer of one
    /// repeated value (`vec![0.0f32; n]`) that is uploaded with `clone_htod`/`memcpy_htod`.
    ///
    /// Recognized constructors are those that fill the tensor themselves, which on the device run
    /// as a kernel: `Tensor::zeros`, `ones`, `full`, `empty`, `rand`, `randn`, `random`, `randint`,
    /// `randperm`, `arange`, `linspace`, `eye`, ... (candle with a device argument, tch with
    /// `(Kind, Device::Cpu)` or `kind::FLOAT_CPU` options, burn on `Device::cpu()`/`flex()`); and the
    /// data constructors (`new`, `from_vec`, `from_slice`, `from_data`, ...) when the data is one
    /// repeated literal (`vec![0.0; n]`, tch's `Tensor::from(0.5)`), or in burn, whose CPU backend
    /// copies host data once more before the upload. The device is followed per value: a
    /// `let cpu = Device::Cpu;` binding or a parameter every caller passes the CPU counts. The copy
    /// is `to_device` (candle, burn, tch) or `to` (tch).
    ///
    /// Not flagged: data that has to come from the host (a data set read from disk, positions or
    /// masks computed in a loop: candle's CPU tensor takes the `Vec` and `to_device` copies it once,
    /// as building it on the device would; tch's `Tensor::from_slice`, which has no device
    /// argument), a CPU tensor that is also used on the CPU, a copy to a CPU device (also through a
    /// binding), and test code. A binding copied in another function is not followed.
    ///
    /// ## Why is this bad?
    /// The tensor is written twice: once into host memory, then again over PCIe into device memory,
    /// and the host allocation is thrown away. Constructors that take a device fill the memory where
    /// it will be used: `zeros`, `ones`, `full`, `rand` and `arange` run as a kernel on the GPU and
    /// copy nothing at all. It is the Rust form of PyTorch's "create tensors directly on the target
    /// device" advice (`torch.zeros(.., device=dev)` rather than `torch.zeros(..).cuda()`).
    ///
    /// For cudarc, copying `n` identical values moves `n * size_of::<T>()` bytes that a memset or a
    /// fill kernel would produce on the device.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let dev = Device::cuda_if_available(0)?;
    /// let h0 = Tensor::zeros((layers, batch, hidden), DType::BF16, &Device::Cpu)?.to_device(&dev)?;
    /// let grads = stream.clone_htod(&vec![0.0f32; n])?;
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let dev = Device::cuda_if_available(0)?;
    /// let h0 = Tensor::zeros((layers, batch, hidden), DType::BF16, &dev)?;
    /// let grads = stream.alloc_zeros::<f32>(n)?;
    /// ```
    ///
    /// `perfkit lint --fix` rewrites the chained form for candle, burn and tch: the constructor gets
    /// the target device and the copy goes.
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags a tensor constructor that fills the tensor itself
    /// (`torch.rand`, `torch.zeros`, `torch.full`, `torch.arange`, `torch.randperm`, ...) without
    /// `device=` whose result is copied with `.cuda()` / `.to(device)`: in the same expression (also
    /// through arithmetic), from a name bound to it, or returned by a helper. The chained form is
    /// fixed by `--fix`. `torch.tensor` and `torch.as_tensor` count only when their data is one
    /// repeated value (`torch.tensor(0.5)`, `torch.tensor([0.0] * n)`: a fill in disguise, for
    /// `torch.full` on the device); from other data they are not flagged, because PyTorch builds a
    /// tensor from Python data on the CPU and copies it even when given `device=`: host data is
    /// copied once either way.
    ///
    /// ```python
    /// noise = torch.rand(2, 2).cuda()
    /// ids = torch.arange(n).to(device)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// noise = torch.rand(2, 2, device="cuda")
    /// ids = torch.arange(n, device=device)
    /// ```
    pub CpuTensorThenCopy {
        code: "PK201",
        name: "cpu-tensor-then-copy",
        severity: Warning,
        fixable: true,
    }
}

impl Rule for CpuTensorThenCopy {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        for crate_file in cx.files() {
            let file = crate_file.id;
            let cudarc = cx.uses(file, Framework::Cudarc);
            // Functions worth walking for the binding form.
            let mut has_cpu_ctor = vec![false; crate_file.facts.fns.len()];
            let mut has_copy = vec![false; crate_file.facts.fns.len()];
            let mut has_htod_of_binding = vec![false; crate_file.facts.fns.len()];
            // The tensor forms need a copy to the device in the file; most files have none, and
            // skip building the index.
            let copies = crate_file
                .facts
                .calls
                .iter()
                .any(|c| matches!(c.call, CallRef::Method(m) if transfer_target(m).is_some()));
            let calls: CallsBySpan<'_, '_> = if copies {
                crate_file
                    .facts
                    .calls
                    .iter()
                    .map(|c| (c.call.name_span().byte_range().start, c))
                    .collect()
            } else {
                CallsBySpan::default()
            };
            for call in &crate_file.facts.calls {
                // Test code is skipped: it builds small CPU tensors on purpose.
                if call.in_test {
                    continue;
                }
                match call.call {
                    CallRef::Method(m) => {
                        if let Some(target) = transfer_target(m) {
                            if let Some(f) = call.fn_idx {
                                has_copy[f] = true;
                            }
                            chained_form(cx, file, &calls, call, m, target, out);
                        } else if cudarc && is_htod(m) {
                            match m.args.first().map(strip_ref) {
                                Some(Expr::Path(_)) => {
                                    if let Some(f) = call.fn_idx {
                                        has_htod_of_binding[f] = true;
                                    }
                                }
                                Some(arg) => inline_constant_upload(cx, file, m, arg, out),
                                None => {}
                            }
                        }
                    }
                    CallRef::Path(c, _) => {
                        if copies
                            && let Some(f) = call.fn_idx
                            && cpu_constructor_call(cx, file, &calls, c).is_some()
                        {
                            has_cpu_ctor[f] = true;
                        }
                    }
                }
            }
            for (idx, fn_fact) in crate_file.facts.fns.iter().enumerate() {
                let tensors = has_cpu_ctor[idx] && has_copy[idx];
                let buffers = has_htod_of_binding[idx];
                if fn_fact.is_test || !(tensors || buffers) {
                    continue;
                }
                binding_form(cx, file, &calls, fn_fact, tensors, buffers, out);
            }
        }
    }
}

/// Constructors (`Tensor::NAME(.., device)`, the device last) that fill the tensor themselves: on
/// the device they run as a kernel, or at least write device memory once.
const FILLING: &[&str] = &[
    "zeros",
    "ones",
    "full",
    "empty",
    "rand",
    "randn",
    "random",
    "randint",
    "randint_low",
    "randperm",
    "arange",
    "arange_step",
    "arange_start",
    "arange_start_step",
    "linspace",
    "logspace",
    "eye",
    "tril2",
    "triu2",
];

/// Constructors that copy host data (`Tensor::NAME(data, .., device)`). Built on the CPU and then
/// copied, host data costs one upload either way in candle (the CPU tensor takes the `Vec`); they
/// count only when the data is one repeated literal (a fill in disguise), or in burn, whose CPU
/// backend copies the data once more before the upload.
const FROM_DATA: &[&str] = &[
    "new",
    "from_vec",
    "from_slice",
    "from_iter",
    "from_data",
    "from_floats",
    "from_ints",
    "from_bool",
];

/// The calls of one file by the start of their name (the method, or the path's last segment), to
/// find a call's facts from its syntax without spanning whole expressions.
type CallsBySpan<'a, 'f> = std::collections::HashMap<usize, &'f CallFact<'a>>;

/// `x.to_device(target)` / `x.to(target)` with one argument: the target.
fn transfer_target(m: &ExprMethodCall) -> Option<&Expr> {
    if m.args.len() == 1 && (m.method == "to_device" || m.method == "to") {
        m.args.first()
    } else {
        None
    }
}

/// cudarc host-to-device copies: `clone_htod`, `memcpy_stod` (its former name), `memcpy_htod`
/// (into an existing buffer), and the pre-0.13 `htod_copy`/`htod_sync_copy`.
fn is_htod(m: &ExprMethodCall) -> bool {
    matches!(
        m.method.to_string().as_str(),
        "clone_htod" | "memcpy_stod" | "memcpy_htod" | "htod_copy" | "htod_sync_copy"
    )
}

/// Strips `&`, `&mut`, parentheses and invisible groups.
pub(super) fn strip_ref(expr: &Expr) -> &Expr {
    match expr {
        Expr::Reference(r) => strip_ref(&r.expr),
        Expr::Paren(p) => strip_ref(&p.expr),
        Expr::Group(g) => strip_ref(&g.expr),
        _ => expr,
    }
}

/// Strips error handling around a value: `?`, `.unwrap()`, `.expect(..)`, parentheses.
pub(crate) fn strip_result(expr: &Expr) -> &Expr {
    match expr {
        Expr::Try(t) => strip_result(&t.expr),
        Expr::Paren(p) => strip_result(&p.expr),
        Expr::Group(g) => strip_result(&g.expr),
        Expr::MethodCall(m)
            if (m.method == "unwrap" && m.args.is_empty())
                || (m.method == "expect" && m.args.len() == 1) =>
        {
            strip_result(&m.receiver)
        }
        _ => expr,
    }
}

/// Whether only `?`, `.unwrap()` and `.expect(..)` wrap the constructor call (no parentheses).
fn only_error_handling(expr: &Expr) -> bool {
    match expr {
        Expr::Call(_) => true,
        Expr::Try(t) => only_error_handling(&t.expr),
        Expr::MethodCall(m)
            if (m.method == "unwrap" && m.args.is_empty())
                || (m.method == "expect" && m.args.len() == 1) =>
        {
            only_error_handling(&m.receiver)
        }
        _ => false,
    }
}

/// A `Tensor::CONSTRUCTOR(.., cpu_device)` expression: the call, its path and the device argument.
fn cpu_constructor<'e>(
    cx: &CrateContext<'_>,
    file: FileId,
    calls: &CallsBySpan<'_, '_>,
    expr: &'e Expr,
) -> Option<(&'e ExprCall, &'e syn::Path, Option<&'e Expr>)> {
    let Expr::Call(call) = expr else {
        return None;
    };
    let (path, device) = cpu_constructor_call(cx, file, calls, call)?;
    Some((call, path, device))
}

/// A constructor call that builds a tensor on the CPU which could have been built on the device:
/// its path and device argument (None for tch's `Tensor::from(0.5)`, which has none).
fn cpu_constructor_call<'e>(
    cx: &CrateContext<'_>,
    file: FileId,
    calls: &CallsBySpan<'_, '_>,
    call: &'e ExprCall,
) -> Option<(&'e syn::Path, Option<&'e Expr>)> {
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let segs = &func.path.segments;
    let n = segs.len();
    if n < 2 || segs[n - 2].ident != "Tensor" {
        return None;
    }
    let name = segs[n - 1].ident.to_string();
    // tch `Tensor::from(0f32)`: a CPU scalar.
    if name == "from"
        && cx.uses(file, Framework::Tch)
        && call.args.len() == 1
        && is_literal(&call.args[0])
    {
        return Some((&func.path, None));
    }
    let filling = FILLING.contains(&name.as_str());
    let from_data = FROM_DATA.contains(&name.as_str());
    if !filling && !from_data {
        return None;
    }
    if from_data {
        let repeated = call.args.first().is_some_and(|data| {
            is_literal(strip_ref(data)) || constant_buffer(cx, file, data).is_some()
        });
        let burn = cx.uses(file, Framework::Burn) && name != "new";
        if !repeated && !burn {
            return None;
        }
    }
    // A constructor without a device argument (tch `from_slice`) cannot be told where to go.
    let device = call.args.last()?;
    let on_cpu = cx.device_of(device) == DeviceKind::Cpu
        || calls
            .get(&func.path.segments[n - 1].ident.span().byte_range().start)
            .is_some_and(|fact| cx.operand_device(file, fact) == DeviceKind::Cpu);
    on_cpu.then_some((&func.path, Some(device)))
}

/// A literal, possibly negated: `0.0`, `-1`, `1f32`.
fn is_literal(expr: &Expr) -> bool {
    match expr {
        Expr::Lit(_) => true,
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => is_literal(&u.expr),
        Expr::Paren(p) => is_literal(&p.expr),
        _ => false,
    }
}

/// The constructor a copied value comes from, through elementwise arithmetic and method chains:
/// `(Tensor::rand(.., kind::FLOAT_CPU) * 2.0 - 1.0).to_device(d)`.
fn origin_call(expr: &Expr) -> Option<&ExprCall> {
    match strip_result(expr) {
        Expr::Call(c) => Some(c),
        Expr::MethodCall(m) if transfer_target(m).is_none() => origin_call(&m.receiver),
        Expr::Binary(b) => origin_call(&b.left).or_else(|| origin_call(&b.right)),
        Expr::Paren(p) => origin_call(&p.expr),
        Expr::Unary(u) => origin_call(&u.expr),
        _ => None,
    }
}

/// `Tensor::zeros(.., &Device::Cpu)?.to_device(&dev)?` in one expression, also through arithmetic
/// (`(Tensor::rand(.., kind::FLOAT_CPU) * 2.0 - 1.0).to_device(d)`).
#[allow(clippy::too_many_arguments)]
fn chained_form(
    cx: &CrateContext<'_>,
    file: FileId,
    calls: &CallsBySpan<'_, '_>,
    copy: &CallFact<'_>,
    m: &ExprMethodCall,
    target: &Expr,
    out: &mut Vec<Finding>,
) {
    // A copy to the CPU is a readback or a no-op, not an upload.
    if cx.device_of(target) == DeviceKind::Cpu || cx.dest_device(file, copy) == DeviceKind::Cpu {
        return;
    }
    let Some(origin) = origin_call(&m.receiver) else {
        return;
    };
    let Some((path, device)) = cpu_constructor_call(cx, file, calls, origin) else {
        return;
    };
    let direct = matches!(strip_result(&m.receiver), Expr::Call(c) if std::ptr::eq(c, origin));
    let ctor_name = path_text(path);
    let target_text = cx.text(file, target.span()).trim().to_string();
    let (message, help) = if direct {
        (
            format!(
                "`{ctor_name}` builds the tensor on the CPU, then `{}` copies it to the device",
                m.method
            ),
            format!(
                "create it on the target device: pass `{target_text}` to `{ctor_name}` and drop \
                 `.{}(..)`",
                m.method
            ),
        )
    } else {
        (
            format!(
                "`{ctor_name}` builds the tensor on the CPU, computes on it there, then `{}` \
                 copies the result to the device",
                m.method
            ),
            format!(
                "create it on the target device (pass `{target_text}` to `{ctor_name}`) and do \
                 the arithmetic there"
            ),
        )
    };
    let mut finding = Finding::new(file, cx.region_of(path), message, help);
    if !direct {
        finding = finding.with_note(format!(
            "copied to the device at line {}",
            cx.region(m.method.span()).line
        ));
    }
    // Edits inside macro arguments are not applied: the macro's tokens are not this tree. Parentheses
    // between the constructor and the copy would be cut in half by the removal.
    if direct
        && !copy.in_macro
        && only_error_handling(&m.receiver)
        && let Some(device) = device
        && let Some(fix) = chained_fix(cx, file, m, origin, device, &target_text)
    {
        finding = finding.with_fix(fix);
    }
    out.push(finding);
}

/// The fix of the chained form: the constructor's device argument becomes the copy's target and the
/// text from the end of the constructor call to the end of the copy goes (`?.to_device(&dev)`,
/// `.unwrap().to(device)`). The value keeps its type: both sides are a `Result<Tensor>` (candle) or
/// a `Tensor` (tch, burn).
fn chained_fix(
    cx: &CrateContext<'_>,
    file: FileId,
    m: &ExprMethodCall,
    ctor: &ExprCall,
    device: &Expr,
    target_text: &str,
) -> Option<Fix> {
    let device_edit = match strip_ref(device) {
        // tch options tuple `(Kind::Float, Device::Cpu)`: replace the device element only.
        Expr::Tuple(t) if t.elems.len() == 2 && !matches!(device, Expr::Reference(_)) => {
            let elem = t.elems.iter().nth(1)?;
            let range = cx.byte_range(file, elem.span());
            Edit {
                start: range.start,
                end: range.end,
                replacement: target_text.to_string(),
            }
        }
        // tch `kind::FLOAT_CPU`: spell the options out.
        Expr::Path(p)
            if p.path.segments.len() >= 2
                && p.path.segments[p.path.segments.len() - 2].ident == "kind" =>
        {
            let last = p.path.segments.last()?.ident.to_string();
            let kind = match last.as_str() {
                "FLOAT_CPU" => "Float",
                "DOUBLE_CPU" => "Double",
                "INT64_CPU" => "Int64",
                _ => return None,
            };
            let range = cx.byte_range(file, device.span());
            Edit {
                start: range.start,
                end: range.end,
                replacement: format!("(tch::Kind::{kind}, {target_text})"),
            }
        }
        // tch options held in a binding or built elsewhere (`let opts = (Kind::Float, Device::Cpu)`):
        // the device cannot replace them (it would drop the kind), and the binding may have
        // other uses. The finding stands; the rewrite is left to the user.
        _ if cx.uses(file, Framework::Tch)
            && !matches!(strip_ref(device), Expr::Path(p) if p.path.segments.len() >= 2
                && p.path.segments[p.path.segments.len() - 2].ident == "Device") =>
        {
            return None;
        }
        // candle / burn: `&Device::Cpu` -> the same reference expression `to_device` was given.
        _ => {
            let range = cx.byte_range(file, device.span());
            Edit {
                start: range.start,
                end: range.end,
                replacement: target_text.to_string(),
            }
        }
    };
    let ctor_end = cx.byte_range(file, ctor.span()).end;
    let copy_end = cx.byte_range(file, m.span()).end;
    if copy_end <= ctor_end || device_edit.end > ctor_end {
        return None;
    }
    // A comment between the constructor and the copy would go with the copy.
    let removed = cx.file(file).source().get(ctor_end..copy_end)?;
    if removed.contains("//") || removed.contains("/*") {
        return None;
    }
    let removal = Edit {
        start: ctor_end,
        end: copy_end,
        replacement: String::new(),
    };
    Some(Fix {
        title: "create the tensor on the target device".to_string(),
        edits: vec![device_edit, removal],
        linted: None,
    })
}

/// `stream.clone_htod(&vec![0.0f32; n])` / `stream.clone_htod(&[1.0f32; 4096])`.
fn inline_constant_upload(
    cx: &CrateContext<'_>,
    file: FileId,
    m: &ExprMethodCall,
    arg: &Expr,
    out: &mut Vec<Finding>,
) {
    if let Some(constant) = constant_buffer(cx, file, arg) {
        out.push(constant_upload_finding(cx, file, m, &constant, None));
    }
}

/// A host buffer made of one repeated literal: its value and length text.
struct ConstantBuffer {
    zero: bool,
    /// The literal's type suffix (`f32` in `0.0f32`), empty when inferred.
    suffix: String,
    value: String,
    len: String,
}

/// `vec![C; n]` or `[C; N]` with a literal `C` (possibly negated).
fn constant_buffer(cx: &CrateContext<'_>, file: FileId, expr: &Expr) -> Option<ConstantBuffer> {
    let (value, len) = match strip_ref(expr) {
        Expr::Repeat(r) => ((*r.expr).clone(), (*r.len).clone()),
        Expr::Macro(m) if m.mac.path.is_ident("vec") => m
            .mac
            .parse_body_with(|input: syn::parse::ParseStream<'_>| {
                let value: Expr = input.parse()?;
                input.parse::<syn::Token![;]>()?;
                let len: Expr = input.parse()?;
                Ok((value, len))
            })
            .ok()?,
        _ => return None,
    };
    let lit = match &value {
        Expr::Lit(l) => &l.lit,
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => match &*u.expr {
            Expr::Lit(l) => &l.lit,
            _ => return None,
        },
        _ => return None,
    };
    let suffix = match lit {
        syn::Lit::Int(i) => i.suffix().to_string(),
        syn::Lit::Float(f) => f.suffix().to_string(),
        _ => String::new(),
    };
    let zero = match lit {
        syn::Lit::Int(i) => i.base10_digits().trim_start_matches('0').is_empty(),
        syn::Lit::Float(f) => f.base10_digits().parse::<f64>().ok()? == 0.0,
        _ => return None,
    };
    let value_text = cx.text(file, value.span()).trim().to_string();
    Some(ConstantBuffer {
        zero,
        suffix,
        value: value_text,
        len: cx.text(file, len.span()).trim().to_string(),
    })
}

fn constant_upload_finding(
    cx: &CrateContext<'_>,
    file: FileId,
    m: &ExprMethodCall,
    constant: &ConstantBuffer,
    defined_at: Option<usize>,
) -> Finding {
    let into_existing = m.method == "memcpy_htod";
    let (message, help) = if constant.zero {
        let help = if into_existing {
            "zero the destination on the device with `stream.memset_zeros(&mut dst)`".to_string()
        } else {
            let turbofish = if constant.suffix.is_empty() {
                String::new()
            } else {
                format!("::<{}>", constant.suffix)
            };
            format!(
                "allocate it zeroed on the device instead: `stream.alloc_zeros{turbofish}({})`",
                constant.len
            )
        };
        (
            format!(
                "`{}` copies a zero-filled host buffer to the device",
                m.method
            ),
            help,
        )
    } else {
        (
            format!(
                "`{}` copies a host buffer of one repeated value (`{}`) to the device",
                m.method, constant.value
            ),
            format!(
                "allocate the buffer on the device (`alloc_zeros`) and fill it there with a small \
                 kernel instead of copying `{}` identical values",
                constant.len
            ),
        )
    };
    let mut finding = Finding::new(file, cx.region(m.method.span()), message, help);
    if let Some(line) = defined_at {
        finding = finding.with_note(format!("the buffer is built on the host at line {line}"));
    }
    finding
}

/// Looks for `let NAME = <cpu constructor>;` / `let NAME = vec![C; n];` whose only uses in the rest
/// of the block are copies to the device.
fn binding_form(
    cx: &CrateContext<'_>,
    file: FileId,
    calls: &CallsBySpan<'_, '_>,
    fn_fact: &FnFact<'_>,
    tensors: bool,
    buffers: bool,
    out: &mut Vec<Finding>,
) {
    let mut walker = BlockWalker {
        cx,
        file,
        calls,
        tensors,
        buffers,
        out,
    };
    walker.visit_block(fn_fact.block);
}

struct BlockWalker<'c, 'a, 'o> {
    cx: &'c CrateContext<'a>,
    file: FileId,
    calls: &'c CallsBySpan<'a, 'c>,
    tensors: bool,
    buffers: bool,
    out: &'o mut Vec<Finding>,
}

impl<'ast> Visit<'ast> for BlockWalker<'_, '_, '_> {
    fn visit_block(&mut self, block: &'ast syn::Block) {
        for (i, stmt) in block.stmts.iter().enumerate() {
            let syn::Stmt::Local(local) = stmt else {
                continue;
            };
            let Some((name, is_mut)) = simple_binding(&local.pat) else {
                continue;
            };
            let Some(init) = &local.init else {
                continue;
            };
            // `let .. else` diverges on failure: keep it simple and skip it.
            if init.diverge.is_some() {
                continue;
            }
            let rest = &block.stmts[i + 1..];
            if self.tensors
                && !is_mut
                && let Some((_, path, _)) =
                    cpu_constructor(self.cx, self.file, self.calls, strip_result(&init.expr))
            {
                let scan = scan_uses(
                    self.cx,
                    Some((self.file, self.calls)),
                    &name,
                    rest,
                    UseKind::Tensor,
                );
                if scan.other == 0
                    && let Some(first) = scan.copies.first()
                {
                    let ctor_name = path_text(path);
                    self.out.push(
                        Finding::new(
                            self.file,
                            self.cx.region_of(path),
                            format!(
                                "`{ctor_name}` builds `{name}` on the CPU, and its only use is a \
                                 copy to the device"
                            ),
                            format!(
                                "create `{name}` on the target device: pass the device to \
                                 `{ctor_name}` and drop the `.{}(..)` copy",
                                first.method
                            ),
                        )
                        .with_note(format!("copied to the device at line {}", first.line)),
                    );
                }
            }
            if self.buffers
                && !is_mut
                && let Some(constant) = constant_buffer(self.cx, self.file, &init.expr)
            {
                let scan = scan_uses(self.cx, None, &name, rest, UseKind::Upload);
                if scan.other == 0 {
                    let defined_at = self.cx.region(local.let_token.span).line;
                    for copy in &scan.uploads {
                        self.out.push(constant_upload_finding(
                            self.cx,
                            self.file,
                            copy,
                            &constant,
                            Some(defined_at),
                        ));
                    }
                }
            }
        }
        visit::visit_block(self, block);
    }

    // Nested functions are functions of their own; they are walked when their turn comes.
    fn visit_item_fn(&mut self, _item: &'ast syn::ItemFn) {}
    fn visit_item_impl(&mut self, _item: &'ast syn::ItemImpl) {}
}

/// `let name` / `let mut name` / `let name: T`: the name and whether it is mutable.
fn simple_binding(pat: &syn::Pat) -> Option<(String, bool)> {
    match pat {
        syn::Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
            Some((p.ident.to_string(), p.mutability.is_some()))
        }
        syn::Pat::Type(t) => simple_binding(&t.pat),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum UseKind {
    /// `name.to_device(dev)` / `name.to(dev)` to a device that is not the CPU.
    Tensor,
    /// `stream.clone_htod(&name)` and the other host-to-device copies.
    Upload,
}

struct CopyUse {
    method: String,
    line: usize,
}

struct UseScan<'ast> {
    copies: Vec<CopyUse>,
    uploads: Vec<&'ast ExprMethodCall>,
    other: usize,
}

/// Counts the uses of `name` in `stmts`, up to the statement that binds the name again.
fn scan_uses<'a, 'c, 'ast>(
    cx: &'c CrateContext<'a>,
    target: Option<(FileId, &'c CallsBySpan<'a, 'c>)>,
    name: &str,
    stmts: &'ast [syn::Stmt],
    kind: UseKind,
) -> UseScan<'ast> {
    let mut scanner = UseScanner {
        cx,
        target,
        name,
        kind,
        scan: UseScan {
            copies: Vec::new(),
            uploads: Vec::new(),
            other: 0,
        },
    };
    for stmt in stmts {
        scanner.visit_stmt(stmt);
        if let syn::Stmt::Local(local) = stmt
            && binds_name(&local.pat, name)
        {
            break;
        }
    }
    scanner.scan
}

fn binds_name(pat: &syn::Pat, name: &str) -> bool {
    match pat {
        syn::Pat::Ident(p) => p.ident == name,
        syn::Pat::Type(t) => binds_name(&t.pat, name),
        syn::Pat::Tuple(t) => t.elems.iter().any(|p| binds_name(p, name)),
        _ => false,
    }
}

struct UseScanner<'c, 'a, 'n, 'ast> {
    cx: &'c CrateContext<'a>,
    /// The file's calls, to read a copy's destination device.
    target: Option<(FileId, &'c CallsBySpan<'a, 'c>)>,
    name: &'n str,
    kind: UseKind,
    scan: UseScan<'ast>,
}

impl UseScanner<'_, '_, '_, '_> {
    fn is_name(&self, expr: &Expr) -> bool {
        matches!(strip_ref(expr), Expr::Path(p) if p.qself.is_none() && p.path.is_ident(self.name))
    }
}

impl<'ast> Visit<'ast> for UseScanner<'_, '_, '_, 'ast> {
    fn visit_expr_method_call(&mut self, m: &'ast ExprMethodCall) {
        match self.kind {
            UseKind::Tensor => {
                if self.is_name(&m.receiver)
                    && let Some(target) = transfer_target(m)
                    && self.cx.device_of(target) != DeviceKind::Cpu
                    && !self.target.is_some_and(|(file, calls)| {
                        calls
                            .get(&m.method.span().byte_range().start)
                            .is_some_and(|c| self.cx.dest_device(file, c) == DeviceKind::Cpu)
                    })
                {
                    self.scan.copies.push(CopyUse {
                        method: m.method.to_string(),
                        line: self.cx.region(m.method.span()).line,
                    });
                    for arg in &m.args {
                        self.visit_expr(arg);
                    }
                    return;
                }
            }
            UseKind::Upload => {
                if is_htod(m) && m.args.first().is_some_and(|a| self.is_name(a)) {
                    self.scan.uploads.push(m);
                    self.visit_expr(&m.receiver);
                    for arg in m.args.iter().skip(1) {
                        self.visit_expr(arg);
                    }
                    return;
                }
            }
        }
        visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        if p.qself.is_none() && p.path.is_ident(self.name) {
            self.scan.other += 1;
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // Macro arguments are not parsed here: any mention of the name counts as another use.
        if tokens_mention(&mac.tokens, self.name) {
            self.scan.other += 1;
        }
    }
}

/// Whether macro tokens mention `name`: as an identifier, or inlined in a format string
/// (`"{name}"`, `"{name:?}"`).
fn tokens_mention(tokens: &TokenStream, name: &str) -> bool {
    tokens.clone().into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == name,
        TokenTree::Group(group) => tokens_mention(&group.stream(), name),
        TokenTree::Literal(lit) => {
            let text = lit.to_string();
            text.contains(&format!("{{{name}}}")) || text.contains(&format!("{{{name}:"))
        }
        TokenTree::Punct(_) => false,
    })
}

/// PK201's Python form: a tensor constructor without `device=` whose result is then copied with
/// `.cuda()` / `.to(device)`: in the same expression (also through arithmetic), from a name bound
/// to it earlier, or returned by a helper of the package.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    let mut seen = std::collections::HashSet::new();
    for (file, call) in cx.calls_named(&["cuda", "to", "type_as"]) {
        if call.in_test {
            continue;
        }
        // Where the copy goes is asked only of a copy of a CPU-built tensor: it may follow
        // bindings through the package, and most `.to(..)` calls copy something else.
        let target = || python_copy_target(cx, file, call);
        let Some(recv) = call.receiver else { continue };
        let copy = match call.method {
            Some("cuda") => ".cuda()".to_string(),
            Some("type_as") => ".type_as(..)".to_string(),
            _ => ".to(..)".to_string(),
        };
        // Same expression: `torch.rand(2, 2).cuda()`, `(torch.rand(2) * 2).to(dev)`,
        // `torch.zeros(n).long().cuda()`.
        if let Some(ctor) =
            python_cpu_constructor_in(recv).or_else(|| python_cast_of_cpu_constructor(recv))
        {
            let Some(target) = target() else { continue };
            if !seen.insert((file, ctor.start())) {
                continue;
            }
            let name = facts::dotted(&ctor.func).unwrap_or_default();
            let drop = format!("`{copy}`");
            let words = CopyWords {
                what: "the tensor",
                copy: &copy,
                where_: "",
                drop: &drop,
            };
            let (message, help) = python_advice(cx, file, ctor, &name, &words, &target);
            let mut finding = cx.finding(file, ctor.func.range(), message, help);
            // `.to(other)` and `.type_as(other)` take the other tensor's dtype too: `device=`
            // alone would not say the same.
            let moves_only = call.method == Some("cuda")
                || (call.method == Some("to")
                    && call
                        .call
                        .arguments
                        .args
                        .first()
                        .is_none_or(|arg| cx.file(file).text(arg.range()) == target.as_str()));
            if moves_only
                && matches!(recv, PyExpr::Call(c) if std::ptr::eq(c, ctor))
                && let Some(fix) = python_fix(cx, file, call, ctor, &target)
            {
                finding = finding.with_fix(fix);
            }
            out.push(finding);
            continue;
        }
        // A name bound to a CPU constructor earlier: `x = torch.zeros(3)` ... `x.to(dev)`, or
        // `x.long().to(dev)`.
        let recv = strip_casts(recv);
        if let PyExpr::Name(_) = recv
            && let Some(assign) = cx.binding(file, call.fn_idx, recv, call.start)
            && !assign.loop_target
            && let Some(ctor) = python_cpu_constructor_in(assign.value)
        {
            let Some(target) = target() else { continue };
            if !seen.insert((file, ctor.start())) {
                continue;
            }
            let name = facts::dotted(&ctor.func).unwrap_or_default();
            let var = facts::dotted(recv).unwrap_or_default();
            let line = cx.file(file).line_name(call.start);
            let (what, where_) = (format!("`{var}`"), format!(" on {line}"));
            let words = CopyWords {
                what: &what,
                copy: &copy,
                where_: &where_,
                drop: "the copy",
            };
            let (message, help) = python_advice(cx, file, ctor, &name, &words, &target);
            out.push(cx.finding(file, ctor.func.range(), message, help));
            continue;
        }
        // A helper of the package that returns a CPU tensor: `make_mask(n).cuda()`.
        if let PyExpr::Call(inner) = recv {
            let Some(helper) = cx.call_of(file, inner) else {
                continue;
            };
            for (g, gi) in cx.targets(file, helper) {
                let func = &cx.units[g].facts.fns[gi];
                let returns = func.returns();
                let returns_cpu = !returns.is_empty()
                    && returns
                        .iter()
                        .all(|r| python_cpu_constructor_in(r).is_some());
                if returns_cpu && target().is_none() {
                    break;
                }
                if returns_cpu && seen.insert((file, inner.start())) {
                    out.push(cx.finding(
                        file,
                        inner.func.range(),
                        format!(
                            "`{}` returns a tensor built on the CPU, then `{copy}` copies it to the device",
                            func.name
                        ),
                        format!("build it on the target device inside `{}` (pass `device=` to the constructor) and drop `{copy}`", func.name),
                    ));
                    break;
                }
            }
        }
    }
}

/// The device a `.cuda()` / `.to(device)` call copies to, as text for `device=`; `None` when the call
/// is not a copy to an accelerator.
fn python_copy_target(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> Option<String> {
    let args = &call.call.arguments;
    match call.method? {
        // `.cuda()`, `.cuda(non_blocking=True)`, `.cuda(0)`, `.cuda(device=rank)`.
        "cuda" => {
            if args.keywords.iter().any(|k| {
                k.arg
                    .as_ref()
                    .is_none_or(|a| !matches!(a.as_str(), "non_blocking" | "device"))
            }) || args.args.len() > 1
            {
                return None;
            }
            match args
                .args
                .first()
                .or_else(|| facts::keyword(call.call, "device"))
            {
                None => Some("\"cuda\"".to_string()),
                Some(device) => Some(cx.file(file).text(device.range()).to_string()),
            }
        }
        "to" => {
            let device = args
                .args
                .first()
                .or_else(|| facts::keyword(call.call, "device"))?;
            if cx.device_of(file, call.fn_idx, device, call.start) == Device::Accelerator {
                return Some(cx.file(file).text(device.range()).to_string());
            }
            // `.to(other)`: to another tensor's device (and dtype), read as `.to(other.device)`.
            if matches!(device, PyExpr::Name(_) | PyExpr::Attribute(_))
                && cx
                    .value_kind(file, call.fn_idx, device, call.start)
                    .is_tensor()
            {
                return tensor_device(cx, file, device);
            }
            None
        }
        // `.type_as(other)`: to another tensor's type, its device included.
        "type_as" => match args.args.first() {
            Some(other) if args.args.len() == 1 && args.keywords.is_empty() => {
                tensor_device(cx, file, other)
            }
            _ => None,
        },
        _ => None,
    }
}

/// `other.device, dtype=other.dtype` as text for `device=`: the device (and dtype) of a tensor
/// a copy goes to (`.to(other)`, `.type_as(other)`); `None` in a program that runs on the CPU
/// only.
fn tensor_device(cx: &PyContext<'_>, file: usize, other: &PyExpr) -> Option<String> {
    if cx.cpu_only_program() {
        return None;
    }
    let text = cx.file(file).text(other.range());
    let simple = matches!(other, PyExpr::Name(_) | PyExpr::Attribute(_));
    let text = if simple {
        text.to_string()
    } else {
        format!("({text})")
    };
    // The copy takes the other tensor's dtype too.
    Some(format!("{text}.device, dtype={text}.dtype"))
}

/// `x.long()`, `x.float().half()`: the value under dtype casts with no arguments.
fn strip_casts(mut expr: &PyExpr) -> &PyExpr {
    while let PyExpr::Call(cast) = expr
        && let PyExpr::Attribute(attr) = &*cast.func
        && is_cast_name(attr.attr.as_str())
        && cast.arguments.is_empty()
    {
        expr = &attr.value;
    }
    expr
}

fn is_cast_name(name: &str) -> bool {
    matches!(
        name,
        "long" | "int" | "float" | "double" | "half" | "bfloat16" | "bool" | "byte" | "short"
    )
}

/// Element-wise torch functions whose value lives where their tensor argument does
/// (`torch.exp(torch.arange(n) * -s)`).
fn is_elementwise_function(name: &str) -> bool {
    matches!(
        name,
        "exp"
            | "log"
            | "sin"
            | "cos"
            | "sqrt"
            | "rsqrt"
            | "abs"
            | "sigmoid"
            | "tanh"
            | "pow"
            | "clamp"
            | "outer"
            | "reciprocal"
    )
}

/// A CPU tensor constructor (no `device=`) in an expression, directly, through arithmetic or
/// through an element-wise torch function.
fn python_cpu_constructor_in(expr: &PyExpr) -> Option<&PyExprCall> {
    match expr {
        PyExpr::Call(call) => {
            let path = facts::dotted(&call.func)?;
            let name = path.strip_prefix("torch.")?;
            if is_elementwise_function(name) {
                return call
                    .arguments
                    .args
                    .first()
                    .and_then(python_cpu_constructor_in)
                    .filter(|_| !call.arguments.keywords.iter().any(|k| k.arg.is_none()));
            }
            if !python_names::CONSTRUCTORS.contains(&name) {
                return None;
            }
            // `torch.tensor(data)` builds on the CPU and copies even when given `device=`
            // (PyTorch fills a host tensor from the Python data, then moves it): host data has to
            // be copied once either way. Only one repeated value is a fill in disguise.
            if is_data_constructor(name)
                && python_data_arg(call).is_none_or(|data| repeated_literal(data).is_none())
            {
                return None;
            }
            let has_device = call
                .arguments
                .keywords
                .iter()
                .any(|k| k.arg.as_ref().is_none_or(|a| a.as_str() == "device"));
            (!has_device).then_some(call)
        }
        PyExpr::BinOp(bin) => {
            python_cpu_constructor_in(&bin.left).or_else(|| python_cpu_constructor_in(&bin.right))
        }
        _ => None,
    }
}

/// `torch.zeros(n).long()`: a dtype cast (no arguments) of a CPU constructor, which keeps the
/// tensor on the CPU.
fn python_cast_of_cpu_constructor(expr: &PyExpr) -> Option<&PyExprCall> {
    let PyExpr::Call(cast) = expr else {
        return None;
    };
    let PyExpr::Attribute(attr) = &*cast.func else {
        return None;
    };
    let is_cast = is_cast_name(attr.attr.as_str()) && cast.arguments.is_empty();
    if !is_cast {
        return None;
    }
    python_cpu_constructor_in(&attr.value).or_else(|| python_cast_of_cpu_constructor(&attr.value))
}

/// `torch.tensor` / `torch.as_tensor`: constructors from data rather than fills.
fn is_data_constructor(name: &str) -> bool {
    matches!(name, "tensor" | "as_tensor")
}

/// The data argument of `torch.tensor(data, ..)`.
fn python_data_arg(call: &PyExprCall) -> Option<&PyExpr> {
    call.arguments
        .args
        .first()
        .or_else(|| facts::keyword(call, "data"))
}

/// The one value a literal buffer repeats: a number or boolean literal (`0.5`, `-1`, `True`), a
/// list or tuple literal whose elements all repeat the same value (`[0.0, 0.0]`, `[[1] * 4] * 2`),
/// or such a list times a count (`[0] * n`).
fn repeated_literal(expr: &PyExpr) -> Option<&PyExpr> {
    use ruff_python_ast::comparable::ComparableExpr;
    match expr {
        PyExpr::NumberLiteral(_) | PyExpr::BooleanLiteral(_) => Some(expr),
        PyExpr::UnaryOp(u)
            if matches!(
                u.op,
                ruff_python_ast::UnaryOp::USub | ruff_python_ast::UnaryOp::UAdd
            ) && matches!(&*u.operand, PyExpr::NumberLiteral(_)) =>
        {
            Some(expr)
        }
        PyExpr::List(ruff_python_ast::ExprList { elts, .. })
        | PyExpr::Tuple(ruff_python_ast::ExprTuple { elts, .. }) => {
            let (first, rest) = elts.split_first()?;
            let value = repeated_literal(first)?;
            let key = ComparableExpr::from(value);
            rest.iter()
                .all(|e| repeated_literal(e).is_some_and(|v| ComparableExpr::from(v) == key))
                .then_some(value)
        }
        PyExpr::BinOp(bin) if bin.op == ruff_python_ast::Operator::Mult => {
            let list = |e: &PyExpr| matches!(e, PyExpr::List(_) | PyExpr::Tuple(_));
            if list(&bin.left) {
                repeated_literal(&bin.left)
            } else if list(&bin.right) {
                repeated_literal(&bin.right)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// How a PK201 finding of Python words the copy: the tensor built (`the tensor`, `` `x` ``), the
/// copy (`.cuda()`), where it is (` on line 12`, or nothing) and what to drop (`` `.cuda()` ``,
/// `the copy`).
struct CopyWords<'s> {
    what: &'s str,
    copy: &'s str,
    where_: &'s str,
    drop: &'s str,
}

/// The message and help of a constructor `name` (dotted) whose tensor is copied to `target`.
fn python_advice(
    cx: &PyContext<'_>,
    file: usize,
    ctor: &PyExprCall,
    name: &str,
    words: &CopyWords<'_>,
    target: &str,
) -> (String, String) {
    let CopyWords {
        what,
        copy,
        where_,
        drop,
    } = words;
    let short = name.strip_prefix("torch.").unwrap_or(name);
    if !is_data_constructor(short) {
        return (
            format!(
                "`{name}` builds {what} on the CPU, then `{copy}`{where_} copies it to the device"
            ),
            format!(
                "create it on the target device: pass `device={target}` to `{name}` and drop {drop}"
            ),
        );
    }
    let value = python_data_arg(ctor)
        .and_then(repeated_literal)
        .map(|v| cx.file(file).text(v.range()).to_string())
        .unwrap_or_default();
    (
        format!(
            "`{name}` builds {what} of one repeated value (`{value}`) on the CPU, then `{copy}`{where_} copies it to the device"
        ),
        format!(
            "fill it on the device: `torch.full(shape, {value}, device={target})` (or `torch.zeros`/`torch.ones`); `{name}(.., device=..)` would still build it on the CPU and copy it"
        ),
    )
}

/// The fix of the simple chained form: `torch.rand(2, 2).cuda()` -> `torch.rand(2, 2, device="cuda")`.
fn python_fix(
    cx: &PyContext<'_>,
    file: usize,
    copy: &PyCall<'_>,
    ctor: &PyExprCall,
    target: &str,
) -> Option<Fix> {
    let source = &cx.file(file).source;
    let ctor_end = ctor.end().to_usize();
    let copy_end = copy.call.end().to_usize();
    // Only `<ctor>.cuda()` / `<ctor>.to(dev)` with nothing else in between or in the call.
    let between = source.get(ctor_end..copy_end)?;
    let simple = between.starts_with('.')
        && (copy.call.arguments.keywords.is_empty() && copy.call.arguments.args.len() <= 1);
    if !simple {
        return None;
    }
    // `torch.tensor(0.5)` wants `torch.full` on the device, not `device=`: no rewrite.
    let name = facts::dotted(&ctor.func).unwrap_or_default();
    if name.strip_prefix("torch.").is_some_and(is_data_constructor) {
        return None;
    }
    // Arguments that tie the tensor to the host, or that `.cuda()` changes the meaning of: a CPU
    // `generator=`, an `out=` buffer, `pin_memory=`, and `requires_grad=` (the copy is not a leaf,
    // the tensor built on the device is). The finding stands; the rewrite is left to the user.
    let ties = ["generator", "out", "pin_memory", "requires_grad"];
    if ctor
        .arguments
        .keywords
        .iter()
        .any(|k| k.arg.as_ref().is_some_and(|a| ties.contains(&a.as_str())))
    {
        return None;
    }
    let args = &ctor.arguments;
    let last_end = args
        .args
        .iter()
        .map(|a| a.end())
        .chain(args.keywords.iter().map(|k| k.end()))
        .max();
    let close = args.end().to_usize().saturating_sub(1);
    let (at, insert) = match last_end {
        // `torch.zeros(n,)`: after the trailing comma.
        Some(end)
            if source
                .get(end.to_usize()..close)
                .is_some_and(|t| t.trim_start().starts_with(',')) =>
        {
            let comma = end.to_usize() + source[end.to_usize()..close].find(',')?;
            (comma + 1, format!(" device={target}"))
        }
        Some(end) => (end.to_usize(), format!(", device={target}")),
        None => (args.start().to_usize() + 1, format!("device={target}")),
    };
    Some(Fix {
        title: "create the tensor on the target device".to_string(),
        edits: vec![
            Edit {
                start: at,
                end: at,
                replacement: insert,
            },
            Edit {
                start: ctor_end,
                end: copy_end,
                replacement: String::new(),
            },
        ],
        linted: None,
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::{Diagnostic, LintOptions, lint};

    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/lint/pk201-cpu-tensor-then-copy")
    }

    /// Copies the fixture package into a fresh directory so the fixes can be applied there.
    fn copy_fixture() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("temp dir");
        let src = fixture_dir();
        std::fs::copy(src.join("Cargo.toml"), tmp.path().join("Cargo.toml"))
            .expect("copy manifest");
        std::fs::create_dir(tmp.path().join("src")).expect("src dir");
        for entry in std::fs::read_dir(src.join("src")).expect("fixture src") {
            let path = entry.expect("dir entry").path();
            let name = path.file_name().expect("file name");
            std::fs::copy(&path, tmp.path().join("src").join(name)).expect("copy source");
        }
        tmp
    }

    fn pk201(dir: &Path) -> Vec<Diagnostic> {
        let report = lint(&LintOptions::new([dir])).expect("lint runs");
        assert!(report.errors.is_empty(), "file errors: {:?}", report.errors);
        report
            .diagnostics
            .into_iter()
            .filter(|d| d.code == "PK201")
            .collect()
    }

    #[test]
    fn no_fix_drops_tch_options_held_in_a_binding_or_a_comment_inside_the_chain() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: &str| {
            let path = tmp.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "Cargo.toml",
            "[package]\nname = \"t\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ntch = \"0.22\"\ncandle-core = \"0.11\"\n",
        );
        write("src/lib.rs", "pub mod a;\npub mod b;\n");
        write(
            "src/a.rs",
            "use tch::{Device, Kind, Tensor};\npub fn f(dev: Device) -> Tensor {\n    let opts = (Kind::Float, Device::Cpu);\n    let a = Tensor::ones([2], opts).to_device(dev);\n    let b = Tensor::ones([2], (Kind::Float, Device::Cpu)).to_device(dev);\n    a + b\n}\n",
        );
        write(
            "src/b.rs",
            "use candle_core::{Device, Result, Tensor};\npub fn g(dev: &Device) -> Result<Tensor> {\n    let x = Tensor::randn(0f32, 1.0, 4, &Device::Cpu)?\n        // keep me\n        .to_device(dev)?;\n    let y = Tensor::randn(0f32, 1.0, 4, &Device::Cpu)?.to_device(dev)?;\n    x + y\n}\n",
        );
        let found: Vec<(String, usize, bool)> = pk201(tmp.path())
            .iter()
            .map(|d| {
                let name = d.path.file_name().unwrap().to_string_lossy().into_owned();
                (name, d.region.line, d.fix.is_some())
            })
            .collect();
        assert_eq!(
            found,
            [
                ("a.rs".to_string(), 4, false),
                ("a.rs".to_string(), 5, true),
                ("b.rs".to_string(), 3, false),
                ("b.rs".to_string(), 6, true),
            ]
        );
    }

    #[test]
    fn chained_fixes_parse_and_remove_the_findings() {
        let tmp = copy_fixture();
        let before = pk201(tmp.path());
        let fixable: Vec<&Diagnostic> = before.iter().filter(|d| d.fix.is_some()).collect();
        // The chained cases of the fixture: candle (3), burn (2) and tch (2).
        assert_eq!(fixable.len(), 7, "fixable findings: {fixable:#?}");
        let unfixable = before.len() - fixable.len();
        assert!(unfixable > 0, "the binding and cudarc forms carry no fix");

        let summary = crate::fix::apply_fixes(&before);
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!((summary.applied, summary.skipped), (7, 0), "{summary:?}");

        for name in ["candle.rs", "burn.rs", "tch.rs", "cudarc.rs"] {
            let text = std::fs::read_to_string(tmp.path().join("src").join(name)).expect("read");
            if let Err(err) = syn::parse_file(&text) {
                panic!("fixed {name} does not parse: {err}\n{text}");
            }
        }
        let candle = std::fs::read_to_string(tmp.path().join("src/candle.rs")).expect("read");
        assert!(candle.contains("Tensor::from_vec(vec![1f32; seq_len], seq_len, dev) // expect"));
        assert!(candle.contains("Tensor::arange(0u32, seq_len as u32, dev)?;"));
        assert!(candle.contains("Tensor::ones((1, d_model), DType::F32, dev).unwrap();"));
        let tch = std::fs::read_to_string(tmp.path().join("src/tch.rs")).expect("read");
        assert!(tch.contains("Tensor::zeros([LAYERS, batch, HIDDEN], (Kind::Float, device)) //"));
        assert!(tch.contains("Tensor::randn([batch, HIDDEN], (tch::Kind::Float, device)) //"));
        let burn = std::fs::read_to_string(tmp.path().join("src/burn.rs")).expect("read");
        assert!(burn.contains("Tensor::<1>::from_floats(counts, device) //"));

        let after = pk201(tmp.path());
        assert!(
            after.iter().all(|d| d.fix.is_none()),
            "chained findings remain after the fix: {after:#?}"
        );
        assert_eq!(
            after.len(),
            unfixable,
            "only the unfixable findings remain: {after:#?}"
        );
    }

    #[test]
    fn binding_with_other_uses_is_not_flagged() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let source = r#"
use candle_core::{DType, Device, Tensor};
fn f(dev: &Device) -> candle_core::Result<f32> {
    let w = Tensor::ones(2, DType::F32, &Device::Cpu)?;
    let on_dev = w.to_device(dev)?;
    let _ = on_dev;
    w.sum_all()?.to_scalar::<f32>()
}
fn g(dev: &Device) -> candle_core::Result<Tensor> {
    let w = Tensor::ones(2, DType::F32, &Device::Cpu)?;
    println!("{w}");
    w.to_device(dev)
}
fn h(dev: &Device) -> candle_core::Result<Tensor> {
    let w = Tensor::ones(2, DType::F32, &Device::Cpu)?;
    w.to_device(dev)
}
"#;
        std::fs::write(tmp.path().join("lib.rs"), source).expect("write");
        let found = pk201(tmp.path());
        let lines: Vec<usize> = found.iter().map(|d| d.region.line).collect();
        // Only `h`: in `f` the host tensor is summed on the host, in `g` it is printed.
        assert_eq!(lines, vec![15], "{found:#?}");
    }

    #[test]
    fn parenthesized_chain_is_reported_without_a_fix() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let source = r#"
use candle_core::{Device, Tensor};
fn f(dev: &Device) -> candle_core::Result<Tensor> {
    (Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu)?).to_device(dev)
}
"#;
        std::fs::write(tmp.path().join("lib.rs"), source).expect("write");
        let found = pk201(tmp.path());
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].fix.is_none(),
            "a fix would cut the parentheses in half"
        );
    }
}
