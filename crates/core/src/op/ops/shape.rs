//! Shape and copy operators: `_copyto`, `Reshape`, `Flatten`, `expand_dims`, `squeeze`,
//! `transpose`, `SwapAxis`, `Cast`, `Concat`, `stack`, `SliceChannel`, `_split_v2`,
//! `broadcast_to`, `broadcast_axis`, `broadcast_like`, `tile`, `repeat`, `reverse`,
//! `zeros_like`, `ones_like`, `shape_array`, `size_array`, `reshape_like`, `Pad`, `amp_cast`,
//! `depth_to_space`, `space_to_depth`, `diag`.
//!
//! Data movement goes through the strided copy engine ([`super::strided`]), which works on
//! element sizes, so these operators take all eight dtypes without per-type kernels.

use super::common::{norm_axis, shape_param};
use super::strided::{contiguous_strides, copy, copy_to, View};
use crate::error::{Error, Result};
use crate::ndarray::{infer_reshape, DType};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::op_params;
use crate::op::param::{dtype_from_name, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, InferFn, Inputs, Meta, OpCtx, OpDef};
use crate::{dispatch_all, dispatch_num};

type Infer = fn(&Attrs, &[Meta]) -> Result<Vec<Meta>>;
type Compute = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;

fn op(name: &'static str, inputs: Inputs, infer: Infer, compute: Compute) -> OpDef {
    let infer: InferFn = Box::new(infer);
    OpDef::new(name, inputs, infer, Box::new(compute))
}

fn bwd(op: &'static str) -> Grad {
    Grad::Backward { op, inputs: false, outputs: false }
}

/// Prefix an error from shared shape code with the operator's name, keeping its kind.
fn named(op: &str, e: Error) -> Error {
    Error::new(e.kind(), format!("operator {op}: {}", e.message()))
}

fn one_out(shape: Vec<usize>, dtype: DType) -> Result<Vec<Meta>> {
    Ok(vec![Meta::new(shape, dtype)])
}

/// Compute: the output is the input's bytes (reshapes).
fn run_copy(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    outs[0].copy_from(&ins[0]);
    Ok(())
}

// ---- cast_storage ----

op_params! {
    pub(super) struct CastStorageParams<'a> => CAST_STORAGE_PARAMS {
        stype: &'a str = required in ["csr", "default", "row_sparse"], "Output storage type.";
    }
}

/// `cast_storage` to dense storage copies (every array here is dense, as
/// `mxnet.test_utils.check_numeric_gradient` casts them); sparse storage is not supported.
fn infer_cast_storage(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let stype = CastStorageParams::of(a).stype;
    if stype != "default" {
        return Err(Error::not_supported(format!("sparse storage (cast_storage to {stype})")));
    }
    Ok(vec![ins[0].clone()])
}

/// `_backward_cast_storage(dY, data) -> dData`: the gradient passes through.
fn cast_storage_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != crate::op::Req::Null {
        outs[0].copy_from(&ins[0]);
    }
    Ok(())
}

// ---- _copyto, Reshape, Flatten, expand_dims, squeeze, reshape_like ----

fn infer_same(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    Ok(vec![ins[0].clone()])
}

op_params! {
    pub(super) struct ReshapeParams<'a> => RESHAPE_PARAMS {
        shape: &'a [i64] = "()", "The target shape (codes 0, -1, -2, -3, -4 as in MXNet)";
        reverse: bool = "False", "If true then the special values are inferred from right to left";
        target_shape: &'a [i64] = "()", "(Deprecated! Use ``shape`` instead.) Target new shape";
        keep_highest: bool = "False", "(Deprecated! Use ``shape`` instead.) Keep the highest dimension";
    }
}

fn infer_reshape_op(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = ReshapeParams::of(a);
    let spec = params.shape;
    if spec.is_empty() {
        if !params.target_shape.is_empty() {
            return one_out(target_shape(&ins[0].shape, params.target_shape, params.keep_highest)?, ins[0].dtype);
        }
        return Err(Error::value("operator Reshape: the target shape must have at least one dimension"));
    }
    let shape = infer_reshape(&ins[0].shape, spec, params.reverse).map_err(|e| named("Reshape", e))?;
    one_out(shape, ins[0].dtype)
}

/// The deprecated `target_shape` form of Reshape (stock's rule): the shape as given, with the
/// data's first dimension when `keep_highest`, and one 0 (after the first dimension when
/// `keep_highest`) filled in from the data's size.
fn target_shape(data: &[usize], target: &[i64], keep_highest: bool) -> Result<Vec<usize>> {
    let bad = || Error::value(format!("operator Reshape: target_shape {target:?} does not fit data of shape {data:?}"));
    let mut out: Vec<usize> = target.iter().map(|&d| usize::try_from(d).map_err(|_| bad())).collect::<Result<_>>()?;
    let start = usize::from(keep_highest);
    if keep_highest {
        *out.first_mut().ok_or_else(bad)? = *data.first().ok_or_else(bad)?;
    }
    let zeros: Vec<usize> = (start..out.len()).filter(|&i| out[i] == 0).collect();
    let size: usize = data.iter().product();
    if let [k] = zeros[..] {
        let rest: usize = out.iter().enumerate().filter(|&(i, _)| i != k).map(|(_, &d)| d).product();
        out[k] = size.checked_div(rest).ok_or_else(bad)?;
    }
    if out.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) != Some(size) {
        return Err(bad());
    }
    Ok(out)
}

fn infer_flatten(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    if s.is_empty() {
        return Err(Error::value("operator Flatten: the input must have at least one dimension"));
    }
    one_out(vec![s[0], s[1..].iter().product()], ins[0].dtype)
}

op_params! {
    pub(super) struct ExpandParams<'a> => EXPAND_PARAMS {
        axis: i64 = required, "Position where the new axis is inserted; negative counts from the end";
    }
}

fn infer_expand_dims(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let mut s = ins[0].shape.clone();
    let ax = norm_axis("expand_dims", ExpandParams::of(a).axis, s.len() + 1)?;
    s.insert(ax, 1);
    one_out(s, ins[0].dtype)
}

op_params! {
    pub(super) struct SqueezeParams<'a> => SQUEEZE_PARAMS {
        axis: Option<&'a [i64]> = "None", "Axes of size 1 to remove; None removes every axis of size 1";
    }
}

fn infer_squeeze(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    let mut drop = vec![false; s.len()];
    match SqueezeParams::of(a).axis {
        None => {
            for (i, &d) in s.iter().enumerate() {
                drop[i] = d == 1;
            }
        }
        Some(axes) => {
            for &ax in axes {
                let k = norm_axis("squeeze", ax, s.len())?;
                if s[k] != 1 {
                    return Err(Error::value(format!(
                        "operator squeeze: cannot remove axis {ax} of size {} (only size-1 axes), input shape {s:?}",
                        s[k]
                    )));
                }
                if drop[k] {
                    return Err(Error::value(format!("operator squeeze: axis {ax} is given twice")));
                }
                drop[k] = true;
            }
        }
    }
    let mut out: Vec<usize> = s.iter().zip(&drop).filter(|(_, &d)| !d).map(|(&v, _)| v).collect();
    if out.is_empty() {
        out.push(1);
    }
    one_out(out, ins[0].dtype)
}

op_params! {
    pub(super) struct ReshapeLikeParams<'a> => RESHAPE_LIKE_PARAMS {
        lhs_begin: Option<i64> = "None", "First lhs axis to replace (default 0)";
        lhs_end: Option<i64> = "None", "Axis after the last lhs axis to replace (default ndim)";
        rhs_begin: Option<i64> = "None", "First rhs axis taken (default 0)";
        rhs_end: Option<i64> = "None", "Axis after the last rhs axis taken (default ndim)";
    }
}

/// The axes `[begin, end)` (parameters named `b` and `e`, for errors) of `ndim`, defaults
/// `0` and `ndim`, negative from the end.
fn axis_range(
    op: &str,
    (b, begin): (&str, Option<i64>),
    (e, end): (&str, Option<i64>),
    ndim: usize,
) -> Result<(usize, usize)> {
    let fix = |v: Option<i64>, dflt: usize, name: &str| -> Result<usize> {
        let n = ndim as i64;
        match v {
            None => Ok(dflt),
            Some(x) => {
                let y = if x < 0 { x + n } else { x };
                if y < 0 || y > n {
                    Err(Error::index(format!("operator {op}: {name}={x} is out of range for {ndim} dimensions")))
                } else {
                    Ok(y as usize)
                }
            }
        }
    };
    let (lo, hi) = (fix(begin, 0, b)?, fix(end, ndim, e)?);
    if lo > hi {
        return Err(Error::value(format!("operator {op}: {b} ({lo}) must not exceed {e} ({hi})")));
    }
    Ok((lo, hi))
}

