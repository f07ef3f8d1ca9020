//! `Deconvolution` (transposed convolution: Gluon's `Conv1DTranspose`/`Conv2DTranspose`/
//! `Conv3DTranspose`) and its backward operator.
//!
//! A deconvolution of `[N, C, *in]` data by a `[C, F/g, *kernel]` weight is the data gradient
//! of the convolution of an `[N, F, *out]` input by that weight (as `[C, F/g, *kernel]`
//! filters), so it runs on the convolution's [`Plan`] with input and output swapped: per
//! image and group the forward multiplies `Wᵀ·x` into a column matrix and folds it onto the
//! output (`col2im`), and the backward unfolds the output gradient (`im2col`) for the data
//! gradient (`W·col`) and the weight gradient (`x·colᵀ`).
//!
//! Output size per spatial dimension: `stride·(in − 1) + dilate·(kernel − 1) + 1 − 2·pad +
//! adj`; a `target_shape` replaces `pad` and `adj` with the ones that give it (stock's rule).

use super::conv::{im2col, widen, Plan};
use super::conv_grad::col2im;
use super::linalg::{gemm, GemmElem};
use super::nn::Real;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};
use half::f16;

op_params! {
    pub(super) struct DeconvParams<'a> => DECONV_PARAMS {
        kernel: &'a [i64] = required, "Deconvolution kernel size: (w,), (h, w) or (d, h, w). This is same as the kernel size used for the corresponding convolution";
        stride: &'a [i64] = "[]", "The stride used for the corresponding convolution: (w,), (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        dilate: &'a [i64] = "[]", "Dilation factor for each dimension of the input: (w,), (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        pad: &'a [i64] = "[]", "The amount of implicit zero padding added during convolution for each dimension of the input: (w,), (h, w) or (d, h, w). ``(kernel-1)/2`` is usually a good choice. If `target_shape` is set, `pad` will be ignored and a padding that will generate the target shape will be used. Defaults to no padding.";
        adj: &'a [i64] = "[]", "Adjustment for output shape: (w,), (h, w) or (d, h, w). If `target_shape` is set, `adj` will be ignored and computed accordingly.";
        target_shape: &'a [i64] = "[]", "Shape of the output tensor: (w,), (h, w) or (d, h, w).";
        num_filter: i64 = required, "Number of output filters.";
        num_group: i64 = "1", "Number of groups partition.";
        workspace: i64 = "512", "Maximum temporary workspace allowed (MB) in deconvolution.This parameter has two usages. When CUDNN is not used, it determines the effective batch size of the deconvolution kernel. When CUDNN is used, it controls the maximum temporary storage used for tuning the best CUDNN kernel when `limited_workspace` strategy is used.";
        no_bias: bool = "True", "Whether to disable bias parameter.";
        cudnn_tune: Option<&'a str> = "None" in ["fastest", "limited_workspace", "off"], "Whether to pick convolution algorithm by running performance test.";
        cudnn_off: bool = "False", "Turn off cudnn for this layer.";
        layout: Option<&'a str> = "None" in ["NCDHW", "NCHW", "NCW", "NDHWC", "NHWC"], "Set layout for input, output and weight. Empty for default layout, NCW for 1d, NCHW for 2d and NCDHW for 3d.NHWC and NDHWC are only supported on GPU.";
    }
}

/// A deconvolution call: the convolution whose data gradient it is, and the output shape.
struct Deconv {
    conv: Plan,
    out_shape: Vec<usize>,
    weight_shape: Vec<usize>,
}

