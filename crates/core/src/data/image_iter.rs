//! `ImageRecordIter` and its typed variants (`ImageRecordUInt8Iter`, `ImageRecordInt8Iter`,
//! the `_v1` names): batches of decoded, augmented images from a RecordIO file that
//! `im2rec` (or `mx.recordio`) wrote.
//!
//! Owns: stock's default augmenter (`aug_default`: resize, pad, crops, colour jitter, HSL and
//! PCA noise, mirror), the normalisation into `(channels, height, width)` planes in RGB
//! order, and the image helpers the detection iterator shares (resizing, cropping, the
//! interpolation choice, HLS shifts). Reading, batching and prefetching are
//! [`super::record_batches`]'s.
//!
//! Semantics follow stock's `ImageRecordIOParser2`: records hold a 24-byte `IRHeader` (flag,
//! label, id, id2), `flag` extra float labels, then the encoded image; pixels are
//! `(x - mean) · contrast / std + illumination / std` in float32 (`uint8` keeps the pixel,
//! `int8` is `saturate(x - round(mean))`); the label batch is `(batch, label_width)`; a part
//! of `num_parts` is a byte range of the file (records by count with a `.idx` file). What
//! differs, on purpose: random choices (crops, mirrors, jitter, shuffle order) come from a
//! generator seeded per record from `seed` / `seed_aug` and the record's place in the epoch,
//! so they are reproducible whatever the thread count, but they are not stock's draws.
//! `GetIndex` reports each image's id (stock leaves zeros). The affine augmentation (rotation,
//! shear, random scale and aspect ratio, `min/max_img_size`) warps as `cv::warpAffine` does,
//! and every `inter_method` (0-4, 9 "auto", 10 "random") is OpenCV's.
//!
//! Threads: one prefetch thread assembles up to `prefetch_buffer` batches ahead; inside a
//! batch, a pool of `preprocess_threads` threads (started with the iterator) decodes and
//! augments records (both in [`super::record_batches`]).

use super::iter::{f32_bytes, positive, DataIter};
use super::record_batches::{parse_record, part_offsets, BatchReader, Batching, Prefetcher, Rng};
use super::recordio::RecordReader;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::op::imgproc::{self, Channels, Image};
use crate::op::param::{op_params, Attrs};
use std::sync::Arc;

pub(super) const RECORD_ITER_DOC: &str = "Iterates on image RecordIO files\n\nReads batches of images from .rec RecordIO files. One can use ``im2rec.py`` tool\n(in tools/) to pack raw image files into RecordIO files. This iterator is less\nflexible to customization but is fast and has lot of language bindings. To\niterate over raw images directly use ``ImageIter`` instead (in Python).\n\nExample::\n\n  data_iter = mx.io.ImageRecordIter(\n    path_imgrec=\"./sample.rec\", # The target record file.\n    data_shape=(3, 227, 227), # Output data shape; 227x227 region will be cropped from the original image.\n    batch_size=4, # Number of items per batch.\n    resize=256 # Resize the shorter edge to 256 before cropping.\n    # You can specify more augmentation options. Use help(mx.io.ImageRecordIter) to see all the options.\n    )\n  # You can now use the data_iter to access batches of images.\n  batch = data_iter.next() # first batch.\n  images = batch.data[0] # This will contain 4 (=batch_size) images each of 3x227x227.\n  # process the images\n  ...\n  data_iter.reset() # To restart the iterator from the beginning.\n\n";
pub(super) const UINT8_ITER_DOC: &str = "Iterating on image RecordIO files\n\n.. note:: ImageRecordUInt8Iter is deprecated. Use ImageRecordIter(dtype='uint8') instead.\n\nThis iterator is identical to ``ImageRecordIter`` except for using ``uint8`` as\nthe data type instead of ``float``.\n\n";
pub(super) const INT8_ITER_DOC: &str = "Iterating on image RecordIO files\n\n.. note:: ``ImageRecordInt8Iter`` is deprecated. Use ImageRecordIter(dtype='int8') instead.\n\nThis iterator is identical to ``ImageRecordIter`` except for using ``int8`` as\nthe data type instead of ``float``.\n\n";

