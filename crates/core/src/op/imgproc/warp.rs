//! `cv::warpAffine` for 8-bit images with a constant border (the ImageRecordIter's rotation,
//! shear, scale and aspect augmentation).
//!
//! Owns: the inverse map in OpenCV's fixed point, and its interpolation tables. As OpenCV
//! does, the map is inverted in double precision, each output pixel's source position is
//! computed in 1/1024 of a pixel and kept to 1/32, and the pixel is interpolated with weights
//! tabulated per 1/32 fraction in 1/32768 (nearest: the position rounded to a pixel). Area
//! interpolation warps bilinearly, as in OpenCV. Source pixels outside the image read as the
//! fill value. Results equal OpenCV's for every interpolation (its vector code uses the same
//! integers).

use super::resize::{kernel_weights, resize_supported, INTER_AREA, INTER_LINEAR, INTER_NEAREST};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut_on, Cost, PoolKind};
use std::sync::OnceLock;

/// Fraction bits of the source positions computed per pixel, and of those interpolated.
const AB_BITS: u32 = 10;
const INTER_BITS: u32 = 5;
const STEPS: usize = 1 << INTER_BITS;
/// Weights are integers summing to this.
const ONE: i32 = 1 << 15;

/// OpenCV's `saturate_cast<int>` of a double: rounded half to even, saturated.
fn fix(v: f64) -> i32 {
    v.round_ties_even().clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32
}

/// The taps per axis of an interpolation: 2, 4 or 8.
fn taps_of(interp: i64) -> usize {
    match interp {
        INTER_LINEAR => 2,
        super::INTER_CUBIC => 4,
        _ => 8,
    }
}

/// For each of the `STEPS²` (y, x) fractions, the `k × k` integer weights (row-major).
/// Products of the one-dimensional weights, rounded to 1/32768; where the rounded weights do
/// not sum to one, the difference goes to the largest (sum short) or smallest (sum over) of
/// the four centre-right weights, as OpenCV's tables have it.
fn table(interp: i64) -> &'static [i32] {
    static TABLES: [OnceLock<Vec<i32>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let k = taps_of(interp);
    let slot = match k {
        2 => 0,
        4 => 1,
        _ => 2,
    };
    TABLES[slot].get_or_init(|| {
        let one_d: Vec<Vec<f32>> = (0..STEPS)
            .map(|i| {
                let x = i as f32 / STEPS as f32;
                if k == 2 {
                    vec![1.0 - x, x]
                } else {
                    kernel_weights(interp, x)
                }
            })
            .collect();
        let mut t = Vec::with_capacity(STEPS * STEPS * k * k);
        for wy in &one_d {
            for wx in &one_d {
                let mut w: Vec<i32> = wy
                    .iter()
                    .flat_map(|&a| wx.iter().map(move |&b| (a * b * ONE as f32).round_ties_even() as i32))
                    .collect();
                if k > 2 {
                    // Stored as 16-bit: a weight of one is one step short.
                    w.iter_mut().for_each(|v| *v = (*v).clamp(i16::MIN.into(), i16::MAX.into()));
                    let diff = w.iter().sum::<i32>() - ONE;
                    if diff != 0 {
                        let c = k / 2;
                        let (mut lo, mut hi) = (c * k + c, c * k + c);
                        for i in (c..c + 2).flat_map(|r| (c..c + 2).map(move |q| r * k + q)) {
                            if w[i] < w[lo] {
                                lo = i;
                            } else if w[i] > w[hi] {
                                hi = i;
                            }
                        }
                        let at = if diff < 0 { hi } else { lo };
                        w[at] -= diff;
                    }
                }
                t.extend(w);
            }
        }
        t
    })
}

