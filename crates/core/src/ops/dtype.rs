//! Element types and the promotion table of `docs/language.md`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor; every stage agrees on this one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    Bool,
}

impl DType {
    /// Every dtype, in declaration order (for tests, completions and tables).
    pub const ALL: &'static [DType] = &[
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::Bool,
    ];

    /// The spelling used in `.msl` sources, IR dumps and artifacts (`"f32"`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Reads a dtype spelled as [`DType::name`] writes it; `None` for anything else.
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == s)
    }

    /// Bytes one element occupies in a dense buffer (`bool` takes a whole byte).
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }

    /// True for the floating-point dtypes, which transcendental ops require.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }

    /// The largest relative error of rounding a real number to this dtype, 2^-p for p
    /// significand bits (half the spacing at 1): what separates two correct results held in
    /// it. 0 for the integers and `bool`, which hold their values exactly.
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F64 => f64::EPSILON / 2.0,
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::F16 => 1.0 / 2048.0,
            DType::BF16 => 1.0 / 256.0,
            DType::I64 | DType::I32 | DType::Bool => 0.0,
        }
    }

    /// True for the integer dtypes (`bool` is not one), which index-like inputs require.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }

    /// The dtype of a binary op on tensors of dtypes `a` and `b` (the documented table):
    /// same → same; two floats → the wider, `f16` with `bf16` → `f32`; int with float → the
    /// float; `i32` with `i64` → `i64`; `bool` with anything → the other.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        match (a, b) {
            _ if a == b => a,
            (Bool, other) | (other, Bool) => other,
            (F16, BF16) | (BF16, F16) => F32,
            _ if a.is_float() && b.is_float() => {
                if a.size_bytes() >= b.size_bytes() {
                    a
                } else {
                    b
                }
            }
            _ if a.is_float() => a,
            _ if b.is_float() => b,
            // Both integers and different: i32 with i64.
            _ => I64,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::DType::{self, *};
    use proptest::prelude::*;

    #[test]
    fn names_round_trip() {
        for &d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
            assert_eq!(d.to_string(), d.name());
            assert_eq!(
                serde_json::to_string(&d).unwrap(),
                format!("\"{}\"", d.name())
            );
        }
        assert_eq!(DType::parse("float32"), None);
        assert_eq!(DType::parse("F32"), None);
    }

    #[test]
    fn unit_roundoff_is_half_the_spacing_above_one() {
        // The next value after 1 is 1 + 2u: 1 + u rounds (to even) back to 1.
        let next_f16 = half::f16::from_f32(1.0).to_bits() + 1;
        assert_eq!(
            half::f16::from_bits(next_f16).to_f64(),
            1.0 + 2.0 * F16.unit_roundoff()
        );
        let next_bf16 = half::bf16::from_f32(1.0).to_bits() + 1;
        assert_eq!(
            half::bf16::from_bits(next_bf16).to_f64(),
            1.0 + 2.0 * BF16.unit_roundoff()
        );
        assert_eq!(1.0f32 + F32.unit_roundoff() as f32, 1.0);
        assert!(1.0f32 + 2.0 * F32.unit_roundoff() as f32 > 1.0);
        assert_eq!(1.0 + F64.unit_roundoff(), 1.0);
        assert_eq!(I32.unit_roundoff(), 0.0);
    }

    #[test]
    fn sizes_and_kinds() {
        let sizes: Vec<u64> = DType::ALL.iter().map(|d| d.size_bytes()).collect();
        assert_eq!(sizes, vec![8, 4, 2, 2, 8, 4, 1]);
        assert!(BF16.is_float() && !BF16.is_int());
        assert!(I32.is_int() && !I32.is_float());
        assert!(!Bool.is_int() && !Bool.is_float());
    }

    #[test]
    fn promotion_table() {
        let cases = [
            (F32, F32, F32),
            (F16, F32, F32),
            (BF16, F64, F64),
            (F16, BF16, F32),
            (I32, F16, F16),
            (I64, BF16, BF16),
            (I32, I64, I64),
            (Bool, I32, I32),
            (Bool, F16, F16),
            (Bool, Bool, Bool),
        ];
        for (a, b, want) in cases {
            assert_eq!(DType::promote(a, b), want, "{a} with {b}");
        }
    }

    fn any_dtype() -> impl Strategy<Value = DType> {
        proptest::sample::select(DType::ALL)
    }

    proptest! {
        #[test]
        fn promotion_is_commutative_and_associative(a in any_dtype(), b in any_dtype(), c in any_dtype()) {
            prop_assert_eq!(DType::promote(a, b), DType::promote(b, a));
            prop_assert_eq!(
                DType::promote(DType::promote(a, b), c),
                DType::promote(a, DType::promote(b, c))
            );
        }

        #[test]
        fn promotion_never_narrows_a_float(a in any_dtype(), b in any_dtype()) {
            let p = DType::promote(a, b);
            if a.is_float() {
                prop_assert!(p.is_float() && p.size_bytes() >= a.size_bytes());
            }
        }
    }
}
