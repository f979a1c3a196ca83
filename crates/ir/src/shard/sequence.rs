//! Megatron's sequence parallelism (Korthikanti et al. 2022, §4.2.2) on top of its tensor
//! parallelism ([`super::tensor`]): the ops between a row-parallel matmul's output and the next
//! column-parallel matmul's input — residual adds, norms, dropout, any op that treats each
//! sequence position on its own — run on 1/n of the sequence dim per rank instead of on the
//! whole, replicated tensor. Megatron's `g` (the `all_reduce` after o/down) becomes a
//! `reduce_scatter` along the sequence dim and its `f` (the `parallel_copy` in front of q/k/v and
//! gate/up) an `all_gather` along it; applied before autodiff, their gradients swap (the ops'
//! conjugate rules), so a layer has two all-gathers and two reduce-scatters each way and no
//! all-reduce of activations.
//!
//! The region is found, not assumed: starting from the `all_reduce`s and from the inputs of the
//! `parallel_copy`s, it grows through *row-local* ops (elementwise ops, casts, dropout, norms
//! over the last dim) forwards and backwards, each value keeping one sequence dim (the
//! second-last of the seeds, `S` of `[B, S, H]`). Where it starts at a value no row-local op
//! made (the embedding's output, a parameter), a `rank_slice` cuts this rank's block; where a
//! sharded value leaves it (the head after the final norm, an output), an `all_gather` whose
//! gradient is this rank's block of the replicated cotangent (`replicated_grad`) makes it whole.
//! A whole operand broadcast into the region (a norm's weight) is read through `parallel_copy`,
//! so its gradient, a sum over this rank's positions only, is all-reduced over the group. A
//! dropout in the region draws its mask at its elements' positions in the whole sequence
//! ([`Group::split_dropout`]), so the ranks' masks are one device's.
//! An op outside the region that reads a sharded value and feeds the region again (attention
//! over the residual stream, a mean over the sequence) mixes positions: refused, naming it.

use std::collections::{HashMap, HashSet};

use mslc_core::ops::{self, Op};

use super::tensor::{split_features, SplitParams};
use super::{retype, Group, ShardError};
use crate::graph::{Graph, NodeId, NodeKind, ValueRef};

/// Rewrites `graph` into one rank's program of the tensor-parallel `group` with sequence
/// parallelism: [`super::tensor::tensor_parallel`] for the parameters of `splits`, then the
/// region between each row-parallel output and the next column-parallel input on this rank's
/// 1/n of the sequence (see the module comment). Returns what `tensor_parallel` returns. An
/// error names the op that mixes sequence positions inside the region, a sequence dim that
/// does not divide, or a value the region would split twice.
pub fn sequence_parallel(
    graph: &mut Graph,
    splits: &std::collections::BTreeMap<String, usize>,
    group: &Group,
) -> Result<SplitParams, ShardError> {
    let (params, features) = split_features(graph, splits, group)?;
    let region = Region::find(graph, group, &features)?;
    region.refuse_mixing(graph, group)?;
    region.rewrite(graph, group)?;
    Ok(params)
}

/// Whether `op` treats every position of the dims before the last on its own, so it runs on a
/// block of them: an elementwise op, a cast, dropout, a norm over the last dim.
fn row_local(op: Op) -> bool {
    op.unary().is_some()
        || op.binary().is_some()
        || matches!(
            op,
            Op::Cast
                | Op::Dropout
                | Op::RmsNorm
                | Op::LayerNorm
                | Op::RmsNormScale
                | Op::LayerNormAffine
        )
}

/// Whether `op` normalises over the last dim (which must then stay whole).
fn is_norm(op: Op) -> bool {
    matches!(
        op,
        Op::RmsNorm | Op::LayerNorm | Op::RmsNormScale | Op::LayerNormAffine
    )
}

/// Whether node `id` is the collective `op` over the group's axis.
fn is_group_op(graph: &Graph, id: NodeId, op: Op, group: &Group) -> bool {
    let node = graph.node(id);
    node.op() == Some(op)
        && node
            .attrs()
            .and_then(|a| a.str("axis").ok())
            .is_some_and(|axis| axis == group.axis)
}

fn row_local_node(graph: &Graph, id: NodeId) -> bool {
    graph.node(id).op().is_some_and(row_local)
}

/// The dim of an operand of rank `operand` that lines up (numpy broadcasting, from the right)
/// with dim `d` of a result of rank `result`; `None` when the operand has no such dim.
fn aligned(d: usize, result: usize, operand: usize) -> Option<usize> {
    (d + operand).checked_sub(result)
}

