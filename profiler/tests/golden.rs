//! The trace format as `docs/trace-format.md` documents it, held to stored bytes.
//!
//! `tests/data/golden-1.0.pktrace` was written once by the 1.0 encoder and is kept as it was:
//! its bytes are read back field by field as the document lays them out, and the reader of
//! today must still read it (a reader reads every minor of its major).
//! `tests/data/golden-1.1.pktrace` was written by the 1.1 encoder (the same records, plus the
//! Python stack extension records): the encoder must still write exactly those bytes, and its
//! extension records are read back byte by byte too. A change to the encoding fails here unless
//! a golden file and the document change with it (write a new golden for a new version; rewrite
//! the current one only for a deliberate change of the current version, with
//! `PERFKIT_BLESS_GOLDEN=1 cargo test -p perfkit-profiler --test golden -- --test-threads=1`).

use std::sync::Arc;

use perfkit_profiler::model::*;
use perfkit_profiler::{TraceReader, TraceWriter};

const GOLDEN_1_0: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden-1.0.pktrace");
const GOLDEN_1_1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden-1.1.pktrace");

fn golden_header() -> Header {
    let mut h = Header::new("train", 4242);
    h.writer_version = "golden".to_owned();
    h.host = "host-a".to_owned();
    h.command_line = vec!["train".to_owned(), "--steps".to_owned(), "1".to_owned()];
    h.start_unix_ns = 1_700_000_000_000_000_000;
    h.rank = Some(1);
    h.local_rank = None;
    h.world_size = Some(2);
    h.step_span_name = "step".to_owned();
    h.clock = "monotonic".to_owned();
    h.extra = vec![("k".to_owned(), "v".to_owned())];
    h
}

/// The records of the 1.0 golden file.
fn golden_1_0_records() -> Vec<Record> {
    let step = Arc::new(Callsite::new("step", "train", CallsiteKind::Span, &[]));
    let edge = |ts| SpanEdge {
        thread: 0,
        ts,
        span: SpanId(1),
    };
    vec![
        Record::Thread(ThreadInfo::new(0, 77, Some("main"))),
        Record::SpanNew(SpanNew {
            thread: 0,
            ts: 100,
            id: SpanId(1),
            parent: None,
            callsite: step,
            fields: vec![],
        }),
        Record::SpanEnter(edge(100)),
        Record::SpanExit(edge(350)),
        Record::SpanClose(edge(350)),
    ]
}

/// The Python records added in 1.1: a two-frame stack, an operation linked to it and one
/// issued without the GIL.
fn golden_1_1_extra() -> Vec<Record> {
    let frame = |file: &str, function: &str, line| PyFrame {
        file: Arc::from(file),
        function: Arc::from(function),
        line,
    };
    vec![
        Record::PyStack(PyStackInfo {
            id: 1,
            frames: vec![frame("train.py", "step", 42), frame("train.py", "main", 7)],
        }),
        Record::OpPyStack(OpPyStack {
            op: 5,
            stack: Some(1),
        }),
        Record::OpPyStack(OpPyStack { op: 6, stack: None }),
    ]
}

fn golden_bytes() -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &golden_header()).expect("header");
    for r in golden_1_0_records().iter().chain(&golden_1_1_extra()) {
        w.write(r).expect("record");
    }
    w.finish().expect("finish")
}

/// A cursor over the primitive encodings of the document.
struct Cur<'a>(&'a [u8]);

impl Cur<'_> {
    fn u8(&mut self) -> u8 {
        let b = self.0[0];
        self.0 = &self.0[1..];
        b
    }
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.0[..4].try_into().expect("4 bytes"));
        self.0 = &self.0[4..];
        v
    }
    fn varint(&mut self) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = self.u8();
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return v;
            }
            shift += 7;
        }
    }
    fn str(&mut self) -> String {
        let n = self.varint() as usize;
        let s = String::from_utf8(self.0[..n].to_vec()).expect("utf-8");
        self.0 = &self.0[n..];
        s
    }
    fn opt(&mut self) -> Option<u64> {
        self.varint().checked_sub(1)
    }
    /// A chunk: length, payload CRC, CRC of those 8 bytes, payload.
    fn chunk(&mut self) -> Vec<u8> {
        let head: [u8; 8] = self.0[..8].try_into().expect("chunk header");
        let len = self.u32() as usize;
        let crc = self.u32();
        assert_eq!(self.u32(), crc32fast::hash(&head), "chunk header CRC");
        let payload = self.0[..len].to_vec();
        self.0 = &self.0[len..];
        assert_eq!(crc, crc32fast::hash(&payload), "payload CRC");
        payload
    }
}

