//! `moments`: the mean and (population) variance of data over `axes`, as two outputs, and its
//! backward operator. As stock: `axes` must be given (all of them for global moments), the
//! variance is taken around the mean as stored in the data's dtype, and the gradient is
//! `g_mean / N + g_var * 2 (x - mean) / N` for `N` elements per output. Sums run in float64.

use super::reduce::{reduced_axes, reduced_shape};
use crate::error::{Error, Result};
use crate::ndarray::Meta;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{two_mut, Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};
use crate::{dispatch_float, dispatch_num};

op_params! {
    struct MomentsParams<'a> => MOMENTS_PARAMS {
        axes: Option<&'a [i64]> = "None", "Array of ints. Axes along which to compute mean and variance.";
        keepdims: bool = "False", "produce moments with the same dimensionality as the input.";
    }
}

/// The reduced axes (as flags) and the output shape for data of `shape`.
fn plan(a: &Attrs, shape: &[usize]) -> Result<(Vec<bool>, Vec<usize>)> {
    let p = MomentsParams::of(a);
    if p.axes.is_none_or(<[i64]>::is_empty) {
        return Err(Error::value(format!(
            "operator {}: Empty axes is not supported, if you would like to do global moments, please pass all axes to axes argument",
            a.op
        )));
    }
    let flags = reduced_axes(a.op, shape.len(), p.axes, false)?;
    let out = reduced_shape(shape, &flags, p.keepdims);
    Ok((flags, out))
}

/// For every element of data of `shape`, the output element it reduces into.
fn out_index(shape: &[usize], flags: &[bool]) -> Vec<usize> {
    let mut ostride = vec![0usize; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        if !flags[d] {
            ostride[d] = acc;
            acc *= shape[d];
        }
    }
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut i| {
            let mut o = 0;
            for d in (0..shape.len()).rev() {
                o += (i % shape[d]) * ostride[d];
                i /= shape[d];
            }
            o
        })
        .collect()
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (_, out) = plan(a, &ins[0].shape)?;
    Ok(vec![Meta::new(out.clone(), ins[0].dtype), Meta::new(out, ins[0].dtype)])
}

fn forward_typed<T: Elem>(x: &[T], idx: &[usize], mean: &mut [T], var: &mut [T]) {
    let m = mean.len();
    let per = x.len().checked_div(m).unwrap_or(0) as f64;
    let mut sums = vec![0f64; m];
    for (&v, &o) in x.iter().zip(idx) {
        sums[o] += v.to_f64();
    }
    for (d, s) in mean.iter_mut().zip(&sums) {
        *d = T::from_f64(s / per);
    }
    let mut sq = vec![0f64; m];
    for (&v, &o) in x.iter().zip(idx) {
        let e = v.to_f64() - mean[o].to_f64();
        sq[o] += e * e;
    }
    for (d, s) in var.iter_mut().zip(&sq) {
        *d = T::from_f64(s / per);
    }
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (flags, _) = plan(cx.attrs, &ins[0].shape)?;
    let idx = out_index(&ins[0].shape, &flags);
    let (mean, var) = two_mut(outs, 0, 1);
    dispatch_num!(ins[0].dtype, cx.attrs.op, T => forward_typed::<T>(ins[0].as_slice::<T>(), &idx, mean.as_mut::<T>(), var.as_mut::<T>()));
    Ok(())
}

/// Inputs: the mean's and variance's gradients, data, mean, variance.
fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (flags, _) = plan(cx.attrs, &ins[2].shape)?;
    let idx = out_index(&ins[2].shape, &flags);
    dispatch_float!(ins[2].dtype, cx.attrs.op, T => {
        let (gm, gv, x, mean) =
            (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>(), ins[3].as_slice::<T>());
        let per = x.len().checked_div(mean.len()).unwrap_or(0) as f64;
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::MEDIUM, T::DTYPE, |r, o| {
            for (k, o) in o.iter_mut().enumerate() {
                let i = r.start + k;
                let j = idx[i];
                let d = x[i].to_f64() - mean[j].to_f64();
                *o = T::from_f64(gm[j].to_f64() / per + gv[j].to_f64() * d * 2.0 / per);
            }
        });
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("moments", Inputs::Fixed(&["data"]), Box::new(infer), Box::new(forward))
            .params(MOMENTS_PARAMS)
            .outputs(|_| 2, |_| 2)
            .grad(Grad::Backward { op: "_backward_moments", inputs: true, outputs: true })
            .doc("Calculate the mean and variance of `data`. The mean and variance are calculated by aggregating the contents of data across axes. If x is 1-D and axes = [0] this is just the mean and variance of a vector."),
    );
    ops.push(OpDef::backward("_backward_moments", MOMENTS_PARAMS, Box::new(backward)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_index_maps_kept_dimensions() {
        // (2, 3, 2) reduced over axis 1: output (2, 2), element (a, b, c) -> a * 2 + c.
        let idx = out_index(&[2, 3, 2], &[false, true, false]);
        let want: Vec<usize> = (0..12).map(|i| (i / 6) * 2 + i % 2).collect();
        assert_eq!(idx, want);
        let (mut m, mut v) = ([0f64; 4], [0f64; 4]);
        let x: Vec<f64> = (0..12).map(f64::from).collect();
        forward_typed(&x, &idx, &mut m, &mut v);
        assert_eq!(m, [2.0, 3.0, 8.0, 9.0]);
        assert_eq!(v, [8.0 / 3.0; 4]);
    }
}
