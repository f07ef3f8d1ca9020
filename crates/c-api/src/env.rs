//! C API: environment and configuration (`c_api_test.h`'s MXSetEnv/MXGetEnv, our MXGetConfig).

use super::ffi::{self, cstr, opt_cstr, out};
use mxnet_core::config;
use std::ffi::{c_char, c_int};

/// Read a variable from the live process environment; `*value` is NULL when it is unset.
/// The string stays valid until the next call on this thread that returns a string.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string; `value` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetEnv(name: *const c_char, value: *mut *const c_char) -> c_int {
    ffi::call("MXGetEnv", || {
        // SAFETY: per this function's contract.
        let (name, value) = unsafe { (cstr(name, "name")?, out(value, "value")?) };
        *value = match config::global().env_value(name) {
            Some(v) => ffi::return_str(&v)?,
            None => std::ptr::null(),
        };
        Ok(())
    })
}

/// Set a variable in the process environment (`value` NULL unsets it). A variable of the
/// registry is validated first; a read-once variable that is already fixed fails unless the
/// value is the one it was fixed to. A dynamic variable takes effect at its next use.
///
/// # Safety
/// `name` and `value` must be NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn MXSetEnv(name: *const c_char, value: *const c_char) -> c_int {
    ffi::call("MXSetEnv", || {
        // SAFETY: per this function's contract.
        let (name, value) = unsafe { (cstr(name, "name")?, opt_cstr(value, "value")?) };
        config::global().set_env(name, value)
    })
}

/// mxnet-rt addition: the configuration as JSON. For one variable (`name`) an object; for
/// all (`name` NULL) an array. Each object has: name, value (effective), default, type,
/// accepted, doc, category, read_once, already_read, fixed_by, source (default, environment,
/// MXSetEnv, unset), env (live text), fallback, status (active, reserved, frontend), valid,
/// error. Reading the configuration does not count as a use of a read-once variable.
/// The string stays valid until the next call on this thread that returns a string.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string; `out_json` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGetConfig(name: *const c_char, out_json: *mut *const c_char) -> c_int {
    ffi::call("MXGetConfig", || {
        // SAFETY: per this function's contract.
        let (name, out_json) = unsafe { (opt_cstr(name, "name")?, out(out_json, "out_json")?) };
        let registry = config::global();
        let json = match name {
            Some(n) => registry.describe(n)?,
            None => registry.describe_all(),
        };
        *out_json = ffi::return_str(&json.to_string())?;
        Ok(())
    })
}
