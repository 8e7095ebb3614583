//! The engine end to end: walking, crates, configuration, suppressions, per-file errors and
//! pathological input. Inputs are generated in temporary directories.

use std::fs;
use std::path::{Path, PathBuf};

use perfkit_lint::{LintError, LintOptions, LintReport, Severity, lint};

/// A candle training loop with one readback per step (PK101 at line 9) and one per epoch under
/// a guard (line 11).
const CANDLE_LOOP: &str = r#"use candle_core::{DType, Device, Tensor};

pub fn train(model: &Model, opt: &mut Opt, batches: &[Tensor]) -> candle_core::Result<()> {
    let device = Device::cuda_if_available(0)?;
    for (step, batch) in batches.iter().enumerate() {
        let batch = batch.to_device(&device)?.to_dtype(DType::BF16)?;
        let loss = model.loss(&batch)?;
        opt.backward_step(&loss)?;
        let value = loss.to_scalar::<f32>()?;
        if step % 100 == 0 {
            println!("{value} {}", loss.to_vec0::<f32>()?);
        }
    }
    Ok(())
}
"#;

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create dirs");
    }
    fs::write(path, text).expect("write file");
}

fn package(dir: &Path, extra_toml: &str) {
    write(
        &dir.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"t\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[workspace]\n\n[dependencies]\ncandle-core = \"0.9\"\n{extra_toml}"
        ),
    );
}

/// Lints with the rules these tests are about (PK000 and the step-loop rules PK1xx).
fn run(paths: &[&Path]) -> LintReport {
    let options = LintOptions::new(paths.iter().map(|p| p.to_path_buf())).select(["PK0", "PK1"]);
    lint(&options).expect("lint runs")
}

fn codes_at(report: &LintReport, file: &str) -> Vec<(usize, &'static str, Severity)> {
    report
        .diagnostics
        .iter()
        .filter(|d| d.path.ends_with(file))
        .map(|d| (d.region.line, d.code, d.severity))
        .collect()
}

#[test]
fn a_training_loop_is_found_and_guards_lower_to_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 1);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        codes_at(&report, "train.rs"),
        vec![
            (9, "PK101", Severity::Warning),
            (11, "PK101", Severity::Note)
        ]
    );
    let first = &report.diagnostics[0];
    assert_eq!((first.region.column, first.region.end_column), (26, 35));
}

#[test]
fn bad_files_become_errors_and_the_rest_is_still_linted() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    write(
        &dir.path().join("src/broken.rs"),
        "fn ok() {}\n\nfn broken( {\n",
    );
    fs::write(dir.path().join("src/binary.rs"), b"\x7fELF\x00\x00\x01").expect("write");
    fs::write(
        dir.path().join("src/latin1.rs"),
        b"// ok\n// caf\xe9\nfn f() {}\n",
    )
    .expect("write");
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 4);
    let errors: Vec<(String, Option<usize>, &str)> = report
        .errors
        .iter()
        .map(|e| {
            let name = e
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, e.line, e.message.as_str())
        })
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].0 == "binary.rs" && errors[0].2.contains("binary"),
        "{errors:?}"
    );
    assert!(
        errors[1].0 == "broken.rs" && errors[1].2.starts_with("syntax error"),
        "{errors:?}"
    );
    assert_eq!(errors[1].1, Some(3), "{errors:?}");
    assert!(
        errors[2].0 == "latin1.rs" && errors[2].2.contains("UTF-8"),
        "{errors:?}"
    );
    assert_eq!(errors[2].1, Some(2));
    // The good file is still linted.
    assert_eq!(codes_at(&report, "train.rs").len(), 2);
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let depth = 10_000;
    // Brackets: caught before parsing.
    let parens = format!(
        "fn f() -> i32 {{ {}1{} }}\n",
        "(".repeat(depth),
        ")".repeat(depth)
    );
    write(&dir.path().join("parens.rs"), &parens);
    // Prefix operators: no brackets, parsed recursively by syn, bounded by the analysis.
    let unary = format!("fn g() -> i32 {{ {}1 }}\n", "- ".repeat(depth));
    write(&dir.path().join("unary.rs"), &unary);
    // A long method chain and a long sum: deep left-nested trees.
    let chain = format!("fn h(x: T) -> T {{ x{} }}\n", ".clone()".repeat(depth));
    write(&dir.path().join("chain.rs"), &chain);
    let sum = format!("fn s() -> i32 {{ 0{} }}\n", " + 1".repeat(depth));
    write(&dir.path().join("sum.rs"), &sum);
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 4);
    assert_eq!(report.errors.len(), 4, "{:?}", report.errors);
    for error in &report.errors {
        assert!(error.message.contains("nesting too deep"), "{error:?}");
        assert_eq!(error.line, Some(1), "{error:?}");
    }
}

