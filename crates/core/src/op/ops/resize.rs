//! Spatial resampling of NCHW images: `_contrib_AdaptiveAvgPooling2D`,
//! `_contrib_BilinearResize2D` and `UpSampling` (nearest neighbour), with their backward
//! operators.
//!
//! Each forward maps every output pixel to a fixed set of input pixels with weights (a bin
//! average, the four bilinear neighbours, the nearest pixel); each backward scatters the output
//! gradient back along the same map. The forward runs over (image, channel) planes on the
//! kernel pool; the backward writes each input plane from its own output plane. Index and
//! weight arithmetic follows stock 1.9.1 (bilinear source positions and scales in float32).

use super::deconv;
use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    pub(super) struct AdaptiveParams<'a> => ADAPTIVE_PARAMS {
        output_size: &'a [i64] = "[]", "int (output size) or a tuple of int for output (height, width).";
    }
}

op_params! {
    pub(super) struct BilinearParams<'a> => BILINEAR_PARAMS {
        height: i64 = "1", "output height (required, but ignored if scale_height is defined or mode is not \"size\")";
        width: i64 = "1", "output width (required, but ignored if scale_width is defined or mode is not \"size\")";
        scale_height: Option<f64> = "None", "sampling scale of the height (optional, used in modes \"scale\" and \"odd_scale\")";
        scale_width: Option<f64> = "None", "sampling scale of the width (optional, used in modes \"scale\" and \"odd_scale\")";
        mode: &'a str = "size" in ["like", "odd_scale", "size", "to_even_down", "to_even_up", "to_odd_down", "to_odd_up"], "resizing mode. \"simple\" - output height equals parameter \"height\" if \"scale_height\" parameter is not defined or input height multiplied by \"scale_height\" otherwise. Same for width;\"odd_scale\" - if original height or width is odd, then result height is calculated like result_h = (original_h - 1) * scale + 1; for scale > 1 the result shape would be like if we did deconvolution with kernel = (1, 1) and stride = (height_scale, width_scale); and for scale < 1 shape would be like we did convolution with kernel = (1, 1) and stride = (int(1 / height_scale), int( 1/ width_scale);\"like\" - resize first input to the height and width of second input; \"to_even_down\" - resize input to nearest lower even height and width (if original height is odd then result height = original height - 1);\"to_even_up\" - resize input to nearest bigger even height and width (if original height is odd then result height = original height + 1);\"to_odd_down\" - resize input to nearest odd height and width (if original height is odd then result height = original height - 1);\"to_odd_up\" - resize input to nearest odd height and width (if original height is odd then result height = original height + 1);";
        align_corners: bool = "True", "With align_corners = True, the interpolating doesn't proportionally align theoutput and input pixels, and thus the output values can depend on the input size.";
    }
}

op_params! {
    pub(super) struct UpParams<'a> => UP_PARAMS {
        scale: i64 = required, "Up sampling scale";
        num_filter: i64 = "0", "Input filter. Only used by bilinear sample_type.Since bilinear upsampling uses deconvolution, num_filters is set to the number of channels.";
        sample_type: &'a str = required in ["bilinear", "nearest"], "upsampling method";
        multi_input_mode: &'a str = "concat" in ["concat", "sum"], "How to handle multiple input. concat means concatenate upsampled images along the channel dimension. sum means add all images together, only available for nearest neighbor upsampling.";
        num_args: i64 = required, "Number of inputs to be upsampled. For nearest neighbor upsampling, this can be 1-N; the size of output will be(scale*h_0,scale*w_0) and all other inputs will be upsampled to thesame size. For bilinear upsampling this must be 2; 1 input and 1 weight.";
        workspace: i64 = "512", "Tmp workspace for deconvolution (MB)";
    }
}

fn nchw(op: &str, shape: &[usize]) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(shape).map_err(|_| {
        Error::value(format!("operator {op}: data must be 4-D (batch, channel, height, width), got {shape:?}"))
    })
}

/// One output pixel's sources: up to four (input index within the plane, weight).
type Taps = Vec<[(usize, f64); 4]>;

// ---------------------------------------------------------------------------------------------
// AdaptiveAvgPooling2D

