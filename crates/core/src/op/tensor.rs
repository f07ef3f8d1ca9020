//! What kernels see: [`TBlob`] (a contiguous array's address, shape and dtype), the element
//! trait [`Elem`] for the eight stock dtypes, and the dtype dispatch macros.
//!
//! Owns the one place where raw data addresses become slices, and makes aliasing `&`/`&mut`
//! impossible by construction: inputs are read views ([`TBlob`], `&[T]` only); outputs and
//! mutated inputs are write views ([`OutBlob`], not `Clone`, `&mut [T]` only through
//! `&mut self`); an input whose memory is an output's (a declared in-place pair) or that the
//! kernel writes (a mutated input) is *lent* and read only through that output
//! ([`OutBlob::operands`] gives element-wise kernels one read-modify-write view). Invocation
//! (`invoke::fill_blobs`) builds the views so that no two of them overlap unless one is lent
//! to the other, and the engine holds the arrays' variables while a kernel runs.

use crate::ndarray::DType;

/// Storage of a `bool` element: one byte, 0 or non-zero (any byte a user wrote is valid).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
#[repr(transparent)]
pub struct Bool8(pub u8);

/// An element type of one of the stock dtypes.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value (array memory and
/// scratch memory are viewed as `[Self]` whatever bytes they hold), and `DTYPE` must name
/// this type alone (kernels check a blob's dtype against it before viewing its elements).
pub unsafe trait Elem: Copy + Send + Sync + PartialOrd + Default + std::fmt::Debug + 'static {
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
        // SAFETY: a primitive number: every bit pattern is a value.
        unsafe impl Elem for $t {
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

// SAFETY: every 16-bit pattern is an f16 value (NaNs included).
unsafe impl Elem for half::f16 {
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

// SAFETY: any byte is a Bool8 (0 false, non-zero true).
unsafe impl Elem for Bool8 {
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

/// A blob's shape, inline up to 6 dimensions (a call's blobs then allocate nothing).
pub type BlobShape = smallvec::SmallVec<[usize; 6]>;

/// An input array as a kernel reads it: contiguous elements, shape and dtype.
///
/// A read view only. An input that shares its memory with an output (a declared in-place
/// pair) or that the operator writes (a mutated input) is *lent*: its elements are reached
/// through the output's [`OutBlob`] alone ([`OutBlob::operands`] for in-place pairs, the
/// appended outputs for mutated inputs), and [`TBlob::as_slice`] refuses it, so no `&[T]` of
/// an input can live beside a `&mut [T]` over the same bytes.
#[derive(Debug, Clone)]
pub struct TBlob {
    ptr: *const u8,
    pub shape: BlobShape,
    pub dtype: DType,
    /// The output this input's memory is lent to, if any (see the type's doc).
    lent_to: Option<usize>,
}

// SAFETY: a TBlob only reads (`as_slice` gives `&[T]`, `T: Sync`), and the engine keeps
// the chunk alive and unwritten by others while the operation runs (the invocation contract).
unsafe impl Send for TBlob {}
unsafe impl Sync for TBlob {}

impl TBlob {
    /// # Safety
    /// `ptr` must address `shape.product()` elements of `dtype`, valid and not written by
    /// anyone for as long as the blob is used, except through the output it is lent to (see
    /// [`TBlob::lend`]).
    pub unsafe fn new(ptr: *const u8, shape: &[usize], dtype: DType) -> Self {
        TBlob { ptr, shape: BlobShape::from_slice(shape), dtype, lent_to: None }
    }
    /// The address as a device address, for GPU kernels (which reach the bytes on the
    /// device; nothing on the host reads through it). A lent input gives the output's address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr as u64
    }
    /// This input read through output `out` only (an in-place pair or a mutated input).
    pub fn lend(mut self, out: usize) -> Self {
        self.lent_to = Some(out);
        self
    }
    /// The output this input is lent to (see the type's doc).
    pub fn lent_to(&self) -> Option<usize> {
        self.lent_to
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
    /// The elements for reading. Panics (an error at the C boundary) on a lent input.
    pub fn as_slice<T: Elem>(&self) -> &[T] {
        assert!(self.lent_to.is_none(), "kernel reads an input lent to output {:?} as a separate slice", self.lent_to);
        assert_eq!(T::DTYPE, self.dtype, "kernel reads a {} array as {:?}", self.dtype.name(), T::DTYPE);
        if self.size() == 0 {
            return &[];
        }
        // SAFETY: `new`'s contract: the range is valid and nobody writes it while the blob is
        // used (a lent input, which its output writes, was refused above). Alignment: chunks
        // are 64-byte aligned and views start at whole elements.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.size()) }
    }
}

/// An output array as a kernel writes it (also a mutated input, appended after the outputs).
///
/// Not `Clone`: the only way to its elements mutably is [`OutBlob::as_mut`] on `&mut self`,
/// so one kernel holds at most one `&mut [T]` of it at a time, and none beside a read of an
/// input lent to it. An output the caller does not want computed ([`super::Req::Null`]) has no
/// address, and any access to its elements panics.
#[derive(Debug)]
pub struct OutBlob {
    ptr: *mut u8,
    pub shape: BlobShape,
    pub dtype: DType,
}

// SAFETY: an OutBlob is the one handle to its range during the operation (not Clone, mutable
// access through `&mut self` only); the engine grants the operation exclusive write access.
unsafe impl Send for OutBlob {}
unsafe impl Sync for OutBlob {}

/// How an element-wise kernel reads one operand: a separate input, or the output itself
/// (the operand was lent to it in place: read each element before writing it).
#[derive(Debug, Clone, Copy)]
pub enum Operand<'a, T> {
    Input(&'a [T]),
    Output,
}

impl OutBlob {
    /// # Safety
    /// `ptr` must address `shape.product()` elements of `dtype`, valid for the blob's use and
    /// written or read by nothing else meanwhile (except lent inputs, which are read only
    /// through this blob); or be null for an output that must not be touched.
    pub unsafe fn new(ptr: *mut u8, shape: &[usize], dtype: DType) -> Self {
        OutBlob { ptr, shape: BlobShape::from_slice(shape), dtype }
    }
    /// The address as a device address, for GPU kernels (see [`TBlob::device_ptr`]).
    pub fn device_ptr(&self) -> u64 {
        self.ptr as u64
    }
    /// The address for a kernel of foreign code (an extension library's), which writes the
    /// elements through it while `&mut self` is held (NULL for a [`super::Req::Null`] output).
    pub fn foreign_ptr(&mut self) -> *mut u8 {
        self.ptr
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
    fn check<T: Elem>(&self) {
        assert!(
            !self.ptr.is_null() || self.size() == 0,
            "kernel touches an output it was told not to write (Req::Null)"
        );
        assert_eq!(T::DTYPE, self.dtype, "kernel reads a {} array as {:?}", self.dtype.name(), T::DTYPE);
    }
    /// The elements for reading (an output's earlier value, `Req::Add`).
    pub fn as_slice<T: Elem>(&self) -> &[T] {
        self.check::<T>();
        if self.size() == 0 {
            return &[];
        }
        // SAFETY: `new`'s contract; `&self` rules out a live `&mut` from `as_mut`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.size()) }
    }
    /// The elements for writing; one live borrow at a time (`&mut self`).
    #[allow(clippy::should_implement_trait)] // generic over the element type: not `AsMut`
    pub fn as_mut<T: Elem>(&mut self) -> &mut [T] {
        self.check::<T>();
        if self.size() == 0 {
            return &mut [];
        }
        // SAFETY: `new`'s contract; the `&mut self` borrow makes this the only live reference
        // to the range for as long as the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut T, self.size()) }
    }
    /// The output's elements for writing, with `xs` as an element-wise kernel reads them: each
    /// a separate slice, or [`Operand::Output`] for an input lent to this output (`me`: this
    /// output's index). An input lent to another output is refused (panics).
    pub fn operands<'a, T: Elem, const N: usize>(
        &'a mut self,
        me: usize,
        xs: [&'a TBlob; N],
    ) -> ([Operand<'a, T>; N], &'a mut [T]) {
        let ops = xs.map(|x| match x.lent_to {
            Some(o) if o == me => {
                assert!(std::ptr::eq(x.ptr, self.ptr) && x.bytes() == self.bytes(), "lent input differs from output");
                Operand::Output
            }
            _ => Operand::Input(x.as_slice::<T>()),
        });
        (ops, self.as_mut::<T>())
    }
    /// The bytes for writing, for dtype-blind copies.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        if self.bytes() == 0 {
            return &mut [];
        }
        assert!(!self.ptr.is_null(), "kernel touches an output it was told not to write (Req::Null)");
        // SAFETY: as `as_mut` (any byte pattern is a valid `u8`; the bytes are written only).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes()) }
    }
    /// Copies `src`'s bytes here (of equal size), over the kernel pool; nothing to do when
    /// `src` is lent to this output (the bytes are already here).
    pub fn copy_from(&mut self, src: &TBlob) {
        assert_eq!(src.bytes(), self.bytes(), "copy between blobs of different sizes");
        if src.lent_to.is_some() && std::ptr::eq(src.ptr, self.ptr) {
            return;
        }
        let from = src.as_bytes();
        let to = self.as_bytes_mut();
        super::kernel::par_for_mut(to, 1, super::kernel::Cost(0.06), DType::U8, |r, to| to.copy_from_slice(&from[r]));
    }
}

impl TBlob {
    /// The bytes, for dtype-blind copies. Refuses a lent input as `as_slice` does.
    pub fn as_bytes(&self) -> &[u8] {
        assert!(self.lent_to.is_none(), "kernel reads an input lent to output {:?} as a separate slice", self.lent_to);
        if self.bytes() == 0 {
            return &[];
        }
        // SAFETY: as `as_slice` (any initialized bytes are valid `u8`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes()) }
    }
}

/// Two distinct outputs of one kernel at once (`i != j`).
pub fn two_mut(outs: &mut [OutBlob], i: usize, j: usize) -> (&mut OutBlob, &mut OutBlob) {
    assert_ne!(i, j);
    if i < j {
        let (a, b) = outs.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = outs.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}

/// A raw pointer that may cross into kernel threads. Kernels split outputs into disjoint
/// `&mut` parts instead ([`super::kernel::par_for_mut`] and its siblings); this is left to
/// the two loops whose writes are not contiguous parts: the strided copy (`ops::strided`,
/// which asserts its destination view in bounds and injective before writing) and the GEMM
/// blocks (`ops::linalg`, which assert their operands' extents).
#[derive(Clone, Copy)]
pub struct SendPtr<T>(pub *mut T);
// SAFETY: sending the address is harmless by itself; every dereference is an `unsafe` block
// of the two users above, justified by their asserted bounds and disjointness.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
