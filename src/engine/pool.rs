//! Worker pools: threads that run ready operations, highest priority first.
//!
//! Owns: a pool's ready queue (a heap ordered by priority, then push order), its worker
//! threads, and how they wait for work: spin briefly, then sleep on a condition variable.
//! A pusher wakes a worker only when one sleeps, so a busy pool costs no system call per
//! operation.
//!
//! Memory ordering: a worker increments `sleepers` and checks the queue under the queue lock
//! before it sleeps; a pusher adds to the queue under the same lock and reads `sleepers` after
//! releasing it. The lock orders the two, so a wake-up cannot be lost.

use super::opr::Opr;
use super::Engine;
use parking_lot::{Condvar, Mutex};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    seq: AtomicU64,
    threads: usize,
}

/// Iterations a worker spins looking for work before it sleeps.
const SPIN: u32 = 4000;

impl Pool {
    /// Create the pool and start its `threads` workers (named `"{name} {i}"`).
    pub fn start(name: &str, threads: usize, engine: &'static Engine) -> std::io::Result<Arc<Pool>> {
        let pool = Arc::new(Pool {
            name: name.to_string(),
            heap: Mutex::new(BinaryHeap::new()),
            cv: Condvar::new(),
            len: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            threads,
        });
        for i in 0..threads {
            let p = pool.clone();
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

    /// Queue a ready operation.
    pub fn push(&self, op: Arc<Opr>) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut heap = self.heap.lock();
            heap.push(Ready { priority: op.priority, seq, op });
            self.len.store(heap.len(), Ordering::Release);
        }
        if self.sleepers.load(Ordering::SeqCst) > 0 {
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

    fn next(&self) -> Arc<Opr> {
        if let Some(op) = self.try_pop() {
            return op;
        }
        for i in 0..SPIN {
            if self.len.load(Ordering::Acquire) > 0 {
                if let Some(op) = self.try_pop() {
                    return op;
                }
            }
            if i % 64 == 63 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let mut heap = self.heap.lock();
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let r = loop {
            if let Some(r) = heap.pop() {
                break r;
            }
            self.cv.wait(&mut heap);
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.len.store(heap.len(), Ordering::Release);
        r.op
    }

    fn work(self: Arc<Self>, engine: &'static Engine) {
        super::mark_worker_thread();
        loop {
            let op = self.next();
            engine.execute(op);
        }
    }
}
