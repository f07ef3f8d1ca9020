//! C API: the symbolic Executor (MXExecutorBindEX, MXExecutorSimpleBindEx, Forward,
//! Backward[Ex], Outputs, Print, Free). Bound graphs run through `executor::bind`; outputs use
//! a per-thread array valid until the next `MXExecutorOutputs` on the same thread, and
//! SimpleBind's array lists likewise until its next call.

use super::ffi::{self, cstr};
use super::ndarray::arrays;
use super::types::{ExecutorHandle, NDArrayHandle, SymbolHandle};
use crate::handle::HandleTable;
use mxnet_core::autograd::GradReq;
use mxnet_core::context::Context;
use mxnet_core::error::{Error, Result};
use mxnet_core::executor::bind::Executor;
use mxnet_core::ndarray::{DType, NDArray};
use mxnet_core::symbol::infer::{self, Given};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::sync::{Arc, OnceLock};

fn executors() -> &'static HandleTable<Executor> {
    static T: OnceLock<HandleTable<Executor>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(12, "Executor"))
}

/// The three handle arrays `MXExecutorBindEX` returns (arguments, gradients, auxiliary states).
type BindArrays = (Vec<NDArrayHandle>, Vec<NDArrayHandle>, Vec<NDArrayHandle>);

thread_local! {
    static OUTPUTS: RefCell<Vec<NDArrayHandle>> = const { RefCell::new(Vec::new()) };
    static BIND_OUT: RefCell<Box<BindArrays>> = RefCell::new(Box::default());
    static PRINT: RefCell<CString> = RefCell::new(CString::default());
}

/// # Safety
/// `p` must hold `n` values when `n > 0`.
unsafe fn list<'a, T>(p: *const T, n: u32, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

fn array(h: NDArrayHandle) -> Result<Option<NDArray>> {
    if h.is_null() {
        Ok(None)
    } else {
        arrays().get(h).map(|a| Some((*a).clone()))
    }
}

/// Bind a symbol to arrays: `in_args`, `arg_grad_store` (entries may be NULL) and
/// `grad_req_type` (0 null, 1 write, 2 in-place, 3 add) in `list_arguments` order, `aux_states`
/// in `list_auxiliary_states` order. Device maps are not supported (one CPU context);
/// `shared_exec`, when given, must be a live executor (its memory is not shared).
///
/// # Safety
/// Arrays must hold the counts given; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorBindEX(
    symbol_handle: SymbolHandle,
    dev_type: c_int,
    dev_id: c_int,
    num_map_keys: u32,
    map_keys: *mut *const c_char,
    map_dev_types: *const c_int,
    map_dev_ids: *const c_int,
    len: u32,
    in_args: *mut NDArrayHandle,
    arg_grad_store: *mut NDArrayHandle,
    grad_req_type: *mut u32,
    aux_states_len: u32,
    aux_states: *mut NDArrayHandle,
    shared_exec: ExecutorHandle,
    out: *mut ExecutorHandle,
) -> c_int {
    let _ = (map_keys, map_dev_types, map_dev_ids);
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXExecutorBindEX", out, "out", || {
            Context::from_codes(dev_type, dev_id)?.check_available()?;
            // Memory is not shared with `shared_exec` (results are the same without), but the
            // handle must be a live executor.
            if !shared_exec.is_null() {
                executors().get(shared_exec)?;
            }
            if num_map_keys > 0 {
                return Err(Error::not_supported("group2ctx device maps in bind"));
            }
            let sym = super::symbol::symbol(symbol_handle)?;
            let args = list(in_args, len, "in_args")?
                .iter()
                .map(|&h| array(h)?.ok_or_else(|| Error::value("in_args holds a NULL handle")))
                .collect::<Result<Vec<_>>>()?;
            let grads = if arg_grad_store.is_null() {
                vec![None; len as usize]
            } else {
                list(arg_grad_store, len, "arg_grad_store")?.iter().map(|&h| array(h)).collect::<Result<Vec<_>>>()?
            };
            let reqs = if grad_req_type.is_null() {
                vec![GradReq::Null; len as usize]
            } else {
                list(grad_req_type, len, "grad_req_type")?
                    .iter()
                    .map(|&r| GradReq::from_code(r))
                    .collect::<Result<Vec<_>>>()?
            };
            let aux = list(aux_states, aux_states_len, "aux_states")?
                .iter()
                .map(|&h| array(h)?.ok_or_else(|| Error::value("aux_states holds a NULL handle")))
                .collect::<Result<Vec<_>>>()?;
            Ok(executors().insert(Arc::new(Executor::bind(&sym, args, grads, reqs, aux)?)))
        })
    }
}

