//! `rms_norm(x) * w` → `rms_norm_scale(x, w)` and `layer_norm(x) * g + b` →
//! `layer_norm_affine(x, g, b)`, when the parameters have `x`'s dtype, broadcast to its shape
//! and the result keeps `x`'s type.

use super::{left_unfused, topo, NAME};
use crate::passes::rewrite::{add_like, is_op, replace_with, single_use};
use crate::passes::{PassContext, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::{broadcasts_to, Attrs, Op, OpError};

/// The two operands of a binary node of op `op`, in both orders.
fn operand_orders(g: &Graph, id: NodeId, op: Op) -> Vec<(ValueRef, ValueRef)> {
    let inputs = g.inputs(id);
    match (g.node(id).op(), inputs.as_slice()) {
        (Some(o), [a, b]) if o == op => vec![(*a, *b), (*b, *a)],
        _ => Vec::new(),
    }
}

/// `(norm node, x)` when `v` is the single-use result of `norm` applied to `x`.
fn normalised(g: &Graph, v: ValueRef, norm: Op) -> Option<(NodeId, ValueRef)> {
    if !is_op(g, v, norm) || !single_use(g, v) {
        return None;
    }
    Some((v.node, *g.inputs(v.node).first()?))
}

/// Whether parameter `p` can scale or shift `x` inside a fused norm.
fn affine_param(g: &Graph, p: ValueRef, x: ValueRef) -> bool {
    let (p, x) = (g.ty(p), g.ty(x));
    p.dtype == x.dtype && broadcasts_to(&p.shape, &x.shape)
}

/// `(norm node, x, scale, mul node)` when `mul` is `norm(x) * scale` keeping `x`'s type.
fn scaled(g: &Graph, mul: NodeId, norm: Op) -> Option<(NodeId, ValueRef, ValueRef)> {
    let out = g.node(mul).outputs.first()?;
    operand_orders(g, mul, Op::Mul)
        .into_iter()
        .find_map(|(n, w)| {
            let (norm_node, x) = normalised(g, n, norm)?;
            (g.ty(x) == out && affine_param(g, w, x)).then_some((norm_node, x, w))
        })
}

/// The fused op replacing `root`, its operands, the nodes it absorbs and its label.
type Found = (Op, Vec<ValueRef>, NodeId, Vec<NodeId>, &'static str);

fn find(g: &Graph, root: NodeId) -> Option<Found> {
    match g.node(root).op()? {
        Op::Mul => {
            let (norm, x, w) = scaled(g, root, Op::RmsNorm)?;
            Some((
                Op::RmsNormScale,
                vec![x, w],
                norm,
                vec![norm],
                "rms_norm_scale",
            ))
        }
        Op::Add => {
            let out = g.node(root).outputs.first()?;
            operand_orders(g, root, Op::Add)
                .into_iter()
                .find_map(|(m, b)| {
                    if !single_use(g, m) || g.ty(m) != out {
                        return None;
                    }
                    let (norm, x, w) = scaled(g, m.node, Op::LayerNorm)?;
                    affine_param(g, b, x).then(|| {
                        (
                            Op::LayerNormAffine,
                            vec![x, w, b],
                            norm,
                            vec![m.node, norm],
                            "layer_norm_affine",
                        )
                    })
                })
        }
        _ => None,
    }
}

/// Fuses every scaled RMS norm and affine layer norm, except those `cx.unfused` names.
pub(super) fn run(g: &mut Graph, cx: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    for root in topo(g)? {
        if !g.contains(root) {
            continue;
        }
        let Some((op, inputs, norm, absorbed, label)) = find(g, root) else {
            continue;
        };
        let eps = g
            .node(norm)
            .attrs()
            .and_then(|a| a.get("eps").cloned())
            .ok_or_else(|| OpError::new(format!("{label}: the norm has no `eps`")))?;
        let mut attrs = Attrs::new();
        attrs.insert("eps", eps);
        let fused = add_like(g, root, op, attrs, &inputs)?;
        if left_unfused(g, cx, fused.node) {
            g.remove_node(fused.node);
            stats.record(NAME, "norm_left_unfused");
            continue;
        }
        replace_with(g, root, fused);
        for n in absorbed {
            g.remove_node(n);
        }
        stats.record(NAME, label);
    }
    Ok(())
}
