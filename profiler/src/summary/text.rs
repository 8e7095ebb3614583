//! The terminal summary.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::{SpanStats, StepStats, Summary};

/// Rows of the span table shown in the terminal; `summary.json` has them all.
const MAX_ROWS: usize = 25;
/// Longest span name shown before it is cut with `…`.
const MAX_NAME: usize = 40;

/// What a user adds to a program so that `perfkit profile` records it.
/// The dependency is a path to a clone of perfkit until the crates are published.
pub const INSTRUMENT_HINT: &str = concat!(
    "  1. Cargo.toml, [dependencies]:  perfkit-profiler = { path = \"../perfkit/profiler\" }\n",
    "     (a clone of perfkit beside your project; not on crates.io yet)\n",
    "  2. first line of main():        let _perfkit = perfkit_profiler::init();\n",
    "  3. fetch each batch in a span:  use perfkit_profiler::tracing::info_span;\n",
    "                                  while let Some(batch) = info_span!(\"data\").in_scope(|| batches.next()) {\n",
    "  4. around each training step:      let _step = info_span!(\"step\").entered();",
);

/// `812 ns`, `15.3 µs`, `4.21 ms`, `1.93 s`, `2 min 5 s`: three significant digits.
pub fn format_duration_ns(ns: u64) -> String {
    let v = ns as f64;
    let three = |x: f64, unit: &str| {
        if x >= 100.0 {
            format!("{x:.0} {unit}")
        } else if x >= 10.0 {
            format!("{x:.1} {unit}")
        } else {
            format!("{x:.2} {unit}")
        }
    };
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        three(v / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        three(v / 1e6, "ms")
    } else if ns < 120_000_000_000 {
        three(v / 1e9, "s")
    } else {
        let secs = ns / 1_000_000_000;
        format!("{} min {} s", secs / 60, secs % 60)
    }
}

/// `1.5 GiB`, `12.0 MiB`, `3.0 KiB`, `17 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = next;
    }
    format!("{v:.1} {unit}")
}

/// What a report file is, from its name.
fn report_label(file: &str) -> &'static str {
    if file.ends_with(".html") {
        "report"
    } else if file.ends_with(".svg") {
        "flamegraph"
    } else if file.ends_with(".folded") {
        "stacks"
    } else if file.ends_with(".chrome.json") {
        "perfetto"
    } else if file.ends_with(".md") {
        "markdown"
    } else {
        "report"
    }
}

