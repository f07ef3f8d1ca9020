//! DLPack: zero-copy exchange of arrays with other libraries (NumPy through the frontend's
//! `from_numpy(zero_copy=True)`, `to_dlpack_for_read/write`, `from_dlpack`).
//!
//! Owns the C layout of DLPack as MXNet 1.9.1 speaks it (`DLContext`, `DLDataType`,
//! `DLTensor`, `DLManagedTensor`), [`to_dlpack`] (a managed tensor over an array's memory that
//! keeps the array alive until its deleter runs) and [`from_dlpack`] (an array over a managed
//! tensor's memory whose deleter runs once, when the array's last view is dropped).

use super::{byte_size, DType, NDArray, MAX_NDIM};
use crate::context::{Context, DevType};
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};

/// DLPack's device (`DLContext`): 1 CPU, 2 GPU, 3 pinned CPU memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLContext {
    pub device_type: c_int,
    pub device_id: c_int,
}

/// DLPack's element type: code (0 int, 1 uint, 2 float, 4 bfloat), bits, lanes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub ctx: DLContext,
    pub ndim: c_int,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    /// NULL: compact row-major.
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// Stock's mapping (`TBlob::DTypeTransform`).
fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::F16 => (2, 16),
        DType::U8 => (1, 8),
        DType::I32 => (0, 32),
        DType::I8 => (0, 8),
        DType::I64 => (0, 64),
        DType::Bool => (1, 1),
    };
    DLDataType { code, bits, lanes: 1 }
}

fn from_dl_dtype(t: DLDataType) -> Result<DType> {
    if t.lanes != 1 {
        return Err(Error::not_supported(format!("a DLPack tensor with {} lanes", t.lanes)));
    }
    Ok(match (t.code, t.bits) {
        (2, 16) => DType::F16,
        (2, 32) => DType::F32,
        (2, 64) => DType::F64,
        (1, 1) => DType::Bool,
        (1, 8) => DType::U8,
        (0, 8) => DType::I8,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (4, 16) => return Err(Error::not_supported("a bfloat16 DLPack tensor")),
        (code, bits) => {
            return Err(Error::type_error(format!("DLPack dtype (code {code}, {bits} bits) has no MXNet dtype")))
        }
    })
}

/// What [`to_dlpack`] hands out: the managed tensor first (its address is the allocation's),
/// then what it points into and keeps alive.
#[repr(C)]
struct Exported {
    tensor: DLManagedTensor,
    array: NDArray,
    shape: Vec<i64>,
}

/// The deleter of [`to_dlpack`]'s tensors.
unsafe extern "C" fn delete_exported(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // Dropping an array takes no lock a caller could hold and does not panic; were it to,
    // the panic stops here (this is called from C).
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `manager_ctx` is the `Exported` that `to_dlpack` made with `Box::into_raw`
        // (read from `t`, which may be a consumer's copy of the tensor: stock's transient
        // import deletes its copy), and DLPack's contract calls the deleter once.
        drop(unsafe { Box::from_raw((*t).manager_ctx.cast::<Exported>()) });
    });
}

/// A managed tensor over `a`'s memory (allocated now if it was delayed), keeping `a` alive
/// until the tensor's deleter runs. Pending operations are not waited for (the frontend waits
/// before asking). Returns the tensor's address, the consumer's to delete.
pub fn to_dlpack(a: &NDArray) -> Result<*mut DLManagedTensor> {
    let ctx = a.ctx().ok_or_else(|| Error::value("the NDArray is empty (created with MXNDArrayCreateNone)"))?;
    let data = a.data()?.cast::<c_void>();
    let shape: Vec<i64> = a.shape.iter().map(|&d| d as i64).collect();
    let device_type = if ctx.dev_type.is_host() { 1 } else { 2 };
    let mut e = Box::new(Exported {
        tensor: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
                ctx: DLContext { device_type, device_id: ctx.dev_id },
                ndim: a.shape.len() as c_int,
                dtype: dl_dtype(a.dtype),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
        },
        array: a.detached(),
        shape,
    });
    // The shape vector's buffer does not move with the box.
    e.tensor.dl_tensor.shape = e.shape.as_mut_ptr();
    let p = Box::into_raw(e);
    // SAFETY: `p` is the live allocation just made; `manager_ctx` names it, as stock's does.
    unsafe { (*p).tensor.manager_ctx = p.cast() };
    Ok(p.cast())
}

/// A managed tensor owned by the array made from it, deleted (once) with the array's memory.
struct Owned {
    tensor: *mut DLManagedTensor,
    /// The tensor is our copy (a transient handle), freed after its deleter ran.
    copied: bool,
}

