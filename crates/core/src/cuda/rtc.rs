//! Run-time compiled kernels: NVRTC compiles CUDA C++ source to PTX once per (device, key),
//! the driver loads it, and [`launch`] runs it on this thread's stream.
//!
//! Owns: the module cache (a kernel is compiled at its first use on each device) and the
//! launch configuration (a grid-stride loop: 256 threads a block, at most [`MAX_BLOCKS`]
//! blocks).

use super::{context, guarded, stream};
use crate::error::{Error, Result};
use crate::sync::Mutex;
use cudarc::driver::{result as cu, CudaFunction, CudaModule};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// A loaded kernel.
pub struct Kernel {
    func: CudaFunction,
    /// Keeps the module loaded as long as the kernel is cached.
    _module: Arc<CudaModule>,
}

// SAFETY: a CUfunction handle may be used from any thread once its context is current
// (launch makes it current); the cache never mutates a loaded kernel.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

type Cache = Mutex<HashMap<(i32, String), Arc<Kernel>>>;

fn cache() -> &'static Cache {
    static C: OnceLock<Cache> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether NVRTC can be loaded (asked once).
pub fn available() -> bool {
    static A: OnceLock<bool> = OnceLock::new();
    // SAFETY: only probes whether the library can be opened.
    *A.get_or_init(|| {
        super::available()
            && guarded("loading NVRTC", || Ok(unsafe { cudarc::nvrtc::sys::is_culib_present() })).unwrap_or(false)
    })
}

/// The kernel `name` of the source `src()` (compiled at its first use on `dev`); `key` names
/// the source among all others (the same key must always give the same source).
pub fn kernel(dev: i32, key: &str, name: &str, src: impl FnOnce() -> String) -> Result<Arc<Kernel>> {
    if let Some(k) = cache().lock().get(&(dev, key.to_string())) {
        return Ok(k.clone());
    }
    let ctx = context(dev)?;
    if !available() {
        return Err(Error::not_supported("GPU element-wise kernels without NVRTC (libnvrtc could not be loaded)"));
    }
    let (major, minor) = super::describe(dev)?.1;
    let source = src();
    let k = guarded("NVRTC", || {
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        let opts = cudarc::nvrtc::CompileOptions { arch: Some(arch), ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(&source, opts)
            .map_err(|e| Error::internal(format!("NVRTC failed to compile kernel {key}: {e:?}\n{source}")))?;
        let module = ctx.load_module(ptx).map_err(|e| super::cu_err("cuModuleLoadData", Some(dev), e))?;
        let func = module.load_function(name).map_err(|e| super::cu_err("cuModuleGetFunction", Some(dev), e))?;
        Ok(Kernel { func, _module: module })
    })?;
    let k = Arc::new(k);
    cache().lock().insert((dev, key.to_string()), k.clone());
    Ok(k)
}

/// Number of kernels compiled so far (all devices).
pub fn cached() -> usize {
    cache().lock().len()
}

/// Threads per block of every launch.
pub const BLOCK: u32 = 256;
/// Blocks of a launch at most (enough to fill any current GPU; the loop strides over more).
pub const MAX_BLOCKS: usize = 8192;

/// Run `k` on `blocks` blocks of [`BLOCK`] threads on this thread's stream of `dev` (not
/// waited for).
///
/// # Safety
/// As [`launch`], for a kernel that strides over its work by block.
pub unsafe fn launch_blocks(dev: i32, k: &Kernel, blocks: usize, params: &mut [*mut c_void]) -> Result<()> {
    if blocks == 0 {
        return Ok(());
    }
    let s = stream(dev)?;
    let blocks = blocks.min(MAX_BLOCKS) as u32;
    guarded("cuLaunchKernel", || {
        // SAFETY: per this function's contract.
        unsafe {
            cu::launch_kernel(k.func.cu_function(), (blocks, 1, 1), (BLOCK, 1, 1), 0, s.cu_stream(), params)
                .map_err(|e| super::cu_err("cuLaunchKernel", Some(dev), e))
        }
    })
}

/// Run `k` over `n` work items with a grid-stride loop on this thread's stream of `dev`
/// (not waited for: the caller synchronises).
///
/// # Safety
/// `params` must point to the kernel's arguments, in order and of its parameter types, and
/// every device pointer among them must be valid for what the kernel does with `n` items.
pub unsafe fn launch(dev: i32, k: &Kernel, n: usize, params: &mut [*mut c_void]) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    // SAFETY: per this function's contract; the kernel strides over the `n` items.
    unsafe { launch_blocks(dev, k, n.div_ceil(BLOCK as usize), params) }
}
