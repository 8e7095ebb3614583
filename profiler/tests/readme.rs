//! The README's instrumentation example is `examples/readme_instrument.rs`, which cargo builds
//! with these tests: the README must show it verbatim, its dependency line must be the one the
//! hint for an uninstrumented program prints, and the program, run with `PERFKIT_TRACE`, must
//! record every batch fetch in a `data` span on the thread that runs the steps (the span the
//! runtime PK301 reads).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use perfkit_profiler::model::Record;
use perfkit_profiler::{TraceReader, trace_files};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fenced blocks of `lang` in the README's "Instrumenting your program" section.
fn blocks(lang: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme
        .split("### Instrumenting your program\n")
        .nth(1)
        .and_then(|s| s.split("\n### ").next())
        .expect("an \"Instrumenting your program\" section");
    let fence = format!("```{lang}\n");
    section
        .split(&fence)
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_shows_the_example_verbatim() {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/readme_instrument.rs"),
    )
    .expect("the example");
    assert_eq!(blocks("rust"), vec![example]);
}

#[test]
fn the_dependency_line_works_from_a_clone_and_is_the_hints() {
    let toml_block = blocks("toml");
    assert_eq!(toml_block.len(), 1, "{toml_block:?}");
    let table: toml::Table = toml_block[0].parse().expect("the README's TOML parses");
    let dep = &table["dependencies"]["perfkit-profiler"];
    // A path dependency on a clone named `perfkit` beside the user's project: the crate is
    // in `profiler/` of this repository, whose directory is named as the repository.
    let path = dep["path"].as_str().expect("a path dependency");
    assert_eq!(path, "../perfkit/profiler");
    let manifest = std::fs::read_to_string(repo().join("profiler/Cargo.toml")).expect("manifest");
    assert!(manifest.contains("name = \"perfkit-profiler\""));
    // The hint prints the same line.
    let line = toml_block[0]
        .lines()
        .find(|l| l.starts_with("perfkit-profiler"))
        .expect("the dependency line");
    assert!(
        perfkit_profiler::summary::INSTRUMENT_HINT.contains(line),
        "{}",
        perfkit_profiler::summary::INSTRUMENT_HINT
    );
    assert!(!perfkit_profiler::summary::INSTRUMENT_HINT.contains("\"0.1\""));
}

/// The example's executable, built with cargo (as the user would) and found from cargo's
/// JSON messages.
fn example_exe() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "perfkit-profiler",
            "--example",
            "readme_instrument",
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run cargo to build the example");
    assert!(out.status.success(), "building the example failed");
    let stdout = String::from_utf8(out.stdout).expect("cargo output is UTF-8");
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact" && m["target"]["name"] == "readme_instrument"
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reports the example's executable")
}

#[test]
fn the_example_records_each_batch_fetch_in_a_data_span_on_the_step_thread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(example_exe())
        .env(perfkit_profiler::TRACE_ENV, dir.path())
        .output()
        .expect("run the example (cargo builds it with the tests)");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 50 steps\n");
    let files = trace_files(dir.path()).expect("trace files");
    assert_eq!(files.len(), 1, "{files:?}");
    let mut reader = TraceReader::open(&files[0]).expect("open trace");
    // Spans by name: how many, on which threads, opened from which line of the example.
    let mut spans: BTreeMap<
        String,
        (
            usize,
            Vec<perfkit_profiler::model::ThreadIndex>,
            Vec<String>,
        ),
    > = BTreeMap::new();
    for record in reader.by_ref() {
        if let Record::SpanNew(s) = record.expect("readable record") {
            let entry = spans.entry(s.callsite.name.to_string()).or_default();
            entry.0 += 1;
            if !entry.1.contains(&s.thread) {
                entry.1.push(s.thread);
            }
            let loc = format!(
                "{}:{}",
                s.callsite.file.as_deref().unwrap_or("?"),
                s.callsite.line.unwrap_or(0)
            );
            if !entry.2.contains(&loc) {
                entry.2.push(loc);
            }
        }
    }
    let (steps, step_threads, _) = spans.get("step").expect("step spans");
    let (fetches, data_threads, data_lines) = spans.get("data").expect("data spans");
    assert_eq!(*steps, 50);
    // One fetch per step, plus the one that found the loader empty.
    assert_eq!(*fetches, 51);
    assert_eq!(data_threads, step_threads, "{spans:?}");
    assert_eq!(data_lines.len(), 1, "{data_lines:?}");
    assert!(
        data_lines[0].ends_with("readme_instrument.rs:10"),
        "{data_lines:?}"
    );
}
