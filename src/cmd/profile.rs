//! `perfkit profile [--out DIR] -- PROGRAM [ARGS...]`: run a program under the profiler.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

mod find_crate;

const AFTER_HELP: &str = "\
The program runs with PERFKIT_TRACE=<DIR>/trace in its environment; a program built with
perfkit-profiler that calls `perfkit_profiler::init()` writes one trace file per process there.
Its standard input, output and error are passed through. SIGINT, SIGTERM, SIGHUP and SIGQUIT
sent to perfkit are forwarded to the program (a Ctrl-C typed at the terminal already reaches
the program and is not sent twice). When the program ends, the summary goes to standard error
and to <DIR>/summary.json, next to the HTML report, flamegraphs, folded stacks, a Chrome
trace and summary.md. A program that does not link perfkit-profiler is run with CUPTI
injection when a CUDA driver is present (--inject forces it, --no-inject turns it off).

Without --lint, a program that cargo built (target/<profile>/NAME, target/<triple>/<profile>/NAME
or target/<profile>/examples/NAME, found through PATH too) has its sources linted: the bin or
example target NAME of the workspace around target/, as cargo compiles it (its root file and the
modules it declares, plus the package's library when it uses it; not the package's other
binaries). --no-lint turns that off; a program outside a cargo target directory is not linted.

Exit status: the program's own exit code, or 128 + N when signal N ended it (as in a shell);
127 when the program is not found, 126 when it cannot be executed, 2 for perfkit's own errors
before the program starts.

Example:
  perfkit profile -- ./target/release/train --epochs 1";

/// Arguments of `perfkit profile`.
#[derive(Debug, clap::Args)]
#[command(
    override_usage = "perfkit profile [OPTIONS] [--] <PROGRAM> [ARGS]...",
    after_help = "Exits with the program's exit code (128 + N if signal N ended it); 127: program \
                  not found, 126: not executable. See --help for details.",
    after_long_help = AFTER_HELP
)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub options: ProfileOptions,

    /// The program to run, followed by its arguments
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// The options of `perfkit profile` that are not the program: shared with `cargo perfkit
/// profile`, which builds the program first.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileOptions {
    /// Directory for the trace and the summary
    /// [default: perfkit-out/<program>-<UTC date>-<time>]
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Replace the previous run's trace files and reports in --out DIR (only files perfkit
    /// can prove it wrote; anything else stays and is named)
    #[arg(long, requires = "out")]
    pub force: bool,

    /// Print nothing but errors (the summary is still written to summary.json)
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Capture the program's CUDA activity through CUPTI injection even if it links
    /// perfkit-profiler; fail if that is not possible [default: only for programs that do not
    /// link perfkit-profiler, when a CUDA driver is present]
    #[arg(long, conflicts_with = "no_inject")]
    pub inject: bool,

    /// Never use CUPTI injection
    #[arg(long)]
    pub no_inject: bool,

    /// Lint these Rust or Python files or directories too, and show their findings next to the
    /// runtime ones; a lint finding whose line also shows up at run time is marked confirmed,
    /// with its measured cost [default: the sources of the target that built PROGRAM (its
    /// module tree, and the package's library when it uses it), when PROGRAM lies in a cargo
    /// target directory such as target/release/ or target/debug/examples/]
    #[arg(long, value_name = "PATH", num_args = 1, conflicts_with = "no_lint")]
    pub lint: Vec<PathBuf>,

    /// Lint nothing, not even the sources of the target that built PROGRAM
    #[arg(long)]
    pub no_lint: bool,

    /// Where the `lint` paths come from, for the summary line (default: `--lint`).
    #[arg(skip)]
    pub lint_source: Option<String>,
}

