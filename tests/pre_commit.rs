//! `.pre-commit-hooks.yaml`: each hook is checked against what pre-commit requires of a hook,
//! then its entry is run the way pre-commit runs it: in the repository root, with the staged
//! files of the hook's types appended as arguments, the hook's environment (where `cargo
//! install` put perfkit) first on PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;

/// The keys of a hook that these tests read (pre-commit's own manifest schema has more, all
/// optional).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Hook {
    id: String,
    name: String,
    entry: String,
    language: String,
    #[serde(default)]
    description: Option<String>,
    /// pre-commit's `types`: a file must carry every one of these tags.
    #[serde(default)]
    types: Vec<String>,
    /// pre-commit's `types_or`: a file must carry at least one of these tags (when any).
    #[serde(default)]
    types_or: Vec<String>,
}

impl Hook {
    /// Whether pre-commit passes `file` to this hook: it carries every tag of `types` and, when
    /// `types_or` is given, one of its tags.
    fn takes(&self, file: &str) -> bool {
        let Some(ext) = Path::new(file).extension().and_then(|e| e.to_str()) else {
            return false;
        };
        let tagged = |tag: &String| identify_extensions(tag).unwrap().contains(&ext);
        self.types.iter().all(tagged)
            && (self.types_or.is_empty() || self.types_or.iter().any(tagged))
    }
}

fn hooks() -> Vec<Hook> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".pre-commit-hooks.yaml");
    let text = std::fs::read_to_string(&path).expect("read .pre-commit-hooks.yaml");
    serde_norway::from_str(&text).expect(".pre-commit-hooks.yaml is a list of hooks")
}

fn hook(id: &str) -> Hook {
    hooks()
        .into_iter()
        .find(|h| h.id == id)
        .unwrap_or_else(|| panic!("no hook {id}"))
}

#[test]
fn every_hook_has_what_pre_commit_requires() {
    let hooks = hooks();
    assert!(hooks.len() >= 2);
    let mut ids: Vec<&str> = hooks.iter().map(|h| h.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), hooks.len(), "hook ids are unique");
    for hook in &hooks {
        assert!(
            !hook.name.is_empty() && hook.description.is_some(),
            "{hook:?}"
        );
        // pre-commit's `rust` language builds the repository with `cargo install --path .`,
        // which installs the `perfkit` binary the entry runs.
        assert_eq!(hook.language, "rust", "{hook:?}");
        assert!(hook.entry.starts_with("perfkit lint"), "{hook:?}");
        assert!(
            !hook.types.is_empty() || !hook.types_or.is_empty(),
            "{hook:?}"
        );
        for t in hook.types.iter().chain(&hook.types_or) {
            assert!(identify_extensions(t).is_some(), "unknown type {t}");
        }
    }
    assert!(hooks.iter().any(|h| h.types == ["rust"]));
    assert!(hooks.iter().any(|h| h.types_or == ["python", "jupyter"]));
}

/// File extensions of the `identify` tags the hooks use (the library pre-commit selects files
/// with).
fn identify_extensions(tag: &str) -> Option<&'static [&'static str]> {
    match tag {
        "rust" => Some(&["rs"]),
        "python" => Some(&["py", "pyi"]),
        "jupyter" => Some(&["ipynb"]),
        _ => None,
    }
}

fn git(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    out
}

