//! [`PerfLayer`]: the `tracing_subscriber::Layer` that records spans and events.
//!
//! The hot path copies one or two 32-byte slots into the calling thread's ring and returns; an
//! enter and an exit each read the clock (TSC where available) once, a creation and a close
//! that follows its exit reuse the thread's latest reading. Span ids of the trace are allocated
//! from per-thread blocks, so creating a span touches no shared cache line, and nothing is
//! stored in the registry: spans created on the recording thread are found in its own small
//! table; a span used on another thread is sent with its `tracing` id, which the writer maps
//! to the trace id from the span's creation record. Nothing here does I/O, takes a lock that
//! another recording thread could hold, or allocates in the steady state. Nothing here
//! panics: failures are counted as dropped records.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::session::{MAX_TEXT, Producer, RAW_SPAN, Shared, Slot, kind, vtype, with_producer};

/// Records spans (new, enter, exit, close, recorded values) and events into perfkit's trace.
///
/// Obtain one from [`Builder::build`](crate::Builder::build) when you assemble the subscriber
/// yourself; [`init`](crate::init) installs one for you.
pub struct PerfLayer {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for PerfLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerfLayer")
            .field("session", &self.shared.id)
            .finish()
    }
}

#[inline]
fn head(k: u64, n: usize, extra: u64) -> u64 {
    k | ((n as u64) << 8) | (extra << 24)
}

/// Collects field values into value slots.
struct Values<'a> {
    slots: &'a mut Vec<Slot>,
    text: &'a mut String,
    count: u64,
}

impl Values<'_> {
    #[inline]
    fn scalar(&mut self, field: &Field, t: u64, v: u64) {
        self.slots
            .push([t | ((field.index() as u64 & 0xff_ffff) << 8), v, 0, 0]);
        self.count += 1;
    }

    fn text_value(&mut self, field: &Field) {
        let bytes = self.text.as_bytes();
        let first_n = bytes.len().min(24);
        let mut first = [t_str(field, bytes.len()), 0, 0, 0];
        for (w, c) in first[1..].iter_mut().zip(bytes[..first_n].chunks(8)) {
            *w = le_word(c);
        }
        self.slots.push(first);
        for group in bytes[first_n..].chunks(32) {
            let mut s = [0u64; 4];
            for (w, c) in s.iter_mut().zip(group.chunks(8)) {
                *w = le_word(c);
            }
            self.slots.push(s);
        }
        self.count += 1;
    }
}

fn t_str(field: &Field, len: usize) -> u64 {
    vtype::STR | ((field.index() as u64 & 0xff_ffff) << 8) | ((len as u64) << 32)
}

fn le_word(c: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..c.len()].copy_from_slice(c);
    u64::from_le_bytes(b)
}

/// A `fmt::Write` that keeps at most [`MAX_TEXT`] bytes (cut at a character boundary).
struct Capped<'a>(&'a mut String);

impl fmt::Write for Capped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = MAX_TEXT.saturating_sub(self.0.len());
        if s.len() <= room {
            self.0.push_str(s);
        } else {
            let mut cut = room;
            while cut > 0 && !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.0.push_str(&s[..cut]);
        }
        Ok(())
    }
}

impl Visit for Values<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.scalar(field, vtype::U64, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.scalar(field, vtype::I64, value as u64);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.scalar(field, vtype::F64, value.to_bits());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.scalar(field, vtype::BOOL, u64::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text.clear();
        let _ = Capped(self.text).write_str(value);
        self.text_value(field);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text.clear();
        let _ = write!(Capped(self.text), "{value:?}");
        self.text_value(field);
    }
}

impl PerfLayer {
    #[inline]
    fn active(&self) -> bool {
        self.shared.active.load(Ordering::Relaxed)
    }

