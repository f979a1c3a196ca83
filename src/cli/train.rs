//! `mslc train FILE.msl`: compile a `train` declaration's training step and run it over
//! `--data` for `--steps` steps, with a progress line per step, optional JSONL metrics,
//! atomic checkpoints, exact resumption and the first step's gradients for comparison.

use std::fs::OpenOptions;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mslc_check::decls::Train;
use mslc_check::{check_path, Checked};
use mslc_core::diag::Code;
use mslc_driver::loss_scale::LossScaler;
use mslc_driver::parallel::plan_train;
use mslc_driver::ranks::{self, RankLayout};
use mslc_driver::recompute::{MemoryRequest, RecomputeReport};
use mslc_driver::select::Selection;
use mslc_driver::train::{
    choose_train, compile_train_ranked, micro_batch_dim, train_compile_options, TrainError,
    TrainOptions, TENSOR_AXIS,
};
use mslc_driver::trainer::{data_inputs, Dataset, StepMetrics, TrainRunError, Trainer};
use mslc_exec::collectives::Collectives;
use mslc_exec::{ExecOptions, Executor};
use mslc_io::safetensors::{SafetensorsFile, TensorRef};
use mslc_ir::shard::Group;
use mslc_plan::memory::MemoryPlan;

use super::output::Failure;
use super::world::World;
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
    /// After the first update's backward, write DIR/grads.safetensors and DIR/loss.npy.
    #[arg(long, value_name = "DIR")]
    pub dump_grads: Option<PathBuf>,
    /// Worker threads (default: one per core; with --ranks, the cores shared among the ranks).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Run the train's parallel plan on N ranks, threads of this process exchanging through
    /// shared memory; N must equal the plan's device count (E0970). Data- and tensor-parallel
    /// plans run (E0972 for the others); rank 0 reports and writes the checkpoints.
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Run this process's rank of the train's parallel plan over MPI, one rank per process:
    /// `mpiexec -n N mslc train --mpi …`, N the plan's device count (E0970 otherwise, a world
    /// of 1 included). Rank 0 reports and writes the checkpoints; the others stay quiet. Needs
    /// an mslc built with the cargo feature `mpi`.
    #[arg(long)]
    pub mpi: bool,
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
    match execute(args, reporter) {
        // A rank other than 0 of an MPI world: rank 0 reports.
        Ok(None) => 0,
        outcome => reporter.finish(outcome.map(|done| done.unwrap_or_default())),
    }
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
    if args.ranks == Some(0) {
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
fn execute(
    args: &TrainArgs,
    reporter: &Reporter,
) -> Result<Option<(String, serde_json::Value)>, Failure> {
    usage_checks(args)?;
    let world = World::of(args.ranks, args.mpi)?;
    let started = world.started();
    let mut options = args.model.check_options();
    let mut checked = check_path(&args.file, &options);
    let split = batch_split(args, started, &checked, reporter)?;
    // A step takes one micro-batch of one replica, `batch / (grad_accum × replicas)` samples,
    // unless --dim sets the model's batch dim: check again with that size.
    if let Some((name, size)) = micro_batch_override(args, &checked, reporter, split)? {
        options.overrides.dims.insert(name, size.to_string());
        checked = check_path(&args.file, &options);
    }
    let layout = rank_layout(args, started, &checked, reporter)?;
    let replicas = layout.dp;
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return Err(Failure::Reported);
    }
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
    };
    let tensor_group = Group {
        axis: TENSOR_AXIS.to_string(),
        ranks: layout.tp,
    };
    let tensor = (layout.tp > 1).then_some((&layout.splits, &tensor_group));
    // The tuning decisions for this device, as a build follows them.
    let tune_db = args
        .tune_db
        .clone()
        .or_else(|| mslc_tune::kb::default_path().filter(|p| p.exists()));
    let decisions = super::tune_decisions::decisions(None, tune_db.as_deref());
    let (mut compiled, unfused) = super::tune_decisions::deciding(
        options,
        &decisions,
        |o| compile_train_ranked(train, o, train_options, tensor),
        |t| &t.compiled.module,
    )
    .map_err(|e| match e {
        TrainError::Train(d) => emit(d),
        TrainError::Compile(e) => emit(e.diagnostic(&checked)),
    })?;
    let threads = ranks::threads_per_rank(args.threads, replicas * layout.tp);
    let tuned = super::tune_decisions::apply_kernels(
        &mut compiled.compiled.module,
        tune_db.as_deref(),
        threads,
    );
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
    let module = compiled.compiled.module.clone();
    let arena = compiled.compiled.memory.clone();
    let recompute = compiled.recompute.clone();
    let inputs = data_inputs(&module, &compiled);
    let data = Dataset::read(&args.data, &inputs, &labels)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let exec_options = ExecOptions {
        threads,
        memory_limit: mslc_exec::limits::available_memory(),
    };
    let mesh = layout
        .mesh()
        .map_err(|e| Failure::Message(e.code, e.message))?;
    // One rank: its executor over the shared module, weights (its shards) and data (its
    // replica's slice of each batch).
    let rank_loop = |rank: usize, comm: Option<Box<dyn Collectives>>| {
        let coords = mesh.coords(rank);
        let (replica, part) = (coords[0], coords[1]);
        let mut exec = Executor::new(module.clone(), &exec_options)
            .map_err(|e| Failure::Message(Code::E0604, e.message))?;
        if let Some(comm) = comm {
            exec.set_collectives(comm);
        }
        if let Some(path) = &args.weights {
            let file = SafetensorsFile::open(path)
                .map_err(|e| Failure::Message(Code::E0602, e.to_string()))?;
            let shards = ranks::shard_weights(file.tensors(), &layout.splits, part, layout.tp)
                .map_err(|e| Failure::Message(e.code, e.message))?;
            let tensors = shards.iter().map(|(name, shape, dtype, data)| TensorRef {
                name,
                dtype: *dtype,
                shape,
                data,
            });
            exec.load_weights(tensors).map_err(|e| {
                Failure::Message(Code::E0601, format!("`{}`: {}", path.display(), e.message))
            })?;
        } else {
            exec.init_params(args.init_seed.unwrap_or(0));
        }
        exec.check_numerics(args.check_numerics);
        let mut trainer = Trainer::new(
            exec,
            compiled.clone(),
            train.spec.schedule,
            data.clone(),
            args.shuffle,
            args.seed,
        )
        .and_then(|mut t| t.shard_data(replica, replicas).map(|()| t))
        .map_err(|e| Failure::Message(e.code, e.message))?;
        if layout.tp > 1 {
            trainer.shard_tensors(layout.splits.clone());
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
        while trainer.state().step < args.steps {
            let m = trainer.step().map_err(failed)?;
            // Tensor-parallel checkpoints gather every rank's shards.
            if layout.tp > 1 && args.output_dir.is_some() && save_due(args, m.step) {
                trainer.checkpoint_tensors().map_err(failed)?;
            }
        }
        Ok::<(), Failure>(())
    };
    let mut comms = world.ranks(&mesh)?.into_iter().peekable();
    let Some(leader_comm) = comms.next_if(|(rank, _)| *rank == 0).map(|(_, comm)| comm) else {
        // This process's one rank of an MPI world, not rank 0.
        return comms
            .try_for_each(|(rank, comm)| follow(rank, comm))
            .map(|()| None);
    };
    std::thread::scope(|scope| {
        // Ranks 1.. step in the background; a rank that fails drops its collectives, and the
        // others stop at their next collective with E0973 instead of waiting forever.
        let followers: Vec<_> = comms
            .map(|(rank, comm)| {
                let follow = &follow;
                scope.spawn(move || follow(rank, comm))
            })
            .collect();
        let leader = rank_loop(0, leader_comm).and_then(|trainer| {
            let summary = Summary {
                grad_accum,
                loss_scale,
                arena: &arena,
                recompute: &recompute,
                tuning: tuning.as_deref(),
            };
            lead(args, reporter, &checked, train, trainer, summary)
        });
        let (done, mut errors) = match leader {
            Ok(done) => (Some(done), Vec::new()),
            Err(e) => (None, vec![e]),
        };
        for f in followers {
            match f.join() {
                Ok(Err(e)) => errors.push(e),
                Ok(Ok(())) => {}
                Err(_) => errors.push(Failure::Message(
                    Code::E0973,
                    "a rank's thread panicked".to_string(),
                )),
            }
        }
        let code = |f: &Failure| match f {
            Failure::Message(c, _) => Some(*c),
            _ => None,
        };
        match ranks::root_cause(errors, code) {
            Some(e) => Err(e),
            None => done.map(Some).ok_or(Failure::Reported),
        }
    })
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
    /// What the tuning knowledge base changed, when it changed anything.
    tuning: Option<&'a str>,
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
        tuning,
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
    let mut history: Vec<StepMetrics> = Vec::new();
    let mut written = Vec::new();
    let tokens = trainer.state().batch as f64 * f64::from(grad_accum);
    while trainer.state().step < args.steps {
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
    for line in recompute.lines() {
        text.push_str(&line);
        text.push('\n');
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
        "written": written,
        "notes": notes,
    });
    Ok((text, json))
}

