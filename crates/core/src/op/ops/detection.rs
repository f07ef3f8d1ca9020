//! Bounding-box operators of object detectors: `_contrib_box_iou`, `_contrib_box_nms` (with its
//! backward), `_contrib_bipartite_matching`, `_contrib_box_encode` and `_contrib_box_decode`;
//! and the SSD family, `_contrib_MultiBoxPrior`, `_contrib_MultiBoxTarget` and
//! `_contrib_MultiBoxDetection`.
//!
//! Boxes are the last axis of 4 (corner: xmin, ymin, xmax, ymax; centre: x, y, width, height).
//! The MultiBox operators take float32 only, as stock's legacy kernels do; the others take
//! every float type. The arithmetic runs in the data's own precision (float16 in float32), in
//! stock 1.9.1's order of operations, so overlaps at a threshold decide as stock's do; sorts
//! are stable (stock's CPU sorts are), so equal scores keep their input order. Per-batch work runs on the kernel
//! pool. Only non-maximum suppression has a gradient (routed back to the kept boxes); the
//! other operators' inputs get zero gradients, as in stock.

use super::common::float32_only;
use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, par_items, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

const FORMAT_DOC: &str = "The box encoding type. \n \"corner\" means boxes are encoded as [xmin, ymin, xmax, ymax], \"center\" means boxes are encodes as [x, y, width, height].";

fn is_corner(format: &str) -> bool {
    format == "corner"
}

/// The overlap of two boxes' extents along one axis: `a`/`b` hold (start, _, end) in corner
/// format, (centre, _, size) in centre format (stock's Intersect).
#[inline]
fn intersect<R: Real>(a0: R, a2: R, b0: R, b2: R, corner: bool) -> R {
    let (left, right) = if corner {
        (if a0 > b0 { a0 } else { b0 }, if a2 < b2 { a2 } else { b2 })
    } else {
        let (aw, bw) = (a2 / R::of(2.0), b2 / R::of(2.0));
        let (al, ar, bl, br) = (a0 - aw, a0 + aw, b0 - bw, b0 + bw);
        (if bl > al { bl } else { al }, if br < ar { br } else { ar })
    };
    let w = right - left;
    if w > R::of(0.0) {
        w
    } else {
        R::of(0.0)
    }
}

#[inline]
fn area<R: Real>(b: [R; 4], corner: bool) -> R {
    let (w, h) = if corner { (b[2] - b[0], b[3] - b[1]) } else { (b[2], b[3]) };
    if w < R::of(0.0) || h < R::of(0.0) {
        R::of(0.0)
    } else {
        w * h
    }
}

#[inline]
fn overlap_area<R: Real>(a: [R; 4], b: [R; 4], corner: bool) -> R {
    intersect(a[0], a[2], b[0], b[2], corner) * intersect(a[1], a[3], b[1], b[3], corner)
}

fn load4<T: Elem, R: Real>(s: &[T]) -> [R; 4] {
    [R::load(s[0]), R::load(s[1]), R::load(s[2]), R::load(s[3])]
}

fn last_is_4(op: &str, what: &str, shape: &[usize], min_ndim: usize) -> Result<()> {
    if shape.len() < min_ndim || shape.last() != Some(&4) {
        return Err(Error::value(format!(
            "operator {op}: {what} must have at least {min_ndim} dimensions, the last of size 4, got {shape:?}"
        )));
    }
    Ok(())
}

