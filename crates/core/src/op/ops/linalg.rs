//! Linear algebra operators: `dot`, `batch_dot`, `FullyConnected`, and the one matrix
//! multiply helper ([`gemm`]) that they and the convolution share.
//!
//! Owns: the row-major GEMM entry point over the `gemm` crate (float32/float64 directly,
//! float16 through float32 buffers; transposes expressed as strides, never copied), its
//! parallelism plan (large products split into one block of columns, or of rows for tall
//! ones, per kernel-pool thread; serial for small ones or inside a parallel task), and the
//! shape rules of the three operators (stock's flattening of N-D `dot` operands,
//! `FullyConnected`'s `flatten`).

use crate::dispatch_float;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{self, par_for_mut, par_tasks_mut, ColumnBlock, Cost};
use crate::op::param::op_params;
use crate::op::tensor::{Elem, OutBlob, SendPtr, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef};
use half::f16;

/// Products below this many flops run on one thread (the pool's fork-join cost dominates).
const PAR_FLOPS: f64 = 4.0e6;

/// An element type the GEMM helper multiplies.
pub(crate) trait GemmElem: Elem {
    /// `c (m×n) = [c +] a·b` for strided operands (strides in elements, row stride first).
    #[allow(clippy::too_many_arguments)]
    fn mm(
        m: usize,
        n: usize,
        k: usize,
        a: (&[Self], isize, isize),
        b: (&[Self], isize, isize),
        c: &mut [Self],
        accumulate: bool,
    );

    /// `dst = a·b` on the calling thread, where `dst` is a block of columns of a larger
    /// row-major matrix (`a`: `dst.rows() × k`, `b`: `k × dst.cols()`, strided as in
    /// [`GemmElem::mm`]).
    fn mm_block(k: usize, a: (&[Self], isize, isize), b: (&[Self], isize, isize), dst: &mut ColumnBlock<Self>);
}

/// How one product is spread over the kernel pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// One call on the calling thread (small products, or already inside a parallel task).
    Serial,
    /// Each of the pool's threads runs the crate serially on its own block of columns.
    Columns(usize),
    /// Each thread runs the crate serially on its own block of rows (tall, narrow products).
    Rows(usize),
    /// The crate's own parallel split (too few rows and columns to give each thread a block).
    Crate(usize),
}

/// Each thread's block is at least this many columns (rows), so its panels stay full.
const MIN_BLOCK: usize = 64;

/// Chooses how to run an m×n×k product. Splitting the output into one block of columns per
/// thread, each running the crate serially, beat the crate's own parallel split on every
/// shape measured on 2 cores (1024³: 230-240 against 186-203 GFLOP/s in alternating runs;
/// 64×800→512: 1.3-1.6×), because the crate's split shares packed panels between threads
/// at the price of synchronisation and leaves a thread idle when a dimension is within a
/// panel or two of a multiple of the thread count. Tall products (m ≥ 4n) split rows instead.
fn plan(m: usize, n: usize, k: usize) -> Plan {
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let threads = kernel::pool_threads();
    if flops < PAR_FLOPS || threads < 2 || kernel::in_kernel_pool() {
        Plan::Serial
    } else if m >= 4 * n && m >= MIN_BLOCK * threads {
        Plan::Rows(threads)
    } else if n >= MIN_BLOCK * threads {
        Plan::Columns(threads)
    } else if m >= MIN_BLOCK * threads {
        Plan::Rows(threads)
    } else {
        Plan::Crate(threads)
    }
}

/// Elements a `rows × cols` operand (both at least 1) spans at row stride `rs` and column
/// stride `cs`: what its slice must hold for the GEMM's reads to stay inside it.
fn extent(rows: usize, cols: usize, rs: isize, cs: isize) -> usize {
    assert!(rs >= 0 && cs >= 0, "gemm: negative strides");
    (rows - 1)
        .checked_mul(rs as usize)
        .and_then(|r| (cols - 1).checked_mul(cs as usize).and_then(|c| r.checked_add(c)))
        .and_then(|x| x.checked_add(1))
        .expect("gemm: an operand's extent overflows")
}

