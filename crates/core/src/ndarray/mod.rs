//! NDArrays: shape, dtype and context over shared storage with one engine variable.
//!
//! Owns: [`DType`] (stock codes), [`NDArray`] (a view: shape and byte offset into a
//! [`Chunk`]), [`Chunk`] (the storage and the engine variable every view of it shares),
//! views (slice, at, reshape with MXNet's special values), numpy-shape mode ([`np_shape`]),
//! host copies (parallel above `MXNET_CPU_PARALLEL_COPY_SIZE`) and the file format ([`io`]).
//! Data is touched only inside engine operations that list the chunk's variable, or after
//! waiting for it; a chunk (and its memory) lives until the last view and the last pending
//! operation that holds it are gone.

pub mod dlpack;
pub mod io;

/// Float32 arrays from and to host values, for tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{DType, NDArray};
    use crate::context::Context;

    pub fn array_f32(shape: &[usize], values: &[f32]) -> NDArray {
        let a = NDArray::new(shape.to_vec(), Context::CPU, DType::F32, false).unwrap();
        assert_eq!(a.size(), values.len());
        // SAFETY: `values` holds the array's elements (checked above).
        unsafe { a.copy_from_host(values.as_ptr() as *const u8, values.len()).unwrap() };
        a
    }

    pub fn values(a: &NDArray) -> Vec<f32> {
        let mut v = vec![0f32; a.size()];
        // SAFETY: `v` has room for the array's elements.
        unsafe { a.copy_to_host(v.as_mut_ptr() as *mut u8, v.len()).unwrap() };
        v
    }
}

use crate::config;
use crate::context::Context;
use crate::engine::{self, Push, Var};
use crate::error::{Error, Result};
use crate::storage::Block;
use std::sync::Arc;

/// Element types with stock's codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32 = 0,
    F64 = 1,
    F16 = 2,
    U8 = 3,
    I32 = 4,
    I8 = 5,
    I64 = 6,
    Bool = 7,
}

impl DType {
    pub fn from_code(code: i32) -> Result<Self> {
        Ok(match code {
            0 => DType::F32,
            1 => DType::F64,
            2 => DType::F16,
            3 => DType::U8,
            4 => DType::I32,
            5 => DType::I8,
            6 => DType::I64,
            7 => DType::Bool,
            12 => return Err(Error::not_supported("dtype bfloat16 (code 12)")),
            _ => {
                return Err(Error::type_error(format!(
                    "unknown dtype code {code} (expected 0 float32, 1 float64, 2 float16, 3 uint8, \
                     4 int32, 5 int8, 6 int64 or 7 bool)"
                )))
            }
        })
    }
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::U8 | DType::I8 | DType::Bool => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I8 => "int8",
            DType::I64 => "int64",
            DType::Bool => "bool",
        }
    }
}

/// The storage of an array and its engine variable, shared by every view of it: the variable
/// holds the memory block, so pending operations (which hold the variable) keep it alive.
pub type Chunk = Var;

/// Shape and dtype of an array, or of an operator's input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Meta {
    pub fn new(shape: Vec<usize>, dtype: DType) -> Self {
        Meta { shape, dtype }
    }
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An array (or a view of one).
#[derive(Clone)]
pub struct NDArray {
    /// `None` for an array created with `MXNDArrayCreateNone`.
    pub chunk: Option<Arc<Chunk>>,
    /// Where the chunk lives and its size in bytes.
    ctx: Context,
    chunk_bytes: usize,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Byte offset of this view into the chunk.
    pub offset: usize,
    /// Where this array sits in a recorded autograd graph (a marked variable or a recorded
    /// call's output); views and copies start outside any graph.
    pub ag: Option<GraphLink>,
}

/// An array's place in a graph recorded by a layer above this one (autograd): output `index`
/// of `node`. Opaque here, so arrays know nothing of what a graph node holds; only the
/// recorder creates links and reads its nodes back (`downcast_ref`).
#[derive(Clone)]
pub struct GraphLink {
    pub node: Arc<dyn std::any::Any + Send + Sync>,
    pub index: usize,
}

impl std::fmt::Debug for NDArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NDArray")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("ctx", &self.ctx())
            .field("offset", &self.offset)
            .finish()
    }
}

/// The most dimensions an array may have, everywhere: creation, views, operator outputs and
/// the file format (so that whatever this library saves, it loads).
pub const MAX_NDIM: usize = 32;