#[test]
fn deep_rust_without_brackets_is_an_error_not_a_stack_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let depth = 60_000;
    // Forms that syn parses by recursion, one level per token or two, with no bracket to count:
    // generic types, pointer types, closures, `return`, assignments, unary operators.
    let sources = [
        format!(
            "type A = {}u8{};\n",
            "Vec<".repeat(depth),
            ">".repeat(depth)
        ),
        format!("type B = {}u8;\n", "*const ".repeat(depth)),
        format!("fn c() {{ let x = {}1; }}\n", "|| ".repeat(depth)),
        format!("fn d() {{ {}1; }}\n", "return ".repeat(depth)),
        format!("fn e() {{ {}1; }}\n", "a = ".repeat(depth)),
        format!("fn f() {{ let x = {}1; }}\n", "-".repeat(4 * depth)),
    ];
    for (i, source) in sources.iter().enumerate() {
        write(&dir.path().join(format!("f{i}.rs")), source);
    }
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, sources.len());
    assert_eq!(report.errors.len(), sources.len(), "{:?}", report.errors);
    for error in &report.errors {
        assert!(error.message.contains("nesting too deep"), "{error:?}");
        assert_eq!(error.line, Some(1), "{error:?}");
    }
}

#[test]
fn deep_python_expressions_are_an_error_not_a_stack_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Left-nested trees the parser builds without recursing deeply, but that a walk of the tree
    // would descend one level per call or operator.
    let chain = format!("import torch\n\nx = a{}\n", ".b()".repeat(200_000));
    write(&dir.path().join("chain.py"), &chain);
    let unary = format!("import torch\n\nx = {}1\n", "-".repeat(1_000_000));
    write(&dir.path().join("unary.py"), &unary);
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 2);
    assert_eq!(report.errors.len(), 2, "{:?}", report.errors);
    for error in &report.errors {
        assert!(error.message.contains("nesting too deep"), "{error:?}");
        assert_eq!(error.line, Some(3), "{error:?}");
    }
}

#[test]
fn a_huge_file_is_reported_without_being_parsed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge.rs");
    let line = "pub const X: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];\n";
    let mut text = String::with_capacity(50 * 1024 * 1024 + line.len());
    while text.len() < 50 * 1024 * 1024 {
        text.push_str(line);
    }
    fs::write(&path, text).expect("write");
    write(&dir.path().join("train.rs"), CANDLE_LOOP);
    let report = run(&[dir.path()]);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        report.errors[0].message.contains("too large"),
        "{:?}",
        report.errors
    );
    assert_eq!(codes_at(&report, "train.rs").len(), 2);
}

#[cfg(unix)]
#[test]
fn a_symlink_loop_is_reported_and_the_walk_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("src/nested");
    fs::create_dir_all(&sub).expect("mkdir");
    std::os::unix::fs::symlink(dir.path().join("src"), sub.join("back")).expect("symlink");
    std::os::unix::fs::symlink("self.rs", dir.path().join("self.rs")).expect("symlink");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    let report = run(&[dir.path()]);
    assert_eq!(
        codes_at(&report, "train.rs").len(),
        2,
        "{:?}",
        report.diagnostics
    );
    assert!(
        report.errors.iter().any(|e| e.message.contains("loop")),
        "{:?}",
        report.errors
    );
    // The self-referencing link, given directly, is an error too.
    let report = run(&[&dir.path().join("self.rs")]);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
}

#[cfg(unix)]
#[test]
fn a_directory_reached_through_a_link_too_is_linted_once_under_its_own_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("pkg/train.rs"), CANDLE_LOOP);
    // `alias` sorts before `pkg`: the spelling kept is the one not through the link.
    std::os::unix::fs::symlink("pkg", dir.path().join("alias")).expect("symlink");
    let report = run(&[dir.path()]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.files_scanned, 1, "{:?}", report.diagnostics);
    assert_eq!(codes_at(&report, "train.rs").len(), 2);
    assert!(
        report
            .diagnostics
            .iter()
            .all(|d| d.path.ends_with("pkg/train.rs")),
        "{:?}",
        report.diagnostics
    );
}

#[cfg(unix)]
#[test]
fn a_broken_symlink_is_named_as_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink("gone.py", dir.path().join("train.py")).expect("symlink");
    for path in [dir.path().to_path_buf(), dir.path().join("train.py")] {
        let report = run(&[&path]);
        assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
        let error = &report.errors[0];
        assert!(error.path.ends_with("train.py"), "{error:?}");
        assert_eq!(
            error.message, "broken symbolic link (gone.py does not exist)",
            "{error:?}"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_path_that_is_neither_a_file_nor_a_directory_is_an_error() {
    let report = run(&[Path::new("/dev/null")]);
    assert_eq!(report.files_scanned, 0);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert_eq!(
        report.errors[0].message,
        "not a regular file or a directory, not linted"
    );
}

#[test]
fn missing_paths_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = run(&[&dir.path().join("nope")]);
    assert_eq!(report.errors.len(), 1);
    assert_eq!(report.errors[0].message, "no such file or directory");
}

#[test]
fn a_file_named_several_ways_is_linted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    let src = dir.path().join("src");
    let train = src.join("train.rs");
    let report = run(&[
        &train,
        &src.join(".").join("train.rs"),
        &src.join("..").join("src").join("train.rs"),
        &src,
        dir.path(),
        &train,
    ]);
    assert_eq!(report.files_scanned, 1, "{:?}", report.diagnostics);
    assert_eq!(codes_at(&report, "train.rs").len(), 2);
    // A missing path given twice is one error.
    let missing = dir.path().join("nope.rs");
    let report = run(&[&missing, &dir.path().join(".").join("nope.rs")]);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
}

