//! Handles handed to C: generational indices instead of raw pointers.
//!
//! Owns: [`HandleTable`], which maps an opaque `void*`-sized handle to an `Arc<T>`. A handle
//! encodes a table tag, a slot index and the slot's generation, so a NULL handle, a handle of
//! another kind, a freed handle and a double free are all detected and answered with an
//! error, never undefined behaviour. Every lookup takes the slot's (uncontended) spin lock, so
//! a free from any thread costs the same; freed slots are reused from a list behind a spin
//! lock (no lock-free code of our own).

use mxnet_core::error::{Error, Result};
use mxnet_core::sync::{Mutex, SpinLock};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Arc;

const CHUNK: usize = 1024;
const MAX_CHUNKS: usize = 16384; // 16M live handles per table
const GEN_BITS: u32 = 24;

struct Slot<T> {
    /// Held by every lookup and writer (insert, replace, free).
    lock: SpinLock<()>,
    /// The generation; changes at every free (under the lock).
    generation: AtomicU32,
    /// The value (`Arc::into_raw`), or null; read and changed under the lock.
    value: AtomicPtr<T>,
}

impl<T> Slot<T> {
    fn new() -> Self {
        Slot { lock: SpinLock::new(()), generation: AtomicU32::new(0), value: AtomicPtr::new(std::ptr::null_mut()) }
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

/// A table of live handles of one kind.
pub struct HandleTable<T> {
    tag: u8,
    kind: &'static str,
    chunks: Box<[AtomicPtr<Slot<T>>]>,
    /// Freed slots' indices, the most recent last (reused first: its lines are warm).
    free: SpinLock<Vec<u32>>,
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
            chunks: (0..MAX_CHUNKS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            free: SpinLock::new(Vec::new()),
            next: AtomicU32::new(0),
            grow: Mutex::new(()),
            _owns: PhantomData,
        }
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
        let reused = self.free.lock().pop();
        let index = reused.unwrap_or_else(|| self.fresh_index());
        let slot = self.slot(index).expect("slot was just allocated");
        let _g = slot.lock.lock();
        slot.value.store(Arc::into_raw(value) as *mut T, Ordering::Release);
        self.encode(index, slot.generation.load(Ordering::Relaxed))
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

    /// Replace the value behind a live handle (the handle stays the same).
    pub fn replace(&self, h: *const c_void, value: Arc<T>) -> Result<()> {
        let old = self.locked(h, |slot, _, _| slot.value.swap(Arc::into_raw(value) as *mut T, Ordering::AcqRel))?;
        // The old value may be the last reference, and dropping it may run foreign code (an
        // autograd function's frontend callback): not under the slot's spin lock.
        // SAFETY: the slot's reference, taken out of it above.
        drop(unsafe { Arc::from_raw(old) });
        Ok(())
    }

    /// Free a handle; returns its value. A second free of the same handle is an error.
    pub fn remove(&self, h: *const c_void) -> Result<Arc<T>> {
        let (index, old) = self.locked(h, |slot, index, generation| {
            slot.generation.store((generation + 1) & ((1 << GEN_BITS) - 1), Ordering::Relaxed);
            (index, slot.value.swap(std::ptr::null_mut(), Ordering::AcqRel))
        })?;
        self.free.lock().push(index);
        // SAFETY: the slot's reference, taken out of it above.
        Ok(unsafe { Arc::from_raw(old) })
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
    use std::sync::atomic::AtomicU64;

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
        // Threads churn through the free list at once; each live value must stay behind its
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
    fn lookups_never_see_a_value_that_another_thread_dropped() {
        // One thread looks handles up (and re-reads the canary a while) while another frees
        // and replaces them: every lookup sees a live value or an error, and every value is
        // dropped exactly once.
        let drops = Arc::new(AtomicU32::new(0));
        let t: Arc<HandleTable<Canary>> = Arc::new(HandleTable::new(13, "test"));
        let handles: Vec<usize> = (0..64).map(|_| t.insert(Canary::new(&drops)) as usize).collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::new(AtomicU64::new(0));
        let reader = {
            let (t, handles, stop, seen) = (t.clone(), handles.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for &h in &handles {
                        let _ = t.with(h as *const c_void, |c| {
                            for _ in 0..8 {
                                assert_eq!(c.magic.load(Ordering::SeqCst), LIVE, "a lookup saw a dropped value");
                            }
                            seen.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                }
            })
        };
        // Replace values for as long as it takes the reader to make many lookups meanwhile.
        let mut created = handles.len() as u32;
        let mut round = 0;
        while round < 2000 || seen.load(Ordering::Relaxed) < 20_000 {
            let h = handles[round % handles.len()] as *const c_void;
            t.replace(h, Canary::new(&drops)).unwrap();
            created += 1;
            round += 1;
            if round % 64 == 0 {
                std::thread::yield_now();
            }
        }
        for &h in &handles {
            drop(t.remove(h as *const c_void).unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), created);
    }
}
