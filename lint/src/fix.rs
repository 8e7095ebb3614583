//! Applying the machine-applicable fixes of a lint run to the files on disk.
//!
//! Per file, the fixes of its findings are taken in source order; a fix whose edits overlap an edit of a
//! fix already taken is skipped (the next run picks it up once the first one is in). The edited text must
//! still parse (as Rust with `syn`, as Python with Ruff's parser) before anything is written, and it is written atomically: to a temporary
//! file in the same directory, then renamed over the original, which keeps its permissions and owner
//! (see [`write_fixed`] for files that cannot be replaced that way). A file whose fixed text would not
//! parse, that the user may not write, or that changed since it was linted is left as it was and
//! reported.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{Diagnostic, Edit, Fix};

/// Why fixing one file failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FixError {
    /// The file could not be read or written.
    #[error("{path}: cannot apply fixes: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Rewriting the file in place failed, and so did writing its original text back: the file
    /// may hold part of the fixed text.
    #[error(
        "{path}: cannot apply fixes: {source}; writing the original text back failed too ({restore}): \
         the file may be damaged"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// Why the rewrite failed.
        source: std::io::Error,
        /// Why the original text could not be written back.
        restore: std::io::Error,
    },
    /// An edit lies outside the file or splits a character: the file changed since it was linted.
    #[error(
        "{path}: the file changed since it was linted (an edit at byte {offset} no longer fits); run again"
    )]
    Stale {
        /// The file.
        path: PathBuf,
        /// The byte offset that does not fit.
        offset: usize,
    },
    /// The file's text is not the text that was linted: it was saved or rewritten meanwhile.
    #[error("{path}: the file changed since it was linted; left unchanged (run again)")]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// The file is read-only, or the user may not write it: perfkit does not write a file its owner
    /// protected.
    #[error(
        "{path}: the file is read-only or not yours to write; left unchanged (make it writable to apply the fixes)"
    )]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },
    /// The fixed text would not parse; the file was left as it was.
    #[error("{path}: the fixed file would not parse ({message}); left unchanged")]
    WouldNotParse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The fixed text would need a newer Python than the file does (an f-string that reuses its
    /// quote, valid from 3.12); the file was left as it was.
    #[error(
        "{path}: the fixed file would need a newer Python than it does now ({message}); left unchanged"
    )]
    NewerPython {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line.
        message: String,
    },
}

impl FixError {
    /// What went wrong, without the path (for a report's error entry, which names the file).
    pub fn detail(&self) -> String {
        let full = self.to_string();
        let prefix = format!("{}: ", self.path().display());
        full.strip_prefix(&prefix)
            .map_or(full.clone(), str::to_string)
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FixError::Io { path, .. }
            | FixError::Stale { path, .. }
            | FixError::Damaged { path, .. }
            | FixError::Changed { path }
            | FixError::ReadOnly { path }
            | FixError::WouldNotParse { path, .. }
            | FixError::NewerPython { path, .. } => path,
        }
    }
}

/// What [`apply_fixes`] did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct FixSummary {
    /// Fixes written to disk.
    pub applied: usize,
    /// Fixes left out because they overlapped a fix applied in the same pass.
    pub skipped: usize,
    /// Files rewritten.
    pub files_changed: Vec<PathBuf>,
    /// Files that could not be fixed, with why.
    pub errors: Vec<FixError>,
}

/// The outcome of applying the fixes of one file's text in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedText {
    /// The text with the fixes applied.
    pub text: String,
    /// Fixes applied.
    pub applied: usize,
    /// Fixes skipped because they overlapped one applied before them.
    pub skipped: usize,
}

