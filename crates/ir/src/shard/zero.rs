//! Optimizer sharding (ZeRO, Rajbhandari et al. 2020; MindSpore's `optimizer_shard` levels)
//! as rewrites of one data-parallel replica's training graph. Every trained tensor is laid out
//! flat and **padded** with zeros to `ranks × chunk` values (`chunk = ⌈numel / ranks⌉`);
//! member i of the data-parallel group owns values `[i·chunk, (i+1)·chunk)`. The padding is
//! zero in the parameter, its gradient and its optimizer states, and stays zero through
//! SGD, Adam and AdamW (a zero gradient, state and weight give a zero update), so it never
//! changes the global gradient norm nor a real value.
//!
//! - level 1 — each rank keeps and updates only its slice of the optimizer states and of the
//!   parameter's update ([`select_slice`] of the all-reduced gradient and of the parameter),
//!   then the updated slices are all-gathered ([`gather_whole`]);
//! - level 2 — the gradients are reduce-scattered ([`scatter_grad`]) instead of all-reduced:
//!   each rank holds only its gradient slice;
//! - level 3 — the parameters themselves are held as slices ([`shard_params`]), all-gathered
//!   where the forward uses them and gathered again where the backward does
//!   ([`regather_in_backward`]), so no whole copy lives across the step; the gradient of the
//!   forward's `all_gather` is a `reduce_scatter` (the ops' conjugate gradient rules), which is
//!   level 2's gradient slice.
//!
//! Every exchange is one of the IR's collective ops over the data-parallel mesh axis, so the
//! planner's count of collectives and the program agree.

use std::collections::{BTreeMap, HashSet};

use mslc_core::ops::{Attrs, Op, TensorType};

use super::{Group, ShardError};
use crate::graph::{Graph, NodeId, ValueRef};

/// How a training step shards its trained tensors over the data-parallel group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZeroShard {
    /// The `optimizer_shard` level, 1–3.
    pub level: u8,
    /// The data-parallel group the slices are spread over.
    pub group: Group,
    /// Each trained parameter's shape on this rank before the slicing (its tensor-parallel
    /// shard, or the whole parameter), by path.
    pub shapes: BTreeMap<String, Vec<usize>>,
}

impl ZeroShard {
    /// Values per slice of a tensor of `numel` values.
    pub fn chunk(&self, numel: usize) -> usize {
        numel.div_ceil(self.group.ranks.max(1))
    }

    /// The values of a flat tensor of `numel` that member `index`'s slice holds (the rest of
    /// its [`ZeroShard::chunk`] values, past the tensor's end, are zero).
    pub fn range(&self, numel: usize, index: usize) -> std::ops::Range<usize> {
        let chunk = self.chunk(numel);
        let start = index.saturating_mul(chunk).min(numel);
        start..start.saturating_add(chunk).min(numel)
    }

    /// Member `index`'s slice of the flat `values` (zero past their end).
    pub fn slice(&self, values: &[f32], index: usize) -> Vec<f32> {
        let mut out = values[self.range(values.len(), index)].to_vec();
        out.resize(self.chunk(values.len()), 0.0);
        out
    }

    /// Whether the parameters themselves are held as slices (level 3).
    pub fn shards_params(&self) -> bool {
        self.level >= 3
    }

    /// Whether parameter `path` is held as a slice: a trained parameter at level 3.
    pub fn slices_param(&self, path: &str) -> bool {
        self.shards_params() && self.shapes.contains_key(path)
    }
}

/// The module input holding this rank's coordinate on the data-parallel axis (an `i32`
/// scalar): levels 1 and 2 select their slice of a replicated tensor with it.
pub const DP_INDEX: &str = "train.dp_index";

fn op1(g: &mut Graph, op: Op, attrs: Attrs, inputs: &[ValueRef]) -> Result<ValueRef, ShardError> {
    g.add_op(op, attrs, inputs, "train")
        .map(|v| v[0])
        .map_err(|e| ShardError(format!("{op}: {}", e.message)))
}

fn numel(ty: &TensorType) -> usize {
    ty.shape.iter().product::<i64>().max(0) as usize
}

