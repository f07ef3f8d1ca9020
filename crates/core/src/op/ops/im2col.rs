//! `im2col` (sliding blocks of an image batch as columns: `(N, C, *spatial)` to
//! `(N, C * prod(kernel), L)`, L the number of block positions), its inverse `col2im`
//! (columns summed back onto `(N, C, *output_size)`), and their backward operators (each the
//! other applied to the gradient). Both reuse the convolution's unfolding ([`im2col`],
//! [`col2im`] over a one-filter [`Plan`]), so rows are channel-major, then kernel positions.

use super::conv::{im2col, widen, Plan};
use super::conv_grad::col2im;
use super::nn::dispatch_real;
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

const KERNEL_DOC: &str = "Sliding kernel size: (w,), (h, w) or (d, h, w).";
const STRIDE_DOC: &str =
    "The stride between adjacent sliding blocks in spatial dimension: (w,), (h, w) or (d, h, w). Defaults to 1 for each dimension.";
const DILATE_DOC: &str =
    "The spacing between adjacent kernel points: (w,), (h, w) or (d, h, w). Defaults to 1 for each dimension.";
const PAD_DOC: &str =
    "The zero-value padding size on both sides of spatial dimension: (w,), (h, w) or (d, h, w). Defaults to no padding.";

op_params! {
    struct Im2colParams<'a> => IM2COL_PARAMS {
        kernel: &'a [i64] = required, KERNEL_DOC;
        stride: &'a [i64] = "[]", STRIDE_DOC;
        dilate: &'a [i64] = "[]", DILATE_DOC;
        pad: &'a [i64] = "[]", PAD_DOC;
    }
}

op_params! {
    struct Col2imParams<'a> => COL2IM_PARAMS {
        output_size: &'a [i64] = required, "The spatial dimension of image array: (w,), (h, w) or (d, h, w).";
        kernel: &'a [i64] = required, KERNEL_DOC;
        stride: &'a [i64] = "[]", STRIDE_DOC;
        dilate: &'a [i64] = "[]", DILATE_DOC;
        pad: &'a [i64] = "[]", PAD_DOC;
    }
}

/// The unfolding of `n` images of `c` channels and spatial size `spatial` (which must have
/// as many dimensions as the kernel).
fn unfolding(a: &Attrs, n: usize, c: usize, spatial: &[usize]) -> Result<Plan> {
    let op = a.op;
    let (kernel, stride, dilate, pad) = if a.declares(COL2IM_PARAMS) {
        let p = Col2imParams::of(a);
        (p.kernel, p.stride, p.dilate, p.pad)
    } else {
        let p = Im2colParams::of(a);
        (p.kernel, p.stride, p.dilate, p.pad)
    };
    let nsp = kernel.len();
    if !(1..=3).contains(&nsp) || spatial.len() != nsp {
        return Err(Error::value(format!(
            "operator {op}: kernel {kernel:?} must have 1, 2 or 3 entries, one per spatial dimension of {spatial:?}"
        )));
    }
    let mut input = [1; 3];
    input[3 - nsp..].copy_from_slice(spatial);
    Plan::build(
        op,
        nsp,
        [n, c, 1, 1],
        input,
        widen(op, "kernel", kernel, nsp, 1, 1)?,
        widen(op, "stride", stride, nsp, 1, 1)?,
        widen(op, "dilate", dilate, nsp, 1, 1)?,
        widen(op, "pad", pad, nsp, 0, 0)?,
    )
}

/// The unfolding an `im2col` of `data` (N, C, *spatial) does.
fn im2col_plan(a: &Attrs, data: &[usize]) -> Result<Plan> {
    if data.len() < 3 {
        return Err(Error::value(format!("operator {}: data of shape {data:?} must be 3-D to 5-D", a.op)));
    }
    unfolding(a, data[0], data[1], &data[2..])
}

/// The unfolding whose columns a `col2im` of `data` (N, C * prod(kernel), L) folds back.
fn col2im_plan(a: &Attrs, data: &[usize]) -> Result<Plan> {
    let p = Col2imParams::of(a);
    let size: Vec<usize> = p.output_size.iter().map(|&d| d.max(0) as usize).collect();
    let ksize: i64 = p.kernel.iter().product();
    if data.len() != 3 || ksize <= 0 || data[1] % ksize as usize != 0 {
        return Err(Error::value(format!(
            "operator {}: data of shape {data:?} must be (N, C * {ksize}, L) for kernel {:?}",
            a.op, p.kernel
        )));
    }
    let plan = unfolding(a, data[0], data[1] / ksize as usize, &size)?;
    if plan.osz() != data[2] {
        return Err(Error::value(format!(
            "operator {}: data has {} block positions, output_size {:?} with this kernel, stride, dilate and pad gives {}",
            a.op,
            data[2],
            p.output_size,
            plan.osz()
        )));
    }
    Ok(plan)
}