/// Applies the fixes of `diagnostics` (those that carry one) to their files and writes the files that
/// change. Findings without a fix are ignored, and so are findings in notebooks: perfkit does not
/// rewrite `.ipynb` files.
pub fn apply_fixes(diagnostics: &[Diagnostic]) -> FixSummary {
    // By the file itself: a file linted under two names (through a symbolic link, or two hard
    // links) is written once, its fixes merged (the same fix twice counts once).
    let mut by_file: BTreeMap<FileKey, (&Path, Vec<&Fix>)> = BTreeMap::new();
    for diagnostic in diagnostics {
        if diagnostic.cell.is_some() || crate::python::notebook::is_notebook(&diagnostic.path) {
            continue;
        }
        if let Some(fix) = &diagnostic.fix {
            let path = diagnostic.path.as_path();
            let file = file_key(path);
            by_file
                .entry(file)
                .or_insert((path, Vec::new()))
                .1
                .push(fix);
        }
    }
    let mut summary = FixSummary::default();
    for (path, fixes) in by_file.into_values() {
        match fix_file(path, &fixes) {
            Ok(Some(fixed)) => {
                summary.applied += fixed.applied;
                summary.skipped += fixed.skipped;
                summary.files_changed.push(path.to_path_buf());
            }
            Ok(None) => {}
            Err(error) => summary.errors.push(error),
        }
    }
    summary
}

/// What tells files apart: the device and inode where there are some (every name of a file, hard
/// links included), and the resolved path.
type FileKey = (u64, u64, PathBuf);

fn file_key(path: &Path) -> FileKey {
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(meta) = std::fs::metadata(&resolved) {
            return (meta.dev(), meta.ino(), PathBuf::new());
        }
    }
    (0, 0, resolved)
}

/// Fixes one file on disk; `Ok(None)` when nothing changed.
fn fix_file(path: &Path, fixes: &[&Fix]) -> Result<Option<FixedText>, FixError> {
    let io_error = |source| FixError::Io {
        path: path.to_path_buf(),
        source,
    };
    let original = std::fs::read_to_string(path).map_err(io_error)?;
    // Offsets computed on other text would edit the wrong places, and the result may still parse.
    // The file is hashed once, and only when a fix carries a fingerprint.
    let mut current = None;
    if fixes.iter().any(|fix| {
        fix.linted.is_some_and(|linted| {
            linted
                != *current.get_or_insert_with(|| crate::diagnostic::source_fingerprint(&original))
        })
    }) {
        return Err(FixError::Changed {
            path: path.to_path_buf(),
        });
    }
    let fixed = apply_to_text(&original, fixes).map_err(|offset| FixError::Stale {
        path: path.to_path_buf(),
        offset,
    })?;
    if fixed.applied == 0 || fixed.text == original {
        return Ok(None);
    }
    if crate::engine::is_python(path) {
        if let Err((message, offset)) = crate::python::parse_source(&fixed.text) {
            let line = crate::diagnostic::line_at_offset(fixed.text.as_bytes(), offset);
            return Err(FixError::WouldNotParse {
                path: path.to_path_buf(),
                message: format!("line {line}: {message}"),
            });
        }
        if let Some((message, offset)) = crate::python::newer_syntax(&original, &fixed.text) {
            let line = crate::diagnostic::line_at_offset(fixed.text.as_bytes(), offset);
            return Err(FixError::NewerPython {
                path: path.to_path_buf(),
                message: format!("line {line}: {message}"),
            });
        }
    } else if let Err(error) = syn::parse_file(&fixed.text) {
        let start = error.span().start();
        return Err(FixError::WouldNotParse {
            path: path.to_path_buf(),
            message: format!("line {}: {error}", start.line),
        });
    }
    write_fixed(path, &original, fixed.text.as_bytes())?;
    Ok(Some(fixed))
}

