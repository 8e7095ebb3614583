//! cargo's JSON messages (`cargo check --message-format=json`): one `compiler-message` per finding
//! and per file that could not be linted, each holding a rustc diagnostic, then one
//! `build-finished`. Tools that read `cargo check`'s output (rust-analyzer's
//! `check.overrideCommand`, bacon, cargo-watch, CI problem matchers) show the findings as they
//! show rustc's.
//!
//! ```json
//! {"reason":"compiler-message","package_id":"path+file:///src/app#app@0.1.0",
//!  "manifest_path":"/src/app/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"app",...},
//!  "message":{"$message_type":"diagnostic","message":"`to_scalar` reads ...",
//!             "code":{"code":"PK101","explanation":"..."},"level":"warning",
//!             "spans":[{"file_name":"src/main.rs","byte_start":120,"byte_end":138,"line_start":4,
//!                       "line_end":4,"column_start":23,"column_end":41,"is_primary":true,
//!                       "text":[{"text":"...","highlight_start":23,"highlight_end":41}],
//!                       "label":"host-readback-in-step-loop",...}],
//!             "children":[{"message":"keep the running loss ...","level":"help",...}],
//!             "rendered":"warning[PK101]: ..."}}
//! {"reason":"build-finished","success":false}
//! ```
//!
//! - `file_name` is shown as the other formats show paths (relative to the current directory),
//!   which is what rustc writes when cargo runs in the workspace root; byte offsets, lines and
//!   columns (1-based, in characters, the end exclusive) are those of the file as it is read
//!   when the report is rendered.
//! - Levels: a finding's severity (`error`, `warning`, `note`); a file that could not be linted
//!   is an `error` without a code.
//! - Children: each note (`note`), the help (`help`) and the fix, a `help` whose spans carry the
//!   replacement text with `MachineApplicable`, so editors offer it as a quick fix.
//! - `package_id`, `manifest_path` and `target` describe the package around the file (the
//!   nearest `Cargo.toml` with a `[package]`) and the target cargo's layout puts the file in
//!   (`src/bin/NAME.rs`, `examples/`, `tests/`, `benches/`, else the library or main binary).
//!   A file with no package around it is a package of its own named after the file.
//! - `build-finished` is `success: true` exactly when `perfkit lint` exits with 0 without
//!   `--exit-zero`: no file error and no finding at warning or above.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use annotate_snippets::Renderer;
use serde_json::{Value, json};

use super::text::{SourceCache, SourceText, render_diagnostic};
use super::{display_note, display_path, normalize};
use crate::rules::RuleMeta;
use crate::{Diagnostic, FileError, LintReport, Severity};

/// Writes one `compiler-message` line per finding and per file error, then `build-finished`.
pub fn render(out: &mut impl Write, report: &LintReport, rules: &[&RuleMeta]) -> io::Result<()> {
    let renderer = Renderer::plain();
    let mut sources = SourceCache::default();
    let mut packages = Packages::default();
    for diagnostic in &report.diagnostics {
        let source = sources.get(&diagnostic.path, diagnostic.cell);
        let explanation = rules
            .iter()
            .find(|rule| rule.code == diagnostic.code)
            .map(|rule| rule.doc.trim().to_string());
        let message = finding_message(diagnostic, source, &renderer, explanation);
        let line = compiler_message(packages.get(&diagnostic.path), message);
        serde_json::to_writer(&mut *out, &line)?;
        writeln!(out)?;
    }
    for error in &report.errors {
        let source = sources.get(&error.path, None);
        let message = error_message(error, source);
        let line = compiler_message(packages.get(&error.path), message);
        serde_json::to_writer(&mut *out, &line)?;
        writeln!(out)?;
    }
    let success = report.errors.is_empty()
        && !report
            .diagnostics
            .iter()
            .any(|d| d.severity >= Severity::Warning);
    serde_json::to_writer(
        &mut *out,
        &json!({"reason": "build-finished", "success": success}),
    )?;
    writeln!(out)
}

fn compiler_message(package: &Package, message: Value) -> Value {
    json!({
        "reason": "compiler-message",
        "package_id": package.id,
        "manifest_path": package.manifest_path,
        "target": package.target,
        "message": message,
    })
}

