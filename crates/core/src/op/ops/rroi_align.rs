//! `_contrib_RROIAlign`: ROIAlign over rotated regions (text detection; Ma et al., rotation
//! proposals).
//!
//! Owns its parameters, shape rules and forward kernel. Rois are `[R, 6]` rows
//! `(batch_index, x_center, y_center, width, height, theta in degrees)` in image
//! coordinates; each of the `pooled_size` bins of a roi averages a grid of bilinear samples
//! (`sampling_ratio` per axis, or `ceil(size / bins)`) taken in the roi's frame, rotated by
//! theta about its centre. As stock's: sizes below one pixel count as one, a sample more than
//! a pixel outside the map gives 0, and one nearer is clamped to the edge. A roi whose batch
//! index is not in `[0, N)` gives zeros (stock reads outside the data). Computed in float64,
//! rounded once. Stock has no gradient for it, and neither has this one.

use super::nn::dispatch_real;
use super::roi::{batch_of, MAX_AXIS_SAMPLES};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Inputs, OpCtx, OpDef};

op_params! {
    struct RroiParams<'a> => RROI_PARAMS {
        pooled_size: &'a [i64] = required, "RROI align output shape (h,w) ";
        spatial_scale: f64 = required, "Ratio of input feature map height (or width) to raw image height (or width). Equals the reciprocal of total stride in convolutional layers";
        sampling_ratio: i64 = "-1", "Optional sampling ratio of RROI align, using adaptive size by default.";
    }
}

/// Data `[n, c, h, w]`, `r` rois, `ph × pw` bins, the scale and sampling ratio.
struct Dims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    r: usize,
    ph: usize,
    pw: usize,
    scale: f64,
    ratio: i64,
}

fn dims(a: &Attrs, data: &[usize], rois: &[usize]) -> Result<Dims> {
    let op = a.op;
    let p = RroiParams::of(a);
    let &[n, c, h, w] = data else {
        return Err(Error::value(format!("operator {op}: data should be a 4D tensor, got shape {data:?}")));
    };
    let &[r, 6] = rois else {
        return Err(Error::value(format!(
            "operator {op}: rois should be a 2D tensor of shape (num_rois, 6), rows (batch_index, x, y, w, h, theta), got {rois:?}"
        )));
    };
    let &[ph, pw] = p.pooled_size else {
        return Err(Error::value(format!("operator {op}: pooled_size must be (h, w), got {:?}", p.pooled_size)));
    };
    if ph < 1 || pw < 1 {
        return Err(Error::value(format!("operator {op}: pooled_size must be positive, got {:?}", p.pooled_size)));
    }
    // Stock keeps the scale as a float and checks it against [0, 1] there (NaN passes).
    let s = p.spatial_scale as f32;
    if !(s.is_nan() || (0.0..=1.0).contains(&s)) {
        return Err(Error::value(format!("operator {op}: spatial_scale must be in [0, 1], got {}", p.spatial_scale)));
    }
    let (ph, pw) = (ph as usize, pw as usize);
    let out = [r, c, ph, pw].iter().try_fold(1usize, |acc, &v| acc.checked_mul(v));
    if out.is_none_or(|s| s > isize::MAX as usize / 16) || ph.max(pw) > MAX_AXIS_SAMPLES {
        return Err(Error::value(format!("operator {op}: pooled_size {:?} makes the output too large", p.pooled_size)));
    }
    if p.sampling_ratio > 0 && (p.sampling_ratio as u64).saturating_mul(ph.max(pw) as u64) > MAX_AXIS_SAMPLES as u64 {
        return Err(Error::value(format!("operator {op}: sampling_ratio {} is too large", p.sampling_ratio)));
    }
    Ok(Dims { n, c, h, w, r, ph, pw, scale: f64::from(s), ratio: p.sampling_ratio })
}

/// One roi in feature-map units: centre, the bins' start and size, the sample grid, and
/// theta's cosine and sine.
struct Roi {
    batch: Option<usize>,
    cy: f64,
    cx: f64,
    start: [f64; 2],
    bin: [f64; 2],
    grid: [usize; 2],
    cos: f64,
    sin: f64,
}

fn roi<T: Elem>(op: &str, d: &Dims, i: usize, row: &[T]) -> Result<Roi> {
    let v = |k: usize| row[k].to_f64();
    let (cx, cy) = (v(1) * d.scale, v(2) * d.scale);
    // Malformed (smaller than a pixel) rois count as 1 × 1; NaN stays NaN as in stock.
    let at_least_one = |s: f64| if s < 1.0 { 1.0 } else { s };
    let (rw, rh) = (at_least_one(v(3) * d.scale), at_least_one(v(4) * d.scale));
    let theta = v(5) * std::f64::consts::PI / 180.0;
    let (bh, bw) = (rh / d.ph as f64, rw / d.pw as f64);
    let grid = |bin: f64, bins: usize| -> Result<usize> {
        if d.ratio > 0 {
            return Ok(d.ratio as usize);
        }
        let g = bin.ceil();
        if !(g >= 1.0 && g * bins as f64 <= MAX_AXIS_SAMPLES as f64) {
            return Err(Error::value(format!(
                "operator {op}: roi {i} ({:?}) needs {g} samples per bin: its size or spatial_scale is wrong",
                (0..6).map(v).collect::<Vec<_>>()
            )));
        }
        Ok(g as usize)
    };
    let grid = [grid(bh, d.ph)?, grid(bw, d.pw)?];
    Ok(Roi {
        batch: batch_of(row[0], d.n),
        cy,
        cx,
        start: [-rh / 2.0, -rw / 2.0],
        bin: [bh, bw],
        grid,
        cos: theta.cos(),
        sin: theta.sin(),
    })
}

