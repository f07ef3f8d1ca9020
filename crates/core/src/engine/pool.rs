//! Worker pools: threads that run ready operations, highest priority first.
//!
//! Owns: a pool's ready queue (a heap ordered by priority, then push order), its worker
//! threads, and how they wait for work: one worker at a time spins briefly, the others sleep
//! on a condition variable. A pusher wakes a sleeper only when nobody spins, so a busy pool
//! costs no system call per operation. Also each worker's hand-off slot: an operation that a
//! worker makes ready (by finishing or registering another) while its pool has nothing else
//! ready is kept by that worker and run next, without going through the shared queue.
//!
//! Memory ordering: a worker increments `sleepers` and checks the queue and the engine's
//! submissions under the queue lock before it sleeps; a pusher adds to the queue under the
//! same lock (or to the submissions), then reads `spinning` and `sleepers` (all SeqCst). A
//! spinner clears `spinning` before it looks a last time and goes to sleep, so either the
//! pusher sees a sleeper or a spinner and wakes it or leaves it be, or the worker sees the
//! work: a wake-up cannot be lost. A worker that takes work while more is queued wakes
//! another.

use super::opr::Opr;
use super::Engine;
use crate::sync::{Condvar, Mutex, Padded};
use std::cell::{Cell, RefCell};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

thread_local! {
    /// The pool whose worker this thread is (null elsewhere).
    static CURRENT: Cell<*const Pool> = const { Cell::new(std::ptr::null()) };
    /// The operation this worker runs next (see the module doc).
    static HANDOFF: RefCell<Option<Arc<Opr>>> = const { RefCell::new(None) };
}

struct Ready {
    priority: i32,
    seq: u64,
    op: Arc<Opr>,
}

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.priority == other.priority && self.seq == other.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ready {
    /// Max-heap: higher priority first, then earlier push first.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.priority.cmp(&other.priority).then_with(|| other.seq.cmp(&self.seq))
    }
}

/// A pool of worker threads with one ready queue.
pub struct Pool {
    name: String,
    heap: Mutex<BinaryHeap<Ready>>,
    cv: Condvar,
    len: AtomicUsize,
    /// Read by every push to the engine, written only when a worker goes to sleep or wakes:
    /// on a line of its own, and read before `spinning`, so that a busy pool costs a
    /// pushing thread no cache miss.
    sleepers: Padded<AtomicUsize>,
    /// A worker is spinning for work (at most one at a time).
    spinning: Padded<AtomicBool>,
    seq: AtomicU64,
    threads: usize,
}

/// How long an idle worker keeps looking for work before it sleeps. Waking a sleeping
/// worker costs the pusher a system call and the worker microseconds; spinning this long
/// covers the gap between pushes of a producer that is a little slower than the workers.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a spinning worker looks before it yields its CPU, and again after each yield. A
/// worker woken by the thread that pushes is often placed on that thread's CPU, and stays
/// there until the scheduler moves one of them (milliseconds): spinning there would hold
/// up the very pushes it waits for, then sleep and be woken again, over and over. A pusher
/// that keeps the worker busy from another CPU leaves it no gap this long.
const SPIN_YIELD: std::time::Duration = std::time::Duration::from_micros(10);

/// While an operation's own function runs on a worker: nothing it makes ready is kept for
/// this worker (the function might wait for it; another worker can run it meanwhile).
pub(crate) struct UserCode(*const Pool);

impl UserCode {
    pub(crate) fn enter() -> Self {
        UserCode(CURRENT.with(|c| c.replace(std::ptr::null())))
    }
}

impl Drop for UserCode {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

impl Pool {
    /// Create the pool and start its `threads` workers (named `"{name} {i}"`). Pools live as
    /// long as the process, like the engine that owns them (operations refer to them).
    pub fn start(name: &str, threads: usize, engine: &'static Engine) -> std::io::Result<&'static Pool> {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            name: name.to_string(),
            heap: Mutex::new(BinaryHeap::new()),
            cv: Condvar::new(),
            len: AtomicUsize::new(0),
            sleepers: Padded(AtomicUsize::new(0)),
            spinning: Padded(AtomicBool::new(false)),
            seq: AtomicU64::new(0),
            threads,
        }));
        for i in 0..threads {
            let p = pool;
            std::thread::Builder::new().name(format!("{name} {i}")).spawn(move || p.work(engine))?;
        }
        Ok(pool)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Queue a ready operation. A sleeping worker is woken only when none is spinning. On a
    /// worker of this pool with nothing else ready, the worker keeps it and runs it next.
    pub fn push(&self, op: Arc<Opr>) {
        let op = if self.len.load(Ordering::Acquire) == 0 && std::ptr::eq(CURRENT.with(Cell::get), self) {
            match HANDOFF.with(|h| {
                let mut h = h.borrow_mut();
                if h.is_none() {
                    *h = Some(op);
                    None
                } else {
                    Some(op)
                }
            }) {
                None => return,
                Some(op) => op,
            }
        } else {
            op
        };
        self.push_shared(op);
    }

