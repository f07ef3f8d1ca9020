//! The backward operator of `Convolution` (see `op::grad` for the convention).
//!
//! Owns `_backward_Convolution(dY, data, weight[, bias]) -> (dData, dWeight[, dBias])`. The
//! batch is split into one chunk of images per kernel-pool thread; a chunk works on
//! sub-batches of images whose column matrices sit side by side, so each gradient is one
//! large GEMM per (sub-batch, group): the chunk unfolds the inputs with the forward's im2col
//! and accumulates `dY·colᵀ` into its own partial weight gradient, computes `Wᵀ·dY` and folds
//! it back onto the data gradient (col2im), and sums `dY` over positions for the bias; the
//! partial sums are then added in chunk order (deterministic for a given thread count).
//! Many filters on small planes (where a chunk's partial weight gradient would outweigh its
//! column matrix) run instead as one product per gradient over the whole batch, each
//! spread over the threads by the GEMM ([`backward_whole`]). The float32 data gradient of
//! a 3×3 stride-1 layer is a 3×3 convolution of `dY` (flipped, transposed weights), so the
//! algorithm selection times Winograd's algorithm against the GEMM path for it
//! ([`backward_f32`]). Gradients whose request is `Req::Null` (the data of a network's first
//! layer) are skipped.

use super::conv::{
    for_tap_rows, im2col, im2col_estimate, plan, taps, winograd_threads, ConvParams, Plan, Post, CONV_PARAMS,
};
use super::linalg::{gemm, GemmElem};
use super::nn::Real;
use super::winograd::{self, Units};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, par_items, parts, pool_threads, sum_parts, Cost};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::tune::{self, AlgoInfo, Request};
use crate::op::{OpCtx, OpDef, Req, Resource};
use half::f16;

/// Add one image's block of the column matrix `col` (kdim rows of osz entries, `ld` apart)
/// back onto its input planes `dx` (cg × isz), which it overwrites.
pub(super) fn col2im<T: Elem, R: Real>(p: &Plan, col: &[T], ld: usize, dx: &mut [T]) {
    let (isz, osz, sw) = (p.isz(), p.osz(), p.stride[2]);
    dx.fill(T::zero());
    if p.unpadded_2d() {
        let ([_, _, iw], [_, oh, ow]) = (p.input, p.output);
        let mut row = 0;
        for ci in 0..p.cg() {
            let plane = &mut dx[ci * isz..][..isz];
            for ky in 0..p.kernel[1] {
                for kx in 0..p.kernel[2] {
                    let crow = &col[row * ld..][..osz];
                    let base = ky * p.dilate[1] * iw + kx * p.dilate[2];
                    for (oy, src) in crow.chunks_exact(ow).take(oh).enumerate() {
                        let dst = &mut plane[base + oy * p.stride[1] * iw..][..ow];
                        for (d, &s) in dst.iter_mut().zip(src) {
                            *d = (R::load(*d) + R::load(s)).store();
                        }
                    }
                    row += 1;
                }
            }
        }
        return;
    }
    let mut row = 0;
    for ci in 0..p.cg() {
        let plane = &mut dx[ci * isz..][..isz];
        for (kz, ky, kx) in taps(p) {
            let crow = &col[row * ld..][..osz];
            for_tap_rows(p, kz, ky, kx, |orow, irow, lo, hi, xoff| {
                let start = (irow as isize + (lo * sw) as isize + xoff) as usize;
                let src = &crow[orow + lo..orow + hi];
                if sw == 1 {
                    for (d, &s) in plane[start..start + (hi - lo)].iter_mut().zip(src) {
                        *d = (R::load(*d) + R::load(s)).store();
                    }
                } else {
                    for (j, &s) in src.iter().enumerate() {
                        let d = &mut plane[start + j * sw];
                        *d = (R::load(*d) + R::load(s)).store();
                    }
                }
            });
            row += 1;
        }
    }
}

/// Bytes of column matrix per sub-batch of images: small enough that a chunk's column
/// matrix stays in a core's L2 cache between im2col, the GEMMs and col2im.
const COL_BUDGET_BYTES: usize = 512 << 10;

/// The gradients of plan `p` that the call asks for: data, weight (of `p`'s kernel), bias.
struct Grads<'a, T> {
    dx: Option<&'a mut [T]>,
    dw: Option<&'a mut [T]>,
    db: Option<&'a mut [T]>,
}

