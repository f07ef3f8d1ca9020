//! C API: nnvm's functions (`nnvm/c_api.h`, which stock's library also exports). The symbol
//! functions are the MXNet ones under nnvm's names (the same handles), with nnvm's error
//! functions and its list of unique operators; nnvm's graph IR (`NNGraph*`, graph passes)
//! and control dependencies answer `NotImplementedError`.

use super::ffi;
use super::symbol as sym;
use super::types::{GraphHandle, OpHandle, SymbolHandle};
use mxnet_core::error::Error;
use mxnet_core::symbol::InputKind;
use std::ffi::{c_char, c_int, CStr};

/// The last error on this thread ([`super::base`]'s `MXGetLastError`).
#[no_mangle]
pub extern "C" fn NNGetLastError() -> *const c_char {
    super::base::MXGetLastError()
}

/// Set this thread's last error text (a frontend reporting its own failure).
///
/// # Safety
/// `msg` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn NNAPISetLastError(msg: *const c_char) {
    if !msg.is_null() {
        // SAFETY: per this function's contract.
        ffi::set_last_error_text(unsafe { CStr::from_ptr(msg) });
    }
}

/// Every operator once (aliases not repeated): the handles `NNGetOpHandle` gives.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn NNListUniqueOps(out_size: *mut u32, out_array: *mut *mut OpHandle) -> c_int {
    // SAFETY: per this function's contract (an operator handle is an atomic symbol creator).
    unsafe { super::op::MXSymbolListAtomicSymbolCreators(out_size, out_array) }
}

/// `MXSymbolCreateAtomicSymbol`.
///
/// # Safety
/// As for `MXSymbolCreateAtomicSymbol`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolCreateAtomicSymbol(
    op: OpHandle,
    num_param: u32,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
    out: *mut SymbolHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolCreateAtomicSymbol(op, num_param, keys, vals, out) }
}

/// `MXSymbolCreateVariable`.
///
/// # Safety
/// As for `MXSymbolCreateVariable`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolCreateVariable(name: *const c_char, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolCreateVariable(name, out) }
}

/// `MXSymbolCreateGroup`.
///
/// # Safety
/// As for `MXSymbolCreateGroup`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolCreateGroup(
    num_symbols: u32,
    symbols: *mut SymbolHandle,
    out: *mut SymbolHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolCreateGroup(num_symbols, symbols, out) }
}

/// Control dependencies between nodes: not supported yet (nodes here have none).
#[no_mangle]
pub extern "C" fn NNAddControlDeps(handle: SymbolHandle, src_dep: SymbolHandle) -> c_int {
    let _ = (handle, src_dep);
    ffi::call("NNAddControlDeps", || Err(Error::not_supported("NNAddControlDeps (control dependencies)")))
}

/// `MXSymbolCopy` (a deep copy).
///
/// # Safety
/// As for `MXSymbolCopy`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolCopy(symbol: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolCopy(symbol, out) }
}

/// `MXSymbolPrint`.
///
/// # Safety
/// As for `MXSymbolPrint`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolPrint(symbol: SymbolHandle, out_str: *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolPrint(symbol, out_str) }
}

/// `MXSymbolGetAttr`.
///
/// # Safety
/// As for `MXSymbolGetAttr`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolGetAttr(
    symbol: SymbolHandle,
    key: *const c_char,
    out: *mut *const c_char,
    success: *mut c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolGetAttr(symbol, key, out, success) }
}

/// Set `num_param` attributes (`MXSymbolSetAttr` for each, in order; the first failure stops).
///
/// # Safety
/// `keys` and `values` must hold `num_param` strings.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolSetAttrs(
    symbol: SymbolHandle,
    num_param: u32,
    keys: *mut *const c_char,
    values: *mut *const c_char,
) -> c_int {
    if num_param > 0 && (keys.is_null() || values.is_null()) {
        return ffi::call("NNSymbolSetAttrs", || Err(Error::value("keys or values is NULL")));
    }
    for k in 0..num_param as usize {
        // SAFETY: per this function's contract.
        let rc = unsafe { sym::MXSymbolSetAttr(symbol, *keys.add(k), *values.add(k)) };
        if rc != 0 {
            return rc;
        }
    }
    0
}

/// Attributes as key, value pairs: `recursive_option` 0 for every node's (`MXSymbolListAttr`),
/// 1 for the output node's (`MXSymbolListAttrShallow`).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolListAttrs(
    symbol: SymbolHandle,
    recursive_option: c_int,
    out_size: *mut u32,
    out: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        match recursive_option {
            0 => sym::MXSymbolListAttr(symbol, out_size, out),
            1 => sym::MXSymbolListAttrShallow(symbol, out_size, out),
            o => ffi::call("NNSymbolListAttrs", || {
                Err(Error::value(format!("recursive_option {o} is not 0 (recursive) or 1 (shallow)")))
            }),
        }
    }
}

