//! A transpose that swaps the last two dims of a matmul operand becomes the matmul's
//! `transpose_a` / `transpose_b` flag (the transpose stays only if something else reads it);
//! a transpose that also moves other dims keeps only that other part, e.g. the `[0, 2, 3, 1]`
//! of `split_heads(k).T` becomes the flag after a `[0, 2, 1, 3]` head split. A transpose of a
//! matmul's result that nothing else reads becomes the matmul with its operands swapped,
//! (A·B)ᵀ = Bᵀ·Aᵀ: the weight gradient `(xᵀ·dy)ᵀ` of a linear layer is then computed as `dyᵀ·x`
//! directly in the weight's `[out, in]` layout, with no transpose pass over it.

use super::{topo, NAME};
use crate::passes::rewrite::{add_helper, producer, rebuild, single_use};
use crate::passes::{PassContext, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::family::layout::permutation;
use mslc_core::ops::{Attrs, Op, OpError};

/// How a matmul operand `v` can absorb the transpose producing it: the transpose's input and
/// the transpose left to apply (`None` when nothing is left). A transpose whose last two
/// output dims come from its input in reversed order is that transpose with those two dims
/// swapped back, followed by a swap of the last two dims, which the matmul's flag does. The
/// remainder then keeps the last two in order, so a second run changes nothing.
fn absorbable(g: &Graph, v: ValueRef) -> Option<(ValueRef, Option<Vec<i64>>)> {
    let (Op::Transpose, attrs) = producer(g, v)? else {
        return None;
    };
    let rank = g.ty(v).rank();
    let mut perm = permutation(attrs, rank).ok()?;
    if rank < 2 || perm[rank - 2] < perm[rank - 1] {
        return None;
    }
    perm.swap(rank - 2, rank - 1);
    let input = *g.inputs(v.node).first()?;
    if perm.iter().enumerate().all(|(i, p)| i == *p) {
        return Some((input, None));
    }
    // Replacing a shared transpose by another would add an op.
    single_use(g, v).then(|| (input, Some(perm.iter().map(|&p| p as i64).collect())))
}

/// Whether `perm` swaps the last two of its dims and keeps the others in place.
fn swaps_last_two(perm: &[usize]) -> bool {
    let rank = perm.len();
    rank >= 2
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
        && perm[..rank - 2].iter().enumerate().all(|(i, p)| i == *p)
}

/// The swapped product replacing transpose node `id`, when it swaps the last two dims of a
/// plain `matmul` of operands of rank ≥ 2 that nothing else reads: its flags and operands.
fn swapped_product(g: &Graph, id: NodeId) -> Option<(Attrs, [ValueRef; 2])> {
    let node = g.node(id);
    if node.op()? != Op::Transpose {
        return None;
    }
    let product = *g.inputs(id).first()?;
    let perm = permutation(node.attrs()?, g.ty(product).rank()).ok()?;
    let (Op::Matmul, attrs) = producer(g, product)? else {
        return None;
    };
    let operands = g.inputs(product.node);
    let [a, b] = operands[..] else {
        return None;
    };
    if !swaps_last_two(&perm) || !single_use(g, product) || g.ty(a).rank() < 2 || g.ty(b).rank() < 2
    {
        return None;
    }
    let mut attrs = attrs.clone();
    let (ta, tb) = (
        attrs.bool("transpose_a").ok()?,
        attrs.bool("transpose_b").ok()?,
    );
    attrs.insert("transpose_a", !tb);
    attrs.insert("transpose_b", !ta);
    Some((attrs, [b, a]))
}

/// Folds swapping transposes into every `matmul` and `fused_matmul`, and transposed matmul
/// results into swapped matmuls.
pub(super) fn run(g: &mut Graph, _: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    for id in topo(g)? {
        if let Some((attrs, operands)) = swapped_product(g, id) {
            let product = g.inputs(id)[0].node;
            rebuild(g, id, Op::Matmul, attrs, &operands)?;
            g.remove_node(product);
            stats.record(NAME, "matmul_transpose");
            continue;
        }
        let node = g.node(id);
        let (Some(op @ (Op::Matmul | Op::FusedMatmul)), Some(attrs)) = (node.op(), node.attrs())
        else {
            continue;
        };
        let mut attrs = attrs.clone();
        let mut inputs = g.inputs(id);
        if inputs.len() < 2 {
            continue;
        }
        let mut changed = false;
        for (slot, flag) in [(0, "transpose_a"), (1, "transpose_b")] {
            if let Some((inner, rest)) = absorbable(g, inputs[slot]) {
                let was = attrs.bool(flag)?;
                attrs.insert(flag, !was);
                inputs[slot] = match rest {
                    None => inner,
                    Some(perm) => {
                        let attrs = Attrs::new().with("perm", perm);
                        add_helper(g, inputs[slot].node, Op::Transpose, attrs, &[inner])?
                    }
                };
                changed = true;
                stats.record(NAME, "transpose_matmul");
            }
        }
        if changed {
            rebuild(g, id, op, attrs, &inputs)?;
        }
    }
    Ok(())
}
