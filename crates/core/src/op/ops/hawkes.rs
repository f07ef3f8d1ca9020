//! `_contrib_hawkesll`, the log likelihood of marked Hawkes processes with exponential
//! kernels, and its backward operator `_contrib_backward_hawkesll` (stock's names).
//!
//! Owns the shape and dtype rules, the per-sample recursions and their gradients. Sample `i`
//! of a batch has `K` processes with background intensities `lda[i]`, shared branching ratios
//! `alpha` and decays `beta`, a starting memory `state[i]`, and `valid_length[i]` points given
//! as inter-arrival times `lags[i]` and process ids `marks[i]` (int32 in stock; any numeric
//! dtype here). The intensity of
//! process `k` at a point after a gap `d` since its last point is
//! `lda + alpha * beta * s * exp(-beta * d)`, its compensator `lda * d + alpha * s * (1 -
//! exp(-beta * d))`, and the memory `s` becomes `1 + s * exp(-beta * d)` at the point. The
//! output is the log likelihood per sample (log intensities at the points minus the
//! compensators up to `max_time[i]`) and the memory at `max_time`.
//!
//! As stock's: a sample runs its points `j` while `j < valid_length[i]`; gradients go to
//! `lda`, `alpha` and `beta` from the likelihood's gradient only (the returned memory's is
//! ignored, as stock ignores it), and the other inputs get zeros (stock leaves them
//! unwritten). Unlike stock's, a mark outside `[0, K)` or more valid points than the sequence
//! holds is an error (stock reads outside its buffers), and float64 is computed with float64
//! exponentials (stock's use `expf`). Float16 computes in float32.

use super::nn::{dispatch_real, Real};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::par_items;
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

const INPUTS: &[&str] = &["lda", "alpha", "beta", "state", "lags", "marks", "valid_length", "max_time"];

/// The batch `n`, sequence length `t` and process count `k` of a call.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    t: usize,
    k: usize,
}

fn dims(op: &str, shapes: &[&[usize]]) -> Result<Dims> {
    let bad = |what: &str| {
        Error::value(format!(
            "operator {op}: {what}; expected lda (N, K), alpha (K,), beta (K,), state (N, K), lags (N, T), \
             marks (N, T), valid_length (N,), max_time (N,), got {shapes:?}"
        ))
    };
    let (&[n, k], &[n2, t]) = (shapes[0], shapes[4]) else { return Err(bad("lda and lags must be 2-D")) };
    let want: [&[usize]; 8] = [&[n, k], &[k], &[k], &[n, k], &[n, t], &[n, t], &[n], &[n]];
    for (i, (s, w)) in shapes.iter().zip(want).enumerate() {
        if *s != w || n2 != n {
            return Err(bad(&format!("{} has shape {s:?}", INPUTS[i])));
        }
    }
    Ok(Dims { n, t, k })
}

fn infer(a: &crate::op::param::Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let shapes: Vec<&[usize]> = ins.iter().map(|m| &m.shape[..]).collect();
    let d = dims(op, &shapes)?;
    let dt = ins[0].dtype;
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16) {
        return Err(Error::type_error(format!(
            "operator {op} supports float32, float64 and float16, not {}",
            dt.name()
        )));
    }
    // Marks are process ids of any numeric dtype (stock's type inference makes them int32;
    // a graph whose marks' dtype is not known yet infers them as the data's).
    for (i, m) in ins.iter().enumerate().filter(|&(i, _)| i != 5) {
        let want = dt;
        if m.dtype != want {
            return Err(Error::type_error(format!(
                "operator {op}: {} has dtype {}, expected {}",
                INPUTS[i],
                m.dtype.name(),
                want.name()
            )));
        }
    }
    Ok(vec![Meta::new(vec![d.n], dt), Meta::new(vec![d.n, d.k], dt)])
}

