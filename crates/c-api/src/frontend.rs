//! C API: what `import mxnet` asks of the library besides operators — MXKVStoreIsWorkerNode
//! (and the server and scheduler questions: the process's distributed role),
//! the (empty) legacy function list and the (empty) PackedFunc registry
//! (MXCustomOpRegister is in `custom_op`, the data iterators in `data_iter`).
//!
//! Lists we do not have are returned empty (the frontend then generates nothing for them);
//! asking for an entry of an empty list is an error.

use super::ffi::{self, cstr, out};
use super::types::FunctionHandle;
use mxnet_core::error::Error;
use mxnet_core::kvstore::{role, Role};
use std::ffi::{c_char, c_int, c_void};

/// Whether this process is a worker: `DMLC_ROLE` unset or `worker` (as stock's ps-lite reads
/// it; `MXInitPSEnv` settings first). The frontend runs a server (which returns at once here:
/// the workers reduce among themselves over MPI) and exits when it is not.
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsWorkerNode(ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreIsWorkerNode", ret, "ret", || Ok((role() == Role::Worker) as c_int)) }
}

/// Whether this process is a parameter server: `DMLC_ROLE` is `server`.
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsServerNode(ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreIsServerNode", ret, "ret", || Ok((role() == Role::Server) as c_int)) }
}

/// Whether this process is the parameter servers' scheduler: `DMLC_ROLE` is `scheduler`.
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsSchedulerNode(ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreIsSchedulerNode", ret, "ret", || Ok((role() == Role::Scheduler) as c_int)) }
}

/// # Safety
/// Out-params must be NULL or valid for writes.
unsafe fn empty_list<T>(api: &'static str, out_size: *mut u32, out_array: *mut *mut T) -> c_int {
    ffi::call(api, || {
        // SAFETY: per the caller's contract.
        let (n, a) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_array")?) };
        *n = 0;
        *a = std::ptr::null_mut();
        Ok(())
    })
}

/// Legacy NDArray functions: none (an empty list).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXListFunctions(out_size: *mut u32, out_array: *mut *mut FunctionHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { empty_list("MXListFunctions", out_size, out_array) }
}

/// No legacy function exists, so every handle is unknown.
#[no_mangle]
pub extern "C" fn MXFuncGetInfo(
    fun: FunctionHandle,
    _name: *mut *const c_char,
    _description: *mut *const c_char,
    _num_args: *mut u32,
    _arg_names: *mut *mut *const c_char,
    _arg_type_infos: *mut *mut *const c_char,
    _arg_descriptions: *mut *mut *const c_char,
    _return_type: *mut *const c_char,
) -> c_int {
    ffi::call("MXFuncGetInfo", || Err(Error::value(format!("{fun:p} is not a function handle (none are registered)"))))
}

/// No legacy function exists, so every handle is unknown.
#[no_mangle]
pub extern "C" fn MXFuncDescribe(
    fun: FunctionHandle,
    _num_use_vars: *mut u32,
    _num_scalars: *mut u32,
    _num_mutate_vars: *mut u32,
    _type_mask: *mut c_int,
) -> c_int {
    ffi::call("MXFuncDescribe", || Err(Error::value(format!("{fun:p} is not a function handle (none are registered)"))))
}

/// PackedFunc names: none (an empty list).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNetFuncListGlobalNames(out_size: *mut c_int, out_array: *mut *mut *const c_char) -> c_int {
    ffi::call("MXNetFuncListGlobalNames", || {
        // SAFETY: per this function's contract.
        let (n, a) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_array")?) };
        *n = 0;
        *a = std::ptr::null_mut();
        Ok(())
    })
}

/// No PackedFunc is registered.
///
/// # Safety
/// `name` must be NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn MXNetFuncGetGlobal(name: *const c_char, _out: *mut *mut c_void) -> c_int {
    ffi::call("MXNetFuncGetGlobal", || {
        // SAFETY: per this function's contract.
        let n = unsafe { cstr(name, "name")? };
        Err(Error::not_supported(format!("packed function {n}")))
    })
}
