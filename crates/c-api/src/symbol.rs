//! C API: symbols (MXSymbolCreateVariable, MXSymbolCreateAtomicSymbol, MXSymbolCompose,
//! MXSymbolCopy, MXSymbolCreateGroup, the name/attribute/list functions, outputs, internals,
//! children, JSON and files, MXSymbolRemoveAmpCast, MXSymbolPrint, shape and type inference,
//! NNSymbolListInputNames, MXSymbolFree/NNSymbolFree).
//!
//! Thin: the graph work is in `mxnet_core::symbol`. Strings, string arrays, shapes and types are
//! returned in per-thread buffers valid until the next such call on the thread.

use super::ffi::{self, cstr, opt_cstr, out};
use super::types::{AtomicSymbolCreator, SymbolHandle};
use crate::handle::HandleTable;
use mxnet_core::error::{Error, Result};
use mxnet_core::ndarray::{np_shape, DType};
use mxnet_core::op;
use mxnet_core::symbol::infer::{self, Given, PShape};
use mxnet_core::symbol::{json, InputKind, Symbol};
use mxnet_core::sync::RwLock;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::sync::{Arc, OnceLock};

/// Live symbol handles (the CachedOp and executor read symbols through this table).
pub fn symbols() -> &'static HandleTable<RwLock<Symbol>> {
    static T: OnceLock<HandleTable<RwLock<Symbol>>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(10, "Symbol"))
}

/// The symbol behind a handle (a snapshot of its outputs; nodes are shared).
pub fn symbol(h: SymbolHandle) -> Result<Symbol> {
    // Cloned outside the handle's slot lock (a spin lock): the symbol's own lock may wait.
    let s = symbols().get(h)?;
    let snapshot = s.read().clone();
    Ok(snapshot)
}

pub(crate) fn new_handle(s: Symbol) -> SymbolHandle {
    symbols().insert(Arc::new(RwLock::new(s)))
}

/// Per-thread returned shapes: (ndims, pointers, data) for args, outputs, aux.
struct ShapeRet<T> {
    ndim: Vec<c_int>,
    ptrs: Vec<*const T>,
    data: Vec<Vec<T>>,
}

impl<T> ShapeRet<T> {
    const fn new() -> Self {
        ShapeRet { ndim: Vec::new(), ptrs: Vec::new(), data: Vec::new() }
    }
}

// Boxed: keeps every thread's copy of the library's TLS block small (docs/design/c-api.md).
thread_local! {
    static STRS: RefCell<Box<(Vec<CString>, Vec<*const c_char>)>> = RefCell::new(Box::default());
    static SHAPES32: RefCell<Box<[ShapeRet<c_int>; 3]>> = RefCell::new(Box::new([ShapeRet::new(), ShapeRet::new(), ShapeRet::new()]));
    static SHAPES64: RefCell<Box<[ShapeRet<i64>; 3]>> = RefCell::new(Box::new([ShapeRet::new(), ShapeRet::new(), ShapeRet::new()]));
    static SHAPES_U32: RefCell<Box<[ShapeRet<u32>; 3]>> = RefCell::new(Box::new([ShapeRet::new(), ShapeRet::new(), ShapeRet::new()]));
    static INPUT_SYMS: RefCell<Vec<SymbolHandle>> = const { RefCell::new(Vec::new()) };
    static TYPES: RefCell<Box<[Vec<c_int>; 3]>> = RefCell::new(Box::default());
}

/// # Safety
/// Out-params must be NULL or valid for writes.
unsafe fn return_strs(items: Vec<String>, out_size: *mut u32, out_array: *mut *mut *const c_char) -> Result<()> {
    // SAFETY: per this function's contract.
    let (n, a) = unsafe { (out(out_size, "out_size")?, out(out_array, "out_str_array")?) };
    let cs: Vec<CString> = items
        .into_iter()
        .map(|s| CString::new(s).map_err(|_| Error::value("string contains a NUL byte")))
        .collect::<Result<_>>()?;
    STRS.with(|slot| {
        let mut slot = slot.borrow_mut();
        slot.1 = cs.iter().map(|c| c.as_ptr()).collect();
        slot.0 = cs;
        *n = slot.1.len() as u32;
        *a = slot.1.as_mut_ptr();
    });
    Ok(())
}

/// # Safety
/// Out-params must be NULL or valid for writes.
unsafe fn return_pairs(
    pairs: Vec<(String, String)>,
    out_size: *mut u32,
    out_array: *mut *mut *const c_char,
) -> Result<()> {
    let n = pairs.len();
    let flat: Vec<String> = pairs.into_iter().flat_map(|(k, v)| [k, v]).collect();
    // SAFETY: forwarded contract.
    unsafe { return_strs(flat, out_size, out_array)? };
    // SAFETY: checked non-NULL by return_strs.
    unsafe { *out_size = n as u32 };
    Ok(())
}

