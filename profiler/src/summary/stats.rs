//! Streaming aggregation of span events into per-span and per-step figures.
//!
//! Memory is bounded by the number of distinct span names, the number of spans open at the same
//! time and the nesting depth, plus one integer per step (the step durations are needed for the
//! median and the 95th percentile).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The name shown for a span whose creation record is missing from the trace.
pub const UNKNOWN_SPAN: &str = "<unknown span>";

/// The name under which a span whose callsite has an empty name is counted (and shown in the
/// reports: an empty name cannot be seen, nor drawn as a flamegraph frame).
pub const UNNAMED_SPAN: &str = "<unnamed>";

/// Statistics of the step span's durations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepStats {
    /// The span name that marks a step (`step` unless the program configured another).
    pub span: String,
    /// Completed steps.
    pub count: u64,
    /// Sum of the step durations, in nanoseconds.
    pub total_ns: u64,
    /// Mean step duration (ns); `null` when there is no step.
    pub mean_ns: Option<u64>,
    /// Median step duration (ns; the mean of the two middle values for an even count).
    pub median_ns: Option<u64>,
    /// 95th percentile (nearest rank) of the step durations (ns).
    pub p95_ns: Option<u64>,
    /// Shortest step (ns).
    pub min_ns: Option<u64>,
    /// Longest step (ns).
    pub max_ns: Option<u64>,
    /// Population standard deviation of the step durations (ns): the run's step-to-step jitter.
    pub stddev_ns: Option<u64>,
}

impl StepStats {
    /// Computes the statistics of `durations_ns` (any order; sorted in place).
    pub fn from_durations(span: &str, durations_ns: &mut [u64]) -> Self {
        durations_ns.sort_unstable();
        let count = durations_ns.len();
        let total: u128 = durations_ns.iter().map(|&d| u128::from(d)).sum();
        let mut stats = Self {
            span: span.to_owned(),
            count: count as u64,
            total_ns: u64::try_from(total).unwrap_or(u64::MAX),
            mean_ns: None,
            median_ns: None,
            p95_ns: None,
            min_ns: None,
            max_ns: None,
            stddev_ns: None,
        };
        if count == 0 {
            return stats;
        }
        let n = count as f64;
        let mean = total as f64 / n;
        let variance = durations_ns
            .iter()
            .map(|&d| {
                let delta = d as f64 - mean;
                delta * delta
            })
            .sum::<f64>()
            / n;
        let median = if count % 2 == 1 {
            durations_ns[count / 2]
        } else {
            let (a, b) = (durations_ns[count / 2 - 1], durations_ns[count / 2]);
            // Round half up, without overflow.
            u64::try_from((u128::from(a) + u128::from(b)).div_ceil(2)).unwrap_or(u64::MAX)
        };
        stats.mean_ns = Some(mean.round() as u64);
        stats.median_ns = Some(median);
        stats.p95_ns = Some(nearest_rank(durations_ns, 95));
        stats.min_ns = durations_ns.first().copied();
        stats.max_ns = durations_ns.last().copied();
        stats.stddev_ns = Some(variance.sqrt().round() as u64);
        stats
    }
}

/// The nearest-rank percentile `p` (1..=100) of sorted, non-empty `values`.
fn nearest_rank(sorted: &[u64], p: usize) -> u64 {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// One row of the span table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SpanStats {
    /// The span's name.
    pub name: String,
    /// Entries of completed spans of this name: each busy interval (enter to exit) is one
    /// call, as tracing-chrome and Lightning's profilers count them; a span entered several
    /// times (candle's traced `Linear`) counts each entry.
    pub calls: u64,
    /// Time spent inside these spans (entered, summed over threads), in ns.
    pub total_ns: u64,
    /// `total_ns` minus the time spent in their direct child spans on the same thread, in ns.
    pub self_ns: u64,
    /// `total_ns / calls`, in ns.
    pub mean_ns: u64,
    /// `total_ns` as a percentage of the run's wall time (can exceed 100 with several threads).
    pub percent_of_wall: f64,
    /// `self_ns` as a percentage of the run's wall time.
    pub self_percent_of_wall: f64,
}

#[derive(Debug, Default, Clone, Copy)]
struct NameTotals {
    calls: u64,
    total_ns: u64,
    self_ns: u64,
}

