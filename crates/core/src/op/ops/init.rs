//! Creation operators: `_zeros`, `_ones`, `_full`, `_arange`, `_linspace`, `_eye`.

use super::common::shape_param;
use crate::dispatch_all;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{PType, ParamSpec};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};

const DTYPES: &[&str] = &["bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"];

pub(super) const SHAPE_CTX_DTYPE: &[ParamSpec] = &[
    ParamSpec::opt("shape", PType::Shape, "()", "The shape of the output"),
    ParamSpec::opt(
        "ctx",
        PType::Ctx,
        "",
        "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls.",
    ),
    ParamSpec::opt("dtype", PType::Enum(DTYPES), "float32", "Target data type."),
];

const FULL_PARAMS: &[ParamSpec] = &[
    ParamSpec::opt("shape", PType::Shape, "()", "The shape of the output"),
    ParamSpec::opt(
        "ctx",
        PType::Ctx,
        "",
        "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls.",
    ),
    ParamSpec::opt("dtype", PType::Enum(DTYPES), "float32", "Target data type."),
    ParamSpec::req("value", PType::Float, "Value with which to fill newly created tensor"),
];

/// Output shape and dtype from `shape` and `dtype` parameters.
pub(super) fn infer_shape_dtype(op: &'static str) -> crate::op::InferFn {
    Box::new(move |a, _| {
        let shape = shape_param(op, "shape", a.shape("shape"))?;
        let dtype = crate::op::param::dtype_from_name(a.str("dtype")).expect("enum of dtype names");
        Ok(vec![Meta::new(shape, dtype)])
    })
}

/// Fill `out` with `v`.
pub(crate) fn fill(out: &mut OutBlob, v: f64) {
    dispatch_all!(out.dtype, T => fill_typed::<T>(out, T::from_f64(v)))
}

fn fill_typed<T: Elem>(out: &mut OutBlob, v: T) {
    let o = out.as_mut::<T>();
    par_for_mut(o, 1, Cost::CHEAP, T::DTYPE, |_, chunk| {
        chunk.fill(v);
    });
}

fn filler(value: fn(&OpCtx) -> f64) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        fill(&mut outs[0], value(cx));
        Ok(())
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_zeros", Inputs::Fixed(&[]), infer_shape_dtype("_zeros"), filler(|_| 0.0))
            .params(SHAPE_CTX_DTYPE)
            .doc("fill target with zeros"),
    );
    ops.push(
        OpDef::new("_ones", Inputs::Fixed(&[]), infer_shape_dtype("_ones"), filler(|_| 1.0))
            .params(SHAPE_CTX_DTYPE)
            .doc("fill target with ones"),
    );
    ops.push(
        OpDef::new("_full", Inputs::Fixed(&[]), infer_shape_dtype("_full"), filler(|cx| cx.attrs.float("value")))
            .params(FULL_PARAMS)
            .doc("fill target with a scalar value"),
    );
    register_ranges(ops);
}

const CTX_DOC: &str = "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls.";

const ARANGE_PARAMS: &[ParamSpec] = &[
    ParamSpec::req("start", PType::Float, "Start of interval. The interval includes this value. The default start value is 0."),
    ParamSpec::or_none("stop", PType::Float, "None", "End of interval. The interval does not include this value, except in some cases where step is not an integer and floating point round-off affects the length of out."),
    ParamSpec::opt("step", PType::Float, "1", "Spacing between values."),
    ParamSpec::opt("repeat", PType::Int, "1", "The repeating time of all elements. E.g repeat=3, the element a will be repeated three times --> a, a, a."),
    ParamSpec::opt("infer_range", PType::Bool, "False", "When set to True, infer the stop position from the start, step, repeat, and output tensor size."),
    ParamSpec::opt("ctx", PType::Ctx, "", CTX_DOC),
    ParamSpec::opt("dtype", PType::Enum(DTYPES), "float32", "Target data type."),
];

const LINSPACE_PARAMS: &[ParamSpec] = &[
    ParamSpec::req("start", PType::Float, "Start of interval."),
    ParamSpec::req("stop", PType::Float, "End of interval, included unless endpoint is False."),
    ParamSpec::req("num", PType::Int, "Number of samples to generate. Must be non-negative."),
    ParamSpec::opt("endpoint", PType::Bool, "True", "If True, stop is the last sample. Otherwise, it is not included."),
    ParamSpec::opt("ctx", PType::Ctx, "", CTX_DOC),
    ParamSpec::opt("dtype", PType::Enum(DTYPES), "float32", "Target data type."),
];

const EYE_PARAMS: &[ParamSpec] = &[
    ParamSpec::req("N", PType::Int, "Number of rows in the output."),
    ParamSpec::opt("M", PType::Int, "0", "Number of columns in the output. If 0, defaults to N"),
    ParamSpec::opt("k", PType::Int, "0", "Index of the diagonal. 0 (the default) refers to the main diagonal.A positive value refers to an upper diagonal.A negative value to a lower diagonal."),
    ParamSpec::opt("ctx", PType::Ctx, "", CTX_DOC),
    ParamSpec::opt("dtype", PType::Enum(DTYPES), "float32", "Target data type."),
];

fn dtype_of(a: &crate::op::param::Attrs) -> DType {
    crate::op::param::dtype_from_name(a.str("dtype")).expect("enum of dtype names")
}