/// # Safety
/// `p` must hold `n` handles when `n > 0`.
unsafe fn symbol_args(p: *const SymbolHandle, n: usize, what: &str) -> Result<Vec<Symbol>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&h| symbol(h)).collect()
}

/// # Safety
/// `p` must hold `n` strings when `n > 0`.
unsafe fn strings<'a>(p: *const *const c_char, n: usize, what: &str) -> Result<Vec<&'a str>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(Error::value(format!("{what} is NULL but its count is {n}")));
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&s| unsafe { cstr(s, what) }).collect()
}

/// A variable named `name`.
///
/// # Safety
/// `name` must be a string; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCreateVariable(name: *const c_char, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXSymbolCreateVariable", out, "out", || Ok(new_handle(Symbol::variable(cstr(name, "name")?))))
    }
}

/// An operator node without inputs; the parameters are validated and kept as sent.
///
/// # Safety
/// `keys`/`vals` must hold `num_param` strings; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCreateAtomicSymbol(
    creator: AtomicSymbolCreator,
    num_param: u32,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
    out: *mut SymbolHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXSymbolCreateAtomicSymbol", out, "out", || {
            let op = op::registry().from_handle(creator)?;
            // SAFETY: the registry lives for the process.
            let op: &'static op::OpDef = &*(op as *const op::OpDef);
            let k = strings(keys, num_param as usize, "keys")?;
            let v = strings(vals, num_param as usize, "vals")?;
            Ok(new_handle(Symbol::atomic(op, k.into_iter().zip(v))?))
        })
    }
}

/// Compose in place with positional (`keys` NULL) or keyword arguments.
///
/// # Safety
/// `args` (and `keys` when not NULL) must hold `num_args` entries; `name` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCompose(
    sym: SymbolHandle,
    name: *const c_char,
    num_args: u32,
    keys: *mut *const c_char,
    args: *mut SymbolHandle,
) -> c_int {
    ffi::call("MXSymbolCompose", || {
        // SAFETY: per this function's contract.
        let (name, argv) = unsafe { (opt_cstr(name, "name")?, symbol_args(args, num_args as usize, "args")?) };
        let target = symbols().get(sym)?;
        let mut s = target.read().clone();
        if keys.is_null() {
            let refs: Vec<&Symbol> = argv.iter().collect();
            s.compose(&refs, &[], name)?;
        } else {
            // SAFETY: per this function's contract.
            let k = unsafe { strings(keys, num_args as usize, "keys")? };
            let kw: Vec<(&str, &Symbol)> = k.into_iter().zip(argv.iter()).collect();
            s.compose(&[], &kw, name)?;
        }
        *target.write() = s;
        Ok(())
    })
}

fn unary(
    api: &'static str,
    sym: SymbolHandle,
    out: *mut SymbolHandle,
    f: impl FnOnce(Symbol) -> Result<Symbol>,
) -> c_int {
    // SAFETY: the callers' contracts make `out` NULL or valid for writes.
    unsafe { ffi::call_out(api, out, "out", || Ok(new_handle(f(symbol(sym)?)?))) }
}

/// A deep copy.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCopy(symbol: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    unary("MXSymbolCopy", symbol, out, |s| Ok(s.deep_copy()))
}

/// A copy without amp_cast / amp_multicast nodes.
///
/// # Safety
/// `ret_sym_handle` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolRemoveAmpCast(sym_handle: SymbolHandle, ret_sym_handle: *mut SymbolHandle) -> c_int {
    unary("MXSymbolRemoveAmpCast", sym_handle, ret_sym_handle, |s| Ok(s.remove_amp_cast()))
}

/// Every node's outputs.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetInternals(symbol: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    unary("MXSymbolGetInternals", symbol, out, |s| Ok(s.internals()))
}

/// The inputs of the output nodes (an empty symbol for a variable).
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetChildren(symbol: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    unary("MXSymbolGetChildren", symbol, out, |s| Ok(s.children()))
}

/// Output `index` as a symbol.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetOutput(symbol: SymbolHandle, index: u32, out: *mut SymbolHandle) -> c_int {
    unary("MXSymbolGetOutput", symbol, out, |s| s.output(index as usize))
}

/// The outputs of several symbols as one.
///
/// # Safety
/// `symbols` must hold `num_symbols` handles; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCreateGroup(
    num_symbols: u32,
    symbols: *mut SymbolHandle,
    out: *mut SymbolHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXSymbolCreateGroup", out, "out", || {
            let v = symbol_args(symbols, num_symbols as usize, "symbols")?;
            let refs: Vec<&Symbol> = v.iter().collect();
            Ok(new_handle(Symbol::group(&refs)))
        })
    }
}

/// Free a symbol handle (its nodes live on while other symbols share them).
#[no_mangle]
pub extern "C" fn MXSymbolFree(symbol: SymbolHandle) -> c_int {
    ffi::call("MXSymbolFree", || symbols().remove(symbol).map(drop))
}

