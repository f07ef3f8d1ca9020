//! The copy engine of the shape and indexing operators: strided views of contiguous arrays
//! and a parallel copy from one view to another, dispatched on element SIZE (1/2/4/8 bytes)
//! rather than type, so that data movement compiles once per width.
//!
//! A view is an element offset and a signed stride per dimension over a contiguous buffer;
//! transposes, slices with steps, reversal (negative strides), broadcasts (zero strides),
//! tiling and repeating are all views, and concatenation, stacking and slice assignment are
//! copies into views of the output. Copies merge contiguous dimensions, use `memcpy` for
//! contiguous rows, fill for broadcast rows and a blocked loop for transposed inner dimensions.

use crate::ndarray::DType;
use crate::op::kernel::{par_for, Cost};
use crate::op::tensor::{OutBlob, SendPtr, TBlob};

/// Run `$body` with `$E` bound to an unsigned integer of `$dtype`'s element size.
macro_rules! by_size {
    ($dtype:expr, $E:ident => $body:expr) => {{
        match $dtype.size() {
            1 => {
                type $E = u8;
                $body
            }
            2 => {
                type $E = u16;
                $body
            }
            4 => {
                type $E = u32;
                $body
            }
            _ => {
                type $E = u64;
                $body
            }
        }
    }};
}
pub(super) use by_size;

/// Row-major strides (in elements) of a contiguous array of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as isize;
    }
    s
}

/// A strided view: element offset and strides (one per dimension of the copied shape).
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub off: isize,
    pub strides: Vec<isize>,
}

impl View {
    /// The whole of a contiguous array of `shape`.
    pub fn contiguous(shape: &[usize]) -> View {
        View { off: 0, strides: contiguous_strides(shape) }
    }
}

/// Drop size-1 dimensions and merge dimensions contiguous in both views.
fn simplify(shape: &[usize], a: &[isize], b: &[isize]) -> (Vec<usize>, Vec<isize>, Vec<isize>) {
    let (mut sh, mut sa, mut sb) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..shape.len() {
        if shape[i] == 1 {
            continue;
        }
        if !sh.is_empty() {
            let k = sh.len() - 1;
            if sa[k] == a[i] * shape[i] as isize && sb[k] == b[i] * shape[i] as isize {
                sh[k] *= shape[i];
                sa[k] = a[i];
                sb[k] = b[i];
                continue;
            }
        }
        sh.push(shape[i]);
        sa.push(a[i]);
        sb.push(b[i]);
    }
    (sh, sa, sb)
}

/// Copy the elements of `shape` from view `sv` of `src` to view `dv` of `dst` (both blobs of
/// the same element size). Panics (an operator error) unless both views lie within their
/// blobs and the destination view addresses no element twice: the parallel loops below write
/// through raw pointers, and these two checks are what makes their writes disjoint.
pub fn copy(src: &TBlob, sv: &View, dst: &mut OutBlob, dv: &View, shape: &[usize]) {
    assert_eq!(src.dtype.size(), dst.dtype.size());
    if shape.contains(&0) {
        return;
    }
    assert!(
        view_in_bounds(sv, shape, src.size()) && view_in_bounds(dv, shape, dst.size()),
        "strided copy: a view leaves its array"
    );
    assert!(view_injective(dv, shape), "strided copy: the destination view addresses an element twice");
    // Pointers taken from checked slices: the source is a separate input (not lent, or
    // `as_bytes` refuses it), the destination this kernel's only view of its output.
    let dtype = dst.dtype;
    let src = src.as_bytes().as_ptr();
    let dst = dst.as_bytes_mut().as_mut_ptr();
    // SAFETY: the views were asserted in bounds and the destination injective above; the
    // pointers come from a read slice of the input and the output's one mutable slice.
    by_size!(dtype, E => unsafe { copy_typed::<E>(src.cast(), sv, dst.cast(), dv, shape) })
}

/// [`copy`] into the whole of `dst`, whose shape is the copied shape.
pub fn copy_to(src: &TBlob, sv: &View, dst: &mut OutBlob) {
    let shape = dst.shape.to_vec();
    copy(src, sv, dst, &View::contiguous(&shape), &shape)
}

