//! Operators of extension libraries (`MXLoadLib`, `mx.library.load`).
//!
//! Owns: loading a library built against stock 1.9.1's `lib_api.h` (its `_opVersion` must be
//! `MX_LIBRARY_VERSION` 11; `initialize` gets MXNet's version, 10901), its C entry points
//! (the `_opCall*` functions `lib_api.cc` compiles into the library, through which every
//! function of an operator is called), the operators made from what `_opRegGet` lists, and
//! the calls into them: attribute parsing (the input and output counts), shape and type
//! inference, the forward and backward kernels of stateless operators, and the state of a
//! stateful operator (`createOpState`), made per call and kept for that call's backward.
//!
//! The protocol is stock's (`src/c_api/c_api.cc`, `registerOperators`): an operator's
//! attributes go to the library as string pairs; its backward, `_backward_<name>`, takes the
//! output gradients, then the inputs, then the outputs, and writes one gradient per input; the
//! library's failures come back as `Extension Traceback` messages (`_msgSize`/`_msgGet`).
//! Kernels get workspace memory (`OpResource::alloc_cpu`) that lives until they return, and
//! 1,024 `std::mt19937` states (`get_cpu_rand_states`) shared by every extension call.
//!
//! Not supported yet, and refused when a library is loaded (nothing of it is registered
//! then): subgraph operators, graph partitioners and graph passes. Extension operators run on
//! CPU contexts only and on dense arrays; an operator's `mutateInputs` is asked once, with no
//! attributes, when the library is loaded.

use super::invoke::{self, ReqList};
use super::param::Attrs;
use super::tensor::{OutBlob, TBlob};
use super::{Grad, Inputs, Meta, OpCtx, OpDef, Req};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::ndarray::{DType, NDArray};
use crate::sync::{Mutex, RwLock};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

/// `MX_LIBRARY_VERSION` of stock 1.9.1's `lib_api.h`.
pub const LIBRARY_VERSION: c_int = 11;
/// MXNet's version as `initialize` gets it (`MXNET_VERSION`).
const MXNET_VERSION: c_int = 10901;

/// A function of the library that is only passed back to it (`fcomp_t`, `parseAttrs_t`, ...:
/// C++ function pointers the `_opCall*` functions call).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
struct LibFn(*const c_void);

// SAFETY: a code address in a library that is never unloaded (see `load`); it is only passed
// back to that library's own functions.
unsafe impl Send for LibFn {}
unsafe impl Sync for LibFn {}

// The library's functions are declared "C-unwind": a C++ exception that escapes one (stock
// catches them; a library should not throw) then aborts the process in a defined way instead
// of unwinding through Rust frames declared not to unwind.
type Keys = *const *const c_char;
type XpuMalloc = unsafe extern "C" fn(*mut c_void, c_int) -> *mut c_void;
type SparseMalloc =
    unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, *mut *mut c_void, *mut *mut i64, *mut *mut i64);

/// The tensors of a kernel call, after the function (and, stateful, the state) that runs:
/// inputs (shapes, dims, data, types, version ids, device types, device ids, count), the
/// same for outputs, the allocators and stream, the sparse parts and the random states.
macro_rules! kernel_args {
    ($($head:ty),*) => {
        unsafe extern "C-unwind" fn(
            $($head,)*
            *const *const i64, *mut c_int, *mut *mut c_void, *mut c_int, *mut usize, *mut *const c_char, *mut c_int, c_int,
            *const *const i64, *mut c_int, *mut *mut c_void, *mut c_int, *mut usize, *mut *const c_char, *mut c_int, c_int,
            XpuMalloc, *mut c_void, XpuMalloc, *mut c_void, *mut c_void,
            SparseMalloc, *mut c_void,
            *mut c_int, *mut c_int,
            *mut *mut c_void, *mut *mut c_void, *mut *mut c_void, *mut *mut c_void,
            *mut i64, *mut i64, *mut i64, *mut i64,
            *mut c_void, *mut c_void,
        ) -> c_int
    };
}

type OpVersionFn = unsafe extern "C-unwind" fn() -> c_int;
type InitializeFn = unsafe extern "C-unwind" fn(c_int) -> c_int;
type CountFn = unsafe extern "C-unwind" fn() -> c_int;
// `_msgGet`, `_opRegGet`, `_opCallFree` and `_opCallDestroyOpState` return nothing in
// `lib_api.cc`, whatever the header's typedefs say.
type MsgGetFn = unsafe extern "C-unwind" fn(c_int, *mut *const c_char);
type OpRegGetFn = unsafe extern "C-unwind" fn(
    c_int,
    *mut *const c_char,
    *mut c_int,
    *mut *const *const c_char,
    *mut *const LibFn,
    *mut c_int,
    *mut *const *const c_char,
    *mut *const LibFn,
    *mut c_int,
    *mut *const *const c_char,
    *mut *const LibFn,
    *mut c_int,
    *mut LibFn,
    *mut LibFn,
    *mut LibFn,
    *mut LibFn,
    *mut LibFn,
);
type FreeFn = unsafe extern "C-unwind" fn(*mut c_void);
type ParseAttrsFn = unsafe extern "C-unwind" fn(LibFn, Keys, Keys, c_int, *mut c_int, *mut c_int) -> c_int;
type InferShapeFn = unsafe extern "C-unwind" fn(
    LibFn,
    Keys,
    Keys,
    c_int,
    *mut *mut u32,
    *mut c_int,
    c_int,
    *mut *mut *mut u32,
    *mut *mut c_int,
    *mut *mut *mut u32,
    *mut *mut c_int,
    c_int,
) -> c_int;
type InferTypeFn = unsafe extern "C-unwind" fn(LibFn, Keys, Keys, c_int, *mut c_int, c_int, *mut c_int, c_int) -> c_int;
type MutateFn = unsafe extern "C-unwind" fn(LibFn, Keys, Keys, c_int, *mut *mut c_int, *mut c_int) -> c_int;
type CreateStateFn = unsafe extern "C-unwind" fn(
    LibFn,
    Keys,
    Keys,
    c_int,
    *const c_char,
    c_int,
    *mut *mut u32,
    *mut c_int,
    c_int,
    *const c_int,
    *mut *mut c_void,
) -> c_int;
type DestroyStateFn = unsafe extern "C-unwind" fn(*mut c_void);
type ComputeFn = kernel_args!(LibFn, Keys, Keys, c_int);
type StatefulFn = kernel_args!(c_int, *mut c_void);

