//! `perfkit lint` on Python code: `.py` files linted next to `.rs` files in one run, the JSON
//! output, `# noqa` and `# perfkit: allow` suppressions, `[tool.perfkit]` in `pyproject.toml`, a
//! file that does not parse, `--fix`, and the PyTorch scripts of `fixtures/python`.

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Run {
    code: i32,
    stdout: String,
}

fn lint_in(dir: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::cargo_bin("perfkit").expect("the perfkit binary is built");
    cmd.current_dir(dir).arg("lint").args(args);
    for var in [
        "NO_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "CI",
        "GITHUB_ACTIONS",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().expect("perfkit runs");
    Run {
        code: output.status.code().expect("an exit status"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
    }
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// (path, line, code, severity) of every finding.
fn findings(value: &Value) -> Vec<(String, u64, String, String)> {
    value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["line"].as_u64().unwrap(),
                f["code"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A PyTorch step loop that reads the loss back on every step (PK101 at line 8).
const TRAIN_PY: &str = concat!(
    "import torch\n",
    "\n",
    "def train(model, loader, opt, criterion):\n",
    "    for x, y in loader:\n",
    "        loss = criterion(model(x), y)\n",
    "        loss.backward()\n",
    "        opt.step()\n",
    "        print(loss.item())\n",
);

/// A candle step loop with a readback per step (PK101 at line 10).
const TRAIN_RS: &str = r#"use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer};

pub fn train(batches: &[Tensor], opt: &mut AdamW, device: &Device) -> candle_core::Result<f32> {
    let _ = device;
    let mut last = 0.0;
    for batch in batches {
        let loss = batch.sum_all()?;
        opt.backward_step(&loss)?;
        last = loss.to_scalar::<f32>()?;
    }
    Ok(last)
}
"#;

#[test]
fn python_and_rust_files_are_linted_in_one_run_with_one_json_report() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "rust/Cargo.toml",
        "[package]\nname = \"t\"\nversion = \"0.1.0\"\n\n[dependencies]\ncandle-core = \"0.9\"\ncandle-nn = \"0.9\"\n",
    );
    write(dir.path(), "rust/src/lib.rs", TRAIN_RS);
    write(dir.path(), "py/train.py", TRAIN_PY);
    let out = lint_in(dir.path(), &[".", "--format", "json"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let value = json(&out);
    assert_eq!(value["version"], 1);
    assert_eq!(value["files_scanned"], 2);
    assert_eq!(
        findings(&value),
        [
            (
                "py/train.py".to_string(),
                8,
                "PK101".to_string(),
                "warning".to_string()
            ),
            (
                "rust/src/lib.rs".to_string(),
                10,
                "PK101".to_string(),
                "warning".to_string()
            ),
        ]
    );
    let py = &value["findings"][0];
    assert_eq!(
        (py["column"].as_u64(), py["end_column"].as_u64()),
        (Some(20), Some(24))
    );
    assert!(
        py["message"].as_str().unwrap().contains("`.item()`"),
        "{py}"
    );
    // The text format shows the Python line like a Rust one.
    let text = lint_in(dir.path(), &["py"]);
    assert!(text.stdout.contains("warning[PK101]"), "{}", text.stdout);
    assert!(
        text.stdout.contains("print(loss.item())"),
        "{}",
        text.stdout
    );
}

#[test]
fn noqa_and_allow_comments_suppress_python_findings_and_strings_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let noqa = TRAIN_PY.replace(
        "print(loss.item())",
        "print(loss.item())  # noqa: E501, PK101",
    );
    write(dir.path(), "a/train.py", &noqa);
    let out = lint_in(dir.path(), &["a", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(findings(&json(&out)).is_empty());

    // Another tool's code alone suppresses nothing of perfkit's.
    let other = TRAIN_PY.replace("print(loss.item())", "print(loss.item())  # noqa: E501");
    write(dir.path(), "a/train.py", &other);
    assert_eq!(lint_in(dir.path(), &["a"]).code, 1);

    // A comment on the line above, and an unused code reported as PK000.
    let above = TRAIN_PY.replace(
        "        print(loss.item())",
        "        # perfkit: allow(PK101, PK102)\n        print(loss.item())",
    );
    write(dir.path(), "a/train.py", &above);
    let value = json(&lint_in(dir.path(), &["a", "--format", "json"]));
    assert_eq!(
        findings(&value),
        [(
            "a/train.py".to_string(),
            8,
            "PK000".to_string(),
            "note".to_string()
        )]
    );

    // Text in a string is not a comment.
    let string = TRAIN_PY.replace(
        "print(loss.item())",
        "print(loss.item(), \"# noqa: PK101 # perfkit: allow(PK101)\")",
    );
    write(dir.path(), "a/train.py", &string);
    let value = json(&lint_in(dir.path(), &["a", "--format", "json"]));
    assert_eq!(findings(&value).len(), 1, "{value}");
}

#[test]
fn tool_perfkit_in_pyproject_is_found_upward() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "pyproject.toml",
        "[project]\nname = \"t\"\n\n[tool.perfkit]\nignore = [\"PK101\"]\n",
    );
    write(dir.path(), "src/t/train.py", TRAIN_PY);
    let out = lint_in(dir.path(), &["src", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(findings(&json(&out)).is_empty());

    // Severity overrides apply to Python findings too.
    write(
        dir.path(),
        "pyproject.toml",
        "[tool.perfkit.severity]\nPK101 = \"error\"\n",
    );
    let value = json(&lint_in(dir.path(), &["src", "--format", "json"]));
    assert_eq!(findings(&value)[0].3, "error");

    // A bad key is a configuration error naming the file: an error entry, and the files it
    // configures are not linted.
    write(dir.path(), "pyproject.toml", "[tool.perfkit]\nselect = 3\n");
    let mut cmd = Command::cargo_bin("perfkit").unwrap();
    let output = cmd
        .current_dir(dir.path())
        .args(["lint", "src"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("pyproject.toml: invalid configuration")
            && stdout.contains("select")
            && !stdout.contains("PK101"),
        "{stdout}"
    );
}

#[test]
fn a_python_file_that_does_not_parse_is_an_error_entry_and_the_rest_is_linted() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "broken.py",
        "import torch\n\ndef f(:\n    pass\n",
    );
    write(dir.path(), "train.py", TRAIN_PY);
    let out = lint_in(dir.path(), &[".", "--format", "json"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    let value = json(&out);
    let errors = value["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{value}");
    assert_eq!(errors[0]["path"], "broken.py");
    assert_eq!(errors[0]["line"], 3);
    let message = errors[0]["message"].as_str().unwrap();
    assert!(message.starts_with("syntax error"), "{message}");
    // The package's other files were linted without the broken one's functions: the findings
    // may be incomplete, and the error says so.
    assert!(
        message.ends_with("; the rest of its package was linted without it"),
        "{message}"
    );
    assert_eq!(
        findings(&value),
        [(
            "train.py".to_string(),
            8,
            "PK101".to_string(),
            "warning".to_string()
        )]
    );
    // A file alone in its package is not part of anything else.
    let alone = tempfile::tempdir().unwrap();
    write(
        alone.path(),
        "broken.py",
        "def f(:
    pass
",
    );
    let value = json(&lint_in(alone.path(), &[".", "--format", "json"]));
    let message = value["errors"][0]["message"].as_str().unwrap();
    assert!(!message.contains("the rest of its package"), "{message}");
}

#[test]
fn fix_creates_python_tensors_on_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "make.py",
        "import torch\n\n\ndef make(n, device):\n    a = torch.rand(n, 2).cuda()\n    b = torch.zeros(n,).to(device)\n    c = torch.ones(()).to(device)\n    d = (torch.rand(n) * 2).cuda()\n    return a, b, c, d\n",
    );
    let out = lint_in(dir.path(), &["--fix", "make.py", "--format", "json"]);
    let fixed = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        fixed,
        "import torch\n\n\ndef make(n, device):\n    a = torch.rand(n, 2, device=\"cuda\")\n    b = torch.zeros(n, device=device)\n    c = torch.ones((), device=device)\n    d = (torch.rand(n) * 2).cuda()\n    return a, b, c, d\n"
    );
    // What remains: the arithmetic form, reported but not fixed.
    assert_eq!(
        findings(&json(&out)),
        [(
            "make.py".to_string(),
            8,
            "PK201".to_string(),
            "warning".to_string()
        )]
    );
}

/// A file with two names is fixed once, under either name, and a rewrite in place that fails
/// half-way (here: past the file-size limit, as a full disk would) leaves the original text.
#[cfg(unix)]
#[test]
fn fixes_of_a_hard_linked_file_are_written_once_and_never_half_way() {
    let dir = tempfile::tempdir().unwrap();
    let text = "import torch\n\n\ndef make(n):\n    return torch.rand(n).cuda()\n";
    let real = write(dir.path(), "real.py", text);
    std::fs::hard_link(&real, dir.path().join("alias.py")).unwrap();
    let out = lint_in(dir.path(), &["--fix", ".", "--format", "json"]);
    let fixed = std::fs::read_to_string(&real).unwrap();
    assert!(fixed.contains("torch.rand(n, device=\"cuda\")"), "{fixed}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("alias.py")).unwrap(),
        fixed
    );
    assert!(
        json(&out)["errors"].as_array().unwrap().is_empty(),
        "{}",
        out.stdout
    );

    // 1,700 fixes, each making its line longer, in a file of about 59 KB; the process may not
    // write a file past 64 KiB (`ulimit -f 128`: 512-byte blocks, as POSIX shells count them; with
    // SIGXFSZ ignored so that the write fails with
    // EFBIG instead of killing the process).
    let big: String = std::iter::once("import torch\n\n\ndef make():\n".to_string())
        .chain((0..1700).map(|i| format!("    x{i} = torch.rand({i}).cuda()\n")))
        .collect();
    assert!(big.len() < 64 * 1024, "{}", big.len());
    let big_path = write(dir.path(), "big.py", &big);
    std::fs::hard_link(&big_path, dir.path().join("big_alias.py")).unwrap();
    let perfkit = assert_cmd::cargo::cargo_bin("perfkit");
    let output = Command::new("sh")
        .current_dir(dir.path())
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 128 && exec \"$0\" lint --fix big.py")
        .arg(&perfkit)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("big.py: cannot apply fixes"), "{stderr}");
    assert!(!stderr.contains("damaged"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&big_path).unwrap(), big);
}

#[test]
fn the_pytorch_scripts_get_exactly_their_documented_findings() {
    let out = lint_in(&root(), &["fixtures/python", "--format", "json"]);
    let value = json(&out);
    assert!(value["errors"].as_array().unwrap().is_empty(), "{value}");
    let found: Vec<(String, u64, String)> = findings(&value)
        .into_iter()
        .map(|(path, line, code, _)| (path, line, code))
        .collect();
    let bad = "fixtures/python/train_bad.py".to_string();
    assert_eq!(
        found,
        [
            (bad.clone(), 33, "PK301".to_string()),
            // Full precision: no autocast or bfloat16 anywhere in the scripts.
            (bad.clone(), 35, "PK501".to_string()),
            (bad.clone(), 42, "PK303".to_string()),
            (bad.clone(), 44, "PK201".to_string()),
            (bad, 51, "PK101".to_string()),
        ],
        "train_good.py has none"
    );
}

/// A notebook (nbformat 4) with the given cells, `(cell_type, source)`; the source is written as
/// a list of lines, as Jupyter writes it.
fn notebook(cells: &[(&str, &str)]) -> String {
    let cells: Vec<Value> = cells
        .iter()
        .map(|(kind, source)| {
            let lines: Vec<String> = source.split_inclusive('\n').map(str::to_string).collect();
            serde_json::json!({"cell_type": kind, "metadata": {}, "source": lines, "outputs": [], "execution_count": null})
        })
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "cells": cells,
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }))
    .unwrap()
}

