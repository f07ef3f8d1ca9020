//! Image operators of `gluon.data.vision.transforms` (stock's `src/operator/image/`):
//! `_image_to_tensor` (`ToTensor`), `_image_normalize` (`Normalize`) with its backward, the
//! flips, fixed and random (`RandomFlipLeftRight`, `RandomFlipTopBottom`), `_image_crop`
//! (`CropResize`) with its backward, and `_image_resize` (`Resize`) and `_cvimresize`
//! (`mx.image.imresize`, so `CenterCrop`) with OpenCV's five interpolations.
//!
//! Resizing is [`imgproc::resize`]'s (OpenCV's nearest, bilinear, bicubic, area and Lanczos-4
//! interpolation).
//!
//! Stock's flips swap mirrored pairs only, so for an odd width (height) the middle column
//! (row) of a new output is left unwritten; here every element is written.

use crate::dispatch_all;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::imgproc;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Resource};

/// (batch, channels, pixels per channel) of a CHW or NCHW tensor.
fn nchw(shape: &[usize]) -> (usize, usize, usize) {
    match *shape {
        [c, h, w] => (1, c, h * w),
        [n, c, h, w] => (n, c, h * w),
        _ => (0, 0, 0),
    }
}

fn to_tensor_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    let shape = match *s.as_slice() {
        [h, w, c] => vec![c, h, w],
        [n, h, w, c] => vec![n, c, h, w],
        _ => {
            return Err(Error::value(format!(
            "{}: input image must have shape (height, width, channels), or (N, height, width, channels) but got {s:?}",
            a.op
        )))
        }
    };
    if ins[0].dtype == DType::Bool {
        return Err(Error::type_error(format!("{} does not support bool images", a.op)));
    }
    Ok(vec![Meta::new(shape, DType::F32)])
}

/// HWC (or NHWC) in [0, 255] to CHW (NCHW) float32 in [0, 1], as stock divides: in float32,
/// or in float64 for float64 images.
fn to_tensor(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (_, c, len) = nchw(&outs[0].shape);
    let out = outs[0].as_mut::<f32>();
    dispatch_all!(ins[0].dtype, T => {
        let x = ins[0].as_slice::<T>();
        let per_image = c * len;
        par_for_mut(out, 1, Cost(1.0), DType::F32, |r, o| {
            for (k, v) in r.clone().zip(o.iter_mut()) {
                let (img, rest) = (k / per_image.max(1), k % per_image.max(1));
                let (ch, i) = (rest / len.max(1), rest % len.max(1));
                let src = x[img * per_image + i * c + ch];
                *v = if T::DTYPE == DType::F64 { (src.to_f64() / 255.0) as f32 } else { src.to_f32() / 255.0 };
            }
        });
    });
    Ok(())
}

op_params! {
    /// `_image_normalize`'s parameters.
    struct NormalizeParams<'a> => NORMALIZE_PARAMS {
        mean: &'a [f64] = "[0,0,0,0]", "Sequence of means for each channel. Default value is 0.";
        std: &'a [f64] = "[1,1,1,1]", "Sequence of standard deviations for each channel. Default value is 1.";
    }
}

/// The per-channel means and standard deviations (one value: every channel), as float32.
fn mean_std(a: &Attrs, channels: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let p = NormalizeParams::of(a);
    let per_channel = |v: &[f64], what: &str| -> Result<Vec<f32>> {
        match v.len() {
            1 => Ok(vec![v[0] as f32; channels]),
            n if n == channels => Ok(v.iter().map(|&x| x as f32).collect()),
            n => Err(Error::value(format!("{}: {what} must have either 1 or {channels} elements, but got {n}", a.op))),
        }
    };
    Ok((per_channel(p.mean, "mean")?, per_channel(p.std, "std")?))
}

fn normalize_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    let c = match *s.as_slice() {
        [c, _, _] | [_, c, _, _] => c,
        _ => {
            return Err(Error::value(format!(
                "{}: input tensor must have shape (channels, height, width), or (N, channels, height, width), but got {s:?}",
                a.op
            )))
        }
    };
    if c != 1 && c != 3 {
        return Err(Error::value(format!(
            "{}: the channel dimension must have 1 or 3 elements, but got input with shape {s:?}",
            a.op
        )));
    }
    mean_std(a, c)?;
    if !matches!(ins[0].dtype, DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::type_error(format!(
            "{} supports float32, float64 and float16, not {}",
            a.op,
            ins[0].dtype.name()
        )));
    }
    Ok(vec![ins[0].clone()])
}

