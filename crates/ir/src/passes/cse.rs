//! Common-subexpression elimination: two applications of the same op with the same
//! attributes, annotations and operands compute the same values, so later ones are replaced by
//! the first. `dropout` is never merged (in training each application draws its own mask), nor
//! `all_gather`: a sharded parameter is gathered again where the backward reads it (ZeRO stage
//! 3) so that the forward's copy is freed in between, which a merge would undo.

use std::collections::HashMap;

use super::{Pass, PassContext, PassError, PassStats};
use crate::{Graph, Node, NodeId, ValueRef};
use mslc_core::ops::Op;

/// The `cse` pass.
pub struct Cse;

/// Whether op nodes `a` and `b` (same op, same operands) compute the same values: equal
/// attributes and annotations.
fn same(a: &Node, b: &Node) -> bool {
    a.attrs() == b.attrs() && a.annotations == b.annotations
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn description(&self) -> &'static str {
        "merge ops that apply the same op, attributes and annotations to the same operands"
    }

    fn run(&self, g: &mut Graph, _cx: &PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let order = g
            .topo_order()
            .ok_or_else(|| PassError::new(self.name(), "the graph has a cycle"))?;
        // Candidates by (op, operands); attributes and annotations are compared on a hit.
        let mut seen: HashMap<(Op, Vec<ValueRef>), Vec<NodeId>> = HashMap::new();
        for id in order {
            let Some(op) = g.node(id).op() else {
                continue;
            };
            if matches!(op, Op::Dropout | Op::AllGather) {
                continue;
            }
            // Operands were canonicalised already: the order is topological.
            let bucket = seen.entry((op, g.inputs(id))).or_default();
            match bucket.iter().find(|n| same(g.node(**n), g.node(id))) {
                Some(&first) => {
                    for index in 0..g.node(id).outputs.len() as u32 {
                        g.replace_all_uses(
                            ValueRef { node: id, index },
                            ValueRef { node: first, index },
                        );
                    }
                    g.remove_node(id);
                    stats.record(self.name(), "merged");
                }
                None => bucket.push(id),
            }
        }
        Ok(stats)
    }
}
