//! Spatial transformer operators: `GridGenerator` (sampling grids from affine matrices or
//! optical flow), `BilinearSampler` (bilinear sampling of NCHW data at grid points in
//! [-1, 1], zero outside) and `SpatialTransformer` (both, for affine matrices), with their
//! gradients to the data, the grid and the matrices.
//!
//! Arithmetic follows stock's CPU kernels: the source coordinate `(g + 1) * (size - 1) / 2`
//! in the data's type (float32 for float16), its floor the top-left tap, the interpolation
//! and the gradients in float64. Stock's hidden outputs (the grids it keeps for its
//! backward) are not outputs here: the backward operators recompute them.

use super::nn::{read_f64, write_f64};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::par_items;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    /// `GridGenerator`'s parameters.
    struct GridParams<'a> => GRID_PARAMS {
        transform_type: &'a str = required in ["affine", "warp"], "The type of transformation. For `affine`, input data should be an affine matrix of size (batch, 6). For `warp`, input data should be an optical flow of size (batch, 2, h, w).";
        target_shape: &'a [i64] = "(0,0)", "Specifies the output shape (H, W). This is required if transformation type is `affine`. If transformation type is `warp`, this parameter is ignored.";
    }
}

op_params! {
    /// `BilinearSampler`'s parameters.
    struct SamplerParams<'a> => SAMPLER_PARAMS {
        cudnn_off: Option<bool> = "None", "whether to turn cudnn off";
    }
}

op_params! {
    /// `SpatialTransformer`'s parameters.
    struct StParams<'a> => ST_PARAMS {
        target_shape: &'a [i64] = "(0,0)", "output shape(h, w) of spatial transformer: (y, x)";
        transform_type: &'a str = required in ["affine"], "transformation type";
        sampler_type: &'a str = required in ["bilinear"], "sampling type";
        cudnn_off: Option<bool> = "None", "whether to turn cudnn off";
    }
}

fn float_data(op: &str, m: &Meta) -> Result<()> {
    if !matches!(m.dtype, DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::type_error(format!("operator {op}: data must be a float array, got {}", m.dtype.name())));
    }
    Ok(())
}

/// The (H, W) of a `target_shape` parameter, both above 0.
fn target(op: &str, t: &[i64]) -> Result<(usize, usize)> {
    match t {
        &[h, w] if h > 0 && w > 0 => Ok((h as usize, w as usize)),
        _ => Err(Error::value(format!("operator {op}: target_shape must be two sizes above 0, got {t:?}"))),
    }
}

/// The affine target grid: 3 rows (x, y, 1) of H*W normalized destination coordinates.
fn affine_grid((h, w): (usize, usize)) -> Vec<[f64; 3]> {
    let step = |n: usize| if n > 1 { 2.0 / (n - 1) as f64 } else { f64::INFINITY };
    (0..h * w).map(|i| [-1.0 + (i % w) as f64 * step(w), -1.0 + (i / w) as f64 * step(h), 1.0]).collect()
}

/// The source grid (2, H*W) of one affine matrix `m` (2x3, row-major).
fn affine_source(m: &[f64], dst: &[[f64; 3]]) -> Vec<f64> {
    let hw = dst.len();
    let mut g = vec![0.0; 2 * hw];
    for (r, row) in g.chunks_mut(hw.max(1)).enumerate() {
        for (o, d) in row.iter_mut().zip(dst) {
            *o = m[3 * r] * d[0] + m[3 * r + 1] * d[1] + m[3 * r + 2] * d[2];
        }
    }
    g
}

/// The gradient of 2x3 affine matrices from their source grids' gradient `g` (N, 2, H*W):
/// each matrix entry (row r, column k) sums the grid gradient of row r times the target
/// grid's coordinate k.
fn affine_grad(g: &[f64], dst: &[[f64; 3]]) -> Vec<f64> {
    let hw = dst.len();
    g.chunks((2 * hw).max(1))
        .flat_map(|gb| {
            (0..6).map(move |k| {
                let (r, col) = (k / 3, k % 3);
                gb[r * hw..(r + 1) * hw].iter().zip(dst).map(|(gv, dv)| gv * dv[col]).sum::<f64>()
            })
        })
        .collect()
}

/// The source coordinate of normalized `g` along an axis of `size`, in the data's precision.
fn coord(g: f64, size: usize, single: bool) -> f64 {
    if single {
        ((g as f32 + 1.0) * (size as f32 - 1.0) / 2.0) as f64
    } else {
        (g + 1.0) * (size as f64 - 1.0) / 2.0
    }
}

