//! Memory pools: one pool type, parameterised by its bucketing policy.
//!
//! Owns: [`Bucketing`] (the seeds' rounding rules: `Naive`, `Round`, `Unpooled`), [`Pool`]
//! (cached free blocks per bucket size over an [`Allocator`]), the out-of-memory retry
//! (release the cache, try once more, then fail with the pool's figures), the release of the
//! cache before an allocation the allocator says would cut into its reserve, and
//! [`PoolStats`].

use super::alloc::Allocator;
use crate::error::{Error, Result};
use crate::sync::SpinLock;
use serde::Serialize;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;

/// How requested sizes map to cached block sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucketing {
    /// Exact sizes, cached and reused for the same size; sizes above `large_round` are
    /// rounded up to a multiple of it (`MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE`).
    Naive { large_round: usize },
    /// Below 2^`cutoff` round up to a power of two, above it to a multiple of 2^`cutoff`
    /// (`MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF`).
    Round { cutoff: u32 },
    /// No caching: every free returns memory to the allocator.
    Unpooled,
}

impl Bucketing {
    pub fn name(self) -> &'static str {
        match self {
            Bucketing::Naive { .. } => "Naive",
            Bucketing::Round { .. } => "Round",
            Bucketing::Unpooled => "Unpooled",
        }
    }

    /// The block size that serves a request of `size` bytes (None: overflow).
    pub fn bucket(self, size: usize) -> Option<usize> {
        match self {
            Bucketing::Unpooled => Some(size),
            Bucketing::Naive { large_round } => {
                if large_round > 1 && size > large_round {
                    size.div_ceil(large_round).checked_mul(large_round)
                } else {
                    Some(size)
                }
            }
            Bucketing::Round { cutoff } => {
                let linear = 1usize.checked_shl(cutoff)?;
                if size <= linear {
                    size.max(1).checked_next_power_of_two()
                } else {
                    size.div_ceil(linear).checked_mul(linear)
                }
            }
        }
    }
}

/// A pool's figures, per context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// Bytes handed out and not yet freed (bucket sizes).
    pub bytes_in_use: usize,
    /// Bytes held in the cache, ready for reuse.
    pub bytes_cached: usize,
    /// Highest `bytes_in_use` so far.
    pub peak_bytes_in_use: usize,
    /// Blocks handed out.
    pub allocations: u64,
    /// Of those, served from the cache.
    pub cache_hits: u64,
    /// Blocks obtained from the allocator.
    pub allocator_calls: u64,
    /// Times the cache was released to retry a failed allocation.
    pub oom_retries: u64,
}

struct State {
    free: HashMap<usize, Vec<NonNull<u8>>, BuildHasherDefault<SizeHasher>>,
    stats: PoolStats,
}

/// Hashes a block size with one multiplication (SipHash would dominate a cached allocation).
#[derive(Default)]
struct SizeHasher(u64);

impl Hasher for SizeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9e3779b97f4a7c15);
    }
}

// SAFETY: the cached pointers are owned by the pool and only handed out under its lock.
unsafe impl Send for State {}

/// A memory pool for one context.
pub struct Pool {
    policy: Bucketing,
    allocator: Box<dyn Allocator>,
    state: SpinLock<State>,
}

impl Pool {
    pub fn new(policy: Bucketing, allocator: Box<dyn Allocator>) -> Self {
        Pool {
            policy,
            allocator,
            state: SpinLock::new(State { free: HashMap::default(), stats: PoolStats::default() }),
        }
    }

    pub fn policy(&self) -> Bucketing {
        self.policy
    }

    /// A block of at least `size` bytes; returns its address and its bucket size (which
    /// must be given back to [`Pool::free`]).
    pub fn alloc(&self, size: usize) -> Result<(NonNull<u8>, usize)> {
        let ctx = self.allocator.ctx();
        let bucket = self
            .policy
            .bucket(size)
            .ok_or_else(|| Error::value(format!("cannot allocate {size} bytes on {ctx}: size too large")))?;
        if self.policy != Bucketing::Unpooled {
            let mut st = self.state.lock();
            if let Some(p) = st.free.get_mut(&bucket).and_then(Vec::pop) {
                st.stats.bytes_cached -= bucket;
                st.stats.cache_hits += 1;
                Self::handed_out(&mut st.stats, bucket);
                return Ok((p, bucket));
            }
        }
        if self.allocator.wants_release(bucket) {
            // Below the device's reserve (`MXNET_GPU_MEM_POOL_RESERVE`): give the cache back
            // first, as stock does.
            self.empty_cache();
        }
        let p = match self.allocator.alloc(bucket) {
            Ok(p) => p,
            Err(first) => {
                // Release every cached block, then try once more.
                let released = self.empty_cache();
                self.state.lock().stats.oom_retries += 1;
                self.allocator.alloc(bucket).map_err(|_| {
                    let st = self.state.lock().stats;
                    Error::mxnet(format!(
                        "out of memory on {ctx}: cannot allocate {size} bytes (block of {bucket}); \
                         pool {}: {} bytes in use, peak {}, {} bytes released from the cache \
                         before retrying; first failure: {}",
                        self.policy.name(),
                        st.bytes_in_use,
                        st.peak_bytes_in_use,
                        released,
                        first.message()
                    ))
                })?
            }
        };
        let mut st = self.state.lock();
        st.stats.allocator_calls += 1;
        Self::handed_out(&mut st.stats, bucket);
        Ok((p, bucket))
    }

