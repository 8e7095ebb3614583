//! A recording session: the state shared by the layer, the per-thread buffers and the writer.
//!
//! Every thread that records gets its own single-producer/single-consumer ring of fixed-size
//! 32-byte slots, registered with the session on first use. The recording thread only copies slots
//! into its ring and publishes the new head with one release store: no lock, no allocation, no
//! system call. The writer thread drains every ring, encodes the records and writes the file.
//! A ring that is full drops the record and counts it; the count reaches the trace.

use std::cell::{RefCell, UnsafeCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::model::{DeviceInfo, EndReason, GpuSample, ModuleInfo, ThreadIndex};

/// One ring slot. The first slot of a record holds `kind | slot_count << 8 | extra << 24` in word 0.
pub(crate) type Slot = [u64; 4];

/// Slot record kinds (ring-internal, never written to files).
pub(crate) mod kind {
    pub const NEW: u64 = 1;
    pub const ENTER: u64 = 2;
    pub const EXIT: u64 = 3;
    pub const CLOSE: u64 = 4;
    pub const RECORD: u64 = 5;
    pub const EVENT: u64 = 6;
    pub const GPU: u64 = 7;
    pub const TIMING: u64 = 8;
    pub const DEVMEM: u64 = 9;
}

/// Value slot types.
pub(crate) mod vtype {
    pub const U64: u64 = 0;
    pub const I64: u64 = 1;
    pub const F64: u64 = 2;
    pub const BOOL: u64 = 3;
    pub const STR: u64 = 4;
}

/// Longest string value kept (longer ones are cut at a character boundary).
pub(crate) const MAX_TEXT: usize = 4096;

#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

/// One thread's ring.
pub(crate) struct Ring {
    pub thread: ThreadIndex,
    pub os_tid: u64,
    pub name: Option<String>,
    /// `mask + 1` slots from a zeroed allocation: the OS commits pages only as they are used,
    /// so a thread that records little costs little memory.
    slots: *mut UnsafeCell<Slot>,
    mask: usize,
    pub head: Padded<AtomicUsize>,
    pub tail: Padded<AtomicUsize>,
    pub dropped: AtomicU64,
    pub closed: AtomicBool,
    pub wake: AtomicBool,
}

// SAFETY: slots are written only by the owning producer in [head, tail + capacity) and read only by
// the single consumer in [tail, head); head/tail are published with release/acquire ordering, so a
// slot is never read and written at the same time.
unsafe impl Sync for Ring {}
// SAFETY: see above; the ring owns plain data.
unsafe impl Send for Ring {}

impl Ring {
    fn new(thread: ThreadIndex, capacity: usize) -> Ring {
        let cap = capacity.clamp(64, 1 << 26).next_power_of_two();
        // `vec![zero; n]` allocates zeroed memory without writing it.
        let boxed: Box<[Slot]> = vec![[0u64; 4]; cap].into_boxed_slice();
        let slots = Box::into_raw(boxed).cast::<UnsafeCell<Slot>>();
        Ring {
            thread,
            os_tid: crate::sys::os_tid(),
            name: std::thread::current().name().map(str::to_string),
            slots,
            mask: cap - 1,
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            dropped: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            wake: AtomicBool::new(false),
        }
    }

    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Reads slot `idx` (consumer side).
    ///
    /// # Safety
    /// `idx` must lie in `[tail, head)` as seen by the single consumer after an acquire load of
    /// `head`.
    pub unsafe fn read(&self, idx: usize) -> Slot {
        // SAFETY: guaranteed by the caller (see the type-level comment).
        unsafe { *self.slot(idx) }
    }

    /// Pointer to slot `idx` (modulo the capacity).
    #[inline]
    fn slot(&self, idx: usize) -> *mut Slot {
        // SAFETY: `idx & mask` < capacity, inside the allocation; UnsafeCell<Slot> has the
        // layout of Slot.
        unsafe { (*self.slots.add(idx & self.mask)).get() }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let cap = self.mask + 1;
        // SAFETY: `slots` came from `Box::into_raw` of a boxed slice of `cap` slots
        // (UnsafeCell<Slot> has the layout of Slot) and is freed only here.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.slots.cast::<Slot>(),
                cap,
            )));
        }
    }
}