/// nnvm's name for [`MXSymbolFree`].
#[no_mangle]
pub extern "C" fn NNSymbolFree(symbol: SymbolHandle) -> c_int {
    ffi::call("NNSymbolFree", || symbols().remove(symbol).map(drop))
}

/// # Safety
/// `out` and `success` must be NULL or valid for writes.
unsafe fn get_attr(
    api: &'static str,
    symbol: SymbolHandle,
    key: Result<&str>,
    out: *mut *const c_char,
    success: *mut c_int,
) -> c_int {
    ffi::call(api, || {
        // SAFETY: per this function's contract.
        let (o, ok) = unsafe { (self::out(out, "out")?, self::out(success, "success")?) };
        match self::symbol(symbol)?.get_attr(key?) {
            Some(v) => {
                *o = ffi::return_str(&v)?;
                *ok = 1;
            }
            None => {
                *o = std::ptr::null();
                *ok = 0;
            }
        }
        Ok(())
    })
}

/// The node name (`success` 0 for a grouped symbol).
///
/// # Safety
/// `out` and `success` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetName(symbol: SymbolHandle, out: *mut *const c_char, success: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { get_attr("MXSymbolGetName", symbol, Ok("name"), out, success) }
}

/// An attribute (`success` 0 when absent).
///
/// # Safety
/// `key` must be a string; `out` and `success` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetAttr(
    symbol: SymbolHandle,
    key: *const c_char,
    out: *mut *const c_char,
    success: *mut c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { get_attr("MXSymbolGetAttr", symbol, cstr(key, "key"), out, success) }
}

/// Set an attribute of a non-grouped symbol's node.
///
/// # Safety
/// `key` and `value` must be strings.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolSetAttr(symbol: SymbolHandle, key: *const c_char, value: *const c_char) -> c_int {
    ffi::call("MXSymbolSetAttr", || {
        // SAFETY: per this function's contract.
        let (k, v) = unsafe { (cstr(key, "key")?, cstr(value, "value")?) };
        self::symbol(symbol)?.set_attr(k, v)
    })
}

/// Every node's attributes as `name$key`, value pairs (`*out_size` pairs, 2× strings).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolListAttr(
    symbol: SymbolHandle,
    out_size: *mut u32,
    out: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXSymbolListAttr", || unsafe {
        return_pairs(self::symbol(symbol)?.list_attr_recursive(), out_size, out)
    })
}

/// The output node's attributes as key, value pairs.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolListAttrShallow(
    symbol: SymbolHandle,
    out_size: *mut u32,
    out: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXSymbolListAttrShallow", || unsafe {
        return_pairs(self::symbol(symbol)?.list_attr_shallow(), out_size, out)
    })
}

/// # Safety
/// Out-params must be NULL or valid for writes.
unsafe fn list_inputs(
    api: &'static str,
    symbol: SymbolHandle,
    kind: Result<InputKind>,
    out_size: *mut u32,
    out_array: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call(api, || unsafe { return_strs(self::symbol(symbol)?.list_input_names(kind?), out_size, out_array) })
}

/// Argument names (inputs no operator mutates), in graph order.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolListArguments(
    symbol: SymbolHandle,
    out_size: *mut u32,
    out_str_array: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { list_inputs("MXSymbolListArguments", symbol, Ok(InputKind::Args), out_size, out_str_array) }
}

/// Auxiliary state names (inputs an operator mutates).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolListAuxiliaryStates(
    symbol: SymbolHandle,
    out_size: *mut u32,
    out_str_array: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { list_inputs("MXSymbolListAuxiliaryStates", symbol, Ok(InputKind::Aux), out_size, out_str_array) }
}

/// Input names: option 0 all, 1 arguments, 2 auxiliary states.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn NNSymbolListInputNames(
    symbol: SymbolHandle,
    option: c_int,
    out_size: *mut u32,
    out_str_array: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { list_inputs("NNSymbolListInputNames", symbol, InputKind::from_code(option), out_size, out_str_array) }
}

/// Output names (`<node>_output`, ...).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolListOutputs(
    symbol: SymbolHandle,
    out_size: *mut u32,
    out_str_array: *mut *mut *const c_char,
) -> c_int {
    // SAFETY: per this function's contract.
    ffi::call("MXSymbolListOutputs", || unsafe {
        return_strs(self::symbol(symbol)?.list_outputs(), out_size, out_str_array)
    })
}

/// The number of outputs.
///
/// # Safety
/// `output_count` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetNumOutputs(symbol: SymbolHandle, output_count: *mut u32) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXSymbolGetNumOutputs", output_count, "output_count", || {
            Ok(self::symbol(symbol)?.outputs.len() as u32)
        })
    }
}

