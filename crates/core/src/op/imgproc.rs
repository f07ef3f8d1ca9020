//! OpenCV-compatible pixel routines shared by the image operators (`_cvimdecode`,
//! `_image_resize`, `_cvcopyMakeBorder`, ...) and the image iterators (`ImageRecordIter`).
//!
//! Owns: decoding JPEG (zune-jpeg) and PNG (png) into OpenCV's layout (HWC, blue-green-red
//! channel order), resizing with OpenCV's nearest and bilinear interpolation, and border
//! filling with OpenCV's five border types. Images are `(height, width, channels)` slices in
//! row-major order.
//!
//! Resizing follows `cv::resize`: pixel centres aligned (`(x + 0.5) · scale - 0.5`), edges
//! clamped; 8-bit images through OpenCV's 11-bit fixed-point weights and rounding, and an
//! exact halving through its 2×2 box average (what OpenCV does for bilinear at scale 1/2).
//! OpenCV's vectorised rows may round an 8-bit value the other way; results are within 1 of
//! stock's for `uint8` and within float rounding otherwise.
//!
//! Decoding: stock decodes through OpenCV and libjpeg-turbo. PNG pixels come out identical;
//! JPEG pixels may differ by a few levels where the decoders' IDCT and chroma upsampling
//! round differently (measured on 4:2:0 photographs: at most 4, mean 0.36; 4:4:4: at most 3,
//! mean 0.01). Why zune-jpeg: `docs/design/dependencies.md`.

use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::tensor::Elem;

/// The channels a decode produces (OpenCV's `IMREAD_GRAYSCALE`, `IMREAD_COLOR`,
/// `IMREAD_UNCHANGED`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Channels {
    Gray,
    Bgr,
    /// As stored: 1, 3 or 4 channels (gray with an alpha channel becomes BGRA, as in OpenCV).
    Unchanged,
}

/// A decoded image: `h × w × c` bytes, channels in blue-green-red(-alpha) order.
#[derive(Debug, Clone)]
pub struct Image {
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: Vec<u8>,
}

/// Images larger than this many pixels are refused before decoding (a corrupt or hostile
/// header must not make us allocate terabytes); OpenCV's own limit is 2^30 pixels.
pub const MAX_PIXELS: usize = 1 << 30;

fn decode_error(what: impl std::fmt::Display) -> Error {
    Error::mxnet(format!("Decoding failed. Invalid image file: {what}"))
}

/// Decode a JPEG or PNG file held in `bytes`.
pub fn decode(bytes: &[u8], want: Channels) -> Result<Image> {
    if bytes.starts_with(&[0xff, 0xd8]) {
        decode_jpeg(bytes, want)
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        decode_png(bytes, want)
    } else if let Some(format) = other_format(bytes) {
        Err(Error::not_supported(format!("decoding {format} images")))
    } else {
        Err(decode_error("neither a JPEG nor a PNG signature"))
    }
}

/// The name of an image format OpenCV reads and this library does not, by its signature.
fn other_format(b: &[u8]) -> Option<&'static str> {
    let formats: [(&[u8], &str); 7] = [
        (b"BM", "BMP"),
        (b"GIF8", "GIF"),
        (b"II*\0", "TIFF"),
        (b"MM\0*", "TIFF"),
        (b"\0\0\0\x0cjP  ", "JPEG 2000"),
        (b"#?RADIANCE", "Radiance HDR"),
        (b"\x76\x2f\x31\x01", "OpenEXR"),
    ];
    if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        return Some("WebP");
    }
    if b.len() >= 2 && b[0] == b'P' && (b'1'..=b'7').contains(&b[1]) {
        return Some("PNM");
    }
    formats.iter().find(|(sig, _)| b.starts_with(sig)).map(|&(_, name)| name)
}

fn decode_jpeg(bytes: &[u8], want: Channels) -> Result<Image> {
    use zune_core::bytestream::ZCursor;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;
    let gray = want == Channels::Gray;
    let options = DecoderOptions::default()
        .set_max_width(1 << 16)
        .set_max_height(1 << 16)
        .jpeg_set_out_colorspace(if gray { ColorSpace::Luma } else { ColorSpace::BGR });
    let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    d.decode_headers().map_err(|e| decode_error(format!("{e:?}")))?;
    let (w, h) = d.dimensions().ok_or_else(|| decode_error("no image size in the JPEG header"))?;
    if w.checked_mul(h).is_none_or(|p| p > MAX_PIXELS) {
        return Err(decode_error(format!("a {w}x{h} JPEG is larger than {MAX_PIXELS} pixels")));
    }
    let data = d.decode().map_err(|e| decode_error(format!("{e:?}")))?;
    let c = if gray { 1 } else { 3 };
    if data.len() != h * w * c {
        return Err(decode_error(format!("the JPEG decoder gave {} bytes for {h}x{w}x{c}", data.len())));
    }
    Ok(Image { h, w, c, data })
}

