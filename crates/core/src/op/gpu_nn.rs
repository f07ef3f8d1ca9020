//! The GPU forms of the network layers: `Convolution`, `Pooling` and `BatchNorm` through cuDNN
//! ([`crate::cuda::dnn`]), `Concat` by a run-time compiled slab copy, and `Dropout` at
//! inference.
//!
//! Owns: what a declaration hands the GPU path ([`ConvGpu`], [`PoolGpu`], [`BnGpu`]: plans
//! made by the operators' own CPU planning, so shapes and parameter checks are one code), the
//! cuDNN problem of each call, the convolution algorithm selection (cuDNN's candidates go
//! through [`crate::op::tune`], the CPU's selector: `cudnn_tune` over
//! `MXNET_CUDNN_AUTOTUNE_DEFAULT`, the `workspace` limit, `MXNET_ENFORCE_DETERMINISM`), and the
//! source of the slab copy ([`slab_source`]). What cuDNN cannot do as MXNet does (a pooling
//! whose output needs asymmetric padding, Lp pooling, channel-last layouts, dropout in
//! training) fails with NotImplementedError before anything runs.

use super::gpu::{add_of, ctype, float_dtype, map, Form};
use super::tensor::{OutBlob, TBlob};
use super::tune::{self, AlgoInfo, Request};
use super::{OpCtx, Req};
use crate::context::Context;
use crate::cuda::blas::Real;
use crate::cuda::{self, dnn};
use crate::error::{Error, Result};
use crate::storage::Block;
use std::ffi::c_void;

/// A convolution as its declaration plans it (spatial sizes widened to three, leading 1s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGpu {
    /// Spatial dimensions of the data (1, 2 or 3).
    pub nsp: usize,
    pub n: usize,
    pub c: usize,
    pub f: usize,
    pub g: usize,
    pub input: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilate: [usize; 3],
    pub pad: [usize; 3],
    pub output: [usize; 3],
    /// The operator's `cudnn_tune` (None: `MXNET_CUDNN_AUTOTUNE_DEFAULT` decides).
    pub per_op: Option<&'static str>,
    /// The operator's `workspace` limit in bytes.
    pub workspace_limit: usize,
}

/// The spatial axes cuDNN sees: two for 1-D and 2-D problems (a 1-D one as height 1), three
/// for 3-D ones.
fn spatial(nsp: usize, v: &[usize; 3]) -> &[usize] {
    if nsp == 3 {
        &v[..]
    } else {
        &v[1..]
    }
}

impl ConvGpu {
    pub fn problem(&self, real: Real, tf32: bool) -> dnn::ConvProblem {
        let sp = |v: &[usize; 3]| spatial(self.nsp, v).to_vec();
        dnn::ConvProblem {
            real,
            tf32,
            x: [vec![self.n, self.c], sp(&self.input)].concat(),
            w: [vec![self.f, self.c / self.g], sp(&self.kernel)].concat(),
            y: [vec![self.n, self.f], sp(&self.output)].concat(),
            pad: sp(&self.pad),
            stride: sp(&self.stride),
            dilate: sp(&self.dilate),
            groups: self.g,
        }
    }
}

