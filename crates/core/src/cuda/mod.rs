//! CUDA, loaded at run time: the driver, the devices, their memory and copies, and the
//! launching of run-time compiled kernels.
//!
//! Owns: finding the driver through cudarc's dynamic loading (no driver, or no device, means
//! no GPUs: never an error until a GPU is asked for), one primary context per device, one
//! stream per (thread, device), device memory for storage's CUDA allocator, copies between
//! host and device memory and between devices, the NVRTC module cache ([`rtc`]) and the
//! cuBLAS handles ([`blas`]). Every CUDA failure becomes `MXNetError: CUDA ...` naming the
//! device; a panic of the loader (a missing library or symbol) is caught here and reported
//! the same way.
//!
//! Synchronisation: an operation on a GPU runs its kernels on its thread's stream and waits
//! for that stream before it returns to the engine. Dependencies are therefore the engine's
//! host-side ones; events between streams are not used yet (docs/design/cuda.md).

pub mod blas;
pub mod dnn;
pub mod rtc;

use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaStream};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

/// The loaded driver and its devices.
struct Driver {
    count: usize,
    /// Primary contexts, retained at first use of each device.
    contexts: Vec<OnceLock<std::result::Result<Arc<CudaContext>, String>>>,
}

/// Runs `f`, turning a panic of the loader into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("the CUDA loader panicked");
        Err(Error::mxnet(format!("CUDA: {what}: {msg}")))
    })
}

fn cu_err(what: &str, dev: Option<i32>, e: cu::DriverError) -> Error {
    match dev {
        Some(d) => Error::mxnet(format!("CUDA error on gpu({d}) in {what}: {e:?}")),
        None => Error::mxnet(format!("CUDA error in {what}: {e:?}")),
    }
}

