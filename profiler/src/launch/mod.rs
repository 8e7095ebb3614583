//! Running a program under the profiler.
//!
//! [`launch`] starts the program with `PERFKIT_TRACE` pointing at a trace directory, passes
//! its standard input, output and error straight through, forwards the terminating signals it
//! is sent to the program (see [`signals`] for the rules that avoid delivering a terminal's
//! Ctrl-C twice), waits for it and reports how it ended. [`OutputDir`] lays out where a run's
//! files go.
//!
//! ```no_run
//! use perfkit_profiler::launch::{LaunchSpec, OutputDir, launch};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let out = OutputDir::prepare(None, "./train".as_ref(), false)?;
//! let spec = LaunchSpec::new("./train", vec!["--steps".into(), "10".into()], out.trace_dir());
//! let outcome = launch(&spec)?;
//! println!("exited with {} after {:?}", outcome.termination, outcome.wall_time);
//! std::process::exit(i32::from(outcome.termination.shell_exit_code()));
//! # }
//! ```

mod outdir;
pub mod signals;

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant, SystemTime};

pub use outdir::{
    DIFF_FILES, MARKED_FILES, OutputDir, OutputDirError, REPORT_FILES, RUN_MARKER, ReportDir,
    check_for_reports, default_dir_name, take_for_reports,
};
pub use signals::ReceivedSignal;

/// The environment variable that tells an instrumented program where to write its trace.
pub use crate::TRACE_ENV;

/// Shell convention: the exit code when the program could not be found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Shell convention: the exit code when the program was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;

/// What to run and where its trace goes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LaunchSpec {
    /// The program, as given (a path, or a name looked up in `PATH`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The directory handed to the program in `PERFKIT_TRACE`.
    pub trace_dir: PathBuf,
    /// More environment variables for the program (for example those that make CUDA load an
    /// injection library), set after `PERFKIT_TRACE`.
    pub env: Vec<(OsString, OsString)>,
}

impl LaunchSpec {
    /// A spec running `program` with `args`, tracing into `trace_dir`.
    pub fn new(program: impl Into<OsString>, args: Vec<OsString>, trace_dir: &Path) -> Self {
        Self {
            program: program.into(),
            args,
            trace_dir: trace_dir.to_path_buf(),
            env: Vec::new(),
        }
    }
}

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// It exited by itself with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled {
        /// The signal number.
        signal: i32,
        /// Whether it left a core dump.
        core_dumped: bool,
    },
}

impl Termination {
    /// Classifies a finished process's status.
    pub fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Self::Exited(code),
            (None, Some(signal)) => Self::Signaled {
                signal,
                core_dumped: status.core_dumped(),
            },
            // Neither a code nor a signal: only possible for stopped/continued statuses,
            // which `wait` does not return. Report it as a failure rather than success.
            (None, None) => Self::Exited(1),
        }
    }

    /// The exit code a shell would give: the program's own code, or 128 + the signal number.
    pub fn shell_exit_code(&self) -> u8 {
        match *self {
            // Exit codes are 8 bits on Unix; `code()` is already in 0..=255.
            Self::Exited(code) => u8::try_from(code & 0xff).unwrap_or(1),
            Self::Signaled { signal, .. } => u8::try_from(128 + (signal & 0x7f)).unwrap_or(255),
        }
    }

    /// Whether the program ended by itself with code 0.
    pub fn success(&self) -> bool {
        matches!(self, Self::Exited(0))
    }

    /// The signal that ended the program, if one did.
    pub fn signal(&self) -> Option<i32> {
        match *self {
            Self::Signaled { signal, .. } => Some(signal),
            Self::Exited(_) => None,
        }
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Exited(code) => write!(f, "exit code {code}"),
            Self::Signaled {
                signal,
                core_dumped,
            } => {
                write!(f, "signal {}", signal_display(signal))?;
                if core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
        }
    }
}

/// `SIGTERM (15)`, or `15` for a signal with no known name.
pub fn signal_display(signal: i32) -> String {
    match signal_hook::low_level::signal_name(signal) {
        Some(name) => format!("{name} ({signal})"),
        None => signal.to_string(),
    }
}

