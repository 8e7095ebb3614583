//! Configuration: `perfkit.toml`, or `[package.metadata.perfkit]` / `[workspace.metadata.perfkit]` in
//! `Cargo.toml` (the package's table wins where one manifest has both, as for the `[profile]`
//! thresholds), found upward from the linted code, or a file given with `--config`.
//!
//! ```toml
//! select = ["PK1", "PK2"]          # codes or prefixes; default: every rule
//! ignore = ["PK502"]
//! step-markers = ["train_step"]    # extra names that make a loop a step loop
//! min-batch-size = 16              # PK502 threshold (default 16)
//! exclude = ["generated/**"]       # globs, relative to the config file's directory
//!
//! [severity]
//! PK101 = "error"                  # note | warning | error | off
//!
//! [profile]                        # runtime thresholds of `perfkit profile`; the linter skips it
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::LintError;
use crate::diagnostic::Severity;

/// Default for `min-batch-size`.
pub const DEFAULT_MIN_BATCH_SIZE: usize = 16;

/// A loaded configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The file it came from (None: defaults).
    pub source: Option<PathBuf>,
    /// Directory that `exclude` globs are relative to.
    pub root: PathBuf,
    /// Codes or prefixes to enable (empty: all rules).
    pub select: Vec<String>,
    /// Codes or prefixes to disable.
    pub ignore: Vec<String>,
    /// Per-code severity overrides; `None` means "off".
    pub severity: BTreeMap<String, Option<Severity>>,
    /// Extra step-marker names (methods or functions).
    pub step_markers: Vec<String>,
    /// PK502's threshold: literal batch sizes below it are reported.
    pub min_batch_size: usize,
    /// Globs of paths not to lint.
    pub exclude: Vec<String>,
    exclude_set: GlobSet,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            source: None,
            root: PathBuf::from("."),
            select: Vec::new(),
            ignore: Vec::new(),
            severity: BTreeMap::new(),
            step_markers: Vec::new(),
            min_batch_size: DEFAULT_MIN_BATCH_SIZE,
            exclude: Vec::new(),
            exclude_set: GlobSet::empty(),
        }
    }
}