fn adaptive_out(a: &Attrs) -> Result<Option<(usize, usize)>> {
    let s = AdaptiveParams::of(a).output_size;
    let ok = |v: i64| {
        if v > 0 {
            Ok(v as usize)
        } else {
            Err(Error::value(format!("operator {}: output_size {s:?} must be positive", a.op)))
        }
    };
    Ok(match s {
        [] => None,
        [v] => Some((ok(*v)?, ok(*v)?)),
        [h, w] => Some((ok(*h)?, ok(*w)?)),
        _ => return Err(Error::value(format!("operator {}: output_size {s:?} must have 1 or 2 entries", a.op))),
    })
}

/// The bin of output index `o` of `out` over `n` inputs: [floor(o·n/out), ceil((o+1)·n/out)).
fn bin(o: usize, out: usize, n: usize) -> (usize, usize) {
    (o * n / out, ((o + 1) * n).div_ceil(out))
}

fn adaptive_taps(ih: usize, iw: usize, oh: usize, ow: usize) -> Vec<(usize, usize, usize, usize)> {
    (0..oh * ow)
        .map(|k| {
            let ((y0, y1), (x0, x1)) = (bin(k / ow, oh, ih), bin(k % ow, ow, iw));
            (y0, y1, x0, x1)
        })
        .collect()
}

fn adaptive_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let [n, c, h, w] = nchw(a.op, &ins[0].shape)?;
    if h == 0 || w == 0 {
        return Err(Error::value(format!("operator {}: the input height and width must be positive", a.op)));
    }
    let (oh, ow) = adaptive_out(a)?.unwrap_or((1, 1));
    if oh.checked_mul(ow).is_none_or(|s| s > isize::MAX as usize / 64) {
        return Err(Error::value(format!("operator {}: output_size ({oh}, {ow}) is too large", a.op)));
    }
    Ok(vec![Meta::new(vec![n, c, oh, ow], ins[0].dtype)])
}

fn adaptive_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let [_, _, ih, iw] = nchw(a.op, &ins[0].shape)?;
    let [_, _, oh, ow] = nchw(a.op, &outs[0].shape)?;
    let (isz, osz) = (ih * iw, oh * ow);
    if outs[0].size() == 0 {
        return Ok(());
    }
    let bins = adaptive_taps(ih, iw, oh, ow);
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let x = ins[0].as_slice::<T>();
        par_for_mut(outs[0].as_mut::<T>(), osz, Cost(isz as f64 + osz as f64), T::DTYPE, |planes, o| {
            for (p, op) in planes.zip(o.chunks_mut(osz)) {
                let plane = &x[p * isz..(p + 1) * isz];
                for (v, &(y0, y1, x0, x1)) in op.iter_mut().zip(&bins) {
                    let mut acc = R::of(0.0);
                    for y in y0..y1 {
                        for xv in &plane[y * iw + x0..y * iw + x1] {
                            acc += R::load(*xv);
                        }
                    }
                    *v = (acc / R::of(((y1 - y0) * (x1 - x0)) as f64)).store();
                }
            }
        });
    });
    Ok(())
}

