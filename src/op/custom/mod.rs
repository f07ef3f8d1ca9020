//! Custom operators: operators implemented in the frontend (`mx.operator.CustomOp` and
//! `CustomOpProp`) and run through the C callbacks of the stock protocol (`MXCustomOpRegister`).
//!
//! Owns: the `Custom` and `_backward_Custom` operators; the callback protocol — a property
//! ([`Prop`]) created per call by the registered creator from the call's extra parameters,
//! with its argument/output/auxiliary lists, shape and type inference, backward dependencies
//! and operator creation, and the operator ([`CustomState`]) with its forward and backward —;
//! and how forward and backward run against the engine.
//!
//! Running a callback: the operation pushed for a call is asynchronous and holds the real
//! arrays' variables (inputs read; outputs, input gradients and auxiliary states written).
//! Its function only queues a job for the custom-operator threads ([`worker`]) and returns, so
//! no engine worker waits for the frontend. The job hands the frontend new handles over the
//! same memory under *alias* variables (one per distinct chunk, [`Var::alias`]), calls the
//! callback with no lock of ours held (ctypes takes the GIL itself), then pushes a completion
//! operation that writes every alias: it runs once all that the frontend pushed on them has
//! finished, and completes the call's operation with the callback's failure or the first
//! failure those operations left. The frontend never sees a variable the call's operation
//! holds, so its own operations and waits (`out[:] = y`, `x.asnumpy()`) never wait for the
//! operation that waits for them. The threads and engines involved: the caller pushes; an
//! engine worker (or, under NaiveEngine, the caller) queues the job; a custom-operator thread
//! runs the callback and pushes the completion, which an engine worker runs.

pub mod worker;

use super::invoke;
use super::param::{PType, ParamSpec};
use super::{Grad, Inputs, Meta, OpDef, Req};
use crate::c_api::ndarray::arrays;
use crate::c_api::types::MXCallbackList;
use crate::context::Context;
use crate::engine::{self, Completion, FnProperty, Push, Var};
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
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

// Array tags of the forward/backward callbacks.
const TAG_IN: c_int = 0;
const TAG_OUT: c_int = 1;
const TAG_IN_GRAD: c_int = 2;
const TAG_OUT_GRAD: c_int = 3;
const TAG_AUX: c_int = 4;

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

/// Run `f`, a forward or backward callback of the custom operator `op_type`. The single place
/// where the profiler's `Custom Operator` scope belongs (an event `<op_type>::pure_python`
/// around `f`, and operations pushed by this thread meanwhile named `<op_type>::<name>`).
pub fn callback_scope<R>(op_type: &str, f: impl FnOnce() -> R) -> R {
    crate::profiler::custom_scope(op_type, f)
}

/// A copy of a callback list a frontend filled in (the frontend keeps the functions alive
/// until the list's delete callback).
struct Callbacks {
    fns: Vec<*const ()>,
    ctxs: Vec<*mut c_void>,
}

impl Callbacks {
    /// # Safety
    /// `list` must have been filled in by the frontend (or be all zero).
    unsafe fn copy(list: &MXCallbackList, op_type: &str, what: &str, needed: usize) -> Result<Callbacks> {
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
            fns: fns.iter().map(|f| f.map_or(std::ptr::null(), |f| f as *const ())).collect(),
            ctxs: ctxs.to_vec(),
        })
    }

    /// Callback `i` (NULL or missing: `None`) and its context.
    fn get(&self, i: usize) -> Option<(*const (), *mut c_void)> {
        self.fns.get(i).filter(|f| !f.is_null()).map(|&f| (f, self.ctxs[i]))
    }
}

/// A custom operator's property: created by the registered creator for one call.
pub struct Prop {
    pub op_type: Arc<str>,
    cbs: Callbacks,
    pub args: Vec<String>,
    pub outputs: Vec<String>,
    pub aux: Vec<String>,
    /// What the backward reads, as stock numbers it: output gradients `0..n_out`, inputs
    /// `n_out..n_out + n_args`, then outputs.
    pub bwd_deps: Vec<usize>,
}

// SAFETY: the callbacks are frontend functions that may be called from any thread (ctypes
// callbacks take the GIL); the contexts are opaque values handed back to them.
unsafe impl Send for Prop {}
unsafe impl Sync for Prop {}

