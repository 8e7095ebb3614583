//! Findings shown in the reports (runtime findings from the analysis, lint findings).
//!
//! This crate renders whatever list it is given; an empty list is reported as "no findings".

use serde::{Deserialize, Serialize};

/// Severity of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Informational.
    Note,
    /// Worth fixing.
    Warning,
    /// Must be fixed.
    Error,
}

impl Severity {
    /// `note`, `warning` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// One finding, static or measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Rule code, e.g. `PK101`.
    pub code: String,
    /// Rule name, e.g. `host-readback-in-step-loop`.
    pub name: String,
    /// Severity.
    pub severity: Severity,
    /// What is wrong.
    pub message: String,
    /// What to do.
    pub help: String,
    /// `file:line` of the code responsible, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// `runtime` (measured in a trace) or `lint` (found in the source).
    pub origin: String,
    /// A lint finding whose source line also showed up at run time.
    #[serde(default)]
    pub confirmed: bool,
    /// Measured cost per step, nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_step_ns: Option<u64>,
    /// Measured cost as a share of step time, in percent (`12.5` = 12.5 %).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_of_step_percent: Option<f64>,
    /// Bytes involved, when relevant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Occurrences, when relevant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}
