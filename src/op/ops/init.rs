//! Creation operators: `_zeros`, `_ones`, `_full`.

use super::common::shape_param;
use crate::dispatch_all;
use crate::op::kernel::{par_for, Cost};
use crate::op::param::{ParamSpec, PType};
use crate::op::tensor::{Elem, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};
use crate::error::Result;
use crate::ndarray::DType;

const DTYPES: &[&str] = &["bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"];

pub(super) const SHAPE_CTX_DTYPE: &[ParamSpec] = &[
    ParamSpec::opt("shape", PType::Shape, "()", "The shape of the output"),
    ParamSpec::opt("ctx", PType::Ctx, "", "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls."),
    ParamSpec::opt("dtype", PType::Enum(DTYPES), "float32", "Target data type."),
];

const FULL_PARAMS: &[ParamSpec] = &[
    ParamSpec::opt("shape", PType::Shape, "()", "The shape of the output"),
    ParamSpec::opt("ctx", PType::Ctx, "", "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls."),
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
pub(crate) fn fill(out: &TBlob, v: f64) {
    dispatch_all!(out.dtype, T => fill_typed::<T>(out, T::from_f64(v)))
}

fn fill_typed<T: Elem>(out: &TBlob, v: T) {
    let o = out.as_mut::<T>();
    let p = crate::op::tensor::SendPtr(o.as_mut_ptr());
    par_for(o.len(), Cost::CHEAP, T::DTYPE, |r| {
        let p = p;
        // SAFETY: ranges from par_for are disjoint and within the output.
        let chunk = unsafe { std::slice::from_raw_parts_mut(p.0.add(r.start), r.len()) };
        chunk.fill(v);
    });
}

fn filler(value: fn(&OpCtx) -> f64) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, _: &[TBlob], outs: &[TBlob]| -> Result<()> {
        fill(&outs[0], value(cx));
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
    let _ = DType::F32;
}
