//! Densities of samples under parametrised distributions: `_random_pdf_{uniform, normal,
//! gamma, exponential, poisson, negative_binomial, generalized_negative_binomial, dirichlet}`
//! (aliases `random_pdf_*`) and their backward operators.
//!
//! Shapes as stock's: the parameter tensors share one shape, the leading dimensions of
//! `sample` (Dirichlet: its `alpha` vectors run along the last dimension, which `sample`
//! shares); each parameter element has `sample.size / param.size` samples, and the output has
//! `sample`'s shape (Dirichlet: without the last dimension, `(1,)` for a single vector).
//! `is_log` gives the log density. Arithmetic in the data's precision (float16 in float32),
//! in stock's formulas: `gamma`'s `beta` is a rate (density `b^a x^(a-1) e^(-b x) / Γ(a)`),
//! `negative_binomial`'s `p` the failure probability, and `generalized_negative_binomial` is
//! the negative binomial with `k = 1/alpha`, `p = 1/(mu alpha + 1)`. Samples outside the
//! support are not checked (stock does not either). Gradients reach every input; a
//! parameter's gradient is the sum over its samples.

use super::nn::{dispatch_real, Real};
use super::special::{psi, Libm};
use crate::error::{Error, Result};
use crate::ndarray::{DType, Meta};
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{op_params, Attrs};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dist {
    Uniform,
    Normal,
    Gamma,
    Exponential,
    Poisson,
    NegBinomial,
    GenNegBinomial,
    Dirichlet,
}

op_params! {
    /// The density operators' parameter.
    struct PdfParams<'a> => PDF_PARAMS {
        is_log: bool = "0", "If set, compute the density of the log-probability instead of the probability.";
    }
}

fn lgamma<R: Libm>(x: R) -> R {
    x.c_lgamma()
}

/// The negative binomial's log density (`k` trials to fail, failure probability `p`).
fn nb_lpdf<R: Libm>(k: R, p: R, x: R) -> R {
    let one = R::of(1.0);
    (lgamma(x + k) - lgamma(x + one) - lgamma(k)) + k * p.ln() + x * (one - p).ln()
}

/// The negative binomial's log-density slopes in `k` and `p`, times `s`.
fn nb_slopes<R: Real>(k: R, p: R, x: R, s: R) -> (R, R) {
    let one = R::of(1.0);
    (s * ((psi(x + k) - psi(k)) + p.ln()), s * (k / p - x / (one - p)))
}

/// The density (log density with `log`) of `x` under the scalar parameters `a`, `b`.
fn density<R: Libm>(d: Dist, log: bool, x: R, a: R, b: R) -> R {
    let one = R::of(1.0);
    let lpdf = match d {
        Dist::Uniform => return if log { -(b - a).ln() } else { one / (b - a) },
        Dist::Normal => {
            let e = R::of(-0.5) * (x - a) * (x - a) / (b * b);
            // Stock's pi is a float32 constant (mxnet_op::PI), widened for the square root.
            let norm = R::of((2.0 * f64::from(std::f32::consts::PI)).sqrt() * b.f64());
            return if log { e - norm.ln() } else { e.exp() / norm };
        }
        Dist::Exponential => return if log { a.ln() - a * x } else { a * (-(a * x)).exp() },
        Dist::Gamma => a * b.ln() + (a - one) * x.ln() - b * x - lgamma(a),
        Dist::Poisson => (x * a.ln() - lgamma(x + one)) - a,
        Dist::NegBinomial => nb_lpdf(a, b, x),
        Dist::GenNegBinomial => nb_lpdf(one / b, one / (a * b + one), x),
        Dist::Dirichlet => unreachable!("vector parameters"),
    };
    if log {
        lpdf
    } else {
        lpdf.exp()
    }
}

/// The gradients `(sample, a, b)` of one density value, given `s`: the output gradient times
/// the density (times 1 for log densities).
fn slopes<R: Real>(d: Dist, x: R, a: R, b: R, s: R) -> (R, R, R) {
    let (zero, one) = (R::of(0.0), R::of(1.0));
    match d {
        Dist::Uniform => (zero, s / (b - a), s / (a - b)),
        Dist::Normal => {
            let v = b * b;
            (s * (a - x) / v, s * (x - a) / v, s * ((x - a) * (x - a) - v) / (v * b))
        }
        Dist::Gamma => (s * ((a - one) / x - b), s * (b.ln() + x.ln() - psi(a)), s * (a / b - x)),
        Dist::Exponential => (-(s * a), s * (one / a - x), zero),
        Dist::Poisson => (zero, s * (x / a - one), zero),
        Dist::NegBinomial => {
            let (gk, gp) = nb_slopes(a, b, x, s);
            (zero, gk, gp)
        }
        Dist::GenNegBinomial => {
            let den = a * b + one;
            let (gk, gp) = nb_slopes(one / b, one / den, x, s);
            (zero, -(gp * b) / (den * den), -gk / (b * b) - gp * a / (den * den))
        }
        Dist::Dirichlet => unreachable!("vector parameters"),
    }
}

