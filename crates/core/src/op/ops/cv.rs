//! The OpenCV operators of `mx.image` (stock's `src/io/image_io.cc`): `_cvimdecode`
//! (`mx.image.imdecode`), `_cvimread` (`mx.image.imread`) and `_cvcopyMakeBorder`
//! (`mx.image.copyMakeBorder`). `_cvimresize` is with the other resizes in `image.rs`.
//!
//! Decoding makes an array whose shape only the image knows, so the two decoders run through
//! their own invocation (imperative only, as in stock) and write into `out=` when one is
//! given. Pixels come from [`imgproc`]: see there how close JPEG decoding is to stock's.

use super::common::HostResult;
use crate::context::Context;
use crate::dispatch_all;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::imgproc::{self, Channels};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Inputs, Meta, OpCtx, OpDef, OwnInvoked};

op_params! {
    /// `_cvimdecode`'s parameters.
    struct ImdecodeParams<'a> => IMDECODE_PARAMS {
        flag: i64 = "1", "Convert decoded image to grayscale (0) or color (1).";
        to_rgb: bool = "True", "Whether to convert decoded image to mxnet's default RGB format (instead of opencv's default BGR).";
    }
}

op_params! {
    /// `_cvimread`'s parameters.
    struct ImreadParams<'a> => IMREAD_PARAMS {
        filename: &'a str = required, "Name of the image file to be loaded.";
        flag: i64 = "1", "Convert decoded image to grayscale (0) or color (1).";
        to_rgb: bool = "True", "Whether to convert decoded image to mxnet's default RGB format (instead of opencv's default BGR).";
    }
}

op_params! {
    /// `_cvcopyMakeBorder`'s parameters.
    struct BorderParams<'a> => BORDER_PARAMS {
        top: i64 = required, "Top margin.";
        bot: i64 = required, "Bottom margin.";
        left: i64 = required, "Left margin.";
        right: i64 = required, "Right margin.";
        r#type: i64 = "0", "Filling type (default=cv2.BORDER_CONSTANT).";
        value: f64 = "0", "(Deprecated! Use ``values`` instead.) Fill with single value.";
        values: &'a [f64] = "[]", "Fill with value(RGB[A] or gray), up to 4 channels.";
    }
}

/// Decode `bytes` as stock's `ImdecodeImpl` does: gray (flag 0, one channel) or colour
/// (three channels, RGB unless `to_rgb` is false), as a new `(h, w, c)` uint8 array or into
/// `out`.
fn decode_into(op: &str, bytes: &[u8], flag: i64, to_rgb: bool, out: Option<&[&NDArray]>) -> Result<Vec<NDArray>> {
    if flag < 0 {
        return Err(Error::value(format!("{op}: flag must be 0 (grayscale) or 1 (color), got {flag}")));
    }
    let want = if flag == 0 { Channels::Gray } else { Channels::Bgr };
    let mut img = imgproc::decode(bytes, want)?;
    if to_rgb {
        imgproc::swap_red_blue(&mut img.data, img.c);
    }
    let made = HostResult { shape: vec![img.h, img.w, img.c], dtype: DType::U8, bytes: img.data };
    Ok(vec![made.deliver(op, "the image decodes to shape", Context::CPU, out)?])
}

fn invoke_imdecode(_: &'static OpDef, inputs: &[&NDArray], out: Option<&[&NDArray]>, a: Attrs) -> Result<OwnInvoked> {
    let p = ImdecodeParams::of(&a);
    let &[buf] = inputs else {
        return Err(Error::value(format!("_cvimdecode takes one array (buf), got {}", inputs.len())));
    };
    if buf.ctx().is_some_and(|c| !c.dev_type.is_host()) {
        return Err(Error::value("_cvimdecode: Only supports cpu input"));
    }
    if buf.dtype != DType::U8 {
        return Err(Error::type_error(format!(
            "_cvimdecode: Input needs to be uint8 buffer, got {}",
            buf.dtype.name()
        )));
    }
    if buf.size() == 0 {
        return Err(Error::value("_cvimdecode: Input cannot be an empty buffer"));
    }
    let bytes = buf.to_host_bytes()?;
    Ok((decode_into("_cvimdecode", &bytes, p.flag, p.to_rgb, out)?, None))
}

fn invoke_imread(_: &'static OpDef, inputs: &[&NDArray], out: Option<&[&NDArray]>, a: Attrs) -> Result<OwnInvoked> {
    let p = ImreadParams::of(&a);
    if !inputs.is_empty() {
        return Err(Error::value(format!("_cvimread takes no arrays, got {}", inputs.len())));
    }
    let bytes = std::fs::read(p.filename)
        .map_err(|e| Error::mxnet(format!("Imread: '{}' couldn't open file: {e}", p.filename)))?;
    Ok((decode_into("_cvimread", &bytes, p.flag, p.to_rgb, out)?, None))
}

