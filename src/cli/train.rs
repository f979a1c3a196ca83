//! `mslc train FILE.msl`: compile a `train` declaration's training step and run it over
//! `--data` for `--steps` steps, with a progress line per step, optional JSONL metrics,
//! atomic checkpoints, exact resumption and the first step's gradients for comparison.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mslc_artifact::Module;
use mslc_check::decls::Train;
use mslc_check::policy::ParallelPolicy;
use mslc_check::{check_path, Checked};
use mslc_core::diag::{Code, Diagnostic};
use mslc_driver::loss_scale::LossScaler;
use mslc_driver::parallel::plan_train;
use mslc_driver::pipeline::Turns;
use mslc_driver::ranks::{self, RankCoords, RankLayout};
use mslc_driver::recompute::{MemoryRequest, RecomputeReport};
use mslc_driver::select::{root_error, Selection};
use mslc_driver::train::{
    batch_parts, choose_train, compile_train_ranked, compile_train_stage, micro_batch_dim,
    train_as_run, train_compile_options, CompiledTrain, StageStep, TrainOptions,
};
use mslc_driver::trainer::{
    data_inputs, Dataset, StageRuntime, StepMetrics, TrainRunError, Trainer,
};
use mslc_exec::collectives::Collectives;
use mslc_exec::{ExecOptions, Executor};
use mslc_plan::memory::MemoryPlan;
use mslc_plan::parallel::estimate::Schedule;
use mslc_plan::parallel::ExecutorMemory;

use super::output::Failure;
use super::world::{self, LaunchArgs, World};
use super::{ModelArgs, PrecisionArg, Reporter};

/// Arguments of `mslc train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The model source holding the `train` declaration.
    pub file: PathBuf,
    /// The `train` declaration to run when the source declares several.
    #[arg(long, value_name = "TRAIN")]
    pub entry: Option<String>,
    /// Initial weights, matched to parameters by path.
    #[arg(long, value_name = "W.safetensors")]
    pub weights: Option<PathBuf>,
    /// Initialise parameters from their declared init with this seed.
    #[arg(long, value_name = "N")]
    pub init_seed: Option<u64>,
    /// A directory of NAME.npy (one per input and label, first axis = samples), or one
    /// `tokens.npy` of shape [N, S+1] for a language model.
    #[arg(long, value_name = "PATH")]
    pub data: PathBuf,
    /// Steps to run (in total, counting those of a resumed checkpoint; a step that loss scaling
    /// skips counts).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub steps: u64,
    /// Shuffle the samples of each epoch with this seed (default: in order).
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
    /// Seed of the dropout masks (a resumed run keeps its checkpoint's).
    #[arg(long, value_name = "SEED", default_value_t = 0)]
    pub seed: u64,
    /// Where checkpoints go (`DIR/step-K/`).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Write a checkpoint every K updates (and after the last).
    #[arg(long, value_name = "K")]
    pub save_every: Option<u64>,
    /// Continue from a checkpoint `DIR/step-K`.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Append one JSON object per step (step, loss, lr, loss_scale, grad_norm, skipped, ms).
    #[arg(long, value_name = "FILE.jsonl")]
    pub metrics: Option<PathBuf>,
    /// Write a Chrome trace (opens in Perfetto) of rank 0's last run of its step program: the
    /// last micro-batch of the last update, forward, backward and (in the same program) the
    /// optimizer update, per op with its source path and kernel.
    #[arg(long, value_name = "F.json")]
    pub profile: Option<PathBuf>,
    /// After the first update's backward, write DIR/grads.safetensors and DIR/loss.npy.
    #[arg(long, value_name = "DIR")]
    pub dump_grads: Option<PathBuf>,
    /// Worker threads (default: one per core; with --ranks, the cores shared among the ranks).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// Check every step's result, forward and backward, for NaN and infinity, and stop at the
    /// first op that produces one with where it was written and its operands' ranges (E0614).
    #[arg(long)]
    pub check_numerics: bool,
    /// Take tuned kernel choices and graph-level decisions from this knowledge base, as
    /// `mslc build` does (default: the one `mslc tune` writes, when it exists).
    #[arg(long, value_name = "FILE.json")]
    pub tune_db: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// Runs the command; 1 on errors in the input, 2 on misused flags.
pub fn run(args: &TrainArgs, reporter: &Reporter) -> u8 {
    world::command(reporter, &args.launch, |world| {
        execute(args, world, reporter)
    })
}

