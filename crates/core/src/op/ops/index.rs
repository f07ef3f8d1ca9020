//! Indexing operators: `slice`, `slice_axis`, `slice_like`, `_slice_assign`,
//! `_slice_assign_scalar`, `take`, `pick`, `one_hot`, `where`, `gather_nd`,
//! `scatter_nd`, `_scatter_set_nd`, `fill_element_0index`, and the sorting family `sort`, `argsort`, `topk`.
//!
//! Slices are strided views copied by [`super::strided`]; gathers copy whole inner blocks
//! by element size; index arrays of any dtype are read as integers (truncated like stock).

use super::common::norm_axis;
use super::shape::enum_dtype;
use super::strided::{by_size, contiguous_strides, copy, elems, elems_mut, pod, View};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::op_params;
use crate::op::param::Attrs;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, InferFn, Inputs, Meta, OpCtx, OpDef, Req};
use crate::{dispatch_all, dispatch_num};
use std::cmp::Ordering;

type Infer = fn(&Attrs, &[Meta]) -> Result<Vec<Meta>>;
type Compute = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;

fn op(name: &'static str, inputs: Inputs, infer: Infer, compute: Compute) -> OpDef {
    let infer: InferFn = Box::new(infer);
    OpDef::new(name, inputs, infer, Box::new(compute))
}

fn bwd(op: &'static str, inputs: bool) -> Grad {
    Grad::Backward { op, inputs, outputs: false }
}

fn one_out(shape: Vec<usize>, dtype: DType) -> Result<Vec<Meta>> {
    Ok(vec![Meta::new(shape, dtype)])
}

/// An index array's values as integers (floats truncated toward zero).
pub(super) fn read_indices(b: &TBlob) -> Vec<i64> {
    dispatch_all!(b.dtype, T => b.as_slice::<T>().iter().map(|v| v.to_f64() as i64).collect())
}

// ---- slice family ----

op_params! {
    pub(super) struct SliceParams<'a> => SLICE_PARAMS {
        begin: &'a [Option<i64>] = required, "starting indices for the slice operation, supports negative indices.";
        end: &'a [Option<i64>] = required, "ending indices for the slice operation, supports negative indices.";
        step: &'a [Option<i64>] = "()", "step for the slice operation, supports negative values.";
    }
}

/// Per axis: (begin, step, length) of a slice with stock's rules.
pub(super) fn slice_ranges(
    op: &str,
    shape: &[usize],
    begin: &[Option<i64>],
    end: &[Option<i64>],
    step: &[Option<i64>],
) -> Result<Vec<(i64, i64, usize)>> {
    let nd = shape.len();
    if begin.len() > nd {
        return Err(Error::value(format!(
            "operator {op}: begin {begin:?} has more axes than the input shape {shape:?}"
        )));
    }
    if end.len() != begin.len() {
        return Err(Error::value(format!("operator {op}: begin {begin:?} and end {end:?} must have the same length")));
    }
    if !step.is_empty() && step.len() != begin.len() {
        return Err(Error::value(format!("operator {op}: step {step:?} must be empty or as long as begin {begin:?}")));
    }
    let mut out = Vec::with_capacity(nd);
    for (i, &d) in shape.iter().enumerate() {
        if i >= begin.len() {
            out.push((0, 1, d));
            continue;
        }
        let s = step.get(i).copied().flatten().unwrap_or(1);
        if s == 0 {
            return Err(Error::value(format!("operator {op}: step[{i}] cannot be 0")));
        }
        let len = d as i64;
        if len == 0 {
            out.push((0, s, 0));
            continue;
        }
        let mut b = begin[i].unwrap_or(if s < 0 { len - 1 } else { 0 });
        let mut e = end[i].unwrap_or(if s < 0 { -1 } else { len });
        if b < 0 {
            b += len;
        }
        if e < 0 && end[i].is_some() {
            e += len;
        }
        if b < 0 && s > 0 {
            b = 0;
        }
        if b > len - 1 && s < 0 {
            b = len - 1;
        }
        if b < 0 || b > len - 1 {
            b = -1;
        }
        e = e.clamp(-1, len);
        let n = if e != b && b >= 0 {
            if (s > 0 && b >= e) || (s < 0 && e >= b) {
                return Err(Error::value(format!(
                    "operator {op}: slicing with begin[{i}]={b}, end[{i}]={e} and step[{i}]={s} is invalid for axis {i} of size {len}"
                )));
            }
            if s > 0 {
                (e - b - 1) / s + 1
            } else {
                (b - e - 1) / (-s) + 1
            }
        } else {
            0
        };
        out.push((b.max(0), s, n as usize));
    }
    Ok(out)
}

/// The strided view of `shape` that a slice selects, and its shape.
pub(super) fn slice_view(ranges: &[(i64, i64, usize)], shape: &[usize]) -> (View, Vec<usize>) {
    let st = contiguous_strides(shape);
    let mut v = View { off: 0, strides: Vec::with_capacity(shape.len()) };
    for (k, &(b, s, n)) in ranges.iter().enumerate() {
        if n > 0 {
            v.off += b as isize * st[k];
        }
        v.strides.push(s as isize * st[k]);
    }
    (v, ranges.iter().map(|r| r.2).collect())
}

/// The view `begin`/`end`/`step` select: `slice` and `_slice_assign` (one table) and
/// `_slice_assign_scalar` (its own).
pub(super) fn attr_slice(op: &str, a: &Attrs, shape: &[usize]) -> Result<(View, Vec<usize>)> {
    let (begin, end, step) = if a.declares(SLICE_ASSIGN_SCALAR_PARAMS) {
        let p = SliceAssignScalarParams::of(a);
        (p.begin, p.end, p.step)
    } else {
        let p = SliceParams::of(a);
        (p.begin, p.end, p.step)
    };
    let r = slice_ranges(op, shape, begin, end, step)?;
    Ok(slice_view(&r, shape))
}

fn infer_slice(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(attr_slice("slice", a, &ins[0].shape)?.1, ins[0].dtype)
}

fn run_slice(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (v, shape) = attr_slice("slice", cx.attrs, &ins[0].shape)?;
    copy(&ins[0], &v, &mut outs[0], &View::contiguous(&shape), &shape);
    Ok(())
}

op_params! {
    pub(super) struct SliceAxisParams<'a> => SLICE_AXIS_PARAMS {
        axis: i64 = required, "Axis along which to be sliced, supports negative indexes.";
        begin: i64 = required, "The beginning index along the axis to be sliced, supports negative indexes.";
        end: Option<i64> = required, "The ending index along the axis to be sliced, supports negative indexes; None is the end.";
    }
}

