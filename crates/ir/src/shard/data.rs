//! Per-rank programs for data parallelism: what turns the training graph of one replica (built
//! for its slice of the batch) into the graph every rank of a data-parallel group runs, so that
//! one update equals the single-device update on the whole batch (PyTorch DDP's averaging,
//! MindSpore's `data_parallel` mode).
//!
//! The loss of a replica is a mean over its own samples. The global loss is the mean over all
//! samples, so each replica differentiates its *share* of it — its loss times the fraction of
//! the global batch it holds — and the gradients are then summed over the group by
//! `all_reduce`. For `cross_entropy` that fraction counts only the positions whose label is not
//! `ignore_index` (`n_r / Σ n`, the counts summed over the group), as PyTorch's global mean
//! does; for `mse_loss` and `mean` every replica holds `1 / ranks` of the batch.

use mslc_core::ops::{Attrs, DType, Op};

use super::{Group, ShardError};
use crate::graph::{Graph, ValueRef};

/// A replica's loss as the group sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaLoss {
    /// This replica's share of the global loss: what it differentiates.
    pub share: ValueRef,
    /// The global loss (the same on every replica).
    pub global: ValueRef,
}

/// Adds the ops that weigh the replica's `loss` by its share of the global batch over `group`
/// and sum the shares into the global loss. An error for a loss whose combination over
/// replicas is not known (anything but `cross_entropy`, or a mean over the samples such as
/// `mse_loss`, `mean` and sums of them).
pub fn replica_loss(
    graph: &mut Graph,
    loss: ValueRef,
    group: &Group,
) -> Result<ReplicaLoss, ShardError> {
    let node = graph.node(loss.node).clone();
    let origin = node.origin.as_str();
    let dtype = graph.ty(loss).dtype;
    let operands = graph.inputs(loss.node);
    let uniform = mean_over_samples(graph, loss);
    let mut add = |op: Op, attrs: Attrs, inputs: &[ValueRef]| op1(graph, origin, op, attrs, inputs);
    let constant = |value: f64| Attrs::new().with("value", value).with("dtype", dtype);
    let (loss, weight) = match node.op() {
        Some(Op::CrossEntropy) => {
            let ignore = node
                .attrs()
                .and_then(|a| a.int("ignore_index").ok())
                .unwrap_or(-100);
            let labels = operands[1];
            // n = Σ |sign(label − ignore_index)|: the positions counted in this replica's mean.
            let f = add(Op::Cast, Attrs::new().with("dtype", dtype), &[labels])?;
            let i = add(Op::Constant, constant(ignore as f64), &[])?;
            let d = add(Op::Sub, Attrs::new(), &[f, i])?;
            let s = add(Op::Sign, Attrs::new(), &[d])?;
            let a = add(Op::Abs, Attrs::new(), &[s])?;
            let n = add(Op::Sum, Attrs::new(), &[a])?;
            let total = add(Op::AllReduce, group.attrs(), &[n])?;
            let weight = add(Op::Div, Attrs::new(), &[n, total])?;
            // A replica that counts no position has a NaN mean (0/0, as PyTorch) and a share
            // of 0: pick 0 instead of the mean, by the count's sign, as row 0 or 1 of
            // [[0], [loss]] (an `embedding` lookup: the NaN row is never read, nor multiplied).
            let zero = add(Op::Constant, constant(0.0), &[])?;
            let zero = add(
                Op::Reshape,
                Attrs::new().with("shape", vec![1i64, 1]),
                &[zero],
            )?;
            let one = add(
                Op::Reshape,
                Attrs::new().with("shape", vec![1i64, 1]),
                &[loss],
            )?;
            let rows = add(Op::Concat, Attrs::new().with("axis", 0i64), &[zero, one])?;
            let row = add(Op::Sign, Attrs::new(), &[n])?;
            let row = add(Op::Cast, Attrs::new().with("dtype", DType::I32), &[row])?;
            let picked = add(Op::Embedding, Attrs::new(), &[row, rows])?;
            let guarded = add(
                Op::Reshape,
                Attrs::new().with("shape", Vec::<i64>::new()),
                &[picked],
            )?;
            (guarded, weight)
        }
        _ if uniform => (
            loss,
            add(Op::Constant, constant(1.0 / group.ranks as f64), &[])?,
        ),
        other => {
            let what = other.map_or("a parameter or input".to_string(), |op| format!("`{op}`"));
            return Err(ShardError(format!(
                "the loss is {what}; only a `cross_entropy`, or an `mse_loss` or `mean` (or a \
                 sum of them), is known to combine over data-parallel replicas"
            )));
        }
    };
    let share = add(Op::Mul, Attrs::new(), &[loss, weight])?;
    let global = add(Op::AllReduce, group.attrs(), &[share])?;
    Ok(ReplicaLoss { share, global })
}

/// Whether `v` is a mean over every sample alike, so that each of `ranks` replicas holding an
/// equal slice of the batch holds `1 / ranks` of it: an `mse_loss` or `mean`, or a sum,
/// difference, negation or cast of such (a distillation loss adding two `mse_loss`es).
fn mean_over_samples(graph: &Graph, v: ValueRef) -> bool {
    let inputs = graph.inputs(v.node);
    match graph.node(v.node).op() {
        Some(Op::MseLoss | Op::Mean) => true,
        Some(Op::Add | Op::Sub) => inputs.iter().all(|&x| mean_over_samples(graph, x)),
        Some(Op::Cast | Op::Neg) => mean_over_samples(graph, inputs[0]),
        _ => false,
    }
}

