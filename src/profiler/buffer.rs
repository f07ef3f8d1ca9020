//! Event recording: what an event is and the per-thread buffers that hold events until a dump.
//!
//! Owns: [`Event`] and its parts, the thread buffers and their registry, and [`drain`], which
//! takes every buffered event out. Recording appends to the calling thread's own buffer under
//! that buffer's lock, which only a dump ever contends for; there is no global lock on the
//! recording path.

use crate::context::Context;
use parking_lot::Mutex;
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
    /// A duration (`ph: X`), in microseconds.
    Complete { dur: f64 },
    /// A counter value (`ph: C`).
    Counter { value: i64 },
    /// Bytes in use on the process's device after an allocation or free (`ph: C`, named
    /// `Memory: <device>`).
    Memory { bytes: u64 },
    /// An instant marker (`ph: i`).
    Instant { scope: Scope },
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Text,
    pub cat: Text,
    pub proc: Proc,
    pub tid: u32,
    /// Start, in microseconds since the profiler's clock origin.
    pub ts: f64,
    pub phase: Phase,
    /// Extra `args` members, already JSON (`"key":value,...`), if any.
    pub args: Option<Box<str>>,
}

/// Microseconds since the clock origin (the first use of the profiler's clock).
pub fn now_us() -> f64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as f64 / 1000.0
}

/// Events per chunk of a thread's buffer.
const CHUNK: usize = 4096;

/// A thread's events in fixed-size chunks: appending never moves recorded events (a growing
/// `Vec` would copy them all at every doubling, on the recording thread).
#[derive(Default)]
struct Chunks {
    full: Vec<Vec<Event>>,
    current: Vec<Event>,
}

impl Chunks {
    fn push(&mut self, e: Event) {
        if self.current.len() == self.current.capacity() {
            let next = Vec::with_capacity(CHUNK);
            let done = std::mem::replace(&mut self.current, next);
            if !done.is_empty() {
                self.full.push(done);
            }
        }
        self.current.push(e);
    }
    fn take_into(&mut self, out: &mut Vec<Event>) {
        for mut c in self.full.drain(..) {
            out.append(&mut c);
        }
        out.append(&mut self.current);
    }
    fn clear(&mut self) {
        self.full.clear();
        self.current.clear();
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
    with_buf(|b| b.events.lock().push(event));
}

/// Take every buffered event out, ordered by start time; also returns the name of every
/// thread seen (by tid). Buffers of threads that have exited are dropped once empty.
pub(crate) fn drain() -> (Vec<Event>, Vec<(u32, String)>) {
    let mut all = Vec::new();
    let mut names = Vec::new();
    let mut buffers = BUFFERS.lock();
    for b in buffers.iter() {
        b.events.lock().take_into(&mut all);
        names.push((b.tid, b.name.clone()));
    }
    // Only the registry holds the buffer of a thread that has exited.
    buffers.retain(|b| Arc::strong_count(b) > 1);
    drop(buffers);
    all.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    (all, names)
}

/// Drop every buffered event (a new configuration starts empty).
pub(crate) fn discard() {
    for b in BUFFERS.lock().iter() {
        b.events.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_from_threads_are_collected_in_time_order() {
        let _g = super::super::TEST_LOCK.lock();
        let mk = |name: &'static str| Event {
            name: Text::Static(name),
            cat: Text::Static("buffer-test"),
            proc: Proc::Api,
            tid: current_tid(),
            ts: now_us(),
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
