//! End-to-end tests of `perfkit lint`, `perfkit rules` and `perfkit rule`: they run the built binary over
//! the lint fixtures and over small crates written to temporary directories.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `perfkit` run from the repository root, with no colour or CI variables inherited.
fn perfkit() -> Command {
    let mut cmd = Command::cargo_bin("perfkit").expect("the perfkit binary is built");
    cmd.current_dir(root());
    for var in [
        "NO_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "CI",
        "GITHUB_ACTIONS",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// `perfkit` run from `dir`.
fn perfkit_in(dir: &Path) -> Command {
    let mut cmd = perfkit();
    cmd.current_dir(dir);
    cmd
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut Command) -> Run {
    let output = cmd.output().expect("perfkit runs");
    Run {
        code: output.status.code().expect("perfkit exits with a status"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// `perfkit lint fixtures/lint --format json`, run once for every test that reads it.
fn fixtures_json() -> &'static Run {
    static RUN: std::sync::OnceLock<Run> = std::sync::OnceLock::new();
    RUN.get_or_init(|| run(perfkit().args(["lint", "fixtures/lint", "--format", "json"])))
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout))
}

/// A candle training step loop with one host readback per step (PK101, a warning).
const READBACK_IN_LOOP: &str = r#"use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, VarBuilder, VarMap};

pub fn train(batches: &[(Tensor, Tensor)], device: &Device) -> candle_core::Result<f32> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::BF16, device);
    let model = candle_nn::linear(784, 10, vb)?;
    let mut opt = AdamW::new_lr(varmap.all_vars(), 1e-3)?;
    let mut last = 0.0;
    for (images, labels) in batches {
        let logits = images.apply(&model)?;
        let loss = candle_nn::loss::cross_entropy(&logits, labels)?;
        opt.backward_step(&loss)?;
        last = loss.to_scalar::<f32>()?;
    }
    Ok(last)
}
"#;

/// Code with no finding.
const CLEAN: &str = r#"pub fn add(a: u32, b: u32) -> u32 {
    a + b
}
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

const FINDING_KEYS: [&str; 10] = [
    "code",
    "name",
    "severity",
    "path",
    "line",
    "column",
    "end_line",
    "end_column",
    "message",
    "help",
];

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

#[test]
fn json_output_follows_schema_version_1_exactly() {
    let out = fixtures_json();
    assert_eq!(out.code, 1, "the fixtures have warnings: {}", out.stderr);
    let value = json(out);
    assert_eq!(
        keys(&value),
        ["errors", "files_scanned", "findings", "version"]
            .map(String::from)
            .into()
    );
    assert_eq!(value["version"], 1);
    assert!(value["files_scanned"].as_u64().unwrap() >= 3);
    let findings = value["findings"].as_array().unwrap();
    assert!(!findings.is_empty());
    for finding in findings {
        // A finding in a notebook has one more key, `cell`; every other finding has exactly these.
        let mut expected: BTreeSet<String> = FINDING_KEYS.map(String::from).into();
        if finding["path"].as_str().unwrap().ends_with(".ipynb") {
            assert!(
                finding["cell"].as_u64().is_some_and(|c| c >= 1),
                "{finding}"
            );
            expected.insert("cell".to_string());
        }
        assert_eq!(keys(finding), expected, "{finding}");
        for key in ["code", "name", "severity", "path", "message", "help"] {
            assert!(finding[key].is_string(), "{key} of {finding}");
        }
        for key in ["line", "column", "end_line", "end_column"] {
            assert!(
                finding[key].as_u64().is_some_and(|n| n >= 1),
                "{key} of {finding}"
            );
        }
        assert!(["error", "warning", "note"].contains(&finding["severity"].as_str().unwrap()));
        let path = finding["path"].as_str().unwrap();
        assert!(
            path.starts_with("fixtures/lint/")
                && [".rs", ".py", ".ipynb"]
                    .iter()
                    .any(|ext| path.ends_with(ext)),
            "relative path: {path}"
        );
        assert!(finding["code"].as_str().unwrap().starts_with("PK"));
        let message = finding["message"].as_str().unwrap();
        assert!(
            !message.ends_with('.'),
            "messages have no final period: {message}"
        );
    }
    assert_eq!(
        value["errors"],
        Value::Array(Vec::new()),
        "every fixture parses"
    );
    // Sorted by path, (notebook cell,) line, column.
    let order: Vec<(String, Option<u64>, u64, u64)> = findings
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f.get("cell").and_then(Value::as_u64),
                f["line"].as_u64().unwrap(),
                f["column"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
}

/// One `// expect:` marker: the file (relative to the repository root), its line, the code and the
/// severity it demands, if any.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Expected {
    path: String,
    line: u64,
    code: String,
    severity: Option<String>,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "rs" || ext == "py")
        {
            out.push(path);
        }
    }
}

