//! What kernels see: [`TBlob`] (a contiguous array's address, shape and dtype), the element
//! trait [`Elem`] for the eight stock dtypes, and the dtype dispatch macros.
//!
//! Owns the one place where raw data addresses become slices. Invocation guarantees that an
//! output never overlaps an input unless the operator declared that pair in-place, and that
//! the engine holds the arrays' variables while a kernel runs (inputs for reading, outputs and
//! mutated inputs for writing), so the slices handed out here do not alias mutably.

use crate::ndarray::DType;

/// Storage of a `bool` element: one byte, 0 or non-zero (any byte a user wrote is valid).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
#[repr(transparent)]
pub struct Bool8(pub u8);

/// An element type of one of the stock dtypes.
pub trait Elem: Copy + Send + Sync + PartialOrd + Default + std::fmt::Debug + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32 {
        self.to_f64() as f32
    }
    fn from_f32(v: f32) -> Self {
        Self::from_f64(v as f64)
    }
    fn zero() -> Self {
        Self::from_f64(0.0)
    }
    fn one() -> Self {
        Self::from_f64(1.0)
    }
}

macro_rules! elem_prim {
    ($($t:ty => $d:ident),*) => {$(
        impl Elem for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)]
            fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn from_f32(v: f32) -> Self { v as $t }
        }
    )*};
}
elem_prim!(f32 => F32, f64 => F64, u8 => U8, i32 => I32, i8 => I8, i64 => I64);

impl Elem for half::f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

impl Elem for Bool8 {
    const DTYPE: DType = DType::Bool;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        (self.0 != 0) as u8 as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
}

/// Run `$body` with `$T` bound to the element type of `$dtype` (all eight dtypes).
#[macro_export]
macro_rules! dispatch_all {
    ($dtype:expr, $T:ident => $body:expr) => {{
        use $crate::ndarray::DType as __D;
        match $dtype {
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
            __D::F16 => {
                type $T = half::f16;
                $body
            }
            __D::U8 => {
                type $T = u8;
                $body
            }
            __D::I32 => {
                type $T = i32;
                $body
            }
            __D::I8 => {
                type $T = i8;
                $body
            }
            __D::I64 => {
                type $T = i64;
                $body
            }
            __D::Bool => {
                type $T = $crate::op::tensor::Bool8;
                $body
            }
        }
    }};
}

/// Run `$body` with `$T` bound to `$dtype`'s element type for the numeric dtypes (all but
/// bool); bool gives a `TypeError` naming `$op`.
#[macro_export]
macro_rules! dispatch_num {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {{
        use $crate::ndarray::DType as __D;
        match $dtype {
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
            __D::F16 => {
                type $T = half::f16;
                $body
            }
            __D::U8 => {
                type $T = u8;
                $body
            }
            __D::I32 => {
                type $T = i32;
                $body
            }
            __D::I8 => {
                type $T = i8;
                $body
            }
            __D::I64 => {
                type $T = i64;
                $body
            }
            __D::Bool => {
                return Err($crate::error::Error::type_error(format!("operator {} does not support dtype bool", $op)))
            }
        }
    }};
}

/// Run `$body` with `$T` bound to `$dtype`'s element type for float32/float64/float16; other
/// dtypes give a `TypeError` naming `$op`.
#[macro_export]
macro_rules! dispatch_float {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {{
        use $crate::ndarray::DType as __D;
        match $dtype {
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
            __D::F16 => {
                type $T = half::f16;
                $body
            }
            other => {
                return Err($crate::error::Error::type_error(format!(
                    "operator {} supports float32, float64 and float16, not {}",
                    $op,
                    other.name()
                )))
            }
        }
    }};
}

/// A contiguous array as a kernel sees it.
#[derive(Debug, Clone)]
pub struct TBlob {
    ptr: *mut u8,
    pub shape: BlobShape,
    pub dtype: DType,
}

/// A blob's shape, inline up to 6 dimensions (a call's blobs then allocate nothing).
pub type BlobShape = smallvec::SmallVec<[usize; 6]>;

// SAFETY: a TBlob is an address into a chunk that the engine keeps alive and grants to the
// running operation; the invocation contract (module doc) rules out conflicting access.
unsafe impl Send for TBlob {}
unsafe impl Sync for TBlob {}

impl TBlob {
    /// # Safety
    /// `ptr` must address `shape.product()` elements of `dtype`, valid (and granted by the
    /// engine) for as long as the blob is used.
    pub unsafe fn new(ptr: *mut u8, shape: &[usize], dtype: DType) -> Self {
        TBlob { ptr, shape: BlobShape::from_slice(shape), dtype }
    }
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    pub fn bytes(&self) -> usize {
        self.size() * self.dtype.size()
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn check<T: Elem>(&self) {
        assert!(
            !self.ptr.is_null() || self.size() == 0,
            "kernel touches an output it was told not to write (Req::Null)"
        );
        assert_eq!(T::DTYPE, self.dtype, "kernel reads a {} array as {:?}", self.dtype.name(), T::DTYPE);
    }
    /// The elements for reading.
    pub fn as_slice<T: Elem>(&self) -> &[T] {
        self.check::<T>();
        if self.size() == 0 {
            return &[];
        }
        // SAFETY: per `new`'s contract the range is valid and granted for reading; alignment:
        // chunks are 64-byte aligned and views start at whole elements.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.size()) }
    }
    /// The elements for writing. Each output (or mutated input) blob is handed to exactly one
    /// kernel invocation, which must not hold two mutable slices of one blob at once.
    #[allow(clippy::mut_from_ref)]
    pub fn as_mut<T: Elem>(&self) -> &mut [T] {
        self.check::<T>();
        if self.size() == 0 {
            return &mut [];
        }
        // SAFETY: as `as_slice`, and the engine grants this operation exclusive write access;
        // the invocation layer guarantees no other live slice overlaps (see module doc).
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.size()) }
    }
    /// The same data under another shape of equal size.
    pub fn reshaped(&self, shape: Vec<usize>) -> TBlob {
        assert_eq!(shape.iter().product::<usize>(), self.size());
        TBlob { ptr: self.ptr, shape: shape.into(), dtype: self.dtype }
    }
}

/// A raw pointer that may cross into kernel threads (the kernel guarantees disjoint use).
#[derive(Clone, Copy)]
pub struct SendPtr<T>(pub *mut T);
// SAFETY: used only to hand disjoint ranges of one granted buffer to parallel chunks.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
