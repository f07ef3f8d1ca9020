//! Older layer and loss operators that MXNet 1.x models still use: `LRN` (local response
//! normalisation across channels), `SoftmaxActivation`, `Crop`, `SVMOutput`,
//! `softmax_cross_entropy`, `hard_sigmoid` and `IdentityAttachKLSparseReg` (the identity, whose
//! backward adds a KL sparseness penalty from a moving average of the activations it updates),
//! each with its backward operator.
//!
//! `LRN`, `SoftmaxActivation`, `Crop` and `IdentityAttachKLSparseReg` are float32-only as in stock 1.9.1 (its legacy
//! `real_t` kernels); the others take every float type, computing float16 in float32.
//! `SVMOutput` is an output layer like `SoftmaxOutput`: its forward is the identity and its
//! backward ignores the head gradient, giving the hinge-loss gradient for the labels.

use super::common::float32_only;
use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

fn four_d(op: &str, shape: &[usize]) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(shape).map_err(|_| {
        Error::value(format!("operator {op}: data must be 4-D (batch, channel, height, width), got {shape:?}"))
    })
}

// ---------------------------------------------------------------------------------------------
// LRN

op_params! {
    pub(super) struct LrnParams<'a> => LRN_PARAMS {
        alpha: f64 = "9.99999975e-05", "The variance scaling parameter :math:`\u{3b1}` in the LRN expression.";
        beta: f64 = "0.75", "The power parameter :math:`\u{3b2}` in the LRN expression.";
        knorm: f64 = "2", "The parameter :math:`k` in the LRN expression.";
        nsize: i64 = required, "normalization window width in elements.";
    }
}

fn lrn_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    float32_only(a.op, ins)?;
    four_d(a.op, &ins[0].shape)?;
    let n = LrnParams::of(a).nsize;
    if n < 1 {
        return Err(Error::value(format!("operator {}: nsize must be positive, got {n}", a.op)));
    }
    Ok(vec![ins[0].clone(), ins[0].clone()])
}

/// `out[c] = Σ_{|c' - c| ≤ half} v[c']` over the channels of each (image, pixel), `v` given per
/// channel plane of `plane` elements. The window is `half = (nsize - 1) / 2` channels each side,
/// also for an even nsize (stock's oneDNN kernel: nsize 4 sums 3 channels).
fn channel_window_sum(v: &[f32], out: &mut [f32], c: usize, plane: usize, half: usize) {
    for (img_in, img_out) in v.chunks(c * plane).zip(out.chunks_mut(c * plane)) {
        for ch in 0..c {
            let (lo, hi) = (ch.saturating_sub(half), (ch + half).min(c - 1));
            let o = &mut img_out[ch * plane..(ch + 1) * plane];
            o.fill(0.0);
            for src in lo..=hi {
                for (ov, &x) in o.iter_mut().zip(&img_in[src * plane..(src + 1) * plane]) {
                    *ov += x;
                }
            }
        }
    }
}

fn lrn(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LrnParams::of(cx.attrs);
    let [_, c, h, w] = four_d(cx.attrs.op, &ins[0].shape)?;
    let x = ins[0].as_slice::<f32>();
    let salpha = p.alpha as f32 / p.nsize as f32;
    let (knorm, beta) = (p.knorm as f32, p.beta as f32);
    let sq: Vec<f32> = x.iter().map(|v| v * v).collect();
    let mut norm = vec![0.0f32; x.len()];
    channel_window_sum(&sq, &mut norm, c, h * w, (p.nsize as usize - 1) / 2);
    norm.iter_mut().for_each(|v| *v = *v * salpha + knorm);
    let out = outs[0].as_mut::<f32>();
    par_for_mut(out, 1, Cost(20.0), DType::F32, |r, o| {
        for (i, ov) in r.zip(o) {
            *ov = x[i] * norm[i].powf(-beta);
        }
    });
    if outs.len() > 1 && cx.req.get(1).is_some_and(|r| *r != Req::Null) {
        outs[1].as_mut::<f32>().copy_from_slice(&norm);
    }
    Ok(())
}

