//! Backward operators of the linear-algebra family (see `op::grad` for the convention).
//!
//! Owns `_backward_dot`, `_backward_batch_dot` and `_backward_FullyConnected`: each gradient
//! is one GEMM through the shared helper (transposes as strides, never copies), plus the
//! column sums of the output gradient for FullyConnected's bias. Also owns the gradient of
//! `_backward_FullyConnected` (second order, composed of `dot` calls: [`fc_composed`]).

use super::linalg::{batch_plan, batched_gemm, dot_plan, fc_plan, gemm, DOT_PARAMS, FC_PARAMS};
use super::nn::{dispatch_real, Real};
use crate::dispatch_float;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::ndarray::NDArray;
use crate::op::grad::Composed;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::ops::linalg::DotParams;
use crate::op::ops::linalg::FcParams;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, OpCtx, OpDef, Req};

/// `_backward_dot(dC, A, B) -> (dA, dB)` for `C = op(A)·op(B)`.
fn dot_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = DotParams::of(cx.attrs);
    let (ta, tb) = (params.transpose_a, params.transpose_b);
    let (m, n, k, _) = dot_plan(cx.attrs.op, &ins[1].shape, &ins[2].shape, ta, tb)?;
    dispatch_float!(ins[1].dtype, cx.attrs.op, T => {
        let (dc, a, b) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
        if cx.req[0] != Req::Null {
            let da = outs[0].as_mut::<T>();
            if ta {
                // dA (k×m) = op(B)·dCᵀ
                gemm(k, m, n, b, tb, dc, true, da, false);
            } else {
                // dA (m×k) = dC·op(B)ᵀ
                gemm(m, k, n, dc, false, b, !tb, da, false);
            }
        }
        if cx.req[1] != Req::Null {
            let db = outs[1].as_mut::<T>();
            if tb {
                // dB (n×k) = dCᵀ·op(A)
                gemm(n, k, m, dc, true, a, ta, db, false);
            } else {
                // dB (k×n) = op(A)ᵀ·dC
                gemm(k, n, m, a, !ta, dc, false, db, false);
            }
        }
    });
    Ok(())
}

/// `_backward_batch_dot(dC, A, B) -> (dA, dB)`: [`dot_backward`] per batch entry.
fn batch_dot_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = DotParams::of(cx.attrs);
    let (ta, tb) = (params.transpose_a, params.transpose_b);
    let (batch, m, n, k) = batch_plan(cx.attrs.op, &ins[1].shape, &ins[2].shape, ta, tb)?;
    dispatch_float!(ins[1].dtype, cx.attrs.op, T => {
        let (dc, a, b) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
        if cx.req[0] != Req::Null {
            let da = outs[0].as_mut::<T>();
            if ta {
                batched_gemm(batch, k, m, n, b, tb, dc, true, da);
            } else {
                batched_gemm(batch, m, k, n, dc, false, b, !tb, da);
            }
        }
        if cx.req[1] != Req::Null {
            let db = outs[1].as_mut::<T>();
            if tb {
                batched_gemm(batch, n, k, m, dc, true, a, ta, db);
            } else {
                batched_gemm(batch, k, n, m, a, !ta, dc, false, db);
            }
        }
    });
    Ok(())
}

/// `out[j] = Σ_r g[r, j]` for a rows×cols `g`, split over column ranges.
fn column_sums<T: Elem, R: Real>(g: &[T], cols: usize, out: &mut [T]) {
    let rows = g.len().checked_div(cols).unwrap_or(0);
    par_for_mut(&mut out[..cols], 1, Cost(rows as f64 * 0.3), T::DTYPE, |r, o| {
        let mut acc = vec![R::of(0.0); r.len()];
        for row in g.chunks_exact(cols) {
            for (a, &v) in acc.iter_mut().zip(&row[r.clone()]) {
                *a = *a + R::load(v);
            }
        }
        for (ov, a) in o.iter_mut().zip(acc) {
            *ov = a.store();
        }
    });
}

/// `_backward_FullyConnected(dY, X, W[, b]) -> (dX, dW[, db])` for `Y = X·Wᵀ + b`.
fn fc_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = FcParams::of(cx.attrs);
    let (rows, k, _) = fc_plan(cx.attrs, &ins[1].shape)?;
    let hidden = params.num_hidden as usize;
    dispatch_real!(ins[1].dtype, cx.attrs.op, T, R => {
        let (dy, x, w) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
        if cx.req[0] != Req::Null {
            gemm(rows, k, hidden, dy, false, w, false, outs[0].as_mut::<T>(), false);
        }
        if cx.req[1] != Req::Null {
            gemm(hidden, k, rows, dy, true, x, false, outs[1].as_mut::<T>(), false);
        }
        if outs.len() > 2 && cx.req[2] != Req::Null {
            column_sums::<T, R>(dy, hidden, outs[2].as_mut::<T>());
        }
    });
    Ok(())
}

