//! Engine variables: the versioned dependency queue of one piece of data.
//!
//! Owns: per-variable scheduling state. Operations that read a variable may run together;
//! a write runs alone; conflicting operations run in push order. Also the failure mark an
//! operation that failed leaves on the variables it writes.
//!
//! Protocol: an operation registers with each of its variables ([`Var::append_read`] /
//! [`Var::append_write`]); a variable that can grant access at once says so, otherwise it
//! queues the operation. On completion the operation releases each variable
//! ([`Var::complete_read`] / [`Var::complete_write`]), which grants access to the next
//! operations in the queue; those whose last variable was granted become ready. Granting
//! happens under the variable's lock; dispatching ready operations happens after it is
//! released.

use super::opr::Opr;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::storage::Block;
use crate::sync::{Mutex, SetOnce, SpinLock};
use std::collections::VecDeque;
use std::sync::Arc;

/// A failure shared by every variable it reached; clearing it clears it everywhere.
#[derive(Default)]
pub struct ErrorCell(Mutex<Option<Error>>);

impl ErrorCell {
    pub fn new(e: Error) -> Arc<Self> {
        Arc::new(ErrorCell(Mutex::new(Some(e))))
    }
    pub fn is_set(&self) -> bool {
        self.0.lock().is_some()
    }
    pub fn take(&self) -> Option<Error> {
        self.0.lock().take()
    }
    pub fn peek(&self) -> Option<Error> {
        self.0.lock().clone()
    }
}

#[derive(Default)]
struct VarState {
    running_reads: usize,
    running_write: bool,
    /// Waiting operations in push order; `true` marks a write.
    queue: VecDeque<(Arc<Opr>, bool)>,
    error: Option<Arc<ErrorCell>>,
}

/// One variable, and the memory block of the data it stands for (if any): operations hold
/// their variables, so the block lives until the last operation on it has finished.
///
/// The scheduling state (the workers') starts 128 bytes after the start of the variable's
/// `Arc` allocation, where the reference count (changed by pushing threads) sits: at that
/// distance the two never share a cache line, nor a pair of lines that adjacent-line
/// prefetch fetches together, whatever the allocation's alignment. Padding instead of
/// `repr(align(128))` keeps the `Arc`'s allocation (256 bytes, a test checks it) on
/// mimalloc's plain path (`mi_malloc_aligned` cost a new array about 20 instructions more,
/// by callgrind). The state's lock is a spin lock: held for a few instructions.
#[derive(Default)]
#[repr(C)]
pub struct Var {
    /// Keeps the state 128 bytes from the `Arc`'s counts (16 bytes before this field).
    _apart: [u64; 14],
    state: SpinLock<VarState>,
    /// Set once: at creation ([`Var::with_block`], a plain store) or at the first
    /// [`Var::data`]. Reading it is one load, no lock (every operation's launch reads it).
    block: SetOnce<Block>,
    /// The variable whose block this one stands for ([`Var::alias`]), kept alive by it.
    alias_of: Option<Arc<Var>>,
    /// Autograd's "fresh gradient" flag of the data (`MXNDArrayGet/SetGradState`).
    pub fresh_grad: std::sync::atomic::AtomicBool,
}

/// Operations made ready by releasing a variable (usually none or one).
#[derive(Default)]
pub struct Granted(Vec<Arc<Opr>>);

impl Granted {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn into_vec(self) -> Vec<Arc<Opr>> {
        self.0
    }
}

impl Var {
    pub fn new() -> Arc<Self> {
        Arc::new(Var::default())
    }

    /// A variable whose data block is already allocated.
    pub fn with_block(block: Block) -> Arc<Self> {
        Arc::new(Var { block: SetOnce::with(block), ..Var::default() })
    }

    /// A second variable over `of`'s data block (allocated through `of`, kept alive by the
    /// alias): operations on one do not wait for operations on the other. For memory that an
    /// operation already holds and hands to code that schedules its own operations on it
    /// (custom operators' frontend callbacks).
    pub fn alias(of: &Arc<Var>) -> Arc<Self> {
        let root = of.alias_of.as_ref().unwrap_or(of);
        Arc::new(Var { alias_of: Some(root.clone()), ..Var::default() })
    }

    /// Whether `a` and `b` stand for one data block: the same variable, or aliases
    /// ([`Var::alias`]) of one root (or one the other's root).
    pub fn same_block(a: &Arc<Var>, b: &Arc<Var>) -> bool {
        let root = |v: &Arc<Var>| v.alias_of.clone().unwrap_or_else(|| v.clone());
        Arc::ptr_eq(&root(a), &root(b))
    }

    /// Whether this variable is an alias ([`Var::alias`]) of `other`'s data block.
    pub fn is_alias_of(&self, other: &Arc<Var>) -> bool {
        let root = other.alias_of.as_ref().unwrap_or(other);
        self.alias_of.as_ref().is_some_and(|a| Arc::ptr_eq(a, root))
    }

