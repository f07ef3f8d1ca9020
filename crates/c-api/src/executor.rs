//! C API: the symbolic Executor (MXExecutorBind[X|EX], MXExecutorSimpleBind[Ex|Ex64] with
//! the Module API's shared parameters, buffers and executors, MXExecutorReshape[Ex], Forward,
//! Backward[Ex], Outputs, SetMonitorCallback[EX], GetOptimizedSymbol, Print, Free). Bound
//! graphs run through `executor::bind`; outputs use a per-thread array valid until the next
//! `MXExecutorOutputs` on the same thread, and the array lists of SimpleBind and Reshape
//! likewise until the next such call.

use super::ffi::{self, cstr, list};
use super::ndarray::arrays;
use super::types::{ExecutorHandle, ExecutorMonitorCallback, NDArrayHandle, SymbolHandle};
use crate::handle::HandleTable;
use mxnet_core::autograd::GradReq;
use mxnet_core::context::Context;
use mxnet_core::error::{Error, Result};
use mxnet_core::executor::bind::{Executor, Sharing};
use mxnet_core::executor::Monitor;
use mxnet_core::ndarray::{DType, NDArray};
use mxnet_core::symbol::infer::{self, Given};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

fn executors() -> &'static HandleTable<Executor> {
    static T: OnceLock<HandleTable<Executor>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(12, "Executor"))
}

/// The three handle arrays `MXExecutorBindEX` returns (arguments, gradients, auxiliary states).
type BindArrays = (Vec<NDArrayHandle>, Vec<NDArrayHandle>, Vec<NDArrayHandle>);

/// The shared buffer SimpleBind hands back: names (and their C strings) and new handles.
type BufferOut = (Vec<CString>, Vec<*const c_char>, Vec<NDArrayHandle>);

thread_local! {
    static OUTPUTS: RefCell<Vec<NDArrayHandle>> = const { RefCell::new(Vec::new()) };
    static BIND_OUT: RefCell<Box<BindArrays>> = RefCell::new(Box::default());
    static BUFFER_OUT: RefCell<Box<BufferOut>> = RefCell::new(Box::default());
    static PRINT: RefCell<CString> = RefCell::new(CString::default());
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
/// in `list_auxiliary_states` order. Device maps are accepted when every device is the host (see `group2ctx`);
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
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXExecutorBindEX", out, "out", || {
            let ctx = Context::from_codes(dev_type, dev_id)?.check_available()?;
            // Memory is not shared with `shared_exec` (results are the same without), but the
            // handle must be a live executor.
            if !shared_exec.is_null() {
                executors().get(shared_exec)?;
            }
            group2ctx(ctx, num_map_keys, map_keys, map_dev_types, map_dev_ids, "bind")?;
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

/// [`MXExecutorBindEX`] without a shared executor.
///
/// # Safety
/// As for [`MXExecutorBindEX`].
#[no_mangle]
pub unsafe extern "C" fn MXExecutorBindX(
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
    out: *mut ExecutorHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        MXExecutorBindEX(
            symbol_handle,
            dev_type,
            dev_id,
            num_map_keys,
            map_keys,
            map_dev_types,
            map_dev_ids,
            len,
            in_args,
            arg_grad_store,
            grad_req_type,
            aux_states_len,
            aux_states,
            std::ptr::null_mut(),
            out,
        )
    }
}

/// [`MXExecutorBindEX`] without device maps or a shared executor.
///
/// # Safety
/// As for [`MXExecutorBindEX`].
#[no_mangle]
pub unsafe extern "C" fn MXExecutorBind(
    symbol_handle: SymbolHandle,
    dev_type: c_int,
    dev_id: c_int,
    len: u32,
    in_args: *mut NDArrayHandle,
    arg_grad_store: *mut NDArrayHandle,
    grad_req_type: *mut u32,
    aux_states_len: u32,
    aux_states: *mut NDArrayHandle,
    out: *mut ExecutorHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        MXExecutorBindEX(
            symbol_handle,
            dev_type,
            dev_id,
            0,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
            len,
            in_args,
            arg_grad_store,
            grad_req_type,
            aux_states_len,
            aux_states,
            std::ptr::null_mut(),
            out,
        )
    }
}

