//! `perfkit report TRACE|DIR`: render the reports of a recorded run.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use perfkit_reports::render::{self, Format, RenderOptions};
use perfkit_reports::{AnalyzeOptions, analyze_path, summary};

/// Arguments of `perfkit report`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Writes summary.json, summary.md, stacks-{host,gpu}.folded, \
flamegraph-{host,gpu}.svg, trace.chrome.json (Perfetto, chrome://tracing) and report.html. \
Exit status: 0, or 2 on an error, including a --lint file that could not be linted (missing, \
unreadable, unparsable: named on stderr; the reports are still written)."
)]
pub struct ReportArgs {
    /// A trace file (`*.pktrace`) or a directory of trace files (one per process) of one run.
    #[arg(value_name = "TRACE|DIR")]
    input: PathBuf,
    /// Output directory (default: the run directory, or the directory of the trace file).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Formats to write, comma-separated: html, svg, folded, chrome, json, md.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "html,svg,folded,chrome,json,md"
    )]
    format: String,
    /// Name of the span that marks a training step (default: the one recorded in the trace).
    #[arg(long, value_name = "NAME")]
    step_span: Option<String>,
    /// Also lint this code (repeatable) and show its findings beside the measured ones; a lint
    /// finding whose source line also shows up in the run is marked confirmed, with its cost.
    #[arg(long, value_name = "PATH", num_args = 1)]
    lint: Vec<PathBuf>,
    /// Open the HTML report in the default browser when done.
    #[arg(long)]
    open: bool,
}

