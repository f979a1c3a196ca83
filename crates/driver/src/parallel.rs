//! From a checked `train` with its `parallel`, `memory`, `precision` and `target` declarations to
//! the per-device plan ([`mslc_plan::parallel::PlanFile`]): the degrees the mesh and shard rules
//! fix (or the search in `auto` mode), and the coded errors when they disagree (E0901), the batch
//! does not split (E0902), nothing is possible (E0903) or a device does not fit (E0900).

use std::collections::BTreeMap;

use mslc_check::decls::Train;
use mslc_check::policy::{
    AmpLevel, MemoryPolicy, OptimizerKind, OptimizerShard, ParallelMode, ParallelPolicy,
    PipelineSchedule, PrecisionPolicy, Recompute as RecomputePolicy,
};
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic};
use mslc_core::units::human_bytes;
use mslc_plan::parallel::explain::generic_path;
use mslc_plan::parallel::explain::{explain, Explanation};
use mslc_plan::parallel::search::{search, Space, Workloads};
use mslc_plan::parallel::workload::{WeightSplits, Widths};
use mslc_plan::parallel::{
    level_name, plan, recompute_name, Cluster, PlanFile, Recompute, Schedule, Training,
};

use crate::target::target_from_spec;

/// What planning a train needs, read off its declarations once.
struct Setup<'c> {
    graph: &'c mslc_core::program::Model,
    parallel: Option<&'c ParallelPolicy>,
    memory: Option<&'c MemoryPolicy>,
    /// The shard rules' split dim per parameter path.
    splits: BTreeMap<String, usize>,
    mode: ParallelMode,
    space: Space,
    training: Training,
    widths: Widths,
    cluster: Cluster,
    micro_batch: i64,
}

impl Setup<'_> {
    /// The workloads of the graph under the shard rules (or, in `auto` without rules, the
    /// layout the propagation chooses).
    fn workloads(&self) -> Workloads<'_> {
        let splits = match self.mode {
            ParallelMode::Auto if self.splits.is_empty() => WeightSplits::Chosen,
            _ => WeightSplits::Given(&self.splits),
        };
        Workloads::new(self.graph, splits, self.widths)
    }
}

/// The [`Setup`] of `train`; `None` when it names no target or neither a parallel nor a memory
/// policy. E0901/E0902 when the mesh or the batch disagree with the degrees.
fn setup<'c>(checked: &'c Checked, train: &'c Train) -> Result<Option<Setup<'c>>, Box<Diagnostic>> {
    let decls = &checked.decls;
    let (Some(target), Some(graph)) = (train.target.map(|i| &decls.targets[i]), &train.graph)
    else {
        return Ok(None);
    };
    let parallel = train.parallel.map(|i| &decls.parallels[i]);
    let memory = train.memory.map(|i| &decls.memories[i]);
    if parallel.is_none() && memory.is_none() {
        return Ok(None);
    }
    let precision = train.precision.map(|i| &decls.precisions[i]);
    let spec = &train.spec;
    let target = target_from_spec(target).shared_by(parallel.map_or(1, |p| p.devices));
    let budget = memory
        .and_then(|m| m.max_device_memory)
        .unwrap_or(target.memory_bytes);
    let training = training(precision, spec.optimizer.map(|o| o.kind));
    let widths = Widths {
        act_bytes: training.act_bytes,
        tp: 1,
        flops_per_s: target.peak(compute_dtype(precision)) * target.compute_efficiency,
        bandwidth: target.bandwidth * mslc_plan::parallel::estimate::BANDWIDTH_EFFICIENCY,
    };
    let micro_batch = graph
        .inputs
        .first()
        .and_then(|i| graph.ty(i.value).shape.first().copied())
        .unwrap_or(1)
        .max(1);
    let splits = parallel
        .map(|p| weight_splits(p, graph))
        .unwrap_or_default();
    let (mode, mut space) = space(parallel, memory, spec, micro_batch)?;
    if target.is_host() {
        space.stage_recompute = Some(Recompute::Full);
    }
    Ok(Some(Setup {
        graph,
        parallel,
        memory,
        splits,
        mode,
        space,
        training,
        widths,
        cluster: Cluster { target, budget },
        micro_batch,
    }))
}

