//! `Convolution` (1-D, 2-D and 3-D, channel-first layouts) and its CPU algorithms.
//!
//! Owns: the parameter schema (stock names and defaults), shape inference, and the
//! algorithms chosen per problem by [`crate::op::tune`]: `direct` (no workspace; per output
//! plane, each filter tap adds a scaled input row) and `im2col_gemm` (unfolds one image/group
//! into a column matrix and multiplies with the shared GEMM helper; 1×1 unit-stride
//! convolutions multiply the input directly). Large images are unfolded in tiles of output
//! rows whose column matrix stays in cache, each multiplied straight into its columns of
//! the output planes. Float32 3×3 stride-1 layers also have `winograd`
//! ([`super::winograd`], on at most `MXNET_CPU_NNPACK_NTHREADS` threads). All are
//! deterministic: each output element is summed in a fixed order on one thread. Work is
//! split over (image, group[, tile]) or (image, filter) tasks on the kernel pool; a single
//! task too small to tile lets the GEMM use the pool instead.

use super::linalg::{gemm, GemmElem};
use super::nn::{bn_scale_shift, read_f64, Real};
use super::winograd::Units;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, par_items, par_tasks_mut, parts, Cost};
use crate::op::param::op_params;
use crate::op::param::Attrs;
use crate::op::resource::Scratch;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::tune::{self, AlgoInfo, Request};
use crate::op::{FuseStep, Fusion, Grad, Inputs, Meta, OpCtx, OpDef, Resource};
use half::f16;

op_params! {
    pub(super) struct ConvParams<'a> => CONV_PARAMS {
        kernel: &'a [i64] = required, "Convolution kernel size: (w,), (h, w) or (d, h, w)";
        stride: &'a [i64] = "[]", "Convolution stride: (w,), (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        dilate: &'a [i64] = "[]", "Convolution dilate: (w,), (h, w) or (d, h, w). Defaults to 1 for each dimension.";
        pad: &'a [i64] = "[]", "Zero pad for convolution: (w,), (h, w) or (d, h, w). Defaults to no padding.";
        num_filter: i64 = required, "Convolution filter(channel) number";
        num_group: i64 = "1", "Number of group partitions.";
        workspace: i64 = "1024", "Maximum temporary workspace allowed (MB) in convolution.";
        no_bias: bool = "False", "Whether to disable bias parameter.";
        cudnn_tune: Option<&'a str> = "None" in ["fastest", "limited_workspace", "off"], "Whether to pick convolution algo by running performance test.";
        cudnn_off: bool = "False", "Turn off cudnn for this layer.";
        layout: Option<&'a str> = "None" in ["NCDHW", "NCHW", "NCW", "NDHWC", "NHWC"], "Set layout for input, output and weight. Empty for\n    default layout: NCW for 1d, NCHW for 2d and NCDHW for 3d.";
    }
}

/// A convolution problem with spatial dimensions widened to three (leading size-1 ones).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) f: usize,
    pub(super) g: usize,
    pub(super) input: [usize; 3],
    pub(super) kernel: [usize; 3],
    pub(super) stride: [usize; 3],
    pub(super) dilate: [usize; 3],
    pub(super) pad: [usize; 3],
    pub(super) output: [usize; 3],
    out_shape: Vec<usize>,
    weight_shape: Vec<usize>,
}

impl Plan {
    pub(super) fn cg(&self) -> usize {
        self.c / self.g
    }
    pub(super) fn fg(&self) -> usize {
        self.f / self.g
    }
    pub(super) fn ksize(&self) -> usize {
        self.kernel.iter().product()
    }
    pub(super) fn isz(&self) -> usize {
        self.input.iter().product()
    }
    pub(super) fn osz(&self) -> usize {
        self.output.iter().product()
    }
    /// Rows of the column matrix (= the reduced dimension of the GEMM).
    pub(super) fn kdim(&self) -> usize {
        self.cg() * self.ksize()
    }
    /// 1×1 unit-stride unpadded: the input planes are the column matrix. (`input ==
    /// output` follows from the rest, for cropped plans too; kept as the guard of the plane
    /// copies that rely on it.)
    pub(super) fn is_pointwise(&self) -> bool {
        self.kernel == [1; 3] && self.stride == [1; 3] && self.pad == [0; 3] && self.input == self.output
    }
    pub(super) fn flops(&self) -> f64 {
        2.0 * (self.n * self.f * self.osz() * self.kdim()) as f64
    }
    /// Whether this is an unpadded 2-D (or 1-D) convolution with unit column stride: every
    /// tap reads inside the input, and each output row reads one contiguous input run, so
    /// [`im2col`] and `col2im` move whole rows without bounds checks.
    pub(super) fn unpadded_2d(&self) -> bool {
        self.input[0] == 1 && self.kernel[0] == 1 && self.pad == [0; 3] && self.stride[2] == 1
    }
}

/// `dst = src` for the short rows of convolution unfolding: whole 8-element blocks inline
/// (a library `memcpy` call per row of 8–24 elements costs more than the copy).
#[inline(always)]
pub(super) fn copy_row<T: Copy>(dst: &mut [T], src: &[T]) {
    let src = &src[..dst.len()];
    let (mut d, mut s) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
    for (a, b) in (&mut d).zip(&mut s) {
        let block: [T; 8] = b.try_into().expect("an 8-element chunk");
        a.copy_from_slice(&block);
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a = *b;
    }
}

pub(super) fn widen(op: &str, name: &str, v: &[i64], nsp: usize, default: usize, min: i64) -> Result<[usize; 3]> {
    let mut r = [default; 3];
    if v.is_empty() {
        return Ok(r);
    }
    if v.len() != nsp {
        return Err(Error::value(format!("operator {op}: {name} {v:?} must have {nsp} entries like kernel")));
    }
    for (i, &x) in v.iter().enumerate() {
        if x < min {
            return Err(Error::value(format!("operator {op}: {name} {v:?} must have entries >= {min}")));
        }
        r[3 - nsp + i] = x as usize;
    }
    Ok(r)
}

pub(super) fn plan(a: &Attrs, data: &[usize]) -> Result<Plan> {
    let params = ConvParams::of(a);
    let op = a.op;
    let k = params.kernel;
    let nsp = k.len();
    if !(1..=3).contains(&nsp) {
        return Err(Error::value(format!("operator {op}: kernel {k:?} must have 1, 2 or 3 entries")));
    }
    if data.len() != nsp + 2 {
        return Err(Error::value(format!(
            "operator {op}: data of shape {data:?} must be {}-D for a {nsp}-D kernel",
            nsp + 2
        )));
    }
    if let Some(layout) = params.layout.filter(|l| !l.starts_with("NC")) {
        return Err(Error::not_supported(format!("operator {op} with layout {layout} (channel-first layouts only)")));
    }
    let kernel = widen(op, "kernel", k, nsp, 1, 1)?;
    let stride = widen(op, "stride", params.stride, nsp, 1, 1)?;
    let dilate = widen(op, "dilate", params.dilate, nsp, 1, 1)?;
    let pad = widen(op, "pad", params.pad, nsp, 0, 0)?;
    let (f, g) = (params.num_filter, params.num_group);
    if f < 1 || g < 1 {
        return Err(Error::value(format!("operator {op}: num_filter ({f}) and num_group ({g}) must be positive")));
    }
    let (f, g) = (f as usize, g as usize);
    let (n, c) = (data[0], data[1]);
    if c % g != 0 || f % g != 0 {
        return Err(Error::value(format!(
            "operator {op}: channels ({c}) and num_filter ({f}) must be divisible by num_group ({g})"
        )));
    }
    if params.workspace < 0 {
        return Err(Error::value(format!("operator {op}: workspace must be >= 0")));
    }
    let mut input = [1; 3];
    input[3 - nsp..].copy_from_slice(&data[2..]);
    Plan::build(op, nsp, [n, c, f, g], input, kernel, stride, dilate, pad)
}

impl Plan {
    /// The convolution of `[n, c, *input]` data by `f` filters in `g` groups (`nsp` spatial
    /// dimensions, widened to three); checks that the padded input holds the kernel.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build(
        op: &str,
        nsp: usize,
        [n, c, f, g]: [usize; 4],
        input: [usize; 3],
        kernel: [usize; 3],
        stride: [usize; 3],
        dilate: [usize; 3],
        pad: [usize; 3],
    ) -> Result<Plan> {
        let mut output = [1; 3];
        for d in 0..3 {
            let span = dilate[d] * (kernel[d] - 1) + 1;
            let padded = input[d] + 2 * pad[d];
            if span > padded {
                return Err(Error::value(format!(
                    "operator {op}: kernel {:?} (dilate {:?}) is larger than the padded input {:?}",
                    &kernel[3 - nsp..],
                    &dilate[3 - nsp..],
                    &input[3 - nsp..]
                )));
            }
            output[d] = (padded - span) / stride[d] + 1;
        }
        let mut out_shape = vec![n, f];
        out_shape.extend_from_slice(&output[3 - nsp..]);
        let mut weight_shape = vec![f, c / g];
        weight_shape.extend_from_slice(&kernel[3 - nsp..]);
        Ok(Plan { n, c, f, g, input, kernel, stride, dilate, pad, output, out_shape, weight_shape })
    }
}

/// The taps of a plan that may read the input: per dimension the range `first..end` of
/// kernel positions. The taps before it read only the padding before the input for every
/// output, those after it only the padding after (ResNet's 3×3 layers on 1×1 maps at the
/// end of a network fed small images: 8 of 9 taps), and a convolution without them has the
/// same values for finite weights (a non-finite weight on a dead tap no longer makes NaNs of
/// its zero products; stock's oneDNN skips such taps too), up to the GEMM's summation order. Taps inside the range whose windows stride
/// over the input are kept: they read zeros.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LiveTaps {
    first: [usize; 3],
    end: [usize; 3],
}

