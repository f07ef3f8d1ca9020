//! Small operators of stock's contrib and utility sets: `_contrib_allclose`,
//! `_contrib_arange_like`, `_contrib_div_sqrt_dim` (with its backward), `all_finite`,
//! `multi_all_finite`, `multi_sum_sq`, `_contrib_index_array`, `khatri_rao`,
//! `_contrib_index_copy` and `_contrib_quadratic` (with their backward operators),
//! `_histogram`, and `_contrib_boolean_mask`.
//!
//! `_contrib_boolean_mask` makes an array whose first dimension only the mask's values know,
//! so it runs through its own invocation: the mask is read (waiting for its writers), the
//! selected rows copied, and the call's backward scatters the output gradient back into those
//! rows (zeros elsewhere, and for the mask). A hybridized block runs it (its CachedOp runs
//! calls whose shapes cannot be inferred one by one). Shape inference refuses it (stock's
//! leaves the shape unknown); a symbol executor fails to bind it in both. CPU only (stock
//! has a GPU kernel too), axis 0 only (as stock).

use super::common::{norm_axis, HostResult};
use super::index::read_indices;
use super::init::fill;
use super::nn::infer_float_like_first;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{two_mut, Elem, OutBlob, TBlob};
use crate::op::{CustomBackward, Grad, Inputs, Meta, OpCtx, OpDef, OwnInvoked, Req};
use crate::{dispatch_all, dispatch_float};
use std::sync::Arc;

// ---- allclose ----

op_params! {
    pub(super) struct AllcloseParams<'a> => ALLCLOSE_PARAMS {
        rtol: f64 = "9.99999975e-06", "Relative tolerance.";
        atol: f64 = "9.99999994e-09", "Absolute tolerance.";
        equal_nan: bool = "1", "Whether to compare NaN's as equal. If True, NaN's in A will be considered equal to NaN's in B in the output array.";
    }
}

/// A scalar (shape `()`) of uint8, as stock's.
fn infer_allclose(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    if ins[0].shape != ins[1].shape {
        return Err(Error::mxnet(format!(
            "operator {}: a has shape {:?} and b {:?}; they must be equal",
            a.op, ins[0].shape, ins[1].shape
        )));
    }
    if ins[0].dtype != ins[1].dtype {
        return Err(Error::type_error(format!(
            "operator {}: a has dtype {} and b {}",
            a.op,
            ins[0].dtype.name(),
            ins[1].dtype.name()
        )));
    }
    Ok(vec![Meta::new(vec![], DType::U8)])
}

/// 1 when every pair is close: `|a - b| <= atol + rtol * |b|` in the data's type (the
/// tolerances are float32, as stock's), NaNs equal only to NaNs and only with `equal_nan`.
fn allclose(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = AllcloseParams::of(cx.attrs);
    let (rtol, atol) = (p.rtol as f32 as f64, p.atol as f32 as f64);
    let close = dispatch_all!(ins[0].dtype, T => {
        let (a, b) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        a.iter().zip(b).all(|(&a, &b)| {
            let (a, b) = (a.to_f64(), b.to_f64());
            if a.is_nan() || b.is_nan() {
                p.equal_nan && a.is_nan() == b.is_nan()
            } else {
                a == b || (a - b).abs() <= atol + rtol * b.abs()
            }
        })
    });
    fill(&mut outs[0], close as u8 as f64);
    Ok(())
}

// ---- arange_like ----

op_params! {
    pub(super) struct ArangeLikeParams<'a> => ARANGE_LIKE_PARAMS {
        start: f64 = "0", "Start of interval. The interval includes this value. The default start value is 0.";
        step: f64 = "1", "Spacing between values.";
        repeat: i64 = "1", "The repeating time of all elements. E.g repeat=3, the element a will be repeated three times --> a, a, a.";
        ctx: Option<Context> = "", "Context of output, in format [cpu|gpu|cpu_pinned](n).Only used for imperative calls.";
        axis: Option<i64> = "None", "Arange elements according to the size of a certain axis of input array. The negative numbers are interpreted counting from the backward. If not provided, will arange elements according to the input shape.";
    }
}

fn infer_arange_like(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let p = ArangeLikeParams::of(a);
    if p.repeat < 1 {
        return Err(Error::mxnet(format!("operator {}: repeat must be >= 1, got {}", a.op, p.repeat)));
    }
    let shape = match p.axis {
        None => ins[0].shape.clone(),
        Some(ax) => vec![ins[0].shape[norm_axis(a.op, ax, ins[0].shape.len())?]],
    };
    Ok(vec![Meta::new(shape, ins[0].dtype)])
}

