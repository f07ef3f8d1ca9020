//! Handles handed to C: generational indices instead of raw pointers.
//!
//! Owns: [`HandleTable`], which maps an opaque `void*`-sized handle to an `Arc<T>`. A handle
//! encodes a table tag, a slot index and the slot's generation, so a NULL handle, a handle of
//! another kind, a freed handle and a double free are all detected and answered with an
//! error, never undefined behaviour. Lookups take one uncontended slot spin lock; freed slots are
//! reused from a lock-free stack.

use crate::error::{Error, Result};
use crate::sync::{Mutex, SpinLock};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

const CHUNK: usize = 1024;
const MAX_CHUNKS: usize = 16384; // 16M live handles per table
const GEN_BITS: u32 = 24;

struct Slot<T> {
    /// (generation, value); the generation changes at every free.
    inner: SpinLock<(u32, Option<Arc<T>>)>,
    /// While the slot is on the free stack: the stack entry below it (index + 1, 0 for none).
    next_free: AtomicU32,
}

/// A table of live handles of one kind.
pub struct HandleTable<T> {
    tag: u8,
    kind: &'static str,
    chunks: Box<[AtomicPtr<Slot<T>>]>,
    /// The free stack's top: (pushes and pops so far, for ABA) << 32 | (index + 1, 0 when
    /// empty). Lock-free: a create and a free each cost one compare-and-swap here.
    free_top: AtomicU64,
    /// Slots never used yet start at this index.
    next: AtomicU32,
    /// Held while a chunk of slots is allocated.
    grow: Mutex<()>,
    /// Send/Sync follow `Arc<T>`'s, not the raw chunk pointers'.
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
            free_top: AtomicU64::new(0),
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
        let index = self.pop_free().unwrap_or_else(|| self.fresh_index());
        let slot = self.slot(index).expect("slot was just allocated");
        let mut inner = slot.inner.lock();
        inner.1 = Some(value);
        self.encode(index, inner.0)
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
                let chunk: Box<[Slot<T>]> = (0..CHUNK)
                    .map(|_| Slot { inner: SpinLock::new((0, None)), next_free: AtomicU32::new(0) })
                    .collect();
                self.chunks[c].store(Box::into_raw(chunk) as *mut Slot<T>, Ordering::Release);
            }
        }
        i
    }

    /// The value behind a live handle.
    pub fn get(&self, h: *const c_void) -> Result<Arc<T>> {
        let (index, generation) = self.decode(h)?;
        let slot = self.slot(index).ok_or_else(|| self.stale(h))?;
        let inner = slot.inner.lock();
        match &inner.1 {
            Some(v) if inner.0 == generation => Ok(v.clone()),
            _ => Err(self.stale(h)),
        }
    }

    /// Run `f` on the value behind a live handle, without cloning the `Arc`. `f` runs under the
    /// slot's spin lock: keep it to reading fields (no waiting, no allocation from the OS, no
    /// foreign code); otherwise [`HandleTable::get`] and work on the clone.
    pub fn with<R>(&self, h: *const c_void, f: impl FnOnce(&T) -> R) -> Result<R> {
        let (index, generation) = self.decode(h)?;
        let slot = self.slot(index).ok_or_else(|| self.stale(h))?;
        let inner = slot.inner.lock();
        match &inner.1 {
            Some(v) if inner.0 == generation => Ok(f(v)),
            _ => Err(self.stale(h)),
        }
    }

    /// Replace the value behind a live handle (the handle stays the same).
    pub fn replace(&self, h: *const c_void, value: Arc<T>) -> Result<()> {
        let (index, generation) = self.decode(h)?;
        let slot = self.slot(index).ok_or_else(|| self.stale(h))?;
        let mut inner = slot.inner.lock();
        let (gen, v) = &mut *inner;
        let old = match v {
            Some(v) if *gen == generation => std::mem::replace(v, value),
            _ => return Err(self.stale(h)),
        };
        // The old value may be the last reference, and dropping it may run foreign code (an
        // autograd function's frontend callback): not under the slot's spin lock.
        drop(inner);
        drop(old);
        Ok(())
    }

    /// Free a handle; returns its value. A second free of the same handle is an error.
    pub fn remove(&self, h: *const c_void) -> Result<Arc<T>> {
        let (index, generation) = self.decode(h)?;
        let slot = self.slot(index).ok_or_else(|| self.stale(h))?;
        let value = {
            let mut inner = slot.inner.lock();
            if inner.0 != generation || inner.1.is_none() {
                return Err(self.stale(h));
            }
            inner.0 = (inner.0 + 1) & ((1 << GEN_BITS) - 1);
            inner.1.take().expect("checked above")
        };
        self.push_free(index);
        Ok(value)
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
}
