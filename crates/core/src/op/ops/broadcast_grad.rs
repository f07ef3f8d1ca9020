//! Backward operators of the binary family, same-shape (`_backward_add`, ..., `_backward_hypot`)
//! and broadcast (`_backward_broadcast_add`, ..., `_backward_broadcast_hypot`); see `op::grad`
//! for the convention.
//!
//! Owns: the partial derivatives of each differentiable [`Bin`] function (stock's choices at
//! ties: maximum sends the gradient to lhs when `lhs >= rhs`, minimum when `lhs <= rhs`), the
//! three-operand walk that evaluates them over the output ([`run_tri`]), and [`reduce_to`], the
//! sum of an output-shaped gradient back onto a broadcast input's shape — the hot path of
//! broadcast add/sub/mul in training. It collapses dimensions into alternating runs of kept and
//! summed ones, sums contiguous rows with vectorisable loops (no index arithmetic per element)
//! and splits the work over the target elements, or, for small targets, over the outermost
//! summed dimension with per-task partial sums. Also owns the gradients of the add, sub,
//! mul and div backward operators (second order: [`binary_composed`]).

use super::broadcast::{for_runs, BPlan};
use super::elemwise::{dispatch_arith, Arith, Bin, Calc, BINS};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::ndarray::NDArray;
use crate::op::grad::Composed;
use crate::op::kernel::{par_for_mut, par_tasks_mut, sum_parts, Cost};
use crate::op::tensor::{OutBlob, TBlob};
use crate::op::{Grad, Meta, OpCtx, OpDef, Req};
use std::ops::Range;

/// `out[p] = f(g[p], l[.], r[.])` over the output of `plan` (g has the output's layout).
fn run_tri<T: Arith, U: Copy + Send + Sync>(
    plan: &BPlan,
    g: &[T],
    l: &[T],
    r: &[T],
    out: &mut [U],
    cost: Cost,
    f: impl Fn(T::C, T::C, T::C) -> U + Sync + Send,
) {
    let total = plan.size();
    debug_assert_eq!(out.len(), total);
    if total == 0 {
        return;
    }
    let k = plan.dims.len();
    let (ia, ib) = (plan.sa[k - 1], plan.sb[k - 1]);
    par_for_mut(out, 1, cost, T::DTYPE, |rg, out| {
        for_runs(plan, rg.start, out.len(), |done, col, oa, ob, len| {
            let p = rg.start + done;
            let (seg, gs) = (&mut out[done..done + len], &g[p..p + len]);
            match (ia, ib) {
                (1, 1) => {
                    let (xa, xb) = (&l[oa + col..oa + col + len], &r[ob + col..ob + col + len]);
                    for (((o, &g), &x), &y) in seg.iter_mut().zip(gs).zip(xa).zip(xb) {
                        *o = f(g.load(), x.load(), y.load());
                    }
                }
                (1, _) => {
                    let y = r[ob].load();
                    for ((o, &g), &x) in seg.iter_mut().zip(gs).zip(&l[oa + col..oa + col + len]) {
                        *o = f(g.load(), x.load(), y);
                    }
                }
                (_, 1) => {
                    let x = l[oa].load();
                    for ((o, &g), &y) in seg.iter_mut().zip(gs).zip(&r[ob + col..ob + col + len]) {
                        *o = f(g.load(), x, y.load());
                    }
                }
                _ => {
                    let (x, y) = (l[oa].load(), r[ob].load());
                    for (o, &g) in seg.iter_mut().zip(gs) {
                        *o = f(g.load(), x, y);
                    }
                }
            }
        });
    });
}

/// How an output-shaped array sums onto a target shape: collapsed dimensions (size, summed),
/// alternating between kept and summed runs, with their element strides in the source.
struct RPlan {
    dims: Vec<usize>,
    summed: Vec<bool>,
    strides: Vec<usize>,
}