/// Runs `perfkit profile`.
#[cfg(unix)]
pub fn run(args: ProfileArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;

    use anyhow::Context as _;
    use perfkit_profiler::launch::{self, LaunchSpec, OutputDir};
    use perfkit_profiler::summary::{self, Summary};

    let Some((program, program_args)) = args.command.split_first() else {
        anyhow::bail!(
            "no PROGRAM given: usage is `perfkit profile [--out DIR] -- PROGRAM [ARGS...]`"
        );
    };
    // `perfkit profile --bogus -- ./train`: clap hands an unknown option on as the program.
    if program.as_encoded_bytes().starts_with(b"-") {
        anyhow::bail!(
            "unknown option `{}` for `perfkit profile` (see `perfkit profile --help`; the \
             usage is `perfkit profile [OPTIONS] -- PROGRAM [ARGS...]`, and a program whose \
             name starts with `-` is given as `./{}`)",
            program.to_string_lossy(),
            program.to_string_lossy()
        );
    }
    let out = OutputDir::prepare(args.options.out.as_deref(), program, args.options.force)?;
    let mut spec = LaunchSpec::new(program.clone(), program_args.to_vec(), out.trace_dir());
    let no_capture = match injection_env(&args, program) {
        Ok(Injection::Env(env)) => {
            spec.env.extend(env);
            None
        }
        Ok(Injection::Skipped(why)) => why,
        Err(err) => {
            out.remove_if_empty();
            return Err(err);
        }
    };
    let sampler = start_sampler(out.trace_dir());
    let launched = launch::launch(&spec);
    if let Some(sampler) = sampler
        && let Err(err) = sampler.stop()
    {
        crate::eprintln_lossy!("perfkit: warning: the GPU sampler failed: {err}");
    }
    let outcome = match launched {
        Ok(outcome) => outcome,
        Err(err) => {
            crate::eprintln_lossy!("perfkit: error: {err}");
            out.remove_if_empty();
            return Ok(ExitCode::from(err.exit_code()));
        }
    };
    let exit_code = outcome.termination.shell_exit_code();

    // From here on the program has ended: its exit code is what perfkit returns, and a
    // failure to summarise is reported without hiding it.
    let wall_ns = u64::try_from(outcome.wall_time.as_nanos()).unwrap_or(u64::MAX);
    let mut options = summary::AnalyzeOptions::default();
    options.launched_pid = Some(outcome.pid);
    options.wall_ns = Some(wall_ns);
    let analysis =
        summary::analyze_trace_dir(out.trace_dir(), out.root(), &options).with_context(|| {
            format!(
                "cannot summarise the trace in `{}`",
                out.trace_dir().display()
            )
        });
    let analysis = match analysis {
        Ok(analysis) => analysis,
        Err(err) => {
            crate::eprintln_lossy!("perfkit: error: {}", super::error_chain(&err));
            return Ok(ExitCode::from(exit_code));
        }
    };
    let mut summary = Summary::new(outcome.run_info(program, program_args), analysis);
    // summary.json from the launcher's figures first, so that it exists even if rendering the
    // reports fails; the reports then rewrite it with their sections added.
    if let Err(err) = summary.write_json(&out.summary_path()) {
        crate::eprintln_lossy!("perfkit: error: {err}");
        summary.files.summary_error = Some(err.to_string());
    } else {
        record(&out, &out.summary_path());
    }
    let mut findings = None;
    let (lint_paths, lint_line) = lint_target(&args, program);
    if summary.instrumented {
        match write_reports(&out, &mut summary, program, &lint_paths) {
            Ok(found) => findings = Some(found),
            Err(err) => {
                crate::eprintln_lossy!(
                    "perfkit: warning: the reports were not written: {}",
                    super::error_chain(&err)
                );
                summary.files.reports_error = Some(super::error_chain(&err));
            }
        }
    } else if !lint_paths.is_empty() {
        // Nothing was recorded, but the code asked to be linted still is.
        findings = Some(with_lint(&lint_paths, Vec::new()));
    }
    if !args.options.quiet {
        let shown = display_path(out.root());
        let mut stderr = std::io::stderr().lock();
        // The terminal may be gone (hangup) or stderr closed; summary.json is written already
        // and the program's exit code matters more than this output.
        let _ = summary
            .write_text(&mut stderr, &shown)
            .and_then(|()| match (&findings, &lint_line) {
                (Some(_), Some(line)) => writeln!(stderr, "{line}"),
                _ => Ok(()),
            })
            .and_then(|()| match &findings {
                Some(found) => write!(
                    stderr,
                    "\n{}",
                    perfkit_reports::rules::terminal_findings(found)
                ),
                None => Ok(()),
            })
            .and_then(|()| match &no_capture {
                // Say why no GPU activity was captured from a program that has no trace.
                Some(why) if !summary.instrumented => {
                    writeln!(stderr, "perfkit: no zero-code GPU capture either: {why}")
                }
                _ => Ok(()),
            })
            .and_then(|()| stderr.flush());
    }
    Ok(ExitCode::from(exit_code))
}

