//! The scalar semantics of the elementwise math ops that need more than one `f64` call; the
//! op table (`registry.rs`) points each `@unary`/`@binary` row at its function here or at a
//! std one. Constant folding (the checker's and the `fold` pass) evaluates them in f64, the
//! reference kernels round their f64 result to f32, and the fast kernels approximate them.
//!
//! NaN rule, for every elementwise op (PyTorch's): a NaN operand gives a NaN result.
//! `maximum` and `minimum` propagate NaN like `torch.maximum`/`torch.minimum` (not like
//! `f64::max`, which drops it), and `relu(NaN)` is NaN. [`maximum`] and [`minimum`] are
//! generic so the kernels apply the very same rule in f32.

use super::Op;

/// The float types [`maximum`] and [`minimum`] are written for: f64 here, f32 in the kernels.
pub trait Float: Copy + PartialOrd {
    /// The quiet NaN the comparisons return.
    const NAN: Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
}

impl Float for f32 {
    const NAN: f32 = f32::NAN;
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Float for f64 {
    const NAN: f64 = f64::NAN;
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

// Both are written as NaN test, then select, which the kernels' loops vectorise.

/// The larger of `a` and `b`; NaN if either is NaN (`b` when they compare equal).
#[inline(always)]
pub fn maximum<F: Float>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        F::NAN
    } else if a > b {
        a
    } else {
        b
    }
}

/// The smaller of `a` and `b`; NaN if either is NaN (`b` when they compare equal).
#[inline(always)]
pub fn minimum<F: Float>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        F::NAN
    } else if a < b {
        a
    } else {
        b
    }
}

/// `max(x, 0)`, NaN staying NaN and `-0` staying `-0`.
pub fn relu(x: f64) -> f64 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `torch.sign`: -1, 0 or 1 by the sign of `x` (0 for both zeros), NaN staying NaN. Gradient
/// rules build their masks from it (relu's `x > 0`, the ties of `maximum` and `max`).
pub fn sign(x: f64) -> f64 {
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

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU (swish), `x * sigmoid(x)`.
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// Exact GELU, `x * Phi(x)`.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// Tanh-approximated GELU, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// A float elementwise op evaluated on f64 operands: what constant folding (in the checker
/// and the `fold` pass) computes; `None` for ops it leaves to the kernels (not elementwise
/// math, or a unary row saying `folds: false`).
pub fn eval_scalar(op: Op, a: &[f64]) -> Option<f64> {
    let x = *a.first()?;
    match (op.unary(), op.binary()) {
        (Some(u), _) => u.folds().then(|| u.eval(x)),
        (_, Some(b)) => Some(b.eval(x, *a.get(1)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_propagates_through_every_op() {
        for &u in crate::ops::UnaryOp::ALL {
            assert!(u.eval(f64::NAN).is_nan(), "{:?}", u);
        }
        for &b in crate::ops::BinaryOp::ALL {
            assert!(b.eval(f64::NAN, 1.0).is_nan(), "{:?}", b);
            assert!(b.eval(1.0, f64::NAN).is_nan() || b == crate::ops::BinaryOp::Pow);
        }
        assert_eq!(maximum(1.0, 2.0), 2.0);
        assert_eq!(minimum(1.0f32, 2.0), 1.0);
        assert_eq!(relu(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn evaluates_elementwise_ops_only() {
        assert_eq!(eval_scalar(Op::Sub, &[5.0, 2.0]), Some(3.0));
        assert_eq!(eval_scalar(Op::Silu, &[0.0]), Some(0.0));
        assert_eq!(eval_scalar(Op::Add, &[1.0]), None);
        assert_eq!(eval_scalar(Op::Erf, &[0.5]), None);
        assert_eq!(eval_scalar(Op::Matmul, &[1.0, 2.0]), None);
    }
}
