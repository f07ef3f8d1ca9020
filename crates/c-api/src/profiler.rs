//! Profiler section of `c_api.h`: configuration, state, pause, dumps, aggregate statistics,
//! and the user's profiling objects (domains, tasks, frames, events, counters, markers).
//! Plus our `MXSetProfilerScope` (as in later MXNet releases).

use super::ffi::{self, cstr};
use super::types::{KVStoreHandle, ProfileHandle};
use crate::handle::HandleTable;
use mxnet_core::error::{Error, Result};
use mxnet_core::profiler::{self, aggregate::SortBy, objects, objects::Object, ProcessKind};
use std::ffi::{c_char, c_int};
use std::sync::{Arc, OnceLock};

fn objects() -> &'static HandleTable<Object> {
    static T: OnceLock<HandleTable<Object>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(5, "ProfileHandle"))
}

/// # Safety
/// `keys` and `vals` must each point to `n` C strings (or be NULL when `n` is 0).
unsafe fn set_config(n: c_int, keys: *const *const c_char, vals: *const *const c_char) -> Result<()> {
    if n < 0 {
        return Err(Error::value(format!("num_params must be >= 0, got {n}")));
    }
    if n > 0 && (keys.is_null() || vals.is_null()) {
        return Err(Error::value("keys and vals must not be NULL"));
    }
    let mut pairs = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: per this function's contract, i < n.
        let (k, v) = unsafe { (cstr(*keys.add(i), "key")?, cstr(*vals.add(i), "value")?) };
        pairs.push((k, v));
    }
    profiler::set_config(&pairs)
}

/// Configure the profiler (keys profile_all, profile_symbolic, profile_imperative,
/// profile_memory, profile_api, filename, continuous_dump, dump_period, aggregate_stats,
/// profile_process). Keys not given take their defaults again; an unknown key or a bad value
/// is a ValueError; the previous output file is removed. `profile_process=server` is not
/// supported (there is no kvstore server).
///
/// # Safety
/// `keys` and `vals` must each point to `num_params` C strings.
#[no_mangle]
pub unsafe extern "C" fn MXSetProcessProfilerConfig(
    num_params: c_int,
    keys: *const *const c_char,
    vals: *const *const c_char,
    _kvstore_handle: KVStoreHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXSetProcessProfilerConfig", || unsafe { set_config(num_params, keys, vals) })
}

/// [`MXSetProcessProfilerConfig`] for this process.
///
/// # Safety
/// As [`MXSetProcessProfilerConfig`].
#[no_mangle]
pub unsafe extern "C" fn MXSetProfilerConfig(
    num_params: c_int,
    keys: *const *const c_char,
    vals: *const *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXSetProfilerConfig", || unsafe { set_config(num_params, keys, vals) })
}

fn set_state(state: c_int, process: c_int) -> Result<()> {
    ProcessKind::from_code(process)?;
    match state {
        0 => profiler::set_state(false),
        1 => profiler::set_state(true),
        _ => Err(Error::value(format!("profiler state {state} is not valid (0 stop, 1 run)"))),
    }
}

/// Start (1) or stop (0) the profiler; `profile_process` 0 is this process (1, a kvstore
/// server, is not supported).
#[no_mangle]
pub extern "C" fn MXSetProcessProfilerState(
    state: c_int,
    profile_process: c_int,
    _kvstore_handle: KVStoreHandle,
) -> c_int {
    ffi::call("MXSetProcessProfilerState", || set_state(state, profile_process))
}

/// [`MXSetProcessProfilerState`] for this process.
#[no_mangle]
pub extern "C" fn MXSetProfilerState(state: c_int) -> c_int {
    ffi::call("MXSetProfilerState", || set_state(state, 0))
}

/// Write the trace file: always a complete JSON document (written to a temporary file and
/// renamed). `finished` ends it: the next dump needs the profiler to run again. An error if
/// the profiler has not run since it was configured.
#[no_mangle]
pub extern "C" fn MXDumpProcessProfile(
    finished: c_int,
    profile_process: c_int,
    _kvstore_handle: KVStoreHandle,
) -> c_int {
    ffi::call("MXDumpProcessProfile", || {
        ProcessKind::from_code(profile_process)?;
        profiler::dump(finished != 0)
    })
}

