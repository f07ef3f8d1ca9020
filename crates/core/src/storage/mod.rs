//! Storage: device memory for arrays, through per-context pools.
//!
//! Owns: the storage manager (one [`pool::Pool`] per context, created at first use with the
//! bucketing policy from the configuration), [`Block`] (a pooled allocation that returns to
//! its pool when dropped), `MXStorageEmptyCache` and the per-context statistics. Pools sit on
//! the [`alloc::Allocator`] trait; CPU memory comes from [`alloc::CpuAllocator`], GPU memory
//! from [`alloc::CudaAllocator`]. Blocks of the `cpu_shared` context are shared-memory files
//! ([`shared::Segment`]), one per block, outside the pools.

pub mod alloc;
pub mod events;
pub mod pool;
pub mod shared;

pub use alloc::ALIGN;

use crate::config;
use crate::context::{Context, DevType};
use crate::error::Result;
use crate::sync::Mutex;
use pool::{Bucketing, Pool};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::OnceLock;

/// A block of memory on one context, returned to its pool when dropped; or memory lent by
/// another library (DLPack), handed back to it when dropped.
pub struct Block {
    ptr: NonNull<u8>,
    size: usize,
    from: Origin,
    ctx: Context,
}

/// Where a block's memory comes from. Two variants, so that the pool's reference holds the
/// tag and a block stays five words.
enum Origin {
    /// A pool, with the bucket size.
    Pool(&'static Pool, usize),
    /// Memory from outside the pools (`None`: a zero-sized block of nobody's).
    Outside(Option<Box<Outside>>),
}

enum Outside {
    /// Its owner's, given back by the function when the block is dropped (DLPack).
    Lent(Release),
    /// A shared-memory file, mapped at the block's address for its size.
    Shared(shared::Segment),
}

/// What a lent block calls when it is dropped (see [`Block::lent`]).
pub type Release = Box<dyn FnOnce() + Send>;

// SAFETY: a Block owns its memory exclusively; who may touch the bytes when is decided by the
// engine's variable protocol, not by the Block. Lent memory (DLPack) is the Block's under
// DLPack's contract until the release function runs: the lender gave access up (the stock
// frontend makes the NumPy array read-only; a tensor of this library's own comes back as its
// array, under its variable, see `ndarray::dlpack::from_dlpack`). The release function is
// `Send`.
unsafe impl Send for Block {}
// SAFETY: as for `Send`; a shared Block gives no access to its release function.
unsafe impl Sync for Block {}

impl Block {
    /// At least `size` bytes on `ctx`, 64-byte aligned, not zeroed (shared memory: zeroed,
    /// page-aligned).
    pub fn alloc(size: usize, ctx: Context) -> Result<Block> {
        ctx.check_available()?;
        if ctx.dev_type == DevType::CpuShared {
            // Even an empty one has a file, so that its handle can be sent.
            let (ptr, seg) = shared::Segment::create(size)?;
            return Ok(Block { ptr, size, from: Origin::Outside(Some(Box::new(Outside::Shared(seg)))), ctx });
        }
        if size == 0 {
            return Ok(Block {
                ptr: NonNull::<[u8; ALIGN]>::dangling().cast(),
                size,
                from: Origin::Outside(None),
                ctx,
            });
        }
        let pool = manager().pool(ctx)?;
        let (ptr, bucket) = pool.alloc(size)?;
        events::emit(|| events::StorageEvent::Alloc { ctx, bytes: bucket, stats: pool.stats() });
        Ok(Block { ptr, size, from: Origin::Pool(pool, bucket), ctx })
    }

    /// `size` bytes at `ptr` on `ctx` that their owner lends (DLPack): `release` runs once,
    /// when the block is dropped, on whichever thread drops it. A NULL `ptr` is refused
    /// unless `size` is 0.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `size` bytes on `ctx` until `release` is
    /// called, and nothing else may free it before.
    pub unsafe fn lent(ptr: *mut u8, size: usize, ctx: Context, release: Release) -> Result<Block> {
        ctx.check_available()?;
        let ptr = match NonNull::new(ptr) {
            Some(p) => p,
            None if size == 0 => NonNull::<[u8; ALIGN]>::dangling().cast(),
            None => return Err(crate::error::Error::value(format!("lent memory of {size} bytes at NULL"))),
        };
        Ok(Block { ptr, size, from: Origin::Outside(Some(Box::new(Outside::Lent(release)))), ctx })
    }

