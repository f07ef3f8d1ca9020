//! Stock's linear-algebra operators (`_linalg_*`, aliases `linalg_*`) and their backward
//! operators: products (`gemm`, `gemm2`, `syrk`, `trmm`), triangular solves (`trsm`),
//! Cholesky (`potrf`, `potri`), LQ (`gelqf`), symmetric eigendecomposition (`syevd`), LU-based
//! `inverse`, `det` and `slogdet`, and the diagonal/triangle copies (`extractdiag`,
//! `makediag`, `extracttrian`, `maketrian`, `sumlogdiag`).
//!
//! Every operator works on stacks of matrices held in the trailing two axes (`gemm`'s and
//! `gemm2`'s rows may lie on another axis, `axis`), float32 and float64 only, as stock's
//! LAPACK-backed kernels. Products run on the crate's GEMM ([`super::linalg::GemmElem`]) in
//! the data's precision; factorizations and solves run on plain row-major loops in float64
//! (matrices here are small), one task per matrix on the kernel pool, and round once. The
//! conventions are stock's: the triangle a factorization reads (`lower`), the hidden LU and
//! pivot outputs of `det`/`slogdet` (the LU of Aᵀ, as stock's column-major `getrf` sees the
//! data), LAPACK's Householder signs for `gelqf`, and `syevd`'s eigenvector signs (largest
//! entry positive). The backward formulas are stock's (`la_op-inl.h`), including those that
//! give a symmetric gradient for an operator that reads one triangle (`potrf`, `syevd`).
//!
//! Owns nothing outside this file; it reuses the GEMM entry point of `linalg.rs`.

use super::linalg::{gemm, GemmElem};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_items, par_tasks_mut, parts};
use crate::op::param::{op_params, Attrs, ParamSpec};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req};
use std::sync::atomic::{AtomicUsize, Ordering};

op_params! {
    pub(super) struct MacParams<'a> => MAC_PARAMS {
        transpose_a: bool = "False", "Multiply with transposed of first input (A).";
        transpose_b: bool = "False", "Multiply with transposed of second input (B).";
        alpha: f64 = "1", "Scalar factor multiplied with A*B.";
        beta: f64 = "1", "Scalar factor multiplied with C.";
        axis: i64 = "-2", "Axis corresponding to the matrix rows.";
    }
}

op_params! {
    pub(super) struct MultParams<'a> => MULT_PARAMS {
        transpose_a: bool = "False", "Multiply with transposed of first input (A).";
        transpose_b: bool = "False", "Multiply with transposed of second input (B).";
        alpha: f64 = "1", "Scalar factor multiplied with A*B.";
        axis: i64 = "-2", "Axis corresponding to the matrix row indices.";
    }
}

op_params! {
    pub(super) struct CholParams<'a> => CHOL_PARAMS {
        lower: bool = "True", "True if the triangular matrix is lower triangular, false if it is upper triangular.";
    }
}

op_params! {
    pub(super) struct TriParams<'a> => TRI_PARAMS {
        transpose: bool = "False", "Use transposed of the triangular matrix";
        rightside: bool = "False", "Multiply triangular matrix from the right to non-triangular one.";
        lower: bool = "True", "True if the triangular matrix is lower triangular, false if it is upper triangular.";
        alpha: f64 = "1", "Scalar factor to be applied to the result.";
    }
}

op_params! {
    pub(super) struct SyrkParams<'a> => SYRK_PARAMS {
        transpose: bool = "False", "Use transpose of input matrix.";
        alpha: f64 = "1", "Scalar factor to be applied to the result.";
    }
}

const OFFSET_DOC: &str = "Offset of the diagonal versus the main diagonal. 0 corresponds to the main diagonal, a negative/positive value to diagonals below/above the main diagonal.";

op_params! {
    pub(super) struct DiagParams<'a> => DIAG_PARAMS {
        offset: i64 = "0", OFFSET_DOC;
    }
}

op_params! {
    pub(super) struct TrianParams<'a> => TRIAN_PARAMS {
        offset: i64 = "0", OFFSET_DOC;
        lower: bool = "True", "Refer to the lower triangular matrix if lower=true, refer to the upper otherwise. Only relevant when offset=0";
    }
}

const NO_PARAMS: &[ParamSpec] = &[];

/// Runs `$body` with `$T` bound to f32 or f64 (stock's LAPACK kernels take no other dtype).
macro_rules! dispatch_la {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {{
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            other => {
                return Err(Error::type_error(format!(
                    "operator {}: only float32 and float64 are supported, not {}",
                    $op,
                    other.name()
                )))
            }
        }
    }};
}

// ---------------------------------------------------------------------------------------------
// Shapes and dtypes

/// The inputs' common dtype, float32 or float64.
fn real_dtype(op: &str, ins: &[Meta]) -> Result<DType> {
    let dt = ins[0].dtype;
    if !matches!(dt, DType::F32 | DType::F64) {
        return Err(Error::type_error(format!(
            "operator {op}: only float32 and float64 are supported, not {}",
            dt.name()
        )));
    }
    if let Some(i) = ins.iter().position(|m| m.dtype != dt) {
        return Err(Error::type_error(format!(
            "operator {op}: input {i} has dtype {}, expected {} like input 0",
            ins[i].dtype.name(),
            dt.name()
        )));
    }
    Ok(dt)
}

/// (batch, rows, columns) of a stack of matrices on the trailing two axes.
fn mats(op: &str, what: &str, s: &[usize]) -> Result<(usize, usize, usize)> {
    match s.len() {
        0 | 1 => Err(Error::value(format!(
            "operator {op}: {what} must have at least 2 dimensions (a tensor of matrices), got shape {s:?}"
        ))),
        nd => Ok((s[..nd - 2].iter().product(), s[nd - 2], s[nd - 1])),
    }
}

/// (batch, n) of a stack of square matrices.
fn squares(op: &str, what: &str, s: &[usize]) -> Result<(usize, usize)> {
    let (batch, r, c) = mats(op, what, s)?;
    if r != c {
        return Err(Error::value(format!(
            "operator {op}: {what} must be a tensor of square matrices (its last two dimensions equal), got shape {s:?}"
        )));
    }
    Ok((batch, r))
}

/// Leading (batch) axes and the trailing `k` axes of a shape.
fn lead(s: &[usize], k: usize) -> &[usize] {
    &s[..s.len().saturating_sub(k)]
}

fn with(lead: &[usize], tail: &[usize]) -> Vec<usize> {
    let mut v = lead.to_vec();
    v.extend_from_slice(tail);
    v
}

// ---------------------------------------------------------------------------------------------
// Dense float64 kernels on row-major matrices (one matrix of a batch each)

/// `op(a)·op(b)` for `a` stored `ar`×`ac` (transposed when `ta`) and `b` stored `br`×`bc`.
#[allow(clippy::too_many_arguments)]
fn mm(a: &[f64], ar: usize, ac: usize, ta: bool, b: &[f64], br: usize, bc: usize, tb: bool) -> Vec<f64> {
    let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
    let n = if tb { br } else { bc };
    let mut c = vec![0.0; m * n];
    gemm::<f64>(m, n, k, a, ta, b, tb, &mut c, false);
    c
}

