//! perfkit-reports: analysis of perfkit traces and the reports rendered from it.
//!
//! ```no_run
//! use std::path::Path;
//! use perfkit_reports::{AnalyzeOptions, analyze_path, render};
//!
//! let analysis = analyze_path(Path::new("perfkit-out/train"), &AnalyzeOptions::default())?;
//! let written = render::write_all(
//!     &analysis,
//!     Path::new("perfkit-out/train"),
//!     &render::Format::ALL,
//!     &[],
//!     &render::RenderOptions::default(),
//! )?;
//! # Ok::<(), perfkit_reports::Error>(())
//! ```
//!
//! The analysis streams each trace once (a second time for the timeline of a few chosen
//! steps, and once more for the Chrome trace): host spans are aggregated on the fly, so the
//! memory it needs grows with distinct span stacks and names, not with the length of the run.

pub mod analyze;
pub mod chrome;
pub mod diff;
pub mod error;
pub mod event;
pub mod findings;
pub mod flame;
pub mod format;
pub mod gate;
pub mod html;
pub mod ingest;
pub mod model;
pub mod render;
pub mod rules;
pub mod source;
pub mod stats;
pub mod summary;
pub mod timeline;

pub use analyze::{analyze_file, analyze_path, assemble, discover};
pub use error::{Error, Result};
pub use findings::{Finding, Severity};
pub use ingest::{AnalyzeOptions, ProcessIngest};
pub use model::Analysis;
pub use summary::Summary;
