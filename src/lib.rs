//! The commands of the `perfkit` and `cargo-perfkit` binaries: clap arguments and the glue over
//! the library crates (`perfkit-lint`, `perfkit-profiler`, `perfkit-reports`, ...). Not a
//! stable API: use those crates.

pub mod cmd;
