//! One module per subcommand: its clap arguments and the glue that runs it.

pub mod check;
pub mod demo;
pub mod devices;
pub mod diff;
pub mod lint;
pub mod profile;
pub mod report;
pub mod rules;
