//! The exported C ABI, one file per section of stock `c_api.h`. Thin by rule: convert the
//! arguments, call into the runtime, return. Every function runs inside [`ffi::call`].

pub mod autograd;
pub mod base;
pub mod cached_op;
pub mod custom_op;
pub mod engine;
pub mod env;
pub mod executor;
pub mod ffi;
pub mod frontend;
pub mod ndarray;
pub mod ndarray_io;
pub mod op;
pub mod profiler;
pub mod storage;
pub mod symbol;
pub mod testing;
pub mod types;