/// Strings interned by content (kernel names, ...), shared by recorders and the writer.
#[derive(Default)]
pub(crate) struct Interner {
    pub map: HashMap<Box<str>, u32>,
    /// Definitions the writer has not emitted yet.
    pub pending: Vec<(u32, Box<str>)>,
}

impl Interner {
    /// Returns the id of `s` and whether it is new.
    pub fn intern(&mut self, s: &str) -> (u32, bool) {
        if let Some(&id) = self.map.get(s) {
            return (id, false);
        }
        let id = self.map.len() as u32 + 1;
        self.map.insert(s.into(), id);
        (id, true)
    }
}

/// A Python frame as recorded: file and function string ids, line.
pub(crate) type PyFrameIds = (u32, u32, u32);

/// Rare records that go through a lock instead of the rings.
pub(crate) enum Side {
    Panic {
        thread: Option<ThreadIndex>,
        ts: u64,
        message: String,
        location: Option<(String, u32, u32)>,
    },
    Device(DeviceInfo),
    GpuSample(GpuSample),
    Stack(u64, Vec<u64>),
    Module(ModuleInfo),
    OpStack(u64, u64),
    /// A Python stack: id, (file, function) string ids and line per frame, innermost first.
    PyStack(u64, Vec<PyFrameIds>),
    /// A GPU operation's Python stack (None: the thread did not hold the GIL).
    OpPyStack(u64, Option<u64>),
}

/// Control block between guards, hooks and the writer thread.
#[derive(Default)]
pub(crate) struct Ctl {
    pub flush_requested: u64,
    pub flush_done: u64,
    pub shutdown: Option<EndReason>,
    pub finished: bool,
}

/// Recording settings.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub capacity: usize,
    pub wait_when_full: Duration,
    pub record_events: bool,
    pub flush_interval: Duration,
}

/// State of one recording session.
pub(crate) struct Shared {
    pub id: u64,
    pub clock: quanta::Clock,
    /// Whether `clock` reads the TSC (then the hot path reads it inline).
    pub tsc: bool,
    pub origin_raw: u64,
    pub active: AtomicBool,
    pub config: Config,
    /// Rings registered since the writer last looked (it takes them over).
    pub rings: Mutex<Vec<Arc<Ring>>>,
    next_thread: AtomicU32,
    next_span_block: AtomicU64,
    next_corr: AtomicU64,
    pub interner: Mutex<Interner>,
    /// Host stacks recorded so far, by content (each is written once).
    pub stacks: Mutex<HashMap<Vec<u64>, u64>>,
    /// Python stacks recorded so far, by content: (file, function) string ids and line per
    /// frame (each is written once).
    pub py_stacks: Mutex<HashMap<Vec<PyFrameIds>, u64>>,
    pub side: Mutex<Vec<Side>>,
    pub global_dropped: AtomicU64,
    pub writer: OnceLock<std::thread::Thread>,
    /// Process that started the writer thread (0 until started). A forked child inherits the
    /// session but not the thread: it must not wait for a writer that does not run there.
    pub writer_pid: AtomicU32,
    pub ctl: Mutex<Ctl>,
    pub ctl_cv: Condvar,
    pub records_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub dropped_total: AtomicU64,
    /// CPU time the writer thread has used (updated every pass).
    pub writer_cpu_ns: AtomicU64,
}

pub(crate) const SPAN_BLOCK: u64 = 1024;

/// Entries of a producer's table of live spans (a power of two).
pub(crate) const LIVE_SLOTS: usize = 64;

