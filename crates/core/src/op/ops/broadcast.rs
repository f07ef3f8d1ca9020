//! Binary operators with NumPy-style broadcasting (`broadcast_add`, ..., `broadcast_logical_xor`)
//! and the strided binary loop that the same-shape and scalar operators share.
//!
//! Owns: the broadcast plan ([`BPlan`]: output shape, then dimensions collapsed so that runs
//! of dimensions with the same broadcast pattern become one, with per-input element strides,
//! 0 on broadcast dimensions) and [`run_bin`], which walks the output in contiguous inner runs
//! with an odometer over the outer dimensions (one division per parallel chunk, none per
//! element), choosing a vector-friendly inner loop for each stride pattern.

use super::elemwise::{bin_dispatch, Bin, BINS};
use crate::error::{Error, Result};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::tensor::{Elem, Operand, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef};

/// How two inputs map onto the output, dimensions collapsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BPlan {
    /// Collapsed output dimensions (at least one).
    pub dims: Dims,
    /// Element strides of lhs and rhs per collapsed dimension (0: broadcast).
    pub sa: Dims,
    pub sb: Dims,
}

/// A plan's per-dimension values: inline up to 4 collapsed dimensions (most plans have one or
/// two), so that planning a small call allocates nothing.
pub(crate) type Dims = smallvec::SmallVec<[usize; 4]>;

/// The broadcast output shape of `a` and `b` (shapes aligned at the right; each pair of sizes
/// equal or one of them 1).
pub(crate) fn broadcast_shape(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= n { s[i + s.len() - n] } else { 1 };
    (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            match (x, y) {
                _ if x == y => Ok(x),
                (1, _) => Ok(y),
                (_, 1) => Ok(x),
                _ => Err(Error::mxnet(format!(
                    "operator {op}: shapes {a:?} and {b:?} cannot be broadcast together (dimension {i}: {x} vs {y})"
                ))),
            }
        })
        .collect()
}

impl BPlan {
    /// Plan `a` (op) `b` into `out` (the broadcast shape of both).
    pub fn new(a: &[usize], b: &[usize], out: &[usize]) -> BPlan {
        let n = out.len();
        let pad =
            |s: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, n - s.len()).chain(s.iter().copied()).collect() };
        let (a, b) = (pad(a), pad(b));
        // Collapsed dims with (lhs broadcast, rhs broadcast) flags.
        let mut dims: Vec<(usize, bool, bool)> = Vec::new();
        for i in 0..n {
            if out[i] == 1 {
                continue;
            }
            let (ba, bb) = (a[i] != out[i], b[i] != out[i]);
            match dims.last_mut() {
                Some(last) if last.1 == ba && last.2 == bb => last.0 *= out[i],
                _ => dims.push((out[i], ba, bb)),
            }
        }
        if dims.is_empty() {
            dims.push((1, false, false));
        }
        let strides = |pick: fn(&(usize, bool, bool)) -> bool| {
            let mut s = Dims::from_elem(0, dims.len());
            let mut acc = 1;
            for (i, d) in dims.iter().enumerate().rev() {
                if !pick(d) {
                    s[i] = acc;
                    acc *= d.0;
                }
            }
            s
        };
        let sa = strides(|d| d.1);
        let sb = strides(|d| d.2);
        BPlan { dims: dims.iter().map(|d| d.0).collect(), sa, sb }
    }

    /// A same-shape plan over `n` elements.
    pub fn flat(n: usize) -> BPlan {
        BPlan { dims: smallvec::smallvec![n], sa: smallvec::smallvec![1], sb: smallvec::smallvec![1] }
    }

    /// A plan for an array of `n` elements against one scalar (rhs).
    pub fn scalar(n: usize) -> BPlan {
        BPlan { dims: smallvec::smallvec![n], sa: smallvec::smallvec![1], sb: smallvec::smallvec![0] }
    }

    pub fn size(&self) -> usize {
        self.dims.iter().product()
    }
}