/// The plan of `train`, or `None` when it names no target or neither a parallel nor a memory
/// policy (nothing to plan for). An error when the policies disagree or a device does not fit.
pub fn plan_train(checked: &Checked, train: &Train) -> Result<Option<PlanFile>, Box<Diagnostic>> {
    let Some(setup) = setup(checked, train)? else {
        return Ok(None);
    };
    let (spec, parallel, space) = (&train.spec, setup.parallel, &setup.space);
    let layers: std::collections::BTreeSet<String> = setup
        .graph
        .nodes
        .iter()
        .filter_map(|n| mslc_plan::parallel::workload::layer_key(&n.origin))
        .collect();
    if let (Some(pp), Some(pipeline), Some(p)) = (space.pp, pipeline_of(parallel), parallel) {
        interleaving_fits(p, &pipeline, pp, layers.len() as i64, spec)?;
    }
    let mut workloads = setup.workloads();
    let (training, cluster) = (setup.training, &setup.cluster);
    let Some(file) = plan(
        &mut workloads,
        space,
        training,
        cluster,
        setup.mode.keyword(),
    ) else {
        if let (Some(pp), Some(pipeline)) = (space.pp, pipeline_of(parallel)) {
            if pp > layers.len() as i64 {
                return Err(Box::new(
                    Diagnostic::error(
                        Code::E0903,
                        parallel.map_or(spec.file, |p| p.file),
                        pipeline.span,
                        format!(
                            "{pp} pipeline stages, but the model has {} layers to split",
                            layers.len()
                        ),
                    )
                    .with_label(format!("{pp} stages"))
                    .with_help(format!("use at most {} stages", layers.len().max(1))),
                ));
            }
        }
        return Err(no_strategy(
            spec,
            parallel,
            space.devices,
            setup.micro_batch,
        ));
    };
    let mut file = file;
    if let Some(p) = parallel {
        let stages = file.mesh["pp"];
        file.name_axes(user_axis_names(p, stages));
    }
    if !file.fits {
        let fixes = fit_suggestions(&mut workloads, &setup, &file);
        return Err(does_not_fit(train, parallel, setup.memory, &file, &fixes));
    }
    Ok(Some(file))
}

/// The explanation of `plan` (made by [`plan_train`] for `train`): per parameter its layout,
/// the collectives it causes and the best other layout re-planned; the large activations.
pub fn explain_train(checked: &Checked, train: &Train, plan: &PlanFile) -> Option<Explanation> {
    let setup = setup(checked, train).ok()??;
    let mut workloads = setup.workloads();
    Some(explain(
        &mut workloads,
        plan.strategy(),
        setup.training,
        &setup.cluster,
    ))
}

/// The changes that make a plan fit, cheapest step time first, each planned: the single-knob
/// what-ifs that fit; in the same device count every degree, level and recompute choice
/// searched together (when the policies fixed some); and the fewest devices on which the
/// search finds a plan that fits (doubling, then bisecting between the last two counts).
fn fit_suggestions(workloads: &mut Workloads, setup: &Setup, file: &PlanFile) -> Vec<String> {
    let (train, cluster) = (setup.training, &setup.cluster);
    let mut fixes: Vec<(f64, String)> = file
        .what_if
        .iter()
        .filter(|w| w.fits)
        .map(|w| {
            (
                w.step_time_s,
                format!(
                    "`{}` ({} per device, ~{:.2} s per step)",
                    w.change,
                    human_bytes(w.peak_bytes),
                    w.step_time_s
                ),
            )
        })
        .collect();
    let free = Space {
        dp: None,
        tp: None,
        pp: None,
        optimizer_shard: None,
        recompute: None,
        sequence_parallel: None,
        ..setup.space.clone()
    };
    let fits_on = |workloads: &mut Workloads, devices: i64| {
        let sp = Space {
            devices,
            ..free.clone()
        };
        search(workloads, &sp, train, cluster).filter(|f| f.fits)
    };
    let same = fits_on(workloads, file.devices);
    let constrained = setup.mode != ParallelMode::Auto
        || setup.space.optimizer_shard.is_some()
        || setup.space.recompute.is_some();
    if constrained {
        if let Some(f) = &same {
            let s = f.best.strategy;
            fixes.push((
                f.best.step_time_s,
                format!(
                    "data {} × tensor {} × {} stages, optimizer_shard = {}, recompute = {}{} together ({} per device, ~{:.2} s per step)",
                    s.dp, s.tp, s.pp, level_name(s.optimizer_shard), recompute_name(s.recompute),
                    if s.sequence_parallel { ", sequence_parallel = true" } else { "" },
                    human_bytes(f.best.peak_bytes()), f.best.step_time_s
                ),
            ));
        }
    }
    fixes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<String> = fixes.into_iter().map(|(_, f)| f).collect();
    if same.is_none() {
        let (mut low, mut high) = (file.devices.max(1), None);
        let mut n = low;
        while n <= MAX_SUGGESTED_DEVICES {
            n = n.saturating_mul(2);
            if fits_on(workloads, n).is_some() {
                high = Some(n);
                break;
            }
            low = n;
        }
        if let Some(mut high) = high {
            while high - low > 1 {
                let mid = low + (high - low) / 2;
                match fits_on(workloads, mid) {
                    Some(_) => high = mid,
                    None => low = mid,
                }
            }
            if let Some(f) = fits_on(workloads, high) {
                let s = f.best.strategy;
                out.push(format!(
                    "{high} devices: `mode = auto, devices = {high}` plans data {} × tensor {} × {} stages, {} per device ({} do not fit)",
                    s.dp, s.tp, s.pp, human_bytes(f.best.peak_bytes()),
                    high - 1
                ));
            }
        }
    }
    out
}

