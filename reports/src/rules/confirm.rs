//! Static findings confirmed at run time.
//!
//! A lint finding whose source line also issued the operations of a runtime finding of the
//! same rule is marked `confirmed` and takes the measured cost.

use crate::findings::Finding;

/// Splits `path:line` or `path:line:column` into the path and the line.
fn split(location: &str) -> Option<(&str, u32)> {
    let mut parts = location.rsplitn(3, ':');
    let last = parts.next()?;
    let middle = parts.next()?;
    match (middle.parse::<u32>(), last.parse::<u32>()) {
        // path:line:column
        (Ok(line), Ok(_)) => Some((parts.next()?, line)),
        // path:line
        (Err(_), Ok(line)) => Some((&location[..location.len() - last.len() - 1], line)),
        _ => None,
    }
}

fn components(path: &str) -> Vec<&str> {
    path.split(['/', '\\'])
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// Whether two `file:line[:column]` locations name the same source line. Paths may be
/// relative to different directories (the linter's are relative to where it ran, the
/// recorder's are what `#[track_caller]` saw): the shorter must be a whole-component suffix
/// of the longer.
pub fn same_line(a: &str, b: &str) -> bool {
    let (Some((pa, la)), Some((pb, lb))) = (split(a), split(b)) else {
        return false;
    };
    if la != lb {
        return false;
    }
    let (ca, cb) = (components(pa), components(pb));
    if ca.is_empty() || cb.is_empty() {
        return false;
    }
    let n = ca.len().min(cb.len());
    ca[ca.len() - n..] == cb[cb.len() - n..]
}

/// Merges lint and runtime findings: each lint finding whose source line matches a runtime
/// finding of the same code becomes `confirmed` with that finding's cost, bytes and count.
/// Returns the lint findings (confirmed first, by cost) followed by the runtime findings.
pub fn confirm(mut lint: Vec<Finding>, runtime: Vec<Finding>) -> Vec<Finding> {
    for l in &mut lint {
        let Some(loc) = l.location.as_deref() else {
            // No source line: nothing to match.
            continue;
        };
        let hit = runtime.iter().find(|r| {
            r.code == l.code && r.location.as_deref().is_some_and(|rl| same_line(loc, rl))
        });
        if let Some(r) = hit {
            l.confirmed = true;
            l.cost_per_step_ns = r.cost_per_step_ns;
            l.share_of_step_percent = r.share_of_step_percent;
            l.bytes = r.bytes;
            l.count = r.count;
        }
    }
    lint.sort_by(|a, b| {
        b.confirmed.cmp(&a.confirmed).then_with(|| {
            b.cost_per_step_ns
                .unwrap_or(0)
                .cmp(&a.cost_per_step_ns.unwrap_or(0))
        })
    });
    lint.extend(runtime);
    lint
}