/// `(x - mean[c]) / std[c]`: in float32 for float32 and float16 data, in float64 for
/// float64 (stock's mixed arithmetic).
fn normalize(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (_, c, len) = nchw(&ins[0].shape);
    let (mean, std) = mean_std(cx.attrs, c)?;
    per_channel(&ins[0], &mut outs[0], c, len, |x, ch| {
        if ins[0].dtype == DType::F64 {
            (x - mean[ch] as f64) / std[ch] as f64
        } else {
            ((x as f32 - mean[ch]) / std[ch]) as f64
        }
    })
}

/// `_backward_image_normalize`: `dy * (1.0 / std[c])`, the reciprocal in float64 as stock's.
fn normalize_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == crate::op::Req::Null {
        return Ok(());
    }
    let (_, c, len) = nchw(&ins[0].shape);
    let (_, std) = mean_std(cx.attrs, c)?;
    per_channel(&ins[0], &mut outs[0], c, len, |g, ch| g * (1.0 / std[ch] as f64))
}

/// `out[i] = f(x[i], channel of i)` over a CHW/NCHW tensor of a float type.
fn per_channel(x: &TBlob, out: &mut OutBlob, c: usize, len: usize, f: impl Fn(f64, usize) -> f64 + Sync) -> Result<()> {
    crate::dispatch_float!(x.dtype, "_image_normalize", T => {
        let xs = x.as_slice::<T>();
        par_for_mut(out.as_mut::<T>(), 1, Cost(1.0), T::DTYPE, |r, o| {
            for (k, v) in r.clone().zip(o.iter_mut()) {
                let ch = (k / len.max(1)) % c.max(1);
                *v = T::from_f64(f(xs[k].to_f64(), ch));
            }
        });
    });
    Ok(())
}

fn image_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    if s.len() != 3 {
        return Err(Error::value(format!(
            "{}: input image must have shape (height, width, channels), but got {s:?}",
            a.op
        )));
    }
    if s[2] != 1 && s[2] != 3 {
        return Err(Error::value(format!(
            "{}: the last dimension of input image must be the channel dimension with either 1 or 3 elements, but got input with shape {s:?}",
            a.op
        )));
    }
    Ok(vec![ins[0].clone()])
}

/// An HWC image mirrored along `axis` (0: top-bottom, 1: left-right), or copied when `flip`
/// is false.
fn flip(ins: &[TBlob], outs: &mut [OutBlob], axis: usize, flip: bool) -> Result<()> {
    let s = &ins[0].shape;
    let (h, w, c) = (s[0], s[1], s[2]);
    dispatch_all!(ins[0].dtype, T => {
        let x = ins[0].as_slice::<T>();
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost(0.1), T::DTYPE, |r, o| {
            for (k, v) in r.clone().zip(o.iter_mut()) {
                let (i, j, ch) = (k / (w * c), (k / c) % w, k % c);
                let (si, sj) = match (flip, axis) {
                    (false, _) => (i, j),
                    (true, 0) => (h - 1 - i, j),
                    (true, _) => (i, w - 1 - j),
                };
                *v = x[(si * w + sj) * c + ch];
            }
        });
    });
    Ok(())
}

/// Whether a random flip flips: with probability 1/2 (stock: `std::bernoulli_distribution()`
/// true keeps the image).
fn coin(cx: &OpCtx) -> Result<bool> {
    let rng = cx.rng.ok_or_else(|| Error::internal(format!("{} ran without its random stream", cx.attrs.op)))?;
    Ok(rng.uniform(0) >= 0.5)
}

op_params! {
    /// `_image_crop`'s parameters.
    struct CropParams<'a> => CROP_PARAMS {
        x: i64 = required, "Left boundary of the cropping area.";
        y: i64 = required, "Top boundary of the cropping area.";
        width: i64 = required, "Width of the cropping area.";
        height: i64 = required, "Height of the cropping area.";
    }
}

/// (batch, height, width, channels) of an HWC or NHWC image; `None` for other ranks.
fn nhwc(shape: &[usize]) -> Option<(usize, usize, usize, usize)> {
    match *shape {
        [h, w, c] => Some((1, h, w, c)),
        [n, h, w, c] => Some((n, h, w, c)),
        _ => None,
    }
}

