//! The AdamW and LAMB update operators: `_adamw_update`, `_mp_adamw_update` and their
//! multi-weight forms `_multi_adamw_update`, `_multi_mp_adamw_update` (the gradient
//! scale is an array, and a scale that is 0, infinite or NaN skips the update) and
//! `lamb_update_phase1`/`lamb_update_phase2` with their mixed-precision forms (phase 1 turns
//! the gradient into the update direction and updates the moments; the caller takes the two
//! norms; phase 2 applies the trust ratio).
//!
//! Arithmetic follows stock's kernels: the parameters are float32 values (so `beta1=0.9` is
//! 0.899999976 in a float64 update too), LAMB's bias correction divides the mean in double
//! precision and the variance in the storage type, and `beta^t` is a double power.

use super::common::check_same;
use super::nn::dispatch_real;
use super::optim::{clip, is_float, mp_group, multi_groups, multi_tables, update, views, Real, Views, MAX_WEIGHTS};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_zip, Cost};
use crate::op::param::{op_params, Attrs, ParamSpec};
use crate::op::tensor::{Elem, Operand, OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};

const WD_DOC: &str = "Weight decay augments the objective function with a regularization term that penalizes large weights. The penalty scales with the square of the magnitude of each weight.";
const CLIP_DOC: &str = "Clip gradient to the range of [-clip_gradient, clip_gradient] If clip_gradient <= 0, gradient clipping is turned off. grad = max(min(grad, clip_gradient), -clip_gradient).";

op_params! {
    /// `_adamw_update`'s and `_mp_adamw_update`'s parameters.
    struct AdamWParams<'a> => ADAMW_PARAMS {
        lr: f64 = required, "Learning rate";
        beta1: f64 = "0.9", "The decay rate for the 1st moment estimates.";
        beta2: f64 = "0.999", "The decay rate for the 2nd moment estimates.";
        epsilon: f64 = "1e-08", "A small constant for numerical stability.";
        wd: f64 = "0", WD_DOC;
        eta: f64 = required, "Learning rate schedule multiplier";
        clip_gradient: f64 = "-1", CLIP_DOC;
    }
}

op_params! {
    /// `lamb_update_phase1`'s and `mp_lamb_update_phase1`'s parameters.
    struct LambOneParams<'a> => LAMB1_PARAMS {
        beta1: f64 = "0.9", "The decay rate for the 1st moment estimates.";
        beta2: f64 = "0.999", "The decay rate for the 2nd moment estimates.";
        epsilon: f64 = "1e-06", "A small constant for numerical stability.";
        t: i64 = required, "Index update count.";
        bias_correction: bool = "True", "Whether to use bias correction.";
        wd: f64 = required, WD_DOC;
        rescale_grad: f64 = "1", "Rescale gradient to grad = rescale_grad*grad.";
        clip_gradient: f64 = "-1", CLIP_DOC;
    }
}

op_params! {
    /// `lamb_update_phase2`'s and `mp_lamb_update_phase2`'s parameters.
    struct LambTwoParams<'a> => LAMB2_PARAMS {
        lr: f64 = required, "Learning rate";
        lower_bound: f64 = "-1", "Lower limit of norm of weight. If lower_bound <= 0, Lower limit is not set";
        upper_bound: f64 = "-1", "Upper limit of norm of weight. If upper_bound <= 0, Upper limit is not set";
    }
}

op_params! {
    /// `_multi_lamb_update`'s and `_multi_mp_lamb_update`'s parameters.
    struct MultiLambParams<'a> => MULTI_LAMB_PARAMS {
        learning_rates: &'a [f64] = required, "List of learning rates";
        beta1: f64 = "0.9", "Exponential decay rate for the first moment estimates.";
        beta2: f64 = "0.999", "Exponential decay rate for the second moment estimates.";
        epsilon: f64 = "1e-06", "Small value to avoid division by 0.";
        wds: &'a [f64] = required, "List of Weight decays.Weight decay augments the objective function with a regularization term that penalizes large weights. The penalty scales with the square of the magnitude of each weight.";
        rescale_grad: f64 = "1", "Gradient rescaling factor";
        lower_bound: f64 = "-1", "Lower limit of norm of weight. If lower_bound <= 0, Lower limit is not set";
        upper_bound: f64 = "-1", "Upper limit of norm of weight. If upper_bound <= 0, Upper limit is not set";
        clip_gradient: f64 = "-1", CLIP_DOC;
        bias_correction: bool = "True", "Whether to use bias correction.";
        step_count: &'a [i64] = required, "Step count for each tensor";
        num_tensors: i64 = "1", "Number of tensors";
    }
}