fn transposed(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// The triangle of `a` (n×n) that `lower` names, as a lower-triangular matrix (the lower
/// triangle itself, or the transpose of the upper one); zeros elsewhere.
fn lower_of(a: &[f64], n: usize, lower: bool) -> Vec<f64> {
    let mut l = vec![0.0; n * n];
    for r in 0..n {
        for c in 0..=r {
            l[r * n + c] = if lower { a[r * n + c] } else { a[c * n + r] };
        }
    }
    l
}

/// Zeros the triangle `lower` does not name (the diagonal stays).
fn keep_triangle(a: &mut [f64], n: usize, lower: bool) {
    for r in 0..n {
        for c in 0..n {
            if (lower && c > r) || (!lower && c < r) {
                a[r * n + c] = 0.0;
            }
        }
    }
}

/// Copies the lower triangle over the upper one (stock's copyLTU: a symmetric matrix).
fn symmetrize_from_lower(a: &mut [f64], n: usize) {
    for r in 0..n {
        for c in 0..r {
            a[c * n + r] = a[r * n + c];
        }
    }
}

/// Solves `m·x = b` in place (`x` over `b`, n×k) for triangular `m` (n×n; only the triangle
/// `lower` names is read; `unit`: its diagonal is taken as ones).
fn solve_left(m: &[f64], n: usize, lower: bool, unit: bool, x: &mut [f64], k: usize) {
    for step in 0..n {
        // Forward substitution for a lower triangle, backward for an upper one.
        let i = if lower { step } else { n - 1 - step };
        let (head, tail) = x.split_at_mut(i * k);
        let (xi, after) = tail.split_at_mut(k);
        for j in if lower { 0..i } else { i + 1..n } {
            let f = m[i * n + j];
            let xj = if lower { &head[j * k..(j + 1) * k] } else { &after[(j - i - 1) * k..(j - i) * k] };
            for (v, w) in xi.iter_mut().zip(xj) {
                *v -= f * w;
            }
        }
        if !unit {
            let d = m[i * n + i];
            for v in xi.iter_mut() {
                *v /= d;
            }
        }
    }
}

/// Solves `x·m = b` in place (`x` over `b`, rows×n) for triangular `m` (n×n; only the
/// triangle `lower` names is read).
fn solve_right(m: &[f64], n: usize, lower: bool, x: &mut [f64], rows: usize) {
    for xr in x.chunks_exact_mut(n.max(1)).take(rows) {
        if lower {
            for j in (0..n).rev() {
                xr[j] /= m[j * n + j];
                let v = xr[j];
                for (l, w) in xr[..j].iter_mut().enumerate() {
                    *w -= v * m[j * n + l];
                }
            }
        } else {
            for j in 0..n {
                xr[j] /= m[j * n + j];
                let v = xr[j];
                for (l, w) in xr.iter_mut().enumerate().skip(j + 1) {
                    *w -= v * m[j * n + l];
                }
            }
        }
    }
}

fn identity(n: usize) -> Vec<f64> {
    let mut e = vec![0.0; n * n];
    for i in 0..n {
        e[i * n + i] = 1.0;
    }
    e
}

/// The Cholesky factor `l` (lower, in place) of the symmetric matrix whose lower triangle
/// `a` holds; the upper triangle is zeroed. `Err(k)`: the leading minor of order k+1 is not
/// positive definite (LAPACK's `potrf` info).
fn cholesky(a: &mut [f64], n: usize) -> std::result::Result<(), usize> {
    for j in 0..n {
        let (_, rest) = a.split_at_mut(j * n);
        let (rj, below) = rest.split_at_mut(n);
        let d = rj[j] - rj[..j].iter().map(|v| v * v).sum::<f64>();
        if d.is_nan() || d <= 0.0 {
            return Err(j);
        }
        let d = d.sqrt();
        rj[j] = d;
        for ri in below.chunks_exact_mut(n) {
            let s: f64 = ri[..j].iter().zip(&rj[..j]).map(|(x, y)| x * y).sum();
            ri[j] = (ri[j] - s) / d;
        }
    }
    keep_triangle(a, n, true);
    Ok(())
}

/// LU factorization with partial pivoting in place (unit-lower L below the diagonal, U on
/// and above; LAPACK's `getrf`): `piv[k]` is the 1-based row swapped with row k. Returns
/// whether some pivot was exactly zero (the matrix is singular).
fn lu(m: &mut [f64], n: usize, piv: &mut [i32]) -> bool {
    let mut singular = false;
    for k in 0..n {
        let mut p = k;
        for i in k + 1..n {
            if m[i * n + k].abs() > m[p * n + k].abs() {
                p = i;
            }
        }
        piv[k] = (p + 1) as i32;
        let pivot = m[p * n + k];
        if pivot != 0.0 {
            if p != k {
                for c in 0..n {
                    m.swap(k * n + c, p * n + c);
                }
            }
            for i in k + 1..n {
                m[i * n + k] /= pivot;
            }
        } else {
            singular = true;
        }
        let (top, below) = m.split_at_mut((k + 1) * n);
        let rk = &top[k * n..];
        for ri in below.chunks_exact_mut(n) {
            let l = ri[k];
            for (v, u) in ri[k + 1..].iter_mut().zip(&rk[k + 1..]) {
                *v -= l * u;
            }
        }
    }
    singular
}

/// The inverse of the matrix whose LU factorization ([`lu`]) is `f`, `piv`.
fn lu_inverse(f: &[f64], piv: &[i32], n: usize) -> Vec<f64> {
    let mut x = identity(n);
    for (k, &p) in piv.iter().enumerate() {
        let p = (p.max(1) as usize - 1).min(n.saturating_sub(1));
        if p != k {
            for c in 0..n {
                x.swap(k * n + c, p * n + c);
            }
        }
    }
    solve_left(f, n, true, true, &mut x, n);
    solve_left(f, n, false, false, &mut x, n);
    x
}

/// (sign, log|det|) from an LU factorization, as stock computes them.
fn lu_sign_logdet(f: &[f64], piv: &[i32], n: usize) -> (f64, f64) {
    let mut changes = 0;
    let (mut sign, mut logdet) = (1.0, 0.0);
    for j in 0..n {
        changes += usize::from(piv[j] != (j + 1) as i32);
        let d = f[j * n + j];
        sign *= if d > 0.0 {
            1.0
        } else if d < 0.0 {
            -1.0
        } else {
            0.0
        };
        logdet += d.abs().ln();
    }
    (if changes % 2 == 1 { -sign } else { sign }, logdet)
}

/// LQ factorization `a = l·q` of an m×n matrix (m ≤ n) by Householder reflections from the
/// right, with LAPACK's signs (`gelqf`, then `orglq`): (q m×n with orthonormal rows, l m×m
/// lower triangular).
fn lq(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut r = a.to_vec();
    let mut reflectors: Vec<(Vec<f64>, f64)> = Vec::with_capacity(m);
    for i in 0..m {
        let row = &mut r[i * n..(i + 1) * n];
        let alpha = row[i];
        let xnorm = row[i + 1..].iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut v = vec![0.0; n - i];
        v[0] = 1.0;
        let tau = if xnorm == 0.0 {
            0.0
        } else {
            let norm = alpha.hypot(xnorm);
            let beta = if alpha >= 0.0 { -norm } else { norm };
            let scale = 1.0 / (alpha - beta);
            for (d, s) in v[1..].iter_mut().zip(&row[i + 1..]) {
                *d = s * scale;
            }
            row[i] = beta;
            row[i + 1..].fill(0.0);
            (beta - alpha) / beta
        };
        if tau != 0.0 {
            for rq in r[(i + 1) * n..m * n].chunks_exact_mut(n) {
                let w = rq[i..].iter().zip(&v).map(|(x, y)| x * y).sum::<f64>() * tau;
                for (x, y) in rq[i..].iter_mut().zip(&v) {
                    *x -= w * y;
                }
            }
        }
        reflectors.push((v, tau));
    }
    let mut l = vec![0.0; m * m];
    for i in 0..m {
        l[i * m..i * m + i + 1].copy_from_slice(&r[i * n..i * n + i + 1]);
    }
    let mut q = vec![0.0; m * n];
    for i in 0..m {
        q[i * n + i] = 1.0;
    }
    for (i, (v, tau)) in reflectors.iter().enumerate().rev() {
        if *tau == 0.0 {
            continue;
        }
        for rq in q.chunks_exact_mut(n) {
            let w = rq[i..].iter().zip(v).map(|(x, y)| x * y).sum::<f64>() * tau;
            for (x, y) in rq[i..].iter_mut().zip(v) {
                *x -= w * y;
            }
        }
    }
    (q, l)
}

/// Eigendecomposition of the symmetric matrix whose lower triangle `a` (n×n) holds, by cyclic
/// Jacobi rotations: (u with one eigenvector per row, eigenvalues ascending).
fn sym_eig(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut s = lower_of(a, n, true);
    symmetrize_from_lower(&mut s, n);
    // v's columns are the eigenvectors.
    let mut v = identity(n);
    let total: f64 = s.iter().map(|x| x * x).sum();
    for _sweep in 0..100 {
        let off: f64 = (0..n).flat_map(|p| (p + 1..n).map(move |q| (p, q))).map(|(p, q)| s[p * n + q].powi(2)).sum();
        if off == 0.0 || off <= total * 1e-36 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = s[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (s[q * n + q] - s[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let sn = t * c;
                // S ← Jᵀ S J with J the rotation in the (p, q) plane.
                for k in 0..n {
                    let (skp, skq) = (s[k * n + p], s[k * n + q]);
                    s[k * n + p] = c * skp - sn * skq;
                    s[k * n + q] = sn * skp + c * skq;
                }
                for k in 0..n {
                    let (spk, sqk) = (s[p * n + k], s[q * n + k]);
                    s[p * n + k] = c * spk - sn * sqk;
                    s[q * n + k] = sn * spk + c * sqk;
                }
                s[p * n + q] = 0.0;
                s[q * n + p] = 0.0;
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - sn * vkq;
                    v[k * n + q] = sn * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| s[i * n + i].total_cmp(&s[j * n + j]));
    let mut u = vec![0.0; n * n];
    let mut lambda = vec![0.0; n];
    for (row, &k) in order.iter().enumerate() {
        lambda[row] = s[k * n + k];
        for c in 0..n {
            u[row * n + c] = v[c * n + k];
        }
    }
    (u, lambda)
}

/// Flips each row of `u` (n×n) so that its entry of largest magnitude (the first on ties) is
/// positive: stock's deterministic eigenvector signs, applied in the output's precision.
fn eigvec_signs<T: Elem>(u: &mut [T], n: usize) {
    for row in u.chunks_exact_mut(n.max(1)) {
        let mut at = 0;
        for (j, v) in row.iter().enumerate() {
            if v.to_f64().abs() > row[at].to_f64().abs() {
                at = j;
            }
        }
        if row.get(at).is_some_and(|v| v.to_f64() < 0.0) {
            for v in row.iter_mut() {
                *v = T::from_f64(-v.to_f64());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running a kernel over a batch

fn load<T: Elem>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// An output's elements and its per-matrix size; nothing for an output not to be written.
fn slot<T: Elem>(o: &mut OutBlob, req: Req, per: usize) -> (&mut [T], usize) {
    if req == Req::Null {
        (&mut [], 0)
    } else {
        (o.as_mut::<T>(), per)
    }
}

/// Runs `f` on matrix `b` of every input (`(elements, per-matrix size)`, converted to float64)
/// for each `b < batch` on the kernel pool, and stores what it returns into the outputs'
/// matrices `b`. `f` returns `None` for a matrix it cannot factorize; the first such matrix
/// is returned.
fn each<T: Elem>(
    batch: usize,
    ins: &[(&[T], usize)],
    outs: Vec<(&mut [T], usize)>,
    cost_per_matrix: f64,
    f: impl Fn(&[Vec<f64>]) -> Option<Vec<Vec<f64>>> + Sync + Send,
) -> Option<usize> {
    let mut split: Vec<std::vec::IntoIter<&mut [T]>> =
        outs.into_iter().map(|(o, len)| parts(o, len, batch).into_iter()).collect();
    let items: Vec<Vec<&mut [T]>> =
        (0..batch).map(|_| split.iter_mut().map(|s| s.next().unwrap_or_default()).collect()).collect();
    let failed = AtomicUsize::new(usize::MAX);
    par_items(items, cost_per_matrix * batch as f64, T::DTYPE, |b, mut os| {
        let xs: Vec<Vec<f64>> = ins.iter().map(|&(x, len)| load(&x[b * len..(b + 1) * len])).collect();
        match f(&xs) {
            Some(ys) => {
                for (o, y) in os.iter_mut().zip(ys) {
                    for (d, v) in o.iter_mut().zip(y) {
                        *d = T::from_f64(v);
                    }
                }
            }
            None => {
                failed.fetch_min(b, Ordering::Relaxed);
            }
        }
    });
    let b = failed.into_inner();
    (b != usize::MAX).then_some(b)
}

/// An estimate of one n×n factorization's time in ns, for the pool's split decision.
fn cubic(n: usize) -> f64 {
    let n = n as f64;
    2.0 * n * n * n + 50.0
}

// ---------------------------------------------------------------------------------------------
// gemm, gemm2

/// Where the matrices of a tensor lie when their rows run along `axis` and their columns
/// along the last axis: matrix `b` of `outer·inner` (b = o·inner + i) has element (r, c) at
/// o·rows·inner·cols + r·inner·cols + i·cols + c.
#[derive(Clone, Copy, Debug)]
struct Stack {
    outer: usize,
    rows: usize,
    inner: usize,
    cols: usize,
}

impl Stack {
    fn of(shape: &[usize], axis: usize) -> Self {
        let nd = shape.len();
        Stack {
            outer: shape[..axis].iter().product(),
            rows: shape[axis],
            inner: shape[axis + 1..nd - 1].iter().product(),
            cols: shape[nd - 1],
        }
    }
    fn batch(&self) -> usize {
        self.outer * self.inner
    }
    fn base(&self, b: usize) -> usize {
        (b / self.inner) * self.rows * self.inner * self.cols + (b % self.inner) * self.cols
    }
    fn row_stride(&self) -> usize {
        self.inner * self.cols
    }
}

/// The row axis (non-negative) and the output shape of `op(A)·op(B)` (stock's shape rule).
fn mult_plan(op: &str, a: &[usize], b: &[usize], ta: bool, tb: bool, axis: i64) -> Result<(usize, Vec<usize>)> {
    let nd = a.len();
    if nd < 2 || b.len() != nd {
        return Err(Error::value(format!(
            "operator {op}: A and B must have the same number of dimensions, at least 2, got shapes {a:?} and {b:?}"
        )));
    }
    let ax = if axis < 0 { axis + nd as i64 } else { axis };
    if ax < 0 || ax >= nd as i64 - 1 {
        return Err(Error::value(format!("operator {op}: Invalid row axis ({axis}) for {nd}-D inputs")));
    }
    let ax = ax as usize;
    if (0..nd - 1).any(|i| i != ax && a[i] != b[i]) {
        return Err(Error::value(format!(
            "operator {op}: Shapes of inputs 0, 1 must be the same, except on row/col axis: {a:?} and {b:?}"
        )));
    }
    let ka = if ta { a[ax] } else { a[nd - 1] };
    let kb = if tb { b[nd - 1] } else { b[ax] };
    if ka != kb {
        return Err(Error::value(format!(
            "operator {op}: Incompatible matrix dimensions for multiplication: A {a:?} (transpose_a={ta}) and B {b:?} (transpose_b={tb})"
        )));
    }
    let mut out = a.to_vec();
    out[ax] = if ta { a[nd - 1] } else { a[ax] };
    out[nd - 1] = if tb { b[ax] } else { b[nd - 1] };
    Ok((ax, out))
}

/// `alpha·op(x)·op(y)` for each matrix pair of two stacks, contiguous (batch × m × n).
fn products<T: GemmElem>(x: &[T], xs: Stack, tx: bool, y: &[T], ys: Stack, ty: bool, alpha: f64) -> Vec<T> {
    let (m, k) = if tx { (xs.cols, xs.rows) } else { (xs.rows, xs.cols) };
    let n = if ty { ys.rows } else { ys.cols };
    let batch = xs.batch();
    let mut out = vec![T::zero(); batch * m * n];
    // Strides of op(x) and op(y): (row, column).
    let (xr, xc) = if tx { (1, xs.row_stride()) } else { (xs.row_stride(), 1) };
    let (yr, yc) = if ty { (1, ys.row_stride()) } else { (ys.row_stride(), 1) };
    let flops = 2.0 * (batch * m * n * k) as f64;
    par_tasks_mut(&mut out, m * n, flops * 0.25, T::DTYPE, |b, o| {
        T::mm(
            m,
            n,
            k,
            (&x[xs.base(b)..], xr as isize, xc as isize),
            (&y[ys.base(b)..], yr as isize, yc as isize),
            o,
            false,
        );
        if alpha != 1.0 {
            for v in o.iter_mut() {
                *v = T::from_f64(alpha * v.to_f64());
            }
        }
    });
    out
}

/// Writes contiguous matrices (batch × rows × cols) into a stack's places: `out = f(value,
/// flat index)`.
fn place<T: Elem>(vals: &[T], s: Stack, out: &mut [T], f: impl Fn(T, usize) -> T) {
    if s.inner == 1 {
        for (i, (o, &v)) in out.iter_mut().zip(vals).enumerate() {
            *o = f(v, i);
        }
        return;
    }
    let (rows, cols, rs) = (s.rows, s.cols, s.row_stride());
    for b in 0..s.batch() {
        for r in 0..rows {
            let src = &vals[(b * rows + r) * cols..][..cols];
            let at = s.base(b) + r * rs;
            for (c, &v) in src.iter().enumerate() {
                out[at + c] = f(v, at + c);
            }
        }
    }
}

/// (transpose_a, transpose_b, alpha, beta, axis) of a gemm or gemm2 call.
fn mult_params(a: &Attrs) -> (bool, bool, f64, f64, i64) {
    if a.declares(MAC_PARAMS) {
        let p = MacParams::of(a);
        (p.transpose_a, p.transpose_b, p.alpha, p.beta, p.axis)
    } else {
        let p = MultParams::of(a);
        (p.transpose_a, p.transpose_b, p.alpha, 0.0, p.axis)
    }
}

fn gemm_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    let (ta, tb, _, _, axis) = mult_params(a);
    let (_, out) = mult_plan(a.op, &ins[0].shape, &ins[1].shape, ta, tb, axis)?;
    if ins.len() > 2 && ins[2].shape != out {
        return Err(Error::value(format!(
            "operator {}: C has shape {:?}, expected {out:?} (the shape of op(A)·op(B))",
            a.op, ins[2].shape
        )));
    }
    Ok(vec![Meta::new(out, dt)])
}

fn gemm_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (ta, tb, alpha, beta, axis) = mult_params(a);
    let (ax, oshape) = mult_plan(a.op, &ins[0].shape, &ins[1].shape, ta, tb, axis)?;
    let (sa, sb, so) = (Stack::of(&ins[0].shape, ax), Stack::of(&ins[1].shape, ax), Stack::of(&oshape, ax));
    dispatch_la!(ins[0].dtype, a.op, T => {
        let prod = products(ins[0].as_slice::<T>(), sa, ta, ins[1].as_slice::<T>(), sb, tb, alpha);
        let out = outs[0].as_mut::<T>();
        if ins.len() > 2 {
            let c = ins[2].as_slice::<T>();
            // BLAS ignores C when beta is 0 (a NaN there does not propagate).
            let beta_c = |i: usize| if beta == 0.0 { 0.0 } else { beta * c[i].to_f64() };
            place(&prod, so, out, |v, i| T::from_f64(v.to_f64() + beta_c(i)));
        } else {
            place(&prod, so, out, |v, _| v);
        }
    });
    Ok(())
}

/// `(dOut, A, B[, C]) -> (dA, dB[, dC])`.
fn gemm_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (ta, tb, alpha, beta, axis) = mult_params(a);
    let (ga, gb) = (&ins[1], &ins[2]);
    let (ax, oshape) = mult_plan(a.op, &ga.shape, &gb.shape, ta, tb, axis)?;
    let (sa, sb, so) = (Stack::of(&ga.shape, ax), Stack::of(&gb.shape, ax), Stack::of(&oshape, ax));
    dispatch_la!(ins[0].dtype, a.op, T => {
        let (d, x, y) = (ins[0].as_slice::<T>(), ga.as_slice::<T>(), gb.as_slice::<T>());
        if cx.req[0] != Req::Null {
            let da = if ta { products(y, sb, tb, d, so, true, alpha) } else { products(d, so, false, y, sb, !tb, alpha) };
            place(&da, sa, outs[0].as_mut::<T>(), |v, _| v);
        }
        if cx.req[1] != Req::Null {
            let db = if tb { products(d, so, true, x, sa, ta, alpha) } else { products(x, sa, !ta, d, so, false, alpha) };
            place(&db, sb, outs[1].as_mut::<T>(), |v, _| v);
        }
        if outs.len() > 2 && cx.req[2] != Req::Null {
            for (o, v) in outs[2].as_mut::<T>().iter_mut().zip(d) {
                *o = T::from_f64(beta * v.to_f64());
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// syrk

fn syrk_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    let (_, r, c) = mats(a.op, "A", &ins[0].shape)?;
    let n = if SyrkParams::of(a).transpose { c } else { r };
    Ok(vec![Meta::new(with(lead(&ins[0].shape, 2), &[n, n]), dt)])
}

fn syrk_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = SyrkParams::of(a);
    mats(a.op, "A", &ins[0].shape)?;
    let sa = Stack::of(&ins[0].shape, ins[0].ndim() - 2);
    let n = if p.transpose { sa.cols } else { sa.rows };
    dispatch_la!(ins[0].dtype, a.op, T => {
        let x = ins[0].as_slice::<T>();
        // transpose: Aᵀ·A, else A·Aᵀ; symmetric from the lower triangle as stock's syrk.
        let mut prod = products(x, sa, p.transpose, x, sa, !p.transpose, p.alpha);
        for m in prod.chunks_exact_mut((n * n).max(1)) {
            for r in 0..n {
                for c in 0..r {
                    m[c * n + r] = m[r * n + c];
                }
            }
        }
        outs[0].as_mut::<T>().copy_from_slice(&prod);
    });
    Ok(())
}

/// `(dB, A) -> dA`: `alpha·(dB + dBᵀ)·A`, or `alpha·A·(dB + dBᵀ)` with `transpose`.
fn syrk_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let p = SyrkParams::of(a);
    mats(a.op, "A", &ins[1].shape)?;
    let sa = Stack::of(&ins[1].shape, ins[1].ndim() - 2);
    let n = if p.transpose { sa.cols } else { sa.rows };
    let sd = Stack { outer: sa.batch(), rows: n, inner: 1, cols: n };
    dispatch_la!(ins[0].dtype, a.op, T => {
        let (d, x) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        let mut s = d.to_vec();
        for (m, dm) in s.chunks_exact_mut((n * n).max(1)).zip(d.chunks_exact((n * n).max(1))) {
            for r in 0..n {
                for c in 0..n {
                    m[r * n + c] = T::from_f64(dm[r * n + c].to_f64() + dm[c * n + r].to_f64());
                }
            }
        }
        let da = if p.transpose {
            products(x, sa, false, &s, sd, false, p.alpha)
        } else {
            products(&s, sd, false, x, sa, false, p.alpha)
        };
        outs[0].as_mut::<T>().copy_from_slice(&da);
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// trmm, trsm

/// (batch, n of A, rows and cols of B) of a trmm/trsm call, checked as stock's shape rule.
fn tri_plan(op: &str, a: &[usize], b: &[usize], rightside: bool) -> Result<(usize, usize, usize, usize)> {
    let (batch, n) = squares(op, "A", a)?;
    let (_, rows, cols) = mats(op, "B", b)?;
    if a.len() != b.len() || lead(a, 2) != lead(b, 2) {
        return Err(Error::value(format!(
            "operator {op}: Shapes of inputs 0, 1 must be the same, except on last two dimensions: {a:?} and {b:?}"
        )));
    }
    if (rightside && cols != n) || (!rightside && rows != n) {
        return Err(Error::value(format!(
            "operator {op}: Incompatible matrix dimensions for multiplication: A {a:?}, B {b:?} (rightside={rightside})"
        )));
    }
    Ok((batch, n, rows, cols))
}

fn tri_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    tri_plan(a.op, &ins[0].shape, &ins[1].shape, TriParams::of(a).rightside)?;
    Ok(vec![Meta::new(ins[1].shape.to_vec(), dt)])
}

/// `alpha·op(T)·b` (or `alpha·b·op(T)` with `rightside`) for the triangle `lower` names of `a`.
fn trmm_one(a: &[f64], n: usize, b: &[f64], rows: usize, cols: usize, p: &TriParams, transpose: bool) -> Vec<f64> {
    let mut t = a.to_vec();
    keep_triangle(&mut t, n, p.lower);
    let mut out = if p.rightside {
        mm(b, rows, cols, false, &t, n, n, transpose)
    } else {
        mm(&t, n, n, transpose, b, rows, cols, false)
    };
    for v in out.iter_mut() {
        *v *= p.alpha;
    }
    out
}

/// Solves `op(T)·x = alpha·b` (or `x·op(T) = alpha·b` with `rightside`) for the triangle
/// `lower` names of `a`.
fn trsm_one(a: &[f64], n: usize, b: &[f64], rows: usize, p: &TriParams, transpose: bool) -> Vec<f64> {
    let mut t = a.to_vec();
    keep_triangle(&mut t, n, p.lower);
    let mut lower = p.lower;
    if transpose {
        t = transposed(&t, n, n);
        lower = !lower;
    }
    let mut x: Vec<f64> = b.iter().map(|v| v * p.alpha).collect();
    if p.rightside {
        solve_right(&t, n, lower, &mut x, rows);
    } else {
        let k = b.len().checked_div(n).unwrap_or(0);
        solve_left(&t, n, lower, false, &mut x, k);
    }
    x
}

fn trmm_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = TriParams::of(a);
    let (batch, n, rows, cols) = tri_plan(a.op, &ins[0].shape, &ins[1].shape, p.rightside)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let ins = [(ins[0].as_slice::<T>(), n * n), (ins[1].as_slice::<T>(), rows * cols)];
        each(batch, &ins, vec![(outs[0].as_mut::<T>(), rows * cols)], cubic(n) + (n * rows * cols) as f64, |x| {
            Some(vec![trmm_one(&x[0], n, &x[1], rows, cols, &p, p.transpose)])
        });
    });
    Ok(())
}

fn trsm_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = TriParams::of(a);
    let (batch, n, rows, cols) = tri_plan(a.op, &ins[0].shape, &ins[1].shape, p.rightside)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let ins = [(ins[0].as_slice::<T>(), n * n), (ins[1].as_slice::<T>(), rows * cols)];
        each(batch, &ins, vec![(outs[0].as_mut::<T>(), rows * cols)], cubic(n) + (n * rows * cols) as f64, |x| {
            Some(vec![trsm_one(&x[0], n, &x[1], rows, &p, p.transpose)])
        });
    });
    Ok(())
}

/// The gradient of the triangular factor in `C = alpha·op(A)·B` (or `B·op(A)`) from `dC` and
/// `B`, as stock's `trmm_backward` (and, with `scale = -1/alpha`, `dB` for `B` and `C` for `dC`,
/// `trsm_backward`): the named triangle only.
fn tri_factor_grad(x: &[f64], y: &[f64], rows: usize, cols: usize, n: usize, p: &TriParams, scale: f64) -> Vec<f64> {
    let t = p.transpose;
    let mut da = if p.rightside == t {
        mm(x, rows, cols, t, y, rows, cols, !t)
    } else {
        mm(y, rows, cols, !t, x, rows, cols, t)
    };
    for v in da.iter_mut() {
        *v *= scale;
    }
    keep_triangle(&mut da, n, p.lower);
    da
}

/// `(dC, A, B) -> (dA, dB)`.
fn trmm_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = TriParams::of(a);
    let (batch, n, rows, cols) = tri_plan(a.op, &ins[1].shape, &ins[2].shape, p.rightside)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [(ins[0].as_slice::<T>(), rows * cols), (ins[1].as_slice::<T>(), n * n), (ins[2].as_slice::<T>(), rows * cols)];
        let (o0, o1) = outs.split_at_mut(1);
        let slots = vec![slot::<T>(&mut o0[0], cx.req[0], n * n), slot::<T>(&mut o1[0], cx.req[1], rows * cols)];
        each(batch, &xs, slots, 2.0 * cubic(n) + (4 * n * rows * cols) as f64, |x| {
            let (dc, am, b) = (&x[0], &x[1], &x[2]);
            let da = tri_factor_grad(dc, b, rows, cols, n, &p, p.alpha);
            let db = trmm_one(am, n, dc, rows, cols, &p, !p.transpose);
            Some(vec![da, db])
        });
    });
    Ok(())
}