    fn handed_out(stats: &mut PoolStats, bucket: usize) {
        stats.allocations += 1;
        stats.bytes_in_use += bucket;
        stats.peak_bytes_in_use = stats.peak_bytes_in_use.max(stats.bytes_in_use);
    }

    /// Give a block back (to the cache, or to the allocator when unpooled).
    ///
    /// # Safety
    /// `ptr` and `bucket` must come from one [`Pool::alloc`] of this pool, freed once.
    pub unsafe fn free(&self, ptr: NonNull<u8>, bucket: usize) {
        let mut st = self.state.lock();
        st.stats.bytes_in_use -= bucket;
        if self.policy == Bucketing::Unpooled {
            drop(st);
            // SAFETY: per this function's contract.
            unsafe { self.allocator.free(ptr, bucket) };
        } else {
            st.stats.bytes_cached += bucket;
            st.free.entry(bucket).or_default().push(ptr);
        }
    }

    /// Return every cached block to the allocator; returns the bytes released.
    pub fn empty_cache(&self) -> usize {
        let cached: Vec<(usize, Vec<NonNull<u8>>)> = {
            let mut st = self.state.lock();
            st.stats.bytes_cached = 0;
            st.free.drain().collect()
        };
        let mut released = 0;
        for (bucket, ptrs) in cached {
            for p in ptrs {
                // SAFETY: cached blocks came from this allocator with this bucket size.
                unsafe { self.allocator.free(p, bucket) };
                released += bucket;
            }
        }
        released
    }

    pub fn stats(&self) -> PoolStats {
        self.state.lock().stats
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.empty_cache();
    }
}

#[cfg(test)]
mod tests {
    use super::super::alloc::CpuAllocator;
    use super::*;
    use crate::context::Context;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn round_policy_follows_the_seed() {
        // Seed 001: below 2^T round to the smallest power of two that holds the size, above
        // it to the next multiple of 2^T (T = 24 by default: 16 MiB).
        let r = Bucketing::Round { cutoff: 24 };
        let mib = 1usize << 20;
        for (size, want) in [
            (0, 1),
            (1, 1),
            (3, 4),
            (4096, 4096),
            (4097, 8192),
            (mib + 1, 2 * mib),
            (16 * mib, 16 * mib),
            (16 * mib + 1, 32 * mib),
            (40 * mib, 48 * mib),
            (48 * mib, 48 * mib),
        ] {
            assert_eq!(r.bucket(size), Some(want), "size {size}");
        }
        assert_eq!(Bucketing::Round { cutoff: 10 }.bucket(3000), Some(3072));
        assert_eq!(r.bucket(usize::MAX), None);
    }

    #[test]
    fn naive_policy_follows_the_seed() {
        // Exact sizes; above MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE a multiple of it; 1 disables.
        let n = Bucketing::Naive { large_round: 2 * 1024 * 1024 };
        assert_eq!(n.bucket(1000), Some(1000));
        assert_eq!(n.bucket(2 * 1024 * 1024), Some(2 * 1024 * 1024));
        assert_eq!(n.bucket(2 * 1024 * 1024 + 1), Some(4 * 1024 * 1024));
        assert_eq!(Bucketing::Naive { large_round: 1 }.bucket(12345), Some(12345));
        assert_eq!(Bucketing::Unpooled.bucket(777), Some(777));
    }

    fn cpu_pool(policy: Bucketing) -> Pool {
        Pool::new(policy, Box::new(CpuAllocator { ctx: Context::CPU }))
    }

    #[test]
    fn reuse_release_and_stats() {
        let pool = cpu_pool(Bucketing::Round { cutoff: 24 });
        let (a, ba) = pool.alloc(3000).unwrap();
        assert_eq!(ba, 4096);
        assert_eq!(a.as_ptr() as usize % super::super::alloc::ALIGN, 0);
        // SAFETY: freeing what was allocated, once.
        unsafe { pool.free(a, ba) };
        let (b, bb) = pool.alloc(4000).unwrap(); // same bucket: reused
        assert_eq!((b, bb), (a, 4096));
        let s = pool.stats();
        assert_eq!((s.allocations, s.cache_hits, s.allocator_calls), (2, 1, 1));
        assert_eq!((s.bytes_in_use, s.bytes_cached, s.peak_bytes_in_use), (4096, 0, 4096));
        // SAFETY: as above.
        unsafe { pool.free(b, bb) };
        assert_eq!(pool.stats().bytes_cached, 4096);
        assert_eq!(pool.empty_cache(), 4096);
        assert_eq!(pool.stats().bytes_cached, 0);

        let unpooled = cpu_pool(Bucketing::Unpooled);
        let (p, s) = unpooled.alloc(100).unwrap();
        // SAFETY: as above.
        unsafe { unpooled.free(p, s) };
        assert_eq!(unpooled.stats().bytes_cached, 0);
    }

