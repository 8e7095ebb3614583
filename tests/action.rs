//! `action.yml`: checked against GitHub's metadata syntax for actions (the structure its schema
//! requires of a composite action), then run here: each step's condition is evaluated, each
//! `run` step's script is run with bash as the runner runs it (`bash --noprofile --norc -eo
//! pipefail`), with the inputs substituted, `$GITHUB_OUTPUT` and `$GITHUB_STEP_SUMMARY` set to
//! files, and the built perfkit on PATH; a `uses` step is checked for what it would be given.
//! The install step (`cargo install` of this repository, a release build) is skipped with
//! `install: false`; `.ci/run` builds perfkit from its packaged crate instead.

#[path = "../reports/tests/synth/mod.rs"]
mod synth;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_norway::{Mapping, Value};
use synth::{Workload, trace_bytes};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn action() -> Mapping {
    let text = std::fs::read_to_string(root().join("action.yml")).expect("read action.yml");
    serde_norway::from_str(&text).expect("action.yml is YAML")
}

fn get<'a>(map: &'a Mapping, key: &str) -> Option<&'a Value> {
    map.get(Value::String(key.to_string()))
}

fn str_of<'a>(map: &'a Mapping, key: &str) -> Option<&'a str> {
    get(map, key).and_then(Value::as_str)
}

fn keys(map: &Mapping) -> Vec<String> {
    map.keys()
        .map(|k| k.as_str().expect("keys are strings").to_string())
        .collect()
}

fn is_identifier(id: &str) -> bool {
    let mut chars = id.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The structure GitHub's action metadata schema asks of a composite action
/// (docs.github.com, "Metadata syntax for GitHub Actions").
#[test]
fn action_yml_follows_the_metadata_syntax_of_a_composite_action() {
    let action = action();
    for key in keys(&action) {
        assert!(
            [
                "name",
                "author",
                "description",
                "inputs",
                "outputs",
                "runs",
                "branding"
            ]
            .contains(&key.as_str()),
            "unknown top-level key {key}"
        );
    }
    assert!(str_of(&action, "name").is_some_and(|s| !s.is_empty()));
    assert!(str_of(&action, "description").is_some_and(|s| !s.is_empty()));

    let inputs = get(&action, "inputs").and_then(Value::as_mapping).unwrap();
    for (id, input) in inputs {
        let id = id.as_str().unwrap();
        assert!(is_identifier(id), "input id {id}");
        let input = input.as_mapping().unwrap();
        for key in keys(input) {
            assert!(
                ["description", "required", "default", "deprecationMessage"]
                    .contains(&key.as_str()),
                "input {id}: unknown key {key}"
            );
        }
        assert!(
            str_of(input, "description").is_some_and(|s| !s.is_empty()),
            "input {id}"
        );
        if let Some(required) = get(input, "required") {
            assert!(required.is_bool(), "input {id}: required is a boolean");
        }
        if let Some(default) = get(input, "default") {
            assert!(default.is_string(), "input {id}: default is a string");
        }
    }

    let runs = get(&action, "runs").and_then(Value::as_mapping).unwrap();
    assert_eq!(str_of(runs, "using"), Some("composite"));
    let steps = get(runs, "steps").and_then(Value::as_sequence).unwrap();
    assert!(!steps.is_empty());
    let mut step_ids: Vec<String> = Vec::new();
    for step in steps {
        let step = step.as_mapping().unwrap();
        for key in keys(step) {
            assert!(
                [
                    "name",
                    "id",
                    "if",
                    "run",
                    "shell",
                    "uses",
                    "with",
                    "env",
                    "working-directory",
                    "continue-on-error"
                ]
                .contains(&key.as_str()),
                "step key {key}"
            );
        }
        let run = get(step, "run").is_some();
        let uses = str_of(step, "uses");
        assert!(run != uses.is_some(), "a step has run or uses: {step:?}");
        if run {
            assert!(
                ["bash", "sh", "pwsh", "python", "cmd", "powershell"]
                    .contains(&str_of(step, "shell").unwrap_or("")),
                "a run step names its shell: {step:?}"
            );
        }
        if let Some(uses) = uses {
            let (name, version) = uses.split_once('@').expect("uses: OWNER/REPO@REF");
            assert!(name.contains('/') && !version.is_empty(), "{uses}");
        }
        if let Some(id) = str_of(step, "id") {
            assert!(is_identifier(id) && !step_ids.contains(&id.to_string()));
            step_ids.push(id.to_string());
        }
        // Every expression names an input that exists, or a step before this one.
        for text in expressions_of(&Value::Mapping(step.clone())) {
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c))) {
                if let Some(input) = word.strip_prefix("inputs.") {
                    assert!(get(inputs, input).is_some(), "unknown input {input}");
                }
                if let Some(rest) = word.strip_prefix("steps.") {
                    let id = rest.split('.').next().unwrap();
                    assert!(step_ids.contains(&id.to_string()), "unknown step {id}");
                }
            }
        }
    }

    let outputs = get(&action, "outputs").and_then(Value::as_mapping).unwrap();
    for (id, output) in outputs {
        let output = output.as_mapping().unwrap();
        assert!(str_of(output, "description").is_some(), "output {id:?}");
        // A composite action's outputs say where their value comes from.
        assert!(
            str_of(output, "value").is_some_and(|v| v.contains("${{")),
            "output {id:?}"
        );
    }

    let branding = get(&action, "branding")
        .and_then(Value::as_mapping)
        .unwrap();
    assert!(
        [
            "white",
            "black",
            "yellow",
            "blue",
            "green",
            "orange",
            "red",
            "purple",
            "gray-dark"
        ]
        .contains(&str_of(branding, "color").unwrap())
    );
    assert!(str_of(branding, "icon").is_some());
}