op_params! {
    /// The image iterators' parameters (stock's ImageRecParserParam, ImageRecordParam,
    /// BatchParam, PrefetcherParam, DefaultImageAugmentParam and ImageNormalizeParam; a name
    /// several of them declare is listed once).
    pub(super) struct RecParams<'a> => REC_PARAMS {
        path_imglist: &'a str = "", "Path to the image list (.lst) file. Generally created with tools/im2rec.py. Format (Tab separated): <index of record>\t<one or more labels>\t<relative path from root folder>.";
        path_imgrec: &'a str = "", "Path to the image RecordIO (.rec) file or a directory path. Created with tools/im2rec.py.";
        path_imgidx: &'a str = "", "Path to the image RecordIO index (.idx) file. Created with tools/im2rec.py.";
        aug_seq: &'a str = "aug_default", "The augmenter names to represent sequence of augmenters to be applied, seperated by comma. Additional keyword parameters will be seen by these augmenters.";
        label_width: i64 = "1", "The number of labels per image.";
        data_shape: &'a [i64] = required, "The shape of one output image in (channels, height, width) format.";
        preprocess_threads: i64 = "4", "The number of threads to do preprocessing.";
        verbose: bool = "True", "If or not output verbose information.";
        num_parts: i64 = "1", "Virtually partition the data into these many parts.";
        part_index: i64 = "0", "The *i*-th virtual partition to be read.";
        device_id: i64 = "0", "The device id used to create context for internal NDArray. Setting device_id to -1 will create Context::CPU(0). Setting device_id to valid positive device id will create Context::CPUPinned(device_id). Default is 0.";
        shuffle_chunk_size: i64 = "0", "The data shuffle buffer size in MB. Only valid if shuffle is true.";
        shuffle_chunk_seed: i64 = "0", "The random seed for shuffling";
        seed_aug: Option<i64> = "None", "Random seed for augmentations.";
        shuffle: bool = "False", "Whether to shuffle data randomly or not.";
        seed: i64 = "0", "The random seed.";
        batch_size: i64 = required, "Batch size.";
        round_batch: bool = "True", "Whether to use round robin to handle overflow batch or not.";
        prefetch_buffer: i64 = "4", "Maximum number of batches to prefetch.";
        ctx: &'a str = "gpu" in ["cpu", "gpu"], "Context data loader optimized for.";
        dtype: Option<DType> = "None", "Output data type. ``None`` means no change.";
        resize: i64 = "-1", "Down scale the shorter edge to a new size  before applying other augmentations.";
        rand_crop: bool = "False", "If or not randomly crop the image";
        random_resized_crop: bool = "False", "If or not perform random resized cropping on the image, as a standard preprocessing for resnet training on ImageNet data.";
        max_rotate_angle: i64 = "0", "Rotate by a random degree in ``[-v, v]``";
        max_aspect_ratio: f64 = "0", "Change the aspect (namely width/height) to a random value. If min_aspect_ratio is None then the aspect ratio ins sampled from [1 - max_aspect_ratio, 1 + max_aspect_ratio], else it is in ``[min_aspect_ratio, max_aspect_ratio]``";
        min_aspect_ratio: Option<f64> = "None", "Change the aspect (namely width/height) to a random value in ``[min_aspect_ratio, max_aspect_ratio]``";
        max_shear_ratio: f64 = "0", "Apply a shear transformation (namely ``(x,y)->(x+my,y)``) with ``m`` randomly chose from ``[-max_shear_ratio, max_shear_ratio]``";
        max_crop_size: i64 = "-1", "Crop both width and height into a random size in ``[min_crop_size, max_crop_size].``Ignored if ``random_resized_crop`` is True.";
        min_crop_size: i64 = "-1", "Crop both width and height into a random size in ``[min_crop_size, max_crop_size].``Ignored if ``random_resized_crop`` is True.";
        max_random_scale: f64 = "1", "Resize into ``[width*s, height*s]`` with ``s`` randomly chosen from ``[min_random_scale, max_random_scale]``. Ignored if ``random_resized_crop`` is True.";
        min_random_scale: f64 = "1", "Resize into ``[width*s, height*s]`` with ``s`` randomly chosen from ``[min_random_scale, max_random_scale]``Ignored if ``random_resized_crop`` is True.";
        max_random_area: f64 = "1", "Change the area (namely width * height) to a random value in ``[min_random_area, max_random_area]``. Ignored if ``random_resized_crop`` is False.";
        min_random_area: f64 = "1", "Change the area (namely width * height) to a random value in ``[min_random_area, max_random_area]``. Ignored if ``random_resized_crop`` is False.";
        max_img_size: f64 = "1e+10", "Set the maximal width and height after all resize and rotate argumentation  are applied";
        min_img_size: f64 = "0", "Set the minimal width and height after all resize and rotate argumentation  are applied";
        brightness: f64 = "0", "Add a random value in ``[-brightness, brightness]`` to the brightness of image.";
        contrast: f64 = "0", "Add a random value in ``[-contrast, contrast]`` to the contrast of image.";
        saturation: f64 = "0", "Add a random value in ``[-saturation, saturation]`` to the saturation of image.";
        pca_noise: f64 = "0", "Add PCA based noise to the image.";
        random_h: i64 = "0", "Add a random value in ``[-random_h, random_h]`` to the H channel in HSL color space.";
        random_s: i64 = "0", "Add a random value in ``[-random_s, random_s]`` to the S channel in HSL color space.";
        random_l: i64 = "0", "Add a random value in ``[-random_l, random_l]`` to the L channel in HSL color space.";
        rotate: i64 = "-1", "Rotate by an angle. If set, it overwrites the ``max_rotate_angle`` option.";
        fill_value: i64 = "255", "Set the padding pixels value to ``fill_value``.";
        inter_method: i64 = "1", "The interpolation method: 0-NN 1-bilinear 2-cubic 3-area 4-lanczos4 9-auto 10-rand.";
        pad: i64 = "0", "Change size from ``[width, height]`` into ``[pad + width + pad, pad + height + pad]`` by padding pixes";
        mirror: bool = "False", "Whether to mirror the image or not. If true, images are flipped along the horizontal axis.";
        rand_mirror: bool = "False", "Whether to randomly mirror images or not. If true, 50% of the images will be randomly mirrored (flipped along the horizontal axis)";
        mean_img: &'a str = "", "Filename of the mean image.";
        mean_r: f64 = "0", "The mean value to be subtracted on the R channel";
        mean_g: f64 = "0", "The mean value to be subtracted on the G channel";
        mean_b: f64 = "0", "The mean value to be subtracted on the B channel";
        mean_a: f64 = "0", "The mean value to be subtracted on the alpha channel";
        std_r: f64 = "1", "Augmentation Param: Standard deviation on R channel.";
        std_g: f64 = "1", "Augmentation Param: Standard deviation on G channel.";
        std_b: f64 = "1", "Augmentation Param: Standard deviation on B channel.";
        std_a: f64 = "1", "Augmentation Param: Standard deviation on Alpha channel.";
        scale: f64 = "1", "Multiply the image with a scale value.";
        max_random_contrast: f64 = "0", "Change the contrast with a value randomly chosen from ``[-max_random_contrast, max_random_contrast]``";
        max_random_illumination: f64 = "0", "Change the illumination with a value randomly chosen from ``[-max_random_illumination, max_random_illumination]``";
    }
}

/// The labels of an image list (`.lst`: index, `label_width` labels, path), by image index.
fn read_image_list(path: &str, width: usize) -> Result<std::collections::HashMap<u64, Vec<f32>>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::mxnet(format!("cannot read {path}: {e}")))?;
    let mut map = std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let bad = || Error::mxnet(format!("Bad ImageList format: line {} of {path}", n + 1));
        let index: u64 = fields.next().and_then(|f| f.parse::<f64>().ok()).ok_or_else(bad)? as u64;
        let labels = (0..width)
            .map(|_| fields.next().and_then(|f| f.parse::<f32>().ok()).ok_or_else(bad))
            .collect::<Result<Vec<_>>>()?;
        map.insert(index, labels);
    }
    Ok(map)
}

