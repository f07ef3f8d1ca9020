//! Backward operators of the indexing family (see `op::grad` for the convention):
//! `_backward_slice`, `_backward_slice_axis`, `_backward_slice_like`, `_backward_take`,
//! `_backward_Embedding`,
//! `_backward_pick`, `_backward_gather_nd`, `_backward_scatter_nd`, `_backward_where`, `_backward_topk` and
//! `_backward_sort`.
//!
//! Slices write the output gradient into the selected view of a zeroed input gradient (all
//! dtypes, through the copy engine); gathers scatter it back, adding where indices repeat
//! (`take`, `gather_nd`); index inputs and `where`'s condition get zero gradients.

use super::common::params_of;
use super::elemwise::{Arith, Calc};
use super::index::{
    attr_slice, nd_geometry, nd_offsets, pick_axis, read_indices, resolve, slice_axis_ranges, slice_view, sort_geom,
    sort_order, SortArgs,
};
use super::init::fill;
use super::strided::{by_size, copy, elems, elems_mut, View};
use crate::error::Result;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::ops::index::PickParams;
use crate::op::ops::index::TakeParams;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{OpCtx, OpDef, Req};
use crate::{dispatch_all, dispatch_float, dispatch_num};

type Compute = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;

/// Zeros into every requested gradient from output `from` on (index inputs).
fn zero_from(cx: &OpCtx, outs: &mut [OutBlob], from: usize) {
    for (o, r) in outs.iter_mut().zip(cx.req).skip(from) {
        if *r != Req::Null {
            fill(o, 0.0);
        }
    }
}

/// Zero `dx`, then copy the output gradient `g` (of `shape`) into view `v` of it.
fn scatter_view(g: &TBlob, dx: &mut OutBlob, v: &View, shape: &[usize]) {
    fill(dx, 0.0);
    copy(g, &View::contiguous(shape), dx, v, shape);
}

fn slice_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let (v, shape) = attr_slice("slice", cx.attrs, &outs[0].shape)?;
        scatter_view(&ins[0], &mut outs[0], &v, &shape);
    }
    Ok(())
}

fn slice_axis_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let (v, shape) = slice_view(&slice_axis_ranges(cx.attrs, &outs[0].shape)?, &outs[0].shape);
        scatter_view(&ins[0], &mut outs[0], &v, &shape);
    }
    Ok(())
}

fn slice_like_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let shape = ins[0].shape.clone();
        let full = View::contiguous(&outs[0].shape);
        scatter_view(&ins[0], &mut outs[0], &full, &shape);
    }
    zero_from(cx, outs, 1);
    Ok(())
}

/// `dst[..] += src[..]` (same length).
#[inline(always)]
fn add_into<T: Arith>(dst: &mut [T], src: &[T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::store(d.load().add(s.load()));
    }
}

/// `d[dest, :] += g[src, :]` for every `(dest, src)` pair of blocks of `inner` elements, in
/// the pairs' order (the serial order, so sums round as a serial loop's would); `d` is split
/// into its blocks, which are summed in parallel (each block owned by one task).
fn add_blocks<T: Arith>(d: &mut [T], g: &[T], inner: usize, pairs: impl Iterator<Item = (usize, usize)>) {
    if inner == 0 {
        return;
    }
    let blocks = d.len() / inner;
    let pairs: Vec<(usize, usize)> = pairs.collect();
    // Per destination block, its pairs as a list threaded through `next` (in pair order).
    let (mut first, mut next) = (vec![usize::MAX; blocks], vec![usize::MAX; pairs.len()]);
    for (k, &(dest, _)) in pairs.iter().enumerate().rev() {
        next[k] = first[dest];
        first[dest] = k;
    }
    let per_block = pairs.len() as f64 / blocks.max(1) as f64;
    par_for_mut(d, inner, Cost(per_block * inner as f64 * 0.5 + 1.0), T::DTYPE, |r, part| {
        for (b, block) in r.zip(part.chunks_mut(inner)) {
            let mut k = first[b];
            while k != usize::MAX {
                let src = pairs[k].1;
                add_into(block, &g[src * inner..(src + 1) * inner]);
                k = next[k];
            }
        }
    });
}

