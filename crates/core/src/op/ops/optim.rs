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
use crate::op::param::{op_params, Attrs, ParamSpec};
use crate::op::tensor::{Elem, Operand, OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// The arithmetic type of a kernel: f32 (for float32 and float16 storage) or f64.
pub(super) trait Real:
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
    fn to_f64(self) -> f64;
    fn sqrt(self) -> Self;
    fn powf(self, e: Self) -> Self;
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
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn powf(self, e: Self) -> Self {
        f32::powf(self, e)
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
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn powf(self, e: Self) -> Self {
        f64::powf(self, e)
    }
}

/// `max(min(x, c), -c)`: stock's gradient clip (applied when `c >= 0`).
#[inline(always)]
pub(super) fn clip<R: Real>(x: R, c: R) -> R {
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
pub(super) struct Views<'a, T, S, const N: usize> {
    pub(super) w: Operand<'a, T>,
    pub(super) g: &'a [T],
    pub(super) states: [&'a mut [S]; N],
    pub(super) out: &'a mut [T],
}

/// The [`Views`] of one weight: inputs `w` and `g`, output `o` (of `nout` outputs) and the
/// writable blobs `states` (indices into `outs`, past the outputs: mutated inputs come after
/// them).
pub(super) fn views<'a, T: Elem, S: Elem, const N: usize>(
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
pub(super) fn update<T: Elem, R: Real, const N: usize>(
    _cx: &OpCtx,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    f: impl Fn(R, R, &mut [R; N]) -> R + Sync + Send,
) {
    update_one::<T, R, N>(views(ins, outs, 1, (0, 1, 0), std::array::from_fn(|k| 1 + k)), f)
}

/// [`update`] of one weight's views.
pub(super) fn update_one<T: Elem, R: Real, const N: usize>(
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
/// `x` rounded to float32: stock declares the optimizers' scalars (`lr`, `wd`, `momentum`,
/// `rescale_grad`, `clip_gradient`, ...) as `float`, so a float64 weight is updated with the
/// float32 value of a learning rate such as 0.1.
pub(super) fn f32r(x: f64) -> f64 {
    x as f32 as f64
}

struct Common {
    lr: f64,
    wd: f64,
    rescale: f64,
    clip: f64,
}

/// The [`Common`] scalars of a parameter struct that has `lr`, `wd`, `rescale_grad` and a
/// clip field (`clip_gradient` unless named).
macro_rules! common {
    ($p:expr) => {
        common!($p, clip_gradient)
    };
    ($p:expr, $clip:ident) => {{
        let p = &$p;
        Common { lr: f32r(p.lr), wd: f32r(p.wd), rescale: f32r(p.rescale_grad), clip: f32r(p.$clip) }
    }};
}

const WD_DOC: &str = "Weight decay augments the objective function with a regularization term that penalizes large weights. The penalty scales with the square of the magnitude of each weight.";
const RESCALE_DOC: &str = "Rescale gradient to grad = rescale_grad*grad.";
const CLIP_DOC: &str = "Clip gradient to the range of [-clip_gradient, clip_gradient] If clip_gradient <= 0, gradient clipping is turned off. grad = max(min(grad, clip_gradient), -clip_gradient).";
const MOMENTUM_DOC: &str = "The decay rate of momentum estimates at each epoch.";
const LAZY_DOC: &str = "If true, lazy updates are applied if gradient's stype is row_sparse.";
const EPS_DOC: &str = "A small constant for numerical stability.";
const CLIP_WEIGHTS_DOC: &str = "Clip weights to the range of [-clip_weights, clip_weights] If clip_weights <= 0, weight clipping is turned off. weights = max(min(weights, clip_weights), -clip_weights).";

op_params! {
    /// `sgd_update`'s and `mp_sgd_update`'s parameters.
    struct SgdParams<'a> => SGD_PARAMS {
        lr: f64 = required, "Learning rate";
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        lazy_update: bool = "True", LAZY_DOC;
    }
}

op_params! {
    /// `sgd_mom_update`'s and `mp_sgd_mom_update`'s parameters.
    struct SgdMomParams<'a> => SGD_MOM_PARAMS {
        lr: f64 = required, "Learning rate";
        momentum: f64 = "0", MOMENTUM_DOC;
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        lazy_update: bool = "True", LAZY_DOC;
    }
}

op_params! {
    /// `nag_mom_update`'s and `mp_nag_mom_update`'s parameters.
    struct NagParams<'a> => NAG_PARAMS {
        lr: f64 = required, "Learning rate";
        momentum: f64 = "0", MOMENTUM_DOC;
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
    }
}

op_params! {
    /// `signsgd_update`'s parameters.
    struct SignsgdParams<'a> => SIGNSGD_PARAMS {
        lr: f64 = required, "Learning rate";
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
    }
}

