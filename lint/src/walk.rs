//! Finding the files to lint: `.rs`, `.py` and `.ipynb` files under the given paths, honouring `.gitignore` and skipping
//! Cargo's `target/` build directories; grouping them into crates (the nearest `Cargo.toml` above each file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::diagnostic::FileError;

/// What the walk found.
pub(crate) struct Walked {
    /// Files to lint, with the input path index they were found under.
    pub files: Vec<PathBuf>,
    /// Paths that could not be walked (missing path, symlink loop, permission).
    pub errors: Vec<FileError>,
}

/// Walks `paths`. A file given explicitly is linted whatever its extension.
pub(crate) fn walk(paths: &[PathBuf]) -> Walked {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    // Whether the walk went through a symbolic link to a directory: then one file may be listed
    // under two paths (`alias -> pkg` beside `pkg`), and must be linted (and fixed) once.
    let mut through_dir_link = false;
    // Files listed under the name of a symbolic link to a file: linted once, under the name of
    // the file they point to, when that file is linted too.
    let mut file_links: Vec<PathBuf> = Vec::new();
    for root in paths {
        let meta = match std::fs::metadata(root) {
            Ok(meta) => meta,
            Err(err) => {
                errors.push(FileError {
                    path: root.clone(),
                    message: path_message(root, &err),
                    line: None,
                });
                continue;
            }
        };
        if meta.is_file() {
            if std::fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink()) {
                file_links.push(root.clone());
            }
            files.push(root.clone());
            continue;
        }
        if !meta.is_dir() {
            // A device, a FIFO, a socket: named, never read (a FIFO would block) nor passed over.
            errors.push(FileError {
                path: root.clone(),
                message: "not a regular file or a directory, not linted".to_string(),
                line: None,
            });
            continue;
        }
        let walker = ignore::WalkBuilder::new(root)
            .follow_links(true)
            .require_git(false)
            .filter_entry(|entry| {
                // Cargo's `target/` holds build output, never sources to lint; a module or a
                // Python package that is named `target` is linted like any other directory.
                !(entry.file_type().is_some_and(|t| t.is_dir())
                    && entry.file_name() == "target"
                    && is_build_dir(entry.path()))
            })
            .build();
        for entry in walker {
            match entry {
                Ok(entry) => {
                    through_dir_link |=
                        entry.path_is_symlink() && entry.file_type().is_some_and(|t| t.is_dir());
                    let is_file = entry.file_type().is_some_and(|t| t.is_file());
                    if is_file
                        && entry
                            .path()
                            .extension()
                            .is_some_and(|e| e == "rs" || e == "py" || e == "ipynb")
                    {
                        if entry.path_is_symlink() {
                            file_links.push(entry.path().to_path_buf());
                        }
                        files.push(entry.into_path());
                    }
                }
                Err(err) => errors.push(walk_error(root, &err)),
            }
        }
    }
    sort_paths(&mut files);
    files.dedup();
    if paths.len() > 1 || through_dir_link {
        dedup_spellings(&mut files);
    }
    if !file_links.is_empty() {
        drop_links_to_linted_files(&mut files, &file_links);
    }
    if paths.len() > 1 {
        dedup_errors(&mut errors);
    }
    Walked { files, errors }
}

/// Whether a directory named `target` is Cargo's build directory: beside a `Cargo.toml`, or
/// marked as Cargo marks it (`CACHEDIR.TAG`, `.rustc_info.json`).
fn is_build_dir(dir: &Path) -> bool {
    dir.parent()
        .is_some_and(|parent| parent.join("Cargo.toml").is_file())
        || dir.join("CACHEDIR.TAG").is_file()
        || dir.join(".rustc_info.json").is_file()
}