/// The values split along the sequence (value → its sequence dim), and the group size.
struct Region {
    seq: HashMap<ValueRef, usize>,
    /// The `all_reduce`s over the group (Megatron's `g`), each becoming a `reduce_scatter`.
    reduces: HashSet<NodeId>,
    n: i64,
}

impl Region {
    /// Grows the region from its seeds through row-local ops (forwards and backwards).
    fn find(
        graph: &Graph,
        group: &Group,
        features: &HashMap<ValueRef, usize>,
    ) -> Result<Region, ShardError> {
        let order = graph
            .topo_order()
            .ok_or_else(|| ShardError("the graph has a cycle".to_string()))?;
        let mut region = Region {
            seq: HashMap::new(),
            reduces: HashSet::new(),
            n: group.ranks as i64,
        };
        let mut work = Vec::new();
        for &id in &order {
            let v = ValueRef { node: id, index: 0 };
            if is_group_op(graph, id, Op::AllReduce, group) {
                region.reduces.insert(id);
                region.seed(graph, v, &mut work)?;
            } else if is_group_op(graph, id, Op::ParallelCopy, group) {
                let x = graph.inputs(id)[0];
                if row_local_node(graph, x.node) {
                    region.seed(graph, x, &mut work)?;
                }
            }
        }
        while let Some(v) = work.pop() {
            if features.contains_key(&v) {
                return Err(refusal(
                    graph,
                    v.node,
                    "would split a tensor along the sequence that is already split over \
                     features",
                ));
            }
            let d = region.seq[&v];
            let rank = graph.ty(v).rank();
            // Forwards: a row-local reader's result is split along the matching dim.
            for (user, _) in graph.users(v) {
                if row_local_node(graph, user) {
                    let out = ValueRef {
                        node: user,
                        index: 0,
                    };
                    let out_rank = graph.ty(out).rank();
                    region.add(graph, out, d + out_rank - rank, &mut work)?;
                }
            }
            // Backwards: every operand of a row-local producer that is not broadcast along d.
            if row_local_node(graph, v.node) {
                let op = graph.node(v.node).op().unwrap_or(Op::Add);
                if is_norm(op) && d + 1 == rank {
                    return Err(refusal(
                        graph,
                        v.node,
                        "normalises over the dim the sequence is split along",
                    ));
                }
                for x in graph.inputs(v.node) {
                    let ty = graph.ty(x);
                    if let Some(dx) = aligned(d, rank, ty.rank()) {
                        if ty.shape[dx] != 1 {
                            region.add(graph, x, dx, &mut work)?;
                        }
                    }
                }
            }
        }
        Ok(region)
    }

    /// Adds a seed: `v` split along its second-last dim.
    fn seed(
        &mut self,
        graph: &Graph,
        v: ValueRef,
        work: &mut Vec<ValueRef>,
    ) -> Result<(), ShardError> {
        let rank = graph.ty(v).rank();
        if rank < 2 {
            return Err(refusal(
                graph,
                v.node,
                "has no sequence dim (it is not [.., S, H])",
            ));
        }
        self.add(graph, v, rank - 2, work)
    }

    fn add(
        &mut self,
        graph: &Graph,
        v: ValueRef,
        d: usize,
        work: &mut Vec<ValueRef>,
    ) -> Result<(), ShardError> {
        match self.seq.get(&v) {
            Some(&had) if had == d => return Ok(()),
            Some(&had) => {
                return Err(refusal(
                    graph,
                    v.node,
                    &format!("would be split along dims {had} and {d} at once"),
                ))
            }
            None => {}
        }
        let size = graph.ty(v).shape.get(d).copied().unwrap_or(0);
        if size == 0 || size % self.n != 0 {
            return Err(refusal(
                graph,
                v.node,
                &format!(
                    "has a sequence dim {d} of size {size}, which does not split into {} ranks",
                    self.n
                ),
            ));
        }
        self.seq.insert(v, d);
        work.push(v);
        Ok(())
    }

    /// Whether node `id` runs on the block: a row-local op whose result is split.
    fn runs_split(&self, graph: &Graph, id: NodeId) -> bool {
        row_local_node(graph, id) && self.seq.contains_key(&ValueRef { node: id, index: 0 })
    }

    /// Whether split value `v` is made inside the region (a row-local op or a `g`), not cut
    /// from a whole value made outside it.
    fn made_split(&self, graph: &Graph, v: ValueRef) -> bool {
        self.runs_split(graph, v.node) || self.reduces.contains(&v.node)
    }