/// Reads the markers of every fixture file (`// expect:` in Rust, `# expect:` in Python), by
/// fixture directory.
fn fixture_markers() -> BTreeMap<String, Vec<Expected>> {
    let fixtures = root().join("fixtures/lint");
    let mut by_dir = BTreeMap::new();
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let dir_name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let mut markers = Vec::new();
        for file in files {
            let relative = file
                .strip_prefix(root())
                .unwrap()
                .to_str()
                .unwrap()
                .replace('\\', "/");
            let marker = if relative.ends_with(".py") {
                "# expect:"
            } else {
                "// expect:"
            };
            for (index, line) in std::fs::read_to_string(&file).unwrap().lines().enumerate() {
                let Some(at) = line.find(marker) else {
                    continue;
                };
                for item in line[at + marker.len()..].split(',') {
                    let item = item.trim();
                    let (code, severity) = match item.split_once('(') {
                        Some((code, rest)) => (
                            code.trim(),
                            Some(rest.trim_end_matches(')').trim().to_string()),
                        ),
                        None => (item, None),
                    };
                    assert!(
                        code.starts_with("PK") && code.len() == 5,
                        "bad marker `{item}` in {relative}:{}",
                        index + 1
                    );
                    markers.push(Expected {
                        path: relative.clone(),
                        line: index as u64 + 1,
                        code: code.to_string(),
                        severity,
                    });
                }
            }
        }
        by_dir.insert(dir_name, markers);
    }
    by_dir
}