/// The largest height, width, resize, pad, crop size and label width accepted (JPEG's own
/// limit is 65535).
pub(super) const MAX_SIDE: i64 = 1 << 16;
/// The largest batch buffer accepted.
pub(super) const MAX_BATCH_BYTES: usize = 1 << 36;

/// The settled configuration of one iterator.
#[derive(Clone)]
struct Config {
    rec: String,
    channels: usize,
    height: usize,
    width: usize,
    batch: usize,
    label_width: usize,
    dtype: DType,
    round_batch: bool,
    threads: usize,
    shuffle: bool,
    seed: u64,
    aug_seed: u64,
    labels: Option<std::sync::Arc<std::collections::HashMap<u64, Vec<f32>>>>,
    aug: Augment,
    norm: Normalize,
}

/// Stock's default augmenter's settings (the supported ones).
#[derive(Clone)]
struct Augment {
    resize: Option<usize>,
    rand_crop: bool,
    random_resized_crop: bool,
    crop_size: Option<(usize, usize)>,
    area: (f32, f32),
    aspect: (f32, f32),
    brightness: f32,
    contrast: f32,
    saturation: f32,
    pca_noise: f32,
    hsl: [i64; 3],
    fill: u8,
    inter: i64,
    pad: usize,
    affine: Option<Affine>,
}

/// Stock's affine augmentation: a random rotation, shear, scale and aspect ratio, warped into
/// an image of the scaled size bounded by `img_size`.
#[derive(Clone)]
struct Affine {
    max_shear: f32,
    max_angle: i64,
    /// `rotate` when positive: every image turns by it.
    rotate: Option<i64>,
    /// `rotate_list`: each image turns by one of these, chosen at random.
    rotate_list: Vec<i64>,
    /// Scale and aspect-ratio ranges; both 1 with `random_resized_crop`, which draws its own.
    scale: (f32, f32),
    aspect: (f32, f32),
    /// `(min_img_size, max_img_size)`.
    img_size: (f32, f32),
}

/// Stock's normalisation settings.
#[derive(Clone)]
struct Normalize {
    mirror: bool,
    rand_mirror: bool,
    mean: [f32; 4],
    std: [f32; 4],
    scale: f32,
    max_contrast: f32,
    max_illumination: f32,
    /// A mean image, `(channels, height, width)`, replacing `mean`.
    mean_img: Option<std::sync::Arc<Vec<f32>>>,
}

/// The aspect-ratio range stock samples from: `[min, max]` when `min_aspect_ratio` is set,
/// else `[1 - max, 1 + max]`.
fn aspect_range(p: &RecParams) -> (f32, f32) {
    match p.min_aspect_ratio {
        Some(lo) => (lo as f32, p.max_aspect_ratio as f32),
        None => (1.0 - p.max_aspect_ratio as f32, 1.0 + p.max_aspect_ratio as f32),
    }
}

