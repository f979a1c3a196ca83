//! The graph IR: nodes (inputs, parameters, op applications) with typed outputs, edges from
//! an output to an input slot, and named graph outputs. Built on a petgraph `StableDiGraph`,
//! so node ids stay valid while passes remove nodes.

use crate::ops::{self, Attrs, DType, Op, OpError, TensorType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

/// A node's stable identity; ids are never reused, and order by creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The petgraph index behind the id.
    pub(crate) fn ix(self) -> NodeIndex<u32> {
        NodeIndex::new(self.0 as usize)
    }

    /// The id of a petgraph index.
    pub(crate) fn of(ix: NodeIndex<u32>) -> NodeId {
        // Indices come from a `u32`-indexed graph, so they fit.
        NodeId(ix.index() as u32)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// One value: output `index` of node `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueRef {
    pub node: NodeId,
    pub index: usize,
}

/// How a parameter is initialised (the `~ init` of a `.msl` `param`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Init {
    Zeros,
    Ones,
    Normal { mean: f64, std: f64 },
    Uniform { low: f64, high: f64 },
    Constant { v: f64 },
}

/// What a node is.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// A model input, fed at run time.
    Input { name: String },
    /// A parameter (`trainable`) or buffer, addressed by its dotted path.
    Param {
        path: String,
        init: Init,
        trainable: bool,
    },
    /// An op applied to the node's input slots.
    Op { op: Op, attrs: Attrs },
}

/// Per-node facts the source or passes attach: layouts, recomputation, dtype pinning.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Annotations {
    /// One layout per input: per dim, the mesh axis it is split along (`@shard`).
    pub shard: Option<Vec<Vec<Option<String>>>>,
    /// Recompute in the backward pass instead of keeping the activation (`@recompute`).
    pub recompute: bool,
    /// Keep the result in this dtype whatever the precision policy says (`@f32`).
    pub keep_dtype: Option<DType>,
}

/// A node: what it is, its output types, where in the source it came from, and annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub outputs: Vec<TensorType>,
    /// The source scope that produced it, e.g. `model.layers.0.self_attn`.
    pub origin: Option<String>,
    pub annotations: Annotations,
}

impl Node {
    /// A node of `kind` with output types `outputs` and no origin or annotations.
    pub fn new(kind: NodeKind, outputs: Vec<TensorType>) -> Node {
        Node {
            kind,
            outputs,
            origin: None,
            annotations: Annotations::default(),
        }
    }

    /// The op, for op nodes.
    pub fn op(&self) -> Option<Op> {
        match self.kind {
            NodeKind::Op { op, .. } => Some(op),
            _ => None,
        }
    }
}

/// An edge: output `output` of the source node feeds input `slot` of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edge {
    pub output: usize,
    pub slot: usize,
}

/// A use of a value: input `slot` of node `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Use {
    pub node: NodeId,
    pub slot: usize,
}

/// Misuse of the graph API by a pass or builder (a value or node that does not exist, a
/// rewrite that would break the graph).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphError(pub String);

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GraphError {}