fn image_shape(p: &Plan, spatial: usize) -> Vec<usize> {
    let mut s = vec![p.n, p.c];
    s.extend_from_slice(&p.input[3 - spatial..]);
    s
}

/// Refuses data that is not float16, float32 or float64.
pub(super) fn float(op: &str, m: &Meta) -> Result<()> {
    if matches!(m.dtype, DType::F16 | DType::F32 | DType::F64) {
        Ok(())
    } else {
        Err(Error::type_error(format!("operator {op}: data must be a float type, got {}", m.dtype.name())))
    }
}

/// Images `x` unfolded into `cols` (one `kdim × osz` block per image).
fn unfold<T: Elem>(p: &Plan, x: &[T], cols: &mut [T]) {
    let (img, blk) = (p.c * p.isz(), p.kdim() * p.osz());
    if blk == 0 {
        return;
    }
    par_for_mut(cols, blk, Cost(2.0 * blk as f64), T::DTYPE, |r, o| {
        for (k, col) in o.chunks_mut(blk).enumerate() {
            let i = r.start + k;
            im2col(p, &x[i * img..(i + 1) * img], col, p.osz());
        }
    });
}

/// Columns `cols` summed back onto images `x`.
fn fold<T: Elem, R: super::nn::Real>(p: &Plan, cols: &[T], x: &mut [T]) {
    let (img, blk) = (p.c * p.isz(), p.kdim() * p.osz());
    if img == 0 {
        return;
    }
    par_for_mut(x, img, Cost(2.0 * blk as f64), T::DTYPE, |r, o| {
        for (k, dx) in o.chunks_mut(img).enumerate() {
            let i = r.start + k;
            col2im::<T, R>(p, &cols[i * blk..(i + 1) * blk], p.osz(), dx);
        }
    });
}

fn im2col_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = im2col_plan(cx.attrs, &ins[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, _R => unfold::<T>(&p, ins[0].as_slice::<T>(), outs[0].as_mut::<T>()));
    Ok(())
}

/// Input: the columns' gradient; output: the images' (its folding).
fn im2col_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let p = im2col_plan(cx.attrs, &outs[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => fold::<T, R>(&p, ins[0].as_slice::<T>(), outs[0].as_mut::<T>()));
    Ok(())
}

fn col2im_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = col2im_plan(cx.attrs, &ins[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => fold::<T, R>(&p, ins[0].as_slice::<T>(), outs[0].as_mut::<T>()));
    Ok(())
}

/// Input: the images' gradient; output: the columns' (its unfolding).
fn col2im_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let p = col2im_plan(cx.attrs, &outs[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, _R => unfold::<T>(&p, ins[0].as_slice::<T>(), outs[0].as_mut::<T>()));
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "im2col",
            Inputs::Fixed(&["data"]),
            Box::new(|a, ins| {
                float(a.op, &ins[0])?;
                let p = im2col_plan(a, &ins[0].shape)?;
                Ok(vec![Meta::new(vec![p.n, p.kdim(), p.osz()], ins[0].dtype)])
            }),
            Box::new(im2col_forward),
        )
        .params(IM2COL_PARAMS)
        .output_names(&["output"])
        .grad(Grad::Backward { op: "_backward_im2col", inputs: false, outputs: false })
        .doc("Extract sliding blocks from input array: data of shape (N, C, *) becomes (N, C * prod(kernel), W), W the number of blocks; each column is one block, channel by channel."),
    );
    ops.push(OpDef::backward("_backward_im2col", IM2COL_PARAMS, Box::new(im2col_backward)));
    ops.push(
        OpDef::new(
            "col2im",
            Inputs::Fixed(&["data"]),
            Box::new(|a, ins| {
                float(a.op, &ins[0])?;
                let p = col2im_plan(a, &ins[0].shape)?;
                Ok(vec![Meta::new(image_shape(&p, Col2imParams::of(a).kernel.len()), ins[0].dtype)])
            }),
            Box::new(col2im_forward),
        )
        .params(COL2IM_PARAMS)
        .output_names(&["output"])
        .grad(Grad::Backward { op: "_backward_col2im", inputs: false, outputs: false })
        .doc("Combining the output column matrix of im2col back to image array: data of shape (N, C * prod(kernel), W) becomes (N, C, *output_size), overlapping values summed."),
    );
    ops.push(OpDef::backward("_backward_col2im", COL2IM_PARAMS, Box::new(col2im_backward)));
}
