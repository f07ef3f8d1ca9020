//! Event recording: what an event is and the per-thread buffers that hold events until a dump.
//!
//! Owns: [`Event`] and its parts, the profiler's clock, the thread buffers and their registry,
//! and [`drain`], which takes every buffered event out. An append to the calling thread's own
//! buffer takes no lock and no atomic read-modify-write (a [`Block`]'s publication protocol);
//! only a dump and a thread retiring a full block take that buffer's lock. A thread's first
//! event registers its buffer under the global registry lock; later ones never take it.

use crate::context::Context;
use crate::sync::Mutex;
use std::cell::{Cell, OnceCell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A string that is either static or shared (operator names are interned `Arc<str>`s, so
/// recording one costs a reference count, not a copy).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Text {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Text::Static(s) => s,
            Text::Shared(s) => s,
        }
    }
}

/// The trace "process" an event belongs to: a device, the C API, device storage, or a domain
/// of the user's own objects. Trace pids are assigned to these at dump time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Proc {
    Device(Context),
    Api,
    Storage(Context),
    CustomOp,
    /// A user domain (by name), or the domain-less `event` category.
    Domain(Arc<str>),
}

/// Scope of an instant marker (chrome trace `s`: g, p, t).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Global,
    Process,
    Thread,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// A duration (`ph: X`).
    Complete { dur: f64 },
    /// A counter value (`ph: C`).
    Counter { value: i64 },
    /// Bytes in use on the process's device after an allocation or free (`ph: C`, named
    /// `Memory: <device>`).
    Memory { bytes: u64 },
    /// An instant marker (`ph: i`).
    Instant { scope: Scope },
}

/// One recorded event. While buffered, its times (`ts` and a duration) are in ticks of the
/// profiler's clock ([`now`]); [`drain`] gives them back in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Text,
    pub cat: Text,
    pub proc: Proc,
    pub tid: u32,
    /// Start, since the profiler's clock origin.
    pub ts: f64,
    pub phase: Phase,
    /// Extra `args` members, already JSON (`"key":value,...`), if any.
    pub args: Option<Box<str>>,
}

/// The profiler's clock. Events are stamped in its ticks, which cost one `rdtsc` where the
/// kernel itself keeps time with the TSC (x86-64, `current_clocksource` is `tsc`: the counter is
/// then invariant and synchronised across cores), else one `CLOCK_MONOTONIC` read in
/// nanoseconds. [`drain`] turns ticks into microseconds, with the TSC's rate measured against
/// the monotonic clock from the origin to the drain.
struct Clock {
    tsc: bool,
    origin_ticks: u64,
    origin: Instant,
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given; CLOCK_MONOTONIC exists on
    // every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
fn raw_ticks(tsc: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if tsc {
        // SAFETY: rdtsc exists on every x86-64 CPU and only reads the time-stamp counter.
        return unsafe { std::arch::x86_64::_rdtsc() };
    }
    let _ = tsc;
    monotonic_ns()
}

fn clock() -> &'static Clock {
    BUFFERS.clock.get_or_init(|| {
        let tsc = cfg!(target_arch = "x86_64")
            && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc");
        Clock { tsc, origin_ticks: raw_ticks(tsc), origin: Instant::now() }
    })
}

/// Now, in the clock's ticks since its origin (the first use of the clock). Events hold
/// ticks until [`drain`] converts them.
#[inline]
pub fn now() -> f64 {
    let c = clock();
    raw_ticks(c.tsc).wrapping_sub(c.origin_ticks) as i64 as f64
}

/// Microseconds per tick of [`now`]. The TSC's rate is measured over at least 20 ms since the
/// origin (a drain sooner than that waits out the rest, once).
fn us_per_tick() -> f64 {
    let c = clock();
    if !c.tsc {
        return 1e-3;
    }
    const BASELINE: std::time::Duration = std::time::Duration::from_millis(20);
    if let Some(rest) = BASELINE.checked_sub(c.origin.elapsed()) {
        std::thread::sleep(rest);
    }
    let ticks = raw_ticks(true).wrapping_sub(c.origin_ticks);
    let us = c.origin.elapsed().as_secs_f64() * 1e6;
    if ticks == 0 {
        1e-3
    } else {
        us / ticks as f64
    }
}