/// `_arange`'s (start, stop, step, repeat) after stock's rule that a missing stop means
/// `[0, start)`, validated.
fn range_of(a: &crate::op::param::Attrs) -> Result<(f64, f64, f64, usize)> {
    let op = "_arange";
    let (mut start, step, repeat) = (a.float("start"), a.float("step"), a.int("repeat"));
    let stop = match a.opt_float("stop") {
        Some(s) => s,
        None if a.bool("infer_range") => {
            return Err(Error::value(format!("operator {op}: infer_range=True needs the output size, which an imperative call does not give; pass stop")));
        }
        None => std::mem::replace(&mut start, 0.0),
    };
    if step == 0.0 {
        return Err(Error::value(format!("operator {op}: step must not be 0")));
    }
    if repeat <= 0 {
        return Err(Error::value(format!("operator {op}: repeat must be > 0, got {repeat}")));
    }
    if (step > 0.0 && start >= stop) || (step < 0.0 && start <= stop) {
        return Err(Error::value(format!(
            "operator {op}: invalid range (start, stop, step) = ({start}, {stop}, {step})"
        )));
    }
    Ok((start, stop, step, repeat as usize))
}

fn arange_len(start: f64, stop: f64, step: f64, repeat: usize) -> usize {
    ((stop - start) / step).ceil() as usize * repeat
}

fn arange_infer() -> crate::op::InferFn {
    Box::new(|a, _| {
        let (start, stop, step, repeat) = range_of(a)?;
        Ok(vec![Meta::new(vec![arange_len(start, stop, step, repeat)], dtype_of(a))])
    })
}

/// `out[i] = f(i)` over the kernel pool.
fn fill_index<T: Elem>(out: &mut OutBlob, f: impl Fn(usize) -> T + Sync + Send) {
    let o = out.as_mut::<T>();
    par_for_mut(o, 1, Cost::CHEAP, T::DTYPE, |r, chunk| {
        for (k, v) in chunk.iter_mut().enumerate() {
            *v = f(r.start + k);
        }
    });
}

fn arange(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (start, _, step, repeat) = range_of(cx.attrs)?;
    let out = &mut outs[0];
    if matches!(out.dtype, DType::F32 | DType::F64 | DType::F16) {
        dispatch_all!(out.dtype, T => fill_index::<T>(out, |i| T::from_f64(start + (i / repeat) as f64 * step)));
    } else {
        // Integer outputs step by the step converted to the dtype, like stock's kernel.
        dispatch_all!(out.dtype, T => {
            let (s, d) = (T::from_f64(start).to_f64(), T::from_f64(step).to_f64());
            fill_index::<T>(out, |i| T::from_f64(s + (i / repeat) as f64 * d))
        });
    }
    Ok(())
}

fn linspace_infer() -> crate::op::InferFn {
    Box::new(|a, _| {
        let num = a.int("num");
        if num < 0 {
            return Err(Error::value(format!("operator _linspace: num must be non-negative, got {num}")));
        }
        Ok(vec![Meta::new(vec![num as usize], dtype_of(a))])
    })
}

fn linspace(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (start, stop, num, endpoint) = (a.float("start"), a.float("stop"), a.int("num") as usize, a.bool("endpoint"));
    let steps = if endpoint { num.saturating_sub(1) } else { num };
    let step = if steps > 0 { (stop - start) / steps as f64 } else { 0.0 };
    dispatch_all!(outs[0].dtype, T => fill_index::<T>(&mut outs[0], |i| {
        T::from_f64(if endpoint && i + 1 == num { stop } else { start + step * i as f64 })
    }));
    Ok(())
}

fn eye_dims(a: &crate::op::param::Attrs) -> Result<(usize, usize, i64)> {
    let (n, m, k) = (a.int("N"), a.int("M"), a.int("k"));
    if n < 0 || m < 0 {
        return Err(Error::value(format!("operator _eye: N and M must be non-negative, got N={n}, M={m}")));
    }
    Ok((n as usize, if m == 0 { n as usize } else { m as usize }, k))
}

fn eye(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (_, m, k) = eye_dims(cx.attrs)?;
    dispatch_all!(outs[0].dtype, T => fill_index::<T>(&mut outs[0], |i| {
        T::from_f64(if (i % m) as i64 - (i / m) as i64 == k { 1.0 } else { 0.0 })
    }));
    Ok(())
}

fn register_ranges(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_arange", Inputs::Fixed(&[]), arange_infer(), Box::new(arange))
            .params(ARANGE_PARAMS)
            .doc("Return evenly spaced values within a given interval. Similar to Numpy"),
    );
    ops.push(
        OpDef::new("_linspace", Inputs::Fixed(&[]), linspace_infer(), Box::new(linspace))
            .alias(&["_npi_linspace"])
            .params(LINSPACE_PARAMS)
            .doc("Return evenly spaced numbers over a specified interval. Similar to Numpy"),
    );
    ops.push(
        OpDef::new(
            "_eye",
            Inputs::Fixed(&[]),
            Box::new(|a, _| {
                let (n, m, _) = eye_dims(a)?;
                Ok(vec![Meta::new(vec![n, m], dtype_of(a))])
            }),
            Box::new(eye),
        )
        .params(EYE_PARAMS)
        .doc("Return a 2-D array with ones on the diagonal and zeros elsewhere."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arange_lengths() {
        assert_eq!(arange_len(0.0, 10.0, 3.0, 1), 4);
        assert_eq!(arange_len(0.0, 10.0, 3.0, 2), 8);
        assert_eq!(arange_len(5.0, 0.0, -1.5, 1), 4);
        assert_eq!(arange_len(0.0, 1.0, 0.1, 1), 10);
    }
}