impl RPlan {
    fn new(out: &[usize], target: &[usize]) -> RPlan {
        let pad = out.len() - target.len();
        let mut runs: Vec<(usize, bool)> = Vec::new();
        for (i, &n) in out.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let summed = i < pad || target[i - pad] != n;
            match runs.last_mut() {
                Some(last) if last.1 == summed => last.0 *= n,
                _ => runs.push((n, summed)),
            }
        }
        if runs.is_empty() {
            runs.push((1, false));
        }
        let mut strides = vec![0; runs.len()];
        let mut acc = 1;
        for (s, r) in strides.iter_mut().zip(&runs).rev() {
            *s = acc;
            acc *= r.0;
        }
        RPlan { dims: runs.iter().map(|r| r.0).collect(), summed: runs.iter().map(|r| r.1).collect(), strides }
    }

    /// Number of target elements.
    fn targets(&self) -> usize {
        self.dims.iter().zip(&self.summed).filter(|d| !*d.1).map(|d| *d.0).product()
    }

    /// Source offset of the first element summed into target `t`, decomposed over the kept
    /// dimensions before `end`.
    fn base(&self, mut t: usize, end: usize) -> usize {
        let mut off = 0;
        for j in (0..end).rev() {
            if !self.summed[j] {
                off += (t % self.dims[j]) * self.strides[j];
                t /= self.dims[j];
            }
        }
        off
    }

    /// Calls `f(offset)` for every combination of the summed dimensions before `end`.
    fn for_each_summed(&self, end: usize, mut f: impl FnMut(usize)) {
        let red: Vec<(usize, usize)> =
            (0..end).filter(|&j| self.summed[j]).map(|j| (self.dims[j], self.strides[j])).collect();
        let mut idx = vec![0usize; red.len()];
        let mut off = 0;
        loop {
            f(off);
            let mut j = red.len();
            loop {
                if j == 0 {
                    return;
                }
                j -= 1;
                idx[j] += 1;
                off += red[j].1;
                if idx[j] < red[j].0 {
                    break;
                }
                off -= red[j].1 * red[j].0;
                idx[j] = 0;
            }
        }
    }

    /// `acc[t - ts.start] += sum of src over target t`, for the targets in `ts`.
    fn sum_targets<S: Copy, C: Calc>(&self, src: &[S], load: &impl Fn(S) -> C, ts: Range<usize>, acc: &mut [C]) {
        let k = self.dims.len();
        let last = self.dims[k - 1];
        if !self.summed[k - 1] {
            // Kept inner run: accumulate rows of the source into segments of target rows.
            let mut t = ts.start;
            while t < ts.end {
                let (row, c0) = (t / last, t % last);
                let c1 = last.min(c0 + ts.end - t);
                let base = self.base(row, k - 1) + c0;
                let a = &mut acc[t - ts.start..t - ts.start + c1 - c0];
                self.for_each_summed(k - 1, |off| {
                    for (a, &s) in a.iter_mut().zip(&src[base + off..base + off + c1 - c0]) {
                        *a = a.add(load(s));
                    }
                });
                t += c1 - c0;
            }
        } else {
            // Summed inner run: each target sums contiguous runs of the source.
            for t in ts.clone() {
                let base = self.base(t, k - 1);
                let mut sum = C::ZERO;
                self.for_each_summed(k - 1, |off| sum = sum.add(lane_sum(&src[base + off..base + off + last], load)));
                acc[t - ts.start] = acc[t - ts.start].add(sum);
            }
        }
    }
}

/// The sum of a contiguous run, in eight independent lanes (so that it vectorises).
#[inline(always)]
fn lane_sum<S: Copy, C: Calc>(s: &[S], load: &impl Fn(S) -> C) -> C {
    let mut lanes = [C::ZERO; 8];
    let chunks = s.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] = lanes[i].add(load(c[i]));
        }
    }
    let mut sum = C::ZERO;
    for &x in rest {
        sum = sum.add(load(x));
    }
    let pairs = [lanes[0].add(lanes[4]), lanes[1].add(lanes[5]), lanes[2].add(lanes[6]), lanes[3].add(lanes[7])];
    sum.add(pairs[0].add(pairs[2]).add(pairs[1].add(pairs[3])))
}

/// Largest target summed with per-task partial sums (above it, tasks split the targets).
const PARTIAL_TARGETS: usize = 1 << 14;

