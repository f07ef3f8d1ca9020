//! `cv::resize`: OpenCV's five interpolations (nearest, bilinear, bicubic, area, Lanczos-4)
//! on `(n, h, w, c)` images of `u8`, `f32` and `f64`.
//!
//! Owns: each axis's taps (source pixels and weights per output pixel) as OpenCV computes
//! them, and the passes that apply them. Pixel centres are aligned (`(x + 0.5) · scale - 0.5`)
//! and edges clamped. 8-bit images use OpenCV's 11-bit fixed-point weights: bilinear with its
//! vectorised rounding of the two rows, bicubic and Lanczos-4 with one rounding at the end.
//! Area: an exact integer shrink averages blocks (2×2 with OpenCV's round-half-up, which is
//! also what bilinear does at scale 1/2), another shrink weighs each source pixel by its
//! overlap with the output pixel (in float), and an enlargement is bilinear with OpenCV's
//! area weights. OpenCV's vectorised code may round an 8-bit value the other way where ours
//! and its scalar code agree; results are within 1 of stock's for `uint8` and within float
//! rounding otherwise.

use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut_on, Cost, PoolKind};
use crate::op::tensor::Elem;
use std::ops::{Add, Mul};

/// The interpolations [`resize`] implements (OpenCV's codes).
pub const INTER_NEAREST: i64 = 0;
pub const INTER_LINEAR: i64 = 1;
pub const INTER_CUBIC: i64 = 2;
pub const INTER_AREA: i64 = 3;
pub const INTER_LANCZOS4: i64 = 4;

/// Whether [`resize`] implements OpenCV interpolation `interp`.
pub fn resize_supported(interp: i64) -> bool {
    (INTER_NEAREST..=INTER_LANCZOS4).contains(&interp)
}

/// Source pixels per output pixel, as OpenCV derives it (the inverse of the output/source
/// ratio, which may differ from source/output in the last bit).
fn scale_of(src: usize, dst: usize) -> f64 {
    1.0 / (dst as f64 / src as f64)
}

/// The source position and weight of the next pixel for output `d` of `dst` pixels from
/// `src` (bilinear: centres aligned, clamped at the edges).
fn linear_tap(d: usize, src: usize, dst: usize) -> (usize, f64) {
    // In float32, as OpenCV computes it.
    let f = ((d as f64 + 0.5) * scale_of(src, dst) - 0.5) as f32;
    clamp_tap(f.floor() as i64, f - f.floor(), src)
}

/// A bilinear tap at `s` with fraction `frac`, moved inside the image at its edges.
fn clamp_tap(s: i64, frac: f32, src: usize) -> (usize, f64) {
    if s < 0 {
        (0, 0.0)
    } else if s >= src as i64 - 1 {
        (src - 1, 0.0)
    } else {
        (s as usize, f64::from(frac))
    }
}

/// The bilinear tap of an area enlargement: the fraction is where the output pixel's right
/// edge falls in the source pixel.
fn area_linear_tap(d: usize, src: usize, dst: usize) -> (usize, f64) {
    let s = (d as f64 * scale_of(src, dst)).floor();
    let f = ((d + 1) as f64 - (s + 1.0) * (dst as f64 / src as f64)) as f32;
    clamp_tap(s as i64, if f <= 0.0 { 0.0 } else { f - f.floor() }, src)
}

/// The nearest and bilinear taps of one axis.
fn linear_taps(dst: usize, src: usize, interp: i64) -> Vec<(usize, f64)> {
    let scale = scale_of(src, dst);
    let nearest = |d: usize| ((d as f64 * scale).floor() as usize).min(src - 1);
    (0..dst)
        .map(|d| match interp {
            INTER_NEAREST => (nearest(d), 0.0),
            INTER_AREA => area_linear_tap(d, src, dst),
            _ => linear_tap(d, src, dst),
        })
        .collect()
}