/// `dx[o, idx[j], :] += g[o, j, :]` over blocks of `inner` elements (`dx` zeroed first).
fn scatter_add<T: Arith>(g: &[T], dx: &mut [T], outer: usize, n: usize, idx: &[usize], inner: usize) {
    let m = idx.len();
    add_blocks(
        dx,
        g,
        inner,
        (0..outer).flat_map(|o| idx.iter().enumerate().map(move |(j, &i)| (o * n + i, o * m + j))),
    );
}

/// take: inputs (ograd, a, indices).
fn take_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = TakeParams::of(cx.attrs);
    zero_from(cx, outs, 1);
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (g, dx) = (&ins[0], &mut outs[0]);
    let s = &dx.shape.clone();
    let ax = super::common::norm_axis("take", params.axis, s.len())?;
    let mode = params.mode.as_bytes()[0];
    fill(dx, 0.0);
    let idx = read_indices(&ins[2]);
    if idx.is_empty() || dx.size() == 0 {
        return Ok(());
    }
    let idx: Vec<usize> = idx.iter().map(|&i| resolve("take", i, s[ax], mode)).collect::<Result<_>>()?;
    let (outer, inner) = (s[..ax].iter().product(), s[ax + 1..].iter().product());
    dispatch_float!(dx.dtype, "_backward_take", T => scatter_add::<T>(g.as_slice::<T>(), dx.as_mut::<T>(), outer, s[ax], &idx, inner));
    Ok(())
}

/// Embedding: inputs (ograd, data, weight); outputs (data's gradient: zero, weight's: the
/// output gradient's rows added at their clipped indices).
fn embedding_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    zero_from(cx, outs, 0);
    if cx.req.get(1).is_none_or(|r| *r == Req::Null) {
        return Ok(());
    }
    let (vocab, dim) = (outs[1].shape[0], outs[1].shape[1]);
    let idx = read_indices(&ins[1]);
    if idx.is_empty() || dim == 0 {
        return Ok(());
    }
    let idx: Vec<usize> = idx.iter().map(|&i| resolve("Embedding", i, vocab, b'c')).collect::<Result<_>>()?;
    let dw = &mut outs[1];
    dispatch_float!(dw.dtype, "_backward_Embedding", T => scatter_add::<T>(ins[0].as_slice::<T>(), dw.as_mut::<T>(), 1, vocab, &idx, dim));
    Ok(())
}

/// pick: inputs (ograd, data, index); each output position picks one distinct element.
fn pick_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = PickParams::of(cx.attrs);
    zero_from(cx, outs, 1);
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (g, dx) = (&ins[0], &mut outs[0]);
    let s = &dx.shape.clone();
    let ax = pick_axis(cx.attrs, s)?;
    let mode = params.mode.as_bytes()[0];
    let (n, inner) = (s[ax], s[ax + 1..].iter().product::<usize>());
    fill(dx, 0.0);
    let idx = read_indices(&ins[2]);
    if idx.is_empty() {
        return Ok(());
    }
    let idx: Vec<usize> = idx.iter().map(|&i| resolve("pick", i, n, mode)).collect::<Result<_>>()?;
    let dtype = dx.dtype;
    by_size!(dtype, E => {
        let src = elems::<E>(g);
        // One block of n * inner elements per outer position o.
        par_for_mut(elems_mut::<E>(dx), n * inner, Cost(inner as f64), dtype, |r, blocks| {
            for (o, block) in r.zip(blocks.chunks_mut((n * inner).max(1))) {
                for i in 0..inner {
                    let t = o * inner + i;
                    block[idx[t] * inner + i] = src[t];
                }
            }
        });
    });
    Ok(())
}

/// gather_nd: inputs (ograd, data, indices); blocks scattered back with addition.
fn gather_nd_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    zero_from(cx, outs, 1);
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (g, dx) = (&ins[0], &mut outs[0]);
    let offs = nd_offsets("gather_nd", &dx.shape, &ins[2])?;
    let inner = nd_geometry("gather_nd", &dx.shape, &ins[2].shape)?.2;
    fill(dx, 0.0);
    dispatch_num!(dx.dtype, "_backward_gather_nd", T => {
        let (gs, d) = (g.as_slice::<T>(), dx.as_mut::<T>());
        add_blocks(d, gs, inner, offs.iter().enumerate().map(|(j, &o)| (o / inner.max(1), j)));
    });
    Ok(())
}

