//! perfkit-lint: finds performance anti-patterns in Rust GPU training code without building it.
//!
//! [`lint`] walks the given paths (honouring `.gitignore`, skipping `target/`), parses every `.rs` file
//! with `syn`, groups files into crates (the `.rs` files of one Cargo package), runs the step-loop
//! analysis and every enabled [`Rule`] per crate, applies suppressions and configuration, and returns
//! the diagnostics sorted by path, line, column and code.

pub mod analysis;
pub mod config;
pub mod diagnostic;
mod engine;
pub mod fix;
mod nesting;
pub mod output;
pub mod python;
pub mod rules;
mod suppress;
mod walk;

use std::path::PathBuf;
use std::sync::Arc;

pub use analysis::{CrateContext, FileId};
pub use config::Config;
pub use diagnostic::{Diagnostic, Edit, FileError, Fix, Region, Severity};
pub use rules::{Finding, Rule, RuleMeta, rule_by_code, rules};

/// Callback reporting progress: `(files done, files total)`.
pub type ProgressFn = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// What to lint and how.
#[derive(Clone)]
#[non_exhaustive]
pub struct LintOptions {
    /// Files or directories to lint. Default: the current directory.
    pub paths: Vec<PathBuf>,
    /// A configuration file (`--config`). Default: `perfkit.toml` or `Cargo.toml` metadata found
    /// upward from each crate.
    pub config_file: Option<PathBuf>,
    /// Codes or prefixes to enable on top of the configuration (`--select`).
    pub select: Vec<String>,
    /// Codes or prefixes to disable on top of the configuration (`--ignore`).
    pub ignore: Vec<String>,
    /// Worker threads. Default (None): one per core.
    pub jobs: Option<usize>,
    /// Called as files finish. Default: none.
    pub progress: Option<ProgressFn>,
    /// For benchmarks that measure what each stage costs: every crate and package ends after
    /// this stage, and no rule runs. Default (None): the whole lint.
    #[doc(hidden)]
    pub stop_after: Option<Stage>,
}

/// A stage of the work on one crate or package (see [`LintOptions::stop_after`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Read and parse every file, keeping the trees until the crate or package is done.
    Parse,
    /// Then collect each file's facts, right after it is parsed.
    Facts,
    /// Then the crate-wide or package-wide analysis (step loops, calls, devices).
    Analysis,
}

impl Default for LintOptions {
    fn default() -> LintOptions {
        LintOptions {
            paths: vec![PathBuf::from(".")],
            config_file: None,
            select: Vec::new(),
            ignore: Vec::new(),
            jobs: None,
            progress: None,
            stop_after: None,
        }
    }
}

impl std::fmt::Debug for LintOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LintOptions")
            .field("paths", &self.paths)
            .field("config_file", &self.config_file)
            .field("select", &self.select)
            .field("ignore", &self.ignore)
            .field("jobs", &self.jobs)
            .field("progress", &self.progress.is_some())
            .field("stop_after", &self.stop_after)
            .finish()
    }
}

impl LintOptions {
    /// Options that lint `paths` with everything else at its default.
    pub fn new(paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> LintOptions {
        LintOptions {
            paths: paths.into_iter().map(Into::into).collect(),
            ..LintOptions::default()
        }
    }
    /// Sets the configuration file.
    #[must_use]
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> LintOptions {
        self.config_file = Some(path.into());
        self
    }
    /// Sets the codes or prefixes to enable.
    #[must_use]
    pub fn select(mut self, codes: impl IntoIterator<Item = impl Into<String>>) -> LintOptions {
        self.select = codes.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the codes or prefixes to disable.
    #[must_use]
    pub fn ignore(mut self, codes: impl IntoIterator<Item = impl Into<String>>) -> LintOptions {
        self.ignore = codes.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the number of worker threads.
    #[must_use]
    pub fn jobs(mut self, jobs: usize) -> LintOptions {
        self.jobs = Some(jobs);
        self
    }
    /// Sets the progress callback.
    #[must_use]
    pub fn progress(mut self, progress: ProgressFn) -> LintOptions {
        self.progress = Some(progress);
        self
    }
}

/// The result of a lint run.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LintReport {
    /// Files read (linted or failed).
    pub files_scanned: usize,
    /// Findings, sorted by path, line, column and code; suppressed ones removed, unused suppressions
    /// reported as `PK000` notes.
    pub diagnostics: Vec<Diagnostic>,
    /// Files that could not be linted, sorted by path.
    pub errors: Vec<FileError>,
}

/// A problem with the run itself (configuration or flags), as opposed to a problem with one file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LintError {
    /// A configuration file is invalid.
    #[error("{}: {message}", path.display())]
    Config {
        /// The configuration file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A configuration file could not be read.
    #[error("cannot read configuration {}: {source}", path.display())]
    ConfigIo {
        /// The configuration file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A flag names no rule (`--select PK999`).
    #[error("{flag}: {}", config::unknown_code_message(code))]
    UnknownCode {
        /// The flag (`--select`, `--ignore`).
        flag: &'static str,
        /// The code given.
        code: String,
    },
    /// `--jobs 0` or a thread pool that cannot start.
    #[error("{0}")]
    Threads(String),
}

/// Lints the paths of `options`.
pub fn lint(options: &LintOptions) -> Result<LintReport, LintError> {
    engine::run(options)
}

/// A Rust crate or a Python package of a lint run, as [`lint_plan`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    /// The crate's or package's root.
    pub root: PathBuf,
    /// A Python package rather than a Rust crate.
    pub python: bool,
    /// Its files, in the order they are read.
    pub files: Vec<PathBuf>,
}

/// The crates and packages that [`lint`] would form from `options`, in the order it starts them
/// (largest first), without linting anything: for benchmarks that run another pass over the same
/// groups of files (`lint/benches`).
#[doc(hidden)]
pub fn lint_plan(options: &LintOptions) -> Result<Vec<PlannedJob>, LintError> {
    engine::plan_jobs(options)
}