fn crop_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    let Some((_, h, w, c)) = nhwc(s) else {
        return Err(Error::value(format!(
            "{}: Image Crop expects inputs of 3D (h, w, c) or 4D (n, h, w, c). But got {s:?}",
            a.op
        )));
    };
    if c != 1 && c != 3 {
        return Err(Error::value(format!("{}: Expect channel of the input image is 1 or 3, but got {c}", a.op)));
    }
    let p = CropParams::of(a);
    if p.height <= 0 || p.width <= 0 {
        return Err(Error::value(format!("{}: Input height and width must be greater than 0", a.op)));
    }
    if p.x < 0 || p.y < 0 {
        return Err(Error::value(format!("{}: x and y must not be negative, got ({}, {})", a.op, p.x, p.y)));
    }
    if p.x + p.width > w as i64 {
        return Err(Error::value(format!("{}: x + width should not be greater than input width", a.op)));
    }
    if p.y + p.height > h as i64 {
        return Err(Error::value(format!("{}: y + height should not be greater than input height", a.op)));
    }
    let mut shape = s.clone();
    let k = shape.len();
    (shape[k - 3], shape[k - 2]) = (p.height as usize, p.width as usize);
    Ok(vec![Meta::new(shape, ins[0].dtype)])
}

/// The rows of the crop window: (offset in the full image, offset in the crop, length).
fn crop_rows(full_shape: &[usize], p: &CropParams) -> Vec<(usize, usize, usize)> {
    let (n, h, w, c) = nhwc(full_shape).unwrap_or((0, 0, 0, 0));
    let (ch, row) = (p.height as usize, p.width as usize * c);
    let (x, y) = (p.x as usize, p.y as usize);
    (0..n * ch).map(|k| (((k / ch * h + y + k % ch) * w + x) * c, k * row, row)).collect()
}

fn crop(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let rows = crop_rows(&ins[0].shape, &CropParams::of(cx.attrs));
    dispatch_all!(ins[0].dtype, T => {
        let (x, out) = (ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
        for &(src, dst, len) in &rows {
            out[dst..dst + len].copy_from_slice(&x[src..src + len]);
        }
    });
    Ok(())
}

/// `_backward_image_crop`: the output gradient in the window, zeros elsewhere.
fn crop_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == crate::op::Req::Null {
        return Ok(());
    }
    let rows = crop_rows(&outs[0].shape, &CropParams::of(cx.attrs));
    dispatch_all!(ins[0].dtype, T => {
        let (g, out) = (ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
        out.fill(T::from_f64(0.0));
        for &(full, window, len) in &rows {
            out[full..full + len].copy_from_slice(&g[window..window + len]);
        }
    });
    Ok(())
}

op_params! {
    /// `_image_resize`'s parameters.
    struct ResizeParams<'a> => RESIZE_PARAMS {
        size: &'a [i64] = "[]", "Size of new image. Could be (width, height) or (size)";
        keep_ratio: bool = "False", "Whether to resize the short edge or both edges to `size`, if size is give as an integer.";
        interp: i64 = "1", "Interpolation method for resizing. By default uses bilinear interpolationOptions are INTER_NEAREST - a nearest-neighbor interpolationINTER_LINEAR - a bilinear interpolationINTER_AREA - resampling using pixel area relationINTER_CUBIC - a bicubic interpolation over 4x4 pixel neighborhoodINTER_LANCZOS4 - a Lanczos interpolation over 8x8 pixel neighborhoodNote that the GPU version only support bilinear interpolation(1)";
    }
}

op_params! {
    /// `_cvimresize`'s parameters.
    struct CvResizeParams<'a> => CV_RESIZE_PARAMS {
        w: i64 = required, "Width of resized image.";
        h: i64 = required, "Height of resized image.";
        interp: i64 = "1", "Interpolation method (default=cv2.INTER_LINEAR).";
    }
}

