//! The self-contained HTML report: one file, all CSS and JavaScript inline, a
//! Content-Security-Policy that forbids every outside load, aggregated data only.
//!
//! Every string of the traced program reaches the page inside one JSON block
//! (`<script type="application/json">`, with `<`, `>`, `&`, U+2028 and U+2029 escaped) and
//! is put into the DOM by the script with `textContent`, never parsed as markup.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};

use serde_json::{Value, json};

use crate::findings::Finding;
use crate::flame::{FlameKind, folded};
use crate::format;
use crate::model::Analysis;
use crate::summary::{pace_process, pinned_label};

const CSS: &str = include_str!("html/style.css");
const JS: &str = include_str!("html/report.js");

/// Options of the HTML report.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HtmlOptions {
    /// Page title. Default `perfkit report`.
    pub title: String,
    /// Rows kept in each top table. Default 200.
    pub max_rows: usize,
    /// Flamegraph frames narrower than this share of the total are left out. Default 0.0002.
    pub min_frame_share: f64,
    /// Creation time shown in the header (any text). Default: empty.
    pub created: String,
    /// Why the run is incomplete beyond what its traces show (the program was ended by a
    /// signal), from the run's summary; when not empty, these are the reasons shown and the
    /// run is incomplete. Default: empty.
    pub run_incomplete: Vec<String>,
}

impl Default for HtmlOptions {
    fn default() -> Self {
        Self {
            title: "perfkit report".to_owned(),
            max_rows: 200,
            min_frame_share: 0.0002,
            created: String::new(),
            run_incomplete: Vec::new(),
        }
    }
}

/// Escapes text for HTML element content and attribute values.
pub fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Serialises JSON so that it is safe inside `<script>`: `<`, `>`, `&`, U+2028 and U+2029
/// become `\uXXXX` escapes (the JSON value is unchanged).
pub fn json_for_script(value: &Value) -> String {
    let raw = value.to_string();
    let mut out = String::with_capacity(raw.len() + raw.len() / 16);
    for c in raw.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// A fresh random nonce for the page's Content-Security-Policy (128 bits, hex).
pub(crate) fn nonce() -> String {
    let mut s = String::new();
    for i in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        s.push_str(&format!("{:016x}", h.finish()));
    }
    s
}

/// A flamegraph tree `[name, total, [children...]]` from folded stacks, leaving out frames
/// below `min_share` of the total.
fn flame_tree(stacks: &BTreeMap<String, u64>, min_share: f64) -> Value {
    #[derive(Default)]
    struct N {
        total: u64,
        children: HashMap<String, N>,
    }
    let mut root = N::default();
    for (stack, &v) in stacks {
        root.total += v;
        let mut cur = &mut root;
        for f in stack.split(';') {
            cur = cur.children.entry(f.to_owned()).or_default();
            cur.total += v;
        }
    }
    let min = (root.total as f64 * min_share) as u64;
    fn to_value(name: &str, n: &N, min: u64) -> Value {
        let mut kids: Vec<(&String, &N)> =
            n.children.iter().filter(|(_, c)| c.total > min).collect();
        kids.sort_by(|a, b| a.0.cmp(b.0));
        let children: Vec<Value> = kids.into_iter().map(|(k, c)| to_value(k, c, min)).collect();
        if children.is_empty() {
            json!([name, n.total])
        } else {
            json!([name, n.total, children])
        }
    }
    to_value("all", &root, min)
}

fn table(columns: &[(&str, &str)], rows: Vec<Value>, empty: &str) -> Value {
    json!({
        "columns": columns.iter().map(|(n, k)| json!([n, k])).collect::<Vec<_>>(),
        "rows": rows,
        "empty": empty,
    })
}