fn req_from_name(s: &str) -> Result<GradReq> {
    match s {
        "null" => Ok(GradReq::Null),
        "write" | "inplace" => Ok(GradReq::Write),
        "add" => Ok(GradReq::Add),
        _ => Err(Error::value(format!("grad_req '{s}' is not one of null, write, inplace, add"))),
    }
}

/// Bind with arrays allocated here from shapes (and dtypes) given by name; see stock's
/// documentation of the arguments. Shared buffers, shared executors, device maps and
/// non-default storage types are not supported.
///
/// # Safety
/// Arrays must hold the counts given; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorSimpleBindEx(
    symbol_handle: SymbolHandle,
    dev_type: c_int,
    dev_id: c_int,
    num_g2c_keys: u32,
    g2c_keys: *mut *const c_char,
    g2c_dev_types: *const c_int,
    g2c_dev_ids: *const c_int,
    provided_grad_req_list_len: u32,
    provided_grad_req_names: *mut *const c_char,
    provided_grad_req_types: *mut *const c_char,
    num_provided_arg_shapes: u32,
    provided_arg_shape_names: *mut *const c_char,
    provided_arg_shape_data: *const c_int,
    provided_arg_shape_idx: *const u32,
    num_provided_arg_dtypes: u32,
    provided_arg_dtype_names: *mut *const c_char,
    provided_arg_dtypes: *const c_int,
    num_provided_arg_stypes: u32,
    provided_arg_stype_names: *mut *const c_char,
    provided_arg_stypes: *const c_int,
    num_shared_arg_names: u32,
    shared_arg_name_list: *mut *const c_char,
    shared_buffer_len: *mut c_int,
    shared_buffer_name_list: *mut *const c_char,
    shared_buffer_handle_list: *mut NDArrayHandle,
    updated_shared_buffer_name_list: *mut *mut *const c_char,
    updated_shared_buffer_handle_list: *mut *mut NDArrayHandle,
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
    shared_exec_handle: ExecutorHandle,
    out: *mut ExecutorHandle,
) -> c_int {
    let _ = (
        g2c_keys,
        g2c_dev_types,
        g2c_dev_ids,
        provided_arg_stype_names,
        shared_arg_name_list,
        shared_buffer_name_list,
        shared_buffer_handle_list,
        updated_shared_buffer_name_list,
        updated_shared_buffer_handle_list,
    );
    ffi::call("MXExecutorSimpleBindEx", || {
        let ctx = Context::from_codes(dev_type, dev_id)?.check_available()?;
        if num_g2c_keys > 0 {
            return Err(Error::not_supported("group2ctx device maps in simple_bind"));
        }
        if num_shared_arg_names > 0
            || !shared_exec_handle.is_null()
            || (!shared_buffer_len.is_null() && unsafe { *shared_buffer_len } > 0)
        {
            return Err(Error::not_supported("shared arguments, buffers or executors in simple_bind"));
        }
        // SAFETY: per this function's contract.
        unsafe {
            if list(provided_arg_stypes, num_provided_arg_stypes, "provided_arg_stypes")?.iter().any(|&s| s != 0) {
                return Err(Error::not_supported("sparse storage types in simple_bind"));
            }
            let sym = super::symbol::symbol(symbol_handle)?;
            let names = list(provided_arg_shape_names, num_provided_arg_shapes, "provided_arg_shape_names")?;
            let idx = list(provided_arg_shape_idx, num_provided_arg_shapes + 1, "provided_arg_shape_idx")?;
            let mut shapes = Vec::with_capacity(names.len());
            for (k, &n) in names.iter().enumerate() {
                let (a, b) = (idx[k] as usize, idx[k + 1] as usize);
                if b < a {
                    return Err(Error::value("provided_arg_shape_idx is not increasing"));
                }
                let dims = list(provided_arg_shape_data.add(a), (b - a) as u32, "provided_arg_shape_data")?;
                shapes.push((cstr(n, "shape name")?.to_string(), Some(dims.iter().map(|&d| d as i64).collect())));
            }
            let dnames = list(provided_arg_dtype_names, num_provided_arg_dtypes, "provided_arg_dtype_names")?;
            let dcodes = list(provided_arg_dtypes, num_provided_arg_dtypes, "provided_arg_dtypes")?;
            let dtypes = dnames
                .iter()
                .zip(dcodes)
                .map(|(&n, &c)| Ok((cstr(n, "dtype name")?.to_string(), Some(DType::from_code(c)?))))
                .collect::<Result<Vec<_>>>()?;
            let s = infer::infer_shapes(&sym, Given::Keyword(shapes), mxnet_core::ndarray::np_shape::get() != 0)?;
            if !s.complete {
                return Err(Error::mxnet("simple_bind: the given shapes do not determine every argument's shape"));
            }
            let t = infer::infer_types(&sym, Given::Keyword(dtypes))?;
            let arg_names = sym.list_input_names(mxnet_core::symbol::InputKind::Args);
            let rnames = list(provided_grad_req_names, provided_grad_req_list_len, "provided_grad_req_names")?;
            let rtypes = list(provided_grad_req_types, provided_grad_req_list_len, "provided_grad_req_types")?;
            let mut reqs = vec![GradReq::Write; arg_names.len()];
            if provided_grad_req_list_len > 0 && provided_grad_req_names.is_null() {
                // One request for all.
                let r = req_from_name(cstr(rtypes[0], "grad req")?)?;
                reqs.iter_mut().for_each(|x| *x = r);
            } else if provided_grad_req_list_len > 0 {
                for (&n, &r) in rnames.iter().zip(rtypes) {
                    let (n, r) = (cstr(n, "grad req name")?, req_from_name(cstr(r, "grad req")?)?);
                    let k = arg_names
                        .iter()
                        .position(|a| a == n)
                        .ok_or_else(|| Error::value(format!("grad_req names unknown argument {n}")))?;
                    reqs[k] = r;
                }
            }
            let alloc = |shape: &Option<Vec<i64>>, dt: &Option<DType>| -> Result<NDArray> {
                let shape: Vec<usize> = shape.as_ref().expect("complete").iter().map(|&d| d as usize).collect();
                let a = NDArray::new(shape, ctx, dt.unwrap_or(DType::F32), false)?;
                mxnet_core::autograd::invoke(
                    mxnet_core::op::lookup("zeros_like")?,
                    &[&a],
                    Some(&[&a]),
                    std::iter::empty(),
                )?;
                Ok(a)
            };
            let args: Vec<NDArray> = s.args.iter().zip(&t.args).map(|(sh, dt)| alloc(sh, dt)).collect::<Result<_>>()?;
            let grads: Vec<Option<NDArray>> = s
                .args
                .iter()
                .zip(&t.args)
                .zip(&reqs)
                .map(|((sh, dt), r)| if *r == GradReq::Null { Ok(None) } else { alloc(sh, dt).map(Some) })
                .collect::<Result<_>>()?;
            let aux: Vec<NDArray> = s.aux.iter().zip(&t.aux).map(|(sh, dt)| alloc(sh, dt)).collect::<Result<_>>()?;
            let exec = Executor::bind(&sym, args.clone(), grads.clone(), reqs, aux.clone())?;
            BIND_OUT.with(|slot| -> Result<()> {
                let mut slot = slot.borrow_mut();
                let (a, g, x) = &mut **slot;
                *a = args.into_iter().map(|v| arrays().insert(Arc::new(v))).collect();
                *g = grads
                    .into_iter()
                    .map(|v| v.map_or(std::ptr::null_mut(), |v| arrays().insert(Arc::new(v))))
                    .collect();
                *x = aux.into_iter().map(|v| arrays().insert(Arc::new(v))).collect();
                *ffi::out(num_in_args, "num_in_args")? = a.len() as u32;
                *ffi::out(in_args, "in_args")? = a.as_mut_ptr();
                *ffi::out(arg_grads, "arg_grads")? = g.as_mut_ptr();
                *ffi::out(num_aux_states, "num_aux_states")? = x.len() as u32;
                *ffi::out(aux_states, "aux_states")? = x.as_mut_ptr();
                Ok(())
            })?;
            *ffi::out(out, "out")? = executors().insert(Arc::new(exec));
            Ok(())
        }
    })
}

