//! Reductions: `sum`, `mean`, `prod`, `max`, `min`, `nansum`, `nanprod`, `norm`, and the index
//! searches `argmax`, `argmin`, `argmax_channel`.
//!
//! Owns: axis planning ([`reduced_axes`]: `axis` None or `()` reduces everything, `exclude`
//! inverts the set, negative axes count from the end, duplicates and out-of-range axes are
//! errors), the collapsed reduction layout ([`RPlan`]: size-1 dimensions dropped, neighbouring
//! dimensions with the same reduced/kept status merged), and the kernels. When the innermost
//! dimension is reduced, each output sums contiguous runs with several independent
//! accumulators (a loop LLVM vectorises), in blocks so float32 sums stay accurate; when it is
//! kept, rows are accumulated into an output row (also a vector loop). Work is split over
//! outputs when there are enough of them, otherwise over the reduced range with partial
//! results merged at the end.

use super::common::norm_axis;
use super::elemwise::{dispatch_arith, Arith, Calc};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::gpu::{self, GpuKernel};
use crate::op::kernel::{par_tasks, par_tasks_mut, sum_parts};
use crate::op::param::op_params;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef};
use std::any::TypeId;
use std::borrow::Cow;

/// Which dimensions of a `ndim`-dimensional input are reduced.
pub(crate) fn reduced_axes(op: &str, ndim: usize, axis: Option<&[i64]>, exclude: bool) -> Result<Vec<bool>> {
    let axes = match axis {
        None | Some([]) => return Ok(vec![true; ndim]),
        Some(a) => a,
    };
    let mut flags = vec![false; ndim];
    for &a in axes {
        let i = norm_axis(op, a, ndim)?;
        if flags[i] {
            return Err(Error::value(format!("operator {op}: axis {a} appears more than once in {axes:?}")));
        }
        flags[i] = true;
    }
    if exclude {
        flags.iter_mut().for_each(|f| *f = !*f);
    }
    Ok(flags)
}

/// The output shape of a reduction.
pub(crate) fn reduced_shape(shape: &[usize], flags: &[bool], keepdims: bool) -> Vec<usize> {
    if keepdims {
        return shape.iter().zip(flags).map(|(&d, &r)| if r { 1 } else { d }).collect();
    }
    let s: Vec<usize> = shape.iter().zip(flags).filter(|(_, &r)| !r).map(|(&d, _)| d).collect();
    if s.is_empty() {
        vec![1]
    } else {
        s
    }
}

/// A reduction over collapsed dimensions: `dims[i]` with `red[i]` telling whether it is reduced.
/// Dimensions alternate between reduced and kept; the input is contiguous in `dims` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RPlan {
    pub dims: Vec<usize>,
    pub red: Vec<bool>,
}

impl RPlan {
    pub fn new(shape: &[usize], flags: &[bool]) -> RPlan {
        let mut dims: Vec<usize> = Vec::new();
        let mut red: Vec<bool> = Vec::new();
        for (&d, &r) in shape.iter().zip(flags) {
            if d == 1 {
                continue;
            }
            if red.last() == Some(&r) {
                *dims.last_mut().expect("parallel vectors") *= d;
            } else {
                dims.push(d);
                red.push(r);
            }
        }
        if dims.is_empty() {
            dims.push(1);
            red.push(true);
        }
        RPlan { dims, red }
    }

    /// Elements reduced into each output.
    pub fn count(&self) -> usize {
        self.dims.iter().zip(&self.red).filter(|(_, &r)| r).map(|(&d, _)| d).product()
    }
}

/// A reduction: accumulator type, identity, step and merge, and the final map to the output.
trait Reducer<T: Arith>: Copy + Send + Sync {
    fn init(self) -> T::C;
    fn step(self, a: T::C, x: T) -> T::C;
    fn merge(self, a: T::C, b: T::C) -> T::C;
    fn finish(self, a: T::C, count: usize) -> T;

    /// The reduction of a contiguous run.
    #[inline(always)]
    fn run(self, x: &[T]) -> T::C {
        run_lanes(self, x)
    }

