//! Shorthands for the family tests.

use crate::ops::{infer, Attrs, DType, Op, OpError, TensorType};

/// An f32 tensor type.
pub fn f32t(shape: &[i64]) -> TensorType {
    TensorType::new(DType::F32, shape)
}

/// A tensor type of `dtype`.
pub fn t(dtype: DType, shape: &[i64]) -> TensorType {
    TensorType::new(dtype, shape)
}

/// The single output of `op`, panicking with the error message when inference fails.
pub fn ok(op: Op, attrs: Attrs, inputs: &[TensorType]) -> TensorType {
    match infer(op, &attrs, inputs) {
        Ok(mut out) => {
            assert_eq!(out.len(), 1, "{op} returned {} outputs", out.len());
            out.remove(0)
        }
        Err(e) => panic!("{op} failed: {}", e.message),
    }
}

/// The error of `op`, panicking when inference succeeds.
pub fn err(op: Op, attrs: Attrs, inputs: &[TensorType]) -> OpError {
    match infer(op, &attrs, inputs) {
        Ok(out) => panic!("{op} unexpectedly gave {out:?}"),
        Err(e) => e,
    }
}
