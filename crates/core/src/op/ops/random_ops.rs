//! Random sampling operators: `_random_{uniform, normal, gamma, exponential, poisson,
//! negative_binomial, generalized_negative_binomial, randint}`
//! (scalar parameters, a `shape`), their `_like` forms (the shape of an input), and
//! `_sample_{uniform, normal, gamma, exponential, poisson, negative_binomial,
//! generalized_negative_binomial}` (parameters given as tensors; each
//! parameter element gets `shape` samples, so the output shape is the parameter shape followed
//! by `shape`); `_sample_multinomial` (indices drawn from the probability vectors along the
//! last axis, optionally with their log probabilities, whose gradient reaches the
//! probabilities), `_shuffle` (a random permutation along the first axis) and
//! `_sample_unique_zipfian` (distinct log-uniform classes per batch row).
//!
//! Reproducibility: output element `i` is drawn from draws `2i` and `2i + 1` of the call's
//! [`Stream`] (rejection samplers seed a small per-element generator from them); a
//! multinomial sample `i` from draw `i`, a shuffle's swap at row `i` from draw `i`, and a
//! unique-Zipfian row from its own generator. Results depend only on the seed and the order
//! of calls, never on how the loop is split.

use super::common::shape_param;
use super::index::read_indices;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{dtype_from_name, op_params, Attrs, ParamSpec};
use crate::op::random::{SplitMix64, Stream};
use crate::op::tensor::{two_mut, Elem, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Req, Resource};
use crate::{dispatch_float, dispatch_num};

/// A per-element generator for samplers that need an unbounded number of draws.
type Local = SplitMix64;

/// Element `i`'s generator of stream `s`.
fn local(s: &Stream, i: u64) -> Local {
    SplitMix64(s.bits(2 * i) ^ s.bits(2 * i + 1).rotate_left(29))
}

/// Gamma(shape `a`, scale 1) by Marsaglia and Tsang's method.
fn gamma_unit(a: f64, g: &mut Local) -> f64 {
    if a < 1.0 {
        let u = 1.0 - g.uniform();
        return gamma_unit(a + 1.0, g) * u.powf(1.0 / a);
    }
    let d = a - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = g.normal();
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = g.uniform();
        if u < 1.0 - 0.0331 * x * x * x * x || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
            return d * v;
        }
    }
}

/// `ln(k!)`: exact below 10, Stirling's series above.
fn ln_factorial(k: f64) -> f64 {
    if k < 10.0 {
        (2..=k as u64).map(|j| (j as f64).ln()).sum()
    } else {
        let x = k + 1.0;
        let x3 = x * x * x;
        (x - 0.5) * x.ln() - x + 0.5 * std::f64::consts::TAU.ln() + 1.0 / (12.0 * x) - 1.0 / (360.0 * x3)
            + 1.0 / (1260.0 * x3 * x * x)
    }
}

/// Poisson(`lam`): multiplication of uniforms for small rates, Hörmann's PTRS above.
fn poisson(lam: f64, g: &mut Local) -> f64 {
    if lam <= 0.0 {
        return 0.0;
    }
    if lam < 12.0 {
        let limit = (-lam).exp();
        let (mut k, mut p) = (0.0, g.uniform());
        while p > limit {
            k += 1.0;
            p *= g.uniform();
        }
        return k;
    }
    let (slam, loglam) = (lam.sqrt(), lam.ln());
    let b = 0.931 + 2.53 * slam;
    let a = -0.059 + 0.02483 * b;
    let inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
    let vr = 0.9277 - 3.6224 / (b - 2.0);
    loop {
        let u = g.uniform() - 0.5;
        let v = g.uniform();
        let us = 0.5 - u.abs();
        let k = ((2.0 * a / us + b) * u + lam + 0.43).floor();
        if us >= 0.07 && v <= vr {
            return k;
        }
        if k < 0.0 || (us < 0.013 && v > us) {
            continue;
        }
        if v.ln() + inv_alpha.ln() - (a / (us * us) + b).ln() <= -lam + k * loglam - ln_factorial(k) {
            return k;
        }
    }
}

/// A distribution: its parameter names (stock's), defaults, a check and a sampler of element
/// `i` given the parameter values.
struct Dist {
    name: &'static str,
    arity: usize,
    check: fn(&[f64; 2]) -> std::result::Result<(), String>,
    sample: fn(&[f64; 2], &Stream, u64) -> f64,
}

