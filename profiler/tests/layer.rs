//! The tracing layer end to end: spans recorded by real threads come back from the file.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use perfkit_profiler::model::{FieldValue, Record, SpanId};
use perfkit_profiler::{Builder, TraceStatus};
use tracing_subscriber::layer::SubscriberExt;

#[test]
fn spans_fields_and_events_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) = common::record_local(Builder::new().output(dir.path()));
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        for step in 0..3u64 {
            let s = tracing::info_span!("step", step, phase = "train", lr = 0.5, ok = true);
            let _e = s.enter();
            {
                let _f = tracing::debug_span!("forward", delta = -3i64).entered();
                tracing::info!(loss = 1.5, "computed loss");
            }
            s.record("phase", "done");
        }
    });
    let stats = guard.finish();
    assert_eq!(stats.dropped, 0);
    let (header, records, status) = common::read_all(&path);
    assert!(status.is_complete(), "{status:?}");
    assert_eq!(header.pid, std::process::id());
    assert_eq!(header.step_span_name, "step");
    assert!(
        path.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with(&format!("-{}.pktrace", std::process::id()))
    );

    let mut names: HashMap<SpanId, String> = HashMap::new();
    let mut steps = Vec::new();
    let mut enters = 0;
    let mut exits = 0;
    let mut closes = 0;
    let mut events = 0;
    let mut recorded = 0;
    for r in &records {
        match r {
            Record::SpanNew(s) => {
                names.insert(s.id, s.callsite.name.to_string());
                if &*s.callsite.name == "step" {
                    let get = |n: &str| {
                        s.fields
                            .iter()
                            .find(|f| &*f.name == n)
                            .map(|f| f.value.clone())
                    };
                    steps.push(get("step").unwrap());
                    assert_eq!(get("phase"), Some(FieldValue::Str("train".into())));
                    assert_eq!(get("lr"), Some(FieldValue::F64(0.5)));
                    assert_eq!(get("ok"), Some(FieldValue::Bool(true)));
                    assert!(s.parent.is_none());
                } else {
                    assert_eq!(&*s.callsite.name, "forward");
                    let parent = s.parent.expect("forward has a parent");
                    assert_eq!(names[&parent], "step");
                    assert_eq!(s.fields[0].value, FieldValue::I64(-3));
                }
            }
            Record::SpanEnter(_) => enters += 1,
            Record::SpanExit(_) => exits += 1,
            Record::SpanClose(_) => closes += 1,
            Record::SpanRecord(r) => {
                recorded += 1;
                assert_eq!(names[&r.span], "step");
                assert_eq!(r.fields[0].value, FieldValue::Str("done".into()));
            }
            Record::Event(e) => {
                events += 1;
                assert_eq!(names[&e.span.unwrap()], "forward");
                let msg = e.fields.iter().find(|f| &*f.name == "message").unwrap();
                assert_eq!(msg.value, FieldValue::Str("computed loss".into()));
            }
            _ => {}
        }
    }
    assert_eq!(steps, (0..3).map(FieldValue::U64).collect::<Vec<_>>());
    assert_eq!((enters, exits, closes, events, recorded), (6, 6, 6, 3, 3));
    // Timestamps of one thread never go backwards.
    let ts: Vec<u64> = records
        .iter()
        .filter(|r| r.thread() == Some(0))
        .filter_map(Record::ts)
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    let _ = Duration::ZERO;
}

