//! `_contrib_DeformableConvolution` (deformable convolution, DCNv1) and
//! `_contrib_ModulatedDeformableConvolution` (DCNv2: each tap also scaled by a mask), with
//! their backward operators.
//!
//! Owns both operators' geometry ([`Deform`]: stock's 2-D-only rules and shape checks), the
//! sampling of a kernel tap at its offset position ([`tap`]: bilinear, where DCNv1 samples
//! only inside the image and holds the last row and column, and DCNv2 reads zeros outside,
//! as stock's kernels do), and the kernels. The forward samples one image's columns
//! (channel-major, then taps, as `Convolution`'s im2col) and multiplies them with each
//! group's weight (the shared GEMM). The backward multiplies back (`Wᵀ·dY`), gives the
//! offsets (and DCNv2's mask) each sample's derivative, scatters the samples' weights onto
//! the data, and samples again for the weight gradient. float16 samples and accumulates in
//! float32. Stock 1.9.1's CPU build has no DCNv2 backward (its GPU build has); this one
//! computes the same derivatives.

use super::conv::widen;
use super::linalg::{gemm, GemmElem};
use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::{par_for_mut, par_items, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req, Resource};

const LAYOUT_DOC: &str =
    "Set layout for input, output and weight. Empty for\n    default layout: NCW for 1d, NCHW for 2d and NCDHW for 3d.";

op_params! {
    struct DeformParams<'a> => DEFORM_PARAMS {
        kernel: &'a [i64] = required, "Convolution kernel size: (h, w) or (d, h, w)";
        stride: &'a [i64] = "[]", "Convolution stride: (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        dilate: &'a [i64] = "[]", "Convolution dilate: (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        pad: &'a [i64] = "[]", "Zero pad for convolution: (h, w) or (d, h, w). Defaults to no padding.";
        num_filter: i64 = required, "Convolution filter(channel) number";
        num_group: i64 = "1", "Number of group partitions.";
        num_deformable_group: i64 = "1", "Number of deformable group partitions.";
        workspace: i64 = "1024", "Maximum temperal workspace allowed for convolution (MB).";
        no_bias: bool = "False", "Whether to disable bias parameter.";
        layout: Option<&'a str> = "None" in ["NCDHW", "NCHW", "NCW"], LAYOUT_DOC;
    }
}

op_params! {
    struct ModulatedParams<'a> => MODULATED_PARAMS {
        kernel: &'a [i64] = required, "Convolution kernel size: (h, w) or (d, h, w)";
        stride: &'a [i64] = "[]", "Convolution stride: (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        dilate: &'a [i64] = "[]", "Convolution dilate: (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        pad: &'a [i64] = "[]", "Zero pad for convolution: (h, w) or (d, h, w). Defaults to no padding.";
        num_filter: i64 = required, "Convolution filter(channel) number";
        num_group: i64 = "1", "Number of group partitions.";
        num_deformable_group: i64 = "1", "Number of deformable group partitions.";
        workspace: i64 = "1024", "Maximum temperal workspace allowed for convolution (MB).";
        no_bias: bool = "False", "Whether to disable bias parameter.";
        im2col_step: i64 = "64", "Maximum number of images per im2col computation; The total batch size should be divisable by this value or smaller than this value; if you face out of memory problem, you can try to use a smaller value here.";
        layout: Option<&'a str> = "None" in ["NCDHW", "NCHW", "NCW"], LAYOUT_DOC;
    }
}

/// The parameters both operators share, and DCNv2's `im2col_step` (None for DCNv1).
struct Common<'a> {
    kernel: &'a [i64],
    stride: &'a [i64],
    dilate: &'a [i64],
    pad: &'a [i64],
    num_filter: i64,
    num_group: i64,
    num_deformable_group: i64,
    workspace: i64,
    im2col_step: Option<i64>,
    layout: Option<&'a str>,
}

fn common<'a>(a: &'a Attrs) -> Common<'a> {
    if a.declares(MODULATED_PARAMS) {
        let p = ModulatedParams::of(a);
        Common {
            kernel: p.kernel,
            stride: p.stride,
            dilate: p.dilate,
            pad: p.pad,
            num_filter: p.num_filter,
            num_group: p.num_group,
            num_deformable_group: p.num_deformable_group,
            workspace: p.workspace,
            im2col_step: Some(p.im2col_step),
            layout: p.layout,
        }
    } else {
        let p = DeformParams::of(a);
        Common {
            kernel: p.kernel,
            stride: p.stride,
            dilate: p.dilate,
            pad: p.pad,
            num_filter: p.num_filter,
            num_group: p.num_group,
            num_deformable_group: p.num_deformable_group,
            workspace: p.workspace,
            im2col_step: None,
            layout: p.layout,
        }
    }
}

