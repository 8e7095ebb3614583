//! What a lint run produces: findings with their location, severity and fix, and per-file errors.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How serious a finding is. Ordered from least to most serious, so `severity >= Severity::Warning`
/// selects what fails a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Note,
    Warning,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A source region. Lines and columns are 1-based; columns count characters, and the end is exclusive
/// (the column just after the last character), as SARIF and GitHub annotations expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Region {
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
}

/// One text replacement of a fix, in byte offsets of the file's source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edit {
    pub start: usize,
    pub end: usize,
    pub replacement: String,
}

/// A machine-applicable fix: non-overlapping edits of the finding's file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fix {
    /// What the fix does, e.g. "create the tensor on the target device".
    pub title: String,
    pub edits: Vec<Edit>,
    /// A fingerprint of the file's text the edits were computed on (see [`source_fingerprint`]):
    /// a file that changed since it was linted is left alone rather than edited at offsets that
    /// no longer mean the same place. `None` when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linted: Option<u64>,
}

/// The fingerprint of a file's text that [`Fix::linted`] holds.
pub fn source_fingerprint(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// One finding of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Rule code, e.g. `PK101`.
    pub code: &'static str,
    /// Rule name, e.g. `host-readback-in-step-loop`.
    pub name: &'static str,
    pub severity: Severity,
    /// Path as given on the command line (joined with what the walk found).
    pub path: PathBuf,
    /// In a notebook (`.ipynb`): the cell (1-based, in the notebook's `cells` list); `region` is
    /// then the place within that cell's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<usize>,
    pub region: Region,
    /// What is wrong: lowercase, no final period.
    pub message: String,
    /// What to do instead.
    pub help: String,
    /// Extra context, e.g. "called from the step loop at src/train.rs:42".
    pub notes: Vec<String>,
    pub fix: Option<Fix>,
}

/// A file that could not be linted (I/O error, invalid UTF-8, syntax error, too deep, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileError {
    pub path: PathBuf,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// The line (1-based) of byte `at` of `text`: the file errors found before or instead of parsing
/// (a pre-scan, a TOML error) are placed by counting newlines.
pub(crate) fn line_at_offset(text: &[u8], at: usize) -> usize {
    memchr::memchr_iter(b'\n', &text[..at.min(text.len())]).count() + 1
}