fn infer_reshape_like(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (l, r) = (&ins[0].shape, &ins[1].shape);
    let p = ReshapeLikeParams::of(a);
    let (lb, le) = axis_range("reshape_like", ("lhs_begin", p.lhs_begin), ("lhs_end", p.lhs_end), l.len())?;
    let (rb, re) = axis_range("reshape_like", ("rhs_begin", p.rhs_begin), ("rhs_end", p.rhs_end), r.len())?;
    let mut out = l[..lb].to_vec();
    out.extend_from_slice(&r[rb..re]);
    out.extend_from_slice(&l[le..]);
    if out.iter().product::<usize>() != l.iter().product::<usize>() {
        return Err(Error::value(format!(
            "operator reshape_like: cannot reshape lhs of shape {l:?} to {out:?} (sizes differ)"
        )));
    }
    one_out(out, ins[0].dtype)
}

// ---- transpose, SwapAxis ----

op_params! {
    pub(super) struct TransposeParams<'a> => TRANSPOSE_PARAMS {
        axes: &'a [i64] = "()", "Target axis order; empty reverses the axes";
    }
}

pub(super) fn transpose_perm(op: &str, axes: &[i64], ndim: usize) -> Result<Vec<usize>> {
    if axes.is_empty() {
        return Ok((0..ndim).rev().collect());
    }
    if axes.len() != ndim {
        return Err(Error::value(format!("operator {op}: axes {axes:?} must list all {ndim} axes of the input")));
    }
    let mut seen = vec![false; ndim];
    let mut perm = Vec::with_capacity(ndim);
    for &ax in axes {
        let k = norm_axis(op, ax, ndim)?;
        if std::mem::replace(&mut seen[k], true) {
            return Err(Error::value(format!("operator {op}: axes {axes:?} repeat axis {ax}")));
        }
        perm.push(k);
    }
    Ok(perm)
}

fn infer_transpose(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = TransposeParams::of(a);
    let perm = transpose_perm("transpose", params.axes, ins[0].shape.len())?;
    one_out(perm.iter().map(|&p| ins[0].shape[p]).collect(), ins[0].dtype)
}

/// Graph inference of transpose's input from its output (`input[perm[i]] = output[i]`).
fn transpose_input(a: &Attrs, _: &[Option<Vec<i64>>], outs: &[Option<Vec<i64>>]) -> Result<Vec<(usize, Vec<i64>)>> {
    let Some(Some(out)) = outs.first() else { return Ok(vec![]) };
    let perm = transpose_perm("transpose", TransposeParams::of(a).axes, out.len())?;
    let mut input = vec![-1; out.len()];
    for (i, &p) in perm.iter().enumerate() {
        input[p] = out[i];
    }
    Ok(vec![(0, input)])
}

pub(super) fn permuted_copy(src: &TBlob, dst: &mut OutBlob, perm: &[usize]) {
    let s = contiguous_strides(&src.shape);
    let view = View { off: 0, strides: perm.iter().map(|&p| s[p]).collect() };
    copy_to(src, &view, dst);
}

fn run_transpose(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let perm = transpose_perm("transpose", TransposeParams::of(cx.attrs).axes, ins[0].ndim())?;
    permuted_copy(&ins[0], &mut outs[0], &perm);
    Ok(())
}

op_params! {
    pub(super) struct SwapParams<'a> => SWAP_PARAMS {
        dim1: i64 = "0", "the first axis to be swapped.";
        dim2: i64 = "0", "the second axis to be swapped.";
    }
}

pub(super) fn swap_perm(a: &Attrs, ndim: usize) -> Result<Vec<usize>> {
    let params = SwapParams::of(a);
    let d1 = norm_axis("SwapAxis", params.dim1, ndim)?;
    let d2 = norm_axis("SwapAxis", params.dim2, ndim)?;
    let mut perm: Vec<usize> = (0..ndim).collect();
    perm.swap(d1, d2);
    Ok(perm)
}

fn infer_swap(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let perm = swap_perm(a, ins[0].shape.len())?;
    one_out(perm.iter().map(|&p| ins[0].shape[p]).collect(), ins[0].dtype)
}

fn run_swap(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    permuted_copy(&ins[0], &mut outs[0], &swap_perm(cx.attrs, ins[0].ndim())?);
    Ok(())
}

// ---- Cast ----

op_params! {
    pub(super) struct CastParams<'a> => CAST_PARAMS {
        dtype: DType = required, "Output data type.";
    }
}

fn infer_cast(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = CastParams::of(a);
    one_out(ins[0].shape.clone(), params.dtype)
}

fn cast_typed<S: Elem, D: Elem>(src: &TBlob, dst: &mut OutBlob) {
    let s = src.as_slice::<S>();
    par_for_mut(dst.as_mut::<D>(), 1, Cost(0.5), D::DTYPE, |r, o| {
        // Sources exactly representable in f32 convert through f32 (same result, faster).
        if matches!(S::DTYPE, DType::F32 | DType::F16 | DType::U8 | DType::I8 | DType::Bool) {
            for (o, &x) in o.iter_mut().zip(&s[r]) {
                *o = D::from_f32(x.to_f32());
            }
        } else {
            for (o, &x) in o.iter_mut().zip(&s[r]) {
                *o = D::from_f64(x.to_f64());
            }
        }
    });
}

/// Convert `src` into `dst` (same size, any two dtypes).
pub(super) fn cast_into(src: &TBlob, dst: &mut OutBlob) {
    if src.dtype == dst.dtype {
        dst.copy_from(src);
        return;
    }
    dispatch_all!(src.dtype, S => dispatch_all!(dst.dtype, D => cast_typed::<S, D>(src, dst)))
}

fn run_cast(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    cast_into(&ins[0], &mut outs[0]);
    Ok(())
}

// ---- Concat, stack ----

op_params! {
    pub(super) struct ConcatParams<'a> => CONCAT_PARAMS {
        num_args: i64 = required, "Number of inputs to be concated.";
        dim: i64 = "1", "the dimension to be concated.";
    }
}

fn infer_concat(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = ConcatParams::of(a);
    if ins.is_empty() {
        return Err(Error::value("operator Concat needs at least one input"));
    }
    let nd = ins[0].shape.len();
    let dim = norm_axis("Concat", params.dim, nd)?;
    let mut out = ins[0].shape.clone();
    out[dim] = 0;
    for (i, m) in ins.iter().enumerate() {
        if m.dtype != ins[0].dtype {
            return Err(Error::type_error(format!(
                "operator Concat: input {i} has dtype {}, expected {} like input 0",
                m.dtype.name(),
                ins[0].dtype.name()
            )));
        }
        let same = m.shape.len() == nd && (0..nd).all(|k| k == dim || m.shape[k] == ins[0].shape[k]);
        if !same {
            return Err(Error::value(format!(
                "operator Concat: input {i} has shape {:?}, incompatible with input 0 {:?} for concatenation along dim {dim}",
                m.shape, ins[0].shape
            )));
        }
        out[dim] += m.shape[dim];
    }
    one_out(out, ins[0].dtype)
}

/// `Reshape` keeps the size: a known output fills the input's one unknown dimension.
fn same_size_input(_: &Attrs, ins: &[Option<Vec<i64>>], outs: &[Option<Vec<i64>>]) -> Result<Vec<(usize, Vec<i64>)>> {
    let (Some(Some(input)), Some(Some(out))) = (ins.first(), outs.first()) else { return Ok(vec![]) };
    let unknown: Vec<usize> = (0..input.len()).filter(|&k| input[k] < 0).collect();
    if unknown.len() != 1 || out.iter().any(|&d| d < 0) {
        return Ok(vec![]);
    }
    let size: i64 = out.iter().product();
    let known: i64 = input.iter().filter(|&&d| d >= 0).product();
    if known == 0 {
        return Ok(vec![]);
    }
    if size % known != 0 {
        return Err(Error::value(format!(
            "operator Reshape: an output of shape {out:?} cannot come from an input of shape {input:?}"
        )));
    }
    let mut shape = input.clone();
    shape[unknown[0]] = size / known;
    Ok(vec![(0, shape)])
}

