//! Second pass over the primary process: the events of a few chosen steps.

use std::collections::HashMap;

use crate::event::{Event, OpKind};
use crate::model::{StepPoint, Timeline, TimelineItem, TimelineTrack, TimelineWindow};

/// Picks up to four representative steps from the exact per-step list: the median, the
/// slowest and the first after the first one (warm-up excluded when there are enough steps).
/// When the excluded first step is slower than every other, it is shown too and the labels say
/// so (`first step (warm-up), the slowest`, `slowest step after the first`): the timeline never
/// calls a step the slowest when it is not.
pub fn choose_windows(steps: &[StepPoint]) -> Vec<TimelineWindow> {
    if steps.is_empty() {
        return Vec::new();
    }
    let mut picks: Vec<(&str, usize)> = Vec::new();
    let candidates: Vec<usize> = if steps.len() > 2 {
        (1..steps.len()).collect()
    } else {
        (0..steps.len()).collect()
    };
    let mut by_wall = candidates.clone();
    by_wall.sort_by_key(|&i| (steps[i].breakdown.wall_ns, i));
    picks.push(("median step", by_wall[by_wall.len() / 2]));
    if let Some(&slowest) = by_wall.last() {
        let wall = |i: usize| steps[i].breakdown.wall_ns;
        if candidates[0] > 0 && wall(0) > wall(slowest) {
            picks.push(("first step (warm-up), the slowest", 0));
            picks.push(("slowest step after the first", slowest));
        } else {
            picks.push(("slowest step", slowest));
        }
    }
    picks.push(("early step", candidates[0]));
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (label, i) in picks {
        if seen.contains(&i) {
            continue;
        }
        seen.push(i);
        let p = &steps[i];
        out.push(TimelineWindow {
            label: label.to_owned(),
            step: p.index,
            start_ns: p.start_ns,
            end_ns: p.start_ns + p.breakdown.wall_ns,
            truncated: 0,
        });
    }
    out.sort_by_key(|w| w.start_ns);
    out
}

struct Open {
    span: u64,
    name: std::sync::Arc<str>,
    start: u64,
}

/// Collects the items that overlap the chosen windows.
pub struct TimelineCollector {
    windows: Vec<TimelineWindow>,
    per_window: Vec<usize>,
    cap: usize,
    tracks: Vec<TimelineTrack>,
    thread_track: HashMap<u64, usize>,
    stream_track: HashMap<u64, usize>,
    thread_names: HashMap<u64, String>,
    stacks: HashMap<u64, Vec<Open>>,
    pending: HashMap<u64, (u64, &'static str, String)>,
    /// Interned span names (no allocation per span).
    names: HashMap<Box<str>, std::sync::Arc<str>>,
    /// End of the last window: spans starting after it are not needed.
    last_end: u64,
}

impl TimelineCollector {
    /// A collector for `windows`, keeping at most `cap` items per window.
    pub fn new(windows: Vec<TimelineWindow>, cap: usize) -> Self {
        Self {
            per_window: vec![0; windows.len()],
            windows,
            cap,
            tracks: Vec::new(),
            thread_track: HashMap::new(),
            stream_track: HashMap::new(),
            thread_names: HashMap::new(),
            stacks: HashMap::new(),
            pending: HashMap::new(),
            names: HashMap::new(),
            last_end: 0,
        }
        .with_last_end()
    }

    fn with_last_end(mut self) -> Self {
        self.last_end = self.windows.iter().map(|w| w.end_ns).max().unwrap_or(0);
        self
    }

    fn intern(&mut self, name: &str) -> std::sync::Arc<str> {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let n: std::sync::Arc<str> = name.into();
        self.names.insert(name.into(), n.clone());
        n
    }

    fn window_of(&self, start: u64, end: u64) -> Option<usize> {
        self.windows
            .iter()
            .position(|w| start < w.end_ns.max(w.start_ns + 1) && end.max(start + 1) > w.start_ns)
    }

