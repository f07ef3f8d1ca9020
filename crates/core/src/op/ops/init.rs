//! Creation operators: `_zeros`, `_ones`, `_full`, `_zeros_without_dtype`, `_arange`,
//! `_linspace`, `_eye`; and stock's two legacy NDArray functions that write a caller-given
//! array, `_set_value` (fill with a scalar) and `_onehot_encode` (one-hot rows from indices),
//! run as `_full` and `one_hot` into that array.

use super::common::shape_param;
use crate::context::Context;
use crate::dispatch_all;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::gpu::GpuKernel;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};

const DTYPES: &[&str] = &["bool", "float16", "float32", "float64", "int32", "int64", "int8", "uint8"];

const CTX_DOC: &str = "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls.";

op_params! {
    /// `_zeros`' and `_ones`' parameters.
    struct FillParams<'a> => SHAPE_CTX_DTYPE {
        shape: &'a [i64] = "()", "The shape of the output";
        ctx: Option<Context> = "", CTX_DOC;
        dtype: &'a str = "float32" in *DTYPES, "Target data type.";
    }
}

op_params! {
    /// `_full`'s parameters.
    struct FullParams<'a> => FULL_PARAMS {
        shape: &'a [i64] = "()", "The shape of the output";
        ctx: Option<Context> = "", CTX_DOC;
        dtype: &'a str = "float32" in *DTYPES, "Target data type.";
        value: f64 = required, "Value with which to fill newly created tensor";
    }
}

op_params! {
    /// `_zeros_without_dtype`'s parameters: `dtype` is a type code, -1 for float32.
    struct ZerosNoDtypeParams<'a> => ZEROS_NO_DTYPE_PARAMS {
        shape: &'a [i64] = "()", "The shape of the output";
        ctx: Option<Context> = "", CTX_DOC;
        dtype: i64 = "-1", "Target data type.";
    }
}

fn infer_zeros_no_dtype(a: &crate::op::param::Attrs, _: &[Meta]) -> Result<Vec<Meta>> {
    let p = ZerosNoDtypeParams::of(a);
    let dtype = match p.dtype {
        -1 => DType::F32,
        code => DType::from_code(i32::try_from(code).unwrap_or(-2))
            .map_err(|_| Error::value(format!("operator _zeros_without_dtype: unknown dtype code {code}")))?,
    };
    Ok(vec![Meta::new(shape_param("_zeros_without_dtype", "shape", p.shape)?, dtype)])
}

op_params! {
    /// `_set_value`'s parameter.
    struct SetValueParams<'a> => SET_VALUE_PARAMS {
        src: f64 = required, "Source input to the function.";
    }
}

/// The caller's single output of a legacy NDArray function (`out=`), which it requires.
fn given_out<'a>(op: &str, outputs: Option<&[&'a NDArray]>) -> Result<&'a NDArray> {
    match outputs {
        Some(&[o]) => Ok(o),
        _ => Err(Error::value(format!("operator {op} writes into the array given as out= (one array)"))),
    }
}

/// `_set_value(src=v, out=a)`: every element of `a` set to `v`.
fn invoke_set_value(
    _: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: crate::op::param::Attrs,
) -> Result<crate::op::OwnInvoked> {
    let out = given_out("_set_value", outputs)?;
    if !inputs.is_empty() {
        return Err(Error::value(format!("operator _set_value takes no array inputs, got {}", inputs.len())));
    }
    let v = SetValueParams::of(&attrs).src;
    let dims: Vec<String> = out.shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(",")) };
    let value = format!("{v:?}");
    let kv = [("shape", shape.as_str()), ("dtype", out.dtype.name()), ("value", value.as_str())];
    let done = crate::op::invoke::invoke(crate::op::lookup("_full")?, &[], Some(&[out]), kv)?;
    Ok((done, None))
}

