//! The elementwise op vocabulary shared by the reference kernels, the fused-program evaluator
//! and the matmul epilogue: the registry's own [`UnaryOp`] and [`BinaryOp`] (so a new op is a
//! compile error in the kernels' exhaustive matches, never a silent fallback), the casts, and
//! the exact f32 semantics of the ops whose result is not an approximation (arithmetic,
//! comparisons, casts).

use half::{bf16, f16};
use mslc_core::ops::scalar;
pub use mslc_core::ops::{BinaryOp, UnaryOp};
use serde::{Deserialize, Serialize};

/// A dtype an f32 value can be cast to; the result is the value that dtype holds, back in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CastTarget {
    /// Wider float: every f32 is exact.
    F64,
    /// Identity.
    F32,
    /// IEEE half, round to nearest even.
    F16,
    /// bfloat16, round to nearest even.
    Bf16,
    /// 64-bit integer: truncation toward zero, saturating; NaN becomes 0.
    I64,
    /// 32-bit integer: truncation toward zero, saturating; NaN becomes 0.
    I32,
    /// Boolean: 1 for any non-zero value (NaN included), else 0.
    Bool,
}

impl CastTarget {
    /// The value `x` takes once stored in this dtype, returned as f32.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            CastTarget::F64 | CastTarget::F32 => x,
            CastTarget::F16 => f16::from_f32(x).to_f32(),
            CastTarget::Bf16 => bf16::from_f32(x).to_f32(),
            CastTarget::I64 => (x as i64) as f32,
            CastTarget::I32 => (x as i32) as f32,
            CastTarget::Bool => {
                if x != 0.0 || x.is_nan() {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

/// `op` on one pair of f32 values, exact IEEE semantics (used by every kernel); NaN rules as
/// stated once in [`mslc_core::ops::scalar`].
#[inline(always)]
pub fn apply_binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => scalar::maximum(a, b),
        BinaryOp::Minimum => scalar::minimum(a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_round_like_the_target() {
        assert_eq!(CastTarget::F16.apply(1.0 + 1e-4), 1.0);
        assert_eq!(CastTarget::Bf16.apply(1.0 + 1e-3), 1.0);
        assert_eq!(CastTarget::I32.apply(-2.7), -2.0);
        assert_eq!(CastTarget::I64.apply(f32::NAN), 0.0);
        assert_eq!(CastTarget::Bool.apply(-0.0), 0.0);
        assert_eq!(CastTarget::Bool.apply(f32::NAN), 1.0);
    }

    #[test]
    fn max_min_propagate_nan() {
        assert!(apply_binary(BinaryOp::Maximum, f32::NAN, 1.0).is_nan());
        assert!(apply_binary(BinaryOp::Minimum, 1.0, f32::NAN).is_nan());
        assert_eq!(apply_binary(BinaryOp::Maximum, 1.0, 2.0), 2.0);
        assert_eq!(apply_binary(BinaryOp::Minimum, 1.0, 2.0), 1.0);
    }
}
