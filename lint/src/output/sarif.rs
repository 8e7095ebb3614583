//! SARIF 2.1.0, as code-scanning services (GitHub code scanning among them) read it.
//!
//! One run whose `tool.driver.rules` is the rule catalog (id, name, short description from the rule's
//! summary, full description and help from its documentation, default level), one result per finding
//! (rule id and index, level, message with the help, region, and the fix as a SARIF `fix` where the
//! finding has one), and one invocation whose `toolExecutionNotifications` are the files that could not
//! be linted. Artifact URIs are relative to `%SRCROOT%`, the current directory, with forward slashes;
//! columns count Unicode code points (`columnKind`).

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use serde_json::{Value, json};

use super::{display_note, display_path};
use crate::rules::RuleMeta;
use crate::{Diagnostic, LintReport};

/// The JSON schema the document declares.
pub const SCHEMA_URI: &str = "https://json.schemastore.org/sarif-2.1.0.json";
/// Where users of the tool find it.
pub const INFORMATION_URI: &str = "https://crates.io/crates/perfkit";
/// The base id that artifact locations are relative to.
pub const SRCROOT: &str = "%SRCROOT%";

/// Writes `report` as a SARIF 2.1.0 log. `rules` is the rule catalog; a finding whose code is not in it
/// gets a rule entry made from the finding's code and name.
pub fn render(out: &mut impl Write, report: &LintReport, rules: &[&RuleMeta]) -> io::Result<()> {
    let document = to_value(report, rules);
    serde_json::to_writer_pretty(&mut *out, &document).map_err(io::Error::from)?;
    writeln!(out)
}

/// The SARIF log of `report` as a JSON value.
pub fn to_value(report: &LintReport, rules: &[&RuleMeta]) -> Value {
    let mut descriptors: Vec<Value> = rules.iter().map(|meta| rule_descriptor(meta)).collect();
    let mut index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, meta)| (meta.code, i))
        .collect();
    for diagnostic in &report.diagnostics {
        if !index.contains_key(diagnostic.code) {
            index.insert(diagnostic.code, descriptors.len());
            descriptors.push(json!({
                "id": diagnostic.code,
                "name": diagnostic.name,
                "shortDescription": { "text": diagnostic.name },
                "defaultConfiguration": { "level": diagnostic.severity.as_str() },
            }));
        }
    }
    let results: Vec<Value> = report
        .diagnostics
        .iter()
        .map(|diagnostic| result(diagnostic, index[diagnostic.code]))
        .collect();
    let notifications: Vec<Value> = report
        .errors
        .iter()
        .map(|error| {
            let mut physical = json!({ "artifactLocation": artifact_location(&error.path) });
            if let Some(line) = error.line {
                physical["region"] = json!({ "startLine": line.max(1) });
            }
            json!({
                "level": "error",
                "message": { "text": format!("{}: {}", display_path(&error.path), error.message) },
                "locations": [{ "physicalLocation": physical }],
            })
        })
        .collect();
    let mut run = json!({
        "tool": {
            "driver": {
                "name": "perfkit",
                "version": env!("CARGO_PKG_VERSION"),
                "semanticVersion": env!("CARGO_PKG_VERSION"),
                "informationUri": INFORMATION_URI,
                "rules": descriptors,
            }
        },
        "invocations": [{
            "executionSuccessful": report.errors.is_empty(),
            "toolExecutionNotifications": notifications,
        }],
        "columnKind": "unicodeCodePoints",
        "results": results,
    });
    if let Some(uri) = std::env::current_dir()
        .ok()
        .and_then(|cwd| directory_uri(&cwd))
    {
        run["originalUriBaseIds"] = json!({ SRCROOT: { "uri": uri } });
    }
    json!({
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [run],
    })
}

fn rule_descriptor(meta: &RuleMeta) -> Value {
    json!({
        "id": meta.code,
        "name": meta.name,
        "shortDescription": { "text": meta.summary },
        "fullDescription": { "text": full_description(meta.doc) },
        "help": {
            "text": format!("{}\n\nRun `perfkit rule {}` for this text in a terminal.", meta.doc.trim_end(), meta.code),
            "markdown": meta.doc,
        },
        "defaultConfiguration": { "level": meta.default_severity.as_str() },
        "properties": {
            "tags": ["performance"],
            "fixable": meta.fixable,
        },
    })
}

/// Code-scanning services cap rule descriptions (GitHub: 1024 characters).
pub const MAX_DESCRIPTION_CHARS: usize = 1024;

