//! Per-device plans of a training step on many devices: does every device fit, and how long a
//! step takes — for the strategy the `parallel` declaration fixes (`semi_auto`, `data`,
//! `stand_alone`) or the one [`search::search`] finds (`auto`). The result is `NAME.plan.json`
//! ([`PlanFile`]); docs/parallel.md states the formulas.

pub mod estimate;
pub mod search;
pub mod workload;

use std::collections::BTreeMap;

use serde::Serialize;

pub use estimate::{Breakdown, Cluster, Estimate, Recompute, Schedule, Strategy, Training};
use search::{Found, Space, Workloads};

/// A single-knob change to a strategy and what it would give.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIf {
    /// The change, as the user would write it (`optimizer_shard = level2`).
    pub change: String,
    /// The largest per-device total after the change.
    pub peak_bytes: u64,
    /// Step time after the change.
    pub step_time_s: f64,
    /// Whether every device then fits.
    pub fits: bool,
}

/// One group of devices with identical plans: a pipeline stage's ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceGroup {
    /// First and last rank, inclusive (ranks are numbered stage-major, then data, then tensor).
    pub ranks: [i64; 2],
    /// The pipeline stage.
    pub stage: i64,
    /// The layers it runs, `[first, end)`.
    pub layers: [usize; 2],
    /// Memory of each of its ranks.
    pub memory: Breakdown,
}

/// How the strategy was found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchInfo {
    /// The parallel mode.
    pub mode: String,
    /// Seconds the planning took.
    pub seconds: f64,
    /// Strategies estimated.
    pub candidates: usize,
}

/// `NAME.plan.json`: the per-device plan of a training step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanFile {
    /// Devices used.
    pub devices: i64,
    /// Degrees per axis: `dp`, `tp`, `pp`.
    pub mesh: BTreeMap<String, i64>,
    /// Micro-batches per step per data-parallel replica.
    pub micro_batches: i64,
    /// The pipeline schedule.
    pub schedule: Schedule,
    /// Optimizer-shard level (0–3).
    pub optimizer_shard: u8,
    /// The recompute choice.
    pub recompute: Recompute,
    /// Whether every device fits `max_device_memory`.
    pub fits: bool,
    /// The per-device budget, bytes.
    pub max_device_memory: u64,
    /// Estimated seconds per step.
    pub step_time_s: f64,
    /// Compute on the critical path, seconds.
    pub compute_s: f64,
    /// Communication not hidden behind compute, seconds.
    pub communication_s: f64,
    /// Idle share of the pipeline, (p − 1) / m.
    pub bubble_fraction: f64,
    /// Model FLOP/s per device the estimate implies (forward + backward, no recompute).
    pub model_flops_per_device: f64,
    /// Per stage, its worst rank.
    pub per_device: Vec<DeviceGroup>,
    /// Collectives per step on a device of the slowest stage.
    pub collectives: Vec<estimate::Collective>,
    /// Redistributions the layout could not avoid: the op, bytes.
    pub redistributions: Vec<(String, u64)>,
    /// Split parameters: path → per-dim axis (`null` where whole).
    pub shardings: BTreeMap<String, Vec<Option<String>>>,
    /// Memory and step time if one knob changed.
    pub what_if: Vec<WhatIf>,
    /// How the strategy was found.
    pub search: SearchInfo,
}

/// Plans `space` and describes the result as a [`PlanFile`]: the best strategy in the space (one
/// strategy when every degree is fixed), with what-if deltas for single knobs. `None` when no
/// strategy in the space is possible (nothing divides the batch).
pub fn plan(
    workloads: &mut Workloads,
    space: &Space,
    train: Training,
    cluster: &Cluster,
    mode: &str,
) -> Option<PlanFile> {
    let start = std::time::Instant::now();
    let found = search::search(workloads, space, train, cluster)?;
    let seconds = start.elapsed().as_secs_f64();
    let what_if = what_ifs(workloads, space, &found, train, cluster);
    Some(describe(&found, what_if, cluster, mode, seconds))
}