const UNIFORM: Dist = Dist {
    name: "uniform",
    arity: 2,
    check: |p| if p[0] <= p[1] { Ok(()) } else { Err(format!("low ({}) must be <= high ({})", p[0], p[1])) },
    sample: |p, s, i| p[0] + (p[1] - p[0]) * s.uniform(2 * i),
};
const NORMAL: Dist = Dist {
    name: "normal",
    arity: 2,
    check: |p| if p[1] >= 0.0 { Ok(()) } else { Err(format!("scale must be non-negative, got {}", p[1])) },
    sample: |p, s, i| p[0] + p[1] * s.normal(i),
};
const GAMMA: Dist = Dist {
    name: "gamma",
    arity: 2,
    check: |p| {
        if p[0] > 0.0 && p[1] > 0.0 {
            Ok(())
        } else {
            Err(format!("alpha and beta must be positive, got {} and {}", p[0], p[1]))
        }
    },
    sample: |p, s, i| p[1] * gamma_unit(p[0], &mut local(s, i)),
};
const EXPONENTIAL: Dist = Dist {
    name: "exponential",
    arity: 1,
    check: |p| if p[0] > 0.0 { Ok(()) } else { Err(format!("lam must be positive, got {}", p[0])) },
    sample: |p, s, i| -(1.0 - s.uniform(2 * i)).ln() / p[0],
};
const POISSON: Dist = Dist {
    name: "poisson",
    arity: 1,
    check: |p| if p[0] >= 0.0 { Ok(()) } else { Err(format!("lam must be non-negative, got {}", p[0])) },
    sample: |p, s, i| poisson(p[0], &mut local(s, i)),
};

/// Negative binomial (`k` failures, success probability `p`, as stock draws it): Poisson of a
/// Gamma(`k`, scale `(1 - p) / p`) rate.
const NEG_BINOMIAL: Dist = Dist {
    name: "negative binomial",
    arity: 2,
    check: |p| {
        if p[0] >= 0.0 && p[1] > 0.0 && p[1] <= 1.0 {
            Ok(())
        } else {
            Err(format!("k must be non-negative and p in (0, 1], got {} and {}", p[0], p[1]))
        }
    },
    sample: |p, s, i| {
        let g = &mut local(s, i);
        let rate = if p[0] == 0.0 || p[1] == 1.0 { 0.0 } else { gamma_unit(p[0], g) * (1.0 - p[1]) / p[1] };
        poisson(rate, g)
    },
};
/// Generalized negative binomial (mean `mu`, dispersion `alpha`): Poisson of a
/// Gamma(`1 / alpha`, scale `alpha mu`) rate; Poisson(`mu`) for `alpha` 0.
const GEN_NEG_BINOMIAL: Dist = Dist {
    name: "generalized negative binomial",
    arity: 2,
    check: |p| {
        if p[0] >= 0.0 && p[1] >= 0.0 {
            Ok(())
        } else {
            Err(format!("mu and alpha must be non-negative, got {} and {}", p[0], p[1]))
        }
    },
    sample: |p, s, i| {
        let g = &mut local(s, i);
        let rate = if p[1] == 0.0 || p[0] == 0.0 { p[0] } else { gamma_unit(1.0 / p[1], g) * p[1] * p[0] };
        poisson(rate, g)
    },
};

/// Write `sample(params_of(i / per), stream, i)` into every element of `out`, keeping uniform
/// samples strictly below `high` after rounding to the output type.
fn fill<T: Elem>(out: &mut OutBlob, d: &Dist, s: Stream, per: usize, params: &(dyn Fn(usize) -> [f64; 2] + Sync)) {
    let cost = if matches!(d.name, "uniform" | "normal") { Cost::MATH } else { Cost(40.0) };
    let upper = d.name == "uniform";
    par_for_mut(out.as_mut::<T>(), 1, cost, T::DTYPE, |r, chunk| {
        for (k, v) in chunk.iter_mut().enumerate() {
            let i = r.start + k;
            let pv = params(i / per.max(1));
            let mut x = T::from_f64((d.sample)(&pv, &s, i as u64));
            if upper && x.to_f64() >= pv[1] && pv[1] > pv[0] {
                x = T::from_f64(pv[0]);
            }
            *v = x;
        }
    });
}

/// The dtype a `dtype` parameter of [`FLOAT_DTYPES`] names (`None`: `default`).
fn float_dtype(name: &str, default: DType) -> DType {
    match name {
        "None" => default,
        name => dtype_from_name(name).expect("enum of dtype names"),
    }
}

/// A distribution's scalar parameters (the second is 0 for one-parameter distributions),
/// checked.
fn checked(d: &Dist, a: &Attrs, p: [f64; 2]) -> Result<[f64; 2]> {
    (d.check)(&p).map_err(|m| Error::value(format!("operator {}: {m}", a.op)))?;
    Ok(p)
}

/// What a `_random_<dist>` call's parameters give: the distribution's scalars, the output
/// shape and the dtype name.
struct Draw<'a> {
    scalars: [f64; 2],
    shape: &'a [i64],
    dtype: &'a str,
}

/// Reads a `_random_<dist>` table.
type ReadDraw = for<'a> fn(&'a Attrs) -> Draw<'a>;