/// Spans from 8 threads x 100,000 spans arrive complete, correctly nested.
#[test]
fn eight_threads_times_100k_spans_arrive_complete() {
    const THREADS: usize = 8;
    const PAIRS: usize = 50_000; // an outer and an inner span per iteration: 100,000 spans per thread
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) = common::record_local(
        Builder::new()
            .output(dir.path().join("stress.pktrace"))
            .wait_when_full(Duration::from_secs(10)),
    );
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let dispatch = dispatch.clone();
            s.spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    for i in 0..PAIRS {
                        let _o = tracing::info_span!("outer", t, i).entered();
                        let _i = tracing::info_span!("inner").entered();
                    }
                });
            });
        }
    });
    let stats = guard.finish();
    assert_eq!(stats.dropped, 0);

    // Stream the trace (no need to hold 3.2 million records). Records of one thread are in
    // order, so per-thread state is enough to check the nesting (and cheap in debug builds).
    let mut reader = perfkit_profiler::TraceReader::open(&path).unwrap();
    #[derive(Default, Clone)]
    struct PerThread {
        last_outer: Option<SpanId>,
        last_inner: Option<SpanId>,
        stack: Vec<SpanId>,
        news: usize,
    }
    let mut threads: Vec<PerThread> = Vec::new();
    let mut all_ids: Vec<u64> = Vec::with_capacity(THREADS * PAIRS * 2);
    let (mut news, mut enters, mut exits, mut closes) = (0usize, 0usize, 0usize, 0usize);
    for rec in reader.by_ref() {
        let rec = rec.unwrap();
        let Some(t) = rec.thread() else { continue };
        let t = t as usize;
        if threads.len() <= t {
            threads.resize(t + 1, PerThread::default());
        }
        let th = &mut threads[t];
        match rec {
            Record::SpanNew(s) => {
                news += 1;
                th.news += 1;
                all_ids.push(s.id.0);
                if &*s.callsite.name == "outer" {
                    assert!(s.parent.is_none());
                    th.last_outer = Some(s.id);
                } else {
                    assert_eq!(
                        s.parent, th.last_outer,
                        "an inner span's parent is the outer span of its thread"
                    );
                    th.last_inner = Some(s.id);
                }
            }
            Record::SpanEnter(e) => {
                enters += 1;
                let expected = if th.stack.is_empty() {
                    th.last_outer
                } else {
                    th.last_inner
                };
                assert_eq!(Some(e.span), expected, "nesting is outer > inner");
                th.stack.push(e.span);
            }
            Record::SpanExit(e) => {
                exits += 1;
                assert_eq!(th.stack.pop(), Some(e.span), "exits are LIFO");
            }
            Record::SpanClose(_) => closes += 1,
            _ => {}
        }
    }
    assert!(reader.status().is_complete());
    let total = THREADS * PAIRS * 2;
    assert_eq!((news, enters, exits, closes), (total, total, total, total));
    let busy: Vec<usize> = threads.iter().map(|t| t.news).filter(|&n| n > 0).collect();
    assert_eq!(busy, vec![PAIRS * 2; THREADS]);
    assert!(threads.iter().all(|t| t.stack.is_empty()));
    all_ids.sort_unstable();
    all_ids.dedup();
    assert_eq!(all_ids.len(), total, "span ids are unique");
}

/// With a tiny buffer and no waiting, surplus records are dropped and counted, never lost silently.
#[test]
fn dropped_records_are_counted_in_the_trace() {
    const SPANS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) =
        common::record_local(Builder::new().output(dir.path()).buffer_size(64));
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        for i in 0..SPANS {
            let _s = tracing::info_span!("tiny", i).entered();
        }
    });
    let stats = guard.finish();
    let (_, records, status) = common::read_all(&path);
    let span_records = records
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::SpanNew(_)
                    | Record::SpanEnter(_)
                    | Record::SpanExit(_)
                    | Record::SpanClose(_)
            )
        })
        .count() as u64;
    let dropped: u64 = records
        .iter()
        .filter_map(|r| match r {
            Record::Dropped(d) => Some(d.count),
            _ => None,
        })
        .sum();
    let TraceStatus::Complete(end) = status else {
        panic!("{status:?}")
    };
    assert!(dropped > 0, "a 64-slot buffer cannot hold {SPANS} spans");
    assert_eq!(dropped, stats.dropped);
    assert_eq!(end.dropped, dropped);
    // Every span produces 4 records (new, enter, exit, close): each was either written or counted.
    assert_eq!(span_records + dropped, SPANS * 4);
}

/// A panic on a recording thread leaves a panic record (message and location) in the trace.
#[test]
fn panics_are_marked_in_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) = common::record_local(Builder::new().output(dir.path()));
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    let joined = std::thread::spawn(move || {
        tracing::dispatcher::with_default(&dispatch, || {
            let _s = tracing::info_span!("step", step = 1u64).entered();
            panic!("loss is NaN at step 1");
        })
    })
    .join();
    assert!(joined.is_err());
    drop(guard);
    let (_, records, status) = common::read_all(&path);
    assert!(status.is_complete());
    let panic = records
        .iter()
        .find_map(|r| match r {
            Record::Panic(p) => Some(p.clone()),
            _ => None,
        })
        .expect("a panic record");
    assert_eq!(panic.message, "loss is NaN at step 1");
    let loc = panic.location.expect("panic location");
    assert!(loc.file.ends_with("layer.rs"), "{loc}");
    // The span was exited and closed while unwinding.
    assert!(records.iter().any(|r| matches!(r, Record::SpanClose(_))));
}

