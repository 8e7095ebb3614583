//! [`PerfLayer`]: the `tracing_subscriber::Layer` that records spans and events.
//!
//! The hot path reads the clock (TSC where available), copies one or two 32-byte slots into the
//! calling thread's ring and returns. Span ids of the trace are allocated from per-thread blocks,
//! so creating a span touches no shared cache line. Nothing here does I/O, takes a lock that
//! another recording thread could hold, or allocates in the steady state (the registry keeps one
//! small extension per span). Nothing here panics: failures are counted as dropped records.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::session::{MAX_TEXT, Producer, Shared, Slot, kind, vtype, with_producer};

/// The trace span id, stored in the registry's extensions of each span.
#[derive(Clone, Copy)]
struct TraceSpanId(u64);

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

    fn trace_id<S>(id: &Id, ctx: &Context<'_, S>) -> Option<u64>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let span = ctx.span(id)?;
        let ext = span.extensions();
        ext.get::<TraceSpanId>().map(|t| t.0)
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
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let ts = self.shared.raw_now();
        let explicit_parent = if attrs.is_contextual() || attrs.is_root() {
            None
        } else {
            attrs.parent().and_then(|p| Self::trace_id(p, &ctx))
        };
        let meta: &'static Metadata<'static> = attrs.metadata();
        let has_values = !attrs.values().is_empty();
        let tid = with_producer(&self.shared, |p| {
            let sid = p.new_span_id();
            let parent = if attrs.is_contextual() {
                p.current_span().unwrap_or(0)
            } else {
                explicit_parent.unwrap_or(0)
            };
            let meta = meta as *const Metadata<'static> as u64;
            if has_values {
                p.scratch.clear();
                p.scratch.push([0, sid, parent, ts]);
                p.scratch.push([meta, 0, 0, 0]);
                let count = Self::record_values(p, 2, |v| attrs.record(v));
                let n = p.scratch.len();
                p.scratch[0][0] = head(kind::NEW, n, 0);
                p.scratch[1][1] = count;
                p.push_scratch();
            } else {
                p.push2([head(kind::NEW, 2, 0), sid, parent, ts], [meta, 0, 0, 0]);
            }
            p.last_new = (id.into_u64(), sid);
            sid
        });
        if let Some(sid) = tid
            && let Some(span) = ctx.span(id)
        {
            span.extensions_mut().insert(TraceSpanId(sid));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if !self.active() || values.is_empty() {
            return;
        }
        let ts = self.shared.raw_now();
        let Some(span) = ctx.span(id) else {
            return;
        };
        let Some(sid) = span.extensions().get::<TraceSpanId>().map(|t| t.0) else {
            return;
        };
        let meta = span.metadata() as *const Metadata<'static> as u64;
        with_producer(&self.shared, |p| {
            p.scratch.clear();
            p.scratch.push([0, sid, ts, meta]);
            let count = Self::record_values(p, 1, |v| values.record(v));
            let n = p.scratch.len();
            p.scratch[0][0] = head(kind::RECORD, n, count & 0xffff);
            p.push_scratch();
        });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let ts = self.shared.raw_now();
        let raw = id.into_u64();
        let hit = with_producer(&self.shared, |p| {
            if p.last_new.0 != raw {
                return false;
            }
            let sid = p.last_new.1;
            p.last_new = (0, 0);
            p.stack.push((raw, sid));
            p.push1([head(kind::ENTER, 1, 0), sid, ts, 0]);
            true
        });
        if hit == Some(false)
            && let Some(sid) = Self::trace_id(id, &ctx)
        {
            with_producer(&self.shared, |p| {
                p.stack.push((raw, sid));
                p.push1([head(kind::ENTER, 1, 0), sid, ts, 0]);
            });
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let ts = self.shared.raw_now();
        let raw = id.into_u64();
        // The innermost entered span is almost always the one exited: no registry lookup then.
        let found = with_producer(&self.shared, |p| {
            let pos = p.stack.iter().rposition(|e| e.0 == raw)?;
            let sid = p.stack.remove(pos).1;
            p.last_exit = (raw, sid);
            p.push1([head(kind::EXIT, 1, 0), sid, ts, 0]);
            Some(())
        })
        .flatten();
        if found.is_none()
            && let Some(sid) = Self::trace_id(id, &ctx)
        {
            with_producer(&self.shared, |p| {
                p.push1([head(kind::EXIT, 1, 0), sid, ts, 0]);
            });
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if !self.active() {
            return;
        }
        let ts = self.shared.raw_now();
        let raw = id.into_u64();
        let hit = with_producer(&self.shared, |p| {
            // Forget cached ids of this span: the id may name another span after this.
            if p.last_new.0 == raw {
                p.last_new = (0, 0);
            }
            if p.last_exit.0 != raw {
                return false;
            }
            let sid = p.last_exit.1;
            p.last_exit = (0, 0);
            p.push1([head(kind::CLOSE, 1, 0), sid, ts, 0]);
            true
        });
        if hit == Some(false)
            && let Some(sid) = Self::trace_id(&id, &ctx)
        {
            with_producer(&self.shared, |p| {
                p.push1([head(kind::CLOSE, 1, 0), sid, ts, 0]);
            });
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !self.active() || !self.shared.config.record_events {
            return;
        }
        let ts = self.shared.raw_now();
        let explicit = if event.is_contextual() || event.is_root() {
            None
        } else {
            event.parent().and_then(|p| Self::trace_id(p, &ctx))
        };
        let meta = event.metadata() as *const Metadata<'static> as u64;
        with_producer(&self.shared, |p| {
            let span = if event.is_contextual() {
                p.current_span().unwrap_or(0)
            } else {
                explicit.unwrap_or(0)
            };
            p.scratch.clear();
            p.scratch.push([0, span, ts, meta]);
            let count = Self::record_values(p, 1, |v| event.record(v));
            let n = p.scratch.len();
            p.scratch[0][0] = head(kind::EVENT, n, count & 0xffff);
            p.push_scratch();
        });
    }
}
