//! The editing API passes use: rewire one input, redirect every use of a value, remove a
//! node, and re-run type inference after edits that change types.

use super::graph::{Graph, GraphError, NodeId, NodeKind, ValueRef};
use crate::ops::{self, OpError};
use petgraph::algo::has_path_connecting;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

impl Graph {
    /// Makes input `slot` of op node `node` read `v`, replacing whatever it read. Types are
    /// not re-inferred (see [`Graph::reinfer`]); a cycle this creates is the verifier's to
    /// report.
    pub fn set_input(&mut self, node: NodeId, slot: usize, v: ValueRef) -> Result<(), GraphError> {
        self.check_value(v)?;
        match self.node(node).map(|n| &n.kind) {
            Some(NodeKind::Op { .. }) => {}
            Some(_) => return Err(GraphError(format!("{node} is not an op and has no inputs"))),
            None => return Err(GraphError(format!("{node} does not exist"))),
        }
        let old: Vec<_> = self
            .g
            .edges_directed(node.ix(), Direction::Incoming)
            .filter(|e| e.weight().slot == slot)
            .map(|e| e.id())
            .collect();
        for e in old {
            self.g.remove_edge(e);
        }
        self.connect(v, node, slot);
        Ok(())
    }

    /// Redirects every use of `old` (op inputs and graph outputs) to `new`; returns how many
    /// were redirected. Refuses a redirection that would make a cycle.
    pub fn replace_all_uses(&mut self, old: ValueRef, new: ValueRef) -> Result<usize, GraphError> {
        self.replace_uses_where(old, new, |_| true)
    }

    /// [`Graph::replace_all_uses`], except the uses by node `except` — the usual way to put
    /// a new node after `old`: build `new = f(old)`, then redirect the other uses.
    pub fn replace_uses_except(
        &mut self,
        old: ValueRef,
        new: ValueRef,
        except: NodeId,
    ) -> Result<usize, GraphError> {
        self.replace_uses_where(old, new, |n| n != except)
    }

    fn replace_uses_where(
        &mut self,
        old: ValueRef,
        new: ValueRef,
        keep: impl Fn(NodeId) -> bool,
    ) -> Result<usize, GraphError> {
        self.check_value(old)?;
        self.check_value(new)?;
        if old == new {
            return Ok(0);
        }
        let uses: Vec<_> = self
            .uses(old)
            .into_iter()
            .filter(|u| keep(u.node))
            .collect();
        if let Some(u) = uses
            .iter()
            .find(|u| has_path_connecting(&self.g, u.node.ix(), new.node.ix(), None))
        {
            return Err(GraphError(format!(
                "redirecting the uses of value {} of {} to value {} of {} would make a cycle \
                 through {}",
                old.index, old.node, new.index, new.node, u.node
            )));
        }
        for u in &uses {
            self.set_input(u.node, u.slot, new)?;
        }
        let mut redirected = uses.len();
        for (_, v) in self.outputs_mut().iter_mut().filter(|(_, v)| *v == old) {
            *v = new;
            redirected += 1;
        }
        Ok(redirected)
    }

    /// Removes `node`, which must have no users and not be a graph output.
    pub fn remove_node(&mut self, node: NodeId) -> Result<(), GraphError> {
        if self.node(node).is_none() {
            return Err(GraphError(format!("{node} does not exist")));
        }
        if let Some(u) = self.users_of(node).first() {
            return Err(GraphError(format!("{node} is still used by {u}")));
        }
        if let Some((name, _)) = self.outputs().iter().find(|(_, v)| v.node == node) {
            return Err(GraphError(format!("{node} is graph output `{name}`")));
        }
        self.g.remove_node(node.ix());
        Ok(())
    }

