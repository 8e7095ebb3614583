//! Renderers of a [`LintReport`]: plain functions over [`std::io::Write`], one module per format.
//!
//! - [`text`]: rustc-style diagnostics with the source line and carets, for people.
//! - [`json`]: the stable, versioned schema that CI and tools parse.
//! - [`sarif`]: SARIF 2.1.0 for code-scanning services.
//! - [`github`]: GitHub Actions workflow commands (annotations on the pull request).
//! - [`cargo`]: cargo's JSON messages with rustc diagnostics, for editors and the tools that read
//!   `cargo check --message-format=json`.
//!
//! Paths are shown relative to the current directory with forward slashes, lines and columns 1-based.

use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use crate::LintReport;
use crate::rules::RuleMeta;

pub mod cargo;
pub mod github;
pub mod json;
pub mod sarif;
pub mod text;

/// An output format of `perfkit lint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Format {
    /// rustc-style diagnostics ([`text`]).
    #[default]
    Text,
    /// JSON, schema version 1 ([`json`]).
    Json,
    /// SARIF 2.1.0 ([`sarif`]).
    Sarif,
    /// GitHub Actions workflow commands ([`github`]).
    Github,
    /// cargo's JSON messages with rustc diagnostics ([`cargo`]; `--message-format=json`).
    Cargo,
}

impl Format {
    /// Every format, in the order the command line lists them.
    pub const ALL: [Format; 5] = [
        Format::Text,
        Format::Json,
        Format::Sarif,
        Format::Github,
        Format::Cargo,
    ];

    /// The name used on the command line (`text`, `json`, `sarif`, `github`).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
            Format::Sarif => "sarif",
            Format::Github => "github",
            Format::Cargo => "cargo",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|format| format.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown output format `{s}` (expected text, json, sarif, github or cargo)")
            })
    }
}

/// Options shared by the renderers.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RenderOptions {
    /// Emit ANSI colours (text format only). Default: `false`; the caller decides from the terminal and
    /// `NO_COLOR`.
    pub color: bool,
}

impl RenderOptions {
    /// Sets [`RenderOptions::color`].
    pub fn color(mut self, color: bool) -> Self {
        self.color = color;
        self
    }
}

/// Renders `report` in `format` to `out`. `rules` is the rule catalog (names, summaries and docs), used by
/// the formats that describe rules (text points at `perfkit rule CODE`, SARIF embeds the rule docs).
pub fn render(
    format: Format,
    out: &mut impl Write,
    report: &LintReport,
    rules: &[&RuleMeta],
    options: &RenderOptions,
) -> io::Result<()> {
    match format {
        Format::Text => text::render(out, report, options),
        Format::Json => json::render(out, report),
        Format::Sarif => sarif::render(out, report, rules),
        Format::Github => github::render(out, report),
        Format::Cargo => cargo::render(out, report, rules),
    }
}

/// `path` as shown to the user: relative to the current directory (with `..` steps where it lies
/// outside; absolute only on another drive), `./` and `a/../` removed, with forward slashes.
pub fn display_path(path: &Path) -> String {
    let shown = relative_to_current_dir(path);
    let text = shown.to_string_lossy();
    if std::path::MAIN_SEPARATOR == '/' {
        text.into_owned()
    } else {
        text.replace(std::path::MAIN_SEPARATOR, "/")
    }
}

/// A finding's note as shown to the user: every `PATH:LINE` in it (a source file, `.rs`,
/// `.py` or `.pyi`) with its path shown as [`display_path`] shows the primary location, so a
/// note and the location above it name a file the same way.
pub fn display_note(note: &str) -> String {
    let mut out = String::with_capacity(note.len());
    for (i, word) in note.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&display_location_word(word));
    }
    out
}

/// `word` with the path of a `PATH:LINE[:COLUMN]` in it displayed; any other word unchanged.
fn display_location_word(word: &str) -> std::borrow::Cow<'_, str> {
    let trimmed = word.trim_end_matches([',', '.', ';', ')']);
    // A notebook's place, `nb.ipynb:cell 3:2`: this word is `nb.ipynb:cell`.
    if let Some(path) = trimmed.strip_suffix(":cell")
        && path.ends_with(".ipynb")
    {
        return format!("{}:cell", display_path(Path::new(path))).into();
    }
    let Some((path, line)) = ["rs:", "py:", "pyi:"]
        .iter()
        .filter_map(|ext| trimmed.rfind(ext).map(|at| at + ext.len()))
        .max()
        .map(|colon| (&trimmed[..colon - 1], &trimmed[colon..]))
    else {
        return word.into();
    };
    // Only a line (and a column): anything else is not a location.
    if line.is_empty()
        || !line
            .split(':')
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    {
        return word.into();
    }
    format!(
        "{}:{line}{}",
        display_path(Path::new(path)),
        &word[trimmed.len()..]
    )
    .into()
}

pub(crate) fn relative_to_current_dir(path: &Path) -> PathBuf {
    if path.is_absolute() {
        if let Ok(cwd) = std::env::current_dir()
            && let Some(relative) = relative_path(&normalize(path), &normalize(&cwd))
        {
            return relative;
        }
        return normalize(path);
    }
    let normalized = normalize(path);
    if normalized.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        normalized
    }
}