/// `(dC, A, B, C) -> (dA, dB)`.
fn trsm_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = TriParams::of(a);
    let (batch, n, rows, cols) = tri_plan(a.op, &ins[1].shape, &ins[2].shape, p.rightside)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [(ins[0].as_slice::<T>(), rows * cols), (ins[1].as_slice::<T>(), n * n), (ins[3].as_slice::<T>(), rows * cols)];
        let (o0, o1) = outs.split_at_mut(1);
        let slots = vec![slot::<T>(&mut o0[0], cx.req[0], n * n), slot::<T>(&mut o1[0], cx.req[1], rows * cols)];
        each(batch, &xs, slots, 2.0 * cubic(n) + (4 * n * rows * cols) as f64, |x| {
            let (dc, am, c) = (&x[0], &x[1], &x[2]);
            let db = trsm_one(am, n, dc, rows, &p, !p.transpose);
            let da = tri_factor_grad(&db, c, rows, cols, n, &p, -1.0 / p.alpha);
            Some(vec![da, db])
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// potrf, potri

fn square_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    squares(a.op, "A", &ins[0].shape)?;
    Ok(vec![Meta::new(ins[0].shape.to_vec(), dt)])
}

fn potrf_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let lower = CholParams::of(a).lower;
    let (batch, n) = squares(a.op, "A", &ins[0].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let failed = each(batch, &[(ins[0].as_slice::<T>(), n * n)], vec![(outs[0].as_mut::<T>(), n * n)], cubic(n) / 3.0, |x| {
            let mut l = lower_of(&x[0], n, lower);
            cholesky(&mut l, n).ok()?;
            Some(vec![if lower { l } else { transposed(&l, n, n) }])
        });
        if let Some(b) = failed {
            return Err(Error::value(format!(
                "operator {}: the Cholesky factorization of matrix {b} failed. This may happen when the input matrix is either not symmetric or not positive definite.",
                a.op
            )));
        }
    });
    Ok(())
}

