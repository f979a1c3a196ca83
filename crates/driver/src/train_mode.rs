//! Training mode, as PyTorch's `model.train()`, applied to a lowered graph before its backward
//! is built: every `dropout` with `p > 0` becomes live, and every `batch_norm` normalises with
//! the batch's statistics and yields its new running statistics. `mslc run` never sees this:
//! a forward graph stays in eval mode.
//!
//! - Dropout: each op reads the module input [`SEED`] (an `i64` scalar the loop draws per
//!   micro-batch from the train seed and the micro-batch's number) and carries its own `salt`
//!   (its ordinal among the graph's dropouts), so its mask is a pure function of (seed, salt,
//!   element index) — the same on every rank and after a resume. The backward redraws the same
//!   mask from the counter rather than storing it (`dropout`'s gradient rule).
//! - BatchNorm: `batch_norm(x, mean_b, var_b)` with `mean_b` the per-channel mean of `x` and
//!   `var_b` its biased variance, both ordinary ops, so the backward differentiates through the
//!   batch statistics with their own rules; the running buffers become
//!   `(1 − momentum)·running + momentum·stat`, the variance with the unbiased batch variance
//!   (`var_b · n / (n − 1)`), returned as outputs named by the buffers' paths for the loop to
//!   write back.

use mslc_core::ops::{Attrs, DType, Op, OpError, TensorType};
use mslc_ir::{Graph, NodeId, NodeKind, ValueRef};

/// Input: the seed of this micro-batch's dropout masks (`i64` scalar).
pub const SEED: &str = "train.seed";

/// What [`apply`] changed: the new value of each running-statistic buffer, by path.
#[derive(Debug, Default)]
pub struct TrainMode {
    /// `(buffer path, new value)` for every running mean and variance.
    pub running: Vec<(String, ValueRef)>,
}

