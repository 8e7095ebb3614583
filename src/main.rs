//! The `perfkit` command line: clap definitions and glue over the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use perfkit::cmd;

/// Find and measure what makes GPU training code slow.
#[derive(Debug, Parser)]
#[command(name = "perfkit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lint Rust and Python training code (and notebooks) for performance anti-patterns.
    Lint(cmd::lint::LintArgs),
    /// List the rule catalog.
    Rules(cmd::rules::RulesArgs),
    /// Print the documentation of one rule.
    Rule(cmd::rules::RuleArgs),
    /// Run a training program under the profiler and summarise what it did.
    Profile(cmd::profile::ProfileArgs),
    /// Render reports (HTML, flamegraphs, Chrome trace, summary JSON/Markdown) from a trace or a run directory.
    Report(cmd::report::ReportArgs),
    /// Compare two runs (traces, run directories or summary.json files).
    Diff(cmd::diff::DiffArgs),
    /// List the GPUs (memory, utilization, driver) and suggest a CUDA_VISIBLE_DEVICES order.
    Devices(cmd::devices::DevicesArgs),
    /// Gate CI on lint findings and on step-time / GPU-idle / copy-time regressions against a baseline run.
    Check(cmd::check::CheckArgs),
    /// Profile the reference trainer tuned and with its anti-patterns, lint it, and write both reports and their diff.
    Demo(cmd::demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Lint(args) => cmd::lint::run(args),
        Command::Rules(args) => cmd::rules::run_rules(args),
        Command::Rule(args) => cmd::rules::run_rule(args),
        Command::Profile(args) => cmd::profile::run(args),
        Command::Report(args) => cmd::report::run(args),
        Command::Diff(args) => cmd::diff::run(args),
        Command::Devices(args) => cmd::devices::run(args),
        Command::Check(args) => cmd::check::run(args),
        Command::Demo(args) => cmd::demo::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => cmd::exit_on_error(&err),
    }
}
