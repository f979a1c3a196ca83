//! The activations a fused matmul can apply in its epilogue.

use super::elementwise::op::UnaryOp;
use super::elementwise::slice::unary_in_place;
use serde::{Deserialize, Serialize};

/// `fused_matmul`'s `activation` attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// max(x, 0)
    Relu,
    /// exact GELU
    Gelu,
    /// tanh-approximated GELU
    GeluTanh,
    /// x * sigmoid(x)
    Silu,
    /// tanh
    Tanh,
}

impl Activation {
    /// The same function as an elementwise op, or `None` for the identity.
    pub fn as_unary(self) -> Option<UnaryOp> {
        match self {
            Activation::None => None,
            Activation::Relu => Some(UnaryOp::Relu),
            Activation::Gelu => Some(UnaryOp::Gelu),
            Activation::GeluTanh => Some(UnaryOp::GeluTanh),
            Activation::Silu => Some(UnaryOp::Silu),
            Activation::Tanh => Some(UnaryOp::Tanh),
        }
    }

    /// Applies the activation to every element of `xs` (fast, vectorised path).
    pub fn apply_in_place(self, xs: &mut [f32]) {
        if let Some(op) = self.as_unary() {
            unary_in_place(op, xs);
        }
    }
}
