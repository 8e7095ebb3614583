//! `perfkit profile` and CUPTI injection through the built binary.
//!
//! Without a CUDA driver, `--inject` must explain that injection needs one (and run nothing);
//! with the stand-in CUDA driver and CUPTI (`profiler/inject/tests/support`), a Python program
//! is injected by `perfkit profile` itself and its reports point at the script's lines; with a
//! GPU, the PyTorch fixtures must show their findings (ignored here: needs a GPU, PyTorch built
//! for CUDA 13 and a CUPTI 13).

use std::path::{Path, PathBuf};

use assert_cmd::Command;

const SUPPORT: &str = "profiler/inject/tests/support";
#[path = "../profiler/inject/tests/support/python_scenario.rs"]
mod python_scenario;

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

/// `perfkit profile -- python3 python_step.py`, on a machine whose CUDA driver and CUPTI are the
/// stand-ins: `perfkit profile` finds the driver, plans the injection and starts the script with
/// `CUDA_INJECTION64_PATH`; the stand-in driver's `cuInit` loads the library from it.
#[test]
fn profiling_a_python_script_points_at_its_lines() {
    use python_scenario::{STEPS, site};
    let t = tempfile::tempdir().unwrap();
    let fakes = t.path().join("fakes");
    std::fs::create_dir(&fakes).unwrap();
    let cupti = python_scenario::build_fakes(&fakes);
    let records = t.path().join("records.bin");
    std::fs::write(&records, python_scenario::records_file()).unwrap();
    let run = t.path().join("run");
    // The injection library cargo built for this test run (beside the test executable, in
    // deps/); a copy next to the perfkit binary may be older.
    let library = std::env::current_exe()
        .unwrap()
        .with_file_name("libperfkit_inject.so");
    assert!(library.is_file(), "{}", library.display());
    let out = Command::cargo_bin("perfkit")
        .unwrap()
        .args(["profile", "--out"])
        .arg(&run)
        .env("PERFKIT_INJECT_LIB", &library)
        .arg("--")
        .arg("python3")
        .arg(python_scenario::script())
        .arg(&records)
        .arg(STEPS.to_string())
        .env("LD_LIBRARY_PATH", &fakes)
        .env("PERFKIT_CUPTI_PATH", &cupti)
        .env_remove("CUDA_INJECTION64_PATH")
        .env_remove("PERFKIT_INJECT_PYTHON_DEPTH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("capturing CUDA activity through injection"),
        "{stderr}"
    );
    assert!(stderr.contains("Python frames read at"), "{stderr}");
    assert!(
        !format!("{stdout}{stderr}").contains("events were dropped"),
        "{stdout}\n{stderr}"
    );

    // The GPU flamegraph: GPU time under the script's frames, outermost first (below the
    // inferred step, once the first optimizer step has ended one).
    let folded = std::fs::read_to_string(run.join("stacks-gpu.folded")).unwrap();
    for name in ["upload", "launch", "readback"] {
        let want = format!(
            "<module> (PATH:{});main (PATH:{});train_step (PATH:{}) ",
            site("module"),
            site("loop"),
            site(name)
        )
        .replace("PATH", &python_scenario::script().display().to_string());
        assert!(
            folded
                .lines()
                .any(|l| l.starts_with(&want) || l.starts_with(&format!("step;{want}"))),
            "{name}: stacks-gpu.folded:\n{folded}\n{stderr}"
        );
    }
    // Copy and synchronization sites are the script's lines; the synchronization made
    // without the GIL has none.
    let summary = std::fs::read_to_string(run.join("summary.json")).unwrap();
    for name in ["upload", "readback", "sync"] {
        let at = format!("python_step.py:{}\"", site(name));
        assert!(summary.contains(&at), "{name} ({at}) not in {summary}");
    }
    assert!(
        !summary.contains(&format!("python_step.py:{}\"", site("released"))),
        "{summary}"
    );

    // The terminal summary counts the same inferred steps (one fewer than the optimizer steps:
    // the last is unfinished), and no span is left open.
    assert!(
        stderr.contains(&format!("steps      {} ", STEPS - 1)),
        "{stderr}"
    );
    assert!(!stderr.contains("still open"), "{stderr}");
    // Steps come from the optimizer steps in the Python frames (the script has no step spans):
    // the blocking readback and synchronization of every step are runtime findings at their
    // lines.
    let json: serde_json::Value = serde_json::from_str(&summary).unwrap();
    let findings = json["findings"].as_array().unwrap();
    for (code, name) in [("PK101", "readback"), ("PK102", "sync")] {
        let at = format!("python_step.py:{}", site(name));
        assert!(
            findings.iter().any(|f| f["code"] == code
                && f["origin"] == "runtime"
                && f["location"].as_str().is_some_and(|l| l.ends_with(&at))),
            "{code} at {at}: {findings:#?}\n{stdout}"
        );
    }
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
