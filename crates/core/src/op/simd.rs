//! Explicitly vectorised inner loops, chosen at run time by the CPU's features.
//!
//! Owns: kernels whose portable form LLVM vectorises poorly for the baseline target (SSE2),
//! each with an AVX2 body selected once per call by `is_x86_feature_detected!` (a cached
//! load) and a portable fallback that gives the same result up to float rounding order.
//! The library is built for the baseline x86-64 target so that it loads on every machine;
//! these are the places where a wider instruction set is worth a branch.

/// Elements summed per block before the block's total joins the running total: the same
/// blocking as the portable reductions (`ops::reduce`), which keeps float32 sums accurate.
const BLOCK: usize = 4096;

/// The sum of `x`, in float32, in blocks of [`BLOCK`] with independent lanes within a block.
pub(crate) fn sum_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above), all the function requires.
            return unsafe { sum_f32_avx2(x) };
        }
    }
    sum_f32_portable(x)
}

fn sum_f32_portable(x: &[f32]) -> f32 {
    let mut total = 0f32;
    for block in x.chunks(BLOCK) {
        let mut acc = [0f32; 16];
        let mut chunks = block.chunks_exact(16);
        for c in &mut chunks {
            for i in 0..16 {
                acc[i] += c[i];
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for &v in chunks.remainder() {
            s += v;
        }
        total += s;
    }
    total
}

/// AVX2: four 8-lane accumulators per block, and software prefetch 8 KiB ahead (two
/// threads streaming from memory gain ~10% from it on the machines measured).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_f32_avx2(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    const AHEAD: usize = 2048;
    let mut total = 0f32;
    for block in x.chunks(BLOCK) {
        let n = block.len() / 32 * 32;
        let p = block.as_ptr();
        let mut a0 = _mm256_setzero_ps();
        let (mut a1, mut a2, mut a3) = (a0, a0, a0);
        let mut i = 0;
        while i < n {
            // SAFETY: i + 32 <= n <= block.len(): the four loads are inside the block.
            // Prefetching never faults; `wrapping_add` keeps the address computation defined
            // when it points past the slice.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + AHEAD) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + AHEAD + 16) as *const i8);
                a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p.add(i)));
                a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p.add(i + 8)));
                a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p.add(i + 16)));
                a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p.add(i + 24)));
            }
            i += 32;
        }
        let s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        let hi = _mm256_extractf128_ps::<1>(s);
        let q = _mm_add_ps(_mm256_castps256_ps128(s), hi);
        let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let mut bs = _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps::<1>(d, d)));
        for &v in &block[n..] {
            bs += v;
        }
        total += bs;
    }
    total
}

/// A float32 binary operation the streaming kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// Output sizes (elements) from which [`stream_bin_f32`] pays: below this the output is
/// likely to be read again from cache by the next operation, and writing it around the
/// cache would cost more than the read-for-ownership it saves. 4M floats = 16 MiB, half the
/// last-level cache of the machines measured.
pub(crate) const STREAM_MIN: usize = 1 << 22;

/// Whether [`stream_bin_f32`] runs here (the CPU has AVX2).
pub(crate) fn stream_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `o[i] = a[i] op b[i]` with non-temporal stores, for outputs far larger than the cache.
/// A plain store first reads each output line into the cache (a fourth stream of memory
/// traffic beside the two loads and the write-back); a streaming store writes whole lines
/// without reading them, so an add that is bound by memory moves 3/4 of the bytes.
/// Returns false (nothing written) where the CPU lacks AVX2; the caller then runs its
/// portable loop. Ends with a store fence, so the results are visible to whichever thread
/// learns of the completion through the engine's (or rayon's) synchronisation.
pub(crate) fn stream_bin_f32(op: StreamOp, a: &[f32], b: &[f32], o: &mut [f32]) -> bool {
    assert!(a.len() == o.len() && b.len() == o.len(), "stream_bin_f32: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above); the lengths are equal (asserted).
            unsafe {
                match op {
                    StreamOp::Add => stream_bin_avx2::<0>(a, b, o),
                    StreamOp::Sub => stream_bin_avx2::<1>(a, b, o),
                    StreamOp::Mul => stream_bin_avx2::<2>(a, b, o),
                    StreamOp::Div => stream_bin_avx2::<3>(a, b, o),
                }
            }
            return true;
        }
    }
    let _ = op;
    false
}

