//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use perfkit_profiler::model::Record;
use perfkit_profiler::{Builder, Guard, Header, PerfLayer, TraceReader, TraceStatus};

/// Starts recording locally with `builder` (which names an output); returns the layer, the
/// guard and the path of the trace being written.
pub fn record_local(builder: Builder) -> (PerfLayer, Guard, PathBuf) {
    let (layer, guard) = builder.build_local().unwrap().expect("output configured");
    let path = guard.path().unwrap().to_path_buf();
    (layer, guard, path)
}

/// Reads a whole trace; panics with the error text on failure (tests only).
pub fn read_all(path: &Path) -> (Header, Vec<Record>, TraceStatus) {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    for rec in r.by_ref() {
        out.push(rec.unwrap_or_else(|e| panic!("{e}")));
    }
    (r.header().clone(), out, r.status().clone())
}
