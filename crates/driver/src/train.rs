//! The training step as one compiled module: the train's model with its labels and loss,
//! the backward graph of the loss for every trainable parameter, the global gradient norm (and
//! `clip_grad_norm`'s scaling), and the optimizer's update — all in one graph, run through the
//! normal passes and planned in one arena.
//!
//! The module's interface, by name (docs/mir-format.md, "Training modules"):
//! - inputs: the model's inputs and the train's labels; the scalars [`LR`] (this update's
//!   learning rate, after the schedule) and, for Adam, [`STEP_SIZE`] (`lr / (1 − β1^t)`) and
//!   [`BC2_SQRT`] (`√(1 − β2^t)`), which the training loop computes in f64 each update; and one
//!   input per optimizer state, named `PATH.momentum_buffer` (SGD with momentum) or
//!   `PATH.exp_avg` and `PATH.exp_avg_sq` (Adam), as `torch.optim` names them; with loss
//!   scaling, [`LOSS_SCALE`], the scale this step multiplies its loss by;
//! - outputs: [`LOSS`] (unscaled), [`GRAD_NORM`] (the global 2-norm of the unscaled gradients
//!   before clipping), [`OVERFLOW`] when a step with a non-finite gradient is to be skipped, with
//!   [`TrainOptions::expose_grads`] `grad.PATH` (the unscaled gradient), then the new value of
//!   every state input under the input's name and of every trained parameter under its path.
//!   The loop writes those back ([`write_backs`]) before the next step, unless it skips the
//!   update; weight decay, momentum and bias correction follow `torch.optim.SGD` (dampening 0),
//!   `Adam` and `AdamW` exactly.
//!
//! Mixed precision (MindSpore's O1–O3, [`mslc_ir::passes::Amp`]) is applied to the forward graph
//! before it is differentiated: each parameter is cast to the compute type once, and the
//! backward reads that cast value (it never casts again) and differentiates the cast itself,
//! whose gradient is the cotangent cast back to f32. So the gradients, the norm and the
//! optimizer work on the f32 master parameters and f32 states, and the passes after autodiff
//! place no further casts.
//!
//! The graph is in training mode ([`crate::train_mode`]): live dropout reading the input
//! [`crate::train_mode::SEED`], and BatchNorm with batch statistics, whose new running
//! statistics are outputs named by the buffers' paths ([`CompiledTrain::buffers`]).
//!
//! Gradient accumulation (`grad_accum` = k > 1), PyTorch's recipe: the module differentiates
//! `loss / k` of one micro-batch and adds the input `PATH.grad_accum` (the sum over the earlier
//! micro-batches of the update, zero for the first) to each gradient, outputting the sum under
//! the same name; the norm, clipping and update use that sum. The loop runs the module once per
//! micro-batch — all but the last only as far as the loss, the sums and the running statistics
//! need — and keeps only the sums (and running statistics) of all but the last run, whose
//! update it writes back ([`CompiledTrain::accumulators`]). Under data parallelism (below
//! optimizer-shard level 2) the update all-reduces the sums, once per update, instead of each
//! micro-batch's gradients.

use std::collections::BTreeMap;
use std::time::Instant;

use mslc_check::decls::Train;
use mslc_check::policy::{Optimizer, OptimizerKind};
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_core::precision::{AmpLevel, LossScale};
use mslc_core::program::{Init, Model};
use mslc_ir::passes::training_forward_pipeline;
use mslc_ir::shard::data::{all_reduce_each, replica_loss};
use mslc_ir::shard::pipeline::{Crossing, StageCut};
use mslc_ir::shard::sequence::sequence_parallel;
use mslc_ir::shard::tensor::{tensor_parallel, SplitParams};
use mslc_ir::shard::zero::{self, ZeroShard, DP_INDEX};
use mslc_ir::shard::{Group, ShardError};
use mslc_ir::{Graph, NodeKind, ValueRef};

use crate::compile::{
    lower_verified, optimize_graph, CompileError, CompileOptions, Compiled, UpdatePlacement,
};
use crate::loss_scale::LossScaler;
use crate::ranks::PipelineLayout;
use crate::recompute::{plan_training, MemoryRequest, RecomputeReport};
use crate::select::{amp_config, choose_policy, compile_options, root_error, Selection};

/// Output: the loss of the step.
pub const LOSS: &str = "loss";
/// Output: the global 2-norm of the gradients, before clipping.
pub const GRAD_NORM: &str = "grad_norm";
pub use mslc_artifact::training::{BC2_SQRT, LOSS_SCALE, LR, SCALAR_INPUTS, STEP_SIZE};
/// Output (when the loss scaling skips overflowing steps): 0 when every unscaled gradient is
/// finite, NaN otherwise — the sum over all gradients of `sum(g · 0)`.
pub const OVERFLOW: &str = "overflow";
/// Prefix of the outputs holding the gradients ([`TrainOptions::expose_grads`]).
pub const GRAD_PREFIX: &str = "grad.";
/// Suffix of the gradient accumulators' inputs and outputs (`PATH.grad_accum`).
pub const ACCUM_SUFFIX: &str = ".grad_accum";

/// How to build a training module beyond the forward's options.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrainOptions {
    /// Also output each parameter's unscaled gradient as `grad.PATH` (for `--dump-grads`).
    pub expose_grads: bool,
    /// The loss scaling the step is built for ([`train_compile_options`] chooses it).
    pub loss_scale: LossScaler,
    /// The train's memory policy ([`MemoryRequest::of_train`]): what to recompute, and the
    /// budget the step must fit.
    pub memory: Option<MemoryRequest>,
    /// Data-parallel replicas (0 or 1: one device). Above 1 the step is the per-rank program
    /// of one replica: its loss weighed by its share of the batch, and every gradient summed
    /// over the mesh axis [`DATA_AXIS`] before clipping and the optimizer
    /// ([`mslc_ir::shard`]).
    pub data_parallel: usize,
    /// MindSpore's `optimizer_shard` level (0–3) over the data-parallel replicas
    /// ([`mslc_ir::shard::zero`]); ignored on one replica.
    pub optimizer_shard: u8,
}

/// The mesh axis the data-parallel replicas of a per-rank training step form.
pub const DATA_AXIS: &str = "dp";
/// The mesh axis the ranks of a tensor-parallel group form.
pub const TENSOR_AXIS: &str = "tp";
/// The mesh axis the stages of a pipeline form.
pub const PIPELINE_AXIS: &str = "pp";

/// One trained parameter and its optimizer states.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainedParam {
    /// The parameter's path.
    pub path: String,
    /// Its weight decay (0 when a `no_decay` pattern matches it).
    pub weight_decay: f64,
    /// Its state inputs' names, in the order of [`state_names`].
    pub states: Vec<String>,
}

/// A compiled training step and what the loop needs to drive it.
#[derive(Clone, Debug)]
pub struct CompiledTrain {
    /// The compiled module.
    pub compiled: Compiled,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Trained parameters, by path.
    pub params: Vec<TrainedParam>,
    /// Its loss scaling.
    pub loss_scale: LossScaler,
    /// Micro-batches per update (`grad_accum`).
    pub grad_accum: u32,
    /// Gradient accumulators (`PATH.grad_accum`, inputs and outputs) when `grad_accum` > 1.
    pub accumulators: Vec<String>,
    /// Buffers the step updates (BatchNorm's running statistics), written back after every run.
    pub buffers: Vec<String>,
    /// What is recomputed, and the step's memory.
    pub recompute: RecomputeReport,
    /// How the trained tensors are sliced over the data-parallel group (optimizer sharding),
    /// when they are: the states (and at level 3 the parameters) are this rank's slices.
    pub zero: Option<ZeroShard>,
}

