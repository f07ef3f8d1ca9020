//! Optimizer update operators: `sgd_update`, `sgd_mom_update`, `nag_mom_update`,
//! `adam_update`, `rmsprop_update`, `rmspropalex_update`, `signsgd_update`, `signum_update`,
//! `ftml_update`, `ftrl_update`.
//!
//! Each takes the weight, the gradient and its state arrays, writes the new weight into its
//! output (the frontend passes `out=weight`, declared in place) and updates the states in
//! place (declared mutated). Dense storage only. Arithmetic runs in the storage precision
//! (float16 in float32), element by element, like stock's kernels.

use super::common::all_same;
use super::nn::dispatch_real;
use crate::dispatch_float;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_zip, Cost};
use crate::op::param::{Attrs, PType, ParamSpec};
use crate::op::tensor::{Elem, Operand, OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// The arithmetic type of a kernel: f32 (for float32 and float16 storage) or f64.
trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    fn of(v: f64) -> Self;
    fn load<T: Elem>(v: T) -> Self;
    fn store<T: Elem>(self) -> T;
}

impl Real for f32 {
    #[inline(always)]
    fn of(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn load<T: Elem>(v: T) -> Self {
        v.to_f32()
    }
    #[inline(always)]
    fn store<T: Elem>(self) -> T {
        T::from_f32(self)
    }
}

impl Real for f64 {
    #[inline(always)]
    fn of(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn load<T: Elem>(v: T) -> Self {
        v.to_f64()
    }
    #[inline(always)]
    fn store<T: Elem>(self) -> T {
        T::from_f64(self)
    }
}

/// `max(min(x, c), -c)`: stock's gradient clip (applied when `c >= 0`).
#[inline(always)]
fn clip<R: Real>(x: R, c: R) -> R {
    let x = if x > c { c } else { x };
    let m = -c;
    if x < m {
        m
    } else {
        x
    }
}

/// `1`, `-1` or `0` by the sign of `x`.
#[inline(always)]
fn sign<R: Real>(x: R) -> R {
    let zero = R::of(0.0);
    if x > zero {
        R::of(1.0)
    } else if x < zero {
        R::of(-1.0)
    } else {
        zero
    }
}

/// One weight's arrays as an update kernel sees them: the weight (possibly lent to the output
/// in place), the gradient, `N` states (mutated inputs, written) and the output.
struct Views<'a, T, S, const N: usize> {
    w: Operand<'a, T>,
    g: &'a [T],
    states: [&'a mut [S]; N],
    out: &'a mut [T],
}

/// The [`Views`] of one weight: inputs `w` and `g`, output `o` (of `nout` outputs) and the
/// writable blobs `states` (indices into `outs`, past the outputs: mutated inputs come after
/// them).
fn views<'a, T: Elem, S: Elem, const N: usize>(
    ins: &'a [TBlob],
    outs: &'a mut [OutBlob],
    nout: usize,
    (w, g, o): (usize, usize, usize),
    states: [usize; N],
) -> Views<'a, T, S, N> {
    let (head, tail) = outs.split_at_mut(nout);
    let states = tail.get_disjoint_mut(states.map(|k| k - nout)).expect("distinct state blobs");
    let ([w], out) = head[o].operands::<T, 1>(o, [&ins[w]]);
    Views { w, g: ins[g].as_slice(), states: states.map(|b| b.as_mut::<S>()), out }
}

/// Run `f(weight, grad, states) -> new weight` over every element: inputs are the weight, the
/// gradient and `N` states (mutated inputs, updated in place); output 0 gets the new weight
/// (it may be the weight itself, declared in place).
fn update<T: Elem, R: Real, const N: usize>(
    _cx: &OpCtx,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    f: impl Fn(R, R, &mut [R; N]) -> R + Sync + Send,
) {
    update_one::<T, R, N>(views(ins, outs, 1, (0, 1, 0), std::array::from_fn(|k| 1 + k)), f)
}