/// Flag in the first word of an event or record-values record: its span word holds a tracing
/// id the writer resolves, not a trace span id.
pub(crate) const RAW_SPAN: u64 = 1 << 40;

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl Shared {
    pub fn new(config: Config, clock: quanta::Clock, tsc: bool) -> Arc<Shared> {
        let origin_raw = clock.raw();
        Arc::new(Shared {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            clock,
            tsc,
            origin_raw,
            active: AtomicBool::new(true),
            config,
            rings: Mutex::new(Vec::new()),
            next_thread: AtomicU32::new(0),
            writer_pid: AtomicU32::new(0),
            next_span_block: AtomicU64::new(1),
            next_corr: AtomicU64::new(1),
            interner: Mutex::new(Interner::default()),
            stacks: Mutex::new(HashMap::new()),
            py_stacks: Mutex::new(HashMap::new()),
            side: Mutex::new(Vec::new()),
            global_dropped: AtomicU64::new(0),
            writer: OnceLock::new(),
            ctl: Mutex::new(Ctl::default()),
            ctl_cv: Condvar::new(),
            records_written: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            dropped_total: AtomicU64::new(0),
            writer_cpu_ns: AtomicU64::new(0),
        })
    }

    /// Raw clock reading (cheap; converted to nanoseconds by the writer).
    #[inline]
    pub fn raw_now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            // The same counter quanta reads (it was found to be the TSC at start), inlined.
            #[allow(unused_unsafe)]
            // SAFETY: RDTSC has no preconditions on x86_64.
            return unsafe { core::arch::x86_64::_rdtsc() };
        }
        self.clock.raw()
    }

    /// Nanoseconds since the origin for a raw reading.
    #[inline]
    pub fn raw_to_ns(&self, raw: u64) -> u64 {
        self.clock.delta_as_nanos(self.origin_raw, raw)
    }

    /// Nanoseconds since the origin, now.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.raw_to_ns(self.clock.raw())
    }

    /// A block of [`SPAN_BLOCK`] trace span ids: returns its first id.
    pub fn span_block(&self) -> u64 {
        self.next_span_block
            .fetch_add(SPAN_BLOCK, Ordering::Relaxed)
    }

    pub fn next_correlation(&self) -> u64 {
        self.next_corr.fetch_add(1, Ordering::Relaxed)
    }

    pub fn intern(&self, s: &str) -> u32 {
        let Ok(mut i) = self.interner.lock() else {
            return 0;
        };
        let (id, new) = i.intern(s);
        if new {
            i.pending.push((id, s.into()));
        }
        id
    }

    pub fn push_side(&self, s: Side) {
        if let Ok(mut v) = self.side.lock() {
            v.push(s);
        }
    }

    pub fn wake_writer(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }

    fn register_ring(&self) -> Arc<Ring> {
        let index = self.next_thread.fetch_add(1, Ordering::Relaxed);
        let ring = Arc::new(Ring::new(index, self.config.capacity));
        if let Ok(mut rings) = self.rings.lock() {
            rings.push(ring.clone());
        }
        ring
    }

    /// Asks the writer to write out everything recorded so far and waits up to `timeout`.
    /// Returns whether the writer confirmed.
    pub fn flush_and_wait(&self, timeout: Duration) -> bool {
        let Ok(mut ctl) = self.ctl.lock() else {
            return false;
        };
        if ctl.finished {
            return true;
        }
        ctl.flush_requested += 1;
        let want = ctl.flush_requested;
        self.wake_writer();
        self.ctl_cv
            .wait_timeout_while(ctl, timeout, |c| c.flush_done < want && !c.finished)
            .is_ok_and(|(_, r)| !r.timed_out())
    }

    /// Stops recording, lets the writer finish the file with an end record, and waits up to
    /// `timeout` for it. Returns whether the writer finished.
    pub fn finish(&self, reason: EndReason, timeout: Duration) -> bool {
        self.active.store(false, Ordering::Release);
        let Ok(mut ctl) = self.ctl.lock() else {
            return false;
        };
        if ctl.shutdown.is_none() {
            ctl.shutdown = Some(reason);
        }
        self.wake_writer();
        self.ctl_cv
            .wait_timeout_while(ctl, timeout, |c| !c.finished)
            .is_ok_and(|(_, r)| !r.timed_out())
    }
}