/// `out[i] = start + (i / repeat) * step`, with `start` and `step` first converted to the
/// output's type (an integer output steps by the truncated step, as stock's).
fn arange_like(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = ArangeLikeParams::of(cx.attrs);
    let repeat = p.repeat.max(1) as usize;
    let out = &mut outs[0];
    dispatch_all!(out.dtype, T => {
        let (start, step) = (T::from_f64(p.start).to_f64(), T::from_f64(p.step).to_f64());
        par_for_mut(out.as_mut::<T>(), 1, Cost::CHEAP, T::DTYPE, |r, o| {
            for (i, v) in r.zip(o.iter_mut()) {
                *v = T::from_f64(start + (i / repeat) as f64 * step);
            }
        });
    });
    Ok(())
}

// ---- div_sqrt_dim ----

fn infer_div_sqrt_dim(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    if ins[0].shape.is_empty() {
        return Err(Error::mxnet(format!("operator {}: the input must have at least one dimension", a.op)));
    }
    Ok(vec![ins[0].clone()])
}

/// `out = x / sqrt(x.shape[-1])`, the divisor converted to the data's type first.
fn div_sqrt_dim(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let x = &ins[ins.len() - 1];
    let dim = *x.shape.last().ok_or_else(|| Error::mxnet("operator _contrib_div_sqrt_dim: a 0-d input"))?;
    let g = &ins[0];
    dispatch_float!(g.dtype, cx.attrs.op, T => {
        let d = T::from_f64((dim as f64).sqrt()).to_f64();
        let src = g.as_slice::<T>();
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::CHEAP, T::DTYPE, |r, o| {
            for (o, &v) in o.iter_mut().zip(&src[r]) {
                *o = T::from_f64(v.to_f64() / d);
            }
        });
    });
    Ok(())
}

/// `_backward_div_sqrt_dim`: input the output gradient (the data's shape); the gradient is
/// the output gradient divided the same way (stock's gradient node is `_contrib_div_sqrt_dim`
/// itself).
fn div_sqrt_dim_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    div_sqrt_dim(cx, ins, outs)
}

// ---- all_finite, multi_all_finite ----

op_params! {
    pub(super) struct AllFiniteParams<'a> => ALL_FINITE_PARAMS {
        init_output: bool = "1", "Initialize output to 1.";
    }
}

op_params! {
    pub(super) struct MultiAllFiniteParams<'a> => MULTI_ALL_FINITE_PARAMS {
        num_arrays: i64 = "1", "Number of arrays.";
        init_output: bool = "1", "Initialize output to 1.";
    }
}

fn infer_all_finite(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    if let Some(m) = ins.iter().find(|m| !matches!(m.dtype, DType::F32 | DType::F64 | DType::F16)) {
        return Err(Error::type_error(format!(
            "operator {}: inputs must be float16, float32 or float64, got {}",
            a.op,
            m.dtype.name()
        )));
    }
    Ok(vec![Meta::new(vec![1], DType::F32)])
}

/// 1 (float32) when every element of every input is finite, else 0. Without `init_output`
/// the output starts from the array given for it (a chain of calls accumulates into one flag).
fn all_finite(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let init = if cx.attrs.declares(ALL_FINITE_PARAMS) {
        AllFiniteParams::of(cx.attrs).init_output
    } else {
        MultiAllFiniteParams::of(cx.attrs).init_output
    };
    let finite = ins.iter().try_fold(true, |ok, x| -> Result<bool> {
        Ok(ok && dispatch_float!(x.dtype, cx.attrs.op, T => x.as_slice::<T>().iter().all(|v| v.to_f64().is_finite())))
    })?;
    let out = outs[0].as_mut::<f32>();
    if init {
        out[0] = 1.0;
    }
    if !finite {
        out[0] = 0.0;
    }
    Ok(())
}

// ---- multi_sum_sq ----

op_params! {
    pub(super) struct MultiSumSqParams<'a> => MULTI_SUM_SQ_PARAMS {
        num_arrays: i64 = required, "number of input arrays.";
    }
}

fn infer_multi_sum_sq(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    infer_all_finite(a, ins)?;
    Ok(vec![Meta::new(vec![ins.len()], DType::F32)])
}