/// The AVX2 body of [`stream_bin_f32`]; `OP` is the [`StreamOp`] index (a constant, so each
/// instance has one arithmetic instruction in its loop).
///
/// # Safety
/// The CPU must support AVX2 and the three slices must have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_bin_avx2<const OP: u8>(a: &[f32], b: &[f32], o: &mut [f32]) {
    use std::arch::x86_64::*;
    const AHEAD: usize = 1024;
    #[inline(always)]
    fn scalar<const OP: u8>(x: f32, y: f32) -> f32 {
        match OP {
            0 => x + y,
            1 => x - y,
            2 => x * y,
            _ => x / y,
        }
    }
    let n = o.len();
    // Plain stores up to the first 32-byte aligned output element (streaming stores need it).
    let mis = (o.as_ptr() as usize) & 31;
    let head = if mis == 0 { 0 } else { ((32 - mis) / 4).min(n) };
    for i in 0..head {
        o[i] = scalar::<OP>(a[i], b[i]);
    }
    let body_end = head + (n - head) / 32 * 32;
    let (pa, pb, po) = (a.as_ptr(), b.as_ptr(), o.as_mut_ptr());
    let mut i = head;
    while i < body_end {
        // SAFETY: i + 32 <= body_end <= n, the length of all three slices; po + i is 32-byte
        // aligned (head above, then steps of 32 floats). Prefetches never fault and use
        // wrapping arithmetic past the end.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(i + AHEAD) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(i + AHEAD + 16) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(pb.wrapping_add(i + AHEAD) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(pb.wrapping_add(i + AHEAD + 16) as *const i8);
            for k in [0usize, 8, 16, 24] {
                let x = _mm256_loadu_ps(pa.add(i + k));
                let y = _mm256_loadu_ps(pb.add(i + k));
                let r = match OP {
                    0 => _mm256_add_ps(x, y),
                    1 => _mm256_sub_ps(x, y),
                    2 => _mm256_mul_ps(x, y),
                    _ => _mm256_div_ps(x, y),
                };
                _mm256_stream_ps(po.add(i + k), r);
            }
        }
        i += 32;
    }
    for i in body_end..n {
        o[i] = scalar::<OP>(a[i], b[i]);
    }
    // Streaming stores are weakly ordered: fence them before the caller signals completion.
    _mm_sfence();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both bodies agree with a float64 reference on lengths around the block and vector
    /// boundaries (including empty and shorter than one vector).
    #[test]
    fn sum_matches_reference() {
        for n in [0usize, 1, 7, 31, 32, 33, 100, 4095, 4096, 4097, 10_000, 123_457] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25).collect();
            let want: f64 = x.iter().map(|&v| v as f64).sum();
            let tol = 1e-5 * x.iter().map(|v| v.abs() as f64).sum::<f64>().max(1.0);
            let got = sum_f32(&x) as f64;
            assert!((got - want).abs() <= tol, "n={n}: {got} vs {want}");
            let port = sum_f32_portable(&x) as f64;
            assert!((port - want).abs() <= tol, "portable n={n}: {port} vs {want}");
        }
    }

    /// A sum of many equal values stays accurate (blocking bounds the float32 error).
    #[test]
    fn long_sums_stay_accurate() {
        let x = vec![0.1f32; 1 << 22];
        let got = sum_f32(&x) as f64;
        let want = 0.1f32 as f64 * (1 << 22) as f64;
        assert!((got - want).abs() / want < 1e-5, "{got} vs {want}");
    }

    /// The streaming kernel agrees exactly with the scalar operation (one rounding each) at
    /// every alignment of the output and around the vector length.
    #[test]
    fn streaming_binary_matches_scalar() {
        let n = 1000;
        let a: Vec<f32> = (0..n + 8).map(|i| (i as f32) * 0.37 - 50.0).collect();
        let b: Vec<f32> = (0..n + 8).map(|i| ((i * 13 % 29) as f32) + 0.5).collect();
        let mut out = vec![0f32; n + 8];
        for (op, f) in [
            (StreamOp::Add, (|x, y| x + y) as fn(f32, f32) -> f32),
            (StreamOp::Sub, |x, y| x - y),
            (StreamOp::Mul, |x, y| x * y),
            (StreamOp::Div, |x, y| x / y),
        ] {
            for off in 0..8 {
                for len in [0usize, 1, 7, 31, 32, 33, 95, n - off] {
                    let (xa, xb) = (&a[off..off + len], &b[3..3 + len]);
                    let o = &mut out[off..off + len];
                    if !stream_bin_f32(op, xa, xb, o) {
                        return; // no AVX2 here: the callers keep their portable loops
                    }
                    for i in 0..len {
                        assert_eq!(o[i], f(xa[i], xb[i]), "{op:?} off={off} len={len} i={i}");
                    }
                }
            }
        }
    }
}