/// The optimizer-state names of parameter `path` (`torch.optim`'s state keys).
pub fn state_names(optimizer: &Optimizer, path: &str) -> Vec<String> {
    let keys: &[&str] = match optimizer.kind {
        OptimizerKind::Sgd if optimizer.momentum > 0.0 => &["momentum_buffer"],
        OptimizerKind::Sgd => &[],
        OptimizerKind::Adam | OptimizerKind::AdamW => &["exp_avg", "exp_avg_sq"],
    };
    keys.iter().map(|k| format!("{path}.{k}")).collect()
}

/// The values a training step writes back: (state input or parameter path, output name) —
/// the same name on both sides.
pub fn write_backs(params: &[TrainedParam]) -> impl Iterator<Item = &str> {
    params
        .iter()
        .flat_map(|p| p.states.iter().map(String::as_str).chain([p.path.as_str()]))
}

/// Where a training step computes its next values: in place and, under a loss scaling that
/// skips a step whose gradients overflow, behind the guard of that check ([`OVERFLOW`]), which
/// ends a skipped step's run before the update of `trained`. A pipeline stage's step, which
/// updates nothing (its update is a program of its own), keeps all it computes.
fn update_placement(train_options: &TrainOptions, trained: &[TrainedParam]) -> UpdatePlacement {
    if !train_options.loss_scale.skips_overflow() || trained.is_empty() {
        return UpdatePlacement::InPlace;
    }
    UpdatePlacement::InPlaceUnless {
        flag: OVERFLOW.to_string(),
        updates: write_backs(trained).map(String::from).collect(),
    }
}

/// Why a train cannot be compiled: a problem of the train (coded diagnostic) or a compiler
/// failure after a clean check.
#[derive(Debug)]
pub enum TrainError {
    /// The train cannot be trained as written.
    Train(Box<Diagnostic>),
    /// A stage failed.
    Compile(CompileError),
}

impl From<CompileError> for TrainError {
    fn from(e: CompileError) -> Self {
        TrainError::Compile(e)
    }
}

impl TrainError {
    /// The error as a diagnostic: the train's own, or a compiler failure on the root file of
    /// `checked` ([`CompileError::diagnostic`]).
    pub fn diagnostic(self, checked: &Checked) -> Box<Diagnostic> {
        match self {
            TrainError::Train(d) => d,
            TrainError::Compile(e) => e.diagnostic(checked),
        }
    }
}

/// The train to run: the one called `entry`, else the file's only `train` declaration.
pub fn choose_train<'a>(
    checked: &'a Checked,
    entry: Option<&str>,
) -> Result<&'a Train, Box<Diagnostic>> {
    let trains = &checked.decls.trains;
    let names: Vec<&str> = trains.iter().map(|t| t.spec.name.name.as_str()).collect();
    let found = match (entry, trains.as_slice()) {
        (Some(e), _) => trains.iter().find(|t| t.spec.name.name == e),
        (None, [only]) => Some(only),
        (None, _) => None,
    };
    found.ok_or_else(|| {
        let (message, help) = match (entry, names.is_empty()) {
            (_, true) => (
                "this file declares no `train`".to_string(),
                "declare one with `train Name for Model { … }`".to_string(),
            ),
            (Some(e), false) => (
                format!("--entry {e}: no train `{e}` in this file"),
                format!("trains here: {}", names.join(", ")),
            ),
            (None, false) => (
                "this file declares several trains".to_string(),
                format!("choose one with --entry: {}", names.join(", ")),
            ),
        };
        root_error(checked, Code::E0611, message, help)
    })
}

/// The parts besides `grad_accum` that `train`'s batch splits into per update under its
/// parallel policy: data-parallel replicas × pipeline micro-batches (1 without a policy).
pub fn batch_parts(checked: &Checked, train: &Train) -> i64 {
    train
        .parallel
        .map_or(1, |p| checked.decls.parallels[p].batch_parts())
}

/// The dim override a step of `train` needs so that it takes one micro-batch on one device:
/// the model's batch dim (the first dim of its first input) set to `batch / (grad_accum ×
/// replicas)` samples (the train's `batch` counts an update's samples, `B × dp ×
/// micro-batches`; `replicas` is 1 on one device, the data-parallel degree per rank). `None` when `given` (the `--dim` overrides) already sets that dim, when the model
/// already has that size, or when its first input does not start with a named dim. A `batch`
/// that `grad_accum` does not divide is refused (E0651).
pub fn micro_batch_dim(
    train: &Train,
    model: &Model,
    given: &[(String, String)],
    replicas: i64,
) -> Result<Option<(String, i64)>, Box<Diagnostic>> {
    let Some(dim) = model.batch_dim().map(str::to_string) else {
        return Ok(None);
    };
    if given.iter().any(|(d, _)| *d == dim) {
        return Ok(None);
    }
    let spec = &train.spec;
    let k = spec.grad_accum.max(1).saturating_mul(replicas.max(1));
    if spec.batch < 1 || spec.batch % k != 0 {
        return Err(Box::new(
            Diagnostic::error(
                Code::E0651,
                spec.file,
                spec.batch_span,
                match replicas > 1 {
                    false => format!(
                        "batch = {} does not split into grad_accum = {k} micro-batches",
                        spec.batch
                    ),
                    true => format!(
                        "batch = {} does not split into {k} micro-batches (grad_accum = {} × \
                         {replicas} data-parallel replicas)",
                        spec.batch,
                        spec.grad_accum.max(1),
                    ),
                },
            )
            .with_label("samples per update")
            .with_help(format!(
                "make `batch` a multiple of {k}, or set the micro-batch with --dim {dim}=N"
            )),
        ));
    }
    let size = spec.batch / k;
    Ok((!model.dims.contains(&(dim.clone(), size))).then_some((dim, size)))
}

/// The train as its steps run `model` (checked with the `--dim` overrides `given`): when
/// `given` sets the model's batch dim to a size whose micro-batches — `grad_accum` of them on
/// each of `replicas` (data-parallel replicas × pipeline micro-batches) — do not add up to
/// `batch`, each update takes those samples instead, so the train comes back with that `batch`
/// (the one its plan must count) and a W0015 saying so; otherwise the train as declared.
pub fn train_as_run<'t>(
    train: &'t Train,
    model: &Model,
    given: &[(String, String)],
    replicas: i64,
) -> (std::borrow::Cow<'t, Train>, Option<Diagnostic>) {
    let unchanged = (std::borrow::Cow::Borrowed(train), None);
    let Some(dim) = model
        .batch_dim()
        .filter(|d| given.iter().any(|(g, _)| g == d))
    else {
        return unchanged;
    };
    let Some(&(_, size)) = model.dims.iter().find(|(d, _)| *d == dim) else {
        return unchanged;
    };
    let spec = &train.spec;
    let accum = spec.grad_accum.max(1);
    let taken = size.saturating_mul(accum).saturating_mul(replicas.max(1));
    if taken == spec.batch {
        return unchanged;
    }
    let parts = match replicas > 1 {
        false => format!("grad_accum {accum}"),
        true => format!("grad_accum {accum} × {replicas} replicas and micro-batches"),
    };
    let warning = Diagnostic::warning(
        Code::W0015,
        spec.file,
        spec.batch_span,
        format!(
            "with --dim {dim}={size} an update takes {dim} × {parts} = {taken} samples, not the \
             train's batch of {}",
            spec.batch
        ),
    )
    .with_label(format!("{} declared", spec.batch))
    .with_help(format!(
        "leave `--dim {dim}` out and mslc sets {dim} to {} itself",
        match replicas > 1 {
            false => "batch / grad_accum".to_string(),
            true => format!("batch / (grad_accum × {replicas})"),
        }
    ));
    let mut run = train.clone();
    run.spec.batch = taken;
    (std::borrow::Cow::Owned(run), Some(warning))
}

