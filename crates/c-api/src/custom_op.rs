//! C API: custom operators (`MXCustomOpRegister`) — stock's callback protocol behind the
//! domain's traits ([`op::custom::PropCreator`], [`FrontendProp`], [`FrontendOp`]).
//!
//! Owns the callback tables a frontend fills in (`MXCallbackList`: a property's list, shape,
//! type, dependency and operator-creation callbacks; an operator's forward and backward), the
//! conversions between the domain's values and stock's C arrays, and calling each delete
//! callback once, when the domain drops the object. A callback that returns 0 failed in the
//! frontend (which printed its error); that becomes an `MXNetError` naming the step.

use super::ffi::{self, cstr};
use super::ndarray::arrays;
use super::types::{CustomOpPropCreator, MXCallbackList};
use mxnet_core::context::Context;
use mxnet_core::error::{Error, Result};
use mxnet_core::ndarray::{DType, Meta, NDArray};
use mxnet_core::op::custom::{FrontendOp, FrontendProp, Pass, PropCreator, Tag};
use mxnet_core::op::{self, Req};
use mxnet_core::runtime::outside_call;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Arc;

// Stock's callback indices (CustomOpPropCallbacks, CustomOpCallbacks).
const PROP_DELETE: usize = 0;
const PROP_LIST_ARGUMENTS: usize = 1;
const PROP_LIST_OUTPUTS: usize = 2;
const PROP_LIST_AUX: usize = 3;
const PROP_INFER_SHAPE: usize = 4;
const PROP_BACKWARD_DEPS: usize = 5;
const PROP_CREATE_OPERATOR: usize = 6;
const PROP_INFER_TYPE: usize = 7;
const OP_DELETE: usize = 0;
const OP_FORWARD: usize = 1;
const OP_BACKWARD: usize = 2;

type Creator =
    unsafe extern "C" fn(*const c_char, c_int, *mut *const c_char, *mut *const c_char, *mut MXCallbackList) -> c_int;
type DelFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type ListFn = unsafe extern "C" fn(*mut *mut *mut c_char, *mut c_void) -> c_int;
type InferShapeFn = unsafe extern "C" fn(c_int, *mut c_int, *mut *mut c_int, *mut c_void) -> c_int;
type InferTypeFn = unsafe extern "C" fn(c_int, *mut c_int, *mut c_void) -> c_int;
type BwdDepFn =
    unsafe extern "C" fn(*const c_int, *const c_int, *const c_int, *mut c_int, *mut *mut c_int, *mut c_void) -> c_int;
type CreateOpFn = unsafe extern "C" fn(
    *const c_char,
    c_int,
    *mut *mut u32,
    *mut c_int,
    *mut c_int,
    *mut MXCallbackList,
    *mut c_void,
) -> c_int;
type FbFn = unsafe extern "C" fn(c_int, *mut *mut c_void, *mut c_int, *mut c_int, c_int, *mut c_void) -> c_int;

/// Stock's array tags of the forward/backward callbacks.
pub(crate) fn tag_code(t: Tag) -> c_int {
    match t {
        Tag::In => 0,
        Tag::Out => 1,
        Tag::InGrad => 2,
        Tag::OutGrad => 3,
        Tag::Aux => 4,
    }
}

/// Stock's OpReqType codes.
fn req_code(r: Req) -> c_int {
    match r {
        Req::Null => 0,
        Req::Write => 1,
        Req::Inplace => 2,
        Req::Add => 3,
    }
}

fn failed(op_type: &str, what: &str) -> Error {
    Error::mxnet(format!(
        "custom operator {op_type}: {what} failed in the frontend (its error was printed by the frontend)"
    ))
}

/// A copy of a callback list a frontend filled in (the frontend keeps the functions alive
/// until the list's delete callback), with the op_type its errors name.
struct Callbacks {
    op_type: Arc<str>,
    fns: Vec<*const ()>,
    ctxs: Vec<*mut c_void>,
    /// Index of the delete callback, called once when this is dropped.
    delete: usize,
}

// SAFETY: the callbacks are frontend functions that may be called from any thread (ctypes
// callbacks take the GIL); the contexts are opaque values handed back to them.
unsafe impl Send for Callbacks {}
unsafe impl Sync for Callbacks {}

