//! Special functions, element-wise: `erf`, `erfinv`, `gamma`, `gammaln`, and their backward
//! operators.
//!
//! As stock: `erf`, `gamma` (`tgamma`) and `gammaln` (`lgamma`) are the C library's, in the
//! data's precision (float16 through float32); `erfinv` is computed in float64 for every
//! dtype. Gradients: `erf` `2/sqrt(pi) exp(-x²)`, `erfinv` `sqrt(pi)/2 exp(y²)` of the output
//! `y`, `gamma` `gamma(x) psi(x)`, `gammaln` `psi(x)` (the digamma function; float32 data gets
//! it in float32 precision, as stock's).

use super::nn::{dispatch_real, infer_float_like_first, Real};
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::tensor::{Elem, Operand, OutBlob, TBlob};
use crate::op::{Grad, Inputs, OpCtx, OpDef, Req};
use std::ffi::c_int;

extern "C" {
    fn erf(x: f64) -> f64;
    fn erff(x: f32) -> f32;
    fn tgamma(x: f64) -> f64;
    fn tgammaf(x: f32) -> f32;
    fn lgamma_r(x: f64, sign: *mut c_int) -> f64;
    fn lgammaf_r(x: f32, sign: *mut c_int) -> f32;
}

/// The C library's functions in the precision the kernel computes in.
pub(super) trait Libm: Real {
    fn c_erf(self) -> Self;
    fn c_tgamma(self) -> Self;
    fn c_lgamma(self) -> Self;
}

impl Libm for f32 {
    fn c_erf(self) -> f32 {
        // SAFETY: a pure function of its argument (C99 `erff`), defined for every float.
        unsafe { erff(self) }
    }
    fn c_tgamma(self) -> f32 {
        // SAFETY: as above (`tgammaf`; poles and overflow give inf or NaN, no UB).
        unsafe { tgammaf(self) }
    }
    fn c_lgamma(self) -> f32 {
        let mut sign: c_int = 0;
        // SAFETY: `lgammaf_r` writes only the sign it is given (the reentrant form: no global).
        unsafe { lgammaf_r(self, &mut sign) }
    }
}

impl Libm for f64 {
    fn c_erf(self) -> f64 {
        // SAFETY: a pure function of its argument (C99 `erf`).
        unsafe { erf(self) }
    }
    fn c_tgamma(self) -> f64 {
        // SAFETY: as above (`tgamma`).
        unsafe { tgamma(self) }
    }
    fn c_lgamma(self) -> f64 {
        let mut sign: c_int = 0;
        // SAFETY: `lgamma_r` writes only the sign it is given.
        unsafe { lgamma_r(self, &mut sign) }
    }
}

/// The inverse error function in float64: a rational first guess refined by Newton steps on
/// `erf` (full float64 accuracy); `±1` give `±inf`, outside `[-1, 1]` NaN.
fn erfinv(x: f64) -> f64 {
    if x.is_nan() || x.abs() > 1.0 {
        return f64::NAN;
    }
    if x.abs() == 1.0 {
        return x * f64::INFINITY;
    }
    // Giles' single-precision approximation ("Approximating the erfinv function", 2010).
    let w = -((1.0 - x) * (1.0 + x)).ln();
    let mut y = if w < 5.0 {
        let w = w - 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [
            3.432_739_39e-07,
            -3.523_387_7e-06,
            -4.391_506_54e-06,
            0.000_218_580_87,
            -0.001_253_725_03,
            -0.004_177_681_64,
            0.246_640_727,
            1.501_409_41,
        ] {
            p = c + p * w;
        }
        p * x
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [
            0.000_100_950_558,
            0.001_349_343_22,
            -0.003_673_428_44,
            0.005_739_507_73,
            -0.007_622_461_3,
            0.009_438_870_47,
            1.001_674_06,
            2.832_976_82,
        ] {
            p = c + p * w;
        }
        p * x
    };
    let two_over_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI;
    for _ in 0..3 {
        let err = y.c_erf() - x;
        let d = two_over_sqrt_pi * (-y * y).exp();
        if d == 0.0 || !d.is_finite() {
            break;
        }
        y -= err / d;
    }
    y
}

/// The digamma function psi(x): reflection below 0, the recurrence `psi(x) = psi(x + 1) -
/// 1/x` up to 10, then the asymptotic series. Poles (0, negative integers) give NaN.
pub(super) fn digamma(x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if x <= 0.0 && x == x.floor() {
        return f64::NAN;
    }
    if x < 0.0 {
        // psi(1 - x) - psi(x) = pi / tan(pi x)
        return digamma(1.0 - x) - std::f64::consts::PI / (std::f64::consts::PI * x).tan();
    }
    let mut x = x;
    let mut acc = 0.0;
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let z = 1.0 / (x * x);
    // Bernoulli terms B2k / (2k): 1/12, -1/120, 1/252, -1/240, 1/132, -691/32760, 1/12.
    let series = z
        * (1.0 / 12.0
            - z * (1.0 / 120.0
                - z * (1.0 / 252.0 - z * (1.0 / 240.0 - z * (1.0 / 132.0 - z * (691.0 / 32760.0 - z / 12.0))))));
    acc + x.ln() - 0.5 / x - series
}

