//! C API: NDArray handles (creation, free, shape, dtype, context, synchronous copies, waits)
//! and the engine's NDArray push variants.

use super::engine::{push_args, push_c, EngineAsyncFunc, EngineFuncParamDeleter, EngineSyncFunc};
use super::ffi::{self, out};
use super::types::{ContextHandle, EngineFnPropertyHandle, NDArrayHandle};
use crate::context::Context;
use crate::engine::Var;
use crate::error::{Error, Result};
use crate::handle::HandleTable;
use crate::ndarray::{DType, NDArray};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

pub(crate) fn arrays() -> &'static HandleTable<NDArray> {
    static T: OnceLock<HandleTable<NDArray>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(4, "NDArray"))
}

thread_local! {
    static SHAPE_U32: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static SHAPE_I32: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// `shape` must point to `ndim` readable values when `ndim > 0`.
unsafe fn read_shape(shape: *const u32, ndim: u32) -> Result<Vec<usize>> {
    if ndim == 0 {
        return Ok(Vec::new());
    }
    if shape.is_null() {
        return Err(Error::value(format!("shape is NULL but ndim is {ndim}")));
    }
    if ndim > 32 {
        return Err(Error::value(format!("ndim {ndim} exceeds the supported 32 dimensions")));
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(shape, ndim as usize) }.iter().map(|&d| d as usize).collect())
}

fn create(shape: Vec<usize>, dev_type: c_int, dev_id: c_int, delay_alloc: c_int, dtype: c_int) -> Result<NDArrayHandle> {
    let ctx = Context::from_codes(dev_type, dev_id)?;
    let nd = NDArray::new(shape, ctx, DType::from_code(dtype)?, delay_alloc != 0)?;
    Ok(arrays().insert(Arc::new(nd)))
}

/// Create an empty NDArray handle (no shape, no storage).
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateNone(out: *mut NDArrayHandle) -> c_int {
    ffi::call("MXNDArrayCreateNone", || {
        // SAFETY: per this function's contract.
        let out = unsafe { ffi::out(out, "out") }?;
        *out = arrays().insert(Arc::new(NDArray::none()));
        Ok(())
    })
}

/// Create a float32 NDArray.
///
/// # Safety
/// `shape` must point to `ndim` values; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreate(
    shape: *const u32,
    ndim: u32,
    dev_type: c_int,
    dev_id: c_int,
    delay_alloc: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArrayCreate", || {
        // SAFETY: per this function's contract.
        let (shape, out) = unsafe { (read_shape(shape, ndim)?, ffi::out(out, "out")?) };
        *out = create(shape, dev_type, dev_id, delay_alloc, 0)?;
        Ok(())
    })
}

/// Create an NDArray of `dtype` (0 float32, 1 float64, 2 float16, 3 uint8, 4 int32, 5 int8,
/// 6 int64, 7 bool).
///
/// # Safety
/// `shape` must point to `ndim` values; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateEx(
    shape: *const u32,
    ndim: u32,
    dev_type: c_int,
    dev_id: c_int,
    delay_alloc: c_int,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArrayCreateEx", || {
        // SAFETY: per this function's contract.
        let (shape, out) = unsafe { (read_shape(shape, ndim)?, ffi::out(out, "out")?) };
        *out = create(shape, dev_type, dev_id, delay_alloc, dtype)?;
        Ok(())
    })
}

/// Free an NDArray handle (NULL is allowed and does nothing). Its memory is released after
/// the last operation pending on it; a second free of the same handle is an error.
#[no_mangle]
pub extern "C" fn MXNDArrayFree(handle: NDArrayHandle) -> c_int {
    ffi::call("MXNDArrayFree", || {
        if handle.is_null() {
            return Ok(());
        }
        arrays().remove(handle).map(drop)
    })
}