/// Outputs of at most this many elements never split across threads: at the dearest
/// per-element cost (`Cost::MATH`, 24 times `Cost::CHEAP`) they make 1.5 of the 2 minimum chunks
/// a split needs (see `kernel::max_parts`; a test below pins this), so [`run_bin`] runs them
/// in one plain loop.
const TINY: usize = 64;

/// `out = f(a, b)` elementwise under `plan`, over the kernel pool.
pub(crate) fn run_bin<T: Elem, U: Elem>(
    plan: &BPlan,
    a: &[T],
    b: &[T],
    out: &mut [U],
    cost: Cost,
    f: impl Fn(T, T) -> U + Sync + Send,
) {
    let total = plan.size();
    debug_assert_eq!(out.len(), total);
    if total == 0 {
        return;
    }
    let k = plan.dims.len();
    let (ia, ib) = (plan.sa[k - 1], plan.sb[k - 1]);
    if k == 1 && ia == 1 && ib == 1 && total <= TINY {
        // Same shape and a few elements: one plain loop (no odometer, no split to consider),
        // the common case of small imperative calls.
        for ((o, &x), &y) in out.iter_mut().zip(&a[..total]).zip(&b[..total]) {
            *o = f(x, y);
        }
        return;
    }
    par_for_mut(out, 1, cost, U::DTYPE, |r, out| {
        for_runs(plan, r.start, out.len(), |done, col, oa, ob, len| {
            let seg = &mut out[done..done + len];
            match (ia, ib) {
                (1, 1) => {
                    let (xa, xb) = (&a[oa + col..oa + col + len], &b[ob + col..ob + col + len]);
                    for ((o, &x), &y) in seg.iter_mut().zip(xa).zip(xb) {
                        *o = f(x, y);
                    }
                }
                (1, _) => {
                    let y = b[ob];
                    for (o, &x) in seg.iter_mut().zip(&a[oa + col..oa + col + len]) {
                        *o = f(x, y);
                    }
                }
                (_, 1) => {
                    let x = a[oa];
                    for (o, &y) in seg.iter_mut().zip(&b[ob + col..ob + col + len]) {
                        *o = f(x, y);
                    }
                }
                _ => seg.fill(f(a[oa], b[ob])),
            }
        });
    });
}

/// Walks output positions `start..start + len` of `plan` in runs that stay within one inner
/// row: `f(done, col, oa, ob, run)` for the `run` outputs at `start + done`, which sit at
/// column `col` of a row whose lhs and rhs elements start at `oa` and `ob` (inner strides are
/// 0 or 1). An odometer over the outer dimensions: one division per call, none per element.
pub(crate) fn for_runs(plan: &BPlan, start: usize, len: usize, mut f: impl FnMut(usize, usize, usize, usize, usize)) {
    let k = plan.dims.len();
    let inner = plan.dims[k - 1];
    let mut row = start / inner;
    let mut col = start % inner;
    let mut idx: Dims = smallvec::smallvec![0; k - 1];
    let (mut oa, mut ob) = (0usize, 0usize);
    for j in (0..k - 1).rev() {
        idx[j] = row % plan.dims[j];
        row /= plan.dims[j];
        oa += idx[j] * plan.sa[j];
        ob += idx[j] * plan.sb[j];
    }
    let mut done = 0;
    while done < len {
        let run = (inner - col).min(len - done);
        f(done, col, oa, ob, run);
        done += run;
        col = 0;
        // Advance the odometer by one row.
        for j in (0..k - 1).rev() {
            idx[j] += 1;
            oa += plan.sa[j];
            ob += plan.sb[j];
            if idx[j] < plan.dims[j] {
                break;
            }
            oa -= plan.sa[j] * plan.dims[j];
            ob -= plan.sb[j] * plan.dims[j];
            idx[j] = 0;
        }
    }
}

