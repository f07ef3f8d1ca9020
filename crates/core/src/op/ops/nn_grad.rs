//! Backward operators of the neural-network family (see `op::grad` for the convention).
//!
//! Owns `_backward_Activation`, `_backward_LeakyReLU`, `_backward_softmax`,
//! `_backward_log_softmax`, `_backward_softmin`, `_backward_SoftmaxOutput`,
//! `_backward_Dropout`, `_backward_BatchNorm`, `_backward_BatchNormWithReLU`, `_backward_LayerNorm` and `_backward_Pooling`.
//! Kernels compute float16 in float32 and float32/float64 natively, like the forward ones;
//! elementwise and per-plane loops run on the kernel pool.

use super::common::norm_axis;
use super::nn::{
    channel_perms, dispatch_real, erf, permuted, pool_kind, pool_plan, read_f64, read_out_f64, softmax_output_dims,
    split_at_axis, write_f64, PoolKind, PoolPlan, Real, ACT_PARAMS, BN_PARAMS, DROPOUT_PARAMS, LEAKY_PARAMS, LN_PARAMS,
    POOL_PARAMS, SELU_ALPHA, SELU_LAMBDA, SOFTMAX_OUTPUT_PARAMS, SOFTMAX_PARAMS,
};
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::grad::Composed;
use crate::op::kernel::{par_for_mut, par_for_zip, Cost};
use crate::op::ops::nn::ActParams;
use crate::op::ops::nn::BnParams;
use crate::op::ops::nn::LeakyParams;
use crate::op::ops::nn::LnParams;
use crate::op::ops::nn::SoftmaxOutputParams;
use crate::op::ops::nn::SoftmaxParams;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{ComputeFn, Grad, Meta, OpCtx, OpDef, Req};

/// Write zeros into output `i` when it is requested (gradients of labels, lengths, aux states).
fn zero_if_requested(cx: &OpCtx, outs: &mut [OutBlob], i: usize) {
    if i < outs.len() && cx.req[i] != Req::Null {
        let o = &mut outs[i];
        crate::dispatch_all!(o.dtype, T => o.as_mut::<T>().fill(T::zero()));
    }
}

