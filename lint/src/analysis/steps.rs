//! Crate-wide step-loop analysis over the collected facts.
//!
//! A step loop is a `for`/`while`/`loop` or iterator closure whose body, directly or through functions
//! of the same crate it calls (resolved by name, transitively), contains a step marker. The innermost
//! step loop runs per batch; an enclosing one runs per epoch. Functions called from a step loop are
//! "reached" from it; code in them is reported at its own line with a note naming the loop.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Component, Path};

use syn::spanned::Spanned;

use super::DeviceKind;
use super::values::{Dev, DevSym, is_optimizer_type};
use super::{
    CallFact, CrateContext, CrateFile, FileId, SetterRoot, StepHit, TypeHint, region_of,
    with_ident_str,
};

/// A function of the crate: (file, index in that file's facts).
type GlobalFn = (usize, usize);

/// Functions by name.
type FnIndex<'n> = HashMap<&'n str, Vec<GlobalFn>, BuildHasherDefault<NameHasher>>;

/// How a function is reached from a step loop.
#[derive(Debug, Clone)]
struct Reach {
    /// The step loop: (file, loop index).
    origin: (usize, usize),
    /// True when every call on the way runs on every step of the origin loop (no `% N == 0` guard).
    unguarded: bool,
    /// The kind of the first guard on the way, when there is one.
    guard_kind: super::GuardKind,
    /// The function that called this one (None: called directly from the loop's function).
    caller: Option<GlobalFn>,
}

/// The result of the analysis for one crate.
#[derive(Debug, Default)]
pub(crate) struct CrateAnalysis {
    /// Per file, per loop: is it a step loop.
    step_loop: Vec<Vec<bool>>,
    /// Per file, per loop: does it enclose another step loop (so it is an outer, per-epoch loop).
    outer: Vec<Vec<bool>>,
    /// Per file, per function: how it is reached from a step loop.
    reach: Vec<Vec<Option<Reach>>>,
    /// Device evidence over the whole crate.
    crate_device: super::DeviceEvidence,
    /// Per function of the crate (global index): test code, including functions called only
    /// from test code.
    test_fn: Vec<bool>,
    /// Per file: the index of its build target in `target_device`.
    file_target: Vec<usize>,
    /// Per build target: device evidence of its files outside test code.
    target_device: Vec<super::DeviceEvidence>,
    /// The crate functions each call reaches: (file, call) -> (file, function).
    resolved_calls: CallMap,
    /// Per function (global index): the calls that reach it, as (file, call).
    call_sites: Vec<Vec<(usize, usize)>>,
    /// Free functions by name.
    free_fns: HashMap<String, Vec<GlobalFn>>,
    /// Methods by name.
    methods_by_name: HashMap<String, Vec<GlobalFn>>,
    /// Per function (global index): it makes a training step (a step marker in it or in what it
    /// calls).
    trains: Vec<bool>,
    /// The table slots of parameters, fields and return values.
    slots: SlotIndex,
    /// Per slot: the device settled across the crate.
    seen: Vec<Seen>,
    /// What each call returns, worked out as rules ask: per call of the crate (`call_base`).
    memo: std::cell::RefCell<Vec<Memo>>,
    /// Per file: the index of its first call in `memo`.
    call_base: Vec<usize>,
    /// Per file: the global index of its first function.
    fn_offsets: Vec<usize>,
    /// Calls into output helpers ([`is_output_helper`]): (file, call index) -> the helpers.
    helper_calls: CallMap,
}

/// The built-in step markers and those the configuration adds.
pub(crate) struct Markers<'c> {
    extra: &'c [String],
}

impl Markers<'_> {
    /// `loss.backward()`, `opt.backward_step(&loss)`, `opt.zero_grad()`, an optimizer's
    /// `step`/`update`, or a configured name. `recv` is the receiver's type as the crate declares
    /// it: an RNN cell's, a sampler's or an environment's `step` is not an optimizer step, nor is a
    /// metric's `update`.
    fn is_marker(&self, call: &CallFact<'_>, recv: Option<&str>) -> bool {
        let method = call.call.is_method();
        let nargs = call.call.args().len();
        match call.name {
            // `loss.backward()`, or a hand-written backward pass (`self.backward(&x, &y)`).
            "backward" => true,
            // tch also has `backward_step_clip(&loss, max)` and `backward_step_clip_norm(..)`.
            "backward_step" | "backward_step_clip" | "backward_step_clip_norm" => {
                method && nargs >= 1
            }
            "zero_grad" | "zero_grad_set_to_none" => method && recv.is_none_or(is_optimizer_type),
            // The receiver's type names an optimizer, or the receiver is named like one
            // (`opt`, `self.optimizer`); `lstm.step`, `env.step`, `scheduler.step` and
            // `metric.update` are neither.
            "step" | "update" => {
                method
                    && (recv.is_some_and(is_optimizer_type)
                        || call.call.receiver().is_some_and(is_optimizer_like))
            }
            name => self.extra.iter().any(|m| m == name),
        }
    }
}

/// Struct fields of the crate: struct name -> field -> type name.
type FieldTable<'n> = HashMap<&'n str, HashMap<&'n str, &'n str, FastNames>, FastNames>;
/// Calls by (file, call index), looked up once per call and per round of the device fixed point.
type CallMap = HashMap<(usize, usize), Vec<GlobalFn>, FastNames>;

/// The type name a hint stands for, with fields looked up in the crate's structs.
fn resolve<'n>(hint: TypeHint<'n>, fields: &FieldTable<'n>) -> Option<&'n str> {
    match hint {
        TypeHint::Unknown => None,
        TypeHint::Named(name) => Some(name),
        TypeHint::Field(owner, field) => fields.get(owner)?.get(field).copied(),
    }
}

