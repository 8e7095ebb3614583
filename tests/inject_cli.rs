//! `perfkit profile` and CUPTI injection through the built binary.
//!
//! Without a CUDA driver, `--inject` must explain that injection needs one (and run nothing);
//! with a GPU, the PyTorch fixtures must show their findings (ignored here: needs a GPU, PyTorch
//! built for CUDA 13 and a CUPTI 13).

use std::path::{Path, PathBuf};

use assert_cmd::Command;

#[test]
fn forced_injection_without_a_driver_is_explained() {
    if perfkit_inject::host::driver_present() {
        // A GPU machine: the injection path itself is covered by the ignored tests below.
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("perfkit")
        .unwrap()
        .args(["profile", "--inject", "--out"])
        .arg(t.path().join("run"))
        .args(["--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("--inject needs a CUDA driver"), "{stderr}");
    assert!(
        !stdout.contains("ran"),
        "the program is not started: {stdout}"
    );
}

#[test]
fn no_inject_runs_the_program_without_injection() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("perfkit")
        .unwrap()
        .args(["profile", "--no-inject", "--out"])
        .arg(t.path().join("run"))
        .args([
            "--",
            "sh",
            "-c",
            "echo \"inject=${CUDA_INJECTION64_PATH:-none}\"",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("inject=none"), "{stdout}");
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/python")
        .join(name)
}

/// Runs a fixture script under `perfkit profile` and returns the finding codes of summary.json.
fn profile_python(script: &str) -> Vec<String> {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let out = Command::cargo_bin("perfkit")
        .unwrap()
        .args(["profile", "--out"])
        .arg(&run)
        .arg("--")
        .arg("python3")
        .arg(fixture(script))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("capturing CUDA activity through injection"),
        "{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    summary["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_string())
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pytorch_bad_script_shows_its_three_mistakes() {
    let codes = profile_python("train_bad.py");
    for code in ["PK101", "PK303", "PK301"] {
        assert!(
            codes.iter().any(|c| c == code),
            "{code} missing from {codes:?}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pytorch_good_script_is_clean() {
    let codes = profile_python("train_good.py");
    for code in ["PK101", "PK303", "PK301"] {
        assert!(!codes.iter().any(|c| c == code), "{code} in {codes:?}");
    }
}