/// The gradients of the call's plan `full`: the plan without its dead taps (see
/// [`Plan::live_taps`]) where it has some, with the weight cut to fit and its gradient spread
/// back (zero for the dead taps).
fn backward_call<T: GemmElem, R: Real>(cx: &OpCtx, full: &Plan, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (dy, x, w) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>());
    let mut grads = outs.iter_mut().zip(cx.req).map(|(o, r)| (*r != Req::Null).then(|| o.as_mut::<T>()));
    let (dx, dw, db) = (grads.next().flatten(), grads.next().flatten(), grads.next().flatten());
    let Some(live) = full.live_taps() else {
        return backward::<T, R>(cx, full, dy, x, w, Grads { dx, dw, db });
    };
    let p = full.cropped(&live);
    let wc = live.crop_weight(full, w);
    let mut dwc = dw.is_some().then(|| vec![T::zero(); wc.len()]);
    backward::<T, R>(cx, &p, dy, x, &wc, Grads { dx, dw: dwc.as_deref_mut(), db })?;
    if let (Some(dw), Some(dwc)) = (dw, dwc) {
        live.spread_weight(full, &dwc, dw);
    }
    Ok(())
}

/// [`backward_whole`]'s column matrix of the whole batch is at most this many bytes.
const WHOLE_BATCH_BYTES: usize = 4 << 20;

fn backward<T: GemmElem, R: Real>(cx: &OpCtx, p: &Plan, dy: &[T], x: &[T], w: &[T], g: Grads<T>) -> Result<()> {
    if (g.dx.is_some() || g.dw.is_some()) && whole_batch(p, std::mem::size_of::<T>()) {
        backward_whole::<T, R>(cx, p, dy, x, w, g)
    } else {
        backward_chunked::<T, R>(cx, p, dy, x, w, g)
    }
}

/// Whether `p`'s gradients run as whole-batch products ([`backward_whole`]): where each
/// chunk's partial weight gradient of [`backward_chunked`] would hold more entries than the
/// column matrix of all the chunk's images per reduced row (many filters on small planes:
/// ResNet's last stages on 32×32 inputs), so that the partial sums and their reduction would
/// cost more than the products, and the batch's column matrix is small.
fn whole_batch(p: &Plan, elem: usize) -> bool {
    let per = Chunks::of(p, elem).per;
    p.n > 1 && p.fg() >= per * p.osz() && p.kdim() * p.n * p.osz() * elem <= WHOLE_BATCH_BYTES
}

/// How [`backward_chunked`] cuts the batch: `chunks` of `per` images (one per thread), each
/// in sub-batches of `sub` images whose column matrix fits [`COL_BUDGET_BYTES`].
struct Chunks {
    chunks: usize,
    per: usize,
    sub: usize,
}

impl Chunks {
    fn of(p: &Plan, elem: usize) -> Chunks {
        let chunks = sum_parts().min(p.n).max(1);
        let per = p.n.div_ceil(chunks);
        let sub = (COL_BUDGET_BYTES / elem / (p.kdim() * p.osz()).max(1)).clamp(1, per.max(1));
        Chunks { chunks, per, sub }
    }
}

/// Workspace bytes [`backward`] takes for `p`'s gradients (elements of `elem` bytes).
fn gemm_workspace(p: &Plan, elem: usize) -> usize {
    if whole_batch(p, elem) {
        (p.f + p.kdim()) * p.n * p.osz() * elem
    } else {
        let Chunks { chunks, sub, .. } = Chunks::of(p, elem);
        chunks * (p.fg() + p.kdim()) * sub * p.osz() * elem
    }
}