/// The data block of the page.
pub fn report_data(analysis: &Analysis, findings: &[Finding], options: &HtmlOptions) -> Value {
    let several = analysis.processes.len() > 1;
    let pace = pace_process(&analysis.processes);
    let processes: Vec<Value> = analysis
        .processes
        .iter()
        .map(|p| {
            json!({
                "label": p.meta.label(), "host": p.meta.host, "pid": p.meta.pid,
                "command": p.meta.command.join(" "), "file": p.meta.file,
                "events": p.events, "dropped": p.dropped_events,
            })
        })
        .collect();

    // Cards.
    let mut cards =
        vec![json!({"label": "wall time", "value": format::duration(analysis.duration_ns)})];
    if let Some(p) = pace {
        let s = &p.steps.duration;
        if s.count > 0 {
            cards.push(json!({"label": "steps", "value": s.count.to_string()}));
            cards.push(json!({"label": "median step", "value": format::duration(s.median_ns)}));
            cards.push(json!({"label": "p95 step", "value": format::duration(s.p95_ns)}));
            cards.push(json!({"label": "step spread (MAD)", "value": format::duration(s.mad_ns)}));
        }
        if p.gpu.busy_ns > 0 || !p.kernels.is_empty() {
            cards.push(
                json!({"label": "GPU busy", "value": format::percent(p.gpu.utilization_percent / 100.0),
                "warn": p.gpu.utilization_percent < 50.0}),
            );
            cards.push(json!({"label": "longest GPU idle gap", "value": format::duration(p.gpu.longest_gap_ns)}));
        }
        if p.copies.total.count > 0 {
            cards.push(json!({"label": format!("copied in {} copies", p.copies.total.count), "value": format::bytes(p.copies.total.bytes)}));
        }
        if p.syncs.count > 0 {
            cards.push(json!({"label": "host blocked in syncs", "value": format::duration(p.syncs.blocked_ns)}));
        }
        if p.memory.allocs > 0 {
            cards.push(
                json!({"label": "device memory peak", "value": format::bytes(p.memory.peak_bytes)}),
            );
        }
    }
    let dropped: u64 = analysis.processes.iter().map(|p| p.dropped_events).sum();
    cards.push(
        json!({"label": "dropped events", "value": dropped.to_string(), "warn": dropped > 0}),
    );
    if several {
        cards.push(json!({"label": "processes", "value": analysis.processes.len().to_string()}));
    }
    if let Some(r) = &analysis.ranks {
        cards.push(json!({"label": "straggler", "value": format!("{} ({})", r.straggler, format::signed_percent(r.straggler_excess_percent / 100.0)), "warn": r.straggler_excess_percent > 5.0}));
    }

    let steps = pace.map_or(json!({"points": [], "bucket": 1, "span": "step"}), |p| {
        json!({
            "process": p.meta.label(),
            "span": p.steps.span_name,
            "bucket": p.steps.series_bucket,
            // Without any GPU work recorded the breakdown would read as 100 % GPU idle.
            "gpu": p.gpu.busy_ns > 0 || !p.kernels.is_empty() || p.copies.total.count > 0 || p.syncs.count > 0,
            "points": p.steps.series.iter().map(|s| json!([s.index, s.breakdown.wall_ns, s.breakdown.kernel_ns, s.breakdown.copy_ns, s.breakdown.sync_wait_ns, s.breakdown.idle_ns])).collect::<Vec<_>>(),
        })
    });
    let memory = pace.map_or(
        json!({"points": [], "peak": 0}),
        |p| json!({"peak": p.memory.peak_bytes, "points": p.memory.series}),
    );

    let flames = json!({
        "host": flame_tree(&folded(&analysis.processes, FlameKind::Host), options.min_frame_share),
        "gpu": flame_tree(&folded(&analysis.processes, FlameKind::Gpu), options.min_frame_share),
    });

    let tl = &analysis.timeline;
    let timeline = json!({
        "process": tl.process,
        "windows": tl.windows.iter().map(|w| json!({"label": w.label, "step": w.step, "start": w.start_ns, "end": w.end_ns, "truncated": w.truncated})).collect::<Vec<_>>(),
        "tracks": tl.tracks.iter().map(|t| json!({"name": t.name, "items": t.items.iter().map(|i| json!([i.window, i.start_ns, i.dur_ns, i.depth, i.kind, i.name])).collect::<Vec<_>>()})).collect::<Vec<_>>(),
    });

    // Tables (all processes; a process column when there are several).
    let mut spans = Vec::new();
    let mut kernels = Vec::new();
    let mut copies = Vec::new();
    let mut syncs = Vec::new();
    for p in &analysis.processes {
        let who = p.meta.label();
        let with = |mut row: Vec<Value>| {
            if several {
                row.push(json!(who));
            }
            Value::Array(row)
        };
        for s in &p.spans {
            spans.push(with(vec![
                json!(s.name),
                json!(s.calls),
                json!(s.total_ns),
                json!(s.self_ns),
                json!(s.mean_ns),
                json!(s.max_ns),
            ]));
        }
        for k in &p.kernels {
            kernels.push(with(vec![
                json!(k.name),
                json!(k.count),
                json!(k.total_ns),
                json!(k.mean_ns),
                json!(k.min_ns),
                json!(k.max_ns),
                json!(k.launch_ns),
            ]));
        }
        for c in &p.copies.by_site {
            copies.push(with(vec![
                json!(c.location),
                json!(copy_site_kind(c)),
                json!(c.totals.count),
                json!(c.totals.bytes),
                json!(c.totals.gpu_ns),
                json!(c.bandwidth_gbps),
            ]));
        }
        for s in &p.syncs.by_site {
            syncs.push(with(vec![
                json!(s.location),
                json!(s.count),
                json!(s.blocked_ns),
            ]));
        }
    }
    let proc_col: &[(&str, &str)] = if several { &[("process", "text")] } else { &[] };
    let cols = |base: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        let mut v = base.to_vec();
        v.extend_from_slice(proc_col);
        v
    };
    let top = |mut rows: Vec<Value>, key: usize| {
        rows.sort_by(|a, b| b[key].as_u64().cmp(&a[key].as_u64()));
        rows.truncate(options.max_rows);
        rows
    };
    let tables = json!({
        "spans": table(&cols(&[("span", "text"), ("calls", "num"), ("total", "ns"), ("self", "ns"), ("mean", "ns"), ("max", "ns")]), top(spans, 2), "No spans recorded."),
        "kernels": table(&cols(&[("kernel", "text"), ("count", "num"), ("total", "ns"), ("mean", "ns"), ("min", "ns"), ("max", "ns"), ("launch (host)", "ns")]), top(kernels, 2), "No kernels recorded."),
        "copies": table(&cols(&[("source line", "text"), ("kind", "text"), ("count", "num"), ("bytes", "bytes"), ("GPU time", "ns"), ("bandwidth", "rate")]), top(copies, 4), "No copies recorded."),
        "syncs": table(&cols(&[("source line", "text"), ("count", "num"), ("host blocked", "ns")]), top(syncs, 2), "No synchronizations recorded."),
        "ranks": analysis.ranks.as_ref().map(|r| table(&[("process", "text"), ("host", "text"), ("steps", "num"), ("median", "ns"), ("p95", "ns"), ("mean", "ns"), ("slowest in steps", "num")],
            r.rows.iter().map(|row| json!([row.label, row.host, row.steps.count, row.steps.median_ns, row.steps.p95_ns, row.steps.mean_ns, row.slowest_in_steps])).collect(), "")),
    });

    json!({
        "title": options.title,
        "source": analysis.source,
        "synthetic": analysis.is_synthetic(),
        "generator": format!("perfkit {}", env!("CARGO_PKG_VERSION")),
        "created": options.created,
        "complete": analysis.complete && options.run_incomplete.is_empty(),
        "incomplete_reasons": if options.run_incomplete.is_empty() {
            analysis.incomplete_reasons()
        } else {
            options.run_incomplete.clone()
        },
        "notes": analysis.notes(),
        "duration_ns": analysis.duration_ns,
        "processes": processes,
        "cards": cards,
        "steps": steps,
        "memory": memory,
        "flames": flames,
        "timeline": timeline,
        "tables": tables,
        "ranks_note": analysis.ranks.as_ref().map(|r| format!("Straggler: {} (median step {} against the other processes' median).", r.straggler, format::signed_percent(r.straggler_excess_percent / 100.0))),
        "findings": findings,
    })
}

