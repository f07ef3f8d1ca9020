//! Worker pools: threads that run ready operations, highest priority first.
//!
//! Owns: a pool's ready queue (a heap ordered by priority, then push order), its worker
//! threads, and how they wait for work: one worker at a time spins briefly, the others sleep
//! on a condition variable. A pusher wakes a sleeper only when nobody spins, so a busy pool
//! costs no system call per operation.
//!
//! Memory ordering: a worker increments `sleepers` and checks the queue under the queue lock
//! before it sleeps; a pusher adds to the queue under the same lock and reads `spinning` and
//! `sleepers` after releasing it. A spinner clears `spinning` before it takes that lock to go
//! to sleep, so either the pusher sees a sleeper and wakes it or the worker sees the work:
//! a wake-up cannot be lost. A worker that takes work while more is queued wakes another.

use super::opr::Opr;
use super::Engine;
use crate::sync::{Condvar, Mutex};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

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
    sleepers: AtomicUsize,
    /// A worker is spinning for work (at most one at a time).
    spinning: AtomicBool,
    seq: AtomicU64,
    threads: usize,
}

/// How long an idle worker keeps looking for work before it sleeps. Waking a sleeping
/// worker costs the pusher a system call and the worker microseconds; spinning this long
/// covers the gap between pushes of a producer that is a little slower than the workers.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

impl Pool {
    /// Create the pool and start its `threads` workers (named `"{name} {i}"`). Pools live as
    /// long as the process, like the engine that owns them (operations refer to them).
    pub fn start(name: &str, threads: usize, engine: &'static Engine) -> std::io::Result<&'static Pool> {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            name: name.to_string(),
            heap: Mutex::new(BinaryHeap::new()),
            cv: Condvar::new(),
            len: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            spinning: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            threads,
        }));
        for i in 0..threads {
            let p = pool;
            std::thread::Builder::new()
                .name(format!("{name} {i}"))
                .spawn(move || p.work(engine))?;
        }
        Ok(pool)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Queue a ready operation. A sleeping worker is woken only when none is spinning.
    pub fn push(&self, op: Arc<Opr>) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut heap = self.heap.lock();
            heap.push(Ready { priority: op.priority, seq, op });
            self.len.store(heap.len(), Ordering::Release);
        }
        self.wake_one();
    }

    /// Wake a sleeping worker (pushes call this when no worker polls for submissions). Under
    /// the queue lock, so it cannot slip between a worker's last check and its sleep.
    pub fn wake_sleeper(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _heap = self.heap.lock();
            self.cv.notify_one();
        }
    }

    fn wake_one(&self) {
        if !self.spinning.load(Ordering::SeqCst) && self.sleepers.load(Ordering::SeqCst) > 0 {
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
            if start.elapsed() > SPIN {
                break;
            }
        }
        self.spinning.store(false, Ordering::SeqCst);
        found
    }

    /// The next operation to run; meanwhile registers pushed operations, spins (one worker
    /// per pool) and finally sleeps. Keeps `engine.pollers()` counting this worker while it
    /// looks for work.
    fn next(&self, engine: &'static Engine) -> Arc<Opr> {
        loop {
            if let Some(op) = self.try_pop() {
                return op;
            }
            if engine.drain_submissions() {
                continue;
            }
            if let Some(op) = self.spin(engine) {
                return op;
            }
            if engine.has_submissions() {
                continue;
            }
            let mut heap = self.heap.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            engine.pollers().fetch_sub(1, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            while heap.is_empty() && !engine.has_submissions() {
                heap = self.cv.wait(heap);
            }
            engine.pollers().fetch_add(1, Ordering::SeqCst);
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
        engine.pollers().fetch_add(1, Ordering::SeqCst);
        loop {
            let op = self.next(engine);
            // More work queued: make sure another worker looks at it.
            if self.len.load(Ordering::Acquire) > 0 {
                self.wake_one();
            }
            engine.pollers().fetch_sub(1, Ordering::SeqCst);
            engine.execute(op);
            engine.pollers().fetch_add(1, Ordering::SeqCst);
        }
    }
}
