//! Backward operators of the unary element-wise family (see `op::grad` for the convention):
//! unary math (`_backward_sqrt`, `_backward_tanh`, ...), the scalar binary forms
//! (`_backward_mul_scalar`, `_backward_rpower_scalar`, ...), `_backward_clip`, and the copies
//! (`_backward_copy`, `_backward_negative`; the casts' are in `shape_grad`).
//!
//! Owns the derivative of each function ([`D`]): every kernel maps the output gradient `g` and
//! at most one saved tensor `v` (the forward input or output, as the forward operator's
//! declaration says) to `g * f'(.)`, computed as the forward computes (float16 in f32).
//! Piecewise-constant functions (sign, round, comparisons, ...) declare a zero gradient in
//! `elemwise` and have no kernel here; the binary same-shape and broadcast backward operators
//! are in `broadcast_grad`. Also owns these operators' own gradients (second derivatives,
//! composed of differentiable calls for `create_graph`: [`composed`]).

use super::elemwise::{Arith, Calc, ClipParams, ScalarParams, CLIP_PARAMS, SCALAR_PARAMS};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;
use crate::op::gpu::GpuKernel;
use crate::op::grad::Composed;
use crate::op::kernel::{par_for_mut, Cost};
use crate::op::param::{Attrs, ParamSpec};
use crate::op::tensor::{Elem, OutBlob, TBlob};
use crate::op::{Grad, Meta, OpCtx, OpDef, Req};

/// A derivative: `g * f'`, with `v` the saved forward input `x` or output `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum D {
    // No saved tensor.
    Neg,
    Degrees,
    Radians,
    MulScalar,
    DivScalar,
    ModScalar,
    // From the input x.
    Abs,
    Square,
    Rsqrt,
    Rcbrt,
    Expm1,
    Log,
    Log10,
    Log2,
    Log1p,
    Sin,
    Cos,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Recip,
    Softsign,
    RdivScalar,
    RmodScalar,
    PowerScalar,
    MaximumScalar,
    MinimumScalar,
    HypotScalar,
    Clip,
    // From the output y.
    Sqrt,
    Cbrt,
    Exp,
    Tan,
    Tanh,
    Relu,
    Sigmoid,
    RpowerScalar,
}

/// Backward operators: (name, derivative, the forward operator's parameters).
const TABLE: &[(&str, D, &[ParamSpec])] = &[
    ("_backward_negative", D::Neg, &[]),
    ("_backward_degrees", D::Degrees, &[]),
    ("_backward_radians", D::Radians, &[]),
    ("_backward_mul_scalar", D::MulScalar, SCALAR_PARAMS),
    ("_backward_div_scalar", D::DivScalar, SCALAR_PARAMS),
    ("_backward_mod_scalar", D::ModScalar, SCALAR_PARAMS),
    ("_backward_abs", D::Abs, &[]),
    ("_backward_square", D::Square, &[]),
    ("_backward_rsqrt", D::Rsqrt, &[]),
    ("_backward_rcbrt", D::Rcbrt, &[]),
    ("_backward_expm1", D::Expm1, &[]),
    ("_backward_log", D::Log, &[]),
    ("_backward_log10", D::Log10, &[]),
    ("_backward_log2", D::Log2, &[]),
    ("_backward_log1p", D::Log1p, &[]),
    ("_backward_sin", D::Sin, &[]),
    ("_backward_cos", D::Cos, &[]),
    ("_backward_arcsin", D::Asin, &[]),
    ("_backward_arccos", D::Acos, &[]),
    ("_backward_arctan", D::Atan, &[]),
    ("_backward_sinh", D::Sinh, &[]),
    ("_backward_cosh", D::Cosh, &[]),
    ("_backward_arcsinh", D::Asinh, &[]),
    ("_backward_arccosh", D::Acosh, &[]),
    ("_backward_arctanh", D::Atanh, &[]),
    ("_backward_reciprocal", D::Recip, &[]),
    ("_backward_softsign", D::Softsign, &[]),
    ("_backward_rdiv_scalar", D::RdivScalar, SCALAR_PARAMS),
    ("_backward_rmod_scalar", D::RmodScalar, SCALAR_PARAMS),
    ("_backward_power_scalar", D::PowerScalar, SCALAR_PARAMS),
    ("_backward_maximum_scalar", D::MaximumScalar, SCALAR_PARAMS),
    ("_backward_minimum_scalar", D::MinimumScalar, SCALAR_PARAMS),
    ("_backward_hypot_scalar", D::HypotScalar, SCALAR_PARAMS),
    ("_backward_clip", D::Clip, CLIP_PARAMS),
    ("_backward_sqrt", D::Sqrt, &[]),
    ("_backward_cbrt", D::Cbrt, &[]),
    ("_backward_exp", D::Exp, &[]),
    ("_backward_tan", D::Tan, &[]),
    ("_backward_tanh", D::Tanh, &[]),
    ("_backward_relu", D::Relu, &[]),
    ("_backward_sigmoid", D::Sigmoid, &[]),
    ("_backward_rpower_scalar", D::RpowerScalar, SCALAR_PARAMS),
];

