//! C API: the storage manager (stock MXStorageEmptyCache, our MXStorageGetStats).

use super::ffi;
use mxnet_core::context::Context;
use mxnet_core::storage;
use std::ffi::{c_char, c_int};

/// Return the cached memory of the context's pool to the system.
#[no_mangle]
pub extern "C" fn MXStorageEmptyCache(dev_type: c_int, dev_id: c_int) -> c_int {
    ffi::call("MXStorageEmptyCache", || {
        storage::manager().empty_cache(Context::from_codes(dev_type, dev_id)?).map(drop)
    })
}

/// mxnet-rt addition: storage statistics as JSON, one object per context used so far
/// (`{"cpu(0)": {"pool_type", "bytes_in_use", "bytes_cached", "peak_bytes_in_use",
/// "allocations", "cache_hits", "allocator_calls", "oom_retries"}}`). The string stays valid
/// until the next call on this thread that returns a string.
///
/// # Safety
/// `out_json` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXStorageGetStats(out_json: *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXStorageGetStats", out_json, "out_json", || {
            ffi::return_str(&storage::manager().stats_json().to_string())
        })
    }
}