    /// `size` bytes of the shared-memory file `fd` that process `pid` made (the handle
    /// [`Block::shared_handle`] gave there), on `cpu_shared(dev_id)`. On success the block owns
    /// `fd` and closes it when dropped; on failure the caller keeps it.
    ///
    /// # Safety
    /// Nobody else may close `fd` once this returns `Ok`.
    pub unsafe fn from_shared(pid: i32, fd: i32, size: usize, dev_id: i32) -> Result<Block> {
        let ctx = Context::new(DevType::CpuShared, dev_id)?;
        // SAFETY: per this function's contract.
        let (ptr, seg) = unsafe { shared::Segment::adopt(pid, fd, size)? };
        Ok(Block { ptr, size, from: Origin::Outside(Some(Box::new(Outside::Shared(seg)))), ctx })
    }

    /// `(pid, fd)` of a shared-memory block; `None` for any other.
    pub fn shared_handle(&self) -> Option<(i32, i32)> {
        match &self.from {
            Origin::Outside(Some(o)) => match &**o {
                Outside::Shared(seg) => Some(seg.handle()),
                Outside::Lent(_) => None,
            },
            _ => None,
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The requested size.
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn ctx(&self) -> Context {
        self.ctx
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        match &mut self.from {
            Origin::Pool(pool, bucket) => {
                let (pool, bucket) = (*pool, *bucket);
                // SAFETY: allocated from this pool with this bucket, freed once (here).
                unsafe { pool.free(self.ptr, bucket) }
                events::emit(|| events::StorageEvent::Free { ctx: self.ctx, bytes: bucket, stats: pool.stats() });
            }
            Origin::Outside(outside) => match outside.take().map(|o| *o) {
                Some(Outside::Lent(release)) => release(),
                // SAFETY: the segment's mapping is this block's address and size; its
                // descriptor closes when the segment is dropped, after this.
                Some(Outside::Shared(seg)) => unsafe { seg.unmap(self.ptr, self.size) },
                None => {}
            },
        }
    }
}

/// The per-context pools.
pub struct Manager {
    pools: Mutex<BTreeMap<Context, &'static Pool>>,
    /// Host contexts with ids below [`FAST_IDS`], by (kind, id): see [`Manager::fast_slot`].
    fast: [OnceLock<&'static Pool>; 3 * FAST_IDS],
}

const FAST_IDS: usize = 8;

/// The process-wide storage manager.
pub fn manager() -> &'static Manager {
    static M: OnceLock<Manager> = OnceLock::new();
    M.get_or_init(|| Manager { pools: Mutex::new(BTreeMap::new()), fast: std::array::from_fn(|_| OnceLock::new()) })
}

/// The pool policy for a device type, from the configuration (read once per context).
fn policy_for(dev: DevType) -> Result<Bucketing> {
    let reg = config::global();
    let (ty, cutoff, round) = if dev == DevType::Gpu {
        ("MXNET_GPU_MEM_POOL_TYPE", "MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF", "MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE")
    } else {
        ("MXNET_CPU_MEM_POOL_TYPE", "MXNET_CPU_MEM_POOL_ROUND_LINEAR_CUTOFF", "MXNET_CPU_MEM_LARGE_ALLOC_ROUND_SIZE")
    };
    const BY: &str = "storage pool start";
    Ok(match reg.get_str(ty, BY)?.as_deref() {
        Some("Round") => Bucketing::Round { cutoff: reg.get_int(cutoff, BY)?.unwrap_or(24) as u32 },
        Some("Unpooled") => Bucketing::Unpooled,
        _ => Bucketing::Naive { large_round: reg.get_int(round, BY)?.unwrap_or(2 << 20) as usize },
    })
}

impl Manager {
    /// The pool of `ctx`, created at first use.
    pub fn pool(&self, ctx: Context) -> Result<&'static Pool> {
        let fast = self.fast_slot(ctx);
        if let Some(p) = fast.and_then(OnceLock::get) {
            return Ok(p);
        }
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get(&ctx) {
            return Ok(p);
        }
        ctx.check_available()?;
        let allocator: Box<dyn alloc::Allocator> = if ctx.dev_type == DevType::Gpu {
            let reserve = config::global().get_int("MXNET_GPU_MEM_POOL_RESERVE", "storage pool start")?.unwrap_or(5);
            Box::new(alloc::CudaAllocator { ctx, reserve_percent: reserve.clamp(0, 100) as usize })
        } else {
            Box::new(alloc::CpuAllocator { ctx })
        };
        let pool: &'static Pool = Box::leak(Box::new(Pool::new(policy_for(ctx.dev_type)?, allocator)));
        pools.insert(ctx, pool);
        if let Some(slot) = fast {
            let _ = slot.set(pool);
        }
        Ok(pool)
    }

    /// The lock-free slot of a host context with a small device id (every allocation looks
    /// its pool up; the map behind the lock holds every context).
    fn fast_slot(&self, ctx: Context) -> Option<&OnceLock<&'static Pool>> {
        let kind = match ctx.dev_type {
            DevType::Cpu => 0,
            DevType::CpuPinned => 1,
            DevType::CpuShared => 2,
            DevType::Gpu => return None,
        };
        let id = usize::try_from(ctx.dev_id).ok().filter(|&i| i < FAST_IDS)?;
        self.fast.get(kind * FAST_IDS + id)
    }

