//! The `perfkit` command line: clap definitions and glue over the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// Find and measure what makes GPU training code slow.
#[derive(Debug, Parser)]
#[command(name = "perfkit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lint Rust training code for performance anti-patterns.
    Lint(cmd::lint::LintArgs),
    /// List the rule catalog.
    Rules(cmd::rules::RulesArgs),
    /// Print the documentation of one rule.
    Rule(cmd::rules::RuleArgs),
    /// Run a training program under the profiler and summarise what it did.
    Profile(cmd::profile::ProfileArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Lint(args) => cmd::lint::run(args),
        Command::Rules(args) => cmd::rules::run_rules(args),
        Command::Rule(args) => cmd::rules::run_rule(args),
        Command::Profile(args) => cmd::profile::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("perfkit: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// A closed pipe (`perfkit lint | head`) is a normal end, not an error.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