/// What a thread's buffer holds: the events recorded at every operation in a compact form,
/// which [`drain`] expands; any other event whole. Small records mean fewer pages touched: a
/// profiled run fills memory with them. Durations are `f32` ticks (a relative error below
/// 1e-7); start times keep `f64`.
enum Rec {
    /// A C API call.
    Api {
        name: &'static str,
        ts: f64,
        dur: f32,
    },
    /// An operation that ran on the recording thread, without extra args.
    Op {
        name: Option<Arc<str>>,
        ctx: Context,
        ts: f64,
        dur: f32,
    },
    /// A C API call and the operation that ran inside it on the same thread (NaiveEngine, or
    /// a cheap operation run by the pushing thread): one record instead of two. The
    /// operation starts `op_offset` ticks after the call (before it, when an operation that
    /// ended in an outer call is recorded with an inner one).
    ApiOp {
        api: &'static str,
        ts: f64,
        dur: f32,
        op_offset: f32,
        op_dur: f32,
        name: Option<Arc<str>>,
        ctx: Context,
    },
    Full(Box<Event>),
}

impl Rec {
    fn expand(self, tid: u32, out: &mut Vec<Event>) {
        let e = match self {
            Rec::Api { name, ts, dur } => super::api_event(name, tid, ts, dur as f64),
            Rec::Op { name, ctx, ts, dur } => super::op_event(name, ctx, tid, ts, dur as f64, None),
            Rec::ApiOp { api, ts, dur, op_offset, op_dur, name, ctx } => {
                // The call first: a stable sort keeps it before an operation stamped alike.
                out.push(super::api_event(api, tid, ts, dur as f64));
                super::op_event(name, ctx, tid, ts + op_offset as f64, op_dur as f64, None)
            }
            Rec::Full(e) => *e,
        };
        out.push(e);
    }
}

/// Record slots per block of a thread's buffer.
const BLOCK: usize = 4096;

/// A fixed run of record slots: appending never moves recorded ones (a growing `Vec` would
/// copy them all at every doubling, on the recording thread) and needs no lock.
///
/// The protocol: only the owning thread writes, into slot `len`, and then publishes it by
/// storing `len + 1` (Release). A dump, holding its buffer's `retired` lock, moves the published
/// records from `taken` on out and advances `taken`. Slots before `taken` have been moved out;
/// slots from `len` on were never written.
struct Block {
    len: AtomicUsize,
    taken: AtomicUsize,
    slots: Box<[UnsafeCell<MaybeUninit<Rec>>]>,
}

impl Block {
    fn new() -> Box<Block> {
        let slots = (0..BLOCK).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
        Box::new(Block { len: AtomicUsize::new(0), taken: AtomicUsize::new(0), slots })
    }

    /// Move the published records not yet taken out, to `f`.
    ///
    /// # Safety
    /// The caller holds the owning buffer's `retired` lock, or owns the block: no other
    /// `take` runs on it at the same time.
    unsafe fn take(&self, f: &mut impl FnMut(Rec)) {
        let len = self.len.load(Ordering::Acquire);
        let from = self.taken.load(Ordering::Relaxed);
        // Advanced first: should `f` panic, the rest leak rather than drop twice.
        self.taken.store(len, Ordering::Relaxed);
        for slot in &self.slots[from..len] {
            // SAFETY: slots below `len` were written before `len` was published (this Acquire
            // pairs with the writer's Release) and are never written again; those from `taken`
            // on have not been moved out, and only the lock holder moves them.
            f(unsafe { (*slot.get()).assume_init_read() });
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let (from, len) = (*self.taken.get_mut(), *self.len.get_mut());
        for slot in &mut self.slots[from..len] {
            // SAFETY: written and not moved out (the protocol above); nothing else can reach
            // the block while it is dropped.
            unsafe { slot.get_mut().assume_init_drop() };
        }
    }
}

/// A thread's buffer.
pub(crate) struct ThreadBuf {
    pub tid: u32,
    pub name: String,
    /// The block the owning thread appends to. Only the owner replaces it, under `retired`;
    /// it is freed with the buffer.
    current: AtomicPtr<Block>,
    /// Full blocks, until a dump takes them (boxed: `current` may still point at one).
    #[allow(clippy::vec_box)]
    retired: Mutex<Vec<Box<Block>>>,
}

impl ThreadBuf {
    fn new(tid: u32, name: String) -> Self {
        ThreadBuf { tid, name, current: AtomicPtr::new(Box::into_raw(Block::new())), retired: Mutex::new(Vec::new()) }
    }

