//! Elementwise ops: the op vocabulary, fast slice loops, and fused programs.

pub mod fused;
pub mod op;
pub mod program;
pub mod slice;

pub use fused::{fused_elementwise, ElementwiseParams};
pub use op::{apply_binary, BinaryOp, CastTarget, UnaryOp};
pub use program::{Instr, Program};

#[cfg(test)]
mod tests;