pub(super) fn slice_axis_ranges(a: &Attrs, shape: &[usize]) -> Result<Vec<(i64, i64, usize)>> {
    let p = SliceAxisParams::of(a);
    let ax = norm_axis("slice_axis", p.axis, shape.len())?;
    let len = shape[ax] as i64;
    let mut r: Vec<(i64, i64, usize)> = shape.iter().map(|&d| (0, 1, d)).collect();
    if len == 0 {
        return Ok(r);
    }
    let mut b = p.begin;
    if b < 0 {
        b += len;
    }
    let e = match p.end {
        None => len,
        Some(e) if e < 0 => e + len,
        Some(e) => e,
    };
    if b < 0 || e > len || b >= e {
        return Err(Error::value(format!(
            "operator slice_axis: invalid begin={} end={:?} for axis {ax} of size {len}",
            p.begin, p.end
        )));
    }
    r[ax] = (b, 1, (e - b) as usize);
    Ok(r)
}

fn infer_slice_axis(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(slice_axis_ranges(a, &ins[0].shape)?.iter().map(|r| r.2).collect(), ins[0].dtype)
}

/// Stock's partial rule: an unknown sliced axis leaves the output's unknown too (the other
/// axes are copied); a known one is sliced as usual.
fn partial_slice_axis(a: &Attrs, ins: &[Option<Vec<i64>>]) -> Option<Vec<Option<Vec<i64>>>> {
    let shape = ins.first()?.as_ref()?;
    let ax = norm_axis("slice_axis", SliceAxisParams::of(a).axis, shape.len()).ok()?;
    (shape[ax] < 0).then(|| vec![Some(shape.clone())])
}

fn run_slice_axis(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (v, shape) = slice_view(&slice_axis_ranges(cx.attrs, &ins[0].shape)?, &ins[0].shape);
    copy(&ins[0], &v, &mut outs[0], &View::contiguous(&shape), &shape);
    Ok(())
}

op_params! {
    pub(super) struct SliceLikeParams<'a> => SLICE_LIKE_PARAMS {
        axes: &'a [i64] = "()", "List of axes on which input data will be sliced according to the corresponding size of the second input.";
    }
}

fn slice_like_shape(a: &Attrs, l: &[usize], r: &[usize]) -> Result<Vec<usize>> {
    let params = SliceLikeParams::of(a);
    let axes = params.axes;
    let mut out = l.to_vec();
    if axes.is_empty() {
        if l.len() != r.len() {
            return Err(Error::value(format!(
                "operator slice_like: with no axes the inputs need the same number of dimensions, got {l:?} and {r:?}"
            )));
        }
        out = r.to_vec();
    } else {
        for &ax in axes {
            let k = norm_axis("slice_like", ax, l.len())?;
            if k >= r.len() {
                return Err(Error::index(format!(
                    "operator slice_like: axis {ax} is out of range for shape_like {r:?}"
                )));
            }
            out[k] = r[k];
        }
    }
    if out.iter().zip(l).any(|(o, d)| o > d) {
        return Err(Error::value(format!("operator slice_like: cannot slice shape {l:?} to the larger {out:?}")));
    }
    Ok(out)
}

fn infer_slice_like(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(slice_like_shape(a, &ins[0].shape, &ins[1].shape)?, ins[0].dtype)
}

fn run_slice_like(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let shape = outs[0].shape.clone();
    let v = View::contiguous(&ins[0].shape);
    copy(&ins[0], &v, &mut outs[0], &View::contiguous(&shape), &shape);
    Ok(())
}

fn infer_slice_assign(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (_, shape) = attr_slice("_slice_assign", a, &ins[0].shape)?;
    if ins[1].shape != shape {
        return Err(Error::value(format!(
            "operator _slice_assign: rhs has shape {:?} but the slice of lhs {:?} has shape {shape:?}",
            ins[1].shape, ins[0].shape
        )));
    }
    if ins[1].dtype != ins[0].dtype {
        return Err(Error::type_error(format!(
            "operator _slice_assign: rhs has dtype {}, lhs {}",
            ins[1].dtype.name(),
            ins[0].dtype.name()
        )));
    }
    Ok(vec![ins[0].clone()])
}

fn run_slice_assign(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Inplace {
        outs[0].copy_from(&ins[0]);
    }
    let (v, shape) = attr_slice("_slice_assign", cx.attrs, &ins[0].shape)?;
    copy(&ins[1], &View::contiguous(&shape), &mut outs[0], &v, &shape);
    Ok(())
}

op_params! {
    pub(super) struct SliceAssignScalarParams<'a> => SLICE_ASSIGN_SCALAR_PARAMS {
        scalar: f64 = "0", "The scalar value for assignment.";
        begin: &'a [Option<i64>] = required, "starting indices for the slice operation, supports negative indices.";
        end: &'a [Option<i64>] = required, "ending indices for the slice operation, supports negative indices.";
        step: &'a [Option<i64>] = "()", "step for the slice operation, supports negative values.";
    }
}

fn infer_slice_assign_scalar(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    attr_slice("_slice_assign_scalar", a, &ins[0].shape)?;
    Ok(vec![ins[0].clone()])
}

/// Fill view `v` (of `shape`) of `out` with `value` converted to the output's dtype.
fn fill_view(out: &mut OutBlob, v: &View, shape: &[usize], value: f64) {
    dispatch_all!(out.dtype, T => {
        let mut one = [T::from_f64(value)];
        // SAFETY: `one` outlives the blob, which is only read by `copy` below.
        let src = unsafe { TBlob::new(one.as_mut_ptr().cast::<u8>(), &[1], T::DTYPE) };
        copy(&src, &View { off: 0, strides: vec![0; shape.len()] }, out, v, shape);
    })
}

fn run_slice_assign_scalar(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Inplace {
        outs[0].copy_from(&ins[0]);
    }
    let (v, shape) = attr_slice("_slice_assign_scalar", cx.attrs, &ins[0].shape)?;
    fill_view(&mut outs[0], &v, &shape, SliceAssignScalarParams::of(cx.attrs).scalar);
    Ok(())
}

// ---- take, pick ----

const TAKE_MODES: &[&str] = &["raise", "wrap", "clip"];

op_params! {
    pub(super) struct TakeParams<'a> => TAKE_PARAMS {
        axis: i64 = "0", "The axis of input array to be taken.";
        mode: &'a str = "clip" in *TAKE_MODES, "Specify how out-of-bound indices bahave: clip, wrap or raise.";
    }
}

/// Resolve index `i` on an axis of length `n` under `mode` (`c`lip, `w`rap, `r`aise).
pub(super) fn resolve(op: &str, i: i64, n: usize, mode: u8) -> Result<usize> {
    let n = n as i64;
    if n == 0 {
        return Err(Error::index(format!("operator {op}: cannot index an axis of length 0")));
    }
    Ok(match mode {
        b'c' => i.clamp(0, n - 1),
        b'w' => i.rem_euclid(n),
        _ => {
            // Only 0..n (stock's take in raise mode refuses negative indices too); an
            // MXNetError, as stock reports it.
            if i < 0 || i >= n {
                return Err(Error::mxnet(format!("operator {op}: index {i} is out of bounds for axis of size {n}")));
            }
            i
        }
    } as usize)
}