/// The gradients by chunks of images, one per thread, with partial weight and bias sums.
fn backward_chunked<T: GemmElem, R: Real>(cx: &OpCtx, p: &Plan, dy: &[T], x: &[T], w: &[T], g: Grads<T>) -> Result<()> {
    let Grads { dx: dx_out, dw: dw_out, db: db_out } = g;
    let want_dx = dx_out.is_some();
    let want_dw = dw_out.is_some();
    let want_db = db_out.is_some();
    let (cg, fg, osz, kdim, isz) = (p.cg(), p.fg(), p.osz(), p.kdim(), p.isz());
    let wsize = p.f * kdim;
    let Chunks { chunks, per, sub } = Chunks::of(p, std::mem::size_of::<T>());
    // Partial sums per chunk: the weight gradient, then the bias gradient.
    let psize = if want_dw { wsize } else { 0 } + if want_db { p.f } else { 0 };
    let mut partial = vec![T::zero(); chunks * psize];
    let work = p.flops() * (want_dx as u8 + want_dw as u8) as f64;
    // Per chunk, from the workspace: dY of a sub-batch (fg rows) and its column matrix, whose
    // columns sit side by side (row length `ld`).
    let cols = sub * osz;
    let (dyc_len, col_len) = if want_dw || want_dx { (fg * cols, kdim * cols) } else { (0, 0) };
    let mut ws = cx.workspace(chunks * (dyc_len + col_len) * std::mem::size_of::<T>())?;
    // Chunk ch owns images ch·per.. of dx (each image's c·isz entries), its partial block
    // and its (dyc, col) pair of the workspace: all split off here.
    let dx_parts: Vec<Option<&mut [T]>> = if let Some(dx) = dx_out {
        parts(dx, per * p.c * isz, chunks).into_iter().map(Some).collect()
    } else {
        (0..chunks).map(|_| None).collect()
    };
    let items: Vec<_> = dx_parts
        .into_iter()
        .zip(parts(&mut partial, psize, chunks))
        .zip(parts(ws.as_mut::<T>(), dyc_len + col_len, chunks))
        .collect();
    par_items(items, work * 0.1, T::DTYPE, |ch, ((mut dx, part), scratch)| {
        let (pw, pb) = part.split_at_mut(if want_dw { wsize } else { 0 });
        // Every entry read below was written first: dyc by the copies, col by im2col or by
        // the GEMM that overwrites it.
        let (dyc, col) = scratch.split_at_mut(dyc_len);
        let mut bsum = vec![R::of(0.0); if want_db { p.f } else { 0 }];
        let (first, last) = (ch * per, ((ch + 1) * per).min(p.n));
        let mut i0 = first;
        while i0 < last {
            let b = sub.min(last - i0);
            let ld = b * osz;
            for gi in 0..p.g {
                if !(want_dw || want_dx) {
                    break;
                }
                // dY of the sub-batch for this group: fg rows of b·osz.
                for bi in 0..b {
                    for fi in 0..fg {
                        let src = &dy[((i0 + bi) * p.f + gi * fg + fi) * osz..][..osz];
                        dyc[fi * ld + bi * osz..][..osz].copy_from_slice(src);
                    }
                }
                if want_dw {
                    for bi in 0..b {
                        let src = &x[((i0 + bi) * p.c + gi * cg) * isz..][..cg * isz];
                        im2col(p, src, &mut col[bi * osz..], ld);
                    }
                    gemm(fg, kdim, ld, dyc, false, col, true, &mut pw[gi * fg * kdim..][..fg * kdim], true);
                }
                if let Some(dx) = dx.as_deref_mut() {
                    let wg = &w[gi * fg * kdim..][..fg * kdim];
                    gemm(kdim, ld, fg, wg, true, dyc, false, col, false);
                    for bi in 0..b {
                        // Image i0 + bi, group gi, within this chunk's images.
                        let at = ((i0 + bi - ch * per) * p.c + gi * cg) * isz;
                        col2im::<T, R>(p, &col[bi * osz..], ld, &mut dx[at..at + cg * isz]);
                    }
                }
            }
            if want_db {
                for img in i0..i0 + b {
                    for (fi, s) in bsum.iter_mut().enumerate() {
                        let mut acc = R::of(0.0);
                        for &v in &dy[(img * p.f + fi) * osz..][..osz] {
                            acc = acc + R::load(v);
                        }
                        *s = *s + acc;
                    }
                }
            }
            i0 += b;
        }
        for (o, s) in pb.iter_mut().zip(bsum) {
            *o = s.store();
        }
    });
    // Reduce the partial sums in chunk order.
    let reduce = |out: &mut [T], offset: usize, len: usize| {
        let partial = &partial;
        par_for_mut(&mut out[..len], 1, Cost(0.3 * chunks as f64), T::DTYPE, |r, o| {
            for (i, ov) in r.zip(o.iter_mut()) {
                let mut acc = R::of(0.0);
                for ch in 0..chunks {
                    acc = acc + R::load(partial[ch * psize + offset + i]);
                }
                *ov = acc.store();
            }
        });
    };
    if let Some(dw) = dw_out {
        reduce(dw, 0, wsize);
    }
    if let Some(db) = db_out {
        reduce(db, if want_dw { wsize } else { 0 }, p.f);
    }
    Ok(())
}