fn usage_checks(args: &TrainArgs) -> Result<(), Failure> {
    let usage = |m: &str| Err(Failure::Usage(m.to_string()));
    if args.weights.is_some() == args.init_seed.is_some() && args.resume.is_none() {
        return usage("give either --weights or --init-seed (or --resume)");
    }
    if args.weights.is_some() && args.init_seed.is_some() {
        return usage("give either --weights or --init-seed, not both");
    }
    if args.threads == Some(0) {
        return usage("--threads must be at least 1");
    }
    if args.launch.ranks == Some(0) {
        return usage("--ranks must be at least 1");
    }
    if args.save_every == Some(0) {
        return usage("--save-every must be at least 1");
    }
    if args.save_every.is_some() && args.output_dir.is_none() {
        return usage("--save-every needs --output-dir for the checkpoints");
    }
    Ok(())
}

/// The summary of rank 0; `None` in the other processes of an MPI world.
fn execute(args: &TrainArgs, world: &World, reporter: &Reporter) -> world::Outcome {
    usage_checks(args)?;
    let started = world.started();
    let pick = (args.entry.as_deref(), the_train as PickTrain);
    let (checked, layout) = check_for_ranks(&args.file, &args.model, started, reporter, pick)?;
    let replicas = layout.dp;
    let emit = |d: Box<mslc_core::diag::Diagnostic>| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    };
    let train = choose_train(&checked, args.entry.as_deref()).map_err(emit)?;
    let model = train
        .model
        .and_then(|m| checked.models.get(m))
        .ok_or_else(|| {
            Failure::Message(Code::E0608, "the train's model did not check".to_string())
        })?;
    let selection = Selection {
        precision: args.precision.precision.as_deref(),
        fuse: true,
        ..Selection::default()
    };
    let (options, loss_scale) =
        train_compile_options(&checked, train, model, selection).map_err(emit)?;
    let train_options = TrainOptions {
        expose_grads: args.dump_grads.is_some(),
        loss_scale,
        memory: MemoryRequest::of_train(&checked, train),
        data_parallel: replicas,
        optimizer_shard: layout.optimizer_shard,
    };
    let tensor_group = layout.tensor_group();
    let tensor = layout.tensor(&tensor_group);
    // The tuning decisions for this device, as a build follows them.
    let tune_db = args
        .tune_db
        .clone()
        .or_else(|| mslc_tune::kb::default_path().filter(|p| p.exists()));
    let decisions = super::tune_decisions::decisions(None, tune_db.as_deref());
    // A pipeline: each stage's step (and forward); rank 0 runs the first.
    let mut stages: Vec<(CompiledTrain, StageStep)> = Vec::new();
    let (mut compiled, unfused) = match &layout.pipeline {
        None => super::tune_decisions::deciding(
            options,
            &decisions,
            |o| compile_train_ranked(train, o, train_options, tensor),
            |t| &t.compiled.module,
        )
        .map_err(|e| emit(e.diagnostic(&checked)))?,
        Some(pipeline) => {
            for s in 0..pipeline.layers.len() {
                let stage = (pipeline, s);
                let step = compile_train_stage(train, &options, train_options, tensor, stage)
                    .map_err(|e| emit(e.diagnostic(&checked)))?;
                stages.push(step);
            }
            (stages[0].0.clone(), Vec::new())
        }
    };
    // A device's chunk-stages take turns: each has the device's share of the cores.
    let threads = ranks::threads_per_rank(args.threads, layout.devices());
    // The knowledge base's choices go into the steps the ranks run: one device's step, or
    // every stage's.
    let apply = |module: &mut Module| {
        super::tune_decisions::apply_kernels(module, tune_db.as_deref(), threads)
    };
    let tuned: usize = match stages.is_empty() {
        true => apply(&mut compiled.compiled.module),
        false => (stages.iter_mut())
            .map(|(step, _)| apply(&mut step.compiled.module))
            .sum(),
    };
    let tuning = tune_db
        .filter(|_| tuned > 0 || !unfused.is_empty())
        .map(|db| {
            format!(
                "tuning:  {tuned} kernel signature(s), {} subgraph decision(s) from {}",
                unfused.len(),
                db.display()
            )
        });
    let grad_accum = compiled.grad_accum;
    let labels: Vec<String> = train
        .spec
        .labels
        .iter()
        .map(|(n, _)| n.name.clone())
        .collect();
    // Every program once, shared by the ranks that run it: the step, and a pipeline stage's
    // step, forward and update.
    let module = Arc::new(compiled.compiled.module.clone());
    let stage_programs: Vec<StagePrograms> = stages
        .iter()
        .map(|(step, cut)| StagePrograms {
            step: Arc::new(step.compiled.module.clone()),
            forward: cut.forward.as_ref().map(|f| Arc::new(f.module.clone())),
            update: Arc::new(cut.update.compiled.module.clone()),
        })
        .collect();
    let arena = compiled.compiled.memory.clone();
    let recompute = compiled.recompute.clone();
    let mut inputs = data_inputs(&module, &compiled);
    if !stages.is_empty() {
        // A pipeline's data: each stage's data inputs (the first's ids, the last's labels).
        inputs.clear();
        for (step, cut) in &stages {
            let exchanged = cut.exchanged_inputs();
            for input in data_inputs(&step.compiled.module, step) {
                if !exchanged.contains(&input.0) && !inputs.iter().any(|(n, _)| *n == input.0) {
                    inputs.push(input);
                }
            }
        }
    }
    let stage_params: Vec<BTreeSet<String>> = stages
        .iter()
        .map(|(step, _)| world::params_of(&step.compiled.module))
        .collect();
    // A micro-batch's samples: the batch dim of the first stage's first data input.
    let micro_batch = inputs
        .first()
        .and_then(|(_, ty)| ty.shape.first().copied())
        .unwrap_or(1)
        .max(1) as usize;
    let data = Dataset::read(&args.data, &inputs, &labels)
        .map(Arc::new)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let exec_options = ExecOptions {
        threads,
        memory_limit: mslc_exec::limits::available_memory(),
    };
    // Under an interleaved schedule the chunk-stages of a device take turns, each waiting for
    // its turn as long as for a collective.
    let turns: Vec<Arc<Turns>> = (0..layout.devices()).map(|_| Arc::default()).collect();
    let turn_timeout = world.timeout();
    // One rank: its executor over the shared module, weights (its shards) and data (its
    // replica's slice of each batch).
    let rank_loop = |rank: usize, comm: Option<Box<dyn Collectives>>| {
        let coords = layout.coords(rank);
        let RankCoords { replica, part, .. } = coords;
        let (module, compiled) = match (stages.get(coords.stage), stage_programs.get(coords.stage))
        {
            (Some((step, _)), Some(programs)) => (&programs.step, step),
            _ => (&module, &compiled),
        };
        let mut exec = Executor::new(Arc::clone(module), &exec_options)
            .map_err(|e| Failure::Message(Code::E0604, e.message))?;
        if let Some(comm) = comm {
            exec.set_collectives(comm);
        }
        if let Some(path) = &args.weights {
            let zero = compiled.zero.as_ref().map(|z| (z, replica));
            let elsewhere = world::elsewhere(&stage_params, coords.stage);
            world::load_stage_shard(&mut exec, path, &layout, part, zero, &elsewhere)?;
        } else if layout.tp > 1 || compiled.zero.as_ref().is_some_and(|z| z.shards_params()) {
            // Drawn whole, as one device draws them, then cut to this rank's share.
            let zero = compiled.zero.as_ref().map(|z| (z, replica));
            let seed = args.init_seed.unwrap_or(0);
            ranks::init_rank_weights(&mut exec, seed, &layout.splits, (part, layout.tp), zero)
                .map_err(|e| Failure::Message(e.code, e.message))?;
        } else {
            exec.init_params(args.init_seed.unwrap_or(0));
        }
        exec.check_numerics(args.check_numerics);
        let mut trainer = Trainer::new(
            exec,
            compiled,
            train.spec.schedule,
            Arc::clone(&data),
            args.shuffle,
            args.seed,
        )
        .and_then(|mut t| t.shard_data(replica, replicas).map(|()| t))
        .map_err(|e| Failure::Message(e.code, e.message))?;
        if layout.tp > 1 {
            trainer.shard_tensors(layout.splits.clone(), (part, layout.tp));
        }
        if let Some((_, step)) = stages.get(coords.stage) {
            // The stage's forward and update run on the step's parameters, lent per run.
            let lender = trainer.executor();
            let programs = &stage_programs[coords.stage];
            let borrow = |module: &Arc<Module>| {
                Executor::borrowing(Arc::clone(module), lender, &exec_options)
                    .map_err(|e| Failure::Message(Code::E0604, e.message))
            };
            let forward = match &programs.forward {
                Some(f) => Some(borrow(f)?),
                None => None,
            };
            let update = borrow(&programs.update)?;
            let runtime = StageRuntime {
                forward,
                update,
                cut: step.cut.clone(),
                stage: coords.stage,
                ranks: (0..stages.len())
                    .map(|stage| layout.rank(RankCoords { stage, ..coords }))
                    .collect(),
                micro_batches: layout.pipeline.as_ref().map_or(1, |p| p.micro_batches),
                schedule: layout
                    .pipeline
                    .as_ref()
                    .map_or(Schedule::OneFOneB, |p| p.schedule),
                turns: layout
                    .interleaved()
                    .then(|| Arc::clone(&turns[layout.device(coords)])),
                turn_timeout,
            };
            trainer
                .run_as_stage(runtime, micro_batch)
                .map_err(|e| Failure::Message(e.code, e.message))?;
        }
        if let Some(dir) = &args.resume {
            trainer
                .resume(dir)
                .map_err(|e| Failure::Message(e.code, e.message))?;
        }
        Ok::<Trainer, Failure>(trainer)
    };
    // A rank other than 0: steps quietly, joining in the gathers of checkpoints.
    let follow = |rank: usize, comm: Option<Box<dyn Collectives>>| {
        let mut trainer = rank_loop(rank, comm)?;
        let failed = |e: TrainRunError| Failure::Message(e.code, e.message);
        let first = trainer.state().step;
        while trainer.state().step < args.steps {
            let m = trainer.step().map_err(failed)?;
            // Rank 0 dumps the first step's gradients, gathered from the shards and stages.
            if trainer.gathers_grads() && args.dump_grads.is_some() && m.step == first + 1 {
                trainer.join_grads().map_err(failed)?;
            }
            // Sharded checkpoints gather every rank's shards and slices.
            if trainer.gathers_checkpoints() && args.output_dir.is_some() && save_due(args, m.step)
            {
                trainer.join_checkpoint().map_err(failed)?;
            }
        }
        Ok::<(), Failure>(())
    };
    let ranks = world.ranks(&layout, threads)?;
    // The run's memory is measured from here: the ranks' executors and trainers, each rank's
    // copy of the data, the steps.
    // Ranks a device runs: one, but under an interleaved schedule its chunk-ranks; and so the
    // devices this process runs.
    let chunks = layout.ranks() / layout.devices().max(1);
    let devices_here = ranks.len().div_ceil(chunks.max(1));
    let measured_from = mslc_exec::limits::reset_peak_rss().map(|mark| (mark, devices_here));
    // Under MPI the transport's shared memory reaches its steady state here, inside the
    // measurement (the plan's `mpi_reserve` counts it), so the peak does not depend on how
    // many steps the run takes.
    world.warm_up();
    // Each stage's programs (its step, and its forward and update on the step's parameters)
    // and messages.
    let stage_memory = match &layout.pipeline {
        Some(p) => ranks::stage_memory(&stages, p, exec_options.threads),
        None => Vec::new(),
    };
    let rank = match stage_memory.first() {
        Some(&first) => first,
        None => ranks::rank_memory([&arena], exec_options.threads),
    };
    // What each pipeline device holds: every stage it runs (under an interleaved schedule,
    // chunk k for every k that is d modulo the devices of the pipeline); off a pipeline, a
    // rank's.
    let device_memory: Vec<ExecutorMemory> = match layout.pipeline.as_ref() {
        Some(p) => (0..p.devices)
            .map(|d| {
                let stages = stage_memory.iter().enumerate();
                let mine = stages.filter(|&(s, _)| p.device_of(s) == d);
                ExecutorMemory::together(mine.map(|(_, &m)| m), exec_options.threads)
            })
            .collect(),
        None => vec![rank],
    };
    let device = device_memory[0];
    // The process's peak is measured over every device it runs and shared among them, so
    // what the others plan to hold joins device 0's in the comparison: on a pipeline, the
    // other stages' ranks hold other programs. A device's later chunks come with its first.
    let others_total: u64 = ranks
        .iter()
        .filter(|(r, _)| *r != 0)
        .filter_map(|(r, _)| {
            let stage = layout.coords(*r).stage;
            match layout.pipeline.as_ref() {
                Some(p) if stage >= p.devices => None,
                Some(p) => Some(device_memory[p.device_of(stage)].total),
                None => Some(rank.total),
            }
        })
        .sum();
    let leader = |comm| {
        let trainer = rank_loop(0, comm)?;
        let summary = Summary {
            grad_accum,
            loss_scale,
            arena: &arena,
            recompute: &recompute,
            measured_from,
            tuning: tuning.as_deref(),
            rank,
            device: (device, chunks),
            others: (others_total, devices_here.saturating_sub(1)),
            library: world.library_reserve(),
        };
        lead(args, reporter, &checked, train, trainer, summary)
    };
    world::run_ranks(world, ranks, reporter, leader, follow)
}

