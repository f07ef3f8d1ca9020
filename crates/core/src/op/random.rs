//! Reproducible random streams for operators that declare [`super::Resource::Random`].
//!
//! Owns: the per-context generator state (a key derived from the seed and the context, and a
//! counter), `MXRandomSeed` / `MXRandomSeedContext`, and [`Stream`], the counter range one
//! operator call draws from. Draw `i` of a stream is a pure function of (key, counter + i), so
//! results do not depend on how a kernel splits its loop across threads, and a seed gives the
//! same numbers on every run. The counter is reserved when the call is pushed, so the order of
//! pushes (not the order in which workers run them) decides which numbers each call gets.

use crate::context::Context;
use crate::sync::Mutex;
use std::collections::HashMap;

/// The seed every context starts from until MXRandomSeed is called.
pub const DEFAULT_SEED: u64 = 0;

struct State {
    global_seed: u64,
    per_ctx: HashMap<Context, (u64, u64)>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn key_for(seed: u64, ctx: Context) -> u64 {
    mix(mix(seed ^ 0x6a09_e667_f3bc_c909) ^ ((ctx.dev_type as u64) << 32 | ctx.dev_id as u32 as u64))
}

/// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A sequential SplitMix64 generator, for code that needs an open-ended number of draws
/// from one seed (rejection samplers, shuffles, a record's augmentations).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in [0, 1).
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in [0, 1), in float32.
    #[inline]
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
    /// Uniform integer in `[0, n]`.
    pub fn up_to(&mut self, n: u64) -> u64 {
        self.next_u64() % (n + 1)
    }
    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.up_to(i as u64) as usize);
        }
    }
}

/// `MXRandomSeed`: reseed every context.
pub fn seed_all(seed: u64) {
    *STATE.lock() = Some(State { global_seed: seed, per_ctx: HashMap::new() });
}

/// `MXRandomSeedContext`: reseed one context.
pub fn seed_ctx(seed: u64, ctx: Context) {
    let mut st = STATE.lock();
    let st = st.get_or_insert_with(|| State { global_seed: DEFAULT_SEED, per_ctx: HashMap::new() });
    st.per_ctx.insert(ctx, (key_for(seed, ctx), 0));
}

/// Reserve `draws` numbers of `ctx`'s generator.
pub fn take(ctx: Context, draws: u64) -> Stream {
    let mut st = STATE.lock();
    let st = st.get_or_insert_with(|| State { global_seed: DEFAULT_SEED, per_ctx: HashMap::new() });
    let seed = st.global_seed;
    let e = st.per_ctx.entry(ctx).or_insert_with(|| (key_for(seed, ctx), 0));
    let s = Stream { key: e.0, base: e.1 };
    e.1 = e.1.wrapping_add(draws.max(1));
    s
}

/// A reserved range of one context's random sequence.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    key: u64,
    base: u64,
}

impl Stream {
    /// A stream of its own (unit tests of samplers).
    #[cfg(test)]
    pub fn for_test(key: u64) -> Stream {
        Stream { key, base: 0 }
    }
    /// Draw `i` as 64 random bits.
    #[inline]
    pub fn bits(&self, i: u64) -> u64 {
        mix(mix(self.key.wrapping_add(self.base.wrapping_add(i).wrapping_mul(0x9e37_79b9_7f4a_7c15))) ^ self.key)
    }
    /// Draw `i` uniform in [0, 1) with 53 random bits.
    #[inline]
    pub fn uniform(&self, i: u64) -> f64 {
        (self.bits(i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Draw `i` uniform in [0, 1) with 24 random bits (single precision).
    #[inline]
    pub fn uniform_f32(&self, i: u64) -> f32 {
        (self.bits(i) >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }
    /// A standard normal value from draws `2i` and `2i+1` (Box-Muller).
    #[inline]
    pub fn normal(&self, i: u64) -> f64 {
        let u1 = 1.0 - self.uniform(2 * i); // (0, 1]
        let u2 = self.uniform(2 * i + 1);
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
    /// An integer uniform in [lo, hi) from draw `i` (`hi > lo`).
    #[inline]
    pub fn int_in(&self, i: u64, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo) as u64;
        lo + ((self.bits(i) as u128 * span as u128) >> 64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_streams_repeat_and_differ_by_context() {
        // Contexts no other test draws from (tests run concurrently).
        let c1 = Context::new(crate::context::DevType::CpuShared, 97).unwrap();
        let c2 = Context::new(crate::context::DevType::CpuShared, 98).unwrap();
        seed_ctx(42, c1);
        let a = take(c1, 10);
        let b = take(c1, 10);
        seed_ctx(42, c1);
        let a2 = take(c1, 10);
        assert_eq!(a.bits(3), a2.bits(3));
        assert_ne!(a.bits(3), b.bits(3));
        seed_ctx(42, c2);
        let g = take(c2, 10);
        assert_ne!(a2.bits(0), g.bits(0));
    }

    #[test]
    fn uniform_and_normal_moments() {
        let s = Stream { key: 7, base: 0 };
        let n = 200_000;
        let (mut m, mut v) = (0.0, 0.0);
        for i in 0..n {
            let u = s.uniform(i);
            assert!((0.0..1.0).contains(&u));
            m += u;
        }
        m /= n as f64;
        assert!((m - 0.5).abs() < 0.01, "{m}");
        let mut mn = 0.0;
        for i in 0..n {
            let x = s.normal(i);
            mn += x;
            v += x * x;
        }
        mn /= n as f64;
        v = v / n as f64 - mn * mn;
        assert!(mn.abs() < 0.01 && (v - 1.0).abs() < 0.02, "mean {mn} var {v}");
        for i in 0..1000 {
            let k = s.int_in(i, -3, 4);
            assert!((-3..4).contains(&k));
        }
    }
}