    /// `acc[j] = step(acc[j], x[j])`.
    #[inline(always)]
    fn row(self, acc: &mut [T::C], x: &[T]) {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a = self.step(*a, v);
        }
    }
}

/// The reduction of a contiguous run: 16 independent accumulators over blocks.
#[inline(always)]
fn run_lanes<T: Arith, Rd: Reducer<T>>(rd: Rd, x: &[T]) -> T::C {
    const LANES: usize = 16;
    const BLOCK: usize = 4096;
    if x.len() < 2 * LANES {
        return x.iter().fold(rd.init(), |a, &v| rd.step(a, v));
    }
    let mut total = rd.init();
    for block in x.chunks(BLOCK) {
        let mut acc = [rd.init(); LANES];
        let mut chunks = block.chunks_exact(LANES);
        for c in &mut chunks {
            for i in 0..LANES {
                acc[i] = rd.step(acc[i], c[i]);
            }
        }
        for (i, &v) in chunks.remainder().iter().enumerate() {
            acc[i] = rd.step(acc[i], v);
        }
        // Pairwise combination of the lanes.
        let mut w = LANES;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                acc[i] = rd.merge(acc[i], acc[i + w]);
            }
        }
        total = rd.merge(total, acc[0]);
    }
    total
}

/// The reductions, as const parameters of [`R`] so that each kernel is compiled for one.
mod kind {
    pub const SUM: u8 = 0;
    pub const MEAN: u8 = 1;
    pub const PROD: u8 = 2;
    pub const MAX: u8 = 3;
    pub const MIN: u8 = 4;
    pub const NANSUM: u8 = 5;
    pub const NANPROD: u8 = 6;
    pub const NORM1: u8 = 7;
    pub const NORM2: u8 = 8;
}
use kind::*;

#[derive(Clone, Copy)]
struct R<const K: u8>;

impl<T: Arith, const K: u8> Reducer<T> for R<K> {
    /// Float32 sums and means take the explicitly vectorised loop (`op::simd`); the rest
    /// (and short runs) the portable lanes. Both branch conditions fold at compile time.
    #[inline(always)]
    fn run(self, x: &[T]) -> T::C {
        if (K == SUM || K == MEAN) && TypeId::of::<T>() == TypeId::of::<f32>() && x.len() >= 64 {
            // SAFETY: T is f32 (checked above): the same memory, the same element type.
            let xs = unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) };
            return T::C::from_f64(crate::op::simd::sum_f32(xs) as f64);
        }
        run_lanes(self, x)
    }
    #[inline(always)]
    fn init(self) -> T::C {
        match K {
            PROD | NANPROD => T::C::ONE,
            MAX => T::C::LOWEST,
            MIN => T::C::HIGHEST,
            _ => T::C::ZERO,
        }
    }
    #[inline(always)]
    fn step(self, a: T::C, x: T) -> T::C {
        let x = x.load();
        match K {
            SUM | MEAN => a.add(x),
            PROD => a.mul(x),
            MAX => {
                if x > a || x.is_nan() {
                    x
                } else {
                    a
                }
            }
            MIN => {
                if x < a || x.is_nan() {
                    x
                } else {
                    a
                }
            }
            NANSUM => {
                if x.is_nan() {
                    a
                } else {
                    a.add(x)
                }
            }
            NANPROD => {
                if x.is_nan() {
                    a
                } else {
                    a.mul(x)
                }
            }
            NORM1 => a.add(x.abs()),
            _ => a.add(x.mul(x)),
        }
    }
    #[inline(always)]
    fn merge(self, a: T::C, b: T::C) -> T::C {
        match K {
            PROD | NANPROD => a.mul(b),
            MAX => {
                if b > a || b.is_nan() {
                    b
                } else {
                    a
                }
            }
            MIN => {
                if b < a || b.is_nan() {
                    b
                } else {
                    a
                }
            }
            _ => a.add(b),
        }
    }
    #[inline(always)]
    fn finish(self, a: T::C, count: usize) -> T {
        T::store(match K {
            MEAN => a.div(T::C::from_f64(count as f64)),
            NORM2 => a.sqrt(),
            _ => a,
        })
    }
}