/// `o[i] = f(g[i], v[i])` over the kernel pool.
fn map2<T: Arith>(g: &[T], v: &[T], o: &mut [T], cost: Cost, f: impl Fn(T::C, T::C) -> T::C + Sync + Send) {
    par_for_mut(o, 1, cost, T::DTYPE, |r, o| {
        for ((o, &g), &v) in o.iter_mut().zip(&g[r.clone()]).zip(&v[r]) {
            *o = T::store(f(g.load(), v.load()));
        }
    });
}

fn typed<T: Arith>(d: D, a: &Attrs, g: &[T], v: &[T], o: &mut [T]) {
    type C<T> = <T as Arith>::C;
    let c = |x: f64| C::<T>::from_f64(x);
    let (zero, one) = (C::<T>::ZERO, C::<T>::ONE);
    // The scalar as the forward used it: cast to the input dtype first.
    let s = || <T as Elem>::from_f64(ScalarParams::of(a).scalar).load();
    macro_rules! go {
        ($cost:expr, |$g:ident, $v:ident| $e:expr) => {
            map2(g, v, o, $cost, |$g, $v| $e)
        };
    }
    match d {
        D::Neg => go!(Cost::CHEAP, |g, _v| g.neg()),
        D::Degrees => {
            let k = c(180.0 / std::f64::consts::PI);
            go!(Cost::CHEAP, |g, _v| g.mul(k))
        }
        D::Radians => {
            let k = c(std::f64::consts::PI / 180.0);
            go!(Cost::CHEAP, |g, _v| g.mul(k))
        }
        D::MulScalar => {
            let s = s();
            go!(Cost::CHEAP, |g, _v| g.mul(s))
        }
        D::DivScalar => {
            let s = s();
            go!(Cost::CHEAP, |g, _v| g.div(s))
        }
        D::ModScalar => go!(Cost::CHEAP, |g, _v| g),
        D::Abs => go!(Cost::CHEAP, |g, x| if x > zero {
            g
        } else if x < zero {
            g.neg()
        } else {
            zero
        }),
        D::Square => {
            let two = c(2.0);
            go!(Cost::CHEAP, |g, x| g.mul(two).mul(x))
        }
        D::Rsqrt => {
            let h = c(-0.5);
            go!(Cost::MEDIUM, |g, x| g.mul(h).mul(x.rsqrt()).div(x))
        }
        D::Rcbrt => {
            let t = c(-1.0 / 3.0);
            go!(Cost::MATH, |g, x| g.mul(t).mul(x.rcbrt()).div(x))
        }
        D::Expm1 => go!(Cost::MATH, |g, x| g.mul(x.exp())),
        D::Log => go!(Cost::CHEAP, |g, x| g.div(x)),
        D::Log10 => {
            let k = c(std::f64::consts::LN_10);
            go!(Cost::CHEAP, |g, x| g.div(x.mul(k)))
        }
        D::Log2 => {
            let k = c(std::f64::consts::LN_2);
            go!(Cost::CHEAP, |g, x| g.div(x.mul(k)))
        }
        D::Log1p => go!(Cost::CHEAP, |g, x| g.div(one.add(x))),
        D::Sin => go!(Cost::MATH, |g, x| g.mul(x.cos())),
        D::Cos => go!(Cost::MATH, |g, x| g.mul(x.sin()).neg()),
        D::Asin => go!(Cost::MEDIUM, |g, x| g.div(one.sub(x.mul(x)).sqrt())),
        D::Acos => go!(Cost::MEDIUM, |g, x| g.div(one.sub(x.mul(x)).sqrt()).neg()),
        D::Atan => go!(Cost::CHEAP, |g, x| g.div(one.add(x.mul(x)))),
        D::Sinh => go!(Cost::MATH, |g, x| g.mul(x.cosh())),
        D::Cosh => go!(Cost::MATH, |g, x| g.mul(x.sinh())),
        D::Asinh => go!(Cost::MEDIUM, |g, x| g.div(x.mul(x).add(one).sqrt())),
        D::Acosh => go!(Cost::MEDIUM, |g, x| g.div(x.mul(x).sub(one).sqrt())),
        D::Atanh => go!(Cost::CHEAP, |g, x| g.div(one.sub(x.mul(x)))),
        D::Recip => go!(Cost::CHEAP, |g, x| g.div(x.mul(x)).neg()),
        D::Softsign => go!(Cost::CHEAP, |g, x| {
            let d = one.add(x.abs());
            g.div(d.mul(d))
        }),
        D::RdivScalar => {
            let s = s();
            go!(Cost::CHEAP, |g, x| g.mul(s).div(x.mul(x)).neg())
        }
        D::RmodScalar => {
            let s = s();
            go!(Cost::MEDIUM, |g, x| g.mul(s.div(x).floor()).neg())
        }
        D::PowerScalar => {
            let s = s();
            let s1 = s.sub(one);
            go!(Cost::MATH, |g, x| g.mul(s).mul(x.pow(s1)))
        }
        D::MaximumScalar => {
            let s = s();
            go!(Cost::CHEAP, |g, x| if x >= s { g } else { zero })
        }
        D::MinimumScalar => {
            let s = s();
            go!(Cost::CHEAP, |g, x| if x <= s { g } else { zero })
        }
        D::HypotScalar => {
            let s = s();
            go!(Cost::MEDIUM, |g, x| g.mul(x).div(x.hypot(s)))
        }
        D::Clip => {
            let p = ClipParams::of(a);
            let (lo, hi) = (<T as Elem>::from_f64(p.a_min).load(), <T as Elem>::from_f64(p.a_max).load());
            go!(Cost::CHEAP, |g, x| if x < lo || x > hi { zero } else { g })
        }
        D::Sqrt => {
            let h = c(0.5);
            go!(Cost::CHEAP, |g, y| g.mul(h).div(y))
        }
        D::Cbrt => {
            let t = c(3.0);
            go!(Cost::CHEAP, |g, y| g.div(t.mul(y).mul(y)))
        }
        D::Exp => go!(Cost::CHEAP, |g, y| g.mul(y)),
        D::Tan => go!(Cost::CHEAP, |g, y| g.mul(one.add(y.mul(y)))),
        D::Tanh => go!(Cost::CHEAP, |g, y| g.mul(one.sub(y.mul(y)))),
        // Stock's `relu_grad` is NaN at a NaN.
        D::Relu => go!(Cost::CHEAP, |g, y| if y.is_nan() {
            y
        } else if y > zero {
            g
        } else {
            zero
        }),
        D::Sigmoid => go!(Cost::CHEAP, |g, y| g.mul(y).mul(one.sub(y))),
        D::RpowerScalar => {
            let k = s().ln();
            go!(Cost::CHEAP, |g, y| g.mul(y).mul(k))
        }
    }
}