/// The largest device count a fit suggestion tries.
const MAX_SUGGESTED_DEVICES: i64 = 65_536;

/// E0904 unless the interleaved schedule's `stages × v` chunks divide the layers; E0905 unless
/// its micro-batches are whole rounds of the stages (Megatron-LM's two conditions).
fn interleaving_fits(
    parallel: &ParallelPolicy,
    pipeline: &mslc_check::policy::Pipeline,
    pp: i64,
    layers: i64,
    spec: &mslc_check::policy::TrainSpec,
) -> Result<(), Box<Diagnostic>> {
    let PipelineSchedule::Interleaved(v) = pipeline.schedule else {
        return Ok(());
    };
    let chunks = pp.saturating_mul(v);
    if chunks > layers || layers % chunks.max(1) != 0 {
        let fitting: Vec<String> = (1..=layers / pp.max(1))
            .filter(|c| layers % (pp * c) == 0)
            .map(|c| c.to_string())
            .collect();
        return Err(Box::new(
            Diagnostic::error(
                Code::E0904,
                parallel.file,
                pipeline.span,
                format!(
                    "interleaved({v}) on {pp} stages cuts the model into {chunks} chunks, but its {layers} layers do not divide into {chunks}"
                ),
            )
            .with_label(format!("{pp} stages × {v} chunks = {chunks}"))
            .with_related(parallel.file, pipeline.stages_span, format!("{pp} stages"))
            .with_help(format!(
                "use a chunk count v with {layers} divisible by {pp}·v: {}",
                fitting.join(", ")
            )),
        ));
    }
    let m = pipeline.micro_batches.saturating_mul(spec.grad_accum);
    if m % pp.max(1) != 0 {
        return Err(Box::new(
            Diagnostic::error(
                Code::E0905,
                parallel.file,
                pipeline.micro_batches_span,
                format!("the interleaved schedule runs micro-batches in rounds of {pp} (the stage count), but there are {m}"),
            )
            .with_label(format!("{m} micro-batches"))
            .with_related(parallel.file, pipeline.stages_span, format!("{pp} stages"))
            .with_help(format!(
                "use a multiple of {pp} micro-batches, e.g. {}",
                (m / pp.max(1) + 1) * pp
            )),
        ));
    }
    Ok(())
}

/// The user's names of the planner's axes: `tp` is the mesh axes the shard rules split over
/// (other than `dp`; `mp×xp` for two), `pp` the remaining mesh axis whose size is the stage
/// count. Axes the mesh does not name keep the planner's key.
pub fn user_axis_names(parallel: &ParallelPolicy, stages: i64) -> BTreeMap<String, String> {
    let sharded = |axis: &str| {
        parallel
            .shards
            .iter()
            .any(|r| r.axes.iter().any(|a| a.as_deref() == Some(axis)))
    };
    let tensor: Vec<&str> = parallel
        .mesh
        .iter()
        .map(|(axis, _)| axis.as_str())
        .filter(|&a| a != "dp" && sharded(a))
        .collect();
    let mut names = BTreeMap::new();
    if !tensor.is_empty() {
        names.insert("tp".to_string(), tensor.join("×"));
    }
    if let Some((axis, _)) = parallel
        .mesh
        .iter()
        .find(|(a, size)| a != "dp" && !sharded(a) && *size == stages && stages > 1)
    {
        names.insert("pp".to_string(), axis.clone());
    }
    names
}