/// [`update`] of one weight's views.
fn update_one<T: Elem, R: Real, const N: usize>(
    v: Views<'_, T, T, N>,
    f: impl Fn(R, R, &mut [R; N]) -> R + Sync + Send,
) {
    let (w, g) = (v.w, v.g);
    par_for_zip(v.out, v.states, Cost::MEDIUM, T::DTYPE, |r, out, states| {
        for (j, i) in r.enumerate() {
            let mut s: [R; N] = std::array::from_fn(|k| R::load(states[k][j]));
            let wi = match w {
                Operand::Input(w) => w[i],
                Operand::Output => out[j],
            };
            let nw = f(R::load(wi), R::load(g[i]), &mut s);
            for k in 0..N {
                states[k][j] = s[k].store();
            }
            out[j] = nw.store();
        }
    });
}

/// The common scalars: learning rate, weight decay, gradient rescale and clip.
struct Common {
    lr: f64,
    wd: f64,
    rescale: f64,
    clip: f64,
}

fn common(a: &Attrs, clip_name: &str) -> Common {
    Common { lr: a.float("lr"), wd: a.float("wd"), rescale: a.float("rescale_grad"), clip: a.float(clip_name) }
}

const LR: ParamSpec = ParamSpec::req("lr", PType::Float, "Learning rate");
const WD: ParamSpec = ParamSpec::opt(
    "wd",
    PType::Float,
    "0",
    "Weight decay augments the objective function with a regularization term that penalizes large weights. The penalty scales with the square of the magnitude of each weight.",
);
const RESCALE: ParamSpec =
    ParamSpec::opt("rescale_grad", PType::Float, "1", "Rescale gradient to grad = rescale_grad*grad.");
const CLIP: ParamSpec = ParamSpec::opt(
    "clip_gradient",
    PType::Float,
    "-1",
    "Clip gradient to the range of [-clip_gradient, clip_gradient] If clip_gradient <= 0, gradient clipping is turned off. grad = max(min(grad, clip_gradient), -clip_gradient).",
);
const MOMENTUM: ParamSpec =
    ParamSpec::opt("momentum", PType::Float, "0", "The decay rate of momentum estimates at each epoch.");
const LAZY: ParamSpec = ParamSpec::opt(
    "lazy_update",
    PType::Bool,
    "True",
    "If true, lazy updates are applied if gradient's stype is row_sparse.",
);
const EPS: ParamSpec = ParamSpec::opt("epsilon", PType::Float, "1e-08", "A small constant for numerical stability.");
const CLIP_WEIGHTS: ParamSpec = ParamSpec::opt(
    "clip_weights",
    PType::Float,
    "-1",
    "Clip weights to the range of [-clip_weights, clip_weights] If clip_weights <= 0, weight clipping is turned off. weights = max(min(weights, clip_weights), -clip_weights).",
);