/// A pipeline stage's programs, each shared by the ranks of the process that run that stage.
struct StagePrograms {
    step: Arc<Module>,
    forward: Option<Arc<Module>>,
    update: Arc<Module>,
}

/// Whether a checkpoint is written after step `step`: every `--save-every` and after the last.
fn save_due(args: &TrainArgs, step: u64) -> bool {
    args.save_every.is_some_and(|k| step.is_multiple_of(k)) || step == args.steps
}

/// What the summary reports besides the loop's state.
struct Summary<'a> {
    grad_accum: u32,
    loss_scale: LossScaler,
    arena: &'a MemoryPlan,
    recompute: &'a RecomputeReport,
    /// The resident set when the ranks started, and how many devices this process runs.
    measured_from: Option<(mslc_exec::limits::RssMark, usize)>,
    /// What the tuning knowledge base changed, when it changed anything.
    tuning: Option<&'a str>,
    /// What rank 0's programs allocate by their memory plans (on a pipeline, its stage's
    /// step, forward and update).
    rank: ExecutorMemory,
    /// What device 0's ranks allocate, and how many ranks a device runs: rank 0's alone, but
    /// under an interleaved schedule its device's chunk-stages together.
    device: (ExecutorMemory, usize),
    /// The other devices this process runs: what their plans hold together, and how many.
    others: (u64, usize),
    /// What the process holds beside its devices' plans for the collectives' library
    /// ([`World::library_reserve`]), shared among its devices.
    library: u64,
}

