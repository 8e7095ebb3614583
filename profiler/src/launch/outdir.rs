//! Where a profiled run's files go.
//!
//! ```text
//! perfkit-out/<program>-<YYYYMMDD>-<HHMMSS>/   (default; UTC; `-2`, `-3`, ... when taken)
//! ├── .perfkit-run    marks the directory as perfkit's, holds the run's lock and pid, and
//! │                   records each report file perfkit wrote (its length and CRC-32)
//! ├── trace/          PERFKIT_TRACE: one trace file per traced process
//! └── summary.json    the run's summary (see docs/summary-format.md), and the reports
//! ```
//!
//! perfkit removes or replaces only what it can prove it wrote: with `--force`, trace files
//! recognised by their magic bytes; and a file under one of its report names
//! ([`MARKED_FILES`]) only when the directory's [`RUN_MARKER`] is perfkit's and records writing
//! that very file: the same name, length and CRC-32 as the file there now. Anything else under
//! those names is in the way, and the command is refused, naming it: a file the user wrote or
//! edited, a link, a file whose record is missing (a marker copied from another directory), and
//! every report file of a directory marked by an older perfkit, whose marker records no files.
//! Files with other names are never touched.
//!
//! The marker's text:
//!
//! ```text
//! perfkit run directory
//! pid 4242
//! records 1
//! wrote report.html 94310 5f0e3c1a
//! wrote summary.json 576530 0b1d22e7
//! ```
//!
//! The first two lines are all an older perfkit reads (whose directory it is, which process
//! holds it). `records 1` says that the marker records the files perfkit wrote, one `wrote NAME
//! LENGTH CRC32` line each (the CRC-32 of zlib and gzip, in hex). A file is recorded right after
//! perfkit wrote it ([`ReportDir::record`], [`OutputDir::record`]), while the command holds the
//! directory's lock; the records of the files a command does not write again are kept.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use crate::format::{MAGIC, TRACE_EXTENSION};
use crate::summary::{SUMMARY_FILE, TRACE_DIR, UtcTime};

/// The default parent directory of runs.
pub const DEFAULT_PARENT: &str = "perfkit-out";

/// The file that marks a directory as a perfkit run directory and holds the run's lock.
///
/// perfkit writes it when it takes a directory for a run; while the run lasts it holds an
/// exclusive lock on it and its text names the run's process id. It records each report file
/// perfkit writes into the directory (name, length, CRC-32): a file under a report name is
/// replaced, or removed by `--force`, only when the marker records it as it is now.
pub const RUN_MARKER: &str = ".perfkit-run";

/// The report files perfkit writes into a run directory; the only names, with
/// [`SUMMARY_FILE`], that `--force` may remove (and only the files that perfkit's
/// [`RUN_MARKER`] records, unchanged since).
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
/// vouches only for the files it records under these names; it is still written only into a
/// directory that holds none of them yet (see [`take_for_reports`]), since an older perfkit
/// reads any marker of its own as vouching for all of them.
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

/// The line of a [`RUN_MARKER`] written by a perfkit that records the files it writes, in
/// [`WROTE`] lines after it. A marker of perfkit's without it comes from an older perfkit.
const RECORDS_LINE: &str = "records 1";

/// The start of a [`RUN_MARKER`] line that records a file perfkit wrote: `wrote NAME LENGTH
/// CRC32`, the CRC-32 in 8 hex digits.
const WROTE: &str = "wrote ";

/// Why a marker of an older perfkit proves nothing about the files in its directory.
const OLDER_MARKER: &str = "the directory's `.perfkit-run` marker comes from an older perfkit, \
                            which did not record the files it wrote, so none of them can be \
                            proved perfkit's";

