//! Solo mode: while one thread is the only one that pushes, the operations it runs on the spot
//! skip the variables' dependency tracking.
//!
//! Owns: the engine's owner word and the handshake that ends solo mode.
//!
//! An operation that runs on the pushing thread at once (NaiveEngine, or a threaded engine's
//! cheap operation with nothing pending) only needs its variables' tracking to keep out
//! operations that *other* threads push meanwhile. While no other thread has pushed, there
//! are none: such an operation then takes one compare-and-swap on the owner word instead of
//! two locked updates per variable (acquire and release), and leaves the variables untouched.
//!
//! The word is 0 (no pusher yet), the owner thread's id (even) with bit 0 set while it runs
//! a solo operation, or `SHARED`. The first thread to push claims it. Any other thread, before
//! it pushes anything or waits (for a variable or for all), turns it to `SHARED` for good; if the owner is inside a solo operation
//! it waits for that operation to end (the owner's release store and its compare-and-swap
//! order the operation before everything the new pusher does). From then on every operation
//! is tracked. The owner clears bit 0 with a plain store: only the owner sets it, and no other
//! thread changes the word while it is set.
//!
//! A solo operation must not wait for another thread that pushes: that thread would wait for
//! the operation to end. The operations run here are kernels and C functions called in place;
//! an operation that hands work to another thread (custom operators, asynchronous functions)
//! is pushed, never run solo, so its helper threads only wait for an owner between operations.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARED: u64 = u64::MAX;
const BUSY: u64 = 1;

/// The calling thread's id in the owner word: even, never 0, never reused.
#[inline]
pub(crate) fn my_id() -> u64 {
    thread_local! {
        static ID: Cell<u64> = const { Cell::new(0) };
    }
    ID.with(|id| match id.get() {
        0 => {
            static NEXT: AtomicU64 = AtomicU64::new(1);
            let fresh = NEXT.fetch_add(1, Ordering::Relaxed) << 1;
            id.set(fresh);
            fresh
        }
        known => known,
    })
}

/// The atomic word the protocol runs on: std's, or loom's in the model-checked tests.
pub(crate) trait Word {
    fn zero() -> Self;
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64>;
    /// Wait a moment for the owner's solo operation (`waits` times so far).
    fn pause(waits: u32);
}

impl Word for AtomicU64 {
    fn zero() -> Self {
        AtomicU64::new(0)
    }
    #[inline(always)]
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    #[inline(always)]
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order)
    }
    #[inline(always)]
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64> {
        AtomicU64::compare_exchange(self, current, new, success, failure)
    }
    fn pause(waits: u32) {
        if waits < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The owner word (see the module documentation).
pub(crate) struct Solo<W: Word = AtomicU64> {
    word: W,
}

impl<W: Word> Default for Solo<W> {
    fn default() -> Self {
        Solo { word: W::zero() }
    }
}

/// A solo operation in progress on the owner thread; dropping it ends the operation.
pub struct SoloGuard<'a, W: Word = AtomicU64> {
    solo: &'a Solo<W>,
    id: u64,
}

impl<W: Word> Drop for SoloGuard<'_, W> {
    #[inline]
    fn drop(&mut self) {
        self.solo.word.store(self.id, Ordering::Release);
    }
}

