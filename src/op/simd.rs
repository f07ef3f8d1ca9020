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
}
