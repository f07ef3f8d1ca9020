//! Variable-length sequence operators: `SequenceMask`, `SequenceLast`, `SequenceReverse` and
//! their backward operators.
//!
//! The data is `[max_len, batch, ...]` (`axis=0`) or `[batch, max_len, ...]` (`axis=1`;
//! `SequenceReverse` takes only 0); with `use_sequence_length` a second input gives each batch
//! entry's length (any dtype, values truncated toward zero), else every length is `max_len`.
//! The kernels move whole rows (the trailing dimensions) and run on the kernel pool.

use super::init::fill;
use super::strided::{by_size, elems, elems_mut};
use crate::error::{Error, Result};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};
use crate::{dispatch_all, dispatch_float};

const LENGTH_DOC: &str = "If set to true, this layer takes in an extra input parameter `sequence_length` to specify variable length sequence";
const AXIS_DOC: &str = "The sequence axis. Only values of 0 and 1 are currently supported.";

op_params! {
    pub(super) struct MaskParams<'a> => MASK_PARAMS {
        use_sequence_length: bool = "0", LENGTH_DOC;
        value: f64 = "0", "The value to be used as a mask.";
        axis: i64 = "0", AXIS_DOC;
    }
}

op_params! {
    pub(super) struct LastParams<'a> => LAST_PARAMS {
        use_sequence_length: bool = "0", LENGTH_DOC;
        axis: i64 = "0", AXIS_DOC;
    }
}

op_params! {
    pub(super) struct ReverseParams<'a> => REVERSE_PARAMS {
        use_sequence_length: bool = "0", LENGTH_DOC;
        axis: i64 = "0", "The sequence axis. Only 0 is currently supported.";
    }
}

/// Which operator of the family a call is, with its parameters.
#[derive(Clone, Copy)]
enum Seq {
    Mask { value: f64 },
    Last,
    Reverse,
}

/// A call's kind, whether it has the lengths input, and the sequence axis.
fn args(a: &Attrs) -> (Seq, bool, i64) {
    if a.declares(MASK_PARAMS) {
        let p = MaskParams::of(a);
        (Seq::Mask { value: p.value }, p.use_sequence_length, p.axis)
    } else if a.declares(LAST_PARAMS) {
        let p = LastParams::of(a);
        (Seq::Last, p.use_sequence_length, p.axis)
    } else {
        let p = ReverseParams::of(a);
        (Seq::Reverse, p.use_sequence_length, p.axis)
    }
}

fn inputs(a: &Attrs) -> usize {
    1 + args(a).1 as usize
}

/// The data's layout: sequence length, batch size, row length, and the axis (0 or 1).
#[derive(Clone, Copy)]
struct Geom {
    len: usize,
    batch: usize,
    row: usize,
    axis: usize,
}

impl Geom {
    fn of(op: &str, a: &Attrs, shape: &[usize]) -> Result<Geom> {
        let (kind, _, axis) = args(a);
        let allowed: &[i64] = if matches!(kind, Seq::Reverse) { &[0] } else { &[0, 1] };
        if !allowed.contains(&axis) {
            return Err(Error::mxnet(format!("operator {op}: axis must be {allowed:?}, got {axis}")));
        }
        if shape.len() < 2 {
            return Err(Error::mxnet(format!(
                "operator {op}: data must have at least 2 dimensions (sequence and batch), got shape {shape:?}"
            )));
        }
        let axis = axis as usize;
        let (len, batch) = if axis == 0 { (shape[0], shape[1]) } else { (shape[1], shape[0]) };
        Ok(Geom { len, batch, row: shape[2..].iter().product(), axis })
    }

    /// The row of time `t` of batch entry `b`.
    fn at(&self, t: usize, b: usize) -> usize {
        if self.axis == 0 {
            t * self.batch + b
        } else {
            b * self.len + t
        }
    }

