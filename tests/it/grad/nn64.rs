//! The f64 semantics of the nn ops (norms, embedding, rope, attention, convolution, pools)
//! for the gradient tests; `eval64` delegates every op it does not know here.

use super::tensor64::T64;
use mslc_core::ops::{Attrs, Op};

/// `op` applied to `inputs` in f64, or an error for an op this module does not implement.
pub fn eval_op(op: Op, _attrs: &Attrs, _inputs: &[&T64]) -> Result<Vec<T64>, String> {
    Err(format!("the f64 evaluator does not know `{op}`"))
}