/// The gradient of `A` in `L = potrf(A)` (L lower, `dl` its gradient): stock's
/// `0.5·L⁻ᵀ·copyLTU(Lᵀ·dL)·L⁻¹`, symmetric.
fn potrf_grad(l: &[f64], dl: &[f64], n: usize) -> Vec<f64> {
    let mut s = mm(l, n, n, true, dl, n, n, false);
    symmetrize_from_lower(&mut s, n);
    let lt = transposed(l, n, n);
    solve_left(&lt, n, false, false, &mut s, n);
    solve_right(l, n, true, &mut s, n);
    for v in s.iter_mut() {
        *v *= 0.5;
    }
    s
}

/// `(dB, B) -> dA`.
fn potrf_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let lower = CholParams::of(a).lower;
    let (batch, n) = squares(a.op, "B", &ins[1].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [(ins[0].as_slice::<T>(), n * n), (ins[1].as_slice::<T>(), n * n)];
        each(batch, &xs, vec![(outs[0].as_mut::<T>(), n * n)], 3.0 * cubic(n), |x| {
            let (db, b) = (&x[0], &x[1]);
            let g = if lower { potrf_grad(b, db, n) } else { transposed(&potrf_grad(&transposed(b, n, n), &transposed(db, n, n), n), n, n) };
            Some(vec![g])
        });
    });
    Ok(())
}

/// `(L·Lᵀ)⁻¹` for lower-triangular `l`; `None` when a diagonal entry is zero.
fn potri_one(l: &[f64], n: usize) -> Option<Vec<f64>> {
    if (0..n).any(|i| l[i * n + i] == 0.0) {
        return None;
    }
    let mut inv = identity(n);
    solve_left(l, n, true, false, &mut inv, n);
    let mut out = mm(&inv, n, n, true, &inv, n, n, false);
    symmetrize_from_lower(&mut out, n);
    Some(out)
}

fn potri_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let lower = CholParams::of(a).lower;
    let (batch, n) = squares(a.op, "A", &ins[0].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let failed = each(batch, &[(ins[0].as_slice::<T>(), n * n)], vec![(outs[0].as_mut::<T>(), n * n)], cubic(n), |x| {
            Some(vec![potri_one(&lower_of(&x[0], n, lower), n)?])
        });
        if let Some(b) = failed {
            return Err(Error::value(format!(
                "operator {}: matrix {b} has a zero on its diagonal. This may happen when the input matrix is not a Cholesky factorization obtained by a prior call of the potrf-operator.",
                a.op
            )));
        }
    });
    Ok(())
}

/// The gradient of lower-triangular `L` in `A = (L·Lᵀ)⁻¹`: `-tril(A·(dA + dAᵀ)·L⁻ᵀ)`.
fn potri_grad(l: &[f64], out: &[f64], dout: &[f64], n: usize) -> Vec<f64> {
    let s: Vec<f64> = (0..n * n).map(|i| dout[i] + dout[(i % n) * n + i / n]).collect();
    let mut g = mm(out, n, n, false, &s, n, n, false);
    let lt = transposed(l, n, n);
    solve_right(&lt, n, false, &mut g, n);
    for v in g.iter_mut() {
        *v = -*v;
    }
    keep_triangle(&mut g, n, true);
    g
}

/// `(dA, B, A) -> dB`.
fn potri_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let lower = CholParams::of(a).lower;
    let (batch, n) = squares(a.op, "A", &ins[1].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [(ins[0].as_slice::<T>(), n * n), (ins[1].as_slice::<T>(), n * n), (ins[2].as_slice::<T>(), n * n)];
        each(batch, &xs, vec![(outs[0].as_mut::<T>(), n * n)], 3.0 * cubic(n), |x| {
            let g = potri_grad(&lower_of(&x[1], n, lower), &x[2], &x[0], n);
            Some(vec![if lower { g } else { transposed(&g, n, n) }])
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// sumlogdiag, extractdiag, makediag, extracttrian, maketrian

fn sumlogdiag_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    squares(a.op, "A", &ins[0].shape)?;
    let l = lead(&ins[0].shape, 2);
    Ok(vec![Meta::new(if l.is_empty() { vec![1] } else { l.to_vec() }, dt)])
}

fn sumlogdiag_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (_, n) = squares(a.op, "A", &ins[0].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let x = ins[0].as_slice::<T>();
        for (b, o) in outs[0].as_mut::<T>().iter_mut().enumerate() {
            let s: f64 = (0..n).map(|i| x[b * n * n + i * n + i].to_f64().ln()).sum();
            *o = T::from_f64(s);
        }
    });
    Ok(())
}

