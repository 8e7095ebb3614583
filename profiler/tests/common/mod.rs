//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use perfkit_profiler::model::Record;
use perfkit_profiler::{Header, TraceReader, TraceStatus};

/// Reads a whole trace; panics with the error text on failure (tests only).
pub fn read_all(path: &Path) -> (Header, Vec<Record>, TraceStatus) {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    for rec in r.by_ref() {
        out.push(rec.unwrap_or_else(|e| panic!("{e}")));
    }
    (r.header().clone(), out, r.status().clone())
}