/// Walks the reduced index space of one output: calls `f(offset, len)` for each contiguous
/// run of the input from reduced position `start` to `end` (positions count reduced
/// elements in row-major order of the reduced dimensions, innermost fastest).
struct Walker {
    /// Reduced dimensions (outer to inner) and their input strides.
    dims: Vec<usize>,
    strides: Vec<usize>,
}

impl Walker {
    fn runs(&self, base: usize, start: usize, end: usize, mut f: impl FnMut(usize, usize)) {
        let k = self.dims.len();
        if k == 0 {
            if start < end {
                f(base, 1);
            }
            return;
        }
        if k == 1 && self.strides[0] == 1 {
            if start < end {
                f(base + start, end - start);
            }
            return;
        }
        let inner = self.dims[k - 1];
        let inner_stride = self.strides[k - 1];
        let mut idx = vec![0usize; k];
        let mut rest = start;
        for j in (0..k).rev() {
            idx[j] = rest % self.dims[j];
            rest /= self.dims[j];
        }
        let mut off = base + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>();
        let mut pos = start;
        while pos < end {
            if inner_stride == 1 {
                let len = (inner - idx[k - 1]).min(end - pos);
                f(off, len);
                pos += len;
                off += len;
                idx[k - 1] += len;
            } else {
                f(off, 1);
                pos += 1;
                off += inner_stride;
                idx[k - 1] += 1;
            }
            // Carry.
            let mut j = k - 1;
            while idx[j] == self.dims[j] && j > 0 {
                off -= self.dims[j] * self.strides[j];
                idx[j] = 0;
                j -= 1;
                idx[j] += 1;
                off += self.strides[j];
            }
        }
    }
}

