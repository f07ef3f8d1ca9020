//! Convolution algorithm selection (seed 003's `cudnn_tune` over
//! `MXNET_CUDNN_AUTOTUNE_DEFAULT`, MegEngine's fast-run cache from seed 002).
//!
//! Owns: the tuning mode resolved per call (per-operator `cudnn_tune` wins over the global
//! default), the in-memory cache of timed choices keyed by (shapes, dtype, parameters) and its
//! optional file, and the determinism filter (`MXNET_ENFORCE_DETERMINISM`).
