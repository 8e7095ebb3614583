//! PK301 `loader-without-workers`: a burn data loader that builds batches on the training thread.

use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Expr, ExprCall, ExprMethodCall};

use crate::analysis::{CallRef, CrateContext, FileId, FnFact};
#[allow(unused_imports)]
use crate::python::prelude::*;
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a burn `DataLoaderBuilder` that is built with fewer than two worker threads.
    ///
    /// That is: no `num_workers(..)` call in the chain, or `num_workers(0)` / `num_workers(1)`.
    ///
    /// The chain is followed through `let` bindings in the same block
    /// (`let b = DataLoaderBuilder::new(batcher); let b = b.batch_size(64); b.build(dataset)`).
    /// A worker count that is not a literal (`num_workers(config.num_workers)`) is trusted, and a
    /// builder that is returned or passed on before `build` is not judged (its caller decides).
    ///
    /// ## Why is this bad?
    /// Without workers, burn's loader loads items, runs the batcher and uploads the batch on the
    /// thread that drives the training step, so the accelerator idles while the next batch is
    /// prepared. With `num_workers(n)` the batches are produced by `n` background threads and are
    /// ready when the step asks for them; one worker overlaps loading with compute but cannot keep up
    /// when a batch takes longer to prepare than a step takes to run. It is the Rust form of
    /// PyTorch's `DataLoader(num_workers=...)` advice.
    ///
    /// ## Example
    /// ```rust,ignore
    /// let loader = DataLoaderBuilder::new(batcher)
    ///     .batch_size(64)
    ///     .shuffle(42)
    ///     .build(dataset);
    /// ```
    ///
    /// Use instead:
    /// ```rust,ignore
    /// let loader = DataLoaderBuilder::new(batcher)
    ///     .batch_size(64)
    ///     .shuffle(42)
    ///     .num_workers(8)
    ///     .build(dataset);
    /// ```
    ///
    /// ## Python
    /// Python (PyTorch, Lightning): flags a `DataLoader` without `num_workers`, or with
    /// `num_workers=0`, unless its dataset is already in memory (a `TensorDataset`, or a dataset
    /// class of the package whose `__getitem__` only indexes what it holds). An evaluation loader
    /// (`shuffle=False` without a sampler and not named for training, bound to a name such as
    /// `test_loader` or `val_loader`, built in a function such as `evaluate` or `eval_split`, or
    /// iterated only by loops that make no training step, such as one generating images with an
    /// inference pipeline) is reported as a note: it slows evaluation, not the training step. A class of the package's own named like a loader
    /// (`class DistributedDataLoader:` reading token shards) is not a `DataLoader` unless it
    /// derives from one.
    ///
    /// ```python
    /// loader = DataLoader(dataset, batch_size=64, shuffle=True)
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8,
    ///                     persistent_workers=True, pin_memory=True)
    /// ```
    pub LoaderWithoutWorkers {
        code: "PK301",
        name: "loader-without-workers",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for LoaderWithoutWorkers {
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        check_python(cx, out);
    }

    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) {
        // A crate that trains nothing (a data viewer, an exporter) loads batches for no step:
        // its loaders' threads are its own business.
        if !crate_trains(cx) {
            return;
        }
        for chain in loader_chains(cx) {
            match chain.method_args("num_workers") {
                None => out.push(Finding::new(
                    chain.file,
                    chain.region_of_new(cx),
                    "data loader is built without worker threads",
                    "add `.num_workers(n)` (e.g. the number of CPU cores) so batches are prepared \
                     in the background while the step runs",
                )),
                Some((method, args)) => {
                    let literal = args.first().and_then(int_literal);
                    // `.num_workers(config.num_workers)`: the configuration's own default
                    // (`#[config(default = 1)]`), when the crate declares one.
                    let configured = match literal {
                        Some(_) => None,
                        None => args.first().and_then(|arg| configured_default(cx, arg)),
                    };
                    let Some(n) = literal.or(configured.as_ref().map(|c| c.value)) else {
                        // Not a literal, nor a field with a default: trust the configuration.
                        continue;
                    };
                    if n > 1 {
                        continue;
                    }
                    let message = if n == 0 {
                        "data loader is built with `num_workers(0)`: batches are prepared on the \
                         training thread"
                    } else {
                        "data loader is built with a single worker thread"
                    };
                    let mut finding = Finding::new(
                        chain.file,
                        cx.region(method.span()),
                        message,
                        "use several workers (e.g. `num_workers(8)` or the number of CPU cores) so \
                         batches are ready when the step asks for them",
                    );
                    if let Some(c) = configured {
                        finding = finding.with_note(format!(
                            "the worker count is the configuration's `{}`, whose default is {} \
                             (declared at {})",
                            c.field, c.value, c.at
                        ));
                    }
                    out.push(finding);
                }
            }
        }
    }
}