impl Callbacks {
    /// # Safety
    /// `list` must have been filled in by the frontend (or be all zero).
    unsafe fn copy(
        list: &MXCallbackList,
        op_type: &Arc<str>,
        what: &str,
        needed: usize,
        delete: usize,
    ) -> Result<Self> {
        let n = list.num_callbacks.max(0) as usize;
        if n < needed || list.callbacks.is_null() || list.contexts.is_null() {
            return Err(Error::mxnet(format!(
                "custom operator {op_type}: the {what} gave {n} callbacks, {needed} are needed"
            )));
        }
        // SAFETY: the frontend filled in `n` callbacks and contexts.
        let (fns, ctxs) =
            unsafe { (std::slice::from_raw_parts(list.callbacks, n), std::slice::from_raw_parts(list.contexts, n)) };
        Ok(Callbacks {
            op_type: op_type.clone(),
            fns: fns.iter().map(|f| f.map_or(std::ptr::null(), |f| f as *const ())).collect(),
            ctxs: ctxs.to_vec(),
            delete,
        })
    }

    /// Callback `i` (NULL or missing: `None`) and its context.
    fn get(&self, i: usize) -> Option<(*const (), *mut c_void)> {
        self.fns.get(i).filter(|f| !f.is_null()).map(|&f| (f, self.ctxs[i]))
    }

    fn need(&self, i: usize, what: &str) -> Result<(*const (), *mut c_void)> {
        self.get(i).ok_or_else(|| Error::mxnet(format!("custom operator {}: no {what} callback", self.op_type)))
    }
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        if let Some((f, ctx)) = self.get(self.delete) {
            // SAFETY: the delete callback has stock's signature; called once, last.
            outside_call(|| unsafe { std::mem::transmute::<*const (), DelFn>(f)(ctx) });
        }
    }
}

fn empty_list() -> MXCallbackList {
    MXCallbackList { num_callbacks: 0, callbacks: std::ptr::null_mut(), contexts: std::ptr::null_mut() }
}

/// A property creator the frontend registered.
struct CCreator(Creator);

impl PropCreator for CCreator {
    fn create(&self, op_type: &str, kwargs: &[(String, String)]) -> Result<Box<dyn FrontendProp>> {
        let c = |s: &str, what: &str| {
            CString::new(s).map_err(|_| Error::value(format!("custom operator {op_type}: {what} {s:?} contains NUL")))
        };
        let c_type = c(op_type, "op_type")?;
        let keys: Vec<CString> = kwargs.iter().map(|(k, _)| c(k, "parameter")).collect::<Result<_>>()?;
        let vals: Vec<CString> = kwargs.iter().map(|(_, v)| c(v, "value")).collect::<Result<_>>()?;
        let mut kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let mut vp: Vec<*const c_char> = vals.iter().map(|v| v.as_ptr()).collect();
        let mut list = empty_list();
        // SAFETY: the creator has stock's signature; every pointer is valid for the call.
        let ok = outside_call(|| unsafe {
            (self.0)(c_type.as_ptr(), kwargs.len() as c_int, kp.as_mut_ptr(), vp.as_mut_ptr(), &mut list)
        });
        if ok == 0 {
            return Err(failed(op_type, "creating its CustomOpProp"));
        }
        let op_type: Arc<str> = Arc::from(op_type);
        // SAFETY: the creator succeeded, so it filled the list in.
        let cbs = unsafe { Callbacks::copy(&list, &op_type, "CustomOpProp", PROP_CREATE_OPERATOR + 1, PROP_DELETE)? };
        Ok(Box::new(CProp(cbs)))
    }
}

/// The frontend's `CustomOpProp` through its callbacks.
struct CProp(Callbacks);

impl CProp {
    fn list(&self, i: usize, what: &str) -> Result<Vec<String>> {
        let (f, ctx) = self.0.need(i, what)?;
        let mut names: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: a list callback with stock's signature; it points `names` at a NULL-ended
        // array of strings it keeps alive until its next call.
        let ok = outside_call(|| unsafe { std::mem::transmute::<*const (), ListFn>(f)(&mut names, ctx) });
        if ok == 0 || names.is_null() {
            return Err(failed(&self.0.op_type, what));
        }
        let mut out = Vec::new();
        // SAFETY: as above; read before anything can call the callback again.
        unsafe {
            while !(*names.add(out.len())).is_null() {
                out.push(CStr::from_ptr(*names.add(out.len())).to_string_lossy().into_owned());
            }
        }
        Ok(out)
    }
}

fn c_ints(ids: &[usize]) -> Vec<c_int> {
    ids.iter().map(|&i| i as c_int).collect()
}