/// The sum of squares of each input (float32 results; accumulated in float64).
fn multi_sum_sq(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let sums = ins
        .iter()
        .map(|x| Ok(dispatch_float!(x.dtype, cx.attrs.op, T => x.as_slice::<T>().iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>())))
        .collect::<Result<Vec<f64>>>()?;
    for (o, s) in outs[0].as_mut::<f32>().iter_mut().zip(sums) {
        *o = s as f32;
    }
    Ok(())
}

// ---- index_array ----

op_params! {
    struct IndexArrayParams<'a> => INDEX_ARRAY_PARAMS {
        axes: Option<&'a [i64]> = "None", "The axes to include in the index array. Supports negative values.";
    }
}

/// The axes `_contrib_index_array` lists, normalised (all of them, in order, by default).
fn index_axes(a: &Attrs, ndim: usize) -> Result<Vec<usize>> {
    match IndexArrayParams::of(a).axes {
        None => Ok((0..ndim).collect()),
        Some(axes) => axes.iter().map(|&x| norm_axis(a.op, x, ndim)).collect(),
    }
}

fn infer_index_array(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let axes = index_axes(a, ins[0].shape.len())?;
    let mut shape = ins[0].shape.clone();
    shape.push(axes.len());
    Ok(vec![Meta::new(shape, DType::I64)])
}

/// `out[i_1, ..., i_n, j] = i_{axes[j]}` (int64).
fn index_array(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let shape = &ins[0].shape;
    let axes = index_axes(cx.attrs, shape.len())?;
    let m = axes.len();
    if m == 0 {
        return Ok(());
    }
    let strides: Vec<usize> = (0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect();
    par_for_mut(outs[0].as_mut::<i64>(), m, Cost::MEDIUM, DType::I64, |r, o| {
        for (k, row) in o.chunks_mut(m).enumerate() {
            let i = r.start + k;
            for (v, &ax) in row.iter_mut().zip(&axes) {
                *v = ((i / strides[ax]) % shape[ax]) as i64;
            }
        }
    });
    Ok(())
}

// ---- khatri_rao ----

op_params! {
    struct KhatriRaoParams<'a> => KHATRI_RAO_PARAMS {
        num_args: i64 = required, "Number of input matrices.";
    }
}

fn infer_khatri_rao(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let cols = ins.first().and_then(|m| m.shape.get(1)).copied().unwrap_or(0);
    let mut rows = 1usize;
    for (k, m) in ins.iter().enumerate() {
        if m.shape.len() != 2 || m.shape[1] != cols {
            return Err(Error::value(format!(
                "operator {}: input {k} has shape {:?}; the inputs must be matrices with one number of columns ({cols})",
                a.op, m.shape
            )));
        }
        if m.dtype != ins[0].dtype {
            return Err(Error::type_error(format!(
                "operator {}: input {k} is {}, input 0 {}",
                a.op,
                m.dtype.name(),
                ins[0].dtype.name()
            )));
        }
        rows = rows
            .checked_mul(m.shape[0])
            .ok_or_else(|| Error::value(format!("operator {}: the product of the row counts overflows", a.op)))?;
    }
    Ok(vec![Meta::new(vec![rows, cols], ins[0].dtype)])
}

/// Column `k` of the output is the outer product of the inputs' columns `k`, the first
/// input's row index varying slowest.
fn khatri_rao(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    dispatch_float!(outs[0].dtype, cx.attrs.op, T => {
        let mats: Vec<&[T]> = ins.iter().map(|b| b.as_slice::<T>()).collect();
        let rows: Vec<usize> = ins.iter().map(|b| b.shape[0]).collect();
        let cols = outs[0].shape[1];
        if cols == 0 {
            return Ok(());
        }
        par_for_mut(outs[0].as_mut::<T>(), cols, Cost::MEDIUM, T::DTYPE, |r, o| {
            for (k, row) in o.chunks_mut(cols).enumerate() {
                // Split the output row index into one row per input (last input fastest).
                let mut rest = r.start + k;
                let mut picks = vec![0usize; rows.len()];
                for (p, &n) in picks.iter_mut().zip(&rows).rev() {
                    *p = rest % n;
                    rest /= n;
                }
                for (c, v) in row.iter_mut().enumerate() {
                    let prod = mats.iter().zip(&picks).fold(1.0, |acc, (m, &p)| acc * m[p * cols + c].to_f64());
                    *v = T::from_f64(prod);
                }
            }
        });
    });
    Ok(())
}

// ---- index_copy ----