/// Adds a one-output op, its error naming the op.
fn op1(
    graph: &mut Graph,
    origin: &str,
    op: Op,
    attrs: Attrs,
    inputs: &[ValueRef],
) -> Result<ValueRef, ShardError> {
    graph
        .add_op(op, attrs, inputs, origin)
        .map(|v| v[0])
        .map_err(|e| ShardError(format!("{op}: {}", e.message)))
}

/// Sums each of `grads` over `group` (one `all_reduce` each): the replicas' gradients of their
/// shares add up to the gradient of the global loss.
pub fn all_reduce_each(
    graph: &mut Graph,
    grads: &[ValueRef],
    group: &Group,
) -> Result<Vec<ValueRef>, ShardError> {
    grads
        .iter()
        .map(|&g| {
            let origin = format!("{}#grad", graph.node(g.node).origin);
            op1(graph, &origin, Op::AllReduce, group.attrs(), &[g])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::collectives;
    use crate::verify;
    use mslc_core::ops::TensorType;
    use mslc_core::program::Init;

    #[test]
    fn a_cross_entropy_replica_weighs_its_loss_by_its_counted_labels() {
        let mut g = Graph::new("t");
        let logits = g.add_input("logits", TensorType::new(DType::F32, [4, 3]));
        let labels = g.add_input("labels", TensorType::new(DType::I32, [4]));
        let loss = g
            .add_op(Op::CrossEntropy, Attrs::new(), &[logits, labels], "loss")
            .unwrap()[0];
        let r = replica_loss(&mut g, loss, &Group::new("dp", 2)).unwrap();
        verify(&g).unwrap();
        let ops: Vec<(Op, String, u64)> = collectives(&g);
        // The count of labels, then the weighted loss: two scalar sums over `dp`.
        assert_eq!(
            ops,
            vec![
                (Op::AllReduce, "dp".to_string(), 4),
                (Op::AllReduce, "dp".to_string(), 4)
            ]
        );
        assert_eq!(g.node(r.global.node).op(), Some(Op::AllReduce));
        assert_eq!(g.inputs(r.global.node), vec![r.share]);
    }

    #[test]
    fn a_sum_of_means_weighs_each_replica_by_its_slice() {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, [4, 3]);
        let (a, b) = (g.add_input("a", ty.clone()), g.add_input("b", ty));
        let mse = |g: &mut Graph| g.add_op(Op::MseLoss, Attrs::new(), &[a, b], "mse").unwrap()[0];
        let (m1, m2) = (mse(&mut g), mse(&mut g));
        let half = g
            .add_op(
                Op::Cast,
                Attrs::new().with("dtype", DType::F16),
                &[m2],
                "amp",
            )
            .unwrap()[0];
        let half = g
            .add_op(
                Op::Cast,
                Attrs::new().with("dtype", DType::F32),
                &[half],
                "amp",
            )
            .unwrap()[0];
        let loss = g
            .add_op(Op::Add, Attrs::new(), &[m1, half], "loss")
            .unwrap()[0];
        let r = replica_loss(&mut g, loss, &Group::new("dp", 4)).unwrap();
        verify(&g).unwrap();
        // The share is the loss times the constant 1/4, summed over `dp` once.
        let weight = g.inputs(r.share.node)[1];
        assert_eq!(g.node(weight.node).op(), Some(Op::Constant));
        assert_eq!(
            g.node(weight.node).attrs().unwrap().float("value"),
            Ok(0.25)
        );
        assert_eq!(collectives(&g), vec![(Op::AllReduce, "dp".to_string(), 4)]);
        // A cross-entropy term weighs its replica by its counted labels, not its slice.
        let labels = g.add_input("labels", TensorType::new(DType::I32, [4]));
        let ce = g
            .add_op(Op::CrossEntropy, Attrs::new(), &[a, labels], "ce")
            .unwrap()[0];
        let mixed = g.add_op(Op::Add, Attrs::new(), &[m1, ce], "loss").unwrap()[0];
        let e = replica_loss(&mut g, mixed, &Group::new("dp", 4)).unwrap_err();
        assert!(e.0.contains("the loss is `add`"), "{e}");
    }

    #[test]
    fn an_unknown_loss_is_refused_and_gradients_are_summed() {
        let mut g = Graph::new("t");
        let w = g.add_param("w", TensorType::new(DType::F32, [2]), Init::Zeros, true);
        let s = g.add_op(Op::Sum, Attrs::new(), &[w], "loss").unwrap()[0];
        let e = replica_loss(&mut g, s, &Group::new("dp", 2)).unwrap_err();
        assert!(e.0.contains("the loss is `sum`"), "{e}");
        let summed = all_reduce_each(&mut g, &[w], &Group::new("dp", 2)).unwrap();
        assert_eq!(g.ty(summed[0]), g.ty(w));
        assert_eq!(collectives(&g), vec![(Op::AllReduce, "dp".to_string(), 8)]);
    }
}