    fn add(&mut self, track: usize, w: usize, mut item: TimelineItem) {
        // Nested deeper than the stacks are kept elsewhere (a row each would make the drawing
        // as tall as the input is deep): counted as not shown, as items past the cap are.
        if self.per_window[w] >= self.cap || item.depth as usize >= crate::ingest::MAX_STACK_DEPTH {
            self.windows[w].truncated += 1;
            return;
        }
        self.per_window[w] += 1;
        item.window = w as u32;
        self.tracks[track].items.push(item);
    }

    fn thread_track(&mut self, thread: u64) -> usize {
        if let Some(&t) = self.thread_track.get(&thread) {
            return t;
        }
        let name = match self.thread_names.get(&thread) {
            Some(n) if !n.is_empty() => format!("thread {n}"),
            _ => format!("thread {thread}"),
        };
        self.tracks.push(TimelineTrack {
            name,
            items: Vec::new(),
        });
        let t = self.tracks.len() - 1;
        self.thread_track.insert(thread, t);
        t
    }

    fn stream_track(&mut self, stream: u64) -> usize {
        if let Some(&t) = self.stream_track.get(&stream) {
            return t;
        }
        self.tracks.push(TimelineTrack {
            name: format!("stream {stream}"),
            items: Vec::new(),
        });
        let t = self.tracks.len() - 1;
        self.stream_track.insert(stream, t);
        t
    }

    fn gpu_item(&mut self, stream: u64, kind: &'static str, name: String, s: u64, e: u64) {
        let Some(w) = self.window_of(s, e) else {
            return;
        };
        let track = self.stream_track(stream);
        self.add(
            track,
            w,
            TimelineItem {
                window: 0,
                start_ns: s,
                dur_ns: e.saturating_sub(s),
                depth: 0,
                kind: kind.to_owned(),
                name,
            },
        );
    }

    /// Feeds one event.
    pub fn push(&mut self, event: &Event<'_>) {
        if self.windows.is_empty() {
            return;
        }
        match *event {
            Event::Thread { thread, name } => {
                self.thread_names.insert(thread, name.to_owned());
            }
            Event::Enter {
                thread,
                span,
                name,
                ts_ns,
                ..
            } => {
                if ts_ns > self.last_end {
                    return;
                }
                let name = self.intern(name);
                self.stacks.entry(thread).or_default().push(Open {
                    span,
                    name,
                    start: ts_ns,
                });
            }
            Event::Exit {
                thread,
                span,
                ts_ns,
            } => {
                let Some(stack) = self.stacks.get_mut(&thread) else {
                    return;
                };
                let Some(pos) = stack.iter().rposition(|o| o.span == span) else {
                    return;
                };
                let closed: Vec<Open> = stack.drain(pos..).collect();
                for (k, open) in closed.into_iter().enumerate() {
                    let depth = (pos + k) as u32;
                    if let Some(w) = self.window_of(open.start, ts_ns) {
                        let track = self.thread_track(thread);
                        self.add(
                            track,
                            w,
                            TimelineItem {
                                window: 0,
                                start_ns: open.start,
                                dur_ns: ts_ns.saturating_sub(open.start),
                                depth,
                                kind: "span".to_owned(),
                                name: open.name.to_string(),
                            },
                        );
                    }
                }
            }
            Event::Gpu(op) => {
                let kind = match op.kind {
                    OpKind::Kernel => "kernel",
                    OpKind::Copy(d) => d.as_str(),
                    OpKind::Memset => "memset",
                    OpKind::Sync => "sync",
                    OpKind::Alloc | OpKind::Free => return,
                };
                let depth = self.stacks.get(&op.thread).map_or(0, |s| s.len() as u32);
                if (op.kind == OpKind::Sync || op.host_end_ns > op.host_start_ns)
                    && let Some(w) = self.window_of(op.host_start_ns, op.host_end_ns)
                {
                    let track = self.thread_track(op.thread);
                    let name = if op.kind == OpKind::Sync {
                        "synchronize".to_owned()
                    } else if op.name.is_empty() {
                        format!("launch {kind}")
                    } else {
                        format!("launch {}", op.name)
                    };
                    self.add(
                        track,
                        w,
                        TimelineItem {
                            window: 0,
                            start_ns: op.host_start_ns,
                            dur_ns: op.host_end_ns - op.host_start_ns,
                            depth,
                            kind: if op.kind == OpKind::Sync {
                                "sync".to_owned()
                            } else {
                                "launch".to_owned()
                            },
                            name,
                        },
                    );
                }
                let Some(stream) = op.stream else {
                    return;
                };
                if op.kind == OpKind::Sync {
                    return;
                }
                // Skip what cannot fall in a window before building its name.
                match (op.gpu_start_ns, op.gpu_end_ns) {
                    (Some(s), Some(e)) if self.window_of(s, e).is_none() => return,
                    (None, _) | (_, None) if op.id == 0 || op.host_start_ns > self.last_end => {
                        return;
                    }
                    _ => {}
                }
                let name = if op.name.is_empty() {
                    format!("{kind} {} B", op.bytes)
                } else {
                    op.name.to_owned()
                };
                match (op.gpu_start_ns, op.gpu_end_ns) {
                    (Some(s), Some(e)) => self.gpu_item(stream, kind, name, s, e),
                    _ => {
                        self.pending.insert(op.id, (stream, kind, name));
                    }
                }
            }
            Event::GpuTiming {
                id,
                gpu_start_ns,
                gpu_end_ns,
            } => {
                if let Some((stream, kind, name)) = self.pending.remove(&id) {
                    self.gpu_item(stream, kind, name, gpu_start_ns, gpu_end_ns);
                }
            }
            Event::Dropped { .. }
            | Event::InvalidGpu
            | Event::Close { .. }
            | Event::Other { .. }
            | Event::Device { .. }
            | Event::DeviceMemory { .. } => {}
        }
    }