/// Rank 0's loop: steps with the progress line, metrics, gradient dump and checkpoints, then
/// the summary.
fn lead(
    args: &TrainArgs,
    reporter: &Reporter,
    checked: &Checked,
    train: &Train,
    mut trainer: Trainer,
    summary: Summary,
) -> Result<(String, serde_json::Value), Failure> {
    let Summary {
        grad_accum,
        loss_scale,
        arena,
        recompute,
        measured_from,
        tuning,
        rank,
        device: (device, chunks),
        others: (others_planned, others_count),
        library,
    } = summary;
    let (per_epoch, dropped) = trainer.epoch_shape();
    let mut notes: Vec<String> = tuning.iter().map(|t| t.to_string()).collect();
    if dropped > 0 {
        notes.push(format!(
            "note: {} samples make {per_epoch} batches of {}; the last {dropped} of each epoch are dropped",
            per_epoch * trainer.state().batch as usize + dropped,
            trainer.state().batch
        ));
    }
    let mut metrics_file = match &args.metrics {
        Some(path) => Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    Failure::Message(
                        Code::E0600,
                        format!("cannot open `{}`: {e}", path.display()),
                    )
                })?,
        ),
        None => None,
    };
    let first = trainer.state().step;
    let bar = progress_bar(args.steps.saturating_sub(first));
    // Every step's metrics, for the summary: their bytes are planned with the run (kept whole,
    // so none of the vector's growth is left over; a count too large to reserve just grows).
    let mut history: Vec<StepMetrics> = Vec::new();
    let steps_left = usize::try_from(args.steps.saturating_sub(first)).unwrap_or(usize::MAX);
    let _ = history.try_reserve_exact(steps_left);
    let history_bytes = (history.capacity() * std::mem::size_of::<StepMetrics>()) as u64;
    let mut written = Vec::new();
    let tokens = trainer.state().batch as f64 * f64::from(grad_accum);
    while trainer.state().step < args.steps {
        if args.profile.is_some() && trainer.state().step + 1 == args.steps {
            trainer.record_workers(true);
        }
        let m = trainer.step().map_err(|e| match &e.numerics {
            Some(report) => {
                bar.finish_and_clear();
                reporter.emit_numerics(report, Some(&checked.sources));
                Failure::Reported
            }
            None => Failure::Message(e.code, e.message),
        })?;
        bar.set_message(format!(
            "step {} loss {:.5} lr {:.3e} scale {} |g| {:.4} skipped {} {:.0} samples/s {:.1} ms/step",
            m.step,
            m.loss,
            m.lr,
            m.loss_scale,
            m.grad_norm,
            m.skipped,
            tokens / (m.ms / 1e3),
            m.ms
        ));
        bar.inc(1);
        if let Some(f) = metrics_file.as_mut() {
            let line = serde_json::to_string(&m).unwrap_or_default();
            writeln!(f, "{line}")
                .map_err(|e| Failure::Message(Code::E0600, format!("--metrics: {e}")))?;
        }
        if m.step == first + 1 {
            if let Some(dir) = &args.dump_grads {
                written.extend(
                    trainer
                        .dump_grads(dir)
                        .map_err(|e| Failure::Message(e.code, e.message))?,
                );
            }
        }
        if let (Some(out), true) = (&args.output_dir, save_due(args, m.step)) {
            written.push(
                trainer
                    .save(out)
                    .map_err(|e| Failure::Message(e.code, e.message))?,
            );
        }
        history.push(m);
    }
    bar.finish_and_clear();
    // The run's peak, before the trace's text is made (the profile's, not the plan's memory).
    let measured = measured_from.and_then(|(mark, devices)| {
        Some(mslc_exec::limits::peak_rss_since(mark)? / devices.max(1) as u64)
    });
    // A run that stepped nothing (resumed at its last step) has no step to trace.
    if let (Some(path), false) = (&args.profile, history.is_empty()) {
        let json = trainer.executor().profile_json();
        mslc_io::atomic::write_atomic(path, |tmp| std::fs::write(tmp, &json)).map_err(|e| {
            Failure::Message(
                Code::E0600,
                format!("cannot write --profile `{}`: {e}", path.display()),
            )
        })?;
        written.push(path.clone());
    }
    let mut text = format!(
        "trained {} ({} parameters, {}) for {} step(s), steps {}..{}\n  memory:  arena {} planned, {} allocated (lower bound {})\n",
        train.spec.name.name,
        trainer.params().len(),
        trainer.state().optimizer,
        history.len(),
        first + 1,
        trainer.state().step,
        mslc_core::units::human_bytes(arena.arena_bytes),
        mslc_core::units::human_bytes(trainer.executor().arena_bytes() as u64),
        mslc_core::units::human_bytes(arena.lower_bound_bytes),
    );
    // Each rank runs the same per-rank program: its memory plan with the scratch of its
    // threads, against what its executor allocated (on a pipeline, rank 0's stage's step,
    // forward and update).
    let exec = trainer.executor();
    let stage_executors = trainer.stage_executors();
    let together: Vec<&Executor> = std::iter::once(exec)
        .chain(stage_executors.iter().copied())
        .collect();
    let allocated = Executor::allocated_together(&together);
    let which = match stage_executors.is_empty() {
        true => String::new(),
        false => " (the first stage's step, forward and update)".to_string(),
    };
    text.push_str(&format!(
        "  per rank: {} planned (buffers, staging, packed weights, scratch of {} thread(s)){which}, {} allocated\n",
        mslc_core::units::human_bytes(rank.held.allocated),
        exec.threads(),
        mslc_core::units::human_bytes(allocated),
    ));
    for line in recompute.lines() {
        text.push_str(&line);
        text.push('\n');
    }
    // What each device holds by the plan, with the executor's reserve; it runs no collective
    // buffers of its own (the collectives reduce in place). A gathered checkpoint or gradient
    // dump holds one whole tensor between steps, and reading weights or a checkpoint one
    // tensor's pages and share before the first: the larger, out of the reserve as far as it
    // goes.
    let files = (args.output_dir.is_some(), args.dump_grads.is_some());
    let saving = trainer.file_staging_bytes(files.0, files.1, true);
    let loading = trainer.load_transient_bytes();
    let staging = saving.max(loading);
    // Per device of this process, as the measurement is. One device: its plan, a file's
    // transient out of its reserve as far as it goes. Several: their plans' mean, with a
    // gathered file's transients beside their steps — rank 0 writing a tensor, the others
    // gathering it with it at the same time, as every rank that gathers or sends a file's
    // tensors does while the others step — or, before the first step, a read's transient out
    // of each one's reserve as far as it goes.
    let devices_here = others_count as u64 + 1;
    let beyond_reserve = |transient: u64| device.with_transient(transient) - device.total;
    // What the files add to the plan: beyond the reserve on one device, per device on several.
    let (base, beyond) = match others_count {
        0 => (device.total, beyond_reserve(staging)),
        _ => {
            let joining = trainer.file_staging_bytes(files.0, files.1, false);
            let gathering = saving.saturating_add(joining.saturating_mul(others_count as u64));
            (
                device.total.saturating_add(others_planned) / devices_here,
                (gathering / devices_here).max(beyond_reserve(loading)),
            )
        }
    };
    let planned = base
        .saturating_add(beyond)
        .saturating_add(library.saturating_add(history_bytes) / devices_here);
    let per = match chunks {
        1 => "per rank".to_string(),
        n => format!("per device (its {n} chunk-ranks)"),
    };
    if let Some(m) = measured {
        text.push_str(&format!(
            "  measured: peak resident memory {} {per} over the run, planned peak {}{} with the {} % + {} reserve{}{} ({:+.1} %)\n",
            mslc_core::units::human_bytes(m),
            mslc_core::units::human_bytes(planned),
            match others_planned == device.total * others_count as u64 {
                true => String::new(),
                false => format!(
                    " (the mean of its {devices_here} devices' plans; device 0's {})",
                    mslc_core::units::human_bytes(device.total)
                ),
            },
            100.0 * mslc_plan::parallel::estimate::EXECUTOR_RESERVE,
            mslc_core::units::human_bytes(mslc_plan::parallel::estimate::EXECUTOR_FIXED_RESERVE),
            match library {
                0 => String::new(),
                l => format!(
                    ", {} for MPI",
                    mslc_core::units::human_bytes(l / devices_here)
                ),
            },
            match (staging, others_count, beyond) {
                (0, _, _) => String::new(),
                (n, _, 0) => format!(
                    ", {} of it to read or gather files",
                    mslc_core::units::human_bytes(n)
                ),
                (_, 0, beyond) => format!(
                    " and {} more to read or gather files",
                    mslc_core::units::human_bytes(beyond)
                ),
                (_, _, beyond) => format!(
                    " and {} per device to read or gather files",
                    mslc_core::units::human_bytes(beyond)
                ),
            },
            100.0 * (planned as f64 - m as f64) / (m.max(1) as f64)
        ));
    }
    if let (Some(a), Some(b)) = (history.first(), history.last()) {
        text.push_str(&format!("  loss:    {:.6} -> {:.6}\n", a.loss, b.loss));
    }
    if loss_scale.scales() {
        let state = trainer.state();
        text.push_str(&format!(
            "  scaling: {loss_scale}: scale now {}, {} of {} step(s) skipped\n",
            state.scale.loss_scale, state.skipped, state.step
        ));
    }
    for n in &notes {
        text.push_str(&format!("  {n}\n"));
    }
    for w in &written {
        text.push_str(&format!("  wrote {}\n", w.display()));
    }
    let json = serde_json::json!({
        "train": train.spec.name.name,
        "steps": history,
        "recompute": recompute,
        "allocated_arena_bytes": trainer.executor().arena_bytes(),
        "rank_memory": {
            "planned_bytes": rank.held.allocated,
            "allocated_bytes": allocated,
            "params_bytes": arena.params_bytes,
            "inputs_bytes": arena.inputs_bytes,
            "next_bytes": arena.next_bytes,
        },
        "planned_peak_bytes_per_device": planned,
        "measured_peak_bytes_per_device": measured,
        "ranks_per_device": chunks,
        "written": written,
        "notes": notes,
    });
    Ok((text, json))
}