fn decode_png(bytes: &[u8], want: Channels) -> Result<Image> {
    let limits = png::Limits { bytes: 1 << 32 };
    let mut d = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits);
    // Palettes and low bit depths expand to 8 bits, 16 bits keep their high byte (OpenCV's
    // conversion for 8-bit output), a tRNS chunk becomes an alpha channel.
    d.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut r = d.read_info().map_err(decode_error)?;
    let (w, h) = (r.info().width as usize, r.info().height as usize);
    // OpenCV keeps a gray image with an alpha channel as four channels (BGRA) when asked for
    // them unchanged; a gray image with a tRNS chunk (which EXPAND gives an alpha) stays gray.
    let gray_alpha = r.info().color_type == png::ColorType::GrayscaleAlpha;
    if w.checked_mul(h).is_none_or(|p| p > MAX_PIXELS) {
        return Err(decode_error(format!("a {w}x{h} PNG is larger than {MAX_PIXELS} pixels")));
    }
    let size = r.output_buffer_size().ok_or_else(|| decode_error("the PNG's size overflows"))?;
    let mut buf = vec![0u8; size];
    let frame = r.next_frame(&mut buf).map_err(decode_error)?;
    buf.truncate(frame.buffer_size());
    let stored = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err(decode_error("an unexpanded palette PNG")),
    };
    if buf.len() != h * w * stored {
        return Err(decode_error(format!("the PNG decoder gave {} bytes for {h}x{w}x{stored}", buf.len())));
    }
    let c = match (want, stored) {
        (Channels::Unchanged, 2) if gray_alpha => 4,
        (Channels::Gray, _) | (Channels::Unchanged, 1 | 2) => 1,
        (Channels::Bgr, _) | (Channels::Unchanged, 3) => 3,
        (Channels::Unchanged, _) => 4,
    };
    let mut data = vec![0u8; h * w * c];
    for (src, dst) in buf.chunks_exact(stored).zip(data.chunks_exact_mut(c)) {
        let (r, g, b, a) = match stored {
            1 => (src[0], src[0], src[0], 255),
            2 => (src[0], src[0], src[0], src[1]),
            3 => (src[0], src[1], src[2], 255),
            _ => (src[0], src[1], src[2], src[3]),
        };
        match c {
            1 if stored <= 2 => dst[0] = r,
            // libpng's rgb-to-gray as OpenCV asks for it (0.299 red, 0.587 green), in libpng's
            // truncating 15-bit fixed point (matches stock on every pixel of the tests).
            1 => dst[0] = ((r as u32 * 9797 + g as u32 * 19234 + b as u32 * 3737) >> 15) as u8,
            3 => dst.copy_from_slice(&[b, g, r]),
            _ => dst.copy_from_slice(&[b, g, r, a]),
        }
    }
    Ok(Image { h, w, c, data })
}

/// Swap the first and third channel of every pixel (BGR ↔ RGB) of an image with 3 or 4
/// channels.
pub fn swap_red_blue(data: &mut [u8], c: usize) {
    if c >= 3 {
        for px in data.chunks_exact_mut(c) {
            px.swap(0, 2);
        }
    }
}

/// OpenCV's source position and weight of the next pixel for output `d` of `dst` pixels from
/// `src` (bilinear: centres aligned, clamped at the edges).
fn linear_tap(d: usize, src: usize, dst: usize) -> (usize, f64) {
    let scale = src as f64 / dst as f64;
    // In float32, as OpenCV computes it.
    let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
    let s = f.floor();
    let (mut s, mut frac) = (s as i64, (f - s) as f64);
    if s < 0 {
        (s, frac) = (0, 0.0);
    }
    if s as usize >= src - 1 {
        (s, frac) = (src as i64 - 1, 0.0);
    }
    (s as usize, frac)
}

/// The interpolations [`resize`] implements (OpenCV's codes).
pub const INTER_NEAREST: i64 = 0;
pub const INTER_LINEAR: i64 = 1;

/// Whether [`resize`] implements OpenCV interpolation `interp`.
pub fn resize_supported(interp: i64) -> bool {
    interp == INTER_NEAREST || interp == INTER_LINEAR
}

/// The per-output-pixel taps of one axis.
fn taps(dst: usize, src: usize, interp: i64) -> Vec<(usize, f64)> {
    let nearest = |d: usize| ((d as f64 * (src as f64 / dst as f64)).floor() as usize).min(src - 1);
    (0..dst).map(|d| if interp == INTER_NEAREST { (nearest(d), 0.0) } else { linear_tap(d, src, dst) }).collect()
}

