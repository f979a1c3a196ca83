//! `mslc run FILE.msl --ranks N` and `mpiexec -n N mslc run --mpi …`: the forward of a model
//! under the parallel plan of its first train, one executor per rank. A data-parallel replica
//! runs its slice of the inputs' batch, a tensor-parallel rank its shard of the split weights
//! (Megatron's rewrite, the same as training's); rank 0 gathers the replicas' outputs and
//! writes them as `mslc run` on one device does.

use std::collections::{BTreeMap, BTreeSet};

use mslc_check::decls::Train;
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic};
use mslc_driver::ranks::{self, RankCoords, RankLayout};
use mslc_driver::select::choose_model;
use mslc_driver::train::DATA_AXIS;
use mslc_exec::collectives::{Collectives, Mesh};
use mslc_exec::Executor;
use mslc_io::npy::NpyArray;

use super::output::Failure;
use super::run::{self, RunArgs, RunSummary};
use super::train::{check_for_ranks, PickTrain};
use super::world::{self, World};
use super::Reporter;

/// The first train of the `--entry` model (none: the model runs on one device).
fn model_train<'c>(
    checked: &'c Checked,
    entry: Option<&str>,
) -> Result<Option<&'c Train>, Box<Diagnostic>> {
    let model = choose_model(checked, entry)?;
    Ok(checked
        .decls
        .trains
        .iter()
        .find(|t| t.spec.model.name == model.name))
}

/// Runs the ranks of this process; rank 0's summary (`None` in the other processes of an MPI
/// world).
pub fn execute(
    args: &RunArgs,
    world: &World,
    arrays: BTreeMap<String, NpyArray>,
    reporter: &Reporter,
) -> world::Outcome {
    let started = world.started();
    let pick = (args.entry.as_deref(), model_train as PickTrain);
    let (checked, layout) = check_for_ranks(&args.file, &args.model, started, reporter, pick)?;
    let model = choose_model(&checked, args.entry.as_deref()).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    if let Some(missing) = model.inputs.iter().find(|i| !arrays.contains_key(&i.name)) {
        return Err(Failure::Usage(format!(
            "input `{}` is not given: a run on ranks takes every input from --input (a seeded \
             one would differ between the replicas)",
            missing.name
        )));
    }
    if let Some(pipeline) = &layout.pipeline {
        return super::run_pipeline::execute(
            args, world, &arrays, model, &layout, pipeline, reporter,
        );
    }
    let replicas = ranks::split_inputs(model, &arrays, layout.dp)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let tensor_group = layout.tensor_group();
    let tensor = layout.tensor(&tensor_group);
    let shapes = run::shapes_of(&replicas[0]);
    let (mut module, sources) = run::compile_source(args, &shapes, tensor, false, reporter)?;
    run::warn_if_foreign(&module, reporter);
    let kernel_table = run::apply_kernels(args, &mut module, false)?;
    let outputs: Vec<(String, Vec<usize>)> = module
        .outputs
        .iter()
        .map(|(name, v)| {
            let shape = module.values[*v as usize].ty.shape.iter();
            (name.clone(), shape.map(|&d| d as usize).collect())
        })
        .collect();
    let gather = gather_dims(args, &arrays, &outputs, layout.dp, reporter)?;
    let mesh = layout
        .mesh()
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let threads = ranks::threads_per_rank(args.threads, mesh.size());
    // One rank: its executor over its shards and its replica's inputs, run `--iterations`
    // times; the outputs gathered over the replicas (whole on every rank of the data axis).
    let rank = |rank: usize, comm: Option<Box<dyn Collectives>>| {
        let RankCoords { replica, part, .. } = layout.coords(rank);
        let mut exec = run::executor(args, module.clone(), threads)?;
        if let Some(comm) = comm {
            exec.set_collectives(comm);
        }
        let ignored = load_rank_params(args, &mut exec, &layout, part, &BTreeSet::new())?;
        exec.check_numerics(args.check_numerics);
        for (input, array) in &replicas[replica] {
            exec.set_input(input, array).map_err(|e| e.message)?;
        }
        let times = run::timed_runs(args, &mut exec, Some(&sources), reporter, rank == 0)?;
        // Gathered only where they are written (every rank has the same arguments).
        let outputs = match args.output_dir {
            Some(_) => gathered_outputs(&mut exec, &gather)?,
            None => Vec::new(),
        };
        Ok::<_, Failure>((exec, times, outputs, ignored))
    };
    let lead = |comm| {
        let (exec, times, outputs, ignored_weights) = rank(0, comm)?;
        let ran = Rank0 {
            exec: &exec,
            ranks: (mesh.size(), describe(&layout, started)),
            flops: exec.module().flops(),
            times,
            kernel_table: kernel_table.clone(),
            ignored_weights,
        };
        finish_rank0(args, ran, outputs, reporter)
    };
    let follow = |r, comm| rank(r, comm).map(drop);
    world::run_ranks(
        world,
        world.ranks(&layout, threads)?,
        reporter,
        lead,
        follow,
    )
}

