//! Algebraic and layout simplification: drops ops that do nothing (`x*1`, `x+0`, `x-0`,
//! `x/1`, identity transposes, reshapes, broadcasts, full slices, one-input concats, casts to
//! the value's own dtype, dropout in inference or with `p = 0`), composes chains of
//! transposes and of reshapes into one op, and cancels transposes across a slice. An arithmetic identity is only dropped when the
//! result has exactly the type of the operand kept (no broadcast or promotion is lost).
//!
//! One sweep in topological order reaches a fixpoint on chains: each node sees its operands
//! already simplified.

use super::rewrite::{add_like, producer, replace_with, scalar_constant, single_use};
use super::{Pass, PassContext, PassError, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::family::layout::{permutation, SliceRange};
use mslc_core::ops::{Attrs, Op};

/// The `simplify` pass.
pub struct Simplify;

/// What a node simplifies to.
enum Rewrite {
    /// An existing value.
    Value(ValueRef),
    /// A new op on existing values.
    Op(Op, Attrs, Vec<ValueRef>),
}

/// `x` when the binary node `id` computes `x op c` (or `c op x` when `commutes`) with the
/// scalar constant `c == unit`, and the result has `x`'s type.
fn unit_operand(g: &Graph, id: NodeId, unit: f64, commutes: bool) -> Option<ValueRef> {
    let inputs = g.inputs(id);
    let out = g.node(id).outputs.first()?;
    let (a, b) = (*inputs.first()?, *inputs.get(1)?);
    let keeps = |x: ValueRef, c: ValueRef| scalar_constant(g, c) == Some(unit) && g.ty(x) == out;
    if keeps(a, b) {
        Some(a)
    } else if commutes && keeps(b, a) {
        Some(b)
    } else {
        None
    }
}

fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, p)| i == *p)
}

fn simplify_transpose(g: &Graph, id: NodeId, x: ValueRef) -> Option<(Rewrite, &'static str)> {
    let rank = g.ty(x).rank();
    let perm = permutation(g.node(id).attrs()?, rank).ok()?;
    if is_identity(&perm) {
        return Some((Rewrite::Value(x), "identity_transpose"));
    }
    let (op, inner) = producer(g, x)?;
    if op == Op::Slice {
        return transpose_of_slice(g, &perm, x);
    }
    if op != Op::Transpose {
        return None;
    }
    let inner = permutation(inner, rank).ok()?;
    // Output dim i is the inner transpose's dim perm[i], which is its input's inner[perm[i]].
    let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
    let y = *g.inputs(x.node).first()?;
    if is_identity(&composed) {
        return Some((Rewrite::Value(y), "transpose_transpose"));
    }
    let composed: Vec<i64> = composed.iter().map(|&p| p as i64).collect();
    let attrs = Attrs::new().with("perm", composed);
    Some((
        Rewrite::Op(Op::Transpose, attrs, vec![y]),
        "transpose_transpose",
    ))
}

/// `transpose(slice(transpose(y, inner)), perm)` with `inner∘perm` the identity →
/// `slice(y)` on the matching dim, when the slice has no other reader: how a head split
/// followed by per-part slices meets the transposes the attention fusion adds. (Other
/// compositions are left alone: a transpose next to a matmul may still become its flag.)
fn transpose_of_slice(
    g: &Graph,
    perm: &[usize],
    sliced: ValueRef,
) -> Option<(Rewrite, &'static str)> {
    if !single_use(g, sliced) {
        return None;
    }
    let y = *g.inputs(sliced.node).first()?;
    let (Op::Transpose, inner) = producer(g, y)? else {
        return None;
    };
    let range = SliceRange::of(g.ty(y), g.node(sliced.node).attrs()?).ok()?;
    let inner = permutation(inner, perm.len()).ok()?;
    let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
    let axis = perm.iter().position(|&p| p == range.axis)?;
    let base = *g.inputs(y.node).first()?;
    let slice = Attrs::new()
        .with("axis", axis as i64)
        .with("start", range.start)
        .with("end", range.end);
    is_identity(&composed).then_some((Rewrite::Op(Op::Slice, slice, vec![base]), "transpose_slice"))
}

fn simplify_reshape(g: &Graph, id: NodeId, x: ValueRef) -> Option<(Rewrite, &'static str)> {
    let out = &g.node(id).outputs.first()?.shape;
    if &g.ty(x).shape == out {
        return Some((Rewrite::Value(x), "identity_reshape"));
    }
    let (Op::Reshape, _) = producer(g, x)? else {
        return None;
    };
    let y = *g.inputs(x.node).first()?;
    if &g.ty(y).shape == out {
        return Some((Rewrite::Value(y), "reshape_reshape"));
    }
    let attrs = Attrs::new().with("shape", out.clone());
    Some((Rewrite::Op(Op::Reshape, attrs, vec![y]), "reshape_reshape"))
}

/// The simplification of node `id`, with its label, if one applies.
fn simplify_node(g: &Graph, id: NodeId, cx: &PassContext) -> Option<(Rewrite, &'static str)> {
    let node = g.node(id);
    let op = node.op()?;
    let attrs = node.attrs()?;
    let out = node.outputs.first()?;
    let inputs = g.inputs(id);
    let x = *inputs.first()?;
    let same_type = g.ty(x) == out;
    let value = |label| Some((Rewrite::Value(x), label));
    match op {
        Op::Mul => Some((Rewrite::Value(unit_operand(g, id, 1.0, true)?), "mul_one")),
        Op::Add => Some((Rewrite::Value(unit_operand(g, id, 0.0, true)?), "add_zero")),
        Op::Sub => Some((Rewrite::Value(unit_operand(g, id, 0.0, false)?), "sub_zero")),
        Op::Div => Some((Rewrite::Value(unit_operand(g, id, 1.0, false)?), "div_one")),
        Op::Transpose => simplify_transpose(g, id, x),
        Op::Reshape => simplify_reshape(g, id, x),
        Op::BroadcastTo if same_type => value("identity_broadcast"),
        Op::Cast if same_type => value("identity_cast"),
        Op::Concat if inputs.len() == 1 => value("single_concat"),
        Op::Slice => {
            let r = SliceRange::of(g.ty(x), attrs).ok()?;
            (r.start == 0 && r.end == g.ty(x).shape[r.axis])
                .then_some((Rewrite::Value(x), "full_slice"))
        }
        // A dropout with a seed is live (a training step's); one without is the identity
        // unless the graph will be trained.
        Op::Dropout
            if (!cx.training && inputs.len() == 1) || attrs.float("p").ok() == Some(0.0) =>
        {
            value("dropout")
        }
        _ => None,
    }
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn description(&self) -> &'static str {
        "drop identities (x*1, x+0, x-0, x/1, no-op layout ops and casts, inference dropout) \
         and compose transpose and reshape chains"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let order = g
            .topo_order()
            .ok_or_else(|| PassError::new(self.name(), "the graph has a cycle"))?;
        for id in order {
            let Some((rewrite, label)) = simplify_node(g, id, cx) else {
                continue;
            };
            let new = match rewrite {
                Rewrite::Value(v) => v,
                Rewrite::Op(op, attrs, inputs) => add_like(g, id, op, attrs, &inputs)
                    .map_err(|e| PassError::from_op(self.name(), e))?,
            };
            replace_with(g, id, new);
            stats.record(self.name(), label);
        }
        Ok(stats)
    }
}
