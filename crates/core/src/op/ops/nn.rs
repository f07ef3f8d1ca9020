//! Neural-network operators: `Activation`, `LeakyReLU`, `softmax` / `log_softmax` /
//! `softmin`, `SoftmaxOutput`, `Dropout`, `BatchNorm` (and `_contrib_BatchNormWithReLU`),
//! `LayerNorm` and `Pooling`.
//!
//! Owns: their parameter schemas (stock names and defaults), shape/dtype inference and CPU
//! kernels. Kernels compute float16 in float32 and float32/float64 natively (the [`Real`]
//! compute type); loops over large arrays run on the kernel pool.

use super::common::norm_axis;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use crate::op::gpu::GpuKernel;
use crate::op::kernel::{par_for_mut, par_for_zip, Cost};
use crate::op::param::op_params;
use crate::op::param::Attrs;
use crate::op::tensor::{two_mut, Elem, Operand, OutBlob, TBlob};
use crate::op::{Grad, Inputs, Meta, OpCtx, OpDef, Resource};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// The type a kernel computes in (float32 for float16 and float32 data, float64 for float64).
pub(crate) trait Real:
    Copy
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    fn of(v: f64) -> Self;
    fn f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn abs(self) -> Self;
    fn max(self, o: Self) -> Self;
    #[inline(always)]
    fn load<T: Elem>(t: T) -> Self {
        Self::of(t.to_f64())
    }
    #[inline(always)]
    fn store<T: Elem>(self) -> T {
        T::from_f64(self.f64())
    }
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            #[inline(always)]
            fn of(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                if self > o || self.is_nan() {
                    self
                } else {
                    o
                }
            }
        }
    };
}
real!(f32);
real!(f64);

/// Run `$body` with `$T` the storage type and `$R` the compute type of a float dtype.
macro_rules! dispatch_real {
    ($dtype:expr, $op:expr, $T:ident, $R:ident => $body:expr) => {{
        match $dtype {
            DType::F32 => {
                type $T = f32;
                type $R = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                type $R = f64;
                $body
            }
            DType::F16 => {
                type $T = half::f16;
                type $R = f32;
                $body
            }
            other => {
                return Err(Error::type_error(format!(
                    "operator {} supports float32, float64 and float16, not {}",
                    $op,
                    other.name()
                )))
            }
        }
    }};
}
pub(super) use dispatch_real;

/// `out = f(x)` element-wise over the kernel pool; `x` may be lent to `out` (output 0) in place.
fn map<T: Elem, R: Real>(x: &TBlob, out: &mut OutBlob, cost: Cost, f: impl Fn(R) -> R + Sync + Send) {
    let ([x], o) = out.operands::<T, 1>(0, [x]);
    par_for_mut(o, 1, cost, T::DTYPE, |r, o| match x {
        Operand::Input(x) => o.iter_mut().zip(&x[r]).for_each(|(o, &v)| *o = f(R::load(v)).store()),
        Operand::Output => o.iter_mut().for_each(|o| *o = f(R::load(*o)).store()),
    });
}

pub(super) fn float_only(op: &str, d: DType) -> Result<()> {
    match d {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        other => {
            Err(Error::type_error(format!("operator {op} supports float32, float64 and float16, not {}", other.name())))
        }
    }
}

pub(super) fn infer_float_like_first(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    float_only(a.op, ins[0].dtype)?;
    Ok(vec![ins[0].clone()])
}

/// (outer, len, inner) around `axis`.
pub(super) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// Parameters read as f64 (BatchNorm's statistics, gamma/beta).
pub(super) fn read_f64(op: &str, b: &TBlob) -> Result<Vec<f64>> {
    dispatch_real!(b.dtype, op, T, _R => Ok(b.as_slice::<T>().iter().map(|v| v.to_f64()).collect()))
}

/// An output's (or mutated input's) elements as f64 (see [`read_f64`]).
pub(super) fn read_out_f64(op: &str, b: &OutBlob) -> Result<Vec<f64>> {
    dispatch_real!(b.dtype, op, T, _R => Ok(b.as_slice::<T>().iter().map(|v| v.to_f64()).collect()))
}