/// `_rnn_param_concat`: a known output and all inputs but one or two known give those (stock's
/// rule, which lets Gluon's fused RNN layers infer the input size of their first layer).
fn concat_unknown_input(
    a: &Attrs,
    ins: &[Option<Vec<i64>>],
    outs: &[Option<Vec<i64>>],
) -> Result<Vec<(usize, Vec<i64>)>> {
    let Some(Some(out)) = outs.first() else { return Ok(vec![]) };
    let complete = |s: &Option<Vec<i64>>| s.as_ref().is_some_and(|v| v.iter().all(|&d| d >= 0));
    let unknown: Vec<usize> = (0..ins.len()).filter(|&k| !complete(&ins[k])).collect();
    if !(1..=2).contains(&unknown.len()) || !complete(&outs[0]) {
        return Ok(vec![]);
    }
    let dim = norm_axis(a.op, ConcatParams::of(a).dim, out.len())?;
    let rest: i64 =
        ins.iter().flatten().filter(|s| s.iter().all(|&d| d >= 0)).map(|s| s.get(dim).copied().unwrap_or(0)).sum();
    if rest > out[dim] {
        return Err(Error::value(format!(
            "operator {}: the known inputs are longer ({rest}) than the output ({}) along dim {dim}",
            a.op, out[dim]
        )));
    }
    // Two unknown inputs (a bidirectional layer's two input weights) share the rest evenly.
    if (out[dim] - rest) % unknown.len() as i64 != 0 {
        return Err(Error::value(format!(
            "operator {}: the rest of the output ({}) does not split evenly between {} unknown inputs",
            a.op,
            out[dim] - rest,
            unknown.len()
        )));
    }
    let mut shape = out.clone();
    shape[dim] = (out[dim] - rest) / unknown.len() as i64;
    Ok(unknown.into_iter().map(|k| (k, shape.clone())).collect())
}

/// Concat's inputs from its output (stock's `ConcatShape`): every dimension but the joined
/// one is the output's. (Stock leaves an input's unknown length along the joined dimension
/// unknown, even where the output's length and the other inputs' would give it.)
fn concat_input_shapes(
    a: &Attrs,
    ins: &[Option<Vec<i64>>],
    outs: &[Option<Vec<i64>>],
) -> Result<Vec<(usize, Vec<i64>)>> {
    let Some(Some(out)) = outs.first() else { return Ok(vec![]) };
    let dim = norm_axis(a.op, ConcatParams::of(a).dim, out.len())?;
    let mut learned = Vec::new();
    for (k, s) in ins.iter().enumerate() {
        let mut shape = s.clone().unwrap_or_else(|| vec![-1; out.len()]);
        if shape.len() != out.len() {
            continue; // a rank mismatch: forward inference names it
        }
        for (d, v) in shape.iter_mut().enumerate() {
            if d != dim && *v < 0 {
                *v = out[d];
            }
        }
        if s.as_ref() != Some(&shape) {
            learned.push((k, shape));
        }
    }
    Ok(learned)
}

fn run_concat(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let out = &mut outs[0];
    let dim = norm_axis("Concat", ConcatParams::of(cx.attrs).dim, out.ndim())?;
    let os = contiguous_strides(&out.shape);
    let mut at = 0isize;
    for x in ins {
        let dv = View { off: at * os[dim], strides: os.clone() };
        copy(x, &View::contiguous(&x.shape), out, &dv, &x.shape);
        at += x.shape[dim] as isize;
    }
    Ok(())
}

op_params! {
    pub(super) struct StackParams<'a> => STACK_PARAMS {
        axis: i64 = "0", "The axis in the result array along which the input arrays are stacked.";
        num_args: i64 = required, "Number of inputs to be stacked.";
    }
}

fn infer_stack(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = StackParams::of(a);
    if ins.is_empty() {
        return Err(Error::value("operator stack needs at least one input"));
    }
    for (i, m) in ins.iter().enumerate().skip(1) {
        super::common::check_same("stack", &ins[0], m, i)?;
    }
    let mut out = ins[0].shape.clone();
    let ax = norm_axis("stack", params.axis, out.len() + 1)?;
    out.insert(ax, ins.len());
    one_out(out, ins[0].dtype)
}

fn run_stack(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let out = &mut outs[0];
    let ax = norm_axis("stack", StackParams::of(cx.attrs).axis, out.ndim())?;
    let mut os = contiguous_strides(&out.shape);
    let step = os.remove(ax);
    for (i, x) in ins.iter().enumerate() {
        let dv = View { off: i as isize * step, strides: os.clone() };
        copy(x, &View::contiguous(&x.shape), out, &dv, &x.shape);
    }
    Ok(())
}

// ---- SliceChannel, _split_v2 ----

op_params! {
    pub(super) struct SplitParams<'a> => SPLIT_PARAMS {
        num_outputs: i64 = required, "Number of splits. Note that this should evenly divide the length of the `axis`.";
        axis: i64 = "1", "Axis along which to split.";
        squeeze_axis: bool = "False", "If true, Removes the axis with length 1 from the shapes of the output arrays.";
    }
}

fn split_count(a: &Attrs) -> usize {
    let params = SplitParams::of(a);
    params.num_outputs.max(0) as usize
}

/// Split `shape` along `axis` into `[start, end)` parts; outputs drop the axis if `squeeze`.
fn split_parts(
    op: &str,
    shape: &[usize],
    axis: usize,
    bounds: &[(usize, usize)],
    squeeze: bool,
    dtype: DType,
) -> Result<Vec<Meta>> {
    bounds
        .iter()
        .map(|&(b, e)| {
            let mut s = shape.to_vec();
            s[axis] = e - b;
            if squeeze {
                if e - b != 1 {
                    return Err(Error::value(format!(
                        "operator {op}: squeeze_axis needs parts of length 1 along axis {axis}, got {}",
                        e - b
                    )));
                }
                s.remove(axis);
            }
            Ok(Meta::new(s, dtype))
        })
        .collect()
}

pub(super) fn channel_bounds(a: &Attrs, shape: &[usize]) -> Result<(usize, Vec<(usize, usize)>)> {
    let params = SplitParams::of(a);
    let n = params.num_outputs;
    if n < 1 {
        return Err(Error::value(format!("operator SliceChannel: num_outputs must be at least 1, got {n}")));
    }
    let axis = norm_axis("SliceChannel", params.axis, shape.len())?;
    let n = n as usize;
    if shape[axis] % n != 0 {
        return Err(Error::value(format!(
            "operator SliceChannel: axis {axis} of length {} cannot be split evenly into {n} outputs (shape {shape:?})",
            shape[axis]
        )));
    }
    let k = shape[axis] / n;
    Ok((axis, (0..n).map(|i| (i * k, (i + 1) * k)).collect()))
}

/// SliceChannel's input from its outputs (stock's backward shape rule): the outputs share
/// every dimension but the split one, which the input has `num_outputs` times (once each
/// when `squeeze_axis` removed it).
fn slice_channel_input_shape(
    a: &Attrs,
    ins: &[Option<Vec<i64>>],
    outs: &[Option<Vec<i64>>],
) -> Result<Vec<(usize, Vec<i64>)>> {
    let params = SplitParams::of(a);
    let n = params.num_outputs;
    // Stock infers nothing while the input's rank is unknown.
    let Some(Some(_)) = ins.first() else { return Ok(vec![]) };
    let Some(rank) = outs.iter().flatten().map(|s| s.len()).next() else { return Ok(vec![]) };
    if n < 1 || outs.iter().flatten().any(|s| s.len() != rank) {
        return Ok(vec![]);
    }
    let in_rank = rank + usize::from(params.squeeze_axis);
    let axis = norm_axis(a.op, params.axis, in_rank)?;
    let mut part = vec![-1i64; rank];
    for s in outs.iter().flatten() {
        for (p, &d) in part.iter_mut().zip(s) {
            if *p < 0 {
                *p = d;
            }
        }
    }
    let mut shape = part;
    if params.squeeze_axis {
        shape.insert(axis, n);
    } else if shape[axis] >= 0 {
        shape[axis] = shape[axis].checked_mul(n).ok_or_else(|| {
            Error::value(format!("operator {}: {} outputs of length {} overflow", a.op, n, shape[axis]))
        })?;
    }
    Ok(vec![(0, shape)])
}

