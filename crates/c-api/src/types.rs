//! The stock typedef names of `c_api.h`, so that C code written against MXNet 1.9.1's header
//! compiles against ours. Handles are opaque pointers; which Rust object stands behind each
//! one is decided by the module that hands it out.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

pub type mx_uint = u32;
pub type mx_float = f32;
pub type dim_t = i64;

pub type NDArrayHandle = *mut c_void;
pub type FunctionHandle = *const c_void;
pub type AtomicSymbolCreator = *mut c_void;
/// nnvm's operator handle (the same value as an [`AtomicSymbolCreator`]).
pub type OpHandle = *mut c_void;
pub type CachedOpHandle = *mut c_void;
pub type SymbolHandle = *mut c_void;
pub type AtomicSymbolHandle = *mut c_void;
pub type ExecutorHandle = *mut c_void;
pub type DataIterCreator = *mut c_void;
pub type DataIterHandle = *mut c_void;
pub type KVStoreHandle = *mut c_void;
pub type RecordIOHandle = *mut c_void;
pub type RtcHandle = *mut c_void;
pub type CudaModuleHandle = *mut c_void;
pub type CudaKernelHandle = *mut c_void;
pub type ProfileHandle = *mut c_void;
pub type DLManagedTensorHandle = *mut c_void;
pub type ContextHandle = *const c_void;
pub type EngineFnPropertyHandle = *const c_void;
pub type EngineVarHandle = *mut c_void;

/// Callbacks a frontend hands to the library (stock `struct MXCallbackList`).
#[repr(C)]
pub struct MXCallbackList {
    pub num_callbacks: std::ffi::c_int,
    pub callbacks: *mut Option<unsafe extern "C" fn() -> std::ffi::c_int>,
    pub contexts: *mut *mut c_void,
}

/// A custom operator's property creator (stock `CustomOpPropCreator`).
pub type CustomOpPropCreator = Option<
    unsafe extern "C" fn(
        op_type: *const std::ffi::c_char,
        num_kwargs: std::ffi::c_int,
        keys: *mut *const std::ffi::c_char,
        values: *mut *const std::ffi::c_char,
        ret: *mut MXCallbackList,
    ) -> std::ffi::c_int,
>;

/// An executor monitor's callback (stock `ExecutorMonitorCallback`): a name, a new array
/// handle the callee owns (and frees), and the pointer given with it.
pub type ExecutorMonitorCallback =
    Option<unsafe extern "C" fn(name: *const std::ffi::c_char, array: NDArrayHandle, handle: *mut c_void)>;

/// nnvm's graph handle (`nnvm/c_api.h`).
pub type GraphHandle = *mut c_void;

/// A CachedOp operator hook (stock `CachedOpMonitorCallback`): the array's name, the
/// operator's name, and a new array handle the callee owns (and frees).
pub type CachedOpMonitorCallback = Option<
    unsafe extern "C" fn(name: *const std::ffi::c_char, opr_name: *const std::ffi::c_char, array: NDArrayHandle),
>;

/// A predictor of the Predict API (`c_predict_api.h`).
pub type PredictorHandle = *mut c_void;
/// An NDArray list of the Predict API (`MXNDListCreate`).
pub type NDListHandle = *mut c_void;
/// A predictor's monitor callback (stock `PredMonitorCallback`): a name, a new array handle
/// the callee owns (and frees with `MXNDArrayFree`), and the pointer given with it.
pub type PredMonitorCallback =
    Option<unsafe extern "C" fn(name: *const std::ffi::c_char, array: NDArrayHandle, handle: *mut c_void)>;
