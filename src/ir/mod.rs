//! The graph IR every pass reads and rewrites: a typed dataflow graph built through the op
//! registry, with a verifier, a stable text form (printable and parseable) and a DOT dump.

mod dot;
mod graph;
mod numbering;
mod parse;
mod rewrite;
mod text;
mod verify;

pub use dot::to_dot;
pub use graph::{Annotations, Graph, GraphError, Init, Node, NodeId, NodeKind, Use, ValueRef};
pub use parse::{parse_text, ParseError};
pub use text::to_text;
pub use verify::{verify, VerifyError};

#[cfg(test)]
mod tests;