/// Reads a `_random_<dist>_like` table: the distribution's scalars.
type ReadScalars = fn(&Attrs) -> [f64; 2];

fn rng(cx: &OpCtx) -> Result<Stream> {
    cx.rng.ok_or_else(|| Error::internal(format!("operator {} ran without its random stream", cx.attrs.op)))
}

/// `_random_<dist>`: scalar parameters, `shape`, `ctx`, `dtype`.
fn random_op(
    d: &'static Dist,
    name: &'static str,
    alias: &'static str,
    (params, read): (&'static [ParamSpec], ReadDraw),
) -> OpDef {
    OpDef::new(
        name,
        Inputs::Fixed(&[]),
        Box::new(move |a, _| {
            let p = read(a);
            checked(d, a, p.scalars)?;
            Ok(vec![Meta::new(shape_param(a.op, "shape", p.shape)?, float_dtype(p.dtype, DType::F32))])
        }),
        Box::new(move |cx, _, outs| {
            let p = checked(d, cx.attrs, read(cx.attrs).scalars)?;
            let s = rng(cx)?;
            dispatch_float!(outs[0].dtype, cx.attrs.op, T => fill::<T>(&mut outs[0], d, s, 1, &|_| p));
            Ok(())
        }),
    )
    .alias(&[alias])
    .params(params)
    .resources(&[Resource::Random])
    .grad(Grad::None)
    .dtype_from_out()
    .doc(format!("Draw random samples from a {} distribution.", d.name))
}

/// `_random_<dist>_like`: scalar parameters, the shape and dtype of `data`.
fn like_op(d: &'static Dist, name: &'static str, (params, read): (&'static [ParamSpec], ReadScalars)) -> OpDef {
    OpDef::new(
        name,
        Inputs::Fixed(&["data"]),
        Box::new(move |a, ins| {
            checked(d, a, read(a))?;
            if !matches!(ins[0].dtype, DType::F32 | DType::F64 | DType::F16) {
                return Err(Error::type_error(format!(
                    "operator {}: data must be float16, float32 or float64, got {}",
                    a.op,
                    ins[0].dtype.name()
                )));
            }
            Ok(vec![ins[0].clone()])
        }),
        Box::new(move |cx, _, outs| {
            let p = checked(d, cx.attrs, read(cx.attrs))?;
            let s = rng(cx)?;
            dispatch_float!(outs[0].dtype, cx.attrs.op, T => fill::<T>(&mut outs[0], d, s, 1, &|_| p));
            Ok(())
        }),
    )
    .params(params)
    .resources(&[Resource::Random])
    .grad(Grad::Zero)
    .doc(format!("Draw random samples from a {} distribution according to the input array shape.", d.name))
}

/// A parameter tensor as f64 values.
fn read_f64(op: &str, b: &TBlob) -> Result<Vec<f64>> {
    dispatch_float!(b.dtype, op, T => Ok(b.as_slice::<T>().iter().map(|v| v.to_f64()).collect()))
}

/// `_sample_<dist>`: parameter tensors of one shape, `shape` samples per parameter element.
fn sample_op(d: &'static Dist, name: &'static str, alias: &'static str, inputs: &'static [&'static str]) -> OpDef {
    OpDef::new(
        name,
        Inputs::Fixed(inputs),
        Box::new(move |a, ins| {
            for (k, m) in ins.iter().enumerate() {
                if m.shape != ins[0].shape {
                    return Err(Error::value(format!(
                        "operator {}: parameter {k} has shape {:?}, expected {:?} like parameter 0",
                        a.op, m.shape, ins[0].shape
                    )));
                }
                if m.dtype != ins[0].dtype || !matches!(m.dtype, DType::F32 | DType::F64 | DType::F16) {
                    return Err(Error::type_error(format!(
                        "operator {}: parameters must share one float dtype, got {} and {}",
                        a.op,
                        ins[0].dtype.name(),
                        m.dtype.name()
                    )));
                }
            }
            let p = SampleParams::of(a);
            let mut shape = ins[0].shape.clone();
            shape.extend(shape_param(a.op, "shape", p.shape)?);
            Ok(vec![Meta::new(shape, float_dtype(p.dtype, ins[0].dtype))])
        }),
        Box::new(move |cx, ins, outs| {
            let op = cx.attrs.op;
            let cols: Vec<Vec<f64>> = ins.iter().map(|b| read_f64(op, b)).collect::<Result<_>>()?;
            let n = ins[0].size();
            let params = |j: usize| [cols[0][j], if d.arity == 2 { cols[1][j] } else { 0.0 }];
            for j in 0..n {
                (d.check)(&params(j)).map_err(|m| Error::value(format!("operator {op}: element {j}: {m}")))?;
            }
            let per = outs[0].size().checked_div(n).unwrap_or(1);
            let s = rng(cx)?;
            dispatch_float!(outs[0].dtype, op, T => fill::<T>(&mut outs[0], d, s, per, &params));
            Ok(())
        }),
    )
    .alias(&[alias])
    .params(SAMPLE_PARAMS)
    .resources(&[Resource::Random])
    .grad(Grad::None)
    .doc(format!(
        "Concurrent sampling from multiple {} distributions with parameters given by the input tensors.",
        d.name
    ))
}

const CTX_DOC: &str = "Context of output, in format [cpu|gpu|cpu_pinned](n). Only used for imperative calls.";
const FLOAT_DTYPES: &[&str] = &["None", "float16", "float32", "float64"];
const SHAPE_DOC: &str = "Shape of the output.";
const DTYPE_DOC: &str =
    "DType of the output in case this can't be inferred. Defaults to float32 if not defined (dtype=None).";
const LOW_DOC: &str = "Lower bound of the distribution.";
const HIGH_DOC: &str = "Upper bound of the distribution.";
const LAM_DOC: &str = "Lambda parameter (rate) of the distribution.";

op_params! {
    /// The `_sample_<dist>` operators' parameters.
    struct SampleParams<'a> => SAMPLE_PARAMS {
        shape: &'a [i64] = "[]", "Shape to be sampled from each random distribution.";
        dtype: &'a str = "None" in *FLOAT_DTYPES, DTYPE_DOC;
    }
}

/// Declares a `_random_<dist>` table (the distribution's scalars, then `shape`, `ctx` and
/// `dtype`) and its `_like` form (the scalars only), each with the function that reads it.
macro_rules! dist_params {
    ($draw:ident, $like:ident, $read:ident, $read_like:ident, $table:ident, $like_table:ident,
     [$($field:ident: $ty:ty = $default:literal, $doc:expr;)+]) => {
        op_params! {
            struct $draw<'a> => $table {
                $($field: $ty = $default, $doc;)+
                shape: &'a [i64] = "()", SHAPE_DOC;
                ctx: Option<Context> = "", CTX_DOC;
                dtype: &'a str = "None" in *FLOAT_DTYPES, DTYPE_DOC;
            }
        }
        op_params! {
            struct $like<'a> => $like_table {
                $($field: $ty = $default, $doc;)+
            }
        }
        fn $read(a: &Attrs) -> Draw<'_> {
            let p = $draw::of(a);
            let mut scalars = [0.0; 2];
            for (s, v) in scalars.iter_mut().zip([$(p.$field as f64),+]) {
                *s = v;
            }
            Draw { scalars, shape: p.shape, dtype: p.dtype }
        }
        fn $read_like(a: &Attrs) -> [f64; 2] {
            let p = $like::of(a);
            let mut scalars = [0.0; 2];
            for (s, v) in scalars.iter_mut().zip([$(p.$field as f64),+]) {
                *s = v;
            }
            scalars
        }
    };
}