/// Input strides of the collapsed dims.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn reduce_typed<T: Arith, Rd: Reducer<T>>(rd: Rd, plan: &RPlan, x: &[T], out: &mut [T]) {
    let count = plan.count();
    let n_out = out.len();
    if x.is_empty() {
        out.fill(rd.finish(rd.init(), count));
        return;
    }
    let st = strides(&plan.dims);
    let k = plan.dims.len();
    let threads = sum_parts();
    let est_ns = x.len() as f64 * 0.3;
    if plan.red[k - 1] {
        // Innermost reduced: each output reduces runs; kept dims are all outer.
        let kept: Vec<usize> = (0..k).filter(|&i| !plan.red[i]).collect();
        let walker = Walker {
            dims: (0..k).filter(|&i| plan.red[i]).map(|i| plan.dims[i]).collect(),
            strides: (0..k).filter(|&i| plan.red[i]).map(|i| st[i]).collect(),
        };
        let base_of = |mut o: usize| {
            let mut b = 0;
            for &i in kept.iter().rev() {
                b += (o % plan.dims[i]) * st[i];
                o /= plan.dims[i];
            }
            b
        };
        let reduce_range = |base: usize, s: usize, e: usize| {
            let mut acc = rd.init();
            walker.runs(base, s, e, |off, len| acc = rd.merge(acc, rd.run(&x[off..off + len])));
            acc
        };
        if n_out >= threads * 4 || n_out == 0 {
            let tasks = n_out.min(threads * 8).max(1);
            let per = n_out.div_ceil(tasks);
            // Outer reduced dimensions (all but the innermost run), walked outermost so that
            // the input is read in memory order within a task's outputs.
            let c = plan.dims[k - 1];
            let nw = walker.dims.len();
            let outer = Walker { dims: walker.dims[..nw - 1].to_vec(), strides: walker.strides[..nw - 1].to_vec() };
            let outer_count: usize = outer.dims.iter().product();
            par_tasks_mut(out, per, est_ns, T::DTYPE, |t, dst| {
                let (o0, o1) = (t * per, t * per + dst.len());
                let bases: Vec<usize> = (o0..o1).map(&base_of).collect();
                let mut acc = vec![rd.init(); o1 - o0];
                outer.runs(0, 0, outer_count, |off, len| {
                    for p in 0..len {
                        for (a, &b) in acc.iter_mut().zip(&bases) {
                            let s = b + off + p * c;
                            *a = rd.merge(*a, rd.run(&x[s..s + c]));
                        }
                    }
                });
                for (d, a) in dst.iter_mut().zip(acc) {
                    *d = rd.finish(a, count);
                }
            });
        } else {
            // Few outputs: split each one's reduced range, merge the partials.
            let tasks = threads.max(1);
            let per = count.div_ceil(tasks);
            for (j, slot) in out.iter_mut().enumerate() {
                let base = base_of(j);
                let partial: Vec<crate::sync::Mutex<T::C>> =
                    (0..tasks).map(|_| crate::sync::Mutex::new(rd.init())).collect();
                par_tasks(tasks, est_ns / n_out as f64, T::DTYPE, |t| {
                    let (s, e) = (t * per, ((t + 1) * per).min(count));
                    if s < e {
                        *partial[t].lock() = reduce_range(base, s, e);
                    }
                });
                let acc = partial.into_iter().fold(rd.init(), |a, p| rd.merge(a, p.into_inner()));
                *slot = rd.finish(acc, count);
            }
        }
    } else {
        // Innermost kept (length `l`): accumulate input rows into output rows.
        let l = plan.dims[k - 1];
        let outer_kept: Vec<usize> = (0..k - 1).filter(|&i| !plan.red[i]).collect();
        let walker = Walker {
            dims: (0..k - 1).filter(|&i| plan.red[i]).map(|i| plan.dims[i]).collect(),
            strides: (0..k - 1).filter(|&i| plan.red[i]).map(|i| st[i]).collect(),
        };
        let rows = walker.dims.iter().product::<usize>();
        let n_outer = n_out / l;
        let base_of = |mut o: usize| {
            let mut b = 0;
            for &i in outer_kept.iter().rev() {
                b += (o % plan.dims[i]) * st[i];
                o /= plan.dims[i];
            }
            b
        };
        // Rows of the reduced space [s, e) for output row `j` into `acc`.
        let accumulate = |j: usize, s: usize, e: usize, acc: &mut [T::C]| {
            walker.runs(base_of(j), s, e, |off, len| {
                for r in 0..len {
                    rd.row(acc, &x[off + r * l..off + (r + 1) * l]);
                }
            });
        };
        if n_outer >= threads * 2 {
            par_tasks_mut(out, l, est_ns, T::DTYPE, |j, dst| {
                let mut acc = vec![rd.init(); l];
                accumulate(j, 0, rows, &mut acc);
                for (d, &a) in dst.iter_mut().zip(&acc) {
                    *d = rd.finish(a, count);
                }
            });
        } else {
            let tasks = threads.max(1).min(rows.max(1));
            let per = rows.div_ceil(tasks);
            for j in 0..n_outer {
                let partial: Vec<crate::sync::Mutex<Vec<T::C>>> =
                    (0..tasks).map(|_| crate::sync::Mutex::new(Vec::new())).collect();
                par_tasks(tasks, est_ns / n_outer as f64, T::DTYPE, |t| {
                    let (s, e) = (t * per, ((t + 1) * per).min(rows));
                    let mut acc = vec![rd.init(); l];
                    if s < e {
                        accumulate(j, s, e, &mut acc);
                    }
                    *partial[t].lock() = acc;
                });
                let mut acc = vec![rd.init(); l];
                for p in partial {
                    for (a, b) in acc.iter_mut().zip(p.into_inner()) {
                        *a = rd.merge(*a, b);
                    }
                }
                for (d, a) in out[j * l..(j + 1) * l].iter_mut().zip(acc) {
                    *d = rd.finish(a, count);
                }
            }
        }
    }
}

op_params! {
    pub(super) struct ReduceParams<'a> => REDUCE_PARAMS {
        axis: Option<&'a [i64]> = "None", "The axis or axes along which to perform the reduction. The default, axis=(), will compute over all elements into a scalar array with shape (1,). If axis is int, a reduction is performed on a particular axis. If axis is a tuple of ints, a reduction is performed on all the axes specified in the tuple. If exclude is true, reduction will be performed on the axes that are NOT in axis instead. Negative values means indexing from right to left.";
        keepdims: bool = "False", "If this is set to `True`, the reduced axes are left in the result as dimension with size one.";
        exclude: bool = "False", "Whether to perform reduction on axis that are NOT in axis instead.";
    }
}

