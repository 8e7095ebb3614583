//! Lowering a Python module into facts: functions, loops, calls and bindings, each with the context
//! it runs in (function, enclosing loops, `% N` guards, `torch.no_grad()`, test code).

use std::borrow::Cow;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use ruff_python_ast::helpers::ReturnStatementVisitor;
use ruff_python_ast::visitor::{self, Visitor};
use ruff_python_ast::{CmpOp, Expr, ExprCall, Operator, Stmt, StmtFunctionDef};
use ruff_text_size::{Ranged, TextRange};

use super::PyFile;

/// A function or method.
#[derive(Debug)]
pub struct PyFn<'a> {
    pub name: &'a str,
    /// The class it is defined in (directly).
    pub class: Option<&'a str>,
    pub range: TextRange,
    /// The range of its name.
    pub name_range: TextRange,
    /// A test (`test_*`) or in a test file, or in a test class.
    pub in_test: bool,
    /// Lightning's `training_step` / `on_train_batch_*`: runs once per step.
    pub step_body: bool,
    /// A generator (`yield` in its own body): each `next(..)` of it, or each iteration of a loop
    /// over it, runs its body up to the next `yield`.
    pub generator: bool,
    /// Its definition, for what few rules ask of it ([`PyFn::returns`], [`PyFn::params`]):
    /// read when asked, not listed for every function of the package.
    def: &'a StmtFunctionDef,
}

impl<'a> PyFn<'a> {
    /// What it returns (for helpers that build tensors): the values of its `return` statements,
    /// not those of the functions and classes defined inside it.
    pub fn returns(&self) -> Vec<&'a Expr> {
        let mut visitor = ReturnStatementVisitor::default();
        for stmt in &self.def.body {
            visitor.visit_stmt(stmt);
        }
        visitor
            .returns
            .into_iter()
            .filter_map(|ret| ret.value.as_deref())
            .collect()
    }

    /// Whether one of its parameters (`*args` and `**kwargs` included) is named `name`.
    pub fn has_param(&self, name: &str) -> bool {
        let params = &self.def.parameters;
        params
            .posonlyargs
            .iter()
            .chain(&params.args)
            .chain(&params.kwonlyargs)
            .any(|p| p.parameter.name.as_str() == name)
            || params
                .vararg
                .iter()
                .chain(&params.kwarg)
                .any(|p| p.name.as_str() == name)
    }

    /// Its parameters in order: name, default, and whether it may be passed by position.
    pub fn params(&self) -> Vec<(&'a str, Option<&'a Expr>, bool)> {
        parameters(&self.def.parameters)
    }
}

/// A `for` or `while` loop (comprehensions are not loops here).
#[derive(Debug)]
pub struct PyLoop<'a> {
    pub range: TextRange,
    pub fn_idx: Option<usize>,
    /// The loop directly around this one (same function).
    pub parent: Option<usize>,
    /// The iterated expression of a `for`.
    pub iter: Option<&'a Expr>,
    /// Where the body starts.
    pub body_start: usize,
}

/// A call, with where it runs.
#[derive(Debug)]
pub struct PyCall<'a> {
    pub call: &'a ExprCall,
    /// Start offset of the call.
    pub start: usize,
    /// Dotted callee (`torch.cuda.synchronize`, `loss.item`, `self.log`), if the callee is a name or
    /// an attribute chain over names (borrowed from the source where it is written plainly).
    pub path: Option<Cow<'a, str>>,
    /// The method name when the callee is an attribute (`item` of `loss.item()`).
    pub method: Option<&'a str>,
    /// What the method is called on.
    pub receiver: Option<&'a Expr>,
    /// The function name when the callee is a plain name (`float` of `float(t)`).
    pub func_name: Option<&'a str>,
    pub fn_idx: Option<usize>,
    /// Enclosing loops, outermost first (shared by the facts of one loop nest).
    pub loops: Rc<[usize]>,
    /// The number of loops around the innermost `if step % N == 0` guard around the call.
    pub guard: Option<u32>,
    /// Under a branch that only the first iterations of a loop take (`if step == 0:`,
    /// `if i < 3:`, on the loop's counter or a value computed from it): the position of that
    /// loop in [`PyCall::loops`].
    pub bounded: Option<u32>,
    /// Inside a block that ends by leaving (see [`leaving_block`]): `Some(0)` when it leaves the
    /// program or unwinds (`raise`, `sys.exit(..)`), `Some(n)` when it `break`s out of the loop
    /// `loops[n - 1]`. Such a block runs once, not on every iteration.
    pub leaves: Option<u32>,
    /// The test of the innermost branch `if name == literal:` (or `elif`) of its function around
    /// the call (see [`PyCall::branch`]).
    branch_test: Option<&'a Expr>,
    /// Under `torch.no_grad()` / `torch.inference_mode()`.
    pub no_grad: bool,
    pub in_test: bool,
    /// Inside a list/set/dict comprehension or generator expression.
    pub in_comprehension: bool,
    /// A positional argument or a keyword's value is a number literal (`.cuda(0)`, `batch_size=8`).
    /// Recorded while the tree is in cache, so that the rules need not read the arguments of
    /// every call of the package to find the few with literals.
    pub number_arg: bool,
    /// A positional argument or a keyword's value is a string literal (`"cuda:0"`, `strategy="dp"`).
    pub string_arg: bool,
    /// The call formats values into text: an argument is an f-string or a `%`-formatting of a
    /// string (`print(f"loss {loss}")`, `log("%.3f" % loss)`), or the call is `"..".format(..)`.
    pub formats: bool,
}

impl<'a> PyCall<'a> {
    /// The innermost branch `if name == literal:` (or `elif`) of its function around the call,
    /// as (name, literal).
    pub fn branch(&self) -> Option<(&'a str, &'a Expr)> {
        self.branch_test.and_then(equality_branch)
    }

    /// A short name for notes: `train_one_epoch`, `self.log`.
    pub fn display_name(&self) -> String {
        self.path
            .as_deref()
            .or(self.method)
            .map(str::to_string)
            .unwrap_or_else(|| "call".to_string())
    }