#[test]
fn every_marked_line_fires_and_no_look_alike_does() {
    let out = fixtures_json();
    let value = json(out);
    let findings = value["findings"].as_array().unwrap();
    let markers = fixture_markers();
    assert!(!markers.is_empty(), "there are lint fixtures");
    let mut problems = Vec::new();
    for (dir, expected) in &markers {
        // Strict for the directory's own rule and for every code that a marker of the directory names;
        // other codes may show up incidentally.
        let own = dir.split('-').next().unwrap().to_uppercase();
        let strict: BTreeSet<String> = expected
            .iter()
            .map(|e| e.code.clone())
            .chain([own])
            .collect();
        let prefix = format!("fixtures/lint/{dir}/");
        let found: Vec<&Value> = findings
            .iter()
            .filter(|f| {
                f["path"].as_str().unwrap().starts_with(&prefix)
                    && strict.contains(f["code"].as_str().unwrap())
            })
            .collect();
        for marker in expected {
            let hit = found.iter().find(|f| {
                f["path"] == marker.path.as_str()
                    && f["line"] == marker.line
                    && f["code"] == marker.code.as_str()
            });
            match hit {
                None => problems.push(format!(
                    "missed: {}:{} {}",
                    marker.path, marker.line, marker.code
                )),
                Some(f) => {
                    if let Some(severity) = &marker.severity
                        && f["severity"] != severity.as_str()
                    {
                        problems.push(format!(
                            "wrong severity at {}:{} {}: {} (expected {severity})",
                            marker.path, marker.line, marker.code, f["severity"]
                        ));
                    }
                }
            }
        }
        for f in &found {
            let marked = expected.iter().any(|m| {
                f["path"] == m.path.as_str() && f["line"] == m.line && f["code"] == m.code.as_str()
            });
            if !marked {
                problems.push(format!(
                    "unmarked finding: {}:{} {} {}",
                    f["path"], f["line"], f["code"], f["message"]
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn text_output_shows_the_source_line_help_and_rule_pointer() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "src/train.rs", READBACK_IN_LOOP);
    let out = run(perfkit_in(dir.path()).args(["lint", "src"]));
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let text = &out.stdout;
    assert!(text.contains("warning[PK101]: "), "{text}");
    assert!(text.contains(" --> src/train.rs:14:"), "{text}");
    assert!(
        text.contains("14 |         last = loss.to_scalar::<f32>()?;"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|line| line.trim_start().starts_with('|') && line.contains('^')),
        "{text}"
    );
    assert!(text.contains("= help: "), "{text}");
    assert!(
        text.contains("= note: rule host-readback-in-step-loop; see `perfkit rule PK101`"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with("1 file scanned: 1 warning"),
        "{text}"
    );
    // Piped output has no colour, and stderr (not a terminal) gets no progress bar.
    assert!(!text.contains('\u{1b}'), "{text}");
    assert_eq!(out.stderr, "");
}

#[test]
fn colour_follows_clicolor_force_and_no_color() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "src/train.rs", READBACK_IN_LOOP);
    let forced = run(perfkit_in(dir.path())
        .args(["lint", "src"])
        .env("CLICOLOR_FORCE", "1"));
    assert!(
        forced.stdout.contains("\u{1b}["),
        "CLICOLOR_FORCE gives colour: {}",
        forced.stdout
    );
    let off = run(perfkit_in(dir.path())
        .args(["lint", "src"])
        .env("CLICOLOR_FORCE", "1")
        .env("NO_COLOR", "1"));
    assert!(
        !off.stdout.contains('\u{1b}'),
        "NO_COLOR wins: {}",
        off.stdout
    );
    assert_eq!(forced.code, 1);
    assert_eq!(off.code, 1);
    // Machine formats never carry colour.
    let json_forced = run(perfkit_in(dir.path())
        .args(["lint", "src", "--format", "json"])
        .env("CLICOLOR_FORCE", "1"));
    assert!(!json_forced.stdout.contains('\u{1b}'));
}

#[test]
fn exit_codes_follow_the_severity_of_the_findings() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "clean/src/lib.rs", CLEAN);
    write(dir.path(), "dirty/src/train.rs", READBACK_IN_LOOP);

    let clean = run(perfkit_in(dir.path()).args(["lint", "clean"]));
    assert_eq!(clean.code, 0, "{}{}", clean.stdout, clean.stderr);
    assert!(
        clean.stdout.contains("1 file scanned: no findings"),
        "{}",
        clean.stdout
    );

    let dirty = run(perfkit_in(dir.path()).args(["lint", "dirty", "--format", "json"]));
    assert_eq!(dirty.code, 1);
    assert_eq!(json(&dirty)["findings"][0]["code"], "PK101");

    let zero = run(perfkit_in(dir.path()).args(["lint", "dirty", "--exit-zero"]));
    assert_eq!(zero.code, 0);
    assert!(zero.stdout.contains("warning[PK101]"));

    // Both paths at once, and the default path `.`.
    let both = run(perfkit_in(dir.path()).args(["lint", "clean", "dirty", "--format", "json"]));
    assert_eq!(json(&both)["files_scanned"], 2);
    let default = run(perfkit_in(dir.path()).args(["lint", "--format", "json"]));
    assert_eq!(default.code, 1);
    assert_eq!(json(&default)["files_scanned"], 2);
}

#[test]
fn an_unparsable_file_is_reported_and_the_others_are_still_linted() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "src/train.rs", READBACK_IN_LOOP);
    write(
        dir.path(),
        "src/broken.rs",
        "fn broken( {\n    let x = ;\n}\n",
    );
    std::fs::write(dir.path().join("src/binary.rs"), [0xff, 0xfe, 0x00, 0x41]).unwrap();

    let out = run(perfkit_in(dir.path()).args(["lint", "src", "--format", "json"]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    let value = json(&out);
    let errors = value["errors"].as_array().unwrap();
    let paths: Vec<&str> = errors.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["src/binary.rs", "src/broken.rs"]);
    for error in errors {
        let allowed: BTreeSet<String> = ["path", "message", "line"].map(String::from).into();
        assert!(keys(error).is_subset(&allowed), "{error}");
        assert!(!error["message"].as_str().unwrap().is_empty());
    }
    assert!(
        errors[1]["line"].as_u64().is_some_and(|line| line >= 1),
        "a syntax error has a line"
    );
    assert_eq!(
        value["findings"][0]["code"], "PK101",
        "the file that parses is still linted"
    );

    // Text: `error: path:line: message`, and --exit-zero does not hide errors.
    let text = run(perfkit_in(dir.path()).args(["lint", "src", "--exit-zero"]));
    assert_eq!(text.code, 2);
    assert!(
        text.stdout.contains("error: src/broken.rs:"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("warning[PK101]"), "{}", text.stdout);
}

#[test]
fn select_and_ignore_take_codes_and_prefixes() {
    let all = json(fixtures_json());
    let codes = |value: &Value| -> BTreeSet<String> {
        value["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["code"].as_str().unwrap().to_string())
            .collect()
    };
    let every = codes(&all);
    assert!(
        every.len() >= 2,
        "the fixtures exercise several rules: {every:?}"
    );
    // Not PK000: an unused suppression is only reported while its rule is enabled.
    let first = every.iter().find(|c| *c != "PK000").unwrap().clone();

    let only = json(&run(perfkit().args([
        "lint",
        "fixtures/lint",
        "--format",
        "json",
        "--select",
        &first,
    ])));
    assert_eq!(codes(&only), BTreeSet::from([first.clone()]));

    let family = &first[..3];
    let by_prefix = json(&run(perfkit().args([
        "lint",
        "fixtures/lint",
        "--format",
        "json",
        "--select",
        family,
    ])));
    assert!(
        codes(&by_prefix)
            .iter()
            .all(|code| code.starts_with(family))
    );
    assert!(codes(&by_prefix).contains(&first));

    let ignored = json(&run(perfkit().args([
        "lint",
        "fixtures/lint",
        "--format",
        "json",
        "--ignore",
        &first,
    ])));
    let rest = codes(&ignored);
    assert!(!rest.contains(&first));
    assert_eq!(rest.len(), every.len() - 1);

    let second = every.iter().nth(1).unwrap().clone();
    let list = format!("{first},{second}");
    let listed = json(&run(perfkit().args([
        "lint",
        "fixtures/lint",
        "--format",
        "json",
        "--select",
        &list,
    ])));
    assert_eq!(codes(&listed), BTreeSet::from([first.clone(), second]));

    let unknown = run(perfkit().args(["lint", "fixtures/lint", "--select", "PK999"]));
    assert_eq!(unknown.code, 2);
    assert!(unknown.stderr.contains("PK999"), "{}", unknown.stderr);

    // An empty selection (`--select "$RULES"` with nothing in the variable) is an error, not
    // every rule; a trailing comma is not an empty selection.
    for empty in ["", ",", " , "] {
        let out = run(perfkit().args(["lint", "fixtures/lint", "--select", empty]));
        assert_eq!(out.code, 2, "{empty:?}: {}", out.stdout);
        assert!(
            out.stderr.contains("--select: no rule code given"),
            "{empty:?}: {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{empty:?}: {}", out.stdout);
    }
    let trailing = json(&run(perfkit().args([
        "lint",
        "fixtures/lint",
        "--format",
        "json",
        "--select",
        &format!("{first},"),
    ])));
    assert_eq!(codes(&trailing), BTreeSet::from([first]));
}

#[test]
fn configuration_errors_name_the_key_or_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "src/train.rs", READBACK_IN_LOOP);
    write(
        dir.path(),
        "perfkit.toml",
        "min-batch-size = 32\nno-such-key = true\n",
    );
    let out = run(perfkit_in(dir.path()).args(["lint", "src"]));
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    // An error entry of the report, which names the file; its files are not linted.
    assert!(
        out.stdout.contains("perfkit.toml: invalid configuration")
            && out.stdout.contains("no-such-key")
            && !out.stdout.contains("PK101"),
        "{}",
        out.stdout
    );

    let missing = run(perfkit_in(dir.path()).args(["lint", "src", "--config", "missing.toml"]));
    assert_eq!(missing.code, 2);
    assert!(
        missing.stderr.contains("missing.toml"),
        "{}",
        missing.stderr
    );

    // A valid --config file is used instead of the one found upward.
    write(dir.path(), "other.toml", "ignore = [\"PK101\"]\n");
    let configured = run(perfkit_in(dir.path()).args([
        "lint",
        "src",
        "--config",
        "other.toml",
        "--format",
        "json",
    ]));
    assert_eq!(configured.code, 0, "{}", configured.stderr);
    assert_eq!(json(&configured)["findings"], Value::Array(Vec::new()));
}

