//! `mslc build --entry TRAIN` of a parallel train: the training step each rank of the plan runs
//! (docs/mir-format.md, "Per-rank programs"). Every rank of a data × tensor parallel plan runs
//! the same program — its parameters are its shards, its collectives find their group from the
//! rank at run time — so one module serves them all: `TRAIN.rank.mir` with its kernel table and
//! memory plan, and `TRAIN.ranks.json` saying which part of each parameter every rank holds.

use std::path::PathBuf;

use mslc_artifact::encode;
use mslc_check::Checked;
use mslc_core::diag::Diagnostic;
use mslc_core::units::human_bytes;
use mslc_driver::artifacts::{artifact_files, json};
use mslc_driver::ranks::{self, RankLayout};
use mslc_driver::train::{
    compile_train_ranked, CompiledTrain, TrainOptions, DATA_AXIS, TENSOR_AXIS,
};
use mslc_plan::parallel::PlanFile;

use super::build::{train_step, BuildArgs};

/// What a build of a parallel train adds: the per-rank files, a summary line and the report's
/// `ranks` object.
pub struct RankArtifacts {
    /// `(path, bytes)` of the per-rank files; empty when the plan does not run yet.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// One line for the build summary.
    pub line: String,
    /// The report's `ranks` entry.
    pub json: serde_json::Value,
}

/// The per-rank program of train `entry` under `plan`; `None` for a plan of one device. A plan
/// the executor cannot run yet (pipeline stages) writes nothing and says why.
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
    let layout = ranks::layout(Some(plan), devices, "the plan")
        .and_then(|l| l.refuse_pipeline("a per-rank program").map(|()| l));
    let layout = match layout {
        Ok(layout) => layout,
        Err(e) => {
            return Ok(Some(RankArtifacts {
                files: Vec::new(),
                line: format!("  per rank:   not written: {}", e.message),
                json: serde_json::json!({ "written": false, "reason": e.message }),
            }))
        }
    };
    let compiled = compile_rank(args, checked, entry, &layout)?;
    let name = format!("{entry}.rank");
    let dir = &args.out_dir;
    let mut module = compiled.compiled.module.clone();
    module.name = entry.to_string();
    let mir = encode(&module, None);
    let mut files = artifact_files(dir, &name, &compiled.compiled, mir);
    let memory = &compiled.compiled.memory;
    let description = ranks_description(&layout, plan, &compiled, &name);
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
    Ok(Some(RankArtifacts {
        files,
        line,
        json: serde_json::json!({
            "written": true,
            "program": format!("{name}.mir"),
            "description": format!("{entry}.ranks.json"),
            "arena_bytes": memory.arena_bytes,
            "lower_bound_bytes": memory.lower_bound_bytes,
        }),
    }))
}

/// Compiles one rank's training step as `mslc train` does under `layout`: `checked` holds the
/// source with one replica's micro-batch; the plan's data-parallel degree, optimizer sharding
/// and tensor split.
fn compile_rank(
    args: &BuildArgs,
    checked: &Checked,
    entry: &str,
    layout: &RankLayout,
) -> Result<CompiledTrain, Box<Diagnostic>> {
    let (train, _, options, train_options) = train_step(args, checked, entry)?;
    let train_options = TrainOptions {
        data_parallel: layout.dp,
        optimizer_shard: layout.optimizer_shard,
        ..train_options
    };
    let tensor_group = layout.tensor_group();
    let tensor = layout.tensor(&tensor_group);
    compile_train_ranked(train, &options, train_options, tensor).map_err(|e| e.diagnostic(checked))
}

/// `TRAIN.ranks.json`: the mesh, every rank's coordinates, and per parameter the shape each
/// rank holds, the dim the tensor-parallel ranks split it along (rank `tensor` holds block
/// `tensor` of it) and whether optimizer sharding slices it further over the data-parallel
/// ranks (flattened, padded to a multiple of `dp`, replica `data` holding slice `data`).
fn ranks_description(
    layout: &RankLayout,
    plan: &PlanFile,
    compiled: &CompiledTrain,
    program: &str,
) -> serde_json::Value {
    let axis_name = |axis: &str| {
        plan.axis_names
            .get(axis)
            .cloned()
            .unwrap_or(axis.to_string())
    };
    let ranks: Vec<serde_json::Value> = (0..layout.dp * layout.tp)
        .map(|rank| {
            let coords = layout.coords(rank);
            serde_json::json!({ "rank": rank, "data": coords.replica, "tensor": coords.part })
        })
        .collect();
    let module = &compiled.compiled.module;
    let level = compiled.zero.as_ref().map_or(0, |z| z.level);
    let parameters: serde_json::Map<String, serde_json::Value> = module
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
                "shape": whole,
                "tensor_shard_shape": shard,
                "rank_shape": held,
                "tensor_split_dim": split,
                "optimizer_states_sliced": sliced.is_some(),
                "parameter_sliced": sliced.is_some() && level >= 3,
            });
            (name.to_string(), info)
        })
        .collect();
    serde_json::json!({
        "program": format!("{program}.mir"),
        "devices": plan.devices,
        "mesh": [[axis_name(DATA_AXIS), layout.dp], [axis_name(TENSOR_AXIS), layout.tp]],
        "optimizer_shard": mslc_plan::parallel::level_name(layout.optimizer_shard),
        "sequence_parallel": layout.sequence_parallel,
        "ranks": ranks,
        "parameters": parameters,
    })
}
