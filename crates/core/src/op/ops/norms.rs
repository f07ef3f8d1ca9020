//! Per-instance normalisations: `InstanceNorm`, `GroupNorm` and `L2Normalization`, with their
//! backward operators.
//!
//! Each normalises *blocks* of the data independently: InstanceNorm one block per (image,
//! channel), GroupNorm per (image, channel group), L2Normalization per image (`instance`),
//! per (image, channel) (`spatial`) or per (image, position) across channels (`channel`, a
//! strided block). Statistics accumulate in float64; blocks run on the kernel pool. The saved
//! statistics are hidden outputs (stock's: InstanceNorm's mean and variance, GroupNorm's mean
//! and standard deviation, L2Normalization's norm) that the backward operators read.

use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    pub(super) struct InstanceParams<'a> => INSTANCE_PARAMS {
        eps: f64 = "0.00100000005", "An `epsilon` parameter to prevent division by 0.";
    }
}

op_params! {
    pub(super) struct GroupParams<'a> => GROUP_PARAMS {
        num_groups: i64 = "1", "Total number of groups.";
        eps: f64 = "9.99999975e-06", "An `epsilon` parameter to prevent division by 0.";
        output_mean_var: bool = "False", "Output the mean and std calculated along the given axis.";
    }
}

op_params! {
    pub(super) struct L2Params<'a> => L2_PARAMS {
        eps: f64 = "1.00000001e-10", "A small constant for numerical stability.";
        mode: &'a str = "instance" in ["channel", "instance", "spatial"], "Specify the dimension along which to compute L2 norm.";
    }
}

/// How the data splits into blocks: `count` blocks of `len` elements; element `k` of block
/// `b` is at `(b / per) * outer_stride + (b % per) + k * step` for a strided block
/// (L2Normalization's `channel` mode), else at `b * len + k`.
#[derive(Clone, Copy, Debug)]
struct Blocks {
    count: usize,
    len: usize,
    /// Strided blocks: (blocks per image, image stride, element step).
    strided: Option<(usize, usize, usize)>,
    /// Blocks share an affine parameter `b % affine` (InstanceNorm's channels, GroupNorm's
    /// groups); 0: none.
    affine: usize,
}

impl Blocks {
    #[inline]
    fn at(&self, b: usize, k: usize) -> usize {
        match self.strided {
            Some((per, image, step)) => (b / per) * image + (b % per) + k * step,
            None => b * self.len + k,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Instance,
    Group,
    L2,
}

fn kind(a: &Attrs) -> Kind {
    if a.declares(INSTANCE_PARAMS) {
        Kind::Instance
    } else if a.declares(GROUP_PARAMS) {
        Kind::Group
    } else {
        Kind::L2
    }
}

/// The blocks of a call, and the shape of each saved statistic.
fn blocks(a: &Attrs, shape: &[usize]) -> Result<(Blocks, Vec<usize>)> {
    let op = a.op;
    let min = if kind(a) == Kind::L2 { 2 } else { 3 };
    if shape.len() < min {
        return Err(Error::value(format!("operator {op}: data must have at least {min} dimensions, got {shape:?}")));
    }
    let (n, c, inner) = (shape[0], shape[1], shape[2..].iter().product::<usize>());
    Ok(match kind(a) {
        Kind::Instance => (Blocks { count: n * c, len: inner, strided: None, affine: c }, vec![n, c]),
        Kind::Group => {
            let g = GroupParams::of(a).num_groups;
            if g < 1 || c % g as usize != 0 {
                return Err(Error::value(format!(
                    "operator {op}: the channels ({c}) must be divisible by num_groups ({g})"
                )));
            }
            let g = g as usize;
            (Blocks { count: n * g, len: c / g * inner, strided: None, affine: g }, vec![n, g])
        }
        Kind::L2 => match L2Params::of(a).mode {
            "instance" => (Blocks { count: n, len: c * inner, strided: None, affine: 0 }, vec![n]),
            mode if shape.len() < 3 && mode != "instance" => {
                return Err(Error::value(format!(
                    "operator {op}: {mode} mode needs at least 3 dimensions, got {shape:?}"
                )));
            }
            "spatial" => (Blocks { count: n * c, len: inner, strided: None, affine: 0 }, vec![n, c]),
            _ => {
                let mut norm = vec![n];
                norm.extend_from_slice(&shape[2..]);
                (Blocks { count: n * inner, len: c, strided: Some((inner, c * inner, inner)), affine: 0 }, norm)
            }
        },
    })
}

fn num_visible(a: &Attrs) -> usize {
    if a.declares(GROUP_PARAMS) && GroupParams::of(a).output_mean_var {
        3
    } else {
        1
    }
}

fn three(_: &Attrs) -> usize {
    3
}

fn two(_: &Attrs) -> usize {
    2
}

fn one(_: &Attrs) -> usize {
    1
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let dt = super::common::floats_like_first(op, ins)?;
    let (b, stat) = blocks(a, &ins[0].shape)?;
    let out = Meta::new(ins[0].shape.clone(), dt);
    if kind(a) == Kind::L2 {
        return Ok(vec![out, Meta::new(stat, dt)]);
    }
    for (k, what) in [(1, "gamma"), (2, "beta")] {
        if ins[k].shape != [b.affine] {
            return Err(Error::value(format!(
                "operator {op}: {what} has shape {:?}, expected ({},)",
                ins[k].shape, b.affine
            )));
        }
    }
    Ok(vec![out, Meta::new(stat.clone(), dt), Meta::new(stat, dt)])
}

fn param_shapes(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    if data.len() < 2 {
        return Ok(vec![]);
    }
    let size = match kind(a) {
        Kind::Group => GroupParams::of(a).num_groups,
        _ => data[1],
    };
    Ok(vec![(1, vec![size]), (2, vec![size])])
}

/// Per block: (mean, variance) of its elements, or (0, Σx²) for L2Normalization.
fn stats<T: Elem>(x: &[T], b: &Blocks, l2: bool) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); b.count];
    par_for_mut(&mut out, 1, Cost(2.0 * b.len as f64), T::DTYPE, |r, o| {
        for (blk, s) in r.zip(o.iter_mut()) {
            let n = b.len.max(1) as f64;
            if l2 {
                *s = (0.0, (0..b.len).map(|k| x[b.at(blk, k)].to_f64().powi(2)).sum());
            } else {
                let m = (0..b.len).map(|k| x[b.at(blk, k)].to_f64()).sum::<f64>() / n;
                let v = (0..b.len).map(|k| (x[b.at(blk, k)].to_f64() - m).powi(2)).sum::<f64>() / n;
                *s = (m, v);
            }
        }
    });
    out
}