/// scatter_nd: inputs (ograd, data, indices); data's gradient is the output gradient's
/// blocks gathered back from where they were scattered.
fn scatter_nd_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    zero_from(cx, outs, 1);
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let g = &ins[0];
    let offs = nd_offsets("scatter_nd", &g.shape, &ins[2])?;
    let inner = nd_geometry("scatter_nd", &g.shape, &ins[2].shape)?.2;
    by_size!(g.dtype, E => {
        let (src, dst) = (elems::<E>(g), elems_mut::<E>(&mut outs[0]));
        for (j, &o) in offs.iter().enumerate() {
            dst[j * inner..(j + 1) * inner].copy_from_slice(&src[o..o + inner]);
        }
    });
    Ok(())
}

/// where: inputs (ograd, condition, x, y); x gets the gradient where the condition holds, y
/// elsewhere, the condition zeros.
fn where_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        fill(&mut outs[0], 0.0);
    }
    let (g, c) = (&ins[0], &ins[1]);
    let n = g.size();
    if n == 0 {
        return Ok(());
    }
    let per = if c.size() == n { 1 } else { n / c.size().max(1) };
    for (side, out) in [(true, 1), (false, 2)] {
        if cx.req[out] == Req::Null {
            continue;
        }
        let d = &mut outs[out];
        dispatch_float!(d.dtype, "_backward_where", T => dispatch_all!(c.dtype, C => {
            let (gs, cs) = (g.as_slice::<T>(), c.as_slice::<C>());
            par_for_mut(d.as_mut::<T>(), 1, Cost(0.5), T::DTYPE, |r, d| {
                for (k, (d, &gv)) in d.iter_mut().zip(&gs[r.clone()]).enumerate() {
                    let hold = cs[(r.start + k) / per] != C::zero();
                    *d = if hold == side { gv } else { T::zero() };
                }
            });
        }));
    }
    Ok(())
}