op_params! {
    /// `_multi_adamw_update`'s and `_multi_mp_adamw_update`'s parameters.
    struct MultiAdamWParams<'a> => MULTI_ADAMW_PARAMS {
        lrs: &'a [f64] = required, "Learning rates";
        beta1: f64 = "0.9", "The decay rate for the 1st moment estimates.";
        beta2: f64 = "0.999", "The decay rate for the 2nd moment estimates.";
        epsilon: f64 = "1e-08", "A small constant for numerical stability.";
        wds: &'a [f64] = required, WD_DOC;
        etas: &'a [f64] = required, "Learning rates schedule multiplier";
        clip_gradient: f64 = "-1", CLIP_DOC;
        num_weights: i64 = "1", "Number of updated weights.";
    }
}

/// A float parameter as stock's kernels see it: a float32, widened to the arithmetic type.
fn f<R: Real>(v: f64) -> R {
    R::of(v as f32 as f64)
}

/// The gradient scale input of the AdamW operators (float32; its first element), or `None`
/// when it is 0, infinite or NaN: the update is then skipped.
fn scale(b: &TBlob) -> Option<f32> {
    let s = *b.as_slice::<f32>().first()?;
    (s.is_finite() && s != 0.0).then_some(s)
}

/// A skipped update: the output keeps the weight (stock leaves it unwritten; with the
/// frontend's `out=weight` that is the same), states unchanged.
fn skip<T: Elem>(ins: &[TBlob], out: &mut OutBlob) -> Result<()> {
    if let Some(w) = ins.first().filter(|w| w.lent_to().is_none()) {
        out.as_mut::<T>().copy_from_slice(w.as_slice::<T>());
    }
    Ok(())
}

fn scale_meta(op: &str, m: &Meta) -> Result<()> {
    if m.dtype != DType::F32 || m.size() == 0 {
        return Err(Error::type_error(format!(
            "operator {op}: rescale_grad must be a non-empty float32 array, got {} of shape {:?}",
            m.dtype.name(),
            m.shape
        )));
    }
    Ok(())
}

fn infer_adamw(op: &'static str) -> crate::op::InferFn {
    Box::new(move |_, ins| {
        let w = &ins[0];
        if !is_float(w.dtype) {
            return Err(Error::type_error(format!(
                "operator {op}: weight must be a float array, got {}",
                w.dtype.name()
            )));
        }
        for (k, m) in ins.iter().enumerate().take(4).skip(1) {
            check_same(op, w, m, k)?;
        }
        scale_meta(op, &ins[4])?;
        Ok(vec![w.clone()])
    })
}

fn infer_mp_adamw(op: &'static str) -> crate::op::InferFn {
    Box::new(move |_, ins| {
        let w = mp_group(op, &ins[..5], 0)?;
        scale_meta(op, &ins[5])?;
        Ok(vec![w])
    })
}

fn adamw(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = AdamWParams::of(cx.attrs);
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let Some(rs) = scale(&ins[4]) else { return skip::<T>(ins, &mut outs[0]) };
        let (lr, b1, b2, eps, wd, eta): (R, R, R, R, R, R) = (f(p.lr), f(p.beta1), f(p.beta2), f(p.epsilon), f(p.wd), f(p.eta));
        let (c1, c2): (R, R) = (f((1.0 - p.beta1 as f32) as f64), f((1.0 - p.beta2 as f32) as f64));
        let (rs, cl, clipping): (R, R, bool) = (f(rs as f64), f(p.clip_gradient), p.clip_gradient >= 0.0);
        update::<T, R, 2>(cx, ins, outs, |w, g, s| {
            let g = rs * g;
            let g = if clipping { clip(g, cl) } else { g };
            s[0] = b1 * s[0] + c1 * g;
            s[1] = b2 * s[1] + c2 * (g * g);
            w - eta * (lr * s[0] / (s[1].sqrt() + eps) + wd * w)
        });
    });
    Ok(())
}

