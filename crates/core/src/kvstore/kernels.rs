//! The store's kernels on host slices: the two summation orders of stock's communicators,
//! the copy with dtype conversion that a pull into an array of another dtype makes, and
//! 2-bit gradient compression (quantisation with error feedback, and its inverse).
//!
//! Everything here is plain slice arithmetic, tested below; the store pushes it to the
//! engine.

use crate::op::tensor::Elem;

/// Element addition in the element type's own arithmetic: floats as IEEE (float16 through
/// float32 and rounded back after each addition, as mshadow's `half_t` does), integers
/// wrapping (C++'s integer promotion truncated back to the type).
pub trait Add: Elem {
    fn add(self, other: Self) -> Self;
}

macro_rules! add_float {
    ($($t:ty),*) => {$(
        impl Add for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self { self + other }
        }
    )*};
}
add_float!(f32, f64);

macro_rules! add_int {
    ($($t:ty),*) => {$(
        impl Add for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
        }
    )*};
}
add_int!(u8, i8, i32, i64);

impl Add for half::f16 {
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        half::f16::from_f32(self.to_f32() + other.to_f32())
    }
}

/// The order in which a reduction adds its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `local`'s CPU communicator: `dst += ((s1 + s2) + s3) + s4`, four sources at a time.
    Grouped,
    /// `device`'s communicator (stock's `ElementwiseSum`): `((dst + s1) + s2) + ...`.
    Fold,
}

/// `dst` (holding the first source) += the other `srcs`, in `order`, over elements
/// `offset..offset + dst.len()` of each source.
fn sum_range<T: Add>(dst: &mut [T], srcs: &[&[T]], offset: usize, order: Order) {
    let n = dst.len();
    let s = |k: usize| &srcs[k][offset..offset + n];
    match order {
        Order::Fold => {
            for k in 0..srcs.len() {
                for (d, &v) in dst.iter_mut().zip(s(k)) {
                    *d = d.add(v);
                }
            }
        }
        Order::Grouped => {
            for group in (0..srcs.len()).step_by(4) {
                let end = (group + 4).min(srcs.len());
                match end - group {
                    1 => {
                        for (d, &a) in dst.iter_mut().zip(s(group)) {
                            *d = d.add(a);
                        }
                    }
                    2 => {
                        for ((d, &a), &b) in dst.iter_mut().zip(s(group)).zip(s(group + 1)) {
                            *d = d.add(a.add(b));
                        }
                    }
                    3 => {
                        let (a, b, c) = (s(group), s(group + 1), s(group + 2));
                        for (i, d) in dst.iter_mut().enumerate() {
                            *d = d.add(a[i].add(b[i]).add(c[i]));
                        }
                    }
                    _ => {
                        let (a, b, c, e) = (s(group), s(group + 1), s(group + 2), s(group + 3));
                        for (i, d) in dst.iter_mut().enumerate() {
                            *d = d.add(a[i].add(b[i]).add(c[i]).add(e[i]));
                        }
                    }
                }
            }
        }
    }
}

/// `dst` += every one of `srcs` (each as long as `dst`) in `order`, on `threads` threads
/// (contiguous parts of the elements; the order of additions per element is the same
/// whatever the split).
pub fn sum_into<T: Add>(dst: &mut [T], srcs: &[&[T]], order: Order, threads: usize) {
    assert!(srcs.iter().all(|s| s.len() == dst.len()), "reduction over arrays of different sizes");
    let threads = threads.clamp(1, dst.len().max(1));
    if threads == 1 {
        sum_range(dst, srcs, 0, order);
        return;
    }
    let part = dst.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (k, chunk) in dst.chunks_mut(part).enumerate() {
            scope.spawn(move || sum_range(chunk, srcs, k * part, order));
        }
    });
}

/// `dst[i] = src[i]` converted to `dst`'s type (through f64, as a static cast would for
/// every value the types share).
pub fn cast_copy<S: Elem, D: Elem>(src: &[S], dst: &mut [D]) {
    assert_eq!(src.len(), dst.len(), "copy between arrays of different sizes");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = D::from_f64(s.to_f64());
    }
}

/// Words (of 32 bits) that `n` values take in 2-bit form: 16 values per word.
pub fn two_bit_words(n: usize) -> usize {
    n.div_ceil(16)
}

/// The 2-bit code of value `i` in its word: bits (from the word's first byte, highest bits
/// first) `11` for +threshold, `10` for -threshold, `00` for zero, as stock lays them out.
const POS: [u8; 4] = [0xc0, 0x30, 0x0c, 0x03];
const NEG: [u8; 4] = [0x80, 0x20, 0x08, 0x02];

/// Quantise `grad` into `out` (2 bits a value) with error feedback: `residual += grad`; where
/// the residual reaches `threshold` the value sent is `threshold` and the residual drops by
/// it (likewise for `-threshold`); elsewhere 0 is sent and the residual keeps the value.
pub fn quantize_2bit(grad: &[f32], residual: &mut [f32], out: &mut [u8], threshold: f32) {
    assert_eq!(grad.len(), residual.len());
    assert_eq!(out.len(), two_bit_words(grad.len()) * 4);
    out.fill(0);
    for (i, (r, &g)) in residual.iter_mut().zip(grad).enumerate() {
        *r += g;
        let byte = &mut out[i / 4];
        if *r >= threshold {
            *byte |= POS[i & 3];
            *r -= threshold;
        } else if *r <= -threshold {
            *byte |= NEG[i & 3];
            *r += threshold;
        }
    }
}

