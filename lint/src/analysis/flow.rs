//! Where a read-back value goes: into an environment's step (data the host needs, such as the
//! action a policy chose), into the function's return value, or elsewhere (a log line, a metric).
//!
//! A name-level data flow over one function body, without types: a `let`, an assignment, a `for`
//! or an `if let`/`match` whose value uses a tainted expression taints the names it binds; an
//! expression is tainted when it contains a source call or names a tainted binding. Returned
//! values are followed to the crate's call sites, a few calls up.

use std::collections::HashSet;

use syn::Expr;
use syn::visit::{self, Visit};

use super::patterns::root_name;
use super::{CallFact, CrateContext, FileId};

/// Methods that advance an environment or a game by one step.
const STEP_METHODS: &[&str] = &["step", "update", "tick", "advance"];

/// How many function returns a value is followed through.
const MAX_RETURN_HOPS: usize = 4;

impl<'a> CrateContext<'a> {
    /// Whether the value that `call` (a readback) produces is data the host needs for the next
    /// action: it flows, directly or through the values its function returns (at every call
    /// site), into a call on an environment that is stepped: `env.step(action)`, or
    /// `game.turn(action)` where `game.update()` (or `tick`, `advance`, `step`) is called in the
    /// same function. Such a readback is the purpose of the code, not a value read for logging.
    pub fn feeds_environment(&self, file: FileId, call: &CallFact<'_>) -> bool {
        let Some(fn_idx) = call.fn_idx else {
            return false;
        };
        self.needed_in(file, fn_idx, &[call.call.name_span().byte_range().start], 0)
    }

    fn needed_in(&self, file: FileId, fn_idx: usize, sources: &[usize], hops: usize) -> bool {
        let f = &self.file(file).facts.fns[fn_idx];
        let flow = Flow::of(f.block, sources);
        if flow.feeds_environment(f.block) {
            return true;
        }
        if hops >= MAX_RETURN_HOPS || !flow.returned(f.block) {
            return false;
        }
        // Every call of the function that is not test code must hand the value on.
        let mut any = false;
        for (site_file, index) in self.call_sites(file, fn_idx) {
            let site = &self.file(site_file).facts.calls[index];
            if site.in_test {
                continue;
            }
            let Some(caller) = site.fn_idx else {
                return false;
            };
            let start = site.call.name_span().byte_range().start;
            if !self.needed_in(site_file, caller, &[start], hops + 1) {
                return false;
            }
            any = true;
        }
        any
    }
}

/// The names of one function body that hold a value derived from the sources.
struct Flow<'s> {
    /// Where the source calls' names start (byte offsets).
    sources: &'s [usize],
    tainted: HashSet<String>,
}