/// `_onehot_encode(indices, out, out=out)`: row `i` of the 2-D `out` is zero but for a one
/// at column `indices[i]` (indices out of range give a zero row, as `one_hot`).
fn invoke_onehot_encode(
    _: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    _: crate::op::param::Attrs,
) -> Result<crate::op::OwnInvoked> {
    let out = given_out("_onehot_encode", outputs)?;
    let &[indices, _] = inputs else {
        return Err(Error::value(format!(
            "operator _onehot_encode takes indices and out, got {} arrays",
            inputs.len()
        )));
    };
    if indices.shape.len() != 1 || out.shape.len() != 2 || out.shape[0] != indices.shape[0] {
        return Err(Error::value(format!(
            "operator _onehot_encode: needs 1-D indices and a 2-D out with one row per index, got {:?} and {:?}",
            indices.shape, out.shape
        )));
    }
    let depth = out.shape[1].to_string();
    let kv = [("depth", depth.as_str()), ("dtype", out.dtype.name())];
    let done = crate::op::invoke::invoke(crate::op::lookup("one_hot")?, &[indices], Some(&[out]), kv)?;
    Ok((done, None))
}

fn legacy_function_in_graph(op: &'static str) -> crate::op::InferFn {
    Box::new(move |_, _| Err(Error::not_supported(format!("{op} in a symbolic graph (it writes a given NDArray)"))))
}

/// Output shape and dtype from the `shape` and `dtype` parameters of `_zeros`, `_ones` and
/// `_full`.
fn infer_shape_dtype(op: &'static str) -> crate::op::InferFn {
    Box::new(move |a, _| {
        let (shape, dtype) = if a.declares(FULL_PARAMS) {
            let p = FullParams::of(a);
            (p.shape, p.dtype)
        } else {
            let p = FillParams::of(a);
            (p.shape, p.dtype)
        };
        Ok(vec![Meta::new(shape_param(op, "shape", shape)?, dtype_named(dtype))])
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

op_params! {
    /// `reset_arrays`' parameters.
    struct ResetParams<'a> => RESET_PARAMS {
        num_arrays: i64 = required, "number of input arrays.";
    }
}

/// `reset_arrays`: every input (all mutated, appended after no outputs) set to zeros.
fn reset_arrays(_: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    for o in outs {
        o.as_bytes_mut().fill(0);
    }
    Ok(())
}

/// No outputs; the arrays must be of floating-point types, as stock's kernel requires.
fn reset_infer(_: &crate::op::param::Attrs, inputs: &[Meta]) -> Result<Vec<Meta>> {
    if let Some(m) = inputs.iter().find(|m| !matches!(m.dtype, DType::F32 | DType::F64 | DType::F16)) {
        return Err(Error::mxnet(format!(
            "reset_arrays: this operation only supports floating point types, not {}",
            m.dtype.name()
        )));
    }
    Ok(Vec::new())
}

fn no_outputs(_: &crate::op::param::Attrs) -> usize {
    0
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("reset_arrays", Inputs::Variadic("data"), Box::new(reset_infer), Box::new(reset_arrays))
            .params(RESET_PARAMS)
            .num_args_key("num_arrays")
            .outputs(no_outputs, no_outputs)
            .mutates_all()
            .doc("Set to zero multiple arrays"),
    );
    ops.push(
        OpDef::new("_zeros", Inputs::Fixed(&[]), infer_shape_dtype("_zeros"), filler(|_| 0.0))
            .params(SHAPE_CTX_DTYPE)
            .gpu(GpuKernel::Fill(|_| 0.0))
            .doc("fill target with zeros"),
    );
    ops.push(
        OpDef::new("_ones", Inputs::Fixed(&[]), infer_shape_dtype("_ones"), filler(|_| 1.0))
            .params(SHAPE_CTX_DTYPE)
            .gpu(GpuKernel::Fill(|_| 1.0))
            .doc("fill target with ones"),
    );
    ops.push(
        OpDef::new(
            "_full",
            Inputs::Fixed(&[]),
            infer_shape_dtype("_full"),
            filler(|cx| FullParams::of(cx.attrs).value),
        )
        .params(FULL_PARAMS)
        .gpu(GpuKernel::Fill(|cx| FullParams::of(cx.attrs).value))
        .doc("fill target with a scalar value"),
    );
    ops.push(
        OpDef::new("_zeros_without_dtype", Inputs::Fixed(&[]), Box::new(infer_zeros_no_dtype), filler(|_| 0.0))
            .params(ZEROS_NO_DTYPE_PARAMS)
            .gpu(GpuKernel::Fill(|_| 0.0))
            .doc("fill target with zeros without default dtype"),
    );
    let unreachable: fn(&'static str) -> crate::op::ComputeFn =
        |op| Box::new(move |_, _, _| Err(Error::internal(format!("{op} runs through its own invocation"))));
    ops.push(
        OpDef::new("_set_value", Inputs::Fixed(&[]), legacy_function_in_graph("_set_value"), unreachable("_set_value"))
            .params(SET_VALUE_PARAMS)
            .invoke_with(invoke_set_value)
            .doc("Set all the elements in ndarray to be scalar value"),
    );
    ops.push(
        OpDef::new(
            "_onehot_encode",
            Inputs::Fixed(&["lhs", "rhs"]),
            legacy_function_in_graph("_onehot_encode"),
            unreachable("_onehot_encode"),
        )
        .invoke_with(invoke_onehot_encode)
        .doc("One-hot encoding of the indices lhs into the matrix rhs, which must also be the output (out=rhs)."),
    );
    register_ranges(ops);
}

op_params! {
    /// `_arange`'s parameters.
    struct ArangeParams<'a> => ARANGE_PARAMS {
        start: f64 = required, "Start of interval. The interval includes this value. The default start value is 0.";
        stop: Option<f64> = "None", "End of interval. The interval does not include this value, except in some cases where step is not an integer and floating point round-off affects the length of out.";
        step: f64 = "1", "Spacing between values.";
        repeat: i64 = "1", "The repeating time of all elements. E.g repeat=3, the element a will be repeated three times --> a, a, a.";
        infer_range: bool = "False", "When set to True, infer the stop position from the start, step, repeat, and output tensor size.";
        ctx: Option<Context> = "", CTX_DOC;
        dtype: &'a str = "float32" in *DTYPES, "Target data type.";
    }
}

op_params! {
    /// `_linspace`'s parameters.
    struct LinspaceParams<'a> => LINSPACE_PARAMS {
        start: f64 = required, "Start of interval.";
        stop: f64 = required, "End of interval, included unless endpoint is False.";
        num: i64 = required, "Number of samples to generate. Must be non-negative.";
        endpoint: bool = "True", "If True, stop is the last sample. Otherwise, it is not included.";
        ctx: Option<Context> = "", CTX_DOC;
        dtype: &'a str = "float32" in *DTYPES, "Target data type.";
    }
}