fn to_json(symbol: SymbolHandle) -> Result<String> {
    Ok(json::save(&self::symbol(symbol)?.graph(), np_shape::get() != 0))
}

/// The symbol as MXNet's JSON graph text.
///
/// # Safety
/// `out_json` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolSaveToJSON(symbol: SymbolHandle, out_json: *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXSymbolSaveToJSON", out_json, "out_json", || ffi::return_str(&to_json(symbol)?)) }
}

/// A symbol from MXNet's JSON graph text (stock's and older formats).
///
/// # Safety
/// `json` must be a string; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCreateFromJSON(json: *const c_char, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXSymbolCreateFromJSON", out, "out", || Ok(new_handle(json::load(cstr(json, "json")?)?))) }
}

/// Write the JSON text to a file.
///
/// # Safety
/// `fname` must be a string.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolSaveToFile(symbol: SymbolHandle, fname: *const c_char) -> c_int {
    ffi::call("MXSymbolSaveToFile", || {
        // SAFETY: per this function's contract.
        let path = unsafe { cstr(fname, "fname")? };
        std::fs::write(path, to_json(symbol)?)
            .map_err(|e| Error::mxnet(format!("cannot write symbol file {path}: {e}")))
    })
}

/// Read a symbol from a JSON file.
///
/// # Safety
/// `fname` must be a string; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCreateFromFile(fname: *const c_char, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXSymbolCreateFromFile", out, "out", || {
            let path = cstr(fname, "fname")?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::mxnet(format!("cannot read symbol file {path}: {e}")))?;
            Ok(new_handle(json::load(&text)?))
        })
    }
}

/// nnvm's text description of the graph.
///
/// # Safety
/// `out_str` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolPrint(symbol: SymbolHandle, out_str: *mut *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXSymbolPrint", out_str, "out_str", || ffi::return_str(&self::symbol(symbol)?.print())) }
}

/// Whether inference arguments are positional: `keys` NULL, or (what the frontend sends
/// for positional arguments) an empty key array, whose first slot reads NULL.
///
/// # Safety
/// `keys` must be NULL or readable for one pointer when `n > 0`.
unsafe fn positional(keys: *const *const c_char, n: usize) -> bool {
    // SAFETY: per this function's contract.
    keys.is_null() || (n > 0 && unsafe { (*keys).is_null() })
}

/// The given shapes: positional when `keys` is NULL (in list_arguments order), else keyword.
///
/// # Safety
/// `keys` NULL or `num_args` strings; `ind_ptr` `num_args + 1` offsets into `data`.
unsafe fn given_shapes<I: Copy + TryInto<usize>, D: Copy + Into<i64>>(
    num_args: usize,
    keys: *const *const c_char,
    ind_ptr: *const I,
    data: *const D,
) -> Result<Given<PShape>> {
    let np = np_shape::get() != 0;
    let mut shapes = Vec::with_capacity(num_args);
    if num_args > 0 {
        if ind_ptr.is_null() {
            return Err(Error::value("arg_ind_ptr must not be NULL"));
        }
        // SAFETY: per this function's contract.
        let ptrs = unsafe { std::slice::from_raw_parts(ind_ptr, num_args + 1) };
        let at = |i: usize| -> Result<usize> {
            ptrs[i].try_into().map_err(|_| Error::value("arg_ind_ptr holds a negative offset"))
        };
        for i in 0..num_args {
            let (b, e) = (at(i)?, at(i + 1)?);
            if e < b {
                return Err(Error::value(format!("arg_ind_ptr is not increasing at {i}")));
            }
            if e > b && data.is_null() {
                return Err(Error::value("arg_shape_data must not be NULL"));
            }
            // SAFETY: offsets index `data` per this function's contract.
            let dims: Vec<i64> = (b..e).map(|k| unsafe { *data.add(k) }.into()).collect();
            shapes.push(if !np && dims.is_empty() {
                None
            } else {
                Some(dims.into_iter().map(|d| if d < 0 || (!np && d == 0) { -1 } else { d }).collect())
            });
        }
    }
    if unsafe { positional(keys, num_args) } {
        Ok(Given::Positional(shapes))
    } else {
        // SAFETY: per this function's contract.
        let k = unsafe { strings(keys, num_args, "keys")? };
        Ok(Given::Keyword(k.into_iter().map(String::from).zip(shapes).collect()))
    }
}

/// Fill one per-thread shape return: legacy mode reports unknown as ndim 0 / dim 0, numpy
/// mode as -1.
fn fill<T: ShapeTls>(ret: &mut ShapeRet<T>, shapes: &[PShape]) {
    let np = np_shape::get() != 0;
    ret.ndim.clear();
    ret.data.clear();
    for s in shapes {
        match s {
            None => {
                ret.ndim.push(if np { -1 } else { 0 });
                ret.data.push(Vec::new());
            }
            Some(v) => {
                ret.ndim.push(v.len() as c_int);
                let unknown = if np { -1 } else { 0 };
                ret.data.push(
                    v.iter()
                        .map(|&d| {
                            T::try_from(if d < 0 { unknown } else { d })
                                .unwrap_or_else(|_| T::try_from(0).ok().expect("0 fits"))
                        })
                        .collect(),
                );
            }
        }
    }
    ret.ptrs = ret.data.iter().map(|d| d.as_ptr()).collect();
}