fn adaptive_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let [_, _, ih, iw] = nchw(a.op, &ins[1].shape)?;
    let [_, _, oh, ow] = nchw(a.op, &ins[0].shape)?;
    let (isz, osz) = (ih * iw, oh * ow);
    if outs[0].size() == 0 {
        return Ok(());
    }
    let bins = adaptive_taps(ih, iw, oh, ow);
    dispatch_real!(ins[1].dtype, a.op, T, R => {
        let g = ins[0].as_slice::<T>();
        par_for_mut(outs[0].as_mut::<T>(), isz.max(1), Cost(2.0 * isz as f64), T::DTYPE, |planes, d| {
            for (p, dp) in planes.zip(d.chunks_mut(isz.max(1))) {
                let mut acc = vec![R::of(0.0); isz];
                for (gv, &(y0, y1, x0, x1)) in g[p * osz..(p + 1) * osz].iter().zip(&bins) {
                    let share = R::load(*gv) / R::of(((y1 - y0) * (x1 - x0)) as f64);
                    for y in y0..y1 {
                        for v in &mut acc[y * iw + x0..y * iw + x1] {
                            *v += share;
                        }
                    }
                }
                for (o, v) in dp.iter_mut().zip(acc) {
                    *o = v.store();
                }
            }
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// BilinearResize2D

fn bilinear_inputs(a: &Attrs) -> usize {
    1 + (BilinearParams::of(a).mode == "like") as usize
}

fn bilinear_size(a: &Attrs, ins: &[Meta]) -> Result<(usize, usize)> {
    let p = BilinearParams::of(a);
    let [_, _, h, w] = nchw(a.op, &ins[0].shape)?;
    let scaled = |s: Option<f64>, n: usize, what: &str| -> Result<f64> {
        s.ok_or_else(|| Error::value(format!("operator {}: mode {} needs {what}", a.op, p.mode)))
            .map(|s| s as f32 as f64 * n as f64)
    };
    let (oh, ow) = match p.mode {
        "size" => (
            match p.scale_height {
                Some(s) => (s as f32 * h as f32) as i64,
                None => p.height,
            },
            match p.scale_height {
                // Stock reads scale_width only when scale_height is given.
                Some(_) => scaled(p.scale_width, w, "scale_width")? as f32 as i64,
                None => p.width,
            },
        ),
        "odd_scale" => {
            let odd = |n: usize, s: Option<f64>, what: &str| -> Result<i64> {
                let s =
                    s.ok_or_else(|| Error::value(format!("operator {}: mode odd_scale needs {what}", a.op)))? as f32;
                Ok(if n % 2 == 0 { (n as f32 * s) as i64 } else { ((n - 1) as f32 * s) as i64 + 1 })
            };
            (odd(h, p.scale_height, "scale_height")?, odd(w, p.scale_width, "scale_width")?)
        }
        "like" => {
            let like = nchw(a.op, &ins[1].shape)?;
            (like[2] as i64, like[3] as i64)
        }
        mode => {
            let (even, up) = (mode.contains("even"), mode.ends_with("up"));
            let adjust = |n: usize| -> i64 {
                let keep = (n % 2 == 0) == even;
                if keep {
                    n as i64
                } else if up {
                    n as i64 + 1
                } else {
                    n as i64 - 1
                }
            };
            (adjust(h), adjust(w))
        }
    };
    if oh <= 0 || ow <= 0 {
        return Err(Error::value(format!("operator {}: the output size ({oh}, {ow}) must be positive", a.op)));
    }
    Ok((oh as usize, ow as usize))
}

fn bilinear_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let [n, c, h, w] = nchw(a.op, &ins[0].shape)?;
    if h == 0 || w == 0 {
        return Err(Error::value(format!("operator {}: the input height and width must be positive", a.op)));
    }
    let (oh, ow) = bilinear_size(a, ins)?;
    Ok(vec![Meta::new(vec![n, c, oh, ow], ins[0].dtype)])
}

/// For each output index along one axis: (source index, its neighbour's offset, weight of
/// the neighbour), as stock computes them (float32).
fn axis_taps(input: usize, output: usize, align: bool) -> Vec<(usize, usize, f32)> {
    let scale = if output > 1 {
        if align {
            (input as f32 - 1.0) / (output as f32 - 1.0)
        } else {
            input as f32 / output as f32
        }
    } else {
        0.0
    };
    (0..output)
        .map(|o| {
            // Without align_corners: in double, rounded once to float (stock's arithmetic).
            let src = if align { scale * o as f32 } else { ((scale as f64 * (o as f64 + 0.5) - 0.5) as f32).max(0.0) };
            let i = src as usize;
            let step = usize::from(i + 1 < input);
            (i, step, src - i as f32)
        })
        .collect()
}

fn bilinear_taps(a: &Attrs, (ih, iw): (usize, usize), (oh, ow): (usize, usize)) -> Taps {
    let align = BilinearParams::of(a).align_corners;
    if (ih, iw) == (oh, ow) {
        return (0..oh * ow).map(|k| [(k, 1.0), (0, 0.0), (0, 0.0), (0, 0.0)]).collect();
    }
    let (ys, xs) = (axis_taps(ih, oh, align), axis_taps(iw, ow, align));
    let mut taps = Vec::with_capacity(oh * ow);
    for &(y, dy, ly) in &ys {
        for &(x, dx, lx) in &xs {
            let base = y * iw + x;
            let (ly, lx) = (ly as f64, lx as f64);
            taps.push([
                (base, (1.0 - ly) * (1.0 - lx)),
                (base + dx, (1.0 - ly) * lx),
                (base + dy * iw, ly * (1.0 - lx)),
                (base + dy * iw + dx, ly * lx),
            ]);
        }
    }
    taps
}

/// Forward of a tap map: each output pixel is the weighted sum of its sources.
fn resample_forward(op: &str, taps: &Taps, x: &TBlob, out: &mut OutBlob, isz: usize) -> Result<()> {
    let osz = taps.len();
    if out.size() == 0 {
        return Ok(());
    }
    dispatch_real!(x.dtype, op, T, R => {
        let xs = x.as_slice::<T>();
        par_for_mut(out.as_mut::<T>(), osz, Cost(8.0 * osz as f64), T::DTYPE, |planes, o| {
            for (p, op) in planes.zip(o.chunks_mut(osz)) {
                let plane = &xs[p * isz..(p + 1) * isz];
                for (v, t) in op.iter_mut().zip(taps) {
                    let mut acc = R::of(0.0);
                    for &(i, w) in t {
                        if w != 0.0 {
                            acc += R::of(w) * R::load(plane[i]);
                        }
                    }
                    *v = acc.store();
                }
            }
        });
    });
    Ok(())
}

/// Backward of a tap map: each input pixel gathers the gradient its outputs took from it.
fn resample_backward(op: &str, taps: &Taps, g: &TBlob, dx: &mut OutBlob, isz: usize) -> Result<()> {
    let osz = taps.len();
    dispatch_real!(g.dtype, op, T, R => {
        let gs = g.as_slice::<T>();
        par_for_mut(dx.as_mut::<T>(), isz.max(1), Cost(8.0 * osz as f64), T::DTYPE, |planes, d| {
            for (p, dp) in planes.zip(d.chunks_mut(isz.max(1))) {
                let mut acc = vec![R::of(0.0); isz];
                for (gv, t) in gs[p * osz..(p + 1) * osz].iter().zip(taps) {
                    let gv = R::load(*gv);
                    for &(i, w) in t {
                        if w != 0.0 {
                            acc[i] += R::of(w) * gv;
                        }
                    }
                }
                for (o, v) in dp.iter_mut().zip(acc) {
                    *o = v.store();
                }
            }
        });
    });
    Ok(())
}

fn bilinear_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let [_, _, ih, iw] = nchw(a.op, &ins[0].shape)?;
    let [_, _, oh, ow] = nchw(a.op, &outs[0].shape)?;
    if outs[0].size() == 0 {
        return Ok(());
    }
    let taps = bilinear_taps(a, (ih, iw), (oh, ow));
    resample_forward(a.op, &taps, &ins[0], &mut outs[0], ih * iw)
}

/// `(dY, data[, like]) -> (dData[, 0])`.
fn bilinear_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let [_, _, ih, iw] = nchw(a.op, &ins[1].shape)?;
    let [_, _, oh, ow] = nchw(a.op, &ins[0].shape)?;
    if outs.len() > 1 && cx.req[1] != Req::Null {
        super::init::fill(&mut outs[1], 0.0);
    }
    if cx.req[0] == Req::Null || outs[0].size() == 0 {
        return Ok(());
    }
    let taps = bilinear_taps(a, (ih, iw), (oh, ow));
    resample_backward(a.op, &taps, &ins[0], &mut outs[0], ih * iw)
}

// ---------------------------------------------------------------------------------------------
// UpSampling (nearest)

fn up_check(a: &Attrs) -> Result<usize> {
    let p = UpParams::of(a);
    if p.scale < 1 {
        return Err(Error::value(format!("operator {}: scale must be >= 1, got {}", a.op, p.scale)));
    }
    Ok(p.scale as usize)
}

/// For `sample_type='bilinear'`: the deconvolution it runs (see
/// [`deconv::bilinear_upsampling`]), after checking that it has its two inputs.
fn up_bilinear(a: &Attrs, inputs: usize) -> Result<Option<Attrs>> {
    let p = UpParams::of(a);
    if p.sample_type != "bilinear" {
        return Ok(None);
    }
    up_check(a)?;
    if inputs != 2 {
        return Err(Error::value(format!(
            "operator {}: bilinear upsampling takes 2 inputs (data, weight), got {inputs}",
            a.op
        )));
    }
    deconv::bilinear_upsampling(a.op, p.scale, p.num_filter, p.workspace).map(Some)
}

/// Bilinear upsampling's weight `(channels, 1, k, k)` from the data's channels.
fn up_param_shapes(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let p = UpParams::of(a);
    if p.sample_type != "bilinear" || data.len() != 4 {
        return Ok(Vec::new());
    }
    Ok(vec![(1, deconv::bilinear_weight_shape(p.scale, data[1]))])
}

fn up_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    if let Some(d) = up_bilinear(a, ins.len())? {
        nchw(a.op, &ins[0].shape)?;
        return deconv::deconv_infer(&d, ins);
    }
    let scale = up_check(a)?;
    let sum = UpParams::of(a).multi_input_mode == "sum";
    let [n, _, h, w] = nchw(a.op, &ins[0].shape)?;
    let (oh, ow) = match (h.checked_mul(scale), w.checked_mul(scale)) {
        (Some(oh), Some(ow)) if oh.checked_mul(ow).is_some_and(|s| s <= isize::MAX as usize / 64) => (oh, ow),
        _ => return Err(Error::value(format!("operator {}: scale {scale} makes the output too large", a.op))),
    };
    let mut channels = 0;
    for (k, m) in ins.iter().enumerate() {
        let [kn, c, ih, iw] = nchw(a.op, &m.shape)?;
        if kn != n || ih == 0 || iw == 0 || oh % ih != 0 || ow % iw != 0 {
            return Err(Error::value(format!(
                "operator {}: input {k} of shape {:?} does not upsample to ({n}, _, {oh}, {ow})",
                a.op, m.shape
            )));
        }
        if m.dtype != ins[0].dtype {
            return Err(Error::type_error(format!("operator {}: input {k} has another dtype than input 0", a.op)));
        }
        if sum && k > 0 && channels != c {
            return Err(Error::value(format!(
                "operator {}: with multi_input_mode=sum every input needs {channels} channels",
                a.op
            )));
        }
        channels = if sum { c } else { channels + c };
    }
    Ok(vec![Meta::new(vec![n, channels, oh, ow], ins[0].dtype)])
}