    fn push_shared(&self, op: Arc<Opr>) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut heap = self.heap.lock();
            heap.push(Ready { priority: op.priority, seq, op });
            self.len.store(heap.len(), Ordering::Release);
        }
        self.wake_one();
    }

    /// After an operation for this pool joined the engine's submissions: wake a sleeping
    /// worker to register it, unless one spins (it will see it). Workers that run an
    /// operation look at the submissions when it ends. Notifies under the queue lock, so it
    /// cannot slip between a worker's last check and its sleep.
    pub fn wake_for_submission(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.wake_sleeper_locked();
    }

    /// Wake a sleeping worker unless one spins, notifying under the queue lock.
    #[inline(always)]
    fn wake_sleeper_locked(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.wake_sleeper_unless_spinning();
        }
    }

    /// [`Pool::wake_sleeper_locked`] once a worker sleeps.
    #[cold]
    #[inline(never)]
    fn wake_sleeper_unless_spinning(&self) {
        if !self.spinning.load(Ordering::SeqCst) {
            let _heap = self.heap.lock();
            self.cv.notify_one();
        }
    }

    /// The operation this worker kept (see [`Pool::push`]), unless others became ready
    /// meanwhile: then it joins them and priority decides.
    fn take_handoff(&self) -> Option<Arc<Opr>> {
        let op = HANDOFF.with(|h| h.borrow_mut().take())?;
        if self.len.load(Ordering::Acquire) > 0 {
            self.push_shared(op);
            return None;
        }
        Some(op)
    }

    fn wake_one(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 && !self.spinning.load(Ordering::SeqCst) {
            self.cv.notify_one();
        }
    }

    fn try_pop(&self) -> Option<Arc<Opr>> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut heap = self.heap.lock();
        let r = heap.pop();
        self.len.store(heap.len(), Ordering::Release);
        r.map(|r| r.op)
    }

    /// Spin for work if no other worker of this pool spins; at most one does, so idle pools
    /// do not take the cores from the threads that push.
    fn spin(&self, engine: &'static Engine) -> Option<Arc<Opr>> {
        if self.spinning.swap(true, Ordering::SeqCst) {
            return None;
        }
        let start = std::time::Instant::now();
        let mut yield_at = SPIN_YIELD;
        let mut found = None;
        'outer: loop {
            for _ in 0..64 {
                if self.len.load(Ordering::Acquire) > 0 {
                    found = self.try_pop();
                    if found.is_some() {
                        break 'outer;
                    }
                }
                if engine.has_submissions() {
                    break 'outer;
                }
                std::hint::spin_loop();
            }
            let spun = start.elapsed();
            if spun > SPIN {
                break;
            }
            if spun > yield_at {
                // Nothing for a while: the thread that pushes may be waiting for this CPU.
                std::thread::yield_now();
                yield_at = spun + SPIN_YIELD;
            }
        }
        self.spinning.store(false, Ordering::SeqCst);
        found
    }

    /// The next operation to run; meanwhile registers pushed operations, spins (one worker
    /// per pool) and finally sleeps.
    fn next(&self, engine: &'static Engine) -> Arc<Opr> {
        loop {
            if let Some(op) = self.take_handoff() {
                return op;
            }
            if let Some(op) = self.try_pop() {
                return op;
            }
            if engine.drain_submissions() {
                continue;
            }
            if engine.has_submissions() {
                // Another worker registers them: let that thread run instead of spinning
                // against it.
                std::thread::yield_now();
                continue;
            }
            if let Some(op) = self.spin(engine) {
                return op;
            }
            if engine.has_submissions() {
                continue;
            }
            // Going idle: drop the finished operations no pushing thread has dropped yet, so
            // that the memory they hold does not wait for the next push.
            engine.reap();
            let mut heap = self.heap.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            while heap.is_empty() && !engine.has_submissions() {
                heap = self.cv.wait(heap);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            let r = heap.pop();
            self.len.store(heap.len(), Ordering::Release);
            drop(heap);
            if let Some(r) = r {
                return r.op;
            }
        }
    }

    fn work(&'static self, engine: &'static Engine) {
        super::mark_worker_thread();
        CURRENT.with(|c| c.set(self as *const Pool));
        loop {
            let op = self.next(engine);
            // More work queued: make sure another worker looks at it.
            if self.len.load(Ordering::Acquire) > 0 {
                self.wake_one();
            }
            engine.execute(op);
        }
    }
}
