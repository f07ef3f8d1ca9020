//! C API: the Predict API of stock `c_predict_api.h` (MXPredCreate[Ex|PartialOut|MultiThread],
//! MXPredReshape, GetOutputShape/Type, SetInput, Forward, PartialForward, GetOutput,
//! SetMonitorCallback, Free) and its NDArray lists (MXNDListCreate/Get/Free), over
//! `executor::predict`. Shapes and list entries handed out stay valid until their predictor or
//! list is freed.

use super::executor::c_monitor;
use super::ffi::{self, cstr, list, out};
use super::types::{NDListHandle, PredMonitorCallback, PredictorHandle};
use crate::handle::HandleTable;
use mxnet_core::context::Context;
use mxnet_core::error::{Error, Result};
use mxnet_core::executor::predict::{self, Predictor, PredictorSpec};
use mxnet_core::ndarray::DType;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

/// A predictor with its output shapes as `uint32_t` arrays (handed out by
/// `MXPredGetOutputShape`; fixed for the predictor's life).
struct CPredictor {
    pred: Predictor,
    shapes: Vec<Vec<u32>>,
}

/// A loaded list with its keys and shapes in C form (fixed for the list's life).
struct CList {
    entries: Vec<predict::ListEntry>,
    keys: Vec<CString>,
    shapes: Vec<Vec<u32>>,
}

fn predictors() -> &'static HandleTable<CPredictor> {
    static T: OnceLock<HandleTable<CPredictor>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(14, "Predictor"))
}

fn lists() -> &'static HandleTable<CList> {
    static T: OnceLock<HandleTable<CList>> = OnceLock::new();
    T.get_or_init(|| HandleTable::new(15, "NDList"))
}

fn to_u32(shape: &[usize]) -> Result<Vec<u32>> {
    shape
        .iter()
        .map(|&d| u32::try_from(d).map_err(|_| Error::value(format!("dimension {d} does not fit in uint32_t"))))
        .collect()
}

fn wrap(pred: Predictor) -> Result<PredictorHandle> {
    let shapes = (0..pred.num_outputs()).map(|i| pred.output_shape(i).and_then(to_u32)).collect::<Result<Vec<_>>>()?;
    Ok(predictors().insert(Arc::new(CPredictor { pred, shapes })))
}

/// Input shapes by name in stock's CSR form: key `i` has the dimensions
/// `data[indptr[i]..indptr[i + 1]]`.
///
/// # Safety
/// When `n > 0`, `keys` must hold `n` C strings, `indptr` `n + 1` values and `data` the
/// `indptr[n]` values they index (none is read when `n` is 0).
unsafe fn input_shapes(
    n: u32,
    keys: *mut *const c_char,
    indptr: *const u32,
    data: *const u32,
) -> Result<Vec<(String, Vec<usize>)>> {
    let n = n as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: per this function's contract.
    let (keys, indptr) = unsafe { (list(keys, n, "input_keys")?, list(indptr, n + 1, "input_shape_indptr")?) };
    if indptr[0] != 0 || indptr.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::value(format!("input_shape_indptr must start at 0 and never decrease, got {indptr:?}")));
    }
    // SAFETY: per this function's contract, `data` holds `indptr[n]` values.
    let data = unsafe { list(data, indptr[n] as usize, "input_shape_data")? };
    keys.iter()
        .enumerate()
        .map(|(i, &k)| {
            // SAFETY: per this function's contract.
            let key = unsafe { cstr(k, "an input key")? };
            let dims = data[indptr[i] as usize..indptr[i + 1] as usize].iter().map(|&d| d as usize).collect();
            Ok((key.to_string(), dims))
        })
        .collect()
}

/// The arguments every `MXPredCreate*` function takes: the model and the input shapes.
struct Model {
    symbol_json: *const c_char,
    param_bytes: *const c_void,
    param_size: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_input_nodes: u32,
    input_keys: *mut *const c_char,
    input_shape_indptr: *const u32,
    input_shape_data: *const u32,
}