impl D {
    /// The derivative as a CUDA expression in `x` (the output gradient), `y` (the saved input
    /// or output) and `s` (the forward's scalar): the GPU form. `None`: none yet.
    fn cuda(self) -> Option<&'static str> {
        Some(match self {
            D::Neg => "-x",
            D::Degrees => "x * T(57.29577951308232)",
            D::Radians => "x * T(0.017453292519943295)",
            D::MulScalar => "x * s",
            D::DivScalar => "x / s",
            D::ModScalar => "x",
            D::Abs => "y > T(0) ? x : (y < T(0) ? -x : T(0))",
            D::Square => "x * T(2) * y",
            D::Rsqrt => "x * T(-0.5) * rsqrt(y) / y",
            D::Rcbrt => "x * T(-1.0 / 3.0) * rcbrt(y) / y",
            D::Expm1 => "x * exp(y)",
            D::Log => "x / y",
            D::Log10 => "x / (y * T(2.302585092994046))",
            D::Log2 => "x / (y * T(0.6931471805599453))",
            D::Log1p => "x / (T(1) + y)",
            D::Sin => "x * cos(y)",
            D::Cos => "-(x * sin(y))",
            D::Asin => "x / sqrt(T(1) - y * y)",
            D::Acos => "-(x / sqrt(T(1) - y * y))",
            D::Atan => "x / (T(1) + y * y)",
            D::Sinh => "x * cosh(y)",
            D::Cosh => "x * sinh(y)",
            D::Asinh => "x / sqrt(y * y + T(1))",
            D::Acosh => "x / sqrt(y * y - T(1))",
            D::Atanh => "x / (T(1) - y * y)",
            D::Recip => "-(x / (y * y))",
            D::Softsign => "x / ((T(1) + fabs(y)) * (T(1) + fabs(y)))",
            D::RdivScalar => "-(x * s / (y * y))",
            D::RmodScalar => "-(x * floor(s / y))",
            D::PowerScalar => "x * s * pow(y, s - T(1))",
            D::MaximumScalar => "y >= s ? x : T(0)",
            D::MinimumScalar => "y <= s ? x : T(0)",
            D::HypotScalar => "x * y / hypot(y, s)",
            D::Clip => return None,
            D::Sqrt => "x * T(0.5) / y",
            D::Cbrt => "x / (T(3) * y * y)",
            D::Exp => "x * y",
            D::Tan => "x * (T(1) + y * y)",
            D::Tanh => "x * (T(1) - y * y)",
            D::Relu => "y != y ? y : (y > T(0) ? x : T(0))",
            D::Sigmoid => "x * y * (T(1) - y)",
            D::RpowerScalar => "x * y * log(s)",
        })
    }
}

