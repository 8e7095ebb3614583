//! One module per subcommand: its clap arguments and the glue that runs it.

pub mod lint;
pub mod profile;
pub mod rules;