/// The train of a source that checked, or `None` (its errors are reported later).
fn checked_train<'c>(
    args: &TrainArgs,
    checked: &'c Checked,
    reporter: &Reporter,
) -> Result<Option<&'c Train>, Failure> {
    if checked.has_errors() {
        return Ok(None);
    }
    choose_train(checked, args.entry.as_deref())
        .map(Some)
        .map_err(|d| {
            reporter.emit(&[*d], &checked.sources);
            Failure::Reported
        })
}

/// Into how many replicas' slices the `started` ranks (`--ranks` or `--mpi`) split each batch:
/// the `parallel` policy's data-parallel size, once the ranks are checked against its device
/// count (E0970); 1 on one device (whatever the policy).
fn batch_split(
    args: &TrainArgs,
    started: Option<(usize, &str)>,
    checked: &Checked,
    reporter: &Reporter,
) -> Result<usize, Failure> {
    let (Some((world, launcher)), Some(train)) = (started, checked_train(args, checked, reporter)?)
    else {
        return Ok(1);
    };
    let policy = train.parallel.map(|i| &checked.decls.parallels[i]);
    ranks::check_world(policy.map_or(1, |p| p.devices), world, launcher)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    Ok(policy.map_or(1, |p| p.data_parallel_size().max(1) as usize))
}