/// One sample's points: (gap since the start, process) for each valid point.
fn points<R: Real>(op: &str, i: usize, d: Dims, lags: &[R], marks: &[f64], valid: R) -> Result<Vec<(R, usize)>> {
    // Stock loops while j < valid_length[i]: ceil(valid) points (none for NaN or <= 0).
    let runs = |j: usize| R::of(j as f64) < valid;
    let count = (0..=d.t).find(|&j| !runs(j)).unwrap_or(d.t + 1);
    if count > d.t {
        return Err(Error::value(format!(
            "operator {op}: valid_length[{i}] is {:?}, more points than the sequence length {}",
            valid.f64(),
            d.t
        )));
    }
    let mut out = Vec::with_capacity(count);
    for j in 0..count {
        let m = marks[i * d.t + j];
        if !(m >= 0.0 && m < d.k as f64) {
            return Err(Error::value(format!(
                "operator {op}: marks[{i}, {j}] is {m}, not a process id in [0, {})",
                d.k
            )));
        }
        out.push((lags[i * d.t + j], m as usize));
    }
    Ok(out)
}

/// One sample's log likelihood; `s` enters as the starting memory and leaves as the memory
/// at `max_time`.
fn sample_ll<R: Real>(mu: &[R], alpha: &[R], beta: &[R], s: &mut [R], pts: &[(R, usize)], max_time: R) -> R {
    let k = mu.len();
    let mut last = vec![R::of(0.0); k];
    let (mut t, mut ll) = (R::of(0.0), R::of(0.0));
    for &(lag, c) in pts {
        t = t + lag;
        let d = t - last[c];
        let ed = (-beta[c] * d).exp();
        let lda = mu[c] + alpha[c] * beta[c] * s[c] * ed;
        let comp = mu[c] * d + alpha[c] * s[c] * (R::of(1.0) - ed);
        ll = ll + lda.ln() - comp;
        s[c] = R::of(1.0) + s[c] * ed;
        last[c] = t;
    }
    for m in 0..k {
        let d = max_time - last[m];
        let ed = (-beta[m] * d).exp();
        ll = ll - (mu[m] * d + alpha[m] * s[m] * (R::of(1.0) - ed));
        s[m] = ed * s[m];
    }
    ll
}

/// One sample's gradients of `og * log likelihood` in `lda` (its row), `alpha` and `beta`
/// (its contributions), from the starting memory `s0`.
fn sample_grad<R: Real>(
    mu: &[R],
    alpha: &[R],
    beta: &[R],
    s0: &[R],
    pts: &[(R, usize)],
    max_time: R,
    og: R,
) -> [Vec<R>; 3] {
    let k = mu.len();
    let (mut last, mut phi, mut dphi) = (vec![R::of(0.0); k], s0.to_vec(), vec![R::of(0.0); k]);
    let (mut gm, mut ga, mut gb) = (vec![R::of(0.0); k], vec![R::of(0.0); k], vec![R::of(0.0); k]);
    let one = R::of(1.0);
    let mut t = R::of(0.0);
    for &(lag, c) in pts {
        t = t + lag;
        let d = t - last[c];
        let ed = (-beta[c] * d).exp();
        let lda = mu[c] + alpha[c] * beta[c] * phi[c] * ed;
        gm[c] = gm[c] + one / lda - d;
        ga[c] = ga[c] + beta[c] * phi[c] * ed / lda - phi[c] * (one - ed);
        gb[c] = gb[c] + alpha[c] * ed * (phi[c] * (one - beta[c] * d) + beta[c] * dphi[c]) / lda
            - alpha[c] * (dphi[c] * (one - ed) + phi[c] * d * ed);
        dphi[c] = ed * (-d * phi[c] + dphi[c]);
        phi[c] = one + phi[c] * ed;
        last[c] = t;
    }
    for m in 0..k {
        let d = max_time - last[m];
        let ed = (-beta[m] * d).exp();
        gm[m] = (gm[m] - d) * og;
        ga[m] = (ga[m] - phi[m] * (one - ed)) * og;
        gb[m] = (gb[m] - alpha[m] * (dphi[m] * (one - ed) + phi[m] * d * ed)) * og;
    }
    [gm, ga, gb]
}

