//! Thresholds of the runtime rules: the `[profile]` table of `perfkit.toml`.
//!
//! ```toml
//! [profile]
//! min-step-fraction = 0.5        # a source line counts as "per step" when it fires in half the steps
//! small-copy-bytes = 65536       # PK101: a device-to-host copy at or below this size is "small"
//! tiny-copy-bytes = 65536        # PK203: a host-to-device copy at or below this size is "tiny"
//! tiny-copies-per-step = 16      # PK203: this many tiny uploads from one line per step is "many"
//! loader-spans = ["data", "load_batch", "dataloader", "next_batch"]
//! loader-idle-share = 0.05       # PK301: GPU idle inside data loading, share of step time
//! idle-share = 0.2               # PK601: GPU idle share of step time
//! gap-ns = 100000                # PK601: a GPU gap at least this long is counted (100 µs)
//! utilization = 0.5              # PK603: a step below this GPU time-utilization is "low"
//! low-utilization-steps = 0.25   # PK603: share of steps that must be low to report
//! memory-share = 0.9             # PK604: peak device memory share of the card
//! min-share = 0.01               # every per-step rule: costs below 1 % of the median step are not reported
//! ```
//!
//! The same keys are read from `[package.metadata.perfkit.profile]` or
//! `[workspace.metadata.perfkit.profile]` of a `Cargo.toml`. Unknown keys are errors.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Thresholds of the runtime rules. Every field has a documented default
/// ([`ProfileConfig::default`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[non_exhaustive]
pub struct ProfileConfig {
    /// A source line is "per step" when its operations happen in at least this share of the
    /// steps (0..=1). Default `0.5`.
    pub min_step_fraction: f64,
    /// PK101: a device-to-host copy whose mean size is at most this many bytes is small.
    /// Default 64 KiB.
    pub small_copy_bytes: u64,
    /// PK203: a host-to-device copy whose mean size is at most this many bytes is tiny.
    /// Default 64 KiB.
    pub tiny_copy_bytes: u64,
    /// PK203: tiny uploads from one source line per step at or above which it is reported.
    /// Default 16.
    pub tiny_copies_per_step: f64,
    /// PK301: names of the spans that mark data loading. Default
    /// `["data", "load_batch", "dataloader", "data_loading", "next_batch"]`.
    pub loader_spans: Vec<String>,
    /// PK301: GPU idle time inside data loading, as a share of the median step, at or above
    /// which it is reported (0..=1). Default `0.05`.
    pub loader_idle_share: f64,
    /// PK601: GPU idle share of the time inside steps at or above which it is reported
    /// (0..=1). Default `0.2`.
    pub idle_share: f64,
    /// PK601: idle gaps at least this long (nanoseconds) are counted and shown. Default 100 µs.
    pub gap_ns: u64,
    /// PK603: a step whose GPU time-utilization (busy time / wall time) is below this share is
    /// a low-utilization step (0..=1). Default `0.5`.
    pub utilization: f64,
    /// PK603: share of steps that must be low-utilization steps for the rule to report (0..=1).
    /// Default `0.25`.
    pub low_utilization_steps: f64,
    /// PK604: peak device memory as a share of the card's memory at or above which it is
    /// reported (0..=1). Default `0.9`.
    pub memory_share: f64,
    /// Per-step rules (PK101, PK102, PK202, PK203, PK303, PK602) do not report a cost below
    /// this share of the median step time (0..=1). Default `0.01`.
    pub min_share: f64,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        Self {
            min_step_fraction: 0.5,
            small_copy_bytes: 64 * 1024,
            tiny_copy_bytes: 64 * 1024,
            tiny_copies_per_step: 16.0,
            loader_spans: [
                "data",
                "load_batch",
                "dataloader",
                "data_loading",
                "next_batch",
            ]
            .map(String::from)
            .to_vec(),
            loader_idle_share: 0.05,
            idle_share: 0.2,
            gap_ns: 100_000,
            utilization: 0.5,
            low_utilization_steps: 0.25,
            memory_share: 0.9,
            min_share: 0.01,
        }
    }
}

/// A `perfkit.toml` (or `Cargo.toml`) whose `[profile]` table cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or its `[profile]` table has a bad key or value.
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line (1-based) of the bad key or value, when known.
        line: Option<usize>,
        /// What is wrong (from the TOML parser, it names the key).
        message: String,
    },
}

/// A table of perfkit's configuration (`[profile]`, `[check]`): where it is read from and how
/// its values are checked. Both are found the same way, by [`discover_table`].
pub(crate) trait ConfigTable: Default + PartialEq + serde::de::DeserializeOwned {
    /// The table's name: `profile` reads `[profile]` and `metadata.perfkit.profile`.
    const TABLE: &'static str;

    /// Checks the values the table's types cannot (ranges, known keys).
    fn validate(&self) -> Result<(), String>;
}

