//! `perfkit lint [PATH...]`: lint Rust training code, print the findings, optionally apply the fixes.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use perfkit_lint::fix::{FixSummary, apply_fixes};
use perfkit_lint::output::{self, Format, RenderOptions};
use perfkit_lint::rules::RuleMeta;
use perfkit_lint::{Diagnostic, LintOptions, LintReport, Severity};

/// How long a run goes before a progress bar appears (on a terminal only).
const PROGRESS_DELAY: Duration = Duration::from_secs(1);
/// At most this many rounds of fixing: a fix can uncover another fix, or make room for one that
/// overlapped it.
const MAX_FIX_PASSES: usize = 10;

/// Arguments of `perfkit lint`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 no finding at warning or above, 1 findings at warning or above, \
2 usage, I/O or parse errors (every file that parses is still linted and reported)."
)]
pub struct LintArgs {
    /// Files or directories to lint (directories are walked, honouring .gitignore)
    /// [default: .]
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Text)]
    format: FormatArg,
    /// cargo's message format: `json` writes cargo/rustc JSON diagnostics (one
    /// `compiler-message` per finding, then `build-finished`), for rust-analyzer's
    /// `check.overrideCommand` and other readers of `cargo check --message-format=json`;
    /// `human` is `--format text`.
    #[arg(long, value_enum, value_name = "FMT", conflicts_with = "format")]
    message_format: Option<MessageFormat>,
    /// Run these rules: comma-separated codes or prefixes (`PK101`, `PK1`; none at all is an
    /// error). Only these when the config selects nothing; added to the config's `select` when it
    /// has one.
    #[arg(long, value_delimiter = ',', value_name = "CODES")]
    select: Vec<String>,
    /// Disable these rules: comma-separated codes or prefixes, on top of the config.
    #[arg(long, value_delimiter = ',', value_name = "CODES")]
    ignore: Vec<String>,
    /// Read the configuration from FILE instead of the perfkit.toml or Cargo.toml metadata found upward.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Exit with status 0 even when there are findings (errors still exit with 2).
    #[arg(long)]
    exit_zero: bool,
    /// Apply the machine-applicable fixes, then report what remains.
    #[arg(long)]
    fix: bool,
    /// Number of threads to lint with (default: one per core; never more than the files to
    /// lint, nor more than 256).
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    jobs: Option<u16>,
}

/// `--format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FormatArg {
    /// rustc-style diagnostics with the source line.
    Text,
    /// JSON, schema version 1.
    Json,
    /// SARIF 2.1.0 (GitHub code scanning and other SARIF readers).
    Sarif,
    /// GitHub Actions annotations (workflow commands).
    Github,
}

/// `--message-format` values, as cargo names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MessageFormat {
    /// rustc-style diagnostics (`--format text`).
    Human,
    /// cargo's JSON messages with rustc diagnostics.
    Json,
}

impl From<FormatArg> for Format {
    fn from(format: FormatArg) -> Self {
        match format {
            FormatArg::Text => Format::Text,
            FormatArg::Json => Format::Json,
            FormatArg::Sarif => Format::Sarif,
            FormatArg::Github => Format::Github,
        }
    }
}