/// Loads into `exec` the parameters of tensor-parallel member `part` of `layout` (those of
/// `elsewhere` left out: another pipeline stage's): its shards of `--weights`, or under
/// `--init-seed` the weights one device draws, cut to its blocks. The bookkeeping tensors of
/// the weights file left out.
pub(super) fn load_rank_params(
    args: &RunArgs,
    exec: &mut Executor,
    layout: &RankLayout,
    part: usize,
    elsewhere: &BTreeSet<String>,
) -> Result<Vec<(String, &'static str)>, Failure> {
    match (&args.weights, args.init_seed) {
        (Some(path), _) => world::load_stage_shard(exec, path, layout, part, None, elsewhere),
        (None, Some(seed)) if layout.tp > 1 => {
            let share = (part, layout.tp);
            ranks::init_rank_weights(exec, seed, &layout.splits, share, None)
                .map_err(|e| Failure::Message(e.code, e.message))?;
            Ok(Vec::new())
        }
        _ => run::load_params(args, exec, None),
    }
}

/// What rank 0 ran, for the summary of a run on ranks.
pub(super) struct Rank0<'a> {
    /// Its executor.
    pub exec: &'a Executor,
    /// How many ranks ran, and how ([`describe`]).
    pub ranks: (usize, String),
    /// FLOPs of one timed run of rank 0.
    pub flops: u64,
    /// Seconds per timed run.
    pub times: Vec<f64>,
    /// The kernel table read, and what applying it did.
    pub kernel_table: Option<(std::path::PathBuf, String)>,
    /// Bookkeeping tensors of the weights file left out.
    pub ignored_weights: Vec<(String, &'static str)>,
}

/// Writes the `outputs` rank 0 gathered and the summary of its run, as `mslc run` on one
/// device does, with the ranks line.
pub(super) fn finish_rank0(
    args: &RunArgs,
    ran: Rank0,
    outputs: Vec<(String, String, NpyArray)>,
    reporter: &Reporter,
) -> Result<(String, serde_json::Value), Failure> {
    let exec = ran.exec;
    let summary = RunSummary {
        pass: run::pass_name(exec.module()),
        model: exec.module().name.clone(),
        threads: exec.threads(),
        ranks: Some(ran.ranks),
        peak: mslc_kernels::peak::measure(exec.threads()),
        flops: ran.flops,
        times: ran.times,
        arena_bytes: exec.arena_bytes(),
        hoisted_bytes: exec.hoisted_bytes(),
        kernel_table: ran.kernel_table,
        seeded: Vec::new(),
        ignored_weights: ran.ignored_weights,
        outputs: Vec::new(),
        profile: args.profile.clone(),
    };
    let profile = args.profile.as_ref().map(|_| exec.profile_json());
    let outputs = (outputs.into_iter())
        .map(|(name, ty, array)| (name, ty, array.into()))
        .collect();
    let done = run::finish(args, summary, outputs, profile)?;
    run::warn_nonfinite(exec, reporter);
    Ok(done)
}

