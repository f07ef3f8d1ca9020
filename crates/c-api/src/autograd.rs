//! C API: autograd (recording and training flags, marking variables, backward, gradients,
//! detach) and the recorded views of `MXNDArraySlice` / `At` / `Reshape64` (see
//! `ndarray.rs`). Backward's returned gradient handles use a per-thread array valid until the
//! next backward on the same thread. Also `autograd.Function`'s backward: the frontend's
//! callbacks behind the domain's `CustomBackward` trait.

use super::ffi::{self, out};
use super::ndarray::arrays;
use super::types::{MXCallbackList, NDArrayHandle, SymbolHandle};
use mxnet_core::autograd::{self, BackwardArgs, GradReq};
use mxnet_core::error::{Error, Result};
use mxnet_core::ndarray::NDArray;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

thread_local! {
    static GRADS_OUT: RefCell<Box<(Vec<NDArrayHandle>, Vec<c_int>)>> = RefCell::new(Box::default());
}

/// Set this thread's recording flag; `*prev` receives the previous value.
///
/// # Safety
/// `prev` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradSetIsRecording(is_recording: c_int, prev: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXAutogradSetIsRecording", prev, "prev", || {
            Ok(autograd::set_recording(is_recording != 0) as c_int)
        })
    }
}

/// Set this thread's training flag; `*prev` receives the previous value.
///
/// # Safety
/// `prev` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradSetIsTraining(is_training: c_int, prev: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXAutogradSetIsTraining", prev, "prev", || Ok(autograd::set_training(is_training != 0) as c_int))
    }
}

/// Whether this thread is recording (a 1-byte C bool).
///
/// # Safety
/// `curr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradIsRecording(curr: *mut bool) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXAutogradIsRecording", curr, "curr", || Ok(autograd::is_recording())) }
}

/// Whether this thread is in training mode (a 1-byte C bool).
///
/// # Safety
/// `curr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradIsTraining(curr: *mut bool) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXAutogradIsTraining", curr, "curr", || Ok(autograd::is_training())) }
}

/// # Safety
/// `p` must point to `n` handles when `n > 0`.
unsafe fn handle_list<'a>(p: *const NDArrayHandle, n: u32, what: &str) -> Result<&'a [NDArrayHandle]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

/// Mark arrays as variables whose gradients backward computes: `reqs_array` holds 0 (null),
/// 1 (write), 2 (in-place, as write) or 3 (add); `grad_handles` the arrays that receive them.
///
/// # Safety
/// Each array must hold `num_var` entries.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradMarkVariables(
    num_var: u32,
    var_handles: *mut NDArrayHandle,
    reqs_array: *mut u32,
    grad_handles: *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXAutogradMarkVariables", || {
        // SAFETY: per this function's contract.
        let (vars, grads) = unsafe {
            (handle_list(var_handles, num_var, "var_handles")?, handle_list(grad_handles, num_var, "grad_handles")?)
        };
        if num_var > 0 && reqs_array.is_null() {
            return Err(Error::value("reqs_array is NULL"));
        }
        // Validate everything before changing anything.
        let mut marked = Vec::with_capacity(vars.len());
        for i in 0..vars.len() {
            // SAFETY: per this function's contract.
            let req = GradReq::from_code(unsafe { *reqs_array.add(i) })?;
            let x = arrays().get(vars[i])?;
            let g = if grads[i].is_null() { None } else { Some((*arrays().get(grads[i])?).clone()) };
            marked.push(autograd::mark_variable(&x, req, g)?);
        }
        for (h, m) in vars.iter().zip(marked) {
            arrays().replace(*h, Arc::new(m))?;
        }
        Ok(())
    })
}