/// One axis of a general separable resize: output `d` is the sum over `j < len[d]` of
/// `w[d·k + j]` times source pixel `idx[d·k + j]`.
pub struct Taps {
    k: usize,
    idx: Vec<usize>,
    w: Vec<f32>,
    /// The taps each output has (at most `k`; fewer for some area outputs).
    len: Vec<usize>,
    /// 8-bit images: OpenCV's fixed-point weights (bicubic, Lanczos) or float ones (area).
    fixed: bool,
}

/// Keys' bicubic kernel with a = -0.75 (OpenCV's) at the four pixels around fraction `x`.
fn cubic_weights(x: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |t: f32| ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0;
    let far = |t: f32| ((A * t - 5.0 * A) * t + 8.0 * A) * t - 4.0 * A;
    let (w0, w1, w2) = (far(x + 1.0), near(x), near(1.0 - x));
    [w0, w1, w2, 1.0 - w0 - w1 - w2]
}

/// The Lanczos kernel of order 4 at the eight pixels around fraction `x`, normalised to sum
/// to one (the centre pixel alone when `x` is 0), in OpenCV's arithmetic.
///
/// With `y_i = -(x + 3 - i)·π/4`, tap `i`'s weight is `sinc(4y_i/π)·sinc(y_i/π)`, which is
/// `sin(4y_i)·sin(y_i) / y_i²` up to a constant. `4y_i = 4y_0 + iπ`, so `sin(4y_i)` is
/// `(-1)^i sin(4y_0)`, a constant the normalisation removes; and `sin(y_i)` is
/// `sin(y_0)cos(iπ/4) + cos(y_0)sin(iπ/4)`. So each weight is
/// `(-1)^i (cos(iπ/4)·sin y_0 + sin(iπ/4)·cos y_0) / y_i²` with the exact values of the
/// cosines and sines of multiples of π/4 (0, ±1, ±√½), summed and normalised in float.
fn lanczos4_weights(x: f32) -> [f32; 8] {
    let mut w = [0f32; 8];
    if x < f32::EPSILON {
        w[3] = 1.0;
        return w;
    }
    const H: f64 = std::f64::consts::FRAC_1_SQRT_2;
    // (cos(iπ/4), sin(iπ/4)) for i = 0..8.
    const UNIT: [(f64, f64); 8] =
        [(1.0, 0.0), (H, H), (0.0, 1.0), (-H, H), (-1.0, 0.0), (-H, -H), (0.0, -1.0), (H, -H)];
    let quarter = std::f64::consts::PI * 0.25;
    let y0 = -(f64::from(x) + 3.0) * quarter;
    let (s0, c0) = (y0.sin(), y0.cos());
    let mut sum = 0f32;
    for (i, wi) in w.iter_mut().enumerate() {
        let y = -(f64::from(x) + 3.0 - i as f64) * quarter;
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        let (c, s) = (sign * UNIT[i].0, sign * UNIT[i].1);
        *wi = ((c * s0 + s * c0) / (y * y)) as f32;
        sum += *wi;
    }
    let inv = 1.0 / sum;
    w.iter_mut().for_each(|wi| *wi *= inv);
    w
}

/// The interpolation kernel's weights at fraction `x`: 4 (bicubic) or 8 (Lanczos-4).
pub(super) fn kernel_weights(interp: i64, x: f32) -> Vec<f32> {
    if interp == INTER_CUBIC {
        cubic_weights(x).to_vec()
    } else {
        lanczos4_weights(x).to_vec()
    }
}

/// Bicubic or Lanczos-4 taps of one axis, clamped at the edges.
fn kernel_taps(dst: usize, src: usize, interp: i64) -> Taps {
    let k = if interp == INTER_CUBIC { 4 } else { 8 };
    let scale = scale_of(src, dst);
    let mut t =
        Taps { k, idx: Vec::with_capacity(dst * k), w: Vec::with_capacity(dst * k), len: vec![k; dst], fixed: true };
    for d in 0..dst {
        let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
        let first = f.floor() as i64 - (k as i64 / 2 - 1);
        t.w.extend(kernel_weights(interp, f - f.floor()));
        t.idx.extend((0..k as i64).map(|j| (first + j).clamp(0, src as i64 - 1) as usize));
    }
    t
}

