//! Registry entries, grouped by the rules they share. Each module exports `OpSpec` values
//! (or `const fn`s building them) that `registry.rs` names, plus whatever a kernel needs to
//! read the op's attributes the same way the rules do.

pub mod collective;
pub mod conv;
pub mod elementwise;
pub mod fused;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod nn;
pub mod norm;
pub mod optim;
pub mod program;
pub mod reduce;

#[cfg(test)]
pub(crate) mod testing;