/// `v` flattened and padded with zeros to `ranks × chunk` values.
pub fn flat_padded(g: &mut Graph, v: ValueRef, ranks: usize) -> Result<ValueRef, ShardError> {
    let ty = g.ty(v).clone();
    let n = numel(&ty);
    let padded = n.div_ceil(ranks.max(1)) * ranks.max(1);
    let flat = op1(
        g,
        Op::Reshape,
        Attrs::new().with("shape", vec![n as i64]),
        &[v],
    )?;
    if padded == n {
        return Ok(flat);
    }
    let zero = op1(
        g,
        Op::Constant,
        Attrs::new().with("value", 0.0).with("dtype", ty.dtype),
        &[],
    )?;
    let zero = op1(
        g,
        Op::Reshape,
        Attrs::new().with("shape", vec![1i64]),
        &[zero],
    )?;
    let zeros = op1(
        g,
        Op::BroadcastTo,
        Attrs::new().with("shape", vec![(padded - n) as i64]),
        &[zero],
    )?;
    op1(
        g,
        Op::Concat,
        Attrs::new().with("axis", 0i64),
        &[flat, zeros],
    )
}

/// This rank's slice of the replicated `v` (same on every member): row `index` of its
/// [`flat_padded`] values seen as `[ranks, chunk]`, `index` the [`DP_INDEX`] input.
pub fn select_slice(
    g: &mut Graph,
    v: ValueRef,
    index: ValueRef,
    ranks: usize,
) -> Result<ValueRef, ShardError> {
    let flat = flat_padded(g, v, ranks)?;
    let chunk = numel(g.ty(flat)) / ranks.max(1);
    let table = op1(
        g,
        Op::Reshape,
        Attrs::new().with("shape", vec![ranks as i64, chunk as i64]),
        &[flat],
    )?;
    op1(g, Op::Embedding, Attrs::new(), &[index, table])
}

/// The sum of every member's `g` over `group`, of which this rank keeps its slice: one
/// `reduce_scatter` of the [`flat_padded`] gradient.
pub fn scatter_grad(g: &mut Graph, grad: ValueRef, group: &Group) -> Result<ValueRef, ShardError> {
    let flat = flat_padded(g, grad, group.ranks)?;
    op1(
        g,
        Op::ReduceScatter,
        group.attrs().with("dim", 0i64),
        &[flat],
    )
}

/// The whole tensor of shape `shape` whose slices the members hold (this rank's is `slice`):
/// an `all_gather`, the padding cut off, reshaped.
pub fn gather_whole(
    g: &mut Graph,
    slice: ValueRef,
    shape: &[usize],
    group: &Group,
) -> Result<ValueRef, ShardError> {
    let gathered = op1(g, Op::AllGather, group.attrs().with("dim", 0i64), &[slice])?;
    let n: usize = shape.iter().product();
    let cut = if numel(g.ty(gathered)) == n {
        gathered
    } else {
        let attrs = Attrs::new()
            .with("axis", 0i64)
            .with("start", 0i64)
            .with("end", n as i64);
        op1(g, Op::Slice, attrs, &[gathered])?
    };
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    op1(g, Op::Reshape, Attrs::new().with("shape", shape), &[cut])
}

/// A level-3 parameter: its slice (the parameter node) and the value its readers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardedParam {
    /// The parameter, now this rank's slice.
    pub slice: ValueRef,
    /// The whole parameter the forward gathers from it.
    pub whole: ValueRef,
}

/// Level 3: makes each parameter of `params` (path, value) this rank's slice of it and puts an
/// all-gather between the slice and every reader. Returns, per parameter in order, its
/// whole shape and the gathered value.
pub fn shard_params(
    g: &mut Graph,
    params: &[(String, ValueRef)],
    group: &Group,
) -> Result<Vec<(Vec<usize>, ShardedParam)>, ShardError> {
    let mut out = Vec::with_capacity(params.len());
    for (_, p) in params {
        let ty = g.ty(*p).clone();
        let shape: Vec<usize> = ty.shape.iter().map(|&d| d.max(0) as usize).collect();
        let readers = g.users(*p);
        let chunk = numel(&ty).div_ceil(group.ranks.max(1));
        g.node_mut(p.node).outputs[0] = TensorType::new(ty.dtype, vec![chunk as i64]);
        let whole = gather_whole(g, *p, &shape, group)?;
        for (user, slot) in readers {
            g.set_input(user, slot, whole);
        }
        out.push((shape, ShardedParam { slice: *p, whole }));
    }
    Ok(out)
}