#[test]
fn encoder_writes_the_golden_bytes() {
    let bytes = golden_bytes();
    if std::env::var_os("PERFKIT_BLESS_GOLDEN").is_some() {
        std::fs::write(GOLDEN_1_1, &bytes).expect("write golden");
    }
    let stored = std::fs::read(GOLDEN_1_1).expect("golden trace");
    assert_eq!(
        bytes, stored,
        "the encoding changed: update docs/trace-format.md and the golden file together"
    );
}

#[test]
fn golden_1_0_bytes_follow_the_document_and_are_still_read() {
    let stored = std::fs::read(GOLDEN_1_0).expect("golden trace");
    let mut c = Cur(&stored);
    // File layout: magic, major, minor, then chunks.
    assert_eq!(&c.0[..8], b"PKTRACE\0");
    c.0 = &c.0[8..];
    assert_eq!(u16::from_le_bytes([c.u8(), c.u8()]), 1, "major");
    assert_eq!(u16::from_le_bytes([c.u8(), c.u8()]), 0, "minor");

    // Chunk 0 holds the HEADER record, fields in the documented order.
    let payload = c.chunk();
    let mut h = Cur(&payload);
    assert_eq!(h.u8(), 0x01, "HEADER tag");
    assert_eq!(h.str(), "golden", "writer version");
    assert_eq!(h.varint(), 4242, "pid");
    assert_eq!(h.str(), "host-a", "host");
    assert_eq!(h.str(), "train", "program");
    assert_eq!(h.varint(), 3, "argument count");
    let args: Vec<String> = (0..3).map(|_| h.str()).collect();
    assert_eq!(args, ["train", "--steps", "1"]);
    assert_eq!(h.varint(), 1_700_000_000_000_000_000, "start_unix_ns");
    assert_eq!(
        (h.opt(), h.opt(), h.opt()),
        (Some(1), None, Some(2)),
        "RANK, LOCAL_RANK, WORLD_SIZE"
    );
    assert_eq!(h.str(), "step", "step span name");
    assert_eq!(h.str(), "monotonic", "clock source");
    assert_eq!(h.varint(), 1, "extra count");
    assert_eq!((h.str(), h.str()), ("k".to_owned(), "v".to_owned()));
    assert!(h.0.is_empty(), "nothing after the header in chunk 0");

    // Chunk 1: the records, with their documented tags.
    let payload = c.chunk();
    assert!(c.0.is_empty(), "two chunks in all");
    let mut r = Cur(&payload);
    assert_eq!(r.u8(), 0x05, "THREAD");
    assert_eq!((r.varint(), r.varint()), (0, 77), "thread index, OS tid");
    assert_eq!(r.varint(), "main".len() as u64 + 1, "name length + 1");
    assert_eq!(&r.0[..4], b"main");
    r.0 = &r.0[4..];
    // Names are interned before their first use: STRING 1 `step`, STRING 2 `train`, then
    // CALLSITE 1 (name 1, target 2, no file, no line, INFO span, no fields).
    assert_eq!((r.u8(), r.varint(), r.str()), (0x02, 1, "step".to_owned()));
    assert_eq!((r.u8(), r.varint(), r.str()), (0x02, 2, "train".to_owned()));
    assert_eq!(r.u8(), 0x03, "CALLSITE");
    let callsite: Vec<u64> = (0..5).map(|_| r.varint()).collect();
    assert_eq!(callsite, [1, 1, 2, 0, 0], "id, name, target, file, line");
    assert_eq!((r.u8(), r.varint()), (2, 0), "INFO span, no fields");
    assert_eq!((r.u8(), r.varint()), (0x06, 0), "THREAD_CONTEXT 0");
    // SPAN_NEW: ts zz(100 - 0), id zz(1 - 0), no parent, callsite 1, no values.
    assert_eq!(r.u8(), 0x10, "SPAN_NEW");
    let new: Vec<u64> = (0..5).map(|_| r.varint()).collect();
    assert_eq!(new, [200, 2, 0, 1, 0]);
    // Enter at the same ts and span (deltas 0), exit 250 ns later, close at the exit's ts.
    for (tag, ts) in [(0x11, 0), (0x12, 500), (0x13, 0)] {
        assert_eq!(
            (r.u8(), r.varint(), r.varint()),
            (tag, ts, 0),
            "tag {tag:#04x}"
        );
    }
    assert!(r.0.is_empty(), "nothing else: {:02x?}", r.0);

    // And the reader agrees.
    let mut reader = TraceReader::from_reader(&stored[..], "golden.pktrace").expect("open");
    let header = reader.header().clone();
    let mut want = golden_header();
    want.format_minor = 0;
    assert_eq!(header, want);
    let records: Vec<Record> = reader.by_ref().map(|r| r.expect("record")).collect();
    assert_eq!(records.len(), 5, "{records:?}");
    assert!(
        matches!(&records[1], Record::SpanNew(s) if s.ts == 100 && &*s.callsite.name == "step")
    );
    assert!(matches!(&records[3], Record::SpanExit(e) if e.ts == 350 && e.span == SpanId(1)));
}