/// A request by name, as simple_bind takes them (stock's: no `inplace` here).
fn req_from_name(s: &str) -> Result<GradReq> {
    match s {
        "null" => Ok(GradReq::Null),
        "write" => Ok(GradReq::Write),
        "add" => Ok(GradReq::Add),
        _ => Err(Error::mxnet(format!(
            "grad_req={s} is not a valid input in simple_bind; only 'null', 'write', and 'add' are supported"
        ))),
    }
}

/// The gradient requests of simple_bind, one per argument, by stock's four forms: one for all
/// (`len` 0, no names, one type: the frontend's `grad_req='write'`), a list (`len` = the number
/// of arguments, no names), a dict (names and types; arguments not named get none), or
/// nothing (no types: no argument gets a gradient).
///
/// # Safety
/// `names` (when not NULL) and `types` must hold `len` strings, or `types` one when `len` is 0.
unsafe fn grad_reqs(
    arg_names: &[String],
    len: u32,
    names: *const *const c_char,
    types: *const *const c_char,
) -> Result<Vec<GradReq>> {
    let mut reqs = vec![GradReq::Null; arg_names.len()];
    if types.is_null() {
        return Ok(reqs);
    }
    // SAFETY: per this function's contract.
    unsafe {
        if len == 0 {
            let r = req_from_name(cstr(*types, "grad req")?)?;
            reqs.iter_mut().for_each(|x| *x = r);
        } else if names.is_null() {
            if len as usize != arg_names.len() {
                return Err(Error::mxnet(format!(
                    "The length of grad_req list does not match the number of input arguments in simple_bind, \
                     expected {}, provided {len}",
                    arg_names.len()
                )));
            }
            for (x, &t) in reqs.iter_mut().zip(list(types, len, "provided_grad_req_types")?) {
                *x = req_from_name(cstr(t, "grad req")?)?;
            }
        } else {
            let names = list(names, len, "provided_grad_req_names")?;
            let types = list(types, len, "provided_grad_req_types")?;
            for (&n, &t) in names.iter().zip(types) {
                let (n, r) = (cstr(n, "grad req name")?, req_from_name(cstr(t, "grad req")?)?);
                // As stock: a name that is no argument is ignored.
                if let Some(k) = arg_names.iter().position(|a| a == n) {
                    reqs[k] = r;
                }
            }
        }
    }
    Ok(reqs)
}

/// Group-to-context maps (model parallelism), by group name: accepted when the default
/// device and every device they name are the host (CPU contexts share one memory, so every
/// operator can read every array); maps onto GPUs are not supported yet.
///
/// # Safety
/// `keys`, `types` and `ids` must hold `n` values when `n > 0`.
unsafe fn group2ctx(
    default: Context,
    n: u32,
    keys: *const *const c_char,
    types: *const c_int,
    ids: *const c_int,
    what: &str,
) -> Result<BTreeMap<String, Context>> {
    // SAFETY: per this function's contract.
    let (keys, types, ids) = unsafe {
        (
            list(keys, n, "group2ctx keys")?,
            list(types, n, "group2ctx device types")?,
            list(ids, n, "group2ctx device ids")?,
        )
    };
    let mut map = BTreeMap::new();
    for ((&k, &t), &i) in keys.iter().zip(types).zip(ids) {
        let c = Context::from_codes(t, i)?;
        if !(default.dev_type.is_host() && c.dev_type.is_host()) {
            return Err(Error::not_supported(format!("group2ctx device maps onto GPUs in {what}")));
        }
        // SAFETY: per this function's contract.
        map.insert(unsafe { cstr(k, "group2ctx key") }?.to_string(), c);
    }
    Ok(map)
}