fn infer_index_copy(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (old, index, new) = (&ins[0].shape, &ins[1].shape, &ins[2].shape);
    let ok = index.len() == 1
        && old.len() == new.len()
        && !old.is_empty()
        && old[0] >= new[0]
        && old[1..] == new[1..]
        && index[0] == new[0];
    if !ok {
        return Err(Error::value(format!(
            "operator {}: old_tensor {old:?}, index_vector {index:?} and new_tensor {new:?} do not fit: the index must be a vector as long as new_tensor's first dimension, and new_tensor's other dimensions must equal old_tensor's (whose first is at least as long)",
            a.op
        )));
    }
    if ins[2].dtype != ins[0].dtype {
        return Err(Error::type_error(format!(
            "operator {}: new_tensor is {}, old_tensor {}",
            a.op,
            ins[2].dtype.name(),
            ins[0].dtype.name()
        )));
    }
    Ok(vec![ins[0].clone()])
}

/// The index vector's rows, checked against `rows` (the old tensor's first dimension).
fn copy_rows(op: &str, index: &TBlob, rows: usize) -> Result<Vec<usize>> {
    read_indices(index)
        .into_iter()
        .map(|v| {
            usize::try_from(v)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| Error::index(format!("operator {op}: index {v} is out of range for {rows} rows")))
        })
        .collect()
}

/// Old tensor's rows, with row `index[i]` replaced by the new tensor's row `i`.
fn index_copy(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let rows = copy_rows(cx.attrs.op, &ins[1], ins[0].shape[0])?;
    let row_bytes = ins[2].bytes().checked_div(rows.len()).unwrap_or(0);
    outs[0].copy_from(&ins[0]);
    let (out, new) = (outs[0].as_bytes_mut(), ins[2].as_bytes());
    for (i, &r) in rows.iter().enumerate() {
        out[r * row_bytes..(r + 1) * row_bytes].copy_from_slice(&new[i * row_bytes..(i + 1) * row_bytes]);
    }
    Ok(())
}

/// Inputs: output gradient, old tensor, index, new tensor. The old tensor's gradient is the
/// output's with the replaced rows zero; the new tensor's row `i` gets row `index[i]`; the
/// index gets zeros.
fn index_copy_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let rows = copy_rows(cx.attrs.op, &ins[2], ins[1].shape[0])?;
    let g = ins[0].as_bytes();
    let row_bytes = g.len().checked_div(ins[1].shape[0]).unwrap_or(0);
    if cx.req[0] != Req::Null {
        let old = outs[0].as_bytes_mut();
        old.copy_from_slice(g);
        for &r in &rows {
            old[r * row_bytes..(r + 1) * row_bytes].fill(0);
        }
    }
    if cx.req[1] != Req::Null {
        outs[1].as_bytes_mut().fill(0);
    }
    if cx.req[2] != Req::Null {
        let new = outs[2].as_bytes_mut();
        for (i, &r) in rows.iter().enumerate() {
            new[i * row_bytes..(i + 1) * row_bytes].copy_from_slice(&g[r * row_bytes..(r + 1) * row_bytes]);
        }
    }
    Ok(())
}

// ---- quadratic ----

op_params! {
    struct QuadraticParams<'a> => QUADRATIC_PARAMS {
        a: f64 = "0", "Coefficient of the quadratic term in the quadratic function.";
        b: f64 = "0", "Coefficient of the linear term in the quadratic function.";
        c: f64 = "0", "Constant term in the quadratic function.";
    }
}

/// `a x² + b x + c`.
fn quadratic(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = QuadraticParams::of(cx.attrs);
    // Stock's coefficients are float32.
    let (a, b, c) = (p.a as f32 as f64, p.b as f32 as f64, p.c as f32 as f64);
    dispatch_float!(ins[0].dtype, cx.attrs.op, T => {
        let x = ins[0].as_slice::<T>();
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::MEDIUM, T::DTYPE, |r, o| {
            for (o, &v) in o.iter_mut().zip(&x[r]) {
                let v = v.to_f64();
                *o = T::from_f64(v * v * a + v * b + c);
            }
        });
    });
    Ok(())
}

/// Inputs: output gradient, data; `g (2 a x + b)`.
fn quadratic_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let p = QuadraticParams::of(cx.attrs);
    let (a, b) = (p.a as f32 as f64, p.b as f32 as f64);
    dispatch_float!(ins[1].dtype, cx.attrs.op, T => {
        let (g, x) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::MEDIUM, T::DTYPE, |r, o| {
            for ((o, &g), &v) in o.iter_mut().zip(&g[r.clone()]).zip(&x[r]) {
                *o = T::from_f64(g.to_f64() * (2.0 * a * v.to_f64() + b));
            }
        });
    });
    Ok(())
}