fn infer_slice_channel(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = SplitParams::of(a);
    let (axis, bounds) = channel_bounds(a, &ins[0].shape)?;
    split_parts("SliceChannel", &ins[0].shape, axis, &bounds, params.squeeze_axis, ins[0].dtype)
}

fn copy_parts(x: &TBlob, outs: &mut [OutBlob], axis: usize, bounds: &[(usize, usize)]) {
    let s = contiguous_strides(&x.shape);
    for (o, &(b, e)) in outs.iter_mut().zip(bounds) {
        let mut part = x.shape.clone();
        part[axis] = e - b;
        let sv = View { off: b as isize * s[axis], strides: s.clone() };
        copy(x, &sv, o, &View::contiguous(&part), &part);
    }
}

fn run_slice_channel(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (axis, bounds) = channel_bounds(cx.attrs, &ins[0].shape)?;
    copy_parts(&ins[0], outs, axis, &bounds);
    Ok(())
}

op_params! {
    pub(super) struct SplitV2Params<'a> => SPLIT_V2_PARAMS {
        indices: &'a [i64] = required, "Indices of splits. The elements should denote the boundaries of at which split is performed along the `axis`.";
        axis: i64 = "1", "Axis along which to split.";
        squeeze_axis: bool = "False", "If true, Removes the axis with length 1 from the shapes of the output arrays.";
        sections: i64 = "0", "Number of sections if equally splitted. Default to 0 which means split by indices.";
    }
}

fn split_v2_count(a: &Attrs) -> usize {
    let params = SplitV2Params::of(a);
    let s = params.sections;
    if s > 0 {
        s as usize
    } else {
        params.indices.len()
    }
}

pub(super) fn split_v2_bounds(a: &Attrs, shape: &[usize]) -> Result<(usize, Vec<(usize, usize)>)> {
    let params = SplitV2Params::of(a);
    let axis = norm_axis("_split_v2", params.axis, shape.len())?;
    let len = shape[axis];
    let sections = params.sections;
    if sections > 0 {
        let n = sections as usize;
        if len % n != 0 {
            return Err(Error::value(format!(
                "operator _split_v2: axis {axis} of length {len} cannot be split evenly into {n} sections"
            )));
        }
        let k = len / n;
        return Ok((axis, (0..n).map(|i| (i * k, (i + 1) * k)).collect()));
    }
    let idx = params.indices;
    if idx.is_empty() {
        return Err(Error::value("operator _split_v2: indices must not be empty when sections is 0"));
    }
    let mut bounds = Vec::with_capacity(idx.len());
    for (i, &b) in idx.iter().enumerate() {
        let e = idx.get(i + 1).copied().unwrap_or(len as i64);
        if b < 0 || e < b || e > len as i64 {
            return Err(Error::value(format!(
                "operator _split_v2: indices {idx:?} must be non-decreasing within [0, {len}] along axis {axis}"
            )));
        }
        bounds.push((b as usize, e as usize));
    }
    Ok((axis, bounds))
}

fn infer_split_v2(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = SplitV2Params::of(a);
    let (axis, bounds) = split_v2_bounds(a, &ins[0].shape)?;
    split_parts("_split_v2", &ins[0].shape, axis, &bounds, params.squeeze_axis, ins[0].dtype)
}

fn run_split_v2(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (axis, bounds) = split_v2_bounds(cx.attrs, &ins[0].shape)?;
    copy_parts(&ins[0], outs, axis, &bounds);
    Ok(())
}

// ---- broadcast_to, broadcast_axis, broadcast_like ----

/// Copy `src` broadcast to `dst`'s shape (same ndim; src dims 1 or equal).
fn broadcast_copy(src: &TBlob, dst: &mut OutBlob) {
    let mut s = contiguous_strides(&src.shape);
    for ((st, a), b) in s.iter_mut().zip(&src.shape).zip(&dst.shape) {
        if a != b {
            *st = 0;
        }
    }
    copy_to(src, &View { off: 0, strides: s }, dst);
}

fn run_broadcast(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    broadcast_copy(&ins[0], &mut outs[0]);
    Ok(())
}

fn check_broadcast(op: &str, src: &[usize], dst: &[usize]) -> Result<()> {
    if src.len() != dst.len() || src.iter().zip(dst).any(|(&s, &d)| s != d && s != 1) {
        return Err(Error::value(format!("operator {op}: cannot broadcast shape {src:?} to {dst:?}")));
    }
    Ok(())
}

op_params! {
    pub(super) struct BroadcastToParams<'a> => BROADCAST_TO_PARAMS {
        shape: &'a [i64] = "()", "The shape of the desired array; 0 keeps the input's dimension";
    }
}

fn infer_broadcast_to(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let src = &ins[0].shape;
    let want = BroadcastToParams::of(a).shape;
    if want.len() != src.len() {
        return Err(Error::value(format!(
            "operator broadcast_to: shape {want:?} must have as many dimensions as the input {src:?}"
        )));
    }
    let mut out = Vec::with_capacity(want.len());
    for (k, &w) in want.iter().enumerate() {
        out.push(if w == 0 { src[k] } else { shape_param("broadcast_to", "shape", &[w])?[0] });
    }
    check_broadcast("broadcast_to", src, &out)?;
    one_out(out, ins[0].dtype)
}

op_params! {
    pub(super) struct BroadcastAxisParams<'a> => BROADCAST_AXIS_PARAMS {
        axis: &'a [i64] = "()", "The axes to perform the broadcasting.";
        size: &'a [i64] = "()", "Target sizes of the broadcasting axes.";
    }
}

fn infer_broadcast_axis(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = BroadcastAxisParams::of(a);
    let (axes, sizes) = (params.axis, params.size);
    if axes.len() != sizes.len() {
        return Err(Error::value(format!(
            "operator broadcast_axis: axis {axes:?} and size {sizes:?} differ in length"
        )));
    }
    let mut out = ins[0].shape.clone();
    for (&ax, &sz) in axes.iter().zip(sizes) {
        let k = norm_axis("broadcast_axis", ax, out.len())?;
        if ins[0].shape[k] != 1 {
            return Err(Error::value(format!(
                "operator broadcast_axis: axis {ax} has size {}, only size-1 axes can be broadcast",
                ins[0].shape[k]
            )));
        }
        out[k] = shape_param("broadcast_axis", "size", &[sz])?[0];
    }
    one_out(out, ins[0].dtype)
}

op_params! {
    pub(super) struct BroadcastLikeParams<'a> => BROADCAST_LIKE_PARAMS {
        lhs_axes: Option<&'a [i64]> = "None", "Axes to perform broadcast on in the first input array";
        rhs_axes: Option<&'a [i64]> = "None", "Axes to copy from the second input array";
    }
}

fn infer_broadcast_like(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (l, r) = (&ins[0].shape, &ins[1].shape);
    let params = BroadcastLikeParams::of(a);
    let out = match (params.lhs_axes, params.rhs_axes) {
        (None, None) => r.clone(),
        (Some(la), Some(ra)) => {
            if la.is_empty() || ra.is_empty() {
                return Err(Error::mxnet("operator broadcast_like: empty axes tuple is not allowed"));
            }
            if la.len() != ra.len() {
                return Err(Error::mxnet(format!(
                    "operator broadcast_like: lhs_axes {la:?} and rhs_axes {ra:?} must have the same length"
                )));
            }
            let mut out = l.clone();
            for (&x, &y) in la.iter().zip(ra) {
                let i = norm_axis("broadcast_like", x, l.len())?;
                let j = norm_axis("broadcast_like", y, r.len())?;
                out[i] = r[j];
            }
            out
        }
        _ => return Err(Error::mxnet("operator broadcast_like: give both lhs_axes and rhs_axes, or neither")),
    };
    check_broadcast("broadcast_like", l, &out)?;
    one_out(out, ins[0].dtype)
}

// ---- tile, repeat, reverse ----

op_params! {
    pub(super) struct TileParams<'a> => TILE_PARAMS {
        reps: &'a [i64] = required, "The number of times for repeating the tensor a.";
    }
}

