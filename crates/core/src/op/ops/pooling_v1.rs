//! `Pooling_v1`, MXNet's deprecated first pooling operator, and its backward operator.
//!
//! Owns its parameters (stock's names and defaults), shape rule and kernels, which differ
//! from `Pooling`'s in stock's ways: padding is zeros that the maximum sees, windows of the
//! `full` convention are cut at the padded edge (an empty one gives the type's lowest value
//! for `max`, 0 for `sum`), `avg` always divides by the whole kernel's size (or the map's,
//! for `global_pool`), and the maximum's gradient goes to every input equal to it. 2-D only
//! (4-D data), as stock computes; float16 accumulates in float32.

use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

op_params! {
    struct PoolV1Params<'a> => POOL_V1_PARAMS {
        kernel: &'a [i64] = "[]", "pooling kernel size: (y, x) or (d, y, x)";
        pool_type: &'a str = "max" in ["avg", "max", "sum"], "Pooling type to be applied.";
        global_pool: bool = "False", "Ignore kernel size, do global pooling based on current input feature map. ";
        pooling_convention: &'a str = "valid" in ["full", "valid"], "Pooling convention to be applied.";
        stride: &'a [i64] = "[]", "stride: for pooling (y, x) or (d, y, x)";
        pad: &'a [i64] = "[]", "pad for pooling: (y, x) or (d, y, x)";
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Avg,
    Sum,
}

/// One call's sizes: data (n, c, h, w) zero-padded to (hp, wp), windows of `k` every
/// `stride`, output (oh, ow).
struct Pool {
    kind: Kind,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    pad: [usize; 2],
    k: [usize; 2],
    stride: [usize; 2],
    out: [usize; 2],
}

impl Pool {
    fn of(a: &Attrs, data: &[usize]) -> Result<Pool> {
        let op = a.op;
        let p = PoolV1Params::of(a);
        let kind = match p.pool_type {
            "avg" => Kind::Avg,
            "sum" => Kind::Sum,
            _ => Kind::Max,
        };
        let &[n, c, h, w] = data else {
            return Err(Error::value(format!(
                "operator {op}: data should be 4D in (batch, channel, y, x), got {data:?} (stock computes 2-D pooling only)"
            )));
        };
        if p.global_pool {
            return Ok(Pool { kind, n, c, h, w, pad: [0; 2], k: [h, w], stride: [1; 2], out: [1; 2] });
        }
        let pair = |name: &str, v: &[i64], default: i64, min: i64| -> Result<[usize; 2]> {
            match v {
                [] if p.kernel.len() == 2 => Ok([default as usize; 2]),
                &[y, x] if y >= min && x >= min => Ok([y as usize, x as usize]),
                _ => Err(Error::value(format!(
                    "operator {op}: {name} {v:?} must be 2 integers >= {min} for 2-D pooling (4-D data)"
                ))),
            }
        };
        let k = pair("kernel", p.kernel, 0, 1)?;
        let stride = pair("stride", p.stride, 1, 1)?;
        let pad = pair("pad", p.pad, 0, 0)?;
        let mut out = [0; 2];
        for d in 0..2 {
            let size = [h, w][d];
            let padded = pad[d].checked_mul(2).and_then(|v| v.checked_add(size));
            let Some(padded) = padded.filter(|&v| v >= k[d]) else {
                return Err(Error::value(format!(
                    "operator {op}: kernel size ({}) exceeds input ({size} padded to {})",
                    k[d],
                    size.saturating_add(pad[d].saturating_mul(2))
                )));
            };
            out[d] = if p.pooling_convention == "full" {
                1 + (padded - k[d]).div_ceil(stride[d])
            } else {
                1 + (padded - k[d]) / stride[d]
            };
        }
        Ok(Pool { kind, n, c, h, w, pad, k, stride, out })
    }