/// The gradients of a batch of small planes, as one product per (group, gradient) over the
/// whole batch: `dY` rearranged to `f × n·osz`, the batch unfolded side by side (split over
/// the threads by channels), `dW = dY·colᵀ` written straight into the gradient (no partial
/// sums), `col = Wᵀ·dY` folded back per image (split over the threads by images). Each
/// product spreads itself over the pool; each weight-gradient entry is summed over the whole
/// batch in the GEMM's order (deterministic for a given thread count).
fn backward_whole<T: GemmElem, R: Real>(cx: &OpCtx, p: &Plan, dy: &[T], x: &[T], w: &[T], g: Grads<T>) -> Result<()> {
    let Grads { mut dx, mut dw, db } = g;
    let (cg, fg, osz, isz, kdim, ksize) = (p.cg(), p.fg(), p.osz(), p.isz(), p.kdim(), p.ksize());
    let ld = p.n * osz;
    let mut ws = cx.workspace((p.f + kdim) * ld * std::mem::size_of::<T>())?;
    let (dyc, col) = ws.as_mut::<T>().split_at_mut(p.f * ld);
    let col = &mut col[..kdim * ld];
    // dyc[f][i·osz + s] = dY[i][f][s].
    par_for_mut(dyc, ld, Cost(0.25 * ld as f64), T::DTYPE, |filters, rows| {
        for (fi, row) in filters.zip(rows.chunks_exact_mut(ld)) {
            for (i, dst) in row.chunks_exact_mut(osz).enumerate() {
                dst.copy_from_slice(&dy[(i * p.f + fi) * osz..][..osz]);
            }
        }
    });
    let dyc = &*dyc;
    for gi in 0..p.g {
        let dyg = &dyc[gi * fg * ld..][..fg * ld];
        if let Some(dw) = dw.as_deref_mut() {
            // Split by channels: each task unfolds its channels' taps (a plan of those
            // channels alone) for every image.
            par_for_mut(col, ksize * ld, Cost(0.5 * (ksize * ld) as f64), T::DTYPE, |chans, rows| {
                let mut sub = p.clone();
                (sub.c, sub.g) = (chans.len(), 1);
                for i in 0..p.n {
                    let planes = &x[(i * p.c + gi * cg + chans.start) * isz..][..chans.len() * isz];
                    im2col(&sub, planes, &mut rows[i * osz..], ld);
                }
            });
            gemm(fg, kdim, ld, dyg, false, col, true, &mut dw[gi * fg * kdim..][..fg * kdim], false);
        }
        if let Some(dx) = dx.as_deref_mut() {
            let wg = &w[gi * fg * kdim..][..fg * kdim];
            gemm(kdim, ld, fg, wg, true, dyg, false, col, false);
            let col = &*col;
            par_for_mut(dx, p.c * isz, Cost(0.5 * (kdim * osz) as f64), T::DTYPE, |imgs, planes| {
                for (i, img) in imgs.zip(planes.chunks_exact_mut(p.c * isz)) {
                    col2im::<T, R>(p, &col[i * osz..], ld, &mut img[gi * cg * isz..][..cg * isz]);
                }
            });
        }
    }
    if let Some(db) = db {
        par_for_mut(db, 1, Cost(0.25 * ld as f64), T::DTYPE, |filters, out| {
            for (fi, o) in filters.zip(out.iter_mut()) {
                let mut acc = R::of(0.0);
                for &v in &dyc[fi * ld..][..ld] {
                    acc = acc + R::load(v);
                }
                *o = acc.store();
            }
        });
    }
    Ok(())
}

/// The data gradient of `p` as a convolution Winograd's algorithm computes: for a 3×3
/// stride-1 layer without dead taps and with padding up to 2, the gradient is `dY` convolved
/// with the weights flipped and transposed (channels as filters), padded by `2 - pad`.
fn data_grad_plan(p: &Plan) -> Option<Plan> {
    if !winograd::applies(p) || p.pad[1] > 2 || p.pad[2] > 2 || p.live_taps().is_some() {
        return None;
    }
    let pad = [0, 2 - p.pad[1], 2 - p.pad[2]];
    let t =
        Plan::build("_backward_Convolution", 2, [p.n, p.f, p.c, 1], p.output, p.kernel, [1; 3], [1; 3], pad).ok()?;
    (t.output == p.input).then_some(t)
}

/// `wt[c][f]` = `w[f][c]` flipped in both spatial dimensions (3×3 kernels).
fn flip_transpose(f: usize, c: usize, w: &[f32], wt: &mut [f32]) {
    for fi in 0..f {
        for ci in 0..c {
            let (src, dst) = (&w[(fi * c + ci) * 9..][..9], &mut wt[(ci * f + fi) * 9..][..9]);
            for (t, d) in dst.iter_mut().enumerate() {
                *d = src[8 - t];
            }
        }
    }
}