#[test]
fn gitignore_and_target_are_honoured() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(&dir.path().join(".gitignore"), "generated/\n");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    write(&dir.path().join("generated/train.rs"), CANDLE_LOOP);
    write(&dir.path().join("target/debug/build/train.rs"), CANDLE_LOOP);
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 1);
    assert!(
        report
            .diagnostics
            .iter()
            .all(|d| d.path.ends_with("src/train.rs"))
    );
}

#[test]
fn suppressions_on_the_line_above_and_file_wide_and_unused_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    let same_line = CANDLE_LOOP.replace(
        "let value = loss.to_scalar::<f32>()?;",
        "let value = loss.to_scalar::<f32>()?; // perfkit: allow(PK101)",
    );
    write(&dir.path().join("src/a.rs"), &same_line);
    let line_above = CANDLE_LOOP.replace(
        "        let value = loss.to_scalar::<f32>()?;",
        "        // perfkit: allow(pk101, PK102)\n        let value = loss.to_scalar::<f32>()?;",
    );
    write(&dir.path().join("src/b.rs"), &line_above);
    let file_wide = format!("// perfkit: allow-file(PK101)\n{CANDLE_LOOP}");
    write(&dir.path().join("src/c.rs"), &file_wide);
    let report = run(&[dir.path()]);
    assert_eq!(
        codes_at(&report, "a.rs"),
        vec![(11, "PK101", Severity::Note)]
    );
    // PK102 names nothing on that line: reported as an unused suppression.
    assert_eq!(
        codes_at(&report, "b.rs"),
        vec![(9, "PK000", Severity::Note), (12, "PK101", Severity::Note)]
    );
    let unused = report
        .diagnostics
        .iter()
        .find(|d| d.code == "PK000")
        .expect("PK000");
    assert!(unused.message.contains("PK102"), "{}", unused.message);
    assert_eq!(codes_at(&report, "c.rs"), vec![]);
}

#[test]
fn config_from_perfkit_toml_and_cargo_metadata() {
    let dir = tempfile::tempdir().expect("tempdir");
    // perfkit.toml: severity override and an extra step marker.
    let a = dir.path().join("a");
    package(&a, "");
    write(&a.join("perfkit.toml"), "[severity]\nPK101 = \"error\"\n");
    write(&a.join("src/train.rs"), CANDLE_LOOP);
    // Cargo.toml metadata: PK1 ignored.
    let b = dir.path().join("b");
    package(&b, "\n[package.metadata.perfkit]\nignore = [\"PK1\"]\n");
    write(&b.join("src/train.rs"), CANDLE_LOOP);
    let report = lint(&LintOptions::new([a.clone(), b.clone()])).expect("lint");
    let a_codes: Vec<_> = report
        .diagnostics
        .iter()
        .filter(|d| d.path.starts_with(&a))
        .map(|d| d.severity)
        .collect();
    assert_eq!(a_codes, vec![Severity::Error, Severity::Note]);
    assert!(report.diagnostics.iter().all(|d| !d.path.starts_with(&b)));
    // The command line selects on top of the configuration.
    let options = LintOptions::new([b.clone()]).select(["PK101"]);
    let report = lint(&options).expect("lint");
    assert_eq!(report.diagnostics.len(), 2);
}

#[test]
fn configured_step_markers_and_exclude_globs() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(
        &dir.path().join("perfkit.toml"),
        "step-markers = [\"apply_gradients\"]\nexclude = [\"src/generated\"]\n",
    );
    let custom = CANDLE_LOOP.replace(
        "opt.backward_step(&loss)?;",
        "trainer.apply_gradients(&loss)?;",
    );
    write(&dir.path().join("src/train.rs"), &custom);
    write(&dir.path().join("src/generated/train.rs"), CANDLE_LOOP);
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 1);
    assert_eq!(codes_at(&report, "train.rs").len(), 2);
}

#[test]
fn exclude_globs_hold_for_every_python_file_of_a_directory() {
    // Files of one directory are placed together; each is still matched against `exclude`.
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        &dir.path().join("pyproject.toml"),
        "[tool.perfkit]\nexclude = [\"pkg/b_*.py\"]\n",
    );
    let train = "import torch\nmodel = model.cuda()\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n    print(loss.item())\n";
    for name in ["a_train.py", "b_train.py", "c_train.py"] {
        write(&dir.path().join("pkg").join(name), train);
    }
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 2);
    assert_eq!(codes_at(&report, "a_train.py").len(), 1);
    assert!(codes_at(&report, "b_train.py").is_empty());
    assert_eq!(codes_at(&report, "c_train.py").len(), 1);
}