/// Renders the whole page.
pub fn render(analysis: &Analysis, findings: &[Finding], options: &HtmlOptions) -> String {
    let data = json_for_script(&report_data(analysis, findings, options));
    let nonce = nonce();
    let title = escape_text(&options.title);
    let mut page = String::with_capacity(data.len() + CSS.len() + JS.len() + 4096);
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    page.push_str(&format!(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src data:; font-src 'none'; connect-src 'none'; base-uri 'none'; form-action 'none'\">\n"
    ));
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    page.push_str(&format!(
        "<title>{title}</title>\n<style nonce=\"{nonce}\">\n{CSS}</style>\n</head>\n<body>\n"
    ));
    let synthetic = if analysis.is_synthetic() {
        format!(
            "<div class=\"meta synthetic\" id=\"synthetic\">{}: not measured on a GPU</div>",
            crate::model::SYNTHETIC_NOTE
        )
    } else {
        String::new()
    };
    page.push_str(&format!(
        "<header><h1>{title}</h1>{synthetic}<div class=\"meta\" id=\"source\"></div><div class=\"meta\" id=\"meta\"></div></header>\n"
    ));
    page.push_str(concat!(
        "<main>\n",
        "<section><h2>Summary</h2><div class=\"cards\" id=\"cards\"></div></section>\n",
        "<section><h2>Findings</h2><div id=\"findings\"></div></section>\n",
        "<section><h2>Time per step</h2><div class=\"legend\" id=\"step-legend\"><span><i class=\"sw-kernel\"></i>kernels</span><span><i class=\"sw-copy\"></i>copies</span><span><i class=\"sw-sync\"></i>sync wait</span><span><i class=\"sw-idle\"></i>GPU idle</span></div><div class=\"chart\" id=\"step-chart\"></div></section>\n",
        "<section><h2>Timeline of selected steps</h2><div id=\"timeline\"></div></section>\n",
        "<section><h2>Flamegraphs</h2><div id=\"flame\"></div></section>\n",
        "<section id=\"ranks\"><h2>Ranks</h2><p id=\"ranks-note\"></p><div id=\"ranks-table\"></div></section>\n",
        "<section><h2>Spans</h2><div id=\"spans-table\"></div></section>\n",
        "<section><h2>Kernels</h2><div id=\"kernels-table\"></div></section>\n",
        "<section><h2>Copies by source line</h2><div id=\"copies-table\"></div></section>\n",
        "<section><h2>Synchronizations by source line</h2><div id=\"syncs-table\"></div></section>\n",
        "<section><h2>Device memory</h2><div class=\"chart\" id=\"memory-chart\"></div></section>\n",
        "</main>\n<div class=\"tip\" id=\"tip\"></div>\n",
    ));
    page.push_str("<script type=\"application/json\" id=\"perfkit-data\">");
    page.push_str(&data);
    page.push_str("</script>\n");
    page.push_str(&format!(
        "<script nonce=\"{nonce}\">\n{JS}</script>\n</body>\n</html>\n"
    ));
    page
}