fn mp_adamw(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = AdamWParams::of(cx.attrs);
    crate::dispatch_float!(ins[0].dtype, cx.attrs.op, T => {
        let Some(rs) = scale(&ins[5]) else { return skip::<T>(ins, &mut outs[0]) };
        let (lr, b1, b2, eps, wd, eta) =
            (p.lr as f32, p.beta1 as f32, p.beta2 as f32, p.epsilon as f32, p.wd as f32, p.eta as f32);
        let (cl, clipping) = (p.clip_gradient as f32, p.clip_gradient >= 0.0);
        super::optim::mp_update::<T, 3>(super::optim::views(ins, outs, 1, (0, 1, 0), [1, 2, 3]), |w, g, s| {
            let g = rs * g;
            let g = if clipping { clip(g, cl) } else { g };
            s[0] = b1 * s[0] + (1.0 - b1) * g;
            s[1] = b2 * s[1] + (1.0 - b2) * (g * g);
            w - eta * (lr * s[0] / (s[1].sqrt() + eps) + wd * w)
        });
    });
    Ok(())
}

/// The multi-weight AdamW forms' output count, within the limit inference enforces.
fn adamw_weights(a: &Attrs) -> usize {
    MultiAdamWParams::of(a).num_weights.clamp(0, MAX_WEIGHTS as i64) as usize
}

/// Inference of the multi-weight AdamW forms: `num_weights` groups of `stride` inputs
/// (weight, grad, mean, var and, `mp`, weight32), then the gradient scale.
fn infer_multi_adamw(op: &'static str, mp: bool) -> crate::op::InferFn {
    Box::new(move |a, ins| {
        let p = MultiAdamWParams::of(a);
        let Some((scale, body)) = ins.split_last() else {
            return Err(Error::value(format!("operator {op}: expects the weights' arrays, then rescale_grad")));
        };
        // As stock: the scale has the weights' type (float32 in the mixed-precision form).
        let want = if mp { DType::F32 } else { body.first().map_or(DType::F32, |w| w.dtype) };
        if scale.dtype != want || scale.size() == 0 {
            return Err(Error::type_error(format!(
                "operator {op}: rescale_grad must be a non-empty {} array, got {} of shape {:?}",
                want.name(),
                scale.dtype.name(),
                scale.shape
            )));
        }
        let lists = [("lrs", p.lrs.len()), ("wds", p.wds.len()), ("etas", p.etas.len())];
        let stride = if mp { 5 } else { 4 };
        multi_groups(op, body, ("num_weights", p.num_weights, MAX_WEIGHTS), stride, mp, &lists)
    })
}

/// The gradient scale of the multi-weight forms: the last input's first element (of any
/// float type, read as float32 as stock does), or `None` to skip the update.
fn any_scale(b: &TBlob) -> Option<f32> {
    let s = match b.dtype {
        DType::F64 => *b.as_slice::<f64>().first()? as f32,
        DType::F16 => b.as_slice::<half::f16>().first()?.to_f32(),
        _ => *b.as_slice::<f32>().first()?,
    };
    (s.is_finite() && s != 0.0).then_some(s)
}