const SGD_PARAMS: &[ParamSpec] = &[LR, WD, RESCALE, CLIP, LAZY];
const SGD_MOM_PARAMS: &[ParamSpec] = &[LR, MOMENTUM, WD, RESCALE, CLIP, LAZY];
const NAG_PARAMS: &[ParamSpec] = &[LR, MOMENTUM, WD, RESCALE, CLIP];
const SIGNSGD_PARAMS: &[ParamSpec] = &[LR, WD, RESCALE, CLIP];
const SIGNUM_PARAMS: &[ParamSpec] = &[
    LR,
    MOMENTUM,
    WD,
    RESCALE,
    CLIP,
    ParamSpec::opt("wd_lh", PType::Float, "0", "The amount of weight decay that does not go into gradient/momentum calculationsotherwise do weight decay algorithmically only."),
];
const ADAM_PARAMS: &[ParamSpec] = &[
    LR,
    ParamSpec::opt("beta1", PType::Float, "0.9", "The decay rate for the 1st moment estimates."),
    ParamSpec::opt("beta2", PType::Float, "0.999", "The decay rate for the 2nd moment estimates."),
    EPS,
    WD,
    RESCALE,
    CLIP,
    LAZY,
];
const RMSPROP_PARAMS: &[ParamSpec] = &[
    LR,
    ParamSpec::opt("gamma1", PType::Float, "0.95", "The decay rate of momentum estimates."),
    EPS,
    WD,
    RESCALE,
    CLIP,
    CLIP_WEIGHTS,
];
const RMSPROPALEX_PARAMS: &[ParamSpec] = &[
    LR,
    ParamSpec::opt("gamma1", PType::Float, "0.95", "Decay rate."),
    ParamSpec::opt("gamma2", PType::Float, "0.9", "Decay rate."),
    EPS,
    WD,
    RESCALE,
    CLIP,
    CLIP_WEIGHTS,
];
const FTML_PARAMS: &[ParamSpec] = &[
    ParamSpec::req("lr", PType::Float, "Learning rate."),
    ParamSpec::opt("beta1", PType::Float, "0.6", "Generally close to 0.5."),
    ParamSpec::opt("beta2", PType::Float, "0.999", "Generally close to 1."),
    ParamSpec::opt("epsilon", PType::Float, "1e-08", "Epsilon to prevent div 0."),
    ParamSpec::req("t", PType::Int, "Number of update."),
    WD,
    RESCALE,
    ParamSpec::opt(
        "clip_grad",
        PType::Float,
        "-1",
        "Clip gradient to the range of [-clip_gradient, clip_gradient] If clip_gradient <= 0, gradient clipping is turned off. grad = max(min(grad, clip_gradient), -clip_gradient).",
    ),
];
const MP_SGD_PARAMS: &[ParamSpec] = &[LR, WD, RESCALE, CLIP, LAZY];
const MP_SGD_MOM_PARAMS: &[ParamSpec] = &[LR, MOMENTUM, WD, RESCALE, CLIP, LAZY];
const LRS: ParamSpec = ParamSpec::req("lrs", PType::FloatTuple, "Learning rates.");
const WDS: ParamSpec = ParamSpec::req(
    "wds",
    PType::FloatTuple,
    "Weight decay augments the objective function with a regularization term that penalizes large weights. The penalty scales with the square of the magnitude of each weight.",
);
const NUM_WEIGHTS: ParamSpec = ParamSpec::opt("num_weights", PType::Int, "1", "Number of updated weights.");
const MULTI_SGD_PARAMS: &[ParamSpec] = &[LRS, WDS, RESCALE, CLIP, NUM_WEIGHTS];
const MULTI_SGD_MOM_PARAMS: &[ParamSpec] = &[LRS, WDS, MOMENTUM, RESCALE, CLIP, NUM_WEIGHTS];

const FTRL_PARAMS: &[ParamSpec] = &[
    LR,
    ParamSpec::opt("lamda1", PType::Float, "0.01", "The L1 regularization coefficient."),
    ParamSpec::opt("beta", PType::Float, "1", "Per-Coordinate Learning Rate beta."),
    WD,
    RESCALE,
    CLIP,
];

fn sgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    sgd_core(cx.attrs.op, ins, outs, 1, 0, &c, None)
}

fn sgd_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    sgd_core(cx.attrs.op, ins, outs, 1, 0, &c, Some(cx.attrs.float("momentum")))
}

/// SGD of weight `i` (of `nout`), with momentum (`ins` = weight, grad, mom per weight) or
/// without; its momentum is writable blob `nout + i`.
fn sgd_core(
    op: &str,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    nout: usize,
    i: usize,
    c: &Common,
    momentum: Option<f64>,
) -> Result<()> {
    let stride = 2 + momentum.is_some() as usize;
    let (w, g) = (stride * i, stride * i + 1);
    dispatch_real!(ins[0].dtype, op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let clipping = c.clip >= 0.0;
        match momentum {
            None => {
                let decay = R::of(1.0) - lr * wd;
                if clipping {
                    update_one::<T, R, 0>(views(ins, outs, nout, (w, g, i), []), |w, g, _| decay * w - lr * clip(rs * g, cl));
                } else {
                    update_one::<T, R, 0>(views(ins, outs, nout, (w, g, i), []), |w, g, _| decay * w - (lr * rs) * g);
                }
            }
            Some(m) => {
                let m = R::of(m);
                update_one::<T, R, 1>(views(ins, outs, nout, (w, g, i), [nout + i]), |w, g, s| {
                    let g = if clipping { clip(rs * g, cl) } else { rs * g };
                    s[0] = m * s[0] - lr * wd * w - lr * g;
                    w + s[0]
                });
            }
        }
    });
    Ok(())
}