/// The library's C entry points (all of `lib_api.cc`'s operator functions).
#[derive(Clone, Copy)]
struct Api {
    msg_size: CountFn,
    msg_get: MsgGetFn,
    free: FreeFn,
    parse_attrs: ParseAttrsFn,
    infer_shape: InferShapeFn,
    infer_type: InferTypeFn,
    mutate: MutateFn,
    compute: ComputeFn,
    create_state: CreateStateFn,
    destroy_state: DestroyStateFn,
    stateful: StatefulFn,
}

impl Api {
    /// The library's messages so far, as stock appends them to an error.
    fn traceback(&self) -> String {
        // SAFETY: `_msgSize` takes nothing; `_msgGet` writes a pointer to a string the library
        // keeps (its message list only grows).
        unsafe {
            let n = (self.msg_size)();
            let mut s = String::new();
            if n > 0 {
                s.push_str("\nExtension Traceback:\n");
            }
            for i in 0..n {
                let mut p: *const c_char = std::ptr::null();
                (self.msg_get)(i, &mut p);
                let text = if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() };
                s.push_str(&format!("\t[{i}] {text}\n"));
            }
            s
        }
    }

    /// `rc` of the library's `what` for `op`: 0 is a failure.
    fn check(&self, rc: c_int, what: &str, op: &str) -> Result<()> {
        if rc != 0 {
            return Ok(());
        }
        Err(Error::mxnet(format!("Error calling {what} for custom operator '{op}'{}", self.traceback())))
    }
}

/// One operator of a library, with the functions it registered (the CPU ones; a context other
/// than "cpu" is not run).
struct ExtOp {
    name: &'static str,
    /// `_backward_<name>`, the name of its backward operator.
    backward_name: &'static str,
    api: Api,
    parse: LibFn,
    infer_type: LibFn,
    infer_shape: LibFn,
    forward: Option<LibFn>,
    backward: Option<LibFn>,
    create_state: Option<LibFn>,
}

/// An operator's attributes as the library gets them.
struct CAttrs {
    _strings: Vec<CString>,
    keys: Vec<*const c_char>,
    vals: Vec<*const c_char>,
}

impl CAttrs {
    fn of(op: &str, attrs: &Attrs) -> Result<CAttrs> {
        let mut strings = Vec::with_capacity(attrs.extra().len() * 2);
        let (mut keys, mut vals) = (Vec::new(), Vec::new());
        for (k, v) in attrs.extra() {
            let c = |s: &str| {
                CString::new(s).map_err(|_| Error::value(format!("attribute {k} of operator {op} contains a NUL byte")))
            };
            let (ck, cv) = (c(k)?, c(v)?);
            keys.push(ck.as_ptr());
            vals.push(cv.as_ptr());
            strings.push(ck);
            strings.push(cv);
        }
        Ok(CAttrs { _strings: strings, keys, vals })
    }
    fn len(&self) -> c_int {
        self.keys.len() as c_int
    }
}

fn c_count(n: usize, what: &str) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::value(format!("{what} ({n}) is too large for an extension operator")))
}

/// An array the library allocated (with `malloc`), released with its `_opCallFree`.
fn lib_free(api: &Api, p: *mut c_void) {
    if !p.is_null() {
        // SAFETY: `p` came from the library's allocator and is freed once, here.
        unsafe { (api.free)(p) };
    }
}

impl ExtOp {
    /// The input and output counts `parseAttrs` gives for these attributes.
    fn counts(&self, attrs: &CAttrs) -> Result<(usize, usize)> {
        let (mut n_in, mut n_out) = (-1, -1);
        // SAFETY: the key and value arrays hold `len` strings that outlive the call; the counts
        // are valid for writes.
        let rc = unsafe {
            (self.api.parse_attrs)(
                self.parse,
                attrs.keys.as_ptr(),
                attrs.vals.as_ptr(),
                attrs.len(),
                &mut n_in,
                &mut n_out,
            )
        };
        self.api.check(rc, "ParseAttrs", self.name)?;
        match (usize::try_from(n_in), usize::try_from(n_out)) {
            (Ok(i), Ok(o)) => Ok((i, o)),
            _ => Err(Error::mxnet(format!(
                "custom operator '{}': ParseAttrs gave {n_in} inputs and {n_out} outputs",
                self.name
            ))),
        }
    }

