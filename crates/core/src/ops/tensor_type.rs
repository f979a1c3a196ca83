//! The static type of a tensor value: dtype plus a fully known shape.

use super::dtype::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What every value in the IR carries: its dtype and its shape (`[]` for a scalar).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<i64>,
}

impl TensorType {
    /// Builds a type from a dtype and a shape.
    pub fn new(dtype: DType, shape: impl Into<Vec<i64>>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A rank-0 tensor of `dtype`.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(dtype, Vec::new())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements; saturates at `u64::MAX` and counts a negative dim as 0, so it never
    /// panics on a malformed type (the op registry rejects those before anyone relies on it).
    pub fn numel(&self) -> u64 {
        super::shape::numel(&self.shape)
    }

    /// Number of elements when every dim is non-negative and the product fits in an `i64`
    /// (what buffers and index arithmetic need); `None` otherwise.
    pub fn checked_numel(&self) -> Option<u64> {
        let mut n: i64 = 1;
        for &d in &self.shape {
            if d < 0 {
                return None;
            }
            n = n.checked_mul(d)?;
        }
        u64::try_from(n).ok()
    }

    /// Number of elements, exact for any two `i64` dims and saturating at `u128::MAX` past
    /// that (a negative dim counts as 0): for totals and summaries, which must not wrap or stop
    /// at `u64::MAX`.
    pub fn wide_numel(&self) -> u128 {
        self.shape.iter().fold(1u128, |n, &d| {
            n.saturating_mul(u128::try_from(d).unwrap_or(0))
        })
    }

    /// Bytes of a dense buffer, as [`TensorType::wide_numel`] counts elements.
    pub fn wide_bytes(&self) -> u128 {
        self.wide_numel()
            .saturating_mul(u128::from(self.dtype.size_bytes()))
    }

    /// Bytes of a dense buffer holding this tensor (saturating, like [`TensorType::numel`]).
    pub fn bytes(&self) -> u64 {
        self.numel().saturating_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    /// Writes `f32[1,128,256]` (no spaces, so IR dumps stay compact and diffable).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_sizes() {
        let t = TensorType::new(DType::F32, [1, 128, 256]);
        assert_eq!(t.to_string(), "f32[1,128,256]");
        assert_eq!(t.rank(), 3);
        assert_eq!(t.numel(), 32768);
        assert_eq!(t.bytes(), 131072);
        let s = TensorType::scalar(DType::BF16);
        assert_eq!(s.to_string(), "bf16[]");
        assert_eq!((s.numel(), s.bytes(), s.rank()), (1, 2, 0));
    }

    #[test]
    fn sizes_never_panic() {
        let huge = TensorType::new(DType::F64, [i64::MAX, i64::MAX]);
        assert_eq!(huge.numel(), u64::MAX);
        assert_eq!(huge.bytes(), u64::MAX);
        assert_eq!(huge.checked_numel(), None);
        assert_eq!(huge.wide_numel(), (i64::MAX as u128).pow(2));
        assert_eq!(huge.wide_bytes(), u128::MAX);
        let negative = TensorType::new(DType::F32, [4, -1]);
        assert_eq!(negative.numel(), 0);
        assert_eq!(negative.checked_numel(), None);
        assert_eq!(TensorType::new(DType::I32, [0, 7]).checked_numel(), Some(0));
    }
}