/// The gradient of a unary backward operator `_backward_f(g[, v]) = g * d(v)`, composed of
/// differentiable calls (stock's FGradient of these operators): by `g` it is the operator
/// itself applied to the incoming gradient `gg` (it is linear in `g`); by `v` it is
/// `gg * g * d'(v)` ([`second`]).
fn composed(cx: &Composed) -> Result<Vec<Option<NDArray>>> {
    let d = TABLE
        .iter()
        .find(|t| t.0 == cx.op.name)
        .map(|t| t.1)
        .ok_or_else(|| Error::internal(format!("{} has no derivative in the table", cx.op.name)))?;
    let (gg, g) = (&cx.ograds[0], &cx.inputs[0]);
    let v = cx.inputs.get(1);
    let mut out = vec![None; cx.inputs.len()];
    if cx.wants(0) {
        let mut args = vec![gg];
        args.extend(v);
        let like = [Meta::new(g.shape.clone(), g.dtype)];
        out[0] = cx.again(&args, &like, &[true])?.into_iter().next();
    }
    if let (Some(v), true) = (v, cx.wants(1)) {
        let p = cx.mul(gg, g)?;
        out[1] = second(d, cx, &p, v)?;
    }
    Ok(out)
}

/// `p * d'(v)`, where `d` is the derivative a backward operator multiplies by (`v`: the
/// saved input `x` or output `y`), as differentiable calls; `None` where `d'` is 0.
fn second(d: D, cx: &Composed, p: &NDArray, v: &NDArray) -> Result<Option<NDArray>> {
    // k * a^e
    let pow = |a: &NDArray, e: f64, k: f64| -> Result<NDArray> {
        let t = cx.scalar("_power_scalar", a, e)?;
        cx.scalar("_mul_scalar", &t, k)
    };
    let scale = |a: &NDArray, k: f64| cx.scalar("_mul_scalar", a, k);
    let s = || ScalarParams::of(cx.attrs).scalar;
    let f = match d {
        // Constant derivatives (radians reads its input only to keep it in the graph, as
        // stock's does, so that a third derivative is 0, not unreachable).
        D::Neg | D::Degrees | D::Radians | D::MulScalar | D::DivScalar | D::ModScalar => return Ok(None),
        D::Abs | D::MaximumScalar | D::MinimumScalar | D::Clip | D::Relu | D::RmodScalar => return Ok(None),
        // 2, times ones shaped like x, which keeps x in the graph (as stock's does): the third
        // derivative is 0, not unreachable.
        D::Square => cx.scalar("_mul_scalar", &cx.call("ones_like", &[v], &[])?, 2.0)?,
        D::Exp => return Ok(Some(p.clone())),
        D::RpowerScalar => return scale(p, s().ln()).map(Some),
        D::Rsqrt => pow(v, -2.5, 0.75)?,
        // (4/9) x^-7/3 as rcbrt(x) x^-2, real for negative x too.
        D::Rcbrt => cx.mul(&cx.call("rcbrt", &[v], &[])?, &pow(v, -2.0, 4.0 / 9.0)?)?,
        D::Expm1 => cx.call("exp", &[v], &[])?,
        D::Log => pow(v, -2.0, -1.0)?,
        D::Log10 => pow(v, -2.0, -1.0 / std::f64::consts::LN_10)?,
        D::Log2 => pow(v, -2.0, -1.0 / std::f64::consts::LN_2)?,
        D::Log1p => pow(&cx.scalar("_plus_scalar", v, 1.0)?, -2.0, -1.0)?,
        D::Sin => scale(&cx.call("sin", &[v], &[])?, -1.0)?,
        D::Cos => scale(&cx.call("cos", &[v], &[])?, -1.0)?,
        D::Sinh => cx.call("sinh", &[v], &[])?,
        D::Cosh => cx.call("cosh", &[v], &[])?,
        // x (1 - x²)^-3/2, negated for arccos.
        D::Asin | D::Acos => {
            let t = cx.scalar("_rminus_scalar", &cx.call("square", &[v], &[])?, 1.0)?;
            let k = if d == D::Asin { 1.0 } else { -1.0 };
            cx.mul(v, &pow(&t, -1.5, k)?)?
        }
        // -2x (1 + x²)^-2
        D::Atan => {
            let t = cx.scalar("_plus_scalar", &cx.call("square", &[v], &[])?, 1.0)?;
            cx.mul(v, &pow(&t, -2.0, -2.0)?)?
        }
        // -x (x² ± 1)^-3/2
        D::Asinh | D::Acosh => {
            let one = if d == D::Asinh { 1.0 } else { -1.0 };
            let t = cx.scalar("_plus_scalar", &cx.call("square", &[v], &[])?, one)?;
            cx.mul(v, &pow(&t, -1.5, -1.0)?)?
        }
        // 2x (1 - x²)^-2
        D::Atanh => {
            let t = cx.scalar("_rminus_scalar", &cx.call("square", &[v], &[])?, 1.0)?;
            cx.mul(v, &pow(&t, -2.0, 2.0)?)?
        }
        D::Recip => pow(v, -3.0, 2.0)?,
        // -2 sign(x) (1 + |x|)^-3
        D::Softsign => {
            let t = cx.scalar("_plus_scalar", &cx.call("abs", &[v], &[])?, 1.0)?;
            cx.mul(&cx.call("sign", &[v], &[])?, &pow(&t, -3.0, -2.0)?)?
        }
        D::RdivScalar => pow(v, -3.0, 2.0 * s())?,
        // s (s - 1) x^(s-2); 0 for s of 0 or 1 (not 0 · x^-2, NaN at 0).
        D::PowerScalar => {
            let s = s();
            if s * (s - 1.0) == 0.0 {
                return Ok(None);
            }
            pow(v, s - 2.0, s * (s - 1.0))?
        }
        // s² (x² + s²)^-3/2
        D::HypotScalar => {
            let s = s();
            let t = cx.scalar("_plus_scalar", &cx.call("square", &[v], &[])?, s * s)?;
            pow(&t, -1.5, s * s)?
        }
        D::Sqrt => pow(v, -2.0, -0.5)?,
        D::Cbrt => pow(v, -3.0, -2.0 / 3.0)?,
        D::Tan => scale(v, 2.0)?,
        D::Tanh => scale(v, -2.0)?,
        // 1 - 2y
        D::Sigmoid => cx.scalar("_rminus_scalar", &scale(v, 2.0)?, 1.0)?,
    };
    cx.mul(p, &f).map(Some)
}