/// A dataflow graph of ops with named outputs.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub(crate) g: StableDiGraph<Node, Edge, u32>,
    outputs: Vec<(String, ValueRef)>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a model input of type `ty`.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> ValueRef {
        let kind = NodeKind::Input {
            name: name.to_string(),
        };
        let node = self.add_node(Node::new(kind, vec![ty]));
        ValueRef { node, index: 0 }
    }

    /// Adds a parameter (`trainable`) or buffer of type `ty`.
    pub fn add_param(
        &mut self,
        path: &str,
        ty: TensorType,
        init: Init,
        trainable: bool,
    ) -> ValueRef {
        let kind = NodeKind::Param {
            path: path.to_string(),
            init,
            trainable,
        };
        let node = self.add_node(Node::new(kind, vec![ty]));
        ValueRef { node, index: 0 }
    }

    /// Adds `op` applied to `inputs`, typed by the op registry; returns its outputs. Errors
    /// point at the offending input (a value that does not exist, or one the op rejects).
    pub fn add_op(
        &mut self,
        op: Op,
        attrs: Attrs,
        inputs: &[ValueRef],
    ) -> Result<Vec<ValueRef>, OpError> {
        let mut types = Vec::with_capacity(inputs.len());
        for (i, &v) in inputs.iter().enumerate() {
            let t = self.value_type(v).ok_or_else(|| {
                OpError::at(
                    i,
                    format!("{op}: input {i} refers to a value that does not exist"),
                )
            })?;
            types.push(t.clone());
        }
        let outputs = ops::infer(op, &attrs, &types)?;
        let n = outputs.len();
        let id = self.add_node(Node::new(NodeKind::Op { op, attrs }, outputs));
        for (slot, &v) in inputs.iter().enumerate() {
            self.connect(v, id, slot);
        }
        Ok((0..n).map(|index| ValueRef { node: id, index }).collect())
    }

    /// Adds a node as given, unconnected and unchecked (for passes that build nodes by hand
    /// and connect them with [`Graph::set_input`]; run the verifier afterwards).
    pub fn add_node(&mut self, node: Node) -> NodeId {
        NodeId::of(self.g.add_node(node))
    }

    /// Names `v` as graph output `name`, replacing an output of the same name.
    pub fn set_output(&mut self, name: &str, v: ValueRef) -> Result<(), GraphError> {
        self.check_value(v)?;
        match self.outputs.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = v,
            None => self.outputs.push((name.to_string(), v)),
        }
        Ok(())
    }

    /// The named graph outputs, in the order they were first set.
    pub fn outputs(&self) -> &[(String, ValueRef)] {
        &self.outputs
    }

    /// The node `id`, if it exists.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.g.node_weight(id.ix())
    }

    /// The node `id` for editing (origin, annotations, attributes, stored types).
    pub fn node_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.g.node_weight_mut(id.ix())
    }

    /// Every node id, ascending.
    pub fn node_ids(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self.g.node_indices().map(NodeId::of).collect();
        ids.sort_unstable();
        ids
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    /// The type of value `v`, if it exists.
    pub fn value_type(&self, v: ValueRef) -> Option<&TensorType> {
        self.node(v.node)?.outputs.get(v.index)
    }

    /// The values feeding `node`, in slot order (empty for inputs and parameters).
    pub fn inputs_of(&self, node: NodeId) -> Vec<ValueRef> {
        self.input_slots(node).into_iter().map(|(_, v)| v).collect()
    }

    /// `(slot, value)` for every edge into `node`, by slot (a verified graph has slots
    /// `0..n`, each once).
    pub fn input_slots(&self, node: NodeId) -> Vec<(usize, ValueRef)> {
        let mut v: Vec<(usize, ValueRef)> = self
            .g
            .edges_directed(node.ix(), Direction::Incoming)
            .map(|e| {
                let w = e.weight();
                let source = ValueRef {
                    node: NodeId::of(e.source()),
                    index: w.output,
                };
                (w.slot, source)
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Every use of value `v`, ordered by node then slot.
    pub fn uses(&self, v: ValueRef) -> Vec<Use> {
        let mut uses: Vec<Use> = self
            .g
            .edges_directed(v.node.ix(), Direction::Outgoing)
            .filter(|e| e.weight().output == v.index)
            .map(|e| Use {
                node: NodeId::of(e.target()),
                slot: e.weight().slot,
            })
            .collect();
        uses.sort_unstable();
        uses
    }

    /// The nodes reading any output of `node`, ascending, each once.
    pub fn users_of(&self, node: NodeId) -> Vec<NodeId> {
        let mut users: Vec<NodeId> = self
            .g
            .neighbors_directed(node.ix(), Direction::Outgoing)
            .map(NodeId::of)
            .collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    /// All nodes, producers before users, ties broken by the smaller node id (so the order
    /// only depends on the graph). An error names the nodes on a cycle if there is one.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        let mut pending: Vec<usize> = vec![0; self.g.node_bound()];
        let mut ready = BinaryHeap::new();
        for ix in self.g.node_indices() {
            let n = self.g.edges_directed(ix, Direction::Incoming).count();
            pending[ix.index()] = n;
            if n == 0 {
                ready.push(Reverse(NodeId::of(ix)));
            }
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(id)) = ready.pop() {
            order.push(id);
            for e in self.g.edges_directed(id.ix(), Direction::Outgoing) {
                let t = e.target().index();
                pending[t] -= 1;
                if pending[t] == 0 {
                    ready.push(Reverse(NodeId::of(e.target())));
                }
            }
        }
        if order.len() == self.g.node_count() {
            return Ok(order);
        }
        let stuck: Vec<String> = self
            .node_ids()
            .into_iter()
            .filter(|id| pending[id.0 as usize] > 0)
            .map(|id| id.0.to_string())
            .collect();
        Err(GraphError(format!(
            "the graph has a cycle through nodes {}",
            stuck.join(", ")
        )))
    }

    /// An error unless `v` exists.
    pub(crate) fn check_value(&self, v: ValueRef) -> Result<(), GraphError> {
        match self.value_type(v) {
            Some(_) => Ok(()),
            None => Err(GraphError(format!(
                "value {} of {} does not exist",
                v.index, v.node
            ))),
        }
    }

    /// Adds the edge `v` → `node`.`slot`.
    pub(crate) fn connect(&mut self, v: ValueRef, node: NodeId, slot: usize) {
        self.g.add_edge(
            v.node.ix(),
            node.ix(),
            Edge {
                output: v.index,
                slot,
            },
        );
    }

    /// The graph outputs, for rewrites that redirect them.
    pub(crate) fn outputs_mut(&mut self) -> &mut Vec<(String, ValueRef)> {
        &mut self.outputs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32t(shape: &[i64]) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    #[test]
    fn builds_a_typed_graph() {
        let mut g = Graph::new();
        let x = g.add_input("x", f32t(&[2, 8]));
        let w = g.add_param("layer.weight", f32t(&[4, 8]), Init::Zeros, true);
        let y = g
            .add_op(Op::Matmul, Attrs::new().with("transpose_b", true), &[x, w])
            .unwrap();
        assert_eq!(y.len(), 1);
        assert_eq!(g.value_type(y[0]), Some(&f32t(&[2, 4])));
        let z = g.add_op(Op::Relu, Attrs::new(), &[y[0]]).unwrap()[0];
        g.set_output("z", z).unwrap();
        assert_eq!(g.inputs_of(y[0].node), vec![x, w]);
        assert_eq!(
            g.uses(x),
            vec![Use {
                node: y[0].node,
                slot: 0
            }]
        );
        assert_eq!(g.users_of(y[0].node), vec![z.node]);
        assert_eq!(
            g.topo_order().unwrap(),
            vec![x.node, w.node, y[0].node, z.node]
        );
        assert_eq!(g.outputs(), &[("z".to_string(), z)]);
        assert_eq!(g.node(w.node).unwrap().op(), None);
        assert_eq!(g.node(z.node).unwrap().op(), Some(Op::Relu));
    }

    #[test]
    fn add_op_reports_bad_inputs() {
        let mut g = Graph::new();
        let x = g.add_input("x", f32t(&[2, 8]));
        let ghost = ValueRef {
            node: x.node,
            index: 3,
        };
        let e = g.add_op(Op::Add, Attrs::new(), &[x, ghost]).unwrap_err();
        assert_eq!(
            e.message,
            "add: input 1 refers to a value that does not exist"
        );
        assert_eq!(e.input, Some(1));
        let w = g.add_input("w", f32t(&[16, 4]));
        let e = g.add_op(Op::Matmul, Attrs::new(), &[x, w]).unwrap_err();
        assert!(e.message.starts_with("matmul: inner dims differ"));
        assert_eq!(g.node_count(), 2, "a failed add_op adds nothing");
        assert!(g.set_output("y", ghost).is_err());
    }

    #[test]
    fn set_output_replaces_by_name() {
        let mut g = Graph::new();
        let a = g.add_input("a", f32t(&[1]));
        let b = g.add_input("b", f32t(&[1]));
        g.set_output("o", a).unwrap();
        g.set_output("p", a).unwrap();
        g.set_output("o", b).unwrap();
        assert_eq!(g.outputs(), &[("o".to_string(), b), ("p".to_string(), a)]);
    }

    #[test]
    fn topo_order_breaks_ties_by_id() {
        let mut g = Graph::new();
        let c = g
            .add_op(
                Op::Constant,
                Attrs::new().with("value", 1.0).with("dtype", DType::F32),
                &[],
            )
            .unwrap()[0];
        let x = g.add_input("x", f32t(&[]));
        let s = g.add_op(Op::Add, Attrs::new(), &[x, c]).unwrap()[0];
        let n = g.add_op(Op::Neg, Attrs::new(), &[c]).unwrap()[0];
        assert_eq!(
            g.topo_order().unwrap(),
            vec![c.node, x.node, s.node, n.node]
        );
    }

    #[test]
    fn init_serializes_as_a_tagged_enum() {
        let j = serde_json::to_string(&Init::Normal {
            mean: 0.0,
            std: 0.02,
        })
        .unwrap();
        assert_eq!(j, r#"{"kind":"normal","mean":0.0,"std":0.02}"#);
        let back: Init = serde_json::from_str(r#"{"kind":"constant","v":2.5}"#).unwrap();
        assert_eq!(back, Init::Constant { v: 2.5 });
    }
}
