//! C API: the operator registry (MXListAllOpNames, NNListAllOpNames, NNGetOpHandle,
//! MXSymbolListAtomicSymbolCreators, MXSymbolGetAtomicSymbolName, MXSymbolGetAtomicSymbolInfo,
//! NNGetOpInfo), extension libraries' operators (MXLoadLib), imperative invocation
//! (MXImperativeInvokeEx, MXImperativeInvoke) and the random seeds (MXRandomSeed,
//! MXRandomSeedContext).
//!
//! Registry strings and arrays live as long as the process (stricter than stock's per-thread
//! buffers); invocation results use per-thread arrays valid until the next invocation on the
//! same thread.

use super::ffi::{self, cstr, out};
use super::ndarray::arrays;
use super::types::{AtomicSymbolCreator, NDArrayHandle, OpHandle};
use mxnet_core::context::Context;
use mxnet_core::error::{Error, Result};
use mxnet_core::ndarray::NDArray;
use mxnet_core::op::{self, random};
use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::sync::Arc;

thread_local! {
    static INVOKE_OUT: RefCell<(Vec<NDArrayHandle>, Vec<c_int>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// # Safety
/// `out_size` and `out_array` must be NULL or valid for writes.
unsafe fn list_names(out_size: *mut u32, out_array: *mut *mut *const c_char) -> Result<()> {
    // SAFETY: per this function's contract.
    let (size, arr) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_array")?) };
    let names = op::registry().all_name_ptrs();
    *size = names.len() as u32;
    *arr = names.as_ptr() as *mut *const c_char;
    Ok(())
}

/// Every operator name, aliases included. The array lives as long as the process.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXListAllOpNames(out_size: *mut u32, out_array: *mut *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXListAllOpNames", || unsafe { list_names(out_size, out_array) })
}

/// nnvm's name for [`MXListAllOpNames`].
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn NNListAllOpNames(out_size: *mut u32, out_array: *mut *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("NNListAllOpNames", || unsafe { list_names(out_size, out_array) })
}

/// Load the extension library at `path` (built against stock 1.9.1's `lib_api.h`) and
/// register its operators; `verbose` non-zero prints what was found. Subgraph operators,
/// partitioners and passes are refused (NotImplementedError) before anything is registered.
///
/// # Safety
/// `path` must be a string. Loading runs the library's initialisers: only load libraries you
/// trust, as with stock.
#[no_mangle]
pub unsafe extern "C" fn MXLoadLib(path: *const c_char, verbose: std::ffi::c_uint) -> c_int {
    ffi::call("MXLoadLib", || {
        // SAFETY: per this function's contract.
        let path = unsafe { cstr(path, "path")? };
        op::library::load(path, verbose != 0).map(drop)
    })
}

/// The handle of the operator named `op_name` (aliases give the same handle); an unknown name
/// is an error.
///
/// # Safety
/// `op_name` must be a string; `op_out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn NNGetOpHandle(op_name: *const c_char, op_out: *mut OpHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("NNGetOpHandle", op_out, "op_out", || Ok(op::lookup(cstr(op_name, "op_name")?)?.handle())) }
}

/// The handles of all operators (one per operator, aliases not repeated).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolListAtomicSymbolCreators(
    out_size: *mut u32,
    out_array: *mut *mut AtomicSymbolCreator,
) -> c_int {
    ffi::call("MXSymbolListAtomicSymbolCreators", || {
        // SAFETY: per this function's contract.
        let (size, arr) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_array")?) };
        let h = op::registry().handles();
        *size = h.len() as u32;
        *arr = h.as_ptr() as *mut AtomicSymbolCreator;
        Ok(())
    })
}

/// The canonical name of an operator.
///
/// # Safety
/// `name` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetAtomicSymbolName(creator: AtomicSymbolCreator, name: *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXSymbolGetAtomicSymbolName", name, "name", || {
            Ok(op::registry().from_handle(creator)?.c_info().name.as_ptr())
        })
    }
}