    /// Append a record.
    ///
    /// # Safety
    /// Only the thread that owns the buffer (through its [`Local`]) calls this.
    #[inline]
    unsafe fn push(&self, r: Rec) {
        // SAFETY: `current` always points to a live block: only this thread replaces it, and it
        // is freed only when the buffer is dropped.
        let mut block = unsafe { &*self.current.load(Ordering::Relaxed) };
        let mut n = block.len.load(Ordering::Relaxed);
        if n == BLOCK {
            // SAFETY: this is the owning thread (this function's contract).
            block = unsafe { self.retire_current() };
            n = 0;
        }
        // SAFETY: slot `n` is not published yet, so no dump reads it, and only this thread
        // writes slots.
        unsafe { (*block.slots[n].get()).write(r) };
        block.len.store(n + 1, Ordering::Release);
    }

    /// Hand the full current block to the dumps and start a fresh one; returns the fresh one.
    ///
    /// # Safety
    /// Only the owning thread calls this, and it does not use the returned block past its next
    /// call.
    #[cold]
    unsafe fn retire_current(&self) -> &Block {
        let fresh = Box::into_raw(Block::new());
        let mut retired = self.retired.lock();
        let full = self.current.swap(fresh, Ordering::AcqRel);
        // SAFETY: `full` came from `Box::into_raw`; once replaced, only this box refers to it
        // (dumps reach the current block only under `retired`, held here).
        retired.push(unsafe { Box::from_raw(full) });
        drop(retired);
        // SAFETY: just allocated, and live until the buffer is dropped or it is retired here.
        unsafe { &*fresh }
    }

