//! The interleaved multi-head attention products of GluonNLP's Transformer and BERT:
//! `_contrib_interleaved_matmul_selfatt_qk`, `_selfatt_valatt`, `_encdec_qk`, `_encdec_valatt`
//! and their backward operators.
//!
//! Projections arrive interleaved per head: self-attention's `[T, B, H·3·D]` holds, for each
//! time, batch entry and head, that head's query, key and value (D each); encoder-decoder
//! attention's keys and values are `[T, B, H·2·D]`. An attention batch is one (batch entry,
//! head) pair, `b·H + h`, which is also the first axis of the `[B·H, Tq, Tk]` attention maps.
//! Each product is one strided GEMM per attention batch on the kernel pool: the heads are read
//! where they lie, never copied out first; the query-key products are scaled by 1/√D (in
//! float32, as stock computes it).

use super::linalg::GemmElem;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::par_tasks_mut;
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};

op_params! {
    pub(super) struct HeadsParams<'a> => HEADS_PARAMS {
        heads: i64 = required, "Set number of heads";
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    SelfQk,
    SelfValAtt,
    EncDecQk,
    EncDecValAtt,
}

fn kind(op: &str) -> Kind {
    let name = op.trim_start_matches("_backward_").trim_start_matches("_contrib_");
    match name {
        "interleaved_matmul_selfatt_qk" => Kind::SelfQk,
        "interleaved_matmul_selfatt_valatt" => Kind::SelfValAtt,
        "interleaved_matmul_encdec_qk" => Kind::EncDecQk,
        _ => Kind::EncDecValAtt,
    }
}

/// A strided matrix view: element (i, j) at `data[off + i·rs + j·cs]`.
#[derive(Clone, Copy)]
struct View<'a, T> {
    data: &'a [T],
    off: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T> View<'a, T> {
    fn new(data: &'a [T], off: usize, rs: usize, cs: usize) -> Self {
        View { data, off, rs, cs }
    }
    fn t(self) -> Self {
        View { rs: self.cs, cs: self.rs, ..self }
    }
}

/// `c (m×n, contiguous) = scale · a·b`.
fn mm<T: GemmElem>(m: usize, n: usize, k: usize, a: View<T>, b: View<T>, scale: f32, c: &mut [T]) {
    if k == 0 {
        c.fill(T::zero());
        return;
    }
    T::mm(
        m,
        n,
        k,
        (&a.data[a.off..], a.rs as isize, a.cs as isize),
        (&b.data[b.off..], b.rs as isize, b.cs as isize),
        c,
        false,
    );
    if scale != 1.0 {
        for v in c.iter_mut() {
            *v = T::from_f64(v.to_f64() * scale as f64);
        }
    }
}

/// The sizes of a call: sequence lengths (queries, keys), batch, heads, head size.
#[derive(Clone, Copy)]
struct Dims {
    tq: usize,
    tk: usize,
    b: usize,
    h: usize,
    d: usize,
}

impl Dims {
    fn bh(&self) -> usize {
        self.b * self.h
    }
    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }
}

fn three_d<'s>(op: &str, what: &str, s: &'s [usize]) -> Result<&'s [usize]> {
    if s.len() != 3 {
        return Err(Error::value(format!("operator {op}: {what} must be 3-D (sequence, batch, features), got {s:?}")));
    }
    Ok(s)
}

