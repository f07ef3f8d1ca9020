//! Small operators of stock's contrib and utility sets: `_contrib_allclose`,
//! `_contrib_arange_like`, `_contrib_div_sqrt_dim` (with its backward), `all_finite`,
//! `multi_all_finite` and `multi_sum_sq`.

use super::common::norm_axis;
use super::init::fill;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};
use crate::{dispatch_all, dispatch_float};

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

pub(super) fn register(ops: &mut Vec<OpDef>) {
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