/// The (height, width) `_image_resize` makes of an `h × w` image (stock's rules).
fn resize_target(a: &Attrs, h: usize, w: usize) -> Result<(usize, usize, i64)> {
    if a.declares(CV_RESIZE_PARAMS) {
        let p = CvResizeParams::of(a);
        if p.w <= 0 || p.h <= 0 {
            return Err(Error::value(format!("{}: w and h must be positive, got ({}, {})", a.op, p.w, p.h)));
        }
        return Ok((p.h as usize, p.w as usize, p.interp));
    }
    let p = ResizeParams::of(a);
    let (rh, rw) = match *p.size {
        [s] if s > 0 => {
            let s = s as usize;
            match (p.keep_ratio, h > w) {
                (false, _) => (s, s),
                (true, true) => (h * s / w.max(1), s),
                (true, false) => (s, w * s / h.max(1)),
            }
        }
        [w2, h2] if w2 > 0 && h2 > 0 => (h2 as usize, w2 as usize),
        [_] | [_, _] => {
            return Err(Error::value(format!("{}: Input size should be greater than 0, but got {:?}", a.op, p.size)))
        }
        _ => {
            return Err(Error::value(format!(
                "{}: Input size dimension must be 1 or 2, but got {}",
                a.op,
                p.size.len()
            )))
        }
    };
    Ok((rh, rw, p.interp))
}

fn resize_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    let cv = a.declares(CV_RESIZE_PARAMS);
    let Some((_, h, w, _)) = nhwc(s).filter(|_| !cv || s.len() == 3) else {
        return Err(Error::value(format!("{}: Input image dimension should be 3 or 4 but got {}", a.op, s.len())));
    };
    if h == 0 || w == 0 {
        return Err(Error::value(format!("{}: cannot resize an empty image of shape {s:?}", a.op)));
    }
    let (rh, rw, interp) = resize_target(a, h, w)?;
    if !imgproc::resize_supported(interp) {
        return Err(Error::mxnet(format!("{}: unknown interpolation method {interp} (OpenCV's are 0 to 4)", a.op)));
    }
    if !matches!(ins[0].dtype, DType::U8 | DType::F32 | DType::F64) {
        return Err(Error::type_error(format!(
            "{}: resizing {} images is not supported (uint8, float32, float64)",
            a.op,
            ins[0].dtype.name()
        )));
    }
    let mut shape = s.clone();
    let k = shape.len();
    (shape[k - 3], shape[k - 2]) = (rh, rw);
    Ok(vec![Meta::new(shape, ins[0].dtype)])
}

fn resize(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (_, h, w, c) = nhwc(&ins[0].shape).ok_or_else(|| Error::internal("resize of a checked shape"))?;
    let (_, rh, rw, _) = nhwc(&outs[0].shape).ok_or_else(|| Error::internal("resize of a checked shape"))?;
    let (_, _, interp) = resize_target(cx.attrs, h, w)?;
    match ins[0].dtype {
        DType::U8 => imgproc::resize::<u8>(ins[0].as_slice(), outs[0].as_mut(), (h, w, c), (rh, rw), interp),
        DType::F32 => imgproc::resize::<f32>(ins[0].as_slice(), outs[0].as_mut(), (h, w, c), (rh, rw), interp),
        _ => imgproc::resize::<f64>(ins[0].as_slice(), outs[0].as_mut(), (h, w, c), (rh, rw), interp),
    }
}

op_params! {
    /// The random enhancements' parameters (`_image_random_brightness`, ...).
    struct EnhanceParams<'a> => ENHANCE_PARAMS {
        min_factor: f64 = required, "Minimum factor.";
        max_factor: f64 = required, "Maximum factor.";
    }
}

op_params! {
    /// `_image_random_color_jitter`'s parameters.
    struct JitterParams<'a> => JITTER_PARAMS {
        brightness: f64 = required, "How much to jitter brightness.";
        contrast: f64 = required, "How much to jitter contrast.";
        saturation: f64 = required, "How much to jitter saturation.";
        hue: f64 = required, "How much to jitter hue.";
    }
}

op_params! {
    /// `_image_adjust_lighting`'s parameters.
    struct LightingParams<'a> => LIGHTING_PARAMS {
        alpha: &'a [f64] = required, "The lighting alphas for the R, G, B channels.";
    }
}

op_params! {
    /// `_image_random_lighting`'s parameters.
    struct RandomLightingParams<'a> => RANDOM_LIGHTING_PARAMS {
        alpha_std: f64 = "0.05", "Level of the lighting noise.";
    }
}

/// A float32 result stored as `T`, as stock's image operators do: clamped to the type's
/// range and truncated for integer types (stock clamps only `uint8`; others overflow there),
/// as it is for floats.
fn saturate<T: Elem>(v: f32) -> T {
    let (lo, hi) = match T::DTYPE {
        DType::U8 | DType::Bool => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        _ => return T::from_f64(v as f64),
    };
    T::from_f64((v as f64).clamp(lo, hi).trunc())
}