/// The gradient of `_backward_copy(g)`, which is linear: itself on the incoming gradient,
/// back to `g`'s shape and dtype (only those of `g` are read).
fn copy_composed(cx: &Composed) -> Result<Vec<Option<NDArray>>> {
    if !cx.wants(0) {
        return Ok(vec![None]);
    }
    let g = &cx.inputs[0];
    let like = [Meta::new(g.shape.clone(), g.dtype)];
    Ok(vec![cx.again(&[&cx.ograds[0]], &like, &[true])?.into_iter().next()])
}

fn compute(name: &'static str, d: D) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| -> Result<()> {
        if cx.req[0] == Req::Null {
            return Ok(());
        }
        // Derivatives that need no saved tensor get g in its place (and ignore it).
        let v = ins.get(1).unwrap_or(&ins[0]);
        crate::dispatch_float!(outs[0].dtype, name, T => typed::<T>(d, cx.attrs, ins[0].as_slice(), v.as_slice(), outs[0].as_mut()));
        Ok(())
    })
}

/// `_backward_copy`: the output gradient converted to the input's dtype (any dtypes; the
/// shapes may differ, the sizes agree).
fn copy_back(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] != Req::Null {
        super::shape::cast_into(&ins[0], &mut outs[0]);
    }
    Ok(())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    for &(name, d, params) in TABLE {
        let mut def = OpDef::backward(name, params, compute(name, d)).grad(Grad::Composed {
            f: composed,
            inputs: true,
            outputs: false,
        });
        if let Some(e) = d.cuda() {
            // The derivatives of the scalar forms read the forward's `scalar`.
            let scalar: Option<fn(&Attrs) -> f64> = if params.first().is_some_and(|p| p.name == "scalar") {
                Some(|a| ScalarParams::of(a).scalar)
            } else {
                None
            };
            def = def.gpu(GpuKernel::MapGrad(e, scalar));
        }
        ops.push(def);
    }
    ops.push(
        OpDef::backward("_backward_copy", &[], Box::new(copy_back)).gpu(GpuKernel::CopyGrad).grad(Grad::Composed {
            f: copy_composed,
            inputs: false,
            outputs: false,
        }),
    );
}