/// Mixed-precision update of one weight: the gradient (the weight's type, the weight itself
/// is not read), `M - 1` float32 states, then the float32 master weight (all `M` writable);
/// `f(w32, g, states)` gives the new master weight, which is also written (converted) to the
/// output.
fn mp_update<T: Elem, const M: usize>(v: Views<'_, T, f32, M>, f: impl Fn(f32, f32, &mut [f32]) -> f32 + Sync + Send) {
    let g = v.g;
    par_for_zip(v.out, v.states, Cost::MEDIUM, T::DTYPE, |r, o, st| {
        for (j, i) in r.enumerate() {
            let mut s: [f32; M] = std::array::from_fn(|k| st[k][j]);
            let nw = f(s[M - 1], g[i].to_f32(), &mut s[..M - 1]);
            s[M - 1] = nw;
            for k in 0..M {
                st[k][j] = s[k];
            }
            o[j] = T::from_f32(nw);
        }
    });
}

/// Mixed-precision SGD (`momentum`: with a float32 momentum state) or NAG (`nag`).
/// Mixed-precision SGD of weight `i` (of `nout`; inputs weight, grad, [mom], weight32 per
/// weight; writable blobs past the outputs: [mom], weight32 per weight).
fn mp_sgd_core(
    op: &str,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    (nout, i): (usize, usize),
    c: &Common,
    momentum: Option<f64>,
    nag: bool,
) -> Result<()> {
    let stride = 3 + momentum.is_some() as usize;
    let (w, g) = (stride * i, stride * i + 1);
    let first = nout + i * (stride - 2);
    let (lr, wd, rs, cl) = (c.lr as f32, c.wd as f32, c.rescale as f32, c.clip as f32);
    let clipping = c.clip >= 0.0;
    let grad = move |g: f32| if clipping { clip(rs * g, cl) } else { rs * g };
    dispatch_float!(ins[0].dtype, op, T => {
        match (momentum, nag) {
            (None, _) => {
                mp_update::<T, 1>(views(ins, outs, nout, (w, g, i), [first]), |w, g, _| (1.0 - lr * wd) * w - lr * grad(g))
            }
            (Some(m), false) => {
                let m = m as f32;
                mp_update::<T, 2>(views(ins, outs, nout, (w, g, i), [first, first + 1]), |w, g, s| {
                    s[0] = m * s[0] - lr * wd * w - lr * grad(g);
                    w + s[0]
                })
            }
            (Some(m), true) => {
                let m = m as f32;
                mp_update::<T, 2>(views(ins, outs, nout, (w, g, i), [first, first + 1]), |w, g, s| {
                    let step = lr * (grad(g) + wd * w);
                    s[0] *= m;
                    let nw = w - s[0] + (m + 1.0) * (s[0] - step);
                    s[0] -= step;
                    nw
                })
            }
        }
    });
    Ok(())
}

/// The single-weight mixed-precision forms: SGD, with momentum, or NAG.
fn mp_single(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], momentum: bool, nag: bool) -> Result<()> {
    let m = momentum.then(|| cx.attrs.float("momentum"));
    mp_sgd_core(cx.attrs.op, ins, outs, (1, 0), &common(cx.attrs, "clip_gradient"), m, nag)
}

fn mp_sgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    mp_single(cx, ins, outs, false, false)
}

fn mp_sgd_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    mp_single(cx, ins, outs, true, false)
}

fn mp_nag_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    mp_single(cx, ins, outs, true, true)
}