/// `_backward_LRN(dout, data, out, norm) -> ddata`.
fn lrn_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LrnParams::of(cx.attrs);
    let (g, x, norm) = (ins[0].as_slice::<f32>(), ins[1].as_slice::<f32>(), ins[ins.len() - 1].as_slice::<f32>());
    let [_, c, h, w] = four_d(cx.attrs.op, &ins[1].shape)?;
    let salpha = p.alpha as f32 / p.nsize as f32;
    let beta = p.beta as f32;
    let t: Vec<f32> = (0..x.len()).map(|i| g[i] * x[i] * norm[i].powf(-beta - 1.0)).collect();
    let mut pooled = vec![0.0f32; x.len()];
    channel_window_sum(&t, &mut pooled, c, h * w, (p.nsize as usize - 1) / 2);
    for (i, o) in outs[0].as_mut::<f32>().iter_mut().enumerate() {
        *o = g[i] * norm[i].powf(-beta) + (-2.0 * beta * salpha) * pooled[i] * x[i];
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// SoftmaxActivation

op_params! {
    pub(super) struct SoftmaxActParams<'a> => SOFTMAX_ACT_PARAMS {
        mode: &'a str = "instance" in ["channel", "instance"], "Specifies how to compute the softmax. If set to ``instance``, it computes softmax for each instance. If set to ``channel``, It computes cross channel softmax for each position of each instance.";
    }
}

/// (instances, classes, positions): softmax over the middle axis. Instance mode is a softmax
/// over the last axis (stock's forward flattens to 2-D; its backward assumes axis 1, which is
/// the same axis for 2-D data only: ours is the gradient of the forward for every shape).
fn softmax_act_dims(a: &Attrs, shape: &[usize]) -> Result<(usize, usize, usize)> {
    let n = shape.first().copied().unwrap_or(1);
    let total: usize = shape.iter().product();
    if SoftmaxActParams::of(a).mode == "channel" {
        if shape.len() < 3 {
            return Err(Error::value(format!(
                "operator {}: mode=channel needs at least 3 dimensions, got {shape:?}",
                a.op
            )));
        }
        Ok((n, shape[1], total / n.max(1) / shape[1].max(1)))
    } else {
        // Stock flattens to (everything but the last axis, last axis).
        let k = shape.last().copied().unwrap_or(1);
        Ok((total / k.max(1), k, 1))
    }
}

fn softmax_act_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    float32_only(a.op, ins)?;
    softmax_act_dims(a, &ins[0].shape)?;
    Ok(vec![ins[0].clone()])
}

fn softmax_act(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (_, k, rest) = softmax_act_dims(cx.attrs, &ins[0].shape)?;
    let x = ins[0].as_slice::<f32>();
    let unit = k * rest;
    par_for_mut(outs[0].as_mut::<f32>(), unit.max(1), Cost(unit as f64 * 8.0), DType::F32, |r, o| {
        for (b, ob) in r.zip(o.chunks_mut(unit.max(1))) {
            let xb = &x[b * unit..(b + 1) * unit];
            for j in 0..rest {
                let max = (0..k).map(|i| xb[i * rest + j]).fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for i in 0..k {
                    let e = (xb[i * rest + j] - max).exp();
                    ob[i * rest + j] = e;
                    sum += e;
                }
                for i in 0..k {
                    ob[i * rest + j] /= sum;
                }
            }
        }
    });
    Ok(())
}