op_params! {
    pub(super) struct NormParams<'a> => NORM_PARAMS {
        ord: i64 = "2", "Order of the norm. Currently ord=1 and ord=2 is supported.";
        axis: Option<&'a [i64]> = "None", "The axis or axes along which to perform the reduction.";
        out_dtype: Option<DType> = "None", "The data type of the output.";
        keepdims: bool = "False", "If this is set to `True`, the reduced axis is left in the result as dimension with size one.";
    }
}

op_params! {
    pub(super) struct SearchParams<'a> => SEARCH_PARAMS {
        axis: Option<i64> = "None", "The axis along which to perform the reduction. Negative values means indexing from right to left. ``Requires axis to be set as int, because global reduction is not supported yet.``";
        keepdims: bool = "False", "If this is set to `True`, the reduced axis is left in the result as dimension with size one.";
    }
}

/// The axes a reduction (of [`REDUCE_PARAMS`] or `norm`'s table) reduces, as flags.
pub(super) fn flags_of(op: &str, a: &crate::op::param::Attrs, ndim: usize) -> Result<Vec<bool>> {
    let (axis, exclude) = if a.declares(NORM_PARAMS) {
        (NormParams::of(a).axis, false)
    } else {
        let p = ReduceParams::of(a);
        (p.axis, p.exclude)
    };
    reduced_axes(op, ndim, axis, exclude)
}

/// Whether a reduction (of [`REDUCE_PARAMS`] or `norm`'s table) keeps the reduced axes.
fn keepdims_of(a: &crate::op::param::Attrs) -> bool {
    if a.declares(NORM_PARAMS) {
        NormParams::of(a).keepdims
    } else {
        ReduceParams::of(a).keepdims
    }
}

fn infer_reduce(op: &'static str) -> crate::op::InferFn {
    Box::new(move |a, ins: &[Meta]| {
        if op == "norm" {
            let params = NormParams::of(a);
            let ord = params.ord;
            if ord != 1 && ord != 2 {
                return Err(Error::value(format!("operator norm: ord must be 1 or 2, got {ord}")));
            }
            if let Some(d) = params.out_dtype {
                let float = |t: DType| matches!(t, DType::F32 | DType::F64 | DType::F16);
                if d != ins[0].dtype && !(float(d) && float(ins[0].dtype)) {
                    return Err(Error::not_supported(format!(
                        "operator norm with out_dtype {} (input {})",
                        d.name(),
                        ins[0].dtype.name()
                    )));
                }
                let flags = flags_of(op, a, ins[0].shape.len())?;
                return Ok(vec![Meta::new(reduced_shape(&ins[0].shape, &flags, keepdims_of(a)), d)]);
            }
        }
        let flags = flags_of(op, a, ins[0].shape.len())?;
        let out = reduced_shape(&ins[0].shape, &flags, keepdims_of(a));
        // A maximum or minimum of no elements has no value (stock refuses it).
        let empty = ins[0].shape.iter().zip(&flags).any(|(&d, &r)| r && d == 0);
        if matches!(op, "max" | "min") && empty && out.iter().product::<usize>() > 0 {
            return Err(Error::value(format!(
                "operator {op}: cannot reduce an empty axis of shape {:?} (the result has no value)",
                ins[0].shape
            )));
        }
        Ok(vec![Meta::new(out, ins[0].dtype)])
    })
}

/// Reduction `kind` of `x` into `o` as `plan` says.
fn reduce_kind<T: Arith>(kind: u8, plan: &RPlan, x: &[T], o: &mut [T]) {
    match kind {
        SUM => reduce_typed(R::<SUM>, plan, x, o),
        MEAN => reduce_typed(R::<MEAN>, plan, x, o),
        PROD => reduce_typed(R::<PROD>, plan, x, o),
        MAX => reduce_typed(R::<MAX>, plan, x, o),
        MIN => reduce_typed(R::<MIN>, plan, x, o),
        NANSUM => reduce_typed(R::<NANSUM>, plan, x, o),
        NANPROD => reduce_typed(R::<NANPROD>, plan, x, o),
        NORM1 => reduce_typed(R::<NORM1>, plan, x, o),
        _ => reduce_typed(R::<NORM2>, plan, x, o),
    }
}

