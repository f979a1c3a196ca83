//! Per-device plans of a training step on many devices: does every device fit, and how long a
//! step takes — for the strategy the `parallel` declaration fixes (`semi_auto`, `data`,
//! `stand_alone`) or the one [`search::search`] finds (`auto`). The result is `NAME.plan.json`
//! ([`PlanFile`]); docs/parallel.md states the formulas.

pub mod estimate;
pub mod explain;
pub mod search;
pub mod svg;
pub mod workload;

use std::collections::BTreeMap;

use serde::Serialize;

use estimate::estimate;
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
    /// The layers it runs, `[first, end)`: one range, or one per model chunk when interleaved.
    pub layers: Vec<[usize; 2]>,
    /// Memory of each of its ranks.
    pub memory: Breakdown,
    /// Forward and backward of one micro-batch (all its chunks), communication included.
    pub seconds_per_micro_batch: f64,
    /// On the host target, what the bundled executor allocates on each of its ranks, from the
    /// compiled per-rank programs (`mslc build --entry TRAIN`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executor: Option<ExecutorMemory>,
}

impl DeviceGroup {
    /// Its ranks as reports name them: `rank 1`, or `ranks 704–767`.
    pub fn ranks_text(&self) -> String {
        match self.ranks {
            [first, last] if first == last => format!("rank {first}"),
            [first, last] => format!("ranks {first}–{last}"),
        }
    }
}

/// What one rank of `mslc train` allocates, known exactly once its programs are compiled:
/// beside the model states and activations that [`Breakdown`] counts for any target, the bundled
/// executor keeps each thread's kernel scratch, staging buffers, weights packed ahead for the
/// GEMMs of a program that does not change them, its prepared programs, on a pipeline stage a
/// forward and an update program beside the step and the messages it holds, and, on the
/// threads backend, the last contributions of its collectives.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ExecutorMemory {
    /// Executor threads per rank.
    pub threads: usize,
    /// What the rank holds before the reserve (its fields appear as the object's own).
    #[serde(flatten)]
    pub held: Held,
    /// The `held` bytes with the executor's reserve ([`estimate::executor_reserve`]): the peak
    /// a rank's resident memory is planned not to exceed.
    pub total: u64,
}

/// The parts of an [`ExecutorMemory`] before its reserve, which [`ExecutorMemory::holding`]
/// adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Held {
    /// Bytes the rank's programs allocate: their memory plans and each thread's scratch.
    pub allocated: u64,
    /// Bytes the executor keeps for the rank's prepared programs
    /// ([`crate::memory::MemoryPlan::program_bytes`]).
    pub programs: u64,
    /// Bytes the rank's collectives leave in the threads backend's exchanges, which keep the
    /// contributions of their last rounds (not the executor's to allocate).
    pub exchanged: u64,
    /// Bytes of a pipeline stage's messages it holds at most: the values it received for
    /// its micro-batches in flight, a backward's received gradients, and its sends not yet
    /// taken (0 off a pipeline; an interleaved device's on its first chunk).
    pub pipelined: u64,
}

impl Held {
    /// Both together.
    fn plus(self, other: Held) -> Held {
        Held {
            allocated: self.allocated.saturating_add(other.allocated),
            programs: self.programs.saturating_add(other.programs),
            exchanged: self.exchanged.saturating_add(other.exchanged),
            pipelined: self.pipelined.saturating_add(other.pipelined),
        }
    }

    /// Their sum.
    fn bytes(self) -> u64 {
        self.allocated
            .saturating_add(self.programs)
            .saturating_add(self.exchanged)
            .saturating_add(self.pipelined)
    }
}

impl ExecutorMemory {
    /// The memory of a rank holding `held` on `threads` threads, with the executor's reserve.
    pub fn holding(held: Held, threads: usize) -> ExecutorMemory {
        let bytes = held.bytes();
        ExecutorMemory {
            threads,
            held,
            total: bytes.saturating_add(estimate::executor_reserve(bytes)),
        }
    }

    /// This memory on a pipeline stage that holds `pipelined` bytes of messages at most.
    pub fn with_pipelined(self, pipelined: u64) -> ExecutorMemory {
        Self::holding(
            Held {
                pipelined,
                ..self.held
            },
            self.threads,
        )
    }

    /// The planned peak with `transient` bytes held between steps beside the step's buffers
    /// (the one whole tensor a gathered checkpoint holds at a time): they come out of the
    /// reserve, whose slack the step's transients leave free between steps, and add what
    /// exceeds it.
    pub fn with_transient(&self, transient: u64) -> u64 {
        let reserve = self.total - self.held.bytes();
        self.total.saturating_add(transient.saturating_sub(reserve))
    }

