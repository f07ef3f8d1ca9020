//! Winograd F(4×4, 3×3) convolution: the third CPU algorithm of `Convolution`, for float32
//! 2-D 3×3 kernels with unit stride and dilation in one group (ResNet's, VGG's and DenseNet's
//! 3×3 layers).
//!
//! Owns: the transform matrices (Lavin and Gray, "Fast Algorithms for Convolutional Neural
//! Networks", 2016, interpolation points 0, ±1, ±2, ∞), the weight transform (36 `filters ×
//! channels` matrices), the cut of the output into 4×4 tiles grouped in *units* of whole
//! tile rows (of one image or several), and per unit: the input transform (36 `channels ×
//! tiles` matrices), 36 GEMMs through the shared GEMM helper, and the output transform with
//! the bias and the fused steps applied while the unit's rows are in cache.
//!
//! A direct 3×3 convolution multiplies 144 times per 4×4 outputs and channel; this one 36
//! times. The transforms are additions and small multiples with the unit's tiles as vector
//! lanes (each band row is cut into its tiles' six columns, then combined down the rows and
//! along the columns), compiled for AVX-512F or AVX2 when the CPU has them
//! (`multiversion!`). One image too small to give every thread a unit runs as one unit
//! whose phases are split over the threads instead ([`phased`]). The rounding differs from
//! the direct sum: on inputs and weights of order 1 the outputs agree to a few 1e-6 of the
//! sum of the products' magnitudes (the unit test bounds it), which is why float64 (asked
//! for precision) and float16 never take this path. Each output is summed
//! on one thread in an order fixed by the plan and the thread count: deterministic.

use super::conv::{add_bias, copy_row, Plan, Post};
use super::linalg::GemmElem;
use crate::ndarray::DType;
use crate::op::kernel::{column_blocks, par_for_mut_n, par_items, parts, ColumnBlock};

/// Output tile side.
const TILE: usize = 4;
/// Input tile side (TILE + 3 - 1).
const ALPHA: usize = 6;
/// Elements of a transformed tile: one GEMM each.
const XI: usize = ALPHA * ALPHA;

/// A unit's transformed inputs and products are about this many bytes, so that they stay in
/// the core's L2 cache between the transforms and the GEMMs...
const UNIT_BYTES: usize = 512 << 10;
/// ...but a unit has at least this many tiles (the GEMMs' columns), or all there are.
const MIN_UNIT_TILES: usize = 32;

/// One image with fewer tiles than this per thread runs [`phased`].
const PHASED_TILES: usize = 96;

/// Whether `p` is a problem this algorithm computes: 2-D (a 3-D plan of depth 1 without
/// depth padding, whose output has depth 1), a 3×3 kernel, unit stride and dilation, one
/// group. (The caller checks the dtype: float32 only.)
pub(super) fn applies(p: &Plan) -> bool {
    let planar = p.input[0] == 1 && p.pad[0] == 0 && p.output[0] == 1;
    planar && p.g == 1 && p.kernel == [1, 3, 3] && p.stride == [1; 3] && p.dilate == [1; 3]
}

/// How the output tiles of `p` are cut into units and spread over slots: each slot takes an
/// equal share (±1) of the batch's tile rows, cut into units of at most `rows` tile rows.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Units {
    /// Tile rows and columns of one output plane.
    th: usize,
    tw: usize,
    /// The most tile rows of a unit (counted over the whole batch: image `i`'s rows are
    /// `i·th..`).
    rows: usize,
    /// Unit `i` is the batch's tile rows `bounds[i]..bounds[i + 1]`.
    bounds: Vec<usize>,
    /// Slot `s` runs units `first[s]..first[s + 1]`.
    first: Vec<usize>,
    /// One image with too few tiles to give each thread a full unit: one unit of all its
    /// tiles, each phase (input transform, products, output transform) split over the
    /// threads instead ([`phased`]).
    phased: bool,
    /// The threads the cut is for (the phases' split).
    threads: usize,
}

impl Units {
    pub(super) fn of(p: &Plan, threads: usize) -> Units {
        let (th, tw) = (p.output[1].div_ceil(TILE).max(1), p.output[2].div_ceil(TILE).max(1));
        let total = p.n * th;
        if p.n == 1 && threads > 1 && th * tw < PHASED_TILES * threads {
            return Units { th, tw, rows: th, bounds: vec![0, th], first: vec![0, 1], phased: true, threads };
        }
        let per_tile = XI * (p.c + p.f) * 4;
        let want_tiles = (UNIT_BYTES / per_tile.max(1)).max(MIN_UNIT_TILES);
        let rows0 = want_tiles.div_ceil(tw).clamp(1, total.max(1));
        let slots = threads.clamp(1, total.max(1));
        let (mut bounds, mut first, mut rows) = (vec![0], vec![0], 1);
        for s in 0..slots {
            let (r0, r1) = (total * s / slots, total * (s + 1) / slots);
            let cuts = (r1 - r0).div_ceil(rows0).max(1);
            for i in 1..=cuts {
                bounds.push(r0 + (r1 - r0) * i / cuts);
            }
            first.push(bounds.len() - 1);
            rows = rows.max((r1 - r0).div_ceil(cuts));
        }
        Units { th, tw, rows, bounds, first, phased: false, threads }
    }

