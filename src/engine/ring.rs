//! The owner's submission ring: pushes of the one thread that pushes (solo mode, see
//! [`super::solo`]) to the CPU worker pool of a threaded engine, without a locked instruction
//! and without allocating.
//!
//! Owns: a single-producer ring of slots, two to a cache line, that hold the pushed operation
//! (a compact record of a plain C function in the slot itself, see [`Slot`], with what does
//! not fit in the slot's [`Extra`]; else a whole [`Push`] in the slot's entry of `pushes`),
//! the index the producer publishes, the consumer's index, and each slot's way back to the
//! producer (a `done` lap mark, kept apart from the slots).
//!
//! Protocol:
//! - The producer (the solo owner) writes a free slot and publishes it by storing the new
//!   `tail` (Release, counting it pushed) and then the slot's lap mark (Release), which is
//!   what the consumer polls: the `tail` line is not read on the hot path, so it stays
//!   with the producer and only the slots' lines travel. A slot is free when it was
//!   never used, or when it was given back by the consumer (its `done` entry set to the
//!   slot's lap mark, Release) and then emptied by a reclaimer, which writes neither the
//!   slot nor `done`.
//! - The consumer is whichever worker holds the engine's registration lock; it takes slots
//!   in order (`head`). It either runs the operation on the spot, having taken all of its
//!   variables at once, and sets `done` after it finished; or it moves the operation out into
//!   an ordinary registered operation (a compact record's variables are cloned into it and
//!   stay in the slot) and sets `done` at once.
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
//!
//! Why half a line per slot: each cache line the producer writes and the consumer reads
//! crosses between their cores twice (to the consumer, and back when the producer writes it
//! again a lap later), and those transfers, not the instructions, are most of what a push
//! costs the pushing thread. Two slots to a line halve them for the pushes that fit a slot
//! (one variable, no deleter: see [`Slot`]).

use super::opr::{CDeleter, CFn};
use super::{Push, RawFn, Var, VarList};
use crate::context::{Context, DevType};
use crate::sync::{Mutex, Padded};
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// Slots in a ring: operations the owner may have published and not yet got back.
pub(crate) const SLOTS: usize = 2048;

/// How far behind the newest slot the producer empties slots: far enough that the workers
/// are done with their cache lines (emptying the one a worker just gave back would take its
/// lines while it still works next to them), near enough that data the caller freed goes
/// soon.
const RECLAIM_LAG: usize = 128;

/// How long a producer that finds the ring full waits for the consumer before it pushes
/// the ordinary way (see [`Ring::make_room`]).
const FULL_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// Pushes between two of the producer's reclaims (see the protocol above).
const RECLAIM_BATCH: usize = 32;

/// Variables a compact record holds (its reads, then its writes).
pub(crate) const COMPACT_VARS: usize = 3;

/// [`Slot::kind`]: the slot holds a compact record (else a whole `Push`, in `pushes`).
const COMPACT: u8 = 1;
/// [`Slot::kind`]: the compact record's deleter is in the slot's [`Extra`].
const DELETER: u8 = 2;

/// One pushed operation, on half a cache line. A compact record (a synchronous C function on
/// a CPU context, of normal property and priority, with no name and at most
/// [`COMPACT_VARS`] variables: what `MXEnginePushSync` usually pushes) lives here; with one
/// variable and no deleter (the usual case) it fits here entirely, so that a push writes,
/// and the consumer reads, half a line. Its deleter, and its variables when it has more
/// than one, are in the slot's [`Extra`]. Any other push is a whole [`Push`] in the slot's
/// entry of `pushes`.
#[repr(C, align(32))]
pub(crate) struct Slot {
    /// Which lap of the ring the slot was last published in ([`lap_mark`]): the consumer
    /// polls this byte, in the line it reads next anyway, instead of `tail`, so that the
    /// producer's `tail` line stays with the producer.
    lap: AtomicU8,
    /// [`COMPACT`] and [`DELETER`] bits.
    kind: UnsafeCell<u8>,
    /// Of the compact record's variables, how many are read (the first ones) and how many in
    /// all.
    n_const: UnsafeCell<u8>,
    n_vars: UnsafeCell<u8>,
    /// The compact record's CPU device.
    dev_id: UnsafeCell<i32>,
    /// The compact record's function and param (Copy: the consumer reads them, never moves
    /// them; the function the record owns is made from them once, when it is taken).
    f: UnsafeCell<MaybeUninit<CFn>>,
    param: UnsafeCell<*mut c_void>,
    /// The compact record's variable when it has one, dropped by a reclaimer.
    var: UnsafeCell<MaybeUninit<Arc<Var>>>,
}

