//! C API: NDArray handles (creation, free, shape, dtype, context, synchronous copies, waits)
//! and the engine's NDArray push variants.

use super::engine::{
    push_c, CArgs, CFunc, EngineAsyncFunc, EngineFuncParamDeleter, EngineSyncFunc, HandleList, VarHandles,
};
use super::ffi::{self, out};
use super::types::{ContextHandle, EngineFnPropertyHandle, NDArrayHandle};
use crate::handle::HandleTable;
use mxnet_core::context::Context;
use mxnet_core::engine::Var;
use mxnet_core::error::{Error, Result};
use mxnet_core::ndarray::{np_shape, DType, NDArray, MAX_NDIM};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
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
    if ndim as usize > MAX_NDIM {
        return Err(Error::value(format!("ndim {ndim}: an array has at most {MAX_NDIM} dimensions")));
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(shape, ndim as usize) }.iter().map(|&d| d as usize).collect())
}

fn create(
    shape: Vec<usize>,
    dev_type: c_int,
    dev_id: c_int,
    delay_alloc: c_int,
    dtype: c_int,
) -> Result<NDArrayHandle> {
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
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXNDArrayCreateNone", out, "out", || Ok(arrays().insert(Arc::new(NDArray::none())))) }
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
    // SAFETY: per this function's contract (float32 is dtype 0).
    unsafe { MXNDArrayCreateEx(shape, ndim, dev_type, dev_id, delay_alloc, 0, out) }
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

/// An array over shared memory another process made (`MXNDArrayGetSharedMemHandle` there):
/// `shared_id` is the file descriptor as received here (the frontend passes it with `DupFd`);
/// the array owns it from now on and closes it when freed. On failure the descriptor stays
/// the caller's.
///
/// # Safety
/// `out` must be NULL or valid for writes.
unsafe fn from_shared_mem(
    name: &'static str,
    pid: c_int,
    id: c_int,
    shape: Result<Vec<usize>>,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call(name, || {
        // SAFETY: per this function's contract.
        let out = unsafe { ffi::out(out, "out")? };
        let (shape, dtype) = (shape?, DType::from_code(dtype)?);
        // SAFETY: the caller gives the descriptor up (this function's C contract).
        let nd = unsafe { NDArray::from_shared_mem(pid, id, shape, dtype)? };
        *out = arrays().insert(Arc::new(nd));
        Ok(())
    })
}

/// Create an array on `cpu_shared(0)` over the shared memory `(shared_pid, shared_id)` that
/// `MXNDArrayGetSharedMemHandle` gave in another process; `shared_id` is the file descriptor
/// as received in this one, and the array owns it once this succeeds.
///
/// # Safety
/// `shape` must point to `ndim` values; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateFromSharedMem(
    shared_pid: c_int,
    shared_id: c_int,
    shape: *const u32,
    ndim: u32,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    let shape = unsafe { read_shape(shape, ndim) };
    // SAFETY: per this function's contract.
    unsafe { from_shared_mem("MXNDArrayCreateFromSharedMem", shared_pid, shared_id, shape, dtype, out) }
}

/// `MXNDArrayCreateFromSharedMem` with an `int` shape (negative sizes are refused).
///
/// # Safety
/// `shape` must point to `ndim` values; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateFromSharedMemEx(
    shared_pid: c_int,
    shared_id: c_int,
    shape: *const c_int,
    ndim: c_int,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    let shape = (|| {
        let n = u32::try_from(ndim).map_err(|_| Error::value(format!("ndim {ndim} is negative")))?;
        if n == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: per this function's contract (NULL with ndim > 0 is refused first).
        let dims = unsafe { read_shape(shape.cast::<u32>(), n)? };
        dims.iter()
            .map(|&d| match i32::try_from(d as u32) {
                Ok(v) if v >= 0 => Ok(d),
                _ => Err(Error::value(format!("shape has a negative size {}", d as u32 as i32))),
            })
            .collect()
    })();
    // SAFETY: per this function's contract.
    unsafe { from_shared_mem("MXNDArrayCreateFromSharedMemEx", shared_pid, shared_id, shape, dtype, out) }
}