#[test]
fn config_errors_name_the_key_and_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    // A configuration found upward: an error entry naming the file and the key; its files are not
    // linted.
    let entry = |report: &perfkit_lint::LintReport| {
        assert_eq!(report.files_scanned, 0);
        assert!(report.diagnostics.is_empty());
        let error = &report.errors[0];
        assert!(error.path.ends_with("perfkit.toml"), "{error:?}");
        error.message.clone()
    };
    write(&dir.path().join("perfkit.toml"), "selcet = [\"PK1\"]\n");
    let text = entry(&lint(&LintOptions::new([dir.path()])).expect("a report"));
    assert!(text.contains("selcet"), "{text}");
    write(
        &dir.path().join("perfkit.toml"),
        "[severity]\nPK999 = \"error\"\n",
    );
    let text = entry(&lint(&LintOptions::new([dir.path()])).expect("a report"));
    assert!(text.contains("PK999"), "{text}");
    // Given with `--config`, it stops the run.
    let err = lint(&LintOptions::new([dir.path()]).config_file(dir.path().join("perfkit.toml")))
        .expect_err("bad --config");
    assert!(err.to_string().contains("PK999"), "{err}");
    let err = lint(
        &LintOptions::new([dir.path()])
            .select(["PK9"])
            .config_file(dir.path().join("Cargo.toml")),
    )
    .expect_err("bad flag");
    assert!(
        matches!(
            err,
            LintError::UnknownCode {
                flag: "--select",
                ..
            }
        ),
        "{err}"
    );
}

/// A manifest that is not valid TOML is never passed over without a word: holding perfkit's
/// table, it is a configuration error naming the file and line (the run cannot honour settings it
/// cannot read); otherwise the crate is still linted and the manifest is an error entry with its
/// line, since the crate's dependencies (its frameworks) are unknown.
#[test]
fn malformed_manifests_are_reported_with_their_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(&dir.path().join("src/train.rs"), CANDLE_LOOP);
    let manifest = dir.path().join("Cargo.toml");
    write(
        &manifest,
        "[package]\nname = \"t\"\nversion = \"0.0.0\"\n\n[dependencies]\ncandle-core = { version = \"0.9\"\n",
    );
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 1);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    let error = &report.errors[0];
    assert!(error.path.ends_with("Cargo.toml"), "{error:?}");
    assert_eq!(error.line, Some(6), "{error:?}");
    assert!(error.message.contains("not valid TOML"), "{error:?}");
    // The crate's own files are linted all the same.
    assert_eq!(
        codes_at(&report, "train.rs"),
        vec![
            (9, "PK101", Severity::Warning),
            (11, "PK101", Severity::Note)
        ]
    );

    // The same manifest with perfkit's table in it: its settings cannot be read, so its files are
    // not linted (rather than linted with the defaults) and the configuration is an error entry
    // with its line; the rest of the run goes on.
    write(
        &manifest,
        "[package]\nname = \"t\"\nversion = \"0.0.0\"\n\n[package.metadata.perfkit]\nselect = [\"PK1\"\n",
    );
    let other = tempfile::tempdir().expect("tempdir");
    write(
        &other.path().join("train.py"),
        "import torch\nx = torch.rand(2).cuda()\n",
    );
    let report = lint(&LintOptions::new([dir.path(), other.path()])).expect("the run goes on");
    let entry = report
        .errors
        .iter()
        .find(|e| e.path.ends_with("Cargo.toml"))
        .expect("the configuration is named");
    assert!(
        entry.message.contains("line 6") && entry.message.contains("not linted"),
        "{}",
        entry.message
    );
    assert!(codes_at(&report, "train.rs").is_empty());
    assert!(
        report
            .diagnostics
            .iter()
            .any(|d| d.code == "PK201" && d.path.ends_with("train.py")),
        "the other package is linted"
    );
    let pyproject = tempfile::tempdir().expect("tempdir");
    write(&pyproject.path().join("train.py"), "import torch\n");
    write(
        &pyproject.path().join("pyproject.toml"),
        "[tool.perfkit]\nselect = \"PK1\n",
    );
    let report = lint(&LintOptions::new([pyproject.path()])).expect("a report");
    let text = &report.errors[0].message;
    assert!(
        report.errors[0].path.ends_with("pyproject.toml") && text.contains("line 2"),
        "{text}"
    );
    assert_eq!(report.files_scanned, 0);
}