fn infer_take(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = TakeParams::of(a);
    let s = &ins[0].shape;
    if s.is_empty() {
        return Err(Error::value("operator take: the data array must have at least one dimension"));
    }
    let ax = norm_axis("take", params.axis, s.len())?;
    let mut out = s[..ax].to_vec();
    out.extend_from_slice(&ins[1].shape);
    out.extend_from_slice(&s[ax + 1..]);
    one_out(out, ins[0].dtype)
}

/// `out[o, j, :] = data[o, idx[j], :]` for blocks of `inner` elements.
fn gather_blocks(data: &TBlob, out: &mut OutBlob, outer: usize, n: usize, idx: &[usize], inner: usize) {
    debug_assert_eq!(out.size(), outer * idx.len() * inner);
    by_size!(data.dtype, E => {
        let src = elems::<E>(data);
        let m = idx.len();
        par_for_mut(elems_mut::<E>(out), inner, Cost(0.25 * inner as f64 + 2.0), data.dtype, |r, dst| {
            for (t, d) in r.zip(dst.chunks_mut(inner.max(1))) {
                let (o, j) = (t / m, t % m);
                let at = (o * n + idx[j]) * inner;
                d.copy_from_slice(&src[at..at + inner]);
            }
        });
    });
}

fn run_take(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let s = &ins[0].shape;
    let params = TakeParams::of(cx.attrs);
    let ax = norm_axis("take", params.axis, s.len())?;
    let mode = params.mode.as_bytes()[0];
    let idx = read_indices(&ins[1]);
    if idx.is_empty() || outs[0].size() == 0 {
        return Ok(());
    }
    let idx: Vec<usize> = idx.iter().map(|&i| resolve("take", i, s[ax], mode)).collect::<Result<_>>()?;
    gather_blocks(&ins[0], &mut outs[0], s[..ax].iter().product(), s[ax], &idx, s[ax + 1..].iter().product());
    Ok(())
}

// ---- Embedding ----

/// The dtypes stock's `Embedding` names for its weight (bfloat16 is refused at the call).
const EMBEDDING_DTYPES: &[&str] = &["bfloat16", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"];

op_params! {
    pub(super) struct EmbeddingParams<'a> => EMBEDDING_PARAMS {
        input_dim: i64 = required, "Vocabulary size of the input indices.";
        output_dim: i64 = required, "Dimension of the embedding vectors.";
        dtype: &'a str = "float32" in *EMBEDDING_DTYPES, "Data type of weight.";
        sparse_grad: bool = "0", "Compute row sparse gradient in the backward calculation. If set to True, the grad's storage type is row_sparse.";
    }
}

/// `Embedding`'s validated (input_dim, output_dim, weight dtype).
pub(super) fn embedding_dims(a: &Attrs) -> Result<(usize, usize, DType)> {
    let p = EmbeddingParams::of(a);
    for (name, v) in [("input_dim", p.input_dim), ("output_dim", p.output_dim)] {
        if v < 1 {
            return Err(Error::mxnet(format!("operator Embedding: {name} must be >= 1, got {v}")));
        }
    }
    if p.sparse_grad {
        return Err(Error::not_supported("Embedding with sparse_grad=True (row_sparse gradients)"));
    }
    let dtype = crate::op::param::dtype_from_name(p.dtype)
        .ok_or_else(|| Error::not_supported(format!("Embedding with dtype {}", p.dtype)))?;
    Ok((p.input_dim as usize, p.output_dim as usize, dtype))
}

fn infer_embedding(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    // The parameters are checked (a bfloat16 `dtype` is refused) even though, as in stock,
    // the output has the weight's dtype: the `dtype` parameter only gives an unknown weight
    // its type, in graph inference (`params_take_dtype`).
    let (vocab, dim, _) = embedding_dims(a)?;
    let w = &ins[1];
    if w.shape != [vocab, dim] {
        return Err(Error::mxnet(format!(
            "operator Embedding: weight has shape {:?}, expected ({vocab}, {dim}) from input_dim and output_dim",
            w.shape
        )));
    }
    let mut out = ins[0].shape.clone();
    out.push(dim);
    one_out(out, w.dtype)
}

/// Graph inference of the weight from the parameters.
fn embedding_param_shapes(a: &Attrs, _: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let (vocab, dim, _) = embedding_dims(a)?;
    Ok(vec![(1, vec![vocab as i64, dim as i64])])
}

/// `out[..., :] = weight[clip(data[...]), :]`: stock clips indices to `[0, input_dim)` (values
/// are truncated toward zero first).
fn run_embedding(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let w = &ins[1];
    let (vocab, dim) = (w.shape[0], w.shape[1]);
    let idx = read_indices(&ins[0]);
    if idx.is_empty() || dim == 0 {
        return Ok(());
    }
    let idx: Vec<usize> = idx.iter().map(|&i| resolve("Embedding", i, vocab, b'c')).collect::<Result<_>>()?;
    gather_blocks(w, &mut outs[0], 1, vocab, &idx, dim);
    Ok(())
}

op_params! {
    pub(super) struct PickParams<'a> => PICK_PARAMS {
        axis: Option<i64> = "-1", "int or None. The axis to picking the elements. Negative values means indexing from right to left.";
        keepdims: bool = "False", "If true, the axis where we pick the elements is left in the result as dimension with size one.";
        mode: &'a str = "clip" in *TAKE_MODES, "Specify how out-of-bound indices behave: clip, wrap or raise.";
    }
}

pub(super) fn pick_axis(a: &Attrs, shape: &[usize]) -> Result<usize> {
    let params = PickParams::of(a);
    match params.axis {
        Some(ax) => norm_axis("pick", ax, shape.len()),
        None => Err(Error::not_supported("operator pick with axis=None")),
    }
}

fn infer_pick(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = PickParams::of(a);
    let s = &ins[0].shape;
    let ax = pick_axis(a, s)?;
    let mut out = s.clone();
    if params.keepdims {
        out[ax] = 1;
    } else {
        out.remove(ax);
    }
    // The index has the data's shape without the axis (stock checks it with keepdims off,
    // so Gluon's pick(pred, label, keepdims=True) passes a (batch,) label); the kept-dims
    // shape is accepted too (same elements).
    let mut flat = s.clone();
    flat.remove(ax);
    if ins[1].shape != flat && ins[1].shape != out {
        return Err(Error::value(format!(
            "operator pick: index has shape {:?}, expected {flat:?} for data {s:?} and axis {ax}",
            ins[1].shape
        )));
    }
    one_out(out, ins[0].dtype)
}

fn run_pick(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let s = &ins[0].shape;
    let ax = pick_axis(cx.attrs, s)?;
    let mode = PickParams::of(cx.attrs).mode.as_bytes()[0];
    let (n, inner) = (s[ax], s[ax + 1..].iter().product::<usize>());
    let idx = read_indices(&ins[1]);
    if idx.is_empty() {
        return Ok(());
    }
    let idx: Vec<usize> = idx.iter().map(|&i| resolve("pick", i, n, mode)).collect::<Result<_>>()?;
    by_size!(ins[0].dtype, E => {
        let src = elems::<E>(&ins[0]);
        par_for_mut(elems_mut::<E>(&mut outs[0]), 1, Cost(1.0), ins[0].dtype, |r, dst| {
            for (t, d) in r.zip(dst) {
                let (o, i) = (t / inner, t % inner);
                *d = src[(o * n + idx[t]) * inner + i];
            }
        });
    });
    Ok(())
}