impl Config {
    /// Reads a `perfkit.toml` (or any file given with `--config`; a `Cargo.toml` is read through its
    /// `metadata.perfkit` tables).
    pub fn from_file(path: &Path) -> Result<Config, LintError> {
        let io_error = |source| LintError::ConfigIo {
            path: path.to_path_buf(),
            source,
        };
        let text = String::from_utf8(read_config_bytes(path).map_err(io_error)?).map_err(|_| {
            io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            ))
        })?;
        let table: toml::Table =
            text.parse()
                .map_err(|err: toml::de::Error| LintError::Config {
                    path: path.to_path_buf(),
                    message: err.to_string(),
                })?;
        let is_cargo = path.file_name().is_some_and(|n| n == "Cargo.toml");
        let is_pyproject = path.file_name().is_some_and(|n| n == "pyproject.toml");
        let table = if is_cargo {
            match cargo_metadata_table(&table) {
                Some(t) => t.clone(),
                None => toml::Table::new(),
            }
        } else if is_pyproject {
            match pyproject_table(&table) {
                Some(t) => t.clone(),
                None => toml::Table::new(),
            }
        } else {
            table
        };
        Config::from_table(&table, path)
    }

    /// Builds a configuration from the keys of a table; `path` names the file in errors.
    pub fn from_table(table: &toml::Table, path: &Path) -> Result<Config, LintError> {
        let err = |message: String| LintError::Config {
            path: path.to_path_buf(),
            message,
        };
        let mut config = Config {
            source: Some(path.to_path_buf()),
            root: path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
            ..Config::default()
        };
        for (key, value) in table {
            match key.as_str() {
                "select" => config.select = string_list(value, key).map_err(err)?,
                "ignore" => config.ignore = string_list(value, key).map_err(err)?,
                "step-markers" | "step_markers" => {
                    config.step_markers = string_list(value, key).map_err(err)?;
                }
                "exclude" => config.exclude = string_list(value, key).map_err(err)?,
                "min-batch-size" | "min_batch_size" => {
                    let Some(n) = value.as_integer().filter(|n| *n >= 1) else {
                        return Err(err(format!("`{key}` must be a positive integer")));
                    };
                    config.min_batch_size = usize::try_from(n).unwrap_or(usize::MAX);
                }
                "severity" => {
                    let Some(map) = value.as_table() else {
                        return Err(err(
                            "`severity` must be a table of code = \"note|warning|error|off\""
                                .into(),
                        ));
                    };
                    for (code, level) in map {
                        check_code(code).map_err(|m| err(format!("in `severity`: {m}")))?;
                        let level = match level.as_str() {
                            Some("note") => Some(Severity::Note),
                            Some("warning") => Some(Severity::Warning),
                            Some("error") => Some(Severity::Error),
                            Some("off") => None,
                            _ => {
                                return Err(err(format!(
                                    "severity of `{code}` must be \"note\", \"warning\", \"error\" or \"off\""
                                )));
                            }
                        };
                        config.severity.insert(code.to_ascii_uppercase(), level);
                    }
                }
                // Runtime thresholds of `perfkit profile`/`perfkit check`: read by the reports,
                // not by the linter.
                "profile" => {
                    if !value.is_table() {
                        return Err(err(
                            "`profile` must be a table (`[profile]`, the runtime thresholds)"
                                .into(),
                        ));
                    }
                }
                // The regression gate's settings of `perfkit check`: read by the reports.
                "check" => {
                    if !value.is_table() {
                        return Err(err(
                            "`check` must be a table (`[check]`, the regression gate's settings)"
                                .into(),
                        ));
                    }
                }
                other => {
                    return Err(err(format!(
                        "unknown key `{other}` (expected select, ignore, severity, step-markers, \
                         min-batch-size, exclude, or a [profile] or [check] table)"
                    )));
                }
            }
        }
        for code in config.select.iter().chain(&config.ignore) {
            check_code(code).map_err(err)?;
        }
        config.exclude_set = build_globs(&config.exclude).map_err(err)?;
        Ok(config)
    }

    /// Whether any `exclude` pattern is configured (else [`Config::is_excluded`] is always false).
    pub fn excludes_any(&self) -> bool {
        !self.exclude.is_empty()
    }

    /// Whether a path (as walked) is excluded by the `exclude` globs.
    pub fn is_excluded(&self, path: &Path) -> bool {
        if self.exclude.is_empty() {
            return false;
        }
        if self.exclude_set.is_match(path) {
            return true;
        }
        let relative = path.strip_prefix(&self.root).unwrap_or(path);
        let relative = relative.strip_prefix(".").unwrap_or(relative);
        self.exclude_set.is_match(relative)
    }

    /// Whether the rule `code` runs, given this configuration plus the command line's lists.
    pub fn is_enabled(&self, code: &str, extra_select: &[String], extra_ignore: &[String]) -> bool {
        if let Some(None) = self.severity_override(code) {
            return false;
        }
        let matches = |list: &[String]| {
            list.iter().any(|p| {
                let p = p.to_ascii_uppercase();
                p == "ALL" || code.starts_with(&p)
            })
        };
        let selected = if self.select.is_empty() && extra_select.is_empty() {
            true
        } else {
            matches(&self.select) || matches(extra_select)
        };
        // A rule selected by its full code on the command line beats a prefix ignore in the file.
        let explicitly = extra_select.iter().any(|p| p.eq_ignore_ascii_case(code));
        selected && !matches(extra_ignore) && (explicitly || !matches(&self.ignore))
    }

    /// The severity of `code` after overrides.
    pub fn severity_of(&self, code: &str, default: Severity) -> Severity {
        match self.severity_override(code) {
            Some(Some(level)) => level,
            _ => default,
        }
    }

    /// The `[severity]` entry for `code`: its own, else that of the longest prefix naming it
    /// (`PK2 = "error"` for PK201), else `ALL`'s. `Some(None)`: turned off.
    fn severity_override(&self, code: &str) -> Option<Option<Severity>> {
        self.severity
            .iter()
            .filter(|(key, _)| key.as_str() == "ALL" || code.starts_with(key.as_str()))
            .max_by_key(|(key, _)| if key.as_str() == "ALL" { 0 } else { key.len() })
            .map(|(_, level)| *level)
    }
}