/// `out = f(a, b)` as [`run_bin`], where one or both operands are the output itself (an
/// input lent to it in place: each element is read before it is written).
pub(crate) fn run_bin_rmw<T: Elem>(
    plan: &BPlan,
    a: Operand<T>,
    b: Operand<T>,
    out: &mut [T],
    cost: Cost,
    f: impl Fn(T, T) -> T + Sync + Send,
) {
    if plan.size() == 0 {
        return;
    }
    debug_assert_eq!(out.len(), plan.size());
    let k = plan.dims.len();
    let (ia, ib) = (plan.sa[k - 1], plan.sb[k - 1]);
    par_for_mut(out, 1, cost, T::DTYPE, |r, out| {
        for_runs(plan, r.start, out.len(), |done, col, oa, ob, len| {
            let seg = &mut out[done..done + len];
            match (a, b) {
                (Operand::Output, Operand::Output) => seg.iter_mut().for_each(|v| *v = f(*v, *v)),
                (Operand::Output, Operand::Input(b)) => {
                    seg.iter_mut().enumerate().for_each(|(i, v)| *v = f(*v, b[ob + (col + i) * ib]))
                }
                (Operand::Input(a), Operand::Output) => {
                    seg.iter_mut().enumerate().for_each(|(i, v)| *v = f(a[oa + (col + i) * ia], *v))
                }
                (Operand::Input(a), Operand::Input(b)) => {
                    seg.iter_mut().enumerate().for_each(|(i, v)| *v = f(a[oa + (col + i) * ia], b[ob + (col + i) * ib]))
                }
            }
        });
    });
}

fn infer_broadcast(op: &'static str) -> crate::op::InferFn {
    Box::new(move |_, ins: &[Meta]| {
        if ins[0].dtype != ins[1].dtype {
            return Err(Error::type_error(format!(
                "operator {op}: lhs has dtype {} but rhs has dtype {}",
                ins[0].dtype.name(),
                ins[1].dtype.name()
            )));
        }
        Ok(vec![Meta::new(broadcast_shape(op, &ins[0].shape, &ins[1].shape)?, ins[0].dtype)])
    })
}

