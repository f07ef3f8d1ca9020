//! The LARS optimizer's fused operators: `multi_lars` (per-weight learning rates scaled by
//! the LARS trust ratio, from precomputed sums of squares) and the `preloaded_multi_*`
//! SGD forms, whose per-weight learning rates and weight decays are float32 arrays (the last
//! two inputs) rather than parameters, so that `multi_lars`' output feeds them without a trip
//! through the host.
//!
//! Arithmetic follows stock's kernels: the new momentum is
//! `momentum * mom - lr * wd * w - lr * grad` in the master type (`lr * wd` a float32 product),
//! and the weight `w + mom`.

use super::nn::dispatch_real;
use super::optim::{clip, mp_update, multi_groups, multi_tables, update_one, views, Real, MAX_WEIGHTS};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};

const RESCALE_DOC: &str = "Rescale gradient to grad = rescale_grad*grad.";
const CLIP_DOC: &str = "Clip gradient to the range of [-clip_gradient, clip_gradient] If clip_gradient <= 0, gradient clipping is turned off. grad = max(min(grad, clip_gradient), -clip_gradient).";

op_params! {
    /// `preloaded_multi_sgd_update`'s and `preloaded_multi_mp_sgd_update`'s parameters.
    struct PreloadedParams<'a> => PRELOADED_PARAMS {
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        num_weights: i64 = "1", "Number of updated weights.";
    }
}

op_params! {
    /// The momentum forms' parameters.
    struct PreloadedMomParams<'a> => PRELOADED_MOM_PARAMS {
        momentum: f64 = "0", "The decay rate of momentum estimates at each epoch.";
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        num_weights: i64 = "1", "Number of updated weights.";
    }
}

op_params! {
    /// `multi_lars`' parameters.
    struct LarsParams<'a> => LARS_PARAMS {
        eta: f64 = required, "LARS eta";
        eps: f64 = required, "LARS eps";
        rescale_grad: f64 = "1", "Gradient rescaling factor";
    }
}

/// A preloaded call's scalars: momentum (0 without), rescale, clip (< 0: none), weight count.
struct Preloaded {
    momentum: f64,
    rescale: f64,
    clip: f64,
    num_weights: i64,
}

impl Preloaded {
    fn of(a: &Attrs, momentum: bool) -> Self {
        if momentum {
            let p = PreloadedMomParams::of(a);
            Preloaded {
                momentum: p.momentum,
                rescale: p.rescale_grad,
                clip: p.clip_gradient,
                num_weights: p.num_weights,
            }
        } else {
            let p = PreloadedParams::of(a);
            Preloaded { momentum: 0.0, rescale: p.rescale_grad, clip: p.clip_gradient, num_weights: p.num_weights }
        }
    }

    /// The output count, within the limit inference enforces.
    fn outputs(&self) -> usize {
        self.num_weights.clamp(0, MAX_WEIGHTS as i64) as usize
    }
}

/// Inference: `num_weights` groups of `stride` inputs, then `lrs` and `wds` (float32, one
/// value per weight).
fn infer_preloaded(op: &'static str, stride: usize, momentum: bool, mp: bool) -> crate::op::InferFn {
    Box::new(move |a, ins| {
        let p = Preloaded::of(a, momentum);
        let Some(body) = ins.len().checked_sub(2) else {
            return Err(Error::value(format!("operator {op}: expects the weights' arrays, then lrs and wds")));
        };
        for (name, m) in [("lrs", &ins[body]), ("wds", &ins[body + 1])] {
            if m.dtype != DType::F32 {
                return Err(Error::type_error(format!(
                    "operator {op}: {name} must be float32, got {}",
                    m.dtype.name()
                )));
            }
        }
        let lists = [("lrs", ins[body].size()), ("wds", ins[body + 1].size())];
        multi_groups(op, &ins[..body], ("num_weights", p.num_weights, MAX_WEIGHTS), stride, mp, &lists)
    })
}

fn preloaded(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], momentum: bool, mp: bool) -> Result<()> {
    let op = cx.attrs.op;
    let p = Preloaded::of(cx.attrs, momentum);
    let n = p.outputs();
    let stride = 2 + momentum as usize + mp as usize;
    let states = momentum as usize + mp as usize;
    let (lrs, wds) = (ins[stride * n].as_slice::<f32>(), ins[stride * n + 1].as_slice::<f32>());
    for i in 0..n {
        let (w, g, first) = (stride * i, stride * i + 1, n + i * states);
        let (lr, lw) = (lrs[i], lrs[i] * wds[i]);
        if mp {
            let (m, rs, cl) = (p.momentum as f32, p.rescale as f32, p.clip as f32);
            let grad = move |g: f32| if cl >= 0.0 { clip(rs * g, cl) } else { rs * g };
            crate::dispatch_float!(ins[w].dtype, op, T => {
                if momentum {
                    mp_update::<T, 2>(views(ins, outs, n, (w, g, i), [first, first + 1]), |w, g, s| {
                        s[0] = m * s[0] - lw * w - lr * grad(g);
                        w + s[0]
                    })
                } else {
                    mp_update::<T, 1>(views(ins, outs, n, (w, g, i), [first]), |w, g, _| w + (-(lw * w) - lr * grad(g)))
                }
            });
        } else {
            dispatch_real!(ins[w].dtype, op, T, R => {
                let (m, rs, cl, lr, lw) = (R::of(p.momentum as f32 as f64), R::of(p.rescale as f32 as f64),
                    R::of(p.clip as f32 as f64), R::of(lr as f64), R::of(lw as f64));
                let clipping = p.clip >= 0.0;
                let grad = move |g: R| if clipping { clip(rs * g, cl) } else { rs * g };
                if momentum {
                    update_one::<T, R, 1>(views(ins, outs, n, (w, g, i), [first]), |w, g, s| {
                        s[0] = m * s[0] - lw * w - lr * grad(g);
                        w + s[0]
                    })
                } else {
                    update_one::<T, R, 0>(views(ins, outs, n, (w, g, i), []), |w, g, _| w + (-(lw * w) - lr * grad(g)))
                }
            });
        }
    }
    Ok(())
}