    /// The outputs' shapes and dtypes (`inferShape`, then `inferType`).
    fn infer(&self, attrs: &Attrs, inputs: &[Meta]) -> Result<Vec<Meta>> {
        let a = CAttrs::of(self.name, attrs)?;
        let (n_in, n_out) = self.counts(&a)?;
        if inputs.len() != n_in {
            return Err(Error::value(format!(
                "operator {} takes {n_in} inputs (its library's ParseAttrs says so), got {}",
                self.name,
                inputs.len()
            )));
        }
        let shapes = self.infer_shapes(&a, inputs, n_out)?;
        let mut in_types: Vec<c_int> = inputs.iter().map(|m| m.dtype as c_int).collect();
        let mut out_types: Vec<c_int> = vec![-1; n_out];
        // SAFETY: the type arrays hold `n_in` and `n_out` elements and are valid for writes.
        let rc = unsafe {
            (self.api.infer_type)(
                self.infer_type,
                a.keys.as_ptr(),
                a.vals.as_ptr(),
                a.len(),
                in_types.as_mut_ptr(),
                c_count(n_in, "inputs")?,
                out_types.as_mut_ptr(),
                c_count(n_out, "outputs")?,
            )
        };
        self.api.check(rc, "InferType", self.name)?;
        for (i, (m, &t)) in inputs.iter().zip(&in_types).enumerate() {
            if t != m.dtype as c_int {
                return Err(Error::type_error(format!(
                    "custom operator '{}': InferType changed input {i}'s type from {} to {t}",
                    self.name,
                    m.dtype.name()
                )));
            }
        }
        shapes
            .into_iter()
            .zip(out_types)
            .enumerate()
            .map(|(i, (shape, t))| {
                let dtype = DType::from_code(t).map_err(|_| {
                    Error::type_error(format!("custom operator '{}': InferType gave output {i} type {t}", self.name))
                })?;
                Ok(Meta::new(shape, dtype))
            })
            .collect()
    }