fn same_dtypes(op: &str, ins: &[Meta]) -> Result<()> {
    super::nn::float_only(op, ins[0].dtype)?;
    if let Some(m) = ins.iter().find(|m| m.dtype != ins[0].dtype) {
        return Err(Error::type_error(format!(
            "operator {op}: inputs have dtypes {} and {}; they must be equal",
            ins[0].dtype.name(),
            m.dtype.name()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// box_iou

op_params! {
    pub(super) struct BoxIouParams<'a> => BOX_IOU_PARAMS {
        format: &'a str = "corner" in ["center", "corner"], FORMAT_DOC;
    }
}

fn box_iou_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    same_dtypes(a.op, ins)?;
    last_is_4(a.op, "lhs", &ins[0].shape, 2)?;
    last_is_4(a.op, "rhs", &ins[1].shape, 2)?;
    let (l, r) = (&ins[0].shape, &ins[1].shape);
    let shape = l[..l.len() - 1].iter().chain(&r[..r.len() - 1]).copied().collect();
    Ok(vec![Meta::new(shape, ins[0].dtype)])
}

fn box_iou(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let corner = is_corner(BoxIouParams::of(cx.attrs).format);
    let rn = ins[1].size() / 4;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (l, r) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        par_for_mut(outs[0].as_mut::<T>(), rn.max(1), Cost(rn as f64 * 10.0), T::DTYPE, |rows, part| {
            for (li, orow) in rows.zip(part.chunks_mut(rn.max(1))) {
                let a: [R; 4] = load4(&l[li * 4..]);
                for (ri, o) in orow.iter_mut().enumerate() {
                    let b: [R; 4] = load4(&r[ri * 4..]);
                    let inter = overlap_area(a, b, corner);
                    *o = if inter <= R::of(0.0) {
                        R::of(0.0)
                    } else {
                        inter / (area(a, corner) + area(b, corner) - inter)
                    }
                    .store();
                }
            }
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// box_nms

op_params! {
    pub(super) struct NmsParams<'a> => NMS_PARAMS {
        overlap_thresh: f64 = "0.5", "Overlapping(IoU) threshold to suppress object with smaller score.";
        valid_thresh: f64 = "0", "Filter input boxes to those whose scores greater than valid_thresh.";
        topk: i64 = "-1", "Apply nms to topk boxes with descending scores, -1 to no restriction.";
        coord_start: i64 = "2", "Start index of the consecutive 4 coordinates.";
        score_index: i64 = "1", "Index of the scores/confidence of boxes.";
        id_index: i64 = "-1", "Optional, index of the class categories, -1 to disable.";
        background_id: i64 = "-1", "Optional, id of the background class which will be ignored in nms.";
        force_suppress: bool = "False", "Optional, if set false and id_index is provided, nms will only apply to boxes belongs to the same category";
        in_format: &'a str = "corner" in ["center", "corner"], "The input box encoding type. \n \"corner\" means boxes are encoded as [xmin, ymin, xmax, ymax], \"center\" means boxes are encodes as [x, y, width, height].";
        out_format: &'a str = "corner" in ["center", "corner"], "The output box encoding type. \n \"corner\" means boxes are encoded as [xmin, ymin, xmax, ymax], \"center\" means boxes are encodes as [x, y, width, height].";
    }
}

/// Box NMS's checked layout: (batches, boxes per batch, row width, score, coordinates, class).
struct NmsLayout {
    batches: usize,
    boxes: usize,
    width: usize,
    score: usize,
    coord: usize,
    id: Option<usize>,
}

fn nms_layout(a: &Attrs, shape: &[usize]) -> Result<NmsLayout> {
    let op = a.op;
    let p = NmsParams::of(a);
    if shape.len() < 2 {
        return Err(Error::value(format!(
            "operator {op}: data must have at least 2 dimensions (boxes, box width), got {shape:?}"
        )));
    }
    let width = shape[shape.len() - 1];
    let expected = if p.id_index >= 0 { 6 } else { 5 };
    if width < expected {
        return Err(Error::value(format!(
            "operator {op}: the last dimension must have at least {expected} elements (score, 4 coordinates{}), got {width}",
            if p.id_index >= 0 { ", class id" } else { "" }
        )));
    }
    let w = width as i64;
    let (cs, ce) = (p.coord_start, p.coord_start + 3);
    if p.score_index < 0 || p.score_index >= w {
        return Err(Error::value(format!("operator {op}: score_index {} is out of range [0, {w})", p.score_index)));
    }
    if p.score_index >= cs && p.score_index <= ce {
        return Err(Error::value(format!(
            "operator {op}: score_index {} conflicts with the coordinates ({cs}, {ce})",
            p.score_index
        )));
    }
    if cs < 0 || ce >= w {
        return Err(Error::value(format!(
            "operator {op}: coord_start {cs}: coordinates ({cs}, {ce}) out of range [0, {w})"
        )));
    }
    let id = if p.id_index >= 0 {
        if p.id_index >= w || (p.id_index >= cs && p.id_index <= ce) || p.id_index == p.score_index {
            return Err(Error::value(format!(
                "operator {op}: id_index {} is out of range [0, {w}) or conflicts with the score or coordinates",
                p.id_index
            )));
        }
        Some(p.id_index as usize)
    } else {
        None
    };
    Ok(NmsLayout {
        batches: shape[..shape.len() - 2].iter().product(),
        boxes: shape[shape.len() - 2],
        width,
        score: p.score_index as usize,
        coord: cs as usize,
        id,
    })
}

fn nms_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    super::nn::float_only(a.op, ins[0].dtype)?;
    nms_layout(a, &ins[0].shape)?;
    let mut record = ins[0].shape.clone();
    *record.last_mut().expect("at least 2 dimensions") = 1;
    Ok(vec![ins[0].clone(), Meta::new(record, ins[0].dtype)])
}

/// Converts one box in place between corner and centre format, unless its first coordinate
/// is negative (stock skips those: they mark removed boxes).
fn convert_box<R: Real>(b: &mut [R], to_center: bool) {
    if b[0] < R::of(0.0) {
        return;
    }
    let two = R::of(2.0);
    if to_center {
        let (l, t, r, bo) = (b[0], b[1], b[2], b[3]);
        b.copy_from_slice(&[(l + r) / two, (t + bo) / two, r - l, bo - t]);
    } else {
        let (x, y, w, h) = (b[0], b[1], b[2] / two, b[3] / two);
        b.copy_from_slice(&[x - w, y - h, x + w, y + h]);
    }
}

/// One batch of box NMS: writes the kept rows (by descending score) to `out` and their
/// global input indices to `record`, -1 elsewhere.
#[allow(clippy::too_many_arguments)]
fn nms_batch<R: Real>(
    data: &[R],
    out: &mut [R],
    record: &mut [R],
    first: usize,
    lay: &NmsLayout,
    p: &NmsParams,
    topk: usize,
) {
    let w = lay.width;
    let score = |i: usize| data[i * w + lay.score];
    let valid_thresh = R::of(p.valid_thresh);
    let mut order: Vec<usize> = (0..lay.boxes)
        .filter(|&i| score(i) > valid_thresh && lay.id.is_none_or(|c| data[i * w + c] != R::of(p.background_id as f64)))
        .collect();
    order.sort_by(|&a, &b| score(b).partial_cmp(&score(a)).unwrap_or(std::cmp::Ordering::Equal));
    order.truncate(topk);
    let corner = is_corner(p.in_format);
    let boxes: Vec<[R; 4]> = order
        .iter()
        .map(|&i| {
            let b = &data[i * w + lay.coord..];
            [b[0], b[1], b[2], b[3]]
        })
        .collect();
    let areas: Vec<R> = boxes.iter().map(|&b| area(b, corner)).collect();
    let mut kept = vec![true; order.len()];
    let thresh = R::of(p.overlap_thresh as f32 as f64);
    for r in 0..order.len() {
        if !kept[r] {
            continue;
        }
        for q in r + 1..order.len() {
            if !kept[q] {
                continue;
            }
            if let (Some(c), false) = (lay.id, p.force_suppress) {
                if data[order[r] * w + c].f64() as i64 != data[order[q] * w + c].f64() as i64 {
                    continue;
                }
            }
            let inter = overlap_area(boxes[r], boxes[q], corner);
            if inter / (areas[r] + areas[q] - inter) > thresh {
                kept[q] = false;
            }
        }
    }
    out.fill(R::of(-1.0));
    record.fill(R::of(-1.0));
    for (k, &i) in order.iter().zip(&kept).filter(|(_, &k)| k).map(|(i, _)| i).enumerate() {
        out[k * w..(k + 1) * w].copy_from_slice(&data[i * w..(i + 1) * w]);
        record[k] = R::of((first + i) as f64);
    }
}

fn box_nms(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = NmsParams::of(a);
    let lay = nms_layout(a, &ins[0].shape)?;
    let (n, w) = (lay.boxes, lay.width);
    let topk = if p.topk < 0 { n } else { n.min(p.topk as usize) };
    let to_center = is_corner(p.in_format) && !is_corner(p.out_format);
    let convert = p.in_format != p.out_format;
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let data: Vec<R> = ins[0].as_slice::<T>().iter().map(|&v| R::load(v)).collect();
        let mut out = vec![R::of(0.0); data.len()];
        let mut record = vec![R::of(0.0); lay.batches * n];
        if topk == 0 {
            // Stock returns the input unchanged (no format conversion) and every index.
            out.copy_from_slice(&data);
            record.iter_mut().enumerate().for_each(|(i, r)| *r = R::of(i as f64));
        } else if n > 0 {
            let items: Vec<(&mut [R], &mut [R])> = out.chunks_mut(n * w).zip(record.chunks_mut(n)).collect();
            let cost = (lay.batches * topk * topk) as f64 * 4.0;
            par_items(items, cost, T::DTYPE, |b, (o, rec)| {
                nms_batch(&data[b * n * w..(b + 1) * n * w], o, rec, b * n, &lay, &p, topk);
            });
            if convert {
                for row in out.chunks_mut(w) {
                    convert_box(&mut row[lay.coord..lay.coord + 4], to_center);
                }
            }
        }
        for (o, v) in outs[0].as_mut::<T>().iter_mut().zip(&out) {
            *o = v.store();
        }
        if cx.req.get(1).is_some_and(|r| *r != Req::Null) {
            for (o, v) in outs[1].as_mut::<T>().iter_mut().zip(&record) {
                *o = v.store();
            }
        }
    });
    Ok(())
}

/// `_backward_contrib_box_nms(dout, out, record) -> ddata`: each kept row's gradient goes back
/// to the input row it came from; removed rows get zero.
fn box_nms_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (g, record) = (&ins[0], &ins[ins.len() - 1]);
    let w = g.shape.last().copied().unwrap_or(1).max(1);
    let rows = g.size() / w;
    dispatch_real!(g.dtype, cx.attrs.op, T, _R => {
        let (gs, rec) = (g.as_slice::<T>(), record.as_slice::<T>());
        let dx = outs[0].as_mut::<T>();
        dx.fill(T::from_f64(0.0));
        for (i, r) in rec.iter().enumerate().take(rows) {
            let src = r.to_f64();
            if src >= 0.0 && (src as usize) < rows {
                let s = src as usize;
                dx[s * w..(s + 1) * w].copy_from_slice(&gs[i * w..(i + 1) * w]);
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// bipartite_matching

op_params! {
    pub(super) struct MatchingParams<'a> => MATCHING_PARAMS {
        is_ascend: bool = "False", "Use ascend order for scores instead of descending. Please set threshold accordingly.";
        threshold: f64 = required, "Ignore matching when score < thresh, if is_ascend=false, or ignore score > thresh, if is_ascend=true.";
        topk: i64 = "-1", "Limit the number of matches to topk, set -1 for no limit";
    }
}

fn matching_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    super::nn::float_only(a.op, ins[0].dtype)?;
    let s = &ins[0].shape;
    if s.len() < 2 {
        return Err(Error::value(format!(
            "operator {}: the score matrix must have at least 2 dimensions, got {s:?}",
            a.op
        )));
    }
    let rows = s[..s.len() - 1].to_vec();
    let mut cols = s[..s.len() - 1].to_vec();
    *cols.last_mut().expect("at least 1") = s[s.len() - 1];
    Ok(vec![Meta::new(rows, ins[0].dtype), Meta::new(cols, ins[0].dtype)])
}

fn bipartite_matching(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = MatchingParams::of(cx.attrs);
    let s = &ins[0].shape;
    let (nr, nc) = (s[s.len() - 2], s[s.len() - 1]);
    let stride = nr * nc;
    if stride == 0 {
        dispatch_real!(ins[0].dtype, cx.attrs.op, T, _R => {
            outs[0].as_mut::<T>().fill(T::from_f64(-1.0));
            outs[1].as_mut::<T>().fill(T::from_f64(-1.0));
        });
        return Ok(());
    }
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let x = ins[0].as_slice::<T>();
        let thresh = R::of(p.threshold as f32 as f64);
        let (rm, cm) = outs.split_at_mut(1);
        let (rm, cm) = (rm[0].as_mut::<T>(), cm[0].as_mut::<T>());
        for ((sc, rmark), cmark) in x.chunks(stride).zip(rm.chunks_mut(nr)).zip(cm.chunks_mut(nc)) {
            let mut idx: Vec<usize> = (0..stride).collect();
            let key = |i: usize| R::load(sc[i]);
            if p.is_ascend {
                idx.sort_by(|&a, &b| key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal));
            } else {
                idx.sort_by(|&a, &b| key(b).partial_cmp(&key(a)).unwrap_or(std::cmp::Ordering::Equal));
            }
            rmark.fill(T::from_f64(-1.0));
            cmark.fill(T::from_f64(-1.0));
            let (mut rows, mut cols) = (vec![false; nr], vec![false; nc]);
            let mut count = 0i64;
            for &i in &idx {
                let (r, c) = (i / nc, i % nc);
                if rows[r] || cols[c] {
                    continue;
                }
                let v = key(i);
                if (!p.is_ascend && v > thresh) || (p.is_ascend && v < thresh) {
                    rows[r] = true;
                    cols[c] = true;
                    rmark[r] = T::from_f64(c as f64);
                    cmark[c] = T::from_f64(r as f64);
                    count += 1;
                    // Stock stops after topk + 1 matches.
                    if p.topk > 0 && count > p.topk {
                        break;
                    }
                } else {
                    break;
                }
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// box_encode, box_decode

fn box_encode_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    same_dtypes(op, ins)?;
    let (s, m, an, r) = (&ins[0].shape, &ins[1].shape, &ins[2].shape, &ins[3].shape);
    if an.len() != 3 || an[2] != 4 {
        return Err(Error::value(format!("operator {op}: anchors must be (B, N, 4), got {an:?}")));
    }
    let (b, n) = (an[0], an[1]);
    if s != &[b, n] || m != &[b, n] {
        return Err(Error::value(format!(
            "operator {op}: samples and matches must be (B, N) = ({b}, {n}), got {s:?} and {m:?}"
        )));
    }
    if r.len() != 3 || r[0] != b || r[2] != 4 {
        return Err(Error::value(format!("operator {op}: refs must be (B, M, 4) with B = {b}, got {r:?}")));
    }
    for (i, name) in [(4, "means"), (5, "stds")] {
        if ins[i].shape != [4] {
            return Err(Error::value(format!("operator {op}: {name} must have shape (4,), got {:?}", ins[i].shape)));
        }
    }
    Ok(vec![ins[2].clone(), ins[2].clone()])
}

/// A corner box as (centre x, centre y, width, height), in stock's order of operations.
fn center_of<R: Real>(b: [R; 4]) -> [R; 4] {
    let (w, h) = (b[2] - b[0], b[3] - b[1]);
    [b[0] + w * R::of(0.5), b[1] + h * R::of(0.5), w, h]
}

fn box_encode(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let op = cx.attrs.op;
    let (n, m) = (ins[2].shape[1], ins[3].shape[1]);
    dispatch_real!(ins[0].dtype, op, T, R => {
        let (samples, matches, anchors, refs) =
            (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>(), ins[3].as_slice::<T>());
        let means: [R; 4] = load4(ins[4].as_slice::<T>());
        let stds: [R; 4] = load4(ins[5].as_slice::<T>());
        let mut targets = vec![R::of(0.0); anchors.len()];
        let mut masks = vec![R::of(0.0); anchors.len()];
        for i in 0..samples.len() {
            let valid = R::load(samples[i]) > R::of(0.5);
            if !valid {
                continue;
            }
            let j = i / n.max(1);
            let mf = matches[i].to_f64();
            if !(mf >= 0.0 && (mf as usize) < m) {
                return Err(Error::value(format!(
                    "operator {op}: sample {i} is positive but its match {mf} is outside [0, {m})"
                )));
            }
            let r = center_of(load4::<T, R>(&refs[(j * m + mf as usize) * 4..]));
            let a = center_of(load4::<T, R>(&anchors[i * 4..]));
            let enc = [
                (r[0] - a[0]) / a[2],
                (r[1] - a[1]) / a[3],
                (r[2] / a[2]).ln(),
                (r[3] / a[3]).ln(),
            ];
            for k in 0..4 {
                targets[i * 4 + k] = (enc[k] - means[k]) / stds[k];
                masks[i * 4 + k] = R::of(1.0);
            }
        }
        for (o, v) in outs[0].as_mut::<T>().iter_mut().zip(&targets) {
            *o = v.store();
        }
        if cx.req[1] != Req::Null {
            for (o, v) in outs[1].as_mut::<T>().iter_mut().zip(&masks) {
                *o = v.store();
            }
        }
    });
    Ok(())
}

op_params! {
    pub(super) struct BoxDecodeParams<'a> => BOX_DECODE_PARAMS {
        std0: f64 = "1", "value to be divided from the 1st encoded values";
        std1: f64 = "1", "value to be divided from the 2nd encoded values";
        std2: f64 = "1", "value to be divided from the 3rd encoded values";
        std3: f64 = "1", "value to be divided from the 4th encoded values";
        clip: f64 = "-1", "If larger than 0, bounding box target will be clipped to this value.";
        format: &'a str = "center" in ["center", "corner"], FORMAT_DOC;
    }
}

fn box_decode_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    same_dtypes(op, ins)?;
    let (d, an) = (&ins[0].shape, &ins[1].shape);
    if d.len() != 3 || d[2] != 4 {
        return Err(Error::value(format!("operator {op}: data must be (B, N, 4), got {d:?}")));
    }
    last_is_4(op, "anchors", an, 3)?;
    if an.iter().product::<usize>() != d[1] * 4 {
        return Err(Error::value(format!("operator {op}: anchors must be (1, N, 4) with N = {}, got {an:?}", d[1])));
    }
    Ok(vec![ins[0].clone()])
}

fn box_decode(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = BoxDecodeParams::of(cx.attrs);
    let n = ins[0].shape[1].max(1);
    let corner = is_corner(p.format);
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (x, anchors) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        let f = |v: f64| R::of(v as f32 as f64);
        let (std, clip) = ([f(p.std0), f(p.std1), f(p.std2), f(p.std3)], f(p.clip));
        let has_clip = p.clip > 0.0;
        par_for_mut(outs[0].as_mut::<T>(), 4, Cost(40.0), T::DTYPE, |rows, part| {
            for (i, o) in rows.zip(part.chunks_mut(4)) {
                let mut a: [R; 4] = load4(&anchors[(i % n) * 4..]);
                if corner {
                    a = center_of(a);
                }
                let v: [R; 4] = load4(&x[i * 4..]);
                let ox = v[0] * std[0] * a[2] + a[0];
                let oy = v[1] * std[1] * a[3] + a[1];
                let (mut dw, mut dh) = (v[2] * std[2], v[3] * std[3]);
                if has_clip {
                    dw = if dw < clip { dw } else { clip };
                    dh = if dh < clip { dh } else { clip };
                }
                let ow = dw.exp() * a[2] * R::of(0.5);
                let oh = dh.exp() * a[3] * R::of(0.5);
                for (o, v) in o.iter_mut().zip([ox - ow, oy - oh, ox + ow, oy + oh]) {
                    *o = v.store();
                }
            }
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// MultiBoxPrior, MultiBoxTarget, MultiBoxDetection (SSD)

op_params! {
    pub(super) struct PriorParams<'a> => PRIOR_PARAMS {
        sizes: &'a [f64] = "[1]", "List of sizes of generated MultiBoxPriores.";
        ratios: &'a [f64] = "[1]", "List of aspect ratios of generated MultiBoxPriores.";
        clip: bool = "False", "Whether to clip out-of-boundary boxes.";
        steps: &'a [f64] = "[-1,-1]", "Priorbox step across y and x, -1 for auto calculation.";
        offsets: &'a [f64] = "[0.5,0.5]", "Priorbox center offsets, y and x respectively";
    }
}

/// The prior operator's checked (height, width, anchors per location).
fn prior_layout(a: &Attrs, shape: &[usize]) -> Result<(usize, usize, usize)> {
    let op = a.op;
    let p = PriorParams::of(a);
    if shape.len() < 4 || shape[2] == 0 || shape[3] == 0 {
        return Err(Error::value(format!(
            "operator {op}: data must be 4-D (batch, channel, y, x) with a nonzero height and width, got {shape:?}"
        )));
    }
    if p.sizes.is_empty() || p.ratios.is_empty() {
        return Err(Error::value(format!("operator {op}: sizes and ratios must not be empty")));
    }
    if p.steps.len() != 2 || p.offsets.len() != 2 {
        return Err(Error::value(format!("operator {op}: steps and offsets must have 2 values (y, x)")));
    }
    if p.offsets.iter().any(|&o| !(0.0..=1.0).contains(&(o as f32))) {
        return Err(Error::value(format!("operator {op}: offsets must lie in [0, 1], got {:?}", p.offsets)));
    }
    if p.steps[0] as f32 * p.steps[1] as f32 <= 0.0 && (p.steps[0] > 0.0 || p.steps[1] > 0.0) {
        return Err(Error::value(format!("operator {op}: specify both steps (y and x) or neither, got {:?}", p.steps)));
    }
    Ok((shape[2], shape[3], p.sizes.len() + p.ratios.len() - 1))
}

fn prior_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    float32_only(a.op, ins)?;
    let (h, w, k) = prior_layout(a, &ins[0].shape)?;
    let n = h
        .checked_mul(w)
        .and_then(|v| v.checked_mul(k))
        .ok_or_else(|| Error::value(format!("operator {}: too many anchors", a.op)))?;
    Ok(vec![Meta::new(vec![1, n, 4], ins[0].dtype)])
}

fn multibox_prior(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = PriorParams::of(a);
    let (h, w, _) = prior_layout(a, &ins[0].shape)?;
    let f = |v: f64| v as f32;
    let (mut step_y, mut step_x) = (f(p.steps[0]), f(p.steps[1]));
    if step_y <= 0.0 || step_x <= 0.0 {
        step_y = 1.0 / h as f32;
        step_x = 1.0 / w as f32;
    }
    let (off_y, off_x) = (f(p.offsets[0]), f(p.offsets[1]));
    let sizes: Vec<f32> = p.sizes.iter().map(|&v| f(v)).collect();
    let ratios: Vec<f32> = p.ratios.iter().map(|&v| f(v)).collect();
    // Per location: every size at the first ratio, then the first size at every other ratio.
    let shapes: Vec<(f32, f32)> = sizes
        .iter()
        .map(|&s| (s, ratios[0].sqrt()))
        .chain(ratios[1..].iter().map(|&r| (sizes[0], r.sqrt())))
        .map(|(s, r)| (s * h as f32 / w as f32 * r / 2.0, s / r / 2.0))
        .collect();
    let mut boxes = Vec::with_capacity(h * w * shapes.len() * 4);
    for r in 0..h {
        let cy = (r as f32 + off_y) * step_y;
        for c in 0..w {
            let cx_ = (c as f32 + off_x) * step_x;
            for &(bw, bh) in &shapes {
                boxes.extend_from_slice(&[cx_ - bw, cy - bh, cx_ + bw, cy + bh]);
            }
        }
    }
    if p.clip {
        boxes.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
    }
    dispatch_real!(ins[0].dtype, a.op, T, _R => {
        for (o, &v) in outs[0].as_mut::<T>().iter_mut().zip(&boxes) {
            *o = T::from_f64(v as f64);
        }
    });
    Ok(())
}

op_params! {
    pub(super) struct TargetParams<'a> => TARGET_PARAMS {
        overlap_threshold: f64 = "0.5", "Anchor-GT overlap threshold to be regarded as a positive match.";
        ignore_label: f64 = "-1", "Label for ignored anchors.";
        negative_mining_ratio: f64 = "-1", "Max negative to positive samples ratio, use -1 to disable mining";
        negative_mining_thresh: f64 = "0.5", "Threshold used for negative mining.";
        minimum_negative_samples: i64 = "0", "Minimum number of negative samples.";
        variances: &'a [f64] = "[0.1,0.1,0.2,0.2]", "Variances to be encoded in box regression target.";
    }
}

fn target_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    float32_only(op, ins)?;
    let (an, l, c) = (&ins[0].shape, &ins[1].shape, &ins[2].shape);
    if an.len() != 3 || an[0] != 1 || an[1] == 0 || an[2] != 4 {
        return Err(Error::value(format!("operator {op}: anchor must be (1, N, 4) with N > 0, got {an:?}")));
    }
    if l.len() != 3 || l[1] == 0 || l[2] < 5 {
        return Err(Error::value(format!("operator {op}: label must be (batch, labels > 0, width >= 5), got {l:?}")));
    }
    if c.len() != 3 || c[1] == 0 || c[2] != an[1] || c[0] != l[0] {
        return Err(Error::value(format!(
            "operator {op}: cls_pred must be (batch, classes > 0, N) = ({}, _, {}), got {c:?}",
            l[0], an[1]
        )));
    }
    if TargetParams::of(a).variances.len() != 4 {
        return Err(Error::value(format!("operator {op}: variances must have 4 values")));
    }
    let (b, n) = (l[0], an[1]);
    let d = ins[0].dtype;
    Ok(vec![Meta::new(vec![b, n * 4], d), Meta::new(vec![b, n * 4], d), Meta::new(vec![b, n], d)])
}

/// One batch of MultiBoxTarget in stock's float32 arithmetic: (location targets, masks,
/// class targets) for `anchors` (N×4), `labels` (rows of width `lw`: class, corner box) and
/// `preds` (classes×N).
fn target_batch(
    p: &TargetParams,
    anchors: &[f32],
    labels: &[f32],
    lw: usize,
    preds: &[f32],
    classes: usize,
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let na = anchors.len() / 4;
    let mut loc = vec![0.0f32; na * 4];
    let mut mask = vec![0.0f32; na * 4];
    let mut cls = vec![p.ignore_label as f32; na];
    let nl = labels.len() / lw;
    let valid = (0..nl).take_while(|&i| labels[i * lw] != -1.0).count();
    if valid == 0 {
        return Ok((loc, mask, cls));
    }
    let overlap = |j: usize, k: usize| -> f32 {
        let (a, g) = (&anchors[j * 4..j * 4 + 4], &labels[k * lw + 1..k * lw + 5]);
        let iw = (a[2].min(g[2]) - a[0].max(g[0])).max(0.0);
        let ih = (a[3].min(g[3]) - a[1].max(g[1])).max(0.0);
        let inter = iw * ih;
        let union = (a[2] - a[0]) * (a[3] - a[1]) + (g[2] - g[0]) * (g[3] - g[1]) - inter;
        if union == 0.0 {
            0.0
        } else {
            inter / union
        }
    };
    let ious: Vec<f32> = (0..na).flat_map(|j| (0..valid).map(move |k| (j, k))).map(|(j, k)| overlap(j, k)).collect();
    let best = |j: usize| -> (f32, usize) {
        let mut m = (-1.0f32, usize::MAX);
        for k in 0..valid {
            if ious[j * valid + k] > m.0 {
                m = (ious[j * valid + k], k);
            }
        }
        m
    };
    // Anchor flags: None = don't care, Some(true) positive, Some(false) negative.
    let mut flag: Vec<Option<bool>> = vec![None; na];
    let mut matched: Vec<(f32, usize)> = vec![(-1.0, usize::MAX); na];
    let mut gt_done = vec![false; valid];
    let mut positives = 0usize;
    // Each ground truth, best first, takes its best free anchor.
    while gt_done.iter().any(|d| !d) {
        let mut pick: Option<(usize, usize)> = None;
        let mut max = 1e-6f32;
        for j in (0..na).filter(|&j| flag[j] != Some(true)) {
            for k in (0..valid).filter(|&k| !gt_done[k]) {
                if ious[j * valid + k] > max {
                    pick = Some((j, k));
                    max = ious[j * valid + k];
                }
            }
        }
        let Some((j, k)) = pick else { break };
        matched[j] = (max, k);
        positives += 1;
        gt_done[k] = true;
        flag[j] = Some(true);
    }
    let threshold = p.overlap_threshold as f32;
    if threshold > 0.0 {
        for j in 0..na {
            if flag[j] == Some(true) {
                continue;
            }
            let (m, k) = best(j);
            if k != usize::MAX {
                matched[j] = (m, k);
                if m > threshold {
                    positives += 1;
                    gt_done[k] = true;
                    flag[j] = Some(true);
                }
            }
        }
    }
    let ratio = p.negative_mining_ratio as f32;
    if ratio > 0.0 {
        let thresh = p.negative_mining_thresh as f32;
        if thresh <= 0.0 {
            return Err(Error::value(
                "operator _contrib_MultiBoxTarget: negative_mining_thresh must be > 0".to_string(),
            ));
        }
        let negatives = ((positives as f32 * ratio) as usize).min(na - positives);
        if negatives > 0 {
            let mut cand: Vec<(f32, usize)> = Vec::new();
            for j in (0..na).filter(|&j| flag[j] != Some(true)) {
                if matched[j].0 < 0.0 {
                    let (m, k) = best(j);
                    if k != usize::MAX {
                        matched[j] = (m, k);
                    }
                }
                if matched[j].0 < thresh && flag[j].is_none() {
                    let logit = |c: usize| preds[c * na + j];
                    let max = (1..classes).fold(logit(0), |m, c| if logit(c) > m { logit(c) } else { m });
                    let sum: f32 = (0..classes).map(|c| (logit(c) - max).exp()).sum();
                    cand.push((-((logit(0) - max).exp() / sum), j));
                }
            }
            if cand.len() < negatives {
                return Err(Error::value(format!(
                    "operator _contrib_MultiBoxTarget: {} negative candidates for {negatives} negatives (raise negative_mining_thresh)",
                    cand.len()
                )));
            }
            // Hardest negatives (least background probability) first, ties in anchor order.
            cand.sort_by(|x, y| y.0.partial_cmp(&x.0).unwrap_or(std::cmp::Ordering::Equal));
            for &(_, j) in &cand[..negatives] {
                flag[j] = Some(false);
            }
        }
    } else {
        flag.iter_mut().filter(|f| **f != Some(true)).for_each(|f| *f = Some(false));
    }
    let v: Vec<f32> = p.variances.iter().map(|&x| x as f32).collect();
    for j in 0..na {
        match flag[j] {
            Some(true) => {
                let k = matched[j].1;
                cls[j] = labels[k * lw] + 1.0;
                mask[j * 4..j * 4 + 4].fill(1.0);
                let (a, g) = (&anchors[j * 4..j * 4 + 4], &labels[k * lw + 1..k * lw + 5]);
                let (aw, ah) = (a[2] - a[0], a[3] - a[1]);
                let (ax, ay) = ((a[0] + a[2]) * 0.5, (a[1] + a[3]) * 0.5);
                let (gw, gh) = (g[2] - g[0], g[3] - g[1]);
                let (gx, gy) = ((g[0] + g[2]) * 0.5, (g[1] + g[3]) * 0.5);
                loc[j * 4..j * 4 + 4].copy_from_slice(&[
                    (gx - ax) / aw / v[0],
                    (gy - ay) / ah / v[1],
                    (gw / aw).ln() / v[2],
                    (gh / ah).ln() / v[3],
                ]);
            }
            Some(false) => cls[j] = 0.0,
            None => {}
        }
    }
    Ok((loc, mask, cls))
}

fn multibox_target(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = TargetParams::of(a);
    let (lb, lw) = (ins[1].shape[0], ins[1].shape[2]);
    let classes = ins[2].shape[1];
    dispatch_real!(ins[0].dtype, a.op, T, _R => {
        let f32s = |b: &TBlob| -> Vec<f32> { b.as_slice::<T>().iter().map(|v| v.to_f64() as f32).collect() };
        let (anchors, labels, preds) = (f32s(&ins[0]), f32s(&ins[1]), f32s(&ins[2]));
        let na = anchors.len() / 4;
        let per_label = labels.len() / lb.max(1);
        let mut all = Vec::with_capacity(lb);
        for b in 0..lb {
            all.push(target_batch(
                &p,
                &anchors,
                &labels[b * per_label..(b + 1) * per_label],
                lw,
                &preds[b * classes * na..(b + 1) * classes * na],
                classes,
            )?);
        }
        for (k, pick) in [0usize, 1, 2].into_iter().enumerate() {
            if cx.req[k] == Req::Null {
                continue;
            }
            let flat = all.iter().flat_map(|t| match pick { 0 => &t.0, 1 => &t.1, _ => &t.2 }.iter());
            for (o, &v) in outs[k].as_mut::<T>().iter_mut().zip(flat) {
                *o = T::from_f64(v as f64);
            }
        }
    });
    Ok(())
}

op_params! {
    pub(super) struct DetectionParams<'a> => DETECTION_PARAMS {
        clip: bool = "True", "Clip out-of-boundary boxes.";
        threshold: f64 = "0.00999999978", "Threshold to be a positive prediction.";
        background_id: i64 = "0", "Background id.";
        nms_threshold: f64 = "0.5", "Non-maximum suppression threshold.";
        force_suppress: bool = "False", "Suppress all detections regardless of class_id.";
        variances: &'a [f64] = "[0.1,0.1,0.2,0.2]", "Variances to be decoded from box regression output.";
        nms_topk: i64 = "-1", "Keep maximum top k detections before nms, -1 for no limit.";
    }
}

fn detection_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    float32_only(op, ins)?;
    let (c, l, an) = (&ins[0].shape, &ins[1].shape, &ins[2].shape);
    if c.len() != 3 || l.len() != 2 || an.len() != 3 {
        return Err(Error::value(format!(
            "operator {op}: cls_prob must be 3-D, loc_pred 2-D and anchor 3-D, got {c:?}, {l:?}, {an:?}"
        )));
    }
    if c[2] != an[1] || an[1] == 0 || an[2] != 4 || l[1] != c[2] * 4 || l[0] != c[0] || an[0] != 1 {
        return Err(Error::value(format!(
            "operator {op}: anchors mismatch: cls_prob {c:?} (batch, classes, N), loc_pred {l:?} (batch, N*4), anchor {an:?} (1, N, 4)"
        )));
    }
    if DetectionParams::of(a).variances.len() != 4 {
        return Err(Error::value(format!("operator {op}: variances must have 4 values")));
    }
    Ok(vec![Meta::new(vec![c[0], an[1], 6], ins[0].dtype)])
}

