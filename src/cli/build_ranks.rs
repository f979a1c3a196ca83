//! `mslc build --entry TRAIN` of a parallel train: the training step each rank of the plan runs
//! (docs/mir-format.md, "Per-rank programs"). Every rank of a data × tensor parallel plan runs
//! the same program — its parameters are its shards, its collectives find their group from the
//! rank at run time — so one module serves them all: `TRAIN.rank.mir` with its kernel table and
//! memory plan, and `TRAIN.ranks.json` saying which part of each parameter every rank holds.
//! With pipeline stages the ranks of each stage share one step, `TRAIN.stageS.rank.mir`, its
//! update, `TRAIN.stageS.update.mir`, and on every stage but the last a forward,
//! `TRAIN.stageS.forward.mir`; `TRAIN.ranks.json` adds what crosses each stage's cuts and the
//! schedule.

use std::path::{Path, PathBuf};

use mslc_artifact::encode;
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic};
use mslc_core::units::human_bytes;
use mslc_driver::artifacts::{artifact_files, json};
use mslc_driver::compile::Compiled;
use mslc_driver::ranks::{self, PipelineLayout, RankLayout};
use mslc_driver::train::{
    compile_train_ranked, compile_train_stage, CompiledTrain, StageStep, TrainOptions, DATA_AXIS,
    PIPELINE_AXIS, TENSOR_AXIS,
};
use mslc_plan::parallel::{ExecutorMemory, PlanFile};

use super::build::{selection, train_step, BuildArgs};

/// What a build of a parallel train adds: the per-rank files, a summary line and the report's
/// `ranks` object.
pub struct RankArtifacts {
    /// `(path, bytes)` of the per-rank files; empty when the plan does not run yet.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// One line for the build summary.
    pub line: String,
    /// The report's `ranks` entry.
    pub json: serde_json::Value,
    /// Per pipeline stage (one entry without stages), what each of its ranks allocates running
    /// its programs (its step and, on a stage, its forward and update) on the threads a rank
    /// gets by default; none when the programs were not written.
    pub memory: Vec<ExecutorMemory>,
}

/// The per-rank programs of train `entry` under `plan` (one, or one per pipeline stage); `None`
/// for a plan of one device. A plan the executor cannot run yet (E0972), or whose loss it
/// cannot combine over data-parallel replicas (E0971), writes nothing and says why.
pub fn rank_artifacts(
    args: &BuildArgs,
    checked: &Checked,
    entry: &str,
    plan: &PlanFile,
) -> Result<Option<RankArtifacts>, Box<Diagnostic>> {
    let devices = usize::try_from(plan.devices).unwrap_or(0);
    if devices <= 1 {
        return Ok(None);
    }
    let layout = match ranks::layout(Some(plan), devices, "the plan") {
        Ok(layout) => layout,
        Err(e) => return Ok(Some(not_written(&e.message))),
    };
    let built = match &layout.pipeline {
        Some(pipeline) => stage_artifacts(args, checked, entry, plan, &layout, pipeline),
        None => rank_artifact(args, checked, entry, plan, &layout),
    };
    match built {
        // What the ranks do not run (E0971, E0972) is said, not a failed build.
        Err(d) if matches!(d.code, Code::E0971 | Code::E0972) => Ok(Some(not_written(&d.message))),
        built => built.map(Some),
    }
}

/// The one program every rank of a data × tensor parallel plan runs.
fn rank_artifact(
    args: &BuildArgs,
    checked: &Checked,
    entry: &str,
    plan: &PlanFile,
    layout: &RankLayout,
) -> Result<RankArtifacts, Box<Diagnostic>> {
    let devices = layout.devices();
    let (compiled, _) = compile_rank(args, checked, entry, layout, None)?;
    let name = format!("{entry}.rank");
    let dir = &args.out_dir;
    let mut files = program_files(dir, entry, &name, &compiled.compiled);
    let memory = &compiled.compiled.memory;
    let description = ranks_description(layout, plan, &[(&compiled, None)], &name);
    files.push((dir.join(format!("{entry}.ranks.json")), json(&description)));
    let line = format!(
        "  per rank:   {name}.mir for all {devices} ranks ({} data × {} tensor{}{}), arena {} (lower bound {}) each",
        layout.dp,
        layout.tp,
        match layout.sequence_parallel {
            true => ", sequence parallel",
            false => "",
        },
        match layout.optimizer_shard {
            0 => String::new(),
            level => format!(", optimizer_shard = {}", mslc_plan::parallel::level_name(level)),
        },
        human_bytes(memory.arena_bytes),
        human_bytes(memory.lower_bound_bytes),
    );
    Ok(RankArtifacts {
        files,
        line,
        json: serde_json::json!({
            "written": true,
            "program": format!("{name}.mir"),
            "description": format!("{entry}.ranks.json"),
            "arena_bytes": memory.arena_bytes,
            "lower_bound_bytes": memory.lower_bound_bytes,
        }),
        memory: vec![ranks::rank_memory(
            [memory],
            ranks::threads_per_rank(None, devices),
        )],
    })
}