/// Checks the inputs' shapes and returns the sizes.
fn dims(a: &Attrs, shapes: &[&[usize]]) -> Result<Dims> {
    let op = a.op;
    let heads = HeadsParams::of(a).heads;
    if heads < 1 {
        return Err(Error::value(format!("operator {op}: heads must be positive, got {heads}")));
    }
    let h = heads as usize;
    let bad = |why: String| Error::value(format!("operator {op}: {why}"));
    let split = |features: usize, parts: usize, what: &str| -> Result<usize> {
        if features % (parts * h) != 0 {
            return Err(bad(format!("the {what} size {features} is not a multiple of {parts} x heads ({h})")));
        }
        Ok(features / (parts * h))
    };
    let att_check = |att: &[usize], b: usize, tq: usize, tk: usize| -> Result<()> {
        if att != [b * h, tq, tk] {
            return Err(bad(format!("attention has shape {att:?}, expected {:?}", [b * h, tq, tk])));
        }
        Ok(())
    };
    match kind(op) {
        Kind::SelfQk => {
            let s = three_d(op, "queries_keys_values", shapes[0])?;
            Ok(Dims { tq: s[0], tk: s[0], b: s[1], h, d: split(s[2], 3, "queries_keys_values")? })
        }
        Kind::SelfValAtt => {
            let s = three_d(op, "queries_keys_values", shapes[0])?;
            let att = three_d(op, "attention", shapes[1])?;
            att_check(att, s[1], s[0], s[0])?;
            Ok(Dims { tq: s[0], tk: s[0], b: s[1], h, d: split(s[2], 3, "queries_keys_values")? })
        }
        Kind::EncDecQk => {
            let q = three_d(op, "queries", shapes[0])?;
            let kv = three_d(op, "keys_values", shapes[1])?;
            if kv[2] != 2 * q[2] || kv[1] != q[1] {
                return Err(bad(format!(
                    "keys_values {kv:?} must have the queries' batch and twice their features ({q:?})"
                )));
            }
            Ok(Dims { tq: q[0], tk: kv[0], b: q[1], h, d: split(q[2], 1, "queries")? })
        }
        Kind::EncDecValAtt => {
            let kv = three_d(op, "keys_values", shapes[0])?;
            let att = three_d(op, "attention", shapes[1])?;
            if att.len() == 3 && att[0] != kv[1] * h {
                return Err(bad(format!(
                    "attention.shape[0] {} must be the batch times heads ({})",
                    att[0],
                    kv[1] * h
                )));
            }
            att_check(att, kv[1], att[1], kv[0])?;
            Ok(Dims { tq: att[1], tk: kv[0], b: kv[1], h, d: split(kv[2], 2, "keys_values")? })
        }
    }
}

fn infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = ins[0].dtype;
    if !matches!(dt, DType::F32 | DType::F64) || ins.iter().any(|m| m.dtype != dt) {
        return Err(Error::type_error(format!("operator {}: the inputs must all be float32 (or float64)", a.op)));
    }
    let shapes: Vec<&[usize]> = ins.iter().map(|m| &m.shape[..]).collect();
    let d = dims(a, &shapes)?;
    let shape = match kind(a.op) {
        Kind::SelfQk | Kind::EncDecQk => vec![d.bh(), d.tq, d.tk],
        Kind::SelfValAtt | Kind::EncDecValAtt => vec![d.tq, d.b, d.h * d.d],
    };
    Ok(vec![Meta::new(shape, dt)])
}

/// The query, key and value of attention batch `bh` in their inputs: (input, view) per role.
struct Heads {
    /// Row stride of the interleaved input and where query/key/value start in a row.
    q: (usize, usize, usize),
    k: (usize, usize, usize),
    v: (usize, usize, usize),
}

fn heads(k: Kind, d: &Dims) -> Heads {
    let (bh, dd) = (d.bh(), d.d);
    // (input index, row stride, offset of head 0)
    match k {
        Kind::SelfQk | Kind::SelfValAtt => {
            Heads { q: (0, bh * 3 * dd, 0), k: (0, bh * 3 * dd, dd), v: (0, bh * 3 * dd, 2 * dd) }
        }
        Kind::EncDecQk => Heads { q: (0, bh * dd, 0), k: (1, bh * 2 * dd, 0), v: (1, bh * 2 * dd, dd) },
        Kind::EncDecValAtt => Heads { q: (0, 0, 0), k: (0, bh * 2 * dd, 0), v: (0, bh * 2 * dd, dd) },
    }
}

/// Per-head block stride: how far apart two heads' slices of one row are.
fn head_stride(k: Kind, role: char, d: &Dims) -> usize {
    match (k, role) {
        (Kind::SelfQk | Kind::SelfValAtt, _) => 3 * d.d,
        (Kind::EncDecQk, 'q') => d.d,
        _ => 2 * d.d,
    }
}

