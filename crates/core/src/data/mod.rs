//! The data pipeline below the frontend's `mx.io` and `mx.recordio`.
//!
//! Owns: the RecordIO file format ([`recordio`]) and the C++ data iterators of stock that
//! `mx.io` wraps ([`iter`], [`image_iter`], [`image_det_iter`], sharing
//! [`record_batches`]).

mod image_det_iter;
pub mod image_iter;
pub mod iter;
mod record_batches;
pub mod recordio;