/// The per-rank programs a plan the executor does not run leaves out, and why.
fn not_written(why: &str) -> RankArtifacts {
    RankArtifacts {
        files: Vec::new(),
        line: format!("  per rank:   not written: {why}"),
        json: serde_json::json!({ "written": false, "reason": why }),
        memory: Vec::new(),
    }
}

/// `NAME.mir` (named `entry` inside), its kernel table and memory plan in `dir`.
fn program_files(
    dir: &Path,
    entry: &str,
    name: &str,
    compiled: &Compiled,
) -> Vec<(PathBuf, Vec<u8>)> {
    let mut module = compiled.module.clone();
    module.name = entry.to_string();
    let mir = encode(&module, None);
    artifact_files(dir, name, compiled, mir)
}

/// The programs of a plan with pipeline stages (`pipeline`, `layout`'s): per stage its step
/// and (but the last) its forward, and `TRAIN.ranks.json` with every stage's cut.
fn stage_artifacts(
    args: &BuildArgs,
    checked: &Checked,
    entry: &str,
    plan: &PlanFile,
    layout: &RankLayout,
    pipeline: &PipelineLayout,
) -> Result<RankArtifacts, Box<Diagnostic>> {
    let threads = ranks::threads_per_rank(None, usize::try_from(plan.devices).unwrap_or(1));
    let dir = &args.out_dir;
    let mut files = Vec::new();
    let mut steps = Vec::new();
    let mut lines = Vec::new();
    let mut programs = Vec::new();
    for stage in 0..layout.pp() {
        let (compiled, cut) = compile_rank(args, checked, entry, layout, Some(stage))?;
        let cut = cut.expect("a stage's step has its cut");
        let name = format!("{entry}.stage{stage}.rank");
        files.extend(program_files(dir, entry, &name, &compiled.compiled));
        let forward = cut.forward.as_ref().map(|f| {
            let forward_name = format!("{entry}.stage{stage}.forward");
            files.extend(program_files(dir, entry, &forward_name, f));
            forward_name
        });
        let update = format!("{entry}.stage{stage}.update");
        files.extend(program_files(dir, entry, &update, &cut.update.compiled));
        let memory = &compiled.compiled.memory;
        lines.push(format!(
            "  stage {stage}:    {name}.mir, {update}.mir{}, arena {} (lower bound {}) each",
            forward
                .as_ref()
                .map_or(String::new(), |f| format!(", {f}.mir")),
            human_bytes(memory.arena_bytes),
            human_bytes(memory.lower_bound_bytes),
        ));
        programs.push(serde_json::json!({
            "stage": stage,
            "program": format!("{name}.mir"),
            "update": format!("{update}.mir"),
            "forward": forward.map(|f| format!("{f}.mir")),
            "arena_bytes": memory.arena_bytes,
            "lower_bound_bytes": memory.lower_bound_bytes,
        }));
        steps.push((compiled, cut));
    }
    let with_cuts: Vec<(&CompiledTrain, Option<&StageStep>)> =
        steps.iter().map(|(c, cut)| (c, Some(cut))).collect();
    let description = ranks_description(layout, plan, &with_cuts, &format!("{entry}.stageS.rank"));
    files.push((dir.join(format!("{entry}.ranks.json")), json(&description)));
    let (micro, schedule) = (pipeline.micro_batches, pipeline.schedule.name());
    // Under an interleaved schedule each chunk of a device is a rank of its own.
    let ranks = match layout.interleaved() {
        true => format!("{} ranks on {} devices", layout.ranks(), plan.devices),
        false => format!("{} ranks", plan.devices),
    };
    let line = format!(
        "  per rank:   one step per pipeline stage for all {ranks} ({} stages × {} data × {} \
         tensor, {micro} micro-batches, {schedule})\n{}",
        layout.pp(),
        layout.dp,
        layout.tp,
        lines.join("\n")
    );
    Ok(RankArtifacts {
        files,
        line,
        json: serde_json::json!({
            "written": true,
            "stages": programs,
            "description": format!("{entry}.ranks.json"),
        }),
        memory: ranks::stage_memory(&steps, pipeline, threads),
    })
}

/// Compiles one rank's training step as `mslc train` does under `layout`: `checked` holds the
/// source with one replica's micro-batch; the plan's data-parallel degree, optimizer sharding
/// and tensor split — and, on pipeline stage `stage`, that stage's step and cut.
fn compile_rank(
    args: &BuildArgs,
    checked: &Checked,
    entry: &str,
    layout: &RankLayout,
    stage: Option<usize>,
) -> Result<(CompiledTrain, Option<StageStep>), Box<Diagnostic>> {
    let (train, _, options, train_options) = train_step(selection(args), checked, entry)?;
    let train_options = TrainOptions {
        data_parallel: layout.dp,
        optimizer_shard: layout.optimizer_shard,
        ..train_options
    };
    let group = layout.tensor_group();
    let tensor = layout.tensor(&group);
    let compiled = match (stage, &layout.pipeline) {
        (Some(s), Some(pipeline)) => {
            compile_train_stage(train, &options, train_options, tensor, (pipeline, s))
                .map(|(step, cut)| (step, Some(cut)))
        }
        _ => compile_train_ranked(train, &options, train_options, tensor).map(|c| (c, None)),
    };
    compiled.map_err(|e| e.diagnostic(checked))
}