/// # Safety
/// Required out-params must be valid for writes; `return_type` may be NULL.
#[allow(clippy::too_many_arguments)]
unsafe fn op_info(
    creator: *const std::ffi::c_void,
    name: *mut *const c_char,
    description: *mut *const c_char,
    num_args: *mut u32,
    arg_names: *mut *mut *const c_char,
    arg_type_infos: *mut *mut *const c_char,
    arg_descriptions: *mut *mut *const c_char,
    key_var_num_args: *mut *const c_char,
    return_type: *mut *const c_char,
) -> Result<()> {
    let info = op::registry().from_handle(creator)?.c_info();
    // SAFETY: per this function's contract.
    unsafe {
        let (n, d, na, an, at, ad) = (
            out(name, "name")?,
            out(description, "description")?,
            out(num_args, "num_args")?,
            out(arg_names, "arg_names")?,
            out(arg_type_infos, "arg_type_infos")?,
            out(arg_descriptions, "arg_descriptions")?,
        );
        *n = info.name.as_ptr();
        *d = info.desc.as_ptr();
        *na = info.arg_names.len() as u32;
        *an = info.arg_names.as_ptr() as *mut *const c_char;
        *at = info.arg_types.as_ptr() as *mut *const c_char;
        *ad = info.arg_descs.as_ptr() as *mut *const c_char;
        if !key_var_num_args.is_null() {
            *key_var_num_args = info.key_var_num_args.as_ptr();
        }
        if !return_type.is_null() {
            *return_type = std::ptr::null();
        }
    }
    Ok(())
}

/// An operator's documentation: name, description, arguments (tensor inputs first, typed
/// `NDArray-or-Symbol` or `NDArray-or-Symbol[]`, then parameters with stock-style type
/// strings), the variadic count key (`""` when none) and a NULL return type.
///
/// # Safety
/// Out-params must be valid for writes (`key_var_num_args` and `return_type` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetAtomicSymbolInfo(
    creator: AtomicSymbolCreator,
    name: *mut *const c_char,
    description: *mut *const c_char,
    num_args: *mut u32,
    arg_names: *mut *mut *const c_char,
    arg_type_infos: *mut *mut *const c_char,
    arg_descriptions: *mut *mut *const c_char,
    key_var_num_args: *mut *const c_char,
    return_type: *mut *const c_char,
) -> c_int {
    ffi::call("MXSymbolGetAtomicSymbolInfo", || {
        // SAFETY: per this function's contract.
        unsafe {
            op_info(
                creator,
                name,
                description,
                num_args,
                arg_names,
                arg_type_infos,
                arg_descriptions,
                key_var_num_args,
                return_type,
            )
        }
    })
}

/// nnvm's form of [`MXSymbolGetAtomicSymbolInfo`] (no variadic key).
///
/// # Safety
/// Out-params must be valid for writes (`return_type` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn NNGetOpInfo(
    op: OpHandle,
    real_name: *mut *const c_char,
    description: *mut *const c_char,
    num_doc_args: *mut u32,
    arg_names: *mut *mut *const c_char,
    arg_type_infos: *mut *mut *const c_char,
    arg_descriptions: *mut *mut *const c_char,
    return_type: *mut *const c_char,
) -> c_int {
    ffi::call("NNGetOpInfo", || {
        // SAFETY: per this function's contract.
        unsafe {
            op_info(
                op,
                real_name,
                description,
                num_doc_args,
                arg_names,
                arg_type_infos,
                arg_descriptions,
                std::ptr::null_mut(),
                return_type,
            )
        }
    })
}