    fn hp(&self) -> usize {
        self.h + 2 * self.pad[0]
    }
    fn wp(&self) -> usize {
        self.w + 2 * self.pad[1]
    }
    /// The data rows (columns) of padded range `r` along axis `d`, in data coordinates.
    fn inside(&self, d: usize, r: &std::ops::Range<usize>) -> std::ops::Range<usize> {
        let (pad, size) = (self.pad[d], [self.h, self.w][d]);
        let start = r.start.max(pad).min(pad + size) - pad;
        start..(r.end.min(pad + size).max(pad) - pad).max(start)
    }
    /// Rows (columns) of output position `o` along axis `d`: cut at the padded edge.
    fn window(&self, d: usize, o: usize) -> std::ops::Range<usize> {
        let start = o.saturating_mul(self.stride[d]);
        let end = start.saturating_add(self.k[d]).min([self.hp(), self.wp()][d]);
        start..end.max(start)
    }
    /// avg's factor: one over the kernel's size.
    fn scale<R: Real>(&self) -> R {
        R::of(f64::from(1.0f32 / (self.k[0] as f64 * self.k[1] as f64) as f32))
    }
}

/// mshadow's initial maximum: the type's lowest finite value.
fn lowest<T: Elem>() -> f64 {
    match T::DTYPE {
        DType::F16 => f64::from(half::f16::MIN),
        DType::F32 => f64::from(f32::MIN),
        _ => f64::MIN,
    }
}

fn forward<T: Elem, R: Real>(p: &Pool, x: &[T], out: &mut [T]) {
    let (hw, osz) = (p.h * p.w, p.out[0] * p.out[1]);
    if osz == 0 {
        return;
    }
    let cells = (p.k[0].min(p.h) * p.k[1].min(p.w)) as f64;
    par_for_mut(out, osz, Cost(osz as f64 * cells), T::DTYPE, |r, o| {
        for (plane_i, dst) in r.zip(o.chunks_mut(osz)) {
            let plane = &x[plane_i * hw..][..hw];
            for (i, v) in dst.iter_mut().enumerate() {
                let (ys, xs) = (p.window(0, i / p.out[1]), p.window(1, i % p.out[1]));
                // Only the window's cells inside the data are read; the padding's are zeros,
                // which add nothing to a sum and one 0 to a maximum.
                let (ry, rx) = (p.inside(0, &ys), p.inside(1, &xs));
                let area = |a: usize, b: usize| a as u128 * b as u128;
                let padded = area(ry.len(), rx.len()) < area(ys.len(), xs.len());
                let cells = ry.flat_map(|y| rx.clone().map(move |x| (y, x)));
                let vals = cells.map(|(y, x)| R::load(plane[y * p.w + x]));
                *v = match p.kind {
                    Kind::Max => {
                        let m = vals.fold(R::of(lowest::<T>()), |m, v| if v > m { v } else { m });
                        if padded && R::of(0.0) > m {
                            R::of(0.0)
                        } else {
                            m
                        }
                    }
                    Kind::Sum => vals.fold(R::of(0.0), |s, v| s + v),
                    Kind::Avg => vals.fold(R::of(0.0), |s, v| s + v) * p.scale::<R>(),
                }
                .store();
            }
        }
    });
}

/// `dx` from the output gradient `dy` (and, for max, the data `x` and output `y`).
fn backward<T: Elem, R: Real>(p: &Pool, dy: &[T], x: &[T], y: &[T], dx: &mut [T]) {
    let (hw, osz) = (p.h * p.w, p.out[0] * p.out[1]);
    if hw == 0 {
        return;
    }
    let windows = (p.k[0].div_ceil(p.stride[0]).min(p.out[0]) * p.k[1].div_ceil(p.stride[1]).min(p.out[1])) as f64;
    par_for_mut(dx, hw, Cost(hw as f64 * windows), T::DTYPE, |r, o| {
        for (plane_i, dst) in r.zip(o.chunks_mut(hw)) {
            let (g, yo) = (&dy[plane_i * osz..][..osz], &y[plane_i * osz..][..osz]);
            let plane = &x[plane_i * hw..][..hw];
            for (i, v) in dst.iter_mut().enumerate() {
                // Padded position (py, px) is covered by outputs o with o·s <= py < o·s + k.
                let (py, px) = (i / p.w + p.pad[0], i % p.w + p.pad[1]);
                let span = |d: usize, q: usize| {
                    // In u128: near usize::MAX the sums below must not wrap.
                    let (q, k, s) = (q as u128, p.k[d] as u128, p.stride[d] as u128);
                    let lo = if q < k { 0 } else { (q - k + s) / s };
                    let hi = ((q + s) / s).min(p.out[d] as u128);
                    lo as usize..hi as usize
                };
                let xv = plane[i];
                let mut acc = R::of(0.0);
                for oy in span(0, py) {
                    for ox in span(1, px) {
                        let j = oy * p.out[1] + ox;
                        if p.kind != Kind::Max || xv == yo[j] {
                            acc = acc + R::load(g[j]);
                        }
                    }
                }
                if p.kind == Kind::Avg {
                    acc = acc * p.scale::<R>();
                }
                *v = acc.store();
            }
        }
    });
}