    /// The keyword argument `name`, if given.
    pub fn keyword(&self, name: &str) -> Option<&Expr> {
        keyword(self.call, name)
    }

    /// Whether the call passes `**kwargs` (then any keyword may be in it).
    pub fn has_double_star(&self) -> bool {
        self.call.arguments.keywords.iter().any(|k| k.arg.is_none())
    }
}

/// The keyword argument `name` of a call.
pub fn keyword<'e>(call: &'e ExprCall, name: &str) -> Option<&'e Expr> {
    call.arguments
        .keywords
        .iter()
        .find(|k| k.arg.as_ref().is_some_and(|a| a.as_str() == name))
        .map(|k| &k.value)
}

/// An assignment `name = value` (also `self.x = value`, the elements of `a, b = c, d`, loop targets).
#[derive(Debug)]
pub struct PyAssign<'a> {
    pub name: Cow<'a, str>,
    pub value: &'a Expr,
    /// Where the binding takes effect: the end of an assignment, the start of a `for`.
    pub at: usize,
    pub fn_idx: Option<usize>,
    pub loops: Rc<[usize]>,
    /// Bound by a `for` over something (the value is the iterated expression).
    pub loop_target: bool,
    /// The loop that binds it, for loop targets.
    pub target_of: Option<usize>,
}

/// An augmented assignment `target += value` (or `target = target + value`).
#[derive(Debug)]
pub struct PyAccumulate<'a> {
    pub target: &'a Expr,
    pub value: &'a Expr,
    pub range: TextRange,
    pub fn_idx: Option<usize>,
    pub loops: Rc<[usize]>,
    pub guard: Option<usize>,
    pub no_grad: bool,
    pub in_test: bool,
}

/// A test whose truth a statement reads (`if loss > 10:`, `while not done:`, `assert ok`):
/// Python calls `bool()` on its value, which for a tensor reads it back.
#[derive(Debug)]
pub struct PyTest<'a> {
    pub test: &'a Expr,
    /// `if` (also `elif`), `while` or `assert`.
    pub statement: &'static str,
    pub fn_idx: Option<usize>,
    pub loops: Rc<[usize]>,
    pub guard: Option<usize>,
    /// See [`PyCall::bounded`].
    pub bounded: Option<usize>,
    pub in_test: bool,
}

/// The facts of one module.
#[derive(Debug, Default)]
pub struct PyFacts<'a> {
    pub fns: Vec<PyFn<'a>>,
    pub loops: Vec<PyLoop<'a>>,
    pub calls: Vec<PyCall<'a>>,
    pub assigns: Vec<PyAssign<'a>>,
    /// Assignment indices by name, built on first use (see [`PyFacts::assigns_by_name`]).
    assigns_index: std::sync::OnceLock<AssignIndex<'a>>,
    pub accumulates: Vec<PyAccumulate<'a>>,
    /// The tests of `if`, `elif`, `while` and `assert` statements (not literals).
    pub tests: Vec<PyTest<'a>>,
    /// Subscript assignments `x[..] = value` (`os.environ["CUDA_VISIBLE_DEVICES"] = ..`).
    pub subscript_assigns: Vec<(&'a Expr, &'a Expr, TextRange, Option<usize>)>,
    /// Names that import statements bind, anywhere in the module (`utils` of `import utils`,
    /// `from pkg import utils` and `import pkg.utils as utils`; `pkg` of `import pkg.utils`).
    pub imports: Vec<&'a str>,
    /// For `from M import name [as bound]`: (bound, the last name of M), in order (`from
    /// .utils_simmim import get_grad_norm` gives `("get_grad_norm", "utils_simmim")`).
    pub from_imports: Vec<(&'a str, &'a str)>,
    /// Where statements and expressions first nest deeper than [`MAX_NESTING`] (a byte offset):
    /// the walk stops descending there, and the file is reported instead of linted.
    pub too_deep: Option<usize>,
}

/// Deepest nesting of statements and expressions walked; each level is a stack frame of the
/// walk, so a generated chain of 200,000 calls (`a.b().b()...`) would overflow the stack.
pub(crate) const MAX_NESTING: usize = 2000;

/// Lowers a module into facts.
pub fn collect(file: &PyFile) -> PyFacts<'_> {
    // Every call has a `(`: sized once from their count rather than grown (and copied) as the
    // visitor goes.
    let parens = memchr::memchr_iter(b'(', file.source.as_bytes()).count();
    let mut collector = Collector {
        source: &file.source,
        // The other lists are sized from the same count, as most modules of real code need
        // (over a corpus of PyTorch code, 19 in 20 of the modules with more than 50 parentheses
        // have fewer assignments than 3 in 4 of them, fewer functions than 1 in 4, fewer loops
        // than 1 in 16; smaller modules get a few places more); a module with more grows its
        // list as before.
        facts: PyFacts {
            calls: Vec::with_capacity(parens),
            assigns: Vec::with_capacity(parens / 4 * 3 + 8),
            fns: Vec::with_capacity(parens / 4 + 4),
            loops: Vec::with_capacity(parens / 16 + 4),
            ..PyFacts::default()
        },
        fn_stack: Vec::new(),
        class_stack: Vec::new(),
        loops: Vec::new(),
        counters: Vec::new(),
        bounded: None,
        shared_loops: None,
        guard: None,
        leaves: None,
        branch: None,
        no_grad: 0,
        test: file.test_file,
        test_depth: 0,
        comprehension: 0,
        depth: 0,
        modulo_helpers: modulo_helpers(&file.module().body),
    };
    for stmt in &file.module().body {
        collector.visit_stmt(stmt);
    }
    collector.facts
}

impl<'a> PyFacts<'a> {
    /// Assignments by name. Built the first time a rule asks: most modules are never asked.
    pub fn assigns_by_name(&self) -> &AssignIndex<'a> {
        self.assigns_index
            .get_or_init(|| AssignIndex::build(&self.assigns))
    }
}