/// One call's sizes: data (n, c, h, w), `f` filters in `g` groups, `dg` deformable groups
/// (each a run of channels with its own offsets), the kernel, and the output (n, f, *out).
#[derive(Debug, Clone)]
struct Deform {
    modulated: bool,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    f: usize,
    g: usize,
    dg: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilate: [usize; 2],
    pad: [usize; 2],
    out: [usize; 2],
}

impl Deform {
    fn of(a: &Attrs, data: &[usize]) -> Result<Deform> {
        let op = a.op;
        let p = common(a);
        if p.kernel.len() != 2 {
            return Err(Error::value(format!(
                "operator {op}: kernel {:?} is not implemented: the kernel must be 2-D (h, w)",
                p.kernel
            )));
        }
        if let Some(layout) = p.layout.filter(|&l| l != "NCHW") {
            return Err(Error::value(format!("operator {op}: layout {layout} does not fit a 2-D kernel (NCHW only)")));
        }
        let &[n, c, h, w] = data else {
            return Err(Error::value(format!(
                "operator {op}: data should be 4D in batch-num_filter-y-x, got {data:?}"
            )));
        };
        let two = |v: [usize; 3]| [v[1], v[2]];
        let kernel = two(widen(op, "kernel", p.kernel, 2, 1, 1)?);
        let stride = two(widen(op, "stride", p.stride, 2, 1, 1)?);
        let dilate = two(widen(op, "dilate", p.dilate, 2, 1, 1)?);
        let pad = two(widen(op, "pad", p.pad, 2, 0, 0)?);
        let positive = |name: &str, v: i64| -> Result<usize> {
            if v < 1 {
                return Err(Error::value(format!("operator {op}: {name} must be positive, got {v}")));
            }
            Ok(v as usize)
        };
        let f = positive("num_filter", p.num_filter)?;
        let g = positive("num_group", p.num_group)?;
        let dg = positive("num_deformable_group", p.num_deformable_group)?;
        if p.workspace < 0 {
            return Err(Error::value(format!("operator {op}: workspace must be >= 0, got {}", p.workspace)));
        }
        if c % g != 0 {
            return Err(Error::value(format!("operator {op}: input num_filter ({c}) must divide group size ({g})")));
        }
        if c % dg != 0 {
            return Err(Error::value(format!(
                "operator {op}: input num_filter ({c}) must divide deformable group size ({dg})"
            )));
        }
        if f % g != 0 {
            return Err(Error::value(format!("operator {op}: output num_filter ({f}) must divide group size ({g})")));
        }
        if let Some(step) = p.im2col_step {
            let step = positive("im2col_step", step)?;
            if n > step && n % step != 0 {
                return Err(Error::value(format!(
                    "operator {op}: input batchsize ({n}) must be smaller than or divide im2col_step ({step})"
                )));
            }
            if f % dg != 0 {
                return Err(Error::value(format!(
                    "operator {op}: output num_filter ({f}) must divide deformable group size ({dg})"
                )));
            }
        }
        let too_big = || Error::value(format!("operator {op}: sizes overflow for data {data:?}"));
        kernel[0].checked_mul(kernel[1]).ok_or_else(too_big)?;
        let mut out = [0; 2];
        for (d, size) in [h, w].into_iter().enumerate() {
            let span = dilate[d].checked_mul(kernel[d] - 1).and_then(|s| s.checked_add(1)).ok_or_else(too_big)?;
            let padded = pad[d].checked_mul(2).and_then(|p| p.checked_add(size)).ok_or_else(too_big)?;
            if span > padded {
                return Err(Error::value(format!(
                    "operator {op}: kernel {kernel:?} (dilate {dilate:?}) exceeds the padded input {:?}",
                    [h, w]
                )));
            }
            out[d] = (padded - span) / stride[d] + 1;
        }
        let d = Deform { modulated: p.im2col_step.is_some(), n, c, h, w, f, g, dg, kernel, stride, dilate, pad, out };
        // The output plane, the column matrix of one image, and the offsets of one image.
        let osz = out[0].checked_mul(out[1]).ok_or_else(too_big)?;
        d.c.checked_mul(d.taps())
            .and_then(|r| r.checked_mul(osz))
            .and_then(|r| r.checked_mul(16))
            .and_then(|_| (2 * dg).checked_mul(d.taps()).and_then(|r| r.checked_mul(d.osz())))
            .ok_or_else(too_big)?;
        Ok(d)
    }

    fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }
    fn osz(&self) -> usize {
        self.out[0] * self.out[1]
    }
    fn hw(&self) -> usize {
        self.h * self.w
    }
    /// Channels per deformable group.
    fn cdg(&self) -> usize {
        self.c / self.dg
    }
    /// Rows of one group's column matrix.
    fn kdim(&self) -> usize {
        self.c / self.g * self.taps()
    }
    fn out_shape(&self) -> Vec<usize> {
        vec![self.n, self.f, self.out[0], self.out[1]]
    }
    fn offset_shape(&self) -> Vec<usize> {
        vec![self.n, self.dg * 2 * self.taps(), self.out[0], self.out[1]]
    }
    fn mask_shape(&self) -> Vec<usize> {
        vec![self.n, self.dg * self.taps(), self.out[0], self.out[1]]
    }
    fn weight_shape(&self) -> Vec<usize> {
        vec![self.f, self.c / self.g, self.kernel[0], self.kernel[1]]
    }
    /// Input indices: data, offset, [mask,] weight, [bias].
    fn weight_input(&self) -> usize {
        if self.modulated {
            3
        } else {
            2
        }
    }

    /// The sampling position of tap `t` at output position `p` in deformable group `grp`,
    /// with the tap's mask (1 for DCNv1); `off` and `mask` are one image's.
    #[inline(always)]
    fn position<T: Elem, R: Real>(&self, off: &[T], mask: Option<&[T]>, grp: usize, t: usize, p: usize) -> (R, R, R) {
        let osz = self.osz();
        let base = (grp * 2 * self.taps() + 2 * t) * osz + p;
        let (i, j) = (t / self.kernel[1], t % self.kernel[1]);
        let (oy, ox) = (p / self.out[1], p % self.out[1]);
        let y0 = (oy * self.stride[0] + i * self.dilate[0]) as f64 - self.pad[0] as f64;
        let x0 = (ox * self.stride[1] + j * self.dilate[1]) as f64 - self.pad[1] as f64;
        let m = mask.map_or(R::of(1.0), |m| R::load(m[(grp * self.taps() + t) * osz + p]));
        (R::of(y0) + R::load(off[base]), R::of(x0) + R::load(off[base + osz]), m)
    }
}

/// A sample's up to four neighbours in the plane: flat index, bilinear weight, and that
/// weight's derivative along y and along x (all 0 for a neighbour outside the image).
struct Tap<R> {
    at: [usize; 4],
    wt: [R; 4],
    dy: [R; 4],
    dx: [R; 4],
}

impl<R: Real> Tap<R> {
    fn value<T: Elem>(&self, plane: &[T]) -> R {
        (0..4).fold(R::of(0.0), |s, i| s + self.wt[i] * R::load(plane[self.at[i]]))
    }
    /// The sample's derivatives along y and x.
    fn slopes<T: Elem>(&self, plane: &[T]) -> (R, R) {
        (0..4).fold((R::of(0.0), R::of(0.0)), |(sy, sx), i| {
            let v = R::load(plane[self.at[i]]);
            (sy + self.dy[i] * v, sx + self.dx[i] * v)
        })
    }
}