/// Run forward (`is_train`: record for backward, training mode).
#[no_mangle]
pub extern "C" fn MXExecutorForward(handle: ExecutorHandle, is_train: c_int) -> c_int {
    ffi::call("MXExecutorForward", || executors().get(handle)?.forward(is_train != 0))
}

/// # Safety
/// `head_grads` must hold `len` handles (entries may be NULL) when `len > 0`.
unsafe fn backward(handle: ExecutorHandle, len: u32, head_grads: *mut NDArrayHandle, is_train: bool) -> Result<()> {
    let e = executors().get(handle)?;
    // SAFETY: per this function's contract.
    let hg = unsafe { list(head_grads, len, "head_grads")? }.iter().map(|&h| array(h)).collect::<Result<Vec<_>>>()?;
    e.backward(&hg, is_train)
}

/// Backward from the last training forward into the bound gradient arrays.
///
/// # Safety
/// `head_grads` must hold `len` handles when `len > 0`.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorBackwardEx(
    handle: ExecutorHandle,
    len: u32,
    head_grads: *mut NDArrayHandle,
    is_train: c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorBackwardEx", || unsafe { backward(handle, len, head_grads, is_train != 0) })
}

/// [`MXExecutorBackwardEx`] in training mode.
///
/// # Safety
/// As for [`MXExecutorBackwardEx`].
#[no_mangle]
pub unsafe extern "C" fn MXExecutorBackward(handle: ExecutorHandle, len: u32, head_grads: *mut NDArrayHandle) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorBackward", || unsafe { backward(handle, len, head_grads, true) })
}

