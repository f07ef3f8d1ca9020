//! Locks for the whole crate: a mutex, a condition variable, a reader-writer lock, a spin
//! lock for the shortest critical sections on hot paths, a set-once cell ([`SetOnce`])
//! that can be built already set without an atomic operation, and the slot of a
//! process-wide part that owns threads ([`Started`]).
//!
//! Owns: the choice of lock implementation. The
//! locks wrap std's futex-based locks, whose whole
//! state lives in the lock itself, and drop poisoning: a panic is caught at the C boundary
//! and reported, and must not make every later call through the same lock fail.
//!
//! Why not parking_lot: it keeps one process-wide table of parked threads. After `fork` the
//! child inherits entries for threads that do not exist there, and a thread the child
//! starts can get a dead thread's stack and thread-local block back from glibc; its fresh
//! per-thread data then cuts the table's queue, and a waiter queued behind the dead thread is
//! never woken (parking_lot issue #515). The engine's fork test hung 1 run in 20 that way:
//! the child's `WaitAll` slept with nothing pending.
//!
//! Condition variables take the guard by value and give it back (`g = cv.wait(g)`), as std's.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{PoisonError, TryLockError};
use std::time::{Duration, Instant};

pub use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock without poisoning.
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if it is free now.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The lock if it becomes free within `timeout` (polled every millisecond: for rare
    /// paths such as process exit, where a holder may never release it).
    pub fn try_lock_for(&self, timeout: Duration) -> Option<MutexGuard<'_, T>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A condition variable for [`Mutex`].
#[derive(Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    pub const fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    /// Release the lock, sleep until notified (or spuriously), take the lock again.
    #[inline]
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// As [`Condvar::wait`], for at most `timeout`; also says whether the time ran out.
    pub fn wait_for<'a, T>(&self, guard: MutexGuard<'a, T>, timeout: Duration) -> (MutexGuard<'a, T>, bool) {
        let (g, r) = self.0.wait_timeout(guard, timeout).unwrap_or_else(PoisonError::into_inner);
        (g, r.timed_out())
    }

    #[inline]
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    #[inline]
    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// A reader-writer lock without poisoning.