#[test]
fn crates_are_packages_and_calls_resolve_only_inside_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Package one: the loop calls `log_loss`, defined in another file of the same package.
    let one = dir.path().join("one");
    package(&one, "");
    write(
        &one.join("src/train.rs"),
        "pub fn train(opt: &mut O, xs: &[T]) { for x in xs { let loss = x.loss(); opt.backward_step(&loss); log_loss(&loss); } }\n",
    );
    write(
        &one.join("src/log.rs"),
        "use candle_core::Tensor;\npub fn log_loss(loss: &Tensor) { println!(\"{}\", loss.to_scalar::<f32>().unwrap()); }\n",
    );
    // Package two has its own `log_loss`, never called from a step loop.
    let two = dir.path().join("two");
    package(&two, "");
    write(
        &two.join("src/log.rs"),
        "use candle_core::Tensor;\npub fn log_loss(loss: &Tensor) { println!(\"{}\", loss.to_scalar::<f32>().unwrap()); }\n",
    );
    // A lone file with no Cargo.toml above it in the temp dir is a crate of its own.
    let report = run(&[dir.path()]);
    let hits: Vec<&PathBuf> = report.diagnostics.iter().map(|d| &d.path).collect();
    assert_eq!(hits.len(), 1, "{:?}", report.diagnostics);
    // `log_loss` is an output helper: the step loop's call to it is reported, naming the readback.
    assert!(hits[0].ends_with("one/src/train.rs"), "{hits:?}");
    let message = &report.diagnostics[0].message;
    assert!(message.contains("`log_loss`"), "{message}");
    let notes = report.diagnostics[0].notes.join("\n");
    assert!(
        notes.contains("`to_scalar` at")
            && notes.contains("log.rs:2")
            && notes.contains("train.rs:1"),
        "{notes}"
    );
}

/// A function named with a raw identifier (`fn r#try`) is the function its calls reach: the step
/// loop's readback inside it is found, as it is through an ordinary name.
#[test]
fn raw_identifier_functions_are_followed_from_the_step_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(
        &dir.path().join("src/train.rs"),
        "use candle_core::Tensor;\n\
         fn r#try(loss: &Tensor) -> f32 {\n\
         \x20   loss.to_scalar::<f32>().unwrap()\n\
         }\n\
         pub fn train(opt: &mut O, xs: &[T]) {\n\
         \x20   for x in xs {\n\
         \x20       let loss = x.loss();\n\
         \x20       opt.backward_step(&loss).unwrap();\n\
         \x20       let value = r#try(&loss);\n\
         \x20       let _ = value;\n\
         \x20   }\n\
         }\n",
    );
    let report = run(&[dir.path()]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        codes_at(&report, "train.rs"),
        vec![(3, "PK101", Severity::Warning)],
        "{:?}",
        report.diagnostics
    );
    let notes = report.diagnostics[0].notes.join("\n");
    assert!(notes.contains("through `r#try`"), "{notes}");
}

/// A CPU device handed down a chain of twelve functions still reaches the step loop at its end
/// (the crate's device fixed point runs until nothing changes), so the loop's readback of a CPU
/// tensor is not reported, while the program's GPU loop elsewhere keeps the program from being
/// CPU-only as a whole.
#[test]
fn a_device_passed_down_a_long_chain_of_calls_is_followed_to_its_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    let depth = 12;
    let mut text = String::from(
        "use candle_core::{DType, Device, Tensor};\n\n\
         fn main() {\n\
         \x20   step0(&Device::Cpu);\n\
         \x20   let gpu = Device::cuda_if_available(0).unwrap();\n\
         \x20   let mut opt = Opt::new();\n\
         \x20   for _ in 0..10 {\n\
         \x20       let loss = Tensor::ones(1, DType::BF16, &gpu).unwrap();\n\
         \x20       opt.backward_step(&loss).unwrap();\n\
         \x20   }\n\
         }\n",
    );
    for i in 0..depth - 1 {
        text.push_str(&format!(
            "fn step{i}(device: &Device) {{\n    step{}(device);\n}}\n",
            i + 1
        ));
    }
    text.push_str(&format!(
        "fn step{}(device: &Device) {{\n\
         \x20   let mut opt = Opt::new();\n\
         \x20   for _ in 0..10 {{\n\
         \x20       let loss = Tensor::zeros(1, DType::F32, device).unwrap();\n\
         \x20       opt.backward_step(&loss).unwrap();\n\
         \x20       println!(\"{{}}\", loss.to_scalar::<f32>().unwrap());\n\
         \x20   }}\n\
         }}\n",
        depth - 1
    ));
    write(&dir.path().join("src/main.rs"), &text);
    let report = run(&[dir.path()]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        codes_at(&report, "main.rs"),
        vec![],
        "{:?}",
        report.diagnostics
    );
    // The same readback with the GPU handed down the chain is reported.
    write(
        &dir.path().join("src/main.rs"),
        &text.replace(
            "step0(&Device::Cpu);",
            "step0(&Device::new_cuda(1).unwrap());",
        ),
    );
    let report = run(&[dir.path()]);
    let readback = 1 + text
        .lines()
        .position(|l| l.contains("to_scalar"))
        .expect("readback line");
    assert_eq!(
        codes_at(&report, "main.rs"),
        vec![(readback, "PK101", Severity::Warning)],
        "{:?}",
        report.diagnostics
    );
}