/// The multi-weight AdamW update in stock's multi-tensor kernel form:
/// `mean = beta1 * (mean - g) + g`, `var = beta2 * (var - g^2) + g^2`,
/// `w -= eta * (lr * mean / (sqrt(var) + epsilon) + wd * w)`, in the weight's type (`mp`:
/// in float32 on the master weight).
fn multi_adamw(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], mp: bool) -> Result<()> {
    let p = MultiAdamWParams::of(cx.attrs);
    let n = adamw_weights(cx.attrs);
    let stride = if mp { 5 } else { 4 };
    let Some(rs) = any_scale(&ins[stride * n]) else {
        // Skipped: each output keeps its weight (stock leaves it unwritten).
        for i in 0..n {
            let w = &ins[stride * i];
            if w.lent_to().is_none() {
                outs[i].as_bytes_mut().copy_from_slice(w.as_bytes());
            }
        }
        return Ok(());
    };
    for i in 0..n {
        let (w, g, first) = (stride * i, stride * i + 1, n + i * (stride - 2));
        if mp {
            let (lr, b1, b2, eps, wd, eta) =
                (p.lrs[i] as f32, p.beta1 as f32, p.beta2 as f32, p.epsilon as f32, p.wds[i] as f32, p.etas[i] as f32);
            let (cl, clipping) = (p.clip_gradient as f32, p.clip_gradient >= 0.0);
            crate::dispatch_float!(ins[w].dtype, cx.attrs.op, T => {
                super::optim::mp_update::<T, 3>(views(ins, outs, n, (w, g, i), [first, first + 1, first + 2]), |w, g, s| {
                    let g = rs * g;
                    let g = if clipping { clip(g, cl) } else { g };
                    s[0] = b1 * (s[0] - g) + g;
                    s[1] = b2 * (s[1] - g * g) + g * g;
                    w - eta * (lr * s[0] / (s[1].sqrt() + eps) + wd * w)
                });
            });
        } else {
            dispatch_real!(ins[w].dtype, cx.attrs.op, T, R => {
                let (lr, b1, b2, eps, wd, eta): (R, R, R, R, R, R) =
                    (f(p.lrs[i]), f(p.beta1), f(p.beta2), f(p.epsilon), f(p.wds[i]), f(p.etas[i]));
                let (rs, cl, clipping): (R, R, bool) = (f(rs as f64), f(p.clip_gradient), p.clip_gradient >= 0.0);
                super::optim::update_one::<T, R, 2>(views(ins, outs, n, (w, g, i), [first, first + 1]), |w, g, s| {
                    let g = rs * g;
                    let g = if clipping { clip(g, cl) } else { g };
                    s[0] = b1 * (s[0] - g) + g;
                    s[1] = b2 * (s[1] - g * g) + g * g;
                    w - eta * (lr * s[0] / (s[1].sqrt() + eps) + wd * w)
                });
            });
        }
    }
    Ok(())
}

/// Phase 1's step count `t`, as the exponent of `beta^t`.
fn step(cx: &OpCtx, t: i64) -> Result<i32> {
    i32::try_from(t).map_err(|_| Error::value(format!("operator {}: t={t} is out of range", cx.attrs.op)))
}

/// LAMB's phase-1 direction from the new moments `m`, `v` and the weight `w` (bias correction
/// with `b1t = beta1^t`, `b2t = beta2^t`: the mean divided in double precision, the variance
/// in `R`, as stock's kernel does).
#[inline(always)]
fn lamb_direction<R: Real>(m: R, v: R, w: R, (b1t, b2t, eps, wd): (R, R, R, R), correct: bool) -> R {
    if correct {
        let m_hat = R::of(m.to_f64() / (1.0 - b1t.to_f64()));
        let v_hat = v / (R::of(1.0) - b2t);
        m_hat / (v_hat.sqrt() + eps) + wd * w
    } else {
        m / (v.sqrt() + eps) + wd * w
    }
}

fn lamb1(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LambOneParams::of(cx.attrs);
    let t = step(cx, p.t)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let pow = |b: f64| R::of((b as f32 as f64).powi(t));
        let k = (pow(p.beta1), pow(p.beta2), f::<R>(p.epsilon), f::<R>(p.wd));
        let (b1, b2, rs, cl, clipping): (R, R, R, R, bool) =
            (f(p.beta1), f(p.beta2), f(p.rescale_grad), f(p.clip_gradient), p.clip_gradient >= 0.0);
        let (c1, c2): (R, R) = (f((1.0 - p.beta1 as f32) as f64), f((1.0 - p.beta2 as f32) as f64));
        let correct = p.bias_correction;
        update::<T, R, 2>(cx, ins, outs, |w, g, s| {
            let g = g * rs;
            let g = if clipping { clip(g, cl) } else { g };
            s[0] = b1 * s[0] + c1 * g;
            s[1] = b2 * s[1] + c2 * g * g;
            lamb_direction(s[0], s[1], w, k, correct)
        });
    });
    Ok(())
}