fn view<'a, T>(ins: &[&'a [T]], k: Kind, role: char, d: &Dims, bh: usize) -> View<'a, T> {
    let hs = heads(k, d);
    let (input, rs, off) = match role {
        'q' => hs.q,
        'k' => hs.k,
        _ => hs.v,
    };
    View::new(ins[input], off + bh * head_stride(k, role, d), rs, 1)
}

fn forward_typed<T: GemmElem>(a: &Attrs, d: &Dims, ins: &[&[T]], out: &mut [T]) {
    let k = kind(a.op);
    let (tq, tk, dd, bh) = (d.tq, d.tk, d.d, d.bh());
    match k {
        Kind::SelfQk | Kind::EncDecQk => {
            // out[bh] (tq × tk) = scale · q_bh · k_bhᵀ
            par_tasks_mut(out, tq * tk, 2.0 * (bh * tq * tk * dd) as f64, T::DTYPE, |i, o| {
                mm(tq, tk, dd, view(ins, k, 'q', d, i), view(ins, k, 'k', d, i).t(), d.scale(), o);
            });
        }
        Kind::SelfValAtt | Kind::EncDecValAtt => {
            // out[:, bh] (tq × D) = att_bh · v_bh, computed per head, then placed.
            let att = ins[ins.len() - 1];
            let mut tmp = vec![T::zero(); bh * tq * dd];
            par_tasks_mut(&mut tmp, tq * dd, 2.0 * (bh * tq * tk * dd) as f64, T::DTYPE, |i, o| {
                mm(tq, dd, tk, View::new(att, i * tq * tk, tk, 1), view(ins, k, 'v', d, i), 1.0, o);
            });
            for i in 0..bh {
                for t in 0..tq {
                    out[(t * bh + i) * dd..][..dd].copy_from_slice(&tmp[(i * tq + t) * dd..][..dd]);
                }
            }
        }
    }
}

fn forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let shapes: Vec<&[usize]> = ins.iter().map(|t| &t.shape[..]).collect();
    let d = dims(a, &shapes)?;
    match ins[0].dtype {
        DType::F32 => {
            let xs: Vec<&[f32]> = ins.iter().map(|t| t.as_slice::<f32>()).collect();
            forward_typed(a, &d, &xs, outs[0].as_mut::<f32>());
        }
        DType::F64 => {
            let xs: Vec<&[f64]> = ins.iter().map(|t| t.as_slice::<f64>()).collect();
            forward_typed(a, &d, &xs, outs[0].as_mut::<f64>());
        }
        other => return Err(Error::type_error(format!("operator {} does not support {}", a.op, other.name()))),
    }
    Ok(())
}

/// Adds per-head blocks `src` (bh × rows × D, contiguous) into an interleaved gradient at the
/// role's columns.
fn place<T: GemmElem>(k: Kind, role: char, d: &Dims, rows: usize, src: &[T], grads: &mut [Vec<T>]) {
    let hs = heads(k, d);
    let (input, rs, off) = match role {
        'q' => hs.q,
        'k' => hs.k,
        _ => hs.v,
    };
    let (dd, bh) = (d.d, d.bh());
    let g = &mut grads[input];
    for i in 0..bh {
        let col = off + i * head_stride(k, role, d);
        for t in 0..rows {
            g[t * rs + col..][..dd].copy_from_slice(&src[(i * rows + t) * dd..][..dd]);
        }
    }
}