#[cfg(test)]
mod tests {
    use crate::op::grad::check::{check, values};

    /// The GPU forms of the scalar derivatives read the forward's scalar (a form without it
    /// would compute with 0: `_backward_mul_scalar` gave zero gradients on a GPU once).
    #[test]
    fn gpu_forms_of_scalar_derivatives_read_the_scalar() {
        use crate::op::gpu::GpuKernel;
        for (name, d, params) in super::TABLE {
            let op = crate::op::lookup(name).unwrap();
            let Some(GpuKernel::MapGrad(_, scalar)) = op.gpu else {
                assert!(d.cuda().is_none(), "{name} has a derivative but no GPU form");
                continue;
            };
            let wants = params.first().is_some_and(|p| p.name == "scalar");
            assert_eq!(scalar.is_some(), wants, "{name}");
            if let Some(f) = scalar {
                // A backward call gets its forward call's parameters.
                let fwd = crate::op::lookup("_mul_scalar").unwrap();
                let attrs = fwd.parse_attrs([("scalar", "2.5")], 1).unwrap();
                assert_eq!(f(&attrs), 2.5, "{name}");
            }
        }
    }

    /// Every differentiable unary operator, with a range of inputs away from kinks and poles.
    const UNARY: &[(&str, f64, f64)] = &[
        ("negative", -2.0, 2.0),
        ("abs", 0.1, 2.0),
        ("square", -2.0, 2.0),
        ("sqrt", 0.5, 3.0),
        ("rsqrt", 0.5, 3.0),
        ("cbrt", 0.5, 3.0),
        ("rcbrt", 0.5, 3.0),
        ("exp", -2.0, 2.0),
        ("expm1", -2.0, 2.0),
        ("log", 0.5, 3.0),
        ("log10", 0.5, 3.0),
        ("log2", 0.5, 3.0),
        ("log1p", -0.5, 3.0),
        ("sin", -3.0, 3.0),
        ("cos", -3.0, 3.0),
        ("tan", -1.2, 1.2),
        ("arcsin", -0.8, 0.8),
        ("arccos", -0.8, 0.8),
        ("arctan", -3.0, 3.0),
        ("sinh", -2.0, 2.0),
        ("cosh", -2.0, 2.0),
        ("tanh", -2.0, 2.0),
        ("arcsinh", -3.0, 3.0),
        ("arccosh", 1.5, 3.0),
        ("arctanh", -0.8, 0.8),
        ("degrees", -3.0, 3.0),
        ("radians", -100.0, 100.0),
        ("reciprocal", 0.5, 3.0),
        ("sigmoid", -4.0, 4.0),
        ("softsign", 0.1, 3.0),
        ("_copy", -2.0, 2.0),
    ];

