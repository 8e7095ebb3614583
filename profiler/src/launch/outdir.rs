//! Where a profiled run's files go.
//!
//! ```text
//! perfkit-out/<program>-<YYYYMMDD>-<HHMMSS>/   (default; UTC; `-2`, `-3`, ... when taken)
//! ├── .perfkit-run    marks the directory as perfkit's, holds the run's lock and pid
//! ├── trace/          PERFKIT_TRACE: one trace file per traced process
//! └── summary.json    the run's summary (see docs/summary-format.md), and the reports
//! ```
//!
//! perfkit removes only what it can prove it wrote: with `--force`, trace files recognised by
//! their magic bytes, and the report files by their known names ([`REPORT_FILES`]) in a
//! directory that carries its marker. Anything else stays.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::format::{MAGIC, TRACE_EXTENSION};
use crate::summary::{SUMMARY_FILE, TRACE_DIR, UtcTime};

/// The default parent directory of runs.
pub const DEFAULT_PARENT: &str = "perfkit-out";

/// The file that marks a directory as a perfkit run directory and holds the run's lock.
///
/// perfkit writes it when it takes a directory for a run; while the run lasts it holds an
/// exclusive lock on it and its text names the run's process id. Report files are replaced by
/// `--force` only in a directory that carries this marker.
pub const RUN_MARKER: &str = ".perfkit-run";

/// The report files perfkit writes into a run directory; the only names, with
/// [`SUMMARY_FILE`], that `--force` may remove (and only in a directory that carries
/// [`RUN_MARKER`]).
pub const REPORT_FILES: [&str; 8] = [
    SUMMARY_FILE,
    "summary.md",
    "stacks-host.folded",
    "stacks-gpu.folded",
    "flamegraph-host.svg",
    "flamegraph-gpu.svg",
    "trace.chrome.json",
    "report.html",
];

/// Every name perfkit writes into a directory it marks with [`RUN_MARKER`]: the reports of a
/// run ([`REPORT_FILES`]), those of `perfkit diff --out` and those of `perfkit demo`. A marker
/// vouches for the files under these names, so it is written only into a directory that holds
/// none of them yet (see [`take_for_reports`]).
pub const MARKED_FILES: [&str; REPORT_FILES.len() + DIFF_FILES.len() + DEMO_FILES.len()] = {
    let all = copy_names(
        [""; REPORT_FILES.len() + DIFF_FILES.len() + DEMO_FILES.len()],
        0,
        &REPORT_FILES,
    );
    let all = copy_names(all, REPORT_FILES.len(), &DIFF_FILES);
    copy_names(all, REPORT_FILES.len() + DIFF_FILES.len(), &DEMO_FILES)
};