macro_rules! native_gemm {
    ($t:ty) => {
        impl GemmElem for $t {
            fn mm(
                m: usize,
                n: usize,
                k: usize,
                a: (&[$t], isize, isize),
                b: (&[$t], isize, isize),
                c: &mut [$t],
                accumulate: bool,
            ) {
                if m == 0 || n == 0 {
                    return;
                }
                if k == 0 {
                    if !accumulate {
                        c[..m * n].fill(0.0);
                    }
                    return;
                }
                // The extents the blocks below read and write (what makes their pointers valid).
                assert!(
                    c.len() >= m * n && a.0.len() >= extent(m, k, a.1, a.2) && b.0.len() >= extent(k, n, b.1, b.2),
                    "gemm: an operand is shorter than its shape and strides"
                );
                let (ap, bp, cp) =
                    (SendPtr(a.0.as_ptr() as *mut $t), SendPtr(b.0.as_ptr() as *mut $t), SendPtr(c.as_mut_ptr()));
                // Rows r0..r1 and columns c0..c1 of the product.
                let block = move |r0: usize, r1: usize, c0: usize, c1: usize, par: gemm::Parallelism| {
                    let (ap, bp, cp) = (ap, bp, cp);
                    // SAFETY: the operands' strided extents lie within their slices (asserted
                    // above), and `c` is an exclusive m×n row-major buffer (a `&mut`); a block reads rows r0..r1 of `a` (row
                    // stride a.1) and columns c0..c1 of `b` (column stride b.2) and writes
                    // only its own rows and columns of `c`, disjoint from every other block.
                    unsafe {
                        gemm::gemm(
                            r1 - r0,
                            c1 - c0,
                            k,
                            cp.0.add(r0 * n + c0),
                            1,
                            n as isize,
                            accumulate,
                            ap.0.offset(r0 as isize * a.1),
                            a.2,
                            a.1,
                            bp.0.offset(c0 as isize * b.2),
                            b.2,
                            b.1,
                            1.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        )
                    }
                };
                let split = move |threads: usize, len: usize, align: usize, f: &(dyn Fn(usize, usize) + Sync)| {
                    let chunk = len.div_ceil(threads).div_ceil(align) * align;
                    kernel::install(|| {
                        use rayon::prelude::*;
                        (0..threads).into_par_iter().for_each(|t| {
                            let (s0, s1) = ((t * chunk).min(len), ((t + 1) * chunk).min(len));
                            if s0 < s1 {
                                f(s0, s1)
                            }
                        })
                    })
                };
                match plan(m, n, k) {
                    Plan::Serial => block(0, m, 0, n, gemm::Parallelism::None),
                    Plan::Columns(threads) => {
                        split(threads, n, 16, &|c0, c1| block(0, m, c0, c1, gemm::Parallelism::None))
                    }
                    Plan::Rows(threads) => split(threads, m, 8, &|r0, r1| block(r0, r1, 0, n, gemm::Parallelism::None)),
                    Plan::Crate(threads) => kernel::install(|| block(0, m, 0, n, gemm::Parallelism::Rayon(threads))),
                }
            }

            fn mm_block(k: usize, a: (&[$t], isize, isize), b: (&[$t], isize, isize), dst: &mut ColumnBlock<$t>) {
                let (m, n) = (dst.rows(), dst.cols());
                if m == 0 || n == 0 {
                    return;
                }
                if k == 0 {
                    (0..m).for_each(|i| dst.row(i).fill(0.0));
                    return;
                }
                assert!(
                    a.0.len() >= extent(m, k, a.1, a.2) && b.0.len() >= extent(k, n, b.1, b.2),
                    "gemm: an operand is shorter than its shape and strides"
                );
                let ld = dst.ld() as isize;
                // SAFETY: `a` and `b` are read within their asserted extents; `dst`'s
                // `m × n` elements at row stride `ld` from its first are its own alone
                // (`ColumnBlock::as_mut_ptr`), and the GEMM writes only those, on this thread.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        dst.as_mut_ptr(),
                        1,
                        ld,
                        false,
                        a.0.as_ptr(),
                        a.2,
                        a.1,
                        b.0.as_ptr(),
                        b.2,
                        b.1,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            }
        }
    };
}
native_gemm!(f32);
native_gemm!(f64);