pub(super) fn write_f64(op: &str, b: &mut OutBlob, v: &[f64]) -> Result<()> {
    dispatch_real!(b.dtype, op, T, _R => {
        for (o, &x) in b.as_mut::<T>().iter_mut().zip(v) {
            *o = T::from_f64(x);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Activation

op_params! {
    pub(super) struct ActParams<'a> => ACT_PARAMS {
        act_type: &'a str = required in ["relu", "sigmoid", "softrelu", "softsign", "tanh"], "Activation function to be applied.";
    }
}

#[inline(always)]
fn sigmoid<R: Real>(x: R) -> R {
    R::of(1.0) / (R::of(1.0) + (-x).exp())
}

#[inline(always)]
fn softrelu<R: Real>(x: R) -> R {
    if x > R::of(20.0) {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn activation(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let act = ActParams::of(cx.attrs).act_type;
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (x, o) = (&ins[0], &mut outs[0]);
        match act {
            "relu" => map::<T, R>(x, o, Cost::CHEAP, |v| v.max(R::of(0.0))),
            "sigmoid" => map::<T, R>(x, o, Cost::MATH, sigmoid),
            "tanh" => map::<T, R>(x, o, Cost::MATH, |v| v.tanh()),
            "softrelu" => map::<T, R>(x, o, Cost::MATH, softrelu),
            _ => map::<T, R>(x, o, Cost::MEDIUM, |v| v / (R::of(1.0) + v.abs())),
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// LeakyReLU

op_params! {
    pub(super) struct LeakyParams<'a> => LEAKY_PARAMS {
        act_type: &'a str = "leaky" in ["elu", "gelu", "leaky", "prelu", "rrelu", "selu"], "Activation function to be applied.";
        slope: f64 = "0.25", "Init slope for the activation. (For leaky and elu only)";
        lower_bound: f64 = "0.125", "Lower bound of random slope. (For rrelu only)";
        upper_bound: f64 = "0.334", "Upper bound of random slope. (For rrelu only)";
    }
}

pub(super) const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
pub(super) const SELU_LAMBDA: f64 = 1.050_700_987_355_480_5;

/// erf with absolute error below 1.5e-7 (Abramowitz & Stegun 7.1.26).
pub(super) fn erf<R: Real>(x: R) -> R {
    let z = x.abs();
    let t = R::of(1.0) / (R::of(1.0) + R::of(0.327_591_1) * z);
    let poly = t
        * (R::of(0.254_829_592)
            + t * (R::of(-0.284_496_736)
                + t * (R::of(1.421_413_741) + t * (R::of(-1.453_152_027) + t * R::of(1.061_405_429)))));
    let y = R::of(1.0) - poly * (-(z * z)).exp();
    if x < R::of(0.0) {
        -y
    } else {
        y
    }
}

fn leaky_inputs(a: &Attrs) -> usize {
    let params = LeakyParams::of(a);
    if params.act_type == "prelu" {
        2
    } else {
        1
    }
}

fn leaky_outputs(a: &Attrs) -> usize {
    let params = LeakyParams::of(a);
    if params.act_type == "rrelu" {
        2
    } else {
        1
    }
}

fn leaky_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    float_only(a.op, ins[0].dtype)?;
    if ins.len() > 1 {
        PreluLayout::new(a.op, &ins[0].shape, &ins[1].shape)?;
    }
    Ok(vec![ins[0].clone(); leaky_outputs(a)])
}

/// How prelu's gamma broadcasts over the data (stock's rule): gamma's dimensions, last first,
/// match the data's axes 1 and 0 (equal, or 1 to broadcast); the other axes broadcast. So a
/// `(C,)` gamma is per channel, a `(N, C)` one per sample and channel, and a 1-D data's gamma
/// may be per element. The data is seen as `outer × chans` blocks of `inner` elements.
pub(super) struct PreluLayout {
    pub chans: usize,
    pub inner: usize,
    /// gamma's extent along data axes 0 and 1 (1: broadcast).
    g0: usize,
    g1: usize,
}

impl PreluLayout {
    pub fn new(op: &str, data: &[usize], gamma: &[usize]) -> Result<PreluLayout> {
        let mut expanded = vec![1usize; data.len()];
        let mut rest = gamma.iter().rev().peekable();
        for i in (0..data.len().min(2)).rev() {
            if let Some(&&g) = rest.peek() {
                if g == data[i] || g == 1 {
                    expanded[i] = g;
                    rest.next();
                }
            }
        }
        if rest.next().is_some() {
            return Err(Error::value(format!(
                "operator {op}: cannot broadcast gamma of shape {gamma:?} to the data's shape {data:?}"
            )));
        }
        let (g0, g1) = (expanded.first().copied().unwrap_or(1), expanded.get(1).copied().unwrap_or(1));
        let chans = data.get(1).copied().unwrap_or(1);
        Ok(PreluLayout { chans, inner: data.get(2..).map_or(1, |r| r.iter().product()), g0, g1 })
    }
    /// The gamma element of block `b` (`b = n * chans + c`).
    pub fn gamma_of(&self, b: usize) -> usize {
        let (n, c) = (b / self.chans.max(1), b % self.chans.max(1));
        (if self.g0 > 1 { n } else { 0 }) * self.g1 + if self.g1 > 1 { c } else { 0 }
    }
}

fn leaky(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let params = LeakyParams::of(a);
    let slope = params.slope;
    let (x, (o, rest)) = (&ins[0], outs.split_first_mut().expect("LeakyReLU has an output"));
    match params.act_type {
        "prelu" => {
            let gamma = read_f64(a.op, &ins[1])?;
            let layout = PreluLayout::new(a.op, &x.shape, &ins[1].shape)?;
            let inner = layout.inner;
            dispatch_real!(x.dtype, a.op, T, R => {
                let xs = x.as_slice::<T>();
                par_for_mut(o.as_mut::<T>(), inner, Cost(inner as f64 * 0.3), T::DTYPE, |r, part| {
                    for (b, ob) in r.zip(part.chunks_mut(inner.max(1))) {
                        let g = R::of(gamma[layout.gamma_of(b)]);
                        for (ov, &v) in ob.iter_mut().zip(&xs[b * inner..(b + 1) * inner]) {
                            let v = R::load(v);
                            *ov = (if v > R::of(0.0) { v } else { g * v }).store();
                        }
                    }
                });
            });
        }
        "rrelu" => {
            let (lo, hi) = (params.lower_bound, params.upper_bound);
            let train = cx.is_train;
            let rng = cx.rng.ok_or_else(|| Error::internal("LeakyReLU(rrelu) has no random stream"))?;
            dispatch_real!(x.dtype, a.op, T, R => {
                let xs = x.as_slice::<T>();
                let (ov, mv) = (o.as_mut::<T>(), rest[0].as_mut::<T>());
                for i in 0..xs.len() {
                    let s = if train { lo + (hi - lo) * rng.uniform(i as u64) } else { (lo + hi) / 2.0 };
                    let v = R::load(xs[i]);
                    ov[i] = (if v > R::of(0.0) { v } else { R::of(s) * v }).store();
                    mv[i] = T::from_f64(s);
                }
            });
        }
        kind => dispatch_real!(x.dtype, a.op, T, R => {
            let s = R::of(slope);
            let zero = R::of(0.0);
            match kind {
                "leaky" => map::<T, R>(x, o, Cost::CHEAP, |v| if v > zero { v } else { s * v }),
                "elu" => map::<T, R>(x, o, Cost::MATH, |v| if v > zero { v } else { s * v.exp_m1() }),
                "selu" => map::<T, R>(x, o, Cost::MATH, |v| {
                    R::of(SELU_LAMBDA) * if v > zero { v } else { R::of(SELU_ALPHA) * v.exp_m1() }
                }),
                _ => map::<T, R>(x, o, Cost::MATH, |v| R::of(0.5) * v * (R::of(1.0) + erf(v * R::of(std::f64::consts::FRAC_1_SQRT_2)))),
            }
        }),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// softmax, log_softmax, softmin

op_params! {
    pub(super) struct SoftmaxParams<'a> => SOFTMAX_PARAMS {
        axis: i64 = "-1", "The axis along which to compute softmax.";
        temperature: Option<f64> = "None", "Temperature parameter in softmax";
        dtype: Option<&'a str> = "None" in ["float16", "float32", "float64"], "DType of the output in case this can't be inferred. Defaults to the same as input's dtype if not defined (dtype=None).";
        use_length: Option<bool> = "False", "Whether to use the length input as a mask over the data input.";
    }
}

fn use_length(a: &Attrs) -> bool {
    let params = SoftmaxParams::of(a);
    params.use_length == Some(true)
}

fn softmax_inputs(a: &Attrs) -> usize {
    if use_length(a) {
        2
    } else {
        1
    }
}

fn softmax_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = SoftmaxParams::of(a);
    float_only(a.op, ins[0].dtype)?;
    if ins[0].shape.is_empty() {
        return Err(Error::value(format!("operator {}: data must have at least one dimension", a.op)));
    }
    let axis = norm_axis(a.op, params.axis, ins[0].shape.len())?;
    if let Some(t) = params.temperature {
        if t == 0.0 {
            return Err(Error::value(format!("operator {}: temperature must not be 0", a.op)));
        }
    }
    if ins.len() > 1 {
        let mut want = ins[0].shape.clone();
        want.remove(axis);
        if ins[1].shape != want {
            return Err(Error::value(format!(
                "operator {}: length has shape {:?}, expected {want:?}",
                a.op, ins[1].shape
            )));
        }
    }
    let dtype = match params.dtype {
        None => ins[0].dtype,
        Some(name) => crate::op::param::dtype_from_name(name).expect("enum"),
    };
    Ok(vec![Meta::new(ins[0].shape.clone(), dtype)])
}

#[derive(Clone, Copy)]
struct SoftmaxKind {
    log: bool,
    negate: bool,
    /// 1 / temperature.
    scale: f64,
}

/// Softmax over the middle axis of an (outer, len, inner) array; `lengths` (one per (outer,
/// inner) pair) masks positions at or after the length to zero.
fn softmax_kernel<T: Elem, R: Real>(
    x: &[T],
    out: &mut [T],
    (outer, len, inner): (usize, usize, usize),
    k: SoftmaxKind,
    lengths: Option<&[f64]>,
) {
    if len == 0 || outer == 0 || inner == 0 {
        return;
    }
    let scale = R::of(if k.negate { -k.scale } else { k.scale });
    let block = len * inner;
    par_for_mut(&mut out[..outer * block], block, Cost(block as f64 * 8.0), T::DTYPE, |r, part| {
        let mut mx = vec![R::of(0.0); inner];
        let mut sum = vec![R::of(0.0); inner];
        for (b, ob) in r.zip(part.chunks_mut(block)) {
            let xb = &x[b * block..(b + 1) * block];
            if let Some(lens) = lengths {
                for i in 0..inner {
                    let l = (lens[b * inner + i].max(0.0) as usize).min(len);
                    let mut m = R::of(f64::NEG_INFINITY);
                    for j in 0..l {
                        m = m.max(R::load(xb[j * inner + i]) * scale);
                    }
                    let mut s = R::of(0.0);
                    for j in 0..l {
                        s = s + (R::load(xb[j * inner + i]) * scale - m).exp();
                    }
                    for j in 0..len {
                        let v = R::load(xb[j * inner + i]) * scale - m;
                        ob[j * inner + i] = if j >= l {
                            T::zero()
                        } else if k.log {
                            (v - s.ln()).store()
                        } else {
                            (v.exp() / s).store()
                        };
                    }
                }
                continue;
            }
            mx.iter_mut().for_each(|m| *m = R::of(f64::NEG_INFINITY));
            sum.iter_mut().for_each(|s| *s = R::of(0.0));
            for row in xb.chunks_exact(inner) {
                for (m, &v) in mx.iter_mut().zip(row) {
                    *m = m.max(R::load(v) * scale);
                }
            }
            for (orow, row) in ob.chunks_exact_mut(inner).zip(xb.chunks_exact(inner)) {
                for (((ov, &v), &m), s) in orow.iter_mut().zip(row).zip(&mx).zip(sum.iter_mut()) {
                    let e = (R::load(v) * scale - m).exp();
                    *s = *s + e;
                    if !k.log {
                        *ov = e.store();
                    }
                }
            }
            if k.log {
                let lsum: Vec<R> = sum.iter().map(|s| s.ln()).collect();
                for (orow, row) in ob.chunks_exact_mut(inner).zip(xb.chunks_exact(inner)) {
                    for (((ov, &v), &m), &ls) in orow.iter_mut().zip(row).zip(&mx).zip(&lsum) {
                        *ov = (R::load(v) * scale - m - ls).store();
                    }
                }
            } else {
                let inv: Vec<R> = sum.iter().map(|&s| R::of(1.0) / s).collect();
                for orow in ob.chunks_exact_mut(inner) {
                    for (ov, &iv) in orow.iter_mut().zip(&inv) {
                        *ov = (R::load(*ov) * iv).store();
                    }
                }
            }
        }
    });
}

/// Softmax of `x` into `out` (whose dtype may differ) over `dims`.
fn softmax_into(
    op: &str,
    x: &TBlob,
    out: &mut OutBlob,
    dims: (usize, usize, usize),
    k: SoftmaxKind,
    lengths: Option<&[f64]>,
) -> Result<()> {
    if x.dtype == DType::F32 && out.dtype == DType::F32 && super::common::safe_accumulation()? {
        // MXNET_SAFE_ACCUMULATION: float32 accumulates in float64.
        softmax_kernel::<f32, f64>(x.as_slice::<f32>(), out.as_mut::<f32>(), dims, k, lengths);
    } else if x.dtype == out.dtype {
        dispatch_real!(x.dtype, op, T, R => softmax_kernel::<T, R>(x.as_slice::<T>(), out.as_mut::<T>(), dims, k, lengths));
    } else {
        let xv = read_f64(op, x)?;
        let mut ov = vec![0.0f64; xv.len()];
        softmax_kernel::<f64, f64>(&xv, &mut ov, dims, k, lengths);
        write_f64(op, out, &ov)?;
    }
    Ok(())
}

fn softmax_family(log: bool, negate: bool) -> crate::op::ComputeFn {
    Box::new(move |cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]| {
        let a = cx.attrs;
        let params = SoftmaxParams::of(a);
        let axis = norm_axis(a.op, params.axis, ins[0].ndim())?;
        let scale = 1.0 / params.temperature.unwrap_or(1.0);
        let lengths = if ins.len() > 1 {
            let l = &ins[1];
            Some(crate::dispatch_all!(l.dtype, T => l.as_slice::<T>().iter().map(|v| v.to_f64()).collect::<Vec<f64>>()))
        } else {
            None
        };
        softmax_into(
            a.op,
            &ins[0],
            &mut outs[0],
            split_at_axis(&ins[0].shape, axis),
            SoftmaxKind { log, negate, scale },
            lengths.as_deref(),
        )
    })
}

// ---------------------------------------------------------------------------------------------
// SoftmaxOutput

op_params! {
    pub(super) struct SoftmaxOutputParams<'a> => SOFTMAX_OUTPUT_PARAMS {
        grad_scale: f64 = "1", "Scales the gradient by a float factor.";
        ignore_label: f64 = "-1", "The instances whose `labels` == `ignore_label` will be ignored during backward, if `use_ignore` is set to ``true``).";
        multi_output: bool = "False", "If set to ``true``, the softmax function will be computed along axis ``1``.";
        use_ignore: bool = "False", "If set to ``true``, the `ignore_label` value will not contribute to the backward gradient.";
        preserve_shape: bool = "False", "If set to ``true``, the softmax function will be computed along the last axis (``-1``).";
        normalization: &'a str = "null" in ["batch", "null", "valid"], "Normalizes the gradient.";
        out_grad: bool = "False", "Multiplies gradient with output gradient element-wise.";
        smooth_alpha: f64 = "0", "Constant for computing a label smoothed version of cross-entropyfor the backwards pass.";
    }
}

pub(super) fn softmax_output_dims(a: &Attrs, shape: &[usize]) -> (usize, usize, usize) {
    let params = SoftmaxOutputParams::of(a);
    let n = shape.first().copied().unwrap_or(1);
    if params.multi_output && shape.len() > 1 {
        split_at_axis(shape, 1)
    } else if params.preserve_shape {
        split_at_axis(shape, shape.len() - 1)
    } else {
        (n, shape[1..].iter().product(), 1)
    }
}

/// The label's shape from the data's when it is not given (stock's rule): with
/// `multi_output`, `(N, size / N / C)` (unknown while a dimension is), else the data's shape
/// without its last axis.
fn softmax_output_label_shape(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    if data.len() < 2 {
        return Ok(vec![]);
    }
    let label = if SoftmaxOutputParams::of(a).multi_output {
        let rest = if data.iter().all(|&d| d > 0) { data[2..].iter().product() } else { -1 };
        vec![data[0], rest]
    } else {
        data[..data.len() - 1].to_vec()
    };
    Ok(vec![(1, label)])
}

fn softmax_output_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = SoftmaxOutputParams::of(a);
    float_only(a.op, ins[0].dtype)?;
    let d = &ins[0].shape;
    if d.is_empty() {
        return Err(Error::value(format!("operator {}: data must have at least one dimension", a.op)));
    }
    let l = &ins[1].shape;
    let ok = if params.multi_output && d.len() > 1 {
        let mut want = vec![d[0]];
        want.extend_from_slice(&d[2..]);
        *l == want || ins[1].size() == want.iter().product::<usize>() || *l == *d
    } else if params.preserve_shape {
        *l == d[..d.len() - 1] || *l == *d
    } else {
        (l.first() == d.first() && ins[1].size() == d[0]) || *l == *d
    };
    if !ok {
        return Err(Error::value(format!("operator {}: label shape {l:?} does not fit data shape {d:?}", a.op)));
    }
    Ok(vec![ins[0].clone()])
}

fn softmax_output(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let dims = softmax_output_dims(cx.attrs, &ins[0].shape);
    softmax_into(cx.attrs.op, &ins[0], &mut outs[0], dims, SoftmaxKind { log: false, negate: false, scale: 1.0 }, None)
}

// ---------------------------------------------------------------------------------------------
// Dropout

op_params! {
    pub(super) struct DropoutParams<'a> => DROPOUT_PARAMS {
        p: f64 = "0.5", "Fraction of the input that gets dropped out during training time.";
        mode: &'a str = "training" in ["always", "training"], "Whether to only turn on dropout during training or to also turn on for inference.";
        axes: &'a [i64] = "[]", "Axes for variational dropout kernel.";
        cudnn_off: Option<bool> = "False", "Whether to turn off cudnn in dropout operator. This option is ignored if axes is specified.";
    }
}

fn two(_: &Attrs) -> usize {
    2
}
fn one(_: &Attrs) -> usize {
    1
}

fn dropout_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = DropoutParams::of(a);
    float_only(a.op, ins[0].dtype)?;
    let p = params.p;
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::value(format!("operator {}: p must be in [0, 1], got {p}", a.op)));
    }
    for &ax in params.axes {
        norm_axis(a.op, ax, ins[0].shape.len())?;
    }
    Ok(vec![ins[0].clone(), ins[0].clone()])
}

