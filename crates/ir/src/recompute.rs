//! Activation recomputation (gradient checkpointing): forward values the backward reads are
//! computed a second time, just before the backward needs them, instead of being kept alive
//! from the forward pass to the backward. The recomputed ops are duplicated explicitly in the
//! graph — each copy's origin ends in [`RECOMPUTE_MARK`] — so the schedule and the memory plan
//! see what really runs; the scheduler places each copy just before its first consumer.
//!
//! [`Forward`] analyses a training graph: which ops the loss depends on (the forward), which
//! layer each belongs to, which the backward reads. A [`Choice`] says what to recompute, per
//! layer ([`LayerChoice`]) and for ops marked `@recompute`; [`Forward::recompute_set`] turns it
//! into ops and [`recompute`] rewrites the graph.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use mslc_core::ops::{self, Op, TensorType};

use super::graph::{Graph, NodeId, ValueRef};

/// The suffix of a recomputed copy's origin: the forward node's origin, then this mark.
pub const RECOMPUTE_MARK: &str = "#recompute";

/// Ops doing more than this many flops per element they write are matmul-like (matmuls,
/// convolutions, attention): `selective` keeps their results. Every norm, activation and
/// elementwise op in the registry does at most 20.
pub const HEAVY_FLOPS_PER_ELEMENT: u64 = 32;

/// What to recompute in one layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerChoice {
    /// Keep every activation the backward reads.
    #[default]
    Keep,
    /// Keep the results of matmul-like ops, recompute the cheap ones (norms, activations,
    /// elementwise ops, rope): Korthikanti et al.'s selective recomputation.
    Selective,
    /// Keep the layer's inputs only and recompute the whole layer.
    Full,
}

impl LayerChoice {
    /// Its name in reports (`keep`, `selective`, `full`).
    pub fn name(self) -> &'static str {
        match self {
            LayerChoice::Keep => "keep",
            LayerChoice::Selective => "selective",
            LayerChoice::Full => "full",
        }
    }
}

/// What to recompute: a choice per layer (by instance path; absent means keep), and whether
/// the ops marked `@recompute` are recomputed too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choice {
    /// Per layer instance path.
    pub layers: BTreeMap<String, LayerChoice>,
    /// Recompute the ops marked `@recompute` (whatever their layer's choice).
    pub annotated: bool,
}

impl Choice {
    /// `choice` for every layer of `forward`, and the marked ops.
    pub fn uniform(forward: &Forward, choice: LayerChoice) -> Choice {
        Choice {
            layers: forward
                .layers
                .iter()
                .map(|(l, _)| (l.clone(), choice))
                .collect(),
            annotated: true,
        }
    }
}

/// The layer a node belongs to: its origin up to and including the first list index
/// (`model.layers.3.mlp.down_proj` → `model.layers.3`, `layer1.0.conv1` → `layer1.0`) — the
/// repeated instance calls a model is built of. `None` for nodes outside any such instance
/// (embeddings, the final norm, the head, the loss).
pub fn layer_of(origin: &str) -> Option<&str> {
    let mut end = 0;
    for part in origin.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return (end > part.len()).then_some(&origin[..end]);
        }
        end += 1;
    }
    None
}

/// The instance whose result is a checkpoint: the node's layer ([`layer_of`]), else its
/// top-level instance (`lm_head.x` → `lm_head`, `a.mlp` → `a`; `` at model level).
fn unit_of(origin: &str) -> &str {
    layer_of(origin).unwrap_or_else(|| origin.split('.').next().unwrap_or_default())
}

/// The forward of a training graph, as recomputation sees it.
#[derive(Clone, Debug)]
pub struct Forward {
    /// Forward op nodes in topological order: the ops the loss depends on.
    pub order: Vec<NodeId>,
    forward: HashSet<NodeId>,
    /// Layers in forward order, each with its op nodes.
    pub layers: Vec<(String, Vec<NodeId>)>,
}

impl Forward {
    /// Analyses `graph`, whose forward ends in `loss`. `None` if the graph has a cycle.
    pub fn of(graph: &Graph, loss: ValueRef) -> Option<Forward> {
        let mut forward = HashSet::new();
        let mut stack = vec![loss.node];
        while let Some(id) = stack.pop() {
            if graph.node(id).op().is_some() && forward.insert(id) {
                stack.extend(graph.inputs(id).iter().map(|v| v.node));
            }
        }
        let order: Vec<NodeId> = graph
            .topo_order()?
            .into_iter()
            .filter(|id| forward.contains(id))
            .collect();
        let mut layers: Vec<(String, Vec<NodeId>)> = Vec::new();
        for &id in &order {
            if let Some(layer) = layer_of(&graph.node(id).origin) {
                match layers.iter_mut().find(|(l, _)| l == layer) {
                    Some((_, nodes)) => nodes.push(id),
                    None => layers.push((layer.to_string(), vec![id])),
                }
            }
        }
        Some(Forward {
            order,
            forward,
            layers,
        })
    }

    /// Whether `id` is a forward op.
    pub fn contains(&self, id: NodeId) -> bool {
        self.forward.contains(&id)
    }