op_params! {
    /// `signum_update`'s parameters.
    struct SignumParams<'a> => SIGNUM_PARAMS {
        lr: f64 = required, "Learning rate";
        momentum: f64 = "0", MOMENTUM_DOC;
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        wd_lh: f64 = "0", "The amount of weight decay that does not go into gradient/momentum calculationsotherwise do weight decay algorithmically only.";
    }
}

op_params! {
    /// `adam_update`'s parameters.
    struct AdamParams<'a> => ADAM_PARAMS {
        lr: f64 = required, "Learning rate";
        beta1: f64 = "0.9", "The decay rate for the 1st moment estimates.";
        beta2: f64 = "0.999", "The decay rate for the 2nd moment estimates.";
        epsilon: f64 = "1e-08", EPS_DOC;
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        lazy_update: bool = "True", LAZY_DOC;
    }
}

op_params! {
    /// `rmsprop_update`'s parameters.
    struct RmspropParams<'a> => RMSPROP_PARAMS {
        lr: f64 = required, "Learning rate";
        gamma1: f64 = "0.95", "The decay rate of momentum estimates.";
        epsilon: f64 = "1e-08", EPS_DOC;
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        clip_weights: f64 = "-1", CLIP_WEIGHTS_DOC;
    }
}

op_params! {
    /// `rmspropalex_update`'s parameters.
    struct RmspropalexParams<'a> => RMSPROPALEX_PARAMS {
        lr: f64 = required, "Learning rate";
        gamma1: f64 = "0.95", "Decay rate.";
        gamma2: f64 = "0.9", "Decay rate.";
        epsilon: f64 = "1e-08", EPS_DOC;
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        clip_weights: f64 = "-1", CLIP_WEIGHTS_DOC;
    }
}

op_params! {
    /// `ftml_update`'s parameters (its clip is named `clip_grad`).
    struct FtmlParams<'a> => FTML_PARAMS {
        lr: f64 = required, "Learning rate.";
        beta1: f64 = "0.6", "Generally close to 0.5.";
        beta2: f64 = "0.999", "Generally close to 1.";
        epsilon: f64 = "1e-08", "Epsilon to prevent div 0.";
        t: i64 = required, "Number of update.";
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_grad: f64 = "-1", CLIP_DOC;
    }
}

op_params! {
    /// `multi_sgd_update`'s and `multi_mp_sgd_update`'s parameters.
    struct MultiSgdParams<'a> => MULTI_SGD_PARAMS {
        lrs: &'a [f64] = required, "Learning rates.";
        wds: &'a [f64] = required, WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        num_weights: i64 = "1", "Number of updated weights.";
    }
}

op_params! {
    /// `multi_sgd_mom_update`'s and `multi_mp_sgd_mom_update`'s parameters.
    struct MultiSgdMomParams<'a> => MULTI_SGD_MOM_PARAMS {
        lrs: &'a [f64] = required, "Learning rates.";
        wds: &'a [f64] = required, WD_DOC;
        momentum: f64 = "0", MOMENTUM_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
        num_weights: i64 = "1", "Number of updated weights.";
    }
}

op_params! {
    /// `ftrl_update`'s parameters.
    struct FtrlParams<'a> => FTRL_PARAMS {
        lr: f64 = required, "Learning rate";
        lamda1: f64 = "0.01", "The L1 regularization coefficient.";
        beta: f64 = "1", "Per-Coordinate Learning Rate beta.";
        wd: f64 = "0", WD_DOC;
        rescale_grad: f64 = "1", RESCALE_DOC;
        clip_gradient: f64 = "-1", CLIP_DOC;
    }
}

fn sgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    sgd_core(cx.attrs.op, ins, outs, 1, 0, &common!(SgdParams::of(cx.attrs)), None)
}

fn sgd_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = SgdMomParams::of(cx.attrs);
    sgd_core(cx.attrs.op, ins, outs, 1, 0, &common!(p), Some(p.momentum))
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
                let m = R::of(f32r(m));
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
pub(super) fn mp_update<T: Elem, const M: usize>(
    v: Views<'_, T, f32, M>,
    f: impl Fn(f32, f32, &mut [f32]) -> f32 + Sync + Send,
) {
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

fn mp_sgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    mp_sgd_core(cx.attrs.op, ins, outs, (1, 0), &common!(SgdParams::of(cx.attrs)), None, false)
}

fn mp_sgd_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = SgdMomParams::of(cx.attrs);
    mp_sgd_core(cx.attrs.op, ins, outs, (1, 0), &common!(p), Some(p.momentum), false)
}

