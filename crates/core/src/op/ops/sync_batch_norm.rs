//! `_contrib_SyncBatchNorm` on one device (`ndev=1`, what Gluon's `SyncBatchNorm` asks for
//! without GPUs) and the legacy `BatchNorm_v1`: batch normalisation over axis 1 with stock's
//! arithmetic for these two, which differs from `BatchNorm`'s: the saved statistics are the
//! mean and the variance (SyncBatchNorm's `E[x^2] - E[x]^2`, BatchNorm_v1's
//! `E[(x - mean)^2]`), and the moving statistics are updated in the backward pass. A larger
//! `ndev` (statistics shared across devices through a barrier) answers NotImplementedError.

use super::nn::{float_only, read_f64, read_out_f64, write_f64};
use crate::dispatch_float;
use crate::error::{Error, Result};
use crate::op::param::{op_params, Attrs, ParamSpec};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    /// `_contrib_SyncBatchNorm`'s parameters.
    struct SyncBnParams<'a> => SYNC_BN_PARAMS {
        eps: f64 = "0.001", "Epsilon to prevent div 0";
        momentum: f64 = "0.9", "Momentum for moving average";
        fix_gamma: bool = "True", "Fix gamma while training";
        use_global_stats: bool = "False", "Whether use global moving statistics instead of local batch-norm. This will force change batch-norm into a scale shift operator.";
        output_mean_var: bool = "False", "Output All,normal mean and var";
        ndev: i64 = "1", "The count of GPU devices";
        key: &'a str = required, "Hash key for synchronization, please set the same hash key for same layer, Block.prefix is typically used as in :class:`gluon.nn.contrib.SyncBatchNorm`.";
    }
}

op_params! {
    /// `BatchNorm_v1`'s parameters.
    struct BnV1Params<'a> => BN_V1_PARAMS {
        eps: f64 = "0.001", "Epsilon to prevent div 0";
        momentum: f64 = "0.9", "Momentum for moving average";
        fix_gamma: bool = "True", "Fix gamma while training";
        use_global_stats: bool = "False", "Whether use global moving statistics instead of local batch-norm. This will force change batch-norm into a scale shift operator.";
        output_mean_var: bool = "False", "Output All,normal mean and var";
    }
}

const OP: &str = "_contrib_SyncBatchNorm";

/// The parameters both operators share, and which variance formula the call uses.
struct Common {
    eps: f64,
    momentum: f64,
    fix_gamma: bool,
    use_global_stats: bool,
    output_mean_var: bool,
    /// `E[(x - mean)^2]` (BatchNorm_v1) rather than `E[x^2] - E[x]^2`.
    two_pass: bool,
}

impl Common {
    fn of(a: &Attrs) -> Self {
        if a.declares(BN_V1_PARAMS) {
            let p = BnV1Params::of(a);
            let (eps, momentum, fix_gamma) = (p.eps, p.momentum, p.fix_gamma);
            let (use_global_stats, output_mean_var) = (p.use_global_stats, p.output_mean_var);
            Common { eps, momentum, fix_gamma, use_global_stats, output_mean_var, two_pass: true }
        } else {
            let p = SyncBnParams::of(a);
            let (eps, momentum, fix_gamma) = (p.eps, p.momentum, p.fix_gamma);
            let (use_global_stats, output_mean_var) = (p.use_global_stats, p.output_mean_var);
            Common { eps, momentum, fix_gamma, use_global_stats, output_mean_var, two_pass: false }
        }
    }
}

fn three(_: &Attrs) -> usize {
    3
}

fn visible(a: &Attrs) -> usize {
    if Common::of(a).output_mean_var {
        3
    } else {
        1
    }
}

fn check_ndev(a: &Attrs) -> Result<()> {
    if a.declares(BN_V1_PARAMS) {
        return Ok(());
    }
    let n = SyncBnParams::of(a).ndev;
    if n != 1 {
        return Err(Error::not_supported(format!("{OP} across devices (ndev={n})")));
    }
    Ok(())
}