/// # Safety
/// As for [`MXAutogradBackwardEx`].
#[allow(clippy::too_many_arguments)]
unsafe fn backward_c(
    num_output: u32,
    output_handles: *mut NDArrayHandle,
    ograd_handles: *mut NDArrayHandle,
    num_variables: u32,
    var_handles: *mut NDArrayHandle,
    retain_graph: c_int,
    create_graph: c_int,
    is_train: c_int,
    grad_handles: *mut *mut NDArrayHandle,
    grad_stypes: *mut *mut c_int,
) -> Result<()> {
    // SAFETY: per the contract.
    let heads = unsafe { handle_list(output_handles, num_output, "output_handles")? };
    let heads: Vec<NDArray> = heads.iter().map(|&h| arrays().get(h).map(|a| (*a).clone())).collect::<Result<_>>()?;
    let head_grads: Vec<Option<NDArray>> = if ograd_handles.is_null() {
        vec![None; heads.len()]
    } else {
        // SAFETY: per the contract, one entry (possibly NULL) per head.
        let hs = unsafe { std::slice::from_raw_parts(ograd_handles, heads.len()) };
        hs.iter()
            .map(|&h| if h.is_null() { Ok(None) } else { arrays().get(h).map(|a| Some((*a).clone())) })
            .collect::<Result<_>>()?
    };
    // SAFETY: per the contract.
    let vars = unsafe { handle_list(var_handles, num_variables, "var_handles")? };
    let variables: Vec<NDArray> = vars.iter().map(|&h| arrays().get(h).map(|a| (*a).clone())).collect::<Result<_>>()?;
    let grads = autograd::backward(BackwardArgs {
        heads: &heads,
        head_grads: &head_grads,
        variables: &variables,
        retain_graph: retain_graph != 0,
        create_graph: create_graph != 0,
        is_train: is_train != 0,
        larger_head_grads: true,
    })?;
    if variables.is_empty() {
        return Ok(());
    }
    GRADS_OUT.with(|slot| -> Result<()> {
        let mut slot = slot.borrow_mut();
        let (hs, st) = &mut **slot;
        hs.clear();
        hs.extend(grads.into_iter().map(|g| arrays().insert(Arc::new(g))));
        st.clear();
        st.resize(hs.len(), 0);
        // SAFETY: per the contract, both are NULL or valid for writes.
        unsafe {
            *out(grad_handles, "grad_handles")? = hs.as_mut_ptr();
            if !grad_stypes.is_null() {
                *grad_stypes = st.as_mut_ptr();
            }
        }
        Ok(())
    })
}

/// Compute gradients of `output_handles` (heads) with head gradients `ograd_handles` (NULL,
/// or entries NULL for ones). With `num_variables == 0` the gradients go into the marked
/// variables' arrays per their request; otherwise the gradients of `var_handles` are returned
/// as new handles in `*grad_handles` (storage types in `*grad_stypes`, all dense). Without
/// `retain_graph` the graph is released, and a second backward through it is an error.
/// With `create_graph` the backward pass is recorded, so the gradients can be differentiated
/// again (higher-order gradients, for the operators whose backward has a gradient).
///
/// # Safety
/// Arrays must hold the counts given; out-params valid for writes when variables are given.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradBackwardEx(
    num_output: u32,
    output_handles: *mut NDArrayHandle,
    ograd_handles: *mut NDArrayHandle,
    num_variables: u32,
    var_handles: *mut NDArrayHandle,
    retain_graph: c_int,
    create_graph: c_int,
    is_train: c_int,
    grad_handles: *mut *mut NDArrayHandle,
    grad_stypes: *mut *mut c_int,
) -> c_int {
    ffi::call("MXAutogradBackwardEx", || {
        // SAFETY: per this function's contract.
        unsafe {
            backward_c(
                num_output,
                output_handles,
                ograd_handles,
                num_variables,
                var_handles,
                retain_graph,
                create_graph,
                is_train,
                grad_handles,
                grad_stypes,
            )
        }
    })
}