/// One sample point: top-left tap (y, x) and the top-left weights (wy, wx).
fn tap(gx: f64, gy: f64, (ih, iw): (usize, usize), single: bool) -> (i64, i64, f64, f64) {
    let (yr, xr) = (coord(gy, ih, single), coord(gx, iw, single));
    let (y0, x0) = (yr.floor(), xr.floor());
    let (wy, wx) = (1.0 - (yr - y0), 1.0 - (xr - x0));
    let (wy, wx) = if single { (wy as f32 as f64, wx as f32 as f64) } else { (wy, wx) };
    (y0 as i64, x0 as i64, wy, wx)
}

/// The four taps (value index or None outside, weight) of a sample point.
fn taps((y0, x0, wy, wx): (i64, i64, f64, f64), (ih, iw): (usize, usize)) -> [(Option<usize>, f64); 4] {
    let at = |y: i64, x: i64| {
        (y >= 0 && x >= 0 && (y as usize) < ih && (x as usize) < iw).then(|| y as usize * iw + x as usize)
    };
    [
        (at(y0, x0), wy * wx),
        (at(y0, x0 + 1), wy * (1.0 - wx)),
        (at(y0 + 1, x0), (1.0 - wy) * wx),
        (at(y0 + 1, x0 + 1), (1.0 - wy) * (1.0 - wx)),
    ]
}

/// Bilinear sampling of `data` (N, C, ih, iw) at `grid` (N, 2, oh, ow: x then y) into
/// (N, C, oh, ow).
fn sample(
    data: &[f64],
    grid: &[f64],
    (n, c, ih, iw): (usize, usize, usize, usize),
    ohw: usize,
    single: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; n * c * ohw];
    let items: Vec<&mut [f64]> = out.chunks_mut((c * ohw).max(1)).collect();
    par_items(items, (n * c * ohw * 8) as f64, DType::F64, |b, o| {
        let g = &grid[b * 2 * ohw..(b + 1) * 2 * ohw];
        for p in 0..ohw {
            let ts = taps(tap(g[p], g[ohw + p], (ih, iw), single), (ih, iw));
            for ch in 0..c {
                let d = &data[(b * c + ch) * ih * iw..(b * c + ch + 1) * ih * iw];
                o[ch * ohw + p] = ts.iter().map(|&(i, w)| i.map_or(0.0, |i| d[i] * w)).sum();
            }
        }
    });
    out
}

/// Gradients of [`sample`]: to the data (N, C, ih, iw) and to the grid (N, 2, oh, ow).
fn sample_back(
    dy: &[f64],
    data: &[f64],
    grid: &[f64],
    (n, c, ih, iw): (usize, usize, usize, usize),
    ohw: usize,
    single: bool,
) -> (Vec<f64>, Vec<f64>) {
    let mut gdata = vec![0.0; n * c * ih * iw];
    let mut ggrid = vec![0.0; n * 2 * ohw];
    let items: Vec<(&mut [f64], &mut [f64])> =
        gdata.chunks_mut((c * ih * iw).max(1)).zip(ggrid.chunks_mut((2 * ohw).max(1))).collect();
    par_items(items, (n * c * ohw * 16) as f64, DType::F64, |b, (gd, gg)| {
        let g = &grid[b * 2 * ohw..(b + 1) * 2 * ohw];
        for p in 0..ohw {
            let t @ (_, _, wy, wx) = tap(g[p], g[ohw + p], (ih, iw), single);
            let ts = taps(t, (ih, iw));
            let (mut gy, mut gx) = (0.0, 0.0);
            for ch in 0..c {
                let base = (b * c + ch) * ih * iw;
                let d = &data[base..base + ih * iw];
                let go = dy[(b * c + ch) * ohw + p];
                let v: [f64; 4] = std::array::from_fn(|k| ts[k].0.map_or(0.0, |i| d[i]));
                for &(i, w) in &ts {
                    if let Some(i) = i {
                        gd[ch * ih * iw + i] += go * w;
                    }
                }
                let cross = v[0] - v[1] - v[2] + v[3];
                gy -= go * (v[1] - v[3] + cross * wx);
                gx -= go * (v[2] - v[3] + cross * wy);
            }
            gg[ohw + p] = gy * (ih as f64 - 1.0) / 2.0;
            gg[p] = gx * (iw as f64 - 1.0) / 2.0;
        }
    });
    (gdata, ggrid)
}