    /// What `parts` hold together on `threads` threads (the chunk-ranks of an interleaved
    /// device).
    pub fn together(parts: impl IntoIterator<Item = ExecutorMemory>, threads: usize) -> Self {
        let held = parts
            .into_iter()
            .fold(Held::default(), |sum, m| sum.plus(m.held));
        Self::holding(held, threads)
    }
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
    /// The user's name of each of those axes (`tp` → `mp` when the shard rules split over a
    /// mesh axis `mp`): what reports, diagnostics and `shardings` show.
    pub axis_names: BTreeMap<String, String>,
    /// Micro-batches per step per data-parallel replica.
    pub micro_batches: i64,
    /// The pipeline schedule.
    pub schedule: Schedule,
    /// Optimizer-shard level (0–3).
    pub optimizer_shard: u8,
    /// The recompute choice.
    pub recompute: Recompute,
    /// Whether sequence parallelism splits the rest of each layer over the tensor axis.
    pub sequence_parallel: bool,
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
    /// Parameters a shard rule asks to split but whose dim the degree does not divide, so
    /// they stay whole: path, dim, size.
    pub undivided: Vec<(String, usize, i64)>,
    /// Memory and step time if one knob changed.
    pub what_if: Vec<WhatIf>,
    /// How the strategy was found.
    pub search: SearchInfo,
    /// Why `recompute` is not the policy's choice, when the executor that runs the plan fixes
    /// it ([`Space::stage_recompute`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute_fixed_by: Option<String>,
}

impl PlanFile {
    /// The user's name of the planner's axis `key` (`dp`, `tp`, `pp`); the key itself when the
    /// user named none.
    pub fn axis_name<'a>(&'a self, key: &'a str) -> &'a str {
        self.axis_names.get(key).map_or(key, String::as_str)
    }

    /// Gives the planner's axes the user's names (`key` → name), in `axis_names` and in the
    /// split parameters' specs.
    pub fn name_axes(&mut self, names: BTreeMap<String, String>) {
        for spec in self.shardings.values_mut() {
            for axis in spec.iter_mut().flatten() {
                if let Some(name) = names.get(axis.as_str()) {
                    *axis = name.clone();
                }
            }
        }
        self.axis_names.extend(names);
    }

    /// `data 2 × tensor 2 (mp) × pipeline 2`: the degrees, each with the user's name of its
    /// axis where that differs from the planner's key.
    pub fn degrees_text(&self) -> String {
        [("data", "dp"), ("tensor", "tp"), ("pipeline", "pp")]
            .iter()
            .map(|&(word, key)| {
                let degree = self.mesh.get(key).copied().unwrap_or(1);
                match self.axis_name(key) {
                    name if name == key => format!("{word} {degree}"),
                    name => format!("{word} {degree} ({name})"),
                }
            })
            .collect::<Vec<_>>()
            .join(" × ")
    }

    /// The strategy the plan describes.
    pub fn strategy(&self) -> Strategy {
        Strategy {
            dp: self.mesh["dp"],
            tp: self.mesh["tp"],
            pp: self.mesh["pp"],
            micro_batches: self.micro_batches,
            schedule: self.schedule,
            optimizer_shard: self.optimizer_shard,
            recompute: self.recompute,
            sequence_parallel: self.sequence_parallel,
        }
    }
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
    let mut file = describe(&found, what_if, cluster, mode, seconds);
    if space.recompute_fixed_at(found.best.strategy.pp).is_some() {
        file.recompute_fixed_by =
            Some("the executor re-runs each stage's forward in its backward".to_string());
    }
    Some(file)
}