#[test]
fn bad_flags_are_usage_errors() {
    let bad_format = run(perfkit().args(["lint", "fixtures/lint", "--format", "xml"]));
    assert_eq!(bad_format.code, 2);
    assert!(bad_format.stderr.contains("xml"));
    let bad_jobs = run(perfkit().args(["lint", "fixtures/lint", "--jobs", "0"]));
    assert_eq!(bad_jobs.code, 2);
    assert!(bad_jobs.stderr.contains("--jobs"), "{}", bad_jobs.stderr);
    let missing = run(perfkit().args(["lint", "no/such/dir"]));
    assert_eq!(missing.code, 2);
    assert!(missing.stdout.contains("no/such/dir") || missing.stderr.contains("no/such/dir"));
}

#[test]
fn jobs_do_not_change_the_result() {
    let one = run(perfkit().args(["lint", "fixtures/lint", "--format", "json", "--jobs", "1"]));
    let two = run(perfkit().args(["lint", "fixtures/lint", "--format", "json", "-j", "2"]));
    assert_eq!(one.stdout, two.stdout);
}

#[test]
fn github_format_writes_one_workflow_command_per_finding() {
    let value = json(fixtures_json());
    let findings = value["findings"].as_array().unwrap();
    let out = run(perfkit().args(["lint", "fixtures/lint", "--format", "github"]));
    assert_eq!(out.code, 1);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), findings.len());
    for (line, finding) in lines.iter().zip(findings) {
        let command = match finding["severity"].as_str().unwrap() {
            "error" => "error",
            "warning" => "warning",
            _ => "notice",
        };
        // A notebook's finding is annotated on the file, its cell and line in the title.
        let prefix = match finding.get("cell") {
            Some(cell) => format!(
                "::{command} file={},title={} {} (cell {cell}%2C line {})::",
                finding["path"].as_str().unwrap(),
                finding["code"].as_str().unwrap(),
                finding["name"].as_str().unwrap(),
                finding["line"],
            ),
            None => format!(
                "::{command} file={},line={},col={},endLine={},endColumn={},title={} {}::",
                finding["path"].as_str().unwrap(),
                finding["line"],
                finding["column"],
                finding["end_line"],
                finding["end_column"],
                finding["code"].as_str().unwrap(),
                finding["name"].as_str().unwrap(),
            ),
        };
        assert!(
            line.starts_with(&prefix),
            "{line}\nexpected prefix {prefix}"
        );
        assert!(!line[prefix.len()..].contains('\n'));
    }
}

