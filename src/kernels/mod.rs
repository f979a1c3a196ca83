//! CPU kernel library of the executor: naive reference kernels for every op of docs/ops.md and
//! fast (blocked, vectorised, parallel) kernels for the hot ones, on plain f32 slices with
//! `&[usize]` shapes. A leaf module: it depends on nothing else in the crate.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod convert;
pub mod cpu;
pub mod elementwise;
pub mod embedding;
pub mod error;
pub mod loss;
pub mod math;
pub mod matmul;
pub mod norm;
pub mod par;
pub mod pool;
pub mod reduce;
pub mod reference;
pub mod rope;
pub mod rows;
pub mod scratch;
pub mod shape;
pub mod softmax;
pub mod tensor;
#[cfg(test)]
mod testing;
pub mod transpose;

pub use activation::Activation;
pub use error::{KernelError, KernelResult};
pub use tensor::{Tensor, TensorRef};
