//! mxnet-rt: MXNet 1.9.1's C ABI over the Rust runtime (`mxnet-core`), built as the drop-in
//! `libmxnet.so` (and `libmxnet.a`); cbindgen generates `include/mxnet/c_api.h` from it.
//!
//! One file per section of stock `c_api.h`. Thin by rule: convert the arguments, call into the
//! runtime, return. Every function runs inside [`ffi::call`]. Besides: [`handle`] (the handles
//! given to C) and the C implementations of what the runtime declares as traits for the
//! frontend (custom operators, `autograd.Function`).

pub mod autograd;
pub mod base;
pub mod cached_op;
pub mod custom_op;
pub mod data_iter;
pub mod dlpack;
pub mod engine;
pub mod env;
pub mod executor;
pub mod ffi;
pub mod frontend;
pub mod handle;
pub mod kvstore;
pub mod ndarray;
pub mod ndarray_io;
pub mod nnvm;
pub mod op;
pub mod predict;
pub mod profiler;
pub mod recordio;
pub mod storage;
pub mod symbol;
pub mod testing;
pub mod types;
pub mod unsupported;

#[cfg(test)]
mod header_test;