/// `_backward_SoftmaxActivation(dout, out) -> ddata = y·(g - Σ g·y)` per softmax.
fn softmax_act_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (g, y) = (ins[0].as_slice::<f32>(), ins[1].as_slice::<f32>());
    let (_, k, rest) = softmax_act_dims(cx.attrs, &ins[1].shape)?;
    let unit = (k * rest).max(1);
    par_for_mut(outs[0].as_mut::<f32>(), unit, Cost(unit as f64 * 4.0), DType::F32, |r, o| {
        for (b, ob) in r.zip(o.chunks_mut(unit)) {
            let (gb, yb) = (&g[b * unit..], &y[b * unit..]);
            for j in 0..rest {
                let dot: f32 = (0..k).map(|i| gb[i * rest + j] * yb[i * rest + j]).sum();
                for i in 0..k {
                    ob[i * rest + j] = yb[i * rest + j] * (gb[i * rest + j] - dot);
                }
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Crop

op_params! {
    pub(super) struct CropParams<'a> => CROP_PARAMS {
        num_args: i64 = required, "Number of inputs for crop, if equals one, then we will use the h_wfor crop height and width, else if equals two, then we will use the heightand width of the second input symbol, we name crop_like here";
        offset: &'a [i64] = "(0,0)", "crop offset coordinate: (y, x)";
        h_w: &'a [i64] = "(0,0)", "crop height and width: (h, w)";
        center_crop: bool = "False", "If set to true, then it will use be the center_crop,or it will crop using the shape of crop_like";
    }
}

/// The crop's (output height, output width, offset y, offset x) for data `d` and inputs `ins`.
fn crop_plan(a: &Attrs, ins: &[Meta]) -> Result<(usize, usize, usize, usize)> {
    let op = a.op;
    let p = CropParams::of(a);
    let [_, _, h, w] = four_d(op, &ins[0].shape)?;
    let (oh, ow) = if ins.len() > 1 {
        let like = &ins[1].shape;
        if like.len() != 4 {
            return Err(Error::value(format!("operator {op}: crop_like must be 4-D, got {like:?}")));
        }
        (like[2], like[3])
    } else {
        match p.h_w {
            &[a_, b_] if a_ > 0 && b_ > 0 => (a_ as usize, b_ as usize),
            hw => return Err(Error::value(format!("operator {op}: h_w must be two positive sizes, got {hw:?}"))),
        }
    };
    if oh > h || ow > w {
        return Err(Error::value(format!("operator {op}: the crop ({oh}, {ow}) is larger than the data ({h}, {w})")));
    }
    let (oy, ox) = if p.center_crop {
        ((h - oh) / 2, (w - ow) / 2)
    } else {
        match p.offset {
            &[y, x] if y >= 0 && x >= 0 && y as usize <= h - oh && x as usize <= w - ow => (y as usize, x as usize),
            off => {
                return Err(Error::value(format!(
                    "operator {op}: offset {off:?} must be (y, x) with 0 <= y <= {} and 0 <= x <= {}",
                    h - oh,
                    w - ow
                )))
            }
        }
    };
    Ok((oh, ow, oy, ox))
}

fn crop_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    float32_only(a.op, ins)?;
    if !(1..=2).contains(&ins.len()) {
        return Err(Error::value(format!("operator {}: num_args must be 1 or 2, got {}", a.op, ins.len())));
    }
    let (oh, ow, _, _) = crop_plan(a, ins)?;
    let s = &ins[0].shape;
    Ok(vec![Meta::new(vec![s[0], s[1], oh, ow], DType::F32)])
}

fn metas(ins: &[TBlob]) -> Vec<Meta> {
    ins.iter().map(|b| Meta::new(b.shape.to_vec(), b.dtype)).collect()
}

fn crop(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (oh, ow, oy, ox) = crop_plan(cx.attrs, &metas(ins))?;
    let (h, w) = (ins[0].shape[2], ins[0].shape[3]);
    let x = ins[0].as_slice::<f32>();
    par_for_mut(outs[0].as_mut::<f32>(), (oh * ow).max(1), Cost((oh * ow) as f64), DType::F32, |r, o| {
        for (plane, op) in r.zip(o.chunks_mut((oh * ow).max(1))) {
            for (y, row) in op.chunks_mut(ow.max(1)).enumerate() {
                let src = plane * h * w + (y + oy) * w + ox;
                row.copy_from_slice(&x[src..src + ow]);
            }
        }
    });
    Ok(())
}

/// `_backward_Crop(dout, data[, crop_like]) -> (ddata[, 0])`: the gradient in the cropped
/// window, zero elsewhere.
fn crop_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (oh, ow, oy, ox) = crop_plan(cx.attrs, &metas(&ins[1..]))?;
    let (h, w) = (ins[1].shape[2], ins[1].shape[3]);
    let g = ins[0].as_slice::<f32>();
    if cx.req[0] != Req::Null {
        par_for_mut(outs[0].as_mut::<f32>(), (h * w).max(1), Cost((h * w) as f64), DType::F32, |r, o| {
            for (plane, dp) in r.zip(o.chunks_mut((h * w).max(1))) {
                dp.fill(0.0);
                for y in 0..oh {
                    let dst = (y + oy) * w + ox;
                    dp[dst..dst + ow].copy_from_slice(&g[(plane * oh + y) * ow..(plane * oh + y + 1) * ow]);
                }
            }
        });
    }
    if outs.len() > 1 && cx.req[1] != Req::Null {
        outs[1].as_mut::<f32>().fill(0.0);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// SVMOutput

op_params! {
    pub(super) struct SvmParams<'a> => SVM_PARAMS {
        margin: f64 = "1", "The loss function penalizes outputs that lie outside this margin. Default margin is 1.";
        regularization_coefficient: f64 = "1", "Regularization parameter for the SVM. This balances the tradeoff between coefficient size and error.";
        use_linear: bool = "False", "Whether to use L1-SVM objective. L2-SVM objective is used by default.";
    }
}

fn svm_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    super::nn::float_only(a.op, ins[0].dtype)?;
    let d = &ins[0].shape;
    if d.is_empty() || ins[1].shape[..] != d[..d.len() - 1] {
        return Err(Error::value(format!(
            "operator {}: label must have the data's shape without its last axis ({:?}), got {:?}",
            a.op,
            d.get(..d.len().saturating_sub(1)).unwrap_or(&[]),
            ins[1].shape
        )));
    }
    if ins[1].dtype != ins[0].dtype {
        return Err(Error::type_error(format!("operator {}: label must have the data's dtype", a.op)));
    }
    Ok(vec![ins[0].clone()])
}

fn svm_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, _R => {
        outs[0].as_mut::<T>().copy_from_slice(ins[0].as_slice::<T>());
    });
    Ok(())
}