/// A pixel type [`resize`] handles.
pub trait Pixel: Elem + Copy + Send + Sync {
    /// Resize `n` images of `(h, w, c)` in `x` to `(rh, rw)` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn resize_into(
        x: &[Self],
        out: &mut [Self],
        hwc: (usize, usize, usize),
        to: (usize, usize),
        xs: &[(usize, f64)],
        ys: &[(usize, f64)],
        interp: i64,
        halving: bool,
    );
}

/// Resize `n` images of `(h, w, c)` (`x.len() == n·h·w·c`) to `(rh, rw)` into `out`, with
/// OpenCV's nearest (0) or bilinear (1) interpolation; other codes are refused.
pub fn resize<T: Pixel>(
    x: &[T],
    out: &mut [T],
    hwc: (usize, usize, usize),
    to: (usize, usize),
    interp: i64,
) -> Result<()> {
    let ((h, w, c), (rh, rw)) = (hwc, to);
    if !resize_supported(interp) {
        return Err(Error::not_supported(format!(
            "resizing with interpolation {interp} (nearest 0 and bilinear 1 are)"
        )));
    }
    if h == 0 || w == 0 || rh == 0 || rw == 0 || c == 0 {
        return Err(Error::value(format!("cannot resize a {h}x{w}x{c} image to {rh}x{rw}")));
    }
    if x.len() % (h * w * c) != 0 || out.len() != x.len() / (h * w * c) * rh * rw * c {
        return Err(Error::internal("resize: buffer sizes do not match the shapes"));
    }
    let halving = interp == INTER_LINEAR && h == 2 * rh && w == 2 * rw;
    let (xs, ys) = (taps(rw, w, interp), taps(rh, h, interp));
    T::resize_into(x, out, hwc, to, &xs, &ys, interp, halving);
    Ok(())
}