/// The strategies one knob away from `found`'s, each planned: each other optimizer-shard
/// level and recompute choice, sequence parallelism toggled, twice or half the tensor degree
/// and twice the stages (data parallel taking up the difference), and twice or half the
/// micro-batches (the micro-batch halved or doubled, the batch per step unchanged).
fn what_ifs(
    workloads: &mut Workloads,
    space: &Space,
    found: &Found,
    train: Training,
    cluster: &Cluster,
) -> Vec<WhatIf> {
    let s = found.best.strategy;
    let mut out = Vec::new();
    let fixed = Space {
        dp: Some(s.dp),
        tp: Some(s.tp),
        pp: Some(s.pp),
        optimizer_shard: Some(s.optimizer_shard),
        recompute: Some(s.recompute),
        sequence_parallel: Some(s.sequence_parallel),
        ..space.clone()
    };
    let mut changes: Vec<(String, Space)> = Vec::new();
    for level in (0..=3u8).filter(|&l| l != s.optimizer_shard && s.dp > 1) {
        let sp = Space {
            optimizer_shard: Some(level),
            ..fixed.clone()
        };
        changes.push((format!("optimizer_shard = {}", level_name(level)), sp));
    }
    // Where the executor fixes what its stages recompute, no other choice is one knob away.
    let recompute_fixed = space.recompute_fixed_at(s.pp).is_some();
    for r in [Recompute::None, Recompute::Selective, Recompute::Full] {
        if r != s.recompute && !recompute_fixed {
            let sp = Space {
                recompute: Some(r),
                ..fixed.clone()
            };
            changes.push((format!("recompute = {}", recompute_name(r)), sp));
        }
    }
    if s.tp > 1 {
        let sp = Space {
            sequence_parallel: Some(!s.sequence_parallel),
            ..fixed.clone()
        };
        changes.push((format!("sequence_parallel = {}", !s.sequence_parallel), sp));
    }
    if s.dp % 2 == 0 {
        let (dp, tp, pp) = (Some(s.dp / 2), Some(s.tp * 2), Some(s.pp * 2));
        let more_tp = Space {
            dp,
            tp,
            ..fixed.clone()
        };
        changes.push((
            format!("tensor parallel {} (data parallel {})", s.tp * 2, s.dp / 2),
            more_tp,
        ));
        let more_pp = Space {
            dp,
            pp,
            ..fixed.clone()
        };
        changes.push((
            format!("{} pipeline stages (data parallel {})", s.pp * 2, s.dp / 2),
            more_pp,
        ));
    }
    if s.tp % 2 == 0 {
        let fewer_tp = Space {
            dp: Some(s.dp * 2),
            tp: Some(s.tp / 2),
            ..fixed.clone()
        };
        changes.push((
            format!("tensor parallel {} (data parallel {})", s.tp / 2, s.dp * 2),
            fewer_tp,
        ));
    }
    for (change, sp) in changes {
        if let Some(f) = search::search(workloads, &sp, train, cluster) {
            out.push(WhatIf {
                change,
                peak_bytes: f.best.peak_bytes(),
                step_time_s: f.best.step_time_s,
                fits: f.fits,
            });
        }
    }
    // The micro-batch count with the batch per step fixed: the micro-batch changes size.
    let mut micro = |m: i64, factor: f64| {
        let strategy = Strategy {
            micro_batches: m,
            ..s
        };
        let e = estimate(&found.workload.scaled(factor), strategy, train, cluster);
        out.push(WhatIf {
            change: format!(
                "{m} micro-batches of {} samples",
                (space.micro_batch as f64 * factor) as i64
            ),
            peak_bytes: e.peak_bytes(),
            step_time_s: e.step_time_s,
            fits: e.peak_bytes() <= cluster.budget,
        });
    };
    if space.micro_batch % 2 == 0 {
        micro(s.micro_batches * 2, 0.5);
    }
    if s.micro_batches % 2 == 0 && s.micro_batches / 2 >= s.pp {
        micro(s.micro_batches / 2, 2.0);
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

/// Each planner axis named by itself, until [`PlanFile::name_axes`] gives the user's names.
fn mesh_keys(mesh: &BTreeMap<String, i64>) -> BTreeMap<String, String> {
    mesh.keys().map(|k| (k.clone(), k.clone())).collect()
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
            layers: st.layers.iter().map(|&(a, b)| [a, b]).collect(),
            memory: st.memory,
            seconds_per_micro_batch: st.compute_s + st.communication_s,
            executor: None,
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
        axis_names: mesh_keys(&mesh),
        mesh,
        micro_batches: s.micro_batches,
        schedule: s.schedule,
        optimizer_shard: s.optimizer_shard,
        recompute: s.recompute,
        sequence_parallel: s.sequence_parallel,
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
        undivided: w.undivided.clone(),
        what_if,
        search: SearchInfo {
            mode: mode.to_string(),
            seconds,
            candidates: found.candidates,
        },
        recompute_fixed_by: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transient held between steps comes out of the reserve while it fits there, and adds
    /// only what exceeds it.
    #[test]
    fn a_transient_takes_the_reserve_first() {
        let held = Held {
            allocated: 900_000,
            programs: 100_000,
            ..Held::default()
        };
        let rank = ExecutorMemory::holding(held, 2);
        let reserve = rank.total - 1_000_000;
        assert_eq!(reserve, estimate::executor_reserve(1_000_000));
        assert_eq!(rank.with_transient(0), rank.total);
        assert_eq!(rank.with_transient(reserve), rank.total);
        assert_eq!(rank.with_transient(reserve + 4096), rank.total + 4096);
    }
}
