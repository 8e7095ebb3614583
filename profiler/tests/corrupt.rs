//! Cut and damaged traces: the reader returns what is intact and names the byte offset of the
//! damage; it never panics (checked exhaustively on small traces and by a property test).

mod common;

use perfkit_profiler::model::Record;
use perfkit_profiler::{Builder, ReadError, TraceReader, TraceStatus, TraceWriter};
use proptest::prelude::*;
use tracing_subscriber::layer::SubscriberExt;

/// A real trace recorded by the layer, re-encoded into small chunks (so it has many of them).
fn multi_chunk_trace() -> (Vec<u8>, Vec<Record>) {
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) = common::record_local(Builder::new().output(dir.path()));
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        for step in 0..20u64 {
            let _s = tracing::info_span!("step", step).entered();
            let _f = tracing::info_span!("forward", layer = "fc1").entered();
            tracing::info!(loss = 0.5, "step done");
        }
    });
    drop(guard);
    let (header, records, status) = common::read_all(&path);
    assert!(status.is_complete());
    let mut w = TraceWriter::new(Vec::new(), &header)
        .unwrap()
        .chunk_size(120);
    for r in &records {
        w.write(r).unwrap();
    }
    (w.finish().unwrap(), records)
}

/// (start, end) of every chunk, from the documented layout.
fn chunks(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 12;
    while at + 12 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push((at, at + 12 + len));
        at += 12 + len;
    }
    assert_eq!(at, bytes.len());
    out
}

fn read(bytes: &[u8], strict: bool) -> (Result<Vec<Record>, ReadError>, Option<TraceStatus>) {
    let mut r = match TraceReader::from_reader(bytes, "t.pktrace") {
        Ok(r) => r.strict(strict),
        Err(e) => return (Err(e), None),
    };
    let mut out = Vec::new();
    for rec in r.by_ref() {
        match rec {
            Ok(rec) => out.push(rec),
            Err(e) => return (Err(e), Some(r.status().clone())),
        }
    }
    (Ok(out), Some(r.status().clone()))
}