/// The common body of the `MXPredCreate*` functions: `copies` handles written to `out`.
///
/// # Safety
/// As the callers' contracts: strings NUL-terminated, arrays of the counts given, `out` valid
/// for `copies` writes.
unsafe fn create(
    m: Model,
    outputs: Vec<String>,
    dtypes: Vec<(String, DType)>,
    copies: usize,
    out: *mut PredictorHandle,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::value("out must not be NULL"));
    }
    // SAFETY: per this function's contract.
    let (symbol_json, params, inputs) = unsafe {
        (
            cstr(m.symbol_json, "symbol_json_str")?,
            list(m.param_bytes.cast::<u8>(), m.param_size, "param_bytes")?,
            input_shapes(m.num_input_nodes, m.input_keys, m.input_shape_indptr, m.input_shape_data)?,
        )
    };
    let spec = PredictorSpec {
        symbol_json,
        params,
        ctx: Context::from_codes(m.dev_type, m.dev_id)?,
        inputs: &inputs,
        outputs: &outputs,
        dtypes: &dtypes,
    };
    let made = Predictor::create(&spec, copies)?;
    // Wrapped first, written after: on failure nothing is written and nothing leaks.
    let mut handles = Vec::with_capacity(made.len());
    for p in made {
        match wrap(p) {
            Ok(h) => handles.push(h),
            Err(e) => {
                for h in handles {
                    let _ = predictors().remove(h);
                }
                return Err(e);
            }
        }
    }
    for (i, h) in handles.into_iter().enumerate() {
        // SAFETY: `out` holds `copies` slots per this function's contract.
        unsafe { *out.add(i) = h };
    }
    Ok(())
}

/// Load a symbol (JSON) and its parameters (the bytes of a parameter file: `arg:`/`aux:`
/// entries, as `HybridBlock.export` and `save_checkpoint` write them) and bind them on a device
/// (1 CPU, 2 GPU) for inference with the given input shapes (stock's CSR form:
/// `input_shape_data[input_shape_indptr[i]..input_shape_indptr[i + 1]]` is input `i`'s shape).
/// Every other shape is inferred; an argument the file does not hold starts as zeros.
///
/// # Safety
/// Strings must be NUL-terminated; `param_bytes` must hold `param_size` bytes; `input_keys`
/// and `input_shape_indptr` must hold `num_input_nodes` and `num_input_nodes + 1` values;
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXPredCreate(
    symbol_json_str: *const c_char,
    param_bytes: *const c_void,
    param_size: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_input_nodes: u32,
    input_keys: *mut *const c_char,
    input_shape_indptr: *const u32,
    input_shape_data: *const u32,
    out: *mut PredictorHandle,
) -> c_int {
    ffi::call("MXPredCreate", || {
        // SAFETY: per this function's contract.
        unsafe {
            let model = Model {
                symbol_json: symbol_json_str,
                param_bytes,
                param_size,
                dev_type,
                dev_id,
                num_input_nodes,
                input_keys,
                input_shape_indptr,
                input_shape_data,
            };
            create(model, Vec::new(), Vec::new(), 1, out)
        }
    })
}

/// [`MXPredCreate`] with the dtypes (stock's type codes) of arguments that the parameter
/// file does not hold, by name (float32 otherwise); the parameters keep their own.
///
/// # Safety
/// As [`MXPredCreate`]; `provided_arg_dtype_names` and `provided_arg_dtypes` must hold
/// `num_provided_arg_dtypes` values.
#[no_mangle]
pub unsafe extern "C" fn MXPredCreateEx(
    symbol_json_str: *const c_char,
    param_bytes: *const c_void,
    param_size: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_input_nodes: u32,
    input_keys: *mut *const c_char,
    input_shape_indptr: *const u32,
    input_shape_data: *const u32,
    num_provided_arg_dtypes: u32,
    provided_arg_dtype_names: *mut *const c_char,
    provided_arg_dtypes: *const c_int,
    out: *mut PredictorHandle,
) -> c_int {
    ffi::call("MXPredCreateEx", || {
        let n = num_provided_arg_dtypes;
        // SAFETY: per this function's contract.
        let (names, codes) = unsafe {
            (
                list(provided_arg_dtype_names, n, "provided_arg_dtype_names")?,
                list(provided_arg_dtypes, n, "provided_arg_dtypes")?,
            )
        };
        let dtypes = names
            .iter()
            .zip(codes)
            // SAFETY: per this function's contract.
            .map(|(&k, &c)| Ok((unsafe { cstr(k, "a dtype name")? }.to_string(), DType::from_code(c)?)))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: per this function's contract.
        unsafe {
            let model = Model {
                symbol_json: symbol_json_str,
                param_bytes,
                param_size,
                dev_type,
                dev_id,
                num_input_nodes,
                input_keys,
                input_shape_indptr,
                input_shape_data,
            };
            create(model, Vec::new(), dtypes, 1, out)
        }
    })
}

