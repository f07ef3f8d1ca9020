//! C API: DLPack exchange of NDArrays (MXNDArrayToDLPack, MXNDArrayFromDLPack[Ex],
//! MXNDArrayCallDLPackDeleter), over `ndarray::dlpack`. A `DLManagedTensorHandle` is a
//! `DLManagedTensor*` of MXNet 1.9.1's DLPack layout.

use super::ffi;
use super::ndarray::arrays;
use super::types::{DLManagedTensorHandle, NDArrayHandle};
use mxnet_core::ndarray::dlpack::{self, DLManagedTensor};
use std::ffi::c_int;
use std::sync::Arc;

/// A DLPack tensor over the array's memory that keeps the array alive until the tensor's
/// deleter runs (the consumer's to call, once: directly or with
/// [`MXNDArrayCallDLPackDeleter`]). Pending operations are not waited for: call
/// `MXNDArrayWaitToRead` (or `MXNDArrayWaitToWrite`, to write through it) first.
///
/// # Safety
/// `out_dlpack` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayToDLPack(handle: NDArrayHandle, out_dlpack: *mut DLManagedTensorHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayToDLPack", out_dlpack, "out_dlpack", || {
            Ok(dlpack::to_dlpack(&*arrays().get(handle)?)?.cast())
        })
    }
}

/// [`MXNDArrayFromDLPackEx`] with a tensor that stays valid (not transient).
///
/// # Safety
/// As [`MXNDArrayFromDLPackEx`].
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayFromDLPack(dlpack: DLManagedTensorHandle, out_handle: *mut NDArrayHandle) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { from_dlpack("MXNDArrayFromDLPack", dlpack, false, out_handle) }
}

/// An NDArray over a DLPack tensor's memory (no copy); the tensor's deleter runs once, when
/// the array's last view is freed. With `transient_handle` the `DLManagedTensor` struct
/// itself may be gone after this call (the frontend's `from_numpy` builds one on the fly); the
/// memory it points to may not. Compact row-major tensors only; on failure the tensor stays
/// the caller's (its deleter does not run).
///
/// # Safety
/// `dlpack` must point to a valid `DLManagedTensor` (as DLPack describes it) that the caller
/// gives up on success; `out_handle` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayFromDLPackEx(
    dlpack: DLManagedTensorHandle,
    transient_handle: bool,
    out_handle: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { from_dlpack("MXNDArrayFromDLPackEx", dlpack, transient_handle, out_handle) }
}

/// # Safety
/// As [`MXNDArrayFromDLPackEx`].
unsafe fn from_dlpack(
    api: &'static str,
    dlpack: DLManagedTensorHandle,
    transient: bool,
    out_handle: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        ffi::call_out(api, out_handle, "out_handle", || {
            let a = dlpack::from_dlpack(dlpack.cast::<DLManagedTensor>(), transient)?;
            Ok(arrays().insert(Arc::new(a)))
        })
    }
}

/// Run a DLPack tensor's deleter (a tensor nobody consumed; NULL, or a tensor without a
/// deleter, needs nothing).
///
/// # Safety
/// `dlpack` must be NULL or a valid `DLManagedTensor` not deleted yet; it is gone after.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCallDLPackDeleter(dlpack: DLManagedTensorHandle) -> c_int {
    ffi::call("MXNDArrayCallDLPackDeleter", || {
        let t = dlpack.cast::<DLManagedTensor>();
        if t.is_null() {
            return Ok(());
        }
        // SAFETY: per this function's contract: the tensor is live and deleted once, here
        // (one without a deleter owns nothing).
        unsafe {
            if let Some(d) = (*t).deleter {
                d(t);
            }
        }
        Ok(())
    })
}
