//! PK203 per-sample-upload.

use std::ops::Range;

use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::analysis::patterns::{
    binding_name, chain_has, is_inside_loop, is_tensor_fn, last_arg_device, root_name,
};
use crate::analysis::{CallFact, CrateContext, DeviceKind, FileId, Framework};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

/// Constructors that copy host data into a new tensor on the given device.
pub(crate) const UPLOAD_CONSTRUCTORS: &[&str] = &[
    "new",
    "from_vec",
    "from_slice",
    "from_iter",
    "from_data",
    "from_floats",
    "from_ints",
    "from_bool",
];

crate::declare_rule! {
    /// ## What it does
    /// Flags a tensor uploaded to the device once per sample inside a batching loop or iterator,
    /// when the per-sample tensors are then joined with `Tensor::cat` / `Tensor::stack`. With raw
    /// cudarc, the same pattern is a `clone_htod` per sample in code the step loop runs, whose
    /// buffers are then stacked into the batch buffer with `memcpy_dtod`.
    ///
    /// ## Why is this bad?
    /// Each upload is its own host-to-device copy (and allocation), so a batch of 64 samples costs
    /// 64 tiny transfers plus a concatenation kernel, where one transfer of the whole batch would do.
    /// Small copies are dominated by fixed latency: the batch takes many times longer to reach the
    /// GPU than its size warrants, and the data loader becomes the bottleneck.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let images: Vec<Tensor> = items
    ///     .iter()
    ///     .map(|item| Tensor::from_slice(&item.pixels, (28, 28), &device))
    ///     .collect::<Result<_>>()?;
    /// let batch = Tensor::stack(&images, 0)?;
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let pixels: Vec<f32> = items.iter().flat_map(|item| item.pixels.iter().copied()).collect();
    /// let batch = Tensor::from_vec(pixels, (items.len(), 28, 28), &device)?; // one upload
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags one `.to(device)` / `.cuda()` per sample before `torch.stack`
    /// / `torch.cat` (a comprehension inside the call, or a loop that appends to the list stacked
    /// later), in a collate function or anywhere else. Values computed from a parameter's
    /// gradient (`torch.norm(p.grad).to(device)`) are on the device already and are not flagged.
    ///
    /// ```python
    /// def collate(samples):
    ///     return torch.stack([s.to(device) for s in samples])
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// def collate(samples):
    ///     return torch.stack(samples)  # on the host; the loop copies the batch once
    ///
    /// batch = batch.to(device, non_blocking=True)
    /// ```
    pub PerSampleUpload {
        code: "PK203",
        name: "per-sample-upload",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for PerSampleUpload {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        mapped_converters(cx, out);
        for file in cx.files() {
            let facts = &file.facts;
            let cudarc = cx.uses(file.id, Framework::Cudarc);
            // What assembles a batch: `Tensor::cat`/`stack`, or (raw cudarc) a device-to-device
            // copy into the batch buffer.
            let joins: Vec<&CallFact<'_>> = facts
                .calls
                .iter()
                .filter(|c| {
                    !c.in_test
                        && (is_tensor_fn(c, &["cat", "stack", "concat"])
                            || is_batcher_join(c)
                            || (cudarc && is_device_copy(c)))
                })
                .collect();
            if joins.is_empty() {
                continue;
            }
            for call in &facts.calls {
                // Only uploads inside a loop of a function that also joins tensors.
                let (Some(f), Some(l)) = (call.fn_idx, call.loop_idx) else {
                    continue;
                };
                if call.in_test {
                    continue;
                }
                let raw = cudarc && is_raw_upload(call);
                if !raw && !is_upload(cx, file.id, call) {
                    continue;
                }
                // The join must be outside the per-sample loop (it assembles the batch afterwards)
                // and the uploaded value must flow into what it joins.
                let Some(join) = joins.iter().find(|j| {
                    j.fn_idx == Some(f)
                        && is_device_copy(j) == raw
                        && !is_inside_loop(&facts.loops, j, l)
                        && if raw {
                            flows_into_copy(cx, file.id, call, j)
                        } else {
                            flows_into_join(cx, file.id, call, j)
                        }
                }) else {
                    continue;
                };
                // Host tensors: nothing is uploaded.
                let on_cpu = if call.call.is_method() && !raw {
                    cx.destination_is_cpu(file.id, call)
                } else {
                    cx.is_statically_cpu(file.id, call)
                };
                if on_cpu {
                    continue;
                }
                let join_line = cx.region(join.call.name_span()).line;
                if raw {
                    // Raw buffers copied together once (weights at start-up, a data set packed
                    // before training) are not a batch: only code the step loop runs counts.
                    let Some(hit) = cx.step_loop(file.id, call) else {
                        continue;
                    };
                    out.push(
                        Finding::new(
                            file.id,
                            cx.region(call.call.name_span()),
                            format!(
                                "`{}` uploads one sample at a time before the batch is assembled \
                                 on the device",
                                call.name
                            ),
                            "copy the samples into one (pinned) host buffer and upload the whole \
                             batch with a single `memcpy_htod`",
                        )
                        .with_note(format!(
                            "the per-sample buffers are copied into the batch with `{}` at line \
                             {join_line}",
                            join.name
                        ))
                        .in_step_loop(cx, &hit),
                    );
                    continue;
                }
                // Per-sample uploads cost per step only where batches are made for training: a
                // batcher or collate function, or code a step loop runs. A model's forward pass
                // that uploads a fixed handful of tensors, or an inference example that embeds a
                // few sentences, is not a data pipeline.
                let hit = cx.step_loop(file.id, call);
                if hit.is_none() && !is_batcher_join(join) && !is_batching_fn(cx, file.id, call) {
                    continue;
                }
                let what = call.shown();
                let mut finding = Finding::new(
                    file.id,
                    cx.region(call.call.name_span()),
                    format!("`{what}` uploads one sample at a time before the batch is joined"),
                    "gather the samples into one host buffer and upload the whole batch with a \
                     single constructor call",
                )
                .with_note(format!(
                    "the per-sample tensors are joined with `Tensor::{}` at line {join_line}",
                    join.name
                ));
                if let Some(hit) = &hit {
                    finding = finding.in_step_loop(cx, hit);
                }
                out.push(finding);
            }
        }
    }
}

/// Per-sample uploads made by a converter function that a join maps over the samples:
/// `Tensor::cat(items.iter().map(to_tensor).collect(), 0)`, where `to_tensor` (or the function
/// passed for a converter parameter at the crate's call sites) returns a freshly uploaded tensor.
/// Reported at the upload, once.
fn mapped_converters(cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
    let mut reported: Vec<(FileId, usize)> = Vec::new();
    for file in cx.files() {
        for join in &file.facts.calls {
            if join.in_test || !is_tensor_fn(join, &["cat", "stack", "concat"]) {
                continue;
            }
            let Some(f) = join.fn_idx else { continue };
            // Once per step: the join's function trains (or is a batcher), or a caller does.
            let per_step = cx.step_loop(file.id, join).is_some()
                || cx.trains(file.id, f)
                || is_batching_fn(cx, file.id, join)
                || cx.call_sites(file.id, f).any(|(cf, ci)| {
                    cx.file(cf).facts.calls[ci]
                        .fn_idx
                        .is_some_and(|g| cx.trains(cf, g))
                });
            if !per_step {
                continue;
            }
            let Some(joined) = join.call.args().first() else {
                continue;
            };
            let fn_fact = &file.facts.fns[f];
            let mut finder = MappedFns { paths: Vec::new() };
            finder.visit_expr(joined);
            for path in finder.paths {
                let name = path
                    .segments
                    .last()
                    .map(|s| s.ident.to_string())
                    .unwrap_or_default();
                // A converter parameter: what the crate's callers pass for it.
                let param = (path.segments.len() == 1)
                    .then(|| {
                        fn_fact
                            .sig
                            .inputs
                            .iter()
                            .filter(|i| matches!(i, syn::FnArg::Typed(_)))
                            .position(|i| {
                                matches!(i, syn::FnArg::Typed(t) if binding_name(&t.pat).as_deref() == Some(name.as_str()))
                            })
                    })
                    .flatten();
                let mut converters: Vec<(FileId, usize)> = Vec::new();
                match param {
                    Some(p) => {
                        for (cf, ci) in cx.call_sites(file.id, f) {
                            let site = &cx.file(cf).facts.calls[ci];
                            let skip = usize::from(
                                !site.call.is_method() && fn_fact.sig.receiver().is_some(),
                            );
                            if let Some(syn::Expr::Path(arg)) =
                                site.call.args().iter().nth(p + skip)
                                && let Some(last) = arg.path.segments.last()
                            {
                                converters.extend(cx.free_fns_named(&last.ident.to_string()));
                            }
                        }
                    }
                    None => converters.extend(cx.free_fns_named(&name)),
                }
                for (cf, cfn) in converters {
                    let Some((uf, ui)) = returned_upload(cx, cf, cfn, 0) else {
                        continue;
                    };
                    if reported.contains(&(uf, ui)) {
                        continue;
                    }
                    reported.push((uf, ui));
                    let upload = &cx.file(uf).facts.calls[ui];
                    if cx.is_statically_cpu(uf, upload) {
                        continue;
                    }
                    let converter = cx.file(cf).facts.fns[cfn].name.to_string();
                    out.push(
                        Finding::new(
                            uf,
                            cx.region(upload.call.name_span()),
                            format!(
                                "`{}` uploads one sample at a time before the batch is joined",
                                upload.shown()
                            ),
                            "gather the samples into one host buffer and upload the whole batch \
                             with a single constructor call",
                        )
                        .with_note(format!(
                            "`{converter}` makes one tensor per sample for `Tensor::{}` at {}:{}",
                            join.name,
                            file.path().display(),
                            cx.region(join.call.name_span()).line
                        )),
                    );
                }
            }
        }
    }
}

/// The function paths mapped over in an expression: `f` in `.map(f)`, `.filter_map(f)`.
struct MappedFns<'ast> {
    paths: Vec<&'ast syn::Path>,
}