#[test]
fn sarif_output_deserialises_as_sarif_2_1_0() {
    let value = json(fixtures_json());
    let findings = value["findings"].as_array().unwrap();
    let catalog = json(&run(perfkit().args(["rules", "--format", "json"])));

    let out = run(perfkit().args(["lint", "fixtures/lint", "--format", "sarif"]));
    assert_eq!(out.code, 1);
    let sarif: serde_sarif::sarif::Sarif = serde_json::from_str(&out.stdout).expect("valid SARIF");
    assert_eq!(serde_json::to_value(&sarif.version).unwrap(), "2.1.0");
    assert_eq!(sarif.runs.len(), 1);
    let run = &sarif.runs[0];
    let driver = &run.tool.driver;
    assert_eq!(driver.name, "perfkit");
    assert!(driver.version.is_some() && driver.information_uri.is_some());
    let rules = driver.rules.as_ref().expect("rules");
    // Every rule the linter knows is described; profile-only rules are not lint results.
    for rule in catalog
        .as_array()
        .unwrap()
        .iter()
        .filter(|rule| rule["kind"] != "profile")
    {
        let code = rule["code"].as_str().unwrap();
        let descriptor = rules
            .iter()
            .find(|r| r.id == code)
            .unwrap_or_else(|| panic!("{code} in SARIF rules"));
        assert_eq!(descriptor.name.as_deref(), rule["name"].as_str());
        assert_eq!(
            descriptor.short_description.as_ref().unwrap().text,
            rule["summary"].as_str().unwrap()
        );
        let full = descriptor
            .full_description
            .as_ref()
            .expect("full description");
        let summary = rule["summary"].as_str().unwrap();
        assert!(full.text.starts_with(summary), "{code}: {}", full.text);
        assert!(full.text.chars().count() <= 1024);
        let help = descriptor.help.as_ref().expect("help");
        let markdown = help.markdown.as_deref().unwrap();
        assert!(
            rule["doc"]
                .as_str()
                .unwrap()
                .starts_with(markdown.trim_end()),
            "{code}"
        );
        let level = descriptor
            .default_configuration
            .as_ref()
            .and_then(|c| c.level.as_ref())
            .expect("default level");
        assert_eq!(
            serde_json::to_value(level).unwrap(),
            rule["default_severity"]
        );
    }
    let results = run.results.as_ref().expect("results");
    assert_eq!(results.len(), findings.len());
    for (result, finding) in results.iter().zip(findings) {
        let id = result.rule_id.as_deref().unwrap();
        assert_eq!(id, finding["code"].as_str().unwrap());
        let index = result.rule_index.expect("rule index") as usize;
        assert_eq!(rules[index].id, id);
        assert_eq!(
            serde_json::to_value(result.level.as_ref().unwrap()).unwrap(),
            finding["severity"]
        );
        assert!(
            result
                .message
                .text
                .as_deref()
                .unwrap()
                .contains(finding["message"].as_str().unwrap())
        );
        let location = result.locations.as_ref().unwrap()[0]
            .physical_location
            .as_ref()
            .unwrap();
        let artifact = location.artifact_location.as_ref().unwrap();
        assert_eq!(artifact.uri.as_deref(), finding["path"].as_str());
        assert_eq!(artifact.uri_base_id.as_deref(), Some("%SRCROOT%"));
        if finding.get("cell").is_some() {
            // A notebook's cell lines are not lines of the file: no region.
            assert!(location.region.is_none());
            continue;
        }
        let region = location.region.as_ref().unwrap();
        assert_eq!(region.start_line, finding["line"].as_i64());
        assert_eq!(region.start_column, finding["column"].as_i64());
        assert_eq!(region.end_line, finding["end_line"].as_i64());
        assert_eq!(region.end_column, finding["end_column"].as_i64());
    }
    let invocation = &run.invocations.as_ref().unwrap()[0];
    assert!(invocation.execution_successful);
}