/// What to lint, and the summary line that says so: `--lint` paths as given, nothing with
/// `--no-lint`, else the package that built the program when its path says which (see
/// [`find_crate::find_crate`]); a program outside any cargo target directory lints nothing.
#[cfg(unix)]
fn lint_target(args: &ProfileArgs, program: &std::ffi::OsStr) -> (Vec<PathBuf>, Option<String>) {
    if args.options.no_lint {
        return (Vec::new(), None);
    }
    if !args.options.lint.is_empty() {
        let shown: Vec<String> = args
            .options
            .lint
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let source = args.options.lint_source.as_deref().unwrap_or("from --lint");
        let line = format!("lint: {} ({source})", shown.join(", "));
        return (args.options.lint.clone(), Some(line));
    }
    let Ok(cwd) = std::env::current_dir() else {
        return (Vec::new(), None);
    };
    let path_var = std::env::var_os("PATH");
    match find_crate::find_crate(program, path_var.as_deref(), &cwd) {
        Some(found) => {
            let line = found.describe(&cwd);
            (found.files, Some(line))
        }
        None => (Vec::new(), None),
    }
}

/// What the CUPTI injection plan gave.
#[cfg(unix)]
enum Injection {
    /// Variables that make the program load the injection library.
    Env(Vec<(OsString, OsString)>),
    /// No injection, and why when it was wanted but impossible.
    Skipped(Option<String>),
}

/// Whether and how to start the program with the CUPTI injection library.
///
/// Default (auto): only for a program that does not link perfkit-profiler, on a machine with a
/// CUDA driver; a missing driver is silent (said only if the program wrote no trace), other
/// problems are a warning. `--inject`: always, and any problem is an error.
#[cfg(unix)]
fn injection_env(args: &ProfileArgs, program: &std::ffi::OsStr) -> anyhow::Result<Injection> {
    use perfkit_inject::host::{InjectMode, PlanError};

    let mode = if args.options.inject {
        InjectMode::Force
    } else if args.options.no_inject {
        InjectMode::Off
    } else {
        InjectMode::Auto
    };
    match perfkit_inject::host::plan(mode, program) {
        Ok(Some(plan)) => {
            crate::eprintln_lossy!("perfkit: {}", plan.describe());
            Ok(Injection::Env(
                plan.env(std::env::var_os("LD_LIBRARY_PATH")),
            ))
        }
        Ok(None) => Ok(Injection::Skipped(None)),
        Err(PlanError::NoDriver) if mode == InjectMode::Force => {
            anyhow::bail!("--inject needs a CUDA driver, and none was found (libcuda.so)")
        }
        Err(err) if mode == InjectMode::Force => anyhow::bail!("--inject: {err}"),
        Err(PlanError::NoDriver) => Ok(Injection::Skipped(Some(
            "CUPTI injection needs a CUDA driver, and none was found on this machine".to_owned(),
        ))),
        Err(err) => {
            crate::eprintln_lossy!("perfkit: warning: {err}");
            Ok(Injection::Skipped(Some(err.to_string())))
        }
    }
}

/// Starts sampling GPU utilisation and memory every 100 ms into its own trace file, where NVML
/// works; a machine without an NVIDIA driver or GPU simply has no samples.
#[cfg(unix)]
fn start_sampler(trace_dir: &std::path::Path) -> Option<perfkit_sampler::Sampler> {
    use perfkit_sampler::{Sampler, SamplerError, SamplerOptions};

    match Sampler::start(trace_dir, SamplerOptions::default()) {
        Ok(sampler) => Some(sampler),
        Err(SamplerError::Unavailable(_) | SamplerError::NoGpu) => None,
        Err(err) => {
            crate::eprintln_lossy!("perfkit: warning: GPU sampling is off: {err}");
            None
        }
    }
}