/// The shared-memory handle of an array on `cpu_shared`: the creating process's id and the
/// memory's file descriptor, which stays the array's (send a duplicate, as the frontend's
/// `DupFd` does). Waits for the array's pending writes. An array on another context, or a
/// view that starts inside its memory, is refused (copy it to `cpu_shared` first); stock
/// returns a descriptor it has already closed for the first.
///
/// # Safety
/// `shared_pid` and `shared_id` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetSharedMemHandle(
    handle: NDArrayHandle,
    shared_pid: *mut c_int,
    shared_id: *mut c_int,
) -> c_int {
    ffi::call("MXNDArrayGetSharedMemHandle", || {
        // SAFETY: per this function's contract.
        let (pid_out, id_out) = unsafe { (out(shared_pid, "shared_pid")?, out(shared_id, "shared_id")?) };
        let (pid, fd) = arrays().get(handle)?.shared_mem_handle()?;
        (*pid_out, *id_out) = (pid, fd);
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
unsafe fn shape_out<T: TryFrom<usize> + Copy + 'static, D: TryFrom<i64>>(
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
    // An empty (none) array has an unknown shape: ndim -1 in numpy-shape mode (the
    // frontend's `shape is None`), 0 otherwise (and 0 where the type cannot hold -1).
    let ndim = if nd.chunk.is_none() && np_shape::get() != 0 { -1 } else { dims.len() as i64 };
    *dim = D::try_from(ndim).or_else(|_| D::try_from(0)).map_err(|_| too_big())?;
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
pub unsafe extern "C" fn MXNDArrayGetShape(
    handle: NDArrayHandle,
    out_dim: *mut u32,
    out_pdata: *mut *const u32,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXNDArrayGetShape", || unsafe { shape_out(&SHAPE_U32, handle, out_dim, out_pdata) })
}

/// The shape as int values in a per-thread buffer; an empty (none) array has ndim 0.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShapeEx(
    handle: NDArrayHandle,
    out_dim: *mut c_int,
    out_pdata: *mut *const c_int,
) -> c_int {
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
pub unsafe extern "C" fn MXNDArrayGetContext(
    handle: NDArrayHandle,
    out_dev_type: *mut c_int,
    out_dev_id: *mut c_int,
) -> c_int {
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

/// NDArray handles as a push's variables: each array's chunk variable (its data lives as
/// long as the variable).
struct NdVars;

impl VarHandles for NdVars {
    fn var(&self, h: *mut c_void) -> Result<Arc<Var>> {
        arrays().with(h, |nd| nd.chunk().map(Arc::clone))?
    }
}

/// # Safety
/// As for MXEnginePushAsyncND.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
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
    let reads = HandleList { ptr: const_nds, n: num_const, what: "const_nds_handle" };
    let writes = HandleList { ptr: mutable_nds, n: num_mutable, what: "mutable_nds_handle" };
    let args = CArgs { ctx: ctx_handle, prop: prop_handle, priority, name, wait };
    // SAFETY: per this function's contract.
    unsafe { push_c(&NdVars, reads, writes, args, CFunc { sync_func, async_func, param: func_param, deleter }) }
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
            push_nd(
                None,
                async_func,
                func_param,
                deleter,
                ctx_handle,
                const_nds_handle,
                num_const_nds,
                mutable_nds_handle,
                num_mutable_nds,
                prop_handle,
                priority,
                opr_name,
                wait,
            )
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
            push_nd(
                sync_func,
                None,
                func_param,
                deleter,
                ctx_handle,
                const_nds_handle,
                num_const_nds,
                mutable_nds_handle,
                num_mutable_nds,
                prop_handle,
                priority,
                opr_name,
                false,
            )
        }
    })
}

fn new_view(handle: NDArrayHandle, make: impl FnOnce(&NDArray) -> Result<NDArray>) -> Result<NDArrayHandle> {
    // Made outside the handle's slot lock (a spin lock): recording a view may take a while.
    let base = arrays().get(handle)?;
    let view = make(&base)?;
    Ok(arrays().insert(Arc::new(view)))
}

/// A view of rows `[slice_begin, slice_end)` of axis 0, sharing memory with `handle`.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySlice(
    handle: NDArrayHandle,
    slice_begin: u32,
    slice_end: u32,
    out: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArraySlice", out, "out", || {
            new_view(handle, |nd| mxnet_core::autograd::slice_view(nd, slice_begin as usize, slice_end as usize))
        })
    }
}

