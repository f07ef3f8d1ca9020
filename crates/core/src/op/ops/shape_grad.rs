//! Backward operators of the shape family (see `op::grad` for the convention):
//! `_backward_reshape` (Reshape, Flatten, expand_dims), `_backward_squeeze`,
//! `_backward_reshape_like`, `_backward_transpose`, `_backward_SwapAxis`, `_backward_cast`
//! (Cast, _copyto), `_backward_amp_cast`, `_backward_Concat`, `_backward_stack`,
//! `_backward_SliceChannel`, `_split_v2_backward`, `_broadcast_backward` (broadcast_to,
//! broadcast_axis, broadcast_like), `_backward_tile`, `_backward_repeat`,
//! `_backward_reverse`, `_backward_Pad`, `_backward_depth_to_space`,
//! `_backward_space_to_depth` and `_backward_diag`.
//!
//! Data movement is the inverse view copy of the forward operator through the strided copy
//! engine (all dtypes); operators that replicate elements (broadcasts, tile, repeat, edge
//! and reflect padding) sum the output gradient back.

use super::common::{norm_axis, params_of};
use super::elemwise::{Arith, Calc};
use super::init::fill;
use super::reduce::sum_into;
use super::shape::{
    cast_into, channel_bounds, diag_plan, pad_src, pad_widths, permuted_copy, repeat_view, reverse_view, run_block,
    split_v2_bounds, swap_perm, tile_dims, transpose_perm, DiagPlan,
};
use super::strided::{contiguous_strides, copy, copy_to, unravel, View};
use crate::error::Result;
use crate::op::kernel::par_tasks_mut;
use crate::op::ops::shape::ConcatParams;
use crate::op::ops::shape::PadParams;
use crate::op::ops::shape::StackParams;
use crate::op::ops::shape::TransposeParams;
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{OpCtx, OpDef, Req};

type Compute = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;

/// Zeros into the gradients of inputs past the first (shape-only inputs such as `rhs`).
fn zero_rest(cx: &OpCtx, outs: &mut [OutBlob]) {
    for (o, r) in outs.iter_mut().zip(cx.req).skip(1) {
        if *r != Req::Null {
            fill(o, 0.0);
        }
    }
}

/// Reshapes: the gradient is the output gradient's elements under the input's shape.
fn reshape_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        outs[0].copy_from(&ins[0]);
    }
    zero_rest(cx, outs);
    Ok(())
}

/// Casts: the output gradient converted to the input's dtype.
fn cast_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        cast_into(&ins[0], &mut outs[0]);
    }
    Ok(())
}

fn transpose_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = TransposeParams::of(cx.attrs);
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let perm = transpose_perm("transpose", params.axes, outs[0].ndim())?;
    let mut inv = vec![0; perm.len()];
    for (k, &p) in perm.iter().enumerate() {
        inv[p] = k;
    }
    permuted_copy(&ins[0], &mut outs[0], &inv);
    Ok(())
}

fn swap_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let perm = swap_perm(cx.attrs, outs[0].ndim())?;
        permuted_copy(&ins[0], &mut outs[0], &perm);
    }
    Ok(())
}

/// Each input's gradient is its block of the output gradient along `dim` (Concat).
fn concat_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = ConcatParams::of(cx.attrs);
    let g = &ins[0];
    let dim = norm_axis("Concat", params.dim, g.ndim())?;
    let gs = contiguous_strides(&g.shape);
    let mut at = 0isize;
    for (o, r) in outs.iter_mut().zip(cx.req) {
        if *r != Req::Null {
            let sv = View { off: at * gs[dim], strides: gs.clone() };
            copy_to(g, &sv, o);
        }
        at += o.shape[dim] as isize;
    }
    Ok(())
}

fn stack_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = StackParams::of(cx.attrs);
    let g = &ins[0];
    let ax = norm_axis("stack", params.axis, g.ndim())?;
    let mut gs = contiguous_strides(&g.shape);
    let step = gs.remove(ax);
    for (i, (o, r)) in outs.iter_mut().zip(cx.req).enumerate() {
        if *r != Req::Null {
            copy_to(g, &View { off: i as isize * step, strides: gs.clone() }, o);
        }
    }
    Ok(())
}

/// The input gradient is the output gradients written back to their parts along `axis`.
fn join_parts(ograds: &[TBlob], dx: &mut OutBlob, axis: usize, bounds: &[(usize, usize)]) {
    let s = contiguous_strides(&dx.shape);
    for (g, &(b, e)) in ograds.iter().zip(bounds) {
        let mut part = dx.shape.clone();
        part[axis] = e - b;
        copy(g, &View::contiguous(&part), dx, &View { off: b as isize * s[axis], strides: s.clone() }, &part);
    }
}