/// Write `handle`'s shape, converted to `T`, into a per-thread buffer.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
unsafe fn shape_out<T: TryFrom<usize> + Copy + 'static, D: TryFrom<usize>>(
    buffer: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    handle: NDArrayHandle,
    out_dim: *mut D,
    out_pdata: *mut *const T,
) -> Result<()> {
    // SAFETY: per this function's contract.
    let (dim, pdata) = unsafe { (out(out_dim, "out_dim")?, out(out_pdata, "out_pdata")?) };
    let nd = arrays().get(handle)?;
    let too_big = || Error::value(format!("shape {:?} does not fit the requested integer type", nd.shape));
    let dims = nd.shape.iter().map(|&d| T::try_from(d).map_err(|_| too_big())).collect::<Result<Vec<T>>>()?;
    *dim = D::try_from(dims.len()).map_err(|_| too_big())?;
    *pdata = buffer.with(|b| {
        *b.borrow_mut() = dims;
        b.borrow().as_ptr()
    });
    Ok(())
}

/// The shape as uint32 values in a per-thread buffer.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShape(handle: NDArrayHandle, out_dim: *mut u32, out_pdata: *mut *const u32) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXNDArrayGetShape", || unsafe { shape_out(&SHAPE_U32, handle, out_dim, out_pdata) })
}

/// The shape as int values in a per-thread buffer; an empty (none) array has ndim 0.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShapeEx(handle: NDArrayHandle, out_dim: *mut c_int, out_pdata: *mut *const c_int) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXNDArrayGetShapeEx", || unsafe { shape_out(&SHAPE_I32, handle, out_dim, out_pdata) })
}

/// The dtype code; -1 for an empty (none) array.
///
/// # Safety
/// `out_dtype` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetDType(handle: NDArrayHandle, out_dtype: *mut c_int) -> c_int {
    ffi::call("MXNDArrayGetDType", || {
        // SAFETY: per this function's contract.
        let o = unsafe { out(out_dtype, "out_dtype") }?;
        let nd = arrays().get(handle)?;
        *o = if nd.chunk.is_none() { -1 } else { nd.dtype as c_int };
        Ok(())
    })
}

/// The context codes; (0, 0) for an empty (none) array.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetContext(handle: NDArrayHandle, out_dev_type: *mut c_int, out_dev_id: *mut c_int) -> c_int {
    ffi::call("MXNDArrayGetContext", || {
        // SAFETY: per this function's contract.
        let (t, id) = unsafe { (out(out_dev_type, "out_dev_type")?, out(out_dev_id, "out_dev_id")?) };
        let nd = arrays().get(handle)?;
        (*t, *id) = nd.ctx().map_or((0, 0), |c| (c.dev_type as c_int, c.dev_id));
        Ok(())
    })
}

/// Copy `size` elements (not bytes) from host memory into the array; blocking.
///
/// # Safety
/// `data` must point to `size` elements of the array's dtype.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySyncCopyFromCPU(handle: NDArrayHandle, data: *const c_void, size: usize) -> c_int {
    ffi::call("MXNDArraySyncCopyFromCPU", || {
        let nd = arrays().get(handle)?;
        if data.is_null() && size > 0 {
            return Err(Error::value("data must not be NULL"));
        }
        // SAFETY: per this function's contract.
        unsafe { nd.copy_from_host(data as *const u8, size) }
    })
}

/// Copy `size` elements (not bytes) of the array into host memory after its pending writes.
///
/// # Safety
/// `data` must point to room for `size` elements of the array's dtype.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySyncCopyToCPU(handle: NDArrayHandle, data: *mut c_void, size: usize) -> c_int {
    ffi::call("MXNDArraySyncCopyToCPU", || {
        let nd = arrays().get(handle)?;
        if data.is_null() && size > 0 {
            return Err(Error::value("data must not be NULL"));
        }
        // SAFETY: per this function's contract.
        unsafe { nd.copy_to_host(data as *mut u8, size) }
    })
}

/// Wait until the array's pending writes are done; -1 with a failure that reached it.
#[no_mangle]
pub extern "C" fn MXNDArrayWaitToRead(handle: NDArrayHandle) -> c_int {
    ffi::call("MXNDArrayWaitToRead", || arrays().get(handle)?.wait(false))
}