/// A library whose `Model::new(device)` builds the tensors its step loop reads back (PK101 at
/// line 7 of `lib/src/lib.rs`), and a binary package that calls it with the CPU.
fn workspace_with_a_cpu_caller(dir: &Path, lib_publish: &str) {
    write(
        &dir.join("Cargo.toml"),
        "[workspace]\nmembers = [\"lib\", \"app\"]\n\n[workspace.dependencies]\nlib = { path = \"lib\" }\n",
    );
    write(
        &dir.join("lib/Cargo.toml"),
        &format!(
            "[package]\nname = \"lib\"\nversion = \"0.0.0\"\n{lib_publish}\n[dependencies]\ncandle-core = \"0.9\"\n"
        ),
    );
    write(
        &dir.join("lib/src/lib.rs"),
        "use candle_core::{Device, Tensor};\npub struct Model { w: Tensor }\nimpl Model {\n    pub fn new(device: Device) -> Model { Model { w: Tensor::ones(4, candle_core::DType::F32, &device).unwrap() } }\n    pub fn fit(&self, opt: &mut O) { for _ in 0..10 { let loss = self.w.sum_all().unwrap(); opt.backward_step(&loss);\n        let w = &self.w;\n        println!(\"{}\", w.sum_all().unwrap().to_scalar::<f32>().unwrap()); } }\n}\n",
    );
    write(
        &dir.join("app/Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.0.0\"\npublish = false\n[dependencies]\nlib.workspace = true\ncandle-core = \"0.9\"\n",
    );
    write(
        &dir.join("app/src/main.rs"),
        "use candle_core::Device;\nfn main() { let m = lib::Model::new(Device::Cpu); m.fit(&mut opt()); }\n",
    );
}

#[test]
fn an_unpublished_library_takes_devices_from_the_packages_that_call_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    workspace_with_a_cpu_caller(dir.path(), "publish = false");
    // Alone, nothing says where `Model::new`'s device is: the readback is reported.
    let alone = run(&[&dir.path().join("lib")]);
    assert_eq!(
        codes_at(&alone, "lib/src/lib.rs"),
        vec![(7, "PK101", Severity::Warning)],
        "{:?}",
        alone.diagnostics
    );
    // With the only package that can call it, the device is the CPU: nothing to report.
    let whole = run(&[dir.path()]);
    assert_eq!(
        codes_at(&whole, "lib/src/lib.rs"),
        vec![],
        "{:?}",
        whole.diagnostics
    );

    // A published library can be called from anywhere, with any device.
    let published = tempfile::tempdir().expect("tempdir");
    workspace_with_a_cpu_caller(published.path(), "");
    let whole = run(&[published.path()]);
    assert_eq!(
        codes_at(&whole, "lib/src/lib.rs"),
        vec![(7, "PK101", Severity::Warning)],
        "{:?}",
        whole.diagnostics
    );
}

#[test]
fn results_do_not_depend_on_the_number_of_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..12 {
        let pkg = dir.path().join(format!("p{i}"));
        package(&pkg, "");
        write(&pkg.join("src/train.rs"), CANDLE_LOOP);
        write(&pkg.join("src/other.rs"), "pub fn f() {}\n");
    }
    let one = lint(&LintOptions::new([dir.path()]).jobs(1)).expect("lint");
    let two = lint(&LintOptions::new([dir.path()]).jobs(2)).expect("lint");
    assert_eq!(one.diagnostics, two.diagnostics);
    assert_eq!(one.diagnostics.len(), 24);
    let mut sorted = one.diagnostics.clone();
    sorted.sort_by(|a, b| (&a.path, a.region.line).cmp(&(&b.path, b.region.line)));
    assert_eq!(sorted, one.diagnostics);
    assert!(lint(&LintOptions::new([dir.path()]).jobs(0)).is_err());
}

#[test]
fn progress_reports_every_file() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..5 {
        write(&dir.path().join(format!("f{i}.rs")), "fn main() {}\n");
    }
    let last = Arc::new(AtomicUsize::new(0));
    let seen = last.clone();
    let options = LintOptions::new([dir.path()]).progress(Arc::new(move |done, total| {
        assert!(done <= total);
        seen.fetch_max(done, Ordering::SeqCst);
    }));
    let report = lint(&options).expect("lint");
    assert_eq!(report.files_scanned, 5);
    assert_eq!(last.load(Ordering::SeqCst), 5);
}

#[test]
fn recursive_callees_terminate_and_report_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    write(
        &dir.path().join("src/lib.rs"),
        r#"use candle_core::{DType, Tensor};
fn ping(t: &Tensor, n: usize) -> f32 { if n == 0 { 0.0 } else { pong(t, n - 1) } }
fn pong(t: &Tensor, n: usize) -> f32 { t.to_dtype(DType::BF16).unwrap(); t.to_scalar::<f32>().unwrap() + ping(t, n) }
pub fn train(opt: &mut O, xs: &[Tensor]) {
    for x in xs {
        opt.backward_step(x).unwrap();
        ping(x, 3);
    }
}
"#,
    );
    let report = run(&[dir.path()]);
    assert_eq!(
        codes_at(&report, "lib.rs"),
        vec![(3, "PK101", Severity::Warning)]
    );
    let note = &report.diagnostics[0].notes[0];
    assert!(note.contains("`ping` -> `pong`"), "{note}");
}