/// `Convolution` on GPU `dev`: inputs data, weight and (unless `no_bias`) bias.
pub(super) fn convolution(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    spec: ConvGpu,
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    let req = cx.req[0];
    if req == Req::Null || outs[0].size() == 0 {
        return Ok(());
    }
    let real = float_dtype(op, ins[0].dtype)?;
    let tf32 = real == Real::F32 && super::gpu::tf32_allowed()?;
    let prob = spec.problem(real, tf32);
    let plan = dnn::conv_plan(dev, &prob)?;
    let algos = &plan.algos;
    let infos: Vec<AlgoInfo> = algos
        .iter()
        .map(|a| AlgoInfo { name: a.name(), deterministic: a.deterministic, workspace: a.workspace, estimate: 0.0 })
        .collect();
    let key = format!(
        "Convolution;gpu({dev});{};x={:?};w={:?};pad={:?};stride={:?};dilate={:?};group={};tf32={}",
        ins[0].dtype.name(),
        prob.x,
        prob.w,
        prob.pad,
        prob.stride,
        prob.dilate,
        prob.groups,
        u8::from(tf32)
    );
    // `off` takes cuDNN's best candidate within the workspace limit (stock's choice), else
    // its best.
    let heuristic = algos.iter().position(|a| a.workspace <= spec.workspace_limit).unwrap_or(0);
    let request = Request { key, per_op: spec.per_op, workspace_limit: spec.workspace_limit, algos: &infos, heuristic };
    let (x, w) = (ins[0].device_ptr(), ins[1].device_ptr());
    let bias = ins.get(2).map(TBlob::device_ptr);
    // Adding to the output: the selection may run several algorithms, so each writes a
    // temporary that is added once at the end.
    let temp = if req == Req::Add {
        Some(Block::alloc(outs[0].size() * ins[0].dtype.size(), Context::gpu(dev))?)
    } else {
        None
    };
    let y = temp.as_ref().map_or(outs[0].device_ptr(), |b| b.ptr() as u64);
    // Dropped before the temporary: nothing queued uses it once it is back in the pool.
    let _sync = SyncOnDrop(dev);
    tune::global().select_timed(crate::config::global(), &request, |i| {
        let a = algos[i];
        let ws = if a.workspace > 0 { Some(Block::alloc(a.workspace, Context::gpu(dev))?) } else { None };
        let ws_ptr = ws.as_ref().map_or(0, |b| b.ptr() as u64);
        let _sync = SyncOnDrop(dev);
        let io = dnn::ConvIo { x, w, bias, y, ws: ws_ptr, ws_bytes: a.workspace };
        let go = || {
            // SAFETY: data, weight and bias are device memory of `dev` of the shapes the plan
            // checked (the declaration's shape inference), `y` the output (or a temporary of
            // its size) apart from them, `ws` the algorithm's workspace; the stream is
            // synchronised before the workspace goes back to the pool. The output is
            // overwritten, so running twice gives the same result.
            unsafe { dnn::conv_forward(dev, &plan, a, io)? };
            cuda::sync(dev)
        };
        // An algorithm's first call prepares it: timed, that would choose by preparation.
        if plan.first_use(i) {
            go()?;
        }
        let t = std::time::Instant::now();
        go()?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    if let Some(t) = &temp {
        // SAFETY: the temporary holds the output's elements, apart from the output.
        unsafe { dnn::add_tensor(dev, real, &prob.y, t.ptr() as u64, &prob.y, outs[0].device_ptr())? };
        cuda::sync(dev)?;
    }
    Ok(())
}

/// A pooling's reduction as the GPU runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolGpuKind {
    Max,
    Avg { include_pad: bool },
    Sum,
}

/// A pooling as its declaration plans it (spatial sizes widened to three, leading 1s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGpu {
    pub nsp: usize,
    pub n: usize,
    pub c: usize,
    pub input: [usize; 3],
    pub output: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub pad: [usize; 3],
    pub kind: PoolGpuKind,
}

impl PoolGpu {
    /// cuDNN's problem, or why cuDNN cannot pool as the plan says: its windows are placed
    /// with symmetric padding only, so the plan's output must be
    /// `(input + 2 pad - kernel) / stride + 1` on every axis.
    pub fn problem(&self, op: &str, real: Real) -> Result<(dnn::PoolProblem, f64)> {
        for d in 0..3 {
            let padded = self.input[d] + 2 * self.pad[d];
            let fits = self.kernel[d] <= padded && (padded - self.kernel[d]) / self.stride[d] + 1 == self.output[d];
            if !fits {
                return Err(Error::not_supported(format!(
                    "operator {op} on a GPU with output {:?} from input {:?} (kernel {:?}, stride {:?}, pad {:?}): only \
                     the windows of symmetric padding (the 'valid' convention's)",
                    self.output, self.input, self.kernel, self.stride, self.pad
                )));
            }
        }
        let sp = |v: &[usize; 3]| spatial(self.nsp, v).to_vec();
        let (mode, alpha) = match self.kind {
            PoolGpuKind::Max => (dnn::PoolMode::Max, 1.0),
            PoolGpuKind::Avg { include_pad: true } => (dnn::PoolMode::AvgIncludePad, 1.0),
            PoolGpuKind::Avg { include_pad: false } => (dnn::PoolMode::AvgExcludePad, 1.0),
            // The sum is the padded mean times the window's size.
            PoolGpuKind::Sum => (dnn::PoolMode::AvgIncludePad, self.kernel.iter().product::<usize>() as f64),
        };
        let p = dnn::PoolProblem {
            real,
            mode,
            x: [vec![self.n, self.c], sp(&self.input)].concat(),
            y: [vec![self.n, self.c], sp(&self.output)].concat(),
            window: sp(&self.kernel),
            pad: sp(&self.pad),
            stride: sp(&self.stride),
        };
        Ok((p, alpha))
    }
}

