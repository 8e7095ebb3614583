//! Lints every fixture package under `fixtures/lint/` and checks it against its `// expect:` markers,
//! takes an insta snapshot of its diagnostics, and checks that every rule has documentation, a
//! fixture and a snapshot.
//!
//! Marker format: a line that must produce a finding ends with `// expect: PK101`, several codes
//! `// expect: PK101, PK202`, a demanded severity `// expect: PK101(note)`. The check is strict for
//! every rule: every marked line fires with that code (and severity), no unmarked line fires with
//! any code (a finding of another rule needs its marker too, so that accepting a snapshot never
//! approves a new finding silently), and no code fires twice on one line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use perfkit_lint::{Diagnostic, LintOptions, Severity, lint, rules};

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/lint")
}

fn fixture_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_root())
        .expect("fixtures/lint exists")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    // `PERFKIT_FIXTURE=pk101 cargo test -p perfkit-lint --test fixtures` checks only matching fixtures.
    if let Ok(filter) = std::env::var("PERFKIT_FIXTURE") {
        dirs.retain(|d| d.to_string_lossy().contains(&filter));
    }
    dirs
}

/// One expectation: file (relative to the fixture dir), notebook cell, line (within the cell in
/// a notebook), code, optional severity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Expect {
    file: PathBuf,
    cell: Option<usize>,
    line: usize,
    code: String,
    severity: Option<Severity>,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "py" || e == "ipynb")
        {
            out.push(path);
        }
    }
}

/// The texts to read markers from: the file, or each code cell of a notebook with its number.
fn marker_texts(path: &Path, text: String) -> Result<Vec<(Option<usize>, String)>, String> {
    if path.extension().is_none_or(|e| e != "ipynb") {
        return Ok(vec![(None, text)]);
    }
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let cells = value["cells"].as_array().cloned().unwrap_or_default();
    Ok(cells
        .iter()
        .enumerate()
        .filter(|(_, cell)| cell["cell_type"] == "code")
        .filter_map(|(i, _)| {
            perfkit_lint::python::notebook::cell_source(&text, i + 1).map(|s| (Some(i + 1), s))
        })
        .collect())
}