/// Where the sample at (y, x) of an `h`×`w` plane reads. None where it reads nothing (DCNv1:
/// outside `[0, h) × [0, w)`; DCNv2: outside `(-1, h) × (-1, w)`; either: a NaN position).
#[inline(always)]
fn tap<R: Real>(modulated: bool, h: usize, w: usize, y: R, x: R) -> Option<Tap<R>> {
    if h == 0 || w == 0 {
        return None;
    }
    let (yf, xf, hf, wf) = (y.f64(), x.f64(), h as f64, w as f64);
    let lo = if modulated { -1.0 } else { 0.0 };
    let inside = |v: f64, end: f64| if modulated { v > lo && v < end } else { v >= lo && v < end };
    if !(inside(yf, hf) && inside(xf, wf)) {
        return None;
    }
    let (yl, xl) = (yf.floor(), xf.floor());
    let (mut ly, mut lx) = (y - R::of(yl), x - R::of(xl));
    // Both floors are at least -1 and below the plane's size.
    let (yl, xl) = (yl as isize, xl as isize);
    let (mut yh, mut xh) = (yl + 1, xl + 1);
    // Whether the sample moves with y (x): DCNv1 holds the last row (column).
    let (mut sy, mut sx) = (R::of(1.0), R::of(1.0));
    if !modulated {
        if yl >= h as isize - 1 {
            (yh, ly, sy) = (yl, R::of(0.0), R::of(0.0));
        }
        if xl >= w as isize - 1 {
            (xh, lx, sx) = (xl, R::of(0.0), R::of(0.0));
        }
    }
    let (hy, hx) = (R::of(1.0) - ly, R::of(1.0) - lx);
    let zero = R::of(0.0);
    let mut t = Tap { at: [0; 4], wt: [zero; 4], dy: [zero; 4], dx: [zero; 4] };
    let corners = [
        (yl, xl, hy * hx, -hx * sy, -hy * sx),
        (yl, xh, hy * lx, -lx * sy, hy * sx),
        (yh, xl, ly * hx, hx * sy, -ly * sx),
        (yh, xh, ly * lx, lx * sy, ly * sx),
    ];
    for (k, (cy, cx, wt, dy, dx)) in corners.into_iter().enumerate() {
        if cy >= 0 && cx >= 0 && (cy as usize) < h && (cx as usize) < w {
            t.at[k] = cy as usize * w + cx as usize;
            (t.wt[k], t.dy[k], t.dx[k]) = (wt, dy, dx);
        }
    }
    Some(t)
}

/// One image's sampled columns: row `c·taps + t` holds channel c's tap t at every output
/// position, times the mask.
fn sample_cols<T: Elem, R: Real>(d: &Deform, x: &[T], off: &[T], mask: Option<&[T]>, cols: &mut [T]) {
    let (taps, osz, hw) = (d.taps(), d.osz(), d.hw());
    if taps * osz == 0 {
        return;
    }
    par_for_mut(cols, taps * osz, Cost((taps * osz) as f64 * 12.0), T::DTYPE, |r, o| {
        for (ci, rows) in r.zip(o.chunks_mut(taps * osz)) {
            let plane = &x[ci * hw..][..hw];
            let grp = ci / d.cdg();
            for (t, row) in rows.chunks_mut(osz).enumerate() {
                for (p, v) in row.iter_mut().enumerate() {
                    let (y, xx, m) = d.position::<T, R>(off, mask, grp, t, p);
                    let s = tap(d.modulated, d.h, d.w, y, xx).map_or(R::of(0.0), |tp| tp.value(plane) * m);
                    *v = s.store();
                }
            }
        }
    });
}

fn forward<T: GemmElem, R: Real>(d: &Deform, ins: &[TBlob], out: &mut [T], cols: &mut [T]) {
    let (x, off) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
    let mask = d.modulated.then(|| ins[2].as_slice::<T>());
    let wi = d.weight_input();
    let w = ins[wi].as_slice::<T>();
    let bias = ins.get(wi + 1).map(|b| b.as_slice::<T>());
    let (osz, kdim, fg) = (d.osz(), d.kdim(), d.f / d.g);
    let (img, oimg, mimg) = (d.c * d.hw(), 2 * d.dg * d.taps() * osz, d.dg * d.taps() * osz);
    for n in 0..d.n {
        let o = &mut out[n * d.f * osz..][..d.f * osz];
        let m = mask.map(|m| &m[n * mimg..][..mimg]);
        sample_cols::<T, R>(d, &x[n * img..][..img], &off[n * oimg..][..oimg], m, cols);
        for gi in 0..d.g {
            let wg = &w[gi * fg * kdim..][..fg * kdim];
            gemm(fg, osz, kdim, wg, false, &cols[gi * kdim * osz..], false, &mut o[gi * fg * osz..], false);
        }
        if let Some(b) = bias {
            for (fi, plane) in o.chunks_exact_mut(osz.max(1)).enumerate() {
                let bv = R::load(b[fi]);
                for v in plane {
                    *v = (R::load(*v) + bv).store();
                }
            }
        }
    }
}