    fn infer_shapes(&self, a: &CAttrs, inputs: &[Meta], n_out: usize) -> Result<Vec<Vec<usize>>> {
        let mut dims32: Vec<Vec<u32>> = Vec::with_capacity(inputs.len());
        for m in inputs {
            let d: Option<Vec<u32>> = m.shape.iter().map(|&d| u32::try_from(d).ok()).collect();
            dims32.push(d.ok_or_else(|| {
                Error::value(format!(
                    "operator {}: shape {:?} has a dimension over 2^32 - 1 (extension libraries take 32-bit shapes)",
                    self.name, m.shape
                ))
            })?);
        }
        let mut in_ptrs: Vec<*mut u32> = dims32.iter_mut().map(|d| d.as_mut_ptr()).collect();
        let mut in_ndims: Vec<c_int> = dims32.iter().map(|d| d.len() as c_int).collect();
        let (mut mod_shapes, mut mod_ndims): (*mut *mut u32, *mut c_int) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut out_shapes, mut out_ndims): (*mut *mut u32, *mut c_int) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: `in_ptrs[i]` addresses `in_ndims[i]` dimensions that outlive the call; the
        // four out-pointers are valid for writes; the library allocates what it writes there.
        let rc = unsafe {
            (self.api.infer_shape)(
                self.infer_shape,
                a.keys.as_ptr(),
                a.vals.as_ptr(),
                a.len(),
                in_ptrs.as_mut_ptr(),
                in_ndims.as_mut_ptr(),
                c_count(inputs.len(), "inputs")?,
                &mut mod_shapes,
                &mut mod_ndims,
                &mut out_shapes,
                &mut out_ndims,
                c_count(n_out, "outputs")?,
            )
        };
        self.api.check(rc, "InferShape", self.name)?;
        // SAFETY: on success `_opCallInferShape` allocated one dimension count and one
        // dimension array per input (`mod_*`) and per output (`out_*`), of those counts.
        let (modified, outs) = unsafe {
            (self.take_shapes(mod_shapes, mod_ndims, inputs.len()), self.take_shapes(out_shapes, out_ndims, n_out))
        };
        for (i, (m, new)) in inputs.iter().zip(&modified).enumerate() {
            if new.as_ref().is_some_and(|s| *s != m.shape) {
                return Err(Error::value(format!(
                    "custom operator '{}': InferShape changed input {i}'s shape {:?} to {:?}",
                    self.name, m.shape, new
                )));
            }
        }
        outs.into_iter()
            .enumerate()
            .map(|(i, s)| {
                s.ok_or_else(|| {
                    Error::mxnet(format!("custom operator '{}': InferShape gave no shape for output {i}", self.name))
                })
            })
            .collect()
    }

    /// Copies and frees `n` shapes the library allocated (`None` where it gave none).
    ///
    /// # Safety
    /// `shapes` and `ndims` are NULL or arrays of `n` elements from the library's allocator,
    /// `shapes[i]` NULL or `ndims[i]` dimensions from it; none is used after this call.
    unsafe fn take_shapes(&self, shapes: *mut *mut u32, ndims: *mut c_int, n: usize) -> Vec<Option<Vec<usize>>> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if shapes.is_null() || ndims.is_null() {
                out.push(None);
                continue;
            }
            // SAFETY: per this function's contract.
            let (p, nd) = unsafe { (*shapes.add(i), *ndims.add(i)) };
            if p.is_null() || nd < 0 {
                out.push(None);
            } else {
                // SAFETY: per this function's contract.
                let dims = unsafe { std::slice::from_raw_parts(p, nd as usize) };
                out.push(Some(dims.iter().map(|&d| d as usize).collect()));
            }
            lib_free(&self.api, p as *mut c_void);
        }
        lib_free(&self.api, shapes as *mut c_void);
        lib_free(&self.api, ndims as *mut c_void);
        out
    }

    /// The inputs the operator writes (`mutateInputs`, asked without attributes).
    fn mutated(&self, mutate: LibFn) -> Result<Vec<usize>> {
        let (mut idx, mut n): (*mut c_int, c_int) = (std::ptr::null_mut(), 0);
        // SAFETY: no attributes (empty arrays); the out-pointers are valid for writes.
        let rc = unsafe { (self.api.mutate)(mutate, [].as_ptr(), [].as_ptr(), 0, &mut idx, &mut n) };
        self.api.check(rc, "MutateInputs", self.name)?;
        let mut out = Vec::new();
        if !idx.is_null() && n > 0 {
            // SAFETY: on success the library wrote `n` indices at `idx` (allocated with its
            // allocator; freed below).
            out.extend(
                unsafe { std::slice::from_raw_parts(idx, n as usize) }.iter().filter_map(|&i| usize::try_from(i).ok()),
            );
        }
        lib_free(&self.api, idx as *mut c_void);
        Ok(out)
    }

    /// A stateful operator's state for a call on `ctx` with inputs `inputs`.
    fn create(&self, attrs: &Attrs, ctx: Context, inputs: &[Meta]) -> Result<State> {
        let make = self.create_state.ok_or_else(|| Error::internal(format!("{} is not stateful", self.name)))?;
        let a = CAttrs::of(self.name, attrs)?;
        let mut dims: Vec<Vec<u32>> =
            inputs.iter().map(|m| m.shape.iter().map(|&d| u32::try_from(d).unwrap_or(u32::MAX)).collect()).collect();
        let mut ptrs: Vec<*mut u32> = dims.iter_mut().map(|d| d.as_mut_ptr()).collect();
        let mut ndims: Vec<c_int> = dims.iter().map(|d| d.len() as c_int).collect();
        let types: Vec<c_int> = inputs.iter().map(|m| m.dtype as c_int).collect();
        let mut state: *mut c_void = std::ptr::null_mut();
        // SAFETY: every array holds one element per input and outlives the call; `state` is
        // valid for writes.
        let rc = unsafe {
            (self.api.create_state)(
                make,
                a.keys.as_ptr(),
                a.vals.as_ptr(),
                a.len(),
                c"cpu".as_ptr(),
                ctx.dev_id as c_int,
                ptrs.as_mut_ptr(),
                ndims.as_mut_ptr(),
                c_count(inputs.len(), "inputs")?,
                types.as_ptr(),
                &mut state,
            )
        };
        self.api.check(rc, "CreateOpState CPU", self.name)?;
        if state.is_null() {
            return Err(Error::mxnet(format!(
                "Error custom library failed to create stateful operator '{}'{}",
                self.name,
                self.api.traceback()
            )));
        }
        Ok(State { api: self.api, ptr: state, var: crate::engine::Var::new() })
    }

    /// Run `kernel` over a call's blobs: `ins` (all inputs), `outs` (the `n_out` outputs, then
    /// any mutated inputs, which the library reaches through their input pointers).
    fn run(&self, kernel: Kernel, cx: &OpCtx, ins: &[TBlob], outs: &mut [OutBlob], n_out: usize) -> Result<()> {
        let n_out = n_out.min(outs.len());
        let outs = &mut outs[..n_out];
        if cx.req.contains(&Req::Add) {
            return Err(Error::not_supported(format!(
                "adding to outputs (req 'add') in extension operator {}",
                self.name
            )));
        }
        let mut scratch: Vec<Vec<Line>> = Vec::new();
        let in_shapes: Vec<Vec<i64>> = ins.iter().map(|b| b.shape.iter().map(|&d| d as i64).collect()).collect();
        let out_shapes: Vec<Vec<i64>> = outs.iter().map(|b| b.shape.iter().map(|&d| d as i64).collect()).collect();
        let mut in_side = Side::new(&in_shapes);
        for (i, b) in ins.iter().enumerate() {
            in_side.data[i] = b.device_ptr() as *mut c_void;
            in_side.types[i] = b.dtype as c_int;
        }
        let mut out_side = Side::new(&out_shapes);
        for (i, b) in outs.iter_mut().enumerate() {
            let p = if cx.req.get(i) == Some(&Req::Null) || b.device_ptr() == 0 {
                // Not wanted (a gradient nobody asked for): the library writes it anyway.
                let mut lines = vec![Line([0; 64]); b.bytes().div_ceil(64).max(1)];
                let p = lines.as_mut_ptr() as *mut c_void;
                scratch.push(lines);
                p
            } else {
                b.foreign_ptr() as *mut c_void
            };
            out_side.data[i] = p;
            out_side.types[i] = b.dtype as c_int;
        }
        let memory: Mutex<Vec<Vec<Line>>> = Mutex::new(Vec::new());
        let mem = &memory as *const Mutex<Vec<Vec<Line>>> as *mut c_void;
        let mut rng = cpu_rand_states().lock();
        let rng_ptr = rng.as_mut_ptr() as *mut c_void;
        let (n_in, n_o) = (c_count(ins.len(), "inputs")?, c_count(outs.len(), "outputs")?);
        let (ni, no) = (ins.len(), outs.len());
        let (mut in_sp, mut out_sp) =
            (vec![std::ptr::null_mut::<c_void>(); ni], vec![std::ptr::null_mut::<c_void>(); no]);
        let (mut in_ip, mut out_ip) =
            (vec![std::ptr::null_mut::<c_void>(); ni], vec![std::ptr::null_mut::<c_void>(); no]);
        let (mut in_sl, mut out_sl) = (vec![0i64; ni], vec![0i64; no]);
        let (mut in_pl, mut out_pl) = (vec![0i64; ni], vec![0i64; no]);
        let (mut in_st, mut out_st) = (vec![0 as c_int; ni], vec![0 as c_int; no]);
        let a = CAttrs::of(self.name, cx.attrs)?;
        // SAFETY: every array holds one element per input (output) and outlives the call; data
        // pointers address the blobs' elements (or scratch of the same size), which the engine
        // lets this operation read (inputs) and write (outputs, mutated inputs) meanwhile; the
        // allocator argument is `memory`, alive for the call; the random states are locked for
        // the call.
        let rc = unsafe {
            macro_rules! tensors {
                ($f:expr, $($head:expr),*) => {
                    $f(
                        $($head,)*
                        in_side.shape_ptrs.as_ptr(), in_side.ndims.as_mut_ptr(), in_side.data.as_mut_ptr(),
                        in_side.types.as_mut_ptr(), in_side.ids.as_mut_ptr(), in_side.dev.as_mut_ptr(),
                        in_side.dev_id.as_mut_ptr(), n_in,
                        out_side.shape_ptrs.as_ptr(), out_side.ndims.as_mut_ptr(), out_side.data.as_mut_ptr(),
                        out_side.types.as_mut_ptr(), out_side.ids.as_mut_ptr(), out_side.dev.as_mut_ptr(),
                        out_side.dev_id.as_mut_ptr(), n_o,
                        cpu_malloc, mem, gpu_malloc, std::ptr::null_mut(), std::ptr::null_mut(),
                        sparse_malloc, std::ptr::null_mut(),
                        in_st.as_mut_ptr(), out_st.as_mut_ptr(),
                        in_sp.as_mut_ptr(), out_sp.as_mut_ptr(), in_ip.as_mut_ptr(), out_ip.as_mut_ptr(),
                        in_sl.as_mut_ptr(), out_sl.as_mut_ptr(), in_pl.as_mut_ptr(), out_pl.as_mut_ptr(),
                        rng_ptr, std::ptr::null_mut(),
                    )
                };
            }
            match kernel {
                Kernel::Plain(f) => tensors!(self.api.compute, f, a.keys.as_ptr(), a.vals.as_ptr(), a.len()),
                Kernel::Stateful(state, forward) => tensors!(self.api.stateful, c_int::from(forward), state.ptr),
            }
        };
        drop(rng);
        let what = match kernel {
            Kernel::Plain(_) => "FCompute",
            Kernel::Stateful(..) => "FStatefulCompute",
        };
        self.api.check(rc, what, self.name)
    }
}