/// The multi-weight SGD forms: `num_weights` groups of `stride` inputs (weight, grad, then
/// mom and/or the float32 master weight), one output per weight, per-weight `lrs` and `wds`.
fn multi_sgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], momentum: bool, mp: bool) -> Result<()> {
    let a = cx.attrs;
    let m = if momentum { Some(a.float("momentum")) } else { None };
    let nout = num_weights(a);
    for i in 0..nout {
        let c = Common {
            lr: a.floats("lrs")[i],
            wd: a.floats("wds")[i],
            rescale: a.float("rescale_grad"),
            clip: a.float("clip_gradient"),
        };
        if mp {
            mp_sgd_core(a.op, ins, outs, (nout, i), &c, m, false)?;
        } else {
            sgd_core(a.op, ins, outs, nout, i, &c, m)?;
        }
    }
    Ok(())
}

fn nag_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    let m = cx.attrs.float("momentum");
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (lr, wd, rs, cl, m) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip), R::of(m));
        let clipping = c.clip >= 0.0;
        update::<T, R, 1>(cx, ins, outs, |w, g, s| {
            let g = if clipping { clip(rs * g, cl) } else { rs * g };
            let step = lr * (g + wd * w);
            s[0] *= m;
            let nw = w - s[0] + (m + R::of(1.0)) * (s[0] - step);
            s[0] -= step;
            nw
        });
    });
    Ok(())
}

fn adam(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    let a = cx.attrs;
    let (b1, b2, eps) = (a.float("beta1"), a.float("beta2"), a.float("epsilon"));
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let (b1, b2, eps, one) = (R::of(b1), R::of(b2), R::of(eps), R::of(1.0));
        let clipping = c.clip >= 0.0;
        update::<T, R, 2>(cx, ins, outs, |w, g, s| {
            let g = g * rs + w * wd;
            let g = if clipping { clip(g, cl) } else { g };
            s[0] = b1 * s[0] + (one - b1) * g;
            s[1] = b2 * s[1] + (one - b2) * g * g;
            w - lr * s[0] / (s[1].sqrt() + eps)
        });
    });
    Ok(())
}

fn rmsprop(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    let a = cx.attrs;
    let (g1, eps, cw) = (a.float("gamma1"), a.float("epsilon"), a.float("clip_weights"));
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let (g1, eps, cwr, one) = (R::of(g1), R::of(eps), R::of(cw), R::of(1.0));
        let (clipping, clip_w) = (c.clip >= 0.0, cw >= 0.0);
        update::<T, R, 1>(cx, ins, outs, |w, g, s| {
            let g = rs * g + wd * w;
            let g = if clipping { clip(g, cl) } else { g };
            s[0] = (one - g1) * (g * g) + g1 * s[0];
            let nw = w - lr * (g / (s[0] + eps).sqrt());
            if clip_w { clip(nw, cwr) } else { nw }
        });
    });
    Ok(())
}

fn rmspropalex(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    let a = cx.attrs;
    let (g1, g2, eps, cw) = (a.float("gamma1"), a.float("gamma2"), a.float("epsilon"), a.float("clip_weights"));
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let (g1, g2, eps, cwr, one) = (R::of(g1), R::of(g2), R::of(eps), R::of(cw), R::of(1.0));
        let (clipping, clip_w) = (c.clip >= 0.0, cw >= 0.0);
        update::<T, R, 3>(cx, ins, outs, |w, g, s| {
            let g = rs * g + wd * w;
            let g = if clipping { clip(g, cl) } else { g };
            s[0] = (one - g1) * g * g + g1 * s[0];
            s[1] = (one - g1) * g + g1 * s[1];
            s[2] = g2 * s[2] - lr * g / (s[0] - s[1] * s[1] + eps).sqrt();
            let nw = w + s[2];
            if clip_w { clip(nw, cwr) } else { nw }
        });
    });
    Ok(())
}

fn signsgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    // Like stock, clip_gradient and rescale_grad do not change the sign of the gradient.
    let c = common(cx.attrs, "clip_gradient");
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (lr, wd) = (R::of(c.lr), R::of(c.wd));
        let decay = R::of(1.0) - lr * wd;
        update::<T, R, 0>(cx, ins, outs, |w, g, _| decay * w - lr * sign(g));
    });
    Ok(())
}

