//! C API: the stock exports this library does not implement yet (sparse NDArrays, subgraph backends,
//! quantization and AMP conversion, CUDA runtime compilation, packed
//! functions, the legacy function API). Each exists, with stock's signature, and answers -1
//! with `NotImplementedError: <feature> (<function>) is not supported yet`, so a caller gets an
//! error it can handle instead of an undefined symbol. `tests/data/stock_exports_refused.txt`
//! lists them; `tests/python/test_exports.py` calls each.

use super::ffi;
use super::types::{CudaKernelHandle, CudaModuleHandle, FunctionHandle, NDArrayHandle, RtcHandle, SymbolHandle};
use mxnet_core::error::Error;
use std::ffi::{c_char, c_int, c_void};

const SUBGRAPH: &str = "subgraph backends";
const FUNC: &str = "the legacy NDArray function API";
const SPARSE: &str = "sparse storage";
const PACKED: &str = "packed functions";
const QUANT: &str = "quantization";
const AMP: &str = "AMP's reduced-precision conversion";
const RTC: &str = "CUDA runtime compilation";

/// -1 with `NotImplementedError: <what> (<api>) is not supported yet`. Reads none of the
/// caller's arguments.
#[inline(never)]
fn refuse(api: &'static str, what: &str) -> c_int {
    ffi::call(api, || Err(Error::not_supported(format!("{what} ({api})"))))
}

