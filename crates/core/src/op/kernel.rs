//! Data-parallel kernel execution, OpenMP-like: a rayon pool sized by `MXSetNumOMPThreads`,
//! else `OMP_NUM_THREADS`, else the number of cores; and operator tuning (seed 001's
//! `MXNET_USE_OPERATOR_TUNING`), which decides when a loop is too small to split.
//!
//! Owns: the kernel pool (re-created when the thread count changes, and in a forked child,
//! where the parent's pool has no threads), the image pool of a forked child (seed 001's
//! `MXNET_MP_OPENCV_NUM_THREADS`: see [`PoolKind::Image`]), [`par_for`] and its siblings,
//! the disjoint parts they hand out ([`parts`], [`column_blocks`]), and the tuning decision. Tuning: at pool creation the fork-join cost of the pool is measured; a
//! loop runs on several threads only when its estimated serial time (elements × the
//! operator's declared cost per element) exceeds a few times that cost. With tuning disabled
//! for a dtype (`MXNET_USE_OPERATOR_TUNING=0`, or a list that leaves the dtype out) every loop
//! above a minimal size is split, as stock's OpenMP loops are without tuning.
//! `MXNET_USE_NUM_CORES_OPERATOR_TUNING` caps the thread count the estimate assumes.
//! Under the NaiveEngine the pool is still used by kernels (as stock's OpenMP is); it starts
//! lazily at the first loop worth splitting.

use crate::config;
use crate::config::spec::Value as CfgValue;
use crate::ndarray::DType;
use crate::runtime::runtime;
use crate::sync::Mutex;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Estimated serial cost of one element of a loop, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Cost(pub f64);

impl Cost {
    /// A memory-bound streaming operation (add, copy, compare).
    pub const CHEAP: Cost = Cost(0.25);
    /// A few arithmetic operations per element (sigmoid via exp, division, clip).
    pub const MEDIUM: Cost = Cost(2.0);
    /// A transcendental function per element (exp, log, tanh, pow).
    pub const MATH: Cost = Cost(6.0);
}

struct KernelPool {
    pool: rayon::ThreadPool,
    threads: usize,
    /// Measured fork-join cost of one split loop, in nanoseconds.
    overhead_ns: f64,
    /// [`Kernels::forks`] when the pool was built: a pool built before a `fork` has no threads in
    /// the child.
    forks: usize,
}

/// The pool a loop runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PoolKind {
    /// Operator kernels: `MXSetNumOMPThreads`, else `OMP_NUM_THREADS`, else the cores (one
    /// thread in a forked child until it calls `MXSetNumOMPThreads`), as stock's OpenMP.
    Kernels,
    /// Image processing, what stock does with OpenCV (resizing, warping): the kernel pool,
    /// except in a forked child (a DataLoader worker), where it has
    /// `MXNET_MP_OPENCV_NUM_THREADS` threads, 0 or 1 running it on the calling thread, as
    /// stock's `cv::setNumThreads` there.
    Image,
}

/// A pool, if one was built since the thread count last changed, and whether one is being
/// built now (the fork count when the build started: a build that was under way at a fork
/// goes on only in the parent).
struct PoolSlot {
    pool: Option<Arc<KernelPool>>,
    building: Option<usize>,
}

/// The process's kernel execution state.
struct Kernels {
    /// How many times this process is a forked child of a process that used kernels
    /// (counted by [`PoolStage`], adopted by the runtime with the first pool).
    forks: AtomicUsize,
    /// A valid `OMP_NUM_THREADS`, read once.
    omp_env: OnceLock<Option<usize>>,
    /// The pool, if a loop was split since the thread count last changed.
    pool: Mutex<PoolSlot>,
    /// A forked child's image pool, if an image loop was split there.
    image_pool: Mutex<PoolSlot>,
    /// A forked child's `MXNET_MP_OPENCV_NUM_THREADS`, read once.
    image_threads: OnceLock<usize>,
    /// The tuning configuration, read once.
    tuning: OnceLock<Tuning>,
}