/// A span that has been created or entered and not closed yet.
#[derive(Debug, Clone, Copy, Default)]
struct Open {
    /// Index into the names; `None` until the span's creation record is seen (records of
    /// different threads may arrive slightly out of order).
    name: Option<usize>,
    entered: bool,
    /// Busy intervals (enter to exit) so far.
    entries: u64,
    busy_ns: u64,
    self_ns: u64,
}

/// A span currently entered on a thread.
#[derive(Debug, Clone, Copy)]
struct Frame {
    span: u64,
    entered_at: u64,
    children_ns: u64,
}

/// Accumulates one process's span events.
///
/// Feed it [`SpanAggregator::new_span`], [`SpanAggregator::enter`], [`SpanAggregator::exit`] and
/// [`SpanAggregator::close`] in trace order (per thread, timestamps non-decreasing); then
/// [`SpanAggregator::finish`].
/// Events that do not match (an exit without an enter, a close of an unknown span) are counted
/// in [`SpanAggregator::unmatched`] and otherwise ignored: a trace cut short or written by a
/// program that mixes up its guards still gives figures.
#[derive(Debug)]
pub struct SpanAggregator {
    step_name: String,
    names: Vec<String>,
    name_index: HashMap<String, usize>,
    totals: Vec<NameTotals>,
    open: HashMap<u64, Open>,
    stacks: HashMap<u64, Vec<Frame>>,
    steps_ns: Vec<u64>,
    unmatched: u64,
}

impl SpanAggregator {
    /// An empty aggregator; spans named `step_name` are the training steps.
    pub fn new(step_name: &str) -> Self {
        Self {
            step_name: step_name.to_owned(),
            names: Vec::new(),
            name_index: HashMap::new(),
            totals: Vec::new(),
            open: HashMap::new(),
            stacks: HashMap::new(),
            steps_ns: Vec::new(),
            unmatched: 0,
        }
    }

    fn intern(&mut self, name: &str) -> usize {
        if let Some(&i) = self.name_index.get(name) {
            return i;
        }
        let i = self.names.len();
        self.names.push(name.to_owned());
        self.name_index.insert(name.to_owned(), i);
        self.totals.push(NameTotals::default());
        i
    }

    /// Span `span` was created with `name`.
    pub fn new_span(&mut self, span: u64, name: &str) {
        let name = self.intern(if name.is_empty() { UNNAMED_SPAN } else { name });
        self.open.entry(span).or_default().name = Some(name);
    }

    /// Span `span` was entered on `thread` at `at_ns`.
    pub fn enter(&mut self, thread: u64, span: u64, at_ns: u64) {
        self.open.entry(span).or_default().entered = true;
        self.stacks.entry(thread).or_default().push(Frame {
            span,
            entered_at: at_ns,
            children_ns: 0,
        });
    }

    /// Span `span` was exited on `thread` at `at_ns`.
    pub fn exit(&mut self, thread: u64, span: u64, at_ns: u64) {
        let Some(stack) = self.stacks.get_mut(&thread) else {
            self.unmatched += 1;
            return;
        };
        // Normally the innermost frame; guards dropped out of order exit a deeper one.
        let Some(pos) = stack.iter().rposition(|f| f.span == span) else {
            self.unmatched += 1;
            return;
        };
        let frame = stack.remove(pos);
        let duration = at_ns.saturating_sub(frame.entered_at);
        let own = duration.saturating_sub(frame.children_ns);
        if pos > 0
            && let Some(parent) = stack.get_mut(pos - 1)
        {
            parent.children_ns = parent.children_ns.saturating_add(duration);
        }
        if let Some(open) = self.open.get_mut(&span) {
            open.entries += 1;
            open.busy_ns = open.busy_ns.saturating_add(duration);
            open.self_ns = open.self_ns.saturating_add(own);
        }
    }

    /// Span `span` was closed (it will not be entered again). A span that was never entered
    /// is not counted.
    pub fn close(&mut self, span: u64) {
        let Some(open) = self.open.remove(&span) else {
            self.unmatched += 1;
            return;
        };
        if !open.entered {
            return;
        }
        let name = match open.name {
            Some(name) => name,
            // Its creation record was lost (dropped events): still count its time.
            None => self.intern(UNKNOWN_SPAN),
        };
        let totals = &mut self.totals[name];
        totals.calls += open.entries.max(1);
        totals.total_ns = totals.total_ns.saturating_add(open.busy_ns);
        totals.self_ns = totals.self_ns.saturating_add(open.self_ns);
        if self.names[name] == self.step_name {
            self.steps_ns.push(open.busy_ns);
        }
    }