fn signum(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    let a = cx.attrs;
    let (m, wd_lh) = (a.float("momentum"), a.float("wd_lh"));
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let (m, one) = (R::of(m), R::of(1.0));
        let decay = one - lr * R::of(wd_lh);
        let clipping = c.clip >= 0.0;
        update::<T, R, 1>(cx, ins, outs, |w, g, s| {
            let g = if clipping { clip(rs * g, cl) } else { rs * g };
            s[0] = m * s[0] - (one - m) * wd * w - (one - m) * g;
            decay * w + lr * sign(s[0])
        });
    });
    Ok(())
}

fn ftml(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_grad");
    let a = cx.attrs;
    let (b1, b2, eps, t) = (a.float("beta1"), a.float("beta2"), a.float("epsilon"), a.int("t") as f64);
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let (b1, b2, eps, t, one) = (R::of(b1), R::of(b2), R::of(eps), R::of(t), R::of(1.0));
        let (c1, c2) = (one - b1.powf(t), one - b2.powf(t));
        let clipping = c.clip >= 0.0;
        update::<T, R, 3>(cx, ins, outs, |w, g, s| {
            let g = rs * g + wd * w;
            let g = if clipping { clip(g, cl) } else { g };
            // s: d, v, z.
            s[1] = b2 * s[1] + (one - b2) * g * g;
            let d = c1 / lr * ((s[1] / c2).sqrt() + eps);
            s[2] = b1 * s[2] + (one - b1) * g - (d - b1 * s[0]) * w;
            s[0] = d;
            -s[2] / d
        });
    });
    Ok(())
}

fn ftrl(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let c = common(cx.attrs, "clip_gradient");
    let a = cx.attrs;
    let (l1, beta) = (a.float("lamda1"), a.float("beta"));
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let (lr, wd, rs, cl) = (R::of(c.lr), R::of(c.wd), R::of(c.rescale), R::of(c.clip));
        let (l1, beta, zero) = (R::of(l1), R::of(beta), R::of(0.0));
        let clipping = c.clip >= 0.0;
        update::<T, R, 2>(cx, ins, outs, |w, g, s| {
            let g = if clipping { clip(g * rs, cl) } else { g * rs };
            // s: z, n.
            s[0] = s[0] + g - ((s[1] + g * g).sqrt() - s[1].sqrt()) * w / lr;
            s[1] += g * g;
            if s[0].abs() > l1 {
                (sign(s[0]) * l1 - s[0]) / ((beta + s[1].sqrt()) / lr + wd)
            } else {
                zero
            }
        });
    });
    Ok(())
}

type Kernel = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;

/// The most weights one multi-weight call takes (stock's limit).
const MAX_WEIGHTS: usize = 60;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16)
}

/// Inference of one mixed-precision group: weight and gradient alike (a float type), then
/// float32 arrays of the same shape.
fn mp_group(op: &str, ins: &[Meta], base: usize) -> Result<Meta> {
    let w = &ins[base];
    if !is_float(w.dtype) {
        return Err(Error::type_error(format!(
            "operator {op}: weight must be float16, float32 or float64, got {}",
            w.dtype.name()
        )));
    }
    super::common::check_same(op, w, &ins[base + 1], base + 1)?;
    for (k, m) in ins.iter().enumerate().skip(base + 2) {
        if m.shape != w.shape {
            return Err(Error::value(format!(
                "operator {op}: input {k} has shape {:?}, expected {:?} like the weight",
                m.shape, w.shape
            )));
        }
        if m.dtype != DType::F32 {
            return Err(Error::type_error(format!(
                "operator {op}: input {k} (a float32 state) has dtype {}",
                m.dtype.name()
            )));
        }
    }
    Ok(w.clone())
}

fn mp_infer(op: &'static str) -> crate::op::InferFn {
    Box::new(move |_, ins| Ok(vec![mp_group(op, ins, 0)?]))
}

fn num_weights(a: &Attrs) -> usize {
    a.int("num_weights").clamp(0, MAX_WEIGHTS as i64) as usize
}