fn slice_channel_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let (axis, bounds) = channel_bounds(cx.attrs, &outs[0].shape)?;
        join_parts(ins, &mut outs[0], axis, &bounds);
    }
    Ok(())
}

fn split_v2_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let (axis, bounds) = split_v2_bounds(cx.attrs, &outs[0].shape)?;
        join_parts(ins, &mut outs[0], axis, &bounds);
    }
    Ok(())
}

/// Broadcasts: the output gradient summed over the broadcast axes.
fn broadcast_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let (g, dx) = (&ins[0], &mut outs[0]);
        let flags: Vec<bool> = dx.shape.iter().zip(&g.shape).map(|(a, b)| a != b).collect();
        sum_into(cx.attrs.op, g, &g.shape, &flags, dx)?;
    }
    zero_rest(cx, outs);
    Ok(())
}

fn tile_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (s, r) = tile_dims(cx.attrs, &outs[0].shape)?;
    // The output gradient as (r0, s0, r1, s1, ...), summed over the repetitions.
    let mut shape = Vec::with_capacity(2 * s.len());
    let mut flags = Vec::with_capacity(2 * s.len());
    for k in 0..s.len() {
        shape.extend_from_slice(&[r[k], s[k]]);
        flags.extend_from_slice(&[true, false]);
    }
    sum_into("tile", &ins[0], &shape, &flags, &mut outs[0])
}

fn repeat_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    // The repeat view's shape is the output gradient with a repetition axis after each
    // repeated one; the repetitions are summed.
    let (vs, vst, _) = repeat_view(cx.attrs, &outs[0].shape)?;
    let flags: Vec<bool> = vst.iter().zip(&vs).map(|(&st, &d)| st == 0 && d != 1).collect();
    sum_into("repeat", &ins[0], &vs, &flags, &mut outs[0])
}

fn reverse_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        let v = reverse_view(cx.attrs, &outs[0].shape)?;
        copy_to(&ins[0], &v, &mut outs[0]);
    }
    Ok(())
}

/// Pad: constant padding crops the output gradient; edge and reflect padding add each padded
/// element's gradient to the element it copies. The first two axes are never padded, so each
/// (n, c) plane is one task.
fn pad_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = PadParams::of(cx.attrs);
    let (g, dx) = (&ins[0], &mut outs[0]);
    if cx.req[0] == Req::Null || dx.size() == 0 {
        return Ok(());
    }
    let w = pad_widths(cx.attrs, &dx.shape)?;
    let mode = params.mode.as_bytes()[0];
    if mode == b'c' {
        let gs = contiguous_strides(&g.shape);
        let off = w.iter().zip(&gs).map(|(&(b, _), &s)| b as isize * s).sum();
        copy_to(g, &View { off, strides: gs }, dx);
        return Ok(());
    }
    crate::dispatch_float!(dx.dtype, "_backward_Pad", T => pad_sum::<T>(g, dx, &w, mode));
    Ok(())
}

fn pad_sum<T: Arith>(g: &TBlob, dx: &mut OutBlob, w: &[(usize, usize)], mode: u8) {
    let (gshape, xshape) = (&g.shape, &dx.shape.clone());
    let nd = xshape.len();
    let (gplane, xplane): (usize, usize) = (gshape[2..].iter().product(), xshape[2..].iter().product());
    let cols = gshape[nd - 1];
    let col_src: Vec<usize> = (0..cols)
        .map(|c| pad_src(c, w[nd - 1].0, xshape[nd - 1], mode).expect("edge/reflect padding has a source"))
        .collect();
    let xst = contiguous_strides(&xshape[2..]);
    let row_shape = &gshape[2..nd - 1];
    let rows: usize = row_shape.iter().product();
    let gv = g.as_slice::<T>();
    par_tasks_mut(dx.as_mut::<T>(), xplane, (g.size() as f64) * 1.5, T::DTYPE, |s, d| {
        let gp = &gv[s * gplane..(s + 1) * gplane];
        let mut acc = vec![<T::C as Calc>::ZERO; xplane];
        for row in 0..rows {
            let idx = unravel(row, row_shape);
            let base: usize = idx
                .iter()
                .enumerate()
                .map(|(k, &c)| {
                    pad_src(c, w[k + 2].0, xshape[k + 2], mode).expect("edge/reflect padding has a source")
                        * xst[k] as usize
                })
                .sum();
            for (&src, &v) in col_src.iter().zip(&gp[row * cols..(row + 1) * cols]) {
                acc[base + src] = acc[base + src].add(v.load());
            }
        }
        for (d, a) in d.iter_mut().zip(acc) {
            *d = T::store(a);
        }
    });
}