/// How to compile the training step of `train` (whose model, labels and loss are `model`): the
/// target and fusion as for any model ([`compile_options`]), and the mixed precision and loss
/// scaling of the selected policy (`--precision NAME`; none for `--precision f32`), else of the
/// train's own `precision`. At O0 nothing is cast and the loss is not scaled (the checker warns
/// that a `loss_scale` there has no effect).
pub fn train_compile_options(
    checked: &Checked,
    train: &Train,
    model: &Model,
    selection: Selection,
) -> Result<(CompileOptions, LossScaler), Box<Diagnostic>> {
    let policy = match selection.precision {
        Some(name) => choose_policy(checked, model, Some(name))?,
        None => train.precision.map(|i| &checked.decls.precisions[i]),
    };
    let mut options = compile_options(
        checked,
        model,
        Selection {
            precision: Some("f32"),
            ..selection
        },
    )?;
    options.amp = policy.map(amp_config);
    let loss_scale = policy
        .filter(|p| p.level != AmpLevel::O0)
        .map_or(LossScale::None, |p| p.loss_scale);
    Ok((options, LossScaler(loss_scale)))
}

/// Compiles `train`'s training step.
pub fn compile_train(
    train: &Train,
    options: &CompileOptions,
    train_options: TrainOptions,
) -> Result<CompiledTrain, TrainError> {
    compile_train_ranked(train, options, train_options, None)
}

/// How one rank of a tensor-parallel group splits a forward graph: the parameters it splits
/// (path → dim), the group of ranks it splits them over, and whether the ops between the
/// layers' matmuls run on its block of the sequence too (Megatron's sequence parallelism).
#[derive(Clone, Copy, Debug)]
pub struct TensorSplits<'a> {
    /// Split parameters, path → dim.
    pub splits: &'a BTreeMap<String, usize>,
    /// The tensor-parallel group.
    pub group: &'a Group,
    /// Whether the plan asks for sequence parallelism.
    pub sequence_parallel: bool,
}

impl TensorSplits<'_> {
    /// Rewrites `graph` into this rank's program: [`tensor_parallel`], or
    /// [`sequence_parallel`] when the plan asks for it; the parameters split.
    pub fn apply(&self, graph: &mut Graph) -> Result<SplitParams, ShardError> {
        match self.sequence_parallel {
            true => sequence_parallel(graph, self.splits, self.group),
            false => tensor_parallel(graph, self.splits, self.group),
        }
    }
}

/// [`compile_train`] for one rank of a tensor-parallel group when `tensor` is given: the
/// forward is split by Megatron's rewrite ([`TensorSplits::apply`]: [`tensor_parallel`], with
/// [`sequence_parallel`] when the plan asks) before it is differentiated,
/// and the gradients' global norm (and overflow check) sums the split parameters' shares over
/// the group.
pub fn compile_train_ranked(
    train: &Train,
    options: &CompileOptions,
    train_options: TrainOptions,
    tensor: Option<TensorSplits>,
) -> Result<CompiledTrain, TrainError> {
    compile_train_step(train, options, train_options, tensor, None).map(|(step, _)| step)
}

/// What a pipeline stage's training step exchanges and runs besides its step: the cut
/// ([`StageCut`]) and, on every stage but the last, the forward program that computes what it
/// sends on (the step itself recomputes that forward before its backward). The step's inputs
/// and outputs beyond a whole step's: each received value (an input under its crossing's
/// name) and its gradient (the output [`grad_of`] that name, sent back); on every stage but
/// the last, the gradient of each value it sends, from the stage that read it (the input
/// [`grad_from`] the name and that stage).
#[derive(Clone, Debug)]
pub struct StageStep {
    /// What crosses the stage's cuts.
    pub cut: StageCut,
    /// The forward to the values it sends (none on the last stage).
    pub forward: Option<Compiled>,
    /// The update of its parameters from the sums of their gradients (the step's outputs
    /// [`accumulator`] of each path), with the global norm over all stages.
    pub update: CompiledTrain,
}

impl StageStep {
    /// The memory plans of the programs a stage runs beside its step: its forward (but on the
    /// last stage) and its update.
    pub fn programs(&self) -> impl Iterator<Item = &mslc_plan::memory::MemoryPlan> {
        let forward = self.forward.as_ref().map(|f| &f.memory);
        forward.into_iter().chain([&self.update.compiled.memory])
    }

    /// The inputs of the stage's step that other stages send (received values and the
    /// gradients of sent ones), not data.
    pub fn exchanged_inputs(&self) -> Vec<String> {
        let received = self.cut.receives.iter().map(|c| c.name.clone());
        let gradients = self.cut.sends.iter().map(|c| grad_from(&c.name, c.peer));
        received.chain(gradients).collect()
    }
}

/// A pipeline stage's training graph while it is built: its cut, its forward program, the
/// values it sends and those it receives (name → value in the graph).
struct Staged {
    cut: StageCut,
    /// The forward to the values the stage sends (none on the last), compiled once the
    /// optimizer sharding is known.
    forward: Option<Graph>,
    sends: Vec<(String, ValueRef)>,
    received: Vec<(String, ValueRef)>,
}

impl Staged {
    /// Whether this is the last stage, the one with the loss.
    fn is_last(&self) -> bool {
        self.cut.outputs.iter().any(|o| o == LOSS)
    }
}

/// The output holding the gradient of received value `name`.
pub fn grad_of(name: &str) -> String {
    format!("{name}.grad")
}

/// The input holding the gradient of sent value `name` from the stage `peer` that read it.
pub fn grad_from(name: &str, peer: usize) -> String {
    format!("{name}.grad.from{peer}")
}

/// Output of a stage but the last: the scalar it differentiates, `Σ sum(y ⊙ dy)` over what
/// it sends (its "loss" for the memory planner).
pub const STAGE_OBJECTIVE: &str = "pipeline.objective";

/// [`compile_train_ranked`] for stage `stage` of `pipeline`: the train's graph (in training mode,
/// so every dropout keeps its place among all of the model's) cut to the stage's layers
/// ([`pipeline_stage`]); the last stage differentiates the loss of one micro-batch divided by
/// the micro-batches of an update (`micro_batches × grad_accum`, accumulated as
/// `grad_accum` is), the others `Σ sum(y ⊙ dy)` over the values they send, whose gradients
/// `dy` come back from the stages that read them. The step only sums its parameters'
/// gradients; [`StageStep::update`] updates them, with the gradients' global norm (for
/// `clip_grad_norm`) and overflow check (for a loss scale that skips overflowing steps) summed
/// over all stages. The new running statistics of the stage's BatchNorms are outputs of its
/// forward program (of the step on the last stage, which has no forward), and a weight other
/// stages read too (a tied one) is summed with theirs ([`StageCut::shared`]).
pub fn compile_train_stage(
    train: &Train,
    options: &CompileOptions,
    train_options: TrainOptions,
    tensor: Option<TensorSplits>,
    (pipeline, stage): (&PipelineLayout, usize),
) -> Result<(CompiledTrain, StageStep), TrainError> {
    let (step, parts) = compile_train_step(
        train,
        options,
        train_options,
        tensor,
        Some((pipeline, stage)),
    )?;
    Ok((step, parts.expect("a stage's step has its cut")))
}

