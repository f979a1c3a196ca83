//! `mslc run FILE.msl --ranks N` (and under `mpiexec`) of a plan with pipeline stages: the
//! ranks of each stage run its part of the forward ([`mslc_ir::shard::pipeline`]) over the
//! micro-batches of their replica's slice of the batch, one after another through the stages,
//! receiving and sending what crosses the cuts (tensor-parallel ranks within a stage split
//! its weights as without a pipeline). The first tensor-parallel rank of each replica on a
//! stage with model outputs sends them, joined over the micro-batches, to rank 0, which joins
//! the replicas' and writes them as `mslc run` on one device does.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use mslc_artifact::Module;
use mslc_core::diag::Code;
use mslc_core::program::Model;
use mslc_driver::pipeline::{concat, forward_micro_batches, recv_array, send_array};
use mslc_driver::ranks::{self, PipelineLayout, RankCoords, RankLayout};
use mslc_exec::collectives::Collectives;
use mslc_exec::Executor;
use mslc_io::npy::NpyArray;
use mslc_ir::shard::pipeline::StageCut;

use super::output::Failure;
use super::run::{self, RunArgs};
use super::run_ranks::{describe, finish_rank0, gather_dims, Rank0};
use super::world::{self, World};
use super::Reporter;

/// One stage's program, what crosses its cuts, and the dim each of its model outputs joins
/// along over the micro-batches and replicas (`None`: one part only).
struct Stage {
    module: Module,
    cut: StageCut,
    join: Vec<Option<usize>>,
}