impl GemmElem for f16 {
    fn mm(
        m: usize,
        n: usize,
        k: usize,
        a: (&[f16], isize, isize),
        b: (&[f16], isize, isize),
        c: &mut [f16],
        accumulate: bool,
    ) {
        let a32: Vec<f32> = a.0.iter().map(|v| v.to_f32()).collect();
        let b32: Vec<f32> = b.0.iter().map(|v| v.to_f32()).collect();
        let mut c32: Vec<f32> =
            if accumulate { c[..m * n].iter().map(|v| v.to_f32()).collect() } else { vec![0.0; m * n] };
        f32::mm(m, n, k, (&a32, a.1, a.2), (&b32, b.1, b.2), &mut c32, accumulate);
        for (o, v) in c.iter_mut().zip(c32) {
            *o = f16::from_f32(v);
        }
    }

    fn mm_block(k: usize, a: (&[f16], isize, isize), b: (&[f16], isize, isize), dst: &mut ColumnBlock<f16>) {
        let (m, n) = (dst.rows(), dst.cols());
        let mut c = vec![f16::ZERO; m * n];
        f16::mm(m, n, k, a, b, &mut c, false);
        for (i, row) in c.chunks_exact(n.max(1)).enumerate().take(m) {
            dst.row(i).copy_from_slice(row);
        }
    }
}

/// `c (m×n, row-major) = [c +] op(a)·op(b)` where `a` is stored row-major as m×k (`ta`: k×m)
/// and `b` as k×n (`tb`: n×k).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: GemmElem>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    ta: bool,
    b: &[T],
    tb: bool,
    c: &mut [T],
    accumulate: bool,
) {
    debug_assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    let a_s = if ta { (1, m as isize) } else { (k as isize, 1) };
    let b_s = if tb { (1, k as isize) } else { (n as isize, 1) };
    T::mm(m, n, k, (a, a_s.0, a_s.1), (b, b_s.0, b_s.1), c, accumulate);
}

// ---------------------------------------------------------------------------------------------
// dot

op_params! {
    pub(super) struct DotParams<'a> => DOT_PARAMS {
        transpose_a: bool = "False", "If true then transpose the first input before dot.";
        transpose_b: bool = "False", "If true then transpose the second input before dot.";
        forward_stype: Option<&'a str> = "None" in ["csr", "default", "row_sparse"], "The desired storage type of the forward output given by user, if thecombination of input storage types and this hint does not matchany implemented ones, the dot operator will perform fallback operationand still produce an output of the desired storage type.";
    }
}