/// `all` with `names` written from index `at` on (for building [`MARKED_FILES`] at compile time).
const fn copy_names<const N: usize>(
    mut all: [&'static str; N],
    at: usize,
    names: &[&'static str],
) -> [&'static str; N] {
    let mut i = 0;
    while i < names.len() {
        all[at + i] = names[i];
        i += 1;
    }
    all
}

/// The files `perfkit diff --out` writes (the flamegraphs only where both runs have such stacks)
/// and `perfkit demo` writes into its `diff/` directory.
pub const DIFF_FILES: [&str; 5] = [
    "diff.json",
    "diff.html",
    "diff-flamegraph-host.svg",
    "diff-flamegraph-gpu.svg",
    "diff.txt",
];

/// The names of [`MARKED_FILES`] only `perfkit demo` writes: its lint reports, and each run's
/// program output.
const DEMO_FILES: [&str; 3] = ["lint.txt", "lint.sarif", "train.log"];

/// The first line of [`RUN_MARKER`].
const MARKER_HEADER: &str = "perfkit run directory";

/// Why the output directory could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputDirError {
    /// The directory already holds a run, or files with the names of perfkit's reports.
    #[error(
        "`{}` already holds {}; pass --force to replace it or choose another --out",
        .dir.display(), list_files(.files)
    )]
    AlreadyUsed {
        /// The run directory.
        dir: PathBuf,
        /// The files that would be replaced.
        files: Vec<PathBuf>,
    },
    /// `--force` was given, but the directory holds files perfkit cannot prove it wrote.
    #[error(
        "`{}` holds files that perfkit did not write, or cannot prove it wrote: {}; \
         --force replaces only perfkit's own trace and report files; move or remove these \
         yourself, or choose another --out",
        .dir.display(), list_files(.files)
    )]
    NotOurs {
        /// The run directory.
        dir: PathBuf,
        /// The files left alone.
        files: Vec<PathBuf>,
    },
    /// Another perfkit run holds the directory's lock.
    #[error(
        "`{}` is in use by another perfkit run{}; wait for it to finish or choose another --out",
        .dir.display(),
        .pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Locked {
        /// The run directory.
        dir: PathBuf,
        /// The other run's process id, when its marker names it.
        pid: Option<u32>,
    },
    /// Files named like the reports to write are in the way, and perfkit cannot prove it
    /// wrote them ([`take_for_reports`]).
    #[error(
        "`{}` already holds {}, which perfkit did not write or cannot prove it wrote (it \
         replaces a file only in a directory that carries its `{RUN_MARKER}` marker, and never \
         a link); move or remove these yourself, or choose another --out",
        .dir.display(), list_files(.files)
    )]
    Occupied {
        /// The output directory.
        dir: PathBuf,
        /// The files left alone.
        files: Vec<PathBuf>,
    },
    /// A file system operation failed.
    #[error("cannot prepare output directory `{}`: {source}", path.display())]
    Io {
        /// The path the operation was about.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

fn list_files(files: &[PathBuf]) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<String> = files
        .iter()
        .take(SHOWN)
        .map(|f| format!("`{}`", f.display()))
        .collect();
    if files.len() > SHOWN {
        names.push(format!("and {} more", files.len() - SHOWN));
    }
    if names.is_empty() {
        "a profiled run".to_owned()
    } else {
        names.join(", ")
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> OutputDirError + '_ {
    move |source| OutputDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A run's output directory, created and ready for the program to write its trace into. It
/// holds the directory's lock until dropped: a second run into the same directory is refused.
#[derive(Debug, Clone)]
pub struct OutputDir {
    root: PathBuf,
    trace: PathBuf,
    _lock: Arc<HeldLock>,
}

/// The run marker, locked while this is alive. The lock is released explicitly when dropped:
/// closing the file alone does not release it while another copy of the descriptor is open, and
/// a process that another thread forks holds one until it runs its program.
#[derive(Debug)]
struct HeldLock(File);

impl Drop for HeldLock {
    fn drop(&mut self) {
        unlock(&self.0);
    }
}

impl OutputDir {
    /// Takes the run directory: locks it, checks what it holds, and creates its `trace/`.
    ///
    /// With `out`, that directory is used (created if missing). If another perfkit run holds
    /// it, this fails with [`OutputDirError::Locked`]. If it already holds a run (trace files
    /// in `trace/`) or files named like perfkit's reports ([`REPORT_FILES`]), this fails
    /// unless `force`. With `force`, only what perfkit can prove it wrote is removed: the
    /// trace files in `trace/` (recognised by their magic bytes) and, in a directory that
    /// carries perfkit's [`RUN_MARKER`], the report files by their known names. Anything else
    /// in the way makes it fail with [`OutputDirError::NotOurs`], which names those files,
    /// and nothing is removed. Files with other names are never touched.
    ///
    /// Without `out`, a new directory `perfkit-out/<program>-<UTC timestamp>` is created under
    /// the current directory.
    ///
    /// # Errors
    /// As above, and [`OutputDirError::Io`] when a directory cannot be created or cleared.
    pub fn prepare(
        out: Option<&Path>,
        program: &OsStr,
        force: bool,
    ) -> Result<Self, OutputDirError> {
        let root = match out {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(io_err(dir))?;
                dir.to_path_buf()
            }
            None => create_fresh(
                Path::new(DEFAULT_PARENT),
                &default_dir_name(program, SystemTime::now()),
            )?,
        };
        // The program may change its working directory: hand it an absolute path.
        let root = std::path::absolute(&root).map_err(io_err(&root))?;
        let marker_existed = std::fs::symlink_metadata(root.join(RUN_MARKER)).is_ok();
        let lock = take_lock(&root)?;
        if marker_existed && !lock.had_marker && !lock.empty {
            // A file of the marker's name that perfkit did not write: neither removed nor
            // written over.
            unlock(&lock.file);
            return Err(OutputDirError::NotOurs {
                dir: root.clone(),
                files: vec![root.join(RUN_MARKER)],
            });
        }
        if let Err(err) = clear_previous_run(&root, force, lock.had_marker) {
            if !lock.had_marker && (!marker_existed || lock.empty) {
                // The marker was created only to hold the lock: a refused directory keeps
                // no trace of perfkit.
                let _ = std::fs::remove_file(root.join(RUN_MARKER));
            }
            return Err(err);
        }
        let marker = root.join(RUN_MARKER);
        let mut file = lock.file;
        // Reading the previous marker moved the file's cursor: rewrite it from the start, or
        // the new text lands after a run of NUL bytes and the next run cannot read it.
        file.set_len(0)
            .and_then(|()| {
                use std::io::{Seek as _, Write as _};
                file.rewind()?;
                write!(file, "{MARKER_HEADER}\npid {}\n", std::process::id())
            })
            .map_err(io_err(&marker))?;
        let trace = root.join(TRACE_DIR);
        std::fs::create_dir_all(&trace).map_err(io_err(&trace))?;
        Ok(Self {
            root,
            trace,
            _lock: Arc::new(HeldLock(file)),
        })
    }

    /// The run directory (absolute).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The trace directory handed to the program in `PERFKIT_TRACE` (absolute).
    pub fn trace_dir(&self) -> &Path {
        &self.trace
    }

    /// Removes the trace directory, the run marker and the run directory if nothing else was
    /// written into them (used when the program could not be started). Never removes
    /// anything that holds files.
    pub fn remove_if_empty(&self) {
        // `remove_dir` fails on a non-empty directory, which is what keeps this safe.
        let _ = std::fs::remove_dir(&self.trace);
        let only_marker = std::fs::read_dir(&self.root).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .all(|e| e.file_name() == RUN_MARKER)
        });
        if only_marker {
            let _ = std::fs::remove_file(self.root.join(RUN_MARKER));
        }
        let _ = std::fs::remove_dir(&self.root);
    }

    /// Where `summary.json` goes.
    pub fn summary_path(&self) -> PathBuf {
        self.root.join(SUMMARY_FILE)
    }
}

