//! The graph IR (petgraph): lowering from the checked program, the verifier, reverse-mode
//! autodiff, activation recomputation, per-rank programs (data parallel), and text and DOT dumps.

pub mod autodiff;
pub mod dot;
mod graph;
pub mod lower;
pub mod passes;
pub mod print;
pub mod recompute;
pub mod shard;
pub mod verify;

pub use autodiff::{backward, AutodiffError};
pub use graph::{Edge, Graph, Node, NodeId, NodeKind, ValueRef};
pub use lower::lower;
pub use verify::{verify, VerifyError};