/// `names[k]` with the dimensions `data[idx[k]..idx[k + 1]]` (the frontend's shape lists).
///
/// # Safety
/// `names` must hold `n` strings, `idx` `n + 1` offsets and `data` `idx[n]` values.
unsafe fn named_shapes<T: Copy + Into<i64>>(
    n: u32,
    names: *const *const c_char,
    data: *const T,
    idx: *const u32,
) -> Result<Vec<(String, Vec<i64>)>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: per this function's contract.
    unsafe {
        let names = list(names, n, "provided_arg_shape_names")?;
        let idx = list(idx, n + 1, "provided_arg_shape_idx")?;
        let mut out = Vec::with_capacity(names.len());
        for (k, &name) in names.iter().enumerate() {
            let (a, b) = (idx[k] as usize, idx[k + 1] as usize);
            if b < a {
                return Err(Error::value("provided_arg_shape_idx is not increasing"));
            }
            if b > a && data.is_null() {
                return Err(Error::value("provided_arg_shape_data is NULL"));
            }
            let dims = list(data.wrapping_add(a), (b - a) as u32, "provided_arg_shape_data")?;
            out.push((cstr(name, "shape name")?.to_string(), dims.iter().map(|&d| d.into()).collect()));
        }
        Ok(out)
    }
}

/// Fails when an out-parameter of SimpleBind or Reshape is NULL.
///
/// # Safety
/// The pointers must be NULL or valid for writes.
unsafe fn check_outs(
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
    out: *mut ExecutorHandle,
) -> Result<()> {
    // SAFETY: per this function's contract (nothing is written).
    unsafe {
        ffi::out(num_in_args, "num_in_args")?;
        ffi::out(in_args, "in_args")?;
        ffi::out(arg_grads, "arg_grads")?;
        ffi::out(num_aux_states, "num_aux_states")?;
        ffi::out(aux_states, "aux_states")?;
        ffi::out(out, "out")?;
    }
    Ok(())
}

/// Hand the bound arrays to the caller through this thread's [`BIND_OUT`].
///
/// # Safety
/// Out-params must be NULL or valid for writes.
unsafe fn hand_out_arrays(
    e: &Executor,
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
) -> Result<()> {
    BIND_OUT.with(|slot| -> Result<()> {
        let mut slot = slot.borrow_mut();
        let (a, g, x) = &mut **slot;
        *a = e.arg_arrays().into_iter().map(|v| arrays().insert(Arc::new(v))).collect();
        *g = e
            .grad_arrays()
            .into_iter()
            .map(|v| v.map_or(std::ptr::null_mut(), |v| arrays().insert(Arc::new(v))))
            .collect();
        *x = e.aux_arrays().into_iter().map(|v| arrays().insert(Arc::new(v))).collect();
        // SAFETY: per this function's contract.
        unsafe {
            *ffi::out(num_in_args, "num_in_args")? = a.len() as u32;
            *ffi::out(in_args, "in_args")? = a.as_mut_ptr();
            *ffi::out(arg_grads, "arg_grads")? = g.as_mut_ptr();
            *ffi::out(num_aux_states, "num_aux_states")? = x.len() as u32;
            *ffi::out(aux_states, "aux_states")? = x.as_mut_ptr();
        }
        Ok(())
    })
}