/// Writes the fixed text of `path`, whose text was `original` when the fixes were computed.
///
/// A file the user may not write is left alone, whatever the directory allows: its mode says
/// read-only, or opening it for writing is refused (another user's file in a shared directory).
/// The text is then written to a temporary file beside it, which takes the file's permissions and
/// owner, and renamed over it; a file with other hard links, or whose owner the temporary file
/// cannot take, is rewritten in place instead (a rename would leave the other names with the old
/// text, or give the file to whoever runs perfkit). Right before the rename (or the rewrite) the
/// file is read again: if it is no longer `original` (saved meanwhile), nothing is written and the
/// file is reported as changed.
fn write_fixed(path: &Path, original: &str, contents: &[u8]) -> Result<(), FixError> {
    let io_error = |source| FixError::Io {
        path: path.to_path_buf(),
        source,
    };
    let read_only = || FixError::ReadOnly {
        path: path.to_path_buf(),
    };
    let changed = || FixError::Changed {
        path: path.to_path_buf(),
    };
    let target = std::fs::canonicalize(path).map_err(io_error)?;
    let meta = std::fs::metadata(&target).map_err(io_error)?;
    if meta.permissions().readonly() {
        return Err(read_only());
    }
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&target)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(read_only());
        }
        Err(error) => return Err(io_error(error)),
    };
    let unchanged = |file: &mut std::fs::File| -> std::io::Result<bool> {
        use std::io::{Read, Seek};
        file.seek(std::io::SeekFrom::Start(0))?;
        let mut now = Vec::with_capacity(original.len() + 1);
        file.read_to_end(&mut now)?;
        Ok(now == original.as_bytes())
    };
    // Rewriting in place overwrites the text where it is and only then changes the length, so
    // that the blocks the file already has stay its own: when the disk fills up while the longer
    // text is written (or anything else fails), the original text is written back into them.
    let in_place = |file: &mut std::fs::File| -> Result<(), FixError> {
        if !unchanged(file).map_err(io_error)? {
            return Err(changed());
        }
        let rewrite = |file: &mut std::fs::File, text: &[u8]| -> std::io::Result<()> {
            use std::io::Seek;
            file.seek(std::io::SeekFrom::Start(0))?;
            file.write_all(text)?;
            file.set_len(text.len() as u64)?;
            file.sync_all()
        };
        let Err(error) = rewrite(file, contents) else {
            return Ok(());
        };
        match rewrite(file, original.as_bytes()) {
            Ok(()) => Err(io_error(error)),
            Err(restore) => Err(FixError::Damaged {
                path: path.to_path_buf(),
                source: error,
                restore,
            }),
        }
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.nlink() > 1 {
            return in_place(&mut file);
        }
    }
    let dir = target.parent().unwrap_or(Path::new("."));
    let mut temp = tempfile::Builder::new()
        .prefix(".perfkit-fix")
        .tempfile_in(dir)
        .map_err(io_error)?;
    temp.write_all(contents).map_err(io_error)?;
    temp.as_file().sync_all().map_err(io_error)?;
    temp.as_file()
        .set_permissions(meta.permissions())
        .map_err(io_error)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let owner = (meta.uid(), meta.gid());
        let temp_meta = temp.as_file().metadata().map_err(io_error)?;
        if (temp_meta.uid(), temp_meta.gid()) != owner
            && std::os::unix::fs::fchown(temp.as_file(), Some(owner.0), Some(owner.1)).is_err()
        {
            // The temporary file (removed when dropped) cannot take the owner: rewrite in place.
            drop(temp);
            return in_place(&mut file);
        }
    }
    if !unchanged(&mut file).map_err(io_error)? {
        return Err(changed());
    }
    temp.persist(&target)
        .map_err(|error| io_error(error.error))?;
    Ok(())
}