/// Wait until all the array's pending operations are done; -1 with a failure that reached it.
#[no_mangle]
pub extern "C" fn MXNDArrayWaitToWrite(handle: NDArrayHandle) -> c_int {
    ffi::call("MXNDArrayWaitToWrite", || arrays().get(handle)?.wait(true))
}

/// The engine variables of `n` NDArray handles (their data lives as long as the variable).
///
/// # Safety
/// `handles` must point to `n` handles when `n > 0`.
unsafe fn nd_vars(handles: *const NDArrayHandle, n: c_int, what: &str) -> Result<Vec<Arc<Var>>> {
    if n < 0 {
        return Err(Error::value(format!("{what}: negative count {n}")));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    if handles.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    let hs = unsafe { std::slice::from_raw_parts(handles, n as usize) };
    let mut vars = Vec::with_capacity(hs.len());
    for &h in hs {
        vars.push(arrays().with(h, |nd| nd.chunk().map(|c| c.var.clone()))??);
    }
    Ok(vars)
}

/// # Safety
/// As for MXEnginePushAsyncND.
#[allow(clippy::too_many_arguments)]
unsafe fn push_nd(
    sync_func: EngineSyncFunc,
    async_func: EngineAsyncFunc,
    func_param: *mut c_void,
    deleter: EngineFuncParamDeleter,
    ctx_handle: ContextHandle,
    const_nds: *const NDArrayHandle,
    num_const: c_int,
    mutable_nds: *const NDArrayHandle,
    num_mutable: c_int,
    prop_handle: EngineFnPropertyHandle,
    priority: c_int,
    name: *const c_char,
    wait: bool,
) -> Result<()> {
    // SAFETY: per this function's contract.
    unsafe {
        let vars = nd_vars(const_nds, num_const, "const_nds_handle")
            .and_then(|r| Ok((r, nd_vars(mutable_nds, num_mutable, "mutable_nds_handle")?)));
        let c = push_args(ctx_handle, prop_handle, priority, name, vars, wait)?;
        push_c(c, sync_func, async_func, func_param, deleter)
    }
}

/// MXEnginePushAsync with the variables of NDArrays.
///
/// # Safety
/// As for MXEnginePushAsync, with arrays of NDArray handles.
#[no_mangle]
pub unsafe extern "C" fn MXEnginePushAsyncND(
    async_func: EngineAsyncFunc,
    func_param: *mut c_void,
    deleter: EngineFuncParamDeleter,
    ctx_handle: ContextHandle,
    const_nds_handle: *mut NDArrayHandle,
    num_const_nds: c_int,
    mutable_nds_handle: *mut NDArrayHandle,
    num_mutable_nds: c_int,
    prop_handle: EngineFnPropertyHandle,
    priority: c_int,
    opr_name: *const c_char,
    wait: bool,
) -> c_int {
    ffi::call("MXEnginePushAsyncND", || {
        // SAFETY: per this function's contract.
        unsafe {
            push_nd(None, async_func, func_param, deleter, ctx_handle, const_nds_handle, num_const_nds,
                mutable_nds_handle, num_mutable_nds, prop_handle, priority, opr_name, wait)
        }
    })
}

/// MXEnginePushSync with the variables of NDArrays.
///
/// # Safety
/// As for MXEnginePushSync, with arrays of NDArray handles.
#[no_mangle]
pub unsafe extern "C" fn MXEnginePushSyncND(
    sync_func: EngineSyncFunc,
    func_param: *mut c_void,
    deleter: EngineFuncParamDeleter,
    ctx_handle: ContextHandle,
    const_nds_handle: *mut NDArrayHandle,
    num_const_nds: c_int,
    mutable_nds_handle: *mut NDArrayHandle,
    num_mutable_nds: c_int,
    prop_handle: EngineFnPropertyHandle,
    priority: c_int,
    opr_name: *const c_char,
) -> c_int {
    ffi::call("MXEnginePushSyncND", || {
        // SAFETY: per this function's contract.
        unsafe {
            push_nd(sync_func, None, func_param, deleter, ctx_handle, const_nds_handle, num_const_nds,
                mutable_nds_handle, num_mutable_nds, prop_handle, priority, opr_name, false)
        }
    })
}