// ---- one_hot, where ----

const DTYPE_ENUM: &[&str] = &["bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"];

op_params! {
    pub(super) struct OneHotParams<'a> => ONE_HOT_PARAMS {
        depth: i64 = required, "Depth of the one hot dimension.";
        on_value: f64 = "1", "The value assigned to the locations represented by indices.";
        off_value: f64 = "0", "The value assigned to the locations not represented by indices.";
        dtype: &'a str = "float32" in *DTYPE_ENUM, "DType of the output";
    }
}

fn infer_one_hot(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = OneHotParams::of(a);
    let depth = params.depth;
    if depth < 0 {
        return Err(Error::value(format!("operator one_hot: depth must be non-negative, got {depth}")));
    }
    let mut out = ins[0].shape.clone();
    out.push(depth as usize);
    one_out(out, enum_dtype(params.dtype))
}

fn run_one_hot(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = OneHotParams::of(cx.attrs);
    let depth = params.depth;
    let idx = read_indices(&ins[0]);
    let (on, off) = (params.on_value, params.off_value);
    super::init::fill(&mut outs[0], off);
    let d = depth as usize;
    dispatch_all!(outs[0].dtype, T => {
        let o = outs[0].as_mut::<T>();
        let on = T::from_f64(on);
        for (k, &i) in idx.iter().enumerate() {
            if (0..depth).contains(&i) {
                o[k * d + i as usize] = on;
            }
        }
    });
    Ok(())
}

fn infer_where(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (c, x, y) = (&ins[0], &ins[1], &ins[2]);
    super::common::check_same("where", x, y, 2)?;
    let ok = c.shape == x.shape || (c.shape.len() == 1 && !x.shape.is_empty() && c.shape[0] == x.shape[0]);
    if !ok {
        return Err(Error::value(format!(
            "operator where: condition has shape {:?}; it must equal x's shape {:?} or be 1-D of x's first dimension",
            c.shape, x.shape
        )));
    }
    Ok(vec![x.clone()])
}

fn known(s: &Option<Vec<i64>>) -> bool {
    s.as_ref().is_some_and(|v| v.iter().all(|&d| d >= 0))
}

/// `where`'s partial rule (stock's `WhereOpShape`): nothing is learned until the
/// condition's shape is known; then x, y and the output share one shape, which a condition
/// of the same rank also has.
fn where_partial(_: &Attrs, ins: &[Option<Vec<i64>>]) -> Option<Vec<Option<Vec<i64>>>> {
    if !known(&ins[0]) {
        return Some(vec![None]);
    }
    let mut t: Vec<i64> = ins[1].clone()?;
    let others = if ins[0].as_ref().map(Vec::len) == Some(t.len()) { ins } else { &ins[2..] };
    for s in others.iter().flatten() {
        if s.len() != t.len() {
            return None; // the generic rule names the mismatch
        }
        for (a, &b) in t.iter_mut().zip(s) {
            if *a < 0 {
                *a = b;
            }
        }
    }
    Some(vec![Some(t)])
}

/// `where`'s inputs from its output once the condition's shape is known: x and y have the
/// output's shape.
fn where_input_shapes(
    _: &Attrs,
    ins: &[Option<Vec<i64>>],
    outs: &[Option<Vec<i64>>],
) -> Result<Vec<(usize, Vec<i64>)>> {
    match outs.first() {
        Some(Some(out)) if known(&ins[0]) => Ok(vec![(1, out.clone()), (2, out.clone())]),
        _ => Ok(vec![]),
    }
}

fn where_typed<C: Elem, E: pod::Pod>(c: &TBlob, x: &TBlob, y: &TBlob, out: &mut OutBlob, dtype: DType) {
    let cond = c.as_slice::<C>();
    let (xs, ys) = (elems::<E>(x), elems::<E>(y));
    let n = out.size();
    let per = if cond.len() == n { 1 } else { n / cond.len().max(1) };
    let zero = C::zero();
    par_for_mut(elems_mut::<E>(out), 1, Cost(0.5), dtype, |r, o| {
        for (i, o) in r.zip(o) {
            *o = if cond[i / per] != zero { xs[i] } else { ys[i] };
        }
    });
}

fn run_where(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if outs[0].size() == 0 {
        return Ok(());
    }
    let dt = ins[1].dtype;
    dispatch_all!(ins[0].dtype, C => by_size!(dt, E => where_typed::<C, E>(&ins[0], &ins[1], &ins[2], &mut outs[0], dt)));
    Ok(())
}

// ---- gather_nd, _scatter_set_nd ----

/// (M, number of index tuples, inner block, strides of the first M data axes).
pub(super) fn nd_geometry(op: &str, data: &[usize], idx: &[usize]) -> Result<(usize, usize, usize)> {
    if idx.is_empty() {
        return Err(Error::value(format!("operator {op}: indices must have at least one dimension")));
    }
    let m = idx[0];
    if m == 0 || m > data.len() {
        return Err(Error::value(format!(
            "operator {op}: indices' first dimension ({m}) must be between 1 and the data's dimensions ({})",
            data.len()
        )));
    }
    Ok((m, idx[1..].iter().product(), data[m..].iter().product()))
}

fn infer_gather_nd(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (d, i) = (&ins[0].shape, &ins[1].shape);
    let (m, _, _) = nd_geometry("gather_nd", d, i)?;
    let mut out = i[1..].to_vec();
    out.extend_from_slice(&d[m..]);
    one_out(out, ins[0].dtype)
}

/// Block offsets (in elements) of each index tuple.
pub(super) fn nd_offsets(op: &str, data: &[usize], idx: &TBlob) -> Result<Vec<usize>> {
    let (m, count, inner) = nd_geometry(op, data, &idx.shape)?;
    let vals = read_indices(idx);
    let mut offs = vec![0usize; count];
    let mut block = inner;
    for k in (0..m).rev() {
        let n = data[k] as i64;
        for (j, o) in offs.iter_mut().enumerate() {
            let mut v = vals[k * count + j];
            if v < 0 {
                v += n;
            }
            if v < 0 || v >= n {
                return Err(Error::index(format!(
                    "operator {op}: index {} is out of bounds for axis {k} of size {n}",
                    vals[k * count + j]
                )));
            }
            *o += v as usize * block;
        }
        block *= data[k];
    }
    Ok(offs)
}

fn run_gather_nd(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let offs = nd_offsets("gather_nd", &ins[0].shape, &ins[1])?;
    let inner = nd_geometry("gather_nd", &ins[0].shape, &ins[1].shape)?.2;
    by_size!(ins[0].dtype, E => {
        let src = elems::<E>(&ins[0]);
        par_for_mut(elems_mut::<E>(&mut outs[0]), inner, Cost(0.25 * inner as f64 + 2.0), ins[0].dtype, |r, dst| {
            for (j, d) in r.zip(dst.chunks_mut(inner.max(1))) {
                d.copy_from_slice(&src[offs[j]..offs[j] + inner]);
            }
        });
    });
    Ok(())
}

