//! The data pipeline below the frontend's `mx.io` and `mx.recordio`.
//!
//! Owns: the RecordIO file format ([`recordio`]).

pub mod recordio;