/// How the `started` ranks run the train's plan (one device when none were, whatever the
/// plan); E0972 for what is planned but not run, and for what a tensor-parallel rank cannot do
/// alone (initialise, resume or dump gradients of split weights).
fn rank_layout(
    args: &TrainArgs,
    started: Option<(usize, &str)>,
    checked: &Checked,
    reporter: &Reporter,
) -> Result<RankLayout, Failure> {
    let one = RankLayout {
        dp: 1,
        tp: 1,
        splits: Default::default(),
    };
    let (Some((world, launcher)), Some(train)) = (started, checked_train(args, checked, reporter)?)
    else {
        return Ok(one);
    };
    let plan = plan_train(checked, train).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    let layout = ranks::layout(plan.as_ref(), world, launcher)
        .map_err(|e| Failure::Message(e.code, e.message))?;
    let whole = [
        (args.init_seed.is_some(), "--init-seed"),
        (args.resume.is_some(), "--resume"),
        (args.dump_grads.is_some(), "--dump-grads"),
    ];
    if let (true, Some((_, flag))) = (layout.tp > 1, whole.iter().find(|(given, _)| *given)) {
        return Err(Failure::Message(
            Code::E0972,
            format!(
                "{flag} is not run tensor parallel yet (split weights); give the whole weights \
                 with --weights"
            ),
        ));
    }
    Ok(layout)
}

/// The model dim to set to the micro-batch size of one of `replicas` ([`micro_batch_dim`]);
/// nothing for a source that did not check (its errors come later).
fn micro_batch_override(
    args: &TrainArgs,
    checked: &Checked,
    reporter: &Reporter,
    replicas: usize,
) -> Result<Option<(String, i64)>, Failure> {
    let Some(train) = checked_train(args, checked, reporter)? else {
        return Ok(None);
    };
    let emit = |d: Box<mslc_core::diag::Diagnostic>| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    };
    match train.model.and_then(|m| checked.models.get(m)) {
        Some(model) => {
            micro_batch_dim(train, model, &args.model.dims, replicas as i64).map_err(emit)
        }
        None => Ok(None),
    }
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