/// Picks the train whose plan ranks run from a source that checked, by `--entry`: `mslc
/// train`'s train, or the first train of `mslc run`'s model (none: one device).
pub type PickTrain =
    for<'c> fn(&'c Checked, Option<&str>) -> Result<Option<&'c Train>, Box<Diagnostic>>;

/// `mslc train`'s pick: the `--entry` train, or the only one.
fn the_train<'c>(
    checked: &'c Checked,
    entry: Option<&str>,
) -> Result<Option<&'c Train>, Box<Diagnostic>> {
    choose_train(checked, entry).map(Some)
}

/// Checks `file` for the ranks `started` (`--ranks` or `--mpi`; `None`: one device, whatever
/// the plan) and reports its diagnostics: the picked train's model with its batch dim set to
/// one replica's micro-batch ([`micro_batch_dim`]), and how the ranks run the train's plan.
/// E0970 when the ranks are not the plan's device count, E0972 for what is planned but not run.
pub fn check_for_ranks(
    file: &Path,
    model: &ModelArgs,
    started: Option<(usize, &str)>,
    reporter: &Reporter,
    (entry, pick): (Option<&str>, PickTrain),
) -> Result<(Checked, RankLayout), Failure> {
    let one = RankLayout::one();
    let mut options = model.check_options();
    let mut checked = check_path(file, &options);
    let emit = |d: Box<Diagnostic>, checked: &Checked| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    };
    let train = match checked.has_errors() {
        true => None,
        false => pick(&checked, entry).map_err(|d| emit(d, &checked))?,
    };
    // A step takes one micro-batch of one replica, `batch / (grad_accum × replicas)` samples,
    // unless --dim sets the model's batch dim: check again with that size.
    let mut replicas = 1;
    if let (Some(started), false) = (started, checked.has_errors()) {
        check_world(&checked, train, started).map_err(|d| emit(d, &checked))?;
    }
    if let Some(train) = train {
        if started.is_some() {
            replicas = batch_parts(&checked, train);
        }
        let dim = match train.model.and_then(|m| checked.models.get(m)) {
            Some(m) => {
                micro_batch_dim(train, m, &model.dims, replicas).map_err(|d| emit(d, &checked))?
            }
            None => None,
        };
        if let Some((name, size)) = dim {
            options.overrides.dims.insert(name, size.to_string());
            checked = check_path(file, &options);
        }
    }
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return Err(Failure::Reported);
    }
    // The train as its steps take the batch (another one than declared under a `--dim` that
    // disagrees, which W0015 says), and so as its plan counts it.
    let train = pick(&checked, entry).map_err(|d| emit(d, &checked))?;
    let as_run = train.map(
        |train| match train.model.and_then(|m| checked.models.get(m)) {
            Some(m) => train_as_run(train, m, &model.dims, replicas),
            None => (std::borrow::Cow::Borrowed(train), None),
        },
    );
    if let Some((_, Some(warning))) = &as_run {
        reporter.emit(std::slice::from_ref(warning), &checked.sources);
    }
    let Some((world, launcher)) = started else {
        return Ok((checked, one));
    };
    let plan = match &as_run {
        Some((train, _)) => plan_train(&checked, train).map_err(|d| emit(d, &checked))?,
        None => None,
    };
    let layout = ranks::layout(plan.as_ref(), world, launcher)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    Ok((checked, layout))
}