#[test]
fn validation_loops_and_other_examples_are_not_step_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    // An epoch loop with a training loop and a validation loop: only the training loop is per step.
    write(
        &dir.path().join("examples/train/main.rs"),
        r#"use candle_core::{DType, Tensor};
fn main() {
    let xs: Vec<Tensor> = Vec::new();
    for _epoch in 0..10 {
        for x in &xs {
            opt.backward_step(&x.to_dtype(DType::BF16).unwrap()).unwrap();
            helper();
        }
        for x in &xs {
            println!("{}", x.to_scalar::<f32>().unwrap());
        }
    }
}
fn helper() {}
"#,
    );
    // Another example with a `helper` that reads back: not reachable from the first example.
    write(
        &dir.path().join("examples/other.rs"),
        "use candle_core::Tensor;\nfn helper() { let t: Tensor = todo(); t.to_vec1::<f32>().unwrap(); }\nfn main() {}\n",
    );
    let report = run(&[dir.path()]);
    assert!(report.diagnostics.is_empty(), "{:?}", report.diagnostics);
}

/// A helper without `#[test]` that hard-codes CUDA device 0 (PK401 at line 4).
const DEVICE_HELPER: &str =
    "use candle_core::Device;\n\npub fn gpu() -> Device {\n    Device::new_cuda(0).unwrap()\n}\n";

#[test]
fn integration_tests_and_benches_are_test_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    for file in [
        "src/train.rs",
        "src/tests/train.rs",
        "tests/common/train.rs",
        "tests/smoke.rs",
        "benches/step.rs",
    ] {
        write(&dir.path().join(file), CANDLE_LOOP);
    }
    for file in [
        "src/device.rs",
        "tests/common/device.rs",
        "benches/device.rs",
    ] {
        write(&dir.path().join(file), DEVICE_HELPER);
    }
    let options = LintOptions::new([dir.path().to_path_buf()]).select(["PK1", "PK401"]);
    let report = lint(&options).expect("lint runs");
    assert_eq!(report.files_scanned, 8);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut flagged: Vec<(String, usize, &str)> = report
        .diagnostics
        .iter()
        .map(|d| {
            let rel = d.path.strip_prefix(dir.path()).unwrap_or(&d.path);
            (
                rel.to_string_lossy().replace('\\', "/"),
                d.region.line,
                d.code,
            )
        })
        .collect();
    flagged.sort();
    // Library code (`src/tests/` is a module of the library) is linted; the `tests/` and
    // `benches/` targets, helpers included, are not.
    assert_eq!(
        flagged,
        vec![
            ("src/device.rs".to_string(), 4, "PK401"),
            ("src/tests/train.rs".to_string(), 9, "PK101"),
            ("src/tests/train.rs".to_string(), 11, "PK101"),
            ("src/train.rs".to_string(), 9, "PK101"),
            ("src/train.rs".to_string(), 11, "PK101"),
        ]
    );
}

#[test]
fn fix_leaves_a_file_that_changed_since_it_was_linted_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.py");
    let linted = "import torch\n\ndef f():\n    return torch.rand(2, 2).cuda()\n";
    write(&path, linted);
    let options = LintOptions::new([path.clone()]).select(["PK201"]);
    let report = lint(&options).expect("lint runs");
    assert!(report.diagnostics.iter().any(|d| d.fix.is_some()));
    // Saved by an editor between the lint and the fix: every byte offset has moved.
    let saved = format!("# a new first line\n{linted}");
    write(&path, &saved);
    let summary = perfkit_lint::fix::apply_fixes(&report.diagnostics);
    assert_eq!(fs::read_to_string(&path).expect("read"), saved);
    assert_eq!(summary.applied, 0);
    assert_eq!(summary.errors.len(), 1, "{:?}", summary.errors);
    let message = summary.errors[0].to_string();
    assert!(message.contains("changed since it was linted"), "{message}");
}

#[test]
fn a_python_script_given_by_name_without_the_py_extension_is_linted_as_python() {
    let dir = tempfile::tempdir().expect("tempdir");
    let body = "import torch\n\ndef train(model, opt, loader):\n    for x in loader:\n        loss = model(x.to(\"cuda\"))\n        loss.backward()\n        opt.step()\n        print(loss.item())\n";
    let script = dir.path().join("train");
    write(&script, &format!("#!/usr/bin/env python3\n{body}"));
    let stub = dir.path().join("train_loop.pyi");
    write(&stub, body);
    let report = run(&[&script, &stub]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(codes_at(&report, "train").len(), 1);
    assert_eq!(codes_at(&report, "train_loop.pyi").len(), 1);
    // Without a Python shebang, a file given by name is still read as Rust.
    let rust = dir.path().join("kernel.rs.in");
    write(&rust, CANDLE_LOOP);
    assert_eq!(codes_at(&run(&[&rust]), "kernel.rs.in").len(), 2);
}

#[cfg(unix)]
#[test]
fn a_symlink_to_a_file_linted_under_its_own_name_is_linted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.py");
    write(
        &path,
        "import torch\n\ndef f():\n    return torch.rand(2, 2).cuda()\n",
    );
    std::os::unix::fs::symlink("model.py", dir.path().join("link.py")).expect("symlink");
    // Also given by the link's name on the command line, and through a chain of two links.
    std::os::unix::fs::symlink("link.py", dir.path().join("again.py")).expect("symlink");
    let options =
        LintOptions::new([dir.path().to_path_buf(), dir.path().join("link.py")]).select(["PK201"]);
    let report = lint(&options).expect("lint runs");
    assert_eq!(report.files_scanned, 1);
    let paths: Vec<_> = report.diagnostics.iter().map(|d| d.path.clone()).collect();
    assert_eq!(paths, std::slice::from_ref(&path));
    let summary = perfkit_lint::fix::apply_fixes(&report.diagnostics);
    assert!(summary.errors.is_empty(), "{:?}", summary.errors);
    assert_eq!(summary.applied, 1);
    assert_eq!(
        fs::read_to_string(&path).expect("read"),
        "import torch\n\ndef f():\n    return torch.rand(2, 2, device=\"cuda\")\n"
    );
    // A link to a file that is not linted otherwise is linted under the link's name.
    let outside = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(&path, outside.path().join("shared.py")).expect("symlink");
    fs::write(
        &path,
        "import torch\n\ndef f():\n    return torch.rand(2, 2).cuda()\n",
    )
    .expect("write");
    let options = LintOptions::new([outside.path().to_path_buf()]).select(["PK201"]);
    let report = lint(&options).expect("lint runs");
    let paths: Vec<_> = report.diagnostics.iter().map(|d| d.path.clone()).collect();
    assert_eq!(paths, [outside.path().join("shared.py")]);
}