/// Each split parameter's dim over a tensor axis (any mesh axis but `dp`), by the first shard
/// rule whose pattern matches its path.
pub fn weight_splits(
    parallel: &ParallelPolicy,
    graph: &mslc_core::program::Model,
) -> BTreeMap<String, usize> {
    graph
        .params
        .iter()
        .filter_map(|p| {
            let rule = parallel
                .shards
                .iter()
                .find(|r| r.pattern.matches(&p.path))?;
            let dim = rule
                .axes
                .iter()
                .position(|a| a.as_deref().is_some_and(|a| a != "dp"))?;
            Some((p.path.clone(), dim))
        })
        .collect()
}

/// The strategy space the policies leave: one point in `semi_auto`, `data` and `stand_alone`
/// modes (checked against the mesh, E0901, and the batch, E0902); the whole space in `auto`.
fn space(
    parallel: Option<&ParallelPolicy>,
    memory: Option<&MemoryPolicy>,
    spec: &mslc_check::policy::TrainSpec,
    micro_batch: i64,
) -> Result<(ParallelMode, Space), Box<Diagnostic>> {
    let recompute = match memory.map(|m| m.recompute) {
        None | Some(RecomputePolicy::None) => Some(Recompute::None),
        Some(RecomputePolicy::Selective) => Some(Recompute::Selective),
        Some(RecomputePolicy::Full) => Some(Recompute::Full),
        Some(RecomputePolicy::Auto) => None,
    };
    let mode = parallel.map_or(ParallelMode::StandAlone, |p| p.mode);
    let pipeline = parallel.and_then(|p| p.pipeline);
    let level = parallel.map(|p| match p.optimizer_shard {
        OptimizerShard::None => 0,
        OptimizerShard::Level1 => 1,
        OptimizerShard::Level2 => 2,
        OptimizerShard::Level3 => 3,
    });
    let devices = parallel.map_or(1, |p| p.devices);
    let mut space = Space {
        devices,
        batch: spec.batch,
        micro_batch,
        dp: None,
        tp: None,
        pp: None,
        optimizer_shard: level,
        recompute,
        schedule: match pipeline.map(|p| p.schedule) {
            Some(PipelineSchedule::GPipe) => Schedule::GPipe,
            Some(PipelineSchedule::Interleaved(v)) => Schedule::Interleaved(v),
            Some(PipelineSchedule::OneFOneB) | None => Schedule::OneFOneB,
        },
        // Outside `auto`, sequence parallelism is off unless asked for.
        sequence_parallel: match mode {
            ParallelMode::Auto => parallel.and_then(|p| p.sequence_parallel),
            _ => Some(parallel.and_then(|p| p.sequence_parallel).unwrap_or(false)),
        },
        stage_recompute: None,
    };
    let Some(parallel) = parallel else {
        space.dp = Some(1);
        space.tp = Some(1);
        space.pp = Some(1);
        return Ok((mode, space));
    };
    if mode == ParallelMode::Auto {
        if parallel.optimizer_shard == OptimizerShard::None {
            space.optimizer_shard = None;
        }
        return Ok((mode, space));
    }
    let dp = parallel.data_parallel_size();
    let pp = pipeline.map_or(1, |p| p.stages);
    let tp: i64 = match mode {
        ParallelMode::SemiAuto => parallel
            .mesh
            .iter()
            .filter(|(axis, _)| {
                axis != "dp"
                    && parallel
                        .shards
                        .iter()
                        .any(|r| r.axes.iter().any(|a| a.as_deref() == Some(axis)))
            })
            .map(|(_, size)| *size)
            .product(),
        _ => 1,
    };
    if dp.saturating_mul(tp).saturating_mul(pp) != devices {
        let d = Diagnostic::error(
            Code::E0901,
            parallel.file,
            parallel.mesh_span,
            format!(
                "the mesh has {devices} devices, but data parallel {dp} × tensor parallel {tp} × {pp} pipeline stages is {}",
                dp.saturating_mul(tp).saturating_mul(pp)
            ),
        )
        .with_label(format!("{devices} devices"))
        .with_help(if pp > 1 && devices % pp != 0 || dp * tp == devices {
            format!("give the pipeline its own mesh axis, e.g. `pp: {pp}`, so the mesh counts every device ({} in all)", dp * tp * pp)
        } else {
            "make the `dp` axis, the axes the shard rules use and the stage count multiply to the mesh's devices".to_string()
        });
        return Err(Box::new(d));
    }
    let parts = micro_batch.saturating_mul(dp);
    let m = spec.batch / parts.max(1);
    // With a pipeline, accumulated steps are more micro-batches through the same pipeline.
    let expected = pipeline.map_or(spec.grad_accum, |p| {
        p.micro_batches.saturating_mul(spec.grad_accum)
    });
    if spec.batch % parts.max(1) != 0 || m != expected {
        let what = match pipeline {
            Some(_) if spec.grad_accum > 1 => "micro_batches × grad_accum",
            Some(_) => "micro_batches",
            None => "grad_accum",
        };
        let d = Diagnostic::error(
            Code::E0902,
            spec.file,
            spec.batch_span,
            format!(
                "a batch of {} is not the model's batch dim {micro_batch} × data parallel {dp} × {what} {expected} = {}",
                spec.batch,
                parts.saturating_mul(expected)
            ),
        )
        .with_label(format!("{} samples per step", spec.batch))
        .with_related(parallel.file, parallel.mesh_span, format!("data parallel {dp}"))
        .with_help(if spec.batch % parts.max(1) == 0 {
            format!("set `{what}` to {m}, or the batch to {}", parts.saturating_mul(expected))
        } else {
            format!("set the batch to {}", parts.saturating_mul(expected))
        });
        return Err(Box::new(d));
    }
    space.dp = Some(dp);
    space.tp = Some(tp);
    space.pp = Some(pp);
    Ok((mode, space))
}