/// A module's assignments by name, newest first. Without a list per name: the newest assignment of
/// each name, and for every assignment the one before it of the same name.
#[derive(Debug, Default)]
pub struct AssignIndex<'a> {
    newest: FxHashMap<Cow<'a, str>, u32>,
    previous: Vec<u32>,
}

/// The end of a chain of [`AssignIndex::previous`].
const NO_ASSIGN: u32 = u32::MAX;

impl<'a> AssignIndex<'a> {
    fn build(assigns: &[PyAssign<'a>]) -> AssignIndex<'a> {
        // Sized once (at most one entry per assignment) rather than grown and rehashed.
        let mut newest: FxHashMap<Cow<'a, str>, u32> =
            FxHashMap::with_capacity_and_hasher(assigns.len(), Default::default());
        let mut previous = Vec::with_capacity(assigns.len());
        for (i, assign) in assigns.iter().enumerate() {
            // A module of four billion assignments would not have been read into memory.
            let i = u32::try_from(i).unwrap_or(NO_ASSIGN - 1);
            match newest.get_mut(assign.name.as_ref()) {
                Some(last) => previous.push(std::mem::replace(last, i)),
                None => {
                    previous.push(NO_ASSIGN);
                    newest.insert(assign.name.clone(), i);
                }
            }
        }
        AssignIndex { newest, previous }
    }

    /// The indices of the assignments to `name`, the newest first.
    pub fn newest_first<'s>(&'s self, name: &str) -> impl Iterator<Item = usize> + use<'s, 'a> {
        let mut next = self.newest.get(name).copied().unwrap_or(NO_ASSIGN);
        std::iter::from_fn(move || {
            if next == NO_ASSIGN {
                return None;
            }
            let current = next as usize;
            next = self.previous[current];
            Some(current)
        })
    }
}

struct Collector<'a> {
    source: &'a str,
    facts: PyFacts<'a>,
    fn_stack: Vec<usize>,
    class_stack: Vec<(&'a str, bool)>,
    loops: Vec<usize>,
    /// The counters of the enclosing loops of the function (`i` of `for i, b in enumerate(..)`,
    /// `step` of `for step in range(..)`) and the names computed from them
    /// (`ni = i + nb * epoch`), each with its loop's position in `loops`.
    counters: Vec<(&'a str, usize)>,
    /// See [`PyCall::bounded`].
    bounded: Option<usize>,
    /// `loops` as the facts share it, until `loops` changes.
    shared_loops: Option<Rc<[usize]>>,
    guard: Option<usize>,
    /// See [`PyCall::leaves`].
    leaves: Option<usize>,
    /// See [`PyCall::branch`]: the test of the innermost `if name == literal:`.
    branch: Option<&'a Expr>,
    no_grad: usize,
    test: bool,
    test_depth: usize,
    comprehension: usize,
    /// Statements and expressions being walked, nested.
    depth: usize,
    /// The module's functions that test divisibility (see [`modulo_helpers`]).
    modulo_helpers: Vec<&'a str>,
}

impl<'a> Collector<'a> {
    fn fn_idx(&self) -> Option<usize> {
        self.fn_stack.last().copied()
    }

    fn in_test(&self) -> bool {
        self.test || self.test_depth > 0
    }

    /// Records that the statements of a branch run once when the branch ends by leaving (see
    /// [`leaving_block`]); a block inside one that leaves keeps the stronger of the two.
    /// The body of an `if`, `elif` or `else` (`test` is `None`): under a `% N` guard or an
    /// `if param == literal:` branch when its test is one, and noting whether it leaves.
    fn visit_branch(&mut self, test: Option<&'a Expr>, body: &'a [Stmt]) {
        let (saved, saved_leaves, saved_branch) = (self.guard, self.leaves, self.branch);
        let saved_bounded = self.bounded;
        if test.is_some_and(|t| self.periodic(t)) {
            self.guard = Some(self.loops.len());
        }
        if let Some(pos) = test.and_then(|t| self.bounded_test(t)) {
            self.bounded = Some(self.bounded.map_or(pos, |p| p.min(pos)));
        }
        if let Some(test) = test.filter(|t| equality_branch(t).is_some()) {
            self.branch = Some(test);
        }
        self.enter_block(body);
        for s in body {
            self.visit_stmt(s);
        }
        self.guard = saved;
        self.leaves = saved_leaves;
        self.branch = saved_branch;
        self.bounded = saved_bounded;
    }

    /// The position (in `loops`) of the loop whose first iterations alone pass `test`:
    /// `counter == N`, `counter < N`, `counter <= N` (or the same written the other way round),
    /// or such a test joined with `and`.
    fn bounded_test(&self, test: &Expr) -> Option<usize> {
        match test {
            Expr::Compare(cmp) if cmp.ops.len() == 1 && cmp.comparators.len() == 1 => {
                let (left, right) = (&*cmp.left, &cmp.comparators[0]);
                let (counter, op) = match (left, right) {
                    (Expr::Name(name), Expr::NumberLiteral(_)) => (name, cmp.ops[0]),
                    (Expr::NumberLiteral(_), Expr::Name(name)) => (
                        name,
                        match cmp.ops[0] {
                            CmpOp::Gt => CmpOp::Lt,
                            CmpOp::GtE => CmpOp::LtE,
                            other => other,
                        },
                    ),
                    _ => return None,
                };
                if !matches!(op, CmpOp::Eq | CmpOp::Lt | CmpOp::LtE) {
                    return None;
                }
                self.counter_position(counter.id.as_str())
            }
            Expr::BoolOp(bool_op) if bool_op.op == ruff_python_ast::BoolOp::And => bool_op
                .values
                .iter()
                .filter_map(|v| self.bounded_test(v))
                .min(),
            _ => None,
        }
    }

    /// A test that passes once every N steps or less often: a `% N` test (see
    /// [`is_modulo_guard`]); such a test joined with `and` to anything
    /// (`args.every > 0 and step % args.every == 0`); or joined with `or` to tests that pass once
    /// or on the first iterations (a loop counter compared for equality or bounded, a name of the
    /// last or final iteration): `step % N == 0 or last_batch`,
    /// `last_step or (step > 0 and step % N == 0)`.
    fn periodic(&self, test: &Expr) -> bool {
        if is_modulo_guard(test, &self.modulo_helpers) {
            return true;
        }
        let Expr::BoolOp(bool_op) = test else {
            return false;
        };
        match bool_op.op {
            ruff_python_ast::BoolOp::And => bool_op.values.iter().any(|v| self.periodic(v)),
            ruff_python_ast::BoolOp::Or => {
                let mut periodic = false;
                for value in &bool_op.values {
                    if self.periodic(value) {
                        periodic = true;
                    } else if !self.rare_test(value) {
                        return false;
                    }
                }
                periodic
            }
        }
    }

    /// A test that passes on one iteration or the first few: `counter == x`, a bounded test of a
    /// counter (see [`Collector::bounded_test`]), a flag named for the last or final iteration
    /// (`last_batch`, `self.is_last_step`), or an `and` with one such test in it.
    fn rare_test(&self, test: &Expr) -> bool {
        if self.bounded_test(test).is_some() {
            return true;
        }
        match test {
            Expr::Compare(cmp) if cmp.ops.len() == 1 && cmp.ops[0] == CmpOp::Eq => {
                [&*cmp.left, &cmp.comparators[0]].iter().any(|side| {
                    matches!(side, Expr::Name(name) if self.counter_position(name.id.as_str()).is_some())
                })
            }
            Expr::Name(_) | Expr::Attribute(_) => last_segment(test).is_some_and(|name| {
                let name = name.to_ascii_lowercase();
                name.contains("last") || name.contains("final")
            }),
            // `epoch == last_epoch and i == len(loader) - 1`: no more often than its rarest part.
            Expr::BoolOp(b) if b.op == ruff_python_ast::BoolOp::And => {
                b.values.iter().any(|v| self.rare_test(v))
            }
            _ => false,
        }
    }

    /// Records the test of an `if`, `elif`, `while` or `assert` (a literal's truth reads nothing).
    fn record_test(&mut self, test: &'a Expr, statement: &'static str) {
        if is_leaf(test) && !matches!(test, Expr::Name(_)) {
            return;
        }
        let loops = self.loop_stack();
        self.facts.tests.push(PyTest {
            test,
            statement,
            fn_idx: self.fn_idx(),
            loops,
            guard: self.guard,
            bounded: self.bounded,
            in_test: self.in_test(),
        });
    }

    /// The loop position of a counter (the innermost binding of the name).
    fn counter_position(&self, name: &str) -> Option<usize> {
        self.counters
            .iter()
            .rev()
            .find(|(counter, _)| *counter == name)
            .map(|&(_, pos)| pos)
    }

    /// The loop position of the counter an expression is computed from, when it is arithmetic on
    /// it (`i + nb * epoch`, `epoch * len(loader) + i`). Runs before the nesting of the value is
    /// known to be within [`MAX_NESTING`]: it looks a few operations deep only.
    fn computed_from_counter(&self, expr: &Expr) -> Option<usize> {
        self.computed_from_counter_within(expr, 8)
    }

    fn computed_from_counter_within(&self, expr: &Expr, depth: usize) -> Option<usize> {
        match expr {
            Expr::Name(name) => self.counter_position(name.id.as_str()),
            Expr::BinOp(bin)
                if depth > 0
                    && matches!(
                        bin.op,
                        Operator::Add | Operator::Sub | Operator::Mult | Operator::FloorDiv
                    ) =>
            {
                match (
                    self.computed_from_counter_within(&bin.left, depth - 1),
                    self.computed_from_counter_within(&bin.right, depth - 1),
                ) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (one, other) => one.or(other),
                }
            }
            _ => None,
        }
    }

    fn enter_block(&mut self, body: &[Stmt]) {
        if let Some(depth) = leaving_block(body, self.loops.len()) {
            self.leaves = Some(self.leaves.map_or(depth, |d| d.min(depth)));
        }
    }

    /// The enclosing loops, shared between the facts recorded at the same loop depth.
    fn loop_stack(&mut self) -> Rc<[usize]> {
        self.shared_loops
            .get_or_insert_with(|| Rc::from(self.loops.as_slice()))
            .clone()
    }

    /// The dotted name of an expression (see [`dotted`]), borrowed from the source when possible.
    fn dotted(&self, expr: &'a Expr) -> Option<Cow<'a, str>> {
        dotted_in(self.source, expr)
    }

    fn bind(&mut self, target: &'a Expr, value: &'a Expr, at: usize) {
        match (target, value) {
            (Expr::Tuple(targets), Expr::Tuple(values))
                if targets.elts.len() == values.elts.len() =>
            {
                for (t, v) in targets.elts.iter().zip(&values.elts) {
                    self.bind(t, v, at);
                }
            }
            (Expr::Tuple(targets), _) => {
                // `x, y = batch`: each element comes from the value.
                for t in &targets.elts {
                    self.bind(t, value, at);
                }
            }
            _ => {
                if let Some(name) = self.dotted(target) {
                    let loops = self.loop_stack();
                    self.facts.assigns.push(PyAssign {
                        name,
                        value,
                        at,
                        fn_idx: self.fn_idx(),
                        loops,
                        loop_target: false,
                        target_of: None,
                    });
                }
            }
        }
    }

    fn bind_loop_target(&mut self, target: &'a Expr, iter: &'a Expr, at: usize, loop_idx: usize) {
        // `for step, batch in enumerate(loader)`: the counter is a number, the rest comes from the
        // loader.
        if let (Expr::Tuple(t), Expr::Call(call)) = (target, iter)
            && t.elts.len() == 2
            && self.dotted(&call.func).as_deref() == Some("enumerate")
            && let Some(inner) = call.arguments.args.first()
        {
            self.bind(&t.elts[0], &t.elts[0], at);
            self.bind_loop_target(&t.elts[1], inner, at, loop_idx);
            return;
        }
        // `for name, p in model.named_parameters()`: a name (text), then a parameter.
        if let (Expr::Tuple(t), Expr::Call(call)) = (target, iter)
            && t.elts.len() == 2
            && let Expr::Attribute(attr) = &*call.func
            && attr.attr.as_str() == "named_parameters"
        {
            self.bind(&t.elts[0], &t.elts[0], at);
            self.bind_loop_target(&t.elts[1], iter, at, loop_idx);
            return;
        }
        match target {
            Expr::Tuple(t) => {
                for e in &t.elts {
                    self.bind_loop_target(e, iter, at, loop_idx);
                }
            }
            Expr::List(t) => {
                for e in &t.elts {
                    self.bind_loop_target(e, iter, at, loop_idx);
                }
            }
            _ => {
                if let Some(name) = self.dotted(target) {
                    let loops = self.loop_stack();
                    self.facts.assigns.push(PyAssign {
                        name,
                        value: iter,
                        at,
                        fn_idx: self.fn_idx(),
                        loops,
                        loop_target: true,
                        target_of: Some(loop_idx),
                    });
                }
            }
        }
    }

    fn enter_loop(&mut self, range: TextRange, iter: Option<&'a Expr>, body_start: usize) -> usize {
        let idx = self.facts.loops.len();
        let parent = self
            .loops
            .last()
            .copied()
            .filter(|&p| self.facts.loops[p].fn_idx == self.fn_idx());
        self.facts.loops.push(PyLoop {
            range,
            fn_idx: self.fn_idx(),
            parent,
            iter,
            body_start,
        });
        self.loops.push(idx);
        self.shared_loops = None;
        idx
    }
}

impl<'a> Collector<'a> {
    /// Walks a child expression. A leaf is passed over without a call (it holds nothing to
    /// record), noting only, as walking it would, that it lies past [`MAX_NESTING`].
    #[inline]
    fn child(&mut self, expr: &'a Expr) {
        if !is_leaf(expr) {
            self.visit_expr(expr);
        } else if self.depth >= MAX_NESTING {
            self.facts.too_deep.get_or_insert(expr.start().to_usize());
        }
    }

    /// Enters one more level of nesting; false (and `node`'s start recorded) past
    /// [`MAX_NESTING`]. The node's range is read only then: every statement and expression passes
    /// here.
    fn deeper(&mut self, node: &impl Ranged) -> bool {
        if self.depth >= MAX_NESTING {
            self.facts.too_deep.get_or_insert(node.start().to_usize());
            return false;
        }
        self.depth += 1;
        true
    }
}

impl<'a> Visitor<'a> for Collector<'a> {
    fn visit_stmt(&mut self, stmt: &'a Stmt) {
        if !self.deeper(stmt) {
            return;
        }
        self.visit_stmt_nested(stmt);
        self.depth -= 1;
    }

    fn visit_expr(&mut self, expr: &'a Expr) {
        if !self.deeper(expr) {
            return;
        }
        self.visit_expr_nested(expr);
        self.depth -= 1;
    }
}

impl<'a> Collector<'a> {
    fn visit_stmt_nested(&mut self, stmt: &'a Stmt) {
        match stmt {
            Stmt::FunctionDef(def) => {
                for decorator in &def.decorator_list {
                    self.visit_expr(&decorator.expression);
                }
                let name = def.name.as_str();
                let class = self.class_stack.last().map(|(c, _)| *c);
                let class_test = self.class_stack.last().is_some_and(|(_, t)| *t);
                let is_test = name.starts_with("test_") || name.starts_with("test") && class_test;
                let idx = self.facts.fns.len();
                self.facts.fns.push(PyFn {
                    name,
                    class,
                    range: def.range,
                    name_range: def.name.range(),
                    in_test: self.in_test() || is_test || class_test,
                    step_body: class.is_some()
                        && (name == "training_step" || name.starts_with("on_train_batch_")),
                    generator: false,
                    def,
                });
                // Loops and guards do not cross a function boundary.
                let loops = std::mem::take(&mut self.loops);
                let counters = std::mem::take(&mut self.counters);
                let bounded = self.bounded.take();
                let shared_loops = self.shared_loops.take();
                let guard = self.guard.take();
                let leaves = self.leaves.take();
                let branch = self.branch.take();
                let no_grad = std::mem::take(&mut self.no_grad);
                let decorated_no_grad = def.decorator_list.iter().any(|d| {
                    self.dotted(strip_call(&d.expression))
                        .is_some_and(|p| is_no_grad(&p))
                });
                if decorated_no_grad {
                    self.no_grad += 1;
                }
                let test_bump = usize::from(is_test || class_test);
                self.test_depth += test_bump;
                self.fn_stack.push(idx);
                for s in &def.body {
                    self.visit_stmt(s);
                }
                self.fn_stack.pop();
                self.test_depth -= test_bump;
                self.loops = loops;
                self.counters = counters;
                self.bounded = bounded;
                self.shared_loops = shared_loops;
                self.guard = guard;
                self.leaves = leaves;
                self.branch = branch;
                self.no_grad = no_grad;
            }
            Stmt::ClassDef(class) => {
                if let Some(args) = &class.arguments {
                    for arg in &args.args {
                        self.visit_expr(arg);
                    }
                }
                let name = class.name.as_str();
                let is_test = name.starts_with("Test")
                    || class.arguments.as_ref().is_some_and(|a| {
                        a.args
                            .iter()
                            .any(|b| self.dotted(b).is_some_and(|p| p.ends_with("TestCase")))
                    });
                self.class_stack.push((name, is_test || self.in_test()));
                for s in &class.body {
                    self.visit_stmt(s);
                }
                self.class_stack.pop();
            }
            Stmt::For(f) => {
                self.visit_expr(&f.iter);
                let body_start = f
                    .body
                    .first()
                    .map_or(f.range.end(), Ranged::start)
                    .to_usize();
                let idx = self.enter_loop(f.range, Some(&f.iter), body_start);
                self.bind_loop_target(&f.target, &f.iter, f.range.start().to_usize(), idx);
                let counters = self.counters.len();
                if let Some(counter) = loop_counter(&f.target, &f.iter) {
                    self.counters.push((counter, self.loops.len() - 1));
                }
                for s in &f.body {
                    self.visit_stmt(s);
                }
                self.counters.truncate(counters);
                self.loops.pop();
                self.shared_loops = None;
                for s in &f.orelse {
                    self.visit_stmt(s);
                }
            }
            Stmt::While(w) => {
                let body_start = w
                    .body
                    .first()
                    .map_or(w.range.end(), Ranged::start)
                    .to_usize();
                self.enter_loop(w.range, None, body_start);
                self.visit_expr(&w.test);
                self.record_test(&w.test, "while");
                for s in &w.body {
                    self.visit_stmt(s);
                }
                self.loops.pop();
                self.shared_loops = None;
                for s in &w.orelse {
                    self.visit_stmt(s);
                }
            }
            Stmt::If(i) => {
                self.visit_expr(&i.test);
                self.record_test(&i.test, "if");
                self.visit_branch(Some(&i.test), &i.body);
                for clause in &i.elif_else_clauses {
                    if let Some(test) = &clause.test {
                        self.visit_expr(test);
                        self.record_test(test, "elif");
                    }
                    // `elif step % N == 0:` guards its own body like an `if`.
                    self.visit_branch(clause.test.as_ref(), &clause.body);
                }
            }
            Stmt::With(w) => {
                let mut bump = 0;
                for item in &w.items {
                    self.visit_expr(&item.context_expr);
                    if self
                        .dotted(strip_call(&item.context_expr))
                        .is_some_and(|p| is_no_grad(&p))
                    {
                        bump += 1;
                    }
                    if let Some(vars) = &item.optional_vars {
                        self.bind(vars, &item.context_expr, w.range.start().to_usize());
                    }
                }
                self.no_grad += bump;
                for s in &w.body {
                    self.visit_stmt(s);
                }
                self.no_grad -= bump;
            }
            Stmt::Assign(a) => {
                self.visit_expr(&a.value);
                // `ni = i + nb * epoch`: a name computed from a loop's counter counts like it.
                if !self.counters.is_empty()
                    && let [Expr::Name(target)] = a.targets.as_slice()
                    && let Some(pos) = self.computed_from_counter(&a.value)
                {
                    self.counters.push((target.id.as_str(), pos));
                }
                // The name is bound once the value is computed: uses in the value see the old one.
                let at = a.range.end().to_usize();
                for target in &a.targets {
                    if let Expr::Subscript(sub) = target {
                        self.facts.subscript_assigns.push((
                            &sub.value,
                            &sub.slice,
                            a.range,
                            self.fn_idx(),
                        ));
                        self.visit_expr(target);
                        continue;
                    }
                    // `total = total + loss` accumulates like `total += loss`.
                    if let Expr::BinOp(bin) = &*a.value
                        && bin.op == Operator::Add
                        && let Some(name) = self.dotted(target)
                        && self.dotted(&bin.left) == Some(name)
                    {
                        let loops = self.loop_stack();
                        self.facts.accumulates.push(PyAccumulate {
                            target,
                            value: &bin.right,
                            range: a.range,
                            fn_idx: self.fn_idx(),
                            loops,
                            guard: self.guard,
                            no_grad: self.no_grad > 0,
                            in_test: self.in_test(),
                        });
                        continue;
                    }
                    self.bind(target, &a.value, at);
                }
            }
            Stmt::AnnAssign(a) => {
                if let Some(value) = &a.value {
                    self.visit_expr(value);
                    self.bind(&a.target, value, a.range.end().to_usize());
                }
            }
            Stmt::AugAssign(a) => {
                self.visit_expr(&a.value);
                if a.op == Operator::Add {
                    let loops = self.loop_stack();
                    self.facts.accumulates.push(PyAccumulate {
                        target: &a.target,
                        value: &a.value,
                        range: a.range,
                        fn_idx: self.fn_idx(),
                        loops,
                        guard: self.guard,
                        no_grad: self.no_grad > 0,
                        in_test: self.in_test(),
                    });
                }
            }
            Stmt::Assert(assert) => {
                self.record_test(&assert.test, "assert");
                visitor::walk_stmt(self, stmt);
            }
            Stmt::Import(import) => {
                for alias in &import.names {
                    let bound = match &alias.asname {
                        Some(name) => name.as_str(),
                        None => alias.name.as_str().split('.').next().unwrap_or_default(),
                    };
                    self.facts.imports.push(bound);
                }
            }
            Stmt::ImportFrom(import) => {
                let module = import
                    .module
                    .as_ref()
                    .and_then(|m| m.as_str().rsplit('.').next());
                for alias in &import.names {
                    let bound = alias.asname.as_ref().unwrap_or(&alias.name).as_str();
                    if bound != "*" {
                        self.facts.imports.push(bound);
                        if let Some(module) = module {
                            self.facts.from_imports.push((bound, module));
                        }
                    }
                }
            }
            _ => visitor::walk_stmt(self, stmt),
        }
    }