/// The inputs as the compute type `R`, marks as they are.
struct Args<R> {
    mu: Vec<R>,
    alpha: Vec<R>,
    beta: Vec<R>,
    state: Vec<R>,
    lags: Vec<R>,
    marks: Vec<f64>,
    valid: Vec<R>,
    max_time: Vec<R>,
}

fn args<T: Elem, R: Real>(ins: &[TBlob]) -> Args<R> {
    let f = |b: &TBlob| b.as_slice::<T>().iter().map(|&x| R::load(x)).collect::<Vec<R>>();
    Args {
        mu: f(&ins[0]),
        alpha: f(&ins[1]),
        beta: f(&ins[2]),
        state: f(&ins[3]),
        lags: f(&ins[4]),
        marks: crate::dispatch_all!(ins[5].dtype, M => ins[5].as_slice::<M>().iter().map(|v| v.to_f64()).collect()),
        valid: f(&ins[6]),
        max_time: f(&ins[7]),
    }
}

fn forward<T: Elem, R: Real>(op: &str, d: Dims, req: &[Req], ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = args::<T, R>(ins);
    let pts = (0..d.n).map(|i| points(op, i, d, &a.lags, &a.marks, a.valid[i])).collect::<Result<Vec<_>>>()?;
    let mut ll = vec![R::of(0.0); d.n];
    let mut state = a.state.clone();
    let items: Vec<(usize, (&mut R, &mut [R]))> = ll.iter_mut().zip(state.chunks_mut(d.k.max(1))).enumerate().collect();
    par_items(items, (d.n * (d.t + d.k)) as f64 * 20.0, T::DTYPE, |_, (i, (l, s))| {
        let row = i * d.k..(i + 1) * d.k;
        *l = sample_ll(&a.mu[row], &a.alpha, &a.beta, s, &pts[i], a.max_time[i]);
    });
    let (out_ll, out_state) = crate::op::tensor::two_mut(outs, 0, 1);
    if req[0] != Req::Null {
        for (o, &v) in out_ll.as_mut::<T>().iter_mut().zip(&ll) {
            *o = v.store();
        }
    }
    if req[1] != Req::Null {
        for (o, &v) in out_state.as_mut::<T>().iter_mut().zip(&state) {
            *o = v.store();
        }
    }
    Ok(())
}

fn backward<T: Elem, R: Real>(op: &str, d: Dims, req: &[Req], ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    // Inputs: the gradients of the likelihood and of the memory, then the forward inputs.
    let og: Vec<R> = ins[0].as_slice::<T>().iter().map(|&x| R::load(x)).collect();
    let a = args::<T, R>(&ins[2..]);
    let pts = (0..d.n).map(|i| points(op, i, d, &a.lags, &a.marks, a.valid[i])).collect::<Result<Vec<_>>>()?;
    let mut per: Vec<[Vec<R>; 3]> = (0..d.n).map(|_| [Vec::new(), Vec::new(), Vec::new()]).collect();
    let items: Vec<(usize, &mut [Vec<R>; 3])> = per.iter_mut().enumerate().collect();
    par_items(items, (d.n * (d.t + d.k)) as f64 * 40.0, T::DTYPE, |_, (i, g)| {
        let row = i * d.k..(i + 1) * d.k;
        *g = sample_grad(&a.mu[row.clone()], &a.alpha, &a.beta, &a.state[row], &pts[i], a.max_time[i], og[i]);
    });
    for (i, o) in outs.iter_mut().enumerate() {
        if req[i] == Req::Null {
            continue;
        }
        match i {
            0 => {
                for (row, g) in o.as_mut::<T>().chunks_mut(d.k.max(1)).zip(&per) {
                    for (x, &y) in row.iter_mut().zip(&g[0]) {
                        *x = y.store();
                    }
                }
            }
            1 | 2 => {
                for (m, x) in o.as_mut::<T>().iter_mut().enumerate() {
                    let s = per.iter().fold(R::of(0.0), |acc, g| acc + g[i][m]);
                    *x = s.store();
                }
            }
            // The memory, the observations and the observation period get no gradient:
            // zeros, whatever their dtype (all-zero bytes are zero in each).
            _ => o.as_bytes_mut().fill(0),
        }
    }
    Ok(())
}