/// `out[i] = f(a[i], b[i], c[i])` over the kernel pool (`c` may be empty when unused).
fn map3<T: Elem, R: Real>(
    a: &[T],
    b: &[T],
    c: &[T],
    out: &mut OutBlob,
    cost: Cost,
    f: impl Fn(R, R, R) -> R + Sync + Send,
) {
    par_for_mut(out.as_mut::<T>(), 1, cost, T::DTYPE, |r, o| {
        let (a, b) = (&a[r.clone()], &b[r.clone()]);
        if c.is_empty() {
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = f(R::load(a), R::load(b), R::of(0.0)).store();
            }
        } else {
            for (((o, &a), &b), &c) in o.iter_mut().zip(a).zip(b).zip(&c[r]) {
                *o = f(R::load(a), R::load(b), R::load(c)).store();
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Activation, LeakyReLU

/// `_backward_Activation(dy, y) -> dx`: every activation's derivative is a function of its
/// output (softsign's 1/(1+|x|)² is (1-|y|)²), so autograd keeps only the output and the
/// input can be freed or overwritten in place.
fn activation_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (g, y) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        let (zero, one) = (R::of(0.0), R::of(1.0));
        match ActParams::of(a).act_type {
            "relu" => map3::<T, R>(g, y, &[], &mut outs[0], Cost::CHEAP, |g, y, _| if y > zero { g } else { zero }),
            "sigmoid" => map3::<T, R>(g, y, &[], &mut outs[0], Cost::CHEAP, |g, y, _| g * y * (one - y)),
            "tanh" => map3::<T, R>(g, y, &[], &mut outs[0], Cost::CHEAP, |g, y, _| g * (one - y * y)),
            "softrelu" => map3::<T, R>(g, y, &[], &mut outs[0], Cost::MATH, |g, y, _| g * (one - (-y).exp())),
            _ => map3::<T, R>(g, y, &[], &mut outs[0], Cost::CHEAP, |g, y, _| {
                let d = one - y.abs();
                g * d * d
            }),
        }
    });
    Ok(())
}

/// `_backward_LeakyReLU(dy, x[, gamma], y[, slopes]) -> (dx[, dgamma])`.
fn leaky_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let params = LeakyParams::of(a);
    let kind = params.act_type;
    let slope = params.slope;
    let (g, x) = (&ins[0], &ins[1]);
    if kind == "prelu" {
        let gamma = read_f64(a.op, &ins[2])?;
        let layout = super::nn::PreluLayout::new(a.op, &x.shape, &ins[2].shape)?;
        let inner = layout.inner;
        let blocks = x.size().checked_div(inner).unwrap_or(0);
        let ch = |b: usize| layout.gamma_of(b);
        dispatch_real!(x.dtype, a.op, T, R => {
            let (gs, xs) = (g.as_slice::<T>(), x.as_slice::<T>());
            if cx.req[0] != Req::Null {
                par_for_mut(outs[0].as_mut::<T>(), inner, Cost(inner as f64 * 0.3), T::DTYPE, |r, part| {
                    for (b, ob) in r.zip(part.chunks_mut(inner.max(1))) {
                        let gm = R::of(gamma[ch(b)]);
                        for ((o, &gv), &xv) in ob.iter_mut().zip(&gs[b * inner..(b + 1) * inner]).zip(&xs[b * inner..(b + 1) * inner]) {
                            *o = if R::load(xv) > R::of(0.0) { gv } else { (gm * R::load(gv)).store() };
                        }
                    }
                });
            }
            if cx.req[1] != Req::Null {
                let mut dg = vec![0.0f64; gamma.len()];
                for b in 0..blocks {
                    let s: f64 = gs[b * inner..(b + 1) * inner]
                        .iter()
                        .zip(&xs[b * inner..(b + 1) * inner])
                        .map(|(gv, xv)| if xv.to_f64() > 0.0 { 0.0 } else { gv.to_f64() * xv.to_f64() })
                        .sum();
                    dg[ch(b)] += s;
                }
                write_f64(a.op, &mut outs[1], &dg)?;
            }
        });
        return Ok(());
    }
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    dispatch_real!(x.dtype, a.op, T, R => {
        let (gs, xs, ys) = (g.as_slice::<T>(), x.as_slice::<T>(), ins[2].as_slice::<T>());
        let (zero, one, s) = (R::of(0.0), R::of(1.0), R::of(slope));
        let o = &mut outs[0];
        match kind {
            "leaky" => map3::<T, R>(gs, xs, &[], o, Cost::CHEAP, |g, x, _| if x > zero { g } else { s * g }),
            "elu" => map3::<T, R>(gs, xs, ys, o, Cost::CHEAP, |g, x, y| if x > zero { g } else { g * (y + s) }),
            "selu" => {
                let (l, la) = (R::of(SELU_LAMBDA), R::of(SELU_LAMBDA * SELU_ALPHA));
                map3::<T, R>(gs, xs, ys, o, Cost::CHEAP, |g, x, y| if x > zero { l * g } else { g * (y + la) })
            }
            "rrelu" => {
                let m = ins[3].as_slice::<T>();
                map3::<T, R>(gs, xs, m, o, Cost::CHEAP, |g, x, m| if x > zero { g } else { m * g })
            }
            _ => {
                let (h, k) = (R::of(std::f64::consts::FRAC_1_SQRT_2), R::of(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2));
                map3::<T, R>(gs, xs, &[], o, Cost::MATH, |g, x, _| {
                    g * (R::of(0.5) * (one + erf(x * h)) + x * k * (-(x * x) * R::of(0.5)).exp())
                })
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// softmax, log_softmax, softmin

/// Gradient of a softmax over the middle axis of (outer, len, inner): `scale` is the input's
/// factor (±1/temperature); `lengths` (log_softmax only) masks positions at or after the length.
#[allow(clippy::too_many_arguments)]
fn softmax_grad<T: Elem, R: Real>(
    g: &[T],
    y: &[T],
    dx: &mut [T],
    (outer, len, inner): (usize, usize, usize),
    log: bool,
    scale: f64,
    lengths: Option<&[f64]>,
) {
    if len == 0 || outer == 0 || inner == 0 {
        return;
    }
    let sc = R::of(scale);
    let block = len * inner;
    par_for_mut(dx, block, Cost(block as f64 * if log { 8.0 } else { 1.5 }), T::DTYPE, |r, part| {
        let mut acc = vec![R::of(0.0); inner];
        for (b, ob) in r.zip(part.chunks_mut(block.max(1))) {
            let (gb, yb) = (&g[b * block..(b + 1) * block], &y[b * block..(b + 1) * block]);
            if let Some(lens) = lengths {
                for i in 0..inner {
                    let l = (lens[b * inner + i].max(0.0) as usize).min(len);
                    let mut s = R::of(0.0);
                    for j in 0..l {
                        s = s + R::load(gb[j * inner + i]);
                    }
                    for j in 0..len {
                        let at = j * inner + i;
                        ob[at] = if j < l {
                            (sc * (R::load(gb[at]) - R::load(yb[at]).exp() * s)).store()
                        } else {
                            T::zero()
                        };
                    }
                }
                continue;
            }
            acc.iter_mut().for_each(|a| *a = R::of(0.0));
            for (grow, yrow) in gb.chunks_exact(inner).zip(yb.chunks_exact(inner)) {
                for ((a, &gv), &yv) in acc.iter_mut().zip(grow).zip(yrow) {
                    *a = *a + if log { R::load(gv) } else { R::load(gv) * R::load(yv) };
                }
            }
            for ((orow, grow), yrow) in
                ob.chunks_exact_mut(inner).zip(gb.chunks_exact(inner)).zip(yb.chunks_exact(inner))
            {
                for (((ov, &gv), &yv), &s) in orow.iter_mut().zip(grow).zip(yrow).zip(&acc) {
                    let (gv, yv) = (R::load(gv), R::load(yv));
                    *ov = if log { sc * (gv - yv.exp() * s) } else { sc * yv * (gv - s) }.store();
                }
            }
        }
    });
}

/// `_backward_softmax(dy, y)`, `_backward_softmin(dy, y)` and
/// `_backward_log_softmax(dy, x[, length], y)`; a length input gets a zero gradient.
fn softmax_backward(log: bool, negate: bool) -> ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| {
        let a = cx.attrs;
        zero_if_requested(cx, outs, 1);
        if cx.req[0] == Req::Null {
            return Ok(());
        }
        let (g, y) = (&ins[0], &ins[ins.len() - 1]);
        let params = SoftmaxParams::of(a);
        let axis = norm_axis(a.op, params.axis, y.ndim())?;
        let t = params.temperature.unwrap_or(1.0);
        let scale = if negate { -1.0 / t } else { 1.0 / t };
        let lengths = if log && ins.len() == 4 {
            let l = &ins[2];
            Some(crate::dispatch_all!(l.dtype, T => l.as_slice::<T>().iter().map(|v| v.to_f64()).collect::<Vec<f64>>()))
        } else {
            None
        };
        let dims = split_at_axis(&y.shape, axis);
        if g.dtype == outs[0].dtype {
            dispatch_real!(g.dtype, a.op, T, R => {
                softmax_grad::<T, R>(g.as_slice::<T>(), y.as_slice::<T>(), outs[0].as_mut::<T>(), dims, log, scale, lengths.as_deref())
            });
        } else {
            let (gv, yv) = (read_f64(a.op, g)?, read_f64(a.op, y)?);
            let mut dv = vec![0.0; gv.len()];
            softmax_grad::<f64, f64>(&gv, &yv, &mut dv, dims, log, scale, lengths.as_deref());
            write_f64(a.op, &mut outs[0], &dv)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// SoftmaxOutput

/// `_backward_SoftmaxOutput(dy, data, label, y) -> (ddata, 0)`: the cross-entropy gradient
/// `y - onehot(label)` (or `y - label` for probability labels), scaled as stock scales it;
/// the output gradient is used only with `out_grad`.
fn softmax_output_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    zero_if_requested(cx, outs, 1);
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (g, label, y) = (&ins[0], &ins[2], &ins[3]);
    let labels: Vec<f64> =
        crate::dispatch_all!(label.dtype, T => label.as_slice::<T>().iter().map(|v| v.to_f64()).collect());
    let params = SoftmaxOutputParams::of(a);
    let grad_scale = params.grad_scale;
    let out_grad = params.out_grad;
    let (outer, k, inner) = softmax_output_dims(a, &y.shape);
    let multi = params.multi_output && y.ndim() > 1;
    let ignore = params.ignore_label;
    let use_ignore = params.use_ignore;
    let alpha = params.smooth_alpha;
    let prob = label.shape == y.shape;
    let norm = if prob {
        grad_scale
    } else {
        let valid = match params.normalization {
            "batch" => outer,
            "valid" => labels.iter().filter(|&&l| l as i64 != ignore as i64).count().max(1),
            _ => 1,
        };
        let per = if multi && params.normalization != "valid" { inner } else { 1 };
        grad_scale / per as f64 / valid as f64
    };
    let (on, off) = if alpha != 0.0 && k > 1 { (1.0 - alpha, alpha / (k - 1) as f64) } else { (1.0, 0.0) };
    dispatch_real!(y.dtype, a.op, T, R => {
        let (ys, gs) = (y.as_slice::<T>(), g.as_slice::<T>());
        let block = k * inner;
        let nr = R::of(norm);
        let labels = &labels;
        par_for_mut(outs[0].as_mut::<T>(), block, Cost(block as f64 * 0.5), T::DTYPE, |r, part| {
            for (b, ob) in r.zip(part.chunks_mut(block.max(1))) {
                let yb = &ys[b * block..(b + 1) * block];
                for i in 0..inner {
                    let l = if prob { 0.0 } else { labels[b * inner + i] };
                    let skip = !prob && use_ignore && l as i64 == ignore as i64;
                    for j in 0..k {
                        let at = j * inner + i;
                        let v = if skip {
                            R::of(0.0)
                        } else if prob {
                            (R::load(yb[at]) - R::of(labels[b * block + at])) * nr
                        } else {
                            let t = if j as i64 == l as i64 { on } else { off };
                            (R::load(yb[at]) - R::of(t)) * nr
                        };
                        ob[at] = if out_grad { v * R::load(gs[b * block + at]) } else { v }.store();
                    }
                }
            }
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Dropout

/// `_backward_Dropout(dy, y, mask) -> dy * mask` (the mask holds 0 or 1/(1-p)).
fn dropout_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        map3::<T, R>(ins[0].as_slice::<T>(), ins[2].as_slice::<T>(), &[], &mut outs[0], Cost::CHEAP, |g, m, _| g * m)
    });
    Ok(())
}

/// The gradient of `_backward_Dropout(dy, y, mask)`: linear in `dy` (the same call on the
/// incoming gradient); the output and the mask get none. Stock declares zero gradients for
/// every input, `dy` included (a known difference: a second derivative through an output
/// gradient that depends on the variables is not lost here).
fn dropout_composed(cx: &Composed) -> Result<Vec<Option<NDArray>>> {
    let mut out = vec![None; cx.inputs.len()];
    if cx.wants(0) {
        let dy = &cx.inputs[0];
        let like = [Meta::new(dy.shape.clone(), dy.dtype)];
        let args: Vec<&NDArray> = std::iter::once(&cx.ograds[0]).chain(&cx.inputs[1..]).collect();
        out[0] = cx.again(&args, &like, &[true])?.into_iter().next();
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// BatchNorm, LayerNorm

/// `_backward_BatchNorm(dy[, dmean, dinvstd], data, gamma, beta, moving_mean, moving_var, y,
/// mean, invstd) -> (ddata, dgamma, dbeta, 0, 0)`. Training mode differentiates through the
/// batch statistics and updates the moving statistics from them (stock 1.9.1's rule, in its
/// backward: `moving = moving * momentum + batch * (1 - momentum)`, the batch variance
/// recovered from the saved inverse std); `use_global_stats` (or inference) treats the saved
/// statistics as constants. The gradients of the optional mean/invstd outputs are ignored, as
/// in stock.
fn batch_norm_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    bn_backward(cx, ins, outs, false)
}

/// `_backward_BatchNormWithReLU`: as `_backward_BatchNorm`, with the output gradient first
/// passed through the ReLU (kept where the output `y` is positive).
fn batch_norm_relu_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    bn_backward(cx, ins, outs, true)
}

fn bn_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], relu: bool) -> Result<()> {
    let a = cx.attrs;
    let op = a.op;
    let nv = ins.len() - 8;
    let (g, x) = (&ins[0], &ins[nv]);
    let params = BnParams::of(a);
    let axis = norm_axis(op, params.axis, x.ndim())?;
    let (outer, c, inner) = split_at_axis(&x.shape, axis);
    let fix_gamma = params.fix_gamma;
    let gamma = if fix_gamma { vec![1.0; c] } else { read_f64(op, &ins[nv + 1])? };
    let mean = read_f64(op, &ins[nv + 6])?;
    let inv = read_f64(op, &ins[nv + 7])?;
    let training = cx.is_train && !params.use_global_stats;
    if training {
        // The moving statistics are the mutated inputs: writable blobs 5 and 6.
        // Stock's momentum is a float, and so is its `1 - momentum`.
        let (eps, momentum) = (params.eps, super::optim::f32r(params.momentum));
        let keep = (1.0f32 - momentum as f32) as f64;
        let mm = read_out_f64(op, &outs[5])?;
        let mv = read_out_f64(op, &outs[6])?;
        let new_mm: Vec<f64> = mm.iter().zip(&mean).map(|(o, m)| o * momentum + m * keep).collect();
        let new_mv: Vec<f64> = mv.iter().zip(&inv).map(|(o, i)| o * momentum + (1.0 / (i * i) - eps) * keep).collect();
        write_f64(op, &mut outs[5], &new_mm)?;
        write_f64(op, &mut outs[6], &new_mv)?;
    }
    let n = (outer * inner).max(1) as f64;
    // Per channel: Σ dy and Σ dy·(x - mean).
    let mut sg = vec![0.0f64; c];
    let mut sgx = vec![0.0f64; c];
    dispatch_real!(x.dtype, op, T, R => {
        let (gs, xs) = (g.as_slice::<T>(), x.as_slice::<T>());
        let masked: Vec<T>;
        let gs = if relu {
            let ys = ins[nv + 5].as_slice::<T>();
            masked = gs.iter().zip(ys).map(|(&gv, &yv)| if yv > T::zero() { gv } else { T::zero() }).collect();
            &masked[..]
        } else {
            gs
        };
        par_for_zip(&mut sg, [&mut sgx], Cost((outer * inner) as f64), T::DTYPE, |r, p1, [p2]| {
            for (k, ch) in r.enumerate() {
            let m = R::of(mean[ch]);
            let (mut s1, mut s2) = (0.0f64, 0.0f64);
            for o in 0..outer {
                let base = (o * c + ch) * inner;
                let (mut a1, mut a2) = (R::of(0.0), R::of(0.0));
                for (&gv, &xv) in gs[base..base + inner].iter().zip(&xs[base..base + inner]) {
                    let gv = R::load(gv);
                    a1 += gv;
                    a2 += gv * (R::load(xv) - m);
                }
                s1 += a1.f64();
                s2 += a2.f64();
            }
            p1[k] = s1;
            p2[k] = s2;
            }
        });
        if cx.req[0] != Req::Null {
            // dx = k1·dy + k2·(x - mean) + k3 per channel.
            let coef: Vec<(f64, f64, f64)> = (0..c)
                .map(|ch| {
                    let k1 = gamma[ch] * inv[ch];
                    if training {
                        (k1, -k1 * inv[ch] * inv[ch] * sgx[ch] / n, -k1 * sg[ch] / n)
                    } else {
                        (k1, 0.0, 0.0)
                    }
                })
                .collect();
            par_for_mut(outs[0].as_mut::<T>(), inner, Cost(inner as f64 * 0.4), T::DTYPE, |r, part| {
                for (b, ob) in r.zip(part.chunks_mut(inner.max(1))) {
                    let ch = b % c;
                    let (k1, k2, k3) = (R::of(coef[ch].0), R::of(coef[ch].1), R::of(coef[ch].2));
                    let m = R::of(mean[ch]);
                    for ((ov, &gv), &xv) in ob.iter_mut().zip(&gs[b * inner..(b + 1) * inner]).zip(&xs[b * inner..(b + 1) * inner]) {
                        *ov = (k1 * R::load(gv) + k2 * (R::load(xv) - m) + k3).store();
                    }
                }
            });
        }
    });
    if cx.req[1] != Req::Null {
        let dg: Vec<f64> = if fix_gamma { vec![0.0; c] } else { (0..c).map(|ch| sgx[ch] * inv[ch]).collect() };
        write_f64(op, &mut outs[1], &dg)?;
    }
    if cx.req[2] != Req::Null {
        write_f64(op, &mut outs[2], &sg)?;
    }
    zero_if_requested(cx, outs, 3);
    zero_if_requested(cx, outs, 4);
    Ok(())
}

/// `_backward_LayerNorm(dy[, dmean, dstd], data, gamma, beta, y, mean, std) -> (ddata,
/// dgamma, dbeta)` (the gradients of the optional mean/std outputs are ignored).
fn layer_norm_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let op = a.op;
    let nv = ins.len() - 6;
    let (g, x) = (&ins[0], &ins[nv]);
    let axis = norm_axis(op, LnParams::of(a).axis, x.ndim())?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    let gamma = read_f64(op, &ins[nv + 1])?;
    let mean = read_f64(op, &ins[nv + 4])?;
    let sd = read_f64(op, &ins[nv + 5])?;
    let at = |grp: usize, j: usize| ((grp / inner) * len + j) * inner + grp % inner;
    dispatch_real!(x.dtype, op, T, _R => {
        let (gs, xs) = (g.as_slice::<T>(), x.as_slice::<T>());
        if cx.req[0] != Req::Null {
            // Each outer block (len × inner, holding `inner` groups) is owned by one task.
            let block = len * inner;
            par_for_mut(outs[0].as_mut::<T>(), block, Cost(block as f64 * 4.0), T::DTYPE, |r, part| {
                for (o, ob) in r.zip(part.chunks_mut(block.max(1))) {
                    for i in 0..inner {
                        let grp = o * inner + i;
                        let (m, inv) = (mean[grp], 1.0 / sd[grp]);
                        let (mut s1, mut s2) = (0.0, 0.0);
                        for j in 0..len {
                            let gg = gs[at(grp, j)].to_f64() * gamma[j];
                            s1 += gg;
                            s2 += gg * (xs[at(grp, j)].to_f64() - m) * inv;
                        }
                        let (s1, s2) = (s1 / len as f64, s2 / len as f64);
                        for j in 0..len {
                            let xhat = (xs[at(grp, j)].to_f64() - m) * inv;
                            ob[j * inner + i] = T::from_f64(inv * (gs[at(grp, j)].to_f64() * gamma[j] - s1 - xhat * s2));
                        }
                    }
                }
            });
        }
        if cx.req[1] != Req::Null || cx.req[2] != Req::Null {
            let (mut dg, mut db) = (vec![0.0; len], vec![0.0; len]);
            for grp in 0..outer * inner {
                let (m, inv) = (mean[grp], 1.0 / sd[grp]);
                for j in 0..len {
                    let gv = gs[at(grp, j)].to_f64();
                    db[j] += gv;
                    dg[j] += gv * (xs[at(grp, j)].to_f64() - m) * inv;
                }
            }
            if cx.req[1] != Req::Null {
                write_f64(op, &mut outs[1], &dg)?;
            }
            if cx.req[2] != Req::Null {
                write_f64(op, &mut outs[2], &db)?;
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Pooling

/// Scatter one plane's output gradient `g` back onto `dx` (overwritten). Windows are clipped
/// to the input as in the forward; max routes to the first position equal to the output.
fn unpool_plane<T: Elem, R: Real>(g: &[T], x: &[T], y: &[T], dx: &mut [T], p: &PoolPlan, kind: PoolKind) {
    let [id, ih, iw] = p.input;
    let [od, oh, ow] = p.output;
    dx.fill(T::zero());
    let bounds = |o: usize, d: usize, size: usize| {
        let s = (o * p.stride[d]) as isize - p.pad[d] as isize;
        let e_pad = (s + p.kernel[d] as isize).min((size + p.pad[d]) as isize);
        (s.max(0) as usize, e_pad.min(size as isize).max(0) as usize, (e_pad - s) as usize)
    };
    let mut oi = 0;
    for z in 0..od {
        let (z0, z1, zn) = bounds(z, 0, id);
        for yy in 0..oh {
            let (y0, y1, yn) = bounds(yy, 1, ih);
            for xx in 0..ow {
                let (x0, x1, xn) = bounds(xx, 2, iw);
                let gv = R::load(g[oi]);
                let yv = R::load(y[oi]);
                oi += 1;
                match kind {
                    PoolKind::Max => {
                        'find: for zz in z0..z1 {
                            for yi in y0..y1 {
                                let row = (zz * ih + yi) * iw;
                                for xi in x0..x1 {
                                    if R::load(x[row + xi]) == yv {
                                        dx[row + xi] = (R::load(dx[row + xi]) + gv).store();
                                        break 'find;
                                    }
                                }
                            }
                        }
                    }
                    _ => {
                        let w = match kind {
                            PoolKind::Avg { include_pad } => {
                                let n = if include_pad { zn * yn * xn } else { (z1 - z0) * (y1 - y0) * (x1 - x0) };
                                if n == 0 {
                                    continue;
                                }
                                gv / R::of(n as f64)
                            }
                            _ => gv,
                        };
                        let lp = match kind {
                            PoolKind::Lp(p) if p > 1 => Some(p),
                            _ => None,
                        };
                        for zz in z0..z1 {
                            for yi in y0..y1 {
                                let row = (zz * ih + yi) * iw;
                                for (d, &xv) in dx[row + x0..row + x1].iter_mut().zip(&x[row + x0..row + x1]) {
                                    let add = match lp {
                                        None => w,
                                        Some(2) if yv != R::of(0.0) => w * R::load(xv) / yv,
                                        Some(3) if yv != R::of(0.0) => {
                                            let xv = R::load(xv);
                                            w * xv * xv / (yv * yv)
                                        }
                                        Some(_) => R::of(0.0),
                                    };
                                    *d = (R::load(*d) + add).store();
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The max-pooling gradient of one plane when [`PoolPlan::unclipped_2d`]: each output's
/// gradient goes to the first position of its window (row-major) equal to the output, as
/// in [`unpool_plane`]. `KH`×`KW`: the window, 0 = the plan's (at run time).
fn max_unpool_2d<T: Elem, R: Real, const KH: usize, const KW: usize>(
    g: &[T],
    x: &[T],
    y: &[T],
    dx: &mut [T],
    p: &PoolPlan,
) {
    let ([_, _, iw], [_, oh, ow]) = (p.input, p.output);
    let (kh, kw) = (if KH > 0 { KH } else { p.kernel[1] }, if KW > 0 { KW } else { p.kernel[2] });
    let (sh, sw) = (p.stride[1], p.stride[2]);
    if (kh, kw) == (sh, sw) {
        if (kh, kw) == (2, 2) {
            #[cfg(target_arch = "x86_64")]
            if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
                // SAFETY: T is f32 (same TypeId), so these are the same slices retyped.
                let (g, x, y, dx) = unsafe {
                    (
                        std::slice::from_raw_parts(g.as_ptr().cast::<f32>(), g.len()),
                        std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), x.len()),
                        std::slice::from_raw_parts(y.as_ptr().cast::<f32>(), y.len()),
                        std::slice::from_raw_parts_mut(dx.as_mut_ptr().cast::<f32>(), dx.len()),
                    )
                };
                return max_unpool_2x2_sse2(g, x, y, dx, p);
            }
            return max_unpool_2x2::<T, R>(g, x, y, dx, p);
        }
        return max_unpool_tiled::<T, R, KH, KW>(g, x, y, dx, p);
    }
    dx.fill(T::zero());
    for oy in 0..oh {
        let base = oy * sh * iw;
        for ox in 0..ow {
            let oi = oy * ow + ox;
            let yv = R::load(y[oi]);
            'find: for ky in 0..kh {
                let at = base + ky * iw + ox * sw;
                for i in at..at + kw {
                    if R::load(x[i]) == yv {
                        dx[i] = (R::load(dx[i]) + R::load(g[oi])).store();
                        break 'find;
                    }
                }
            }
        }
    }
}

/// [`max_unpool_tiled`] for 2×2 windows: each window's four entries written once, as
/// straight-line selects (no per-window loop exits). f32 on x86-64 takes
/// `max_unpool_2x2_sse2` instead: LLVM compiles these selects to branches, which mispredict
/// on random data (the seed 004 CNN's first pooling gradient: about 3.4 ms here, about
/// 0.5 ms with SSE2; stock averages 3.1 ms).
fn max_unpool_2x2<T: Elem, R: Real>(g: &[T], x: &[T], y: &[T], dx: &mut [T], p: &PoolPlan) {
    tiles_2x2(g, x, y, dx, p, unpool_2x2_row::<T, R>);
}

/// Run `row(y, g, x_top, x_bottom, dx_top, dx_bottom)` over each output row of a 2×2-tiled
/// plane (the slices cover the row's windows), then zero what no window covers.
fn tiles_2x2<T: Elem>(
    g: &[T],
    x: &[T],
    y: &[T],
    dx: &mut [T],
    p: &PoolPlan,
    mut row: impl FnMut(&[T], &[T], &[T], &[T], &mut [T], &mut [T]),
) {
    let ([_, _, iw], [_, oh, ow]) = (p.input, p.output);
    for oy in 0..oh {
        let (yr, gr) = (&y[oy * ow..][..ow], &g[oy * ow..][..ow]);
        let at = 2 * oy * iw;
        let (x0, x1) = (&x[at..at + 2 * ow], &x[at + iw..at + iw + 2 * ow]);
        let (d0, d1) = dx[at..at + 2 * iw].split_at_mut(iw);
        row(yr, gr, x0, x1, &mut d0[..2 * ow], &mut d1[..2 * ow]);
        dx[at + 2 * ow..at + iw].fill(T::zero());
        dx[at + iw + 2 * ow..at + 2 * iw].fill(T::zero());
    }
    dx[2 * oh * iw..].fill(T::zero());
}

/// One row of 2×2 windows, scalar: zipped chunks, no indexing, so no bounds checks.
fn unpool_2x2_row<T: Elem, R: Real>(yr: &[T], gr: &[T], x0: &[T], x1: &[T], d0: &mut [T], d1: &mut [T]) {
    let xs = x0.chunks_exact(2).zip(x1.chunks_exact(2));
    let ds = d0.chunks_exact_mut(2).zip(d1.chunks_exact_mut(2));
    for (((&yv, &gv), (xa, xb)), (da, db)) in yr.iter().zip(gr).zip(xs).zip(ds) {
        let yv = R::load(yv);
        let ea = R::load(xa[0]) == yv;
        let eb = !ea & (R::load(xa[1]) == yv);
        let ec = !(ea | eb) & (R::load(xb[0]) == yv);
        let ed = !(ea | eb | ec) & (R::load(xb[1]) == yv);
        let zero = T::zero();
        da[0] = if ea { gv } else { zero };
        da[1] = if eb { gv } else { zero };
        db[0] = if ec { gv } else { zero };
        db[1] = if ed { gv } else { zero };
    }
}

/// [`max_unpool_2x2`] for f32 with SSE2 (part of x86-64's baseline): four windows at a
/// time, compared and masked in vector registers, so no branch depends on the data (the
/// scalar selects compile to branches that mispredict on random data). Same routing:
/// ordered equality as `==`, first match in row-major window order.
#[cfg(target_arch = "x86_64")]
fn max_unpool_2x2_sse2(g: &[f32], x: &[f32], y: &[f32], dx: &mut [f32], p: &PoolPlan) {
    use std::arch::x86_64::*;
    let vec_ow = p.output[2] / 4 * 4;
    tiles_2x2(g, x, y, dx, p, |yr, gr, x0, x1, d0, d1| {
        for ox in (0..vec_ow).step_by(4) {
            // Bounds: ox + 4 <= ow, so entries 2·ox .. 2·ox + 8 of each row exist; the
            // slices below check it once and the loads/stores stay inside them.
            let (ys, gs) = (&yr[ox..ox + 4], &gr[ox..ox + 4]);
            let (r0, r1) = (&x0[2 * ox..2 * ox + 8], &x1[2 * ox..2 * ox + 8]);
            let (w0, w1) = (&mut d0[2 * ox..2 * ox + 8], &mut d1[2 * ox..2 * ox + 8]);
            // SAFETY: SSE2 is always available on x86_64; every load and store reads or
            // writes 4 f32 inside the 4- or 8-element slices above (unaligned forms).
            unsafe {
                let (yv, gv) = (_mm_loadu_ps(ys.as_ptr()), _mm_loadu_ps(gs.as_ptr()));
                let (a0, a1) = (_mm_loadu_ps(r0.as_ptr()), _mm_loadu_ps(r0.as_ptr().add(4)));
                let (b0, b1) = (_mm_loadu_ps(r1.as_ptr()), _mm_loadu_ps(r1.as_ptr().add(4)));
                // Window k's four entries: top-left, top-right, bottom-left, bottom-right.
                let tl = _mm_shuffle_ps::<0b10_00_10_00>(a0, a1);
                let tr = _mm_shuffle_ps::<0b11_01_11_01>(a0, a1);
                let bl = _mm_shuffle_ps::<0b10_00_10_00>(b0, b1);
                let br = _mm_shuffle_ps::<0b11_01_11_01>(b0, b1);
                let ea = _mm_cmpeq_ps(tl, yv);
                let eb = _mm_andnot_ps(ea, _mm_cmpeq_ps(tr, yv));
                let seen = _mm_or_ps(ea, eb);
                let ec = _mm_andnot_ps(seen, _mm_cmpeq_ps(bl, yv));
                let ed = _mm_andnot_ps(_mm_or_ps(seen, ec), _mm_cmpeq_ps(br, yv));
                let (ga, gb, gc, gd) = (_mm_and_ps(ea, gv), _mm_and_ps(eb, gv), _mm_and_ps(ec, gv), _mm_and_ps(ed, gv));
                _mm_storeu_ps(w0.as_mut_ptr(), _mm_unpacklo_ps(ga, gb));
                _mm_storeu_ps(w0.as_mut_ptr().add(4), _mm_unpackhi_ps(ga, gb));
                _mm_storeu_ps(w1.as_mut_ptr(), _mm_unpacklo_ps(gc, gd));
                _mm_storeu_ps(w1.as_mut_ptr().add(4), _mm_unpackhi_ps(gc, gd));
            }
        }
        // The last ow % 4 windows.
        let v = vec_ow;
        unpool_2x2_row::<f32, f32>(&yr[v..], &gr[v..], &x0[2 * v..], &x1[2 * v..], &mut d0[2 * v..], &mut d1[2 * v..]);
    });
}

/// [`max_unpool_2d`] when the windows tile the input (stride = kernel): each input position
/// lies in at most one window, so it is written once (no zero fill first).
fn max_unpool_tiled<T: Elem, R: Real, const KH: usize, const KW: usize>(
    g: &[T],
    x: &[T],
    y: &[T],
    dx: &mut [T],
    p: &PoolPlan,
) {
    let ([_, _, iw], [_, oh, ow]) = (p.input, p.output);
    let (kh, kw) = (if KH > 0 { KH } else { p.kernel[1] }, if KW > 0 { KW } else { p.kernel[2] });
    // Per window of the current output row: whether an earlier window row held the max.
    let mut found = vec![false; ow];
    for oy in 0..oh {
        found.fill(false);
        let (yr, gr) = (&y[oy * ow..][..ow], &g[oy * ow..][..ow]);
        for ky in 0..kh {
            let at = (oy * kh + ky) * iw;
            let (xr, dr) = (&x[at..at + iw], &mut dx[at..at + iw]);
            for (ox, f) in found.iter_mut().enumerate() {
                let (yv, gv) = (R::load(yr[ox]), gr[ox]);
                for kx in 0..kw {
                    let i = ox * kw + kx;
                    let hit = !*f && R::load(xr[i]) == yv;
                    dr[i] = if hit { gv } else { T::zero() };
                    *f |= hit;
                }
            }
            dr[ow * kw..].fill(T::zero());
        }
    }
    dx[oh * kh * iw..].fill(T::zero());
}

fn max_unpool_2d_any<T: Elem, R: Real>(g: &[T], x: &[T], y: &[T], dx: &mut [T], p: &PoolPlan) {
    match (p.kernel[1], p.kernel[2]) {
        (2, 2) => max_unpool_2d::<T, R, 2, 2>(g, x, y, dx, p),
        (3, 3) => max_unpool_2d::<T, R, 3, 3>(g, x, y, dx, p),
        _ => max_unpool_2d::<T, R, 0, 0>(g, x, y, dx, p),
    }
}

/// `_backward_Pooling(dy, x, y) -> dx`.
fn pooling_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (g, x, y) = (&ins[0], &ins[1], &ins[2]);
    let p = pool_plan(a, &x.shape)?;
    let kind = pool_kind(a);
    dispatch_real!(x.dtype, a.op, T, R => {
        let (gs, xs, ys) = (g.as_slice::<T>(), x.as_slice::<T>(), y.as_slice::<T>());
        if p.channels_last {
            // Channel-last data: the gradient of the channel-first copy, permuted back.
            let (first, last) = channel_perms(x.ndim());
            let (g, x2, y) = (permuted(gs, &g.shape, &first), permuted(xs, &x.shape, &first), permuted(ys, &y.shape, &first));
            let mut d = vec![T::zero(); xs.len()];
            unpool_planes::<T, R>(&g, &x2, &y, &mut d, &p, kind);
            let xshape: Vec<usize> = first.iter().map(|&i| x.shape[i]).collect();
            outs[0].as_mut::<T>().copy_from_slice(&permuted(&d, &xshape, &last));
        } else {
            unpool_planes::<T, R>(gs, xs, ys, outs[0].as_mut::<T>(), &p, kind);
        }
    });
    Ok(())
}

/// The gradient `dx` of pooling channel-first planes, from `dy`, `x` and `y`.
fn unpool_planes<T: Elem, R: Real>(gs: &[T], xs: &[T], ys: &[T], dx: &mut [T], p: &PoolPlan, kind: PoolKind) {
    let (isz, osz) = (p.input.iter().product::<usize>(), p.output.iter().product::<usize>());
    let work = (osz * p.kernel.iter().product::<usize>()) as f64 * 0.5 + isz as f64 * 0.25 + 1.0;
    let fast = kind == PoolKind::Max && p.unclipped_2d();
    par_for_mut(dx, isz, Cost(work), T::DTYPE, |r, part| {
        for (pl, d) in r.zip(part.chunks_mut(isz.max(1))) {
            let (g, x, y) =
                (&gs[pl * osz..(pl + 1) * osz], &xs[pl * isz..(pl + 1) * isz], &ys[pl * osz..(pl + 1) * osz]);
            if fast {
                max_unpool_2d_any::<T, R>(g, x, y, d, p);
            } else {
                unpool_plane::<T, R>(g, x, y, d, p, kind);
            }
        }
    });
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(OpDef::backward("_backward_Activation", ACT_PARAMS, Box::new(activation_backward)).gpu(
        crate::op::gpu::GpuKernel::MapGradBy(|a| match ActParams::of(a).act_type {
            "relu" => "y > T(0) ? x : T(0)",
            "sigmoid" => "x * y * (T(1) - y)",
            "tanh" => "x * (T(1) - y * y)",
            "softrelu" => "x * (T(1) - exp(-y))",
            _ => "x * (T(1) - fabs(y)) * (T(1) - fabs(y))",
        }),
    ));
    ops.push(OpDef::backward("_backward_LeakyReLU", LEAKY_PARAMS, Box::new(leaky_backward)));
    ops.push(OpDef::backward("_backward_softmax", SOFTMAX_PARAMS, softmax_backward(false, false)));
    ops.push(OpDef::backward("_backward_log_softmax", SOFTMAX_PARAMS, softmax_backward(true, false)));
    ops.push(OpDef::backward("_backward_softmin", SOFTMAX_PARAMS, softmax_backward(false, true)));
    ops.push(OpDef::backward("_backward_SoftmaxOutput", SOFTMAX_OUTPUT_PARAMS, Box::new(softmax_output_backward)));
    ops.push(OpDef::backward("_backward_Dropout", DROPOUT_PARAMS, Box::new(dropout_backward)).grad(Grad::Composed {
        f: dropout_composed,
        inputs: true,
        outputs: false,
    }));
    ops.push(
        OpDef::backward("_backward_BatchNorm", BN_PARAMS, Box::new(batch_norm_backward)).mutates_from_end(&[5, 4]),
    );
    ops.push(
        OpDef::backward("_backward_BatchNormWithReLU", BN_PARAMS, Box::new(batch_norm_relu_backward))
            .mutates_from_end(&[5, 4]),
    );
    ops.push(OpDef::backward("_backward_LayerNorm", LN_PARAMS, Box::new(layer_norm_backward)));
    ops.push(OpDef::backward("_backward_Pooling", POOL_PARAMS, Box::new(pooling_backward)));
}

#[cfg(test)]
mod tests {
    use crate::ndarray::DType;
    use crate::op::grad::check::{check, values};
    use crate::op::tensor::{OutBlob, TBlob};
    use crate::op::{lookup, OpCtx, Req};

    /// Values in [-1, 1] kept at least `gap` away from 0.
    fn away(n: usize, seed: u64, gap: f64) -> Vec<f64> {
        values(n, -1.0, 1.0, seed).into_iter().map(|v| if v.abs() < gap { v.signum() * gap + v } else { v }).collect()
    }

    #[test]
    fn activation() {
        let x = away(30, 1, 0.05);
        for act in ["relu", "sigmoid", "tanh", "softrelu", "softsign"] {
            check("Activation", &[("act_type", act)], &[(&[5, 6], x.clone())], &[]);
        }
    }

    #[test]
    fn leaky_relu() {
        let x = away(24, 2, 0.05);
        for act in ["leaky", "elu", "selu", "gelu", "rrelu"] {
            check("LeakyReLU", &[("act_type", act), ("slope", "0.3")], &[(&[2, 3, 4], x.clone())], &[]);
        }
        check("LeakyReLU", &[("act_type", "prelu")], &[(&[2, 3, 4], x.clone()), (&[3], vec![0.2, 0.5, -0.3])], &[]);
        check("LeakyReLU", &[("act_type", "prelu")], &[(&[2, 3, 4], x), (&[1], vec![0.4])], &[]);
    }

    #[test]
    fn softmax_family() {
        let x = values(24, -2.0, 2.0, 3);
        for op in ["softmax", "log_softmax", "softmin"] {
            check(op, &[], &[(&[2, 3, 4], x.clone())], &[]);
            check(op, &[("axis", "1"), ("temperature", "2.5")], &[(&[2, 3, 4], x.clone())], &[]);
            check(op, &[("axis", "0")], &[(&[2, 3, 4], x.clone())], &[]);
            // Length mask along the last axis: lengths get no gradient.
            check(
                op,
                &[("use_length", "True")],
                &[(&[2, 3, 4], x.clone()), (&[2, 3], vec![1.0, 4.0, 2.0, 3.0, 4.0, 2.0])],
                &[1],
            );
        }
    }

    #[test]
    fn dropout() {
        let x = values(200, -1.0, 1.0, 4);
        check("Dropout", &[("p", "0.3")], &[(&[10, 20], x.clone())], &[]);
        check("Dropout", &[("p", "0.5"), ("axes", "(1,)")], &[(&[10, 20], x)], &[]);
    }

    #[test]
    fn batch_norm() {
        let x = values(2 * 3 * 5, -2.0, 2.0, 5);
        let gamma = vec![0.5, 1.5, -0.7];
        let beta = vec![0.1, -0.2, 0.3];
        let mm = vec![0.1, 0.2, -0.1];
        let mv = vec![0.8, 1.2, 0.5];
        let shape: &[usize] = &[2, 3, 5];
        let c: &[usize] = &[3];
        let all = vec![(shape, x.clone()), (c, gamma.clone()), (c, beta.clone()), (c, mm.clone()), (c, mv.clone())];
        check("BatchNorm", &[("fix_gamma", "False"), ("eps", "1e-3")], &all, &[3, 4]);
        check("BatchNorm", &[("fix_gamma", "True")], &all, &[1, 3, 4]);
        check("BatchNorm", &[("fix_gamma", "False"), ("use_global_stats", "True")], &all, &[3, 4]);
        // Channel axis last.
        let c5: &[usize] = &[5];
        let all = vec![
            (shape, x),
            (c5, values(5, 0.5, 1.5, 6)),
            (c5, values(5, -1.0, 1.0, 7)),
            (c5, vec![0.0; 5]),
            (c5, vec![1.0; 5]),
        ];
        check("BatchNorm", &[("fix_gamma", "False"), ("axis", "-1")], &all, &[3, 4]);
    }

    #[test]
    fn layer_norm() {
        let x = values(2 * 3 * 4, -2.0, 2.0, 8);
        let s: &[usize] = &[2, 3, 4];
        check(
            "LayerNorm",
            &[],
            &[(s, x.clone()), (&[4], values(4, 0.5, 1.5, 9)), (&[4], values(4, -1.0, 1.0, 10))],
            &[],
        );
        check(
            "LayerNorm",
            &[("axis", "1")],
            &[(s, x), (&[3], values(3, 0.5, 1.5, 11)), (&[3], values(3, -1.0, 1.0, 12))],
            &[],
        );
    }

    #[test]
    fn max_unpool_fast_path_equals_the_general_one() {
        use super::super::nn::tests::{tied, UNCLIPPED};
        use super::super::nn::{pool_plan, PoolKind, POOL_PARAMS};
        use crate::op::param::Attrs;
        for &(k, st, shape) in UNCLIPPED {
            let attrs =
                Attrs::parse("Pooling", POOL_PARAMS, [("kernel", k), ("stride", st), ("pool_type", "max")]).unwrap();
            let p = pool_plan(&attrs, shape).unwrap();
            let (isz, osz) = (p.input.iter().product::<usize>(), p.output.iter().product::<usize>());
            let x = tied(isz);
            // The forward's maxima, computed naively, and distinct output gradients.
            let y: Vec<f32> = (0..osz)
                .map(|o| {
                    let (oy, ox) = (o / p.output[2], o % p.output[2]);
                    let mut m = f32::NEG_INFINITY;
                    for ky in 0..p.kernel[1] {
                        for kx in 0..p.kernel[2] {
                            m = m.max(x[(oy * p.stride[1] + ky) * p.input[2] + ox * p.stride[2] + kx]);
                        }
                    }
                    m
                })
                .collect();
            let g: Vec<f32> = (0..osz).map(|i| i as f32 + 0.5).collect();
            let (mut fast, mut general) = (vec![9.0f32; isz], vec![7.0f32; isz]);
            super::max_unpool_2d_any::<f32, f32>(&g, &x, &y, &mut fast, &p);
            super::unpool_plane::<f32, f32>(&g, &x, &y, &mut general, &p, PoolKind::Max);
            assert_eq!(fast, general, "{k} {st} {shape:?}");
            assert!((fast.iter().sum::<f32>() - g.iter().sum::<f32>()).abs() < 1e-3);
        }
    }

    #[test]
    fn pooling() {
        // Distinct values, so max windows have no ties.
        let x: Vec<f64> = (0..2 * 2 * 7 * 6).map(|i| ((i * 37 % 84) as f64) * 0.05 - 2.0).collect();
        let s: &[usize] = &[2, 2, 7, 6];
        for pt in ["max", "avg", "sum"] {
            check("Pooling", &[("kernel", "(2, 2)"), ("stride", "(2, 2)"), ("pool_type", pt)], &[(s, x.clone())], &[]);
            check(
                "Pooling",
                &[("kernel", "(3, 2)"), ("stride", "(2, 1)"), ("pad", "(1, 1)"), ("pool_type", pt)],
                &[(s, x.clone())],
                &[],
            );
            check(
                "Pooling",
                &[("kernel", "(3, 3)"), ("stride", "(2, 2)"), ("pooling_convention", "full"), ("pool_type", pt)],
                &[(s, x.clone())],
                &[],
            );
            check("Pooling", &[("global_pool", "True"), ("pool_type", pt)], &[(s, x.clone())], &[]);
        }
        check(
            "Pooling",
            &[("kernel", "(3, 3)"), ("pad", "(1, 1)"), ("pool_type", "avg"), ("count_include_pad", "False")],
            &[(s, x.clone())],
            &[],
        );
        let pos: Vec<f64> = x.iter().map(|v| v + 2.5).collect();
        for pv in ["1", "2", "3"] {
            check("Pooling", &[("kernel", "(2, 2)"), ("pool_type", "lp"), ("p_value", pv)], &[(s, pos.clone())], &[]);
        }
        // 1-D and 3-D.
        let x1: Vec<f64> = (0..2 * 3 * 9).map(|i| ((i * 29 % 54) as f64) * 0.1).collect();
        check(
            "Pooling",
            &[("kernel", "(3,)"), ("stride", "(2,)"), ("pool_type", "max")],
            &[(&[2, 3, 9], x1.clone())],
            &[],
        );
        check(
            "Pooling",
            &[("kernel", "(3,)"), ("stride", "(2,)"), ("pad", "(1,)"), ("pool_type", "avg")],
            &[(&[2, 3, 9], x1)],
            &[],
        );
        let x3: Vec<f64> = (0..2 * 4 * 4 * 4).map(|i| ((i * 53 % 128) as f64) * 0.02).collect();
        check(
            "Pooling",
            &[("kernel", "(2, 2, 2)"), ("stride", "(2, 2, 2)"), ("pool_type", "max")],
            &[(&[1, 2, 4, 4, 4], x3.clone())],
            &[],
        );
        check("Pooling", &[("kernel", "(2, 2, 2)"), ("pool_type", "avg")], &[(&[1, 2, 4, 4, 4], x3)], &[]);
    }

    #[test]
    fn batch_norm_backward_updates_the_moving_statistics() {
        // (N=2, C=2, 2) with output_mean_var: dy, dmean, dinvstd, data, gamma, beta,
        // moving_mean, moving_var, y, mean, invstd; the saved batch statistics are
        // mean (2.5, 10) and variance (1.25, 0.5) with eps 0.25.
        let bop = lookup("_backward_BatchNorm").unwrap();
        assert_eq!(&bop.mutated_inputs(11)[..], &[6, 7]);
        assert_eq!(&bop.mutated_inputs(9)[..], &[4, 5]);
        let attrs = bop.parse_attrs([("momentum", "0.75"), ("eps", "0.25"), ("output_mean_var", "True")], 11).unwrap();
        let (s8, s2): (&[usize], &[usize]) = (&[2, 2, 2], &[2]);
        let mut v8: Vec<Vec<f64>> = (0..3).map(|i| vec![i as f64; 8]).collect();
        let mut v2: Vec<Vec<f64>> = vec![
            vec![0.0; 2],
            vec![0.0; 2],
            vec![1.0; 2],
            vec![0.0; 2],
            vec![4.0, 8.0],
            vec![2.5, 10.0],
            vec![1.0 / 1.5f64.sqrt(), 1.0 / 0.75f64.sqrt()],
        ];
        let (mut mm, mut mv) = (vec![1.0, 2.0], vec![3.0, 4.0]);
        let [dy, x, y] = &mut v8[..] else { unreachable!() };
        let [dmean, dinv, gamma, beta, _, mean, inv] = &mut v2[..] else { unreachable!() };
        let ins = [
            blob(dy, s8),
            blob(dmean, s2),
            blob(dinv, s2),
            blob(x, s8),
            blob(gamma, s2),
            blob(beta, s2),
            blob(&mut mm, s2).lend(5),
            blob(&mut mv, s2).lend(6),
            blob(y, s8),
            blob(mean, s2),
            blob(inv, s2),
        ];
        let (mut dx, mut dg, mut db) = (vec![0.0; 8], vec![0.0; 2], vec![0.0; 2]);
        // SAFETY: the vectors outlive the call and are read only after it; the moving
        // statistics are written through these blobs only (their input blobs are lent).
        let mut outs = unsafe {
            [
                OutBlob::new(dx.as_mut_ptr().cast(), s8, DType::F64),
                OutBlob::new(dg.as_mut_ptr().cast(), s2, DType::F64),
                OutBlob::new(db.as_mut_ptr().cast(), s2, DType::F64),
                OutBlob::new(std::ptr::null_mut(), s2, DType::F64),
                OutBlob::new(std::ptr::null_mut(), s2, DType::F64),
                OutBlob::new(mm.as_mut_ptr().cast(), s2, DType::F64),
                OutBlob::new(mv.as_mut_ptr().cast(), s2, DType::F64),
            ]
        };
        let req = [Req::Write, Req::Write, Req::Write, Req::Null, Req::Null];
        let mut cx = OpCtx { attrs: &attrs, req: &req, rng: None, is_train: true, temp: None };
        (bop.compute)(&cx, &ins, &mut outs).unwrap();
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        // moving = moving * 0.75 + batch * 0.25, batch variance = 1 / invstd^2 - eps.
        assert!(close(&mm, &[1.0 * 0.75 + 2.5 * 0.25, 2.0 * 0.75 + 10.0 * 0.25]), "{mm:?}");
        assert!(close(&mv, &[3.0 * 0.75 + 1.25 * 0.25, 4.0 * 0.75 + 0.5 * 0.25]), "{mv:?}");
        // Outside training they stay.
        let (mm0, mv0) = (mm.clone(), mv.clone());
        cx.is_train = false;
        (bop.compute)(&cx, &ins, &mut outs).unwrap();
        drop(outs);
        assert_eq!((mm, mv), (mm0, mv0));
    }

    fn blob(v: &mut [f64], shape: &[usize]) -> TBlob {
        // SAFETY: the vector outlives the blob within the test.
        unsafe { TBlob::new(v.as_mut_ptr() as *mut u8, shape, DType::F64) }
    }

    /// Run `_backward_SoftmaxOutput` on softmax outputs `y` (n×k) and labels.
    fn softmax_output_grad(
        params: &[(&str, &str)],
        y: &[f64],
        yshape: &[usize],
        label: &[f64],
        lshape: &[usize],
    ) -> Vec<f64> {
        let op = lookup("SoftmaxOutput").unwrap();
        let attrs = op.parse_attrs(params.iter().copied(), 2).unwrap();
        let bop = lookup("_backward_SoftmaxOutput").unwrap();
        let (mut g, mut x, mut l, mut yv) = (vec![7.0; y.len()], vec![0.0; y.len()], label.to_vec(), y.to_vec());
        let (mut dx, mut dl) = (vec![f64::NAN; y.len()], vec![f64::NAN; label.len()]);
        let ins = [blob(&mut g, yshape), blob(&mut x, yshape), blob(&mut l, lshape), blob(&mut yv, yshape)];
        // SAFETY: the vectors outlive the call and are read only after it.
        let mut outs = unsafe {
            [
                OutBlob::new(dx.as_mut_ptr().cast(), yshape, DType::F64),
                OutBlob::new(dl.as_mut_ptr().cast(), lshape, DType::F64),
            ]
        };
        let req = [Req::Write, Req::Write];
        (bop.compute)(&OpCtx { attrs: &attrs, req: &req, rng: None, is_train: true, temp: None }, &ins, &mut outs)
            .unwrap();
        drop(outs);
        assert!(dl.iter().all(|&v| v == 0.0));
        dx
    }

    #[test]
    fn softmax_output() {
        let y = [0.2, 0.3, 0.5, 0.1, 0.6, 0.3];
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        let d = softmax_output_grad(&[], &y, &[2, 3], &[2.0, 0.0], &[2]);
        assert!(close(&d, &[0.2, 0.3, -0.5, -0.9, 0.6, 0.3]), "{d:?}");
        let d = softmax_output_grad(&[("grad_scale", "2"), ("normalization", "batch")], &y, &[2, 3], &[2.0, 0.0], &[2]);
        assert!(close(&d, &[0.2, 0.3, -0.5, -0.9, 0.6, 0.3]), "{d:?}");
        let d = softmax_output_grad(
            &[("use_ignore", "True"), ("ignore_label", "0"), ("normalization", "valid")],
            &y,
            &[2, 3],
            &[2.0, 0.0],
            &[2],
        );
        assert!(close(&d, &[0.2, 0.3, -0.5, 0.0, 0.0, 0.0]), "{d:?}");
        let d = softmax_output_grad(&[("out_grad", "True")], &y, &[2, 3], &[2.0, 0.0], &[2]);
        assert!(close(&d, &[1.4, 2.1, -3.5, -6.3, 4.2, 2.1]), "{d:?}");
        // Probability labels.
        let d = softmax_output_grad(&[], &y, &[2, 3], &[0.0, 0.5, 0.5, 1.0, 0.0, 0.0], &[2, 3]);
        assert!(close(&d, &[0.2, -0.2, 0.0, -0.9, 0.6, 0.3]), "{d:?}");
        // multi_output: (n=1, k=3, 2 positions), batch normalization divides by positions too.
        let ym = [0.2, 0.1, 0.3, 0.6, 0.5, 0.3];
        let d = softmax_output_grad(
            &[("multi_output", "True"), ("normalization", "batch")],
            &ym,
            &[1, 3, 2],
            &[1.0, 2.0],
            &[1, 2],
        );
        assert!(close(&d, &[0.1, 0.05, -0.35, 0.3, 0.25, -0.35]), "{d:?}");
        // Label smoothing.
        let d = softmax_output_grad(&[("smooth_alpha", "0.2")], &y, &[2, 3], &[2.0, 0.0], &[2]);
        assert!(close(&d, &[0.1, 0.2, -0.3, -0.7, 0.5, 0.2]), "{d:?}");
    }
}