/// Area taps of a shrink: each source pixel weighted by its overlap with the output pixel
/// (overlaps of a thousandth of a pixel or less are dropped), padded with zero weights to the
/// longest list.
fn area_taps(dst: usize, src: usize) -> Taps {
    let scale = scale_of(src, dst);
    let lists: Vec<Vec<(usize, f32)>> = (0..dst)
        .map(|d| {
            let lo = d as f64 * scale;
            let hi = lo + scale;
            let cell = scale.min(src as f64 - lo);
            let last = (hi.floor() as usize).min(src - 1);
            let first = (lo.ceil() as usize).min(last);
            let mut l = Vec::new();
            if first as f64 - lo > 1e-3 {
                l.push((first - 1, ((first as f64 - lo) / cell) as f32));
            }
            l.extend((first..last).map(|s| (s, (1.0 / cell) as f32)));
            if hi - last as f64 > 1e-3 {
                l.push((last, ((hi - last as f64).min(1.0).min(cell) / cell) as f32));
            }
            l
        })
        .collect();
    let k = lists.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let len = lists.iter().map(Vec::len).collect();
    let mut t = Taps { k, idx: Vec::with_capacity(dst * k), w: Vec::with_capacity(dst * k), len, fixed: false };
    for l in lists {
        let pad = l.last().map_or(0, |&(s, _)| s);
        t.idx.extend(l.iter().map(|&(s, _)| s).chain(std::iter::repeat(pad)).take(k));
        t.w.extend(l.iter().map(|&(_, w)| w).chain(std::iter::repeat(0.0)).take(k));
    }
    t
}

/// The integer factor `src / dst` when it is one (OpenCV's test: within `f64::EPSILON`).
fn integer_factor(src: usize, dst: usize) -> Option<usize> {
    let s = scale_of(src, dst);
    let i = s.round();
    ((s - i).abs() < f64::EPSILON && i >= 1.0).then_some(i as usize)
}

/// A pixel type [`resize`] handles.
pub trait Pixel: Elem + Copy + Send + Sync {
    /// Nearest or bilinear (or the 2×2 average, as `plan` says) of `n` images of `(h, w, c)`
    /// in `x` to `(rh, rw)` into `out`.
    fn resize_into(x: &[Self], out: &mut [Self], hwc: (usize, usize, usize), to: (usize, usize), plan: &Linear);
    /// A general separable resize.
    fn resize_taps(x: &[Self], out: &mut [Self], hwc: (usize, usize, usize), to: (usize, usize), xt: &Taps, yt: &Taps);
    /// The average of each `(by, bx)` block (an exact integer shrink).
    fn resize_blocks(
        x: &[Self],
        out: &mut [Self],
        hwc: (usize, usize, usize),
        to: (usize, usize),
        block: (usize, usize),
    );
}

