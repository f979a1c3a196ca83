//! Explicit attention → the `attention` op. The pattern, over `q, k, v` in `[B, N, S, D]`:
//!
//! ```text
//! matmul(q, k, transpose_b) → mul(scale) | div(1/scale) → [add(causal_mask)]
//!     → [cast up] → softmax(-1) → [cast back] → matmul(·, v)
//! ```
//!
//! becomes `transpose(attention(transpose(q), transpose(k), transpose(v)))` with the
//! transposes `[0, 2, 1, 3]` converting to the op's `[B, S, N, D]` layout and back; the
//! `simplify` pass then cancels them against the model's own head split and merge. The
//! optional cast pair is what mixed precision puts around a softmax kept in f32; the fused
//! op's kernel keeps its softmax statistics in f32 itself.

use super::{topo, NAME};
use crate::passes::rewrite::{
    add_helper, add_like, producer, replace_with, scalar_constant, single_use,
};
use crate::passes::{PassContext, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::{Attrs, DType, Op, OpError};

/// What the pattern rooted at a `matmul` matched.
struct Found {
    q: ValueRef,
    k: ValueRef,
    v: ValueRef,
    scale: f64,
    causal: bool,
    /// The pattern's nodes other than the root, to remove once it is replaced.
    absorbed: Vec<NodeId>,
}

/// `(op, attrs, operands)` of `v`'s producer, when `v` is single-use and produced by `op`.
fn step(g: &Graph, v: ValueRef, op: Op) -> Option<(&Attrs, Vec<ValueRef>)> {
    match producer(g, v)? {
        (o, attrs) if o == op && single_use(g, v) => Some((attrs, g.inputs(v.node))),
        _ => None,
    }
}

fn flag(attrs: &Attrs, name: &str) -> bool {
    attrs.opt_bool(name).ok().flatten().unwrap_or(false)
}

/// Peels an optional `cast` off `v`, returning its operand and the cast's dtype.
fn peel_cast(g: &Graph, v: ValueRef, absorbed: &mut Vec<NodeId>) -> (ValueRef, Option<DType>) {
    match step(g, v, Op::Cast) {
        Some((_, inputs)) if inputs.len() == 1 => {
            absorbed.push(v.node);
            (inputs[0], Some(g.ty(v).dtype))
        }
        _ => (v, None),
    }
}

/// Matches the pattern backwards from the final `matmul(probs, v)` at `root`.
fn find(g: &Graph, root: NodeId) -> Option<Found> {
    let node = g.node(root);
    let attrs = node.attrs()?;
    if node.op()? != Op::Matmul || flag(attrs, "transpose_a") || flag(attrs, "transpose_b") {
        return None;
    }
    let [probs, v] = g.inputs(root)[..] else {
        return None;
    };
    let mut absorbed = Vec::new();
    // Softmax, possibly between an up-cast and a cast back to the scores' dtype.
    let (probs, back) = peel_cast(g, probs, &mut absorbed);
    let (sm_attrs, sm_in) = step(g, probs, Op::Softmax)?;
    absorbed.push(probs.node);
    let axis = sm_attrs.int("axis").ok()?;
    if axis != -1 && axis != g.ty(probs).rank() as i64 - 1 {
        return None;
    }
    let (scores, up) = peel_cast(g, *sm_in.first()?, &mut absorbed);
    match (up, back) {
        (None, None) => {}
        (Some(up), Some(back)) => {
            let dt = g.ty(scores).dtype;
            if back != dt || !up.is_float() || up.size_bytes() < dt.size_bytes() {
                return None;
            }
        }
        _ => return None,
    }
    // Optional causal mask.
    let (scaled, causal) = match step(g, scores, Op::Add) {
        Some((_, ops)) if ops.len() == 2 => {
            let is_mask = |m: ValueRef, s: ValueRef| {
                let size = g.ty(s).shape.last().copied();
                matches!(producer(g, m), Some((Op::CausalMask, a)) if a.int("size").ok() == size)
                    && g.ty(s) == g.ty(scores)
            };
            let s = if is_mask(ops[1], ops[0]) {
                ops[0]
            } else if is_mask(ops[0], ops[1]) {
                ops[1]
            } else {
                return None;
            };
            absorbed.push(scores.node);
            (s, true)
        }
        _ => (scores, false),
    };
    // Scale: a multiplication or division by a scalar constant.
    let (op, _) = producer(g, scaled)?;
    let (_, ops) = step(g, scaled, op)?;
    let [a, b] = ops[..] else { return None };
    let (raw, scale) = match op {
        Op::Mul => match (scalar_constant(g, a), scalar_constant(g, b)) {
            (_, Some(c)) => (a, c),
            (Some(c), _) => (b, c),
            _ => return None,
        },
        Op::Div => (a, 1.0 / scalar_constant(g, b)?),
        _ => return None,
    };
    if g.ty(raw) != g.ty(scaled) || !scale.is_finite() {
        return None;
    }
    absorbed.push(scaled.node);
    // The scores: q @ k^T.
    let (mm, qk) = step(g, raw, Op::Matmul)?;
    if flag(mm, "transpose_a") || !flag(mm, "transpose_b") {
        return None;
    }
    let [q, k] = qk[..] else { return None };
    absorbed.push(raw.node);
    let (tq, tk, tv) = (g.ty(q), g.ty(k), g.ty(v));
    let fits = tq.rank() == 4
        && tk.rank() == 4
        && tk.shape == tv.shape
        && tq.shape[..2] == tk.shape[..2]
        && tq.shape[3] == tk.shape[3]
        && tq.dtype == tk.dtype
        && tk.dtype == tv.dtype
        && (!causal || tq.shape[2] == tk.shape[2]);
    fits.then_some(Found {
        q,
        k,
        v,
        scale,
        causal,
        absorbed,
    })
}

/// The `[0, 2, 1, 3]` transpose between `[B, N, S, D]` and `[B, S, N, D]` (its own inverse).
fn heads_transpose() -> Attrs {
    Attrs::new().with("perm", vec![0, 2, 1, 3])
}

/// Fuses every explicit attention.
pub(super) fn run(g: &mut Graph, _: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    for root in topo(g)? {
        if !g.contains(root) {
            continue;
        }
        let Some(f) = find(g, root) else {
            continue;
        };
        let mut to_sbnd = |x| add_helper(g, root, Op::Transpose, heads_transpose(), &[x]);
        let (q, k, v) = (to_sbnd(f.q)?, to_sbnd(f.k)?, to_sbnd(f.v)?);
        let attrs = Attrs::new().with("causal", f.causal).with("scale", f.scale);
        let att = add_like(g, root, Op::Attention, attrs, &[q, k, v])?;
        let out = add_helper(g, root, Op::Transpose, heads_transpose(), &[att])?;
        replace_with(g, root, out);
        for n in f.absorbed {
            g.remove_node(n);
        }
        stats.record(NAME, "attention");
    }
    Ok(())
}
