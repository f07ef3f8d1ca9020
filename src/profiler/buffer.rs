//! Event recording: what an event is and the per-thread buffers that hold events until a dump.
//!
//! Owns: [`Event`] and its parts, the profiler's clock, the thread buffers and their registry,
//! and [`drain`], which takes every buffered event out. Recording appends to the calling
//! thread's own buffer under that buffer's lock, which only a dump ever contends for; there is
//! no global lock on the recording path.

use crate::context::Context;
use crate::sync::Mutex;
use std::cell::OnceCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU32, Ordering};
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
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
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
    if ticks == 0 { 1e-3 } else { us / ticks as f64 }
}

/// What a thread's buffer holds: the two events recorded at every operation (a C API call and
/// an operation, on the recording thread and without extra args) in a compact form, which
/// [`drain`] expands; any other event whole. Small records mean fewer pages touched: a
/// profiled run fills memory with them.
enum Rec {
    Api { name: &'static str, ts: f64, dur: f64 },
    Op { name: Option<Arc<str>>, ctx: Context, ts: f64, dur: f64 },
    Full(Box<Event>),
}

impl Rec {
    fn expand(self, tid: u32) -> Event {
        match self {
            Rec::Api { name, ts, dur } => super::api_event(name, tid, ts, dur),
            Rec::Op { name, ctx, ts, dur } => super::op_event(name, ctx, tid, ts, dur, None),
            Rec::Full(e) => *e,
        }
    }
}

/// Records per chunk of a thread's buffer.
const CHUNK: usize = 4096;

/// A thread's records in fixed-size chunks: appending never moves recorded ones (a growing
/// `Vec` would copy them all at every doubling, on the recording thread).
#[derive(Default)]
struct Chunks {
    full: Vec<Vec<Rec>>,
    current: Vec<Rec>,
}

impl Chunks {
    #[inline]
    fn push(&mut self, r: Rec) {
        if self.current.len() == self.current.capacity() {
            let next = Vec::with_capacity(CHUNK);
            let done = std::mem::replace(&mut self.current, next);
            if !done.is_empty() {
                self.full.push(done);
            }
        }
        self.current.push(r);
    }
    /// Expand every record into `out`.
    fn expand_into(self, tid: u32, out: &mut Vec<Event>) {
        for c in self.full.into_iter().chain(std::iter::once(self.current)) {
            out.extend(c.into_iter().map(|r| r.expand(tid)));
        }
    }
}

/// A thread's buffer.
pub(crate) struct ThreadBuf {
    pub tid: u32,
    pub name: String,
    events: Mutex<Chunks>,
}

static NEXT_TID: AtomicU32 = AtomicU32::new(0);
static BUFFERS: Mutex<Vec<Arc<ThreadBuf>>> = Mutex::new(Vec::new());

thread_local! {
    static BUF: OnceCell<Arc<ThreadBuf>> = const { OnceCell::new() };
}

fn with_buf<R>(f: impl FnOnce(&ThreadBuf) -> R) -> Option<R> {
    BUF.try_with(|b| {
        let b = b.get_or_init(|| {
            let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
            let name = std::thread::current().name().map_or_else(|| format!("thread {tid}"), str::to_string);
            let b = Arc::new(ThreadBuf { tid, name, events: Mutex::new(Chunks::default()) });
            BUFFERS.lock().push(b.clone());
            b
        });
        f(b)
    })
    .ok()
}

/// The calling thread's trace tid (a small integer, assigned at its first event).
pub fn current_tid() -> u32 {
    with_buf(|b| b.tid).unwrap_or(u32::MAX)
}

/// Append an event to the calling thread's buffer. Events recorded while the thread is being
/// torn down are dropped.
pub fn record(event: Event) {
    with_buf(|b| b.events.lock().push(Rec::Full(Box::new(event))));
}

/// Record a C API call made on this thread.
#[inline]
pub fn record_api(name: &'static str, ts: f64, dur: f64) {
    with_buf(|b| b.events.lock().push(Rec::Api { name, ts, dur }));
}

/// Record an operation that ran on this thread, without extra args.
#[inline]
pub fn record_op(name: Option<Arc<str>>, ctx: Context, ts: f64, dur: f64) {
    with_buf(|b| b.events.lock().push(Rec::Op { name, ctx, ts, dur }));
}

/// Take every buffered event out, ordered by start time, with its times in microseconds; also
/// returns the name of every thread seen (by tid). Buffers of threads that have exited are
/// dropped once empty.
pub(crate) fn drain() -> (Vec<Event>, Vec<(u32, String)>) {
    let mut all = Vec::new();
    let mut names = Vec::new();
    let mut buffers = BUFFERS.lock();
    for b in buffers.iter() {
        // Swapped out under the lock, expanded outside it.
        let taken = std::mem::take(&mut *b.events.lock());
        taken.expand_into(b.tid, &mut all);
        names.push((b.tid, b.name.clone()));
    }
    // Only the registry holds the buffer of a thread that has exited.
    buffers.retain(|b| Arc::strong_count(b) > 1);
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

/// Drop every buffered event (a new configuration starts empty).
pub(crate) fn discard() {
    for b in BUFFERS.lock().iter() {
        let taken = std::mem::take(&mut *b.events.lock());
        drop(taken); // outside the lock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_operation_records_stay_small() {
        // Two records per profiled operation fill memory: keep them within 48 bytes.
        assert!(std::mem::size_of::<Rec>() <= 48, "{}", std::mem::size_of::<Rec>());
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