/// Resize `n` images of `(h, w, c)` (`x.len() == n·h·w·c`) to `(rh, rw)` into `out` with
/// OpenCV interpolation `interp` (0 to 4).
pub fn resize<T: Pixel>(
    x: &[T],
    out: &mut [T],
    hwc: (usize, usize, usize),
    to: (usize, usize),
    interp: i64,
) -> Result<()> {
    let ((h, w, c), (rh, rw)) = (hwc, to);
    if !resize_supported(interp) {
        return Err(Error::value(format!("unknown interpolation {interp} (OpenCV's are 0 to 4)")));
    }
    if h == 0 || w == 0 || rh == 0 || rw == 0 || c == 0 {
        return Err(Error::value(format!("cannot resize a {h}x{w}x{c} image to {rh}x{rw}")));
    }
    if x.len() % (h * w * c) != 0 || out.len() != x.len() / (h * w * c) * rh * rw * c {
        return Err(Error::internal("resize: buffer sizes do not match the shapes"));
    }
    if (h, w) == (rh, rw) {
        out.copy_from_slice(x);
        return Ok(());
    }
    let blocks = (integer_factor(h, rh), integer_factor(w, rw));
    // OpenCV's 8-bit 2x2 average rounds half up for 1, 3 and 4 channels (its vector code),
    // half to even otherwise (as its other block averages).
    let round_up = T::DTYPE != DType::U8 || matches!(c, 1 | 3 | 4);
    match interp {
        INTER_AREA if rh <= h && rw <= w => match blocks {
            (Some(2), Some(2)) if round_up => linear(x, out, hwc, to, INTER_LINEAR, true),
            (Some(by), Some(bx)) => T::resize_blocks(x, out, hwc, to, (by, bx)),
            _ => T::resize_taps(x, out, hwc, to, &area_taps(rw, w), &area_taps(rh, h)),
        },
        INTER_LINEAR if blocks == (Some(2), Some(2)) && !round_up => T::resize_blocks(x, out, hwc, to, (2, 2)),
        INTER_NEAREST | INTER_LINEAR | INTER_AREA => {
            let halving = interp == INTER_LINEAR && blocks == (Some(2), Some(2));
            linear(x, out, hwc, to, interp, halving)
        }
        _ => T::resize_taps(x, out, hwc, to, &kernel_taps(rw, w, interp), &kernel_taps(rh, h, interp)),
    }
    Ok(())
}

/// A nearest or bilinear resize: each output column's and row's source index and fraction,
/// the interpolation, and whether it is the 2×2 average (`halving`).
pub struct Linear {
    xs: Vec<(usize, f64)>,
    ys: Vec<(usize, f64)>,
    interp: i64,
    halving: bool,
}

fn linear<T: Pixel>(
    x: &[T],
    out: &mut [T],
    hwc: (usize, usize, usize),
    to: (usize, usize),
    interp: i64,
    halving: bool,
) {
    let (xs, ys) = (linear_taps(to.1, hwc.1, interp), linear_taps(to.0, hwc.0, interp));
    // Area enlargement is bilinear with its own weights.
    let interp = if interp == INTER_AREA { INTER_LINEAR } else { interp };
    T::resize_into(x, out, hwc, to, &Linear { xs, ys, interp, halving });
}

/// A general separable resize, output row by output row: each of the row's source rows is
/// filtered horizontally in `A` and added, weighted, to the row's sums (in tap order, so the
/// sums are `((r0·w0 + r1·w1) + r2·w2) + ...`, OpenCV's order). `weight` turns a tap's weight
/// into `A`, `store` a sum into a pixel.
fn separable<T, A>(
    x: &[T],
    out: &mut [T],
    ((h, w, c), (rh, rw)): ((usize, usize, usize), (usize, usize)),
    (xt, yt): (&Taps, &Taps),
    (load, weight, store): (impl Fn(T) -> A + Sync, impl Fn(f32) -> A, impl Fn(A) -> T + Sync),
) where
    T: Elem + Copy + Send + Sync,
    A: Copy + Send + Sync + Add<Output = A> + Mul<Output = A>,
{
    let (in_img, row_len, line_len) = (h * w * c, rw * c, w * c);
    let xw: Vec<A> = xt.w.iter().map(|&v| weight(v)).collect();
    let yw: Vec<A> = yt.w.iter().map(|&v| weight(v)).collect();
    let cost = Cost(((xt.k + 1) * yt.k * row_len) as f64);
    par_for_mut_on(PoolKind::Image, out, row_len, cost, T::DTYPE, |rows, o| {
        let mut sums: Vec<A> = Vec::with_capacity(row_len);
        for (r, orow) in rows.zip(o.chunks_exact_mut(row_len)) {
            let (img, oy) = (r / rh, r % rh);
            sums.clear();
            let taps = oy * yt.k..oy * yt.k + yt.len[oy];
            for (j, (&sy, &wy)) in yt.idx[taps.clone()].iter().zip(&yw[taps]).enumerate() {
                let line = &x[img * in_img + sy * line_len..img * in_img + (sy + 1) * line_len];
                for ox in 0..rw {
                    let xtaps = ox * xt.k..ox * xt.k + xt.len[ox];
                    let (ids, ws) = (&xt.idx[xtaps.clone()], &xw[xtaps]);
                    for ch in 0..c {
                        let mut terms = ids.iter().zip(ws).map(|(&sx, &wt)| load(line[sx * c + ch]) * wt);
                        let first = terms.next().expect("a tap per output pixel");
                        let v = terms.fold(first, |s, v| s + v) * wy;
                        match j {
                            0 => sums.push(v),
                            _ => sums[ox * c + ch] = sums[ox * c + ch] + v,
                        }
                    }
                }
            }
            for (o, &s) in orow.iter_mut().zip(&sums) {
                *o = store(s);
            }
        }
    });
}