/// Whether view `v` over `shape` addresses each element at most once. Sufficient test: with
/// the dimensions sorted by stride magnitude, each stride is at least one more than the
/// largest offset the smaller dimensions reach (so distinct indices give distinct offsets).
pub fn view_injective(v: &View, shape: &[usize]) -> bool {
    let mut dims: Vec<(usize, usize)> =
        shape.iter().zip(&v.strides).filter(|(&d, _)| d > 1).map(|(&d, &s)| (s.unsigned_abs(), d)).collect();
    dims.sort_unstable();
    let mut span = 1usize;
    for (s, d) in dims {
        if s < span {
            return false;
        }
        span = match s.checked_mul(d - 1).and_then(|x| x.checked_add(span)) {
            Some(x) => x,
            None => return false,
        };
    }
    true
}

/// # Safety
/// `sp` and `dp` address buffers that views `sv` and `dv` over `shape` stay inside, `dv`
/// addresses no element twice, the buffers do not overlap, and nothing else accesses the
/// destination meanwhile (what [`copy`] asserts and borrows).
unsafe fn copy_typed<E: Copy + Send + Sync + 'static>(sp: *const E, sv: &View, dp: *mut E, dv: &View, shape: &[usize]) {
    let (sh, ss, ds) = simplify(shape, &sv.strides, &dv.strides);
    let sp = SendPtr(sp as *mut E);
    let dp = SendPtr(dp);
    let (s0, d0) = (sv.off, dv.off);
    let nd = sh.len();
    if nd == 0 {
        // SAFETY: one element inside both views (`copy` asserted both views in bounds).
        unsafe { *dp.0.offset(d0) = *sp.0.offset(s0) };
        return;
    }
    let dtype = dtype_of_size(std::mem::size_of::<E>());
    if nd >= 2 && ss[nd - 2] == 1 && ds[nd - 1] == 1 && ss[nd - 1] != 1 {
        // SAFETY: this function's own contract, for the same views simplified.
        unsafe { transpose_blocks::<E>(sp, s0, &ss, dp, d0, &ds, &sh, dtype) };
        return;
    }
    let inner = sh[nd - 1];
    let (si, di) = (ss[nd - 1], ds[nd - 1]);
    let outer_shape = &sh[..nd - 1];
    let outer: usize = outer_shape.iter().product();
    let cost = Cost(0.25 * inner as f64 + 2.0);
    par_for(outer, cost, dtype, |r| {
        let (sp, dp) = (sp, dp);
        let mut idx = unravel(r.start, outer_shape);
        let (mut so, mut dof) = offsets(&idx, &ss, &ds, s0, d0);
        for _ in r {
            // SAFETY: offsets stay inside the views, which lie inside the blobs (asserted by
            // `copy`); the destination view is injective (asserted by `copy`), so rows of the
            // destination are disjoint across the loop (no element addressed twice).
            unsafe {
                let s = sp.0.offset(so);
                let d = dp.0.offset(dof);
                if si == 1 && di == 1 {
                    std::ptr::copy_nonoverlapping(s as *const E, d, inner);
                } else if si == 0 && di == 1 {
                    std::slice::from_raw_parts_mut(d, inner).fill(*s);
                } else {
                    for j in 0..inner as isize {
                        *d.offset(j * di) = *s.offset(j * si);
                    }
                }
            }
            step(&mut idx, outer_shape, &ss, &ds, &mut so, &mut dof);
        }
    });
}