    fn slots(&self) -> usize {
        self.first.len() - 1
    }

    /// Elements of one slot's buffers: a unit's transformed inputs and its products.
    fn slot_len(&self, p: &Plan) -> usize {
        XI * (p.c + p.f) * self.rows * self.tw
    }

    /// Elements of workspace [`winograd`] needs for this cut of `p`: the transformed weights
    /// and each slot's buffers.
    pub(super) fn workspace(&self, p: &Plan) -> usize {
        XI * p.f * p.c + self.slots() * self.slot_len(p)
    }
}

/// Rough seconds on one core (the tuner compares it with the other algorithms' estimates):
/// the 36 GEMMs at the im2col estimate's rate, plus the transforms.
pub(super) fn estimate(p: &Plan) -> f64 {
    let tiles = (p.n * p.output[1].div_ceil(TILE) * p.output[2].div_ceil(TILE)) as f64;
    let eff = (p.f as f64 / 32.0).min(1.0) * (p.c as f64 / 32.0).min(1.0) * (tiles / 64.0).min(1.0);
    let gemm = 2.0 * XI as f64 * (p.f * p.c) as f64 * tiles / (60e9 * eff.max(1e-3));
    // Weights: about 200 operations per (filter, channel); inputs and outputs about 20 per
    // transformed element, vectorised eight to sixteen wide.
    let transforms = (200.0 * (p.f * p.c) as f64 + 20.0 * XI as f64 * tiles * (p.c + p.f) as f64) / 8e9;
    gemm + transforms
}

/// `B^T d` for one 6-vector.
#[inline(always)]
fn bt(d: [f32; 6]) -> [f32; 6] {
    [
        4.0 * d[0] - 5.0 * d[2] + d[4],
        -4.0 * (d[1] + d[2]) + d[3] + d[4],
        4.0 * (d[1] - d[2]) - d[3] + d[4],
        2.0 * (d[3] - d[1]) - d[2] + d[4],
        2.0 * (d[1] - d[3]) - d[2] + d[4],
        4.0 * d[1] - 5.0 * d[3] + d[5],
    ]
}

/// `A^T m` for one 6-vector.
#[inline(always)]
fn at(m: [f32; 6]) -> [f32; 4] {
    let (a, b, c, d) = (m[1] + m[2], m[1] - m[2], m[3] + m[4], m[3] - m[4]);
    [m[0] + a + c, b + 2.0 * d, a + 4.0 * c, b + 8.0 * d + m[5]]
}

/// 1/6, multiplied rather than divided by (a vector division costs several multiplications).
const SIXTH: f32 = 1.0 / 6.0;

/// `G g` for one 3-vector.
#[inline(always)]
fn gt(g: [f32; 3]) -> [f32; 6] {
    [
        g[0] * 0.25,
        -(g[0] + g[1] + g[2]) * SIXTH,
        -(g[0] - g[1] + g[2]) * SIXTH,
        (g[0] * 0.25 + g[1] * 0.5 + g[2]) * SIXTH,
        (g[0] * 0.25 - g[1] * 0.5 + g[2]) * SIXTH,
        g[2],
    ]
}

/// `o[r][i] = (B^T (d[0][i], ..., d[5][i]))[r]` for `i < n`: the transform applied across six
/// rows, lane by lane.
#[inline(always)]
fn bt_lanes(d: [&[f32]; 6], o: &mut [f32], ld: usize, n: usize) {
    let d = d.map(|s| &s[..n]);
    let (o0, rest) = o.split_at_mut(ld);
    let (o1, rest) = rest.split_at_mut(ld);
    let (o2, rest) = rest.split_at_mut(ld);
    let (o3, rest) = rest.split_at_mut(ld);
    let (o4, o5) = rest.split_at_mut(ld);
    let (o0, o1, o2, o3, o4, o5) = (&mut o0[..n], &mut o1[..n], &mut o2[..n], &mut o3[..n], &mut o4[..n], &mut o5[..n]);
    for i in 0..n {
        let v = bt([d[0][i], d[1][i], d[2][i], d[3][i], d[4][i], d[5][i]]);
        (o0[i], o1[i], o2[i], o3[i], o4[i], o5[i]) = (v[0], v[1], v[2], v[3], v[4], v[5]);
    }
}