/// The strategies one knob away from `found`'s: each optimizer-shard level, recompute choice,
/// twice the tensor or pipeline degree (halving data parallel), twice the micro-batches.
fn what_ifs(
    workloads: &mut Workloads,
    space: &Space,
    found: &Found,
    train: Training,
    cluster: &Cluster,
) -> Vec<WhatIf> {
    let s = found.best.strategy;
    let mut out = Vec::new();
    let mut try_space = |change: String, sp: Space, workloads: &mut Workloads| {
        if let Some(f) = search::search(workloads, &sp, train, cluster) {
            out.push(WhatIf {
                change,
                peak_bytes: f.best.peak_bytes(),
                step_time_s: f.best.step_time_s,
                fits: f.fits,
            });
        }
    };
    let fixed = Space {
        dp: Some(s.dp),
        tp: Some(s.tp),
        pp: Some(s.pp),
        optimizer_shard: Some(s.optimizer_shard),
        recompute: Some(s.recompute),
        ..space.clone()
    };
    for level in 0..=3u8 {
        if level != s.optimizer_shard && s.dp > 1 {
            let sp = Space {
                optimizer_shard: Some(level),
                ..fixed.clone()
            };
            try_space(
                format!("optimizer_shard = {}", level_name(level)),
                sp,
                workloads,
            );
        }
    }
    for r in [Recompute::None, Recompute::Selective, Recompute::Full] {
        if r != s.recompute {
            let sp = Space {
                recompute: Some(r),
                ..fixed.clone()
            };
            try_space(format!("recompute = {}", recompute_name(r)), sp, workloads);
        }
    }
    if s.dp % 2 == 0 {
        let sp = Space {
            dp: Some(s.dp / 2),
            tp: Some(s.tp * 2),
            ..fixed.clone()
        };
        try_space(
            format!("tensor parallel {} (data parallel {})", s.tp * 2, s.dp / 2),
            sp,
            workloads,
        );
        let sp = Space {
            dp: Some(s.dp / 2),
            pp: Some(s.pp * 2),
            ..fixed.clone()
        };
        try_space(
            format!("{} pipeline stages (data parallel {})", s.pp * 2, s.dp / 2),
            sp,
            workloads,
        );
    }
    out
}

/// MindSpore's word for an optimizer-shard level.
pub fn level_name(level: u8) -> &'static str {
    ["none", "level1", "level2", "level3"][level.min(3) as usize]
}

/// The `.msl` word for a recompute choice.
pub fn recompute_name(r: Recompute) -> &'static str {
    match r {
        Recompute::None => "none",
        Recompute::Selective => "selective",
        Recompute::Full => "full",
    }
}

fn describe(
    found: &Found,
    what_if: Vec<WhatIf>,
    cluster: &Cluster,
    mode: &str,
    seconds: f64,
) -> PlanFile {
    let e = &found.best;
    let s = e.strategy;
    let per_stage = s.dp * s.tp;
    let per_device = e
        .stages
        .iter()
        .map(|st| DeviceGroup {
            ranks: [st.stage * per_stage, (st.stage + 1) * per_stage - 1],
            stage: st.stage,
            layers: [st.layers.0, st.layers.1],
            memory: st.memory,
        })
        .collect();
    let w = &found.workload;
    let flops: u64 = w
        .layers
        .iter()
        .chain([&w.head, &w.tail])
        .map(|l| l.flops)
        .sum();
    // Model FLOPs per step: forward + backward (3× forward) on every micro-batch of every replica.
    let model_flops = 3.0 * flops as f64 * (s.micro_batches * s.dp) as f64;
    let mesh = [("dp", s.dp), ("tp", s.tp), ("pp", s.pp)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    PlanFile {
        devices: s.devices(),
        mesh,
        micro_batches: s.micro_batches,
        schedule: s.schedule,
        optimizer_shard: s.optimizer_shard,
        recompute: s.recompute,
        fits: found.fits,
        max_device_memory: cluster.budget,
        step_time_s: e.step_time_s,
        compute_s: e.compute_s,
        communication_s: e.communication_s,
        bubble_fraction: e.bubble_fraction,
        model_flops_per_device: model_flops / e.step_time_s.max(1e-12) / s.devices().max(1) as f64,
        per_device,
        collectives: e.collectives.clone(),
        redistributions: w
            .layers
            .iter()
            .chain([&w.head, &w.tail])
            .flat_map(|l| l.all_gathers.iter().cloned())
            .collect(),
        shardings: w.shardings.clone(),
        what_if,
        search: SearchInfo {
            mode: mode.to_string(),
            seconds,
            candidates: found.candidates,
        },
    }
}
