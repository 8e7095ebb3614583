//! `perfkit rules` and `perfkit rule CODE` (being written).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct RulesArgs {}

#[derive(Debug, clap::Args)]
pub struct RuleArgs {}

pub fn run_rules(_args: RulesArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`perfkit rules` is not built yet")
}

pub fn run_rule(_args: RuleArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`perfkit rule` is not built yet")
}
