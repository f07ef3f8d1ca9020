//! `Correlation` (FlowNet's correlation layer: patches of one feature map compared with
//! displaced patches of another, by product or absolute difference) and its backward
//! operator.
//!
//! Owns the layer's geometry ([`Geometry`], stock's rules: an odd kernel, output positions
//! `ceil((padded - 2 * border) / stride1)`, `(2 * (max_displacement / stride2) + 1)²`
//! displacements) and its kernels. As stock's, the forward also writes the zero-padded
//! inputs in (N, H, W, C) layout as its hidden outputs `tmp1` and `tmp2`, which the backward
//! reads; the gradient reaches only the unpadded positions. float16 accumulates in float32.

use super::im2col::float;
use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

op_params! {
    struct CorrParams<'a> => CORR_PARAMS {
        kernel_size: i64 = "1", "kernel size for Correlation must be an odd number";
        max_displacement: i64 = "1", "Max displacement of Correlation ";
        stride1: i64 = "1", "stride1 quantize data1 globally";
        stride2: i64 = "1", "stride2 quantize data2 within the neighborhood centered around data1";
        pad_size: i64 = "0", "pad for Correlation";
        is_multiply: bool = "True", "operation type is either multiplication or subduction";
    }
}

/// One correlation's sizes, from the parameters and data1's (N, C, H, W).
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    pad: usize,
    k: usize,
    max_d: usize,
    stride1: usize,
    stride2: usize,
    multiply: bool,
    /// Padded height and width.
    hp: usize,
    wp: usize,
    /// Output height and width.
    th: usize,
    tw: usize,
    /// Displacements per axis (the output has `grid²` channels) and its radius.
    grid: usize,
    radius: usize,
}

impl Geometry {
    fn of(a: &Attrs, data: &[usize]) -> Result<Geometry> {
        let p = CorrParams::of(a);
        let op = a.op;
        // Stock's parameters are 32-bit unsigned.
        let nonneg = |name: &str, v: i64, min: i64| -> Result<usize> {
            if v < min || v > i64::from(u32::MAX) {
                return Err(Error::value(format!(
                    "operator {op}: {name} must be between {min} and {}, got {v}",
                    u32::MAX
                )));
            }
            Ok(v as usize)
        };
        let k = nonneg("kernel_size", p.kernel_size, 0)?;
        if k % 2 == 0 {
            return Err(Error::value(format!("operator {op}: kernel size should be odd number, got {k}")));
        }
        let (max_d, pad) = (nonneg("max_displacement", p.max_displacement, 0)?, nonneg("pad_size", p.pad_size, 0)?);
        let (stride1, stride2) = (nonneg("stride1", p.stride1, 1)?, nonneg("stride2", p.stride2, 1)?);
        let &[n, c, h, w] = data else {
            return Err(Error::value(format!("operator {op}: data should be a 4D tensor, got shape {data:?}")));
        };
        let too_big = || Error::value(format!("operator {op}: sizes overflow for data {data:?}"));
        let hp = h.checked_add(pad.checked_mul(2).ok_or_else(too_big)?).ok_or_else(too_big)?;
        let wp = w.checked_add(2 * pad).ok_or_else(too_big)?;
        let border = max_d.checked_add((k - 1) / 2).ok_or_else(too_big)?;
        let extent = |padded: usize| padded.checked_sub(2 * border).filter(|&e| e > 0).map(|e| e.div_ceil(stride1));
        let (Some(th), Some(tw)) = (extent(hp), extent(wp)) else {
            return Err(Error::value(format!(
                "operator {op}: Correlation cannot be done with current settings. Neighborhood and kernel don't fit \
                 in blob (data {data:?}, kernel_size {k}, max_displacement {max_d}, pad_size {pad})"
            )));
        };
        let radius = max_d / stride2;
        let grid = 2 * radius + 1;
        // The output's channels: one per displacement.
        grid.checked_mul(grid).ok_or_else(too_big)?;
        Ok(Geometry {
            n,
            c,
            h,
            w,
            pad,
            k,
            max_d,
            stride1,
            stride2,
            multiply: p.is_multiply,
            hp,
            wp,
            th,
            tw,
            grid,
            radius,
        })
    }

    fn out_shape(&self) -> Vec<usize> {
        vec![self.n, self.grid * self.grid, self.th, self.tw]
    }

    fn padded_shape(&self) -> Vec<usize> {
        vec![self.n, self.hp, self.wp, self.c]
    }

