//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::process::{Command, Output};

/// The `train` binary, with any `PERFKIT_TRACE` of the environment removed.
pub fn train_bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_train"));
    cmd.env_remove("PERFKIT_TRACE");
    cmd
}

/// Runs `cmd` and asserts that it succeeded, showing its stderr otherwise.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run train");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