/// `Pooling` on GPU `dev`.
pub(super) fn pooling(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    spec: PoolGpu,
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    let req = cx.req[0];
    let real = float_dtype(op, ins[0].dtype)?;
    let (p, alpha) = spec.problem(op, real)?;
    if req == Req::Null || outs[0].size() == 0 {
        return Ok(());
    }
    let beta = if req == Req::Add { 1.0 } else { 0.0 };
    // SAFETY: input and output are device memory of `dev` with the plan's shapes (the
    // declaration's shape inference), distinct arrays of this operation.
    unsafe { dnn::pool_forward(dev, &p, ins[0].device_ptr(), outs[0].device_ptr(), alpha, beta) }
}

/// A batch normalisation's parameters, as its declaration reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BnGpu {
    pub axis: i64,
    pub eps: f64,
    pub fix_gamma: bool,
    pub use_global_stats: bool,
}

/// `BatchNorm` on GPU `dev`: inputs data, gamma, beta, moving_mean, moving_var; outputs the
/// data, the mean and the inverse standard deviation (the moving statistics, as on the CPU,
/// are updated by the backward pass, which has no GPU form yet).
pub(super) fn batch_norm(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    spec: BnGpu,
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    let x = &ins[0];
    let real = float_dtype(op, x.dtype)?;
    if ins[1..5].iter().any(|p| p.dtype != x.dtype) {
        return Err(Error::not_supported(format!(
            "operator {op} on a GPU with parameters of another dtype than the data's ({})",
            x.dtype.name()
        )));
    }
    let nd = x.ndim() as i64;
    let axis = if spec.axis < 0 { spec.axis + nd } else { spec.axis };
    if !(0..nd).contains(&axis) {
        return Err(Error::value(format!("operator {op}: axis {} out of range for {nd}-D data", spec.axis)));
    }
    let axis = axis as usize;
    let (outer, c, inner) =
        (x.shape[..axis].iter().product::<usize>(), x.shape[axis], x.shape[axis + 1..].iter().product::<usize>());
    let none = [0.0; 4];
    let req = |i: usize| cx.req.get(i).copied().unwrap_or(Req::Write);
    if x.size() == 0 {
        return Ok(());
    }
    let training = cx.is_train && !spec.use_global_stats;
    let gpu = Context::gpu(dev);
    let esize = x.dtype.size();
    // Where cuDNN writes: the outputs themselves when they are overwritten, else temporaries
    // whose values then go to the outputs by their requests (cuDNN writes all three in
    // training, whatever is asked; the statistics are computed even for a Null output).
    let direct = |r: Req| matches!(r, Req::Write | Req::Inplace);
    let temp = |r: Req, n: usize| -> Result<Option<Block>> {
        if direct(r) {
            Ok(None)
        } else {
            Block::alloc(n * esize, gpu).map(Some)
        }
    };
    let y_temp = if req(0) == Req::Null { Some(Block::alloc(x.size() * esize, gpu)?) } else { None };
    let (mean_temp, inv_temp) = if training { (temp(req(1), c)?, temp(req(2), c)?) } else { (None, None) };
    let ones = if spec.fix_gamma { Some(Block::alloc(c * esize, gpu)?) } else { None };
    // Declared after the blocks, so dropped before them: nothing queued still uses a block
    // that goes back to the pool, on an error path too.
    let _sync = SyncOnDrop(dev);
    // fix_gamma: a scale of ones.
    if let Some(b) = &ones {
        map(op, dev, Req::Write, Form::Fill, "x", &[], &device_view(b.ptr(), c, x.dtype), 1.0, none)?;
    }
    let gamma = ones.as_ref().map_or(ins[1].device_ptr(), |b| b.ptr() as u64);
    let at = |t: &Option<Block>, o: &OutBlob| t.as_ref().map_or(o.device_ptr(), |b| b.ptr() as u64);
    let p = dnn::BnProblem { real, outer, c, inner };
    let stats = if training {
        dnn::BnStats::Batch { save_mean: at(&mean_temp, &outs[1]), save_inv_std: at(&inv_temp, &outs[2]) }
    } else {
        dnn::BnStats::Running { mean: ins[3].device_ptr(), var: ins[4].device_ptr() }
    };
    if training || req(0) != Req::Null {
        let beta = if req(0) == Req::Add { 1.0 } else { 0.0 };
        // SAFETY: data and output (or its temporary) are device memory of `dev` of the data's
        // size (distinct arrays), the parameters and statistics `c` elements of the data's
        // dtype (checked above; the ones block and the statistics' temporaries hold `c`);
        // the blocks outlive the queued work (`_sync` is dropped first).
        unsafe {
            dnn::batch_norm_forward(
                dev,
                &p,
                x.device_ptr(),
                at(&y_temp, &outs[0]),
                gamma,
                ins[2].device_ptr(),
                stats,
                spec.eps,
                beta,
            )?
        };
    }
    if training {
        // The statistics cuDNN wrote to temporaries go to their outputs by their requests.
        for (k, t) in [(1, &mean_temp), (2, &inv_temp)] {
            if let Some(b) = t {
                // SAFETY: the block holds `c` elements of the data's dtype, written above.
                let v = unsafe { TBlob::new(b.ptr(), &[c], x.dtype) };
                map(op, dev, req(k), Form::Unary, "x", std::slice::from_ref(&v), &outs[k], 0.0, none)?;
            }
        }
    } else {
        // The mean and inverse standard deviation outputs, from the running statistics.
        map(op, dev, req(1), Form::Unary, "x", &ins[3..4], &outs[1], 0.0, none)?;
        map(op, dev, req(2), Form::Scalar, "T(1) / sqrt(x + s)", &ins[4..5], &outs[2], spec.eps, none)?;
    }
    // Reported here (the guard's wait ignores failures, which a second wait may not see).
    cuda::sync(dev)
}

