//! cuDNN 9, loaded at run time: one handle per (thread, device) on that thread's stream, the
//! descriptors of each problem, and the forward convolution, pooling and batch normalisation
//! over raw device pointers.
//!
//! Owns: the handles, the descriptors (made once per thread and problem, kept in per-thread
//! caches of at most [`CACHE_LIMIT`] problems), the list of forward
//! convolution algorithms cuDNN offers for a problem (with their workspace and determinism,
//! for the selection under `cudnn_tune`), and the math mode (`tf32`: TF32 tensor cores for
//! float32, as stock allows with `MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION`; otherwise
//! plain FMA math). The operators' planning lives in `op::gpu_nn`.

use super::blas::Real;
use super::{guarded, stream};
use crate::error::{Error, Result};
use cudarc::cudnn::sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaStream;

/// Most problems each per-thread cache keeps; past it the cache starts again (a program whose
/// shapes keep changing must not grow it without end).
const CACHE_LIMIT: usize = 512;

/// A per-thread cache of what is made once per (device, problem).
type Cache<K, V> = RefCell<HashMap<(i32, K), Rc<V>>>;

/// The entry of `(dev, key)` in this thread's `cache`, made by `make` at its first use.
fn cached<K: Clone + Eq + std::hash::Hash, V>(
    cache: &'static std::thread::LocalKey<Cache<K, V>>,
    dev: i32,
    key: &K,
    make: impl FnOnce() -> Result<V>,
) -> Result<Rc<V>> {
    let k = (dev, key.clone());
    if let Some(v) = cache.with(|m| m.borrow().get(&k).cloned()) {
        return Ok(v);
    }
    let v = Rc::new(make()?);
    cache.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= CACHE_LIMIT {
            m.clear();
        }
        m.insert(k, v.clone())
    });
    Ok(v)
}

fn err(what: &str, dev: i32, e: impl std::fmt::Debug) -> Error {
    Error::mxnet(format!("cuDNN error on gpu({dev}) in {what}: {e:?}"))
}

/// The loaded cuDNN's version (`major * 10000 + minor * 100 + patch`), asked once: 0 when
/// there is no GPU or no cuDNN, or when the library found is not cuDNN 9, the version the
/// bindings describe (another major version's status codes are not values of the bindings'
/// enumerations, so it is not called at all).
pub fn version() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        // SAFETY: probes whether the library can be opened, then a query without arguments
        // (which every cuDNN version has, with this signature).
        let v =
            super::available() && guarded("loading cuDNN", || Ok(unsafe { sys::is_culib_present() })).unwrap_or(false);
        let v = if v { guarded("cudnnGetVersion", || Ok(unsafe { sys::cudnnGetVersion() })).unwrap_or(0) } else { 0 };
        // cuDNN 9 numbers versions major * 10000 + ...; cuDNN 8 major * 1000 + ...
        if v / 10000 == 9 {
            v
        } else {
            0
        }
    })
}

/// Whether cuDNN 9 was loaded (asked once: every call of a layer asks).
pub fn available() -> bool {
    version() > 0
}