/// A directory taken by [`take_for_reports`]: marked as perfkit's, and locked (a `perfkit
/// profile` into it is refused) until dropped.
#[derive(Debug)]
#[must_use = "the directory is locked only while this lives"]
pub struct ReportDir {
    _lock: HeldLock,
}

/// Takes `dir` (created if missing) to write the files `names` (some of [`MARKED_FILES`])
/// into, as `perfkit report --out` and `perfkit diff --out` do.
///
/// A name that is not there yet is free. One that is there is replaced only when it is a
/// regular file (not a link) in a directory that carries perfkit's [`RUN_MARKER`]: a file of
/// that name in a directory perfkit never marked is not provably perfkit's. A directory not
/// marked yet is marked only when it holds nothing under any of [`MARKED_FILES`], since the
/// marker vouches for all of them. Anything in the way makes it fail with
/// [`OutputDirError::Occupied`], which names those files; the directory is then left as it
/// was. Otherwise the directory is marked (a marker that is not perfkit's is left as it is:
/// then nothing in it is ever replaced).
///
/// # Errors
/// As above; [`OutputDirError::Locked`] while a `perfkit profile` run holds the directory, and
/// [`OutputDirError::Io`] when it cannot be created or marked.
pub fn take_for_reports(dir: &Path, names: &[&str]) -> Result<ReportDir, OutputDirError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let marker = dir.join(RUN_MARKER);
    let marker_existed = std::fs::symlink_metadata(&marker).is_ok();
    let lock = take_lock(dir)?;
    let in_the_way = in_the_way(dir, names, lock.had_marker);
    if !in_the_way.is_empty() {
        unlock(&lock.file);
        if !marker_existed {
            // Created only to hold the lock: a refused directory keeps no trace of perfkit.
            let _ = std::fs::remove_file(&marker);
        }
        return Err(OutputDirError::Occupied {
            dir: dir.to_path_buf(),
            files: in_the_way,
        });
    }
    let mut file = lock.file;
    if lock.had_marker || !marker_existed {
        file.set_len(0)
            .and_then(|()| {
                use std::io::{Seek as _, Write as _};
                file.rewind()?;
                write!(file, "{MARKER_HEADER}\npid {}\n", std::process::id())
            })
            .map_err(io_err(&marker))?;
    }
    Ok(ReportDir {
        _lock: HeldLock(file),
    })
}