/// The output shape, after checking the parameters against `sample` (inputs: sample, then
/// the parameters).
fn infer(d: Dist, a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let op = a.op;
    let sample = &ins[0];
    if !matches!(sample.dtype, DType::F16 | DType::F32 | DType::F64) {
        return Err(Error::type_error(format!(
            "operator {op}: sample must be float16, float32 or float64, got {}",
            sample.dtype.name()
        )));
    }
    let pshape = &ins[1].shape;
    if pshape.is_empty() || pshape.len() > sample.shape.len() {
        return Err(Error::value(format!(
            "operator {op}: dimension of input samples ({}) must be at least dimension of distribution parameters ({}), which must be at least 1",
            sample.shape.len(),
            pshape.len()
        )));
    }
    let mut expect = sample.shape[..pshape.len()].to_vec();
    if d == Dist::Dirichlet {
        *expect.last_mut().expect("at least one dimension") = *sample.shape.last().expect("as many");
    }
    for (k, m) in ins.iter().enumerate().skip(1) {
        if m.shape != expect {
            return Err(Error::value(format!(
                "operator {op}: parameter {k} has shape {:?}, expected {expect:?} (the leading dimensions of sample {:?})",
                m.shape, sample.shape
            )));
        }
        if m.dtype != sample.dtype {
            return Err(Error::type_error(format!(
                "operator {op}: parameter {k} is {}, sample {} (they must have one dtype)",
                m.dtype.name(),
                sample.dtype.name()
            )));
        }
    }
    let shape = match (d, sample.shape.len()) {
        (Dist::Dirichlet, 1) => vec![1],
        (Dist::Dirichlet, n) => sample.shape[..n - 1].to_vec(),
        _ => sample.shape.clone(),
    };
    Ok(vec![Meta::new(shape, sample.dtype)])
}

/// The scalar-parameter forward: element `i` uses parameter element `i / per`.
fn forward_scalar<T: Elem, R: Libm>(d: Dist, log: bool, ins: &[TBlob], out: &mut OutBlob) {
    let x = ins[0].as_slice::<T>();
    let p1 = ins[1].as_slice::<T>();
    let p2 = ins.get(2).map_or(p1, |b| b.as_slice::<T>());
    let per = (x.len() / p1.len().max(1)).max(1);
    par_for_mut(out.as_mut::<T>(), 1, Cost::MATH, T::DTYPE, |r, o| {
        for (k, o) in o.iter_mut().enumerate() {
            let i = r.start + k;
            let j = i / per;
            *o = density::<R>(d, log, R::load(x[i]), R::load(p1[j]), R::load(p2[j])).store();
        }
    });
}

/// Dirichlet's forward: output element `i` is the density of sample vector `i` under the
/// alpha vector `i / per`.
fn forward_dirichlet<T: Elem, R: Libm>(log: bool, ins: &[TBlob], out: &mut OutBlob) {
    let (x, alpha) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
    let n = out.size();
    let k = x.len().checked_div(n).unwrap_or(1).max(1);
    let per = (x.len() / alpha.len().max(1)).max(1);
    par_for_mut(out.as_mut::<T>(), 1, Cost(20.0 * k as f64), T::DTYPE, |r, o| {
        for (m, o) in o.iter_mut().enumerate() {
            let i = r.start + m;
            let (xs, al) = (&x[i * k..(i + 1) * k], &alpha[(i / per) * k..(i / per + 1) * k]);
            let (mut sum_a, mut sum_lg, mut sum_x) = (R::of(0.0), R::of(0.0), R::of(0.0));
            for (&xv, &av) in xs.iter().zip(al) {
                let (xv, av) = (R::load(xv), R::load(av));
                sum_a = sum_a + av;
                sum_lg = sum_lg + lgamma(av);
                sum_x = sum_x + (av - R::of(1.0)) * xv.ln();
            }
            let lpdf = sum_x + (lgamma(sum_a) - sum_lg);
            *o = if log { lpdf } else { lpdf.exp() }.store();
        }
    });
}

fn forward(d: Dist) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        let log = PdfParams::of(cx.attrs).is_log;
        dispatch_real!(outs[0].dtype, cx.attrs.op, T, R => {
            if d == Dist::Dirichlet {
                forward_dirichlet::<T, R>(log, ins, &mut outs[0]);
            } else {
                forward_scalar::<T, R>(d, log, ins, &mut outs[0]);
            }
        });
        Ok(())
    })
}