/// What happened when the program ran.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOutcome {
    /// The program's process id.
    pub pid: u32,
    /// How it ended.
    pub termination: Termination,
    /// Wall-clock time from just before the program started until it was reaped.
    pub wall_time: Duration,
    /// When it was started.
    pub started_at: SystemTime,
    /// The terminating signals perfkit received while the program ran, in order, and whether
    /// each one was forwarded.
    pub signals: Vec<ReceivedSignal>,
}

impl RunOutcome {
    /// The run part of the summary: `program` and `args` as given, with this outcome.
    pub fn run_info(&self, program: &OsStr, args: &[OsString]) -> crate::summary::RunInfo {
        let t = self.termination;
        let signal_name = t
            .signal()
            .and_then(signal_hook::low_level::signal_name)
            .map(str::to_owned);
        crate::summary::RunInfo {
            program: program.to_string_lossy().into_owned(),
            args: args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            started_at: crate::summary::UtcTime::from_system_time(self.started_at).rfc3339(),
            wall_time_ns: u64::try_from(self.wall_time.as_nanos()).unwrap_or(u64::MAX),
            exit: Some(crate::summary::ExitInfo {
                code: match t {
                    Termination::Exited(code) => Some(code),
                    Termination::Signaled { .. } => None,
                },
                signal: t.signal(),
                signal_name,
                core_dumped: matches!(
                    t,
                    Termination::Signaled {
                        core_dumped: true,
                        ..
                    }
                ),
                exit_code: t.shell_exit_code(),
                description: t.to_string(),
            }),
            signals: self.signals.clone(),
            incomplete: false,
            incomplete_reasons: Vec::new(),
        }
    }
}

/// Why a program could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The program does not exist (or is not in `PATH`).
    #[error("program not found: `{program}`", program = .program.to_string_lossy())]
    NotFound {
        /// The program as given.
        program: OsString,
    },
    /// The program is there, but what it needs to start is not: the interpreter of its `#!`
    /// line, or the dynamic loader it names (127, as in a shell).
    #[error(
        "cannot execute `{program}`: it is there, but its interpreter (`#!` line) or dynamic \
         loader is not",
        program = .program.to_string_lossy()
    )]
    InterpreterNotFound {
        /// The program as given.
        program: OsString,
    },
    /// The program exists but cannot be executed (permissions, a directory, a bad format).
    #[error("cannot execute `{program}`: {source}", program = .program.to_string_lossy())]
    NotExecutable {
        /// The program as given.
        program: OsString,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// Installing the signal handlers failed.
    #[error("cannot install the signal handlers that forward Ctrl-C and SIGTERM: {0}")]
    Signals(#[source] std::io::Error),
    /// Waiting for the program failed.
    #[error("lost track of the program (pid {pid}): {source}")]
    Wait {
        /// Its process id.
        pid: u32,
        /// What the operating system said.
        source: std::io::Error,
    },
}

impl LaunchError {
    /// The exit code to use for this error: 127 for not found, 126 for not executable (the
    /// shell conventions), 2 for the others.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotFound { .. } | Self::InterpreterNotFound { .. } => EXIT_NOT_FOUND,
            Self::NotExecutable { .. } => EXIT_NOT_EXECUTABLE,
            Self::Signals(_) | Self::Wait { .. } => 2,
        }
    }
}

