//! Region proposals of Faster R-CNN's RPN: `_contrib_Proposal` (one image) and
//! `_contrib_MultiProposal` (a batch). Anchors from `scales` x `ratios` at every feature
//! position, moved by the predicted deltas (or, `iou_loss`, offsets) and clipped to the image;
//! boxes smaller than `rpn_min_size` and positions outside the image's feature extent score
//! -1; the `rpn_pre_nms_top_n` best (stable descending sort) go through NMS at `threshold`,
//! and the `rpn_post_nms_top_n` kept rows (repeated cyclically when fewer survive) are the
//! output `[batch index, x1, y1, x2, y2]`, with their scores as a second output when
//! `output_score`. The arithmetic is stock's, in float32 with its float64 steps; there is no
//! gradient (zeros), as in stock.

use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef};

op_params! {
    /// The proposal operators' parameters.
    struct ProposalParams<'a> => PROPOSAL_PARAMS {
        rpn_pre_nms_top_n: i64 = "6000", "Number of top scoring boxes to keep before applying NMS to RPN proposals";
        rpn_post_nms_top_n: i64 = "300", "Number of top scoring boxes to keep after applying NMS to RPN proposals";
        threshold: f64 = "0.7", "NMS value, below which to suppress.";
        rpn_min_size: i64 = "16", "Minimum height or width in proposal";
        scales: &'a [f64] = "(4,8,16,32)", "Used to generate anchor windows by enumerating scales";
        ratios: &'a [f64] = "(0.5,1,2)", "Used to generate anchor windows by enumerating ratios";
        feature_stride: i64 = "16", "The size of the receptive field each unit in the convolution layer of the rpn,for example the product of all stride's prior to this layer.";
        output_score: bool = "False", "Add score to outputs";
        iou_loss: bool = "False", "Usage of IoU Loss";
    }
}

fn two(_: &Attrs) -> usize {
    2
}

fn visible(a: &Attrs) -> usize {
    1 + ProposalParams::of(a).output_score as usize
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let p = ProposalParams::of(a);
    let (c, b, info) = (&ins[0], &ins[1], &ins[2]);
    if c.shape.len() != 4 || c.shape[1] % 2 != 0 {
        return Err(Error::value(format!(
            "operator {op}: cls_prob must be (batch, 2 * anchors, h, w), got {:?}",
            c.shape
        )));
    }
    let (n, a2, h, w) = (c.shape[0], c.shape[1], c.shape[2], c.shape[3]);
    if b.shape != [n, a2 * 2, h, w] || info.shape != [n, 3] {
        return Err(Error::value(format!(
            "operator {op}: bbox_pred must be {:?} and im_info {:?}, got {:?} and {:?}",
            [n, a2 * 2, h, w],
            [n, 3],
            b.shape,
            info.shape
        )));
    }
    if a2 / 2 != p.scales.len() * p.ratios.len() {
        return Err(Error::value(format!(
            "operator {op}: cls_prob has {} anchors, scales x ratios give {}",
            a2 / 2,
            p.scales.len() * p.ratios.len()
        )));
    }
    if ins.iter().any(|m| m.dtype != DType::F32) {
        return Err(Error::type_error(format!("operator {op} supports float32 only")));
    }
    if op == "_contrib_Proposal" && n != 1 {
        return Err(Error::value(format!("operator {op}: one image at a time (batch {n}); use MultiProposal")));
    }
    if p.rpn_post_nms_top_n < 1 || p.feature_stride < 1 {
        return Err(Error::value(format!("operator {op}: rpn_post_nms_top_n and feature_stride must be positive")));
    }
    let rows = n * p.rpn_post_nms_top_n as usize;
    Ok(vec![Meta::new(vec![rows, 5], DType::F32), Meta::new(vec![rows, 1], DType::F32)])
}