/// [`MXDumpProcessProfile`] for this process.
#[no_mangle]
pub extern "C" fn MXDumpProfile(finished: c_int) -> c_int {
    ffi::call("MXDumpProfile", || profiler::dump(finished != 0))
}

/// Pause (1) or resume (0) recording.
#[no_mangle]
pub extern "C" fn MXProcessProfilePause(
    paused: c_int,
    profile_process: c_int,
    _kvstore_handle: KVStoreHandle,
) -> c_int {
    ffi::call("MXProcessProfilePause", || {
        ProcessKind::from_code(profile_process)?;
        profiler::pause(paused != 0);
        Ok(())
    })
}

/// [`MXProcessProfilePause`] for this process.
#[no_mangle]
pub extern "C" fn MXProfilePause(paused: c_int) -> c_int {
    ffi::call("MXProfilePause", || {
        profiler::pause(paused != 0);
        Ok(())
    })
}

/// The aggregate statistics as text (`format` 0, stock's table) or JSON (`format` 1), each
/// category sorted by `sort_by` (0 total, 1 avg, 2 min, 3 max, 4 count), descending unless
/// `ascending`; `reset` clears them afterwards. "" when aggregate_stats is off. Pending events
/// are written to the trace file first. The string stays valid until the next call on this
/// thread that returns a string.
///
/// # Safety
/// `out_str` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXAggregateProfileStatsPrintEx(
    out_str: *mut *const c_char,
    reset: c_int,
    format: c_int,
    sort_by: c_int,
    ascending: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXAggregateProfileStatsPrintEx", out_str, "out_str", || {
            let json = match format {
                0 => false,
                1 => true,
                _ => return Err(Error::value(format!("format {format} is not valid (0 table, 1 json)"))),
            };
            let s = profiler::dumps(reset != 0, json, SortBy::from_code(sort_by)?, ascending != 0)?;
            ffi::return_str(&s)
        })
    }
}

/// The aggregate statistics as a table sorted by total time (deprecated stock form).
///
/// # Safety
/// As [`MXAggregateProfileStatsPrintEx`].
#[no_mangle]
pub unsafe extern "C" fn MXAggregateProfileStatsPrint(out_str: *mut *const c_char, reset: c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXAggregateProfileStatsPrint", out_str, "out_str", || {
            ffi::return_str(&profiler::dumps(reset != 0, false, SortBy::Total, false)?)
        })
    }
}

/// Tag the operations this thread pushes from now on with `scope` (shown in their events'
/// args); "" clears it. An mxnet-rt addition, as in later MXNet releases.
///
/// # Safety
/// `scope` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn MXSetProfilerScope(scope: *const c_char) -> c_int {
    ffi::call("MXSetProfilerScope", || {
        // SAFETY: per this function's contract.
        profiler::set_scope(unsafe { cstr(scope, "scope") }?);
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or valid for writes.
unsafe fn create(api: &'static str, out: *mut ProfileHandle, make: impl FnOnce() -> Result<Object>) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out(api, out, "out", || Ok(objects().insert(Arc::new(make()?)))) }
}

/// Create a domain (a process in the trace). Domains live until destroyed.
///
/// # Safety
/// `domain` must be a NUL-terminated string; `out` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXProfileCreateDomain(domain: *const c_char, out: *mut ProfileHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { create("MXProfileCreateDomain", out, || Object::domain(cstr(domain, "domain")?)) }
}

/// Create a task in `domain`.
///
/// # Safety
/// `task_name` must be a NUL-terminated string; `out` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXProfileCreateTask(
    domain: ProfileHandle,
    task_name: *const c_char,
    out: *mut ProfileHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        create("MXProfileCreateTask", out, || {
            let d = objects().get(domain)?;
            Object::task(&d, cstr(task_name, "task_name")?)
        })
    }
}

/// Create a frame in `domain`.
///
/// # Safety
/// `frame_name` must be a NUL-terminated string; `out` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXProfileCreateFrame(
    domain: ProfileHandle,
    frame_name: *const c_char,
    out: *mut ProfileHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        create("MXProfileCreateFrame", out, || {
            let d = objects().get(domain)?;
            Object::frame(&d, cstr(frame_name, "frame_name")?)
        })
    }
}

