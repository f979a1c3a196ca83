//! The graph IR (petgraph): lowering from the checked program, the verifier, and text and DOT
//! dumps.

pub mod dot;
mod graph;
pub mod lower;
pub mod passes;
pub mod print;
pub mod verify;

pub use graph::{Edge, Graph, Node, NodeId, NodeKind, ValueRef};
pub use lower::lower;
pub use verify::{verify, VerifyError};