    /// Refuses an op outside the region that reads a split value and whose result flows back
    /// into the region: it would need the whole sequence in the middle of the region.
    fn refuse_mixing(&self, graph: &Graph, group: &Group) -> Result<(), ShardError> {
        let order = graph.topo_order().unwrap_or_default();
        // Nodes from which a node of the region is reachable.
        let mut feeds: HashSet<NodeId> = HashSet::new();
        for &id in order.iter().rev() {
            let reaches = graph.consumers(id).into_iter().any(|c| {
                self.runs_split(graph, c) || self.reduces.contains(&c) || feeds.contains(&c)
            });
            if reaches {
                feeds.insert(id);
            }
        }
        let mut made: Vec<ValueRef> = self
            .seq
            .keys()
            .copied()
            .filter(|v| self.made_split(graph, *v))
            .collect();
        made.sort_by_key(|v| (v.node, v.index));
        for v in made {
            for (user, _) in graph.users(v) {
                let inside = self.runs_split(graph, user)
                    || is_group_op(graph, user, Op::ParallelCopy, group);
                if !inside && feeds.contains(&user) {
                    return Err(refusal(
                        graph,
                        user,
                        "reads the sequence-split stream between two layers' matmuls and mixes \
                         its positions",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Makes the region run on this rank's block: cuts at its entries, `reduce_scatter` for
    /// `g`, `all_gather` for `f` and at its exits, `parallel_copy` on broadcast operands.
    fn rewrite(&self, graph: &mut Graph, group: &Group) -> Result<(), ShardError> {
        let order = graph
            .topo_order()
            .ok_or_else(|| ShardError("the graph has a cycle".to_string()))?;
        // Entries: whole values the region reads, cut to this rank's block.
        let mut entries: Vec<(ValueRef, usize)> = self
            .seq
            .iter()
            .filter(|(v, _)| !self.made_split(graph, **v))
            .map(|(v, d)| (*v, *d))
            .collect();
        entries.sort_by_key(|(v, _)| (v.node, v.index));
        for (v, d) in entries {
            if !graph.ty(v).dtype.is_float() {
                return Err(refusal(
                    graph,
                    v.node,
                    "makes a non-float tensor the sequence-split region reads",
                ));
            }
            let readers: Vec<(NodeId, u32)> = graph
                .users(v)
                .into_iter()
                .filter(|(u, _)| self.runs_split(graph, *u))
                .collect();
            let origin = graph.node(v.node).origin.clone();
            let cut = add1(graph, Op::RankSlice, group.along(d), v, &origin)?;
            for (user, slot) in readers {
                graph.set_input(user, slot, cut);
            }
        }
        // The region itself, in order, so every operand is retyped before its readers.
        let mut copies: HashMap<ValueRef, ValueRef> = HashMap::new();
        for id in order {
            let v = ValueRef { node: id, index: 0 };
            let (op, attrs) = if self.reduces.contains(&id) {
                (Op::ReduceScatter, group.along(self.seq[&v]))
            } else if self.runs_split(graph, id) {
                let node = graph.node(id);
                let (Some(op), Some(attrs)) = (node.op(), node.attrs().cloned()) else {
                    continue;
                };
                self.copy_broadcast_operands(graph, id, group, &mut copies)?;
                match op {
                    Op::Dropout => (op, group.split_dropout(attrs, self.seq[&v])),
                    _ => (op, attrs),
                }
            } else {
                continue;
            };
            retype(graph, id, op, attrs)?;
        }
        // Exits: `f` gathers for the column-parallel matmul; everything else gets the whole.
        let mut made: Vec<(ValueRef, usize)> = self
            .seq
            .iter()
            .filter(|(v, _)| self.made_split(graph, **v))
            .map(|(v, d)| (*v, *d))
            .collect();
        made.sort_by_key(|(v, _)| (v.node, v.index));
        for (v, d) in made {
            let mut gathered = None;
            for (user, slot) in graph.users(v) {
                if self.runs_split(graph, user) {
                    continue;
                }
                if is_group_op(graph, user, Op::ParallelCopy, group) {
                    retype(graph, user, Op::AllGather, group.along(d))?;
                    continue;
                }
                let whole = match gathered {
                    Some(g) => g,
                    None => {
                        let origin = graph.node(v.node).origin.clone();
                        let attrs = group.along(d).with("replicated_grad", true);
                        *gathered.insert(add1(graph, Op::AllGather, attrs, v, &origin)?)
                    }
                };
                graph.set_input(user, slot, whole);
            }
            if graph.is_output(v) {
                let whole = match gathered {
                    Some(g) => g,
                    None => {
                        let origin = graph.node(v.node).origin.clone();
                        let attrs = group.along(d).with("replicated_grad", true);
                        add1(graph, Op::AllGather, attrs, v, &origin)?
                    }
                };
                for (_, o) in &mut graph.outputs {
                    if *o == v {
                        *o = whole;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads every whole float operand of region node `id` (broadcast along the sequence: a
    /// norm's weight, a bias) through one `parallel_copy`, so its gradient — this rank's
    /// positions' share — is summed over the group.
    fn copy_broadcast_operands(
        &self,
        graph: &mut Graph,
        id: NodeId,
        group: &Group,
        copies: &mut HashMap<ValueRef, ValueRef>,
    ) -> Result<(), ShardError> {
        for (slot, x) in graph.inputs(id).into_iter().enumerate() {
            let producer = graph.node(x.node);
            let split = self.seq.contains_key(&x) || producer.op() == Some(Op::RankSlice);
            if split || !graph.ty(x).dtype.is_float() || producer.op() == Some(Op::Constant) {
                continue;
            }
            let copy = match copies.get(&x) {
                Some(c) => *c,
                None => {
                    let origin = producer.origin.clone();
                    let c = add1(graph, Op::ParallelCopy, group.attrs(), x, &origin)?;
                    copies.insert(x, c);
                    c
                }
            };
            graph.set_input(id, slot as u32, copy);
        }
        Ok(())
    }
}

/// Adds `op(x)` and returns its result.
fn add1(
    graph: &mut Graph,
    op: Op,
    attrs: ops::Attrs,
    x: ValueRef,
    origin: &str,
) -> Result<ValueRef, ShardError> {
    graph
        .add_op(op, attrs, &[x], origin)
        .map(|v| v[0])
        .map_err(|e| ShardError(format!("`{op}` in `{origin}`: {}", e.message)))
}

/// The refusal of the op making (or reading) node `id`'s value.
fn refusal(graph: &Graph, id: NodeId, why: &str) -> ShardError {
    let node = graph.node(id);
    let what = match &node.kind {
        NodeKind::Op { op, .. } => format!("`{op}`"),
        NodeKind::Param { path, .. } => format!("parameter `{path}`"),
        NodeKind::Input { name, .. } => format!("input `{name}`"),
    };
    ShardError(format!(
        "{what} in `{}` {why}; sequence parallelism splits only the residual stream's \
         row-wise ops (adds, norms, dropout) between the layers' matmuls",
        node.origin
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::verify;
    use mslc_core::ops::{Attrs, DType, TensorType};
    use mslc_core::program::Init;

    /// One pre-norm block over x [2, 4, 8] (B, S, H) and a head: `h = x +
    /// dropout(w2(relu(w1(norm(x) · s1))))`, `y = norm(h) · s2 @ headᵀ`; w1 [16, 8] column parallel, w2 [8, 16] row
    /// parallel. With `mix`, `h` is also added to its own mean over the sequence before the
    /// final norm.
    fn block(mix: bool) -> Graph {
        let mut g = Graph::new("t");
        let f32t = |s: &[i64]| TensorType::new(DType::F32, s.to_vec());
        let x = g.add_input("x", f32t(&[2, 4, 8]));
        let param =
            |g: &mut Graph, name: &str, s: &[i64]| g.add_param(name, f32t(s), Init::Zeros, true);
        let (s1, s2) = (param(&mut g, "s1", &[8]), param(&mut g, "s2", &[8]));
        let w1 = param(&mut g, "w1", &[16, 8]);
        let w2 = param(&mut g, "w2", &[8, 16]);
        let head = param(&mut g, "head", &[8, 8]);
        let op = |g: &mut Graph, op: Op, attrs: Attrs, xs: &[ValueRef]| {
            g.add_op(op, attrs, xs, "blk").unwrap()[0]
        };
        let t = |g: &mut Graph, w| {
            op(
                g,
                Op::Transpose,
                Attrs::new().with("perm", vec![1i64, 0]),
                &[w],
            )
        };
        let norm = |g: &mut Graph, x, s| {
            let n = op(g, Op::RmsNorm, Attrs::new(), &[x]);
            op(g, Op::Mul, Attrs::new(), &[n, s])
        };
        let n1 = norm(&mut g, x, s1);
        let w1t = t(&mut g, w1);
        let a = op(&mut g, Op::Matmul, Attrs::new(), &[n1, w1t]);
        let a = op(&mut g, Op::Relu, Attrs::new(), &[a]);
        let w2t = t(&mut g, w2);
        let a = op(&mut g, Op::Matmul, Attrs::new(), &[a, w2t]);
        let a = op(&mut g, Op::Dropout, Attrs::new().with("p", 0.1), &[a]);
        let mut h = op(&mut g, Op::Add, Attrs::new(), &[x, a]);
        if mix {
            let keep = Attrs::new().with("axes", vec![1i64]).with("keepdim", true);
            let m = op(&mut g, Op::Mean, keep, &[h]);
            h = op(&mut g, Op::Add, Attrs::new(), &[h, m]);
        }
        let n2 = norm(&mut g, h, s2);
        let headt = t(&mut g, head);
        let y = op(&mut g, Op::Matmul, Attrs::new(), &[n2, headt]);
        g.set_output("y", y);
        g
    }

    fn splits() -> BTreeMap<String, usize> {
        BTreeMap::from([("w1".to_string(), 0), ("w2".to_string(), 1)])
    }

    #[test]
    fn the_block_between_the_matmuls_runs_on_a_block_of_the_sequence() {
        let mut g = block(false);
        let done = sequence_parallel(&mut g, &splits(), &Group::new("tp", 2)).unwrap();
        verify(&g).unwrap();
        assert_eq!(done.len(), 2);
        let kinds: Vec<Op> = crate::shard::collectives(&g)
            .into_iter()
            .map(|c| c.0)
            .collect();
        // x is cut, the first norm's scale copied, f gathers, g scatters, the final norm's
        // scale copied, the head reads the gathered stream.
        assert_eq!(
            kinds,
            vec![
                Op::RankSlice,
                Op::ParallelCopy,
                Op::AllGather,
                Op::ReduceScatter,
                Op::ParallelCopy,
                Op::AllGather,
            ]
        );
        let text = crate::print::to_text(&g);
        assert!(
            text.contains("add(") && text.contains(": f32[2,2,8]"),
            "{text}"
        );
        let y = g.outputs[0].1;
        assert_eq!(g.ty(y).shape, vec![2, 4, 8]);
        // The dropout draws its mask at its block's positions in the whole sequence.
        let dropout = g
            .node_ids()
            .into_iter()
            .find(|&id| g.node(id).op() == Some(Op::Dropout));
        let attrs = g.node(dropout.unwrap()).attrs().unwrap();
        assert_eq!(
            (
                attrs.str("axis").unwrap(),
                attrs.int("ranks").unwrap(),
                attrs.int("dim").unwrap()
            ),
            ("tp".to_string(), 2, 1)
        );
        // The head's gather hands back this rank's block of the (replicated) cotangent; the
        // gradients of f and g swap; the scales' gradients are summed over the group.
        let loss = g.add_op(Op::Sum, Attrs::new(), &[y], "loss").unwrap()[0];
        let params: Vec<ValueRef> = g
            .node_ids()
            .into_iter()
            .filter(|&id| matches!(g.node(id).kind, NodeKind::Param { .. }))
            .map(|node| ValueRef { node, index: 0 })
            .collect();
        crate::backward(&mut g, loss, &params).unwrap();
        verify(&g).unwrap();
        let count = |op: Op| {
            g.node_ids()
                .into_iter()
                .filter(|&id| g.node(id).op() == Some(op))
                .count()
        };
        // (The cut input x is not differentiated, so the cut's gradient gather is not made.)
        assert_eq!(
            count(Op::AllGather),
            2 + 1,
            "f, the head's gather; g's gradient"
        );
        assert_eq!(count(Op::ReduceScatter), 1 + 1, "g; f's gradient");
        assert_eq!(
            count(Op::RankSlice),
            1 + 1,
            "the cut; the head gather's gradient"
        );
        assert_eq!(count(Op::AllReduce), 2, "the two scales' gradients");
    }

    #[test]
    fn an_op_mixing_positions_inside_the_region_is_refused() {
        let mut g = block(true);
        let e = sequence_parallel(&mut g, &splits(), &Group::new("tp", 2)).unwrap_err();
        assert!(
            e.0.contains("`mean` in `blk`") && e.0.contains("mixes"),
            "{e}"
        );
        let mut g = block(false);
        let e = sequence_parallel(&mut g, &splits(), &Group::new("tp", 8)).unwrap_err();
        assert!(e.0.contains("does not split into 8"), "{e}");
    }
}