/// `_backward_SVMOutput(dout, data, label) -> (ddata, 0)`: the L1- or L2-SVM hinge gradient of
/// each row for its label (the head gradient is not used, as in stock).
fn svm_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = SvmParams::of(cx.attrs);
    let (x, label) = (&ins[1], &ins[2]);
    let k = x.shape.last().copied().unwrap_or(1).max(1);
    dispatch_real!(x.dtype, cx.attrs.op, T, R => {
        let (xs, ls) = (x.as_slice::<T>(), label.as_slice::<T>());
        let (margin, reg) = (R::of(p.margin as f32 as f64), R::of(p.regularization_coefficient as f32 as f64));
        let (zero, two) = (R::of(0.0), R::of(2.0));
        let d = outs[0].as_mut::<T>();
        for ((row, drow), l) in xs.chunks(k).zip(d.chunks_mut(k)).zip(ls) {
            let target = R::load(*l).f64() as i64;
            for (j, (v, o)) in row.iter().zip(drow.iter_mut()).enumerate() {
                let v = R::load(*v);
                let g = match (j as i64 == target, p.use_linear) {
                    (true, true) => if margin > v { -reg } else { zero },
                    (false, true) => if margin > -v { reg } else { zero },
                    (true, false) => -reg * if margin > v { two * (margin - v) } else { zero },
                    (false, false) => -reg * if margin > -v { -two * (margin + v) } else { zero },
                };
                *o = g.store();
            }
        }
        if outs.len() > 1 && cx.req[1] != Req::Null {
            outs[1].as_mut::<T>().fill(R::of(0.0).store());
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// softmax_cross_entropy

fn sce_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    super::nn::float_only(a.op, ins[0].dtype)?;
    let (d, l) = (&ins[0].shape, &ins[1].shape);
    if d.len() != 2 || l.len() != 1 || l[0] != d[0] {
        return Err(Error::value(format!(
            "operator {}: data must be (batch, classes) and label (batch,), got {d:?} and {l:?}",
            a.op
        )));
    }
    if ins[1].dtype != ins[0].dtype {
        return Err(Error::type_error(format!("operator {}: label must have the data's dtype", a.op)));
    }
    Ok(vec![Meta::new(vec![1], ins[0].dtype)])
}

/// Row `row`'s softmax into `out`.
fn softmax_row<R: Real>(row: &[R], out: &mut [R]) {
    let max = row.iter().copied().fold(row[0], |m, v| if v > m { v } else { m });
    let mut sum = R::of(0.0);
    for (o, &v) in out.iter_mut().zip(row) {
        *o = (v - max).exp();
        sum = sum + *o;
    }
    out.iter_mut().for_each(|o| *o = *o / sum);
}

fn label_index(op: &str, v: f64, k: usize) -> Result<usize> {
    if v >= 0.0 && (v as usize) < k {
        Ok(v as usize)
    } else {
        Err(Error::value(format!("operator {op}: label {v} is outside [0, {k})")))
    }
}

fn sce_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let op = cx.attrs.op;
    let k = ins[0].shape[1];
    dispatch_real!(ins[0].dtype, op, T, R => {
        let x: Vec<R> = ins[0].as_slice::<T>().iter().map(|&v| R::load(v)).collect();
        let mut sm = vec![R::of(0.0); k];
        let mut total = R::of(0.0);
        for (row, l) in x.chunks(k.max(1)).zip(ins[1].as_slice::<T>()) {
            if k == 0 {
                break;
            }
            let j = label_index(op, R::load(*l).f64(), k)?;
            softmax_row(row, &mut sm);
            let p = if sm[j] > R::of(1e-8f32 as f64) { sm[j] } else { R::of(1e-8f32 as f64) };
            total += -p.ln();
        }
        outs[0].as_mut::<T>()[0] = total.store();
    });
    Ok(())
}

/// `_backward_softmax_cross_entropy(dout, data, label) -> (ddata, dlabel)`: (softmax − one-hot)
/// times the head gradient; the label has none (stock refuses to compute it).
fn sce_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let op = cx.attrs.op;
    if cx.req.get(1).is_some_and(|r| *r != Req::Null) {
        return Err(Error::mxnet(format!("operator {op}: cannot take the gradient with respect to the label")));
    }
    let k = ins[1].shape[1].max(1);
    dispatch_real!(ins[1].dtype, op, T, R => {
        let scale = R::load(ins[0].as_slice::<T>()[0]);
        let x: Vec<R> = ins[1].as_slice::<T>().iter().map(|&v| R::load(v)).collect();
        let mut sm = vec![R::of(0.0); k];
        let d = outs[0].as_mut::<T>();
        for ((row, l), drow) in x.chunks(k).zip(ins[2].as_slice::<T>()).zip(d.chunks_mut(k)) {
            let j = label_index(op, R::load(*l).f64(), k)?;
            softmax_row(row, &mut sm);
            sm[j] -= R::of(1.0);
            for (o, &v) in drow.iter_mut().zip(&sm) {
                *o = (scale * v).store();
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// hard_sigmoid

op_params! {
    pub(super) struct HardSigmoidParams<'a> => HARD_SIGMOID_PARAMS {
        alpha: f64 = "0.200000003", "Slope of hard sigmoid";
        beta: f64 = "0.5", "Bias of hard sigmoid.";
    }
}

fn hard_sigmoid(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = HardSigmoidParams::of(cx.attrs);
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let x = ins[0].as_slice::<T>();
        let (alpha, beta) = (R::of(p.alpha as f32 as f64), R::of(p.beta as f32 as f64));
        let (zero, one) = (R::of(0.0), R::of(1.0));
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost(1.0), T::DTYPE, |r, o| {
            for (i, ov) in r.zip(o) {
                let v = alpha * R::load(x[i]) + beta;
                *ov = (if v > one { one } else if v < zero { zero } else { v }).store();
            }
        });
    });
    Ok(())
}

/// `_backward_hard_sigmoid(dout, data) -> ddata`: alpha where the line is strictly inside (0, 1).
fn hard_sigmoid_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = HardSigmoidParams::of(cx.attrs);
    dispatch_real!(ins[1].dtype, cx.attrs.op, T, R => {
        let (g, x) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        let (alpha, beta) = (R::of(p.alpha as f32 as f64), R::of(p.beta as f32 as f64));
        let (zero, one) = (R::of(0.0), R::of(1.0));
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost(1.0), T::DTYPE, |r, o| {
            for (i, ov) in r.zip(o) {
                let v = alpha * R::load(x[i]) + beta;
                *ov = (if v > zero && v < one { R::load(g[i]) * alpha } else { zero }).store();
            }
        });
    });
    Ok(())
}