// ---- histogram ----

op_params! {
    struct HistogramParams<'a> => HISTOGRAM_PARAMS {
        bin_cnt: Option<i64> = "None", "Number of bins for uniform case";
        range: Option<&'a [f64]> = "None", "The lower and upper range of the bins. if not provided, range is simply (a.min(), a.max()). values outside the range are ignored. the first element of the range must be less than or equal to the second. range affects the automatic bin computation as well. while bin width is computed to be optimal based on the actual data within range, the bin count will fill the entire range including portions containing no data.";
    }
}

/// `data` alone with `bin_cnt` (and `range`), `data` and `bins` without.
fn histogram_inputs(a: &Attrs) -> usize {
    if HistogramParams::of(a).bin_cnt.is_some() {
        1
    } else {
        2
    }
}

/// With `bin_cnt`: the count and the range (widened by 0.5 each way when empty), checked.
fn uniform_bins(a: &Attrs) -> Result<Option<(usize, f64, f64)>> {
    let p = HistogramParams::of(a);
    match (p.bin_cnt, p.range) {
        (None, None) => Ok(None),
        (Some(n), Some(&[lo, hi])) if n >= 1 && lo <= hi => {
            Ok(Some(if lo == hi { (n as usize, lo - 0.5, hi + 0.5) } else { (n as usize, lo, hi) }))
        }
        (Some(_), Some(_)) => Err(Error::value(format!(
            "operator {}: bin_cnt must be at least 1 and range a pair (low, high) with low <= high, got {:?} and {:?}",
            a.op, p.bin_cnt, p.range
        ))),
        _ => Err(Error::value(format!("operator {}: cnt and range should both or neither specified", a.op))),
    }
}

fn infer_histogram(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = ins[0].dtype;
    if let Some((n, _, _)) = uniform_bins(a)? {
        return Ok(vec![Meta::new(vec![n], DType::I64), Meta::new(vec![n + 1], dt)]);
    }
    let bins = &ins[1];
    if bins.shape.len() != 1 || bins.shape[0] < 2 || bins.dtype != dt {
        return Err(Error::value(format!(
            "operator {}: bins must be a vector of at least 2 bounds of the data's dtype ({}), got shape {:?} of {}",
            a.op,
            dt.name(),
            bins.shape,
            bins.dtype.name()
        )));
    }
    Ok(vec![Meta::new(vec![bins.shape[0] - 1], DType::I64), bins.clone()])
}

/// Stock's bin of `x` among `n` uniform bins over [lo, hi] with bounds `b` (-1: outside).
fn uniform_bin<T: Elem>(x: T, b: &[T], n: usize, lo: f64, hi: f64) -> i64 {
    let v = x.to_f64();
    if !(v >= lo && v <= hi) {
        return -1;
    }
    let n = n as i64;
    let mut t = (((v - lo) * n as f64 / (hi - lo)) as i64).min(n - 1);
    if v < b[t as usize].to_f64() {
        t -= 1;
    }
    if t != n - 1 && v >= b[(t + 1) as usize].to_f64() {
        t += 1;
    }
    t
}

/// The bin of `x` among the bounds `b` (increasing): the last bound not above it, the last
/// bin for the upper bound, -1 outside.
fn given_bin<T: Elem>(x: T, b: &[T]) -> i64 {
    let (v, n) = (x.to_f64(), b.len() - 1);
    if !(v >= b[0].to_f64() && v <= b[n].to_f64()) {
        return -1;
    }
    let above = b.iter().position(|&e| e.to_f64() > v).unwrap_or(n + 1);
    (above as i64 - 1).min(n as i64 - 1)
}

fn histogram(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let uniform = uniform_bins(cx.attrs)?;
    let (counts, edges) = two_mut(outs, 0, 1);
    let counts = counts.as_mut::<i64>();
    counts.fill(0);
    crate::dispatch_num!(ins[0].dtype, cx.attrs.op, T => {
        let x = ins[0].as_slice::<T>();
        let edges = edges.as_mut::<T>();
        match uniform {
            Some((n, lo, hi)) => {
                for (i, e) in edges.iter_mut().enumerate() {
                    *e = T::from_f64((hi * i as f64 + (n - i) as f64 * lo) / n as f64);
                }
                for &v in x {
                    let t = uniform_bin(v, edges, n, lo, hi);
                    if t >= 0 {
                        counts[t as usize] += 1;
                    }
                }
            }
            None => {
                let bounds = ins[1].as_slice::<T>();
                edges.copy_from_slice(bounds);
                for &v in x {
                    let t = given_bin(v, bounds);
                    if t >= 0 {
                        counts[t as usize] += 1;
                    }
                }
            }
        }
    });
    Ok(())
}