/// Each input's nearest-neighbour map to the output size.
fn up_taps(ih: usize, iw: usize, oh: usize, ow: usize) -> Taps {
    let (fy, fx) = (oh / ih, ow / iw);
    (0..oh * ow).map(|k| [((k / ow / fy) * iw + (k % ow) / fx, 1.0), (0, 0.0), (0, 0.0), (0, 0.0)]).collect()
}

fn up_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    if let Some(d) = up_bilinear(a, ins.len())? {
        return deconv::deconvolution(&cx.with_attrs(&d), ins, outs);
    }
    up_check(a)?;
    let sum = UpParams::of(a).multi_input_mode == "sum";
    let [n, oc, oh, ow] = nchw(a.op, &outs[0].shape)?;
    let osz = oh * ow;
    let dtype = outs[0].dtype;
    if outs[0].size() == 0 {
        return Ok(());
    }
    dispatch_real!(dtype, a.op, T, R => {
        let out = outs[0].as_mut::<T>();
        let mut at = 0;
        for (k, x) in ins.iter().enumerate() {
            let [_, c, ih, iw] = nchw(a.op, &x.shape)?;
            let (taps, isz, xs) = (up_taps(ih, iw, oh, ow), ih * iw, x.as_slice::<T>());
            // This input's planes go to output channels at.. (concat) or 0.. (sum).
            for img in 0..n {
                for ch in 0..c {
                    let src = &xs[(img * c + ch) * isz..][..isz];
                    let dst = &mut out[(img * oc + at + ch) * osz..][..osz];
                    for (d, t) in dst.iter_mut().zip(&taps) {
                        let v = R::load(src[t[0].0]);
                        *d = if sum && k > 0 { (R::load(*d) + v).store() } else { v.store() };
                    }
                }
            }
            if !sum {
                at += c;
            }
        }
    });
    Ok(())
}