/// How training stores parameters, gradients and optimizer state under the precision policy
/// and optimizer.
fn training(precision: Option<&PrecisionPolicy>, optimizer: Option<OptimizerKind>) -> Training {
    let low = precision.is_some_and(|p| matches!(p.level, AmpLevel::O2 | AmpLevel::O3));
    let act = if precision.is_some_and(|p| p.level != AmpLevel::O0) {
        2
    } else {
        4
    };
    let moments = match optimizer {
        Some(OptimizerKind::Adam | OptimizerKind::AdamW) | None => 8,
        Some(OptimizerKind::Sgd) => 4,
    };
    Training {
        param_bytes: if low { 2 } else { 4 },
        grad_bytes: if low { 2 } else { 4 },
        state_bytes: moments + if low { 4 } else { 0 },
        act_bytes: act,
    }
}

fn compute_dtype(precision: Option<&PrecisionPolicy>) -> mslc_core::ops::DType {
    match precision {
        Some(p) if p.level != AmpLevel::O0 => match p.compute {
            mslc_core::precision::LowPrecision::F16 => mslc_core::ops::DType::F16,
            mslc_core::precision::LowPrecision::BF16 => mslc_core::ops::DType::BF16,
        },
        _ => mslc_core::ops::DType::F32,
    }
}

fn pipeline_of(parallel: Option<&ParallelPolicy>) -> Option<mslc_check::policy::Pipeline> {
    parallel.and_then(|p| p.pipeline)
}

/// E0903: the search found no strategy.
fn no_strategy(
    spec: &mslc_check::policy::TrainSpec,
    parallel: Option<&ParallelPolicy>,
    devices: i64,
    micro_batch: i64,
) -> Box<Diagnostic> {
    let (file, span) = parallel.map_or((spec.file, spec.batch_span), |p| (p.file, p.mesh_span));
    Box::new(
        Diagnostic::error(
            Code::E0903,
            file,
            span,
            format!("no way to run a batch of {} in micro-batches of {micro_batch} on {devices} devices", spec.batch),
        )
        .with_label(format!("{devices} devices"))
        .with_related(spec.file, spec.batch_span, format!("batch {}", spec.batch))
        .with_help("use a device count whose data-parallel factor divides the batch, or change the batch"),
    )
}