op_params! {
    /// `_contrib_boolean_mask`'s parameters.
    struct BooleanMaskParams<'a> => BOOLEAN_MASK_PARAMS {
        axis: i64 = "0", "An integer that represents the axis in NDArray to mask from.";
    }
}

/// Which of the mask's elements are non-zero (C's truth of each value: `-0.0` is false, NaN
/// true).
fn mask_rows(mask: &NDArray) -> Result<Vec<usize>> {
    let bytes = mask.to_host_bytes()?;
    let size = mask.dtype.size();
    let truth = |b: &[u8]| match mask.dtype {
        DType::F32 => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) != 0.0,
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap_or([0; 8])) != 0.0,
        DType::F16 => u16::from_ne_bytes([b[0], b[1]]) & 0x7fff != 0,
        _ => b.iter().any(|&v| v != 0),
    };
    Ok(bytes.chunks_exact(size).enumerate().filter(|(_, b)| truth(b)).map(|(i, _)| i).collect())
}

/// `rows` of `x` (rows of `row` bytes each), in order.
fn gather_rows(x: &[u8], rows: &[usize], row: usize) -> Vec<u8> {
    rows.iter().flat_map(|&r| &x[r * row..(r + 1) * row]).copied().collect()
}

fn invoke_boolean_mask(
    _: &'static OpDef,
    inputs: &[&NDArray],
    out: Option<&[&NDArray]>,
    a: Attrs,
) -> Result<OwnInvoked> {
    const OP: &str = "_contrib_boolean_mask";
    let axis = BooleanMaskParams::of(&a).axis;
    let &[data, index] = inputs else {
        return Err(Error::value(format!("{OP} takes two arrays (data, index), got {}", inputs.len())));
    };
    if data.ctx().is_some_and(|c| !c.dev_type.is_host()) || index.ctx().is_some_and(|c| !c.dev_type.is_host()) {
        return Err(Error::not_supported(format!("{OP} on a GPU")));
    }
    if axis != 0 {
        return Err(Error::mxnet(format!("{OP}: axis {axis}: only axis 0 is supported (as in stock)")));
    }
    if index.shape.len() != 1 || data.shape.first() != index.shape.first() {
        return Err(Error::mxnet(format!(
            "{OP}: the index must be 1-D with one value per row of the data: data {:?}, index {:?}",
            data.shape, index.shape
        )));
    }
    let rows = mask_rows(index)?;
    let mut shape = data.shape.clone();
    shape[0] = rows.len();
    let row = data.size() / data.shape[0].max(1) * data.dtype.size();
    let bytes = gather_rows(&data.to_host_bytes()?, &rows, row);
    // On the data's context (cpu(1), cpu_pinned, cpu_shared), as stock's output is.
    let made = HostResult { shape, dtype: data.dtype, bytes }.deliver(
        OP,
        "the result has shape",
        data.ctx().unwrap_or(Context::CPU),
        out,
    )?;
    let backward =
        BooleanMaskBackward { rows, data: (data.shape.clone(), data.dtype), index: (index.shape.clone(), index.dtype) };
    Ok((vec![made], Some(Arc::new(backward))))
}

/// A recorded `_contrib_boolean_mask`: the rows it selected, and its inputs' shapes and types.
struct BooleanMaskBackward {
    rows: Vec<usize>,
    data: (Vec<usize>, DType),
    index: (Vec<usize>, DType),
}