/// `(dOut, inputs...) -> (dInput per input)`.
fn backward_typed<T: GemmElem>(a: &Attrs, d: &Dims, g: &[T], ins: &[&[T]], grads: &mut [Vec<T>]) {
    let k = kind(a.op);
    let (tq, tk, dd, bh) = (d.tq, d.tk, d.d, d.bh());
    let flops = 2.0 * (bh * tq * tk * dd) as f64;
    match k {
        Kind::SelfQk | Kind::EncDecQk => {
            // dq_bh = scale · dOut_bh · k_bh;  dk_bh = scale · dOut_bhᵀ · q_bh
            let mut dq = vec![T::zero(); bh * tq * dd];
            par_tasks_mut(&mut dq, tq * dd, flops, T::DTYPE, |i, o| {
                mm(tq, dd, tk, View::new(g, i * tq * tk, tk, 1), view(ins, k, 'k', d, i), d.scale(), o);
            });
            let mut dk = vec![T::zero(); bh * tk * dd];
            par_tasks_mut(&mut dk, tk * dd, flops, T::DTYPE, |i, o| {
                mm(tk, dd, tq, View::new(g, i * tq * tk, tk, 1).t(), view(ins, k, 'q', d, i), d.scale(), o);
            });
            place(k, 'q', d, tq, &dq, grads);
            place(k, 'k', d, tk, &dk, grads);
        }
        Kind::SelfValAtt | Kind::EncDecValAtt => {
            let att = ins[ins.len() - 1];
            // The output gradient of head bh: rows t at (t·bh + i)·D.
            let gv = |i: usize| View::new(g, i * dd, bh * dd, 1);
            // datt_bh = dOut_bh · v_bhᵀ;  dv_bh = att_bhᵀ · dOut_bh
            let datt = &mut grads[grads.len() - 1];
            par_tasks_mut(datt, tq * tk, flops, T::DTYPE, |i, o| {
                mm(tq, tk, dd, gv(i), view(ins, k, 'v', d, i).t(), 1.0, o);
            });
            let mut dv = vec![T::zero(); bh * tk * dd];
            par_tasks_mut(&mut dv, tk * dd, flops, T::DTYPE, |i, o| {
                mm(tk, dd, tq, View::new(att, i * tq * tk, tk, 1).t(), gv(i), 1.0, o);
            });
            place(k, 'v', d, tk, &dv, grads);
        }
    }
}

fn backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let fwd = &ins[1..];
    let shapes: Vec<&[usize]> = fwd.iter().map(|t| &t.shape[..]).collect();
    let d = dims(a, &shapes)?;
    macro_rules! go {
        ($T:ty) => {{
            let xs: Vec<&[$T]> = fwd.iter().map(|t| t.as_slice::<$T>()).collect();
            let mut grads: Vec<Vec<$T>> = fwd.iter().map(|t| vec![0.0; t.size()]).collect();
            backward_typed(a, &d, ins[0].as_slice::<$T>(), &xs, &mut grads);
            for ((o, r), g) in outs.iter_mut().zip(cx.req).zip(grads) {
                if *r != Req::Null {
                    o.as_mut::<$T>().copy_from_slice(&g);
                }
            }
        }};
    }
    match ins[0].dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        other => return Err(Error::type_error(format!("operator {} does not support {}", a.op, other.name()))),
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let table: [(&'static str, &'static [&'static str], &'static str, &'static str); 4] = [
        (
            "_contrib_interleaved_matmul_selfatt_qk",
            &["queries_keys_values"],
            "_backward_interleaved_matmul_selfatt_qk",
            "Compute the matrix multiplication between the projections of queries and keys in multihead attention use as self attention.",
        ),
        (
            "_contrib_interleaved_matmul_selfatt_valatt",
            &["queries_keys_values", "attention"],
            "_backward_interleaved_matmul_selfatt_valatt",
            "Compute the matrix multiplication between the projections of values and the attention weights in multihead attention use as self attention.",
        ),
        (
            "_contrib_interleaved_matmul_encdec_qk",
            &["queries", "keys_values"],
            "_backward_interleaved_matmul_encdec_qk",
            "Compute the matrix multiplication between the projections of queries and keys in multihead attention use as encoder-decoder.",
        ),
        (
            "_contrib_interleaved_matmul_encdec_valatt",
            &["keys_values", "attention"],
            "_backward_interleaved_matmul_encdec_valatt",
            "Compute the matrix multiplication between the projections of values and the attention weights in multihead attention use as encoder-decoder.",
        ),
    ];
    for (name, inputs, back, doc) in table {
        ops.push(
            OpDef::new(name, Inputs::Fixed(inputs), Box::new(infer), Box::new(forward))
                .params(HEADS_PARAMS)
                .grad(Grad::Backward { op: back, inputs: true, outputs: false })
                .doc(doc),
        );
        ops.push(OpDef::backward(back, HEADS_PARAMS, Box::new(backward)));
    }
}
