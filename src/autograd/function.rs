//! Backward passes that are not an operator's: `autograd.Function` (MXCustomFunctionRecord)
//! and custom operators recorded by autograd.

use crate::error::Result;
use crate::ndarray::NDArray;

/// The backward of a recorded call that runs code of its own.
pub trait CustomBackward: Send + Sync {
    /// Gradients of the call's inputs (`None` where `want` is false) from the gradients of its
    /// visible outputs.
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>>;
}

use crate::c_api::ndarray::arrays;
use crate::c_api::types::{MXCallbackList, NDArrayHandle};
use crate::error::Error;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

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
            unsafe { f(c) };
        }
    }
}

impl CustomBackward for Function {
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>> {
        let mut grads = Vec::with_capacity(self.inputs.len());
        for x in &self.inputs {
            grads.push(NDArray::new(x.shape.clone(), x.ctx().unwrap_or(crate::context::Context::CPU), x.dtype, false)?);
        }
        // Fresh handles: the frontend wraps each in an NDArray and frees it.
        let mut handles: Vec<NDArrayHandle> =
            ograds.iter().chain(&grads).map(|a| arrays().insert(Arc::new(a.detached()))).collect();
        let reqs: Vec<c_int> = (0..grads.len()).map(|i| c_int::from(want.get(i).copied().unwrap_or(false))).collect();
        let is_train = c_int::from(crate::op::invoke::is_training());
        // SAFETY: the frontend's backward callback with its state; the arrays outlive the call.
        let ok = unsafe {
            (self.bwd.0)(
                ograds.len() as c_int,
                grads.len() as c_int,
                handles.as_mut_ptr(),
                reqs.as_ptr(),
                is_train,
                self.bwd.1,
            )
        };
        if ok == 0 {
            return Err(Error::mxnet("autograd.Function's backward failed (its traceback was printed above)"));
        }
        Ok(grads.into_iter().zip(want.iter().chain(std::iter::repeat(&false))).map(|(g, &w)| w.then_some(g)).collect())
    }
}
