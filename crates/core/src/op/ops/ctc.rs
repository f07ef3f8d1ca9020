//! Connectionist Temporal Classification loss: `CTCLoss` (aliases `ctc_loss`,
//! `_contrib_CTCLoss`, `_contrib_ctc_loss`) and its backward.
//!
//! Data is `(T, batch, alphabet)` activations (before softmax), labels `(batch, L)` padded
//! with 0 (`blank_label="first"`) or -1 (`"last"`) unless `label_lengths` are given, and
//! optional `data_lengths`. The forward pass computes each sequence's log-softmax, the
//! forward (alpha) and backward (beta) variables in log space, the loss `-log p(label)` and,
//! in the hidden second output, the gradient of the loss with respect to the activations,
//! which the backward operator scales by the output gradient (as stock's warp-ctc kernel
//! does). A label sequence longer than its data allows (`L + repeats > T`) has loss 0 and
//! gradient 0; time steps past a sequence's data length get gradient 0.
//!
//! Each sequence of the batch is one task; arithmetic is in float64 for every dtype.

use super::index::read_indices;
use crate::dispatch_float;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::par_items;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    /// `CTCLoss`' parameters.
    struct CtcParams<'a> => CTC_PARAMS {
        use_data_lengths: bool = "False", "Whether the data lenghts are decided by `data_lengths`. If false, the lengths are equal to the max sequence length.";
        use_label_lengths: bool = "False", "Whether the label lenghts are decided by `label_lengths`, or derived from `padding_mask`. If false, the lengths are derived from the first occurrence of the value of `padding_mask`. The value of `padding_mask` is ``0`` when first CTC label is reserved for blank, and ``-1`` when last label is reserved for blank. See `blank_label`.";
        blank_label: &'a str = "first" in ["first", "last"], "Set the label that is reserved for blank label.If \"first\", 0-th label is reserved, and label values for tokens in the vocabulary are between ``1`` and ``alphabet_size-1``, and the padding mask is ``-1``. If \"last\", last label value ``alphabet_size-1`` is reserved for blank label instead, and label values for tokens in the vocabulary are between ``0`` and ``alphabet_size-2``, and the padding mask is ``0``.";
    }
}

const OP: &str = "CTCLoss";

/// data and label, then data_lengths and label_lengths when their flags are set.
fn input_mask(a: &Attrs) -> u32 {
    let p = CtcParams::of(a);
    0b11 | (p.use_data_lengths as u32) << 2 | (p.use_label_lengths as u32) << 3
}

fn two(_: &Attrs) -> usize {
    2
}

fn one(_: &Attrs) -> usize {
    1
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let p = CtcParams::of(a);
    let (d, l) = (&ins[0], &ins[1]);
    if d.shape.len() != 3 || d.shape[2] == 0 {
        return Err(Error::value(format!(
            "operator {OP}: data must be 3-D (time, batch, alphabet) with an alphabet, got {:?}",
            d.shape
        )));
    }
    if l.shape.len() != 2 {
        return Err(Error::value(format!("operator {OP}: label must be 2-D (batch, length), got {:?}", l.shape)));
    }
    if d.shape[1] != l.shape[0] {
        return Err(Error::value(format!(
            "operator {OP}: the batch size for the labels ({}) and data ({}) must be the same",
            l.shape[0], d.shape[1]
        )));
    }
    let mut k = 2;
    for (used, name) in [(p.use_data_lengths, "data_lengths"), (p.use_label_lengths, "label_lengths")] {
        if used {
            if ins[k].shape != [d.shape[1]] {
                return Err(Error::value(format!(
                    "operator {OP}: {name} must be a vector of the batch size {}, got {:?}",
                    d.shape[1], ins[k].shape
                )));
            }
            k += 1;
        }
    }
    if d.shape[0] < l.shape[1] {
        return Err(Error::value(format!(
            "operator {OP}: the max number of labels ({}) cannot exceed the maximum sequence length of the data ({})",
            l.shape[1], d.shape[0]
        )));
    }
    if !matches!(d.dtype, DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::type_error(format!("operator {OP}: data must be a float array, got {}", d.dtype.name())));
    }
    Ok(vec![Meta::new(vec![d.shape[1]], d.dtype), d.clone()])
}

/// `log(exp(a) + exp(b))` as warp-ctc computes it (exact when either is -inf).
fn log_plus(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    (-(a - b).abs()).exp().ln_1p() + a.max(b)
}