/// Runs the program of `spec` to its end, forwarding terminating signals to it.
///
/// Standard input, output and error are inherited. The program gets `PERFKIT_TRACE` set to
/// `spec.trace_dir` plus the variables of `spec.env`; every other variable is passed through
/// unchanged. The signal handlers stay
/// installed after this returns, so that the caller can finish writing its reports: a further
/// SIGINT or SIGTERM then ends the calling process as it normally would.
///
/// # Errors
/// [`LaunchError::NotFound`] / [`LaunchError::NotExecutable`] when the program cannot be
/// started, [`LaunchError::Signals`] and [`LaunchError::Wait`] for failures of the system calls
/// around it.
pub fn launch(spec: &LaunchSpec) -> Result<RunOutcome, LaunchError> {
    let forwarder = signals::Forwarder::install().map_err(LaunchError::Signals)?;
    let started_at = SystemTime::now();
    let start = Instant::now();
    let mut child = Command::new(&spec.program)
        .args(&spec.args)
        .env(TRACE_ENV, &spec.trace_dir)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .spawn()
        .map_err(|source| spawn_error(&spec.program, source))?;
    let pid = child.id();
    forwarder.attach(pid);
    let waited = signals::wait_without_reaping(pid);
    // From here on the pid must not be signalled any more: it is about to be reaped and
    // could be reused by an unrelated process.
    forwarder.child_exited();
    let status = match waited.and_then(|()| child.wait()) {
        Ok(status) => status,
        Err(source) => return Err(LaunchError::Wait { pid, source }),
    };
    let wall_time = start.elapsed();
    Ok(RunOutcome {
        pid,
        termination: Termination::from_status(status),
        wall_time,
        started_at,
        signals: forwarder.finish(),
    })
}

fn spawn_error(program: &OsStr, source: std::io::Error) -> LaunchError {
    match source.kind() {
        // A path to a file that is there: what is missing is its interpreter or loader.
        std::io::ErrorKind::NotFound
            if program.as_encoded_bytes().contains(&b'/') && Path::new(program).is_file() =>
        {
            LaunchError::InterpreterNotFound {
                program: program.to_os_string(),
            }
        }
        std::io::ErrorKind::NotFound => LaunchError::NotFound {
            program: program.to_os_string(),
        },
        _ => LaunchError::NotExecutable {
            program: program.to_os_string(),
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(Termination::Exited(3).shell_exit_code(), 3);
        assert_eq!(Termination::Exited(0).shell_exit_code(), 0);
        let term = Termination::Signaled {
            signal: libc::SIGTERM,
            core_dumped: false,
        };
        assert_eq!(term.shell_exit_code(), 143);
        assert_eq!(term.to_string(), "signal SIGTERM (15)");
        assert_eq!(term.signal(), Some(15));
        assert!(!term.success());
    }

    #[test]
    fn missing_program_is_not_found() {
        let dir = std::env::temp_dir();
        let spec = LaunchSpec::new("perfkit-no-such-program-xyz", Vec::new(), &dir);
        let err = launch(&spec).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_NOT_FOUND);
        assert!(
            err.to_string().contains("perfkit-no-such-program-xyz"),
            "{err}"
        );
    }

    #[test]
    fn directory_is_not_executable() {
        let dir = std::env::temp_dir();
        let spec = LaunchSpec::new(dir.as_os_str(), Vec::new(), &dir);
        let err = launch(&spec).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_NOT_EXECUTABLE, "{err}");
    }

    #[test]
    fn runs_a_program_and_reports_its_code_and_trace_dir() {
        let dir = std::env::temp_dir();
        let mut spec = LaunchSpec::new(
            "sh",
            vec![
                "-c".into(),
                format!(
                    "test \"${TRACE_ENV}\" = '{}' && test \"$PERFKIT_TEST_EXTRA\" = yes && exit 7",
                    dir.display()
                )
                .into(),
            ],
            &dir,
        );
        spec.env.push(("PERFKIT_TEST_EXTRA".into(), "yes".into()));
        let outcome = launch(&spec).unwrap();
        assert_eq!(outcome.termination, Termination::Exited(7));
        assert!(outcome.signals.is_empty());
    }

    #[test]
    fn a_killed_program_reports_the_signal() {
        let dir = std::env::temp_dir();
        let spec = LaunchSpec::new("sh", vec!["-c".into(), "kill -KILL $$".into()], &dir);
        let outcome = launch(&spec).unwrap();
        assert_eq!(outcome.termination.signal(), Some(libc::SIGKILL));
        assert_eq!(outcome.termination.shell_exit_code(), 137);
    }
}
