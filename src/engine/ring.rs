//! The owner's submission ring: pushes of the one thread that pushes (solo mode, see
//! [`super::solo`]) to the CPU worker pool of a threaded engine, without a locked instruction
//! and without allocating.
//!
//! Owns: a single-producer ring of slots that hold the pushed operation itself ([`Push`]),
//! the index the producer publishes, the consumer's index, and each slot's way back to the
//! producer.
//!
//! Protocol:
//! - The producer (the solo owner) writes a free slot and publishes it by storing the new
//!   `tail` (Release). A slot is free when it was never used, or when it was given back by
//!   the consumer (`done`, Release) and then emptied by a reclaimer.
//! - The consumer is whichever worker holds the engine's registration lock; it takes slots
//!   in order (`head`). It either runs the operation on the spot, having taken all of its
//!   variables at once, and sets `done` after it finished; or it moves the operation out into
//!   an ordinary registered operation and sets `done` at once.
//! - Reclaiming drops what a given-back slot still holds (the operation's variables, name and
//!   scope) and advances `reclaimed` (Release) past it; it runs under the reclaim lock. The
//!   producer reclaims in batches, every [`RECLAIM_BATCH`] pushes, the slots older than
//!   [`RECLAIM_LAG`] (whose lines the workers are done with): the references are then taken
//!   and dropped on the producer, so their counts' cache lines stay there, at one lock per
//!   batch. A thread that waits, and a worker about to sleep, reclaim everything given back
//!   (also behind a slot still in use, without advancing past it), so that references to
//!   data the caller freed do not outlive its operations.
//! - The producer writes slot `t` only once `reclaimed` (Acquire) is past `t - SLOTS`. A
//!   full ring (that slot still busy) sends the push the ordinary way (the submission queue).
//!   A queued submission carries how many slots were published before it was pushed; the
//!   engine registers those before it, takes nothing from the ring directly while the queue
//!   holds anything, and the producer uses the ring again only once the queue is empty, so
//!   that push order holds across the two.

use super::Push;
use crate::sync::{Mutex, Padded};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Slots in a ring: operations the owner may have published and not yet got back.
pub(crate) const SLOTS: usize = 1024;

/// How far behind the newest slot the producer empties slots: far enough that the workers
/// are done with their cache lines (emptying the one a worker just gave back would take its
/// lines while it still works next to them), near enough that data the caller freed goes
/// soon.
const RECLAIM_LAG: usize = 64;

/// Pushes between two of the producer's reclaims (see the protocol above).
const RECLAIM_BATCH: usize = 32;

/// One pushed operation, on cache lines of its own.
#[repr(align(64))]
pub(crate) struct Slot {
    /// The consumer is done with the slot: a reclaimer may drop what it holds, and the
    /// producer then reuse it.
    done: AtomicBool,
    push: UnsafeCell<Option<Push>>,
}

pub(crate) struct Ring {
    /// Slots published (written by the producer only).
    tail: Padded<AtomicUsize>,
    /// Slots taken by the consumer (written under the registration lock only).
    head: Padded<AtomicUsize>,
    /// Slots given back and emptied (written under `reclaim`).
    reclaimed: Padded<AtomicUsize>,
    reclaim: Mutex<()>,
    slots: Box<[Slot]>,
}