    /// The data block's address, allocating `bytes` on `ctx` at the first call. Every kernel
    /// launch asks, so the common case (an own block, already allocated) is inlined.
    #[inline]
    pub fn data(&self, bytes: usize, ctx: Context) -> Result<*mut u8> {
        if self.alias_of.is_none() {
            if let Some(b) = self.block.get() {
                return Ok(b.ptr());
            }
        }
        self.data_slow(bytes, ctx)
    }

    #[inline(never)]
    fn data_slow(&self, bytes: usize, ctx: Context) -> Result<*mut u8> {
        Ok(self.block(bytes, ctx)?.ptr())
    }

    /// The data block, allocating `bytes` on `ctx` at the first call (an alias's is its
    /// owner's).
    pub fn block(&self, bytes: usize, ctx: Context) -> Result<&Block> {
        if let Some(owner) = &self.alias_of {
            return owner.block(bytes, ctx);
        }
        // Two threads asking first: one allocates, the other waits for its block.
        self.block.get_or_try_init(|| Block::alloc(bytes, ctx))
    }

    /// Register a read; true when access is granted at once.
    pub(crate) fn append_read(&self, op: &Arc<Opr>) -> bool {
        let mut s = self.state.lock();
        if !s.running_write && s.queue.is_empty() {
            s.running_reads += 1;
            true
        } else {
            s.queue.push_back((op.clone(), false));
            false
        }
    }

    /// Register a write; true when access is granted at once.
    pub(crate) fn append_write(&self, op: &Arc<Opr>) -> bool {
        let mut s = self.state.lock();
        if !s.running_write && s.running_reads == 0 && s.queue.is_empty() {
            s.running_write = true;
            true
        } else {
            s.queue.push_back((op.clone(), true));
            false
        }
    }

    /// Take access now if nothing runs on or waits for the variable in a conflicting way;
    /// false (and no change) otherwise.
    pub(crate) fn try_acquire(&self, write: bool) -> bool {
        let mut s = self.state.lock();
        if s.running_write || !s.queue.is_empty() || (write && s.running_reads > 0) {
            return false;
        }
        if write {
            s.running_write = true;
        } else {
            s.running_reads += 1;
        }
        true
    }

    /// Release a read; grants the next write when this was the last running read.
    pub(crate) fn complete_read(&self, granted: &mut Granted) {
        let mut s = self.state.lock();
        s.running_reads -= 1;
        if s.running_reads == 0 && !s.running_write {
            if let Some((_, true)) = s.queue.front() {
                let (op, _) = s.queue.pop_front().expect("front exists");
                s.running_write = true;
                granted.0.push(op);
            }
        }
    }

    /// Release a write, leaving `error` as the variable's failure mark when given; grants the
    /// reads at the front of the queue, or else the next write.
    pub(crate) fn complete_write(&self, error: Option<&Arc<ErrorCell>>, granted: &mut Granted) {
        let mut s = self.state.lock();
        if let Some(e) = error {
            s.error = Some(e.clone());
        }
        s.running_write = false;
        while let Some((_, false)) = s.queue.front() {
            let (op, _) = s.queue.pop_front().expect("front exists");
            s.running_reads += 1;
            granted.0.push(op);
        }
        if s.running_reads == 0 {
            if let Some((_, true)) = s.queue.front() {
                let (op, _) = s.queue.pop_front().expect("front exists");
                s.running_write = true;
                granted.0.push(op);
            }
        }
    }

    /// Leave `error` as the variable's failure mark (a solo operation that wrote it failed).
    pub(crate) fn mark_failed(&self, error: &Arc<ErrorCell>) {
        self.state.lock().error = Some(error.clone());
    }

    /// The failure mark, if it is still set.
    pub fn failure(&self) -> Option<Arc<ErrorCell>> {
        let s = self.state.lock();
        s.error.as_ref().filter(|c| c.is_set()).cloned()
    }

    /// Take (and so clear) the failure, reporting it once.
    pub fn take_failure(&self) -> Option<Error> {
        let cell = self.state.lock().error.take()?;
        cell.take()
    }

    /// No operation runs on or waits for this variable.
    pub fn is_idle(&self) -> bool {
        let s = self.state.lock();
        s.running_reads == 0 && !s.running_write && s.queue.is_empty()
    }

    /// Where the scheduling state lives (for the layout test).
    #[cfg(test)]
    pub(crate) fn state_addr(&self) -> usize {
        &self.state as *const _ as usize
    }

    /// No write runs on or waits for this variable (reading it now would not wait).
    pub fn is_readable(&self) -> bool {
        let s = self.state.lock();
        !s.running_write && s.queue.iter().all(|(_, w)| !*w)
    }
}