/// [`digamma`] in the kernel's precision (computed in float64, rounded).
pub(super) fn psi<R: Real>(x: R) -> R {
    R::of(digamma(x.f64()))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum F {
    Erf,
    Erfinv,
    Gamma,
    Gammaln,
}

/// `f(x)` in the kernel's precision (float64 for `erfinv`).
#[inline]
fn value<R: Libm>(f: F, x: R) -> R {
    match f {
        F::Erf => x.c_erf(),
        F::Erfinv => R::of(erfinv(x.f64())),
        F::Gamma => x.c_tgamma(),
        F::Gammaln => x.c_lgamma(),
    }
}

/// `f'` at `v`, the forward input (the forward output for `erfinv`), in the kernel's
/// precision; psi in that precision too (float32 data: rounded to float32).
#[inline]
fn slope<R: Libm>(f: F, v: R) -> R {
    match f {
        F::Erf => R::of(std::f64::consts::FRAC_2_SQRT_PI) * (-(v * v)).exp(),
        F::Erfinv => R::of(0.5 * std::f64::consts::PI.sqrt()) * (v * v).exp(),
        F::Gamma => v.c_tgamma() * psi(v),
        F::Gammaln => psi(v),
    }
}

fn forward(f: F) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
            let ([x], o) = outs[0].operands::<T, 1>(0, [&ins[0]]);
            let cost = Cost::MATH;
            par_for_mut(o, 1, cost, T::DTYPE, |r, o| match x {
                Operand::Input(x) => o.iter_mut().zip(&x[r]).for_each(|(o, &v)| *o = value::<R>(f, R::load(v)).store()),
                Operand::Output => o.iter_mut().for_each(|o| *o = value::<R>(f, R::load(*o)).store()),
            });
        });
        Ok(())
    })
}

/// Backward: inputs (output gradient, the forward input, or output for `erfinv`);
/// `g * f'(v)`.
fn backward(f: F) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        if cx.req[0] == Req::Null {
            return Ok(());
        }
        dispatch_real!(ins[1].dtype, cx.attrs.op, T, R => {
            let (g, v) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
            par_for_mut(outs[0].as_mut::<T>(), 1, Cost::MATH, T::DTYPE, |r, o| {
                for ((o, &g), &v) in o.iter_mut().zip(&g[r.clone()]).zip(&v[r]) {
                    *o = (R::load(g) * slope::<R>(f, R::load(v))).store();
                }
            });
        });
        Ok(())
    })
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    /// (name, aliases, backward, function, whether the gradient reads the output, doc)
    type Def = (&'static str, &'static [&'static str], &'static str, F, bool, &'static str);
    let table: &[Def] = &[
        ("erf", &["_npx_erf"], "_backward_erf", F::Erf, false, "Returns element-wise gauss error function of the input."),
        ("erfinv", &["_npx_erfinv"], "_backward_erfinv", F::Erfinv, true, "Returns element-wise inverse gauss error function of the input."),
        ("gamma", &["_sparse_gamma", "_npx_gamma"], "_backward_gamma", F::Gamma, false, "Returns the gamma function (extension of the factorial function to the reals), computed element-wise on the input array."),
        ("gammaln", &["_sparse_gammaln", "_npx_gammaln"], "_backward_gammaln", F::Gammaln, false, "Returns element-wise log of the absolute value of the gamma function of the input."),
    ];
    for &(name, aliases, back, f, uses_output, doc) in table {
        ops.push(
            OpDef::new(name, Inputs::Fixed(&["data"]), Box::new(infer_float_like_first), forward(f))
                .alias(aliases)
                .elementwise_shape()
                .same_shape()
                .inplace(&[(0, 0)])
                .grad(Grad::Backward { op: back, inputs: !uses_output, outputs: uses_output })
                .doc(doc),
        );
        ops.push(OpDef::backward(back, &[], backward(f)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_functions_against_known_values() {
        for x in [-0.999, -0.5, 0.0, 1e-6, 0.3, 0.9, 0.999_999] {
            let y = erfinv(x);
            assert!((y.c_erf() - x).abs() < 1e-15, "erfinv({x}) = {y}");
        }
        assert_eq!(erfinv(1.0), f64::INFINITY);
        assert!(erfinv(1.5).is_nan());
        // psi(1) = -Euler's constant, psi(0.5) = -gamma - 2 ln 2, psi(-0.5) = psi(0.5) + 2
        // (the recurrence psi(x + 1) = psi(x) + 1/x at x = -0.5).
        let euler = 0.577_215_664_901_532_9;
        assert!((digamma(1.0) + euler).abs() < 1e-14);
        assert!((digamma(0.5) + euler + 2.0 * 2f64.ln()).abs() < 1e-14);
        assert!((digamma(-0.5) - (digamma(0.5) + 2.0)).abs() < 1e-12);
        assert!(digamma(-2.0).is_nan());
        assert!((5.0f64.c_tgamma() - 24.0).abs() < 1e-12 && (5.0f64.c_lgamma() - 24f64.ln()).abs() < 1e-12);
        // Gradients by central differences.
        for (f, x) in [(F::Erf, 0.4), (F::Gamma, 2.3), (F::Gammaln, 0.7)] {
            let h = 1e-6;
            let numeric = (value::<f64>(f, x + h) - value::<f64>(f, x - h)) / (2.0 * h);
            assert!((slope::<f64>(f, x) - numeric).abs() < 1e-6, "{f:?}");
        }
        let y = erfinv(0.3);
        let numeric = (erfinv(0.3 + 1e-7) - erfinv(0.3 - 1e-7)) / 2e-7;
        assert!((slope::<f64>(F::Erfinv, y) - numeric).abs() < 1e-6);
    }
}