/// `data 2 × tensor 1, --ranks` (`× pipeline 2 of 4 micro-batches` with stages; `data 1 ×
/// tensor 2 with sequence parallelism, --ranks`): the layout and the launcher, for the summary.
pub(super) fn describe(layout: &RankLayout, started: Option<(usize, &str)>) -> String {
    let launcher = started.map_or("", |(_, l)| l);
    let pipeline = match &layout.pipeline {
        Some(p) if p.interleaved() => format!(
            " × pipeline {} of {} micro-batches, interleaved: {} chunks, each a rank",
            p.devices,
            p.micro_batches,
            p.layers.len()
        ),
        Some(p) => format!(
            " × pipeline {} of {} micro-batches",
            p.layers.len(),
            p.micro_batches
        ),
        None => String::new(),
    };
    let sequence = match layout.sequence_parallel {
        true => " with sequence parallelism",
        false => "",
    };
    format!(
        "data {} × tensor {}{pipeline}{sequence}, {launcher}",
        layout.dp, layout.tp
    )
}

/// Per output (name, shape of one part), the dim along which `parts` parts of it (the
/// data-parallel replicas', or their micro-batches') make the whole — the one the whole
/// batch's output (the model checked for the whole `arrays`) has `parts` times longer; E0975
/// for an output without one. Nothing to gather for one part.
pub(super) fn gather_dims(
    args: &RunArgs,
    arrays: &BTreeMap<String, NpyArray>,
    outputs: &[(String, Vec<usize>)],
    parts: usize,
    reporter: &Reporter,
) -> Result<Vec<Option<usize>>, Failure> {
    if parts <= 1 {
        return Ok(vec![None; outputs.len()]);
    }
    let (checked, entry) = run::check_for_inputs(args, &run::shapes_of(arrays), false, reporter)?;
    let whole = checked
        .model(&entry)
        .ok_or_else(|| format!("model `{entry}` disappeared after setting its dims"))?;
    outputs
        .iter()
        .map(|(name, part)| {
            let full: Option<Vec<usize>> =
                whole.outputs.iter().find(|o| o.name == *name).map(|o| {
                    whole
                        .ty(o.value)
                        .shape
                        .iter()
                        .map(|&d| d as usize)
                        .collect()
                });
            full.and_then(|full| ranks::gather_dim(&full, part, parts))
                .map(Some)
                .ok_or_else(|| {
                    Failure::Message(
                        Code::E0975,
                        format!(
                            "output `{name}` {part:?} has no batch dim to gather from the {parts} \
                             data-parallel replicas or micro-batches (each holds a different \
                             value of it)"
                        ),
                    )
                })
        })
        .collect()
}

/// Every output of the last forward of `exec` (name, type, value), gathered from the
/// data-parallel replicas along `gather`'s dim where it names one; the type is the whole's.
fn gathered_outputs(
    exec: &mut Executor,
    gather: &[Option<usize>],
) -> Result<Vec<(String, String, NpyArray)>, Failure> {
    let mut out = Vec::new();
    let outputs = exec.module().outputs.clone();
    for ((name, v), dim) in outputs.iter().zip(gather) {
        let array = exec
            .output_npy(name)
            .ok_or_else(|| format!("output `{name}` cannot be written as .npy"))?;
        let mut ty = exec.module().values[*v as usize].ty.clone();
        let array = match dim {
            None => array,
            Some(d) => {
                let comm = exec
                    .collectives()
                    .ok_or_else(|| Failure::Message(Code::E0973, "no collectives".to_string()))?;
                let members = data_members(comm.mesh());
                let bytes = ranks::gather_bytes(comm, DATA_AXIS, *d, array.shape(), array.data())
                    .map_err(|e| Failure::Message(Code::E0973, e.message))?;
                let mut shape = array.shape().to_vec();
                shape[*d] *= members;
                ty.shape[*d] *= members as i64;
                NpyArray::new(array.dtype(), shape, bytes).map_err(|e| e.to_string())?
            }
        };
        out.push((name.clone(), ty.to_string(), array));
    }
    Ok(out)
}

/// The data-parallel replicas of `mesh`.
fn data_members(mesh: &Mesh) -> usize {
    mesh.axis(DATA_AXIS).map_or(1, |a| mesh.axes()[a].1)
}
