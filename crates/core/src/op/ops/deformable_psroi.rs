//! `_contrib_DeformablePSROIPooling` (Deformable ConvNets' position-sensitive ROI pooling: each
//! bin averages bilinear samples of its own group of channels, shifted by a learned offset per
//! part of the roi) and its backward operator.
//!
//! Owns its parameters, shape rules and kernels. Rois are `[R, 5]` rows `(batch_index, x1, y1,
//! x2, y2)`; `trans` `[R, 2 * classes, part_size, part_size]` holds each class's (x, y) offset
//! per part, in units of the roi's size times `trans_std` (`no_trans` drops it). As stock's: the
//! roi's corners are rounded and scaled, a sample half a pixel or more outside the map is
//! skipped and one nearer is clamped onto it, each bin's hidden `top_count` output counts its
//! samples, and the offsets' gradient is the samples' bilinear slope. The arithmetic runs in
//! the data's type (float16 in float32). A roi whose batch index is outside the batch is an
//! error (stock reads outside the data); so are offsets and channels that do not fit, sizes
//! above 2^32 - 1 and more than 4096 samples per part (stock would run for hours).

use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::par_items;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

op_params! {
    struct DpsParams<'a> => DPS_PARAMS {
        spatial_scale: f64 = required, "Ratio of input feature map height (or w) to raw image height (or w). Equals the reciprocal of total stride in convolutional layers";
        output_dim: i64 = required, "fix output dim";
        group_size: i64 = required, "fix group size";
        pooled_size: i64 = required, "fix pooled size";
        part_size: i64 = "0", "fix part size";
        sample_per_part: i64 = "1", "fix samples per part";
        trans_std: f64 = "0.0", "fix transition std";
        no_trans: bool = "False", "Whether to disable trans parameter.";
    }
}

/// One call's sizes: data (n, c, h, w), `r` rois, `od` output channels of `ps × ps` bins from
/// `g × g` channel groups, offsets per `part × part` parts for `classes` classes.
struct Dps {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    r: usize,
    od: usize,
    ps: usize,
    g: usize,
    part: usize,
    samples: usize,
    classes: usize,
    scale: f64,
    trans_std: f64,
    no_trans: bool,
}

impl Dps {
    fn of(a: &Attrs, data: &[usize], rois: &[usize], trans: Option<&[usize]>) -> Result<Dps> {
        let op = a.op;
        let p = DpsParams::of(a);
        let positive = |name: &str, v: i64| -> Result<usize> {
            if v < 1 || v > i64::from(u32::MAX) {
                return Err(Error::value(format!("operator {op}: {name} must be between 1 and {}, got {v}", u32::MAX)));
            }
            Ok(v as usize)
        };
        let (od, g, ps) = (
            positive("output_dim", p.output_dim)?,
            positive("group_size", p.group_size)?,
            positive("pooled_size", p.pooled_size)?,
        );
        let part = if p.part_size == 0 { ps } else { positive("part_size", p.part_size)? };
        let samples = positive("sample_per_part", p.sample_per_part)?;
        for (name, v) in [("spatial_scale", p.spatial_scale), ("trans_std", p.trans_std)] {
            if !(0.0..=1.0).contains(&(v as f32)) {
                return Err(Error::value(format!("operator {op}: {name} must be in [0, 1], got {v}")));
            }
        }
        let &[n, c, h, w] = data else {
            return Err(Error::value(format!("operator {op}: data should be a 4D tensor, got {data:?}")));
        };
        let &[r, 5] = rois else {
            return Err(Error::value(format!(
                "operator {op}: rois should be a 2D tensor of shape (num_rois, 5), got {rois:?}"
            )));
        };
        let groups = od.checked_mul(g * g).filter(|&v| v <= c);
        if groups.is_none() {
            return Err(Error::value(format!(
                "operator {op}: data has {c} channels, fewer than output_dim * group_size^2 ({od} * {g}^2)"
            )));
        }
        let classes = match trans {
            None => 1,
            Some(&[tr, t1, tp, tq]) if tr == r && t1 >= 2 && t1 % 2 == 0 && tp == part && tq == part && od % (t1 / 2) == 0 => t1 / 2,
            Some(t) => {
                return Err(Error::value(format!(
                    "operator {op}: trans should have shape (num_rois, 2 * classes, part_size, part_size) = ({r}, 2k, {part}, {part}) with k dividing output_dim ({od}), got {t:?}"
                )))
            }
        };
        let out = [r, od, ps, ps].iter().try_fold(1usize, |acc, &v| acc.checked_mul(v));
        if out.is_none_or(|s| s > isize::MAX as usize / 16) || samples > 1 << 12 {
            return Err(Error::value(format!(
                "operator {op}: pooled_size {ps} or sample_per_part {samples} is too large"
            )));
        }
        Ok(Dps {
            n,
            c,
            h,
            w,
            r,
            od,
            ps,
            g,
            part,
            samples,
            classes,
            scale: f64::from(p.spatial_scale as f32),
            trans_std: f64::from(p.trans_std as f32),
            no_trans: p.no_trans,
        })
    }