/// The values [`quantize_2bit`] sent: ±`threshold` or 0.
pub fn dequantize_2bit(data: &[u8], out: &mut [f32], threshold: f32) {
    assert_eq!(data.len(), two_bit_words(out.len()) * 4);
    for (i, o) in out.iter_mut().enumerate() {
        let bits = data[i / 4] & POS[i & 3];
        *o = if bits == POS[i & 3] {
            threshold
        } else if bits == NEG[i & 3] {
            -threshold
        } else {
            0.0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_order_adds_four_sources_before_the_first() {
        // Float32 values 8 apart near 1e8: 1e8 + (3 + 3 + 3 + 3) rounds to 1e8 + 16, while
        // (((1e8 + 3) + 3) + 3) + 3 stays 1e8.
        let threes = [3.0f32; 3];
        let srcs: Vec<&[f32]> = vec![&threes; 4];
        let mut grouped = [1e8f32; 3];
        sum_into(&mut grouped, &srcs, Order::Grouped, 1);
        assert_eq!(grouped, [100_000_016.0; 3]);
        let mut folded = [1e8f32; 3];
        sum_into(&mut folded, &srcs, Order::Fold, 1);
        assert_eq!(folded, [1e8; 3]);
    }

    #[test]
    fn grouped_order_restarts_after_four() {
        // Six sources: dst + (((a + b) + c) + d), then + (e + f).
        let v: Vec<Vec<f64>> = (1..=6).map(|k| vec![k as f64 * 0.1; 5]).collect();
        let srcs: Vec<&[f64]> = v.iter().map(|x| x.as_slice()).collect();
        let mut dst = vec![0.7f64; 5];
        sum_into(&mut dst, &srcs, Order::Grouped, 1);
        let x = |k: usize| v[k][0];
        let want = (0.7 + (((x(0) + x(1)) + x(2)) + x(3))) + (x(4) + x(5));
        assert!(dst.iter().all(|&x| x == want), "{dst:?} != {want}");
    }

    #[test]
    fn threads_split_without_changing_results() {
        let a: Vec<f32> = (0..10_001).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..10_001).map(|i| (i as f32).cos() * 3.0).collect();
        let srcs: Vec<&[f32]> = vec![&a, &b, &a];
        let mut one = vec![0.5f32; a.len()];
        let mut four = one.clone();
        sum_into(&mut one, &srcs, Order::Grouped, 1);
        sum_into(&mut four, &srcs, Order::Grouped, 4);
        assert_eq!(one, four);
        assert_eq!(one[7], 0.5 + ((a[7] + b[7]) + a[7]));
    }

    #[test]
    fn integers_wrap_and_half_rounds_each_addition() {
        let mut d = [250u8];
        sum_into(&mut d, &[&[10u8][..]], Order::Fold, 1);
        assert_eq!(d, [4]);
        // 2048 + 1 is not a float16 value (it rounds to 2048), so adding 1 twice keeps 2048.
        let one = [half::f16::from_f32(1.0)];
        let mut h = [half::f16::from_f32(2048.0)];
        sum_into(&mut h, &[&one[..], &one[..]], Order::Fold, 1);
        assert_eq!(h[0].to_f32(), 2048.0);
    }

    #[test]
    fn two_bit_round_trip_with_error_feedback() {
        let grad = [0.3f32, -0.6, 0.6, 0.0, -0.2, 1.4, 0.5, -0.5, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.9];
        let mut residual = vec![0.0f32; grad.len()];
        let mut packed = vec![0u8; two_bit_words(grad.len()) * 4];
        assert_eq!(packed.len(), 8);
        quantize_2bit(&grad, &mut residual, &mut packed, 0.5);
        let mut sent = vec![0.0f32; grad.len()];
        dequantize_2bit(&packed, &mut sent, 0.5);
        assert_eq!(&sent[..8], &[0.0, -0.5, 0.5, 0.0, 0.0, 0.5, 0.5, -0.5]);
        assert_eq!(sent[16], 0.5);
        // What was not sent stays in the residual: sent + residual = grad.
        for i in 0..grad.len() {
            assert!((sent[i] + residual[i] - grad[i]).abs() < 1e-7, "{i}");
        }
        // The first value's layout: 0.6 at index 2 of word 0 sets bits 0x0c of byte 0.
        assert_eq!(packed[0] & 0x0c, 0x0c);
        assert_eq!(packed[0] & 0x30, 0x20);
        // The residual carries over: 0.3 more at index 0 crosses the threshold next time.
        quantize_2bit(&grad, &mut residual, &mut packed, 0.5);
        dequantize_2bit(&packed, &mut sent, 0.5);
        assert_eq!(sent[0], 0.5);
        assert!((residual[0] - 0.1).abs() < 1e-6);
    }

    #[test]
    fn cast_copy_converts() {
        let mut d = [0i32; 3];
        cast_copy(&[1.9f32, -2.5, 7.0], &mut d);
        assert_eq!(d, [1, -2, 7]);
    }
}