/// A handle, with the stream it was bound to kept alive as long as it is.
struct Handle {
    raw: sys::cudnnHandle_t,
    _stream: Arc<CudaStream>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreate`, destroyed once (here).
        let _ = guarded("cudnnDestroy", || Ok(unsafe { sys::cudnnDestroy(self.raw) }));
    }
}

thread_local! {
    static HANDLES: RefCell<Vec<Option<Handle>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's handle on GPU `dev`, on this thread's stream.
fn handle(dev: i32) -> Result<sys::cudnnHandle_t> {
    let s = stream(dev)?;
    if !available() {
        return Err(Error::not_supported(
            "convolution, pooling and batch normalisation on a GPU without cuDNN 9 (libcudnn.so.9 could not be loaded)",
        ));
    }
    let i = dev as usize;
    let tls = HANDLES.try_with(|v| -> Result<sys::cudnnHandle_t> {
        let mut v = v.borrow_mut();
        if v.len() <= i {
            v.resize_with(i + 1, || None);
        }
        if v[i].is_none() {
            let mut h = std::ptr::null_mut();
            // SAFETY: writes one handle.
            guarded("cudnnCreate", || {
                unsafe { sys::cudnnCreate(&mut h) }.result().map_err(|e| err("cudnnCreate", dev, e))
            })?;
            v[i] = Some(Handle { raw: h, _stream: s.clone() });
        }
        Ok(v[i].as_ref().map(|h| h.raw).expect("just set"))
    });
    let h = tls.map_err(|_| Error::mxnet("cuDNN: a call on a thread that is exiting"))??;
    guarded("cudnnSetStream", || {
        // SAFETY: a live handle and this thread's live stream.
        unsafe { sys::cudnnSetStream(h, s.cu_stream() as _) }.result().map_err(|e| err("cudnnSetStream", dev, e))
    })?;
    Ok(h)
}

fn data_type(real: Real) -> sys::cudnnDataType_t {
    match real {
        Real::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        Real::F64 => sys::cudnnDataType_t::CUDNN_DATA_DOUBLE,
    }
}

/// A host scalar of the data's type (cuDNN reads `alpha`/`beta` as float for float data and
/// as double for double data).
#[derive(Clone, Copy)]
enum Scale {
    F32(f32),
    F64(f64),
}

impl Scale {
    fn of(real: Real, v: f64) -> Scale {
        match real {
            Real::F32 => Scale::F32(v as f32),
            Real::F64 => Scale::F64(v),
        }
    }
    fn ptr(&self) -> *const c_void {
        match self {
            Scale::F32(v) => (v as *const f32).cast(),
            Scale::F64(v) => (v as *const f64).cast(),
        }
    }
}

fn dims_i32(dev: i32, what: &str, v: &[usize]) -> Result<Vec<i32>> {
    v.iter()
        .map(|&d| {
            i32::try_from(d).map_err(|_| {
                Error::not_supported(format!("{what} on gpu({dev}) with a dimension of {d} (cuDNN takes 32-bit sizes)"))
            })
        })
        .collect()
}

/// Packed (row-major) strides of `dims`; None when one does not fit in 32 bits.
fn packed(dims: &[i32]) -> Option<Vec<i32>> {
    let mut s = vec![1i32; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1].checked_mul(dims[d + 1])?;
    }
    Some(s)
}

/// A cuDNN descriptor type: the owning wrapper `$name` of `sys::$raw`, made by `$name::create`
/// (with `$create`) and destroyed on drop (with `$destroy`).
macro_rules! descriptor {
    ($name:ident, $raw:ident, $create:ident, $destroy:ident) => {
        struct $name(sys::$raw);

        impl $name {
            fn create(dev: i32) -> Result<$name> {
                let mut d = std::ptr::null_mut();
                // SAFETY: writes one descriptor, owned by the wrapper from here on.
                unsafe { sys::$create(&mut d) }.result().map_err(|e| err(stringify!($create), dev, e))?;
                Ok($name(d))
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: made by `create`, destroyed once (here).
                let _ = guarded(stringify!($destroy), || Ok(unsafe { sys::$destroy(self.0) }));
            }
        }
    };
}

descriptor!(Tensor, cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor);
descriptor!(Filter, cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor);
descriptor!(
    ConvDesc,
    cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);
descriptor!(PoolDesc, cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor);

impl Tensor {
    /// A tensor descriptor of packed `dims` (4 or 5 of them).
    fn new(dev: i32, real: Real, dims: &[i32]) -> Result<Tensor> {
        let t = Tensor::create(dev)?;
        let strides = packed(dims).ok_or_else(|| {
            Error::not_supported(format!(
                "a tensor of shape {dims:?} on gpu({dev}) through cuDNN (its strides exceed 32 bits)"
            ))
        })?;
        // SAFETY: `dims` and `strides` hold `dims.len()` entries each.
        unsafe {
            sys::cudnnSetTensorNdDescriptor(t.0, data_type(real), dims.len() as i32, dims.as_ptr(), strides.as_ptr())
        }
        .result()
        .map_err(|e| err(&format!("cudnnSetTensorNdDescriptor {dims:?}"), dev, e))?;
        Ok(t)
    }
}

impl Filter {
    fn new(dev: i32, real: Real, dims: &[i32]) -> Result<Filter> {
        let f = Filter::create(dev)?;
        // SAFETY: `dims` holds `dims.len()` entries.
        unsafe {
            sys::cudnnSetFilterNdDescriptor(
                f.0,
                data_type(real),
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                dims.len() as i32,
                dims.as_ptr(),
            )
        }
        .result()
        .map_err(|e| err(&format!("cudnnSetFilterNdDescriptor {dims:?}"), dev, e))?;
        Ok(f)
    }
}

/// One forward convolution (cross-correlation, as MXNet's), channel-first, packed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvProblem {
    pub real: Real,
    /// Float32 may use TF32 tensor cores.
    pub tf32: bool,
    /// `[n, c, spatial...]` (2 or 3 spatial dimensions; callers widen 1-D problems).
    pub x: Vec<usize>,
    /// `[f, c / groups, kernel...]`.
    pub w: Vec<usize>,
    /// `[n, f, output...]`.
    pub y: Vec<usize>,
    pub pad: Vec<usize>,
    pub stride: Vec<usize>,
    pub dilate: Vec<usize>,
    pub groups: usize,
}

struct ConvDescs {
    x: Tensor,
    w: Filter,
    conv: ConvDesc,
    y: Tensor,
    /// `[1, f, 1, 1(, 1)]`: the bias added to `y`.
    bias: Tensor,
    real: Real,
}

impl ConvProblem {
    fn math(&self) -> sys::cudnnMathType_t {
        match (self.real, self.tf32) {
            (Real::F32, true) => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            _ => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        }
    }

    fn descs(&self, dev: i32) -> Result<ConvDescs> {
        const W: &str = "a convolution";
        let (x, w, y) = (dims_i32(dev, W, &self.x)?, dims_i32(dev, W, &self.w)?, dims_i32(dev, W, &self.y)?);
        let (pad, stride, dilate) =
            (dims_i32(dev, W, &self.pad)?, dims_i32(dev, W, &self.stride)?, dims_i32(dev, W, &self.dilate)?);
        let groups = dims_i32(dev, W, &[self.groups])?[0];
        let conv = ConvDesc::create(dev)?;
        // SAFETY: the three arrays hold `pad.len()` entries each; the descriptor is live.
        unsafe {
            sys::cudnnSetConvolutionNdDescriptor(
                conv.0,
                pad.len() as i32,
                pad.as_ptr(),
                stride.as_ptr(),
                dilate.as_ptr(),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                data_type(self.real),
            )
            .result()
            .map_err(|e| err("cudnnSetConvolutionNdDescriptor", dev, e))?;
            sys::cudnnSetConvolutionGroupCount(conv.0, groups)
                .result()
                .map_err(|e| err("cudnnSetConvolutionGroupCount", dev, e))?;
            sys::cudnnSetConvolutionMathType(conv.0, self.math())
                .result()
                .map_err(|e| err("cudnnSetConvolutionMathType", dev, e))?;
        }
        let mut b = vec![1i32; y.len()];
        b[1] = y[1];
        Ok(ConvDescs {
            x: Tensor::new(dev, self.real, &x)?,
            w: Filter::new(dev, self.real, &w)?,
            conv,
            y: Tensor::new(dev, self.real, &y)?,
            bias: Tensor::new(dev, self.real, &b)?,
            real: self.real,
        })
    }
}

/// The forward algorithms, by cuDNN's numbering.
const FWD_ALGOS: [(sys::cudnnConvolutionFwdAlgo_t, &str); 8] = {
    use sys::cudnnConvolutionFwdAlgo_t as A;
    [
        (A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, "cudnn_implicit_gemm"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, "cudnn_implicit_precomp_gemm"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM, "cudnn_gemm"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, "cudnn_direct"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_FFT, "cudnn_fft"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, "cudnn_fft_tiling"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, "cudnn_winograd"),
        (A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, "cudnn_winograd_nonfused"),
    ]
};

/// `cudnnConvolutionFwdAlgoPerf_t` read as plain integers: cuDNN's enumerations may hold
/// values a Rust enum does not list.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawPerf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [i32; 3],
}

/// One forward algorithm cuDNN offers for a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwdAlgo {
    /// Index into cuDNN's numbering (see [`FwdAlgo::name`]).
    pub algo: usize,
    pub workspace: usize,
    pub deterministic: bool,
}

impl FwdAlgo {
    /// A stable name (`cudnn_implicit_gemm`, ...), for the selection cache and the profiler.
    pub fn name(&self) -> &'static str {
        FWD_ALGOS[self.algo].1
    }
}

/// A convolution problem made ready on one thread: its descriptors and the forward algorithms
/// cuDNN's heuristics offer (best first; those that do not support the problem, or whose
/// workspace is over half the device's free memory when first asked, left out).
pub struct ConvPlan {
    descs: ConvDescs,
    pub algos: Vec<FwdAlgo>,
    /// Which algorithms have run on this thread (cuDNN prepares an algorithm at its first
    /// call, so a first call is no measure of its speed).
    warm: RefCell<Vec<bool>>,
}

impl ConvPlan {
    /// Whether algorithm `i` (an index into `algos`) runs here for the first time; marks it.
    pub fn first_use(&self, i: usize) -> bool {
        let mut w = self.warm.borrow_mut();
        !std::mem::replace(&mut w[i], true)
    }
}

thread_local! {
    /// This thread's plans by (device, problem): descriptors are made once, not per call.
    static CONV_PLANS: Cache<ConvProblem, ConvPlan> = RefCell::new(HashMap::new());
}

/// The plan of `p` on `dev` for this thread (made at its first use here).
pub fn conv_plan(dev: i32, p: &ConvProblem) -> Result<Rc<ConvPlan>> {
    cached(&CONV_PLANS, dev, p, || make_conv_plan(dev, p))
}

fn make_conv_plan(dev: i32, p: &ConvProblem) -> Result<ConvPlan> {
    let h = handle(dev)?;
    let (free, _) = super::memory_info(dev)?;
    guarded("cudnnGetConvolutionForwardAlgorithm_v7", || {
        let d = p.descs(dev)?;
        let mut perf = vec![RawPerf::default(); FWD_ALGOS.len()];
        let mut n = 0i32;
        // SAFETY: `perf` holds `FWD_ALGOS.len()` results of cuDNN's layout (`RawPerf`, checked
        // by a test), of which cuDNN writes the first `n`.
        unsafe {
            sys::cudnnGetConvolutionForwardAlgorithm_v7(
                h,
                d.x.0,
                d.w.0,
                d.conv.0,
                d.y.0,
                FWD_ALGOS.len() as i32,
                &mut n,
                perf.as_mut_ptr().cast::<sys::cudnnConvolutionFwdAlgoPerf_t>(),
            )
            .result()
            .map_err(|e| err("cudnnGetConvolutionForwardAlgorithm_v7", dev, e))?;
        }
        perf.truncate(usize::try_from(n).unwrap_or(0));
        let mut out: Vec<FwdAlgo> = Vec::new();
        for r in &perf {
            let algo = r.algo as usize;
            // Status 0 is CUDNN_STATUS_SUCCESS; numbers cuDNN may add later are skipped.
            if r.status != 0 || algo >= FWD_ALGOS.len() || out.iter().any(|o| o.algo == algo) {
                continue;
            }
            out.push(FwdAlgo { algo, workspace: r.memory, deterministic: r.determinism == 1 });
        }
        out.retain(|a| a.workspace <= free / 2);
        if out.is_empty() {
            return Err(Error::not_supported(format!(
                "a convolution on gpu({dev}) that no cuDNN algorithm supports within half the free memory ({free} bytes): {p:?}"
            )));
        }
        let warm = RefCell::new(vec![false; out.len()]);
        Ok(ConvPlan { descs: d, algos: out, warm })
    })
}

/// Where a forward convolution reads and writes (device addresses of `dev`).
#[derive(Debug, Clone, Copy)]
pub struct ConvIo {
    pub x: u64,
    pub w: u64,
    /// Added to every output channel when given (`[f]` elements).
    pub bias: Option<u64>,
    pub y: u64,
    /// The workspace and its size in bytes (0 and 0 when the algorithm needs none).
    pub ws: u64,
    pub ws_bytes: usize,
}

/// `y = conv(x, w) (+ bias)` with algorithm `algo` of `plan`, on this thread's stream (the
/// caller synchronises).
///
/// # Safety
/// The addresses of `io` must be device memory of `dev` holding the plan's packed tensors, `y`
/// writable and apart from the inputs, `ws` at least the algorithm's workspace.
pub unsafe fn conv_forward(dev: i32, plan: &ConvPlan, algo: FwdAlgo, io: ConvIo) -> Result<()> {
    let h = handle(dev)?;
    let d = &plan.descs;
    guarded("cudnnConvolutionForward", || {
        let real = d.real;
        let (one, zero) = (Scale::of(real, 1.0), Scale::of(real, 0.0));
        // SAFETY: per this function's contract; the descriptors describe the tensors.
        unsafe {
            sys::cudnnConvolutionForward(
                h,
                one.ptr(),
                d.x.0,
                io.x as *const c_void,
                d.w.0,
                io.w as *const c_void,
                d.conv.0,
                FWD_ALGOS[algo.algo].0,
                io.ws as *mut c_void,
                io.ws_bytes,
                zero.ptr(),
                d.y.0,
                io.y as *mut c_void,
            )
            .result()
            .map_err(|e| err(&format!("cudnnConvolutionForward ({})", algo.name()), dev, e))?;
            if let Some(b) = io.bias {
                sys::cudnnAddTensor(h, one.ptr(), d.bias.0, b as *const c_void, one.ptr(), d.y.0, io.y as *mut c_void)
                    .result()
                    .map_err(|e| err("cudnnAddTensor", dev, e))?;
            }
        }
        Ok(())
    })
}

/// `y += a`, `a` broadcast to `y` (size-1 axes of `a_dims`, as a convolution's bias
/// `[1, f, 1, 1]`), on this thread's stream.
///
/// # Safety
/// `y` must be device memory of `dev` holding the packed tensor `y_dims` (writable), `a` the
/// packed tensor `a_dims` (as many axes, each 1 or `y`'s), apart from `y`.
pub unsafe fn add_tensor(dev: i32, real: Real, a_dims: &[usize], a: u64, y_dims: &[usize], y: u64) -> Result<()> {
    let h = handle(dev)?;
    guarded("cudnnAddTensor", || {
        let (ad, yd) = (dims_i32(dev, "an addition", a_dims)?, dims_i32(dev, "an addition", y_dims)?);
        let (at, yt) = (Tensor::new(dev, real, &ad)?, Tensor::new(dev, real, &yd)?);
        let one = Scale::of(real, 1.0);
        // SAFETY: per this function's contract.
        unsafe { sys::cudnnAddTensor(h, one.ptr(), at.0, a as *const c_void, one.ptr(), yt.0, y as *mut c_void) }
            .result()
            .map_err(|e| err("cudnnAddTensor", dev, e))
    })
}

/// A pooling's reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolMode {
    Max,
    /// The mean over the whole window, padding counted.
    AvgIncludePad,
    /// The mean over the window's elements inside the input.
    AvgExcludePad,
}

/// One forward pooling, channel-first, packed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolProblem {
    pub real: Real,
    pub mode: PoolMode,
    /// `[n, c, spatial...]` (2 or 3 spatial dimensions).
    pub x: Vec<usize>,
    pub y: Vec<usize>,
    pub window: Vec<usize>,
    pub pad: Vec<usize>,
    pub stride: Vec<usize>,
}

struct PoolPlan {
    desc: PoolDesc,
    x: Tensor,
    y: Tensor,
}

thread_local! {
    static POOL_PLANS: Cache<PoolProblem, PoolPlan> = RefCell::new(HashMap::new());
}

fn pool_plan(dev: i32, p: &PoolProblem) -> Result<Rc<PoolPlan>> {
    cached(&POOL_PLANS, dev, p, || make_pool_plan(dev, p))
}

fn make_pool_plan(dev: i32, p: &PoolProblem) -> Result<PoolPlan> {
    const W: &str = "a pooling";
    let (window, pad, stride) = (dims_i32(dev, W, &p.window)?, dims_i32(dev, W, &p.pad)?, dims_i32(dev, W, &p.stride)?);
    let mode = match p.mode {
        PoolMode::Max => sys::cudnnPoolingMode_t::CUDNN_POOLING_MAX,
        PoolMode::AvgIncludePad => sys::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
        PoolMode::AvgExcludePad => sys::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
    };
    guarded("cudnnSetPoolingNdDescriptor", || {
        let desc = PoolDesc::create(dev)?;
        // SAFETY: the three arrays hold `window.len()` entries each.
        unsafe {
            sys::cudnnSetPoolingNdDescriptor(
                desc.0,
                mode,
                sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                window.len() as i32,
                window.as_ptr(),
                pad.as_ptr(),
                stride.as_ptr(),
            )
        }
        .result()
        .map_err(|e| err("cudnnSetPoolingNdDescriptor", dev, e))?;
        let x = Tensor::new(dev, p.real, &dims_i32(dev, W, &p.x)?)?;
        let y = Tensor::new(dev, p.real, &dims_i32(dev, W, &p.y)?)?;
        Ok(PoolPlan { desc, x, y })
    })
}

/// `y = alpha * pool(x) + beta * y` on this thread's stream (the caller synchronises).
///
/// # Safety
/// `x` and `y` must be device memory of `dev` holding the problem's packed tensors, `y`
/// writable and apart from `x`.
pub unsafe fn pool_forward(dev: i32, p: &PoolProblem, x: u64, y: u64, alpha: f64, beta: f64) -> Result<()> {
    let h = handle(dev)?;
    let plan = pool_plan(dev, p)?;
    guarded("cudnnPoolingForward", || {
        let (alpha, beta) = (Scale::of(p.real, alpha), Scale::of(p.real, beta));
        // SAFETY: per this function's contract.
        unsafe {
            sys::cudnnPoolingForward(
                h,
                plan.desc.0,
                alpha.ptr(),
                plan.x.0,
                x as *const c_void,
                beta.ptr(),
                plan.y.0,
                y as *mut c_void,
            )
        }
        .result()
        .map_err(|e| err("cudnnPoolingForward", dev, e))
    })
}

/// One batch normalisation over the channels of `[outer, c, inner]` data (cuDNN's spatial
/// mode on the tensor `[outer, c, inner, 1]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BnProblem {
    pub real: Real,
    pub outer: usize,
    pub c: usize,
    pub inner: usize,
}

/// The statistics of a batch normalisation: with running ones (`mean`, `var`: inference),
/// or from the batch, written to `save_mean` and `save_inv_std` (training; the running ones
/// are left alone, as MXNet updates them in the backward pass).
#[derive(Debug, Clone, Copy)]
pub enum BnStats {
    Running { mean: u64, var: u64 },
    Batch { save_mean: u64, save_inv_std: u64 },
}

thread_local! {
    /// This thread's descriptors of each batch normalisation problem: the data's and the
    /// parameters'.
    static BN_DESCS: Cache<BnProblem, (Tensor, Tensor)> = RefCell::new(HashMap::new());
}

fn bn_descs(dev: i32, p: &BnProblem) -> Result<Rc<(Tensor, Tensor)>> {
    cached(&BN_DESCS, dev, p, || {
        let xd = dims_i32(dev, "a batch normalisation", &[p.outer, p.c, p.inner, 1])?;
        Ok((Tensor::new(dev, p.real, &xd)?, Tensor::new(dev, p.real, &[1, xd[1], 1, 1])?))
    })
}

/// `y = gamma * (x - mean) / sqrt(var + eps) + beta_p` (plus `beta * y`), on this thread's
/// stream (the caller synchronises).
///
/// # Safety
/// `x`, `y` device memory of `dev` holding the problem's data, `y` writable and apart from
/// `x`; `gamma`, `beta_p` and the statistics `c` elements each (float32 for float32 data,
/// float64 for float64), the saved statistics writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn batch_norm_forward(
    dev: i32,
    p: &BnProblem,
    x: u64,
    y: u64,
    gamma: u64,
    beta_p: u64,
    stats: BnStats,
    eps: f64,
    beta: f64,
) -> Result<()> {
    let h = handle(dev)?;
    guarded("cudnnBatchNormalizationForward", || {
        let descs = bn_descs(dev, p)?;
        let (xt, pt) = (&descs.0, &descs.1);
        let (one, beta) = (Scale::of(p.real, 1.0), Scale::of(p.real, beta));
        let mode = sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL;
        let (g, b) = (gamma as *const c_void, beta_p as *const c_void);
        // SAFETY: per this function's contract; x and y share one descriptor (same shape).
        let r = unsafe {
            match stats {
                BnStats::Running { mean, var } => sys::cudnnBatchNormalizationForwardInference(
                    h,
                    mode,
                    one.ptr(),
                    beta.ptr(),
                    xt.0,
                    x as *const c_void,
                    xt.0,
                    y as *mut c_void,
                    pt.0,
                    g,
                    b,
                    mean as *const c_void,
                    var as *const c_void,
                    eps,
                ),
                BnStats::Batch { save_mean, save_inv_std } => sys::cudnnBatchNormalizationForwardTraining(
                    h,
                    mode,
                    one.ptr(),
                    beta.ptr(),
                    xt.0,
                    x as *const c_void,
                    xt.0,
                    y as *mut c_void,
                    pt.0,
                    g,
                    b,
                    0.0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    eps,
                    save_mean as *mut c_void,
                    save_inv_std as *mut c_void,
                ),
            }
        };
        r.result().map_err(|e| err("cudnnBatchNormalizationForward", dev, e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_strides_and_algorithm_names() {
        assert_eq!(packed(&[2, 3, 4, 5]), Some(vec![60, 20, 5, 1]));
        assert_eq!(packed(&[7]), Some(vec![1]));
        // Each dimension fits in 32 bits, their product does not: refused, not saturated.
        assert_eq!(packed(&[2, 65536, 65536]), None);
        assert_eq!(std::mem::size_of::<RawPerf>(), std::mem::size_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
        assert_eq!(std::mem::align_of::<RawPerf>(), std::mem::align_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
        let a = FwdAlgo { algo: 6, workspace: 0, deterministic: true };
        assert_eq!(a.name(), "cudnn_winograd");
        // The table follows cuDNN's numbering.
        for (i, (algo, _)) in FWD_ALGOS.iter().enumerate() {
            assert_eq!(*algo as usize, i);
        }
    }

    /// Without cuDNN (or a GPU) every entry point answers an error; nothing panics.
    #[test]
    fn without_cudnn_calls_fail_cleanly() {
        if available() {
            eprintln!("skipped: cuDNN is loaded on this machine (the GPU suite covers it)");
            return;
        }
        let p = ConvProblem {
            real: Real::F32,
            tf32: false,
            x: vec![1, 1, 4, 4],
            w: vec![1, 1, 3, 3],
            y: vec![1, 1, 2, 2],
            pad: vec![0, 0],
            stride: vec![1, 1],
            dilate: vec![1, 1],
            groups: 1,
        };
        assert!(conv_plan(0, &p).is_err());
        assert_eq!(version(), 0);
    }
}