/// Float32 gradients. Where the data gradient is a convolution Winograd's algorithm computes
/// ([`data_grad_plan`]), the weight and bias gradients run first, then the data gradient
/// through the algorithm selection (`cudnn_tune`, as the forward's): the GEMM path or
/// Winograd's.
fn backward_f32(cx: &OpCtx, full: &Plan, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let tp = match data_grad_plan(full) {
        Some(tp) if cx.req[0] != Req::Null => tp,
        _ => return backward_call::<f32, f32>(cx, full, ins, outs),
    };
    let (dy, x, w) = (ins[0].as_slice::<f32>(), ins[1].as_slice::<f32>(), ins[2].as_slice::<f32>());
    let (dx_out, rest) = outs.split_first_mut().expect("a data gradient");
    let mut grads = rest.iter_mut().zip(&cx.req[1..]).map(|(o, r)| (*r != Req::Null).then(|| o.as_mut::<f32>()));
    let (dw, db) = (grads.next().flatten(), grads.next().flatten());
    if dw.is_some() || db.is_some() {
        backward::<f32, f32>(cx, full, dy, x, w, Grads { dx: None, dw, db })?;
    }
    let dx = dx_out.as_mut::<f32>();
    let threads = pool_threads();
    let units = Units::of(&tp, winograd_threads(threads)?);
    let flipped = tp.c * tp.f * 9;
    let list = [
        AlgoInfo {
            name: "im2col_gemm",
            deterministic: true,
            workspace: gemm_workspace(full, 4),
            estimate: im2col_estimate(&tp),
        },
        AlgoInfo {
            name: "winograd",
            deterministic: true,
            workspace: (flipped + units.workspace(&tp)) * 4,
            estimate: winograd::estimate(&tp),
        },
    ];
    let params = ConvParams::of(cx.attrs);
    let req = Request {
        key: format!(
            "Convolution backward data;float32;data={:?};weight={:?};pad={:?}",
            ins[1].shape, ins[2].shape, params.pad
        ),
        per_op: params.cudnn_tune,
        workspace_limit: (params.workspace as usize).saturating_mul(1 << 20),
        algos: &list,
        // Without timing, the GEMM path (as the forward's heuristic, which never takes
        // Winograd's rounding untimed).
        heuristic: 0,
    };
    tune::global().select(crate::config::global(), &req, |i| {
        if i == 0 {
            return backward::<f32, f32>(cx, full, dy, x, w, Grads { dx: Some(&mut dx[..]), dw: None, db: None });
        }
        let mut ws = cx.workspace(list[1].workspace)?;
        let (wt, rest) = ws.as_mut::<f32>().split_at_mut(flipped);
        flip_transpose(tp.c, tp.f, w, wt);
        winograd::winograd(&tp, &units, dy, wt, None, &Post::none(), dx, rest);
        Ok(())
    })?;
    Ok(())
}

