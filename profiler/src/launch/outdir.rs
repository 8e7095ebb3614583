//! Where a profiled run's files go.
//!
//! ```text
//! perfkit-out/<program>-<YYYYMMDD>-<HHMMSS>/   (default; UTC; `-2`, `-3`, ... when taken)
//! ├── trace/          PERFKIT_TRACE: one trace file per traced process
//! └── summary.json    the run's summary (see docs/summary-format.md)
//! ```

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::summary::{SUMMARY_FILE, TRACE_DIR, UtcTime};

/// The default parent directory of runs.
pub const DEFAULT_PARENT: &str = "perfkit-out";

/// Why the output directory could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputDirError {
    /// The directory already holds a run.
    #[error(
        "`{}` already holds a profiled run; pass --force to replace it or choose another --out",
        .0.display()
    )]
    AlreadyUsed(PathBuf),
    /// A file system operation failed.
    #[error("cannot prepare output directory `{}`: {source}", path.display())]
    Io {
        /// The path the operation was about.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> OutputDirError + '_ {
    move |source| OutputDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A run's output directory, created and ready for the program to write its trace into.
#[derive(Debug, Clone)]
pub struct OutputDir {
    root: PathBuf,
    trace: PathBuf,
}

impl OutputDir {
    /// Creates the run directory and its `trace/` directory.
    ///
    /// With `out`, that directory is used (created if missing); if it already holds a run
    /// (`summary.json` or a non-empty `trace/`), this fails unless `force`, which removes the
    /// previous run's summary, its trace files and the report files its summary lists (nothing
    /// else). Without `out`, a new directory
    /// `perfkit-out/<program>-<UTC timestamp>` is created under the current directory.
    ///
    /// # Errors
    /// [`OutputDirError::AlreadyUsed`] as above, [`OutputDirError::Io`] when a directory cannot
    /// be created or cleared.
    pub fn prepare(
        out: Option<&Path>,
        program: &OsStr,
        force: bool,
    ) -> Result<Self, OutputDirError> {
        let root = match out {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(io_err(dir))?;
                clear_previous_run(dir, force)?;
                dir.to_path_buf()
            }
            None => create_fresh(
                Path::new(DEFAULT_PARENT),
                &default_dir_name(program, SystemTime::now()),
            )?,
        };
        // The program may change its working directory: hand it an absolute path.
        let root = std::path::absolute(&root).map_err(io_err(&root))?;
        let trace = root.join(TRACE_DIR);
        std::fs::create_dir_all(&trace).map_err(io_err(&trace))?;
        Ok(Self { root, trace })
    }

    /// The run directory (absolute).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The trace directory handed to the program in `PERFKIT_TRACE` (absolute).
    pub fn trace_dir(&self) -> &Path {
        &self.trace
    }

    /// Removes the trace directory and the run directory if nothing was written into them
    /// (used when the program could not be started). Never removes anything that holds files.
    pub fn remove_if_empty(&self) {
        // `remove_dir` fails on a non-empty directory, which is what keeps this safe.
        let _ = std::fs::remove_dir(&self.trace);
        let _ = std::fs::remove_dir(&self.root);
    }

    /// Where `summary.json` goes.
    pub fn summary_path(&self) -> PathBuf {
        self.root.join(SUMMARY_FILE)
    }
}

/// The default run directory name: the program's file name (unsafe characters replaced by `_`)
/// and the UTC start time, e.g. `train-20260509-143012`.
pub fn default_dir_name(program: &OsStr, now: SystemTime) -> String {
    let name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = clean.trim_start_matches('.').len();
    if trimmed == 0 {
        clean = "program".to_owned();
    }
    let t = UtcTime::from_system_time(now);
    format!(
        "{clean}-{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

fn create_fresh(parent: &Path, name: &str) -> Result<PathBuf, OutputDirError> {
    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    for n in 1u32.. {
        let candidate = if n == 1 {
            parent.join(name)
        } else {
            parent.join(format!("{name}-{n}"))
        };
        match std::fs::create_dir(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(io_err(&candidate)(e)),
        }
    }
    unreachable!("the loop returns within 1000 iterations")
}

fn clear_previous_run(dir: &Path, force: bool) -> Result<(), OutputDirError> {
    let summary = dir.join(SUMMARY_FILE);
    let trace = dir.join(TRACE_DIR);
    let trace_files: Vec<PathBuf> = match std::fs::read_dir(&trace) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(&trace)(e)),
    };
    let used = summary.exists() || !trace_files.is_empty();
    if !used {
        return Ok(());
    }
    if !force {
        return Err(OutputDirError::AlreadyUsed(dir.to_path_buf()));
    }
    let reports = previous_reports(&summary, dir);
    for file in trace_files
        .iter()
        .chain(&reports)
        .chain(std::iter::once(&summary))
    {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(file)(e)),
        }
    }
    Ok(())
}

/// The report files a previous run's summary lists, when they lie directly in `dir` (a name
/// with a directory part is not trusted).
fn previous_reports(summary: &Path, dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(summary) else {
        return Vec::new();
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let Some(list) = value["files"]["reports"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(serde_json::Value::as_str)
        .filter(|name| {
            let p = Path::new(name);
            p.components().count() == 1
                && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
        })
        .map(|name| dir.join(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn default_name_uses_the_file_name_and_utc_time() {
        // 2026-05-09 14:30:12 UTC
        let t = UNIX_EPOCH + Duration::from_secs(1_778_337_012);
        assert_eq!(
            default_dir_name(OsStr::new("./target/debug/train"), t),
            "train-20260509-143012"
        );
        assert_eq!(
            default_dir_name(OsStr::new("my prog!"), t),
            "my_prog_-20260509-143012"
        );
        assert_eq!(
            default_dir_name(OsStr::new(".."), t),
            "program-20260509-143012"
        );
    }

    #[test]
    fn explicit_dir_refuses_a_previous_run_unless_forced() {
        let tmp = std::env::temp_dir().join(format!("perfkit-outdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let out = OutputDir::prepare(Some(&tmp), OsStr::new("x"), false).unwrap();
        assert!(out.trace_dir().is_dir());
        assert!(out.root().is_absolute());
        std::fs::write(out.trace_dir().join("old.trace"), b"x").unwrap();
        std::fs::write(tmp.join("keep.txt"), b"x").unwrap();
        std::fs::write(tmp.join("report.html"), b"x").unwrap();
        std::fs::write(
            tmp.join(SUMMARY_FILE),
            br#"{"files": {"reports": ["report.html", "../keep.txt", "/etc/passwd"]}}"#,
        )
        .unwrap();
        let err = OutputDir::prepare(Some(&tmp), OsStr::new("x"), false).unwrap_err();
        assert!(matches!(err, OutputDirError::AlreadyUsed(_)), "{err}");
        assert!(err.to_string().contains("--force"));
        let out = OutputDir::prepare(Some(&tmp), OsStr::new("x"), true).unwrap();
        assert_eq!(std::fs::read_dir(out.trace_dir()).unwrap().count(), 0);
        assert!(tmp.join("keep.txt").exists());
        assert!(!tmp.join("report.html").exists());
        assert!(!tmp.join(SUMMARY_FILE).exists());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