/// Input shape and reps padded with leading 1s to a common length.
pub(super) fn tile_dims(a: &Attrs, shape: &[usize]) -> Result<(Vec<usize>, Vec<usize>)> {
    let params = TileParams::of(a);
    let reps = shape_param("tile", "reps", params.reps)?;
    let n = reps.len().max(shape.len());
    let mut s = vec![1; n - shape.len()];
    s.extend_from_slice(shape);
    let mut r = vec![1; n - reps.len()];
    r.extend_from_slice(&reps);
    Ok((s, r))
}

fn infer_tile(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    // A 0 repetition is "unknown" in legacy shape semantics, so stock refuses it there (the
    // caller's thread holds the semantics, so only inference checks).
    let reps = TileParams::of(a).reps;
    if reps.contains(&0) && crate::ndarray::np_shape::get() == 0 {
        return Err(Error::value(format!(
            "operator tile: reps {reps:?} has a 0, which legacy shape semantics read as unknown (mx.np_shape() allows it)"
        )));
    }
    let (s, r) = tile_dims(a, &ins[0].shape)?;
    one_out(s.iter().zip(&r).map(|(x, y)| x * y).collect(), ins[0].dtype)
}

fn run_tile(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (s, r) = tile_dims(cx.attrs, &ins[0].shape)?;
    let st = contiguous_strides(&s);
    let (mut shape, mut strides) = (Vec::new(), Vec::new());
    for k in 0..s.len() {
        shape.extend_from_slice(&[r[k], s[k]]);
        strides.extend_from_slice(&[0, st[k]]);
    }
    copy(&ins[0], &View { off: 0, strides }, &mut outs[0], &View::contiguous(&shape), &shape);
    Ok(())
}

op_params! {
    pub(super) struct RepeatParams<'a> => REPEAT_PARAMS {
        repeats: i64 = required, "The number of repetitions for each element.";
        axis: Option<i64> = "None", "The axis along which to repeat values; None repeats the flattened input";
    }
}

/// (view shape, view strides of the input, output shape).
pub(super) fn repeat_view(a: &Attrs, shape: &[usize]) -> Result<(Vec<usize>, Vec<isize>, Vec<usize>)> {
    let params = RepeatParams::of(a);
    let reps = params.repeats;
    if reps < 0 {
        return Err(Error::value(format!("operator repeat: repeats must be non-negative, got {reps}")));
    }
    let reps = reps as usize;
    match params.axis {
        None => {
            let n: usize = shape.iter().product();
            Ok((vec![n, reps], vec![1, 0], vec![n * reps]))
        }
        Some(ax) => {
            let k = norm_axis("repeat", ax, shape.len())?;
            let st = contiguous_strides(shape);
            let mut vs = shape.to_vec();
            vs.insert(k + 1, reps);
            let mut vst = st;
            vst.insert(k + 1, 0);
            let mut out = shape.to_vec();
            out[k] *= reps;
            Ok((vs, vst, out))
        }
    }
}

fn infer_repeat(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(repeat_view(a, &ins[0].shape)?.2, ins[0].dtype)
}

fn run_repeat(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (vs, vst, _) = repeat_view(cx.attrs, &ins[0].shape)?;
    copy(&ins[0], &View { off: 0, strides: vst }, &mut outs[0], &View::contiguous(&vs), &vs);
    Ok(())
}

op_params! {
    pub(super) struct ReverseParams<'a> => REVERSE_PARAMS {
        axis: &'a [i64] = required, "The axis which to reverse elements.";
    }
}

pub(super) fn reverse_view(a: &Attrs, shape: &[usize]) -> Result<View> {
    let params = ReverseParams::of(a);
    let mut v = View::contiguous(shape);
    let mut seen = vec![false; shape.len()];
    for &ax in params.axis {
        let k = norm_axis("reverse", ax, shape.len())?;
        if std::mem::replace(&mut seen[k], true) {
            return Err(Error::value(format!("operator reverse: axis {ax} is given twice")));
        }
        if shape[k] > 0 {
            v.off += v.strides[k] * (shape[k] as isize - 1);
        }
        v.strides[k] = -v.strides[k];
    }
    Ok(v)
}

fn infer_reverse(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    reverse_view(a, &ins[0].shape)?;
    Ok(vec![ins[0].clone()])
}

fn run_reverse(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let v = reverse_view(cx.attrs, &ins[0].shape)?;
    copy_to(&ins[0], &v, &mut outs[0]);
    Ok(())
}

// ---- zeros_like, ones_like, shape_array, size_array ----

fn run_zeros(_: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    super::init::fill(&mut outs[0], 0.0);
    Ok(())
}

fn run_ones(_: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    super::init::fill(&mut outs[0], 1.0);
    Ok(())
}

fn infer_shape_array(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(vec![ins[0].shape.len()], DType::I64)
}

fn run_shape_array(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    for (o, &d) in outs[0].as_mut::<i64>().iter_mut().zip(&ins[0].shape) {
        *o = d as i64;
    }
    Ok(())
}

fn infer_size_array(_: &Attrs, _: &[Meta]) -> Result<Vec<Meta>> {
    one_out(vec![1], DType::I64)
}

fn run_size_array(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    outs[0].as_mut::<i64>()[0] = ins[0].size() as i64;
    Ok(())
}

// ---- Pad ----

op_params! {
    pub(super) struct PadParams<'a> => PAD_PARAMS {
        mode: &'a str = "constant" in ["constant", "edge", "reflect"], "Padding type to use.";
        pad_width: &'a [i64] = required, "Widths of the padding regions applied to the edges of each axis (before and after, per axis).";
        constant_value: f64 = "0", "The value used for padding when `mode` is 'constant'.";
    }
}

pub(super) fn pad_widths(a: &Attrs, shape: &[usize]) -> Result<Vec<(usize, usize)>> {
    let params = PadParams::of(a);
    let pw = params.pad_width;
    let nd = shape.len();
    if nd != 4 && nd != 5 {
        return Err(Error::value(format!("operator Pad: only 4-D and 5-D inputs are supported, got shape {shape:?}")));
    }
    if pw.len() != 2 * nd {
        return Err(Error::value(format!(
            "operator Pad: pad_width {pw:?} must have 2 entries per axis ({} for shape {shape:?})",
            2 * nd
        )));
    }
    if pw[..4].iter().any(|&p| p != 0) {
        return Err(Error::value(format!(
            "operator Pad: padding the first two axes is not supported, pad_width {pw:?}"
        )));
    }
    let pw = shape_param("Pad", "pad_width", pw)?;
    let widths: Vec<(usize, usize)> = (0..nd).map(|k| (pw[2 * k], pw[2 * k + 1])).collect();
    if params.mode == "reflect" {
        for (k, &(b, e)) in widths.iter().enumerate() {
            if b >= shape[k].max(1) || e >= shape[k].max(1) {
                return Err(Error::value(format!(
                    "operator Pad: reflect padding {b},{e} must be smaller than axis {k} of size {}",
                    shape[k]
                )));
            }
        }
    }
    Ok(widths)
}

fn infer_pad(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let w = pad_widths(a, &ins[0].shape)?;
    one_out(ins[0].shape.iter().zip(&w).map(|(d, (b, e))| d + b + e).collect(), ins[0].dtype)
}

/// Source coordinate of output coordinate `c` on an axis padded by `before` around `n`
/// (None: the constant).
pub(super) fn pad_src(c: usize, before: usize, n: usize, mode: u8) -> Option<usize> {
    let x = c as isize - before as isize;
    let n = n as isize;
    if (0..n).contains(&x) {
        return Some(x as usize);
    }
    match mode {
        b'e' => Some(x.clamp(0, n - 1) as usize),
        b'r' => Some(if x < 0 { -x } else { 2 * (n - 1) - x } as usize),
        _ => None,
    }
}