fn mp_lamb1(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LambOneParams::of(cx.attrs);
    let t = step(cx, p.t)?;
    let pow = |b: f64| ((b as f32 as f64).powi(t)) as f32;
    let k = (pow(p.beta1), pow(p.beta2), p.epsilon as f32, p.wd as f32);
    let (b1, b2, rs, cl, clipping) =
        (p.beta1 as f32, p.beta2 as f32, p.rescale_grad as f32, p.clip_gradient as f32, p.clip_gradient >= 0.0);
    let correct = p.bias_correction;
    let (g_in, w32) = (&ins[1], ins[4].as_slice::<f32>());
    let [out, mean, var] = outs.get_disjoint_mut([0, 1, 2]).map_err(|_| Error::internal("lamb blobs"))?;
    crate::dispatch_float!(g_in.dtype, cx.attrs.op, T => {
        let grad = g_in.as_slice::<T>();
        par_for_zip(out.as_mut::<f32>(), [mean.as_mut::<f32>(), var.as_mut::<f32>()], Cost::MEDIUM, DType::F32, |r, o, [m, v]| {
            for (j, i) in r.enumerate() {
                let g = grad[i].to_f32() * rs;
                let g = if clipping { clip(g, cl) } else { g };
                m[j] = b1 * m[j] + (1.0 - b1) * g;
                v[j] = b2 * v[j] + (1.0 - b2) * g * g;
                o[j] = lamb_direction(m[j], v[j], w32[i], k, correct);
            }
        });
    });
    Ok(())
}

/// The trust-ratio learning rate: `lr * r1 / r2` with `r1` bounded, or `lr` when either norm
/// is zero.
fn trust_lr<R: Real>(lr: R, r1: R, r2: R, lower: f64, upper: f64) -> R {
    let mut r1 = r1;
    if lower >= 0.0 {
        let l = f::<R>(lower);
        r1 = if r1 > l { r1 } else { l };
    }
    if upper >= 0.0 {
        let u = f::<R>(upper);
        r1 = if r1 < u { r1 } else { u };
    }
    if r1 == R::of(0.0) || r2 == R::of(0.0) {
        lr
    } else {
        lr * r1 / r2
    }
}

fn lamb2(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LambTwoParams::of(cx.attrs);
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let norm = |k: usize| ins[k].as_slice::<T>().first().map(|&x| R::load(x)).ok_or_else(|| Error::value("lamb_update_phase2: an empty norm"));
        let lr = trust_lr::<R>(f(p.lr), norm(2)?, norm(3)?, p.lower_bound, p.upper_bound);
        update::<T, R, 0>(cx, ins, outs, |w, g, _| w - lr * g);
    });
    Ok(())
}

fn mp_lamb2(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LambTwoParams::of(cx.attrs);
    let norm = |k: usize| {
        ins[k].as_slice::<f32>().first().copied().ok_or_else(|| Error::value("mp_lamb_update_phase2: an empty norm"))
    };
    let lr = trust_lr::<f32>(p.lr as f32, norm(2)?, norm(3)?, p.lower_bound, p.upper_bound);
    let g = ins[1].as_slice::<f32>();
    crate::dispatch_float!(ins[0].dtype, cx.attrs.op, T => {
        // Inputs weight, g, r1, r2, weight32; writable: the output, then weight32 (mutated).
        let [out, w32] = outs.get_disjoint_mut([0, 1]).map_err(|_| Error::internal("lamb blobs"))?;
        par_for_zip(out.as_mut::<T>(), [w32.as_mut::<f32>()], Cost::MEDIUM, T::DTYPE, |r, o, [w]| {
            for (j, i) in r.enumerate() {
                w[j] -= lr * g[i];
                o[j] = T::from_f32(w[j]);
            }
        });
    });
    Ok(())
}