/// E0900: the worst device's breakdown and the changes that fit ([`fit_suggestions`]).
fn does_not_fit(
    train: &Train,
    parallel: Option<&ParallelPolicy>,
    memory: Option<&MemoryPolicy>,
    file: &PlanFile,
    fixes: &[String],
) -> Box<Diagnostic> {
    let worst = file
        .per_device
        .iter()
        .max_by_key(|g| g.memory.total)
        .expect("a plan has at least one stage");
    let spec = &train.spec;
    let (code_file, span) = match (memory, parallel) {
        (Some(m), _) if m.max_device_memory.is_some() => (m.file, m.max_device_memory_span),
        (_, Some(p)) => (p.file, p.mesh_span),
        (Some(m), None) => (m.file, m.name.span),
        (None, None) => (spec.file, spec.name.span),
    };
    let help = if fixes.is_empty() {
        "nothing the planner tried fits (a single knob, all knobs together, up to 65,536 devices); raise the budget or shrink the model".to_string()
    } else {
        format!(
            "these changes fit (each planned; fastest first): {}",
            fixes.join("; ")
        )
    };
    Box::new(
        Diagnostic::error(
            Code::E0900,
            code_file,
            span,
            format!(
                "train `{}` needs {} on each device of pipeline stage {} ({}), more than the {} budget: {}",
                spec.name.name,
                human_bytes(worst.memory.total),
                worst.stage,
                worst.ranks_text(),
                human_bytes(file.max_device_memory),
                worst.memory.text()
            ),
        )
        .with_label(format!("{} per device", human_bytes(file.max_device_memory)))
        .with_related(spec.file, spec.name.span, format!(
            "planned as {}, optimizer_shard = {}, recompute = {}",
            file.degrees_text(), level_name(file.optimizer_shard), recompute_name(file.recompute)
        ))
        .with_help(help),
    )
}

/// Redistributions the shard rules leave implicit (an all-gather the propagation had to insert)
/// that move more than this per step are warning W0040, unless the `parallel` declaration's
/// `redistribution_threshold` says otherwise.
pub const REDISTRIBUTION_WARN_BYTES: u64 = 1 << 30;

/// W0040 for each op whose implicit all-gathers move more than the threshold
/// ([`REDISTRIBUTION_WARN_BYTES`] by default) per step, at the parallel declaration's mesh; W0041 for each
/// parameter (per layer pattern) left whole because the tensor degree does not divide its dim.
pub fn plan_warnings(checked: &Checked, train: &Train, plan: &PlanFile) -> Vec<Diagnostic> {
    let Some(parallel) = train.parallel.map(|i| &checked.decls.parallels[i]) else {
        return Vec::new();
    };
    let mut out = undivided_warnings(parallel, plan);
    out.extend(redistribution_warnings(parallel, plan));
    out
}

/// W0041 per parameter pattern the degree leaves whole, at the shard rule asking for the split
/// (or the mesh, where the search chose it).
fn undivided_warnings(parallel: &ParallelPolicy, plan: &PlanFile) -> Vec<Diagnostic> {
    let tp = plan.mesh["tp"];
    let axis = plan.axis_name("tp");
    let mut per: BTreeMap<String, (usize, i64, usize, String)> = BTreeMap::new();
    for (path, dim, size) in &plan.undivided {
        let e = per
            .entry(generic_path(path))
            .or_insert((*dim, *size, 0, path.clone()));
        e.2 += 1;
    }
    per.into_iter()
        .map(|(generic, (dim, size, times, path))| {
            let span = parallel
                .shards
                .iter()
                .find(|r| r.pattern.matches(&path))
                .map_or(parallel.mesh_span, |r| r.span);
            let name = if times > 1 { format!("{generic} (×{times})") } else { path };
            Diagnostic::warning(
                Code::W0041,
                parallel.file,
                span,
                format!("dim {dim} of `{name}` has size {size}, which tensor parallel {tp} (over `{axis}`) does not divide: it stays whole on every device of the group"),
            )
            .with_label("replicated, not split")
            .with_help(format!(
                "use a tensor-parallel degree that divides {size}, or pad the dim; until then its memory is not divided by {tp}"
            ))
        })
        .collect()
}