impl Plan {
    /// The live taps when some taps read only padding: `None` when no tap is found dead
    /// or when every tap is. Dilated dimensions keep all their taps (cropped, they could
    /// leave reads past the input's end with no padding before it, which
    /// [`Plan::unpadded_2d`]'s kernels do not check).
    pub(super) fn live_taps(&self) -> Option<LiveTaps> {
        let (mut first, mut end) = ([0; 3], self.kernel);
        for d in 0..3 {
            if self.dilate[d] != 1 {
                continue;
            }
            let (i, o, s, p, k) = (self.input[d], self.output[d], self.stride[d], self.pad[d], self.kernel[d]);
            // Tap t reads t - p + y·s for y in 0..o: all before the input when
            // (o - 1)·s + t < p, all after it when t ≥ i + p (o ≥ 1: `build` checks that
            // the kernel fits).
            let lo = p.saturating_sub((o - 1) * s).min(k);
            let hi = (i + p).min(k);
            if lo >= hi {
                return None;
            }
            (first[d], end[d]) = (lo, hi);
        }
        (first != [0; 3] || end != self.kernel).then_some(LiveTaps { first, end })
    }

    /// This plan without the taps outside `live`: the kernel cut, the padding before the
    /// first live tap removed, the same output.
    pub(super) fn cropped(&self, live: &LiveTaps) -> Plan {
        let mut p = self.clone();
        for d in 0..3 {
            p.kernel[d] = live.end[d] - live.first[d];
            // live_taps keeps first ≤ pad: a tap before it read only padding.
            p.pad[d] -= live.first[d];
        }
        let nsp = self.weight_shape.len() - 2;
        p.weight_shape.truncate(2);
        p.weight_shape.extend_from_slice(&p.kernel[3 - nsp..]);
        p
    }
}

impl LiveTaps {
    /// Each (filter, channel) block's live taps, as `(offset in the full block, offset in
    /// the cropped block, run length)` of contiguous rows along the last dimension.
    fn runs(&self, kernel: [usize; 3]) -> Vec<(usize, usize, usize)> {
        let (mut runs, mut at) = (Vec::new(), 0);
        let len = self.end[2] - self.first[2];
        for z in self.first[0]..self.end[0] {
            for y in self.first[1]..self.end[1] {
                runs.push(((z * kernel[1] + y) * kernel[2] + self.first[2], at, len));
                at += len;
            }
        }
        runs
    }

    /// The weight of the cropped plan (`full`: the weight of plan `p`).
    pub(super) fn crop_weight<T: Elem>(&self, p: &Plan, full: &[T]) -> Vec<T> {
        let mut out = vec![T::zero(); p.f * p.cg() * self.runs(p.kernel).iter().map(|r| r.2).sum::<usize>()];
        self.copy_blocks(p, full, &mut out, true);
        out
    }

    /// Spread the cropped plan's weight gradient `cropped` back over the full kernel of `p`
    /// (`full` is overwritten; the dead taps' gradient is zero).
    pub(super) fn spread_weight<T: Elem>(&self, p: &Plan, cropped: &[T], full: &mut [T]) {
        self.copy_blocks(p, cropped, full, false);
    }

    /// Copy each (filter, channel) block's live taps from `src` to `dst`, on the kernel pool
    /// (a strided pass over the whole weight: 9.4 MB for ResNet's 512-filter 3×3 layers):
    /// full blocks to cropped ones when `cut`, else back, with zeros for the dead taps.
    fn copy_blocks<T: Elem>(&self, p: &Plan, src: &[T], dst: &mut [T], cut: bool) {
        let (ksize, runs) = (p.ksize(), self.runs(p.kernel));
        let csize: usize = runs.iter().map(|r| r.2).sum();
        let (sblock, dblock) = if cut { (ksize, csize) } else { (csize, ksize) };
        par_for_mut(dst, dblock, Cost(2.0 * ksize as f64), T::DTYPE, |blocks, part| {
            if !cut {
                part.fill(T::zero());
            }
            let src = src[blocks.start * sblock..blocks.end * sblock].chunks_exact(sblock);
            for (s, d) in src.zip(part.chunks_exact_mut(dblock)) {
                for &(at_full, at_cut, len) in &runs {
                    let (from, to) = if cut { (at_full, at_cut) } else { (at_cut, at_full) };
                    // Element by element: runs are a kernel row or shorter, where a memcpy
                    // call per run costs more than the copy.
                    for (dv, sv) in d[to..to + len].iter_mut().zip(&s[from..from + len]) {
                        *dv = *sv;
                    }
                }
            }
        });
    }
}

fn conv_inputs(a: &Attrs) -> usize {
    let params = ConvParams::of(a);
    if params.no_bias {
        2
    } else {
        3
    }
}

fn conv_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let dt = super::common::floats_like_first(op, ins)?;
    let p = plan(a, &ins[0].shape)?;
    if ins[1].shape != p.weight_shape {
        return Err(Error::value(format!(
            "operator {op}: weight has shape {:?}, expected {:?}",
            ins[1].shape, p.weight_shape
        )));
    }
    if ins.len() > 2 && ins[2].shape != [p.f] {
        return Err(Error::value(format!("operator {op}: bias has shape {:?}, expected ({},)", ins[2].shape, p.f)));
    }
    Ok(vec![Meta::new(p.out_shape, dt)])
}

/// For one output row along w: the range of output columns whose input column
/// `ox*stride + offset` lies inside `[0, iw)`.
fn valid_cols(ow: usize, iw: usize, stride: usize, offset: isize) -> (usize, usize) {
    let s = stride as isize;
    // Smallest ox with ox*s + offset >= 0.
    let lo = if offset >= 0 { 0 } else { ((-offset) + s - 1) / s };
    // Largest ox with ox*s + offset <= iw - 1, plus one.
    let last = iw as isize - 1 - offset;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let lo = (lo.max(0) as usize).min(ow);
    (lo, (hi.max(0) as usize).min(ow).max(lo))
}

/// Visit each (output row, input row) pair of one filter tap: `f(out_row_start, in_row_start,
/// lo, hi, x_offset)` with output columns `lo..hi` reading input column `ox*sw + x_offset`.
#[inline(always)]
pub(super) fn for_tap_rows(
    p: &Plan,
    kz: usize,
    ky: usize,
    kx: usize,
    f: impl FnMut(usize, usize, usize, usize, isize),
) {
    for_tap_rows_in(p, 0..p.output[0] * p.output[1], kz, ky, kx, f)
}

/// [`for_tap_rows`] over the output rows `rows` only (rows of `ow` positions, numbered
/// through the depth: row `oz · oh + oy`).
#[inline(always)]
pub(super) fn for_tap_rows_in(
    p: &Plan,
    rows: std::ops::Range<usize>,
    kz: usize,
    ky: usize,
    kx: usize,
    mut f: impl FnMut(usize, usize, usize, usize, isize),
) {
    let [id, ih, iw] = p.input;
    let [_, oh, ow] = p.output;
    let xoff = (kx * p.dilate[2]) as isize - p.pad[2] as isize;
    let (lo, hi) = valid_cols(ow, iw, p.stride[2], xoff);
    for r in rows {
        let (oz, oy) = (r / oh, r % oh);
        let iz = (oz * p.stride[0] + kz * p.dilate[0]) as isize - p.pad[0] as isize;
        let iy = (oy * p.stride[1] + ky * p.dilate[1]) as isize - p.pad[1] as isize;
        if iz < 0 || iz >= id as isize || iy < 0 || iy >= ih as isize {
            continue;
        }
        f(r * ow, (iz as usize * ih + iy as usize) * iw, lo, hi, xoff);
    }
}

/// The taps of the kernel in weight order.
pub(super) fn taps(p: &Plan) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let [kd, kh, kw] = p.kernel;
    (0..kd).flat_map(move |z| (0..kh).flat_map(move |y| (0..kw).map(move |x| (z, y, x))))
}

/// Direct algorithm: one task per (image, filter).
fn direct<T: Elem, R: Real>(p: &Plan, x: &[T], w: &[T], bias: Option<&[T]>, post: &Post<T>, out: &mut [T]) {
    let (cg, fg, ksize, isz, osz) = (p.cg(), p.fg(), p.ksize(), p.isz(), p.osz());
    let sw = p.stride[2];
    par_tasks_mut(&mut out[..p.n * p.f * osz], osz, p.flops() * 0.3, T::DTYPE, |t, ob| {
        let (img, fi) = (t / p.f, t % p.f);
        let gi = fi / fg;
        let mut acc = vec![R::of(bias.map_or(0.0, |b| b[fi].to_f64())); osz];
        for ci in 0..cg {
            let plane = &x[(img * p.c + gi * cg + ci) * isz..][..isz];
            let wt = &w[(fi * cg + ci) * ksize..][..ksize];
            for (ti, (kz, ky, kx)) in taps(p).enumerate() {
                let wv = R::load(wt[ti]);
                for_tap_rows(p, kz, ky, kx, |orow, irow, lo, hi, xoff| {
                    let a = &mut acc[orow + lo..orow + hi];
                    let start = (irow as isize + (lo * sw) as isize + xoff) as usize;
                    if sw == 1 {
                        for (av, &iv) in a.iter_mut().zip(&plane[start..start + (hi - lo)]) {
                            *av = *av + wv * R::load(iv);
                        }
                    } else {
                        for (j, av) in a.iter_mut().enumerate() {
                            *av = *av + wv * R::load(plane[start + j * sw]);
                        }
                    }
                });
            }
        }
        for (ov, a) in ob.iter_mut().zip(acc) {
            *ov = a.store();
        }
        post.apply::<R>(ob, img, fi, 0);
    });
}