/// Stock's anchors (x1, y1, x2, y2) of the base box `[0, 0, stride - 1, stride - 1]`, ratios
/// outer, scales inner.
fn anchors(stride: f32, scales: &[f64], ratios: &[f64]) -> Vec<[f32; 4]> {
    let base = [0.0f32, 0.0, stride - 1.0, stride - 1.0];
    let mut out = Vec::new();
    for &ratio in ratios {
        for &scale in scales {
            let (ratio, scale) = (ratio as f32, scale as f32);
            let w = base[2] - base[0] + 1.0;
            let h = base[3] - base[1] + 1.0;
            let x_ctr = (base[0] as f64 + 0.5 * (w - 1.0) as f64) as f32;
            let y_ctr = (base[1] as f64 + 0.5 * (h - 1.0) as f64) as f32;
            let size_ratios = (w * h / ratio).floor();
            let new_w = (size_ratios.sqrt() + 0.5).floor() * scale;
            let new_h = ((new_w / scale * ratio) + 0.5).floor() * scale;
            out.push([
                x_ctr - 0.5 * (new_w - 1.0),
                y_ctr - 0.5 * (new_h - 1.0),
                x_ctr + 0.5 * (new_w - 1.0),
                y_ctr + 0.5 * (new_h - 1.0),
            ]);
        }
    }
    out
}