/// A configuration field's declared default (`#[config(default = 1)] pub num_workers: usize`).
struct ConfiguredDefault {
    field: String,
    value: u64,
    /// `path:line` of the default.
    at: String,
}

/// The default of the configuration field a worker-count argument reads (`config.num_workers`,
/// `self.config.workers`): the crate's struct fields of that name with an integer default
/// attribute, when they all agree.
fn configured_default(cx: &CrateContext<'_>, arg: &Expr) -> Option<ConfiguredDefault> {
    let Expr::Field(field) = arg else {
        return None;
    };
    let syn::Member::Named(name) = &field.member else {
        return None;
    };
    let mut found: Option<ConfiguredDefault> = None;
    for file in cx.files() {
        for item in &file.ast().items {
            let syn::Item::Struct(st) = item else {
                continue;
            };
            for f in &st.fields {
                if f.ident.as_ref() != Some(name) {
                    continue;
                }
                let Some((span, value)) = f.attrs.iter().find_map(super::pk502::attr_default)
                else {
                    continue;
                };
                let at = format!("{}:{}", file.path().display(), cx.region(span).line);
                match &found {
                    Some(other) if other.value != value => return None,
                    Some(_) => {}
                    None => {
                        found = Some(ConfiguredDefault {
                            field: name.to_string(),
                            value,
                            at,
                        });
                    }
                }
            }
        }
    }
    found
}

/// Whether the crate trains: one of its functions makes a training step (a step marker in it or
/// in what it calls), or it hands a model to burn's learner (`LearnerBuilder::new`,
/// `SupervisedTraining::new`).
fn crate_trains(cx: &CrateContext<'_>) -> bool {
    cx.files().iter().any(|file| {
        (0..file.facts.fns.len()).any(|f| !file.facts.fns[f].is_test && cx.trains(file.id, f))
    }) || cx.calls().any(|(_, call)| {
        !call.in_test
            && call.name == "new"
            && call
                .call
                .qualifier()
                .is_some_and(|q| q == "LearnerBuilder" || q == "SupervisedTraining")
    })
}

/// The value of an integer literal expression (`0`, `8usize`).
pub(super) fn int_literal(expr: &Expr) -> Option<u64> {
    match expr {
        Expr::Lit(l) => match &l.lit {
            syn::Lit::Int(i) => i.base10_parse::<u64>().ok(),
            _ => None,
        },
        Expr::Paren(p) => int_literal(&p.expr),
        Expr::Group(g) => int_literal(&g.expr),
        _ => None,
    }
}

/// A finished `DataLoaderBuilder` chain: `DataLoaderBuilder::new(..)` and every method called on the
/// builder up to `build(..)`, possibly across `let` bindings.
pub(super) struct LoaderChain<'a> {
    /// File of the chain.
    pub file: FileId,
    /// The `DataLoaderBuilder::new` path.
    pub new_path: &'a syn::Path,
    /// Methods called on the builder, in order, with their arguments.
    pub methods: Vec<&'a ExprMethodCall>,
}

impl<'a> LoaderChain<'a> {
    /// The last call of `name` on the builder: its method name and arguments.
    pub fn method_args(
        &self,
        name: &str,
    ) -> Option<(
        &'a syn::Ident,
        &'a syn::punctuated::Punctuated<Expr, syn::Token![,]>,
    )> {
        self.methods
            .iter()
            .rev()
            .find(|m| m.method == name)
            .map(|m| (&m.method, &m.args))
    }

    /// Where findings about the whole chain point: `DataLoaderBuilder::new`.
    pub fn region_of_new(&self, cx: &CrateContext<'_>) -> crate::Region {
        cx.region_of(self.new_path)
    }
}