/// [`MXPredCreate`] computing the outputs of the named nodes (`<key>_output` among the
/// symbol's internal outputs) instead of the symbol's.
///
/// # Safety
/// As [`MXPredCreate`]; `output_keys` must hold `num_output_nodes` C strings.
#[no_mangle]
pub unsafe extern "C" fn MXPredCreatePartialOut(
    symbol_json_str: *const c_char,
    param_bytes: *const c_void,
    param_size: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_input_nodes: u32,
    input_keys: *mut *const c_char,
    input_shape_indptr: *const u32,
    input_shape_data: *const u32,
    num_output_nodes: u32,
    output_keys: *mut *const c_char,
    out: *mut PredictorHandle,
) -> c_int {
    ffi::call("MXPredCreatePartialOut", || {
        // SAFETY: per this function's contract.
        let keys = unsafe { list(output_keys, num_output_nodes, "output_keys")? };
        let outputs = keys
            .iter()
            // SAFETY: per this function's contract.
            .map(|&k| Ok(unsafe { cstr(k, "an output key")? }.to_string()))
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: per this function's contract.
        unsafe {
            let model = Model {
                symbol_json: symbol_json_str,
                param_bytes,
                param_size,
                dev_type,
                dev_id,
                num_input_nodes,
                input_keys,
                input_shape_indptr,
                input_shape_data,
            };
            create(model, outputs, Vec::new(), 1, out)
        }
    })
}

/// `num_threads` predictors written to `out[0..num_threads]`, one per thread: they share the
/// parameters and each has its own inputs and outputs, so each may run on its own thread at
/// the same time as the others. (Stock requires `MXNET_ENGINE_TYPE=NaiveEngine` here; this
/// library works with every engine.)
///
/// # Safety
/// As [`MXPredCreate`]; `out` must be NULL or hold `num_threads` slots.
#[no_mangle]
pub unsafe extern "C" fn MXPredCreateMultiThread(
    symbol_json_str: *const c_char,
    param_bytes: *const c_void,
    param_size: c_int,
    dev_type: c_int,
    dev_id: c_int,
    num_input_nodes: u32,
    input_keys: *mut *const c_char,
    input_shape_indptr: *const u32,
    input_shape_data: *const u32,
    num_threads: c_int,
    out: *mut PredictorHandle,
) -> c_int {
    ffi::call("MXPredCreateMultiThread", || {
        let copies = usize::try_from(num_threads)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::value(format!("num_threads must be positive, got {num_threads}")))?;
        // SAFETY: per this function's contract.
        unsafe {
            let model = Model {
                symbol_json: symbol_json_str,
                param_bytes,
                param_size,
                dev_type,
                dev_id,
                num_input_nodes,
                input_keys,
                input_shape_indptr,
                input_shape_data,
            };
            create(model, Vec::new(), Vec::new(), copies, out)
        }
    })
}

/// A new predictor for new input shapes, sharing `handle`'s parameters (both are freed with
/// [`MXPredFree`]). Only the inputs named may change shape; any other argument must keep its
/// number of elements.
///
/// # Safety
/// As [`MXPredCreate`]'s input arrays; `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXPredReshape(
    num_input_nodes: u32,
    input_keys: *mut *const c_char,
    input_shape_indptr: *const u32,
    input_shape_data: *const u32,
    handle: PredictorHandle,
    out: *mut PredictorHandle,
) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXPredReshape", out, "out", || {
            let p = predictors().get(handle)?;
            let inputs = input_shapes(num_input_nodes, input_keys, input_shape_indptr, input_shape_data)?;
            wrap(p.pred.reshape(&inputs)?)
        })
    }
}