/// One enhancement of an HWC image (float32 arithmetic, as stock).
#[derive(Clone, Copy)]
enum Enhance {
    Brightness(f32),
    Contrast(f32),
    Saturation(f32),
    /// A hue rotation, in turns.
    Hue(f32),
    /// The per-channel offsets of AlexNet's PCA lighting noise.
    Lighting([f32; 3]),
}

const GRAY: [f32; 3] = [0.299, 0.587, 0.114];

/// The float32 pixels of `x` (HWC) after `e`.
fn enhance(px: &mut [f32], channels: usize, e: Enhance) {
    match e {
        Enhance::Brightness(a) => px.iter_mut().for_each(|v| *v *= a),
        Enhance::Contrast(a) => {
            let n = (px.len() / channels.max(1)) as f32;
            // Summed product by product, in stock's order.
            let sum: f32 = if channels == 3 {
                px.chunks(3).fold(0.0, |acc, p| acc + p[0] * GRAY[0] + p[1] * GRAY[1] + p[2] * GRAY[2])
            } else {
                px.iter().sum()
            };
            let beta = (1.0 - a) * (sum / n);
            px.iter_mut().for_each(|v| *v = *v * a + beta);
        }
        Enhance::Saturation(a) if channels == 3 => {
            for p in px.chunks_mut(3) {
                let gray = (p[0] * GRAY[0] + p[1] * GRAY[1] + p[2] * GRAY[2]) * (1.0 - a);
                p.iter_mut().for_each(|v| *v = gray + *v * a);
            }
        }
        Enhance::Hue(a) if channels == 3 => {
            for p in px.chunks_mut(3) {
                let (h, l, s) = rgb_to_hls(p[0], p[1], p[2]);
                let (r, g, b) = hls_to_rgb(h + a * 360.0, l, s);
                (p[0], p[1], p[2]) = (r, g, b);
            }
        }
        Enhance::Lighting(off) if channels == 3 => {
            for p in px.chunks_mut(3) {
                (0..3).for_each(|c| p[c] += off[c]);
            }
        }
        // One channel: saturation, hue and lighting leave the image as it is.
        _ => {}
    }
}

/// OpenCV's RGB to HLS of 0..255 values: hue in degrees, lightness and saturation in 0..1.
fn rgb_to_hls(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let (r, g, b) = (r / 255.0, g / 255.0, b / 255.0);
    let (vmax, vmin) = (r.max(g).max(b), r.min(g).min(b));
    let mut diff = vmax - vmin;
    let l = (vmax + vmin) * 0.5;
    let (mut h, mut s) = (0.0, 0.0);
    if diff > f32::EPSILON {
        s = if l < 0.5 { diff / (vmax + vmin) } else { diff / (2.0 - vmax - vmin) };
        diff = 60.0 / diff;
        h = if vmax == r {
            (g - b) * diff
        } else if vmax == g {
            (b - r) * diff + 120.0
        } else {
            (r - g) * diff + 240.0
        };
        if h < 0.0 {
            h += 360.0;
        }
    }
    (h, l, s)
}

/// OpenCV's HLS to RGB, back to 0..255 values.
fn hls_to_rgb(mut h: f32, l: f32, s: f32) -> (f32, f32, f32) {
    const SECTORS: [[usize; 3]; 6] = [[1, 3, 0], [1, 0, 2], [3, 0, 1], [0, 2, 1], [0, 1, 3], [2, 1, 0]];
    let (mut r, mut g, mut b) = (l, l, l);
    if s != 0.0 {
        let p2 = if l <= 0.5 { l * (1.0 + s) } else { l + s - l * s };
        let p1 = 2.0 * l - p2;
        h *= 1.0 / 60.0;
        while h < 0.0 {
            h += 6.0;
        }
        while h >= 6.0 {
            h -= 6.0;
        }
        let sector = (h as usize).min(5);
        h -= sector as f32;
        let tab = [p2, p1, p1 + (p2 - p1) * (1.0 - h), p1 + (p2 - p1) * h];
        let [bi, gi, ri] = SECTORS[sector];
        (b, g, r) = (tab[bi], tab[gi], tab[ri]);
    }
    (r * 255.0, g * 255.0, b * 255.0)
}