/// (batch, channels, spatial size) of data as stock views it: channels on axis 1 (1 for 1-D
/// data), everything after it one spatial axis.
fn geometry(shape: &[usize]) -> (usize, usize, usize) {
    let n = shape.first().copied().unwrap_or(1);
    let c = shape.get(1).copied().unwrap_or(1);
    (n, c, shape.iter().skip(2).product())
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    check_ndev(a)?;
    let (op, x) = (a.op, &ins[0]);
    float_only(op, x.dtype)?;
    if x.shape.is_empty() {
        return Err(Error::value(format!("operator {op}: data must have at least one dimension")));
    }
    let c = geometry(&x.shape).1;
    for (i, name) in [(1, "gamma"), (2, "beta"), (3, "moving_mean"), (4, "moving_var")] {
        if ins[i].shape != [c] {
            return Err(Error::value(format!("operator {op}: {name} has shape {:?}, expected ({c},)", ins[i].shape)));
        }
        float_only(op, ins[i].dtype)?;
    }
    let stat = Meta::new(vec![c], ins[1].dtype);
    Ok(vec![x.clone(), stat.clone(), stat])
}

fn param_shapes(_: &Attrs, data: &[i64], n_inputs: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let c = data.get(1).copied().unwrap_or(1);
    Ok((1..n_inputs).map(|k| (k, vec![c])).collect())
}

/// Per channel: Σ f(element) over the batch and spatial axes.
fn channel_sums((n, c, s): (usize, usize, usize), f: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    let mut out = vec![0.0; c];
    for b in 0..n {
        for (ch, o) in out.iter_mut().enumerate() {
            let base = (b * c + ch) * s;
            *o += (base..base + s).map(|i| f(i, ch)).sum::<f64>();
        }
    }
    out
}

fn store(op: &str, out: &mut OutBlob, v: impl Fn(usize) -> f64) -> Result<()> {
    dispatch_float!(out.dtype, op, T => {
        for (i, o) in out.as_mut::<T>().iter_mut().enumerate() {
            *o = T::from_f64(v(i));
        }
    });
    Ok(())
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    check_ndev(cx.attrs)?;
    let p = Common::of(cx.attrs);
    let geom @ (n, c, s) = geometry(&ins[0].shape);
    let x = read_f64(cx.attrs.op, &ins[0])?;
    let gamma = if p.fix_gamma { vec![1.0; c] } else { read_f64(cx.attrs.op, &ins[1])? };
    let beta = read_f64(cx.attrs.op, &ins[2])?;
    let ch = |i: usize| (i / s.max(1)) % c.max(1);
    if cx.is_train && !p.use_global_stats {
        let scale = 1.0 / (n * s).max(1) as f64;
        let mean: Vec<f64> = channel_sums(geom, |i, _| x[i]).iter().map(|v| v * scale).collect();
        let var: Vec<f64> = if p.two_pass {
            channel_sums(geom, |i, j| (x[i] - mean[j]) * (x[i] - mean[j])).iter().map(|v| v * scale).collect()
        } else {
            let ex2 = channel_sums(geom, |i, _| x[i] * x[i]);
            ex2.iter().zip(&mean).map(|(e, m)| e * scale - m * m).collect()
        };
        let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + p.eps).sqrt()).collect();
        store(cx.attrs.op, &mut outs[0], |i| gamma[ch(i)] * (x[i] - mean[ch(i)]) * inv[ch(i)] + beta[ch(i)])?;
        write_f64(cx.attrs.op, &mut outs[1], &mean)?;
        write_f64(cx.attrs.op, &mut outs[2], &var)?;
    } else {
        // The moving statistics are the mutated inputs: writable blobs 3 and 4.
        let (mm, mv) = (read_out_f64(cx.attrs.op, &outs[3])?, read_out_f64(cx.attrs.op, &outs[4])?);
        let k: Vec<f64> = (0..c).map(|j| gamma[j] / (mv[j] + p.eps).sqrt()).collect();
        store(cx.attrs.op, &mut outs[0], |i| {
            k[ch(i)] * x[i] + (beta[ch(i)] - gamma[ch(i)] * mm[ch(i)] / (mv[ch(i)] + p.eps).sqrt())
        })?;
        write_f64(cx.attrs.op, &mut outs[1], &mm)?;
        write_f64(cx.attrs.op, &mut outs[2], &mv)?;
    }
    Ok(())
}

