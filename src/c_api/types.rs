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