fn deformable_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let d = Deform::of(cx.attrs, &ins[0].shape)?;
    if outs[0].size() == 0 {
        return Ok(());
    }
    let col_len = d.c * d.taps() * d.osz();
    let mut ws = cx.workspace(col_len * ins[0].dtype.size())?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        forward::<T, R>(&d, ins, outs[0].as_mut::<T>(), &mut ws.as_mut::<T>()[..col_len])
    });
    Ok(())
}

/// One image's offset and mask gradients from its column gradient `cg`: one item per
/// (deformable group, tap), each summing over the group's channels.
#[allow(clippy::too_many_arguments)]
fn coord_grads<T: Elem, R: Real>(
    d: &Deform,
    x: &[T],
    off: &[T],
    mask: Option<&[T]>,
    cg: &[T],
    doff: &mut [T],
    dmask: &mut [T],
) {
    let (taps, osz, hw, cdg) = (d.taps(), d.osz(), d.hw(), d.cdg());
    if osz == 0 {
        return;
    }
    let items: Vec<_> = doff.chunks_mut(2 * osz).zip(dmask.chunks_mut(osz)).collect();
    par_items(items, (d.dg * taps * cdg * osz) as f64 * 30.0, T::DTYPE, |k, (dof, dm)| {
        let (grp, t) = (k / taps, k % taps);
        let mut acc = vec![R::of(0.0); 3 * osz];
        for ci in grp * cdg..(grp + 1) * cdg {
            let plane = &x[ci * hw..][..hw];
            let row = &cg[(ci * taps + t) * osz..][..osz];
            for (p, &gv) in row.iter().enumerate() {
                let (y, xx, m) = d.position::<T, R>(off, mask, grp, t, p);
                let Some(tp) = tap(d.modulated, d.h, d.w, y, xx) else { continue };
                let gv = R::load(gv);
                let (sy, sx) = tp.slopes(plane);
                acc[p] = acc[p] + gv * m * sy;
                acc[osz + p] = acc[osz + p] + gv * m * sx;
                if d.modulated {
                    acc[2 * osz + p] = acc[2 * osz + p] + gv * tp.value(plane);
                }
            }
        }
        for (o, a) in dof.iter_mut().zip(&acc[..2 * osz]) {
            *o = a.store();
        }
        for (o, a) in dm.iter_mut().zip(&acc[2 * osz..]) {
            *o = a.store();
        }
    });
}

/// One image's data gradient from its column gradient `cg`: each channel's samples'
/// bilinear weights, scaled by the mask, scattered onto its plane.
fn data_grad<T: Elem, R: Real>(d: &Deform, off: &[T], mask: Option<&[T]>, cg: &[T], dx: &mut [T]) {
    let (taps, osz, hw) = (d.taps(), d.osz(), d.hw());
    if hw == 0 {
        return;
    }
    par_for_mut(dx, hw, Cost((taps * osz) as f64 * 12.0), T::DTYPE, |r, o| {
        for (ci, plane) in r.zip(o.chunks_mut(hw)) {
            let grp = ci / d.cdg();
            let mut acc = vec![R::of(0.0); hw];
            for t in 0..taps {
                let row = &cg[(ci * taps + t) * osz..][..osz];
                for (p, &gv) in row.iter().enumerate() {
                    let (y, xx, m) = d.position::<T, R>(off, mask, grp, t, p);
                    let Some(tp) = tap(d.modulated, d.h, d.w, y, xx) else { continue };
                    let gv = R::load(gv) * m;
                    for k in 0..4 {
                        acc[tp.at[k]] = acc[tp.at[k]] + tp.wt[k] * gv;
                    }
                }
            }
            for (v, a) in plane.iter_mut().zip(acc) {
                *v = a.store();
            }
        }
    });
}