fn write_stat<T: Elem>(o: &mut OutBlob, vals: impl Iterator<Item = f64>) {
    for (d, v) in o.as_mut::<T>().iter_mut().zip(vals) {
        *d = T::from_f64(v);
    }
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let k = kind(a);
    let (b, _) = blocks(a, &ins[0].shape)?;
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let x = ins[0].as_slice::<T>();
        let st = stats(x, &b, k == Kind::L2);
        // Per block: y = x·scale + shift (scale and shift from the statistics and the affine).
        let (eps, gamma, beta) = match k {
            Kind::Instance => (InstanceParams::of(a).eps, Some(ins[1].as_slice::<T>()), Some(ins[2].as_slice::<T>())),
            Kind::Group => (GroupParams::of(a).eps, Some(ins[1].as_slice::<T>()), Some(ins[2].as_slice::<T>())),
            Kind::L2 => (L2Params::of(a).eps, None, None),
        };
        let coef: Vec<(f64, f64)> = st
            .iter()
            .enumerate()
            .map(|(blk, &(m, v))| match (gamma, beta) {
                (Some(g), Some(be)) => {
                    let inv = 1.0 / (v + eps).sqrt();
                    let gm = g[blk % b.affine].to_f64();
                    (gm * inv, be[blk % b.affine].to_f64() - m * gm * inv)
                }
                _ => (1.0 / (v + eps).sqrt(), 0.0),
            })
            .collect();
        let y = outs[0].as_mut::<T>();
        if b.strided.is_none() {
            par_for_mut(y, b.len.max(1), Cost(b.len as f64), T::DTYPE, |r, o| {
                for (blk, ob) in r.zip(o.chunks_mut(b.len.max(1))) {
                    let (sc, sh) = (R::of(coef[blk].0), R::of(coef[blk].1));
                    for (kk, v) in ob.iter_mut().enumerate() {
                        *v = (R::load(x[b.at(blk, kk)]) * sc + sh).store();
                    }
                }
            });
        } else {
            for (blk, &(sc, sh)) in coef.iter().enumerate() {
                for kk in 0..b.len {
                    let i = b.at(blk, kk);
                    y[i] = (R::load(x[i]) * R::of(sc) + R::of(sh)).store();
                }
            }
        }
        match k {
            Kind::L2 => write_stat::<T>(&mut outs[1], st.iter().map(|s| (s.1 + eps).sqrt())),
            Kind::Instance => {
                write_stat::<T>(&mut outs[1], st.iter().map(|s| s.0));
                write_stat::<T>(&mut outs[2], st.iter().map(|s| s.1));
            }
            Kind::Group => {
                write_stat::<T>(&mut outs[1], st.iter().map(|s| s.0));
                write_stat::<T>(&mut outs[2], st.iter().map(|s| (s.1 + eps).sqrt()));
            }
        }
    });
    Ok(())
}