/// Waits for the device's queued work when dropped: declared after the temporary blocks of a
/// call, it keeps them from going back to the pool while a kernel may still use them, also
/// when the call returns early with an error.
struct SyncOnDrop(i32);

impl Drop for SyncOnDrop {
    fn drop(&mut self) {
        // A failure here was (or will be) reported by the call's own synchronisation.
        let _ = cuda::sync(self.0);
    }
}

/// An output view of `n` elements at device address `ptr` (a temporary block).
fn device_view(ptr: *mut u8, n: usize, dtype: crate::ndarray::DType) -> OutBlob {
    // SAFETY: the block holds `n` elements of `dtype` and outlives the view (the caller keeps
    // it until the stream is synchronised); it is only written by a kernel through the view.
    unsafe { OutBlob::new(ptr, &[n], dtype) }
}

/// The CUDA source of `mx_slab`: input `in`, `outer` rows of `len`, copied (or added) into
/// rows of `out_len` of `out` at column `offset`; Concat's part of the output.
pub fn slab_source(t: &str) -> String {
    format!(
        r#"typedef {t} T;
extern "C" __global__ void mx_slab(T* out, const T* in, unsigned long long n, unsigned long long len, unsigned long long out_len, unsigned long long offset, int add) {{
  const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
    const unsigned long long d = (i / len) * out_len + offset + i % len;
    out[d] = add ? (T)(out[d] + in[i]) : in[i];
  }}
}}
"#
    )
}

/// `Concat` along `dim` on GPU `dev`.
pub(super) fn concat(op: &str, dev: i32, cx: &OpCtx, dim: i64, ins: &[TBlob], outs: &mut [OutBlob]) -> Result<()> {
    let req = cx.req[0];
    let out = &outs[0];
    if req == Req::Null || out.size() == 0 {
        return Ok(());
    }
    let nd = out.ndim() as i64;
    let axis = if dim < 0 { dim + nd } else { dim };
    if !(0..nd).contains(&axis) {
        return Err(Error::value(format!("operator {op}: dim {dim} out of range for {nd}-D data")));
    }
    let axis = axis as usize;
    let t = ctype(out.dtype)
        .ok_or_else(|| Error::not_supported(format!("operator {op} on a GPU for {}", out.dtype.name())))?;
    let kern = cuda::rtc::kernel(dev, &format!("slab/{t}"), "mx_slab", || slab_source(t))?;
    let inner: usize = out.shape[axis + 1..].iter().product();
    let out_len = out.shape[axis] * inner;
    let mut offset = 0usize;
    for x in ins {
        if x.dtype != out.dtype {
            return Err(Error::internal(format!("{op}: input of dtype {} into {}", x.dtype.name(), out.dtype.name())));
        }
        let len = x.shape[axis] * inner;
        let (mut o, mut a, mut n, mut l, mut ol, mut off, mut add) =
            (out.device_ptr(), x.device_ptr(), x.size() as u64, len as u64, out_len as u64, offset as u64, add_of(req));
        let mut params = [
            (&raw mut o).cast::<c_void>(),
            (&raw mut a).cast(),
            (&raw mut n).cast(),
            (&raw mut l).cast(),
            (&raw mut ol).cast(),
            (&raw mut off).cast(),
            (&raw mut add).cast(),
        ];
        if len > 0 {
            // SAFETY: `mx_slab`'s parameters in order and type; the input holds `n` elements
            // (rows of `len`), and each row lands inside the output's row of `out_len` at
            // `offset` (the inputs' lengths along the axis sum to the output's, checked by
            // shape inference); both are device memory of `dev` held by this operation.
            unsafe { cuda::rtc::launch(dev, &kern, x.size(), &mut params)? };
        }
        offset += len;
    }
    Ok(())
}