/// Why the output directory could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputDirError {
    /// The directory already holds a run, or files with the names of perfkit's reports.
    #[error(
        "`{}` already holds {}; {}",
        .dir.display(), list_files(.files), already_used_advice(.older_marker)
    )]
    AlreadyUsed {
        /// The run directory.
        dir: PathBuf,
        /// The files that would be replaced.
        files: Vec<PathBuf>,
        /// The directory's marker comes from an older perfkit, which recorded no files: its
        /// report files cannot be proved perfkit's, and `--force` would not replace them.
        older_marker: bool,
    },
    /// `--force` was given, but the directory holds files perfkit cannot prove it wrote.
    #[error(
        "`{}` holds files that perfkit did not write, or cannot prove it wrote: {}{}; \
         --force replaces only perfkit's own trace and report files (the report files the \
         directory's `{RUN_MARKER}` marker records, unchanged since); move or remove these yourself, or \
         choose another --out",
        .dir.display(), list_files(.files), older_note(.older_marker)
    )]
    NotOurs {
        /// The run directory.
        dir: PathBuf,
        /// The files left alone.
        files: Vec<PathBuf>,
        /// The directory's marker comes from an older perfkit, which recorded no files.
        older_marker: bool,
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
        "`{}` already holds {}, which perfkit did not write or cannot prove it wrote ({}); \
         move or remove these yourself, or choose another --out",
        .dir.display(), list_files(.files), occupied_why(.older_marker)
    )]
    Occupied {
        /// The output directory.
        dir: PathBuf,
        /// The files left alone.
        files: Vec<PathBuf>,
        /// The directory's marker comes from an older perfkit, which recorded no files.
        older_marker: bool,
    },
    /// A file perfkit wrote could not be recorded in the directory's marker: a later command
    /// will not replace it.
    #[error(
        "cannot record `{}` as written by perfkit in its directory's `{RUN_MARKER}` marker (a \
         later command will not replace it): {source}",
        path.display()
    )]
    Record {
        /// The file perfkit wrote.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
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

fn already_used_advice(older_marker: &bool) -> String {
    if *older_marker {
        format!(
            "{OLDER_MARKER}, and --force would not replace them: move or remove the report files \
             yourself, or choose another --out"
        )
    } else {
        "pass --force to replace it or choose another --out".to_owned()
    }
}

fn older_note(older_marker: &bool) -> String {
    if *older_marker {
        format!(" ({OLDER_MARKER})")
    } else {
        String::new()
    }
}

fn occupied_why(older_marker: &bool) -> String {
    if *older_marker {
        OLDER_MARKER.to_owned()
    } else {
        format!(
            "it replaces a file only when the directory's `{RUN_MARKER}` marker records writing \
             that very file, unchanged since, and never a link"
        )
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
    lock: Arc<HeldLock>,
}

/// The run marker, locked while this is alive, and what it records. The lock is released
/// explicitly when dropped: closing the file alone does not release it while another copy of
/// the descriptor is open, and a process that another thread forks holds one until it runs its
/// program.
#[derive(Debug)]
struct HeldLock {
    file: File,
    /// What the marker records, and may record; `None` when the marker is not perfkit's: it is
    /// then left as it is, and nothing written into its directory is ever provably perfkit's.
    records: Option<Mutex<Records>>,
}

/// The files a [`HeldLock`]'s marker records.
#[derive(Debug)]
struct Records {
    /// The directory the files are in.
    dir: PathBuf,
    /// The names this command may record: those it took the directory for.
    names: Vec<&'static str>,
    /// The files recorded, by name; kept in the marker until written again or gone.
    files: BTreeMap<&'static str, Written>,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        unlock(&self.file);
    }
}

impl HeldLock {
    /// Records the file under `file`'s name as written by perfkit, as it is now (see
    /// [`ReportDir::record`]).
    fn record(&self, file: &Path) -> Result<(), OutputDirError> {
        let Some(records) = &self.records else {
            return Ok(());
        };
        let mut records = records.lock().unwrap_or_else(PoisonError::into_inner);
        let name = file.file_name().and_then(OsStr::to_str);
        let Some(name) = records.names.iter().copied().find(|n| Some(*n) == name) else {
            debug_assert!(false, "{} is not a name taken", file.display());
            return Ok(());
        };
        let path = records.dir.join(name);
        let measured = measure(&path);
        match &measured {
            Ok(Some(written)) => {
                records.files.insert(name, *written);
            }
            // Not there, not a regular file, or unreadable: nothing of perfkit's to vouch for.
            _ => {
                records.files.remove(name);
            }
        }
        write_marker(&self.file, &records.files).map_err(|source| OutputDirError::Record {
            path: path.clone(),
            source,
        })?;
        measured
            .map(|_| ())
            .map_err(|source| OutputDirError::Record { path, source })
    }
}

impl OutputDir {
    /// Takes the run directory: locks it, checks what it holds, and creates its `trace/`.
    ///
    /// With `out`, that directory is used (created if missing). If another perfkit run holds
    /// it, this fails with [`OutputDirError::Locked`]. If it already holds a run (trace files
    /// in `trace/`) or files named like perfkit's reports ([`REPORT_FILES`]), this fails
    /// unless `force`. With `force`, only what perfkit can prove it wrote is removed: the
    /// trace files in `trace/` (recognised by their magic bytes) and the report files that
    /// perfkit's [`RUN_MARKER`] records, as they are now (same length and CRC-32). Anything
    /// else in the way (a file the marker does not record, one edited since, a link, every
    /// report file of a directory marked by an older perfkit) makes it fail with
    /// [`OutputDirError::NotOurs`], which names those files, and nothing is removed. Files
    /// with other names are never touched; the marker keeps its records of them.
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
        if marker_existed && !lock.marker.ours && !lock.empty {
            // A file of the marker's name that perfkit did not write: neither removed nor
            // written over.
            unlock(&lock.file);
            return Err(OutputDirError::NotOurs {
                dir: root.clone(),
                files: vec![root.join(RUN_MARKER)],
                older_marker: false,
            });
        }
        let removed = match clear_previous_run(&root, force, &lock.marker) {
            Ok(removed) => removed,
            Err(err) => {
                if !lock.marker.ours && (!marker_existed || lock.empty) {
                    // The marker was created only to hold the lock: a refused directory keeps
                    // no trace of perfkit.
                    let _ = std::fs::remove_file(root.join(RUN_MARKER));
                }
                return Err(err);
            }
        };
        let mut files = lock.marker.files;
        files.retain(|name, _| {
            !removed.contains(name) && std::fs::symlink_metadata(root.join(name)).is_ok()
        });
        write_marker(&lock.file, &files).map_err(io_err(&root.join(RUN_MARKER)))?;
        let trace = root.join(TRACE_DIR);
        std::fs::create_dir_all(&trace).map_err(io_err(&trace))?;
        Ok(Self {
            lock: Arc::new(HeldLock {
                file: lock.file,
                records: Some(Mutex::new(Records {
                    dir: root.clone(),
                    names: REPORT_FILES.to_vec(),
                    files,
                })),
            }),
            root,
            trace,
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

    /// Records a report file perfkit just wrote into the run directory (one of
    /// [`REPORT_FILES`], by its name or its path), as [`ReportDir::record`] does: only a file
    /// recorded may later be replaced, or removed by `--force`.
    ///
    /// # Errors
    /// [`OutputDirError::Record`] when the file cannot be read or the marker written.
    pub fn record(&self, file: impl AsRef<Path>) -> Result<(), OutputDirError> {
        self.lock.record(file.as_ref())
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
/// profile` into it is refused) until dropped. Each file written into it is recorded with
/// [`ReportDir::record`], so that a later command may replace it.
#[derive(Debug)]
#[must_use = "the directory is locked only while this lives"]
pub struct ReportDir {
    lock: HeldLock,
}

impl ReportDir {
    /// Records in the directory's marker that perfkit just wrote the file `file` (one of the
    /// names the directory was taken for, given as the name or as its path): its length and
    /// CRC-32 as it is now. A later command replaces the file only while it is still exactly
    /// that. Call it right after writing each file, never for a file perfkit did not write.
    ///
    /// In a directory whose marker is not perfkit's, nothing is recorded (and nothing written
    /// there is ever replaced).
    ///
    /// # Errors
    /// [`OutputDirError::Record`] when the file cannot be read or the marker written; the
    /// file is then not recorded.
    pub fn record(&self, file: impl AsRef<Path>) -> Result<(), OutputDirError> {
        self.lock.record(file.as_ref())
    }
}

/// Takes `dir` (created if missing) to write the files `names` (some of [`MARKED_FILES`])
/// into, as `perfkit report --out` and `perfkit diff --out` do.
///
/// A name that is not there yet is free. One that is there is replaced only when perfkit can
/// prove it wrote it: the directory's [`RUN_MARKER`] is perfkit's and records that name with
/// the length and CRC-32 of the file there now (a regular file, not a link). A directory not
/// marked yet is marked only when it holds nothing under any of [`MARKED_FILES`]. Anything in
/// the way makes it fail with [`OutputDirError::Occupied`], which names those files; the
/// directory is then left as it was. Otherwise the directory is marked, keeping what the
/// marker records of its other files (a marker that is not perfkit's is left as it is: then
/// nothing in it is ever replaced). Each file written is then recorded with
/// [`ReportDir::record`].
///
/// # Errors
/// As above; [`OutputDirError::Locked`] while a `perfkit profile` run holds the directory, and
/// [`OutputDirError::Io`] when it cannot be created or marked.
pub fn take_for_reports(dir: &Path, names: &[&str]) -> Result<ReportDir, OutputDirError> {
    debug_assert!(names.iter().all(|n| MARKED_FILES.contains(n)), "{names:?}");
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let marker = dir.join(RUN_MARKER);
    let marker_existed = std::fs::symlink_metadata(&marker).is_ok();
    let lock = take_lock(dir)?;
    let in_the_way = in_the_way(dir, names, &lock.marker);
    if !in_the_way.is_empty() {
        unlock(&lock.file);
        if !marker_existed {
            // Created only to hold the lock: a refused directory keeps no trace of perfkit.
            let _ = std::fs::remove_file(&marker);
        }
        return Err(OutputDirError::Occupied {
            dir: dir.to_path_buf(),
            files: in_the_way,
            older_marker: lock.marker.older(),
        });
    }
    // An empty marker is one perfkit created and was stopped before writing (or just now).
    let records = if lock.marker.ours || lock.empty {
        let mut files = lock.marker.files;
        files.retain(|name, _| std::fs::symlink_metadata(dir.join(name)).is_ok());
        write_marker(&lock.file, &files).map_err(io_err(&marker))?;
        Some(Mutex::new(Records {
            dir: dir.to_path_buf(),
            names: MARKED_FILES
                .into_iter()
                .filter(|n| names.contains(n))
                .collect(),
            files,
        }))
    } else {
        None
    };
    Ok(ReportDir {
        lock: HeldLock {
            file: lock.file,
            records,
        },
    })
}

/// What [`take_for_reports`] would refuse, without creating, marking or locking anything: for
/// a command that writes into several directories and checks them all before it starts.
///
/// # Errors
/// [`OutputDirError::Occupied`], naming the files in the way.
pub fn check_for_reports(dir: &Path, names: &[&str]) -> Result<(), OutputDirError> {
    let marker = std::fs::read_to_string(dir.join(RUN_MARKER))
        .map(|text| Marker::parse(&text))
        .unwrap_or_default();
    let files = in_the_way(dir, names, &marker);
    if files.is_empty() {
        Ok(())
    } else {
        Err(OutputDirError::Occupied {
            dir: dir.to_path_buf(),
            files,
            older_marker: marker.older(),
        })
    }
}

/// The files under `names` (all of [`MARKED_FILES`] in a directory perfkit has not marked)
/// that perfkit cannot prove it wrote.
fn in_the_way(dir: &Path, names: &[&str], marker: &Marker) -> Vec<PathBuf> {
    debug_assert!(names.iter().all(|n| MARKED_FILES.contains(n)), "{names:?}");
    let checked: &[&str] = if marker.ours { names } else { &MARKED_FILES };
    checked
        .iter()
        .filter(|name| {
            std::fs::symlink_metadata(dir.join(name)).is_ok() && !marker.proves(dir, name)
        })
        .map(|name| dir.join(name))
        .collect()
}

/// What a [`RUN_MARKER`]'s text says.
#[derive(Debug, Default)]
struct Marker {
    /// It is perfkit's (its first line is [`MARKER_HEADER`]).
    ours: bool,
    /// It records the files perfkit wrote ([`RECORDS_LINE`]); a marker of perfkit's without it
    /// comes from an older perfkit.
    records: bool,
    /// The files recorded, by name (only names of [`MARKED_FILES`]).
    files: BTreeMap<&'static str, Written>,
}

/// A file as perfkit wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    /// Its length in bytes.
    len: u64,
    /// The CRC-32 of its bytes (that of zlib and gzip).
    crc32: u32,
}

impl Marker {
    fn parse(text: &str) -> Self {
        let mut lines = text.lines();
        if lines.next() != Some(MARKER_HEADER) {
            return Self::default();
        }
        let mut marker = Self {
            ours: true,
            ..Self::default()
        };
        for line in lines {
            if line == RECORDS_LINE {
                marker.records = true;
            } else if let Some(record) = line.strip_prefix(WROTE)
                && let [name, len, crc32] = record.split(' ').collect::<Vec<_>>()[..]
                && let Some(name) = MARKED_FILES.into_iter().find(|n| *n == name)
                && let Ok(len) = len.parse()
                && crc32.len() == 8
                && let Ok(crc32) = u32::from_str_radix(crc32, 16)
            {
                marker.files.insert(name, Written { len, crc32 });
            }
        }
        if !marker.records {
            // Not a marker that records anything: a `wrote` line proves nothing.
            marker.files.clear();
        }
        marker
    }

    /// It is an older perfkit's, which recorded no files.
    fn older(&self) -> bool {
        self.ours && !self.records
    }

    /// Whether the file under `name` in `dir` is one perfkit wrote: a regular file (not a
    /// link) of the length and CRC-32 this marker records for that name.
    fn proves(&self, dir: &Path, name: &str) -> bool {
        let Some(recorded) = self.files.get(name) else {
            return false;
        };
        let path = dir.join(name);
        // The length first: most files that are not perfkit's are not read at all.
        std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == recorded.len)
            && measure(&path).is_ok_and(|now| now == Some(*recorded))
    }
}

/// The text of a marker of perfkit's that holds the lock for this process and records `files`.
fn marker_text(files: &BTreeMap<&'static str, Written>) -> String {
    use std::fmt::Write as _;
    let mut text = format!(
        "{MARKER_HEADER}\npid {}\n{RECORDS_LINE}\n",
        std::process::id()
    );
    for (name, written) in files {
        let _ = writeln!(text, "{WROTE}{name} {} {:08x}", written.len, written.crc32);
    }
    text
}

/// Rewrites the locked marker `file` (in place: the lock belongs to this file) to
/// [`marker_text`]. Reading the previous marker moved the file's cursor: it is rewritten from
/// the start, or the new text would land after a run of NUL bytes and the next command could
/// not read it.
fn write_marker(file: &File, files: &BTreeMap<&'static str, Written>) -> io::Result<()> {
    use std::io::{Seek as _, Write as _};
    let text = marker_text(files);
    let mut file = file;
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(text.as_bytes())
}

/// The length and CRC-32 of the regular file at `path` as it is now; `None` when there is no
/// regular file there (a link is not followed, a named pipe not opened).
fn measure(path: &Path) -> io::Result<Option<Written>> {
    use std::io::Read as _;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        // Replaced by a link or a named pipe since: not followed, and not waited on.
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let mut file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Ok(None);
    }
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        crc.update(&buf[..n]);
        len += n as u64;
    }
    Ok(Some(Written {
        len,
        crc32: crc.finalize(),
    }))
}

/// The locked marker file, and what it said when it was taken.
struct Lock {
    file: File,
    marker: Marker,
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
    let mut bytes = Vec::new();
    // An unreadable marker is no proof: treated as absent (and not as empty, which perfkit
    // may write over).
    let read = file.read_to_end(&mut bytes);
    Ok(Lock {
        file,
        marker: Marker::parse(&String::from_utf8_lossy(&bytes)),
        empty: read.is_ok() && bytes.is_empty(),
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

/// What stands in `dir` from a previous run, and what `force` may remove of it. Returns the
/// names of the report files removed.
fn clear_previous_run(
    dir: &Path,
    force: bool,
    marker: &Marker,
) -> Result<Vec<&'static str>, OutputDirError> {
    let trace = dir.join(TRACE_DIR);
    let mut ours = Vec::new();
    let mut not_ours = Vec::new();
    match std::fs::read_dir(&trace) {
        Ok(entries) => {
            let mut paths: Vec<PathBuf> =
                entries.filter_map(Result::ok).map(|e| e.path()).collect();
            paths.sort();
            for path in paths {
                if is_trace_file(&path, marker.ours) {
                    ours.push(path);
                } else {
                    not_ours.push(path);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&trace)(e)),
    }
    let mut reports = Vec::new();
    let mut reports_not_ours = false;
    for name in REPORT_FILES {
        let path = dir.join(name);
        // `symlink_metadata`: a link is not followed, and is not ours to remove.
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        if marker.proves(dir, name) {
            ours.push(path);
            reports.push(name);
        } else {
            not_ours.push(path);
            reports_not_ours = true;
        }
    }
    if ours.is_empty() && not_ours.is_empty() {
        return Ok(reports);
    }
    let older_marker = reports_not_ours && marker.older();
    if !force {
        let mut files = ours;
        files.extend(not_ours);
        return Err(OutputDirError::AlreadyUsed {
            dir: dir.to_path_buf(),
            files,
            older_marker,
        });
    }
    if !not_ours.is_empty() {
        return Err(OutputDirError::NotOurs {
            dir: dir.to_path_buf(),
            files: not_ours,
            older_marker,
        });
    }
    for file in &ours {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(file)(e)),
        }
    }
    Ok(reports)
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
            out.record(dir.join("report.html")).unwrap();
            drop(out);
            let marker = std::fs::read_to_string(dir.join(RUN_MARKER)).unwrap();
            assert_eq!(
                marker,
                format!(
                    "{MARKER_HEADER}\npid {}\n{RECORDS_LINE}\nwrote report.html 1 {:08x}\n",
                    std::process::id(),
                    crc32fast::hash(b"x")
                ),
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
        let copy = out.lock.file.try_clone().unwrap();
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
        out.record("report.html").unwrap();
        out.record(SUMMARY_FILE).unwrap();
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
        taken.record("report.html").unwrap();
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

    /// Takes `dir` for `name`, writes `text` under it and records it, as `perfkit report` does.
    fn write_as_perfkit(dir: &Path, name: &str, text: &[u8]) {
        let taken = take_for_reports(dir, &[name]).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
        taken.record(dir.join(name)).unwrap();
    }

    #[test]
    fn a_file_the_user_put_under_a_report_name_since_is_in_the_way() {
        // The tester's reproducer: reports written, one of them replaced by notes of the user's.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_as_perfkit(dir, "summary.md", b"# perfkit summary\n");
        write_as_perfkit(dir, "summary.md", b"# perfkit summary, again\n");
        std::fs::remove_file(dir.join("summary.md")).unwrap();
        std::fs::write(dir.join("summary.md"), b"# my notes\n").unwrap();
        let err = take_for_reports(dir, &["summary.md"]).unwrap_err();
        assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
        assert!(err.to_string().contains("summary.md"), "{err}");
        assert!(err.to_string().contains("unchanged since"), "{err}");
        let err = check_for_reports(dir, &["summary.md"]).unwrap_err();
        assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
        assert_eq!(
            std::fs::read(dir.join("summary.md")).unwrap(),
            b"# my notes\n"
        );
        // Nor may `perfkit profile --force` remove it.
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::NotOurs { .. }), "{err}");
        assert!(err.to_string().contains("summary.md"), "{err}");
        assert_eq!(
            std::fs::read(dir.join("summary.md")).unwrap(),
            b"# my notes\n"
        );
    }

    #[test]
    fn a_report_edited_after_perfkit_wrote_it_is_in_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_as_perfkit(dir, "report.html", b"<p>perfkit</p>");
        write_as_perfkit(dir, SUMMARY_FILE, b"{}");
        // Same length, other bytes: the CRC-32 tells them apart.
        std::fs::write(dir.join("report.html"), b"<p>edited</p> ").unwrap();
        let err = take_for_reports(dir, &["report.html", SUMMARY_FILE]).unwrap_err();
        assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
        assert!(err.to_string().contains("report.html"), "{err}");
        assert!(
            !err.to_string().contains(SUMMARY_FILE),
            "the summary is still perfkit's: {err}"
        );
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::NotOurs { .. }), "{err}");
        assert!(err.to_string().contains("report.html"), "{err}");
        assert!(!err.to_string().contains(SUMMARY_FILE), "{err}");
        assert!(dir.join(SUMMARY_FILE).exists(), "nothing removed");
        assert_eq!(
            std::fs::read(dir.join("report.html")).unwrap(),
            b"<p>edited</p> "
        );
        // Put back as perfkit wrote it, it is perfkit's again.
        std::fs::write(dir.join("report.html"), b"<p>perfkit</p>").unwrap();
        drop(take_for_reports(dir, &["report.html", SUMMARY_FILE]).unwrap());
    }

    #[test]
    fn a_marker_copied_from_another_run_vouches_for_nothing_in_its_new_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let out = OutputDir::prepare(Some(&run), OsStr::new("x"), false).unwrap();
        std::fs::write(run.join("report.html"), b"<p>the run's report</p>").unwrap();
        out.record("report.html").unwrap();
        drop(out);
        let mine = tmp.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::fs::copy(run.join(RUN_MARKER), mine.join(RUN_MARKER)).unwrap();
        std::fs::write(mine.join("report.html"), b"<p>my own report</p>").unwrap();
        let err = take_for_reports(&mine, &["report.html"]).unwrap_err();
        assert!(matches!(err, OutputDirError::Occupied { .. }), "{err}");
        assert!(err.to_string().contains("report.html"), "{err}");
        let err = OutputDir::prepare(Some(&mine), OsStr::new("x"), true).unwrap_err();
        assert!(matches!(err, OutputDirError::NotOurs { .. }), "{err}");
        assert_eq!(
            std::fs::read(mine.join("report.html")).unwrap(),
            b"<p>my own report</p>"
        );
        // The run's own directory still replaces its report.
        drop(OutputDir::prepare(Some(&run), OsStr::new("x"), true).unwrap());
        assert!(!run.join("report.html").exists());
    }

    #[test]
    fn an_older_marker_proves_no_report_file_and_says_what_to_do() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let older = format!("{MARKER_HEADER}\npid 1\n");
        std::fs::write(dir.join(RUN_MARKER), &older).unwrap();
        std::fs::write(dir.join("report.html"), b"<p>perfkit, long ago</p>").unwrap();
        let err = take_for_reports(dir, &["report.html"]).unwrap_err();
        assert!(
            matches!(
                err,
                OutputDirError::Occupied {
                    older_marker: true,
                    ..
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        for said in [
            "report.html",
            "older perfkit",
            "remove",
            "choose another --out",
        ] {
            assert!(text.contains(said), "{said}: {text}");
        }
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), false).unwrap_err();
        assert!(
            matches!(
                err,
                OutputDirError::AlreadyUsed {
                    older_marker: true,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.to_string().contains("pass --force"), "{err}");
        assert!(err.to_string().contains("older perfkit"), "{err}");
        let err = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap_err();
        assert!(
            matches!(
                err,
                OutputDirError::NotOurs {
                    older_marker: true,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("older perfkit"), "{err}");
        assert!(dir.join("report.html").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join(RUN_MARKER)).unwrap(),
            older
        );
        // `wrote` lines in a marker without the records line prove nothing either.
        let forged = format!(
            "{older}wrote report.html 24 {:08x}\n",
            crc32fast::hash(b"<p>perfkit, long ago</p>")
        );
        std::fs::write(dir.join(RUN_MARKER), &forged).unwrap();
        assert!(take_for_reports(dir, &["report.html"]).is_err());
        // Once the file is gone, the directory is taken and marked anew.
        std::fs::remove_file(dir.join("report.html")).unwrap();
        write_as_perfkit(dir, "report.html", b"<p>perfkit</p>");
        drop(take_for_reports(dir, &["report.html"]).unwrap());
    }

    #[test]
    fn the_records_of_files_not_written_again_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_as_perfkit(dir, "diff.json", b"{}");
        write_as_perfkit(dir, "report.html", b"<p>1</p>");
        write_as_perfkit(dir, "report.html", b"<p>2</p>");
        // A run with --force removes the report, and keeps the record of the diff.
        let out = OutputDir::prepare(Some(dir), OsStr::new("x"), true).unwrap();
        assert!(!dir.join("report.html").exists());
        std::fs::write(dir.join(SUMMARY_FILE), b"{}").unwrap();
        out.record(dir.join(SUMMARY_FILE)).unwrap();
        drop(out);
        let marker = std::fs::read_to_string(dir.join(RUN_MARKER)).unwrap();
        assert!(marker.contains("wrote diff.json 2 "), "{marker}");
        assert!(marker.contains("wrote summary.json 2 "), "{marker}");
        assert!(!marker.contains("report.html"), "{marker}");
        drop(take_for_reports(dir, &["diff.json", SUMMARY_FILE]).unwrap());
        let marker = std::fs::read_to_string(dir.join(RUN_MARKER)).unwrap();
        assert!(marker.contains("wrote diff.json 2 "), "{marker}");
    }

    #[test]
    fn a_file_gone_or_replaced_by_a_link_is_not_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_as_perfkit(dir, "report.html", b"<p>perfkit</p>");
        let taken = take_for_reports(dir, &["report.html"]).unwrap();
        std::fs::remove_file(dir.join("report.html")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("report.html")).unwrap();
        taken.record("report.html").unwrap();
        drop(taken);
        let marker = std::fs::read_to_string(dir.join(RUN_MARKER)).unwrap();
        assert!(!marker.contains("report.html"), "{marker}");
    }

    #[test]
    fn a_marker_records_only_the_names_perfkit_writes() {
        let text = format!(
            "{MARKER_HEADER}\npid 1\n{RECORDS_LINE}\nwrote report.html 3 0000000a\n\
             wrote ../notes.md 3 0000000a\nwrote Cargo.toml 3 0000000a\n\
             wrote summary.md x 0000000a\nwrote diff.json 3 a\nwrote lint.txt 3 0000000a extra\n"
        );
        let marker = Marker::parse(&text);
        assert!(marker.ours && marker.records && !marker.older());
        assert_eq!(
            marker.files.keys().copied().collect::<Vec<_>>(),
            ["report.html"]
        );
        assert!(!Marker::parse("perfkit run directory?\nrecords 1\n").ours);
    }
}