/// What a kernel call runs: a stateless function, or a state's forward (`true`) or backward.
#[derive(Clone, Copy)]
enum Kernel<'a> {
    Plain(LibFn),
    Stateful(&'a State, bool),
}

/// One side (inputs or outputs) of a kernel call, as the library takes it.
struct Side {
    shape_ptrs: Vec<*const i64>,
    ndims: Vec<c_int>,
    data: Vec<*mut c_void>,
    types: Vec<c_int>,
    ids: Vec<usize>,
    dev: Vec<*const c_char>,
    dev_id: Vec<c_int>,
}

impl Side {
    fn new(shapes: &[Vec<i64>]) -> Side {
        let n = shapes.len();
        Side {
            shape_ptrs: shapes.iter().map(|s| s.as_ptr()).collect(),
            ndims: shapes.iter().map(|s| s.len() as c_int).collect(),
            data: vec![std::ptr::null_mut(); n],
            types: vec![0; n],
            ids: vec![0; n],
            dev: vec![c"cpu".as_ptr(); n],
            dev_id: vec![0; n],
        }
    }
}

/// Workspace memory in 64-byte aligned lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `OpResource::alloc_cpu`: `size` bytes that live until the kernel returns.
unsafe extern "C" fn cpu_malloc(memory: *mut c_void, size: c_int) -> *mut c_void {
    let Ok(size) = usize::try_from(size) else { return std::ptr::null_mut() };
    // SAFETY: `memory` is the `Mutex` `ExtOp::run` passed with this function; it lives until
    // the kernel returns (a kernel may call this from threads of its own, hence the lock).
    let memory = unsafe { &*(memory as *const Mutex<Vec<Vec<Line>>>) };
    let mut lines = vec![Line([0; 64]); size.div_ceil(64).max(1)];
    let p = lines.as_mut_ptr() as *mut c_void;
    // Moving the vector keeps its buffer where it is.
    memory.lock().push(lines);
    p
}

/// `OpResource::alloc_gpu`: extension operators run on CPUs only.
unsafe extern "C" fn gpu_malloc(_: *mut c_void, _: c_int) -> *mut c_void {
    std::ptr::null_mut()
}

/// `OpResource::alloc_sparse`: no output is sparse (every output's storage type is dense), so
/// a library has nothing to call this for; it gives nothing.
unsafe extern "C" fn sparse_malloc(
    _: *mut c_void,
    _: c_int,
    _: c_int,
    _: c_int,
    _: *mut *mut c_void,
    _: *mut *mut i64,
    _: *mut *mut i64,
) {
}

/// libstdc++'s `std::mt19937` (`uint_fast32_t` is 64 bits on LP64 Linux): 624 words, then the
/// position. `lib_api.h`'s `mx_cpu_rand_t`.
#[repr(C)]
struct Mt19937 {
    x: [u64; 624],
    p: usize,
}

impl Mt19937 {
    /// `std::mt19937(seed)`.
    fn seeded(seed: u32) -> Mt19937 {
        let mut x = [0u64; 624];
        let mut prev = seed;
        x[0] = u64::from(seed);
        for (i, w) in x.iter_mut().enumerate().skip(1) {
            prev = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
            *w = u64::from(prev);
        }
        Mt19937 { x, p: 624 }
    }
}

/// `MX_NUM_CPU_RANDOM_STATES`.
const CPU_RANDOM_STATES: usize = 1024;

/// The random states extension kernels get, made when the first library is loaded from the
/// CPU random stream (so `MXRandomSeed` before then decides them; later seeds do not reseed
/// them), and locked for each call: extension kernels run one at a time.
fn cpu_rand_states() -> &'static Mutex<Vec<Mt19937>> {
    static S: OnceLock<Mutex<Vec<Mt19937>>> = OnceLock::new();
    S.get_or_init(|| {
        let stream = super::random::take(Context::CPU, CPU_RANDOM_STATES as u64);
        Mutex::new((0..CPU_RANDOM_STATES).map(|i| Mt19937::seeded(stream.bits(i as u64) as u32)).collect())
    })
}