static KERNELS: Kernels = Kernels {
    forks: AtomicUsize::new(0),
    omp_env: OnceLock::new(),
    pool: Mutex::new(PoolSlot { pool: None, building: None }),
    image_pool: Mutex::new(PoolSlot { pool: None, building: None }),
    image_threads: OnceLock::new(),
    tuning: OnceLock::new(),
};

/// The pool's part in the runtime's lifecycle: a forked child counts the fork, and builds a
/// new pool at its next use.
struct PoolStage;

impl crate::runtime::Part for PoolStage {
    fn child_after_fork(&self) {
        KERNELS.forks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Threads requested for kernels: MXSetNumOMPThreads, else a valid OMP_NUM_THREADS, else cores.
pub fn requested_threads() -> usize {
    let env = *KERNELS.omp_env.get_or_init(|| {
        let raw = std::env::var("OMP_NUM_THREADS").ok()?;
        match raw.trim().split(',').next().and_then(|s| s.trim().parse::<usize>().ok()).filter(|&n| n > 0) {
            Some(n) => Some(n),
            None => {
                eprintln!(
                    "[mxnet-rt] warning: OMP_NUM_THREADS={raw:?} is not a positive integer; using the core count"
                );
                None
            }
        }
    });
    if runtime().kernel_threads_set() {
        runtime().kernel_threads()
    } else {
        env.unwrap_or_else(|| runtime().kernel_threads())
    }
}

/// Threads of a forked child's image pool: `MXNET_MP_OPENCV_NUM_THREADS` (0 and 1: none).
fn forked_image_threads() -> usize {
    *KERNELS.image_threads.get_or_init(|| {
        let consumer = "image processing in a forked process";
        config::global().get_int("MXNET_MP_OPENCV_NUM_THREADS", consumer).map_or_else(
            |e| {
                eprintln!("[mxnet-rt] warning: {e}; image processing runs on one thread");
                0
            },
            |v| v.unwrap_or(0).max(0) as usize,
        )
    })
}

/// The pool `kind` loops run on, built at first use (`None`: run on the calling thread).
fn pool_of(kind: PoolKind) -> Option<Arc<KernelPool>> {
    match kind {
        PoolKind::Image if runtime().is_forked_child() => {
            build_pool(&KERNELS.image_pool, forked_image_threads(), "mxnet-rt image")
        }
        _ => pool(),
    }
}

fn pool() -> Option<Arc<KernelPool>> {
    build_pool(&KERNELS.pool, requested_threads(), "mxnet-rt kernel")
}

/// The pool in `slot`, rebuilt with `want` threads named `name i` when it has another
/// count or was built before a fork.
///
/// The slot's lock is not held while a pool is built and measured, and the measuring runs on
/// a thread of its own: measuring runs jobs on the new pool, and a caller that is a worker of
/// another rayon pool (an image iterator's decoding thread) would run its own pool's queued
/// jobs while it waits, one of which may come here again. Meanwhile other callers run their
/// loops serially (`None`) rather than build pools of their own.
fn build_pool(slot: &Mutex<PoolSlot>, want: usize, name: &'static str) -> Option<Arc<KernelPool>> {
    if want <= 1 {
        return None;
    }
    let forks = KERNELS.forks.load(Ordering::Relaxed);
    {
        let mut s = slot.lock();
        if s.pool.as_ref().is_some_and(|p| p.forks != forks) {
            // A forked child: the pool's threads stayed in the parent. Dropping it would
            // signal threads that do not exist here; leak it and build a new one.
            std::mem::forget(s.pool.take());
        }
        if let Some(p) = s.pool.as_ref().filter(|p| p.threads == want) {
            return Some(p.clone());
        }
        if s.building == Some(forks) {
            return None;
        }
        s.building = Some(forks);
    }
    runtime().adopt(crate::runtime::Stage::KernelPool, &PoolStage);
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(want)
        .thread_name(move |i| format!("{name} {i}"))
        .build()
        .ok()
        .and_then(|pool| {
            let overhead_ns = std::thread::scope(|sc| {
                let t = std::thread::Builder::new().spawn_scoped(sc, || measure_overhead(&pool, want)).ok()?;
                t.join().ok()
            })?;
            Some(Arc::new(KernelPool { pool, threads: want, overhead_ns, forks }))
        });
    let mut s = slot.lock();
    s.building = None;
    if built.is_some() {
        s.pool = built.clone();
    }
    built
}

/// Median time of a split empty loop on `pool`.
fn measure_overhead(pool: &rayon::ThreadPool, threads: usize) -> f64 {
    use rayon::prelude::*;
    let mut samples: Vec<f64> = (0..24)
        .map(|_| {
            let t = Instant::now();
            pool.install(|| {
                (0..threads).into_par_iter().for_each(|i| {
                    std::hint::black_box(i);
                })
            });
            t.elapsed().as_nanos() as f64
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2].max(1000.0)
}

struct Tuning {
    /// Per dtype code (0..8): whether tuning decides (true) or every loop splits (false).
    enabled: [bool; 8],
    /// Cores the estimate assumes (MXNET_USE_NUM_CORES_OPERATOR_TUNING).
    cores: Option<usize>,
}

fn tuning() -> &'static Tuning {
    KERNELS.tuning.get_or_init(|| {
        let reg = config::global();
        let mut enabled = [true; 8];
        match reg.get("MXNET_USE_OPERATOR_TUNING", "operator tuning").map(|r| r.value) {
            Ok(Some(CfgValue::DTypes(Some(list)))) => {
                for d in [DType::F32, DType::F64, DType::F16, DType::U8, DType::I32, DType::I8, DType::I64, DType::Bool]
                {
                    enabled[d as usize] = list.iter().any(|n| n == d.name());
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("[mxnet-rt] warning: {e}; operator tuning stays enabled"),
        }
        let cores = reg
            .get_int("MXNET_USE_NUM_CORES_OPERATOR_TUNING", "operator tuning")
            .unwrap_or_else(|e| {
                eprintln!("[mxnet-rt] warning: {e}; ignored");
                None
            })
            .map(|n| n.max(1) as usize);
        Tuning { enabled, cores }
    })
}

thread_local! {
    static IN_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is running a chunk of a split loop (nested loops then stay serial).
pub fn in_kernel_pool() -> bool {
    IN_POOL.with(|f| f.get())
}

fn with_kernel_pool_flag<R>(f: impl FnOnce() -> R) -> R {
    let prev = IN_POOL.with(|c| c.replace(true));
    let r = f();
    IN_POOL.with(|c| c.set(prev));
    r
}

/// Smallest number of elements worth giving a thread of its own.
const MIN_CHUNK: usize = 1024;

/// The pool and thread count for work estimated at `serial_ns` that splits into at most
/// `max_parts` parts; `None` runs it serially on the calling thread. The one place the tuning
/// decision is made (one pool lookup per loop).
fn decide(kind: PoolKind, max_parts: usize, serial_ns: f64, dtype: DType) -> Option<(Arc<KernelPool>, usize)> {
    if max_parts < 2 || in_kernel_pool() {
        return None;
    }
    let p = pool_of(kind)?;
    let t = tuning();
    let threads = p.threads.min(max_parts);
    if !t.enabled[dtype as usize] {
        return Some((p, threads));
    }
    let assumed = t.cores.map_or(threads, |c| threads.min(c));
    if assumed < 2 || serial_ns < 4.0 * p.overhead_ns {
        None
    } else {
        Some((p, assumed))
    }
}

/// The most parts a loop of `n` units at `cost` each splits into: a part holds at least the
/// work of [`MIN_CHUNK`] cheap elements, so coarse units (a plane, a row) split by their count
/// and cheap elements by thousands.
pub(crate) fn max_parts(n: usize, cost: Cost) -> usize {
    let parts = n as f64 * cost.0 / (MIN_CHUNK as f64 * Cost::CHEAP.0);
    (parts as usize).min(n)
}

/// How many threads a loop of `n` elements at `cost` per element should use.
pub fn plan(n: usize, cost: Cost, dtype: DType) -> usize {
    decide(PoolKind::Kernels, max_parts(n, cost), n as f64 * cost.0, dtype).map_or(1, |(_, t)| t)
}

/// Run `f` over `0..n` split into contiguous ranges, in parallel when [`plan`] says so.
pub fn par_for(n: usize, cost: Cost, dtype: DType, f: impl Fn(Range<usize>) + Sync + Send) {
    let split = decide(PoolKind::Kernels, max_parts(n, cost), n as f64 * cost.0, dtype);
    let Some((p, threads)) = split else {
        if n > 0 {
            f(0..n);
        }
        return;
    };
    let chunk = n.div_ceil(threads);
    p.pool.install(|| {
        use rayon::prelude::*;
        (0..threads).into_par_iter().for_each(|i| {
            let start = i * chunk;
            let end = ((i + 1) * chunk).min(n);
            if start < end {
                with_kernel_pool_flag(|| f(start..end));
            }
        });
    });
}

/// [`par_for`] over an output: `out` holds `n` units of `unit` elements, and `f` gets each
/// contiguous range of units with its own disjoint `&mut` part of `out` (split before the
/// parts are handed out, so no two threads can reach one element).
pub fn par_for_mut<T: Send>(
    out: &mut [T],
    unit: usize,
    cost: Cost,
    dtype: DType,
    f: impl Fn(Range<usize>, &mut [T]) + Sync + Send,
) {
    par_for_mut_on(PoolKind::Kernels, out, unit, cost, dtype, f)
}

/// [`par_for_mut`] on the pool of `kind`.
pub fn par_for_mut_on<T: Send>(
    kind: PoolKind,
    out: &mut [T],
    unit: usize,
    cost: Cost,
    dtype: DType,
    f: impl Fn(Range<usize>, &mut [T]) + Sync + Send,
) {
    let n = out.len().checked_div(unit).unwrap_or(0);
    split_mut(kind, out, unit, max_parts(n, cost), n as f64 * cost.0, dtype, f)
}

/// [`par_for_mut`] with the caller's own bounds: at most `max_parts` parts (a thread limit
/// of its own, such as `MXNET_CPU_NNPACK_NTHREADS`), for work estimated at `serial_ns` on one
/// thread.
pub fn par_for_mut_n<T: Send>(
    out: &mut [T],
    unit: usize,
    max_parts: usize,
    serial_ns: f64,
    dtype: DType,
    f: impl Fn(Range<usize>, &mut [T]) + Sync + Send,
) {
    let n = out.len().checked_div(unit).unwrap_or(0);
    split_mut(PoolKind::Kernels, out, unit, max_parts.min(n), serial_ns, dtype, f)
}

/// `out`'s `unit`-element units in contiguous runs, one per thread the pool of `kind` gives
/// work of `serial_ns` split at most `max_parts` ways.
fn split_mut<T: Send>(
    kind: PoolKind,
    out: &mut [T],
    unit: usize,
    max_parts: usize,
    serial_ns: f64,
    dtype: DType,
    f: impl Fn(Range<usize>, &mut [T]) + Sync + Send,
) {
    let n = out.len().checked_div(unit).unwrap_or(0);
    debug_assert_eq!(n * unit, out.len(), "par_for_mut: the output is not whole units");
    let split = decide(kind, max_parts, serial_ns, dtype);
    let Some((p, threads)) = split else {
        if n > 0 {
            f(0..n, out);
        }
        return;
    };
    let chunk = n.div_ceil(threads);
    p.pool.install(|| {
        use rayon::prelude::*;
        out.par_chunks_mut(chunk * unit).enumerate().for_each(|(i, part)| {
            let start = i * chunk;
            with_kernel_pool_flag(|| f(start..start + part.len() / unit, part));
        });
    });
}

/// [`par_for_mut`] over several outputs of one length (a weight and its optimizer states):
/// each range of elements comes with its own disjoint `&mut` part of `a` and of every `bs`.
pub fn par_for_zip<A: Send, B: Send, const M: usize>(
    a: &mut [A],
    mut bs: [&mut [B]; M],
    cost: Cost,
    dtype: DType,
    f: impl Fn(Range<usize>, &mut [A], [&mut [B]; M]) + Sync + Send,
) {
    let n = a.len();
    assert!(bs.iter().all(|b| b.len() == n), "par_for_zip: outputs of different lengths");
    let Some((p, threads)) = decide(PoolKind::Kernels, max_parts(n, cost), n as f64 * cost.0, dtype) else {
        if n > 0 {
            f(0..n, a, bs);
        }
        return;
    };
    let chunk = n.div_ceil(threads);
    let mut parts = Vec::with_capacity(threads);
    let (mut a, mut start) = (a, 0);
    while start < n {
        let len = chunk.min(n - start);
        let (head, tail) = std::mem::take(&mut a).split_at_mut(len);
        a = tail;
        let heads: [&mut [B]; M] = std::array::from_fn(|k| {
            let (h, t) = std::mem::take(&mut bs[k]).split_at_mut(len);
            bs[k] = t;
            h
        });
        parts.push((start, head, heads));
        start += len;
    }
    p.pool.install(|| {
        use rayon::prelude::*;
        parts.into_par_iter().for_each(|(s, a, b)| with_kernel_pool_flag(|| f(s..s + a.len(), a, b)));
    });
}

/// Run `f(i)` for `i in 0..tasks` on the kernel pool (`tasks` coarse, independent units such as
/// images of a batch), serially when `serial_ns` (the estimated total time) is too small.
pub fn par_tasks(tasks: usize, serial_ns: f64, dtype: DType, f: impl Fn(usize) + Sync + Send) {
    match decide(PoolKind::Kernels, tasks, serial_ns, dtype) {
        None => (0..tasks).for_each(f),
        Some((p, _)) => p.pool.install(|| {
            use rayon::prelude::*;
            (0..tasks).into_par_iter().for_each(|i| with_kernel_pool_flag(|| f(i)));
        }),
    }
}

/// [`par_tasks`] where task `i` owns part `i` of `out`: `out[i * unit..(i + 1) * unit]`, the
/// last part possibly shorter. The parts are split off before they are handed out.
pub fn par_tasks_mut<T: Send>(
    out: &mut [T],
    unit: usize,
    serial_ns: f64,
    dtype: DType,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if unit == 0 {
        return;
    }
    par_items(out.chunks_mut(unit).collect(), serial_ns, dtype, f)
}

/// [`par_tasks`] over owned work items: item `i` (typically disjoint `&mut` parts of the
/// outputs and workspace, split before the call with [`parts`]) goes to task `i` alone.
pub fn par_items<I: Send>(items: Vec<I>, serial_ns: f64, dtype: DType, f: impl Fn(usize, I) + Sync + Send) {
    match decide(PoolKind::Kernels, items.len(), serial_ns, dtype) {
        None => items.into_iter().enumerate().for_each(|(i, it)| f(i, it)),
        Some((p, _)) => p.pool.install(|| {
            use rayon::prelude::*;
            items.into_par_iter().enumerate().for_each(|(i, it)| with_kernel_pool_flag(|| f(i, it)));
        }),
    }
}

/// `s` split into exactly `n` consecutive parts of `len` elements (fewer at the end when `s`
/// runs out: the last parts may be short or empty).
pub fn parts<T>(mut s: &mut [T], len: usize, n: usize) -> Vec<&mut [T]> {
    (0..n)
        .map(|_| {
            let mid = len.min(s.len());
            let (head, tail) = std::mem::take(&mut s).split_at_mut(mid);
            s = tail;
            head
        })
        .collect()
}

/// A range of columns of every row of a row-major matrix: the part of it one task owns when
/// tasks split the matrix by columns (the spatial tiles of a convolution's output planes,
/// whose rows are the filters). Made only by [`column_blocks`], from the `&mut` borrow of
/// the whole matrix, so that no other reference to it lives while its blocks do, and the
/// blocks of one matrix never share an element.
pub struct ColumnBlock<'a, T> {
    /// Row 0's first element of the block.
    ptr: *mut T,
    rows: usize,
    /// Elements from one row to the next (at least `cols`).
    ld: usize,
    cols: usize,
    /// The block's first column in the matrix.
    col0: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: a block stands for `&mut` row segments no other block or reference reaches
// (see `column_blocks`); sending it to another thread sends those exclusive borrows, which is
// sound when `T` may be sent.
unsafe impl<T: Send> Send for ColumnBlock<'_, T> {}

impl<T> ColumnBlock<'_, T> {
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The distance between rows, in elements.
    pub fn ld(&self) -> usize {
        self.ld
    }
    /// The block's first column in the whole matrix.
    pub fn col0(&self) -> usize {
        self.col0
    }
    /// Row `i` of the block (its `cols` elements).
    pub fn row(&mut self, i: usize) -> &mut [T] {
        assert!(i < self.rows, "ColumnBlock::row: row {i} of {}", self.rows);
        // SAFETY: `column_blocks` asserted that every row segment of every block lies inside
        // the borrowed matrix and that blocks do not overlap; the segment is borrowed through
        // `&mut self`, so it is the only live reference to these elements.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.ld), self.cols) }
    }
    /// The block's first element, for a writer of all its rows at once (the GEMM). The
    /// `rows × cols` elements at stride [`Self::ld`] from it are this block's alone, and the
    /// `&mut self` borrow keeps [`Self::row`] from handing out a segment meanwhile.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr
    }
}

/// The row-major matrix `m` (`rows` rows, `ld` elements apart) split into column blocks at
/// `bounds` (ascending, the last at most `ld`): block `i` holds columns
/// `bounds[i]..bounds[i + 1]` of every row.
pub fn column_blocks<'a, T>(m: &'a mut [T], rows: usize, ld: usize, bounds: &[usize]) -> Vec<ColumnBlock<'a, T>> {
    assert!(bounds.windows(2).all(|w| w[0] <= w[1]), "column_blocks: bounds are not ascending");
    let last = bounds.last().copied().unwrap_or(0);
    assert!(last <= ld, "column_blocks: column {last} beyond the row length {ld}");
    let end = if rows == 0 { Some(0) } else { (rows - 1).checked_mul(ld).and_then(|x| x.checked_add(last)) };
    assert!(end.is_some_and(|e| e <= m.len()), "column_blocks: {rows} rows of {ld} exceed the matrix");
    let base = m.as_mut_ptr();
    bounds
        .windows(2)
        .map(|w| ColumnBlock {
            // In bounds of `m` (or one past its end for an empty block): asserted above.
            ptr: base.wrapping_add(w[0]),
            rows,
            ld,
            cols: w[1] - w[0],
            col0: w[0],
            _borrow: std::marker::PhantomData,
        })
        .collect()
}

/// Run `f` inside the kernel pool (so that a library that uses the current rayon pool, such
/// as the GEMM crate, uses ours), or directly when there is no pool.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) if !in_kernel_pool() => p.pool.install(f),
        _ => f(),
    }
}