/// Runs `perfkit lint`.
pub fn run(args: LintArgs) -> anyhow::Result<ExitCode> {
    let mut options = LintOptions::default();
    options.paths = if args.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.paths.clone()
    };
    options.config_file = args.config.clone();
    options.select = args
        .select
        .iter()
        .map(|code| code.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    // `--select "$RULES"` with the variable empty would otherwise run every rule: the opposite of
    // selecting. An empty `--ignore` ignores nothing, as it says.
    if !args.select.is_empty() && options.select.is_empty() {
        anyhow::bail!(
            "--select: no rule code given (leave --select out to run the configured rules)"
        );
    }
    options.ignore = args
        .ignore
        .iter()
        .map(|code| code.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    options.jobs = args.jobs.map(usize::from);

    let format = match args.message_format {
        Some(MessageFormat::Json) => Format::Cargo,
        Some(MessageFormat::Human) => Format::Text,
        None => Format::from(args.format),
    };
    let mut report = lint_with_progress(&mut options)?;
    let mut fix_failed = false;
    if args.fix {
        let summary = fix_until_done(&mut options, &mut report)?;
        let in_notebooks = report
            .diagnostics
            .iter()
            .filter(|d| d.cell.is_some())
            .count();
        report_fixes(&summary, in_notebooks, format == Format::Text);
        fix_failed = !summary.errors.is_empty();
        // For tools (JSON, SARIF, annotations, cargo messages), the files `--fix` could not write
        // are error entries of the report: the exit status 2 is explained where they read.
        if format != Format::Text {
            report
                .errors
                .extend(summary.errors.iter().map(|error| perfkit_lint::FileError {
                    path: error.path().to_path_buf(),
                    message: error.detail(),
                    line: None,
                }));
            report.errors.sort_by(|a, b| a.path.cmp(&b.path));
        }
    }

    let rules: Vec<&RuleMeta> = perfkit_lint::rules()
        .iter()
        .map(|rule| rule.meta())
        .collect();
    let stdout = std::io::stdout();
    let color = format == Format::Text
        && anstream::AutoStream::choice(&stdout) != anstream::ColorChoice::Never;
    let mut out = BufWriter::new(super::PipeTolerant::new(stdout.lock()));
    output::render(
        format,
        &mut out,
        &report,
        &rules,
        &RenderOptions::default().color(color),
    )
    .context("cannot write the report")?;
    out.flush().context("cannot write the report")?;

    Ok(exit_code(&report, fix_failed, args.exit_zero))
}

/// Applies fixes and lints again, until nothing more is fixed (a fix can make room for one that
/// overlapped it) or [`MAX_FIX_PASSES`] rounds. A file that could not be fixed is not tried again.
fn fix_until_done(
    options: &mut LintOptions,
    report: &mut LintReport,
) -> anyhow::Result<FixSummary> {
    let mut total = FixSummary::default();
    for _ in 0..MAX_FIX_PASSES {
        let fixable: Vec<Diagnostic> = report
            .diagnostics
            .iter()
            .filter(|d| d.fix.is_some() && !total.errors.iter().any(|e| e.path() == d.path))
            .cloned()
            .collect();
        if fixable.is_empty() {
            break;
        }
        let pass = apply_fixes(&fixable);
        total.applied += pass.applied;
        total.skipped = pass.skipped;
        for file in pass.files_changed {
            if !total.files_changed.contains(&file) {
                total.files_changed.push(file);
            }
        }
        total.errors.extend(pass.errors);
        if pass.applied == 0 {
            break;
        }
        *report = lint_with_progress(options)?;
    }
    Ok(total)
}

/// 2 when a file could not be linted or fixed; else 1 when a finding is at warning or above (unless
/// `--exit-zero`); else 0.
fn exit_code(report: &LintReport, fix_failed: bool, exit_zero: bool) -> ExitCode {
    if !report.errors.is_empty() || fix_failed {
        ExitCode::from(2)
    } else if !exit_zero
        && report
            .diagnostics
            .iter()
            .any(|d| d.severity >= Severity::Warning)
    {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// One line on stderr about what `--fix` did (and the findings in notebooks, which it does not
/// rewrite), and with `with_errors` one per file it could not fix (other formats carry those as
/// error entries of the report).
fn report_fixes(summary: &FixSummary, in_notebooks: usize, with_errors: bool) {
    let files = summary.files_changed.len();
    let mut line = format!(
        "fixed {} {} in {} {}",
        summary.applied,
        if summary.applied == 1 {
            "finding"
        } else {
            "findings"
        },
        files,
        if files == 1 { "file" } else { "files" }
    );
    if summary.skipped > 0 {
        line.push_str(&format!(
            " ({} overlapping fixes left for the next run)",
            summary.skipped
        ));
    }
    if in_notebooks > 0 {
        line.push_str(&format!(
            "; {in_notebooks} {} in notebooks reported with no fix applied (perfkit does not rewrite .ipynb files)",
            if in_notebooks == 1 { "finding" } else { "findings" }
        ));
    }
    crate::eprintln_lossy!("{line}");
    if with_errors {
        for error in &summary.errors {
            crate::eprintln_lossy!("error: {error}");
        }
    }
}

/// Lints with a progress bar on stderr that appears only when stderr is a terminal and the run has
/// taken more than [`PROGRESS_DELAY`].
fn lint_with_progress(options: &mut LintOptions) -> anyhow::Result<LintReport> {
    if !std::io::stderr().is_terminal() {
        options.progress = None;
        return Ok(perfkit_lint::lint(options)?);
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
    // A spinner until the first crate is done (the total is known from then on), then a bar.
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} linting... {elapsed}") {
        bar.set_style(style);
    }
    let counting = AtomicBool::new(false);
    let progress_bar = bar.clone();
    options.progress = Some(Arc::new(move |done: usize, total: usize| {
        if !counting.swap(true, Ordering::Relaxed)
            && let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} linting {pos}/{len} files {wide_bar} {elapsed}",
            )
        {
            progress_bar.set_style(style);
        }
        progress_bar.set_length(total as u64);
        progress_bar.set_position(done as u64);
    }));
    let (finished, wait) = mpsc::channel::<()>();
    let shown_bar = bar.clone();
    let timer = std::thread::spawn(move || {
        if wait.recv_timeout(PROGRESS_DELAY) == Err(mpsc::RecvTimeoutError::Timeout) {
            shown_bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            shown_bar.enable_steady_tick(Duration::from_millis(100));
        }
    });
    let result = perfkit_lint::lint(options);
    let _ = finished.send(());
    let _ = timer.join();
    bar.finish_and_clear();
    options.progress = None;
    Ok(result?)
}