/// A stateful operator's state (`CustomStatefulOp`), destroyed by the library when the last
/// call holding it is gone.
struct State {
    api: Api,
    ptr: *mut c_void,
    /// Written by every kernel call on the state, so the engine runs them in the order they
    /// were pushed (a bound executor's next forward after its last backward), one at a time.
    var: Arc<crate::engine::Var>,
}

// SAFETY: the state is the library's object; kernels use it one at a time (each writes its
// engine variable `var`) and it is destroyed once, by the last owner.
unsafe impl Send for State {}
unsafe impl Sync for State {}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from the library's CreateOpState and is destroyed once, here.
        unsafe { (self.api.destroy_state)(self.ptr) }
    }
}

/// The operators of loaded libraries, by name.
fn loaded() -> &'static RwLock<HashMap<&'static str, Arc<ExtOp>>> {
    static L: OnceLock<RwLock<HashMap<&'static str, Arc<ExtOp>>>> = OnceLock::new();
    L.get_or_init(|| RwLock::new(HashMap::new()))
}

fn ext_op(name: &str) -> Result<Arc<ExtOp>> {
    loaded().read().get(name).cloned().ok_or_else(|| Error::internal(format!("{name} is not an extension operator")))
}

/// `OpDef::num_outputs` of an extension operator (0 when ParseAttrs fails: the call's
/// inference then reports why).
fn num_outputs(a: &Attrs) -> usize {
    ext_op(a.op).and_then(|e| e.counts(&CAttrs::of(e.name, a)?)).map_or(0, |(_, n)| n)
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The declarations of one operator: the forward, and `_backward_<name>` when it has a
/// backward or a state.
fn declarations(op: &Arc<ExtOp>, mutated: Vec<usize>, path: &str) -> Vec<OpDef> {
    let infer_op = op.clone();
    let infer: super::InferFn = Box::new(move |a, ins| infer_op.infer(a, ins));
    let mutated: &'static [usize] = Box::leak(mutated.into_boxed_slice());
    let compute: super::ComputeFn = match op.forward {
        Some(f) => {
            let k = op.clone();
            Box::new(move |cx, ins, outs| {
                // The mutated inputs' blobs follow the outputs (those of this call's inputs).
                let n_out = outs.len() - mutated.iter().filter(|&&i| i < ins.len()).count();
                k.run(Kernel::Plain(f), cx, ins, outs, n_out)
            })
        }
        None => Box::new(|_, _, _| Err(Error::internal("a stateful extension operator runs through its state"))),
    };
    let bname = op.backward_name;
    let mut fwd = OpDef::new(op.name, Inputs::Variadic("data"), infer, compute)
        .open_params()
        .outputs(num_outputs, num_outputs)
        .mutates(mutated)
        .doc(format!("Operator {} of the extension library {path}.", op.name));
    // It may draw from the shared random states (stock gives it a random resource).
    fwd.mergeable = false;
    let mut defs = Vec::new();
    if op.create_state.is_some() {
        fwd = fwd.invoke_with(invoke_stateful).grad(Grad::Stateful { op: bname });
        fwd.node_state = true;
        defs.push(OpDef::backward(bname, &[], Box::new(|_, _, _| Err(Error::internal("runs through its state")))));
    } else if let Some(b) = op.backward {
        let k = op.clone();
        fwd = fwd.grad(Grad::Backward { op: bname, inputs: true, outputs: true });
        defs.push(OpDef::backward(
            bname,
            &[],
            Box::new(move |cx, ins, outs| k.run(Kernel::Plain(b), cx, ins, outs, outs.len())),
        ));
    }
    defs.insert(0, fwd);
    defs
}

/// The imperative call of a stateful operator (`OpDef::invoke_with`): a new state, its forward,
/// and a backward that runs the same state's backward.
fn invoke_stateful(
    op: &'static OpDef,
    inputs: &[&NDArray],
    outputs: Option<&[&NDArray]>,
    attrs: Attrs,
) -> Result<super::OwnInvoked> {
    let ext = ext_op(op.name)?;
    let mut ctx = None;
    let mut in_meta = Vec::with_capacity(inputs.len());
    for (i, x) in inputs.iter().enumerate() {
        let c =
            x.ctx().ok_or_else(|| Error::value(format!("input {i} of operator {} is an empty NDArray", op.name)))?;
        ctx.get_or_insert(c);
        in_meta.push(Meta::new(x.shape.clone(), x.dtype));
    }
    let ctx = ctx.unwrap_or(Context::CPU);
    if !ctx.dev_type.is_host() {
        return Err(Error::not_supported(format!("extension operator {} on {ctx}", op.name)));
    }
    let out_meta = (op.infer)(&attrs, &in_meta)?;
    let visible = out_meta.len();
    let outs = invoke::outputs_for(op, outputs, out_meta, visible, ctx, false)?;
    let state = match invoke::state_slot() {
        // A bound executor's node: its state, made at its first run.
        Some(slot) => {
            let mut kept = slot.lock();
            match kept.clone().and_then(|s| s.downcast::<State>().ok()) {
                Some(s) => s,
                None => {
                    let s = Arc::new(ext.create(&attrs, ctx, &in_meta)?);
                    *kept = Some(s.clone());
                    s
                }
            }
        }
        None => Arc::new(ext.create(&attrs, ctx, &in_meta)?),
    };
    let n_out = outs.len();
    let (k, s) = (ext.clone(), state.clone());
    let kernel: invoke::CallKernel = Arc::new(move |cx, ins, o| k.run(Kernel::Stateful(&s, true), cx, ins, o, n_out));
    let req = ReqList::from_elem(Req::Write, n_out);
    invoke::launch_kernel(op, attrs.clone(), inputs, &outs, req, ctx, kernel, &state.var)?;
    let backward = StatefulBackward {
        ext,
        state,
        attrs,
        ctx,
        inputs: inputs.iter().map(|x| (*x).clone()).collect(),
        outputs: outs.clone(),
    };
    Ok((outs, Some(Arc::new(backward))))
}

/// The backward of one stateful call: its state's backward over the output gradients, the
/// call's inputs and its outputs.
struct StatefulBackward {
    ext: Arc<ExtOp>,
    state: Arc<State>,
    attrs: Attrs,
    ctx: Context,
    inputs: Vec<NDArray>,
    outputs: Vec<NDArray>,
}

impl super::CustomBackward for StatefulBackward {
    fn backward(&self, ograds: &[NDArray], want: &[bool]) -> Result<Vec<Option<NDArray>>> {
        let bop = super::lookup(self.ext.backward_name)?;
        let args: Vec<&NDArray> = ograds.iter().chain(&self.inputs).chain(&self.outputs).collect();
        let grads: Vec<NDArray> = self
            .inputs
            .iter()
            .map(|x| NDArray::new(x.shape.clone(), self.ctx, x.dtype, false))
            .collect::<Result<_>>()?;
        let n = grads.len();
        let (k, s) = (self.ext.clone(), self.state.clone());
        let kernel: invoke::CallKernel = Arc::new(move |cx, ins, o| k.run(Kernel::Stateful(&s, false), cx, ins, o, n));
        let req = ReqList::from_elem(Req::Write, n);
        invoke::launch_kernel(bop, self.attrs.clone(), &args, &grads, req, self.ctx, kernel, &self.state.var)?;
        Ok(grads.into_iter().enumerate().map(|(i, g)| want.get(i).copied().unwrap_or(false).then_some(g)).collect())
    }
}

/// Resolve `name` in `lib`.
fn symbol<T: Copy>(lib: &libloading::Library, path: &str, name: &str) -> Result<T> {
    // SAFETY: the caller names the type `lib_api.h` gives this function; the library stays
    // loaded for the process (see `load`).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| Error::mxnet(format!("library {path} has no {name} (is it built against lib_api.h?): {e}")))
}

/// A C array of `n` elements from the library (empty when NULL or `n <= 0`).
///
/// # Safety
/// `p` is NULL or addresses `n` elements that stay valid while the slice is used.
unsafe fn lib_slice<'a, T>(p: *const T, n: c_int) -> &'a [T] {
    if p.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(p, n as usize) }
}

