//! OpenCV-compatible pixel routines shared by the image operators (`_cvimdecode`,
//! `_image_resize`, `_cvcopyMakeBorder`, ...) and the image iterators (`ImageRecordIter`).
//!
//! Owns: decoding JPEG (zune-jpeg) and PNG (png) into OpenCV's layout (HWC, blue-green-red
//! channel order) and border filling with OpenCV's five border types; resizing (`resize`)
//! and affine warps (`warp`) in their submodules. Images are `(height, width, channels)`
//! slices in row-major order.
//!
//! Decoding: stock decodes through OpenCV and libjpeg-turbo. PNG pixels come out identical;
//! JPEG pixels may differ by a few levels where the decoders' IDCT and chroma upsampling
//! round differently (measured on 4:2:0 photographs: at most 4, mean 0.36; 4:4:4: at most 3,
//! mean 0.01). Why zune-jpeg: `docs/design/dependencies.md`.

use crate::error::{Error, Result};

mod resize;
mod warp;
pub use resize::{
    resize, resize_supported, Pixel, INTER_AREA, INTER_CUBIC, INTER_LANCZOS4, INTER_LINEAR, INTER_NEAREST,
};
pub use warp::warp_affine;

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