fn dims(s: &[usize]) -> (usize, usize, usize, usize) {
    (s[0], s[1], s[2], s[3])
}

// ---- GridGenerator ----

fn grid_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    const OP: &str = "GridGenerator";
    let p = GridParams::of(a);
    let d = &ins[0];
    float_data(OP, d)?;
    if p.transform_type == "affine" {
        if d.shape.len() != 2 || d.shape[1] != 6 {
            return Err(Error::value(format!("operator {OP}: affine data must be (batch, 6), got {:?}", d.shape)));
        }
        let (h, w) = target(OP, p.target_shape)?;
        Ok(vec![Meta::new(vec![d.shape[0], 2, h, w], d.dtype)])
    } else {
        if d.shape.len() != 4 || d.shape[1] != 2 {
            return Err(Error::value(format!("operator {OP}: warp data must be (batch, 2, h, w), got {:?}", d.shape)));
        }
        Ok(vec![d.clone()])
    }
}

fn grid_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    const OP: &str = "GridGenerator";
    let p = GridParams::of(cx.attrs);
    let x = read_f64(OP, &ins[0])?;
    let out: Vec<f64> = if p.transform_type == "affine" {
        let dst = affine_grid(target(OP, p.target_shape)?);
        x.chunks(6).flat_map(|m| affine_source(m, &dst)).collect()
    } else {
        // Flow in pixels plus the pixel grid, normalized to [-1, 1].
        let (_, _, h, w) = dims(&ins[0].shape);
        let (sx, sy) = ((w as f64 - 1.0) / 2.0, (h as f64 - 1.0) / 2.0);
        x.iter()
            .enumerate()
            .map(|(i, &f)| {
                let (pix, chan) = (i % (h * w), (i / (h * w)) % 2);
                if chan == 0 {
                    (f + (pix % w) as f64) / sx - 1.0
                } else {
                    (f + (pix / w) as f64) / sy - 1.0
                }
            })
            .collect()
    };
    write_f64(OP, &mut outs[0], &out)
}

/// Inputs (output gradient): affine, the gradient times the target grid; warp, the gradient
/// divided by the normalization.
fn grid_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    const OP: &str = "_backward_GridGenerator";
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let p = GridParams::of(cx.attrs);
    let g = read_f64(OP, &ins[0])?;
    let d: Vec<f64> = if p.transform_type == "affine" {
        affine_grad(&g, &affine_grid(target(OP, p.target_shape)?))
    } else {
        let (_, _, h, w) = dims(&ins[0].shape);
        let (sx, sy) = ((w as f64 - 1.0) / 2.0, (h as f64 - 1.0) / 2.0);
        g.iter().enumerate().map(|(i, &v)| if (i / (h * w)) % 2 == 0 { v / sx } else { v / sy }).collect()
    };
    write_f64(OP, &mut outs[0], &d)
}

// ---- BilinearSampler ----

fn sampler_infer(_: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    const OP: &str = "BilinearSampler";
    let (d, g) = (&ins[0], &ins[1]);
    float_data(OP, d)?;
    if d.shape.len() != 4 || g.shape.len() != 4 || g.shape[0] != d.shape[0] || g.shape[1] != 2 {
        return Err(Error::value(format!(
            "operator {OP}: data must be (batch, channels, h, w) and grid (batch, 2, h', w'), got {:?} and {:?}",
            d.shape, g.shape
        )));
    }
    if g.dtype != d.dtype {
        return Err(Error::type_error(format!(
            "operator {OP}: grid has dtype {}, data {}",
            g.dtype.name(),
            d.dtype.name()
        )));
    }
    Ok(vec![Meta::new(vec![d.shape[0], d.shape[1], g.shape[2], g.shape[3]], d.dtype)])
}

fn sampler_forward(_: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    const OP: &str = "BilinearSampler";
    let (data, grid) = (read_f64(OP, &ins[0])?, read_f64(OP, &ins[1])?);
    let ohw = ins[1].shape[2] * ins[1].shape[3];
    let out = sample(&data, &grid, dims(&ins[0].shape), ohw, ins[0].dtype != DType::F64);
    write_f64(OP, &mut outs[0], &out)
}