/// The scalar-parameter backward. Inputs: output gradient, sample, parameters, density;
/// outputs: the gradients of sample and of each parameter.
fn backward_scalar<T: Elem, R: Libm>(d: Dist, log: bool, req: &[Req], ins: &[TBlob], outs: &mut [OutBlob]) {
    let np = ins.len() - 3;
    let (g, x, y) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[ins.len() - 1].as_slice::<T>());
    let p1 = ins[2].as_slice::<T>();
    let p2 = if np == 2 { ins[3].as_slice::<T>() } else { p1 };
    let per = (x.len() / p1.len().max(1)).max(1);
    let at = |i: usize| {
        let j = i / per;
        let s = R::load(g[i]) * if log { R::of(1.0) } else { R::load(y[i]) };
        slopes::<R>(d, R::load(x[i]), R::load(p1[j]), R::load(p2[j]), s)
    };
    if req[0] != Req::Null {
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::MATH, T::DTYPE, |r, o| {
            for (k, o) in o.iter_mut().enumerate() {
                *o = at(r.start + k).0.store();
            }
        });
    }
    for p in 1..=np {
        if req[p] == Req::Null {
            continue;
        }
        par_for_mut(outs[p].as_mut::<T>(), 1, Cost(20.0 * per as f64), T::DTYPE, |r, o| {
            for (k, o) in o.iter_mut().enumerate() {
                let j = r.start + k;
                let sum: f64 = (j * per..(j + 1) * per)
                    .map(|i| {
                        let (_, ga, gb) = at(i);
                        if p == 1 { ga } else { gb }.f64()
                    })
                    .sum();
                *o = T::from_f64(sum);
            }
        });
    }
}

/// Dirichlet's backward (as [`backward_scalar`], with vectors).
fn backward_dirichlet<T: Elem, R: Libm>(log: bool, req: &[Req], ins: &[TBlob], outs: &mut [OutBlob]) {
    let (g, x, alpha, y) =
        (ins[0].as_slice::<T>(), ins[1].as_slice::<T>(), ins[2].as_slice::<T>(), ins[3].as_slice::<T>());
    let n = y.len();
    let k = x.len().checked_div(n).unwrap_or(1).max(1);
    let per = (x.len() / alpha.len().max(1)).max(1);
    let scaling = |i: usize| R::load(g[i]) * if log { R::of(1.0) } else { R::load(y[i]) };
    let psi_sum = |j: usize| psi(alpha[j * k..(j + 1) * k].iter().fold(R::of(0.0), |s, &a| s + R::load(a)));
    if req[0] != Req::Null {
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::MATH, T::DTYPE, |r, o| {
            for (m, o) in o.iter_mut().enumerate() {
                let e = r.start + m;
                let (i, c) = (e / k, e % k);
                let a = R::load(alpha[(i / per) * k + c]);
                *o = (scaling(i) * (a - R::of(1.0)) / R::load(x[e])).store();
            }
        });
    }
    if req[1] != Req::Null {
        par_for_mut(outs[1].as_mut::<T>(), 1, Cost(20.0 * per as f64), T::DTYPE, |r, o| {
            for (m, o) in o.iter_mut().enumerate() {
                let e = r.start + m;
                let (j, c) = (e / k, e % k);
                let (ps, pa) = (psi_sum(j), psi(R::load(alpha[e])));
                let sum: f64 = (j * per..(j + 1) * per)
                    .map(|i| (scaling(i) * (R::load(x[i * k + c]).ln() + (ps - pa))).f64())
                    .sum();
                *o = T::from_f64(sum);
            }
        });
    }
}