/// The matrix problem of a `dot` call: (m, n, k) and the output shape.
pub(super) fn dot_plan(
    op: &str,
    l: &[usize],
    r: &[usize],
    ta: bool,
    tb: bool,
) -> Result<(usize, usize, usize, Vec<usize>)> {
    if l.is_empty() || r.is_empty() {
        return Err(Error::value(format!(
            "operator {op}: inputs must have at least one dimension, got {l:?} and {r:?}"
        )));
    }
    if l.len() == 1 && r.len() == 1 {
        if ta || tb {
            return Err(Error::value(format!("operator {op}: transpose is not supported for two 1-D inputs")));
        }
        if l[0] != r[0] {
            return Err(Error::value(format!("operator {op}: shape mismatch: {l:?} and {r:?}")));
        }
        return Ok((1, 1, l[0], vec![1]));
    }
    let prod = |s: &[usize]| s.iter().product::<usize>();
    // Lhs as (L0 × L1): rows are all but the last axis (transposed: the first axis vs the rest).
    let (l_out, lk, lm): (&[usize], usize, usize) = if ta {
        (if l.len() > 1 { &l[1..] } else { &[] }, l[0], prod(&l[1..]))
    } else {
        (if l.len() > 1 { &l[..l.len() - 1] } else { &[] }, l[l.len() - 1], prod(&l[..l.len() - 1]))
    };
    let (r_out, rk, rn): (&[usize], usize, usize) = if tb {
        (if r.len() > 1 { &r[..r.len() - 1] } else { &[] }, r[r.len() - 1], prod(&r[..r.len() - 1]))
    } else {
        (if r.len() > 1 { &r[1..] } else { &[] }, r[0], prod(&r[1..]))
    };
    if lk != rk {
        return Err(Error::value(format!(
            "operator {op}: shape mismatch: lhs {l:?} (transpose_a={ta}) and rhs {r:?} (transpose_b={tb}) do not share the reduced dimension ({lk} vs {rk})"
        )));
    }
    let mut out: Vec<usize> = l_out.to_vec();
    out.extend_from_slice(r_out);
    if out.is_empty() {
        out.push(1);
    }
    Ok((lm, rn, lk, out))
}

fn float_dtype(op: &str, d: DType) -> Result<()> {
    match d {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        other => {
            Err(Error::type_error(format!("operator {op} supports float32, float64 and float16, not {}", other.name())))
        }
    }
}

fn same_dtype(op: &str, a: &Meta, b: &Meta, i: usize) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(Error::type_error(format!(
            "operator {op}: input {i} has dtype {}, expected {} like input 0",
            b.dtype.name(),
            a.dtype.name()
        )));
    }
    Ok(())
}

fn dot_infer(a: &crate::op::param::Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = DotParams::of(a);
    same_dtype(a.op, &ins[0], &ins[1], 1)?;
    float_dtype(a.op, ins[0].dtype)?;
    let (_, _, _, out) = dot_plan(a.op, &ins[0].shape, &ins[1].shape, params.transpose_a, params.transpose_b)?;
    Ok(vec![Meta::new(out, ins[0].dtype)])
}