    #[test]
    fn unary() {
        for (k, &(op, lo, hi)) in UNARY.iter().enumerate() {
            check(op, &[], &[(&[3, 4], values(12, lo, hi, k as u64))], &[]);
        }
        // Negative inputs where the function is odd or even.
        for op in ["abs", "softsign", "cbrt", "square"] {
            check(op, &[], &[(&[5], values(5, -2.0, -0.1, 9))], &[]);
        }
    }

    #[test]
    fn relu() {
        // Away from the kink at 0.
        let x: Vec<f64> = values(24, -1.0, 1.0, 1).into_iter().map(|v| if v.abs() < 0.05 { 0.3 } else { v }).collect();
        check("relu", &[], &[(&[4, 6], x)], &[]);
    }

    #[test]
    fn scalar_forms() {
        let x = values(10, 0.5, 3.0, 5);
        let signed = values(10, -3.0, 3.0, 6);
        for (op, s, x) in [
            ("_plus_scalar", "1.5", &signed),
            ("_minus_scalar", "1.5", &signed),
            ("_rminus_scalar", "1.5", &signed),
            ("_mul_scalar", "-2.5", &signed),
            ("_div_scalar", "0.4", &signed),
            ("_rdiv_scalar", "-3", &x),
            ("_power_scalar", "2.5", &x),
            ("_power_scalar", "-1.5", &x),
            ("_rpower_scalar", "2.5", &signed),
            ("_rpower_scalar", "0.3", &signed),
            ("_maximum_scalar", "0.05", &signed),
            ("_minimum_scalar", "0.05", &signed),
            ("_hypot_scalar", "1.5", &signed),
        ] {
            check(op, &[("scalar", s)], &[(&[2, 5], x.clone())], &[]);
        }
        // mod: x = 4m + [0.5, 3.5] against 4 (away from the jumps); s mod x with s / x in (2, 3).
        let xm: Vec<f64> =
            values(10, 0.5, 3.5, 7).iter().enumerate().map(|(i, v)| v + 4.0 * (i as f64 - 5.0)).collect();
        check("_mod_scalar", &[("scalar", "4")], &[(&[10], xm)], &[]);
        check("_rmod_scalar", &[("scalar", "7")], &[(&[10], values(10, 2.4, 3.4, 8))], &[]);
        check("_rmod_scalar", &[("scalar", "-7")], &[(&[10], values(10, 2.4, 3.4, 8))], &[]);
    }

    #[test]
    fn clip() {
        // Both sides of both bounds, none near them.
        let x: Vec<f64> =
            values(16, -2.0, 2.0, 4).into_iter().map(|v| if (v.abs() - 1.0).abs() < 0.05 { 0.0 } else { v }).collect();
        check("clip", &[("a_min", "-1"), ("a_max", "1")], &[(&[4, 4], x)], &[]);
    }

    #[test]
    fn casts() {
        let x = values(6, -2.0, 2.0, 2);
        check("Cast", &[("dtype", "float64")], &[(&[2, 3], x.clone())], &[]);
        check("amp_cast", &[("dtype", "float64")], &[(&[2, 3], x)], &[]);
    }
}