    /// The (time, batch entry) of row `r`.
    fn of_row(&self, r: usize) -> (usize, usize) {
        if self.axis == 0 {
            (r / self.batch, r % self.batch)
        } else {
            (r % self.len, r / self.len)
        }
    }
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let (kind, with_lengths, _) = args(a);
    let g = Geom::of(a.op, a, &ins[0].shape)?;
    if with_lengths && ins[1].shape != [g.batch] {
        return Err(Error::mxnet(format!(
            "operator {}: sequence_length must have shape ({},) (the batch size), got {:?}",
            a.op, g.batch, ins[1].shape
        )));
    }
    let shape = match kind {
        Seq::Last => [&[g.batch][..], &ins[0].shape[2..]].concat(),
        _ => ins[0].shape.clone(),
    };
    Ok(vec![Meta::new(shape, ins[0].dtype)])
}

/// Each batch entry's length: the lengths input, else the sequence length. `SequenceLast`
/// needs 1..=len, `SequenceReverse` 0..=len (stock reads out of bounds otherwise);
/// `SequenceMask` takes any (a length past the end masks nothing).
fn lengths(op: &str, kind: Seq, ins: &[TBlob], g: &Geom, with_lengths: bool) -> Result<Vec<usize>> {
    if !with_lengths {
        if matches!(kind, Seq::Last) && g.len == 0 {
            return Err(Error::mxnet(format!("operator {op}: the sequence axis is empty (no last element)")));
        }
        return Ok(vec![g.len; g.batch]);
    }
    let raw = super::index::read_indices(&ins[1]);
    let lo = if matches!(kind, Seq::Last) { 1 } else { 0 };
    raw.iter()
        .map(|&n| match kind {
            Seq::Mask { .. } => Ok(n.clamp(0, g.len as i64) as usize),
            _ if n < lo || n > g.len as i64 => Err(Error::mxnet(format!(
                "operator {op}: sequence length {n} is outside [{lo}, {}] (the sequence axis)",
                g.len
            ))),
            _ => Ok(n as usize),
        })
        .collect()
}

/// The row of the input that row `r` of the output comes from (None: `SequenceMask`'s value).
fn source(kind: Seq, g: &Geom, lens: &[usize], r: usize) -> Option<usize> {
    match kind {
        Seq::Mask { .. } => {
            let (t, b) = g.of_row(r);
            (t < lens[b]).then_some(r)
        }
        Seq::Last => Some(g.at(lens[r] - 1, r)),
        Seq::Reverse => {
            let (t, b) = g.of_row(r);
            Some(if t < lens[b] { g.at(lens[b] - 1 - t, b) } else { r })
        }
    }
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (kind, with_lengths, _) = args(a);
    let g = Geom::of(a.op, a, &ins[0].shape)?;
    let lens = lengths(a.op, kind, ins, &g, with_lengths)?;
    let row = g.row;
    if outs[0].size() == 0 {
        return Ok(());
    }
    let out = &mut outs[0];
    match kind {
        Seq::Mask { value } => dispatch_all!(out.dtype, T => {
            let (x, v) = (ins[0].as_slice::<T>(), T::from_f64(value));
            par_for_mut(out.as_mut::<T>(), row, Cost(0.25 * row as f64), T::DTYPE, |rows, o| {
                for (r, o) in rows.zip(o.chunks_mut(row)) {
                    match source(kind, &g, &lens, r) {
                        Some(s) => o.copy_from_slice(&x[s * row..(s + 1) * row]),
                        None => o.fill(v),
                    }
                }
            });
        }),
        _ => by_size!(out.dtype, E => {
            let x = elems::<E>(&ins[0]);
            par_for_mut(elems_mut::<E>(out), row, Cost(0.25 * row as f64), ins[0].dtype, |rows, o| {
                for (r, o) in rows.zip(o.chunks_mut(row)) {
                    let s = source(kind, &g, &lens, r).expect("every row has a source");
                    o.copy_from_slice(&x[s * row..(s + 1) * row]);
                }
            });
        }),
    }
    Ok(())
}