/// Where a path really is, for telling the same file given several ways apart (`x.rs`,
/// `./src/../x.rs`, `/abs/x.rs`): its directory resolved, its own name kept (a symlink to a file
/// is a file of its own, as the walk lists it).
fn identity(path: &Path, dirs: &mut HashMap<PathBuf, Option<PathBuf>>) -> PathBuf {
    let resolved = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            // Files of one directory share its resolution (one `realpath` per directory).
            let dir = match dirs.get(parent) {
                Some(dir) => dir.clone(),
                None => {
                    let dir = parent.canonicalize().ok();
                    dirs.insert(parent.to_path_buf(), dir.clone());
                    dir
                }
            };
            dir.map(|dir| dir.join(name))
        }
        _ => None,
    };
    resolved.unwrap_or_else(|| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// Keeps one spelling of each file given several ways (by several paths on the command line, as
/// a file and its directory, or through a symbolic link to a directory): the one not through a
/// link, then the shortest, at the place of the first.
fn dedup_spellings(files: &mut Vec<PathBuf>) {
    let mut first: HashMap<PathBuf, usize> = HashMap::with_capacity(files.len());
    let mut dirs = HashMap::new();
    let mut keep = vec![true; files.len()];
    for i in 0..files.len() {
        match first.entry(identity(&files[i], &mut dirs)) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(i);
            }
            std::collections::hash_map::Entry::Occupied(slot) => {
                let kept = *slot.get();
                let rank = |path: &Path| (through_link(path, &dirs), path.as_os_str().len());
                if rank(&files[i]) < rank(&files[kept]) {
                    files.swap(i, kept);
                }
                keep[i] = false;
            }
        }
    }
    if keep.iter().all(|&k| k) {
        return;
    }
    let mut flags = keep.into_iter();
    files.retain(|_| flags.next().unwrap_or(true));
    // A shorter spelling may sort elsewhere.
    sort_paths(files);
}

/// Drops the names of symbolic links to files that are linted under their own name too (`link.py
/// -> model.py` beside `model.py`): the same text would be linted, reported and fixed twice. A
/// link to a file that is not linted otherwise stays, under its own name.
fn drop_links_to_linted_files(files: &mut Vec<PathBuf>, links: &[PathBuf]) {
    let links: std::collections::HashSet<&Path> = links.iter().map(PathBuf::as_path).collect();
    let mut dirs = HashMap::new();
    let real: std::collections::HashSet<PathBuf> = files
        .iter()
        .filter(|f| !links.contains(f.as_path()))
        .map(|f| identity(f, &mut dirs))
        .collect();
    files.retain(|f| {
        !links.contains(f.as_path()) || !f.canonicalize().is_ok_and(|target| real.contains(&target))
    });
}

/// Whether a walked path reaches its directory through a symbolic link: the directory as
/// written differs from where it resolved to (known from [`identity`]'s cache).
fn through_link(path: &Path, dirs: &HashMap<PathBuf, Option<PathBuf>>) -> bool {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match dirs.get(parent) {
        Some(Some(resolved)) => absolute_path(parent) != *resolved,
        _ => false,
    }
}

/// One error per path that could not be walked, however many times it was given.
fn dedup_errors(errors: &mut Vec<FileError>) {
    let mut seen = std::collections::HashSet::new();
    let mut dirs = HashMap::new();
    errors.retain(|e| seen.insert((identity(&e.path, &mut dirs), e.message.clone())));
}

/// Sorts paths in `Path` order (component by component). Comparing components parses both paths
/// at each comparison; for plain paths (one `/` between names, no `.` or `..` anywhere, no `/` at
/// the end) the same order is the byte order with `/` ranked below every other byte, so each path
/// is turned into such a key once and the keys are compared with `memcmp`.
fn sort_paths(files: &mut [PathBuf]) {
    // Read from the bytes: `Path::components` passes over a `.` inside a path (`a/./b` is `a`,
    // `b`), which the byte key would not.
    let plain = |path: &PathBuf| {
        let bytes = path.as_os_str().as_encoded_bytes();
        let names = bytes.strip_prefix(b"/").unwrap_or(bytes);
        !names.is_empty()
            && names
                .split(|&b| b == b'/')
                .all(|name| !matches!(name, b"" | b"." | b".."))
    };
    if !cfg!(unix) || !files.iter().all(plain) {
        files.sort();
        return;
    }
    // No path holds a NUL byte: it ranks below every byte of a name, as `/` must.
    files.sort_by_cached_key(|path| {
        let mut key = path.as_os_str().as_encoded_bytes().to_vec();
        for byte in &mut key {
            if *byte == b'/' {
                *byte = 0;
            }
        }
        key
    });
}

fn walk_error(root: &Path, err: &ignore::Error) -> FileError {
    let path = error_path(err).unwrap_or_else(|| root.to_path_buf());
    let message = match loop_ancestor(err) {
        Some(ancestor) => format!(
            "symbolic link loop (points back to {}), not followed",
            ancestor.display()
        ),
        None => match io_error(err) {
            Some(io) => path_message(&path, io),
            None => err.to_string(),
        },
    };
    FileError {
        path,
        message,
        line: None,
    }
}

/// The I/O error inside a walk error, if it is one.
fn io_error(err: &ignore::Error) -> Option<&std::io::Error> {
    match err {
        ignore::Error::Io(io) => Some(io),
        ignore::Error::WithPath { err, .. }
        | ignore::Error::WithDepth { err, .. }
        | ignore::Error::WithLineNumber { err, .. } => io_error(err),
        _ => None,
    }
}