/// Copy where the source's contiguous dimension is the destination's second-to-last: tiles
/// of 32×32 keep both sides in cache.
///
/// # Safety
/// As [`copy_typed`], for the simplified views (`s0`, `ss`) and (`d0`, `ds`) over `sh`.
#[allow(clippy::too_many_arguments)]
unsafe fn transpose_blocks<E: Copy + Send + Sync>(
    sp: SendPtr<E>,
    s0: isize,
    ss: &[isize],
    dp: SendPtr<E>,
    d0: isize,
    ds: &[isize],
    sh: &[usize],
    dtype: DType,
) {
    const B: usize = 32;
    let nd = sh.len();
    let (rows, cols) = (sh[nd - 2], sh[nd - 1]);
    let outer_shape = &sh[..nd - 2];
    let outer: usize = outer_shape.iter().product();
    let (rt, ct) = (rows.div_ceil(B), cols.div_ceil(B));
    let tiles = outer * rt * ct;
    let (srs, scs, drs) = (ss[nd - 2], ss[nd - 1], ds[nd - 2]);
    let cost = Cost((B * B) as f64 * 0.5);
    par_for(tiles, cost, dtype, |r| {
        let (sp, dp) = (sp, dp);
        for t in r {
            let (o, rest) = (t / (rt * ct), t % (rt * ct));
            let (r0, c0) = ((rest / ct) * B, (rest % ct) * B);
            let idx = unravel(o, outer_shape);
            let (so, dof) = offsets(&idx, ss, ds, s0, d0);
            for c in c0..(c0 + B).min(cols) {
                for rr in r0..(r0 + B).min(rows) {
                    // SAFETY: inside both views and each destination element written once (the
                    // bounds and injectivity `copy` asserted).
                    unsafe {
                        *dp.0.offset(dof + rr as isize * drs + c as isize) =
                            *sp.0.offset(so + rr as isize * srs + c as isize * scs);
                    }
                }
            }
        }
    });
}

fn dtype_of_size(s: usize) -> DType {
    match s {
        1 => DType::U8,
        2 => DType::F16,
        4 => DType::F32,
        _ => DType::F64,
    }
}

/// Multi-index of flat position `i` in `shape` (row-major).
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        if shape[k] > 0 {
            idx[k] = i % shape[k];
            i /= shape[k];
        }
    }
    idx
}

fn offsets(idx: &[usize], ss: &[isize], ds: &[isize], s0: isize, d0: isize) -> (isize, isize) {
    let mut so = s0;
    let mut dof = d0;
    for (k, &i) in idx.iter().enumerate() {
        so += i as isize * ss[k];
        dof += i as isize * ds[k];
    }
    (so, dof)
}

/// Advance a multi-index over `shape` by one, updating both offsets.
fn step(idx: &mut [usize], shape: &[usize], ss: &[isize], ds: &[isize], so: &mut isize, dof: &mut isize) {
    for k in (0..shape.len()).rev() {
        idx[k] += 1;
        *so += ss[k];
        *dof += ds[k];
        if idx[k] < shape[k] {
            return;
        }
        *so -= ss[k] * shape[k] as isize;
        *dof -= ds[k] * shape[k] as isize;
        idx[k] = 0;
    }
}

/// Whether every element of view `v` over `shape` lies in `[0, len)`.
pub fn view_in_bounds(v: &View, shape: &[usize], len: usize) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let (mut lo, mut hi) = (v.off, v.off);
    for (k, &d) in shape.iter().enumerate() {
        let span = v.strides[k] * (d as isize - 1);
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    lo >= 0 && hi < len as isize
}

/// An element-size view of an input's bytes (`E` one of the unsigned integers of [`by_size`]).
pub fn elems<E: pod::Pod>(b: &TBlob) -> &[E] {
    pod::cast(b.as_bytes())
}

/// An element-size view of an output's bytes for writing (see [`elems`]).
pub fn elems_mut<E: pod::Pod>(b: &mut OutBlob) -> &mut [E] {
    pod::cast_mut(b.as_bytes_mut())
}

