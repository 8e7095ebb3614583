//! JSON output, schema version 1: the stable interface that CI and tools parse.
//!
//! ```json
//! {"version":1,"files_scanned":12,
//!  "findings":[{"code":"PK101","name":"host-readback-in-step-loop","severity":"warning",
//!               "path":"src/train.rs","line":42,"column":29,"end_line":42,"end_column":47,
//!               "message":"...","help":"..."}],
//!  "errors":[{"path":"src/broken.rs","message":"...","line":3}]}
//! ```
//!
//! Paths are relative to the current directory, lines and columns 1-based (columns in characters, the
//! end exclusive). `line` of an error is left out where the error has no line. A finding in a Jupyter
//! notebook (`.ipynb`) has one more field, `cell` (1-based, in the notebook's `cells` list), and its
//! lines and columns are those of that cell's text; findings in other files have no `cell`. Nothing
//! else is added to the objects: notes and fixes are shown by the text and SARIF formats.

use std::io::{self, Write};

use serde::Serialize;

use super::display_path;
use crate::LintReport;

/// The version of the schema, written as the `version` field.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
struct Document<'a> {
    version: u32,
    files_scanned: usize,
    findings: Vec<Finding<'a>>,
    errors: Vec<Error<'a>>,
}

#[derive(Serialize)]
struct Finding<'a> {
    code: &'a str,
    name: &'a str,
    severity: &'a str,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cell: Option<usize>,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    message: &'a str,
    help: &'a str,
}

#[derive(Serialize)]
struct Error<'a> {
    path: String,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<usize>,
}

/// Writes `report` as one JSON document (pretty-printed, ending with a newline).
pub fn render(out: &mut impl Write, report: &LintReport) -> io::Result<()> {
    let document = Document {
        version: SCHEMA_VERSION,
        files_scanned: report.files_scanned,
        findings: report
            .diagnostics
            .iter()
            .map(|d| Finding {
                code: d.code,
                name: d.name,
                severity: d.severity.as_str(),
                path: display_path(&d.path),
                cell: d.cell,
                line: d.region.line,
                column: d.region.column,
                end_line: d.region.end_line,
                end_column: d.region.end_column,
                message: &d.message,
                help: &d.help,
            })
            .collect(),
        errors: report
            .errors
            .iter()
            .map(|e| Error {
                path: display_path(&e.path),
                message: &e.message,
                line: e.line,
            })
            .collect(),
    };
    serde_json::to_writer_pretty(&mut *out, &document).map_err(io::Error::from)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileError;
    use crate::output::test_support::{diagnostic, fix, report};
    use std::path::PathBuf;

    #[test]
    fn writes_schema_version_1_with_exactly_its_keys_in_order() {
        let mut with_fix = diagnostic("./src/train.rs", 4, 23, 41);
        with_fix.fix = Some(fix(0, 1, "x"));
        let errors = vec![
            FileError {
                path: PathBuf::from("src/broken.rs"),
                message: "expected `;`".into(),
                line: Some(3),
            },
            FileError {
                path: PathBuf::from("src/binary.rs"),
                message: "not UTF-8".into(),
                line: None,
            },
        ];
        let report = report(vec![with_fix], errors, 7);
        let mut out = Vec::new();
        render(&mut out, &report).unwrap();
        let text = String::from_utf8(out).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let expected = serde_json::json!({
            "version": 1,
            "files_scanned": 7,
            "findings": [{
                "code": "PK101", "name": "host-readback-in-step-loop", "severity": "warning",
                "path": "src/train.rs", "line": 4, "column": 23, "end_line": 4, "end_column": 41,
                "message": "`to_scalar` reads a value back to the host on every step",
                "help": "keep the running loss on the device and read it once per epoch"
            }],
            "errors": [
                {"path": "src/broken.rs", "message": "expected `;`", "line": 3},
                {"path": "src/binary.rs", "message": "not UTF-8"}
            ]
        });
        assert_eq!(value, expected);
        // Key order as documented, so that the output reads the same as the schema.
        let keys = [
            "\"code\"",
            "\"name\"",
            "\"severity\"",
            "\"path\"",
            "\"line\"",
            "\"column\"",
            "\"end_line\"",
            "\"end_column\"",
            "\"message\"",
            "\"help\"",
        ];
        let positions: Vec<usize> = keys.iter().map(|key| text.find(key).unwrap()).collect();
        assert!(positions.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn an_empty_report_has_empty_arrays() {
        let mut out = Vec::new();
        render(&mut out, &report(Vec::new(), Vec::new(), 0)).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"version": 1, "files_scanned": 0, "findings": [], "errors": []})
        );
    }
}