/// Unfold one image/group into `col` (kdim rows of osz entries, `ld` apart).
pub(super) fn im2col<T: Elem>(p: &Plan, plane0: &[T], col: &mut [T], ld: usize) {
    im2col_rows(p, plane0, col, ld, 0..p.output[0] * p.output[1])
}

/// Unfold the output rows `rows` ([`for_tap_rows_in`]) of one image/group into `col`: kdim
/// rows of `rows.len() · ow` entries, `ld` apart.
pub(super) fn im2col_rows<T: Elem>(p: &Plan, plane0: &[T], col: &mut [T], ld: usize, rows: std::ops::Range<usize>) {
    let (isz, sw, ow) = (p.isz(), p.stride[2], p.output[2]);
    let (width, first) = (rows.len() * ow, rows.start * ow);
    if p.unpadded_2d() {
        let iw = p.input[2];
        let mut row = 0;
        for ci in 0..p.cg() {
            let plane = &plane0[ci * isz..][..isz];
            for ky in 0..p.kernel[1] {
                for kx in 0..p.kernel[2] {
                    let crow = &mut col[row * ld..][..width];
                    let base = ky * p.dilate[1] * iw + kx * p.dilate[2];
                    for (oy, dst) in rows.clone().zip(crow.chunks_exact_mut(ow)) {
                        copy_row(dst, &plane[base + oy * p.stride[1] * iw..]);
                    }
                    row += 1;
                }
            }
        }
        return;
    }
    // Without padding every tap reads inside the input, so every entry is written below.
    let padded = p.pad.iter().any(|&x| x > 0);
    let mut row = 0;
    for ci in 0..p.cg() {
        let plane = &plane0[ci * isz..][..isz];
        for (kz, ky, kx) in taps(p) {
            let crow = &mut col[row * ld..][..width];
            if padded {
                crow.fill(T::zero());
            }
            for_tap_rows_in(p, rows.clone(), kz, ky, kx, |orow, irow, lo, hi, xoff| {
                let start = (irow as isize + (lo * sw) as isize + xoff) as usize;
                let orow = orow - first;
                let dst = &mut crow[orow + lo..orow + hi];
                if sw == 1 {
                    dst.copy_from_slice(&plane[start..start + (hi - lo)]);
                } else {
                    for (j, d) in dst.iter_mut().enumerate() {
                        *d = plane[start + j * sw];
                    }
                }
            });
            row += 1;
        }
    }
}

/// Parallel slots of im2col + GEMM: one per kernel thread, each with its own column matrix.
fn im2col_slots(p: &Plan, threads: usize) -> usize {
    threads.min(p.n * p.g).max(1)
}

/// A product with fewer columns than this runs the GEMM below its speed (its packed weight
/// panels are reused over too few columns), so small images are unfolded several at a time.
const MIN_GEMM_COLS: usize = 1024;

/// Workspace elements of one slot of [`batched_gemm`] (16 MiB of float32).
const SLOT_BUDGET_ELEMS: usize = 4 << 20;

/// Images one GEMM multiplies at once (1: one image per product, written in place): for
/// ungrouped convolutions with small outputs, enough images for [`MIN_GEMM_COLS`] columns,
/// in a number of chunks that is a multiple of the threads.
fn images_per_gemm(p: &Plan, threads: usize) -> usize {
    let osz = p.osz().max(1);
    if p.g != 1 || p.n < 2 || 2 * osz >= MIN_GEMM_COLS {
        return 1;
    }
    // Each slot holds the column matrix and the product of its images: at most
    // SLOT_BUDGET_ELEMS, so that a wide layer on many threads does not take hundreds of MB.
    let per_image = (p.kdim() + p.f) * osz;
    let want = MIN_GEMM_COLS.div_ceil(osz).min(SLOT_BUDGET_ELEMS / per_image.max(1));
    if want < 2 {
        return 1;
    }
    let chunks = p.n.div_ceil(want).next_multiple_of(threads.max(1));
    p.n.div_ceil(chunks).max(1)
}

/// Workspace elements of im2col + GEMM: per slot, the column matrix (and, for several images
/// per GEMM, the product before it is laid out as images).
pub(super) fn im2col_workspace(p: &Plan, threads: usize) -> usize {
    let nb = images_per_gemm(p, threads);
    if nb > 1 {
        let slots = threads.min(p.n.div_ceil(nb)).max(1);
        (p.kdim() + p.f) * nb * p.osz() * slots
    } else if p.is_pointwise() {
        0
    } else {
        let t = tiling(p, threads, TILE_ELEMS);
        if t.untiled_single(p, threads) {
            p.kdim() * p.osz()
        } else {
            p.kdim() * t.rows * p.output[2] * t.slots
        }
    }
}

/// `plane += b`, element by element in `R` (each filter's output plane and its bias).
pub(super) fn add_bias<T: Elem, R: Real>(plane: &mut [T], b: T) {
    let bv = R::load(b);
    for v in plane {
        *v = (R::load(*v) + bv).store();
    }
}

/// One fused step ([`FuseStep`]) resolved for a call: its per-filter values or its array.
pub(super) enum PostStep<'a, T> {
    /// BatchNorm's `scale`, `shift` per filter, as its kernel computes them.
    Scale(Vec<f64>, Vec<f64>),
    Relu,
    Clip(T, T),
    /// The other addend, laid out as the output, and whether the value is the first operand.
    Add(&'a [T], bool),
}

/// The steps a fused convolution applies to each output plane after its bias, each with the
/// arithmetic of the operator it replaces (BatchNorm's `x · scale + shift` in `R`,
/// Activation's `max(x, 0)`, clip's two selects, elemwise_add's sum), so the outputs are
/// those of the unfused graph. Empty for a plain convolution.
pub(super) struct Post<'a, T> {
    pub(super) steps: Vec<PostStep<'a, T>>,
    /// Filters and positions per output plane (the residual's layout).
    pub(super) f: usize,
    pub(super) osz: usize,
}

impl<'a, T: Elem> Post<'a, T> {
    pub(super) fn none() -> Self {
        Post { steps: Vec::new(), f: 0, osz: 0 }
    }

    /// `steps` resolved with their inputs `extra` (in order: BatchNorm's four, an addend).
    fn new(op: &str, p: &Plan, steps: &[FuseStep], extra: &'a [TBlob]) -> Result<Self> {
        let mut at = 0;
        let mut take = |k: usize| -> Result<&'a [TBlob]> {
            let got = extra.get(at..at + k).ok_or_else(|| Error::internal(format!("fused {op}: too few inputs")))?;
            at += k;
            Ok(got)
        };
        let mut out = Vec::with_capacity(steps.len());
        for step in steps {
            out.push(match *step {
                FuseStep::Scale { eps, fix_gamma, .. } => {
                    let b = take(4)?;
                    if b.iter().any(|x| x.shape[..] != [p.f]) {
                        return Err(Error::value(format!("fused {op}: BatchNorm parameters are not ({},)", p.f)));
                    }
                    let gamma = if fix_gamma { vec![1.0; p.f] } else { read_f64(op, &b[0])? };
                    let (beta, mean, var) = (read_f64(op, &b[1])?, read_f64(op, &b[2])?, read_f64(op, &b[3])?);
                    let (scale, shift) = bn_scale_shift(&gamma, &beta, &mean, &var, eps);
                    PostStep::Scale(scale, shift)
                }
                FuseStep::Relu => PostStep::Relu,
                FuseStep::Clip { lo, hi } => PostStep::Clip(T::from_f64(lo), T::from_f64(hi)),
                FuseStep::Add { value_first } => {
                    let r = &take(1)?[0];
                    if r.shape.iter().product::<usize>() != p.n * p.f * p.osz() || r.dtype != T::DTYPE {
                        return Err(Error::value(format!("fused {op}: the addend is not shaped as the output")));
                    }
                    PostStep::Add(r.as_slice::<T>(), value_first)
                }
            });
        }
        Ok(Post { steps: out, f: p.f, osz: p.osz() })
    }

    /// Element-wise `steps` (ReLU, clip) applied to `f` planes of `osz` positions per image
    /// (a fused BatchNorm's chain); other steps are skipped: the chain search gives it none.
    pub(super) fn elementwise(steps: &[FuseStep], f: usize, osz: usize) -> Self {
        let steps = steps
            .iter()
            .filter_map(|s| match *s {
                FuseStep::Relu => Some(PostStep::Relu),
                FuseStep::Clip { lo, hi } => Some(PostStep::Clip(T::from_f64(lo), T::from_f64(hi))),
                FuseStep::Scale { .. } | FuseStep::Add { .. } => None,
            })
            .collect();
        Post { steps, f, osz }
    }

    fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Apply the steps to `plane`, the positions `start..` of the output plane of (`image`,
    /// `filter`).
    pub(super) fn apply<R: Real>(&self, plane: &mut [T], image: usize, filter: usize, start: usize) {
        for step in &self.steps {
            match step {
                PostStep::Scale(scale, shift) => {
                    let (sc, sh) = (R::of(scale[filter]), R::of(shift[filter]));
                    for v in plane.iter_mut() {
                        *v = (R::load(*v) * sc + sh).store();
                    }
                }
                PostStep::Relu => {
                    for v in plane.iter_mut() {
                        *v = R::load(*v).max(R::of(0.0)).store();
                    }
                }
                PostStep::Clip(lo, hi) => {
                    let (lo, hi) = (R::load(*lo), R::load(*hi));
                    for v in plane.iter_mut() {
                        let x = R::load(*v);
                        let low = if x < lo { lo } else { x };
                        *v = (if x > hi { hi } else { low }).store();
                    }
                }
                PostStep::Add(r, value_first) => {
                    // In the graph's order: the sums differ only in which NaN payload wins.
                    let src = &r[(image * self.f + filter) * self.osz + start..][..plane.len()];
                    if *value_first {
                        for (v, &a) in plane.iter_mut().zip(src) {
                            *v = (R::load(*v) + R::load(a)).store();
                        }
                    } else {
                        for (v, &a) in plane.iter_mut().zip(src) {
                            *v = (R::load(a) + R::load(*v)).store();
                        }
                    }
                }
            }
        }
    }
}