/// Makes a string from the traced program safe to print: control characters (terminal escape
/// sequences) are escaped and long names are cut.
fn printable(name: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn steps_line(steps: &StepStats) -> String {
    let (Some(mean), Some(median), Some(p95)) = (steps.mean_ns, steps.median_ns, steps.p95_ns)
    else {
        return format!(
            "steps      none (no span named `{}` completed)",
            printable(&steps.span, MAX_NAME)
        );
    };
    format!(
        "steps      {}   mean {}   median {}   p95 {}   (min {}, max {})",
        steps.count,
        format_duration_ns(mean),
        format_duration_ns(median),
        format_duration_ns(p95),
        format_duration_ns(steps.min_ns.unwrap_or(0)),
        format_duration_ns(steps.max_ns.unwrap_or(0)),
    )
}

fn span_table(spans: &[SpanStats], wall_ns: u64) -> String {
    let headers = [
        "Action",
        "Mean duration",
        "Num calls",
        "Total time",
        "Self time",
        "% of wall",
    ];
    let mut rows: Vec<[String; 6]> = vec![[
        "Total (wall)".to_owned(),
        "-".to_owned(),
        "1".to_owned(),
        format_duration_ns(wall_ns),
        "-".to_owned(),
        "100 %".to_owned(),
    ]];
    rows.extend(spans.iter().take(MAX_ROWS).map(|s| {
        [
            printable(&s.name, MAX_NAME),
            format_duration_ns(s.mean_ns),
            s.calls.to_string(),
            format_duration_ns(s.total_ns),
            format_duration_ns(s.self_ns),
            format!("{:.1} %", s.percent_of_wall),
        ]
    }));
    let mut widths = headers.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: [&str; 6]| {
        let mut l = String::from("  ");
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            if i == 0 {
                l.push_str(cell);
                l.push_str(&" ".repeat(pad));
            } else {
                l.push_str("  ");
                l.push_str(&" ".repeat(pad));
                l.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(&mut out, headers);
    let total_width = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    let _ = writeln!(out, "  {}", "-".repeat(total_width));
    for row in &rows {
        line(
            &mut out,
            [&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]],
        );
    }
    if spans.len() > MAX_ROWS {
        let _ = writeln!(
            out,
            "  ... {} more span names in summary.json",
            spans.len() - MAX_ROWS
        );
    }
    out
}

impl Summary {
    /// Writes the terminal summary. `run_dir` is how to show the run directory (the paths in the
    /// summary are relative to it).
    ///
    /// # Errors
    /// Any error of `out`.
    pub fn write_text(&self, out: &mut impl Write, run_dir: &str) -> io::Result<()> {
        let run = &self.run;
        let mut s = String::new();
        let program = printable(&run.program, 80);
        let ended = run
            .exit
            .as_ref()
            .map_or("an unknown status", |e| e.description.as_str());
        let _ = writeln!(
            s,
            "\nperfkit: `{program}` ended with {ended} after {}",
            format_duration_ns(run.wall_time_ns)
        );
        for sig in &run.signals {
            let _ = writeln!(
                s,
                "perfkit: received {} from {}{}",
                sig.name,
                sig.from,
                if sig.forwarded {
                    ", forwarded it to the program"
                } else if sig.from == "terminal" {
                    " (the program received it directly)"
                } else {
                    ""
                }
            );
        }
        if !self.instrumented {
            let _ = writeln!(
                s,
                "perfkit: no trace was written: the program is not instrumented with perfkit-profiler\n\
                 \x20        (or it never called `perfkit_profiler::init()`). To record it:\n{INSTRUMENT_HINT}"
            );
        } else {
            s.push('\n');
            if self.processes.len() > 1
                && let Some(pid) = self.primary_pid
            {
                let rank = self
                    .processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .and_then(|p| p.rank)
                    .map(|r| format!(" rank {r}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "process    pid {pid}{rank} (figures below; {} traced processes in all)",
                    self.processes.len()
                );
            }
            let _ = writeln!(s, "{}", steps_line(&self.steps));
            let _ = writeln!(s, "wall time  {}\n", format_duration_ns(run.wall_time_ns));
            s.push_str(&span_table(&self.spans, run.wall_time_ns));
            let mut others = self
                .processes
                .iter()
                .filter(|p| Some(p.pid) != self.primary_pid)
                .peekable();
            if others.peek().is_some() {
                s.push('\n');
            }
            for p in others {
                let rank = p.rank.map(|r| format!(" rank {r}")).unwrap_or_default();
                let median = p
                    .steps
                    .median_ns
                    .map(|m| format!(", median step {}", format_duration_ns(m)))
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "  also traced: pid {}{rank}: {} steps{median}, {} span names",
                    p.pid,
                    p.steps.count,
                    p.spans.len()
                );
            }
            if self.dropped_events > 0 {
                let _ = writeln!(
                    s,
                    "\nwarning: {} events were dropped (the program produced them faster than the \
                     trace writer could store them); the figures above undercount",
                    self.dropped_events
                );
            }
            let open: u64 = self.processes.iter().map(|p| p.open_spans).sum();
            if open > 0 {
                let _ = writeln!(
                    s,
                    "note: {open} spans were still open where the trace ends (not counted above)"
                );
            }
        }
        if run.incomplete {
            let _ = writeln!(s, "\nrun incomplete:");
            for reason in &run.incomplete_reasons {
                let _ = writeln!(s, "  - {}", printable(reason, 300));
            }
        }
        let _ = writeln!(s, "\nfiles");
        let sep = if run_dir.ends_with('/') { "" } else { "/" };
        let (main, other): (Vec<&String>, Vec<&String>) = self
            .files
            .reports
            .iter()
            .partition(|r| r.ends_with(".html") || r.ends_with(".svg"));
        // The HTML report first, then the flamegraphs.
        let (html, svg): (Vec<&String>, Vec<&String>) =
            main.into_iter().partition(|r| r.ends_with(".html"));
        for report in html.into_iter().chain(svg) {
            let _ = writeln!(s, "  {:<10} {run_dir}{sep}{report}", report_label(report));
        }
        if let Some(why) = &self.files.reports_error {
            let _ = writeln!(s, "  reports    not written: {}", printable(why, 300));
        }
        match &self.files.summary_error {
            Some(why) => {
                let _ = writeln!(s, "  summary    not written: {}", printable(why, 300));
            }
            None => {
                let _ = writeln!(s, "  summary    {run_dir}{sep}{}", self.files.summary);
            }
        }
        let count = self.files.trace_files.len();
        let contents = if count == 0 {
            "empty".to_owned()
        } else {
            format!(
                "{count} file{}, {}",
                if count == 1 { "" } else { "s" },
                format_bytes(self.files.trace_bytes)
            )
        };
        let _ = writeln!(
            s,
            "  trace      {run_dir}{sep}{}/ ({contents})",
            self.files.trace_dir
        );
        if !other.is_empty() {
            let names: Vec<&str> = other.iter().map(|r| r.as_str()).collect();
            let _ = writeln!(s, "  also       {}", names.join(", "));
        }
        out.write_all(s.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_three_significant_digits() {
        assert_eq!(format_duration_ns(812), "812 ns");
        assert_eq!(format_duration_ns(15_300), "15.3 µs");
        assert_eq!(format_duration_ns(4_212_000), "4.21 ms");
        assert_eq!(format_duration_ns(123_400_000), "123 ms");
        assert_eq!(format_duration_ns(1_930_000_000), "1.93 s");
        assert_eq!(format_duration_ns(125_000_000_000), "2 min 5 s");
    }

    #[test]
    fn bytes_and_names() {
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(2048), "2.0 KiB");
        assert_eq!(format_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(printable("a\x1b[31mred", 40), "a\\u{1b}[31mred");
        assert_eq!(printable("abcdef", 3), "abc…");
    }

    #[test]
    fn table_is_aligned_and_lists_every_column() {
        let spans = vec![SpanStats {
            name: "forward".into(),
            calls: 10,
            total_ns: 50_000_000,
            self_ns: 40_000_000,
            mean_ns: 5_000_000,
            percent_of_wall: 50.0,
            self_percent_of_wall: 40.0,
        }];
        let table = span_table(&spans, 100_000_000);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("Action") && lines[0].contains("Self time"));
        assert!(lines[2].starts_with("  Total (wall)"));
        assert!(lines[3].contains("forward") && lines[3].contains("5.00 ms"));
        assert!(lines[3].ends_with("50.0 %"), "{}", lines[3]);
        assert_eq!(lines[2].chars().count(), lines[3].chars().count());
    }
}