fn convolution_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = plan(a, &ins[1].shape)?;
    if ins[1].size() == 0 || ins[0].size() == 0 {
        for (o, r) in outs.iter_mut().zip(cx.req) {
            if *r != Req::Null {
                crate::dispatch_float!(o.dtype, a.op, T => o.as_mut::<T>().fill(T::zero()));
            }
        }
        return Ok(());
    }
    match ins[1].dtype {
        DType::F32 => backward_f32(cx, &p, ins, outs),
        DType::F64 => backward_call::<f64, f64>(cx, &p, ins, outs),
        DType::F16 => backward_call::<f16, f32>(cx, &p, ins, outs),
        other => Err(Error::type_error(format!("operator _backward_Convolution does not support {}", other.name()))),
    }
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::backward("_backward_Convolution", CONV_PARAMS, Box::new(convolution_backward))
            .resources(&[Resource::TempSpace]),
    );
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    fn conv(params: &[(&str, &str)], data: &[usize], weight: &[usize], bias: bool) {
        let dn = data.iter().product();
        let wn = weight.iter().product();
        let mut inputs: Vec<(&[usize], Vec<f64>)> =
            vec![(data, values(dn, -1.0, 1.0, 1)), (weight, values(wn, -1.0, 1.0, 2))];
        let bshape = [weight[0]];
        if bias {
            inputs.push((&bshape, values(weight[0], -1.0, 1.0, 3)));
        }
        check("Convolution", params, &inputs, &[]);
    }

    #[test]
    fn convolution_2d() {
        conv(&[("kernel", "(3, 3)"), ("num_filter", "4")], &[2, 3, 6, 5], &[4, 3, 3, 3], true);
        // Unpadded with a row stride and a column dilation (the row-copy path of im2col/col2im).
        conv(
            &[("kernel", "(3, 2)"), ("num_filter", "2"), ("stride", "(2, 1)"), ("dilate", "(1, 2)")],
            &[2, 2, 9, 10],
            &[2, 2, 3, 2],
            true,
        );
        conv(
            &[("kernel", "(3, 2)"), ("num_filter", "2"), ("stride", "(2, 1)"), ("pad", "(1, 1)"), ("no_bias", "True")],
            &[2, 2, 7, 6],
            &[2, 2, 3, 2],
            false,
        );
        conv(
            &[
                ("kernel", "(2, 2)"),
                ("num_filter", "4"),
                ("dilate", "(2, 2)"),
                ("num_group", "2"),
                ("stride", "(1, 2)"),
            ],
            &[3, 4, 6, 7],
            &[4, 2, 2, 2],
            true,
        );
        // Pointwise (no unfolding).
        conv(&[("kernel", "(1, 1)"), ("num_filter", "3")], &[2, 4, 3, 3], &[3, 4, 1, 1], true);
        // Taps that read only padding (run without them; their weight gradient is zero).
        let k3p1 = [("kernel", "(3, 3)"), ("num_filter", "4"), ("pad", "(1, 1)")];
        conv(&k3p1, &[2, 3, 1, 1], &[4, 3, 3, 3], true);
        conv(
            &[k3p1[0], k3p1[1], k3p1[2], ("stride", "(2, 2)"), ("no_bias", "True")],
            &[2, 3, 2, 2],
            &[4, 3, 3, 3],
            false,
        );
        conv(&[k3p1[0], k3p1[1], k3p1[2], ("num_group", "2")], &[2, 4, 1, 3], &[4, 2, 3, 3], true);
    }

    #[test]
    fn convolution_1d_3d() {
        conv(
            &[("kernel", "(3,)"), ("num_filter", "2"), ("pad", "(1,)"), ("stride", "(2,)")],
            &[2, 3, 7],
            &[2, 3, 3],
            true,
        );
        conv(
            &[("kernel", "(2, 2, 2)"), ("num_filter", "2"), ("pad", "(1, 0, 1)")],
            &[1, 2, 3, 4, 3],
            &[2, 2, 2, 2, 2],
            true,
        );
        conv(&[("kernel", "(3,)"), ("num_filter", "2"), ("pad", "(1,)")], &[2, 3, 1], &[2, 3, 3], true);
        conv(
            &[("kernel", "(3, 3, 3)"), ("num_filter", "2"), ("pad", "(1, 1, 1)")],
            &[1, 2, 1, 2, 1],
            &[2, 2, 3, 3, 3],
            true,
        );
    }

    /// The whole-batch products give the chunked path's gradients, for every combination of
    /// requested gradients, on plans with groups, strides, padding and 1-D/3-D kernels.
    #[test]
    fn whole_batch_matches_chunked() {
        use super::super::conv::Plan;
        use super::{backward_chunked, backward_whole, Grads};
        use crate::op::OpCtx;
        let attrs =
            crate::op::lookup("Convolution").unwrap().parse_attrs([("kernel", "(1, 1)"), ("num_filter", "1")], 2);
        let cx = OpCtx { attrs: &attrs.unwrap(), req: &[], rng: None, is_train: true, temp: None };
        let plans = [
            Plan::build("t", 2, [3, 4, 6, 1], [1, 2, 2], [1, 3, 3], [1; 3], [1; 3], [0, 1, 1]),
            Plan::build("t", 2, [4, 4, 8, 2], [1, 3, 2], [1, 3, 3], [1, 2, 1], [1; 3], [0, 1, 1]),
            Plan::build("t", 2, [2, 3, 5, 1], [1, 5, 4], [1, 2, 3], [1, 1, 2], [1, 2, 1], [0, 1, 0]),
            Plan::build("t", 1, [5, 2, 4, 1], [1, 1, 6], [1, 1, 3], [1, 1, 2], [1; 3], [0, 0, 1]),
            Plan::build("t", 3, [2, 2, 3, 1], [2, 2, 3], [2, 2, 2], [1; 3], [1; 3], [1, 0, 1]),
        ];
        for p in plans {
            let p = p.unwrap();
            let (xn, wn, yn) = (p.n * p.c * p.isz(), p.f * p.kdim(), p.n * p.f * p.osz());
            let x = values(xn, -1.0, 1.0, 7);
            let w = values(wn, -1.0, 1.0, 8);
            let dy = values(yn, -1.0, 1.0, 9);
            for mask in 1..8u8 {
                let mut got = [vec![f64::NAN; xn], vec![f64::NAN; wn], vec![f64::NAN; p.f]];
                let mut want = [vec![f64::NAN; xn], vec![f64::NAN; wn], vec![f64::NAN; p.f]];
                for (out, whole) in [(&mut got, true), (&mut want, false)] {
                    let [dx, dw, db] = out;
                    let g = Grads {
                        dx: (mask & 1 != 0).then_some(&mut dx[..]),
                        dw: (mask & 2 != 0).then_some(&mut dw[..]),
                        db: (mask & 4 != 0).then_some(&mut db[..]),
                    };
                    if whole {
                        backward_whole::<f64, f64>(&cx, &p, &dy, &x, &w, g).unwrap();
                    } else {
                        backward_chunked::<f64, f64>(&cx, &p, &dy, &x, &w, g).unwrap();
                    }
                }
                for k in 0..3 {
                    for (i, (a, b)) in got[k].iter().zip(&want[k]).enumerate() {
                        let same =
                            if mask & (1 << k) != 0 { (a - b).abs() <= 1e-12 * (1.0 + b.abs()) } else { a.is_nan() };
                        assert!(same, "{p:?} mask {mask} gradient {k} at {i}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// Winograd's data gradient (the flipped, transposed weights convolved over dY) matches the
    /// GEMM path's float64 gradient on padding 0-2, batches, partial tiles, several thread
    /// counts (the unit and phased paths); layers it cannot take get no plan.
    #[test]
    fn winograd_data_gradient_matches_gemm() {
        use super::super::conv::{Plan, Post};
        use super::super::winograd::{winograd, Units};
        use super::{backward_chunked, data_grad_plan, flip_transpose, Grads};
        use crate::op::OpCtx;
        let attrs =
            crate::op::lookup("Convolution").unwrap().parse_attrs([("kernel", "(1, 1)"), ("num_filter", "1")], 2);
        let cx = OpCtx { attrs: &attrs.unwrap(), req: &[], rng: None, is_train: true, temp: None };
        let build = |n, c, f, h, w, k, s, pad| {
            Plan::build("t", 2, [n, c, f, 1], [1, h, w], [1, k, k], [1, s, s], [1; 3], [0, pad, pad]).unwrap()
        };
        for (n, c, f, h, w, pad) in [(2, 3, 5, 6, 7, 1), (1, 8, 4, 9, 9, 0), (3, 4, 6, 5, 4, 2), (1, 16, 16, 12, 12, 1)]
        {
            let p = build(n, c, f, h, w, 3, 1, pad);
            let tp = data_grad_plan(&p).unwrap();
            let (xn, wn, yn) = (n * c * h * w, f * c * 9, n * f * p.osz());
            let (x, wt, dy) = (values(xn, -1.0, 1.0, 3), values(wn, -1.0, 1.0, 4), values(yn, -1.0, 1.0, 5));
            let mut want = vec![f64::NAN; xn];
            let g = Grads { dx: Some(&mut want[..]), dw: None, db: None };
            backward_chunked::<f64, f64>(&cx, &p, &dy, &x, &wt, g).unwrap();
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let (w32, dy32): (Vec<f32>, Vec<f32>) =
                (wt.iter().map(|&v| v as f32).collect(), dy.iter().map(|&v| v as f32).collect());
            let mut flipped = vec![0.0f32; wn];
            flip_transpose(f, c, &w32, &mut flipped);
            for threads in [1, 2, 3] {
                let units = Units::of(&tp, threads);
                let mut ws = vec![f32::NAN; units.workspace(&tp)];
                let mut got = vec![f32::NAN; xn];
                winograd(&tp, &units, &dy32, &flipped, None, &Post::none(), &mut got, &mut ws);
                for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!((g as f64 - e).abs() <= 1e-5 * (scale + 1.0), "{p:?} threads {threads} at {i}: {g} vs {e}");
                }
            }
        }
        // Strided, padded by 3, or with dead taps (a 1×1 plane): no Winograd data gradient.
        assert!(data_grad_plan(&build(1, 2, 2, 6, 6, 3, 2, 1)).is_none());
        assert!(data_grad_plan(&build(1, 2, 2, 6, 6, 3, 1, 3)).is_none());
        assert!(data_grad_plan(&build(1, 2, 2, 1, 1, 3, 1, 1)).is_none());
        assert!(data_grad_plan(&build(1, 2, 2, 6, 6, 1, 1, 0)).is_none());
    }

    /// Time a backward operator on float32 data: `ins` shapes, `outs` shapes (None: Req::Null).
    fn time_backward(
        fwd: &str,
        params: &[(&str, &str)],
        nin: usize,
        ins: &[&[usize]],
        outs: &[Option<&[usize]>],
    ) -> f64 {
        use crate::ndarray::DType;
        use crate::op::tensor::{OutBlob, TBlob};
        use crate::op::{lookup, OpCtx, Req};
        let op = lookup(fwd).unwrap();
        let attrs = op.parse_attrs(params.iter().copied(), nin).unwrap();
        let bop = crate::op::grad::backward_op(op).unwrap().unwrap();
        let mut bufs: Vec<Vec<f32>> = ins
            .iter()
            .map(|s| values(s.iter().product(), -1.0, 1.0, 5).into_iter().map(|v| v as f32).collect())
            .collect();
        let in_blobs: Vec<TBlob> = bufs
            .iter_mut()
            .zip(ins)
            .map(|(b, s)| unsafe { TBlob::new(b.as_mut_ptr() as *mut u8, s, DType::F32) })
            .collect();
        let mut obufs: Vec<Vec<f32>> = outs.iter().map(|s| vec![0.0; s.map_or(0, |s| s.iter().product())]).collect();
        let mut out_blobs: Vec<OutBlob> = obufs
            .iter_mut()
            .zip(outs)
            .map(|(b, s)| match s {
                // SAFETY: the buffers outlive the calls below and are not read meanwhile.
                Some(s) => unsafe { OutBlob::new(b.as_mut_ptr() as *mut u8, s, DType::F32) },
                None => unsafe { OutBlob::new(std::ptr::null_mut(), &[0], DType::F32) },
            })
            .collect();
        let req: Vec<Req> = outs.iter().map(|s| if s.is_some() { Req::Write } else { Req::Null }).collect();
        let cx = OpCtx { attrs: &attrs, req: &req, rng: None, is_train: true, temp: None };
        for _ in 0..3 {
            (bop.compute)(&cx, &in_blobs, &mut out_blobs).unwrap();
        }
        let reps = 30;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            (bop.compute)(&cx, &in_blobs, &mut out_blobs).unwrap();
        }
        t.elapsed().as_secs_f64() / reps as f64 * 1e3
    }

    /// Backward times of the Gluon CNN's layers (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn backward_throughput() {
        let k5 = [("kernel", "(5, 5)"), ("num_filter", "20")];
        let t = time_backward(
            "Convolution",
            &k5,
            3,
            &[&[64, 20, 24, 24], &[64, 1, 28, 28], &[20, 1, 5, 5], &[20]],
            &[None, Some(&[20, 1, 5, 5]), Some(&[20])],
        );
        eprintln!("conv1 backward (no dX): {t:.3} ms");
        let k5 = [("kernel", "(5, 5)"), ("num_filter", "50")];
        let t = time_backward(
            "Convolution",
            &k5,
            3,
            &[&[64, 50, 8, 8], &[64, 20, 12, 12], &[50, 20, 5, 5], &[50]],
            &[Some(&[64, 20, 12, 12]), Some(&[50, 20, 5, 5]), Some(&[50])],
        );
        eprintln!("conv2 backward: {t:.3} ms");
        let mp = [("kernel", "(2, 2)"), ("stride", "(2, 2)"), ("pool_type", "max")];
        let t = time_backward(
            "Pooling",
            &mp,
            1,
            &[&[64, 20, 12, 12], &[64, 20, 24, 24], &[64, 20, 12, 12]],
            &[Some(&[64, 20, 24, 24])],
        );
        eprintln!("pool1 backward: {t:.3} ms");
        let t = time_backward(
            "Pooling",
            &mp,
            1,
            &[&[64, 50, 4, 4], &[64, 50, 8, 8], &[64, 50, 4, 4]],
            &[Some(&[64, 50, 8, 8])],
        );
        eprintln!("pool2 backward: {t:.3} ms");
        let t = time_backward(
            "FullyConnected",
            &[("num_hidden", "512")],
            3,
            &[&[64, 512], &[64, 800], &[512, 800], &[512]],
            &[Some(&[64, 800]), Some(&[512, 800]), Some(&[512])],
        );
        eprintln!("fc1 backward: {t:.3} ms");
        let t = time_backward(
            "FullyConnected",
            &[("num_hidden", "10")],
            3,
            &[&[64, 10], &[64, 512], &[10, 512], &[10]],
            &[Some(&[64, 512]), Some(&[10, 512]), Some(&[10])],
        );
        eprintln!("fc2 backward: {t:.3} ms");
        let t = time_backward("Activation", &[("act_type", "relu")], 1, &[&[64, 512], &[64, 512]], &[Some(&[64, 512])]);
        eprintln!("relu backward: {t:.3} ms");
        let t = time_backward("log_softmax", &[], 1, &[&[64, 10], &[64, 10], &[64, 10]], &[Some(&[64, 10])]);
        eprintln!("log_softmax backward: {t:.3} ms");
    }
}