impl<'ast> Visit<'ast> for MappedFns<'ast> {
    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        if (m.method == "map" || m.method == "filter_map" || m.method == "flat_map")
            && let Some(syn::Expr::Path(p)) = m.args.first()
        {
            self.paths.push(&p.path);
        }
        syn::visit::visit_expr_method_call(self, m);
    }
}

/// The upload a function returns: its value is a per-call upload constructor (`Tensor::from_floats(
/// [x], &device)`), directly or through the crate functions it returns the value of.
fn returned_upload(
    cx: &CrateContext<'_>,
    file: FileId,
    fn_idx: usize,
    depth: usize,
) -> Option<(FileId, usize)> {
    if depth > 4 {
        return None;
    }
    let facts = &cx.file(file).facts;
    let block = facts.fns[fn_idx].block;
    let Some(syn::Stmt::Expr(tail, None)) = block.stmts.last() else {
        return None;
    };
    let name_at = match crate::rules::pk201::strip_result(tail) {
        syn::Expr::Call(c) => match &*c.func {
            syn::Expr::Path(p) => p.path.segments.last()?.ident.span().byte_range().start,
            _ => return None,
        },
        syn::Expr::MethodCall(m) => m.method.span().byte_range().start,
        _ => return None,
    };
    let (index, call) = facts
        .calls
        .iter()
        .enumerate()
        .find(|(_, c)| c.call.name_span().byte_range().start == name_at)?;
    if is_upload(cx, file, call) {
        return Some((file, index));
    }
    let mut targets: Vec<(FileId, usize)> = cx.targets(file, index).collect();
    // `state.to_tensor()` on a generic: any of the crate's methods of that name may be the one.
    if targets.is_empty() && call.call.is_method() {
        targets.extend(cx.methods_named(call.name).take(8));
    }
    targets
        .into_iter()
        .find_map(|(tf, tfn)| returned_upload(cx, tf, tfn, depth + 1))
}