/// `(dB, A) -> dA`: `dB / A[i, i]` on the diagonal, zero elsewhere.
fn sumlogdiag_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (_, n) = squares(a.op, "A", &ins[1].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let (d, x) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        let o = outs[0].as_mut::<T>();
        o.fill(T::zero());
        for (b, dv) in d.iter().enumerate() {
            for i in 0..n {
                let at = b * n * n + i * n + i;
                o[at] = T::from_f64(dv.to_f64() / x[at].to_f64());
            }
        }
    });
    Ok(())
}

/// Where each entry of the diagonal `offset` of an n×n matrix lies in it.
fn diag_map(n: usize, offset: i64) -> Vec<usize> {
    let k = offset.unsigned_abs() as usize;
    let (r0, c0) = if offset < 0 { (k, 0) } else { (0, k) };
    (0..n.saturating_sub(k)).map(|d| (r0 + d) * n + c0 + d).collect()
}

/// Where each entry of the packed triangle (stock's order) lies in an n×n matrix: the lower
/// triangle below the diagonal `offset` (< 0, or 0 with `lower`) row by row, else the upper
/// triangle above it column by column.
fn trian_map(n: usize, offset: i64, lower: bool) -> Vec<usize> {
    let k = offset.unsigned_abs() as usize;
    let m = n.saturating_sub(k);
    let upper = offset > 0 || (offset == 0 && !lower);
    let mut map = vec![0; m * (m + 1) / 2];
    for r in 0..m {
        for c in 0..=r {
            // Row r of the packed lower triangle is matrix row r + k (or, upper: column r + k).
            let (row, col) = if upper { (c, r + k) } else { (r + k, c) };
            map[r * (r + 1) / 2 + c] = row * n + col;
        }
    }
    map
}

/// The triangle's size m from its packed length (stock's rounding), if it is one.
fn trian_side(len: usize) -> Option<usize> {
    let m = (0.5 + (((8 * len + 1) as f64).sqrt() - 1.0) * 0.5).floor() as usize;
    (m * (m + 1) / 2 == len).then_some(m)
}

/// Which of the four copies an operator is: (diagonal rather than triangle, extract rather
/// than make).
fn copy_kind(op: &str) -> (bool, bool) {
    let name = op.trim_start_matches("_backward").trim_start_matches("_linalg_");
    (name.ends_with("diag"), name.starts_with("extract"))
}

fn copy_offset_lower(a: &Attrs) -> (i64, bool) {
    if a.declares(DIAG_PARAMS) {
        (DiagParams::of(a).offset, true)
    } else {
        let p = TrianParams::of(a);
        (p.offset, p.lower)
    }
}

/// (n of the square matrices, packed length, output shape) of a copy whose input has shape `s`.
fn copy_shapes(a: &Attrs, diag: bool, extract: bool, s: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
    let op = a.op;
    let (offset, _) = copy_offset_lower(a);
    let k = offset.unsigned_abs() as usize;
    if extract {
        let (_, n) = squares(op, "A", s)?;
        if n <= k {
            return Err(Error::value(format!(
                "operator {op}: Illegal offset {offset} for diag/trian extraction of matrix with dimension {n}"
            )));
        }
        let m = n - k;
        let len = if diag { m } else { m * (m + 1) / 2 };
        Ok((n, len, with(lead(s, 2), &[len])))
    } else {
        let Some(&len) = s.last() else {
            return Err(Error::value(format!("operator {op}: A must have at least one dimension")));
        };
        let m = if diag {
            len
        } else {
            trian_side(len).ok_or_else(|| {
                Error::value(format!(
                    "operator {op}: Input tensor of maketrian has an invalid dimension for the last axis ({len} is not a triangular number)"
                ))
            })?
        };
        let n = m + k;
        Ok((n, len, with(lead(s, 1), &[n, n])))
    }
}

fn copy_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    let (diag, extract) = copy_kind(a.op);
    let (_, _, out) = copy_shapes(a, diag, extract, &ins[0].shape)?;
    Ok(vec![Meta::new(out, dt)])
}

/// Extracts (`extract`) or places the packed entries of `x` into `out`.
fn copy_run(a: &Attrs, diag: bool, extract: bool, x: &TBlob, out: &mut OutBlob) -> Result<()> {
    let (offset, lower) = copy_offset_lower(a);
    let (n, len, _) = copy_shapes(a, diag, extract, &x.shape)?;
    let map = if diag { diag_map(n, offset) } else { trian_map(n, offset, lower) };
    debug_assert_eq!(map.len(), len);
    dispatch_la!(x.dtype, a.op, T => {
        let (xs, o) = (x.as_slice::<T>(), out.as_mut::<T>());
        let nn = n * n;
        if extract {
            for (ob, xb) in o.chunks_exact_mut(len.max(1)).zip(xs.chunks_exact(nn.max(1))) {
                for (v, &at) in ob.iter_mut().zip(&map) {
                    *v = xb[at];
                }
            }
        } else {
            o.fill(T::zero());
            for (ob, xb) in o.chunks_exact_mut(nn.max(1)).zip(xs.chunks_exact(len.max(1))) {
                for (v, &at) in xb.iter().zip(&map) {
                    ob[at] = *v;
                }
            }
        }
    });
    Ok(())
}

fn copy_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let (diag, extract) = copy_kind(cx.attrs.op);
    copy_run(cx.attrs, diag, extract, &ins[0], &mut outs[0])
}

/// `dOut -> dA`: the opposite copy of the output gradient.
fn copy_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let (diag, extract) = copy_kind(cx.attrs.op);
    // The backward of an extraction places, and of a placement extracts; shapes as the
    // forward's, seen from the other side.
    if extract {
        let (n, len, _) = copy_shapes(cx.attrs, diag, true, &outs[0].shape)?;
        let (offset, lower) = copy_offset_lower(cx.attrs);
        let map = if diag { diag_map(n, offset) } else { trian_map(n, offset, lower) };
        dispatch_la!(ins[0].dtype, cx.attrs.op, T => {
            let (g, o) = (ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
            o.fill(T::zero());
            for (ob, gb) in o.chunks_exact_mut((n * n).max(1)).zip(g.chunks_exact(len.max(1))) {
                for (v, &at) in gb.iter().zip(&map) {
                    ob[at] = *v;
                }
            }
        });
        Ok(())
    } else {
        let (n, len, _) = copy_shapes(cx.attrs, diag, false, &outs[0].shape)?;
        let (offset, lower) = copy_offset_lower(cx.attrs);
        let map = if diag { diag_map(n, offset) } else { trian_map(n, offset, lower) };
        dispatch_la!(ins[0].dtype, cx.attrs.op, T => {
            let (g, o) = (ins[0].as_slice::<T>(), outs[0].as_mut::<T>());
            for (ob, gb) in o.chunks_exact_mut(len.max(1)).zip(g.chunks_exact((n * n).max(1))) {
                for (v, &at) in ob.iter_mut().zip(&map) {
                    *v = gb[at];
                }
            }
        });
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// gelqf, syevd

fn gelqf_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    let (_, m, n) = mats(a.op, "A", &ins[0].shape)?;
    if m > n {
        return Err(Error::value(format!(
            "operator {}: Input A shape wrong: Last dimension must be >= than second to last, got {:?}",
            a.op, ins[0].shape
        )));
    }
    Ok(vec![Meta::new(ins[0].shape.to_vec(), dt), Meta::new(with(lead(&ins[0].shape, 1), &[m]), dt)])
}

fn gelqf_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (batch, m, n) = mats(a.op, "A", &ins[0].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let (q, l) = outs.split_at_mut(1);
        let slots = vec![(q[0].as_mut::<T>(), m * n), (l[0].as_mut::<T>(), m * m)];
        each(batch, &[(ins[0].as_slice::<T>(), m * n)], slots, 4.0 * (m * m * n) as f64 + 50.0, |x| {
            let (q, l) = lq(&x[0], m, n);
            Some(vec![q, l])
        });
    });
    Ok(())
}

/// The gradient of `A` in `(Q, L) = gelqf(A)`: `L⁻ᵀ·(dQ + copyLTU(M)·Q)`, `M = Lᵀ·dL - dQ·Qᵀ`.
fn gelqf_grad(dq: &[f64], dl: &[f64], q: &[f64], l: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut mt = mm(l, m, m, true, dl, m, m, false);
    let dqq = mm(dq, m, n, false, q, m, n, true);
    for (v, w) in mt.iter_mut().zip(&dqq) {
        *v -= w;
    }
    symmetrize_from_lower(&mut mt, m);
    let mut da = mm(&mt, m, m, false, q, m, n, false);
    for (v, w) in da.iter_mut().zip(dq) {
        *v += w;
    }
    let lt = transposed(l, m, m);
    solve_left(&lt, m, false, false, &mut da, n);
    da
}

/// `(dQ, dL, Q, L) -> dA`.
fn gelqf_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (batch, m, n) = mats(a.op, "Q", &ins[2].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [
            (ins[0].as_slice::<T>(), m * n),
            (ins[1].as_slice::<T>(), m * m),
            (ins[2].as_slice::<T>(), m * n),
            (ins[3].as_slice::<T>(), m * m),
        ];
        each(batch, &xs, vec![(outs[0].as_mut::<T>(), m * n)], 8.0 * (m * m * n) as f64 + 50.0, |x| {
            Some(vec![gelqf_grad(&x[0], &x[1], &x[2], &x[3], m, n)])
        });
    });
    Ok(())
}

fn syevd_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    squares(a.op, "A", &ins[0].shape)?;
    Ok(vec![Meta::new(ins[0].shape.to_vec(), dt), Meta::new(lead(&ins[0].shape, 1).to_vec(), dt)])
}

fn syevd_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (batch, n) = squares(a.op, "A", &ins[0].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let (u, l) = outs.split_at_mut(1);
        let slots = vec![(u[0].as_mut::<T>(), n * n), (l[0].as_mut::<T>(), n)];
        each(batch, &[(ins[0].as_slice::<T>(), n * n)], slots, 20.0 * cubic(n), |x| {
            let (u, l) = sym_eig(&x[0], n);
            Some(vec![u, l])
        });
        eigvec_signs(u[0].as_mut::<T>(), n);
    });
    Ok(())
}

/// The gradient of `A` in `(U, λ) = syevd(A)`: `Uᵀ·Y·U` with `X = dU·Uᵀ`, `Y` symmetric,
/// `Y[i, j] = (X[i, j] - X[j, i]) / (2·max(λi - λj, eps))` for i > j and `dλ` on the diagonal.
fn syevd_grad(du: &[f64], dl: &[f64], u: &[f64], l: &[f64], n: usize, eps: f64) -> Vec<f64> {
    let x = mm(du, n, n, false, u, n, n, true);
    let mut y = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..i {
            let denom = 2.0 * (l[i] - l[j]).max(eps);
            let v = (x[i * n + j] - x[j * n + i]) / denom;
            y[i * n + j] = v;
            y[j * n + i] = v;
        }
        y[i * n + i] = dl[i];
    }
    let t = mm(u, n, n, true, &y, n, n, false);
    mm(&t, n, n, false, u, n, n, false)
}