/// Number of elements and bytes of `shape` in `dtype`, refusing overflow and more than
/// [`MAX_NDIM`] dimensions.
pub fn byte_size(shape: &[usize], dtype: DType) -> Result<(usize, usize)> {
    if shape.len() > MAX_NDIM {
        return Err(Error::value(format!("shape {shape:?} has {} dimensions (at most {MAX_NDIM})", shape.len())));
    }
    let too_big = || Error::value(format!("shape {shape:?} of {} is too large", dtype.name()));
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(too_big)?;
    let bytes = n.checked_mul(dtype.size()).filter(|&b| b <= isize::MAX as usize).ok_or_else(too_big)?;
    Ok((n, bytes))
}

impl NDArray {
    pub fn none() -> Self {
        NDArray {
            chunk: None,
            ctx: Context::CPU,
            chunk_bytes: 0,
            shape: Vec::new(),
            dtype: DType::F32,
            offset: 0,
            ag: None,
        }
    }

    /// A placeholder with `like`'s shape and dtype but no storage (an output not computed).
    pub fn none_like(like: &NDArray) -> Self {
        NDArray { shape: like.shape.clone(), dtype: like.dtype, ..NDArray::none() }
    }
    /// This array outside any autograd graph (same data, shape and view).
    pub fn detached(&self) -> NDArray {
        NDArray { ag: None, ..self.clone() }
    }
    /// This array at `link` of a recorded graph.
    pub fn with_link(&self, link: GraphLink) -> NDArray {
        NDArray { ag: Some(link), ..self.clone() }
    }
    /// A placeholder with `meta`'s shape and dtype but no storage.
    pub fn none_like_meta(meta: &Meta) -> Self {
        NDArray { shape: meta.shape.clone(), dtype: meta.dtype, ..NDArray::none() }
    }

    pub fn new(shape: Vec<usize>, ctx: Context, dtype: DType, delay_alloc: bool) -> Result<Self> {
        let (_, bytes) = byte_size(&shape, dtype)?;
        let chunk = if delay_alloc {
            ctx.check_available()?;
            Var::new()
        } else {
            Var::with_block(Block::alloc(bytes, ctx)?)
        };
        Ok(NDArray { chunk: Some(chunk), ctx, chunk_bytes: bytes, shape, dtype, offset: 0, ag: None })
    }

    /// An array over memory another library lends (DLPack): `release` runs once, when the
    /// last view of the array is dropped. The data must be aligned for `dtype`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of the shape's bytes on `ctx` until `release`
    /// is called, and nothing else may free it before.
    pub unsafe fn from_lent(
        shape: Vec<usize>,
        dtype: DType,
        ctx: Context,
        ptr: *mut u8,
        release: crate::storage::Release,
    ) -> Result<Self> {
        let (_, bytes) = byte_size(&shape, dtype)?;
        // SAFETY: per this function's contract.
        let block = unsafe { Block::lent(ptr, bytes, ctx, release)? };
        Ok(NDArray { chunk: Some(Var::with_block(block)), ctx, chunk_bytes: bytes, shape, dtype, offset: 0, ag: None })
    }

    /// `MXNDArrayCreateFromSharedMem(Ex)`: an array on `cpu_shared(0)` over the shared memory
    /// whose handle another process's [`NDArray::shared_mem_handle`] gave (the descriptor
    /// received here, e.g. through the frontend's `DupFd`). On success the array owns `fd`;
    /// on failure the caller keeps it.
    ///
    /// # Safety
    /// Nobody else may close `fd` once this returns `Ok`.
    pub unsafe fn from_shared_mem(pid: i32, fd: i32, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let (_, bytes) = byte_size(&shape, dtype)?;
        // SAFETY: per this function's contract.
        let block = unsafe { Block::from_shared(pid, fd, bytes, 0)? };
        let ctx = block.ctx();
        Ok(NDArray { chunk: Some(Var::with_block(block)), ctx, chunk_bytes: bytes, shape, dtype, offset: 0, ag: None })
    }

    /// `MXNDArrayGetSharedMemHandle`: `(pid, fd)` of the shared memory of an array on
    /// `cpu_shared`, once its pending writes are done. Another process maps it with
    /// [`NDArray::from_shared_mem`] (after receiving the descriptor). Stock copies an array
    /// on another context into a temporary shared array whose descriptor is closed before
    /// the call returns; this refuses instead, as it does a view that does not start at the
    /// memory's start (the handle cannot carry an offset).
    pub fn shared_mem_handle(&self) -> Result<(i32, i32)> {
        let chunk = self.chunk()?;
        if self.ctx.dev_type != crate::context::DevType::CpuShared {
            return Err(Error::value(format!(
                "the array is on {}; only arrays on cpu_shared have a shared memory handle \
                 (copy it first: as_in_context(mx.Context('cpu_shared', 0)))",
                self.ctx
            )));
        }
        if self.offset != 0 {
            return Err(Error::value(format!(
                "the array is a view at byte {} of its memory; a shared memory handle covers the whole memory \
                 (copy the view into an array of its own first)",
                self.offset
            )));
        }
        self.wait(false)?;
        let block = chunk.block(self.chunk_bytes, self.ctx)?;
        block.shared_handle().ok_or_else(|| Error::internal("a cpu_shared array without shared memory"))
    }