/// Without an output nothing is recorded and no guard is active.
#[test]
fn no_output_means_no_recording() {
    let built = Builder::new().no_output().build_local().unwrap();
    assert!(built.is_none());
}

/// Spans entered again later, entered on other threads, used as explicit parents there and
/// closed there keep one identity; the header describes the clock.
#[test]
fn spans_crossing_threads_keep_their_identity() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, guard, path) = common::record_local(Builder::new().output(dir.path()));
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
    tracing::dispatcher::with_default(&dispatch, || {
        let epoch = tracing::info_span!("epoch");
        let other = tracing::info_span!("other"); // created before `epoch` is entered
        for _ in 0..3 {
            let _e = epoch.enter();
            let _s = tracing::info_span!("step").entered();
        }
        drop(other);
        let moved = epoch.clone();
        let d = dispatch.clone();
        std::thread::spawn(move || {
            tracing::dispatcher::with_default(&d, || {
                let _e = moved.enter();
                let _c = tracing::info_span!("worker_child").entered();
                let _x = tracing::info_span!(parent: &moved, "explicit").entered();
            });
            drop(moved);
        })
        .join()
        .unwrap();
        // The last handle is dropped on another thread: the close happens there.
        std::thread::spawn(move || drop(epoch)).join().unwrap();
    });
    drop(guard);
    let (header, records, status) = common::read_all(&path);
    assert!(status.is_complete());
    assert!(
        ["tsc", "monotonic"].contains(&header.clock.as_str()),
        "{}",
        header.clock
    );
    assert!(
        header
            .extra
            .iter()
            .any(|(k, _)| k == "clock.monotonic_origin_ns")
    );
    let mut ids: HashMap<String, Vec<SpanId>> = HashMap::new();
    let mut parents: HashMap<SpanId, Option<SpanId>> = HashMap::new();
    for r in &records {
        if let Record::SpanNew(s) = r {
            ids.entry(s.callsite.name.to_string())
                .or_default()
                .push(s.id);
            parents.insert(s.id, s.parent);
        }
    }
    let epoch = ids["epoch"][0];
    assert_eq!(ids["step"].len(), 3);
    assert!(ids["step"].iter().all(|s| parents[s] == Some(epoch)));
    assert_eq!(parents[&ids["worker_child"][0]], Some(epoch));
    assert_eq!(parents[&ids["explicit"][0]], Some(epoch));
    let count =
        |f: fn(&Record) -> Option<SpanId>| records.iter().filter(|r| f(r) == Some(epoch)).count();
    assert_eq!(
        count(|r| match r {
            Record::SpanEnter(e) => Some(e.span),
            _ => None,
        }),
        4
    );
    assert_eq!(
        count(|r| match r {
            Record::SpanExit(e) => Some(e.span),
            _ => None,
        }),
        4
    );
    let closes: Vec<u32> = records
        .iter()
        .filter_map(|r| match r {
            Record::SpanClose(e) if e.span == epoch => Some(e.thread),
            _ => None,
        })
        .collect();
    assert_eq!(closes.len(), 1);
    assert_ne!(
        closes[0], 0,
        "closed on the thread that dropped the last handle"
    );
    // Every span is closed exactly once.
    let closed = records
        .iter()
        .filter(|r| matches!(r, Record::SpanClose(_)))
        .count();
    assert_eq!(closed, parents.len());
}

/// An output that cannot be created is a clear error naming the path, not a panic.
#[test]
fn an_unwritable_output_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = Builder::new()
        .output(file.join("traces"))
        .build_local()
        .expect_err("cannot create a directory under a file");
    let msg = err.to_string();
    assert!(msg.starts_with("cannot create trace file "), "{msg}");
    assert!(msg.contains("not-a-dir"), "{msg}");
}
