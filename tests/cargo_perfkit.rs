//! `cargo perfkit lint` and `cargo perfkit profile`, run through cargo itself (cargo finds
//! `cargo-perfkit` on PATH, as it finds any external subcommand) on small packages written to
//! temporary directories. The profiled package depends on perfkit-profiler by path and is built
//! offline, in a target directory kept between test runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo perfkit ARGS` in `dir`, with `cargo-perfkit` (and `perfkit`) first on PATH.
fn cargo_perfkit(dir: &Path, args: &[&str]) -> Output {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_cargo-perfkit"))
        .parent()
        .unwrap()
        .to_path_buf();
    let mut paths = vec![bin_dir];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path: OsString = std::env::join_paths(paths).unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Command::new(cargo)
        .current_dir(dir)
        .arg("perfkit")
        .args(args)
        .env("PATH", path)
        .env("CARGO_NET_OFFLINE", "true")
        // The profiled package's own build, kept between runs (it compiles perfkit-profiler).
        .env(
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cargo-perfkit-target"),
        )
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo perfkit")
}

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A step loop whose batch size is below PK502's minimum: a finding with no framework needed.
const SMALL_BATCH: &str = "fn main() {\n\
    \x20   let batch_size = 4;\n\
    \x20   let mut opt = Opt;\n\
    \x20   for step in 0..3 {\n\
    \x20       opt.zero_grad();\n\
    \x20       opt.backward_step(step as f32 * batch_size as f32);\n\
    \x20   }\n\
    }\n\
    struct Opt;\n\
    impl Opt {\n\
    \x20   fn zero_grad(&mut self) {}\n\
    \x20   fn backward_step(&mut self, _loss: f32) {}\n\
    }\n";

/// A virtual workspace: `app` with a PK502 finding, `clean` with none.
fn workspace(root: &Path) {
    write(
        root,
        "Cargo.toml",
        "[workspace]\nmembers = [\"app\", \"clean\"]\nresolver = \"3\"\n",
    );
    for name in ["app", "clean"] {
        write(
            root,
            &format!("{name}/Cargo.toml"),
            &format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n"),
        );
    }
    write(root, "app/src/main.rs", SMALL_BATCH);
    write(root, "clean/src/lib.rs", "pub fn f() {}\n");
}