/// `dst = store(sum of load(src) over the dimensions where target_shape broadcasts to out)`.
fn reduce_to<S: Copy + Sync, C: Calc, D: Copy + Send + Sync>(
    src: &[S],
    out_shape: &[usize],
    target_shape: &[usize],
    dst: &mut [D],
    dtype: crate::ndarray::DType,
    load: impl Fn(S) -> C + Sync,
    store: impl Fn(C) -> D + Sync,
) {
    if src.is_empty() {
        dst.fill(store(C::ZERO));
        return;
    }
    let plan = RPlan::new(out_shape, target_shape);
    let nt = plan.targets();
    debug_assert_eq!(nt, dst.len());
    let threads = sum_parts();
    let est_ns = src.len() as f64 * 0.3;
    if plan.summed[0] && nt <= PARTIAL_TARGETS && plan.dims[0] >= 2 && threads > 1 {
        // Split the outermost summed dimension; each task sums all targets over its part.
        let parts = threads.min(plan.dims[0]);
        let chunk = plan.dims[0].div_ceil(parts);
        let mut partial = vec![C::ZERO; parts * nt];
        par_tasks_mut(&mut partial, nt, est_ns, dtype, |i, acc| {
            let (lo, hi) = (i * chunk, ((i + 1) * chunk).min(plan.dims[0]));
            if lo >= hi {
                return;
            }
            let mut sub = RPlan { dims: plan.dims.clone(), summed: plan.summed.clone(), strides: plan.strides.clone() };
            sub.dims[0] = hi - lo;
            sub.sum_targets(&src[lo * plan.strides[0]..], &load, 0..nt, acc);
        });
        let (first, rest) = partial.split_at(nt);
        for (t, &v) in first.iter().enumerate() {
            let s = rest.chunks_exact(nt).fold(v, |s, p| s.add(p[t]));
            dst[t] = store(s);
        }
        return;
    }
    let tasks = if threads > 1 { nt.min(threads * 4) } else { 1 };
    let chunk = nt.div_ceil(tasks);
    par_tasks_mut(dst, chunk, est_ns, dtype, |i, o| {
        let ts = i * chunk..i * chunk + o.len();
        let mut acc = vec![C::ZERO; ts.len()];
        plan.sum_targets(src, &load, ts.clone(), &mut acc);
        for (o, a) in o.iter_mut().zip(acc) {
            *o = store(a);
        }
    });
}

/// The gradient of one input of a binary function, from `g` (output-shaped) and, for functions
/// that need them, the forward inputs.
fn side<T: Arith>(op: Bin, i: usize, ins: &[TBlob], out: &mut OutBlob) {
    type C<T> = <T as Arith>::C;
    let g = &ins[0];
    let dtype = g.dtype;
    let n = g.size();
    let direct = out.size() == n;
    if matches!(op, Bin::Add | Bin::Sub) {
        let neg = op == Bin::Sub && i == 1;
        let gs = g.as_slice::<T>();
        let oshape = out.shape.clone();
        let o = out.as_mut::<T>();
        if direct {
            if neg {
                let plan = BPlan::flat(n);
                run_tri::<T, T>(&plan, gs, gs, gs, o, Cost::CHEAP, |g, _, _| T::store(g.neg()));
            } else {
                o.copy_from_slice(gs);
            }
        } else if neg {
            reduce_to(gs, &g.shape, &oshape, o, dtype, |x: T| x.load(), |c: T::C| T::store(c.neg()));
        } else {
            reduce_to(gs, &g.shape, &oshape, o, dtype, |x: T| x.load(), T::store);
        }
        return;
    }
    // Stock's `%` has no gradient in integer types (both sides 0).
    if op == Bin::Mod && !matches!(T::DTYPE, DType::F32 | DType::F64 | DType::F16) {
        out.as_mut::<T>().fill(T::store(C::<T>::ZERO));
        return;
    }
    let (l, r) = (&ins[1], &ins[2]);
    let plan = if l.shape == r.shape { BPlan::flat(n) } else { BPlan::new(&l.shape, &r.shape, &g.shape) };
    let (gs, ls, rs) = (g.as_slice::<T>(), l.as_slice::<T>(), r.as_slice::<T>());
    macro_rules! go {
        ($cost:expr, |$g:ident, $l:ident, $r:ident| $e:expr) => {{
            if direct {
                run_tri::<T, T>(&plan, gs, ls, rs, out.as_mut::<T>(), $cost, |$g, $l, $r| T::store($e));
            } else {
                let mut tmp = vec![C::<T>::ZERO; n];
                run_tri::<T, C<T>>(&plan, gs, ls, rs, &mut tmp, $cost, |$g, $l, $r| $e);
                let oshape = out.shape.clone();
                reduce_to(&tmp, &g.shape, &oshape, out.as_mut::<T>(), dtype, |x: C<T>| x, T::store);
            }
        }};
    }
    let z = C::<T>::ZERO;
    match (op, i) {
        (Bin::Mul, 0) => go!(Cost::CHEAP, |g, _l, r| g.mul(r)),
        (Bin::Mul, _) => go!(Cost::CHEAP, |g, l, _r| g.mul(l)),
        (Bin::Div, 0) => go!(Cost::CHEAP, |g, _l, r| g.div(r)),
        (Bin::Div, _) => go!(Cost::MEDIUM, |g, l, r| g.mul(l).div(r.mul(r)).neg()),
        (Bin::Mod, 0) => go!(Cost::CHEAP, |g, _l, _r| g),
        (Bin::Mod, _) => go!(Cost::MEDIUM, |g, l, r| g.mul(l.div(r).floor()).neg()),
        (Bin::Pow, 0) => go!(Cost::MATH, |g, l, r| g.mul(r).mul(l.pow(r.sub(C::<T>::ONE)))),
        (Bin::Pow, _) => go!(Cost::MATH, |g, l, r| g.mul(l.pow(r)).mul(l.ln())),
        (Bin::Max, 0) => go!(Cost::CHEAP, |g, l, r| if l >= r { g } else { z }),
        (Bin::Max, _) => go!(Cost::CHEAP, |g, l, r| if l < r { g } else { z }),
        (Bin::Min, 0) => go!(Cost::CHEAP, |g, l, r| if l <= r { g } else { z }),
        (Bin::Min, _) => go!(Cost::CHEAP, |g, l, r| if l > r { g } else { z }),
        (Bin::Hypot, 0) => go!(Cost::MEDIUM, |g, l, r| g.mul(l).div(l.hypot(r))),
        (Bin::Hypot, _) => go!(Cost::MEDIUM, |g, l, r| g.mul(r).div(l.hypot(r))),
        _ => unreachable!("{op:?} has no backward operator"),
    }
}