/// `(dU, dλ, U, λ) -> dA`.
fn syevd_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (batch, n) = squares(a.op, "U", &ins[2].shape)?;
    // Stock's floor on eigenvalue gaps, by dtype.
    let eps = if ins[0].dtype == DType::F32 { 1e-30 } else { 1e-100 };
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [
            (ins[0].as_slice::<T>(), n * n),
            (ins[1].as_slice::<T>(), n),
            (ins[2].as_slice::<T>(), n * n),
            (ins[3].as_slice::<T>(), n),
        ];
        each(batch, &xs, vec![(outs[0].as_mut::<T>(), n * n)], 3.0 * cubic(n), |x| {
            Some(vec![syevd_grad(&x[0], &x[1], &x[2], &x[3], n, eps)])
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// inverse, det, slogdet

fn inverse_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (batch, n) = squares(a.op, "A", &ins[0].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let failed = each(batch, &[(ins[0].as_slice::<T>(), n * n)], vec![(outs[0].as_mut::<T>(), n * n)], cubic(n), |x| {
            // Factorized as stock's column-major getrf sees the data: Aᵀ; inv(A) = inv(Aᵀ)ᵀ.
            let mut f = transposed(&x[0], n, n);
            let mut piv = vec![0; n];
            if lu(&mut f, n, &mut piv) {
                return None;
            }
            Some(vec![transposed(&lu_inverse(&f, &piv, n), n, n)])
        });
        if let Some(b) = failed {
            return Err(Error::value(format!("operator {}: matrix {b} is singular (the input matrix is non-convertible)", a.op)));
        }
    });
    Ok(())
}

/// `(dB, B) -> dA` for `B = A⁻¹`: `-Bᵀ·dB·Bᵀ`.
fn inverse_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let (batch, n) = squares(a.op, "A", &ins[1].shape)?;
    dispatch_la!(ins[0].dtype, a.op, T => {
        let xs = [(ins[0].as_slice::<T>(), n * n), (ins[1].as_slice::<T>(), n * n)];
        each(batch, &xs, vec![(outs[0].as_mut::<T>(), n * n)], 2.0 * cubic(n), |x| {
            let t = mm(&x[0], n, n, false, &x[1], n, n, true);
            let mut g = mm(&x[1], n, n, true, &t, n, n, false);
            for v in g.iter_mut() {
                *v = -*v;
            }
            Some(vec![g])
        });
    });
    Ok(())
}

/// Visible outputs of det (1: det) and slogdet (2: sign, logabsdet); both add the LU and
/// pivots of Aᵀ, hidden.
fn det_visible(a: &Attrs) -> usize {
    if a.op.contains("slogdet") {
        2
    } else {
        1
    }
}

fn det_total(a: &Attrs) -> usize {
    det_visible(a) + 2
}

fn det_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let dt = real_dtype(a.op, ins)?;
    let s = &ins[0].shape;
    squares(a.op, "A", s)?;
    let l = lead(s, 2);
    let value = Meta::new(if l.is_empty() { vec![1] } else { l.to_vec() }, dt);
    let mut outs = vec![value; det_visible(a)];
    outs.push(Meta::new(s.to_vec(), dt));
    outs.push(Meta::new(lead(s, 1).to_vec(), DType::I32));
    Ok(outs)
}

/// One matrix's det/slogdet outputs: (values, LU, pivots).
type DetItem<'a, T> = (Vec<&'a mut [T]>, &'a mut [T], &'a mut [i32]);

fn det_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let (batch, n) = squares(a.op, "A", &ins[0].shape)?;
    let nv = det_visible(a);
    dispatch_la!(ins[0].dtype, a.op, T => {
        let x = ins[0].as_slice::<T>();
        let (vals, hidden) = outs.split_at_mut(nv);
        let (lu_out, piv_out) = hidden.split_at_mut(1);
        let mut vparts: Vec<std::vec::IntoIter<&mut [T]>> = vals.iter_mut().map(|o| parts(o.as_mut::<T>(), 1, batch).into_iter()).collect();
        let lus = parts(lu_out[0].as_mut::<T>(), n * n, batch);
        let pivs = parts(piv_out[0].as_mut::<i32>(), n, batch);
        let items: Vec<DetItem<T>> = lus
            .into_iter()
            .zip(pivs)
            .map(|(l, p)| (vparts.iter_mut().map(|v| v.next().unwrap_or_default()).collect(), l, p))
            .collect();
        par_items(items, cubic(n) * batch as f64, T::DTYPE, |b, (mut vs, lu_b, piv_b)| {
            let mut f = transposed(&load(&x[b * n * n..(b + 1) * n * n]), n, n);
            lu(&mut f, n, piv_b);
            let (sign, logdet) = lu_sign_logdet(&f, piv_b, n);
            let values = if nv == 1 { vec![sign * logdet.exp()] } else { vec![sign, logdet] };
            for (o, v) in vs.iter_mut().zip(values) {
                if let Some(o) = o.first_mut() {
                    *o = T::from_f64(v);
                }
            }
            for (d, v) in lu_b.iter_mut().zip(&f) {
                *d = T::from_f64(*v);
            }
        });
    });
    Ok(())
}