    /// An array said to be on `ctx` whose memory is never allocated (tests of the device
    /// checks on machines without that device).
    #[cfg(test)]
    pub(crate) fn unallocated_on(ctx: Context, shape: Vec<usize>, dtype: DType) -> NDArray {
        NDArray { chunk: Some(Var::new()), ctx, chunk_bytes: 0, shape, dtype, offset: 0, ag: None }
    }

    pub fn chunk(&self) -> Result<&Arc<Chunk>> {
        self.chunk.as_ref().ok_or_else(|| Error::value("the NDArray is empty (created with MXNDArrayCreateNone)"))
    }
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn ctx(&self) -> Option<Context> {
        self.chunk.as_ref().map(|_| self.ctx)
    }

    /// Wait until pending writes (or, with `write`, all pending operations) are done.
    pub fn wait(&self, write: bool) -> Result<()> {
        match &self.chunk {
            None => Ok(()),
            Some(c) => engine::global()?.wait_for_var(c, write),
        }
    }

    fn check_len(&self, elements: usize) -> Result<usize> {
        if elements != self.size() {
            return Err(Error::value(format!(
                "buffer of {elements} elements does not match the array's {} elements (shape {:?})",
                self.size(),
                self.shape
            )));
        }
        Ok(elements * self.dtype.size())
    }

    /// The data address of this view (allocating a delayed array).
    pub fn data(&self) -> Result<*mut u8> {
        Ok(self.chunk()?.data(self.chunk_bytes, self.ctx)?.wrapping_add(self.offset))
    }

    /// A view of this array's storage with `shape` at byte `offset`. The one way a view is
    /// made: its size is computed with checked arithmetic and it must lie inside the chunk, so
    /// no shape or index a caller passes can reach memory outside it.
    fn view(&self, shape: Vec<usize>, offset: usize) -> Result<NDArray> {
        self.chunk()?;
        let (_, bytes) = byte_size(&shape, self.dtype)?;
        if offset.checked_add(bytes).is_none_or(|end| end > self.chunk_bytes) {
            return Err(Error::value(format!(
                "a view of shape {shape:?} at byte {offset} does not fit the array's {} bytes",
                self.chunk_bytes
            )));
        }
        Ok(NDArray { shape, offset, ag: None, ..self.clone() })
    }

    /// Byte offset of row `row` of axis 0, checked (a row's size can overflow when axis 0 is
    /// empty: `(0, 2^32, 2^32, 2^32)` holds no bytes).
    fn row_offset(&self, row: usize) -> Result<usize> {
        let row_bytes = byte_size(self.shape.get(1..).unwrap_or(&[]), self.dtype)?.1;
        row.checked_mul(row_bytes)
            .and_then(|b| b.checked_add(self.offset))
            .ok_or_else(|| Error::index(format!("row {row} of an array of shape {:?} is out of range", self.shape)))
    }

    /// This view over `alias`, an alias ([`Var::alias`]) of this array's chunk: the same
    /// memory under another engine variable.
    pub fn through_alias(&self, alias: &Arc<Chunk>) -> Result<NDArray> {
        if !alias.is_alias_of(self.chunk()?) {
            return Err(Error::internal("through_alias: the variable is not an alias of the array's chunk"));
        }
        Ok(NDArray { chunk: Some(alias.clone()), ag: None, ..self.clone() })
    }

    /// Rows `begin..end` of axis 0: a view sharing storage and variable (empty when
    /// `begin == end`, as stock allows: the frontend slices `x[5:9]` of 3 rows as `[0, 0)`).
    pub fn slice(&self, begin: usize, end: usize) -> Result<NDArray> {
        self.chunk()?;
        let n = *self.shape.first().ok_or_else(|| Error::value("cannot slice a 0-d array"))?;
        if begin > end || end > n {
            return Err(Error::index(format!("slice [{begin}, {end}) is out of range for axis 0 of length {n}")));
        }
        let mut shape = self.shape.clone();
        shape[0] = end - begin;
        self.view(shape, self.row_offset(begin)?)
    }

