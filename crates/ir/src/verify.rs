//! The IR verifier: run after every pass in debug builds and with `--verify`. It checks that the
//! graph is acyclic, every op input slot is connected exactly once to an existing output, the
//! stored result types are what the registry infers, and the named outputs exist.

use std::fmt;

use mslc_core::ops::{self, TensorType};

use super::graph::{Graph, NodeKind};

/// What is wrong with a graph.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyError(pub String);

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for VerifyError {}

/// Checks the graph's invariants.
pub fn verify(graph: &Graph) -> Result<(), VerifyError> {
    let err = |m: String| Err(VerifyError(m));
    if graph.topo_order().is_none() {
        return err("the graph has a cycle".to_string());
    }
    for id in graph.node_ids() {
        let node = graph.node(id);
        let mut raw = graph.raw_inputs(id);
        raw.sort_by_key(|(_, slot)| *slot);
        for (expected, (v, slot)) in raw.iter().enumerate() {
            if *slot as usize != expected {
                return err(format!(
                    "node {} has input slot {slot} connected twice or slot {expected} missing",
                    id.index()
                ));
            }
            if v.index as usize >= graph.node(v.node).outputs.len() {
                return err(format!(
                    "node {} reads output {} of node {}, which has fewer",
                    id.index(),
                    v.index,
                    v.node.index()
                ));
            }
        }
        match &node.kind {
            NodeKind::Input { .. } | NodeKind::Param { .. } => {
                if !raw.is_empty() || node.outputs.len() != 1 {
                    return err(format!(
                        "input/param node {} must have no operands and one result",
                        id.index()
                    ));
                }
            }
            NodeKind::Op { op, attrs } => {
                let types: Vec<TensorType> =
                    raw.iter().map(|(v, _)| graph.ty(*v).clone()).collect();
                match ops::infer(*op, attrs, &types) {
                    Ok(inferred) if inferred == node.outputs => {}
                    Ok(inferred) => {
                        let show = |ts: &[TensorType]| {
                            ts.iter()
                                .map(|t| t.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        return err(format!(
                            "node {} ({op}) stores ({}) but the registry infers ({})",
                            id.index(),
                            show(&node.outputs),
                            show(&inferred)
                        ));
                    }
                    Err(e) => {
                        return err(format!(
                            "node {} ({op}) is ill-typed: {}",
                            id.index(),
                            e.message
                        ))
                    }
                }
            }
        }
    }
    for (name, v) in &graph.outputs {
        if !graph.contains(v.node) || v.index as usize >= graph.node(v.node).outputs.len() {
            return err(format!("output `{name}` refers to a removed value"));
        }
    }
    Ok(())
}
