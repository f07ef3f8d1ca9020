//! Internal test entry points. Exported so the C and Python test suites can reach them, left
//! out of the public header, and harmless: they change no state except as documented.

use super::ffi::{self, cstr, out};
use mxnet_core::config;
use mxnet_core::error::Error;
use std::ffi::{c_char, c_int};

/// Panics inside the C boundary: `how` 0 panics with a `&str`, 1 with a `String`, 2 with a
/// non-string payload; anything else returns an ordinary `MXNetError`. Always returns -1.
#[no_mangle]
pub extern "C" fn MXRtTestPanic(how: c_int) -> c_int {
    ffi::call("MXRtTestPanic", || match how {
        0 => panic!("deliberate test panic"),
        1 => panic!("deliberate test panic #{how}"),
        2 => std::panic::panic_any(42u8),
        _ => Err(Error::mxnet("deliberate test error")),
    })
}

/// Use a configuration variable as a consumer of the runtime would (fixing a read-once
/// variable) and return its effective value as JSON.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string; `out_json` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXRtTestUseConfig(name: *const c_char, out_json: *mut *const c_char) -> c_int {
    ffi::call("MXRtTestUseConfig", || {
        // SAFETY: per this function's contract.
        let (name, out_json) = unsafe { (cstr(name, "name")?, out(out_json, "out_json")?) };
        let r = config::global().get(name, "MXRtTestUseConfig")?;
        let json = serde_json::json!({
            "value": r.value.as_ref().map(config::Value::to_json),
            "source": r.source.name(),
        });
        *out_json = ffi::return_str(&json.to_string())?;
        Ok(())
    })
}