    fn out_shape(&self) -> Vec<usize> {
        vec![self.r, self.od, self.ps, self.ps]
    }
}

/// One output bin's geometry, in stock's arithmetic in `R`.
struct Bin<R> {
    image: usize,
    /// The input channel it reads.
    channel: usize,
    /// Offset indices (x, then y) into `trans`, when there are offsets.
    trans_at: Option<(usize, usize)>,
    wstart: R,
    hstart: R,
    sub_w: R,
    sub_h: R,
    roi_w: R,
    roi_h: R,
}

fn bin<T: Elem, R: Real>(d: &Dps, rois: &[T], trans: Option<&[T]>, index: usize) -> Result<Bin<R>> {
    let pw = index % d.ps;
    let ph = index / d.ps % d.ps;
    let ctop = index / (d.ps * d.ps) % d.od;
    let n = index / (d.ps * d.ps * d.od);
    let roi = &rois[n * 5..][..5];
    let b = roi[0].to_f64();
    let image = (b > -1.0 && b < d.n as f64).then_some(b as usize).ok_or_else(|| {
        Error::value(format!(
            "operator _contrib_DeformablePSROIPooling: roi {n}'s batch index {b} is outside the batch of {}",
            d.n
        ))
    })?;
    let scale = R::of(d.scale);
    let corner = |k: usize, plus: f64| R::of(roi[k].to_f64().round() + plus) * scale - R::of(0.5);
    let (sw, sh, ew, eh) = (corner(1, 0.0), corner(2, 0.0), corner(3, 1.0), corner(4, 1.0));
    let at_least = |v: R| if v > R::of(0.1) { v } else { R::of(0.1) };
    let (roi_w, roi_h) = (at_least(ew - sw), at_least(eh - sh));
    let psr = R::of(d.ps as f64);
    let (bin_h, bin_w) = (roi_h / psr, roi_w / psr);
    let spp = R::of(d.samples as f64);
    let floor = |v: R| v.f64().floor().max(0.0) as usize;
    let part_h = floor(R::of(ph as f64) / psr * R::of(d.part as f64)).min(d.part - 1);
    let part_w = floor(R::of(pw as f64) / psr * R::of(d.part as f64)).min(d.part - 1);
    let class = ctop / (d.od / d.classes);
    let trans_at = (!d.no_trans).then(|| {
        let x = (((n * d.classes + class) * 2) * d.part + part_h) * d.part + part_w;
        (x, x + d.part * d.part)
    });
    let (tx, ty) = match (trans, trans_at) {
        (Some(t), Some((x, y))) => (R::load(t[x]) * R::of(d.trans_std), R::load(t[y]) * R::of(d.trans_std)),
        _ => (R::of(0.0), R::of(0.0)),
    };
    let wstart = R::of(pw as f64) * bin_w + sw + tx * roi_w;
    let hstart = R::of(ph as f64) * bin_h + sh + ty * roi_h;
    let gsel = |p: usize| floor(R::of(p as f64) * R::of(d.g as f64) / psr).min(d.g - 1);
    let channel = (ctop * d.g + gsel(ph)) * d.g + gsel(pw);
    Ok(Bin { image, channel, trans_at, wstart, hstart, sub_w: bin_w / spp, sub_h: bin_h / spp, roi_w, roi_h })
}

