//! The elementwise op vocabulary shared by the reference kernels, the fused-program evaluator
//! and the matmul epilogue, with the exact semantics of the ops whose result is not an
//! approximation (arithmetic, comparisons, casts).

use half::{bf16, f16};
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

/// One-input elementwise ops of docs/ops.md (plus `cast`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// sqrt x
    Sqrt,
    /// 1 / sqrt x
    Rsqrt,
    /// 1 / x
    Reciprocal,
    /// |x|
    Abs,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// max(x, 0)
    Relu,
    /// exact GELU, x * Phi(x)
    Gelu,
    /// tanh-approximated GELU
    GeluTanh,
    /// x * sigmoid(x)
    Silu,
    /// the error function
    Erf,
    /// rounding to another dtype's values
    Cast(CastTarget),
}

/// Two-input elementwise ops of docs/ops.md; inputs broadcast per NumPy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// a ^ b
    Pow,
    /// the larger; NaN if either is NaN
    Maximum,
    /// the smaller; NaN if either is NaN
    Minimum,
}

impl BinaryOp {
    /// The op on one pair of values (exact IEEE semantics, used by every kernel).
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Maximum => {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else if a > b {
                    a
                } else {
                    b
                }
            }
            BinaryOp::Minimum => {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else if a < b {
                    a
                } else {
                    b
                }
            }
        }
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
        assert!(BinaryOp::Maximum.apply(f32::NAN, 1.0).is_nan());
        assert!(BinaryOp::Minimum.apply(1.0, f32::NAN).is_nan());
        assert_eq!(BinaryOp::Maximum.apply(1.0, 2.0), 2.0);
        assert_eq!(BinaryOp::Minimum.apply(1.0, 2.0), 1.0);
    }
}