op_params! {
    /// `_eye`'s parameters.
    struct EyeParams<'a> => EYE_PARAMS {
        N: i64 = required, "Number of rows in the output.";
        M: i64 = "0", "Number of columns in the output. If 0, defaults to N";
        k: i64 = "0", "Index of the diagonal. 0 (the default) refers to the main diagonal.A positive value refers to an upper diagonal.A negative value to a lower diagonal.";
        ctx: Option<Context> = "", CTX_DOC;
        dtype: &'a str = "float32" in *DTYPES, "Target data type.";
    }
}

/// The dtype a `dtype` parameter of [`DTYPES`] names.
fn dtype_named(name: &str) -> DType {
    crate::op::param::dtype_from_name(name).expect("enum of dtype names")
}

/// `_arange`'s (start, stop, step, repeat) after stock's rule that a missing stop means
/// `[0, start)`, validated.
fn range_of(p: &ArangeParams) -> Result<(f64, f64, f64, usize)> {
    let op = "_arange";
    let (mut start, step, repeat) = (p.start, p.step, p.repeat);
    let stop = match p.stop {
        Some(s) => s,
        None if p.infer_range => {
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
        let p = ArangeParams::of(a);
        let (start, stop, step, repeat) = range_of(&p)?;
        Ok(vec![Meta::new(vec![arange_len(start, stop, step, repeat)], dtype_named(p.dtype))])
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

/// With `infer_range` and no stop, a graph's inference gives the length (stock's rule: the
/// output's size from its consumers, `start` the first value): unknown, as in stock.
fn arange_partial(a: &Attrs, _: &[Option<Vec<i64>>]) -> Option<Vec<Option<Vec<i64>>>> {
    let p = ArangeParams::of(a);
    // A zero step or repeat is left to the operator's own inference, which refuses it.
    (p.infer_range && p.stop.is_none() && p.step != 0.0 && p.repeat > 0).then(|| vec![None])
}

/// The stop that gives `infer_range`'s output the length `shape` a graph found: half a step
/// before the last value's successor, so rounding cannot change the count.
fn arange_sized(a: &Attrs, shape: &[usize]) -> Option<Vec<(&'static str, String)>> {
    let p = ArangeParams::of(a);
    let (&[len], true, None) = (shape, p.infer_range, p.stop) else { return None };
    let repeat = p.repeat.max(1) as usize;
    // A length that is not whole repeats has no such stop (the node then fails as unsized).
    if len % repeat != 0 {
        return None;
    }
    let values = len / repeat;
    let stop = p.start + (values as f64 - 0.5) * p.step;
    // Where start dwarfs the steps no such stop is representable: the node stays unsized.
    let given = ArangeParams { stop: Some(stop), infer_range: false, ..p };
    let (start, stop_, step, repeat_) = range_of(&given).ok()?;
    (arange_len(start, stop_, step, repeat_) == len)
        .then(|| vec![("stop", format!("{stop:?}")), ("infer_range", "False".into())])
}

fn arange(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (start, _, step, repeat) = range_of(&ArangeParams::of(cx.attrs))?;
    let out = &mut outs[0];
    // Stock's kernel computes `start + (i / repeat) * step` in the output's type, start and
    // step converted to it first: float32 arithmetic for float32 (and float16), and for
    // integers wrapping arithmetic on the truncated start and step (`uint8` from 50 by -2
    // counts 50, 48, ..., 0, 254, ...).
    macro_rules! wrapping {
        ($t:ty) => {{
            let (s, d) = (start as i64, step as i64);
            fill_index::<$t>(out, |i| s.wrapping_add(((i / repeat) as i64).wrapping_mul(d)) as $t)
        }};
    }
    match out.dtype {
        DType::F64 => fill_index::<f64>(out, |i| start + (i / repeat) as f64 * step),
        DType::F32 => fill_index::<f32>(out, |i| start as f32 + (i / repeat) as f32 * step as f32),
        DType::F16 => {
            fill_index::<half::f16>(out, |i| half::f16::from_f32(start as f32 + (i / repeat) as f32 * step as f32))
        }
        DType::U8 => wrapping!(u8),
        DType::I8 => wrapping!(i8),
        DType::I32 => wrapping!(i32),
        DType::I64 => wrapping!(i64),
        DType::Bool => {
            fill_index::<crate::op::tensor::Bool8>(out, |i| Elem::from_f64(start + (i / repeat) as f64 * step))
        }
    }
    Ok(())
}

fn linspace_infer() -> crate::op::InferFn {
    Box::new(|a, _| {
        let p = LinspaceParams::of(a);
        let num = p.num;
        if num < 0 {
            return Err(Error::value(format!("operator _linspace: num must be non-negative, got {num}")));
        }
        Ok(vec![Meta::new(vec![num as usize], dtype_named(p.dtype))])
    })
}

fn linspace(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LinspaceParams::of(cx.attrs);
    let (start, stop, num, endpoint) = (p.start, p.stop, p.num as usize, p.endpoint);
    let steps = if endpoint { num.saturating_sub(1) } else { num };
    let step = if steps > 0 { (stop - start) / steps as f64 } else { 0.0 };
    dispatch_all!(outs[0].dtype, T => fill_index::<T>(&mut outs[0], |i| {
        T::from_f64(if endpoint && num > 1 && i + 1 == num { stop } else { start + step * i as f64 })
    }));
    Ok(())
}

fn eye_dims(p: &EyeParams) -> Result<(usize, usize, i64)> {
    let (n, m, k) = (p.N, p.M, p.k);
    if n < 0 || m < 0 {
        return Err(Error::value(format!("operator _eye: N and M must be non-negative, got N={n}, M={m}")));
    }
    Ok((n as usize, if m == 0 { n as usize } else { m as usize }, k))
}

fn eye(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (_, m, k) = eye_dims(&EyeParams::of(cx.attrs))?;
    dispatch_all!(outs[0].dtype, T => fill_index::<T>(&mut outs[0], |i| {
        T::from_f64(if (i % m) as i64 - (i / m) as i64 == k { 1.0 } else { 0.0 })
    }));
    Ok(())
}

fn register_ranges(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_arange", Inputs::Fixed(&[]), arange_infer(), Box::new(arange))
            .params(ARANGE_PARAMS)
            .partial_shapes(arange_partial)
            .sized_by_graph(arange_sized)
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
                let p = EyeParams::of(a);
                let (n, m, _) = eye_dims(&p)?;
                Ok(vec![Meta::new(vec![n, m], dtype_named(p.dtype))])
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