/// # Safety
/// `p` must point to `n` handles when `n > 0`.
unsafe fn handles<'a>(p: *const NDArrayHandle, n: c_int, what: &str) -> Result<&'a [NDArrayHandle]> {
    if n < 0 {
        return Err(Error::value(format!("{what}: negative count {n}")));
    }
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

/// A creation operator (`_zeros`, the samplers) called by the frontend without output arrays
/// and with a `shape` that legacy shape semantics call unknown (a 0 dimension, or `()`) fails,
/// as stock's does ("inferring shapes failed"); under `mx.np_shape()` such shapes are
/// zero-size and scalar arrays. Internal callers (autograd's gradient fills) are not checked.
fn check_creation_shape(op: &op::OpDef, kv: &[(&str, &str)], no_outputs: bool) -> Result<()> {
    if !no_outputs || !op.creates_from_shape() || mxnet_core::ndarray::np_shape::get() != 0 {
        return Ok(());
    }
    let Some(&(_, text)) = kv.iter().find(|(k, _)| *k == "shape") else { return Ok(()) };
    match mxnet_core::symbol::infer::parse_shape_attr(text, true) {
        Some(Some(dims)) if dims.is_empty() || dims.contains(&0) => Err(Error::mxnet(format!(
            "Operator {} inferring shapes failed: shape {text} has no dimension or a 0 dimension, which legacy shape semantics read as unknown (mx.np_shape() allows scalar and zero-size arrays)",
            op.name
        ))),
        _ => Ok(()),
    }
}

/// # Safety
/// As for [`MXImperativeInvokeEx`].
#[allow(clippy::too_many_arguments)]
unsafe fn invoke_c(
    creator: AtomicSymbolCreator,
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: *mut c_int,
    outputs: *mut *mut NDArrayHandle,
    num_params: c_int,
    param_keys: *mut *const c_char,
    param_vals: *mut *const c_char,
    out_stypes: *mut *const c_int,
) -> Result<()> {
    let op = op::registry().from_handle(creator)?;
    // SAFETY: the registry lives for the process; the reference is 'static.
    let op: &'static op::OpDef = unsafe { &*(op as *const op::OpDef) };
    // SAFETY: per the contract.
    let (n_out, outs_ptr) = unsafe { (out(num_outputs, "num_outputs")?, out(outputs, "outputs")?) };
    let in_handles = unsafe { handles(inputs, num_inputs, "inputs")? };
    // Inline for the common few inputs: a small call allocates only what it returns.
    let in_arrays: smallvec::SmallVec<[Arc<NDArray>; 4]> =
        in_handles.iter().map(|&h| arrays().get(h)).collect::<Result<_>>()?;
    let in_refs: smallvec::SmallVec<[&NDArray; 4]> = in_arrays.iter().map(|a| &**a).collect();
    if num_params < 0 {
        return Err(Error::value(format!("num_params is negative ({num_params})")));
    }
    let np = num_params as usize;
    if np > 0 && (param_keys.is_null() || param_vals.is_null()) {
        return Err(Error::value(format!("param_keys or param_vals is NULL but num_params is {np}")));
    }
    let mut kv: smallvec::SmallVec<[(&str, &str); 4]> = smallvec::SmallVec::with_capacity(np);
    for i in 0..np {
        // SAFETY: per the contract, both arrays hold `num_params` strings.
        unsafe { kv.push((cstr(*param_keys.add(i), "param key")?, cstr(*param_vals.add(i), "param value")?)) };
    }
    check_creation_shape(op, &kv, outs_ptr.is_null() || *n_out == 0)?;
    let given_handles = if outs_ptr.is_null() || *n_out == 0 {
        None
    } else {
        // SAFETY: per the contract, `*outputs` holds `*num_outputs` handles.
        Some(unsafe { handles(*outs_ptr, *n_out, "outputs")? })
    };
    let given = given_handles.map(|hs| hs.iter().map(|&h| arrays().get(h)).collect::<Result<Vec<_>>>()).transpose()?;
    let given_refs: Option<Vec<&NDArray>> = given.as_ref().map(|g| g.iter().map(|a| &**a).collect());
    if let Some(g) = &given_refs {
        mxnet_core::autograd::check_inplace(&in_refs, g)?;
    }
    // An iterator of two pointers, not the list moved through three calls.
    let produced = mxnet_core::autograd::invoke(op, &in_refs, given_refs.as_deref(), kv.iter().copied())?;
    INVOKE_OUT.with(|slot| -> Result<()> {
        let mut slot = slot.borrow_mut();
        let (hs, st) = &mut *slot;
        st.clear();
        if let Some(given) = given_handles {
            // Recorded outputs the caller gave now carry their graph entries.
            for (&h, a) in given.iter().zip(produced) {
                if a.ag.is_some() {
                    arrays().replace(h, Arc::new(a))?;
                }
            }
        } else {
            hs.clear();
            hs.extend(produced.into_iter().map(|a| arrays().insert(Arc::new(a))));
            *outs_ptr = hs.as_mut_ptr();
            *n_out = hs.len() as c_int;
        }
        st.resize((*n_out).max(0) as usize, 0);
        if !out_stypes.is_null() {
            // SAFETY: per the contract.
            unsafe { *out_stypes = st.as_ptr() };
        }
        Ok(())
    })
}

/// Invoke an operator imperatively. `*outputs == NULL` (or `*num_outputs == 0`): new arrays
/// are returned in a per-thread array (the caller frees each handle); otherwise the results go
/// into the caller's `*num_outputs` arrays. `*out_stypes` is always set (all dense: 0).
///
/// # Safety
/// `inputs` must hold `num_inputs` handles, `param_keys`/`param_vals` `num_params` strings;
/// `num_outputs`, `outputs` and `out_stypes` must be valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn MXImperativeInvokeEx(
    creator: AtomicSymbolCreator,
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: *mut c_int,
    outputs: *mut *mut NDArrayHandle,
    num_params: c_int,
    param_keys: *mut *const c_char,
    param_vals: *mut *const c_char,
    out_stypes: *mut *const c_int,
) -> c_int {
    ffi::call("MXImperativeInvokeEx", || {
        if out_stypes.is_null() {
            return Err(Error::value("out_stypes must not be NULL"));
        }
        // SAFETY: per this function's contract.
        unsafe {
            invoke_c(creator, num_inputs, inputs, num_outputs, outputs, num_params, param_keys, param_vals, out_stypes)
        }
    })
}