/// det: `(dDet, det, LU, pivots) -> dA = dDet·det·A⁻ᵀ`; slogdet: `(dSign, dLogAbsDet, sign,
/// logabsdet, LU, pivots) -> dA = dLogAbsDet·A⁻ᵀ` (the sign has no gradient). A singular
/// matrix (det 0) gets a zero gradient, as in stock.
fn det_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Null {
        return Ok(());
    }
    let a = cx.attrs;
    let slog = a.op.contains("slogdet");
    let (g, value, lu_in, piv_in) =
        if slog { (&ins[1], &ins[3], &ins[4], &ins[5]) } else { (&ins[0], &ins[1], &ins[2], &ins[3]) };
    let (batch, n) = squares(a.op, "LU", &lu_in.shape)?;
    dispatch_la!(g.dtype, a.op, T => {
        let (gs, vs, lus, pivs) = (g.as_slice::<T>(), value.as_slice::<T>(), lu_in.as_slice::<T>(), piv_in.as_slice::<i32>());
        par_tasks_mut(outs[0].as_mut::<T>(), (n * n).max(1), cubic(n) * batch as f64, T::DTYPE, |b, o| {
            let v = vs[b].to_f64();
            let singular = if slog { v == f64::NEG_INFINITY } else { v == 0.0 };
            if singular {
                o.fill(T::zero());
                return;
            }
            let scale = if slog { gs[b].to_f64() } else { gs[b].to_f64() * v };
            // inv(Aᵀ) = A⁻ᵀ from the LU of Aᵀ.
            let inv = lu_inverse(&load(&lus[b * n * n..(b + 1) * n * n]), &pivs[b * n..(b + 1) * n], n);
            for (d, w) in o.iter_mut().zip(inv) {
                *d = T::from_f64(scale * w);
            }
        });
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Registration

fn one_output(_: &Attrs) -> usize {
    1
}

fn two_outputs(_: &Attrs) -> usize {
    2
}

type Kernel = fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>;
type Count = fn(&Attrs) -> usize;

/// One operator of this file, its gradient and its backward operator.
struct Decl {
    name: &'static str,
    /// Stock's alias (all but `_linalg_syevd` have `linalg_*`).
    alias: Option<&'static str>,
    inputs: &'static [&'static str],
    params: &'static [ParamSpec],
    infer: fn(&Attrs, &[Meta]) -> Result<Vec<Meta>>,
    forward: Kernel,
    /// (total, visible)
    outputs: (Count, Count),
    /// The backward operator: name, whether it reads the forward inputs, the forward
    /// outputs, and its kernel.
    backward: (&'static str, bool, bool, Kernel),
    doc: &'static str,
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    let one: (Count, Count) = (one_output, one_output);
    let decls = [
        Decl {
            name: "_linalg_gemm",
            alias: Some("linalg_gemm"),
            inputs: &["A", "B", "C"],
            params: MAC_PARAMS,
            infer: gemm_infer,
            forward: gemm_forward,
            outputs: one,
            backward: ("_backward_linalg_gemm", true, false, gemm_backward),
            doc: "Performs general matrix multiplication and accumulation: out = alpha * op(A) * op(B) + beta * C, batched over the leading dimensions; the matrix rows lie on `axis`, the columns on the last axis.",
        },
        Decl {
            name: "_linalg_gemm2",
            alias: Some("linalg_gemm2"),
            inputs: &["A", "B"],
            params: MULT_PARAMS,
            infer: gemm_infer,
            forward: gemm_forward,
            outputs: one,
            backward: ("_backward_linalg_gemm2", true, false, gemm_backward),
            doc: "Performs general matrix multiplication: out = alpha * op(A) * op(B), batched over the leading dimensions; the matrix rows lie on `axis`, the columns on the last axis.",
        },
        Decl {
            name: "_linalg_potrf",
            alias: Some("linalg_potrf"),
            inputs: &["A"],
            params: CHOL_PARAMS,
            infer: square_infer,
            forward: potrf_forward,
            outputs: one,
            backward: ("_backward_linalg_potrf", false, true, potrf_backward),
            doc: "Performs Cholesky factorization of a symmetric positive-definite matrix: A = B * B^T (lower) or B^T * B (upper).",
        },
        Decl {
            name: "_linalg_potri",
            alias: Some("linalg_potri"),
            inputs: &["A"],
            params: CHOL_PARAMS,
            infer: square_infer,
            forward: potri_forward,
            outputs: one,
            backward: ("_backward_linalg_potri", true, true, potri_backward),
            doc: "Performs matrix inversion from a Cholesky factorization: out = A^-T * A^-1 (lower) or A^-1 * A^-T (upper).",
        },
        Decl {
            name: "_linalg_trmm",
            alias: Some("linalg_trmm"),
            inputs: &["A", "B"],
            params: TRI_PARAMS,
            infer: tri_infer,
            forward: trmm_forward,
            outputs: one,
            backward: ("_backward_linalg_trmm", true, false, trmm_backward),
            doc: "Performs multiplication with a lower triangular matrix: out = alpha * op(A) * B, or alpha * B * op(A) with rightside.",
        },
        Decl {
            name: "_linalg_trsm",
            alias: Some("linalg_trsm"),
            inputs: &["A", "B"],
            params: TRI_PARAMS,
            infer: tri_infer,
            forward: trsm_forward,
            outputs: one,
            backward: ("_backward_linalg_trsm", true, true, trsm_backward),
            doc: "Solves matrix equation involving a lower triangular matrix: op(A) * out = alpha * B, or out * op(A) = alpha * B with rightside.",
        },
        Decl {
            name: "_linalg_sumlogdiag",
            alias: Some("linalg_sumlogdiag"),
            inputs: &["A"],
            params: NO_PARAMS,
            infer: sumlogdiag_infer,
            forward: sumlogdiag_forward,
            outputs: one,
            backward: ("_backward_linalg_sumlogdiag", true, false, sumlogdiag_backward),
            doc: "Computes the sum of the logarithms of the diagonal elements of a square matrix.",
        },
        Decl {
            name: "_linalg_extractdiag",
            alias: Some("linalg_extractdiag"),
            inputs: &["A"],
            params: DIAG_PARAMS,
            infer: copy_infer,
            forward: copy_forward,
            outputs: one,
            backward: ("_backward_linalg_extractdiag", false, false, copy_backward),
            doc: "Extracts the diagonal entries of a square matrix.",
        },
        Decl {
            name: "_linalg_makediag",
            alias: Some("linalg_makediag"),
            inputs: &["A"],
            params: DIAG_PARAMS,
            infer: copy_infer,
            forward: copy_forward,
            outputs: one,
            backward: ("_backward_linalg_makediag", false, false, copy_backward),
            doc: "Constructs a square matrix with the input as diagonal.",
        },
        Decl {
            name: "_linalg_extracttrian",
            alias: Some("linalg_extracttrian"),
            inputs: &["A"],
            params: TRIAN_PARAMS,
            infer: copy_infer,
            forward: copy_forward,
            outputs: one,
            backward: ("_backward_linalg_extracttrian", false, false, copy_backward),
            doc: "Extracts a triangular sub-matrix from a square matrix.",
        },
        Decl {
            name: "_linalg_maketrian",
            alias: Some("linalg_maketrian"),
            inputs: &["A"],
            params: TRIAN_PARAMS,
            infer: copy_infer,
            forward: copy_forward,
            outputs: one,
            backward: ("_backward_linalg_maketrian", false, false, copy_backward),
            doc: "Constructs a square matrix with the input representing a specific triangular sub-matrix.",
        },
        Decl {
            name: "_linalg_syrk",
            alias: Some("linalg_syrk"),
            inputs: &["A"],
            params: SYRK_PARAMS,
            infer: syrk_infer,
            forward: syrk_forward,
            outputs: one,
            backward: ("_backward_linalg_syrk", true, false, syrk_backward),
            doc: "Multiplication of matrix with its transpose: out = alpha * A * A^T, or alpha * A^T * A with transpose.",
        },
        Decl {
            name: "_linalg_gelqf",
            alias: Some("linalg_gelqf"),
            inputs: &["A"],
            params: NO_PARAMS,
            infer: gelqf_infer,
            forward: gelqf_forward,
            outputs: (two_outputs, two_outputs),
            backward: ("_backward_linalg_gelqf", false, true, gelqf_backward),
            doc: "LQ factorization for general matrix: A = L * Q with L lower triangular and Q row-orthonormal; outputs Q, L.",
        },
        Decl {
            name: "_linalg_syevd",
            alias: None,
            inputs: &["A"],
            params: NO_PARAMS,
            infer: syevd_infer,
            forward: syevd_forward,
            outputs: (two_outputs, two_outputs),
            backward: ("_backward_linalg_syevd", false, true, syevd_backward),
            doc: "Eigendecomposition for symmetric matrix: U * A = diag(L) * U with orthonormal U and ascending L; outputs U, L.",
        },
        Decl {
            name: "_linalg_inverse",
            alias: Some("linalg_inverse"),
            inputs: &["A"],
            params: NO_PARAMS,
            infer: square_infer,
            forward: inverse_forward,
            outputs: one,
            backward: ("_backward_linalg_inverse", false, true, inverse_backward),
            doc: "Compute the inverse of a matrix.",
        },
        Decl {
            name: "_linalg_det",
            alias: Some("linalg_det"),
            inputs: &["A"],
            params: NO_PARAMS,
            infer: det_infer,
            forward: det_forward,
            outputs: (det_total, det_visible),
            backward: ("_backward_linalg_det", false, true, det_backward),
            doc: "Compute the determinant of a matrix.",
        },
        Decl {
            name: "_linalg_slogdet",
            alias: Some("linalg_slogdet"),
            inputs: &["A"],
            params: NO_PARAMS,
            infer: det_infer,
            forward: det_forward,
            outputs: (det_total, det_visible),
            backward: ("_backward_linalg_slogdet", false, true, det_backward),
            doc: "Compute the sign and log of the determinant of a matrix.",
        },
    ];
    for d in decls {
        let (back, inputs, outputs, backward) = d.backward;
        let mut def = OpDef::new(d.name, Inputs::Fixed(d.inputs), Box::new(d.infer), Box::new(d.forward))
            .params(d.params)
            .outputs(d.outputs.0, d.outputs.1)
            .grad(Grad::Backward { op: back, inputs, outputs })
            .doc(d.doc);
        if let Some(alias) = d.alias {
            def = def.alias(&[alias]);
        }
        ops.push(def);
        ops.push(OpDef::backward(back, d.params, Box::new(backward)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::grad::check::{check, check_tol, values};

    fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol, "entry {i}: {x} vs {y} (all: {a:?} vs {b:?})");
        }
    }

    /// `a·aᵀ + n·I` for a fixed `a`: symmetric positive definite.
    fn spd(n: usize, seed: u64) -> Vec<f64> {
        let a = values(n * n, -1.0, 1.0, seed);
        let mut s = mm(&a, n, n, false, &a, n, n, true);
        for i in 0..n {
            s[i * n + i] += n as f64;
        }
        s
    }

    /// Random n×n matrices with `d` added on the diagonal.
    fn dominant(batch: usize, n: usize, d: f64, seed: u64) -> Vec<f64> {
        let mut x = values(batch * n * n, -1.0, 1.0, seed);
        for b in 0..batch {
            for i in 0..n {
                x[b * n * n + i * n + i] += d;
            }
        }
        x
    }

    #[test]
    fn factorizations_match_stocks_examples() {
        // potrf, potri (la_op.cc's examples).
        let mut a = vec![4.0, 1.0, 1.0, 4.25];
        cholesky(&mut a, 2).unwrap();
        close(&a, &[2.0, 0.0, 0.5, 2.0], 1e-12);
        close(&potri_one(&a, 2).unwrap(), &[0.265625, -0.0625, -0.0625, 0.25], 1e-12);
        assert_eq!(cholesky(&mut [1.0, 2.0, 2.0, 1.0], 2), Err(1));
        assert!(potri_one(&[1.0, 0.0, 3.0, 0.0], 2).is_none());
        // gelqf: LAPACK's signs.
        let (q, l) = lq(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3);
        close(&q, &[-0.26726124, -0.53452248, -0.80178373, 0.87287156, 0.21821789, -0.43643578], 1e-8);
        close(&l, &[-3.74165739, 0.0, -8.55235974, 1.96396101], 1e-8);
        // A row whose trailing part is zero gets no reflection (LAPACK's tau = 0): its diagonal
        // keeps its sign, as does the last row of a square matrix.
        let (q, l) = lq(&[2.0, 0.0, 1.0, -3.0], 2, 2);
        close(&q, &[1.0, 0.0, 0.0, 1.0], 1e-12);
        close(&l, &[2.0, 0.0, 1.0, -3.0], 1e-12);
        // syevd, with stock's eigenvector signs.
        let (u, lambda) = sym_eig(&[1.0, 2.0, 2.0, 4.0], 2);
        let mut u32: Vec<f32> = u.iter().map(|&v| v as f32).collect();
        eigvec_signs(&mut u32, 2);
        let u: Vec<f64> = u32.iter().map(|&v| v as f64).collect();
        close(&u, &[0.89442719, -0.4472136, 0.4472136, 0.89442719], 1e-6);
        close(&lambda, &[0.0, 5.0], 1e-12);
        // det, slogdet, inverse through the LU of Aᵀ.
        let mut f = transposed(&[1.0, 4.0, 2.0, 3.0], 2, 2);
        let mut piv = [0; 2];
        assert!(!lu(&mut f, 2, &mut piv));
        let (sign, logdet) = lu_sign_logdet(&f, &piv, 2);
        assert!((sign * logdet.exp() + 5.0).abs() < 1e-12);
        close(&transposed(&lu_inverse(&f, &piv, 2), 2, 2), &[-0.6, 0.8, 0.4, -0.2], 1e-12);
        let mut f = vec![1.0, 2.0, 2.0, 4.0];
        assert!(lu(&mut f, 2, &mut piv));
        assert_eq!(lu_sign_logdet(&f, &piv, 2).1, f64::NEG_INFINITY);
    }

    #[test]
    fn jacobi_diagonalizes_larger_matrices() {
        let n = 6;
        let a = spd(n, 3);
        let (u, lambda) = sym_eig(&a, n);
        assert!(lambda.windows(2).all(|w| w[0] <= w[1]));
        // U·A = diag(λ)·U and U·Uᵀ = I.
        let ua = mm(&u, n, n, false, &a, n, n, false);
        let lu: Vec<f64> = (0..n * n).map(|i| lambda[i / n] * u[i]).collect();
        close(&ua, &lu, 1e-10);
        close(&mm(&u, n, n, false, &u, n, n, true), &identity(n), 1e-12);
    }

    #[test]
    fn solves_and_products_with_triangles() {
        let n = 4;
        let t = dominant(1, n, 3.0, 5);
        let b = values(n * 3, -1.0, 1.0, 6);
        for (lower, transpose, rightside) in (0..8).map(|k| (k & 1 == 1, k & 2 == 2, k & 4 == 4)) {
            let p = TriParams { transpose, rightside, lower, alpha: 1.5, _attrs: std::marker::PhantomData };
            let (rows, cols) = if rightside { (3, n) } else { (n, 3) };
            let b = &b[..rows * cols];
            let x = trsm_one(&t, n, b, rows, &p, transpose);
            // trmm undoes trsm.
            close(
                &trmm_one(&t, n, &x, rows, cols, &p, transpose),
                &b.iter().map(|v| v * 2.25).collect::<Vec<_>>(),
                1e-12,
            );
        }
    }

    #[test]
    fn diagonal_and_triangle_maps_follow_stocks_order() {
        assert_eq!(diag_map(3, 0), [0, 4, 8]);
        assert_eq!(diag_map(3, 1), [1, 5]);
        assert_eq!(diag_map(3, -2), [6]);
        // [[1, 2], [3, 4]]: lower [1, 3, 4], upper [1, 2, 4], offset 1 [2], offset -1 [3].
        assert_eq!(trian_map(2, 0, true), [0, 2, 3]);
        assert_eq!(trian_map(2, 0, false), [0, 1, 3]);
        assert_eq!(trian_map(2, 1, true), [1]);
        assert_eq!(trian_map(2, -1, true), [2]);
        // maketrian([1, 2, 3], offset=1) puts 1, 2 on row 0 and 3 on row 1, columns 1-2.
        assert_eq!(trian_map(3, 1, true), [1, 2, 5]);
        assert_eq!(trian_map(3, -1, true), [3, 6, 7]);
        assert_eq!((trian_side(6), trian_side(5), trian_side(0)), (Some(3), None, Some(0)));
    }

    #[test]
    fn products_gradients() {
        let v = |n: usize, seed: u64| values(n, -1.0, 1.0, seed);
        check("_linalg_gemm", &[], &[(&[3, 4], v(12, 1)), (&[4, 2], v(8, 2)), (&[3, 2], v(6, 3))], &[]);
        check(
            "_linalg_gemm",
            &[("transpose_a", "True"), ("transpose_b", "True"), ("alpha", "-1.5"), ("beta", "0.5")],
            &[(&[2, 4, 3], v(24, 4)), (&[2, 2, 4], v(16, 5)), (&[2, 3, 2], v(12, 6))],
            &[],
        );
        check("_linalg_gemm2", &[("axis", "1")], &[(&[2, 3, 2, 4], v(48, 7)), (&[2, 4, 2, 3], v(48, 8))], &[]);
        check(
            "_linalg_gemm2",
            &[("axis", "0"), ("transpose_a", "True"), ("alpha", "2")],
            &[(&[3, 2, 2], v(12, 9)), (&[3, 2, 4], v(24, 10))],
            &[],
        );
        check("_linalg_syrk", &[], &[(&[2, 3, 4], v(24, 11))], &[]);
        check("_linalg_syrk", &[("transpose", "True"), ("alpha", "0.5")], &[(&[3, 2], v(6, 12))], &[]);
    }

    #[test]
    fn triangular_gradients() {
        let n = 3;
        for kv in [
            vec![],
            vec![("transpose", "True"), ("alpha", "2")],
            vec![("rightside", "True"), ("lower", "False")],
            vec![("rightside", "True"), ("transpose", "True"), ("lower", "False"), ("alpha", "-0.5")],
        ] {
            let right = kv.contains(&("rightside", "True"));
            let bshape: &[usize] = if right { &[2, 4, n] } else { &[2, n, 4] };
            let ins = [(&[2, n, n][..], dominant(2, n, 3.0, 13)), (bshape, values(2 * 4 * n, -1.0, 1.0, 14))];
            check("_linalg_trmm", &kv, &ins, &[]);
            check_tol("_linalg_trsm", &kv, &ins, &[], 1e-4, 1e-6);
        }
        // potri reads the lower (upper) triangle; its gradient is that triangle's.
        for lower in ["True", "False"] {
            check_tol("_linalg_potri", &[("lower", lower)], &[(&[2, n, n], dominant(2, n, 3.0, 15))], &[], 1e-4, 1e-6);
        }
    }

    #[test]
    fn elementwise_copies_and_reductions_gradients() {
        let v = |n: usize, seed: u64| values(n, -1.0, 1.0, seed);
        check("_linalg_sumlogdiag", &[], &[(&[2, 3, 3], dominant(2, 3, 3.0, 16))], &[]);
        check("_linalg_extractdiag", &[("offset", "-1")], &[(&[2, 3, 3], v(18, 17))], &[]);
        check("_linalg_makediag", &[("offset", "2")], &[(&[2, 3], v(6, 18))], &[]);
        check("_linalg_extracttrian", &[("lower", "False")], &[(&[2, 3, 3], v(18, 19))], &[]);
        check("_linalg_extracttrian", &[("offset", "1")], &[(&[4, 4], v(16, 20))], &[]);
        check("_linalg_maketrian", &[("offset", "-1")], &[(&[2, 6], v(12, 21))], &[]);
    }

    #[test]
    fn factorization_gradients() {
        check_tol("_linalg_inverse", &[], &[(&[2, 3, 3], dominant(2, 3, 2.5, 22))], &[], 1e-4, 1e-6);
        check_tol("_linalg_gelqf", &[], &[(&[2, 2, 4], values(16, -1.0, 1.0, 23))], &[], 1e-4, 1e-6);
        check_tol("_linalg_gelqf", &[], &[(&[3, 3], dominant(1, 3, 2.5, 24))], &[], 1e-4, 1e-6);
    }

    /// Central differences of `f` (which reads the lower triangle of its n×n argument) against
    /// a symmetric gradient `g`: perturbing entry (i, j), i > j, moves the symmetric matrix in
    /// two places, so the difference is `g[i, j] + g[j, i]`; the upper entries are unread.
    fn check_symmetric(n: usize, a: &[f64], g: &[f64], f: impl Fn(&[f64]) -> f64) {
        let eps = 1e-6;
        for i in 0..n {
            for j in 0..n {
                let mut x = a.to_vec();
                x[i * n + j] += eps;
                let up = f(&x);
                x[i * n + j] -= 2.0 * eps;
                let num = (up - f(&x)) / (2.0 * eps);
                let want = match i.cmp(&j) {
                    std::cmp::Ordering::Greater => g[i * n + j] + g[j * n + i],
                    std::cmp::Ordering::Equal => g[i * n + i],
                    std::cmp::Ordering::Less => 0.0,
                };
                assert!((num - want).abs() <= 1e-6 + 1e-5 * num.abs(), "({i}, {j}): numeric {num}, analytic {want}");
            }
        }
    }

    #[test]
    fn potrf_and_syevd_gradients_are_stocks_symmetric_ones() {
        let n = 4;
        let a = spd(n, 25);
        let dl = values(n * n, -1.0, 1.0, 26);
        let chol = |x: &[f64]| {
            let mut l = lower_of(x, n, true);
            cholesky(&mut l, n).unwrap();
            l
        };
        let g = potrf_grad(&chol(&a), &dl, n);
        check_symmetric(n, &a, &g, |x| chol(x).iter().zip(&dl).map(|(p, q)| p * q).sum());
        // syevd: distinct eigenvalues; eigenvector signs fixed as stock fixes them.
        let (du, dlam) = (values(n * n, -1.0, 1.0, 27), values(n, -1.0, 1.0, 28));
        let eig = |x: &[f64]| {
            let (mut u, l) = sym_eig(x, n);
            eigvec_signs(&mut u, n);
            (u, l)
        };
        let (u, l) = eig(&a);
        let g = syevd_grad(&du, &dlam, &u, &l, n, 1e-100);
        check_symmetric(n, &a, &g, |x| {
            let (u, l) = eig(x);
            u.iter().zip(&du).map(|(p, q)| p * q).sum::<f64>() + l.iter().zip(&dlam).map(|(p, q)| p * q).sum::<f64>()
        });
    }

    #[test]
    fn det_and_slogdet_gradients_through_autograd() {
        use crate::ndarray::testing::{array_f32, values as read};
        use crate::op::{invoke, lookup};
        // A = [[a, b], [c, d]]: d det/dA = [[d, -c], [-b, a]]; d log|det|/dA = that / det.
        let x = array_f32(&[2, 2, 2], &[1.0, 4.0, 2.0, 3.0, 1.0, 2.0, 2.0, 4.0]);
        for (op, ograds) in [("_linalg_det", 1), ("_linalg_slogdet", 2)] {
            let def = lookup(op).unwrap();
            let attrs = invoke::parse(def, std::iter::empty(), 1).unwrap();
            let called = invoke::call(def, &[&x], None, attrs.clone()).unwrap();
            assert_eq!((called.outputs.len(), called.visible), (ograds + 2, ograds));
            let heads: Vec<_> = (0..ograds).map(|_| array_f32(&[2], &[2.0, 3.0])).collect();
            let heads: Vec<&_> = heads.iter().collect();
            let outs: Vec<&_> = called.outputs.iter().collect();
            let g = crate::op::grad::backward(def, &attrs, &heads, &[&x], &outs, &[true], &[]).unwrap();
            let g = read(g[0].as_ref().unwrap());
            let head = 2.0;
            let want: Vec<f32> = if op == "_linalg_det" {
                vec![head * 3.0, -head * 2.0, -head * 4.0, head * 1.0]
            } else {
                vec![head * 3.0 / -5.0, -head * 2.0 / -5.0, -head * 4.0 / -5.0, head * 1.0 / -5.0]
            };
            // The second matrix is singular: no gradient, as in stock.
            close(
                &g.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                &want.iter().chain(&[0.0; 4]).map(|&v| v as f64).collect::<Vec<_>>(),
                1e-5,
            );
            let values = read(&called.outputs[0]);
            if op == "_linalg_det" {
                close(&[values[0] as f64, values[1] as f64], &[-5.0, 0.0], 1e-5);
            }
        }
    }

    #[test]
    fn shape_errors_are_value_errors() {
        let m = |s: &[usize]| Meta::new(s.to_vec(), DType::F32);
        let attrs =
            |op: &str, kv: &[(&str, &str)]| crate::op::lookup(op).unwrap().parse_attrs(kv.iter().copied(), 1).unwrap();
        let infer =
            |op: &str, kv: &[(&str, &str)], ins: &[Meta]| (crate::op::lookup(op).unwrap().infer)(&attrs(op, kv), ins);
        assert!(infer("_linalg_gemm2", &[], &[m(&[3, 4]), m(&[3, 4])]).is_err());
        assert!(infer("_linalg_gemm2", &[("axis", "1")], &[m(&[3, 4]), m(&[4, 3])]).is_err());
        assert_eq!(
            infer("_linalg_gemm2", &[("axis", "0")], &[m(&[3, 2, 4]), m(&[4, 2, 5])]).unwrap()[0].shape,
            [3, 2, 5]
        );
        assert!(infer("_linalg_gemm", &[], &[m(&[3, 4]), m(&[4, 2]), m(&[3, 3])]).is_err());
        assert!(infer("_linalg_potrf", &[], &[m(&[2, 3])]).is_err());
        assert!(infer("_linalg_gelqf", &[], &[m(&[3, 2])]).is_err());
        assert!(infer("_linalg_extractdiag", &[("offset", "3")], &[m(&[3, 3])]).is_err());
        assert!(infer("_linalg_maketrian", &[], &[m(&[5])]).is_err());
        assert_eq!(infer("_linalg_maketrian", &[("offset", "-1")], &[m(&[2, 3])]).unwrap()[0].shape, [2, 3, 3]);
        let det = infer("_linalg_slogdet", &[], &[m(&[2, 3, 3])]).unwrap();
        assert_eq!(
            det.iter().map(|o| o.shape.to_vec()).collect::<Vec<_>>(),
            [vec![2], vec![2], vec![2, 3, 3], vec![2, 3]]
        );
        assert_eq!(det[3].dtype, DType::I32);
        assert!(infer("_linalg_det", &[], &[Meta::new(vec![2, 2], DType::F16)]).is_err());
    }
}
