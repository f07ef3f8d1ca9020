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

use std::sync::atomic::{AtomicU64, Ordering};

const SHARED: u64 = u64::MAX;
const BUSY: u64 = 1;

/// The calling thread's id in the owner word (even, never 0; kept in
/// [`crate::this_thread`]).
#[inline]
pub(crate) fn my_id() -> u64 {
    crate::this_thread::solo_id()
}

/// The owner word (see the module documentation).
#[derive(Default)]
pub(crate) struct Solo {
    word: AtomicU64,
}

/// A solo operation in progress on the owner thread; dropping it ends the operation.
pub struct SoloGuard<'a> {
    solo: &'a Solo,
    id: u64,
}

impl Drop for SoloGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.solo.word.store(self.id, Ordering::Release);
    }
}

impl Solo {
    /// Start a solo operation: `Some` when this thread owns (or now claims) solo mode and is
    /// not inside one of its solo operations already. `None` otherwise, after ending another
    /// thread's solo mode as [`Solo::note_pusher`] does: the caller tracks its variables.
    #[inline]
    pub fn enter(&self) -> Option<SoloGuard<'_>> {
        let id = my_id();
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

    /// [`Solo::note_pusher`] for a caller with its id ([`my_id`]) at hand: the owner's push
    /// costs one load, no thread-local and no call.
    #[inline]
    pub fn note_pusher_as(&self, id: u64) {
        let s = self.word.load(Ordering::Relaxed);
        if s != id && s != SHARED {
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
            if waits < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Whether the thread with id `id` ([`my_id`]) owns solo mode and is not inside a solo
    /// operation. Another thread may end solo mode right after: callers rely on this only
    /// for what stays correct either way (the ring's producer, see [`super::ring`]).
    #[inline]
    pub fn is_owner(&self, id: u64) -> bool {
        self.word.load(Ordering::Relaxed) == id
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
        let s = Solo::default();
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
    fn note_pusher_as_claims_keeps_and_ends_solo_mode_as_note_pusher_does() {
        let s = Solo::default();
        let me = my_id();
        s.note_pusher_as(me);
        assert!(s.is_owner(me), "the first pusher claims");
        s.note_pusher_as(me);
        assert!(s.is_owner(me), "the owner's own pushes keep solo mode");
        std::thread::scope(|t| {
            t.spawn(|| s.note_pusher_as(my_id()));
        });
        assert!(s.is_shared(), "another thread's push ends it");
        s.note_pusher_as(me);
        assert!(!s.is_owner(me), "shared for good");
    }

    #[test]
    fn another_pusher_waits_for_the_solo_operation() {
        let s = Arc::new(Solo::default());
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
}