fn one(_: &Attrs) -> usize {
    1
}
fn two(_: &Attrs) -> usize {
    2
}

// ---- IdentityAttachKLSparseReg ----

op_params! {
    /// `IdentityAttachKLSparseReg`'s parameters.
    struct KlRegParams<'a> => KL_REG_PARAMS {
        sparseness_target: f64 = "0.1", "The sparseness target";
        penalty: f64 = "0.001", "The tradeoff parameter for the sparseness penalty";
        momentum: f64 = "0.9", "The momentum for running average";
    }
}

const KL_REG: &str = "IdentityAttachKLSparseReg";

/// Rows are the first axis, columns everything after it; `moving_avg` has one value per
/// column.
fn kl_reg_infer(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (d, m) = (&ins[0], &ins[1]);
    float32_only(KL_REG, ins)?;
    let cols: usize = d.shape.iter().skip(1).product();
    if d.shape.len() < 2 || m.shape != [cols] || m.dtype != d.dtype {
        return Err(Error::value(format!(
            "operator {KL_REG}: data must be at least 2-D and moving_avg a float32 vector of its {cols} columns, got {:?} and {:?}",
            d.shape, m.shape
        )));
    }
    Ok(vec![d.clone()])
}

fn kl_reg_param_shapes(_: &Attrs, data: &[i64], n: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    Ok(if n == 2 && data.len() >= 2 { vec![(1, vec![data[1..].iter().product()])] } else { vec![] })
}