    /// Row `idx` of axis 0 without that axis (a 1-d array gives shape `(1,)` in legacy mode,
    /// `()` in numpy-shape mode).
    pub fn at(&self, idx: usize) -> Result<NDArray> {
        self.chunk()?;
        let n = *self.shape.first().ok_or_else(|| Error::value("cannot index a 0-d array"))?;
        if idx >= n {
            return Err(Error::index(format!("index {idx} is out of range for axis 0 of length {n}")));
        }
        let mut shape = self.shape[1..].to_vec();
        if shape.is_empty() && np_shape::get() == 0 {
            shape.push(1);
        }
        self.view(shape, self.row_offset(idx)?)
    }

    /// The same data with another shape (MXNet's reshape codes 0, -1, -2, -3, -4; `reverse`
    /// applies them from the right).
    pub fn reshape(&self, spec: &[i64], reverse: bool) -> Result<NDArray> {
        self.chunk()?;
        let shape = infer_reshape(&self.shape, spec, reverse)?;
        self.view(shape, self.offset)
    }

    /// This array (same memory, view and graph link) labelled with another CPU context: what
    /// a graph placed on several CPU contexts (`group2ctx`) passes between them, where stock
    /// inserts a copy. Both contexts must be plain CPU ones (pinned and shared memory come
    /// from their own pools, which a delayed allocation through the label would bypass).
    pub fn on_host_context(&self, ctx: Context) -> Result<NDArray> {
        use crate::context::DevType;
        if !(self.ctx.dev_type == DevType::Cpu && ctx.dev_type == DevType::Cpu) {
            return Err(Error::value(format!("an array on {} cannot be viewed on {ctx} without a copy", self.ctx)));
        }
        Ok(NDArray { ctx, ..self.clone() })
    }

    /// The first elements of this array's data under `shape`, which may hold fewer elements
    /// than the array (stock's `NDArray::Reshape`, what executors reuse a larger buffer with).
    pub fn prefix_view(&self, shape: &[usize]) -> Result<NDArray> {
        self.chunk()?;
        let (elements, _) = byte_size(shape, self.dtype)?;
        if elements > self.size() {
            return Err(Error::value(format!(
                "a view of shape {shape:?} ({elements} elements) is larger than the array's shape {:?}",
                self.shape
            )));
        }
        self.view(shape.to_vec(), self.offset)
    }

    /// The first bytes of this array's storage as an array of `shape` and `dtype`: what a
    /// graph run's memory plan places an intermediate result in (a slot of bytes that several
    /// results use in turn). It must fit the storage after this view's offset.
    pub fn typed_prefix_view(&self, shape: &[usize], dtype: DType) -> Result<NDArray> {
        self.chunk()?;
        let (_, bytes) = byte_size(shape, dtype)?;
        if self.offset.checked_add(bytes).is_none_or(|end| end > self.chunk_bytes) {
            return Err(Error::value(format!(
                "a view of shape {shape:?} {} does not fit the array's {} bytes",
                dtype.name(),
                self.chunk_bytes
            )));
        }
        Ok(NDArray { shape: shape.to_vec(), dtype, ag: None, ..self.clone() })
    }