impl FrontendProp for CProp {
    fn list_arguments(&self) -> Result<Vec<String>> {
        self.list(PROP_LIST_ARGUMENTS, "list_arguments")
    }
    fn list_outputs(&self) -> Result<Vec<String>> {
        self.list(PROP_LIST_OUTPUTS, "list_outputs")
    }
    fn list_auxiliary_states(&self) -> Result<Vec<String>> {
        self.list(PROP_LIST_AUX, "list_auxiliary_states")
    }

    fn declare_backward_dependency(&self, og: &[usize], ind: &[usize], outd: &[usize]) -> Result<Vec<i64>> {
        let (f, ctx) = self.0.need(PROP_BACKWARD_DEPS, "declare_backward_dependency")?;
        let (og, ind, outd) = (c_ints(og), c_ints(ind), c_ints(outd));
        let (mut n, mut deps): (c_int, *mut c_int) = (0, std::ptr::null_mut());
        // SAFETY: stock's signature; the id arrays are as long as the lists say.
        let ok = outside_call(|| unsafe {
            std::mem::transmute::<*const (), BwdDepFn>(f)(
                og.as_ptr(),
                ind.as_ptr(),
                outd.as_ptr(),
                &mut n,
                &mut deps,
                ctx,
            )
        });
        if ok == 0 || (n > 0 && deps.is_null()) {
            return Err(failed(&self.0.op_type, "declare_backward_dependency"));
        }
        // SAFETY: the callback gave `n` ids.
        let raw = if n > 0 { unsafe { std::slice::from_raw_parts(deps, n as usize) } } else { &[][..] };
        Ok(raw.iter().map(|&d| d as i64).collect())
    }