/// `(dY, inputs...) -> (dInput per input)`: each input pixel sums the gradient of the output
/// pixels copied from it.
fn up_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    if let Some(d) = up_bilinear(a, ins.len() - 1)? {
        return deconv::deconvolution_backward(&cx.with_attrs(&d), ins, outs);
    }
    let sum = UpParams::of(a).multi_input_mode == "sum";
    let [n, oc, oh, ow] = nchw(a.op, &ins[0].shape)?;
    let osz = oh * ow;
    if ins[0].size() == 0 {
        for (o, r) in outs.iter_mut().zip(cx.req) {
            if *r != Req::Null {
                super::init::fill(o, 0.0);
            }
        }
        return Ok(());
    }
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let g = ins[0].as_slice::<T>();
        let mut at = 0;
        for (k, (x, dx)) in ins[1..].iter().zip(outs.iter_mut()).enumerate() {
            let [_, c, ih, iw] = nchw(a.op, &x.shape)?;
            if cx.req[k] != Req::Null {
                let (taps, isz) = (up_taps(ih, iw, oh, ow), ih * iw);
                let d = dx.as_mut::<T>();
                for img in 0..n {
                    for ch in 0..c {
                        let src = &g[(img * oc + at + ch) * osz..][..osz];
                        let mut acc = vec![R::of(0.0); isz];
                        for (gv, t) in src.iter().zip(&taps) {
                            acc[t[0].0] += R::load(*gv);
                        }
                        for (o, v) in d[(img * c + ch) * isz..][..isz].iter_mut().zip(acc) {
                            *o = v.store();
                        }
                    }
                }
            }
            if !sum {
                at += c;
            }
        }
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "_contrib_AdaptiveAvgPooling2D",
            Inputs::Fixed(&["data"]),
            Box::new(adaptive_infer),
            Box::new(adaptive_forward),
        )
        .params(ADAPTIVE_PARAMS)
        .grad(Grad::Backward { op: "_backward_contrib_AdaptiveAvgPooling2D", inputs: true, outputs: false })
        .doc("Applies a 2D adaptive average pooling over a 4D input with the shape of (NCHW)."),
    );
    ops.push(OpDef::backward("_backward_contrib_AdaptiveAvgPooling2D", ADAPTIVE_PARAMS, Box::new(adaptive_backward)));
    ops.push(
        OpDef::new(
            "_contrib_BilinearResize2D",
            Inputs::Leading(&["data", "like"], bilinear_inputs),
            Box::new(bilinear_infer),
            Box::new(bilinear_forward),
        )
        .params(BILINEAR_PARAMS)
        .grad(Grad::Backward { op: "_backward_contrib_BilinearResize2D", inputs: true, outputs: false })
        .doc("Perform 2D resizing (upsampling or downsampling) for 4D input using bilinear interpolation."),
    );
    ops.push(OpDef::backward("_backward_contrib_BilinearResize2D", BILINEAR_PARAMS, Box::new(bilinear_backward)));
    ops.push(
        OpDef::new("UpSampling", Inputs::Variadic("data"), Box::new(up_infer), Box::new(up_forward))
            .params(UP_PARAMS)
            .num_args_key("num_args")
            .param_shapes(up_param_shapes)
            .grad(Grad::Backward { op: "_backward_UpSampling", inputs: true, outputs: false })
            .doc("Upsamples the given input data: nearest neighbour, or bilinear (a deconvolution by a given weight)."),
    );
    ops.push(OpDef::backward("_backward_UpSampling", UP_PARAMS, Box::new(up_backward)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_bins_cover_the_input() {
        // 5 inputs into 3 bins: [0, 2), [1, 4), [3, 5) as stock's floor/ceil rule gives.
        assert_eq!((0..3).map(|o| bin(o, 3, 5)).collect::<Vec<_>>(), [(0, 2), (1, 4), (3, 5)]);
        assert_eq!(bin(0, 1, 7), (0, 7));
    }

    #[test]
    fn bilinear_taps_interpolate_and_keep_corners() {
        // align_corners: the output's corners are the input's corners.
        let t = axis_taps(3, 5, true);
        assert_eq!((t[0].0, t[0].2), (0, 0.0));
        assert_eq!((t[4].0, t[4].1, t[4].2), (2, 0, 0.0));
        assert_eq!((t[1].0, t[1].2), (0, 0.5));
        // Without: source positions are scale·(o + 0.5) − 0.5, clamped at 0.
        let t = axis_taps(2, 4, false);
        assert_eq!((t[0].0, t[0].2), (0, 0.0));
        assert_eq!((t[1].0, t[1].2), (0, 0.25));
    }
}