/// A view of row `idx` of axis 0 without that axis, sharing memory with `handle`.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayAt(handle: NDArrayHandle, idx: u32, out: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayAt", out, "out", || {
            new_view(handle, |nd| mxnet_core::autograd::at_view(nd, idx as usize))
        })
    }
}

/// # Safety
/// `dims` must point to `ndim` values when `ndim > 0`.
unsafe fn read_dims<T: Copy + Into<i64>>(dims: *const T, ndim: c_int) -> Result<Vec<i64>> {
    if usize::try_from(ndim).map_or(true, |n| n > MAX_NDIM) {
        return Err(Error::value(format!("ndim {ndim}: an array has 0 to at most {MAX_NDIM} dimensions")));
    }
    if ndim > 0 && dims.is_null() {
        return Err(Error::value(format!("dims is NULL but ndim is {ndim}")));
    }
    if ndim == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(dims, ndim as usize) }.iter().map(|&d| d.into()).collect())
}

/// A view with another shape (`dims` may use MXNet's codes 0, -1, -2, -3, -4).
///
/// # Safety
/// `dims` must point to `ndim` ints; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayReshape(
    handle: NDArrayHandle,
    ndim: c_int,
    dims: *mut c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArrayReshape", || {
        // SAFETY: per this function's contract.
        let (spec, o) = unsafe { (read_dims(dims as *const c_int, ndim)?, ffi::out(out, "out")?) };
        *o = new_view(handle, |nd| {
            mxnet_core::autograd::reshape_view(nd, &spec, false).map_err(mxnet_core::op::invoke::stock_class)
        })?;
        Ok(())
    })
}

/// A view with another shape, 64-bit dims; `reverse` applies the codes from the right.
///
/// # Safety
/// `dims` must point to `ndim` values; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayReshape64(
    handle: NDArrayHandle,
    ndim: c_int,
    dims: *mut i64,
    reverse: bool,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArrayReshape64", || {
        // SAFETY: per this function's contract.
        let (spec, o) = unsafe { (read_dims(dims as *const i64, ndim)?, ffi::out(out, "out")?) };
        // A shape the array cannot take is an MXNetError, as stock's shape check raises.
        *o = new_view(handle, |nd| {
            mxnet_core::autograd::reshape_view(nd, &spec, reverse).map_err(mxnet_core::op::invoke::stock_class)
        })?;
        Ok(())
    })
}

/// Create an NDArray with 64-bit dims.
///
/// # Safety
/// `shape` must point to `ndim` values; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateEx64(
    shape: *const i64,
    ndim: c_int,
    dev_type: c_int,
    dev_id: c_int,
    delay_alloc: c_int,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArrayCreateEx64", || {
        // SAFETY: per this function's contract.
        let (dims, o) = unsafe { (read_dims(shape, ndim)?, ffi::out(out, "out")?) };
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| Error::value(format!("negative dimension {d} in shape {dims:?}"))))
            .collect::<Result<Vec<_>>>()?;
        *o = create(shape, dev_type, dev_id, delay_alloc, dtype)?;
        Ok(())
    })
}

thread_local! {
    static SHAPE_I64: RefCell<Vec<i64>> = const { RefCell::new(Vec::new()) };
}

/// The shape as int64 values in a per-thread buffer.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShapeEx64(
    handle: NDArrayHandle,
    out_dim: *mut c_int,
    out_pdata: *mut *const i64,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXNDArrayGetShapeEx64", || unsafe { shape_out(&SHAPE_I64, handle, out_dim, out_pdata) })
}

/// The address of the array's data (allocating a delayed array). It does not wait for
/// pending operations: call MXNDArrayWaitToRead/ToWrite first.
///
/// # Safety
/// `out_pdata` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetData(handle: NDArrayHandle, out_pdata: *mut *mut c_void) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayGetData", out_pdata, "out_pdata", || Ok(arrays().get(handle)?.data()? as *mut c_void))
    }
}

/// A new handle for the same array (same storage, variable and shape).
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXShallowCopyNDArray(src: NDArrayHandle, out: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXShallowCopyNDArray", out, "out", || Ok(arrays().insert(arrays().get(src)?))) }
}

/// Storage type: 0 dense (default), -1 for an empty (none) array. Sparse arrays are not
/// supported yet.
///
/// # Safety
/// `out_storage_type` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetStorageType(handle: NDArrayHandle, out_storage_type: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayGetStorageType", out_storage_type, "out_storage_type", || {
            arrays().with(handle, |nd| if nd.chunk.is_none() { -1 } else { 0 })
        })
    }
}