fn compile_train_step(
    train: &Train,
    options: &CompileOptions,
    train_options: TrainOptions,
    tensor: Option<TensorSplits>,
    stage: Option<(&PipelineLayout, usize)>,
) -> Result<(CompiledTrain, Option<StageStep>), TrainError> {
    let spec = &train.spec;
    let refuse = |code: Code, message: String, help: &str| {
        TrainError::Train(Box::new(
            Diagnostic::error(code, spec.file, spec.name.span, message)
                .with_label("this train")
                .with_help(help),
        ))
    };
    let (Some(model), Some(optimizer)) = (train.graph.as_ref(), spec.optimizer) else {
        return Err(refuse(
            Code::E0608,
            format!(
                "train `{}` has no checked loss or optimizer",
                spec.name.name
            ),
            "fix the errors `mslc check` reports first",
        ));
    };
    let grad_accum = u32::try_from(spec.grad_accum.max(1)).map_err(|_| {
        refuse(
            Code::E0651,
            format!("grad_accum = {} is too large", spec.grad_accum),
            "accumulate fewer micro-batches",
        )
    })?;
    let t = Instant::now();
    let mut graph = lower_verified(model, options)?;
    let cx = options.pass_context();
    let forward_passes = training_forward_pipeline(&cx)
        .run(&mut graph, &cx)
        .map_err(|e| CompileError {
            stage: "passes",
            message: e.to_string(),
        })?;
    let loss = graph
        .outputs
        .iter()
        .find(|(name, _)| name == LOSS)
        .map(|(_, v)| *v)
        .ok_or_else(|| CompileError {
            stage: "lower",
            message: "the training graph has no `loss` output".to_string(),
        })?;
    if let Some(tensor) = tensor {
        let how = match tensor.sequence_parallel {
            true => "tensor and sequence parallel",
            false => "tensor parallel",
        };
        tensor.apply(&mut graph).map_err(|e| {
            refuse(
                Code::E0972,
                format!("train `{}` cannot run {how}: {e}", spec.name.name),
                "split only the q/k/v/o and MLP projections of the layers (Megatron's pattern)",
            )
        })?;
    }
    let loss = graph
        .outputs
        .iter()
        .find(|(name, _)| name == LOSS)
        .map_or(loss, |(_, v)| *v);
    graph.outputs.clear();
    let mode = crate::train_mode::apply(&mut graph).map_err(|e| {
        refuse(
            Code::E0650,
            format!("`{}` cannot run in training mode: {}", e.origin, e.message),
            "give batch_norm its running statistics as `buffer`s (std.nn.BatchNorm2d does)",
        )
    })?;
    // Whole-update operations need every stage's gradients at once: not run on stages.
    let mut staged = match stage {
        Some((pipeline, s)) => {
            // The running statistics are outputs of the stage whose BatchNorm makes them.
            graph.outputs = std::iter::once((LOSS.to_string(), loss))
                .chain(mode.running.iter().cloned())
                .collect();
            let cut = crate::ranks::cut_to_stage(&mut graph, pipeline, s).map_err(|e| {
                refuse(
                    Code::E0972,
                    format!(
                        "train `{}` cannot be cut into the plan's pipeline stages: {e}",
                        spec.name.name
                    ),
                    "give each stage whole layers of the model's repeated `layers`",
                )
            })?;
            let sends: Vec<(String, ValueRef)> = graph
                .outputs
                .iter()
                .filter(|(name, _)| cut.sends.iter().any(|c| c.name == *name))
                .cloned()
                .collect();
            // A stage before the last updates its running statistics in its forward (once per
            // micro-batch: its step recomputes that forward).
            let forward = (s + 1 < pipeline.layers.len()).then(|| {
                let mut forward = graph.clone();
                forward.outputs.retain(|(name, _)| name != LOSS);
                forward
            });
            graph.outputs.clear();
            let received: Vec<(String, ValueRef)> = cut
                .receives
                .iter()
                .filter_map(|c| {
                    graph
                        .node_ids()
                        .into_iter()
                        .find_map(|id| match &graph.node(id).kind {
                            NodeKind::Input { name } if *name == c.name => {
                                Some((c.name.clone(), ValueRef { node: id, index: 0 }))
                            }
                            _ => None,
                        })
                })
                .collect();
            Some(Staged {
                cut,
                forward,
                sends,
                received,
            })
        }
        None => None,
    };
    let mut params: Vec<(String, ValueRef)> = graph
        .node_ids()
        .into_iter()
        .filter_map(|id| match &graph.node(id).kind {
            NodeKind::Param {
                path,
                trainable: true,
                ..
            } => Some((path.clone(), ValueRef { node: id, index: 0 })),
            _ => None,
        })
        .collect();
    params.sort();
    if params.is_empty() {
        return Err(refuse(
            Code::E0520,
            format!("train `{}` has no trainable parameter", spec.name.name),
            "declare the weights with `param` (a `buffer` is not trained)",
        ));
    }
    let wrt: Vec<ValueRef> = params.iter().map(|(_, v)| *v).collect();
    let group = (train_options.data_parallel > 1).then(|| Group {
        axis: DATA_AXIS.to_string(),
        ranks: train_options.data_parallel,
    });
    let shard_error = |e: mslc_ir::shard::ShardError| CompileError {
        stage: "train",
        message: e.to_string(),
    };
    let zero = match &group {
        Some(g) if train_options.optimizer_shard > 0 => Some(ZeroShard {
            level: train_options.optimizer_shard.min(3),
            group: g.clone(),
            shapes: params
                .iter()
                .map(|(path, v)| {
                    let shape = graph.ty(*v).shape.iter().map(|&d| d.max(0) as usize);
                    (path.clone(), shape.collect())
                })
                .collect(),
        }),
        _ => None,
    };
    // Level 3: each parameter is this rank's slice, gathered where it is read — in the
    // stage's forward too, which runs on the same parameters (a clone: the same node ids).
    let sharded = match &zero {
        Some(z) if z.shards_params() => {
            if let Some(forward) = staged.as_mut().and_then(|st| st.forward.as_mut()) {
                zero::shard_params(forward, &params, &z.group).map_err(shard_error)?;
            }
            zero::shard_params(&mut graph, &params, &z.group).map_err(shard_error)?
        }
        _ => Vec::new(),
    };
    // The casts are placed (before the cut and the backward): the passes that follow, on the
    // stage's forward and on the step, must not cast again.
    let whole = CompileOptions {
        amp: None,
        updates: UpdatePlacement::InPlace,
        ..options.clone()
    };
    let stage_forward = match staged.as_mut().and_then(|st| st.forward.take()) {
        Some(forward) => Some(crate::compile::compile_graph(forward, &whole)?),
        None => None,
    };
    // A replica differentiates its share of the global loss and reports the global loss.
    let sends_only = staged.as_ref().is_some_and(|st| !st.is_last());
    let (share, loss) = match &group {
        Some(g) if !sends_only => {
            let r = replica_loss(&mut graph, loss, g).map_err(|e| {
                refuse(
                    Code::E0971,
                    format!("train `{}` cannot run data parallel: {e}", spec.name.name),
                    "write the loss as a cross_entropy, or as mse_loss or mean terms added together",
                )
            })?;
            (r.share, r.global)
        }
        _ => (loss, loss),
    };
    // PyTorch's accumulation recipe differentiates `loss / grad_accum`; loss scaling then
    // multiplies that by the scale.
    let scalar = TensorType::new(DType::F32, vec![]);
    let scale = train_options
        .loss_scale
        .scales()
        .then(|| graph.add_input(LOSS_SCALE, scalar));
    // A stage but the last: the values it sends, each against its gradient from its reader.
    let stage_objective = match &staged {
        Some(st) if !st.is_last() => {
            let mut b = Builder::on(&mut graph);
            let objective = b
                .stage_objective(&st.cut.sends, &st.sends)
                .map_err(|message| CompileError {
                    stage: "train",
                    message,
                })?;
            Some(objective)
        }
        _ => None,
    };
    // A stage's update sums the gradients of the pipeline's micro-batches too.
    let grad_accum = match stage {
        Some((pipeline, _)) => grad_accum.saturating_mul(pipeline.micro_batches as u32),
        None => grad_accum,
    };
    let objective = match stage_objective {
        Some(objective) => objective,
        None => {
            let mut b = Builder::on(&mut graph);
            let mut objective = share;
            if grad_accum > 1 {
                let k = b.scalar(f64::from(grad_accum));
                objective = k
                    .and_then(|k| b.bin(Op::Div, objective, k))
                    .map_err(|message| CompileError {
                        stage: "train",
                        message,
                    })?;
            }
            if let Some(s) = scale {
                objective = b
                    .bin(Op::Mul, objective, s)
                    .map_err(|message| CompileError {
                        stage: "train",
                        message,
                    })?;
            }
            objective
        }
    };
    let forward: std::collections::HashSet<_> = graph.node_ids().into_iter().collect();
    // A stage differentiates what it received too, to send those gradients back.
    let received = staged.as_ref().map_or(&[][..], |st| &st.received[..]);
    let wrt: Vec<ValueRef> = wrt
        .iter()
        .copied()
        .chain(received.iter().map(|(_, v)| *v))
        .collect();
    let mut grads = mslc_ir::autodiff::backward(&mut graph, objective, &wrt).map_err(|e| {
        refuse(
            Code::E0521,
            format!("cannot differentiate train `{}`: {e}", spec.name.name),
            "every trainable parameter needs a differentiable path to the loss",
        )
    })?;
    for ((name, _), g) in received.iter().zip(grads.split_off(params.len())) {
        graph.set_output(&grad_of(name), g);
    }
    // A stage's step only sums its gradients; its update is a program of its own.
    let accumulate = grad_accum > 1 || staged.is_some();
    // Level 3's gradients are already slices (the gathers' gradients reduce-scatter them);
    // level 2 reduce-scatters them; below that they are summed whole — once per update when
    // micro-batches accumulate them (MindSpore's accumulation, DDP's `no_sync`): each rank
    // sums its own, and the update all-reduces the sums.
    let mut all_reduce_sums = None;
    let grads = match (&group, zero.as_ref().map(|z| z.level)) {
        (Some(g), Some(3)) => {
            zero::regather_in_backward(&mut graph, &sharded, &forward, g).map_err(shard_error)?;
            grads
        }
        (Some(g), Some(2)) => grads
            .iter()
            .map(|&d| zero::scatter_grad(&mut graph, d, g))
            .collect::<Result<_, _>>()
            .map_err(shard_error)?,
        (Some(g), _) if accumulate => {
            all_reduce_sums = Some(g);
            grads
        }
        (Some(g), _) => all_reduce_each(&mut graph, &grads, g).map_err(shard_error)?,
        (None, _) => grads,
    };
    let split: Vec<bool> = params
        .iter()
        .map(|(path, _)| tensor.is_some_and(|t| t.splits.contains_key(path)))
        .collect();
    let mut b = Builder {
        g: &mut graph,
        tensor: tensor.map(|t| (t.group, split.clone())),
        zero: zero.as_ref(),
        dp_index: None,
        pipeline: None,
        all_reduce_sums,
    };
    // A stage but the last has no loss: its objective stands in for the memory planner.
    let loss_output = match &staged {
        Some(st) if !st.is_last() => {
            b.g.set_output(STAGE_OBJECTIVE, objective);
            STAGE_OBJECTIVE
        }
        _ => {
            b.g.set_output(LOSS, loss);
            LOSS
        }
    };
    let built = match &staged {
        Some(_) => b
            .unscale(&grads, scale)
            .and_then(|unscaled| b.accumulate(&params, &unscaled))
            .map(|_| Vec::new()),
        None => b.update(
            spec,
            &optimizer,
            &params,
            &grads,
            scale,
            train_options,
            accumulate,
        ),
    };
    let trained = built.map_err(|message| CompileError {
        stage: "train",
        message,
    })?;
    let update = match (&staged, stage) {
        (Some(st), Some((pipeline, this))) => {
            let tensor = tensor.map(|t| (t.group, split));
            let spec_params: Vec<(String, TensorType, Init)> = params
                .iter()
                .map(|(path, v)| {
                    let init = match &graph.node(v.node).kind {
                        NodeKind::Param { init, .. } => init.clone(),
                        _ => Init::Zeros,
                    };
                    (path.clone(), graph.ty(*v).clone(), init)
                })
                .collect();
            let stages = Group::new(PIPELINE_AXIS, pipeline.layers.len());
            // A tied weight's summed gradient counts once, on the first stage holding it.
            let counted_elsewhere = params
                .iter()
                .map(|(path, _)| {
                    st.cut
                        .shared
                        .iter()
                        .any(|p| p.path == *path && p.stages.first() != Some(&this))
                })
                .collect();
            let u = compile_stage_update(
                spec,
                &optimizer,
                &spec_params,
                options,
                train_options,
                (tensor, zero.as_ref(), all_reduce_sums),
                (&stages, counted_elsewhere),
            )?;
            Some(u)
        }
        _ => None,
    };
    // The running statistics of this stage's BatchNorms, which its step outputs on the last
    // stage and its forward on the others; all of them without stages.
    let running: Vec<(String, ValueRef)> = match &staged {
        Some(st) => mode
            .running
            .iter()
            .filter(|(path, _)| st.cut.outputs.contains(path))
            .cloned()
            .collect(),
        None => mode.running.clone(),
    };
    if staged.as_ref().is_none_or(Staged::is_last) {
        for (path, v) in &running {
            graph.set_output(path, *v);
        }
    }
    let accumulators = match accumulate {
        true => params.iter().map(|(p, _)| accumulator(p)).collect(),
        false => Vec::new(),
    };
    // Lowering, the backward and the update count as the lowering stage.
    let lower_ms = t.elapsed().as_secs_f64() * 1e3;
    let (passes, ops_before, passes_ms) = optimize_graph(&mut graph, &whole)?;
    let is_state = |name: &str| trained.iter().any(|p| p.states.iter().any(|s| s == name));
    let whole = CompileOptions {
        updates: update_placement(&train_options, &trained),
        ..whole
    };
    let (mut compiled, recompute) = plan_training(
        &graph,
        &whole,
        &passes,
        loss_output,
        &is_state,
        train_options.memory,
    )?;
    compiled.ops_before = ops_before;
    compiled.times.lower_ms = lower_ms;
    compiled.times.passes_ms = passes_ms;
    compiled.passes.prepend(forward_passes);
    let step = CompiledTrain {
        compiled,
        optimizer,
        params: update.as_ref().map_or(trained, |u| u.params.clone()),
        loss_scale: train_options.loss_scale,
        grad_accum,
        accumulators,
        buffers: running.into_iter().map(|(p, _)| p).collect(),
        recompute,
        zero,
    };
    let stage = staged.zip(update).map(|(st, update)| StageStep {
        cut: st.cut,
        forward: stage_forward,
        update,
    });
    Ok((step, stage))
}