#[test]
fn golden_1_1_python_records_follow_the_document() {
    let stored = std::fs::read(GOLDEN_1_1).expect("golden trace");
    let mut c = Cur(&stored);
    assert_eq!(&c.0[..8], b"PKTRACE\0");
    c.0 = &c.0[8..];
    assert_eq!(u16::from_le_bytes([c.u8(), c.u8()]), 1, "major");
    assert_eq!(u16::from_le_bytes([c.u8(), c.u8()]), 1, "minor");
    let _header = c.chunk();
    let payload = c.chunk();
    assert!(c.0.is_empty(), "two chunks in all");
    // The 1.0 records come first, byte for byte as in the 1.0 file.
    let old = std::fs::read(GOLDEN_1_0).expect("golden trace");
    let mut o = Cur(&old[12..]);
    let _ = o.chunk();
    let old_records = o.chunk();
    assert!(payload.starts_with(&old_records), "1.0 records unchanged");
    let mut r = Cur(&payload[old_records.len()..]);
    // Strings 3-5 are defined before the PY_STACK that names them (1 and 2 are `step` and
    // `train`, so `train.py` is 3, `step` keeps 1, `main` is 4).
    assert_eq!(
        (r.u8(), r.varint(), r.str()),
        (0x02, 3, "train.py".to_owned())
    );
    assert_eq!((r.u8(), r.varint(), r.str()), (0x02, 4, "main".to_owned()));
    // PY_STACK 0x80: body length, id 1, 2 frames, (file, function, line) each.
    assert_eq!(r.u8(), 0x80, "PY_STACK");
    let len = r.varint() as usize;
    let body: Vec<u64> = (0..8).map(|_| r.varint()).collect();
    assert_eq!(body, [1, 2, 3, 1, 42, 3, 4, 7]);
    assert_eq!(len, 8, "every field is one byte here");
    // OP_PY_STACK 0x81: body length, op, stack id (0: no frames, GIL not held).
    for (op, stack) in [(5, 1), (6, 0)] {
        assert_eq!(r.u8(), 0x81, "OP_PY_STACK");
        assert_eq!((r.varint(), r.varint(), r.varint()), (2, op, stack));
    }
    assert!(r.0.is_empty(), "nothing else: {:02x?}", r.0);

    // The reader gives back what was written.
    let reader = TraceReader::from_reader(&stored[..], "golden.pktrace").expect("open");
    let records: Vec<Record> = reader.map(|r| r.expect("record")).collect();
    let mut want = golden_1_0_records();
    want.extend(golden_1_1_extra());
    assert_eq!(records, want);
}

#[test]
fn a_1_0_reader_skips_the_python_records() {
    // What a reader of 1.0 does with any extension record: read the length, skip the body.
    // The bytes after each 0x80/0x81 tag are a length and exactly that many body bytes.
    let stored = std::fs::read(GOLDEN_1_1).expect("golden trace");
    let mut c = Cur(&stored[12..]);
    let _ = c.chunk();
    let payload = c.chunk();
    // After the 1.0 records and the two new STRING definitions (which a 1.0 reader knows).
    let old = std::fs::read(GOLDEN_1_0).expect("golden trace");
    let mut o = Cur(&old[12..]);
    let _ = o.chunk();
    let mut r = Cur(&payload[o.chunk().len()..]);
    for _ in 0..2 {
        assert_eq!(r.u8(), 0x02);
        let _ = (r.varint(), r.str());
    }
    let mut skipped = 0;
    while !r.0.is_empty() {
        let tag = r.u8();
        assert!(tag >= 0x80, "only extension records follow: {tag:#04x}");
        let len = r.varint() as usize;
        r.0 = &r.0[len..];
        skipped += 1;
    }
    assert_eq!(skipped, 3);
}