/// `TRAIN.ranks.json`: the mesh, every rank's coordinates, and per parameter the shape each
/// rank holds, the dim the tensor-parallel ranks split it along (rank `tensor` holds block
/// `tensor` of it) and whether optimizer sharding slices it further over the data-parallel
/// ranks (flattened, padded to a multiple of `dp`, replica `data` holding slice `data`). With
/// pipeline stages (`steps` one per stage, with its cut), each parameter's stage, and per
/// stage what it receives and sends (the value's name and the peer stage) and the tied
/// weights it trains with other stages (which stages).
fn ranks_description(
    layout: &RankLayout,
    plan: &PlanFile,
    steps: &[(&CompiledTrain, Option<&StageStep>)],
    program: &str,
) -> serde_json::Value {
    let axis_name = |axis: &str| {
        plan.axis_names
            .get(axis)
            .cloned()
            .unwrap_or(axis.to_string())
    };
    let ranks: Vec<serde_json::Value> = (0..layout.ranks())
        .map(|rank| {
            let c = layout.coords(rank);
            serde_json::json!({
                "rank": rank,
                "device": layout.device(c),
                "stage": c.stage,
                "data": c.replica,
                "tensor": c.part,
            })
        })
        .collect();
    let mut parameters = serde_json::Map::new();
    let mut stages = Vec::new();
    for (stage, (compiled, cut)) in steps.iter().enumerate() {
        parameters.extend(parameters_of(layout, compiled, stage));
        if let Some(cut) = cut {
            let crossing = |c: &mslc_ir::shard::pipeline::Crossing| serde_json::json!({ "value": c.name, "stage": c.peer });
            stages.push(serde_json::json!({
                "stage": stage,
                "device": layout.pipeline.as_ref().map_or(0, |p| p.device_of(stage)),
                "layers": layout.pipeline.as_ref().map(|p| p.layers[stage].clone()),
                "receives": cut.cut.receives.iter().map(crossing).collect::<Vec<_>>(),
                "sends": cut.cut.sends.iter().map(crossing).collect::<Vec<_>>(),
                "tied": cut.cut.shared.iter().map(|p| serde_json::json!({ "parameter": p.path, "stages": p.stages })).collect::<Vec<_>>(),
            }));
        }
    }
    let mut mesh = vec![
        serde_json::json!([axis_name(DATA_AXIS), layout.dp]),
        serde_json::json!([axis_name(TENSOR_AXIS), layout.tp]),
    ];
    let mut description = serde_json::json!({
        "program": format!("{program}.mir"),
        "devices": plan.devices,
        "optimizer_shard": mslc_plan::parallel::level_name(layout.optimizer_shard),
        "sequence_parallel": layout.sequence_parallel,
        "ranks": ranks,
        "parameters": parameters,
    });
    if let Some(pipeline) = &layout.pipeline {
        mesh.insert(
            0,
            serde_json::json!([axis_name(PIPELINE_AXIS), layout.pp()]),
        );
        description["pipeline"] = serde_json::json!({
            "micro_batches": pipeline.micro_batches,
            "schedule": pipeline.schedule.name(),
            "stages": stages,
        });
    }
    description["mesh"] = serde_json::Value::Array(mesh);
    description
}

/// Per parameter of `compiled` (the step of pipeline stage `stage`), what each of its ranks
/// holds ([`ranks_description`]).
fn parameters_of(
    layout: &RankLayout,
    compiled: &CompiledTrain,
    stage: usize,
) -> serde_json::Map<String, serde_json::Value> {
    let module = &compiled.compiled.module;
    let level = compiled.zero.as_ref().map_or(0, |z| z.level);
    module
        .params()
        .map(|(name, value)| {
            let held: Vec<usize> = module.values[value as usize]
                .ty
                .shape
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(0))
                .collect();
            let sliced = compiled.zero.as_ref().and_then(|z| z.shapes.get(name));
            // The tensor-parallel shard: what optimizer sharding slices, or what the rank holds.
            let shard = sliced.cloned().unwrap_or_else(|| held.clone());
            let split = layout.splits.get(name).copied();
            let mut whole = shard.clone();
            if let Some(x) = split.and_then(|d| whole.get_mut(d)) {
                *x *= layout.tp;
            }
            let info = serde_json::json!({
                "stage": stage,
                "shape": whole,
                "tensor_shard_shape": shard,
                "rank_shape": held,
                "tensor_split_dim": split,
                "optimizer_states_sliced": sliced.is_some(),
                "parameter_sliced": sliced.is_some() && level >= 3,
            });
            (name.to_string(), info)
        })
        .collect()
}