/// Backward: inputs (output gradient, data[, lengths]); the data's gradient is the output
/// gradient routed back along [`source`] (0 where the output was `SequenceMask`'s value, or
/// for rows `SequenceLast` did not pick); the lengths get zeros.
fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (kind, with_lengths, _) = args(a);
    let g = Geom::of(a.op, a, &ins[1].shape)?;
    let lens = lengths(a.op, kind, &ins[1..], &g, with_lengths)?;
    for (o, r) in outs.iter_mut().zip(cx.req).skip(1) {
        if *r != Req::Null {
            fill(o, 0.0);
        }
    }
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let row = g.row;
    let dx = &mut outs[0];
    fill(dx, 0.0);
    if dx.size() == 0 {
        return Ok(());
    }
    dispatch_float!(dx.dtype, a.op, T => {
        let (gs, d) = (ins[0].as_slice::<T>(), dx.as_mut::<T>());
        match kind {
            // Each output row has its own source row: scatter them.
            Seq::Last => {
                for (r, gr) in gs.chunks(row).enumerate() {
                    let s = source(kind, &g, &lens, r).expect("a picked row");
                    d[s * row..(s + 1) * row].copy_from_slice(gr);
                }
            }
            // A permutation (its own inverse) or a mask: gather by row.
            _ => par_for_mut(d, row, Cost(0.25 * row as f64), T::DTYPE, |rows, o| {
                for (r, o) in rows.zip(o.chunks_mut(row)) {
                    if let Some(s) = source(kind, &g, &lens, r) {
                        o.copy_from_slice(&gs[s * row..(s + 1) * row]);
                    }
                }
            }),
        }
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    type Def =
        (&'static str, &'static [&'static str], &'static str, &'static [crate::op::param::ParamSpec], &'static str);
    let table: &[Def] = &[
        (
            "SequenceMask",
            &["_npx_sequence_mask"],
            "_backward_SequenceMask",
            MASK_PARAMS,
            "Sets all elements outside the sequence to a constant value.",
        ),
        ("SequenceLast", &[], "_backward_SequenceLast", LAST_PARAMS, "Takes the last element of a sequence."),
        (
            "SequenceReverse",
            &[],
            "_backward_SequenceReverse",
            REVERSE_PARAMS,
            "Reverses the elements of each sequence.",
        ),
    ];
    for &(name, aliases, back, params, doc) in table {
        ops.push(
            OpDef::new(name, Inputs::Leading(&["data", "sequence_length"], inputs), Box::new(infer), Box::new(forward))
                .alias(aliases)
                .params(params)
                .grad(Grad::Backward { op: back, inputs: true, outputs: false })
                .doc(doc),
        );
        ops.push(OpDef::backward(back, params, Box::new(backward)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_route_as_stock_routes_them() {
        // [len 4, batch 2], axis 0: row = t * 2 + b.
        let g = Geom { len: 4, batch: 2, row: 3, axis: 0 };
        let lens = [2, 4];
        let mask: Vec<_> = (0..8).map(|r| source(Seq::Mask { value: 0.0 }, &g, &lens, r)).collect();
        assert_eq!(mask, [Some(0), Some(1), Some(2), Some(3), None, Some(5), None, Some(7)]);
        // Reverse: batch 0 reverses its first 2 steps and keeps the rest; batch 1 all 4.
        let rev: Vec<_> = (0..8).map(|r| source(Seq::Reverse, &g, &lens, r).unwrap()).collect();
        assert_eq!(rev, [2, 7, 0, 5, 4, 3, 6, 1]);
        // Last: batch entry b reads step len[b] - 1.
        assert_eq!((0..2).map(|b| source(Seq::Last, &g, &lens, b).unwrap()).collect::<Vec<_>>(), [2, 7]);
        // axis 1: [batch 2, len 4], row = b * 4 + t.
        let g1 = Geom { axis: 1, ..g };
        assert_eq!(g1.of_row(5), (1, 1));
        assert_eq!(source(Seq::Last, &g1, &lens, 1), Some(7));
    }
}