/// Codes of the rules that only `perfkit profile` measures: no lint check has them (a test of
/// the binary keeps this list equal to the runtime catalog's).
pub const RUNTIME_ONLY_CODES: &[&str] = &["PK601", "PK602", "PK603", "PK604"];

/// Checks that `code` is a rule code or a prefix of one (`PK1`, `PK101`, `ALL`).
pub(crate) fn check_code(code: &str) -> Result<(), String> {
    if code.trim().is_empty() {
        return Err("an empty rule code (it would name every rule; write `ALL` for that)".into());
    }
    let upper = code.to_ascii_uppercase();
    if upper == "ALL"
        || crate::rules()
            .iter()
            .any(|r| r.meta().code.starts_with(&upper))
    {
        Ok(())
    } else {
        Err(unknown_code_message(code))
    }
}

/// Why `code` names no lint rule: a code of a rule `perfkit profile` measures, or no code at all.
pub(crate) fn unknown_code_message(code: &str) -> String {
    let upper = code.to_ascii_uppercase();
    if RUNTIME_ONLY_CODES.iter().any(|c| c.starts_with(&upper)) {
        format!("`{code}` is measured by `perfkit profile` only; the linter has no check for it")
    } else {
        format!("unknown rule code or prefix `{code}`")
    }
}

fn string_list(value: &toml::Value, key: &str) -> Result<Vec<String>, String> {
    let Some(items) = value.as_array() else {
        return Err(format!("`{key}` must be a list of strings"));
    };
    items
        .iter()
        .map(|item| {
            item.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("`{key}` must be a list of strings"))
        })
        .collect()
}

fn build_globs(patterns: &[String]) -> Result<GlobSet, String> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let glob =
            Glob::new(pattern).map_err(|e| format!("bad `exclude` glob `{pattern}`: {e}"))?;
        builder.add(glob);
        // `dir` or `dir/` also excludes what is under it.
        let trimmed = pattern.trim_end_matches('/');
        if !trimmed.contains('*')
            && let Ok(glob) = Glob::new(&format!("{trimmed}/**"))
        {
            builder.add(glob);
        }
    }
    builder
        .build()
        .map_err(|e| format!("bad `exclude` globs: {e}"))
}

/// The `metadata.perfkit` table of a Cargo.toml: the package's, else the workspace's.
fn cargo_metadata_table(table: &toml::Table) -> Option<&toml::Table> {
    ["package", "workspace"].iter().find_map(|section| {
        table
            .get(*section)?
            .get("metadata")?
            .get("perfkit")?
            .as_table()
    })
}

/// The `[tool.perfkit]` table of a `pyproject.toml`.
fn pyproject_table(table: &toml::Table) -> Option<&toml::Table> {
    table.get("tool")?.get("perfkit")?.as_table()
}

/// Finds the configuration for code in `dir`: the nearest `perfkit.toml`, `Cargo.toml` with a
/// `metadata.perfkit` table, or `pyproject.toml` with a `[tool.perfkit]` table, in `dir` or above
/// (the closest directory wins, as ruff does; in one directory `perfkit.toml` comes first). Returns
/// the file to read.
#[cfg(test)]
pub(crate) fn discover(dir: &Path) -> Option<PathBuf> {
    discover_cached(dir, &mut std::collections::HashMap::new())
}