    /// `MXStorageEmptyCache`: return the cached blocks of `ctx` to the system; returns the
    /// bytes released (0 for a context never used).
    pub fn empty_cache(&self, ctx: Context) -> Result<usize> {
        ctx.check_available()?;
        let pool = self.pools.lock().get(&ctx).copied();
        Ok(pool.map_or(0, |p| p.empty_cache()))
    }

    /// Statistics of every context used so far, keyed by `cpu(0)` etc.
    pub fn stats_json(&self) -> serde_json::Value {
        let pools = self.pools.lock();
        let mut out = serde_json::Map::new();
        for (ctx, pool) in pools.iter() {
            let mut v = serde_json::to_value(pool.stats()).unwrap_or_default();
            v["pool_type"] = serde_json::json!(pool.policy().name());
            out.insert(ctx.to_string(), v);
        }
        serde_json::Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_from_the_context_pool_and_go_back() {
        let b = Block::alloc(1000, Context::CPU).unwrap();
        assert_eq!(b.ptr() as usize % ALIGN, 0);
        assert_eq!(b.size(), 1000);
        let before = manager().pool(Context::CPU).unwrap().stats();
        drop(b);
        let after = manager().pool(Context::CPU).unwrap().stats();
        assert!(after.bytes_cached >= 1000 || after.bytes_in_use < before.bytes_in_use);
        assert_eq!(Block::alloc(0, Context::CPU).unwrap().size(), 0);
        assert!(Block::alloc(usize::MAX - 10, Context::CPU).is_err());
        assert!(Block::alloc(8, Context::gpu(4096)).is_err());
        assert!(manager().stats_json()["cpu(0)"]["allocations"].as_u64().unwrap() >= 1);
    }

    #[test]
    fn lent_blocks_give_their_memory_back_once_when_dropped() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let mut mem = vec![7u8; 32];
        let released = Arc::new(AtomicUsize::new(0));
        let r = released.clone();
        // SAFETY: `mem` outlives the block, which is dropped below.
        let b = unsafe {
            Block::lent(mem.as_mut_ptr(), 32, Context::CPU, Box::new(move || _ = r.fetch_add(1, Ordering::SeqCst)))
        }
        .unwrap();
        assert_eq!((b.ptr(), b.size()), (mem.as_mut_ptr(), 32));
        assert_eq!(released.load(Ordering::SeqCst), 0);
        drop(b);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // NULL only for nothing; a device this machine lacks is refused (nothing released).
        // SAFETY: nothing is read through these.
        unsafe {
            assert!(Block::lent(std::ptr::null_mut(), 0, Context::CPU, Box::new(|| {})).is_ok());
            assert!(Block::lent(std::ptr::null_mut(), 4, Context::CPU, Box::new(|| {})).is_err());
            assert!(Block::lent(mem.as_mut_ptr(), 4, Context::gpu(4096), Box::new(|| {})).is_err());
        }
        // The variable holding a block keeps its allocation size (the engine test checks
        // the variable's).
        assert_eq!(std::mem::size_of::<Block>(), 40);
    }
}