fn mp_nag_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = NagParams::of(cx.attrs);
    mp_sgd_core(cx.attrs.op, ins, outs, (1, 0), &common!(p), Some(p.momentum), true)
}

/// The parameters of a multi-weight call, from either table (with or without momentum).
struct Multi<'a> {
    lrs: &'a [f64],
    wds: &'a [f64],
    rescale: f64,
    clip: f64,
    momentum: Option<f64>,
    num_weights: i64,
}

impl<'a> Multi<'a> {
    fn of(a: &'a Attrs, momentum: bool) -> Self {
        if momentum {
            let p = MultiSgdMomParams::of(a);
            let (lrs, wds, rescale, clip) = (p.lrs, p.wds, p.rescale_grad, p.clip_gradient);
            Multi { lrs, wds, rescale, clip, momentum: Some(p.momentum), num_weights: p.num_weights }
        } else {
            let p = MultiSgdParams::of(a);
            let (lrs, wds, rescale, clip) = (p.lrs, p.wds, p.rescale_grad, p.clip_gradient);
            Multi { lrs, wds, rescale, clip, momentum: None, num_weights: p.num_weights }
        }
    }

    /// The output count: `num_weights`, within stock's limit (inference refuses the rest).
    fn outputs(&self) -> usize {
        self.num_weights.clamp(0, MAX_WEIGHTS as i64) as usize
    }
}

/// The multi-weight SGD forms: `num_weights` groups of `stride` inputs (weight, grad, then
/// mom and/or the float32 master weight), one output per weight, per-weight `lrs` and `wds`.
fn multi_sgd(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], momentum: bool, mp: bool) -> Result<()> {
    let a = cx.attrs;
    let p = Multi::of(a, momentum);
    let (m, nout) = (p.momentum, p.outputs());
    for i in 0..nout {
        let c = Common { lr: f32r(p.lrs[i]), wd: f32r(p.wds[i]), rescale: f32r(p.rescale), clip: f32r(p.clip) };
        if mp {
            mp_sgd_core(a.op, ins, outs, (nout, i), &c, m, false)?;
        } else {
            sgd_core(a.op, ins, outs, nout, i, &c, m)?;
        }
    }
    Ok(())
}

fn nag_mom(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = NagParams::of(cx.attrs);
    let (c, m) = (common!(p), f32r(p.momentum));
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
    let p = AdamParams::of(cx.attrs);
    let (c, b1, b2, eps) = (common!(p), f32r(p.beta1), f32r(p.beta2), f32r(p.epsilon));
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
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
    let p = RmspropParams::of(cx.attrs);
    let (c, g1, eps, cw) = (common!(p), f32r(p.gamma1), f32r(p.epsilon), f32r(p.clip_weights));
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
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
    let p = RmspropalexParams::of(cx.attrs);
    let (c, g1, g2, eps, cw) = (common!(p), f32r(p.gamma1), f32r(p.gamma2), f32r(p.epsilon), f32r(p.clip_weights));
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
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
    let c = common!(SignsgdParams::of(cx.attrs));
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (lr, wd) = (R::of(c.lr), R::of(c.wd));
        let decay = R::of(1.0) - lr * wd;
        update::<T, R, 0>(cx, ins, outs, |w, g, _| decay * w - lr * sign(g));
    });
    Ok(())
}

fn signum(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = SignumParams::of(cx.attrs);
    let (c, m, wd_lh) = (common!(p), f32r(p.momentum), f32r(p.wd_lh));
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
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
    let p = FtmlParams::of(cx.attrs);
    // FTML's epsilon is stock's one `double` optimizer scalar.
    let (c, b1, b2, eps, t) = (common!(p, clip_grad), f32r(p.beta1), f32r(p.beta2), p.epsilon, p.t as f64);
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
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
    let p = FtrlParams::of(cx.attrs);
    let (c, l1, beta) = (common!(p), f32r(p.lamda1), f32r(p.beta));
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
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
pub(super) const MAX_WEIGHTS: usize = 60;

pub(super) fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16)
}