/// One batch of MultiBoxDetection into `out` (N rows of class, score, corner box).
fn detection_batch<R: Real>(p: &DetectionParams, probs: &[R], loc: &[R], anchors: &[R], classes: usize, out: &mut [R]) {
    let na = anchors.len() / 4;
    let v: Vec<R> = p.variances.iter().map(|&x| R::of(x as f32 as f64)).collect();
    let (zero, one, two) = (R::of(0.0), R::of(1.0), R::of(2.0));
    let clip = |x: R| {
        if p.clip {
            if x > one {
                one
            } else if x < zero {
                zero
            } else {
                x
            }
        } else {
            x
        }
    };
    let threshold = R::of(p.threshold as f32 as f64);
    out.fill(-one);
    let mut count = 0;
    for i in 0..na {
        let (mut score, mut id) = (-one, 0usize);
        for j in 1..classes {
            if probs[j * na + i] > score {
                score = probs[j * na + i];
                id = j;
            }
        }
        if id == 0 || score < threshold {
            continue;
        }
        let (a, l) = (&anchors[i * 4..i * 4 + 4], &loc[i * 4..i * 4 + 4]);
        let (aw, ah) = (a[2] - a[0], a[3] - a[1]);
        let (ax, ay) = ((a[0] + a[2]) / two, (a[1] + a[3]) / two);
        let (ox, oy) = (l[0] * v[0] * aw + ax, l[1] * v[1] * ah + ay);
        let (ow, oh) = ((l[2] * v[2]).exp() * aw / two, (l[3] * v[3]).exp() * ah / two);
        out[count * 6..count * 6 + 6].copy_from_slice(&[
            R::of(id as f64 - 1.0),
            score,
            clip(ox - ow),
            clip(oy - oh),
            clip(ox + ow),
            clip(oy + oh),
        ]);
        count += 1;
    }
    let nms = p.nms_threshold as f32 as f64;
    if count == 0 || nms <= 0.0 || nms > 1.0 {
        return;
    }
    let nms = R::of(nms);
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by(|&x, &y| out[y * 6 + 1].partial_cmp(&out[x * 6 + 1]).unwrap_or(std::cmp::Ordering::Equal));
    let keep = if p.nms_topk > 0 && (p.nms_topk as usize) < count { p.nms_topk as usize } else { count };
    let unsorted = out[..count * 6].to_vec();
    for i in keep..count {
        out[i * 6] = -one;
    }
    for (i, &src) in order[..keep].iter().enumerate() {
        out[i * 6..i * 6 + 6].copy_from_slice(&unsorted[src * 6..src * 6 + 6]);
    }
    let iou = |a: &[R], b: &[R]| -> R {
        let w = {
            let d = (if a[2] < b[2] { a[2] } else { b[2] }) - (if a[0] > b[0] { a[0] } else { b[0] });
            if d > zero {
                d
            } else {
                zero
            }
        };
        let h = {
            let d = (if a[3] < b[3] { a[3] } else { b[3] }) - (if a[1] > b[1] { a[1] } else { b[1] });
            if d > zero {
                d
            } else {
                zero
            }
        };
        let i = w * h;
        let u = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - i;
        if u <= zero {
            zero
        } else {
            i / u
        }
    };
    for i in 0..keep {
        if out[i * 6] < zero {
            continue;
        }
        for j in i + 1..keep {
            if out[j * 6] < zero {
                continue;
            }
            if (p.force_suppress || out[i * 6] == out[j * 6])
                && iou(&out[i * 6 + 2..i * 6 + 6], &out[j * 6 + 2..j * 6 + 6]) >= nms
            {
                out[j * 6] = -one;
            }
        }
    }
}