/// [`discover`], remembering the answer for every directory it looked at (a run over many
/// directories of one tree asks about the same ancestors again and again).
pub(crate) fn discover_cached(
    dir: &Path,
    cache: &mut std::collections::HashMap<PathBuf, Option<PathBuf>>,
) -> Option<PathBuf> {
    let absolute = crate::walk::absolute_path(dir);
    let mut visited = Vec::new();
    let mut found = None;
    for ancestor in absolute.ancestors() {
        if let Some(known) = cache.get(ancestor) {
            found = known.clone();
            break;
        }
        visited.push(ancestor.to_path_buf());
        if let Some(config) = config_in(ancestor) {
            found = Some(config);
            break;
        }
    }
    for dir in visited {
        cache.insert(dir, found.clone());
    }
    found
}

/// The configuration file of one directory, if it has one.
fn config_in(ancestor: &Path) -> Option<PathBuf> {
    let candidate = ancestor.join("perfkit.toml");
    if candidate.is_file() {
        return Some(candidate);
    }
    let cargo = ancestor.join("Cargo.toml");
    if holds_config(&cargo, cargo_metadata_table) {
        return Some(cargo);
    }
    let pyproject = ancestor.join("pyproject.toml");
    if holds_config(&pyproject, pyproject_table) {
        return Some(pyproject);
    }
    None
}

/// The most bytes of a configuration file read (`perfkit.toml`, `Cargo.toml`, `pyproject.toml`):
/// real ones are a few KiB; a larger one (or `/dev/zero` given as `--config`) is an error, not a
/// run that reads until memory runs out.
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// A configuration file's bytes, at most [`MAX_CONFIG_BYTES`] (more is an error of kind
/// `FileTooLarge`). Read through to its end, so a pipe (`--config <(..)`) works too.
fn read_config_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "file too large (configuration files over {} MiB are not read)",
                MAX_CONFIG_BYTES / (1024 * 1024)
            ),
        ));
    }
    Ok(bytes)
}