/// Casts between byte slices and slices of the plain unsigned integers.
pub mod pod {
    /// An unsigned integer: every bit pattern is a value, no padding.
    pub trait Pod: Copy + Send + Sync + 'static + sealed::Sealed {}
    impl Pod for u8 {}
    impl Pod for u16 {}
    impl Pod for u32 {}
    impl Pod for u64 {}
    mod sealed {
        pub trait Sealed {}
        impl Sealed for u8 {}
        impl Sealed for u16 {}
        impl Sealed for u32 {}
        impl Sealed for u64 {}
    }
    pub fn cast<E: Pod>(b: &[u8]) -> &[E] {
        // SAFETY: E is a sealed unsigned integer type (any bytes are a value); `align_to`
        // gives only whole, aligned elements, and the assert below rejects a partial split.
        let (pre, mid, post) = unsafe { b.align_to::<E>() };
        assert!(pre.is_empty() && post.is_empty(), "array bytes not aligned to their element size");
        mid
    }
    pub fn cast_mut<E: Pod>(b: &mut [u8]) -> &mut [E] {
        // SAFETY: as `cast`; any value written is a valid byte pattern for the bytes.
        let (pre, mid, post) = unsafe { b.align_to_mut::<E>() };
        assert!(pre.is_empty() && post.is_empty(), "array bytes not aligned to their element size");
        mid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob<T>(v: &mut [T], shape: Vec<usize>, dtype: DType) -> TBlob {
        // SAFETY: the vector outlives the blob in each test and is not written meanwhile.
        unsafe { TBlob::new(v.as_mut_ptr() as *mut u8, &shape, dtype) }
    }

    fn oblob<T>(v: &mut [T], shape: Vec<usize>, dtype: DType) -> OutBlob {
        // SAFETY: the vector outlives the blob in each test and is read after the copy only.
        unsafe { OutBlob::new(v.as_mut_ptr() as *mut u8, &shape, dtype) }
    }

    #[test]
    fn simplify_merges_contiguous_dims() {
        let (sh, a, b) = simplify(&[2, 1, 3, 4], &[12, 12, 4, 1], &[12, 99, 4, 1]);
        assert_eq!((sh, a, b), (vec![24], vec![1], vec![1]));
        let (sh, _, _) = simplify(&[2, 3], &[1, 2], &[3, 1]);
        assert_eq!(sh, vec![2, 3]);
    }

    #[test]
    fn transpose_and_reverse_views() {
        for (r, c) in [(3usize, 5usize), (70, 45)] {
            let mut a: Vec<f32> = (0..r * c).map(|x| x as f32).collect();
            let mut o = vec![0f32; r * c];
            let (sa, mut so) = (blob(&mut a, vec![r, c], DType::F32), oblob(&mut o, vec![c, r], DType::F32));
            copy(&sa, &View { off: 0, strides: vec![1, c as isize] }, &mut so, &View::contiguous(&[c, r]), &[c, r]);
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(o[j * r + i], (i * c + j) as f32);
                }
            }
        }
        let mut a: Vec<i64> = (0..6).collect();
        let mut o = vec![0i64; 6];
        let (sa, mut so) = (blob(&mut a, vec![2, 3], DType::I64), oblob(&mut o, vec![2, 3], DType::I64));
        copy(&sa, &View { off: 2, strides: vec![3, -1] }, &mut so, &View::contiguous(&[2, 3]), &[2, 3]);
        assert_eq!(o, vec![2, 1, 0, 5, 4, 3]);
    }

    #[test]
    fn injective_views() {
        assert!(view_injective(&View::contiguous(&[2, 3, 4]), &[2, 3, 4]));
        // A transpose and a reversal address each element once; a broadcast (stride 0) or
        // overlapping rows (stride 2 over rows of 3) do not.
        assert!(view_injective(&View { off: 0, strides: vec![1, 3] }, &[3, 2]));
        assert!(view_injective(&View { off: 5, strides: vec![-3, -1] }, &[2, 3]));
        assert!(!view_injective(&View { off: 0, strides: vec![0, 1] }, &[2, 3]));
        assert!(!view_injective(&View { off: 0, strides: vec![2, 1] }, &[2, 3]));
        // Size-1 dimensions may have any stride.
        assert!(view_injective(&View { off: 0, strides: vec![0, 1] }, &[1, 3]));
    }

    #[test]
    fn bounds() {
        assert!(view_in_bounds(&View { off: 2, strides: vec![3, -1] }, &[2, 3], 6));
        assert!(!view_in_bounds(&View { off: 1, strides: vec![3, -1] }, &[2, 3], 6));
        assert_eq!(unravel(7, &[2, 2, 2]), vec![1, 1, 1]);
    }
}