dist_params!(UniformParams, UniformLikeParams, read_uniform, read_uniform_like, UNIFORM_PARAMS, UNIFORM_LIKE, [
    low: f64 = "0", LOW_DOC;
    high: f64 = "1", HIGH_DOC;
]);
dist_params!(NormalParams, NormalLikeParams, read_normal, read_normal_like, NORMAL_PARAMS, NORMAL_LIKE, [
    loc: f64 = "0", "Mean of the distribution.";
    scale: f64 = "1", "Standard deviation of the distribution.";
]);
dist_params!(GammaParams, GammaLikeParams, read_gamma, read_gamma_like, GAMMA_PARAMS, GAMMA_LIKE, [
    alpha: f64 = "1", "Alpha parameter (shape) of the gamma distribution.";
    beta: f64 = "1", "Beta parameter (scale) of the distribution.";
]);
dist_params!(LamParams, LamLikeParams, read_lam, read_lam_like, LAM_PARAMS, LAM_LIKE, [
    lam: f64 = "1", LAM_DOC;
]);

dist_params!(NegBinomialParams, NegBinomialLikeParams, read_nb, read_nb_like, NB_PARAMS, NB_LIKE, [
    k: i64 = "1", "Limit of unsuccessful experiments.";
    p: f64 = "1", "Failure probability in each experiment.";
]);
dist_params!(GenNegBinomialParams, GenNegBinomialLikeParams, read_gnb, read_gnb_like, GNB_PARAMS, GNB_LIKE, [
    mu: f64 = "1", "Mean of the negative binomial distribution.";
    alpha: f64 = "1", "Alpha (dispersion) parameter of the negative binomial distribution.";
]);

op_params! {
    /// `_random_randint`'s parameters.
    struct RandintParams<'a> => RANDINT_PARAMS {
        low: i64 = required, LOW_DOC;
        high: i64 = required, HIGH_DOC;
        shape: &'a [i64] = "()", SHAPE_DOC;
        ctx: Option<Context> = "", CTX_DOC;
        dtype: &'a str = "None" in ["None", "int32", "int64"], "DType of the output in case this can't be inferred. Defaults to int32 if not defined (dtype=None).";
    }
}