fn pad_typed<T: Elem>(x: &TBlob, out: &mut OutBlob, widths: &[(usize, usize)], mode: u8, value: T) {
    let src = x.as_slice::<T>();
    let nd = out.ndim();
    let (oshape, ishape) = (&out.shape.clone(), &x.shape);
    let ist = contiguous_strides(ishape);
    let cols = oshape[nd - 1];
    let col_src: Vec<Option<usize>> = (0..cols).map(|c| pad_src(c, widths[nd - 1].0, ishape[nd - 1], mode)).collect();
    let rows: usize = oshape[..nd - 1].iter().product();
    if x.size() == 0 && mode != b'c' {
        return;
    }
    debug_assert_eq!(rows * cols, out.size());
    par_for_mut(out.as_mut::<T>(), cols, Cost(cols as f64 * 0.5), T::DTYPE, |r, part| {
        for (row, dst) in r.zip(part.chunks_mut(cols.max(1))) {
            let idx = super::strided::unravel(row, &oshape[..nd - 1]);
            let mut base = Some(0isize);
            for (k, &c) in idx.iter().enumerate() {
                base = match (base, pad_src(c, widths[k].0, ishape[k], mode)) {
                    (Some(b), Some(s)) => Some(b + s as isize * ist[k]),
                    _ => None,
                };
            }
            match base {
                None => dst.fill(value),
                Some(b) => {
                    for (d, s) in dst.iter_mut().zip(&col_src) {
                        *d = match s {
                            Some(s) => src[b as usize + s],
                            None => value,
                        };
                    }
                }
            }
        }
    });
}

fn run_pad(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let w = pad_widths(cx.attrs, &ins[0].shape)?;
    let params = PadParams::of(cx.attrs);
    let mode = params.mode.as_bytes()[0];
    let v = params.constant_value;
    dispatch_num!(ins[0].dtype, "Pad", T => pad_typed::<T>(&ins[0], &mut outs[0], &w, mode, T::from_f64(v)));
    Ok(())
}

// ---- amp_cast, depth_to_space, space_to_depth, diag ----

op_params! {
    pub(super) struct AmpCastParams<'a> => AMP_CAST_PARAMS {
        dtype: DType = required, "Output data type.";
    }
}

fn infer_amp_cast(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let float = matches!(ins[0].dtype, DType::F32 | DType::F64 | DType::F16);
    let dtype = if float { AmpCastParams::of(a).dtype } else { ins[0].dtype };
    one_out(ins[0].shape.clone(), dtype)
}

op_params! {
    pub(super) struct AmpMultiCastParams<'a> => AMP_MULTICAST_PARAMS {
        num_outputs: i64 = required, "Number of input/output pairs to be casted to the widest type.";
        cast_narrow: bool = "False", "Whether to cast to the narrowest type";
    }
}

fn multicast_count(a: &Attrs) -> usize {
    AmpMultiCastParams::of(a).num_outputs.max(0) as usize
}

/// amp_multicast's output types, by stock's rule: float16 and float32 inputs go to float32
/// if any input is float32, else to the first input's type (`cast_narrow`: to float16 if any
/// input is float16, else float32); other inputs keep their type.
fn infer_amp_multicast(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let p = AmpMultiCastParams::of(a);
    if p.num_outputs < 1 || ins.len() as i64 != p.num_outputs {
        return Err(Error::value(format!(
            "operator amp_multicast: num_outputs={} but {} inputs given",
            p.num_outputs,
            ins.len()
        )));
    }
    let low = |d: DType| matches!(d, DType::F32 | DType::F16);
    let mut target = if p.cast_narrow { DType::F32 } else { ins[0].dtype };
    for m in ins {
        if !p.cast_narrow && m.dtype == DType::F32 {
            target = DType::F32;
        } else if p.cast_narrow && m.dtype == DType::F16 {
            target = DType::F16;
        }
    }
    Ok(ins.iter().map(|m| Meta::new(m.shape.clone(), if low(m.dtype) { target } else { m.dtype })).collect())
}

/// Each input cast to its output's type (amp_multicast, and its backward: each gradient to
/// its input's type).
pub(super) fn run_multicast(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    for (k, (x, o)) in ins.iter().zip(outs.iter_mut()).enumerate() {
        if cx.req.get(k).is_none_or(|r| *r != crate::op::Req::Null) {
            cast_into(x, o);
        }
    }
    Ok(())
}

op_params! {
    pub(super) struct BlockParams<'a> => BLOCK_PARAMS {
        block_size: i64 = required, "Blocks of [block_size. block_size] are moved";
    }
}

/// The input view and output shape of depth_to_space (`to_space`) or space_to_depth on NCHW.
fn block_view(op: &str, a: &Attrs, s: &[usize], to_space: bool) -> Result<(Vec<usize>, Vec<isize>, Vec<usize>)> {
    let params = BlockParams::of(a);
    let b = params.block_size;
    if s.len() != 4 || b < 1 {
        return Err(Error::value(format!(
            "operator {op}: needs a 4-D input and block_size >= 1, got shape {s:?}, block_size {b}"
        )));
    }
    let b = b as usize;
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    // Stock refuses empty inputs.
    if s.contains(&0) {
        return Err(Error::value(format!("operator {op}: every dimension of the input must be nonzero, got {s:?}")));
    }
    if to_space {
        if c % (b * b) != 0 {
            return Err(Error::value(format!(
                "operator {op}: channels {c} must be divisible by block_size^2 ({})",
                b * b
            )));
        }
        // input as (n, b, b, c', h, w), read in order (n, c', h, b, w, b)
        let cc = c / (b * b);
        let st = contiguous_strides(&[n, b, b, cc, h, w]);
        let shape = vec![n, cc, h, b, w, b];
        let strides = vec![st[0], st[3], st[4], st[1], st[5], st[2]];
        Ok((shape, strides, vec![n, cc, h * b, w * b]))
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(Error::value(format!(
                "operator {op}: height {h} and width {w} must be divisible by block_size {b}"
            )));
        }
        // input as (n, c, h', b, w', b), read in order (n, b, b, c, h', w')
        let (hh, ww) = (h / b, w / b);
        let st = contiguous_strides(&[n, c, hh, b, ww, b]);
        let shape = vec![n, b, b, c, hh, ww];
        let strides = vec![st[0], st[3], st[5], st[1], st[2], st[4]];
        Ok((shape, strides, vec![n, c * b * b, hh, ww]))
    }
}

fn infer_d2s(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(block_view("depth_to_space", a, &ins[0].shape, true)?.2, ins[0].dtype)
}

fn infer_s2d(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    one_out(block_view("space_to_depth", a, &ins[0].shape, false)?.2, ins[0].dtype)
}

pub(super) fn run_block(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], to_space: bool) -> Result<()> {
    let (shape, strides, _) = block_view(cx.attrs.op, cx.attrs, &ins[0].shape, to_space)?;
    copy(&ins[0], &View { off: 0, strides }, &mut outs[0], &View::contiguous(&shape), &shape);
    Ok(())
}

fn run_d2s(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    run_block(cx, ins, outs, true)
}

fn run_s2d(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    run_block(cx, ins, outs, false)
}

op_params! {
    pub(super) struct DiagParams<'a> => DIAG_PARAMS {
        k: i64 = "0", "Diagonal in question. The default is 0; k>0 above, k<0 below the main diagonal.";
        axis1: i64 = "0", "The first axis of the sub-arrays of interest. Ignored when the input is a 1-D array.";
        axis2: i64 = "1", "The second axis of the sub-arrays of interest. Ignored when the input is a 1-D array.";
    }
}

/// For a 1-D input: (n, matrix size, offset of the diagonal). For more: the strided view of
/// the diagonal and the output shape.
pub(super) enum DiagPlan {
    Build { n: usize, size: usize, off: isize },
    Extract { view: View, shape: Vec<usize> },
}

pub(super) fn diag_plan(a: &Attrs, s: &[usize]) -> Result<DiagPlan> {
    let params = DiagParams::of(a);
    let k = params.k;
    if s.is_empty() {
        return Err(Error::value("operator diag: the input must have at least one dimension"));
    }
    if s.len() == 1 {
        let n = s[0];
        let size = n + k.unsigned_abs() as usize;
        let off = if k >= 0 { k as isize } else { -k as isize * size as isize };
        return Ok(DiagPlan::Build { n, size, off });
    }
    let a1 = norm_axis("diag", params.axis1, s.len())?;
    let a2 = norm_axis("diag", params.axis2, s.len())?;
    if a1 == a2 {
        return Err(Error::value(format!("operator diag: axis1 and axis2 must differ, both are {a1}")));
    }
    let st = contiguous_strides(s);
    let (d1, d2) = (s[a1] as i64, s[a2] as i64);
    let len = if k >= 0 { d1.min(d2 - k) } else { (d1 + k).min(d2) };
    // A diagonal past the end by more than one (stock's shape is then unknown) is an error.
    if len < 0 {
        return Err(Error::value(format!("operator diag: k={k} is outside the matrix of shape {s:?}")));
    }
    let len = len as usize;
    let off = if len == 0 {
        0
    } else if k >= 0 {
        k as isize * st[a2]
    } else {
        -k as isize * st[a1]
    };
    let mut shape = Vec::new();
    let mut strides = Vec::new();
    for i in 0..s.len() {
        if i != a1 && i != a2 {
            shape.push(s[i]);
            strides.push(st[i]);
        }
    }
    shape.push(len);
    strides.push(st[a1] + st[a2]);
    Ok(DiagPlan::Extract { view: View { off, strides }, shape })
}