// Subgraph backends.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXBuildSubgraphByOpNames(
    _sym_handle: SymbolHandle,
    _prop_name: *const c_char,
    _num_ops: u32,
    _op_names: *mut *const c_char,
    _ret_sym_handle: *mut SymbolHandle,
) -> c_int {
    refuse("MXBuildSubgraphByOpNames", SUBGRAPH)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXGenBackendSubgraph(
    _sym_handle: SymbolHandle,
    _backend: *const c_char,
    _ret_sym_handle: *mut SymbolHandle,
) -> c_int {
    refuse("MXGenBackendSubgraph", SUBGRAPH)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXOptimizeForBackend(
    _sym_handle: SymbolHandle,
    _backend_name: *const c_char,
    _dev_type: c_int,
    _ret_sym_handle: *mut SymbolHandle,
    _args_len: u32,
    _in_args_handle: *mut NDArrayHandle,
    _aux_len: u32,
    _in_aux_handle: *mut NDArrayHandle,
    _num_options: u32,
    _keys: *mut *const c_char,
    _vals: *mut *const c_char,
    _num_input_shapes: u32,
    _input_shape_names: *mut *const c_char,
    _input_shape_data: *const i64,
    _input_shape_idx: *const u32,
    _num_input_dtypes: u32,
    _input_dtype_names: *mut *const c_char,
    _input_dtypes: *const c_int,
    _num_input_stypes: u32,
    _input_stype_names: *mut *const c_char,
    _input_stypes: *const c_int,
    _skip_infer: bool,
    _new_args_cnt: *mut c_int,
    _new_args_handle: *mut *mut NDArrayHandle,
    _new_arg_names_handle: *mut *mut *mut c_char,
    _new_aux_cnt: *mut c_int,
    _new_aux_handle: *mut *mut NDArrayHandle,
    _new_aux_names_handle: *mut *mut *mut c_char,
) -> c_int {
    refuse("MXOptimizeForBackend", SUBGRAPH)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRemoveSubgraphPropertyOpNames(_prop_name: *const c_char) -> c_int {
    refuse("MXRemoveSubgraphPropertyOpNames", SUBGRAPH)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRemoveSubgraphPropertyOpNamesV2(_prop_name: *const c_char) -> c_int {
    refuse("MXRemoveSubgraphPropertyOpNamesV2", SUBGRAPH)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXSetSubgraphPropertyOpNames(
    _prop_name: *const c_char,
    _num_ops: u32,
    _op_names: *mut *const c_char,
) -> c_int {
    refuse("MXSetSubgraphPropertyOpNames", SUBGRAPH)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXSetSubgraphPropertyOpNamesV2(
    _prop_name: *const c_char,
    _num_ops: u32,
    _op_names: *mut *const c_char,
) -> c_int {
    refuse("MXSetSubgraphPropertyOpNamesV2", SUBGRAPH)
}

// The legacy NDArray function API.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXFuncInvoke(
    _fun: FunctionHandle,
    _use_vars: *mut NDArrayHandle,
    _scalar_args: *mut f32,
    _mutate_vars: *mut NDArrayHandle,
) -> c_int {
    refuse("MXFuncInvoke", FUNC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXFuncInvokeEx(
    _fun: FunctionHandle,
    _use_vars: *mut NDArrayHandle,
    _scalar_args: *mut f32,
    _mutate_vars: *mut NDArrayHandle,
    _num_params: c_int,
    _param_keys: *mut *mut c_char,
    _param_vals: *mut *mut c_char,
) -> c_int {
    refuse("MXFuncInvokeEx", FUNC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXGetFunction(_name: *const c_char, _out: *mut FunctionHandle) -> c_int {
    refuse("MXGetFunction", FUNC)
}

// Extension libraries.

// Shared-memory NDArrays.

// Sparse storage.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNDArrayCreateSparseEx64(
    _storage_type: c_int,
    _shape: *const i64,
    _ndim: c_int,
    _dev_type: c_int,
    _dev_id: c_int,
    _delay_alloc: c_int,
    _dtype: c_int,
    _num_aux: u32,
    _aux_type: *mut c_int,
    _aux_ndims: *mut c_int,
    _aux_shape: *const i64,
    _out: *mut NDArrayHandle,
) -> c_int {
    refuse("MXNDArrayCreateSparseEx64", SPARSE)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNDArrayGetAuxNDArray(_handle: NDArrayHandle, _i: u32, _out: *mut NDArrayHandle) -> c_int {
    refuse("MXNDArrayGetAuxNDArray", SPARSE)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNDArrayGetAuxType(_handle: NDArrayHandle, _i: u32, _out_type: *mut c_int) -> c_int {
    refuse("MXNDArrayGetAuxType", SPARSE)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNDArrayGetDataNDArray(_handle: NDArrayHandle, _out: *mut NDArrayHandle) -> c_int {
    refuse("MXNDArrayGetDataNDArray", SPARSE)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNDArraySyncCheckFormat(_handle: NDArrayHandle, _full_check: bool) -> c_int {
    refuse("MXNDArraySyncCheckFormat", SPARSE)
}

// Packed functions.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNetFuncCall(
    _func: *mut c_void,
    _arg_values: *mut c_void,
    _type_codes: *mut c_int,
    _num_args: c_int,
    _ret_val: *mut c_void,
    _ret_type_code: *mut c_int,
) -> c_int {
    refuse("MXNetFuncCall", PACKED)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNetFuncFree(_func: *mut c_void) -> c_int {
    refuse("MXNetFuncFree", PACKED)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXNetObjectFree(_obj: *mut c_void) -> c_int {
    refuse("MXNetObjectFree", PACKED)
}

// Quantization.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXQuantizeSymbol(
    _sym_handle: SymbolHandle,
    _ret_sym_handle: *mut SymbolHandle,
    _dev_type: *const c_int,
    _num_excluded_sym_names: u32,
    _excluded_sym_names: *mut *const c_char,
    _num_excluded_op_names: u32,
    _excluded_op_names: *mut *const c_char,
    _num_offline: u32,
    _offline_params: *mut *const c_char,
    _quantized_dtype: *const c_char,
    _calib_quantize: bool,
    _quantize_mode: *const c_char,
    _quantize_granularity: *const c_char,
    _out_num_calib_names: *mut u32,
    _out_calib_names: *mut *mut *const c_char,
) -> c_int {
    refuse("MXQuantizeSymbol", QUANT)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXSetCalibTableToQuantizedSymbol(
    _qsym_handle: SymbolHandle,
    _num_layers: u32,
    _layer_names: *mut *const c_char,
    _low_quantiles: *const f32,
    _high_quantiles: *const f32,
    _ret_sym_handle: *mut SymbolHandle,
) -> c_int {
    refuse("MXSetCalibTableToQuantizedSymbol", QUANT)
}

// AMP's reduced-precision conversion.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXReducePrecisionSymbol(
    _sym_handle: SymbolHandle,
    _ret_sym_handle: *mut SymbolHandle,
    _num_args: u32,
    _arg_type_data: *const c_int,
    _num_ind_ptr: u32,
    _ind_ptr: *const c_int,
    _target_dtype: *const c_int,
    _cast_optional_params: c_int,
    _num_target_dtype_op_names: u32,
    _num_fp32_op_names: u32,
    _num_widest_dtype_op_names: u32,
    _num_conditional_fp32_op_names: u32,
    _num_excluded_symbols: u32,
    _num_model_params: u32,
    _target_dtype_op_names: *mut *const c_char,
    _fp32_op_names: *mut *const c_char,
    _widest_dtype_op_names: *mut *const c_char,
    _conditional_fp32_op_names: *mut *const c_char,
    _excluded_symbols: *mut *const c_char,
    _conditional_param_names: *mut *const c_char,
    _conditional_param_vals: *mut *const c_char,
    _model_param_names: *mut *const c_char,
    _arg_names: *mut *const c_char,
) -> c_int {
    refuse("MXReducePrecisionSymbol", AMP)
}

// CUDA runtime compilation.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcCreate(
    _name: *mut c_char,
    _num_input: u32,
    _num_output: u32,
    _input_names: *mut *mut c_char,
    _output_names: *mut *mut c_char,
    _inputs: *mut NDArrayHandle,
    _outputs: *mut NDArrayHandle,
    _kernel: *mut c_char,
    _out: *mut RtcHandle,
) -> c_int {
    refuse("MXRtcCreate", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcCudaKernelCall(
    _handle: CudaKernelHandle,
    _dev_id: c_int,
    _args: *mut *mut c_void,
    _grid_dim_x: u32,
    _grid_dim_y: u32,
    _grid_dim_z: u32,
    _block_dim_x: u32,
    _block_dim_y: u32,
    _block_dim_z: u32,
    _shared_mem: u32,
) -> c_int {
    refuse("MXRtcCudaKernelCall", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcCudaKernelCreate(
    _handle: CudaModuleHandle,
    _name: *const c_char,
    _num_args: c_int,
    _is_ndarray: *mut c_int,
    _is_const: *mut c_int,
    _arg_types: *mut c_int,
    _out: *mut CudaKernelHandle,
) -> c_int {
    refuse("MXRtcCudaKernelCreate", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcCudaKernelFree(_handle: CudaKernelHandle) -> c_int {
    refuse("MXRtcCudaKernelFree", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcCudaModuleCreate(
    _source: *const c_char,
    _num_options: c_int,
    _options: *mut *const c_char,
    _num_exports: c_int,
    _exports: *mut *const c_char,
    _out: *mut CudaModuleHandle,
) -> c_int {
    refuse("MXRtcCudaModuleCreate", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcCudaModuleFree(_handle: CudaModuleHandle) -> c_int {
    refuse("MXRtcCudaModuleFree", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcFree(_handle: RtcHandle) -> c_int {
    refuse("MXRtcFree", RTC)
}

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXRtcPush(
    _handle: RtcHandle,
    _num_input: u32,
    _num_output: u32,
    _inputs: *mut NDArrayHandle,
    _outputs: *mut NDArrayHandle,
    _grid_dim_x: u32,
    _grid_dim_y: u32,
    _grid_dim_z: u32,
    _block_dim_x: u32,
    _block_dim_y: u32,
    _block_dim_z: u32,
) -> c_int {
    refuse("MXRtcPush", RTC)
}

// Stock exports it for TVM's bridge; no header declares it.

/// Not supported yet: -1 with NotImplementedError.
#[no_mangle]
pub extern "C" fn MXTVMBridge(_pregister: *mut c_void) -> c_int {
    refuse("MXTVMBridge", "the TVM bridge")
}
