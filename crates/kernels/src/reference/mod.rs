//! Naive, obviously-correct reference kernels for every op of docs/ops.md: the ground truth the
//! fast kernels and the executor are tested against. f32 in, f32 out (accumulating in f64),
//! contiguous row-major tensors, NumPy broadcasting.

pub mod conv;
pub mod elementwise;
pub mod fused;
pub mod layout;
pub mod linalg;
pub mod loss;
pub mod nn;
pub mod nn_grad;
pub mod norm;
pub mod optimizer;
pub mod reduce;

pub use conv::{adaptive_avg_pool2d, conv2d, pool2d};
pub use elementwise::{
    binary, broadcast_values, cast, constant, dropout, unary, unary_scalar, MaskBlock,
};
pub use fused::fused_elementwise;
pub use layout::{broadcast_to, concat, reshape, select, slice, transpose};
pub use linalg::{fused_matmul, matmul};
pub use loss::{cross_entropy, cross_entropy_grad, mse_loss, CrossEntropyAttrs};
pub use nn::{attention, causal_mask, embedding, rope, rope_cached};
pub use nn_grad::{
    adaptive_avg_pool2d_grad, attention_grad, attention_lse, conv2d_grad_input, conv2d_grad_weight,
    embedding_grad, layer_norm_grad, norm_affine_grad, pool2d_grad, rms_norm_grad,
};
pub use norm::{batch_norm, layer_norm, layer_norm_affine, rms_norm, rms_norm_scale};
pub use optimizer::{adam_update, sgd_update, AdamAttrs};
pub use reduce::{log_softmax, reduce, softmax, square_sum, square_sum_finite};

#[cfg(test)]
mod tests;
