//! Errors of the reports crate.

use std::path::PathBuf;

/// Everything that can go wrong while analysing traces or writing reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A trace file could not be decoded.
    #[error("{path}: {message}")]
    Trace {
        /// The trace file.
        path: PathBuf,
        /// What the reader reported (it names the byte offset of a corruption).
        message: String,
    },
    /// A directory held no trace file.
    #[error(
        "{path}: no perfkit trace found (expected a trace file or a directory holding `*.pktrace` files)"
    )]
    NoTrace {
        /// The directory searched.
        path: PathBuf,
    },
    /// A `summary.json` could not be parsed or has an unsupported version.
    #[error("{path}: {message}")]
    Summary {
        /// The summary file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// An unknown output format was requested.
    #[error("unknown report format `{0}` (expected one of: html, svg, folded, chrome, json, md)")]
    UnknownFormat(String),
    /// Rendering a flamegraph failed.
    #[error("flamegraph {what}: {message}")]
    Flamegraph {
        /// Which flamegraph.
        what: String,
        /// The renderer's message.
        message: String,
    },
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
