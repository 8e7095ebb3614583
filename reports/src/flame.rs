//! Folded stacks and flamegraphs (rendered with `inferno`).
//!
//! Folded lines are `frame;frame;frame COUNT` with COUNT in nanoseconds, the format of
//! Brendan Gregg's `flamegraph.pl`, inferno and speedscope.

use std::collections::BTreeMap;
use std::io::Write;

use crate::error::{Error, Result};
use crate::ingest::{MAX_STACK_DEPTH, deeper_frame};
use crate::model::{ProcessAnalysis, StackTime};

/// Which time a folded file or flamegraph shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlameKind {
    /// Host wall time by span stack (self time of each stack).
    Host,
    /// GPU time attributed to the host span stack that issued the work.
    Gpu,
}

impl FlameKind {
    /// `host` or `gpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            FlameKind::Host => "host",
            FlameKind::Gpu => "gpu",
        }
    }
}

/// Makes a span name safe as a folded frame: no `;`, no line breaks or other control
/// characters, no space at either end (inferno trims lines, and a frame that is empty or
/// starts with a space would be lost or break the order of the lines); a name with nothing
/// left is [`UNNAMED_SPAN`](perfkit_profiler::summary::UNNAMED_SPAN).
pub fn frame_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    let trimmed = safe.trim();
    if trimmed.is_empty() {
        perfkit_profiler::summary::UNNAMED_SPAN.to_owned()
    } else if trimmed.len() == safe.len() {
        safe
    } else {
        trimmed.to_owned()
    }
}

/// Folded stacks of a run, merged across processes (a `rank N` / `pid N` root frame is
/// added when there are several), sorted, with zero-count stacks left out.
pub fn folded(processes: &[ProcessAnalysis], kind: FlameKind) -> BTreeMap<String, u64> {
    let several = processes.len() > 1;
    let mut out = BTreeMap::new();
    for p in processes {
        let root = several.then(|| frame_name(&p.meta.label()));
        add_stacks(&mut out, &p.stacks, kind, root.as_deref());
    }
    out
}

/// Adds `stacks` to a folded map.
pub fn add_stacks(
    out: &mut BTreeMap<String, u64>,
    stacks: &[StackTime],
    kind: FlameKind,
    root: Option<&str>,
) {
    for s in stacks {
        let value = match kind {
            FlameKind::Host => s.host_ns,
            FlameKind::Gpu => s.gpu_ns,
        };
        if value == 0 {
            continue;
        }
        let mut key = String::new();
        if let Some(r) = root {
            key.push_str(r);
        }
        // Stacks from an analysis are cut at `MAX_STACK_DEPTH` frames already; those of a
        // `summary.json` written elsewhere may not be.
        let (kept, deeper) = if s.frames.len() > MAX_STACK_DEPTH + 1 {
            (
                &s.frames[..MAX_STACK_DEPTH],
                Some(deeper_frame((s.frames.len() - MAX_STACK_DEPTH) as u64)),
            )
        } else {
            (&s.frames[..], None)
        };
        for f in kept.iter().chain(&deeper) {
            if !key.is_empty() {
                key.push(';');
            }
            key.push_str(&frame_name(f));
        }
        let count = out.entry(key).or_insert(0);
        *count = count.saturating_add(value);
    }
}

/// Writes folded lines.
/// The frame that labels the folded stacks of an incomplete run (a stack of its own, 1 ns).
pub const INCOMPLETE_FRAME: &str =
    "[perfkit: INCOMPLETE run, some time is missing; see summary.json]";

/// What the title of a flamegraph of an incomplete run ends with.
pub const INCOMPLETE_TITLE: &str = " - INCOMPLETE run: some time is missing (see summary.json)";

pub fn write_folded(stacks: &BTreeMap<String, u64>, mut w: impl Write) -> std::io::Result<()> {
    for (stack, count) in stacks {
        writeln!(w, "{stack} {count}")?;
    }
    Ok(())
}

/// Renders an interactive flamegraph SVG of folded stacks. An empty input gives a small SVG
/// that says there is nothing to show (inferno itself refuses empty input).
pub fn write_svg(
    stacks: &BTreeMap<String, u64>,
    title: &str,
    count_name: &str,
    w: impl Write,
) -> Result<()> {
    let (fitted, title) = fit_for_inferno(&[stacks], title);
    let lines: Vec<String> = fitted[0].iter().map(|(s, c)| format!("{s} {c}")).collect();
    render_lines(&lines, &title, count_name, w)
}

/// The largest sum of counts handed to inferno: it adds counts up in `usize` and takes
/// differences in `isize`; 2^52 ns is 52 days, and exact in an `f64`.
const INFERNO_MAX_TOTAL: u128 = 1 << 52;

/// `maps` as they are when their counts sum to at most [`INFERNO_MAX_TOTAL`]; otherwise (a
/// damaged or hand-made trace) every count divided by the same factor (a count that was not 0
/// stays at least 1), and `title` says so.
fn fit_for_inferno(
    maps: &[&BTreeMap<String, u64>],
    title: &str,
) -> (Vec<BTreeMap<String, u64>>, String) {
    let total: u128 = maps
        .iter()
        .flat_map(|m| m.values())
        .map(|&c| u128::from(c))
        .sum();
    if total <= INFERNO_MAX_TOTAL {
        return (maps.iter().map(|&m| m.clone()).collect(), title.to_owned());
    }
    let factor = total.div_ceil(INFERNO_MAX_TOTAL);
    let scaled = maps
        .iter()
        .map(|m| {
            m.iter()
                .map(|(k, &c)| {
                    let c = u64::try_from(u128::from(c) / factor).unwrap_or(u64::MAX);
                    (k.clone(), c.max(1))
                })
                .collect()
        })
        .collect();
    (
        scaled,
        format!("{title} (counts scaled down by {factor}: too large to draw)"),
    )
}