/// Checks that the `world` ranks `launcher` started are the device count of `train`'s plan
/// (one without a train or a `parallel` policy): E0970 otherwise, at the source of that count
/// ([`world_mismatch`]).
fn check_world(
    checked: &Checked,
    train: Option<&Train>,
    (world, launcher): (usize, &str),
) -> Result<(), Box<Diagnostic>> {
    let parallel = train
        .and_then(|t| t.parallel)
        .map(|i| &checked.decls.parallels[i]);
    let devices = parallel.map_or(1, |p| p.devices);
    ranks::check_world(devices, world, launcher)
        .map_err(|e| world_mismatch(checked, train, parallel, world, e))
}

/// E0970 at the source of the device count: the train's mesh, or the train itself when it
/// has no `parallel` policy, or the model when it has no train; with how to start as many
/// ranks or plan for as many devices.
fn world_mismatch(
    checked: &Checked,
    train: Option<&Train>,
    parallel: Option<&ParallelPolicy>,
    world: usize,
    e: ranks::RanksError,
) -> Box<Diagnostic> {
    let (file, span, label) = match (train, parallel) {
        (_, Some(p)) => (
            p.file,
            p.mesh_span,
            format!("this mesh has {} device(s)", p.devices),
        ),
        (Some(t), None) => (
            t.spec.file,
            t.spec.name.span,
            "this train has no `parallel` policy: one device".to_string(),
        ),
        (None, None) => {
            return root_error(
                checked,
                e.code,
                e.message,
                format!(
                    "without a `train` the model runs on one device: start one rank, or declare \
                     a `train` of it with a `parallel` policy whose mesh has {world} device(s)"
                ),
            )
        }
    };
    let devices = parallel.map_or(1, |p| p.devices);
    let help = format!(
        "start {devices} rank(s) (`--ranks {devices}`, or `mpiexec -n {devices} … --mpi`), or \
         give the train a `parallel` policy whose mesh has {world} device(s)"
    );
    Box::new(
        Diagnostic::error(e.code, file, span, e.message)
            .with_label(label)
            .with_help(help),
    )
}

/// A bar with the step's metrics as its message, on stderr when it is a terminal.
fn progress_bar(steps: u64) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(steps), target);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    bar
}
