//! `cargo perfkit`: cargo runs this binary as `cargo-perfkit perfkit ARGS...` (cargo's external
//! subcommand convention), so `perfkit` is the first argument.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use perfkit::cmd;

#[derive(Debug, Parser)]
#[command(name = "cargo", bin_name = "cargo")]
enum Cargo {
    /// perfkit for the current cargo package or workspace.
    #[command(version, about, long_about = None)]
    Perfkit(Perfkit),
}

#[derive(Debug, clap::Args)]
struct Perfkit {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lint the current package (or the workspace's default members, at its root).
    Lint(cmd::cargo::CargoLintArgs),
    /// Build a binary or example with cargo, profile it and lint its package.
    Profile(cmd::cargo::CargoProfileArgs),
}

fn main() -> ExitCode {
    let Cargo::Perfkit(perfkit) = Cargo::parse();
    let result = match perfkit.command {
        Command::Lint(args) => cmd::cargo::lint(args),
        Command::Profile(args) => cmd::cargo::profile(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => cmd::exit_on_error(&err),
    }
}