/// Why a graph cannot be put in training mode: a `batch_norm` whose statistics are not
/// buffers it could update, named by where it came from.
#[derive(Debug)]
pub struct TrainModeError {
    /// The instance path of the offending op.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

/// Puts `graph` in training mode (see the module comment).
pub fn apply(graph: &mut Graph) -> Result<TrainMode, TrainModeError> {
    let mut seed = None;
    let mut salt = 0i64;
    let mut mode = TrainMode::default();
    for id in graph.node_ids() {
        match graph.node(id).op() {
            Some(Op::Dropout) => {
                let p = attrs_of(graph, id).float("p").unwrap_or(0.0);
                if p > 0.0 && graph.inputs(id).len() == 1 {
                    let s = *seed.get_or_insert_with(|| {
                        graph.add_input(SEED, TensorType::scalar(DType::I64))
                    });
                    live_dropout(graph, id, s, salt)?;
                    salt += 1;
                }
            }
            Some(Op::BatchNorm) => batch_statistics(graph, id, &mut mode)?,
            _ => {}
        }
    }
    Ok(mode)
}

fn attrs_of(graph: &Graph, id: NodeId) -> Attrs {
    graph.node(id).attrs().cloned().unwrap_or_default()
}

/// Replaces `old`'s single output by `new` and removes `old`, keeping its source location.
fn replace(graph: &mut Graph, old: NodeId, new: ValueRef) {
    let (loc, annotations) = {
        let n = graph.node(old);
        (n.loc, n.annotations.clone())
    };
    let node = graph.node_mut(new.node);
    node.loc = loc;
    node.annotations = annotations;
    graph.replace_all_uses(
        ValueRef {
            node: old,
            index: 0,
        },
        new,
    );
    graph.remove_node(old);
}

fn error(graph: &Graph, id: NodeId, message: String) -> TrainModeError {
    TrainModeError {
        origin: graph.node(id).origin.clone(),
        message,
    }
}

fn live_dropout(
    graph: &mut Graph,
    id: NodeId,
    seed: ValueRef,
    salt: i64,
) -> Result<(), TrainModeError> {
    let x = graph.inputs(id)[0];
    let attrs = attrs_of(graph, id).with("salt", salt);
    let origin = graph.node(id).origin.clone();
    let live = graph
        .add_op(Op::Dropout, attrs, &[x, seed], &origin)
        .map_err(|e| error(graph, id, e.message))?;
    replace(graph, id, live[0]);
    Ok(())
}

/// The path of a buffer feeding a `batch_norm` as a statistic.
fn buffer_path(graph: &Graph, v: ValueRef) -> Option<String> {
    match &graph.node(v.node).kind {
        NodeKind::Param {
            path,
            trainable: false,
            ..
        } => Some(path.clone()),
        _ => None,
    }
}

/// `batch_norm` of `x [N, C, ...]` by its own statistics, from ordinary ops so the backward
/// differentiates through them: the normalised value, the per-channel mean and the biased
/// variance.
pub fn batch_norm_train(
    graph: &mut Graph,
    x: ValueRef,
    attrs: Attrs,
    origin: &str,
) -> Result<(ValueRef, ValueRef, ValueRef), OpError> {
    let xt = graph.ty(x).clone();
    if xt.rank() < 2 {
        return Err(OpError::new(
            "batch_norm: x must be [N, C, ...]".to_string(),
        ));
    }
    let axes: Vec<i64> = (0..xt.rank() as i64).filter(|&a| a != 1).collect();
    let mut per_channel = vec![xt.shape[1]];
    per_channel.resize(xt.rank() - 1, 1);
    let mut op = |op: Op, attrs: Attrs, inputs: &[ValueRef]| {
        graph.add_op(op, attrs, inputs, origin).map(|v| v[0])
    };
    let over_batch = Attrs::new().with("axes", axes);
    let mean = op(Op::Mean, over_batch.clone(), &[x])?;
    let shape = Attrs::new().with("shape", per_channel);
    let mean_b = op(Op::Reshape, shape, &[mean])?;
    let centred = op(Op::Sub, Attrs::new(), &[x, mean_b])?;
    let squares = op(Op::Mul, Attrs::new(), &[centred, centred])?;
    let var = op(Op::Mean, over_batch, &[squares])?;
    let y = op(Op::BatchNorm, attrs, &[x, mean, var])?;
    Ok((y, mean, var))
}

fn batch_statistics(
    graph: &mut Graph,
    id: NodeId,
    mode: &mut TrainMode,
) -> Result<(), TrainModeError> {
    let inputs = graph.inputs(id);
    let [x, running_mean, running_var] = inputs[..] else {
        return Err(error(graph, id, "batch_norm takes 3 inputs".to_string()));
    };
    let (Some(mean_path), Some(var_path)) = (
        buffer_path(graph, running_mean),
        buffer_path(graph, running_var),
    ) else {
        return Err(error(
            graph,
            id,
            "its mean and var are not buffers, so a training step has no running statistics \
             to update"
                .to_string(),
        ));
    };
    for path in [&mean_path, &var_path] {
        if mode.running.iter().any(|(p, _)| p == path) {
            return Err(error(
                graph,
                id,
                format!("buffer `{path}` is the running statistic of two batch_norms"),
            ));
        }
    }
    let attrs = attrs_of(graph, id);
    let momentum = attrs.float("momentum").unwrap_or(0.1);
    let origin = graph.node(id).origin.clone();
    let xt = graph.ty(x).clone();
    let n: i64 = xt.shape.iter().product::<i64>() / xt.shape[1].max(1);
    let op = |graph: &mut Graph, op: Op, attrs: Attrs, inputs: &[ValueRef]| {
        graph
            .add_op(op, attrs, inputs, &origin)
            .map(|v| v[0])
            .map_err(|e| error(graph, id, format!("{op}: {}", e.message)))
    };
    let (y, mean, var) =
        batch_norm_train(graph, x, attrs, &origin).map_err(|e| error(graph, id, e.message))?;
    replace(graph, id, y);
    // running ← (1 − momentum)·running + momentum·stat, the variance's stat unbiased.
    let unbiased = if n > 1 {
        n as f64 / (n - 1) as f64
    } else {
        1.0
    };
    let blend = |graph: &mut Graph, running: ValueRef, stat: ValueRef, k: f64| {
        let dtype = graph.ty(running).dtype;
        let constant = |v: f64| Attrs::new().with("value", v).with("dtype", dtype);
        let keep = op(graph, Op::Constant, constant(1.0 - momentum), &[])?;
        let take = op(graph, Op::Constant, constant(momentum * k), &[])?;
        let old = op(graph, Op::Mul, Attrs::new(), &[running, keep])?;
        let new = op(graph, Op::Mul, Attrs::new(), &[stat, take])?;
        op(graph, Op::Add, Attrs::new(), &[old, new])
    };
    let new_mean = blend(graph, running_mean, mean, 1.0)?;
    let new_var = blend(graph, running_var, var, unbiased)?;
    mode.running.push((mean_path, new_mean));
    mode.running.push((var_path, new_var));
    Ok(())
}