#[test]
fn python_lines_end_at_a_lone_carriage_return_too() {
    // Python reads `\r`, `\n` and `\r\n` as line ends (old Mac files end lines with `\r` alone).
    let dir = tempfile::tempdir().expect("tempdir");
    let lines = [
        "import torch",
        "",
        "def train(model, opt, loader):",
        "    for x in loader:",
        "        loss = model(x.to(\"cuda\"))",
        "        loss.backward()",
        "        opt.step()",
        "        v = loss.item()",
        "        w = loss.item()  # noqa: PK101",
        "",
    ];
    write(&dir.path().join("cr.py"), &lines.join("\r"));
    write(
        &dir.path().join("mixed.py"),
        &lines.join("\r\n").replacen("\r\n", "\r", 3),
    );
    let report = run(&[dir.path()]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    for file in ["cr.py", "mixed.py"] {
        let found: Vec<_> = report
            .diagnostics
            .iter()
            .filter(|d| d.path.ends_with(file))
            .map(|d| (d.code, d.region.line, d.region.column, d.region.end_column))
            .collect();
        assert_eq!(found, [("PK101", 8, 18, 22)], "{file}");
    }
}

#[test]
fn a_suppression_that_names_a_prefix_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        &dir.path().join("m.py"),
        "import torch\nx = 1  # perfkit: allow(PK1, PK999)\n",
    );
    let report = run(&[dir.path()]);
    let messages: Vec<&str> = report
        .diagnostics
        .iter()
        .filter(|d| d.code == "PK000")
        .map(|d| d.message.as_str())
        .collect();
    assert_eq!(
        messages,
        [
            "suppression names the prefix `PK1`, not a rule code",
            "suppression names unknown rule code `PK999`"
        ]
    );
}

#[test]
fn only_a_build_directory_named_target_is_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    package(dir.path(), "");
    // Cargo's build output, beside the manifest: skipped.
    write(&dir.path().join("target/debug/build/gen.rs"), CANDLE_LOOP);
    // A module named `target` and a Python package named `target`: sources like any other.
    write(&dir.path().join("src/target/mod.rs"), CANDLE_LOOP);
    write(
        &dir.path().join("py/target/train.py"),
        "import torch\n\ndef train(model, opt, loader):\n    for x in loader:\n        loss = model(x.to(\"cuda\"))\n        loss.backward()\n        opt.step()\n        print(loss.item())\n",
    );
    let report = run(&[dir.path()]);
    assert_eq!(report.files_scanned, 2, "{:?}", report.diagnostics);
    assert_eq!(codes_at(&report, "src/target/mod.rs").len(), 2);
    assert_eq!(codes_at(&report, "py/target/train.py").len(), 1);
}

#[test]
fn python_bindings_that_go_round_end_the_search_for_a_device() {
    // `d = d` and `a = b; b = a` made the device search recurse without end (a stack overflow
    // that ended the whole run); a name bound thousands of times over must stay fast too.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::from("import torch\n\nd = \"cuda\"\nd = d\n");
    text.push_str(&"d = d\n".repeat(2000));
    text.push_str("x = torch.zeros(3).to(d)\n\n\ndef f(a, b):\n");
    text.push_str(&"    a = b\n    b = a\n".repeat(500));
    text.push_str("    return torch.zeros(3).to(a)\n");
    write(&dir.path().join("cycles.py"), &text);
    let options = LintOptions::new([dir.path().to_path_buf()]).select(["PK201"]);
    let report = lint(&options).expect("lint runs");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    // `d` is "cuda" through every round; what `a` is, nothing says.
    assert_eq!(
        codes_at(&report, "cycles.py"),
        [(2005, "PK201", Severity::Warning)],
        "{:?}",
        report.diagnostics
    );
}