/// The body of the three SimpleBind entry points, which differ in the type of the shape data.
///
/// # Safety
/// As for [`MXExecutorSimpleBindEx`].
#[allow(clippy::too_many_arguments)]
unsafe fn simple_bind<T: Copy + Into<i64>>(
    symbol_handle: SymbolHandle,
    dev_type: c_int,
    dev_id: c_int,
    num_g2c_keys: u32,
    g2c_keys: *const *const c_char,
    g2c_dev_types: *const c_int,
    g2c_dev_ids: *const c_int,
    provided_grad_req_list_len: u32,
    provided_grad_req_names: *const *const c_char,
    provided_grad_req_types: *const *const c_char,
    num_provided_arg_shapes: u32,
    provided_arg_shape_names: *const *const c_char,
    provided_arg_shape_data: *const T,
    provided_arg_shape_idx: *const u32,
    num_provided_arg_dtypes: u32,
    provided_arg_dtype_names: *const *const c_char,
    provided_arg_dtypes: *const c_int,
    num_provided_arg_stypes: u32,
    provided_arg_stypes: *const c_int,
    num_shared_arg_names: u32,
    shared_arg_name_list: *const *const c_char,
    shared_buffer_len: *mut c_int,
    shared_buffer_name_list: *const *const c_char,
    shared_buffer_handle_list: *const NDArrayHandle,
    updated_shared_buffer_name_list: *mut *mut *const c_char,
    updated_shared_buffer_handle_list: *mut *mut NDArrayHandle,
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
    shared_exec_handle: ExecutorHandle,
    out: *mut ExecutorHandle,
) -> Result<()> {
    // Out-pointers first: nothing is made for a caller who cannot receive it.
    // SAFETY: per this function's contract.
    unsafe { check_outs(num_in_args, in_args, arg_grads, num_aux_states, aux_states, out)? };
    let ctx = Context::from_codes(dev_type, dev_id)?.check_available()?;
    // SAFETY: per this function's contract.
    let groups = unsafe { group2ctx(ctx, num_g2c_keys, g2c_keys, g2c_dev_types, g2c_dev_ids, "simple_bind")? };
    // SAFETY: per this function's contract.
    unsafe {
        if list(provided_arg_stypes, num_provided_arg_stypes, "provided_arg_stypes")?.iter().any(|&s| s != 0) {
            return Err(Error::not_supported("sparse storage types in simple_bind"));
        }
        let sym = super::symbol::symbol(symbol_handle)?;
        let shapes = named_shapes(
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
        )?
        .into_iter()
        .map(|(n, s)| (n, Some(s)))
        .collect();
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
        let reqs = grad_reqs(&arg_names, provided_grad_req_list_len, provided_grad_req_names, provided_grad_req_types)?;
        let spec = |shape: &Option<Vec<i64>>, dt: &Option<DType>| -> (Vec<usize>, DType) {
            let shape = shape.as_ref().map_or(Vec::new(), |s| s.iter().map(|&d| d.max(0) as usize).collect());
            (shape, dt.unwrap_or(DType::F32))
        };
        let args: Vec<_> = s.args.iter().zip(&t.args).map(|(sh, dt)| spec(sh, dt)).collect();
        let aux: Vec<_> = s.aux.iter().zip(&t.aux).map(|(sh, dt)| spec(sh, dt)).collect();
        let shared_exec = if shared_exec_handle.is_null() { None } else { Some(executors().get(shared_exec_handle)?) };
        let arg_names = list(shared_arg_name_list, num_shared_arg_names, "shared_arg_name_list")?
            .iter()
            .map(|&n| cstr(n, "shared argument name").map(str::to_string))
            .collect::<Result<HashSet<_>>>()?;
        // A negative length (or none): the frontend passed no buffer.
        let buffer_len = if shared_buffer_len.is_null() { -1 } else { *shared_buffer_len };
        let mut buffer = if buffer_len < 0 {
            None
        } else {
            let names = list(shared_buffer_name_list, buffer_len as u32, "shared_buffer_name_list")?;
            let handles = list(shared_buffer_handle_list, buffer_len as u32, "shared_buffer_handle_list")?;
            let mut m = BTreeMap::new();
            for (&n, &h) in names.iter().zip(handles) {
                let a = array(h)?.ok_or_else(|| Error::value("shared_buffer_handle_list holds a NULL handle"))?;
                m.insert(cstr(n, "shared buffer name")?.to_string(), a);
            }
            Some(m)
        };
        // As in stock, the shared names and executor count only with a buffer.
        let sharing = buffer.as_mut().map(|buffer| Sharing { arg_names, exec: shared_exec.as_deref(), buffer });
        let exec = Executor::simple_bind(&sym, ctx, &groups, &args, &aux, reqs, sharing)?;
        hand_out_arrays(&exec, num_in_args, in_args, arg_grads, num_aux_states, aux_states)?;
        if let Some(buffer) = buffer {
            BUFFER_OUT.with(|slot| -> Result<()> {
                let mut slot = slot.borrow_mut();
                let (names, ptrs, handles) = &mut **slot;
                *names = buffer
                    .keys()
                    .map(|k| CString::new(k.as_str()).map_err(|_| Error::value("a shared buffer name holds a NUL")))
                    .collect::<Result<_>>()?;
                *ptrs = names.iter().map(|c| c.as_ptr()).collect();
                *handles = buffer.into_values().map(|a| arrays().insert(Arc::new(a))).collect();
                *ffi::out(shared_buffer_len, "shared_buffer_len")? = handles.len() as c_int;
                *ffi::out(updated_shared_buffer_name_list, "updated_shared_buffer_name_list")? = ptrs.as_mut_ptr();
                *ffi::out(updated_shared_buffer_handle_list, "updated_shared_buffer_handle_list")? =
                    handles.as_mut_ptr();
                Ok(())
            })?;
        }
        *ffi::out(out, "out")? = executors().insert(Arc::new(exec));
        Ok(())
    }
}