/// One image: its foreground scores (A, H, W), deltas (4A, H, W) and info (height, width,
/// scale); returns the kept boxes with scores, `post` rows.
fn image(
    p: &ProposalParams,
    anchors: &[[f32; 4]],
    scores: &[f32],
    deltas: &[f32],
    info: &[f32],
    (h, w): (usize, usize),
) -> Vec<[f32; 5]> {
    let na = anchors.len();
    let count = na * h * w;
    let stride = p.feature_stride as f32;
    let (im_h, im_w) = (info[0], info[1]);
    let real_h = (im_h / stride) as i64;
    let real_w = (im_w / stride) as i64;
    let mut boxes = vec![[0.0f32; 5]; count];
    for j in 0..h {
        for k in 0..w {
            for (i, an) in anchors.iter().enumerate() {
                let index = j * (w * na) + k * na + i;
                let (sx, sy) = (k as f32 * stride, j as f32 * stride);
                let b = [an[0] + sx, an[1] + sy, an[2] + sx, an[3] + sy];
                let d = |c: usize| deltas[((i * 4 + c) * h + j) * w + k];
                let (x1, y1, x2, y2) = if p.iou_loss {
                    (b[0] + d(0), b[1] + d(1), b[2] + d(2), b[3] + d(3))
                } else {
                    let width = (b[2] as f64 - b[0] as f64 + 1.0) as f32;
                    let height = (b[3] as f64 - b[1] as f64 + 1.0) as f32;
                    let ctr_x = (b[0] as f64 + 0.5 * (width as f64 - 1.0)) as f32;
                    let ctr_y = (b[1] as f64 + 0.5 * (height as f64 - 1.0)) as f32;
                    let (px, py) = (d(0) * width + ctr_x, d(1) * height + ctr_y);
                    let (pw, ph) = (d(2).exp() * width, d(3).exp() * height);
                    let half = |v: f32| 0.5 * (v as f64 - 1.0);
                    (
                        (px as f64 - half(pw)) as f32,
                        (py as f64 - half(ph)) as f32,
                        (px as f64 + half(pw)) as f32,
                        (py as f64 + half(ph)) as f32,
                    )
                };
                let clip = |v: f32, hi: f32| v.min(hi - 1.0).max(0.0);
                let mut score = scores[(i * h + j) * w + k];
                if j as i64 >= real_h || k as i64 >= real_w {
                    score = -1.0;
                }
                boxes[index] = [clip(x1, im_w), clip(y1, im_h), clip(x2, im_w), clip(y2, im_h), score];
            }
        }
    }
    let min_size = p.rpn_min_size as f32 * info[2];
    for b in boxes.iter_mut() {
        if b[2] - b[0] + 1.0 < min_size || b[3] - b[1] + 1.0 < min_size {
            b[0] -= min_size / 2.0;
            b[1] -= min_size / 2.0;
            b[2] += min_size / 2.0;
            b[3] += min_size / 2.0;
            b[4] = -1.0;
        }
    }
    let pre = if p.rpn_pre_nms_top_n > 0 { (p.rpn_pre_nms_top_n as usize).min(count) } else { count };
    let post_nms = (p.rpn_post_nms_top_n as usize).min(pre);
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by(|&a, &b| boxes[b][4].partial_cmp(&boxes[a][4]).unwrap_or(std::cmp::Ordering::Equal));
    let dets: Vec<[f32; 5]> = order[..pre].iter().map(|&i| boxes[i]).collect();
    let area: Vec<f32> = dets.iter().map(|d| (d[2] - d[0] + 1.0) * (d[3] - d[1] + 1.0)).collect();
    let mut suppressed = vec![false; pre];
    let mut keep = Vec::new();
    let thresh = p.threshold as f32;
    for i in 0..pre {
        if keep.len() >= post_nms {
            break;
        }
        if suppressed[i] {
            continue;
        }
        keep.push(i);
        for j in i + 1..pre {
            if suppressed[j] {
                continue;
            }
            let (a, b) = (&dets[i], &dets[j]);
            let iw = (a[2].min(b[2]) - a[0].max(b[0]) + 1.0).max(0.0);
            let ih = (a[3].min(b[3]) - a[1].max(b[1]) + 1.0).max(0.0);
            let inter = iw * ih;
            if inter / (area[i] + area[j] - inter) > thresh {
                suppressed[j] = true;
            }
        }
    }
    (0..p.rpn_post_nms_top_n as usize).map(|i| dets[keep[i % keep.len()]]).collect()
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = ProposalParams::of(cx.attrs);
    let (n, a2, h, w) = (ins[0].shape[0], ins[0].shape[1], ins[0].shape[2], ins[0].shape[3]);
    let na = a2 / 2;
    if na * h * w == 0 {
        return Err(Error::value(format!("operator {}: no anchors (empty feature map)", cx.attrs.op)));
    }
    let an = anchors(p.feature_stride as f32, p.scales, p.ratios);
    let (cls, deltas, info) = (ins[0].as_slice::<f32>(), ins[1].as_slice::<f32>(), ins[2].as_slice::<f32>());
    let post = p.rpn_post_nms_top_n as usize;
    let per = na * h * w;
    let mut rows = Vec::with_capacity(n * post);
    for b in 0..n {
        let scores = &cls[(b * a2 + na) * h * w..(b + 1) * a2 * h * w];
        let (ih, iw) = (info[b * 3], info[b * 3 + 1]);
        let stride = p.feature_stride as f32;
        if (ih / stride) as usize > h || (iw / stride) as usize > w {
            return Err(Error::value(format!(
                "operator {}: im_info ({ih}, {iw}) is larger than the feature map ({h}, {w}) at stride {stride}",
                cx.attrs.op
            )));
        }
        rows.extend(image(&p, &an, scores, &deltas[b * 4 * per..(b + 1) * 4 * per], &info[b * 3..b * 3 + 3], (h, w)));
    }
    let (out, score) = outs.split_at_mut(1);
    for (i, (o, r)) in out[0].as_mut::<f32>().chunks_mut(5).zip(&rows).enumerate() {
        o[0] = (i / post) as f32;
        o[1..].copy_from_slice(&r[..4]);
    }
    for (s, r) in score[0].as_mut::<f32>().iter_mut().zip(&rows) {
        *s = r[4];
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for (name, doc) in [
        ("_contrib_Proposal", "Generate region proposals via RPN (one image)."),
        ("_contrib_MultiProposal", "Generate region proposals via RPN for a batch of images: rows [batch index, x1, y1, x2, y2], rpn_post_nms_top_n per image."),
    ] {
        ops.push(
            OpDef::new(name, Inputs::Fixed(&["cls_prob", "bbox_pred", "im_info"]), Box::new(infer), Box::new(forward))
                .params(PROPOSAL_PARAMS)
                .outputs(two, visible)
                .output_names(&["output", "score"])
                .grad(Grad::Zero)
                .doc(doc),
        );
    }
}