/// Whether a `Cargo.toml` or `pyproject.toml` holds perfkit's table (`table_of` finds it). One
/// that mentions perfkit but is not valid TOML counts as holding it, so that reading it reports
/// the error (file and line) rather than the configuration being passed over without a word.
fn holds_config(path: &Path, table_of: fn(&toml::Table) -> Option<&toml::Table>) -> bool {
    if !path.is_file() {
        return false;
    }
    let bytes = match read_config_bytes(path) {
        Ok(bytes) => bytes,
        // Too large to read: taken, so that reading it reports the size instead of its settings
        // being passed over.
        Err(err) if err.kind() == std::io::ErrorKind::FileTooLarge => return true,
        Err(_) => return false,
    };
    if memchr::memmem::find(&bytes, b"perfkit").is_none() {
        return false;
    }
    // A file that names perfkit but is not UTF-8 is taken, so that reading it reports the error
    // instead of its settings being silently replaced by the defaults.
    let Ok(text) = String::from_utf8(bytes) else {
        return true;
    };
    match text.parse::<toml::Table>() {
        Ok(table) => table_of(&table).is_some(),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<Config, LintError> {
        Config::from_table(&text.parse().expect("toml"), Path::new("perfkit.toml"))
    }

    #[test]
    fn a_pyproject_that_names_perfkit_but_is_not_utf8_is_taken_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyproject.toml");
        std::fs::write(&path, b"[tool.perfkit]\nselect = [\"PK1\"] # caf\xe9\n").unwrap();
        assert!(holds_config(&path, pyproject_table));
        let error = Config::from_file(&path).unwrap_err().to_string();
        assert!(error.contains("pyproject.toml"), "{error}");
        // One that does not name perfkit is not a configuration of perfkit's.
        std::fs::write(&path, b"[tool.black]\n# caf\xe9\n").unwrap();
        assert!(!holds_config(&path, pyproject_table));
    }

    #[test]
    fn a_configuration_file_too_large_to_read_is_an_error_not_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyproject.toml");
        let limit = usize::try_from(MAX_CONFIG_BYTES).unwrap();
        // At the limit it is read (and a comment is all it holds).
        let mut text = vec![b'#'; limit - 1];
        text.push(b'\n');
        std::fs::write(&path, &text).unwrap();
        assert!(!holds_config(&path, pyproject_table));
        assert!(Config::from_file(&path).is_ok());
        // One byte more: taken when discovered, and reading it names the file and the limit.
        text.push(b'\n');
        std::fs::write(&path, &text).unwrap();
        assert!(holds_config(&path, pyproject_table));
        let error = Config::from_file(&path).unwrap_err().to_string();
        assert!(error.contains("pyproject.toml"), "{error}");
        assert!(error.contains("file too large"), "{error}");
    }

    #[test]
    fn severity_prefixes_apply_the_most_specific_entry() {
        let c = config(
            "[severity]\nPK2 = \"error\"\nPK20 = \"note\"\nPK202 = \"off\"\nALL = \"warning\"\n",
        )
        .unwrap();
        assert_eq!(c.severity_of("PK201", Severity::Warning), Severity::Note);
        assert_eq!(c.severity_of("PK203", Severity::Warning), Severity::Note);
        assert!(!c.is_enabled("PK202", &[], &[]));
        assert_eq!(c.severity_of("PK301", Severity::Note), Severity::Warning);
        let c = config("[severity]\nPK2 = \"error\"\n").unwrap();
        assert_eq!(c.severity_of("PK201", Severity::Warning), Severity::Error);
        assert_eq!(c.severity_of("PK101", Severity::Warning), Severity::Warning);
        // An empty code would name every rule.
        assert!(config("select = [\"\"]\n").is_err());
        assert!(config("[severity]\n\"\" = \"off\"\n").is_err());
    }

    #[test]
    fn select_ignore_and_severity() {
        let c = config("select = [\"PK1\"]\nignore = [\"PK102\"]\n[severity]\nPK101 = \"error\"\nPK202 = \"off\"\n")
            .expect("valid");
        assert!(c.is_enabled("PK101", &[], &[]));
        assert!(!c.is_enabled("PK102", &[], &[]));
        assert!(!c.is_enabled("PK202", &[], &[]));
        // The command line adds to the selection and can re-enable a code by its full name.
        assert!(c.is_enabled("PK102", &["PK102".into()], &[]));
        assert!(c.is_enabled("PK301", &["PK3".into()], &[]));
        assert!(!c.is_enabled("PK101", &[], &["PK1".into()]));
        assert_eq!(c.severity_of("PK101", Severity::Warning), Severity::Error);
        assert_eq!(c.min_batch_size, DEFAULT_MIN_BATCH_SIZE);
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let text = config("min-batch-size = 0\n")
            .expect_err("zero")
            .to_string();
        assert!(
            text.contains("min-batch-size") && text.contains("perfkit.toml"),
            "{text}"
        );
        let text = config("select = [\"PK9\"]\n")
            .expect_err("code")
            .to_string();
        assert!(text.contains("unknown rule code or prefix `PK9`"), "{text}");
        let text = config("ignore = [\"PK601\"]\n")
            .expect_err("runtime code")
            .to_string();
        assert!(
            text.contains("`PK601` is measured by `perfkit profile` only"),
            "{text}"
        );
        let text = config("[severity]\nPK101 = \"loud\"\n")
            .expect_err("level")
            .to_string();
        assert!(text.contains("PK101"), "{text}");
        let text = config("exclude = [\"a[\"]\n")
            .expect_err("glob")
            .to_string();
        assert!(text.contains("a["), "{text}");
    }

    #[test]
    fn profile_table_is_left_to_the_runtime_rules() {
        let c = config("ignore = [\"PK502\"]\n[profile]\ngap-ns = 100000\n")
            .expect("a [profile] table is not a linter error");
        assert!(!c.is_enabled("PK502", &[], &[]));
        assert!(c.is_enabled("PK101", &[], &[]));
        let text = config("profile = 3\n")
            .expect_err("not a table")
            .to_string();
        assert!(text.contains("`profile`"), "{text}");
        // The Cargo.toml form: `[package.metadata.perfkit.profile]` next to the linter's keys.
        let dir = tempfile::tempdir().expect("tempdir");
        let cargo = dir.path().join("Cargo.toml");
        std::fs::write(
            &cargo,
            "[package]\nname = \"x\"\nversion = \"0.1.0\"\n\n\
             [package.metadata.perfkit]\nmin-batch-size = 8\n\n\
             [package.metadata.perfkit.profile]\ngap-ns = 100000\n",
        )
        .expect("write Cargo.toml");
        assert_eq!(discover(dir.path()).as_deref(), Some(cargo.as_path()));
        let c = Config::from_file(&cargo).expect("profile table in Cargo.toml metadata");
        assert_eq!(c.min_batch_size, 8);
        // Only a profile table: still a valid (default) linter configuration.
        std::fs::write(
            &cargo,
            "[workspace.metadata.perfkit.profile]\ngap-ns = 100000\n",
        )
        .expect("write Cargo.toml");
        let c = Config::from_file(&cargo).expect("only a profile table");
        assert_eq!(c.min_batch_size, DEFAULT_MIN_BATCH_SIZE);
        // A root package that is also the workspace: its own table wins, as the `[profile]`
        // thresholds read it.
        std::fs::write(
            &cargo,
            "[package]\nname = \"x\"\n\n[package.metadata.perfkit]\nmin-batch-size = 8\n\n\
             [workspace]\n\n[workspace.metadata.perfkit]\nmin-batch-size = 32\n",
        )
        .expect("write Cargo.toml");
        let c = Config::from_file(&cargo).expect("both tables");
        assert_eq!(c.min_batch_size, 8);
    }

    #[test]
    fn pyproject_tool_perfkit_is_found_upward_and_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pyproject = dir.path().join("pyproject.toml");
        std::fs::write(
            &pyproject,
            "[project]\nname = \"x\"\n\n[tool.ruff]\nline-length = 100\n\n\
             [tool.perfkit]\nignore = [\"PK502\"]\nmin-batch-size = 8\n",
        )
        .expect("write pyproject.toml");
        let sub = dir.path().join("src/pkg");
        std::fs::create_dir_all(&sub).expect("mkdir");
        assert_eq!(discover(&sub).as_deref(), Some(pyproject.as_path()));
        let c = Config::from_file(&pyproject).expect("valid");
        assert_eq!(c.min_batch_size, 8);
        assert!(!c.is_enabled("PK502", &[], &[]));
        // A pyproject.toml without a [tool.perfkit] table is not a configuration.
        std::fs::write(&pyproject, "[tool.ruff]\nline-length = 100\n# perfkit\n").expect("write");
        assert_eq!(discover(&sub), None);
        // An error names the file.
        std::fs::write(&pyproject, "[tool.perfkit]\nbogus = 1\n").expect("write");
        let text = Config::from_file(&pyproject)
            .expect_err("unknown key")
            .to_string();
        assert!(
            text.contains("pyproject.toml") && text.contains("bogus"),
            "{text}"
        );
    }

    #[test]
    fn exclude_globs_are_relative_to_the_config_directory() {
        let mut c = config("exclude = [\"gen\", \"**/*_pb.rs\"]\n").expect("valid");
        c.root = PathBuf::from("/repo");
        assert!(c.is_excluded(Path::new("/repo/gen/a.rs")));
        assert!(c.is_excluded(Path::new("/repo/src/x_pb.rs")));
        assert!(!c.is_excluded(Path::new("/repo/src/gen.rs")));
    }
}