impl<'s> Flow<'s> {
    fn of(block: &syn::Block, sources: &'s [usize]) -> Flow<'s> {
        let mut flow = Flow {
            sources,
            tainted: HashSet::new(),
        };
        // Twice, so that a value assigned late in a loop body reaches uses earlier in it.
        for _ in 0..2 {
            let mut pass = Spread {
                flow: &mut flow,
                changed: false,
            };
            pass.visit_block(block);
            if !pass.changed {
                break;
            }
        }
        flow
    }

    /// Whether `expr` contains a source call or names a tainted binding.
    fn taints(&self, expr: &Expr) -> bool {
        struct Find<'f, 's> {
            flow: &'f Flow<'s>,
            found: bool,
        }
        impl<'ast> Visit<'ast> for Find<'_, '_> {
            fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
                if self
                    .flow
                    .sources
                    .contains(&m.method.span().byte_range().start)
                {
                    self.found = true;
                    return;
                }
                visit::visit_expr_method_call(self, m);
            }
            fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
                if let Expr::Path(p) = &*c.func
                    && let Some(last) = p.path.segments.last()
                    && self
                        .flow
                        .sources
                        .contains(&last.ident.span().byte_range().start)
                {
                    self.found = true;
                    return;
                }
                visit::visit_expr_call(self, c);
            }
            fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
                if p.qself.is_none()
                    && p.path.segments.len() == 1
                    && self
                        .flow
                        .tainted
                        .contains(&p.path.segments[0].ident.to_string())
                {
                    self.found = true;
                }
            }
        }
        let mut find = Find {
            flow: self,
            found: false,
        };
        find.visit_expr(expr);
        find.found
    }

    /// Whether the body's value (its tail expression, a `return`) is tainted.
    fn returned(&self, block: &syn::Block) -> bool {
        struct Returns<'f, 's> {
            flow: &'f Flow<'s>,
            found: bool,
        }
        impl<'ast> Visit<'ast> for Returns<'_, '_> {
            fn visit_expr_return(&mut self, r: &'ast syn::ExprReturn) {
                if r.expr.as_deref().is_some_and(|e| self.flow.taints(e)) {
                    self.found = true;
                }
            }
            fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}
            fn visit_item_fn(&mut self, _: &'ast syn::ItemFn) {}
        }
        if let Some(syn::Stmt::Expr(tail, None)) = block.stmts.last()
            && self.taints(tail)
        {
            return true;
        }
        let mut returns = Returns {
            flow: self,
            found: false,
        };
        returns.visit_block(block);
        returns.found
    }

    /// Whether a tainted value is handed to an environment that the body steps: an argument of
    /// `x.step(..)`, or of any method of `x` where the body also calls `x.update()` (or `tick`,
    /// `advance`, `step`) without arguments. Optimizers are not environments.
    fn feeds_environment(&self, block: &syn::Block) -> bool {
        struct Calls<'f, 's> {
            flow: &'f Flow<'s>,
            /// (receiver, method, an argument is tainted, number of arguments).
            calls: Vec<(String, String, bool, usize)>,
        }
        impl<'ast> Visit<'ast> for Calls<'_, '_> {
            fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
                if let Some(root) = root_name(&m.receiver)
                    && !super::steps::is_optimizer_like(&m.receiver)
                {
                    let tainted = m.args.iter().any(|a| self.flow.taints(a));
                    self.calls
                        .push((root, m.method.to_string(), tainted, m.args.len()));
                }
                visit::visit_expr_method_call(self, m);
            }
        }
        let mut calls = Calls {
            flow: self,
            calls: Vec::new(),
        };
        calls.visit_block(block);
        let stepped: HashSet<&str> = calls
            .calls
            .iter()
            .filter(|(_, method, _, nargs)| *nargs == 0 && STEP_METHODS.contains(&method.as_str()))
            .map(|(root, ..)| root.as_str())
            .collect();
        calls.calls.iter().any(|(root, method, tainted, _)| {
            *tainted && (method == "step" || stepped.contains(root.as_str()))
        })
    }
}

/// One pass of taint over a body: binds the names that take a tainted value.
struct Spread<'f, 's> {
    flow: &'f mut Flow<'s>,
    changed: bool,
}

impl Spread<'_, '_> {
    fn taint_pattern(&mut self, pat: &syn::Pat) {
        struct Names(Vec<String>);
        impl<'ast> Visit<'ast> for Names {
            fn visit_pat_ident(&mut self, p: &'ast syn::PatIdent) {
                self.0.push(p.ident.to_string());
                visit::visit_pat_ident(self, p);
            }
        }
        let mut names = Names(Vec::new());
        names.visit_pat(pat);
        for name in names.0 {
            self.changed |= self.flow.tainted.insert(name);
        }
    }

    fn taint_target(&mut self, target: &Expr) {
        if let Some(name) = root_name(target) {
            self.changed |= self.flow.tainted.insert(name);
        }
    }
}

impl<'ast> Visit<'ast> for Spread<'_, '_> {
    fn visit_local(&mut self, local: &'ast syn::Local) {
        if let Some(init) = &local.init
            && self.flow.taints(&init.expr)
        {
            self.taint_pattern(&local.pat);
        }
        visit::visit_local(self, local);
    }

    fn visit_expr_assign(&mut self, e: &'ast syn::ExprAssign) {
        if self.flow.taints(&e.right) {
            self.taint_target(&e.left);
        }
        visit::visit_expr_assign(self, e);
    }

    fn visit_expr_binary(&mut self, e: &'ast syn::ExprBinary) {
        let compound = matches!(
            e.op,
            syn::BinOp::AddAssign(_)
                | syn::BinOp::SubAssign(_)
                | syn::BinOp::MulAssign(_)
                | syn::BinOp::DivAssign(_)
        );
        if compound && self.flow.taints(&e.right) {
            self.taint_target(&e.left);
        }
        visit::visit_expr_binary(self, e);
    }

    fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
        if self.flow.taints(&e.expr) {
            self.taint_pattern(&e.pat);
        }
        visit::visit_expr_for_loop(self, e);
    }

    fn visit_expr_let(&mut self, e: &'ast syn::ExprLet) {
        if self.flow.taints(&e.expr) {
            self.taint_pattern(&e.pat);
        }
        visit::visit_expr_let(self, e);
    }

    fn visit_expr_match(&mut self, e: &'ast syn::ExprMatch) {
        if self.flow.taints(&e.expr) {
            for arm in &e.arms {
                self.taint_pattern(&arm.pat);
            }
        }
        visit::visit_expr_match(self, e);
    }

    fn visit_item_fn(&mut self, _: &'ast syn::ItemFn) {}
}