    /// Move every published record not yet taken out, to `f`. Records of the current block
    /// are moved out under `retired` and handed to `f` after it is released, so that the owner
    /// never waits on `f` (nor finds the lock held in a child forked meanwhile).
    fn take(&self, mut f: impl FnMut(Rec)) {
        let mut current = Vec::new();
        let full = {
            let mut retired = self.retired.lock();
            // SAFETY: while `retired` is held the owner cannot replace the current block, so
            // it stays live, and no other `take` runs on it.
            unsafe { (*self.current.load(Ordering::Acquire)).take(&mut |r| current.push(r)) };
            std::mem::take(&mut *retired)
        };
        for b in full {
            // SAFETY: the retired blocks are owned here.
            unsafe { b.take(&mut f) };
        }
        current.into_iter().for_each(f);
    }
}

impl Drop for ThreadBuf {
    fn drop(&mut self) {
        // SAFETY: the current block came from `Box::into_raw` and nothing else refers to it
        // once the buffer itself is unreachable.
        drop(unsafe { Box::from_raw(*self.current.get_mut()) });
    }
}

/// Every thread's buffer, and what they share.
struct Buffers {
    /// The clock events are timed with (chosen and started at its first use).
    clock: OnceLock<Clock>,
    /// The trace tid of the next thread that records.
    next_tid: AtomicU32,
    /// The buffers of every thread that ever recorded (a thread's outlives it until drained).
    list: Mutex<Vec<Arc<ThreadBuf>>>,
}

static BUFFERS: Buffers = Buffers { clock: OnceLock::new(), next_tid: AtomicU32::new(0), list: Mutex::new(Vec::new()) };

/// The buffer list held (across `fork`, see `profiler::fork_prepare`).
pub(super) struct ListHold(#[allow(dead_code)] crate::sync::MutexGuard<'static, Vec<Arc<ThreadBuf>>>);

/// Take the buffer list: no thread adds a buffer or drains until the hold is dropped.
pub(super) fn hold_list() -> ListHold {
    ListHold(BUFFERS.list.lock())
}

/// An operation that finished inside a timed C API call on this thread, held back so that
/// the call records both in one [`Rec::ApiOp`].
struct HeldOp {
    name: Option<Arc<str>>,
    ctx: Context,
    ts: f64,
    dur: f32,
}

/// The recording state of a thread.
struct Local {
    buf: OnceCell<Arc<ThreadBuf>>,
    /// Timed C API calls open on this thread ([`api_begin`]; nested calls count).
    api_depth: Cell<u32>,
    /// The last operation that finished inside an open call, not yet recorded; the next call
    /// to end records it. An operation held here is missed by a dump taken before that call
    /// ends, and reaches the next one.
    held: Cell<Option<HeldOp>>,
}

impl Local {
    fn buf(&self) -> &ThreadBuf {
        self.buf.get_or_init(|| {
            let tid = BUFFERS.next_tid.fetch_add(1, Ordering::Relaxed);
            let name = std::thread::current().name().map_or_else(|| format!("thread {tid}"), str::to_string);
            let b = Arc::new(ThreadBuf::new(tid, name));
            BUFFERS.list.lock().push(b.clone());
            b
        })
    }
    #[inline]
    fn push(&self, r: Rec) {
        // SAFETY: a `Local` is its thread's own, and so is the buffer it created.
        unsafe { self.buf().push(r) };
    }
}

thread_local! {
    static LOCAL: Local = const { Local { buf: OnceCell::new(), api_depth: Cell::new(0), held: Cell::new(None) } };
}

fn with_buf<R>(f: impl FnOnce(&ThreadBuf) -> R) -> Option<R> {
    LOCAL.try_with(|l| f(l.buf())).ok()
}

/// The calling thread's trace tid (a small integer, assigned at its first event).
pub fn current_tid() -> u32 {
    with_buf(|b| b.tid).unwrap_or(u32::MAX)
}

/// Append an event to the calling thread's buffer. Events recorded while the thread is being
/// torn down are dropped.
pub fn record(event: Event) {
    let _ = LOCAL.try_with(|l| l.push(Rec::Full(Box::new(event))));
}

/// Start timing a C API call on this thread: its start time. Every call must be closed by
/// [`record_api`] with that start.
#[inline]
pub fn api_begin() -> f64 {
    let _ = LOCAL.try_with(|l| l.api_depth.set(l.api_depth.get() + 1));
    now()
}

/// Record the C API call opened by [`api_begin`] at `ts`, which ends now, together with the
/// operation held back while it was open, if any.
#[inline]
pub fn record_api(name: &'static str, ts: f64) {
    let end = now();
    let _ = LOCAL.try_with(|l| {
        l.api_depth.set(l.api_depth.get().saturating_sub(1));
        let dur = (end - ts) as f32;
        l.push(match l.held.take() {
            Some(op) => Rec::ApiOp {
                api: name,
                ts,
                dur,
                op_offset: (op.ts - ts) as f32,
                op_dur: op.dur,
                name: op.name,
                ctx: op.ctx,
            },
            None => Rec::Api { name, ts, dur },
        });
    });
}

/// Record an operation that ran on this thread, without extra args. Inside a timed C API call
/// it is held back and recorded with the call.
#[inline]
pub fn record_op(name: Option<Arc<str>>, ctx: Context, ts: f64, dur: f64) {
    let _ = LOCAL.try_with(|l| {
        let op = HeldOp { name, ctx, ts, dur: dur as f32 };
        if l.api_depth.get() == 0 {
            l.push(Rec::Op { name: op.name, ctx: op.ctx, ts: op.ts, dur: op.dur });
        } else if let Some(earlier) = l.held.replace(Some(op)) {
            // Several operations inside one call: the earlier ones are recorded alone.
            l.push(Rec::Op { name: earlier.name, ctx: earlier.ctx, ts: earlier.ts, dur: earlier.dur });
        }
    });
}

/// Take every buffered event out, ordered by start time, with its times in microseconds; also
/// returns the name of every thread seen (by tid). Buffers of threads that have exited are
/// dropped once empty.
pub(crate) fn drain() -> (Vec<Event>, Vec<(u32, String)>) {
    let mut all = Vec::new();
    let mut names = Vec::new();
    let mut buffers = BUFFERS.list.lock();
    let mut exited = Vec::new();
    for b in buffers.iter() {
        // Only the registry holds the buffer of a thread that has exited (and only the
        // registry could add a holder): checked before taking, so that nothing a thread
        // recorded just before exiting is dropped unread.
        exited.push(Arc::strong_count(b) == 1);
        b.take(|r| r.expand(b.tid, &mut all));
        names.push((b.tid, b.name.clone()));
    }
    let mut gone = exited.into_iter();
    buffers.retain(|_| !gone.next().unwrap_or(false));
    drop(buffers);
    let scale = us_per_tick();
    for e in &mut all {
        e.ts *= scale;
        if let Phase::Complete { dur } = &mut e.phase {
            *dur *= scale;
        }
    }
    all.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    (all, names)
}

/// Drop every buffered event (a new configuration starts empty; an operation held for a C API
/// call still open on another thread is recorded with that call, into the new one).
pub(crate) fn discard() {
    for b in BUFFERS.list.lock().iter() {
        b.take(drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_operation_records_stay_small() {
        // A record per profiled operation fills memory: keep them within 64 bytes.
        assert!(std::mem::size_of::<Rec>() <= 64, "{}", std::mem::size_of::<Rec>());
    }

    #[test]
    fn operations_inside_an_api_call_are_recorded_with_it() {
        let _g = super::super::TEST_LOCK.lock();
        let name = |n: &str| Some(Arc::<str>::from(n));
        let op = |n: &str| {
            let t = now();
            record_op(name(n), Context::CPU, t, now() - t);
        };
        // One operation in a call, two in another (the first recorded alone), one outside any
        // call, and one in the inner of two nested calls.
        let t = api_begin();
        op("held_a");
        record_api("MXHeldOne", t);
        let t = api_begin();
        op("held_b");
        op("held_c");
        record_api("MXHeldTwo", t);
        op("held_free");
        let outer = api_begin();
        let inner = api_begin();
        op("held_d");
        record_api("MXHeldInner", inner);
        record_api("MXHeldOuter", outer);
        LOCAL.with(|l| {
            assert_eq!(l.api_depth.get(), 0);
            assert!(l.held.take().is_none());
        });
        let (events, _) = drain();
        let mine: Vec<_> =
            events.iter().filter(|e| e.name.starts_with("held_") || e.name.starts_with("MXHeld")).collect();
        let names: Vec<&str> = mine.iter().map(|e| &*e.name).collect();
        assert_eq!(
            names,
            [
                "MXHeldOne",
                "held_a",
                "MXHeldTwo",
                "held_b",
                "held_c",
                "held_free",
                "MXHeldOuter",
                "MXHeldInner",
                "held_d"
            ]
        );
        let tid = current_tid();
        assert!(mine.iter().all(|e| e.tid == tid));
        let span = |e: &Event| match e.phase {
            Phase::Complete { dur } => (e.ts, e.ts + dur),
            _ => panic!("{e:?}"),
        };
        // Each operation lies within its call, in microseconds like every drained event.
        for (call, ops) in [(0, &[1][..]), (2, &[3, 4]), (7, &[8])] {
            let (c0, c1) = span(mine[call]);
            for &o in ops {
                let (o0, o1) = span(mine[o]);
                assert!(c0 <= o0 && o1 <= c1 + 1e-3, "{:?} in {:?}", mine[o], mine[call]);
                assert_eq!(&*mine[o].cat, "operator");
                assert_eq!(mine[o].proc, Proc::Device(Context::CPU));
            }
            assert_eq!(&*mine[call].cat, "MXNET_C_API");
        }
        let (f0, _) = span(mine[5]);
        assert!(f0 >= span(mine[2]).1 - 1e-3, "held_free ran after MXHeldTwo");
    }

    #[test]
    fn dumps_while_a_thread_records_take_every_record_once() {
        let _g = super::super::TEST_LOCK.lock();
        const N: usize = 3 * BLOCK + 17;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let done = done.clone();
            std::thread::spawn(move || {
                for _ in 0..N {
                    record_api("MXBlockStress", api_begin());
                }
                done.store(true, Ordering::Release);
            })
        };
        let mut stamps = Vec::new();
        let mut take = || {
            let (events, _) = drain();
            stamps.extend(events.iter().filter(|e| &*e.name == "MXBlockStress").map(|e| e.ts));
        };
        while !done.load(Ordering::Acquire) {
            take();
        }
        writer.join().unwrap();
        take();
        assert_eq!(stamps.len(), N, "every record exactly once");
        stamps.sort_by(f64::total_cmp);
        stamps.dedup();
        assert_eq!(stamps.len(), N, "no record twice");
    }

    #[test]
    fn events_from_threads_are_collected_in_time_order() {
        let _g = super::super::TEST_LOCK.lock();
        let mk = |name: &'static str| Event {
            name: Text::Static(name),
            cat: Text::Static("buffer-test"),
            proc: Proc::Api,
            tid: current_tid(),
            ts: now(),
            phase: Phase::Complete { dur: 1.0 },
            args: None,
        };
        record(mk("first"));
        std::thread::spawn(move || record(mk("second"))).join().unwrap();
        let (events, names) = drain();
        let mine: Vec<_> = events.iter().filter(|e| &*e.cat == "buffer-test").collect();
        assert_eq!(mine.len(), 2);
        assert_eq!(&*mine[0].name, "first");
        assert_eq!(&*mine[1].name, "second");
        assert_ne!(mine[0].tid, mine[1].tid);
        assert!(names.iter().any(|(t, _)| *t == mine[1].tid));
    }
}