/// What [`take_for_reports`] would refuse, without creating, marking or locking anything: for
/// a command that writes into several directories and checks them all before it starts.
///
/// # Errors
/// [`OutputDirError::Occupied`], naming the files in the way.
pub fn check_for_reports(dir: &Path, names: &[&str]) -> Result<(), OutputDirError> {
    let marked = std::fs::read_to_string(dir.join(RUN_MARKER))
        .is_ok_and(|text| text.lines().next() == Some(MARKER_HEADER));
    let files = in_the_way(dir, names, marked);
    if files.is_empty() {
        Ok(())
    } else {
        Err(OutputDirError::Occupied {
            dir: dir.to_path_buf(),
            files,
        })
    }
}

/// The files under `names` (all of [`MARKED_FILES`] in a directory not marked yet) that
/// perfkit cannot prove it wrote.
fn in_the_way(dir: &Path, names: &[&str], marked: bool) -> Vec<PathBuf> {
    debug_assert!(names.iter().all(|n| MARKED_FILES.contains(n)), "{names:?}");
    let checked: &[&str] = if marked { names } else { &MARKED_FILES };
    checked
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| {
            std::fs::symlink_metadata(path).is_ok_and(|meta| !(marked && meta.is_file()))
        })
        .collect()
}

/// The locked marker file, and whether perfkit had marked the directory before.
struct Lock {
    file: File,
    had_marker: bool,
    /// The file is empty: one perfkit created and was stopped before writing (or just now).
    empty: bool,
}

/// Opens (or creates) the run marker and takes an exclusive lock on it, without waiting.
fn take_lock(root: &Path) -> Result<Lock, OutputDirError> {
    use std::io::Read as _;
    let marker = root.join(RUN_MARKER);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&marker)
        .map_err(io_err(&marker))?;
    if !try_lock_exclusive(&file).map_err(io_err(&marker))? {
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        return Err(OutputDirError::Locked {
            dir: root.to_path_buf(),
            pid: marker_pid(&text),
        });
    }
    let mut text = String::new();
    // An unreadable marker is no proof: treated as absent.
    let _ = file.read_to_string(&mut text);
    Ok(Lock {
        file,
        had_marker: text.lines().next() == Some(MARKER_HEADER),
        empty: text.is_empty(),
    })
}

fn marker_pid(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.trim().parse().ok())
}

#[cfg(unix)]
fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock on a file descriptor this `File` owns; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.kind() == io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(not(unix))]
fn try_lock_exclusive(_file: &File) -> io::Result<bool> {
    Ok(true)
}

#[cfg(unix)]
fn unlock(file: &File) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock on a file descriptor this `File` owns; no memory is passed. A failure leaves
    // the lock to be released when the last copy of the descriptor closes.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
}

#[cfg(not(unix))]
fn unlock(_file: &File) {}

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

/// What stands in `dir` from a previous run, and what `force` may remove of it.
fn clear_previous_run(dir: &Path, force: bool, marked: bool) -> Result<(), OutputDirError> {
    let trace = dir.join(TRACE_DIR);
    let mut ours = Vec::new();
    let mut not_ours = Vec::new();
    match std::fs::read_dir(&trace) {
        Ok(entries) => {
            let mut paths: Vec<PathBuf> =
                entries.filter_map(Result::ok).map(|e| e.path()).collect();
            paths.sort();
            for path in paths {
                if is_trace_file(&path, marked) {
                    ours.push(path);
                } else {
                    not_ours.push(path);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&trace)(e)),
    }
    for name in REPORT_FILES {
        let path = dir.join(name);
        // `symlink_metadata`: a link is not followed, and is not ours to remove.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if marked && meta.is_file() {
            ours.push(path);
        } else {
            not_ours.push(path);
        }
    }
    if ours.is_empty() && not_ours.is_empty() {
        return Ok(());
    }
    if !force {
        let mut files = ours;
        files.extend(not_ours);
        return Err(OutputDirError::AlreadyUsed {
            dir: dir.to_path_buf(),
            files,
        });
    }
    if !not_ours.is_empty() {
        return Err(OutputDirError::NotOurs {
            dir: dir.to_path_buf(),
            files: not_ours,
        });
    }
    for file in &ours {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(file)(e)),
        }
    }
    Ok(())
}