fn dot_compute(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = DotParams::of(cx.attrs);
    let (ta, tb) = (params.transpose_a, params.transpose_b);
    let (m, n, k, _) = dot_plan(cx.attrs.op, &ins[0].shape, &ins[1].shape, ta, tb)?;
    dispatch_float!(ins[0].dtype, cx.attrs.op, T => {
        gemm::<T>(m, n, k, ins[0].as_slice::<T>(), ta, ins[1].as_slice::<T>(), tb, outs[0].as_mut::<T>(), false)
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// batch_dot

pub(super) fn batch_plan(
    op: &str,
    l: &[usize],
    r: &[usize],
    ta: bool,
    tb: bool,
) -> Result<(usize, usize, usize, usize)> {
    if l.len() != 3 || r.len() != 3 {
        return Err(Error::value(format!("operator {op}: both inputs must be 3-D, got {l:?} and {r:?}")));
    }
    if l[0] != r[0] {
        return Err(Error::value(format!("operator {op}: batch sizes differ: {l:?} and {r:?}")));
    }
    let (m, lk) = if ta { (l[2], l[1]) } else { (l[1], l[2]) };
    let (rk, n) = if tb { (r[2], r[1]) } else { (r[1], r[2]) };
    if lk != rk {
        return Err(Error::value(format!(
            "operator {op}: shape mismatch: lhs {l:?} (transpose_a={ta}) and rhs {r:?} (transpose_b={tb})"
        )));
    }
    Ok((l[0], m, n, lk))
}

fn batch_dot_infer(a: &crate::op::param::Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = DotParams::of(a);
    same_dtype(a.op, &ins[0], &ins[1], 1)?;
    float_dtype(a.op, ins[0].dtype)?;
    let (b, m, n, _) = batch_plan(a.op, &ins[0].shape, &ins[1].shape, params.transpose_a, params.transpose_b)?;
    Ok(vec![Meta::new(vec![b, m, n], ins[0].dtype)])
}

/// `out[i] = op(a[i])·op(b[i])` for each of `batch` contiguous matrix pairs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batched_gemm<T: GemmElem>(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    ta: bool,
    b: &[T],
    tb: bool,
    c: &mut [T],
) {
    let flops = 2.0 * (m * n * k) as f64;
    if batch == 0 {
        return;
    }
    if flops >= PAR_FLOPS * 4.0 {
        for i in 0..batch {
            gemm(m, n, k, &a[i * m * k..], ta, &b[i * k * n..], tb, &mut c[i * m * n..(i + 1) * m * n], false);
        }
        return;
    }
    par_tasks_mut(&mut c[..batch * m * n], m * n, flops * batch as f64 * 0.1, T::DTYPE, |i, ci| {
        gemm(m, n, k, &a[i * m * k..], ta, &b[i * k * n..], tb, ci, false);
    });
}

fn batch_dot_compute(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = DotParams::of(cx.attrs);
    let (ta, tb) = (params.transpose_a, params.transpose_b);
    let (batch, m, n, k) = batch_plan(cx.attrs.op, &ins[0].shape, &ins[1].shape, ta, tb)?;
    dispatch_float!(ins[0].dtype, cx.attrs.op, T => {
        batched_gemm::<T>(batch, m, n, k, ins[0].as_slice::<T>(), ta, ins[1].as_slice::<T>(), tb, outs[0].as_mut::<T>())
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// FullyConnected

op_params! {
    pub(super) struct FcParams<'a> => FC_PARAMS {
        num_hidden: i64 = required, "Number of hidden nodes of the output.";
        no_bias: bool = "False", "Whether to disable bias parameter.";
        flatten: bool = "True", "Whether to collapse all but the first axis of the input data tensor.";
    }
}

fn fc_inputs(a: &crate::op::param::Attrs) -> usize {
    let params = FcParams::of(a);
    if params.no_bias {
        2
    } else {
        3
    }
}

/// (rows, in_units, output shape) of a FullyConnected call.
pub(super) fn fc_plan(a: &crate::op::param::Attrs, data: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
    let params = FcParams::of(a);
    let op = a.op;
    let hidden = params.num_hidden;
    if hidden < 1 {
        return Err(Error::value(format!("operator {op}: num_hidden must be positive, got {hidden}")));
    }
    let hidden = hidden as usize;
    if data.is_empty() {
        return Err(Error::value(format!("operator {op}: data must have at least one dimension")));
    }
    if params.flatten {
        let rows = data[0];
        let k = data[1..].iter().product();
        Ok((rows, k, vec![rows, hidden]))
    } else {
        let k = data[data.len() - 1];
        let rows = data[..data.len() - 1].iter().product();
        let mut out = data[..data.len() - 1].to_vec();
        out.push(hidden);
        Ok((rows, k, out))
    }
}

fn fc_infer(a: &crate::op::param::Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = FcParams::of(a);
    let op = a.op;
    float_dtype(op, ins[0].dtype)?;
    let (_, k, out) = fc_plan(a, &ins[0].shape)?;
    let hidden = params.num_hidden as usize;
    same_dtype(op, &ins[0], &ins[1], 1)?;
    if ins[1].shape != [hidden, k] {
        return Err(Error::value(format!(
            "operator {op}: weight has shape {:?}, expected ({hidden}, {k}) for data {:?}",
            ins[1].shape, ins[0].shape
        )));
    }
    if ins.len() > 2 {
        same_dtype(op, &ins[0], &ins[2], 2)?;
        if ins[2].shape != [hidden] {
            return Err(Error::value(format!(
                "operator {op}: bias has shape {:?}, expected ({hidden},)",
                ins[2].shape
            )));
        }
    }
    Ok(vec![Meta::new(out, ins[0].dtype)])
}

/// `out[r, j] += bias[j]` for each row of a rows×cols output.
pub(crate) fn add_bias_rows<T: Elem>(out: &mut [T], bias: &[T], cols: usize) {
    let rows = out.len().checked_div(cols).unwrap_or(0);
    par_for_mut(&mut out[..rows * cols], cols, Cost(cols as f64 * 0.5), T::DTYPE, |_, o| {
        for row in o.chunks_exact_mut(cols) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v = T::from_f64(v.to_f64() + b.to_f64());
            }
        }
    });
}

fn add_bias_f32(out: &mut [f32], bias: &[f32], cols: usize) {
    let rows = out.len().checked_div(cols).unwrap_or(0);
    par_for_mut(&mut out[..rows * cols], cols, Cost(cols as f64 * 0.1), DType::F32, |_, o| {
        for row in o.chunks_exact_mut(cols) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    });
}

fn fc_compute(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let params = FcParams::of(cx.attrs);
    let (rows, k, _) = fc_plan(cx.attrs, &ins[0].shape)?;
    let hidden = params.num_hidden as usize;
    dispatch_float!(ins[0].dtype, cx.attrs.op, T => {
        let o = outs[0].as_mut::<T>();
        gemm::<T>(rows, hidden, k, ins[0].as_slice::<T>(), false, ins[1].as_slice::<T>(), true, o, false);
        if ins.len() > 2 {
            if T::DTYPE == DType::F32 {
                add_bias_f32(outs[0].as_mut::<f32>(), ins[2].as_slice::<f32>(), hidden);
            } else {
                add_bias_rows::<T>(o, ins[2].as_slice::<T>(), hidden);
            }
        }
    });
    Ok(())
}

/// Graph inference of the weight and bias from the data: `(num_hidden, features)` and
/// `(num_hidden,)`, the features being the data's trailing axes (flattened) or its last axis.
fn fc_param_shapes(a: &crate::op::param::Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let params = FcParams::of(a);
    let flatten = params.flatten;
    // 1-d data flattens to one input per row (stock: an unrolled cell's step of shape (N,)).
    if data.is_empty() {
        return Ok(vec![]);
    }
    let nh = params.num_hidden;
    let k = match (flatten, data.split_last()) {
        (false, Some((&last, _))) => last,
        _ if data[1..].iter().all(|&d| d >= 0) => data[1..].iter().product(),
        _ => -1,
    };
    Ok(vec![(1, vec![nh, k]), (2, vec![nh])])
}

/// The data's batch dimensions from the output's (stock's backward rule: an unrolled cell's
/// begin state `F.zeros((0, H))` takes its batch size from the products it feeds).
fn fc_input_shapes(
    a: &crate::op::param::Attrs,
    ins: &[Option<Vec<i64>>],
    outs: &[Option<Vec<i64>>],
) -> Result<Vec<(usize, Vec<i64>)>> {
    let (Some(Some(data)), Some(Some(out))) = (ins.first(), outs.first()) else { return Ok(vec![]) };
    let leading = if FcParams::of(a).flatten { 1 } else { data.len().saturating_sub(1) };
    if data.len() < leading || out.len() < leading + 1 {
        return Ok(vec![]);
    }
    let mut shape = data.clone();
    for k in 0..leading {
        if shape[k] < 0 {
            shape[k] = out[k];
        }
    }
    Ok(if shape == *data { vec![] } else { vec![(0, shape)] })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("dot", Inputs::Fixed(&["lhs", "rhs"]), Box::new(dot_infer), Box::new(dot_compute))
            .gpu(crate::op::gpu::GpuKernel::Dot(|a| {
                let p = DotParams::of(a);
                (p.transpose_a, p.transpose_b)
            }))
            .alias(&["_sparse_dot"])
            .params(DOT_PARAMS)
            .never_mirrored()
            .grad(Grad::Backward { op: "_backward_dot", inputs: true, outputs: false })
            .doc("Dot product of two arrays. N-D inputs are flattened to matrices: lhs over all but its last axis, rhs over all but its first."),
    );
    ops.push(
        OpDef::new("batch_dot", Inputs::Fixed(&["lhs", "rhs"]), Box::new(batch_dot_infer), Box::new(batch_dot_compute))
            .gpu(crate::op::gpu::GpuKernel::BatchDot(|a| {
                let p = DotParams::of(a);
                (p.transpose_a, p.transpose_b)
            }))
            .alias(&["_npx_batch_dot"])
            .params(DOT_PARAMS)
            .never_mirrored()
            .grad(Grad::Backward { op: "_backward_batch_dot", inputs: true, outputs: false })
            .doc("Batchwise dot product of two 3-D arrays."),
    );
    ops.push(
        OpDef::new(
            "FullyConnected",
            Inputs::Leading(&["data", "weight", "bias"], fc_inputs),
            Box::new(fc_infer),
            Box::new(fc_compute),
        )
        .alias(&["_npx_fully_connected", "_sparse_FullyConnected"])
        .params(FC_PARAMS)
        .gpu(crate::op::gpu::GpuKernel::FullyConnected(|a| FcParams::of(a).no_bias))
        .param_shapes(fc_param_shapes)
        .input_shapes(fc_input_shapes)
        .never_mirrored()
        .grad(Grad::Backward { op: "_backward_FullyConnected", inputs: true, outputs: false })
        .doc("Applies a linear transformation: Y = XW^T + b."),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f64], ta: bool, b: &[f64], tb: bool) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    let av = if ta { a[p * m + i] } else { a[i * k + p] };
                    let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                    c[i * n + j] += av * bv;
                }
            }
        }
        c
    }

    #[test]
    fn large_float32_products_match_a_float64_reference() {
        // Large enough for the parallel paths, with edge tiles in every direction. Checked on
        // a sample of entries (the full reference would take seconds).
        let (m, n, k) = (515, 1027, 520);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 997) as f32 / 498.0 - 1.0).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true)] {
            for accumulate in [false, true] {
                let mut c: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
                gemm(m, n, k, &a, ta, &b, tb, &mut c, accumulate);
                for idx in (0..m * n).step_by(997).chain([0, m * n - 1, n - 1, (m - 1) * n]) {
                    let (i, j) = (idx / n, idx % n);
                    let mut want = if accumulate { (idx % 5) as f64 } else { 0.0 };
                    for p in 0..k {
                        let av = if ta { a[p * m + i] } else { a[i * k + p] };
                        let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                        want += av as f64 * bv as f64;
                    }
                    assert!(
                        (c[idx] as f64 - want).abs() < 1e-3,
                        "ta={ta} tb={tb} acc={accumulate} ({i},{j}): {} vs {want}",
                        c[idx]
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_matches_naive_for_all_transposes() {
        let (m, n, k) = (7, 5, 9);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        for ta in [false, true] {
            for tb in [false, true] {
                let mut c = vec![0.0; m * n];
                gemm(m, n, k, &a, ta, &b, tb, &mut c, false);
                let want = naive(m, n, k, &a, ta, &b, tb);
                for (x, y) in c.iter().zip(&want) {
                    assert!((x - y).abs() < 1e-12, "ta={ta} tb={tb}");
                }
                let af: Vec<f16> = a.iter().map(|&v| f16::from_f64(v)).collect();
                let bf: Vec<f16> = b.iter().map(|&v| f16::from_f64(v)).collect();
                let mut cf = vec![f16::ZERO; m * n];
                gemm(m, n, k, &af, ta, &bf, tb, &mut cf, false);
                for (x, y) in cf.iter().zip(&want) {
                    assert!((x.to_f64() - y).abs() < 0.05);
                }
            }
        }
    }

    /// Every parallel plan (column blocks, row blocks, the crate's own split) against the
    /// naive product: every transpose, accumulation, and sizes that do not divide evenly
    /// among the threads.
    #[test]
    fn parallel_plans_match_the_naive_product() {
        let threads = kernel::pool_threads();
        let cases = [
            (24, 701, 300, Plan::Columns(threads)),
            (901, 70, 300, Plan::Rows(threads)),
            (130, 135, 300, Plan::Columns(threads)),
            (200, 100, 300, Plan::Rows(threads)),
            (40, 40, 3000, Plan::Crate(threads)),
        ];
        for (m, n, k, want_plan) in cases {
            assert!(2.0 * (m * n * k) as f64 >= PAR_FLOPS);
            if threads == 2 {
                assert_eq!(plan(m, n, k), want_plan, "{m}x{n}x{k}");
            } else if threads > 2 {
                assert_ne!(plan(m, n, k), Plan::Serial, "{m}x{n}x{k}");
            } else {
                eprintln!("one kernel thread: the parallel plans are not exercised here");
            }
            check_product(m, n, k);
        }
    }

    fn check_product(m: usize, n: usize, k: usize) {
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        for ta in [false, true] {
            for tb in [false, true] {
                let want = naive(m, n, k, &a, ta, &b, tb);
                let mut c = vec![0.0; m * n];
                gemm(m, n, k, &a, ta, &b, tb, &mut c, false);
                for (x, y) in c.iter().zip(&want) {
                    assert!((x - y).abs() < 1e-9, "ta={ta} tb={tb}");
                }
                let mut c32 = vec![1.0f32; m * n];
                let (a32, b32): (Vec<f32>, Vec<f32>) =
                    (a.iter().map(|&v| v as f32).collect(), b.iter().map(|&v| v as f32).collect());
                gemm(m, n, k, &a32, ta, &b32, tb, &mut c32, true);
                for (x, y) in c32.iter().zip(&want) {
                    assert!((*x as f64 - (y + 1.0)).abs() < 1e-3, "accumulate ta={ta} tb={tb}");
                }
            }
        }
    }

    #[test]
    fn dot_shapes_follow_stock_flattening() {
        assert_eq!(dot_plan("dot", &[3], &[3], false, false).unwrap(), (1, 1, 3, vec![1]));
        assert_eq!(dot_plan("dot", &[2, 3], &[3], false, false).unwrap(), (2, 1, 3, vec![2]));
        assert_eq!(dot_plan("dot", &[3], &[3, 4], false, false).unwrap(), (1, 4, 3, vec![4]));
        assert_eq!(dot_plan("dot", &[2, 5, 3], &[3, 4, 6], false, false).unwrap(), (10, 24, 3, vec![2, 5, 4, 6]));
        assert_eq!(dot_plan("dot", &[3, 2], &[4, 3], true, true).unwrap(), (2, 4, 3, vec![2, 4]));
        assert!(dot_plan("dot", &[2, 3], &[2, 3], false, false).is_err());
        assert!(dot_plan("dot", &[3], &[3], true, false).is_err());
    }

    /// Throughput of the shapes the project targets (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn gemm_throughput() {
        for &(m, n, k, tb) in
            &[(1024usize, 1024usize, 1024usize, false), (64, 512, 800, true), (1024, 1024, 1024, true)]
        {
            let a = vec![0.5f32; m * k];
            let b = vec![0.25f32; k * n];
            let mut c = vec![0.0f32; m * n];
            gemm(m, n, k, &a, false, &b, tb, &mut c, false);
            let reps = 20;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                gemm(m, n, k, &a, false, &b, tb, &mut c, false);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            eprintln!("gemm {m}x{n}x{k} tb={tb}: {:.1} GFLOP/s", 2.0 * (m * n * k) as f64 / s / 1e9);
        }
    }
}
