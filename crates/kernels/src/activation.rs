//! The activations a fused matmul can apply in its epilogue: the registry's [`Activation`]
//! (none, or a unary op whose table row allows it as an epilogue), applied with the
//! elementwise kernels.

use super::elementwise::slice::unary_in_place;
pub use mslc_core::ops::family::fused::Activation;

/// Applies `activation` to every element of `xs` (fast, vectorised path).
pub fn apply_in_place(activation: Activation, xs: &mut [f32]) {
    if let Some(op) = activation.unary() {
        unary_in_place(op, xs);
    }
}