fn deconv_plan(a: &Attrs, data: &[usize]) -> Result<Deconv> {
    let op = a.op;
    let p = DeconvParams::of(a);
    let nsp = p.kernel.len();
    if !(1..=3).contains(&nsp) {
        return Err(Error::value(format!("operator {op}: kernel {:?} must have 1, 2 or 3 entries", p.kernel)));
    }
    if data.len() != nsp + 2 {
        return Err(Error::value(format!(
            "operator {op}: data of shape {data:?} must be {}-D for a {nsp}-D kernel",
            nsp + 2
        )));
    }
    if let Some(layout) = p.layout.filter(|l| !l.starts_with("NC")) {
        return Err(Error::not_supported(format!("operator {op} with layout {layout} (channel-first layouts only)")));
    }
    let kernel = widen(op, "kernel", p.kernel, nsp, 1, 1)?;
    let stride = widen(op, "stride", p.stride, nsp, 1, 1)?;
    let dilate = widen(op, "dilate", p.dilate, nsp, 1, 1)?;
    let mut pad = widen(op, "pad", p.pad, nsp, 0, 0)?;
    let mut adj = widen(op, "adj", p.adj, nsp, 0, 0)?;
    let (f, g) = (p.num_filter, p.num_group);
    if f < 1 || g < 1 {
        return Err(Error::value(format!("operator {op}: num_filter ({f}) and num_group ({g}) must be positive")));
    }
    let (f, g) = (f as usize, g as usize);
    let (n, c) = (data[0], data[1]);
    if c % g != 0 || f % g != 0 {
        return Err(Error::value(format!(
            "operator {op}: channels ({c}) and num_filter ({f}) must be divisible by num_group ({g})"
        )));
    }
    let mut input = [1; 3];
    input[3 - nsp..].copy_from_slice(&data[2..]);
    // Output extents in u128 (no overflow); anything past isize::MAX is refused below.
    let span = |d: usize| dilate[d] as u128 * (kernel[d] as u128 - 1) + 1;
    let full_of = |d: usize| stride[d] as u128 * input[d].saturating_sub(1) as u128 + span(d);
    if p.target_shape.iter().any(|&t| t != 0) {
        let target = widen(op, "target_shape", p.target_shape, nsp, 1, 0)?;
        for d in 3 - nsp..3 {
            let full = full_of(d);
            if target[d] as u128 > full || full > isize::MAX as u128 {
                return Err(Error::value(format!(
                    "operator {op}: target_shape {:?} is too big for data {data:?}",
                    p.target_shape
                )));
            }
            let total = (full - target[d] as u128) as usize;
            adj[d] = total % 2;
            pad[d] = total.div_ceil(2);
        }
    }
    let mut output = [1; 3];
    for d in 0..3 {
        if adj[d] >= stride[d] && (d >= 3 - nsp) {
            return Err(Error::value(format!("operator {op}: adj {:?} must be smaller than stride", p.adj)));
        }
        let full = full_of(d) + adj[d] as u128;
        if full > isize::MAX as u128 / 8 {
            return Err(Error::value(format!("operator {op}: data {data:?} gives an output too large to allocate")));
        }
        let full = full as usize;
        if input[d] == 0 || full < pad[d].saturating_mul(2).saturating_add(1) {
            return Err(Error::value(format!(
                "operator {op}: data {data:?} with pad {:?} gives an empty output",
                &pad[3 - nsp..]
            )));
        }
        output[d] = full - 2 * pad[d];
    }
    // The convolution from the output back to the data.
    let conv = Plan::build(op, nsp, [n, f, c, g], output, kernel, stride, dilate, pad)?;
    if conv.output != input {
        return Err(Error::value(format!(
            "operator {op}: pad {:?} and adj {:?} do not invert the matching convolution for data {data:?}",
            &pad[3 - nsp..],
            &adj[3 - nsp..]
        )));
    }
    let mut out_shape = vec![n, f];
    out_shape.extend_from_slice(&output[3 - nsp..]);
    let mut weight_shape = vec![c, f / g];
    weight_shape.extend_from_slice(&kernel[3 - nsp..]);
    Ok(Deconv { conv, out_shape, weight_shape })
}