/// Every finished data-loader chain of the crate outside test code.
pub(super) fn loader_chains<'a>(cx: &CrateContext<'a>) -> Vec<LoaderChain<'a>> {
    let mut chains = Vec::new();
    for crate_file in cx.files() {
        let facts = &crate_file.facts;
        let mut walked = vec![false; facts.fns.len()];
        for call in &facts.calls {
            let CallRef::Path(_, path) = call.call else {
                continue;
            };
            if call.in_test || !is_builder_new(path) {
                continue;
            }
            // A builder outside any function (a `static` initializer) has nothing to follow.
            let Some(f) = call.fn_idx else {
                continue;
            };
            if std::mem::replace(&mut walked[f], true) {
                continue;
            }
            collect_in_fn(crate_file.id, &facts.fns[f], &mut chains);
        }
    }
    chains
}

fn is_builder_new(path: &syn::Path) -> bool {
    let n = path.segments.len();
    n >= 2
        && path.segments[n - 1].ident == "new"
        && path.segments[n - 2].ident == "DataLoaderBuilder"
}

fn collect_in_fn<'a>(file: FileId, fn_fact: &FnFact<'a>, chains: &mut Vec<LoaderChain<'a>>) {
    let mut walker = ChainWalker {
        file,
        chains,
        claimed: Vec::new(),
    };
    walker.visit_block(fn_fact.block);
}

struct ChainWalker<'c, 'a> {
    file: FileId,
    chains: &'c mut Vec<LoaderChain<'a>>,
    /// `DataLoaderBuilder::new` calls already part of a chain (by span start).
    claimed: Vec<usize>,
}

/// A method chain unrolled: its root expression and the method calls on it, innermost first.
fn unroll(expr: &Expr) -> (&Expr, Vec<&ExprMethodCall>) {
    let mut methods = Vec::new();
    let mut cur = expr;
    loop {
        match cur {
            Expr::MethodCall(m) => {
                methods.push(m);
                cur = &m.receiver;
            }
            Expr::Paren(p) => cur = &p.expr,
            Expr::Group(g) => cur = &g.expr,
            _ => break,
        }
    }
    methods.reverse();
    (cur, methods)
}

fn builder_new_call(expr: &Expr) -> Option<(&ExprCall, &syn::Path)> {
    let Expr::Call(c) = expr else {
        return None;
    };
    let Expr::Path(p) = &*c.func else {
        return None;
    };
    is_builder_new(&p.path).then_some((c, &p.path))
}

fn root_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(ToString::to_string),
        _ => None,
    }
}

fn let_name(pat: &syn::Pat) -> Option<String> {
    match pat {
        syn::Pat::Ident(p) if p.subpat.is_none() => Some(p.ident.to_string()),
        syn::Pat::Type(t) => let_name(&t.pat),
        _ => None,
    }
}

/// The expression of a statement that could continue a chain: a `let` initializer or an
/// expression statement, with the name the `let` binds.
fn stmt_expr(stmt: &syn::Stmt) -> Option<(Option<String>, &Expr)> {
    match stmt {
        syn::Stmt::Local(local) => {
            let init = local.init.as_ref()?;
            Some((let_name(&local.pat), &init.expr))
        }
        syn::Stmt::Expr(expr, _) => Some((None, expr)),
        _ => None,
    }
}

impl<'a> ChainWalker<'_, 'a> {
    /// The path of `root` when it is a `DataLoaderBuilder::new` call no chain has claimed yet;
    /// claims it.
    fn claim(&mut self, root: &'a Expr) -> Option<&'a syn::Path> {
        let (call, path) = builder_new_call(root)?;
        let at = call.span().byte_range().start;
        if self.claimed.contains(&at) {
            return None;
        }
        self.claimed.push(at);
        Some(path)
    }

    /// Follows a chain rooted at `DataLoaderBuilder::new` from statement `i` of `stmts`.
    fn follow(&mut self, stmts: &'a [syn::Stmt], i: usize, start: &'a Expr) {
        let (root, methods) = unroll(strip_try(start));
        let Some(path) = self.claim(root) else {
            return;
        };
        let mut all: Vec<&'a ExprMethodCall> = methods;
        if all.last().is_some_and(|m| m.method == "build") {
            self.chains.push(LoaderChain {
                file: self.file,
                new_path: path,
                methods: all,
            });
            return;
        }
        // Not built in this expression: follow the binding it is stored in.
        let Some((Some(mut name), _)) = stmt_expr(&stmts[i]) else {
            return;
        };
        for stmt in &stmts[i + 1..] {
            let Some((bound, expr)) = stmt_expr(stmt) else {
                continue;
            };
            let (root, methods) = unroll(strip_try(expr));
            if root_name(root).as_deref() != Some(name.as_str()) || methods.is_empty() {
                // The binding is rebound to something else: stop following it.
                if bound.as_deref() == Some(name.as_str()) {
                    return;
                }
                continue;
            }
            all.extend(methods);
            if all.last().is_some_and(|m| m.method == "build") {
                self.chains.push(LoaderChain {
                    file: self.file,
                    new_path: path,
                    methods: all,
                });
                return;
            }
            match bound {
                Some(next) => name = next,
                // Used without being stored or built (passed on): not judged.
                None => return,
            }
        }
    }
}