impl Drop for Prop {
    fn drop(&mut self) {
        if let Some((f, ctx)) = self.cbs.get(PROP_DELETE) {
            // SAFETY: the delete callback has stock's signature; called once, last.
            unsafe { std::mem::transmute::<*const (), DelFn>(f)(ctx) };
        }
    }
}

fn failed(op_type: &str, what: &str) -> Error {
    Error::mxnet(format!(
        "custom operator {op_type}: {what} failed in the frontend (its error was printed by the frontend)"
    ))
}

impl Prop {
    /// Create the property of `op_type` with `kwargs` (the call's parameters besides
    /// `op_type`) and read its lists and backward dependencies.
    pub fn create(op_type: &str, kwargs: &[(String, String)]) -> Result<Arc<Prop>> {
        let creator = crate::c_api::frontend::custom_op_creator(op_type).ok_or_else(|| {
            Error::mxnet(format!(
                "custom operator {op_type} is not registered (register it with mx.operator.register(\"{op_type}\"))"
            ))
        })?;
        let c = |s: &str, what: &str| {
            CString::new(s).map_err(|_| Error::value(format!("custom operator {op_type}: {what} {s:?} contains NUL")))
        };
        let c_type = c(op_type, "op_type")?;
        let keys: Vec<CString> = kwargs.iter().map(|(k, _)| c(k, "parameter")).collect::<Result<_>>()?;
        let vals: Vec<CString> = kwargs.iter().map(|(_, v)| c(v, "value")).collect::<Result<_>>()?;
        let mut kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let mut vp: Vec<*const c_char> = vals.iter().map(|v| v.as_ptr()).collect();
        let mut list =
            MXCallbackList { num_callbacks: 0, callbacks: std::ptr::null_mut(), contexts: std::ptr::null_mut() };
        // SAFETY: the creator has stock's signature; every pointer is valid for the call.
        let ok =
            unsafe { creator(c_type.as_ptr(), kwargs.len() as c_int, kp.as_mut_ptr(), vp.as_mut_ptr(), &mut list) };
        if ok == 0 {
            return Err(failed(op_type, "creating its CustomOpProp"));
        }
        // SAFETY: the creator succeeded, so it filled the list in.
        let cbs = unsafe { Callbacks::copy(&list, op_type, "CustomOpProp", PROP_CREATE_OPERATOR + 1)? };
        let mut prop = Prop {
            op_type: Arc::from(op_type),
            cbs,
            args: Vec::new(),
            outputs: Vec::new(),
            aux: Vec::new(),
            bwd_deps: Vec::new(),
        };
        prop.args = prop.list(PROP_LIST_ARGUMENTS, "list_arguments")?;
        prop.outputs = prop.list(PROP_LIST_OUTPUTS, "list_outputs")?;
        prop.aux = prop.list(PROP_LIST_AUX, "list_auxiliary_states")?;
        prop.bwd_deps = prop.backward_deps()?;
        Ok(Arc::new(prop))
    }

    fn callback(&self, i: usize, what: &str) -> Result<(*const (), *mut c_void)> {
        self.cbs.get(i).ok_or_else(|| Error::mxnet(format!("custom operator {}: no {what} callback", self.op_type)))
    }

