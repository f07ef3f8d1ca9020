//! C API: what `import mxnet` asks of the library besides operators — MXKVStoreIsWorkerNode
//! (and the server and scheduler questions),
//! the (empty) legacy function and data-iterator lists and the (empty) PackedFunc registry
//! (MXCustomOpRegister is in `custom_op`).
//!
//! Lists we do not have are returned empty (the frontend then generates nothing for them);
//! asking for an entry of an empty list is an error.

use super::ffi::{self, cstr, out};
use super::types::{DataIterCreator, DataIterHandle, FunctionHandle};
use mxnet_core::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void};

/// This process is a worker (no parameter server): the frontend must not start a server.
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsWorkerNode(ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreIsWorkerNode", ret, "ret", || Ok(1)) }
}

/// This process is no parameter server (0).
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsServerNode(ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreIsServerNode", ret, "ret", || Ok(0)) }
}

/// This process is no parameter-server scheduler (0).
///
/// # Safety
/// `ret` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsSchedulerNode(ret: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXKVStoreIsSchedulerNode", ret, "ret", || Ok(0)) }
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

/// The stock data iterators, by name. The frontend defines a class for each at import; none
/// can be created yet (MXDataIterCreateIter says so).
const DATA_ITERS: [&std::ffi::CStr; 9] = [
    c"CSVIter",
    c"ImageDetRecordIter",
    c"ImageRecordInt8Iter",
    c"ImageRecordIter",
    c"ImageRecordIter_v1",
    c"ImageRecordUInt8Iter",
    c"ImageRecordUInt8Iter_v1",
    c"LibSVMIter",
    c"MNISTIter",
];

struct IterTable([*mut c_void; 9]);
// SAFETY: the pointers address the static C strings above and are never written through.
unsafe impl Sync for IterTable {}
// SAFETY: as above.
unsafe impl Send for IterTable {}
static ITER_HANDLES: std::sync::OnceLock<IterTable> = std::sync::OnceLock::new();

fn iter_handles() -> &'static [*mut c_void; 9] {
    &ITER_HANDLES.get_or_init(|| IterTable(DATA_ITERS.map(|c| c.as_ptr() as *mut c_void))).0
}

fn iter_name(creator: *mut c_void) -> Result<&'static std::ffi::CStr> {
    iter_handles()
        .iter()
        .position(|&h| h == creator)
        .map(|i| DATA_ITERS[i])
        .ok_or_else(|| Error::value(format!("{creator:p} is not a data iterator creator")))
}

/// The stock data iterator names (creators that describe themselves but cannot run yet).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXListDataIters(out_size: *mut u32, out_array: *mut *mut DataIterCreator) -> c_int {
    ffi::call("MXListDataIters", || {
        // SAFETY: per this function's contract.
        let (n, a) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_array")?) };
        *n = DATA_ITERS.len() as u32;
        *a = iter_handles().as_ptr() as *mut DataIterCreator;
        Ok(())
    })
}

/// A data iterator's name and description (no arguments are declared).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXDataIterGetIterInfo(
    creator: DataIterCreator,
    name: *mut *const c_char,
    description: *mut *const c_char,
    num_args: *mut u32,
    arg_names: *mut *mut *const c_char,
    arg_type_infos: *mut *mut *const c_char,
    arg_descriptions: *mut *mut *const c_char,
) -> c_int {
    ffi::call("MXDataIterGetIterInfo", || {
        let n = iter_name(creator)?;
        // SAFETY: per this function's contract.
        unsafe {
            *out(name, "name")? = n.as_ptr();
            *out(description, "description")? =
                c"Not supported by mxnet-rt yet: creating this iterator fails with NotImplementedError.".as_ptr();
            *out(num_args, "num_args")? = 0;
            *out(arg_names, "arg_names")? = std::ptr::null_mut();
            *out(arg_type_infos, "arg_type_infos")? = std::ptr::null_mut();
            *out(arg_descriptions, "arg_descriptions")? = std::ptr::null_mut();
        }
        Ok(())
    })
}

/// Creating a data iterator is not supported yet.
#[no_mangle]
pub extern "C" fn MXDataIterCreateIter(
    handle: DataIterCreator,
    _num_param: u32,
    _keys: *mut *const c_char,
    _vals: *mut *const c_char,
    _out: *mut DataIterHandle,
) -> c_int {
    ffi::call("MXDataIterCreateIter", || {
        let n = iter_name(handle)?;
        Err(Error::not_supported(format!("data iterator {}", n.to_string_lossy())))
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