/// candle-datasets' `Batcher::new(iter)` / `new_r1` / `new_r2`: stacks the iterator's items into
/// batches, so an iterator that uploads each item makes one upload per sample.
fn is_batcher_join(call: &CallFact<'_>) -> bool {
    !call.call.is_method()
        && matches!(call.name, "new" | "new_r1" | "new_r2")
        && call.call.qualifier().is_some_and(|q| q == "Batcher")
        && call.call.args().len() == 1
}

/// Whether a call sits in a function that makes batches: a `Batcher`/collate implementation
/// (burn `impl Batcher for .. { fn batch }`, a `collate` function).
fn is_batching_fn(cx: &CrateContext<'_>, file: FileId, call: &CallFact<'_>) -> bool {
    let Some(f) = cx.fn_of(file, call) else {
        return false;
    };
    let by_trait = f
        .trait_name
        .as_deref()
        .is_some_and(|t| t.contains("Batcher") || t.contains("Collate"));
    let name = f.name.to_string();
    by_trait || name.contains("collate") || name == "batch" || name.starts_with("make_batch")
}

/// A raw cudarc host-to-device copy into a new buffer: `stream.clone_htod(&host[..])`
/// (`htod_copy`/`htod_sync_copy` in older cudarc).
fn is_raw_upload(call: &CallFact<'_>) -> bool {
    call.call.is_method()
        && call.call.args().len() == 1
        && matches!(call.name, "clone_htod" | "htod_copy" | "htod_sync_copy")
}