/// How a stage's update is sharded: the tensor-parallel group (and, per parameter, whether it
/// is split over it), the optimizer sharding, and the data-parallel group its gradient sums
/// are all-reduced over.
type StageSharding<'a> = (
    Option<(&'a Group, Vec<bool>)>,
    Option<&'a ZeroShard>,
    Option<&'a Group>,
);

/// The update of a pipeline stage's parameters `params` (path, type, init) from the sums of
/// their gradients over the update's micro-batches (the inputs [`accumulator`] of each path,
/// already unscaled): the global norm (and overflow check) summed over the pipeline's
/// `stages` (and the tensor-parallel group for its split parameters), then clipping and the
/// optimizer, as a whole step's update; with a data-parallel group, the sums are first
/// all-reduced over it (each replica's micro-batches summed unreduced). A tied weight's sums
/// arrive already summed over the stages holding it; those of `counted_elsewhere` (per
/// parameter) are left out of the norm and overflow sums, which another stage counts.
#[allow(clippy::too_many_arguments)]
fn compile_stage_update(
    spec: &mslc_check::policy::TrainSpec,
    optimizer: &Optimizer,
    params: &[(String, TensorType, Init)],
    options: &CompileOptions,
    train_options: TrainOptions,
    (tensor, zero, all_reduce_sums): StageSharding<'_>,
    (stages, counted_elsewhere): (&Group, Vec<bool>),
) -> Result<CompiledTrain, TrainError> {
    let mut graph = Graph::new(format!("{}_update", spec.name.name));
    // This replica's slice of parameter `path` (of type `ty` in the step, already a slice at
    // level 3), under `level` or above.
    let slice = |path: &str, ty: &TensorType, level: u8| match zero.filter(|z| z.level >= level) {
        Some(z) => {
            let numel = z
                .shapes
                .get(path)
                .map_or(0, |s| s.iter().product::<usize>());
            TensorType::new(ty.dtype, vec![z.chunk(numel) as i64])
        }
        None => ty.clone(),
    };
    // Level 3 holds slices of the parameters; from level 2 the step sums this replica's
    // slices of the gradients.
    let values: Vec<(String, ValueRef)> = params
        .iter()
        .map(|(path, ty, init)| {
            let v = graph.add_param(path, slice(path, ty, 3), init.clone(), true);
            (path.clone(), v)
        })
        .collect();
    let grads: Vec<ValueRef> = params
        .iter()
        .map(|(path, ty, _)| graph.add_input(&accumulator(path), slice(path, ty, 2)))
        .collect();
    let mut b = Builder {
        g: &mut graph,
        tensor,
        zero,
        dp_index: None,
        pipeline: Some((stages, counted_elsewhere)),
        all_reduce_sums,
    };
    let trained = b
        .update(spec, optimizer, &values, &grads, None, train_options, false)
        .map_err(|message| CompileError {
            stage: "train",
            message,
        })?;
    let whole = CompileOptions {
        amp: None,
        updates: update_placement(&train_options, &trained),
        ..options.clone()
    };
    let (passes, ops_before, _) = optimize_graph(&mut graph, &whole)?;
    let is_state = |name: &str| trained.iter().any(|p| p.states.iter().any(|s| s == name));
    let (mut compiled, recompute) =
        plan_training(&graph, &whole, &passes, GRAD_NORM, &is_state, None)?;
    compiled.ops_before = ops_before;
    Ok(CompiledTrain {
        compiled,
        optimizer: *optimizer,
        params: trained,
        loss_scale: train_options.loss_scale,
        grad_accum: 1,
        accumulators: Vec::new(),
        buffers: Vec::new(),
        recompute,
        zero: zero.cloned(),
    })
}

