//! Storage-type conversion between f32 and f16 / bf16 slices: F16C instructions for f16 when
//! the CPU has them, vectorised bit manipulation for bf16. Rounding is to nearest even; NaN
//! stays NaN.

use half::{bf16, f16};
use mslc_core::ops::DType;

use super::cpu::{dispatch_avx2, has_f16c};
use super::error::{KernelError, KernelResult};

fn same_len(op: &'static str, a: usize, b: usize) -> KernelResult<()> {
    if a != b {
        return Err(KernelError::new(
            op,
            format!("source has {a} values, destination {b}"),
        ));
    }
    Ok(())
}

/// Whether values stored as `from` convert to `to` in one pass, without f32 between: the same
/// type (a byte copy), or either side f32 (a widening or a narrowing). A copy step between such
/// a pair needs no staging (`mslc_artifact::runtime::CopyStep::Convert`).
pub fn one_pass(from: DType, to: DType) -> bool {
    from == to || from == DType::F32 || to == DType::F32
}

/// Widens f16 values to f32 (exact).
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) -> KernelResult<()> {
    same_len("f16_to_f32", src.len(), dst.len())?;
    let done = if has_f16c() {
        // SAFETY: F16C and AVX2 are present; lengths are equal.
        unsafe { f16c::widen(src, dst) }
    } else {
        0
    };
    for (d, s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = s.to_f32();
    }
    Ok(())
}

/// Rounds f32 values to f16 (nearest even; overflow to ±inf).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) -> KernelResult<()> {
    same_len("f32_to_f16", src.len(), dst.len())?;
    let done = if has_f16c() {
        // SAFETY: F16C and AVX2 are present; lengths are equal.
        unsafe { f16c::narrow(src, dst) }
    } else {
        0
    };
    for (d, &s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = f16::from_f32(s);
    }
    Ok(())
}

#[inline(always)]
fn bf16_widen_body(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits((s.to_bits() as u32) << 16);
    }
}

/// f32 → bf16 bits, round to nearest even; NaNs are kept quiet.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((bits >> 16) as u16) | 0x0040;
    if x.is_nan() {
        quiet_nan
    } else {
        rounded
    }
}

#[inline(always)]
fn bf16_narrow_body(src: &[f32], dst: &mut [bf16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(bf16_bits(s));
    }
}

dispatch_avx2! {
    fn bf16_widen(src: &[bf16], dst: &mut [f32]) = bf16_widen_body;
}
dispatch_avx2! {
    fn bf16_narrow(src: &[f32], dst: &mut [bf16]) = bf16_narrow_body;
}

#[inline(always)]
fn bf16_round_body(src: &[f32], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(bf16_bits(s)) << 16);
    }
}

dispatch_avx2! {
    fn bf16_round(src: &[f32], dst: &mut [f32]) = bf16_round_body;
}

/// The value each of `src` keeps once stored as f16, as f32, into `dst` (over the common
/// length): what a fused program's f16 intermediate holds.
pub fn round_through_f16(src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    let done = if has_f16c() {
        // SAFETY: F16C and AVX2 are present; lengths are equal.
        unsafe { f16c::round_trip(src, dst) }
    } else {
        0
    };
    for (d, &s) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = f16::from_f32(s).to_f32();
    }
}

/// The value each of `src` keeps once stored as bf16, as f32, into `dst` (over the common
/// length).
pub fn round_through_bf16(src: &[f32], dst: &mut [f32]) {
    bf16_round(src, dst);
}

/// Widens bf16 values to f32 (exact).
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) -> KernelResult<()> {
    same_len("bf16_to_f32", src.len(), dst.len())?;
    bf16_widen(src, dst);
    Ok(())
}

/// Rounds f32 values to bf16 (nearest even; overflow to ±inf).
pub fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) -> KernelResult<()> {
    same_len("f32_to_bf16", src.len(), dst.len())?;
    bf16_narrow(src, dst);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod f16c {
    use half::f16;
    use std::arch::x86_64::*;

    /// Widens whole groups of 8; returns how many values were converted.
    ///
    /// # Safety
    /// F16C and AVX2 must be available and `src.len() == dst.len()`.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn widen(src: &[f16], dst: &mut [f32]) -> usize {
        let full = src.len() - src.len() % 8;
        for i in (0..full).step_by(8) {
            // SAFETY: i + 8 <= full <= len of both slices; f16 is 2 bytes, so 8 of them are
            // one unaligned 128-bit load.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        full
    }

    /// Rounds whole groups of 8 to f16 (nearest even) and widens them back; returns how many
    /// values were done.
    ///
    /// # Safety
    /// F16C and AVX2 must be available and `src.len() == dst.len()`.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn round_trip(src: &[f32], dst: &mut [f32]) -> usize {
        let full = src.len() - src.len() % 8;
        for i in (0..full).step_by(8) {
            // SAFETY: i + 8 <= full <= len of both slices.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        full
    }

    /// Narrows whole groups of 8 with round-to-nearest-even; returns how many were converted.
    ///
    /// # Safety
    /// F16C and AVX2 must be available and `src.len() == dst.len()`.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn narrow(src: &[f32], dst: &mut [f16]) -> usize {
        let full = src.len() - src.len() % 8;
        for i in (0..full).step_by(8) {
            // SAFETY: as in `widen`.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
            }
        }
        full
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod f16c {
    use half::f16;

    /// No F16C off x86: nothing converted here.
    pub unsafe fn widen(_: &[f16], _: &mut [f32]) -> usize {
        0
    }

    /// No F16C off x86: nothing converted here.
    pub unsafe fn narrow(_: &[f32], _: &mut [f16]) -> usize {
        0
    }

    /// No F16C off x86: nothing rounded here.
    pub unsafe fn round_trip(_: &[f32], _: &mut [f32]) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    fn samples() -> Vec<f32> {
        let mut v = Rng::new(3).vec(1001, 70_000.0);
        v.extend(Rng::new(4).vec(100, 1e-4));
        v.extend([
            0.0,
            -0.0,
            1.0,
            65504.0,
            65520.0,
            1e-8,
            3.4e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        // Exact ties for both formats.
        v.extend([
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
        ]);
        v
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn f16_round_trip_matches_half() {
        let x = samples();
        let mut h = vec![f16::ZERO; x.len()];
        f32_to_f16(&x, &mut h).unwrap();
        for (a, b) in h.iter().zip(&x) {
            assert!(same(a.to_f32(), f16::from_f32(*b).to_f32()), "{b}");
        }
        let mut back = vec![0.0; x.len()];
        f16_to_f32(&h, &mut back).unwrap();
        for (a, b) in back.iter().zip(&h) {
            assert!(same(*a, b.to_f32()));
        }
        assert!(f16_to_f32(&h, &mut back[1..]).is_err());
    }

    #[test]
    fn bf16_round_trip_matches_half() {
        let x = samples();
        let mut h = vec![bf16::ZERO; x.len()];
        f32_to_bf16(&x, &mut h).unwrap();
        for (a, b) in h.iter().zip(&x) {
            assert!(same(a.to_f32(), bf16::from_f32(*b).to_f32()), "{b}");
        }
        let mut back = vec![0.0; x.len()];
        bf16_to_f32(&h, &mut back).unwrap();
        for (a, b) in back.iter().zip(&h) {
            assert!(same(*a, b.to_f32()));
        }
        assert!(f32_to_bf16(&x[1..], &mut h).is_err());
    }
}