    fn visit_expr_nested(&mut self, expr: &'a Expr) {
        match expr {
            Expr::Call(call) => {
                let (method, receiver) = match &*call.func {
                    Expr::Attribute(attr) => (Some(attr.attr.as_str()), Some(&*attr.value)),
                    _ => (None, None),
                };
                let func_name = match &*call.func {
                    Expr::Name(name) => Some(name.id.as_str()),
                    _ => None,
                };
                let path = self.dotted(&call.func);
                let loops = self.loop_stack();
                let (mut number_arg, mut string_arg) = (false, false);
                let mut formats = matches!(
                    (method, receiver),
                    (Some("format"), Some(Expr::StringLiteral(_)))
                );
                for arg in call
                    .arguments
                    .args
                    .iter()
                    .chain(call.arguments.keywords.iter().map(|k| &k.value))
                {
                    number_arg |= matches!(arg, Expr::NumberLiteral(_));
                    string_arg |= matches!(arg, Expr::StringLiteral(_));
                    formats |= is_formatting(arg);
                }
                self.facts.calls.push(PyCall {
                    call,
                    start: call.start().to_usize(),
                    path,
                    method,
                    receiver,
                    func_name,
                    fn_idx: self.fn_idx(),
                    loops,
                    guard: self.guard.map(|g| g as u32),
                    bounded: self.bounded.map(|b| b as u32),
                    leaves: self.leaves.map(|l| l as u32),
                    branch_test: self.branch,
                    no_grad: self.no_grad > 0,
                    in_test: self.in_test(),
                    in_comprehension: self.comprehension > 0,
                    number_arg,
                    string_arg,
                    formats,
                });
                self.child(&call.func);
                for arg in &call.arguments.args {
                    self.child(arg);
                }
                for keyword in &call.arguments.keywords {
                    self.child(&keyword.value);
                }
            }
            Expr::Attribute(attr) => {
                // `a.b.c`: down the chain to its base, which a name or a literal ends (most do).
                let mut base = &*attr.value;
                let mut links = 1;
                while let Expr::Attribute(inner) = base {
                    base = &inner.value;
                    links += 1;
                }
                if is_leaf(base) && self.depth + links <= MAX_NESTING {
                    return;
                }
                self.child(&attr.value);
            }
            Expr::BinOp(bin) => {
                self.child(&bin.left);
                self.child(&bin.right);
            }
            Expr::Compare(cmp) => {
                self.child(&cmp.left);
                for e in &cmp.comparators {
                    self.child(e);
                }
            }
            Expr::Subscript(sub) => {
                self.child(&sub.value);
                self.child(&sub.slice);
            }
            Expr::Tuple(tuple) => {
                for e in &tuple.elts {
                    self.child(e);
                }
            }
            Expr::List(list) => {
                for e in &list.elts {
                    self.child(e);
                }
            }
            Expr::BoolOp(bool_op) => {
                for e in &bool_op.values {
                    self.child(e);
                }
            }
            Expr::UnaryOp(unary) => self.child(&unary.operand),
            Expr::Lambda(_) => {
                // A lambda's body runs when it is called, not here; its calls are still recorded.
                visitor::walk_expr(self, expr);
            }
            Expr::Yield(_) | Expr::YieldFrom(_) => {
                if let Some(f) = self.fn_idx()
                    && self.comprehension == 0
                {
                    self.facts.fns[f].generator = true;
                }
                visitor::walk_expr(self, expr);
            }
            Expr::ListComp(_) | Expr::SetComp(_) | Expr::DictComp(_) | Expr::Generator(_) => {
                self.comprehension += 1;
                visitor::walk_expr(self, expr);
                self.comprehension -= 1;
            }
            // Leaves hold no call: nothing to record, nothing to walk.
            expr if is_leaf(expr) => {}
            _ => visitor::walk_expr(self, expr),
        }
    }
}

/// The counter of a `for` loop: `step` of `for step in range(..)`, `i` of
/// `for i, batch in enumerate(..)`.
fn loop_counter<'a>(target: &'a Expr, iter: &Expr) -> Option<&'a str> {
    let Expr::Call(call) = iter else {
        return None;
    };
    let Expr::Name(func) = &*call.func else {
        return None;
    };
    match (func.id.as_str(), target) {
        ("range", Expr::Name(name)) => Some(name.id.as_str()),
        ("enumerate", Expr::Tuple(tuple)) => match tuple.elts.first() {
            Some(Expr::Name(name)) => Some(name.id.as_str()),
            _ => None,
        },
        _ => None,
    }
}