fn findings(out: &Output) -> Vec<(String, String)> {
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {out:?}"));
    json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["code"].as_str().unwrap().to_string(),
                f["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn lint_takes_the_packages_cargo_would() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path();
    workspace(ws);
    let app_finding = vec![("PK502".to_string(), "app/src/main.rs".to_string())];

    // At the root of a virtual workspace: every default member.
    let out = cargo_perfkit(ws, &["lint", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(findings(&out), app_finding);

    // In a member: that package alone.
    let out = cargo_perfkit(&ws.join("clean"), &["lint", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(findings(&out), vec![]);

    // --package picks another member; paths stay relative to where it ran.
    let out = cargo_perfkit(
        &ws.join("clean"),
        &["lint", "-p", "app", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        findings(&out),
        vec![("PK502".to_string(), "../app/src/main.rs".to_string())]
    );

    // Paths given are linted as given, whatever package the current directory is in.
    let out = cargo_perfkit(&ws.join("clean"), &["lint", "--format", "json", "../app"]);
    assert_eq!(
        findings(&out),
        vec![("PK502".to_string(), "../app/src/main.rs".to_string())]
    );

    // An unknown package is named, with the members.
    let out = cargo_perfkit(ws, &["lint", "-p", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--package nope") && stderr.contains("app, clean"),
        "{stderr}"
    );
}

#[test]
fn lint_message_format_json_is_cargo_messages() {
    let tmp = tempfile::tempdir().unwrap();
    workspace(tmp.path());
    let out = cargo_perfkit(tmp.path(), &["lint", "--message-format=json"]);
    let messages: Vec<cargo_metadata::Message> =
        cargo_metadata::Message::parse_stream(&out.stdout[..])
            .collect::<Result<_, _>>()
            .unwrap();
    let [
        cargo_metadata::Message::CompilerMessage(m),
        cargo_metadata::Message::BuildFinished(_),
    ] = &messages[..]
    else {
        panic!("{messages:?}");
    };
    assert_eq!(m.message.spans[0].file_name, "app/src/main.rs");
    assert_eq!(m.target.name, "app");
    assert!(m.target.is_bin());
}

/// A package `tiny` with the bins `train` (instrumented, PK502 in its loop) and `other`,
/// depending on perfkit-profiler by path, with the workspace's Cargo.lock so that it builds
/// offline with the versions already fetched.
fn instrumented_package(dir: &Path) {
    let profiler = root().join("profiler");
    write(
        dir,
        "Cargo.toml",
        &format!(
            "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [dependencies]\nperfkit-profiler = {{ path = {:?}, default-features = false }}\n\
             tracing = \"0.1\"\n",
            profiler.display().to_string()
        ),
    );
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    write(
        dir,
        "src/bin/train.rs",
        "fn main() {\n\
         \x20   let _perfkit = perfkit_profiler::init();\n\
         \x20   let args: Vec<String> = std::env::args().skip(1).collect();\n\
         \x20   println!(\"args: {}\", args.join(\" \"));\n\
         \x20   let batch_size = 4;\n\
         \x20   let mut opt = Opt;\n\
         \x20   for step in 0..5 {\n\
         \x20       let _step = tracing::info_span!(\"step\", step).entered();\n\
         \x20       opt.zero_grad();\n\
         \x20       opt.backward_step(step as f32 * batch_size as f32);\n\
         \x20   }\n\
         }\n\
         struct Opt;\n\
         impl Opt {\n\
         \x20   fn zero_grad(&mut self) {}\n\
         \x20   fn backward_step(&mut self, _loss: f32) {}\n\
         }\n",
    );
    write(dir, "src/bin/other.rs", "fn main() {}\n");
}

#[test]
fn profile_builds_with_cargo_then_profiles_the_artifact_and_lints_its_package() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    let pkg = dir.join("tiny");
    instrumented_package(&pkg);
    let run = dir.join("run");
    let run_arg = run.to_str().unwrap();

    // Two binaries and no --bin: nothing is guessed.
    let out = cargo_perfkit(&pkg, &["profile", "--out", run_arg]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("several binaries (bin other, bin train)")
            || stderr.contains("several binaries (bin train, bin other)"),
        "{stderr}"
    );
    assert!(!run.exists());

    let out = cargo_perfkit(
        &pkg,
        &[
            "profile", "--bin", "train", "--out", run_arg, "--", "--lr", "0.1",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("args: --lr 0.1"), "{stdout}");
    assert!(
        stderr
            .lines()
            .any(|l| l == "lint: src/bin (package tiny, built by cargo as bin train)"),
        "{stderr}"
    );
    let summary: Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    // The executable cargo reported, in the target directory it used.
    let program = summary["run"]["program"].as_str().unwrap();
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cargo-perfkit-target");
    assert_eq!(
        Path::new(program),
        target_dir.join("debug/train"),
        "{summary}"
    );
    assert_eq!(summary["run"]["args"], serde_json::json!(["--lr", "0.1"]));
    let findings = summary["findings"].as_array().unwrap();
    assert!(
        findings
            .iter()
            .any(|f| f["code"] == "PK502" && f["origin"] == "lint"),
        "{findings:?}"
    );
}

#[test]
fn a_failed_build_exits_with_cargos_status_and_profiles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("broken");
    write(
        &pkg,
        "Cargo.toml",
        "[package]\nname = \"broken\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
    );
    write(&pkg, "src/main.rs", "fn main() { let x: u32 = \"no\"; }\n");
    let run = tmp.path().join("run");
    let out = cargo_perfkit(&pkg, &["profile", "--out", run.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(101), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // cargo's own rendering of the error, then perfkit's line.
    assert!(stderr.contains("error[E0308]"), "{stderr}");
    assert!(stderr.contains("nothing was profiled"), "{stderr}");
    assert!(!run.exists());
}

#[test]
fn without_bin_the_packages_default_run_is_profiled_as_cargo_run_would() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("two");
    write(
        &pkg,
        "Cargo.toml",
        "[package]\nname = \"two\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
         default-run = \"second\"\n",
    );
    write(
        &pkg,
        "src/bin/first.rs",
        "fn main() { println!(\"first ran\"); }\n",
    );
    write(
        &pkg,
        "src/bin/second.rs",
        "fn main() { println!(\"second ran\"); std::process::exit(3); }\n",
    );
    let run = tmp.path().join("run");
    let out = cargo_perfkit(
        &pkg,
        &["profile", "--no-lint", "--out", run.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The program's own exit status, as `perfkit profile` returns it.
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(stdout.trim(), "second ran");
}