fn render_lines(lines: &[String], title: &str, count_name: &str, mut w: impl Write) -> Result<()> {
    if lines.is_empty() {
        return note_svg(title, "no samples", w);
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = count_name.to_owned();
    opts.deterministic = true;
    opts.hash = true;
    // Drawn in memory first: a flamegraph inferno refuses (nothing it can draw) is a note in
    // its file, not a half-written file and a failed report.
    let mut svg = Vec::new();
    match inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg) {
        Ok(()) => w.write_all(&svg).map_err(|e| flame_err(title, e)),
        Err(e) => note_svg(title, &format!("nothing drawn ({e})"), w),
    }
}

/// A small SVG that says why there is no flamegraph: `<title>: <note>`.
fn note_svg(title: &str, note: &str, mut w: impl Write) -> Result<()> {
    write!(
        w,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"60\"><text x=\"10\" y=\"30\" font-family=\"sans-serif\">{}: {}</text></svg>\n",
        crate::html::escape_text(title),
        crate::html::escape_text(note)
    )
    .map_err(|e| flame_err(title, e))
}

/// A differential flamegraph: the shape of `new`, coloured by the change from `base`
/// (red grew, blue shrank), through inferno's differential folding.
pub fn write_differential_svg(
    base: &BTreeMap<String, u64>,
    new: &BTreeMap<String, u64>,
    title: &str,
    w: impl Write,
) -> Result<()> {
    let (fitted, title) = fit_for_inferno(&[base, new], title);
    let title = title.as_str();
    if fitted[1].is_empty() {
        // The shape is the new run's, and it has none (inferno refuses empty input): a run
        // without GPU work against one with it.
        return render_lines(&[], &format!("{title} (the new run has none)"), "ns", w);
    }
    let mut before = Vec::new();
    let mut after = Vec::new();
    write_folded(&fitted[0], &mut before).map_err(|e| flame_err(title, e))?;
    write_folded(&fitted[1], &mut after).map_err(|e| flame_err(title, e))?;
    let mut diff = Vec::new();
    if let Err(e) = inferno::differential::from_readers(
        inferno::differential::Options::default(),
        before.as_slice(),
        after.as_slice(),
        &mut diff,
    ) {
        return note_svg(title, &format!("nothing drawn ({e})"), w);
    }
    let text = String::from_utf8_lossy(&diff);
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    render_lines(&lines, title, "ns", w)
}

fn flame_err(title: &str, e: std::io::Error) -> Error {
    Error::Flamegraph {
        what: title.to_owned(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_names_are_never_empty_nor_padded() {
        assert_eq!(frame_name(""), "<unnamed>");
        assert_eq!(frame_name(" \t\n"), "<unnamed>");
        assert_eq!(frame_name(" a;b\u{1}c\n"), "a:b c");
        assert_eq!(frame_name("forward"), "forward");
    }

    /// A flamegraph inferno cannot draw is a note in its file, not an error that stops the
    /// report.
    #[test]
    fn a_flamegraph_with_nothing_to_draw_is_a_note() {
        let blank: BTreeMap<String, u64> = [(" ".to_owned(), 5)].into_iter().collect();
        let mut svg = Vec::new();
        write_svg(&blank, "host", "ns", &mut svg).expect("a note, not an error");
        let svg = String::from_utf8(svg).expect("utf-8");
        assert!(
            svg.contains("host: nothing drawn (No stack counts found)"),
            "{svg}"
        );
    }

    /// Counts whose sum passes what inferno can add up (a damaged or hand-made trace with spans
    /// of centuries): scaled down, and the title says so, instead of an overflow in inferno.
    #[test]
    fn counts_too_large_for_inferno_are_scaled_and_said_so() {
        let huge: BTreeMap<String, u64> = [
            ("step".to_owned(), u64::MAX),
            ("step;data".to_owned(), u64::MAX - 1),
            ("other".to_owned(), 5),
        ]
        .into_iter()
        .collect();
        let small: BTreeMap<String, u64> = [("step".to_owned(), 10)].into_iter().collect();
        for (base, new) in [(&small, &huge), (&huge, &small), (&huge, &huge)] {
            let mut svg = Vec::new();
            write_differential_svg(base, new, "diff", &mut svg).expect("differential");
            let svg = String::from_utf8(svg).expect("utf-8");
            assert!(svg.contains("scaled down"), "{svg}");
        }
        let mut svg = Vec::new();
        write_svg(&huge, "host", "ns", &mut svg).expect("flamegraph");
        assert!(
            String::from_utf8(svg)
                .expect("utf-8")
                .contains("scaled down")
        );
        // Ordinary counts are left as they are.
        let mut svg = Vec::new();
        write_svg(&small, "host", "ns", &mut svg).expect("flamegraph");
        assert!(
            !String::from_utf8(svg)
                .expect("utf-8")
                .contains("scaled down")
        );
    }
}