#[derive(Default)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> Self {
        RwLock(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through exclusive access (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A lock for critical sections of a few dozen instructions on hot paths (a storage pool's
/// free lists, a handle's slot). Unlocking is a plain release store where std's mutex swaps, so
/// a use costs one atomic read-modify-write instead of two (each about 9 ns on this project's
/// machine; an NDArray create + free took 14 of them). Waiters spin, then yield, then sleep
/// 50 µs at a time: they never park, so a holder must not block for long. No poisoning: a
/// panic while locked releases the lock as the guard drops.
#[derive(Default)]
pub struct SpinLock<T: ?Sized> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time (the
// `locked` flag, taken with Acquire and released with Release, orders the accesses).
unsafe impl<T: ?Sized + Send> Send for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }
}

impl<T: ?Sized> SpinLock<T> {
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        SpinGuard { lock: self, _value: std::marker::PhantomData }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut waits = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if waits < 64 {
                    std::hint::spin_loop();
                } else if waits < 128 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
                waits = waits.saturating_add(1);
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Access to a [`SpinLock`]'s value; unlocks when dropped.
pub struct SpinGuard<'a, T: ?Sized> {
    lock: &'a SpinLock<T>,
    /// Makes the guard `Sync` only where `T` is (as std's `MutexGuard`): a shared guard
    /// hands out `&T`.
    _value: std::marker::PhantomData<&'a mut T>,
}

impl<T: ?Sized> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see the Sync impl).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T: ?Sized> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes the borrow unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T: ?Sized> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// A value set at most once and then read with one acquire load: std's `OnceLock` reads as
/// cheaply, but building one that already holds its value goes through `Once` (a
/// compare-and-swap and a closure), which every new NDArray's variable paid. Here
/// [`SetOnce::with`] is a plain store. Setting later ([`SetOnce::get_or_try_init`]) takes the
/// cell with one compare-and-swap; a thread that finds another one setting it waits (spins,
/// then yields) for that value.
pub struct SetOnce<T> {
    /// `EMPTY`, `BUSY` (being set) or `READY`.
    state: std::sync::atomic::AtomicU8,
    value: UnsafeCell<std::mem::MaybeUninit<T>>,
}

const EMPTY: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;

// SAFETY: the value is written once, by the thread that moved `state` from EMPTY to BUSY, and
// read only after `state` is READY (Release store, Acquire loads); it moves with the cell.
unsafe impl<T: Send + Sync> Sync for SetOnce<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SetOnce<T> {}

impl<T> Default for SetOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> SetOnce<T> {
    pub const fn new() -> Self {
        SetOnce {
            state: std::sync::atomic::AtomicU8::new(EMPTY),
            value: UnsafeCell::new(std::mem::MaybeUninit::uninit()),
        }
    }

    /// A cell that already holds `value` (no atomic operation).
    pub const fn with(value: T) -> Self {
        SetOnce {
            state: std::sync::atomic::AtomicU8::new(READY),
            value: UnsafeCell::new(std::mem::MaybeUninit::new(value)),
        }
    }

    #[inline]
    pub fn get(&self) -> Option<&T> {
        if self.state.load(Ordering::Acquire) == READY {
            // SAFETY: READY is stored (Release) only after the value was written, and the
            // value is never written again.
            Some(unsafe { (*self.value.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// The value, setting it with `init` first if nobody has. An error (or a panic) in `init`
    /// leaves the cell empty for the next caller.
    pub fn get_or_try_init<E>(&self, init: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        let mut waits = 0u32;
        loop {
            if let Some(v) = self.get() {
                return Ok(v);
            }
            if self.state.compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Acquire).is_ok() {
                /// Puts the cell back to EMPTY unless the value was stored.
                struct Reset<'a>(&'a std::sync::atomic::AtomicU8);
                impl Drop for Reset<'_> {
                    fn drop(&mut self) {
                        if self.0.load(Ordering::Relaxed) == BUSY {
                            self.0.store(EMPTY, Ordering::Release);
                        }
                    }
                }
                let _reset = Reset(&self.state);
                let value = init()?;
                // SAFETY: BUSY makes this thread the only writer, and no reader looks before
                // READY.
                unsafe { (*self.value.get()).write(value) };
                self.state.store(READY, Ordering::Release);
                return Ok(self.get().expect("stored above"));
            }
            if waits < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            waits = waits.saturating_add(1);
        }
    }
}

impl<T> Drop for SetOnce<T> {
    fn drop(&mut self) {
        if *self.state.get_mut() == READY {
            // SAFETY: READY means the value was written, and it is dropped only here.
            unsafe { self.value.get_mut().assume_init_drop() };
        }
    }
}

/// The slot of a process-wide part that owns threads (the engine, the custom-operator
/// threads): started at first use and never freed, as its threads may still refer to it.
/// A forked child forgets it ([`Started::forget`], from an `atfork` handler) and its next use
/// starts another: the old one's threads stayed in the parent, and its locks may be held by
/// them. Reading it is one acquire load.
pub struct Started<T: 'static> {
    /// Null, or a value leaked by the `start` of [`Started::get_or_start`].
    ptr: AtomicPtr<T>,
    /// Serialises starts.
    init: Mutex<()>,
}

impl<T: Sync + Send + 'static> Started<T> {
    pub const fn new() -> Self {
        Started { ptr: AtomicPtr::new(std::ptr::null_mut()), init: Mutex::new(()) }
    }

    /// The instance, if it started (and was not forgotten since).
    #[inline]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: `ptr` is null or was stored from a `&'static T` (`get_or_start`), which
        // stays valid for ever; `T: Sync` makes sharing it between threads sound.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The instance, started by `start` (once: concurrent callers wait for the first) if it
    /// was not. A failed start leaves the slot empty for the next call to try again.
    pub fn get_or_start<E>(&self, start: impl FnOnce() -> Result<&'static T, E>) -> Result<&'static T, E> {
        if let Some(t) = self.get() {
            return Ok(t);
        }
        let _g = self.init.lock();
        if let Some(t) = self.get() {
            return Ok(t);
        }
        let t = start()?;
        self.ptr.store(t as *const T as *mut T, Ordering::Release);
        Ok(t)
    }

    /// Forget the instance (in a forked child): the next [`Started::get_or_start`] starts a
    /// new one. Takes no lock, so it may run in an `atfork` handler.
    pub fn forget(&self) {
        self.ptr.store(std::ptr::null_mut(), Ordering::Release);
    }
}

impl<T: Sync + Send + 'static> Default for Started<T> {
    fn default() -> Self {
        Started::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One start however many threads ask at once; a failed start leaves the slot empty; a
    /// forgotten instance is replaced by the next start and stays valid for its holders.
    #[test]
    fn started_starts_once_and_starts_again_after_forget() {
        static SLOT: Started<AtomicBool> = Started::new();
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let start = || -> Result<&'static AtomicBool, ()> {
            STARTS.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            Ok(Box::leak(Box::new(AtomicBool::new(false))))
        };
        assert!(SLOT.get().is_none());
        assert_eq!(SLOT.get_or_start(|| Err::<&'static AtomicBool, _>("no")).err(), Some("no"));
        assert!(SLOT.get().is_none());
        let got: Vec<usize> = (0..4)
            .map(|_| std::thread::spawn(move || SLOT.get_or_start(start).unwrap() as *const AtomicBool as usize))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        assert!(got.iter().all(|&p| p == got[0]));
        assert_eq!(STARTS.load(Ordering::SeqCst), 1);
        let first = SLOT.get().unwrap();
        first.store(true, Ordering::SeqCst);
        SLOT.forget();
        assert!(SLOT.get().is_none());
        let second = SLOT.get_or_start(start).unwrap();
        assert!(!std::ptr::eq(first, second) && first.load(Ordering::SeqCst));
        assert_eq!(STARTS.load(Ordering::SeqCst), 2);
    }
    use std::sync::Arc;

    #[test]
    fn set_once_is_set_by_one_thread_and_survives_failed_inits() {
        let built = SetOnce::with(vec![1]);
        assert_eq!(built.get(), Some(&vec![1]));
        let cell: Arc<SetOnce<Vec<usize>>> = Arc::new(SetOnce::new());
        assert!(cell.get().is_none());
        // An error, then a panic, in `init` leave it empty.
        assert_eq!(cell.get_or_try_init(|| Err::<Vec<usize>, _>("no")), Err("no"));
        let c2 = cell.clone();
        assert!(std::thread::spawn(move || c2.get_or_try_init::<()>(|| panic!("in init")).map(|v| v.len()))
            .join()
            .is_err());
        assert!(cell.get().is_none());
        // Racing threads all see the one value that won.
        let inits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen: Vec<Vec<usize>> = (0..4)
            .map(|k| {
                let (cell, inits) = (cell.clone(), inits.clone());
                std::thread::spawn(move || {
                    cell.get_or_try_init::<()>(|| {
                        inits.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        Ok(vec![k])
                    })
                    .unwrap()
                    .clone()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        assert_eq!(inits.load(Ordering::SeqCst), 1);
        assert!(seen.iter().all(|v| v == &seen[0]), "{seen:?}");
    }

    #[test]
    fn a_panic_while_locked_does_not_poison() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("inside the lock");
        })
        .join();
        assert!(r.is_err());
        *m.lock() += 1;
        assert_eq!(*m.lock(), 2);
        assert!(m.try_lock().is_some());
    }

    #[test]
    fn try_lock_for_gives_up_on_a_held_lock() {
        let m = Mutex::new(());
        let _g = m.lock();
        let t = Instant::now();
        assert!(m.try_lock_for(Duration::from_millis(20)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn condvar_wakes_a_waiter_and_times_out() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p2 = pair.clone();
        let t = std::thread::spawn(move || {
            let mut g = p2.0.lock();
            while !*g {
                g = p2.1.wait(g);
            }
        });
        *pair.0.lock() = true;
        pair.1.notify_all();
        t.join().unwrap();
        let (_g, timed_out) = pair.1.wait_for(pair.0.lock(), Duration::from_millis(5));
        assert!(timed_out);
    }

    #[test]
    fn spin_lock_excludes_and_survives_a_panic() {
        // Eight threads add to a plain (non-atomic) counter under the lock: any overlap loses
        // increments.
        let l = Arc::new(SpinLock::new(0u64));
        let ts: Vec<_> = (0..8)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = l.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 160_000);
        let l2 = l.clone();
        let r = std::thread::spawn(move || {
            let _g = l2.lock();
            panic!("inside the spin lock");
        })
        .join();
        assert!(r.is_err());
        *l.lock() += 1;
        assert_eq!(*l.lock(), 160_001);
    }
}

/// A value alone on its cache lines (128 bytes: adjacent-line prefetch pairs lines): for
/// counters and flags that different threads write, so that one thread's writes do not
/// take the line another thread works on (false sharing).
#[repr(align(128))]
#[derive(Default)]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