/// The average of each `(by, bx)` block: the block's sum in `A` (row by row), then `finish`.
fn blocks<T, A>(
    x: &[T],
    out: &mut [T],
    (h, w, c): (usize, usize, usize),
    (rh, rw): (usize, usize),
    (by, bx): (usize, usize),
    load: impl Fn(T) -> A + Sync,
    finish: impl Fn(A) -> T + Sync,
) where
    T: Elem + Copy + Send + Sync,
    A: Copy + Add<Output = A>,
{
    let (in_img, row_len) = (h * w * c, rw * c);
    par_for_mut_on(PoolKind::Image, out, row_len, Cost((by * bx * row_len) as f64), T::DTYPE, |rows, o| {
        for (r, orow) in rows.zip(o.chunks_exact_mut(row_len)) {
            let (img, oy) = (r / rh, r % rh);
            for (q, v) in orow.iter_mut().enumerate() {
                let (ox, ch) = (q / c, q % c);
                let mut px = (0..by).flat_map(|j| {
                    let base = img * in_img + ((oy * by + j) * w + ox * bx) * c + ch;
                    (0..bx).map(move |i| base + i * c)
                });
                let first = load(x[px.next().expect("a pixel per block")]);
                *v = finish(px.fold(first, |s, p| s + load(x[p])));
            }
        }
    });
}

impl Pixel for u8 {
    fn resize_into(
        x: &[u8],
        out: &mut [u8],
        (h, w, c): (usize, usize, usize),
        (rh, rw): (usize, usize),
        plan: &Linear,
    ) {
        let Linear { xs, ys, interp, halving } = plan;
        let (in_img, row_len, line_len) = (h * w * c, rw * c, w * c);
        // OpenCV's fixed point: each weight rounded to 1/2048 (half to even), rows kept at
        // that scale, then its vectorised rounding of the two rows' sum.
        let q = |f: f64| -> (i64, i64) {
            let f = f as f32;
            (((1.0 - f) * 2048.0).round_ties_even() as i64, (f * 2048.0).round_ties_even() as i64)
        };
        let cols: Vec<(usize, usize, i64, i64)> = xs
            .iter()
            .map(|&(sx, fx)| {
                let (a0, a1) = q(fx);
                (sx * c, (sx + 1).min(w - 1) * c, a0, a1)
            })
            .collect();
        // One unit is one output row: its source rows and weights are found once.
        par_for_mut_on(PoolKind::Image, out, row_len, Cost(4.0 * row_len as f64), DType::U8, |rows, o| {
            for (r, orow) in rows.zip(o.chunks_exact_mut(row_len)) {
                let (img, oy) = (r / rh, r % rh);
                let line = |yy: usize| &x[img * in_img + yy * line_len..img * in_img + (yy + 1) * line_len];
                if *halving {
                    let (l0, l1) = (line(2 * oy), line(2 * oy + 1));
                    for (k, v) in orow.iter_mut().enumerate() {
                        let i0 = (k / c) * 2 * c + k % c;
                        let sum = l0[i0] as i32 + l0[i0 + c] as i32 + l1[i0] as i32 + l1[i0 + c] as i32;
                        *v = ((sum + 2) >> 2) as u8;
                    }
                } else if *interp == INTER_NEAREST {
                    let l = line(ys[oy].0);
                    for (px, &(sx, ..)) in orow.chunks_exact_mut(c).zip(&cols) {
                        px.copy_from_slice(&l[sx..sx + c]);
                    }
                } else {
                    let (sy, fy) = ys[oy];
                    let (b0, b1) = q(fy);
                    let (l0, l1) = (line(sy), line((sy + 1).min(h - 1)));
                    for (px, &(sx, sx1, a0, a1)) in orow.chunks_exact_mut(c).zip(&cols) {
                        for (ch, v) in px.iter_mut().enumerate() {
                            let row = |l: &[u8]| l[sx + ch] as i64 * a0 + l[sx1 + ch] as i64 * a1;
                            *v = ((((b0 * (row(l0) >> 4)) >> 16) + ((b1 * (row(l1) >> 4)) >> 16) + 2) >> 2)
                                .clamp(0, 255) as u8;
                        }
                    }
                }
            }
        });
    }

