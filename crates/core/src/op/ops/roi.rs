//! Region-of-interest pooling of detection heads: `_contrib_ROIAlign` (bilinear samples
//! averaged per bin, optionally position-sensitive) and `ROIPooling` (the maximum per bin, with
//! a hidden int32 argmax output), with their backward operators; and R-FCN's
//! `_contrib_PSROIPooling` (each bin averages its own group of channels; float32 or float64,
//! computed in the data's type as stock's; a roi whose batch index is outside the batch is an
//! error, where stock reads past the data).
//!
//! Both take NCHW data and rois `[R, 5]`, rows `(batch_index, x1, y1, x2, y2)` in image
//! coordinates that `spatial_scale` maps onto the data, and give `[R, C', ph, pw]`. The
//! arithmetic runs in the data's own dtype in stock 1.9.1's order of operations (float16
//! rounds after every operation, as mshadow's `half_t` does), so outputs and gradients are
//! stock's. A batch index is truncated toward zero as C's `int` conversion does; a roi whose
//! index is not in `[0, N)` gets zeros and gives no gradient (stock's ROIPooling; stock's
//! ROIAlign writes one zero and leaves the rest unwritten for a negative index, and reads past
//! the data for an index of N or more). The rois get zero gradients.
//!
//! Forwards run over (roi, channel) output planes on the kernel pool; backwards over the data
//! gradient's (image, channel) planes, each plane summing what it receives in stock's order.

use std::ops::{Add, Div, Mul, Range, Sub};

use super::nn::{dispatch_real, write_f64};
use super::reduce::elems_as;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{two_mut, Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    pub(super) struct AlignParams<'a> => ALIGN_PARAMS {
        pooled_size: &'a [i64] = required, "ROI Align output roi feature map height and width: (h, w)";
        spatial_scale: f64 = required, "Ratio of input feature map height (or w) to raw image height (or w). Equals the reciprocal of total stride in convolutional layers";
        sample_ratio: i64 = "-1", "Optional sampling ratio of ROI align, using adaptive size by default.";
        position_sensitive: bool = "False", "Whether to perform position-sensitive RoI pooling. PSRoIPooling is first proposaled by R-FCN and it can reduce the input channels by ph*pw times, where (ph, pw) is the pooled_size";
        aligned: bool = "False", "Center-aligned ROIAlign introduced in Detectron2. To enable, set aligned to True.";
    }
}

op_params! {
    pub(super) struct PoolParams<'a> => POOL_PARAMS {
        pooled_size: &'a [i64] = required, "ROI pooling output shape (h,w) ";
        spatial_scale: f64 = required, "Ratio of input feature map height (or w) to raw image height (or w). Equals the reciprocal of total stride in convolutional layers";
    }
}

/// Samples one ROIAlign roi may take along an axis (bins × samples per bin). A roi needing
/// more spans millions of feature-map pixels: its coordinates or `spatial_scale` are wrong,
/// and stock would run out of memory or time on it.
pub(super) const MAX_AXIS_SAMPLES: usize = 1 << 22;

/// The element types the kernels compute in, with stock's arithmetic: `f32`, `f64`, and
/// `f16` (whose operators round to float16 after each operation, as `half_t`'s do).
trait Num: Elem + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> {
    /// `self * s` as stock multiplies an element by a float parameter (float16: in float32,
    /// rounded once).
    fn times(self, s: f32) -> Self;
}

impl Num for f32 {
    fn times(self, s: f32) -> Self {
        self * s
    }
}

impl Num for f64 {
    fn times(self, s: f32) -> Self {
        self * f64::from(s)
    }
}

impl Num for half::f16 {
    fn times(self, s: f32) -> Self {
        half::f16::from_f32(self.to_f32() * s)
    }
}

/// C's float-to-`int` conversion as x86 performs it: truncation toward zero, and `INT_MIN`
/// for NaN and values outside `int`'s range.
fn c_int(v: f64) -> i64 {
    if v > -2_147_483_649.0 && v < 2_147_483_648.0 {
        v as i64
    } else {
        i64::from(i32::MIN)
    }
}

/// The image a roi row names: its first value truncated; `None` unless in `[0, n)`.
pub(super) fn batch_of<T: Elem>(v: T, n: usize) -> Option<usize> {
    usize::try_from(c_int(v.to_f64())).ok().filter(|&b| b < n)
}

/// The sizes both operators check: data `[n, c, h, w]`, `r` rois, bins `ph × pw`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Dims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    r: usize,
    ph: usize,
    pw: usize,
}

impl Dims {
    fn bins(&self) -> usize {
        self.ph * self.pw
    }
}

fn dims(op: &str, pooled: &[i64], scale: f64, data: &[usize], rois: &[usize]) -> Result<Dims> {
    let [n, c, h, w] = <[usize; 4]>::try_from(data).map_err(|_| {
        Error::value(format!("operator {op}: data must be 4-D (batch, channel, height, width), got shape {data:?}"))
    })?;
    let r = match rois {
        [r, 5] => *r,
        _ => {
            return Err(Error::value(format!(
                "operator {op}: rois must have shape (num_rois, 5), rows (batch_index, x1, y1, x2, y2), got {rois:?}"
            )))
        }
    };
    let (ph, pw) = match pooled {
        [ph, pw] if *ph > 0 && *pw > 0 => (*ph as usize, *pw as usize),
        _ => {
            return Err(Error::value(format!(
                "operator {op}: pooled_size must be two positive integers (height, width), got {pooled:?}"
            )))
        }
    };
    // Stock keeps the scale as a float and checks it against [0, 1] there (NaN passes).
    let s = scale as f32;
    if !(s.is_nan() || (0.0..=1.0).contains(&s)) {
        return Err(Error::value(format!("operator {op}: spatial_scale must be in [0, 1], got {scale}")));
    }
    let out = [r, c, ph, pw].iter().try_fold(1usize, |acc, &v| acc.checked_mul(v));
    if out.is_none_or(|s| s > isize::MAX as usize / 16) {
        return Err(Error::value(format!("operator {op}: pooled_size {pooled:?} makes the output too large")));
    }
    Ok(Dims { n, c, h, w, r, ph, pw })
}

