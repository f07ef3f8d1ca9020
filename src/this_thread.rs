//! Per-thread words that the C boundary and the engine's push path both read on every call.
//!
//! Owns: one thread-local block holding the C-call depth (see `c_api::ffi`) and the
//! thread's solo-mode id (see `engine::solo`). In a shared library every thread-local is
//! reached through a `__tls_get_addr` call; keeping both in one block lets a push that
//! reads both look the block up once: the C boundary does ([`words`], in
//! `c_api::ffi::call_on_thread`) and hands it to the push, which reads its solo id there
//! ([`Words::solo_id`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Words {
    /// Depth of C API calls on this thread (a panic inside one is reported, not printed).
    pub(crate) call_depth: Cell<u32>,
    /// This thread's solo-mode id, shifted left by one; 0 until first asked for.
    solo_id: Cell<u64>,
}

thread_local! {
    pub(crate) static WORDS: Words = const { Words { call_depth: Cell::new(0), solo_id: Cell::new(0) } };
}

/// The calling thread's block, looked up once (one `__tls_get_addr` call).
#[inline(always)]
pub(crate) fn words() -> &'static Words {
    // SAFETY: a `const` thread-local without a destructor, on a target with native
    // thread-locals (Linux, which `membarrier` and the rest of the crate assume), lives in
    // the thread's static TLS block, never torn down while the thread runs; and `Words` is
    // not `Sync`, so the reference cannot reach another thread.
    unsafe { &*WORDS.with(|w| w as *const Words) }
}

/// The calling thread's id in the engine's owner word (even, never 0, never reused).
#[inline]
pub(crate) fn solo_id() -> u64 {
    WORDS.with(Words::solo_id)
}

impl Words {
    /// [`solo_id`] from a block already looked up (the C boundary's, see
    /// `c_api::ffi::call_on_thread`): no second thread-local lookup.
    #[inline(always)]
    pub(crate) fn solo_id(&self) -> u64 {
        match self.solo_id.get() {
            0 => new_solo_id(&self.solo_id),
            id => id,
        }
    }
}

#[cold]
fn new_solo_id(cell: &Cell<u64>) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed) << 1;
    cell.set(id);
    id
}