impl CustomBackward for BooleanMaskBackward {
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>> {
        let (shape, dtype) = &self.data;
        let grad_data = match want.first() {
            Some(true) => {
                let [g] = ograds else {
                    return Err(Error::internal("_contrib_boolean_mask's backward takes one gradient"));
                };
                let row = shape.iter().skip(1).product::<usize>() * dtype.size();
                if g.dtype != *dtype || g.size() * dtype.size() != self.rows.len() * row {
                    return Err(Error::internal(format!(
                        "_contrib_boolean_mask's backward got a gradient of shape {:?} {} for {} rows of {}",
                        g.shape,
                        g.dtype.name(),
                        self.rows.len(),
                        dtype.name()
                    )));
                }
                let g = g.to_host_bytes()?;
                let mut bytes = vec![0u8; shape.iter().product::<usize>() * dtype.size()];
                for (k, &r) in self.rows.iter().enumerate() {
                    bytes[r * row..(r + 1) * row].copy_from_slice(&g[k * row..(k + 1) * row]);
                }
                Some(NDArray::from_host_bytes(shape.clone(), *dtype, &bytes)?)
            }
            _ => None,
        };
        let grad_index = match want.get(1) {
            Some(true) => {
                let (shape, dtype) = &self.index;
                Some(NDArray::from_host_bytes(shape.clone(), *dtype, &vec![0u8; shape[0] * dtype.size()])?)
            }
            _ => None,
        };
        Ok(vec![grad_data, grad_index])
    }
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "_contrib_boolean_mask",
            Inputs::Fixed(&["data", "index"]),
            Box::new(|_, _| {
                Err(Error::not_supported(
                    "_contrib_boolean_mask in a symbolic graph (its output shape depends on the mask's values)",
                ))
            }),
            Box::new(|_, _, _| Err(Error::internal("_contrib_boolean_mask runs through its own invocation"))),
        )
        .alias(&["_npi_boolean_mask"])
        .params(BOOLEAN_MASK_PARAMS)
        .invoke_with(invoke_boolean_mask)
        .doc("Given an n-d NDArray data, and a 1-d NDArray index, the operator produces an un-predeterminable shaped n-d NDArray out, which stands for the rows in x where the corresonding element in index is non-zero."),
    );
    ops.push(
        OpDef::new("_contrib_allclose", Inputs::Fixed(&["a", "b"]), Box::new(infer_allclose), Box::new(allclose))
            .params(ALLCLOSE_PARAMS)
            .grad(Grad::None)
            .doc("This operators implements the numpy.allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False): 1 (uint8, shape ()) when |a - b| <= atol + rtol |b| everywhere."),
    );
    ops.push(
        OpDef::new("_contrib_arange_like", Inputs::Fixed(&["data"]), Box::new(infer_arange_like), Box::new(arange_like))
            .alias(&["_npx_arange_like"])
            .params(ARANGE_LIKE_PARAMS)
            .grad(Grad::Zero)
            .doc("Return an array with evenly spaced values. If axis is not given, the output will have the same shape as the input array. Otherwise, the output will be a 1-D array with size of the specified axis in input shape."),
    );
    ops.push(
        OpDef::new(
            "_contrib_div_sqrt_dim",
            Inputs::Fixed(&["data"]),
            Box::new(infer_div_sqrt_dim),
            Box::new(div_sqrt_dim),
        )
        .elementwise_shape()
        .grad(Grad::Backward { op: "_backward_div_sqrt_dim", inputs: true, outputs: false })
        .doc("Rescale the input by the square root of the channel dimension: out = data / sqrt(data.shape[-1])."),
    );
    ops.push(OpDef::backward("_backward_div_sqrt_dim", &[], Box::new(div_sqrt_dim_backward)));
    ops.push(
        OpDef::new("_contrib_index_array", Inputs::Fixed(&["data"]), Box::new(infer_index_array), Box::new(index_array))
            .alias(&["_npx_index_array"])
            .params(INDEX_ARRAY_PARAMS)
            .grad(Grad::Zero)
            .doc("Returns an array of indexes of the input array: for an input of shape (d_1, ..., d_n), an int64 array of shape (d_1, ..., d_n, n) (or (..., m) with m axes given) whose last dimension holds each element's index (along the given axes)."),
    );
    ops.push(
        OpDef::new(
            "_contrib_index_copy",
            Inputs::Fixed(&["old_tensor", "index_vector", "new_tensor"]),
            Box::new(infer_index_copy),
            Box::new(index_copy),
        )
        .alias(&["_npx_index_copy"])
        .grad(Grad::Backward { op: "_contrib_backward_index_copy", inputs: true, outputs: false })
        .doc("Copies the elements of a `new_tensor` into the `old_tensor`: if `index[i] == j`, the `i` th row of `new_tensor` is the `j` th row of the output; the other rows are `old_tensor`'s."),
    );
    ops.push(OpDef::backward("_contrib_backward_index_copy", &[], Box::new(index_copy_backward)));
    ops.push(
        OpDef::new(
            "_contrib_quadratic",
            Inputs::Fixed(&["data"]),
            Box::new(infer_float_like_first),
            Box::new(quadratic),
        )
        .params(QUADRATIC_PARAMS)
        .elementwise_shape()
        .same_shape()
        .grad(Grad::Backward { op: "_contrib_backward_quadratic", inputs: true, outputs: false })
        .doc("This operators implements the quadratic function f(x) = a * x^2 + b * x + c, element-wise."),
    );
    ops.push(OpDef::backward("_contrib_backward_quadratic", QUADRATIC_PARAMS, Box::new(quadratic_backward)));
    ops.push(
        OpDef::new(
            "_histogram",
            Inputs::Leading(&["data", "bins"], histogram_inputs),
            Box::new(infer_histogram),
            Box::new(histogram),
        )
        .alias(&["_npi_histogram"])
        .params(HISTOGRAM_PARAMS)
        .outputs(|_| 2, |_| 2)
        .grad(Grad::None)
        .doc("This operators implements the histogram function: the counts (int64) of data in each bin and the bin edges, with bin_cnt uniform bins over range, or the bins given by the bounds in bins."),
    );
    ops.push(
        OpDef::new("khatri_rao", Inputs::Variadic("args"), Box::new(infer_khatri_rao), Box::new(khatri_rao))
            .params(KHATRI_RAO_PARAMS)
            .num_args_key("num_args")
            .grad(Grad::None)
            .doc("Computes the Khatri-Rao product of the input matrices: for matrices A_1 (M_1 x N) ... A_n (M_n x N), the (M_1 ... M_n) x N matrix whose k-th column is the outer product of the inputs' k-th columns."),
    );
    ops.push(
        OpDef::new("all_finite", Inputs::Fixed(&["data"]), Box::new(infer_all_finite), Box::new(all_finite))
            .params(ALL_FINITE_PARAMS)
            .grad(Grad::None)
            .doc("Check if all the float numbers in the array are finite (used for AMP)"),
    );
    ops.push(
        OpDef::new("multi_sum_sq", Inputs::Variadic("data"), Box::new(infer_multi_sum_sq), Box::new(multi_sum_sq))
            .params(MULTI_SUM_SQ_PARAMS)
            .num_args_key("num_arrays")
            .grad(Grad::None)
            .doc("Compute the sums of squares of multiple arrays (float32, one per array)."),
    );
    ops.push(
        OpDef::new("multi_all_finite", Inputs::Variadic("data"), Box::new(infer_all_finite), Box::new(all_finite))
            .params(MULTI_ALL_FINITE_PARAMS)
            .num_args_key("num_arrays")
            .grad(Grad::None)
            .doc("Check if all the float numbers in all the arrays are finite (used for AMP)"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::testing::{array_f32 as array, values};
    use crate::ndarray::NDArray;
    use crate::op::invoke::invoke;
    use crate::op::lookup;

    /// An output's values (uint8 or float32).
    fn read(a: &NDArray) -> Vec<f64> {
        if a.dtype != DType::U8 {
            return values(a).into_iter().map(f64::from).collect();
        }
        let mut v = vec![0u8; a.size()];
        // SAFETY: `v` has room for the array's elements, one byte each.
        unsafe { a.copy_to_host(v.as_mut_ptr(), v.len()).unwrap() };
        v.into_iter().map(f64::from).collect()
    }

    #[test]
    fn allclose_and_all_finite_follow_stocks_rules() {
        let call = |op: &str, ins: &[&NDArray], kv: &[(&str, &str)]| {
            let out = invoke(lookup(op).unwrap(), ins, None, kv.iter().copied()).unwrap();
            read(&out[0])
        };
        let (a, b) = (array(&[3], &[1.0, f32::NAN, 3.0]), array(&[3], &[1.0 + 1e-6, f32::NAN, 3.0]));
        assert_eq!(call("_contrib_allclose", &[&a, &b], &[]), [1.0]);
        assert_eq!(call("_contrib_allclose", &[&a, &b], &[("equal_nan", "False")]), [0.0]);
        let c = array(&[3], &[1.1, f32::NAN, 3.0]);
        assert_eq!(call("_contrib_allclose", &[&a, &c], &[]), [0.0]);
        assert_eq!(call("all_finite", &[&a], &[]), [0.0]);
        assert_eq!(call("all_finite", &[&array(&[2], &[1.0, -2.0])], &[]), [1.0]);
        let inf = array(&[1], &[f32::INFINITY]);
        assert_eq!(call("multi_all_finite", &[&b, &inf], &[("num_arrays", "2")]), [0.0]);
        assert_eq!(
            call("_contrib_arange_like", &[&a], &[("start", "2"), ("step", "0.5"), ("repeat", "2")]),
            [2.0, 2.0, 2.5]
        );
        let x = array(&[2, 4], &[2.0, 4.0, 6.0, 8.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(call("_contrib_div_sqrt_dim", &[&x], &[]), [1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5]);
    }
}