op_params! {
    pub(super) struct ScatterParams<'a> => SCATTER_PARAMS {
        shape: &'a [i64] = required, "Shape of output.";
    }
}

fn infer_scatter_set_nd(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = ScatterParams::of(a);
    let want = super::common::shape_param("_scatter_set_nd", "shape", params.shape)?;
    let (l, r, i) = (&ins[0].shape, &ins[1].shape, &ins[2].shape);
    if *l != want {
        return Err(Error::value(format!("operator _scatter_set_nd: lhs has shape {l:?}, shape says {want:?}")));
    }
    let (m, _, _) = nd_geometry("_scatter_set_nd", l, i)?;
    let mut rs = i[1..].to_vec();
    rs.extend_from_slice(&l[m..]);
    if *r != rs {
        return Err(Error::value(format!("operator _scatter_set_nd: rhs has shape {r:?}, expected {rs:?}")));
    }
    if ins[1].dtype != ins[0].dtype {
        return Err(Error::type_error("operator _scatter_set_nd: lhs and rhs must have the same dtype"));
    }
    Ok(vec![ins[0].clone()])
}

fn run_scatter_set_nd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let offs = nd_offsets("_scatter_set_nd", &ins[0].shape, &ins[2])?;
    if cx.req[0] != Req::Inplace {
        outs[0].copy_from(&ins[0]);
    }
    let inner = nd_geometry("_scatter_set_nd", &ins[0].shape, &ins[2].shape)?.2;
    by_size!(ins[0].dtype, E => {
        let (src, dst) = (elems::<E>(&ins[1]), elems_mut::<E>(&mut outs[0]));
        // Serial, so repeated indices are last-wins.
        for (j, &o) in offs.iter().enumerate() {
            dst[o..o + inner].copy_from_slice(&src[j * inner..(j + 1) * inner]);
        }
    });
    Ok(())
}

/// scatter_nd: zeros of `shape`, with the blocks of `data` written where `indices` point.
fn infer_scatter_nd(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let want = super::common::shape_param("scatter_nd", "shape", ScatterParams::of(a).shape)?;
    let (d, i) = (&ins[0].shape, &ins[1].shape);
    let (m, _, _) = nd_geometry("scatter_nd", &want, i)?;
    let mut ds = i[1..].to_vec();
    ds.extend_from_slice(&want[m..]);
    if *d != ds {
        return Err(Error::value(format!(
            "operator scatter_nd: data has shape {d:?}, expected {ds:?} for indices of shape {i:?} and shape {want:?}"
        )));
    }
    one_out(want, ins[0].dtype)
}

fn run_scatter_nd(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let offs = nd_offsets("scatter_nd", &outs[0].shape, &ins[1])?;
    let inner = nd_geometry("scatter_nd", &outs[0].shape, &ins[1].shape)?.2;
    outs[0].as_bytes_mut().fill(0);
    by_size!(ins[0].dtype, E => {
        let (src, dst) = (elems::<E>(&ins[0]), elems_mut::<E>(&mut outs[0]));
        // Serial, so repeated indices are last-wins.
        for (j, &o) in offs.iter().enumerate() {
            dst[o..o + inner].copy_from_slice(&src[j * inner..(j + 1) * inner]);
        }
    });
    Ok(())
}

fn infer_fill_element_0index(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (l, m, r) = (&ins[0], &ins[1], &ins[2]);
    if l.shape.len() != 2 || m.shape != [l.shape[0]] || r.shape != [l.shape[0]] {
        return Err(Error::value(format!(
            "operator fill_element_0index: needs a 2-D lhs and 1-D mhs and rhs of its first dimension, got {:?}, {:?}, {:?}",
            l.shape, m.shape, r.shape
        )));
    }
    if m.dtype != l.dtype {
        return Err(Error::type_error("operator fill_element_0index: mhs must have lhs's dtype"));
    }
    Ok(vec![l.clone()])
}

fn run_fill_element_0index(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let cols = ins[0].shape[1];
    let idx: Vec<usize> =
        read_indices(&ins[2]).iter().map(|&i| resolve("fill_element_0index", i, cols, b'r')).collect::<Result<_>>()?;
    if cx.req[0] != Req::Inplace {
        outs[0].copy_from(&ins[0]);
    }
    by_size!(ins[0].dtype, E => {
        let (src, dst) = (elems::<E>(&ins[1]), elems_mut::<E>(&mut outs[0]));
        for (r, &c) in idx.iter().enumerate() {
            dst[r * cols + c] = src[r];
        }
    });
    Ok(())
}

// ---- sort, argsort, topk ----

const IDX_DTYPES: &[&str] = &["float16", "float32", "float64", "int32", "int64", "uint8"];

op_params! {
    pub(super) struct SortParams<'a> => SORT_PARAMS {
        axis: Option<i64> = "-1", "Axis along which to choose sort the input tensor. If not given, the flattened array is used. Default is -1.";
        is_ascend: bool = "True", "Whether to sort in ascending or descending order.";
    }
}

op_params! {
    pub(super) struct ArgsortParams<'a> => ARGSORT_PARAMS {
        axis: Option<i64> = "-1", "Axis along which to sort the input tensor. If not given, the flattened array is used. Default is -1.";
        is_ascend: bool = "True", "Whether to sort in ascending or descending order.";
        dtype: &'a str = "float32" in *IDX_DTYPES, "DType of the output indices.";
    }
}

op_params! {
    pub(super) struct TopkParams<'a> => TOPK_PARAMS {
        axis: Option<i64> = "-1", "Axis along which to choose the top k indices. If not given, the flattened array is used. Default is -1.";
        k: i64 = "1", "Number of top elements to select; a global sort is performed if k < 1.";
        ret_typ: &'a str = "indices" in ["both", "indices", "mask", "value"], "The return type.";
        is_ascend: bool = "False", "Whether to choose k largest or k smallest elements.";
        dtype: &'a str = "float32" in *IDX_DTYPES, "DType of the output indices when ret_typ is \"indices\" or \"both\".";
    }
}

/// Geometry of a sort: (axis or None for flattened, outer, n, inner, k).
pub(super) struct SortGeom {
    pub axis: Option<usize>,
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
    pub k: usize,
}

/// What the sort family's tables (`sort`, `argsort`, `topk`) share.
pub(super) struct SortArgs<'a> {
    pub axis: Option<i64>,
    pub is_ascend: bool,
    /// `topk`'s `k` and `ret_typ`.
    pub topk: Option<(i64, &'a str)>,
    /// The index dtype (`argsort`, `topk`); `sort` returns values.
    pub index_dtype: Option<DType>,
}

