//! A safe Rust binding to `libmxnet.so` (MXNet 1.9.1's C ABI as mxnet-rt implements it).
//!
//! Owns: the declarations of the C functions it uses ([`sys`]), owned handles that free
//! themselves ([`NDArray`]), errors that carry the library's error class ([`Error`],
//! [`ErrorKind`]), imperative operator calls ([`invoke`]), waiting ([`wait_all`]) and the
//! profiler ([`profiler`]). Users write no `unsafe`.
//!
//! ```no_run
//! let a = mxnet::NDArray::from_slice(&[2, 2], &[1.0, 2.0, 3.0, 4.0])?;
//! let b = mxnet::invoke("_plus_scalar", &[&a], &[("scalar", "10")])?.remove(0);
//! assert_eq!(b.to_vec()?, [11.0, 12.0, 13.0, 14.0]);
//! # Ok::<(), mxnet::Error>(())
//! ```

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::ptr::NonNull;

/// The C functions this binding calls, as `<mxnet/c_api.h>` declares them.
pub mod sys {
    use std::ffi::{c_char, c_int, c_void};

    pub type NDArrayHandle = *mut c_void;
    pub type OpHandle = *mut c_void;

    extern "C" {
        pub fn MXGetLastError() -> *const c_char;
        pub fn MXGetVersion(out: *mut c_int) -> c_int;
        pub fn MXNDArrayCreateEx(
            shape: *const u32,
            ndim: u32,
            dev_type: c_int,
            dev_id: c_int,
            delay_alloc: c_int,
            dtype: c_int,
            out: *mut NDArrayHandle,
        ) -> c_int;
        pub fn MXNDArrayFree(handle: NDArrayHandle) -> c_int;
        pub fn MXNDArraySyncCopyFromCPU(handle: NDArrayHandle, data: *const c_void, size: usize) -> c_int;
        pub fn MXNDArraySyncCopyToCPU(handle: NDArrayHandle, data: *mut c_void, size: usize) -> c_int;
        pub fn MXNDArrayGetShapeEx(handle: NDArrayHandle, out_dim: *mut c_int, out_pdata: *mut *const c_int) -> c_int;
        pub fn MXNDArrayGetDType(handle: NDArrayHandle, out_dtype: *mut c_int) -> c_int;
        pub fn MXNDArrayWaitToRead(handle: NDArrayHandle) -> c_int;
        pub fn MXNDArrayWaitAll() -> c_int;
        pub fn NNGetOpHandle(op_name: *const c_char, op_out: *mut OpHandle) -> c_int;
        pub fn MXImperativeInvoke(
            creator: OpHandle,
            num_inputs: c_int,
            inputs: *mut NDArrayHandle,
            num_outputs: *mut c_int,
            outputs: *mut *mut NDArrayHandle,
            num_params: c_int,
            param_keys: *mut *const c_char,
            param_vals: *mut *const c_char,
        ) -> c_int;
        pub fn MXSetProcessProfilerConfig(
            num_params: c_int,
            keys: *const *const c_char,
            vals: *const *const c_char,
            kvstore: *mut c_void,
        ) -> c_int;
        pub fn MXSetProcessProfilerState(state: c_int, profile_process: c_int, kvstore: *mut c_void) -> c_int;
        pub fn MXDumpProcessProfile(finished: c_int, profile_process: c_int, kvstore: *mut c_void) -> c_int;
        pub fn MXAggregateProfileStatsPrintEx(
            out_str: *mut *const c_char,
            reset: c_int,
            format: c_int,
            sort_by: c_int,
            ascending: c_int,
        ) -> c_int;
    }
}

/// The class of a library error: the first word of `MXGetLastError`'s first line, which the
/// Python frontend maps to its exception classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Value,
    Type,
    Index,
    NotImplemented,
    Attribute,
    Internal,
    /// `MXNetError`, the library's class for everything else.
    MXNet,
    /// A class this binding does not know, as the library wrote it.
    Other(String),
}

/// A failed call: the error class and the library's full message (or this binding's, for
/// arguments it refuses before calling).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    /// The calling thread's last library error.
    fn last() -> Error {
        // SAFETY: MXGetLastError returns a NUL-terminated string valid until the thread's next
        // failing call; it is copied at once.
        let text = unsafe { CStr::from_ptr(sys::MXGetLastError()) }.to_string_lossy().into_owned();
        let class = text.split(':').next().unwrap_or("").trim();
        let kind = match class {
            "ValueError" => ErrorKind::Value,
            "TypeError" => ErrorKind::Type,
            "IndexError" => ErrorKind::Index,
            "NotImplementedError" => ErrorKind::NotImplemented,
            "AttributeError" => ErrorKind::Attribute,
            "InternalError" => ErrorKind::Internal,
            "MXNetError" => ErrorKind::MXNet,
            other => ErrorKind::Other(other.to_string()),
        };
        Error { kind, message: text }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// A C call's return code: 0, or the thread's last error.
fn check(rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::last())
    }
}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(ErrorKind::Value, format!("ValueError: {s:?} holds a NUL byte")))
}