/// Bind with arrays allocated here from shapes (and dtypes) given by name; see stock's
/// documentation of the arguments. With a shared buffer (`shared_buffer_len` >= 0; as in
/// stock, the shared names and executor are ignored without one), arguments named in
/// `shared_arg_name_list` (the model's parameters) are taken with their gradients from
/// `shared_exec_handle` when given (as are the auxiliary states), else made; the others, and
/// their gradients (`grad of <name>`), reuse the buffer's arrays of that name when large
/// enough, and new ones are added to it. The updated buffer comes back as new handles.
/// Device maps onto GPUs and non-default storage types are not supported.
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
    let _ = provided_arg_stype_names;
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorSimpleBindEx", || unsafe {
        simple_bind(
            symbol_handle,
            dev_type,
            dev_id,
            num_g2c_keys,
            g2c_keys,
            g2c_dev_types,
            g2c_dev_ids,
            provided_grad_req_list_len,
            provided_grad_req_names,
            provided_grad_req_types,
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
            num_provided_arg_dtypes,
            provided_arg_dtype_names,
            provided_arg_dtypes,
            num_provided_arg_stypes,
            provided_arg_stypes,
            num_shared_arg_names,
            shared_arg_name_list,
            shared_buffer_len,
            shared_buffer_name_list,
            shared_buffer_handle_list,
            updated_shared_buffer_name_list,
            updated_shared_buffer_handle_list,
            num_in_args,
            in_args,
            arg_grads,
            num_aux_states,
            aux_states,
            shared_exec_handle,
            out,
        )
    })
}

/// [`MXExecutorSimpleBindEx`] with unsigned 32-bit shape data (the oldest form).
///
/// # Safety
/// As for [`MXExecutorSimpleBindEx`].
#[no_mangle]
pub unsafe extern "C" fn MXExecutorSimpleBind(
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
    provided_arg_shape_data: *const u32,
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
    let _ = provided_arg_stype_names;
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorSimpleBind", || unsafe {
        simple_bind(
            symbol_handle,
            dev_type,
            dev_id,
            num_g2c_keys,
            g2c_keys,
            g2c_dev_types,
            g2c_dev_ids,
            provided_grad_req_list_len,
            provided_grad_req_names,
            provided_grad_req_types,
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
            num_provided_arg_dtypes,
            provided_arg_dtype_names,
            provided_arg_dtypes,
            num_provided_arg_stypes,
            provided_arg_stypes,
            num_shared_arg_names,
            shared_arg_name_list,
            shared_buffer_len,
            shared_buffer_name_list,
            shared_buffer_handle_list,
            updated_shared_buffer_name_list,
            updated_shared_buffer_handle_list,
            num_in_args,
            in_args,
            arg_grads,
            num_aux_states,
            aux_states,
            shared_exec_handle,
            out,
        )
    })
}

/// [`MXExecutorSimpleBindEx`] with 64-bit shape data (the frontend's large-tensor form).
///
/// # Safety
/// As for [`MXExecutorSimpleBindEx`].
#[no_mangle]
pub unsafe extern "C" fn MXExecutorSimpleBindEx64(
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
    provided_arg_shape_data: *const i64,
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
    let _ = provided_arg_stype_names;
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorSimpleBindEx64", || unsafe {
        simple_bind(
            symbol_handle,
            dev_type,
            dev_id,
            num_g2c_keys,
            g2c_keys,
            g2c_dev_types,
            g2c_dev_ids,
            provided_grad_req_list_len,
            provided_grad_req_names,
            provided_grad_req_types,
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
            num_provided_arg_dtypes,
            provided_arg_dtype_names,
            provided_arg_dtypes,
            num_provided_arg_stypes,
            provided_arg_stypes,
            num_shared_arg_names,
            shared_arg_name_list,
            shared_buffer_len,
            shared_buffer_name_list,
            shared_buffer_handle_list,
            updated_shared_buffer_name_list,
            updated_shared_buffer_handle_list,
            num_in_args,
            in_args,
            arg_grads,
            num_aux_states,
            aux_states,
            shared_exec_handle,
            out,
        )
    })
}