/// Removes `.` components and folds `name/..` pairs lexically (no file system access, so symlinks are
/// not resolved; a leading `..` stays).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out: Vec<Component<'_>> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(component),
            },
            other => out.push(other),
        }
    }
    out.iter().collect()
}

/// `path` relative to `base` (both absolute and normalized), with `..` steps where `path` is not under
/// `base`. `None` when they have different roots (Windows drives).
fn relative_path(path: &Path, base: &Path) -> Option<PathBuf> {
    let mut path_components = path.components().peekable();
    let mut base_components = base.components().peekable();
    match (path_components.peek(), base_components.peek()) {
        (Some(a), Some(b)) if a != b => return None,
        _ => {}
    }
    while let (Some(a), Some(b)) = (path_components.peek(), base_components.peek()) {
        if a != b {
            break;
        }
        path_components.next();
        base_components.next();
    }
    let mut relative = PathBuf::new();
    for _ in base_components {
        relative.push("..");
    }
    for component in path_components {
        relative.push(component.as_os_str());
    }
    if relative.as_os_str().is_empty() {
        relative.push(".");
    }
    Some(relative)
}

/// Counts of a report's findings by severity, for summaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Findings of severity error.
    pub errors: usize,
    /// Findings of severity warning.
    pub warnings: usize,
    /// Findings of severity note.
    pub notes: usize,
    /// Findings that carry a machine-applicable fix.
    pub fixable: usize,
}

impl Counts {
    /// Counts the findings of `report`.
    pub fn of(report: &LintReport) -> Counts {
        let mut counts = Counts::default();
        for diagnostic in &report.diagnostics {
            match diagnostic.severity {
                crate::Severity::Error => counts.errors += 1,
                crate::Severity::Warning => counts.warnings += 1,
                crate::Severity::Note => counts.notes += 1,
            }
            if diagnostic.fix.is_some() {
                counts.fixable += 1;
            }
        }
        counts
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Hand-built reports for the renderer tests.

    use std::path::PathBuf;

    use crate::{Diagnostic, Edit, FileError, Fix, LintReport, Region, Severity};

    pub(crate) fn diagnostic(
        path: &str,
        line: usize,
        column: usize,
        end_column: usize,
    ) -> Diagnostic {
        Diagnostic {
            code: "PK101",
            name: "host-readback-in-step-loop",
            severity: Severity::Warning,
            path: PathBuf::from(path),
            cell: None,
            region: Region {
                line,
                column,
                end_line: line,
                end_column,
            },
            message: "`to_scalar` reads a value back to the host on every step".to_string(),
            help: "keep the running loss on the device and read it once per epoch".to_string(),
            notes: vec!["the step loop starts at line 3".to_string()],
            fix: None,
        }
    }

    pub(crate) fn report(
        diagnostics: Vec<Diagnostic>,
        errors: Vec<FileError>,
        files_scanned: usize,
    ) -> LintReport {
        LintReport {
            files_scanned,
            diagnostics,
            errors,
        }
    }

    pub(crate) fn fix(start: usize, end: usize, replacement: &str) -> Fix {
        Fix {
            title: "create the tensor on the target device".to_string(),
            edits: vec![Edit {
                start,
                end,
                replacement: replacement.to_string(),
            }],
            linted: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip_through_their_names() {
        for format in Format::ALL {
            assert_eq!(format.as_str().parse::<Format>(), Ok(format));
        }
        assert!("xml".parse::<Format>().unwrap_err().contains("`xml`"));
    }

    #[test]
    fn relative_paths_are_normalized() {
        assert_eq!(
            display_path(Path::new("./src/../src/main.rs")),
            "src/main.rs"
        );
        assert_eq!(
            display_path(Path::new("../other/lib.rs")),
            "../other/lib.rs"
        );
        assert_eq!(display_path(Path::new("./")), ".");
        assert_eq!(
            display_note("called from the step loop at ./src/../src/main.rs:77 through `f`"),
            "called from the step loop at src/main.rs:77 through `f`"
        );
        assert_eq!(
            display_note("inside the step loop at ./a b/train.py:3:5, twice"),
            "inside the step loop at ./a b/train.py:3:5, twice",
            "a path with a space is left as written"
        );
        assert_eq!(display_note("at ./x.rs:12."), "at x.rs:12.");
        assert_eq!(display_note("see ./x.rs:abc"), "see ./x.rs:abc");
    }

    #[test]
    fn absolute_paths_become_relative_to_the_current_dir() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(display_path(&cwd.join("src").join("lib.rs")), "src/lib.rs");
        let parent = cwd.parent().unwrap().join("elsewhere.rs");
        assert_eq!(display_path(&parent), "../elsewhere.rs");
    }

    #[test]
    fn relative_path_walks_up_and_down() {
        assert_eq!(
            relative_path(Path::new("/a/b/c.rs"), Path::new("/a/x/y")),
            Some(PathBuf::from("../../b/c.rs"))
        );
        assert_eq!(
            relative_path(Path::new("/a"), Path::new("/a")),
            Some(PathBuf::from("."))
        );
    }
}