/// W0040 per op of the repeated layer whose implicit all-gathers exceed the threshold.
fn redistribution_warnings(parallel: &ParallelPolicy, plan: &PlanFile) -> Vec<Diagnostic> {
    // One warning per op of the repeated layer (`layers.*`), the bytes summed over layers.
    let (threshold, set_at) = match parallel.redistribution_threshold {
        Some((bytes, span)) => (bytes, Some(span)),
        None => (REDISTRIBUTION_WARN_BYTES, None),
    };
    let mut per_op: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for (op, bytes) in &plan.redistributions {
        let entry = per_op.entry(generic_path(op)).or_default();
        entry.0 = entry
            .0
            .saturating_add(bytes.saturating_mul(plan.micro_batches.max(1) as u64));
        entry.1 += 1;
    }
    per_op
        .into_iter()
        .filter(|&(_, (bytes, _))| bytes > threshold)
        .map(|(op, (bytes, times))| {
            let op = match times {
                1 => op,
                n => format!("{op} (×{n})"),
            };
            let d = Diagnostic::warning(
                Code::W0040,
                parallel.file,
                parallel.mesh_span,
                format!(
                    "{op} needs its input gathered over the tensor axis `{}`: {} per step, more than the {} threshold",
                    plan.axis_name("tp"),
                    human_bytes(bytes),
                    human_bytes(threshold)
                ),
            )
            .with_label("implicit all-gather")
            .with_help("add shard rules so the op's operands arrive split the way it consumes them (e.g. pair a column-parallel `[mp, _]` weight with a row-parallel `[_, mp]` one)");
            match set_at {
                Some(span) => d.with_related(parallel.file, span, "the threshold"),
                None => d,
            }
        })
        .collect()
}

/// `--explain-plan`'s text: per parameter pattern its layout, model states per rank, the
/// collectives it causes and the best other layout planned; the large activations; per stage
/// the worst rank's memory; the single-knob what-ifs.
pub fn explain_lines(train: &str, plan: &PlanFile, e: &Explanation) -> Vec<String> {
    let b = |x: u64| human_bytes(x);
    let signed = |x: i64| {
        let sign = if x < 0 { "−" } else { "+" };
        format!("{sign}{}", human_bytes(x.unsigned_abs()))
    };
    let mut lines = vec![format!(
        "plan of train {train} explained (bytes per rank; times per step on the cost model of docs/parallel.md)"
    )];
    lines.push(format!(
        "parameters (layout over the tensor-parallel axis `{}`):",
        plan.axis_name("tp")
    ));
    // Layouts are written over the planner's key; show the user's axis.
    let named = |layout: &str| layout.replace("tp", plan.axis_name("tp"));
    for p in &e.parameters {
        lines.push(format!(
            "  {} ×{} {:?}: {}, model states {} per rank ({} of them)",
            p.pattern,
            p.count,
            p.shape,
            named(&p.layout),
            b(p.state_bytes_per_rank),
            p.on_rank
        ));
        for c in &p.collectives {
            lines.push(format!(
                "      causes {} over {}: {} × {} per step, {:.3} s",
                c.what,
                plan.axis_name(c.axis),
                b(c.bytes),
                c.per_step,
                c.seconds
            ));
        }
        match &p.alternative {
            Some(a) => lines.push(format!(
                "      next best {}: step {:+.3} s, worst rank {}{}",
                named(&a.layout),
                a.step_time_delta_s,
                signed(a.peak_delta_bytes),
                if a.fits { "" } else { " (does not fit)" }
            )),
            None => lines
                .push("      no other layout (tensor parallel 1, or nothing else divides)".into()),
        }
    }
    lines.push("large activations (embeddings, first layer, output; per micro-batch):".into());
    for a in &e.activations {
        let layout = match a.split {
            Some(d) => format!("split dim {d}"),
            None if a.sequence && plan.sequence_parallel => "split along the sequence".into(),
            None => "whole".into(),
        };
        let bytes = match a.split {
            None if a.sequence && plan.sequence_parallel => {
                a.bytes.div_ceil(plan.mesh["tp"].max(1) as u64)
            }
            _ => a.bytes,
        };
        let alternative = match (a.split, a.sequence, plan.sequence_parallel) {
            (Some(_), _, _) => format!(
                "whole would be {} and an all-gather",
                b(a.bytes * plan.mesh["tp"].max(1) as u64)
            ),
            (None, true, false) if plan.mesh["tp"] > 1 => format!(
                "sequence parallel would make it {}",
                b(a.bytes.div_ceil(plan.mesh["tp"] as u64))
            ),
            _ => "no other layout".into(),
        };
        lines.push(format!(
            "  {} {:?}: {layout}, {} per rank, {}; {alternative}",
            a.name,
            a.shape,
            b(bytes),
            if a.kept {
                "kept for the backward"
            } else {
                "transient"
            }
        ));
    }
    lines.push(
        "collectives per activation (embeddings, first layer standing for every layer, output):"
            .into(),
    );
    if e.moved.is_empty() {
        lines.push("  none (tensor parallel 1)".into());
    }
    for c in &e.moved {
        lines.push(format!(
            "  {} {:?}: {} over {}, {} × {} per step, {}",
            c.activation,
            c.shape,
            c.what,
            plan.axis_name(c.axis),
            b(c.bytes),
            c.per_step,
            short_seconds(c.seconds)
        ));
    }
    lines.push("memory, worst rank of every stage (never averaged):".into());
    for g in &plan.per_device {
        lines.push(format!(
            "  stage {} ({}): {} = {}",
            g.stage,
            g.ranks_text(),
            b(g.memory.total),
            g.memory.text()
        ));
    }
    lines.push("what if one knob changed:".into());
    for w in &plan.what_if {
        lines.push(format!(
            "  {}: worst rank {} ({}), step {:.3} s ({:+.3} s)",
            w.change,
            b(w.peak_bytes),
            if w.fits { "fits" } else { "does not fit" },
            w.step_time_s,
            w.step_time_s - plan.step_time_s
        ));
    }
    lines
}