fn infer_lamb1(op: &'static str, mp: bool) -> crate::op::InferFn {
    Box::new(move |_, ins| {
        if !mp {
            let w = &ins[0];
            if !is_float(w.dtype) {
                return Err(Error::type_error(format!(
                    "operator {op}: weight must be a float array, got {}",
                    w.dtype.name()
                )));
            }
            for (k, m) in ins.iter().enumerate().skip(1) {
                check_same(op, w, m, k)?;
            }
            return Ok(vec![w.clone()]);
        }
        let w = mp_group(op, ins, 0)?;
        if w.dtype != DType::F16 {
            return Err(Error::type_error(format!(
                "operator {op}: weight and grad must be float16, got {}",
                w.dtype.name()
            )));
        }
        Ok(vec![Meta::new(w.shape, DType::F32)])
    })
}

fn infer_lamb2(op: &'static str, mp: bool) -> crate::op::InferFn {
    Box::new(move |_, ins| {
        let w = &ins[0];
        if !is_float(w.dtype) {
            return Err(Error::type_error(format!(
                "operator {op}: weight must be a float array, got {}",
                w.dtype.name()
            )));
        }
        let state = if mp { DType::F32 } else { w.dtype };
        let mut others = vec![(1, &ins[1])];
        if mp {
            others.push((4, &ins[4]));
        }
        for (k, m) in others {
            if m.shape != w.shape || m.dtype != state {
                return Err(Error::value(format!(
                    "operator {op}: input {k} must be {} of shape {:?} like the weight, got {} {:?}",
                    state.name(),
                    w.shape,
                    m.dtype.name(),
                    m.shape
                )));
            }
        }
        for k in [2, 3] {
            let r = &ins[k];
            if r.shape.first() != Some(&1) || r.dtype != state {
                return Err(Error::value(format!(
                    "operator {op}: input {k} (a norm) must be {} of shape (1,), got {} {:?}",
                    state.name(),
                    r.dtype.name(),
                    r.shape
                )));
            }
        }
        Ok(vec![w.clone()])
    })
}

/// The tensors of a multi-LAMB call (stock allows at most 45).
fn lamb_tensors(a: &Attrs) -> usize {
    MultiLambParams::of(a).num_tensors.clamp(0, 45) as usize
}

fn infer_multi_lamb(op: &'static str, mp: bool) -> crate::op::InferFn {
    Box::new(move |a, ins| {
        let p = MultiLambParams::of(a);
        let lists =
            [("learning_rates", p.learning_rates.len()), ("wds", p.wds.len()), ("step_count", p.step_count.len())];
        multi_groups(op, ins, ("num_tensors", p.num_tensors, 45), if mp { 5 } else { 4 }, mp, &lists)
    })
}

/// The sum of squares of an array as stock's `multi_sum_sq` takes it on the CPU: element
/// products in the array's type, added one by one into a float32.
fn sum_sq<T: Elem>(x: impl Iterator<Item = T>) -> f32 {
    let mut sum = 0f32;
    for v in x {
        sum = match T::DTYPE {
            DType::F64 => (sum as f64 + v.to_f64() * v.to_f64()) as f32,
            DType::F16 => sum + half::f16::from_f32(v.to_f32() * v.to_f32()).to_f32(),
            _ => sum + v.to_f32() * v.to_f32(),
        };
    }
    sum
}