fn randint_bounds(a: &Attrs) -> Result<(i64, i64)> {
    let p = RandintParams::of(a);
    let (lo, hi) = (p.low, p.high);
    if lo >= hi {
        return Err(Error::value(format!("operator {}: low ({lo}) must be < high ({hi})", a.op)));
    }
    Ok((lo, hi))
}

fn randint_fill<T: Elem>(out: &mut OutBlob, s: Stream, lo: i64, hi: i64) {
    let o = out.as_mut::<T>();
    par_for_mut(o, 1, Cost::MEDIUM, T::DTYPE, |r, chunk| {
        for (k, v) in chunk.iter_mut().enumerate() {
            *v = T::from_f64(s.int_in(2 * (r.start + k) as u64, lo, hi) as f64);
        }
    });
}

fn randint_op() -> OpDef {
    OpDef::new(
        "_random_randint",
        Inputs::Fixed(&[]),
        Box::new(|a, _| {
            let (lo, hi) = randint_bounds(a)?;
            let p = RandintParams::of(a);
            let dtype = match p.dtype {
                "int64" => DType::I64,
                _ => DType::I32,
            };
            if dtype == DType::I32 && (lo < i32::MIN as i64 || hi > i32::MAX as i64 + 1) {
                return Err(Error::value(format!(
                    "operator {}: bounds [{lo}, {hi}) do not fit int32; use dtype='int64'",
                    a.op
                )));
            }
            Ok(vec![Meta::new(shape_param(a.op, "shape", p.shape)?, dtype)])
        }),
        Box::new(|cx, _, outs| {
            let (lo, hi) = randint_bounds(cx.attrs)?;
            let s = rng(cx)?;
            match outs[0].dtype {
                DType::I64 => {
                    // int_in is exact for any span; write integers without an f64 round trip.
                    let o = outs[0].as_mut::<i64>();
                    par_for_mut(o, 1, Cost::MEDIUM, DType::I64, |r, chunk| {
                        for (k, v) in chunk.iter_mut().enumerate() {
                            *v = s.int_in(2 * (r.start + k) as u64, lo, hi);
                        }
                    });
                }
                dt => dispatch_num!(dt, cx.attrs.op, T => randint_fill::<T>(&mut outs[0], s, lo, hi)),
            }
            Ok(())
        }),
    )
    .alias(&["random_randint"])
    .params(RANDINT_PARAMS)
    .resources(&[Resource::Random])
    .grad(Grad::None)
    .doc("Draw random samples from a discrete uniform distribution.")
}

op_params! {
    /// `_sample_multinomial`'s parameters.
    struct MultinomialParams<'a> => MULTINOMIAL_PARAMS {
        shape: &'a [i64] = "()", "Shape to be sampled from each random distribution.";
        get_prob: bool = "0", "Whether to also return the log probability of sampled result. This is usually used for differentiating through stochastic variables, e.g. in reinforcement learning.";
        dtype: &'a str = "int32" in ["uint8", "int32", "float16", "float32", "float64"], "DType of the output in case this can't be inferred.";
    }
}

fn multinomial_outputs(a: &Attrs) -> usize {
    1 + usize::from(MultinomialParams::of(a).get_prob)
}

/// `(distributions, categories, samples per distribution)` of a call.
fn multinomial_dims(data: &[usize], out: usize) -> (usize, usize, usize) {
    let k = data.last().copied().unwrap_or(1).max(1);
    let n = data.iter().product::<usize>() / k;
    (n, k, out.checked_div(n).unwrap_or(0))
}