/// im2col + GEMM with `nb` images per product (ungrouped): the images' column matrices side
/// by side (`kdim × nb·osz`), one GEMM into a product of `f × nb·osz`, then each image's
/// planes copied out with the bias added. Chunks of `nb` images own consecutive output runs.
#[allow(clippy::too_many_arguments)]
fn batched_gemm<T: GemmElem, R: Real>(
    p: &Plan,
    threads: usize,
    nb: usize,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    post: &Post<T>,
    out: &mut [T],
    ws: &mut [T],
) {
    let (osz, kdim, isz, f) = (p.osz(), p.kdim(), p.isz(), p.f);
    let chunks = p.n.div_ceil(nb);
    let slots = threads.min(chunks).max(1);
    let per = chunks.div_ceil(slots);
    let slot_len = (kdim + f) * nb * osz;
    let work: Vec<_> = parts(&mut out[..p.n * f * osz], per * nb * f * osz, slots)
        .into_iter()
        .zip(parts(ws, slot_len, slots))
        .collect();
    par_items(work, p.flops() * 0.1, T::DTYPE, |s, (run, buf)| {
        let (col, prod) = buf.split_at_mut(kdim * nb * osz);
        for (ci, ob) in (s * per..((s + 1) * per).min(chunks)).zip(run.chunks_mut(nb * f * osz)) {
            let (i0, i1) = (ci * nb, ((ci + 1) * nb).min(p.n));
            let cols = (i1 - i0) * osz;
            let col = &mut col[..kdim * cols];
            for b in 0..i1 - i0 {
                let src = &x[(i0 + b) * p.c * isz..][..p.c * isz];
                if p.is_pointwise() {
                    for (row, plane) in src.chunks_exact(isz).enumerate() {
                        col[row * cols + b * osz..][..osz].copy_from_slice(plane);
                    }
                } else {
                    // Every entry of this image's columns is written before the GEMM reads it.
                    im2col(p, src, &mut col[b * osz..], cols);
                }
            }
            let prod = &mut prod[..f * cols];
            gemm(f, cols, kdim, &w[..f * kdim], false, col, false, prod, false);
            for (b, planes) in ob.chunks_exact_mut(f * osz).enumerate() {
                for (fi, plane) in planes.chunks_exact_mut(osz).enumerate() {
                    plane.copy_from_slice(&prod[fi * cols + b * osz..][..osz]);
                    if let Some(bs) = bias {
                        add_bias::<T, R>(plane, bs[fi]);
                    }
                    post.apply::<R>(plane, i0 + b, fi, 0);
                }
            }
        }
    });
}

/// im2col + GEMM over (image, group) items: [`batched_gemm`] for small images, the input
/// planes as the column matrix for pointwise kernels, else [`tiled_gemm`] (or
/// [`single_item`] for one item too small to tile over the threads).
/// `threads`: the thread count the workspace was sized with ([`im2col_workspace`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn im2col_gemm<T: GemmElem, R: Real>(
    p: &Plan,
    threads: usize,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    post: &Post<T>,
    out: &mut [T],
    cols: &mut [T],
) {
    let nb = images_per_gemm(p, threads);
    if nb > 1 {
        return batched_gemm::<T, R>(p, threads, nb, x, w, bias, post, out, cols);
    }
    if p.is_pointwise() {
        return pointwise_gemm::<T, R>(p, threads, x, w, bias, post, out);
    }
    let t = tiling(p, threads, TILE_ELEMS);
    if t.untiled_single(p, threads) {
        return single_item::<T, R>(p, x, w, bias, post, out, &mut cols[..p.kdim() * p.osz()]);
    }
    tiled_gemm::<T, R>(p, t, x, w, bias, post, out, cols)
}

/// Pointwise kernels over (image, group) items, split into [`im2col_slots`] contiguous runs:
/// each item's input planes are its column matrix.
fn pointwise_gemm<T: GemmElem, R: Real>(
    p: &Plan,
    threads: usize,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    post: &Post<T>,
    out: &mut [T],
) {
    let (cg, fg, osz, kdim, isz) = (p.cg(), p.fg(), p.osz(), p.kdim(), p.isz());
    let (items, slots) = (p.n * p.g, im2col_slots(p, threads));
    let per = items.div_ceil(slots);
    // Item t = (image, group) writes the fg output planes at t·fg·osz, so slot s owns the
    // output run of its items.
    par_items(parts(out, per * fg * osz, slots), p.flops() * 0.1, T::DTYPE, |s, run| {
        for (t, ob) in (s * per..((s + 1) * per).min(items)).zip(run.chunks_mut((fg * osz).max(1))) {
            let (img, gi) = (t / p.g, t % p.g);
            let src = &x[(img * p.c + gi * cg) * isz..][..cg * isz];
            gemm(fg, osz, kdim, &w[gi * fg * kdim..][..fg * kdim], false, src, false, ob, false);
            if bias.is_some() || !post.is_empty() {
                for (fi, plane) in ob.chunks_exact_mut(osz).enumerate() {
                    if let Some(b) = bias {
                        add_bias::<T, R>(plane, b[gi * fg + fi]);
                    }
                    post.apply::<R>(plane, img, gi * fg + fi, 0);
                }
            }
        }
    });
}

/// Elements of one tile's column matrix in [`tiled_gemm`] (384 KiB of float32): unfolded a
/// tile at a time, the columns are still in the core's cache when the GEMM reads them (a
/// whole 56×56 image unfolded for a 3×3 kernel over 128 channels is 14 MB, written out to
/// memory and read back).
const TILE_ELEMS: usize = 96 << 10;

/// A tile is at least this many output positions (or the whole image), so that the GEMM
/// keeps its column panels full.
const MIN_TILE_COLS: usize = 96;

/// How [`tiled_gemm`] cuts its work: output rows per tile, tiles per item, parallel slots.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tiling {
    rows: usize,
    tiles: usize,
    slots: usize,
}

impl Tiling {
    /// Whether `p` is one item too small to give each of `threads` a tile: [`single_item`]
    /// runs it whole (the one decision [`im2col_gemm`] and [`im2col_workspace`] share).
    fn untiled_single(&self, p: &Plan, threads: usize) -> bool {
        p.n * p.g == 1 && self.tiles < threads
    }
}

/// The tiling of `p` on `threads` threads for column matrices of about `tile_elems`.
/// Fewer items than threads are cut into at least enough tiles for every thread.
fn tiling(p: &Plan, threads: usize, tile_elems: usize) -> Tiling {
    let ow = p.output[2].max(1);
    let total = (p.output[0] * p.output[1]).max(1);
    let items = (p.n * p.g).max(1);
    let fit = tile_elems / (p.kdim() * ow).max(1);
    let mut rows = fit.max(MIN_TILE_COLS.div_ceil(ow)).clamp(1, total);
    let want = threads.div_ceil(items);
    if items < threads && total.div_ceil(rows) < want {
        // Rounded down, so that the rows make at least `want` tiles (unless a tile would be
        // narrower than the minimum).
        rows = (total / want).max(1).max(MIN_TILE_COLS.div_ceil(ow).min(total));
    }
    let tiles = total.div_ceil(rows);
    Tiling { rows, tiles, slots: threads.min(items * tiles).max(1) }
}

/// im2col + GEMM in tiles of `t.rows` output rows: each (image, group) item's output planes
/// are cut into column blocks (a tile of positions across all its filters); a slot unfolds
/// a tile into its own column matrix (`kdim × t.rows·ow` of `cols`) and multiplies it
/// straight into the block, then adds the bias and the fused steps while the block is
/// still in cache. Slots take consecutive runs of (item, tile) units.
#[allow(clippy::too_many_arguments)]
fn tiled_gemm<T: GemmElem, R: Real>(
    p: &Plan,
    t: Tiling,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    post: &Post<T>,
    out: &mut [T],
    cols: &mut [T],
) {
    let (cg, fg, osz, kdim, isz, ow) = (p.cg(), p.fg(), p.osz(), p.kdim(), p.isz(), p.output[2]);
    let total = p.output[0] * p.output[1];
    let items = p.n * p.g;
    let bounds: Vec<usize> = (0..=t.tiles).map(|i| (i * t.rows).min(total) * ow).collect();
    // Unit u = item · tiles + tile: item (image, group) owns the fg planes at u/tiles·fg·osz.
    let mut units: Vec<_> = out[..items * fg * osz]
        .chunks_mut((fg * osz).max(1))
        .flat_map(|planes| crate::op::kernel::column_blocks(planes, fg, osz, &bounds))
        .collect();
    let per = units.len().div_ceil(t.slots);
    let mut runs = Vec::with_capacity(t.slots);
    for s in (0..t.slots).rev() {
        runs.push(units.split_off((s * per).min(units.len())));
    }
    runs.reverse();
    let col_len = kdim * t.rows * ow;
    let work: Vec<_> = runs.into_iter().zip(parts(cols, col_len, t.slots)).collect();
    par_items(work, p.flops() * 0.1, T::DTYPE, |s, (run, col)| {
        for (u, mut block) in (s * per..).zip(run) {
            let (item, tile) = (u / t.tiles, u % t.tiles);
            let (img, gi) = (item / p.g, item % p.g);
            let src = &x[(img * p.c + gi * cg) * isz..][..cg * isz];
            let width = block.cols();
            let r0 = tile * t.rows;
            let col = &mut col[..kdim * width];
            // Every entry of the tile's column matrix is written before the GEMM reads it.
            im2col_rows(p, src, col, width, r0..r0 + width / ow.max(1));
            let wg = &w[gi * fg * kdim..][..fg * kdim];
            T::mm_block(kdim, (wg, kdim as isize, 1), (col, width as isize, 1), &mut block);
            if bias.is_some() || !post.is_empty() {
                let start = block.col0();
                for fi in 0..fg {
                    let seg = block.row(fi);
                    if let Some(b) = bias {
                        add_bias::<T, R>(seg, b[gi * fg + fi]);
                    }
                    post.apply::<R>(seg, img, gi * fg + fi, start);
                }
            }
        }
    });
}