/// `o[r][i] = (A^T (m[0][i], ..., m[5][i]))[r]` for `i < n`.
#[inline(always)]
fn at_lanes(m: [&[f32]; 6], o: &mut [f32], ld: usize, n: usize) {
    let m = m.map(|s| &s[..n]);
    let (o0, rest) = o.split_at_mut(ld);
    let (o1, rest) = rest.split_at_mut(ld);
    let (o2, o3) = rest.split_at_mut(ld);
    let (o0, o1, o2, o3) = (&mut o0[..n], &mut o1[..n], &mut o2[..n], &mut o3[..n]);
    for i in 0..n {
        let v = at([m[0][i], m[1][i], m[2][i], m[3][i], m[4][i], m[5][i]]);
        (o0[i], o1[i], o2[i], o3[i]) = (v[0], v[1], v[2], v[3]);
    }
}

/// `$name(args)`: `$body(args)` compiled for AVX-512F or AVX2 when the CPU has them, else for
/// the baseline target (SSE2). The bodies are elementwise (no sums whose order the vector
/// width could change, and Rust never fuses a multiply and an add), so every version gives
/// the same bits.
macro_rules! multiversion {
    ($(#[$m:meta])* fn $name:ident => $body:ident ($($arg:ident : $ty:ty),* $(,)?)) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn v4($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn v3($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F, the one feature `v4` is compiled for.
                    return unsafe { v4($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, the one feature `v3` is compiled for.
                    return unsafe { v3($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

multiversion! {
    /// See [`input_body`].
    fn input_transform => input_body(p: &Plan, tw: usize, trows: &[(usize, usize)], x: &[f32], v: &mut [f32])
}

multiversion! {
    /// See [`output_body`].
    #[allow(clippy::too_many_arguments)]
    fn output_transform => output_body(
        p: &Plan,
        tw: usize,
        nt: usize,
        m: &[f32],
        bias: Option<&[f32]>,
        post: &Post<f32>,
        segs: &mut [Segment],
        filters: std::ops::Range<usize>,
    )
}

multiversion! {
    /// See [`weights_body`].
    fn weights_of_filters => weights_body(c: usize, w: &[f32], u: &mut [f32])
}

/// Channels the weight transform handles at once (its vector lanes).
const LANES: usize = 16;

/// `u[k][ξ][c] = (G g_kc G^T)[ξ]` for the `k × c` 3×3 kernels `w`, filters split over
/// `threads` tasks.
fn transform_weights(threads: usize, k: usize, c: usize, w: &[f32], u: &mut [f32]) {
    let w = &w[..k * c * 9];
    par_for_mut_n(&mut u[..k * XI * c], XI * c, threads, 2.0 * (k * c) as f64, DType::F32, |filters, part| {
        weights_of_filters(c, &w[filters.start * c * 9..filters.end * c * 9], part)
    });
}

/// [`transform_weights`] for the filters of `w` (`c` kernels each) into `u`, `LANES` channels
/// at a time.
#[inline(always)]
fn weights_body(c: usize, w: &[f32], u: &mut [f32]) {
    for (wf, uk) in w.chunks_exact(c * 9).zip(u.chunks_exact_mut(XI * c)) {
        for c0 in (0..c).step_by(LANES) {
            let lanes = LANES.min(c - c0);
            // g[t][l]: tap t of channel c0 + l (zero past the last channel).
            let mut g = [[0.0f32; LANES]; 9];
            for l in 0..lanes {
                let src = &wf[(c0 + l) * 9..][..9];
                for t in 0..9 {
                    g[t][l] = src[t];
                }
            }
            // a[i][j] = (G g)[i][j]: G applied down each kernel column j.
            let mut a = [[[0.0f32; LANES]; 3]; 6];
            for j in 0..3 {
                for l in 0..LANES {
                    let v = gt([g[j][l], g[3 + j][l], g[6 + j][l]]);
                    for i in 0..6 {
                        a[i][j][l] = v[i];
                    }
                }
            }
            // (G g G^T)[i][j']: G applied along each row i of a.
            for (i, ai) in a.iter().enumerate() {
                let mut r = [[0.0f32; LANES]; 6];
                for l in 0..LANES {
                    let v = gt([ai[0][l], ai[1][l], ai[2][l]]);
                    for j in 0..6 {
                        r[j][l] = v[j];
                    }
                }
                for (j, rj) in r.iter().enumerate() {
                    let dst = &mut uk[(i * ALPHA + j) * c + c0..][..lanes];
                    match <&mut [f32; LANES]>::try_from(&mut *dst) {
                        // A whole block in vector moves (a `memcpy` call per 64 bytes costs
                        // more than the arithmetic).
                        Ok(block) => *block = *rj,
                        Err(_) => copy_row(dst, &rj[..lanes]),
                    }
                }
            }
        }
    }
}

/// One unit's share of the output: image `img`'s tile rows `ty0..ty1`, whose output rows are
/// the columns of `block` (every filter's plane).
struct Segment<'a> {
    img: usize,
    ty0: usize,
    ty1: usize,
    block: ColumnBlock<'a, f32>,
}

/// The convolution `p` (see [`applies`]) of `x` by `w` with Winograd's F(4×4, 3×3), plus the
/// bias and `post`, into `out`, cut as `t` (`Units::of(p, threads)`) and on its threads.
/// `ws`: at least `t.workspace(p)` elements.
#[allow(clippy::too_many_arguments)]
pub(super) fn winograd(
    p: &Plan,
    t: &Units,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    post: &Post<f32>,
    out: &mut [f32],
    ws: &mut [f32],
) {
    let threads = t.threads;
    let (c, k, oh, ow) = (p.c, p.f, p.output[1], p.output[2]);
    let osz = oh * ow;
    if p.n * k * osz == 0 {
        return;
    }
    let (u, rest) = ws.split_at_mut(XI * k * c);
    transform_weights(threads, k, c, w, u);
    let u = &*u;
    if t.phased {
        return phased(p, t, u, x, bias, post, &mut out[..k * osz], rest);
    }
    // Each image's planes cut at the unit boundaries inside it.
    let nunits = t.bounds.len() - 1;
    let mut units: Vec<Vec<Segment>> = (0..nunits).map(|_| Vec::new()).collect();
    let mut unit = 0;
    for (img, planes) in out[..p.n * k * osz].chunks_mut(k * osz).enumerate() {
        let (g0, g1) = (img * t.th, (img + 1) * t.th);
        let mut cuts = vec![g0];
        cuts.extend(t.bounds.iter().copied().filter(|&g| g > g0 && g < g1));
        cuts.push(g1);
        let bounds: Vec<usize> = cuts.iter().map(|&g| ((g - g0) * TILE).min(oh) * ow).collect();
        for (cut, block) in cuts.windows(2).zip(column_blocks(planes, k, osz, &bounds)) {
            while t.bounds[unit + 1] <= cut[0] {
                unit += 1;
            }
            units[unit].push(Segment { img, ty0: cut[0] - g0, ty1: cut[1] - g0, block });
        }
    }
    let mut it = units.into_iter();
    let runs: Vec<Vec<_>> = t.first.windows(2).map(|w| it.by_ref().take(w[1] - w[0]).collect()).collect();
    let work: Vec<_> = runs.into_iter().zip(parts(rest, t.slot_len(p), t.slots())).collect();
    par_items(work, p.flops() * 0.03, DType::F32, |_, (run, buf)| {
        for unit in run {
            run_unit(p, t, u, x, bias, post, unit, buf);
        }
    });
}

/// One unit: its tiles' input transforms, the 36 products, the output transforms.
#[allow(clippy::too_many_arguments)]
fn run_unit(
    p: &Plan,
    t: &Units,
    u: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    post: &Post<f32>,
    mut segs: Vec<Segment>,
    buf: &mut [f32],
) {
    let (c, k, tw) = (p.c, p.f, t.tw);
    // The unit's tile rows, as (image, tile row), in its tiles' order.
    let trows: Vec<(usize, usize)> = segs.iter().flat_map(|s| (s.ty0..s.ty1).map(move |ty| (s.img, ty))).collect();
    let nt = trows.len() * tw;
    let (v, m) = buf.split_at_mut(XI * c * nt);
    let m = &mut m[..XI * k * nt];
    input_transform(p, tw, &trows, x, v);
    products(p, nt, u, v, m, 0..XI);
    output_transform(p, tw, nt, m, bias, post, &mut segs, 0..k);
}

/// `m[ξ] (k × nt) = u[ξ] (k × c, rows XI·c apart) · v[ξ] (c × nt, rows XI·nt apart)` for the
/// `xis` (`m` holds those alone).
fn products(p: &Plan, nt: usize, u: &[f32], v: &[f32], m: &mut [f32], xis: std::ops::Range<usize>) {
    let (c, k) = (p.c, p.f);
    for (xi, mx) in xis.zip(m.chunks_exact_mut(k * nt)) {
        f32::mm(k, nt, c, (&u[xi * c..], (XI * c) as isize, 1), (&v[xi * nt..], (XI * nt) as isize, 1), mx, false);
    }
}

/// One image in one unit, each phase split over `threads` tasks: the input transform by
/// channels, the products by `ξ`, the output transform by filters.
#[allow(clippy::too_many_arguments)]
fn phased(
    p: &Plan,
    t: &Units,
    u: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    post: &Post<f32>,
    out: &mut [f32],
    buf: &mut [f32],
) {
    let (c, k, tw, osz, threads) = (p.c, p.f, t.tw, p.osz(), t.threads);
    let trows: Vec<(usize, usize)> = (0..t.th).map(|ty| (0, ty)).collect();
    let nt = t.th * tw;
    let (v, m) = buf.split_at_mut(XI * c * nt);
    let m = &mut m[..XI * k * nt];
    let per = 8.0 * (XI * nt) as f64;
    par_for_mut_n(v, XI * nt, threads, per * c as f64, DType::F32, |chans, part| {
        let mut sub = p.clone();
        sub.c = chans.len();
        let x = &x[chans.start * p.isz()..][..chans.len() * p.isz()];
        input_transform(&sub, tw, &trows, x, part);
    });
    let v = &*v;
    let serial = 0.02 * (XI * k * c * nt) as f64;
    par_for_mut_n(m, k * nt, threads, serial, DType::F32, |xis, part| products(p, nt, u, v, part, xis));
    let m = &*m;
    par_for_mut_n(out, osz, threads, per * k as f64, DType::F32, |filters, part| {
        let n = filters.len();
        let block = column_blocks(part, n, osz, &[0, osz]).pop().expect("one block");
        let mut segs = [Segment { img: 0, ty0: 0, ty1: t.th, block }];
        output_transform(p, tw, nt, m, bias, post, &mut segs, filters);
    });
}

/// `v[ch][ξ][j]`: the transformed 6×6 input tiles `j` (tile row `trows[j / tw]`, column
/// `j % tw`) of every channel. Per channel, each band row of each tile row is cut into its
/// tiles' six columns (`d[a][q][j]`: column `q` of tile `j`'s row `a`), combined down the
/// rows, then along the columns; both with the unit's tiles as the vector lanes.
#[inline(always)]
fn input_body(p: &Plan, tw: usize, trows: &[(usize, usize)], x: &[f32], v: &mut [f32]) {
    let (c, nt) = (p.c, trows.len() * tw);
    let (ih, iw, ph, pw) = (p.input[1], p.input[2], p.pad[1], p.pad[2]);
    let isz = ih * iw;
    // A padded input row of a band is l = 4·tw + 2 wide (ow = iw + 2·pw - 2 ≤ 4·tw).
    let l = TILE * tw + 2;
    let mut prow = vec![0.0f32; l];
    let mut d = vec![0.0f32; XI * nt];
    let mut t1 = vec![0.0f32; XI * nt];
    for ch in 0..c {
        for (tr, &(img, ty)) in trows.iter().enumerate() {
            let plane = &x[(img * c + ch) * isz..][..isz];
            for (a, da) in d.chunks_exact_mut(ALPHA * nt).enumerate() {
                let mut cols = da.chunks_exact_mut(nt).map(|col| &mut col[tr * tw..][..tw]);
                let mut next = || cols.next().expect("six columns");
                let (d0, d1, d2, d3, d4, d5) = (next(), next(), next(), next(), next(), next());
                let iy = (ty * TILE + a) as isize - ph as isize;
                if !(0..ih as isize).contains(&iy) {
                    for col in [d0, d1, d2, d3, d4, d5] {
                        col.fill(0.0);
                    }
                    continue;
                }
                // The padding columns of `prow` stay zero: only the input's are written.
                copy_row(&mut prow[pw..pw + iw], &plane[iy as usize * iw..][..iw]);
                for (i, w) in prow.chunks_exact(TILE).take(tw).enumerate() {
                    (d0[i], d1[i], d2[i], d3[i]) = (w[0], w[1], w[2], w[3]);
                }
                copy_row(&mut d4[..tw - 1], &d0[1..]);
                copy_row(&mut d5[..tw - 1], &d1[1..]);
                (d4[tw - 1], d5[tw - 1]) = (prow[TILE * tw], prow[TILE * tw + 1]);
            }
        }
        // t1[r][q] = (B^T d[.][q])[r], then v[ch][r·6 + sx] = (B^T t1[r][.])[sx].
        let col = |a: usize, q: usize| &d[(a * ALPHA + q) * nt..][..nt];
        for q in 0..ALPHA {
            bt_lanes(
                [col(0, q), col(1, q), col(2, q), col(3, q), col(4, q), col(5, q)],
                &mut t1[q * nt..],
                ALPHA * nt,
                nt,
            );
        }
        for r in 0..ALPHA {
            let row = |q: usize| &t1[(r * ALPHA + q) * nt..][..nt];
            bt_lanes([row(0), row(1), row(2), row(3), row(4), row(5)], &mut v[(ch * XI + r * ALPHA) * nt..], nt, nt);
        }
    }
}

/// The output tiles `A^T m A` of the unit's products `m[ξ][f][j]` for `filters`, written into
/// the segments' rows (block row `f - filters.start` for filter `f`), filter by filter, each followed by its bias and fused steps (lanes: all
/// the unit's tiles).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn output_body(
    p: &Plan,
    tw: usize,
    nt: usize,
    m: &[f32],
    bias: Option<&[f32]>,
    post: &Post<f32>,
    segs: &mut [Segment],
    filters: std::ops::Range<usize>,
) {
    let (k, oh, ow) = (p.f, p.output[1], p.output[2]);
    let f0 = filters.start;
    let mut q = vec![0.0f32; 24 * nt];
    let mut o = vec![0.0f32; 16 * nt];
    let mut orow = vec![0.0f32; TILE * tw];
    for f in filters {
        let mrow = |xi: usize| &m[(xi * k + f) * nt..][..nt];
        // q[r·4 + sx][j]: A^T along row r of tile j.
        for (r, qr) in q.chunks_exact_mut(4 * nt).enumerate() {
            let b = r * ALPHA;
            at_lanes([mrow(b), mrow(b + 1), mrow(b + 2), mrow(b + 3), mrow(b + 4), mrow(b + 5)], qr, nt, nt);
        }
        // o[sx·4 + ry][j]: A^T down column sx.
        for (sx, os) in o.chunks_exact_mut(4 * nt).enumerate() {
            let qc = |r: usize| &q[(r * 4 + sx) * nt..][..nt];
            at_lanes([qc(0), qc(1), qc(2), qc(3), qc(4), qc(5)], os, nt, nt);
        }
        let mut j0 = 0;
        for s in segs.iter_mut() {
            let y0 = s.ty0 * TILE;
            let seg = s.block.row(f - f0);
            for ty in s.ty0..s.ty1 {
                for ry in 0..TILE {
                    let y = ty * TILE + ry;
                    if y >= oh {
                        break;
                    }
                    let cols: [&[f32]; 4] = std::array::from_fn(|sx| &o[(sx * 4 + ry) * nt + j0..][..tw]);
                    for (i, dst) in orow.chunks_exact_mut(TILE).enumerate() {
                        dst.copy_from_slice(&[cols[0][i], cols[1][i], cols[2][i], cols[3][i]]);
                    }
                    copy_row(&mut seg[(y - y0) * ow..][..ow], &orow[..ow]);
                }
                j0 += tw;
            }
            if let Some(b) = bias {
                add_bias::<f32, f32>(seg, b[f]);
            }
            post.apply::<f32>(seg, s.img, f, y0 * ow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::conv::PostStep;
    use super::*;

    /// The transforms compose to the 3×3 correlation: for a 6×6 input tile and a 3×3
    /// kernel, `A^T [(G g G^T) ⊙ (B^T d B)] A` is the tile's 4×4 valid correlation.
    #[test]
    fn transforms_compute_the_correlation_of_a_tile() {
        let d: Vec<f32> = (0..36).map(|i| ((i * 7 % 11) as f32) * 0.25 - 1.0).collect();
        let g: Vec<f32> = (0..9).map(|i| ((i * 5 % 7) as f32) * 0.5 - 1.5).collect();
        // B^T d B: rows, then columns.
        let mut rows = [[0.0f32; 6]; 6];
        for x in 0..6 {
            let col = bt(std::array::from_fn(|y| d[y * 6 + x]));
            for r in 0..6 {
                rows[r][x] = col[r];
            }
        }
        let v: Vec<[f32; 6]> = rows.iter().map(|r| bt(*r)).collect();
        let mut gg = [[0.0f32; 3]; 6];
        for j in 0..3 {
            let col = gt([g[j], g[3 + j], g[6 + j]]);
            for i in 0..6 {
                gg[i][j] = col[i];
            }
        }
        let uu: Vec<[f32; 6]> = gg.iter().map(|r| gt(*r)).collect();
        let mut mm = [[0.0f32; 6]; 6];
        for i in 0..6 {
            for j in 0..6 {
                mm[i][j] = uu[i][j] * v[i][j];
            }
        }
        let mut q = [[0.0f32; 4]; 6];
        for r in 0..6 {
            q[r] = at(mm[r]);
        }
        for sx in 0..4 {
            let col = at(std::array::from_fn(|r| q[r][sx]));
            for (ry, &got) in col.iter().enumerate() {
                let mut want = 0.0f32;
                for ky in 0..3 {
                    for kx in 0..3 {
                        want += d[(ry + ky) * 6 + sx + kx] * g[ky * 3 + kx];
                    }
                }
                assert!((got - want).abs() < 1e-4, "({ry}, {sx}): {got} vs {want}");
            }
        }
    }

    /// Naive 2-D correlation in float64 (one group, unit stride): the outputs and each
    /// output's sum of |products| (the scale of its rounding error).
    fn naive(p: &Plan, x: &[f32], w: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let ([_, ih, iw], [_, oh, ow]) = (p.input, p.output);
        let (mut out, mut mag) = (vec![0.0; p.n * p.f * oh * ow], vec![0.0; p.n * p.f * oh * ow]);
        for n in 0..p.n {
            for f in 0..p.f {
                for y in 0..oh {
                    for xx in 0..ow {
                        let (mut s, mut a) = (0.0f64, 0.0f64);
                        for c in 0..p.c {
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let iy = (y + ky) as isize - p.pad[1] as isize;
                                    let ix = (xx + kx) as isize - p.pad[2] as isize;
                                    if iy < 0 || ix < 0 || iy >= ih as isize || ix >= iw as isize {
                                        continue;
                                    }
                                    let v = x[((n * p.c + c) * ih + iy as usize) * iw + ix as usize] as f64
                                        * w[((f * p.c + c) * 3 + ky) * 3 + kx] as f64;
                                    s += v;
                                    a += v.abs();
                                }
                            }
                        }
                        let o = ((n * p.f + f) * oh + y) * ow + xx;
                        (out[o], mag[o]) = (s, a);
                    }
                }
            }
        }
        (out, mag)
    }

    /// Whole convolutions (1-3 images, 1-4 threads, pads 0-2, sizes that leave partial tiles
    /// and units spanning images) with the bias, a residual addend and ReLU: within 1e-5 of
    /// the sum of the products' magnitudes of the float64 correlation, within the workspace
    /// declared.
    #[test]
    fn winograd_matches_the_correlation() {
        // (n, c, f, h, w, pad)
        for (n, c, f, h, w, pad) in [
            (1, 3, 4, 6, 6, 0),
            (1, 5, 7, 9, 11, 1),
            (2, 17, 5, 7, 7, 1),
            (3, 8, 33, 5, 13, 2),
            (1, 40, 24, 30, 18, 1),
            (4, 2, 3, 3, 3, 1),
        ] {
            let p = Plan::build("test", 2, [n, c, f, 1], [1, h, w], [1, 3, 3], [1; 3], [1; 3], [0, pad, pad]).unwrap();
            assert!(applies(&p));
            let x: Vec<f32> = (0..n * c * h * w).map(|i| ((i * 7 % 13) as f32) * 0.3 - 1.8).collect();
            let wt: Vec<f32> = (0..f * c * 9).map(|i| ((i * 5 % 11) as f32) * 0.2 - 1.0).collect();
            let bias: Vec<f32> = (0..f).map(|i| i as f32 * 0.5 - 1.0).collect();
            let osz = p.osz();
            let addend: Vec<f32> = (0..n * f * osz).map(|i| ((i * 3 % 7) as f32) - 3.0).collect();
            let (want, mag) = naive(&p, &x, &wt);
            let post = Post { steps: vec![PostStep::Add(&addend, true), PostStep::Relu], f, osz };
            for threads in 1..=4 {
                let units = Units::of(&p, threads);
                let mut ws = vec![f32::NAN; units.workspace(&p)];
                let mut out = vec![f32::NAN; want.len()];
                winograd(&p, &units, &x, &wt, Some(&bias), &post, &mut out, &mut ws);
                for (i, &got) in out.iter().enumerate() {
                    let e = (want[i] + bias[(i / osz) % f] as f64 + addend[i] as f64).max(0.0);
                    let tol = 1e-5 * (mag[i] + 1.0);
                    assert!((got as f64 - e).abs() <= tol, "{p:?} threads {threads} at {i}: {got} vs {e}");
                }
            }
        }
    }

    /// Only planar 3×3 stride-1 problems: a depth-1 volume padded in depth has several output
    /// planes, which the algorithm would not write.
    #[test]
    fn applies_to_planar_problems_only() {
        let build = |nsp, input, kernel, stride, pad| {
            Plan::build("test", nsp, [1, 2, 3, 1], input, kernel, stride, [1; 3], pad).unwrap()
        };
        assert!(applies(&build(2, [1, 6, 6], [1, 3, 3], [1; 3], [0, 1, 1])));
        assert!(applies(&build(3, [1, 6, 6], [1, 3, 3], [1; 3], [0, 1, 1])));
        assert!(!applies(&build(3, [1, 6, 6], [1, 3, 3], [1; 3], [1, 1, 1])));
        assert!(!applies(&build(3, [3, 6, 6], [1, 3, 3], [1; 3], [0, 1, 1])));
        assert!(!applies(&build(2, [1, 6, 6], [1, 3, 3], [1, 2, 2], [0, 1, 1])));
        assert!(!applies(&build(2, [1, 6, 6], [1, 3, 2], [1; 3], [0, 1, 1])));
    }

    /// Units cover the batch's tile rows in order, none longer than `rows`; the slots' shares
    /// differ by at most one tile row, and every thread gets one when there are rows enough;
    /// a small single image is one unit run in phases.
    #[test]
    fn units_cover_the_tile_rows() {
        for (n, c, f, hw) in [(1, 64, 64, 56), (1, 512, 512, 7), (16, 512, 512, 7), (1, 128, 32, 14), (8, 3, 3, 224)] {
            let p = Plan::build("test", 2, [n, c, f, 1], [1, hw, hw], [1, 3, 3], [1; 3], [1; 3], [0, 1, 1]).unwrap();
            for threads in [1, 2, 3, 16] {
                let u = Units::of(&p, threads);
                let total = n * u.th;
                if u.phased {
                    // One image with few tiles: one unit of them all, its phases split instead.
                    assert!(n == 1 && threads > 1 && u.th * u.tw < PHASED_TILES * threads, "{u:?}");
                    assert_eq!((&u.bounds[..], &u.first[..], u.rows), (&[0, total][..], &[0, 1][..], total));
                    continue;
                }
                assert_eq!((u.bounds[0], *u.bounds.last().unwrap()), (0, total), "{u:?}");
                assert!(u.bounds.windows(2).all(|w| w[0] < w[1] && w[1] - w[0] <= u.rows), "{u:?}");
                assert_eq!(u.slots(), threads.min(total));
                let shares: Vec<usize> = u.first.windows(2).map(|w| u.bounds[w[1]] - u.bounds[w[0]]).collect();
                let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(hi - lo <= 1 && *lo >= 1, "{hw} on {threads}: {shares:?}");
            }
        }
    }

    /// Throughput of the algorithm on ResNet's and DenseNet's 3×3 layers against the
    /// convolution's im2col + GEMM on the same threads (`cargo test --release winograd_throughput
    /// -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn winograd_throughput() {
        let threads = crate::op::kernel::pool_threads();
        for (n, c, f, hw) in [(1, 64, 64, 56), (1, 128, 128, 28), (1, 256, 256, 14), (1, 128, 32, 56), (16, 64, 64, 56)]
        {
            let p = Plan::build("bench", 2, [n, c, f, 1], [1, hw, hw], [1, 3, 3], [1; 3], [1; 3], [0, 1, 1]).unwrap();
            let x: Vec<f32> = (0..n * c * hw * hw).map(|i| ((i * 7 % 13) as f32) * 0.3 - 1.8).collect();
            let wt: Vec<f32> = (0..f * c * 9).map(|i| ((i * 5 % 11) as f32) * 0.2 - 1.0).collect();
            let mut out = vec![0.0f32; n * f * p.osz()];
            let units = Units::of(&p, threads);
            let mut ws = vec![0.0f32; units.workspace(&p)];
            let time = |run: &mut dyn FnMut()| {
                run();
                let t = std::time::Instant::now();
                for _ in 0..10 {
                    run();
                }
                t.elapsed().as_secs_f64() * 100.0
            };
            let wino = time(&mut || winograd(&p, &units, &x, &wt, None, &Post::none(), &mut out, &mut ws));
            let mut u = vec![0.0f32; XI * f * c];
            let weights = time(&mut || transform_weights(threads, f, c, &wt, &mut u));
            let mut cols = vec![0.0f32; super::super::conv::im2col_workspace(&p, threads)];
            let gemm = time(&mut || {
                super::super::conv::im2col_gemm::<f32, f32>(
                    &p,
                    threads,
                    &x,
                    &wt,
                    None,
                    &Post::none(),
                    &mut out,
                    &mut cols,
                )
            });
            println!("{n}x{c}->{f} at {hw}: winograd {wino:.3} ms (weights {weights:.3}), im2col {gemm:.3} ms");
        }
    }
}