// A compact record of one variable fills half a line and no more.
const _: () = assert!(std::mem::size_of::<Slot>() == 32);

/// What a compact record holds beyond its slot: its deleter, and its variables when it has
/// more than one (`n_vars` of them initialised, dropped by a reclaimer). Apart from the
/// slots: written only by pushes that need it.
#[repr(C, align(32))]
struct Extra {
    deleter: UnsafeCell<Option<CDeleter>>,
    vars: UnsafeCell<[MaybeUninit<Arc<Var>>; COMPACT_VARS]>,
}

/// What the consumer finds in a slot.
pub(crate) enum Rec<'a> {
    Full(&'a mut Push),
    /// A compact record's context and variables (they stay in the slot).
    Compact {
        ctx: Context,
        reads: &'a [Arc<Var>],
        writes: &'a [Arc<Var>],
    },
}

pub(crate) struct Ring {
    /// Per slot: the lap mark ([`lap_mark`]) of the slot's last give-back. A slot whose entry
    /// is its current lap's mark is given back: the consumer is done with it, a reclaimer may
    /// drop what it holds (and the producer then reuse it). Apart from the slots, 64 entries
    /// to a cache line: for a compact record the consumer writes only here, never to the
    /// slot, so the slot's line goes from the producer to the consumer and back without the
    /// consumer taking it over (a whole `Push` is still written: its function and payload are
    /// moved out, from `pushes`). Only the consumer writes these lines; a reclaimer reads
    /// them once per batch (a mark needs no clearing: the next lap expects another). Ring and
    /// slots are never dropped (engines live for the process); a dropped ring would leak its
    /// unconsumed compact records.
    done: Box<[AtomicU8]>,
    /// The CPU has PREFETCHW (see [`prefetch_write`]).
    prefetchw: bool,
    /// Slots published (written by the producer only).
    tail: Padded<AtomicUsize>,
    /// Slots taken by the consumer (written under the registration lock only).
    head: Padded<AtomicUsize>,
    /// Slots given back and emptied (written under `reclaim`).
    reclaimed: Padded<AtomicUsize>,
    reclaim: Mutex<()>,
    slots: Box<[Slot]>,
    /// Per slot: what a compact record holds beyond the slot.
    extras: Box<[Extra]>,
    /// Per slot: a whole push (a slot whose kind is not [`COMPACT`]).
    pushes: Box<[UnsafeCell<Option<Push>>]>,
}