/// Backward. InstanceNorm/GroupNorm: `(dY[, dmean, dstd], data, gamma, beta, y, mean,
/// var|std) -> (dData, dGamma, dBeta)`; L2Normalization: `(dY, data, y, norm) -> (dData)`.
fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let k = kind(a);
    let nv = if k == Kind::L2 { 1 } else { num_visible(a) };
    let data = &ins[nv];
    let (b, _) = blocks(a, &data.shape)?;
    dispatch_real!(data.dtype, a.op, T, _R => {
        let (g, x) = (ins[0].as_slice::<T>(), data.as_slice::<T>());
        let mut dx = vec![0.0f64; x.len()];
        let mut dgamma = vec![0.0f64; b.affine];
        let mut dbeta = vec![0.0f64; b.affine];
        if k == Kind::L2 {
            let norm = ins[nv + 2].as_slice::<T>();
            for (blk, nb) in norm.iter().enumerate().take(b.count) {
                let nb = nb.to_f64();
                let gy: f64 = (0..b.len).map(|kk| { let i = b.at(blk, kk); g[i].to_f64() * x[i].to_f64() / nb }).sum();
                for kk in 0..b.len {
                    let i = b.at(blk, kk);
                    dx[i] = (g[i].to_f64() - x[i].to_f64() / nb * gy) / nb;
                }
            }
        } else {
            let gamma = ins[nv + 1].as_slice::<T>();
            let (mean, spread) = (ins[nv + 4].as_slice::<T>(), ins[nv + 5].as_slice::<T>());
            let eps = if k == Kind::Instance { InstanceParams::of(a).eps } else { GroupParams::of(a).eps };
            let n = b.len.max(1) as f64;
            for blk in 0..b.count {
                let m = mean[blk].to_f64();
                // InstanceNorm saves the variance, GroupNorm the standard deviation.
                let inv = if k == Kind::Instance {
                    1.0 / (spread[blk].to_f64() + eps).sqrt()
                } else {
                    1.0 / spread[blk].to_f64()
                };
                let af = blk % b.affine;
                let gm = gamma[af].to_f64();
                let (mut s1, mut s2) = (0.0, 0.0);
                for kk in 0..b.len {
                    let i = b.at(blk, kk);
                    let (gv, xh) = (g[i].to_f64(), (x[i].to_f64() - m) * inv);
                    dgamma[af] += gv * xh;
                    dbeta[af] += gv;
                    s1 += gv * gm;
                    s2 += gv * gm * xh;
                }
                for kk in 0..b.len {
                    let i = b.at(blk, kk);
                    let xh = (x[i].to_f64() - m) * inv;
                    dx[i] = inv * (g[i].to_f64() * gm - s1 / n - xh * s2 / n);
                }
            }
        }
        for (o, (r, vals)) in outs.iter_mut().zip(cx.req.iter().zip([&dx, &dgamma, &dbeta])) {
            if *r != Req::Null {
                write_stat::<T>(o, vals.iter().copied());
            }
        }
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("InstanceNorm", Inputs::Fixed(&["data", "gamma", "beta"]), Box::new(infer), Box::new(forward))
            .params(INSTANCE_PARAMS)
            .outputs(three, one)
            .output_names(&["output", "mean", "var"])
            .param_shapes(param_shapes)
            .grad(Grad::Backward { op: "_backward_InstanceNorm", inputs: true, outputs: true })
            .doc("Applies instance normalization to the n-dimensional input array."),
    );
    ops.push(OpDef::backward("_backward_InstanceNorm", INSTANCE_PARAMS, Box::new(backward)));
    ops.push(
        OpDef::new("GroupNorm", Inputs::Fixed(&["data", "gamma", "beta"]), Box::new(infer), Box::new(forward))
            .params(GROUP_PARAMS)
            .outputs(three, num_visible)
            .output_names(&["output", "mean", "std"])
            .param_shapes(param_shapes)
            .grad(Grad::Backward { op: "_backward_GroupNorm", inputs: true, outputs: true })
            .doc("Group normalization."),
    );
    ops.push(OpDef::backward("_backward_GroupNorm", GROUP_PARAMS, Box::new(backward)));
    ops.push(
        OpDef::new("L2Normalization", Inputs::Fixed(&["data"]), Box::new(infer), Box::new(forward))
            .params(L2_PARAMS)
            .outputs(two, one)
            .output_names(&["output", "norm"])
            .grad(Grad::Backward { op: "_backward_L2Normalization", inputs: true, outputs: true })
            .doc("Normalize the input array using the L2 norm."),
    );
    ops.push(OpDef::backward("_backward_L2Normalization", L2_PARAMS, Box::new(backward)));
}