/// Access to a per-thread shape return of one dimension type.
trait ShapeTls: Copy + TryFrom<i64> + Into<i64> + 'static {
    fn with_ret<R>(f: impl FnOnce(&mut [ShapeRet<Self>; 3]) -> R) -> R;
}

impl ShapeTls for c_int {
    fn with_ret<R>(f: impl FnOnce(&mut [ShapeRet<Self>; 3]) -> R) -> R {
        SHAPES32.with(|s| f(&mut s.borrow_mut()))
    }
}

impl ShapeTls for u32 {
    fn with_ret<R>(f: impl FnOnce(&mut [ShapeRet<Self>; 3]) -> R) -> R {
        SHAPES_U32.with(|s| f(&mut s.borrow_mut()))
    }
}

impl ShapeTls for i64 {
    fn with_ret<R>(f: impl FnOnce(&mut [ShapeRet<Self>; 3]) -> R) -> R {
        SHAPES64.with(|s| f(&mut s.borrow_mut()))
    }
}

/// # Safety
/// As for [`MXSymbolInferShapeEx`].
#[allow(clippy::too_many_arguments)]
unsafe fn infer_shape_c<I: Copy + TryInto<usize>, D: ShapeTls, S: TryFrom<usize> + Default>(
    partial: bool,
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const I,
    arg_shape_data: *const D,
    sizes: [*mut S; 3],
    ndims: [*mut *const c_int; 3],
    datas: [*mut *mut *const D; 3],
    complete: *mut c_int,
) -> Result<()> {
    // SAFETY: per this function's contract.
    unsafe {
        let given = given_shapes(num_args as usize, keys, arg_ind_ptr, arg_shape_data)?;
        for k in 0..3 {
            out(sizes[k], "shape size")?;
            out(ndims[k], "shape ndim")?;
            out(datas[k], "shape data")?;
        }
        let done = out(complete, "complete")?;
        let r = infer::infer_shapes(&symbol(sym)?, given, np_shape::get() != 0)?;
        D::with_ret(|slot| {
            for (k, shapes) in [&r.args, &r.outs, &r.aux].into_iter().enumerate() {
                fill(&mut slot[k], shapes);
                *sizes[k] = S::try_from(shapes.len()).unwrap_or_default();
                *ndims[k] = slot[k].ndim.as_ptr();
                *datas[k] = slot[k].ptrs.as_mut_ptr();
            }
        });
        *done = if partial || r.complete { 1 } else { 0 };
    }
    Ok(())
}

/// Shape inference (`symbol::infer`): argument, output and auxiliary shapes, and whether
/// every shape in the graph is known.
///
/// # Safety
/// Inputs as stock documents them (`arg_ind_ptr` holds `num_args + 1` offsets into
/// `arg_shape_data`; `keys` NULL for positional arguments); out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferShapeEx(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const u32,
    arg_shape_data: *const c_int,
    in_shape_size: *mut u32,
    in_shape_ndim: *mut *const c_int,
    in_shape_data: *mut *mut *const c_int,
    out_shape_size: *mut u32,
    out_shape_ndim: *mut *const c_int,
    out_shape_data: *mut *mut *const c_int,
    aux_shape_size: *mut u32,
    aux_shape_ndim: *mut *const c_int,
    aux_shape_data: *mut *mut *const c_int,
    complete: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolInferShapeEx", || {
        // SAFETY: per this function's contract.
        unsafe {
            infer_shape_c(
                false,
                sym,
                num_args,
                keys,
                arg_ind_ptr,
                arg_shape_data,
                [in_shape_size, out_shape_size, aux_shape_size],
                [in_shape_ndim, out_shape_ndim, aux_shape_ndim],
                [in_shape_data, out_shape_data, aux_shape_data],
                complete,
            )
        }
    })
}

/// [`MXSymbolInferShapeEx`] that always reports complete (unknown shapes stay unknown).
///
/// # Safety
/// Inputs as stock documents them (`arg_ind_ptr` holds `num_args + 1` offsets into
/// `arg_shape_data`; `keys` NULL for positional arguments); out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferShapePartialEx(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const u32,
    arg_shape_data: *const c_int,
    in_shape_size: *mut u32,
    in_shape_ndim: *mut *const c_int,
    in_shape_data: *mut *mut *const c_int,
    out_shape_size: *mut u32,
    out_shape_ndim: *mut *const c_int,
    out_shape_data: *mut *mut *const c_int,
    aux_shape_size: *mut u32,
    aux_shape_ndim: *mut *const c_int,
    aux_shape_data: *mut *mut *const c_int,
    complete: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolInferShapePartialEx", || {
        // SAFETY: per this function's contract.
        unsafe {
            infer_shape_c(
                true,
                sym,
                num_args,
                keys,
                arg_ind_ptr,
                arg_shape_data,
                [in_shape_size, out_shape_size, aux_shape_size],
                [in_shape_ndim, out_shape_ndim, aux_shape_ndim],
                [in_shape_data, out_shape_data, aux_shape_data],
                complete,
            )
        }
    })
}

