//! `perfkit lint` (being written).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct LintArgs {}

pub fn run(_args: LintArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`perfkit lint` is not built yet")
}
