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

/// The op an `attention` or `attention_lse` merges with.
fn attention_partner(op: Op) -> Option<Op> {
    match op {
        Op::Attention => Some(Op::AttentionLse),
        Op::AttentionLse => Some(Op::Attention),
        _ => None,
    }
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
            let inputs = g.inputs(id);
            if let Some(other) = attention_partner(op) {
                if let Some(&partner) = seen
                    .get(&(other, inputs.clone()))
                    .and_then(|b| b.iter().find(|n| same(g.node(**n), g.node(id))))
                {
                    let (attention, with_lse) = if op == Op::Attention {
                        (id, partner)
                    } else {
                        (partner, id)
                    };
                    g.replace_all_uses(
                        ValueRef {
                            node: attention,
                            index: 0,
                        },
                        ValueRef {
                            node: with_lse,
                            index: 0,
                        },
                    );
                    g.remove_node(attention);
                    stats.record(self.name(), "merged");
                    if op == Op::Attention {
                        continue;
                    }
                    seen.entry((other, inputs.clone()))
                        .or_default()
                        .retain(|&n| n != partner);
                }
            }
            // Operands were canonicalised already: the order is topological.
            let bucket = seen.entry((op, inputs)).or_default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use mslc_core::ops::{Attrs, DType, TensorType};

    /// Whichever comes first in the order, the forward `attention` is replaced by the first
    /// output of the `attention_lse` of the same operands and attributes; one with other
    /// attributes stays.
    #[test]
    fn attention_merges_into_attention_lse_of_the_same_operands() {
        for lse_first in [false, true] {
            let mut g = Graph::new("m");
            let t = TensorType::new(DType::F32, [1, 4, 2, 8]);
            let qkv: Vec<ValueRef> = ["q", "k", "v"]
                .iter()
                .map(|n| g.add_input(n, t.clone()))
                .collect();
            let causal = Attrs::new().with("causal", true);
            let add = |g: &mut Graph, op: Op, attrs: &Attrs| {
                g.add_op(op, attrs.clone(), &qkv, "").unwrap()
            };
            let (attention, with_lse) = if lse_first {
                let l = add(&mut g, Op::AttentionLse, &causal);
                (add(&mut g, Op::Attention, &causal), l)
            } else {
                let a = add(&mut g, Op::Attention, &causal);
                (a, add(&mut g, Op::AttentionLse, &causal))
            };
            let other = add(&mut g, Op::Attention, &Attrs::new());
            g.set_output("out", attention[0]);
            g.set_output("lse", with_lse[1]);
            g.set_output("other", other[0]);
            let stats = Cse.run(&mut g, &PassContext::default()).unwrap();
            assert_eq!(stats.rewrites.get("cse.merged"), Some(&1));
            assert!(!g.contains(attention[0].node));
            assert_eq!(g.outputs[0].1, with_lse[0]);
            assert_eq!(g.outputs[2].1, other[0]);
        }
    }
}