/// The deconvolution a bilinear `UpSampling` by `scale` is (stock's rule): a `2·scale −
/// scale % 2` kernel, stride `scale`, padding `⌈(scale − 1) / 2⌉`, one group per channel and
/// no bias, so `[N, C, H, W]` data and a `[C, 1, k, k]` weight give `[N, C, scale·H, scale·W]`.
pub(super) fn bilinear_upsampling(op: &'static str, scale: i64, num_filter: i64, workspace: i64) -> Result<Attrs> {
    let (k, pad) = (2 * scale - scale % 2, scale / 2);
    let (kernel, stride, pad) = (format!("({k}, {k})"), format!("({scale}, {scale})"), format!("({pad}, {pad})"));
    let (f, ws) = (num_filter.to_string(), workspace.to_string());
    let kv = [
        ("kernel", kernel.as_str()),
        ("stride", stride.as_str()),
        ("pad", pad.as_str()),
        ("num_filter", f.as_str()),
        ("num_group", f.as_str()),
        ("workspace", ws.as_str()),
        ("no_bias", "True"),
    ];
    Attrs::parse(op, DECONV_PARAMS, kv)
}

/// `bilinear_upsampling`'s weight shape for `channels` data channels.
pub(super) fn bilinear_weight_shape(scale: i64, channels: i64) -> Vec<i64> {
    let k = 2 * scale - scale % 2;
    vec![channels, 1, k, k]
}

fn deconv_inputs(a: &Attrs) -> usize {
    2 + !DeconvParams::of(a).no_bias as usize
}

pub(super) fn deconv_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let dt = super::common::floats_like_first(op, ins)?;
    let p = deconv_plan(a, &ins[0].shape)?;
    if ins[1].shape != p.weight_shape {
        return Err(Error::value(format!(
            "operator {op}: weight has shape {:?}, expected {:?}",
            ins[1].shape, p.weight_shape
        )));
    }
    let f = p.out_shape[1];
    if ins.len() > 2 && ins[2].shape != [f] {
        return Err(Error::value(format!("operator {op}: bias has shape {:?}, expected ({f},)", ins[2].shape)));
    }
    Ok(vec![Meta::new(p.out_shape, dt)])
}

/// Graph inference of the weight `(channels, num_filter / num_group, *kernel)` and the bias.
fn deconv_param_shapes(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let p = DeconvParams::of(a);
    if data.len() != p.kernel.len() + 2 {
        return Err(Error::mxnet(format!("operator {}: data must be {}-D, got {data:?}", a.op, p.kernel.len() + 2)));
    }
    let g = p.num_group.max(1);
    let mut weight = vec![data[1], p.num_filter / g];
    weight.extend_from_slice(p.kernel);
    Ok(vec![(1, weight), (2, vec![p.num_filter])])
}

/// Forward: per image and group, `col = W_gᵀ·x_g`, folded onto the output planes, plus bias.
fn forward_typed<T: GemmElem, R: Real>(p: &Plan, x: &[T], w: &[T], bias: Option<&[T]>, out: &mut [T]) {
    // In the convolution's terms: `p.f` = data channels, `p.c` = output channels.
    let (cg, fg, osz, isz, kdim) = (p.cg(), p.fg(), p.osz(), p.isz(), p.kdim());
    let mut col = vec![T::zero(); kdim * osz];
    for img in 0..p.n {
        for gi in 0..p.g {
            let xg = &x[(img * p.f + gi * fg) * osz..][..fg * osz];
            let wg = &w[gi * fg * kdim..][..fg * kdim];
            gemm(kdim, osz, fg, wg, true, xg, false, &mut col, false);
            col2im::<T, R>(p, &col, osz, &mut out[(img * p.c + gi * cg) * isz..][..cg * isz]);
        }
        if let Some(b) = bias {
            for (ch, plane) in out[img * p.c * isz..][..p.c * isz].chunks_exact_mut(isz).enumerate() {
                let bv = R::load(b[ch]);
                for v in plane {
                    *v = (R::load(*v) + bv).store();
                }
            }
        }
    }
}