/// `Dropout` on GPU `dev`: at inference (and with `p` 0) the output is the data and the mask
/// ones; dropping needs cuRAND, which this build does not use yet.
pub(super) fn dropout(
    op: &str,
    dev: i32,
    cx: &OpCtx,
    (p, always): (f64, bool),
    ins: &[TBlob],
    outs: &mut [OutBlob],
) -> Result<()> {
    if (always || cx.is_train) && p > 0.0 {
        return Err(Error::not_supported(format!(
            "operator {op} on gpu({dev}) while training (random masks on a GPU need cuRAND)"
        )));
    }
    let none = [0.0; 4];
    map(op, dev, cx.req[0], Form::Unary, "x", &ins[..1], &outs[0], 0.0, none)?;
    if outs.len() > 1 {
        let req = cx.req.get(1).copied().unwrap_or(Req::Write);
        map(op, dev, req, Form::Fill, "x", &[], &outs[1], 1.0, none)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv2d() -> ConvGpu {
        ConvGpu {
            nsp: 2,
            n: 2,
            c: 4,
            f: 8,
            g: 2,
            input: [1, 9, 7],
            kernel: [1, 3, 3],
            stride: [1, 2, 1],
            dilate: [1, 1, 2],
            pad: [0, 1, 1],
            output: [1, 5, 3],
            per_op: None,
            workspace_limit: 1 << 30,
        }
    }

    #[test]
    fn convolutions_become_cudnn_problems() {
        let p = conv2d().problem(Real::F32, false);
        assert_eq!(p.x, vec![2, 4, 9, 7]);
        assert_eq!(p.w, vec![8, 2, 3, 3]);
        assert_eq!(p.y, vec![2, 8, 5, 3]);
        assert_eq!(
            (p.pad.clone(), p.stride.clone(), p.dilate.clone(), p.groups),
            (vec![1, 1], vec![2, 1], vec![1, 2], 2)
        );
        // 1-D: height 1; 3-D: three spatial axes.
        let one = ConvGpu { nsp: 1, input: [1, 1, 10], kernel: [1, 1, 3], output: [1, 1, 8], ..conv2d() };
        assert_eq!(one.problem(Real::F64, false).x, vec![2, 4, 1, 10]);
        let three = ConvGpu { nsp: 3, input: [3, 9, 7], kernel: [2, 3, 3], output: [2, 5, 3], ..conv2d() };
        assert_eq!(three.problem(Real::F32, false).w, vec![8, 2, 2, 3, 3]);
    }

    #[test]
    fn pooling_needs_symmetric_windows() {
        let spec = PoolGpu {
            nsp: 2,
            n: 1,
            c: 3,
            input: [1, 112, 112],
            output: [1, 56, 56],
            kernel: [1, 3, 3],
            stride: [1, 2, 2],
            pad: [0, 1, 1],
            kind: PoolGpuKind::Max,
        };
        let (p, alpha) = spec.problem("Pooling", Real::F32).unwrap();
        assert_eq!((p.x, p.y, p.window, alpha), (vec![1, 3, 112, 112], vec![1, 3, 56, 56], vec![3, 3], 1.0));
        // The 'full' convention's extra window: refused.
        let full = PoolGpu { input: [1, 6, 6], output: [1, 3, 3], kernel: [1, 3, 3], pad: [0; 3], ..spec };
        let e = full.problem("Pooling", Real::F32).unwrap_err().to_string();
        assert!(e.starts_with("NotImplementedError"), "{e}");
        let sum = PoolGpu { kind: PoolGpuKind::Sum, ..spec };
        let (p, alpha) = sum.problem("Pooling", Real::F32).unwrap();
        assert_eq!((p.mode, alpha), (dnn::PoolMode::AvgIncludePad, 9.0));
    }

    #[test]
    fn slab_source_is_stable() {
        let s = slab_source("float");
        assert!(s.starts_with("typedef float T;\n"));
        assert!(s.contains("const unsigned long long d = (i / len) * out_len + offset + i % len;"));
        assert!(s.contains("out[d] = add ? (T)(out[d] + in[i]) : in[i];"));
    }
}