    fn list(&self, i: usize, what: &str) -> Result<Vec<String>> {
        let (f, ctx) = self.callback(i, what)?;
        let mut names: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: a list callback with stock's signature; it points `names` at a NULL-ended
        // array of strings it keeps alive until its next call.
        let ok = unsafe { std::mem::transmute::<*const (), ListFn>(f)(&mut names, ctx) };
        if ok == 0 || names.is_null() {
            return Err(failed(&self.op_type, what));
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

    fn backward_deps(&self) -> Result<Vec<usize>> {
        let (f, ctx) = self.callback(PROP_BACKWARD_DEPS, "declare_backward_dependency")?;
        let (n_out, n_args) = (self.outputs.len(), self.args.len());
        let ids = |from: usize, n: usize| (from..from + n).map(|i| i as c_int).collect::<Vec<_>>();
        let (og, ind, outd) = (ids(0, n_out), ids(n_out, n_args), ids(n_out + n_args, n_out));
        let (mut n, mut deps): (c_int, *mut c_int) = (0, std::ptr::null_mut());
        // SAFETY: stock's signature; the id arrays are as long as the lists say.
        let ok = unsafe {
            std::mem::transmute::<*const (), BwdDepFn>(f)(
                og.as_ptr(),
                ind.as_ptr(),
                outd.as_ptr(),
                &mut n,
                &mut deps,
                ctx,
            )
        };
        if ok == 0 || (n > 0 && deps.is_null()) {
            return Err(failed(&self.op_type, "declare_backward_dependency"));
        }
        // SAFETY: the callback gave `n` ids.
        let raw = if n > 0 { unsafe { std::slice::from_raw_parts(deps, n as usize) }.to_vec() } else { Vec::new() };
        let total = 2 * n_out + n_args;
        raw.into_iter()
            .map(|d| {
                usize::try_from(d).ok().filter(|&d| d < total).ok_or_else(|| {
                    Error::mxnet(format!(
                        "custom operator {}: declare_backward_dependency returned {d}, not one of the ids it was given (0..{total})",
                        self.op_type
                    ))
                })
            })
            .collect()
    }

    /// Output metas from the input metas (arguments then auxiliary states), checking what the
    /// property says the inputs must be against what they are.
    pub fn infer(&self, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let (n_args, n_out, n_aux) = (self.args.len(), self.outputs.len(), self.aux.len());
        if inputs.len() != n_args + n_aux {
            return Err(Error::value(format!(
                "custom operator {} takes {} inputs ({} arguments {:?} and {} auxiliary states {:?}), got {}",
                self.op_type,
                n_args + n_aux,
                n_args,
                self.args,
                n_aux,
                self.aux,
                inputs.len()
            )));
        }
        let total = n_args + n_out + n_aux;
        // The callback's order: arguments, outputs, auxiliary states.
        let at = |i: usize| {
            if i < n_args {
                Some(&inputs[i])
            } else if i >= n_args + n_out {
                Some(&inputs[i - n_out])
            } else {
                None
            }
        };
        let shapes = self.infer_shapes(total, &at)?;
        let dtypes = self.infer_types(total, &at)?;
        let mut out = Vec::with_capacity(n_out);
        for (i, (shape, dtype)) in shapes.into_iter().zip(dtypes).enumerate() {
            match at(i) {
                Some(m) if m.shape != shape || m.dtype != dtype => {
                    return Err(Error::value(format!(
                        "custom operator {}: input {i} has shape {:?} {} but infer_shape/infer_type say {shape:?} {}",
                        self.op_type,
                        m.shape,
                        m.dtype.name(),
                        dtype.name()
                    )))
                }
                Some(_) => {}
                None => out.push(Meta::new(shape, dtype)),
            }
        }
        Ok(out)
    }

    fn infer_shapes<'a>(&self, total: usize, at: &dyn Fn(usize) -> Option<&'a Meta>) -> Result<Vec<Vec<usize>>> {
        let (f, ctx) = self.callback(PROP_INFER_SHAPE, "infer_shape")?;
        let mut bufs: Vec<Vec<c_int>> = Vec::with_capacity(total);
        for i in 0..total {
            let dims =
                at(i).map(|m| m.shape.iter().map(|&d| c_int::try_from(d)).collect::<std::result::Result<Vec<_>, _>>());
            let dims = dims.transpose().map_err(|_| {
                Error::value(format!("custom operator {}: input {i} has a dimension beyond 2^31", self.op_type))
            })?;
            bufs.push(dims.unwrap_or_default());
        }
        let mut ndims: Vec<c_int> =
            (0..total).map(|i| if at(i).is_some() { bufs[i].len() as c_int } else { -1 }).collect();
        let mut ptrs: Vec<*mut c_int> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        // SAFETY: stock's signature; `total` entries in both arrays; the callback replaces
        // the pointers with buffers it keeps alive until its next call.
        let ok = unsafe {
            std::mem::transmute::<*const (), InferShapeFn>(f)(
                total as c_int,
                ndims.as_mut_ptr(),
                ptrs.as_mut_ptr(),
                ctx,
            )
        };
        if ok == 0 {
            return Err(failed(&self.op_type, "infer_shape"));
        }
        let mut shapes = Vec::with_capacity(total);
        for i in 0..total {
            let bad = || {
                Error::value(format!(
                    "custom operator {}: infer_shape gave an invalid shape for entry {i}",
                    self.op_type
                ))
            };
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

    fn infer_types<'a>(&self, total: usize, at: &dyn Fn(usize) -> Option<&'a Meta>) -> Result<Vec<DType>> {
        let first = at(0).map(|m| m.dtype).unwrap_or(DType::F32);
        let Some((f, ctx)) = self.cbs.get(PROP_INFER_TYPE) else {
            // Frontends without infer_type: everything has the first input's dtype.
            return Ok(vec![first; total]);
        };
        let mut types: Vec<c_int> = (0..total).map(|i| at(i).map_or(-1, |m| m.dtype as c_int)).collect();
        // SAFETY: stock's signature; `total` entries.
        let ok = unsafe { std::mem::transmute::<*const (), InferTypeFn>(f)(total as c_int, types.as_mut_ptr(), ctx) };
        if ok == 0 {
            return Err(failed(&self.op_type, "infer_type"));
        }
        types
            .into_iter()
            .map(|t| {
                DType::from_code(t).map_err(|e| {
                    Error::type_error(format!("custom operator {}: infer_type: {}", self.op_type, e.message()))
                })
            })
            .collect()
    }

    /// Create the operator for inputs `inputs` (arguments then auxiliary states) on `ctx`.
    pub fn create_operator(self: &Arc<Self>, ctx: Context, inputs: &[Meta]) -> Result<Arc<CustomState>> {
        let (f, cctx) = self.callback(PROP_CREATE_OPERATOR, "create_operator")?;
        let ctx_str = CString::new(ctx.to_string()).expect("no NUL in a context name");
        let mut bufs: Vec<Vec<u32>> = inputs.iter().map(|m| m.shape.iter().map(|&d| d as u32).collect()).collect();
        let mut shapes: Vec<*mut u32> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let mut ndims: Vec<c_int> = inputs.iter().map(|m| m.shape.len() as c_int).collect();
        let mut dtypes: Vec<c_int> = inputs.iter().map(|m| m.dtype as c_int).collect();
        let mut list =
            MXCallbackList { num_callbacks: 0, callbacks: std::ptr::null_mut(), contexts: std::ptr::null_mut() };
        // SAFETY: stock's signature; the arrays hold one entry per input.
        let ok = unsafe {
            std::mem::transmute::<*const (), CreateOpFn>(f)(
                ctx_str.as_ptr(),
                inputs.len() as c_int,
                shapes.as_mut_ptr(),
                ndims.as_mut_ptr(),
                dtypes.as_mut_ptr(),
                &mut list,
                cctx,
            )
        };
        if ok == 0 {
            return Err(failed(&self.op_type, "create_operator"));
        }
        // SAFETY: the callback succeeded, so it filled the list in.
        let cbs = unsafe { Callbacks::copy(&list, &self.op_type, "CustomOp", OP_BACKWARD + 1)? };
        Ok(Arc::new(CustomState { prop: self.clone(), cbs, ctx }))
    }
}

/// A custom operator created for a call: the frontend's `CustomOp` object, kept for a
/// backward with the same object (autograd keeps it from the forward).
pub struct CustomState {
    pub prop: Arc<Prop>,
    cbs: Callbacks,
    ctx: Context,
}

// SAFETY: as for `Prop`.
unsafe impl Send for CustomState {}
unsafe impl Sync for CustomState {}

impl Drop for CustomState {
    fn drop(&mut self) {
        if let Some((f, ctx)) = self.cbs.get(OP_DELETE) {
            // SAFETY: the delete callback has stock's signature; called once, last.
            unsafe { std::mem::transmute::<*const (), DelFn>(f)(ctx) };
        }
    }
}

/// One array of a forward or backward callback: `None` is an empty array (a backward input
/// the property did not declare a dependency on).
struct Entry {
    array: Option<NDArray>,
    tag: c_int,
    write: bool,
}

fn req_code(r: Req) -> c_int {
    match r {
        Req::Null => 0,
        Req::Write => 1,
        Req::Inplace => 2,
        Req::Add => 3,
    }
}

fn push_unique(list: &mut Vec<Arc<Var>>, v: &Arc<Var>) {
    if !list.iter().any(|x| Arc::ptr_eq(x, v)) {
        list.push(v.clone());
    }
}

/// The context all `arrays` are on (CPU when there are none).
fn common_ctx(op_type: &str, arrays: &[&NDArray]) -> Result<Context> {
    let mut ctx: Option<Context> = None;
    for (i, x) in arrays.iter().enumerate() {
        let c =
            x.ctx().ok_or_else(|| Error::value(format!("custom operator {op_type}: array {i} is an empty NDArray")))?;
        if ctx.is_some_and(|p| p != c) {
            return Err(Error::value(format!("custom operator {op_type}: all arrays must be on one context")));
        }
        ctx = Some(c);
    }
    ctx.unwrap_or(Context::CPU).check_available()
}

/// Check caller-given outputs against what the operator produces, or allocate them.
fn outputs_for(op_type: &str, metas: &[Meta], given: Option<&[&NDArray]>, ctx: Context) -> Result<Vec<NDArray>> {
    let Some(given) = given else {
        return metas.iter().map(|m| NDArray::new(m.shape.clone(), ctx, m.dtype, false)).collect();
    };
    if given.len() != metas.len() {
        return Err(Error::value(format!(
            "custom operator {op_type} has {} outputs, {} given",
            metas.len(),
            given.len()
        )));
    }
    for (i, (o, m)) in given.iter().zip(metas).enumerate() {
        if o.chunk.is_none() || o.shape != m.shape || o.dtype != m.dtype || o.ctx() != Some(ctx) {
            return Err(Error::value(format!(
                "custom operator {op_type}: output {i} must be {:?} {} on {ctx}, got {:?} {}",
                m.shape,
                m.dtype.name(),
                o.shape,
                o.dtype.name()
            )));
        }
    }
    Ok(given.iter().map(|o| (*o).clone()).collect())
}

/// Run a custom operator forward: `inputs` are its arguments then auxiliary states;
/// `outputs` the caller's arrays or `None` to allocate. Returns the outputs and the operator
/// (for a backward with it). Everything up to the push (property, inference, operator
/// creation) runs on the calling thread; the forward callback runs asynchronously.
pub fn forward(
    op_type: &str,
    kwargs: &[(String, String)],
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    is_train: bool,
) -> Result<(Vec<NDArray>, Arc<CustomState>)> {
    let prop = Prop::create(op_type, kwargs)?;
    let ctx = common_ctx(op_type, inputs)?;
    let in_meta: Vec<Meta> = inputs.iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect();
    let out_meta = prop.infer(&in_meta)?;
    let outs = outputs_for(op_type, &out_meta, outputs, ctx)?;
    let state = prop.create_operator(ctx, &in_meta)?;
    let n_args = prop.args.len();
    let mut entries = Vec::with_capacity(inputs.len() + outs.len());
    entries.extend(inputs[..n_args].iter().map(|x| Entry { array: Some((*x).clone()), tag: TAG_IN, write: false }));
    entries.extend(outs.iter().map(|o| Entry { array: Some(o.clone()), tag: TAG_OUT, write: true }));
    entries.extend(inputs[n_args..].iter().map(|x| Entry { array: Some((*x).clone()), tag: TAG_AUX, write: true }));
    let reqs = vec![req_code(Req::Write); outs.len()];
    push(&state, OP_FORWARD, entries, reqs, is_train, crate::intern::intern("Custom"))?;
    Ok((outs, state))
}

/// Run the backward of `state` (the operator of a forward call). `inputs` are laid out as
/// `_backward_Custom` takes them: the tensors the property declared as backward dependencies
/// (in its order), then the auxiliary states. `in_grads` (one per argument) are written with
/// `req`.
pub fn backward(
    state: &Arc<CustomState>,
    inputs: &[&NDArray],
    in_grads: &[&NDArray],
    req: &[Req],
    is_train: bool,
) -> Result<()> {
    let prop = &state.prop;
    let op_type = &*prop.op_type;
    let (n_args, n_out, n_aux, n_dep) = (prop.args.len(), prop.outputs.len(), prop.aux.len(), prop.bwd_deps.len());
    if inputs.len() != n_dep + n_aux {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}) takes {} inputs ({n_dep} declared dependencies and {n_aux} auxiliary states), got {}",
            n_dep + n_aux,
            inputs.len()
        )));
    }
    if in_grads.len() != n_args || req.len() != n_args {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}) produces {n_args} input gradients, got {} arrays and {} reqs",
            in_grads.len(),
            req.len()
        )));
    }
    let ctx = common_ctx(op_type, &[inputs, in_grads].concat())?;
    if ctx != state.ctx {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}): arrays on {ctx}, the operator runs on {}",
            state.ctx
        )));
    }
    // Stock's layout: output gradients, inputs, outputs (undeclared ones empty), then input
    // gradients and auxiliary states.
    let mut entries: Vec<Entry> = (0..2 * n_out + n_args)
        .map(|i| Entry {
            array: None,
            tag: if i < n_out {
                TAG_OUT_GRAD
            } else if i < n_out + n_args {
                TAG_IN
            } else {
                TAG_OUT
            },
            write: false,
        })
        .collect();
    for (&d, x) in prop.bwd_deps.iter().zip(inputs) {
        entries[d].array = Some((*x).clone());
    }
    entries.extend(in_grads.iter().map(|g| Entry { array: Some((*g).clone()), tag: TAG_IN_GRAD, write: true }));
    entries.extend(inputs[n_dep..].iter().map(|a| Entry { array: Some((*a).clone()), tag: TAG_AUX, write: true }));
    let reqs = req.iter().map(|&r| req_code(r)).collect();
    push(state, OP_BACKWARD, entries, reqs, is_train, crate::intern::intern("_backward_Custom"))
}