fn hawkes_forward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let op = cx.attrs.op;
    let shapes: Vec<&[usize]> = ins.iter().map(|b| &b.shape[..]).collect();
    let d = dims(op, &shapes)?;
    dispatch_real!(ins[0].dtype, op, T, R => forward::<T, R>(op, d, cx.req, ins, outs))
}

fn hawkes_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let op = cx.attrs.op;
    let shapes: Vec<&[usize]> = ins[2..].iter().map(|b| &b.shape[..]).collect();
    let d = dims(op, &shapes)?;
    dispatch_real!(ins[0].dtype, op, T, R => backward::<T, R>(op, d, cx.req, ins, outs))
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new("_contrib_hawkesll", Inputs::Fixed(INPUTS), Box::new(infer), Box::new(hawkes_forward))
            .outputs(|_| 2, |_| 2)
            .output_names(&["output", "out_state"])
            .input_dtypes(&[(5, DType::I32)])
            .grad(Grad::Backward { op: "_contrib_backward_hawkesll", inputs: true, outputs: false })
            .doc("Computes the log likelihood of a univariate Hawkes process (one per mark, K marks) on point process observations given as ragged matrices: lags (N, T) interarrival times and marks (N, T) int32 process ids, valid_length (N,) points per sample, max_time (N,) the observation period. lda (N, K) background intensities, alpha (K,) branching ratios, beta (K,) decays, state (N, K) the memory at time 0. Returns the log likelihood (N,) and the memory at max_time (N, K)."),
    );
    ops.push(OpDef::backward("_contrib_backward_hawkesll", &[], Box::new(hawkes_backward)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The likelihood's gradients in lda, alpha and beta against central differences of the
    /// likelihood, in float64, with two processes, a starting memory and a gradient of 1.5.
    #[test]
    fn gradients_match_finite_differences() {
        let pts: Vec<(f64, usize)> = vec![(0.5, 0), (0.7, 1), (0.2, 0), (1.1, 0), (0.3, 1)];
        let (mu, alpha, beta, s0) = (vec![0.8, 1.2], vec![0.3, 0.5], vec![1.5, 0.7], vec![0.4, 0.1]);
        let ll = |mu: &[f64], alpha: &[f64], beta: &[f64]| {
            let mut s = s0.clone();
            1.5 * sample_ll(mu, alpha, beta, &mut s, &pts, 6.0)
        };
        let [gm, ga, gb] = sample_grad(&mu, &alpha, &beta, &s0, &pts, 6.0, 1.5);
        let h = 1e-6;
        for (which, g) in [gm, ga, gb].iter().enumerate() {
            for m in 0..2 {
                let mut p = [mu.clone(), alpha.clone(), beta.clone()];
                let mut q = p.clone();
                p[which][m] += h;
                q[which][m] -= h;
                let num = (ll(&p[0], &p[1], &p[2]) - ll(&q[0], &q[1], &q[2])) / (2.0 * h);
                assert!((num - g[m]).abs() < 1e-6 * (1.0 + num.abs()), "input {which}[{m}]: {num} vs {}", g[m]);
            }
        }
    }

    #[test]
    fn points_are_checked() {
        let d = Dims { n: 1, t: 3, k: 2 };
        let lags = [1.0f32, 1.0, 1.0];
        assert_eq!(points("h", 0, d, &lags, &[0., 1., 5.], 2.0f32).unwrap().len(), 2);
        // 2.5 valid points run three, as stock's `j < valid_length`; NaN runs none.
        assert!(points("h", 0, d, &lags, &[0., 1., 5.], 2.5f32).unwrap_err().to_string().contains("marks[0, 2] is 5"));
        assert!(points("h", 0, d, &lags, &[0., 1., 1.], f32::NAN).unwrap().is_empty());
        assert!(points("h", 0, d, &lags, &[0., 1., 1.], 4.0f32).unwrap_err().to_string().contains("more points"));
        assert!(points("h", 0, d, &lags, &[0., f64::NAN, 1.], 2.0f32).is_err());
    }
}