/// [`MXAutogradBackwardEx`] into the marked variables, in training mode.
///
/// # Safety
/// As for [`MXAutogradBackwardEx`].
#[no_mangle]
pub unsafe extern "C" fn MXAutogradBackward(
    num_output: u32,
    output_handles: *mut NDArrayHandle,
    ograd_handles: *mut NDArrayHandle,
    retain_graph: c_int,
) -> c_int {
    ffi::call("MXAutogradBackward", || {
        // SAFETY: per this function's contract.
        unsafe {
            backward_c(
                num_output,
                output_handles,
                ograd_handles,
                0,
                std::ptr::null_mut(),
                retain_graph,
                0,
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    })
}

/// [`MXAutogradBackward`] with head gradients of ones, releasing the graph.
///
/// # Safety
/// As for [`MXAutogradBackwardEx`].
#[no_mangle]
pub unsafe extern "C" fn MXAutogradComputeGradient(num_output: u32, output_handles: *mut NDArrayHandle) -> c_int {
    ffi::call("MXAutogradComputeGradient", || {
        // SAFETY: per this function's contract.
        unsafe {
            backward_c(
                num_output,
                output_handles,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                0,
                0,
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    })
}

/// The recorded history of an array as a Symbol.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXAutogradGetSymbol(handle: NDArrayHandle, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXAutogradGetSymbol", out, "out", || {
            let history = autograd::history(&*arrays().get(handle)?)?;
            Ok(super::symbol::new_handle(mxnet_core::symbol::Symbol::from_history(&history)))
        })
    }
}

/// A new handle to the gradient array of a marked variable; `*out` is NULL when the array
/// has none.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetGrad(handle: NDArrayHandle, out: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayGetGrad", out, "out", || {
            Ok(match autograd::grad_of(&*arrays().get(handle)?) {
                Some(g) => arrays().insert(Arc::new(g)),
                None => std::ptr::null_mut(),
            })
        })
    }
}

/// A new handle sharing the array's data, outside any autograd graph.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayDetach(handle: NDArrayHandle, out: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXNDArrayDetach", out, "out", || {
            let x = arrays().get(handle)?;
            Ok(arrays().insert(Arc::new(x.detached())))
        })
    }
}

/// Record an `autograd.Function` call: `outputs` (computed by the frontend with recording
/// paused) become outputs of a graph node over `inputs` whose backward is the frontend's
/// callback (`callbacks`: backward, then delete, with their states). Only while recording.
///
/// # Safety
/// `inputs`/`outputs` must hold the counts given; `callbacks` must be a valid callback list
/// that stays valid until its delete callback runs.
#[no_mangle]
pub unsafe extern "C" fn MXCustomFunctionRecord(
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: c_int,
    outputs: *mut NDArrayHandle,
    callbacks: *mut super::types::MXCallbackList,
) -> c_int {
    ffi::call("MXCustomFunctionRecord", || {
        if !autograd::is_recording() {
            return Err(Error::mxnet(
                "autograd.Function can only be called while recording (inside autograd.record())",
            ));
        }
        if num_inputs < 0 || num_outputs < 0 {
            return Err(Error::value("negative input or output count"));
        }
        // SAFETY: per this function's contract.
        let (ins, outs) = unsafe {
            (handle_list(inputs, num_inputs as u32, "inputs")?, handle_list(outputs, num_outputs as u32, "outputs")?)
        };
        let in_arrays: Vec<Arc<NDArray>> = ins.iter().map(|&h| arrays().get(h)).collect::<Result<_>>()?;
        let in_refs: Vec<&NDArray> = in_arrays.iter().map(|a| &**a).collect();
        let out_arrays: Vec<NDArray> =
            outs.iter().map(|&h| arrays().get(h).map(|a| (*a).clone())).collect::<Result<_>>()?;
        autograd::check_writable(&out_arrays.iter().collect::<Vec<_>>())?;
        // SAFETY: per this function's contract.
        let f = unsafe { Function::from_callbacks(callbacks, &in_refs)? };
        let op = mxnet_core::op::lookup("_CustomFunction")?;
        let attrs = mxnet_core::op::param::Attrs::parse(op.name, &[], std::iter::empty())?;
        let n = out_arrays.len();
        let recorded = autograd::record_with(op, &attrs, &in_refs, out_arrays, n, Some(Arc::new(f)))?;
        for (&h, a) in outs.iter().zip(recorded) {
            arrays().replace(h, Arc::new(a))?;
        }
        Ok(())
    })
}

