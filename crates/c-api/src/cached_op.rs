//! C API: CachedOp (MXCreateCachedOp[Ex], MXInvokeCachedOp[Ex], MXFreeCachedOp), the graphs of
//! hybridized Gluon blocks. Invocation results use a per-thread array valid until the next
//! invocation on the same thread, as `MXImperativeInvokeEx`'s do.

use super::ffi::{self, cstr, out};
use super::ndarray::arrays;
use super::types::{CachedOpHandle, CachedOpMonitorCallback, NDArrayHandle, SymbolHandle};
use crate::handle::HandleTable;
use mxnet_core::error::{Error, Result};
use mxnet_core::executor::cached_op::CachedOp;
use mxnet_core::ndarray::NDArray;
use mxnet_core::op;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::sync::{Arc, OnceLock};

fn cached_ops() -> &'static HandleTable<CachedOp> {
    static T: OnceLock<HandleTable<CachedOp>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(11, "CachedOp"))
}

thread_local! {
    static OUT: RefCell<Box<(Vec<NDArrayHandle>, Vec<c_int>)>> = RefCell::new(Box::default());
}

/// # Safety
/// `keys`/`vals` must hold `num_flags` strings.
unsafe fn create(
    handle: SymbolHandle,
    num_flags: c_int,
    keys: *const *const c_char,
    vals: *const *const c_char,
) -> Result<CachedOpHandle> {
    let sym = super::symbol::symbol(handle)?;
    if num_flags < 0 {
        return Err(Error::value(format!("num_flags is negative ({num_flags})")));
    }
    if num_flags > 0 && (keys.is_null() || vals.is_null()) {
        return Err(Error::value("keys or vals is NULL"));
    }
    let mut kv = Vec::with_capacity(num_flags as usize);
    for i in 0..num_flags as usize {
        // SAFETY: per this function's contract.
        unsafe { kv.push((cstr(*keys.add(i), "flag key")?, cstr(*vals.add(i), "flag value")?)) };
    }
    Ok(cached_ops().insert(Arc::new(CachedOp::new(&sym, kv)?)))
}

/// A CachedOp over a symbol's graph with flags (`str()` of Python values; an unknown flag is
/// an error).
///
/// # Safety
/// `keys`/`vals` must hold `num_flags` strings; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXCreateCachedOpEx(
    handle: SymbolHandle,
    num_flags: c_int,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
    out: *mut CachedOpHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXCreateCachedOpEx", out, "out", || create(handle, num_flags, keys, vals)) }
}

/// [`MXCreateCachedOpEx`] without flags.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXCreateCachedOp(handle: SymbolHandle, out: *mut CachedOpHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXCreateCachedOp", out, "out", || create(handle, 0, std::ptr::null(), std::ptr::null())) }
}

/// [`MXCreateCachedOpEx`]; `thread_safe` (stock's separate thread-safe CachedOp for
/// multi-threaded inference) changes nothing here: every CachedOp may be called from several
/// threads at once.
///
/// # Safety
/// As for [`MXCreateCachedOpEx`].
#[no_mangle]
pub unsafe extern "C" fn MXCreateCachedOpEX(
    handle: SymbolHandle,
    num_flags: c_int,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
    out: *mut CachedOpHandle,
    thread_safe: bool,
) -> c_int {
    let _ = thread_safe;
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXCreateCachedOpEX", out, "out", || create(handle, num_flags, keys, vals)) }
}

/// A frontend's operator hook.
struct Hook(unsafe extern "C" fn(*const c_char, *const c_char, NDArrayHandle));

// SAFETY: stock's contract for `MXCachedOpRegisterOpHook`: the hook may be called on whichever
// thread runs the CachedOp (ctypes callbacks take the GIL), and stays valid while the CachedOp
// lives (a run already going when it is replaced finishes with the one it started with).
unsafe impl Send for Hook {}
unsafe impl Sync for Hook {}

impl Hook {
    fn call(&self, name: &CString, op: &CString, array: NDArrayHandle) {
        // SAFETY: the hook's contract (see `Hook`); the handle is new and the callee's to free.
        unsafe { (self.0)(name.as_ptr(), op.as_ptr(), array) };
    }
}