fn multinomial_op() -> OpDef {
    OpDef::new(
        "_sample_multinomial",
        Inputs::Fixed(&["data"]),
        Box::new(|a, ins| {
            let p = MultinomialParams::of(a);
            let data = &ins[0];
            if !matches!(data.dtype, DType::F32 | DType::F64 | DType::F16) {
                return Err(Error::type_error(format!(
                    "operator {}: data must be float16, float32 or float64, got {}",
                    a.op,
                    data.dtype.name()
                )));
            }
            if data.shape.is_empty() || data.shape.last() == Some(&0) {
                return Err(Error::value(format!(
                    "operator {}: data must have a non-empty last axis of probabilities, got shape {:?}",
                    a.op, data.shape
                )));
            }
            let extra = shape_param(a.op, "shape", p.shape)?;
            let shape = match data.shape.len() {
                1 if extra.is_empty() => vec![1],
                1 => extra,
                n => data.shape[..n - 1].iter().copied().chain(extra).collect(),
            };
            let mut out = vec![Meta::new(shape.clone(), dtype_from_name(p.dtype).expect("enum of dtype names"))];
            if p.get_prob {
                out.push(Meta::new(shape, data.dtype));
            }
            Ok(out)
        }),
        Box::new(|cx, ins, outs| {
            let s = rng(cx)?;
            let op = cx.attrs.op;
            let probs = read_f64(op, &ins[0])?;
            let (n, k, m) = multinomial_dims(&ins[0].shape, outs[0].size());
            // Per distribution: the running sums in float64 stored as float32, as stock's
            // table; draw `j` searches it for a float32 uniform (the first sum >= it).
            let mut picks = vec![0usize; n * m];
            let mut cum = vec![0f32; k];
            for i in 0..n {
                let mut acc = 0.0;
                for (c, t) in cum.iter_mut().enumerate() {
                    acc += probs[i * k + c];
                    *t = acc as f32;
                }
                for j in 0..m {
                    let u = s.uniform_f32((i * m + j) as u64);
                    picks[i * m + j] = cum.partition_point(|&t| t < u).min(k - 1);
                }
            }
            if let Some(lp) = outs.get_mut(1) {
                let logs: Vec<f64> = picks.iter().enumerate().map(|(e, &c)| (probs[(e / m) * k + c] as f32).ln() as f64).collect();
                dispatch_float!(lp.dtype, op, T => lp.as_mut::<T>().iter_mut().zip(&logs).for_each(|(o, &v)| *o = T::from_f64(v)));
            }
            dispatch_num!(outs[0].dtype, op, T => outs[0].as_mut::<T>().iter_mut().zip(&picks).for_each(|(o, &c)| *o = T::from_f64(c as f64)));
            Ok(())
        }),
    )
    .alias(&["sample_multinomial"])
    .params(MULTINOMIAL_PARAMS)
    .outputs(multinomial_outputs, multinomial_outputs)
    .resources(&[Resource::Random])
    .grad(Grad::Backward { op: "_backward_sample_multinomial", inputs: true, outputs: true })
    .doc("Concurrent sampling from multiple multinomial distributions. *data* is an *n* dimensional array whose last dimension has length *k*, where *k* is the number of possible outcomes of each multinomial distribution; the output has shape *data.shape[:-1] + shape*, or *shape* for one distribution. With get_prob, the log probabilities of the samples are returned as well, and their head gradient (a reward) reaches *data*. The input distribution must be normalized.")
}

/// `_backward_sample_multinomial`. Inputs: the output gradients (the samples', and the log
/// probabilities' with `get_prob`), data, the samples (and log probabilities); the gradient
/// of data is `sum over draws of g / p` at each drawn category (0 without `get_prob`).
fn multinomial_backward() -> OpDef {
    OpDef::backward(
        "_backward_sample_multinomial",
        MULTINOMIAL_PARAMS,
        Box::new(|cx, ins, outs| {
            if cx.req[0] == Req::Null {
                return Ok(());
            }
            let op = cx.attrs.op;
            let get_prob = MultinomialParams::of(cx.attrs).get_prob;
            let data_at = if get_prob { 2 } else { 1 };
            let data = &ins[data_at];
            let (n, k, m) = multinomial_dims(&data.shape, ins[data_at + 1].size());
            let mut grad = vec![0f64; n * k];
            if get_prob {
                let probs = read_f64(op, data)?;
                let g = read_f64(op, &ins[1])?;
                let picks = read_indices(&ins[3]);
                for (e, (&c, &gv)) in picks.iter().zip(&g).enumerate() {
                    let at = (e / m.max(1)) * k + c.clamp(0, k as i64 - 1) as usize;
                    grad[at] += gv / probs[at];
                }
            }
            dispatch_float!(outs[0].dtype, op, T => outs[0].as_mut::<T>().iter_mut().zip(&grad).for_each(|(o, &v)| *o = T::from_f64(v)));
            Ok(())
        }),
    )
}

op_params! {
    /// `_sample_unique_zipfian`'s parameters.
    struct ZipfianParams<'a> => ZIPFIAN_PARAMS {
        range_max: i64 = required, "The number of possible classes.";
        shape: &'a [i64] = "()", "2-D shape of the output, where shape[0] is the batch size, and shape[1] is the number of candidates to sample for each batch.";
    }
}

/// `(batch, num_sampled, range_max)` of a `_sample_unique_zipfian` call, checked.
fn zipfian_dims(a: &Attrs) -> Result<(usize, usize, i64)> {
    let p = ZipfianParams::of(a);
    let shape = shape_param(a.op, "shape", p.shape)?;
    let [batch, num] = shape[..] else {
        return Err(Error::value(format!("operator {}: shape must have 2 dimensions, got {:?}", a.op, p.shape)));
    };
    if p.range_max <= 0 || num as i64 > p.range_max {
        return Err(Error::value(format!(
            "operator {}: Number of samples cannot exceed the number of possible classes (range_max {}, {num} samples)",
            a.op, p.range_max
        )));
    }
    Ok((batch, num, p.range_max))
}