/// Every `${{ ... }}` in `value` (strings inside it), and the `if` conditions.
fn expressions_of(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match value {
        Value::String(s) => {
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${{") {
                let end = rest[start..].find("}}").expect("closed expression") + start;
                out.push(rest[start + 3..end].trim().to_string());
                rest = &rest[end + 2..];
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map {
                if k.as_str() == Some("if") {
                    out.push(v.as_str().unwrap().to_string());
                } else {
                    out.extend(expressions_of(v));
                }
            }
        }
        Value::Sequence(seq) => seq.iter().for_each(|v| out.extend(expressions_of(v))),
        _ => {}
    }
    out
}

/// The contexts a step's expressions can read.
struct Context {
    inputs: BTreeMap<String, String>,
    steps: BTreeMap<String, BTreeMap<String, String>>,
    failed: bool,
}

impl Context {
    /// The value of `inputs.X`, `steps.ID.outputs.X`, `github.action_path` or a string literal.
    fn value(&self, expr: &str) -> String {
        let expr = expr.trim();
        if let Some(lit) = expr.strip_prefix('\'').and_then(|e| e.strip_suffix('\'')) {
            return lit.to_string();
        }
        if let Some(name) = expr.strip_prefix("inputs.") {
            return self.inputs[name].clone();
        }
        if let Some(rest) = expr.strip_prefix("steps.") {
            let (id, output) = rest.split_once(".outputs.").expect("steps.ID.outputs.NAME");
            return self
                .steps
                .get(id)
                .and_then(|o| o.get(output))
                .cloned()
                .unwrap_or_default();
        }
        if expr == "github.action_path" {
            return root().display().to_string();
        }
        panic!("expression not understood by this test: {expr}");
    }

    /// A step's `if`: terms joined by `&&`, each `always()`, `success()`, `failure()`,
    /// `A == B` or `A != B`. Without `always()` or `failure()` a step runs only while no step
    /// before it failed, as on GitHub.
    fn condition(&self, text: Option<&str>) -> bool {
        let text = text.unwrap_or("success()");
        let mut status_checked = false;
        let mut result = true;
        for term in text.split("&&").map(str::trim) {
            let value = match term {
                "always()" => {
                    status_checked = true;
                    true
                }
                "success()" => {
                    status_checked = true;
                    !self.failed
                }
                "failure()" => {
                    status_checked = true;
                    self.failed
                }
                _ => {
                    if let Some((a, b)) = term.split_once("!=") {
                        self.value(a) != self.value(b)
                    } else if let Some((a, b)) = term.split_once("==") {
                        self.value(a) == self.value(b)
                    } else {
                        panic!("condition not understood by this test: {term}");
                    }
                }
            };
            result &= value;
        }
        if !status_checked {
            result &= !self.failed;
        }
        result
    }

    fn substitute(&self, text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${{") {
            let end = rest[start..].find("}}").unwrap() + start;
            out.push_str(&rest[..start]);
            out.push_str(&self.value(&rest[start + 3..end]));
            rest = &rest[end + 2..];
        }
        out.push_str(rest);
        out
    }
}

/// What running the action gave.
#[derive(Debug)]
struct ActionRun {
    /// Exit status of each `run` step that ran, by step name.
    exits: Vec<(String, i32)>,
    /// `uses` steps that would run, with their `with` values substituted.
    uses: Vec<(String, BTreeMap<String, String>)>,
    outputs: BTreeMap<String, BTreeMap<String, String>>,
    summary: String,
    stdout: String,
}

/// Runs action.yml in `workspace` with `given` inputs over the defaults.
fn run_action(workspace: &Path, given: &[(&str, &str)]) -> ActionRun {
    let action = action();
    let mut ctx = Context {
        inputs: BTreeMap::new(),
        steps: BTreeMap::new(),
        failed: false,
    };
    for (id, input) in get(&action, "inputs").and_then(Value::as_mapping).unwrap() {
        let default = str_of(input.as_mapping().unwrap(), "default").unwrap_or("");
        ctx.inputs
            .insert(id.as_str().unwrap().to_string(), default.to_string());
    }
    for (k, v) in given {
        assert!(ctx.inputs.contains_key(*k), "no input {k}");
        ctx.inputs.insert(k.to_string(), v.to_string());
    }
    let runner = tempfile::tempdir().unwrap();
    let summary = runner.path().join("step_summary.md");
    std::fs::write(&summary, "").unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_perfkit")).parent().unwrap();
    let mut paths = vec![bin_dir.to_path_buf()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(paths).unwrap();

    let mut result = ActionRun {
        exits: Vec::new(),
        uses: Vec::new(),
        outputs: BTreeMap::new(),
        summary: String::new(),
        stdout: String::new(),
    };
    let runs = get(&action, "runs").and_then(Value::as_mapping).unwrap();
    let steps = get(runs, "steps").and_then(Value::as_sequence).unwrap();
    for (index, step) in steps.iter().enumerate() {
        let step = step.as_mapping().unwrap();
        let name = str_of(step, "name").unwrap_or("step").to_string();
        if !ctx.condition(str_of(step, "if")) {
            continue;
        }
        if let Some(uses) = str_of(step, "uses") {
            let mut with = BTreeMap::new();
            if let Some(w) = get(step, "with").and_then(Value::as_mapping) {
                for (k, v) in w {
                    with.insert(
                        k.as_str().unwrap().to_string(),
                        ctx.substitute(v.as_str().unwrap()),
                    );
                }
            }
            result.uses.push((uses.to_string(), with));
            continue;
        }
        let script = runner.path().join(format!("step{index}.sh"));
        std::fs::write(&script, ctx.substitute(str_of(step, "run").unwrap())).unwrap();
        let output_file = runner.path().join(format!("output{index}"));
        std::fs::write(&output_file, "").unwrap();
        let mut command = Command::new("bash");
        command
            .args(["--noprofile", "--norc", "-eo", "pipefail"])
            .arg(&script)
            .current_dir(workspace)
            .env("PATH", &path)
            .env("GITHUB_OUTPUT", &output_file)
            .env("GITHUB_STEP_SUMMARY", &summary)
            .env("GITHUB_ACTION_PATH", root())
            .env("GITHUB_WORKSPACE", workspace);
        if let Some(env) = get(step, "env").and_then(Value::as_mapping) {
            for (k, v) in env {
                command.env(k.as_str().unwrap(), ctx.substitute(v.as_str().unwrap()));
            }
        }
        let out = command.output().expect("run bash");
        result
            .stdout
            .push_str(&String::from_utf8_lossy(&out.stdout));
        let code = out.status.code().unwrap_or(-1);
        result.exits.push((name, code));
        if code != 0 {
            ctx.failed = true;
        }
        if let Some(id) = str_of(step, "id") {
            let text = std::fs::read_to_string(&output_file).unwrap();
            let outputs = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>();
            ctx.steps.insert(id.to_string(), outputs.clone());
            result.outputs.insert(id.to_string(), outputs);
        }
    }
    result.summary = std::fs::read_to_string(&summary).unwrap();
    result
}

/// A training function with a literal batch size of 4 (PK502), shared with the other CI-tool test.
const SMALL_BATCH: &str = include_str!("data/small_batch_train.rs.txt");

#[test]
fn the_lint_gate_annotates_writes_the_summary_and_uploads_sarif() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join("src")).unwrap();
    std::fs::write(ws.path().join("src/train.rs"), SMALL_BATCH).unwrap();
    let run = run_action(ws.path(), &[("install", "false"), ("lint", "src")]);

    // The check failed on the finding, with an annotation on the line.
    assert_eq!(run.exits, [("perfkit check".to_string(), 1)], "{run:?}");
    assert_eq!(run.outputs["check"]["exit-code"], "1");
    assert!(
        run.stdout.contains("::warning file=src/train.rs,line=2"),
        "{}",
        run.stdout
    );
    // The job summary.
    assert!(run.summary.contains("PK502"), "{}", run.summary);
    // SARIF written, and uploaded although the check failed.
    assert_eq!(run.outputs["check"]["sarif"], "perfkit.sarif");
    let sarif: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ws.path().join("perfkit.sarif")).unwrap()).unwrap();
    assert_eq!(sarif["version"], "2.1.0");
    assert_eq!(sarif["runs"][0]["results"][0]["ruleId"], "PK502");
    assert_eq!(run.uses.len(), 1, "{run:?}");
    let (uses, with) = &run.uses[0];
    assert!(uses.starts_with("github/codeql-action/upload-sarif@"));
    assert_eq!(with["sarif_file"], "perfkit.sarif");

    // Without upload, nothing is uploaded; a clean tree passes.
    std::fs::write(
        ws.path().join("src/train.rs"),
        SMALL_BATCH.replace("= 4", "= 64"),
    )
    .unwrap();
    let run = run_action(
        ws.path(),
        &[
            ("install", "false"),
            ("lint", "src"),
            ("upload-sarif", "false"),
        ],
    );
    assert_eq!(run.exits, [("perfkit check".to_string(), 0)], "{run:?}");
    assert!(run.uses.is_empty());
    assert!(!run.summary.is_empty());
}

