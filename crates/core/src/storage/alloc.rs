//! Allocators: where a pool gets memory from and gives it back to.
//!
//! Owns: the [`Allocator`] trait that pools sit on (a CUDA allocator implements it later
//! without touching pool code) and [`CpuAllocator`], 64-byte aligned host memory.

use crate::context::Context;
use crate::error::{Error, Result};
use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every CPU block (a cache line, and enough for any SIMD load).
pub const ALIGN: usize = 64;

/// A source of raw memory for one context.
pub trait Allocator: Send + Sync {
    /// `size` bytes (> 0), or an error (out of memory is an error, never an abort).
    fn alloc(&self, size: usize) -> Result<NonNull<u8>>;
    /// Give back a block from [`Allocator::alloc`] with the same size.
    ///
    /// # Safety
    /// `ptr` must come from `alloc(size)` of this allocator and not be used afterwards.
    unsafe fn free(&self, ptr: NonNull<u8>, size: usize);
    fn ctx(&self) -> Context;
}

/// Host memory from the global allocator, 64-byte aligned, not zeroed (as stock).
pub struct CpuAllocator {
    pub ctx: Context,
}

impl Allocator for CpuAllocator {
    fn alloc(&self, size: usize) -> Result<NonNull<u8>> {
        let layout = Layout::from_size_align(size.max(1), ALIGN)
            .map_err(|_| Error::value(format!("cannot allocate {size} bytes on {}: size too large", self.ctx)))?;
        // SAFETY: the layout has a non-zero size.
        NonNull::new(unsafe { alloc(layout) })
            .ok_or_else(|| Error::mxnet(format!("out of memory: the system refused {size} bytes on {}", self.ctx)))
    }
    unsafe fn free(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: per the trait's contract, allocated above with this layout.
        unsafe { dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(size.max(1), ALIGN)) }
    }
    fn ctx(&self) -> Context {
        self.ctx
    }
}