fn strip_try(expr: &Expr) -> &Expr {
    match expr {
        Expr::Try(t) => strip_try(&t.expr),
        _ => expr,
    }
}

impl<'a> Visit<'a> for ChainWalker<'_, 'a> {
    fn visit_block(&mut self, block: &'a syn::Block) {
        for (i, stmt) in block.stmts.iter().enumerate() {
            if let Some((_, expr)) = stmt_expr(stmt) {
                self.follow(&block.stmts, i, expr);
            }
        }
        visit::visit_block(self, block);
    }

    fn visit_expr_method_call(&mut self, m: &'a ExprMethodCall) {
        // A chain nested in a larger expression (`Arc::new(DataLoaderBuilder::new(b)...build(d))`,
        // a closure's body): judged when it ends in `build`.
        if m.method == "build" {
            self.follow_nested(m);
        }
        visit::visit_expr_method_call(self, m);
    }

    // Nested functions are walked on their own turn.
    fn visit_item_fn(&mut self, _item: &'a syn::ItemFn) {}
    fn visit_item_impl(&mut self, _item: &'a syn::ItemImpl) {}
}

impl<'a> ChainWalker<'_, 'a> {
    fn follow_nested(&mut self, build: &'a ExprMethodCall) {
        let (root, mut methods) = unroll(&build.receiver);
        methods.push(build);
        let Some(path) = self.claim(root) else {
            return;
        };
        self.chains.push(LoaderChain {
            file: self.file,
            new_path: path,
            methods,
        });
    }
}

/// PK301's Python form: `DataLoader(..)` without `num_workers`, or with `num_workers=0`, unless it
/// serves an in-memory `TensorDataset`.
fn check_python(cx: &PyContext<'_>, out: &mut Vec<Finding>) {
    for (file, call) in cx.calls_named_ending(&["DataLoader"]) {
        if call.in_test
            || !call
                .path
                .as_deref()
                .is_some_and(|p| p.ends_with("DataLoader"))
        {
            continue;
        }
        if !cx.builds_torch_data_loader(call) {
            continue;
        }
        let workers = python_keyword(call.call, "num_workers");
        let zero = match workers {
            None if call.has_double_star() => continue,
            None => None,
            Some(PyExpr::NumberLiteral(n))
                if n.value.as_int().and_then(|i| i.as_u64()) == Some(0) =>
            {
                Some(())
            }
            // `num_workers=args.workers`: configurable.
            Some(_) => continue,
        };
        let dataset = call
            .call
            .arguments
            .args
            .first()
            .or_else(|| python_keyword(call.call, "dataset"));
        if dataset.is_some_and(|d| in_memory_dataset(cx, file, call, d)) {
            continue;
        }
        let message = if zero.is_some() {
            "`DataLoader` with `num_workers=0` loads every batch in the training process"
        } else {
            "`DataLoader` without `num_workers` loads every batch in the training process"
        };
        let mut finding = cx.finding(
            file,
            PyContext::callee_range(call),
            message,
            "set `num_workers` (e.g. the number of CPU cores per GPU) and `persistent_workers=True`",
        );
        if let Some(why) = evaluation_loader(cx, file, call) {
            finding.lowered = true;
            finding.notes.push(format!(
                "{why}: it feeds evaluation, not the training step, so this is a note"
            ));
        }
        out.push(finding);
    }
}

/// Whether a `DataLoader(..)` is built with `shuffle=False` (the order of an evaluation pass).
pub(crate) fn shuffle_off(call: &PyCall<'_>) -> bool {
    matches!(call.keyword("shuffle"), Some(PyExpr::BooleanLiteral(b)) if !b.value)
}

/// Why a `DataLoader(..)` looks like an evaluation loader, if it does: `shuffle=False` with no
/// sampler, built in a program that trains nothing, or bound to a name such as `test_loader`,
/// `val_loader`, `eval_dl`, `testloader`.
pub(crate) fn evaluation_loader(
    cx: &PyContext<'_>,
    file: usize,
    call: &PyCall<'_>,
) -> Option<String> {
    // A loader whose own function iterates it in a step loop feeds training, however it is
    // built or named.
    if feeds_step(cx, file, call) {
        return None;
    }
    let unshuffled = shuffle_off(call)
        && call.keyword("sampler").is_none()
        && call.keyword("batch_sampler").is_none();
    // `train_dataloader = DataLoader(.., shuffle=False)`: training data in a fixed order (packed
    // sequences, a sampler applied later), named for what it feeds.
    let named_for_training =
        bound_name(cx, file, call).is_some_and(python_names::is_training_data_name);
    if unshuffled && !named_for_training {
        return Some("the loader is built with `shuffle=False` and no sampler".to_string());
    }
    // In a program that trains nothing, a loader its own top-level code builds, or one iterated
    // where it is built, feeds inference; one a function returns may feed a trainer elsewhere.
    if super::pk502::program_trains_nothing(cx, file)
        && (call.fn_idx.is_none() || iterated_where_built(cx, file, call))
    {
        return Some(
            "the loader is built for a program that trains nothing (no step loop, optimizer or \
             `fit` in reach)"
                .to_string(),
        );
    }
    if let Some(line) = feeds_no_step(cx, file, call) {
        return Some(format!(
            "the loader is iterated only by the loop at line {line}, which makes no training \
             step"
        ));
    }
    let facts = &cx.units[file].facts;
    if let Some(function) = call.fn_idx.map(|f| facts.fns[f].name)
        && python_names::is_evaluation_name(function)
    {
        return Some(format!("the loader is built in `{function}`"));
    }
    let name = bound_name(cx, file, call)?;
    python_names::is_evaluation_name(name).then(|| format!("the loader is bound to `{name}`"))
}

/// The name a `DataLoader(..)` call's value is bound to, where it is built.
fn bound_name<'a>(cx: &PyContext<'a>, file: usize, call: &PyCall<'_>) -> Option<&'a str> {
    let range = call.call.range();
    cx.units[file]
        .facts
        .assigns
        .iter()
        .find(|a| !a.loop_target && a.value.range() == range)
        .map(|a| a.name.as_ref())
}

/// Whether an expression's text names `name` as a word (`tqdm(loader, desc=..)`).
fn mentions_word(source: &str, expr: &PyExpr, name: &str) -> bool {
    source[expr.range().start().to_usize()..expr.range().end().to_usize()]
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|word| word == name)
}