fn driver() -> Option<&'static Driver> {
    static D: OnceLock<Option<Driver>> = OnceLock::new();
    D.get_or_init(|| {
        let count = guarded("loading the driver", || {
            // SAFETY: only probes whether the library can be opened.
            if !unsafe { sys::is_culib_present() } {
                return Ok(0);
            }
            cu::init().map_err(|e| cu_err("cuInit", None, e))?;
            let n = cu::device::get_count().map_err(|e| cu_err("cuDeviceGetCount", None, e))?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
        .unwrap_or(0);
        (count > 0).then(|| Driver { count, contexts: (0..count).map(|_| OnceLock::new()).collect() })
    })
    .as_ref()
}

/// Number of usable GPUs (0 without a driver or device).
pub fn device_count() -> usize {
    driver().map_or(0, |d| d.count)
}

/// Whether a CUDA driver with at least one device was found.
pub fn available() -> bool {
    device_count() > 0
}

/// The context of GPU `dev`, made current on this thread.
pub fn context(dev: i32) -> Result<&'static Arc<CudaContext>> {
    let d = driver().ok_or_else(|| {
        Error::mxnet(format!(
            "gpu({dev}) is not available: no CUDA driver or GPU was found (MXGetGPUCount reports 0 GPUs)"
        ))
    })?;
    let slot = usize::try_from(dev)
        .ok()
        .and_then(|i| d.contexts.get(i))
        .ok_or_else(|| Error::mxnet(format!("gpu({dev}) is not available: this machine has {} GPU(s)", d.count)))?;
    let ctx = slot
        .get_or_init(|| {
            guarded("creating the context", || {
                CudaContext::new(dev as usize).map_err(|e| cu_err("cuDevicePrimaryCtxRetain", Some(dev), e))
            })
            .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|m| Error::mxnet(m.clone()))?;
    guarded("binding the context", || ctx.bind_to_thread().map_err(|e| cu_err("cuCtxSetCurrent", Some(dev), e)))?;
    Ok(ctx)
}

/// `(free, total)` bytes of GPU `dev`.
pub fn memory_info(dev: i32) -> Result<(usize, usize)> {
    let ctx = context(dev)?;
    guarded("cuMemGetInfo", || ctx.mem_get_info().map_err(|e| cu_err("cuMemGetInfo", Some(dev), e)))
}

/// The device's name and compute capability.
pub fn describe(dev: i32) -> Result<(String, (i32, i32))> {
    let ctx = context(dev)?;
    guarded("cuDeviceGetName", || {
        let name = ctx.name().map_err(|e| cu_err("cuDeviceGetName", Some(dev), e))?;
        let cc = ctx.compute_capability().map_err(|e| cu_err("cuDeviceGetAttribute", Some(dev), e))?;
        Ok((name, cc))
    })
}

/// The driver's CUDA version as `major * 1000 + minor * 10` (0 without a driver).
pub fn driver_version() -> i32 {
    if !available() {
        return 0;
    }
    let mut v = 0;
    // SAFETY: writes one int.
    let ok = guarded("cuDriverGetVersion", || Ok(unsafe { sys::cuDriverGetVersion(&mut v) }));
    if matches!(ok, Ok(sys::CUresult::CUDA_SUCCESS)) {
        v
    } else {
        0
    }
}

thread_local! {
    /// This thread's stream on each device it has used.
    static STREAMS: RefCell<Vec<Option<Arc<CudaStream>>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's stream on GPU `dev` (the context made current).
pub fn stream(dev: i32) -> Result<Arc<CudaStream>> {
    let ctx = context(dev)?;
    let i = dev as usize;
    if let Some(s) = STREAMS.with(|s| s.borrow().get(i).cloned().flatten()) {
        return Ok(s);
    }
    let s = guarded("cuStreamCreate", || ctx.new_stream().map_err(|e| cu_err("cuStreamCreate", Some(dev), e)))?;
    STREAMS.with(|v| {
        let mut v = v.borrow_mut();
        if v.len() <= i {
            v.resize(i + 1, None);
        }
        v[i] = Some(s.clone());
    });
    Ok(s)
}

/// Wait until the work queued on this thread's stream of GPU `dev` is done, reporting a
/// failure of any of it.
pub fn sync(dev: i32) -> Result<()> {
    let s = stream(dev)?;
    guarded("cuStreamSynchronize", || s.synchronize().map_err(|e| cu_err("a kernel or copy", Some(dev), e)))
}

/// `bytes` (> 0) of device memory on GPU `dev`. Out of memory names the device and figures.
pub fn malloc(dev: i32, bytes: usize) -> Result<u64> {
    context(dev)?;
    guarded("cuMemAlloc", || {
        // SAFETY: a new allocation in the current (bound) context.
        match unsafe { cu::malloc_sync(bytes) } {
            Ok(p) => Ok(p),
            Err(cu::DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                let (free, total) = memory_info(dev).unwrap_or((0, 0));
                Err(Error::mxnet(format!(
                    "out of memory on gpu({dev}): cannot allocate {bytes} bytes ({free} of {total} bytes free)"
                )))
            }
            Err(e) => Err(cu_err("cuMemAlloc", Some(dev), e)),
        }
    })
}

/// Give back memory from [`malloc`].
///
/// # Safety
/// `ptr` must come from [`malloc`] on `dev` and not be used afterwards; no queued work may
/// still use it (operations wait for their streams before they finish).
pub unsafe fn free(dev: i32, ptr: u64) {
    if context(dev).is_ok() {
        // SAFETY: per this function's contract. A failure (a context torn down at exit) only
        // leaks the block.
        let _ = guarded("cuMemFree", || Ok(unsafe { cu::free_sync(ptr) }));
    }
}

/// Where the bytes of one side of a copy are.
#[derive(Debug, Clone, Copy)]
pub enum Mem {
    Host(*const u8),
    Device(i32, u64),
}

/// Copy `bytes` bytes from `src` to `dst` (host to device, device to host, device to device
/// on one GPU or between two), on this thread's stream; returns when the copy is done.
///
/// # Safety
/// Both ranges must be valid for `bytes` bytes (a `Host` destination writable) and not
/// overlap, and nothing else may write them until this returns.
pub unsafe fn copy(src: Mem, dst: Mem, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let dev = match (src, dst) {
        (Mem::Device(d, _), _) | (_, Mem::Device(d, _)) => d,
        (Mem::Host(_), Mem::Host(_)) => return Err(Error::internal("cuda::copy between two host ranges")),
    };
    let s = stream(dev)?;
    let cs = s.cu_stream();
    guarded("cuMemcpy", || {
        // SAFETY: per this function's contract; the stream belongs to this thread and is
        // synchronised before returning, so no range is used after the call.
        let r = unsafe {
            match (src, dst) {
                (Mem::Host(h), Mem::Device(_, d)) => sys::cuMemcpyHtoDAsync_v2(d, h.cast(), bytes, cs).result(),
                (Mem::Device(_, d), Mem::Host(h)) => {
                    sys::cuMemcpyDtoHAsync_v2(h as *mut u8 as *mut _, d, bytes, cs).result()
                }
                (Mem::Device(a, s_ptr), Mem::Device(b, d_ptr)) if a == b => {
                    sys::cuMemcpyDtoDAsync_v2(d_ptr, s_ptr, bytes, cs).result()
                }
                (Mem::Device(a, s_ptr), Mem::Device(b, d_ptr)) => {
                    let (ca, cb) = (context(a)?.cu_ctx(), context(b)?.cu_ctx());
                    context(dev)?;
                    sys::cuMemcpyPeerAsync(d_ptr, cb, s_ptr, ca, bytes, cs).result()
                }
                (Mem::Host(_), Mem::Host(_)) => unreachable!("refused above"),
            }
        };
        r.map_err(|e| cu_err("cuMemcpy", Some(dev), e))?;
        s.synchronize().map_err(|e| cu_err("cuMemcpy", Some(dev), e))
    })
}

/// Set `bytes` bytes at `ptr` on GPU `dev` to `value`, then wait.
///
/// # Safety
/// The range must be device memory of `dev` that nothing else uses until this returns.
pub unsafe fn memset(dev: i32, ptr: u64, value: u8, bytes: usize) -> Result<()> {
    let s = stream(dev)?;
    guarded("cuMemsetD8", || {
        // SAFETY: per this function's contract.
        unsafe { sys::cuMemsetD8Async(ptr, value, bytes, s.cu_stream()) }
            .result()
            .map_err(|e| cu_err("cuMemsetD8", Some(dev), e))?;
        s.synchronize().map_err(|e| cu_err("cuMemsetD8", Some(dev), e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU every entry point answers an error that says so; with one the basic
    /// round trip works. Either way nothing panics.
    #[test]
    fn devices_memory_and_copies() {
        if !available() {
            eprintln!("skipped: no CUDA driver or GPU on this machine");
            let e = context(0).unwrap_err().to_string();
            assert!(e.contains("gpu(0) is not available"), "{e}");
            assert!(malloc(0, 16).is_err());
            return;
        }
        let (free_bytes, total) = memory_info(0).unwrap();
        assert!(free_bytes > 0 && free_bytes <= total);
        let p = malloc(0, 4096).unwrap();
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut back = vec![0u8; 4096];
        // SAFETY: 4096 bytes each, distinct.
        unsafe {
            copy(Mem::Host(src.as_ptr()), Mem::Device(0, p), 4096).unwrap();
            copy(Mem::Device(0, p), Mem::Host(back.as_mut_ptr()), 4096).unwrap();
            free(0, p);
        }
        assert_eq!(src, back);
        let e = context(device_count() as i32).unwrap_err().to_string();
        assert!(e.contains("GPU(s)"), "{e}");
    }
}