impl<'a> SortArgs<'a> {
    pub(super) fn of(a: &'a Attrs) -> Self {
        if a.declares(SORT_PARAMS) {
            let p = SortParams::of(a);
            SortArgs { axis: p.axis, is_ascend: p.is_ascend, topk: None, index_dtype: None }
        } else if a.declares(ARGSORT_PARAMS) {
            let p = ArgsortParams::of(a);
            SortArgs { axis: p.axis, is_ascend: p.is_ascend, topk: None, index_dtype: Some(enum_dtype(p.dtype)) }
        } else {
            let p = TopkParams::of(a);
            let index_dtype = Some(enum_dtype(p.dtype));
            SortArgs { axis: p.axis, is_ascend: p.is_ascend, topk: Some((p.k, p.ret_typ)), index_dtype }
        }
    }
}

pub(super) fn sort_geom(op: &str, axis: Option<i64>, shape: &[usize], k: Option<i64>) -> Result<SortGeom> {
    let (axis, outer, n, inner) = match axis {
        None => (None, 1, shape.iter().product(), 1),
        Some(ax) => {
            let ax = norm_axis(op, ax, shape.len())?;
            (Some(ax), shape[..ax].iter().product(), shape[ax], shape[ax + 1..].iter().product())
        }
    };
    let k = match k {
        Some(k) if k >= 1 => {
            if k as usize > n {
                return Err(Error::value(format!("operator {op}: k={k} exceeds the {n} elements along the axis")));
            }
            k as usize
        }
        _ => n,
    };
    Ok(SortGeom { axis, outer, n, inner, k })
}

/// Shape with the sorted axis of length `k` (a 1-D `(k,)` when flattened).
fn sorted_shape(g: &SortGeom, shape: &[usize]) -> Vec<usize> {
    match g.axis {
        None => vec![g.k],
        Some(ax) => {
            let mut s = shape.to_vec();
            s[ax] = g.k;
            s
        }
    }
}

fn total_cmp<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    match a.partial_cmp(b) {
        Some(o) => o,
        #[allow(clippy::eq_op)]
        None => (a != a).cmp(&(b != b)),
    }
}

/// The first `k` positions along the axis of every row, in sorted order: `order[(o*inner +
/// i)*k + r]`.
pub(super) fn sort_order<T: Elem>(x: &TBlob, g: &SortGeom, ascend: bool) -> Vec<u32> {
    let data = x.as_slice::<T>();
    let rows = g.outer * g.inner;
    let mut order = vec![0u32; rows * g.k];
    let (n, inner, k) = (g.n, g.inner, g.k);
    par_for_mut(&mut order, k, Cost(n as f64 * (n.max(2) as f64).log2() * 2.0), T::DTYPE, |r, slots| {
        let mut idx: Vec<u32> = Vec::with_capacity(n);
        for (row, dst) in r.zip(slots.chunks_mut(k)) {
            let (o, i) = (row / inner, row % inner);
            let at = |j: u32| data[(o * n + j as usize) * inner + i];
            idx.clear();
            idx.extend(0..n as u32);
            if ascend {
                idx.sort_by(|&p, &q| total_cmp(&at(p), &at(q)));
            } else {
                idx.sort_by(|&p, &q| total_cmp(&at(q), &at(p)));
            }
            dst.copy_from_slice(&idx[..k]);
        }
    });
    order
}

/// Write values (`vals`) or indices into `out` of the sorted shape.
fn write_sorted<T: Elem>(x: &TBlob, g: &SortGeom, order: &[u32], out: &mut OutBlob, vals: bool) -> Result<()> {
    let data = x.as_slice::<T>();
    let (n, inner, k) = (g.n, g.inner, g.k);
    let pos = |t: usize| -> (usize, u32) {
        // out index t = (o*k + r)*inner + i
        let (o, rest) = (t / (k * inner), t % (k * inner));
        let (r, i) = (rest / inner, rest % inner);
        let j = order[(o * inner + i) * k + r];
        ((o * n + j as usize) * inner + i, j)
    };
    if vals {
        for (t, v) in out.as_mut::<T>().iter_mut().enumerate() {
            *v = data[pos(t).0];
        }
    } else {
        dispatch_num!(out.dtype, "topk", I => {
            for (t, v) in out.as_mut::<I>().iter_mut().enumerate() {
                *v = I::from_f64(pos(t).1 as f64);
            }
        });
    }
    Ok(())
}

fn infer_sort(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let args = SortArgs::of(a);
    let g = sort_geom(a.op, args.axis, &ins[0].shape, None)?;
    if ins[0].dtype == DType::Bool {
        return Err(Error::type_error(format!("operator {} does not support dtype bool", a.op)));
    }
    let dtype = args.index_dtype.unwrap_or(ins[0].dtype);
    one_out(sorted_shape(&g, &ins[0].shape), dtype)
}

fn run_sort(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let args = SortArgs::of(cx.attrs);
    let ascend = args.is_ascend;
    let g = sort_geom(cx.attrs.op, args.axis, &ins[0].shape, None)?;
    let vals = args.index_dtype.is_none();
    dispatch_num!(ins[0].dtype, cx.attrs.op, T => {
        let order = sort_order::<T>(&ins[0], &g, ascend);
        write_sorted::<T>(&ins[0], &g, &order, &mut outs[0], vals)?;
    });
    Ok(())
}

fn topk_count(a: &Attrs) -> usize {
    let params = TopkParams::of(a);
    if params.ret_typ == "both" {
        2
    } else {
        1
    }
}

fn infer_topk(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = TopkParams::of(a);
    let x = &ins[0];
    if x.dtype == DType::Bool {
        return Err(Error::type_error("operator topk does not support dtype bool"));
    }
    let g = sort_geom("topk", params.axis, &x.shape, Some(params.k))?;
    let s = sorted_shape(&g, &x.shape);
    let idx = enum_dtype(params.dtype);
    Ok(match params.ret_typ {
        "value" => vec![Meta::new(s, x.dtype)],
        "indices" => vec![Meta::new(s, idx)],
        "mask" => vec![x.clone()],
        _ => vec![Meta::new(s.clone(), x.dtype), Meta::new(s, idx)],
    })
}

fn run_topk(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let params = TopkParams::of(a);
    let g = sort_geom("topk", params.axis, &ins[0].shape, Some(params.k))?;
    let ret = params.ret_typ;
    dispatch_num!(ins[0].dtype, "topk", T => {
        let order = sort_order::<T>(&ins[0], &g, params.is_ascend);
        match ret {
            "value" => write_sorted::<T>(&ins[0], &g, &order, &mut outs[0], true)?,
            "indices" => write_sorted::<T>(&ins[0], &g, &order, &mut outs[0], false)?,
            "mask" => {
                let m = outs[0].as_mut::<T>();
                m.fill(T::zero());
                for (row, chunk) in order.chunks(g.k.max(1)).enumerate() {
                    let (o, i) = (row / g.inner, row % g.inner);
                    for &j in chunk {
                        m[(o * g.n + j as usize) * g.inner + i] = T::one();
                    }
                }
            }
            _ => {
                write_sorted::<T>(&ins[0], &g, &order, &mut outs[0], true)?;
                write_sorted::<T>(&ins[0], &g, &order, &mut outs[1], false)?;
            }
        }
    });
    Ok(())
}

