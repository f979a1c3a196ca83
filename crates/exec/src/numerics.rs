//! `--check-numerics`: after every step, whether its result holds a NaN or an infinity, and, at
//! the first that does, what a user needs to find the cause — the op and where it was written,
//! its operands' ranges, and, for a result computed in f16/bf16, whether the same op in f32
//! stays finite (an overflow of the low-precision type, not of the math).

use std::fmt;

use mslc_artifact::SourceLoc;
use mslc_core::ops::{DType, Op, TensorType};

use crate::storage::load_f32;

/// Elements decoded at a time while scanning a stored value, so a check allocates nothing.
const CHUNK: usize = 1024;

/// The range of one operand of the faulting step.
#[derive(Clone, Debug, PartialEq)]
pub struct OperandRange {
    /// Its type.
    pub ty: TensorType,
    /// Smallest finite element (`None` when no element is finite).
    pub min: Option<f32>,
    /// Largest finite element.
    pub max: Option<f32>,
    /// Largest finite magnitude.
    pub abs_max: Option<f32>,
    /// How many elements are NaN or infinite.
    pub nonfinite: usize,
}

impl OperandRange {
    /// Scans `bytes`, elements of `ty`.
    pub(crate) fn of(ty: &TensorType, bytes: &[u8]) -> OperandRange {
        let mut range = OperandRange {
            ty: ty.clone(),
            min: None,
            max: None,
            abs_max: None,
            nonfinite: 0,
        };
        scan(ty.dtype, bytes, |x| {
            if x.is_finite() {
                range.min = Some(range.min.map_or(x, |m| m.min(x)));
                range.max = Some(range.max.map_or(x, |m| m.max(x)));
                range.abs_max = Some(range.abs_max.map_or(x.abs(), |m| m.max(x.abs())));
            } else {
                range.nonfinite += 1;
            }
        });
        range
    }
}

/// The f32 result of a step that computes in a low-precision type: the kernel's result before
/// it was rounded to the stored type, or a fused program's result computed without its
/// roundings to f16/bf16.
#[derive(Clone, Debug, PartialEq)]
pub struct F32Result {
    /// How many of its elements are NaN or infinite.
    pub nonfinite: usize,
    /// Its largest finite magnitude.
    pub abs_max: Option<f32>,
}

/// The first step whose result is not finite.
#[derive(Clone, Debug, PartialEq)]
pub struct NumericsFault {
    /// Its index in the module's schedule.
    pub step: usize,
    /// Its op.
    pub op: Op,
    /// The instance path it came from (`model.layers.3.mlp.down_proj`).
    pub origin: String,
    /// Where its op was written, when a source line wrote it.
    pub loc: Option<SourceLoc>,
    /// The result's range (its non-finite count is at least 1).
    pub result: OperandRange,
    /// Index of the first non-finite element, row-major.
    pub first_index: usize,
    /// Each operand's range, in argument order.
    pub inputs: Vec<OperandRange>,
    /// For a result stored in f16/bf16, or a fused program rounding to them on the way: the
    /// result computed in f32.
    pub in_f32: Option<F32Result>,
}

impl NumericsFault {
    /// Checks a step's stored result (`bytes`, of type `ty`); `None` when every element is
    /// finite or the result is not a float.
    pub(crate) fn first_nonfinite(ty: &TensorType, bytes: &[u8]) -> Option<usize> {
        if !ty.dtype.is_float() {
            return None;
        }
        let mut index = 0;
        let mut found = None;
        scan(ty.dtype, bytes, |x| {
            if found.is_none() && !x.is_finite() {
                found = Some(index);
            }
            index += 1;
        });
        found
    }

    /// Whether the math overflowed only in the low-precision type: the f32 result was finite.
    pub fn overflowed_only_in_storage(&self) -> bool {
        self.in_f32.as_ref().is_some_and(|r| r.nonfinite == 0)
    }
}

impl F32Result {
    /// Scans the kernel's f32 result.
    pub(crate) fn of(values: &[f32]) -> F32Result {
        let mut result = F32Result {
            nonfinite: 0,
            abs_max: None,
        };
        for &x in values {
            if x.is_finite() {
                result.abs_max = Some(result.abs_max.map_or(x.abs(), |m| m.max(x.abs())));
            } else {
                result.nonfinite += 1;
            }
        }
        result
    }
}

/// Calls `f` on every element of `bytes` (elements of `dtype`) as f32, decoding a chunk at a time.
fn scan(dtype: DType, bytes: &[u8], mut f: impl FnMut(f32)) {
    let size = (dtype.size_bytes() as usize).max(1);
    let mut buf = [0f32; CHUNK];
    for chunk in bytes.chunks(CHUNK * size) {
        let n = chunk.len() / size;
        load_f32(dtype, chunk, &mut buf[..n]);
        buf[..n].iter().copied().for_each(&mut f);
    }
}

impl fmt::Display for OperandRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.min, self.max, self.abs_max) {
            (Some(min), Some(max), Some(abs)) => {
                write!(f, "{}: min {min:e}, max {max:e}, abs max {abs:e}", self.ty)?
            }
            _ => write!(f, "{}: no finite element", self.ty)?,
        }
        if self.nonfinite > 0 {
            write!(f, ", {} non-finite", self.nonfinite)?;
        }
        Ok(())
    }
}

impl fmt::Display for NumericsFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = if self.origin.is_empty() {
            String::new()
        } else {
            format!(" in `{}`", self.origin)
        };
        write!(
            f,
            "step {} (`{}`{place}) produced a non-finite value: {} of its {} elements, the first at index {}",
            self.step,
            self.op,
            self.result.nonfinite,
            self.result.ty.numel(),
            self.first_index
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn f16_bytes(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect()
    }

    #[test]
    fn finds_the_first_nonfinite_element_across_chunks() {
        let mut values = vec![1.0f32; 3 * CHUNK];
        values[2 * CHUNK + 5] = f32::INFINITY;
        values[2 * CHUNK + 9] = f32::NAN;
        let ty = TensorType::new(DType::F16, vec![3 * CHUNK as i64]);
        let bytes = f16_bytes(&values);
        assert_eq!(
            NumericsFault::first_nonfinite(&ty, &bytes),
            Some(2 * CHUNK + 5)
        );
        let range = OperandRange::of(&ty, &bytes);
        assert_eq!(
            (range.min, range.max, range.nonfinite),
            (Some(1.0), Some(1.0), 2)
        );
        let ints = TensorType::new(DType::I32, vec![2]);
        assert_eq!(NumericsFault::first_nonfinite(&ints, &[0; 8]), None);
    }

    #[test]
    fn ranges_ignore_nonfinite_elements() {
        let values = [-3.0f32, 2.5, f32::NEG_INFINITY, 0.5];
        let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        let range = OperandRange::of(&TensorType::new(DType::F32, vec![4]), &bytes);
        assert_eq!(range.min, Some(-3.0));
        assert_eq!(range.max, Some(2.5));
        assert_eq!(range.abs_max, Some(3.0));
        assert_eq!(range.nonfinite, 1);
        let f32_result = F32Result::of(&[70000.0, -1.0]);
        assert_eq!(
            (f32_result.nonfinite, f32_result.abs_max),
            (0, Some(70000.0))
        );
    }
}
