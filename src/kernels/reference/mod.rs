//! Naive, obviously-correct reference kernels for every op of docs/ops.md: the ground truth the
//! fast kernels and the executor are tested against. f32 in, f32 out (accumulating in f64),
//! contiguous row-major tensors, NumPy broadcasting.

pub mod elementwise;
pub mod linalg;

pub use elementwise::{binary, broadcast_values, cast, constant, dropout, unary, unary_scalar};
pub use linalg::{fused_matmul, matmul};