/// The rule's prose before its example (`What it does`, `Why is this bad?`), without the Markdown
/// headings and with each paragraph on one line, cut to [`MAX_DESCRIPTION_CHARS`]. The whole
/// documentation goes into `help`.
fn full_description(doc: &str) -> String {
    let prose = doc.split("\n## Example").next().unwrap_or(doc);
    // Paragraphs unwrapped to one line each (viewers wrap text themselves), headings left out.
    let mut paragraphs: Vec<String> = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in prose.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            if !current.is_empty() {
                paragraphs.push(current.join(" "));
                current.clear();
            }
        } else {
            current.push(line);
        }
    }
    if !current.is_empty() {
        paragraphs.push(current.join(" "));
    }
    let text = paragraphs.join("\n\n");
    let text = text.trim();
    if text.chars().count() <= MAX_DESCRIPTION_CHARS {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(MAX_DESCRIPTION_CHARS - 3).collect();
    cut.push_str("...");
    cut
}

fn result(diagnostic: &Diagnostic, rule_index: usize) -> Value {
    let region = diagnostic.region;
    let mut text = diagnostic.message.clone();
    for note in &diagnostic.notes {
        text.push_str("\nnote: ");
        text.push_str(&display_note(note));
    }
    if !diagnostic.help.is_empty() {
        text.push_str("\nhelp: ");
        text.push_str(&diagnostic.help);
    }
    let mut value = json!({
        "ruleId": diagnostic.code,
        "ruleIndex": rule_index,
        "level": diagnostic.severity.as_str(),
        "message": { "text": text },
        "locations": [{
            "physicalLocation": {
                "artifactLocation": artifact_location(&diagnostic.path),
                "region": {
                    "startLine": region.line.max(1),
                    "startColumn": region.column.max(1),
                    "endLine": region.end_line.max(region.line).max(1),
                    "endColumn": region.end_column.max(1),
                },
            }
        }],
    });
    if let Some(cell) = diagnostic.cell {
        // A notebook's lines are its cells' lines, not lines of the `.ipynb` file: the location is
        // the file, and the cell and the region within it are properties (and in the message).
        value["locations"][0]["physicalLocation"]
            .as_object_mut()
            .map(|physical| physical.remove("region"));
        value["message"]["text"] = json!(format!("cell {cell}, line {}: {text}", region.line));
        value["properties"] = json!({
            "cell": cell,
            "line": region.line,
            "column": region.column,
            "end_line": region.end_line,
            "end_column": region.end_column,
        });
    }
    if let Some(fix) = &diagnostic.fix {
        let replacements: Vec<Value> = fix
            .edits
            .iter()
            .map(|edit| {
                json!({
                    "deletedRegion": { "byteOffset": edit.start, "byteLength": edit.end.saturating_sub(edit.start) },
                    "insertedContent": { "text": edit.replacement },
                })
            })
            .collect();
        value["fixes"] = json!([{
            "description": { "text": fix.title },
            "artifactChanges": [{
                "artifactLocation": artifact_location(&diagnostic.path),
                "replacements": replacements,
            }],
        }]);
    }
    value
}

/// A relative path becomes a URI reference under `%SRCROOT%`; an absolute one (outside the current
/// directory on another drive) a `file` URI.
fn artifact_location(path: &Path) -> Value {
    let shown = super::relative_to_current_dir(path);
    if shown.is_absolute() {
        json!({ "uri": file_uri(&uri_bytes(&shown)) })
    } else {
        json!({ "uri": percent_encode(&uri_bytes(&shown)), "uriBaseId": SRCROOT })
    }
}

/// The bytes of a path for a URI, `/`-separated. On Unix a file name is bytes, not text: a name
/// that is not UTF-8 keeps its own bytes (percent-encoded), so the URI names the file (text
/// replaced by U+FFFD would name another).
fn uri_bytes(path: &Path) -> Vec<u8> {
    if std::path::MAIN_SEPARATOR == '/' {
        path.as_os_str().as_encoded_bytes().to_vec()
    } else {
        path.to_string_lossy()
            .replace(std::path::MAIN_SEPARATOR, "/")
            .into_bytes()
    }
}

fn directory_uri(dir: &Path) -> Option<String> {
    let mut uri = file_uri(&uri_bytes(dir));
    if !uri.ends_with('/') {
        uri.push('/');
    }
    Some(uri)
}

fn file_uri(absolute: &[u8]) -> String {
    let encoded = percent_encode(absolute);
    if encoded.starts_with('/') {
        format!("file://{encoded}")
    } else {
        format!("file:///{encoded}")
    }
}