/// Applies `fixes` to `text`: fixes in order of their first edit, each one whole or not at all, skipping a
/// fix that overlaps one taken before it and any exact duplicate of one taken. `Err(offset)` when an edit
/// does not fit the text (past its end, reversed, or inside a character).
pub fn apply_to_text(text: &str, fixes: &[&Fix]) -> Result<FixedText, usize> {
    let mut ordered: Vec<&Fix> = fixes
        .iter()
        .copied()
        .filter(|fix| !fix.edits.is_empty())
        .collect();
    ordered.sort_by_key(|fix| fix.edits.iter().map(|edit| (edit.start, edit.end)).min());
    // The edits taken so far, by (start, end): they never overlap one another, so an edit can
    // only overlap the last one that starts before it or those that start within it (a lookup,
    // not a pass over every edit taken: a file with 100,000 fixes is fixed in linear time).
    let mut taken: BTreeMap<(usize, usize), &Edit> = BTreeMap::new();
    let mut applied = 0;
    // The fixes applied, by their first edit: an exact duplicate has the same first edit.
    let mut seen: std::collections::HashMap<(usize, usize), Vec<&Fix>> =
        std::collections::HashMap::new();
    let mut skipped = 0;
    for fix in ordered {
        for edit in &fix.edits {
            if edit.start > edit.end || edit.end > text.len() {
                return Err(if edit.end > text.len() {
                    edit.end
                } else {
                    edit.start
                });
            }
            if !text.is_char_boundary(edit.start) || !text.is_char_boundary(edit.end) {
                return Err(edit.start);
            }
        }
        // Two findings can carry the same fix (one chain, two rules): it counts once.
        let first = fix
            .edits
            .iter()
            .map(|edit| (edit.start, edit.end))
            .min()
            .unwrap_or_default();
        let same_start = seen.entry(first).or_default();
        if same_start.iter().any(|other| other.edits == fix.edits) {
            continue;
        }
        same_start.push(fix);
        let overlaps_own = fix
            .edits
            .iter()
            .enumerate()
            .any(|(i, a)| fix.edits.iter().skip(i + 1).any(|b| overlap(a, b)));
        let overlaps_taken = fix.edits.iter().any(|a| overlaps_any(&taken, a));
        if overlaps_own || overlaps_taken {
            skipped += 1;
            continue;
        }
        for edit in &fix.edits {
            taken.insert((edit.start, edit.end), edit);
        }
        applied += 1;
    }
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    for edit in taken.values() {
        out.push_str(&text[cursor..edit.start]);
        out.push_str(&edit.replacement);
        cursor = edit.end;
    }
    out.push_str(&text[cursor..]);
    Ok(FixedText {
        text: out,
        applied,
        skipped,
    })
}

/// Whether `edit` overlaps any of `taken` (edits that do not overlap one another, by start and
/// end). Only two kinds can: the last edit that starts before `edit` (it may reach into it) and
/// those that start from `edit`'s start to its end; each is checked with [`overlap`].
fn overlaps_any(taken: &BTreeMap<(usize, usize), &Edit>, edit: &Edit) -> bool {
    let before = taken.range(..(edit.start, 0)).next_back();
    let within = taken.range((edit.start, 0)..=(edit.end, usize::MAX));
    before
        .into_iter()
        .chain(within)
        .any(|(_, other)| overlap(edit, other))
}