fn pooling_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = Pool::of(cx.attrs, &ins[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => forward::<T, R>(&p, ins[0].as_slice::<T>(), outs[0].as_mut::<T>()));
    Ok(())
}

/// `_backward_Pooling_v1(dY, data, out) -> dData`.
fn pooling_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let p = Pool::of(cx.attrs, &ins[1].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => backward::<T, R>(
        &p,
        ins[0].as_slice::<T>(),
        ins[1].as_slice::<T>(),
        ins[2].as_slice::<T>(),
        outs[0].as_mut::<T>(),
    ));
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "Pooling_v1",
            Inputs::Fixed(&["data"]),
            Box::new(|a, ins| {
                let dt = super::common::floats_like_first(a.op, ins)?;
                let p = Pool::of(a, &ins[0].shape)?;
                Ok(vec![Meta::new(vec![p.n, p.c, p.out[0], p.out[1]], dt)])
            }),
            Box::new(pooling_forward),
        )
        .params(POOL_V1_PARAMS)
        .grad(Grad::Backward { op: "_backward_Pooling_v1", inputs: true, outputs: true })
        .doc("This operator is DEPRECATED. Perform pooling on the input (2-D: data (batch, channel, height, width)): max, avg or sum over kernel windows of the zero-padded input; out = 1 + (in + 2 * pad - kernel) / stride, rounded down (valid) or up (full)."),
    );
    ops.push(OpDef::backward("_backward_Pooling_v1", POOL_V1_PARAMS, Box::new(pooling_backward)));
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, run, values};

    /// Zero padding takes part in the maximum; avg divides by the whole kernel; full windows
    /// are cut at the edge.
    #[test]
    fn stock_rules() {
        let x = vec![-1.0, -2.0, -3.0, -4.0];
        let max = run("Pooling_v1", &[("kernel", "(2, 2)"), ("pad", "(1, 1)")], &[(&[1, 1, 2, 2][..], x.clone())]);
        // Every window but the centre one (the four values alone) sees padding.
        assert_eq!(max[0], vec![0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0]);
        let avg = run(
            "Pooling_v1",
            &[("kernel", "(2, 2)"), ("stride", "(2, 2)"), ("pool_type", "avg"), ("pooling_convention", "full")],
            &[(&[1, 1, 3, 3][..], (1..=9).map(f64::from).collect())],
        );
        assert_eq!(avg[0], vec![(1.0 + 2.0 + 4.0 + 5.0) / 4.0, (3.0 + 6.0) / 4.0, (7.0 + 8.0) / 4.0, 9.0 / 4.0]);
    }

    #[test]
    fn gradients() {
        let x = values(2 * 3 * 5 * 6, -1.0, 1.0, 11);
        for params in [
            &[("kernel", "(2, 3)"), ("stride", "(2, 1)"), ("pad", "(1, 0)"), ("pool_type", "avg")][..],
            &[("kernel", "(3, 2)"), ("stride", "(2, 2)"), ("pool_type", "sum"), ("pooling_convention", "full")],
            &[("kernel", "(2, 2)"), ("pool_type", "max"), ("pad", "(1, 1)")],
            &[("global_pool", "True"), ("pool_type", "max")],
        ] {
            check("Pooling_v1", params, &[(&[2, 3, 5, 6], x.clone())], &[]);
        }
    }
}