fn reduce_compute(kind: u8) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        let x = &ins[0];
        let flags = flags_of(cx.attrs.op, cx.attrs, x.ndim())?;
        let plan = RPlan::new(&x.shape, &flags);
        let kind = if kind == NORM2 && NormParams::of(cx.attrs).ord == 1 { NORM1 } else { kind };
        if outs[0].dtype == DType::F32 && super::common::safe_accumulation()? {
            // MXNET_SAFE_ACCUMULATION: float32 accumulates in float64, rounded once.
            let x = elems_as::<f64>(cx.attrs.op, x)?;
            let mut wide = vec![0f64; outs[0].size()];
            reduce_kind(kind, &plan, &x, &mut wide);
            for (o, w) in outs[0].as_mut::<f32>().iter_mut().zip(wide) {
                *o = w as f32;
            }
            return Ok(());
        }
        dispatch_arith!(outs[0].dtype, cx.attrs.op, T => {
            let x = elems_as::<T>(cx.attrs.op, x)?;
            reduce_kind(kind, &plan, &x, outs[0].as_mut::<T>());
        });
        Ok(())
    })
}

/// `b`'s elements as `T`: borrowed when `b` has `T`'s dtype, converted otherwise (a `norm`
/// with an `out_dtype` computes in the output's type, as stock does).
pub(super) fn elems_as<'a, T: Elem>(op: &str, b: &'a TBlob) -> Result<Cow<'a, [T]>> {
    if b.dtype == T::DTYPE {
        return Ok(Cow::Borrowed(b.as_slice::<T>()));
    }
    Ok(Cow::Owned(super::nn::read_f64(op, b)?.into_iter().map(T::from_f64).collect()))
}

/// Sum `x`, viewed under `shape` (same size), over the dimensions `flags` marks, into `out`
/// (the kept dimensions, in order): the reduction behind the gradients of broadcasts, `tile`
/// and `repeat`.
pub(super) fn sum_into(op: &str, x: &TBlob, shape: &[usize], flags: &[bool], out: &mut OutBlob) -> Result<()> {
    let plan = RPlan::new(shape, flags);
    dispatch_arith!(x.dtype, op, T => reduce_typed(R::<SUM>, &plan, x.as_slice::<T>(), out.as_mut::<T>()));
    Ok(())
}

/// The axis a search reduces (None: the flattened array); `argmax_channel`, which declares
/// no parameters, searches axis 1.
fn search_axis(cx_op: &str, a: &crate::op::param::Attrs, ndim: usize) -> Result<Option<usize>> {
    if !a.declares(SEARCH_PARAMS) {
        return norm_axis(cx_op, 1, ndim).map(Some);
    }
    SearchParams::of(a).axis.map(|ax| norm_axis(cx_op, ax, ndim)).transpose()
}

fn infer_search(op: &'static str) -> crate::op::InferFn {
    Box::new(move |a, ins: &[Meta]| {
        let shape = &ins[0].shape;
        let keepdims = a.declares(SEARCH_PARAMS) && SearchParams::of(a).keepdims;
        let out = match search_axis(op, a, shape.len())? {
            None if keepdims => vec![1; shape.len()],
            None => vec![1],
            Some(ax) => {
                if shape[ax] == 0 {
                    return Err(Error::value(format!(
                        "operator {op}: cannot search an empty axis {ax} of shape {shape:?}"
                    )));
                }
                let mut flags = vec![false; shape.len()];
                flags[ax] = true;
                reduced_shape(shape, &flags, keepdims)
            }
        };
        if ins[0].size() == 0 {
            return Err(Error::value(format!("operator {op}: input of shape {shape:?} is empty")));
        }
        Ok(vec![Meta::new(out, ins[0].dtype)])
    })
}