/// Level 3, after the backward was added: the nodes not in `forward` that read a gathered
/// parameter — or a layout view of it the forward made (a transpose, reshape or cast of it
/// alone) — read a second all-gather of its slice (and the same views of that) instead, so
/// the forward's copy is freed after its last forward use and the backward's copy lives only
/// around its own uses.
pub fn regather_in_backward(
    g: &mut Graph,
    sharded: &[(Vec<usize>, ShardedParam)],
    forward: &HashSet<NodeId>,
    group: &Group,
) -> Result<(), ShardError> {
    for (shape, p) in sharded {
        // The forward's views of the whole parameter, producers first.
        let mut views = vec![p.whole];
        let mut i = 0;
        while i < views.len() {
            for (user, _) in g.users(views[i]) {
                let view = ValueRef {
                    node: user,
                    index: 0,
                };
                let layout = matches!(
                    g.node(user).op(),
                    Some(Op::Transpose | Op::Reshape | Op::Cast)
                );
                if layout && forward.contains(&user) && !views.contains(&view) {
                    views.push(view);
                }
            }
            i += 1;
        }
        let mut copies: Vec<(ValueRef, ValueRef)> = Vec::new();
        for &view in &views {
            let readers: Vec<(NodeId, u32)> = g
                .users(view)
                .into_iter()
                .filter(|(n, _)| !forward.contains(n))
                .collect();
            if readers.is_empty() {
                continue;
            }
            let again = copy_view(g, view, p, shape, group, &mut copies)?;
            for (user, slot) in readers {
                g.set_input(user, slot, again);
            }
        }
    }
    Ok(())
}

/// The backward's copy of `view` (the gathered parameter or a layout op chain on it), made
/// once and remembered in `copies`.
fn copy_view(
    g: &mut Graph,
    view: ValueRef,
    p: &ShardedParam,
    shape: &[usize],
    group: &Group,
    copies: &mut Vec<(ValueRef, ValueRef)>,
) -> Result<ValueRef, ShardError> {
    if let Some((_, c)) = copies.iter().find(|(v, _)| *v == view) {
        return Ok(*c);
    }
    let copy = if view == p.whole {
        gather_whole(g, p.slice, shape, group)?
    } else {
        let node = g.node(view.node).clone();
        let (Some(op), Some(attrs)) = (node.op(), node.attrs().cloned()) else {
            return Err(ShardError("a view of a parameter is not an op".to_string()));
        };
        let input = copy_view(g, g.inputs(view.node)[0], p, shape, group, copies)?;
        g.add_op(op, attrs, &[input], &node.origin)
            .map(|v| v[0])
            .map_err(|e| ShardError(format!("{op}: {}", e.message)))?
    };
    copies.push((view, copy));
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::collectives;
    use crate::verify;
    use mslc_core::ops::DType;
    use mslc_core::program::Init;

    #[test]
    fn slices_are_padded_to_equal_chunks() {
        let z = ZeroShard {
            level: 1,
            group: Group {
                axis: "dp".to_string(),
                ranks: 4,
            },
            shapes: BTreeMap::new(),
        };
        let v: Vec<f32> = (1..=6).map(|x| x as f32).collect();
        assert_eq!(z.chunk(6), 2);
        assert_eq!(z.slice(&v, 2), vec![5.0, 6.0]);
        assert_eq!(z.slice(&v, 3), vec![0.0, 0.0]);
        let z3 = ZeroShard { level: 3, ..z };
        assert_eq!(z3.chunk(7), 2);
        assert_eq!(z3.slice(&v[..5], 2), vec![5.0, 0.0]);
        assert!(z3.shards_params());
    }

    #[test]
    fn level_three_gathers_a_sliced_parameter_for_its_readers() {
        let mut g = Graph::new("t");
        let w = g.add_param("w", TensorType::new(DType::F32, [3, 3]), Init::Zeros, true);
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 3]));
        let y = g.add_op(Op::Matmul, Attrs::new(), &[x, w], "y").unwrap()[0];
        let s = g.add_op(Op::Sum, Attrs::new(), &[y], "loss").unwrap()[0];
        g.set_output("loss", s);
        let done = shard_params(&mut g, &[("w".to_string(), w)], &Group::new("dp", 2)).unwrap();
        verify(&g).unwrap();
        // 9 values in slices of 5: the gather returns 10, cut to 9 and reshaped.
        assert_eq!(g.ty(w).shape, vec![5]);
        assert_eq!(done[0].0, vec![3, 3]);
        assert_eq!(g.ty(done[0].1.whole).shape, vec![3, 3]);
        assert_eq!(g.inputs(y.node)[1], done[0].1.whole);
        assert_eq!(collectives(&g), vec![(Op::AllGather, "dp".to_string(), 20)]);
        // The gradient slice of a whole one: padded to 10, reduce-scattered to 5.
        let grad = scatter_grad(&mut g, y, &Group::new("dp", 2)).unwrap();
        assert_eq!(g.ty(grad).shape, vec![3]);
        let index = g.add_input(DP_INDEX, TensorType::new(DType::I32, vec![]));
        let picked = select_slice(&mut g, w, index, 2).unwrap();
        assert_eq!(g.ty(picked).shape, vec![3]);
    }
}