/// Whether `path` is a trace file perfkit wrote: a regular file (not a link) that starts
/// with the trace magic bytes. In a directory perfkit marked, a `.pktrace` file shorter than
/// the magic bytes whose bytes begin them (an empty file, from a process killed before its
/// first write) counts too.
fn is_trace_file(path: &Path, marked: bool) -> bool {
    use std::io::Read as _;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let Ok(file) = File::open(path) else {
        return false;
    };
    let mut head = Vec::with_capacity(MAGIC.len());
    if file
        .take(MAGIC.len() as u64)
        .read_to_end(&mut head)
        .is_err()
    {
        return false;
    }
    if head.len() == MAGIC.len() {
        return head == MAGIC;
    }
    marked && path.extension().is_some_and(|e| e == TRACE_EXTENSION) && MAGIC.starts_with(&head)
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

    fn trace_bytes() -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0, 0, 0]);
        b
    }

    #[test]
    fn a_directory_can_be_reused_with_force_run_after_run() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        for run in 0..3 {
            let out = OutputDir::prepare(Some(&dir), OsStr::new("x"), run > 0).unwrap();
            std::fs::write(dir.join("report.html"), b"x").unwrap();
            drop(out);
            let marker = std::fs::read_to_string(dir.join(RUN_MARKER)).unwrap();
            assert_eq!(
                marker,
                format!("{MARKER_HEADER}\npid {}\n", std::process::id()),
                "run {run}"
            );
        }
    }

    #[test]
    fn a_dropped_run_releases_its_lock_while_a_copy_of_the_descriptor_lives() {
        // A process forked by another thread holds a copy of the descriptor until it runs its
        // program; a duplicate stands for it here.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let out = OutputDir::prepare(Some(&dir), OsStr::new("x"), false).unwrap();
        let copy = out._lock.0.try_clone().unwrap();
        drop(out);
        let again = OutputDir::prepare(Some(&dir), OsStr::new("x"), true);
        assert!(again.is_ok(), "{:?}", again.err());
        drop(copy);
    }

    #[test]
    fn force_replaces_only_what_perfkit_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let out = OutputDir::prepare(Some(&dir), OsStr::new("x"), false).unwrap();
        assert!(out.trace_dir().is_dir());
        assert!(out.root().is_absolute());
        assert!(dir.join(RUN_MARKER).is_file());
        std::fs::write(out.trace_dir().join("old.pktrace"), trace_bytes()).unwrap();
        std::fs::write(out.trace_dir().join("empty.pktrace"), b"").unwrap();
        std::fs::write(dir.join("keep.txt"), b"x").unwrap();
        std::fs::write(dir.join("report.html"), b"x").unwrap();
        std::fs::write(
            dir.join(SUMMARY_FILE),
            br#"{"files": {"reports": ["keep.txt"]}}"#,
        )
        .unwrap();
        drop(out);
        let err = OutputDir::prepare(Some(&dir), OsStr::new("x"), false).unwrap_err();
        assert!(matches!(err, OutputDirError::AlreadyUsed { .. }), "{err}");
        assert!(err.to_string().contains("--force"));
        let out = OutputDir::prepare(Some(&dir), OsStr::new("x"), true).unwrap();
        assert_eq!(std::fs::read_dir(out.trace_dir()).unwrap().count(), 0);
        assert!(
            dir.join("keep.txt").exists(),
            "a file the summary lists is not removed"
        );
        assert!(!dir.join("report.html").exists());
        assert!(!dir.join(SUMMARY_FILE).exists());
    }

    #[test]
    fn force_never_removes_a_file_that_is_not_a_trace() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir(dir.join(TRACE_DIR)).unwrap();
        std::fs::write(dir.join(TRACE_DIR).join("main.rs"), b"fn main() {}").unwrap();
        std::fs::write(dir.join(TRACE_DIR).join("good.pktrace"), trace_bytes()).unwrap();
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::NotOurs { .. }), "{err}");
        assert!(err.to_string().contains("main.rs"), "{err}");
        assert!(dir.join(TRACE_DIR).join("main.rs").exists());
        assert!(
            dir.join(TRACE_DIR).join("good.pktrace").exists(),
            "nothing removed"
        );
        assert!(
            !dir.join(RUN_MARKER).exists(),
            "a refused directory is left unmarked"
        );
    }

    #[test]
    fn a_run_marker_name_perfkit_did_not_write_is_never_removed_or_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join(RUN_MARKER), b"my notes\n").unwrap();
        std::fs::write(dir.join("report.html"), b"my own report").unwrap();
        // Refused, naming it, and the file of the marker's name is left as it was.
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap_err();
        assert!(err.to_string().contains(RUN_MARKER), "{err}");
        assert!(dir.join("report.html").exists());
        assert_eq!(std::fs::read(dir.join(RUN_MARKER)).unwrap(), b"my notes\n");
        // Nothing else in the way: still refused, naming it, rather than written over.
        std::fs::remove_file(dir.join("report.html")).unwrap();
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), false).unwrap_err();
        assert!(matches!(err, OutputDirError::NotOurs { .. }), "{err}");
        assert!(err.to_string().contains(RUN_MARKER), "{err}");
        assert_eq!(std::fs::read(dir.join(RUN_MARKER)).unwrap(), b"my notes\n");
    }

    #[test]
    fn reports_go_only_where_nothing_of_someone_else_is_in_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        // A fresh directory is taken and marked; while taken, a run into it is refused.
        let dir = tmp.path().join("fresh");
        let taken = take_for_reports(&dir, &["report.html"]).unwrap();
        let err = OutputDir::prepare(Some(&dir), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::Locked { .. }), "{err}");
        std::fs::write(dir.join("report.html"), b"perfkit's").unwrap();
        drop(taken);
        // Marked: the report perfkit wrote may be replaced.
        drop(take_for_reports(&dir, &["report.html"]).unwrap());
        // A link is never replaced, not even in a marked directory.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("elsewhere.html", dir.join("summary.md")).unwrap();
            let err = take_for_reports(&dir, &["report.html", "summary.md"]).unwrap_err();
            assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
            assert!(err.to_string().contains("summary.md"), "{err}");
            assert!(!err.to_string().contains("report.html"), "{err}");
        }
        // A `.perfkit-run` that perfkit did not write proves nothing and is left as it is.
        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(RUN_MARKER), b"notes\n").unwrap();
        std::fs::write(other.join("diff.json"), b"{}").unwrap();
        let err = take_for_reports(&other, &["diff.json"]).unwrap_err();
        assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
        let err = take_for_reports(&other, &["diff.html"]).unwrap_err();
        assert!(
            err.to_string().contains("diff.json"),
            "an unmarked directory is marked only when it holds none of perfkit's names: {err}"
        );
        std::fs::rename(other.join("diff.json"), other.join("mine.json")).unwrap();
        drop(take_for_reports(&other, &["diff.json"]).unwrap());
        std::fs::write(other.join("diff.json"), b"{}").unwrap();
        let err = take_for_reports(&other, &["diff.json"]).unwrap_err();
        assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
        assert_eq!(std::fs::read(other.join(RUN_MARKER)).unwrap(), b"notes\n");
        assert_eq!(std::fs::read(other.join("diff.json")).unwrap(), b"{}");
    }

    #[test]
    fn report_names_are_replaced_only_in_a_marked_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("report.html"), b"my own report").unwrap();
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), false).unwrap_err();
        assert!(matches!(err, OutputDirError::AlreadyUsed { .. }), "{err}");
        assert!(err.to_string().contains("report.html"), "{err}");
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::NotOurs { .. }), "{err}");
        assert_eq!(
            std::fs::read(dir.join("report.html")).unwrap(),
            b"my own report"
        );
        assert!(!dir.join(RUN_MARKER).exists());
    }

    #[test]
    fn a_locked_directory_is_refused_with_the_holders_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let first = OutputDir::prepare(Some(tmp.path()), OsStr::new("x"), false).unwrap();
        let err = OutputDir::prepare(Some(tmp.path()), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::Locked { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        OutputDir::prepare(Some(tmp.path()), OsStr::new("x"), false).unwrap();
    }
}
