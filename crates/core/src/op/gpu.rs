//! Operators on GPUs: what an operator declaration says about its GPU form ([`GpuKernel`]),
//! the CUDA source generated from it, and running it on a device.
//!
//! Owns: [`GpuKernel`] (set by a declaration with [`super::OpDef::gpu`]), the NVRTC source
//! of the element-wise kernel family ([`map_source`], cached per form, expression and dtypes;
//! broadcasting by strides, so one kernel serves every shape), the GEMM plans of `dot`,
//! `batch_dot` and `FullyConnected` (cuBLAS), and the math mode the seeds' variables choose.
//! The layers' forms (cuDNN convolution, pooling, batch norm; concat, dropout) are in
//! [`super::gpu_nn`]. An operator without a GPU form fails on a GPU context with
//! NotImplementedError.

use super::param::Attrs;
use super::tensor::{OutBlob, TBlob};
use super::{OpCtx, Req};
use crate::cuda;
use crate::error::{Error, Result};
use crate::ndarray::DType;
use std::ffi::c_void;

/// The GPU form of an operator.
#[derive(Clone, Copy)]
pub enum GpuKernel {
    /// `out = e(x)`, `x` input 0 (an output of another dtype is a conversion).
    Map1(&'static str),
    /// `out = e(x, y)`, inputs 0 and 1 of one shape or broadcast against each other.
    Map2(&'static str),
    /// `out = e(x, y)`, `x` input 0 and `y` the scalar the function reads from the
    /// parameters; reversed (`true`): `x` the scalar and `y` input 0.
    Scalar(&'static str, bool, fn(&Attrs) -> f64),
    /// Every element `value(cx)`.
    Fill(fn(&OpCtx) -> f64),
    /// `dot` (N-d inputs as matrices); the function reads (transpose_a, transpose_b).
    Dot(fn(&Attrs) -> (bool, bool)),
    /// `batch_dot`, likewise.
    BatchDot(fn(&Attrs) -> (bool, bool)),
    /// `FullyConnected`; the function reads `no_bias`.
    FullyConnected(fn(&Attrs) -> bool),
    /// `out = e(x, y)`, `x` input 0, with the expression and the scalar `y` chosen by the
    /// parameters (`Activation`'s `act_type`, `LeakyReLU`'s `slope`); `None`: a choice
    /// without a GPU form.
    MapBy(fn(&Attrs) -> Option<(&'static str, f64)>),
    /// A reduction over the axes the function flags (given the input's number of axes).
    Reduce(Reduction),
    /// `softmax` (`log`: log_softmax; `neg`: softmin); the function reads (axis,
    /// temperature, use_length).
    Softmax { log: bool, neg: bool, params: fn(&Attrs) -> (i64, Option<f64>, bool) },
    /// A backward operator's `out = e(x, y, s)`: `x` the output gradient (input 0), `y` input
    /// 1 when there is one, `s` the scalar the function reads (none: 0).
    MapGrad(&'static str, Option<fn(&Attrs) -> f64>),
    /// Likewise, the expression chosen by the parameters (`_backward_Activation`).
    MapGradBy(fn(&Attrs) -> &'static str),
    /// `out = e(x, y)` of inputs 0 and 1 with four scalars `p0..p3` read from the parameters
    /// (the optimizers' updates, written over input 0).
    Map2P(&'static str, fn(&Attrs) -> [f64; 4]),
    /// The backward of `sum` (`mean`: divided by the count): the output gradient broadcast
    /// back over the reduced axes the function flags.
    ReduceGrad { mean: bool, flags: fn(&Attrs, usize) -> Result<Vec<bool>> },
    /// The backward of a binary function: per input, the expression in `x` (the output
    /// gradient) and `y` (the backward input named, if any), summed back onto the input's
    /// shape where it was broadcast.
    BinaryGrad([(&'static str, Option<usize>); 2]),
    /// `_backward_FullyConnected`; the function reads `no_bias`.
    FullyConnectedGrad(fn(&Attrs) -> bool),
    /// `add_n`: the sum of every input.
    AddN,
    /// `multi_sgd_update`: `sgd_update`'s expression (a [`GpuKernel::Map2P`]) over each
    /// (weight, gradient) pair, with that weight's `p0..p3` from the function.
    MultiMap2P(&'static str, fn(&Attrs) -> Vec<[f64; 4]>),
    /// The backward of a copy or reshape: output 0 is the output gradient (converted to its
    /// dtype), any further output (the gradient of `reshape_like`'s shape input) zero.
    CopyGrad,
    /// `out = e(x)` of input 0 with four scalars `p0..p3` read from the parameters (`clip`).
    Map1P(&'static str, fn(&Attrs) -> [f64; 4]),
    /// `Convolution` through cuDNN, planned by the function from the parameters and the
    /// data's shape.
    Convolution(fn(&Attrs, &[usize]) -> Result<super::gpu_nn::ConvGpu>),
    /// `Pooling` through cuDNN, planned likewise.
    Pooling(fn(&Attrs, &[usize]) -> Result<super::gpu_nn::PoolGpu>),
    /// `BatchNorm`'s forward through cuDNN; the function reads the parameters.
    BatchNorm(fn(&Attrs) -> super::gpu_nn::BnGpu),
    /// `Concat` along the axis the function reads.
    Concat(fn(&Attrs) -> i64),
    /// `Dropout`; the function reads (p, whether mode is "always").
    Dropout(fn(&Attrs) -> (f64, bool)),
}

/// A reduction's GPU form: `init` folded with `combine(a, b)` over `pre(v)` of each element
/// (CUDA expressions; `mean` divides by the count).
#[derive(Clone, Copy)]
pub struct Reduction {
    pub init: &'static str,
    pub pre: &'static str,
    pub combine: &'static str,
    pub mean: bool,
    pub flags: fn(&Attrs, usize) -> Result<Vec<bool>>,
}

impl Reduction {
    /// The forms of stock's reductions by name (`sum`, `mean`, `prod`, `nansum`, `nanprod`,
    /// `max`, `min`).
    pub fn named(name: &str, flags: fn(&Attrs, usize) -> Result<Vec<bool>>) -> Option<Reduction> {
        let (init, pre, combine, mean) = match name {
            "sum" => ("T(0)", "v", "a + b", false),
            "mean" => ("T(0)", "v", "a + b", true),
            "prod" => ("T(1)", "v", "a * b", false),
            "nansum" => ("T(0)", "v != v ? T(0) : v", "a + b", false),
            "nanprod" => ("T(1)", "v != v ? T(1) : v", "a * b", false),
            "max" => ("T(-mx_inf())", "v", "mx_max(a, b)", false),
            "min" => ("T(mx_inf())", "v", "mx_min(a, b)", false),
            _ => return None,
        };
        Some(Reduction { init, pre, combine, mean, flags })
    }
}

impl std::fmt::Debug for GpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuKernel::Map1(e) => write!(f, "Map1({e})"),
            GpuKernel::Map2(e) => write!(f, "Map2({e})"),
            GpuKernel::Scalar(e, r, _) => write!(f, "Scalar({e}, {r})"),
            GpuKernel::Fill(_) => write!(f, "Fill"),
            GpuKernel::Dot(_) => write!(f, "Dot"),
            GpuKernel::BatchDot(_) => write!(f, "BatchDot"),
            GpuKernel::FullyConnected(_) => write!(f, "FullyConnected"),
            GpuKernel::MapBy(_) => write!(f, "MapBy"),
            GpuKernel::Reduce(r) => write!(f, "Reduce({}, {})", r.pre, r.combine),
            GpuKernel::Softmax { log, neg, .. } => write!(f, "Softmax(log {log}, neg {neg})"),
            GpuKernel::MapGrad(e, _) => write!(f, "MapGrad({e})"),
            GpuKernel::MapGradBy(_) => write!(f, "MapGradBy"),
            GpuKernel::Map2P(e, _) => write!(f, "Map2P({e})"),
            GpuKernel::ReduceGrad { mean, .. } => write!(f, "ReduceGrad(mean {mean})"),
            GpuKernel::BinaryGrad(sides) => write!(f, "BinaryGrad({sides:?})"),
            GpuKernel::FullyConnectedGrad(_) => write!(f, "FullyConnectedGrad"),
            GpuKernel::AddN => write!(f, "AddN"),
            GpuKernel::CopyGrad => write!(f, "CopyGrad"),
            GpuKernel::MultiMap2P(e, _) => write!(f, "MultiMap2P({e})"),
            GpuKernel::Map1P(e, _) => write!(f, "Map1P({e})"),
            GpuKernel::Convolution(_) => write!(f, "Convolution"),
            GpuKernel::Pooling(_) => write!(f, "Pooling"),
            GpuKernel::BatchNorm(_) => write!(f, "BatchNorm"),
            GpuKernel::Concat(_) => write!(f, "Concat"),
            GpuKernel::Dropout(_) => write!(f, "Dropout"),
        }
    }
}

/// The argument array of a kernel launch: the address of each (mutable) local, in order.
macro_rules! kernel_args {
    ($($v:ident),+ $(,)?) => {
        [$((&raw mut $v).cast::<c_void>()),+]
    };
}

/// Where the element-wise kernel's `x` and `y` come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `x = a[i]`.
    Unary,
    /// `x = a[ia]`, `y = b[ib]` (broadcast indices).
    Binary,
    /// `x = a[i]`, `y = s`.
    Scalar,
    /// `x = s`, `y = a[i]`.
    RScalar,
    /// `x = s`.
    Fill,
}

/// Most dimensions the broadcasting kernel takes (after merging).
pub const MAX_DIMS: usize = 8;

/// The kernel's geometry argument (must match the `Geo` struct of [`map_source`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Geo {
    /// 0: flat (every operand indexed by `i`).
    pub ndim: i64,
    pub shape: [i64; MAX_DIMS],
    pub sa: [i64; MAX_DIMS],
    pub sb: [i64; MAX_DIMS],
}

/// The kernel's four extra scalars `p0..p3` (must match the `P4` struct of [`map_source`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct P4([f64; 4]);

/// The C type of `dtype` in generated source (None: no GPU kernels for it yet).
pub fn ctype(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        _ => return None,
    })
}

/// Device helpers every element-wise kernel may call (stock's semantics: `mx_mod` is
/// Python's modulo with 0 for a zero divisor; `mx_max`/`mx_min` keep a NaN on the left).
const PRELUDE: &str = r#"template <typename T> __device__ __forceinline__ T mx_mod(T x, T y) {
  if (y == T(0)) return T(0);
  T r = fmod(x, y);
  return (r != T(0) && ((r < T(0)) != (y < T(0)))) ? r + y : r;
}
template <typename T> __device__ __forceinline__ T mx_max(T x, T y) { return (x > y || x != x) ? x : y; }
template <typename T> __device__ __forceinline__ T mx_min(T x, T y) { return (x < y || x != x) ? x : y; }
template <typename T> __device__ __forceinline__ T mx_sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
__device__ __forceinline__ double mx_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
template <typename T> __device__ __forceinline__ T mx_clip(T x, T c) { return x > c ? c : (x < -c ? -c : x); }
"#;

/// The CUDA source of one reduction kernel `mx_reduce`: a block per output element (grid
/// stride over outputs), its threads folding the reduced elements, then a tree in shared
/// memory. `RGeo` lists the kept axes (output order) and the reduced axes with the input's
/// strides.
pub fn reduce_source(t: &str, r: &Reduction) -> String {
    let (init, pre, combine) = (r.init, r.pre, r.combine);
    let mean = i32::from(r.mean);
    format!(
        r#"typedef {t} T;
struct RGeo {{ long long nk; long long ks[{MAX_DIMS}]; long long kst[{MAX_DIMS}]; long long nr; long long rs[{MAX_DIMS}]; long long rst[{MAX_DIMS}]; }};
{PRELUDE}
__device__ __forceinline__ T mx_pre(T v) {{ return {pre}; }}
__device__ __forceinline__ T mx_combine(T a, T b) {{ return {combine}; }}
extern "C" __global__ void mx_reduce(T* out, const T* in, unsigned long long m, unsigned long long k, int add, RGeo g) {{
  __shared__ T buf[{block}];
  for (unsigned long long o = blockIdx.x; o < m; o += gridDim.x) {{
    long long base = 0, r = (long long)o;
    for (int d = (int)g.nk - 1; d >= 0; --d) {{ base += (r % g.ks[d]) * g.kst[d]; r /= g.ks[d]; }}
    T acc = {init};
    for (unsigned long long j = threadIdx.x; j < k; j += blockDim.x) {{
      long long off = base, q = (long long)j;
      for (int d = (int)g.nr - 1; d >= 0; --d) {{ off += (q % g.rs[d]) * g.rst[d]; q /= g.rs[d]; }}
      acc = mx_combine(acc, mx_pre(in[off]));
    }}
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {{
      if (threadIdx.x < s) buf[threadIdx.x] = mx_combine(buf[threadIdx.x], buf[threadIdx.x + s]);
      __syncthreads();
    }}
    if (threadIdx.x == 0) {{
      T v = buf[0];
      if ({mean}) v = v / (T)k;
      out[o] = add ? (T)(out[o] + v) : v;
    }}
    __syncthreads();
  }}
}}
"#,
        block = cuda::rtc::BLOCK
    )
}

/// The CUDA source of the softmax kernel `mx_softmax` (`log`, `neg` as the operator): a
/// block per row along the axis (rows `inner` apart), max and sum by trees in shared memory.
pub fn softmax_source(ti: &str, to: &str, log: bool, neg: bool) -> String {
    let sign = if neg { "-" } else { "" };
    let write = if log { "(v - mx) - logf_sum" } else { "exp(v - mx) / sum" };
    format!(
        r#"typedef {ti} T;
typedef {to} TO;
{PRELUDE}
extern "C" __global__ void mx_softmax(TO* out, const T* in, unsigned long long rows, unsigned long long k, unsigned long long inner, double scale_in, int add) {{
  __shared__ T buf[{block}];
  const T scale = (T)scale_in;
  for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {{
    const unsigned long long base = (row / inner) * k * inner + (row % inner);
    T mx = T(-mx_inf());
    for (unsigned long long j = threadIdx.x; j < k; j += blockDim.x) mx = mx_max(mx, {sign}in[base + j * inner] * scale);
    buf[threadIdx.x] = mx;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {{
      if (threadIdx.x < s) buf[threadIdx.x] = mx_max(buf[threadIdx.x], buf[threadIdx.x + s]);
      __syncthreads();
    }}
    mx = buf[0];
    __syncthreads();
    T sum = T(0);
    for (unsigned long long j = threadIdx.x; j < k; j += blockDim.x) sum += exp({sign}in[base + j * inner] * scale - mx);
    buf[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {{
      if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
      __syncthreads();
    }}
    sum = buf[0];
    const T logf_sum = log(sum);
    (void)logf_sum;
    for (unsigned long long j = threadIdx.x; j < k; j += blockDim.x) {{
      const T v = {sign}in[base + j * inner] * scale;
      const TO w = (TO)({write});
      const unsigned long long i = base + j * inner;
      out[i] = add ? (TO)(out[i] + w) : w;
    }}
    __syncthreads();
  }}
}}
"#,
        block = cuda::rtc::BLOCK
    )
}

/// The reduction geometry: kept and reduced axes of `shape` (size-1 axes dropped, runs
/// contiguous in the input merged), as `RGeo`; with the output and reduced counts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RGeo {
    pub nk: i64,
    pub ks: [i64; MAX_DIMS],
    pub kst: [i64; MAX_DIMS],
    pub nr: i64,
    pub rs: [i64; MAX_DIMS],
    pub rst: [i64; MAX_DIMS],
}

/// [`RGeo`] of reducing the flagged axes of `shape`; returns it with (outputs, reduced count).
pub fn reduce_geometry(shape: &[usize], flags: &[bool]) -> Result<(RGeo, usize, usize)> {
    let mut strides = vec![0i64; shape.len()];
    let mut s = 1i64;
    for d in (0..shape.len()).rev() {
        strides[d] = s;
        s *= shape[d] as i64;
    }
    let group = |want: bool| {
        let mut dims: Vec<(i64, i64)> = Vec::new();
        for d in 0..shape.len() {
            if flags[d] != want || shape[d] == 1 {
                continue;
            }
            let (n, st) = (shape[d] as i64, strides[d]);
            match dims.last_mut() {
                Some(last) if last.1 == st * n => *last = (last.0 * n, st),
                _ => dims.push((n, st)),
            }
        }
        dims
    };
    let (kept, red) = (group(false), group(true));
    if kept.len() > MAX_DIMS || red.len() > MAX_DIMS {
        return Err(Error::not_supported(format!(
            "a GPU reduction of shape {shape:?} over more than {MAX_DIMS} axis groups"
        )));
    }
    let mut g = RGeo { nk: kept.len() as i64, nr: red.len() as i64, ..RGeo::default() };
    for (i, (n, st)) in kept.iter().enumerate() {
        (g.ks[i], g.kst[i]) = (*n, *st);
    }
    for (i, (n, st)) in red.iter().enumerate() {
        (g.rs[i], g.rst[i]) = (*n, *st);
    }
    let m = kept.iter().map(|d| d.0 as usize).product();
    let k = red.iter().map(|d| d.0 as usize).product();
    Ok((g, m, k))
}

/// The CUDA source of one element-wise kernel `mx_map`: `out[i] = e(x, y)` computed in the
/// input type `ti`, stored as `to`, added to `out[i]` when `add` is set.
pub fn map_source(form: Form, ti: &str, to: &str, expr: &str) -> String {
    let (x, y) = match form {
        Form::Unary => ("a[ia]", "T(0)"),
        Form::Binary => ("a[ia]", "b[ib]"),
        Form::Scalar => ("a[ia]", "s"),
        Form::RScalar => ("s", "a[ia]"),
        Form::Fill => ("s", "T(0)"),
    };
    format!(
        r#"typedef {ti} T;
typedef {to} TO;
struct Geo {{ long long ndim; long long shape[{MAX_DIMS}]; long long sa[{MAX_DIMS}]; long long sb[{MAX_DIMS}]; }};
struct P4 {{ double v[4]; }};
{PRELUDE}
extern "C" __global__ void mx_map(TO* out, const T* a, const T* b, unsigned long long n, double s_in, int add, Geo g, P4 p) {{
  const T s = (T)s_in;
  const T p0 = (T)p.v[0], p1 = (T)p.v[1], p2 = (T)p.v[2], p3 = (T)p.v[3];
  (void)s; (void)p0; (void)p1; (void)p2; (void)p3;
  const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
    long long ia = (long long)i, ib = (long long)i;
    if (g.ndim > 0) {{
      long long r = (long long)i;
      ia = 0; ib = 0;
      for (int d = (int)g.ndim - 1; d >= 0; --d) {{
        long long c = r % g.shape[d];
        r /= g.shape[d];
        ia += c * g.sa[d];
        ib += c * g.sb[d];
      }}
    }}
    const T x = {x};
    const T y = {y};
    (void)x; (void)y; (void)ib;
    const TO v = (TO)({expr});
    out[i] = add ? (TO)(out[i] + v) : v;
  }}
}}
"#
    )
}

/// Strides of `shape` broadcast to `out` (right-aligned; 0 along broadcast axes).
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Result<Vec<i64>> {
    let lead = out.len().checked_sub(shape.len()).ok_or_else(|| Error::internal("broadcast: input has more axes"))?;
    let mut strides = vec![0i64; out.len()];
    let mut s = 1i64;
    for d in (0..shape.len()).rev() {
        let (n, o) = (shape[d], out[lead + d]);
        if n == o && n != 1 {
            strides[lead + d] = s;
        } else if n != 1 {
            return Err(Error::value(format!("cannot broadcast shape {shape:?} to {out:?}")));
        }
        s *= n as i64;
    }
    Ok(strides)
}

/// The geometry of `out = f(a, b)`: flat when both have the output's shape; otherwise the
/// output's axes with each operand's strides, runs of axes that are contiguous in both
/// merged into one.
pub fn geometry(a: &[usize], b: &[usize], out: &[usize]) -> Result<Geo> {
    if a == out && b == out {
        return Ok(Geo::default());
    }
    let (sa, sb) = (broadcast_strides(a, out)?, broadcast_strides(b, out)?);
    let mut dims: Vec<(i64, i64, i64)> = Vec::new();
    for d in 0..out.len() {
        let (n, x, y) = (out[d] as i64, sa[d], sb[d]);
        if n == 1 {
            continue;
        }
        if let Some(last) = dims.last_mut() {
            // The previous (outer) axis continues this one in both operands.
            if last.1 == x * n && last.2 == y * n {
                *last = (last.0 * n, x, y);
                continue;
            }
        }
        dims.push((n, x, y));
    }
    if dims.len() > MAX_DIMS {
        return Err(Error::not_supported(format!(
            "broadcasting {a:?} with {b:?} on a GPU ({} axes after merging; at most {MAX_DIMS})",
            dims.len()
        )));
    }
    let mut g = Geo { ndim: dims.len().max(1) as i64, ..Geo::default() };
    if dims.is_empty() {
        g.shape[0] = 1;
    }
    for (i, (n, x, y)) in dims.into_iter().enumerate() {
        (g.shape[i], g.sa[i], g.sb[i]) = (n, x, y);
    }
    Ok(g)
}

/// Whether the float32 GEMMs may use TF32 tensor cores: stock converts float32 to the
/// tensor cores' precision only when `MXNET_CUDA_ALLOW_TENSOR_CORE` (default on) and
/// `MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION` (default off) are both set.
pub fn tf32_allowed() -> Result<bool> {
    let reg = crate::config::global();
    const BY: &str = "GPU matrix products";
    let tc = reg.get_bool("MXNET_CUDA_ALLOW_TENSOR_CORE", BY)?.unwrap_or(true);
    let conv = reg.get_bool("MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION", BY)?.unwrap_or(false);
    Ok(tc && conv)
}

pub(super) fn float_dtype(op: &str, dtype: DType) -> Result<cuda::blas::Real> {
    match dtype {
        DType::F32 => Ok(cuda::blas::Real::F32),
        DType::F64 => Ok(cuda::blas::Real::F64),
        d => Err(Error::not_supported(format!("operator {op} on a GPU for {}", d.name()))),
    }
}

/// Run `k`, the GPU form of operator `op`, on GPU `dev`; returns when the device is done.
pub(crate) fn run(op: &str, k: GpuKernel, cx: &OpCtx, dev: i32, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let req0 = cx.req[0];
    let none = [0.0; 4];
    match k {
        GpuKernel::Map1(e) => map(op, dev, req0, Form::Unary, e, ins, &outs[0], 0.0, none)?,
        GpuKernel::Map2(e) => map(op, dev, req0, Form::Binary, e, ins, &outs[0], 0.0, none)?,
        GpuKernel::Scalar(e, rev, scalar) => {
            let form = if rev { Form::RScalar } else { Form::Scalar };
            map(op, dev, req0, form, e, ins, &outs[0], scalar(cx.attrs), none)?
        }
        GpuKernel::Fill(value) => map(op, dev, req0, Form::Fill, "x", ins, &outs[0], value(cx), none)?,
        GpuKernel::Dot(t) => dot(op, dev, cx, ins, outs, false, t(cx.attrs))?,
        GpuKernel::BatchDot(t) => dot(op, dev, cx, ins, outs, true, t(cx.attrs))?,
        GpuKernel::FullyConnected(no_bias) => fully_connected(op, dev, cx, ins, outs, no_bias(cx.attrs))?,
        GpuKernel::MapBy(choose) => {
            let (e, s) = choose(cx.attrs)
                .ok_or_else(|| Error::not_supported(format!("operator {op} on a GPU with these parameters")))?;
            map(op, dev, req0, Form::Scalar, e, &ins[..1], &outs[0], s, none)?
        }
        GpuKernel::Reduce(r) => reduce(op, dev, cx, &r, ins, outs)?,
        GpuKernel::Softmax { log, neg, params } => softmax(op, dev, cx, log, neg, params(cx.attrs), ins, outs)?,
        GpuKernel::MapGrad(e, scalar) => {
            let form = if ins.len() > 1 { Form::Binary } else { Form::Unary };
            let s = scalar.map_or(0.0, |f| f(cx.attrs));
            map(op, dev, req0, form, e, &ins[..ins.len().min(2)], &outs[0], s, none)?
        }
        GpuKernel::MapGradBy(choose) => {
            map(op, dev, req0, Form::Binary, choose(cx.attrs), &ins[..2], &outs[0], 0.0, none)?
        }
        GpuKernel::Map2P(e, params) => map(op, dev, req0, Form::Binary, e, &ins[..2], &outs[0], 0.0, params(cx.attrs))?,
        GpuKernel::ReduceGrad { mean, flags } => reduce_grad(op, dev, cx, mean, flags, ins, outs)?,
        GpuKernel::BinaryGrad(sides) => binary_grad(op, dev, cx, sides, ins, outs)?,
        GpuKernel::FullyConnectedGrad(no_bias) => fully_connected_grad(op, dev, cx, ins, outs, no_bias(cx.attrs))?,
        GpuKernel::MultiMap2P(e, params) => {
            let ps = params(cx.attrs);
            if ins.len() != 2 * ps.len() || outs.len() < ps.len() {
                return Err(Error::internal(format!("{op}: {} inputs for {} weights", ins.len(), ps.len())));
            }
            for (i, p) in ps.into_iter().enumerate() {
                map(op, dev, cx.req[i], Form::Binary, e, &ins[2 * i..2 * i + 2], &outs[i], 0.0, p)?;
            }
        }
        GpuKernel::CopyGrad => {
            map(op, dev, req0, Form::Unary, "x", &ins[..1], &outs[0], 0.0, none)?;
            for (o, &req) in outs.iter().zip(cx.req).skip(1) {
                map(op, dev, req, Form::Fill, "x", &[], o, 0.0, none)?;
            }
        }
        GpuKernel::Map1P(e, params) => map(op, dev, req0, Form::Unary, e, &ins[..1], &outs[0], 0.0, params(cx.attrs))?,
        GpuKernel::Convolution(plan) => {
            super::gpu_nn::convolution(op, dev, cx, plan(cx.attrs, &ins[0].shape)?, ins, outs)?
        }
        GpuKernel::Pooling(plan) => super::gpu_nn::pooling(op, dev, cx, plan(cx.attrs, &ins[0].shape)?, ins, outs)?,
        GpuKernel::BatchNorm(params) => super::gpu_nn::batch_norm(op, dev, cx, params(cx.attrs), ins, outs)?,
        GpuKernel::Concat(dim) => super::gpu_nn::concat(op, dev, cx, dim(cx.attrs), ins, outs)?,
        GpuKernel::Dropout(params) => super::gpu_nn::dropout(op, dev, cx, params(cx.attrs), ins, outs)?,
        GpuKernel::AddN => {
            for (j, x) in ins.iter().enumerate() {
                let req = if j == 0 { req0 } else { Req::Add };
                map(op, dev, req, Form::Unary, "x", std::slice::from_ref(x), &outs[0], 0.0, none)?;
            }
        }
    }
    cuda::sync(dev)
}

pub(super) fn add_of(req: Req) -> i32 {
    i32::from(req == Req::Add)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn map(
    op: &str,
    dev: i32,
    req: Req,
    form: Form,
    expr: &str,
    ins: &[TBlob],
    o: &OutBlob,
    s: f64,
    p: [f64; 4],
) -> Result<()> {
    if req == Req::Null {
        return Ok(());
    }
    let in_dtype = ins.first().map_or(o.dtype, |x| x.dtype);
    let float = matches!(in_dtype, DType::F32 | DType::F64);
    // Integer data only converts and fills: the expressions are written for floats.
    let (Some(ti), Some(to)) = (ctype(in_dtype), ctype(o.dtype)) else {
        return Err(Error::not_supported(format!(
            "operator {op} on a GPU for {} to {}",
            in_dtype.name(),
            o.dtype.name()
        )));
    };
    let converts_or_fills = expr == "x" && matches!(form, Form::Unary | Form::Fill);
    if !(float || converts_or_fills) {
        return Err(Error::not_supported(format!("operator {op} on a GPU for {}", in_dtype.name())));
    }
    let geo = match form {
        Form::Binary => geometry(&ins[0].shape, &ins[1].shape, &o.shape)?,
        _ => Geo::default(),
    };
    let key = format!("map/{form:?}/{ti}/{to}/{expr}");
    let kern = cuda::rtc::kernel(dev, &key, "mx_map", || map_source(form, ti, to, expr))?;
    let a = ins.first().map_or(0, TBlob::device_ptr);
    let b = ins.get(1).map_or(0, TBlob::device_ptr);
    // SAFETY: `a` and `b` address the inputs' elements as the geometry indexes them and the
    // output holds its `size()` elements, all device memory of `dev` held by this operation.
    unsafe { launch_map(dev, &kern, o.device_ptr(), a, b, o.size(), s, add_of(req), geo, p) }
}

/// Launch an `mx_map` kernel ([`map_source`]) over `n` outputs.
///
/// # Safety
/// `out` must hold `n` elements of the kernel's output type and `a`, `b` the elements the
/// kernel's form and `geo` read, all device memory of `dev` that this operation holds.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_map(
    dev: i32,
    kern: &cuda::rtc::Kernel,
    out: u64,
    a: u64,
    b: u64,
    n: usize,
    s: f64,
    add: i32,
    geo: Geo,
    p: [f64; 4],
) -> Result<()> {
    let (mut out, mut a, mut b, mut n64, mut s, mut add, mut geo) = (out, a, b, n as u64, s, add, geo);
    let mut p = P4(p);
    let mut params = kernel_args![out, a, b, n64, s, add, geo, p];
    // SAFETY: the parameters match `mx_map`'s signature in order and type (pointers as
    // 64-bit device addresses, `Geo` as the `#[repr(C)]` struct of the same layout); the
    // memory they reach is the caller's contract.
    unsafe { cuda::rtc::launch(dev, kern, n, &mut params) }
}

fn reduce(op: &str, dev: i32, cx: &OpCtx, r: &Reduction, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let x = &ins[0];
    let flags = (r.flags)(cx.attrs, x.ndim())?;
    // SAFETY: the input's elements and the output (the reduced shape's elements) are device
    // memory of `dev` held by this operation.
    unsafe { reduce_into(op, dev, cx.req[0], r, x.dtype, &x.shape, &flags, x.device_ptr(), outs[0].device_ptr()) }
}

/// Reduce the flagged axes of `shape` (elements of `dtype` at `input`) into `out` (the kept
/// axes' elements, in order).
///
/// # Safety
/// `input` and `out` must be device memory of `dev` holding those elements, `out` apart from
/// `input` and writable.
#[allow(clippy::too_many_arguments)]
unsafe fn reduce_into(
    op: &str,
    dev: i32,
    req: Req,
    r: &Reduction,
    dtype: DType,
    shape: &[usize],
    flags: &[bool],
    input: u64,
    out: u64,
) -> Result<()> {
    if req == Req::Null {
        return Ok(());
    }
    let t = match dtype {
        DType::F32 | DType::F64 => ctype(dtype).expect("float"),
        d => return Err(Error::not_supported(format!("operator {op} on a GPU for {}", d.name()))),
    };
    let (mut geo, m, k) = reduce_geometry(shape, flags)?;
    if m == 0 {
        return Ok(());
    }
    let key = format!("reduce/{t}/{}/{}/{}/{}", r.init, r.pre, r.combine, r.mean);
    let kern = cuda::rtc::kernel(dev, &key, "mx_reduce", || reduce_source(t, r))?;
    let (mut out, mut a) = (out, input);
    let (mut m64, mut k64) = (m as u64, k as u64);
    let mut add = add_of(req);
    let mut params = kernel_args![out, a, m64, k64, add, geo];
    // SAFETY: `mx_reduce`'s parameters in order and type (`RGeo` is `#[repr(C)]` like the
    // source's struct); the geometry addresses only the input's elements and `out` holds the
    // `m` outputs (the caller's contract).
    unsafe { cuda::rtc::launch_blocks(dev, &kern, m.min(cuda::rtc::MAX_BLOCKS), &mut params) }
}

/// The plain sum, for gradients summed back onto a broadcast input.
fn sum_reduction() -> Reduction {
    Reduction { init: "T(0)", pre: "v", combine: "a + b", mean: false, flags: |_, n| Ok(vec![true; n]) }
}

/// `_backward_sum`/`_backward_mean`: dx (the input's shape) = the output gradient broadcast
/// back over the reduced axes (divided by their count for `mean`).
fn reduce_grad(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    mean: bool,
    flags: fn(&Attrs, usize) -> Result<Vec<bool>>,
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    let dx = &outs[0];
    let fl = flags(cx.attrs, dx.ndim())?;
    let kept: Vec<usize> = dx.shape.iter().zip(&fl).map(|(&d, &r)| if r { 1 } else { d }).collect();
    let count: usize = dx.shape.iter().zip(&fl).filter(|(_, &r)| r).map(|(&d, _)| d).product();
    let s = if mean && count > 0 { 1.0 / count as f64 } else { 1.0 };
    let g = &ins[0];
    if g.size() != kept.iter().product::<usize>() {
        return Err(Error::internal(format!("{op}: gradient of {} elements for a reduction to {kept:?}", g.size())));
    }
    let (ti, to) = float_types(op, g.dtype, dx.dtype)?;
    let geo = geometry(&kept, &kept, &dx.shape)?;
    let kern = cuda::rtc::kernel(dev, &format!("map/Binary/{ti}/{to}/x * s"), "mx_map", || {
        map_source(Form::Binary, ti, to, "x * s")
    })?;
    // SAFETY: the gradient holds the kept shape's elements (checked), indexed by the
    // geometry; dx holds its shape's elements; device memory of `dev` of this operation.
    unsafe {
        launch_map(
            dev,
            &kern,
            dx.device_ptr(),
            g.device_ptr(),
            g.device_ptr(),
            dx.size(),
            s,
            add_of(cx.req[0]),
            geo,
            [0.0; 4],
        )
    }
}

fn float_types(op: &str, a: DType, b: DType) -> Result<(&'static str, &'static str)> {
    match (a, b) {
        (DType::F32 | DType::F64, DType::F32 | DType::F64) => Ok((ctype(a).expect("float"), ctype(b).expect("float"))),
        _ => Err(Error::not_supported(format!("operator {op} on a GPU for {} to {}", a.name(), b.name()))),
    }
}

/// The gradients of a binary function (`sides[i]` for input `i`), each summed back onto its
/// input's shape where the forward broadcast it.
fn binary_grad(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    sides: [(&'static str, Option<usize>); 2],
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    let g = &ins[0];
    let t = float_types(op, g.dtype, g.dtype)?.0;
    for (i, (expr, operand)) in sides.into_iter().enumerate() {
        let req = cx.req[i];
        if req == Req::Null || i >= outs.len() {
            continue;
        }
        let y = operand.map_or(g, |j| &ins[j]);
        let geo = geometry(&g.shape, &y.shape, &g.shape)?;
        let kern = cuda::rtc::kernel(dev, &format!("map/Binary/{t}/{t}/{expr}"), "mx_map", || {
            map_source(Form::Binary, t, t, expr)
        })?;
        let o = &outs[i];
        if o.size() == g.size() {
            // SAFETY: g and y are read as the geometry indexes them; the output holds g's
            // size; device memory of `dev` held by this operation.
            unsafe {
                launch_map(
                    dev,
                    &kern,
                    o.device_ptr(),
                    g.device_ptr(),
                    y.device_ptr(),
                    g.size(),
                    0.0,
                    add_of(req),
                    geo,
                    [0.0; 4],
                )?
            };
            continue;
        }
        // Broadcast in the forward: the full-size gradient into a temporary, summed over the
        // broadcast axes (leading ones, and those of size 1 in the input).
        let lead = g.ndim() - o.ndim();
        let flags: Vec<bool> = (0..g.ndim()).map(|d| d < lead || (o.shape[d - lead] == 1 && g.shape[d] != 1)).collect();
        let tmp = crate::storage::Block::alloc(g.bytes().max(1), crate::context::Context::gpu(dev))?;
        let tmp_ptr = tmp.ptr() as usize as u64;
        // SAFETY: the temporary holds g's size, owned here; then it is reduced into the
        // output (the kept axes of g's shape are the output's elements, in order). The stream
        // is waited for before the temporary goes back to its pool.
        unsafe {
            launch_map(dev, &kern, tmp_ptr, g.device_ptr(), y.device_ptr(), g.size(), 0.0, 0, geo, [0.0; 4])?;
            reduce_into(op, dev, req, &sum_reduction(), g.dtype, &g.shape, &flags, tmp_ptr, o.device_ptr())?;
        }
        cuda::sync(dev)?;
        drop(tmp);
    }
    Ok(())
}

/// `_backward_FullyConnected(dy, x, w) -> (dx, dw[, db])`.
fn fully_connected_grad(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    no_bias: bool,
) -> Result<()> {
    let (dy, x, w) = (&ins[0], &ins[1], &ins[2]);
    let real = float_dtype(op, dy.dtype)?;
    let hidden = w.shape[0];
    let k = w.shape.get(1).copied().unwrap_or(1);
    let rows = dy.size().checked_div(hidden).unwrap_or(0);
    if rows * hidden * k == 0 {
        return Err(Error::not_supported(format!("{op} with an empty dimension on a GPU")));
    }
    if cx.req[0] != Req::Null {
        let g = gemm(real, cx.req[0], (false, false), (rows, k, hidden))?;
        // SAFETY: dy (rows, hidden), w (hidden, k), dx (rows, k): device memory of `dev`.
        unsafe { cuda::blas::gemm(dev, &g, dy.device_ptr(), w.device_ptr(), outs[0].device_ptr())? };
    }
    if cx.req[1] != Req::Null {
        let g = gemm(real, cx.req[1], (true, false), (hidden, k, rows))?;
        // SAFETY: dyᵀ (hidden, rows), x (rows, k), dw (hidden, k): device memory of `dev`.
        unsafe { cuda::blas::gemm(dev, &g, dy.device_ptr(), x.device_ptr(), outs[1].device_ptr())? };
    }
    if !no_bias && outs.len() > 2 && cx.req[2] != Req::Null {
        // SAFETY: dy's (rows, hidden) elements summed over rows into db's hidden elements.
        unsafe {
            reduce_into(
                op,
                dev,
                cx.req[2],
                &sum_reduction(),
                dy.dtype,
                &[rows, hidden],
                &[true, false],
                dy.device_ptr(),
                outs[2].device_ptr(),
            )?
        };
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn softmax(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    log: bool,
    neg: bool,
    (axis, temperature, use_length): (i64, Option<f64>, bool),
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    let req = cx.req[0];
    if req == Req::Null {
        return Ok(());
    }
    if use_length {
        return Err(Error::not_supported(format!("operator {op} with use_length on a GPU")));
    }
    let x = &ins[0];
    let (ti, to) = match (x.dtype, outs[0].dtype) {
        (DType::F32 | DType::F64, DType::F32 | DType::F64) => {
            (ctype(x.dtype).expect("float"), ctype(outs[0].dtype).expect("float"))
        }
        (d, e) => return Err(Error::not_supported(format!("operator {op} on a GPU for {} to {}", d.name(), e.name()))),
    };
    let nd = x.ndim() as i64;
    let ax = if axis < 0 { axis + nd } else { axis };
    if ax < 0 || ax >= nd {
        return Err(Error::value(format!("operator {op}: axis {axis} is out of range for {nd} axes")));
    }
    let ax = ax as usize;
    let k = x.shape[ax];
    let inner: usize = x.shape[ax + 1..].iter().product();
    let rows = x.size().checked_div(k).unwrap_or(0);
    if rows == 0 {
        return Ok(());
    }
    let kern = cuda::rtc::kernel(dev, &format!("softmax/{ti}/{to}/{log}/{neg}"), "mx_softmax", || {
        softmax_source(ti, to, log, neg)
    })?;
    let (mut out, mut a) = (outs[0].device_ptr(), x.device_ptr());
    let (mut rows64, mut k64, mut inner64) = (rows as u64, k as u64, inner as u64);
    let mut scale = 1.0 / temperature.unwrap_or(1.0);
    let mut add = add_of(req);
    let mut params = kernel_args![out, a, rows64, k64, inner64, scale, add];
    // SAFETY: `mx_softmax`'s parameters in order and type; rows × k elements at the given
    // strides are exactly the input's and the output's (same shape), device memory of `dev`.
    unsafe { cuda::rtc::launch_blocks(dev, &kern, rows.min(cuda::rtc::MAX_BLOCKS), &mut params) }
}

/// One row-major GEMM `C (m, n) = op(A) · op(B)`, added to C for [`Req::Add`], in the math
/// mode the configuration allows.
fn gemm(
    real: cuda::blas::Real,
    req: Req,
    (trans_a, trans_b): (bool, bool),
    (m, n, k): (usize, usize, usize),
) -> Result<cuda::blas::Gemm> {
    Ok(cuda::blas::Gemm {
        real,
        trans_a,
        trans_b,
        m,
        n,
        k,
        alpha: 1.0,
        beta: if req == Req::Add { 1.0 } else { 0.0 },
        batch: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
        tf32: tf32_allowed()?,
    })
}

/// `dot` (`batch`: `batch_dot`) as one (batched) GEMM.
fn dot(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    ins: &[TBlob],
    outs: &mut [OutBlob],
    batch: bool,
    (ta, tb): (bool, bool),
) -> Result<()> {
    let req = cx.req[0];
    if req == Req::Null {
        return Ok(());
    }
    let real = float_dtype(op, ins[0].dtype)?;
    let (l, r) = (&ins[0].shape[..], &ins[1].shape[..]);
    let prod = |s: &[usize]| s.iter().product::<usize>();
    let g = if batch {
        let (bs, lm, lk) = (l[0], l[1], l[2]);
        let (rk, rn) = (r[1], r[2]);
        let (m, k) = if ta { (lk, lm) } else { (lm, lk) };
        let n = if tb { rk } else { rn };
        cuda::blas::Gemm {
            batch: bs,
            stride_a: lm * lk,
            stride_b: rk * rn,
            stride_c: m * n,
            ..gemm(real, req, (ta, tb), (m, n, k))?
        }
    } else {
        let (m, k) = if ta { (prod(&l[1..]), l[0]) } else { (prod(&l[..l.len() - 1]), l[l.len() - 1]) };
        let n = if r.len() == 1 {
            1
        } else if tb {
            prod(&r[..r.len() - 1])
        } else {
            prod(&r[1..])
        };
        gemm(real, req, (ta && l.len() > 1, tb && r.len() > 1), (m, n, k))?
    };
    if g.m * g.n == 0 {
        return Ok(());
    }
    if g.k == 0 {
        return zero_or_keep(dev, cx, outs);
    }
    // SAFETY: the inputs and the output are device memory of `dev` of the shapes the plan
    // reads and writes (inference checked them); the output does not overlap an input (the
    // operator declares no in-place pair, so overlapping outputs went to temporaries).
    unsafe { cuda::blas::gemm(dev, &g, ins[0].device_ptr(), ins[1].device_ptr(), outs[0].device_ptr()) }
}

/// An empty inner dimension: the product is zeros (added: nothing changes).
fn zero_or_keep(dev: i32, cx: &OpCtx, outs: &mut [OutBlob]) -> Result<()> {
    if cx.req[0] == Req::Add {
        return Ok(());
    }
    // SAFETY: the output's bytes are device memory of `dev` this operation writes.
    unsafe { cuda::memset(dev, outs[0].device_ptr(), 0, outs[0].bytes()) }
}

/// `FullyConnected`: `out = data · weightᵀ (+ bias)`, data as (rows, input size).
fn fully_connected(op: &str, dev: i32, cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], no_bias: bool) -> Result<()> {
    let req = cx.req[0];
    if req == Req::Null {
        return Ok(());
    }
    let real = float_dtype(op, ins[0].dtype)?;
    let w = &ins[1].shape[..];
    let hidden = w[0];
    let k = w.get(1).copied().unwrap_or(1);
    let rows = ins[0].size().checked_div(k).unwrap_or(0);
    let g = gemm(real, req, (false, true), (rows, hidden, k))?;
    if rows * hidden == 0 {
        return Ok(());
    }
    if k == 0 {
        zero_or_keep(dev, cx, outs)?;
    } else {
        // SAFETY: as in `dot`: device memory of `dev` of the planned shapes, output apart.
        unsafe { cuda::blas::gemm(dev, &g, ins[0].device_ptr(), ins[1].device_ptr(), outs[0].device_ptr())? };
    }
    if !no_bias {
        // out (rows, hidden) += bias (hidden): the element-wise kernel with the output as
        // both its first operand and its destination, adding.
        let bias = &ins[2];
        let o = &outs[0];
        let to = ctype(o.dtype).expect("float");
        let kern =
            cuda::rtc::kernel(dev, &format!("map/bias/{to}"), "mx_map", || map_source(Form::Binary, to, to, "y"))?;
        let geo = geometry(&[rows, hidden], &[hidden], &[rows, hidden])?;
        // SAFETY: the output holds rows × hidden elements (read as `x` and written, adding),
        // the bias its hidden elements, indexed by the geometry.
        unsafe {
            launch_map(
                dev,
                &kern,
                o.device_ptr(),
                o.device_ptr(),
                bias.device_ptr(),
                rows * hidden,
                0.0,
                1,
                geo,
                [0.0; 4],
            )?
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_flat_for_equal_shapes_and_merges_contiguous_axes() {
        assert_eq!(geometry(&[2, 3], &[2, 3], &[2, 3]).unwrap(), Geo::default());
        // (2,3,4) + (4): one run of 6 rows over 4 columns.
        let g = geometry(&[2, 3, 4], &[4], &[2, 3, 4]).unwrap();
        assert_eq!(g.ndim, 2);
        assert_eq!((&g.shape[..2], &g.sa[..2], &g.sb[..2]), (&[6, 4][..], &[4, 1][..], &[0, 1][..]));
        // (2,1,4) + (3,1): both broadcast.
        let g = geometry(&[2, 1, 4], &[3, 1], &[2, 3, 4]).unwrap();
        assert_eq!(g.ndim, 3);
        assert_eq!((&g.shape[..3], &g.sa[..3], &g.sb[..3]), (&[2, 3, 4][..], &[4, 0, 1][..], &[0, 1, 0][..]));
        // A scalar-like operand.
        let g = geometry(&[1], &[5], &[5]).unwrap();
        assert_eq!((g.ndim, g.shape[0], g.sa[0], g.sb[0]), (1, 5, 0, 1));
        assert!(geometry(&[2], &[3], &[3]).is_err());
    }

    /// Golden: the generated source of one form (what NVRTC compiles; a change here is a
    /// change of every element-wise GPU kernel).
    #[test]
    fn map_source_golden() {
        let src = map_source(Form::Scalar, "float", "float", "mx_mod(x, y)");
        assert!(
            src.starts_with("typedef float T;\ntypedef float TO;\nstruct Geo { long long ndim; long long shape[8];")
        );
        assert!(src.contains(
            "extern \"C\" __global__ void mx_map(TO* out, const T* a, const T* b, unsigned long long n, double s_in, int add, Geo g, P4 p) {"
        ));
        assert!(src.contains("    const T x = a[ia];\n    const T y = s;\n"));
        assert!(src.contains("    const TO v = (TO)(mx_mod(x, y));\n    out[i] = add ? (TO)(out[i] + v) : v;\n"));
        let src = map_source(Form::RScalar, "double", "float", "x / y");
        assert!(src.contains("typedef double T;\ntypedef float TO;"));
        assert!(src.contains("    const T x = s;\n    const T y = a[ia];\n"));
        assert_eq!(std::mem::size_of::<Geo>(), 8 * (1 + 3 * MAX_DIMS));
    }

    #[test]
    fn reduce_geometry_groups_and_merges_axes() {
        // (2,3,4) over axis 1: kept (2 stride 12), (4 stride 1); reduced (3 stride 4).
        let (g, m, k) = reduce_geometry(&[2, 3, 4], &[false, true, false]).unwrap();
        assert_eq!((m, k, g.nk, g.nr), (8, 3, 2, 1));
        assert_eq!((&g.ks[..2], &g.kst[..2], g.rs[0], g.rst[0]), (&[2, 4][..], &[12, 1][..], 3, 4));
        // Everything: one merged reduced run, no kept axis (one output).
        let (g, m, k) = reduce_geometry(&[2, 3, 4], &[true, true, true]).unwrap();
        assert_eq!((m, k, g.nk, g.nr, g.rs[0], g.rst[0]), (1, 24, 0, 1, 24, 1));
        // Size-1 axes vanish.
        let (_, m, k) = reduce_geometry(&[5, 1, 7], &[false, true, true]).unwrap();
        assert_eq!((m, k), (5, 7));
    }

    #[test]
    fn reduce_and_softmax_sources_golden() {
        let r = Reduction::named("nansum", |_, n| Ok(vec![true; n])).unwrap();
        let src = reduce_source("double", &r);
        assert!(src.starts_with("typedef double T;\nstruct RGeo { long long nk;"));
        assert!(src.contains("__device__ __forceinline__ T mx_pre(T v) { return v != v ? T(0) : v; }"));
        assert!(src.contains("__device__ __forceinline__ T mx_combine(T a, T b) { return a + b; }"));
        assert!(src.contains("__shared__ T buf[256];"));
        assert!(src.contains("      if (0) v = v / (T)k;"));
        let src = softmax_source("float", "double", true, true);
        assert!(src.contains("mx = mx_max(mx, -in[base + j * inner] * scale);"));
        assert!(src.contains("const TO w = (TO)((v - mx) - logf_sum);"));
        assert!(Reduction::named("argmax", |_, n| Ok(vec![true; n])).is_none());
    }

    #[test]
    fn math_mode_follows_the_seed_variables() {
        // Defaults: tensor cores allowed, conversion of float32 not: no TF32.
        assert!(!tf32_allowed().unwrap());
    }
}
