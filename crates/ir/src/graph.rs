//! The graph IR: a petgraph of typed nodes — model inputs, parameters and op applications —
//! with edges from a producer's output to a consumer's input slot, plus the rewriting API the
//! passes use.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;

use mslc_core::ops::{self, Attrs, Op, OpError, TensorType};
use mslc_core::program::{Annotations, Init, Loc};

/// A node id.
pub type NodeId = NodeIndex<u32>;

/// One output of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueRef {
    /// The producing node.
    pub node: NodeId,
    /// Which of its outputs.
    pub index: u32,
}

/// What a node is.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// A model input.
    Input {
        /// Input name.
        name: String,
    },
    /// A parameter or buffer.
    Param {
        /// Dotted path.
        path: String,
        /// Initializer.
        init: Init,
        /// `param` (true) or `buffer` (false).
        trainable: bool,
    },
    /// An op application.
    Op {
        /// The op.
        op: Op,
        /// Its complete attributes.
        attrs: Attrs,
    },
}

/// A node with its result types and provenance.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What it is.
    pub kind: NodeKind,
    /// Its results' types.
    pub outputs: Vec<TensorType>,
    /// Instance path it came from, e.g. `model.layers.0.mlp`.
    pub origin: String,
    /// Where its op was written, for errors found when it runs (`--check-numerics`); `None` for
    /// inputs, parameters and ops no source line wrote (a shared rope table).
    pub loc: Option<Loc>,
    /// `@` annotations.
    pub annotations: Annotations,
}

