//! Loss heads whose gradient does not come from an output gradient: `MakeLoss`, `make_loss`,
//! `LinearRegressionOutput`, `LogisticRegressionOutput`, `MAERegressionOutput`, and their
//! backward operators.
//!
//! Forward is the identity (the logistic head applies the sigmoid). Backward ignores the
//! output gradient, as stock does: `MakeLoss` gives `grad_scale` (normalized by the batch
//! size or the count of valid elements), `make_loss` ones, a regression head
//! `grad_scale / num_output * d(out, label)` with `d` the difference (linear, logistic) or its
//! sign (MAE: `1` where `out > label`, else `-1`), `num_output` the label's size per batch
//! entry; labels get zero gradients. Arithmetic is in the storage type (float32 for float16).

use super::init::fill;
use super::nn::{dispatch_real, float_only, infer_float_like_first, Real};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, Operand, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    pub(super) struct MakeLossParams<'a> => MAKE_LOSS_PARAMS {
        grad_scale: f64 = "1", "Gradient scale as a supplement to unary and binary operators";
        valid_thresh: f64 = "0", "clip each element in the array to 0 when it is less than ``valid_thresh``. This is used when ``normalization`` is set to ``'valid'``.";
        normalization: &'a str = "null" in ["batch", "null", "valid"], "If this is set to null, the output gradient will not be normalized. If this is set to batch, the output gradient will be divided by the batch size. If this is set to valid, the output gradient will be divided by the number of valid input elements.";
    }
}

op_params! {
    pub(super) struct RegressionParams<'a> => REGRESSION_PARAMS {
        grad_scale: f64 = "1", "Scale the gradient by a float factor";
    }
}

/// `out = data` (`MakeLoss`, `make_loss`).
fn identity(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    outs[0].copy_from(&ins[0]);
    Ok(())
}

/// `MakeLoss`'s backward: inputs (output gradient, data); every element gets `grad_scale`,
/// divided by the number of rows of the data flattened to 2-D (`batch`: every axis but the
/// last, as stock's `FlatTo2D`) or by the number of elements above `valid_thresh` (`valid`, at
/// least 1).
fn make_loss_big_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let p = MakeLossParams::of(cx.attrs);
    let x = &ins[1];
    dispatch_real!(x.dtype, cx.attrs.op, T, R => {
        let scale = R::of(p.grad_scale);
        let v = match p.normalization {
            // Stock divides by the rows of the data flattened to 2-D (all axes but the last).
            "batch" => scale / R::of((x.size() / x.shape.last().copied().unwrap_or(1).max(1)).max(1) as f64),
            "valid" => {
                let thresh = R::of(p.valid_thresh);
                let valid = x.as_slice::<T>().iter().filter(|&&v| R::load(v) > thresh).count();
                scale / R::of(valid.max(1) as f64)
            }
            _ => scale,
        };
        let v: T = v.store();
        outs[0].as_mut::<T>().fill(v);
    });
    Ok(())
}

/// `make_loss`'s backward: ones.
fn make_loss_backward(cx: &OpCtx, _: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        fill(&mut outs[0], 1.0);
    }
    Ok(())
}

/// What a regression head computes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Head {
    Linear,
    Logistic,
    Mae,
}

/// The label must have the data's batch size and number of elements (stock's rule; a label
/// of shape `(batch,)` for data `(batch, 1)` is accepted).
fn infer_regression(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (d, l) = (&ins[0], &ins[1]);
    float_only(a.op, d.dtype)?;
    let size = |s: &[usize]| s.iter().product::<usize>();
    if d.shape.is_empty() || l.shape.first() != d.shape.first() || size(&l.shape) != size(&d.shape) {
        return Err(Error::mxnet(format!(
            "operator {}: label has shape {:?}, which does not match the data's {:?} (same batch size and number of elements)",
            a.op, l.shape, d.shape
        )));
    }
    if l.dtype != d.dtype {
        return Err(Error::type_error(format!(
            "operator {}: label has dtype {}, data {}",
            a.op,
            l.dtype.name(),
            d.dtype.name()
        )));
    }
    Ok(vec![d.clone()])
}