/// Inputs (output gradient, data, grid).
fn sampler_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    const OP: &str = "_backward_BilinearSampler";
    let (dy, data, grid) = (read_f64(OP, &ins[0])?, read_f64(OP, &ins[1])?, read_f64(OP, &ins[2])?);
    let ohw = ins[2].shape[2] * ins[2].shape[3];
    let (gd, gg) = sample_back(&dy, &data, &grid, dims(&ins[1].shape), ohw, ins[1].dtype != DType::F64);
    if cx.req[0] != Req::Null {
        write_f64(OP, &mut outs[0], &gd)?;
    }
    if cx.req[1] != Req::Null {
        write_f64(OP, &mut outs[1], &gg)?;
    }
    Ok(())
}

// ---- SpatialTransformer ----

fn st_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    const OP: &str = "SpatialTransformer";
    let p = StParams::of(a);
    let (d, l) = (&ins[0], &ins[1]);
    float_data(OP, d)?;
    if d.shape.len() != 4 || l.shape.len() != 2 || l.shape[1] != 6 || l.shape[0] != d.shape[0] {
        return Err(Error::value(format!(
            "operator {OP}: data must be (batch, channels, h, w) and loc (batch, 6), got {:?} and {:?}",
            d.shape, l.shape
        )));
    }
    let (h, w) = target(OP, p.target_shape)?;
    Ok(vec![Meta::new(vec![d.shape[0], d.shape[1], h, w], d.dtype)])
}

/// The source grids (N, 2, H*W) of a SpatialTransformer call.
fn st_grid(a: &Attrs, loc: &[f64]) -> Result<(Vec<f64>, Vec<[f64; 3]>)> {
    let dst = affine_grid(target("SpatialTransformer", StParams::of(a).target_shape)?);
    Ok((loc.chunks(6).flat_map(|m| affine_source(m, &dst)).collect(), dst))
}

fn st_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    const OP: &str = "SpatialTransformer";
    let (data, loc) = (read_f64(OP, &ins[0])?, read_f64(OP, &ins[1])?);
    let (grid, dst) = st_grid(cx.attrs, &loc)?;
    let out = sample(&data, &grid, dims(&ins[0].shape), dst.len(), ins[0].dtype != DType::F64);
    write_f64(OP, &mut outs[0], &out)
}

/// Inputs (output gradient, data, loc): the sampler's gradients, the grid's taken back to
/// the matrices through the target grid.
fn st_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    const OP: &str = "_backward_SpatialTransformer";
    let (dy, data, loc) = (read_f64(OP, &ins[0])?, read_f64(OP, &ins[1])?, read_f64(OP, &ins[2])?);
    let (grid, dst) = st_grid(cx.attrs, &loc)?;
    let (gd, gg) = sample_back(&dy, &data, &grid, dims(&ins[1].shape), dst.len(), ins[1].dtype != DType::F64);
    if cx.req[0] != Req::Null {
        write_f64(OP, &mut outs[0], &gd)?;
    }
    if cx.req[1] != Req::Null {
        let gl = affine_grad(&gg, &dst);
        write_f64(OP, &mut outs[1], &gl)?;
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("GridGenerator", Inputs::Fixed(&["data"]), Box::new(grid_infer), Box::new(grid_forward))
            .params(GRID_PARAMS)
            .grad(Grad::Backward { op: "_backward_GridGenerator", inputs: false, outputs: false })
            .doc("Generates 2D sampling grid for bilinear sampling."),
    );
    ops.push(OpDef::backward("_backward_GridGenerator", GRID_PARAMS, Box::new(grid_backward)));
    ops.push(
        OpDef::new("BilinearSampler", Inputs::Fixed(&["data", "grid"]), Box::new(sampler_infer), Box::new(sampler_forward))
            .params(SAMPLER_PARAMS)
            .grad(Grad::Backward { op: "_backward_BilinearSampler", inputs: true, outputs: false })
            .doc("Applies bilinear sampling to input feature map. The grid (batch, 2, h, w) holds normalized source coordinates x, y in [-1, 1]; points outside the data sample zeros."),
    );
    ops.push(OpDef::backward("_backward_BilinearSampler", SAMPLER_PARAMS, Box::new(sampler_backward)));
    ops.push(
        OpDef::new("SpatialTransformer", Inputs::Fixed(&["data", "loc"]), Box::new(st_infer), Box::new(st_forward))
            .params(ST_PARAMS)
            .grad(Grad::Backward { op: "_backward_SpatialTransformer", inputs: true, outputs: false })
            .doc("Applies a spatial transformer to input feature map: an affine grid from loc (batch, 6), then bilinear sampling."),
    );
    ops.push(OpDef::backward("_backward_SpatialTransformer", ST_PARAMS, Box::new(st_backward)));
}