/// im2col + GEMM of a single (image, group) item (a batch of one) on several threads: the
/// unfolding split by input channels, the GEMM by its own plan and the bias by filters, so
/// that no step runs on one thread while the others wait.
fn single_item<T: GemmElem, R: Real>(
    p: &Plan,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    post: &Post<T>,
    out: &mut [T],
    col: &mut [T],
) {
    let (cg, osz, kdim, isz, ksize) = (p.cg(), p.osz(), p.kdim(), p.isz(), p.ksize());
    let src = &x[..cg * isz];
    // Channel c's rows of the column matrix are rows c·ksize.. (channel-major, then taps).
    par_for_mut(col, ksize * osz, Cost(0.5 * ksize as f64 * osz as f64), T::DTYPE, |chans, part| {
        let mut sub = p.clone();
        sub.c = chans.len();
        sub.g = 1;
        im2col(&sub, &src[chans.start * isz..][..chans.len() * isz], part, osz);
    });
    let out = &mut out[..p.f * osz];
    gemm(p.f, osz, kdim, &w[..p.f * kdim], false, col, false, out, false);
    if bias.is_some() || !post.is_empty() {
        let cost = 0.25 * (1 + post.steps.len()) as f64 * osz as f64;
        par_for_mut(out, osz, Cost(cost), T::DTYPE, |filters, part| {
            for (f, plane) in filters.zip(part.chunks_exact_mut(osz)) {
                if let Some(b) = bias {
                    add_bias::<T, R>(plane, b[f]);
                }
                post.apply::<R>(plane, 0, f, 0);
            }
        });
    }
}

/// The algorithms, in the order [`tune`] indexes them (Winograd's only where it applies).
const DIRECT: usize = 0;
const IM2COL: usize = 1;
const WINOGRAD: usize = 2;

/// Rough seconds of the direct algorithm (per core; only the ratio to [`im2col_estimate`]
/// matters): about 8 GFLOP/s, measured on 3×3 layers.
fn direct_estimate(p: &Plan) -> f64 {
    p.flops() / 8e9
}

/// Rough seconds of im2col + GEMM: the GEMM runs at about 60 GFLOP/s per core when its
/// rows (filters per group) and reduced dimension are 32 or more, and proportionally slower
/// below (a depthwise 3×3 layer is a 1×9 by 9×N product per channel, where direct wins);
/// plus the unfolding at about 4 GB/s.
pub(super) fn im2col_estimate(p: &Plan) -> f64 {
    let eff = (p.fg() as f64 / 32.0).min(1.0) * (p.kdim() as f64 / 32.0).min(1.0);
    let unfold = if p.is_pointwise() { 0.0 } else { (p.n * p.g * p.kdim() * p.osz() * 4) as f64 / 4e9 };
    p.flops() / (60e9 * eff.max(1e-3)) + unfold
}

/// Whether Winograd's algorithm is a candidate for `p` on `dtype` data: float32 only (its
/// rounding differs from the direct sum; float64 is asked for precision).
fn winograd_applies(p: &Plan, dtype: DType) -> bool {
    dtype == DType::F32 && super::winograd::applies(p)
}

/// The threads of the Winograd path: `MXNET_CPU_NNPACK_NTHREADS` of the `threads` the
/// other algorithms use, at most (this build's counterpart of NNPACK's fast convolutions).
pub(super) fn winograd_threads(threads: usize) -> Result<usize> {
    let limit = crate::config::global().get_int("MXNET_CPU_NNPACK_NTHREADS", "Convolution (Winograd)")?;
    Ok(limit.map_or(threads, |n| threads.min(n.max(1) as usize)))
}

/// The candidates for `p` on `threads` threads; `wino`: Winograd's cut of `p` where it is one
/// (`winograd_applies`).
fn algos(p: &Plan, dtype: DType, threads: usize, wino: Option<&Units>) -> Vec<AlgoInfo> {
    let elem = dtype.size();
    let col = im2col_workspace(p, threads) * elem;
    let mut list = vec![
        AlgoInfo { name: "direct", deterministic: true, workspace: 0, estimate: direct_estimate(p) },
        AlgoInfo { name: "im2col_gemm", deterministic: true, workspace: col, estimate: im2col_estimate(p) },
    ];
    if let Some(units) = wino {
        list.push(AlgoInfo {
            name: "winograd",
            deterministic: true,
            workspace: units.workspace(p) * elem,
            estimate: super::winograd::estimate(p),
        });
    }
    list
}

/// Run algorithm `algo` on plan `p`; `ws` is at least the algorithm's declared workspace.
/// `(threads, wino)`: the thread count `ws` was sized with for the other algorithms, and
/// Winograd's cut of `p` where it is a candidate. `crop`: when `p` is the call's plan without its dead taps, those taps and
/// the call's plan (the weight is cut to fit).
#[allow(clippy::too_many_arguments)]
fn run_algo(
    op: &str,
    algo: usize,
    p: &Plan,
    crop: Option<(&LiveTaps, &Plan)>,
    (threads, wino): (usize, Option<&Units>),
    ins: &[TBlob],
    steps: &[FuseStep],
    out: &mut OutBlob,
    ws: &mut Scratch,
) -> Result<()> {
    // The convolution's own inputs, then the fused steps' (a plain call has none).
    let nconv = if steps.is_empty() { ins.len() } else { conv_inputs_of(ins.len(), steps) };
    let (ins, extra) = ins.split_at(nconv);
    if algo == WINOGRAD {
        // Offered for uncropped float32 3×3 plans only (`algos`; a cropped 3×3 kernel is smaller).
        let units = match wino {
            Some(units) if ins[0].dtype == DType::F32 && crop.is_none() => units,
            _ => return Err(Error::internal(format!("operator {op}: Winograd's algorithm offered for this call"))),
        };
        let post = if steps.is_empty() { Post::none() } else { Post::<f32>::new(op, p, steps, extra)? };
        let bias = ins.get(2).map(|b| b.as_slice::<f32>());
        let (x, w) = (ins[0].as_slice::<f32>(), ins[1].as_slice::<f32>());
        super::winograd::winograd(p, units, x, w, bias, &post, out.as_mut::<f32>(), ws.as_mut::<f32>());
        return Ok(());
    }
    macro_rules! go {
        ($T:ty, $R:ty) => {{
            let (x, full_w) = (ins[0].as_slice::<$T>(), ins[1].as_slice::<$T>());
            let cropped;
            let w = match crop {
                Some((live, full)) => {
                    cropped = live.crop_weight(full, full_w);
                    &cropped[..]
                }
                None => full_w,
            };
            let b = ins.get(2).map(|b| b.as_slice::<$T>());
            let post = if steps.is_empty() { Post::none() } else { Post::<$T>::new(op, p, steps, extra)? };
            let o = out.as_mut::<$T>();
            if algo == DIRECT {
                direct::<$T, $R>(p, x, w, b, &post, o)
            } else {
                im2col_gemm::<$T, $R>(p, threads, x, w, b, &post, o, ws.as_mut::<$T>())
            }
        }};
    }
    match ins[0].dtype {
        DType::F32 => go!(f32, f32),
        DType::F64 => go!(f64, f64),
        DType::F16 => go!(f16, f32),
        other => return Err(Error::type_error(format!("operator {op} does not support {}", other.name()))),
    }
    Ok(())
}

/// The selection key of a call: operator, dtype, shapes and parameters.
fn key(a: &Attrs, ins: &[TBlob]) -> String {
    let params = ConvParams::of(a);
    format!(
        "Convolution;{};data={:?};weight={:?};stride={:?};dilate={:?};pad={:?};group={};bias={}",
        ins[0].dtype.name(),
        ins[0].shape,
        ins[1].shape,
        params.stride,
        params.dilate,
        params.pad,
        params.num_group,
        conv_inputs(a) > 2
    )
}

fn convolution(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    convolve(cx, ins, &[], outs)
}

/// How many of a fused call's `total` inputs are the convolution's: the rest are the steps'.
fn conv_inputs_of(total: usize, steps: &[FuseStep]) -> usize {
    let extra: usize = steps
        .iter()
        .map(|s| match s {
            FuseStep::Scale { .. } => 4,
            FuseStep::Add { .. } => 1,
            FuseStep::Relu | FuseStep::Clip { .. } => 0,
        })
        .sum();
    total.saturating_sub(extra)
}