impl Node {
    /// The op, if this is an op node.
    pub fn op(&self) -> Option<Op> {
        match &self.kind {
            NodeKind::Op { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// The attributes, if this is an op node.
    pub fn attrs(&self) -> Option<&Attrs> {
        match &self.kind {
            NodeKind::Op { attrs, .. } => Some(attrs),
            _ => None,
        }
    }
}

/// An edge: output `output` of the source feeds input `slot` of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    /// Producer output index.
    pub output: u32,
    /// Consumer input slot.
    pub slot: u32,
}

/// A model as a dataflow graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Model name.
    pub name: String,
    graph: StableDiGraph<Node, Edge, u32>,
    /// Named results.
    pub outputs: Vec<(String, ValueRef)>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            graph: StableDiGraph::default(),
            outputs: Vec::new(),
        }
    }

    fn add(&mut self, kind: NodeKind, outputs: Vec<TensorType>, origin: &str) -> NodeId {
        self.graph.add_node(Node {
            kind,
            outputs,
            origin: origin.to_string(),
            loc: None,
            annotations: Annotations::default(),
        })
    }

    /// Adds a model input.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> ValueRef {
        let node = self.add(
            NodeKind::Input {
                name: name.to_string(),
            },
            vec![ty],
            "",
        );
        ValueRef { node, index: 0 }
    }

    /// Adds a parameter.
    pub fn add_param(
        &mut self,
        path: &str,
        ty: TensorType,
        init: Init,
        trainable: bool,
    ) -> ValueRef {
        let node = self.add(
            NodeKind::Param {
                path: path.to_string(),
                init,
                trainable,
            },
            vec![ty],
            "",
        );
        ValueRef { node, index: 0 }
    }

    /// Adds an op applied to `inputs`, with its result types inferred by the registry.
    pub fn add_op(
        &mut self,
        op: Op,
        attrs: Attrs,
        inputs: &[ValueRef],
        origin: &str,
    ) -> Result<Vec<ValueRef>, OpError> {
        let types: Vec<TensorType> = inputs.iter().map(|v| self.ty(*v).clone()).collect();
        let attrs = ops::resolve_attrs(op, &attrs)?;
        let outputs = ops::infer(op, &attrs, &types)?;
        let count = outputs.len() as u32;
        let node = self.add(NodeKind::Op { op, attrs }, outputs, origin);
        for (slot, v) in inputs.iter().enumerate() {
            self.graph.add_edge(
                v.node,
                node,
                Edge {
                    output: v.index,
                    slot: slot as u32,
                },
            );
        }
        Ok((0..count).map(|index| ValueRef { node, index }).collect())
    }

    /// Names `v` as a model output.
    pub fn set_output(&mut self, name: &str, v: ValueRef) {
        self.outputs.push((name.to_string(), v));
    }

    /// The node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }

    /// The node, mutably (types must stay consistent; the verifier checks).
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.graph[id]
    }

    /// Whether the node still exists.
    pub fn contains(&self, id: NodeId) -> bool {
        self.graph.contains_node(id)
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueRef) -> &TensorType {
        &self.graph[v.node].outputs[v.index as usize]
    }

    /// The signature of op node `id` (op, operand types, attributes), as kernel tables and the
    /// tuner key it; `None` for an input, parameter or constant node.
    pub fn signature(&self, id: NodeId) -> Option<String> {
        let node = self.node(id);
        let op = node.op()?;
        let attrs = node.attrs().cloned().unwrap_or_default();
        let inputs = self.inputs(id);
        Some(mslc_core::ops::signature(
            op,
            inputs.iter().map(|v| self.ty(*v)),
            &attrs,
        ))
    }

    /// Operands of a node in slot order.
    pub fn inputs(&self, id: NodeId) -> Vec<ValueRef> {
        let mut edges: Vec<(u32, ValueRef)> = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .map(|e| {
                (
                    e.weight().slot,
                    ValueRef {
                        node: e.source(),
                        index: e.weight().output,
                    },
                )
            })
            .collect();
        edges.sort_unstable();
        edges.into_iter().map(|(_, v)| v).collect()
    }

    /// Consumers of a value: (node, slot), ordered by node then slot.
    pub fn users(&self, v: ValueRef) -> Vec<(NodeId, u32)> {
        let mut users: Vec<(NodeId, u32)> = self
            .graph
            .edges_directed(v.node, Direction::Outgoing)
            .filter(|e| e.weight().output == v.index)
            .map(|e| (e.target(), e.weight().slot))
            .collect();
        users.sort_unstable();
        users
    }

    /// The nodes that read any output of `id` (each once, in id order).
    pub fn consumers(&self, id: NodeId) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self
            .graph
            .edges_directed(id, Direction::Outgoing)
            .map(|e| e.target())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// Whether a value is a named model output.
    pub fn is_output(&self, v: ValueRef) -> bool {
        self.outputs.iter().any(|(_, o)| *o == v)
    }

    /// Redirects every use of `old` (edges and named outputs) to `new`.
    pub fn replace_all_uses(&mut self, old: ValueRef, new: ValueRef) {
        let edges: Vec<_> = self
            .graph
            .edges_directed(old.node, Direction::Outgoing)
            .filter(|e| e.weight().output == old.index)
            .map(|e| (e.id(), e.target(), e.weight().slot))
            .collect();
        for (id, target, slot) in edges {
            self.graph.remove_edge(id);
            self.graph.add_edge(
                new.node,
                target,
                Edge {
                    output: new.index,
                    slot,
                },
            );
        }
        for (_, o) in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Makes input `slot` of node `user` read `new` instead of what it reads now.
    pub fn set_input(&mut self, user: NodeId, slot: u32, new: ValueRef) {
        let old = self
            .graph
            .edges_directed(user, Direction::Incoming)
            .find(|e| e.weight().slot == slot)
            .map(|e| e.id());
        if let Some(id) = old {
            self.graph.remove_edge(id);
        }
        self.graph.add_edge(
            new.node,
            user,
            Edge {
                output: new.index,
                slot,
            },
        );
    }

    /// Removes a node and its edges.
    pub fn remove_node(&mut self, id: NodeId) {
        self.graph.remove_node(id);
    }

    /// Every node id in creation order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.graph.node_indices().collect()
    }

    /// Number of op nodes.
    pub fn op_count(&self) -> usize {
        self.graph
            .node_weights()
            .filter(|n| n.op().is_some())
            .count()
    }

    /// The nodes `roots` depend on (themselves included), in the order a depth-first evaluation
    /// of them computes the nodes: each after its inputs, taken in operand order except that
    /// the operands `computed_last` picks come after the others. Unlike [`Graph::topo_order`]
    /// it follows the data flow, not node ids, so a node a pass added late sits where it is
    /// used, and a node that reads only a parameter (a transpose of a weight) right before its
    /// first reader. The executor's schedule is this order; a training step sums its gradients
    /// in it.
    pub fn demand_order(
        &self,
        roots: impl IntoIterator<Item = NodeId>,
        computed_last: impl Fn(NodeId) -> bool,
    ) -> Vec<NodeId> {
        let mut order = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<(NodeId, bool)> = Vec::new();
        for root in roots {
            stack.push((root, false));
            while let Some((id, inputs_done)) = stack.pop() {
                if inputs_done {
                    order.push(id);
                } else if seen.insert(id) {
                    stack.push((id, true));
                    // Pushed in reverse, so popped (computed) in operand order, the late ones
                    // after the rest.
                    let inputs = self.inputs(id);
                    let (late, early): (Vec<&ValueRef>, Vec<&ValueRef>) =
                        inputs.iter().partition(|v| computed_last(v.node));
                    let pending = late.into_iter().rev().chain(early.into_iter().rev());
                    stack.extend(
                        pending
                            .filter(|v| !seen.contains(&v.node))
                            .map(|v| (v.node, false)),
                    );
                }
            }
        }
        order
    }

    /// Nodes in a deterministic topological order: among ready nodes, the oldest first.
    /// `None` if the graph has a cycle.
    pub fn topo_order(&self) -> Option<Vec<NodeId>> {
        let mut indegree: std::collections::HashMap<NodeId, usize> =
            self.graph.node_indices().map(|n| (n, 0)).collect();
        for e in (&self.graph).edge_references() {
            *indegree.entry(e.target()).or_default() += 1;
        }
        let mut ready: BinaryHeap<Reverse<NodeId>> = indegree
            .iter()
            .filter(|(_, d)| **d == 0)
            .map(|(n, _)| Reverse(*n))
            .collect();
        let mut order = Vec::with_capacity(indegree.len());
        while let Some(Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.graph.edges_directed(n, Direction::Outgoing) {
                let d = indegree.entry(e.target()).or_default();
                *d -= 1;
                if *d == 0 {
                    ready.push(Reverse(e.target()));
                }
            }
        }
        (order.len() == self.graph.node_count()).then_some(order)
    }

    /// Raw edges into a node: (source value, slot), unsorted — for the verifier.
    pub(crate) fn raw_inputs(&self, id: NodeId) -> Vec<(ValueRef, u32)> {
        self.graph
            .edges_directed(id, Direction::Incoming)
            .map(|e| {
                (
                    ValueRef {
                        node: e.source(),
                        index: e.weight().output,
                    },
                    e.weight().slot,
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mslc_core::ops::DType;

    /// A node added after the whole graph (as a rewrite adds its nodes) still comes where its
    /// value is used, and a node that reads only a parameter right before its first reader —
    /// where the id-ordered topological order puts both elsewhere.
    #[test]
    fn demand_order_follows_the_data_flow_not_node_ids() {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, [2, 2]);
        let x = g.add_input("x", ty.clone());
        let w = g.add_param("w", ty.clone(), Init::Zeros, true);
        let wt = g
            .add_op(
                Op::Transpose,
                Attrs::new().with("perm", vec![1i64, 0]),
                &[w],
                "wt",
            )
            .unwrap()[0];
        let a = g.add_op(Op::Neg, Attrs::new(), &[x], "a").unwrap()[0];
        let e = g.add_op(Op::Exp, Attrs::new(), &[a], "e").unwrap()[0];
        let y = g.add_op(Op::Matmul, Attrs::new(), &[e, wt], "y").unwrap()[0];
        // A node added last, as a rewrite adds its nodes, read by the last op.
        let copy = g.add_op(Op::Neg, Attrs::new(), &[x], "copy").unwrap()[0];
        let z = g.add_op(Op::Add, Attrs::new(), &[y, copy], "z").unwrap()[0];
        let order = g.demand_order([z.node], |_| false);
        let at = |v: ValueRef| order.iter().position(|&n| n == v.node).unwrap();
        assert_eq!(order.len(), 8);
        // Operands in order, each node after its inputs, the late copy right before `z`.
        assert!(at(x) < at(a) && at(a) < at(e) && at(e) < at(w));
        assert!(at(w) < at(wt) && at(wt) < at(y) && at(y) < at(copy) && at(copy) < at(z));
        let topo = g.topo_order().unwrap();
        let topo_at = |v: ValueRef| topo.iter().position(|&n| n == v.node).unwrap();
        assert!(
            topo_at(wt) < topo_at(e),
            "ids put the weight's transpose first"
        );
        // Shared inputs come once.
        assert_eq!(order.iter().filter(|&&n| n == x.node).count(), 1);
    }
}