/// Whether an expression formats values into text: an f-string, or `%`-formatting of a string.
pub fn is_formatting(expr: &Expr) -> bool {
    match expr {
        Expr::FString(_) => true,
        Expr::BinOp(bin) => {
            bin.op == Operator::Mod
                && matches!(&*bin.left, Expr::StringLiteral(_) | Expr::FString(_))
        }
        _ => false,
    }
}

/// The values an expression formats into text: the interpolated expressions of an f-string
/// (`norm` of `f"norm {norm:.4f}"`), or the right side of `%`-formatting a string (`loss` of
/// `"%.3f" % loss`, each element of `"%d %f" % (step, loss)`); none for anything else.
pub fn formatted_values(expr: &Expr) -> Vec<&Expr> {
    if !is_formatting(expr) {
        return Vec::new();
    }
    match expr {
        Expr::FString(fstring) => fstring
            .value
            .elements()
            .filter_map(|element| match element {
                ruff_python_ast::InterpolatedStringElement::Interpolation(inner) => {
                    Some(&*inner.expression)
                }
                ruff_python_ast::InterpolatedStringElement::Literal(_) => None,
            })
            .collect(),
        Expr::BinOp(bin) => match &*bin.right {
            Expr::Tuple(tuple) => tuple.elts.iter().collect(),
            value => vec![value],
        },
        _ => Vec::new(),
    }
}