/// The gradient of `_backward_FullyConnected(dY, X, W[, b]) -> (dX, dW[, db])`, with
/// incoming gradients (gX, gW[, gb]), composed of `dot` calls (stock's
/// `_backward_backward_FullyConnected`): by dY `gX·Wᵀ + X·gWᵀ + gb` (gb on every row), by X
/// `dY·gW`, by W `dYᵀ·gX`; b does not enter the gradient. Matrices are the 2-D views the
/// forward uses (rows × inputs).
fn fc_composed(cx: &Composed) -> Result<Vec<Option<NDArray>>> {
    let (dy, x, w) = (&cx.inputs[0], &cx.inputs[1], &cx.inputs[2]);
    let (rows, k, _) = fc_plan(cx.attrs, &x.shape)?;
    let hidden = FcParams::of(cx.attrs).num_hidden as usize;
    if rows == 0 || k == 0 {
        // Empty products: zero gradients (and no `Reshape` to a literal 0, which keeps a dimension).
        return (0..cx.inputs.len())
            .map(|i| if cx.wants(i) { cx.call("zeros_like", &[&cx.inputs[i]], &[]).map(Some) } else { Ok(None) })
            .collect();
    }
    let reshape = |a: &NDArray, shape: &[usize]| -> Result<NDArray> {
        let s = format!("({})", shape.iter().map(|d| format!("{d},")).collect::<String>());
        cx.call("Reshape", &[a], &[("shape", &s)])
    };
    let dot = |a: &NDArray, b: &NDArray, ta: bool, tb: bool| -> Result<NDArray> {
        let flag = |t: bool| if t { "True" } else { "False" };
        cx.call("dot", &[a, b], &[("transpose_a", flag(ta)), ("transpose_b", flag(tb))])
    };
    let dy2 = reshape(dy, &[rows, hidden])?;
    let x2 = reshape(x, &[rows, k])?;
    let gx2 = reshape(&cx.ograds[0], &[rows, k])?;
    let gw = &cx.ograds[1];
    let mut out = vec![None; cx.inputs.len()];
    if cx.wants(0) {
        let mut d = cx.add(&dot(&gx2, w, false, true)?, &dot(&x2, gw, false, true)?)?;
        if let Some(gb) = cx.ograds.get(2) {
            let gb = reshape(gb, &[1, hidden])?;
            d = cx.add(&d, &cx.call("broadcast_like", &[&gb, &d], &[])?)?;
        }
        out[0] = Some(reshape(&d, &dy.shape)?);
    }
    if cx.wants(1) {
        out[1] = Some(reshape(&dot(&dy2, gw, false, false)?, &x.shape)?);
    }
    if cx.wants(2) {
        out[2] = Some(dot(&dy2, &gx2, true, false)?);
    }
    Ok(out)
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(OpDef::backward("_backward_dot", DOT_PARAMS, Box::new(dot_backward)));
    ops.push(OpDef::backward("_backward_batch_dot", DOT_PARAMS, Box::new(batch_dot_backward)));
    ops.push(
        OpDef::backward("_backward_FullyConnected", FC_PARAMS, Box::new(fc_backward))
            .gpu(crate::op::gpu::GpuKernel::FullyConnectedGrad(|a| FcParams::of(a).no_bias))
            .grad(Grad::Composed { f: fc_composed, inputs: true, outputs: false }),
    );
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    fn two(op: &str, params: &[(&str, &str)], a: &[usize], b: &[usize]) {
        let an = a.iter().product();
        let bn = b.iter().product();
        check(op, params, &[(a, values(an, -1.0, 1.0, 1)), (b, values(bn, -1.0, 1.0, 2))], &[]);
    }

    #[test]
    fn dot() {
        two("dot", &[], &[3, 4], &[4, 5]);
        two("dot", &[("transpose_a", "True")], &[4, 3], &[4, 5]);
        two("dot", &[("transpose_b", "True")], &[3, 4], &[5, 4]);
        two("dot", &[("transpose_a", "True"), ("transpose_b", "True")], &[4, 3], &[5, 4]);
        two("dot", &[], &[2, 3, 4], &[4, 2, 3]);
        two("dot", &[], &[4], &[4]);
        two("dot", &[], &[4], &[4, 3]);
    }

    #[test]
    fn batch_dot() {
        two("batch_dot", &[], &[2, 3, 4], &[2, 4, 5]);
        two("batch_dot", &[("transpose_a", "True")], &[2, 4, 3], &[2, 4, 5]);
        two("batch_dot", &[("transpose_b", "True")], &[2, 3, 4], &[2, 5, 4]);
        two("batch_dot", &[("transpose_a", "True"), ("transpose_b", "True")], &[3, 4, 3], &[3, 5, 4]);
    }

    #[test]
    fn fully_connected() {
        let x = values(2 * 3 * 4, -1.0, 1.0, 1);
        let w = values(5 * 12, -1.0, 1.0, 2);
        let b = values(5, -1.0, 1.0, 3);
        check(
            "FullyConnected",
            &[("num_hidden", "5")],
            &[(&[2, 3, 4], x.clone()), (&[5, 12], w), (&[5], b.clone())],
            &[],
        );
        let w4 = values(5 * 4, -1.0, 1.0, 4);
        check(
            "FullyConnected",
            &[("num_hidden", "5"), ("flatten", "False")],
            &[(&[2, 3, 4], x.clone()), (&[5, 4], w4.clone()), (&[5], b)],
            &[],
        );
        check(
            "FullyConnected",
            &[("num_hidden", "5"), ("flatten", "False"), ("no_bias", "True")],
            &[(&[2, 3, 4], x), (&[5, 4], w4)],
            &[],
        );
    }
}