/// The unsigned 32-bit form of [`MXSymbolInferShapeEx`] (stock's oldest): `partial` as
/// [`MXSymbolInferShapePartialEx`].
///
/// # Safety
/// As for [`MXSymbolInferShapeEx`].
#[allow(clippy::too_many_arguments)]
unsafe fn infer_shape_u32(
    api: &'static str,
    partial: bool,
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const u32,
    arg_shape_data: *const u32,
    sizes: [*mut u32; 3],
    ndims: [*mut *const u32; 3],
    datas: [*mut *mut *const u32; 3],
    complete: *mut c_int,
) -> c_int {
    ffi::call(api, || {
        // The ndim arrays are filled as c_int and read by the caller as uint32_t: the same size
        // and alignment, and legacy shape semantics report an unknown ndim as 0, so the values
        // agree (NumPy semantics' -1 reads as 2^32-1, as stock's own cast gives; an unknown
        // dimension there is 0, which uint32_t can hold).
        let ndims = ndims.map(|p| p.cast::<*const c_int>());
        // SAFETY: per this function's contract.
        unsafe {
            infer_shape_c(partial, sym, num_args, keys, arg_ind_ptr, arg_shape_data, sizes, ndims, datas, complete)
        }
    })
}

/// [`MXSymbolInferShapeEx`] with unsigned 32-bit dimensions and ndims.
///
/// # Safety
/// Inputs as stock documents them; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferShape(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const u32,
    arg_shape_data: *const u32,
    in_shape_size: *mut u32,
    in_shape_ndim: *mut *const u32,
    in_shape_data: *mut *mut *const u32,
    out_shape_size: *mut u32,
    out_shape_ndim: *mut *const u32,
    out_shape_data: *mut *mut *const u32,
    aux_shape_size: *mut u32,
    aux_shape_ndim: *mut *const u32,
    aux_shape_data: *mut *mut *const u32,
    complete: *mut c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        infer_shape_u32(
            "MXSymbolInferShape",
            false,
            sym,
            num_args,
            keys,
            arg_ind_ptr,
            arg_shape_data,
            [in_shape_size, out_shape_size, aux_shape_size],
            [in_shape_ndim, out_shape_ndim, aux_shape_ndim],
            [in_shape_data, out_shape_data, aux_shape_data],
            complete,
        )
    }
}

/// [`MXSymbolInferShapePartialEx`] with unsigned 32-bit dimensions and ndims.
///
/// # Safety
/// Inputs as stock documents them; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferShapePartial(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const u32,
    arg_shape_data: *const u32,
    in_shape_size: *mut u32,
    in_shape_ndim: *mut *const u32,
    in_shape_data: *mut *mut *const u32,
    out_shape_size: *mut u32,
    out_shape_ndim: *mut *const u32,
    out_shape_data: *mut *mut *const u32,
    aux_shape_size: *mut u32,
    aux_shape_ndim: *mut *const u32,
    aux_shape_data: *mut *mut *const u32,
    complete: *mut c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        infer_shape_u32(
            "MXSymbolInferShapePartial",
            true,
            sym,
            num_args,
            keys,
            arg_ind_ptr,
            arg_shape_data,
            [in_shape_size, out_shape_size, aux_shape_size],
            [in_shape_ndim, out_shape_ndim, aux_shape_ndim],
            [in_shape_data, out_shape_data, aux_shape_data],
            complete,
        )
    }
}

/// A new handle to the same symbol (its nodes shared, as stock's shallow copy shares them).
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXShallowCopySymbol(src: SymbolHandle, out: *mut SymbolHandle) -> c_int {
    // SAFETY: per this function's contract.
    unsafe { ffi::call_out("MXShallowCopySymbol", out, "out", || Ok(new_handle(symbol(src)?))) }
}

/// New handles to the symbol's input variables (`list_inputs` order), in a per-thread array
/// valid until the next call on the same thread; the caller frees each handle.
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGetInputSymbols(
    sym: SymbolHandle,
    inputs: *mut *mut SymbolHandle,
    input_size: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolGetInputSymbols", || {
        let (ptr, len) = variable_handles(&symbol(sym)?, InputKind::All);
        // SAFETY: per this function's contract.
        unsafe {
            *out(input_size, "input_size")? = len as c_int;
            *out(inputs, "inputs")? = ptr;
        }
        Ok(())
    })
}