/// `26.4 µs`, `1.25 ms` or `2.500 s`: small collective times stay readable.
fn short_seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// `0–6` or, interleaved, `0–2, 8–10`.
pub fn layer_ranges(layers: &[[usize; 2]]) -> String {
    layers
        .iter()
        .map(|[a, b]| format!("{a}–{b}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The plan in a few lines for `mslc build`'s summary: degrees, step time, and per stage the
/// worst rank's memory against the budget.
pub fn summary_lines(train: &str, plan: &PlanFile) -> Vec<String> {
    let gib = |b: u64| human_bytes(b);
    let pipelined = plan.mesh.get("pp").is_some_and(|&pp| pp > 1);
    let micro_batches = match (pipelined, plan.micro_batches) {
        (true, m) => format!(", {m} micro-batches ({})", plan.schedule.name()),
        (false, 1) => String::new(),
        (false, m) => format!(", {m} micro-batches"),
    };
    let model_flops = plan.model_flops_per_device;
    let (flops, unit) = if model_flops >= 1e12 {
        (model_flops / 1e12, "TFLOP/s")
    } else {
        (model_flops / 1e9, "GFLOP/s")
    };
    let mut lines = vec![
        format!(
            "  plan:       train {train} on {} device{}: {}{}{micro_batches}, optimizer_shard = {}, recompute = {} ({}, {} candidate{} in {:.1} ms)",
            plan.devices,
            if plan.devices == 1 { "" } else { "s" },
            plan.degrees_text(),
            if plan.sequence_parallel { ", sequence parallel" } else { "" },
            level_name(plan.optimizer_shard),
            match &plan.recompute_fixed_by {
                Some(why) => format!("{} ({why})", recompute_name(plan.recompute)),
                None => recompute_name(plan.recompute).to_string(),
            },
            plan.search.mode,
            plan.search.candidates,
            if plan.search.candidates == 1 { "" } else { "s" },
            plan.search.seconds * 1e3
        ),
        format!(
            "  step:       ~{:.3} s estimated (compute {:.3} s, exposed communication {:.3} s, bubble {:.1} %), {flops:.0} {unit} model FLOPs per device",
            plan.step_time_s,
            plan.compute_s,
            plan.communication_s,
            plan.bubble_fraction * 100.0,
        ),
    ];
    for g in &plan.per_device {
        lines.push(format!(
            "  stage {:<4} {}, layers {}: {} of {} ({})",
            g.stage,
            g.ranks_text(),
            layer_ranges(&g.layers),
            gib(g.memory.total),
            gib(plan.max_device_memory),
            g.memory.text()
        ));
        if let Some(e) = &g.executor {
            lines.push(format!(
                "             on this machine's executor: {} per rank ({} allocated by its compiled programs on {} thread(s), {} kept for the programs themselves, with the fragmentation reserve)",
                gib(e.total),
                gib(e.held.allocated),
                e.threads,
                gib(e.held.programs)
            ));
        }
    }
    for w in &plan.what_if {
        lines.push(format!(
            "  what if    {}: {} per device ({}), ~{:.3} s per step",
            w.change,
            gib(w.peak_bytes),
            if w.fits { "fits" } else { "does not fit" },
            w.step_time_s
        ));
    }
    lines
}
