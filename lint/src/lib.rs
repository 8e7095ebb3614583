//! perfkit-lint: finds performance anti-patterns in Rust GPU training code without building it.

pub mod diagnostic;

pub use diagnostic::{Diagnostic, Edit, FileError, Fix, Region, Severity};