/// A git repository in `dir` with `files` written and staged.
fn staged_repo(dir: &Path, files: &[(&str, &str)]) {
    git(dir, &["init", "-q"]);
    for (rel, text) in files {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    git(dir, &["add", "."]);
}

/// Runs `hook` as pre-commit does: the staged files (added, copied, modified, renamed) whose
/// type the hook takes, appended to its entry, in the repository root. `None` when no staged
/// file is of its types (pre-commit then skips the hook).
fn run_hook(hook: &Hook, repo: &Path) -> Option<(Vec<String>, Output)> {
    let staged = git(
        repo,
        &[
            "diff",
            "--staged",
            "--name-only",
            "--no-ext-diff",
            "--diff-filter=ACMRTUXB",
        ],
    );
    let files: Vec<String> = String::from_utf8(staged.stdout)
        .unwrap()
        .lines()
        .filter(|f| hook.takes(f))
        .map(str::to_string)
        .collect();
    if files.is_empty() {
        return None;
    }
    let bin_dir: PathBuf = Path::new(env!("CARGO_BIN_EXE_perfkit"))
        .parent()
        .unwrap()
        .to_path_buf();
    let mut paths = vec![bin_dir];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let mut words = hook.entry.split_whitespace();
    let program = words.next().unwrap();
    let out = Command::new(program)
        .args(words)
        .args(&files)
        .current_dir(repo)
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env_remove("NO_COLOR")
        .output()
        .expect("run the hook's entry");
    Some((files, out))
}

/// A training function with a literal batch size of 4 (PK502), shared with the other CI-tool test.
const BAD_RS: &str = include_str!("data/small_batch_train.rs.txt");

#[test]
fn the_rust_hook_fails_a_commit_with_a_finding_and_passes_a_clean_one() {
    let hook = hook("perfkit-lint");
    let tmp = tempfile::tempdir().unwrap();
    staged_repo(
        tmp.path(),
        &[
            ("src/train.rs", BAD_RS),
            ("src/clean.rs", "pub fn f() {}\n"),
            ("notes.md", "not linted\n"),
        ],
    );
    let (files, out) = run_hook(&hook, tmp.path()).expect("Rust files are staged");
    assert_eq!(files, ["src/clean.rs", "src/train.rs"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("warning[PK502]"), "{stdout}");
    assert!(stdout.contains("src/train.rs:2:22"), "{stdout}");
    assert!(stdout.contains("2 files scanned"), "{stdout}");

    // The finding fixed and staged again: the hook passes.
    let fixed = BAD_RS.replace("batch_size = 4", "batch_size = 64");
    std::fs::write(tmp.path().join("src/train.rs"), fixed).unwrap();
    git(tmp.path(), &["add", "src/train.rs"]);
    let (_, out) = run_hook(&hook, tmp.path()).unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // No Rust file staged: pre-commit skips the hook.
    let other = tempfile::tempdir().unwrap();
    staged_repo(other.path(), &[("notes.md", "text\n")]);
    assert!(run_hook(&hook, other.path()).is_none());
}

#[test]
fn the_python_hook_lints_the_staged_python_files() {
    let hook = hook("perfkit-lint-python");
    let tmp = tempfile::tempdir().unwrap();
    let bad = "import torch\n\
        \n\
        def train(model, opt, loader):\n\
        \x20   total = 0.0\n\
        \x20   for x, y in loader:\n\
        \x20       loss = model(x, y)\n\
        \x20       opt.zero_grad()\n\
        \x20       loss.backward()\n\
        \x20       opt.step()\n\
        \x20       total += loss.item()\n\
        \x20   return total\n";
    staged_repo(
        tmp.path(),
        &[("train.py", bad), ("lib.rs", "pub fn f() {}\n")],
    );
    let (files, out) = run_hook(&hook, tmp.path()).expect("a Python file is staged");
    assert_eq!(files, ["train.py"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("PK101") && stdout.contains("train.py:10"),
        "{stdout}"
    );

    // A notebook alone is passed to the same hook: the loop in its second cell is reported there.
    let cells: Vec<serde_json::Value> = [&bad[..bad.find("def train").unwrap()], &bad[bad.find("def train").unwrap()..]]
        .iter()
        .map(|code| serde_json::json!({"cell_type": "code", "metadata": {}, "execution_count": null, "outputs": [], "source": code}))
        .collect();
    let notebook =
        serde_json::json!({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5});
    let other = tempfile::tempdir().unwrap();
    staged_repo(
        other.path(),
        &[
            ("explore.ipynb", &notebook.to_string()),
            ("notes.md", "text\n"),
        ],
    );
    let (files, out) = run_hook(&hook, other.path()).expect("a notebook is staged");
    assert_eq!(files, ["explore.ipynb"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("PK101") && stdout.contains("explore.ipynb:cell 2:8"),
        "{stdout}"
    );
}