/// Index of the first maximum (`max`) or minimum of `x[off + i*stride]`, i < n. NaN wins.
fn search<T: Arith>(x: &[T], off: usize, n: usize, stride: usize, max: bool) -> usize {
    let mut best = x[off].load();
    let mut bi = 0;
    if best.is_nan() {
        return 0;
    }
    for i in 1..n {
        let v = x[off + i * stride].load();
        if v.is_nan() {
            return i;
        }
        if (max && v > best) || (!max && v < best) {
            best = v;
            bi = i;
        }
    }
    bi
}

fn search_compute(max: bool) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        let x = &ins[0];
        let axis = search_axis(cx.attrs.op, cx.attrs, x.ndim())?;
        dispatch_arith!(x.dtype, cx.attrs.op, T => {
            let xs = x.as_slice::<T>();
            let o = outs[0].as_mut::<T>();
            match axis {
                None => o[0] = <T as Elem>::from_f64(search(xs, 0, xs.len(), 1, max) as f64),
                Some(ax) => {
                    let n = x.shape[ax];
                    let inner: usize = x.shape[ax + 1..].iter().product();
                    let outer: usize = x.shape[..ax].iter().product();
                    debug_assert_eq!(o.len(), outer * inner);
                    par_tasks_mut(o, inner, xs.len() as f64 * 0.5, T::DTYPE, |i, row| {
                        for (j, d) in row.iter_mut().enumerate() {
                            *d = <T as Elem>::from_f64(search(xs, i * n * inner + j, n, inner, max) as f64);
                        }
                    });
                }
            }
        });
        Ok(())
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    // (name, aliases, kind, backward (operator, takes inputs, takes outputs), doc)
    type Reduction = (&'static str, &'static [&'static str], u8, Option<(&'static str, bool, bool)>, &'static str);
    let reductions: &[Reduction] = &[
        (
            "sum",
            &["sum_axis", "_sparse_sum"],
            SUM,
            Some(("_backward_sum", false, false)),
            "Computes the sum of array elements over given axes.",
        ),
        (
            "mean",
            &["_sparse_mean"],
            MEAN,
            Some(("_backward_mean", false, false)),
            "Computes the mean of array elements over given axes.",
        ),
        (
            "prod",
            &[],
            PROD,
            Some(("_backward_prod", true, true)),
            "Computes the product of array elements over given axes.",
        ),
        (
            "nansum",
            &[],
            NANSUM,
            Some(("_backward_nansum", true, false)),
            "Computes the sum of array elements over given axes treating Not a Numbers (NaN) as zero.",
        ),
        (
            "nanprod",
            &[],
            NANPROD,
            Some(("_backward_nanprod", true, true)),
            "Computes the product of array elements over given axes treating Not a Numbers (NaN) as one.",
        ),
        (
            "max",
            &["max_axis"],
            MAX,
            Some(("_backward_max", true, true)),
            "Computes the max of array elements over given axes.",
        ),
        (
            "min",
            &["min_axis"],
            MIN,
            Some(("_backward_min", true, true)),
            "Computes the min of array elements over given axes.",
        ),
    ];
    for &(name, aliases, kind, grad, doc) in reductions {
        let (op, inputs, outputs) = grad.expect("reductions are differentiable");
        ops.push(
            OpDef::new(name, Inputs::Fixed(&["data"]), infer_reduce(name), reduce_compute(kind))
                .alias(aliases)
                .gpu(GpuKernel::Reduce(
                    gpu::Reduction::named(name, |a, ndim| flags_of(a.op, a, ndim)).expect("a stock reduction"),
                ))
                .params(REDUCE_PARAMS)
                .grad(Grad::Backward { op, inputs, outputs })
                .doc(doc),
        );
    }
    ops.push(
        OpDef::new("norm", Inputs::Fixed(&["data"]), infer_reduce("norm"), reduce_compute(NORM2))
            .alias(&["_sparse_norm"])
            .params(NORM_PARAMS)
            .grad(Grad::Backward { op: "_backward_norm", inputs: true, outputs: true })
            .doc("Computes the norm on an NDArray (ord 1: sum of absolute values, ord 2: Euclidean)."),
    );
    for (name, max) in [("argmax", true), ("argmin", false)] {
        ops.push(
            OpDef::new(name, Inputs::Fixed(&["data"]), infer_search(name), search_compute(max))
                .params(SEARCH_PARAMS)
                .grad(Grad::Zero)
                .doc(format!(
                    "{name}: indices of the first {} values along an axis (in the input dtype).",
                    if max { "maximum" } else { "minimum" }
                )),
        );
    }
    ops.push(
        OpDef::new("argmax_channel", Inputs::Fixed(&["data"]), infer_search("argmax_channel"), search_compute(true))
            .grad(Grad::Zero)
            .doc("Returns argmax indices of each channel (axis 1) from the input array."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_planning() {
        assert_eq!(reduced_axes("t", 3, None, false).unwrap(), vec![true; 3]);
        assert_eq!(reduced_axes("t", 3, Some(&[]), true).unwrap(), vec![true; 3]);
        assert_eq!(reduced_axes("t", 3, Some(&[-1]), false).unwrap(), vec![false, false, true]);
        assert_eq!(reduced_axes("t", 3, Some(&[0, 2]), true).unwrap(), vec![false, true, false]);
        assert!(reduced_axes("t", 3, Some(&[3]), false).unwrap_err().to_string().starts_with("IndexError"));
        assert!(reduced_axes("t", 3, Some(&[1, -2]), false).unwrap_err().to_string().contains("more than once"));
        assert_eq!(reduced_shape(&[2, 3, 4], &[false, true, false], false), vec![2, 4]);
        assert_eq!(reduced_shape(&[2, 3, 4], &[false, true, false], true), vec![2, 1, 4]);
        assert_eq!(reduced_shape(&[2, 3], &[true, true], false), vec![1]);
    }

    #[test]
    fn plans_collapse() {
        assert_eq!(RPlan::new(&[2, 3, 4], &[true; 3]), RPlan { dims: vec![24], red: vec![true] });
        assert_eq!(
            RPlan::new(&[2, 1, 3, 4], &[false, true, true, false]),
            RPlan { dims: vec![2, 3, 4], red: vec![false, true, false] }
        );
        assert_eq!(RPlan::new(&[5, 1], &[false, true]), RPlan { dims: vec![5], red: vec![false] });
        assert_eq!(
            RPlan::new(&[2, 3, 4, 5], &[true, true, false, false]),
            RPlan { dims: vec![6, 20], red: vec![true, false] }
        );
    }

    fn naive(x: &[f64], shape: &[usize], flags: &[bool]) -> Vec<f64> {
        let out_shape = reduced_shape(shape, flags, true);
        let mut out = vec![0.0; out_shape.iter().product()];
        for (i, &v) in x.iter().enumerate() {
            let (mut rest, mut o, mut m) = (i, 0, 1);
            for d in (0..shape.len()).rev() {
                let c = rest % shape[d];
                rest /= shape[d];
                if !flags[d] {
                    o += c * m;
                    m *= shape[d];
                }
            }
            out[o] += v;
        }
        out
    }

    #[test]
    fn sums_match_naive() {
        let cases: &[(&[usize], &[bool])] = &[
            (&[3, 4, 5], &[false, true, false]),
            (&[3, 4, 5], &[true, false, true]),
            (&[3, 4, 5], &[true, true, true]),
            (&[6, 1, 7], &[false, true, true]),
            (&[4, 50, 6], &[true, false, true]),
            (&[3, 40, 2, 5], &[true, false, true, true]),
            (&[2, 3, 4, 5], &[true, false, true, false]),
            (&[100_000], &[true]),
            (&[3000, 7], &[true, false]),
            (&[7, 3000], &[false, true]),
        ];
        for &(shape, flags) in cases {
            let n: usize = shape.iter().product();
            let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64).collect();
            let plan = RPlan::new(shape, flags);
            let mut out = vec![0.0; reduced_shape(shape, flags, true).iter().product()];
            reduce_typed::<f64, R<SUM>>(R::<SUM>, &plan, &x, &mut out);
            assert_eq!(out, naive(&x, shape, flags), "{shape:?} {flags:?}");
        }
    }
}