fn dropout(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let params = DropoutParams::of(a);
    let p = params.p;
    let apply = (params.mode == "always" || cx.is_train) && p > 0.0;
    let x = &ins[0];
    let (o, m) = two_mut(outs, 0, 1);
    let shape = &x.shape;
    // The mask's own shape: size 1 along the variational axes.
    let mut mshape = shape.clone();
    for &ax in params.axes {
        mshape[norm_axis(a.op, ax, shape.len())?] = 1;
    }
    let pkeep = 1.0 - p;
    // As stock: the mask is `keep · (1 / pkeep)`, so p = 1 gives 0 · inf = NaN everywhere.
    let scale = 1.0 / pkeep;
    let rng = cx.rng;
    dispatch_real!(x.dtype, a.op, T, R => {
        let (xs, os, ms) = (x.as_slice::<T>(), o.as_mut::<T>(), m.as_mut::<T>());
        if !apply {
            os.copy_from_slice(xs);
            ms.fill(T::one());
            return Ok(());
        }
        let rng = rng.ok_or_else(|| Error::internal("Dropout has no random stream"))?;
        let msize: usize = mshape.iter().product();
        let small: Vec<R> = (0..msize).map(|i| R::of(if (rng.uniform(i as u64)) < pkeep { 1.0 } else { 0.0 }) * R::of(scale)).collect();
        // Strides of the mask shape (0 along broadcast axes).
        let nd = shape.len();
        let mut mstride = vec![0usize; nd];
        let mut acc = 1;
        for d in (0..nd).rev() {
            mstride[d] = if mshape[d] == 1 { 0 } else { acc };
            acc *= mshape[d];
        }
        let mut idx = vec![0usize; nd];
        for i in 0..xs.len() {
            let mi: usize = idx.iter().zip(&mstride).map(|(a, b)| a * b).sum();
            let mv = small[mi];
            ms[i] = mv.store();
            os[i] = (R::load(xs[i]) * mv).store();
            for d in (0..nd).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// BatchNorm

op_params! {
    pub(super) struct BnParams<'a> => BN_PARAMS {
        eps: f64 = "0.001", "Epsilon to prevent div 0. Must be no less than CUDNN_BN_MIN_EPSILON defined in cudnn.h when using cudnn (usually 1e-5)";
        momentum: f64 = "0.9", "Momentum for moving average";
        fix_gamma: bool = "True", "Fix gamma while training";
        use_global_stats: bool = "False", "Whether use global moving statistics instead of local batch-norm. This will force change batch-norm into a scale shift operator.";
        output_mean_var: bool = "False", "Output the mean and inverse std ";
        axis: i64 = "1", "Specify which shape axis the channel is specified";
        cudnn_off: bool = "False", "Do not select CUDNN operator, if available";
        min_calib_range: Option<f64> = "None", "The minimum scalar value in the form of float32 obtained through calibration.";
        max_calib_range: Option<f64> = "None", "The maximum scalar value in the form of float32 obtained through calibration.";
    }
}

fn three(_: &Attrs) -> usize {
    3
}
/// BatchNorm's and LayerNorm's visible outputs (both tables declare `output_mean_var`).
fn bn_visible(a: &Attrs) -> usize {
    let with_stats =
        if a.declares(LN_PARAMS) { LnParams::of(a).output_mean_var } else { BnParams::of(a).output_mean_var };
    if with_stats {
        3
    } else {
        1
    }
}

fn bn_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = BnParams::of(a);
    let op = a.op;
    float_only(op, ins[0].dtype)?;
    if ins[0].shape.is_empty() {
        return Err(Error::value(format!("operator {op}: data must have at least one dimension")));
    }
    let axis = norm_axis(op, params.axis, ins[0].shape.len())?;
    let c = ins[0].shape[axis];
    let pdtype = ins[1].dtype;
    for (i, name) in [(1, "gamma"), (2, "beta"), (3, "moving_mean"), (4, "moving_var")] {
        if ins[i].shape != [c] {
            return Err(Error::value(format!("operator {op}: {name} has shape {:?}, expected ({c},)", ins[i].shape)));
        }
        if ins[i].dtype != pdtype || !(pdtype == ins[0].dtype || (ins[0].dtype == DType::F16 && pdtype == DType::F32)) {
            return Err(Error::type_error(format!(
                "operator {op}: {name} has dtype {}, expected {} (float32 parameters are accepted for float16 data)",
                ins[i].dtype.name(),
                ins[0].dtype.name()
            )));
        }
    }
    let stat = Meta::new(vec![c], pdtype);
    Ok(vec![ins[0].clone(), stat.clone(), stat])
}

/// `_contrib_BatchNormWithReLU`: BatchNorm, then the ReLU in place on its output.
fn batch_norm_relu(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    batch_norm(cx, ins, outs)?;
    let op = cx.attrs.op;
    dispatch_real!(outs[0].dtype, op, T, _R => {
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::CHEAP, T::DTYPE, |_, part| {
            for v in part.iter_mut() {
                // max(x, 0) with NaN to 0, as stock's relu.
                if (*v).partial_cmp(&T::zero()) != Some(std::cmp::Ordering::Greater) {
                    *v = T::zero();
                }
            }
        });
    });
    Ok(())
}

/// BatchNorm's per-channel `(scale, shift)`: `out = x · scale + shift` with
/// `scale = gamma / sqrt(var + eps)`, `shift = beta - mean · scale` (in float64; the
/// kernel and a convolution's fused step apply them in the data's compute type).
pub(super) fn bn_scale_shift(gamma: &[f64], beta: &[f64], mean: &[f64], var: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let scale: Vec<f64> = gamma.iter().zip(var).map(|(g, v)| g * (1.0 / (v + eps).sqrt())).collect();
    let shift = beta.iter().zip(mean).zip(&scale).map(|((b, m), s)| b - m * s).collect();
    (scale, shift)
}

/// BatchNorm's part in inference fusion: a scale step on the channel axis 1, without
/// visible statistics.
fn bn_fusion(a: &Attrs) -> Option<crate::op::Fusion> {
    let p = BnParams::of(a);
    (p.axis == 1 && !p.output_mean_var).then_some(crate::op::Fusion::Step(crate::op::FuseStep::Scale {
        eps: p.eps,
        fix_gamma: p.fix_gamma,
        global: p.use_global_stats,
    }))
}

/// BatchNorm with its moving statistics heading a fused chain of element-wise steps (ReLU,
/// clip; see [`crate::op::Fusion`]): `ins` are its five inputs, `outs` its output, then its
/// moving statistics (lent to the call, as the unfused call's). Each output plane gets the
/// unfused kernel's `x · scale + shift` in float32, then the steps with the arithmetic of
/// the operators they replace, while it is in cache. Float32 only: the executor fuses
/// nothing else.
pub(in crate::op) fn fused_batch_norm(
    cx: &OpCtx,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    steps: &[crate::op::FuseStep],
) -> Result<()> {
    use crate::op::FuseStep;
    let op = cx.attrs.op;
    let elementwise = steps.iter().all(|s| matches!(s, FuseStep::Relu | FuseStep::Clip { .. }));
    if ins.len() != 5 || outs.len() != 3 || !elementwise || ins[0].dtype != DType::F32 {
        return Err(Error::internal("a fused BatchNorm takes float32 data, its five inputs and element-wise steps"));
    }
    let params = BnParams::of(cx.attrs);
    let (outer, c, inner) = split_at_axis(&ins[0].shape, norm_axis(op, params.axis, ins[0].ndim())?);
    if params.output_mean_var || params.axis != 1 || (cx.is_train && !params.use_global_stats) {
        return Err(Error::internal("a fused BatchNorm normalizes axis 1 by its moving statistics"));
    }
    let gamma = if params.fix_gamma { vec![1.0; c] } else { read_f64(op, &ins[1])? };
    let beta = read_f64(op, &ins[2])?;
    let (mean, var) = (read_out_f64(op, &outs[1])?, read_out_f64(op, &outs[2])?);
    if [gamma.len(), beta.len(), mean.len(), var.len()] != [c; 4] || outs[0].size() != outer * c * inner {
        return Err(Error::internal("a fused BatchNorm got inputs of other shapes"));
    }
    let (scale, shift) = bn_scale_shift(&gamma, &beta, &mean, &var, params.eps);
    let post = super::conv::Post::elementwise(steps, c, inner);
    scale_planes::<f32, f32>(ins[0].as_slice(), outs[0].as_mut(), (c, inner), (&scale, &shift), &post, 0.5);
    Ok(())
}

/// BatchNorm's output: each plane of `inner` elements of channel `b % c` gets
/// `x · scale + shift` in `R`, then `post`'s steps, split over the threads by planes
/// (`cost` per element).
fn scale_planes<T: Elem, R: Real>(
    xs: &[T],
    out: &mut [T],
    (c, inner): (usize, usize),
    (scale, shift): (&[f64], &[f64]),
    post: &super::conv::Post<T>,
    cost: f64,
) {
    par_for_mut(out, inner, Cost(inner as f64 * cost), T::DTYPE, |r, o| {
        for (ob, b) in o.chunks_mut(inner.max(1)).zip(r) {
            let ch = b % c;
            let (sc, sh) = (R::of(scale[ch]), R::of(shift[ch]));
            for (ov, &v) in ob.iter_mut().zip(&xs[b * inner..(b + 1) * inner]) {
                *ov = (R::load(v) * sc + sh).store();
            }
            post.apply::<R>(ob, b / c, ch, 0);
        }
    });
}

fn batch_norm(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let op = a.op;
    let x = &ins[0];
    let params = BnParams::of(a);
    let axis = norm_axis(op, params.axis, x.ndim())?;
    let (outer, c, inner) = split_at_axis(&x.shape, axis);
    let eps = params.eps;
    let gamma = if params.fix_gamma { vec![1.0; c] } else { read_f64(op, &ins[1])? };
    let beta = read_f64(op, &ins[2])?;
    let training = cx.is_train && !params.use_global_stats;
    let (mean, var) = if training {
        let mut mean = vec![0.0; c];
        let mut var = vec![0.0; c];
        let n = (outer * inner).max(1) as f64;
        dispatch_real!(x.dtype, op, T, _R => {
            let xs = x.as_slice::<T>();
            par_for_zip(&mut mean, [&mut var], Cost(inner as f64 * outer as f64 * 2.0), T::DTYPE, |r, ms, [vs]| {
                for (j, ch) in r.enumerate() {
                    let (mut s, mut s2) = (0.0f64, 0.0f64);
                    for o in 0..outer {
                        let base = (o * c + ch) * inner;
                        s += xs[base..base + inner].iter().map(|v| v.to_f64()).sum::<f64>();
                    }
                    let m = s / n;
                    for o in 0..outer {
                        let base = (o * c + ch) * inner;
                        s2 += xs[base..base + inner].iter().map(|v| (v.to_f64() - m) * (v.to_f64() - m)).sum::<f64>();
                    }
                    ms[j] = m;
                    vs[j] = s2 / n;
                }
            });
        });
        // The moving statistics (mutated inputs 3 and 4, writable blobs 3 and 4) are updated
        // by the backward pass, as in stock 1.9.1: a forward without a backward leaves them.
        (mean, var)
    } else {
        (read_out_f64(op, &outs[3])?, read_out_f64(op, &outs[4])?)
    };
    let invstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    write_f64(op, &mut outs[1], &mean)?;
    write_f64(op, &mut outs[2], &invstd)?;
    // out = x * scale + shift per channel.
    let (scale, shift) = bn_scale_shift(&gamma, &beta, &mean, &var, eps);
    dispatch_real!(x.dtype, op, T, R => {
        let post = super::conv::Post::none();
        scale_planes::<T, R>(x.as_slice(), outs[0].as_mut(), (c, inner), (&scale, &shift), &post, 0.3);
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

op_params! {
    pub(super) struct LnParams<'a> => LN_PARAMS {
        axis: i64 = "-1", "The axis to perform layer normalization. Usually, this should be be axis of the channel dimension. Negative values means indexing from right to left.";
        eps: f64 = "9.99999975e-06", "An `epsilon` parameter to prevent division by 0.";
        output_mean_var: bool = "False", "Output the mean and std calculated along the given axis.";
    }
}

fn ln_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = LnParams::of(a);
    let op = a.op;
    float_only(op, ins[0].dtype)?;
    if ins[0].shape.is_empty() {
        return Err(Error::value(format!("operator {op}: data must have at least one dimension")));
    }
    let axis = norm_axis(op, params.axis, ins[0].shape.len())?;
    let c = ins[0].shape[axis];
    for (i, name) in [(1, "gamma"), (2, "beta")] {
        if ins[i].shape != [c] || ins[i].dtype != ins[0].dtype {
            return Err(Error::value(format!(
                "operator {op}: {name} has shape {:?} {}, expected ({c},) {}",
                ins[i].shape,
                ins[i].dtype.name(),
                ins[0].dtype.name()
            )));
        }
    }
    let mut stat = ins[0].shape.clone();
    stat[axis] = 1;
    let stat = Meta::new(stat, ins[0].dtype);
    Ok(vec![ins[0].clone(), stat.clone(), stat])
}

fn layer_norm(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let x = &ins[0];
    let params = LnParams::of(a);
    let axis = norm_axis(a.op, params.axis, x.ndim())?;
    let (outer, len, inner) = split_at_axis(&x.shape, axis);
    // Stock's LayerNormParam holds eps as a float32 (float64 data sees the rounded value).
    let eps = params.eps as f32 as f64;
    let gamma = read_f64(a.op, &ins[1])?;
    let beta = read_f64(a.op, &ins[2])?;
    dispatch_real!(x.dtype, a.op, T, _R => {
        let xs = x.as_slice::<T>();
        // Mean and standard deviation of each (outer, inner) group, then the normalized
        // output block by block (each outer block owned by one task).
        let groups = outer * inner;
        let (mut means, mut sds) = (vec![0.0f64; groups], vec![0.0f64; groups]);
        par_for_zip(&mut means, [&mut sds], Cost(len as f64 * 2.0), T::DTYPE, |r, ms, [ss]| {
            for ((g, m), sd) in r.zip(ms.iter_mut()).zip(ss.iter_mut()) {
                let (o, i) = (g / inner, g % inner);
                let at = |j: usize| (o * len + j) * inner + i;
                *m = (0..len).map(|j| xs[at(j)].to_f64()).sum::<f64>() / len.max(1) as f64;
                let v = (0..len).map(|j| (xs[at(j)].to_f64() - *m).powi(2)).sum::<f64>() / len.max(1) as f64;
                *sd = (v + eps).sqrt();
            }
        });
        let block = len * inner;
        par_for_mut(outs[0].as_mut::<T>(), block, Cost(block as f64), T::DTYPE, |r, part| {
            for (o, ob) in r.zip(part.chunks_mut(block.max(1))) {
                for i in 0..inner {
                    let (m, sd) = (means[o * inner + i], sds[o * inner + i]);
                    for j in 0..len {
                        let at = j * inner + i;
                        ob[at] = T::from_f64((xs[o * block + at].to_f64() - m) / sd * gamma[j] + beta[j]);
                    }
                }
            }
        });
        for (d, &m) in outs[1].as_mut::<T>().iter_mut().zip(&means) {
            *d = T::from_f64(m);
        }
        for (d, &sd) in outs[2].as_mut::<T>().iter_mut().zip(&sds) {
            *d = T::from_f64(sd);
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Pooling

op_params! {
    pub(super) struct PoolParams<'a> => POOL_PARAMS {
        kernel: &'a [i64] = "[]", "Pooling kernel size: (y, x) or (d, y, x)";
        pool_type: &'a str = "max" in ["avg", "lp", "max", "sum"], "Pooling type to be applied.";
        global_pool: bool = "False", "Ignore kernel size, do global pooling based on current input feature map. ";
        cudnn_off: bool = "False", "Turn off cudnn pooling and use MXNet pooling operator. ";
        pooling_convention: &'a str = "valid" in ["full", "same", "valid"], "Pooling convention to be applied.";
        stride: &'a [i64] = "[]", "Stride: for pooling (y, x) or (d, y, x). Defaults to 1 for each dimension.";
        pad: &'a [i64] = "[]", "Pad for pooling: (y, x) or (d, y, x). Defaults to no padding.";
        p_value: Option<i64> = "None", "Value of p for Lp pooling, can be 1 or 2, required for Lp Pooling.";
        count_include_pad: Option<bool> = "None", "Only used for AvgPool, specify whether to count padding elements for averagecalculation. For example, with a 5*5 kernel on a 3*3 corner of a image,the sum of the 9 valid elements will be divided by 25 if this is set to true,or it will be divided by 9 if this is set to false. Defaults to true.";
        layout: Option<&'a str> = "None" in ["NCDHW", "NCHW", "NCW", "NDHWC", "NHWC", "NWC"], "Set layout for input and output. Empty for\n    default layout: NCW for 1d, NCHW for 2d and NCDHW for 3d.";
    }
}

/// A pooling problem over up to three spatial dimensions (leading ones padded with size 1).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PoolPlan {
    pub(super) input: [usize; 3],
    pub(super) output: [usize; 3],
    pub(super) kernel: [usize; 3],
    pub(super) stride: [usize; 3],
    pub(super) pad: [usize; 3],
    /// Output shape of the operator.
    out_shape: Vec<usize>,
    /// Channel-last data (`NWC`, `NHWC`, `NDHWC`): the kernels pool a channel-first copy.
    pub(super) channels_last: bool,
}

/// The axis orders between channel-last `(N, *spatial, C)` and channel-first `(N, C,
/// *spatial)` data of rank `nd`: (to channel-first, back to channel-last).
pub(super) fn channel_perms(nd: usize) -> (Vec<usize>, Vec<usize>) {
    let to_first = std::iter::once(0).chain(std::iter::once(nd - 1)).chain(1..nd - 1).collect();
    let to_last = std::iter::once(0).chain(2..nd).chain(std::iter::once(1)).collect();
    (to_first, to_last)
}

/// `src` (of `shape`, row-major) with its axes permuted: axis `i` of the result is axis
/// `perm[i]` of `src`.
pub(super) fn permuted<T: Copy>(src: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let nd = shape.len();
    let mut st = vec![1usize; nd];
    for i in (0..nd.saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1];
    }
    let oshape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let ost: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let mut out = Vec::with_capacity(src.len());
    let (mut idx, mut off) = (vec![0usize; nd], 0usize);
    for _ in 0..src.len() {
        out.push(src[off]);
        for d in (0..nd).rev() {
            idx[d] += 1;
            off += ost[d];
            if idx[d] < oshape[d] {
                break;
            }
            off -= ost[d] * oshape[d];
            idx[d] = 0;
        }
    }
    out
}

impl PoolPlan {
    /// Whether this is 2-D pooling whose windows all lie inside the input (no padding, none
    /// clipped): the case [`max_pool_2x2`] and the max-pooling gradient handle without
    /// bounds checks.
    pub(super) fn unclipped_2d(&self) -> bool {
        let [id, ih, iw] = self.input;
        let [_, oh, ow] = self.output;
        id == 1
            && self.kernel[0] == 1
            && self.pad == [0; 3]
            && (oh - 1) * self.stride[1] + self.kernel[1] <= ih
            && (ow - 1) * self.stride[2] + self.kernel[2] <= iw
    }
}

/// 2-D max pooling of tiling 2×2 windows when [`PoolPlan::unclipped_2d`], over zipped
/// chunks (no bounds checks in the loop; 1.0 → 0.46 ms on 64×20×24×24); folded in
/// [`pool_plane`]'s order, so results are identical.
fn max_pool_2x2<T: Elem, R: Real>(x: &[T], o: &mut [T], p: &PoolPlan) {
    let ([_, _, iw], [_, oh, ow]) = (p.input, p.output);
    for (oy, orow) in o.chunks_exact_mut(ow).take(oh).enumerate() {
        let at = 2 * oy * iw;
        let (x0, x1) = (&x[at..at + 2 * ow], &x[at + iw..at + iw + 2 * ow]);
        for (ov, (a, b)) in orow.iter_mut().zip(x0.chunks_exact(2).zip(x1.chunks_exact(2))) {
            let acc = R::of(f64::NEG_INFINITY).max(R::load(a[0])).max(R::load(a[1]));
            *ov = acc.max(R::load(b[0])).max(R::load(b[1])).store();
        }
    }
}

/// 2-D max pooling of one plane (padded and clipped windows too) in two passes: each input
/// row's windows along x into `h` (input rows × output columns), then each output's window
/// rows of `h`, a whole output row at a time. Max is separable, and this order keeps
/// [`pool_plane`]'s result to the bit: [`Real::max`] keeps the first NaN, and of equal values
/// (+0 and -0) the last in row-major order, which is the last of the last row that holds
/// one. ResNet's 3×3/2 padded pooling of 64×112×112: 1.1 → 0.3 ms (the one-pass fold is a
/// chain of nine dependent maxima per output; the passes are independent lanes).
fn max_pool_separable<T: Elem, R: Real>(x: &[T], o: &mut [T], p: &PoolPlan, h: &mut Vec<R>) {
    let ([_, ih, iw], [_, oh, ow]) = (p.input, p.output);
    let (kh, kw, sh, sw, ph, pw) = (p.kernel[1], p.kernel[2], p.stride[1], p.stride[2], p.pad[1], p.pad[2]);
    let ninf = R::of(f64::NEG_INFINITY);
    h.clear();
    h.resize(ih * ow, ninf);
    // Columns xx in [xa, xb) have windows inside the row: xx·sw ≥ pw and xx·sw - pw + kw ≤ iw.
    let xa = pw.div_ceil(sw).min(ow);
    let xb = if iw + pw >= kw { ((iw + pw - kw) / sw + 1).min(ow) } else { 0 }.max(xa);
    // A zero-width input has no rows to read (`max(1)`: chunks must not be empty); every
    // window is then empty and gives -inf, as in pool_plane.
    for (row, hrow) in x.chunks_exact(iw.max(1)).take(ih).zip(h.chunks_exact_mut(ow)) {
        for xx in (0..xa).chain(xb..ow) {
            let xs = (xx * sw) as isize - pw as isize;
            let (x0, x1) = (xs.max(0) as usize, ((xs + kw as isize).min(iw as isize)).max(0) as usize);
            hrow[xx] = row[x0.min(x1)..x1].iter().fold(ninf, |a, &v| a.max(R::load(v)));
        }
        let inner = &mut hrow[xa..xb];
        let at = |j: usize| (xa + j) * sw - pw;
        if kw == 3 {
            for (j, hv) in inner.iter_mut().enumerate() {
                let w = &row[at(j)..at(j) + 3];
                *hv = R::load(w[0]).max(R::load(w[1])).max(R::load(w[2]));
            }
        } else {
            for (j, hv) in inner.iter_mut().enumerate() {
                *hv = row[at(j)..at(j) + kw].iter().fold(ninf, |a, &v| a.max(R::load(v)));
            }
        }
    }
    let mut acc = vec![ninf; ow];
    for (y, orow) in o.chunks_exact_mut(ow).take(oh).enumerate() {
        let ys = (y * sh) as isize - ph as isize;
        let (y0, y1) = (ys.max(0) as usize, ((ys + kh as isize).min(ih as isize)).max(0) as usize);
        acc.fill(ninf);
        for r in y0.min(y1)..y1 {
            for (a, &v) in acc.iter_mut().zip(&h[r * ow..(r + 1) * ow]) {
                *a = a.max(v);
            }
        }
        for (ov, &a) in orow.iter_mut().zip(&acc) {
            *ov = a.store();
        }
    }
}

/// A per-dimension parameter widened to three dimensions (`default` when not given and for
/// the padded leading dimensions). The kernel must have one entry per spatial dimension;
/// stride and pad may have more, and only the first are read (as stock: `pad=(0, 0, 0)` on
/// 1-D pooling).
fn tuple3(op: &str, name: &str, v: &[i64], nsp: usize, default: usize) -> Result<[usize; 3]> {
    let mut r = [default; 3];
    if v.is_empty() {
        return Ok(r);
    }
    if v.len() < nsp || (name == "kernel" && v.len() != nsp) {
        return Err(Error::value(format!("operator {op}: {name} {v:?} must have {nsp} entries for {nsp}-D pooling")));
    }
    for (i, &x) in v[..nsp].iter().enumerate() {
        r[3 - nsp + i] = usize::try_from(x)
            .map_err(|_| Error::value(format!("operator {op}: {name} {v:?} has a negative entry")))?;
    }
    Ok(r)
}

pub(super) fn pool_plan(a: &Attrs, shape: &[usize]) -> Result<PoolPlan> {
    let params = PoolParams::of(a);
    let op = a.op;
    if !(3..=5).contains(&shape.len()) {
        return Err(Error::value(format!(
            "operator {op}: data must be 3-D, 4-D or 5-D (N, C, spatial...), got {shape:?}"
        )));
    }
    let channels_last = params.layout.is_some_and(|l| !l.starts_with("NC"));
    if let Some(l) = params.layout {
        if l.len() != shape.len() {
            return Err(Error::value(format!("operator {op}: layout {l} does not fit data of shape {shape:?}")));
        }
    }
    // Channel-last data is planned as its channel-first view.
    let first: Vec<usize>;
    let shape = if channels_last {
        first = channel_perms(shape.len()).0.iter().map(|&i| shape[i]).collect();
        &first[..]
    } else {
        shape
    };
    let nsp = shape.len() - 2;
    let mut input = [1; 3];
    input[3 - nsp..].copy_from_slice(&shape[2..]);
    let global = params.global_pool;
    let (kernel, stride, pad) = if global {
        (input, [1; 3], [0; 3])
    } else {
        if params.kernel.is_empty() {
            return Err(Error::value(format!("operator {op}: kernel must be given unless global_pool is set")));
        }
        (
            tuple3(op, "kernel", params.kernel, nsp, 1)?,
            tuple3(op, "stride", params.stride, nsp, 1)?,
            tuple3(op, "pad", params.pad, nsp, 0)?,
        )
    };
    if params.pooling_convention == "same" && params.pad.iter().any(|&p| p != 0) {
        return Err(Error::value(format!(
            "operator {op}: the 'same' pooling convention disables the pad parameter, got pad {:?}",
            params.pad
        )));
    }
    let mut pad = pad;
    let mut output = [1; 3];
    for d in 0..3 {
        if kernel[d] == 0 || stride[d] == 0 {
            return Err(Error::value(format!(
                "operator {op}: kernel and stride must be positive, got {:?} and {:?}",
                params.kernel, params.stride
            )));
        }
        let padded = input[d] + 2 * pad[d];
        if global {
            output[d] = 1;
            continue;
        }
        match params.pooling_convention {
            "same" => {
                output[d] = input[d].div_ceil(stride[d]);
                let need = ((output[d] - 1) * stride[d] + kernel[d]).saturating_sub(input[d]);
                pad[d] = need / 2;
            }
            conv => {
                if kernel[d] > padded {
                    return Err(Error::value(format!(
                        "operator {op}: kernel {:?} is larger than the padded input {:?}",
                        params.kernel,
                        &shape[2..]
                    )));
                }
                output[d] = if conv == "full" {
                    (padded - kernel[d]).div_ceil(stride[d]) + 1
                } else {
                    (padded - kernel[d]) / stride[d] + 1
                };
            }
        }
    }
    let mut out_shape = shape[..2].to_vec();
    out_shape.extend_from_slice(&output[3 - nsp..]);
    if channels_last {
        out_shape = channel_perms(out_shape.len()).1.iter().map(|&i| out_shape[i]).collect();
    }
    Ok(PoolPlan { input, output, kernel, stride, pad, out_shape, channels_last })
}

fn pool_infer(a: &Attrs, ins: &[Meta]) -> Result<Vec<Meta>> {
    let params = PoolParams::of(a);
    float_only(a.op, ins[0].dtype)?;
    if params.pool_type == "lp" && !matches!(params.p_value, Some(1..=3)) {
        return Err(Error::value(format!("operator {}: lp pooling needs p_value 1, 2 or 3", a.op)));
    }
    let p = pool_plan(a, &ins[0].shape)?;
    Ok(vec![Meta::new(p.out_shape, ins[0].dtype)])
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum PoolKind {
    Max,
    Avg { include_pad: bool },
    Sum,
    Lp(i64),
}

/// The GPU form's plan of a pooling (cuDNN's part: channel-first max, average and sum).
fn gpu_pool(a: &Attrs, shape: &[usize]) -> Result<crate::op::gpu_nn::PoolGpu> {
    use crate::op::gpu_nn::{PoolGpu, PoolGpuKind};
    let p = pool_plan(a, shape)?;
    if p.channels_last {
        return Err(Error::not_supported(format!("operator {} on a GPU with a channel-last layout", a.op)));
    }
    let kind = match pool_kind(a) {
        PoolKind::Max => PoolGpuKind::Max,
        PoolKind::Avg { include_pad } => PoolGpuKind::Avg { include_pad },
        PoolKind::Sum => PoolGpuKind::Sum,
        PoolKind::Lp(_) => return Err(Error::not_supported(format!("operator {} on a GPU with pool_type lp", a.op))),
    };
    Ok(PoolGpu {
        nsp: shape.len() - 2,
        n: shape[0],
        c: shape[1],
        input: p.input,
        output: p.output,
        kernel: p.kernel,
        stride: p.stride,
        pad: p.pad,
        kind,
    })
}

/// The pooling a call asks for.
pub(super) fn pool_kind(a: &Attrs) -> PoolKind {
    let params = PoolParams::of(a);
    match params.pool_type {
        "max" => PoolKind::Max,
        "avg" => PoolKind::Avg { include_pad: params.count_include_pad != Some(false) },
        "sum" => PoolKind::Sum,
        _ => PoolKind::Lp(params.p_value.unwrap_or(2)),
    }
}

fn pool_plane<T: Elem, R: Real>(x: &[T], o: &mut [T], p: &PoolPlan, kind: PoolKind) {
    let [id, ih, iw] = p.input;
    let [od, oh, ow] = p.output;
    let mut oi = 0;
    for z in 0..od {
        let zs = (z * p.stride[0]) as isize - p.pad[0] as isize;
        let ze_pad = (zs + p.kernel[0] as isize).min((id + p.pad[0]) as isize);
        let (z0, z1) = (zs.max(0) as usize, (ze_pad.min(id as isize)).max(0) as usize);
        for y in 0..oh {
            let ys = (y * p.stride[1]) as isize - p.pad[1] as isize;
            let ye_pad = (ys + p.kernel[1] as isize).min((ih + p.pad[1]) as isize);
            let (y0, y1) = (ys.max(0) as usize, (ye_pad.min(ih as isize)).max(0) as usize);
            for xx in 0..ow {
                let xs = (xx * p.stride[2]) as isize - p.pad[2] as isize;
                let xe_pad = (xs + p.kernel[2] as isize).min((iw + p.pad[2]) as isize);
                let (x0, x1) = (xs.max(0) as usize, (xe_pad.min(iw as isize)).max(0) as usize);
                let mut acc = match kind {
                    PoolKind::Max => R::of(f64::NEG_INFINITY),
                    _ => R::of(0.0),
                };
                for zz in z0..z1 {
                    for yy in y0..y1 {
                        let row = &x[(zz * ih + yy) * iw..(zz * ih + yy) * iw + iw];
                        // x0 > x1 where a window lies past the input (full convention).
                        for &v in &row[x0.min(x1)..x1] {
                            let v = R::load(v);
                            acc = match kind {
                                PoolKind::Max => acc.max(v),
                                PoolKind::Lp(2) => acc + v * v,
                                PoolKind::Lp(3) => acc + v * v * v,
                                _ => acc + v,
                            };
                        }
                    }
                }
                let r = match kind {
                    PoolKind::Avg { include_pad } => {
                        let n = if include_pad {
                            ((ze_pad - zs) * (ye_pad - ys) * (xe_pad - xs)) as usize
                        } else {
                            (z1 - z0) * (y1 - y0) * (x1 - x0)
                        };
                        if n == 0 {
                            R::of(0.0)
                        } else {
                            acc / R::of(n as f64)
                        }
                    }
                    PoolKind::Lp(2) => acc.sqrt(),
                    PoolKind::Lp(3) => R::of(acc.f64().cbrt()),
                    _ => acc,
                };
                o[oi] = r.store();
                oi += 1;
            }
        }
    }
}

/// [`pool_plane`] for 2-D average and sum pooling: the columns whose windows lie inside the
/// row are folded without bounds arithmetic (`KW`: the window width, 0 = the plan's, at run
/// time), the border columns as [`pool_plane`] does, and in the same order, so results are
/// identical.
fn pool_2d<T: Elem, R: Real, const KW: usize>(x: &[T], o: &mut [T], p: &PoolPlan, kind: PoolKind) {
    let ([_, ih, iw], [_, oh, ow]) = (p.input, p.output);
    let (kh, kw) = (p.kernel[1], if KW > 0 { KW } else { p.kernel[2] });
    let (sh, sw, ph, pw) = (p.stride[1], p.stride[2], p.pad[1], p.pad[2]);
    let include_pad = matches!(kind, PoolKind::Avg { include_pad: true });
    let fold = |acc: R, v: T| acc + R::load(v);
    let init = R::of(0.0);
    // Columns xx in [xa, xb) have windows inside the row: xx·sw ≥ pw and xx·sw - pw + kw ≤ iw.
    let xa = pw.div_ceil(sw).min(ow);
    let xb = if iw + pw >= kw { ((iw + pw - kw) / sw + 1).min(ow) } else { 0 }.max(xa);
    for (y, orow) in o.chunks_exact_mut(ow).take(oh).enumerate() {
        let ys = (y * sh) as isize - ph as isize;
        let ye_pad = (ys + kh as isize).min((ih + ph) as isize);
        let (y0, y1) = (ys.max(0) as usize, (ye_pad.min(ih as isize)).max(0) as usize);
        let finish = |acc: R, cols: usize, cols_pad: isize| match kind {
            PoolKind::Avg { .. } => {
                let n = if include_pad { ((ye_pad - ys) * cols_pad) as usize } else { (y1.saturating_sub(y0)) * cols };
                if n == 0 {
                    R::of(0.0)
                } else {
                    acc / R::of(n as f64)
                }
            }
            _ => acc,
        };
        for (xx, ov) in orow.iter_mut().enumerate() {
            let mut acc = init;
            if (xa..xb).contains(&xx) {
                let s = xx * sw - pw;
                for yy in y0..y1 {
                    for &v in &x[yy * iw + s..][..kw] {
                        acc = fold(acc, v);
                    }
                }
                *ov = finish(acc, kw, kw as isize).store();
            } else {
                let xs = (xx * sw) as isize - pw as isize;
                let xe_pad = (xs + kw as isize).min((iw + pw) as isize);
                let (x0, x1) = (xs.max(0) as usize, (xe_pad.min(iw as isize)).max(0) as usize);
                if x0 < x1 {
                    for yy in y0..y1 {
                        for &v in &x[yy * iw + x0..yy * iw + x1] {
                            acc = fold(acc, v);
                        }
                    }
                }
                *ov = finish(acc, x1.saturating_sub(x0), xe_pad - xs).store();
            }
        }
    }
}

/// The 2-D pooling of one plane for the kinds and window widths served without
/// [`pool_plane`]'s bounds arithmetic; `None` for others. `h`: [`max_pool_separable`]'s rows.
fn pool_2d_any<T: Elem, R: Real>(x: &[T], o: &mut [T], p: &PoolPlan, kind: PoolKind, h: &mut Vec<R>) -> Option<()> {
    if p.input[0] != 1 || p.kernel[0] != 1 || p.pad[0] != 0 {
        return None;
    }
    match (kind, p.kernel[2]) {
        (PoolKind::Max, 2) if p.kernel[1] == 2 && p.stride[1..] == [2, 2] && p.unclipped_2d() => {
            max_pool_2x2::<T, R>(x, o, p)
        }
        (PoolKind::Max, _) => max_pool_separable::<T, R>(x, o, p, h),
        (PoolKind::Avg { .. } | PoolKind::Sum, 2) => pool_2d::<T, R, 2>(x, o, p, kind),
        (PoolKind::Avg { .. } | PoolKind::Sum, 3) => pool_2d::<T, R, 3>(x, o, p, kind),
        (PoolKind::Avg { .. } | PoolKind::Sum, _) => pool_2d::<T, R, 0>(x, o, p, kind),
        (PoolKind::Lp(_), _) => return None,
    }
    Some(())
}

/// Pool channel-first planes `xs` into `out`.
fn pool_planes<T: Elem, R: Real>(xs: &[T], out: &mut [T], p: &PoolPlan, kind: PoolKind) {
    let (isz, osz) = (p.input.iter().product::<usize>(), p.output.iter().product::<usize>());
    let work = (osz * p.kernel.iter().product::<usize>()) as f64 * 0.5 + 1.0;
    par_for_mut(out, osz, Cost(work), T::DTYPE, |r, part| {
        let mut h = Vec::new();
        for (pl, o) in r.zip(part.chunks_mut(osz.max(1))) {
            let x = &xs[pl * isz..(pl + 1) * isz];
            if pool_2d_any::<T, R>(x, o, p, kind, &mut h).is_none() {
                pool_plane::<T, R>(x, o, p, kind);
            }
        }
    });
}

fn pooling(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let a = cx.attrs;
    let p = pool_plan(a, &ins[0].shape)?;
    let kind = pool_kind(a);
    dispatch_real!(ins[0].dtype, a.op, T, R => {
        let xs = ins[0].as_slice::<T>();
        if p.channels_last {
            let (first, last) = channel_perms(ins[0].ndim());
            let x = permuted(xs, &ins[0].shape, &first);
            let mut o = vec![T::zero(); outs[0].size()];
            pool_planes::<T, R>(&x, &mut o, &p, kind);
            let oshape: Vec<usize> = first.iter().map(|&i| outs[0].shape[i]).collect();
            outs[0].as_mut::<T>().copy_from_slice(&permuted(&o, &oshape, &last));
        } else {
            pool_planes::<T, R>(xs, outs[0].as_mut::<T>(), &p, kind);
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// smooth_l1 (the worked example of docs/adding-an-operator.md)

/// `(sigma², 1 / sigma²)` as stock computes them: `sigma` (the `scalar` parameter) cast to the
/// data's dtype and squared in it, the reciprocal in the compute type.
fn smooth_l1_sigma<T: Elem, R: Real>(a: &Attrs) -> (R, R) {
    let sigma = R::load(T::from_f64(super::elemwise::ScalarParams::of(a).scalar));
    let bsq = R::load(T::from_f64((sigma * sigma).f64()));
    (bsq, R::of(1.0) / bsq)
}

/// `smooth_l1(x, sigma)`: `0.5 (sigma x)²` where `|x| < 1 / sigma²`, `|x| - 0.5 / sigma²`
/// elsewhere (stock's `mshadow_op::smooth_l1_loss`, in its order of operations).
fn smooth_l1(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    dispatch_real!(ins[0].dtype, cx.attrs.op, T, R => {
        let (bsq, ibsq) = smooth_l1_sigma::<T, R>(cx.attrs);
        let half = R::of(0.5);
        map::<T, R>(&ins[0], &mut outs[0], Cost::CHEAP, |x| {
            if x > ibsq {
                x - half * ibsq
            } else if x < -ibsq {
                -x - half * ibsq
            } else {
                half * x * x * bsq
            }
        });
    });
    Ok(())
}

/// `_backward_smooth_l1`: inputs (output gradient, forward input); `g * d`, with `d` 1 or -1
/// outside `[-1/sigma², 1/sigma²]` and `sigma² x` inside.
fn smooth_l1_backward(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == crate::op::Req::Null {
        return Ok(());
    }
    dispatch_real!(ins[1].dtype, cx.attrs.op, T, R => {
        let (bsq, ibsq) = smooth_l1_sigma::<T, R>(cx.attrs);
        let (g, x) = (ins[0].as_slice::<T>(), ins[1].as_slice::<T>());
        par_for_mut(outs[0].as_mut::<T>(), 1, Cost::CHEAP, T::DTYPE, |r, o| {
            for ((o, &g), &x) in o.iter_mut().zip(&g[r.clone()]).zip(&x[r]) {
                let x = R::load(x);
                let d = if x > ibsq {
                    R::of(1.0)
                } else if x < -ibsq {
                    R::of(-1.0)
                } else {
                    bsq * x
                };
                *o = (R::load(g) * d).store();
            }
        });
    });
    Ok(())
}

/// `smooth_l1` and its backward operator.
fn register_smooth_l1(ops: &mut Vec<OpDef>) {
    use super::elemwise::SCALAR_PARAMS;
    ops.push(
        OpDef::new("smooth_l1", Inputs::Fixed(&["data"]), Box::new(infer_float_like_first), Box::new(smooth_l1))
            .alias(&["_npx_smooth_l1"])
            .params(SCALAR_PARAMS)
            .elementwise_shape()
            .inplace(&[(0, 0)])
            .grad(Grad::Backward { op: "_backward_smooth_l1", inputs: true, outputs: false })
            .doc(
                "Calculate Smooth L1 Loss(lhs, scalar): f(x) = 0.5 * (sigma * x)^2 if |x| < 1/sigma^2, \
                 |x| - 0.5/sigma^2 otherwise, where sigma is the scalar.",
            ),
    );
    ops.push(OpDef::backward("_backward_smooth_l1", SCALAR_PARAMS, Box::new(smooth_l1_backward)));
}

/// Graph inference of PReLU's gamma from the data: one slope per channel (axis 1).
fn leaky_param_shapes(a: &Attrs, data: &[i64], _: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let prelu = LeakyParams::of(a).act_type == "prelu";
    Ok(if prelu && data.len() >= 2 { vec![(1, vec![data[1]])] } else { vec![] })
}

/// Graph inference of a normalization's per-channel inputs (gamma, beta and BatchNorm's moving
/// statistics) from the data: the length of the normalized axis (`axis`, default 1).
fn norm_param_shapes(a: &Attrs, data: &[i64], n_inputs: usize) -> Result<Vec<(usize, Vec<i64>)>> {
    let ndim = data.len() as i64;
    let axis = if a.declares(LN_PARAMS) { LnParams::of(a).axis } else { BnParams::of(a).axis };
    let axis = if axis < 0 { axis + ndim } else { axis };
    if !(0..ndim).contains(&axis) {
        return Ok(vec![]);
    }
    Ok((1..n_inputs).map(|k| (k, vec![data[axis as usize]])).collect())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    register_smooth_l1(ops);
    ops.push(
        OpDef::new("Activation", Inputs::Fixed(&["data"]), Box::new(infer_float_like_first), Box::new(activation))
            .unnamed_inputs()
            .alias(&["_npx_activation"])
            .params(ACT_PARAMS)
            .fusion(|a| {
                (ActParams::of(a).act_type == "relu").then_some(crate::op::Fusion::Step(crate::op::FuseStep::Relu))
            })
            .gpu(GpuKernel::MapBy(|a| {
                let e = match ActParams::of(a).act_type {
                    "relu" => "x > T(0) ? x : T(0)",
                    "sigmoid" => "T(1) / (T(1) + exp(-x))",
                    "tanh" => "tanh(x)",
                    "softrelu" => "x > T(20) ? x : log1p(exp(x))",
                    _ => "x / (T(1) + fabs(x))",
                };
                Some((e, 0.0))
            }))
            .inplace(&[(0, 0)])
            .elementwise_shape()
            .grad(Grad::Backward { op: "_backward_Activation", inputs: false, outputs: true })
            .doc("Applies an activation function element-wise to the input."),
    );
    ops.push(
        OpDef::new(
            "LeakyReLU",
            Inputs::Leading(&["data", "gamma"], leaky_inputs),
            Box::new(leaky_infer),
            Box::new(leaky),
        )
        .alias(&["_npx_leaky_relu"])
        .params(LEAKY_PARAMS)
        .gpu(GpuKernel::MapBy(|a| {
            let p = LeakyParams::of(a);
            let e = match p.act_type {
                "leaky" => "x > T(0) ? x : y * x",
                "elu" => "x > T(0) ? x : y * (exp(x) - T(1))",
                "selu" => "T(1.0507009873554805) * (x > T(0) ? x : T(1.6732632423543773) * (exp(x) - T(1)))",
                "gelu" => "T(0.5) * x * (T(1) + erf(x * T(0.7071067811865476)))",
                // prelu's gamma broadcasts along axis 1 and rrelu draws random slopes.
                _ => return None,
            };
            Some((e, p.slope))
        }))
        .param_shapes(leaky_param_shapes)
        .outputs(leaky_outputs, one)
        .resources(&[Resource::Random])
        .grad(Grad::Backward { op: "_backward_LeakyReLU", inputs: true, outputs: true })
        .doc("Applies Leaky rectified linear unit activation element-wise to the input."),
    );
    for (name, alias, log, neg, grad) in [
        ("softmax", Some("_npx_softmax"), false, false, "_backward_softmax"),
        ("log_softmax", Some("_npx_log_softmax"), true, false, "_backward_log_softmax"),
        ("softmin", None, false, true, "_backward_softmin"),
    ] {
        let mut d = OpDef::new(
            name,
            Inputs::Leading(&["data", "length"], softmax_inputs),
            Box::new(softmax_infer),
            softmax_family(log, neg),
        )
        .params(SOFTMAX_PARAMS)
        .gpu(GpuKernel::Softmax {
            log,
            neg,
            params: |a| {
                let p = SoftmaxParams::of(a);
                (p.axis, p.temperature, p.use_length == Some(true))
            },
        })
        // The optional length input has its own shape.
        .elementwise_shape_of(1)
        // log_softmax's gradient needs the length mask (its masked outputs are 0, not -inf).
        .grad(Grad::Backward { op: grad, inputs: log, outputs: true })
        .doc(format!("{name} along an axis (with optional temperature, output dtype and length mask)."));
        if let Some(a) = alias {
            d = d.alias(&[a]);
        }
        if name != "softmax" {
            // Stock lists only `data` for these (Gluon calls log_softmax(x, axis)).
            d = d.listed_inputs(&["data"]);
        }
        ops.push(d);
    }
    ops.push(
        OpDef::new(
            "SoftmaxOutput",
            Inputs::Fixed(&["data", "label"]),
            Box::new(softmax_output_infer),
            Box::new(softmax_output),
        )
        .alias(&["Softmax"])
        .params(SOFTMAX_OUTPUT_PARAMS)
        .param_shapes(softmax_output_label_shape)
        .never_mirrored()
        .grad(Grad::Backward { op: "_backward_SoftmaxOutput", inputs: true, outputs: true })
        .doc("Computes the softmax of the input (the gradient is that of the cross-entropy loss)."),
    );
    ops.push(
        OpDef::new("Dropout", Inputs::Fixed(&["data"]), Box::new(dropout_infer), Box::new(dropout))
            .alias(&["_npx_dropout"])
            .params(DROPOUT_PARAMS)
            .gpu(GpuKernel::Dropout(|a| {
                let p = DropoutParams::of(a);
                (p.p, p.mode == "always")
            }))
            .outputs(two, one)
            .output_names(&["output", "mask"])
            .elementwise_shape()
            .never_mirrored()
            .resources(&[Resource::Random])
            .grad(Grad::Backward { op: "_backward_Dropout", inputs: false, outputs: true })
            .doc("Applies dropout operation to input array (identity at inference unless mode is always)."),
    );
    // BatchNorm, and the same with the ReLU fused on its output (and gradient).
    let bn_forms: [(&'static str, &'static [&'static str], crate::op::ComputeFn, &'static str, &'static str); 2] = [
        ("BatchNorm", &["_npx_batch_norm"], Box::new(batch_norm), "_backward_BatchNorm",
         "Batch normalization. Outputs the normalized data and (with output_mean_var) the batch mean and inverse std."),
        ("_contrib_BatchNormWithReLU", &[], Box::new(batch_norm_relu), "_backward_BatchNormWithReLU",
         "Batch normalization with ReLU fusion: BatchNorm's output passed through max(0, x); the mean and inverse std outputs are BatchNorm's."),
    ];
    for (name, aliases, kernel, back, doc) in bn_forms {
        let mut def = OpDef::new(
            name,
            Inputs::Fixed(&["data", "gamma", "beta", "moving_mean", "moving_var"]),
            Box::new(bn_infer),
            kernel,
        )
        .alias(aliases)
        .params(BN_PARAMS)
        .outputs(three, bn_visible)
        .output_names(&["output", "mean", "var"])
        .param_shapes(norm_param_shapes)
        .float32_params()
        .input_inits(&[(3, "[\"zero\", {}]"), (4, "[\"one\", {}]")])
        .never_mirrored()
        // Written by the backward operator in training; declared here too,
        // which makes them auxiliary states and orders the forward after earlier updates.
        .mutates(&[3, 4])
        .grad(Grad::Backward { op: back, inputs: true, outputs: true })
        .doc(doc);
        // The fused ReLU form has no GPU form yet.
        if name == "BatchNorm" {
            def = def.fusion(bn_fusion).gpu(GpuKernel::BatchNorm(|a| {
                let p = BnParams::of(a);
                crate::op::gpu_nn::BnGpu {
                    axis: p.axis,
                    eps: p.eps,
                    fix_gamma: p.fix_gamma,
                    use_global_stats: p.use_global_stats,
                }
            }));
        }
        ops.push(def);
    }
    ops.push(
        OpDef::new("LayerNorm", Inputs::Fixed(&["data", "gamma", "beta"]), Box::new(ln_infer), Box::new(layer_norm))
            .alias(&["_npx_layer_norm"])
            .params(LN_PARAMS)
            .outputs(three, bn_visible)
            .output_names(&["output", "mean", "std"])
            .param_shapes(norm_param_shapes)
            .float32_params()
            .grad(Grad::Backward { op: "_backward_LayerNorm", inputs: true, outputs: true })
            .doc("Layer normalization over one axis."),
    );
    ops.push(
        OpDef::new("Pooling", Inputs::Fixed(&["data"]), Box::new(pool_infer), Box::new(pooling))
            .alias(&["_npx_pooling"])
            .params(POOL_PARAMS)
            .gpu(GpuKernel::Pooling(gpu_pool))
            .grad(Grad::Backward { op: "_backward_Pooling", inputs: true, outputs: true })
            .doc("Performs pooling (max, avg, sum, lp) over 1-D, 2-D or 3-D inputs."),
    );
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::op::param::ParamSpec;

    fn blob(v: &mut [f32], shape: &[usize]) -> TBlob {
        // SAFETY: the vector outlives the blob within each test and is not written while the
        // blob is used.
        unsafe { TBlob::new(v.as_mut_ptr() as *mut u8, shape, DType::F32) }
    }

    fn oblob(v: &mut [f32], shape: &[usize]) -> OutBlob {
        // SAFETY: the vector outlives the blob within each test and is read only between the
        // kernel calls that write it.
        unsafe { OutBlob::new(v.as_mut_ptr() as *mut u8, shape, DType::F32) }
    }

    fn run(
        specs: &'static [ParamSpec],
        kv: &[(&str, &str)],
        train: bool,
        f: fn(&OpCtx, &[TBlob], &mut [OutBlob]) -> Result<()>,
        ins: &[TBlob],
        outs: &mut [OutBlob],
    ) {
        let attrs = Attrs::parse("test", specs, kv.iter().copied()).unwrap();
        let rng = Some(crate::op::random::take(crate::context::Context::CPU, 1 << 20));
        let cx = OpCtx { attrs: &attrs, req: &[], rng, is_train: train, temp: None };
        f(&cx, ins, outs).unwrap();
    }

    /// Integer-valued data with many ties, so the max's routing order matters.
    pub(in crate::op::ops) fn tied(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7919) % 13) as f32).collect()
    }

    /// Unclipped 2-D pooling plans of every specialised kernel size, and one generic.
    pub(in crate::op::ops) const UNCLIPPED: &[(&str, &str, &[usize])] = &[
        ("(2, 2)", "(2, 2)", &[2, 3, 8, 10]),
        ("(3, 3)", "(1, 1)", &[1, 2, 7, 9]),
        ("(3, 3)", "(2, 2)", &[1, 2, 9, 7]),
        ("(2, 3)", "(1, 2)", &[2, 1, 6, 9]),
        // Tiling windows (stride = kernel), with uncovered last rows and columns.
        ("(2, 2)", "(2, 2)", &[1, 1, 9, 11]),
        ("(3, 3)", "(3, 3)", &[1, 1, 10, 7]),
        ("(2, 3)", "(2, 3)", &[1, 1, 7, 10]),
        // 2×2 tiles over rows of 10 and 9 windows: vector blocks of four plus a remainder.
        ("(2, 2)", "(2, 2)", &[1, 2, 6, 20]),
        ("(2, 2)", "(2, 2)", &[1, 1, 5, 19]),
    ];

    #[test]
    fn prelu_gamma_layouts() {
        // (C,) per channel, (N, C) per sample and channel, (N,) per element of 1-D data.
        let l = PreluLayout::new("p", &[3, 4, 2], &[4]).unwrap();
        assert_eq!((l.chans, l.inner, l.gamma_of(5)), (4, 2, 1));
        let l = PreluLayout::new("p", &[3, 4, 2], &[3, 4]).unwrap();
        assert_eq!(l.gamma_of(5), 5);
        let l = PreluLayout::new("p", &[6], &[6]).unwrap();
        assert_eq!((l.inner, l.gamma_of(4)), (1, 4));
        assert_eq!(PreluLayout::new("p", &[3, 4], &[1]).unwrap().gamma_of(7), 0);
        assert!(PreluLayout::new("p", &[3, 4], &[5]).is_err());
        assert!(PreluLayout::new("p", &[3, 4, 2], &[2, 3, 4]).is_err());
    }

    #[test]
    fn max_pool_fast_path_equals_the_general_one() {
        for &(k, st, shape) in UNCLIPPED {
            let attrs =
                Attrs::parse("Pooling", POOL_PARAMS, [("kernel", k), ("stride", st), ("pool_type", "max")]).unwrap();
            let p = pool_plan(&attrs, shape).unwrap();
            assert!(p.unclipped_2d(), "{k} {st} {shape:?}");
            let (isz, osz) = (p.input.iter().product::<usize>(), p.output.iter().product::<usize>());
            let x = tied(isz);
            let (mut fast, mut general) = (vec![0.0f32; osz], vec![1.0f32; osz]);
            assert!(pool_2d_any::<f32, f32>(&x, &mut fast, &p, PoolKind::Max, &mut Vec::new()).is_some());
            pool_plane::<f32, f32>(&x, &mut general, &p, PoolKind::Max);
            assert_eq!(fast, general, "{k} {st} {shape:?}");
        }
        // Padded and clipped windows: the 2-D path folds as the general one, border and all.
        let mut compared = 0;
        for (k, st, pad, conv) in [
            ("(3, 3)", "(2, 2)", "(1, 1)", "valid"),
            ("(3, 3)", "(1, 1)", "(1, 1)", "valid"),
            ("(2, 2)", "(2, 2)", "(0, 0)", "full"),
            ("(3, 3)", "(2, 2)", "(0, 0)", "full"),
            ("(3, 2)", "(1, 3)", "(2, 1)", "full"),
            ("(5, 5)", "(3, 3)", "(2, 2)", "valid"),
        ] {
            for kind in ["max", "avg", "sum"] {
                for include_pad in ["True", "False"] {
                    let attrs = Attrs::parse(
                        "Pooling",
                        POOL_PARAMS,
                        [
                            ("kernel", k),
                            ("stride", st),
                            ("pad", pad),
                            ("pooling_convention", conv),
                            ("pool_type", kind),
                            ("count_include_pad", include_pad),
                        ],
                    )
                    .unwrap();
                    for shape in [&[1, 1, 7, 9][..], &[1, 1, 6, 6], &[1, 1, 2, 3]] {
                        // A window larger than the padded input is refused by the plan.
                        let Ok(p) = pool_plan(&attrs, shape) else { continue };
                        compared += 1;
                        let (isz, osz) = (p.input.iter().product::<usize>(), p.output.iter().product::<usize>());
                        let x: Vec<f32> = (0..isz).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
                        let (mut fast, mut general) = (vec![0.0f32; osz], vec![1.0f32; osz]);
                        assert!(
                            pool_2d_any::<f32, f32>(&x, &mut fast, &p, pool_kind(&attrs), &mut Vec::new()).is_some()
                        );
                        pool_plane::<f32, f32>(&x, &mut general, &p, pool_kind(&attrs));
                        assert_eq!(fast, general, "{k} {st} {pad} {conv} {kind} {include_pad} {shape:?}");
                    }
                }
            }
        }
        assert!(compared >= 90, "{compared} cases compared");
        // Padding or a clipped last window takes the general path.
        let padded = Attrs::parse("Pooling", POOL_PARAMS, [("kernel", "(2, 2)"), ("pad", "(1, 1)")]).unwrap();
        assert!(!pool_plan(&padded, &[1, 1, 4, 4]).unwrap().unclipped_2d());
        let full = Attrs::parse(
            "Pooling",
            POOL_PARAMS,
            [("kernel", "(3, 3)"), ("stride", "(2, 2)"), ("pooling_convention", "full")],
        )
        .unwrap();
        assert!(!pool_plan(&full, &[1, 1, 6, 6]).unwrap().unclipped_2d());
    }

    /// Max pooling in two passes keeps the one-pass fold's result to the bit where the order
    /// shows: which NaN (the first), and +0 or -0 (the last of equal values).
    #[test]
    fn separable_max_pool_keeps_the_fold_order() {
        let vals = [0.0f32, -0.0, 1.0, -1.0, f32::from_bits(0x7fc0_0001), f32::from_bits(0xffc0_0002), -0.0, 0.0];
        let mut compared = 0;
        for (k, st, pad) in [
            ("(3, 3)", "(2, 2)", "(1, 1)"),
            ("(3, 3)", "(1, 1)", "(0, 0)"),
            ("(2, 3)", "(1, 2)", "(1, 1)"),
            ("(2, 2)", "(2, 2)", "(0, 0)"),
        ] {
            let attrs = Attrs::parse(
                "Pooling",
                POOL_PARAMS,
                [("kernel", k), ("stride", st), ("pad", pad), ("pool_type", "max")],
            )
            .unwrap();
            for shape in [[1, 1, 5, 6], [1, 1, 4, 4], [1, 1, 7, 5]] {
                let p = pool_plan(&attrs, &shape).unwrap();
                let (isz, osz) = (p.input.iter().product::<usize>(), p.output.iter().product::<usize>());
                // Seeds that give windows of zeros only, of NaNs and zeros, and of mixed values.
                for seed in 0..40usize {
                    let x: Vec<f32> = (0..isz)
                        .map(|i| {
                            let v = vals[(i * 7 + seed * 13 + (i * seed) % 5) % vals.len()];
                            if seed % 3 == 0 && v.is_nan() {
                                0.0
                            } else {
                                v
                            }
                        })
                        .collect();
                    let (mut fast, mut general) = (vec![9.0f32; osz], vec![7.0f32; osz]);
                    let mut h = Vec::new();
                    max_pool_separable::<f32, f32>(&x, &mut fast, &p, &mut h);
                    pool_plane::<f32, f32>(&x, &mut general, &p, PoolKind::Max);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&fast), bits(&general), "{k} {st} {pad} {shape:?} seed {seed}");
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, 4 * 3 * 40);
        // A zero-width input with padding: every window is empty and gives -inf.
        let attrs =
            Attrs::parse("Pooling", POOL_PARAMS, [("kernel", "(1, 2)"), ("pad", "(0, 1)"), ("pool_type", "max")])
                .unwrap();
        let p = pool_plan(&attrs, &[1, 1, 2, 0]).unwrap();
        let osz = p.output.iter().product::<usize>();
        assert_eq!(osz, 2);
        let (mut fast, mut general) = (vec![0.0f32; osz], vec![0.0f32; osz]);
        pool_planes::<f32, f32>(&[], &mut fast, &p, PoolKind::Max);
        pool_plane::<f32, f32>(&[], &mut general, &p, PoolKind::Max);
        assert_eq!(fast, [f32::NEG_INFINITY; 2]);
        assert_eq!(general, fast);
    }

    #[test]
    fn batch_norm_training_uses_batch_stats_and_leaves_moving_ones() {
        // (N=2, C=2, 2): channel 0 holds 1,2,3,4 and channel 1 holds 10,10,10,10.
        let mut x = vec![1.0f32, 2.0, 10.0, 10.0, 3.0, 4.0, 10.0, 10.0];
        let (mut g, mut b, mut mm, mut mv) = (vec![2.0f32; 2], vec![0.5f32; 2], vec![0.0f32; 2], vec![1.0f32; 2]);
        let (mut out, mut mean, mut inv) = (vec![0.0f32; 8], vec![0.0f32; 2], vec![0.0f32; 2]);
        let ins = [
            blob(&mut x, &[2, 2, 2]),
            blob(&mut g, &[2]),
            blob(&mut b, &[2]),
            blob(&mut mm, &[2]),
            blob(&mut mv, &[2]),
        ];
        // The moving statistics (mutated inputs 3 and 4) are written through blobs 3 and 4.
        let ins = [ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[3].clone().lend(3), ins[4].clone().lend(4)];
        let mut outs = [
            oblob(&mut out, &[2, 2, 2]),
            oblob(&mut mean, &[2]),
            oblob(&mut inv, &[2]),
            oblob(&mut mm, &[2]),
            oblob(&mut mv, &[2]),
        ];
        run(BN_PARAMS, &[("fix_gamma", "False"), ("eps", "0"), ("momentum", "0.5")], true, batch_norm, &ins, &mut outs);
        assert_eq!(mean, [2.5, 10.0]);
        assert!((inv[0] - 1.0 / 1.25f32.sqrt()).abs() < 1e-6);
        // The backward updates the moving statistics (stock 1.9.1), not the forward.
        assert_eq!(mm, [0.0, 0.0]);
        assert_eq!(mv, [1.0, 1.0]);
        assert!((out[0] - (0.5 + 2.0 * (1.0 - 2.5) / 1.25f32.sqrt())).abs() < 1e-5);
        // Inference uses the moving statistics and leaves them alone.
        run(BN_PARAMS, &[("fix_gamma", "True"), ("eps", "0")], false, batch_norm, &ins, &mut outs);
        assert!((out[0] - 1.5).abs() < 1e-6);
        assert_eq!(mean, [0.0, 0.0]);
        assert_eq!((mm, mv), (vec![0.0, 0.0], vec![1.0, 1.0]));
    }

    /// A BatchNorm heading a fused chain gives the bits of BatchNorm, then ReLU, then clip
    /// (a NaN kept, as theirs), reads the lent moving statistics and leaves them; it refuses batch
    /// statistics.
    #[test]
    fn fused_batch_norm_equals_the_unfused_operators() {
        use crate::op::FuseStep;
        const STEPS: [FuseStep; 2] = [FuseStep::Relu, FuseStep::Clip { lo: 0.0, hi: 0.7 }];
        fn fused(cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
            fused_batch_norm(cx, ins, outs, &STEPS)
        }
        let mut x: Vec<f32> = (0..30).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        x[4] = f32::NAN;
        let (mut g, mut b) = (vec![1.5f32, -0.5, 0.25], vec![0.1f32, 0.2, -0.3]);
        let (mut mm, mut mv) = (vec![0.3f32, -0.2, 0.05], vec![0.9f32, 1.7, 0.4]);
        let ins = [
            blob(&mut x, &[2, 3, 5]),
            blob(&mut g, &[3]),
            blob(&mut b, &[3]),
            blob(&mut mm, &[3]).lend(3),
            blob(&mut mv, &[3]).lend(4),
        ];
        let global: &[(&str, &str)] = &[("use_global_stats", "True")];
        // Gamma read or fixed to 1, eps given or the default; moving statistics in training
        // mode under use_global_stats.
        for (kv, train) in [(&[("fix_gamma", "False"), ("eps", "0.001")][..], false), (&[], false), (global, true)] {
            let (mut want, mut mean, mut inv) = (vec![0.0f32; 30], vec![0.0f32; 3], vec![0.0f32; 3]);
            let mut outs = [
                oblob(&mut want, &[2, 3, 5]),
                oblob(&mut mean, &[3]),
                oblob(&mut inv, &[3]),
                oblob(&mut mm, &[3]),
                oblob(&mut mv, &[3]),
            ];
            run(BN_PARAMS, kv, train, batch_norm, &ins, &mut outs);
            // Activation's relu and clip, as their kernels compute them: a NaN stays NaN.
            for v in want.iter_mut() {
                let r = if *v > 0.0 || v.is_nan() { *v } else { 0.0 };
                *v = r.clamp(0.0, 0.7);
            }
            let mut got = vec![f32::NAN; 30];
            let ins = [ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[3].clone().lend(1), ins[4].clone().lend(2)];
            let mut outs = [oblob(&mut got, &[2, 3, 5]), oblob(&mut mm, &[3]), oblob(&mut mv, &[3])];
            run(BN_PARAMS, kv, train, fused, &ins, &mut outs);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{kv:?}"
            );
            assert!(got[4].is_nan() && got.contains(&0.7) && got.iter().any(|&v| v > 0.0 && v < 0.7), "{got:?}");
            assert_eq!((&mm, &mv), (&vec![0.3f32, -0.2, 0.05], &vec![0.9f32, 1.7, 0.4]));
        }
        let ins = [ins[0].clone(), ins[1].clone(), ins[2].clone(), ins[3].clone().lend(1), ins[4].clone().lend(2)];
        let mut got = vec![0.0f32; 30];
        let mut outs = [oblob(&mut got, &[2, 3, 5]), oblob(&mut mm, &[3]), oblob(&mut mv, &[3])];
        let kv = [("fix_gamma", "False")];
        // Training mode normalizes by batch statistics, which the fused form does not compute.
        let attrs = Attrs::parse("test", BN_PARAMS, kv.iter().copied()).unwrap();
        let cx = OpCtx { attrs: &attrs, req: &[], rng: None, is_train: true, temp: None };
        assert!(fused(&cx, &ins, &mut outs).is_err());
    }

    #[test]
    fn dropout_and_rrelu_in_training_mode() {
        let mut x = vec![1.0f32; 10000];
        let (mut o, mut m) = (vec![0.0f32; 10000], vec![0.0f32; 10000]);
        let ins = [blob(&mut x, &[100, 100])];
        let mut outs = [oblob(&mut o, &[100, 100]), oblob(&mut m, &[100, 100])];
        run(DROPOUT_PARAMS, &[("p", "0.25")], true, dropout, &ins, &mut outs);
        let kept = o.iter().filter(|&&v| v != 0.0).count() as f64 / 10000.0;
        assert!((0.7..0.8).contains(&kept), "{kept}");
        assert!(o.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        run(DROPOUT_PARAMS, &[("p", "0.25")], false, dropout, &ins, &mut outs);
        assert!(o.iter().all(|&v| v == 1.0));
        let mut xn = vec![-1.0f32; 10000];
        let ins = [blob(&mut xn, &[100, 100])];
        run(LEAKY_PARAMS, &[("act_type", "rrelu")], true, leaky, &ins, &mut outs);
        assert!(o.iter().all(|&v| (-0.334..=-0.125).contains(&v)));
        assert!(o.iter().zip(&m).all(|(&v, &s)| (v + s).abs() < 1e-6));
    }

    #[test]
    fn erf_is_accurate() {
        for (x, want) in
            [(0.0, 0.0), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (-2.0, -0.995_322_265), (3.0, 0.999_977_909_5)]
        {
            assert!((erf(x) - want).abs() < 2e-7, "erf({x})");
        }
    }

    #[test]
    fn softmax_kernel_strided_axis_and_lengths() {
        // (outer 1, len 3, inner 2): columns are independent softmaxes.
        let x = [1.0f64, 0.0, 2.0, 0.0, 3.0, 0.0];
        let mut o = [0.0; 6];
        softmax_kernel::<f64, f64>(&x, &mut o, (1, 3, 2), SoftmaxKind { log: false, negate: false, scale: 1.0 }, None);
        let s: f64 = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).sum();
        assert!((o[4] - 3f64.exp() / s).abs() < 1e-12);
        assert!((o[1] - 1.0 / 3.0).abs() < 1e-12);
        softmax_kernel::<f64, f64>(
            &x,
            &mut o,
            (1, 3, 2),
            SoftmaxKind { log: false, negate: false, scale: 1.0 },
            Some(&[2.0, 1.0]),
        );
        assert_eq!((o[4], o[3], o[5]), (0.0, 0.0, 0.0));
        assert!((o[1] - 1.0).abs() < 1e-12);
    }

    /// smooth_l1 against stock's formula, on both sides of the kinks at ±1/sigma², and its
    /// gradient against finite differences (away from the kinks).
    #[test]
    fn smooth_l1_matches_stocks_formula_and_its_gradient() {
        let op = crate::op::lookup("smooth_l1").unwrap();
        for sigma in [1.0f32, 2.0, 0.5] {
            let mut x: Vec<f32> = vec![-3.0, -1.0 / (sigma * sigma), -0.2, 0.0, 0.1, 0.3, 4.5, 1.0];
            let want: Vec<f32> = x
                .iter()
                .map(|&x| {
                    let (bsq, ibsq) = (sigma * sigma, 1.0 / (sigma * sigma));
                    if x > ibsq {
                        x - 0.5 * ibsq
                    } else if x < -ibsq {
                        -x - 0.5 * ibsq
                    } else {
                        0.5 * x * x * bsq
                    }
                })
                .collect();
            let attrs = op.parse_attrs([("scalar", sigma.to_string().as_str())], 1).unwrap();
            let mut got = vec![0f32; x.len()];
            let n = [x.len()];
            let req = [crate::op::Req::Write];
            let cx = OpCtx { attrs: &attrs, req: &req, rng: None, is_train: false, temp: None };
            (op.compute)(&cx, &[blob(&mut x, &n)], &mut [oblob(&mut got, &n)]).unwrap();
            assert_eq!(got, want, "sigma {sigma}");
        }
        let x: Vec<f64> = crate::op::grad::check::values(24, -2.0, 2.0, 3)
            .into_iter()
            .map(|v| if (v.abs() - 0.25).abs() < 0.05 { v + 0.1 } else { v })
            .collect();
        crate::op::grad::check::check("smooth_l1", &[("scalar", "2")], &[(&[4, 6], x)], &[]);
        let err = (op.infer)(&op.parse_attrs([], 1).unwrap(), &[Meta::new(vec![2], DType::I32)]).unwrap_err();
        assert!(err.to_string().starts_with("TypeError:"), "{err}");
    }
}
