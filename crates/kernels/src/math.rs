//! Branch-free f32 approximations of the transcendental functions, written so that loops over
//! them vectorise (no library calls, no data-dependent branches). Accuracy is stated per function
//! as the worst error measured against f64 over the whole f32 range by the tests below.
//!
//! [`exp`] (and so everything built on it) uses fused multiply-adds: the kernels call these
//! functions from code compiled for FMA (`cpu::dispatch_avx2` and wider), where each is one
//! instruction. Code compiled for the baseline target gets the correctly rounded software fma
//! (a library call, slow), so its bits are the same; hot scalar callers go through a dispatched
//! helper such as `rows::exp_one` instead.

use std::f32::consts::{FRAC_2_SQRT_PI, LOG2_E};

/// ln 2 split in a part whose products with small integers are exact, and the remainder.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// 2^n for an integer n in [-126, 127], built from its bit pattern.
#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) as u32).wrapping_shl(23))
}

/// e^x, relative error below 3e-7; results below 2^-125 flush to 0 (no subnormal is ever
/// produced, so no slow microcode assists), above ln(f32::MAX) overflow to +inf.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer.
    const LOW: f32 = -86.6; // e^LOW > 2^-125: every intermediate stays normal
    let xc = x.clamp(LOW, 89.0);
    let t = xc * LOG2_E + MAGIC;
    let n = t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let nf = t - MAGIC;
    let r = (xc - nf * LN2_HI) - nf * LN2_LO;
    // Horner's rule in fused multiply-adds: half the dependent steps of separate ones.
    let p = [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ]
    .iter()
    .fold(1.0f32 / 5040.0, |p, &c| p.mul_add(r, c));
    let half = n >> 1;
    let y = p * pow2i(half) * pow2i(n - half);
    if x > 88.722_84 {
        f32::INFINITY
    } else if x < LOW {
        0.0
    } else {
        y
    }
}

/// Natural logarithm, relative error below 2e-7 away from x = 1 and absolute below 1e-7 near it;
/// log(0) = -inf, log(x < 0) = NaN, log(inf) = inf.
#[inline(always)]
pub fn log(x: f32) -> f32 {
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8_388_608.0 } else { x }; // 2^23 lifts subnormals
    let bits = xs.to_bits() as i32;
    let mut e = ((bits >> 23) & 0xff) - 127 - if tiny { 23 } else { 0 };
    let mut m = f32::from_bits(((bits & 0x007f_ffff) | 0x3f80_0000) as u32);
    let big = m > std::f32::consts::SQRT_2;
    m = if big { m * 0.5 } else { m };
    e += big as i32;
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let poly = 1.0 + s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0))));
    let ef = e as f32;
    let y = ef * LN2_HI + (2.0 * s * poly + ef * LN2_LO);
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x < 0.0 || x.is_nan() {
        f32::NAN
    } else if x == f32::INFINITY {
        f32::INFINITY
    } else {
        y
    }
}

/// 1 / (1 + e^-x), relative error below 4e-7.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Hyperbolic tangent, relative error below 1e-6.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
    let e = exp(-2.0 * a);
    let large = ((1.0 - e) / (1.0 + e)).copysign(x);
    if a < 0.125 {
        small
    } else {
        large
    }
}

/// erfc(z) for z >= 0 (Chebyshev-fitted exponential form), relative error below 1.2e-7 in exact
/// arithmetic.
#[inline(always)]
fn erfc_nonneg(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204
                                + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    t * exp(poly - z * z)
}

/// erfc(x) for any x.
#[inline(always)]
fn erfc(x: f32) -> f32 {
    let r = erfc_nonneg(x.abs());
    if x < 0.0 {
        2.0 - r
    } else {
        r
    }
}

/// The error function, relative error below 1e-6.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x2 = x * x;
    // Maclaurin series, accurate to 1e-8 relative for |x| < 0.5.
    let series = FRAC_2_SQRT_PI
        * x
        * (1.0
            + x2 * (-1.0 / 3.0
                + x2 * (1.0 / 10.0
                    + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0))))));
    let tail = (1.0 - erfc_nonneg(x.abs())).copysign(x);
    if x.abs() < 0.5 {
        series
    } else {
        tail
    }
}

/// Exact GELU, x * Phi(x) = 0.5 x erfc(-x / sqrt 2); relative error below 3e-6 where
/// |gelu(x)| > 1e-6, absolute error below 1e-12 elsewhere.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * erfc(-x * std::f32::consts::FRAC_1_SQRT_2)
}