fn multi_infer(op: &'static str, stride: usize, mp: bool) -> crate::op::InferFn {
    Box::new(move |a, ins| {
        let n = a.int("num_weights");
        if n < 1 || n as usize > MAX_WEIGHTS {
            return Err(Error::value(format!("operator {op}: num_weights must be in [1, {MAX_WEIGHTS}], got {n}")));
        }
        let n = n as usize;
        if ins.len() != stride * n {
            return Err(Error::value(format!(
                "operator {op}: expects {} inputs for num_weights={n}, got {}",
                stride * n,
                ins.len()
            )));
        }
        for key in ["lrs", "wds"] {
            if a.floats(key).len() != n {
                return Err(Error::value(format!(
                    "operator {op}: {key} has {} values, expected num_weights={n}",
                    a.floats(key).len()
                )));
            }
        }
        (0..n)
            .map(|i| {
                let group = &ins[stride * i..stride * (i + 1)];
                if mp {
                    return mp_group(op, group, 0);
                }
                if !is_float(group[0].dtype) {
                    return Err(Error::type_error(format!(
                        "operator {op}: weight {i} must be float16, float32 or float64, got {}",
                        group[0].dtype.name()
                    )));
                }
                for (k, m) in group.iter().enumerate().skip(1) {
                    super::common::check_same(op, &group[0], m, stride * i + k)?;
                }
                Ok(group[0].clone())
            })
            .collect()
    })
}

/// `(input, output)` pairs and mutated inputs of the multi-weight forms, for their largest call.
fn multi_tables(stride: usize, states: &[usize]) -> (&'static [(usize, usize)], &'static [usize]) {
    let pairs: Vec<(usize, usize)> = (0..MAX_WEIGHTS).map(|i| (stride * i, i)).collect();
    let muts: Vec<usize> = (0..MAX_WEIGHTS).flat_map(|i| states.iter().map(move |k| stride * i + k)).collect();
    (Box::leak(pairs.into_boxed_slice()), Box::leak(muts.into_boxed_slice()))
}