fn infer_lars(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    for (k, m) in ins.iter().enumerate() {
        if m.dtype != DType::F32 {
            return Err(Error::type_error(format!(
                "operator multi_lars: input {k} must be float32, got {}",
                m.dtype.name()
            )));
        }
        super::common::check_same("multi_lars", &ins[0], m, k)?;
    }
    Ok(vec![ins[0].clone()])
}

/// `lr * eta * |w| / (|g| * rescale_grad + wd * |w| + eps)` per weight, or `lr` where either
/// norm is 0, as stock's kernel (float32, `sqrtf`).
fn lars(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = LarsParams::of(cx.attrs);
    let (eta, eps, rs) = (p.eta as f32, p.eps as f32, p.rescale_grad as f32);
    let [lrs, wss, gss, wds] = [0, 1, 2, 3].map(|k| ins[k].as_slice::<f32>());
    for (i, o) in outs[0].as_mut::<f32>().iter_mut().enumerate() {
        let w_norm = wss[i].sqrt();
        *o = if w_norm > 0.0 && gss[i] > 0.0 {
            lrs[i] * eta * w_norm / (gss[i].sqrt() * rs + wds[i] * w_norm + eps)
        } else {
            lrs[i]
        };
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    type Form = (&'static str, usize, &'static [usize], bool, bool, fn(&Attrs) -> usize, &'static str);
    let table: &[Form] = &[
        ("preloaded_multi_sgd_update", 2, &[], false, false, |a| Preloaded::of(a, false).outputs(),
         "Update function for Stochastic Gradient Descent (SDG) optimizer.\n\nIt updates the weights using::\n\n weight = weight - learning_rate * (gradient + wd * weight)\n"),
        ("preloaded_multi_sgd_mom_update", 3, &[2], true, false, |a| Preloaded::of(a, true).outputs(),
         "Momentum update function for Stochastic Gradient Descent (SGD) optimizer.\n\nIt updates the weights using::\n\n  v = momentum * v - learning_rate * gradient\n  weight += v\n"),
        ("preloaded_multi_mp_sgd_update", 3, &[2], false, true, |a| Preloaded::of(a, false).outputs(),
         "Update function for multi-precision Stochastic Gradient Descent (SDG) optimizer.\n\nIt updates the weights using::\n\n weight = weight - learning_rate * (gradient + wd * weight)\n"),
        ("preloaded_multi_mp_sgd_mom_update", 4, &[2, 3], true, true, |a| Preloaded::of(a, true).outputs(),
         "Momentum update function for multi-precision Stochastic Gradient Descent (SGD) optimizer.\n\nIt updates the weights using::\n\n  v = momentum * v - learning_rate * gradient\n  weight += v\n"),
    ];
    for &(name, stride, states, momentum, mp, outputs, doc) in table {
        let (pairs, muts) = multi_tables(stride, states);
        let kernel: crate::op::ComputeFn = Box::new(move |cx, i, o| preloaded(cx, i, o, momentum, mp));
        ops.push(
            OpDef::new(name, Inputs::Variadic("data"), infer_preloaded(name, stride, momentum, mp), kernel)
                .params(if momentum { PRELOADED_MOM_PARAMS } else { PRELOADED_PARAMS })
                .outputs(outputs, outputs)
                .inplace(pairs)
                .mutates(muts)
                .doc(format!("{doc}\nInputs: weight, grad{} per weight, then lrs and wds (float32 arrays of num_weights values).",
                    match (momentum, mp) { (false, false) => "", (true, false) => ", mom", (false, true) => ", weight32", (true, true) => ", mom, weight32" })),
        );
    }
    ops.push(
        OpDef::new(
            "multi_lars",
            Inputs::Fixed(&["lrs", "weights_sum_sq", "grads_sum_sq", "wds"]),
            Box::new(infer_lars),
            Box::new(lars),
        )
        .params(LARS_PARAMS)
        .elementwise_shape()
        .doc("Compute the LARS coefficients of multiple weights and grads from their sums of square"),
    );
}