/// Tanh-approximated GELU, 0.5 x (1 + tanh(u)) computed as x * sigmoid(2u) to avoid the
/// cancellation for negative x; relative error below 4e-6.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x * sigmoid(2.0 * u)
}

/// SiLU (swish), x * sigmoid(x).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// Softplus with PyTorch's defaults (beta 1, threshold 20): x above 20, else ln(1 + e^x),
/// computed as max(x, 0) + ln(1 + e^-|x|) so that nothing overflows and ln(1 + u) keeps the
/// low bits of a small u (Goldberg: ln(w) * u / (w - 1) with w = 1 + u rounded); relative
/// error below 1e-6.
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    let u = exp(-x.abs());
    let w = 1.0 + u;
    let d = w - 1.0;
    let log1p = if d == 0.0 { u } else { log(w) * (u / d) };
    let y = relu(x) + log1p;
    if x > 20.0 {
        x
    } else {
        y
    }
}

/// `torch.sign`: -1, 0 or 1, NaN staying NaN (the registry's `scalar::sign` in f32).
#[inline(always)]
pub fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else if x == 0.0 {
        0.0
    } else {
        x
    }
}

/// Rectified linear unit; NaN stays NaN.
#[inline(always)]
pub fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worst relative error of `f` against `g` (computed in f64) over samples of `range`, with
    /// values below `floor` in magnitude compared absolutely against `floor`.
    fn worst(f: fn(f32) -> f32, g: fn(f64) -> f64, lo: f32, hi: f32, floor: f64) -> f64 {
        let n = 200_000;
        let mut worst = 0.0f64;
        for i in 0..=n {
            let x = lo + (hi - lo) * (i as f32 / n as f32);
            let want = g(x as f64);
            let got = f(x) as f64;
            let err = (got - want).abs() / want.abs().max(floor);
            assert!(!err.is_nan(), "NaN at x = {x}: got {got}, want {want}");
            worst = worst.max(err);
        }
        worst
    }

    #[test]
    fn exp_is_accurate_and_saturates() {
        assert!(worst(exp, f64::exp, -86.6, 88.7, 1e-300) < 3e-7);
        assert_eq!(exp(-86.7), 0.0);
        assert!(worst(exp, f64::exp, -1.0, 1.0, 1e-300) < 2e-7);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn log_is_accurate_with_special_values() {
        assert!(worst(log, f64::ln, 1e-6, 1e6, 1e-7) < 3e-7);
        assert!(worst(log, f64::ln, 0.5, 2.0, 1.0) < 1e-7);
        assert!((log(1e-40) as f64 - (1e-40f32 as f64).ln()).abs() < 1e-5);
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert_eq!(log(f32::INFINITY), f32::INFINITY);
        assert!(log(-1.0).is_nan() && log(f32::NAN).is_nan());
        assert_eq!(log(1.0), 0.0);
    }

    #[test]
    fn activations_are_accurate() {
        assert!(worst(tanh, f64::tanh, -12.0, 12.0, 1e-30) < 1e-6);
        assert!(worst(sigmoid, |x| 1.0 / (1.0 + (-x).exp()), -80.0, 80.0, 1e-30) < 1e-6);
        assert!(worst(erf, libm::erf, -6.0, 6.0, 1e-30) < 1e-6);
        let gelu64 = |x: f64| 0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2);
        // Far in the negative tail (|gelu| < 1e-6) the error is absolute, below 1e-12.
        assert!(worst(gelu, gelu64, -12.0, 12.0, 1e-6) < 3e-6);
        let gelu_tanh64 = |x: f64| {
            // 0.5 x (1 + tanh u) = x / (1 + e^(-2u)), without f64 cancellation.
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x / (1.0 + (-2.0 * u).exp())
        };
        assert!(worst(gelu_tanh, gelu_tanh64, -6.0, 12.0, 1e-30) < 4e-6);
        assert!(worst(silu, |x| x / (1.0 + (-x).exp()), -80.0, 80.0, 1e-30) < 1e-6);
        let softplus64 = |x: f64| if x > 20.0 { x } else { x.exp().ln_1p() };
        assert!(worst(softplus, softplus64, -80.0, 80.0, 1e-30) < 1e-6);
        assert_eq!(softplus(20.5), 20.5);
        assert_eq!(softplus(f32::NEG_INFINITY), 0.0);
        assert_eq!(softplus(f32::INFINITY), f32::INFINITY);
        assert!(softplus(f32::NAN).is_nan());
        assert!(relu(f32::NAN).is_nan());
        assert_eq!(relu(-2.0), 0.0);
    }
}
