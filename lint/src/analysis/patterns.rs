//! Small syntactic helpers shared by rules: constructor calls, call chains, root bindings.

use syn::Expr;

use super::{CallFact, CallRef, DeviceKind, device::device_of_expr, with_ident_str};

/// `Tensor::<name>(..)` (also `Tensor::<B, 2>::name`, `tch::Tensor::name`) with `name` in `names`.
pub fn is_tensor_fn(call: &CallFact<'_>, names: &[&str]) -> bool {
    !call.call.is_method()
        && names.contains(&call.name)
        && call.call.qualifier().is_some_and(|q| q == "Tensor")
}

/// The device named by a call's last argument (candle `&device`, burn `&device`, tch options).
pub fn last_arg_device(call: &CallRef<'_>) -> DeviceKind {
    call.args()
        .last()
        .map(device_of_expr)
        .unwrap_or(DeviceKind::Unknown)
}

/// Whether a method-call chain (the receiver side of `expr`) contains a call named in `names`,
/// as a method or as the callee path's last segment.
pub fn chain_has(expr: &Expr, names: &[&str]) -> bool {
    let mut at = expr;
    loop {
        match at {
            Expr::MethodCall(m) => {
                if with_ident_str(&m.method, |n| names.contains(&n)) {
                    return true;
                }
                at = &m.receiver;
            }
            Expr::Call(c) => {
                if let Expr::Path(p) = &*c.func
                    && let Some(last) = p.path.segments.last()
                    && with_ident_str(&last.ident, |n| names.contains(&n))
                {
                    return true;
                }
                return false;
            }
            Expr::Try(t) => at = &t.expr,
            Expr::Paren(p) => at = &p.expr,
            Expr::Reference(r) => at = &r.expr,
            _ => return false,
        }
    }
}

/// The variable or field an expression reads from: `buf` in `&buf[..]`, `self.pinned` -> `pinned`.
pub fn root_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        Expr::Field(f) => match &f.member {
            syn::Member::Named(ident) => Some(ident.to_string()),
            syn::Member::Unnamed(_) => root_name(&f.base),
        },
        Expr::Reference(r) => root_name(&r.expr),
        Expr::Index(i) => root_name(&i.expr),
        Expr::Paren(p) => root_name(&p.expr),
        Expr::MethodCall(m) => root_name(&m.receiver),
        _ => None,
    }
}

/// A call sits inside loop `l` (directly or in a loop nested in it).
pub fn is_inside_loop(loops: &[super::LoopFact], call: &CallFact<'_>, l: usize) -> bool {
    let mut at = call.loop_idx;
    while let Some(idx) = at {
        if idx == l {
            return true;
        }
        at = loops[idx].parent;
    }
    false
}

/// The name a pattern binds: `x`, `mut x` or `x: T`; `None` for destructuring patterns.
pub fn binding_name(pat: &syn::Pat) -> Option<String> {
    match pat {
        syn::Pat::Ident(p) => Some(p.ident.to_string()),
        syn::Pat::Type(t) => binding_name(&t.pat),
        _ => None,
    }
}
