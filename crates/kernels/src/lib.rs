//! CPU kernel library of the executor: naive reference kernels for every op of docs/ops.md and
//! fast (blocked, vectorised, parallel) kernels for the hot ones, on plain f32 slices with
//! `&[usize]` shapes. A leaf module: it depends on nothing else in the crate.
//!
//! - [`reference`](mod@reference): one obviously-correct function per op (f64 accumulation), returning a
//!   [`Tensor`]; the ground truth for everything else.
//! - Fast kernels write into a caller-provided `out: &mut [f32]` of the op's output size and take
//!   a parameter struct (serde-serialisable, `Default` tuned for this machine):
//!   [`matmul::matmul`] ([`matmul::MatmulParams`], also used by [`conv::conv2d`]),
//!   [`attention::attention`] ([`attention::AttentionParams`]),
//!   [`elementwise::fused_elementwise`] ([`elementwise::ElementwiseParams`]),
//!   [`transpose::transpose`] ([`transpose::TransposeParams`]), and the row-wise kernels taking
//!   [`par::RowParams`]: [`softmax`], [`norm`], [`rope`], [`embedding`], [`reduce`], [`pool`],
//!   [`loss`].
//! - Backward kernels of the neural-net ops, row-parallel like the forward ones:
//!   [`norm_grad`], [`embedding_grad`], [`attention_grad`] (recomputes the weights from the
//!   saved log-sum-exp), [`conv_grad`], [`pool_grad`].
//! - [`convert`]: f16 / bf16 storage to and from f32.
//!
//! Every kernel validates lengths, shapes and attributes and returns a [`KernelError`] instead
//! of panicking. Fast kernels are deterministic: the same inputs and parameters give the same
//! bits whatever the number of threads (work is only ever split over outputs, never over a
//! reduction).

#![deny(missing_docs)]

pub mod activation;
pub mod attention;
pub mod attention_grad;
pub mod binding;
pub mod conv;
pub mod conv_grad;
pub mod convert;
pub mod cpu;
pub mod elementwise;
pub mod embedding;
pub mod embedding_grad;
pub mod error;
pub mod loss;
pub mod math;
pub mod matmul;
pub mod norm;
pub mod norm_grad;
pub mod optimizer;
pub mod par;
pub mod peak;
pub mod pool;
pub mod pool_grad;
pub mod reduce;
pub mod reference;
pub mod rope;
pub mod rows;
pub mod scratch;
pub mod shape;
pub mod softmax;
pub mod step;
pub mod tensor;
#[cfg(test)]
mod testing;
pub mod transpose;

pub use activation::Activation;
pub use error::{KernelError, KernelResult};
pub use tensor::{Tensor, TensorRef};
