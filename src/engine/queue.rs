//! The submission queue: pushed operations on their way to registration.
//!
//! Owns: an intrusive multi-producer, single-consumer queue of operations (D. Vyukov's
//! design), linked through each operation's [`Link`] (its first field). A push is one atomic
//! swap and one store, with no allocation; a pop is plain loads and stores. The single
//! consumer at a time is whichever worker holds the engine's registration lock.
//!
//! Invariants: `head` is the next node to pop (the stub when the queue is drained), `tail`
//! the last node pushed; every node's `next` is null until the node behind it is linked.
//! Between a producer's swap of `tail` and its store of `prev.next` the queue looks
//! non-empty but pops nothing: the consumer tries again later.

use super::opr::Opr;
use crate::sync::Padded;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

/// The queue link at the start of an operation (`Opr` is `repr(C)` with it first, so a
/// `*mut Opr` is a valid `*mut Link`).
#[derive(Default)]
pub(crate) struct Link {
    next: AtomicPtr<Link>,
}

pub(crate) struct SubmitQueue {
    /// Written by producers.
    tail: Padded<AtomicPtr<Link>>,
    /// Written by the consumer only; read by anyone asking whether the queue is empty.
    head: Padded<AtomicPtr<Link>>,
    /// The placeholder node: a leaked box (a raw pointer from the start, so that moving the
    /// queue moves no `Box` that would invalidate the pointers to it), freed by `Drop`.
    stub: *mut Link,
}

// SAFETY: the raw pointers are operations owned by the queue (one `Arc` reference each) and
// the stub it owns; producers only swap `tail` and link the previous node, the consumer is
// one thread at a time (callers of `pop` hold the registration lock).
unsafe impl Send for SubmitQueue {}
// SAFETY: as above.
unsafe impl Sync for SubmitQueue {}

impl SubmitQueue {
    pub(crate) fn new() -> Self {
        let stub = Box::into_raw(Box::new(Link::default()));
        SubmitQueue { tail: Padded(AtomicPtr::new(stub)), head: Padded(AtomicPtr::new(stub)), stub }
    }

    fn stub(&self) -> *mut Link {
        self.stub
    }

    fn push_link(&self, n: *mut Link) {
        // SAFETY: `n` is the stub or an operation this queue now owns; nobody else links it.
        unsafe { (*n).next.store(std::ptr::null_mut(), Ordering::Relaxed) };
        let prev = self.tail.swap(n, Ordering::SeqCst);
        // SAFETY: `prev` stays alive until the consumer has moved past it, which it cannot do
        // before this store makes `n` reachable.
        unsafe { (*prev).next.store(n, Ordering::Release) };
    }

    /// Add an operation (any thread). SeqCst, so that a worker that checks
    /// [`SubmitQueue::is_empty`] after announcing it sleeps sees the push, or the pusher sees
    /// the sleeper.
    pub(crate) fn push(&self, op: Arc<Opr>) {
        self.push_link(Arc::into_raw(op) as *mut Opr as *mut Link);
    }

    /// Take the oldest operation, if one is fully linked.
    ///
    /// # Safety
    /// One consumer at a time: the caller holds the engine's registration lock.
    pub(crate) unsafe fn pop(&self) -> Option<Arc<Opr>> {
        let stub = self.stub();
        let mut head = self.head.load(Ordering::Relaxed);
        // SAFETY (this block): nodes between head and tail are alive (owned by the queue), and
        // only this consumer moves `head`.
        unsafe {
            let mut next = (*head).next.load(Ordering::Acquire);
            if head == stub {
                if next.is_null() {
                    return None;
                }
                self.head.store(next, Ordering::Relaxed);
                head = next;
                next = (*next).next.load(Ordering::Acquire);
            }
            if !next.is_null() {
                self.head.store(next, Ordering::Relaxed);
                return Some(Arc::from_raw(head as *const Opr));
            }
            if head != self.tail.load(Ordering::Acquire) {
                // A producer swapped `tail` but has not linked its node yet.
                return None;
            }
            // `head` is the last node: put the stub behind it so that it can be taken.
            self.push_link(stub);
            next = (*head).next.load(Ordering::Acquire);
            if !next.is_null() {
                self.head.store(next, Ordering::Relaxed);
                return Some(Arc::from_raw(head as *const Opr));
            }
            None
        }
    }

    /// Nothing pushed waits for the consumer (a push in progress counts as waiting).
    pub(crate) fn is_empty(&self) -> bool {
        let stub = self.stub();
        self.tail.load(Ordering::SeqCst) == stub && self.head.load(Ordering::Acquire) == stub
    }
}

impl Drop for SubmitQueue {
    /// Drops what is still queued, then the stub. (The process engine is never dropped;
    /// engines built by tests are leaked too, but the queue does not rely on it.)
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no producer or other consumer exists any more.
        while let Some(op) = unsafe { self.pop() } {
            drop(op);
        }
        // SAFETY: the stub came from `Box::into_raw` in `new` and is freed only here; a drained
        // queue's head and tail point to it and are not used again.
        drop(unsafe { Box::from_raw(self.stub) });
    }
}