/// Inference of one mixed-precision group: weight and gradient alike (a float type), then
/// float32 arrays of the same shape.
pub(super) fn mp_group(op: &str, ins: &[Meta], base: usize) -> Result<Meta> {
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

fn multi_infer(op: &'static str, stride: usize, momentum: bool, mp: bool) -> crate::op::InferFn {
    Box::new(move |a, ins| {
        let p = Multi::of(a, momentum);
        let lists = [("lrs", p.lrs.len()), ("wds", p.wds.len())];
        multi_groups(op, ins, ("num_weights", p.num_weights, MAX_WEIGHTS), stride, mp, &lists)
    })
}

/// Inference of a multi-weight update: `count` (its parameter's name, value and stock's
/// limit) groups of `stride` inputs, each per-weight list of `lists` (name, length) holding
/// one value per weight, and each group a weight with its like-typed arrays (or, `mp`, a
/// mixed-precision group). One output per weight, like it.
pub(super) fn multi_groups(
    op: &str,
    ins: &[Meta],
    (count, n, max): (&str, i64, usize),
    stride: usize,
    mp: bool,
    lists: &[(&str, usize)],
) -> Result<Vec<Meta>> {
    if n < 1 || n as usize > max {
        return Err(Error::value(format!("operator {op}: {count} must be in [1, {max}], got {n}")));
    }
    let n = n as usize;
    if ins.len() != stride * n {
        return Err(Error::value(format!(
            "operator {op}: expects {} inputs for {count}={n}, got {}",
            stride * n,
            ins.len()
        )));
    }
    for &(key, len) in lists {
        if len != n {
            return Err(Error::value(format!("operator {op}: {key} has {len} values, expected {count}={n}")));
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
}

/// `(input, output)` pairs and mutated inputs of the multi-weight forms, for their largest call.
pub(super) fn multi_tables(stride: usize, states: &[usize]) -> (&'static [(usize, usize)], &'static [usize]) {
    let pairs: Vec<(usize, usize)> = (0..MAX_WEIGHTS).map(|i| (stride * i, i)).collect();
    let muts: Vec<usize> = (0..MAX_WEIGHTS).flat_map(|i| states.iter().map(move |k| stride * i + k)).collect();
    (Box::leak(pairs.into_boxed_slice()), Box::leak(muts.into_boxed_slice()))
}

/// SGD without momentum on a GPU: weight `x`, gradient `y`; `p0..p3` are lr, wd,
/// rescale_grad and clip_gradient (< 0: none), in the CPU kernel's order of operations.
const SGD_GPU: &str =
    "p3 >= T(0) ? (T(1) - p0 * p1) * x - p0 * mx_clip(p2 * y, p3) : (T(1) - p0 * p1) * x - (p0 * p2) * y";

fn register_sgd_variants(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "mp_sgd_update",
            Inputs::Fixed(&["weight", "grad", "weight32"]),
            mp_infer("mp_sgd_update"),
            Box::new(mp_sgd),
        )
        .params(SGD_PARAMS)
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
        .params(SGD_MOM_PARAMS)
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
    type Form = (&'static str, usize, &'static [usize], bool, bool, Kernel, fn(&Attrs) -> usize);
    let plain: fn(&Attrs) -> usize = |a| Multi::of(a, false).outputs();
    let with_mom: fn(&Attrs) -> usize = |a| Multi::of(a, true).outputs();
    let table: &[Form] = &[
        ("multi_sgd_update", 2, &[], false, false, |cx, i, o| multi_sgd(cx, i, o, false, false), plain),
        ("multi_sgd_mom_update", 3, &[2], true, false, |cx, i, o| multi_sgd(cx, i, o, true, false), with_mom),
        ("multi_mp_sgd_update", 3, &[2], false, true, |cx, i, o| multi_sgd(cx, i, o, false, true), plain),
        ("multi_mp_sgd_mom_update", 4, &[2, 3], true, true, |cx, i, o| multi_sgd(cx, i, o, true, true), with_mom),
    ];
    for &(name, stride, states, momentum, mp, kernel, outputs) in table {
        let (pairs, muts) = multi_tables(stride, states);
        let params = if momentum { MULTI_SGD_MOM_PARAMS } else { MULTI_SGD_PARAMS };
        let mut def =
            OpDef::new(name, Inputs::Variadic("data"), multi_infer(name, stride, momentum, mp), Box::new(kernel))
                .params(params)
                .outputs(outputs, outputs)
                .inplace(pairs)
                .mutates(muts)
                .doc(format!(
                    "{name}: SGD update of num_weights weights in one call (inputs: weight, grad, ... per weight)."
                ));
        if name == "multi_sgd_update" {
            def = def.gpu(crate::op::gpu::GpuKernel::MultiMap2P(SGD_GPU, |a| {
                let m = Multi::of(a, false);
                (0..m.outputs()).map(|i| [m.lrs[i], m.wds[i], m.rescale, m.clip]).collect()
            }));
        }
        ops.push(def);
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
        let mut def = OpDef::new(name, Inputs::Fixed(inputs), all_same(name), Box::new(kernel))
            .alias(aliases)
            .params(params)
            .inplace(&[(0, 0)])
            .mutates(mutates)
            .doc(doc);
        if name == "sgd_update" {
            def = def.gpu(crate::op::gpu::GpuKernel::Map2P(SGD_GPU, |a| {
                let c = common!(SgdParams::of(a));
                [c.lr, c.wd, c.rescale, c.clip]
            }));
        }
        ops.push(def);
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