/// New handles (the caller frees each) to `sym`'s input variables of `kind`, in this thread's
/// handle list, valid until the next such call on the thread (stock keeps one list too):
/// its address and length. `MXSymbolGetInputSymbols` and `NNSymbolListInputVariables`.
pub(crate) fn variable_handles(sym: &Symbol, kind: InputKind) -> (*mut SymbolHandle, usize) {
    let vars = sym.list_inputs(kind);
    INPUT_SYMS.with(|slot| {
        let mut hs = slot.borrow_mut();
        *hs = vars
            .into_iter()
            .map(|node| new_handle(Symbol { outputs: vec![mxnet_core::symbol::Entry { node, index: 0, version: 0 }] }))
            .collect();
        (hs.as_mut_ptr(), hs.len())
    })
}

/// Stock's cut of a control-flow subgraph ([`Symbol::cut_subgraph`]): the graph's inputs
/// from outside it become variables, in place; the outputs cut off come back as new handles
/// (the caller frees each) in this thread's handle list, valid until the next such call on
/// the thread. A symbol whose output carries no `__subgraph_name__` has none (size 0).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolCutSubgraph(
    sym: SymbolHandle,
    inputs: *mut *mut SymbolHandle,
    input_size: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolCutSubgraph", || {
        if inputs.is_null() || input_size.is_null() {
            return Err(Error::value("MXSymbolCutSubgraph: inputs and input_size must not be NULL"));
        }
        let cut = symbol(sym)?.cut_subgraph();
        let (ptr, len) = INPUT_SYMS.with(|slot| {
            let mut hs = slot.borrow_mut();
            *hs = cut.into_iter().map(new_handle).collect();
            (hs.as_mut_ptr(), hs.len())
        });
        // SAFETY: per this function's contract.
        unsafe {
            *out(input_size, "input_size")? = len as c_int;
            *out(inputs, "inputs")? = ptr;
        }
        Ok(())
    })
}

/// A new operator symbol with the operator, name and attributes of `sym`'s node and no inputs
/// (stock's `Symbol::CreateFunctor` of the node's attributes; every output of `sym` must be
/// that node's).
///
/// # Safety
/// `ret_sym_handle` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXGenAtomicSymbolFromSymbol(
    sym_handle: SymbolHandle,
    ret_sym_handle: *mut SymbolHandle,
) -> c_int {
    ffi::call("MXGenAtomicSymbolFromSymbol", || {
        let s = symbol(sym_handle)?.atomic_copy()?;
        // SAFETY: per this function's contract.
        unsafe { *out(ret_sym_handle, "ret_sym_handle")? = new_handle(s) };
        Ok(())
    })
}

/// Symbolic gradients: stock 1.9.1 does not implement this function either (it fails with
/// "not implemented"); here it says so with NotImplementedError.
///
/// # Safety
/// No pointer is read.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolGrad(
    sym: SymbolHandle,
    num_wrt: u32,
    wrt: *mut *const c_char,
    out: *mut SymbolHandle,
) -> c_int {
    let _ = (sym, num_wrt, wrt, out);
    ffi::call("MXSymbolGrad", || Err(Error::not_supported("MXSymbolGrad (stock 1.9.1 does not implement it either)")))
}

/// [`MXSymbolInferShapeEx`] with 64-bit dimensions.
///
/// # Safety
/// Inputs as stock documents them (`arg_ind_ptr` holds `num_args + 1` offsets into
/// `arg_shape_data`; `keys` NULL for positional arguments); out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferShapeEx64(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const i64,
    arg_shape_data: *const i64,
    in_shape_size: *mut usize,
    in_shape_ndim: *mut *const c_int,
    in_shape_data: *mut *mut *const i64,
    out_shape_size: *mut usize,
    out_shape_ndim: *mut *const c_int,
    out_shape_data: *mut *mut *const i64,
    aux_shape_size: *mut usize,
    aux_shape_ndim: *mut *const c_int,
    aux_shape_data: *mut *mut *const i64,
    complete: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolInferShapeEx64", || {
        // SAFETY: per this function's contract.
        unsafe {
            infer_shape_c(
                false,
                sym,
                num_args,
                keys,
                arg_ind_ptr,
                arg_shape_data,
                [in_shape_size, out_shape_size, aux_shape_size],
                [in_shape_ndim, out_shape_ndim, aux_shape_ndim],
                [in_shape_data, out_shape_data, aux_shape_data],
                complete,
            )
        }
    })
}