fn margins(a: &Attrs) -> Result<(usize, usize, usize, usize)> {
    let p = BorderParams::of(a);
    let m = |name: &str, v: i64| {
        usize::try_from(v).map_err(|_| Error::value(format!("{}: {name} must not be negative, got {v}", a.op)))
    };
    Ok((m("top", p.top)?, m("bot", p.bot)?, m("left", p.left)?, m("right", p.right)?))
}

fn border_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let s = &ins[0].shape;
    let &[h, w, c] = s.as_slice() else {
        return Err(Error::value(format!("{}: the image must be 3-D (height, width, channels), got {s:?}", a.op)));
    };
    if !matches!(ins[0].dtype, DType::F32 | DType::F64 | DType::U8 | DType::I32) {
        return Err(Error::type_error(format!(
            "{}: {} images are not supported (float32, float64, uint8, int32 are)",
            a.op,
            ins[0].dtype.name()
        )));
    }
    if !(1..=4).contains(&c) {
        return Err(Error::value(format!("{}: images have 1 to 4 channels, got {c}", a.op)));
    }
    let (t, b, l, r) = margins(a)?;
    let kind = BorderParams::of(a).r#type;
    imgproc::border_index(-1, 1, kind)?;
    let (oh, ow) = (h.checked_add(t).and_then(|v| v.checked_add(b)), w.checked_add(l).and_then(|v| v.checked_add(r)));
    match (oh, ow) {
        (Some(oh), Some(ow)) if oh.checked_mul(ow).is_some_and(|n| n <= imgproc::MAX_PIXELS) => {
            Ok(vec![Meta::new(vec![oh, ow, c], ins[0].dtype)])
        }
        _ => Err(Error::value(format!(
            "{}: margins ({t}, {b}, {l}, {r}) make the image larger than {} pixels",
            a.op,
            imgproc::MAX_PIXELS
        ))),
    }
}

fn border(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = BorderParams::of(cx.attrs);
    let &[h, w, c] = ins[0].shape.as_slice() else { return Err(Error::internal("border of a checked shape")) };
    // OpenCV's Scalar: `value` in the first three channels (the fourth 0), or the first
    // four of `values`.
    let mut fill = [p.value, p.value, p.value, 0.0];
    if !p.values.is_empty() {
        fill = [0.0; 4];
        for (f, v) in fill.iter_mut().zip(p.values) {
            *f = *v;
        }
    }
    let margins = margins(cx.attrs)?;
    dispatch_all!(ins[0].dtype, T => {
        let fill: Vec<T> = fill.iter().map(|&v| saturate::<T>(v)).collect();
        imgproc::make_border(ins[0].as_slice::<T>(), outs[0].as_mut::<T>(), (h, w, c), margins, p.r#type, &fill)
    })
}

/// OpenCV's `saturate_cast` of a fill value: rounded (half to even) and clamped for integer
/// images.
fn saturate<T: crate::op::tensor::Elem>(v: f64) -> T {
    match T::DTYPE {
        DType::U8 => T::from_f64(v.round_ties_even().clamp(0.0, 255.0)),
        DType::I32 => T::from_f64(v.round_ties_even().clamp(i32::MIN as f64, i32::MAX as f64)),
        _ => T::from_f64(v),
    }
}

fn imperative_only(op: &'static str) -> crate::op::InferFn {
    Box::new(move |_, _| {
        Err(Error::not_supported(format!("{op} in a symbolic graph (it is imperative only, as in stock)")))
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let own: fn(&'static str) -> crate::op::ComputeFn =
        |op| Box::new(move |_, _, _| Err(Error::internal(format!("{op} runs through its own invocation"))));
    ops.push(
        OpDef::new("_cvimdecode", Inputs::Fixed(&["buf"]), imperative_only("_cvimdecode"), own("_cvimdecode"))
            .alias(&["_npi_cvimdecode"])
            .params(IMDECODE_PARAMS)
            .invoke_with(invoke_imdecode)
            .doc("Decode image with OpenCV. \nNote: return image in RGB by default, instead of OpenCV's default BGR."),
    );
    ops.push(
        OpDef::new("_cvimread", Inputs::Fixed(&[]), imperative_only("_cvimread"), own("_cvimread"))
            .alias(&["_npi_cvimread"])
            .params(IMREAD_PARAMS)
            .invoke_with(invoke_imread)
            .doc("Read and decode image with OpenCV. \nNote: return image in RGB by default, instead of OpenCV's default BGR."),
    );
    ops.push(
        OpDef::new("_cvcopyMakeBorder", Inputs::Fixed(&["src"]), Box::new(border_infer), Box::new(border))
            .params(BORDER_PARAMS)
            .doc("Pad image border with OpenCV. \n"),
    );
}
