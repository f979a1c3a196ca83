//! Elementwise ops: the op vocabulary, fast slice loops, and fused programs.

pub mod op;
pub mod slice;