/// The rustc diagnostic of one finding.
fn finding_message(
    d: &Diagnostic,
    source: Option<&SourceText>,
    renderer: &Renderer,
    explanation: Option<String>,
) -> Value {
    let file_name = display_path(&d.path);
    let region = d.region;
    let primary = span(
        &file_name,
        source,
        (region.line, region.column),
        (region.end_line, region.end_column),
        true,
        Some(d.name),
    );
    let mut children: Vec<Value> = d
        .notes
        .iter()
        .map(|note| child("note", &display_note(note), Vec::new()))
        .collect();
    if !d.help.is_empty() {
        children.push(child("help", &d.help, Vec::new()));
    }
    children.push(child(
        "note",
        &format!("rule {}; see `perfkit rule {}`", d.name, d.code),
        Vec::new(),
    ));
    if let (Some(fix), Some(source)) = (&d.fix, source)
        && fix
            .edits
            .iter()
            .all(|e| e.start <= e.end && source.text().get(e.start..e.end).is_some())
    {
        let spans = fix
            .edits
            .iter()
            .map(|edit| {
                let mut s = span(
                    &file_name,
                    Some(source),
                    source.position_of(edit.start),
                    source.position_of(edit.end),
                    true,
                    None,
                );
                s["suggested_replacement"] = json!(edit.replacement);
                s["suggestion_applicability"] = json!("MachineApplicable");
                s
            })
            .collect();
        children.push(child("help", &fix.title, spans));
    }
    let mut rendered = render_diagnostic(renderer, d, source);
    rendered.push('\n');
    // A notebook's lines are its cells' lines, not the lines of the `.ipynb` file: no span points
    // into the file, and the message names the cell.
    let (message, spans) = match d.cell {
        Some(cell) => (
            format!("cell {cell}, line {}: {}", region.line, d.message),
            Vec::new(),
        ),
        None => (d.message.clone(), vec![primary]),
    };
    json!({
        "$message_type": "diagnostic",
        "message": message,
        "code": {"code": d.code, "explanation": explanation},
        "level": d.severity.as_str(),
        "spans": spans,
        "children": children,
        "rendered": rendered,
    })
}

/// The rustc diagnostic of a file that could not be linted: an error on its line, or on the
/// start of the file.
fn error_message(error: &FileError, source: Option<&SourceText>) -> Value {
    let file_name = display_path(&error.path);
    let line = error.line.unwrap_or(1);
    let primary = span(&file_name, source, (line, 1), (line, 1), true, None);
    let location = match error.line {
        Some(line) => format!("{file_name}:{line}"),
        None => file_name.clone(),
    };
    json!({
        "$message_type": "diagnostic",
        "message": format!("perfkit could not lint this file: {}", error.message),
        "code": null,
        "level": "error",
        "spans": [primary],
        "children": [],
        "rendered": format!("error: {}\n  --> {location}\n", error.message),
    })
}

fn child(level: &str, message: &str, spans: Vec<Value>) -> Value {
    json!({
        "$message_type": "diagnostic",
        "message": message,
        "code": null,
        "level": level,
        "spans": spans,
        "children": [],
        "rendered": null,
    })
}

/// Longest source line a span's `text` carries.
const MAX_SPAN_LINE_BYTES: usize = 4096;

/// A rustc span from `start` to `end` ((line, column), 1-based, column in characters, end
/// exclusive), with the source lines it covers where the file could be read.
fn span(
    file_name: &str,
    source: Option<&SourceText>,
    start: (usize, usize),
    end: (usize, usize),
    is_primary: bool,
    label: Option<&str>,
) -> Value {
    let end = end.max(start);
    let (byte_start, byte_end, text) = match source {
        Some(source) => {
            let lines: Vec<Value> = (start.0..=end.0)
                .filter_map(|line| {
                    // A line of generated or minified code is left out rather than repeated in
                    // every span on it (the span's lines and columns still place it).
                    let text = source
                        .line_text(line)
                        .filter(|text| text.len() <= MAX_SPAN_LINE_BYTES)?;
                    let from = if line == start.0 { start.1 } else { 1 };
                    let to = if line == end.0 {
                        end.1
                    } else {
                        text.chars().count() + 1
                    };
                    Some(json!({"text": text, "highlight_start": from, "highlight_end": to}))
                })
                .collect();
            (
                source.byte_offset(start.0, start.1),
                source.byte_offset(end.0, end.1),
                lines,
            )
        }
        None => (0, 0, Vec::new()),
    };
    json!({
        "file_name": file_name,
        "byte_start": byte_start,
        "byte_end": byte_end,
        "line_start": start.0,
        "line_end": end.0,
        "column_start": start.1,
        "column_end": end.1,
        "is_primary": is_primary,
        "text": text,
        "label": label,
        "suggested_replacement": null,
        "suggestion_applicability": null,
        "expansion": null,
    })
}

