//! Image operators of `gluon.data.vision.transforms` (stock's `src/operator/image/`):
//! `_image_to_tensor` (`ToTensor`), `_image_normalize` (`Normalize`) with its backward, and
//! the flips, fixed and random (`RandomFlipLeftRight`, `RandomFlipTopBottom`).
//!
//! Stock's flips swap mirrored pairs only, so for an odd width (height) the middle column
//! (row) of a new output is left unwritten; here every element is written.

use crate::dispatch_all;
use crate::error::{Error, Result};
use crate::ndarray::DType;
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
}