/// `MXLoadLib`: load the extension library at `path` and register its operators; `verbose`
/// prints what was found to stderr, as stock logs it. Returns the operators' names.
pub fn load(path: &str, verbose: bool) -> Result<Vec<String>> {
    // One load at a time: a library's operators are checked against those registered.
    static LOADING: Mutex<()> = Mutex::new(());
    let _one = LOADING.lock();
    // SAFETY: loading runs the library's static initialisers, which is what loading an
    // extension library asks for; it is never unloaded (leaked below), so every function and
    // string it hands out stays valid for the process.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| Error::mxnet(format!("Unable to load library {path}: {e}")))?;
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    let version: OpVersionFn = symbol(lib, path, "_opVersion")?;
    // SAFETY: `_opVersion` takes nothing.
    let v = unsafe { version() };
    if v != LIBRARY_VERSION {
        return Err(Error::mxnet(format!("Library version ({v}) does not match MXNet version ({LIBRARY_VERSION})")));
    }
    let api = Api {
        msg_size: symbol(lib, path, "_msgSize")?,
        msg_get: symbol(lib, path, "_msgGet")?,
        free: symbol(lib, path, "_opCallFree")?,
        parse_attrs: symbol(lib, path, "_opCallParseAttrs")?,
        infer_shape: symbol(lib, path, "_opCallInferShape")?,
        infer_type: symbol(lib, path, "_opCallInferType")?,
        mutate: symbol(lib, path, "_opCallMutateInputs")?,
        compute: symbol(lib, path, "_opCallFCompute")?,
        create_state: symbol(lib, path, "_opCallCreateOpState")?,
        destroy_state: symbol(lib, path, "_opCallDestroyOpState")?,
        stateful: symbol(lib, path, "_opCallFStatefulCompute")?,
    };
    let initialize: InitializeFn = symbol(lib, path, "initialize")?;
    // SAFETY: `initialize` takes MXNet's version.
    if unsafe { initialize(MXNET_VERSION) } == 0 {
        return Err(Error::mxnet(format!("Library failed to initialize{}", api.traceback())));
    }
    for (what, size) in [("graph partitioners", "_partRegSize"), ("graph passes", "_passRegSize")] {
        let count: CountFn = symbol(lib, path, size)?;
        // SAFETY: the registry sizes take nothing.
        let n = unsafe { count() };
        if n > 0 {
            return Err(Error::not_supported(format!("{what} of extension libraries ({n} in {path})")));
        }
    }
    // The random states, made here on the caller's thread (not by the first kernel, on an
    // engine worker, where the draw would race with the caller's random operators).
    cpu_rand_states();
    let reg_size: CountFn = symbol(lib, path, "_opRegSize")?;
    let reg_get: OpRegGetFn = symbol(lib, path, "_opRegGet")?;
    // SAFETY: `_opRegSize` takes nothing.
    let n_ops = unsafe { reg_size() };
    let mut ops = Vec::new();
    let mut defs = Vec::new();
    for i in 0..n_ops {
        let (op, mutate) = read_op(&api, reg_get, i)?;
        let mutated = match mutate {
            Some(m) => op.mutated(m)?,
            None => Vec::new(),
        };
        let op = Arc::new(op);
        defs.extend(declarations(&op, mutated, path));
        ops.push(op);
    }
    let names: Vec<String> = ops.iter().map(|o| o.name.to_string()).collect();
    let mut table = loaded().write();
    super::registry().add(defs)?;
    for op in ops {
        table.insert(op.name, op);
    }
    drop(table);
    if verbose {
        eprintln!("mxnet-rt: loaded library {path}: {} operators: {}", names.len(), names.join(", "));
    }
    Ok(names)
}

