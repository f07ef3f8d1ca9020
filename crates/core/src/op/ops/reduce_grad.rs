//! Backward operators of the reductions (see `op::grad` for the convention): `_backward_sum`,
//! `_backward_mean`, `_backward_prod`, `_backward_nansum`, `_backward_nanprod`,
//! `_backward_max`, `_backward_min` and `_backward_norm`.
//!
//! Each input element's gradient is a function of the output gradient at its reduced position
//! (broadcast back over the reduced axes), the input element and, for some, the forward output
//! there. The input is walked in rows over the collapsed reduction layout ([`RPlan`]): when
//! the innermost collapsed dimension is reduced a row shares one output position, otherwise
//! it runs along contiguous outputs; both are plain slice loops.

use super::common::params_of;
use super::elemwise::{dispatch_arith, Arith, Calc};
use super::reduce::{elems_as, flags_of, RPlan};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::ops::reduce::NormParams;
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{OpCtx, OpDef, Req};

mod kind {
    pub const SUM: u8 = 0;
    pub const MEAN: u8 = 1;
    pub const PROD: u8 = 2;
    pub const NANSUM: u8 = 3;
    pub const NANPROD: u8 = 4;
    /// max and min: the gradient goes to every element equal to the result (stock's rule).
    pub const EXTREME: u8 = 5;
    pub const NORM1: u8 = 6;
    pub const NORM2: u8 = 7;
}
use kind::*;

/// The gradient of one input element: output gradient `g`, input `x`, forward output `y`,
/// `count` = elements per output.
#[inline(always)]
fn grad<C: Calc, const K: u8>(g: C, x: C, y: C, count: C) -> C {
    match K {
        SUM => g,
        // Divided as stock does (not multiplied by the reciprocal).
        MEAN => g.div(count),
        // Stock's rules: prod's gradient is out / x (inf/nan at x == 0, as stock).
        PROD => g.mul(y.div(x)),
        NANSUM => {
            if x.is_nan() {
                C::ZERO
            } else {
                g
            }
        }
        NANPROD => {
            if x.is_nan() {
                C::ZERO
            } else {
                g.mul(y.div(x))
            }
        }
        EXTREME => {
            if x == y {
                g
            } else {
                C::ZERO
            }
        }
        NORM1 => {
            if x > C::ZERO {
                g
            } else if x < C::ZERO {
                g.neg()
            } else {
                C::ZERO
            }
        }
        // A zero norm has a zero gradient (stock divides 0 by 0).
        _ => {
            if y == C::ZERO {
                C::ZERO
            } else {
                g.mul(x.div(y))
            }
        }
    }
}

/// `dx = grad(g, x, y)` with `g` and `y` broadcast from the reduced layout. `x` and `y` are
/// empty when the kind does not read them.
fn backward_typed<T: Arith, const K: u8>(plan: &RPlan, g: &[T], x: &[T], y: &[T], dx: &mut [T]) {
    let need_x = !matches!(K, SUM | MEAN);
    let need_y = matches!(K, PROD | NANPROD | EXTREME | NORM2);
    let k = plan.dims.len();
    let inner = plan.dims[k - 1];
    let inner_red = plan.red[k - 1];
    let outer = &plan.dims[..k - 1];
    // Strides of the output over the collapsed dims (0 on reduced ones).
    let mut ost = vec![0usize; k];
    let mut acc = 1;
    for i in (0..k).rev() {
        if !plan.red[i] {
            ost[i] = acc;
            acc *= plan.dims[i];
        }
    }
    let count = <T::C as Calc>::from_f64(plan.count() as f64);
    let rows = dx.len() / inner.max(1);
    debug_assert_eq!(rows * inner, dx.len());
    let cost = Cost(inner as f64 * if matches!(K, SUM | MEAN) { 0.3 } else { 1.0 } + 4.0);
    par_for_mut(dx, inner, cost, T::DTYPE, |r, part| {
        let mut idx = super::strided::unravel(r.start, outer);
        let mut obase: usize = idx.iter().zip(&ost).map(|(i, s)| i * s).sum();
        for (row, d) in r.zip(part.chunks_mut(inner)) {
            let start = row * inner;
            let xs = if need_x { &x[start..start + inner] } else { &[][..] };
            if inner_red {
                let gv = g[obase].load();
                let yv = if need_y { y[obase].load() } else { gv };
                if need_x {
                    for (d, &xv) in d.iter_mut().zip(xs) {
                        *d = T::store(grad::<T::C, K>(gv, xv.load(), yv, count));
                    }
                } else {
                    d.fill(T::store(grad::<T::C, K>(gv, gv, yv, count)));
                }
            } else {
                let gs = &g[obase..obase + inner];
                match (need_x, need_y) {
                    (true, true) => {
                        let ys = &y[obase..obase + inner];
                        for ((d, &gv), (&xv, &yv)) in d.iter_mut().zip(gs).zip(xs.iter().zip(ys)) {
                            *d = T::store(grad::<T::C, K>(gv.load(), xv.load(), yv.load(), count));
                        }
                    }
                    (true, false) => {
                        for ((d, &gv), &xv) in d.iter_mut().zip(gs).zip(xs) {
                            let gv = gv.load();
                            *d = T::store(grad::<T::C, K>(gv, xv.load(), gv, count));
                        }
                    }
                    _ => {
                        for (d, &gv) in d.iter_mut().zip(gs) {
                            let gv = gv.load();
                            *d = T::store(grad::<T::C, K>(gv, gv, gv, count));
                        }
                    }
                }
            }
            // Next row: advance the outer index and the output base.
            for j in (0..outer.len()).rev() {
                idx[j] += 1;
                obase += ost[j];
                if idx[j] < outer[j] {
                    break;
                }
                obase -= ost[j] * outer[j];
                idx[j] = 0;
            }
        }
    });
}