/// A copy site's kind column: direction and host memory, and how many of its copies have
/// their GPU end at the host return (an upper bound of their GPU time).
fn copy_site_kind(c: &crate::model::CopySite) -> String {
    let kind = format!("{} {}", c.direction.as_str(), pinned_label(c.pinned));
    let kind = kind.trim();
    match c.gpu_end_at_host_return {
        0 => kind.to_owned(),
        n => format!("{kind} ({n} with the GPU end at the host return)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_close_the_script_element() {
        let v = json!({"name": "</script><script>alert(1)</script>\u{2028}&"});
        let s = json_for_script(&v);
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'));
        assert!(!s.contains('\u{2028}'));
        let back: Value = serde_json::from_str(&s).expect("still JSON");
        assert_eq!(back, v);
    }

    #[test]
    fn text_escaping() {
        assert_eq!(
            escape_text("\"><img src=x onerror=alert(1)>"),
            "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"
        );
    }

    #[test]
    fn flame_tree_sums_children_and_prunes() {
        let mut m = BTreeMap::new();
        m.insert("a;b".to_owned(), 70);
        m.insert("a;c".to_owned(), 29_999);
        m.insert("d".to_owned(), 1);
        let t = flame_tree(&m, 0.001);
        assert_eq!(t[1], 30_070);
        assert_eq!(
            t[2].as_array().map(Vec::len),
            Some(1),
            "d is below 0.1 % and pruned"
        );
        assert_eq!(t[2][0][2][0][0], "b");
    }
}