/// Operator `i` of a library, with its `mutateInputs` (if any).
fn read_op(api: &Api, reg_get: OpRegGetFn, i: c_int) -> Result<(ExtOp, Option<LibFn>)> {
    let mut name: *const c_char = std::ptr::null();
    let mut is_subgraph: c_int = 0;
    let null = LibFn(std::ptr::null());
    let (mut f_ctx, mut f_fp, mut f_n) = (std::ptr::null(), std::ptr::null(), 0);
    let (mut b_ctx, mut b_fp, mut b_n) = (std::ptr::null(), std::ptr::null(), 0);
    let (mut c_ctx, mut c_fp, mut c_n) = (std::ptr::null(), std::ptr::null(), 0);
    let (mut parse, mut ty, mut sty, mut shape, mut mutate) = (null, null, null, null, null);
    // SAFETY: every out-pointer is valid for writes; `_opRegGet` writes pointers into the
    // library's registry, which lives as long as the library (the process).
    unsafe {
        reg_get(
            i,
            &mut name,
            &mut is_subgraph,
            &mut f_ctx,
            &mut f_fp,
            &mut f_n,
            &mut b_ctx,
            &mut b_fp,
            &mut b_n,
            &mut c_ctx,
            &mut c_fp,
            &mut c_n,
            &mut parse,
            &mut ty,
            &mut sty,
            &mut shape,
            &mut mutate,
        )
    };
    if name.is_null() {
        return Err(Error::mxnet(format!("operator {i} of the library has no name")));
    }
    // SAFETY: a NUL-terminated name in the library's registry (lives for the process).
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    if is_subgraph != 0 {
        return Err(Error::not_supported(format!("subgraph operators of extension libraries ({name})")));
    }
    // The CPU function of each kind (stock runs a context's function on that context).
    let cpu = |ctx: *const *const c_char, fp: *const LibFn, n: c_int| -> Option<LibFn> {
        // SAFETY: `_opRegGet` gave `n` context strings and `n` functions at these addresses.
        let (ctxs, fps) = unsafe { (lib_slice(ctx, n), lib_slice(fp, n)) };
        // SAFETY: each context is a NUL-terminated string in the library's registry.
        ctxs.iter()
            .zip(fps)
            .find(|(c, _)| !c.is_null() && unsafe { CStr::from_ptr(**c) }.to_bytes() == b"cpu")
            .map(|(_, f)| *f)
    };
    let (forward, backward, create_state) = (cpu(f_ctx, f_fp, f_n), cpu(b_ctx, b_fp, b_n), cpu(c_ctx, c_fp, c_n));
    let missing = |what: &str| Error::mxnet(format!("Error loading '{name}' custom op, {what} function was not set."));
    if parse.0.is_null() {
        return Err(missing("ParseAttrs"));
    }
    if f_n <= 0 && c_n <= 0 {
        return Err(missing("Forward or CreateOpState"));
    }
    if ty.0.is_null() {
        return Err(missing("InferType"));
    }
    if shape.0.is_null() {
        return Err(missing("InferShape"));
    }
    if forward.is_none() && create_state.is_none() {
        return Err(Error::not_supported(format!("extension operator {name} without a CPU implementation")));
    }
    let op = ExtOp {
        backward_name: leak(format!("_backward_{name}")),
        name: leak(name),
        api: *api,
        parse,
        infer_type: ty,
        infer_shape: shape,
        forward,
        backward,
        create_state,
    };
    Ok((op, (!mutate.0.is_null()).then_some(mutate)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our `std::mt19937` matches the standard's: its 10,000th output from the default seed
    /// 5489 is 4123659995 (C++11 [rand.predef]); generating from the seeded words proves the
    /// seeding.
    #[test]
    fn mt19937_seeding_matches_the_standard() {
        let mut m = Mt19937::seeded(5489);
        let mut last = 0u32;
        for _ in 0..10_000 {
            if m.p >= 624 {
                for k in 0..624 {
                    let y = (m.x[k] & 0x8000_0000) | (m.x[(k + 1) % 624] & 0x7fff_ffff);
                    let mut v = m.x[(k + 397) % 624] ^ (y >> 1);
                    if y & 1 != 0 {
                        v ^= 0x9908_b0df;
                    }
                    m.x[k] = v;
                }
                m.p = 0;
            }
            let mut y = m.x[m.p] as u32;
            m.p += 1;
            y ^= y >> 11;
            y ^= (y << 7) & 0x9d2c_5680;
            y ^= (y << 15) & 0xefc6_0000;
            y ^= y >> 18;
            last = y;
        }
        assert_eq!(last, 4_123_659_995);
        assert_eq!(std::mem::size_of::<Mt19937>(), 5000);
    }

    #[test]
    fn loading_what_is_not_a_library_is_an_error() {
        let e = load("/nonexistent/libnothing.so", false).unwrap_err().to_string();
        assert!(e.starts_with("MXNetError: Unable to load library /nonexistent/libnothing.so"), "{e}");
    }
}
