//! Megatron-LM's tensor parallelism (Shoeybi et al. 2019, §3) as a rewrite of one device's
//! forward graph into the graph each rank of a tensor-parallel group runs. The parameters
//! given a split dim hold 1/n of their rows (`[mp, _]`: column parallel, q/k/v, gate, up) or
//! columns (`[_, mp]`: row parallel, o, down); the split flows through the ops that keep it
//! (transposes, reshapes that split heads, rope, attention over the local heads, elementwise
//! ops); a column-parallel matmul reads its input through `parallel_copy` (Megatron's `f`) and
//! a row-parallel matmul's partial sums go through `all_reduce` (`g`). Applied before
//! autodiff, the backward's collectives follow from the two ops' gradient rules: two
//! all-reduces per transformer layer in the forward (after o and down), two in the backward
//! (the gradients of the copies in front of q/k/v and of gate/up).

use std::collections::{BTreeMap, HashMap};

use mslc_core::ops::{normalize_axis, Attrs, Op};

use super::{retype, Group, ShardError};
use crate::graph::{Graph, NodeId, NodeKind, ValueRef};

/// What the rewrite split: each parameter's path and the dim it holds 1/n of.
pub type SplitParams = Vec<(String, usize)>;

/// Rewrites `graph` into one rank's program of the tensor-parallel `group`: every parameter
/// of `splits` (path → dim) holds 1/`group.ranks` of that dim. An error names the op that
/// reads a split tensor in a way this rewrite does not split (a norm over split features, a
/// matmul with transposed operands), a dim that does not divide, or a split output.
pub fn tensor_parallel(
    graph: &mut Graph,
    splits: &BTreeMap<String, usize>,
    group: &Group,
) -> Result<SplitParams, ShardError> {
    split_features(graph, splits, group).map(|(done, _)| done)
}

/// [`tensor_parallel`], also handing back every value it left split (value → split dim).
pub(super) fn split_features(
    graph: &mut Graph,
    splits: &BTreeMap<String, usize>,
    group: &Group,
) -> Result<(SplitParams, HashMap<ValueRef, usize>), ShardError> {
    let n = group.ranks as i64;
    let order = graph
        .topo_order()
        .ok_or_else(|| ShardError("the graph has a cycle".to_string()))?;
    let mut split: HashMap<ValueRef, usize> = HashMap::new();
    let mut copies: HashMap<ValueRef, ValueRef> = HashMap::new();
    let mut done = Vec::new();
    for id in order {
        let v = ValueRef { node: id, index: 0 };
        match graph.node(id).kind.clone() {
            NodeKind::Param { path, .. } => {
                let Some(&d) = splits.get(&path) else {
                    continue;
                };
                let ty = &mut graph.node_mut(id).outputs[0];
                let size = ty.shape.get(d).copied().unwrap_or(0);
                if size % n != 0 || size == 0 {
                    return Err(ShardError(format!(
                        "`{path}`: dim {d} of size {size} does not split into {n} ranks"
                    )));
                }
                ty.shape[d] /= n;
                split.insert(v, d);
                done.push((path, d));
            }
            NodeKind::Input { .. } => {}
            NodeKind::Op { op, attrs } => {
                rewrite_op(graph, id, op, attrs, group, &mut split, &mut copies)?
            }
        }
    }
    // An output stays whole: gathered over the group (logits over a vocabulary-parallel head).
    for k in 0..graph.outputs.len() {
        let v = graph.outputs[k].1;
        if let Some(&d) = split.get(&v) {
            let attrs = group.along(d).with("replicated_grad", true);
            let origin = graph.node(v.node).origin.clone();
            graph.outputs[k].1 = graph
                .add_op(Op::AllGather, attrs, &[v], &origin)
                .map_err(|e| ShardError(e.message))?[0];
        }
    }
    Ok((done, split))
}

