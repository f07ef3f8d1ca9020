//! The data pipeline below the frontend's `mx.io` and `mx.recordio`.
//!
//! Owns: the RecordIO file format ([`recordio`]) and the C++ data iterators of stock that
//! `mx.io` wraps ([`iter`]).

pub mod iter;
pub mod recordio;