/// Call `callback` after each operator of later runs with each output (`<node>_output`), the
/// operator's name and a new handle the callee frees (with `monitor_all`, each input first);
/// NULL removes the hook (Gluon's `HybridBlock.register_op_hook`).
#[no_mangle]
pub extern "C" fn MXCachedOpRegisterOpHook(
    handle: CachedOpHandle,
    callback: CachedOpMonitorCallback,
    monitor_all: bool,
) -> c_int {
    ffi::call("MXCachedOpRegisterOpHook", || {
        let op = cached_ops().get(handle)?;
        let Some(f) = callback else {
            op.set_monitor(None);
            return Ok(());
        };
        let hook = Hook(f);
        let callback = move |name: &str, opr: &str, a: &NDArray| {
            // Graph and operator names hold no NUL; one that did is not reported.
            let (Ok(name), Ok(opr)) = (CString::new(name), CString::new(opr)) else { return };
            hook.call(&name, &opr, arrays().insert(Arc::new(a.detached())));
        };
        let monitor =
            mxnet_core::executor::Monitor { all: monitor_all, variables: false, callback: Arc::new(callback) };
        op.set_monitor(Some(monitor));
        Ok(())
    })
}

/// Free a CachedOp (a second free is an error).
#[no_mangle]
pub extern "C" fn MXFreeCachedOp(handle: CachedOpHandle) -> c_int {
    ffi::call("MXFreeCachedOp", || cached_ops().remove(handle).map(drop))
}

/// # Safety
/// As for [`MXInvokeCachedOpEx`].
unsafe fn invoke_c(
    handle: CachedOpHandle,
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: *mut c_int,
    outputs: *mut *mut NDArrayHandle,
    out_stypes: *mut *const c_int,
) -> Result<()> {
    let cop = cached_ops().get(handle)?;
    // SAFETY: per the contract.
    let (n_out, outs_ptr) = unsafe { (out(num_outputs, "num_outputs")?, out(outputs, "outputs")?) };
    if num_inputs < 0 || (num_inputs > 0 && inputs.is_null()) {
        return Err(Error::value(format!("inputs: bad count {num_inputs} or NULL array")));
    }
    // SAFETY: per the contract, `inputs` holds `num_inputs` handles.
    let hs = if num_inputs == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(inputs, num_inputs as usize) } };
    let ins: Vec<NDArray> = hs.iter().map(|&h| arrays().get(h).map(|a| (*a).clone())).collect::<Result<_>>()?;
    let produced = cop.invoke(&ins)?;
    OUT.with(|slot| -> Result<()> {
        let mut slot = slot.borrow_mut();
        let (hs, st) = &mut **slot;
        if !outs_ptr.is_null() && *n_out > 0 {
            // The caller's arrays: copy the results in.
            // SAFETY: per the contract, `*outputs` holds `*num_outputs` handles.
            let given = unsafe { std::slice::from_raw_parts(*outs_ptr, *n_out as usize) };
            if given.len() != produced.len() {
                return Err(Error::value(format!(
                    "the CachedOp has {} outputs, {} given",
                    produced.len(),
                    given.len()
                )));
            }
            for (&h, p) in given.iter().zip(&produced) {
                let o = arrays().get(h)?;
                mxnet_core::autograd::invoke(op::lookup("_copy")?, &[p], Some(&[&o]), std::iter::empty())?;
            }
        } else {
            hs.clear();
            hs.extend(produced.into_iter().map(|a| arrays().insert(Arc::new(a))));
            *outs_ptr = hs.as_mut_ptr();
            *n_out = hs.len() as c_int;
        }
        st.clear();
        st.resize((*n_out).max(0) as usize, 0);
        if !out_stypes.is_null() {
            // SAFETY: per the contract.
            unsafe { *out_stypes = st.as_ptr() };
        }
        Ok(())
    })
}

/// Run a CachedOp on `inputs` (in the symbol's `list_inputs` order). Outputs as for
/// `MXImperativeInvokeEx`: new arrays in a per-thread array when `*outputs` is NULL, else
/// written into the caller's arrays. Recorded by autograd like the operators it runs.
///
/// # Safety
/// `inputs` must hold `num_inputs` handles; the out-params must be valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn MXInvokeCachedOpEx(
    handle: CachedOpHandle,
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: *mut c_int,
    outputs: *mut *mut NDArrayHandle,
    out_stypes: *mut *const c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXInvokeCachedOpEx", || unsafe {
        invoke_c(handle, num_inputs, inputs, num_outputs, outputs, out_stypes)
    })
}

/// [`MXInvokeCachedOpEx`] without storage types.
///
/// # Safety
/// As for [`MXInvokeCachedOpEx`].
#[no_mangle]
pub unsafe extern "C" fn MXInvokeCachedOp(
    handle: CachedOpHandle,
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: *mut c_int,
    outputs: *mut *mut NDArrayHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXInvokeCachedOp", || unsafe {
        invoke_c(handle, num_inputs, inputs, num_outputs, outputs, std::ptr::null_mut())
    })
}