    /// The top-left corners (row, column) in the padded maps of output position (i, j)'s
    /// patch in data1 and, for displacement channel `tc`, in data2.
    fn corners(&self, i: usize, j: usize, tc: usize) -> ((usize, usize), (usize, usize)) {
        let (y1, x1) = (i * self.stride1 + self.max_d, j * self.stride1 + self.max_d);
        // In range: the displacement is at most max_displacement either way.
        let dy = (tc / self.grid) as isize - self.radius as isize;
        let dx = (tc % self.grid) as isize - self.radius as isize;
        let y2 = (y1 as isize + dy * self.stride2 as isize) as usize;
        let x2 = (x1 as isize + dx * self.stride2 as isize) as usize;
        ((y1, x1), (y2, x2))
    }

    fn sum_elems(&self) -> f64 {
        self.k as f64 * self.k as f64 * self.c as f64
    }
}

/// `x` (N, C, H, W) into `out` (N, Hp, Wp, C), zero-padded by `pad`.
fn pad_nhwc<T: Elem>(g: &Geometry, x: &[T], out: &mut [T]) {
    let img = g.hp * g.wp * g.c;
    if img == 0 {
        return;
    }
    par_for_mut(out, img, Cost(2.0 * img as f64), T::DTYPE, |r, o| {
        for (k, dst) in o.chunks_mut(img).enumerate() {
            let src = &x[(r.start + k) * g.c * g.h * g.w..][..g.c * g.h * g.w];
            dst.fill(T::from_f64(0.0));
            for c in 0..g.c {
                for y in 0..g.h {
                    for xx in 0..g.w {
                        dst[((y + g.pad) * g.wp + xx + g.pad) * g.c + c] = src[(c * g.h + y) * g.w + xx];
                    }
                }
            }
        }
    });
}

fn forward<T: Elem, R: Real>(g: &Geometry, t1: &[T], t2: &[T], out: &mut [T]) {
    let plane = g.th * g.tw;
    let channels = g.grid * g.grid;
    if plane == 0 || out.is_empty() {
        return;
    }
    let img = g.hp * g.wp * g.c;
    let scale = R::of(1.0 / g.sum_elems());
    let cost = Cost(plane as f64 * g.sum_elems() * 2.0);
    par_for_mut(out, plane, cost, T::DTYPE, |r, o| {
        for (k, dst) in o.chunks_mut(plane).enumerate() {
            let (n, tc) = ((r.start + k) / channels, (r.start + k) % channels);
            let (a, b) = (&t1[n * img..][..img], &t2[n * img..][..img]);
            for i in 0..g.th {
                for j in 0..g.tw {
                    let ((y1, x1), (y2, x2)) = g.corners(i, j, tc);
                    let mut acc = R::of(0.0);
                    for h in 0..g.k {
                        for w in 0..g.k {
                            let pa = &a[((y1 + h) * g.wp + x1 + w) * g.c..][..g.c];
                            let pb = &b[((y2 + h) * g.wp + x2 + w) * g.c..][..g.c];
                            for (&u, &v) in pa.iter().zip(pb) {
                                let (u, v) = (R::load(u), R::load(v));
                                acc = acc + if g.multiply { u * v } else { (u - v).abs() };
                            }
                        }
                    }
                    dst[i * g.tw + j] = (acc * scale).store();
                }
            }
        }
    });
}

/// The gradient of data1 (`first`) or data2 from the output gradient `og` and the padded
/// maps, into `dx` (N, C, H, W): accumulated per image over the padded map, then its interior
/// written out.
fn backward<T: Elem, R: Real>(g: &Geometry, og: &[T], t1: &[T], t2: &[T], first: bool, dx: &mut [T]) {
    let img = g.c * g.h * g.w;
    if img == 0 {
        return;
    }
    let (pimg, plane, channels) = (g.hp * g.wp * g.c, g.th * g.tw, g.grid * g.grid);
    let scale = R::of(1.0 / g.sum_elems());
    let cost = Cost(channels as f64 * plane as f64 * g.sum_elems() * 2.0);
    par_for_mut(dx, img, cost, T::DTYPE, |r, o| {
        for (k, dst) in o.chunks_mut(img).enumerate() {
            let n = r.start + k;
            let (a, b) = (&t1[n * pimg..][..pimg], &t2[n * pimg..][..pimg]);
            let mut acc = vec![R::of(0.0); pimg];
            for tc in 0..channels {
                for i in 0..g.th {
                    for j in 0..g.tw {
                        let gv = R::load(og[(n * channels + tc) * plane + i * g.tw + j]) * scale;
                        let ((y1, x1), (y2, x2)) = g.corners(i, j, tc);
                        let (ty, tx) = if first { (y1, x1) } else { (y2, x2) };
                        for h in 0..g.k {
                            for w in 0..g.k {
                                let o1 = ((y1 + h) * g.wp + x1 + w) * g.c;
                                let o2 = ((y2 + h) * g.wp + x2 + w) * g.c;
                                let dst = &mut acc[((ty + h) * g.wp + tx + w) * g.c..][..g.c];
                                for (c, d) in dst.iter_mut().enumerate() {
                                    let (u, v) = (R::load(a[o1 + c]), R::load(b[o2 + c]));
                                    *d = *d
                                        + if g.multiply {
                                            gv * if first { v } else { u }
                                        } else {
                                            // Stock's sign: data1's is + where u >= v, data2's the opposite.
                                            let s = if (u >= v) == first { R::of(1.0) } else { R::of(-1.0) };
                                            gv * s
                                        };
                                }
                            }
                        }
                    }
                }
            }
            for c in 0..g.c {
                for y in 0..g.h {
                    for x in 0..g.w {
                        dst[(c * g.h + y) * g.w + x] = acc[((y + g.pad) * g.wp + x + g.pad) * g.c + c].store();
                    }
                }
            }
        }
    });
}