/// Splits one op whose inputs may be split: its new attributes and types, the copy in front
/// of a column-parallel matmul and the all-reduce after a row-parallel one.
fn rewrite_op(
    graph: &mut Graph,
    id: NodeId,
    op: Op,
    mut attrs: Attrs,
    group: &Group,
    split: &mut HashMap<ValueRef, usize>,
    copies: &mut HashMap<ValueRef, ValueRef>,
) -> Result<(), ShardError> {
    let inputs = graph.inputs(id);
    let dims: Vec<Option<usize>> = inputs.iter().map(|v| split.get(v).copied()).collect();
    if dims.iter().all(Option::is_none) {
        return Ok(());
    }
    let origin = graph.node(id).origin.clone();
    let refuse = |why: &str| {
        Err(ShardError(format!(
            "`{op}` in `{origin}` {why}; tensor parallelism splits matmuls, heads and \
             elementwise ops only"
        )))
    };
    let rank = |v: &ValueRef| graph.ty(*v).rank();
    let mut reduce_after = false;
    let out: Option<usize> = match op {
        Op::Transpose => {
            let perm = attrs.ints("perm").map_err(|e| ShardError(e.message))?;
            let d = dims[0].unwrap_or(0) as i64;
            perm.iter().position(|&p| p == d)
        }
        Op::Reshape => {
            let (shape, d) = split_reshape(graph, inputs[0], dims[0].unwrap_or(0), &attrs, group)
                .ok_or_else(|| {
                ShardError(format!(
                    "`reshape` in `{origin}` cannot keep its input split by tensor parallelism"
                ))
            })?;
            attrs.insert("shape", shape);
            Some(d)
        }
        Op::Matmul
            if attrs.bool("transpose_a") == Ok(false) && attrs.bool("transpose_b") == Ok(false) =>
        {
            let (ra, rb) = (rank(&inputs[0]), rank(&inputs[1]));
            match (dims[0], dims[1]) {
                // Column parallel: the weight's output features split; the input is copied in
                // (gathered first when it is split: two column-parallel layers in a row).
                (da, Some(d)) if rb == 2 && d == 1 => {
                    let a = match da {
                        Some(da) => gather(graph, id, 0, inputs[0], da, group, &origin)?,
                        None => inputs[0],
                    };
                    let copy = match copies.get(&a) {
                        Some(c) => *c,
                        None => {
                            let c = graph
                                .add_op(Op::ParallelCopy, group.attrs(), &[a], &origin)
                                .map_err(|e| ShardError(e.message))?[0];
                            copies.insert(a, c);
                            c
                        }
                    };
                    graph.set_input(id, 0, copy);
                    Some(ra - 1)
                }
                // Row parallel: both contracted dims split; the products are partial sums.
                (Some(da), Some(0)) if rb == 2 && da == ra - 1 => {
                    reduce_after = true;
                    None
                }
                // Head parallel: a batched product of operands split along the same batch dim
                // (`q @ kᵀ` and `p @ v` over a head split), each rank's heads on their own.
                (Some(da), Some(db)) if ra == rb && da == db && da + 2 < ra => Some(da),
                _ => return refuse("multiplies operands split in another way"),
            }
        }
        // Broadcasting ops: the split dims must line up from the right (a bias split along
        // the features it is added to); a whole operand must not span the split dim.
        _ if op.binary().is_some() => {
            let out_rank = inputs.iter().map(&rank).max().unwrap_or(0);
            let aligned: Vec<Option<usize>> = inputs
                .iter()
                .zip(&dims)
                .map(|(v, d)| d.map(|d| out_rank - rank(v) + d))
                .collect();
            let d = aligned.iter().flatten().copied().next().unwrap_or(0);
            let spans = |v: &ValueRef| {
                let r = rank(v);
                (r + d >= out_rank) && graph.ty(*v).shape[r + d - out_rank] > 1
            };
            let lined_up = aligned.iter().flatten().all(|&a| a == d);
            let whole_spans = inputs
                .iter()
                .zip(&dims)
                .any(|(v, dim)| dim.is_none() && spans(v));
            if !lined_up || whole_spans {
                return refuse("combines a split tensor with a whole one");
            }
            Some(d)
        }
        Op::Dropout => {
            let d = dims[0].unwrap_or(0);
            attrs = group.split_dropout(attrs, d);
            Some(d)
        }
        // A softmax along another dim than the split one (attention's weights per head), a
        // slice of another dim (q, k and v cut out of a fused projection split by heads).
        Op::Softmax | Op::LogSoftmax | Op::Slice
            if attrs
                .int("axis")
                .ok()
                .and_then(|a| normalize_axis(a, rank(&inputs[0])).ok())
                .is_some_and(|axis| Some(axis) != dims[0]) =>
        {
            dims[0]
        }
        Op::Rope | Op::Cast => dims[0],
        _ if op.unary().is_some() => dims[0],
        Op::Attention if dims.iter().all(|d| *d == Some(2)) => Some(2),
        // Any other op reads its split operands whole, gathered over the group: an embedding
        // over a vocabulary-parallel table, a loss over vocabulary-parallel logits. What
        // follows runs alike on every rank, so a gather's gradient is this rank's block of
        // the (replicated) cotangent.
        _ => {
            for (slot, (v, d)) in inputs.iter().zip(&dims).enumerate() {
                if let Some(d) = d {
                    gather(graph, id, slot, *v, *d, group, &origin)?;
                }
            }
            None
        }
    };
    retype(graph, id, op, attrs)?;
    let v = ValueRef { node: id, index: 0 };
    if let Some(d) = out {
        split.insert(v, d);
    }
    if reduce_after {
        let users = graph.users(v);
        let reduced = graph
            .add_op(Op::AllReduce, group.attrs(), &[v], &origin)
            .map_err(|e| ShardError(e.message))?[0];
        for (user, slot) in users {
            graph.set_input(user, slot, reduced);
        }
        for (_, o) in &mut graph.outputs {
            if *o == v {
                *o = reduced;
            }
        }
    }
    Ok(())
}

