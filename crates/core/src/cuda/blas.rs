//! cuBLAS, loaded at run time: one handle per (thread, device) on that thread's stream, and
//! row-major GEMM over raw device pointers.
//!
//! Owns: the handles and the math mode (`tf32`: the float32 tensor-core mode stock enables
//! with `MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION`).

use super::{guarded, stream};
use crate::error::{Error, Result};
use cudarc::cublas::{result as blas, sys};
use std::cell::RefCell;

struct Handle(sys::cublasHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `create_handle`, destroyed once (here).
        let _ = guarded("cublasDestroy", || Ok(unsafe { blas::destroy_handle(self.0) }));
    }
}

thread_local! {
    static HANDLES: RefCell<Vec<Option<Handle>>> = const { RefCell::new(Vec::new()) };
}

fn err(what: &str, dev: i32, e: blas::CublasError) -> Error {
    Error::mxnet(format!("cuBLAS error on gpu({dev}) in {what}: {e:?}"))
}

/// Whether cuBLAS can be loaded (asked once: every matrix product asks, and each probe opens
/// the library by every candidate name).
pub fn available() -> bool {
    static A: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only probes whether the library can be opened.
    *A.get_or_init(|| {
        super::available() && guarded("loading cuBLAS", || Ok(unsafe { sys::is_culib_present() })).unwrap_or(false)
    })
}

/// This thread's handle on GPU `dev`, on this thread's stream, in the asked math mode.
fn handle(dev: i32, tf32: bool) -> Result<sys::cublasHandle_t> {
    let s = stream(dev)?;
    if !available() {
        return Err(Error::not_supported("GPU matrix products without cuBLAS (libcublas could not be loaded)"));
    }
    let i = dev as usize;
    let h = HANDLES.with(|v| -> Result<sys::cublasHandle_t> {
        let mut v = v.borrow_mut();
        if v.len() <= i {
            v.resize_with(i + 1, || None);
        }
        if v[i].is_none() {
            let h = guarded("cublasCreate", || blas::create_handle().map_err(|e| err("cublasCreate", dev, e)))?;
            v[i] = Some(Handle(h));
        }
        Ok(v[i].as_ref().map(|h| h.0).expect("just set"))
    })?;
    let mode =
        if tf32 { sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH } else { sys::cublasMath_t::CUBLAS_DEFAULT_MATH };
    guarded("cublasSetStream", || {
        // SAFETY: a live handle and this thread's live stream.
        unsafe {
            blas::set_stream(h, s.cu_stream() as _).map_err(|e| err("cublasSetStream", dev, e))?;
            sys::cublasSetMathMode(h, mode).result().map_err(|e| err("cublasSetMathMode", dev, e))
        }
    })?;
    Ok(h)
}

/// Element type of a GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Real {
    F32,
    F64,
}

/// One row-major GEMM, `batch` times with the given strides (elements):
/// `C = alpha * op(A) * op(B) + beta * C`, `op(A)` of shape (m, k), `op(B)` (k, n), C (m, n).
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub real: Real,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f64,
    pub beta: f64,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub tf32: bool,
}

/// Run `g` on GPU `dev` (on this thread's stream; the caller synchronises).
///
/// # Safety
/// `a`, `b`, `c` must be device memory of `dev` holding the matrices `g` describes; `c` is
/// written and must not overlap `a` or `b`.
pub unsafe fn gemm(dev: i32, g: &Gemm, a: u64, b: u64, c: u64) -> Result<()> {
    let h = handle(dev, g.tf32)?;
    let dim = |v: usize| {
        i32::try_from(v).map_err(|_| Error::not_supported(format!("GPU matrix products with a dimension of {v}")))
    };
    let (m, n, k) = (dim(g.m)?, dim(g.n)?, dim(g.k)?);
    let batch = dim(g.batch)?;
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B first, then A.
    let lda = dim(if g.trans_a { g.m } else { g.k }.max(1))?;
    let ldb = dim(if g.trans_b { g.k } else { g.n }.max(1))?;
    let ldc = n.max(1);
    let op = |t: bool| if t { sys::cublasOperation_t::CUBLAS_OP_T } else { sys::cublasOperation_t::CUBLAS_OP_N };
    let (oa, ob) = (op(g.trans_a), op(g.trans_b));
    let (sa, sb, sc) = (g.stride_a as i64, g.stride_b as i64, g.stride_c as i64);
    guarded("cublasGemm", || {
        // SAFETY: per this function's contract; alpha and beta are host scalars (the
        // handle's default pointer mode).
        let r = unsafe {
            match g.real {
                Real::F32 => {
                    let (al, be) = (g.alpha as f32, g.beta as f32);
                    let (a, b, c) = (a as *const f32, b as *const f32, c as *mut f32);
                    if batch == 1 {
                        blas::sgemm(h, ob, oa, n, m, k, &al, b, ldb, a, lda, &be, c, ldc)
                    } else {
                        blas::sgemm_strided_batched(
                            h, ob, oa, n, m, k, &al, b, ldb, sb, a, lda, sa, &be, c, ldc, sc, batch,
                        )
                    }
                }
                Real::F64 => {
                    let (al, be) = (g.alpha, g.beta);
                    let (a, b, c) = (a as *const f64, b as *const f64, c as *mut f64);
                    if batch == 1 {
                        blas::dgemm(h, ob, oa, n, m, k, &al, b, ldb, a, lda, &be, c, ldc)
                    } else {
                        blas::dgemm_strided_batched(
                            h, ob, oa, n, m, k, &al, b, ldb, sb, a, lda, sa, &be, c, ldc, sc, batch,
                        )
                    }
                }
            }
        };
        r.map_err(|e| err("gemm", dev, e))
    })
}