/// A run directory holding one synthetic trace.
fn run_dir(root: &Path, name: &str, wl: &Workload) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("trace")).unwrap();
    std::fs::write(
        dir.join("trace/train-7.pktrace"),
        trace_bytes("train", 7, None, 0, wl),
    )
    .unwrap();
    dir
}

#[test]
fn the_regression_gate_runs_when_a_baseline_is_given() {
    let ws = tempfile::tempdir().unwrap();
    let base = run_dir(ws.path(), "base", &Workload::tuned());
    let slower = run_dir(
        ws.path(),
        "slower",
        &Workload {
            data_ns: 1_500_000,
            seed: 5,
            ..Workload::tuned()
        },
    );
    let given = |candidate: &Path| {
        run_action(
            ws.path(),
            &[
                ("install", "false"),
                ("lint", ""),
                ("baseline", base.to_str().unwrap()),
                ("candidate", candidate.to_str().unwrap()),
            ],
        )
    };
    let run = given(&slower);
    assert_eq!(run.exits, [("perfkit check".to_string(), 1)], "{run:?}");
    assert!(run.stdout.contains("::error"), "{}", run.stdout);
    assert!(run.summary.contains("step"), "{}", run.summary);
    // No lint gate: no SARIF, nothing uploaded.
    assert!(!run.outputs["check"].contains_key("sarif"));
    assert!(run.uses.is_empty());

    let run = given(&base);
    assert_eq!(run.exits, [("perfkit check".to_string(), 0)], "{run:?}");

    // A baseline without a candidate is a usage error, said as an annotation.
    let run = run_action(
        ws.path(),
        &[("install", "false"), ("baseline", base.to_str().unwrap())],
    );
    assert_eq!(run.exits, [("perfkit check".to_string(), 2)], "{run:?}");
    assert!(run.stdout.contains("needs a candidate"), "{}", run.stdout);
}