/// Create an event (category `event`, no domain).
///
/// # Safety
/// `event_name` must be a NUL-terminated string; `out` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXProfileCreateEvent(event_name: *const c_char, out: *mut ProfileHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { create("MXProfileCreateEvent", out, || Object::event(cstr(event_name, "event_name")?)) }
}

/// Create a counter in `domain` (value 0).
///
/// # Safety
/// `counter_name` must be a NUL-terminated string; `out` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXProfileCreateCounter(
    domain: ProfileHandle,
    counter_name: *const c_char,
    out: *mut ProfileHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        create("MXProfileCreateCounter", out, || {
            let d = objects().get(domain)?;
            Object::counter(&d, cstr(counter_name, "counter_name")?)
        })
    }
}

/// Destroy a profiling object; NULL, a freed or a foreign handle is a ValueError.
#[no_mangle]
pub extern "C" fn MXProfileDestroyHandle(frame_handle: ProfileHandle) -> c_int {
    ffi::call("MXProfileDestroyHandle", || objects().remove(frame_handle).map(drop))
}

/// Start a task, frame or event.
#[no_mangle]
pub extern "C" fn MXProfileDurationStart(duration_handle: ProfileHandle) -> c_int {
    ffi::call("MXProfileDurationStart", || objects().get(duration_handle)?.start())
}

/// Stop a task, frame or event: records its duration if the profiler runs.
#[no_mangle]
pub extern "C" fn MXProfileDurationStop(duration_handle: ProfileHandle) -> c_int {
    ffi::call("MXProfileDurationStop", || objects().get(duration_handle)?.stop())
}

/// Set a counter (values above the int64 range are a ValueError).
#[no_mangle]
pub extern "C" fn MXProfileSetCounter(counter_handle: ProfileHandle, value: u64) -> c_int {
    ffi::call("MXProfileSetCounter", || objects().get(counter_handle)?.set_counter(value))
}

/// Add `value` (negative to decrement) to a counter.
#[no_mangle]
pub extern "C" fn MXProfileAdjustCounter(counter_handle: ProfileHandle, value: i64) -> c_int {
    ffi::call("MXProfileAdjustCounter", || objects().get(counter_handle)?.adjust_counter(value).map(drop))
}

/// Record an instant marker in `domain`; `scope` is global, process, thread, task or marker.
///
/// # Safety
/// `instant_marker_name` and `scope` must be NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn MXProfileSetMarker(
    domain: ProfileHandle,
    instant_marker_name: *const c_char,
    scope: *const c_char,
) -> c_int {
    ffi::call("MXProfileSetMarker", || {
        let d = objects().get(domain)?;
        // SAFETY: per this function's contract.
        let (name, scope) = unsafe { (cstr(instant_marker_name, "instant_marker_name")?, cstr(scope, "scope")?) };
        objects::marker(&d, name, scope)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_through_handles() {
        let mut d: ProfileHandle = std::ptr::null_mut();
        // SAFETY: valid strings and out pointers.
        unsafe {
            assert_eq!(MXProfileCreateDomain(c"d".as_ptr(), &mut d), 0);
            let mut t: ProfileHandle = std::ptr::null_mut();
            assert_eq!(MXProfileCreateTask(d, c"t".as_ptr(), &mut t), 0);
            assert_eq!(MXProfileDurationStart(t), 0);
            assert_eq!(MXProfileDurationStop(t), 0);
            assert_eq!(MXProfileSetCounter(t, 1), -1, "a task is not a counter");
            assert_eq!(MXProfileDestroyHandle(t), 0);
            assert_eq!(MXProfileDestroyHandle(t), -1, "double free");
            assert_eq!(MXProfileDestroyHandle(std::ptr::null_mut()), -1);
            assert_eq!(MXProfileCreateTask(std::ptr::null_mut(), c"t".as_ptr(), &mut t), -1);
            assert_eq!(MXProfileSetMarker(d, c"m".as_ptr(), c"bogus".as_ptr()), -1);
            let mut s: *const c_char = std::ptr::null();
            assert_eq!(MXAggregateProfileStatsPrintEx(&mut s, 0, 2, 0, 0), -1, "bad format");
            assert_eq!(MXSetProfilerState(2), -1);
            assert_eq!(MXSetProcessProfilerState(1, 1, std::ptr::null_mut()), -1, "server");
        }
    }
}
