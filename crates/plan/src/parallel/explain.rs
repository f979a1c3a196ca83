//! `mslc build --explain-plan`: why the plan looks as it does. Per parameter (one entry per
//! layer pattern) the layout chosen, the collectives it causes with bytes and time, and the
//! best other layout re-planned — the whole workload propagated again with only that
//! parameter's layout changed and estimated with the same strategy; per large activation its
//! layout, bytes and whether the backward keeps it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::estimate::{device_chunks, estimate, Cluster, Estimate, Recompute, Strategy, Training};
use super::search::Workloads;
use super::workload::{layer_key, Activation, Workload};

/// A collective one parameter causes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Caused {
    /// What it is: `forward all-reduce of its output`, …
    pub what: String,
    /// The mesh axis.
    pub axis: &'static str,
    /// Bytes per call.
    pub bytes: u64,
    /// Calls per step on one rank (its stage's layers, every micro-batch).
    pub per_step: u64,
    /// Seconds per step, by the cost model's ring formula.
    pub seconds: f64,
}

/// The best layout the planner did not choose for a parameter, planned.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alternative {
    /// The layout, as a shard spec (`[tp, _]`, `whole`).
    pub layout: String,
    /// Step time with it minus the plan's, seconds.
    pub step_time_delta_s: f64,
    /// The worst rank's memory with it minus the plan's, bytes (negative: less).
    pub peak_delta_bytes: i64,
    /// Whether every device would still fit.
    pub fits: bool,
}

/// One parameter pattern's layout and what it costs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamExplanation {
    /// The path with layer indices as `*`.
    pub pattern: String,
    /// Parameters it covers.
    pub count: usize,
    /// Of those, the most one rank holds (the layers of its pipeline stage).
    pub on_rank: usize,
    /// Shape of each, whole.
    pub shape: Vec<i64>,
    /// The layout: `[tp, _]`-style spec, or `whole`.
    pub layout: String,
    /// Bytes of model states (parameter, gradient, optimizer state) of the `on_rank`
    /// parameters one rank holds, after the optimizer-shard level's division.
    pub state_bytes_per_rank: u64,
    /// Collectives it causes.
    pub collectives: Vec<Caused>,
    /// The best other layout, when there is one.
    pub alternative: Option<Alternative>,
}

/// A collective moving one activation, per step on one rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MovedActivation {
    /// The activation (`matmul in model.layers.0.mlp`): in the first layer, it stands for the
    /// same activation of every layer the rank runs.
    pub activation: String,
    /// Its shape, whole.
    pub shape: Vec<i64>,
    /// What moves it (under sequence parallelism an all-reduce is a reduce-scatter +
    /// all-gather pair of the same bytes and time).
    pub what: String,
    /// The mesh axis.
    pub axis: &'static str,
    /// Bytes per call.
    pub bytes: u64,
    /// Calls per step on one rank of the stage running most layers.
    pub per_step: u64,
    /// Seconds per step, by the cost model's ring formula.
    pub seconds: f64,
}

/// The explanation of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    /// Per parameter pattern, in model order.
    pub parameters: Vec<ParamExplanation>,
    /// The large activations of the first layer, the embeddings and the output.
    pub activations: Vec<Activation>,
    /// The tensor-parallel collectives moving activations of the embeddings, the first layer
    /// and the output.
    pub moved: Vec<MovedActivation>,
}