/// Conversion and output helpers: `impl From/TryFrom/Display/Debug/Serialize`, and functions named
/// for writing something out (`save`, `write_*`, `dump`, `print_*`, `log_*`, `plot`). Reading a tensor
/// back is what they are for; a step loop that calls one is reported at the call (see
/// [`CrateContext::helper_readbacks`]), never inside the helper.
pub(crate) fn is_output_helper(f: &super::FnFact<'_>) -> bool {
    if f.trait_name.as_deref().is_some_and(|t| {
        matches!(
            t,
            "From" | "TryFrom" | "Into" | "TryInto" | "Display" | "Debug" | "Serialize" | "Write"
        )
    }) {
        return true;
    }
    with_ident_str(f.name, |name| {
        [
            "save", "write", "dump", "export", "print", "display", "plot", "render", "log_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || name == "log"
            // Conversions out of a tensor: `tensor_to_mask`, `rgb_to_image`, `logits_to_png`.
            || [
                "to_png", "to_image", "to_img", "to_mask", "to_jpeg", "to_jpg", "to_string",
                "to_text", "to_json", "to_csv",
            ]
            .iter()
            .any(|p| name.ends_with(p))
    })
}

/// Whether an expression names an optimizer: `opt`, `self.optimizer`, `adam`, `sgd`, `optim`.
pub(crate) fn is_optimizer_like(expr: &syn::Expr) -> bool {
    let ident = match expr {
        syn::Expr::Path(p) => p.path.segments.last().map(|s| &s.ident),
        syn::Expr::Field(f) => match &f.member {
            syn::Member::Named(ident) => Some(ident),
            syn::Member::Unnamed(_) => None,
        },
        syn::Expr::Reference(r) => return is_optimizer_like(&r.expr),
        syn::Expr::Paren(p) => return is_optimizer_like(&p.expr),
        syn::Expr::MethodCall(m) => return is_optimizer_like(&m.receiver),
        _ => None,
    };
    ident.is_some_and(|ident| {
        with_ident_str(ident, |name| {
            let lower = name.to_ascii_lowercase();
            ["opt", "sgd", "adam", "rmsprop", "lamb", "lion"]
                .iter()
                .any(|word| lower.contains(word))
        })
    })
}

impl CrateAnalysis {
    /// Runs the analysis over the files of one crate.
    pub(crate) fn build(
        root: &Path,
        files: &[CrateFile<'_>],
        extra_markers: &[String],
        framework_package: bool,
        external: &ExternalFacts,
    ) -> CrateAnalysis {
        let markers = Markers {
            extra: extra_markers,
        };
        // Functions by the shape of call that reaches them (see `resolves_to`): methods by name,
        // free functions by name, associated functions by impl type and name.
        let mut methods: FnIndex<'_> = HashMap::default();
        let mut free: FnIndex<'_> = HashMap::default();
        let mut assoc: HashMap<&str, FnIndex<'_>, BuildHasherDefault<NameHasher>> =
            HashMap::default();
        // Each function's name as text, interned in its file's name arena like the called names.
        let fn_names: Vec<Vec<&str>> = files
            .iter()
            .map(|file| {
                file.facts
                    .fns
                    .iter()
                    .map(|f| ident_text(f.name, &file.file.names))
                    .collect()
            })
            .collect();
        for (fi, file) in files.iter().enumerate() {
            for (idx, f) in file.facts.fns.iter().enumerate() {
                if f.is_test {
                    continue;
                }
                let name = fn_names[fi][idx];
                if f.sig.receiver().is_some() {
                    methods.entry(name).or_default().push((fi, idx));
                }
                match f.self_ty.as_deref() {
                    Some(ty) => assoc
                        .entry(ty)
                        .or_default()
                        .entry(name)
                        .or_default()
                        .push((fi, idx)),
                    None => free.entry(name).or_default().push((fi, idx)),
                }
            }
        }
        let offsets = offsets_of(files);
        let total_fns: usize = files.iter().map(|f| f.facts.fns.len()).sum();
        let global = |g: GlobalFn| offsets[g.0] + g.1;

        // Struct fields, for `self.optim.step(..)` and `self.metric.update(..)`.
        let mut fields: FieldTable<'_> = HashMap::default();
        for file in files {
            for st in &file.facts.structs {
                let entry = fields.entry(st.name).or_default();
                for &(field, ty) in &st.fields {
                    entry.insert(field, ty);
                }
            }
        }
        let mut method_owner: HashMap<&str, Option<&str>> = HashMap::new();
        let mut ambiguous = std::collections::HashSet::new();
        for (fi, file) in files.iter().enumerate() {
            for (idx, f) in file.facts.fns.iter().enumerate() {
                if f.is_test || f.sig.receiver().is_none() {
                    continue;
                }
                let name = fn_names[fi][idx];
                let owner = f.self_ty.as_deref();
                match method_owner.get(name) {
                    None => {
                        method_owner.insert(name, owner);
                    }
                    Some(first) if *first != owner => {
                        ambiguous.insert(name);
                    }
                    Some(_) => {}
                }
            }
        }
        let modules: Vec<String> = files.iter().map(|f| module_path(root, f.path())).collect();
        let repeated_types = repeated_type_names(files);
        let index = Index {
            ambiguous: &ambiguous,
            methods: &methods,
            free: &free,
            assoc: &assoc,
            fields: &fields,
            modules: &modules,
            repeated_types: &repeated_types,
        };

        // Which build target each file belongs to: calls resolve within a target and into the lib.
        let file_targets_of: Vec<Option<String>> =
            files.iter().map(|f| build_target(root, f.path())).collect();
        let single_target = file_targets_of.iter().all(|t| t == &file_targets_of[0]);
        // Resolve every call once: its same-crate targets (empty for most calls).
        let mut targets: Vec<Vec<Cow<'_, [GlobalFn]>>> = Vec::with_capacity(files.len());
        let mut is_marker: Vec<Vec<bool>> = Vec::with_capacity(files.len());
        for (fi, file) in files.iter().enumerate() {
            let mut file_targets = Vec::with_capacity(file.facts.calls.len());
            let mut file_markers = Vec::with_capacity(file.facts.calls.len());
            for call in &file.facts.calls {
                let found: Cow<'_, [GlobalFn]> = candidates(file, call, &index);
                let found = if single_target || found.is_empty() {
                    found
                } else {
                    Cow::Owned(
                        found
                            .iter()
                            .copied()
                            .filter(|&(tf, _)| {
                                // Examples of a framework's own package use its library as
                                // users use the published crate: its internals are not theirs.
                                (file_targets_of[tf].is_none() && !framework_package)
                                    || file_targets_of[tf] == file_targets_of[fi]
                            })
                            .collect(),
                    )
                };
                file_targets.push(found);
                let recv = resolve(call.recv_ty, &fields);
                file_markers.push(!call.in_test && markers.is_marker(call, recv));
            }
            targets.push(file_targets);
            is_marker.push(file_markers);
        }

        // Test code: test items, and functions called only from test code (a helper module of
        // `#[tokio::test]`s without `#[cfg(test)]`). Public functions are API, whoever calls them.
        let mut test_fn: Vec<bool> = files
            .iter()
            .flat_map(|f| f.facts.fns.iter().map(|g| g.is_test))
            .collect();
        {
            // Per function: call edges from code that is not test code (yet).
            let mut live_callers = vec![0usize; total_fns];
            let mut test_callers = vec![0usize; total_fns];
            let mut edges: Vec<Vec<usize>> = vec![Vec::new(); total_fns];
            for (fi, file) in files.iter().enumerate() {
                for (ci, call) in file.facts.calls.iter().enumerate() {
                    let caller = call.fn_idx.map(|f| global((fi, f)));
                    for &target in targets[fi][ci].iter() {
                        let t = global(target);
                        match caller {
                            Some(c) if test_fn[c] || call.in_test => test_callers[t] += 1,
                            Some(c) => {
                                live_callers[t] += 1;
                                edges[c].push(t);
                            }
                            None => live_callers[t] += 1,
                        }
                    }
                }
            }
            let is_pub: Vec<bool> = files
                .iter()
                .flat_map(|f| f.facts.fns.iter().map(|g| g.is_pub))
                .collect();
            let mut queue: VecDeque<usize> = (0..total_fns)
                .filter(|&g| {
                    !test_fn[g] && !is_pub[g] && live_callers[g] == 0 && test_callers[g] > 0
                })
                .collect();
            while let Some(g) = queue.pop_front() {
                if test_fn[g] {
                    continue;
                }
                test_fn[g] = true;
                for &t in &edges[g] {
                    live_callers[t] -= 1;
                    test_callers[t] += 1;
                    if !test_fn[t] && !is_pub[t] && live_callers[t] == 0 {
                        queue.push_back(t);
                    }
                }
            }
        }
        let helper: Vec<bool> = files
            .iter()
            .flat_map(|f| f.facts.fns.iter().map(is_output_helper))
            .collect();
        // Calls into output helpers are not followed: the call itself is what a rule reports.
        let mut helper_calls: CallMap = HashMap::default();
        for (fi, file_targets) in targets.iter_mut().enumerate() {
            for (ci, found) in file_targets.iter_mut().enumerate() {
                if found.iter().any(|&t| helper[global(t)]) {
                    let (helpers, rest): (Vec<GlobalFn>, Vec<GlobalFn>) =
                        found.iter().copied().partition(|&t| helper[global(t)]);
                    helper_calls.insert((fi, ci), helpers);
                    *found = Cow::Owned(rest);
                }
            }
        }
        // Kept for the rules: each call's same-crate targets, and each function's call sites.
        let mut resolved_calls: CallMap = HashMap::default();
        let mut call_sites: Vec<Vec<(usize, usize)>> = vec![Vec::new(); total_fns];
        for (fi, file_targets) in targets.iter().enumerate() {
            for (ci, found) in file_targets.iter().enumerate() {
                let helpers = helper_calls.get(&(fi, ci));
                if found.is_empty() && helpers.is_none() {
                    continue;
                }
                let all: Vec<GlobalFn> = found
                    .iter()
                    .chain(helpers.into_iter().flatten())
                    .copied()
                    .collect();
                for &t in &all {
                    call_sites[global(t)].push((fi, ci));
                }
                resolved_calls.insert((fi, ci), all);
            }
        }
        let free_fns: HashMap<String, Vec<GlobalFn>> = free
            .iter()
            .map(|(name, fns)| (name.to_string(), fns.clone()))
            .collect();
        let methods_by_name: HashMap<String, Vec<GlobalFn>> = methods
            .iter()
            .map(|(name, fns)| (name.to_string(), fns.clone()))
            .collect();
        // A call in test code, including the functions found above.
        let in_test = |fi: usize, call: &CallFact<'_>| {
            call.in_test || call.fn_idx.is_some_and(|f| test_fn[global((fi, f))])
        };

        // Functions containing a marker, directly or through callees: propagate backwards.
        let mut callers: Vec<Vec<usize>> = vec![Vec::new(); total_fns];
        // Calls with same-crate targets, per calling function.
        let mut fn_calls: Vec<Vec<usize>> = vec![Vec::new(); total_fns];
        let mut has_marker = vec![false; total_fns];
        let mut queue = VecDeque::new();
        for (fi, file) in files.iter().enumerate() {
            for (ci, call) in file.facts.calls.iter().enumerate() {
                let Some(caller_idx) = call.fn_idx else {
                    continue;
                };
                if in_test(fi, call) {
                    continue;
                }
                let caller = global((fi, caller_idx));
                if !targets[fi][ci].is_empty() {
                    fn_calls[caller].push(ci);
                }
                for &target in targets[fi][ci].iter() {
                    callers[global(target)].push(caller);
                }
                if is_marker[fi][ci] && !has_marker[caller] {
                    has_marker[caller] = true;
                    queue.push_back(caller);
                }
            }
        }
        while let Some(f) = queue.pop_front() {
            for &caller in &callers[f] {
                if !has_marker[caller] {
                    has_marker[caller] = true;
                    queue.push_back(caller);
                }
            }
        }

        // Step loops: a loop with a marker (or a call to a marker function) anywhere in its body.
        let mut step_loop: Vec<Vec<bool>> = files
            .iter()
            .map(|f| vec![false; f.facts.loops.len()])
            .collect();
        for (fi, file) in files.iter().enumerate() {
            for (ci, call) in file.facts.calls.iter().enumerate() {
                let Some(mut l) = call.loop_idx else { continue };
                if in_test(fi, call) {
                    continue;
                }
                let marks =
                    is_marker[fi][ci] || targets[fi][ci].iter().any(|&t| has_marker[global(t)]);
                if !marks {
                    continue;
                }
                loop {
                    if step_loop[fi][l] {
                        break;
                    }
                    step_loop[fi][l] = true;
                    match file.facts.loops[l].parent {
                        Some(p) => l = p,
                        None => break,
                    }
                }
            }
        }
        // Outer loops: step loops enclosing another step loop.
        let mut outer: Vec<Vec<bool>> = files
            .iter()
            .map(|f| vec![false; f.facts.loops.len()])
            .collect();
        for (fi, file) in files.iter().enumerate() {
            for l in 0..file.facts.loops.len() {
                if !step_loop[fi][l] {
                    continue;
                }
                let mut parent = file.facts.loops[l].parent;
                while let Some(p) = parent {
                    if step_loop[fi][p] {
                        outer[fi][p] = true;
                    }
                    parent = file.facts.loops[p].parent;
                }
            }
        }

        let mut analysis = CrateAnalysis {
            step_loop,
            outer,
            reach: files
                .iter()
                .map(|f| vec![None; f.facts.fns.len()])
                .collect(),
            crate_device: Default::default(),
            test_fn: Vec::new(),
            helper_calls: HashMap::default(),
            file_target: Vec::new(),
            target_device: Vec::new(),
            slots: SlotIndex::default(),
            seen: Vec::new(),
            memo: Default::default(),
            call_base: Vec::new(),
            resolved_calls: HashMap::default(),
            call_sites: Vec::new(),
            free_fns: HashMap::new(),
            methods_by_name: HashMap::new(),
            trains: Vec::new(),
            fn_offsets: offsets.clone(),
        };
        analysis.resolved_calls = std::mem::take(&mut resolved_calls);
        analysis.resolve_devices(
            files,
            &targets,
            &helper_calls,
            &Index {
                ambiguous: &ambiguous,
                methods: &methods,
                free: &free,
                assoc: &assoc,
                fields: &fields,
                modules: &modules,
                repeated_types: &repeated_types,
            },
            external,
        );
        let mut target_ids: HashMap<&Option<String>, usize> = HashMap::new();
        for (fi, file) in files.iter().enumerate() {
            let next = target_ids.len();
            let t = *target_ids.entry(&file_targets_of[fi]).or_insert(next);
            if t == analysis.target_device.len() {
                analysis.target_device.push(Default::default());
            }
            analysis.file_target.push(t);
            let mut evidence = file.facts.device;
            for (idx, f) in file.facts.fns.iter().enumerate() {
                if !test_fn[global((fi, idx))] {
                    evidence.merge(f.device);
                }
            }
            analysis.target_device[t].merge(evidence);
            analysis.crate_device.merge(evidence);
        }

        // Reach: breadth-first from calls in step loops, per-step paths first so that a function
        // reached both per step and less often reports per step. Each function is settled at most
        // twice (once per kind), so cycles end.
        let mut seeds_per_step = Vec::new();
        let mut seeds_lowered = Vec::new();
        for (fi, file) in files.iter().enumerate() {
            for (ci, call) in file.facts.calls.iter().enumerate() {
                if in_test(fi, call) || call.on_failure || targets[fi][ci].is_empty() {
                    continue;
                }
                let Some(l) = analysis.innermost_step_loop(files, fi, call.loop_idx) else {
                    continue;
                };
                let unguarded = !guard_inside(files, fi, call, l);
                let per_step = !analysis.outer[fi][l] && unguarded;
                let seed = (fi, ci, (fi, l), unguarded, call.guard_kind);
                if per_step {
                    seeds_per_step.push(seed);
                } else {
                    seeds_lowered.push(seed);
                }
            }
        }
        for (per_step, seeds) in [(true, seeds_per_step), (false, seeds_lowered)] {
            let mut queue: VecDeque<GlobalFn> = VecDeque::new();
            for (fi, ci, origin, unguarded, kind) in seeds {
                for &target in targets[fi][ci].iter() {
                    if analysis.settle(target, origin, unguarded, kind, None) {
                        queue.push_back(target);
                    }
                }
            }
            while let Some(g) = queue.pop_front() {
                let Some(reach) = analysis.reach[g.0][g.1].clone() else {
                    continue;
                };
                let file = &files[g.0];
                for &ci in &fn_calls[global(g)] {
                    let call = &file.facts.calls[ci];
                    // Calls inside the function's own step loops are seeds of their own.
                    // Failure paths run only when something went wrong.
                    if analysis.inside_any_step_loop(files, g.0, call.loop_idx) || call.on_failure {
                        continue;
                    }
                    let unguarded = reach.unguarded && call.guard.is_none();
                    let kind = if reach.unguarded {
                        call.guard_kind
                    } else {
                        reach.guard_kind
                    };
                    let next_per_step =
                        !analysis.outer[reach.origin.0][reach.origin.1] && unguarded;
                    if next_per_step != per_step {
                        continue;
                    }
                    for &target in targets[g.0][ci].iter() {
                        if analysis.settle(target, reach.origin, unguarded, kind, Some(g)) {
                            queue.push_back(target);
                        }
                    }
                }
            }
        }
        analysis.test_fn = test_fn;
        analysis.helper_calls = helper_calls;
        analysis.trains = has_marker;
        analysis.call_sites = call_sites;
        analysis.free_fns = free_fns;
        analysis.methods_by_name = methods_by_name;
        analysis
    }

    /// Settles the devices of parameters (from the arguments at the crate's call sites), struct
    /// fields (from the crate's struct literals) and return values (from each function's tail and
    /// `return`s), to a fixed point.
    fn resolve_devices(
        &mut self,
        files: &[CrateFile<'_>],
        targets: &[Vec<Cow<'_, [GlobalFn]>>],
        helper_calls: &CallMap,
        index: &Index<'_, '_>,
        external: &ExternalFacts,
    ) {
        let methods = index.methods;
        let fields = index.fields;
        // One slot per typed parameter, per return value and per struct field the crate sets.
        let mut param_base: Vec<usize> = Vec::new();
        let mut next_slot = 0;
        for g in files.iter().flat_map(|f| f.facts.fns.iter()) {
            param_base.push(next_slot);
            next_slot += g
                .sig
                .inputs
                .iter()
                .filter(|i| matches!(i, syn::FnArg::Typed(_)))
                .count();
        }
        let total = param_base.len();
        param_base.push(next_slot);
        let mut slots = SlotIndex {
            param_base,
            ret_base: next_slot,
            fields: HashMap::default(),
        };
        let mut seen = vec![Seen::None; next_slot + total];
        let has_receiver: Vec<bool> = files
            .iter()
            .flat_map(|f| f.facts.fns.iter().map(|g| g.sig.receiver().is_some()))
            .collect();
        // Per file: the calls that reach crate functions, with those functions.
        let mut sites: Vec<Vec<(usize, &[GlobalFn])>> = vec![Vec::new(); files.len()];
        for (&(fi, ci), found) in &self.resolved_calls {
            sites[fi].push((ci, found));
        }
        for file_sites in &mut sites {
            file_sites.sort_unstable_by_key(|(ci, _)| *ci);
        }
        // Derived setters (`Type::builder().field(x)`, `value.with_field(x)`) store into fields
        // as struct literals do.
        // Structs of the same name in several modules (each its own `Builder`) share an entry, as
        // they share the field table.
        let mut builders: Builders<'_, '_> = HashMap::new();
        for st in files.iter().flat_map(|f| f.facts.structs.iter()) {
            if let Some(setters) = &st.setters {
                builders
                    .entry(st.name)
                    .or_insert((st.name, Vec::new()))
                    .1
                    .push(setters);
            }
        }
        let mut setter_slots: Vec<(usize, usize, &str, &str)> = Vec::new();
        if !builders.is_empty() {
            for (fi, file) in files.iter().enumerate() {
                for setter in &file.facts.setter_calls {
                    let owner = match setter.root {
                        SetterRoot::Call(ci, qualifier) => {
                            let made_by = self
                                .resolved_calls
                                .get(&(fi, ci))
                                .and_then(|t| t.first())
                                .copied();
                            builder_made_by(files, &builders, made_by, qualifier)
                        }
                        SetterRoot::Value(hint) => resolve(hint, fields)
                            .and_then(|ty| builders.get(ty))
                            .map(|(name, _)| *name),
                    };
                    let Some(owner) = owner else { continue };
                    let name = file.facts.calls[setter.call].name;
                    if let Some(field) = setter_field(&builders, owner, name) {
                        setter_slots.push((fi, setter.call, owner, field));
                    }
                }
            }
        }
        // What the packages that call this one (when only they can) pass it.
        let mut external_items: Vec<(DevSlot<'_>, DeviceKind)> = Vec::new();
        for (qualifier, root, method, kind) in &external.setters {
            let made_by = index
                .assoc
                .get(qualifier.as_str())
                .and_then(|fns| fns.get(root.as_str()))
                .and_then(|found| found.first())
                .copied();
            if let Some(owner) = builder_made_by(files, &builders, made_by, qualifier)
                && let Some(field) = setter_field(&builders, owner, method)
            {
                external_items.push((DevSlot::Field(owner, field), *kind));
            }
        }
        for (qualifier, name, devs) in &external.calls {
            let found = index
                .assoc
                .get(qualifier.as_str())
                .and_then(|fns| fns.get(name.as_str()));
            for &(tf, tidx) in found.into_iter().flatten() {
                let g = self.fn_offsets[tf] + tidx;
                let skip = usize::from(has_receiver[g]);
                for (i, kind) in devs.iter().skip(skip).enumerate() {
                    if i >= slots.params_of(g) {
                        break;
                    }
                    external_items.push((DevSlot::Param(g, i), *kind));
                }
            }
        }
        // Every field the crate's struct literals (or setters) set starts unsettled: until its
        // literals are resolved, a read of it waits (a field no literal sets is unknown at once).
        // Taking an unsettled field for unknown would fix every value read from it as unknown
        // for good.
        let set_fields = files
            .iter()
            .flat_map(|f| f.facts.field_inits.iter().map(|i| (i.owner, i.field)))
            .chain(
                setter_slots
                    .iter()
                    .map(|&(_, _, owner, field)| (owner, field)),
            )
            .chain(external_items.iter().filter_map(|(slot, _)| match slot {
                DevSlot::Field(owner, field) => Some((*owner, *field)),
                _ => None,
            }));
        for (owner, field) in set_fields {
            slots.field_or_insert(owner, field, &mut seen);
        }
        // Which functions a call's value can come from: its resolved targets, else (a method the
        // crate defines on several types) every method of that name.
        let value_targets = |fi: usize, ci: usize| -> (Cow<'_, [GlobalFn]>, &[GlobalFn]) {
            let resolved = &targets[fi][ci];
            let found: Cow<'_, [GlobalFn]> = match helper_calls.get(&(fi, ci)) {
                Some(h) => Cow::Owned(resolved.iter().chain(h.iter()).copied().collect()),
                None => Cow::Borrowed(&resolved[..]),
            };
            let call = &files[fi].facts.calls[ci];
            let mut by_name: &[GlobalFn] = &[];
            if found.is_empty() && call.call.is_method() {
                let all = methods.get(call.name).map(Vec::as_slice).unwrap_or(&[]);
                if all.len() <= 8 {
                    by_name = all;
                }
            }
            (found, by_name)
        };
        let offsets = self.fn_offsets.clone();
        let mut call_base = Vec::with_capacity(files.len());
        let mut calls = 0;
        for f in files {
            call_base.push(calls);
            calls += f.facts.calls.len();
        }
        let memo = std::cell::RefCell::new(vec![Memo::Unvisited; calls]);
        // What the rounds join, in the order they join it: every argument passed to a crate
        // function, struct literal field and returned value. An item whose device is known (or
        // unknown with nothing to look up) joins the same kind in every round, and joining a kind
        // twice changes nothing, so only the first round joins it; later rounds look again only
        // at the symbolic ones, in the same order (the per-round memo sees the same sequence).
        let mut items: Vec<DevItem<'_>> = external_items
            .iter()
            .map(|&(slot, kind)| DevItem {
                fi: 0,
                fn_idx: None,
                dev: Dev::known(kind),
                slot: slots.slot_of(slot, &mut seen),
            })
            .collect();
        for (fi, file) in files.iter().enumerate() {
            // Parameters, from the arguments at each call site that reaches the crate.
            for (ci, all_targets) in &sites[fi] {
                let ci = *ci;
                let call = &file.facts.calls[ci];
                let nargs = call.call.args().len();
                if nargs == 0 {
                    continue;
                }
                let devs = file.facts.arg_devs_of(ci);
                for &(tf, tidx) in all_targets.iter() {
                    let g = self.fn_offsets[tf] + tidx;
                    // `Type::method(x, ..)` passes `self` first.
                    let skip = usize::from(!call.call.is_method() && has_receiver[g]);
                    for i in 0..nargs.saturating_sub(skip) {
                        if i >= slots.params_of(g) {
                            break;
                        }
                        let dev = devs.map_or(Dev::UNKNOWN, |d| d[i + skip]);
                        items.push(DevItem {
                            fi,
                            fn_idx: call.fn_idx,
                            dev,
                            slot: slots.param_base[g] + i,
                        });
                    }
                }
            }
            for init in &file.facts.field_inits {
                items.push(DevItem {
                    fi,
                    fn_idx: init.fn_idx,
                    dev: init.dev,
                    slot: slots.slot_of(DevSlot::Field(init.owner, init.field), &mut seen),
                });
            }
            for &(_, ci, owner, field) in setter_slots.iter().filter(|s| s.0 == fi) {
                let dev = file.facts.arg_devs_of(ci).map_or(Dev::UNKNOWN, |d| d[0]);
                items.push(DevItem {
                    fi,
                    fn_idx: file.facts.calls[ci].fn_idx,
                    dev,
                    slot: slots.slot_of(DevSlot::Field(owner, field), &mut seen),
                });
            }
            for &(f, dev) in &file.facts.returns {
                items.push(DevItem {
                    fi,
                    fn_idx: Some(f),
                    dev,
                    slot: slots.ret_base + self.fn_offsets[fi] + f,
                });
            }
        }
        drop(sites);
        let symbolic: Vec<DevItem<'_>> = items
            .iter()
            .filter(|item| item.is_symbolic())
            .copied()
            .collect();
        // Each round resolves against the tables as the previous round left them (`snapshot`)
        // and joins into `seen`. A symbolic item is worked out again only when something its last
        // working-out looked at differs now: a slot that has changed since (`changed_at`: the
        // round after the last change), or a call's memo entry as the items before it in this
        // round left it. Otherwise the working-out would repeat step by step, so its result and
        // the memo entries it set are taken from the record ([`Recorded`]). Rounds and their
        // results are the same as when every item is worked out in every round.
        let mut snapshot: Vec<Seen> = Vec::new();
        let mut changed_at = vec![0u32; seen.len()];
        let tracer = std::cell::RefCell::new(Trace {
            stamp: vec![0; calls],
            ..Trace::default()
        });
        let mut records = vec![Recorded::default(); symbolic.len()];
        let mut log = TraceLog::default();
        // An item whose last working-out found no memo entry depends on the slots it read alone
        // (and leaves the memo as it is): it is looked at again only from the round after one of
        // them changed (`due`), found through `readers` (per slot, the items whose working-outs
        // read it: a list threaded through `reader_links`, stale entries only cost a look).
        let mut due = vec![0u32; symbolic.len()];
        let mut readers = vec![NO_LINK; seen.len()];
        let mut reader_links: Vec<(u32, u32)> = Vec::new();
        for round in 0..MAX_DEVICE_ROUNDS {
            let mut changed = false;
            snapshot.clone_from(&seen);
            memo.borrow_mut().fill(Memo::Unvisited);
            let resolver = Resolver {
                files,
                offsets: &offsets,
                slots: &slots,
                seen: &snapshot,
                value_targets: &value_targets,
                calls: &memo,
                call_base: &call_base,
                trace: Some(&tracer),
            };
            let round_items = if round == 0 { &items } else { &symbolic };
            let mut next_record = 0;
            for item in round_items {
                let found = if item.is_symbolic() {
                    let k = next_record;
                    next_record += 1;
                    let record = &mut records[k];
                    if record.found == 0 && due[k] > round {
                        // Nothing it read has changed: the same result, joined already.
                        continue;
                    }
                    let held = round > 0 && log.holds(record, &changed_at, &mut memo.borrow_mut());
                    if !held {
                        tracer.borrow_mut().begin();
                        let found = resolver.dev(item.fi, item.fn_idx, item.dev, 0);
                        log.record(record, round, found, &tracer.borrow(), &memo.borrow());
                    }
                    if record.found == 0 {
                        due[k] = NO_LINK;
                        for &slot in log.reads(record) {
                            let slot = slot as usize;
                            // Changed by an item before this one in this round: look again in
                            // the next.
                            if changed_at[slot] > round {
                                due[k] = round + 1;
                            }
                            if !held {
                                reader_links.push((k as u32, readers[slot]));
                                readers[slot] = (reader_links.len() - 1) as u32;
                            }
                        }
                    }
                    record.result
                } else {
                    // Known, or unknown with nothing to look up: nothing read, nothing memoized,
                    // the same kind in every round.
                    resolver.dev(item.fi, item.fn_idx, item.dev, 0)
                };
                if let Some(kind) = found
                    && seen[item.slot].join(kind)
                {
                    changed = true;
                    changed_at[item.slot] = round + 1;
                    let mut link = readers[item.slot];
                    while link != NO_LINK {
                        let (k, next) = reader_links[link as usize];
                        due[k as usize] = due[k as usize].min(round + 1);
                        link = next;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        // The calls' operands are resolved when a rule asks (most never are), against the
        // settled tables.
        memo.borrow_mut().fill(Memo::Unvisited);
        self.slots = slots;
        self.seen = seen;
        self.memo = memo;
        self.call_base = call_base;
    }

    /// The device of `dev`, a value at call `call` of `file` (its operand or destination): what
    /// its function says, else what the crate's call sites, struct literals and return values say.
    pub(crate) fn resolve_now(
        &self,
        files: &[CrateFile<'_>],
        file: FileId,
        call: &CallFact<'_>,
        dev: Dev<'_>,
    ) -> DeviceKind {
        if dev.kind != DeviceKind::Unknown || !dev.is_informative() {
            return dev.kind;
        }
        let value_targets = |fi: usize, ci: usize| -> (Cow<'_, [GlobalFn]>, &[GlobalFn]) {
            let found = self
                .resolved_calls
                .get(&(fi, ci))
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let mut by_name: &[GlobalFn] = &[];
            let call = &files[fi].facts.calls[ci];
            if found.is_empty() && call.call.is_method() {
                let all = self.methods_named(call.name);
                if all.len() <= 8 {
                    by_name = all;
                }
            }
            (Cow::Borrowed(found), by_name)
        };
        let resolver = Resolver {
            files,
            offsets: &self.fn_offsets,
            slots: &self.slots,
            seen: &self.seen,
            value_targets: &value_targets,
            calls: &self.memo,
            call_base: &self.call_base,
            trace: None,
        };
        resolver
            .dev(file.0, call.fn_idx, dev, 0)
            .unwrap_or(DeviceKind::Unknown)
    }

    /// What this package passes to the packages it depends on: its calls `Type::f(args)` and its
    /// setter chains `Type::f(..).method(x)` that reach no function of its own, with the devices
    /// of the arguments resolved here (see [`ExternalFacts`]).
    pub(crate) fn export(&self, files: &[CrateFile<'_>]) -> ExternalFacts {
        let mut out = ExternalFacts::default();
        let arg_dev = |fi: usize, ci: usize, i: usize| -> DeviceKind {
            let file = &files[fi];
            let call = &file.facts.calls[ci];
            let dev = file.facts.arg_devs_of(ci).map_or(Dev::UNKNOWN, |d| d[i]);
            self.resolve_now(files, FileId(fi), call, dev)
        };
        let foreign_type = |q: &str| q != "Self" && q.starts_with(|c: char| c.is_ascii_uppercase());
        for (fi, file) in files.iter().enumerate() {
            for (ci, call) in file.facts.calls.iter().enumerate() {
                let nargs = call.call.args().len();
                if call.call.is_method()
                    || nargs == 0
                    || self.resolved_calls.contains_key(&(fi, ci))
                {
                    continue;
                }
                let Some(qualifier) = call.call.qualifier().map(|q| q.to_string()) else {
                    continue;
                };
                if !foreign_type(&qualifier) {
                    continue;
                }
                let devs = (0..nargs).map(|i| arg_dev(fi, ci, i)).collect();
                out.calls.push((qualifier, call.name.to_string(), devs));
            }
            for setter in &file.facts.setter_calls {
                let SetterRoot::Call(root, qualifier) = setter.root else {
                    continue;
                };
                if !foreign_type(qualifier) || self.resolved_calls.contains_key(&(fi, root)) {
                    continue;
                }
                out.setters.push((
                    qualifier.to_string(),
                    file.facts.calls[root].name.to_string(),
                    file.facts.calls[setter.call].name.to_string(),
                    arg_dev(fi, setter.call, 0),
                ));
            }
        }
        out
    }

    /// Marks the functions found to be test code (called only from tests) as test code in the
    /// files' facts, so that every rule skips them as it skips `#[test]` functions.
    pub(crate) fn mark_test_code(&self, files: &mut [CrateFile<'_>]) {
        let mut g = 0;
        for file in files.iter_mut() {
            let mut marked = Vec::new();
            for (idx, f) in file.facts.fns.iter_mut().enumerate() {
                if self.test_fn[g] && !f.is_test {
                    f.is_test = true;
                    marked.push(idx);
                }
                g += 1;
            }
            if marked.is_empty() {
                continue;
            }
            for call in &mut file.facts.calls {
                if call.fn_idx.is_some_and(|f| marked.contains(&f)) {
                    call.in_test = true;
                }
            }
            for idx in marked {
                let span = file.facts.fns[idx].block.span();
                file.facts.test_spans.push(span);
            }
        }
    }

    /// The output helpers a call reaches (see [`is_output_helper`]), as (file, function index).
    pub(crate) fn helper_targets(&self, file: FileId, call_index: usize) -> &[(usize, usize)] {
        self.helper_calls
            .get(&(file.0, call_index))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Records that `f` is reached from `origin`; true when this changed anything.
    fn settle(
        &mut self,
        f: GlobalFn,
        origin: (usize, usize),
        unguarded: bool,
        guard_kind: super::GuardKind,
        caller: Option<GlobalFn>,
    ) -> bool {
        let per_step = !self.outer[origin.0][origin.1] && unguarded;
        let existing_per_step = self.reach[f.0][f.1]
            .as_ref()
            .map(|r| !self.outer[r.origin.0][r.origin.1] && r.unguarded);
        match existing_per_step {
            Some(existing) if existing || !per_step => false,
            _ => {
                self.reach[f.0][f.1] = Some(Reach {
                    origin,
                    unguarded,
                    guard_kind,
                    caller,
                });
                true
            }
        }
    }

    /// Whether loop `l` is or sits inside a step loop of its function.
    fn inside_any_step_loop(&self, files: &[CrateFile<'_>], fi: usize, l: Option<usize>) -> bool {
        let mut at = l;
        while let Some(idx) = at {
            if self.step_loop[fi][idx] {
                return true;
            }
            at = files[fi].facts.loops[idx].parent;
        }
        false
    }

    /// The step loop whose iterations run code at loop `l`: the innermost step loop around it,
    /// except that code in another loop nested in a per-epoch loop (a validation loop beside the
    /// per-batch loop) belongs to no step loop: it runs per validation batch, not per step.
    fn innermost_step_loop(
        &self,
        files: &[CrateFile<'_>],
        fi: usize,
        l: Option<usize>,
    ) -> Option<usize> {
        let mut at = l;
        while let Some(idx) = at {
            if self.step_loop[fi][idx] {
                if self.outer[fi][idx] && l != Some(idx) {
                    return None;
                }
                return Some(idx);
            }
            at = files[fi].facts.loops[idx].parent;
        }
        None
    }

    /// Where a call sits relative to the crate's step loops.
    pub(crate) fn step_hit(
        &self,
        cx: &CrateContext<'_>,
        file: FileId,
        call: &CallFact<'_>,
    ) -> Option<StepHit> {
        // Test code, and code that runs only when something failed, is not per-step code.
        if call.in_test || call.on_failure {
            return None;
        }
        let files = cx.files();
        let fi = file.0;
        if let Some(l) = self.innermost_step_loop(files, fi, call.loop_idx) {
            return Some(StepHit {
                loop_file: file,
                loop_region: region_of(files[fi].facts.loops[l].span),
                outer: self.outer[fi][l],
                guarded: guard_inside(files, fi, call, l),
                guard_kind: call.guard_kind,
                via: Vec::new(),
            });
        }
        // Not in a step loop of its own function: reached from one through calls?
        let f = call.fn_idx?;
        let reach = self.reach[fi][f].as_ref()?;
        let mut via = Vec::new();
        let mut at = Some((fi, f));
        // A caller chain visits each function at most once; the bound stops a cycle.
        let fns_in_crate: usize = files.iter().map(|f| f.facts.fns.len()).sum();
        let mut guard = 0;
        while let Some(g) = at {
            via.push(files[g.0].facts.fns[g.1].name.to_string());
            at = self.reach[g.0][g.1].as_ref().and_then(|r| r.caller);
            guard += 1;
            if guard > fns_in_crate {
                break;
            }
        }
        via.reverse();
        let (lf, l) = reach.origin;
        Some(StepHit {
            loop_file: FileId(lf),
            loop_region: region_of(files[lf].facts.loops[l].span),
            outer: self.outer[lf][l],
            guarded: !reach.unguarded || call.guard.is_some(),
            guard_kind: if reach.unguarded {
                call.guard_kind
            } else {
                reach.guard_kind
            },
            via,
        })
    }

    /// See [`CrateContext::is_statically_cpu`].
    pub(crate) fn is_statically_cpu(
        &self,
        cx: &CrateContext<'_>,
        file: FileId,
        call: &CallFact<'_>,
    ) -> bool {
        match self.resolve_now(cx.files, file, call, call.operand) {
            super::DeviceKind::Cpu => return true,
            super::DeviceKind::Gpu => return false,
            super::DeviceKind::Unknown => {}
        }
        self.program_is_cpu(file)
    }

    /// The crate functions call `call` of `file` reaches.
    pub(crate) fn targets_of(&self, file: FileId, call: usize) -> &[GlobalFn] {
        self.resolved_calls
            .get(&(file.0, call))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The calls that reach function `fn_idx` of `file`, as (file, call index).
    pub(crate) fn call_sites_of(&self, file: FileId, fn_idx: usize) -> &[(usize, usize)] {
        self.call_sites
            .get(self.fn_offsets[file.0] + fn_idx)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether function `fn_idx` of `file` makes a training step (a step marker in its body or in
    /// the crate functions it calls).
    pub(crate) fn trains(&self, file: FileId, fn_idx: usize) -> bool {
        self.trains
            .get(self.fn_offsets[file.0] + fn_idx)
            .copied()
            .unwrap_or(false)
    }

    /// The crate's methods named `name`.
    pub(crate) fn methods_named(&self, name: &str) -> &[GlobalFn] {
        self.methods_by_name
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The crate's free functions named `name`.
    pub(crate) fn free_fns_named(&self, name: &str) -> &[GlobalFn] {
        self.free_fns.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The index of the program (build target) a file belongs to.
    pub(crate) fn program_of(&self, file: FileId) -> usize {
        self.file_target[file.0]
    }

    /// Whether the program (build target) a file belongs to names only CPU devices, or names none
    /// and the crate names only CPU devices.
    pub(crate) fn program_is_cpu(&self, file: FileId) -> bool {
        let target = &self.target_device[self.file_target[file.0]];
        if !target.is_empty() {
            return target.is_cpu_only();
        }
        self.crate_device.is_cpu_only()
    }
}

/// The struct whose derived setters a chain started by a path call `Type::f(..)` calls: the
/// struct the crate function it reaches (`made_by`) returns (`Self` is its impl type), else, for
/// a function the crate does not define (a derive's `builder()`), the qualifying type itself
/// (`derive_builder`'s `TypeBuilder` stands for `Type`).
fn builder_made_by<'n>(
    files: &[CrateFile<'_>],
    builders: &Builders<'n, '_>,
    made_by: Option<GlobalFn>,
    qualifier: &str,
) -> Option<&'n str> {
    if let Some((tf, tidx)) = made_by {
        let f = &files[tf].facts.fns[tidx];
        let returned = match &f.sig.output {
            syn::ReturnType::Type(_, ty) => returned_type_name(ty)?,
            syn::ReturnType::Default => return None,
        };
        let returned = if returned == "Self" {
            f.self_ty.clone()?
        } else {
            returned
        };
        return builders.get(returned.as_str()).map(|(name, _)| *name);
    }
    if let Some((name, _)) = builders.get(qualifier) {
        return Some(name);
    }
    let built = qualifier.strip_suffix("Builder")?;
    builders
        .get(built)
        .filter(|(_, derives)| derives.iter().any(|d| d.derive == "Builder"))
        .map(|(name, _)| *name)
}

/// The structs with derived setters, by name: (the name, the derives of the structs of that name).
type Builders<'n, 's> = HashMap<&'n str, (&'n str, Vec<&'s super::SetterDerive<'n>>)>;

/// The field a derived setter named `method` of struct `owner` stores into.
fn setter_field<'n>(builders: &Builders<'n, '_>, owner: &str, method: &str) -> Option<&'n str> {
    builders.get(owner)?.1.iter().find_map(|derive| {
        let field = method.strip_prefix(derive.prefix)?.trim_start_matches('_');
        derive.fields.iter().find(|f| **f == field).copied()
    })
}

/// Device facts that other packages of the same run give a library that only they can call (a
/// path dependency that is not published): their calls of its associated functions
/// (`Type::new(args)`) and its derived setters (`Type::builder().field(x)`), with the devices of
/// the arguments as the calling package resolved them.
#[derive(Debug, Default, Clone)]
pub(crate) struct ExternalFacts {
    /// `Type::f(args)`: the type, the function, the devices of the arguments.
    pub(crate) calls: Vec<(String, String, Vec<DeviceKind>)>,
    /// `Type::f(..).method(x)`: the type, the function, the method, the device of `x`.
    pub(crate) setters: Vec<(String, String, String, DeviceKind)>,
}

impl ExternalFacts {
    /// Adds what another package gives.
    pub(crate) fn extend(&mut self, other: &ExternalFacts) {
        self.calls.extend(other.calls.iter().cloned());
        self.setters.extend(other.setters.iter().cloned());
    }
}

/// The type a function's declared return type holds: `Step`, `Result<Step>`, `PyResult<Step>`,
/// `anyhow::Result<Step, E>`, `Option<Box<Step>>`.
fn returned_type_name(ty: &syn::Type) -> Option<String> {
    if let syn::Type::Path(p) = ty
        && let Some(last) = p.path.segments.last()
        && with_ident_str(&last.ident, |name| name.ends_with("Result"))
        && let syn::PathArguments::AngleBracketed(args) = &last.arguments
        && let Some(syn::GenericArgument::Type(inner)) = args.args.first()
    {
        return returned_type_name(inner);
    }
    super::values::type_name(ty, &[])
}

/// Whether the call's `% N == 0` guard (if any) sits inside loop `l` (so it thins out the steps).
fn guard_inside(files: &[CrateFile<'_>], fi: usize, call: &CallFact<'_>, l: usize) -> bool {
    let Some(guard_loop) = call.guard else {
        return false;
    };
    let mut at = guard_loop;
    while let Some(idx) = at {
        if idx == l {
            return true;
        }
        at = files[fi].facts.loops[idx].parent;
    }
    false
}

fn offsets_of(files: &[CrateFile<'_>]) -> Vec<usize> {
    let mut offsets = Vec::with_capacity(files.len());
    let mut total = 0;
    for file in files {
        offsets.push(total);
        total += file.facts.fns.len();
    }
    offsets
}

/// An identifier's text without `r#` (as call names are recorded), copied into `names` without an
/// intermediate `String`.
fn ident_text<'n>(ident: &syn::Ident, names: &'n typed_arena::Arena<u8>) -> &'n str {
    use std::fmt::Write;
    thread_local! {
        static BUF: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        let _ = write!(buf, "{ident}");
        // Without `r#`, as call names are recorded: `fn r#try` is called as `r#try(..)`.
        names.alloc_str(buf.strip_prefix("r#").unwrap_or(&buf))
    })
}

/// A small, fast hasher for function names (FxHash's multiply-rotate): the lookup runs once per call
/// of the crate, and names are not attacker-chosen keys.
#[derive(Default)]
pub(crate) struct NameHasher(u64);

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The build target of a file of a package: `None` for the library and the main binary (`src/`),
/// `Some("examples/x")`, `Some("src/bin/x")`, `Some("tests/x")`, `Some("benches/x")` for the others.
/// Each target is its own crate: an example cannot call a function of another example.
fn build_target(root: &Path, path: &Path) -> Option<String> {
    let parts = package_parts(root, path)?;
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let stem = |part: &str| part.trim_end_matches(".rs").to_string();
    match parts.as_slice() {
        ["examples" | "tests" | "benches", first, ..] => {
            Some(format!("{}/{}", parts[0], stem(first)))
        }
        ["src", "bin", first, ..] => Some(format!("src/bin/{}", stem(first))),
        _ => None,
    }
}

/// The crate's functions, indexed for call resolution.
struct Index<'m, 'n> {
    methods: &'m FnIndex<'n>,
    free: &'m FnIndex<'n>,
    assoc: &'m HashMap<&'n str, FnIndex<'n>, BuildHasherDefault<NameHasher>>,
    fields: &'m FieldTable<'n>,
    /// Method names that several types of the crate define.
    ambiguous: &'m std::collections::HashSet<&'n str>,
    /// Each file's module path (`burn_ext::ctc` for `src/burn_ext/ctc.rs`).
    modules: &'m [String],
    /// Type names that structs in more than one file of the crate declare.
    repeated_types: &'m std::collections::HashSet<&'n str>,
}

/// The crate functions a call can reach by its shape: for `x.f()`, the methods `f` of `x`'s type
/// when the crate declares it (a trait-typed receiver, `impl Metric` or `M: Metric`, reaches no
/// particular impl and is not followed), else the methods named `f` when they all belong to one
/// type; the impl type's functions for `Type::f()` / `Self::f()` (so `Tensor::new` never reaches
/// the crate's own `new`s); free functions for `f()` and `module::f()`.
fn candidates<'m>(
    file: &CrateFile<'_>,
    call: &CallFact<'_>,
    index: &Index<'m, '_>,
) -> Cow<'m, [GlobalFn]> {
    let lookup = |map: &'m FnIndex<'_>| map.get(call.name).map(Vec::as_slice).unwrap_or(&[]);
    if call.call.is_method() {
        if let Some(ty) = resolve(call.recv_ty, index.fields) {
            let found = index.assoc.get(ty).map(lookup).unwrap_or(&[]);
            return imported_type_only(file, ty, found, index);
        }
        let all = lookup(index.methods);
        if all.is_empty() {
            return Cow::Borrowed(all);
        }
        // An unknown receiver: follow only when one type defines the method (several types, as
        // with a trait implemented by every metric, is dynamic dispatch the syntax cannot settle).
        if index.ambiguous.contains(call.name) {
            return Cow::Borrowed(&[]);
        }
        return Cow::Borrowed(all);
    }
    let Some(qualifier) = call.call.qualifier() else {
        // `f()`: a function of the same module shadows the crate's other functions named `f`.
        let all = lookup(index.free);
        if all.len() > 1 {
            let here: Vec<GlobalFn> = all
                .iter()
                .copied()
                .filter(|&(f, _)| f == file.id.0)
                .collect();
            if !here.is_empty() {
                return Cow::Owned(here);
            }
        }
        return Cow::Borrowed(all);
    };
    if qualifier == "Self" {
        // The caller's impl type; outside an impl, nothing.
        let Some(ty) = call
            .fn_idx
            .and_then(|f| file.facts.fns[f].self_ty.as_deref())
        else {
            return Cow::Borrowed(&[]);
        };
        let found = index.assoc.get(ty).map(lookup).unwrap_or(&[]);
        return imported_type_only(file, ty, found, index);
    }
    with_ident_str(qualifier, |q| {
        if q.starts_with(|c: char| c.is_ascii_uppercase()) {
            let found = index.assoc.get(q).map(lookup).unwrap_or(&[]);
            imported_type_only(file, q, found, index)
        } else {
            // `module::f()`, `crate::train::f()`.
            Cow::Borrowed(lookup(index.free))
        }
    })
}

/// Of the functions of types named `ty`, those of the type the file declares or imports, when
/// structs of that name are declared in several modules (`ctc::CTCLoss` beside an unused
/// `ctc2::CTCLoss`): `use crate::burn_ext::ctc::CTCLoss;` says which one the file means. Every candidate when the
/// file imports no such name, or when none of them lies in the module it names (an `impl` in
/// another module of the type's).
fn imported_type_only<'m>(
    file: &CrateFile<'_>,
    ty: &str,
    found: &'m [GlobalFn],
    index: &Index<'m, '_>,
) -> Cow<'m, [GlobalFn]> {
    if found.len() < 2 || !index.repeated_types.contains(ty) {
        return Cow::Borrowed(found);
    }
    let here = &index.modules[file.id.0];
    // The file's own struct of that name, else the one it imports.
    let module = if file.facts.structs.iter().any(|st| st.name == ty) {
        here.clone()
    } else {
        let Some(&(_, written)) = file.facts.use_paths.iter().find(|(name, _)| *name == ty) else {
            return Cow::Borrowed(found);
        };
        absolute_module(written, here)
    };
    let kept: Vec<GlobalFn> = found
        .iter()
        .copied()
        .filter(|&(f, _)| index.modules[f] == module)
        .collect();
    if kept.is_empty() {
        Cow::Borrowed(found)
    } else {
        Cow::Owned(kept)
    }
}

/// A `use` path's module as a module path from the crate root, read from the module `here`:
/// `crate::a::b` is `a::b`, `self::b` is `here::b`, `super::b` is `b` beside `here`.
fn absolute_module(written: &str, here: &str) -> String {
    let mut parts: Vec<&str> = if here.is_empty() {
        Vec::new()
    } else {
        here.split("::").collect()
    };
    let mut rest = written.split("::").peekable();
    match rest.peek().copied() {
        Some("crate") => {
            parts.clear();
            rest.next();
        }
        Some("self") => {
            rest.next();
        }
        Some("super") => {
            while rest.peek() == Some(&"super") {
                rest.next();
                parts.pop();
            }
        }
        // A path from the crate root (2018 edition: a module of the root is in scope there) or
        // from another crate: taken as written.
        _ => parts.clear(),
    }
    parts.extend(rest);
    parts.join("::")
}

/// A file's module path from its crate root: `src/burn_ext/ctc.rs` and `src/burn_ext/ctc/mod.rs`
/// are `burn_ext::ctc`; `src/lib.rs`, `src/main.rs` and a target's root file are the root (``).
fn module_path(root: &Path, path: &Path) -> String {
    let Some(parts) = package_parts(root, path) else {
        return String::new();
    };
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    // Below `src/` (its `bin/NAME` too), or an example's, test's or bench's own directory.
    let skip = match parts.as_slice() {
        ["src", "bin", _, _, ..] => 3,
        ["src", ..] => 1,
        ["examples" | "tests" | "benches", _, _, ..] => 2,
        _ => return String::new(),
    };
    let mut module: Vec<&str> = parts[skip..].to_vec();
    if let Some(last) = module.pop() {
        let stem = last.trim_end_matches(".rs");
        if !matches!(stem, "mod" | "lib" | "main") {
            module.push(stem);
        }
    }
    module.join("::")
}

/// The names of a file's path below its package's root (`["src", "burn_ext", "ctc.rs"]`); `None`
/// for a file outside it.
fn package_parts(root: &Path, path: &Path) -> Option<Vec<String>> {
    let absolute = crate::walk::absolute_path(path);
    let relative = absolute.strip_prefix(root).ok()?;
    Some(
        relative
            .components()
            .filter_map(|c| match c {
                Component::Normal(part) => part.to_str().map(str::to_string),
                _ => None,
            })
            .collect(),
    )
}

/// The struct names declared in more than one file of the crate.
fn repeated_type_names<'n>(files: &'n [CrateFile<'_>]) -> std::collections::HashSet<&'n str> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut repeated = std::collections::HashSet::new();
    for (fi, file) in files.iter().enumerate() {
        for st in &file.facts.structs {
            match first.get(st.name) {
                None => {
                    first.insert(st.name, fi);
                }
                Some(&other) if other != fi => {
                    repeated.insert(st.name);
                }
                Some(_) => {}
            }
        }
    }
    repeated
}

/// What the crate's call sites, struct literals or returns agree on so far.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    /// Nothing seen yet.
    None,
    /// Every one says this device.
    One(DeviceKind),
    /// They differ, or one is unknown.
    Mixed,
}

impl Seen {
    /// Adds one more observation; true when this changed anything.
    fn join(&mut self, kind: DeviceKind) -> bool {
        let next = match (*self, kind) {
            (_, DeviceKind::Unknown) => Seen::Mixed,
            (Seen::None, k) => Seen::One(k),
            (Seen::One(a), k) if a == k => Seen::One(a),
            _ => Seen::Mixed,
        };
        let changed = next != *self;
        *self = next;
        changed
    }

    /// None while nothing is settled; the device once something is.
    fn settled(self) -> Option<DeviceKind> {
        match self {
            Seen::None => None,
            Seen::One(k) => Some(k),
            Seen::Mixed => Some(DeviceKind::Unknown),
        }
    }
}

/// One value the fixed point of [`CrateAnalysis::resolve_devices`] joins into the tables.
#[derive(Clone, Copy)]
struct DevItem<'a> {
    /// The file and function the value is in.
    fi: usize,
    fn_idx: Option<usize>,
    /// Its device, as the function alone says.
    dev: Dev<'a>,
    /// Where it goes: a slot of the tables ([`SlotIndex`]).
    slot: usize,
}

impl DevItem<'_> {
    /// Whether its device is worked out from the tables (unknown here, with a source to look up).
    fn is_symbolic(&self) -> bool {
        self.dev.kind == DeviceKind::Unknown && self.dev.syms.iter().any(Option::is_some)
    }
}

/// What the packages that call this one pass it: a parameter (global function, index) or a
/// struct field (owner, field), before it has a slot of the tables.
#[derive(Clone, Copy)]
enum DevSlot<'a> {
    Param(usize, usize),
    Field(&'a str, &'a str),
}

/// What is known of a call's return value during one round of the fixed point.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Memo {
    Unvisited,
    Working,
    /// Depends on something not settled yet.
    Pending,
    Settled(DeviceKind),
}

type FastNames = BuildHasherDefault<NameHasher>;

/// Where the fixed point keeps what the crate says of each parameter, struct field and return
/// value: one slot each, in a `Vec<Seen>`.
#[derive(Debug, Default)]
struct SlotIndex {
    /// Per function (global index), and one past the last: the slot of its first typed parameter.
    param_base: Vec<usize>,
    /// The slot of the first function's return value (function `g`'s is `ret_base + g`).
    ret_base: usize,
    /// Per struct, per field the crate sets: its slot (looked up for every symbolic field read:
    /// the fast hasher).
    fields: HashMap<String, HashMap<String, usize, FastNames>, FastNames>,
}

impl SlotIndex {
    /// How many typed parameters function `g` has.
    fn params_of(&self, g: usize) -> usize {
        self.param_base[g + 1] - self.param_base[g]
    }

    /// Parameter `i` of function `g`, when it has one.
    fn param(&self, g: usize, i: usize) -> Option<usize> {
        (i < self.params_of(g)).then(|| self.param_base[g] + i)
    }

    /// Field `field` of struct `owner`, when the crate sets it.
    fn field(&self, owner: &str, field: &str) -> Option<usize> {
        self.fields.get(owner)?.get(field).copied()
    }

    /// Field `field` of struct `owner`, given a new slot (nothing seen) when it has none yet.
    fn field_or_insert(&mut self, owner: &str, field: &str, seen: &mut Vec<Seen>) -> usize {
        // Looked up before inserting: most literals set fields seen already, and an entry would
        // copy the names each time.
        if let Some(slot) = self.field(owner, field) {
            return slot;
        }
        let slot = seen.len();
        seen.push(Seen::None);
        self.fields
            .entry(owner.to_string())
            .or_default()
            .insert(field.to_string(), slot);
        slot
    }

    /// The slot a [`DevSlot`] names.
    fn slot_of(&mut self, slot: DevSlot<'_>, seen: &mut Vec<Seen>) -> usize {
        match slot {
            DevSlot::Param(g, i) => self.param_base[g] + i,
            DevSlot::Field(owner, field) => self.field_or_insert(owner, field, seen),
        }
    }
}

/// What one working-out of an item looks at, kept while it runs: the slots it reads, the memo
/// entries it finds set by the items before it (or unvisited), and those it sets.
#[derive(Default)]
struct Trace {
    /// The working-out under way (counting from 1).
    serial: u32,
    /// Per memo entry: the working-out that last looked at it.
    stamp: Vec<u32>,
    reads: Vec<u32>,
    found: Vec<(u32, Memo)>,
    set: Vec<u32>,
}

impl Trace {
    fn begin(&mut self) {
        self.serial += 1;
        self.reads.clear();
        self.found.clear();
        self.set.clear();
    }

    /// Memo entry `entry` holds `memo` as this working-out first looks at it.
    fn look(&mut self, entry: usize, memo: Memo) {
        if self.stamp[entry] != self.serial {
            self.stamp[entry] = self.serial;
            self.found.push((entry as u32, memo));
        }
    }
}

/// No link, no round: the end of a list of readers, an item not due.
const NO_LINK: u32 = u32::MAX;

/// Most rounds of the crate's device fixed point. Each round joins devices into the tables and
/// never takes one back, so the rounds end by themselves; over the bench corpus and the labelled
/// repositories the longest run is 14 rounds (candle-core: a device handed on through a deep chain
/// of calls), and 8, the bound before, stopped 16 crates before their tables settled. The bound
/// only guards against a pathological crate.
const MAX_DEVICE_ROUNDS: u32 = 64;

/// Where an item's last working-out is kept in the [`TraceLog`], and what it found.
#[derive(Debug, Clone, Copy, Default)]
struct Recorded {
    /// The round it ran in: it read the tables as they were at the start of that round.
    round: u32,
    result: Option<DeviceKind>,
    /// From here in the log's `entries`: the slots it read, then the memo entries it found, then
    /// those it set; from `memo_start` in `memos`: what it found in them, then what it set.
    start: u32,
    memo_start: u32,
    reads: u32,
    found: u32,
    set: u32,
}

/// The working-outs of the items, one after another (a record is never changed once written: a
/// working-out that repeats keeps it, one that does not appends its own).
#[derive(Default)]
struct TraceLog {
    entries: Vec<u32>,
    memos: Vec<Memo>,
}

impl TraceLog {
    /// Keeps the working-out `trace` has just followed, as the item's record.
    fn record(
        &mut self,
        record: &mut Recorded,
        round: u32,
        result: Option<DeviceKind>,
        trace: &Trace,
        memo: &[Memo],
    ) {
        // The log holds a few words per working-out: far below u32::MAX.
        *record = Recorded {
            round,
            result,
            start: self.entries.len() as u32,
            memo_start: self.memos.len() as u32,
            reads: trace.reads.len() as u32,
            found: trace.found.len() as u32,
            set: trace.set.len() as u32,
        };
        self.entries.extend_from_slice(&trace.reads);
        self.entries
            .extend(trace.found.iter().map(|&(entry, _)| entry));
        self.memos.extend(trace.found.iter().map(|&(_, m)| m));
        self.entries.extend_from_slice(&trace.set);
        self.memos
            .extend(trace.set.iter().map(|&entry| memo[entry as usize]));
    }

    /// The slots `record`'s working-out read.
    fn reads(&self, record: &Recorded) -> &[u32] {
        let start = record.start as usize;
        &self.entries[start..start + record.reads as usize]
    }

    /// Whether working the item out again would repeat `record` step by step: no slot it read
    /// has changed since, and every memo entry it found holds what it held then. When so, sets
    /// the memo entries it set as it set them.
    fn holds(&self, record: &Recorded, changed_at: &[u32], memo: &mut [Memo]) -> bool {
        let start = record.start as usize;
        let found_at = start + record.reads as usize;
        let set_at = found_at + record.found as usize;
        let end = set_at + record.set as usize;
        let round = record.round;
        for &slot in &self.entries[start..found_at] {
            if changed_at[slot as usize] > round {
                return false;
            }
        }
        let memo_start = record.memo_start as usize;
        let (found, set) =
            self.memos[memo_start..memo_start + (end - found_at)].split_at(record.found as usize);
        for (&entry, &was) in self.entries[found_at..set_at].iter().zip(found) {
            if memo[entry as usize] != was {
                return false;
            }
        }
        for (&entry, &value) in self.entries[set_at..end].iter().zip(set) {
            memo[entry as usize] = value;
        }
        true
    }
}

/// Resolves symbolic devices against the tables.
struct Resolver<'r, 'f, 't> {
    files: &'r [CrateFile<'f>],
    offsets: &'r [usize],
    slots: &'r SlotIndex,
    /// Per slot, what the crate says so far.
    seen: &'r [Seen],
    /// What each call returns, once worked out against these tables: per call of the crate.
    calls: &'r std::cell::RefCell<Vec<Memo>>,
    /// Per file: the index of its first call in `calls`.
    call_base: &'r [usize],
    /// A call's resolved targets, and (when there are none) the crate's methods of its name.
    value_targets: &'r dyn Fn(usize, usize) -> (Cow<'t, [GlobalFn]>, &'t [GlobalFn]),
    /// When set, what the working-out looks at is noted there.
    trace: Option<&'r std::cell::RefCell<Trace>>,
}

impl Resolver<'_, '_, '_> {
    /// What slot `slot` says.
    fn read(&self, slot: usize) -> Seen {
        if let Some(trace) = self.trace {
            trace.borrow_mut().reads.push(slot as u32);
        }
        self.seen[slot]
    }

    /// The device of `dev` in function `fn_idx` of file `fi`: Some(kind) when settled (Unknown
    /// included), None while a source it depends on is not settled yet.
    fn dev(
        &self,
        fi: usize,
        fn_idx: Option<usize>,
        dev: Dev<'_>,
        depth: usize,
    ) -> Option<DeviceKind> {
        if dev.kind != DeviceKind::Unknown {
            return Some(dev.kind);
        }
        let mut pending = false;
        let mut out = DeviceKind::Unknown;
        for sym in dev.syms.into_iter().flatten() {
            match self.sym(fi, fn_idx, sym, depth) {
                Some(DeviceKind::Gpu) => return Some(DeviceKind::Gpu),
                Some(DeviceKind::Cpu) => out = DeviceKind::Cpu,
                Some(DeviceKind::Unknown) => {}
                None => pending = true,
            }
        }
        if out == DeviceKind::Unknown && pending {
            return None;
        }
        Some(out)
    }

    fn sym(
        &self,
        fi: usize,
        fn_idx: Option<usize>,
        sym: DevSym<'_>,
        depth: usize,
    ) -> Option<DeviceKind> {
        // Chains of calls are followed this far; deeper is unknown.
        if depth > 24 {
            return Some(DeviceKind::Unknown);
        }
        match sym {
            DevSym::Param(i) => {
                let g = self.offsets[fi] + fn_idx?;
                self.slots
                    .param(g, i)
                    .map_or(Seen::Mixed, |slot| self.read(slot))
                    .settled()
            }
            DevSym::Field(owner, field) => self
                .slots
                .field(owner, field)
                .map_or(Seen::Mixed, |slot| self.read(slot))
                .settled(),
            DevSym::RetField(ci, field) => self.ret_field(fi, ci, field, depth),
            DevSym::Ret(ci) => {
                if ci >= self.files[fi].facts.calls.len() {
                    return self.ret(fi, ci, depth);
                }
                let entry = self.call_base[fi] + ci;
                let known = self.calls.borrow()[entry];
                if let Some(trace) = self.trace {
                    trace.borrow_mut().look(entry, known);
                }
                match known {
                    Memo::Unvisited => {}
                    // A cycle through this call while it is being worked out: unknown.
                    Memo::Working => return Some(DeviceKind::Unknown),
                    Memo::Pending => return None,
                    Memo::Settled(kind) => return Some(kind),
                }
                self.calls.borrow_mut()[entry] = Memo::Working;
                if let Some(trace) = self.trace {
                    trace.borrow_mut().set.push(entry as u32);
                }
                let found = self.ret(fi, ci, depth);
                self.calls.borrow_mut()[entry] = found.map_or(Memo::Pending, Memo::Settled);
                found
            }
        }
    }

    /// Field `field` of what call `ci` of file `fi` returns: the values the called functions
    /// store in fields of that name in the struct literals they build, else what the crate's
    /// literals store in that field of the declared return type.
    fn ret_field(&self, fi: usize, ci: usize, field: &str, depth: usize) -> Option<DeviceKind> {
        let (resolved, by_name) = (self.value_targets)(fi, ci);
        let found: &[GlobalFn] = if resolved.is_empty() {
            by_name
        } else {
            &resolved
        };
        let mut seen = Seen::None;
        for &(tf, tidx) in found {
            let facts = &self.files[tf].facts;
            let mut built = false;
            for init in &facts.field_inits {
                if init.fn_idx != Some(tidx) || init.field != field {
                    continue;
                }
                built = true;
                seen.join(self.dev(tf, init.fn_idx, init.dev, depth + 1)?);
            }
            if built {
                continue;
            }
            let declared = match &facts.fns[tidx].sig.output {
                syn::ReturnType::Type(_, ty) => returned_type_name(ty),
                syn::ReturnType::Default => None,
            };
            match declared
                .and_then(|ty| self.slots.field(&ty, field))
                .map(|slot| self.read(slot))
            {
                Some(Seen::None) => return None,
                Some(Seen::One(kind)) => {
                    seen.join(kind);
                }
                _ => {
                    seen.join(DeviceKind::Unknown);
                }
            }
        }
        Some(seen.settled().unwrap_or(DeviceKind::Unknown))
    }

    /// What call `ci` of file `fi` returns.
    fn ret(&self, fi: usize, ci: usize, depth: usize) -> Option<DeviceKind> {
        {
            {
                let call = self.files[fi].facts.calls.get(ci)?;
                // Where the call's receiver and arguments live (for a call outside the crate,
                // where its result lives).
                let from_operands = self.dev(fi, call.fn_idx, call.operand, depth + 1);
                let (resolved, by_name) = (self.value_targets)(fi, ci);
                // A method the crate defines on several types, with an unknown receiver: its
                // operands speak first (`t.mul(..)` on a tensor), the crate's methods after.
                if !by_name.is_empty()
                    && matches!(from_operands, Some(k) if k != DeviceKind::Unknown)
                {
                    return from_operands;
                }
                let found: &[GlobalFn] = if resolved.is_empty() {
                    by_name
                } else {
                    &resolved
                };
                if found.is_empty() {
                    return from_operands;
                }
                let mut seen = Seen::None;
                for &(tf, tidx) in found {
                    match self.read(self.slots.ret_base + self.offsets[tf] + tidx) {
                        Seen::None => return None,
                        Seen::One(k) => {
                            seen.join(k);
                        }
                        Seen::Mixed => {
                            seen.join(DeviceKind::Unknown);
                        }
                    }
                }
                match seen.settled() {
                    Some(DeviceKind::Unknown) => from_operands,
                    other => other,
                }
            }
        }
    }
}