#[test]
fn sarif_reports_unparsable_files_as_notifications() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "src/train.rs", READBACK_IN_LOOP);
    write(dir.path(), "src/broken.rs", "fn broken( {\n");
    let out = run(perfkit_in(dir.path()).args(["lint", "src", "--format", "sarif"]));
    assert_eq!(out.code, 2);
    let sarif: serde_sarif::sarif::Sarif = serde_json::from_str(&out.stdout).expect("valid SARIF");
    let invocation = &sarif.runs[0].invocations.as_ref().unwrap()[0];
    assert!(!invocation.execution_successful);
    let notifications = invocation.tool_execution_notifications.as_ref().unwrap();
    assert_eq!(notifications.len(), 1);
    assert!(
        notifications[0]
            .message
            .text
            .as_deref()
            .unwrap()
            .contains("src/broken.rs")
    );
    assert_eq!(sarif.runs[0].results.as_ref().unwrap().len(), 1);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// SARIF results of `dir` as (code, has a fix).
fn sarif_codes(dir: &Path) -> Vec<(String, bool)> {
    let out = run(perfkit_in(dir).args(["lint", ".", "--format", "sarif"]));
    let value: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        value["runs"][0]["invocations"][0]["executionSuccessful"], true,
        "{}",
        out.stdout
    );
    value["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["ruleId"].as_str().unwrap().to_string(),
                r.get("fixes").is_some(),
            )
        })
        .collect()
}

#[cfg(unix)]
#[test]
fn a_file_fix_could_not_write_is_an_error_entry_in_every_format() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.py");
    let text = "import torch\n\ndef f():\n    return torch.rand(2, 2).cuda()\n";
    std::fs::write(&model, text).unwrap();
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o444)).unwrap();
    let out = run(perfkit_in(dir.path()).args(["lint", "--fix", "--format", "json", "."]));
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    let value = json(&out);
    let errors = value["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{value}");
    assert_eq!(errors[0]["path"], "model.py");
    let message = errors[0]["message"].as_str().unwrap();
    assert!(message.starts_with("the file is read-only"), "{message}");
    let out = run(perfkit_in(dir.path()).args(["lint", "--fix", "--format", "github", "."]));
    assert!(
        out.stdout
            .contains("::error file=model.py,title=perfkit lint::the file is read-only"),
        "{}",
        out.stdout
    );
    assert_eq!(std::fs::read_to_string(&model).unwrap(), text);
}

#[test]
fn fix_rewrites_cpu_tensor_then_copy_and_the_findings_go() {
    let fixture = root().join("fixtures/lint/pk201-cpu-tensor-then-copy");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("pk201");
    copy_dir(&fixture, &copy);

    let before = sarif_codes(&copy);
    let fixable = before
        .iter()
        .filter(|(code, fix)| code == "PK201" && *fix)
        .count();
    let unfixable = before
        .iter()
        .filter(|(code, fix)| code == "PK201" && !*fix)
        .count();
    assert!(
        fixable >= 2,
        "the fixture has fixable PK201 findings: {before:?}"
    );

    let mut originals = Vec::new();
    rust_files(&copy, &mut originals);
    let texts_before: Vec<String> = originals
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();

    let fixed = run(perfkit_in(&copy).args(["lint", ".", "--fix", "--format", "json"]));
    assert!(
        fixed.stderr.contains(&format!("fixed {fixable} findings")),
        "{}",
        fixed.stderr
    );
    let after_report = json(&fixed);
    assert_eq!(
        after_report["errors"],
        Value::Array(Vec::new()),
        "every fixed file still parses"
    );
    let remaining = after_report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "PK201")
        .count();
    assert_eq!(
        remaining, unfixable,
        "only the findings without a fix remain"
    );

    // A fresh run agrees, the files changed, and none is left with a fixable PK201.
    let after = sarif_codes(&copy);
    assert!(
        !after.iter().any(|(code, fix)| code == "PK201" && *fix),
        "{after:?}"
    );
    let texts_after: Vec<String> = originals
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_ne!(texts_before, texts_after);
    // No temporary files are left next to the fixed ones.
    let mut files_after = Vec::new();
    rust_files(&copy, &mut files_after);
    assert_eq!(files_after, originals);
    // Nothing else to fix: a second --fix changes nothing.
    let again = run(perfkit_in(&copy).args(["lint", ".", "--fix", "--format", "json"]));
    assert!(
        again.stderr.is_empty() || again.stderr.contains("fixed 0"),
        "{}",
        again.stderr
    );
    let texts_again: Vec<String> = originals
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(texts_after, texts_again);
}

