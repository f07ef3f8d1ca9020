//! Storage: blocks of device memory.
//!
//! Owns: [`Block`], a 64-byte aligned CPU allocation that frees itself, and the allocation
//! error that names the context and the size. The pooled storage manager (bucketing
//! policies over an allocator trait, statistics) builds on this in the storage issue.

use crate::context::Context;
use crate::error::{Error, Result};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every CPU block (a cache line, and enough for any SIMD load).
pub const ALIGN: usize = 64;

/// A block of memory on one context.
pub struct Block {
    ptr: NonNull<u8>,
    size: usize,
    ctx: Context,
}

// SAFETY: a Block owns its memory exclusively; who may touch the bytes when is decided by the
// engine's variable protocol, not by the Block.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    /// Allocate `size` zeroed bytes on `ctx` (host memory only in this build).
    pub fn alloc(size: usize, ctx: Context) -> Result<Block> {
        ctx.check_available()?;
        if size == 0 {
            return Ok(Block { ptr: NonNull::<[u8; ALIGN]>::dangling().cast(), size, ctx });
        }
        let layout = Layout::from_size_align(size, ALIGN)
            .map_err(|_| Error::value(format!("cannot allocate {size} bytes on {ctx}: size too large")))?;
        // SAFETY: layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        NonNull::new(p).map(|ptr| Block { ptr, size, ctx }).ok_or_else(|| {
            Error::mxnet(format!("out of memory: cannot allocate {size} bytes on {ctx}"))
        })
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn ctx(&self) -> Context {
        self.ctx
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.size > 0 {
            // SAFETY: allocated in `alloc` with this size and alignment.
            unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.size, ALIGN)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_checked() {
        let b = Block::alloc(1000, Context::CPU).unwrap();
        assert_eq!(b.ptr() as usize % ALIGN, 0);
        // SAFETY: the block holds 1000 bytes.
        assert!(unsafe { std::slice::from_raw_parts(b.ptr(), 1000) }.iter().all(|&x| x == 0));
        assert!(Block::alloc(0, Context::CPU).unwrap().size() == 0);
        assert!(Block::alloc(usize::MAX - 10, Context::CPU).is_err());
        assert!(Block::alloc(8, Context::gpu(0)).is_err());
    }
}
