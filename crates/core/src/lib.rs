//! mxnet-core: the runtime of Apache MXNet in Rust. It knows no C: the C ABI (`libmxnet.so`)
//! is the `mxnet-rt` crate in `crates/c-api`, built over this one.
//!
//! Layers, lowest first; a module uses only modules of lower layers (the `layers` test below
//! fails on an arrow up):
//! 1. [`error`] (the error kinds the frontend maps), [`sync`] (locks), `heap` (the global
//!    allocator);
//! 2. [`context`] (devices), [`intern`] (interned names);
//! 3. [`config`] (every environment variable);
//! 4. [`storage`] (memory and its pools);
//! 5. [`profiler`] (traces and statistics);
//! 6. [`runtime`] (process-wide state and the fork protocol);
//! 7. [`engine`] (the dependency engine);
//! 8. [`ndarray`] (arrays over storage, ordered by the engine);
//! 9. [`op`] (operators: one declaration each, kernels, imperative invocation);
//! 10. [`autograd`] (recording calls and computing gradients);
//! 11. [`symbol`] (symbolic graphs: composition, JSON, inference);
//! 12. [`executor`] (CachedOp and Executor).
//!
//! What the frontend implements in its own language (custom operators, `autograd.Function`)
//! the domain declares as traits ([`op::custom::FrontendProp`], [`op::CustomBackward`]); the C
//! layer implements them. This file only wires modules together.

pub mod autograd;
pub mod config;
pub mod context;
pub mod engine;
pub mod error;
pub mod executor;
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

/// The library's allocator.
#[global_allocator]
static GLOBAL_ALLOCATOR: heap::Heap = heap::Heap;

#[cfg(test)]
mod layers;
