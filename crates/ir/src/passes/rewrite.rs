//! Graph queries and edits the passes share: reading a value's producer, use counts, scalar
//! constants, and replacing a node by new ops or by an existing value.

use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::{Attrs, Op, OpError};
use mslc_core::program::Annotations;

/// The op producing `v` and its attributes, if `v` comes from an op node.
pub(crate) fn producer(g: &Graph, v: ValueRef) -> Option<(Op, &Attrs)> {
    let node = g.node(v.node);
    Some((node.op()?, node.attrs()?))
}

/// Whether `v` is produced by `op`.
pub(crate) fn is_op(g: &Graph, v: ValueRef, op: Op) -> bool {
    g.node(v.node).op() == Some(op)
}

/// Whether `v` has exactly one consumer and is not a model output: the condition for folding
/// its producer into that consumer without computing it twice.
pub(crate) fn single_use(g: &Graph, v: ValueRef) -> bool {
    g.users(v).len() == 1 && !g.is_output(v)
}

/// The value of `v` when a `constant` op produces it.
pub(crate) fn scalar_constant(g: &Graph, v: ValueRef) -> Option<f64> {
    match producer(g, v)? {
        (Op::Constant, attrs) => attrs.float("value").ok(),
        _ => None,
    }
}

/// Output 0 of `node`.
pub(crate) fn out0(node: NodeId) -> ValueRef {
    ValueRef { node, index: 0 }
}

/// Adds `op` on `inputs` carrying the provenance (origin, source location and annotations) of
/// node `like`.
pub(crate) fn add_like(
    g: &mut Graph,
    like: NodeId,
    op: Op,
    attrs: Attrs,
    inputs: &[ValueRef],
) -> Result<ValueRef, OpError> {
    let annotations: Annotations = g.node(like).annotations.clone();
    let first = add_helper(g, like, op, attrs, inputs)?;
    g.node_mut(first.node).annotations = annotations;
    Ok(first)
}

/// Adds `op` on `inputs` with node `like`'s origin and source location but no annotations
/// (helper ops such as inserted casts and transposes).
pub(crate) fn add_helper(
    g: &mut Graph,
    like: NodeId,
    op: Op,
    attrs: Attrs,
    inputs: &[ValueRef],
) -> Result<ValueRef, OpError> {
    let (origin, loc) = (g.node(like).origin.clone(), g.node(like).loc);
    let out = g.add_op(op, attrs, inputs, &origin)?;
    let first = out
        .first()
        .copied()
        .ok_or_else(|| OpError::new(format!("{op} made no result")))?;
    g.node_mut(first.node).loc = loc;
    Ok(first)
}

/// Redirects every use of the single-result node `old` to `new` and removes `old`.
pub(crate) fn replace_with(g: &mut Graph, old: NodeId, new: ValueRef) {
    g.replace_all_uses(out0(old), new);
    g.remove_node(old);
}

/// Rebuilds node `old` as `op` with `attrs` on `inputs` (keeping its origin and annotations,
/// re-inferring its result types), moves every use of its results to the new node's and
/// removes it. Returns the new node.
pub(crate) fn rebuild(
    g: &mut Graph,
    old: NodeId,
    op: Op,
    attrs: Attrs,
    inputs: &[ValueRef],
) -> Result<NodeId, OpError> {
    let new = add_like(g, old, op, attrs, inputs)?.node;
    for index in 0..g.node(old).outputs.len() as u32 {
        g.replace_all_uses(ValueRef { node: old, index }, ValueRef { node: new, index });
    }
    g.remove_node(old);
    Ok(new)
}