    fn infer_shape(&self, known: &[Option<&[usize]>]) -> Result<Vec<Vec<usize>>> {
        let (f, ctx) = self.0.need(PROP_INFER_SHAPE, "infer_shape")?;
        let op_type = &self.0.op_type;
        let total = known.len();
        let mut bufs: Vec<Vec<c_int>> = Vec::with_capacity(total);
        for (i, k) in known.iter().enumerate() {
            let dims = k.map(|s| s.iter().map(|&d| c_int::try_from(d)).collect::<std::result::Result<Vec<_>, _>>());
            let dims = dims.transpose().map_err(|_| {
                Error::value(format!("custom operator {op_type}: input {i} has a dimension beyond 2^31"))
            })?;
            bufs.push(dims.unwrap_or_default());
        }
        let mut ndims: Vec<c_int> =
            known.iter().zip(&bufs).map(|(k, b)| if k.is_some() { b.len() as c_int } else { -1 }).collect();
        let mut ptrs: Vec<*mut c_int> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        // SAFETY: stock's signature; `total` entries in both arrays; the callback replaces
        // the pointers with buffers it keeps alive until its next call.
        let ok = outside_call(|| unsafe {
            std::mem::transmute::<*const (), InferShapeFn>(f)(
                total as c_int,
                ndims.as_mut_ptr(),
                ptrs.as_mut_ptr(),
                ctx,
            )
        });
        if ok == 0 {
            return Err(failed(op_type, "infer_shape"));
        }
        let mut shapes = Vec::with_capacity(total);
        for i in 0..total {
            let bad =
                || Error::value(format!("custom operator {op_type}: infer_shape gave an invalid shape for entry {i}"));
            let n = usize::try_from(ndims[i]).map_err(|_| bad())?;
            if n > 0 && ptrs[i].is_null() {
                return Err(bad());
            }
            // SAFETY: the callback gave `n` dimensions at `ptrs[i]`.
            let dims = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ptrs[i], n) } };
            shapes.push(dims.iter().map(|&d| usize::try_from(d).map_err(|_| bad())).collect::<Result<Vec<_>>>()?);
        }
        Ok(shapes)
    }

    fn infer_type(&self, known: &[Option<DType>]) -> Result<Option<Vec<DType>>> {
        let Some((f, ctx)) = self.0.get(PROP_INFER_TYPE) else { return Ok(None) };
        let mut types: Vec<c_int> = known.iter().map(|t| t.map_or(-1, |d| d as c_int)).collect();
        // SAFETY: stock's signature; one entry per known type.
        let ok = outside_call(|| unsafe {
            std::mem::transmute::<*const (), InferTypeFn>(f)(types.len() as c_int, types.as_mut_ptr(), ctx)
        });
        if ok == 0 {
            return Err(failed(&self.0.op_type, "infer_type"));
        }
        types
            .into_iter()
            .map(|t| {
                DType::from_code(t).map_err(|e| {
                    Error::type_error(format!("custom operator {}: infer_type: {}", self.0.op_type, e.message()))
                })
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    fn create_operator(&self, ctx: Context, inputs: &[Meta]) -> Result<Box<dyn FrontendOp>> {
        let (f, cctx) = self.0.need(PROP_CREATE_OPERATOR, "create_operator")?;
        let ctx_str = CString::new(ctx.to_string()).expect("no NUL in a context name");
        let mut bufs: Vec<Vec<u32>> = inputs.iter().map(|m| m.shape.iter().map(|&d| d as u32).collect()).collect();
        let mut shapes: Vec<*mut u32> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let mut ndims: Vec<c_int> = inputs.iter().map(|m| m.shape.len() as c_int).collect();
        let mut dtypes: Vec<c_int> = inputs.iter().map(|m| m.dtype as c_int).collect();
        let mut list = empty_list();
        // SAFETY: stock's signature; the arrays hold one entry per input.
        let ok = outside_call(|| unsafe {
            std::mem::transmute::<*const (), CreateOpFn>(f)(
                ctx_str.as_ptr(),
                inputs.len() as c_int,
                shapes.as_mut_ptr(),
                ndims.as_mut_ptr(),
                dtypes.as_mut_ptr(),
                &mut list,
                cctx,
            )
        });
        if ok == 0 {
            return Err(failed(&self.0.op_type, "create_operator"));
        }
        // SAFETY: the callback succeeded, so it filled the list in.
        let cbs = unsafe { Callbacks::copy(&list, &self.0.op_type, "CustomOp", OP_BACKWARD + 1, OP_DELETE)? };
        // Checked here, on the calling thread, so a missing one fails the call itself.
        for (i, what) in [(OP_FORWARD, "forward"), (OP_BACKWARD, "backward")] {
            cbs.need(i, what)?;
        }
        Ok(Box::new(COp(cbs)))
    }
}

/// The frontend's `CustomOp` through its callbacks.
struct COp(Callbacks);

impl FrontendOp for COp {
    fn run(&self, pass: Pass, arrays_in: Vec<NDArray>, tags: &[Tag], reqs: &[Req], is_train: bool) -> Result<()> {
        let (which, what) = match pass {
            Pass::Forward => (OP_FORWARD, "CustomOp.forward"),
            Pass::Backward => (OP_BACKWARD, "CustomOp.backward"),
        };
        let (f, cctx) = self.0.need(which, what)?;
        // SAFETY: forward and backward callbacks have stock's signature.
        let callback = unsafe { std::mem::transmute::<*const (), FbFn>(f) };
        // The frontend owns these handles from here (its NDArray objects free them).
        let mut handles: Vec<*mut c_void> = arrays_in.into_iter().map(|a| arrays().insert(Arc::new(a))).collect();
        let mut tags: Vec<c_int> = tags.iter().map(|&t| tag_code(t)).collect();
        let mut reqs: Vec<c_int> = reqs.iter().map(|&r| req_code(r)).collect();
        // SAFETY: stock's signature; the arrays hold one entry per handle (reqs: one per
        // written output), valid for the call.
        let ok = outside_call(|| unsafe {
            callback(
                handles.len() as c_int,
                handles.as_mut_ptr(),
                tags.as_mut_ptr(),
                reqs.as_mut_ptr(),
                is_train as c_int,
                cctx,
            )
        });
        if ok == 0 {
            return Err(failed(&self.0.op_type, what));
        }
        Ok(())
    }
}

/// Record a custom operator's property creator under `op_type` (re-registering replaces it).
///
/// # Safety
/// `op_type` must be a string.
#[no_mangle]
pub unsafe extern "C" fn MXCustomOpRegister(op_type: *const c_char, creator: CustomOpPropCreator) -> c_int {
    ffi::call("MXCustomOpRegister", || -> Result<()> {
        // SAFETY: per this function's contract.
        let name = unsafe { cstr(op_type, "op_type")? };
        let Some(creator) = creator else {
            return Err(Error::value(format!("creator for custom operator {name} is NULL")));
        };
        op::custom::register_prop(name, Arc::new(CCreator(creator)));
        Ok(())
    })
}

#[cfg(test)]
mod tests;