#[test]
fn a_runtime_only_code_given_to_the_linter_is_named_as_one() {
    // The linter's list of codes only `perfkit profile` measures is the runtime catalog's.
    let lint: BTreeSet<&str> = perfkit_lint::rules()
        .iter()
        .map(|rule| rule.meta().code)
        .collect();
    let runtime_only: Vec<&str> = perfkit_reports::rules::RULES
        .iter()
        .map(|rule| rule.code)
        .filter(|code| !lint.contains(code))
        .collect();
    assert_eq!(runtime_only, perfkit_lint::config::RUNTIME_ONLY_CODES);
    let out = run(perfkit().args(["lint", "--select", "PK601", "fixtures/python"]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "--select: `PK601` is measured by `perfkit profile` only; the linter has no check for it"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn rules_lists_the_catalog() {
    let table = run(perfkit().args(["rules"]));
    assert_eq!(table.code, 0);
    let catalog = json(&run(perfkit().args(["rules", "--format", "json"])));
    let rules = catalog.as_array().unwrap();
    assert!(rules.len() >= 14, "PK101 to PK503: {}", rules.len());
    for rule in rules {
        let code = rule["code"].as_str().unwrap();
        let name = rule["name"].as_str().unwrap();
        assert!(
            table
                .stdout
                .lines()
                .any(|line| line.starts_with(code) && line.contains(name)),
            "{code} in:\n{}",
            table.stdout
        );
        assert!(["error", "warning", "note"].contains(&rule["default_severity"].as_str().unwrap()));
        assert!(rule["fixable"].is_boolean());
        assert!(!rule["summary"].as_str().unwrap().is_empty());
    }
    assert!(
        rules
            .iter()
            .any(|rule| rule["code"] == "PK201" && rule["fixable"] == true)
    );
    // One catalog: lint rules, profile-only rules, and codes both halves know.
    let kind = |code: &str| {
        rules
            .iter()
            .find(|rule| rule["code"] == code)
            .map(|rule| rule["kind"].clone())
    };
    assert_eq!(kind("PK201"), Some(Value::from("lint")));
    assert_eq!(kind("PK101"), Some(Value::from("both")));
    for code in ["PK601", "PK602", "PK603", "PK604"] {
        assert_eq!(kind(code), Some(Value::from("profile")), "{code}");
    }
    let codes: Vec<&str> = rules
        .iter()
        .map(|rule| rule["code"].as_str().unwrap())
        .collect();
    let mut sorted = codes.clone();
    sorted.sort_unstable();
    assert_eq!(codes, sorted);
    for code in [
        "PK101", "PK102", "PK104", "PK105", "PK201", "PK202", "PK203", "PK301", "PK302", "PK303",
        "PK401", "PK402", "PK403", "PK501", "PK502", "PK503",
    ] {
        assert!(
            rules.iter().any(|rule| rule["code"] == code),
            "{code} listed"
        );
    }
}

#[test]
fn rule_prints_the_documentation() {
    let doc = run(perfkit().args(["rule", "PK101"]));
    assert_eq!(doc.code, 0);
    assert!(
        doc.stdout.starts_with("PK101 host-readback-in-step-loop"),
        "{}",
        doc.stdout
    );
    for section in [
        "## What it does",
        "## Why is this bad?",
        "## Example",
        "Use instead:",
    ] {
        assert!(
            doc.stdout.contains(section),
            "{section} in:\n{}",
            doc.stdout
        );
    }
    let lower = run(perfkit().args(["rule", "pk101"]));
    assert_eq!(lower.stdout, doc.stdout);

    // A rule that both halves know also says what the profiler measures.
    assert!(
        doc.stdout.contains("## Measured by `perfkit profile`"),
        "{}",
        doc.stdout
    );
    let runtime = run(perfkit().args(["rule", "PK601"]));
    assert_eq!(runtime.code, 0);
    assert!(
        runtime
            .stdout
            .starts_with("PK601 gpu-idle-gaps (profile only"),
        "{}",
        runtime.stdout
    );

    let unknown = run(perfkit().args(["rule", "PK999"]));
    assert_eq!(unknown.code, 2);
    assert!(unknown.stderr.contains("PK999"), "{}", unknown.stderr);
    assert!(unknown.stdout.is_empty());
}

#[test]
fn suppressions_silence_a_finding_and_unused_ones_are_notes() {
    let dir = tempfile::tempdir().unwrap();
    let suppressed = READBACK_IN_LOOP.replace(
        "last = loss.to_scalar::<f32>()?;",
        "last = loss.to_scalar::<f32>()?; // perfkit: allow(PK101)",
    );
    write(dir.path(), "src/train.rs", &suppressed);
    let out = run(perfkit_in(dir.path()).args(["lint", "src", "--format", "json"]));
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert_eq!(json(&out)["findings"], Value::Array(Vec::new()));

    let unused = format!("// perfkit: allow-file(PK102)\n{READBACK_IN_LOOP}");
    write(dir.path(), "src/train.rs", &unused);
    let out = run(perfkit_in(dir.path()).args(["lint", "src", "--format", "json"]));
    assert_eq!(out.code, 1);
    let value = json(&out);
    let codes: Vec<(&str, &str)> = value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["code"].as_str().unwrap(), f["severity"].as_str().unwrap()))
        .collect();
    assert_eq!(codes, [("PK000", "note"), ("PK101", "warning")]);
}

#[test]
fn a_closed_pipe_ends_the_run_quietly_with_its_verdict() {
    use std::io::Read;
    // SARIF of the fixtures is far larger than a pipe buffer, so the writer meets the closed pipe.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("perfkit"))
        .current_dir(root())
        .args(["lint", "fixtures/lint", "--format", "sarif"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    // The exit status says what the run found, as when the whole report is read: a gate that
    // pipes the report into `head` (under `set -o pipefail`) still fails on the findings.
    let whole = std::process::Command::new(assert_cmd::cargo::cargo_bin("perfkit"))
        .current_dir(root())
        .args(["lint", "fixtures/lint", "--format", "sarif"])
        .output()
        .unwrap();
    assert_ne!(whole.status.code(), Some(0));
    assert_eq!(status.code(), whole.status.code(), "{stderr}");
    assert_eq!(stderr, "");
}

#[test]
fn absolute_paths_are_reported_relative_to_the_current_directory() {
    let absolute = root().join("fixtures/lint/pk201-cpu-tensor-then-copy");
    let out = run(perfkit().args(["lint", absolute.to_str().unwrap(), "--format", "json"]));
    let value = json(&out);
    let findings = value["findings"].as_array().unwrap();
    assert!(!findings.is_empty());
    for finding in findings {
        let path = finding["path"].as_str().unwrap();
        assert!(
            path.starts_with("fixtures/lint/pk201-cpu-tensor-then-copy/src/")
                || path.starts_with("fixtures/lint/pk201-cpu-tensor-then-copy/python/"),
            "{path}"
        );
    }
    // From a subdirectory, the same files are one level up.
    let from_sub = run(perfkit_in(&root().join("src")).args([
        "lint",
        absolute.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let path = json(&from_sub)["findings"][0]["path"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        path.starts_with("../fixtures/lint/pk201-cpu-tensor-then-copy/"),
        "{path}"
    );
}

/// `cd here && perfkit lint ../other`: `here` is not above `other`, so neither its `perfkit.toml`
/// nor its `pyproject.toml` applies there (the ancestors of `here/../other` are taken on disk, not
/// through `here`).
#[test]
fn a_path_through_dot_dot_takes_the_configuration_above_it_not_the_current_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let here = dir.path().join("here");
    let other = dir.path().join("other");
    std::fs::create_dir_all(&here).expect("mkdir here");
    std::fs::create_dir_all(&other).expect("mkdir other");
    std::fs::write(here.join("perfkit.toml"), "ignore = [\"PK101\"]\n").expect("write config");
    std::fs::write(here.join("pyproject.toml"), "[project]\nname = \"here\"\n").expect("write");
    std::fs::write(
        other.join("train.py"),
        "import torch\n\n\
         def train(model, opt, loader):\n\
         \x20   for x, y in loader:\n\
         \x20       loss = model(x, y)\n\
         \x20       loss.backward()\n\
         \x20       opt.step()\n\
         \x20       print(loss.item())\n",
    )
    .expect("write train.py");
    let out = run(perfkit_in(&here).args(["lint", "--format", "json", "../other"]));
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("json report");
    let codes: Vec<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["code"].as_str())
        .collect();
    assert!(codes.contains(&"PK101"), "{}\n{}", out.stdout, out.stderr);
    // From inside `other`, the same file is linted the same way.
    let inside = run(perfkit_in(&other).args(["lint", "--format", "json", "."]));
    let inside: serde_json::Value = serde_json::from_str(&inside.stdout).expect("json report");
    assert_eq!(
        report["findings"].as_array().map(Vec::len),
        inside["findings"].as_array().map(Vec::len)
    );
}