/// C's `atoi`: leading blanks, a sign and digits; 0 when there are none.
fn atoi(text: &str) -> i64 {
    let t = text.trim_start();
    let (sign, digits) = match t.as_bytes().first() {
        Some(b'-') => (-1, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    sign * digits[..end].parse::<i64>().unwrap_or(0).min(i64::from(i32::MAX))
}

/// The affine augmentation, when any of its settings asks for it. `rotate_list` is not a
/// declared parameter in stock either: it is read from the undeclared ones, a comma-separated
/// list of angles each read as C's `atoi` reads it (empty pieces are skipped, as stock's
/// reading skips a trailing comma). Settings compare in float32, stock's type for them.
fn affine_of(p: &RecParams, extra: &[(String, String)], op: &str) -> Result<Option<Affine>> {
    let (amin, amax) = aspect_range(p);
    let rotate_list: Vec<i64> = extra
        .iter()
        .filter(|(k, _)| k == "rotate_list")
        .flat_map(|(_, v)| v.split(',').filter(|t| !t.is_empty()).map(atoi).collect::<Vec<_>>())
        .collect();
    let on = p.max_rotate_angle > 0
        || p.max_shear_ratio as f32 > 0.0
        || p.rotate > 0
        || !rotate_list.is_empty()
        || p.max_random_scale as f32 != 1.0
        || p.min_random_scale as f32 != 1.0
        || (!p.random_resized_crop && (amin != 1.0 || amax != 1.0))
        || p.max_img_size as f32 != 1e10
        || p.min_img_size as f32 != 0.0;
    if !on {
        return Ok(None);
    }
    if !(1..=4).contains(&p.inter_method) && !(9..=10).contains(&p.inter_method) {
        return Err(Error::value(format!(
            "{op}: inter_method {} is not valid with the affine augmentation (1-4, 9 and 10 are)",
            p.inter_method
        )));
    }
    let rrc = p.random_resized_crop;
    Ok(Some(Affine {
        max_shear: p.max_shear_ratio as f32,
        max_angle: p.max_rotate_angle.clamp(0, i64::from(i32::MAX)),
        rotate: (p.rotate > 0).then_some(p.rotate),
        rotate_list,
        scale: if rrc { (1.0, 1.0) } else { (p.min_random_scale as f32, p.max_random_scale as f32) },
        aspect: if rrc { (1.0, 1.0) } else { (amin, amax) },
        img_size: (p.min_img_size as f32, p.max_img_size as f32),
    }))
}

impl Config {
    fn new(a: &Attrs, default_dtype: DType) -> Result<Config> {
        let p = RecParams::of(a);
        let op = a.op;
        if p.path_imgrec.is_empty() {
            return Err(Error::value(format!("{op}: must specify path_imgrec")));
        }
        if p.aug_seq != "aug_default" {
            return Err(Error::not_supported(format!("{op} with aug_seq={} (aug_default is)", p.aug_seq)));
        }
        let affine = affine_of(&p, a.extra(), op)?;
        let [channels, height, width] = image_shape(op, p.data_shape)?;
        let positive = |name: &str, v: i64| positive(op, name, v);
        let dtype = p.dtype.unwrap_or(default_dtype);
        if !matches!(dtype, DType::F32 | DType::U8 | DType::I8) {
            return Err(Error::value(format!("{op}: dtype {} is not float32, uint8 or int8", dtype.name())));
        }
        let inter = p.inter_method;
        if !(0..=4).contains(&inter) && inter != 9 && inter != 10 {
            return Err(Error::value(format!("{op}: invalid inter_method {inter}: valid values are 0-4, 9 and 10")));
        }
        let crop_size = match (p.max_crop_size, p.min_crop_size) {
            (-1, -1) => None,
            (hi, lo) if p.random_resized_crop => {
                return Err(Error::value(format!(
                    "{op}: random_resized_crop conflicts with min_crop_size {lo} / max_crop_size {hi}"
                )))
            }
            (hi, lo) if lo >= 0 && hi >= lo => Some((lo as usize, hi as usize)),
            (hi, lo) => return Err(Error::value(format!("{op}: crop sizes [{lo}, {hi}] are not a range"))),
        };
        if p.random_resized_crop && p.rand_crop {
            return Err(Error::value(format!("{op}: random_resized_crop conflicts with rand_crop")));
        }
        if p.random_resized_crop && (p.min_random_scale as f32 != 1.0 || p.max_random_scale as f32 != 1.0) {
            return Err(Error::value(format!(
                "{op}: random_resized_crop conflicts with min_random_scale {} / max_random_scale {}",
                p.min_random_scale, p.max_random_scale
            )));
        }
        let (amin, amax) = aspect_range(&p);
        if p.random_resized_crop && (amin <= 0.0 || amin > amax || p.min_random_area > p.max_random_area) {
            return Err(Error::value(format!(
                "{op}: random_resized_crop needs 0 < min_aspect_ratio <= max_aspect_ratio and min_random_area <= max_random_area"
            )));
        }
        for (name, v) in [("resize", p.resize), ("pad", p.pad), ("max_crop_size", p.max_crop_size)] {
            if v > MAX_SIDE {
                return Err(Error::value(format!("{op}: {name}={v} is larger than {MAX_SIDE} pixels")));
            }
        }
        let aug = Augment {
            resize: if p.resize > 0 { Some(p.resize as usize) } else { None },
            rand_crop: p.rand_crop,
            random_resized_crop: p.random_resized_crop,
            crop_size,
            area: (p.min_random_area as f32, p.max_random_area as f32),
            aspect: (amin, amax),
            brightness: p.brightness as f32,
            contrast: p.contrast as f32,
            saturation: p.saturation as f32,
            pca_noise: p.pca_noise as f32,
            hsl: [p.random_h, p.random_s, p.random_l],
            fill: p.fill_value.clamp(0, 255) as u8,
            inter,
            pad: usize::try_from(p.pad).unwrap_or(0),
            affine,
        };
        let norm = Normalize {
            mirror: p.mirror,
            rand_mirror: p.rand_mirror,
            mean: [p.mean_r, p.mean_g, p.mean_b, p.mean_a].map(|v| v as f32),
            std: [p.std_r, p.std_g, p.std_b, p.std_a].map(|v| v as f32),
            scale: p.scale as f32,
            max_contrast: p.max_random_contrast as f32,
            max_illumination: p.max_random_illumination as f32,
            mean_img: None,
        };
        let label_width = positive("label_width", p.label_width)?;
        let batch = positive("batch_size", p.batch_size)?;
        let bytes = (channels * height * width)
            .checked_mul(batch)
            .and_then(|n| n.checked_mul(4))
            .filter(|&n| n <= MAX_BATCH_BYTES && label_width <= MAX_SIDE as usize);
        if bytes.is_none() {
            return Err(Error::value(format!(
                "{op}: a batch of {batch} images of {:?} (label_width {label_width}) is larger than this library's limit of {MAX_BATCH_BYTES} bytes",
                p.data_shape
            )));
        }
        let labels = if p.path_imglist.is_empty() {
            None
        } else {
            Some(std::sync::Arc::new(read_image_list(p.path_imglist, label_width)?))
        };
        Ok(Config {
            rec: p.path_imgrec.to_string(),
            channels,
            height,
            width,
            batch,
            label_width,
            dtype,
            round_batch: p.round_batch,
            threads: positive("preprocess_threads", p.preprocess_threads)?.min(64),
            shuffle: p.shuffle,
            seed: p.seed as u64,
            aug_seed: p.seed_aug.unwrap_or(p.seed) as u64,
            labels,
            aug,
            norm,
        })
    }

    fn unit(&self) -> usize {
        self.channels * self.height * self.width
    }
}

/// An image iterator's `data_shape`: `(channels, height, width)` with 1, 3 or 4 channels and
/// sides in `[1, MAX_SIDE]`.
pub(super) fn image_shape(op: &str, data_shape: &[i64]) -> Result<[usize; 3]> {
    match *data_shape {
        [c @ (1 | 3 | 4), h @ 1..=MAX_SIDE, w @ 1..=MAX_SIDE] => Ok([c as usize, h as usize, w as usize]),
        [_, _, _] => Err(Error::value(format!(
            "{op}: data_shape {data_shape:?} needs 1, 3 or 4 channels and a height and width in [1, {MAX_SIDE}]"
        ))),
        _ => Err(Error::value(format!("{op}: data_shape must be (channels, height, width), got {data_shape:?}"))),
    }
}

/// Stock's border colour `cv::Scalar(v, v, v)`: `v` in the three colour channels, 0 in alpha.
pub(super) fn cv_scalar(v: u8) -> [u8; 4] {
    [v, v, v, 0]
}

/// Refuse an intermediate image larger than a decodable one (a huge `resize` or `pad`).
pub(super) fn check_size(h: usize, w: usize) -> Result<()> {
    match h.checked_mul(w) {
        Some(n) if n <= imgproc::MAX_PIXELS => Ok(()),
        _ => Err(Error::value(format!(
            "an augmented image of {h}x{w} pixels is larger than {} pixels",
            imgproc::MAX_PIXELS
        ))),
    }
}

pub(super) fn resized(img: &Image, nh: usize, nw: usize, inter: i64) -> Result<Image> {
    check_size(nh, nw)?;
    let mut data = vec![0u8; nh * nw * img.c];
    imgproc::resize::<u8>(&img.data, &mut data, (img.h, img.w, img.c), (nh, nw), inter)?;
    Ok(Image { h: nh, w: nw, c: img.c, data })
}

pub(super) fn cropped(img: &Image, y: usize, x: usize, h: usize, w: usize) -> Image {
    let c = img.c;
    let mut data = Vec::with_capacity(h * w * c);
    for r in y..y + h {
        data.extend_from_slice(&img.data[(r * img.w + x) * c..(r * img.w + x + w) * c]);
    }
    Image { h, w, c, data }
}

/// OpenCV's `BGR2GRAY` of one pixel in its 14-bit fixed point (stock applies `RGB2GRAY` to
/// its BGR images; the weights follow stock's call).
fn gray_of(px: &[u8]) -> u8 {
    let (r, g, b) = (px[0] as u32, px[1] as u32, px[2] as u32);
    ((r * 4899 + g * 9617 + b * 1868 + (1 << 13)) >> 14) as u8
}

/// Stock's `resize` augmentation: the shorter side scaled to `size`, the longer in proportion
/// (integer arithmetic, as stock's), with `inter_method` `inter`.
pub(super) fn resize_shorter(img: &Image, size: usize, inter: i64, rng: &mut Rng) -> Result<Image> {
    let (nh, nw) = if img.h > img.w { (size * img.h / img.w, size) } else { (size, size * img.w / img.h) };
    let (nh, nw) = (nh.max(1), nw.max(1));
    resized(img, nh, nw, pick_inter(inter, (img.h, img.w), (nh, nw), rng))
}

/// The interpolation for a resize from `(h, w)` to `(nh, nw)`: `inter_method` itself, or for
/// 9 bicubic when enlarging both sides, area when shrinking both, else bilinear; for 10 one
/// of the five at random.
pub(super) fn pick_inter(inter: i64, (h, w): (usize, usize), (nh, nw): (usize, usize), rng: &mut Rng) -> i64 {
    match inter {
        9 if nh > h && nw > w => imgproc::INTER_CUBIC,
        9 if nh < h && nw < w => imgproc::INTER_AREA,
        9 => imgproc::INTER_LINEAR,
        10 => rng.int(0, 4) as i64,
        _ => inter,
    }
}

/// Stock's affine augmentation: shear `s`, rotation by an integer angle, scale and aspect
/// ratio drawn, the map centred on the scaled size (in float32, as stock computes it), the
/// image warped into that size with the fill value around it.
fn warped(aug: &Augment, af: &Affine, img: Image, rng: &mut Rng) -> Result<Image> {
    let s = rng.unit() * af.max_shear * 2.0 - af.max_shear;
    let mut angle = rng.int(0, 2 * af.max_angle as usize) as i64 - af.max_angle;
    if let Some(r) = af.rotate {
        angle = r;
    }
    if !af.rotate_list.is_empty() {
        angle = af.rotate_list[rng.int(0, af.rotate_list.len() - 1)];
    }
    let radians = angle as f64 / 180.0 * std::f64::consts::PI;
    let (a, b) = (radians.cos() as f32, radians.sin() as f32);
    let scale = rng.unit() * (af.scale.1 - af.scale.0) + af.scale.0;
    let ratio = rng.unit() * (af.aspect.1 - af.aspect.0) + af.aspect.0;
    let hs = 2.0 * scale / (1.0 + ratio);
    let ws = ratio * hs;
    let (cols, rows) = (img.w as f32, img.h as f32);
    let bounded = |v: f32| af.img_size.0.max(af.img_size.1.min(v));
    let (new_w, new_h) = (bounded(scale * cols), bounded(scale * rows));
    let (m00, m01, m10, m11) = (hs * a - s * b * ws, hs * b + s * a * ws, -b * ws, a * ws);
    let (cx, cy) = (m00 * cols + m01 * rows, m10 * cols + m11 * rows);
    let m = [m00, m01, (new_w - cx) / 2.0, m10, m11, (new_h - cy) / 2.0];
    // OpenCV's size from floats: truncated; an empty one means the source's size.
    let (mut nw, mut nh) = (new_w as i64, new_h as i64);
    if nw == 0 || nh == 0 {
        (nw, nh) = (img.w as i64, img.h as i64);
    }
    if nw < 1 || nh < 1 || nw > MAX_SIDE || nh > MAX_SIDE {
        return Err(Error::mxnet(format!(
            "the affine augmentation makes a {}x{} image {nh}x{nw}, outside [1, {MAX_SIDE}] (check min_img_size, max_img_size and the random scale)",
            img.h, img.w
        )));
    }
    let (nh, nw) = (nh as usize, nw as usize);
    check_size(nh, nw)?;
    let inter = pick_inter(aug.inter, (img.h, img.w), (nh, nw), rng);
    let data = imgproc::warp_affine(&img.data, (img.h, img.w, img.c), m, (nh, nw), inter, cv_scalar(aug.fill))?;
    Ok(Image { h: nh, w: nw, c: img.c, data })
}

/// Stock's default augmenter on a BGR(A) image; returns the `(height, width)` crop.
fn augment(cfg: &Config, mut img: Image, rng: &mut Rng) -> Result<Image> {
    let aug = &cfg.aug;
    let (dh, dw) = (cfg.height, cfg.width);
    if let Some(size) = aug.resize {
        img = resize_shorter(&img, size, aug.inter, rng)?;
    }
    if let Some(af) = &aug.affine {
        img = warped(aug, af, img, rng)?;
    }
    if aug.pad > 0 {
        let p = aug.pad;
        check_size(img.h + 2 * p, img.w + 2 * p)?;
        let mut data = vec![0u8; (img.h + 2 * p) * (img.w + 2 * p) * img.c];
        let fill = cv_scalar(aug.fill);
        imgproc::make_border(
            &img.data,
            &mut data,
            (img.h, img.w, img.c),
            (p, p, p, p),
            imgproc::BORDER_CONSTANT,
            &fill,
        )?;
        img = Image { h: img.h + 2 * p, w: img.w + 2 * p, c: img.c, data };
    }
    let mut done = false;
    if aug.random_resized_crop && (aug.area != (1.0, 1.0) || aug.aspect != (1.0, 1.0)) {
        let area = (img.h * img.w) as f32;
        for _ in 0..10 {
            let target = area * rng.uniform(aug.area.0, aug.area.1);
            let ratio = rng.uniform(aug.aspect.0, aug.aspect.1);
            let (mut ya, mut xa) = ((target / ratio).sqrt().round() as usize, (target * ratio).sqrt().round() as usize);
            if rng.unit() > 0.5 {
                std::mem::swap(&mut ya, &mut xa);
            }
            if ya >= 1 && xa >= 1 && ya <= img.h && xa <= img.w {
                let (y, x) = (rng.int(0, img.h - ya), rng.int(0, img.w - xa));
                let inter = pick_inter(aug.inter, (ya, xa), (dh, dw), rng);
                img = resized(&cropped(&img, y, x, ya, xa), dh, dw, inter)?;
                done = true;
                break;
            }
        }
    } else if let Some((lo, hi)) = aug.crop_size {
        if img.w < hi || img.h < hi {
            return Err(Error::mxnet(format!("input image size {}x{} smaller than max_crop_size {hi}", img.h, img.w)));
        }
        let size = rng.int(lo.max(1), hi.max(1));
        let (mut y, mut x) = (img.h - size, img.w - size);
        if aug.rand_crop {
            (y, x) = (rng.int(0, y), rng.int(0, x));
        } else {
            (y, x) = (y / 2, x / 2);
        }
        let inter = pick_inter(aug.inter, (size, size), (dh, dw), rng);
        img = resized(&cropped(&img, y, x, size, size), dh, dw, inter)?;
        done = true;
    }
    if !done {
        let inter = pick_inter(aug.inter, (img.h, img.w), (dh, dw), rng);
        if img.h < dh {
            let nw = (dh as f32 / img.h as f32 * img.w as f32) as usize;
            img = resized(&img, dh, nw.max(1), inter)?;
        }
        if img.w < dw {
            let nh = (dw as f32 / img.w as f32 * img.h as f32) as usize;
            img = resized(&img, nh.max(1), dw, inter)?;
        }
        if img.h < dh || img.w < dw {
            return Err(Error::mxnet(format!(
                "input image size {}x{} smaller than input shape {dh}x{dw}",
                img.h, img.w
            )));
        }
        let (mut y, mut x) = (img.h - dh, img.w - dw);
        if aug.rand_crop {
            (y, x) = (rng.int(0, y), rng.int(0, x));
        } else {
            (y, x) = (y / 2, x / 2);
        }
        img = cropped(&img, y, x, dh, dw);
    }
    if img.c >= 3 {
        color_jitter(aug, &mut img, rng);
        hsl_noise(aug, &mut img, rng);
        pca_noise(aug, &mut img, rng);
    }
    Ok(img)
}

/// Brightness, contrast and saturation in a random order (stock's `convertTo` and
/// `addWeighted`, saturating to 8 bits).
fn color_jitter(aug: &Augment, img: &mut Image, rng: &mut Rng) {
    if aug.brightness <= 0.0 && aug.contrast <= 0.0 && aug.saturation <= 0.0 {
        return;
    }
    let alpha_b = 1.0 + rng.uniform(-aug.brightness, aug.brightness);
    let alpha_c = 1.0 + rng.uniform(-aug.contrast, aug.contrast);
    let alpha_s = 1.0 + rng.uniform(-aug.saturation, aug.saturation);
    let mut order = [0, 1, 2];
    rng.shuffle(&mut order);
    let c = img.c;
    for step in order {
        match step {
            0 => img.data.iter_mut().for_each(|v| *v = imgproc::saturate_u8(*v as f32 * alpha_b)),
            1 => {
                let n = (img.h * img.w) as f64;
                let mean = img.data.chunks_exact(c).map(|px| gray_of(px) as f64).sum::<f64>() / n;
                let shift = (1.0 - alpha_c) * mean as f32;
                img.data.iter_mut().for_each(|v| *v = imgproc::saturate_u8(*v as f32 * alpha_c + shift));
            }
            _ => {
                for px in img.data.chunks_exact_mut(c) {
                    let g = gray_of(px) as f32 * (1.0 - alpha_s);
                    for v in &mut px[..3] {
                        *v = imgproc::saturate_u8(*v as f32 * alpha_s + g);
                    }
                }
            }
        }
    }
}

/// OpenCV's 8-bit BGR → HLS (hue in [0, 180)).
fn bgr_to_hls(px: &[u8]) -> [f32; 3] {
    let (b, g, r) = (px[0] as f32 / 255.0, px[1] as f32 / 255.0, px[2] as f32 / 255.0);
    let (max, min) = (r.max(g).max(b), r.min(g).min(b));
    let l = (max + min) / 2.0;
    let (mut h, mut s) = (0.0, 0.0);
    let d = max - min;
    if d > f32::EPSILON {
        s = if l < 0.5 { d / (max + min) } else { d / (2.0 - max - min) };
        h = if max == r {
            (g - b) / d
        } else if max == g {
            2.0 + (b - r) / d
        } else {
            4.0 + (r - g) / d
        } * 60.0;
        if h < 0.0 {
            h += 360.0;
        }
    }
    [
        imgproc::saturate_u8(h / 2.0) as f32,
        imgproc::saturate_u8(l * 255.0) as f32,
        imgproc::saturate_u8(s * 255.0) as f32,
    ]
}

/// OpenCV's 8-bit HLS → BGR.
fn hls_to_bgr(hls: [f32; 3], px: &mut [u8]) {
    let (h, l, s) = (hls[0] * 2.0, hls[1] / 255.0, hls[2] / 255.0);
    let (r, g, b) = if s == 0.0 {
        (l, l, l)
    } else {
        let q = if l <= 0.5 { l * (1.0 + s) } else { l + s - l * s };
        let p = 2.0 * l - q;
        let hue = |mut t: f32| {
            t = t.rem_euclid(360.0);
            if t < 60.0 {
                p + (q - p) * t / 60.0
            } else if t < 180.0 {
                q
            } else if t < 240.0 {
                p + (q - p) * (240.0 - t) / 60.0
            } else {
                p
            }
        };
        (hue(h + 120.0), hue(h), hue(h - 120.0))
    };
    px[0] = imgproc::saturate_u8(b * 255.0);
    px[1] = imgproc::saturate_u8(g * 255.0);
    px[2] = imgproc::saturate_u8(r * 255.0);
}

/// Random shifts in HLS space (stock's `random_h/s/l`).
fn hsl_noise(aug: &Augment, img: &mut Image, rng: &mut Rng) {
    if aug.hsl == [0, 0, 0] {
        return;
    }
    let mut draw = |limit: i64| {
        let r = (rng.unit() + 4.0 * rng.unit()) / 5.0;
        (r * limit as f32 * 2.0 - limit as f32) as i64
    };
    let (h, s, l) = (draw(aug.hsl[0]), draw(aug.hsl[1]), draw(aug.hsl[2]));
    shift_hls(img, [h, l, s]);
}

/// Add `shift` (hue, lightness, saturation) to each pixel in OpenCV's 8-bit HLS space,
/// clamped to its range.
pub(super) fn shift_hls(img: &mut Image, shift: [i64; 3]) {
    let limit = [180.0, 255.0, 255.0];
    for px in img.data.chunks_exact_mut(img.c) {
        let mut hls = bgr_to_hls(px);
        for k in 0..3 {
            hls[k] = (hls[k] + shift[k] as f32).clamp(0.0, limit[k]);
        }
        hls_to_bgr(hls, px);
    }
}

/// AlexNet-style PCA lighting noise (stock's eigenvectors scaled by eigenvalues).
fn pca_noise(aug: &Augment, img: &mut Image, rng: &mut Rng) {
    if aug.pca_noise <= 0.0 {
        return;
    }
    const EIG: [[f32; 3]; 3] = [
        [55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
        [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
        [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203],
    ];
    let alpha = [rng.normal(aug.pca_noise), rng.normal(aug.pca_noise), rng.normal(aug.pca_noise)];
    let rgb: Vec<f32> = EIG.iter().map(|row| row.iter().zip(&alpha).map(|(e, a)| e * a).sum()).collect();
    let bgr = [rgb[2], rgb[1], rgb[0]];
    for px in img.data.chunks_exact_mut(img.c) {
        for k in 0..3 {
            // As stock: the sum in float, truncated to an integer, then clamped.
            px[k] = ((px[k] as f32 + bgr[k]) as i32).clamp(0, 255) as u8;
        }
    }
}

/// Write an augmented `(height, width, c)` BGR(A) image into one batch slot as
/// `(c, height, width)` planes in RGB(A) order, normalised for the output dtype.
fn normalize(cfg: &Config, img: &Image, rng: &mut Rng, out: &mut [u8]) {
    let n = &cfg.norm;
    let (h, w, c) = (img.h, img.w, img.c);
    let mirrored = (n.rand_mirror && rng.unit() < 0.5) || n.mirror;
    // Stock draws both even when their ranges are 0; so does this.
    let contrast = (rng.unit() * n.max_contrast * 2.0 - n.max_contrast + 1.0) * n.scale;
    let illumination = (rng.unit() * n.max_illumination * 2.0 - n.max_illumination) * n.scale;
    let swap: &[usize] = match c {
        1 => &[0],
        3 => &[2, 1, 0],
        _ => &[2, 1, 0, 3],
    };
    let plane = h * w;
    for (k, &src) in swap.iter().enumerate() {
        let (mult, bias) = (contrast / n.std[k], illumination / n.std[k]);
        let mean_int = n.mean[k].round() as i32;
        for i in 0..h {
            for j in 0..w {
                let v = img.data[(i * w + j) * c + src];
                let jj = if mirrored { w - 1 - j } else { j };
                let at = k * plane + i * w + jj;
                match cfg.dtype {
                    DType::U8 => out[at] = v,
                    DType::I8 => {
                        let m = match &n.mean_img {
                            Some(mi) => mi[k * plane + i * w + j].round() as i32,
                            None => mean_int,
                        };
                        out[at] = (v as i32 - m).clamp(-128, 127) as i8 as u8;
                    }
                    _ => {
                        let m = n.mean_img.as_ref().map_or(n.mean[k], |mi| mi[k * plane + i * w + j]);
                        let x = (v as f32 - m) * mult + bias;
                        out[at * 4..at * 4 + 4].copy_from_slice(&x.to_ne_bytes());
                    }
                }
            }
        }
    }
}

/// Decode, augment and normalise one record into `slot`; returns its labels.
fn process(cfg: &Config, bytes: &[u8], seed: u64, slot: &mut [u8]) -> Result<(Vec<f32>, u64)> {
    let rec = parse_record(bytes)?;
    let want = match cfg.channels {
        1 => Channels::Gray,
        3 => Channels::Bgr,
        _ => Channels::Unchanged,
    };
    let img = imgproc::decode(rec.image, want)?;
    if img.c != cfg.channels {
        return Err(Error::mxnet(format!(
            "Invalid image with index {}. Expected {} channels, got {}",
            rec.id, cfg.channels, img.c
        )));
    }
    let labels = match &cfg.labels {
        Some(map) => map
            .get(&rec.id)
            .cloned()
            .ok_or_else(|| Error::mxnet(format!("fail to find imagelabel for id {}", rec.id)))?,
        None if rec.labels.len() == cfg.label_width => rec.labels,
        None => {
            return Err(Error::mxnet(format!(
                "rec file provide {}-dimensional label but label_width is set to {}",
                rec.labels.len(),
                cfg.label_width
            )))
        }
    };
    let mut rng = Rng::new(seed);
    let img = augment(cfg, img, &mut rng)?;
    normalize(cfg, &img, &mut rng, slot);
    Ok((labels, rec.id))
}

/// Load a mean image file (one `(channels, height, width)` array), or compute one over the
/// part's images and save it there, as stock does when the file does not exist.
fn mean_image(cfg: &Config, offsets: &[u64], path: &str) -> Result<Vec<f32>> {
    let unit = cfg.unit();
    if let Ok(bytes) = std::fs::read(path) {
        let (arrays, _) = crate::ndarray::io::load_list(&bytes, crate::ndarray::io::Semantics::Legacy)?;
        let [a] = arrays.as_slice() else {
            return Err(Error::mxnet(format!("Invalid mean image file format: {path} holds {} arrays", arrays.len())));
        };
        if a.shape != [cfg.channels, cfg.height, cfg.width] || a.dtype != DType::F32 {
            return Err(Error::mxnet(format!(
                "the mean image {path} has shape {:?} {}, the data (channels, height, width) {:?} float32",
                a.shape,
                a.dtype.name(),
                [cfg.channels, cfg.height, cfg.width]
            )));
        }
        let b = a.to_host_bytes()?;
        return Ok(b.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect());
    }
    let mut fcfg = cfg.clone();
    fcfg.dtype = DType::F32;
    let mut sum = vec![0f64; unit];
    let mut reader = RecordReader::open(&cfg.rec)?;
    let (mut buf, mut slot) = (Vec::new(), vec![0u8; unit * 4]);
    for (k, &at) in offsets.iter().enumerate() {
        reader.seek(at)?;
        reader.read_record(&mut buf)?;
        process(&fcfg, &buf, k as u64, &mut slot)?;
        for (s, c) in sum.iter_mut().zip(slot.chunks_exact(4)) {
            *s += f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64;
        }
    }
    let n = offsets.len().max(1) as f64;
    let mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
    let arr = NDArray::from_host_bytes(vec![cfg.channels, cfg.height, cfg.width], DType::F32, &f32_bytes(&mean))?;
    let file = crate::ndarray::io::save_list(&[arr], Some(&["mean_img".to_string()]), false)?;
    crate::profiler::trace::write_atomic(path, &file)?;
    Ok(mean)
}

fn create(a: &Attrs, default_dtype: DType) -> Result<Box<dyn DataIter>> {
    let p = RecParams::of(a);
    let mut cfg = Config::new(a, default_dtype)?;
    let offsets = part_offsets(a.op, &cfg.rec, p.path_imgidx, p.num_parts, p.part_index)?;
    if !p.mean_img.is_empty() && cfg.dtype != DType::U8 {
        cfg.norm.mean_img = Some(std::sync::Arc::new(mean_image(&cfg, &offsets, p.mean_img)?));
    }
    let depth = usize::try_from(p.prefetch_buffer).unwrap_or(1).clamp(1, 64);
    let batching = Batching {
        rec: cfg.rec.clone(),
        shape: [cfg.channels, cfg.height, cfg.width],
        dtype: cfg.dtype,
        batch: cfg.batch,
        label_width: cfg.label_width,
        label_2d: false,
        round_batch: cfg.round_batch,
        threads: cfg.threads,
        shuffle: cfg.shuffle,
        seed: cfg.seed,
        aug_seed: cfg.aug_seed,
    };
    let process = Arc::new(move |bytes: &[u8], seed: u64, slot: &mut [u8]| process(&cfg, bytes, seed, slot));
    Ok(Box::new(Prefetcher::start(a.op, BatchReader::new(batching, process, offsets)?, depth)?))
}

pub(super) fn create_f32(a: &Attrs) -> Result<Box<dyn DataIter>> {
    create(a, DType::F32)
}

pub(super) fn create_u8(a: &Attrs) -> Result<Box<dyn DataIter>> {
    create(a, DType::U8)
}

pub(super) fn create_i8(a: &Attrs) -> Result<Box<dyn DataIter>> {
    create(a, DType::I8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_their_headers_and_labels() {
        let mut rec = Vec::new();
        rec.extend(2u32.to_le_bytes());
        rec.extend(0f32.to_le_bytes());
        rec.extend(7u64.to_le_bytes());
        rec.extend(0u64.to_le_bytes());
        rec.extend(1.5f32.to_le_bytes());
        rec.extend(2.5f32.to_le_bytes());
        rec.extend(b"img");
        let r = parse_record(&rec).unwrap();
        assert_eq!((r.labels, r.id, r.image), (vec![1.5, 2.5], 7, &b"img"[..]));
        rec[0] = 9;
        assert!(parse_record(&rec).is_err(), "more labels than bytes");
        assert!(parse_record(&rec[..10]).is_err());
    }

    #[test]
    fn hls_round_trips_and_the_rng_is_in_range() {
        for px in [[10u8, 200, 30], [0, 0, 0], [255, 255, 255], [128, 64, 250]] {
            let mut out = [0u8; 3];
            hls_to_bgr(bgr_to_hls(&px), &mut out);
            for k in 0..3 {
                assert!((out[k] as i32 - px[k] as i32).abs() <= 3, "{px:?} -> {out:?}");
            }
        }
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let (u, i) = (r.unit(), r.int(3, 5));
            assert!((0.0..1.0).contains(&u) && (3..=5).contains(&i));
        }
    }
}