fn register_sgd_variants(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "mp_sgd_update",
            Inputs::Fixed(&["weight", "grad", "weight32"]),
            mp_infer("mp_sgd_update"),
            Box::new(mp_sgd),
        )
        .params(MP_SGD_PARAMS)
        .inplace(&[(0, 0)])
        .mutates(&[2])
        .doc("Updater function for multi-precision sgd optimizer"),
    );
    ops.push(
        OpDef::new(
            "mp_sgd_mom_update",
            Inputs::Fixed(&["weight", "grad", "mom", "weight32"]),
            mp_infer("mp_sgd_mom_update"),
            Box::new(mp_sgd_mom),
        )
        .params(MP_SGD_MOM_PARAMS)
        .inplace(&[(0, 0)])
        .mutates(&[2, 3])
        .doc("Updater function for multi-precision sgd optimizer"),
    );
    ops.push(
        OpDef::new(
            "mp_nag_mom_update",
            Inputs::Fixed(&["weight", "grad", "mom", "weight32"]),
            mp_infer("mp_nag_mom_update"),
            Box::new(mp_nag_mom),
        )
        .params(NAG_PARAMS)
        .inplace(&[(0, 0)])
        .mutates(&[2, 3])
        .doc("Update function for multi-precision Nesterov Accelerated Gradient( NAG) optimizer."),
    );
    type Multi = (&'static str, usize, &'static [usize], bool, &'static [ParamSpec], Kernel);
    let table: &[Multi] = &[
        ("multi_sgd_update", 2, &[], false, MULTI_SGD_PARAMS, |cx, i, o| multi_sgd(cx, i, o, false, false)),
        ("multi_sgd_mom_update", 3, &[2], false, MULTI_SGD_MOM_PARAMS, |cx, i, o| multi_sgd(cx, i, o, true, false)),
        ("multi_mp_sgd_update", 3, &[2], true, MULTI_SGD_PARAMS, |cx, i, o| multi_sgd(cx, i, o, false, true)),
        ("multi_mp_sgd_mom_update", 4, &[2, 3], true, MULTI_SGD_MOM_PARAMS, |cx, i, o| multi_sgd(cx, i, o, true, true)),
    ];
    for &(name, stride, states, mp, params, kernel) in table {
        let (pairs, muts) = multi_tables(stride, states);
        ops.push(
            OpDef::new(name, Inputs::Variadic("data"), multi_infer(name, stride, mp), Box::new(kernel))
                .params(params)
                .outputs(num_weights, num_weights)
                .inplace(pairs)
                .mutates(muts)
                .doc(format!(
                    "{name}: SGD update of num_weights weights in one call (inputs: weight, grad, ... per weight)."
                )),
        );
    }
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    #[allow(clippy::type_complexity)]
    let table: &[(
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
        &'static [ParamSpec],
        &'static [usize],
        Kernel,
        &str,
    )] = &[
        (
            "sgd_update",
            &["_sparse_sgd_update"],
            &["weight", "grad"],
            SGD_PARAMS,
            &[],
            sgd,
            "Update function for Stochastic Gradient Descent (SGD) optimizer.",
        ),
        (
            "sgd_mom_update",
            &["_sparse_sgd_mom_update"],
            &["weight", "grad", "mom"],
            SGD_MOM_PARAMS,
            &[2],
            sgd_mom,
            "Momentum update function for Stochastic Gradient Descent (SGD) optimizer.",
        ),
        (
            "nag_mom_update",
            &[],
            &["weight", "grad", "mom"],
            NAG_PARAMS,
            &[2],
            nag_mom,
            "Update function for Nesterov Accelerated Gradient( NAG) optimizer.",
        ),
        (
            "adam_update",
            &["_sparse_adam_update"],
            &["weight", "grad", "mean", "var"],
            ADAM_PARAMS,
            &[2, 3],
            adam,
            "Update function for Adam optimizer.",
        ),
        (
            "rmsprop_update",
            &[],
            &["weight", "grad", "n"],
            RMSPROP_PARAMS,
            &[2],
            rmsprop,
            "Update function for RMSProp optimizer (Tieleman & Hinton, 2012).",
        ),
        (
            "rmspropalex_update",
            &[],
            &["weight", "grad", "n", "g", "delta"],
            RMSPROPALEX_PARAMS,
            &[2, 3, 4],
            rmspropalex,
            "Update function for RMSPropAlex optimizer (Graves, 2013).",
        ),
        (
            "signsgd_update",
            &[],
            &["weight", "grad"],
            SIGNSGD_PARAMS,
            &[],
            signsgd,
            "Update function for SignSGD optimizer.",
        ),
        (
            "signum_update",
            &[],
            &["weight", "grad", "mom"],
            SIGNUM_PARAMS,
            &[2],
            signum,
            "SIGN momentUM (Signum) optimizer.",
        ),
        (
            "ftml_update",
            &[],
            &["weight", "grad", "d", "v", "z"],
            FTML_PARAMS,
            &[2, 3, 4],
            ftml,
            "The FTML optimizer described in FTML - Follow the Moving Leader in Deep Learning.",
        ),
        (
            "ftrl_update",
            &["_sparse_ftrl_update"],
            &["weight", "grad", "z", "n"],
            FTRL_PARAMS,
            &[2, 3],
            ftrl,
            "Update function for Ftrl optimizer.",
        ),
    ];
    for &(name, aliases, inputs, params, mutates, kernel, doc) in table {
        ops.push(
            OpDef::new(name, Inputs::Fixed(inputs), all_same(name), Box::new(kernel))
                .alias(aliases)
                .params(params)
                .inplace(&[(0, 0)])
                .mutates(mutates)
                .doc(doc),
        );
    }
    register_sgd_variants(ops);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_and_sign() {
        assert_eq!(clip(3.0f32, 1.0), 1.0);
        assert_eq!(clip(-3.0f64, 1.0), -1.0);
        assert_eq!(clip(0.5f32, 1.0), 0.5);
        assert_eq!(clip(0.5f32, 0.0), 0.0);
        assert_eq!(sign(-0.1f32), -1.0);
        assert_eq!(sign(0.0f64), 0.0);
    }
}