fn correlation_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let g = Geometry::of(cx.attrs, &ins[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let [out, tmp1, tmp2] = outs else {
            return Err(Error::internal("Correlation has three outputs"));
        };
        pad_nhwc::<T>(&g, ins[0].as_slice::<T>(), tmp1.as_mut::<T>());
        pad_nhwc::<T>(&g, ins[1].as_slice::<T>(), tmp2.as_mut::<T>());
        forward::<T, R>(&g, tmp1.as_slice::<T>(), tmp2.as_slice::<T>(), out.as_mut::<T>());
    });
    Ok(())
}

/// `_backward_Correlation(dout, out, tmp1, tmp2) -> (ddata1, ddata2)`.
fn correlation_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let g = Geometry::of(cx.attrs, &outs[0].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (og, t1, t2) = (ins[0].as_slice::<T>(), ins[2].as_slice::<T>(), ins[3].as_slice::<T>());
        for (i, dx) in outs.iter_mut().enumerate() {
            if cx.req[i] != Req::Null {
                backward::<T, R>(&g, og, t1, t2, i == 0, dx.as_mut::<T>());
            }
        }
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "Correlation",
            Inputs::Fixed(&["data1", "data2"]),
            Box::new(|a, ins| {
                float(a.op, &ins[0])?;
                if ins[1].shape != ins[0].shape || ins[1].dtype != ins[0].dtype {
                    return Err(Error::value(format!(
                        "operator {}: data2 ({:?}, {}) must have data1's shape and dtype ({:?}, {})",
                        a.op,
                        ins[1].shape,
                        ins[1].dtype.name(),
                        ins[0].shape,
                        ins[0].dtype.name()
                    )));
                }
                let g = Geometry::of(a, &ins[0].shape)?;
                let dt = ins[0].dtype;
                Ok(vec![Meta::new(g.out_shape(), dt), Meta::new(g.padded_shape(), dt), Meta::new(g.padded_shape(), dt)])
            }),
            Box::new(correlation_forward),
        )
        .params(CORR_PARAMS)
        .outputs(|_| 3, |_| 1)
        .output_names(&["output", "tmp1", "tmp2"])
        .grad(Grad::Backward { op: "_backward_Correlation", inputs: false, outputs: true })
        .doc("Applies correlation to inputs: each patch of data1 (kernel_size², at positions strided by stride1) is compared with the patches of data2 displaced by up to max_displacement (in steps of stride2), by dot product (is_multiply) or by the sum of absolute differences, divided by kernel_size² times the channels; one output channel per displacement."),
    );
    ops.push(OpDef::backward("_backward_Correlation", CORR_PARAMS, Box::new(correlation_backward)));
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    /// Gradients against finite differences, by product and by absolute difference, with
    /// padding, strides and a 3×3 kernel.
    #[test]
    fn gradients() {
        for (shape, params) in [
            (&[2usize, 3, 5, 5][..], &[("kernel_size", "1"), ("max_displacement", "2"), ("pad_size", "2")][..]),
            (&[1, 2, 6, 5], &[("kernel_size", "3"), ("max_displacement", "1"), ("stride1", "2"), ("pad_size", "2")]),
            (
                &[1, 1, 7, 7],
                &[("max_displacement", "2"), ("stride2", "2"), ("pad_size", "1"), ("is_multiply", "False")],
            ),
        ] {
            let n: usize = shape.iter().product();
            check("Correlation", params, &[(shape, values(n, -1.0, 1.0, 3)), (shape, values(n, -1.0, 1.0, 4))], &[]);
        }
    }
}