op_params! {
    /// `_ravel_multi_index`'s and `_unravel_index`'s parameters.
    struct RavelParams<'a> => RAVEL_PARAMS {
        shape: Option<&'a [i64]> = "None", "Shape of the array into which the multi-indices apply.";
    }
}

/// The `shape` of a ravel call, which must be given and non-empty.
fn ravel_shape(a: &Attrs) -> Result<&[i64]> {
    match RavelParams::of(a).shape {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(Error::value(format!("{}: empty shape parameter", a.op))),
    }
}

fn ravel_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let shape = ravel_shape(a)?;
    let s = &ins[0].shape;
    if s.len() != 2 || s[0] != shape.len() {
        return Err(Error::value(format!(
            "{}: the input must be two-dimensional with {} rows (one per dimension of shape {shape:?}), got {s:?}",
            a.op,
            shape.len()
        )));
    }
    Ok(vec![Meta::new(vec![s[1]], ins[0].dtype)])
}

fn unravel_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let shape = ravel_shape(a)?;
    let s = &ins[0].shape;
    if s.len() != 1 {
        return Err(Error::value(format!("{}: the input must be one-dimensional, got {s:?}", a.op)));
    }
    Ok(vec![Meta::new(vec![shape.len(), s[0]], ins[0].dtype)])
}

/// Multi-indices (one row per dimension) to flat indices, in 64-bit integers as stock's
/// (no bounds check, as stock's).
fn ravel(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let shape = ravel_shape(cx.attrs)?;
    let n = outs[0].size();
    dispatch_num!(ins[0].dtype, cx.attrs.op, T => {
        let x = ins[0].as_slice::<T>();
        for (i, o) in outs[0].as_mut::<T>().iter_mut().enumerate() {
            let mut r: i64 = 0;
            for (j, &d) in shape.iter().enumerate() {
                r = r.wrapping_mul(d).wrapping_add(x[i + j * n].to_f64() as i64);
            }
            *o = T::from_f64(r as f64);
        }
    });
    Ok(())
}

/// Flat indices to multi-indices (the first dimension is not wrapped, as in stock).
fn unravel(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let shape = ravel_shape(cx.attrs)?;
    let n = ins[0].size();
    dispatch_num!(ins[0].dtype, cx.attrs.op, T => {
        let x = ins[0].as_slice::<T>();
        let out = outs[0].as_mut::<T>();
        for i in 0..n {
            let mut idx = x[i].to_f64() as i64;
            for j in (1..shape.len()).rev() {
                let d = shape[j];
                let q = if d == 0 { 0 } else { idx / d };
                out[i + j * n] = T::from_f64((idx - q * d) as f64);
                idx = q;
            }
            out[i] = T::from_f64(idx as f64);
        }
    });
    Ok(())
}

fn batch_take_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (data, idx) = (&ins[0], &ins[1]);
    if data.shape.len() < 2 {
        return Err(Error::value(format!(
            "{}: data array must have at least 2 dimensions, got {:?}",
            a.op, data.shape
        )));
    }
    if idx.dtype != DType::I32 {
        return Err(Error::type_error(format!("{}: indices must be int32, got {}", a.op, idx.dtype.name())));
    }
    let rows = data.shape.iter().product::<usize>() / data.shape[data.shape.len() - 1].max(1);
    if idx.shape.iter().product::<usize>() != rows {
        return Err(Error::value(format!(
            "{}: the index array's size must be the data array's size without its last dimension ({rows}), got shape {:?}",
            a.op, idx.shape
        )));
    }
    Ok(vec![Meta::new(idx.shape.clone(), data.dtype)])
}

/// `out[i] = a[i, indices[i]]` over the rows of `a` (indices clipped to the row, as stock's).
fn batch_take(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let m = ins[0].shape[ins[0].shape.len() - 1];
    let idx = ins[1].as_slice::<i32>();
    dispatch_all!(ins[0].dtype, T => {
        let a = ins[0].as_slice::<T>();
        for (i, o) in outs[0].as_mut::<T>().iter_mut().enumerate() {
            let j = (idx[i].max(0) as usize).min(m.saturating_sub(1));
            *o = a[i * m + j];
        }
    });
    Ok(())
}