/// Warp the `(h, w, c)` image `x` by the forward affine map `m` (`[m0 m1 m2; m3 m4 m5]` takes
/// a source position to an output one) into an `(oh, ow, c)` image, with OpenCV interpolation
/// `interp` (0 to 4); output pixels whose source lies outside the image are `fill` (one value
/// per channel, as OpenCV's border `Scalar`).
pub fn warp_affine(
    x: &[u8],
    (h, w, c): (usize, usize, usize),
    m: [f32; 6],
    (oh, ow): (usize, usize),
    interp: i64,
    fill: [u8; 4],
) -> Result<Vec<u8>> {
    if !resize_supported(interp) {
        return Err(Error::value(format!("unknown interpolation {interp} (OpenCV's are 0 to 4)")));
    }
    if h == 0 || w == 0 || c == 0 || oh == 0 || ow == 0 || x.len() != h * w * c {
        return Err(Error::value(format!("cannot warp a {h}x{w}x{c} image into {oh}x{ow}")));
    }
    if h > i16::MAX as usize || w > i16::MAX as usize {
        // OpenCV keeps source positions in 16 bits: beyond, it samples clamped positions.
        return Err(Error::not_supported(format!("warping a {h}x{w} image (sides above 32767 pixels)")));
    }
    let interp = if interp == INTER_AREA { INTER_LINEAR } else { interp };
    // The inverse map (output position to source position), in double.
    let m = m.map(f64::from);
    let det = m[0] * m[4] - m[1] * m[3];
    let d = if det != 0.0 { 1.0 / det } else { 0.0 };
    let (a, b, p, q) = (m[4] * d, -m[1] * d, -m[3] * d, m[0] * d);
    let inv = [a, b, -a * m[2] - b * m[5], p, q, -p * m[2] - q * m[5]];
    let scale = f64::from(1 << AB_BITS);
    let nearest = interp == INTER_NEAREST;
    let (shift, round) =
        if nearest { (AB_BITS, 1 << (AB_BITS - 1)) } else { (AB_BITS - INTER_BITS, 1 << (AB_BITS - INTER_BITS - 1)) };
    let dx: Vec<(i32, i32)> =
        (0..ow).map(|ox| (fix(inv[0] * ox as f64 * scale), fix(inv[3] * ox as f64 * scale))).collect();
    let k = if nearest { 1 } else { taps_of(interp) };
    let weights = if nearest { &[][..] } else { table(interp) };
    let back = (k / 2).saturating_sub(1) as i32;
    let (row_len, line_len) = (ow * c, w * c);
    let mut out = vec![0u8; oh * row_len];
    par_for_mut_on(PoolKind::Image, &mut out, row_len, Cost((k * k * row_len) as f64), DType::U8, |rows, o| {
        for (oy, orow) in rows.zip(o.chunks_exact_mut(row_len)) {
            let x0 = fix((inv[1] * oy as f64 + inv[2]) * scale).saturating_add(round);
            let y0 = fix((inv[4] * oy as f64 + inv[5]) * scale).saturating_add(round);
            for (px, &(ax, ay)) in orow.chunks_exact_mut(c).zip(&dx) {
                let (fx, fy) = (x0.saturating_add(ax) >> shift, y0.saturating_add(ay) >> shift);
                // Positions are 16-bit in OpenCV.
                let at = |v: i32| (v >> if nearest { 0 } else { INTER_BITS }).clamp(i16::MIN.into(), i16::MAX.into());
                let (sx, sy) = (at(fx) - back, at(fy) - back);
                let inside = |yy: i32, xx: i32| (0..h as i32).contains(&yy) && (0..w as i32).contains(&xx);
                if nearest {
                    match inside(sy, sx) {
                        true => {
                            let s = sy as usize * line_len + sx as usize * c;
                            px.copy_from_slice(&x[s..s + c]);
                        }
                        false => px.copy_from_slice(&fill[..c]),
                    }
                    continue;
                }
                let frac = ((fy & (STEPS as i32 - 1)) as usize * STEPS + (fx & (STEPS as i32 - 1)) as usize) * k * k;
                let wt = &weights[frac..frac + k * k];
                for (ch, v) in px.iter_mut().enumerate() {
                    let mut sum = 0i64;
                    for r in 0..k {
                        let yy = sy + r as i32;
                        for (t, &wv) in wt[r * k..(r + 1) * k].iter().enumerate() {
                            let xx = sx + t as i32;
                            let s = if inside(yy, xx) {
                                x[yy as usize * line_len + xx as usize * c + ch]
                            } else {
                                fill[ch]
                            };
                            sum += i64::from(s) * i64::from(wv);
                        }
                    }
                    *v = ((sum + i64::from(ONE / 2)) >> 15).clamp(0, 255) as u8;
                }
            }
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_sum_to_one() {
        for interp in [INTER_LINEAR, super::super::INTER_CUBIC, super::super::INTER_LANCZOS4] {
            let k = taps_of(interp);
            for w in table(interp).chunks_exact(k * k) {
                assert_eq!(w.iter().sum::<i32>(), ONE, "interp {interp}");
            }
        }
    }

    #[test]
    fn identity_and_shift_and_rotation() {
        let (h, w) = (5, 6);
        let x: Vec<u8> = (0..h * w * 2).map(|v| (v * 3) as u8).collect();
        for interp in 0..=4 {
            let same = warp_affine(&x, (h, w, 2), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0], (h, w), interp, [9; 4]).unwrap();
            assert_eq!(same, x, "interp {interp}");
        }
        // One pixel right and down: the first row and column are the fill.
        let moved = warp_affine(&x, (h, w, 2), [1.0, 0.0, 1.0, 0.0, 1.0, 1.0], (h, w), 1, [9; 4]).unwrap();
        assert!(moved[..w * 2].iter().all(|&v| v == 9));
        assert_eq!(moved[(w + 1) * 2..(w + 2) * 2], x[..2]);
        // A quarter turn about the origin, shifted back into view: (x, y) -> (h-1-y, x).
        let turned = warp_affine(&x, (h, w, 2), [0.0, -1.0, (h - 1) as f32, 1.0, 0.0, 0.0], (w, h), 0, [9; 4]).unwrap();
        for (yy, xx) in [(0, 0), (2, 3), (4, 5)] {
            let (ox, oy) = (h - 1 - yy, xx);
            assert_eq!(turned[(oy * h + ox) * 2..][..2], x[(yy * w + xx) * 2..][..2]);
        }
        assert!(warp_affine(&x, (h, w, 2), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0], (0, w), 1, [9; 4]).is_err());
    }
}