/// `_backward_*(dY, data, offset, [mask,] weight, [bias]) -> the same inputs' gradients`.
fn backward<T: GemmElem, R: Real>(d: &Deform, req: &[Req], ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (dy, x, off) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
    let mask = d.modulated.then(|| ins[3].as_slice::<T>());
    let wi = d.weight_input();
    let w = ins[wi + 1].as_slice::<T>();
    let (osz, kdim, fg, taps) = (d.osz(), d.kdim(), d.f / d.g, d.taps());
    let (img, oimg, mimg) = (d.c * d.hw(), 2 * d.dg * taps * osz, d.dg * taps * osz);
    let want = |i: usize| req.get(i).is_some_and(|&r| r != Req::Null);
    let col_len = d.c * taps * osz;
    let mut cg = vec![T::zero(); col_len];
    let mut cols = vec![T::zero(); if want(wi) { col_len } else { 0 }];
    // Gradients of an input not asked for go to scratch of one image.
    let (mut spare_off, mut spare_mask) = (vec![T::zero(); oimg], vec![T::zero(); mimg]);
    let (dx_out, rest) = outs.split_at_mut(1);
    let (doff_out, rest) = rest.split_at_mut(1);
    let (dmask_out, rest) = if d.modulated { rest.split_at_mut(1) } else { rest.split_at_mut(0) };
    let (dw_out, db_out) = rest.split_at_mut(1);
    let mut dxs = want(0).then(|| dx_out[0].as_mut::<T>());
    let mut doffs = want(1).then(|| doff_out[0].as_mut::<T>());
    let mut dmasks = (d.modulated && want(2)).then(|| dmask_out[0].as_mut::<T>());
    let mut dws = want(wi).then(|| dw_out[0].as_mut::<T>());
    if let Some(dw) = dws.as_deref_mut() {
        dw.fill(T::zero());
    }
    for n in 0..d.n {
        let dyi = &dy[n * d.f * osz..][..d.f * osz];
        let (xn, offn) = (&x[n * img..][..img], &off[n * oimg..][..oimg]);
        let maskn = mask.map(|m| &m[n * mimg..][..mimg]);
        for gi in 0..d.g {
            let wg = &w[gi * fg * kdim..][..fg * kdim];
            gemm(kdim, osz, fg, wg, true, &dyi[gi * fg * osz..], false, &mut cg[gi * kdim * osz..], false);
        }
        if want(1) || (d.modulated && want(2)) {
            let dof = match doffs.as_deref_mut() {
                Some(s) => &mut s[n * oimg..][..oimg],
                None => &mut spare_off[..],
            };
            let dm = match dmasks.as_deref_mut() {
                Some(s) => &mut s[n * mimg..][..mimg],
                None => &mut spare_mask[..],
            };
            coord_grads::<T, R>(d, xn, offn, maskn, &cg, dof, dm);
        }
        if let Some(dx) = dxs.as_deref_mut() {
            data_grad::<T, R>(d, offn, maskn, &cg, &mut dx[n * img..][..img]);
        }
        if let Some(dw) = dws.as_deref_mut() {
            sample_cols::<T, R>(d, xn, offn, maskn, &mut cols);
            for gi in 0..d.g {
                let dwg = &mut dw[gi * fg * kdim..][..fg * kdim];
                gemm(fg, kdim, osz, &dyi[gi * fg * osz..], false, &cols[gi * kdim * osz..], true, dwg, true);
            }
        }
    }
    if want(wi + 1) {
        let db = db_out[0].as_mut::<T>();
        for (fi, b) in db.iter_mut().enumerate() {
            let mut s = R::of(0.0);
            for n in 0..d.n {
                for &v in &dy[(n * d.f + fi) * osz..][..osz] {
                    s = s + R::load(v);
                }
            }
            *b = s.store();
        }
    }
    Ok(())
}

fn deformable_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let d = Deform::of(cx.attrs, &ins[1].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => backward::<T, R>(&d, cx.req, ins, outs)?);
    Ok(())
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let dt = super::common::floats_like_first(op, ins)?;
    let d = Deform::of(a, &ins[0].shape)?;
    let mut want = vec![("offset", d.offset_shape())];
    if d.modulated {
        want.push(("mask", d.mask_shape()));
    }
    want.push(("weight", d.weight_shape()));
    want.push(("bias", vec![d.f]));
    for ((name, shape), m) in want.iter().zip(&ins[1..]) {
        if &m.shape != shape {
            return Err(Error::value(format!("operator {op}: {name} has shape {:?}, expected {shape:?}", m.shape)));
        }
    }
    Ok(vec![Meta::new(d.out_shape(), dt)])
}

/// Graph inference of the weight and bias from the data: `(num_filter, channels /
/// num_group, *kernel)` and `(num_filter,)`.
fn param_shapes(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let p = common(a);
    let wi = if p.im2col_step.is_some() { 3 } else { 2 };
    if data.len() != 4 || p.kernel.len() != 2 {
        return Ok(Vec::new());
    }
    let per_group = if data[1] < 0 || p.num_group <= 0 { -1 } else { data[1] / p.num_group };
    Ok(vec![(wi, vec![p.num_filter, per_group, p.kernel[0], p.kernel[1]]), (wi + 1, vec![p.num_filter])])
}