/// `[tp, _]` for a split along `dim` of a rank-`rank` tensor; `whole` for none.
fn spec(dim: Option<usize>, rank: usize) -> String {
    match dim {
        None => "whole".into(),
        Some(d) => {
            let parts: Vec<&str> = (0..rank).map(|i| if i == d { "tp" } else { "_" }).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

/// `model.layers.3.mlp.weight` → `model.layers.*.mlp.weight`.
pub fn generic_path(path: &str) -> String {
    path.split('.')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Explains `strategy` (the plan's) on `workloads`.
pub fn explain(
    workloads: &mut Workloads,
    strategy: Strategy,
    train: Training,
    cluster: &Cluster,
) -> Explanation {
    let tp = strategy.tp;
    let w: Workload = workloads.at(tp).clone();
    let base = estimate(&w, strategy, train, cluster);
    let current: BTreeMap<String, usize> = w
        .shardings
        .iter()
        .filter_map(|(p, s)| Some((p.clone(), s.iter().position(Option::is_some)?)))
        .collect();
    // Parameter patterns in model order.
    let model = workloads.model();
    let mut order: Vec<String> = Vec::new();
    let mut members: BTreeMap<String, Vec<(String, Vec<i64>)>> = BTreeMap::new();
    for p in model.params.iter().filter(|p| p.trainable) {
        let g = generic_path(&p.path);
        if !members.contains_key(&g) {
            order.push(g.clone());
        }
        members
            .entry(g)
            .or_default()
            .push((p.path.clone(), model.ty(p.value).shape.clone()));
    }
    let level = strategy.optimizer_shard;
    let dp = strategy.dp.max(1) as f64;
    let per_element = train.param_bytes as f64 / if level >= 3 { dp } else { 1.0 }
        + train.grad_bytes as f64 / if level >= 2 { dp } else { 1.0 }
        + train.state_bytes as f64 / if level >= 1 { dp } else { 1.0 };
    let m = strategy.micro_batches.max(1) as u64;
    let sp = strategy.sequence_parallel && tp > 1;
    // The layer each rank's stage runs, by name, to count a pattern's parameters per rank.
    let stage_of: BTreeMap<&str, usize> = device_chunks(&w, &strategy)
        .iter()
        .enumerate()
        .flat_map(|(s, ranges)| {
            ranges
                .iter()
                .flat_map(|&(a, b)| &w.layers[a..b])
                .map(move |l| (l.name.as_str(), s))
        })
        .collect();
    let mut parameters = Vec::new();
    for pattern in order {
        let group = &members[&pattern];
        let (first, shape) = &group[0];
        let dim = current.get(first).copied();
        let numel: i64 = shape.iter().product();
        let mut per_stage: BTreeMap<Option<usize>, usize> = BTreeMap::new();
        for (path, _) in group {
            let stage = layer_key(path).and_then(|k| stage_of.get(k.as_str()).copied());
            *per_stage.entry(stage).or_default() += 1;
        }
        let on_rank = per_stage
            .iter()
            .filter_map(|(s, n)| s.map(|_| *n))
            .max()
            .unwrap_or(1);
        let share = on_rank as f64 / group.len() as f64;
        let per_rank = numel as f64 / if dim.is_some() { tp as f64 } else { 1.0 };
        let mut collectives = Vec::new();
        let mut tp_calls: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for (path, _) in group {
            for &(what, bytes) in w.caused.get(path).into_iter().flatten() {
                let e = tp_calls.entry(what).or_insert((bytes, 0));
                e.1 += 1;
            }
        }
        for (what, (bytes, calls)) in tp_calls {
            let forward = what.starts_with("forward");
            let repeat = if forward && strategy.recompute == Recompute::Full {
                2
            } else {
                1
            };
            let per_step = ((calls as f64 * share).round() as u64).max(1) * m * repeat;
            let what = if sp {
                format!("{what} (a reduce-scatter + all-gather pair under sequence parallel)")
            } else {
                what.to_string()
            };
            collectives.push(Caused {
                what,
                axis: "tp",
                bytes,
                per_step,
                seconds: per_step as f64 * cluster.all_reduce_s(bytes, tp, 1),
            });
        }
        if strategy.dp > 1 {
            let bytes = (per_rank * train.grad_bytes as f64) as u64 * on_rank as u64;
            let what = if level >= 2 {
                "data-parallel reduce-scatter of its gradient"
            } else {
                "data-parallel all-reduce of its gradient"
            };
            collectives.push(Caused {
                what: what.into(),
                axis: "dp",
                bytes,
                per_step: 1,
                seconds: cluster.all_reduce_s(bytes, strategy.dp, tp),
            });
        }
        let alternative = alternatives(dim, shape, tp)
            .into_iter()
            .map(|alt| {
                let mut splits = current.clone();
                for (path, _) in group {
                    match alt {
                        Some(d) => splits.insert(path.clone(), d),
                        None => splits.remove(path),
                    };
                }
                let e = estimate(
                    &workloads.with_splits(tp, &splits),
                    strategy,
                    train,
                    cluster,
                );
                (alt, e)
            })
            .min_by(|(_, a), (_, b)| rank(a, cluster).total_cmp(&rank(b, cluster)))
            .map(|(alt, e)| Alternative {
                layout: spec(alt, shape.len()),
                step_time_delta_s: e.step_time_s - base.step_time_s,
                peak_delta_bytes: e.peak_bytes() as i64 - base.peak_bytes() as i64,
                fits: e.peak_bytes() <= cluster.budget,
            });
        parameters.push(ParamExplanation {
            pattern,
            count: group.len(),
            on_rank,
            shape: shape.clone(),
            layout: spec(dim, shape.len()),
            state_bytes_per_rank: (per_rank * per_element) as u64 * on_rank as u64,
            collectives,
            alternative,
        });
    }
    let layers_on_rank = device_chunks(&w, &strategy)
        .iter()
        .map(|ranges| ranges.iter().map(|&(a, b)| b - a).sum::<usize>())
        .max()
        .unwrap_or(0) as u64;
    Explanation {
        parameters,
        activations: w.activations.clone(),
        moved: moved_activations(&w, strategy, layers_on_rank, cluster),
    }
}

/// Each distinct collective of [`Workload::moved`] with its calls and seconds per step: a
/// first-layer one for every layer on the rank, each for every micro-batch, a forward one
/// twice under full recompute.
fn moved_activations(
    w: &Workload,
    strategy: Strategy,
    layers_on_rank: u64,
    cluster: &Cluster,
) -> Vec<MovedActivation> {
    let tp = strategy.tp;
    if tp <= 1 {
        return Vec::new();
    }
    let m = strategy.micro_batches.max(1) as u64;
    let sp = strategy.sequence_parallel;
    let mut out: Vec<MovedActivation> = Vec::new();
    for mv in &w.moved {
        if out
            .iter()
            .any(|o| o.activation == mv.activation && o.what.starts_with(&mv.what))
        {
            continue;
        }
        let forward = mv.what.starts_with("forward");
        let repeat = if forward && strategy.recompute == Recompute::Full {
            2
        } else {
            1
        };
        let layers = if mv.per_layer { layers_on_rank } else { 1 };
        let per_step = layers * m * repeat;
        let gather = mv.what.starts_with("all-gather");
        let call = cluster.all_reduce_s(mv.bytes, tp, 1) / if gather { 2.0 } else { 1.0 };
        let what = if sp && !gather {
            format!("{} (reduce-scatter + all-gather)", mv.what)
        } else {
            mv.what.clone()
        };
        out.push(MovedActivation {
            activation: mv.activation.clone(),
            shape: mv.shape.clone(),
            what,
            axis: "tp",
            bytes: mv.bytes,
            per_step,
            seconds: per_step as f64 * call,
        });
    }
    out
}

/// The other layouts worth planning for a parameter at degree `tp`: whole or the other dim
/// for a split one; either dim of a whole matrix that divides. None at degree 1.
fn alternatives(dim: Option<usize>, shape: &[i64], tp: i64) -> Vec<Option<usize>> {
    if tp <= 1 {
        return Vec::new();
    }
    let divides = |d: usize| shape.get(d).is_some_and(|s| s % tp == 0);
    let mut out: Vec<Option<usize>> = (0..shape.len().min(2))
        .filter(|&d| shape.len() == 2 && divides(d) && Some(d) != dim)
        .map(Some)
        .collect();
    if dim.is_some() {
        out.insert(0, None);
    }
    out
}

/// Orders alternatives: those that fit by step time, then those that do not by memory.
fn rank(e: &Estimate, cluster: &Cluster) -> f64 {
    if e.peak_bytes() <= cluster.budget {
        e.step_time_s
    } else {
        1e30 + e.peak_bytes() as f64
    }
}
