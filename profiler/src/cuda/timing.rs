//! GPU timing bookkeeping: a pool of timing-enabled events, the queue of operations
//! waiting for their GPU times, and the alignment of GPU timestamps to the host clock.
//!
//! The machinery is generic over [`TimingEvents`] so its arithmetic and bookkeeping
//! are tested without a GPU; the recorder plugs in CUDA events.
//!
//! Nothing here waits for the GPU: [`Timeline::poll`] only asks whether the oldest
//! operations have finished and resolves those that have.

use std::collections::VecDeque;

use super::error::CudaError;
use crate::model::{GpuOpKind, HostMemory, Nanos};

/// What the timeline needs from an event implementation (CUDA events in the product).
pub(crate) trait TimingEvents {
    /// One event.
    type Event;
    /// Creates a timing-enabled event.
    fn create(&self) -> Result<Self::Event, CudaError>;
    /// Records the event at the current position of the stream.
    fn record(&self, event: &Self::Event) -> Result<(), CudaError>;
    /// Whether the work before the event has finished (never waits).
    fn is_complete(&self, event: &Self::Event) -> Result<bool, CudaError>;
    /// GPU milliseconds from `start` to `end`, both complete.
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32, CudaError>;
}

/// An operation whose GPU times are not known yet.
struct Pending<E, P> {
    payload: P,
    start: E,
    end: E,
}

/// An operation whose GPU start and end are now known, on the host clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved<P> {
    /// What the caller queued with the operation.
    pub(crate) payload: P,
    /// GPU start, host nanoseconds.
    pub(crate) gpu_start: Nanos,
    /// GPU end, host nanoseconds.
    pub(crate) gpu_end: Nanos,
}

/// A completed event whose time on the host clock is known.
struct Anchor<E> {
    event: E,
    host_ns: Nanos,
}

/// The pair of events bracketing one operation, taken by [`Timeline::begin`].
pub(crate) struct Bracket<E> {
    start: E,
    end: E,
}

/// Once an anchor is this far behind the operations being resolved, a resolved event
/// becomes the new anchor, so `f32` milliseconds never have to span long intervals.
const PROMOTE_AFTER_MS: f32 = 1000.0;

/// Converts `elapsed_ms` after an anchor at `anchor_ns` to host nanoseconds (clamped
/// at the trace origin).
#[must_use]
pub(crate) fn align(anchor_ns: Nanos, elapsed_ms: f32) -> Nanos {
    let offset = (f64::from(elapsed_ms) * 1e6).round() as i128;
    let t = i128::from(anchor_ns) + offset;
    u64::try_from(t.max(0)).unwrap_or(u64::MAX)
}

/// The host time of an anchor observed between `before` (just before recording it)
/// and `after` (the first time it was seen complete): the midpoint, and the width of
/// the window as its uncertainty.
#[must_use]
pub(crate) fn anchor_time(before: Nanos, after: Nanos) -> (Nanos, Nanos) {
    let after = after.max(before);
    (before + (after - before) / 2, after - before)
}

/// The clock drift seen when a new reference event observed at `new_host_ns` replaces one at
/// `old_host_ns`, `elapsed_ms` GPU milliseconds before it: the new reference's host time minus
/// the time the old reference predicted for it (positive: the host clock ran faster than the
/// GPU's), in nanoseconds.
#[must_use]
pub(crate) fn drift_ns(old_host_ns: Nanos, elapsed_ms: f32, new_host_ns: Nanos) -> i64 {
    let predicted = i128::from(align(old_host_ns, elapsed_ms));
    let d = i128::from(new_host_ns) - predicted;
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}

/// Drift between two clock references (see [`Timeline::drift_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Drift {
    /// The new reference's host time minus the time the previous one predicted for it.
    pub(crate) drift_ns: i64,
    /// Host nanoseconds since the previous reference.
    pub(crate) over_ns: Nanos,
}

/// Whether the call that enqueues an operation returns only once the operation is over: a
/// copy from the device to pageable host memory (the driver stages it and waits). Its end
/// event is recorded after the call returns, so the event's time adds the host round trip.
#[must_use]
pub(crate) fn returns_when_done(kind: GpuOpKind, host_memory: Option<HostMemory>) -> bool {
    kind == GpuOpKind::MemcpyDtoH && host_memory == Some(HostMemory::Pageable)
}