/// A convolution followed by fused steps (see [`crate::op::Fusion`]): `ins` are the
/// convolution's inputs, then the steps' in order. Float32 only: the executor fuses nothing
/// else.
pub(in crate::op) fn fused(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], steps: &[FuseStep]) -> Result<()> {
    if ins.first().map(|x| x.dtype) != Some(DType::F32) {
        return Err(Error::internal("a fused convolution runs on float32 data only"));
    }
    if conv_inputs_of(ins.len(), steps) != conv_inputs(cx.attrs) {
        return Err(Error::internal(format!("a fused convolution got {} inputs", ins.len())));
    }
    convolve(cx, ins, steps, outs)
}

fn convolve(cx: &OpCtx, ins: &[TBlob], steps: &[FuseStep], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let full = plan(a, &ins[0].shape)?;
    if outs[0].size() == 0 {
        return Ok(());
    }
    let live = full.live_taps();
    let p = live.as_ref().map_or_else(|| full.clone(), |l| full.cropped(l));
    let crop = live.as_ref().map(|l| (l, &full));
    // One thread count for the workspace and the run: the pool may change size meanwhile
    // (MXSetNumOMPThreads from another thread, a pool being built).
    let threads = crate::op::kernel::pool_threads();
    // Winograd's thread limit is read, and its cut made, once per call and only where it is
    // a candidate.
    let wino = if winograd_applies(&p, ins[0].dtype) { Some(Units::of(&p, winograd_threads(threads)?)) } else { None };
    let list = algos(&p, ins[0].dtype, threads, wino.as_ref());
    // Heuristic: GEMM unless the reduced dimension is tiny.
    let heuristic = if p.kdim() >= 8 { IM2COL } else { DIRECT };
    let params = ConvParams::of(a);
    let req = Request {
        key: key(a, ins),
        per_op: params.cudnn_tune,
        workspace_limit: (params.workspace as usize).saturating_mul(1 << 20),
        algos: &list,
        heuristic,
    };
    // One workspace serves every candidate: the largest declared (the column matrices).
    let mut ws = cx.workspace(list.iter().map(|al| al.workspace).max().unwrap_or(0))?;
    tune::global().select(crate::config::global(), &req, |i| {
        run_algo(a.op, i, &p, crop, (threads, wino.as_ref()), ins, steps, &mut outs[0], &mut ws)
    })?;
    Ok(())
}

/// The GPU form's plan of a call (cuDNN's problem is made from it).
fn gpu_plan(a: &Attrs, data: &[usize]) -> Result<crate::op::gpu_nn::ConvGpu> {
    let p = plan(a, data)?;
    let params = ConvParams::of(a);
    Ok(crate::op::gpu_nn::ConvGpu {
        nsp: params.kernel.len(),
        n: p.n,
        c: p.c,
        f: p.f,
        g: p.g,
        input: p.input,
        kernel: p.kernel,
        stride: p.stride,
        dilate: p.dilate,
        pad: p.pad,
        output: p.output,
        // `cudnn_tune` is one of the three names (the schema checks), each with a static name.
        per_op: params.cudnn_tune.and_then(tune::Mode::from_param).map(tune::Mode::name),
        workspace_limit: (params.workspace as usize).saturating_mul(1 << 20),
    })
}

/// Graph inference of the weight and bias from the data: `(num_filter, channels / num_group,
/// *kernel)` (the channels last for a channels-last layout) and `(num_filter,)`.
fn conv_param_shapes(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let p = ConvParams::of(a);
    let kernel = p.kernel.to_vec();
    if data.len() != kernel.len() + 2 {
        let shown: Vec<String> = data.iter().map(|d| if *d < 0 { "?".into() } else { d.to_string() }).collect();
        return Err(Error::mxnet(format!(
            "a {}-d kernel needs {}-d data, got data shape ({})",
            kernel.len(),
            kernel.len() + 2,
            shown.join(",")
        )));
    }
    let (nf, g) = (p.num_filter, p.num_group.max(1));
    let channels_last = p.layout.is_some_and(|l| l.ends_with('C'));
    let c = if channels_last { data[data.len() - 1] } else { data[1] };
    let per_group = if c < 0 || g <= 0 { -1 } else { c / g };
    let w = if channels_last {
        [vec![nf], kernel, vec![per_group]].concat()
    } else {
        [vec![nf, per_group], kernel].concat()
    };
    Ok(vec![(1, w), (2, vec![nf])])
}