/// Cell 2 builds the loader, cell 4 trains over it and reads the loss back every step; the markdown
/// cell 3 counts in the numbering.
const TRAIN_NOTEBOOK: &[(&str, &str)] = &[
    ("code", "!pip install torch\nimport torch\n"),
    (
        "code",
        "from torch.utils.data import DataLoader\nloader = DataLoader(data, batch_size=64, num_workers=4, pin_memory=True)\n",
    ),
    ("markdown", "## Train\n"),
    (
        "code",
        "%%time\nfor x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n    opt.step()\n    print(loss.item())\n    torch.cuda.synchronize()  # noqa: PK102\n",
    ),
];

#[test]
fn notebook_cells_are_linted_as_one_module_and_findings_name_their_cell() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "nb/train.ipynb", &notebook(TRAIN_NOTEBOOK));
    write(dir.path(), "py/train.py", TRAIN_PY);
    let out = lint_in(dir.path(), &[".", "--format", "json", "--select", "PK1"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    let value = json(&out);
    assert_eq!(value["files_scanned"], 2);
    assert_eq!(
        findings(&value),
        [
            (
                "nb/train.ipynb".to_string(),
                6,
                "PK101".to_string(),
                "warning".to_string()
            ),
            (
                "py/train.py".to_string(),
                8,
                "PK101".to_string(),
                "warning".to_string()
            ),
        ]
    );
    let nb = &value["findings"][0];
    assert_eq!(nb["cell"], 4, "{nb}");
    assert_eq!(
        (nb["column"].as_u64(), nb["end_column"].as_u64()),
        (Some(16), Some(20))
    );
    // Findings outside notebooks have no `cell` field: the schema only grows.
    assert!(value["findings"][1].get("cell").is_none());

    // Text: the place reads `path:cell N:line:column` and the excerpt is the cell's own line.
    let text = lint_in(dir.path(), &["nb", "--select", "PK1"]);
    assert!(
        text.stdout.contains("nb/train.ipynb:cell 4:6:16"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("6 |     print(loss.item())"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("the step loop at nb/train.ipynb:cell 4:2"),
        "{}",
        text.stdout
    );

    // SARIF: the location is the file (a cell's lines are not the file's), the cell a property.
    let sarif = json(&lint_in(
        dir.path(),
        &["nb", "--select", "PK1", "--format", "sarif"],
    ));
    let result = &sarif["runs"][0]["results"][0];
    assert_eq!(result["properties"]["cell"], 4, "{result}");
    assert_eq!(result["properties"]["line"], 6, "{result}");
    assert!(
        result["locations"][0]["physicalLocation"]
            .get("region")
            .is_none(),
        "{result}"
    );
    assert!(
        result["message"]["text"]
            .as_str()
            .unwrap()
            .starts_with("cell 4, line 6: "),
        "{result}"
    );
    // GitHub annotations: on the file, the cell in the title.
    let github = lint_in(dir.path(), &["nb", "--select", "PK1", "--format", "github"]);
    assert!(
        github.stdout.starts_with(
            "::warning file=nb/train.ipynb,title=PK101 host-readback-in-step-loop (cell 4%2C line 6)::"
        ),
        "{}",
        github.stdout
    );
}

#[test]
fn a_malformed_notebook_is_an_error_entry_and_the_rest_is_linted() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "broken.ipynb",
        "{\n \"cells\": [\n  {\"cell_type\": \"code\",}\n ]\n}\n",
    );
    write(
        dir.path(),
        "syntax.ipynb",
        &notebook(&[("code", "import torch\n"), ("code", "def f(:\n    pass\n")]),
    );
    write(dir.path(), "train.py", TRAIN_PY);
    let out = lint_in(dir.path(), &[".", "--format", "json"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    let value = json(&out);
    let errors = value["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{value}");
    assert_eq!(errors[0]["path"], "broken.ipynb");
    assert_eq!(errors[0]["line"], 3);
    let message = errors[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("not a valid notebook: malformed JSON at column 24: trailing comma"),
        "{message}"
    );
    assert_eq!(errors[1]["path"], "syntax.ipynb");
    let message = errors[1]["message"].as_str().unwrap();
    assert!(
        message.starts_with("syntax error in cell 2, line 1: "),
        "{message}"
    );
    assert_eq!(
        findings(&value),
        [(
            "train.py".to_string(),
            8,
            "PK101".to_string(),
            "warning".to_string()
        )]
    );
}

#[test]
fn fix_does_not_rewrite_notebooks_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let make = "import torch\n\n\ndef make(n):\n    return torch.rand(n, 2).cuda()\n";
    let py = write(dir.path(), "make.py", make);
    let text = notebook(&[("code", make)]);
    let nb = write(dir.path(), "make.ipynb", &text);
    let output = Command::cargo_bin("perfkit")
        .unwrap()
        .current_dir(dir.path())
        .args([
            "lint", "--fix", "--format", "json", "--select", "PK201", ".",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("fixed 1 finding in 1 file; 1 finding in notebooks reported with no fix applied (perfkit does not rewrite .ipynb files)"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&nb).unwrap(), text);
    assert!(
        std::fs::read_to_string(&py)
            .unwrap()
            .contains("torch.rand(n, 2, device=\"cuda\")")
    );
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        findings(&value),
        [(
            "make.ipynb".to_string(),
            5,
            "PK201".to_string(),
            "warning".to_string()
        )]
    );
}

#[test]
fn a_byte_order_mark_is_not_a_column_of_the_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let line = "import torch; x = torch.zeros(3).cuda()\n";
    write(dir.path(), "bom.py", &format!("\u{feff}{line}"));
    write(dir.path(), "plain.py", line);
    let value = json(&lint_in(dir.path(), &[".", "--format", "json"]));
    let columns: Vec<(String, u64, u64)> = value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["column"].as_u64().unwrap(),
                f["end_column"].as_u64().unwrap(),
            )
        })
        .collect();
    // `torch.zeros` starts at column 19 of the line as an editor shows it, with or without a BOM.
    assert_eq!(
        columns,
        vec![
            ("bom.py".to_string(), 19, 30),
            ("plain.py".to_string(), 19, 30)
        ],
        "{value}"
    );
}