/// A raw cudarc device-to-device copy `stream.memcpy_dtod(&src, &mut dst)` (`dtod_copy` in older
/// cudarc): how raw buffers are stacked into a batch buffer.
fn is_device_copy(call: &CallFact<'_>) -> bool {
    call.call.is_method()
        && call.call.args().len() == 2
        && matches!(call.name, "memcpy_dtod" | "dtod_copy")
}

/// Whether the buffer `upload` creates is the source of the device copy `copy`: the copy's source
/// is (an element of) a binding filled by the upload, directly (`&uploads[i]`) or through the
/// `for` pattern / closure parameter of a loop over that binding
/// (`for (i, x) in uploads.iter().enumerate() { stream.memcpy_dtod(x, ..) }`).
fn flows_into_copy(
    cx: &CrateContext<'_>,
    file: FileId,
    upload: &CallFact<'_>,
    copy: &CallFact<'_>,
) -> bool {
    let (Some(source), Some(f)) = (copy.call.args().first(), cx.fn_of(file, copy)) else {
        return false;
    };
    let Some(mut name) = root_name(source) else {
        return false;
    };
    let mut binder = Binder {
        at: copy.call.name_span().byte_range().start,
        name: &name,
        collection: None,
    };
    binder.visit_block(f.block);
    if let Some(collection) = binder.collection {
        name = collection;
    }
    let at = upload.call.name_span().byte_range().start;
    let mut feeds = Feeds {
        name: &name,
        ranges: Vec::new(),
    };
    feeds.visit_block(f.block);
    feeds.ranges.iter().any(|range| range.contains(&at))
}

/// Finds the innermost loop around byte offset `at` whose `for` pattern or closure parameter binds
/// `name`, and records the root binding of what that loop iterates.
struct Binder<'n> {
    at: usize,
    name: &'n str,
    collection: Option<String>,
}