fn inputs_dcn(a: &Attrs) -> usize {
    if DeformParams::of(a).no_bias {
        3
    } else {
        4
    }
}

fn inputs_dcn2(a: &Attrs) -> usize {
    if ModulatedParams::of(a).no_bias {
        4
    } else {
        5
    }
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "_contrib_DeformableConvolution",
            Inputs::Leading(&["data", "offset", "weight", "bias"], inputs_dcn),
            Box::new(infer),
            Box::new(deformable_forward),
        )
        .params(DEFORM_PARAMS)
        .param_shapes(param_shapes)
        .grad(Grad::Backward { op: "_backward__contrib_DeformableConvolution", inputs: true, outputs: false })
        .resources(&[Resource::TempSpace])
        .doc("Compute 2-D deformable convolution on 4-D input (Dai et al., Deformable Convolutional Networks): each kernel tap samples the data bilinearly at its regular position plus a learned offset (offset: (N, num_deformable_group * 2 * kh * kw, H_out, W_out), the y then x displacement of each tap), then the samples are convolved with the weight as Convolution does."),
    );
    ops.push(OpDef::backward("_backward__contrib_DeformableConvolution", DEFORM_PARAMS, Box::new(deformable_backward)));
    ops.push(
        OpDef::new(
            "_contrib_ModulatedDeformableConvolution",
            Inputs::Leading(&["data", "offset", "mask", "weight", "bias"], inputs_dcn2),
            Box::new(infer),
            Box::new(deformable_forward),
        )
        .params(MODULATED_PARAMS)
        .param_shapes(param_shapes)
        .grad(Grad::Backward {
            op: "_backward__contrib_ModulatedDeformableConvolution",
            inputs: true,
            outputs: false,
        })
        .resources(&[Resource::TempSpace])
        .doc("Compute 2-D modulated deformable convolution on 4-D input (Zhu et al., Deformable ConvNets v2): as DeformableConvolution, with each tap's sample (zero outside the data) also multiplied by its mask value (mask: (N, num_deformable_group * kh * kw, H_out, W_out))."),
    );
    ops.push(OpDef::backward(
        "_backward__contrib_ModulatedDeformableConvolution",
        MODULATED_PARAMS,
        Box::new(deformable_backward),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::grad::check::{check_tol, run, values};

    /// A 1×1×3×3 plane 0..9 sampled at fractional points: bilinear inside, DCNv1 holds the
    /// last row, DCNv2 fades to zero outside.
    #[test]
    fn sampling_rules() {
        let plane: Vec<f64> = (0..9).map(f64::from).collect();
        let at = |m: bool, y: f64, x: f64| tap::<f64>(m, 3, 3, y, x).map(|t| t.value(&plane));
        assert_eq!(at(false, 0.5, 0.5), Some(2.0));
        assert_eq!(at(true, 0.5, 0.5), Some(2.0));
        // Row 2.5: DCNv1 reads row 2, DCNv2 half of row 2.
        assert_eq!(at(false, 2.5, 0.0), Some(6.0));
        assert_eq!(at(true, 2.5, 0.0), Some(3.0));
        // Half a row above the top: DCNv1 reads nothing, DCNv2 half of (0, 0.5), which is 0.5.
        assert_eq!(at(false, -0.5, 0.5), None);
        assert_eq!(at(true, -0.5, 0.5), Some(0.25));
        assert_eq!(at(true, -1.0, 0.5), None);
        assert_eq!(at(false, f64::NAN, 0.0), None);
        // Slopes: along x of row 1 is 1, along y is 3; held rows have no y slope.
        let t = tap::<f64>(false, 3, 3, 1.25, 0.5).unwrap();
        assert_eq!(t.slopes(&plane), (3.0, 1.0));
        let t = tap::<f64>(false, 3, 3, 2.25, 0.5).unwrap();
        assert_eq!(t.slopes(&plane), (0.0, 1.0));
    }

    /// With zero offsets (and a mask of ones), both are `Convolution`.
    #[test]
    fn zero_offsets_are_convolution() {
        let (n, c, h, w, f) = (2usize, 4usize, 5usize, 6usize, 6usize);
        let params = [("kernel", "(3, 3)"), ("num_filter", "6"), ("pad", "(1, 1)"), ("num_group", "2")];
        let x = values(n * c * h * w, -1.0, 1.0, 1);
        let wt = values(f * 2 * 9, -1.0, 1.0, 2);
        let b = values(f, -1.0, 1.0, 3);
        let conv = run(
            "Convolution",
            &params,
            &[(&[n, c, h, w][..], x.clone()), (&[f, 2, 3, 3], wt.clone()), (&[f], b.clone())],
        );
        let off = vec![0.0; n * 18 * h * w];
        let dcn = run(
            "_contrib_DeformableConvolution",
            &params,
            &[
                (&[n, c, h, w][..], x.clone()),
                (&[n, 18, h, w], off.clone()),
                (&[f, 2, 3, 3], wt.clone()),
                (&[f], b.clone()),
            ],
        );
        let mask = vec![1.0; n * 9 * h * w];
        let dcn2 = run(
            "_contrib_ModulatedDeformableConvolution",
            &params,
            &[(&[n, c, h, w][..], x), (&[n, 18, h, w], off), (&[n, 9, h, w], mask), (&[f, 2, 3, 3], wt), (&[f], b)],
        );
        let (conv, dcn, dcn2) = (&conv[0], &dcn[0], &dcn2[0]);
        for (i, v) in conv.iter().enumerate() {
            assert!((v - dcn[i]).abs() < 1e-12 && (v - dcn2[i]).abs() < 1e-12, "element {i}");
        }
    }

    /// Gradients against finite differences, away from the kinks of bilinear sampling
    /// (offsets whose positions stay off the integer grid).
    #[test]
    fn gradients() {
        let (n, c, h, w) = (2usize, 4usize, 5usize, 5usize);
        let x = values(n * c * h * w, -1.0, 1.0, 5);
        for (modulated, dg, params) in [
            (
                false,
                2,
                &[("kernel", "(3, 3)"), ("num_filter", "4"), ("pad", "(1, 1)"), ("num_deformable_group", "2")][..],
            ),
            (
                false,
                1,
                &[
                    ("kernel", "(2, 3)"),
                    ("num_filter", "2"),
                    ("stride", "(2, 1)"),
                    ("num_group", "2"),
                    ("dilate", "(2, 1)"),
                    ("pad", "(1, 0)"),
                ],
            ),
            (true, 2, &[("kernel", "(3, 3)"), ("num_filter", "4"), ("pad", "(1, 1)"), ("num_deformable_group", "2")]),
            (true, 1, &[("kernel", "(2, 2)"), ("num_filter", "2"), ("num_group", "2"), ("no_bias", "True")]),
        ] {
            let attrs = lookup_attrs(modulated, params);
            let d = Deform::of(&attrs, &[n, c, h, w]).unwrap();
            // Offsets of ±(0.1..0.4) + a whole step: never near an integer position.
            let off: Vec<f64> = values(n * 2 * dg * d.taps() * d.osz(), -1.0, 1.0, 6)
                .into_iter()
                .map(|v| v.signum() * (0.1 + 0.3 * v.abs()) + if v > 0.5 { 1.0 } else { 0.0 })
                .collect();
            let mut inputs: Vec<(Vec<usize>, Vec<f64>)> = vec![(vec![n, c, h, w], x.clone()), (d.offset_shape(), off)];
            if modulated {
                inputs.push((d.mask_shape(), values(n * dg * d.taps() * d.osz(), 0.2, 1.0, 7)));
            }
            let ws = d.weight_shape();
            inputs.push((ws.clone(), values(ws.iter().product(), -1.0, 1.0, 8)));
            if !params.contains(&("no_bias", "True")) {
                inputs.push((vec![d.f], values(d.f, -1.0, 1.0, 9)));
            }
            let op =
                if modulated { "_contrib_ModulatedDeformableConvolution" } else { "_contrib_DeformableConvolution" };
            let refs: Vec<(&[usize], Vec<f64>)> = inputs.iter().map(|(s, v)| (&s[..], v.clone())).collect();
            check_tol(op, params, &refs, &[], 1e-4, 1e-6);
        }
    }

    fn lookup_attrs(modulated: bool, params: &[(&str, &str)]) -> Attrs {
        let name = if modulated { "_contrib_ModulatedDeformableConvolution" } else { "_contrib_DeformableConvolution" };
        crate::op::lookup(name).unwrap().parse_attrs(params.iter().copied(), if modulated { 5 } else { 4 }).unwrap()
    }
}