/// Whether a loop of the function that builds a loader iterates it (by the name it is bound to)
/// and is a step loop (an epoch loop around one included), or runs inside a step loop's body.
fn feeds_step(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> bool {
    let unit = &cx.units[file];
    let facts = &unit.facts;
    let (Some(name), Some(f)) = (bound_name(cx, file, call), call.fn_idx) else {
        return false;
    };
    facts.loops.iter().enumerate().any(|(l, lp)| {
        lp.fn_idx == Some(f)
            && lp.range.start().to_usize() > call.start
            && lp
                .iter
                .is_some_and(|iter| mentions_word(&unit.file.source, iter, name))
            && (cx.is_step_loop(file, l)
                || std::iter::successors(facts.loops[l].parent, |&i| facts.loops[i].parent)
                    .any(|i| cx.is_step_loop(file, i) && !cx.is_outer_loop(file, i)))
    })
}

/// The line of the loop a loader feeds, when every loop of its function that iterates it makes no
/// training step, runs around none, sits in none and calls nothing named for training (a loop
/// generating class images with an inference pipeline, an evaluation pass), and the loader goes
/// nowhere else: not returned, not
/// stored under another name, not passed to a call other than an iteration helper (`tqdm`,
/// `enumerate`, `accelerator.prepare`, ...). A loader handed to a trainer feeds its steps.
fn feeds_no_step(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> Option<usize> {
    const PASS_THROUGH: &[&str] = &[
        "tqdm",
        "trange",
        "enumerate",
        "iter",
        "len",
        "zip",
        "prepare",
        "print",
    ];
    let unit = &cx.units[file];
    let facts = &unit.facts;
    let source = unit.file.source.as_str();
    let name = bound_name(cx, file, call)?;
    let f = call.fn_idx?;
    let mut first = None;
    for (l, lp) in facts.loops.iter().enumerate() {
        if lp.fn_idx != Some(f)
            || lp.range.start().to_usize() <= call.start
            || !lp
                .iter
                .is_some_and(|iter| mentions_word(source, iter, name))
        {
            continue;
        }
        let mut at = Some(l);
        while let Some(i) = at {
            if cx.is_step_loop(file, i) || cx.is_outer_loop(file, i) {
                return None;
            }
            at = facts.loops[i].parent;
        }
        // A step the analysis cannot see (a JAX `p_train_step(state, batch)`) is still named
        // for training.
        if facts.calls.iter().any(|c| {
            c.loops.contains(&l)
                && c.method
                    .or(c.func_name)
                    .or_else(|| c.path.as_deref().map(|p| p.rsplit('.').next().unwrap_or(p)))
                    .is_some_and(super::pk502::names_training)
        }) {
            return None;
        }
        first.get_or_insert(unit.file.line_of(lp.range.start().to_usize()));
    }
    let line = first?;
    let is_name = |e: &PyExpr| matches!(e, PyExpr::Name(n) if n.id.as_str() == name);
    if facts.fns[f]
        .returns()
        .iter()
        .any(|r| mentions_word(source, r, name))
    {
        return None;
    }
    let stored_elsewhere = facts
        .assigns
        .iter()
        .any(|a| a.fn_idx == Some(f) && !a.loop_target && a.name != name && is_name(a.value));
    let passed_on = facts.calls.iter().any(|c| {
        c.fn_idx == Some(f)
            && c.start > call.start
            && !c
                .method
                .or(c.func_name)
                .is_some_and(|n| PASS_THROUGH.contains(&n))
            && (c.call.arguments.args.iter().any(is_name)
                || c.call.arguments.keywords.iter().any(|k| is_name(&k.value)))
    });
    (!stored_elsewhere && !passed_on).then_some(line)
}

/// Whether the loader `call` builds is bound to a name that a loop of the same function
/// iterates (`dloader = DataLoader(..)`, then `for batch in tqdm(dloader):`): the program uses it
/// itself. A loader a function returns (a data module's `get_data()` with a small `__main__`
/// self-test) goes to whoever imports it, which may train.
fn iterated_where_built(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>) -> bool {
    let facts = &cx.units[file].facts;
    let Some(name) = bound_name(cx, file, call) else {
        return false;
    };
    let text = &cx.file(file).source;
    facts.loops.iter().any(|lp| {
        lp.fn_idx == call.fn_idx
            && lp.range.start().to_usize() > call.start
            && lp.iter.is_some_and(|iter| mentions_word(text, iter, name))
    })
}

/// A dataset already in memory, which workers would only copy: a `TensorDataset`, or a dataset
/// class of the package whose `__getitem__` only indexes what it holds (`return self.data[i]`,
/// slices of a token tensor): it returns a value, indexes an attribute of `self`, and calls
/// nothing but `len`, `int`, `min`, `max`, `range` or `slice`.
fn in_memory_dataset(cx: &PyContext<'_>, file: usize, call: &PyCall<'_>, dataset: &PyExpr) -> bool {
    const PLAIN: &[&str] = &["len", "int", "min", "max", "range", "slice"];
    let path = match dataset {
        PyExpr::Call(c) => facts::dotted(&c.func),
        other => cx.bound_call(file, call.fn_idx, other, call.start),
    };
    let Some(path) = path else {
        return false;
    };
    if path.ends_with("TensorDataset") {
        return true;
    }
    let class = path.rsplit('.').next().unwrap_or(&path);
    let mut found = false;
    for unit in cx.units {
        for (i, f) in unit.facts.fns.iter().enumerate() {
            if f.class != Some(class) || f.name != "__getitem__" {
                continue;
            }
            let calls_something =
                unit.facts.calls.iter().any(|c| {
                    c.fn_idx == Some(i) && !c.func_name.is_some_and(|n| PLAIN.contains(&n))
                });
            // It must read what it holds (`self.data[i]`) and return it: a `__getitem__` still to
            // be written (`pass`) is no evidence.
            let text = unit.file.text(f.range);
            let indexes_itself = text.match_indices("self.").any(|(at, _)| {
                let rest = &text[at + 5..];
                let name = rest
                    .bytes()
                    .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                    .count();
                name > 0 && rest[name..].starts_with('[')
            });
            if calls_something || !indexes_itself || f.returns().is_empty() {
                return false;
            }
            found = true;
        }
    }
    found
}
