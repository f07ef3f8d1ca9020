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

/// Host memory, 64-byte aligned, not zeroed (as stock): from the global allocator, and blocks
/// of [`MAP_THRESHOLD`] bytes or more straight from the kernel.
pub struct CpuAllocator {
    pub ctx: Context,
}

/// Blocks this large are mapped with `mmap` rather than taken from the global allocator.
/// mimalloc (the global allocator) reserves large regions with `MAP_NORESERVE`, which the
/// kernel's overcommit check lets through whatever their size: a 4 TiB array was "allocated"
/// and the process was killed for memory while zeroing it. A plain private anonymous mapping
/// is checked against the memory the machine has, as stock's `posix_memalign` is, and a
/// refused one is an error. Arrays this large are rare and costly to fill, so the system
/// call costs nothing measurable.
pub const MAP_THRESHOLD: usize = 64 << 20;

impl Allocator for CpuAllocator {
    fn alloc(&self, size: usize) -> Result<NonNull<u8>> {
        let oom = || Error::mxnet(format!("out of memory: the system refused {size} bytes on {}", self.ctx));
        let layout = Layout::from_size_align(size.max(1), ALIGN)
            .map_err(|_| Error::value(format!("cannot allocate {size} bytes on {}: size too large", self.ctx)))?;
        if size >= MAP_THRESHOLD {
            // SAFETY: a new private anonymous mapping; no existing memory is touched.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(oom());
            }
            // Pages are 4 KiB or larger, so the mapping is 64-byte aligned.
            return NonNull::new(p.cast::<u8>()).ok_or_else(oom);
        }
        // SAFETY: the layout has a non-zero size.
        NonNull::new(unsafe { alloc(layout) }).ok_or_else(oom)
    }
    unsafe fn free(&self, ptr: NonNull<u8>, size: usize) {
        if size >= MAP_THRESHOLD {
            // SAFETY: per the trait's contract, mapped above with this size (sizes at or above
            // the threshold always are).
            unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
            return;
        }
        // SAFETY: per the trait's contract, allocated above with this layout.
        unsafe { dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(size.max(1), ALIGN)) }
    }
    fn ctx(&self) -> Context {
        self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large blocks are usable and given back; a block larger than the machine can hold is an
    /// error, not a process killed while filling it. The second half needs the kernel's
    /// default overcommit heuristic (mode 0) or strict accounting (2): with mode 1 every
    /// mapping succeeds, for stock's allocator too.
    #[test]
    fn large_blocks_are_mapped_and_impossible_ones_refused() {
        let a = CpuAllocator { ctx: Context::CPU };
        for size in [MAP_THRESHOLD - 64, MAP_THRESHOLD, MAP_THRESHOLD + 4096 + 3] {
            let p = a.alloc(size).unwrap();
            assert_eq!(p.as_ptr() as usize % ALIGN, 0);
            // SAFETY: `size` bytes were just allocated; touched at both ends, then freed.
            unsafe {
                p.as_ptr().write(1);
                p.as_ptr().add(size - 1).write(2);
                a.free(p, size);
            }
        }
        let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
        if mode.trim() == "1" {
            eprintln!("skipped the refusal check: vm.overcommit_memory is 1 (every mapping succeeds)");
            return;
        }
        let e = a.alloc(1 << 46).unwrap_err().to_string();
        assert!(e.starts_with("MXNetError: out of memory"), "{e}");
    }
}