fn compute(kind: u8) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        if cx.req[0] == Req::Null || outs[0].size() == 0 {
            return Ok(());
        }
        let dx = &mut outs[0];
        let flags = flags_of(cx.attrs.op, cx.attrs, dx.ndim())?;
        let plan = RPlan::new(&dx.shape, &flags);
        let kind = if kind == NORM2 && NormParams::of(cx.attrs).ord == 1 { NORM1 } else { kind };
        // Every arithmetic type, as the forward (integer division by zero is 0).
        dispatch_arith!(dx.dtype, cx.attrs.op, T => {
            // A norm with an out_dtype: the gradient and output are converted to the input's.
            let g = elems_as::<T>(cx.attrs.op, &ins[0])?;
            let y = ins.get(2).map(|b| elems_as::<T>(cx.attrs.op, b)).transpose()?;
            let (g, y) = (&g[..], y.as_deref().unwrap_or(&[]));
            let x = ins.get(1).map_or(&[][..], |b| b.as_slice::<T>());
            let d = dx.as_mut::<T>();
            match kind {
                SUM => backward_typed::<T, SUM>(&plan, g, x, y, d),
                MEAN => backward_typed::<T, MEAN>(&plan, g, x, y, d),
                PROD => backward_typed::<T, PROD>(&plan, g, x, y, d),
                NANSUM => backward_typed::<T, NANSUM>(&plan, g, x, y, d),
                NANPROD => backward_typed::<T, NANPROD>(&plan, g, x, y, d),
                EXTREME => backward_typed::<T, EXTREME>(&plan, g, x, y, d),
                NORM1 => backward_typed::<T, NORM1>(&plan, g, x, y, d),
                _ => backward_typed::<T, NORM2>(&plan, g, x, y, d),
            }
        });
        Ok(())
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for (name, kind) in [
        ("_backward_sum", SUM),
        ("_backward_mean", MEAN),
        ("_backward_prod", PROD),
        ("_backward_nansum", NANSUM),
        ("_backward_nanprod", NANPROD),
        ("_backward_max", EXTREME),
        ("_backward_min", EXTREME),
    ] {
        let params = params_of(ops, "sum");
        let mut def = OpDef::backward(name, params, compute(kind));
        if kind == SUM || kind == MEAN {
            def = def.gpu(crate::op::gpu::GpuKernel::ReduceGrad {
                mean: kind == MEAN,
                flags: |a, ndim| flags_of(a.op, a, ndim),
            });
        }
        ops.push(def);
    }
    let params = params_of(ops, "norm");
    ops.push(OpDef::backward("_backward_norm", params, compute(NORM2)));
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    /// A shape and parameters.
    type Case = (&'static [usize], &'static [(&'static str, &'static str)]);

    const CASES: &[Case] = &[
        (&[3, 4, 5], &[]),
        (&[3, 4, 5], &[("axis", "1")]),
        (&[3, 4, 5], &[("axis", "(0, 2)"), ("keepdims", "True")]),
        (&[3, 4, 5], &[("axis", "1"), ("exclude", "True")]),
        (&[3, 1, 5], &[("axis", "-1")]),
        (&[2, 3, 4, 5], &[("axis", "(1, 3)")]),
        (&[2, 3, 4, 5], &[("axis", "(0, 1)"), ("keepdims", "True")]),
        (&[4], &[("axis", "0")]),
    ];

    #[test]
    fn sums_and_means() {
        for &(shape, params) in CASES {
            let n = shape.iter().product();
            for op in ["sum", "mean", "nansum"] {
                check(op, params, &[(shape, values(n, -2.0, 2.0, 3))], &[]);
            }
        }
    }

    #[test]
    fn products() {
        for &(shape, params) in CASES {
            let n = shape.iter().product();
            // Away from zero so that out / x is the derivative.
            let x: Vec<f64> =
                values(n, 0.5, 1.5, 5).into_iter().enumerate().map(|(i, v)| if i % 3 == 0 { -v } else { v }).collect();
            for op in ["prod", "nanprod"] {
                check(op, params, &[(shape, x.clone())], &[]);
            }
        }
    }

    #[test]
    fn extremes() {
        for &(shape, params) in CASES {
            let n = shape.iter().product();
            // Distinct values: no ties.
            let x: Vec<f64> = (0..n).map(|i| ((i * 37) % n) as f64 * 0.1 - 1.0).collect();
            for op in ["max", "min"] {
                check(op, params, &[(shape, x.clone())], &[]);
            }
        }
    }

    #[test]
    fn norms() {
        let cases: &[Case] = &[
            (&[3, 4, 5], &[]),
            (&[3, 4, 5], &[("axis", "1")]),
            (&[3, 4, 5], &[("axis", "(0, 2)"), ("keepdims", "True")]),
            (&[3, 4, 5], &[("ord", "1"), ("axis", "-1")]),
            (&[3, 4, 5], &[("ord", "1")]),
        ];
        for &(shape, params) in cases {
            let n = shape.iter().product();
            let x: Vec<f64> =
                values(n, -2.0, 2.0, 9).into_iter().map(|v| if v.abs() < 0.1 { 0.5 } else { v }).collect();
            check("norm", params, &[(shape, x)], &[]);
        }
    }
}

