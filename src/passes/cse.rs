//! Common-subexpression elimination: two applications of the same op with the same
//! attributes, annotations and operands compute the same values, so later ones are replaced by
//! the first. `dropout` is never merged (in training each application draws its own mask).

use std::collections::HashMap;
use std::fmt::Write;

use super::{Pass, PassContext, PassError, PassStats};
use crate::ir::{Graph, Node, NodeKind, ValueRef};
use crate::ops::Op;

/// The `cse` pass.
pub struct Cse;

/// What makes two op nodes interchangeable, apart from their operands: op, attributes and
/// annotations, spelled out unambiguously.
fn signature(node: &Node) -> Option<String> {
    let NodeKind::Op { op, attrs } = &node.kind else {
        return None;
    };
    if *op == Op::Dropout {
        return None;
    }
    let mut key = op.name().to_string();
    for (name, value) in attrs.iter() {
        let _ = write!(key, " {name}={value}");
    }
    let _ = write!(key, " {:?}", node.annotations);
    Some(key)
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
        let mut seen: HashMap<(String, Vec<ValueRef>), crate::ir::NodeId> = HashMap::new();
        for id in order {
            let Some(sig) = signature(g.node(id)) else {
                continue;
            };
            // Operands were canonicalised already: the order is topological.
            let key = (sig, g.inputs(id));
            match seen.get(&key) {
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
                None => {
                    seen.insert(key, id);
                }
            }
        }
        Ok(stats)
    }
}