impl<'ast> Visit<'ast> for Binder<'_> {
    fn visit_expr_for_loop(&mut self, l: &'ast syn::ExprForLoop) {
        if l.body.span().byte_range().contains(&self.at) && pat_binds(&l.pat, self.name) {
            self.collection = root_name(&l.expr);
        }
        syn::visit::visit_expr_for_loop(self, l);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        for arg in &call.args {
            if let syn::Expr::Closure(c) = arg
                && c.body.span().byte_range().contains(&self.at)
                && c.inputs.iter().any(|p| pat_binds(p, self.name))
            {
                self.collection = root_name(&call.receiver);
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }
}

/// Whether a pattern binds `name` anywhere (`x`, `(i, x)`, `&(x, y)`, `Sample { x, .. }`).
fn pat_binds(pat: &syn::Pat, name: &str) -> bool {
    match pat {
        syn::Pat::Ident(p) => p.ident == name,
        syn::Pat::Type(t) => pat_binds(&t.pat, name),
        syn::Pat::Reference(r) => pat_binds(&r.pat, name),
        syn::Pat::Paren(p) => pat_binds(&p.pat, name),
        syn::Pat::Tuple(t) => t.elems.iter().any(|p| pat_binds(p, name)),
        syn::Pat::TupleStruct(t) => t.elems.iter().any(|p| pat_binds(p, name)),
        syn::Pat::Slice(s) => s.elems.iter().any(|p| pat_binds(p, name)),
        syn::Pat::Struct(s) => s.fields.iter().any(|f| pat_binds(&f.pat, name)),
        _ => false,
    }
}

/// A host-to-device upload: a data constructor on a non-CPU device (candle, burn), or a tch
/// `Tensor::from_slice(..).to_device(d)` chain.
pub(crate) fn is_upload(cx: &CrateContext<'_>, file: FileId, call: &CallFact<'_>) -> bool {
    if call.call.is_method() {
        // tch: `Tensor::from_slice(&v).to_device(device)` / `.to(device)`.
        let is_transfer = call.is("to_device") || call.is("to");
        return is_transfer
            && cx.uses(file, Framework::Tch)
            && call.call.args().len() == 1
            && cx.device_of(&call.call.args()[0]) != DeviceKind::Cpu
            && call
                .call
                .receiver()
                .is_some_and(|r| chain_has(r, &["from_slice", "of_slice", "from_slice2"]))
            && !call
                .call
                .receiver()
                .is_some_and(|r| chain_has(r, &["pin_memory"]));
    }
    let framework = cx.uses(file, Framework::Candle) || cx.uses(file, Framework::Burn);
    framework
        && is_tensor_fn(call, UPLOAD_CONSTRUCTORS)
        && call.call.args().len() >= 2
        && last_arg_device(&call.call) != DeviceKind::Cpu
}

/// Whether the value of `upload` ends up in the tensors `join` joins: it sits in the join's own
/// argument, in the initializer of the binding the join reads (`let images = items.iter().map(..)
/// .collect();`), or in a `push`/`extend` onto that binding.
fn flows_into_join(
    cx: &CrateContext<'_>,
    file: FileId,
    upload: &CallFact<'_>,
    join: &CallFact<'_>,
) -> bool {
    let at = upload.call.name_span().byte_range().start;
    let Some(joined) = join.call.args().first() else {
        return false;
    };
    if joined.span().byte_range().contains(&at) {
        return true;
    }
    let (Some(name), Some(f)) = (root_name(joined), cx.fn_of(file, join)) else {
        return false;
    };
    feeds_into(f.block, &name, at)
}

/// Whether the code at byte offset `at` computes a value that flows into the binding `name` of
/// `block`: through its initializer, `push`/`extend` calls on it, and the bindings those mention
/// (`let t = Tensor::from_floats(..); items.push(t.unsqueeze(0));`).
fn feeds_into(block: &syn::Block, name: &str, at: usize) -> bool {
    let mut names = vec![name.to_string()];
    let mut seen = 0;
    // Each round follows one more binding back; bounded by the bindings of the function.
    while seen < names.len() && names.len() < 64 {
        let current = names[seen].clone();
        seen += 1;
        let mut feeds = Feeds {
            name: &current,
            ranges: Vec::new(),
        };
        feeds.visit_block(block);
        if feeds.ranges.iter().any(|range| range.contains(&at)) {
            return true;
        }
        let mut mentioned = Mentions {
            ranges: &feeds.ranges,
            names: Vec::new(),
        };
        mentioned.visit_block(block);
        for n in mentioned.names {
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    false
}

/// The single-segment paths (locals) mentioned inside some byte ranges.
struct Mentions<'r> {
    ranges: &'r [Range<usize>],
    names: Vec<String>,
}

impl<'ast> Visit<'ast> for Mentions<'_> {
    fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
        let at = p.span().byte_range().start;
        if p.path.segments.len() == 1 && self.ranges.iter().any(|r| r.contains(&at)) {
            self.names.push(p.path.segments[0].ident.to_string());
        }
    }
}

/// Collects the source ranges whose values flow into the binding `name`.
struct Feeds<'n> {
    name: &'n str,
    ranges: Vec<Range<usize>>,
}