// SAFETY: DLPack gives the consumer the managed tensor until it calls the deleter, which it
// may do from any thread (stock calls it from whichever thread frees the array's memory, and
// the frontend's deleters take the GIL themselves).
unsafe impl Send for Owned {}

impl Owned {
    fn release(self) {
        // SAFETY: the tensor is live until its deleter runs, here, once.
        unsafe {
            if let Some(d) = (*self.tensor).deleter {
                d(self.tensor);
            }
            if self.copied {
                drop(Box::from_raw(self.tensor));
            }
        }
    }
}

/// An array over a managed tensor's memory (stock's `NDArray::FromDLPack`); one of
/// [`to_dlpack`]'s gives back the array it was made from (the same engine variable). With `transient`
/// the struct at `t` may go away after this call (the frontend's `from_numpy` builds it on
/// the fly): a copy is kept instead. The tensor's deleter runs once, when the array's last
/// view is dropped; on failure it does not run (the tensor stays the caller's).
///
/// # Safety
/// `t` must point to a valid `DLManagedTensor` whose data, shape and strides are valid as
/// DLPack describes them, and the caller gives up the tensor on success.
pub unsafe fn from_dlpack(t: *const DLManagedTensor, transient: bool) -> Result<NDArray> {
    if t.is_null() {
        return Err(Error::value("the DLPack tensor is NULL"));
    }
    // SAFETY: per this function's contract.
    let m = unsafe { *t };
    // One of ours (`to_dlpack`): the array itself, a view sharing its chunk, so that the
    // engine orders work on both under one variable. The tensor is given up here.
    // (Compared as addresses: `delete_exported` is one non-generic function of this library.)
    let ours = delete_exported as unsafe extern "C" fn(*mut DLManagedTensor) as usize;
    if m.deleter.map(|d| d as usize) == Some(ours) {
        // SAFETY: a tensor with our deleter was made by `to_dlpack`, so `manager_ctx` is its
        // live `Exported`.
        let a = unsafe { (*m.manager_ctx.cast::<Exported>()).array.clone() };
        // SAFETY: the caller gives the tensor up; this is its one deleter call.
        unsafe { delete_exported(t.cast_mut()) };
        return Ok(a);
    }
    let d = &m.dl_tensor;
    let ndim = usize::try_from(d.ndim)
        .ok()
        .filter(|&n| n <= MAX_NDIM)
        .ok_or_else(|| Error::value(format!("a DLPack tensor of {} dimensions (at most {MAX_NDIM})", d.ndim)))?;
    let dims: &[i64] = if ndim == 0 {
        &[]
    } else if d.shape.is_null() {
        return Err(Error::value("the DLPack tensor's shape is NULL"));
    } else {
        // SAFETY: DLPack's shape holds `ndim` values (this function's contract).
        unsafe { std::slice::from_raw_parts(d.shape, ndim) }
    };
    let shape = dims
        .iter()
        .map(|&x| usize::try_from(x).map_err(|_| Error::value(format!("DLPack shape {dims:?} has a negative size"))))
        .collect::<Result<Vec<_>>>()?;
    if !d.strides.is_null() && ndim > 0 {
        // SAFETY: as the shape.
        let strides = unsafe { std::slice::from_raw_parts(d.strides, ndim) };
        let mut expect = 1i64;
        for k in (0..ndim).rev() {
            if dims[k] != 1 && strides[k] != expect {
                return Err(Error::not_supported(format!(
                    "a strided DLPack tensor (shape {dims:?}, strides {strides:?}); only compact row-major tensors"
                )));
            }
            expect = expect.saturating_mul(dims[k]);
        }
    }
    let dtype = from_dl_dtype(d.dtype)?;
    let ctx = match d.ctx.device_type {
        1 => Context::new(DevType::Cpu, d.ctx.device_id)?,
        2 => Context::new(DevType::Gpu, d.ctx.device_id)?,
        3 => Context::new(DevType::CpuPinned, d.ctx.device_id)?,
        other => return Err(Error::not_supported(format!("a DLPack tensor on device type {other}"))),
    };
    let (_, bytes) = byte_size(&shape, dtype)?;
    let offset = usize::try_from(d.byte_offset).map_err(|_| Error::value("the DLPack byte_offset is too large"))?;
    let data = (d.data as *mut u8).wrapping_add(offset);
    if bytes > 0 && (data.is_null() || data as usize % dtype.size() != 0) {
        return Err(Error::value(format!(
            "the DLPack tensor's data {data:p} is not aligned for {} elements",
            dtype.name()
        )));
    }
    let owned = if transient {
        Owned { tensor: Box::into_raw(Box::new(m)), copied: true }
    } else {
        Owned { tensor: t.cast_mut(), copied: false }
    };
    // A failure below must neither run the deleter nor leak our copy.
    let copy = owned.copied.then_some(owned.tensor);
    let release = Box::new(move || owned.release());
    // SAFETY: DLPack lends `bytes` bytes at `data` on `ctx` until the deleter runs, which
    // `release` does, once.
    let made = unsafe { NDArray::from_lent(shape, dtype, ctx, data, release) };
    if made.is_err() {
        if let Some(c) = copy {
            // SAFETY: the release closure (dropped unrun by the failure) never touched it.
            drop(unsafe { Box::from_raw(c) });
        }
    }
    made
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    static DELETED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count(_t: *mut DLManagedTensor) {
        DELETED.fetch_add(1, Ordering::SeqCst);
    }

    fn foreign(data: *mut i32, shape: &mut [i64; 2], strides: &mut [i64; 2], byte_offset: u64) -> DLManagedTensor {
        DLManagedTensor {
            dl_tensor: DLTensor {
                data: data.cast(),
                ctx: DLContext { device_type: 1, device_id: 0 },
                ndim: 2,
                dtype: DLDataType { code: 0, bits: 32, lanes: 1 },
                shape: shape.as_mut_ptr(),
                strides: strides.as_mut_ptr(),
                byte_offset,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(count),
        }
    }

    #[test]
    fn round_trip_shares_memory_and_deletes_once() {
        let a = testing::array_f32(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let t = to_dlpack(&a).unwrap();
        // SAFETY: `t` is the tensor just made; the array made from it owns it.
        let b = unsafe { from_dlpack(t, false) }.unwrap();
        assert_eq!(b.shape, [2, 3]);
        assert_eq!(b.data().unwrap(), a.data().unwrap(), "the same memory");
        drop(a);
        assert_eq!(testing::values(&b), [1., 2., 3., 4., 5., 6.], "kept alive by the tensor");
        // Our own tensor comes back as the array (one engine variable), transient or not.
        let t = to_dlpack(&b).unwrap();
        // SAFETY: a copy of the tensor, as stock's transient import makes; the original
        // struct is not used after.
        let copy = unsafe { *t };
        // SAFETY: `copy` is a valid tensor the array made from it owns.
        let c = unsafe { from_dlpack(&copy, true) }.unwrap();
        assert!(Arc::ptr_eq(c.chunk().unwrap(), b.chunk().unwrap()));
        drop(b);
        assert_eq!(testing::values(&c), [1., 2., 3., 4., 5., 6.]);
        drop(c);

        // A foreign tensor handed over transiently: its deleter runs once, with the array.
        // The byte offset (one element) leaves three of the four: a 1x2 view.
        let mut mem = [1i32, 2, 3, 4];
        let (mut shape, mut strides) = ([1i64, 2], [2i64, 1]);
        let before = DELETED.load(Ordering::SeqCst);
        let m = foreign(mem.as_mut_ptr(), &mut shape, &mut strides, 4);
        // SAFETY: `mem`, `shape` and `strides` outlive the array.
        let c = unsafe { from_dlpack(&m, true) }.unwrap();
        assert_eq!((c.shape.as_slice(), c.dtype), (&[1usize, 2][..], DType::I32));
        let c2 = c.clone();
        drop(c);
        assert_eq!(DELETED.load(Ordering::SeqCst), before, "a view is still alive");
        drop(c2);
        assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);

        // Refused, and the deleter does not run: strided, several lanes, an unknown device,
        // misaligned data.
        let (mut shape, mut strided) = ([2i64, 2], [1i64, 1]);
        let bad = foreign(mem.as_mut_ptr(), &mut shape, &mut strided, 0);
        // SAFETY: as above.
        assert!(unsafe { from_dlpack(&bad, true) }.is_err());
        let (mut shape, mut strides) = ([2i64, 2], [2i64, 1]);
        let good = foreign(mem.as_mut_ptr(), &mut shape, &mut strides, 0);
        let mut bad = good;
        bad.dl_tensor.dtype.lanes = 4;
        // SAFETY: as above.
        assert!(unsafe { from_dlpack(&bad, true) }.is_err());
        bad = good;
        bad.dl_tensor.ctx.device_type = 7;
        // SAFETY: as above.
        assert!(unsafe { from_dlpack(&bad, true) }.is_err());
        bad = good;
        bad.dl_tensor.byte_offset = 1;
        // SAFETY: as above (refused for its alignment before any read).
        assert!(unsafe { from_dlpack(&bad, true) }.is_err());
        assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);
    }
}