/// `_sample_unique_zipfian`: per batch row, `num_sampled` distinct classes drawn from the
/// approximately log-uniform distribution `round(range_max^u) - 1` (stock's), and how many
/// draws that took.
fn unique_zipfian_op() -> OpDef {
    OpDef::new(
        "_sample_unique_zipfian",
        Inputs::Fixed(&[]),
        Box::new(|a, _| {
            let (batch, num, _) = zipfian_dims(a)?;
            Ok(vec![Meta::new(vec![batch, num], DType::I64), Meta::new(vec![batch], DType::I64)])
        }),
        Box::new(|cx, _, outs| {
            let (batch, num, range_max) = zipfian_dims(cx.attrs)?;
            let s = rng(cx)?;
            let log_range = (range_max as f64).ln();
            let (samples, tries) = two_mut(outs, 0, 1);
            let (samples, tries) = (samples.as_mut::<i64>(), tries.as_mut::<i64>());
            for row in 0..batch {
                let mut g = local(&s, row as u64);
                let mut seen = std::collections::HashSet::with_capacity(num);
                let mut n = 0i64;
                while seen.len() < num {
                    let v = (g.uniform() * log_range).exp().round() as i64 - 1;
                    if seen.insert(v) {
                        samples[row * num + seen.len() - 1] = v;
                    }
                    n += 1;
                }
                tries[row] = n;
            }
            Ok(())
        }),
    )
    .params(ZIPFIAN_PARAMS)
    .outputs(|_| 2, |_| 2)
    .resources(&[Resource::Random])
    .grad(Grad::None)
    .doc("Draw random samples from an an approximately log-uniform or Zipfian distribution without replacement: for each of shape[0] instances, shape[1] distinct classes in [0, range_max), P(class) = (log(class + 2) - log(class + 1)) / log(range_max + 1); also returns the number of trials each instance took.")
}