/// Push the asynchronous operation that runs callback `which` of `state` on `entries`.
fn push(
    state: &Arc<CustomState>,
    which: usize,
    entries: Vec<Entry>,
    reqs: Vec<c_int>,
    is_train: bool,
    name: Arc<str>,
) -> Result<()> {
    let (f, cctx) = state.cbs.get(which).ok_or_else(|| {
        Error::mxnet(format!("custom operator {}: the operator has no callback {which}", state.prop.op_type))
    })?;
    // SAFETY: forward and backward callbacks have stock's signature.
    let callback = unsafe { std::mem::transmute::<*const (), FbFn>(f) };
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for e in entries.iter().filter(|e| e.write) {
        push_unique(&mut writes, e.array.as_ref().expect("written arrays exist").chunk()?);
    }
    for e in entries.iter().filter(|e| !e.write) {
        if let Some(a) = &e.array {
            let c = a.chunk()?;
            if !writes.iter().any(|w| Arc::ptr_eq(w, c)) {
                push_unique(&mut reads, c);
            }
        }
    }
    // One alias per distinct chunk, so that the frontend's operations on two views of one
    // array (an input that is also an output) are ordered.
    let mut aliases: Vec<(Arc<Var>, Arc<Var>)> = Vec::new();
    let mut views = Vec::with_capacity(entries.len());
    for e in &entries {
        views.push(match &e.array {
            None => None,
            Some(a) => {
                let c = a.chunk()?;
                a.data()?; // allocate a delayed array before the frontend sees it
                let alias = match aliases.iter().find(|(real, _)| Arc::ptr_eq(real, c)) {
                    Some((_, al)) => al.clone(),
                    None => {
                        let al = Var::alias(c);
                        aliases.push((c.clone(), al.clone()));
                        al
                    }
                };
                Some(a.through_alias(&alias)?)
            }
        });
    }
    let job = CallbackJob {
        state: state.clone(),
        which,
        callback,
        cctx: SendPtr(cctx),
        views,
        tags: entries.iter().map(|e| e.tag).collect(),
        reqs,
        is_train,
        aliases: aliases.into_iter().map(|(_, al)| al).collect(),
    };
    let ctx = state.ctx;
    let mut p = Push::asynchronous(
        move |_, completion| {
            worker::submit(Box::new(move |ready: Result<()>| match ready {
                Ok(()) => job.run(completion),
                Err(e) => completion.complete(Err(e)),
            }))
        },
        reads,
        writes,
    );
    p.ctx = ctx;
    p.name = Some(&name);
    engine::global()?.submit(p)
}