/// New handles to the outputs of the last forward.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorOutputs(
    handle: ExecutorHandle,
    out_size: *mut u32,
    out_arr: *mut *mut NDArrayHandle,
) -> c_int {
    ffi::call("MXExecutorOutputs", || {
        let e = executors().get(handle)?;
        let outs = e.outputs();
        if outs.is_empty() {
            return Err(Error::mxnet("the executor has no outputs yet (call forward first)"));
        }
        OUTPUTS.with(|slot| -> Result<()> {
            let mut hs = slot.borrow_mut();
            *hs = outs.into_iter().map(|o| arrays().insert(Arc::new(o))).collect();
            // SAFETY: per this function's contract.
            unsafe {
                *ffi::out(out_size, "out_size")? = hs.len() as u32;
                *ffi::out(out_arr, "out")? = hs.as_mut_ptr();
            }
            Ok(())
        })
    })
}

/// A description of the executor.
///
/// # Safety
/// `out_str` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorPrint(handle: ExecutorHandle, out_str: *mut *const c_char) -> c_int {
    ffi::call("MXExecutorPrint", || {
        let e = executors().get(handle)?;
        let text = CString::new(e.describe()).map_err(|_| Error::internal("NUL in executor description"))?;
        PRINT.with(|p| -> Result<()> {
            *p.borrow_mut() = text;
            // SAFETY: per this function's contract.
            unsafe { *ffi::out(out_str, "out_str")? = p.borrow().as_ptr() };
            Ok(())
        })
    })
}

/// Free an executor (a second free is an error).
#[no_mangle]
pub extern "C" fn MXExecutorFree(handle: ExecutorHandle) -> c_int {
    ffi::call("MXExecutorFree", || executors().remove(handle).map(drop))
}