/// A name or a literal: an expression with no expression inside it.
fn is_leaf(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::Name(_)
            | Expr::StringLiteral(_)
            | Expr::BytesLiteral(_)
            | Expr::NumberLiteral(_)
            | Expr::BooleanLiteral(_)
            | Expr::NoneLiteral(_)
            | Expr::EllipsisLiteral(_)
    )
}

/// `torch.no_grad`, `torch.inference_mode`, `no_grad`.
fn is_no_grad(path: &str) -> bool {
    path.ends_with("no_grad") || path.ends_with("inference_mode")
}

/// The callee of a call expression, else the expression.
fn strip_call(expr: &Expr) -> &Expr {
    match expr {
        Expr::Call(call) => &call.func,
        other => other,
    }
}

/// `step % N == 0`, `(step + 1) % N == 0`, `not step % N`, a call of one of the module's
/// `helpers` that test the same (`divisible_by(step, N)`), and those joined with `and`.
fn is_modulo_guard(test: &Expr, helpers: &[&str]) -> bool {
    match test {
        Expr::Compare(cmp) => {
            cmp.ops.len() == 1
                && cmp.ops[0] == CmpOp::Eq
                && (is_modulo(&cmp.left) || cmp.comparators.iter().any(is_modulo))
        }
        Expr::UnaryOp(unary) => {
            unary.op == ruff_python_ast::UnaryOp::Not && is_modulo(&unary.operand)
        }
        Expr::BoolOp(bool_op) => {
            bool_op.op == ruff_python_ast::BoolOp::And
                && bool_op.values.iter().any(|v| is_modulo_guard(v, helpers))
        }
        Expr::Call(call) => {
            matches!(&*call.func, Expr::Name(name) if helpers.contains(&name.id.as_str()))
        }
        _ => false,
    }
}