    /// Whether `other` uses this array's storage (the same chunk and engine variable).
    pub fn same_chunk(&self, other: &NDArray) -> bool {
        matches!((&self.chunk, &other.chunk), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    /// Copy `src` (same shape and dtype) into this array, ordered after pending work on both;
    /// returns when done.
    pub fn copy_from(&self, src: &NDArray) -> Result<()> {
        if src.shape != self.shape || src.dtype != self.dtype {
            return Err(Error::value(format!(
                "cannot copy an array of shape {:?} {} into one of shape {:?} {}",
                src.shape,
                src.dtype.name(),
                self.shape,
                self.dtype.name()
            )));
        }
        let (s, d) = (src.chunk()?.clone(), self.chunk()?.clone());
        if Arc::ptr_eq(&s, &d) {
            return if src.offset == self.offset {
                Ok(())
            } else {
                Err(Error::not_supported("copying between views of the same array"))
            };
        }
        let bytes = self.size() * self.dtype.size();
        let threads = copy_threads(bytes)?;
        let (sp, dp) = (SendPtr(src.data()?), SendPtr(self.data()?));
        let (sc, dc) = (src.ctx, self.ctx);
        let mut p = Push::sync(
            move |_| {
                let (sp, dp) = (sp, dp);
                // SAFETY: both ranges lie in their chunks, held for reading and writing.
                unsafe { copy_between(sp.0, sc, dp.0, dc, bytes, threads) }
            },
            vec![s.clone()],
            vec![d.clone()],
        );
        p.wait = true;
        let side = |c: Context| if c.dev_type.is_host() { "CPU" } else { "GPU" };
        let name = crate::intern::intern(&format!("Copy{}2{}", side(sc), side(dc)));
        p.name = Some(&name);
        engine::global()?.submit(p)?;
        take_failure(&d)
    }

    /// Copy `elements` elements from host memory into the array, after its pending reads and
    /// writes; returns when done.
    ///
    /// # Safety
    /// `src` must point to `elements` readable elements of the array's dtype.
    pub unsafe fn copy_from_host(&self, src: *const u8, elements: usize) -> Result<()> {
        let bytes = self.check_len(elements)?;
        let threads = copy_threads(bytes)?;
        let chunk = self.chunk()?.clone();
        let dst = SendPtr(self.data()?);
        let src = SendPtr(src as *mut u8);
        let ctx = self.ctx;
        let mut p = Push::sync(
            move |_| {
                let (s, d) = (src, dst);
                // SAFETY: the caller keeps `src` valid until this (waited-for) op finished;
                // the destination range lies in the chunk, which this op holds for writing.
                unsafe { copy_between(s.0, Context::CPU, d.0, ctx, bytes, threads) }
            },
            vec![],
            vec![chunk.clone()],
        );
        p.wait = true;
        let name = crate::intern::intern("SyncCopyFromCPU");
        p.name = Some(&name);
        p.payload = Some(Box::new(chunk));
        engine::global()?.submit(p)?;
        // A failure that reached this array skipped the copy: report it.
        take_failure(self.chunk()?)
    }

    /// Copy the array into host memory after its pending writes; returns when done.
    ///
    /// # Safety
    /// `dst` must point to `elements` writable elements of the array's dtype.
    pub unsafe fn copy_to_host(&self, dst: *mut u8, elements: usize) -> Result<()> {
        let bytes = self.check_len(elements)?;
        let threads = copy_threads(bytes)?;
        let chunk = self.chunk()?.clone();
        let src = SendPtr(self.data()?);
        let dst = SendPtr(dst);
        let ctx = self.ctx;
        let mut p = Push::sync(
            move |_| {
                let (s, d) = (src, dst);
                // SAFETY: as in copy_from_host, with the chunk held for reading.
                unsafe { copy_between(s.0, ctx, d.0, Context::CPU, bytes, threads) }
            },
            vec![chunk.clone()],
            vec![],
        );
        p.wait = true;
        let name = crate::intern::intern("SyncCopyToCPU");
        p.name = Some(&name);
        p.payload = Some(Box::new(chunk.clone()));
        engine::global()?.submit(p)?;
        // Data that a failed operation should have written is not data: report the failure.
        take_failure(&chunk)
    }

    /// A new CPU array of `shape` and `dtype` holding `bytes` (its elements, in native byte
    /// order).
    pub fn from_host_bytes(shape: Vec<usize>, dtype: DType, bytes: &[u8]) -> Result<NDArray> {
        let a = NDArray::new(shape, Context::CPU, dtype, false)?;
        a.write_host_bytes(bytes)?;
        Ok(a)
    }

    /// Overwrite the array's elements with `bytes` (native byte order; exactly the array's
    /// size), after its pending reads and writes; returns when done.
    pub fn write_host_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.size() * self.dtype.size() {
            return Err(Error::value(format!(
                "{} bytes do not fill an array of shape {:?} {}",
                bytes.len(),
                self.shape,
                self.dtype.name()
            )));
        }
        // SAFETY: `bytes` holds size × element-size readable bytes (checked above).
        unsafe { self.copy_from_host(bytes.as_ptr(), self.size()) }
    }

    /// The array's elements as bytes in native order, after its pending writes.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.size() * self.dtype.size()];
        // SAFETY: `out` holds size × element-size writable bytes.
        unsafe { self.copy_to_host(out.as_mut_ptr(), self.size())? };
        Ok(out)
    }
}

/// How many threads copy `bytes` bytes: several at or above `MXNET_CPU_PARALLEL_COPY_SIZE`
/// elements (counted in 4-byte elements, as stock counts floats), one below it and always
/// one under NaiveEngine (which promises a process with no threads of ours). Read before the
/// copy is pushed, so that a bad value fails the call that depends on it.
fn copy_threads(bytes: usize) -> Result<usize> {
    let naive = engine::global_if_started().is_some_and(|e| e.kind() == engine::EngineKind::Naive);
    let threads = if naive { 1 } else { crate::runtime::runtime().kernel_threads().min(8) };
    if threads < 2 {
        return Ok(1);
    }
    let threshold = config::global().get_int("MXNET_CPU_PARALLEL_COPY_SIZE", "array copy")?.unwrap_or(200_000);
    Ok(if (bytes / 4) as i64 >= threshold { threads } else { 1 })
}