/// The package and target of a source file, as cargo would name them.
#[derive(Debug)]
struct Package {
    id: String,
    manifest_path: String,
    target: Value,
}

/// Packages looked up so far, by file.
#[derive(Debug, Default)]
struct Packages {
    by_file: HashMap<PathBuf, Package>,
}

impl Packages {
    fn get(&mut self, path: &Path) -> &Package {
        self.by_file
            .entry(path.to_path_buf())
            .or_insert_with(|| package_of(path))
    }
}

/// The package around `file` (the nearest `Cargo.toml` with a `[package]`) and the target
/// cargo's layout puts it in.
fn package_of(file: &Path) -> Package {
    let absolute = std::env::current_dir()
        .map(|cwd| normalize(&cwd.join(file)))
        .unwrap_or_else(|_| file.to_path_buf());
    let manifest = absolute.ancestors().skip(1).find_map(|dir| {
        let path = dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&path).ok()?;
        let table: toml::Table = text.parse().ok()?;
        let package = table.get("package")?.as_table()?.clone();
        Some((dir.to_path_buf(), path, package))
    });
    let Some((dir, manifest_path, package)) = manifest else {
        // A file of its own: a binary named after it.
        let name = absolute
            .file_stem()
            .map_or_else(|| "main".to_string(), |s| s.to_string_lossy().into_owned());
        let dir = absolute.parent().unwrap_or(Path::new("/"));
        return Package {
            id: format!("path+{}#{name}@0.0.0", file_url(dir)),
            manifest_path: dir.join("Cargo.toml").display().to_string(),
            target: target_json(&name, "bin", &absolute, "2015"),
        };
    };
    let name = package
        .get("name")
        .and_then(|v| v.as_str())
        .unwrap_or("unnamed")
        .to_string();
    let version = inherited(&package, "version", &dir).unwrap_or_else(|| "0.0.0".to_string());
    let edition = inherited(&package, "edition", &dir).unwrap_or_else(|| "2015".to_string());
    let (target_name, kind, src_path) = target_of(&absolute, &dir, &name);
    Package {
        id: format!("path+{}#{name}@{version}", file_url(&dir)),
        manifest_path: manifest_path.display().to_string(),
        target: target_json(&target_name, kind, &src_path, &edition),
    }
}

/// A `[package]` field given as a string or inherited from the workspace
/// (`key.workspace = true`: `[workspace.package]` of the nearest `Cargo.toml` above with a
/// `[workspace]`).
fn inherited(package: &toml::Table, key: &str, dir: &Path) -> Option<String> {
    match package.get(key)? {
        toml::Value::String(value) => Some(value.clone()),
        toml::Value::Table(t) if t.get("workspace").and_then(|w| w.as_bool()) == Some(true) => {
            dir.ancestors().find_map(|dir| {
                let text = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
                let table: toml::Table = text.parse().ok()?;
                let workspace = table.get("workspace")?.as_table()?;
                workspace
                    .get("package")?
                    .get(key)?
                    .as_str()
                    .map(str::to_string)
            })
        }
        _ => None,
    }
}

/// The target that holds `file` by cargo's target auto-discovery: (name, kind, root source file).
fn target_of(file: &Path, dir: &Path, package: &str) -> (String, &'static str, PathBuf) {
    let crate_name = package.replace('-', "_");
    let Ok(relative) = file.strip_prefix(dir) else {
        return (crate_name, "lib", file.to_path_buf());
    };
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let stem = |part: &str| part.strip_suffix(".rs").unwrap_or(part).to_string();
    // `DIR/NAME.rs` or `DIR/NAME/main.rs` (and the modules below it).
    let in_dir = |skip: usize, kind: &'static str| {
        let name = stem(&parts[skip]);
        let root = if parts.len() == skip + 1 {
            file.to_path_buf()
        } else {
            dir.join(parts[..=skip].join("/")).join("main.rs")
        };
        (name, kind, root)
    };
    match parts.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["src", "bin", _, ..] => in_dir(2, "bin"),
        ["examples", _, ..] => in_dir(1, "example"),
        ["tests", _, ..] => in_dir(1, "test"),
        ["benches", _, ..] => in_dir(1, "bench"),
        _ if dir.join("src/lib.rs").is_file() => (crate_name, "lib", dir.join("src/lib.rs")),
        _ if dir.join("src/main.rs").is_file() => {
            (package.to_string(), "bin", dir.join("src/main.rs"))
        }
        _ => (crate_name, "lib", file.to_path_buf()),
    }
}