/// Output `index`'s shape: `*shape_data` points to `*shape_ndim` values owned by the predictor
/// (valid until it is freed).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXPredGetOutputShape(
    handle: PredictorHandle,
    index: u32,
    shape_data: *mut *mut u32,
    shape_ndim: *mut u32,
) -> c_int {
    ffi::call("MXPredGetOutputShape", || {
        // SAFETY: per this function's contract.
        let (data, ndim) = unsafe { (out(shape_data, "shape_data")?, out(shape_ndim, "shape_ndim")?) };
        let p = predictors().get(handle)?;
        p.pred.output_shape(index as usize)?;
        let s = &p.shapes[index as usize];
        // The shapes live as long as the predictor (its handle table entry holds them), and
        // C never writes through this pointer (stock's `uint32_t**` is only a type).
        *data = s.as_ptr().cast_mut();
        *ndim = s.len() as u32;
        Ok(())
    })
}

/// Output `out_index`'s dtype (stock's type code) in `*out_dtype`. (Stock writes it to
/// `out_dtype[out_index]`; here it is always `*out_dtype`.)
///
/// # Safety
/// `out_dtype` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXPredGetOutputType(handle: PredictorHandle, out_index: u32, out_dtype: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXPredGetOutputType", out_dtype, "out_dtype", || {
            Ok(predictors().get(handle)?.pred.output_dtype(out_index as usize)? as c_int)
        })
    }
}

/// Copy `size` elements into argument `key` (an input, or a parameter) as stock does: `data`
/// holds elements of the argument's dtype (float32 unless created otherwise with
/// [`MXPredCreateEx`]), and `size` must be its number of elements.
///
/// # Safety
/// `key` must be NUL-terminated; `data` must hold `size` elements of the argument's dtype.
#[no_mangle]
pub unsafe extern "C" fn MXPredSetInput(
    handle: PredictorHandle,
    key: *const c_char,
    data: *const f32,
    size: u32,
) -> c_int {
    ffi::call("MXPredSetInput", || {
        // SAFETY: per this function's contract.
        let key = unsafe { cstr(key, "key")? };
        let a = predictors().get(handle)?.pred.argument(key)?;
        if data.is_null() && size > 0 {
            return Err(Error::value("data must not be NULL"));
        }
        // SAFETY: per this function's contract (the length is checked against the array).
        unsafe { a.copy_from_host(data.cast(), size as usize) }
    })
}

/// Run the graph (inference); the outputs are ready for [`MXPredGetOutput`].
#[no_mangle]
pub extern "C" fn MXPredForward(handle: PredictorHandle) -> c_int {
    ffi::call("MXPredForward", || predictors().get(handle)?.pred.forward())
}

/// Run node `step` of the graph (topological order, input variables included, which run
/// nothing): step 0 starts a forward, each step must follow the one before, and after the
/// last one the outputs are ready. `*step_left` is the number of steps after this one.
///
/// # Safety
/// `step_left` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXPredPartialForward(handle: PredictorHandle, step: c_int, step_left: *mut c_int) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        ffi::call_out("MXPredPartialForward", step_left, "step_left", || {
            let step =
                usize::try_from(step).map_err(|_| Error::value(format!("step must not be negative, got {step}")))?;
            let left = predictors().get(handle)?.pred.partial_forward(step)?;
            c_int::try_from(left).map_err(|_| Error::value("the graph has more steps than an int counts"))
        })
    }
}

/// Copy output `index` (`size` elements of its dtype, see [`MXPredGetOutputType`]) into
/// `data`, after the forward that computes it.
///
/// # Safety
/// `data` must have room for `size` elements of the output's dtype.
#[no_mangle]
pub unsafe extern "C" fn MXPredGetOutput(handle: PredictorHandle, index: u32, data: *mut f32, size: u32) -> c_int {
    ffi::call("MXPredGetOutput", || {
        let a = predictors().get(handle)?.pred.output(index as usize)?;
        if data.is_null() && size > 0 {
            return Err(Error::value("data must not be NULL"));
        }
        // SAFETY: per this function's contract (the length is checked against the array).
        unsafe { a.copy_to_host(data.cast(), size as usize) }
    })
}