/// `_backward_SyncBatchNorm(dy[, dmean, dvar], data, gamma, beta, moving_mean, moving_var,
/// y, mean, var) -> (ddata, dgamma, dbeta, 0, 0)`; in training it also updates the moving
/// statistics (writable blobs 5 and 6) from the saved batch statistics.
fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = Common::of(cx.attrs);
    let nv = ins.len() - 8;
    let geom @ (n, c, s) = geometry(&ins[nv].shape);
    let (dy, x) = (read_f64(cx.attrs.op, &ins[0])?, read_f64(cx.attrs.op, &ins[nv])?);
    let gamma = if p.fix_gamma { vec![1.0; c] } else { read_f64(cx.attrs.op, &ins[nv + 1])? };
    let ch = |i: usize| (i / s.max(1)) % c.max(1);
    let training = cx.is_train && !p.use_global_stats;
    let (mean, var) = if training {
        let (mean, var) = (read_f64(cx.attrs.op, &ins[nv + 6])?, read_f64(cx.attrs.op, &ins[nv + 7])?);
        let (mm, mv) = (read_out_f64(cx.attrs.op, &outs[5])?, read_out_f64(cx.attrs.op, &outs[6])?);
        // Stock's momentum is a float, and so is its `1 - momentum`.
        let m = super::optim::f32r(p.momentum);
        let keep = (1.0f32 - m as f32) as f64;
        let new_mm: Vec<f64> = mm.iter().zip(&mean).map(|(o, b)| o * m + b * keep).collect();
        let new_mv: Vec<f64> = mv.iter().zip(&var).map(|(o, b)| o * m + b * keep).collect();
        write_f64(cx.attrs.op, &mut outs[5], &new_mm)?;
        write_f64(cx.attrs.op, &mut outs[6], &new_mv)?;
        (mean, var)
    } else {
        (read_out_f64(cx.attrs.op, &outs[5])?, read_out_f64(cx.attrs.op, &outs[6])?)
    };
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + p.eps).sqrt()).collect();
    let sum_grad = channel_sums(geom, |i, _| dy[i]);
    let sum_prod = channel_sums(geom, |i, j| dy[i] * (x[i] - mean[j]));
    if cx.req[0] != Req::Null {
        let scale = 1.0 / (n * s).max(1) as f64;
        if training {
            let gvar: Vec<f64> = (0..c).map(|j| -sum_prod[j] * gamma[j] * inv[j].powi(3)).collect();
            let gmean: Vec<f64> = (0..c).map(|j| -sum_grad[j] * gamma[j] * inv[j]).collect();
            store(cx.attrs.op, &mut outs[0], |i| {
                let j = ch(i);
                dy[i] * gamma[j] * inv[j] + gvar[j] * scale * (x[i] - mean[j]) + gmean[j] * scale
            })?;
        } else {
            store(cx.attrs.op, &mut outs[0], |i| dy[i] * gamma[ch(i)] * inv[ch(i)])?;
        }
    }
    if cx.req[1] != Req::Null {
        let dg: Vec<f64> = if p.fix_gamma { vec![0.0; c] } else { (0..c).map(|j| sum_prod[j] * inv[j]).collect() };
        write_f64(cx.attrs.op, &mut outs[1], &dg)?;
    }
    if cx.req[2] != Req::Null {
        write_f64(cx.attrs.op, &mut outs[2], &sum_grad)?;
    }
    for (o, r) in outs.iter_mut().zip(cx.req).take(5).skip(3) {
        if *r != Req::Null {
            o.as_bytes_mut().fill(0);
        }
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    type Form = (&'static str, &'static [ParamSpec], Option<&'static [&'static str]>, &'static str, &'static str);
    let forms: [Form; 2] = [
        (OP, SYNC_BN_PARAMS, None, "_backward_SyncBatchNorm",
         "Batch normalization with synchronized statistics across devices (here one device: ndev=1). Normalizes the data over the batch and spatial axes per channel (axis 1)."),
        ("BatchNorm_v1", BN_V1_PARAMS, Some(&["data", "gamma", "beta"]), "_backward_BatchNorm_v1",
         "Batch normalization (the legacy operator; use BatchNorm): normalizes over the batch and spatial axes per channel (axis 1), outputs the batch mean and variance with output_mean_var."),
    ];
    for (name, params, listed, back, doc) in forms {
        let mut def = OpDef::new(
            name,
            Inputs::Fixed(&["data", "gamma", "beta", "moving_mean", "moving_var"]),
            Box::new(infer),
            Box::new(forward),
        )
        .params(params)
        .outputs(three, visible)
        .output_names(&["output", "mean", "var"])
        .param_shapes(param_shapes)
        .input_inits(&[(3, "[\"zero\", {}]"), (4, "[\"one\", {}]")])
        .never_mirrored()
        .mutates(&[3, 4])
        .grad(Grad::Backward { op: back, inputs: true, outputs: true })
        .doc(doc);
        if let Some(names) = listed {
            def = def.listed_inputs(names);
        }
        ops.push(def);
        ops.push(OpDef::backward(back, params, Box::new(backward)).mutates_from_end(&[5, 4]));
    }
}