/// Data and rois must be one float dtype (stock checks they are the same).
fn check_dtypes(op: &str, data: DType, rois: DType) -> Result<()> {
    if !matches!(data, DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::type_error(format!(
            "operator {op} supports float32, float64 and float16 data, not {}",
            data.name()
        )));
    }
    if rois != data {
        return Err(Error::type_error(format!(
            "operator {op}: rois must have the data's dtype {}, got {}",
            data.name(),
            rois.name()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// ROIAlign

/// One sample coordinate along an axis: its two bilinear neighbours and their weights
/// (`rest` = 1 − `frac` for `lo`, `frac` for `hi`). A sample more than a pixel off the map is
/// not `inside` and contributes nothing.
#[derive(Debug, Clone, Copy)]
struct Tap<T> {
    lo: usize,
    hi: usize,
    frac: T,
    rest: T,
    inside: bool,
}

/// Stock's clamping of a sample at `pos` on an axis of `n` pixels.
fn tap<T: Num>(pos: T, n: usize) -> Tap<T> {
    let p = pos.to_f64();
    if n == 0 || p < -1.0 || p > n as f64 {
        return Tap { lo: 0, hi: 0, frac: T::zero(), rest: T::zero(), inside: false };
    }
    let pos = if p <= 0.0 { T::zero() } else { pos };
    // `pos` is in [0, n] here (or NaN, which converts to 0).
    let lo = pos.to_f64() as usize;
    let (lo, hi, pos) = if lo >= n - 1 { (n - 1, n - 1, T::from_f64((n - 1) as f64)) } else { (lo, lo + 1, pos) };
    let frac = pos - T::from_f64(lo as f64);
    Tap { lo, hi, frac, rest: T::one() - frac, inside: true }
}

/// The samples of `pooled` bins of size `bin` from `start`, `grid` per bin (bin-major), as
/// stock places them: `start + b·bin + (i + ½)·bin / grid`.
fn axis_taps<T: Num>(start: T, bin: T, pooled: usize, grid: usize, n: usize) -> Vec<Tap<T>> {
    let g = T::from_f64(grid as f64);
    let mut taps = Vec::with_capacity(pooled * grid);
    for b in 0..pooled {
        let base = start + T::from_f64(b as f64) * bin;
        for i in 0..grid {
            taps.push(tap(base + T::from_f64(i as f64 + 0.5) * bin / g, n));
        }
    }
    taps
}

/// The four weights and plane positions of the sample at row tap `y`, column tap `x` on a
/// plane `w` wide (zero weights at position 0 for a sample off the map, as stock keeps them).
#[inline]
fn weights<T: Num>(w: usize, y: &Tap<T>, x: &Tap<T>) -> ([T; 4], [usize; 4]) {
    if y.inside && x.inside {
        (
            [y.rest * x.rest, y.rest * x.frac, y.frac * x.rest, y.frac * x.frac],
            [y.lo * w + x.lo, y.lo * w + x.hi, y.hi * w + x.lo, y.hi * w + x.hi],
        )
    } else {
        ([T::zero(); 4], [0; 4])
    }
}

/// One roi's sampling plan (stock's pre-calculation, kept per axis: a sample's weights are
/// the products of its row's and its column's).
struct AlignRoi<T> {
    batch: usize,
    /// `ph × gh` row samples, then `pw × gw` column samples, bin-major.
    ys: Vec<Tap<T>>,
    xs: Vec<Tap<T>>,
    gh: usize,
    gw: usize,
    /// `gh · gw`, the divisor of each bin's sum.
    count: T,
}

impl<T> AlignRoi<T> {
    fn rows(&self, bin: usize) -> &[Tap<T>] {
        &self.ys[bin * self.gh..][..self.gh]
    }
    fn cols(&self, bin: usize) -> &[Tap<T>] {
        &self.xs[bin * self.gw..][..self.gw]
    }
}

struct AlignPlan<T> {
    d: Dims,
    ps: bool,
    /// Output channels: `c`, or `c / (ph·pw)` when position-sensitive.
    c_out: usize,
    /// `None` for a roi whose batch index is not in `[0, n)`.
    rois: Vec<Option<AlignRoi<T>>>,
}

impl<T> AlignPlan<T> {
    /// The data channel bin `k` of output channel `c` reads.
    fn channel(&self, c: usize, k: usize) -> usize {
        if self.ps {
            c * self.d.bins() + k
        } else {
            c
        }
    }
    /// Samples per output plane, on average (for the kernel pool's cost).
    fn samples_per_plane(&self) -> f64 {
        let total: f64 = self.rois.iter().flatten().map(|r| (r.gh * r.gw) as f64).sum();
        total * self.d.bins() as f64 / self.d.r.max(1) as f64
    }
}

fn align_dims(a: &Attrs, data: &[usize], rois: &[usize]) -> Result<(Dims, usize)> {
    let p = AlignParams::of(a);
    let d = dims(a.op, p.pooled_size, p.spatial_scale, data, rois)?;
    let c_out = if p.position_sensitive {
        if d.c % d.bins() != 0 {
            return Err(Error::value(format!(
                "operator {}: with position_sensitive the {} input channels must divide by pooled_size[0]*pooled_size[1] = {}",
                a.op,
                d.c,
                d.bins()
            )));
        }
        d.c / d.bins()
    } else {
        d.c
    };
    Ok((d, c_out))
}

fn align_plan<T: Num>(a: &Attrs, d: Dims, c_out: usize, rois: &[T]) -> Result<AlignPlan<T>> {
    let p = AlignParams::of(a);
    let scale = T::from_f32(p.spatial_scale as f32);
    let offset = if p.aligned { T::from_f64(0.5) } else { T::zero() };
    let grid = |bin: T| -> usize {
        if p.sample_ratio > 0 {
            usize::try_from(p.sample_ratio).unwrap_or(usize::MAX)
        } else {
            usize::try_from(c_int(bin.to_f64().ceil())).unwrap_or(0)
        }
    };
    let mut plan = Vec::with_capacity(d.r);
    for (k, row) in rois.chunks_exact(5).enumerate() {
        let Some(batch) = batch_of(row[0], d.n) else {
            plan.push(None);
            continue;
        };
        let at = |v: T| v * scale - offset;
        let (x1, y1) = (at(row[1]), at(row[2]));
        let (mut rw, mut rh) = (at(row[3]) - x1, at(row[4]) - y1);
        if p.aligned {
            if !(rw.to_f64() > 0.0 && rh.to_f64() > 0.0) {
                return Err(Error::value(format!(
                    "operator {}: roi {k} is {} wide and {} high after scaling; with aligned=True both must be positive",
                    a.op,
                    rw.to_f64(),
                    rh.to_f64()
                )));
            }
        } else {
            // Malformed rois become 1×1 (stock's std::max, which keeps a NaN).
            if rw < T::one() {
                rw = T::one();
            }
            if rh < T::one() {
                rh = T::one();
            }
        }
        let (bh, bw) = (rh / T::from_f64(d.ph as f64), rw / T::from_f64(d.pw as f64));
        let (gh, gw) = (grid(bh), grid(bw));
        let too_many = |pooled: usize, g: usize| pooled.checked_mul(g).is_none_or(|s| s > MAX_AXIS_SAMPLES);
        if too_many(d.ph, gh) || too_many(d.pw, gw) {
            return Err(Error::value(format!(
                "operator {}: roi {k} needs {gh}×{gw} samples per bin, more than a feature map holds; check the rois, \
                 spatial_scale and sample_ratio",
                a.op
            )));
        }
        plan.push(Some(AlignRoi {
            batch,
            ys: axis_taps(y1, bh, d.ph, gh, d.h),
            xs: axis_taps(x1, bw, d.pw, gw, d.w),
            gh,
            gw,
            count: T::from_f64((gh * gw) as f64),
        }));
    }
    Ok(AlignPlan { d, ps: p.position_sensitive, c_out, rois: plan })
}

/// `out` `[R, c_out, ph, pw]`: each bin the mean of its samples of data `x`.
fn align_forward_planes<T: Num>(plan: &AlignPlan<T>, x: &[T], out: &mut [T]) {
    let d = plan.d;
    let (bins, hw) = (d.bins(), d.h * d.w);
    let cost = Cost(4.0 * plan.samples_per_plane() + bins as f64);
    par_for_mut(out, bins, cost, T::DTYPE, |planes, o| {
        for (q, op) in planes.zip(o.chunks_mut(bins)) {
            let (r, c) = (q / plan.c_out, q % plan.c_out);
            let Some(roi) = plan.rois[r].as_ref().filter(|_| hw > 0) else {
                op.fill(T::zero());
                continue;
            };
            for (k, v) in op.iter_mut().enumerate() {
                let plane = &x[(roi.batch * d.c + plan.channel(c, k)) * hw..][..hw];
                let mut acc = T::zero();
                for y in roi.rows(k / d.pw) {
                    for t in roi.cols(k % d.pw) {
                        let (wt, at) = weights(d.w, y, t);
                        acc = acc
                            + (wt[0] * plane[at[0]]
                                + wt[1] * plane[at[1]]
                                + wt[2] * plane[at[2]]
                                + wt[3] * plane[at[3]]);
                    }
                }
                *v = acc / roi.count;
            }
        }
    });
}

/// `dx` `[N, C, H, W]` from the output gradient `g`: each sample's bin gradient spread over
/// its four neighbours, a plane at a time, in stock's order (roi, bin, sample, neighbour).
fn align_backward_planes<T: Num>(plan: &AlignPlan<T>, g: &[T], dx: &mut [T]) {
    let d = plan.d;
    let (bins, hw) = (d.bins(), d.h * d.w);
    if hw == 0 {
        return;
    }
    let per_plane = plan.samples_per_plane() * d.r as f64 / d.n.max(1) as f64;
    let cost = Cost(8.0 * per_plane / if plan.ps { bins as f64 } else { 1.0 } + d.r as f64);
    par_for_mut(dx, hw, cost, T::DTYPE, |planes, dxs| {
        for (q, dp) in planes.zip(dxs.chunks_mut(hw)) {
            dp.fill(T::zero());
            let (b, cu) = (q / d.c, q % d.c);
            // The output channel and bins that read this data channel.
            let (c, ks): (usize, Range<usize>) =
                if plan.ps { (cu / bins, cu % bins..cu % bins + 1) } else { (cu, 0..bins) };
            for (r, roi) in plan.rois.iter().enumerate() {
                let Some(roi) = roi.as_ref().filter(|roi| roi.batch == b) else { continue };
                for k in ks.clone() {
                    let top = g[(r * plan.c_out + c) * bins + k];
                    for y in roi.rows(k / d.pw) {
                        for t in roi.cols(k % d.pw) {
                            if !(y.inside && t.inside) {
                                continue;
                            }
                            let (wt, at) = weights(d.w, y, t);
                            for (w, i) in wt.into_iter().zip(at) {
                                dp[i] = dp[i] + top * w / roi.count;
                            }
                        }
                    }
                }
            }
        }
    });
}

fn align_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (d, c_out) = align_dims(a, &ins[0].shape, &ins[1].shape)?;
    check_dtypes(a.op, ins[0].dtype, ins[1].dtype)?;
    Ok(vec![Meta::new(vec![d.r, c_out, d.ph, d.pw], ins[0].dtype)])
}

fn align_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (d, c_out) = align_dims(a, &ins[0].shape, &ins[1].shape)?;
    check_dtypes(a.op, ins[0].dtype, ins[1].dtype)?;
    if outs[0].shape[..] != [d.r, c_out, d.ph, d.pw] {
        return Err(Error::internal(format!(
            "operator {}: output shape {:?} is not the inferred one",
            a.op, outs[0].shape
        )));
    }
    dispatch_real!(ins[0].dtype, a.op, T, _R => {
        let plan = align_plan::<T>(a, d, c_out, ins[1].as_slice::<T>())?;
        align_forward_planes(&plan, ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
    });
    Ok(())
}

/// `(dY, data, rois) -> (dData, 0)`.
fn align_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    if outs.len() > 1 && cx.req[1] != Req::Null {
        super::init::fill(&mut outs[1], 0.0);
    }
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (d, c_out) = align_dims(a, &ins[1].shape, &ins[2].shape)?;
    check_dtypes(a.op, ins[1].dtype, ins[2].dtype)?;
    if ins[0].shape[..] != [d.r, c_out, d.ph, d.pw] || ins[0].dtype != ins[1].dtype {
        return Err(Error::internal(format!("operator {}: output gradient {:?} does not fit", a.op, ins[0].shape)));
    }
    dispatch_real!(ins[1].dtype, a.op, T, _R => {
        let plan = align_plan::<T>(a, d, c_out, ins[2].as_slice::<T>())?;
        align_backward_planes(&plan, ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// ROIPooling

/// One roi's bins: its image (`None`: ignored) and each bin row's and column's pixel range
/// `[start, end)`, clipped to the map.
struct PoolRoi {
    batch: Option<usize>,
    hs: Vec<(usize, usize)>,
    ws: Vec<(usize, usize)>,
}

/// Stock's bins along an axis: a roi `len` pixels from `start` in `pooled` bins of
/// `len / pooled` (in the data's dtype), bin `i` covering `[floor(i·bin), ceil((i+1)·bin))`.
fn pool_axis<T: Num>(start: i64, len: i64, pooled: usize, n: usize) -> Vec<(usize, usize)> {
    let bin = T::from_f64(len as f64) / T::from_f64(pooled as f64);
    // Both terms are within C int's range, so the sum cannot overflow.
    let clip = |v: i64| (v + start).clamp(0, n as i64) as usize;
    (0..pooled)
        .map(|i| {
            let lo = c_int((T::from_f64(i as f64) * bin).to_f64().floor());
            let hi = c_int((T::from_f64((i + 1) as f64) * bin).to_f64().ceil());
            (clip(lo), clip(hi))
        })
        .collect()
}

fn pool_rois<T: Num>(scale: f32, d: Dims, rois: &[T]) -> Vec<PoolRoi> {
    rois.chunks_exact(5)
        .map(|row| {
            // Coordinates scale in the data's dtype and round half away from zero to int.
            let at = |v: T| c_int(v.times(scale).to_f64().round());
            let (x1, y1, x2, y2) = (at(row[1]), at(row[2]), at(row[3]), at(row[4]));
            // Malformed rois become 1×1.
            let (rh, rw) = ((y2 - y1 + 1).max(1), (x2 - x1 + 1).max(1));
            PoolRoi {
                batch: batch_of(row[0], d.n),
                hs: pool_axis::<T>(y1, rh, d.ph, d.h),
                ws: pool_axis::<T>(x1, rw, d.pw, d.w),
            }
        })
        .collect()
}

/// `out` and `idx` `[R, C, ph, pw]`: each bin's maximum and its flat index into the data
/// (the first on ties); 0 and -1 for an empty bin or an ignored roi.
fn pool_forward_planes<T: Num>(d: Dims, rois: &[PoolRoi], x: &[T], out: &mut [T], idx: &mut [i32]) {
    let (bins, hw) = (d.bins(), d.h * d.w);
    let mut planes: Vec<(&mut [T], &mut [i32])> = out.chunks_mut(bins).zip(idx.chunks_mut(bins)).collect();
    let span = |axis: &[(usize, usize)]| axis.iter().map(|(s, e)| e.saturating_sub(*s) as f64).sum::<f64>();
    let pixels = rois.iter().map(|r| span(&r.hs) * span(&r.ws)).sum::<f64>() / d.r.max(1) as f64;
    let cost = Cost(pixels + bins as f64);
    par_for_mut(&mut planes, 1, cost, T::DTYPE, |ps, chunk| {
        for (q, (o, m)) in ps.zip(chunk.iter_mut()) {
            let (roi, c) = (&rois[q / d.c], q % d.c);
            for (k, (v, at)) in o.iter_mut().zip(m.iter_mut()).enumerate() {
                let ((h0, h1), (w0, w1)) = (roi.hs[k / d.pw], roi.ws[k % d.pw]);
                let Some(b) = roi.batch.filter(|_| h1 > h0 && w1 > w0) else {
                    (*v, *at) = (T::zero(), -1);
                    continue;
                };
                let base = (b * d.c + c) * hw;
                let plane = &x[base..base + hw];
                let (mut best, mut arg) = (T::from_f32(-f32::MAX), -1);
                for y in h0..h1 {
                    for (xi, &val) in plane[y * d.w..][w0..w1].iter().enumerate() {
                        if val > best {
                            best = val;
                            arg = i32::try_from(base + y * d.w + w0 + xi).unwrap_or(-1);
                        }
                    }
                }
                (*v, *at) = (best, arg);
            }
        }
    });
}

/// `dx` `[N, C, H, W]`: each output gradient added at its bin's argmax, a plane at a time, in
/// stock's order (output index).
fn pool_backward_planes<T: Num>(d: Dims, g: &[T], idx: &[i32], dx: &mut [T]) {
    let (bins, hw) = (d.bins(), d.h * d.w);
    if hw == 0 {
        return;
    }
    par_for_mut(dx, hw, Cost((d.r * bins) as f64 + hw as f64 * 0.25), T::DTYPE, |planes, dxs| {
        for (q, dp) in planes.zip(dxs.chunks_mut(hw)) {
            dp.fill(T::zero());
            let (c, base) = (q % d.c, q * hw);
            for r in 0..d.r {
                let at = (r * d.c + c) * bins;
                for (gv, &i) in g[at..at + bins].iter().zip(&idx[at..at + bins]) {
                    let off = usize::try_from(i).ok().and_then(|i| i.checked_sub(base)).filter(|&o| o < hw);
                    if let Some(o) = off {
                        dp[o] = dp[o] + *gv;
                    }
                }
            }
        }
    });
}

fn pool_dims(a: &Attrs, data: &[usize], rois: &[usize]) -> Result<Dims> {
    let p = PoolParams::of(a);
    let d = dims(a.op, p.pooled_size, p.spatial_scale, data, rois)?;
    let size = [d.n, d.c, d.h, d.w].iter().try_fold(1usize, |acc, &v| acc.checked_mul(v));
    if size.is_none_or(|s| s > i32::MAX as usize) {
        return Err(Error::value(format!(
            "operator {}: data {data:?} has more elements than the int32 argmax can index",
            a.op
        )));
    }
    Ok(d)
}

fn pool_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let d = pool_dims(a, &ins[0].shape, &ins[1].shape)?;
    check_dtypes(a.op, ins[0].dtype, ins[1].dtype)?;
    let shape = vec![d.r, d.c, d.ph, d.pw];
    Ok(vec![Meta::new(shape.clone(), ins[0].dtype), Meta::new(shape, DType::I32)])
}

fn pool_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let d = pool_dims(a, &ins[0].shape, &ins[1].shape)?;
    check_dtypes(a.op, ins[0].dtype, ins[1].dtype)?;
    let want = [d.r, d.c, d.ph, d.pw];
    if outs.len() != 2 || outs[0].shape[..] != want || outs[1].shape[..] != want || outs[1].dtype != DType::I32 {
        return Err(Error::internal(format!("operator {}: outputs do not have the inferred shapes and dtypes", a.op)));
    }
    let scale = PoolParams::of(a).spatial_scale as f32;
    let (out, idx) = two_mut(outs, 0, 1);
    dispatch_real!(ins[0].dtype, a.op, T, _R => {
        let rois = pool_rois::<T>(scale, d, ins[1].as_slice::<T>());
        pool_forward_planes(d, &rois, ins[0].as_slice::<T>(), out.as_mut::<T>(), idx.as_mut::<i32>());
    });
    Ok(())
}

/// `(dY, output, maxidx) -> (dData, 0)`.
fn pool_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    if outs.len() > 1 && cx.req[1] != Req::Null {
        super::init::fill(&mut outs[1], 0.0);
    }
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (data, rois) = (outs[0].shape.clone(), outs.get(1).map(|o| o.shape.clone()).unwrap_or_default());
    let d = pool_dims(a, &data, &rois)?;
    let want = [d.r, d.c, d.ph, d.pw];
    if ins.len() != 3 || ins[0].shape[..] != want || ins[2].shape[..] != want || ins[2].dtype != DType::I32 {
        return Err(Error::internal(format!("operator {}: the backward inputs do not fit the data", a.op)));
    }
    if ins[0].dtype != outs[0].dtype {
        return Err(Error::type_error(format!(
            "operator {}: the output gradient has another dtype than the data",
            a.op
        )));
    }
    dispatch_real!(outs[0].dtype, a.op, T, _R => {
        pool_backward_planes(d, ins[0].as_slice::<T>(), ins[2].as_slice::<i32>(), outs[0].as_mut::<T>());
    });
    Ok(())
}

fn two(_: &Attrs) -> usize {
    2
}

fn one(_: &Attrs) -> usize {
    1
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    register_psroi(ops);
    ops.push(
        OpDef::new(
            "_contrib_ROIAlign",
            Inputs::Fixed(&["data", "rois"]),
            Box::new(align_infer),
            Box::new(align_forward),
        )
        .params(ALIGN_PARAMS)
        .grad(Grad::Backward { op: "_backward_ROIAlign", inputs: true, outputs: false })
        .doc(
            "Aligns the feature map `data` (N, C, H, W) over the regions `rois` (R, 5), rows \
                 (batch_index, x1, y1, x2, y2), without quantizing coordinates: each of the pooled_size bins \
                 is the average of bilinearly interpolated samples (sample_ratio per bin side, or adaptive). \
                 Output (R, C, ph, pw), or (R, C/(ph*pw), ph, pw) when position_sensitive. A roi whose batch \
                 index is outside [0, N) gives zeros. Used in Mask R-CNN (He et al., ICCV 2017).",
        ),
    );
    ops.push(OpDef::backward("_backward_ROIAlign", ALIGN_PARAMS, Box::new(align_backward)));
    ops.push(
        OpDef::new("ROIPooling", Inputs::Fixed(&["data", "rois"]), Box::new(pool_infer), Box::new(pool_forward))
            .params(POOL_PARAMS)
            .outputs(two, one)
            .output_names(&["output", "maxidx"])
            .alias(&["_npx_roi_pooling"])
            .grad(Grad::Backward { op: "_backward_ROIPooling", inputs: false, outputs: true })
            .doc(
                "Performs region of interest (ROI) pooling on the input array: max pooling of `data` \
                 (N, C, H, W) over each region of `rois` (R, 5), rows (batch_index, x1, y1, x2, y2) scaled by \
                 spatial_scale and rounded, into pooled_size bins. Output (R, C, ph, pw); empty bins and rois \
                 whose batch index is outside [0, N) give 0. Used in Fast R-CNN.",
            ),
    );
    ops.push(OpDef::backward("_backward_ROIPooling", POOL_PARAMS, Box::new(pool_backward)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::grad::check::{check, values};
    use crate::op::lookup;

    fn attrs(op: &str, kv: &[(&str, &str)]) -> Attrs {
        lookup(op).unwrap().parse_attrs(kv.iter().copied(), 2).unwrap()
    }

    fn align(kv: &[(&str, &str)], data: &[usize], x: &[f64], rois: &[f64]) -> Vec<f64> {
        let a = attrs("_contrib_ROIAlign", kv);
        let (d, c_out) = align_dims(&a, data, &[rois.len() / 5, 5]).unwrap();
        let plan = align_plan::<f64>(&a, d, c_out, rois).unwrap();
        let mut out = vec![f64::NAN; d.r * c_out * d.bins()];
        align_forward_planes(&plan, x, &mut out);
        out
    }

    fn pool(kv: &[(&str, &str)], data: &[usize], x: &[f64], rois: &[f64]) -> (Dims, Vec<f64>, Vec<i32>) {
        let a = attrs("ROIPooling", kv);
        let d = pool_dims(&a, data, &[rois.len() / 5, 5]).unwrap();
        let plan = pool_rois::<f64>(PoolParams::of(&a).spatial_scale as f32, d, rois);
        let (mut out, mut idx) = (vec![f64::NAN; d.r * d.c * d.bins()], vec![7; d.r * d.c * d.bins()]);
        pool_forward_planes(d, &plan, x, &mut out, &mut idx);
        (d, out, idx)
    }

    /// 0, 1, 2, ... over a [1, 1, h, w] map: bilinear samples equal `w·y + x`.
    fn ramp(h: usize, w: usize) -> Vec<f64> {
        (0..h * w).map(|v| v as f64).collect()
    }

    #[test]
    fn roi_align_averages_bilinear_samples() {
        let x = ramp(4, 5);
        // Roi (0.5, 0.5)-(2.5, 2.5), 1×1 bin, 2×2 samples at 1.0 and 2.0 on each axis: mean of
        // 5y + x over them = 5·1.5 + 1.5.
        let kv = [("pooled_size", "(1, 1)"), ("spatial_scale", "1.0"), ("sample_ratio", "2")];
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[0.0, 0.5, 0.5, 2.5, 2.5]), [9.0]);
        // aligned shifts by half a pixel: samples at 0.5 and 1.5, mean 5 + 1.
        let kv = [("pooled_size", "(1, 1)"), ("spatial_scale", "1.0"), ("sample_ratio", "2"), ("aligned", "True")];
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[0.0, 0.5, 0.5, 2.5, 2.5]), [6.0]);
        // 2×2 bins of a 4×4 roi, adaptive grid (2 per bin side): samples 0.5, 1.5 | 2.5, 3.5,
        // the last row's 3.5 clamped to 3 (the map is 4 high, 5 wide).
        let kv = [("pooled_size", "(2, 2)"), ("spatial_scale", "0.5")];
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[0.0, 0.0, 0.0, 8.0, 8.0]), [6.0, 8.0, 14.75, 16.75]);
        // Samples past the last row clamp to it; samples more than a pixel off contribute 0.
        let kv = [("pooled_size", "(1, 1)"), ("spatial_scale", "1.0"), ("sample_ratio", "1")];
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[0.0, 0.0, 3.0, 2.0, 4.0]), [15.0 + 1.0]);
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[0.0, 0.0, 8.0, 2.0, 10.0]), [0.0]);
        // An ignored roi (batch index -1 or past N) gives zeros; -0.5 truncates to image 0.
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[-1.0, 0.5, 0.5, 2.5, 2.5]), [0.0]);
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[1.0, 0.5, 0.5, 2.5, 2.5]), [0.0]);
        assert_eq!(align(&kv, &[1, 1, 4, 5], &x, &[-0.5, 0.5, 0.5, 2.5, 2.5]), [5.0 * 1.5 + 1.5]);
    }

    #[test]
    fn roi_align_position_sensitive_reads_one_channel_per_bin() {
        // Four channels, each constant k: bin k of the one output channel reads channel k.
        let x: Vec<f64> = (0..4).flat_map(|k| std::iter::repeat_n(k as f64, 9)).collect();
        let kv = [("pooled_size", "(2, 2)"), ("spatial_scale", "1.0"), ("position_sensitive", "True")];
        assert_eq!(align(&kv, &[1, 4, 3, 3], &x, &[0.0, 0.0, 0.0, 2.0, 2.0]), [0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn roi_align_gradient() {
        // Rois across both images, partly off the map, and (unaligned only) malformed.
        let rois =
            [0.0, 0.7, 1.2, 4.1, 3.3, 1.0, -1.5, -0.5, 7.0, 2.6, 1.0, 2.2, 0.4, 2.9, 3.8, 0.0, 3.0, 2.0, 5.5, 2.5];
        let malformed = [rois.as_slice(), &[0.0, 3.0, 2.0, 1.0, 1.0]].concat();
        let x4 = values(2 * 4 * 5 * 6, -1.0, 1.0, 3);
        for (kv, rois) in [
            (&[("pooled_size", "(2, 3)"), ("spatial_scale", "1.0")][..], &malformed),
            (&[("pooled_size", "(3, 2)"), ("spatial_scale", "0.5"), ("sample_ratio", "2")], &malformed),
            (&[("pooled_size", "(2, 2)"), ("spatial_scale", "1.0"), ("aligned", "True")], &rois.to_vec()),
        ] {
            check("_contrib_ROIAlign", kv, &[(&[2, 4, 5, 6], x4.clone()), (&[rois.len() / 5, 5], rois.clone())], &[1]);
        }
        let ps = [
            ("pooled_size", "(2, 2)"),
            ("spatial_scale", "1.0"),
            ("position_sensitive", "True"),
            ("sample_ratio", "2"),
        ];
        let x8 = values(2 * 8 * 5 * 6, -1.0, 1.0, 4);
        check("_contrib_ROIAlign", &ps, &[(&[2, 8, 5, 6], x8), (&[4, 5], rois.to_vec())], &[1]);
    }

    #[test]
    fn roi_align_rejects_bad_shapes_and_rois() {
        let op = lookup("_contrib_ROIAlign").unwrap();
        let m = |s: &[usize]| Meta::new(s.to_vec(), DType::F32);
        let kv = [("pooled_size", "(2, 2)"), ("spatial_scale", "0.5")];
        let a = attrs("_contrib_ROIAlign", &kv);
        assert!((op.infer)(&a, &[m(&[1, 2, 4, 4]), m(&[3, 5])]).is_ok());
        for (data, rois) in [(&[2, 4, 4][..], &[3, 5][..]), (&[1, 2, 4, 4], &[3, 4]), (&[1, 2, 4, 4], &[5])] {
            let e = (op.infer)(&a, &[m(data), m(rois)]).unwrap_err();
            assert!(e.message().starts_with("operator _contrib_ROIAlign: "), "{e}");
        }
        for kv in [
            &[("pooled_size", "(2,)"), ("spatial_scale", "0.5")][..],
            &[("pooled_size", "(0, 2)"), ("spatial_scale", "0.5")],
            &[("pooled_size", "(2, 2)"), ("spatial_scale", "1.5")],
            &[("pooled_size", "(3, 3)"), ("spatial_scale", "1.0"), ("position_sensitive", "True")],
        ] {
            let e = (op.infer)(&attrs("_contrib_ROIAlign", kv), &[m(&[1, 4, 4, 4]), m(&[3, 5])]).unwrap_err();
            assert!(e.message().contains("pooled_size") || e.message().contains("spatial_scale"), "{e}");
        }
        let f64_rois = Meta::new(vec![3, 5], DType::F64);
        assert!((op.infer)(&a, &[m(&[1, 2, 4, 4]), f64_rois]).is_err());
        // aligned: an empty roi is an error (stock's check), not a NaN.
        let a = attrs("_contrib_ROIAlign", &[("pooled_size", "(1, 1)"), ("spatial_scale", "1.0"), ("aligned", "True")]);
        let (d, c) = align_dims(&a, &[1, 1, 4, 4], &[1, 5]).unwrap();
        assert!(align_plan::<f64>(&a, d, c, &[0.0, 2.0, 2.0, 2.0, 3.0]).is_err());
        // A roi spanning millions of pixels is refused rather than allocated.
        let a = attrs("_contrib_ROIAlign", &[("pooled_size", "(1, 1)"), ("spatial_scale", "1.0")]);
        assert!(align_plan::<f64>(&a, d, c, &[0.0, 0.0, 0.0, 1e8, 3.0]).is_err());
        // NaN coordinates do not panic.
        let out = align(
            &[("pooled_size", "(2, 2)"), ("spatial_scale", "1.0")],
            &[1, 1, 4, 4],
            &ramp(4, 4),
            &[0.0, f64::NAN, 0.0, 2.0, 2.0],
        );
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn roi_pooling_takes_bin_maxima() {
        // Stock's documented example: 8×6 ramp, roi (0, 0)-(4, 4).
        let x = ramp(8, 6);
        let kv = [("pooled_size", "(2, 2)"), ("spatial_scale", "1.0")];
        let (_, out, idx) = pool(&kv, &[1, 1, 8, 6], &x, &[0.0, 0.0, 0.0, 4.0, 4.0]);
        assert_eq!(out, [14.0, 16.0, 26.0, 28.0]);
        assert_eq!(idx, [14, 16, 26, 28]);
        let kv = [("pooled_size", "(2, 2)"), ("spatial_scale", "0.7")];
        assert_eq!(pool(&kv, &[1, 1, 8, 6], &x, &[0.0, 0.0, 0.0, 4.0, 4.0]).1, [7.0, 9.0, 19.0, 21.0]);
        // Ignored rois and bins wholly off the map give 0 and index -1.
        let kv = [("pooled_size", "(1, 2)"), ("spatial_scale", "1.0")];
        let (_, out, idx) = pool(&kv, &[1, 1, 8, 6], &x, &[1.0, 0.0, 0.0, 2.0, 2.0, 0.0, 5.0, 0.0, 9.0, 1.0]);
        assert_eq!((out, idx), (vec![0.0, 0.0, 11.0, 0.0], vec![-1, -1, 11, -1]));
        // The second image's plane: argmax indices are flat over the whole data.
        let x2 = ramp(2 * 8, 6);
        let (_, out, idx) = pool(&kv, &[2, 1, 8, 6], &x2, &[1.0, 0.0, 0.0, 1.0, 0.0]);
        assert_eq!((out, idx), (vec![48.0, 49.0], vec![48, 49]));
    }

    #[test]
    fn roi_pooling_gradient_goes_to_the_argmax() {
        // Distinct values, so every maximum is strict and the forward is locally linear.
        let data = values(2 * 3 * 7 * 9, -1.0, 1.0, 11);
        let shape = [2, 3, 7, 9];
        let rois =
            [0.0, 1.0, 1.0, 13.0, 9.0, 1.0, -4.0, 2.0, 6.0, 20.0, -1.0, 0.0, 0.0, 4.0, 4.0, 1.0, 6.0, 6.0, 4.0, 2.0];
        let kv = [("pooled_size", "(3, 2)"), ("spatial_scale", "0.5")];
        let (d, _, idx) = pool(&kv, &shape, &data, &rois);
        let g = values(d.r * d.c * d.bins(), -1.0, 1.0, 5);
        let mut dx = vec![f64::NAN; data.len()];
        pool_backward_planes(d, &g, &idx, &mut dx);
        let loss = |x: &[f64]| pool(&kv, &shape, x, &rois).1.iter().zip(&g).map(|(a, b)| a * b).sum::<f64>();
        let mut x = data.clone();
        for j in 0..x.len() {
            let v = x[j];
            x[j] = v + 1e-6;
            let up = loss(&x);
            x[j] = v - 1e-6;
            let down = loss(&x);
            x[j] = v;
            assert!((dx[j] - (up - down) / 2e-6).abs() < 1e-6, "d/dx[{j}]: {} vs {}", dx[j], (up - down) / 2e-6);
        }
        assert!(dx.iter().any(|&v| v != 0.0));
        // Indices outside a plane (or negative) are skipped, never read out of bounds.
        let mut dx = vec![0.0; data.len()];
        let bad: Vec<i32> = idx.iter().map(|_| i32::MAX).collect();
        pool_backward_planes(d, &g, &bad, &mut dx);
        assert!(dx.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn roi_pooling_rejects_bad_shapes() {
        let op = lookup("ROIPooling").unwrap();
        let m = |s: &[usize]| Meta::new(s.to_vec(), DType::F32);
        let a = attrs("ROIPooling", &[("pooled_size", "(2, 2)"), ("spatial_scale", "1.0")]);
        let outs = (op.infer)(&a, &[m(&[1, 3, 4, 4]), m(&[2, 5])]).unwrap();
        assert_eq!((outs[1].shape.as_slice(), outs[1].dtype), (&[2, 3, 2, 2][..], DType::I32));
        for (data, rois) in [(&[3, 4, 4][..], &[2, 5][..]), (&[1, 3, 4, 4], &[2, 6])] {
            let e = (op.infer)(&a, &[m(data), m(rois)]).unwrap_err();
            assert!(e.message().starts_with("operator ROIPooling: "), "{e}");
        }
        let a = attrs("ROIPooling", &[("pooled_size", "(2, 2, 2)"), ("spatial_scale", "1.0")]);
        assert!((op.infer)(&a, &[m(&[1, 3, 4, 4]), m(&[2, 5])]).unwrap_err().message().contains("pooled_size"));
    }

    #[test]
    fn c_int_truncates_like_x86() {
        assert_eq!((c_int(-0.5), c_int(2.9), c_int(-2.9)), (0, 2, -2));
        assert_eq!((c_int(f64::NAN), c_int(3e9), c_int(-3e9)), (-2147483648, -2147483648, -2147483648));
    }
}

// ---- PSROIPooling (position-sensitive ROI pooling, R-FCN) ----

op_params! {
    /// `_contrib_PSROIPooling`'s parameters.
    struct PsRoiParams<'a> => PSROI_PARAMS {
        spatial_scale: f64 = required, "Ratio of input feature map height (or w) to raw image height (or w). Equals the reciprocal of total stride in convolutional layers";
        output_dim: i64 = required, "fix output dim";
        pooled_size: i64 = required, "fix pooled size";
        group_size: i64 = "0", "fix group size";
    }
}

/// (output_dim, pooled size, group size: `pooled_size` when 0).
fn psroi_dims(a: &Attrs) -> Result<(usize, usize, usize)> {
    let p = PsRoiParams::of(a);
    let g = if p.group_size == 0 { p.pooled_size } else { p.group_size };
    if p.output_dim < 1 || p.pooled_size < 1 || g < 1 || !(0.0..=1.0).contains(&p.spatial_scale) {
        return Err(Error::value(format!(
            "operator _contrib_PSROIPooling: output_dim, pooled_size and group_size must be positive and spatial_scale in [0, 1], got {}, {}, {g}, {}",
            p.output_dim, p.pooled_size, p.spatial_scale
        )));
    }
    Ok((p.output_dim as usize, p.pooled_size as usize, g as usize))
}

const OP: &str = "_contrib_PSROIPooling";

fn psroi_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (od, ps, g) = psroi_dims(a)?;
    let (d, r) = (&ins[0], &ins[1]);
    if d.shape.len() != 4 || r.shape.len() != 2 || r.shape[1] != 5 {
        return Err(Error::value(format!(
            "operator {OP}: data must be 4-D and rois (num_rois, 5), got {:?} and {:?}",
            d.shape, r.shape
        )));
    }
    if d.shape[1] != od * g * g {
        return Err(Error::value(format!(
            "operator {OP}: data has {} channels, output_dim * group_size^2 is {}",
            d.shape[1],
            od * g * g
        )));
    }
    if !matches!(d.dtype, DType::F32 | DType::F64 | DType::F16) || r.dtype != d.dtype {
        return Err(Error::type_error(format!(
            "operator {OP}: data and rois must be float16, float32 or float64 alike"
        )));
    }
    Ok(vec![Meta::new(vec![r.shape[0], od, ps, ps], d.dtype)])
}

macro_rules! psroi_bins {
    ($name:ident, $t:ty) => {
        /// Each output element's (input channel plane offset, h range, w range), in stock's
        /// arithmetic in the data's type; `None` for an ROI outside the batch.
        fn $name(
            rois: &[$t],
            scale: f64,
            (od, ps, g): (usize, usize, usize),
            (n, c, h, w): (usize, usize, usize, usize),
        ) -> Result<Vec<(usize, (usize, usize), (usize, usize))>> {
            let scale = scale as $t;
            let mut bins = Vec::with_capacity(rois.len() / 5 * od * ps * ps);
            for r in rois.chunks(5) {
                let b = r[0] as i64;
                if b < 0 || b as usize >= n {
                    return Err(Error::value(format!(
                        "operator _contrib_PSROIPooling: roi batch index {b} is outside the batch of {n}"
                    )));
                }
                let sw = (r[1].round()) * scale;
                let sh = (r[2].round()) * scale;
                let ew = ((r[3].round() as f64 + 1.0) as $t) * scale;
                let eh = ((r[4].round() as f64 + 1.0) as $t) * scale;
                let (rw, rh) = ((ew - sw).max(0.1), (eh - sh).max(0.1));
                let (bh, bw) = (rh / ps as $t, rw / ps as $t);
                for ctop in 0..od {
                    for ph in 0..ps {
                        for pw in 0..ps {
                            let clampi = |v: $t, hi: usize| (v as i64).clamp(0, hi as i64) as usize;
                            let hs = clampi((ph as $t * bh + sh).floor(), h);
                            let he = clampi(((ph + 1) as $t * bh + sh).ceil(), h);
                            let ws = clampi((pw as $t * bw + sw).floor(), w);
                            let we = clampi(((pw + 1) as $t * bw + sw).ceil(), w);
                            let gw = ((pw as $t * g as $t / ps as $t).floor() as i64).clamp(0, g as i64 - 1) as usize;
                            let gh = ((ph as $t * g as $t / ps as $t).floor() as i64).clamp(0, g as i64 - 1) as usize;
                            let ch = (ctop * g + gh) * g + gw;
                            bins.push((((b as usize) * c + ch) * h * w, (hs, he), (ws, we)));
                        }
                    }
                }
            }
            Ok(bins)
        }
    };
}
psroi_bins!(psroi_bins_f32, f32);
psroi_bins!(psroi_bins_f64, f64);

/// The kernel in `$t` arithmetic: float16 data runs in float32 (inputs converted, outputs
/// stored back), as stock's half-precision arithmetic does.
macro_rules! psroi_run {
    ($t:ty, $bins:ident, $cx:expr, $ins:expr, $outs:expr, $back:expr) => {{
        let dims = psroi_dims($cx.attrs)?;
        let scale = PsRoiParams::of($cx.attrs).spatial_scale;
        let ds = if $back { &$ins[1].shape } else { &$ins[0].shape };
        let shape = (ds[0], ds[1], ds[2], ds[3]);
        let w = shape.3;
        let rois = elems_as::<$t>(OP, if $back { &$ins[2] } else { &$ins[1] })?;
        let bins = $bins(&rois, scale, dims, shape)?;
        if !$back {
            let x = elems_as::<$t>(OP, &$ins[0])?;
            let mut out = vec![0.0 as $t; $outs[0].size()];
            for (o, &(base, (hs, he), (ws, we))) in out.iter_mut().zip(&bins) {
                let mut sum: $t = 0.0;
                for hh in hs..he {
                    for ww in ws..we {
                        sum += x[base + hh * w + ww];
                    }
                }
                let area = ((he.saturating_sub(hs)) * (we.saturating_sub(ws))) as $t;
                *o = if he <= hs || we <= ws { 0.0 } else { sum / area };
            }
            write_f64(OP, &mut $outs[0], &out.iter().map(|&v| v as f64).collect::<Vec<_>>())?;
        } else if $cx.req[0] != Req::Null {
            let dy = elems_as::<$t>(OP, &$ins[0])?;
            let mut dx = vec![0.0 as $t; $outs[0].size()];
            for (&g, &(base, (hs, he), (ws, we))) in dy.iter().zip(&bins) {
                if he <= hs || we <= ws {
                    continue;
                }
                let v = g / ((he - hs) * (we - ws)) as $t;
                for hh in hs..he {
                    for ww in ws..we {
                        dx[base + hh * w + ww] += v;
                    }
                }
            }
            write_f64(OP, &mut $outs[0], &dx.iter().map(|&v| v as f64).collect::<Vec<_>>())?;
        }
    }};
}

fn psroi_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    match ins[0].dtype {
        DType::F64 => psroi_run!(f64, psroi_bins_f64, cx, ins, outs, false),
        _ => psroi_run!(f32, psroi_bins_f32, cx, ins, outs, false),
    }
    Ok(())
}

/// Inputs (output gradient, data, rois): each bin's gradient spread evenly over its inputs;
/// the rois get zeros.
fn psroi_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req.get(1).is_some_and(|r| *r != Req::Null) {
        outs[1].as_bytes_mut().fill(0);
    }
    match ins[1].dtype {
        DType::F64 => psroi_run!(f64, psroi_bins_f64, cx, ins, outs, true),
        _ => psroi_run!(f32, psroi_bins_f32, cx, ins, outs, true),
    }
    Ok(())
}

fn register_psroi(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_contrib_PSROIPooling", Inputs::Fixed(&["data", "rois"]), Box::new(psroi_infer), Box::new(psroi_forward))
            .params(PSROI_PARAMS)
            .grad(Grad::Backward { op: "_backward_PSROIPooling", inputs: true, outputs: false })
            .doc("Performs region-of-interest pooling on inputs with position-sensitive score maps (R-FCN): each output bin averages its own group of input channels."),
    );
    ops.push(OpDef::backward("_backward_PSROIPooling", PSROI_PARAMS, Box::new(psroi_backward)));
}