/// Stock's `CustomFunctionBwdFunc`: (num_ograds, num_igrads, handles, reqs, is_train, state).
type BwdFn = unsafe extern "C" fn(c_int, c_int, *mut *mut c_void, *const c_int, c_int, *mut c_void) -> c_int;
/// Stock's `CustomFunctionDelFunc`: (state).
type DelFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// An `autograd.Function` call: the frontend's backward and delete callbacks with their
/// states, and the shapes of the inputs whose gradients the backward writes.
pub struct Function {
    bwd: (BwdFn, *mut c_void),
    del: Option<(DelFn, *mut c_void)>,
    inputs: Vec<NDArray>,
}

// SAFETY: the callbacks are ctypes thunks that take the GIL themselves; their states are
// opaque pointers the frontend keeps alive until the delete callback runs.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// # Safety
    /// `list` must be NULL or a valid callback list whose first callback has stock's
    /// backward signature and second (if any) the delete signature.
    pub unsafe fn from_callbacks(list: *const MXCallbackList, inputs: &[&NDArray]) -> Result<Function> {
        // SAFETY: per this function's contract.
        let l = unsafe { list.as_ref() }.ok_or_else(|| Error::value("callbacks must not be NULL"))?;
        if l.num_callbacks < 1 || l.callbacks.is_null() {
            return Err(Error::value("autograd.Function needs a backward callback"));
        }
        // SAFETY: `num_callbacks` entries are readable (contract); contexts may be NULL.
        let (cb, ctx) = unsafe {
            let get = |i: usize| {
                (*l.callbacks.add(i), if l.contexts.is_null() { std::ptr::null_mut() } else { *l.contexts.add(i) })
            };
            (get(0), if l.num_callbacks > 1 { Some(get(1)) } else { None })
        };
        let bwd = cb.0.ok_or_else(|| Error::value("the backward callback is NULL"))?;
        // SAFETY: stock's callback signatures (contract).
        let bwd = unsafe { std::mem::transmute::<unsafe extern "C" fn() -> c_int, BwdFn>(bwd) };
        let del = ctx.and_then(|(f, c)| {
            f.map(|f| (unsafe { std::mem::transmute::<unsafe extern "C" fn() -> c_int, DelFn>(f) }, c))
        });
        Ok(Function { bwd: (bwd, cb.1), del, inputs: inputs.iter().map(|x| x.detached()).collect() })
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        if let Some((f, c)) = self.del {
            // SAFETY: the frontend's delete callback with its state, called once.
            mxnet_core::runtime::outside_call(|| unsafe { f(c) });
        }
    }
}

impl mxnet_core::op::CustomBackward for Function {
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>> {
        let mut grads = Vec::with_capacity(self.inputs.len());
        for x in &self.inputs {
            grads.push(NDArray::new(
                x.shape.clone(),
                x.ctx().unwrap_or(mxnet_core::context::Context::CPU),
                x.dtype,
                false,
            )?);
        }
        // Fresh handles: the frontend wraps each in an NDArray and frees it.
        let mut handles: Vec<NDArrayHandle> =
            ograds.iter().chain(&grads).map(|a| arrays().insert(Arc::new(a.detached()))).collect();
        let reqs: Vec<c_int> = (0..grads.len()).map(|i| c_int::from(want.get(i).copied().unwrap_or(false))).collect();
        let is_train = c_int::from(mxnet_core::op::invoke::is_training());
        // SAFETY: the frontend's backward callback with its state; the arrays outlive the call.
        let ok = mxnet_core::runtime::outside_call(|| unsafe {
            (self.bwd.0)(
                ograds.len() as c_int,
                grads.len() as c_int,
                handles.as_mut_ptr(),
                reqs.as_ptr(),
                is_train,
                self.bwd.1,
            )
        });
        if ok == 0 {
            return Err(Error::mxnet("autograd.Function's backward failed (its traceback was printed above)"));
        }
        Ok(grads.into_iter().zip(want.iter().chain(std::iter::repeat(&false))).map(|(g, &w)| w.then_some(g)).collect())
    }
}