/// Renders the HTML report, flamegraphs, folded stacks, Chrome trace and Markdown summary into
/// the run directory, then summary.json: the launcher's `summary` (with the list of reports)
/// plus the reports' own sections; each file written is recorded as perfkit's in the run's
/// marker, so that `perfkit report` and `--force` may replace it later. Returns the findings:
/// runtime ones (thresholds from the `[profile]` table of the `perfkit.toml` found upward from
/// the program, else the defaults) and, with `lint_paths`, the lint findings of that code,
/// confirmed where the run saw the same line.
#[cfg(unix)]
fn write_reports(
    out: &perfkit_profiler::launch::OutputDir,
    summary: &mut perfkit_profiler::summary::Summary,
    program: &std::ffi::OsStr,
    lint_paths: &[PathBuf],
) -> anyhow::Result<Vec<perfkit_reports::Finding>> {
    use perfkit_reports::render::{self, Format, RenderOptions};
    use perfkit_reports::rules::{self, ProfileConfig};

    let (trace_dir, run_dir) = (out.trace_dir(), out.root());
    let analysis =
        perfkit_reports::analyze_path(trace_dir, &perfkit_reports::AnalyzeOptions::default())?;
    let config_start = match std::path::Path::new(program).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    let config = ProfileConfig::discover(&config_start).unwrap_or_else(|err| {
        crate::eprintln_lossy!("perfkit: warning: {err}; using the default thresholds");
        ProfileConfig::default()
    });
    let runtime = rules::evaluate(&analysis, &config).unwrap_or_else(|err| {
        crate::eprintln_lossy!("perfkit: warning: runtime findings were not computed: {err}");
        Vec::new()
    });
    let findings = with_lint(lint_paths, runtime);
    let mut options = RenderOptions::default();
    options.html.title = format!("perfkit report: {}", program.to_string_lossy());
    // How the program ended (exit status, signal), for summary.md and report.html as well.
    options.core = Some(summary.clone());
    let others: Vec<Format> = Format::ALL
        .into_iter()
        .filter(|f| *f != Format::Json)
        .collect();
    let written = render::write_all(&analysis, run_dir, &others, &findings, &options)?;
    for file in &written {
        record(out, file);
    }
    summary.files.reports = written
        .iter()
        .map(|f| f.strip_prefix(run_dir).unwrap_or(f).display().to_string())
        .collect();
    options.core = Some(summary.clone());
    for file in render::write_all(&analysis, run_dir, &[Format::Json], &findings, &options)? {
        record(out, &file);
    }
    Ok(findings)
}

/// Records `file`, just written into the run directory, as perfkit's; a failure is a warning
/// (the run's exit code matters more), and the file is then one perfkit will not replace.
#[cfg(unix)]
fn record(out: &perfkit_profiler::launch::OutputDir, file: &std::path::Path) {
    if let Err(err) = out.record(file) {
        crate::eprintln_lossy!("perfkit: warning: {err}");
    }
}

/// `runtime` with the lint findings of `lint_paths` (none: `runtime` as it is), confirmed where
/// the run saw the same line; the files that could not be linted are named on stderr, as
/// `perfkit lint` names them, and the exit status stays the program's own.
#[cfg(unix)]
fn with_lint(
    lint_paths: &[PathBuf],
    runtime: Vec<perfkit_reports::Finding>,
) -> Vec<perfkit_reports::Finding> {
    if lint_paths.is_empty() {
        return runtime;
    }
    match super::check::with_lint_findings(lint_paths, runtime.clone()) {
        Ok((findings, errors)) => {
            super::check::print_lint_errors(&errors);
            findings
        }
        Err(err) => {
            crate::eprintln_lossy!("perfkit: warning: --lint: {err}");
            runtime
        }
    }
}

/// Runs `perfkit profile` (Unix only).
#[cfg(not(unix))]
pub fn run(_args: ProfileArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`perfkit profile` supports Unix systems only")
}

/// The run directory relative to the current directory when it lies below it.
#[cfg(unix)]
fn display_path(path: &std::path::Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| path.display().to_string())
}