fn target_json(name: &str, kind: &str, src_path: &Path, edition: &str) -> Value {
    let crate_type = if kind == "lib" { "lib" } else { "bin" };
    json!({
        "kind": [kind],
        "crate_types": [crate_type],
        "name": name,
        "src_path": src_path.display().to_string(),
        "edition": edition,
        "doc": kind == "lib" || kind == "bin",
        "doctest": kind == "lib",
        "test": true,
    })
}

/// `file://` URL of an absolute directory, as cargo writes it in package ids.
fn file_url(dir: &Path) -> String {
    let text = dir.to_string_lossy().replace('\\', "/");
    if text.starts_with('/') {
        format!("file://{text}")
    } else {
        format!("file:///{text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::test_support::{diagnostic, fix, report};

    const TRAIN: &str = "fn train() {\n    for batch in batches {\n        let loss = model.forward(&batch)?;\n        tétal += loss.to_scalar::<f32>()?;\n        opt.backward_step(&loss)?;\n    }\n}\n";

    fn lines(report: &LintReport) -> Vec<Value> {
        let mut out = Vec::new();
        render(&mut out, report, &[]).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn spans_carry_byte_offsets_of_the_file_and_the_fix_is_a_suggestion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.rs");
        std::fs::write(&path, TRAIN).unwrap();
        let mut d = diagnostic(path.to_str().unwrap(), 4, 23, 41);
        let start = TRAIN.find("to_scalar").unwrap();
        d.fix = Some(fix(start, start + "to_scalar".len(), "to_vec0"));
        let lines = lines(&report(vec![d], vec![], 1));
        assert_eq!(lines.len(), 2);
        let message = &lines[0]["message"];
        let span = &message["spans"][0];
        let byte_start = span["byte_start"].as_u64().unwrap() as usize;
        let byte_end = span["byte_end"].as_u64().unwrap() as usize;
        assert_eq!(&TRAIN[byte_start..byte_end], "to_scalar::<f32>()");
        assert_eq!(span["text"][0]["highlight_start"], 23);
        assert_eq!(span["text"][0]["highlight_end"], 41);
        let suggestion = message["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| !c["spans"].as_array().unwrap().is_empty())
            .expect("the fix is a child with spans");
        let s = &suggestion["spans"][0];
        assert_eq!(s["suggested_replacement"], "to_vec0");
        assert_eq!(s["suggestion_applicability"], "MachineApplicable");
        assert_eq!(s["column_start"], 23);
        assert_eq!(s["column_end"], 32);
        assert_eq!(
            lines[1],
            json!({"reason": "build-finished", "success": false})
        );
    }

    #[test]
    fn the_target_follows_cargos_layout() {
        let dir = Path::new("/p");
        let pkg = "my-app";
        let cases = [
            ("/p/src/bin/tool.rs", ("tool", "bin", "/p/src/bin/tool.rs")),
            (
                "/p/src/bin/tool/util.rs",
                ("tool", "bin", "/p/src/bin/tool/main.rs"),
            ),
            (
                "/p/examples/demo.rs",
                ("demo", "example", "/p/examples/demo.rs"),
            ),
            ("/p/tests/it.rs", ("it", "test", "/p/tests/it.rs")),
            ("/elsewhere/x.rs", ("my_app", "lib", "/elsewhere/x.rs")),
        ];
        for (file, (name, kind, root)) in cases {
            let (n, k, r) = target_of(Path::new(file), dir, pkg);
            assert_eq!(
                (n.as_str(), k, r),
                (name, kind, PathBuf::from(root)),
                "{file}"
            );
        }
    }
}
