//! Allocators: where a pool gets memory from and gives it back to.
//!
//! Owns: the [`Allocator`] trait that pools sit on, [`CpuAllocator`] (64-byte aligned host
//! memory) and [`CudaAllocator`] (device memory, with the reserve rule of
//! `MXNET_GPU_MEM_POOL_RESERVE`).

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
    /// Whether the pool should release its cache before allocating `size` more bytes (a
    /// GPU whose free memory would fall below its reserve).
    fn wants_release(&self, _size: usize) -> bool {
        false
    }
}

/// Device memory of one GPU, from the CUDA driver.
pub struct CudaAllocator {
    pub ctx: Context,
    /// Percentage of the device's memory kept free of cached blocks
    /// (`MXNET_GPU_MEM_POOL_RESERVE`).
    pub reserve_percent: usize,
}

/// Whether allocating `size` bytes with `free` of `total` bytes free leaves less than
/// `reserve_percent` of the device free (stock: release the pool's cache first).
pub fn below_reserve(free: usize, total: usize, size: usize, reserve_percent: usize) -> bool {
    let reserve = (total as u128 * reserve_percent.min(100) as u128 / 100) as usize;
    free.saturating_sub(size) < reserve
}

impl Allocator for CudaAllocator {
    fn alloc(&self, size: usize) -> Result<NonNull<u8>> {
        let p = crate::cuda::malloc(self.ctx.dev_id, size)?;
        NonNull::new(p as usize as *mut u8)
            .ok_or_else(|| Error::internal(format!("cuMemAlloc returned address 0 on {}", self.ctx)))
    }
    unsafe fn free(&self, ptr: NonNull<u8>, _size: usize) {
        // SAFETY: per the trait's contract, from `alloc` above; a block is freed only when
        // the operations using it are done (they wait for their streams before finishing).
        unsafe { crate::cuda::free(self.ctx.dev_id, ptr.as_ptr() as usize as u64) }
    }
    fn ctx(&self) -> Context {
        self.ctx
    }
    fn wants_release(&self, size: usize) -> bool {
        crate::cuda::memory_info(self.ctx.dev_id)
            .is_ok_and(|(free, total)| below_reserve(free, total, size, self.reserve_percent))
    }
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

    #[test]
    fn gpu_reserve_arithmetic() {
        let gib = 1usize << 30;
        // 80 GiB card, 5% reserve = 4 GiB.
        assert!(!below_reserve(10 * gib, 80 * gib, 5 * gib, 5));
        assert!(below_reserve(10 * gib, 80 * gib, 7 * gib, 5));
        assert!(!below_reserve(gib, 80 * gib, 2 * gib, 0));
        assert!(below_reserve(gib, 80 * gib, gib, 100));
        assert!(below_reserve(gib, 80 * gib, 1, 1000)); // clamped to 100%
    }
}