fn backward(d: Dist) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        let log = PdfParams::of(cx.attrs).is_log;
        dispatch_real!(ins[1].dtype, cx.attrs.op, T, R => {
            if d == Dist::Dirichlet {
                backward_dirichlet::<T, R>(log, cx.req, ins, outs);
            } else {
                backward_scalar::<T, R>(d, log, cx.req, ins, outs);
            }
        });
        Ok(())
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    /// (name, alias, backward, distribution, inputs, what it computes)
    type Def = (&'static str, &'static str, &'static str, Dist, &'static [&'static str], &'static str);
    let table: &[Def] = &[
        (
            "_random_pdf_uniform",
            "random_pdf_uniform",
            "_backward_pdf_uniform",
            Dist::Uniform,
            &["sample", "low", "high"],
            "uniform distributions on the intervals given by *[low,high)*",
        ),
        (
            "_random_pdf_normal",
            "random_pdf_normal",
            "_backward_pdf_normal",
            Dist::Normal,
            &["sample", "mu", "sigma"],
            "normal distributions with parameters *mu* (mean) and *sigma* (standard deviation)",
        ),
        (
            "_random_pdf_gamma",
            "random_pdf_gamma",
            "_backward_pdf_gamma",
            Dist::Gamma,
            &["sample", "alpha", "beta"],
            "gamma distributions with parameters *alpha* (shape) and *beta* (rate)",
        ),
        (
            "_random_pdf_exponential",
            "random_pdf_exponential",
            "_backward_pdf_exponential",
            Dist::Exponential,
            &["sample", "lam"],
            "exponential distributions with parameters *lam* (rate)",
        ),
        (
            "_random_pdf_poisson",
            "random_pdf_poisson",
            "_backward_pdf_poisson",
            Dist::Poisson,
            &["sample", "lam"],
            "Poisson distributions with parameters *lam* (rate)",
        ),
        (
            "_random_pdf_negative_binomial",
            "random_pdf_negative_binomial",
            "_backward_pdf_negative_binomial",
            Dist::NegBinomial,
            &["sample", "k", "p"],
            "negative binomial distributions with parameters *k* (failure limit) and *p* (failure probability)",
        ),
        (
            "_random_pdf_generalized_negative_binomial",
            "random_pdf_generalized_negative_binomial",
            "_backward_pdf_generalized_negative_binomial",
            Dist::GenNegBinomial,
            &["sample", "mu", "alpha"],
            "generalized negative binomial distributions with parameters *mu* (mean) and *alpha* (dispersion)",
        ),
        (
            "_random_pdf_dirichlet",
            "random_pdf_dirichlet",
            "_backward_pdf_dirichlet",
            Dist::Dirichlet,
            &["sample", "alpha"],
            "Dirichlet distributions with parameter *alpha*",
        ),
    ];
    for &(name, alias, back, d, inputs, what) in table {
        ops.push(
            OpDef::new(name, Inputs::Fixed(inputs), Box::new(move |a, ins| infer(d, a, ins)), forward(d))
                .alias(&[alias])
                .params(PDF_PARAMS)
                .grad(Grad::Backward { op: back, inputs: true, outputs: true })
                .doc(format!(
                    "Computes the value of the PDF of *sample* of {what}. The parameters share one shape, which \
                     must match the leftmost subshape of *sample*; the densities at index *i* are those of the \
                     samples at index *i* under the parameters at index *i*."
                )),
        );
        ops.push(OpDef::backward(back, PDF_PARAMS, backward(d)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every gradient against central differences of the log density, in float64.
    #[test]
    fn slopes_match_differences() {
        let cases = [
            (Dist::Uniform, 0.5, -1.0, 2.0),
            (Dist::Normal, 0.3, -0.2, 1.7),
            (Dist::Gamma, 1.3, 2.5, 0.8),
            (Dist::Exponential, 0.7, 1.9, 0.0),
            (Dist::Poisson, 3.0, 2.2, 0.0),
            (Dist::NegBinomial, 4.0, 3.5, 0.4),
            (Dist::GenNegBinomial, 2.0, 1.5, 0.6),
        ];
        let h = 1e-6;
        for (d, x, a, b) in cases {
            let f = |x: f64, a: f64, b: f64| density::<f64>(d, true, x, a, b);
            let (gx, ga, gb) = slopes::<f64>(d, x, a, b, 1.0);
            let nx = (f(x + h, a, b) - f(x - h, a, b)) / (2.0 * h);
            let na = (f(x, a + h, b) - f(x, a - h, b)) / (2.0 * h);
            let nb = (f(x, a, b + h) - f(x, a, b - h)) / (2.0 * h);
            // The discrete distributions' sample gradient is 0 by definition (stock's too).
            if !matches!(d, Dist::Poisson | Dist::NegBinomial | Dist::GenNegBinomial | Dist::Uniform) {
                assert!((gx - nx).abs() < 1e-5, "{d:?} sample: {gx} vs {nx}");
            }
            assert!((ga - na).abs() < 1e-5, "{d:?} a: {ga} vs {na}");
            if !matches!(d, Dist::Exponential | Dist::Poisson) {
                assert!((gb - nb).abs() < 1e-5, "{d:?} b: {gb} vs {nb}");
            }
        }
        // The densities themselves at known values (stock's documented examples).
        assert!((density::<f64>(Dist::Normal, false, 1.0, 0.0, 1.0) - 0.241_970_73).abs() < 1e-8);
        assert!((density::<f64>(Dist::Gamma, false, 3.0, 5.0, 1.0) - 0.168_031_36).abs() < 1e-8);
        assert!((density::<f64>(Dist::Poisson, false, 2.0, 1.0, 0.0) - 0.183_939_73).abs() < 1e-8);
        assert!((density::<f64>(Dist::Exponential, false, 2.0, 0.5, 0.0) - 0.183_939_73).abs() < 1e-8);
    }
}