/// One sequence: `logp` its `(t, alphabet)` log-probabilities for its `t` steps, `labels`
/// its label indices. Returns the loss and writes the gradient rows for those steps into
/// `grad` (`want_grad`); an infeasible labelling has loss 0 and gradient 0.
fn sequence(
    logp: &[f64],
    a: usize,
    t: usize,
    labels: &[usize],
    blank: usize,
    grad: &mut [f64],
    want_grad: bool,
) -> f64 {
    let l = labels.len();
    let repeats = labels.windows(2).filter(|w| w[0] == w[1]).count();
    if l + repeats > t || t == 0 {
        return 0.0;
    }
    let s = 2 * l + 1;
    let lab = |i: usize| if i % 2 == 0 { blank } else { labels[i / 2] };
    // A transition skips the blank between two different labels.
    let skip = |i: usize| i >= 2 && lab(i) != blank && lab(i) != lab(i - 2);
    let neg = f64::NEG_INFINITY;
    let mut alpha = vec![neg; t * s];
    alpha[0] = logp[lab(0)];
    if s > 1 {
        alpha[1] = logp[lab(1)];
    }
    for ti in 1..t {
        let (prev, cur) = alpha.split_at_mut(ti * s);
        let prev = &prev[(ti - 1) * s..];
        for i in 0..s {
            let mut sum = prev[i];
            if i >= 1 {
                sum = log_plus(sum, prev[i - 1]);
            }
            if skip(i) {
                sum = log_plus(sum, prev[i - 2]);
            }
            cur[i] = sum + logp[ti * a + lab(i)];
        }
    }
    let last = &alpha[(t - 1) * s..];
    let log_z = if s > 1 { log_plus(log_plus(neg, last[s - 2]), last[s - 1]) } else { last[0] };
    if !want_grad {
        return -log_z;
    }
    // Betas (with the step's own emission, as warp-ctc's) from the end, one row at a time
    // (`next`: the step after); `out[k]` gathers log(alpha * beta) over the states labelled k.
    let mut beta = vec![neg; s];
    let mut next = vec![neg; s];
    let mut out = vec![neg; a];
    for ti in (0..t).rev() {
        let lp = &logp[ti * a..(ti + 1) * a];
        if ti == t - 1 {
            beta[s - 1] = lp[lab(s - 1)];
            if s > 1 {
                beta[s - 2] = lp[lab(s - 2)];
            }
        } else {
            next.copy_from_slice(&beta);
            for i in 0..s {
                let mut sum = next[i];
                if i + 1 < s {
                    sum = log_plus(sum, next[i + 1]);
                }
                if i + 2 < s && skip(i + 2) {
                    sum = log_plus(sum, next[i + 2]);
                }
                beta[i] = sum + lp[lab(i)];
            }
        }
        out.fill(neg);
        for i in 0..s {
            let ab = alpha[ti * s + i] + beta[i];
            out[lab(i)] = log_plus(ab, out[lab(i)]);
        }
        for (k, g) in grad[ti * a..(ti + 1) * a].iter_mut().enumerate() {
            let (o, p) = (out[k], lp[k]);
            *g = if o == 0.0 || o == neg || p == neg { p.exp() } else { p.exp() - (o - p - log_z).exp() };
        }
    }
    -log_z
}