/// The module-level functions whose whole body (a docstring aside) returns a divisibility test
/// (`def divisible_by(numer, denom): return (numer % denom) == 0`): a branch on a call of one
/// runs once every N steps, like `if step % N == 0:`. Helpers imported from other modules are not
/// known.
fn modulo_helpers(body: &[Stmt]) -> Vec<&str> {
    let mut helpers = Vec::new();
    for stmt in body {
        let Stmt::FunctionDef(def) = stmt else {
            continue;
        };
        let statements = match def.body.as_slice() {
            [Stmt::Expr(doc), rest @ ..] if matches!(&*doc.value, Expr::StringLiteral(_)) => rest,
            all => all,
        };
        if let [Stmt::Return(ret)] = statements
            && let Some(value) = &ret.value
            && is_modulo_guard(value, &[])
        {
            helpers.push(def.name.as_str());
        }
    }
    helpers
}

/// How a branch's statements end, when they end by leaving: `Some(0)` for `raise` or a call that
/// ends the program (`sys.exit(..)`, `exit(..)`, `quit(..)`, `os._exit(..)`), `Some(depth)` for a
/// `break` out of the innermost of `depth` enclosing loops (`None` at depth 0: nothing to break).
/// The failure path of a step (`if not math.isfinite(loss): print(losses); sys.exit(1)`) runs once.
fn leaving_block(body: &[Stmt], depth: usize) -> Option<usize> {
    match body.last()? {
        Stmt::Raise(_) => Some(0),
        Stmt::Break(_) if depth > 0 => Some(depth),
        Stmt::Expr(e) => match &*e.value {
            Expr::Call(call)
                if dotted(&call.func).is_some_and(|p| {
                    matches!(p.as_str(), "sys.exit" | "exit" | "quit" | "os._exit")
                }) =>
            {
                Some(0)
            }
            _ => None,
        },
        _ => None,
    }
}