/// The calling thread's side of one session.
pub(crate) struct Producer {
    pub shared: Arc<Shared>,
    pub ring: Arc<Ring>,
    head: usize,
    cached_tail: usize,
    /// The ring's slots and capacity - 1, copied here (the ring outlives the producer's use).
    slots: *mut UnsafeCell<Slot>,
    mask: usize,
    /// Entered spans: (tracing id, trace span id or 0 when only the writer can resolve it),
    /// innermost last.
    pub stack: Vec<(u64, u64)>,
    /// Spans created on this thread and not closed here yet, (tracing id, trace span id), in a
    /// small direct-mapped table: entering, exiting or closing them, or naming them as a parent,
    /// needs no registry lookup. A span missing here (created on another thread, or pushed out
    /// by a collision) is sent with its tracing id and resolved by the writer, which maps the
    /// tracing ids of live spans to trace ids from the span-creation records. A tracing id names
    /// one live span; the registry only hands the same id to another span after that slot's
    /// generation counter wraps (thousands of reuses), so an entry left behind by a span
    /// closed on another thread is not a practical concern.
    pub live: [(u64, u64); LIVE_SLOTS],
    /// The span this thread exited last: (tracing id, trace span id, timestamp, ring head after
    /// the exit record). A close that follows its exit directly reuses the exit's timestamp.
    pub last_exit: (u64, u64, u64, usize),
    /// The latest clock reading of this thread's records (0: none yet).
    pub last_ts: u64,
    next_span: u64,
    span_end: u64,
    /// Slots of the record being built.
    pub scratch: Vec<Slot>,
    /// Text buffer for string values.
    pub text: String,
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.ring.closed.store(true, Ordering::Release);
    }
}

impl Producer {
    fn new(shared: Arc<Shared>) -> Producer {
        let ring = shared.register_ring();
        Producer {
            shared,
            slots: ring.slots,
            mask: ring.mask,
            ring,
            head: 0,
            cached_tail: 0,
            stack: Vec::with_capacity(32),
            live: [(0, 0); LIVE_SLOTS],
            last_exit: (0, 0, 0, usize::MAX),
            last_ts: 0,
            next_span: 0,
            span_end: 0,
            scratch: Vec::with_capacity(16),
            text: String::with_capacity(256),
        }
    }

    /// A new trace-unique span id.
    #[inline]
    pub fn new_span_id(&mut self) -> u64 {
        if self.next_span == self.span_end {
            let base = self.shared.span_block();
            self.next_span = base;
            self.span_end = base + SPAN_BLOCK;
        }
        let id = self.next_span;
        self.next_span += 1;
        id
    }

    #[inline(always)]
    fn has_room(&mut self, n: usize) -> bool {
        self.head.wrapping_sub(self.cached_tail) + n <= self.mask + 1 || self.wait_room(n)
    }

    /// Slow path of [`Self::has_room`]: looks at the writer's progress, waits if configured.
    #[cold]
    #[inline(never)]
    fn wait_room(&mut self, n: usize) -> bool {
        let cap = self.ring.capacity();
        self.cached_tail = self.ring.tail.0.load(Ordering::Acquire);
        if self.head.wrapping_sub(self.cached_tail) + n <= cap {
            return true;
        }
        if n > cap {
            return false;
        }
        let wait = self.shared.config.wait_when_full;
        if wait.is_zero() {
            return false;
        }
        // Bounded wait for the writer (only when asked for): wake it, yield a few times, then
        // sleep so that many waiting threads do not starve the writer of CPU time.
        let deadline = Instant::now() + wait;
        let mut round = 0u32;
        loop {
            round = round.saturating_add(1);
            self.ring.wake.store(true, Ordering::Relaxed);
            self.shared.wake_writer();
            if round <= 4 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
            self.cached_tail = self.ring.tail.0.load(Ordering::Acquire);
            if self.head.wrapping_sub(self.cached_tail) + n <= cap {
                return true;
            }
            if Instant::now() >= deadline || !self.shared.active.load(Ordering::Relaxed) {
                return false;
            }
        }
    }

    /// Pointer to ring slot `idx` (modulo the capacity).
    #[inline(always)]
    fn slot(&self, idx: usize) -> *mut Slot {
        // SAFETY: `idx & mask` < capacity, inside the ring's allocation, which the producer
        // keeps alive through `ring`; UnsafeCell<Slot> has the layout of Slot.
        unsafe { (*self.slots.add(idx & self.mask)).get() }
    }

    #[inline(always)]
    fn publish(&mut self, n: usize) {
        self.head = self.head.wrapping_add(n);
        self.ring.head.0.store(self.head, Ordering::Release);
        if self.head.wrapping_sub(self.cached_tail) > (self.mask >> 1) + 1 {
            self.half_full();
        }
    }

    /// The ring is more than half full as far as this producer knows: look again, and wake
    /// the writer if it really is.
    #[cold]
    #[inline(never)]
    fn half_full(&mut self) {
        let cap = self.mask + 1;
        self.cached_tail = self.ring.tail.0.load(Ordering::Acquire);
        if self.head.wrapping_sub(self.cached_tail) > cap / 2
            && !self.ring.wake.load(Ordering::Relaxed)
            && !self.ring.wake.swap(true, Ordering::AcqRel)
        {
            self.shared.wake_writer();
        }
    }