/// New handles to the input variables (`option`: 0 all, 1 arguments, 2 auxiliary states), in a
/// per-thread array valid until the next call on the same thread; the caller frees each.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolListInputVariables(
    symbol: SymbolHandle,
    option: c_int,
    out_size: *mut u32,
    out_sym_array: *mut *mut SymbolHandle,
) -> c_int {
    ffi::call("NNSymbolListInputVariables", || {
        let (ptr, len) = sym::variable_handles(&sym::symbol(symbol)?, InputKind::from_code(option)?);
        // SAFETY: per this function's contract.
        unsafe {
            *ffi::out(out_size, "out_size")? = len as u32;
            *ffi::out(out_sym_array, "out_sym_array")? = ptr;
        }
        Ok(())
    })
}

/// `MXSymbolListOutputs`.
///
/// # Safety
/// As for `MXSymbolListOutputs`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolListOutputNames(
    symbol: SymbolHandle,
    out_size: *mut u32,
    out_str_array: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolListOutputs(symbol, out_size, out_str_array) }
}

/// `MXSymbolGetNumOutputs`.
///
/// # Safety
/// As for `MXSymbolGetNumOutputs`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolGetNumOutputs(symbol: SymbolHandle, output_count: *mut u32) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolGetNumOutputs(symbol, output_count) }
}

/// `MXSymbolGetInternals`.
///
/// # Safety
/// As for `MXSymbolGetInternals`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolGetInternals(symbol: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolGetInternals(symbol, out) }
}

/// `MXSymbolGetChildren`.
///
/// # Safety
/// As for `MXSymbolGetChildren`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolGetChildren(symbol: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolGetChildren(symbol, out) }
}

/// `MXSymbolGetOutput`.
///
/// # Safety
/// As for `MXSymbolGetOutput`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolGetOutput(symbol: SymbolHandle, index: u32, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { sym::MXSymbolGetOutput(symbol, index, out) }
}

/// `MXSymbolCompose`.
///
/// # Safety
/// As for `MXSymbolCompose`.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolCompose(
    sym: SymbolHandle,
    name: *const c_char,
    num_args: u32,
    keys: *mut *const c_char,
    args: *mut SymbolHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { self::sym::MXSymbolCompose(sym, name, num_args, keys, args) }
}

fn graph_ir(api: &'static str) -> c_int {
    ffi::call(api, || Err(Error::not_supported(format!("{api} (nnvm's graph IR and passes)"))))
}

/// nnvm's graph IR: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphCreate(symbol: SymbolHandle, graph: *mut GraphHandle) -> c_int {
    let _ = (symbol, graph);
    graph_ir("NNGraphCreate")
}

/// nnvm's graph IR: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphFree(handle: GraphHandle) -> c_int {
    let _ = handle;
    graph_ir("NNGraphFree")
}

/// nnvm's graph IR: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphGetSymbol(graph: GraphHandle, symbol: *mut SymbolHandle) -> c_int {
    let _ = (graph, symbol);
    graph_ir("NNGraphGetSymbol")
}

/// nnvm's graph IR: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphSetJSONAttr(handle: GraphHandle, key: *const c_char, json_value: *const c_char) -> c_int {
    let _ = (handle, key, json_value);
    graph_ir("NNGraphSetJSONAttr")
}

/// nnvm's graph IR: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphGetJSONAttr(
    handle: GraphHandle,
    key: *const c_char,
    json_out: *mut *const c_char,
    success: *mut c_int,
) -> c_int {
    let _ = (handle, key, json_out, success);
    graph_ir("NNGraphGetJSONAttr")
}

/// nnvm's graph IR: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphSetNodeEntryListAttr_(handle: GraphHandle, key: *const c_char, list: SymbolHandle) -> c_int {
    let _ = (handle, key, list);
    graph_ir("NNGraphSetNodeEntryListAttr_")
}

/// nnvm's graph passes: not supported yet.
#[no_mangle]
pub extern "C" fn NNGraphApplyPasses(
    src: GraphHandle,
    num_pass: u32,
    pass_names: *mut *const c_char,
    dst: *mut GraphHandle,
) -> c_int {
    let _ = (src, num_pass, pass_names, dst);
    graph_ir("NNGraphApplyPasses")
}
