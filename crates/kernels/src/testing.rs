//! Test support shared by the kernel tests: seeded data, storage precisions with their
//! tolerances, closeness checks and fixed-size thread pools.

use half::{bf16, f16};

/// A small deterministic generator (SplitMix64) so that proptest only has to pick seeds.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `len` values uniform in [-scale, scale).
    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform() * scale).collect()
    }
}

/// The storage types kernels are tested in: inputs are rounded to the type, the f32 result is
/// rounded to it too, and compared with a relative tolerance of that type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32 storage (no rounding).
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
}

impl Precision {
    /// All three, for tests that loop over them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::F16, Precision::Bf16];

    /// `x` as stored in this type.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Precision::F32 => x,
            Precision::F16 => f16::from_f32(x).to_f32(),
            Precision::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// Every value of `v` as stored in this type.
    pub fn round_vec(self, v: Vec<f32>) -> Vec<f32> {
        v.into_iter().map(|x| self.round(x)).collect()
    }

    /// Relative tolerance once a result is stored in this type: one unit in the last place of
    /// f16 (2^-10) and bf16 (2^-7), twice their rounding error; f32 gets `f32_rtol`.
    pub fn rtol(self, f32_rtol: f32) -> f32 {
        match self {
            Precision::F32 => f32_rtol,
            Precision::F16 => 1.0 / 1024.0 + f32_rtol,
            Precision::Bf16 => 1.0 / 128.0 + f32_rtol,
        }
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise; NaNs and infinities must match.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else if w.is_infinite() || g.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        assert!(
            ok,
            "{what}: element {i} is {g}, expected {w} (atol {atol}, rtol {rtol})"
        );
    }
}

/// Compares a kernel's f32 result with the reference once both are stored in precision `p`:
/// `|p(got) - p(want)| <= atol + p.rtol(f32_rtol) * |p(want)|`.
pub fn assert_close_in(
    p: Precision,
    what: &str,
    got: &[f32],
    want: &[f32],
    atol: f32,
    f32_rtol: f32,
) {
    let got: Vec<f32> = got.iter().map(|&x| p.round(x)).collect();
    let want: Vec<f32> = want.iter().map(|&x| p.round(x)).collect();
    assert_close(
        &format!("{what} ({p:?})"),
        &got,
        &want,
        atol,
        p.rtol(f32_rtol),
    );
}

/// Asserts two results are identical bit for bit.
pub fn assert_same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: element {i}: {x} vs {y}");
    }
}

/// Asserts two results are identical bit for bit except that any NaN matches any NaN (NaN
/// payloads and signs are not specified by Rust and differ between scalar and vector code).
pub fn assert_same_values(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let same = x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
        assert!(same, "{what}: element {i}: {x} vs {y}");
    }
}

/// Runs `run` on 1 and on 2 threads and asserts the same bits (results must not depend on
/// the pool); returns them.
pub fn on_one_and_two_threads(run: impl Fn() -> Vec<f32> + Sync) -> Vec<f32> {
    let one = in_pool(1, &run);
    assert_same_bits("threads", &one, &in_pool(2, &run));
    one
}

/// Runs `f` inside a rayon pool of exactly `threads` threads.
pub fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}