/// The bin's samples inside the map: clamped position (x, y), the corners x0, x1, y0, y1 and
/// the fractions.
fn samples<R: Real>(d: &Dps, b: &Bin<R>, mut f: impl FnMut([usize; 4], R, R)) {
    if d.h == 0 || d.w == 0 {
        return;
    }
    let (wl, hl) = (R::of(d.w as f64 - 0.5), R::of(d.h as f64 - 0.5));
    for ih in 0..d.samples {
        for iw in 0..d.samples {
            let x = b.wstart + R::of(iw as f64) * b.sub_w;
            let y = b.hstart + R::of(ih as f64) * b.sub_h;
            if !(x >= R::of(-0.5) && x <= wl && y >= R::of(-0.5) && y <= hl) {
                continue;
            }
            let clamp = |v: R, hi: usize| {
                let hi = R::of(hi as f64 - 1.0);
                if v < R::of(0.0) {
                    R::of(0.0)
                } else if v > hi {
                    hi
                } else {
                    v
                }
            };
            let (x, y) = (clamp(x, d.w), clamp(y, d.h));
            let (xf, yf) = (x.f64(), y.f64());
            let corners = [xf.floor() as usize, xf.ceil() as usize, yf.floor() as usize, yf.ceil() as usize];
            f(corners, x - R::of(xf.floor()), y - R::of(yf.floor()));
        }
    }
}

fn forward<T: Elem, R: Real>(d: &Dps, ins: &[TBlob], out: &mut [T], count: &mut [T]) -> Result<()> {
    let (x, rois) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
    let trans = (!d.no_trans).then(|| ins[2].as_slice::<T>());
    let bins = (0..out.len()).map(|i| bin::<T, R>(d, rois, trans, i)).collect::<Result<Vec<_>>>()?;
    let (hw, per_roi) = (d.h * d.w, d.od * d.ps * d.ps);
    if per_roi == 0 {
        return Ok(());
    }
    // One item per roi: its output bins and their sample counts side by side.
    let items: Vec<_> = out.chunks_mut(per_roi).zip(count.chunks_mut(per_roi)).zip(bins.chunks(per_roi)).collect();
    let cost = (bins.len() * d.samples * d.samples) as f64 * 10.0;
    par_items(items, cost, T::DTYPE, |_, ((o, cnt), bins)| {
        for ((b, v), c) in bins.iter().zip(o).zip(cnt) {
            let plane = &x[(b.image * d.c + b.channel) * hw..][..hw];
            let (mut sum, mut k) = (R::of(0.0), 0usize);
            samples(d, b, |[x0, x1, y0, y1], dx, dy| {
                let at = |yy: usize, xx: usize| R::load(plane[yy * d.w + xx]);
                let one = R::of(1.0);
                sum = sum
                    + (one - dx) * (one - dy) * at(y0, x0)
                    + (one - dx) * dy * at(y1, x0)
                    + dx * (one - dy) * at(y0, x1)
                    + dx * dy * at(y1, x1);
                k += 1;
            });
            *v = if k == 0 { R::of(0.0) } else { sum / R::of(k as f64) }.store();
            *c = T::from_f64(k as f64);
        }
    });
    Ok(())
}

/// `_backward_(dY, data, rois, [trans,] output, top_count) -> (dData, dRois = 0, [dTrans])`.
fn backward<T: Elem, R: Real>(d: &Dps, req: &[Req], ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (dy, x, rois) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
    let trans = (!d.no_trans).then(|| ins[3].as_slice::<T>());
    let count = ins[ins.len() - 1].as_slice::<T>();
    let hw = d.h * d.w;
    let mut dx = vec![R::of(0.0); d.n * d.c * hw];
    let mut dt = vec![R::of(0.0); if d.no_trans { 0 } else { d.r * 2 * d.classes * d.part * d.part }];
    for i in 0..dy.len() {
        let k = R::load(count[i]);
        // Stock skips a bin with no samples (count 0; NaN compares false too).
        if k.partial_cmp(&R::of(0.0)) != Some(std::cmp::Ordering::Greater) {
            continue;
        }
        let b = bin::<T, R>(d, rois, trans, i)?;
        let g = R::load(dy[i]) / k;
        let base = (b.image * d.c + b.channel) * hw;
        let plane = &x[base..][..hw];
        let std = R::of(d.trans_std);
        samples(d, &b, |[x0, x1, y0, y1], fx, fy| {
            let one = R::of(1.0);
            for (yy, xx, q) in [
                (y0, x0, (one - fx) * (one - fy)),
                (y1, x0, (one - fx) * fy),
                (y0, x1, fx * (one - fy)),
                (y1, x1, fx * fy),
            ] {
                dx[base + yy * d.w + xx] = dx[base + yy * d.w + xx] + q * g;
            }
            if let Some((tx, ty)) = b.trans_at {
                let at = |yy: usize, xx: usize| R::load(plane[yy * d.w + xx]);
                let (u00, u01, u10, u11) = (at(y0, x0), at(y1, x0), at(y0, x1), at(y1, x1));
                let gx = (u11 * fy + u10 * (one - fy) - u01 * fy - u00 * (one - fy)) * std * g * b.roi_w;
                let gy = (u11 * fx + u01 * (one - fx) - u10 * fx - u00 * (one - fx)) * std * g * b.roi_h;
                dt[tx] = dt[tx] + gx;
                dt[ty] = dt[ty] + gy;
            }
        });
    }
    if req[0] != Req::Null {
        for (o, v) in outs[0].as_mut::<T>().iter_mut().zip(dx) {
            *o = v.store();
        }
    }
    if req.get(1).is_some_and(|&r| r != Req::Null) {
        outs[1].as_mut::<T>().fill(T::zero());
    }
    if !d.no_trans && req.get(2).is_some_and(|&r| r != Req::Null) {
        for (o, v) in outs[2].as_mut::<T>().iter_mut().zip(dt) {
            *o = v.store();
        }
    }
    Ok(())
}

