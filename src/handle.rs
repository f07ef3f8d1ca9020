//! Handles handed to C: generational indices instead of raw pointers.
//!
//! Owns: [`HandleTable`], which maps an opaque `void*`-sized handle to an `Arc<T>`. A handle
//! encodes a table tag, a slot index and the slot's generation, so a NULL handle, a handle of
//! another kind, a freed handle and a double free are all detected and answered with an
//! error, never undefined behaviour. Lookups take one uncontended slot spin lock; freed slots
//! are reused from a lock-free stack. Also the owner reader (below) and its handshake with
//! frees.
//!
//! **Owner reads.** In a table made with [`HandleTable::with_owner_reads`] (NDArrays, engine
//! variables: what pushes look up), one thread, the *owner reader*, looks handles up without
//! the slot lock ([`HandleTable::with_as`], [`HandleTable::get_as`]): a push of 65 arrays
//! otherwise takes 65 locked compare-and-swaps on top of the 65 reference counts it must
//! take. The first thread to look up that way claims the role until it exits (in practice
//! the thread that pushes: the frontend's main thread). Its lookup marks itself in
//! `OwnerReader::epoch` (odd while inside, with plain stores, no fence: only the owner
//! writes it), loads the slot's value, then the generation, and uses the value only if the
//! generation is the handle's. Only the crate looks up this way, with the caller's block of
//! thread words (which cannot leave its thread) standing for its identity.
//!
//! A value taken out of such a table (freed or replaced) is dropped only once no owner lookup
//! can still be using it ([`OwnerReader::quiesce`]): by the owner itself at once (outside its
//! lookups; from inside one, the value is kept for good); by any other thread after a `membarrier` (which orders the owner's epoch
//! store before its value load, the barrier the owner skips) and after the owner's epoch
//! shows it outside the lookup that may have seen the value. The claim itself is followed by
//! a `membarrier`, so a thread that still read "no owner" has its value out of the slot
//! before the new owner's first load. Without `membarrier` (old kernels, seccomp) nobody
//! claims the role and every lookup takes the lock. A forked child, whose owner may be a
//! thread that does not exist there, starts without one.