/// The message for an I/O error on `path`: a link whose target is missing is named as one.
pub(crate) fn path_message(path: &Path, err: &std::io::Error) -> String {
    if err.kind() == std::io::ErrorKind::NotFound
        && let Ok(target) = std::fs::read_link(path)
    {
        return format!("broken symbolic link ({} does not exist)", target.display());
    }
    io_message(err)
}

fn error_path(err: &ignore::Error) -> Option<PathBuf> {
    match err {
        ignore::Error::WithPath { path, .. } => Some(path.clone()),
        ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => {
            error_path(err)
        }
        ignore::Error::Loop { child, .. } => Some(child.clone()),
        _ => None,
    }
}

fn loop_ancestor(err: &ignore::Error) -> Option<PathBuf> {
    match err {
        ignore::Error::Loop { ancestor, .. } => Some(ancestor.clone()),
        ignore::Error::WithPath { err, .. }
        | ignore::Error::WithDepth { err, .. }
        | ignore::Error::WithLineNumber { err, .. } => loop_ancestor(err),
        _ => None,
    }
}

/// A short, stable message for an I/O error.
pub(crate) fn io_message(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => err.to_string(),
    }
}

/// `path` made absolute so that its ancestors are the directories above it. `std::path::absolute`
/// keeps `..` steps, so the ancestors of `here/../other/x.py` would pass through `here`, which is
/// not above `other`: a path with a `..` step has its directory resolved on disk (a `..` after a
/// symbolic link steps up from where the link leads, as the kernel takes it). A path without one
/// costs no system call.
pub(crate) fn absolute_path(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if !absolute
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return absolute;
    }
    match (absolute.parent(), absolute.file_name()) {
        (Some(dir), Some(name)) => match std::fs::canonicalize(dir) {
            Ok(dir) => dir.join(name),
            Err(_) => absolute,
        },
        _ => std::fs::canonicalize(&absolute).unwrap_or(absolute),
    }
}

/// Maps files to their crate root: the directory of the nearest `Cargo.toml` above them, or the file
/// itself when there is none. Directory lookups are cached.
pub(crate) struct CrateFinder {
    cache: HashMap<PathBuf, Option<PathBuf>>,
}

impl CrateFinder {
    pub(crate) fn new() -> CrateFinder {
        CrateFinder {
            cache: HashMap::new(),
        }
    }

    /// The crate root of `file` (its package directory, or the file itself).
    pub(crate) fn crate_of(&mut self, file: &Path) -> PathBuf {
        let absolute = absolute_path(file);
        let dir = absolute.parent().map(Path::to_path_buf).unwrap_or_default();
        match self.package_dir(&dir) {
            Some(package) => package,
            None => absolute,
        }
    }

    fn package_dir(&mut self, dir: &Path) -> Option<PathBuf> {
        if let Some(found) = self.cache.get(dir) {
            return found.clone();
        }
        let found = if dir.join("Cargo.toml").is_file() {
            Some(dir.to_path_buf())
        } else {
            match dir.parent() {
                Some(parent) if parent != dir => self.package_dir(parent),
                _ => None,
            }
        };
        self.cache.insert(dir.to_path_buf(), found.clone());
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_sort_in_path_order() {
        let names = [
            "a",
            "a-b",
            "a.b",
            "a/b",
            "a/b-c",
            "a/b/c",
            "a/bc",
            "a b/c",
            "ab",
            "a0/z",
            "b",
            "é/x",
            "A/b",
            "a/b.py",
            "a/b_c.py",
            "a/b/__init__.py",
            "z",
            "-x",
            "src/a/x.py",
            "src/a-b/x.py",
        ];
        for prefix in ["", "/srv/code/", "rel/dir/"] {
            let mut files: Vec<PathBuf> = names
                .iter()
                .rev()
                .map(|n| PathBuf::from(format!("{prefix}{n}")))
                .collect();
            let mut want = files.clone();
            want.sort();
            sort_paths(&mut files);
            assert_eq!(files, want, "prefix {prefix:?}");
        }
        // Not plain (`.`, `..`, a doubled or final `/`): component order still.
        for odd in ["./a", "a/../b", "a//b", "a/", "a/./b", "a/b/.", "/"] {
            let mut files: Vec<PathBuf> = ["-x", "b", odd, "a/c", "a/0"]
                .iter()
                .map(PathBuf::from)
                .collect();
            let mut want = files.clone();
            want.sort();
            sort_paths(&mut files);
            assert_eq!(files, want, "{odd}");
        }
    }
}