fn compute(op: Bin) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        let plan = if ins[0].shape == ins[1].shape {
            BPlan::flat(ins[0].size())
        } else {
            BPlan::new(&ins[0].shape, &ins[1].shape, &outs[0].shape)
        };
        bin_dispatch(cx.attrs.op, op, &plan, &ins[0], &ins[1], &mut outs[0])
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for b in BINS {
        let Some(name) = b.broadcast else { continue };
        let mut def = OpDef::new(name, Inputs::Fixed(&["lhs", "rhs"]), infer_broadcast(name), compute(b.op))
            .alias(b.broadcast_aliases)
            .same_shape()
            .gpu(crate::op::gpu::GpuKernel::Map2(b.op.cuda()))
            .inplace(&[(0, 0), (1, 0)])
            .doc(format!("{name}: {} of the two inputs with broadcasting.", b.doc));
        def = def.grad(match b.broadcast_grad {
            Some(g) => Grad::Backward { op: g, inputs: b.grad_inputs, outputs: false },
            None => Grad::Zero,
        });
        ops.push(def);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::kernel::max_parts;

    #[test]
    fn tiny_outputs_would_not_split_at_any_binary_cost() {
        // `run_bin` runs same-shape outputs of at most TINY elements in one plain loop, which
        // changes nothing only while even the dearest binary function would run them serially.
        for cost in [Cost::CHEAP, Cost::MEDIUM, Cost::MATH] {
            assert!(max_parts(TINY, cost) < 2, "{TINY} elements at {} ns split", cost.0);
        }
    }

    #[test]
    fn shapes_broadcast_numpy_style() {
        assert_eq!(broadcast_shape("t", &[2, 3, 4], &[3, 1]).unwrap(), vec![2, 3, 4]);
        assert_eq!(broadcast_shape("t", &[1], &[5, 1, 2]).unwrap(), vec![5, 1, 2]);
        assert_eq!(broadcast_shape("t", &[0, 3], &[1, 3]).unwrap(), vec![0, 3]);
        let e = broadcast_shape("t", &[2, 3], &[4, 3]).unwrap_err().to_string();
        assert!(e.contains("cannot be broadcast") && e.contains("[2, 3]"), "{e}");
    }

    #[test]
    fn plans_collapse_dimensions() {
        // Same pattern everywhere: one dimension.
        assert_eq!(
            BPlan::new(&[2, 3, 4], &[2, 3, 4], &[2, 3, 4]),
            BPlan { dims: smallvec::smallvec![24], sa: smallvec::smallvec![1], sb: smallvec::smallvec![1] }
        );
        // Row vector against a matrix: rows outer, rhs repeats.
        let p = BPlan::new(&[5, 2, 3], &[3], &[5, 2, 3]);
        assert_eq!(
            p,
            BPlan { dims: smallvec::smallvec![10, 3], sa: smallvec::smallvec![3, 1], sb: smallvec::smallvec![0, 1] }
        );
        // Column: rhs constant along the inner run.
        let p = BPlan::new(&[4, 6], &[4, 1], &[4, 6]);
        assert_eq!(
            p,
            BPlan { dims: smallvec::smallvec![4, 6], sa: smallvec::smallvec![6, 1], sb: smallvec::smallvec![1, 0] }
        );
        // Both broadcast (outer product), with size-1 dims dropped.
        let p = BPlan::new(&[3, 1, 1], &[1, 1, 5], &[3, 1, 5]);
        assert_eq!(
            p,
            BPlan { dims: smallvec::smallvec![3, 5], sa: smallvec::smallvec![1, 0], sb: smallvec::smallvec![0, 1] }
        );
        // All ones: a single element.
        assert_eq!(BPlan::new(&[1, 1], &[1], &[1, 1]).dims.as_slice(), &[1]);
    }

    fn naive(a: &[f32], ash: &[usize], b: &[f32], bsh: &[usize], out: &[usize]) -> Vec<f32> {
        let n = out.len();
        let total: usize = out.iter().product();
        let pad =
            |s: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, n - s.len()).chain(s.iter().copied()).collect() };
        let (pa, pb) = (pad(ash), pad(bsh));
        (0..total)
            .map(|mut i| {
                let (mut ia, mut ib, mut ma, mut mb) = (0, 0, 1, 1);
                for d in (0..n).rev() {
                    let c = i % out[d];
                    i /= out[d];
                    ia += (c % pa[d]) * ma;
                    ib += (c % pb[d]) * mb;
                    ma *= pa[d];
                    mb *= pb[d];
                }
                a[ia] * 10.0 + b[ib]
            })
            .collect()
    }

    #[test]
    fn run_matches_naive_indexing() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 4], &[3, 1]),
            (&[3, 1, 5], &[1, 4, 1]),
            (&[7], &[1]),
            (&[1, 6], &[5, 1]),
            (&[2, 1, 3, 1], &[1, 4, 1, 5]),
            (&[300, 17], &[17]),
            (&[5000, 3], &[5000, 1]),
        ];
        for &(ash, bsh) in cases {
            let out = broadcast_shape("t", ash, bsh).unwrap();
            let a: Vec<f32> = (0..ash.iter().product::<usize>()).map(|i| (i % 97) as f32).collect();
            let b: Vec<f32> = (0..bsh.iter().product::<usize>()).map(|i| (i % 89) as f32 * 0.5).collect();
            let plan = BPlan::new(ash, bsh, &out);
            let mut o = vec![0f32; out.iter().product()];
            run_bin(&plan, &a, &b, &mut o, Cost::MATH, |x, y| x * 10.0 + y);
            assert_eq!(o, naive(&a, ash, &b, bsh, &out), "{ash:?} {bsh:?}");
        }
    }
}