    /// Fails while `fail` is set, counting calls.
    struct Flaky {
        inner: CpuAllocator,
        fail_next: AtomicUsize,
        fail_always: AtomicBool,
        frees: AtomicUsize,
    }
    impl Allocator for Arc<Flaky> {
        fn alloc(&self, size: usize) -> Result<NonNull<u8>> {
            if self.fail_always.load(Ordering::SeqCst)
                || self.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
            {
                return Err(Error::mxnet("injected failure"));
            }
            self.inner.alloc(size)
        }
        unsafe fn free(&self, ptr: NonNull<u8>, size: usize) {
            self.frees.fetch_add(1, Ordering::SeqCst);
            // SAFETY: forwarded.
            unsafe { self.inner.free(ptr, size) }
        }
        fn ctx(&self) -> Context {
            self.inner.ctx
        }
    }

    #[test]
    fn out_of_memory_releases_the_cache_retries_once_then_fails_clearly() {
        let flaky = Arc::new(Flaky {
            inner: CpuAllocator { ctx: Context::CPU },
            fail_next: AtomicUsize::new(0),
            fail_always: AtomicBool::new(false),
            frees: AtomicUsize::new(0),
        });
        let pool = Pool::new(Bucketing::Naive { large_round: 1 }, Box::new(flaky.clone()));
        let (a, sa) = pool.alloc(100).unwrap();
        // SAFETY: freeing what was allocated, once.
        unsafe { pool.free(a, sa) };
        // One failure: the cached block is released and the retry succeeds.
        flaky.fail_next.store(1, Ordering::SeqCst);
        let (b, sb) = pool.alloc(200).unwrap();
        assert_eq!(flaky.frees.load(Ordering::SeqCst), 1);
        assert_eq!(pool.stats().oom_retries, 1);
        // Always failing: a clear error with the context, the size and the pool's figures.
        flaky.fail_always.store(true, Ordering::SeqCst);
        let e = pool.alloc(300).unwrap_err().to_string();
        assert!(e.starts_with("MXNetError: out of memory on cpu(0): cannot allocate 300 bytes"), "{e}");
        assert!(e.contains("200 bytes in use") && e.contains("injected failure"), "{e}");
        // The pool still works once memory is available again.
        flaky.fail_always.store(false, Ordering::SeqCst);
        let (c, sc) = pool.alloc(300).unwrap();
        // SAFETY: as above.
        unsafe {
            pool.free(b, sb);
            pool.free(c, sc);
        }
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[test]
    fn eight_threads_allocate_and_free_without_loss_or_overlap() {
        let pool = Arc::new(cpu_pool(Bucketing::Round { cutoff: 12 }));
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let pool = pool.clone();
                s.spawn(move || {
                    for round in 0..200usize {
                        let mut held = Vec::new();
                        for k in 0..8usize {
                            let size = 1 + (round * 37 + k * 101 + t as usize * 7) % 9000;
                            let (p, b) = pool.alloc(size).unwrap();
                            // SAFETY: the block has at least `size` bytes and is ours alone.
                            unsafe { std::ptr::write_bytes(p.as_ptr(), t, size) };
                            held.push((p, b, size));
                        }
                        for (p, b, size) in held {
                            // SAFETY: as above; nobody else wrote our block meanwhile.
                            let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
                            assert!(bytes.iter().all(|&x| x == t), "another thread wrote into our block");
                            // SAFETY: freeing what was allocated, once.
                            unsafe { pool.free(p, b) };
                        }
                    }
                });
            }
        });
        let s = pool.stats();
        assert_eq!(s.bytes_in_use, 0);
        assert_eq!(s.allocations, 8 * 200 * 8);
        assert!(s.cache_hits > s.allocations / 2, "the cache should serve most requests: {s:?}");
    }

    /// A benchmark, not a check: a cached allocate + free of one block.
    /// `cargo test --release bench_cached_alloc -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bench_cached_alloc() {
        let pool = cpu_pool(Bucketing::Naive { large_round: 2 << 20 });
        let n = 2_000_000;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..n {
                let (p, b) = pool.alloc(4096).unwrap();
                // SAFETY: freeing what was allocated, once.
                unsafe { pool.free(std::hint::black_box(p), b) };
            }
            println!("cached alloc+free: {:.1} ns", t.elapsed().as_secs_f64() / n as f64 * 1e9);
        }
    }
}
