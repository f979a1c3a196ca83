//! The order dumps print nodes in, and the dense `%N` numbers of their values: inputs and
//! parameters first (by node id), then ops in topological order. Numbers depend only on the
//! graph's structure, so dumps stay comparable across rewrites.

use super::graph::{Graph, NodeId, NodeKind, ValueRef};
use std::collections::HashMap;

/// Print order and value numbers of one graph.
pub(crate) struct Numbering {
    /// Nodes in print order.
    pub nodes: Vec<NodeId>,
    first: HashMap<NodeId, usize>,
    counts: HashMap<NodeId, usize>,
}

impl Numbering {
    /// Numbers `graph`. A cyclic graph (which the verifier rejects) is printed in node-id
    /// order so that it can still be looked at.
    pub fn new(graph: &Graph) -> Numbering {
        let order = graph.topo_order().unwrap_or_else(|_| graph.node_ids());
        let is_source = |id: &NodeId| {
            graph
                .node(*id)
                .is_some_and(|n| !matches!(n.kind, NodeKind::Op { .. }))
        };
        let mut nodes: Vec<NodeId> = graph.node_ids().into_iter().filter(is_source).collect();
        nodes.extend(order.into_iter().filter(|id| !is_source(id)));
        let mut first = HashMap::new();
        let mut counts = HashMap::new();
        let mut next = 0;
        for &id in &nodes {
            let n = graph.node(id).map_or(0, |n| n.outputs.len());
            first.insert(id, next);
            counts.insert(id, n);
            next += n;
        }
        Numbering {
            nodes,
            first,
            counts,
        }
    }

    /// The number of value `v`, if it exists.
    pub fn value(&self, v: ValueRef) -> Option<usize> {
        let count = *self.counts.get(&v.node)?;
        (v.index < count).then(|| self.first[&v.node] + v.index)
    }

    /// `%N`, or `%?` for a value that does not exist.
    pub fn name(&self, v: ValueRef) -> String {
        self.value(v)
            .map_or_else(|| "%?".to_string(), |n| format!("%{n}"))
    }
}
