//! Temporary workspaces: stock's `ResourceRequest::kTempSpace`.
//!
//! Owns the per-context scratch blocks that operators declaring [`super::Resource::TempSpace`]
//! share: up to `MXNET_EXEC_NUM_TEMP` of them per context (seeds 000/001), handed out round
//! robin, each with an engine variable. An operator pushed with a workspace lists its variable
//! as written, so the operators sharing one run one at a time; the block grows to the largest
//! request and is kept, so a training loop allocates its scratch memory once instead of every
//! kernel allocating and freeing its own (which kept the allocator's high-water mark up).

use crate::config;
use crate::context::Context;
use crate::engine::Var;
use crate::error::Result;
use crate::storage::Block;
use crate::sync::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// One shared workspace.
pub struct TempSpace {
    var: Arc<Var>,
    block: Mutex<Option<Block>>,
    ctx: Context,
}

/// Per context: its workspaces and the index of the next one to hand out.
type Spaces = HashMap<Context, (Vec<Arc<TempSpace>>, usize)>;

/// The workspaces of every context, and the next one each hands out.
fn spaces() -> &'static Mutex<Spaces> {
    static S: OnceLock<Mutex<Spaces>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// A workspace of `ctx` for one operation; the caller pushes the operation with
/// [`TempSpace::var`] written.
pub fn request(ctx: Context) -> Result<Arc<TempSpace>> {
    let n =
        config::global().get_int("MXNET_EXEC_NUM_TEMP", "a temporary workspace request")?.unwrap_or(1).max(1) as usize;
    let mut all = spaces().lock();
    let (list, next) = all.entry(ctx).or_default();
    while list.len() < n {
        list.push(Arc::new(TempSpace { var: Var::new(), block: Mutex::new(None), ctx }));
    }
    // Fewer wanted than exist (the setting went down): use the first n only.
    let space = list[*next % n].clone();
    *next = (*next + 1) % n;
    Ok(space)
}

/// Bytes held by the workspaces of `ctx`.
#[cfg(test)]
fn held_bytes(ctx: Context) -> usize {
    spaces().lock().get(&ctx).map_or(0, |(l, _)| l.iter().map(|s| s.block.lock().as_ref().map_or(0, Block::size)).sum())
}

impl TempSpace {
    pub fn var(&self) -> &Arc<Var> {
        &self.var
    }

    /// At least `bytes` of scratch memory (64-byte aligned, contents undefined), held until
    /// the returned guard drops. Only the operation that was pushed with this workspace's
    /// variable may call it, from its kernel.
    pub fn get(&self, bytes: usize) -> Result<Scratch<'_>> {
        let mut b = self.block.lock();
        if b.as_ref().is_none_or(|blk| blk.size() < bytes) {
            // Free the smaller block first so the pool can reuse its memory.
            *b = None;
            let blk = Block::alloc(bytes, self.ctx)?;
            // Zeroed once, so that every byte a kernel may view (`Scratch::as_mut`) is
            // initialized, whatever earlier kernels left there.
            // SAFETY: the block was just allocated with `blk.size()` bytes and is seen by
            // nothing else yet.
            unsafe { std::ptr::write_bytes(blk.ptr(), 0, blk.size()) };
            *b = Some(blk);
        }
        Ok(Scratch { inner: Inner::Shared(b), bytes })
    }
}

enum Inner<'a> {
    Shared(MutexGuard<'a, Option<Block>>),
    /// A kernel called outside the engine (tests) gets its own memory.
    Owned(Vec<u128>),
}

/// Scratch memory for one kernel call.
pub struct Scratch<'a> {
    inner: Inner<'a>,
    bytes: usize,
}

impl Scratch<'_> {
    /// Memory of its own for a kernel run without a shared workspace.
    pub fn owned(bytes: usize) -> Scratch<'static> {
        Scratch { inner: Inner::Owned(vec![0u128; bytes.div_ceil(16)]), bytes }
    }

    /// The start of the memory (`bytes` long, 16-byte aligned at least).
    pub fn ptr(&mut self) -> *mut u8 {
        match &mut self.inner {
            Inner::Shared(b) => b.as_ref().map_or(std::ptr::null_mut(), Block::ptr),
            Inner::Owned(v) => v.as_mut_ptr().cast(),
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The memory as elements of `T` (as many whole ones as fit), for as long as `&mut self`
    /// is borrowed.
    #[allow(clippy::should_implement_trait)] // generic over the element type: not `AsMut`
    pub fn as_mut<T: crate::op::tensor::Elem>(&mut self) -> &mut [T] {
        let n = self.bytes / std::mem::size_of::<T>();
        let p = self.ptr();
        if n == 0 || p.is_null() {
            return &mut [];
        }
        assert_eq!(p as usize % std::mem::align_of::<T>(), 0, "scratch memory misaligned");
        // SAFETY: the memory holds at least `bytes` initialized bytes (a shared block is zeroed
        // when allocated, an owned one is a zeroed vector), aligned (checked above), and is
        // this guard's alone (a shared block's mutex is held) for the borrow of `self`;
        // every bit pattern is a value of an `Elem` type (the trait's safety contract).
        unsafe { std::slice::from_raw_parts_mut(p.cast::<T>(), n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_are_shared_round_robin_and_grow_to_the_largest_request() {
        let ctx = Context { dev_type: crate::context::DevType::Cpu, dev_id: 97 };
        let a = request(ctx).unwrap();
        let b = request(ctx).unwrap();
        // MXNET_EXEC_NUM_TEMP defaults to 1: one workspace per context.
        assert!(Arc::ptr_eq(&a, &b));
        let p1 = a.get(1000).unwrap().ptr();
        assert!(!p1.is_null() && p1 as usize % 64 == 0);
        assert!(held_bytes(ctx) >= 1000);
        a.get(10).unwrap();
        assert!(held_bytes(ctx) >= 1000, "a smaller request keeps the block");
        a.get(1 << 20).unwrap();
        assert!(held_bytes(ctx) >= 1 << 20);
        let mut s = Scratch::owned(100);
        assert!(s.bytes() == 100 && !s.ptr().is_null());

        // MXNET_EXEC_NUM_TEMP=2: two workspaces, alternating (another context, so the one
        // above is untouched; no other test reads this variable).
        let ctx2 = Context { dev_type: crate::context::DevType::Cpu, dev_id: 98 };
        config::global().set_env("MXNET_EXEC_NUM_TEMP", Some("2")).unwrap();
        let (c, d, e) = (request(ctx2).unwrap(), request(ctx2).unwrap(), request(ctx2).unwrap());
        config::global().set_env("MXNET_EXEC_NUM_TEMP", None).unwrap();
        assert!(!Arc::ptr_eq(&c, &d) && Arc::ptr_eq(&c, &e));
        assert!(!Arc::ptr_eq(c.var(), d.var()));
        // A bad value is refused: tests/python/test_graph_memory.py (through the library).
    }
}