/// The MXNet version the library implements (10901 for 1.9.1).
pub fn version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-param.
    check(unsafe { sys::MXGetVersion(&mut v) })?;
    Ok(v)
}

/// Wait for every pending operation.
pub fn wait_all() -> Result<()> {
    // SAFETY: no arguments.
    check(unsafe { sys::MXNDArrayWaitAll() })
}

/// A float32 array on the CPU, freed when dropped.
pub struct NDArray {
    handle: NonNull<c_void>,
}

// SAFETY: the library's handles may be used and freed from any thread (its handle table
// locks each lookup; operations are ordered by its engine).
unsafe impl Send for NDArray {}
// SAFETY: as for Send; every method takes `&self` and the library synchronises.
unsafe impl Sync for NDArray {}

impl Drop for NDArray {
    fn drop(&mut self) {
        // SAFETY: the handle is this value's own and freed once, here. A failure (none is
        // expected for a live handle) cannot be reported from a drop.
        let _ = unsafe { sys::MXNDArrayFree(self.handle.as_ptr()) };
    }
}

impl fmt::Debug for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NDArray").field("shape", &self.shape()).finish()
    }
}

impl NDArray {
    /// A handle the library returned, which this value now owns.
    fn own(h: sys::NDArrayHandle) -> Result<NDArray> {
        NonNull::new(h)
            .map(|handle| NDArray { handle })
            .ok_or_else(|| Error::new(ErrorKind::Internal, "InternalError: the library returned a NULL array"))
    }

    /// A float32 array of `shape` on the CPU, its memory allocated at first use.
    pub fn empty(shape: &[usize]) -> Result<NDArray> {
        let dims = shape
            .iter()
            .map(|&d| {
                u32::try_from(d)
                    .map_err(|_| Error::new(ErrorKind::Value, format!("ValueError: dimension {d} is too large")))
            })
            .collect::<Result<Vec<u32>>>()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: `dims` holds `ndim` values; `h` is a valid out-param.
        check(unsafe { sys::MXNDArrayCreateEx(dims.as_ptr(), dims.len() as u32, 1, 0, 1, 0, &mut h) })?;
        NDArray::own(h)
    }

    /// A float32 array of `shape` holding `values` (row-major).
    pub fn from_slice(shape: &[usize], values: &[f32]) -> Result<NDArray> {
        let a = NDArray::empty(shape)?;
        a.copy_from(values)?;
        Ok(a)
    }

    /// Overwrite the array with `values` (as many as it has elements), after its pending work.
    pub fn copy_from(&self, values: &[f32]) -> Result<()> {
        self.check_f32()?;
        // SAFETY: `values` holds `values.len()` floats; the library checks the count against
        // the array's size before reading.
        check(unsafe { sys::MXNDArraySyncCopyFromCPU(self.handle.as_ptr(), values.as_ptr().cast(), values.len()) })
    }

    /// The array's shape.
    pub fn shape(&self) -> Result<Vec<usize>> {
        let (mut ndim, mut dims) = (0, std::ptr::null());
        // SAFETY: valid out-params; the library's shape buffer is read at once.
        check(unsafe { sys::MXNDArrayGetShapeEx(self.handle.as_ptr(), &mut ndim, &mut dims) })?;
        if ndim <= 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the library points `dims` at `ndim` values, valid until this thread's next
        // call that returns a shape.
        let s = unsafe { std::slice::from_raw_parts(dims, ndim as usize) };
        Ok(s.iter().map(|&d| d.max(0) as usize).collect())
    }

    fn check_f32(&self) -> Result<()> {
        let mut dt = -1;
        // SAFETY: a valid out-param.
        check(unsafe { sys::MXNDArrayGetDType(self.handle.as_ptr(), &mut dt) })?;
        if dt != 0 {
            return Err(Error::new(
                ErrorKind::Type,
                format!("TypeError: the array's dtype code is {dt}, not float32 (0)"),
            ));
        }
        Ok(())
    }

    /// The values (waiting for the array's pending writes).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        self.check_f32()?;
        let n: usize = self.shape()?.iter().product();
        let mut v = vec![0f32; n];
        // SAFETY: `v` has room for the array's `n` elements.
        check(unsafe { sys::MXNDArraySyncCopyToCPU(self.handle.as_ptr(), v.as_mut_ptr().cast(), n) })?;
        Ok(v)
    }

    /// Wait until the array's pending writes are done (errors of the work that wrote it arrive
    /// here).
    pub fn wait_to_read(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::MXNDArrayWaitToRead(self.handle.as_ptr()) })
    }
}