/// Two edits conflict when their ranges share a byte, or when both insert at the same point (their
/// order would be a guess).
fn overlap(a: &Edit, b: &Edit) -> bool {
    if a.start == a.end && b.start == b.end {
        return a.start == b.start;
    }
    // Also true for an insertion strictly inside the other edit's range.
    a.start < b.end && b.start < a.end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(edits: &[(usize, usize, &str)]) -> Fix {
        Fix {
            title: "test fix".into(),
            edits: edits
                .iter()
                .map(|&(start, end, replacement)| Edit {
                    start,
                    end,
                    replacement: replacement.into(),
                })
                .collect(),
            linted: None,
        }
    }

    const SOURCE: &str = "fn f() { let t = Tensor::zeros(2, &Device::Cpu)?.to_device(&dev)?; }\n";

    fn chained_fix() -> Fix {
        let cpu = SOURCE.find("&Device::Cpu").unwrap();
        let copy = SOURCE.find(".to_device(&dev)?").unwrap();
        fix(&[
            (cpu, cpu + "&Device::Cpu".len(), "&dev"),
            (copy, copy + ".to_device(&dev)?".len(), ""),
        ])
    }

    #[test]
    fn applies_every_edit_of_a_fix() {
        let fixed = apply_to_text(SOURCE, &[&chained_fix()]).unwrap();
        assert_eq!(fixed.text, "fn f() { let t = Tensor::zeros(2, &dev)?; }\n");
        assert_eq!((fixed.applied, fixed.skipped), (1, 0));
    }

    #[test]
    fn overlapping_fixes_are_skipped_whole_and_duplicates_applied_once() {
        let first = chained_fix();
        let cpu = SOURCE.find("Device::Cpu").unwrap();
        let conflicting = fix(&[(cpu, cpu + 6, "Gpu"), (0, 2, "pub fn")]);
        let fixed = apply_to_text(SOURCE, &[&conflicting, &first, &first.clone()]).unwrap();
        // `conflicting` starts first, so it is taken and `first` (overlapping it) is skipped.
        assert_eq!(fixed.applied, 1);
        assert_eq!(fixed.skipped, 1);
        assert!(fixed.text.starts_with("pub fn f()"), "{}", fixed.text);
        assert!(fixed.text.contains("&Gpu::Cpu"), "{}", fixed.text);
    }

    #[test]
    fn insertions_at_one_point_conflict_but_adjacent_edits_do_not() {
        let a = Edit {
            start: 3,
            end: 3,
            replacement: "a".into(),
        };
        let b = Edit {
            start: 3,
            end: 3,
            replacement: "b".into(),
        };
        let c = Edit {
            start: 3,
            end: 5,
            replacement: "c".into(),
        };
        let d = Edit {
            start: 0,
            end: 3,
            replacement: "d".into(),
        };
        assert!(overlap(&a, &b));
        assert!(!overlap(&c, &d));
        assert!(!overlap(&a, &c));
        assert!(overlap(
            &Edit {
                start: 4,
                end: 4,
                replacement: String::new()
            },
            &c
        ));
    }

    #[test]
    fn edits_that_do_not_fit_are_reported() {
        assert!(apply_to_text("fn f() {}", &[&fix(&[(5, 50, "")])]).is_err());
        assert!(apply_to_text("é", &[&fix(&[(1, 2, "")])]).is_err());
        assert!(apply_to_text("fn f() {}", &[&fix(&[(5, 2, "")])]).is_err());
    }

    fn diagnostic_with_fix(path: &Path, fix: Fix) -> Diagnostic {
        Diagnostic {
            code: "PK201",
            name: "cpu-tensor-then-copy",
            severity: crate::Severity::Warning,
            path: path.to_path_buf(),
            cell: None,
            region: crate::Region {
                line: 1,
                column: 1,
                end_line: 1,
                end_column: 2,
            },
            message: "tensor built on the CPU, then copied".into(),
            help: "create it on the device".into(),
            notes: Vec::new(),
            fix: Some(fix),
        }
    }

    #[test]
    fn writes_the_fixed_file_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.rs");
        std::fs::write(&path, SOURCE).unwrap();
        let summary = apply_fixes(&[diagnostic_with_fix(&path, chained_fix())]);
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(summary.applied, 1);
        assert_eq!(summary.files_changed, vec![path.clone()]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "fn f() { let t = Tensor::zeros(2, &dev)?; }\n"
        );
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_fix_that_breaks_the_syntax_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.rs");
        std::fs::write(&path, SOURCE).unwrap();
        let breaking = fix(&[(SOURCE.len() - 2, SOURCE.len() - 1, "")]);
        let summary = apply_fixes(&[diagnostic_with_fix(&path, breaking)]);
        assert_eq!(summary.applied, 0);
        assert!(
            matches!(summary.errors.as_slice(), [FixError::WouldNotParse { .. }]),
            "{:?}",
            summary.errors
        );
        assert!(summary.errors[0].to_string().contains("train.rs"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), SOURCE);
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let summary = apply_fixes(&[diagnostic_with_fix(
            Path::new("no/such/file.rs"),
            chained_fix(),
        )]);
        assert_eq!(summary.errors.len(), 1);
        assert!(
            summary.errors[0]
                .to_string()
                .starts_with("no/such/file.rs: cannot apply fixes")
        );
    }

    #[cfg(unix)]
    #[test]
    fn permissions_and_symlinks_survive() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.rs");
        std::fs::write(&real, SOURCE).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("link.rs");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let summary = apply_fixes(&[diagnostic_with_fix(&link, chained_fix())]);
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            std::fs::read_to_string(&real)
                .unwrap()
                .contains("Tensor::zeros(2, &dev)?;")
        );
        assert_eq!(
            std::fs::metadata(&real).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[cfg(unix)]
    #[test]
    fn hard_links_and_the_owner_survive() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.rs");
        std::fs::write(&real, SOURCE).unwrap();
        // Run as root, the file first goes to another user, so that keeping the owner is tested
        // against a user other than the one running the fix.
        // SAFETY: `geteuid` has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&real, Some(1234), Some(5678)).unwrap();
        }
        let before = std::fs::metadata(&real).unwrap();
        let summary = apply_fixes(&[diagnostic_with_fix(&real, chained_fix())]);
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        let after = std::fs::metadata(&real).unwrap();
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert!(
            std::fs::read_to_string(&real)
                .unwrap()
                .contains("Tensor::zeros(2, &dev)?;")
        );

        // A second name of the same file sees the fix: the file is rewritten, not replaced.
        let other = dir.path().join("other.rs");
        std::fs::write(&real, SOURCE).unwrap();
        std::fs::hard_link(&real, &other).unwrap();
        let inode = std::fs::metadata(&real).unwrap().ino();
        let summary = apply_fixes(&[diagnostic_with_fix(&real, chained_fix())]);
        assert!(summary.errors.is_empty(), "{:?}", summary.errors);
        assert_eq!(std::fs::metadata(&real).unwrap().ino(), inode);
        let fixed = std::fs::read_to_string(&other).unwrap();
        assert!(fixed.contains("Tensor::zeros(2, &dev)?;"), "{fixed}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".perfkit-fix"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_file_saved_after_its_fixes_were_computed_is_left_alone() {
        // What the fixes were computed on is read again right before the file is replaced.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.rs");
        let saved = "fn f() {} // saved by the user meanwhile\n";
        std::fs::write(&path, saved).unwrap();
        let error = write_fixed(&path, SOURCE, b"fn fixed() {}\n").unwrap_err();
        assert!(matches!(error, FixError::Changed { .. }), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), saved);
    }

    #[test]
    fn overlap_lookups_agree_with_a_check_of_every_edit_taken() {
        // Random edits (a fixed linear congruential sequence): the indexed lookup finds an overlap
        // exactly when comparing with every edit taken does.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize % bound
        };
        for _ in 0..200 {
            let mut taken: BTreeMap<(usize, usize), &Edit> = BTreeMap::new();
            let edits: Vec<Edit> = (0..60)
                .map(|_| {
                    let start = next(100);
                    let len = if next(3) == 0 { 0 } else { next(6) };
                    Edit {
                        start,
                        end: start + len,
                        replacement: String::new(),
                    }
                })
                .collect();
            for edit in &edits {
                let brute = taken.values().any(|other| overlap(edit, other));
                assert_eq!(
                    overlaps_any(&taken, edit),
                    brute,
                    "{edit:?} against {taken:?}"
                );
                if !brute {
                    taken.insert((edit.start, edit.end), edit);
                }
            }
        }
    }
}
