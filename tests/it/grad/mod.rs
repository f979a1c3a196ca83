//! Gradients: every rule against central finite differences in float64 (an f64 interpreter of
//! the graph, `eval64`, evaluates both the forward and the backward ops), ties and kinks
//! against PyTorch's documented choices, the errors of `backward`, and backward graphs through
//! the passes and the f32 executor.

pub mod eval64;
pub mod fd;
pub mod nn64;
pub mod tensor64;

mod autodiff;
mod pipeline;
mod rules;
