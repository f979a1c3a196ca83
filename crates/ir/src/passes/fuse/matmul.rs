//! `matmul` + bias add (+ activation) → `fused_matmul`; also `matmul` + activation alone.
//! The bias must have the product's dtype and broadcast to its shape without widening it.

use std::collections::HashSet;

use super::{left_unfused, topo, NAME};
use crate::passes::rewrite::{add_like, is_op, replace_with, single_use};
use crate::passes::{PassContext, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::family::fused::Activation;
use mslc_core::ops::{Op, OpError};

/// The matmul node behind `v` when `v` is its single-use, float result.
fn fusable_matmul(g: &Graph, v: ValueRef) -> Option<NodeId> {
    (is_op(g, v, Op::Matmul) && single_use(g, v) && g.ty(v).dtype.is_float()).then_some(v.node)
}

/// `(matmul node, bias)` when node `add` is `matmul + bias` (either order) and adding the
/// bias keeps the product's type.
fn bias_add(g: &Graph, add: NodeId) -> Option<(NodeId, ValueRef)> {
    if g.node(add).op()? != Op::Add {
        return None;
    }
    let out = g.node(add).outputs.first()?;
    let inputs = g.inputs(add);
    let (a, b) = (*inputs.first()?, *inputs.get(1)?);
    [(a, b), (b, a)].into_iter().find_map(|(m, bias)| {
        let mm = fusable_matmul(g, m)?;
        (g.ty(m) == out && g.ty(bias).dtype == out.dtype).then_some((mm, bias))
    })
}

/// The `fused_matmul` rooted at `root`: `(matmul, bias, activation, absorbed nodes)`.
type Found = (NodeId, Option<ValueRef>, Activation, Vec<NodeId>);

fn find(g: &Graph, root: NodeId) -> Option<Found> {
    let op = g.node(root).op()?;
    if let Some(act) = Activation::of_op(op) {
        let x = *g.inputs(root).first()?;
        if g.ty(x) != g.node(root).outputs.first()? {
            return None;
        }
        if single_use(g, x) {
            if let Some((mm, bias)) = bias_add(g, x.node) {
                return Some((mm, Some(bias), act, vec![x.node, mm]));
            }
        }
        let mm = fusable_matmul(g, x)?;
        return Some((mm, None, act, vec![mm]));
    }
    let (mm, bias) = bias_add(g, root)?;
    Some((mm, Some(bias), Activation::NONE, vec![mm]))
}

fn label(bias: bool, act: Activation) -> &'static str {
    match (bias, act.unary()) {
        (true, None) => "matmul_bias",
        (true, Some(_)) => "matmul_bias_act",
        (false, _) => "matmul_act",
    }
}

/// Fuses every matmul + bias (+ activation) and matmul + activation, except the patterns
/// `cx.unfused` names; roots are visited from the outputs back, so an activation claims its
/// bias add before the add is tried alone.
pub(super) fn run(g: &mut Graph, cx: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    // The nodes of patterns left unfused: a part of one is not fused on its own either.
    let mut kept: HashSet<NodeId> = HashSet::new();
    for root in topo(g)?.into_iter().rev() {
        if !g.contains(root) || kept.contains(&root) {
            continue;
        }
        let Some((mm, bias, act, absorbed)) = find(g, root) else {
            continue;
        };
        let mut attrs = g.node(mm).attrs().cloned().unwrap_or_default();
        attrs.insert("has_bias", bias.is_some());
        attrs.insert("activation", act.name());
        let mut inputs = g.inputs(mm);
        inputs.extend(bias);
        let fused = add_like(g, root, Op::FusedMatmul, attrs, &inputs)?;
        if left_unfused(g, cx, fused.node) {
            g.remove_node(fused.node);
            kept.extend(absorbed);
            stats.record(NAME, "matmul_left_unfused");
            continue;
        }
        replace_with(g, root, fused);
        for n in absorbed {
            g.remove_node(n);
        }
        stats.record(NAME, label(bias.is_some(), act));
    }
    Ok(())
}
