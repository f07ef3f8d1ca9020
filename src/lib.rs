//! mxnet-rt: the runtime core of Apache MXNet in Rust, built as a drop-in `libmxnet.so` with
//! MXNet 1.9.1's C ABI.
//!
//! Layout: [`config`] (every environment variable), [`engine`] (the dependency engine),
//! [`context`] (devices), [`handle`] (handles given to C), `heap` (the global allocator), [`runtime`] (process-wide state),
//! [`error`] (the error kinds the frontend maps), [`sync`] (locks), [`profiler`] (traces and statistics),
//! [`symbol`] (symbolic graphs: composition, JSON, inference), [`autograd`] (recording and
//! gradients), [`executor`] (CachedOp and Executor), [`c_api`] (the exported functions).
//! This file only wires modules together.

pub mod autograd;
pub mod c_api;
pub mod config;
pub mod context;
pub mod engine;
pub mod error;
pub mod executor;
pub mod handle;
mod heap;
pub mod intern;
pub mod ndarray;
pub mod op;
pub mod profiler;
pub mod runtime;
pub mod storage;
pub mod symbol;
pub mod sync;

pub use error::{Error, ErrorKind, Result};

#[cfg(test)]
mod header_test;

/// The library's allocator.
#[global_allocator]
static GLOBAL_ALLOCATOR: heap::Heap = heap::Heap;