#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: an opaque callback context, only handed back to the frontend's callback.
unsafe impl Send for SendPtr {}

/// A forward or backward callback waiting for a custom-operator thread.
struct CallbackJob {
    state: Arc<CustomState>,
    which: usize,
    callback: FbFn,
    cctx: SendPtr,
    views: Vec<Option<NDArray>>,
    tags: Vec<c_int>,
    reqs: Vec<c_int>,
    is_train: bool,
    aliases: Vec<Arc<Var>>,
}

impl CallbackJob {
    /// On a custom-operator thread: call the frontend, then complete the operation once
    /// everything the frontend pushed on the arrays has finished.
    fn run(self, completion: Completion) {
        let CallbackJob { state, which, callback, cctx, views, mut tags, mut reqs, is_train, aliases } = self;
        let op_type = state.prop.op_type.clone();
        let ctx = state.ctx;
        // The frontend owns these handles from here (its NDArray objects free them).
        let mut handles: Vec<*mut c_void> =
            views.into_iter().map(|v| arrays().insert(Arc::new(v.unwrap_or_else(NDArray::none)))).collect();
        let what = if which == OP_FORWARD { "forward" } else { "backward" };
        let was_training = invoke::set_training(is_train);
        let ok = callback_scope(&op_type, || {
            // SAFETY: stock's signature; the arrays hold one entry per handle (reqs: one per
            // written output), valid for the call.
            unsafe {
                callback(
                    handles.len() as c_int,
                    handles.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    reqs.as_mut_ptr(),
                    is_train as c_int,
                    cctx.0,
                )
            }
        });
        invoke::set_training(was_training);
        // Release the operator here, on this thread, before the operation completes (unless a
        // caller keeps it for a backward): its delete callback enters the frontend too.
        drop(state);
        let mut result = if ok != 0 { Ok(()) } else { Err(failed(&op_type, &format!("CustomOp.{what}"))) };
        let watched = aliases.clone();
        let mut p = Push::sync(
            move |_| {
                for v in &watched {
                    if let Some(e) = v.take_failure() {
                        if result.is_ok() {
                            result = Err(Error::new(e.kind(), format!("custom operator {op_type}: {}", e.message())));
                        }
                    }
                }
                completion.complete(result);
                Ok(())
            },
            vec![],
            aliases,
        );
        p.prop = FnProperty::NoSkip;
        p.ctx = ctx;
        let name = crate::intern::intern("CustomOperator");
        p.name = Some(&name);
        // A failed push drops the completion, which then fails the operation.
        if let Ok(e) = engine::global() {
            let _ = e.submit(p);
        }
    }
}