/// `_shuffle`: the first axis in a random order (Fisher-Yates; swap `i` with a draw in
/// `[0, i]`, from the last row down), the rest of each row unchanged.
fn shuffle_op() -> OpDef {
    OpDef::new(
        "_shuffle",
        Inputs::Fixed(&["data"]),
        Box::new(|_, ins| Ok(vec![ins[0].clone()])),
        Box::new(|cx, ins, outs| {
            let s = rng(cx)?;
            let rows = ins[0].shape.first().copied().unwrap_or(1);
            let mut order: Vec<usize> = (0..rows).collect();
            for i in (1..rows).rev() {
                order.swap(i, s.int_in(i as u64, 0, i as i64 + 1) as usize);
            }
            let from = ins[0].as_bytes();
            let row = from.len().checked_div(rows).unwrap_or(0);
            let to = outs[0].as_bytes_mut();
            if row == 0 {
                return Ok(());
            }
            par_for_mut(to, row, Cost(0.06 * row as f64), DType::U8, |r, chunk| {
                for (k, dst) in chunk.chunks_mut(row).enumerate() {
                    let src = order[r.start + k];
                    dst.copy_from_slice(&from[src * row..(src + 1) * row]);
                }
            });
            Ok(())
        }),
    )
    .alias(&["shuffle", "_npi_shuffle"])
    .resources(&[Resource::Random])
    .grad(Grad::None)
    .doc("Randomly shuffle the elements. This shuffles the array along the first axis. The order of the elements in each subarray does not change.")
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        random_op(&UNIFORM, "_random_uniform", "random_uniform", (UNIFORM_PARAMS, read_uniform)).alias(&["uniform"]),
    );
    ops.push(random_op(&NORMAL, "_random_normal", "random_normal", (NORMAL_PARAMS, read_normal)).alias(&["normal"]));
    ops.push(random_op(&GAMMA, "_random_gamma", "random_gamma", (GAMMA_PARAMS, read_gamma)));
    ops.push(random_op(&EXPONENTIAL, "_random_exponential", "random_exponential", (LAM_PARAMS, read_lam)));
    ops.push(random_op(&POISSON, "_random_poisson", "random_poisson", (LAM_PARAMS, read_lam)));
    ops.push(randint_op());
    ops.push(like_op(&UNIFORM, "_random_uniform_like", (UNIFORM_LIKE, read_uniform_like)));
    ops.push(like_op(&NORMAL, "_random_normal_like", (NORMAL_LIKE, read_normal_like)));
    ops.push(like_op(&GAMMA, "_random_gamma_like", (GAMMA_LIKE, read_gamma_like)));
    ops.push(like_op(&EXPONENTIAL, "_random_exponential_like", (LAM_LIKE, read_lam_like)));
    ops.push(like_op(&POISSON, "_random_poisson_like", (LAM_LIKE, read_lam_like)));
    ops.push(sample_op(&UNIFORM, "_sample_uniform", "sample_uniform", &["low", "high"]));
    ops.push(sample_op(&NORMAL, "_sample_normal", "sample_normal", &["mu", "sigma"]));
    ops.push(sample_op(&GAMMA, "_sample_gamma", "sample_gamma", &["alpha", "beta"]));
    ops.push(sample_op(&EXPONENTIAL, "_sample_exponential", "sample_exponential", &["lam"]));
    ops.push(sample_op(&POISSON, "_sample_poisson", "sample_poisson", &["lam"]));
    ops.push(random_op(&NEG_BINOMIAL, "_random_negative_binomial", "random_negative_binomial", (NB_PARAMS, read_nb)));
    ops.push(random_op(
        &GEN_NEG_BINOMIAL,
        "_random_generalized_negative_binomial",
        "random_generalized_negative_binomial",
        (GNB_PARAMS, read_gnb),
    ));
    ops.push(like_op(&NEG_BINOMIAL, "_random_negative_binomial_like", (NB_LIKE, read_nb_like)));
    ops.push(like_op(&GEN_NEG_BINOMIAL, "_random_generalized_negative_binomial_like", (GNB_LIKE, read_gnb_like)));
    ops.push(sample_op(&NEG_BINOMIAL, "_sample_negative_binomial", "sample_negative_binomial", &["k", "p"]));
    ops.push(sample_op(
        &GEN_NEG_BINOMIAL,
        "_sample_generalized_negative_binomial",
        "sample_generalized_negative_binomial",
        &["mu", "alpha"],
    ));
    ops.push(multinomial_op());
    ops.push(multinomial_backward());
    ops.push(shuffle_op());
    ops.push(unique_zipfian_op());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let m = xs.iter().sum::<f64>() / n;
        (m, xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
    }

    #[test]
    fn gamma_and_poisson_moments() {
        let mut g = SplitMix64(12345);
        for &a in &[0.5, 1.0, 3.0, 9.0] {
            let xs: Vec<f64> = (0..40_000).map(|_| gamma_unit(a, &mut g)).collect();
            let (m, v) = moments(&xs);
            assert!((m - a).abs() < 0.05 * a.max(1.0), "gamma({a}) mean {m}");
            assert!((v - a).abs() < 0.1 * a.max(1.0), "gamma({a}) var {v}");
        }
        for &lam in &[0.5, 4.0, 30.0, 500.0] {
            let xs: Vec<f64> = (0..40_000).map(|_| poisson(lam, &mut g)).collect();
            let (m, v) = moments(&xs);
            assert!(xs.iter().all(|&x| x >= 0.0 && x.fract() == 0.0));
            assert!((m - lam).abs() < 0.05 * lam.max(1.0), "poisson({lam}) mean {m}");
            assert!((v - lam).abs() < 0.1 * lam.max(1.0), "poisson({lam}) var {v}");
        }
    }

    #[test]
    fn negative_binomial_moments() {
        let s = Stream::for_test(7);
        for &(k, p) in &[(3.0, 0.4), (10.0, 0.8), (0.5, 0.3)] {
            let xs: Vec<f64> = (0..40_000).map(|i| (NEG_BINOMIAL.sample)(&[k, p], &s, i)).collect();
            let (m, v) = moments(&xs);
            let (em, ev) = (k * (1.0 - p) / p, k * (1.0 - p) / (p * p));
            assert!((m - em).abs() < 0.05 * em.max(1.0), "nb({k}, {p}) mean {m} vs {em}");
            assert!((v - ev).abs() < 0.1 * ev.max(1.0), "nb({k}, {p}) var {v} vs {ev}");
        }
        for &(mu, alpha) in &[(4.0, 0.5), (2.0, 0.0)] {
            let xs: Vec<f64> = (0..40_000).map(|i| (GEN_NEG_BINOMIAL.sample)(&[mu, alpha], &s, i)).collect();
            let (m, v) = moments(&xs);
            let ev = mu + alpha * mu * mu;
            assert!((m - mu).abs() < 0.05 * mu, "gnb({mu}, {alpha}) mean {m}");
            assert!((v - ev).abs() < 0.1 * ev, "gnb({mu}, {alpha}) var {v} vs {ev}");
        }
        assert_eq!((NEG_BINOMIAL.sample)(&[0.0, 0.5], &s, 3), 0.0);
        assert!((NEG_BINOMIAL.check)(&[1.0, 0.0]).is_err() && (GEN_NEG_BINOMIAL.check)(&[-1.0, 1.0]).is_err());
    }

    #[test]
    fn ln_factorial_is_continuous_at_the_switch() {
        let exact: f64 = (2..=10u64).map(|j| (j as f64).ln()).sum();
        assert!((ln_factorial(10.0) - exact).abs() < 1e-9, "{} vs {exact}", ln_factorial(10.0));
        assert_eq!(ln_factorial(0.0), 0.0);
    }
}