/// One tensor of a multi-LAMB update (stock's two kernels with the norms between): `S`/`R`
/// the states' type and arithmetic (the weight's, or float32 with master weights `mp`, the
/// last state).
fn lamb_tensor<T: Elem, S: Elem, R: Real, const N: usize>(
    v: Views<'_, T, S, N>,
    p: &MultiLambParams,
    i: usize,
    mp: bool,
) {
    let Views { w, g, states, out } = v;
    let weight = |j: usize| match w {
        Operand::Input(w) => w[j],
        Operand::Output => out[j],
    };
    let n = g.len();
    let r1sq = sum_sq::<T>((0..n).map(weight));
    let c = |x: f64| R::of(x as f32 as f64);
    let (b1, b2, eps, rs) = (c(p.beta1), c(p.beta2), c(p.epsilon), c(p.rescale_grad));
    let (one, step) = (R::of(1.0), R::of(p.step_count[i] as f64));
    let (lr, wd) = (c(p.learning_rates[i]), c(p.wds[i]));
    let (cl, clipping) = (c(p.clip_gradient), p.clip_gradient >= 0.0);
    let (bc1, bc2) = (one - b1.powf(step), one - b2.powf(step));
    let mut temp = vec![0f32; n];
    for (j, t) in temp.iter_mut().enumerate() {
        let wj = if mp { R::load(states[N - 1][j]) } else { R::load(weight(j)) };
        let sg = R::load(g[j]) * rs;
        let sg = if clipping { clip(sg, cl) } else { sg };
        let m = b1 * R::load(states[0][j]) + (one - b1) * sg;
        let var = b2 * R::load(states[1][j]) + (one - b2) * sg * sg;
        states[0][j] = m.store();
        states[1][j] = var.store();
        let (m, var) = (R::load(states[0][j]), R::load(states[1][j]));
        let d = if p.bias_correction {
            (m / bc1) / ((var / bc2).sqrt() + eps) + wd * wj
        } else {
            m / (var.sqrt() + eps) + wd * wj
        };
        *t = d.to_f64() as f32;
    }
    let r2sq = sum_sq::<f32>(temp.iter().copied());
    let (mut r1, r2) = (r1sq.sqrt(), r2sq.sqrt());
    if p.lower_bound >= 0.0 {
        r1 = r1.max(p.lower_bound as f32);
    }
    if p.upper_bound >= 0.0 {
        r1 = r1.min(p.upper_bound as f32);
    }
    let r = if r1 == 0.0 || r2 == 0.0 { one } else { R::of((r1 / r2) as f64) };
    let lr = lr * r;
    for (j, &t) in temp.iter().enumerate() {
        let wj = match (mp, w) {
            (true, _) => R::load(states[N - 1][j]),
            (false, Operand::Input(w)) => R::load(w[j]),
            (false, Operand::Output) => R::load(out[j]),
        };
        let nw = wj - lr * R::of(t as f64);
        if mp {
            states[N - 1][j] = nw.store();
        }
        out[j] = nw.store();
    }
}