fn compute(op: Bin, name: &'static str) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        for (i, out) in outs.iter_mut().enumerate().take(2) {
            if cx.req[i] != Req::Null {
                // Every dtype, as stock's (integer `%` has a gradient too).
                dispatch_arith!(ins[0].dtype, name, T => side::<T>(op, i, ins, out));
            }
        }
        Ok(())
    })
}

/// The gradient of a binary backward operator, same-shape or broadcast (`_backward_add(g) ->
/// (g, g)`, `_backward_broadcast_mul(g, a, b) -> (Σ g·b, Σ g·a)`, ...; Σ sums onto the
/// input's shape), with incoming gradients (ga, gb) of the inputs' shapes, composed of
/// element-wise or broadcast calls (stock's FGradient of these operators). Only add, sub, mul
/// and div have one, as in stock.
fn binary_composed(cx: &Composed) -> Result<Vec<Option<NDArray>>> {
    let (bin, broadcast) = BINS
        .iter()
        .find_map(|b| {
            (b.elemwise_grad == Some(cx.op.name))
                .then_some((b.op, false))
                .or_else(|| (b.broadcast_grad == Some(cx.op.name)).then_some((b.op, true)))
        })
        .ok_or_else(|| Error::internal(format!("{} is not a binary gradient", cx.op.name)))?;
    let pick = |same: &'static str, wide: &'static str| if broadcast { wide } else { same };
    let (add, sub) = (pick("elemwise_add", "broadcast_add"), pick("elemwise_sub", "broadcast_sub"));
    let (mul, div) = (pick("elemwise_mul", "broadcast_mul"), pick("elemwise_div", "broadcast_div"));
    let op2 = |op: &str, x: &NDArray, y: &NDArray| cx.call(op, &[x, y], &[]);
    // An output-shaped gradient summed onto input `i`'s shape (the reduction broadcast_add's
    // backward does, differentiable in turn).
    let onto = |h: NDArray, i: usize| -> Result<NDArray> {
        if !broadcast {
            return Ok(h);
        }
        let like: Vec<Meta> = cx.inputs[1..3].iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect();
        let mut want = [false; 2];
        want[i] = true;
        let reduce = crate::op::lookup(BINS[0].broadcast_grad.expect("add has a broadcast gradient"))?;
        let mut outs = cx.calls.backward(reduce, cx.attrs, &[&h], &like, &want)?;
        Ok(outs.swap_remove(i))
    };
    let (ga, gb) = (&cx.ograds[0], &cx.ograds[1]);
    let mut out = vec![None; cx.inputs.len()];
    match bin {
        Bin::Add | Bin::Sub if !cx.wants(0) => {}
        Bin::Add => out[0] = Some(op2(add, ga, gb)?),
        Bin::Sub => out[0] = Some(op2(sub, ga, gb)?),
        // (g·b, g·a)
        Bin::Mul => {
            let (g, a, b) = (&cx.inputs[0], &cx.inputs[1], &cx.inputs[2]);
            if cx.wants(0) {
                out[0] = Some(cx.add(&op2(mul, ga, b)?, &op2(mul, gb, a)?)?);
            }
            if cx.wants(1) {
                out[1] = Some(onto(op2(mul, g, gb)?, 0)?);
            }
            if cx.wants(2) {
                out[2] = Some(onto(op2(mul, g, ga)?, 1)?);
            }
        }
        // (g/b, -g·a/b²)
        Bin::Div => {
            let (g, a, b) = (&cx.inputs[0], &cx.inputs[1], &cx.inputs[2]);
            let b2 = cx.call("square", &[b], &[])?;
            if cx.wants(0) {
                let ta = op2(div, ga, b)?;
                let tb = op2(mul, gb, &op2(div, a, &b2)?)?;
                out[0] = Some(cx.sub(&ta, &tb)?);
            }
            if cx.wants(1) {
                let t = op2(div, &op2(mul, g, gb)?, &b2)?;
                out[1] = Some(onto(cx.scalar("_mul_scalar", &t, -1.0)?, 0)?);
            }
            if cx.wants(2) {
                // -g·ga/b² + 2·g·gb·a/b³
                let ta = op2(div, &op2(mul, g, ga)?, &b2)?;
                let b3 = cx.mul(&b2, b)?;
                let tb = op2(div, &op2(mul, &op2(mul, g, gb)?, a)?, &b3)?;
                out[2] = Some(onto(cx.sub(&cx.scalar("_mul_scalar", &tb, 2.0)?, &ta)?, 1)?);
            }
        }
        _ => {
            return Err(Error::mxnet(format!(
                "Operator {} is non-differentiable because it didn't register FGradient attribute.",
                cx.op.name
            )))
        }
    }
    Ok(out)
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for b in BINS {
        // GPU forms: each side's derivative in the output gradient `x` and one backward
        // input `y` (1: lhs, 2: rhs); the other functions need both inputs (none yet).
        let gpu = match b.op {
            Bin::Add => Some([("x", None), ("x", None)]),
            Bin::Sub => Some([("x", None), ("-x", None)]),
            Bin::Mul => Some([("x * y", Some(2)), ("x * y", Some(1))]),
            _ => None,
        };
        for name in [b.elemwise_grad, b.broadcast_grad].into_iter().flatten() {
            let mut def = OpDef::backward(name, &[], compute(b.op, name));
            if let Some(sides) = gpu {
                def = def.gpu(crate::op::gpu::GpuKernel::BinaryGrad(sides));
            }
            if matches!(b.op, Bin::Add | Bin::Sub | Bin::Mul | Bin::Div) {
                def = def.grad(Grad::Composed { f: binary_composed, inputs: b.grad_inputs, outputs: false });
            }
            ops.push(def);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::grad::check::{check, values};

    /// Shape pairs: same shape, row, column, both broadcast, scalar-like, leading 1s.
    const SHAPES: &[(&[usize], &[usize])] = &[
        (&[2, 3], &[2, 3]),
        (&[2, 3, 4], &[3, 1]),
        (&[4, 1], &[4, 5]),
        (&[2, 1, 3], &[1, 4, 1]),
        (&[1], &[2, 3]),
        (&[1, 3, 1], &[2, 3, 2]),
    ];

    fn size(s: &[usize]) -> usize {
        s.iter().product()
    }

    fn run(ops: &[&str], lo: (f64, f64), ro: (f64, f64)) {
        for (k, &(a, b)) in SHAPES.iter().enumerate() {
            for op in ops {
                let same = a == b;
                let name = if same { op.to_string() } else { format!("broadcast_{op}") };
                let name = match (same, *op) {
                    (true, "add") => "elemwise_add".to_string(),
                    (true, "sub") => "elemwise_sub".to_string(),
                    (true, "mul") => "elemwise_mul".to_string(),
                    (true, "div") => "elemwise_div".to_string(),
                    (true, o) => format!("_{o}"),
                    _ => name,
                };
                let l = values(size(a), lo.0, lo.1, 3 + k as u64);
                let r = values(size(b), ro.0, ro.1, 7 + k as u64);
                check(&name, &[], &[(a, l), (b, r)], &[]);
            }
        }
    }

    #[test]
    fn add_sub_mul_div_hypot() {
        run(&["add", "sub", "mul", "div", "hypot"], (-2.0, 2.0), (0.5, 2.0));
    }

    #[test]
    fn maximum_minimum() {
        // Random values: no ties.
        run(&["maximum", "minimum"], (-1.0, 1.0), (-1.0, 1.0));
    }

    #[test]
    fn power() {
        run(&["power"], (0.5, 2.0), (-1.5, 2.5));
    }

    #[test]
    fn modulo() {
        // Divisors near 10 and dividends 10m + [2, 8]: away from the jumps, floor(l/r) varied.
        for (k, &(a, b)) in SHAPES.iter().enumerate() {
            let l: Vec<f64> = values(size(a), 2.0, 8.0, 11 + k as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| v + 10.0 * ((i % 7) as f64 - 3.0))
                .collect();
            let r = values(size(b), 9.9, 10.1, 13 + k as u64);
            check(if a == b { "_mod" } else { "broadcast_mod" }, &[], &[(a, l), (b, r)], &[]);
        }
    }

    fn naive(src: &[f32], out: &[usize], target: &[usize]) -> Vec<f64> {
        let pad = out.len() - target.len();
        let mut dst = vec![0f64; size(target)];
        for (p, &v) in src.iter().enumerate() {
            let (mut rem, mut t, mut m) = (p, 0, 1);
            for d in (0..out.len()).rev() {
                let c = rem % out[d];
                rem /= out[d];
                if d >= pad && target[d - pad] != 1 {
                    t += c * m;
                }
                if d >= pad {
                    m *= target[d - pad];
                }
            }
            dst[t] += v as f64;
        }
        dst
    }

    #[test]
    fn reduce_matches_naive_sums() {
        // Large enough to split over tasks both ways (targets, outermost summed dimension).
        let cases: &[(&[usize], &[usize])] = &[
            (&[3000, 7], &[7]),
            (&[64, 32, 300], &[1, 32, 1]),
            (&[100_003], &[1]),
            (&[20, 5000], &[20, 1]),
            (&[40, 3, 50, 7], &[3, 1, 7]),
            (&[5, 1, 20000], &[1, 1, 20000]),
            (&[6, 4, 5], &[6, 4, 5]),
            (&[0, 3], &[1, 3]),
            (&[50_000, 2], &[50_000, 1]),
        ];
        for &(out, target) in cases {
            let src: Vec<f32> = (0..size(out)).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
            let mut dst = vec![f32::NAN; size(target)];
            reduce_to(&src, out, target, &mut dst, crate::ndarray::DType::F32, |x: f32| x, |c: f32| c);
            let want = naive(&src, out, target);
            for (t, (&d, &w)) in dst.iter().zip(&want).enumerate() {
                assert!((d as f64 - w).abs() <= 1e-3 * (1.0 + w.abs()), "{out:?} -> {target:?} [{t}]: {d} vs {w}");
            }
        }
    }

    #[test]
    fn float16_broadcast_sub() {
        // Through the kernel, in the low-precision dtypes: d(lhs) sums the rows, d(rhs) is g.
        use crate::ndarray::DType;
        let g: Vec<half::f16> = (0..12).map(|i| half::f16::from_f32(i as f32)).collect();
        let mut dl = [half::f16::ZERO; 4];
        let mut dr = [half::f16::ZERO; 12];
        // SAFETY: the vectors outlive the call and match the shapes.
        let blob = |p: *const half::f16, s: &[usize]| unsafe { TBlob::new(p as *mut u8, s, DType::F16) };
        let ins = [blob(g.as_ptr(), &[3, 4])];
        // SAFETY: the vectors outlive the call and are read only after it.
        let oblob = |p: *mut half::f16, s: &[usize]| unsafe { OutBlob::new(p.cast(), s, DType::F16) };
        let mut outs = [oblob(dl.as_mut_ptr(), &[1, 4]), oblob(dr.as_mut_ptr(), &[3, 4])];
        let attrs =
            crate::op::lookup("broadcast_sub").unwrap().parse_attrs(std::iter::empty::<(&str, &str)>(), 2).unwrap();
        let req = [Req::Write, Req::Write];
        let cx = OpCtx { attrs: &attrs, req: &req, rng: None, is_train: true, temp: None };
        (crate::op::lookup("_backward_broadcast_sub").unwrap().compute)(&cx, &ins, &mut outs).unwrap();
        assert_eq!(dl.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), vec![12.0, 15.0, 18.0, 21.0]);
        assert_eq!(dr.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), (0..12).map(|i| -(i as f32)).collect::<Vec<_>>());
    }
}