fn d2s_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        run_block(cx, &ins[..1], outs, false)?;
    }
    Ok(())
}

fn s2d_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        run_block(cx, &ins[..1], outs, true)?;
    }
    Ok(())
}

fn diag_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (g, dx) = (&ins[0], &mut outs[0]);
    match diag_plan(cx.attrs, &dx.shape)? {
        DiagPlan::Build { n, size, off } => {
            copy(g, &View { off, strides: vec![size as isize + 1] }, dx, &View::contiguous(&[n]), &[n]);
        }
        DiagPlan::Extract { view, shape } => {
            fill(dx, 0.0);
            copy(g, &View::contiguous(&shape), dx, &view, &shape);
        }
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let table: &[(&'static str, &'static str, Compute)] = &[
        ("_backward_reshape", "Reshape", reshape_back),
        ("_backward_squeeze", "squeeze", reshape_back),
        ("_backward_reshape_like", "reshape_like", reshape_back),
        ("_backward_identity_with_attr_like_rhs", "_identity_with_attr_like_rhs", reshape_back),
        ("_backward_transpose", "transpose", transpose_back),
        ("_backward_SwapAxis", "SwapAxis", swap_back),
        ("_backward_cast", "Cast", cast_back),
        ("_backward_amp_cast", "amp_cast", cast_back),
        ("_backward_amp_multicast", "amp_multicast", super::shape::run_multicast),
        ("_backward_Concat", "Concat", concat_back),
        ("_backward_stack", "stack", stack_back),
        ("_backward_SliceChannel", "SliceChannel", slice_channel_back),
        ("_split_v2_backward", "_split_v2", split_v2_back),
        ("_broadcast_backward", "", broadcast_back),
        ("_backward_tile", "tile", tile_back),
        ("_backward_repeat", "repeat", repeat_back),
        ("_backward_reverse", "reverse", reverse_back),
        ("_backward_Pad", "Pad", pad_back),
        ("_backward_depth_to_space", "depth_to_space", d2s_back),
        ("_backward_space_to_depth", "space_to_depth", s2d_back),
        ("_backward_diag", "diag", diag_back),
    ];
    // Copies: their GPU form is a (converting) copy of the output gradient.
    const COPIES: &[&str] = &[
        "_backward_reshape",
        "_backward_squeeze",
        "_backward_reshape_like",
        "_backward_identity_with_attr_like_rhs",
        "_backward_cast",
        "_backward_amp_cast",
    ];
    for &(name, fwd, f) in table {
        let mut def = OpDef::backward(name, params_of(ops, fwd), Box::new(f));
        if COPIES.contains(&name) {
            def = def.gpu(crate::op::gpu::GpuKernel::CopyGrad);
        }
        ops.push(def);
    }
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    fn x(shape: &[usize], seed: u64) -> (&[usize], Vec<f64>) {
        (shape, values(shape.iter().product(), -1.0, 1.0, seed))
    }

    #[test]
    fn reshapes() {
        check("Reshape", &[("shape", "(4, -1)")], &[x(&[2, 3, 4], 1)], &[]);
        check("Flatten", &[], &[x(&[2, 3, 4], 2)], &[]);
        check("expand_dims", &[("axis", "-1")], &[x(&[2, 3], 3)], &[]);
        check("squeeze", &[], &[x(&[2, 1, 3, 1], 4)], &[]);
        check("reshape_like", &[], &[x(&[2, 6], 5), x(&[3, 4], 6)], &[1]);
    }

    #[test]
    fn permutations() {
        check("transpose", &[], &[x(&[2, 3, 4], 1)], &[]);
        check("transpose", &[("axes", "(1, 2, 0)")], &[x(&[2, 3, 4], 2)], &[]);
        check("transpose", &[("axes", "(0, 2, 3, 1)")], &[x(&[2, 3, 4, 5], 3)], &[]);
        check("SwapAxis", &[("dim1", "0"), ("dim2", "2")], &[x(&[2, 3, 4], 4)], &[]);
        check("reverse", &[("axis", "(0, 2)")], &[x(&[2, 3, 4], 5)], &[]);
        check("depth_to_space", &[("block_size", "2")], &[x(&[1, 8, 2, 3], 6)], &[]);
        check("space_to_depth", &[("block_size", "2")], &[x(&[2, 2, 4, 6], 7)], &[]);
    }

    #[test]
    fn casts() {
        check("Cast", &[("dtype", "float64")], &[x(&[3, 4], 1)], &[]);
        check("amp_cast", &[("dtype", "float64")], &[x(&[3, 4], 2)], &[]);
        check("_copyto", &[], &[x(&[5], 3)], &[]);
    }

    #[test]
    fn joins_and_splits() {
        check(
            "Concat",
            &[("num_args", "3"), ("dim", "1")],
            &[x(&[2, 3, 2], 1), x(&[2, 1, 2], 2), x(&[2, 4, 2], 3)],
            &[],
        );
        check("Concat", &[("num_args", "2"), ("dim", "-1")], &[x(&[2, 3], 4), x(&[2, 2], 5)], &[]);
        check("stack", &[("num_args", "3"), ("axis", "1")], &[x(&[2, 3], 1), x(&[2, 3], 2), x(&[2, 3], 3)], &[]);
        check("stack", &[("num_args", "2"), ("axis", "-1")], &[x(&[2, 3], 4), x(&[2, 3], 5)], &[]);
        check("SliceChannel", &[("num_outputs", "3"), ("axis", "1")], &[x(&[2, 6, 2], 6)], &[]);
        check("SliceChannel", &[("num_outputs", "3"), ("axis", "0"), ("squeeze_axis", "True")], &[x(&[3, 4], 7)], &[]);
        check("_split_v2", &[("indices", "(0, 1, 4)"), ("axis", "1")], &[x(&[2, 6], 8)], &[]);
        check("_split_v2", &[("indices", "()"), ("sections", "2"), ("axis", "0")], &[x(&[4, 3], 9)], &[]);
    }

    #[test]
    fn broadcasts_tile_repeat() {
        check("broadcast_to", &[("shape", "(3, 4, 5)")], &[x(&[3, 1, 5], 1)], &[]);
        check("broadcast_to", &[("shape", "(2, 3, 4)")], &[x(&[1, 3, 1], 2)], &[]);
        check("broadcast_axis", &[("axis", "(0, 2)"), ("size", "(2, 3)")], &[x(&[1, 4, 1], 3)], &[]);
        check("broadcast_like", &[], &[x(&[1, 4], 4), x(&[3, 4], 5)], &[1]);
        check("broadcast_like", &[("lhs_axes", "(0,)"), ("rhs_axes", "(1,)")], &[x(&[1, 4], 6), x(&[2, 3], 7)], &[1]);
        check("tile", &[("reps", "(2, 3)")], &[x(&[2, 3], 8)], &[]);
        check("tile", &[("reps", "(2, 1, 2)")], &[x(&[3, 2], 9)], &[]);
        check("tile", &[("reps", "(3,)")], &[x(&[2, 2], 10)], &[]);
        check("repeat", &[("repeats", "3"), ("axis", "1")], &[x(&[2, 3, 2], 11)], &[]);
        check("repeat", &[("repeats", "2")], &[x(&[2, 3], 12)], &[]);
        check("repeat", &[("repeats", "2"), ("axis", "-1")], &[x(&[2, 3], 13)], &[]);
    }

    #[test]
    fn pad() {
        let pw = ("pad_width", "(0, 0, 0, 0, 1, 2, 2, 1)");
        check("Pad", &[("mode", "constant"), pw, ("constant_value", "1.5")], &[x(&[2, 2, 3, 4], 1)], &[]);
        check("Pad", &[("mode", "edge"), pw], &[x(&[2, 2, 3, 4], 2)], &[]);
        check("Pad", &[("mode", "reflect"), pw], &[x(&[2, 2, 3, 4], 3)], &[]);
        let pw5 = ("pad_width", "(0, 0, 0, 0, 1, 1, 0, 2, 2, 1)");
        check("Pad", &[("mode", "edge"), pw5], &[x(&[1, 2, 2, 3, 4], 4)], &[]);
        check("Pad", &[("mode", "reflect"), pw5], &[x(&[1, 2, 2, 3, 4], 5)], &[]);
    }

    #[test]
    fn diag() {
        check("diag", &[], &[x(&[3, 4], 1)], &[]);
        check("diag", &[("k", "1")], &[x(&[3, 4], 2)], &[]);
        check("diag", &[("k", "-2")], &[x(&[4, 3], 3)], &[]);
        check("diag", &[("k", "1"), ("axis1", "0"), ("axis2", "2")], &[x(&[3, 2, 4], 4)], &[]);
        check("diag", &[], &[x(&[3], 5)], &[]);
        check("diag", &[("k", "-1")], &[x(&[3], 6)], &[]);
    }
}