// SAFETY: a slot's contents (its `Slot`, `Extra` and `pushes` entry) are reached by one thread
// at a time: the producer from the `reclaimed` store past its previous use (Acquire) to the
// publishing lap-mark store, the consumer from there to its `done` store, a reclaimer (one at
// a time: the reclaim lock) from `done` (Acquire) to the `reclaimed` store past it (Release).
// The consumer is one thread at a time (callers of the consumer side hold the engine's
// registration lock).
unsafe impl Sync for Ring {}
// SAFETY: as above; what the slots hold (`Push`, C function pointers and params the C API
// lets run on any thread, `Arc<Var>`) is `Send`.
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
            done: (0..n).map(|_| AtomicU8::new(0)).collect(),
            prefetchw: has_prefetchw(),
            slots: (0..n)
                .map(|_| Slot {
                    lap: AtomicU8::new(0),
                    kind: UnsafeCell::new(0),
                    n_const: UnsafeCell::new(0),
                    n_vars: UnsafeCell::new(0),
                    dev_id: UnsafeCell::new(0),
                    f: UnsafeCell::new(MaybeUninit::uninit()),
                    param: UnsafeCell::new(std::ptr::null_mut()),
                    var: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            extras: (0..n)
                .map(|_| Extra {
                    deleter: UnsafeCell::new(None),
                    vars: UnsafeCell::new([const { MaybeUninit::uninit() }; COMPACT_VARS]),
                })
                .collect(),
            pushes: (0..n).map(|_| UnsafeCell::new(None)).collect(),
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
        !self.slots.is_empty() && self.is_published(self.head.load(Ordering::Acquire))
    }

    /// Whether slot index `i` (not yet taken) has been published: its lap mark is this lap's.
    /// Acquire: what the producer wrote into the slot, and `tail` past it, are visible then.
    #[inline]
    fn is_published(&self, i: usize) -> bool {
        self.slots[i % SLOTS].lap.load(Ordering::Acquire) == lap_mark(i)
    }

    /// Producer: publish `slot` (index `t`), which it has just written: `tail` first, so that
    /// an operation is counted pushed before a consumer can see it (and count it finished),
    /// then the slot's lap mark, which is what consumers poll.
    #[inline]
    fn publish_slot(&self, slot: &Slot, t: usize) {
        self.tail.store(t + 1, Ordering::Release);
        slot.lap.store(lap_mark(t), Ordering::Release);
    }

    /// Producer: publish `p`, or give it back when the ring is full.
    ///
    /// # Safety
    /// Called only by the solo owner (one thread, for the life of the ring), on a ring with
    /// slots.
    #[inline]
    #[allow(clippy::result_large_err)] // the push itself comes back, to go the general way
    pub(crate) unsafe fn publish(&self, p: Push) -> Result<(), Push> {
        let Some(t) = self.claim() else {
            return Err(p);
        };
        let slot = &self.slots[t % SLOTS];
        // SAFETY: the slot is the producer's: never published, or reclaimed (`claim`), which
        // left its `pushes` entry empty (a reclaimed compact record's fields are stale:
        // overwritten).
        unsafe {
            *slot.kind.get() = 0;
            *self.pushes[t % SLOTS].get() = Some(p);
        }
        self.publish_slot(slot, t);
        Ok(())
    }

    /// Producer: publish a compact record (see [`Slot`]) on the CPU context `ctx` whose `n`
    /// variables (`n_const` reads first, then writes) `var(i)` gives straight into the slot
    /// (or its [`Extra`]), without a list in between. Once all are there, `check(reads,
    /// writes)` accepts them and `raw()` makes the function, whose parts the slot keeps. A
    /// failure of `var` or `check` drops the variables written so far and comes back as
    /// `Some(Err)`, the slot left unpublished; `None` means the ring is full (nothing was
    /// looked up). A panic in `var` or `check` leaks the
    /// references written so far (the slot is overwritten at its next publication), nothing
    /// worse.
    ///
    /// # Safety
    /// As for [`Ring::publish`]; `n_const <= n <= COMPACT_VARS`; `ctx` is a CPU context (the
    /// record keeps its device id only).
    #[inline]
    pub(crate) unsafe fn publish_compact_with<E>(
        &self,
        ctx: Context,
        n_const: usize,
        n: usize,
        mut var: impl FnMut(usize) -> Result<Arc<Var>, E>,
        check: impl FnOnce(&[Arc<Var>], &[Arc<Var>]) -> Result<(), E>,
        raw: impl FnOnce() -> RawFn,
    ) -> Option<Result<(), E>> {
        debug_assert!(n_const <= n && n <= COMPACT_VARS && ctx.dev_type == DevType::Cpu);
        let t = self.claim()?;
        let slot = &self.slots[t % SLOTS];
        // SAFETY: the slot (with its `Extra`) is the producer's (`claim`) and stays
        // unpublished until the lap-mark store: a reclaimed slot's variables hold nothing
        // (dropped; the stale bits stay), so writing over them leaks nothing, and on failure
        // the variables written here are dropped here, once (the slot's stale fields are
        // overwritten by its next publication, as after any reclaim).
        unsafe {
            let dst = self.var_cells(t % SLOTS, n);
            for i in 0..n {
                match var(i) {
                    Ok(v) => {
                        dst[i].write(v);
                    }
                    Err(e) => {
                        drop_written(&mut dst[..i]);
                        return Some(Err(e));
                    }
                }
            }
            // The record's fields, so that the check sees the slot's own slices (nothing
            // reads them before the publication, which a failure skips).
            *slot.n_const.get() = n_const as u8;
            *slot.n_vars.get() = n as u8;
            *slot.dev_id.get() = ctx.dev_id;
            let (_, reads, writes) = self.compact_parts(t % SLOTS);
            if let Err(e) = check(reads, writes) {
                drop_written(self.var_cells(t % SLOTS, n));
                return Some(Err(e));
            }
            let (f, param, deleter) = raw().into_parts();
            (*slot.f.get()).write(f);
            *slot.param.get() = param;
            *slot.kind.get() = match deleter {
                None => COMPACT,
                Some(d) => {
                    *self.extras[t % SLOTS].deleter.get() = Some(d);
                    COMPACT | DELETER
                }
            };
        }
        self.publish_slot(slot, t);
        Some(Ok(()))
    }

    /// The cells of slot `s`'s compact record's `n` variables: the slot's own for one, its
    /// [`Extra`]'s for more.
    ///
    /// # Safety
    /// The caller may write slot `s` (its producer before publishing it, its reclaimer), and
    /// holds no other reference into these cells.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    unsafe fn var_cells(&self, s: usize, n: usize) -> &mut [MaybeUninit<Arc<Var>>] {
        // SAFETY: per the caller's contract; `first_var` points to at least `n` cells.
        unsafe { std::slice::from_raw_parts_mut(self.first_var(s, n), n) }
    }

    /// Where slot `s`'s compact record of `n` variables keeps the first: the slot's own cell
    /// for one (or none), its [`Extra`]'s array for more.
    #[inline(always)]
    fn first_var(&self, s: usize, n: usize) -> *mut MaybeUninit<Arc<Var>> {
        if n <= 1 {
            self.slots[s].var.get()
        } else {
            self.extras[s].vars.get().cast()
        }
    }

    /// Slot `s`'s compact record's context, reads and writes.
    ///
    /// # Safety
    /// The caller may read slot `s` (its producer before publishing it, its consumer or
    /// reclaimer), which holds a compact record, or is being written as one with its
    /// variables and counts in place.
    #[inline]
    unsafe fn compact_parts(&self, s: usize) -> (Context, &[Arc<Var>], &[Arc<Var>]) {
        let slot = &self.slots[s];
        // SAFETY: per the caller's contract; the first `n_vars` variables are initialised,
        // and `MaybeUninit<T>` has `T`'s layout.
        unsafe {
            let (nc, n) = (*slot.n_const.get() as usize, *slot.n_vars.get() as usize);
            let (reads, writes) = std::slice::from_raw_parts(self.first_var(s, n) as *const Arc<Var>, n).split_at(nc);
            (Context { dev_type: DevType::Cpu, dev_id: *slot.dev_id.get() }, reads, writes)
        }
    }

    /// Producer: the next slot's index if that slot is free, reclaiming first (every
    /// [`RECLAIM_BATCH`] pushes, and when the slot is still busy).
    #[inline]
    fn claim(&self) -> Option<usize> {
        let t = self.tail.load(Ordering::Relaxed);
        if t % RECLAIM_BATCH == 0 && t >= RECLAIM_LAG {
            self.reclaim_upto(t - RECLAIM_LAG, false);
        }
        if t >= SLOTS && self.reclaimed.load(Ordering::Acquire) <= t - SLOTS {
            // The slot's previous operation is not back yet, or not emptied: empty what is
            // back, once more.
            self.reclaim_upto(t, false);
            if self.reclaimed.load(Ordering::Acquire) <= t - SLOTS && !self.make_room(t) {
                return None;
            }
        }
        // The slots a few lines on: their line is probably shared with the consumer, which
        // read it a ring ago; ask for it now, so that the stores that publish them do not
        // wait (x86 commits stores in order: one waiting store holds up all later ones).
        if t % 2 == 0 {
            self.prefetch_slot(t + PREFETCH_AHEAD);
        }
        Some(t)
    }

    /// Producer, with the ring full at slot index `t`: give the consumer a moment to catch
    /// up, yielding this thread's CPU (which the consumer may be waiting for: a worker woken
    /// by this thread is often placed on its CPU until the scheduler moves one of them),
    /// reclaiming as slots come back. Whether `t`'s slot is free now; after [`FULL_WAIT`]
    /// the caller gives up (the push goes the ordinary way: a consumer busy with a long
    /// operation, or one waiting for this thread, holds the ring up for no longer).
    #[cold]
    #[inline(never)]
    fn make_room(&self, t: usize) -> bool {
        let start = std::time::Instant::now();
        loop {
            std::thread::yield_now();
            self.reclaim_upto(t, false);
            if self.reclaimed.load(Ordering::Acquire) > t - SLOTS {
                return true;
            }
            if start.elapsed() > FULL_WAIT {
                return false;
            }
        }
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
            if !self.is_given_back(r) {
                break;
            }
            // SAFETY: given back (Acquire) and not reclaimed: the reclaimer's, and this
            // thread holds the reclaim lock; `reclaimed` moves past it right after.
            unsafe { self.release(r % SLOTS) };
            r += 1;
        }
        self.reclaimed.store(r, Ordering::Release);
        if wait {
            // Behind an operation still running, empty the slots given back without moving
            // `reclaimed` past it (the slots stay given back, empty): a long operation does
            // not keep what later, finished ones held.
            for i in r + 1..upto {
                if self.is_given_back(i) {
                    // SAFETY: as above (given back, not reclaimed, the reclaim lock held).
                    unsafe { self.empty(i % SLOTS) };
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

    /// Consumer: the next published slot's index and operation, if any.
    ///
    /// # Safety
    /// The caller holds the engine's registration lock, and finishes with the slot (through
    /// [`Ring::take`] or [`Ring::give_back`]) before it takes another.
    #[inline]
    pub(crate) unsafe fn peek(&self) -> Option<(usize, Rec<'_>)> {
        // SAFETY: per the caller's contract.
        unsafe { self.peek_below(usize::MAX) }
    }

    /// Consumer: [`Ring::peek`], for a slot below `mark` only. A finite `mark` is a value of
    /// [`Ring::published`] that reached the caller from the thread that read it (through the
    /// submission queue): the slots below it are published, and their contents visible here
    /// through that chain, even where the producer has stored `tail` but not yet the slot's
    /// lap mark; only an open-ended peek looks at the lap mark.
    ///
    /// # Safety
    /// As for [`Ring::peek`]; a finite `mark` as described.
    #[inline]
    pub(crate) unsafe fn peek_below(&self, mark: usize) -> Option<(usize, Rec<'_>)> {
        let h = self.head.load(Ordering::Relaxed);
        if h >= mark || (mark == usize::MAX && !self.is_published(h)) {
            return None;
        }
        let s = h % SLOTS;
        // SAFETY: published (the Acquire load of its lap mark, or of `tail` by the thread
        // that took `mark`) and not given back: the consumer's.
        unsafe {
            if *self.slots[s].kind.get() & COMPACT != 0 {
                let (ctx, reads, writes) = self.compact_parts(s);
                return Some((h, Rec::Compact { ctx, reads, writes }));
            }
            let p = (*self.pushes[s].get()).as_mut()?;
            Some((h, Rec::Full(p)))
        }
    }

    /// Consumer: the function of the compact record at index `i`, which [`Ring::peek`]
    /// returned (its variables stay, for a reclaimer).
    ///
    /// # Safety
    /// As for [`Ring::peek`], for a compact record, once: the function made here owns the
    /// record's deleter.
    #[inline]
    pub(crate) unsafe fn take_raw(&self, i: usize) -> RawFn {
        let (slot, s) = (&self.slots[i % SLOTS], i % SLOTS);
        // SAFETY: per the caller's contract, the slot is the consumer's and holds a compact
        // record, whose function and param `publish_compact_with` wrote (and its deleter,
        // with the `DELETER` bit), callable once from any thread as `RawFn::new` requires:
        // this is that once.
        unsafe {
            let deleter = if *slot.kind.get() & DELETER != 0 { *self.extras[s].deleter.get() } else { None };
            RawFn::new((*slot.f.get()).assume_init(), *slot.param.get(), deleter)
        }
    }

    /// Consumer: move past the slot [`Ring::peek`] returned (it stays the consumer's until
    /// [`Ring::give_back`]).
    ///
    /// # Safety
    /// As for [`Ring::peek`].
    #[inline]
    pub(crate) unsafe fn advance(&self) -> usize {
        let h = self.head.load(Ordering::Relaxed);
        self.head.store(h + 1, Ordering::Release);
        h
    }

    /// Consumer: move the operation out of the slot at index `i`, which [`Ring::peek`]
    /// returned, move past it and give it back.
    ///
    /// # Safety
    /// As for [`Ring::peek`].
    pub(crate) unsafe fn take(&self, i: usize) -> Option<Push> {
        let s = i % SLOTS;
        // SAFETY: per the caller's contract, the slot is the consumer's.
        let p = unsafe {
            if *self.slots[s].kind.get() & COMPACT != 0 {
                // As an ordinary push: the variables are shared with the slot (which keeps
                // its references for a reclaimer); the function is made here, once.
                let (ctx, reads, writes) = self.compact_parts(s);
                let (const_vars, mutable_vars): (VarList, VarList) =
                    (reads.iter().cloned().collect(), writes.iter().cloned().collect());
                Some(Push::raw(self.take_raw(i), const_vars, mutable_vars, ctx))
            } else {
                (*self.pushes[s].get()).take()
            }
        };
        // SAFETY: as above.
        let i = unsafe { self.advance() };
        self.give_back(i);
        p
    }
}

impl Ring {
    /// Consumer: hand slot index `i` back to the producer (after [`Ring::advance`]).
    #[inline]
    pub(crate) fn give_back(&self, i: usize) {
        self.done[i % SLOTS].store(lap_mark(i), Ordering::Release);
    }

    /// Whether slot index `i` (published, not reclaimed) has been given back. Acquire: what
    /// the consumer did with the slot is visible then.
    #[inline]
    fn is_given_back(&self, i: usize) -> bool {
        self.done[i % SLOTS].load(Ordering::Acquire) == lap_mark(i)
    }

    /// Prefetch slot `i`'s line for writing.
    #[inline(always)]
    fn prefetch_slot(&self, i: usize) {
        if self.prefetchw {
            prefetch_write(&self.slots[i % SLOTS] as *const Slot as *const u8);
        }
    }

    /// Reclaimer: drop what given-back slot `s` holds, right before `reclaimed` moves past
    /// it, without writing to the slot (its line stays shared with the consumer, and the
    /// producer's stores that publish it next are the only ones): a compact record's fields
    /// stay as they were, stale, until the producer overwrites them. A slot
    /// [`Ring::empty`] emptied already holds nothing.
    ///
    /// # Safety
    /// The caller is the slot's reclaimer (given back, not reclaimed, the reclaim lock held)
    /// and, before it releases the lock, moves `reclaimed` past it or marks it empty (as
    /// [`Ring::empty`] does).
    #[inline]
    unsafe fn release(&self, s: usize) {
        // SAFETY: per the caller's contract. A compact record's function was taken by the
        // consumer; its variables are dropped here, once: the slot is not looked at again
        // before the producer writes it.
        unsafe {
            if *self.slots[s].kind.get() & COMPACT != 0 {
                let n = *self.slots[s].n_vars.get() as usize;
                for v in self.var_cells(s, n) {
                    v.assume_init_drop();
                }
            } else if (*self.pushes[s].get()).is_some() {
                drop((*self.pushes[s].get()).take());
            }
        }
    }

    /// Reclaimer: drop what given-back slot `s` holds, behind a slot still in use
    /// (`reclaimed` does not move past it yet): marked empty, so that [`Ring::release`]
    /// finds nothing.
    ///
    /// # Safety
    /// The caller is the slot's reclaimer (given back, not reclaimed, the reclaim lock held).
    unsafe fn empty(&self, s: usize) {
        // SAFETY: per the caller's contract; `release` drops a compact record's variables
        // once, and clearing its kind keeps a later `release` from dropping them again (the
        // whole push's entry is empty then).
        unsafe {
            self.release(s);
            *self.slots[s].kind.get() = 0;
        }
    }
}

/// Drop the variables a failed [`Ring::publish_compact_with`] wrote into a slot.
///
/// # Safety
/// Every element is initialised and not dropped or moved out elsewhere.
unsafe fn drop_written(vars: &mut [MaybeUninit<Arc<Var>>]) {
    for v in vars {
        // SAFETY: per this function's contract.
        unsafe { v.assume_init_drop() };
    }
}

/// The lap mark of slot index `i`: 1 + the lap number, modulo 256 (0 is "never published").
/// The producer is at most one lap ahead of the consumer, so the mark the consumer (the
/// registration lock's holder, with the current `head`) finds in a slot is either the one it
/// expects or the previous lap's, never another that matches. A thread without the lock may
/// read a stale `head` in [`Ring::has_records`] and get a wrong answer either way; that only
/// makes it look again or leave the slot to the consumer, which is awake (it moved `head`).
#[inline(always)]
fn lap_mark(i: usize) -> u8 {
    ((i / SLOTS) as u8).wrapping_add(1)
}

/// Slots between the one being published and the one prefetched for writing (a multiple of
/// the two slots to a line).
const PREFETCH_AHEAD: usize = 16;

fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0x8000_0001, ECX bit 8: PREFETCHW (Linux calls it 3dnowprefetch).
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86-64 CPU; the extended leaf is checked first.
        unsafe {
            use std::arch::x86_64::__cpuid;
            __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// PREFETCHW: fetch the line at `p` in a state that a store can write without waiting.
/// Only where the CPU has it ([`has_prefetchw`]); it never faults and changes no memory.
#[inline(always)]
fn prefetch_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault; the instruction
    // exists on this CPU (the caller checked `has_prefetchw`).
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot looks published exactly from its publishing on, lap after lap, past the wrap of
    /// the one-byte lap marks (256 laps): never before (a stale mark that matches), always
    /// after.
    #[test]
    fn lap_marks_show_exactly_the_published_slots_past_256_laps() {
        let ring = Ring::new(true);
        for i in 0..258 * SLOTS + 3 {
            assert!(!ring.has_records(), "slot index {i} looks published before it is");
            // SAFETY: this thread is the ring's only producer and only consumer, and finishes
            // with each slot (`take`) before it looks at the next.
            unsafe {
                assert!(ring.publish(Push::sync(|_| Ok(()), vec![], vec![])).is_ok(), "no room at slot index {i}");
                assert!(ring.has_records(), "slot index {i} does not look published");
                let (at, _) = ring.peek().expect("a published slot");
                assert_eq!(at, i, "the slot index peeked");
                assert!(ring.take(at).is_some(), "slot index {i} held no operation");
            }
        }
        assert_eq!(ring.published(), 258 * SLOTS + 3);
    }

    unsafe extern "C" fn nothing(_: *mut std::ffi::c_void, _: *mut std::ffi::c_void) {}

    /// Compact records' variable references are dropped exactly once, lap after lap: in order
    /// by the producer's batches (which write nothing to the slot), and behind a slot still
    /// in use by a waiting thread's reclaim (which empties slots it cannot move past); a
    /// reclaimed slot's stale fields are neither dropped again nor taken for a record.
    #[test]
    fn compact_records_drop_their_variables_exactly_once() {
        let ring = Ring::new(true);
        let (a, b) = (Var::new(), Var::new());
        let compact = |vars: [&Arc<Var>; 2]| {
            let raw = || unsafe { RawFn::new(nothing, std::ptr::null_mut(), None) };
            // SAFETY: an empty C function without param or deleter; the test is the ring's
            // only producer.
            unsafe {
                ring.publish_compact_with(Context::CPU, 1, 2, |i| Ok::<_, ()>(vars[i].clone()), |_, _| Ok(()), raw)
            }
            .ok_or("the ring is full")
        };
        let mut held = None;
        for i in 0..3 * SLOTS {
            if i % 7 == 3 {
                assert!(unsafe { ring.publish(Push::sync(|_| Ok(()), vec![b.clone()], vec![])) }.is_ok());
            } else {
                compact([&a, &b]).unwrap().unwrap();
            }
            // SAFETY: the test is the only consumer and finishes with each slot before the
            // next (the held one is finished below, before it peeks again after a wait).
            unsafe {
                let (at, rec) = ring.peek().expect("published");
                match rec {
                    Rec::Compact { reads, writes, .. } => {
                        assert!(i % 7 != 3, "slot index {i}: a whole push read as a compact record");
                        assert_eq!((reads.len(), writes.len()), (1, 1), "slot index {i}: a stale or torn record");
                        drop(ring.take_raw(at));
                        let index = ring.advance();
                        // Every 500th slot (when it holds a compact record) stays in use
                        // over the next ten pushes, which a wait's reclaim empties behind it.
                        if i % 500 == 0 {
                            held = Some(index);
                        } else {
                            ring.give_back(index);
                        }
                    }
                    Rec::Full(_) => {
                        assert!(i % 7 == 3, "slot index {i}: a compact record read as a whole push");
                        assert!(ring.take(at).is_some());
                    }
                }
            }
            if let Some(h) = held {
                if i == h + 10 {
                    ring.reclaim_all();
                    // The ten behind the held slot are emptied; the held one still holds
                    // its reference to `a` (the test's own is the other).
                    assert_eq!(Arc::strong_count(&a), 2, "at slot index {i}");
                    ring.give_back(h);
                    held = None;
                }
            }
        }
        ring.reclaim_all();
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 1), "every reference dropped, once");
    }

    /// Compact records of every shape (no variable, one read or one write in the slot alone,
    /// several in its `Extra`; with and without a deleter) come back with their own parts, lap
    /// after lap, next to each other on shared lines: the right variables, function, param
    /// and deleter, which runs once; every reference is dropped once.
    #[test]
    fn compact_records_of_every_shape_come_back_whole() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        unsafe extern "C" fn deleted(_: *mut std::ffi::c_void) {
            DELETED.fetch_add(1, Ordering::SeqCst);
        }
        let ring = Ring::new(true);
        let vars: Vec<Arc<Var>> = (0..5).map(|_| Var::new()).collect();
        // (reads, variables in all, with a deleter)
        let shapes =
            [(0, 1, false), (1, 1, false), (0, 1, true), (1, 3, true), (0, 0, false), (2, 2, false), (0, 0, true)];
        let mut with_deleter = 0;
        for i in 0..3 * SLOTS + 5 {
            let (nc, n, del) = shapes[i % shapes.len()];
            let pick = |k: usize| &vars[(i + k) % vars.len()];
            let raw = || unsafe { RawFn::new(nothing, i as *mut std::ffi::c_void, del.then_some(deleted as CDeleter)) };
            // SAFETY: the test is the ring's only producer and consumer; the function does
            // nothing, the deleter only counts.
            unsafe {
                ring.publish_compact_with(
                    Context { dev_type: DevType::Cpu, dev_id: i as i32 % 3 },
                    nc,
                    n,
                    |k| Ok::<_, ()>(pick(k).clone()),
                    |_, _| Ok(()),
                    raw,
                )
                .expect("room: every slot is given back at once")
                .unwrap();
                let (at, rec) = ring.peek().expect("published");
                assert_eq!(at, i);
                let Rec::Compact { ctx, reads, writes } = rec else { panic!("slot index {i}: not a compact record") };
                assert_eq!(ctx, Context { dev_type: DevType::Cpu, dev_id: i as i32 % 3 });
                assert_eq!((reads.len(), writes.len()), (nc, n - nc), "slot index {i}");
                for (k, v) in reads.iter().chain(writes).enumerate() {
                    assert!(Arc::ptr_eq(v, pick(k)), "slot index {i}: variable {k}");
                }
                let (f, param, deleter) = ring.take_raw(at).into_parts();
                assert_eq!(
                    (f as usize, param as usize, deleter.is_some()),
                    (nothing as CFn as usize, i, del),
                    "slot index {i}"
                );
                with_deleter += usize::from(del);
                // Made again once, as the consumer's function is: its drop runs the deleter.
                drop(RawFn::new(f, param, deleter));
                let index = ring.advance();
                ring.give_back(index);
            }
        }
        assert_eq!(DELETED.load(Ordering::SeqCst), with_deleter, "each deleter ran once");
        ring.reclaim_all();
        assert!(vars.iter().all(|v| Arc::strong_count(v) == 1), "every reference dropped, once");
    }

    /// A compact push whose lookup or check fails drops exactly the variables it wrote into
    /// the slot, makes no function and publishes nothing; the slot serves the next push.
    #[test]
    fn a_failed_compact_push_drops_what_it_wrote_and_publishes_nothing() {
        let ring = Ring::new(true);
        let (a, b, c) = (Var::new(), Var::new(), Var::new());
        let vars = [&a, &b, &c];
        let made = std::cell::Cell::new(0);
        let raw = || {
            made.set(made.get() + 1);
            // SAFETY: an empty C function without param or deleter.
            unsafe { RawFn::new(nothing, std::ptr::null_mut(), None) }
        };
        // SAFETY (the three pushes): the test is the ring's only producer and consumer.
        // The third lookup fails: the first two are dropped again.
        let r = unsafe {
            ring.publish_compact_with(
                Context::CPU,
                1,
                3,
                |i| if i < 2 { Ok(vars[i].clone()) } else { Err("bad handle") },
                |_, _| Ok(()),
                raw,
            )
        };
        assert_eq!(r, Some(Err("bad handle")));
        // The check refuses what the lookups gave: all three are dropped.
        let r =
            unsafe { ring.publish_compact_with(Context::CPU, 1, 3, |i| Ok(vars[i].clone()), |_, _| Err("twice"), raw) };
        assert_eq!(r, Some(Err("twice")));
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b), Arc::strong_count(&c)), (1, 1, 1));
        assert_eq!(made.get(), 0, "a function was made for a refused push");
        assert!(!ring.has_records(), "a refused push was published");
        // The slot then takes a push as usual, with what the check saw.
        let r = unsafe {
            ring.publish_compact_with(
                Context::CPU,
                1,
                2,
                |i| Ok::<_, ()>(vars[2 - i].clone()),
                |reads, writes| {
                    assert!(Arc::ptr_eq(&reads[0], &c) && Arc::ptr_eq(&writes[0], &b));
                    Ok(())
                },
                raw,
            )
        };
        assert_eq!(r, Some(Ok(())));
        assert_eq!(made.get(), 1);
        unsafe {
            let (at, rec) = ring.peek().expect("published");
            match rec {
                Rec::Compact { reads, writes, .. } => {
                    assert!(
                        reads.len() == 1
                            && writes.len() == 1
                            && Arc::ptr_eq(&reads[0], &c)
                            && Arc::ptr_eq(&writes[0], &b)
                    );
                }
                Rec::Full(_) => panic!("a compact record read as a whole push"),
            }
            drop(ring.take_raw(at));
            let i = ring.advance();
            ring.give_back(i);
        }
        ring.reclaim_all();
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b), Arc::strong_count(&c)), (1, 1, 1));
    }
}