/// Per-sequence label indices: `label_lengths` entries of each row, or those before the
/// first padding value; each within the alphabet.
fn label_rows(
    p: &CtcParams,
    label: &[i64],
    rows: usize,
    cols: usize,
    lengths: Option<&[i64]>,
    a: usize,
) -> Result<Vec<Vec<usize>>> {
    let pad = if p.blank_label == "first" { 0 } else { -1 };
    (0..rows)
        .map(|b| {
            let row = &label[b * cols..(b + 1) * cols];
            let n = match lengths {
                Some(ls) => {
                    let n = ls[b];
                    if n < 0 || n as usize > cols {
                        return Err(Error::value(format!(
                            "operator {OP}: label_lengths[{b}] = {n} is outside [0, {cols}]"
                        )));
                    }
                    n as usize
                }
                None => row.iter().position(|&v| v == pad).unwrap_or(cols),
            };
            row[..n]
                .iter()
                .map(|&v| {
                    if v < 0 || v as usize >= a {
                        Err(Error::value(format!("operator {OP}: label {v} is outside the alphabet [0, {a})")))
                    } else {
                        Ok(v as usize)
                    }
                })
                .collect()
        })
        .collect()
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let p = CtcParams::of(cx.attrs);
    let (tmax, batch, a) = (ins[0].shape[0], ins[0].shape[1], ins[0].shape[2]);
    let blank = if p.blank_label == "first" { 0 } else { a.saturating_sub(1) };
    let mut k = 2;
    let data_len: Vec<usize> = if p.use_data_lengths {
        k += 1;
        read_indices(&ins[2])
            .into_iter()
            .enumerate()
            .map(|(b, n)| {
                if n < 0 || n as usize > tmax {
                    Err(Error::value(format!("operator {OP}: data_lengths[{b}] = {n} is outside [0, {tmax}]")))
                } else {
                    Ok(n as usize)
                }
            })
            .collect::<Result<_>>()?
    } else {
        vec![tmax; batch]
    };
    let label_lengths = p.use_label_lengths.then(|| read_indices(&ins[k]));
    let labels = label_rows(&p, &read_indices(&ins[1]), batch, ins[1].shape[1], label_lengths.as_deref(), a)?;
    let data: Vec<f64> =
        dispatch_float!(ins[0].dtype, OP, T => ins[0].as_slice::<T>().iter().map(|v| v.to_f64()).collect());
    let want_grad = cx.req.get(1).is_some_and(|r| *r != Req::Null);
    // Per sequence: (loss, gradient rows for its steps).
    let mut results: Vec<(f64, Vec<f64>)> =
        (0..batch).map(|b| (0.0, vec![0.0; if want_grad { data_len[b] * a } else { 0 }])).collect();
    let cost = (tmax * a * 30) as f64;
    par_items(results.iter_mut().collect(), cost, DType::F64, |b, (loss, grad)| {
        let t = data_len[b];
        // log-softmax of each step's activations.
        let mut logp = vec![0.0; t * a];
        for ti in 0..t {
            let x = &data[(ti * batch + b) * a..(ti * batch + b + 1) * a];
            let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            let denom: f64 = x.iter().map(|&v| (v - max).exp()).sum();
            let ln = denom.ln();
            for (o, &v) in logp[ti * a..(ti + 1) * a].iter_mut().zip(x) {
                *o = v - max - ln;
            }
        }
        *loss = sequence(&logp, a, t, &labels[b], blank, grad, want_grad);
    });
    dispatch_float!(outs[0].dtype, OP, T => {
        for (o, r) in outs[0].as_mut::<T>().iter_mut().zip(&results) {
            *o = T::from_f64(r.0);
        }
        if want_grad {
            let g = outs[1].as_mut::<T>();
            g.fill(T::zero());
            for (b, (_, rows)) in results.iter().enumerate() {
                for (ti, row) in rows.chunks(a.max(1)).enumerate() {
                    for (o, &v) in g[(ti * batch + b) * a..(ti * batch + b + 1) * a].iter_mut().zip(row) {
                        *o = T::from_f64(v);
                    }
                }
            }
        }
    });
    Ok(())
}

/// Inputs (output gradient, loss, saved gradient): data's gradient is the saved gradient
/// scaled by each sequence's output gradient; the labels and lengths get zeros.
fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    for (o, r) in outs.iter_mut().zip(cx.req).skip(1) {
        if *r != Req::Null {
            o.as_bytes_mut().fill(0);
        }
    }
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (og, saved) = (&ins[0], &ins[2]);
    let (batch, a) = (saved.shape[1], saved.shape[2]);
    dispatch_float!(saved.dtype, "_backward_CTCLoss", T => {
        let (og, s, d) = (og.as_slice::<T>(), saved.as_slice::<T>(), outs[0].as_mut::<T>());
        for (i, (o, &v)) in d.iter_mut().zip(s).enumerate() {
            let b = (i / a.max(1)) % batch.max(1);
            *o = T::from_f64(og[b].to_f64() * v.to_f64());
        }
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            OP,
            Inputs::Selected(&["data", "label", "data_lengths", "label_lengths"], input_mask),
            Box::new(infer),
            Box::new(forward),
        )
        .alias(&["ctc_loss", "_contrib_CTCLoss", "_contrib_ctc_loss"])
        .params(CTC_PARAMS)
        .outputs(two, one)
        .grad(Grad::Backward { op: "_backward_ctc_loss", inputs: false, outputs: true })
        .doc("Connectionist Temporal Classification Loss.\n\nThe shapes of the inputs and outputs:\n\n- **data**: `(sequence_length, batch_size, alphabet_size)`\n- **label**: `(batch_size, label_sequence_length)`\n- **out**: `(batch_size)`\n\n``out`` is a list of CTC loss values, one per example in the batch. The data holds activations before softmax; the blank label is channel 0 (`blank_label=\"first\"`, labels padded with 0) or the last channel (`\"last\"`, padded with -1)."),
    );
    ops.push(OpDef::backward("_backward_ctc_loss", CTC_PARAMS, Box::new(backward)));
}