fn kl_reg(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    outs[0].copy_from(&ins[0]);
    Ok(())
}

/// Inputs (output gradient, data, moving_avg; moving_avg is writable blob 2): the moving
/// average takes this batch's column means, and the gradient gains
/// `penalty * (-target / avg + (1 - target) / (1 - avg))`.
fn kl_reg_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = KlRegParams::of(cx.attrs);
    let (dy, x) = (ins[0].as_slice::<f32>(), ins[1].as_slice::<f32>());
    let cols = outs[2].size();
    let rows = x.len() / cols.max(1);
    let (m, t, pen) = (p.momentum as f32, p.sparseness_target as f32, p.penalty as f32);
    let mut avg = vec![0.0f32; cols];
    for row in x.chunks(cols.max(1)) {
        for (a, &v) in avg.iter_mut().zip(row) {
            *a += v;
        }
    }
    let mavg = outs[2].as_mut::<f32>();
    for (ma, a) in mavg.iter_mut().zip(&avg) {
        *ma = m * *ma + (1.0 - m) * (a / rows as f32);
    }
    let extra: Vec<f32> = mavg.iter().map(|&a| pen * (-t / a + (1.0 - t) / (1.0 - a))).collect();
    if cx.req[0] != Req::Null {
        for (i, (o, &g)) in outs[0].as_mut::<f32>().iter_mut().zip(dy).enumerate() {
            *o = g + extra[i % cols.max(1)];
        }
    }
    if cx.req[1] != Req::Null {
        outs[1].as_bytes_mut().fill(0);
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(KL_REG, Inputs::Fixed(&["data", "moving_avg"]), Box::new(kl_reg_infer), Box::new(kl_reg))
            .params(KL_REG_PARAMS)
            .listed_inputs(&["data"])
            .param_shapes(kl_reg_param_shapes)
            .input_inits(&[(1, "[\"zero\", {}]")])
            .never_mirrored()
            .mutates(&[1])
            .grad(Grad::Backward { op: "_backward_IdentityAttachKLSparseReg", inputs: true, outputs: false })
            .doc("Apply a sparse regularization to the output a sigmoid activation function."),
    );
    ops.push(
        OpDef::backward("_backward_IdentityAttachKLSparseReg", KL_REG_PARAMS, Box::new(kl_reg_backward))
            .mutates_from_end(&[1]),
    );
    ops.push(
        OpDef::new("LRN", Inputs::Fixed(&["data"]), Box::new(lrn_infer), Box::new(lrn))
            .params(LRN_PARAMS)
            .outputs(two, one)
            .output_names(&["output", "tmp_norm"])
            .grad(Grad::Backward { op: "_backward_LRN", inputs: true, outputs: true })
            .doc("Applies local response normalization to the input: out = x * (knorm + alpha / nsize * sum of x^2 over nsize neighbouring channels)^(-beta)."),
    );
    ops.push(OpDef::backward("_backward_LRN", LRN_PARAMS, Box::new(lrn_backward)));
    ops.push(
        OpDef::new("SoftmaxActivation", Inputs::Fixed(&["data"]), Box::new(softmax_act_infer), Box::new(softmax_act))
            .unnamed_inputs()
            .params(SOFTMAX_ACT_PARAMS)
            .grad(Grad::Backward { op: "_backward_SoftmaxActivation", inputs: false, outputs: true })
            .doc("Applies softmax activation to input. This is intended for internal layers (instance: over the last axis; channel: over axis 1 at every position)."),
    );
    ops.push(OpDef::backward("_backward_SoftmaxActivation", SOFTMAX_ACT_PARAMS, Box::new(softmax_act_backward)));
    ops.push(
        OpDef::new("Crop", Inputs::Variadic("data"), Box::new(crop_infer), Box::new(crop))
            .params(CROP_PARAMS)
            .num_args_key("num_args")
            .grad(Grad::Backward { op: "_backward_Crop", inputs: true, outputs: false })
            .doc("Crop the 2nd and 3rd dim of input data, with the corresponding size of h_w or with width and height of the second input symbol, i.e., with one input, we need h_w to specify the crop height and width, otherwise the second input symbol's size will be used"),
    );
    ops.push(OpDef::backward("_backward_Crop", CROP_PARAMS, Box::new(crop_backward)));
    ops.push(
        OpDef::new("SVMOutput", Inputs::Fixed(&["data", "label"]), Box::new(svm_infer), Box::new(svm_forward))
            .params(SVM_PARAMS)
            .param_shapes(|_, data, _| Ok(if data.len() < 2 { vec![] } else { vec![(1, data[..data.len() - 1].to_vec())] }))
            .grad(Grad::Backward { op: "_backward_SVMOutput", inputs: true, outputs: false })
            .doc("Computes support vector machine based transformation of the input: the identity forward, the L2-SVM (or with use_linear L1-SVM) hinge-loss gradient backward."),
    );
    ops.push(OpDef::backward("_backward_SVMOutput", SVM_PARAMS, Box::new(svm_backward)));
    ops.push(
        OpDef::new("softmax_cross_entropy", Inputs::Fixed(&["data", "label"]), Box::new(sce_infer), Box::new(sce_forward))
            .grad(Grad::Backward { op: "_backward_softmax_cross_entropy", inputs: true, outputs: false })
            .doc("Calculate cross entropy of softmax output and one-hot label: the sum over the batch of -log(softmax(data)[label]), shape (1,)."),
    );
    ops.push(OpDef::backward("_backward_softmax_cross_entropy", &[], Box::new(sce_backward)));
    ops.push(
        OpDef::new(
            "hard_sigmoid",
            Inputs::Fixed(&["data"]),
            Box::new(super::nn::infer_float_like_first),
            Box::new(hard_sigmoid),
        )
        .params(HARD_SIGMOID_PARAMS)
        .elementwise_shape()
        .grad(Grad::Backward { op: "_backward_hard_sigmoid", inputs: true, outputs: false })
        .doc("Computes hard sigmoid of x element-wise: max(0, min(1, alpha * x + beta))."),
    );
    ops.push(OpDef::backward("_backward_hard_sigmoid", HARD_SIGMOID_PARAMS, Box::new(hard_sigmoid_backward)));
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    #[test]
    fn gradients_match_finite_differences() {
        // (Finite differences need float64: the float32-only operators are compared with stock
        // in tests/python/test_ops_differential.py.)
        let x = values(2 * 3 * 4, -2.0, 2.0, 11);
        check("hard_sigmoid", &[("alpha", "0.3"), ("beta", "0.4")], &[(&[2, 3, 4], x)], &[]);
    }
}