/// [`MXImperativeInvokeEx`] without the storage types.
///
/// # Safety
/// As for [`MXImperativeInvokeEx`].
#[no_mangle]
pub unsafe extern "C" fn MXImperativeInvoke(
    creator: AtomicSymbolCreator,
    num_inputs: c_int,
    inputs: *mut NDArrayHandle,
    num_outputs: *mut c_int,
    outputs: *mut *mut NDArrayHandle,
    num_params: c_int,
    param_keys: *mut *const c_char,
    param_vals: *mut *const c_char,
) -> c_int {
    ffi::call("MXImperativeInvoke", || {
        // SAFETY: per this function's contract.
        unsafe {
            invoke_c(
                creator,
                num_inputs,
                inputs,
                num_outputs,
                outputs,
                num_params,
                param_keys,
                param_vals,
                std::ptr::null_mut(),
            )
        }
    })
}

/// Seed the random streams of every context.
#[no_mangle]
pub extern "C" fn MXRandomSeed(seed: c_int) -> c_int {
    ffi::call("MXRandomSeed", || {
        random::seed_all(seed as u32 as u64);
        Ok(())
    })
}

/// Seed the random stream of one context.
#[no_mangle]
pub extern "C" fn MXRandomSeedContext(seed: c_int, dev_type: c_int, dev_id: c_int) -> c_int {
    ffi::call("MXRandomSeedContext", || {
        random::seed_ctx(seed as u32 as u64, Context::from_codes(dev_type, dev_id)?);
        Ok(())
    })
}