    fn count_drop(&self) {
        self.ring.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Pushes a one-slot record.
    #[inline]
    pub fn push1(&mut self, slot: Slot) -> bool {
        if !self.has_room(1) {
            self.count_drop();
            return false;
        }
        // SAFETY: the slot at `head` is outside [tail, head), so the consumer does not read it.
        unsafe { *self.slot(self.head) = slot };
        self.publish(1);
        true
    }

    /// Pushes a two-slot record.
    #[inline]
    pub fn push2(&mut self, a: Slot, b: Slot) -> bool {
        if !self.has_room(2) {
            self.count_drop();
            return false;
        }
        // SAFETY: the slots at `head` and `head + 1` are outside [tail, head) and within capacity.
        unsafe {
            *self.slot(self.head) = a;
            *self.slot(self.head.wrapping_add(1)) = b;
        }
        self.publish(2);
        true
    }

    /// Pushes the record held in `scratch` (its first slot must carry the slot count).
    #[inline]
    pub fn push_scratch(&mut self) -> bool {
        let n = self.scratch.len();
        if n == 0 {
            return true;
        }
        if !self.has_room(n) {
            self.count_drop();
            return false;
        }
        for (i, s) in self.scratch.iter().enumerate() {
            // SAFETY: the slots [head, head + n) are outside [tail, head) and within capacity.
            unsafe { *self.slot(self.head.wrapping_add(i)) = *s };
        }
        self.publish(n);
        true
    }

    /// The innermost span entered on this thread (None when it is unknown here: a span
    /// created on another thread).
    pub fn current_span(&self) -> Option<u64> {
        self.stack.last().map(|e| e.1).filter(|&s| s != 0)
    }

    /// The innermost entered span as (trace span id, tracing id): the trace id is 0 when only
    /// the writer can resolve it.
    #[inline]
    pub fn current(&self) -> Option<(u64, u64)> {
        self.stack.last().map(|e| (e.1, e.0))
    }

    #[inline]
    fn live_index(raw: u64) -> usize {
        (raw.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize & (LIVE_SLOTS - 1)
    }

    /// Remembers a span created on this thread.
    #[inline]
    pub fn live_insert(&mut self, raw: u64, sid: u64) {
        self.live[Self::live_index(raw)] = (raw, sid);
    }

    /// The trace id of a live span created on this thread (0 when unknown here).
    #[inline]
    pub fn live_get(&self, raw: u64) -> u64 {
        let e = self.live[Self::live_index(raw)];
        if e.0 == raw { e.1 } else { 0 }
    }

    /// Forgets a span closed on this thread and returns its trace id (0 when unknown here).
    #[inline]
    pub fn live_remove(&mut self, raw: u64) -> u64 {
        let e = &mut self.live[Self::live_index(raw)];
        if e.0 == raw {
            let sid = e.1;
            *e = (0, 0);
            sid
        } else {
            0
        }
    }

    /// The trace id of span `raw` as far as this thread knows it: entered here, or created
    /// here and still live (0 when unknown here).
    #[inline]
    pub fn resolve(&self, raw: u64) -> u64 {
        if let Some(e) = self.stack.iter().rev().find(|e| e.0 == raw)
            && e.1 != 0
        {
            return e.1;
        }
        self.live_get(raw)
    }

    /// The ring position after the last published record.
    #[inline]
    pub fn head(&self) -> usize {
        self.head
    }
}

thread_local! {
    static LOCAL: RefCell<Vec<Producer>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the calling thread's producer for `shared` (created on first use).
///
/// Returns None (and counts a dropped record) when that is impossible: during thread teardown,
/// or when called re-entrantly (for example from a `Debug` impl of a recorded value).
#[inline]
pub(crate) fn with_producer<R>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&mut Producer) -> R,
) -> Option<R> {
    let r = LOCAL
        .try_with(|cell| {
            let Ok(mut v) = cell.try_borrow_mut() else {
                return None;
            };
            if v.first().is_none_or(|p| !Arc::ptr_eq(&p.shared, shared)) {
                select(&mut v, shared);
            }
            v.first_mut().map(f)
        })
        .ok()
        .flatten();
    if r.is_none() {
        shared.global_dropped.fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// Like [`with_producer`] but never creates a producer and never counts a drop.
pub(crate) fn with_existing_producer<R>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&mut Producer) -> R,
) -> Option<R> {
    LOCAL
        .try_with(|cell| {
            let mut v = cell.try_borrow_mut().ok()?;
            v.iter_mut().find(|p| p.shared.id == shared.id).map(f)
        })
        .ok()
        .flatten()
}

#[cold]
fn select(v: &mut Vec<Producer>, shared: &Arc<Shared>) {
    // Forget producers of finished sessions (their rings are no longer drained).
    v.retain(|p| p.shared.active.load(Ordering::Relaxed) || p.shared.id == shared.id);
    if let Some(i) = v.iter().position(|p| p.shared.id == shared.id) {
        v.swap(0, i);
    } else {
        v.push(Producer::new(shared.clone()));
        let last = v.len() - 1;
        v.swap(0, last);
    }
}

/// Sessions alive in this process (for the panic hook and the exit handler).
static SESSIONS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
/// The session `recorder()` hands out.
static GLOBAL: RwLock<Option<Arc<Shared>>> = RwLock::new(None);
static GLOBAL_SET: AtomicBool = AtomicBool::new(false);

pub(crate) fn register_session(shared: &Arc<Shared>, make_global: bool) {
    if let Ok(mut s) = SESSIONS.lock() {
        s.retain(|w| w.strong_count() > 0);
        s.push(Arc::downgrade(shared));
    }
    if make_global && let Ok(mut g) = GLOBAL.write() {
        let replace = g
            .as_ref()
            .is_none_or(|cur| !cur.active.load(Ordering::Relaxed));
        if replace {
            *g = Some(shared.clone());
            GLOBAL_SET.store(true, Ordering::Release);
        }
    }
    install_hooks();
}

pub(crate) fn unregister_global(shared: &Arc<Shared>) {
    if let Ok(mut g) = GLOBAL.write()
        && g.as_ref().is_some_and(|cur| cur.id == shared.id)
    {
        *g = None;
        GLOBAL_SET.store(false, Ordering::Release);
    }
}

pub(crate) fn global() -> Option<Arc<Shared>> {
    if !GLOBAL_SET.load(Ordering::Acquire) {
        return None;
    }
    let g = GLOBAL.read().ok()?;
    g.as_ref()
        .filter(|s| s.active.load(Ordering::Relaxed))
        .cloned()
}

fn live_sessions() -> Vec<Arc<Shared>> {
    // try_lock: never block (or deadlock) inside a panic hook.
    match SESSIONS.try_lock() {
        Ok(s) => s
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.active.load(Ordering::Relaxed))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn install_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            on_panic(info);
            prev(info);
        }));
        #[cfg(unix)]
        {
            // SAFETY: registering a plain `extern "C" fn()` with the C runtime.
            unsafe {
                libc::atexit(on_exit);
            }
        }
    });
}

fn on_panic(info: &std::panic::PanicHookInfo<'_>) {
    let message = if let Some(s) = info.payload().downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = info.payload().downcast_ref::<String>() {
        s.clone()
    } else {
        "Box<dyn Any>".to_string()
    };
    let location = info
        .location()
        .map(|l| (l.file().to_string(), l.line(), l.column()));
    for shared in live_sessions() {
        let thread = with_existing_producer(&shared, |p| p.ring.thread);
        shared.push_side(Side::Panic {
            thread,
            ts: shared.now_ns(),
            message: message.clone(),
            location: location.clone(),
        });
        let on_writer = shared
            .writer
            .get()
            .is_some_and(|t| t.id() == std::thread::current().id());
        if !on_writer {
            shared.flush_and_wait(Duration::from_secs(1));
        }
    }
}

#[cfg(unix)]
extern "C" fn on_exit() {
    let pid = std::process::id();
    for shared in live_sessions() {
        // Only the process whose writer thread runs waits for it: a forked child (a data
        // loader worker) leaving through exit() would otherwise wait out the whole timeout.
        if shared.writer_pid.load(Ordering::Acquire) == pid {
            shared.finish(EndReason::ProcessExit, Duration::from_secs(2));
        }
    }
}