#[test]
fn a_cut_trace_reads_up_to_its_last_complete_chunk() {
    let (bytes, records) = multi_chunk_trace();
    let chunks = chunks(&bytes);
    assert!(chunks.len() > 10, "{} chunks", chunks.len());
    let header_end = chunks[0].1;
    for cut in 0..bytes.len() {
        let part = &bytes[..cut];
        let (res, status) = read(part, false);
        if cut < header_end {
            let err = res.expect_err("no header");
            assert!(
                matches!(err, ReadError::Truncated { .. }),
                "cut {cut}: {err}"
            );
            assert!(err.offset().is_some_and(|o| o <= cut as u64));
            continue;
        }
        let got = res.unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        // The complete chunks before the cut are all read, nothing after.
        let valid = chunks.iter().rfind(|c| c.1 <= cut).unwrap().1;
        match status.unwrap() {
            TraceStatus::Cut {
                valid_up_to,
                discarded_bytes,
            } => {
                assert_eq!(valid_up_to as usize, valid);
                assert_eq!(discarded_bytes as usize, cut - valid);
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
        assert!(got.len() <= records.len());
        assert_eq!(
            got[..],
            records[..got.len()],
            "cut at {cut}: a prefix of the records"
        );
        // Strict mode turns the cut into an error naming where the data stops.
        let (strict, _) = read(part, true);
        let err = strict.expect_err("strict mode reports the cut");
        assert_eq!(err.offset(), Some(valid as u64));
        assert!(
            err.to_string()
                .contains(&format!("cut short at byte offset {valid}")),
            "{err}"
        );
    }
    // Uncut, it is complete.
    let (res, status) = read(&bytes, true);
    assert_eq!(res.unwrap(), records);
    assert!(status.unwrap().is_complete());
}

#[test]
fn a_damaged_byte_is_reported_with_the_offset_of_its_chunk() {
    let (bytes, records) = multi_chunk_trace();
    let chunks = chunks(&bytes);
    for pos in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[pos] ^= 0x20;
        let (res, _) = read(&bad, false);
        if pos == 10 || pos == 11 {
            // The minor version: a newer minor only adds skippable records, so it still reads.
            assert_eq!(res.unwrap(), records);
            continue;
        }
        let err = res.expect_err("every flipped byte is detected");
        match &err {
            ReadError::NotATrace { .. } => assert!(pos < 8),
            ReadError::UnsupportedVersion { major, .. } => {
                assert!((8..10).contains(&pos));
                assert!(
                    err.to_string().contains(&format!("version {major}.")),
                    "{err}"
                );
            }
            ReadError::Corrupt { offset, .. } => {
                let (start, end) = *chunks
                    .iter()
                    .find(|c| c.0 <= pos && pos < c.1)
                    .expect("a chunk");
                assert_eq!(*offset as usize, start, "flip at {pos}: {err}");
                assert!(pos < end);
                assert!(
                    err.to_string()
                        .starts_with("t.pktrace: corrupt trace at byte offset"),
                    "{err}"
                );
            }
            ReadError::Truncated { .. } => {
                panic!("flip at {pos} taken for a cut: {err}")
            }
            other => panic!("flip at {pos}: {other}"),
        }
    }
}

#[test]
fn a_newer_major_version_is_refused_clearly() {
    let (mut bytes, _) = multi_chunk_trace();
    bytes[8..10].copy_from_slice(&7u16.to_le_bytes());
    bytes[10..12].copy_from_slice(&0u16.to_le_bytes());
    let err = TraceReader::from_reader(&bytes[..], "new.pktrace")
        .err()
        .expect("refused");
    assert_eq!(
        err.to_string(),
        "new.pktrace: trace format version 7.0 is not supported (this perfkit reads version 1.x); use the perfkit version that recorded it"
    );
    let err = TraceReader::from_reader(&b"{\"traceEvents\":[]}"[..], "x.json")
        .err()
        .expect("refused");
    assert_eq!(
        err.to_string(),
        "x.json: not a perfkit trace (bad magic bytes at offset 0)"
    );
}

#[test]
fn a_damaged_record_inside_a_valid_chunk_names_its_own_offset() {
    // A chunk whose checksum matches but whose record tag is unknown (as a buggy writer would
    // produce): the error names the offset of the record, not of the chunk.
    let (bytes, _) = multi_chunk_trace();
    let chunks = chunks(&bytes);
    let (start, end) = chunks[1];
    let mut bad = bytes[..end].to_vec();
    bad[start + 12] = 0x7e;
    let payload = bad[start + 12..end].to_vec();
    let crc = crc32(&payload);
    bad[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32(&bad[start..start + 8]);
    bad[start + 8..start + 12].copy_from_slice(&hcrc.to_le_bytes());
    let (res, status) = read(&bad, false);
    let err = res.expect_err("unknown tag");
    assert_eq!(err.offset(), Some(start as u64 + 12));
    assert!(err.to_string().contains("unknown record tag 0x7e"), "{err}");
    assert_eq!(
        status,
        Some(TraceStatus::Corrupt {
            offset: start as u64 + 12
        })
    );
}

/// CRC-32 (IEEE), bit by bit, to build test inputs independently of the crate.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random cuts and random byte changes: Ok or a clean error with an offset inside the
    /// file, never a panic; intact records always read back unchanged.
    #[test]
    fn random_damage_never_panics(cut in 0.0f64..=1.0, flips in proptest::collection::vec((0.0f64..1.0, 1u8..=255), 0..4)) {
        let (bytes, records) = TRACE.with(|t| t.clone());
        let mut bad = bytes.clone();
        for (at, x) in &flips {
            let i = (((bad.len() as f64) * at) as usize).min(bad.len() - 1);
            bad[i] ^= x;
        }
        bad.truncate(((bad.len() as f64) * cut) as usize);
        let (res, _) = read(&bad, false);
        match res {
            Ok(got) => {
                prop_assert!(got.len() <= records.len());
                prop_assert_eq!(&got[..], &records[..got.len()]);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.starts_with("t.pktrace: "), "{}", msg);
                if let Some(off) = e.offset() {
                    prop_assert!(off <= bad.len() as u64);
                }
            }
        }
    }
}

thread_local! {
    static TRACE: (Vec<u8>, Vec<Record>) = multi_chunk_trace();
}