/// Call operator `op` (a stock operator name, e.g. `"dot"`, `"Activation"`) on `inputs` with
/// its parameters as strings; returns its new outputs. The call is queued on the library's
/// engine: reading an output waits for it.
pub fn invoke(op: &str, inputs: &[&NDArray], params: &[(&str, &str)]) -> Result<Vec<NDArray>> {
    let name = c_string(op)?;
    let mut creator = std::ptr::null_mut();
    // SAFETY: `name` is NUL-terminated; `creator` a valid out-param.
    check(unsafe { sys::NNGetOpHandle(name.as_ptr(), &mut creator) })?;
    let mut ins: Vec<sys::NDArrayHandle> = inputs.iter().map(|a| a.handle.as_ptr()).collect();
    let keys = params.iter().map(|(k, _)| c_string(k)).collect::<Result<Vec<_>>>()?;
    let vals = params.iter().map(|(_, v)| c_string(v)).collect::<Result<Vec<_>>>()?;
    let mut kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
    let mut vp: Vec<*const c_char> = vals.iter().map(|v| v.as_ptr()).collect();
    let (mut n_out, mut outs) = (0, std::ptr::null_mut());
    // SAFETY: the arrays hold the counts passed; the strings outlive the call; with
    // `*outputs` NULL the library allocates the outputs and returns new handles in a
    // per-thread buffer, read at once below.
    check(unsafe {
        sys::MXImperativeInvoke(
            creator,
            ins.len() as c_int,
            ins.as_mut_ptr(),
            &mut n_out,
            &mut outs,
            kp.len() as c_int,
            kp.as_mut_ptr(),
            vp.as_mut_ptr(),
        )
    })?;
    // SAFETY: the library wrote `n_out` new handles at `outs`, each now this binding's to free.
    let handles = unsafe { std::slice::from_raw_parts(outs, n_out.max(0) as usize) }.to_vec();
    handles.into_iter().map(NDArray::own).collect()
}

/// The process-wide profiler (`MXSetProcessProfilerConfig` and friends).
pub mod profiler {
    use super::{check, sys, Result};
    use std::ffi::{c_char, CStr, CString};

    /// Set profiler options, e.g. `[("filename", "trace.json"), ("profile_all", "true")]`.
    pub fn set_config(options: &[(&str, &str)]) -> Result<()> {
        let keys = options.iter().map(|(k, _)| super::c_string(k)).collect::<Result<Vec<CString>>>()?;
        let vals = options.iter().map(|(_, v)| super::c_string(v)).collect::<Result<Vec<CString>>>()?;
        let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let vp: Vec<*const c_char> = vals.iter().map(|v| v.as_ptr()).collect();
        // SAFETY: both arrays hold `options.len()` NUL-terminated strings that outlive the call.
        check(unsafe {
            sys::MXSetProcessProfilerConfig(options.len() as i32, kp.as_ptr(), vp.as_ptr(), std::ptr::null_mut())
        })
    }

    /// Start (`true`) or stop profiling.
    pub fn set_running(running: bool) -> Result<()> {
        // SAFETY: plain values.
        check(unsafe { sys::MXSetProcessProfilerState(running as i32, 0, std::ptr::null_mut()) })
    }

    /// Write the trace to the configured file (`finished`: the profile is complete).
    pub fn dump(finished: bool) -> Result<()> {
        // SAFETY: plain values.
        check(unsafe { sys::MXDumpProcessProfile(finished as i32, 0, std::ptr::null_mut()) })
    }

    /// The aggregate statistics table (`profile_all` or `aggregate_stats` must be on).
    pub fn summary() -> Result<String> {
        let mut s = std::ptr::null();
        // SAFETY: a valid out-param; the string is copied at once.
        check(unsafe { sys::MXAggregateProfileStatsPrintEx(&mut s, 0, 0, 0, 0) })?;
        // SAFETY: the library returned a NUL-terminated string valid until this thread's next
        // call returning one.
        Ok(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_operators_and_errors() {
        assert_eq!(version().unwrap(), 10901);
        let a = NDArray::from_slice(&[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
        assert_eq!(a.shape().unwrap(), [2, 3]);
        let b = invoke("_mul_scalar", &[&a], &[("scalar", "2")]).unwrap().remove(0);
        let c = invoke("elemwise_add", &[&a, &b], &[]).unwrap().remove(0);
        assert_eq!(c.to_vec().unwrap(), [3., 6., 9., 12., 15., 18.]);
        let t = invoke("transpose", &[&a], &[]).unwrap().remove(0);
        let d = invoke("dot", &[&a, &t], &[]).unwrap().remove(0);
        assert_eq!(d.to_vec().unwrap(), [14., 32., 32., 77.]);
        wait_all().unwrap();
        // Errors carry the library's class.
        let e = invoke("no_such_op", &[&a], &[]).unwrap_err();
        assert!(e.message.contains("no_such_op"), "{e}");
        let e = invoke("dot", &[&a, &a], &[]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::MXNet, "{e}");
        let e = a.copy_from(&[1.0]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Value, "{e}");
        let e = invoke("Activation", &[&a], &[("act_type", "nope")]).unwrap_err();
        assert!(e.message.contains("act_type"), "{e}");
        assert_eq!(c_string("a\0b").unwrap_err().kind, ErrorKind::Value);
    }

    #[test]
    fn arrays_move_between_threads() {
        let a = NDArray::from_slice(&[3], &[1., 2., 3.]).unwrap();
        let b = std::thread::spawn(move || invoke("_plus_scalar", &[&a], &[("scalar", "1")]).unwrap().remove(0))
            .join()
            .unwrap();
        assert_eq!(b.to_vec().unwrap(), [2., 3., 4.]);
    }
}
