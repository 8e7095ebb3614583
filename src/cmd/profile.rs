//! `perfkit profile` (being written).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ProfileArgs {}

pub fn run(_args: ProfileArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`perfkit profile` is not built yet")
}