    /// The forward ops `choice` recomputes: the chosen layers' ops (all of them for `full`, the
    /// light ones for `selective`) and, if it says so, every op marked `@recompute` — less those
    /// that must stay: values a forward op of another layer or top-level instance reads (an
    /// instance's result is the next one's input: the checkpoint), named outputs (the loss), values computed from parameters alone (kept
    /// in the hoisted region anyway) and `dropout` (a second draw would differ).
    pub fn recompute_set(&self, graph: &Graph, choice: &Choice) -> HashSet<NodeId> {
        let invariant = invariant_nodes(graph, &self.order);
        let wanted = |id: NodeId| {
            let node = graph.node(id);
            if choice.annotated && node.annotations.recompute {
                return true;
            }
            let layer = layer_of(&node.origin).and_then(|l| choice.layers.get(l));
            match layer.copied().unwrap_or_default() {
                LayerChoice::Keep => false,
                LayerChoice::Full => true,
                LayerChoice::Selective => !is_heavy(graph, id),
            }
        };
        self.order
            .iter()
            .copied()
            .filter(|&id| {
                let node = graph.node(id);
                let unit = unit_of(&node.origin);
                let crosses = (0..node.outputs.len() as u32).any(|index| {
                    let v = ValueRef { node: id, index };
                    graph.is_output(v)
                        || graph.users(v).iter().any(|&(user, _)| {
                            self.contains(user) && unit_of(&graph.node(user).origin) != unit
                        })
                });
                wanted(id) && !crosses && !invariant.contains(&id) && node.op() != Some(Op::Dropout)
            })
            .collect()
    }
}

/// Forward ops computed from parameters and constants alone.
fn invariant_nodes(graph: &Graph, order: &[NodeId]) -> HashSet<NodeId> {
    let mut invariant = HashSet::new();
    for &id in order {
        let all = graph.inputs(id).iter().all(|v| {
            invariant.contains(&v.node)
                || matches!(graph.node(v.node).kind, super::NodeKind::Param { .. })
        });
        if all {
            invariant.insert(id);
        }
    }
    invariant
}

/// The flops of op node `id` by the registry's cost rule (0 when it has none).
pub fn node_flops(graph: &Graph, id: NodeId) -> u64 {
    let node = graph.node(id);
    let (Some(op), Some(attrs)) = (node.op(), node.attrs()) else {
        return 0;
    };
    let types: Vec<TensorType> = graph
        .inputs(id)
        .iter()
        .map(|v| graph.ty(*v).clone())
        .collect();
    ops::cost(op, attrs, &types).map_or(0, |c| c.flops)
}

/// Whether op node `id` is matmul-like: more than [`HEAVY_FLOPS_PER_ELEMENT`] flops per
/// element written.
fn is_heavy(graph: &Graph, id: NodeId) -> bool {
    let written: u64 = graph.node(id).outputs.iter().map(TensorType::numel).sum();
    node_flops(graph, id) > HEAVY_FLOPS_PER_ELEMENT.saturating_mul(written.max(1))
}

/// What [`recompute`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recomputed {
    /// Ops duplicated.
    pub ops: usize,
    /// Their flops, by the registry's cost rules.
    pub flops: u64,
    /// Bytes of the forward values the backward no longer reads (their copies are computed
    /// late instead).
    pub released_bytes: u64,
}

/// Duplicates the ops of `set` (forward ops, from [`Forward::recompute_set`]) that the backward
/// reads, directly or through other ops of `set`, and points every backward use at the copies.
/// A copy reads the original values of operands outside `set` (the checkpoints) and the copies
/// of those in it. The originals are then read by the forward alone.
pub fn recompute(graph: &mut Graph, forward: &Forward, set: &HashSet<NodeId>) -> Recomputed {
    // Needed: read by a backward op, or by another needed op of the set (reverse topological).
    let mut needed: HashSet<NodeId> = HashSet::new();
    for &id in forward.order.iter().rev() {
        if !set.contains(&id) {
            continue;
        }
        let read_late = graph
            .consumers(id)
            .iter()
            .any(|&c| !forward.contains(c) || needed.contains(&c));
        if read_late {
            needed.insert(id);
        }
    }
    let mut copies: HashMap<NodeId, NodeId> = HashMap::new();
    let mut done = Recomputed::default();
    for &id in &forward.order {
        if !needed.contains(&id) {
            continue;
        }
        let node = graph.node(id).clone();
        let (Some(op), Some(attrs)) = (node.op(), node.attrs().cloned()) else {
            continue;
        };
        let inputs: Vec<ValueRef> = graph
            .inputs(id)
            .into_iter()
            .map(|v| match copies.get(&v.node) {
                Some(&node) => ValueRef { node, ..v },
                None => v,
            })
            .collect();
        let origin = format!("{}{RECOMPUTE_MARK}", node.origin);
        let Ok(outs) = graph.add_op(op, attrs, &inputs, &origin) else {
            // The op was built from these very types once; it cannot fail again.
            continue;
        };
        let copy = outs[0].node;
        graph.node_mut(copy).loc = node.loc;
        graph.node_mut(copy).annotations = node.annotations.clone();
        copies.insert(id, copy);
        done.ops += 1;
        done.flops += node_flops(graph, id);
    }
    // A copy never reads a copied op's original, so every other reader outside the forward is
    // the backward.
    for &id in &forward.order {
        let Some(&copy) = copies.get(&id) else {
            continue;
        };
        for index in 0..graph.node(id).outputs.len() as u32 {
            let v = ValueRef { node: id, index };
            let late: Vec<(NodeId, u32)> = graph
                .users(v)
                .into_iter()
                .filter(|&(user, _)| !forward.contains(user))
                .collect();
            if !late.is_empty() {
                done.released_bytes += graph.ty(v).bytes();
            }
            for (user, slot) in late {
                graph.set_input(user, slot, ValueRef { node: copy, index });
            }
        }
    }
    done
}

/// Whether `id` is a recomputed copy, which the scheduler computes as late as it can.
pub fn is_recomputed(graph: &Graph, id: NodeId) -> bool {
    graph.node(id).origin.ends_with(RECOMPUTE_MARK)
}

#[cfg(test)]
mod tests;