/// The body of the two Reshape entry points, which differ in the type of the shape data.
///
/// # Safety
/// As for [`MXExecutorReshapeEx`].
#[allow(clippy::too_many_arguments)]
unsafe fn reshape<T: Copy + Into<i64>>(
    partial_shaping: c_int,
    allow_up_sizing: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_map_keys: u32,
    map_keys: *const *const c_char,
    map_dev_types: *const c_int,
    map_dev_ids: *const c_int,
    num_provided_arg_shapes: u32,
    provided_arg_shape_names: *const *const c_char,
    provided_arg_shape_data: *const T,
    provided_arg_shape_idx: *const u32,
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
    shared_exec: ExecutorHandle,
    out: *mut ExecutorHandle,
) -> Result<()> {
    // SAFETY: per this function's contract.
    unsafe { check_outs(num_in_args, in_args, arg_grads, num_aux_states, aux_states, out)? };
    let ctx = Context::from_codes(dev_type, dev_id)?.check_available()?;
    // SAFETY: per this function's contract.
    unsafe { group2ctx(ctx, num_map_keys, map_keys, map_dev_types, map_dev_ids, "reshape")? };
    let old = executors().get(shared_exec)?;
    // SAFETY: per this function's contract.
    unsafe {
        let provided = named_shapes(
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
        )?;
        let exec = old.reshape(partial_shaping != 0, allow_up_sizing != 0, &provided)?;
        hand_out_arrays(&exec, num_in_args, in_args, arg_grads, num_aux_states, aux_states)?;
        *ffi::out(out, "out")? = executors().insert(Arc::new(exec));
    }
    Ok(())
}

/// A new executor for new input shapes over `shared_exec`'s memory (see
/// `Executor::reshape`): arrays that shrink or keep their size are views of the old ones,
/// larger ones are new and need `allow_up_sizing`; a shape that changes without being given
/// needs `partial_shaping`. Device maps onto GPUs are not supported.
///
/// # Safety
/// Arrays must hold the counts given; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorReshapeEx(
    partial_shaping: c_int,
    allow_up_sizing: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_map_keys: u32,
    map_keys: *mut *const c_char,
    map_dev_types: *const c_int,
    map_dev_ids: *const c_int,
    num_provided_arg_shapes: u32,
    provided_arg_shape_names: *mut *const c_char,
    provided_arg_shape_data: *const c_int,
    provided_arg_shape_idx: *const u32,
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
    shared_exec: ExecutorHandle,
    out: *mut ExecutorHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorReshapeEx", || unsafe {
        reshape(
            partial_shaping,
            allow_up_sizing,
            dev_type,
            dev_id,
            num_map_keys,
            map_keys,
            map_dev_types,
            map_dev_ids,
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
            num_in_args,
            in_args,
            arg_grads,
            num_aux_states,
            aux_states,
            shared_exec,
            out,
        )
    })
}

/// [`MXExecutorReshapeEx`] with unsigned 32-bit shape data.
///
/// # Safety
/// As for [`MXExecutorReshapeEx`].
#[no_mangle]
pub unsafe extern "C" fn MXExecutorReshape(
    partial_shaping: c_int,
    allow_up_sizing: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_map_keys: u32,
    map_keys: *mut *const c_char,
    map_dev_types: *const c_int,
    map_dev_ids: *const c_int,
    num_provided_arg_shapes: u32,
    provided_arg_shape_names: *mut *const c_char,
    provided_arg_shape_data: *const u32,
    provided_arg_shape_idx: *const u32,
    num_in_args: *mut u32,
    in_args: *mut *mut NDArrayHandle,
    arg_grads: *mut *mut NDArrayHandle,
    num_aux_states: *mut u32,
    aux_states: *mut *mut NDArrayHandle,
    shared_exec: ExecutorHandle,
    out: *mut ExecutorHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXExecutorReshape", || unsafe {
        reshape(
            partial_shaping,
            allow_up_sizing,
            dev_type,
            dev_id,
            num_map_keys,
            map_keys,
            map_dev_types,
            map_dev_ids,
            num_provided_arg_shapes,
            provided_arg_shape_names,
            provided_arg_shape_data,
            provided_arg_shape_idx,
            num_in_args,
            in_args,
            arg_grads,
            num_aux_states,
            aux_states,
            shared_exec,
            out,
        )
    })
}