    fn record_values(p: &mut Producer, start: usize, f: impl FnOnce(&mut Values<'_>)) -> u64 {
        let Producer { scratch, text, .. } = p;
        scratch.truncate(start);
        let mut v = Values {
            slots: scratch,
            text,
            count: 0,
        };
        f(&mut v);
        v.count
    }
}

impl<S> tracing_subscriber::Layer<S> for PerfLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let raw = id.into_u64();
        let meta: &'static Metadata<'static> = attrs.metadata();
        let has_values = !attrs.values().is_empty();
        with_producer(&self.shared, |p| {
            // No clock reading for a creation: it takes the thread's latest reading (a lower
            // bound; the creation is almost always next to the enter or the previous close).
            let ts = if p.last_ts != 0 {
                p.last_ts
            } else {
                let ts = self.shared.raw_now();
                p.last_ts = ts;
                ts
            };
            let sid = p.new_span_id();
            // The parent as (trace id, tracing id): a trace id of 0 leaves it to the writer.
            let (parent, parent_raw) = if attrs.is_contextual() {
                p.current().unwrap_or((0, 0))
            } else if let Some(pr) = attrs.parent() {
                let pr = pr.into_u64();
                (p.resolve(pr), pr)
            } else {
                (0, 0)
            };
            let meta = meta as *const Metadata<'static> as u64;
            if has_values {
                p.scratch.clear();
                p.scratch.push([0, sid, parent, ts]);
                p.scratch.push([meta, 0, raw, parent_raw]);
                let count = Self::record_values(p, 2, |v| attrs.record(v));
                let n = p.scratch.len();
                p.scratch[0][0] = head(kind::NEW, n, 0);
                p.scratch[1][1] = count;
                p.push_scratch();
            } else {
                p.push2(
                    [head(kind::NEW, 2, 0), sid, parent, ts],
                    [meta, 0, raw, parent_raw],
                );
            }
            p.live_insert(raw, sid);
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if !self.active() || values.is_empty() {
            return;
        }
        let ts = self.shared.raw_now();
        let Some(meta) = ctx.metadata(id) else {
            return;
        };
        let meta = meta as *const Metadata<'static> as u64;
        let raw = id.into_u64();
        with_producer(&self.shared, |p| {
            p.last_ts = ts;
            let sid = p.resolve(raw);
            let (span, flag) = if sid != 0 { (sid, 0) } else { (raw, RAW_SPAN) };
            p.scratch.clear();
            p.scratch.push([0, span, ts, meta]);
            let count = Self::record_values(p, 1, |v| values.record(v));
            let n = p.scratch.len();
            p.scratch[0][0] = head(kind::RECORD, n, count & 0xffff) | flag;
            p.push_scratch();
        });
    }

    fn on_enter(&self, id: &Id, _ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let ts = self.shared.raw_now();
        let raw = id.into_u64();
        with_producer(&self.shared, |p| {
            // 0 when the span was not created on this thread: the writer resolves it.
            let sid = p.live_get(raw);
            p.last_ts = ts;
            p.stack.push((raw, sid));
            p.push1([head(kind::ENTER, 1, 0), sid, ts, raw]);
        });
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let ts = self.shared.raw_now();
        let raw = id.into_u64();
        with_producer(&self.shared, |p| {
            // The innermost entered span is almost always the one exited.
            let sid = match p.stack.last() {
                Some(&(r, sid)) if r == raw => {
                    p.stack.pop();
                    sid
                }
                _ => match p.stack.iter().rposition(|e| e.0 == raw) {
                    Some(pos) => p.stack.remove(pos).1,
                    None => p.live_get(raw),
                },
            };
            p.last_ts = ts;
            p.push1([head(kind::EXIT, 1, 0), sid, ts, raw]);
            p.last_exit = (raw, sid, ts, p.head());
        });
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let raw = id.into_u64();
        with_producer(&self.shared, |p| {
            let (last, last_sid, last_ts, last_head) = p.last_exit;
            p.last_exit = (0, 0, 0, usize::MAX);
            // A close right after the span's exit (nothing recorded in between on this thread)
            // reuses the exit's timestamp: they are nanoseconds apart.
            let ts = if last == raw && p.head() == last_head {
                last_ts
            } else {
                let ts = self.shared.raw_now();
                p.last_ts = ts;
                ts
            };
            let mut sid = p.live_remove(raw);
            if sid == 0 && last == raw {
                sid = last_sid;
            }
            p.push1([head(kind::CLOSE, 1, 0), sid, ts, raw]);
        });
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !self.active() || !self.shared.config.record_events {
            return;
        }
        let ts = self.shared.raw_now();
        let meta = event.metadata() as *const Metadata<'static> as u64;
        with_producer(&self.shared, |p| {
            let (sid, raw) = if event.is_contextual() {
                p.current().unwrap_or((0, 0))
            } else if let Some(pr) = event.parent() {
                let pr = pr.into_u64();
                (p.resolve(pr), pr)
            } else {
                (0, 0)
            };
            p.last_ts = ts;
            let (span, flag) = if sid == 0 && raw != 0 {
                (raw, RAW_SPAN)
            } else {
                (sid, 0)
            };
            p.scratch.clear();
            p.scratch.push([0, span, ts, meta]);
            let count = Self::record_values(p, 1, |v| event.record(v));
            let n = p.scratch.len();
            p.scratch[0][0] = head(kind::EVENT, n, count & 0xffff) | flag;
            p.push_scratch();
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tracing_subscriber::layer::SubscriberExt;

    use crate::model::{Record, SpanId};
    use crate::{Builder, TraceReader};

    /// Spans created on one thread and entered, used as parents and closed on others (the
    /// writer resolves their `tracing` ids) keep one trace identity, while `tracing` reuses
    /// the ids of closed spans all the time.
    #[test]
    fn spans_handed_to_other_threads_resolve_to_their_trace_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handoff.pktrace");
        let (layer, guard) = Builder::new()
            .output(&path)
            .buffer_size(1 << 16)
            .wait_when_full(std::time::Duration::from_secs(5))
            .build_local()
            .unwrap()
            .unwrap();
        let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
        const N: usize = 3000;
        let (tx, rx) = std::sync::mpsc::sync_channel::<tracing::Span>(64);
        std::thread::scope(|s| {
            let d = dispatch.clone();
            s.spawn(move || {
                tracing::dispatcher::with_default(&d, || {
                    for i in 0..N {
                        let span = tracing::info_span!("job", i);
                        if tx.send(span).is_err() {
                            return;
                        }
                    }
                });
            });
            let d = dispatch.clone();
            s.spawn(move || {
                tracing::dispatcher::with_default(&d, || {
                    for span in rx {
                        let _e = span.enter();
                        tracing::info_span!(parent: &span, "part").in_scope(|| {
                            let _c = tracing::info_span!("child").entered();
                        });
                    }
                });
            });
        });
        drop(guard);
        let mut r = TraceReader::open(&path).unwrap();
        let mut name: HashMap<SpanId, String> = HashMap::new();
        let mut parent: HashMap<SpanId, Option<SpanId>> = HashMap::new();
        let mut enters: HashMap<SpanId, u32> = HashMap::new();
        let mut closes: HashMap<SpanId, u32> = HashMap::new();
        for rec in r.by_ref() {
            match rec.unwrap() {
                Record::SpanNew(n) => {
                    assert!(name.insert(n.id, n.callsite.name.to_string()).is_none());
                    parent.insert(n.id, n.parent);
                }
                Record::SpanEnter(e) => *enters.entry(e.span).or_default() += 1,
                Record::SpanClose(e) => *closes.entry(e.span).or_default() += 1,
                Record::Dropped(d) => panic!("{} records dropped", d.count),
                _ => {}
            }
        }
        assert!(r.status().is_complete());
        let count = |n: &str| name.values().filter(|v| *v == n).count();
        assert_eq!((count("job"), count("part"), count("child")), (N, N, N));
        for (id, n) in &name {
            assert_eq!(closes.get(id), Some(&1), "{n} {id:?} closed once");
            assert_eq!(enters.get(id), Some(&1), "{n} {id:?} entered once");
            let p = parent[id].map(|p| name[&p].as_str());
            let want = match n.as_str() {
                "job" => None,
                "part" => Some("job"),
                _ => Some("part"),
            };
            assert_eq!(p, want, "parent of {n}");
        }
        assert_eq!(enters.len(), 3 * N, "no enter of an unknown span");
        assert_eq!(closes.len(), 3 * N, "no close of an unknown span");
    }
}
