//! The generated program's header and its facts: the docstring saying what is and is not
//! mirrored, the imports, and the constants the runtime reads (`INPUTS`, `PARAMS`, `TRAIN`,
//! `MESH`) — the model's interface, the optimizer and schedule, and the declared sharding.

use std::fmt::Write;

use mslc_check::decls::Train;
use mslc_check::policy::{Decay, OptimizerKind, ParallelMode, ParallelPolicy, Schedule};
use mslc_check::Model;
use mslc_core::ops::TensorType;
use mslc_ir::{Graph, NodeKind};
use mslc_plan::parallel::PlanFile;

use crate::py::{py_float, py_list, py_str};

/// The imports: JAX and NumPy, and the Python standard library.
pub const IMPORTS: &str = "\
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

# f32 matmuls in f32 on every backend (no TF32 or bf16 passes), as mslc computes them.
jax.config.update(\"jax_default_matmul_precision\", \"highest\")

";

/// The module docstring.
pub fn docstring(
    source: &str,
    model: &Model,
    train: Option<&Train>,
    parallel: Option<&ParallelPolicy>,
    planned: bool,
    pipelined: bool,
) -> String {
    let mut s = format!(
        "\"\"\"Model `{}` of {source}, exported by `mslc export jax` ({}).\n\n",
        model.name,
        env!("CARGO_PKG_VERSION")
    );
    s.push_str(
        "Self-contained: JAX and NumPy only (safetensors are read and written here). The\n\
         command line mirrors `mslc run` and `mslc train`:\n\n\
         \x20   python model.py --weights W.safetensors --input NAME=X.npy ... --output-dir DIR\n",
    );
    if train.is_some() {
        s.push_str(
            "    python model.py --weights W.safetensors --train --data PATH --steps N \\\n\
             \x20       --metrics FILE.jsonl [--output-dir DIR]\n",
        );
    }
    s.push_str(
        "\nThe forward is the model's graph as mslc lowers it, one statement per op, in f32.\n\
         Shapes are those of the export (its --set/--dim); other input shapes are refused.\n\
         Dropout is the identity and batch_norm normalises with the running statistics (eval\n\
         mode) in the forward and the training step alike; mixed precision is not exported.\n\
         An embedding id out of range is clamped by XLA where mslc stops with an error.\n",
    );
    if let Some(t) = train {
        s.push_str(&format!(
            "\nThe training step is `{}`'s as `mslc train` runs it: its loss, jax.grad, the\n\
             global gradient 2-norm, clip_grad_norm, and the optimizer with torch.optim's\n\
             semantics, in f32. Batches are taken in order (no --shuffle).\n",
            t.spec.name.name
        ));
    }
    if let Some(p) = parallel {
        s.push_str(&format!(
            "\nSharding: a jax.sharding.Mesh of `{}`'s {}, each parameter placed with the\n\
             NamedSharding {}, the batch split over the data-parallel axis{};\n\
             XLA (GSPMD) inserts the collectives. With fewer devices than the mesh needs, the\n\
             program runs on one device.{}\n",
            p.name.name,
            if planned { "per-device plan" } else { "mesh" },
            if planned {
                "the plan gives it"
            } else {
                "of its `shard` rule"
            },
            if planned {
                " and the optimizer\nstates over it as the plan's optimizer_shard says"
            } else {
                ""
            },
            match (p.pipeline.is_some(), pipelined) {
                (true, true) => {
                    " The pipeline is GSPMD's: the layers' parameters stacked by\n\
                     stage over the pipeline axis, each stage running its layers on one\n\
                     micro-batch per tick and passing it on (collective-permutes)."
                }
                (true, false) => " The pipeline is ignored: every device runs every layer.",
                _ => "",
            }
        ));
    }
    s.push_str("\"\"\"\n\n");
    s
}

/// `{"name": ("float32", (1, 16)), …}` of a graph's inputs.
fn inputs_literal(graph: &Graph) -> String {
    let items: Vec<String> = graph
        .node_ids()
        .into_iter()
        .filter_map(|id| match &graph.node(id).kind {
            NodeKind::Input { name } => Some(format!(
                "{}: {}",
                py_str(name),
                type_literal(&graph.node(id).outputs[0])
            )),
            _ => None,
        })
        .collect();
    format!("{{{}}}", items.join(", "))
}

/// `("float32", (2, 3))`.
fn type_literal(t: &TensorType) -> String {
    let dtype = crate::emit::jnp_dtype(t.dtype).trim_start_matches("jnp.");
    let dims: Vec<String> = t.shape.iter().map(i64::to_string).collect();
    let comma = if dims.len() == 1 { "," } else { "" };
    format!("(\"{dtype}\", ({}{comma}))", dims.join(", "))
}

/// The constants the runtime reads.
pub fn facts(
    forward: &Graph,
    train: Option<&Train>,
    train_graph: Option<&Graph>,
    parallel: Option<&ParallelPolicy>,
    plan: Option<&PlanFile>,
    pipelined: bool,
) -> String {
    let params_graph = train_graph.unwrap_or(forward);
    let mut params: Vec<(String, TensorType, bool)> = params_graph
        .node_ids()
        .into_iter()
        .filter_map(|id| match &params_graph.node(id).kind {
            NodeKind::Param {
                path, trainable, ..
            } => Some((
                path.clone(),
                params_graph.node(id).outputs[0].clone(),
                *trainable,
            )),
            _ => None,
        })
        .collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let mut s = String::from("# The model's interface, as exported.\n");
    writeln!(s, "MODEL = {}", py_str(&forward.name)).expect("String");
    writeln!(s, "INPUTS = {}", inputs_literal(forward)).expect("String");
    let outputs = py_list(forward.outputs.iter().map(|(n, _)| py_str(n)));
    writeln!(s, "OUTPUTS = {outputs}").expect("String");
    s.push_str("# Parameter path: (dtype, shape, trainable).\nPARAMS = {\n");
    for (path, ty, trainable) in &params {
        let t = if *trainable { "True" } else { "False" };
        let ty = type_literal(ty);
        let (dtype_shape, _) = ty.rsplit_once(')').expect("a tuple literal");
        writeln!(s, "    {}: {dtype_shape}, {t}),", py_str(path)).expect("String");
    }
    s.push_str("}\n");
    match (train, train_graph) {
        (Some(t), Some(g)) => s.push_str(&train_literal(t, g, &params)),
        _ => s.push_str("TRAIN = None\n"),
    }
    match (plan, parallel) {
        (Some(plan), Some(p)) if plan.devices > 1 => {
            s.push_str(&plan_mesh_literal(plan, p, &params, pipelined))
        }
        (_, Some(p)) if p.mode != ParallelMode::StandAlone && !p.mesh.is_empty() => {
            s.push_str(&mesh_literal(p, &params, pipelined))
        }
        _ => s.push_str("MESH = None\n"),
    }
    s
}

/// `TRAIN = {…}`: the data inputs, the optimizer, each trained parameter's weight decay (0
/// where a `no_decay` pattern matches, by the check crate's matcher), clipping and schedule.
fn train_literal(train: &Train, graph: &Graph, params: &[(String, TensorType, bool)]) -> String {
    let spec = &train.spec;
    let mut s = String::from("TRAIN = {\n");
    writeln!(s, "    \"name\": {},", py_str(&spec.name.name)).expect("String");
    writeln!(s, "    \"inputs\": {},", inputs_literal(graph)).expect("String");
    let labels = py_list(spec.labels.iter().map(|(n, _)| py_str(&n.name)));
    writeln!(s, "    \"labels\": {labels},").expect("String");
    if let Some(opt) = spec.optimizer {
        let kind = match opt.kind {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
        };
        writeln!(
            s,
            "    \"optimizer\": {{\"kind\": \"{kind}\", \"lr\": {}, \"betas\": ({}, {}), \"eps\": {}, \"momentum\": {}, \"nesterov\": {}}},",
            py_float(opt.lr),
            py_float(opt.betas.0),
            py_float(opt.betas.1),
            py_float(opt.eps),
            py_float(opt.momentum),
            if opt.nesterov { "True" } else { "False" }
        )
        .expect("String");
        s.push_str("    \"weight_decay\": {\n");
        for (path, _, trainable) in params {
            if !trainable {
                continue;
            }
            let excluded = spec.no_decay.iter().any(|(pat, _)| pat.matches(path));
            let wd = if excluded { 0.0 } else { opt.weight_decay };
            writeln!(s, "        {}: {},", py_str(path), py_float(wd)).expect("String");
        }
        s.push_str("    },\n");
    }
    let clip = spec.clip_grad_norm.map_or("None".to_string(), py_float);
    writeln!(s, "    \"clip_grad_norm\": {clip},").expect("String");
    let schedule = match spec.schedule {
        Schedule::Constant => "None".to_string(),
        Schedule::Warmup {
            decay,
            warmup,
            total,
            min_lr,
        } => format!(
            "{{\"decay\": \"{}\", \"warmup\": {warmup}, \"total\": {total}, \"min_lr\": {}}}",
            match decay {
                Decay::Cosine => "cosine",
                Decay::Linear => "linear",
            },
            py_float(min_lr)
        ),
    };
    writeln!(s, "    \"schedule\": {schedule},").expect("String");
    s.push_str("}\n");
    s
}

/// What `MESH` holds, whichever source it comes from: the mesh's name, its axes, the axes
/// the batch is split over, the parameters' partition specs, the optimizer states' specs where
/// they differ from their parameter's, and whether gradients take the states' specs.
struct MeshFacts {
    name: String,
    axes: Vec<(String, i64)>,
    batch: Vec<String>,
    params: Vec<(String, Vec<Option<String>>)>,
    states: Vec<(String, Vec<Option<String>>)>,
    shard_grads: bool,
}

impl MeshFacts {
    /// `MESH = {…}` as the runtime reads it.
    fn literal(&self) -> String {
        let specs = |list: &[(String, Vec<Option<String>>)]| {
            list.iter().fold(String::new(), |mut out, (path, spec)| {
                let spec = py_list(
                    spec.iter()
                        .map(|a| a.as_deref().map_or("None".to_string(), py_str)),
                );
                writeln!(out, "        {}: {spec},", py_str(path)).expect("String");
                out
            })
        };
        let axes = py_list(
            self.axes
                .iter()
                .map(|(a, n)| format!("({}, {n})", py_str(a))),
        );
        format!(
            "MESH = {{\n    \"name\": {},\n    \"axes\": {axes},\n    \"batch\": {},\n    \"params\": {{\n{}    }},\n    \"states\": {{\n{}    }},\n    \"shard_grads\": {},\n}}\n",
            py_str(&self.name),
            py_list(self.batch.iter().map(|b| py_str(b))),
            specs(&self.params),
            specs(&self.states),
            if self.shard_grads { "True" } else { "False" }
        )
    }
}

/// `MESH` from the declaration: the mesh axes, the axes the batch is split over (every axis in
/// `data` mode, `dp` in the semi-auto and auto modes, as
/// [`ParallelPolicy::data_parallel_size`] counts), and each parameter's spec from the first
/// shard rule of its rank matching its path (the rule the checker validated), in the modes that
/// honour shard rules; no optimizer sharding.
fn mesh_literal(
    policy: &ParallelPolicy,
    params: &[(String, TensorType, bool)],
    pipelined: bool,
) -> String {
    // A pipeline that is not mirrored has its mesh axis (one neither `dp` nor used by a shard
    // rule, as the planner counts stages) left out: every device runs every layer.
    let used = |axis: &str| {
        policy
            .shards
            .iter()
            .any(|r| r.axes.iter().any(|a| a.as_deref() == Some(axis)))
    };
    let axes = policy
        .mesh
        .iter()
        .filter(|(a, _)| {
            pipelined
                || policy.pipeline.is_none()
                || policy.mode == ParallelMode::Data
                || a == "dp"
                || used(a)
        })
        .map(|(a, n)| (a.clone(), *n))
        .collect();
    let batch = match policy.mode {
        ParallelMode::Data => policy.mesh.iter().map(|(a, _)| a.clone()).collect(),
        _ if policy.axis_size("dp").is_some() => vec!["dp".to_string()],
        _ => Vec::new(),
    };
    let params = params
        .iter()
        .filter(|_| policy.mode.splits_ops())
        .filter_map(|(path, ty, _)| {
            let rule = policy
                .shards
                .iter()
                .find(|r| r.axes.len() == ty.shape.len() && r.pattern.matches(path))?;
            Some((path.clone(), rule.axes.clone()))
        })
        .collect();
    MeshFacts {
        name: policy.name.name.clone(),
        axes,
        batch,
        params,
        states: Vec::new(),
        shard_grads: false,
    }
    .literal()
}

/// `MESH` from the per-device plan: its axes with a degree above 1 in the declaration's order
/// (the pipeline axis only when the program runs the pipeline), the batch over the
/// data-parallel axis, each split parameter's spec as the plan splits it, and the plan's
/// optimizer sharding (ZeRO, MindSpore's `optimizer_shard`) over the data-parallel axis: the
/// optimizer states' specs from level 1, the gradients' from level 2 (`shard_grads`), the
/// parameters' own from level 3 — each on the first dim the tensor parallelism leaves whole
/// that the replicas divide (a tensor with none stays whole).
fn plan_mesh_literal(
    plan: &PlanFile,
    policy: &ParallelPolicy,
    params: &[(String, TensorType, bool)],
    pipelined: bool,
) -> String {
    let degree = |key: &str| plan.mesh.get(key).copied().unwrap_or(1);
    let declared = |key: &str| {
        let name = plan.axis_name(key);
        policy
            .mesh
            .iter()
            .position(|(a, _)| a == name)
            .unwrap_or(usize::MAX)
    };
    let mut keys: Vec<&str> = ["dp", "pp", "tp"]
        .into_iter()
        .filter(|&k| degree(k) > 1 && (k != "pp" || pipelined))
        .collect();
    keys.sort_by_key(|k| declared(k));
    let dp = degree("dp");
    let dp_name = plan.axis_name("dp");
    let level = if dp > 1 { plan.optimizer_shard } else { 0 };
    let (mut param_specs, mut state_specs) = (Vec::new(), Vec::new());
    for (path, ty, trainable) in params {
        let tensor: Vec<Option<String>> = plan
            .shardings
            .get(path)
            .cloned()
            .unwrap_or_else(|| vec![None; ty.shape.len()]);
        let mut sharded = tensor.clone();
        if let Some(d) = (0..ty.shape.len()).find(|&d| tensor[d].is_none() && ty.shape[d] % dp == 0)
        {
            sharded[d] = Some(dp_name.to_string());
        }
        let param = if level >= 3 && *trainable {
            &sharded
        } else {
            &tensor
        };
        if param.iter().any(Option::is_some) {
            param_specs.push((path.clone(), param.clone()));
        }
        if level >= 1 && *trainable && sharded != tensor {
            state_specs.push((path.clone(), sharded));
        }
    }
    MeshFacts {
        name: policy.name.name.clone(),
        axes: keys
            .iter()
            .map(|k| (plan.axis_name(k).to_string(), degree(k)))
            .collect(),
        batch: match dp > 1 {
            true => vec![dp_name.to_string()],
            false => Vec::new(),
        },
        params: param_specs,
        states: state_specs,
        shard_grads: level >= 2,
    }
    .literal()
}