/// The four neighbours (flat index, weight) of the sample at (y, x) of an `h`×`w` map, as
/// stock's RROIAlign weighs them; `None` more than a pixel outside.
fn neighbours(h: usize, w: usize, mut y: f64, mut x: f64) -> Option<[(usize, f64); 4]> {
    if !(y >= -1.0 && y <= h as f64 && x >= -1.0 && x <= w as f64) {
        return None;
    }
    y = y.max(0.0);
    x = x.max(0.0);
    let (mut yl, mut xl) = (y as usize, x as usize);
    let (yh, xh);
    if yl + 1 >= h {
        (yl, yh, y) = (h - 1, h - 1, (h - 1) as f64);
    } else {
        yh = yl + 1;
    }
    if xl + 1 >= w {
        (xl, xh, x) = (w - 1, w - 1, (w - 1) as f64);
    } else {
        xh = xl + 1;
    }
    let (ly, lx) = (y - yl as f64, x - xl as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    Some([(yl * w + xl, hy * hx), (yl * w + xh, hy * lx), (yh * w + xl, ly * hx), (yh * w + xh, ly * lx)])
}

fn forward<T: Elem>(d: &Dims, rois: &[Roi], x: &[T], out: &mut [T]) {
    let (bins, hw) = (d.ph * d.pw, d.h * d.w);
    let per_roi = d.c * bins;
    if per_roi == 0 {
        return;
    }
    let cost = Cost(per_roi as f64 * 8.0 * (rois.iter().map(|r| r.grid[0] * r.grid[1]).max().unwrap_or(1)) as f64);
    par_for_mut(out, per_roi, cost, T::DTYPE, |range, o| {
        for (roi, dst) in rois[range].iter().zip(o.chunks_mut(per_roi)) {
            let Some(b) = roi.batch.filter(|_| hw > 0) else {
                dst.fill(T::from_f64(0.0));
                continue;
            };
            let img = &x[b * d.c * hw..][..d.c * hw];
            let mut acc = vec![0.0f64; per_roi];
            let [gh, gw] = roi.grid;
            for py in 0..d.ph {
                for px in 0..d.pw {
                    for iy in 0..gh {
                        let yy = roi.start[0] + py as f64 * roi.bin[0] + (iy as f64 + 0.5) * roi.bin[0] / gh as f64;
                        for ix in 0..gw {
                            let xx = roi.start[1] + px as f64 * roi.bin[1] + (ix as f64 + 0.5) * roi.bin[1] / gw as f64;
                            let sx = xx * roi.cos + yy * roi.sin + roi.cx;
                            let sy = yy * roi.cos - xx * roi.sin + roi.cy;
                            let Some(nb) = neighbours(d.h, d.w, sy, sx) else { continue };
                            for (ch, a) in acc.iter_mut().skip(py * d.pw + px).step_by(bins).enumerate() {
                                let plane = &img[ch * hw..][..hw];
                                *a += nb.iter().map(|&(i, wt)| wt * plane[i].to_f64()).sum::<f64>();
                            }
                        }
                    }
                }
            }
            let count = (gh * gw) as f64;
            for (o, a) in dst.iter_mut().zip(acc) {
                *o = T::from_f64(a / count);
            }
        }
    });
}

fn rroi_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let d = dims(cx.attrs, &ins[0].shape, &ins[1].shape)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, _R => {
        let rows = ins[1].as_slice::<T>();
        let rois = (0..d.r).map(|i| roi(cx.attrs.op, &d, i, &rows[i * 6..][..6])).collect::<Result<Vec<_>>>()?;
        forward::<T>(&d, &rois, ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "_contrib_RROIAlign",
            Inputs::Fixed(&["data", "rois"]),
            Box::new(|a, ins| {
                let dt = super::common::floats_like_first(a.op, ins)?;
                let d = dims(a, &ins[0].shape, &ins[1].shape)?;
                Ok(vec![Meta::new(vec![d.r, d.c, d.ph, d.pw], dt)])
            }),
            Box::new(rroi_forward),
        )
        .params(RROI_PARAMS)
        .output_names(&["output"])
        .doc("Performs Rotated ROI Align on the input array: data (N, C, H, W) over the rotated regions `rois` (R, 6), rows (batch_index, x_center, y_center, width, height, theta in degrees) scaled by spatial_scale; each of the pooled_size bins averages bilinear samples on a grid (sampling_ratio per axis, or adaptive) in the roi's rotated frame. Output (R, C, ph, pw). No gradient, as in stock."),
    );
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::run;

    /// An unrotated roi covering a 4×4 map's centre 2×2 pixels with one bin and a 2×2 grid
    /// averages samples at (1.5 ± 0.5): the mean of the centre pixels; rotating it by 90°
    /// keeps it; a roi of image 5 of 1 gives zeros.
    #[test]
    fn centre_bin() {
        let x: Vec<f64> = (0..16).map(f64::from).collect();
        let rois = vec![0.0, 1.5, 1.5, 2.0, 2.0, 0.0, 0.0, 1.5, 1.5, 2.0, 2.0, 90.0, 5.0, 1.5, 1.5, 2.0, 2.0, 0.0];
        let params = [("pooled_size", "(1, 1)"), ("spatial_scale", "1.0")];
        let out = run("_contrib_RROIAlign", &params, &[(&[1, 1, 4, 4][..], x), (&[3, 6], rois)]);
        let centre = (5.0 + 6.0 + 9.0 + 10.0) / 4.0;
        assert!((out[0][0] - centre).abs() < 1e-12 && (out[0][1] - centre).abs() < 1e-12, "{:?}", out[0]);
        assert_eq!(out[0][2], 0.0);
    }
}