/// Copy `bytes` bytes from `src` on `sctx` to `dst` on `dctx`: host memory on `threads`
/// threads, anything involving a GPU through CUDA (waited for).
///
/// # Safety
/// As `ptr::copy_nonoverlapping` for `bytes` bytes, each address in its context's memory.
unsafe fn copy_between(
    src: *const u8,
    sctx: Context,
    dst: *mut u8,
    dctx: Context,
    bytes: usize,
    threads: usize,
) -> Result<()> {
    if sctx.dev_type.is_host() && dctx.dev_type.is_host() {
        // SAFETY: per this function's contract.
        unsafe { copy_bytes(src, dst, bytes, threads) };
        return Ok(());
    }
    let mem = |p: *const u8, c: Context| {
        if c.dev_type.is_host() {
            crate::cuda::Mem::Host(p)
        } else {
            crate::cuda::Mem::Device(c.dev_id, p as usize as u64)
        }
    };
    // SAFETY: per this function's contract.
    unsafe { crate::cuda::copy(mem(src, sctx), mem(dst, dctx), bytes) }
}

/// Copy bytes on `threads` threads.
///
/// # Safety
/// As `ptr::copy_nonoverlapping` for `bytes` bytes.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, bytes: usize, threads: usize) {
    if threads < 2 {
        // SAFETY: per this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        return;
    }
    let part = bytes.div_ceil(threads).next_multiple_of(64);
    let (s, d) = (SendPtr(src as *mut u8), SendPtr(dst));
    std::thread::scope(|scope| {
        for start in (0..bytes).step_by(part) {
            let len = part.min(bytes - start);
            scope.spawn(move || {
                let (s, d) = (s, d);
                // SAFETY: disjoint parts of the ranges the caller vouched for.
                unsafe { std::ptr::copy_nonoverlapping(s.0.add(start), d.0.add(start), len) };
            });
        }
    });
}

/// Reshape inference with MXNet's special values: 0 keeps a dimension, -1 is inferred, -2
/// keeps all remaining, -3 merges two, -4 splits one into the next two values.
pub fn infer_reshape(src: &[usize], spec: &[i64], reverse: bool) -> Result<Vec<usize>> {
    let out = reshape_dims(src, spec, reverse)?;
    let total: usize = src.iter().product();
    let got: usize = out.iter().product();
    if got != total {
        return Err(Error::value(format!("cannot reshape {src:?} to {spec:?}: {total} elements cannot become {got}")));
    }
    Ok(out)
}

/// The shape `spec` asks of an array of shape `src` ([`infer_reshape`]'s rules), without
/// requiring the element count to stay (stock's `InferReshapeShape`: what
/// `MXNDArrayReshape64` views the leading elements of an array with outside numpy-shape
/// mode). Its element count fits in `usize`.
pub fn reshape_dims(src: &[usize], spec: &[i64], reverse: bool) -> Result<Vec<usize>> {
    let bad = |why: String| Error::value(format!("cannot reshape {src:?} to {spec:?}: {why}"));
    let (src_v, spec_v): (Vec<usize>, Vec<i64>) = if reverse {
        (src.iter().rev().copied().collect(), spec.iter().rev().copied().collect())
    } else {
        (src.to_vec(), spec.to_vec())
    };
    let mut out: Vec<usize> = Vec::new();
    let mut infer: Option<usize> = None;
    let (mut si, mut i) = (0usize, 0usize);
    let next_src = |si: &mut usize| -> Result<usize> {
        let d = *src_v.get(*si).ok_or_else(|| bad("more dimensions taken than the array has".into()))?;
        *si += 1;
        Ok(d)
    };
    while i < spec_v.len() {
        match spec_v[i] {
            d if d > 0 => {
                out.push(d as usize);
                si += 1;
            }
            0 => out.push(next_src(&mut si)?),
            -1 => {
                if infer.replace(out.len()).is_some() {
                    return Err(bad("more than one -1".into()));
                }
                out.push(1);
                si += 1;
            }
            -2 => {
                while si < src_v.len() {
                    out.push(src_v[si]);
                    si += 1;
                }
            }
            -3 => {
                let a = next_src(&mut si)?;
                let b = next_src(&mut si)?;
                out.push(a.checked_mul(b).ok_or_else(|| bad("-3 merges dimensions too large".into()))?);
            }
            -4 => {
                let (mut a, mut b) = match (spec_v.get(i + 1), spec_v.get(i + 2)) {
                    (Some(&a), Some(&b)) => (a, b),
                    _ => return Err(bad("-4 must be followed by two values".into())),
                };
                if reverse {
                    std::mem::swap(&mut a, &mut b);
                }
                i += 2;
                let whole = next_src(&mut si)? as i64;
                if a == -1 && b > 0 && whole % b == 0 {
                    a = whole / b;
                } else if b == -1 && a > 0 && whole % a == 0 {
                    b = whole / a;
                }
                if a <= 0 || b <= 0 || a.checked_mul(b) != Some(whole) {
                    return Err(bad(format!("-4 cannot split {whole}")));
                }
                let (a, b) = if reverse { (b, a) } else { (a, b) };
                out.push(a as usize);
                out.push(b as usize);
            }
            d => return Err(bad(format!("invalid value {d}"))),
        }
        i += 1;
    }
    fn product(dims: impl Iterator<Item = usize>) -> Option<usize> {
        dims.into_iter().try_fold(1usize, |acc, d| acc.checked_mul(d))
    }
    let too_large = || bad("the target shape is too large".into());
    let total = product(src.iter().copied()).ok_or_else(too_large)?;
    if out.len() > MAX_NDIM {
        return Err(bad(format!("{} dimensions (at most {MAX_NDIM})", out.len())));
    }
    if let Some(k) = infer {
        let known = product(out.iter().enumerate().filter(|(j, _)| *j != k).map(|(_, d)| *d)).ok_or_else(too_large)?;
        if known == 0 || total % known != 0 {
            return Err(bad("the -1 dimension cannot be inferred".into()));
        }
        out[k] = total / known;
    }
    product(out.iter().copied()).ok_or_else(too_large)?;
    if reverse {
        out.reverse();
    }
    Ok(out)
}