pub(super) fn deconvolution(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let d = deconv_plan(a, &ins[0].shape)?;
    if outs[0].size() == 0 {
        return Ok(());
    }
    macro_rules! go {
        ($T:ty, $R:ty) => {
            forward_typed::<$T, $R>(
                &d.conv,
                ins[0].as_slice::<$T>(),
                ins[1].as_slice::<$T>(),
                ins.get(2).map(|b| b.as_slice::<$T>()),
                outs[0].as_mut::<$T>(),
            )
        };
    }
    match ins[0].dtype {
        DType::F32 => go!(f32, f32),
        DType::F64 => go!(f64, f64),
        DType::F16 => go!(f16, f32),
        other => return Err(Error::type_error(format!("operator {} does not support {}", a.op, other.name()))),
    }
    Ok(())
}

/// Backward: `(dY, data, weight[, bias]) -> (dData, dWeight[, dBias])`.
fn backward_typed<T: GemmElem, R: Real>(cx: &OpCtx, p: &Plan, ins: &[TBlob], outs: &mut [OutBlob]) {
    let (dy, x, w) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
    let (cg, fg, osz, isz, kdim) = (p.cg(), p.fg(), p.osz(), p.isz(), p.kdim());
    let want = |k: usize| outs.len() > k && cx.req[k] != Req::Null;
    let (want_dx, want_dw, want_db) = (want(0), want(1), want(2));
    let mut dw = vec![T::zero(); if want_dw { w.len() } else { 0 }];
    let mut dx = vec![T::zero(); if want_dx { x.len() } else { 0 }];
    let mut col = vec![T::zero(); kdim * osz];
    if want_dx || want_dw {
        for img in 0..p.n {
            for gi in 0..p.g {
                im2col(p, &dy[(img * p.c + gi * cg) * isz..][..cg * isz], &mut col, osz);
                let wg = &w[gi * fg * kdim..][..fg * kdim];
                let at = (img * p.f + gi * fg) * osz;
                if want_dx {
                    gemm(fg, osz, kdim, wg, false, &col, false, &mut dx[at..at + fg * osz], false);
                }
                if want_dw {
                    gemm(
                        fg,
                        kdim,
                        osz,
                        &x[at..at + fg * osz],
                        false,
                        &col,
                        true,
                        &mut dw[gi * fg * kdim..][..fg * kdim],
                        true,
                    );
                }
            }
        }
    }
    if want_dx {
        outs[0].as_mut::<T>().copy_from_slice(&dx);
    }
    if want_dw {
        outs[1].as_mut::<T>().copy_from_slice(&dw);
    }
    if want_db {
        let db = outs[2].as_mut::<T>();
        for (ch, o) in db.iter_mut().enumerate() {
            let mut acc = R::of(0.0);
            for img in 0..p.n {
                for &v in &dy[(img * p.c + ch) * isz..][..isz] {
                    acc = acc + R::load(v);
                }
            }
            *o = acc.store();
        }
    }
}

pub(super) fn deconvolution_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let d = deconv_plan(a, &ins[1].shape)?;
    match ins[1].dtype {
        DType::F32 => backward_typed::<f32, f32>(cx, &d.conv, ins, outs),
        DType::F64 => backward_typed::<f64, f64>(cx, &d.conv, ins, outs),
        DType::F16 => backward_typed::<f16, f32>(cx, &d.conv, ins, outs),
        other => return Err(Error::type_error(format!("operator {} does not support {}", a.op, other.name()))),
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "Deconvolution",
            Inputs::Leading(&["data", "weight", "bias"], deconv_inputs),
            Box::new(deconv_infer),
            Box::new(deconvolution),
        )
        .alias(&["_npx_deconvolution"])
        .params(DECONV_PARAMS)
        .param_shapes(deconv_param_shapes)
        .never_mirrored()
        .grad(Grad::Backward { op: "_backward_Deconvolution", inputs: true, outputs: false })
        .doc(
            "Computes 1D, 2D or 3D transposed convolution (aka fractionally strided convolution) of the input tensor.",
        ),
    );
    ops.push(OpDef::backward("_backward_Deconvolution", DECONV_PARAMS, Box::new(deconvolution_backward)));
}