/// A frontend's monitor callback and its pointer.
struct CMonitor {
    f: unsafe extern "C" fn(*const c_char, NDArrayHandle, *mut c_void),
    data: *mut c_void,
}

// SAFETY: stock's contract for `MXExecutorSetMonitorCallback` (and `MXPredSetMonitorCallback`):
// the callback may be called on whichever thread runs the executor's forward, and the function
// and `data` (only handed back to the callback) stay valid while the executor lives. A forward
// already running when the callback is replaced finishes with the one it started with
// (documented on the setters).
unsafe impl Send for CMonitor {}
unsafe impl Sync for CMonitor {}

impl CMonitor {
    fn call(&self, name: &CString, array: NDArrayHandle) {
        // SAFETY: the callback's contract (see `CMonitor`); the handle is new and the
        // callee's to free.
        unsafe { (self.f)(name.as_ptr(), array, self.data) };
    }
}

fn set_monitor(handle: ExecutorHandle, callback: ExecutorMonitorCallback, data: *mut c_void, all: bool) -> Result<()> {
    let e = executors().get(handle)?;
    let Some(f) = callback else {
        e.set_monitor(None);
        return Ok(());
    };
    e.set_monitor(Some(c_monitor(f, data, all)));
    Ok(())
}

/// An executor's (or predictor's) monitor calling a C callback with each array's name, a new
/// handle to the array (the callee's to free) and `data`.
pub(crate) fn c_monitor(
    f: unsafe extern "C" fn(*const c_char, NDArrayHandle, *mut c_void),
    data: *mut c_void,
    all: bool,
) -> Monitor {
    let c = CMonitor { f, data };
    let callback = move |name: &str, _op: &str, a: &NDArray| {
        // A name with a NUL (impossible for graph names) is not reported.
        let Ok(name) = CString::new(name) else { return };
        let h = arrays().insert(Arc::new(a.detached()));
        c.call(&name, h);
    };
    Monitor { all, variables: true, callback: Arc::new(callback) }
}

/// Call `callback` after each operator of later forwards with each output (`<node>_output`),
/// as a new handle the callee frees; NULL removes the monitor. A forward running meanwhile
/// (on another thread, or this callback's own) keeps the callback it started with.
#[no_mangle]
pub extern "C" fn MXExecutorSetMonitorCallback(
    handle: ExecutorHandle,
    callback: ExecutorMonitorCallback,
    callback_handle: *mut c_void,
) -> c_int {
    ffi::call("MXExecutorSetMonitorCallback", || set_monitor(handle, callback, callback_handle, false))
}

/// [`MXExecutorSetMonitorCallback`]; with `monitor_all`, each operator's inputs are shown
/// first (`<node>_<input>`, a variable input under its own name as well).
#[no_mangle]
pub extern "C" fn MXExecutorSetMonitorCallbackEX(
    handle: ExecutorHandle,
    callback: ExecutorMonitorCallback,
    callback_handle: *mut c_void,
    monitor_all: bool,
) -> c_int {
    ffi::call("MXExecutorSetMonitorCallbackEX", || set_monitor(handle, callback, callback_handle, monitor_all))
}

/// The graph the executor runs, as a new symbol: the bound one with common subexpressions
/// eliminated (`MXNET_ELIMINATE_COMMON_EXPR`), as stock's.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXExecutorGetOptimizedSymbol(handle: ExecutorHandle, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXExecutorGetOptimizedSymbol", out, "out", || {
            Ok(super::symbol::new_handle(executors().get(handle)?.symbol()))
        })
    }
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