/// Autograd's fresh-gradient flag of the array.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetGradState(handle: NDArrayHandle, out: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayGetGradState", out, "out", || {
            Ok(arrays().with(handle, |nd| nd.chunk.as_ref().is_some_and(|c| c.fresh_grad.load(Ordering::Acquire)))?
                as c_int)
        })
    }
}

/// Set autograd's fresh-gradient flag of the array.
#[no_mangle]
pub extern "C" fn MXNDArraySetGradState(handle: NDArrayHandle, state: c_int) -> c_int {
    ffi::call("MXNDArraySetGradState", || {
        arrays().with(handle, |nd| nd.chunk().map(|c| c.fresh_grad.store(state != 0, Ordering::Release)))?
    })
}

/// Copy `handle_src` into `handle_dst` (same shape and dtype); `i` must be -1 (the data;
/// other values address sparse auxiliary arrays, not supported yet). Blocking.
#[no_mangle]
pub extern "C" fn MXNDArraySyncCopyFromNDArray(
    handle_dst: NDArrayHandle,
    handle_src: NDArrayHandle,
    i: c_int,
) -> c_int {
    ffi::call("MXNDArraySyncCopyFromNDArray", || {
        if i != -1 {
            return Err(Error::not_supported(format!("copying sparse auxiliary array {i}")));
        }
        let (dst, src) = (arrays().get(handle_dst)?, arrays().get(handle_src)?);
        dst.copy_from(&src)
    })
}

/// Set numpy-shape semantics: 0 off, 1 on for this thread, 2 on globally; `*prev` receives
/// the previous mode.
///
/// # Safety
/// `prev` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSetIsNumpyShape(is_np_shape: c_int, prev: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXSetIsNumpyShape", prev, "prev", || np_shape::set(is_np_shape)) }
}

/// The numpy-shape mode: 0 off, 1 this thread, 2 global.
///
/// # Safety
/// `curr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXIsNumpyShape(curr: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXIsNumpyShape", curr, "curr", || Ok(np_shape::get())) }
}

/// Sparse arrays (row_sparse, csr) are not supported yet: always -1 with
/// `NotImplementedError`.
///
/// # Safety
/// Never dereferences its arguments.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn MXNDArrayCreateSparseEx(
    storage_type: c_int,
    _shape: *const u32,
    _ndim: u32,
    _dev_type: c_int,
    _dev_id: c_int,
    _delay_alloc: c_int,
    _dtype: c_int,
    _num_aux: u32,
    _aux_type: *mut c_int,
    _aux_ndims: *mut u32,
    _aux_shape: *const u32,
    _out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArrayCreateSparseEx", || {
        let kind = match storage_type {
            1 => "row_sparse",
            2 => "csr",
            _ => "unknown",
        };
        Err(Error::not_supported(format!("sparse storage ({kind}, storage type {storage_type})")))
    })
}

/// MXNDArraySlice with 64-bit bounds (used by the frontend when INT64_TENSOR_SIZE is on);
/// recorded under autograd as `MXNDArraySlice` is.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySlice64(
    handle: NDArrayHandle,
    slice_begin: i64,
    slice_end: i64,
    out: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXNDArraySlice64", || {
        // SAFETY: per this function's contract.
        let o = unsafe { ffi::out(out, "out") }?;
        let (b, e) = (usize::try_from(slice_begin), usize::try_from(slice_end));
        let (Ok(b), Ok(e)) = (b, e) else {
            return Err(Error::index(format!("slice [{slice_begin}, {slice_end}) has a negative bound")));
        };
        *o = new_view(handle, |nd| mxnet_core::autograd::slice_view(nd, b, e))?;
        Ok(())
    })
}

/// MXNDArrayAt with a 64-bit index; recorded under autograd as `MXNDArrayAt` is.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayAt64(handle: NDArrayHandle, idx: i64, out: *mut NDArrayHandle) -> c_int {
    ffi::call("MXNDArrayAt64", || {
        // SAFETY: per this function's contract.
        let o = unsafe { ffi::out(out, "out") }?;
        let i = usize::try_from(idx).map_err(|_| Error::index(format!("index {idx} is negative")))?;
        *o = new_view(handle, |nd| mxnet_core::autograd::at_view(nd, i))?;
        Ok(())
    })
}