    fn resize_taps(x: &[u8], out: &mut [u8], hwc: (usize, usize, usize), to: (usize, usize), xt: &Taps, yt: &Taps) {
        if xt.fixed {
            // Weights rounded to 1/2048 on each axis; one rounding of the 2^22-scaled sum.
            let weight = |v: f32| (v * 2048.0).round_ties_even() as i64;
            let store = |s: i64| ((s + (1 << 21)) >> 22).clamp(0, 255) as u8;
            separable(x, out, (hwc, to), (xt, yt), (i64::from, weight, store));
        } else {
            separable(x, out, (hwc, to), (xt, yt), (f32::from, |v| v, super::saturate_u8));
        }
    }

    fn resize_blocks(x: &[u8], out: &mut [u8], hwc: (usize, usize, usize), to: (usize, usize), b: (usize, usize)) {
        // The integer sum times the reciprocal of the area in float, as OpenCV's scalar code.
        let inv = 1.0 / (b.0 * b.1) as f32;
        blocks(x, out, hwc, to, b, f64::from, |s: f64| super::saturate_u8(s as f32 * inv));
    }
}

/// Float resizing in the image's own type with float32 weights, as OpenCV computes it.
fn resize_float<T>(
    x: &[T],
    out: &mut [T],
    ((h, w, c), (rh, rw)): ((usize, usize, usize), (usize, usize)),
    &Linear { ref xs, ref ys, interp, halving }: &Linear,
    from_f32: impl Fn(f32) -> T + Sync,
) where
    T: Elem + Copy + Send + Sync + Mul<Output = T> + Add<Output = T>,
{
    let (in_img, out_img) = (h * w * c, rh * rw * c);
    let quarter = from_f32(0.25);
    par_for_mut_on(PoolKind::Image, out, 1, Cost(4.0), T::DTYPE, |r, o| {
        for (k, v) in r.clone().zip(o.iter_mut()) {
            let (img, rest) = (k / out_img, k % out_img);
            let (oy, ox, ch) = (rest / (rw * c), (rest / c) % rw, rest % c);
            let px = |yy: usize, xx: usize| x[img * in_img + (yy * w + xx) * c + ch];
            *v = if halving {
                let (y0, x0) = (2 * oy, 2 * ox);
                (px(y0, x0) + px(y0, x0 + 1) + px(y0 + 1, x0) + px(y0 + 1, x0 + 1)) * quarter
            } else if interp == INTER_NEAREST {
                px(ys[oy].0, xs[ox].0)
            } else {
                let ((sy, fy), (sx, fx)) = (ys[oy], xs[ox]);
                let (fx, fy) = (fx as f32, fy as f32);
                let (a0, a1, b0, b1) = (from_f32(1.0 - fx), from_f32(fx), from_f32(1.0 - fy), from_f32(fy));
                let (sx1, sy1) = ((sx + 1).min(w - 1), (sy + 1).min(h - 1));
                let row = |yy: usize| px(yy, sx) * a0 + px(yy, sx1) * a1;
                row(sy) * b0 + row(sy1) * b1
            };
        }
    });
}