/// Makes input `slot` of `id` the whole of `v` (split along `d`), gathered over `group`; what
/// follows runs alike on every rank, so the gather's gradient is this rank's block of the
/// replicated cotangent. The gathered value.
fn gather(
    graph: &mut Graph,
    id: NodeId,
    slot: usize,
    v: ValueRef,
    d: usize,
    group: &Group,
    origin: &str,
) -> Result<ValueRef, ShardError> {
    let attrs = group.along(d).with("replicated_grad", true);
    let whole = graph
        .add_op(Op::AllGather, attrs, &[v], origin)
        .map_err(|e| ShardError(e.message))?[0];
    graph.set_input(id, slot as u32, whole);
    Ok(whole)
}

/// The shape a `reshape` of `x` (split on dim `d` into `group.ranks`) takes per rank, and its
/// split dim: the output dim where the input dim's block starts (same product of the dims
/// before it), divided by the group size. `None` when no output dim starts there or it does
/// not divide.
fn split_reshape(
    graph: &Graph,
    x: ValueRef,
    d: usize,
    attrs: &Attrs,
    group: &Group,
) -> Option<(Vec<i64>, usize)> {
    let n = group.ranks as i64;
    let local = &graph.ty(x).shape;
    let before: i64 = local[..d].iter().product();
    let whole: i64 = local.iter().product::<i64>() * n;
    let mut shape = attrs.ints("shape").ok()?;
    // Resolve a -1 against the whole input.
    if let Some(i) = shape.iter().position(|&s| s == -1) {
        let known: i64 = shape.iter().filter(|&&s| s != -1).product();
        shape[i] = whole / known.max(1);
    }
    let mut prefix = 1;
    for (j, size) in shape.iter_mut().enumerate() {
        if prefix == before && *size != 1 {
            if *size % n != 0 {
                return None;
            }
            *size /= n;
            return Some((shape, j));
        }
        prefix *= *size;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify;
    use mslc_core::ops::{DType, TensorType};
    use mslc_core::program::Init;

    /// x [2, 8] → column-parallel w1 [16, 8] (as x @ w1ᵀ) → relu → row-parallel w2 [8, 16].
    fn mlp() -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 8]));
        let w1 = g.add_param(
            "w1",
            TensorType::new(DType::F32, [16, 8]),
            Init::Zeros,
            true,
        );
        let w2 = g.add_param(
            "w2",
            TensorType::new(DType::F32, [8, 16]),
            Init::Zeros,
            true,
        );
        let t = |g: &mut Graph, w| {
            let perm = Attrs::new().with("perm", vec![1i64, 0]);
            g.add_op(Op::Transpose, perm, &[w], "t").unwrap()[0]
        };
        let mm =
            |g: &mut Graph, a, b| g.add_op(Op::Matmul, Attrs::new(), &[a, b], "mm").unwrap()[0];
        let w1t = t(&mut g, w1);
        let h = mm(&mut g, x, w1t);
        let h = g.add_op(Op::Relu, Attrs::new(), &[h], "act").unwrap()[0];
        let h = g
            .add_op(
                Op::Reshape,
                Attrs::new().with("shape", vec![2i64, 4, 4]),
                &[h],
                "r",
            )
            .unwrap()[0];
        let h = g
            .add_op(
                Op::Reshape,
                Attrs::new().with("shape", vec![2i64, 16]),
                &[h],
                "r",
            )
            .unwrap()[0];
        let w2t = t(&mut g, w2);
        let y = mm(&mut g, h, w2t);
        g.set_output("y", y);
        g
    }

    #[test]
    fn a_column_then_row_parallel_pair_copies_in_and_reduces_out() {
        let mut g = mlp();
        let splits = BTreeMap::from([("w1".to_string(), 0), ("w2".to_string(), 1)]);
        let done = tensor_parallel(&mut g, &splits, &Group::new("tp", 2)).unwrap();
        verify(&g).unwrap();
        assert_eq!(done, vec![("w1".to_string(), 0), ("w2".to_string(), 1)]);
        let kinds: Vec<Op> = crate::shard::collectives(&g)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(kinds, vec![Op::ParallelCopy, Op::AllReduce]);
        let y = g.outputs[0].1;
        assert_eq!(g.node(y.node).op(), Some(Op::AllReduce));
        assert_eq!(g.ty(y).shape, vec![2, 8]);
        let text = crate::print::to_text(&g);
        assert!(text.contains("{shape=[2,2,4]} : f32[2,2,4]"), "{text}");
    }

    #[test]
    fn a_dropout_over_split_features_draws_the_whole_tensors_mask() {
        let mut g = mlp();
        let act = g
            .node_ids()
            .into_iter()
            .find(|&id| g.node(id).op() == Some(Op::Relu))
            .unwrap();
        let act = ValueRef {
            node: act,
            index: 0,
        };
        let users = g.users(act);
        let p = Attrs::new().with("p", 0.1);
        let dropped = g.add_op(Op::Dropout, p, &[act], "drop").unwrap()[0];
        for (user, slot) in users {
            g.set_input(user, slot, dropped);
        }
        tensor_parallel(
            &mut g,
            &BTreeMap::from([("w1".to_string(), 0), ("w2".to_string(), 1)]),
            &Group::new("tp", 2),
        )
        .unwrap();
        let attrs = g.node(dropped.node).attrs().unwrap();
        assert_eq!(attrs.int("dim").unwrap(), 1, "the features of [2, 16]");
        assert_eq!(attrs.str("axis").unwrap(), "tp");
        assert_eq!(g.ty(dropped).shape, vec![2, 8]);
    }

    /// A bias split with the features it is added to stays split; a second column-parallel
    /// layer reads the first's output gathered; a whole operand spanning the split dim is
    /// refused.
    #[test]
    fn biases_line_up_from_the_right_and_column_layers_chain_through_a_gather() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 8]));
        let mut h = x;
        for (k, (out, inp)) in [(16i64, 8i64), (8, 16)].into_iter().enumerate() {
            let w = g.add_param(
                &format!("w{k}"),
                TensorType::new(DType::F32, [out, inp]),
                Init::Zeros,
                true,
            );
            let b = g.add_param(
                &format!("b{k}"),
                TensorType::new(DType::F32, [out]),
                Init::Zeros,
                true,
            );
            let perm = Attrs::new().with("perm", vec![1i64, 0]);
            let wt = g.add_op(Op::Transpose, perm, &[w], "l").unwrap()[0];
            let y = g.add_op(Op::Matmul, Attrs::new(), &[h, wt], "l").unwrap()[0];
            h = g.add_op(Op::Add, Attrs::new(), &[y, b], "l").unwrap()[0];
        }
        g.set_output("y", h);
        let splits: BTreeMap<String, usize> = ["w0", "b0", "w1", "b1"]
            .iter()
            .map(|p| (p.to_string(), 0))
            .collect();
        tensor_parallel(&mut g, &splits, &Group::new("tp", 2)).unwrap();
        let gathers = g
            .node_ids()
            .into_iter()
            .filter(|&id| g.node(id).op() == Some(Op::AllGather))
            .count();
        assert_eq!(gathers, 2, "the first layer's output and the output");
        verify::verify(&g).unwrap();
        // A whole [8]-wide operand added to features split in two.
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 8]));
        let w = g.add_param("w", TensorType::new(DType::F32, [8, 8]), Init::Zeros, true);
        let b = g.add_param("b", TensorType::new(DType::F32, [8]), Init::Zeros, true);
        let perm = Attrs::new().with("perm", vec![1i64, 0]);
        let wt = g.add_op(Op::Transpose, perm, &[w], "l").unwrap()[0];
        let y = g.add_op(Op::Matmul, Attrs::new(), &[x, wt], "l").unwrap()[0];
        let h = g.add_op(Op::Add, Attrs::new(), &[y, b], "l").unwrap()[0];
        g.set_output("y", h);
        let splits = BTreeMap::from([("w".to_string(), 0)]);
        let e = tensor_parallel(&mut g, &splits, &Group::new("tp", 2)).unwrap_err();
        assert!(
            e.0.contains("combines a split tensor with a whole one"),
            "{e}"
        );
    }

    /// A split the rewrite does not carry through an op, or a split output, is gathered whole
    /// over the group, its gradient this rank's block.
    #[test]
    fn what_reads_a_split_tensor_whole_gets_it_gathered() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 8]));
        let table = TensorType::new(DType::F32, [16, 8]);
        let w = g.add_param("w", table, Init::Zeros, true);
        let perm = Attrs::new().with("perm", vec![1i64, 0]);
        let wt = g.add_op(Op::Transpose, perm, &[w], "head").unwrap()[0];
        let logits = g
            .add_op(Op::Matmul, Attrs::new(), &[x, wt], "head")
            .unwrap()[0];
        let soft = Attrs::new().with("axis", -1i64);
        let p = g.add_op(Op::Softmax, soft, &[logits], "p").unwrap()[0];
        g.set_output("logits", logits);
        g.set_output("p", p);
        let splits = BTreeMap::from([("w".to_string(), 0)]);
        tensor_parallel(&mut g, &splits, &Group::new("tp", 2)).unwrap();
        for (name, v) in &g.outputs {
            let node = g.node(v.node);
            let gathered = match name.as_str() {
                "logits" => v.node,
                _ => g.inputs(v.node)[0].node,
            };
            assert_eq!(g.node(gathered).op(), Some(Op::AllGather), "{name}");
            let attrs = g.node(gathered).attrs().unwrap();
            assert_eq!(attrs.bool("replicated_grad"), Ok(true));
            assert_eq!(node.outputs[0].shape, [2, 16], "{name} whole");
        }
        verify::verify(&g).unwrap();
    }

    #[test]
    fn a_split_that_does_not_divide_or_multiplies_another_way_is_refused() {
        let mut g = mlp();
        let splits = BTreeMap::from([("w1".to_string(), 0)]);
        let e = tensor_parallel(&mut g, &splits, &Group::new("tp", 2)).unwrap_err();
        assert!(
            e.0.contains("multiplies operands split in another way"),
            "{e}"
        );
        let mut g = mlp();
        let three = Group {
            axis: "tp".to_string(),
            ranks: 3,
        };
        let e =
            tensor_parallel(&mut g, &BTreeMap::from([("w2".to_string(), 1)]), &three).unwrap_err();
        assert!(e.0.contains("does not split into 3"), "{e}");
    }
}
