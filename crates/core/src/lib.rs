//! mxnet-core: the runtime of Apache MXNet in Rust. It knows no C: the C ABI (`libmxnet.so`)
//! is the `mxnet-rt` crate in `crates/c-api`, built over this one.
//!
//! Layers, lowest first; a module uses only modules of lower layers (the `layers` test below
//! fails on an arrow up):
//! 1. [`error`] (the error kinds the frontend maps), [`sync`] (locks), `heap` (the global
//!    allocator);
//! 2. [`cuda`] (the CUDA driver, loaded at run time: devices, memory, copies, kernels);
//! 3. [`context`] (devices), [`intern`] (interned names);
//! 4. [`config`] (every environment variable);
//! 5. [`storage`] (memory and its pools);
//! 6. [`profiler`] (traces and statistics);
//! 7. [`runtime`] (process-wide state and the fork protocol);
//! 8. [`engine`] (the dependency engine);
//! 9. [`ndarray`] (arrays over storage, ordered by the engine);
//! 10. [`op`] (operators: one declaration each, kernels, imperative invocation);
//! 11. [`autograd`] (recording calls and computing gradients);
//! 12. [`symbol`] (symbolic graphs: composition, JSON, inference);
//! 13. [`executor`] (CachedOp and Executor);
//! 14. [`data`] (the data pipeline: RecordIO files, data iterators), [`kvstore`] (the key-value
//!     stores of data-parallel training).
//!
//! What the frontend implements in its own language (custom operators, `autograd.Function`)
//! the domain declares as traits ([`op::custom::FrontendProp`], [`op::CustomBackward`]); the C
//! layer implements them. This file only wires modules together.

pub mod autograd;
pub mod config;
pub mod context;
pub mod cuda;
pub mod data;
pub mod engine;
pub mod error;
pub mod executor;
mod heap;
pub mod intern;
pub mod kvstore;
pub mod ndarray;
pub mod op;
pub mod profiler;
pub mod runtime;
pub mod storage;
pub mod symbol;
pub mod sync;

pub use error::{Error, ErrorKind, Result};

/// The library's allocator.
#[global_allocator]
static GLOBAL_ALLOCATOR: heap::Heap = heap::Heap;

#[cfg(test)]
mod layers;