fn dps_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let d = Dps::of(cx.attrs, &ins[0].shape, &ins[1].shape, ins.get(2).map(|t| &t.shape[..]))?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let [out, count] = outs else {
            return Err(Error::internal("DeformablePSROIPooling has two outputs"));
        };
        forward::<T, R>(&d, ins, out.as_mut::<T>(), count.as_mut::<T>())?
    });
    Ok(())
}

fn dps_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let no_trans = DpsParams::of(cx.attrs).no_trans;
    let trans = (!no_trans).then(|| &ins[3].shape[..]);
    let d = Dps::of(cx.attrs, &ins[1].shape, &ins[2].shape, trans)?;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => backward::<T, R>(&d, cx.req, ins, outs)?);
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "_contrib_DeformablePSROIPooling",
            Inputs::Leading(&["data", "rois", "trans"], |a| if DpsParams::of(a).no_trans { 2 } else { 3 }),
            Box::new(|a, ins| {
                let dt = super::common::floats_like_first(a.op, ins)?;
                let d = Dps::of(a, &ins[0].shape, &ins[1].shape, ins.get(2).map(|m| &m.shape[..]))?;
                Ok(vec![Meta::new(d.out_shape(), dt), Meta::new(d.out_shape(), dt)])
            }),
            Box::new(dps_forward),
        )
        .params(DPS_PARAMS)
        .outputs(|_| 2, |_| 1)
        .output_names(&["output", "top_count"])
        .grad(Grad::Backward { op: "_backward__contrib_DeformablePSROIPooling", inputs: true, outputs: true })
        .doc("Performs deformable position-sensitive region-of-interest pooling on inputs (Dai et al., Deformable Convolutional Networks): data (N, output_dim * group_size^2, H, W), rois (R, 5) rows (batch_index, x1, y1, x2, y2), trans (R, 2 * classes, part_size, part_size) the offsets of each part (unless no_trans); each of the pooled_size^2 bins averages sample_per_part^2 bilinear samples of its channel group. Output (R, output_dim, pooled_size, pooled_size)."),
    );
    ops.push(OpDef::backward("_backward__contrib_DeformablePSROIPooling", DPS_PARAMS, Box::new(dps_backward)));
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    /// Gradients of the data and offsets against finite differences (the rois get zeros);
    /// samples stay inside the map, off the integer grid.
    #[test]
    fn gradients() {
        let (od, g, ps) = (2usize, 2usize, 2usize);
        let x = values(2 * od * g * g * 9 * 9, -1.0, 1.0, 21);
        let rois = vec![0.0, 1.0, 2.0, 6.0, 5.0, 1.0, 2.0, 1.0, 7.0, 6.0];
        let trans = values(2 * 2 * ps * ps, -0.4, 0.4, 22);
        let params = [
            ("spatial_scale", "0.9"),
            ("output_dim", "2"),
            ("group_size", "2"),
            ("pooled_size", "2"),
            ("sample_per_part", "2"),
            ("trans_std", "0.3"),
        ];
        check(
            "_contrib_DeformablePSROIPooling",
            &params,
            &[(&[2, od * g * g, 9, 9][..], x.clone()), (&[2, 5], rois.clone()), (&[2, 2, ps, ps], trans)],
            &[1],
        );
        let mut no_trans = params.to_vec();
        no_trans.push(("no_trans", "True"));
        check("_contrib_DeformablePSROIPooling", &no_trans, &[(&[2, od * g * g, 9, 9][..], x), (&[2, 5], rois)], &[1]);
    }
}