/// Parses the `// expect: ...` markers of every `.rs` file of a fixture, and the `# expect: ...`
/// markers of every `.py` file and of every code cell of every `.ipynb` notebook.
fn parse_markers(dir: &Path) -> Result<Vec<Expect>, String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let rel = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
        let marker = if path.extension().is_some_and(|e| e == "rs") {
            "// expect:"
        } else {
            "# expect:"
        };
        for (cell, text) in marker_texts(&path, text)? {
            for (i, line) in text.lines().enumerate() {
                let Some(at) = line.find(marker) else {
                    continue;
                };
                for item in line[at + marker.len()..].split(',') {
                    let item = item.trim();
                    if item.is_empty() {
                        continue;
                    }
                    let (code, severity) = match item.split_once('(') {
                        Some((code, rest)) => {
                            let sev = match rest.trim_end_matches(')').trim() {
                                "note" => Severity::Note,
                                "warning" => Severity::Warning,
                                "error" => Severity::Error,
                                other => {
                                    return Err(format!(
                                        "{}:{}: bad severity `{other}` in marker",
                                        rel.display(),
                                        i + 1
                                    ));
                                }
                            };
                            (code.trim(), Some(sev))
                        }
                        None => (item, None),
                    };
                    if perfkit_lint::rule_by_code(code).is_none() {
                        return Err(format!(
                            "{}:{}: unknown code `{code}` in marker",
                            rel.display(),
                            i + 1
                        ));
                    }
                    out.push(Expect {
                        file: rel.clone(),
                        cell,
                        line: i + 1,
                        code: code.to_string(),
                        severity,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// `cell 3:` in a notebook, nothing elsewhere.
fn cell_label(cell: Option<usize>) -> String {
    cell.map(|c| format!("cell {c}:")).unwrap_or_default()
}

fn own_code(dir: &Path) -> String {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.split('-')
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase()
}

fn relative(dir: &Path, d: &Diagnostic) -> PathBuf {
    d.path.strip_prefix(dir).unwrap_or(&d.path).to_path_buf()
}

/// Renders the diagnostics of one fixture for its snapshot.
fn render(dir: &Path, diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for d in diagnostics {
        let cell = d.cell.map(|c| format!("cell {c}:")).unwrap_or_default();
        let _ = writeln!(
            out,
            "{}:{cell}{}:{}-{}:{}: {}[{} {}] {}",
            relative(dir, d).display(),
            d.region.line,
            d.region.column,
            d.region.end_line,
            d.region.end_column,
            d.severity,
            d.code,
            d.name,
            d.message
        );
        let _ = writeln!(out, "    help: {}", d.help);
        let prefix = format!("{}/", dir.display());
        for note in &d.notes {
            let _ = writeln!(
                out,
                "    note: {}",
                note.replace(&prefix, "").replace('\\', "/")
            );
        }
        if let Some(fix) = &d.fix {
            let _ = writeln!(out, "    fix: {} ({} edits)", fix.title, fix.edits.len());
        }
    }
    if out.is_empty() {
        out.push_str("(no diagnostics)\n");
    }
    out
}

/// Lints one fixture and returns its problems (empty: it matches its markers) and its diagnostics.
fn check_fixture(dir: &Path) -> (Vec<String>, Vec<Diagnostic>) {
    let mut problems = Vec::new();
    let expects = match parse_markers(dir) {
        Ok(expects) => expects,
        Err(err) => return (vec![err], Vec::new()),
    };
    let report = match lint(&LintOptions::new([dir])) {
        Ok(report) => report,
        Err(err) => return (vec![format!("lint failed: {err}")], Vec::new()),
    };
    for error in &report.errors {
        problems.push(format!(
            "file error: {}: {}",
            error.path.display(),
            error.message
        ));
    }

    // Every marker fires.
    for expect in &expects {
        let found = report.diagnostics.iter().find(|d| {
            d.code == expect.code
                && d.region.line == expect.line
                && d.cell == expect.cell
                && relative(dir, d) == expect.file
        });
        match found {
            None => problems.push(format!(
                "{}:{}{}: expected {} but nothing fired",
                expect.file.display(),
                cell_label(expect.cell),
                expect.line,
                expect.code
            )),
            Some(d) => {
                if let Some(severity) = expect.severity
                    && d.severity != severity
                {
                    problems.push(format!(
                        "{}:{}: expected {}({severity}) but it fired as {}",
                        expect.file.display(),
                        expect.line,
                        expect.code,
                        d.severity
                    ));
                }
            }
        }
    }
    // Nothing unmarked fires with a strict code.
    type Key = (PathBuf, Option<usize>, usize, String);
    let marked: BTreeMap<Key, ()> = expects
        .iter()
        .map(|e| ((e.file.clone(), e.cell, e.line, e.code.clone()), ()))
        .collect();
    let mut seen: BTreeSet<Key> = BTreeSet::new();
    for d in &report.diagnostics {
        let key = (relative(dir, d), d.cell, d.region.line, d.code.to_string());
        // One finding per code and line: a second one is a duplicate report.
        if !seen.insert(key.clone()) {
            problems.push(format!(
                "{}:{}{}: {} reported twice on this line",
                key.0.display(),
                cell_label(d.cell),
                d.region.line,
                d.code
            ));
        }
        if !marked.contains_key(&key) {
            problems.push(format!(
                "{}:{}{}: unexpected {} ({}): {}",
                key.0.display(),
                cell_label(d.cell),
                d.region.line,
                d.code,
                d.severity,
                d.message
            ));
        }
    }
    // The fixture format demands three cases that fire for the directory's own rule, in each
    // language the fixture has.
    let own = own_code(dir);
    for (language, extension, marker) in
        [("Rust", "rs", "// expect:"), ("Python", "py", "# expect:")]
    {
        let mut files = Vec::new();
        rust_files(dir, &mut files);
        if !files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == extension))
        {
            continue;
        }
        let own_fires = expects
            .iter()
            .filter(|e| e.code == own && e.file.extension().is_some_and(|x| x == extension))
            .count();
        if own_fires < 3 {
            problems.push(format!(
                "only {own_fires} `{marker} {own}` markers in {language} (at least 3 required)"
            ));
        }
    }
    (problems, report.diagnostics)
}

#[test]
fn fixtures_match_their_markers_and_snapshots() {
    let dirs = fixture_dirs();
    assert!(!dirs.is_empty(), "no fixture directories found");
    let mut failures = Vec::new();
    let mut rendered = Vec::new();
    for dir in &dirs {
        let (problems, diagnostics) = check_fixture(dir);
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let text = render(dir, &diagnostics);
        if !problems.is_empty() {
            for problem in problems {
                failures.push(format!("{name}: {problem}"));
            }
            failures.push(format!("{name}: diagnostics were:\n{text}"));
        }
        rendered.push((name, text));
    }
    assert!(
        failures.is_empty(),
        "fixture mismatches:\n{}",
        failures.join("\n")
    );
    for (name, text) in rendered {
        insta::assert_snapshot!(name, text);
    }
}

/// `PK101` -> `fixtures/lint/pk101-host-readback-in-step-loop`.
fn fixture_dir_of(code: &str, name: &str) -> PathBuf {
    fixtures_root().join(format!("{}-{name}", code.to_ascii_lowercase()))
}

#[test]
fn every_rule_has_docs_a_fixture_and_a_snapshot() {
    let snapshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut missing = Vec::new();
    for rule in rules() {
        let meta = rule.meta();
        for section in [
            "## What it does",
            "## Why is this bad?",
            "## Example",
            "Use instead:",
        ] {
            if !meta.doc.contains(section) {
                missing.push(format!("{}: documentation lacks `{section}`", meta.code));
            }
        }
        if meta.summary.trim().is_empty() {
            missing.push(format!("{}: empty summary", meta.code));
        }
        if meta.code == "PK000" {
            // The linter's own note: produced by the engine, covered by the suppression tests.
            continue;
        }
        let dir = fixture_dir_of(meta.code, meta.name);
        // A Rust fixture package, a Python fixture (`python/`), or both.
        if !dir.join("Cargo.toml").is_file() && !dir.join("python").is_dir() {
            missing.push(format!(
                "{}: no fixture package at {}",
                meta.code,
                dir.display()
            ));
        }
        if !meta.doc.contains("```python") {
            missing.push(format!(
                "{}: documentation lacks a Python example",
                meta.code
            ));
        }
        let snapshot = snapshots.join(format!(
            "fixtures__{}-{}.snap",
            meta.code.to_ascii_lowercase(),
            meta.name
        ));
        if !snapshot.is_file() {
            missing.push(format!("{}: no snapshot {}", meta.code, snapshot.display()));
        }
    }
    assert!(
        missing.is_empty(),
        "rules incomplete:\n{}",
        missing.join("\n")
    );
}

#[test]
fn rule_names_are_kebab_case_and_codes_unique() {
    let mut seen = BTreeSet::new();
    for rule in rules() {
        let meta = rule.meta();
        assert!(seen.insert(meta.code), "duplicate code {}", meta.code);
        assert!(
            meta.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '-'),
            "{} name `{}` is not kebab-case",
            meta.code,
            meta.name
        );
        assert!(!meta.summary.ends_with(".."), "{} summary", meta.code);
    }
}