/// The GPU times of an operation whose call returned at `host_end` only once it was over
/// (see [`returns_when_done`]): the end is bounded by the host return, the start by the end.
/// Returns the times and whether the end was moved to the host return.
#[must_use]
pub(crate) fn bound_by_host_return(
    gpu_start: Nanos,
    gpu_end: Nanos,
    host_end: Nanos,
) -> (Nanos, Nanos, bool) {
    if gpu_end <= host_end {
        return (gpu_start, gpu_end, false);
    }
    (gpu_start.min(host_end), host_end, true)
}

/// Events in flight for one stream; `P` is what the caller keeps with each operation.
pub(crate) struct Timeline<E, P> {
    free: Vec<E>,
    created: usize,
    capacity: usize,
    pending: VecDeque<Pending<E, P>>,
    anchor: Option<Anchor<E>>,
    untimed: u64,
}

impl<E, P> Timeline<E, P> {
    /// A timeline that keeps at most `capacity` events alive (at least 4).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            free: Vec::new(),
            created: 0,
            capacity: capacity.max(4),
            pending: VecDeque::new(),
            anchor: None,
            untimed: 0,
        }
    }

    /// Installs the host-clock reference: `event` was recorded and completed at
    /// `host_ns`. The previous anchor's event goes back to the pool.
    pub(crate) fn set_anchor(&mut self, event: E, host_ns: Nanos) {
        if let Some(old) = self.anchor.replace(Anchor { event, host_ns }) {
            self.free.push(old.event);
        }
    }

    /// The drift of the installed reference measured against `event`, a complete event observed
    /// at `host_ns` that is about to replace it; `None` without a reference.
    pub(crate) fn drift_to<B: TimingEvents<Event = E>>(
        &self,
        backend: &B,
        event: &E,
        host_ns: Nanos,
    ) -> Result<Option<Drift>, CudaError> {
        let Some(anchor) = self.anchor.as_ref() else {
            return Ok(None);
        };
        let elapsed = backend.elapsed_ms(&anchor.event, event)?;
        Ok(Some(Drift {
            drift_ns: drift_ns(anchor.host_ns, elapsed, host_ns),
            over_ns: host_ns.saturating_sub(anchor.host_ns),
        }))
    }

    /// Whether a reference event is installed.
    pub(crate) fn has_anchor(&self) -> bool {
        self.anchor.is_some()
    }

    /// Takes an event from the pool for another purpose (an anchor); `None` when the
    /// pool is exhausted.
    pub(crate) fn take_event<B: TimingEvents<Event = E>>(
        &mut self,
        backend: &B,
    ) -> Result<Option<E>, CudaError> {
        if let Some(e) = self.free.pop() {
            return Ok(Some(e));
        }
        if self.created < self.capacity {
            let e = backend.create()?;
            self.created += 1;
            return Ok(Some(e));
        }
        Ok(None)
    }

    /// Records the start event of an operation. `None` (and the operation counted as
    /// untimed) when no events are free even after resolving finished operations.
    pub(crate) fn begin<B: TimingEvents<Event = E>>(
        &mut self,
        backend: &B,
        resolved: &mut Vec<Resolved<P>>,
    ) -> Result<Option<Bracket<E>>, CudaError> {
        if self.anchor.is_none() {
            self.untimed += 1;
            return Ok(None);
        }
        if self.free.len() < 2 && self.created + 2 > self.capacity {
            self.poll(backend, resolved)?;
        }
        let Some(start) = self.take_event(backend)? else {
            self.untimed += 1;
            return Ok(None);
        };
        let Some(end) = self.take_event(backend)? else {
            self.free.push(start);
            self.untimed += 1;
            return Ok(None);
        };
        if let Err(e) = backend.record(&start) {
            self.free.push(start);
            self.free.push(end);
            return Err(e);
        }
        Ok(Some(Bracket { start, end }))
    }

    /// Records the end event of the operation begun with `bracket` and queues it with
    /// `payload`.
    pub(crate) fn end<B: TimingEvents<Event = E>>(
        &mut self,
        backend: &B,
        payload: P,
        bracket: Bracket<E>,
    ) -> Result<(), CudaError> {
        if let Err(e) = backend.record(&bracket.end) {
            self.free.push(bracket.start);
            self.free.push(bracket.end);
            return Err(e);
        }
        self.pending.push_back(Pending {
            payload,
            start: bracket.start,
            end: bracket.end,
        });
        Ok(())
    }

    /// Gives back a bracket whose operation failed before its end was recorded.
    pub(crate) fn abandon(&mut self, bracket: Bracket<E>) {
        self.free.push(bracket.start);
        self.free.push(bracket.end);
    }

    /// Resolves the operations that have finished, oldest first, into `resolved`.
    /// Stops at the first unfinished one (work on a stream finishes in order).
    pub(crate) fn poll<B: TimingEvents<Event = E>>(
        &mut self,
        backend: &B,
        resolved: &mut Vec<Resolved<P>>,
    ) -> Result<(), CudaError> {
        while let Some(front) = self.pending.front() {
            if !backend.is_complete(&front.end)? {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            let Some(anchor) = self.anchor.as_ref() else {
                // Unreachable in practice: `begin` only hands out brackets once anchored.
                self.free.push(p.start);
                self.free.push(p.end);
                continue;
            };
            // The start from the anchor; the duration between the operation's own two events,
            // so that it keeps the events' resolution however long ago the anchor was (the
            // f32 milliseconds lose about 8 us of precision 100 s after it).
            let times = backend
                .elapsed_ms(&anchor.event, &p.start)
                .and_then(|start| Ok((start, backend.elapsed_ms(&p.start, &p.end)?)));
            let (start_ms, duration_ms) = match times {
                Ok(t) => t,
                Err(e) => {
                    // Back at the front: its events stay accounted for, and the payload is
                    // written untimed when the queue is discarded.
                    self.pending.push_front(p);
                    return Err(e);
                }
            };
            let end_ms = start_ms + duration_ms;
            let gpu_start = align(anchor.host_ns, start_ms);
            let gpu_end = align(gpu_start, duration_ms.max(0.0));
            resolved.push(Resolved {
                payload: p.payload,
                gpu_start,
                gpu_end,
            });
            self.free.push(p.start);
            if end_ms > PROMOTE_AFTER_MS {
                // The end event becomes the reference for what follows it.
                self.set_anchor(p.end, gpu_end);
            } else {
                self.free.push(p.end);
            }
        }
        Ok(())
    }

    /// Operations queued and not resolved yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Operations recorded without GPU times because no event was free.
    pub(crate) fn untimed(&self) -> u64 {
        self.untimed
    }

    /// Events created so far (alive, in the pool or in flight).
    #[cfg(test)]
    pub(crate) fn created(&self) -> usize {
        self.created
    }

    /// Events the timeline still holds: in the pool, in flight and the anchor. Equal to
    /// [`Timeline::created`] when no event was lost; less by the events handed out with
    /// [`Timeline::take_event`] or [`Timeline::begin`] and not given back yet.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.free.len() + 2 * self.pending.len() + usize::from(self.anchor.is_some())
    }

    /// Empties the queue without resolving it; returns the payloads of the operations
    /// that lost their GPU times, oldest first.
    pub(crate) fn discard_pending(&mut self) -> Vec<P> {
        let mut out = Vec::with_capacity(self.pending.len());
        for p in self.pending.drain(..) {
            self.free.push(p.start);
            self.free.push(p.end);
            out.push(p.payload);
        }
        out
    }

    /// Returns an event taken with [`Timeline::take_event`] and not used.
    pub(crate) fn put_back(&mut self, event: E) {
        self.free.push(event);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Test events: each event is an index; the test decides when the "GPU" reaches
    /// each recorded event by assigning it a GPU time in milliseconds.
    #[derive(Default)]
    struct FakeGpu {
        state: RefCell<FakeState>,
        /// `record` fails (as after a sticky fault).
        fail_record: std::cell::Cell<bool>,
        /// `elapsed_ms` fails.
        fail_elapsed: std::cell::Cell<bool>,
    }

    fn fault() -> CudaError {
        CudaError::NoLibrary { library: "test" }
    }

    #[derive(Default)]
    struct FakeState {
        created: usize,
        /// Recording order of events (event index), like a stream's queue.
        queue: Vec<usize>,
        /// GPU time at which each queued position completed (filled by `run_until`).
        completed_at: Vec<Option<f64>>,
        /// Latest recorded position of each event.
        position: Vec<Option<usize>>,
    }

    impl FakeGpu {
        /// The "GPU" completes the next `n` queued events at times `t0, t0 + dt, ...`.
        fn run(&self, n: usize, t0: f64, dt: f64) {
            let mut s = self.state.borrow_mut();
            let done = s.completed_at.iter().filter(|c| c.is_some()).count();
            for k in 0..n {
                let pos = done + k;
                if pos < s.completed_at.len() {
                    s.completed_at[pos] = Some(t0 + dt * k as f64);
                }
            }
        }

        fn time_of(&self, e: usize) -> Option<f64> {
            let s = self.state.borrow();
            s.position[e].and_then(|p| s.completed_at[p])
        }
    }

    impl TimingEvents for FakeGpu {
        type Event = usize;
        fn create(&self) -> Result<usize, CudaError> {
            let mut s = self.state.borrow_mut();
            s.created += 1;
            s.position.push(None);
            Ok(s.created - 1)
        }
        fn record(&self, e: &usize) -> Result<(), CudaError> {
            if self.fail_record.get() {
                return Err(fault());
            }
            let mut s = self.state.borrow_mut();
            let pos = s.queue.len();
            s.queue.push(*e);
            s.completed_at.push(None);
            s.position[*e] = Some(pos);
            Ok(())
        }
        fn is_complete(&self, e: &usize) -> Result<bool, CudaError> {
            Ok(self.time_of(*e).is_some())
        }
        fn elapsed_ms(&self, a: &usize, b: &usize) -> Result<f32, CudaError> {
            if self.fail_elapsed.get() {
                return Err(fault());
            }
            let (Some(ta), Some(tb)) = (self.time_of(*a), self.time_of(*b)) else {
                panic!("elapsed_ms on an incomplete event: the timeline must not wait");
            };
            Ok((tb - ta) as f32)
        }
    }

    fn anchored(gpu: &FakeGpu, capacity: usize, host_ns: Nanos) -> Timeline<usize, u64> {
        let mut t = Timeline::new(capacity);
        let e = t.take_event(gpu).unwrap().unwrap();
        gpu.record(&e).unwrap();
        gpu.run(1, 0.0, 0.0);
        t.set_anchor(e, host_ns);
        t
    }

    #[test]
    fn events_go_back_to_the_pool_on_every_error_path() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 6, 1_000);
        let mut resolved = Vec::new();

        // The start event cannot be recorded: both events of the bracket go back.
        gpu.fail_record.set(true);
        assert!(t.begin(&gpu, &mut resolved).is_err());
        assert_eq!(t.held(), t.created());
        // The end event cannot be recorded.
        gpu.fail_record.set(false);
        let b = t.begin(&gpu, &mut resolved).unwrap().unwrap();
        gpu.fail_record.set(true);
        assert!(t.end(&gpu, 1, b).is_err());
        assert_eq!(t.held(), t.created());
        gpu.fail_record.set(false);

        // The operation's times cannot be read: its events stay queued, and its payload
        // is still there for the teardown.
        let b = t.begin(&gpu, &mut resolved).unwrap().unwrap();
        t.end(&gpu, 2, b).unwrap();
        // (The start of the bracket whose end failed is in the queue before them.)
        gpu.run(3, 1.0, 0.5);
        gpu.fail_elapsed.set(true);
        assert!(t.poll(&gpu, &mut resolved).is_err());
        assert!(resolved.is_empty());
        assert_eq!(t.held(), t.created());
        assert_eq!(t.discard_pending(), vec![2]);
        assert_eq!(t.held(), t.created());

        // Whatever failed, the whole capacity is still usable.
        gpu.fail_elapsed.set(false);
        let mut brackets = Vec::new();
        while let Some(b) = t.begin(&gpu, &mut resolved).unwrap() {
            brackets.push(b);
        }
        assert_eq!(brackets.len(), 2, "6 events: the anchor and 2 pairs");
        assert_eq!(t.untimed(), 1);
        for b in brackets {
            t.abandon(b);
        }
        assert_eq!(t.held(), t.created());
    }

    #[test]
    fn align_adds_milliseconds_as_nanoseconds_and_clamps_at_zero() {
        assert_eq!(align(1_000, 0.5), 501_000);
        assert_eq!(align(1_000_000, -0.25), 750_000);
        assert_eq!(align(10, -1.0), 0);
        assert_eq!(align(0, 0.0), 0);
    }

    #[test]
    fn anchor_time_is_the_midpoint_of_the_observation_window() {
        assert_eq!(anchor_time(100, 140), (120, 40));
        // A clock that went backwards gives a zero-width window, never an underflow.
        assert_eq!(anchor_time(100, 90), (100, 0));
    }

    #[test]
    fn drift_is_the_new_reference_minus_the_old_ones_prediction() {
        // 1 s of GPU time after a reference at 5 ms: predicted at 1.005 s.
        assert_eq!(drift_ns(5_000_000, 1000.0, 1_005_000_000), 0);
        assert_eq!(drift_ns(5_000_000, 1000.0, 1_005_012_000), 12_000);
        assert_eq!(drift_ns(5_000_000, 1000.0, 1_004_990_000), -10_000);
    }

    #[test]
    fn a_new_reference_measures_the_drift_of_the_old_one() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 8, 1_000_000);
        let e = t.take_event(&gpu).unwrap().unwrap();
        gpu.record(&e).unwrap();
        // The GPU sees the new reference 2000 ms after the old one; the host 2000.05 ms.
        gpu.run(1, 2000.0, 0.0);
        let d = t.drift_to(&gpu, &e, 2_001_050_000).unwrap().unwrap();
        assert_eq!(d.over_ns, 2_000_050_000);
        assert!((d.drift_ns - 50_000).abs() < 1_000, "{d:?}");
        t.set_anchor(e, 2_001_050_000);
        let fresh: Timeline<usize, u64> = Timeline::new(4);
        assert_eq!(fresh.drift_to(&gpu, &0, 0).unwrap(), None);
    }

    #[test]
    fn only_copies_to_pageable_host_memory_return_when_done() {
        assert!(returns_when_done(
            GpuOpKind::MemcpyDtoH,
            Some(HostMemory::Pageable)
        ));
        assert!(!returns_when_done(
            GpuOpKind::MemcpyDtoH,
            Some(HostMemory::Pinned)
        ));
        // A pageable upload returns once the data is staged, before the DMA is over.
        assert!(!returns_when_done(
            GpuOpKind::MemcpyHtoD,
            Some(HostMemory::Pageable)
        ));
        assert!(!returns_when_done(GpuOpKind::Kernel, None));
    }

    #[test]
    fn a_blocking_copy_ends_no_later_than_its_call_returned() {
        // A 4-byte readback: on the GPU from 1_000 to 1_003 us, the call returned at 1_010 us,
        // and the end event recorded afterwards completed at 1_040 us.
        assert_eq!(
            bound_by_host_return(1_000_000, 1_040_000, 1_010_000),
            (1_000_000, 1_010_000, true)
        );
        // An end event already before the host return is kept.
        assert_eq!(
            bound_by_host_return(1_000_000, 1_005_000, 1_010_000),
            (1_000_000, 1_005_000, false)
        );
        // A start past the host return (clock reference error) is never after the end.
        assert_eq!(
            bound_by_host_return(1_020_000, 1_040_000, 1_010_000),
            (1_010_000, 1_010_000, true)
        );
    }

    #[test]
    fn finished_operations_resolve_to_host_aligned_times_in_order() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 16, 5_000_000);
        let mut out = Vec::new();
        for id in 1..=3 {
            let b = t.begin(&gpu, &mut out).unwrap().unwrap();
            t.end(&gpu, id, b).unwrap();
        }
        assert_eq!(t.pending(), 3);
        // Nothing ran yet: polling resolves nothing and does not wait.
        t.poll(&gpu, &mut out).unwrap();
        assert!(out.is_empty());
        // The GPU runs the first operation (2 events) at 1.0 ms and 1.5 ms after the anchor.
        gpu.run(2, 1.0, 0.5);
        t.poll(&gpu, &mut out).unwrap();
        assert_eq!(
            out,
            vec![Resolved {
                payload: 1,
                gpu_start: 6_000_000,
                gpu_end: 6_500_000
            }]
        );
        gpu.run(4, 2.0, 0.25);
        t.poll(&gpu, &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[1],
            Resolved {
                payload: 2,
                gpu_start: 7_000_000,
                gpu_end: 7_250_000
            }
        );
        assert_eq!(
            out[2],
            Resolved {
                payload: 3,
                gpu_start: 7_500_000,
                gpu_end: 7_750_000
            }
        );
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn a_short_operation_long_after_the_anchor_keeps_its_duration() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 16, 0);
        let mut out = Vec::new();
        let b = t.begin(&gpu, &mut out).unwrap().unwrap();
        t.end(&gpu, 1, b).unwrap();
        // 200 s after the anchor, 3 us long: at 200,000 ms an f32 only resolves 15.6 us.
        gpu.run(1, 200_000.0, 0.0);
        gpu.run(1, 200_000.003, 0.0);
        t.poll(&gpu, &mut out).unwrap();
        let r = &out[0];
        assert_eq!(r.gpu_end - r.gpu_start, 3_000, "{r:?}");
        assert!(r.gpu_start.abs_diff(200_000_000_000) < 20_000, "{r:?}");
    }

    #[test]
    fn events_are_reused_from_the_pool() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 64, 0);
        let mut out = Vec::new();
        for id in 0..1000 {
            let b = t.begin(&gpu, &mut out).unwrap().unwrap();
            t.end(&gpu, id, b).unwrap();
            gpu.run(2, id as f64, 0.01);
            t.poll(&gpu, &mut out).unwrap();
        }
        assert_eq!(out.len(), 1000);
        // One anchor plus one bracket, recycled a thousand times.
        assert_eq!(t.created(), 3);
        assert_eq!(t.untimed(), 0);
    }

    #[test]
    fn an_exhausted_pool_counts_untimed_operations_instead_of_waiting() {
        let gpu = FakeGpu::default();
        // Capacity 5: the anchor and two brackets.
        let mut t = anchored(&gpu, 5, 0);
        let mut out = Vec::new();
        for id in 0..2 {
            let b = t.begin(&gpu, &mut out).unwrap().unwrap();
            t.end(&gpu, id, b).unwrap();
        }
        assert!(t.begin(&gpu, &mut out).unwrap().is_none());
        assert_eq!(t.untimed(), 1);
        // Once the GPU catches up, begin() resolves finished work and gets events back.
        gpu.run(4, 0.0, 0.1);
        assert!(t.begin(&gpu, &mut out).unwrap().is_some());
        assert_eq!(out.len(), 2);
        assert_eq!(t.created(), 5);
    }

    #[test]
    fn without_an_anchor_operations_are_untimed() {
        let gpu = FakeGpu::default();
        let mut t: Timeline<usize, u64> = Timeline::new(8);
        let mut out = Vec::new();
        assert!(t.begin(&gpu, &mut out).unwrap().is_none());
        assert_eq!(t.untimed(), 1);
        assert!(!t.has_anchor());
    }

    #[test]
    fn a_distant_event_becomes_the_new_anchor_without_changing_times() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 16, 1_000);
        let mut out = Vec::new();
        let b = t.begin(&gpu, &mut out).unwrap().unwrap();
        t.end(&gpu, 1, b).unwrap();
        gpu.run(2, 2000.0, 1.0); // 2 s after the anchor: promoted
        t.poll(&gpu, &mut out).unwrap();
        let b = t.begin(&gpu, &mut out).unwrap().unwrap();
        t.end(&gpu, 2, b).unwrap();
        gpu.run(2, 2003.0, 1.0);
        t.poll(&gpu, &mut out).unwrap();
        assert_eq!(
            out[0],
            Resolved {
                payload: 1,
                gpu_start: 2_000_001_000,
                gpu_end: 2_001_001_000
            }
        );
        // Resolved against the promoted anchor (2001 ms), still on the same host timeline.
        assert_eq!(
            out[1],
            Resolved {
                payload: 2,
                gpu_start: 2_003_001_000,
                gpu_end: 2_004_001_000
            }
        );
    }

    #[test]
    fn discarding_pending_operations_returns_their_events() {
        let gpu = FakeGpu::default();
        let mut t = anchored(&gpu, 8, 0);
        let mut out = Vec::new();
        let b = t.begin(&gpu, &mut out).unwrap().unwrap();
        t.end(&gpu, 1, b).unwrap();
        let b = t.begin(&gpu, &mut out).unwrap().unwrap();
        t.abandon(b);
        assert_eq!(t.discard_pending(), vec![1]);
        assert_eq!(t.pending(), 0);
        for _ in 0..3 {
            assert!(t.begin(&gpu, &mut out).unwrap().is_some());
        }
        assert_eq!(t.created(), 7);
    }
}