fn infer_diag(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let shape = match diag_plan(a, &ins[0].shape)? {
        DiagPlan::Build { size, .. } => vec![size, size],
        DiagPlan::Extract { shape, .. } => shape,
    };
    one_out(shape, ins[0].dtype)
}

fn run_diag(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    match diag_plan(cx.attrs, &ins[0].shape)? {
        DiagPlan::Build { n, size, off } => {
            super::init::fill(&mut outs[0], 0.0);
            let dv = View { off, strides: vec![size as isize + 1] };
            copy(&ins[0], &View::contiguous(&[n]), &mut outs[0], &dv, &[n]);
        }
        DiagPlan::Extract { view, shape } => copy(&ins[0], &view, &mut outs[0], &View::contiguous(&shape), &shape),
    }
    Ok(())
}

/// The dtype named by the value of an enum parameter of dtype names.
pub(super) fn enum_dtype(name: &str) -> DType {
    dtype_from_name(name).expect("enum of dtype names")
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let data = Inputs::Fixed(&["data"]);
    ops.push(
        op("_copyto", data, infer_same, run_cast)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .alias(&["_npi_copyto"])
            .any_out_dtype()
            .inplace(&[(0, 0)])
            .grad(bwd("_backward_cast"))
            .doc("Copies the input into the output array."),
    );
    ops.push(
        op("Reshape", data, infer_reshape_op, run_copy)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .alias(&["reshape"])
            .params(RESHAPE_PARAMS)
            .inplace(&[(0, 0)])
            .input_shapes(same_size_input)
            .grad(bwd("_backward_reshape"))
            .doc("Reshapes the input array (special codes 0, -1, -2, -3, -4)."),
    );
    ops.push(
        op("Flatten", data, infer_flatten, run_copy)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .alias(&["flatten", "_npx_batch_flatten"])
            .inplace(&[(0, 0)])
            .grad(bwd("_backward_reshape"))
            .doc("Flattens the input array into a 2-D array by collapsing the higher dimensions."),
    );
    ops.push(
        op("expand_dims", data, infer_expand_dims, run_copy)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .alias(&["_npi_expand_dims"])
            .params(EXPAND_PARAMS)
            .inplace(&[(0, 0)])
            .grad(bwd("_backward_reshape"))
            .doc("Inserts a new axis of size 1 into the array shape."),
    );
    ops.push(
        op("squeeze", data, infer_squeeze, run_copy)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .params(SQUEEZE_PARAMS)
            .inplace(&[(0, 0)])
            .grad(bwd("_backward_squeeze"))
            .doc("Remove single-dimensional entries from the shape of an array."),
    );
    ops.push(
        OpDef::new(
            "_identity_with_attr_like_rhs",
            Inputs::Fixed(&["lhs", "rhs"]),
            super::common::all_same("_identity_with_attr_like_rhs"),
            Box::new(run_copy),
        )
        .inplace(&[(0, 0)])
        .elementwise_shape()
        .grad(bwd("_backward_identity_with_attr_like_rhs"))
        .doc("lhs, unchanged, with the shape and dtype of rhs (an internal operator of gradient graphs: rhs is not read; its gradient is zero)."),
    );
    ops.push(
        op("reshape_like", Inputs::Fixed(&["lhs", "rhs"]), infer_reshape_like, run_copy)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .alias(&["_npx_reshape_like"])
            .params(RESHAPE_LIKE_PARAMS)
            .inplace(&[(0, 0)])
            .grad(bwd("_backward_reshape_like"))
            .doc("Reshape some or all dimensions of `lhs` to have the same shape as some or all dimensions of `rhs`."),
    );
    ops.push(
        op("transpose", data, infer_transpose, run_transpose)
            .params(TRANSPOSE_PARAMS)
            .input_shapes(transpose_input)
            .grad(bwd("_backward_transpose"))
            .doc("Permutes the dimensions of an array."),
    );
    ops.push(
        op("SwapAxis", data, infer_swap, run_swap)
            .alias(&["swapaxes"])
            .params(SWAP_PARAMS)
            .grad(bwd("_backward_SwapAxis"))
            .doc("Interchanges two axes of an array."),
    );
    ops.push(
        op("Cast", data, infer_cast, run_cast)
            .gpu(crate::op::gpu::GpuKernel::Map1("x"))
            .alias(&["cast"])
            .params(CAST_PARAMS)
            // Stock's ElemwiseShape: graph inference fills the input from the output too (a
            // weight cast to float16 before a Convolution gets the convolution's shape).
            .elementwise_shape()
            .converts_dtype()
            .grad(bwd("_backward_cast"))
            .doc("Casts all elements of the input to a new type."),
    );
    ops.push(
        op("Concat", Inputs::Variadic("data"), infer_concat, run_concat)
            .never_mirrored()
            .alias(&["concat", "_sparse_concat"])
            .params(CONCAT_PARAMS)
            .gpu(crate::op::gpu::GpuKernel::Concat(|a| ConcatParams::of(a).dim))
            .num_args_key("num_args")
            .input_shapes(concat_input_shapes)
            .grad(bwd("_backward_Concat"))
            .doc("Joins input arrays along a given axis."),
    );
    ops.push(
        op("cast_storage", data, infer_cast_storage, run_copy)
            .alias(&["_sparse_cast_storage"])
            .params(CAST_STORAGE_PARAMS)
            .grad(Grad::Backward { op: "_backward_cast_storage", inputs: false, outputs: false })
            .doc("Casts tensor storage type to the new type (dense storage only in mxnet-rt)."),
    );
    ops.push(OpDef::backward("_backward_cast_storage", CAST_STORAGE_PARAMS, Box::new(cast_storage_backward)));
    ops.push(
        op("_rnn_param_concat", Inputs::Variadic("data"), infer_concat, run_concat)
            .never_mirrored()
            .alias(&["_npi_rnn_param_concat"])
            .params(CONCAT_PARAMS)
            .num_args_key("num_args")
            .input_shapes(concat_unknown_input)
            .grad(bwd("_backward_Concat"))
            .doc("Concat for the parameters of the fused RNN operator: graph inference also fills one unknown input from the output."),
    );
    ops.push(
        op("stack", Inputs::Variadic("data"), infer_stack, run_stack)
            .params(STACK_PARAMS)
            .num_args_key("num_args")
            .grad(bwd("_backward_stack"))
            .doc("Join a sequence of arrays along a new axis."),
    );
    ops.push(
        op("SliceChannel", data, infer_slice_channel, run_slice_channel)
            .alias(&["split"])
            .params(SPLIT_PARAMS)
            .outputs(split_count, split_count)
            .input_shapes(slice_channel_input_shape)
            .grad(bwd("_backward_SliceChannel"))
            .doc("Splits an array along a particular axis into multiple sub-arrays."),
    );
    ops.push(
        op("_split_v2", data, infer_split_v2, run_split_v2)
            .alias(&["_npi_split"])
            .params(SPLIT_V2_PARAMS)
            .outputs(split_v2_count, split_v2_count)
            .grad(bwd("_split_v2_backward"))
            .doc("Splits an array along a particular axis into multiple sub-arrays (at given indices or in equal sections)."),
    );
    ops.push(
        op("broadcast_to", data, infer_broadcast_to, run_broadcast)
            .params(BROADCAST_TO_PARAMS)
            .grad(bwd("_broadcast_backward"))
            .doc("Broadcasts the input array to a new shape."),
    );
    ops.push(
        op("broadcast_axis", data, infer_broadcast_axis, run_broadcast)
            .alias(&["broadcast_axes"])
            .params(BROADCAST_AXIS_PARAMS)
            .grad(bwd("_broadcast_backward"))
            .doc("Broadcasts the input array over particular axes."),
    );
    ops.push(
        op("broadcast_like", Inputs::Fixed(&["lhs", "rhs"]), infer_broadcast_like, run_broadcast)
            .params(BROADCAST_LIKE_PARAMS)
            .grad(bwd("_broadcast_backward"))
            .doc("Broadcasts lhs to have the same shape as rhs."),
    );
    ops.push(
        op("tile", data, infer_tile, run_tile)
            .alias(&["_npi_tile"])
            .params(TILE_PARAMS)
            .grad(bwd("_backward_tile"))
            .doc("Repeats the whole array multiple times."),
    );
    ops.push(
        op("repeat", data, infer_repeat, run_repeat)
            .params(REPEAT_PARAMS)
            .grad(bwd("_backward_repeat"))
            .doc("Repeats elements of an array."),
    );
    ops.push(
        op("reverse", data, infer_reverse, run_reverse)
            .alias(&["flip"])
            .params(REVERSE_PARAMS)
            .grad(bwd("_backward_reverse"))
            .doc("Reverses the order of elements along given axis while preserving array shape."),
    );
    ops.push(
        op("zeros_like", data, infer_same, run_zeros)
            .gpu(crate::op::gpu::GpuKernel::Fill(|_| 0.0))
            .alias(&["_sparse_zeros_like"])
            .elementwise_shape()
            .grad(Grad::Zero)
            .doc("Return an array of zeros with the same shape, type and storage type as the input array."),
    );
    ops.push(
        op("ones_like", data, infer_same, run_ones)
            .gpu(crate::op::gpu::GpuKernel::Fill(|_| 1.0))
            .elementwise_shape()
            .grad(Grad::Zero)
            .doc("Return an array of ones with the same shape and type as the input array."),
    );
    ops.push(
        op("shape_array", data, infer_shape_array, run_shape_array)
            .alias(&["_npx_shape_array"])
            .grad(Grad::Zero)
            .doc("Returns a 1D int64 array containing the shape of data."),
    );
    ops.push(
        op("size_array", data, infer_size_array, run_size_array)
            .grad(Grad::Zero)
            .doc("Returns a 1D int64 array containing the size of data."),
    );
    ops.push(
        op("amp_cast", data, infer_amp_cast, run_cast)
            .params(AMP_CAST_PARAMS)
            .amp_cast()
            .grad(bwd("_backward_amp_cast"))
            .doc("Cast function between low precision float/FP32 used by AMP; non-float inputs pass through."),
    );
    ops.push(
        OpDef::new("amp_multicast", Inputs::Variadic("data"), Box::new(infer_amp_multicast), Box::new(run_multicast))
            .params(AMP_MULTICAST_PARAMS)
            .outputs(multicast_count, multicast_count)
            .amp_cast()
            .grad(bwd("_backward_amp_multicast"))
            .doc("Cast function used by AMP, that casts its inputs to the common widest type.\n\nIt casts only between low precision float/FP32 and does not do anything for other types."),
    );
    ops.push(
        op("depth_to_space", data, infer_d2s, run_d2s)
            .params(BLOCK_PARAMS)
            .grad(bwd("_backward_depth_to_space"))
            .doc("Rearranges(permutes) data from depth into blocks of spatial data (NCHW)."),
    );
    ops.push(
        op("space_to_depth", data, infer_s2d, run_s2d)
            .params(BLOCK_PARAMS)
            .grad(bwd("_backward_space_to_depth"))
            .doc("Rearranges(permutes) blocks of spatial data into depth (NCHW)."),
    );
    ops.push(
        op("diag", data, infer_diag, run_diag)
            .params(DIAG_PARAMS)
            .grad(bwd("_backward_diag"))
            .doc("Extracts a diagonal or constructs a diagonal array."),
    );
    ops.push(
        op("Pad", data, infer_pad, run_pad)
            .alias(&["pad"])
            .params(PAD_PARAMS)
            .grad(bwd("_backward_Pad"))
            .doc("Pads an input array with a constant or edge values of the array."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::param::ParamSpec;

    fn attrs(op: &'static str, specs: &'static [ParamSpec], kv: &[(&str, &str)]) -> Attrs {
        Attrs::parse(op, specs, kv.iter().copied()).unwrap()
    }

    /// Inputs from outputs, as stock's shape functions find them (upstream
    /// `test_incomplete_infer_concat`, `test_incomplete_infer_slicechannel`).
    #[test]
    fn concat_and_slice_channel_inputs_from_outputs() {
        let cat = attrs("Concat", CONCAT_PARAMS, &[("num_args", "2"), ("dim", "1")]);
        let got = concat_input_shapes(&cat, &[Some(vec![-1, 10]), Some(vec![-1, 5])], &[Some(vec![2, 15])]).unwrap();
        assert_eq!(got, vec![(0, vec![2, 10]), (1, vec![2, 5])]);
        // The joined dimension of an input stays unknown (stock's rule); an input of unknown
        // rank takes the rest.
        let got = concat_input_shapes(&cat, &[None, Some(vec![2, 5])], &[Some(vec![2, 15])]).unwrap();
        assert_eq!(got, vec![(0, vec![2, -1])]);
        let split = attrs("SliceChannel", SPLIT_PARAMS, &[("num_outputs", "3"), ("axis", "1")]);
        let outs = [None, Some(vec![3, 5, 2]), None];
        assert_eq!(
            slice_channel_input_shape(&split, &[Some(vec![-1, 15, -1])], &outs).unwrap(),
            vec![(0, vec![3, 15, 2])]
        );
        // Nothing while the input's rank is unknown (stock's rule).
        assert_eq!(slice_channel_input_shape(&split, &[None], &outs).unwrap(), vec![]);
        let squeeze =
            attrs("SliceChannel", SPLIT_PARAMS, &[("num_outputs", "10"), ("axis", "1"), ("squeeze_axis", "1")]);
        let outs: Vec<_> = (0..10).map(|i| if i == 1 { Some(vec![5]) } else { Some(vec![-1]) }).collect();
        assert_eq!(slice_channel_input_shape(&squeeze, &[Some(vec![-1, 10])], &outs).unwrap(), vec![(0, vec![5, 10])]);
    }

    #[test]
    fn deprecated_target_shape() {
        assert_eq!(target_shape(&[2, 3, 5, 5], &[2, 0], false).unwrap(), [2, 75]);
        assert_eq!(target_shape(&[2, 3, 5, 5], &[7, 0, 5], true).unwrap(), [2, 15, 5]);
        assert!(target_shape(&[2, 3, 5, 5], &[4, 4], false).is_err());
        assert!(target_shape(&[2, 3], &[-1, 6], false).is_err());
    }

    #[test]
    fn transpose_perm_checks() {
        assert_eq!(transpose_perm("t", &[], 3).unwrap(), vec![2, 1, 0]);
        assert_eq!(transpose_perm("t", &[-1, 0, 1], 3).unwrap(), vec![2, 0, 1]);
        assert!(transpose_perm("t", &[0, 0, 1], 3).is_err());
        assert!(transpose_perm("t", &[0, 1], 3).is_err());
    }

    #[test]
    fn split_v2_bounds_and_pad_src() {
        let a = attrs("_split_v2", SPLIT_V2_PARAMS, &[("indices", "[0, 2, 4]"), ("axis", "0")]);
        assert_eq!(split_v2_bounds(&a, &[6, 2]).unwrap().1, vec![(0, 2), (2, 4), (4, 6)]);
        let a = attrs("_split_v2", SPLIT_V2_PARAMS, &[("indices", "[0, 4, 2]"), ("axis", "0")]);
        assert!(split_v2_bounds(&a, &[6, 2]).is_err());
        assert_eq!(pad_src(0, 2, 3, b'r'), Some(2));
        assert_eq!(pad_src(6, 2, 3, b'r'), Some(0));
        assert_eq!(pad_src(6, 2, 3, b'e'), Some(2));
        assert_eq!(pad_src(1, 2, 3, b'c'), None);
    }

    #[test]
    fn repeat_and_tile_shapes() {
        let a = attrs("repeat", REPEAT_PARAMS, &[("repeats", "2"), ("axis", "-1")]);
        assert_eq!(repeat_view(&a, &[2, 3]).unwrap().2, vec![2, 6]);
        let a = attrs("tile", TILE_PARAMS, &[("reps", "(2, 1, 3)")]);
        assert_eq!(tile_dims(&a, &[4, 5]).unwrap(), (vec![1, 4, 5], vec![2, 1, 3]));
    }
}
