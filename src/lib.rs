//! The commands of the `perfkit` and `cargo-perfkit` binaries: clap arguments and the glue over
//! the library crates (`perfkit-lint`, `perfkit-profiler`, `perfkit-reports`, ...). Not a
//! stable API: use those crates.

/// `eprintln!` that passes over a failed write (stderr closed, or a full disk behind it): a
/// message that cannot be shown must not turn a run that did its work into a panic.
#[macro_export]
macro_rules! eprintln_lossy {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

pub mod cmd;