fn regression(head: Head) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        if head != Head::Logistic {
            outs[0].copy_from(&ins[0]);
            return Ok(());
        }
        dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
            // The data may be lent to the output (declared in place).
            let ([x], o) = outs[0].operands::<T, 1>(0, [&ins[0]]);
            let sigmoid = |v: T| {
                let one = R::of(1.0);
                (one / (one + (-R::load(v)).exp())).store::<T>()
            };
            par_for_mut(o, 1, Cost::MATH, T::DTYPE, |r, o| match x {
                Operand::Input(x) => o.iter_mut().zip(&x[r]).for_each(|(o, &v)| *o = sigmoid(v)),
                Operand::Output => o.iter_mut().for_each(|o| *o = sigmoid(*o)),
            });
        });
        Ok(())
    })
}

/// A regression head's backward: inputs (output gradient, data, label, output); outputs the
/// data's gradient and the label's (zeros).
fn regression_backward(head: Head) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        if cx.req.get(1).is_some_and(|r| *r != Req::Null) {
            fill(&mut outs[1], 0.0);
        }
        if cx.req[0] == Req::Null {
            return Ok(());
        }
        let (label, out) = (&ins[2], &ins[3]);
        // In float32, as stock computes it (`grad_scale` and `num_output` are floats there),
        // whatever the data's type.
        let num_output = label.size() as f32 / label.shape.first().copied().unwrap_or(1).max(1) as f32;
        let scale = (RegressionParams::of(cx.attrs).grad_scale as f32 / num_output) as f64;
        dispatch_real!(out.dtype, cx.attrs.op, T, R => {
            let (y, l, s) = (out.as_slice::<T>(), label.as_slice::<T>(), R::of(scale));
            par_for_mut(outs[0].as_mut::<T>(), 1, Cost::CHEAP, T::DTYPE, |r, o| {
                for ((o, &y), &l) in o.iter_mut().zip(&y[r.clone()]).zip(&l[r]) {
                    let d = R::load(y) - R::load(l);
                    let d = match head {
                        Head::Mae => if d > R::of(0.0) { R::of(1.0) } else { R::of(-1.0) },
                        _ => d,
                    };
                    *o = (d * s).store();
                }
            });
        });
        Ok(())
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let data = Inputs::Fixed(&["data"]);
    ops.push(
        OpDef::new("MakeLoss", data, Box::new(infer_float_like_first), Box::new(identity))
            .params(MAKE_LOSS_PARAMS)
            .elementwise_shape()
            .grad(Grad::Backward { op: "_backward_MakeLoss", inputs: true, outputs: false })
            .doc("Makes a loss symbol: the output is the input; its gradient is grad_scale (normalized as `normalization` says), whatever the output gradient."),
    );
    ops.push(OpDef::backward("_backward_MakeLoss", MAKE_LOSS_PARAMS, Box::new(make_loss_big_backward)));
    ops.push(
        OpDef::new("make_loss", data, Box::new(infer_float_like_first), Box::new(identity))
            .alias(&["_sparse_make_loss"])
            .elementwise_shape()
            .grad(Grad::Backward { op: "_backward_make_loss", inputs: false, outputs: false })
            .doc("Make your own loss function in network construction: the output is the input, its gradient is 1."),
    );
    ops.push(OpDef::backward("_backward_make_loss", &[], Box::new(make_loss_backward)));
    for (name, back, head, doc) in [
        (
            "LinearRegressionOutput",
            "_backward_linear_reg_out",
            Head::Linear,
            "Computes and optimizes for squared loss during backward propagation (the output is the input).",
        ),
        (
            "LogisticRegressionOutput",
            "_backward_logistic_reg_out",
            Head::Logistic,
            "Applies a logistic function to the input; the gradient is that of the cross-entropy loss.",
        ),
        (
            "MAERegressionOutput",
            "_backward_mae_reg_out",
            Head::Mae,
            "Computes mean absolute error of the input (the output is the input).",
        ),
    ] {
        ops.push(
            OpDef::new(name, Inputs::Fixed(&["data", "label"]), Box::new(infer_regression), regression(head))
                .alias(&[Box::leak(format!("_sparse_{name}").into_boxed_str())])
                .params(REGRESSION_PARAMS)
                .elementwise_shape_of(1)
                .param_shapes(regression_label_shape)
                .inplace(&[(0, 0)])
                .never_mirrored()
                .grad(Grad::Backward { op: back, inputs: true, outputs: true })
                .doc(doc),
        );
        ops.push(OpDef::backward(back, REGRESSION_PARAMS, regression_backward(head)));
    }
}

/// The label's shape from the data's when it is not given (stock's rule): the data's, or
/// `(N,)` for data of shape `(N, 1)`.
fn regression_label_shape(_: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    Ok(vec![(1, if data.len() == 2 && data[1] == 1 { vec![data[0]] } else { data.to_vec() })])
}
