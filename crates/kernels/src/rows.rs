//! Vectorised whole-row helpers (max, sums, exp) for the row-wise kernels. Sums use 32 fixed
//! lanes (four independent vector chains) combined in a fixed order, so results depend only on
//! the row, never on threads.

use super::cpu::{dispatch_avx2, dispatch_avx512};
use super::math;

/// The partial sums of one row: element `j` of a row is added into lane `j % LANES`.
pub(crate) const LANES: usize = 32;

/// Combines the lanes pairwise in a fixed tree order.
#[inline(always)]
fn tree(mut acc: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    tree_blocks(&mut acc, 1, op);
    acc[0]
}

/// [`tree`]'s combination of many rows at once, lane by lane in the same order: `partials`
/// holds [`LANES`] blocks of `width` values, block `l` being lane `l` of `width` rows; the rows'
/// results are left in the first block.
#[inline(always)]
fn tree_blocks(partials: &mut [f32], width: usize, op: impl Fn(f32, f32) -> f32) {
    let mut lanes = LANES;
    while lanes > 1 {
        lanes /= 2;
        let (low, high) = partials.split_at_mut(lanes * width);
        for (a, &b) in low.iter_mut().zip(&high[..lanes * width]) {
            *a = op(*a, b);
        }
    }
}

/// The sums of many rows' lanes ([`tree_blocks`]), as [`lane_sum`] combines one row's.
#[inline(always)]
pub(crate) fn tree_sums(partials: &mut [f32], width: usize) {
    tree_blocks(partials, width, |a, b| a + b);
}

/// Σ f(x) over `xs` in interleaved partial sums, then a fixed pairwise combination.
#[inline(always)]
fn lane_sum(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f(x);
    }
    tree(acc, |a, b| a + b)
}

#[inline(always)]
fn sum_body(xs: &[f32]) -> f32 {
    lane_sum(xs, |x| x)
}

#[inline(always)]
fn sum_sq_dev_body(xs: &[f32], mean: f32) -> f32 {
    lane_sum(xs, |x| (x - mean) * (x - mean))
}

#[inline(always)]
fn sum_times_zero_body(xs: &[f32]) -> f32 {
    lane_sum(xs, |x| x * 0.0)
}

#[inline(always)]
fn sum_dev_body(xs: &[f32], shift: f32) -> f32 {
    lane_sum(xs, |x| x - shift)
}

/// Keeps the larger of `acc` and `x`; a NaN, once seen, sticks.
#[inline(always)]
pub fn max_step(acc: f32, x: f32) -> f32 {
    if x > acc || x.is_nan() {
        x
    } else {
        acc
    }
}

#[inline(always)]
fn max_body(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = max_step(*a, x);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = max_step(*a, x);
    }
    tree(acc, max_step)
}

#[inline(always)]
fn exp_sum_body(xs: &mut [f32], scale: f32, shift: f32) -> f32 {
    for x in xs.iter_mut() {
        *x = math::exp(*x * scale - shift);
    }
    lane_sum(xs, |x| x)
}

#[inline(always)]
fn exp_one_body(x: f32) -> f32 {
    math::exp(x)
}

#[inline(always)]
fn scale_body(xs: &mut [f32], s: f32) {
    for x in xs {
        *x *= s;
    }
}

#[inline(always)]
fn shift_scale_body(xs: &mut [f32], shift: f32, s: f32) {
    for x in xs {
        *x = (*x - shift) * s;
    }
}

dispatch_avx2! {
    /// Σ xs (0 for an empty row).
    pub fn sum(xs: &[f32]) -> f32 = sum_body;
}
dispatch_avx2! {
    /// Σ (x - mean)².
    pub fn sum_sq_dev(xs: &[f32], mean: f32) -> f32 = sum_sq_dev_body;
}
dispatch_avx2! {
    /// Σ x·0: 0 where every value is finite, NaN where any is infinite or NaN (the loss
    /// scaling's overflow check).
    pub fn sum_times_zero(xs: &[f32]) -> f32 = sum_times_zero_body;
}
dispatch_avx2! {
    /// Σ (x - shift): with `shift` near the values, each difference is exact, so this recovers
    /// what an f32 mean could not hold.
    pub fn sum_dev(xs: &[f32], shift: f32) -> f32 = sum_dev_body;
}
dispatch_avx2! {
    /// The largest value (-inf for an empty row, NaN if any value is NaN).
    pub fn max(xs: &[f32]) -> f32 = max_body;
}
dispatch_avx512! {
    /// Replaces each x by e^(x·scale − shift) and returns their sum.
    pub fn exp_sum(xs: &mut [f32], scale: f32, shift: f32) -> f32 = exp_sum_body;
}
dispatch_avx2! {
    /// e^x of one value, compiled with fused multiply-adds like the vector paths, for scalar
    /// callers in code built for the baseline target (one call, not a software fma per step).
    pub fn exp_one(x: f32) -> f32 = exp_one_body;
}
dispatch_avx2! {
    /// Multiplies every value by `s`.
    pub fn scale(xs: &mut [f32], s: f32) = scale_body;
}
dispatch_avx2! {
    /// Replaces each x by (x − shift)·s.
    pub fn shift_scale(xs: &mut [f32], shift: f32, s: f32) = shift_scale_body;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_helpers_match_plain_loops() {
        let xs: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let plain: f32 = xs.iter().sum();
        assert!((sum(&xs) - plain).abs() < 1e-5);
        assert_eq!(max(&xs), xs.iter().copied().fold(f32::MIN, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        assert!(max(&[1.0, f32::NAN]).is_nan());
        let mean = plain / 37.0;
        let dev: f32 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
        assert!((sum_sq_dev(&xs, mean) - dev).abs() < 1e-5);
        let shifted: f32 = xs.iter().map(|x| x - 0.25).sum();
        assert!((sum_dev(&xs, 0.25) - shifted).abs() < 1e-5);
        let mut e = xs.clone();
        let s = exp_sum(&mut e, 2.0, 1.0);
        for (a, b) in e.iter().zip(&xs) {
            assert!((a - (2.0 * b - 1.0).exp()).abs() < 1e-6);
        }
        assert!((s - e.iter().sum::<f32>()).abs() < 1e-5);
    }

    /// The widest path this CPU runs (16 lanes with AVX-512) gives the bits of the body built
    /// for the baseline target (software fma): the exponentials, their lane sum, and the scalar
    /// `exp_one` attention uses.
    #[test]
    fn exp_paths_give_the_baseline_bits() {
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.61).sin() * 40.0).collect();
        let (mut wide, mut baseline) = (xs.clone(), xs.clone());
        let sum = exp_sum(&mut wide, 0.75, 3.0);
        let baseline_sum = exp_sum_body(&mut baseline, 0.75, 3.0);
        assert_eq!(sum.to_bits(), baseline_sum.to_bits());
        for (i, (w, b)) in wide.iter().zip(&baseline).enumerate() {
            assert_eq!(w.to_bits(), b.to_bits(), "element {i}: {w} vs {b}");
        }
        for &x in &xs {
            assert_eq!(exp_one(x).to_bits(), exp_one_body(x).to_bits(), "e^{x}");
        }
    }
}