/// Threads of the kernel pool (1 when there is none).
pub fn pool_threads() -> usize {
    pool().map_or(1, |p| p.threads)
}

/// How many parts a kernel splits work into where the split decides the order of a sum
/// (partial sums merged afterwards): the configured thread count, so that a result depends on
/// the configuration alone, not on whether the pool happens to be up when the kernel runs
/// (being built by another thread, or the caller already on a kernel thread, run the parts
/// serially in the same order).
pub fn sum_parts() -> usize {
    requested_threads().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Column blocks cover each row's columns once, in place, and refuse bounds that would
    /// reach outside the matrix or overlap.
    #[test]
    fn column_blocks_cover_each_row_once() {
        let (rows, ld) = (3, 7);
        let mut m = vec![0u32; (rows - 1) * ld + 6];
        let blocks = column_blocks(&mut m, rows, ld, &[0, 2, 2, 5, 6]);
        assert_eq!(blocks.iter().map(|b| (b.col0(), b.cols())).collect::<Vec<_>>(), [(0, 2), (2, 0), (2, 3), (5, 1)]);
        par_items(blocks, 1e9, DType::F32, |i, mut b| {
            for r in 0..b.rows() {
                b.row(r).iter_mut().for_each(|v| *v += (i + 1) as u32);
            }
        });
        for r in 0..rows {
            assert_eq!(m[r * ld..][..6], [1, 1, 3, 3, 3, 4], "row {r}");
        }
        // Column 6 of rows 0 and 1 (the row gap) is untouched.
        assert_eq!((m[6], m[13]), (0, 0));
        let bad = |bounds: &'static [usize], len: usize| {
            std::panic::catch_unwind(move || {
                let mut m = vec![0u8; len];
                column_blocks(&mut m, 2, 4, bounds).len()
            })
            .is_err()
        };
        assert!(bad(&[0, 3, 2], 8), "descending bounds");
        assert!(bad(&[0, 5], 10), "beyond the row length");
        assert!(bad(&[0, 4], 7), "beyond the matrix");
        let wraps = std::panic::catch_unwind(|| {
            let mut m = vec![0u8; 1];
            column_blocks(&mut m, 3, 1 << (usize::BITS - 1), &[0, 1]).len()
        });
        assert!(wraps.is_err(), "a row stride whose extent overflows");
        assert!(!bad(&[0, 4], 8));
    }

    #[test]
    fn parts_split_exactly_n_and_par_helpers_cover_every_element() {
        let mut v: Vec<u32> = (0..10).collect();
        let p = parts(&mut v, 4, 4);
        assert_eq!(
            p.iter().map(|s| s.to_vec()).collect::<Vec<_>>(),
            [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9], vec![]]
        );
        // Each helper hands every element to exactly one call, at its own index.
        let n = 1 << 16;
        let mut a = vec![0usize; n];
        par_for_mut(&mut a, 4, Cost::MATH, DType::F32, |r, part| {
            for (u, c) in r.zip(part.chunks_mut(4)) {
                c.iter_mut().enumerate().for_each(|(k, v)| *v += u * 4 + k + 1);
            }
        });
        assert!(a.iter().enumerate().all(|(i, &v)| v == i + 1));
        let (mut b, mut c) = (vec![0usize; n], vec![0usize; n]);
        par_for_zip(&mut a, [&mut b, &mut c], Cost::MATH, DType::F32, |r, a, [b, c]| {
            for (j, i) in r.enumerate() {
                (a[j], b[j], c[j]) = (a[j] + 1, i, i * 2);
            }
        });
        assert!(a.iter().enumerate().all(|(i, &v)| v == i + 2) && b.iter().enumerate().all(|(i, &v)| v == i));
        assert!(c.iter().enumerate().all(|(i, &v)| v == 2 * i));
        par_tasks_mut(&mut b, 1000, n as f64 * 100.0, DType::F32, |t, part| part.iter_mut().for_each(|v| *v = t));
        assert!(b.iter().enumerate().all(|(i, &v)| v == i / 1000));
        let items = parts(&mut c, 5000, n.div_ceil(5000));
        par_items(items, n as f64 * 100.0, DType::F32, |i, part| part.iter_mut().for_each(|v| *v = i));
        assert!(c.iter().enumerate().all(|(i, &v)| v == i / 5000));
    }
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn par_for_covers_every_index_once() {
        for n in [0usize, 1, 1000, 5000, 1 << 20] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            par_for(n, Cost::MATH, DType::F32, |r| {
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
        }
    }

    #[test]
    fn small_loops_stay_serial() {
        assert_eq!(plan(10, Cost::MATH, DType::F32), 1);
        assert_eq!(plan(2000, Cost::CHEAP, DType::F32), 1);
    }

    #[test]
    fn coarse_units_split_by_their_count() {
        // Cheap elements: a part per MIN_CHUNK of them.
        assert_eq!(max_parts(4 * MIN_CHUNK, Cost::CHEAP), 4);
        assert_eq!(max_parts(MIN_CHUNK, Cost::CHEAP), 1);
        // Planes of a few hundred cheap elements each: a part per plane.
        assert_eq!(max_parts(1280, Cost(300.0)), 1280);
        assert_eq!(max_parts(3, Cost(1e6)), 3);
    }
}