/// `name == literal` (or `literal == name`) with a string, number or boolean literal: the name
/// and the literal.
fn equality_branch(test: &Expr) -> Option<(&str, &Expr)> {
    let Expr::Compare(cmp) = test else {
        return None;
    };
    if cmp.ops.len() != 1 || cmp.ops[0] != ruff_python_ast::CmpOp::Eq {
        return None;
    }
    let (left, right) = (&*cmp.left, &cmp.comparators[0]);
    match (left, right) {
        (Expr::Name(name), lit) | (lit, Expr::Name(name)) if is_plain_literal(lit) => {
            Some((name.id.as_str(), lit))
        }
        _ => None,
    }
}

/// A string, number or boolean literal (or `None`).
pub fn is_plain_literal(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::StringLiteral(_)
            | Expr::NumberLiteral(_)
            | Expr::BooleanLiteral(_)
            | Expr::NoneLiteral(_)
    )
}

/// A function's parameters in order: name, default, and whether it may be passed by position.
fn parameters(params: &ruff_python_ast::Parameters) -> Vec<(&str, Option<&Expr>, bool)> {
    let positional = params.posonlyargs.iter().chain(&params.args);
    positional
        .map(|p| (p.parameter.name.as_str(), p.default.as_deref(), true))
        .chain(
            params
                .kwonlyargs
                .iter()
                .map(|p| (p.parameter.name.as_str(), p.default.as_deref(), false)),
        )
        .collect()
}

fn is_modulo(expr: &Expr) -> bool {
    matches!(expr, Expr::BinOp(bin) if bin.op == Operator::Mod)
}

/// `a`, `a.b.c` as a string; `None` for anything else (calls, subscripts).
pub fn dotted(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Name(name) => Some(name.id.to_string()),
        Expr::Attribute(attr) => {
            let mut base = dotted(&attr.value)?;
            base.push('.');
            base.push_str(attr.attr.as_str());
            Some(base)
        }
        _ => None,
    }
}

/// [`dotted`] of an expression of `source`: borrowed from the source when the chain is written
/// plainly there (`a.b.c`: only ASCII name characters and dots, so the text is the names joined
/// with dots), else built.
fn dotted_in<'a>(source: &'a str, expr: &'a Expr) -> Option<Cow<'a, str>> {
    match expr {
        Expr::Name(name) => Some(Cow::Borrowed(name.id.as_str())),
        Expr::Attribute(_) => {
            // The names and the dots between them, counted: when the chain's text is no longer,
            // it holds nothing else (no space, parenthesis or comment) and is the dotted name.
            let mut base = expr;
            let mut written = 0;
            while let Expr::Attribute(attr) = base {
                written += attr.attr.len() + 1;
                base = &attr.value;
            }
            let Expr::Name(name) = base else {
                return None;
            };
            written += name.id.len();
            let range = expr.start().to_usize()..expr.end().to_usize();
            match source.get(range) {
                Some(text) if text.len() == written => Some(Cow::Borrowed(text)),
                _ => dotted(expr).map(Cow::Owned),
            }
        }
        _ => None,
    }
}

/// The last name of `a.b.c` (`c`), or of `a` (`a`).
pub fn last_segment(expr: &Expr) -> Option<&str> {
    match expr {
        Expr::Name(name) => Some(name.id.as_str()),
        Expr::Attribute(attr) => Some(attr.attr.as_str()),
        _ => None,
    }
}