/// topk (ret_typ value or both) and sort: inputs (ograds of the visible outputs, data). The
/// forward order is recomputed (the sort is stable, so it is the same) and the value
/// gradients are written back to the positions they came from; index outputs carry none.
fn topk_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (x, dx) = (&ins[ins.len() - 1], &mut outs[0]);
    fill(dx, 0.0);
    let args = SortArgs::of(a);
    if args.topk.is_some_and(|(_, ret)| !matches!(ret, "value" | "both")) {
        return Ok(());
    }
    let geom = sort_geom(a.op, args.axis, &x.shape, args.topk.map(|(k, _)| k))?;
    let g = &ins[0];
    dispatch_num!(dx.dtype, "_backward_topk", T => {
        let order = sort_order::<T>(x, &geom, args.is_ascend);
        let (n, inner, k) = (geom.n, geom.inner, geom.k);
        let (gs, d) = (g.as_slice::<T>(), dx.as_mut::<T>());
        for (t, &gv) in gs.iter().enumerate() {
            // ograd index t = (o*k + r)*inner + i
            let (o, rest) = (t / (k * inner), t % (k * inner));
            let (r, i) = (rest / inner, rest % inner);
            let j = order[(o * inner + i) * k + r] as usize;
            d[(o * n + j) * inner + i] = gv;
        }
    });
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let table: &[(&'static str, &'static str, Compute)] = &[
        ("_backward_slice", "slice", slice_back),
        ("_backward_slice_axis", "slice_axis", slice_axis_back),
        ("_backward_slice_like", "slice_like", slice_like_back),
        ("_backward_take", "take", take_back),
        ("_backward_Embedding", "Embedding", embedding_back),
        ("_backward_pick", "pick", pick_back),
        ("_backward_gather_nd", "gather_nd", gather_nd_back),
        ("_backward_scatter_nd", "scatter_nd", scatter_nd_back),
        ("_backward_where", "where", where_back),
        ("_backward_topk", "topk", topk_back),
        ("_backward_sort", "sort", topk_back),
    ];
    for &(name, fwd, f) in table {
        ops.push(OpDef::backward(name, params_of(ops, fwd), Box::new(f)));
    }
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    fn x(shape: &[usize], seed: u64) -> (&[usize], Vec<f64>) {
        (shape, values(shape.iter().product(), -1.0, 1.0, seed))
    }

    #[test]
    fn slices() {
        check("slice", &[("begin", "(1, None)"), ("end", "(3, None)")], &[x(&[4, 5], 1)], &[]);
        check("slice", &[("begin", "(None, 4)"), ("end", "(None, 0)"), ("step", "(2, -2)")], &[x(&[4, 5], 2)], &[]);
        check("slice", &[("begin", "(0, 1, 1)"), ("end", "(2, 3, 4)")], &[x(&[2, 3, 4], 3)], &[]);
        check("slice_axis", &[("axis", "1"), ("begin", "1"), ("end", "-1")], &[x(&[2, 5, 3], 4)], &[]);
        check("slice_axis", &[("axis", "-1"), ("begin", "0"), ("end", "None")], &[x(&[2, 3], 5)], &[]);
        check("slice_like", &[], &[x(&[4, 5], 6), x(&[2, 3], 7)], &[1]);
        check("slice_like", &[("axes", "(1,)")], &[x(&[4, 5], 8), x(&[2, 3], 9)], &[1]);
    }

    #[test]
    fn take() {
        // Repeated, negative and out-of-range indices (clip and wrap).
        let idx = vec![0.0, 2.0, 2.0, -1.0, 7.0, 1.0];
        for mode in ["clip", "wrap"] {
            check("take", &[("mode", mode)], &[x(&[4, 3], 1), (&[2, 3], idx.clone())], &[1]);
            check("take", &[("mode", mode), ("axis", "1")], &[x(&[2, 4, 3], 2), (&[6], idx.clone())], &[1]);
            check("take", &[("mode", mode), ("axis", "-1")], &[x(&[3, 4], 3), (&[3, 2], idx.clone())], &[1]);
        }
        // A wide row (the column-split path).
        check("take", &[], &[x(&[3, 300], 4), (&[4], vec![2.0, 0.0, 2.0, 1.0])], &[1]);
    }

    #[test]
    fn pick() {
        check("pick", &[], &[x(&[3, 4], 1), (&[3], vec![0.0, 3.0, 1.0])], &[1]);
        check(
            "pick",
            &[("axis", "0"), ("keepdims", "True")],
            &[x(&[3, 4], 2), (&[1, 4], vec![0.0, 2.0, 1.0, 2.0])],
            &[1],
        );
        check(
            "pick",
            &[("axis", "1"), ("mode", "wrap")],
            &[x(&[2, 3, 2], 3), (&[2, 2], vec![-1.0, 4.0, 0.0, 2.0])],
            &[1],
        );
    }

    #[test]
    fn gather_nd() {
        // Repeated index tuples accumulate.
        check("gather_nd", &[], &[x(&[3, 4], 1), (&[2, 4], vec![0.0, 2.0, 0.0, -1.0, 1.0, 3.0, 1.0, 0.0])], &[1]);
        check("gather_nd", &[], &[x(&[3, 4, 2], 2), (&[1, 3], vec![2.0, 0.0, 2.0])], &[1]);
    }

    #[test]
    fn where_() {
        let c = vec![1.0, 0.0, 0.0, 2.0, 0.0, 1.0];
        check("where", &[], &[(&[2, 3], c), x(&[2, 3], 1), x(&[2, 3], 2)], &[0]);
        check("where", &[], &[(&[2], vec![0.0, 1.0]), x(&[2, 3], 3), x(&[2, 3], 4)], &[0]);
    }

    #[test]
    fn topk_and_sort() {
        // Distinct values: no ties.
        let v: Vec<f64> = (0..24).map(|i| ((i * 7) % 24) as f64 * 0.1 - 1.0).collect();
        for ret in ["value", "both", "indices"] {
            check("topk", &[("k", "2"), ("ret_typ", ret), ("dtype", "float64")], &[(&[2, 3, 4], v.clone())], &[]);
            check(
                "topk",
                &[("k", "2"), ("ret_typ", ret), ("dtype", "float64"), ("axis", "1"), ("is_ascend", "True")],
                &[(&[2, 3, 4], v.clone())],
                &[],
            );
            check(
                "topk",
                &[("k", "5"), ("ret_typ", ret), ("dtype", "float64"), ("axis", "None")],
                &[(&[2, 3, 4], v.clone())],
                &[],
            );
        }
        check("sort", &[], &[(&[2, 3, 4], v.clone())], &[]);
        check("sort", &[("axis", "0"), ("is_ascend", "False")], &[(&[2, 3, 4], v.clone())], &[]);
        check("sort", &[("axis", "None")], &[(&[2, 3, 4], v)], &[]);
    }
}