    /// Re-infers the output types of every op node in topological order (after a rewrite
    /// changed some types, e.g. an inserted cast). Errors name the node.
    pub fn reinfer(&mut self) -> Result<(), OpError> {
        let order = self.topo_order().map_err(|e| OpError::new(e.0))?;
        for id in order {
            let Some(NodeKind::Op { op, attrs }) = self.node(id).map(|n| &n.kind) else {
                continue;
            };
            let (op, attrs) = (*op, attrs.clone());
            let inputs: Vec<_> = self
                .inputs_of(id)
                .into_iter()
                .filter_map(|v| self.value_type(v).cloned())
                .collect();
            let outputs =
                ops::infer(op, &attrs, &inputs).map_err(|e| e.context(&id.to_string()))?;
            if let Some(n) = self.node_mut(id) {
                n.outputs = outputs;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::Graph;
    use crate::ops::{Attrs, DType, Op, TensorType};

    fn t(d: DType, s: &[i64]) -> TensorType {
        TensorType::new(d, s)
    }

    #[test]
    fn insert_a_cast_after_a_value() {
        let mut g = Graph::new();
        let x = g.add_input("x", t(DType::F32, &[4]));
        let e = g.add_op(Op::Exp, Attrs::new(), &[x]).unwrap()[0];
        let n = g.add_op(Op::Neg, Attrs::new(), &[x]).unwrap()[0];
        g.set_output("x", x).unwrap();
        let c = g
            .add_op(Op::Cast, Attrs::new().with("dtype", DType::F16), &[x])
            .unwrap()[0];
        assert_eq!(g.replace_uses_except(x, c, c.node).unwrap(), 3);
        assert_eq!(g.inputs_of(e.node), vec![c]);
        assert_eq!(g.inputs_of(n.node), vec![c]);
        assert_eq!(g.inputs_of(c.node), vec![x]);
        assert_eq!(g.outputs()[0].1, c);
        // Downstream types are stale until re-inferred.
        assert_eq!(g.value_type(e).unwrap().dtype, DType::F32);
        g.reinfer().unwrap();
        assert_eq!(g.value_type(e).unwrap().dtype, DType::F16);
    }

    #[test]
    fn refuses_cycles_and_bad_removals() {
        let mut g = Graph::new();
        let x = g.add_input("x", t(DType::F32, &[4]));
        let a = g.add_op(Op::Exp, Attrs::new(), &[x]).unwrap()[0];
        let b = g.add_op(Op::Neg, Attrs::new(), &[a]).unwrap()[0];
        let err = g.replace_all_uses(x, b).unwrap_err();
        assert!(err.0.contains("would make a cycle"), "{err}");
        assert_eq!(
            g.inputs_of(a.node),
            vec![x],
            "a refused rewrite changes nothing"
        );
        assert_eq!(
            g.remove_node(a.node).unwrap_err().0,
            format!("{} is still used by {}", a.node, b.node)
        );
        g.set_output("b", b).unwrap();
        assert!(g
            .remove_node(b.node)
            .unwrap_err()
            .0
            .contains("graph output `b`"));
        assert_eq!(g.replace_all_uses(b, a).unwrap(), 1);
        g.remove_node(b.node).unwrap();
        assert!(g.node(b.node).is_none());
        assert!(g.remove_node(b.node).is_err());
        assert_eq!(g.topo_order().unwrap(), vec![x.node, a.node]);
    }

    #[test]
    fn set_input_rewires_one_slot() {
        let mut g = Graph::new();
        let x = g.add_input("x", t(DType::F32, &[4]));
        let y = g.add_input("y", t(DType::F32, &[4]));
        let s = g.add_op(Op::Sub, Attrs::new(), &[x, y]).unwrap()[0];
        g.set_input(s.node, 0, y).unwrap();
        assert_eq!(g.inputs_of(s.node), vec![y, y]);
        assert!(g
            .set_input(x.node, 0, y)
            .unwrap_err()
            .0
            .contains("not an op"));
        let bad = crate::ir::ValueRef {
            node: s.node,
            index: 1,
        };
        assert!(g.set_input(s.node, 0, bad).is_err());
    }
}
