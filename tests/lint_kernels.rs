//! `perfkit lint kernels/` must flag exactly the anti-pattern code paths of the reference trainer
//! (one function each in `kernels/src/antipatterns.rs`) and nothing in the tuned path, without any
//! suppression comment helping it.

use std::collections::BTreeMap;
use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;
use syn::spanned::Spanned;

/// The anti-pattern functions and the rule each one demonstrates.
const EXPECTED: &[(&str, &str)] = &[
    ("read_loss_every_step", "PK101"),
    ("synchronize_every_step", "PK102"),
    ("scratch_from_host_zeros", "PK201"),
    ("alloc_scratch_every_step", "PK202"),
    ("upload_per_sample", "PK203"),
    ("upload_pageable", "PK303"),
];

const ANTIPATTERNS: &str = "kernels/src/antipatterns.rs";

/// Line ranges (first, last) of the top-level functions of the anti-pattern file.
fn function_lines(root: &Path) -> BTreeMap<String, (usize, usize)> {
    let source = std::fs::read_to_string(root.join(ANTIPATTERNS)).expect("read antipatterns.rs");
    let file = syn::parse_file(&source).expect("antipatterns.rs parses");
    file.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Fn(f) => {
                let span = f.span();
                Some((
                    f.sig.ident.to_string(),
                    (span.start().line, span.end().line),
                ))
            }
            _ => None,
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read kernels dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn kernels_crate_has_no_suppressions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("kernels"), &mut files);
    assert!(files.len() > 5, "kernels/ sources not found");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read source");
        assert!(
            !text.contains("perfkit: allow"),
            "{} hides a finding with a suppression comment",
            file.display()
        );
    }
}

#[test]
fn lint_flags_exactly_the_antipattern_paths() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let functions = function_lines(root);
    let output = Command::cargo_bin("perfkit")
        .expect("perfkit binary")
        .current_dir(root)
        .args(["lint", "kernels", "--format", "json"])
        .output()
        .expect("run perfkit lint");
    assert_eq!(
        output.status.code(),
        Some(1),
        "lint of kernels/ should report warnings; stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON output");
    assert_eq!(
        report["errors"].as_array().map(Vec::len),
        Some(0),
        "{report:#}"
    );

    let mut codes_by_function: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for finding in report["findings"].as_array().expect("findings array") {
        let path = finding["path"].as_str().expect("path");
        let line = finding["line"].as_u64().expect("line") as usize;
        let code = finding["code"].as_str().expect("code");
        assert_eq!(
            path, ANTIPATTERNS,
            "finding outside the anti-pattern paths: {finding:#}"
        );
        let (name, _) = functions
            .iter()
            .find(|(_, (first, last))| (*first..=*last).contains(&line))
            .unwrap_or_else(|| panic!("finding outside any function: {finding:#}"));
        let (_, expected_code) = EXPECTED.iter().find(|(f, _)| f == name).unwrap_or_else(|| {
            panic!("finding in `{name}`, which is no anti-pattern path: {finding:#}")
        });
        codes_by_function
            .entry(expected_code)
            .or_default()
            .push(code.to_string());
    }
    for (function, code) in EXPECTED {
        let found = codes_by_function.get(code).cloned().unwrap_or_default();
        assert!(
            found.iter().any(|c| c == code),
            "`{function}` should be flagged with {code}, found {found:?}"
        );
    }
}