impl Pixel for u8 {
    fn resize_into(
        x: &[u8],
        out: &mut [u8],
        (h, w, c): (usize, usize, usize),
        (rh, rw): (usize, usize),
        xs: &[(usize, f64)],
        ys: &[(usize, f64)],
        interp: i64,
        halving: bool,
    ) {
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
        par_for_mut(out, row_len, Cost(4.0 * row_len as f64), DType::U8, |rows, o| {
            for (r, orow) in rows.zip(o.chunks_exact_mut(row_len)) {
                let (img, oy) = (r / rh, r % rh);
                let line = |yy: usize| &x[img * in_img + yy * line_len..img * in_img + (yy + 1) * line_len];
                if halving {
                    let (l0, l1) = (line(2 * oy), line(2 * oy + 1));
                    for (k, v) in orow.iter_mut().enumerate() {
                        let i0 = (k / c) * 2 * c + k % c;
                        let sum = l0[i0] as i32 + l0[i0 + c] as i32 + l1[i0] as i32 + l1[i0 + c] as i32;
                        *v = ((sum + 2) >> 2) as u8;
                    }
                } else if interp == INTER_NEAREST {
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
}

/// Float resizing in the image's own type with float32 weights, as OpenCV computes it.
#[allow(clippy::too_many_arguments)]
fn resize_float<T>(
    x: &[T],
    out: &mut [T],
    (h, w, c): (usize, usize, usize),
    (rh, rw): (usize, usize),
    xs: &[(usize, f64)],
    ys: &[(usize, f64)],
    interp: i64,
    halving: bool,
    from_f32: impl Fn(f32) -> T + Sync,
) where
    T: Elem + Copy + Send + Sync + std::ops::Mul<Output = T> + std::ops::Add<Output = T>,
{
    let (in_img, out_img) = (h * w * c, rh * rw * c);
    let quarter = from_f32(0.25);
    par_for_mut(out, 1, Cost(4.0), T::DTYPE, |r, o| {
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
            fn resize_into(
                x: &[$t],
                out: &mut [$t],
                hwc: (usize, usize, usize),
                to: (usize, usize),
                xs: &[(usize, f64)],
                ys: &[(usize, f64)],
                interp: i64,
                halving: bool,
            ) {
                resize_float(x, out, hwc, to, xs, ys, interp, halving, $from_f32)
            }
        }
    };
}
float_pixel!(f32, |v| v);
float_pixel!(f64, f64::from);

/// OpenCV's border types (`cv::BORDER_*`) that [`border_index`] maps.
pub const BORDER_CONSTANT: i64 = 0;
const BORDER_REPLICATE: i64 = 1;
const BORDER_REFLECT: i64 = 2;
const BORDER_WRAP: i64 = 3;
const BORDER_REFLECT_101: i64 = 4;

/// The source index of position `p` (possibly outside `[0, len)`) under border type `kind`;
/// `None` for a constant border outside the image.
pub fn border_index(p: i64, len: usize, kind: i64) -> Result<Option<usize>> {
    let n = len as i64;
    if (0..n).contains(&p) {
        return Ok(Some(p as usize));
    }
    let i = match kind {
        BORDER_CONSTANT => return Ok(None),
        BORDER_REPLICATE => p.clamp(0, n - 1),
        BORDER_WRAP => p.rem_euclid(n),
        BORDER_REFLECT | BORDER_REFLECT_101 => {
            if n == 1 {
                0
            } else {
                // Reflection is periodic with period 2n (abcd|dcba) or 2n-2 (abcd|cb).
                let (period, shift) = if kind == BORDER_REFLECT { (2 * n, 0) } else { (2 * n - 2, 1) };
                let q = p.rem_euclid(period);
                if q < n {
                    q
                } else {
                    period - q - 1 + shift
                }
            }
        }
        _ => {
            return Err(Error::value(format!(
                "border type {kind} is not one of OpenCV's 0 (constant), 1 (replicate), 2 (reflect), 3 (wrap), 4 (reflect 101)"
            )))
        }
    };
    Ok(Some(i as usize))
}

/// Pad an `(h, w, c)` image by `(top, bottom, left, right)` into `out`, OpenCV's
/// `copyMakeBorder`: outside pixels come from the image under border type `kind`, or are
/// `fill[channel]` for a constant border.
pub fn make_border<T: Copy>(
    x: &[T],
    out: &mut [T],
    (h, w, c): (usize, usize, usize),
    (top, bottom, left, right): (usize, usize, usize, usize),
    kind: i64,
    fill: &[T],
) -> Result<()> {
    let (oh, ow) = (h + top + bottom, w + left + right);
    if out.len() != oh * ow * c || x.len() != h * w * c || fill.len() < c {
        return Err(Error::internal("make_border: buffer sizes do not match the shapes"));
    }
    if (h == 0 || w == 0) && kind != BORDER_CONSTANT {
        return Err(Error::value("copyMakeBorder of an empty image needs a constant border (type 0)"));
    }
    let cols = (0..ow).map(|x| border_index(x as i64 - left as i64, w, kind)).collect::<Result<Vec<_>>>()?;
    for y in 0..oh {
        let row = border_index(y as i64 - top as i64, h, kind)?;
        for (xo, col) in cols.iter().enumerate() {
            let dst = &mut out[(y * ow + xo) * c..(y * ow + xo + 1) * c];
            match (row, col) {
                (Some(r), Some(k)) => dst.copy_from_slice(&x[(r * w + k) * c..(r * w + k + 1) * c]),
                _ => dst.copy_from_slice(&fill[..c]),
            }
        }
    }
    Ok(())
}

/// OpenCV's `saturate_cast<uchar>` of a float: round half to even, clamp to `[0, 255]`.
pub fn saturate_u8(v: f32) -> u8 {
    v.round_ties_even().clamp(0.0, 255.0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn border_indices_follow_opencv() {
        let at = |p: i64, kind| border_index(p, 4, kind).unwrap();
        // abcd with two positions each side: replicate aa|abcd|dd, reflect ba|abcd|dc,
        // reflect-101 cb|abcd|cb, wrap cd|abcd|ab.
        let row = |kind| (-2..6).map(|p| at(p, kind).unwrap()).collect::<Vec<_>>();
        assert_eq!(row(BORDER_REPLICATE), [0, 0, 0, 1, 2, 3, 3, 3]);
        assert_eq!(row(BORDER_REFLECT), [1, 0, 0, 1, 2, 3, 3, 2]);
        assert_eq!(row(BORDER_REFLECT_101), [2, 1, 0, 1, 2, 3, 2, 1]);
        assert_eq!(row(BORDER_WRAP), [2, 3, 0, 1, 2, 3, 0, 1]);
        assert_eq!(at(-1, BORDER_CONSTANT), None);
        assert!(border_index(-1, 4, 7).is_err());
        let mut out = [0u8; 8];
        make_border(&[1u8, 2], &mut out, (1, 2, 1), (1, 0, 1, 1), BORDER_CONSTANT, &[9]).unwrap();
        assert_eq!(out, [9, 9, 9, 9, 9, 1, 2, 9]);
        assert!(make_border(&[1u8, 2], &mut [0u8; 12], (1, 2, 1), (1, 0, 1, 1), BORDER_CONSTANT, &[9]).is_err());
    }

    #[test]
    fn bad_images_are_errors() {
        for bytes in [&b""[..], b"\xff\xd8\xff\xe0junk", b"\x89PNG\r\n\x1a\nxx", b"garbage"] {
            let e = decode(bytes, Channels::Bgr).unwrap_err().to_string();
            assert!(e.starts_with("MXNetError: Decoding failed. Invalid image file"), "{e}");
        }
        let e = decode(b"GIF89a....", Channels::Bgr).unwrap_err().to_string();
        assert!(e.starts_with("NotImplementedError: decoding GIF images"), "{e}");
    }
}