    /// The collected timeline: thread tracks first, then streams; items by start.
    pub fn finish(mut self, process: String) -> Timeline {
        let mut order: Vec<usize> = (0..self.tracks.len()).collect();
        let stream_of: HashMap<usize, u64> =
            self.stream_track.iter().map(|(s, t)| (*t, *s)).collect();
        order.sort_by_key(|&t| match stream_of.get(&t) {
            Some(&s) => (1, s),
            None => (0, t as u64),
        });
        let mut tracks = Vec::with_capacity(order.len());
        for t in order {
            let mut track = std::mem::take(&mut self.tracks[t]);
            track.items.sort_by_key(|i| (i.start_ns, i.depth));
            tracks.push(track);
        }
        Timeline {
            process,
            windows: self.windows,
            tracks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StepBreakdown;

    fn steps(walls: &[u64]) -> Vec<StepPoint> {
        let mut start = 0;
        walls
            .iter()
            .enumerate()
            .map(|(i, &wall_ns)| {
                let p = StepPoint {
                    index: i as u64,
                    start_ns: start,
                    breakdown: StepBreakdown {
                        wall_ns,
                        ..StepBreakdown::default()
                    },
                };
                start += wall_ns;
                p
            })
            .collect()
    }

    fn labels(walls: &[u64]) -> Vec<(String, u64)> {
        choose_windows(&steps(walls))
            .into_iter()
            .map(|w| (w.label, w.step))
            .collect()
    }

    #[test]
    fn a_slowest_first_step_is_shown_and_named() {
        let got = labels(&[90, 10, 12, 11, 30, 10]);
        assert!(
            got.contains(&("first step (warm-up), the slowest".to_owned(), 0)),
            "{got:?}"
        );
        assert!(
            got.contains(&("slowest step after the first".to_owned(), 4)),
            "{got:?}"
        );
        assert!(!got.iter().any(|(l, _)| l == "slowest step"), "{got:?}");
    }

    #[test]
    fn the_slowest_step_is_named_plainly_when_it_is_the_slowest() {
        let got = labels(&[20, 10, 12, 11, 30, 10]);
        assert!(got.contains(&("slowest step".to_owned(), 4)), "{got:?}");
        assert!(!got.iter().any(|(_, i)| *i == 0), "{got:?}");
    }
}