/// The accumulator input and output of parameter `path`'s gradient.
pub fn accumulator(path: &str) -> String {
    format!("{path}{ACCUM_SUFFIX}")
}

/// Adds the norm, clipping and optimizer ops to a graph.
struct Builder<'g> {
    g: &'g mut Graph,
    /// The tensor-parallel group, and per parameter (in order) whether it is split over it.
    tensor: Option<(&'g Group, Vec<bool>)>,
    /// The optimizer sharding, when the update works on slices.
    zero: Option<&'g ZeroShard>,
    /// The [`DP_INDEX`] input, once a slice of a replicated tensor was selected.
    dp_index: Option<ValueRef>,
    /// A pipeline stage's update: its gradients' sums (norm, overflow) are summed over the
    /// stages, and per parameter (in order) whether another stage counts it instead (a tied
    /// weight's summed gradient is counted once, by the first stage holding it).
    pipeline: Option<(&'g Group, Vec<bool>)>,
    /// The data-parallel group that the update all-reduces the accumulated gradients over,
    /// when the micro-batches accumulate them unreduced.
    all_reduce_sums: Option<&'g Group>,
}

type Built<T> = Result<T, String>;

impl<'g> Builder<'g> {
    /// A builder of ops on `g` with no collectives.
    fn on(g: &'g mut Graph) -> Builder<'g> {
        Builder {
            g,
            tensor: None,
            zero: None,
            dp_index: None,
            pipeline: None,
            all_reduce_sums: None,
        }
    }

    /// Every output of `op` applied to `inputs`.
    fn ops(&mut self, op: Op, attrs: Attrs, inputs: &[ValueRef]) -> Built<Vec<ValueRef>> {
        self.g
            .add_op(op, attrs, inputs, "train")
            .map_err(|e| format!("{op}: {}", e.message))
    }

    fn op(&mut self, op: Op, attrs: Attrs, inputs: &[ValueRef]) -> Built<ValueRef> {
        Ok(self.ops(op, attrs, inputs)?[0])
    }

    fn bin(&mut self, op: Op, a: ValueRef, b: ValueRef) -> Built<ValueRef> {
        self.op(op, Attrs::new(), &[a, b])
    }

    fn scalar(&mut self, x: f64) -> Built<ValueRef> {
        let attrs = Attrs::new().with("value", x).with("dtype", DType::F32);
        self.op(Op::Constant, attrs, &[])
    }

    /// `Σ_g f(g)` (each `f(g)` a scalar) over the gradients of the parameters `order` lists
    /// (indices, in the order to sum); under tensor parallelism the split parameters' sum is
    /// summed over the group first (each rank holds a share of those gradients).
    fn total(
        &mut self,
        grads: &[ValueRef],
        order: &[usize],
        mut f: impl FnMut(&mut Self, ValueRef) -> Built<ValueRef>,
    ) -> Built<ValueRef> {
        let split = |b: &Self, i: usize| b.tensor.as_ref().is_some_and(|(_, s)| s[i]);
        let elsewhere = |b: &Self, i: usize| b.pipeline.as_ref().is_some_and(|(_, e)| e[i]);
        let mut totals: [Option<ValueRef>; 2] = [None, None];
        for &i in order {
            if elsewhere(self, i) {
                continue;
            }
            let s = f(self, grads[i])?;
            let slot = &mut totals[usize::from(split(self, i))];
            *slot = Some(match *slot {
                Some(t) => self.bin(Op::Add, t, s)?,
                None => s,
            });
        }
        if let (Some(shares), Some((group, _))) = (totals[1], &self.tensor) {
            let summed = self.op(Op::AllReduce, group.attrs(), &[shares])?;
            totals[1] = Some(summed);
        }
        let total = match totals {
            [Some(a), Some(b)] => self.bin(Op::Add, a, b)?,
            [Some(t), None] | [None, Some(t)] => t,
            // Every gradient of this stage is counted by another.
            [None, None] if self.pipeline.is_some() => self.scalar(0.0)?,
            [None, None] => return Err("no gradients".to_string()),
        };
        // Gradient slices (levels 2 and 3): each replica summed its own slices.
        let total = match self.zero.filter(|z| z.level >= 2) {
            Some(z) => self.op(Op::AllReduce, z.group.attrs(), &[total])?,
            None => total,
        };
        // A pipeline stage holds its own parameters' gradients.
        match self.pipeline {
            Some((stages, _)) => self.op(Op::AllReduce, stages.attrs(), &[total]),
            None => Ok(total),
        }
    }

    /// `Σ sum(y ⊙ dy)` over the values `sends` (name → value) a pipeline stage sends, `dy`
    /// each one's gradient from the stage that read it (an input [`grad_from`] the name and
    /// that stage; a value read by two stages gets the sum of both).
    fn stage_objective(
        &mut self,
        crossings: &[Crossing],
        sends: &[(String, ValueRef)],
    ) -> Built<ValueRef> {
        let mut total = None;
        for c in crossings {
            let y = sends
                .iter()
                .find(|(name, _)| *name == c.name)
                .map(|(_, v)| *v)
                .ok_or_else(|| format!("no value `{}` to send", c.name))?;
            let dy = self
                .g
                .add_input(&grad_from(&c.name, c.peer), self.g.ty(y).clone());
            let product = self.bin(Op::Mul, y, dy)?;
            let sum = self.op(Op::Sum, Attrs::new(), &[product])?;
            total = Some(match total {
                Some(t) => self.bin(Op::Add, t, sum)?,
                None => sum,
            });
        }
        total.ok_or_else(|| "a stage before the last sends nothing".to_string())
    }

    /// This rank's slice of the replicated `v` (levels 1 and 2), selected by [`DP_INDEX`].
    fn own_slice(&mut self, z: &ZeroShard, v: ValueRef) -> Built<ValueRef> {
        let index = match self.dp_index {
            Some(i) => i,
            None => {
                let i = self
                    .g
                    .add_input(DP_INDEX, TensorType::new(DType::I32, vec![]));
                self.dp_index = Some(i);
                i
            }
        };
        zero::select_slice(self.g, v, index, z.group.ranks).map_err(|e| e.to_string())
    }

    /// `grads` unscaled by the reciprocal of the loss `scale`, as MindSpore's `_grad_scale`
    /// and PyTorch's `GradScaler.unscale_` do (exact for the usual powers of two).
    fn unscale(&mut self, grads: &[ValueRef], scale: Option<ValueRef>) -> Built<Vec<ValueRef>> {
        let Some(s) = scale else {
            return Ok(grads.to_vec());
        };
        let one = self.scalar(1.0)?;
        let inverse = self.bin(Op::Div, one, s)?;
        grads
            .iter()
            .map(|&g| self.bin(Op::Mul, g, inverse))
            .collect()
    }

    /// Each gradient as the sum over the update's micro-batches so far: plus the input
    /// [`accumulator`] of its parameter, output under the same name (an overflow in an earlier
    /// micro-batch carries into the sum, so the last run sees it).
    fn accumulate(
        &mut self,
        params: &[(String, ValueRef)],
        grads: &[ValueRef],
    ) -> Built<Vec<ValueRef>> {
        let mut summed = Vec::with_capacity(grads.len());
        for ((path, _), &g) in params.iter().zip(grads) {
            let name = accumulator(path);
            let ty = self.g.ty(g).clone();
            let earlier = self.g.add_input(&name, ty);
            let sum = self.bin(Op::Add, earlier, g)?;
            self.g.set_output(&name, sum);
            summed.push(sum);
        }
        Ok(summed)
    }

    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        spec: &mslc_check::policy::TrainSpec,
        opt: &Optimizer,
        params: &[(String, ValueRef)],
        grads: &[ValueRef],
        scale: Option<ValueRef>,
        options: TrainOptions,
        accumulate: bool,
    ) -> Built<Vec<TrainedParam>> {
        let scalar = TensorType::new(DType::F32, vec![]);
        // Accumulated gradients are unscaled where each micro-batch's is added (one fused pass).
        // Otherwise f32 gradients stay scaled until the update reads them, the loss scale's
        // reciprocal folded into the update's own pass and into the sums over all gradients,
        // rather than a pass of its own over every gradient. For a power-of-two scale the
        // values are the same bits (scaling by a power of two is exact).
        let f32_grads = grads.iter().all(|&g| self.g.ty(g).dtype == DType::F32);
        let (grads, unscale_later) = match scale {
            Some(s) if !accumulate && f32_grads => {
                let one = self.scalar(1.0)?;
                (grads.to_vec(), Some(self.bin(Op::Div, one, s)?))
            }
            _ => (self.unscale(grads, scale)?, None),
        };
        let summed = match accumulate {
            true => self.accumulate(params, &grads)?,
            false => grads,
        };
        let summed = match self.all_reduce_sums {
            Some(group) => {
                let reduced = all_reduce_each(self.g, &summed, group).map_err(|e| e.0)?;
                // Named after their parameters (the sums' own origins may be inputs').
                for ((path, _), r) in params.iter().zip(&reduced) {
                    self.g.node_mut(r.node).origin = format!("{path}#grad");
                }
                reduced
            }
            None => summed,
        };
        let grads = &summed[..];
        // The sums over all gradients (the overflow check, the norm) run in the order the
        // backward produces the gradients (the reverse of the parameters' first use): the
        // schedule computes values as their consumers need them, so each layer's weight
        // gradients then run right after its backward instead of after the whole backward,
        // with every layer's activation gradients (and recomputed activations) kept until then.
        // A use's place is where a depth-first evaluation of the forward (the outputs set so
        // far) computes its node, not the node's index: a pass that rewrote the forward (the
        // fused norms) added its nodes after the whole graph.
        let roots: Vec<_> = self.g.outputs.iter().map(|(_, v)| v.node).collect();
        let position: std::collections::HashMap<_, usize> = self
            .g
            .demand_order(roots, |_| false)
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, i))
            .collect();
        let mut order: Vec<usize> = (0..grads.len()).collect();
        order.sort_by_key(|&i| {
            let consumers = self.g.consumers(params[i].1.node);
            std::cmp::Reverse(
                consumers
                    .iter()
                    .filter_map(|n| position.get(n))
                    .min()
                    .copied(),
            )
        });
        // Global 2-norm: √(Σ Σ g²), as clip_grad_norm_ computes it (of scaled gradients, times
        // the reciprocal's square). Where overflowing steps are skipped, the same pass over
        // each gradient sums g · 0 too: 0 for a finite g, NaN for an infinite or NaN one.
        let skips = options.loss_scale.skips_overflow();
        let mut checks = std::collections::HashMap::new();
        let mut total = self.total(grads, &order, |b, g| match skips {
            true => {
                let sums = b.ops(Op::SquareSumFinite, Attrs::new(), &[g])?;
                checks.insert(g, sums[1]);
                Ok(sums[0])
            }
            false => b.op(Op::SquareSum, Attrs::new(), &[g]),
        })?;
        if skips {
            let overflow = self.total(grads, &order, |_, g| {
                checks
                    .get(&g)
                    .copied()
                    .ok_or_else(|| "no overflow check".to_string())
            })?;
            self.g.set_output(OVERFLOW, overflow);
        }
        if let Some(inverse) = unscale_later {
            let square = self.bin(Op::Mul, inverse, inverse)?;
            total = self.bin(Op::Mul, total, square)?;
        }
        let norm = self.op(Op::Sqrt, Attrs::new(), &[total])?;
        self.g.set_output(GRAD_NORM, norm);
        if options.expose_grads {
            for ((path, _), &g) in params.iter().zip(grads) {
                let g = match unscale_later {
                    Some(inverse) => self.bin(Op::Mul, g, inverse)?,
                    None => g,
                };
                self.g.set_output(&format!("{GRAD_PREFIX}{path}"), g);
            }
        }
        // clip_grad_norm_: scale by min(max_norm / (norm + 1e-6), 1).
        let coef = match spec.clip_grad_norm {
            Some(max_norm) => {
                let eps = self.scalar(1e-6)?;
                let denom = self.bin(Op::Add, norm, eps)?;
                let max = self.scalar(max_norm)?;
                let ratio = self.bin(Op::Div, max, denom)?;
                let one = self.scalar(1.0)?;
                Some(self.bin(Op::Minimum, ratio, one)?)
            }
            None => None,
        };
        // What each gradient is multiplied by as the update reads it: the clipping and the
        // reciprocal of the loss scale, one scalar.
        let coef = match (coef, unscale_later) {
            (Some(c), Some(inverse)) => Some(self.bin(Op::Mul, inverse, c)?),
            (c, inverse) => c.or(inverse),
        };
        let lr = self.g.add_input(LR, scalar.clone());
        let adam = match opt.kind {
            OptimizerKind::Sgd => None,
            OptimizerKind::Adam | OptimizerKind::AdamW => Some((
                self.g.add_input(STEP_SIZE, scalar.clone()),
                self.g.add_input(BC2_SQRT, scalar.clone()),
            )),
        };
        let mut trained = Vec::new();
        for ((path, p), &g) in params.iter().zip(grads) {
            // Under optimizer sharding the update works on this rank's slices: of the whole
            // gradient at level 1, of the parameter at levels 1 and 2.
            let (p, g) = match self.zero {
                Some(z) if z.level == 1 => (self.own_slice(z, *p)?, self.own_slice(z, g)?),
                Some(z) if z.level == 2 => (self.own_slice(z, *p)?, g),
                _ => (*p, g),
            };
            let excluded = spec.no_decay.iter().any(|(pat, _)| pat.matches(path));
            let wd = if excluded { 0.0 } else { opt.weight_decay };
            let states = state_names(opt, path);
            let ty = self.g.ty(p).clone();
            let state_in: Vec<ValueRef> = states
                .iter()
                .map(|s| self.g.add_input(s, ty.clone()))
                .collect();
            let (new_p, new_states) = match adam {
                None => self.sgd(opt, p, g, wd, (lr, coef), &state_in)?,
                Some((step_size, bc2)) => {
                    let scalars = [lr, step_size, bc2].into_iter().chain(coef).collect();
                    self.adam(opt, p, g, wd, scalars, &state_in)?
                }
            };
            // Levels 1 and 2 gather the updated slices into the whole parameter.
            let new_p = match self.zero.filter(|z| !z.shards_params()) {
                Some(z) => {
                    let shape = z.shapes.get(path).cloned().unwrap_or_default();
                    zero::gather_whole(self.g, new_p, &shape, &z.group)
                        .map_err(|e| e.to_string())?
                }
                None => new_p,
            };
            for (name, v) in states.iter().zip(new_states) {
                self.g.set_output(name, v);
            }
            self.g.set_output(path, new_p);
            trained.push(TrainedParam {
                path: path.clone(),
                weight_decay: wd,
                states,
            });
        }
        Ok(trained)
    }

    /// `torch.optim.SGD` (dampening 0) with the step's `lr` and what the gradient is multiplied
    /// by, if anything (`coef`): returns the new parameter and momentum buffer. With momentum
    /// one fused pass (`sgd_update`, which multiplies its gradient itself); without, one
    /// elementwise chain `p − lr · (g · coef + wd · p)`.
    fn sgd(
        &mut self,
        opt: &Optimizer,
        p: ValueRef,
        g: ValueRef,
        wd: f64,
        (lr, coef): (ValueRef, Option<ValueRef>),
        state: &[ValueRef],
    ) -> Built<(ValueRef, Vec<ValueRef>)> {
        match state {
            [] => {
                let mut g = match coef {
                    Some(c) => self.bin(Op::Mul, g, c)?,
                    None => g,
                };
                if wd > 0.0 {
                    let decay = self.scalar(wd)?;
                    let decayed = self.bin(Op::Mul, p, decay)?;
                    g = self.bin(Op::Add, g, decayed)?;
                }
                let step = self.bin(Op::Mul, g, lr)?;
                Ok((self.bin(Op::Sub, p, step)?, Vec::new()))
            }
            [buf] => {
                let attrs = Attrs::new()
                    .with("momentum", opt.momentum)
                    .with("weight_decay", wd)
                    .with("nesterov", opt.nesterov);
                let inputs: Vec<ValueRef> = [p, g, *buf, lr].into_iter().chain(coef).collect();
                let outs = self.ops(Op::SgdUpdate, attrs, &inputs)?;
                Ok((outs[0], vec![outs[1]]))
            }
            _ => Err("SGD with momentum needs one buffer".to_string()),
        }
    }

    /// `torch.optim.Adam` (L2 decay in the gradient) or `AdamW` (decoupled decay) with the
    /// step's `scalars` (`lr`, `step_size`, `bc2_sqrt`, and what the gradient is multiplied by
    /// where anything is): returns the new parameter and first and second moments.
    fn adam(
        &mut self,
        opt: &Optimizer,
        p: ValueRef,
        g: ValueRef,
        wd: f64,
        scalars: Vec<ValueRef>,
        state: &[ValueRef],
    ) -> Built<(ValueRef, Vec<ValueRef>)> {
        let [m, v] = state else {
            return Err("Adam needs two moments".to_string());
        };
        // One fused step per parameter (p, g, m and v read once; the new three written once).
        let attrs = Attrs::new()
            .with("beta1", opt.betas.0)
            .with("beta2", opt.betas.1)
            .with("eps", opt.eps)
            .with("weight_decay", wd)
            .with("decoupled", opt.kind == OptimizerKind::AdamW);
        let inputs: Vec<ValueRef> = [p, g, *m, *v].into_iter().chain(scalars).collect();
        let outs = self.ops(Op::AdamUpdate, attrs, &inputs)?;
        Ok((outs[0], vec![outs[1], outs[2]]))
    }
}