    /// Events that matched nothing so far.
    pub fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Spans entered and not closed yet.
    pub fn open_spans(&self) -> u64 {
        self.open.values().filter(|o| o.entered).count() as u64
    }

    /// Distinct threads that entered a span.
    pub fn threads(&self) -> u64 {
        self.stacks.len() as u64
    }

    /// The per-name table (by total time, longest first) and the step statistics.
    /// `wall_ns` is the denominator of the percentages.
    pub fn finish(mut self, wall_ns: u64) -> (Vec<SpanStats>, StepStats) {
        let steps = StepStats::from_durations(&self.step_name, &mut self.steps_ns);
        let spans = rows(
            self.names
                .into_iter()
                .zip(self.totals)
                .filter(|(_, t)| t.calls > 0),
            wall_ns,
        );
        (spans, steps)
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    // Two decimals are plenty and keep the JSON stable.
    (part as f64 * 10_000.0 / whole as f64).round() / 100.0
}

fn rows(totals: impl Iterator<Item = (String, NameTotals)>, wall_ns: u64) -> Vec<SpanStats> {
    let mut rows: Vec<SpanStats> = totals
        .map(|(name, t)| SpanStats {
            name,
            calls: t.calls,
            total_ns: t.total_ns,
            self_ns: t.self_ns,
            mean_ns: t.total_ns / t.calls.max(1),
            percent_of_wall: percent(t.total_ns, wall_ns),
            self_percent_of_wall: percent(t.self_ns, wall_ns),
        })
        .collect();
    rows.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

/// Adds several processes' span tables into one (by name), recomputing means and percentages.
pub fn merge_span_tables<'a>(
    tables: impl IntoIterator<Item = &'a [SpanStats]>,
    wall_ns: u64,
) -> Vec<SpanStats> {
    let mut by_name: HashMap<String, NameTotals> = HashMap::new();
    for table in tables {
        for row in table {
            let t = by_name.entry(row.name.clone()).or_default();
            t.calls += row.calls;
            t.total_ns = t.total_ns.saturating_add(row.total_ns);
            t.self_ns = t.self_ns.saturating_add(row.self_ns);
        }
    }
    rows(by_name.into_iter(), wall_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_statistics() {
        let mut d = vec![50, 10, 40, 20, 30];
        let s = StepStats::from_durations("step", &mut d);
        assert_eq!(s.count, 5);
        assert_eq!(s.total_ns, 150);
        assert_eq!(s.mean_ns, Some(30));
        assert_eq!(s.median_ns, Some(30));
        assert_eq!(s.p95_ns, Some(50));
        assert_eq!(s.min_ns, Some(10));
        assert_eq!(s.max_ns, Some(50));
        // population stddev of 10..50 step 10 = sqrt(200) = 14.14
        assert_eq!(s.stddev_ns, Some(14));

        let mut even = vec![1, 2, 3, 4];
        assert_eq!(
            StepStats::from_durations("step", &mut even).median_ns,
            Some(3),
            "mean of 2 and 3 rounds half up"
        );
        let mut hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(
            StepStats::from_durations("step", &mut hundred).p95_ns,
            Some(95)
        );
        let empty = StepStats::from_durations("step", &mut []);
        assert_eq!(empty.count, 0);
        assert_eq!(empty.mean_ns, None);
        assert_eq!(empty.p95_ns, None);
    }

    #[test]
    fn self_time_subtracts_direct_children() {
        let mut a = SpanAggregator::new("step");
        // step [0, 100) with forward [10, 40) containing matmul [15, 35), backward [50, 90)
        a.new_span(1, "step");
        a.enter(1, 1, 0);
        a.new_span(2, "forward");
        a.enter(1, 2, 10);
        a.new_span(3, "matmul");
        a.enter(1, 3, 15);
        a.exit(1, 3, 35);
        a.close(3);
        a.exit(1, 2, 40);
        a.close(2);
        a.new_span(4, "backward");
        a.enter(1, 4, 50);
        a.exit(1, 4, 90);
        a.close(4);
        a.exit(1, 1, 100);
        a.close(1);
        assert_eq!(a.unmatched(), 0);
        let (spans, steps) = a.finish(200);
        let get = |n: &str| spans.iter().find(|s| s.name == n).unwrap().clone();
        assert_eq!(get("step").total_ns, 100);
        assert_eq!(get("step").self_ns, 100 - 30 - 40);
        assert_eq!(get("forward").self_ns, 30 - 20);
        assert_eq!(get("matmul").self_ns, 20);
        assert_eq!(get("step").percent_of_wall, 50.0);
        assert_eq!(get("step").self_percent_of_wall, 15.0);
        assert_eq!(spans[0].name, "step", "sorted by total time");
        assert_eq!(steps.count, 1);
        assert_eq!(steps.median_ns, Some(100));
    }

    #[test]
    fn a_span_entered_twice_is_two_calls_with_its_busy_time() {
        let mut a = SpanAggregator::new("step");
        a.new_span(7, "poll");
        a.enter(1, 7, 0);
        a.exit(1, 7, 5);
        a.enter(2, 7, 100);
        a.exit(2, 7, 110);
        a.close(7);
        let (spans, _) = a.finish(1000);
        assert_eq!(spans[0].calls, 2);
        assert_eq!(spans[0].total_ns, 15);
        assert_eq!(spans[0].mean_ns, 7);
    }

    #[test]
    fn a_span_with_an_empty_name_is_counted_under_a_placeholder() {
        let mut a = SpanAggregator::new("step");
        a.new_span(1, "");
        a.enter(1, 1, 10);
        a.exit(1, 1, 30);
        a.close(1);
        let (spans, _) = a.finish(100);
        assert_eq!(spans.len(), 1);
        assert_eq!((spans[0].name.as_str(), spans[0].calls), (UNNAMED_SPAN, 1));
        assert_eq!(spans[0].total_ns, 20);
    }

    #[test]
    fn creation_record_may_arrive_after_the_enter() {
        let mut a = SpanAggregator::new("step");
        a.enter(1, 5, 10);
        a.new_span(5, "step");
        a.exit(1, 5, 30);
        a.close(5);
        a.new_span(6, "never-entered");
        a.close(6);
        a.enter(1, 8, 40); // creation record lost
        a.exit(1, 8, 45);
        a.close(8);
        let (spans, steps) = a.finish(100);
        assert_eq!(steps.count, 1);
        assert_eq!(steps.total_ns, 20);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["step", UNKNOWN_SPAN]);
    }

    #[test]
    fn threads_are_independent_and_unclosed_spans_are_not_counted() {
        let mut a = SpanAggregator::new("step");
        a.new_span(1, "step");
        a.enter(1, 1, 0);
        a.new_span(2, "data");
        a.enter(2, 2, 5);
        a.exit(2, 2, 50);
        a.close(2);
        a.exit(1, 1, 20);
        a.close(1);
        a.new_span(3, "step");
        a.enter(1, 3, 30); // cut short: never exited
        a.exit(9, 4, 40); // unknown thread
        assert_eq!(a.open_spans(), 1);
        assert_eq!(a.unmatched(), 1);
        let (spans, steps) = a.finish(100);
        let step = spans.iter().find(|s| s.name == "step").unwrap();
        assert_eq!((step.calls, step.total_ns, step.self_ns), (1, 20, 20));
        assert_eq!(steps.count, 1);
    }

    #[test]
    fn merging_tables_adds_by_name() {
        let row = |name: &str, calls, total| SpanStats {
            name: name.into(),
            calls,
            total_ns: total,
            self_ns: total,
            mean_ns: total / calls,
            percent_of_wall: 0.0,
            self_percent_of_wall: 0.0,
        };
        let a = vec![row("step", 2, 20), row("data", 1, 5)];
        let b = vec![row("step", 3, 40)];
        let merged = merge_span_tables([a.as_slice(), b.as_slice()], 100);
        assert_eq!(merged[0].name, "step");
        assert_eq!(
            (merged[0].calls, merged[0].total_ns, merged[0].mean_ns),
            (5, 60, 12)
        );
        assert_eq!(merged[0].percent_of_wall, 60.0);
        assert_eq!(merged[1].name, "data");
    }
}