/// Percent-encodes everything but unreserved characters and `/` (RFC 3986), so that spaces, `%` and
/// non-ASCII names make valid URIs.
fn percent_encode(path: &[u8]) -> String {
    let mut out = String::with_capacity(path.len());
    for &byte in path {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(byte as char)
            }
            b':' if cfg!(windows) => out.push(':'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::test_support::{diagnostic, fix, report};
    use crate::{FileError, Severity};
    use std::path::PathBuf;

    static META: RuleMeta = RuleMeta {
        code: "PK101",
        name: "host-readback-in-step-loop",
        default_severity: Severity::Warning,
        summary: "Flags device-to-host readbacks inside a training step loop.",
        doc: "## What it does\nFlags device-to-host readbacks inside a training step loop.\n",
        fixable: false,
    };

    #[test]
    fn results_point_at_their_rule_and_region() {
        let mut unknown = diagnostic("src/a b.rs", 2, 1, 5);
        unknown.code = "PK000";
        unknown.name = "unused-suppression";
        unknown.severity = Severity::Note;
        let mut fixed = diagnostic("./src/train.rs", 4, 23, 41);
        fixed.fix = Some(fix(10, 20, "&device"));
        let errors = vec![FileError {
            path: PathBuf::from("src/broken.rs"),
            message: "expected `;`".into(),
            line: Some(3),
        }];
        let value = to_value(&report(vec![unknown, fixed], errors, 3), &[&META]);

        assert_eq!(value["version"], "2.1.0");
        let run = &value["runs"][0];
        let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["id"], "PK101");
        assert_eq!(rules[0]["shortDescription"]["text"], META.summary);
        assert_eq!(rules[0]["help"]["markdown"], META.doc);
        assert_eq!(rules[0]["defaultConfiguration"]["level"], "warning");
        assert_eq!(rules[1]["id"], "PK000");

        let results = run["results"].as_array().unwrap();
        assert_eq!(results[0]["ruleIndex"], 1);
        assert_eq!(results[0]["level"], "note");
        let location = &results[0]["locations"][0]["physicalLocation"];
        assert_eq!(location["artifactLocation"]["uri"], "src/a%20b.rs");
        assert_eq!(location["artifactLocation"]["uriBaseId"], "%SRCROOT%");
        assert_eq!(results[1]["ruleIndex"], 0);
        assert_eq!(
            results[1]["locations"][0]["physicalLocation"]["region"]["startColumn"],
            23
        );
        assert_eq!(
            results[1]["locations"][0]["physicalLocation"]["region"]["endColumn"],
            41
        );
        assert_eq!(
            results[1]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            "src/train.rs"
        );
        let replacement = &results[1]["fixes"][0]["artifactChanges"][0]["replacements"][0];
        assert_eq!(replacement["deletedRegion"]["byteOffset"], 10);
        assert_eq!(replacement["deletedRegion"]["byteLength"], 10);
        assert!(
            results[1]["message"]["text"]
                .as_str()
                .unwrap()
                .contains("\nhelp: keep the running loss")
        );

        let invocation = &run["invocations"][0];
        assert_eq!(invocation["executionSuccessful"], false);
        let notification = &invocation["toolExecutionNotifications"][0];
        assert_eq!(notification["level"], "error");
        assert_eq!(
            notification["locations"][0]["physicalLocation"]["region"]["startLine"],
            3
        );
        assert!(
            run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
                .as_str()
                .unwrap()
                .starts_with("file:///")
        );
    }

    #[test]
    fn full_descriptions_are_the_prose_before_the_example_and_bounded() {
        let doc = "## What it does\nFlags things\nin loops.\n\n## Why is this bad?\nIt is slow.\n\n## Example\n```rust\nx\n```";
        assert_eq!(
            full_description(doc),
            "Flags things in loops.\n\nIt is slow."
        );
        let long = format!("## What it does\n{}", "é".repeat(3000));
        let cut = full_description(&long);
        assert_eq!(cut.chars().count(), MAX_DESCRIPTION_CHARS);
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn percent_encoding_keeps_paths_readable() {
        assert_eq!(
            percent_encode(b"src/model/train_step.rs"),
            "src/model/train_step.rs"
        );
        assert_eq!(
            percent_encode("src/ü 100%.rs".as_bytes()),
            "src/%C3%BC%20100%25.rs"
        );
        // A Unix file name that is not UTF-8 keeps its bytes.
        assert_eq!(percent_encode(b"tr\xffain.py"), "tr%FFain.py");
    }
}