#[cfg(test)]
mod large {
    use crate::ndarray::DType;
    use crate::op::tensor::{OutBlob, TBlob};
    use crate::op::{lookup, OpCtx, Req};

    /// float32, large enough for the row loop to split across threads; against a naive loop.
    #[test]
    fn mean_and_max_split_rows() {
        let shape = [3usize, 2000, 5];
        let n: usize = shape.iter().product();
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1013) as f32).collect();
        for (fwd, bwd) in [("mean", "_backward_mean"), ("max", "_backward_max")] {
            let op = lookup(fwd).unwrap();
            let attrs = op.parse_attrs([("axis", "1")], 1).unwrap();
            let mut y = vec![0f32; 15];
            let mut g: Vec<f32> = (0..15).map(|i| i as f32 + 1.0).collect();
            let mut dx = vec![f32::NAN; n];
            let mut xs = x.clone();
            // SAFETY: the vectors outlive the blobs and match their shapes.
            let (xb, yw, gb) = unsafe {
                (
                    TBlob::new(xs.as_mut_ptr().cast(), &shape, DType::F32),
                    OutBlob::new(y.as_mut_ptr().cast(), &[3, 5], DType::F32),
                    TBlob::new(g.as_mut_ptr().cast(), &[3, 5], DType::F32),
                )
            };
            let req = [Req::Write];
            let cx = OpCtx { attrs: &attrs, req: &req, rng: None, is_train: true, temp: None };
            (op.compute)(&cx, std::slice::from_ref(&xb), &mut [yw]).unwrap();
            // SAFETY: as above; `y` was written by the call that has returned, and `dx` is
            // read only after the backward call.
            let (yb, db) = unsafe {
                (
                    TBlob::new(y.as_ptr().cast(), &[3, 5], DType::F32),
                    OutBlob::new(dx.as_mut_ptr().cast(), &shape, DType::F32),
                )
            };
            (lookup(bwd).unwrap().compute)(&cx, &[gb, xb, yb], &mut [db]).unwrap();
            for i in 0..n {
                let (a, c) = (i / 10000, i % 5);
                let o = a * 5 + c;
                let want = if fwd == "mean" {
                    g[o] / 2000.0
                } else if x[i] == y[o] {
                    g[o]
                } else {
                    0.0
                };
                assert_eq!(dx[i], want, "{bwd} at {i}");
            }
        }
    }
}