/// Graph inference of the data from the output (stock's incomplete inference): the batch
/// size always, and a spatial size where the stride is 1 (`in = out + dilate·(kernel-1) -
/// 2·pad`). A recurrent cell's begin state `zeros((0, C, W))` gets its batch this way.
fn conv_input_shapes(a: &Attrs, ins: &[Option<Vec<i64>>], outs: &[Option<Vec<i64>>]) -> Result<Vec<(usize, Vec<i64>)>> {
    let (Some(Some(data)), Some(Some(out))) = (ins.first(), outs.first()) else { return Ok(vec![]) };
    let p = ConvParams::of(a);
    let nsp = p.kernel.len();
    if data.len() != nsp + 2 || out.len() != nsp + 2 || p.layout.is_some_and(|l| !l.starts_with("NC")) {
        return Ok(vec![]);
    }
    let mut shape = data.clone();
    if shape[0] < 0 {
        shape[0] = out[0];
    }
    for i in 0..nsp {
        let at = |v: &[i64], default: i64| v.get(i).copied().unwrap_or(default);
        if shape[2 + i] < 0 && out[2 + i] >= 0 && at(p.stride, 1) == 1 {
            // Parameters not validated yet: a sum that overflows fills nothing.
            let size = p.kernel[i]
                .checked_sub(1)
                .and_then(|k| at(p.dilate, 1).checked_mul(k))
                .and_then(|span| out[2 + i].checked_add(span))
                .and_then(|v| at(p.pad, 0).checked_mul(2).and_then(|pp| v.checked_sub(pp)));
            if let Some(size) = size.filter(|&s| s > 0) {
                shape[2 + i] = size;
            }
        }
    }
    Ok(if shape == *data { vec![] } else { vec![(0, shape)] })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("Convolution", Inputs::Leading(&["data", "weight", "bias"], conv_inputs), Box::new(conv_infer), Box::new(convolution))
            // The legacy `Convolution_v1` computes the same (stock's takes 2-D and 3-D only).
            .alias(&["_npx_convolution", "Convolution_v1"])
            .params(CONV_PARAMS)
            .param_shapes(conv_param_shapes)
            .input_shapes(conv_input_shapes)
            .gpu(crate::op::gpu::GpuKernel::Convolution(gpu_plan))
            .never_mirrored()
            .grad(Grad::Backward { op: "_backward_Convolution", inputs: true, outputs: false })
            .resources(&[Resource::TempSpace])
            .fusion(|_| Some(Fusion::Head))
            .doc("Compute N-D convolution on (N+2)-D input (channel-first layouts; algorithms chosen by cudnn_tune / MXNET_CUDNN_AUTOTUNE_DEFAULT)."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_cols_bounds() {
        // ow=5, iw=5, stride 1, offset -2 (pad 2): columns 2..5 valid.
        assert_eq!(valid_cols(5, 5, 1, -2), (2, 5));
        assert_eq!(valid_cols(5, 5, 1, 2), (0, 3));
        assert_eq!(valid_cols(3, 5, 2, -1), (1, 3));
        assert_eq!(valid_cols(3, 2, 1, 5), (0, 0));
    }

    /// Naive reference for a 2-D problem.
    fn naive(p: &Plan, x: &[f64], w: &[f64]) -> Vec<f64> {
        let [id, ih, iw] = p.input;
        let [od, oh, ow] = p.output;
        let [kd, kh, kw] = p.kernel;
        let (cg, fg) = (p.cg(), p.fg());
        let mut out = vec![0.0; p.n * p.f * od * oh * ow];
        let at = |o: usize, k: usize, d: usize| (o * p.stride[d] + k * p.dilate[d]) as isize - p.pad[d] as isize;
        for n in 0..p.n {
            for f in 0..p.f {
                let g = f / fg;
                for (z, y, xx) in (0..od).flat_map(|z| (0..oh).flat_map(move |y| (0..ow).map(move |xx| (z, y, xx)))) {
                    let mut s = 0.0;
                    for c in 0..cg {
                        for (kz, ky, kx) in taps(p) {
                            let (iz, iy, ix) = (at(z, kz, 0), at(y, ky, 1), at(xx, kx, 2));
                            if iz < 0 || iy < 0 || ix < 0 || iz >= id as isize || iy >= ih as isize || ix >= iw as isize
                            {
                                continue;
                            }
                            let xi =
                                (((n * p.c + g * cg + c) * id + iz as usize) * ih + iy as usize) * iw + ix as usize;
                            s += x[xi] * w[(((f * cg + c) * kd + kz) * kh + ky) * kw + kx];
                        }
                    }
                    out[(((n * p.f + f) * od + z) * oh + y) * ow + xx] = s;
                }
            }
        }
        out
    }

    /// Tiles of every height (one output row up to the whole image) over 1-3 slots give the
    /// naive convolution's outputs, with the bias and fused steps (a residual addend read
    /// at each tile's offset, then ReLU) applied per tile; 2-D and 3-D, padded, strided,
    /// dilated and grouped plans, one image and several.
    #[test]
    fn tiled_gemm_matches_naive() {
        // (n, c, f, g, input, kernel, stride, pad, dilate)
        type Case = (usize, usize, usize, usize, [usize; 3], [usize; 3], [usize; 3], [usize; 3], [usize; 3]);
        let cases: [Case; 5] = [
            (1, 3, 4, 1, [1, 7, 6], [1, 3, 3], [1, 1, 1], [0, 1, 1], [1, 1, 1]),
            (2, 4, 6, 2, [1, 9, 8], [1, 3, 3], [1, 2, 2], [0, 2, 1], [1, 1, 1]),
            (1, 3, 5, 1, [1, 11, 20], [1, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1]),
            (1, 2, 3, 1, [4, 5, 5], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]),
            (3, 2, 2, 1, [1, 8, 8], [1, 3, 2], [1, 1, 2], [0, 1, 0], [1, 2, 1]),
        ];
        for (n, c, f, g, input, kernel, stride, pad, dilate) in cases {
            let p = Plan::build("test", 3, [n, c, f, g], input, kernel, stride, dilate, pad).unwrap();
            let x: Vec<f64> = (0..n * c * p.isz()).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let w: Vec<f64> = (0..f * p.kdim()).map(|i| ((i * 5 % 11) as f64) * 0.25 - 1.0).collect();
            let bias: Vec<f64> = (0..f).map(|i| i as f64 * 0.5 - 1.0).collect();
            let addend: Vec<f64> = (0..n * f * p.osz()).map(|i| ((i * 3 % 7) as f64) - 3.0).collect();
            let want: Vec<f64> = naive(&p, &x, &w)
                .iter()
                .enumerate()
                .map(|(i, v)| (v + bias[(i / p.osz()) % f] + addend[i]).max(0.0))
                .collect();
            let post = Post { steps: vec![PostStep::Add(&addend, true), PostStep::Relu], f, osz: p.osz() };
            let (total, ow) = (p.output[0] * p.output[1], p.output[2]);
            for rows in 1..=total {
                for slots in 1..=3 {
                    let t = Tiling { rows, tiles: total.div_ceil(rows), slots };
                    let mut out = vec![f64::NAN; want.len()];
                    let mut cols = vec![f64::NAN; p.kdim() * rows * ow * slots];
                    tiled_gemm::<f64, f64>(&p, t, &x, &w, Some(&bias), &post, &mut out, &mut cols);
                    for (i, (a, e)) in out.iter().zip(&want).enumerate() {
                        assert!((a - e).abs() < 1e-9, "{p:?} rows={rows} slots={slots} at {i}: {a} vs {e}");
                    }
                }
            }
        }
    }

    /// One image large enough to tile, through `im2col_gemm` with exactly the workspace
    /// `im2col_workspace` declares, on 1-4 threads: the naive convolution's outputs.
    #[test]
    fn one_large_image_runs_in_tiles_within_its_workspace() {
        let p = Plan::build("test", 2, [1, 8, 4, 1], [1, 40, 40], [1, 3, 3], [1; 3], [1; 3], [0, 1, 1]).unwrap();
        let x: Vec<f64> = (0..8 * 1600).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
        let w: Vec<f64> = (0..4 * p.kdim()).map(|i| ((i * 5 % 11) as f64) * 0.25 - 1.0).collect();
        let want = naive(&p, &x, &w);
        for threads in 1..=4 {
            let t = tiling(&p, threads, TILE_ELEMS);
            assert!(t.tiles >= 2 && t.tiles >= threads, "threads {threads}: {t:?}");
            let mut cols = vec![f64::NAN; im2col_workspace(&p, threads)];
            let mut out = vec![f64::NAN; want.len()];
            im2col_gemm::<f64, f64>(&p, threads, &x, &w, None, &Post::none(), &mut out, &mut cols);
            for (i, (a, e)) in out.iter().zip(&want).enumerate() {
                assert!((a - e).abs() < 1e-9, "threads {threads} at {i}: {a} vs {e}");
            }
        }
    }

    /// The tiling covers every output row, keeps a tile's column matrix near the budget
    /// (never under `MIN_TILE_COLS` positions unless the image is smaller), gives each thread
    /// a tile when one image has enough rows, and sizes the workspace it runs in.
    #[test]
    fn tiling_covers_the_rows_within_the_budget() {
        // DenseNet's 3×3 layer at 56×56, its stem, a small late layer, and a batch.
        for (n, c, f, hw, k, s, pd) in [
            (1, 128, 32, 56, 3, 1, 1),
            (1, 3, 64, 224, 7, 2, 3),
            (1, 128, 32, 7, 3, 1, 1),
            (16, 64, 64, 56, 3, 1, 1),
            // 60 rows on 16 threads: rounding the rows up would leave 15 tiles.
            (1, 3, 16, 60, 3, 1, 1),
        ] {
            let p =
                Plan::build("test", 2, [n, c, f, 1], [1, hw, hw], [1, k, k], [1, s, s], [1; 3], [0, pd, pd]).unwrap();
            let (total, ow) = (p.output[1], p.output[2]);
            for threads in [1, 2, 4, 16] {
                let t = tiling(&p, threads, TILE_ELEMS);
                assert!(t.rows >= 1 && t.rows <= total && t.tiles == total.div_ceil(t.rows), "{t:?}");
                assert!(t.slots >= 1 && t.slots <= threads.min(n * t.tiles), "{t:?}");
                let width = t.rows * ow;
                assert!(width >= MIN_TILE_COLS.min(total * ow), "{t:?}");
                // Over the budget only by the minimum width (or by one row).
                assert!(p.kdim() * width <= TILE_ELEMS.max(p.kdim() * ow * MIN_TILE_COLS.div_ceil(ow)), "{t:?}");
                if n == 1 && total * ow >= threads * MIN_TILE_COLS.next_multiple_of(ow) {
                    assert!(t.tiles >= threads, "threads {threads}: {t:?} for {p:?}");
                }
                if n == 1 && t.tiles >= threads || n > 1 {
                    assert_eq!(im2col_workspace(&p, threads), p.kdim() * width * t.slots);
                }
            }
        }
    }

    #[test]
    fn algorithms_match_naive() {
        for &(c, f, g, h, wd, k, s, d, pd) in &[
            (3usize, 4usize, 1usize, 7usize, 6usize, 3usize, 1usize, 1usize, 1usize),
            (4, 6, 2, 9, 8, 3, 2, 1, 2),
            (2, 2, 1, 8, 8, 2, 1, 2, 0),
            (4, 4, 4, 5, 5, 1, 1, 1, 0),
            (4, 3, 1, 5, 5, 1, 2, 1, 1),
            // Unpadded, unit stride: rows of 9 and 18 (a whole block plus a remainder).
            (3, 5, 1, 11, 20, 3, 1, 1, 0),
        ] {
            let input = [1, h, wd];
            let mut output = [1; 3];
            for i in 1..3 {
                output[i] = (input[i] + 2 * pd - (d * (k - 1) + 1)) / s + 1;
            }
            let p = Plan {
                n: 2,
                c,
                f,
                g,
                input,
                kernel: [1, k, k],
                stride: [1, s, s],
                dilate: [1, d, d],
                pad: [0, pd, pd],
                output,
                out_shape: vec![],
                weight_shape: vec![],
            };
            let x: Vec<f64> = (0..2 * c * h * wd).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let w: Vec<f64> = (0..f * (c / g) * k * k).map(|i| ((i * 5 % 11) as f64) * 0.25 - 1.0).collect();
            let want = naive(&p, &x, &w);
            for algo in [DIRECT, IM2COL] {
                let mut out = vec![0.0; want.len()];
                if algo == DIRECT {
                    direct::<f64, f64>(&p, &x, &w, None, &Post::none(), &mut out);
                } else {
                    for threads in [1, 2, 3] {
                        let mut cols = vec![0.0f64; im2col_workspace(&p, threads)];
                        out.fill(f64::NAN);
                        im2col_gemm::<f64, f64>(&p, threads, &x, &w, None, &Post::none(), &mut out, &mut cols);
                        for (a, b) in out.iter().zip(&want) {
                            assert!(
                                (a - b).abs() < 1e-9,
                                "threads {threads} c={c} f={f} g={g} k={k} s={s} d={d} p={pd}"
                            );
                        }
                    }
                }
                for (a, b) in out.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-9, "algo {algo} c={c} f={f} g={g} k={k} s={s} d={d} p={pd}");
                }
            }
        }
    }

    /// Plans with taps that read only padding: which taps live, and the cropped plan with
    /// the cut weight computing the full plan's outputs through both algorithms.
    #[test]
    fn dead_taps_are_cropped_without_changing_outputs() {
        // (input h, w; kernel; stride; pad; dilate; the live taps' first and end per dim).
        type Case = ([usize; 2], [usize; 2], [usize; 2], [usize; 2], [usize; 2], Option<([usize; 3], [usize; 3])>);
        let cases: [Case; 8] = [
            // ResNet's last stage on 1x1 maps: only the centre tap reads the input.
            ([1, 1], [3, 3], [1, 1], [1, 1], [1, 1], Some(([0, 1, 1], [1, 2, 2]))),
            // Its first 3x3/2 layer on 2x2 maps: the first row and column read padding.
            ([2, 2], [3, 3], [2, 2], [1, 1], [1, 1], Some(([0, 1, 1], [1, 3, 3]))),
            // One dimension only; then dead taps at both ends.
            ([1, 5], [3, 3], [1, 1], [1, 1], [1, 1], Some(([0, 1, 0], [1, 2, 3]))),
            ([2, 2], [5, 5], [2, 2], [2, 2], [1, 1], Some(([0, 2, 2], [1, 4, 4]))),
            // Every tap live: nothing to crop.
            ([4, 4], [3, 3], [1, 1], [1, 1], [1, 1], None),
            // A dilated dimension keeps its taps; the other is cropped.
            ([1, 5], [3, 3], [1, 1], [1, 2], [1, 2], Some(([0, 1, 0], [1, 2, 3]))),
            // No tap reads the input: left as it is.
            ([1, 1], [1, 1], [3, 3], [1, 1], [1, 1], None),
            // Windows that stride over the input: their taps read only padding but are
            // neither first nor last of a range of such taps (kept; they read zeros).
            ([1, 1], [2, 2], [3, 3], [2, 2], [1, 1], None),
        ];
        for (input, kernel, stride, pad, dilate, want_live) in cases {
            let (c, f) = (3, 4);
            let w3 = |v: [usize; 2], d: usize| [d, v[0], v[1]];
            let p = Plan::build(
                "Convolution",
                2,
                [2, c, f, 1],
                w3(input, 1),
                w3(kernel, 1),
                w3(stride, 1),
                w3(dilate, 1),
                w3(pad, 0),
            )
            .unwrap();
            let live = p.live_taps();
            assert_eq!(live.map(|l| (l.first, l.end)), want_live, "{input:?} k{kernel:?} s{stride:?} p{pad:?}");
            let Some(live) = live else { continue };
            let x: Vec<f64> = (0..2 * c * p.isz()).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let w: Vec<f64> = (0..f * c * p.ksize()).map(|i| ((i * 5 % 11) as f64) * 0.25 - 1.0).collect();
            let want = naive(&p, &x, &w);
            let pc = p.cropped(&live);
            assert_eq!(pc.output, p.output);
            let wc = live.crop_weight(&p, &w);
            assert_eq!(wc.len(), f * c * pc.ksize());
            // Spreading the cut weight back gives the weight with its dead taps zeroed, and
            // that weight computes the same outputs on the full plan.
            let mut spread = vec![f64::NAN; w.len()];
            live.spread_weight(&p, &wc, &mut spread);
            assert_eq!(naive(&p, &x, &spread), want);
            assert_eq!(spread.iter().filter(|v| **v != 0.0).count(), wc.iter().filter(|v| **v != 0.0).count());
            let mut out = vec![f64::NAN; want.len()];
            direct::<f64, f64>(&pc, &x, &wc, None, &Post::none(), &mut out);
            assert_eq!(out, want, "direct, {input:?} k{kernel:?}");
            let mut out = vec![f64::NAN; want.len()];
            let mut cols = vec![f64::NAN; im2col_workspace(&pc, 2)];
            im2col_gemm::<f64, f64>(&pc, 2, &x, &wc, None, &Post::none(), &mut out, &mut cols);
            assert_eq!(out, want, "im2col, {input:?} k{kernel:?}");
        }
    }

    /// Several images per GEMM (uneven last chunk, pointwise and padded, strided kernels),
    /// with and without a bias, against the naive convolution.
    #[test]
    fn batched_images_match_naive() {
        for &(c, f, h, k, s, pd) in
            &[(3usize, 4usize, 6usize, 3usize, 1usize, 1usize), (4, 5, 5, 1, 1, 0), (2, 3, 7, 3, 2, 0)]
        {
            let input = [1, h, h];
            let o = (h + 2 * pd - k) / s + 1;
            let p = Plan {
                n: 5,
                c,
                f,
                g: 1,
                input,
                kernel: [1, k, k],
                stride: [1, s, s],
                dilate: [1; 3],
                pad: [0, pd, pd],
                output: [1, o, o],
                out_shape: vec![],
                weight_shape: vec![],
            };
            let x: Vec<f64> = (0..5 * c * h * h).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let w: Vec<f64> = (0..f * c * k * k).map(|i| ((i * 5 % 11) as f64) * 0.25 - 1.0).collect();
            let bias: Vec<f64> = (0..f).map(|i| i as f64 * 0.5 - 1.0).collect();
            let want = naive(&p, &x, &w);
            for nb in [2, 3, 5] {
                for with_bias in [false, true] {
                    let mut out = vec![f64::NAN; want.len()];
                    let mut ws = vec![f64::NAN; (p.kdim() + f) * nb * p.osz() * 2];
                    let b = with_bias.then_some(&bias[..]);
                    batched_gemm::<f64, f64>(&p, 2, nb, &x, &w, b, &Post::none(), &mut out, &mut ws);
                    for (i, (a, e)) in out.iter().zip(&want).enumerate() {
                        let e = e + if with_bias { bias[(i / p.osz()) % f] } else { 0.0 };
                        assert!((a - e).abs() < 1e-9, "nb={nb} bias={with_bias} c={c} k={k} s={s}: {a} vs {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn images_per_gemm_fills_the_columns_in_whole_rounds() {
        let mut p = plan2d_for_test(16, 512, 7);
        assert_eq!(images_per_gemm(&p, 2), 8);
        assert_eq!(images_per_gemm(&p, 1), 16);
        p.n = 1;
        assert_eq!(images_per_gemm(&p, 2), 1);
        let p = plan2d_for_test(32, 64, 8);
        assert_eq!(images_per_gemm(&p, 2), 16);
        // Large images: one per product.
        assert_eq!(images_per_gemm(&plan2d_for_test(16, 64, 56), 2), 1);
    }

    fn plan2d_for_test(n: usize, c: usize, hw: usize) -> Plan {
        Plan {
            n,
            c,
            f: c,
            g: 1,
            input: [1, hw, hw],
            kernel: [1, 3, 3],
            stride: [1; 3],
            dilate: [1; 3],
            pad: [0, 1, 1],
            output: [1, hw, hw],
            out_shape: vec![],
            weight_shape: vec![],
        }
    }

    /// Times of im2col + GEMM on DenseNet's and ResNet's layer shapes for several tile
    /// budgets, and of the untiled single-image path (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn tiled_throughput() {
        let threads = crate::op::kernel::pool_threads();
        for (n, c, f, hw, k, s, pd) in [
            (1usize, 128usize, 32usize, 56usize, 3usize, 1usize, 1usize),
            (1, 3, 64, 224, 7, 2, 3),
            (1, 128, 32, 28, 3, 1, 1),
            (1, 128, 32, 14, 3, 1, 1),
            (1, 128, 32, 7, 3, 1, 1),
            (1, 64, 64, 56, 3, 1, 1),
            (1, 256, 256, 14, 3, 1, 1),
            (1, 512, 512, 7, 3, 1, 1),
            (16, 128, 32, 56, 3, 1, 1),
        ] {
            let p = Plan::build("t", 2, [n, c, f, 1], [1, hw, hw], [1, k, k], [1, s, s], [1; 3], [0, pd, pd]).unwrap();
            let x = vec![0.5f32; n * c * hw * hw];
            let w = vec![0.25f32; f * p.kdim()];
            let mut out = vec![0.0f32; n * f * p.osz()];
            let time = |run: &mut dyn FnMut()| {
                run();
                let reps = (2e9 / p.flops()).clamp(3.0, 200.0) as usize;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    run();
                }
                t.elapsed().as_secs_f64() / reps as f64 * 1e3
            };
            let mut line = format!("n{n} c{c} f{f} hw{hw} k{k}/{s}:");
            if n == 1 {
                let mut col = vec![0.0f32; p.kdim() * p.osz()];
                let ms = time(&mut || single_item::<f32, f32>(&p, &x, &w, None, &Post::none(), &mut out, &mut col));
                line += &format!(" single {ms:.3}");
            }
            for te in [16usize << 10, 48 << 10, 96 << 10, 192 << 10, 384 << 10, usize::MAX / 2] {
                let t = tiling(&p, threads, te);
                let mut cols = vec![0.0f32; p.kdim() * t.rows * p.output[2] * t.slots];
                let ms = time(&mut || tiled_gemm::<f32, f32>(&p, t, &x, &w, None, &Post::none(), &mut out, &mut cols));
                line += &format!(" | {}K r{}x{} {ms:.3}", te >> 10, t.rows, t.tiles);
            }
            eprintln!("{line}");
        }
    }

    /// Throughput of the target shapes (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn conv_throughput() {
        for &(n, c, h, f) in &[(64usize, 1usize, 28usize, 20usize), (64, 20, 12, 50)] {
            let o = h - 4;
            let p = Plan {
                n,
                c,
                f,
                g: 1,
                input: [1, h, h],
                kernel: [1, 5, 5],
                stride: [1; 3],
                dilate: [1; 3],
                pad: [0; 3],
                output: [1, o, o],
                out_shape: vec![],
                weight_shape: vec![],
            };
            let x = vec![0.5f32; n * c * h * h];
            let w = vec![0.25f32; f * c * 25];
            let b = vec![0.1f32; f];
            let mut out = vec![0.0f32; n * f * o * o];
            let threads = crate::op::kernel::pool_threads();
            let mut cols = vec![0.0f32; im2col_workspace(&p, threads)];
            for algo in [DIRECT, IM2COL] {
                let mut run = || {
                    if algo == DIRECT {
                        direct::<f32, f32>(&p, &x, &w, Some(&b), &Post::none(), &mut out)
                    } else {
                        im2col_gemm::<f32, f32>(&p, threads, &x, &w, Some(&b), &Post::none(), &mut out, &mut cols)
                    }
                };
                run();
                let reps = 20;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    run();
                }
                let secs = t.elapsed().as_secs_f64() / reps as f64;
                eprintln!("conv {n}x{c}x{h}x{h} f={f} algo {algo}: {:.1} GFLOP/s", p.flops() / secs / 1e9);
            }
        }
    }
}