/// [`MXSymbolInferShapePartialEx`] with 64-bit dimensions.
///
/// # Safety
/// Inputs as stock documents them (`arg_ind_ptr` holds `num_args + 1` offsets into
/// `arg_shape_data`; `keys` NULL for positional arguments); out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferShapePartialEx64(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_ind_ptr: *const i64,
    arg_shape_data: *const i64,
    in_shape_size: *mut usize,
    in_shape_ndim: *mut *const c_int,
    in_shape_data: *mut *mut *const i64,
    out_shape_size: *mut usize,
    out_shape_ndim: *mut *const c_int,
    out_shape_data: *mut *mut *const i64,
    aux_shape_size: *mut usize,
    aux_shape_ndim: *mut *const c_int,
    aux_shape_data: *mut *mut *const i64,
    complete: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolInferShapePartialEx64", || {
        // SAFETY: per this function's contract.
        unsafe {
            infer_shape_c(
                true,
                sym,
                num_args,
                keys,
                arg_ind_ptr,
                arg_shape_data,
                [in_shape_size, out_shape_size, aux_shape_size],
                [in_shape_ndim, out_shape_ndim, aux_shape_ndim],
                [in_shape_data, out_shape_data, aux_shape_data],
                complete,
            )
        }
    })
}

/// # Safety
/// As for [`MXSymbolInferType`].
#[allow(clippy::too_many_arguments)]
unsafe fn infer_type_c(
    partial: bool,
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_type_data: *const c_int,
    sizes: [*mut u32; 3],
    datas: [*mut *const c_int; 3],
    complete: *mut c_int,
) -> Result<()> {
    let n = num_args as usize;
    if n > 0 && arg_type_data.is_null() {
        return Err(Error::value("arg_type_data must not be NULL"));
    }
    let codes: &[c_int] = if n == 0 { &[] } else { unsafe { std::slice::from_raw_parts(arg_type_data, n) } };
    let types: Vec<Option<DType>> =
        codes.iter().map(|&c| if c < 0 { Ok(None) } else { DType::from_code(c).map(Some) }).collect::<Result<_>>()?;
    let given = if unsafe { positional(keys, n) } {
        Given::Positional(types)
    } else {
        // SAFETY: per the contract.
        let k = unsafe { strings(keys, n, "keys")? };
        Given::Keyword(k.into_iter().map(String::from).zip(types).collect())
    };
    // SAFETY: per the contract.
    let (s0, s1, s2) =
        unsafe { (out(sizes[0], "in_type_size")?, out(sizes[1], "out_type_size")?, out(sizes[2], "aux_type_size")?) };
    let (d0, d1, d2) =
        unsafe { (out(datas[0], "in_type_data")?, out(datas[1], "out_type_data")?, out(datas[2], "aux_type_data")?) };
    let done = unsafe { out(complete, "complete")? };
    let r = infer::infer_types(&symbol(sym)?, given)?;
    TYPES.with(|slot| {
        let mut slot = slot.borrow_mut();
        for (k, (types, (size, data))) in
            [&r.args, &r.outs, &r.aux].into_iter().zip([(s0, d0), (s1, d1), (s2, d2)]).enumerate()
        {
            slot[k] = types.iter().map(|t| t.map_or(-1, |d| d as c_int)).collect();
            *size = types.len() as u32;
            *data = slot[k].as_ptr();
        }
    });
    *done = if partial || r.complete { 1 } else { 0 };
    Ok(())
}

/// Type inference: dtype codes per argument (-1 unknown), positional or keyword.
///
/// # Safety
/// Inputs as stock documents them; out-params valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferType(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_type_data: *const c_int,
    in_type_size: *mut u32,
    in_type_data: *mut *const c_int,
    out_type_size: *mut u32,
    out_type_data: *mut *const c_int,
    aux_type_size: *mut u32,
    aux_type_data: *mut *const c_int,
    complete: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolInferType", || {
        // SAFETY: per this function's contract.
        unsafe {
            infer_type_c(
                false,
                sym,
                num_args,
                keys,
                arg_type_data,
                [in_type_size, out_type_size, aux_type_size],
                [in_type_data, out_type_data, aux_type_data],
                complete,
            )
        }
    })
}

/// [`MXSymbolInferType`] that always reports complete.
///
/// # Safety
/// As for [`MXSymbolInferType`].
#[no_mangle]
pub unsafe extern "C" fn MXSymbolInferTypePartial(
    sym: SymbolHandle,
    num_args: u32,
    keys: *mut *const c_char,
    arg_type_data: *const c_int,
    in_type_size: *mut u32,
    in_type_data: *mut *const c_int,
    out_type_size: *mut u32,
    out_type_data: *mut *const c_int,
    aux_type_size: *mut u32,
    aux_type_data: *mut *const c_int,
    complete: *mut c_int,
) -> c_int {
    ffi::call("MXSymbolInferTypePartial", || {
        // SAFETY: per this function's contract.
        unsafe {
            infer_type_c(
                true,
                sym,
                num_args,
                keys,
                arg_type_data,
                [in_type_size, out_type_size, aux_type_size],
                [in_type_data, out_type_data, aux_type_data],
                complete,
            )
        }
    })
}