impl<'ast> Visit<'ast> for Feeds<'_> {
    fn visit_local(&mut self, local: &'ast syn::Local) {
        if binding_name(&local.pat).is_some_and(|n| n == self.name)
            && let Some(init) = &local.init
        {
            self.ranges.push(init.expr.span().byte_range());
        }
        syn::visit::visit_local(self, local);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let grows = ["push", "extend", "push_back", "insert", "append"]
            .iter()
            .any(|m| call.method == m);
        if grows && root_name(&call.receiver).is_some_and(|n| n == self.name) {
            for arg in &call.args {
                self.ranges.push(arg.span().byte_range());
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }
}

/// PK203's Python form: one `.to(device)` / `.cuda()` per sample before `torch.stack` /
/// `torch.cat` (a comprehension inside the call, or a loop that appends to the list stacked
/// later), in a collate function or anywhere else.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named(&["stack", "cat", "concat", "concatenate"]) {
        if call.in_test {
            continue;
        }
        let Some(stack @ ("torch.stack" | "torch.cat" | "torch.concat" | "torch.concatenate")) =
            call.path.as_deref()
        else {
            continue;
        };
        let Some(first) = call.call.arguments.args.first() else {
            continue;
        };
        let element = match first {
            PyExpr::ListComp(c) => Some(&c.elt),
            PyExpr::Generator(g) => Some(&g.elt),
            _ => None,
        };
        if let Some(element) = element {
            if let Some(upload) = upload_in(cx, file, call, element) {
                out.push(finding(cx, file, upload, stack));
            }
            continue;
        }
        // `for s in samples: xs.append(s.to(dev))` ... `torch.stack(xs)`.
        let Some(list) = facts::dotted(first) else {
            continue;
        };
        for append in &cx.units[file].facts.calls {
            if append.fn_idx != call.fn_idx
                || append.start > call.start
                || append.loops.is_empty()
                || append.method != Some("append")
                || append.receiver.and_then(facts::dotted).as_deref() != Some(list.as_str())
            {
                continue;
            }
            let Some(value) = append.call.arguments.args.first() else {
                continue;
            };
            if let Some(upload) = upload_in(cx, file, append, value) {
                out.push(finding(cx, file, upload, stack));
            }
        }
    }
}

fn finding(cx: &PyContext<'_>, file: usize, upload: &PyExprCall, stack: &str) -> Finding {
    let range = match &*upload.func {
        PyExpr::Attribute(attr) => attr.attr.range(),
        other => other.range(),
    };
    cx.finding(
        file,
        range,
        format!("each sample is copied to the device on its own before `{stack}`"),
        format!("`{stack}` the samples on the host first, then copy the batch once (`.to(device, non_blocking=True)` from pinned memory)"),
    )
}

/// A `.to(device)` / `.cuda()` call in `expr` (the element of a per-sample expression).
/// Whether a value is a parameter's gradient or computed from one (`p.grad`,
/// `torch.norm(p.grad)`, `p.grad.detach().abs()`).
fn from_gradient(expr: &PyExpr) -> bool {
    match expr {
        PyExpr::Attribute(attr) => attr.attr.as_str() == "grad" || from_gradient(&attr.value),
        PyExpr::Call(call) => {
            from_gradient(&call.func) || call.arguments.args.first().is_some_and(from_gradient)
        }
        PyExpr::Subscript(s) => from_gradient(&s.value),
        _ => false,
    }
}

fn upload_in<'e>(
    cx: &PyContext<'_>,
    file: usize,
    at: &PyCall<'_>,
    expr: &'e PyExpr,
) -> Option<&'e PyExprCall> {
    let PyExpr::Call(call) = expr else {
        return None;
    };
    if let PyExpr::Attribute(attr) = &*call.func {
        // A gradient lives where its parameter lives: moving a value computed from one copies
        // nothing from the host.
        if matches!(attr.attr.as_str(), "cuda" | "to") && from_gradient(&attr.value) {
            return None;
        }
        match attr.attr.as_str() {
            "cuda" => return Some(call),
            "to" => {
                let device = call
                    .arguments
                    .args
                    .first()
                    .or_else(|| python_keyword(call, "device"))?;
                if cx.device_of(file, at.fn_idx, device, at.start) == Device::Accelerator {
                    return Some(call);
                }
                return None;
            }
            _ => return upload_in(cx, file, at, &attr.value),
        }
    }
    None
}