const CUSTOM_PARAMS: &[ParamSpec] = &[ParamSpec::req(
    "op_type",
    PType::Str,
    "Name of the custom operator. This is the name that is passed to `mx.operator.register` to register the operator.",
)];

fn no_kernel(op: &'static str) -> super::ComputeFn {
    Box::new(move |_, _, _| Err(Error::internal(format!("{op} runs through its own invocation, not a kernel"))))
}

fn invoke_custom(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<Vec<NDArray>> {
    if let Some(given) = outputs {
        crate::autograd::check_writable(given)?;
    }
    let (outs, state) = forward(attrs.str("op_type"), attrs.extra(), inputs, outputs, invoke::is_training())?;
    if !crate::autograd::is_recording() {
        return Ok(outs);
    }
    let n = outs.len();
    let rec = Arc::new(Recorded {
        state,
        inputs: inputs.iter().map(|x| x.detached()).collect(),
        outputs: outs.iter().map(|x| x.detached()).collect(),
    });
    Ok(crate::autograd::record_with(op, &attrs, inputs, outs, n, Some(rec)))
}

/// A custom operator call recorded by autograd: its operator and tensors.
struct Recorded {
    state: Arc<CustomState>,
    /// Arguments then auxiliary states.
    inputs: Vec<NDArray>,
    outputs: Vec<NDArray>,
}

impl crate::autograd::function::CustomBackward for Recorded {
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>> {
        let prop = &self.state.prop;
        let (n_args, n_out) = (prop.args.len(), prop.outputs.len());
        let mut deps: Vec<&NDArray> = Vec::with_capacity(prop.bwd_deps.len() + prop.aux.len());
        for &d in &prop.bwd_deps {
            deps.push(if d < n_out {
                &ograds[d]
            } else if d < n_out + n_args {
                &self.inputs[d - n_out]
            } else {
                &self.outputs[d - n_out - n_args]
            });
        }
        deps.extend(self.inputs[n_args..].iter());
        let mut grads = Vec::with_capacity(n_args);
        let mut req = Vec::with_capacity(n_args);
        for (i, x) in self.inputs[..n_args].iter().enumerate() {
            let w = want.get(i).copied().unwrap_or(false);
            grads.push(if w {
                NDArray::new(x.shape.clone(), self.state.ctx, x.dtype, false)?
            } else {
                NDArray::new(x.shape.clone(), self.state.ctx, x.dtype, true)?
            });
            req.push(if w { Req::Write } else { Req::Null });
        }
        let refs: Vec<&NDArray> = grads.iter().collect();
        backward(&self.state, &deps, &refs, &req, invoke::is_training())?;
        let mut out: Vec<Option<NDArray>> =
            grads.into_iter().zip(req).map(|(g, r)| (r == Req::Write).then_some(g)).collect();
        out.resize(self.inputs.len(), None);
        Ok(out)
    }
}

fn invoke_backward(
    _: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: super::param::Attrs,
) -> Result<Vec<NDArray>> {
    let op_type = attrs.str("op_type");
    let prop = Prop::create(op_type, attrs.extra())?;
    let (n_args, n_out, n_aux, n_dep) = (prop.args.len(), prop.outputs.len(), prop.aux.len(), prop.bwd_deps.len());
    if inputs.len() != n_dep + n_aux {
        return Err(Error::value(format!(
            "_backward_Custom ({op_type}) takes {} inputs ({n_dep} declared dependencies and {n_aux} auxiliary states), got {}",
            n_dep + n_aux,
            inputs.len()
        )));
    }
    let ctx = common_ctx(op_type, inputs)?;
    // The forward inputs' metas: from the caller's gradient arrays, else from the inputs
    // among the dependencies.
    let arg_meta: Vec<Meta> = match outputs {
        Some(g) if g.len() == n_args => g.iter().map(|x| Meta::new(x.shape.clone(), x.dtype)).collect(),
        Some(g) => {
            return Err(Error::value(format!("_backward_Custom ({op_type}) produces {n_args} input gradients, {} given", g.len())))
        }
        None => (0..n_args)
            .map(|i| {
                let k = prop.bwd_deps.iter().position(|&d| d == n_out + i).ok_or_else(|| {
                    Error::value(format!(
                        "_backward_Custom ({op_type}): input {i} is not a declared backward dependency, so its gradient's shape is unknown; pass the gradient arrays as out="
                    ))
                })?;
                Ok(Meta::new(inputs[k].shape.clone(), inputs[k].dtype))
            })
            .collect::<Result<_>>()?,
    };
    let grads = outputs_for(op_type, &arg_meta, outputs, ctx)?;
    let mut in_meta = arg_meta;
    in_meta.extend(inputs[n_dep..].iter().map(|a| Meta::new(a.shape.clone(), a.dtype)));
    let state = prop.create_operator(ctx, &in_meta)?;
    let refs: Vec<&NDArray> = grads.iter().collect();
    backward(&state, inputs, &refs, &vec![Req::Write; n_args], invoke::is_training())?;
    Ok(grads)
}

/// The number of outputs of a `Custom` call (asks the frontend; 0 when it fails, and the call
/// itself then reports why).
fn num_outputs(a: &super::param::Attrs) -> usize {
    Prop::create(a.str("op_type"), a.extra()).map_or(0, |p| p.outputs.len())
}

/// The number of outputs of a `_backward_Custom` call: one gradient per argument.
fn num_in_grads(a: &super::param::Attrs) -> usize {
    Prop::create(a.str("op_type"), a.extra()).map_or(0, |p| p.args.len())
}

pub(super) fn register(ops: &mut Vec<OpDef>) {
    ops.push(
        OpDef::new(
            "Custom",
            Inputs::Variadic("data"),
            Box::new(|a, inputs| Prop::create(a.str("op_type"), a.extra())?.infer(inputs)),
            no_kernel("Custom"),
        )
        .alias(&["_npi_Custom"])
        .params(CUSTOM_PARAMS)
        .open_params()
        .invoke_with(invoke_custom)
        .outputs(num_outputs, num_outputs)
        .grad(Grad::Stateful { op: "_backward_Custom" })
        .doc("Apply a custom operator implemented in a frontend language (like Python).\n\nCustom operators should override required methods like `forward` and `backward`.\nThe custom operator must be registered before it can be used (mx.operator.register)."),
    );
    ops.push(
        OpDef::new(
            "_backward_Custom",
            Inputs::Variadic("data"),
            Box::new(|a, _| Err(Error::not_supported(format!("shape inference of _backward_Custom ({})", a.str("op_type"))))),
            no_kernel("_backward_Custom"),
        )
        .params(CUSTOM_PARAMS)
        .open_params()
        .invoke_with(invoke_backward)
        .outputs(num_in_grads, num_in_grads)
        .doc("The backward of a custom operator: the declared backward dependencies and the auxiliary states in, one gradient per argument out."),
    );
    // Recorded by MXCustomFunctionRecord (autograd.Function); its backward is the frontend's.
    ops.push(
        OpDef::new(
            "_CustomFunction",
            Inputs::Variadic("data"),
            Box::new(|_, _| {
                Err(Error::not_supported("calling _CustomFunction directly (autograd.Function records it)"))
            }),
            no_kernel("_CustomFunction"),
        )
        .not_supported()
        .grad(Grad::Stateful { op: "_backward_CustomFunction" })
        .doc("An autograd.Function call (recorded by MXCustomFunctionRecord)."),
    );
}

#[cfg(test)]
mod tests;