/// `Pixel` for a float type, resized in that type with float32 weights.
macro_rules! float_pixel {
    ($t:ty, $from_f32:expr) => {
        impl Pixel for $t {
            fn resize_into(x: &[$t], out: &mut [$t], hwc: (usize, usize, usize), to: (usize, usize), plan: &Linear) {
                resize_float(x, out, (hwc, to), plan, $from_f32)
            }

            fn resize_taps(
                x: &[$t],
                out: &mut [$t],
                hwc: (usize, usize, usize),
                to: (usize, usize),
                xt: &Taps,
                yt: &Taps,
            ) {
                separable(x, out, (hwc, to), (xt, yt), (|v| v, $from_f32, |v| v));
            }

            fn resize_blocks(
                x: &[$t],
                out: &mut [$t],
                hwc: (usize, usize, usize),
                to: (usize, usize),
                b: (usize, usize),
            ) {
                let inv = ($from_f32)(1.0 / (b.0 * b.1) as f32);
                blocks(x, out, hwc, to, b, |v| v, |s: $t| s * inv);
            }
        }
    };
}
float_pixel!(f32, |v| v);
float_pixel!(f64, f64::from);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_sum_to_one_and_interpolate() {
        for x in [0.0f32, 0.25, 0.5, 0.9] {
            let c: f32 = cubic_weights(x).iter().sum();
            let l: f32 = lanczos4_weights(x).iter().sum();
            assert!((c - 1.0).abs() < 1e-6 && (l - 1.0).abs() < 1e-6, "{x}: {c} {l}");
        }
        assert_eq!(cubic_weights(0.0), [0.0, 1.0, 0.0, 0.0]);
        assert_eq!(lanczos4_weights(0.0)[3], 1.0);
        // Half-way, both kernels are symmetric.
        let (c, l) = (cubic_weights(0.5), lanczos4_weights(0.5));
        assert!((c[0] - c[3]).abs() < 1e-6 && (c[1] - c[2]).abs() < 1e-6);
        assert!((0..4).all(|i| (l[i] - l[7 - i]).abs() < 1e-6));
    }

    #[test]
    fn area_weights_cover_each_output_pixel() {
        // 5 -> 2: each output covers 2.5 source pixels.
        let t = area_taps(2, 5);
        assert_eq!((t.k, t.len.as_slice()), (3, &[3, 3][..]));
        assert_eq!(&t.idx[..3], &[0, 1, 2]);
        assert_eq!(&t.w[..3], &[0.4, 0.4, 0.2]);
        assert_eq!(&t.idx[3..], &[2, 3, 4]);
        assert_eq!(&t.w[3..], &[0.2, 0.4, 0.4]);
        assert_eq!(integer_factor(6, 2), Some(3));
        assert_eq!(integer_factor(5, 2), None);
    }

    #[test]
    fn resizes_constant_images_to_constants_and_blocks_to_means() {
        for interp in 0..=4 {
            for (h, w, rh, rw) in [(7, 9, 3, 4), (4, 6, 9, 13), (6, 6, 2, 3), (8, 8, 4, 4)] {
                let x = vec![77u8; h * w * 3];
                let mut out = vec![0u8; rh * rw * 3];
                resize(&x, &mut out, (h, w, 3), (rh, rw), interp).unwrap();
                assert!(out.iter().all(|&v| v == 77), "interp {interp} {h}x{w}->{rh}x{rw}: {out:?}");
                let xf = vec![1.5f32; h * w];
                let mut of = vec![0f32; rh * rw];
                resize(&xf, &mut of, (h, w, 1), (rh, rw), interp).unwrap();
                assert!(of.iter().all(|&v| (v - 1.5).abs() < 1e-5), "interp {interp}: {of:?}");
            }
        }
        // Area at an exact 3x shrink is the block mean, rounded half to even.
        let x: Vec<u8> = (0..36).collect();
        let mut out = [0u8; 4];
        resize(&x, &mut out, (6, 6, 1), (2, 2), INTER_AREA).unwrap();
        assert_eq!(out, [7, 10, 25, 28]);
        assert!(resize(&x, &mut out, (6, 6, 1), (2, 2), 5).is_err());
    }
}