fn multi_lamb(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], mp: bool) -> Result<()> {
    let p = MultiLambParams::of(cx.attrs);
    let n = lamb_tensors(cx.attrs);
    let stride = if mp { 5 } else { 4 };
    for i in 0..n {
        let (w, g, first) = (stride * i, stride * i + 1, n + i * (stride - 2));
        if mp {
            crate::dispatch_float!(ins[w].dtype, cx.attrs.op, T => {
                lamb_tensor::<T, f32, f32, 3>(views(ins, outs, n, (w, g, i), [first, first + 1, first + 2]), &p, i, true)
            });
        } else {
            dispatch_real!(ins[w].dtype, cx.attrs.op, T, R => {
                lamb_tensor::<T, T, R, 2>(views(ins, outs, n, (w, g, i), [first, first + 1]), &p, i, false)
            });
        }
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for (name, mp) in [("_multi_adamw_update", false), ("_multi_mp_adamw_update", true)] {
        let stride = if mp { 5 } else { 4 };
        let (pairs, muts) = multi_tables(stride, if mp { &[2, 3, 4] } else { &[2, 3] });
        let kernel: crate::op::ComputeFn = if mp {
            Box::new(|cx, i, o| multi_adamw(cx, i, o, true))
        } else {
            Box::new(|cx, i, o| multi_adamw(cx, i, o, false))
        };
        ops.push(
            OpDef::new(name, Inputs::Variadic("data"), infer_multi_adamw(name, mp), kernel)
                .params(MULTI_ADAMW_PARAMS)
                .outputs(adamw_weights, adamw_weights)
                .inplace(pairs)
                .mutates(muts)
                .doc(format!("{name}: AdamW update of num_weights weights in one call (inputs: weight, grad, mean, var{} per weight, then rescale_grad). If rescale_grad is NaN, Inf, or 0, the update is skipped.", if mp { ", weight32" } else { "" })),
        );
    }
    for (name, mp) in [("_multi_lamb_update", false), ("_multi_mp_lamb_update", true)] {
        let stride = if mp { 5 } else { 4 };
        let (pairs, muts) = multi_tables(stride, if mp { &[2, 3, 4] } else { &[2, 3] });
        const { assert!(MAX_WEIGHTS >= 45, "the in-place and mutation tables cover 45 tensors") };
        let kernel: crate::op::ComputeFn = if mp {
            Box::new(|cx, i, o| multi_lamb(cx, i, o, true))
        } else {
            Box::new(|cx, i, o| multi_lamb(cx, i, o, false))
        };
        ops.push(
            OpDef::new(name, Inputs::Variadic("data"), infer_multi_lamb(name, mp), kernel)
                .params(MULTI_LAMB_PARAMS)
                .outputs(lamb_tensors, lamb_tensors)
                .inplace(pairs)
                .mutates(muts)
                .doc(format!("{name}: LAMB update of num_tensors tensors in one call (inputs: weight, grad, mean, var{} per tensor).", if mp { ", weight32" } else { "" })),
        );
    }
    type Kernel = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;
    #[allow(clippy::type_complexity)]
    let table: Vec<(&'static str, &'static [&'static str], crate::op::InferFn, Kernel, &'static [ParamSpec], &'static [(usize, usize)], &'static [usize], &str)> = vec![
        ("_adamw_update", &["weight", "grad", "mean", "var", "rescale_grad"], infer_adamw("_adamw_update"), adamw,
         ADAMW_PARAMS, &[(0, 0)], &[2, 3],
         "Update function for AdamW optimizer (weight decay decoupled from the gradient step). If rescale_grad is NaN, Inf, or 0, the update is skipped."),
        ("_mp_adamw_update", &["weight", "grad", "mean", "var", "weight32", "rescale_grad"], infer_mp_adamw("_mp_adamw_update"),
         mp_adamw, ADAMW_PARAMS, &[(0, 0)], &[2, 3, 4],
         "Update function for multi-precision AdamW optimizer. If rescale_grad is NaN, Inf, or 0, the update is skipped."),
        ("lamb_update_phase1", &["weight", "grad", "mean", "var"], infer_lamb1("lamb_update_phase1", false), lamb1,
         LAMB1_PARAMS, &[], &[2, 3],
         "Phase I of lamb update: updates the moments and returns the update direction g."),
        ("mp_lamb_update_phase1", &["weight", "grad", "mean", "var", "weight32"], infer_lamb1("mp_lamb_update_phase1", true),
         mp_lamb1, LAMB1_PARAMS, &[], &[2, 3],
         "Mixed Precision version of Phase I of lamb update: returns the float32 direction g."),
        ("lamb_update_phase2", &["weight", "g", "r1", "r2"], infer_lamb2("lamb_update_phase2", false), lamb2,
         LAMB2_PARAMS, &[(0, 0)], &[],
         "Phase II of lamb update: weight - lr * r1 / r2 * g (lr alone when a norm is 0)."),
        ("mp_lamb_update_phase2", &["weight", "g", "r1", "r2", "weight32"], infer_lamb2("mp_lamb_update_phase2", true),
         mp_lamb2, LAMB2_PARAMS, &[(0, 0)], &[4],
         "Mixed Precision version of Phase II of lamb update: updates weight32 and writes it to the output."),
    ];
    for (name, inputs, infer, kernel, params, inplace, mutates, doc) in table {
        ops.push(
            OpDef::new(name, Inputs::Fixed(inputs), infer, Box::new(kernel))
                .params(params)
                .inplace(inplace)
                .mutates(mutates)
                .doc(doc),
        );
    }
}