/// Runs `perfkit report`.
pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let formats = render::parse_formats(&args.format).context("--format")?;
    if formats.is_empty() {
        anyhow::bail!(
            "--format: no format given (expected some of: html, svg, folded, chrome, json, md)"
        );
    }
    let mut options = AnalyzeOptions::default();
    options.step_span = args.step_span.clone();
    let analysis = analyze_path(&args.input, &options)?;
    for reason in analysis.incomplete_reasons() {
        crate::eprintln_lossy!("perfkit: warning: {reason}");
    }
    for note in analysis.notes() {
        crate::eprintln_lossy!("perfkit: note: {note}");
    }
    if let Some(name) = &args.step_span
        && let Some(warning) = unknown_step_span(&analysis, name)
    {
        crate::eprintln_lossy!("perfkit: warning: {warning}");
    }
    let out = args.out.clone().unwrap_or_else(|| default_out(&args.input));
    let mut render_options = RenderOptions::default();
    // A summary written by `perfkit profile` knows how the program ended: keep its core, or,
    // with another step span, the steps counted anew and the rest of the run as it was.
    if let Ok(previous) = perfkit_reports::Summary::load(&out.join("summary.json"))
        && previous.core.run.exit.is_some()
    {
        render_options.core = Some(if args.step_span.is_none() {
            previous.core
        } else {
            let mut core = perfkit_reports::Summary::core_of(&analysis)?;
            core.run = previous.core.run;
            core
        });
    }
    render_options.html.title = format!("perfkit report: {}", title_of(&analysis));
    render_options.html.created = created_now();
    // Runtime findings, with the thresholds of the perfkit.toml found upward from the input.
    let config = match perfkit_reports::rules::ProfileConfig::discover(&args.input) {
        Ok(config) => config,
        Err(err) => {
            crate::eprintln_lossy!("perfkit: warning: {err}; using the default thresholds");
            perfkit_reports::rules::ProfileConfig::default()
        }
    };
    let mut findings = perfkit_reports::rules::evaluate(&analysis, &config)?;
    let mut lint_errors = Vec::new();
    if !args.lint.is_empty() {
        (findings, lint_errors) =
            super::check::with_lint_findings(&args.lint, findings).context("--lint")?;
    }
    // Never over a file perfkit did not write; the directory stays locked while it is written,
    // and each file written is recorded as perfkit's, so that the next report may replace it.
    let names: Vec<&str> = formats.iter().flat_map(|f| f.files()).copied().collect();
    let taken = perfkit_profiler::launch::take_for_reports(&out, &names)?;
    let written = render::write_all(&analysis, &out, &formats, &findings, &render_options)?;
    for file in &written {
        taken.record(file)?;
    }
    // `perfkit report RUN | head`: a closed pipe ends the printing, not the run (the reports
    // are written above; the --lint errors, --open and the exit status still follow).
    let mut stdout = std::io::stdout().lock();
    let mut shown = write!(
        stdout,
        "{}\n{}\n",
        summary::terminal_table(&analysis, 15),
        perfkit_reports::rules::terminal_findings(&findings)
    );
    // As `perfkit lint`: the files that could be linted are reported, the others named, and
    // the exit status is 2.
    super::check::print_lint_errors(&lint_errors);
    for p in &written {
        shown = shown.and_then(|()| writeln!(stdout, "wrote {}", p.display()));
    }
    match shown.and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    drop(stdout);
    if args.open {
        let html = out.join("report.html");
        if formats.contains(&Format::Html) {
            open_in_browser(&html);
        } else {
            crate::eprintln_lossy!("perfkit: warning: --open needs the html format");
        }
    }
    Ok(if lint_errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// Most span names listed when `--step-span` matches none.
const MAX_SPANS_LISTED: usize = 12;

/// When `name` is the name of no span of the run: says so, naming the spans that exist (the
/// most called first).
fn unknown_step_span(analysis: &perfkit_reports::Analysis, name: &str) -> Option<String> {
    let spans = analysis.processes.iter().flat_map(|p| &p.spans);
    if spans.clone().any(|s| s.name == name) {
        return None;
    }
    let mut calls: Vec<(&str, u64)> = Vec::new();
    for span in spans {
        match calls.iter_mut().find(|(n, _)| *n == span.name) {
            Some((_, c)) => *c += span.calls,
            None => calls.push((&span.name, span.calls)),
        }
    }
    calls.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let existing = if calls.is_empty() {
        "the run has no spans".to_owned()
    } else {
        let mut list: Vec<String> = calls
            .iter()
            .take(MAX_SPANS_LISTED)
            .map(|(n, _)| format!("`{n}`"))
            .collect();
        if calls.len() > MAX_SPANS_LISTED {
            list.push(format!("and {} more", calls.len() - MAX_SPANS_LISTED));
        }
        format!("the spans of the run: {}", list.join(", "))
    };
    Some(format!(
        "--step-span `{name}` matches no span, so no step is counted ({existing})"
    ))
}

/// The run directory: the directory given, or the one holding the trace file; a `trace/`
/// directory of a run stands for its run directory.
fn default_out(input: &Path) -> PathBuf {
    let dir = if input.is_dir() {
        input.to_path_buf()
    } else {
        match input.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    if dir
        .file_name()
        .is_some_and(|n| n == perfkit_reports::analyze::RUN_TRACE_DIR)
        && let Some(parent) = dir.parent()
    {
        return if parent.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            parent.to_path_buf()
        };
    }
    dir
}

fn title_of(analysis: &perfkit_reports::Analysis) -> String {
    analysis
        .processes
        .first()
        .and_then(|p| p.meta.command.first())
        .map(|c| {
            Path::new(c)
                .file_name()
                .map_or(c.clone(), |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| analysis.source.clone())
}

/// `2026-05-09 12:34:56 UTC`, from the system clock.
fn created_now() -> String {
    let t = perfkit_profiler::summary::UtcTime::from_system_time(std::time::SystemTime::now());
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

fn open_in_browser(path: &Path) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    if let Err(e) = std::process::Command::new(opener).arg(path).spawn() {
        crate::eprintln_lossy!(
            "perfkit: warning: could not run {opener} to open {}: {e}",
            path.display()
        );
    }
}