/// Call `callback` after each operator of later forwards with each output (`<node>_output`;
/// with `monitor_all` each operator's inputs first), as a new array handle the callee frees
/// with `MXNDArrayFree`; NULL removes the monitor.
#[no_mangle]
pub extern "C" fn MXPredSetMonitorCallback(
    handle: PredictorHandle,
    callback: PredMonitorCallback,
    callback_handle: *mut c_void,
    monitor_all: bool,
) -> c_int {
    ffi::call("MXPredSetMonitorCallback", || {
        let p = predictors().get(handle)?;
        p.pred.set_monitor(callback.map(|f| c_monitor(f, callback_handle, monitor_all)));
        Ok(())
    })
}

/// Free a predictor (the shapes it handed out go with it); NULL does nothing, as in stock.
#[no_mangle]
pub extern "C" fn MXPredFree(handle: PredictorHandle) -> c_int {
    ffi::call("MXPredFree", || if handle.is_null() { Ok(()) } else { predictors().remove(handle).map(drop) })
}

/// Load an NDArray list file's bytes (`nd.save`'s format, e.g. a mean image): the arrays as
/// float32 values, read with [`MXNDListGet`]; `*out_length` is their number.
///
/// # Safety
/// `nd_file_bytes` must hold `nd_file_size` bytes; out-params must be NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDListCreate(
    nd_file_bytes: *const c_char,
    nd_file_size: c_int,
    out: *mut NDListHandle,
    out_length: *mut u32,
) -> c_int {
    ffi::call("MXNDListCreate", || {
        // SAFETY: per this function's contract.
        let (o, len) = unsafe { (self::out(out, "out")?, self::out(out_length, "out_length")?) };
        // SAFETY: per this function's contract.
        let bytes = unsafe { list(nd_file_bytes.cast::<u8>(), nd_file_size, "nd_file_bytes")? };
        let entries = predict::load_nd_list(bytes)?;
        let n = u32::try_from(entries.len()).map_err(|_| Error::value("the list has too many arrays"))?;
        let keys = entries
            .iter()
            .map(|e| CString::new(e.key.as_str()).map_err(|_| Error::value("an array name holds a NUL byte")))
            .collect::<Result<Vec<_>>>()?;
        let shapes = entries.iter().map(|e| to_u32(&e.shape)).collect::<Result<Vec<_>>>()?;
        *o = lists().insert(Arc::new(CList { entries, keys, shapes }));
        *len = n;
        Ok(())
    })
}

/// Entry `index` of a list: its name (empty in an unnamed list), float32 values and shape,
/// owned by the list (valid until [`MXNDListFree`]).
///
/// # Safety
/// Out-params must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MXNDListGet(
    handle: NDListHandle,
    index: u32,
    out_key: *mut *const c_char,
    out_data: *mut *const f32,
    out_shape: *mut *const u32,
    out_ndim: *mut u32,
) -> c_int {
    ffi::call("MXNDListGet", || {
        // SAFETY: per this function's contract.
        let (key, data, shape, ndim) = unsafe {
            (
                out(out_key, "out_key")?,
                out(out_data, "out_data")?,
                out(out_shape, "out_shape")?,
                out(out_ndim, "out_ndim")?,
            )
        };
        let l = lists().get(handle)?;
        let i = index as usize;
        let e = l.entries.get(i).ok_or_else(|| {
            Error::index(format!("index {index} out of range: the list has {} arrays", l.entries.len()))
        })?;
        // All owned by the list, which its handle table entry keeps until MXNDListFree.
        *key = l.keys[i].as_ptr();
        *data = e.data.as_ptr();
        *shape = l.shapes[i].as_ptr();
        *ndim = l.shapes[i].len() as u32;
        Ok(())
    })
}

/// Free a list (the values and names it handed out go with it); NULL does nothing, as in
/// stock.
#[no_mangle]
pub extern "C" fn MXNDListFree(handle: NDListHandle) -> c_int {
    ffi::call("MXNDListFree", || if handle.is_null() { Ok(()) } else { lists().remove(handle).map(drop) })
}