// SAFETY: a slot's `push` is reached by one thread at a time: the producer from the
// `reclaimed` store past its previous use (Acquire) to the publishing `tail` store, the
// consumer from there to its `done` store, a reclaimer (one at a time: the reclaim lock)
// from `done` (Acquire) to the `reclaimed` store past it (Release). The consumer is one
// thread at a time (callers of the consumer side hold the engine's registration lock).
unsafe impl Sync for Ring {}
// SAFETY: as above; what the slots hold (`Push`) is `Send`.
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of [`SLOTS`] slots, or an unused one without slots (NaiveEngine).
    pub(crate) fn new(used: bool) -> Self {
        let n = if used { SLOTS } else { 0 };
        Ring {
            tail: Padded(AtomicUsize::new(0)),
            head: Padded(AtomicUsize::new(0)),
            reclaimed: Padded(AtomicUsize::new(0)),
            reclaim: Mutex::new(()),
            slots: (0..n).map(|_| Slot { done: AtomicBool::new(false), push: UnsafeCell::new(None) }).collect(),
        }
    }

    /// Slots published so far (any thread; counted as pushed operations).
    #[inline]
    pub(crate) fn published(&self) -> usize {
        self.tail.load(Ordering::Acquire)
    }

    /// Published slots that the consumer has not taken yet.
    #[inline]
    pub(crate) fn has_records(&self) -> bool {
        self.head.load(Ordering::Acquire) != self.tail.load(Ordering::Acquire)
    }

    /// Producer: publish `p`, or give it back when the ring is full.
    ///
    /// # Safety
    /// Called only by the solo owner (one thread, for the life of the ring), on a ring with
    /// slots.
    #[inline]
    pub(crate) unsafe fn publish(&self, p: Push) -> Result<(), Push> {
        let t = self.tail.load(Ordering::Relaxed);
        if t % RECLAIM_BATCH == 0 && t >= RECLAIM_LAG {
            self.reclaim_upto(t - RECLAIM_LAG, false);
        }
        if t >= SLOTS && self.reclaimed.load(Ordering::Acquire) <= t - SLOTS {
            // The slot's previous operation is not back yet, or not emptied: empty what is
            // back, once more.
            self.reclaim_upto(t, false);
            if self.reclaimed.load(Ordering::Acquire) <= t - SLOTS {
                return Err(p);
            }
        }
        let slot = &self.slots[t % SLOTS];
        // SAFETY: the slot is the producer's: never published, or reclaimed (the Acquire
        // loads above).
        unsafe { *slot.push.get() = Some(p) };
        slot.done.store(false, Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
        Ok(())
    }

    /// Empty the given-back slots below `upto`, in order, stopping at the first not given
    /// back. With `wait` false, skipped while another thread reclaims.
    fn reclaim_upto(&self, upto: usize, wait: bool) {
        let _g = if wait {
            self.reclaim.lock()
        } else {
            match self.reclaim.try_lock() {
                Some(g) => g,
                None => return,
            }
        };
        let mut r = self.reclaimed.load(Ordering::Relaxed);
        while r < upto {
            let slot = &self.slots[r % SLOTS];
            if !slot.done.load(Ordering::Acquire) {
                break;
            }
            // SAFETY: given back (`done`, Acquire) and not reclaimed: the reclaimer's, and
            // this thread holds the reclaim lock.
            let old = unsafe { (*slot.push.get()).take() };
            drop(old);
            r += 1;
        }
        self.reclaimed.store(r, Ordering::Release);
        if wait {
            // Behind an operation still running, empty the slots given back without moving
            // `reclaimed` past it (the slots stay given back, empty): a long operation does
            // not keep what later, finished ones held.
            for i in r + 1..upto {
                let slot = &self.slots[i % SLOTS];
                if slot.done.load(Ordering::Acquire) {
                    // SAFETY: as above (given back, not reclaimed, the reclaim lock held).
                    drop(unsafe { (*slot.push.get()).take() });
                }
            }
        }
    }

    /// Empty every slot given back so far (a thread that waits, a worker about to sleep):
    /// the references they hold may be the last ones to data the caller freed.
    pub(crate) fn reclaim_all(&self) {
        if self.slots.is_empty() || self.reclaimed.load(Ordering::Relaxed) == self.tail.load(Ordering::Acquire) {
            return;
        }
        self.reclaim_upto(self.tail.load(Ordering::Acquire), true);
    }

    /// Consumer: the next published slot's operation, if any.
    ///
    /// # Safety
    /// The caller holds the engine's registration lock, and finishes with the slot (through
    /// [`Ring::take`] or [`Ring::give_back`]) before it takes another.
    #[inline]
    pub(crate) unsafe fn peek(&self) -> Option<(&Slot, &mut Push)> {
        // SAFETY: per the caller's contract.
        unsafe { self.peek_below(usize::MAX) }
    }

    /// Consumer: [`Ring::peek`], for a slot below `mark` only.
    ///
    /// # Safety
    /// As for [`Ring::peek`].
    #[inline]
    pub(crate) unsafe fn peek_below(&self, mark: usize) -> Option<(&Slot, &mut Push)> {
        let h = self.head.load(Ordering::Relaxed);
        if h >= mark || h == self.tail.load(Ordering::Acquire) {
            return None;
        }
        let slot = &self.slots[h % SLOTS];
        // SAFETY: published (the Acquire load above) and not given back: the consumer's.
        let p = unsafe { (*slot.push.get()).as_mut() }?;
        Some((slot, p))
    }

    /// Consumer: move past the slot [`Ring::peek`] returned (it stays the consumer's until
    /// [`Ring::give_back`]).
    ///
    /// # Safety
    /// As for [`Ring::peek`].
    #[inline]
    pub(crate) unsafe fn advance(&self) {
        self.head.store(self.head.load(Ordering::Relaxed) + 1, Ordering::Release);
    }

    /// Consumer: move the operation out of the slot [`Ring::peek`] returned, move past it
    /// and give it back.
    ///
    /// # Safety
    /// As for [`Ring::peek`].
    pub(crate) unsafe fn take(&self, slot: &Slot) -> Option<Push> {
        // SAFETY: per the caller's contract, the slot is the consumer's.
        let p = unsafe { (*slot.push.get()).take() };
        // SAFETY: as above.
        unsafe { self.advance() };
        slot.done.store(true, Ordering::Release);
        p
    }
}

impl Slot {
    /// Consumer: hand the slot back to the producer (after [`Ring::advance`]).
    #[inline]
    pub(crate) fn give_back(&self) {
        self.done.store(true, Ordering::Release);
    }
}

