//! PK105 graph-kept-across-steps: a tensor that still carries its autograd graph accumulated or
//! stored across steps.

use ruff_python_ast::Expr;
use ruff_text_size::Ranged;

use crate::analysis::CrateContext;
use crate::python::{PyContext, ValueKind, facts};
use crate::rules::{Finding, Rule, RuleMeta};

crate::declare_rule! {
    /// ## What it does
    /// Flags a loss or model output that still carries its autograd graph and is accumulated or
    /// stored across steps: `total += loss`, `total = total + loss`, `losses.append(loss)`,
    /// `self.running += loss` in a Lightning `training_step`.
    ///
    /// Values made with `.detach()` or `.item()`, code under `torch.no_grad()` and accumulators
    /// reset inside the step are not flagged. This rule has no Rust form yet: candle and burn free
    /// a step's graph with the tensors of that step, and tch-rs code that keeps them is rare.
    ///
    /// ## Why is this bad?
    /// A tensor computed from the model's parameters holds a reference to the whole graph that
    /// produced it, with every activation saved for the backward pass. Adding it to a running
    /// total (or a list) keeps that graph alive; the next step's graph is chained onto it, and
    /// device memory grows step after step until the run fails with an out-of-memory error, or
    /// becomes slower as the allocator struggles.
    ///
    /// ## Example
    /// ```python
    /// total = 0.0
    /// for x, y in loader:
    ///     loss = criterion(model(x), y)
    ///     loss.backward()
    ///     opt.step()
    ///     total += loss  # keeps every step's graph alive
    /// ```
    ///
    /// Use instead:
    /// ```python
    /// total = torch.zeros((), device=device)
    /// for x, y in loader:
    ///     loss = criterion(model(x), y)
    ///     loss.backward()
    ///     opt.step()
    ///     total += loss.detach()  # no graph, still on the device
    /// ```
    pub GraphKeptAcrossSteps {
        code: "PK105",
        name: "graph-kept-across-steps",
        severity: Warning,
        fixable: false,
    }
}

impl Rule for GraphKeptAcrossSteps {
    fn meta(&self) -> &'static RuleMeta {
        Self::meta_static()
    }

    fn check(&self, _cx: &CrateContext<'_>, _out: &mut Vec<Finding>) {
        // No Rust form yet (see the documentation).
    }

    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        let help = "accumulate `loss.detach()` (or `loss.item()` every N steps, outside the hot \
                    path) so that each step's graph can be freed";
        for (file, unit) in cx.units.iter().enumerate() {
            for acc in &unit.facts.accumulates {
                if acc.no_grad {
                    continue;
                }
                let Some(hit) =
                    cx.step_hit_at(file, acc.fn_idx, &acc.loops, acc.guard, acc.in_test)
                else {
                    continue;
                };
                if cx.value_kind_bound(file, acc.fn_idx, acc.value, acc.range.start().to_usize())
                    != ValueKind::Graph
                {
                    continue;
                }
                if !kept_across_steps(
                    cx,
                    file,
                    acc.fn_idx,
                    &acc.loops,
                    acc.target,
                    acc.range.start().to_usize(),
                ) {
                    continue;
                }
                let target = facts::dotted(acc.target).unwrap_or_else(|| "the total".into());
                out.push(
                    cx.finding(
                        file,
                        acc.value.range(),
                        format!("`{target}` accumulates a tensor that still carries its autograd graph, across steps"),
                        help,
                    )
                    .in_py_step_loop(cx, &hit),
                );
            }
        }
        for (file, call) in cx.calls_named(&["append", "extend", "add"]) {
            let (Some("append" | "extend" | "add"), Some(list)) = (call.method, call.receiver)
            else {
                continue;
            };
            if call.no_grad {
                continue;
            }
            let Some(value) = call.call.arguments.args.first() else {
                continue;
            };
            let Some(hit) = cx.step_hit(file, call) else {
                continue;
            };
            if cx.value_kind_bound(file, call.fn_idx, value, call.start) != ValueKind::Graph {
                continue;
            }
            if !kept_across_steps(cx, file, call.fn_idx, &call.loops, list, call.start) {
                continue;
            }
            let target = facts::dotted(list).unwrap_or_else(|| "the list".into());
            out.push(
                cx.finding(
                    file,
                    value.range(),
                    format!("`{target}` stores a tensor that still carries its autograd graph, across steps"),
                    help,
                )
                .in_py_step_loop(cx, &hit),
            );
        }
    }
}

/// Whether `target` outlives one step: bound before the innermost step loop (not reset in it), or
/// an attribute (`self.total`) when the code is a step body.
fn kept_across_steps(
    cx: &PyContext<'_>,
    file: usize,
    fn_idx: Option<usize>,
    loops: &[usize],
    target: &Expr,
    offset: usize,
) -> bool {
    let step_loop = loops
        .iter()
        .rev()
        .copied()
        .find(|&l| cx.is_step_loop(file, l));
    let Some(l) = step_loop else {
        // A step body (`training_step`) or a helper: only state that outlives the call counts.
        return matches!(target, Expr::Attribute(_));
    };
    let range = cx.units[file].facts.loops[l].range;
    match cx.binding(file, fn_idx, target, offset) {
        // Reset inside the loop: it lives one step.
        Some(assign) if assign.fn_idx == fn_idx => {
            !range.contains(ruff_text_size::TextSize::try_from(assign.at).unwrap_or_default())
        }
        Some(_) => true,
        None => matches!(target, Expr::Attribute(_)),
    }
}