fn multibox_detection(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = DetectionParams::of(a);
    let (b, classes, na) = (ins[0].shape[0], ins[0].shape[1], ins[0].shape[2]);
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let load = |t: &TBlob| -> Vec<R> { t.as_slice::<T>().iter().map(|&v| R::load(v)).collect() };
        let (probs, loc, anchors) = (load(&ins[0]), load(&ins[1]), load(&ins[2]));
        let mut out = vec![R::of(0.0); b * na * 6];
        let items: Vec<&mut [R]> = out.chunks_mut((na * 6).max(1)).collect();
        par_items(items, (na * classes + na * na) as f64 * 2.0, T::DTYPE, |i, o| {
            let probs = &probs[i * classes * na..(i + 1) * classes * na];
            detection_batch(&p, probs, &loc[i * na * 4..(i + 1) * na * 4], &anchors, classes, o);
        });
        for (o, v) in outs[0].as_mut::<T>().iter_mut().zip(&out) {
            *o = v.store();
        }
    });
    Ok(())
}

fn one(_: &Attrs) -> usize {
    1
}
fn two(_: &Attrs) -> usize {
    2
}
fn three(_: &Attrs) -> usize {
    3
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_contrib_box_iou", Inputs::Fixed(&["lhs", "rhs"]), Box::new(box_iou_infer), Box::new(box_iou))
            .params(BOX_IOU_PARAMS)
            .grad(Grad::Zero)
            .doc("Bounding box overlap of two arrays: the intersection over union of every pair of boxes in lhs (..., 4) and rhs (..., 4), shape lhs.shape[:-1] + rhs.shape[:-1]."),
    );
    ops.push(
        OpDef::new("_contrib_box_nms", Inputs::Fixed(&["data"]), Box::new(nms_infer), Box::new(box_nms))
            .alias(&["_contrib_box_non_maximum_suppression"])
            .params(NMS_PARAMS)
            .outputs(two, one)
            .grad(Grad::Backward { op: "_backward_contrib_box_nms", inputs: false, outputs: true })
            .doc("Apply non-maximum suppression to input. The boxes of each batch above valid_thresh (and not of background_id) are sorted by descending score; up to topk of them are kept unless a higher-scoring kept box overlaps them by more than overlap_thresh (of the same class unless force_suppress). Kept boxes come first, the rest of the output is -1."),
    );
    ops.push(OpDef::backward("_backward_contrib_box_nms", NMS_PARAMS, Box::new(box_nms_backward)));
    ops.push(
        OpDef::new("_contrib_bipartite_matching", Inputs::Fixed(&["data"]), Box::new(matching_infer), Box::new(bipartite_matching))
            .params(MATCHING_PARAMS)
            .outputs(two, two)
            .grad(Grad::Zero)
            .doc("Compute bipartite matching. Greedily matches the best-scoring (row, column) pairs of each (..., rows, cols) score matrix; outputs the matched column of each row and the matched row of each column, -1 where unmatched."),
    );
    ops.push(
        OpDef::new(
            "_contrib_box_encode",
            Inputs::Fixed(&["samples", "matches", "anchors", "refs", "means", "stds"]),
            Box::new(box_encode_infer),
            Box::new(box_encode),
        )
        .outputs(two, two)
        .grad(Grad::Zero)
        .doc("Encode bounding boxes training target with normalized center offsets. Outputs the encoded targets (B, N, 4) of the positive samples' matched reference boxes relative to their anchors, and the masks."),
    );
    ops.push(
        OpDef::new("_contrib_box_decode", Inputs::Fixed(&["data", "anchors"]), Box::new(box_decode_infer), Box::new(box_decode))
            .params(BOX_DECODE_PARAMS)
            .grad(Grad::Zero)
            .doc("Decode bounding boxes training target with normalized center offsets: (B, N, 4) offsets relative to (1, N, 4) anchors to corner boxes."),
    );
    ops.push(
        OpDef::new("_contrib_MultiBoxPrior", Inputs::Fixed(&["data"]), Box::new(prior_infer), Box::new(multibox_prior))
            .alias(&["_npx_multibox_prior"])
            .params(PRIOR_PARAMS)
            .grad(Grad::Zero)
            .doc("Generate prior(anchor) boxes from data, sizes and ratios: (1, height*width*(sizes+ratios-1), 4) corner boxes centred on every location of the feature map."),
    );
    ops.push(
        OpDef::new(
            "_contrib_MultiBoxTarget",
            Inputs::Fixed(&["anchor", "label", "cls_pred"]),
            Box::new(target_infer),
            Box::new(multibox_target),
        )
        .alias(&["_npx_multibox_target"])
        .params(TARGET_PARAMS)
        .outputs(three, three)
        .grad(Grad::Zero)
        .doc("Compute Multibox training targets: location targets, location masks and class targets of every anchor from the ground-truth labels (with optional hard negative mining)."),
    );
    ops.push(
        OpDef::new(
            "_contrib_MultiBoxDetection",
            Inputs::Fixed(&["cls_prob", "loc_pred", "anchor"]),
            Box::new(detection_infer),
            Box::new(multibox_detection),
        )
        .alias(&["_npx_multibox_detection"])
        .params(DETECTION_PARAMS)
        .grad(Grad::Zero)
        .doc("Convert multibox detection predictions: decode the boxes, pick each anchor's best class, and suppress overlapping detections (rows of class id, score, xmin, ymin, xmax, ymax; -1 for removed)."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_in_both_formats() {
        let a = [0.0f64, 0.0, 2.0, 2.0];
        let b = [1.0f64, 1.0, 3.0, 3.0];
        // Intersection 1, union 4 + 4 - 1.
        assert_eq!(overlap_area(a, b, true), 1.0);
        assert_eq!(area(a, true), 4.0);
        // The same boxes as (centre, size).
        let (ac, bc) = ([1.0f64, 1.0, 2.0, 2.0], [2.0f64, 2.0, 2.0, 2.0]);
        assert_eq!(overlap_area(ac, bc, false), 1.0);
        // An inverted box has no area.
        assert_eq!(area([2.0f64, 0.0, 1.0, 1.0], true), 0.0);
    }

    #[test]
    fn nms_keeps_the_best_of_each_cluster_per_class() {
        // Rows (id, score, x1, y1, x2, y2): boxes 0 and 1 overlap (IoU 0.81), box 2 is apart,
        // box 3 overlaps box 0 but has another class, box 4 is below valid_thresh.
        let data: Vec<f64> = [
            [0.0, 0.6, 0.0, 0.0, 1.0, 1.0],
            [0.0, 0.9, 0.0, 0.0, 0.9, 0.9],
            [0.0, 0.7, 2.0, 2.0, 3.0, 3.0],
            [1.0, 0.5, 0.0, 0.0, 1.0, 1.0],
            [0.0, 0.05, 5.0, 5.0, 6.0, 6.0],
        ]
        .concat();
        let lay = NmsLayout { batches: 1, boxes: 5, width: 6, score: 1, coord: 2, id: Some(0) };
        let attrs = lookup_attrs(&[("id_index", "0"), ("valid_thresh", "0.1")]);
        let p = NmsParams::of(&attrs);
        let (mut out, mut record) = (vec![0.0; 30], vec![0.0; 5]);
        nms_batch(&data, &mut out, &mut record, 10, &lay, &p, 5);
        // By descending score: 1 (0.9), 2 (0.7), 3 (0.5, other class); 0 suppressed by 1.
        assert_eq!(record, [11.0, 12.0, 13.0, -1.0, -1.0]);
        assert_eq!(&out[..6], &data[6..12]);
        assert!(out[18..].iter().all(|&v| v == -1.0));
        // With force_suppress the other class's box goes too.
        let attrs = lookup_attrs(&[("id_index", "0"), ("valid_thresh", "0.1"), ("force_suppress", "True")]);
        let p = NmsParams::of(&attrs);
        nms_batch(&data, &mut out, &mut record, 0, &lay, &p, 5);
        assert_eq!(record, [1.0, 2.0, -1.0, -1.0, -1.0]);
        // topk 1 considers only the best box.
        nms_batch(&data, &mut out, &mut record, 0, &lay, &p, 1);
        assert_eq!(record, [1.0, -1.0, -1.0, -1.0, -1.0]);
    }

    fn lookup_attrs(kv: &[(&str, &str)]) -> Attrs {
        crate::op::lookup("_contrib_box_nms").unwrap().parse_attrs(kv.iter().copied(), 1).unwrap()
    }
}