/// AlexNet's PCA lighting offsets for the R, G, B channels, from the three alphas.
fn lighting_offsets(alpha: [f32; 3]) -> [f32; 3] {
    const EIG: [[f64; 3]; 3] = [
        [55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
        [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
        [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203],
    ];
    let row = |k: usize| (0..3).map(|j| EIG[k][j] as f32 * alpha[j]).fold(0.0f32, |acc, v| acc + v);
    [row(0), row(1), row(2)]
}

/// Which colour operator.
#[derive(Clone, Copy, PartialEq)]
enum Color {
    Brightness,
    Contrast,
    Saturation,
    Hue,
    Jitter,
    Lighting,
    RandomLighting,
}

/// The enhancements one call applies, in order, drawn from its random stream.
fn enhancements(cx: &OpCtx, kind: Color) -> Result<Vec<Enhance>> {
    let a = cx.attrs;
    let rng = || cx.rng.ok_or_else(|| Error::internal(format!("{} ran without its random stream", a.op)));
    let between = |k: u64, lo: f64, hi: f64| -> Result<f32> { Ok((lo + (hi - lo) * rng()?.uniform(k)) as f32) };
    Ok(match kind {
        Color::Lighting => {
            let p = LightingParams::of(a);
            if p.alpha.len() != 3 {
                return Err(Error::value(format!(
                    "{}: alpha must have 3 values (R, G, B), got {}",
                    a.op,
                    p.alpha.len()
                )));
            }
            vec![Enhance::Lighting(lighting_offsets([p.alpha[0] as f32, p.alpha[1] as f32, p.alpha[2] as f32]))]
        }
        Color::RandomLighting => {
            let sd = RandomLightingParams::of(a).alpha_std as f32;
            let r = rng()?;
            vec![Enhance::Lighting(lighting_offsets([0, 1, 2].map(|k| r.normal(k) as f32 * sd)))]
        }
        Color::Jitter => {
            let p = JitterParams::of(a);
            // A random order of the four (Fisher-Yates on draws 0-2), then one factor each.
            let mut order = [0usize, 1, 2, 3];
            for i in (1..4).rev() {
                let j = rng()?.int_in(i as u64 - 1, 0, i as i64 + 1) as usize;
                order.swap(i, j);
            }
            let mut out = Vec::new();
            for (k, which) in order.into_iter().enumerate() {
                let draw = 3 + k as u64;
                match which {
                    0 if p.brightness > 0.0 => {
                        out.push(Enhance::Brightness(1.0 + between(draw, -p.brightness, p.brightness)?))
                    }
                    1 if p.contrast > 0.0 => out.push(Enhance::Contrast(1.0 + between(draw, -p.contrast, p.contrast)?)),
                    2 if p.saturation > 0.0 => {
                        out.push(Enhance::Saturation(1.0 + between(draw, -p.saturation, p.saturation)?))
                    }
                    3 if p.hue > 0.0 => out.push(Enhance::Hue(between(draw, -p.hue, p.hue)?)),
                    _ => {}
                }
            }
            out
        }
        _ => {
            let p = EnhanceParams::of(a);
            if p.min_factor < 0.0 || p.max_factor < 0.0 {
                return Err(Error::value(format!("{}: min_factor and max_factor must not be negative", a.op)));
            }
            let f = between(0, p.min_factor, p.max_factor)?;
            vec![match kind {
                Color::Brightness => Enhance::Brightness(f),
                Color::Contrast => Enhance::Contrast(f),
                Color::Saturation => Enhance::Saturation(f),
                _ => Enhance::Hue(f),
            }]
        }
    })
}

/// The colour operators: the image's pixels in float32 through the call's enhancements, then
/// stored as the image's type (rounded and clamped for integer types).
fn color(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], kind: Color) -> Result<()> {
    let steps = enhancements(cx, kind)?;
    let c = ins[0].shape[2];
    dispatch_all!(ins[0].dtype, T => {
        let mut px: Vec<f32> = ins[0].as_slice::<T>().iter().map(|v| v.to_f32()).collect();
        for e in steps {
            // Stock rounds to the image's type between the steps of a jitter.
            enhance(&mut px, c, e);
            px.iter_mut().for_each(|v| *v = saturate::<T>(*v).to_f32());
        }
        outs[0].as_mut::<T>().iter_mut().zip(&px).for_each(|(o, &v)| *o = saturate::<T>(v));
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_image_to_tensor", Inputs::Fixed(&["data"]), Box::new(to_tensor_infer), Box::new(to_tensor))
            .alias(&["_npx__image_to_tensor"])
            .doc("Converts an image NDArray of shape (H x W x C) or (N x H x W x C) with values in the range [0, 255] to a tensor NDArray of shape (C x H x W) or (N x C x H x W) with values in the range [0, 1]"),
    );
    ops.push(
        OpDef::new("_image_normalize", Inputs::Fixed(&["data"]), Box::new(normalize_infer), Box::new(normalize))
            .alias(&["_npx__image_normalize"])
            .params(NORMALIZE_PARAMS)
            .grad(Grad::Backward { op: "_backward_image_normalize", inputs: true, outputs: false })
            .doc("Normalize an tensor of shape (C x H x W) or (N x C x H x W) with mean and standard deviation: output[i] = (input[i] - mean[i]) / std[i] per channel."),
    );
    ops.push(OpDef::backward("_backward_image_normalize", NORMALIZE_PARAMS, Box::new(normalize_backward)));
    ops.push(
        OpDef::new("_image_crop", Inputs::Fixed(&["data"]), Box::new(crop_infer), Box::new(crop))
            .alias(&["_npx__image_crop"])
            .params(CROP_PARAMS)
            .grad(Grad::Backward { op: "_backward_image_crop", inputs: false, outputs: false })
            .doc("Crop an image NDArray of shape (H x W x C) or (N x H x W x C) to the given size."),
    );
    ops.push(OpDef::backward("_backward_image_crop", CROP_PARAMS, Box::new(crop_backward)));
    ops.push(
        OpDef::new("_image_resize", Inputs::Fixed(&["data"]), Box::new(resize_infer), Box::new(resize))
            .alias(&["_npx__image_resize"])
            .params(RESIZE_PARAMS)
            .doc("Resize an image NDArray of shape (H x W x C) or (N x H x W x C) to the given size"),
    );
    ops.push(
        OpDef::new("_cvimresize", Inputs::Fixed(&["src"]), Box::new(resize_infer), Box::new(resize))
            .alias(&["_npi_cvimresize"])
            .params(CV_RESIZE_PARAMS)
            .doc("Resize image with OpenCV. \n"),
    );
    // (name, kind, parameters, doc)
    let colors: [(&'static str, Color, &'static [crate::op::param::ParamSpec], &'static str); 7] = [
        (
            "_image_random_brightness",
            Color::Brightness,
            ENHANCE_PARAMS,
            "Randomly scales the brightness of an HWC image by a factor in [min_factor, max_factor].",
        ),
        (
            "_image_random_contrast",
            Color::Contrast,
            ENHANCE_PARAMS,
            "Randomly blends an HWC image with its mean gray by a factor in [min_factor, max_factor].",
        ),
        (
            "_image_random_saturation",
            Color::Saturation,
            ENHANCE_PARAMS,
            "Randomly blends an HWC image with its gray version by a factor in [min_factor, max_factor].",
        ),
        (
            "_image_random_hue",
            Color::Hue,
            ENHANCE_PARAMS,
            "Randomly rotates the hue of an HWC image by a fraction of a turn in [min_factor, max_factor].",
        ),
        (
            "_image_random_color_jitter",
            Color::Jitter,
            JITTER_PARAMS,
            "Randomly jitters brightness, contrast, saturation and hue of an HWC image, in a random order.",
        ),
        (
            "_image_adjust_lighting",
            Color::Lighting,
            LIGHTING_PARAMS,
            "Adjust the lighting level of the input. Follow the AlexNet style.",
        ),
        (
            "_image_random_lighting",
            Color::RandomLighting,
            RANDOM_LIGHTING_PARAMS,
            "Randomly add PCA noise. Follow the AlexNet style.",
        ),
    ];
    for (name, kind, params, doc) in colors {
        let alias: &'static str = Box::leak(format!("_npx_{name}").into_boxed_str());
        let aliases: &'static [&'static str] = Box::leak(Box::new([alias]));
        let resources: &'static [Resource] = if kind == Color::Lighting { &[] } else { &[Resource::Random] };
        ops.push(
            OpDef::new(
                name,
                Inputs::Fixed(&["data"]),
                Box::new(image_infer),
                Box::new(move |cx, i, o| color(cx, i, o, kind)),
            )
            .alias(aliases)
            .params(params)
            .resources(resources)
            .doc(doc),
        );
    }
    // (name, alias, axis, random)
    let flips: [(&'static str, &'static [&'static str], usize, bool); 4] = [
        ("_image_flip_left_right", &["_npx__image_flip_left_right"], 1, false),
        ("_image_flip_top_bottom", &["_npx__image_flip_top_bottom"], 0, false),
        ("_image_random_flip_left_right", &["_npx__image_random_flip_left_right"], 1, true),
        ("_image_random_flip_top_bottom", &["_npx__image_random_flip_top_bottom"], 0, true),
    ];
    for (name, alias, axis, random) in flips {
        let kernel: crate::op::ComputeFn = if random {
            Box::new(move |cx, i, o| flip(i, o, axis, coin(cx)?))
        } else {
            Box::new(move |_, i, o| flip(i, o, axis, true))
        };
        let (resources, doc): (&'static [Resource], _) = if random {
            (&[Resource::Random], format!("{name}: an HWC image mirrored with probability 1/2."))
        } else {
            (&[], format!("{name}: an HWC image mirrored."))
        };
        ops.push(
            OpDef::new(name, Inputs::Fixed(&["data"]), Box::new(image_infer), kernel)
                .alias(alias)
                .resources(resources)
                .doc(doc),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::ndarray::testing::{array_f32, values};
    use crate::ndarray::{DType, NDArray};
    use crate::op::invoke::invoke;
    use crate::op::lookup;

    fn call(op: &str, x: &NDArray, kv: &[(&str, &str)]) -> NDArray {
        invoke(lookup(op).unwrap(), &[x], None, kv.iter().copied()).unwrap().remove(0)
    }

    #[test]
    fn to_tensor_transposes_and_scales() {
        // (H=1, W=2, C=3) -> (3, 1, 2)
        let x = array_f32(&[1, 2, 3], &[0.0, 51.0, 102.0, 153.0, 204.0, 255.0]);
        let x = call("Cast", &x, &[("dtype", "uint8")]);
        assert_eq!(x.dtype, DType::U8);
        let y = call("_image_to_tensor", &x, &[]);
        assert_eq!(y.shape, vec![3, 1, 2]);
        assert_eq!(values(&y), vec![0.0, 0.6, 0.2, 0.8, 0.4, 1.0]);
    }

    #[test]
    fn normalize_per_channel_and_flips() {
        let x = array_f32(&[3, 1, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = call("_image_normalize", &x, &[("mean", "(1, 2, 3)"), ("std", "(1, 2, 4)")]);
        assert_eq!(values(&y), vec![0.0, 1.0, 0.5, 1.0, 0.5, 0.75]);
        // An odd width: the middle column is written too.
        let img = array_f32(&[1, 3, 1], &[1.0, 2.0, 3.0]);
        assert_eq!(values(&call("_image_flip_left_right", &img, &[])), vec![3.0, 2.0, 1.0]);
        assert_eq!(values(&call("_image_flip_top_bottom", &img, &[])), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn crop_and_resize() {
        // A 2x4 one-channel image: crop its right half, then halve it (2x2 box average) and
        // upscale it (bilinear, centres aligned, clamped).
        let img = array_f32(&[2, 4, 1], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let c = call("_image_crop", &img, &[("x", "2"), ("y", "0"), ("width", "2"), ("height", "2")]);
        assert_eq!((c.shape.clone(), values(&c)), (vec![2, 2, 1], vec![2.0, 3.0, 6.0, 7.0]));
        assert_eq!(values(&call("_image_resize", &img, &[("size", "(2, 1)")])), vec![2.5, 4.5]);
        let up = call("_image_resize", &c, &[("size", "(4, 1)")]);
        assert_eq!(values(&up), vec![4.0, 4.25, 4.75, 5.0]);
        assert_eq!(
            values(&call("_image_resize", &c, &[("size", "(4, 1)"), ("interp", "0")])),
            vec![2.0, 2.0, 3.0, 3.0]
        );
        let bad = invoke(
            lookup("_image_crop").unwrap(),
            &[&img],
            None,
            [("x", "3"), ("y", "0"), ("width", "2"), ("height", "1")],
        );
        assert!(bad.err().unwrap().to_string().contains("x + width should not be greater"));
        let bad = invoke(lookup("_image_resize").unwrap(), &[&img], None, [("size", "(3, 3)"), ("interp", "7")]);
        assert!(bad.err().unwrap().to_string().contains("unknown interpolation method 7"));
    }
}
