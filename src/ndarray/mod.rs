//! NDArrays: shape, dtype and context over shared storage with one engine variable.
//!
//! Owns: [`DType`] (stock codes), [`NDArray`] (a view: shape and byte offset into a
//! [`Chunk`]) and [`Chunk`] (the storage and the engine variable every view of it shares).
//! Data is touched only inside engine operations that list the chunk's variable, or after
//! waiting for it; a chunk (and its memory) lives until the last view and the last pending
//! operation that holds it are gone.

use crate::context::Context;
use crate::engine::{self, Push, Var};
use crate::error::{Error, Result};
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

/// Storage and engine variable shared by every view of one array. The memory block is held
/// by the variable, so pending operations (which hold the variable) keep it alive.
pub struct Chunk {
    pub var: Arc<Var>,
    pub ctx: Context,
    bytes: usize,
}

impl Chunk {
    /// The data pointer, allocating on first use (`delay_alloc`).
    pub fn data(&self) -> Result<*mut u8> {
        self.var.data(self.bytes, self.ctx)
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// An array (or a view of one).
#[derive(Clone)]
pub struct NDArray {
    /// `None` for an array created with `MXNDArrayCreateNone`.
    pub chunk: Option<Arc<Chunk>>,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Byte offset of this view into the chunk.
    pub offset: usize,
}

/// Number of elements and bytes of `shape` in `dtype`, refusing overflow.
pub fn byte_size(shape: &[usize], dtype: DType) -> Result<(usize, usize)> {
    let too_big = || Error::value(format!("shape {shape:?} of {} is too large", dtype.name()));
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(too_big)?;
    let bytes = n.checked_mul(dtype.size()).filter(|&b| b <= isize::MAX as usize).ok_or_else(too_big)?;
    Ok((n, bytes))
}

impl NDArray {
    pub fn none() -> Self {
        NDArray { chunk: None, shape: Vec::new(), dtype: DType::F32, offset: 0 }
    }

    pub fn new(shape: Vec<usize>, ctx: Context, dtype: DType, delay_alloc: bool) -> Result<Self> {
        let (_, bytes) = byte_size(&shape, dtype)?;
        ctx.check_available()?;
        let chunk = Arc::new(Chunk { var: Var::new(), ctx, bytes });
        if !delay_alloc {
            chunk.data()?;
        }
        Ok(NDArray { chunk: Some(chunk), shape, dtype, offset: 0 })
    }

    pub fn chunk(&self) -> Result<&Arc<Chunk>> {
        self.chunk.as_ref().ok_or_else(|| Error::value("the NDArray is empty (created with MXNDArrayCreateNone)"))
    }
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn ctx(&self) -> Option<Context> {
        self.chunk.as_ref().map(|c| c.ctx)
    }

    /// Wait until pending writes (or, with `write`, all pending operations) are done.
    pub fn wait(&self, write: bool) -> Result<()> {
        match &self.chunk {
            None => Ok(()),
            Some(c) => engine::global()?.wait_for_var(&c.var, write),
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

    /// Copy `elements` elements from host memory into the array, after its pending reads and
    /// writes; returns when done.
    ///
    /// # Safety
    /// `src` must point to `elements` readable elements of the array's dtype.
    pub unsafe fn copy_from_host(&self, src: *const u8, elements: usize) -> Result<()> {
        let bytes = self.check_len(elements)?;
        let chunk = self.chunk()?.clone();
        let dst = SendPtr(chunk.data()?.wrapping_add(self.offset));
        let src = SendPtr(src as *mut u8);
        let mut p = Push::sync(
            move |_| {
                let (s, d) = (src, dst);
                // SAFETY: the caller keeps `src` valid until this (waited-for) op finished;
                // the destination range lies in the chunk, which this op holds for writing.
                unsafe { std::ptr::copy_nonoverlapping(s.0, d.0, bytes) };
                Ok(())
            },
            vec![],
            vec![chunk.var.clone()],
        );
        p.wait = true;
        p.name = Some(engine::intern("SyncCopyFromCPU"));
        p.payload = Some(Box::new(chunk));
        engine::global()?.push(p)?;
        // A failure that reached this array skipped the copy: report it.
        take_failure(&self.chunk()?.var)
    }

    /// Copy the array into host memory after its pending writes; returns when done.
    ///
    /// # Safety
    /// `dst` must point to `elements` writable elements of the array's dtype.
    pub unsafe fn copy_to_host(&self, dst: *mut u8, elements: usize) -> Result<()> {
        let bytes = self.check_len(elements)?;
        let chunk = self.chunk()?.clone();
        let src = SendPtr(chunk.data()?.wrapping_add(self.offset));
        let dst = SendPtr(dst);
        let mut p = Push::sync(
            move |_| {
                let (s, d) = (src, dst);
                // SAFETY: as in copy_from_host, with the chunk held for reading.
                unsafe { std::ptr::copy_nonoverlapping(s.0, d.0, bytes) };
                Ok(())
            },
            vec![chunk.var.clone()],
            vec![],
        );
        p.wait = true;
        p.name = Some(engine::intern("SyncCopyToCPU"));
        p.payload = Some(Box::new(chunk.clone()));
        engine::global()?.push(p)?;
        // Data that a failed operation should have written is not data: report the failure.
        take_failure(&chunk.var)
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
