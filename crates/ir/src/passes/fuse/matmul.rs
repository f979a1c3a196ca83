//! `matmul` + bias add (+ activation) → `fused_matmul`; also `matmul` + activation alone; and
//! any of these times a tensor of the product's own type (SwiGLU's `silu(x @ gate) * (x @ up)`)
//! → `fused_matmul` with that tensor as its multiplier. The bias must have the product's dtype
//! and broadcast to its shape without widening it.

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

/// The `fused_matmul` rooted at `root`.
struct Found {
    matmul: NodeId,
    bias: Option<ValueRef>,
    activation: Activation,
    /// The tensor the result is multiplied by, when `root` is that `mul`.
    multiplier: Option<ValueRef>,
    /// The pattern's nodes other than `root`.
    absorbed: Vec<NodeId>,
}

fn find(g: &Graph, root: NodeId) -> Option<Found> {
    if g.node(root).op()? == Op::Mul {
        multiplied(g, root)
    } else {
        unmultiplied(g, root)
    }
}

/// The pattern when node `mul` multiplies a single-use product (with its bias and activation,
/// if any) by a tensor of the same type: the first operand that is such a product.
fn multiplied(g: &Graph, mul: NodeId) -> Option<Found> {
    let out = g.node(mul).outputs.first()?;
    let inputs = g.inputs(mul);
    let (a, b) = (*inputs.first()?, *inputs.get(1)?);
    [(a, b), (b, a)]
        .into_iter()
        .find_map(|(product, multiplier)| {
            if g.ty(product) != out || g.ty(multiplier) != out || !single_use(g, product) {
                return None;
            }
            let mut found = match fusable_matmul(g, product) {
                Some(matmul) => Found {
                    matmul,
                    bias: None,
                    activation: Activation::NONE,
                    multiplier: None,
                    absorbed: Vec::new(),
                },
                None => unmultiplied(g, product.node)?,
            };
            found.absorbed.push(product.node);
            found.multiplier = Some(multiplier);
            Some(found)
        })
}

/// The pattern rooted at an activation or a bias add.
fn unmultiplied(g: &Graph, root: NodeId) -> Option<Found> {
    let op = g.node(root).op()?;
    let (matmul, bias, activation, absorbed) = if let Some(act) = Activation::of_op(op) {
        let x = *g.inputs(root).first()?;
        if g.ty(x) != g.node(root).outputs.first()? {
            return None;
        }
        match bias_add(g, x.node).filter(|_| single_use(g, x)) {
            Some((mm, bias)) => (mm, Some(bias), act, vec![x.node, mm]),
            None => {
                let mm = fusable_matmul(g, x)?;
                (mm, None, act, vec![mm])
            }
        }
    } else {
        let (mm, bias) = bias_add(g, root)?;
        (mm, Some(bias), Activation::NONE, vec![mm])
    };
    Some(Found {
        matmul,
        bias,
        activation,
        multiplier: None,
        absorbed,
    })
}

fn label(found: &Found) -> &'static str {
    let act = found.activation.unary().is_some();
    match (found.bias.is_some(), act, found.multiplier.is_some()) {
        (true, false, false) => "matmul_bias",
        (true, true, false) => "matmul_bias_act",
        (false, _, false) => "matmul_act",
        (true, false, true) => "matmul_bias_mul",
        (true, true, true) => "matmul_bias_act_mul",
        (false, true, true) => "matmul_act_mul",
        (false, false, true) => "matmul_mul",
    }
}

/// Fuses every matmul + bias (+ activation) and matmul + activation, each times a multiplier
/// where one follows, except the patterns `cx.unfused` names; roots are visited from the
/// outputs back, so a `mul` claims its product, and an activation its bias add, before the
/// inner pattern is tried alone.
pub(super) fn run(g: &mut Graph, cx: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    // The nodes of patterns left unfused: a part of one is not fused on its own either.
    let mut kept: HashSet<NodeId> = HashSet::new();
    for root in topo(g)?.into_iter().rev() {
        if !g.contains(root) || kept.contains(&root) {
            continue;
        }
        let Some(found) = find(g, root) else {
            continue;
        };
        let mut attrs = g.node(found.matmul).attrs().cloned().unwrap_or_default();
        attrs.insert("has_bias", found.bias.is_some());
        attrs.insert("activation", found.activation.name());
        if found.multiplier.is_some() {
            attrs.insert("has_multiplier", true);
        }
        let mut inputs = g.inputs(found.matmul);
        inputs.extend(found.bias);
        inputs.extend(found.multiplier);
        let fused = add_like(g, root, Op::FusedMatmul, attrs, &inputs)?;
        if left_unfused(g, cx, fused.node) {
            g.remove_node(fused.node);
            // The product without its multiplier is a pattern of its own, tried when its root
            // comes; any other pattern's parts stay as they are.
            if found.multiplier.is_none() {
                kept.extend(found.absorbed);
            }
            stats.record(NAME, "matmul_left_unfused");
            continue;
        }
        replace_with(g, root, fused);
        for &n in &found.absorbed {
            g.remove_node(n);
        }
        stats.record(NAME, label(&found));
    }
    Ok(())
}