/// What one rank ran: its executor, seconds per pipelined forward (its own share), its
/// outputs joined over its micro-batches (on the ranks that speak for a replica's outputs),
/// and the weights file's bookkeeping tensors left out.
type RankRun = (
    Executor,
    Vec<f64>,
    Vec<NpyArray>,
    Vec<(String, &'static str)>,
);

/// Runs the ranks of this process for the pipeline `pipeline` of `layout`: `model` is the
/// checked model whose inputs `arrays` (the whole batch) are. Rank 0's summary.
#[allow(clippy::too_many_arguments)]
pub fn execute(
    args: &RunArgs,
    world: &World,
    arrays: &BTreeMap<String, NpyArray>,
    model: &Model,
    layout: &RankLayout,
    pipeline: &PipelineLayout,
    reporter: &Reporter,
) -> world::Outcome {
    let started = world.started();
    let m = pipeline.micro_batches;
    let parts = layout.dp * m;
    let micro = ranks::split_inputs(model, arrays, parts)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let group = layout.tensor_group();
    let tensor = layout.tensor(&group);
    let shapes = run::shapes_of(&micro[0]);
    let mut stages = Vec::with_capacity(pipeline.layers.len());
    let mut sources = None;
    let mut kernel_table = None;
    for s in 0..pipeline.layers.len() {
        let stage = Some((pipeline, s));
        let (mut module, files, cut) =
            run::compile_source_stage(args, &shapes, tensor, stage, false, reporter)?;
        let table = run::apply_kernels(args, &mut module, false)?;
        if s == 0 {
            run::warn_if_foreign(&module, reporter);
            (sources, kernel_table) = (Some(files), table);
        }
        let outputs: Vec<(String, Vec<usize>)> = cut
            .outputs
            .iter()
            .map(|name| (name.clone(), output_shape(&module, name)))
            .collect();
        let join = match outputs.is_empty() {
            true => Vec::new(),
            false => gather_dims(args, arrays, &outputs, parts, reporter)?,
        };
        stages.push(Stage { module, cut, join });
    }
    let params: Vec<BTreeSet<String>> =
        stages.iter().map(|s| world::params_of(&s.module)).collect();
    let mesh = layout
        .mesh()
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let threads = ranks::threads_per_rank(args.threads, mesh.size());
    let rank = |rank: usize, comm: Option<Box<dyn Collectives>>| -> Result<RankRun, Failure> {
        let c = layout.coords(rank);
        let stage = &stages[c.stage];
        let mut exec = run::executor(args, stage.module.clone(), threads)?;
        if let Some(comm) = comm {
            exec.set_collectives(comm);
        }
        let elsewhere = world::elsewhere(&params, c.stage);
        let ignored =
            super::run_ranks::load_rank_params(args, &mut exec, layout, c.part, &elsewhere)?;
        exec.check_numerics(args.check_numerics);
        let batches = &micro[c.replica * m..(c.replica + 1) * m];
        let row = |stage| layout.rank(RankCoords { stage, ..c });
        let mut times = Vec::new();
        let mut outputs = Vec::new();
        for i in 0..args.iterations {
            if args.profile.is_some() && i + 1 == args.iterations {
                exec.record_workers(true);
            }
            let start = Instant::now();
            outputs = forward_micro_batches(&mut exec, &stage.cut, batches, &row)
                .map_err(|e| run::run_failure(e, sources.as_ref(), reporter))?;
            times.push(start.elapsed().as_secs_f64());
        }
        let joined = match c.part {
            0 => join_all(&outputs, &stage.join)?,
            _ => Vec::new(),
        };
        Ok((exec, times, joined, ignored))
    };
    let lead = |comm| {
        let (mut exec, times, own, ignored_weights) = rank(0, comm)?;
        let outputs = collect_outputs(&mut exec, layout, &stages, own, model)?;
        let ran = Rank0 {
            exec: &exec,
            ranks: (mesh.size(), describe(layout, started)),
            flops: exec.module().flops() * m as u64,
            times,
            kernel_table: kernel_table.clone(),
            ignored_weights,
        };
        finish_rank0(args, ran, outputs, reporter)
    };
    let follow = |r, comm| {
        let (mut exec, _, joined, _) = rank(r, comm)?;
        let comm = exec
            .collectives()
            .ok_or_else(|| Failure::Message(Code::E0973, "no collectives".to_string()))?;
        for array in &joined {
            send_array(comm, 0, array).map_err(|e| Failure::Message(Code::E0973, e.message))?;
        }
        Ok(())
    };
    world::run_ranks(world, world.ranks(layout, threads)?, reporter, lead, follow)
}

/// The model's outputs (name, type, value) in its order, gathered by rank 0: from each stage
/// with outputs, each replica's (its own, `own`, or received from the replica's first
/// tensor-parallel rank), joined along the output's dim.
fn collect_outputs(
    exec: &mut Executor,
    layout: &RankLayout,
    stages: &[Stage],
    own: Vec<NpyArray>,
    model: &Model,
) -> Result<Vec<(String, String, NpyArray)>, Failure> {
    let mut own = own;
    let mut by_name: BTreeMap<String, (String, NpyArray)> = BTreeMap::new();
    for (s, stage) in stages.iter().enumerate() {
        if stage.cut.outputs.is_empty() {
            continue;
        }
        let mut replicas: Vec<Vec<NpyArray>> = Vec::with_capacity(layout.dp);
        for replica in 0..layout.dp {
            let from = layout.rank(RankCoords {
                stage: s,
                replica,
                part: 0,
            });
            if from == 0 {
                replicas.push(std::mem::take(&mut own));
                continue;
            }
            let comm = exec
                .collectives()
                .ok_or_else(|| Failure::Message(Code::E0973, "no collectives".to_string()))?;
            let received: Result<Vec<NpyArray>, _> = (0..stage.cut.outputs.len())
                .map(|_| recv_array(comm, from))
                .collect();
            replicas.push(received.map_err(|e| Failure::Message(Code::E0973, e.message))?);
        }
        for (k, name) in stage.cut.outputs.iter().enumerate() {
            let parts: Vec<NpyArray> = replicas.iter().map(|r| r[k].clone()).collect();
            let array = join(&parts, stage.join[k])?;
            let mut ty = output_type(&stage.module, name);
            ty.shape = array.shape().iter().map(|&d| d as i64).collect();
            by_name.insert(name.clone(), (ty.to_string(), array));
        }
    }
    Ok(model
        .outputs
        .iter()
        .filter_map(|o| {
            let (ty, array) = by_name.remove(&o.name)?;
            Some((o.name.clone(), ty, array))
        })
        .collect())
}

/// Each output's parts (one per micro-batch) joined along its dim.
fn join_all(outputs: &[Vec<NpyArray>], dims: &[Option<usize>]) -> Result<Vec<NpyArray>, Failure> {
    outputs
        .iter()
        .zip(dims)
        .map(|(parts, dim)| join(parts, *dim))
        .collect()
}

/// `parts` joined along `dim` (`None`: the one part).
fn join(parts: &[NpyArray], dim: Option<usize>) -> Result<NpyArray, Failure> {
    match (dim, parts) {
        (None, [one]) => Ok(one.clone()),
        (Some(d), _) => concat(parts, d).map_err(Failure::from),
        (None, _) => Err(Failure::Message(
            Code::E0975,
            "an output has no batch dim to join its micro-batches along".to_string(),
        )),
    }
}

/// The type of output `name` of `module`.
fn output_type(module: &Module, name: &str) -> mslc_core::ops::TensorType {
    module
        .outputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| module.values[*v as usize].ty.clone())
        .unwrap_or_else(|| mslc_core::ops::TensorType::scalar(mslc_core::ops::DType::F32))
}

/// The shape of output `name` of `module`.
fn output_shape(module: &Module, name: &str) -> Vec<usize> {
    let ty = output_type(module, name);
    ty.shape.iter().map(|&d| d.max(0) as usize).collect()
}