/// Numpy-shape semantics (`MXSetIsNumpyShape`): 0 off, 1 on for this thread, 2 on globally.
pub mod np_shape {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};

    static GLOBAL: AtomicBool = AtomicBool::new(false);
    thread_local! {
        static THREAD: Cell<bool> = const { Cell::new(false) };
    }

    /// The current mode: 2 global, 1 this thread, 0 off.
    pub fn get() -> i32 {
        if GLOBAL.load(Ordering::Acquire) {
            2
        } else if THREAD.with(Cell::get) {
            1
        } else {
            0
        }
    }

    /// Set the mode; returns the previous one.
    pub fn set(mode: i32) -> crate::Result<i32> {
        let prev = get();
        match mode {
            0 => {
                GLOBAL.store(false, Ordering::Release);
                THREAD.with(|t| t.set(false));
            }
            1 => THREAD.with(|t| t.set(true)),
            2 => {
                GLOBAL.store(true, Ordering::Release);
                THREAD.with(|t| t.set(true));
            }
            _ => return Err(crate::Error::value(format!("numpy-shape mode must be 0, 1 or 2, got {mode}"))),
        }
        Ok(prev)
    }
}

fn take_failure(var: &Var) -> Result<()> {
    match var.take_failure() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: used only inside engine operations whose variables grant exclusive (write) or shared
// (read) access to the bytes, while the owner of the memory waits.
unsafe impl Send for SendPtr {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_codes() {
        assert_eq!(byte_size(&[2, 3], DType::F64).unwrap(), (6, 48));
        assert!(byte_size(&[usize::MAX, 2], DType::F32).is_err());
        assert!(DType::from_code(9).unwrap_err().to_string().starts_with("TypeError"));
        assert!(DType::from_code(12).unwrap_err().to_string().starts_with("NotImplementedError"));
        assert_eq!(DType::from_code(6).unwrap().size(), 8);
    }

    #[test]
    fn reshape_codes() {
        let r = |src: &[usize], spec: &[i64], rev: bool| infer_reshape(src, spec, rev);
        assert_eq!(r(&[2, 3, 4], &[-1], false).unwrap(), vec![24]);
        assert_eq!(r(&[2, 3, 4], &[0, -1], false).unwrap(), vec![2, 12]);
        assert_eq!(r(&[2, 3, 4], &[0, -2], false).unwrap(), vec![2, 3, 4]);
        assert!(r(&[2, 3, 4], &[4, 0, -2], false).is_err()); // 4 takes the place of 2
        assert_eq!(r(&[2, 3, 4], &[-3, 4], false).unwrap(), vec![6, 4]);
        assert_eq!(r(&[2, 3, 4], &[-4, 1, 2, -2], false).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(r(&[2, 3, 4], &[2, -4, -1, 3, 4], false).unwrap(), vec![2, 1, 3, 4]);
        assert_eq!(r(&[10, 5, 4], &[-1, 0], true).unwrap(), vec![50, 4]);
        assert_eq!(r(&[10, 5, 4], &[-1, 0], false).unwrap(), vec![40, 5]);
        assert!(r(&[2, 3], &[4, 2], false).is_err());
        assert!(r(&[2, 3], &[-1, -1], false).is_err());
        assert!(r(&[2, 3], &[-5], false).is_err());
        assert!(r(&[2, 3], &[-3, -3], false).is_err());
    }

    #[test]
    fn views_share_storage() {
        let a = NDArray::new(vec![4, 2], Context::CPU, DType::F32, false).unwrap();
        let src: Vec<f32> = (0..8).map(|x| x as f32).collect();
        // SAFETY: 8 f32.
        unsafe { a.copy_from_host(src.as_ptr() as *const u8, 8).unwrap() };
        let s = a.slice(1, 3).unwrap();
        assert_eq!(s.shape, vec![2, 2]);
        let mut got = vec![0f32; 4];
        // SAFETY: 4 f32.
        unsafe { s.copy_to_host(got.as_mut_ptr() as *mut u8, 4).unwrap() };
        assert_eq!(got, vec![2., 3., 4., 5.]);
        let row = a.at(3).unwrap();
        // Writing through the view changes the base.
        // SAFETY: 2 f32.
        unsafe { row.copy_from_host([9f32, 9.].as_ptr() as *const u8, 2).unwrap() };
        let mut all = vec![0f32; 8];
        // SAFETY: 8 f32.
        unsafe { a.reshape(&[-1], false).unwrap().copy_to_host(all.as_mut_ptr() as *mut u8, 8).unwrap() };
        assert_eq!(&all[6..], &[9., 9.]);
        assert!(a.slice(3, 2).unwrap_err().to_string().starts_with("IndexError"));
        assert_eq!(a.slice(4, 4).unwrap().shape, vec![0, 2]);
        assert!(a.slice(0, 5).is_err() && a.at(4).is_err());
        assert_eq!(a.at(0).unwrap().at(1).unwrap().shape, vec![1]); // legacy 1-d indexing
        let b = NDArray::new(vec![4, 2], Context::CPU, DType::F32, false).unwrap();
        b.copy_from(&a).unwrap();
        assert!(b.copy_from(&s).is_err());
    }

    #[test]
    fn large_copies_use_threads_and_stay_exact() {
        let n = 1 << 20;
        let a = NDArray::new(vec![n], Context::CPU, DType::F32, true).unwrap();
        let src: Vec<f32> = (0..n).map(|x| x as f32).collect();
        let mut back = vec![0f32; n];
        // SAFETY: n f32 each.
        unsafe {
            a.copy_from_host(src.as_ptr() as *const u8, n).unwrap();
            a.copy_to_host(back.as_mut_ptr() as *mut u8, n).unwrap();
        }
        assert!(src == back);
    }

    /// Freeing every handle of an array while an operation on it is pending is safe: the
    /// memory stays until the operation finished, then returns to the pool.
    #[test]
    fn memory_outlives_freed_handles_until_pending_work_ends() {
        let bytes = 5 * 1024 * 1024 + 8; // a pool bucket (6 MiB) no other test uses
        let a = NDArray::new(vec![bytes / 4], Context::CPU, DType::F32, false).unwrap();
        let ptr = SendPtr(a.data().unwrap());
        let var = a.chunk().unwrap().clone();
        let pool = crate::storage::manager().pool(Context::CPU).unwrap();
        let engine = engine::global().unwrap();
        engine
            .submit(Push::sync(
                move |_| {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    let p = ptr;
                    // SAFETY: the block is alive (this op holds its variable) and ours to write.
                    unsafe { std::ptr::write_bytes(p.0, 7, bytes) };
                    Ok(())
                },
                vec![],
                vec![var.clone()],
            ))
            .unwrap();
        drop(a);
        drop(var);
        let in_use_while_pending = pool.stats().bytes_in_use;
        engine.wait_all().unwrap();
        assert!(in_use_while_pending >= bytes, "the block was released while an op was pending");
        // After the op, the block is back in the pool: the next request of its size gets it.
        let again = crate::storage::Block::alloc(bytes, Context::CPU).unwrap();
        assert_eq!(again.ptr(), ptr.0);
    }

    #[test]
    fn copies_round_trip() {
        let a = NDArray::new(vec![2, 3], Context::CPU, DType::F32, true).unwrap();
        let src: Vec<f32> = (0..6).map(|x| x as f32 * 1.5).collect();
        let mut dst = vec![0f32; 6];
        // SAFETY: both buffers hold 6 f32.
        unsafe {
            a.copy_from_host(src.as_ptr() as *const u8, 6).unwrap();
            a.copy_to_host(dst.as_mut_ptr() as *mut u8, 6).unwrap();
            assert!(a.copy_to_host(dst.as_mut_ptr() as *mut u8, 5).is_err());
        }
        assert_eq!(src, dst);
    }
}
