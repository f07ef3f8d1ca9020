//! The data pipeline below the frontend's `mx.io` and `mx.recordio`.
//!
//! Owns: the RecordIO file format ([`recordio`]) and the C++ data iterators of stock that
//! `mx.io` wraps ([`iter`], [`image_iter`]).

pub mod image_iter;
pub mod iter;
pub mod recordio;