/// Parses the `T::TABLE` table of a configuration file's text (`[T]` in a `perfkit.toml`,
/// `[package|workspace.metadata.perfkit.T]` in a `Cargo.toml`); `path` names the file in errors;
/// defaults when the file has no such table.
pub(crate) fn table_from_toml<T: ConfigTable>(
    text: &str,
    is_cargo: bool,
    path: &Path,
) -> Result<T, ConfigError> {
    let invalid = |line: Option<usize>, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        line,
        message,
    };
    // Parsed with spans, so that a bad value is named by its line.
    let line_at = |offset: usize| 1 + text[..offset.min(text.len())].matches('\n').count();
    let doc = toml::de::DeTable::parse(text)
        .map_err(|e: toml::de::Error| invalid(None, e.to_string()))?;
    let span = doc.span();
    let doc = toml::Spanned::new(span, toml::de::DeValue::Table(doc.into_inner()));
    let value = if is_cargo {
        ["package", "workspace"].iter().find_map(|k| {
            doc.get_ref()
                .get(*k)?
                .get_ref()
                .get("metadata")?
                .get_ref()
                .get("perfkit")?
                .get_ref()
                .get(T::TABLE)
        })
    } else {
        doc.get_ref().get(T::TABLE)
    };
    // No table: every default applies.
    let Some(value) = value else {
        return Ok(T::default());
    };
    let table_line = line_at(value.span().start);
    let config = T::deserialize(toml::de::ValueDeserializer::from(value.clone())).map_err(
        |e: toml::de::Error| {
            let line = e.span().map_or(table_line, |span| line_at(span.start));
            invalid(Some(line), format!("in [{}]: {}", T::TABLE, e.message()))
        },
    )?;
    config.validate().map_err(|message| {
        // The message names the key in backticks: point at its line.
        let line = message
            .split('`')
            .nth(1)
            .and_then(|key| value.get_ref().get(key))
            .map_or(table_line, |v| line_at(v.span().start));
        invalid(Some(line), message)
    })?;
    Ok(config)
}

/// Reads the `T::TABLE` table of a `perfkit.toml` or `Cargo.toml`.
pub(crate) fn table_from_file<T: ConfigTable>(path: &Path) -> Result<T, ConfigError> {
    // A FIFO or a device would block the read: refused by name.
    let text = perfkit_profiler::reader::require_regular_file(path)
        .and_then(|()| std::fs::read_to_string(path))
        .map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let is_cargo = path.file_name().is_some_and(|n| n == "Cargo.toml");
    table_from_toml(&text, is_cargo, path)
}

/// Finds the `T::TABLE` configuration for `start` (a file or directory): the nearest
/// `perfkit.toml` upward, else the nearest `Cargo.toml` with a `metadata.perfkit.T` table;
/// defaults when there is neither. Also returns the file read.
pub(crate) fn discover_table<T: ConfigTable>(
    start: &Path,
) -> Result<(T, Option<PathBuf>), ConfigError> {
    let start = if start.is_file() {
        start.parent().unwrap_or(start)
    } else {
        start
    };
    // The real path: `std::path::absolute` keeps `..`, so that the ancestors of `../run` would
    // pass through the current directory, which is not above the run.
    let start = std::fs::canonicalize(start)
        .or_else(|_| std::path::absolute(start))
        .unwrap_or_else(|_| start.to_path_buf());
    for dir in start.ancestors() {
        let toml_file = dir.join("perfkit.toml");
        if toml_file.is_file() {
            return Ok((table_from_file(&toml_file)?, Some(toml_file)));
        }
        let cargo = dir.join("Cargo.toml");
        if cargo.is_file() {
            let text = std::fs::read_to_string(&cargo).map_err(|source| ConfigError::Io {
                path: cargo.clone(),
                source,
            })?;
            if text.contains("perfkit") {
                let config: T = table_from_toml(&text, true, &cargo)?;
                if config != T::default() {
                    return Ok((config, Some(cargo)));
                }
            }
        }
    }
    Ok((T::default(), None))
}

impl ConfigTable for ProfileConfig {
    const TABLE: &'static str = "profile";

    fn validate(&self) -> Result<(), String> {
        self.check_values()
    }
}

impl ProfileConfig {
    /// Reads the `[profile]` table of a `perfkit.toml`, or the `metadata.perfkit.profile` table
    /// of a `Cargo.toml`; defaults when the file has no such table.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        table_from_file(path)
    }

    /// Parses a configuration file's text; `path` names the file in errors.
    pub fn from_toml(text: &str, is_cargo: bool, path: &Path) -> Result<Self, ConfigError> {
        table_from_toml(text, is_cargo, path)
    }

    /// Finds the configuration for `start` (a file or directory): the nearest `perfkit.toml`
    /// upward, else the nearest `Cargo.toml` with a `metadata.perfkit.profile` table; defaults
    /// when there is neither.
    pub fn discover(start: &Path) -> Result<Self, ConfigError> {
        discover_table(start).map(|(config, _)| config)
    }

    fn check_values(&self) -> Result<(), String> {
        let shares = [
            ("min-step-fraction", self.min_step_fraction),
            ("loader-idle-share", self.loader_idle_share),
            ("idle-share", self.idle_share),
            ("utilization", self.utilization),
            ("low-utilization-steps", self.low_utilization_steps),
            ("memory-share", self.memory_share),
            ("min-share", self.min_share),
        ];
        for (key, v) in shares {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!(
                    "in [profile]: `{key}` must be between 0 and 1, got {v}"
                ));
            }
        }
        if !(self.tiny_copies_per_step.is_finite() && self.tiny_copies_per_step >= 1.0) {
            return Err(format!(
                "in [profile]: `tiny-copies-per-step` must be at least 1, got {}",
                self.tiny_copies_per_step
            ));
        }
        Ok(())
    }
}