use crate::error::{Error, Result};
use crate::sync::{membarrier, Mutex, Padded, SpinLock};
use crate::this_thread::Words;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{compiler_fence, fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

const CHUNK: usize = 1024;
const MAX_CHUNKS: usize = 16384; // 16M live handles per table
const GEN_BITS: u32 = 24;

struct Slot<T> {
    /// Held by every writer (insert, replace, free) and by lookups other than the owner
    /// reader's.
    lock: SpinLock<()>,
    /// The generation; changes at every free (under the lock).
    generation: AtomicU32,
    /// The value (`Arc::into_raw`), or null; changed under the lock, read by the owner
    /// reader without it.
    value: AtomicPtr<T>,
    /// While the slot is on the free stack: the stack entry below it (index + 1, 0 for none).
    next_free: AtomicU32,
}

impl<T> Slot<T> {
    fn new() -> Self {
        Slot {
            lock: SpinLock::new(()),
            generation: AtomicU32::new(0),
            value: AtomicPtr::new(std::ptr::null_mut()),
            next_free: AtomicU32::new(0),
        }
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        let p = *self.value.get_mut();
        if !p.is_null() {
            // SAFETY: a non-null value is a reference the slot owns (`Arc::into_raw`).
            drop(unsafe { Arc::from_raw(p) });
        }
    }
}

/// The owner reader (see the module documentation): one for every table with owner reads
/// (tests make their own).
pub(crate) struct OwnerReader {
    /// 0 before a claim; the owner's id (`this_thread::solo_id`: even, never 0, never reused);
    /// or [`NO_OWNER_READS`].
    id: AtomicU64,
    /// Odd while the owner is inside a lookup. Written by the owner only (successive owners
    /// in turn; reset in a forked child).
    epoch: Padded<AtomicU64>,
}

/// `OwnerReader::id` when `membarrier` is unavailable: no thread reads without the lock.
const NO_OWNER_READS: u64 = 1;

/// The owner reader of the process's tables (NDArrays, engine variables).
pub(crate) static OWNER: OwnerReader = OwnerReader::new();

/// In a forked child: no owner reader yet (the parent's may not exist here, and may have
/// been inside a lookup).
extern "C" fn owner_reader_after_fork() {
    OWNER.id.store(0, Ordering::Relaxed);
    OWNER.epoch.store(0, Ordering::Relaxed);
}

impl OwnerReader {
    pub(crate) const fn new() -> Self {
        OwnerReader { id: AtomicU64::new(0), epoch: Padded(AtomicU64::new(0)) }
    }

    /// Whether thread `id` (the calling thread) is the owner reader, claiming the role if
    /// nobody has.
    #[inline]
    fn is(&'static self, id: u64) -> bool {
        match self.id.load(Ordering::Relaxed) {
            0 => id != 0 && self.claim(id),
            o => o == id,
        }
    }

    #[cold]
    fn claim(&'static self, id: u64) -> bool {
        static FORK: std::sync::Once = std::sync::Once::new();
        crate::runtime::at_fork(&FORK, None, Some(owner_reader_after_fork));
        if !membarrier::register() {
            let _ = self.id.compare_exchange(0, NO_OWNER_READS, Ordering::SeqCst, Ordering::Relaxed);
            return false;
        }
        match self.id.compare_exchange(0, id, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) => {
                // Given back when this thread exits (it is outside any lookup then); a thread
                // whose thread-locals are being torn down does not keep the role. (Noted
                // already: the same claim again, in a forked child.)
                let noted = GIVE_BACK_AT_EXIT.try_with(|g| match g.0.get() {
                    None => {
                        g.0.set(Some((self, id)));
                        true
                    }
                    Some((owner, noted_id)) => std::ptr::eq(owner, self) && noted_id == id,
                });
                if noted != Ok(true) {
                    self.id.store(0, Ordering::SeqCst);
                    return false;
                }
                // Every other thread passes a full barrier before this thread's first
                // lock-free load: one that read 0 before the claim has stored its slot's new
                // value by then. Without it, nobody reads without the lock.
                if !membarrier::barrier() {
                    self.id.store(NO_OWNER_READS, Ordering::SeqCst);
                    return false;
                }
                true
            }
            Err(other) => other == id,
        }
    }

    /// Make sure no owner lookup still uses a value just taken out of a slot of a table
    /// with owner reads. False when that cannot be known (`membarrier` failed, or the owner
    /// frees from inside one of its own lookups): the caller must then keep the value alive
    /// for good.
    fn quiesce(&self) -> bool {
        fence(Ordering::SeqCst);
        let owner = self.id.load(Ordering::Acquire);
        if owner == 0 || owner == NO_OWNER_READS {
            return true;
        }
        if owner == crate::this_thread::solo_id() {
            return self.epoch.load(Ordering::Relaxed) % 2 == 0;
        }
        if !membarrier::barrier() {
            return false;
        }
        let e = self.epoch.load(Ordering::Acquire);
        if e % 2 == 1 {
            // Inside a lookup (a few loads): wait for its end, or for any later epoch.
            let mut spins = 0u32;
            while self.epoch.load(Ordering::Acquire) == e {
                if spins < 1000 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        }
        true
    }
}

/// Gives the owner reader role back when its thread exits, so that another thread can claim
/// it (and frees stop waiting for a thread that is gone).
struct GiveBackAtExit(std::cell::Cell<Option<(&'static OwnerReader, u64)>>);

impl Drop for GiveBackAtExit {
    fn drop(&mut self) {
        if let Some((owner, id)) = self.0.get() {
            let _ = owner.id.compare_exchange(id, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static GIVE_BACK_AT_EXIT: GiveBackAtExit = const { GiveBackAtExit(std::cell::Cell::new(None)) };
}

/// Marks the owner reader inside a lookup while it lives.
struct OwnerLookup<'a>(&'a OwnerReader, u64);

impl<'a> OwnerLookup<'a> {
    #[inline]
    fn enter(owner: &'a OwnerReader) -> Self {
        let e = owner.epoch.load(Ordering::Relaxed);
        if e % 2 == 1 {
            // A lookup inside a lookup (from `f`): the outer one's mark covers it.
            return OwnerLookup(owner, e);
        }
        // Release: a free that sees this epoch (and not the previous lookup's end) still
        // sees everything before it.
        owner.epoch.store(e + 1, Ordering::Release);
        // No hardware barrier: a thread that frees runs `membarrier` instead (see
        // `OwnerReader::quiesce`).
        compiler_fence(Ordering::SeqCst);
        OwnerLookup(owner, e + 2)
    }
}

impl Drop for OwnerLookup<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.epoch.store(self.1, Ordering::Release);
    }
}

/// A table of live handles of one kind.
pub struct HandleTable<T> {
    tag: u8,
    kind: &'static str,
    /// The owner reader that may look up without the lock, if any (see the module
    /// documentation).
    owner: Option<&'static OwnerReader>,
    chunks: Box<[AtomicPtr<Slot<T>>]>,
    /// The free stack's top: (pushes and pops so far, for ABA) << 32 | (index + 1, 0 when
    /// empty). Lock-free: a create and a free each cost one compare-and-swap here.
    free_top: AtomicU64,
    /// Slots never used yet start at this index.
    next: AtomicU32,
    /// Held while a chunk of slots is allocated.
    grow: Mutex<()>,
    /// Send/Sync follow `Arc<T>`'s, not the raw pointers'.
    _owns: PhantomData<Arc<T>>,
}

impl<T> HandleTable<T> {
    /// `tag` distinguishes tables (1..=255); `kind` names the handle in errors.
    pub fn new(tag: u8, kind: &'static str) -> Self {
        assert!(tag != 0);
        HandleTable {
            tag,
            kind,
            owner: None,
            chunks: (0..MAX_CHUNKS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            free_top: AtomicU64::new(0),
            next: AtomicU32::new(0),
            grow: Mutex::new(()),
            _owns: PhantomData,
        }
    }

    /// A table whose owner reader looks up without the slot lock ([`HandleTable::with_as`]);
    /// its frees and replacements then wait for that reader where needed (see the module
    /// documentation).
    pub fn with_owner_reads(tag: u8, kind: &'static str) -> Self {
        Self::with_owner(tag, kind, &OWNER)
    }

    /// [`HandleTable::with_owner_reads`] with its own owner reader (tests).
    pub(crate) fn with_owner(tag: u8, kind: &'static str, owner: &'static OwnerReader) -> Self {
        let mut t = Self::new(tag, kind);
        t.owner = Some(owner);
        t
    }

    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let chunk = self.chunks.get(index as usize / CHUNK)?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: chunks are allocated once with CHUNK slots and never freed while the table
        // lives; the index is within the chunk.
        Some(unsafe { &*chunk.add(index as usize % CHUNK) })
    }

    fn encode(&self, index: u32, generation: u32) -> *mut c_void {
        let v = ((self.tag as u64) << 56) | ((generation as u64) << 32) | (index as u64 + 1);
        v as usize as *mut c_void
    }

    fn decode(&self, h: *const c_void) -> Result<(u32, u32)> {
        let v = h as usize as u64;
        if v == 0 {
            return Err(Error::value(format!("{} handle is NULL", self.kind)));
        }
        if (v >> 56) as u8 != self.tag || (v & 0xffff_ffff) == 0 {
            return Err(Error::value(format!("{h:p} is not a valid {} handle", self.kind)));
        }
        Ok(((v & 0xffff_ffff) as u32 - 1, ((v >> 32) & ((1 << GEN_BITS) - 1)) as u32))
    }

    /// Register a value; returns its handle.
    pub fn insert(&self, value: Arc<T>) -> *mut c_void {
        let index = self.pop_free().unwrap_or_else(|| self.fresh_index());
        let slot = self.slot(index).expect("slot was just allocated");
        let _g = slot.lock.lock();
        slot.value.store(Arc::into_raw(value) as *mut T, Ordering::Release);
        self.encode(index, slot.generation.load(Ordering::Relaxed))
    }

    /// The most recently freed index, if any.
    fn pop_free(&self) -> Option<u32> {
        let mut top = self.free_top.load(Ordering::Acquire);
        loop {
            let index = (top as u32).checked_sub(1)?;
            // Slots are never deallocated, so reading a stale `next_free` is harmless: the
            // count in `top` then has moved on and the exchange fails.
            let below = self.slot(index).expect("freed slots exist").next_free.load(Ordering::Relaxed);
            let new = (((top >> 32) + 1) << 32) | below as u64;
            match self.free_top.compare_exchange_weak(top, new, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some(index),
                Err(now) => top = now,
            }
        }
    }

    fn push_free(&self, index: u32) {
        let slot = self.slot(index).expect("freed slots exist");
        let mut top = self.free_top.load(Ordering::Relaxed);
        loop {
            slot.next_free.store(top as u32, Ordering::Relaxed);
            let new = (((top >> 32) + 1) << 32) | (index as u64 + 1);
            match self.free_top.compare_exchange_weak(top, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => top = now,
            }
        }
    }

    /// An index never used before, allocating its chunk of slots if it is the first there.
    fn fresh_index(&self) -> u32 {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let c = i as usize / CHUNK;
        assert!(c < MAX_CHUNKS, "{} handle table is full", self.kind);
        if self.chunks[c].load(Ordering::Acquire).is_null() {
            let _grow = self.grow.lock();
            if self.chunks[c].load(Ordering::Acquire).is_null() {
                let chunk: Box<[Slot<T>]> = (0..CHUNK).map(|_| Slot::new()).collect();
                self.chunks[c].store(Box::into_raw(chunk) as *mut Slot<T>, Ordering::Release);
            }
        }
        i
    }

    /// The value behind a live handle.
    pub fn get(&self, h: *const c_void) -> Result<Arc<T>> {
        self.with(h, Self::clone_held)
    }

    /// Run `f` on the value behind a live handle, without cloning the `Arc`. `f` runs under the
    /// slot's spin lock: keep it to reading fields (no waiting, no allocation from the OS, no
    /// foreign code); otherwise [`HandleTable::get`] and work on the clone.
    pub fn with<R>(&self, h: *const c_void, f: impl FnOnce(&T) -> R) -> Result<R> {
        // SAFETY: a live slot's value (checked by `locked`) stays alive while its lock is held.
        self.locked(h, |slot, _, _| f(unsafe { &*slot.value.load(Ordering::Relaxed) }))
    }

    /// `f` on a live handle's slot (its value not null), index and generation, under the
    /// slot's lock; an error for any other handle.
    #[inline]
    fn locked<R>(&self, h: *const c_void, f: impl FnOnce(&Slot<T>, u32, u32) -> R) -> Result<R> {
        let (index, generation) = self.decode(h)?;
        let slot = self.slot(index).ok_or_else(|| self.stale(h))?;
        let _g = slot.lock.lock();
        if slot.value.load(Ordering::Relaxed).is_null() || slot.generation.load(Ordering::Relaxed) != generation {
            return Err(self.stale(h));
        }
        Ok(f(slot, index, generation))
    }

    /// One more `Arc` of a value a lookup lent.
    fn clone_held(v: &T) -> Arc<T> {
        // SAFETY: every value a slot holds came from `Arc::into_raw`, and the lookup that lent
        // `v` keeps that reference alive meanwhile: its count is positive.
        unsafe {
            Arc::increment_strong_count(v);
            Arc::from_raw(v)
        }
    }

    /// [`HandleTable::with`] for the calling thread (`thread` is its block of words, which
    /// cannot leave it): without the slot lock if it is the owner reader (see the module
    /// documentation). As for `with`, `f` only reads fields: it must not wait (a free on
    /// another thread waits for it), and a value it frees or replaces in an owner table is
    /// kept for good. The locked way is taken for everyone else, and for any handle that is
    /// not plainly live.
    #[inline]
    pub(crate) fn with_as<R>(&self, h: *const c_void, thread: &Words, f: impl FnOnce(&T) -> R) -> Result<R> {
        if let Some(owner) = self.owner.filter(|o| o.is(thread.solo_id())) {
            let (index, generation) = self.decode(h)?;
            if let Some(slot) = self.slot(index) {
                let _inside = OwnerLookup::enter(owner);
                let p = slot.value.load(Ordering::Acquire);
                if !p.is_null() && slot.generation.load(Ordering::Acquire) == generation {
                    // SAFETY: the value was the handle's when loaded (the generation, loaded
                    // after it, did not change), and whoever takes it out of the slot drops
                    // it only after this lookup ends (`OwnerReader::quiesce`).
                    return Ok(f(unsafe { &*p }));
                }
            }
        }
        self.with(h, f)
    }

    /// [`HandleTable::get`] the way [`HandleTable::with_as`] looks up.
    #[inline]
    pub(crate) fn get_as(&self, h: *const c_void, thread: &Words) -> Result<Arc<T>> {
        self.with_as(h, thread, Self::clone_held)
    }

    /// Replace the value behind a live handle (the handle stays the same).
    pub fn replace(&self, h: *const c_void, value: Arc<T>) -> Result<()> {
        let old = self.locked(h, |slot, _, _| slot.value.swap(Arc::into_raw(value) as *mut T, Ordering::AcqRel))?;
        // The old value may be the last reference, and dropping it may run foreign code (an
        // autograd function's frontend callback): not under the slot's spin lock.
        // SAFETY: the slot's reference, taken out of it above.
        drop(self.retire(unsafe { Arc::from_raw(old) }));
        Ok(())
    }

    /// Free a handle; returns its value. A second free of the same handle is an error.
    pub fn remove(&self, h: *const c_void) -> Result<Arc<T>> {
        let (index, old) = self.locked(h, |slot, index, generation| {
            slot.generation.store((generation + 1) & ((1 << GEN_BITS) - 1), Ordering::Relaxed);
            (index, slot.value.swap(std::ptr::null_mut(), Ordering::AcqRel))
        })?;
        self.push_free(index);
        // SAFETY: the slot's reference, taken out of it above.
        Ok(self.retire(unsafe { Arc::from_raw(old) }))
    }

    /// A value just taken out of a slot, once the owner reader cannot be using it (see
    /// [`OwnerReader::quiesce`]). If that cannot be known, one reference is kept for good: a
    /// leak, not a use after free.
    fn retire(&self, old: Arc<T>) -> Arc<T> {
        if self.owner.is_some_and(|o| !o.quiesce()) {
            std::mem::forget(old.clone());
        }
        old
    }

    fn stale(&self, h: *const c_void) -> Error {
        Error::value(format!("{} handle {h:p} was already freed (or never created)", self.kind))
    }
}

impl<T> Drop for HandleTable<T> {
    fn drop(&mut self) {
        for c in self.chunks.iter() {
            let p = c.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: allocated in insert() as a boxed slice of CHUNK slots.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK)) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_misuse() {
        let t: HandleTable<i32> = HandleTable::new(7, "test");
        let other: HandleTable<i32> = HandleTable::new(8, "other");
        let a = t.insert(Arc::new(1));
        let b = t.insert(Arc::new(2));
        assert_eq!(*t.get(a).unwrap(), 1);
        assert_eq!(*t.get(b).unwrap(), 2);
        assert!(other.get(a).unwrap_err().to_string().contains("not a valid other handle"));
        assert!(t.get(std::ptr::null()).unwrap_err().to_string().contains("NULL"));
        assert_eq!(*t.remove(a).unwrap(), 1);
        assert!(t.get(a).unwrap_err().to_string().contains("already freed"));
        assert!(t.remove(a).is_err(), "double free detected");
        // The slot is reused with a new generation; the old handle stays dead.
        let c = t.insert(Arc::new(3));
        assert_ne!(c, a);
        assert!(t.get(a).is_err());
        assert_eq!(*t.get(c).unwrap(), 3);
        assert!(t.get(0x1234 as *const c_void).is_err());
    }

    #[test]
    fn concurrent_create_free_cycles_never_share_a_slot() {
        // Threads churn through the free stack at once; each live value must stay behind its
        // own handle, and every handle freed must be dead afterwards.
        let t: Arc<HandleTable<(usize, usize)>> = Arc::new(HandleTable::new(12, "test"));
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut dead = Vec::new();
                    for i in 0..20_000 {
                        let a = t.insert(Arc::new((k, i)));
                        let b = t.insert(Arc::new((k, i + 1)));
                        assert_ne!(a, b);
                        assert_eq!(*t.get(a).unwrap(), (k, i));
                        assert_eq!(*t.remove(b).unwrap(), (k, i + 1));
                        assert_eq!(*t.remove(a).unwrap(), (k, i));
                        if i % 1000 == 0 {
                            dead.push(a as usize);
                        }
                    }
                    dead
                })
            })
            .collect();
        let dead: Vec<_> = threads.into_iter().flat_map(|th| th.join().unwrap()).collect();
        for h in dead {
            assert!(t.get(h as *const c_void).is_err());
        }
        // All the churn reused a handful of slots.
        assert!(t.next.load(Ordering::Relaxed) <= 8, "{} slots used", t.next.load(Ordering::Relaxed));
    }

    #[test]
    fn many_handles_across_chunks_and_threads() {
        let t: Arc<HandleTable<usize>> = Arc::new(HandleTable::new(9, "test"));
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let hs: Vec<_> = (0..3000).map(|i| (t.insert(Arc::new(k * 10000 + i)), k * 10000 + i)).collect();
                    for (h, v) in &hs {
                        assert_eq!(*t.get(*h).unwrap(), *v);
                    }
                    for (h, _) in hs {
                        t.remove(h).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
    }

    /// A value that counts its drops and notices a second one.
    struct Canary {
        magic: AtomicU64,
        drops: Arc<AtomicU32>,
    }

    const LIVE: u64 = 0x5eed_cafe_f00d_beef;

    impl Canary {
        fn new(drops: &Arc<AtomicU32>) -> Arc<Self> {
            Arc::new(Canary { magic: AtomicU64::new(LIVE), drops: drops.clone() })
        }
    }

    impl Drop for Canary {
        fn drop(&mut self) {
            assert_eq!(self.magic.swap(0, Ordering::SeqCst), LIVE, "a canary dropped twice");
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn owner_reads_never_see_a_value_that_another_thread_dropped() {
        static READER: OwnerReader = OwnerReader::new();
        let t: Arc<HandleTable<Canary>> = Arc::new(HandleTable::with_owner(13, "test", &READER));
        let drops = Arc::new(AtomicU32::new(0));
        let made = Arc::new(AtomicU32::new(0));
        let cells: Arc<Vec<AtomicU64>> = Arc::new(
            (0..64)
                .map(|_| {
                    made.fetch_add(1, Ordering::SeqCst);
                    AtomicU64::new(t.insert(Canary::new(&drops)) as u64)
                })
                .collect(),
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Two threads free, re-create and replace the values behind the cells.
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (t, cells, stop, drops, made) =
                    (t.clone(), cells.clone(), stop.clone(), drops.clone(), made.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(w + 1);
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let cell = &cells[(x % 64) as usize];
                        let h = cell.load(Ordering::Acquire) as *const c_void;
                        made.fetch_add(1, Ordering::SeqCst);
                        let fresh = Canary::new(&drops);
                        // A replacement or free of a handle the other writer freed fails
                        // (and `fresh` is dropped unused).
                        if x & 1 == 0 {
                            let _ = t.replace(h, fresh);
                        } else if t.remove(h).is_ok() {
                            cell.store(t.insert(fresh) as u64, Ordering::Release);
                        }
                    }
                })
            })
            .collect();
        let me = crate::this_thread::words();
        let (mut seen, start) = (0u64, std::time::Instant::now());
        while start.elapsed() < std::time::Duration::from_millis(400) {
            for cell in cells.iter() {
                let h = cell.load(Ordering::Acquire) as *const c_void;
                // A freed handle is an error; a live one shows a value not yet dropped, at the
                // start of the lookup and after a while in it.
                let looked = t.with_as(h, me, |c| {
                    let first = c.magic.load(Ordering::SeqCst);
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    (first, c.magic.load(Ordering::SeqCst))
                });
                if let Ok(m) = looked {
                    assert_eq!(m, (LIVE, LIVE), "an owner lookup saw a dropped value");
                    seen += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(seen > 1000, "only {seen} lookups succeeded");
        match READER.id.load(Ordering::SeqCst) {
            NO_OWNER_READS => eprintln!("membarrier unavailable: the lookups took the lock"),
            o => assert_eq!(o, me.solo_id(), "the first thread to look up owns the reads"),
        }
        for cell in cells.iter() {
            t.remove(cell.load(Ordering::Acquire) as *const c_void).unwrap();
        }
        assert_eq!(drops.load(Ordering::SeqCst), made.load(Ordering::SeqCst), "every value dropped exactly once");
    }

    #[test]
    fn a_free_on_another_thread_waits_for_the_owner_lookup_in_progress() {
        static READER: OwnerReader = OwnerReader::new();
        struct Probe(Arc<std::sync::atomic::AtomicBool>, Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Probe {
            fn drop(&mut self) {
                // Records whether the lookup had finished when the value was dropped.
                self.1.store(self.0.load(Ordering::SeqCst), Ordering::SeqCst);
            }
        }
        let t: Arc<HandleTable<Probe>> = Arc::new(HandleTable::with_owner(14, "test", &READER));
        let lookup_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done_at_drop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let h = t.insert(Arc::new(Probe(lookup_done.clone(), done_at_drop.clone()))) as usize;
        let me = crate::this_thread::words();
        let remover = t
            .with_as(h as *const c_void, me, |_| {
                let t2 = t.clone();
                let remover =
                    std::thread::spawn(move || t2.remove(h as *const c_void).map(drop).map_err(|e| e.to_string()));
                if READER.id.load(Ordering::SeqCst) == NO_OWNER_READS {
                    // This lookup holds the slot lock: the free waits for it on the lock.
                    eprintln!("membarrier unavailable: the lookup took the lock");
                } else {
                    // Until the free has taken the value out of the slot (it then waits).
                    let start = std::time::Instant::now();
                    while t.with(h as *const c_void, |_| ()).is_ok() {
                        assert!(start.elapsed().as_secs() < 10, "the free never started");
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
                assert!(!remover.is_finished(), "the free did not wait for the lookup");
                lookup_done.store(true, Ordering::SeqCst);
                remover
            })
            .unwrap();
        remover.join().unwrap().unwrap();
        assert!(done_at_drop.load(Ordering::SeqCst), "the value was dropped during the lookup");
        // The owner reads a freed handle as an error, as everyone else.
        let e = t.with_as(h as *const c_void, me, |_| ()).unwrap_err().to_string();
        assert!(e.contains("already freed"), "{e}");
        assert!(t.get_as(std::ptr::null(), me).err().unwrap().to_string().contains("NULL"));
    }

    #[test]
    fn an_owner_reader_that_exits_gives_the_role_back() {
        static READER: OwnerReader = OwnerReader::new();
        let t: Arc<HandleTable<i32>> = Arc::new(HandleTable::with_owner(16, "test", &READER));
        let a = t.insert(Arc::new(1)) as usize;
        let t2 = t.clone();
        let first = std::thread::spawn(move || {
            let me = crate::this_thread::words();
            assert_eq!(t2.with_as(a as *const c_void, me, |v| *v).unwrap(), 1);
            me.solo_id()
        })
        .join()
        .unwrap();
        let now = READER.id.load(Ordering::SeqCst);
        if now == NO_OWNER_READS {
            eprintln!("membarrier unavailable: no owner reader");
            return;
        }
        assert_ne!(now, first, "the exited thread still owns the reads");
        let me = crate::this_thread::words();
        assert_eq!(t.with_as(a as *const c_void, me, |v| *v).unwrap(), 1);
        assert_eq!(READER.id.load(Ordering::SeqCst), me.solo_id(), "the next thread to look up claims the role");
    }

    #[test]
    fn the_owner_frees_at_once_and_other_threads_read_the_locked_way() {
        static READER: OwnerReader = OwnerReader::new();
        let t: Arc<HandleTable<i32>> = Arc::new(HandleTable::with_owner(15, "test", &READER));
        let me = crate::this_thread::words();
        let a = t.insert(Arc::new(5)) as usize;
        assert_eq!(*t.get_as(a as *const c_void, me).unwrap(), 5);
        let t2 = t.clone();
        // Another thread: not the owner reader (its lookups leave the owner's epoch alone);
        // its lookups and frees are correct all the same.
        let epoch = READER.epoch.load(Ordering::SeqCst);
        std::thread::spawn(move || {
            let other = crate::this_thread::words();
            assert_eq!(t2.with_as(a as *const c_void, other, |v| *v).unwrap(), 5);
            let b = t2.insert(Arc::new(6));
            assert_eq!(*t2.remove(b).unwrap(), 6);
        })
        .join()
        .unwrap();
        assert_eq!(READER.epoch.load(Ordering::SeqCst), epoch, "another thread read the owner's way");
        t.replace(a as *const c_void, Arc::new(7)).unwrap();
        assert_eq!(t.with_as(a as *const c_void, me, |v| *v).unwrap(), 7);
        // The owner's free hands the value back at once, the table keeping no reference.
        let v = t.remove(a as *const c_void).unwrap();
        assert_eq!((*v, Arc::strong_count(&v)), (7, 1));
        assert!(t.get_as(a as *const c_void, me).is_err());
        // A value the owner frees from inside its own lookup is kept (not dropped under it).
        // (Without owner reads the lookup holds the slot lock, which the free would wait for.)
        if READER.id.load(Ordering::SeqCst) != NO_OWNER_READS {
            let c = t.insert(Arc::new(8)) as usize;
            let kept = t.with_as(c as *const c_void, me, |v| {
                let out = t.remove(c as *const c_void).unwrap();
                (*v, Arc::strong_count(&out))
            });
            assert_eq!(kept.unwrap(), (8, 2), "the value freed inside the lookup was not kept");
        }
    }
}
