//! The IR verifier: run after every pass (debug builds, `--verify`) to catch a broken graph
//! where it broke rather than where it crashes.

use super::graph::{Graph, NodeId, NodeKind, ValueRef};
use crate::ops::{self, fmt_dims, OpError, TensorType};
use std::collections::HashSet;
use std::fmt;

/// The first thing found wrong with a graph.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifyError {
    /// The graph has a cycle.
    Cycle(String),
    /// An input or parameter node has incoming edges.
    SourceWithInputs { node: NodeId },
    /// An op node's input slot has no edge.
    MissingInput { node: NodeId, slot: usize },
    /// An op node's input slot has more than one edge.
    DuplicateInput { node: NodeId, slot: usize },
    /// An edge reads an output its source does not have.
    NoSuchValue {
        node: NodeId,
        slot: usize,
        value: ValueRef,
    },
    /// The op registry rejects the node's inputs or attributes.
    OpRejected { node: NodeId, error: OpError },
    /// The stored output types differ from the re-inferred ones.
    TypeMismatch {
        node: NodeId,
        stored: Vec<TensorType>,
        inferred: Vec<TensorType>,
    },
    /// A graph output names a value that does not exist.
    DanglingOutput { name: String },
    /// Two inputs or two parameters share a name.
    DuplicateName { what: &'static str, name: String },
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let types = |ts: &[TensorType]| {
            ts.iter()
                .map(|t| format!("{}{}", t.dtype, fmt_dims(&t.shape)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            VerifyError::Cycle(m) => f.write_str(m),
            VerifyError::SourceWithInputs { node } => {
                write!(f, "{node} is an input or parameter but has incoming edges")
            }
            VerifyError::MissingInput { node, slot } => {
                write!(f, "{node}: input slot {slot} is not connected")
            }
            VerifyError::DuplicateInput { node, slot } => {
                write!(f, "{node}: input slot {slot} is connected more than once")
            }
            VerifyError::NoSuchValue { node, slot, value } => write!(
                f,
                "{node}: input slot {slot} reads output {} of {}, which has no such output",
                value.index, value.node
            ),
            VerifyError::OpRejected { node, error } => write!(f, "{node}: {}", error.message),
            VerifyError::TypeMismatch {
                node,
                stored,
                inferred,
            } => write!(
                f,
                "{node}: stored types ({}) differ from inferred ({})",
                types(stored),
                types(inferred)
            ),
            VerifyError::DanglingOutput { name } => {
                write!(f, "graph output `{name}` names a value that does not exist")
            }
            VerifyError::DuplicateName { what, name } => write!(f, "duplicate {what} `{name}`"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// Checks that `graph` is well formed: acyclic; input and parameter nodes have no inputs;
/// every op input slot `0..n` connected exactly once to an existing value (so every value is
/// defined before its use in topological order); the registry accepts every op and its
/// re-inferred types equal the stored ones; graph outputs exist; input names and parameter
/// paths are unique.
pub fn verify(graph: &Graph) -> Result<(), VerifyError> {
    let order = graph.topo_order().map_err(|e| VerifyError::Cycle(e.0))?;
    let mut inputs_seen = HashSet::new();
    let mut params_seen = HashSet::new();
    for id in order {
        let Some(node) = graph.node(id) else { continue };
        let slots = graph.input_slots(id);
        let (op, attrs) = match &node.kind {
            NodeKind::Op { op, attrs } => (*op, attrs),
            NodeKind::Input { name } | NodeKind::Param { path: name, .. } => {
                if !slots.is_empty() {
                    return Err(VerifyError::SourceWithInputs { node: id });
                }
                let (what, seen) = match node.kind {
                    NodeKind::Input { .. } => ("input", &mut inputs_seen),
                    _ => ("parameter", &mut params_seen),
                };
                if !seen.insert(name.clone()) {
                    return Err(VerifyError::DuplicateName {
                        what,
                        name: name.clone(),
                    });
                }
                continue;
            }
        };
        let mut types = Vec::with_capacity(slots.len());
        for (expected, &(slot, value)) in slots.iter().enumerate() {
            if slot > expected {
                return Err(VerifyError::MissingInput {
                    node: id,
                    slot: expected,
                });
            }
            if slot < expected {
                return Err(VerifyError::DuplicateInput { node: id, slot });
            }
            let t = graph.value_type(value).ok_or(VerifyError::NoSuchValue {
                node: id,
                slot,
                value,
            })?;
            types.push(t.clone());
        }
        let inferred = ops::infer(op, attrs, &types)
            .map_err(|error| VerifyError::OpRejected { node: id, error })?;
        if inferred != node.outputs {
            return Err(VerifyError::TypeMismatch {
                node: id,
                stored: node.outputs.clone(),
                inferred,
            });
        }
    }
    match graph
        .outputs()
        .iter()
        .find(|(_, v)| graph.value_type(*v).is_none())
    {
        Some((name, _)) => Err(VerifyError::DanglingOutput { name: name.clone() }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Init, Node, NodeKind};
    use crate::ops::{Attrs, DType, Op};

    fn f32t(s: &[i64]) -> TensorType {
        TensorType::new(DType::F32, s)
    }

    /// x -> exp -> neg, output "y".
    fn chain() -> (Graph, [ValueRef; 3]) {
        let mut g = Graph::new();
        let x = g.add_input("x", f32t(&[4]));
        let e = g.add_op(Op::Exp, Attrs::new(), &[x]).unwrap()[0];
        let n = g.add_op(Op::Neg, Attrs::new(), &[e]).unwrap()[0];
        g.set_output("y", n).unwrap();
        (g, [x, e, n])
    }

    #[test]
    fn accepts_a_built_graph() {
        let (g, _) = chain();
        assert_eq!(verify(&g), Ok(()));
        assert_eq!(verify(&Graph::new()), Ok(()));
    }

    #[test]
    fn catches_cycles() {
        let (mut g, [_, e, n]) = chain();
        g.set_input(e.node, 0, n).unwrap();
        let err = verify(&g).unwrap_err();
        assert!(matches!(err, VerifyError::Cycle(_)));
        assert_eq!(err.to_string(), "the graph has a cycle through nodes 1, 2");
    }

    #[test]
    fn catches_missing_and_duplicate_slots() {
        let (mut g, [x, _, _]) = chain();
        let bare = g.add_node(Node::new(
            NodeKind::Op {
                op: Op::Add,
                attrs: Attrs::new(),
            },
            vec![f32t(&[4])],
        ));
        g.set_input(bare, 1, x).unwrap();
        let err = verify(&g).unwrap_err();
        assert_eq!(
            err,
            VerifyError::MissingInput {
                node: bare,
                slot: 0
            }
        );
        assert_eq!(err.to_string(), "node 3: input slot 0 is not connected");

        let (mut g, [x, e, _]) = chain();
        g.connect(x, e.node, 0);
        assert_eq!(
            verify(&g).unwrap_err(),
            VerifyError::DuplicateInput {
                node: e.node,
                slot: 0
            }
        );
    }

    #[test]
    fn catches_arity_and_type_errors() {
        let (mut g, [x, e, _]) = chain();
        g.set_input(e.node, 1, x).unwrap();
        let err = verify(&g).unwrap_err();
        assert_eq!(err.to_string(), "node 1: exp: expects 1 input, got 2");

        let (mut g, [_, e, _]) = chain();
        g.node_mut(e.node).unwrap().outputs = vec![TensorType::new(DType::F16, [4])];
        let err = verify(&g).unwrap_err();
        assert_eq!(
            err.to_string(),
            "node 1: stored types (f16[4]) differ from inferred (f32[4])"
        );
    }

    #[test]
    fn catches_dangling_values_and_outputs() {
        let (mut g, [x, _, n]) = chain();
        let ghost = ValueRef {
            node: x.node,
            index: 5,
        };
        g.connect(ghost, n.node, 1);
        assert_eq!(
            verify(&g).unwrap_err().to_string(),
            "node 2: input slot 1 reads output 5 of node 0, which has no such output"
        );

        let (mut g, [_, _, n]) = chain();
        g.set_output("z", n).unwrap();
        // An output that existed when set, but whose node a careless pass dropped.
        g.g.remove_node(n.node.ix());
        assert_eq!(
            verify(&g).unwrap_err(),
            VerifyError::DanglingOutput { name: "y".into() }
        );
    }

    #[test]
    fn catches_edges_into_sources_and_duplicate_names() {
        let (mut g, [x, _, _]) = chain();
        let p = g.add_param("w", f32t(&[4]), Init::Ones, true);
        g.connect(x, p.node, 0);
        assert_eq!(
            verify(&g).unwrap_err(),
            VerifyError::SourceWithInputs { node: p.node }
        );

        let (mut g, _) = chain();
        g.add_input("x", f32t(&[1]));
        assert_eq!(verify(&g).unwrap_err().to_string(), "duplicate input `x`");
        let (mut g, _) = chain();
        g.add_param("w", f32t(&[1]), Init::Zeros, false);
        g.add_param("w", f32t(&[1]), Init::Zeros, true);
        assert_eq!(
            verify(&g).unwrap_err().to_string(),
            "duplicate parameter `w`"
        );
    }
}