fn register_ravel(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_ravel_multi_index", Inputs::Fixed(&["data"]), Box::new(ravel_infer), Box::new(ravel))
            .alias(&["ravel_multi_index"])
            .params(RAVEL_PARAMS)
            .grad(Grad::Zero)
            .doc("Converts a batch of index arrays into an array of flat indices. The operator follows numpy conventions so a single multi index is given by a column of the input matrix."),
    );
    ops.push(
        OpDef::new("_unravel_index", Inputs::Fixed(&["data"]), Box::new(unravel_infer), Box::new(unravel))
            .alias(&["unravel_index"])
            .params(RAVEL_PARAMS)
            .grad(Grad::Zero)
            .doc("Converts an array of flat indices into a batch of index arrays. The operator follows numpy conventions so a single multi index is given by a column of the output matrix."),
    );
    ops.push(
        OpDef::new("batch_take", Inputs::Fixed(&["a", "indices"]), Box::new(batch_take_infer), Box::new(batch_take))
            .input_dtypes(&[(1, DType::I32)])
            .doc("Takes elements from a data batch: output[i] = input[i, indices[i]] (deprecated in stock; use pick)."),
    );
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    register_ravel(ops);
    let data = Inputs::Fixed(&["data"]);
    ops.push(
        op("slice", data, infer_slice, run_slice)
            .alias(&["crop", "_npi_slice", "_npx_slice", "_sparse_slice"])
            .params(SLICE_PARAMS)
            .grad(bwd("_backward_slice", false))
            .doc("Slices a region of the array (begin, end, step per axis; None and negative values allowed)."),
    );
    ops.push(
        op("slice_axis", data, infer_slice_axis, run_slice_axis)
            .params(SLICE_AXIS_PARAMS)
            .partial_shapes(partial_slice_axis)
            .grad(bwd("_backward_slice_axis", false))
            .doc("Slices along a given axis."),
    );
    ops.push(
        op("slice_like", Inputs::Fixed(&["data", "shape_like"]), infer_slice_like, run_slice_like)
            .params(SLICE_LIKE_PARAMS)
            .grad(bwd("_backward_slice_like", false))
            .doc("Slices a region of the array like the shape of another array."),
    );
    ops.push(
        op("_slice_assign", Inputs::Fixed(&["lhs", "rhs"]), infer_slice_assign, run_slice_assign)
            .alias(&["_crop_assign", "_npi_slice_assign"])
            .params(SLICE_PARAMS)
            .inplace(&[(0, 0)])
            .doc("Assign the rhs to a cropped subset of lhs."),
    );
    ops.push(
        op("_slice_assign_scalar", data, infer_slice_assign_scalar, run_slice_assign_scalar)
            .alias(&["_crop_assign_scalar", "_npi_slice_assign_scalar"])
            .params(SLICE_ASSIGN_SCALAR_PARAMS)
            .inplace(&[(0, 0)])
            .doc("(Assign the scalar to a cropped subset of the input."),
    );
    ops.push(
        op("take", Inputs::Fixed(&["a", "indices"]), infer_take, run_take)
            .alias(&["_npi_take"])
            .params(TAKE_PARAMS)
            .grad(bwd("_backward_take", true))
            .doc("Takes elements from an input array along the given axis."),
    );
    ops.push(
        op("Embedding", Inputs::Fixed(&["data", "weight"]), infer_embedding, run_embedding)
            .alias(&["_npx_embedding"])
            .params(EMBEDDING_PARAMS)
            .param_shapes(embedding_param_shapes)
            .params_take_dtype()
            .grad(bwd("_backward_Embedding", true))
            .doc("Maps integer indices to vector representations (embeddings): row data[i] of weight, indices clipped to [0, input_dim)."),
    );
    ops.push(
        op("pick", Inputs::Fixed(&["data", "index"]), infer_pick, run_pick)
            .alias(&["_npx_pick", "choose_element_0index"])
            .params(PICK_PARAMS)
            .grad(bwd("_backward_pick", true))
            .doc("Picks elements from an input array according to the input indices along the given axis."),
    );
    ops.push(
        op("one_hot", Inputs::Fixed(&["indices"]), infer_one_hot, run_one_hot)
            .alias(&["_npx_one_hot"])
            .params(ONE_HOT_PARAMS)
            .grad(Grad::Zero)
            .doc("Returns a one-hot array."),
    );
    ops.push(
        op("where", Inputs::Fixed(&["condition", "x", "y"]), infer_where, run_where)
            .partial_shapes(where_partial)
            .input_shapes(where_input_shapes)
            .grad(bwd("_backward_where", true))
            .doc("Return the elements, either from x or y, depending on the condition."),
    );
    ops.push(
        op("gather_nd", Inputs::Fixed(&["data", "indices"]), infer_gather_nd, run_gather_nd)
            .alias(&["_npi_gather_nd", "_npx_gather_nd"])
            .grad(bwd("_backward_gather_nd", true))
            .doc("Gather elements or slices from `data` and store to a tensor whose shape is defined by `indices`."),
    );
    ops.push(
        op("_scatter_set_nd", Inputs::Fixed(&["lhs", "rhs", "indices"]), infer_scatter_set_nd, run_scatter_set_nd)
            .alias(&["_npi_scatter_set_nd"])
            .params(SCATTER_PARAMS)
            .inplace(&[(0, 0)])
            .doc("This operator has the same functionality as scatter_nd except that it does not reset the elements not indexed by the input index `NDArray` in the input data `NDArray`."),
    );
    ops.push(
        op("scatter_nd", Inputs::Fixed(&["data", "indices"]), infer_scatter_nd, run_scatter_nd)
            .params(SCATTER_PARAMS)
            .grad(bwd("_backward_scatter_nd", true))
            .doc("Scatters data into a new tensor according to indices: zeros of `shape`, with output[indices[:, i]] = data[i] (the last write wins where indices repeat)."),
    );
    ops.push(
        op("fill_element_0index", Inputs::Fixed(&["lhs", "mhs", "rhs"]), infer_fill_element_0index, run_fill_element_0index)
            .inplace(&[(0, 0)])
            .doc("Fill one element of each line (row) in lhs with the value at the same row of mhs, at the column rhs gives."),
    );
    ops.push(
        op("sort", data, infer_sort, run_sort)
            .alias(&["_npi_sort"])
            .params(SORT_PARAMS)
            .grad(bwd("_backward_sort", true))
            .doc("Returns a sorted copy of an input array along the given axis."),
    );
    ops.push(
        op("argsort", data, infer_sort, run_sort)
            .alias(&["_npi_argsort"])
            .params(ARGSORT_PARAMS)
            .grad(Grad::Zero)
            .doc("Returns the indices that would sort an input array along the given axis."),
    );
    ops.push(
        op("topk", data, infer_topk, run_topk)
            .alias(&["_npx_topk"])
            .params(TOPK_PARAMS)
            .outputs(topk_count, topk_count)
            .grad(bwd("_backward_topk", true))
            .doc("Returns the indices of the top *k* elements in an input array along the given axis."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `where` learns nothing until its condition's shape is known (upstream
    /// `test_where_partial_shape`), then x, y, the output and a condition of their rank
    /// share one shape, and x and y take the output's.
    #[test]
    fn where_shapes_wait_for_the_condition() {
        let a = Attrs::parse("where", &[], std::iter::empty()).unwrap();
        assert_eq!(where_partial(&a, &[Some(vec![-1, 2]), Some(vec![-1, 2]), Some(vec![-1, 2])]), Some(vec![None]));
        assert_eq!(
            where_partial(&a, &[Some(vec![4, 3]), Some(vec![4, -1]), Some(vec![-1, -1])]),
            Some(vec![Some(vec![4, 3])])
        );
        assert_eq!(
            where_partial(&a, &[Some(vec![4]), Some(vec![4, -1]), Some(vec![-1, 6])]),
            Some(vec![Some(vec![4, 6])])
        );
        let outs = [Some(vec![4, 3])];
        assert_eq!(where_input_shapes(&a, &[Some(vec![-1, 3]), None, None], &outs).unwrap(), vec![]);
        assert_eq!(
            where_input_shapes(&a, &[Some(vec![4, 3]), None, Some(vec![-1, 3])], &outs).unwrap(),
            vec![(1, vec![4, 3]), (2, vec![4, 3])]
        );
    }

    #[test]
    fn slice_ranges_follow_stock() {
        let r = slice_ranges("s", &[5, 4], &[Some(1), None], &[Some(4), None], &[Some(2), Some(-1)]).unwrap();
        assert_eq!(r, vec![(1, 2, 2), (3, -1, 4)]);
        let r = slice_ranges("s", &[5], &[Some(-2)], &[None], &[]).unwrap();
        assert_eq!(r, vec![(3, 1, 2)]);
        assert!(slice_ranges("s", &[5], &[Some(3)], &[Some(1)], &[]).is_err());
        assert!(slice_ranges("s", &[5], &[Some(0)], &[Some(1)], &[Some(0)]).is_err());
        let r = slice_ranges("s", &[5], &[Some(7)], &[Some(9)], &[]).unwrap();
        assert_eq!(r[0].2, 0);
    }

    #[test]
    fn resolve_modes() {
        assert_eq!(resolve("t", -1, 4, b'c').unwrap(), 0);
        assert_eq!(resolve("t", -1, 4, b'w').unwrap(), 3);
        assert_eq!(resolve("t", 9, 4, b'c').unwrap(), 3);
        assert!(resolve("t", 4, 4, b'r').is_err());
        assert!(resolve("t", -1, 4, b'r').is_err());
        assert_eq!(total_cmp(&f32::NAN, &1.0), Ordering::Greater);
    }
}