impl<W: Word> Solo<W> {
    /// Start a solo operation: `Some` when this thread owns (or now claims) solo mode and is
    /// not inside one of its solo operations already. `None` otherwise, after ending another
    /// thread's solo mode as [`Solo::note_pusher`] does: the caller tracks its variables.
    #[inline]
    pub fn enter(&self) -> Option<SoloGuard<'_, W>> {
        self.enter_as(my_id())
    }

    /// [`Solo::enter`] for the thread whose id is `id`.
    #[inline]
    fn enter_as(&self, id: u64) -> Option<SoloGuard<'_, W>> {
        let s = self.word.load(Ordering::Relaxed);
        if (s == id || s == 0) && self.word.compare_exchange(s, id | BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            return Some(SoloGuard { solo: self, id });
        }
        self.note(id);
        None
    }

    /// Called before this thread pushes an operation that is tracked: claims solo mode for
    /// this thread if nobody pushed yet, ends another thread's (waiting for its solo
    /// operation, if one runs).
    #[inline]
    pub fn note_pusher(&self) {
        if self.word.load(Ordering::Relaxed) != SHARED {
            self.note_pusher_as(my_id());
        }
    }

    /// [`Solo::note_pusher`] for the thread whose id is `id`.
    #[inline]
    fn note_pusher_as(&self, id: u64) {
        let s = self.word.load(Ordering::Relaxed);
        if s != SHARED && s != id {
            self.note(id);
        }
    }

    #[cold]
    fn note(&self, id: u64) {
        let mut waits = 0u32;
        loop {
            let s = self.word.load(Ordering::Acquire);
            if s == SHARED || s & !BUSY == id {
                return;
            }
            let to = if s == 0 { id } else { SHARED };
            if s & BUSY == 0 {
                if self.word.compare_exchange(s, to, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return;
                }
                continue;
            }
            waits = waits.saturating_add(1);
            W::pause(waits);
        }
    }

    /// Whether solo mode has ended.
    #[cfg(test)]
    pub fn is_shared(&self) -> bool {
        self.word.load(Ordering::Acquire) == SHARED
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn the_first_pusher_owns_until_another_pushes() {
        let s: Solo = Solo::default();
        let g = s.enter().expect("the first thread claims");
        assert!(s.enter().is_none(), "nested: tracked, no second guard");
        drop(g);
        assert!(s.enter().is_some());
        s.note_pusher();
        assert!(!s.is_shared(), "the owner's own tracked pushes keep solo mode");
        std::thread::scope(|t| {
            t.spawn(|| assert!(s.enter().is_none()));
        });
        assert!(s.is_shared());
        assert!(s.enter().is_none(), "shared for good");
    }

    #[test]
    fn note_pusher_claims_keeps_and_ends_solo_mode() {
        let s: Solo = Solo::default();
        s.note_pusher();
        assert_eq!(s.word.load(Ordering::SeqCst), my_id(), "the first pusher claims");
        s.note_pusher();
        assert_eq!(s.word.load(Ordering::SeqCst), my_id(), "the owner's own pushes keep solo mode");
        std::thread::scope(|t| {
            t.spawn(|| s.note_pusher());
        });
        assert!(s.is_shared(), "another thread's push ends it");
        s.note_pusher();
        assert!(s.enter().is_none(), "shared for good");
    }

    #[test]
    fn another_pusher_waits_for_the_solo_operation() {
        let s: Arc<Solo> = Arc::new(Solo::default());
        let running = Arc::new(AtomicBool::new(false));
        let g = s.enter().unwrap();
        running.store(true, Ordering::SeqCst);
        let (s2, r2) = (s.clone(), running.clone());
        let other = std::thread::spawn(move || {
            s2.note_pusher();
            // Solo mode ended only after the owner's operation did.
            assert!(!r2.load(Ordering::SeqCst));
            assert!(s2.is_shared());
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!s.is_shared(), "must not end while the operation runs");
        running.store(false, Ordering::SeqCst);
        drop(g);
        other.join().unwrap();
    }

    /// Model-checked (loom: every interleaving and every outcome the memory orderings allow)
    /// runs of the protocol between the owner and a second thread.
    mod model {
        use super::super::*;
        use loom::cell::UnsafeCell;
        use loom::sync::Arc;

        impl Word for loom::sync::atomic::AtomicU64 {
            fn zero() -> Self {
                loom::sync::atomic::AtomicU64::new(0)
            }
            fn load(&self, order: Ordering) -> u64 {
                loom::sync::atomic::AtomicU64::load(self, order)
            }
            fn store(&self, value: u64, order: Ordering) {
                loom::sync::atomic::AtomicU64::store(self, value, order)
            }
            fn compare_exchange(&self, current: u64, new: u64, s: Ordering, f: Ordering) -> Result<u64, u64> {
                loom::sync::atomic::AtomicU64::compare_exchange(self, current, new, s, f)
            }
            fn pause(_: u32) {
                loom::thread::yield_now();
            }
        }

        type LoomSolo = Solo<loom::sync::atomic::AtomicU64>;
        const A: u64 = 2;
        const B: u64 = 4;

        /// What the variables' tracking would protect: data a solo operation touches without
        /// it, and a tracked operation of the other thread touches after its push noted it.
        /// loom fails the run if the two accesses can race.
        struct Data(UnsafeCell<u64>);
        // SAFETY: accesses go through loom's cell, which checks them.
        unsafe impl Sync for Data {}

        fn touch(d: &Data) {
            d.0.with_mut(|p| {
                // SAFETY: loom checks this access against every other (the point of the test).
                unsafe { *p += 1 }
            });
        }

        /// A runs solo operations while B starts pushing: whatever the interleaving, no solo
        /// operation overlaps what B does after `note_pusher` returned (loom's cell checks
        /// the two accesses), and solo mode ends for good.
        #[test]
        fn a_solo_operation_never_overlaps_the_second_pushers_work() {
            loom::model(|| {
                let solo = Arc::new(LoomSolo::default());
                let data = Arc::new(Data(UnsafeCell::new(0)));
                let (s, d) = (solo.clone(), data.clone());
                let owner = loom::thread::spawn(move || {
                    let mut solo_runs = 0;
                    for _ in 0..2 {
                        if let Some(g) = s.enter_as(A) {
                            touch(&d);
                            drop(g);
                            solo_runs += 1;
                        }
                    }
                    solo_runs
                });
                solo.note_pusher_as(B);
                touch(&data);
                let solo_runs = owner.join().unwrap();
                assert!(solo_runs <= 2);
                // Whoever came second ended solo mode for good.
                assert!(solo.is_shared());
                assert!(solo.enter_as(A).is_none() && solo.enter_as(B).is_none());
            });
        }

        /// Both threads try to enter at once: at most one claims solo mode; the other's
        /// operation is tracked, and runs only once no solo operation can still run.
        #[test]
        fn two_first_pushers_claim_it_at_most_once() {
            loom::model(|| {
                let solo = Arc::new(LoomSolo::default());
                let data = Arc::new(Data(UnsafeCell::new(0)));
                let (s, d) = (solo.clone(), data.clone());
                let a = loom::thread::spawn(move || match s.enter_as(A) {
                    Some(g) => {
                        touch(&d);
                        drop(g);
                        true
                    }
                    None => {
                        touch(&d);
                        false
                    }
                });
                let b_solo = match solo.enter_as(B) {
                    Some(g) => {
                        touch(&data);
                        drop(g);
                        true
                    }
                    None => {
                        touch(&data);
                        false
                    }
                };
                let a_solo = a.join().unwrap();
                assert!(!(a_solo && b_solo), "both ran solo");
                assert!(solo.is_shared(), "the second pusher ended solo mode");
            });
        }
    }
}
