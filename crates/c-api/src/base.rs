//! C API: library information and process-level calls (stock `c_api.h`, "Part 0").
//!
//! MXGetLastError, MXGetVersion, MXLibInfoFeatures, MXNotifyShutdown, MXSetNumOMPThreads,
//! MXGetGPUCount, MXGetGPUMemoryInformation(64), and our MXGetNumOMPThreads.

use super::ffi::{self, out};
use mxnet_core::context::Context;
use mxnet_core::error::Result;
use mxnet_core::runtime::{feature_list, runtime, MXNET_VERSION};
use std::ffi::{c_char, c_int};

/// Text of the last error on the calling thread: the first line reads `ErrorType: message`.
/// Valid until the next failing call on this thread; an empty string if there was none.
#[no_mangle]
pub extern "C" fn MXGetLastError() -> *const c_char {
    ffi::last_error_ptr()
}

/// The MXNet version whose C ABI this library implements: 10901 (1.9.1). The stock 1.9.1
/// frontend checks it, so it names the ABI, not the version of mxnet-rt.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetVersion(out: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXGetVersion", out, "out", || Ok(MXNET_VERSION)) }
}

/// One entry of `MXLibInfoFeatures`, laid out as stock's `struct LibFeature`.
#[repr(C)]
pub struct LibFeature {
    pub name: *const c_char,
    pub enabled: bool,
}

struct FeatureTable(Vec<LibFeature>);
// SAFETY: the names point at 'static C string literals and the table is never mutated after
// construction, so sharing it between threads is sound.
unsafe impl Sync for FeatureTable {}
unsafe impl Send for FeatureTable {}

/// The table `MXLibInfoFeatures` hands out, built once: the frontend keeps views of it.
fn features() -> &'static [LibFeature] {
    static TABLE: std::sync::OnceLock<FeatureTable> = std::sync::OnceLock::new();
    &TABLE
        .get_or_init(|| {
            FeatureTable(
                feature_list().into_iter().map(|(name, enabled)| LibFeature { name: name.as_ptr(), enabled }).collect(),
            )
        })
        .0
}

/// The features of this build under stock's names. The array and its strings live as long as
/// the process.
///
/// # Safety
/// `lib_features` and `size` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXLibInfoFeatures(lib_features: *mut *const LibFeature, size: *mut usize) -> c_int {
    ffi::call("MXLibInfoFeatures", || {
        // SAFETY: per this function's contract.
        let (p, n) = unsafe { (out(lib_features, "libFeature")?, out(size, "size")?) };
        let table = features();
        *p = table.as_ptr();
        *n = table.len();
        Ok(())
    })
}

/// Notify the library that the process is shutting down: waits for pushed operations to
/// finish, then stops the custom-operator threads and writes the profiler's trace if it ran.
/// Idempotent; calls that arrive afterwards (frees from garbage collection) still succeed.
#[no_mangle]
pub extern "C" fn MXNotifyShutdown() -> c_int {
    ffi::call("MXNotifyShutdown", || runtime().shutdown())
}

/// Set the number of threads data-parallel kernels use (>= 1).
#[no_mangle]
pub extern "C" fn MXSetNumOMPThreads(thread_num: c_int) -> c_int {
    ffi::call("MXSetNumOMPThreads", || runtime().set_kernel_threads(thread_num))
}

/// mxnet-rt addition: the number of threads data-parallel kernels use (the
/// `MXSetNumOMPThreads` value, else the number of cores).
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetNumOMPThreads(out: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXGetNumOMPThreads", out, "out", || {
            Ok(runtime().kernel_threads().min(c_int::MAX as usize) as c_int)
        })
    }
}

/// Number of GPUs: 0 on a machine without a CUDA driver or GPU (success, as stock).
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetGPUCount(out: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXGetGPUCount", out, "out", || {
            Ok(mxnet_core::cuda::device_count().min(c_int::MAX as usize) as c_int)
        })
    }
}

/// Free and total memory of GPU `dev`, in bytes. Fails for a GPU the machine does not have.
fn gpu_memory(dev: c_int) -> Result<(u64, u64)> {
    Context::from_codes(2, dev)?.check_available()?;
    let (free, total) = mxnet_core::cuda::memory_info(dev)?;
    Ok((free as u64, total as u64))
}

/// Free and total memory of GPU `dev`, in bytes. Fails without that GPU.
///
/// # Safety
/// `free_mem` and `total_mem` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetGPUMemoryInformation64(dev: c_int, free_mem: *mut u64, total_mem: *mut u64) -> c_int {
    ffi::call("MXGetGPUMemoryInformation64", || {
        // SAFETY: per this function's contract.
        let (f, t) = unsafe { (out(free_mem, "free_mem")?, out(total_mem, "total_mem")?) };
        let (free, total) = gpu_memory(dev)?;
        (*f, *t) = (free, total);
        Ok(())
    })
}

/// Deprecated int version of [`MXGetGPUMemoryInformation64`]: bytes in an int, clamped to
/// `INT_MAX` (stock casts, which wraps on any GPU of 2 GiB or more).
///
/// # Safety
/// `free_mem` and `total_mem` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetGPUMemoryInformation(dev: c_int, free_mem: *mut c_int, total_mem: *mut c_int) -> c_int {
    ffi::call("MXGetGPUMemoryInformation", || {
        // SAFETY: per this function's contract.
        let (f, t) = unsafe { (out(free_mem, "free_mem")?, out(total_mem, "total_mem")?) };
        let (free, total) = gpu_memory(dev)?;
        let clamp = |v: u64| v.min(c_int::MAX as u64) as c_int;
        (*f, *t) = (clamp(free), clamp(total));
        Ok(())
    })
}
