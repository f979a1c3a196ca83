//! The training loop over a compiled training step ([`crate::train`]): batches from `.npy`
//! files, the learning rate and bias corrections of each update, the loss scale
//! ([`crate::loss_scale`]), writing the new parameters and optimizer states back (or skipping a
//! step whose gradients overflowed), atomic checkpoints and exact resumption, and the first
//! step's gradients for comparison with other frameworks.
//!
//! The loop is deterministic: the same data, seed and thread count give the same bytes, so N
//! steps straight and N/2 + resume N/2 end with byte-identical weights.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use mslc_artifact::Module;
use mslc_check::policy::{Optimizer, OptimizerKind, Schedule};
use mslc_core::diag::Code;
use mslc_core::ops::{Op, TensorType};
use mslc_exec::collectives::{gather_dim, Collectives};
use mslc_exec::{ExecError, ExecErrorKind, Executor, Stored};
use mslc_io::npy::{read_npy, write_npy, NpyArray, NpyDType};
use mslc_io::safetensors::{
    write_safetensors_streamed, SafetensorsError, SafetensorsFile, StDType, TensorRef, TensorSpec,
};

use crate::loss_scale::{LossScaler, ScaleState};
use crate::numerics::NumericsReport;
use crate::train::{
    write_backs, CompiledTrain, TrainedParam, BC2_SQRT, DATA_AXIS, GRAD_NORM, GRAD_PREFIX, LOSS,
    LOSS_SCALE, LR, OVERFLOW, SCALAR_INPUTS, STEP_SIZE, TENSOR_AXIS,
};
use crate::train_mode::SEED;
use mslc_ir::shard::zero::{ZeroShard, DP_INDEX};

mod stage;

use stage::StageFile;
pub use stage::StageRuntime;

/// A coded failure of the loop, naming the file or value at fault.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainRunError {
    /// The diagnostic code.
    pub code: Code,
    /// What went wrong.
    pub message: String,
    /// For a step stopped by `--check-numerics` (E0614): the faulting op, its operands and where
    /// it was written, as `mslc run` reports it.
    pub numerics: Option<Box<NumericsReport>>,
}

impl TrainRunError {
    fn new(code: Code, message: impl Into<String>) -> Self {
        TrainRunError {
            code,
            message: message.into(),
            numerics: None,
        }
    }

    /// The error of a failed step: a numerics fault as its report, anything else as E0603.
    fn of_run(e: ExecError) -> Self {
        match e.fault {
            Some(fault) => {
                let report = NumericsReport::of(&fault);
                TrainRunError {
                    code: Code::E0614,
                    message: report.message.clone(),
                    numerics: Some(Box::new(report)),
                }
            }
            None if e.kind == ExecErrorKind::Collective => {
                TrainRunError::new(Code::E0973, e.message)
            }
            None => TrainRunError::new(Code::E0603, e.message),
        }
    }
}

type Res<T> = Result<T, TrainRunError>;

fn data_error(message: impl Into<String>) -> TrainRunError {
    TrainRunError::new(Code::E0630, message)
}

fn checkpoint_error(dir: &Path, message: impl std::fmt::Display) -> TrainRunError {
    TrainRunError::new(
        Code::E0631,
        format!("checkpoint `{}`: {message}", dir.display()),
    )
}

/// One input's samples: the whole array, first axis = samples.
#[derive(Clone)]
struct Column {
    /// The module input it feeds.
    input: String,
    /// Where it came from, for messages.
    file: PathBuf,
    array: NpyArray,
}

/// The training samples, one column per module input the data feeds.
#[derive(Clone)]
pub struct Dataset {
    columns: Vec<Column>,
    samples: usize,
}

impl Dataset {
    /// Reads `path`: a directory of `NAME.npy` for each of `inputs` (name, type with the batch
    /// first), or one `[N, S+1]` token file feeding the one integer model input (`[:, :-1]`)
    /// and the one label (`[:, 1:]`). Checks every shape and dtype against the inputs.
    pub fn read(path: &Path, inputs: &[(String, TensorType)], labels: &[String]) -> Res<Dataset> {
        let columns = if path.is_dir() {
            let mut columns = Vec::new();
            for (name, _) in inputs {
                let file = path.join(format!("{name}.npy"));
                if !file.exists() {
                    return Err(data_error(format!(
                        "`{}` is missing: --data needs one NAME.npy per input and label ({})",
                        file.display(),
                        inputs
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                let array = read_npy(&file)
                    .map_err(|e| data_error(format!("`{}`: {e}", file.display())))?;
                columns.push(Column {
                    input: name.clone(),
                    file,
                    array,
                });
            }
            columns
        } else {
            tokens_columns(path, inputs, labels)?
        };
        let mut samples = None;
        for c in &columns {
            let ty = &inputs
                .iter()
                .find(|(n, _)| *n == c.input)
                .expect("column of an input")
                .1;
            let row: Vec<usize> = ty.shape[1..].iter().map(|&d| d as usize).collect();
            let shape = c.array.shape();
            if shape.is_empty() || shape[1..] != row[..] {
                return Err(data_error(format!(
                    "`{}` has shape {shape:?}, but input `{}` is {ty}: each sample must have shape {row:?}",
                    c.file.display(),
                    c.input
                )));
            }
            let float = matches!(
                c.array.dtype(),
                NpyDType::F16 | NpyDType::F32 | NpyDType::F64
            );
            let int = matches!(c.array.dtype(), NpyDType::I32 | NpyDType::I64);
            if !((ty.dtype.is_float() && float) || (ty.dtype.is_int() && int)) {
                return Err(data_error(format!(
                    "`{}` holds {}, but input `{}` is {}",
                    c.file.display(),
                    c.array.dtype().descr(),
                    c.input,
                    ty.dtype
                )));
            }
            match samples {
                None => samples = Some((shape[0], &c.file)),
                Some((n, first)) if n != shape[0] => {
                    return Err(data_error(format!(
                        "`{}` has {} samples but `{}` has {n}",
                        c.file.display(),
                        shape[0],
                        first.display()
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(Dataset {
            samples: samples.map_or(0, |(n, _)| n),
            columns,
        })
    }

    /// Number of samples.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Checks that every class label lies in `[0, classes)` or is the loss's ignore index,
    /// from the module's `cross_entropy` steps reading a label input.
    pub fn check_labels(&self, module: &Module) -> Res<()> {
        for step in module.steps.iter().filter(|s| s.op == Op::CrossEntropy) {
            let (Some(&logits), Some(&labels)) = (step.inputs.first(), step.inputs.get(1)) else {
                continue;
            };
            let Some((name, _)) = module.inputs().find(|&(_, v)| v == labels) else {
                continue;
            };
            let Some(col) = self.columns.iter().find(|c| c.input == name) else {
                continue;
            };
            let classes = module.values[logits as usize]
                .ty
                .shape
                .last()
                .copied()
                .unwrap_or(0);
            let ignore = step.attrs.int("ignore_index").ok();
            let values = col
                .array
                .to_i64()
                .map_err(|e| data_error(format!("`{}`: {e}", col.file.display())))?;
            if let Some((i, v)) = values
                .iter()
                .enumerate()
                .find(|&(_, &v)| !(0..classes).contains(&v) && Some(v) != ignore)
            {
                return Err(data_error(format!(
                    "`{}`: label {v} at flat index {i} is outside [0, {classes}) for `cross_entropy`",
                    col.file.display()
                )));
            }
        }
        Ok(())
    }

    /// Sets every column's input the module of `exec` has (a pipeline stage reads only some)
    /// to the samples `rows`, read straight from the column into the input's buffer.
    fn feed(&self, exec: &mut Executor, rows: &[usize]) -> Res<()> {
        for c in &self.columns {
            if !exec.module().inputs().any(|(n, _)| n == c.input) {
                continue;
            }
            exec.set_input_rows(&c.input, &c.array, rows)
                .map_err(|e| data_error(format!("`{}`: {}", c.file.display(), e.message)))?;
        }
        Ok(())
    }
}

/// `tokens.npy` `[N, S+1]` as the model input `[:, :-1]` and the label `[:, 1:]`.
fn tokens_columns(
    path: &Path,
    inputs: &[(String, TensorType)],
    labels: &[String],
) -> Res<Vec<Column>> {
    let (model_inputs, label_inputs): (Vec<_>, Vec<_>) =
        inputs.iter().partition(|(n, _)| !labels.contains(n));
    let ([(input, _)], [(label, _)]) = (model_inputs.as_slice(), label_inputs.as_slice()) else {
        return Err(data_error(format!(
            "`{}` is one file, the language-model shorthand, which needs a train with one input and one label; give a directory of NAME.npy instead",
            path.display()
        )));
    };
    let array = read_npy(path).map_err(|e| data_error(format!("`{}`: {e}", path.display())))?;
    let (&[n, width], NpyDType::I32 | NpyDType::I64) = (array.shape(), array.dtype()) else {
        return Err(data_error(format!(
            "`{}` must be an integer array [N, S+1] of token ids, but it is {} of shape {:?}",
            path.display(),
            array.dtype().descr(),
            array.shape()
        )));
    };
    if width < 2 {
        return Err(data_error(format!(
            "`{}`: each row needs at least 2 tokens",
            path.display()
        )));
    }
    let size = array.dtype().size();
    let take = |from: usize| {
        let mut data = Vec::with_capacity(n * (width - 1) * size);
        for r in 0..n {
            let row = &array.data()[r * width * size..(r + 1) * width * size];
            data.extend_from_slice(&row[from * size..(from + width - 1) * size]);
        }
        NpyArray::new(array.dtype(), vec![n, width - 1], data)
            .map_err(|e| data_error(e.to_string()))
    };
    Ok(vec![
        Column {
            input: input.clone(),
            file: path.to_path_buf(),
            array: take(0)?,
        },
        Column {
            input: label.clone(),
            file: path.to_path_buf(),
            array: take(1)?,
        },
    ])
}

/// Where the loop is: saved in `state.json` and restored by `--resume`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// Steps done, skipped ones included (a checkpoint `step-K` is written after step K).
    pub step: u64,
    /// Optimizer updates applied: the steps not skipped. Adam's `t` and the learning-rate
    /// schedule count these.
    pub updates: u64,
    /// Steps skipped because a gradient was not finite.
    pub skipped: u64,
    /// Epochs started (the shuffle of epoch `e` is drawn from the seed and `e`).
    pub epoch: u64,
    /// Batches of the current epoch already taken.
    pub batch_in_epoch: u64,
    /// `--shuffle` seed, if batches are shuffled.
    pub shuffle: Option<u64>,
    /// The optimizer (`sgd`, `adam`, `adamw`), checked on resume.
    pub optimizer: String,
    /// Samples per batch, checked on resume.
    pub batch: u64,
    /// The loss-scale manager, as the train states it (`none`, `fixed(…)`, `dynamic(…)`): the
    /// scale state below carries over a resume only under the same manager.
    pub loss_scaling: String,
    /// The loss scale and its count of finite steps.
    #[serde(flatten)]
    pub scale: ScaleState,
    /// The train seed, from which each micro-batch's dropout seed is drawn (0 when absent,
    /// as in checkpoints written before dropout was live).
    #[serde(default)]
    pub seed: u64,
}

/// What one update reported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMetrics {
    /// The update's number, from 1.
    pub step: u64,
    /// The loss before the update (unscaled; with `grad_accum`, the mean of its micro-batches'
    /// losses).
    pub loss: f64,
    /// The learning rate it used.
    pub lr: f64,
    /// The loss scale the step multiplied its loss by (1 without loss scaling).
    pub loss_scale: f64,
    /// The unscaled gradients' global 2-norm before clipping.
    pub grad_norm: f64,
    /// Whether the update was skipped because a gradient was not finite (never without loss
    /// scaling).
    pub skipped: bool,
    /// Wall time of the step in milliseconds.
    pub ms: f64,
}

/// What the loop needs of a [`CompiledTrain`] once its module runs in the executor: not the
/// compiled graph, module and memory plan, which every rank would otherwise hold again beside
/// its executor's program.
struct LoopTrain {
    optimizer: Optimizer,
    params: Vec<TrainedParam>,
    loss_scale: LossScaler,
    grad_accum: u32,
    accumulators: Vec<String>,
    buffers: Vec<String>,
    zero: Option<ZeroShard>,
}

impl From<&CompiledTrain> for LoopTrain {
    fn from(train: &CompiledTrain) -> Self {
        LoopTrain {
            optimizer: train.optimizer,
            params: train.params.clone(),
            loss_scale: train.loss_scale,
            grad_accum: train.grad_accum,
            accumulators: train.accumulators.clone(),
            buffers: train.buffers.clone(),
            zero: train.zero.clone(),
        }
    }
}

/// A training run: the executor of the compiled step, the data and where the loop is.
pub struct Trainer {
    exec: Executor,
    train: LoopTrain,
    schedule: Schedule,
    /// The samples, shared by the ranks of one process (each reads its own rows).
    data: Arc<Dataset>,
    /// Samples per run of this rank's step.
    batch: usize,
    /// This rank's data-parallel replica and the replicas there are: it takes its slice of
    /// each global batch of `batch × replicas` samples.
    replica: (usize, usize),
    /// Under tensor parallelism, the split parameters (path → dim), gathered over
    /// [`TENSOR_AXIS`] for checkpoints and cut from them on resume, and this rank's member
    /// index and the group's size.
    tensor: Option<(BTreeMap<String, usize>, (usize, usize))>,
    order: Vec<usize>,
    state: LoopState,
    /// The last update's loss (the mean over its micro-batches).
    loss: f64,
    /// When this is one stage of a pipeline: its forward, cut and peers.
    stage: Option<StageRuntime>,
    /// On a pipeline, this stage's part in assembling each gathered file on the first stage
    /// (settled when the stage is set up); empty elsewhere.
    stage_files: Vec<(FileKind, StageFile)>,
    /// The most bytes reading a checkpoint's optimizer states held beside the run at once
    /// ([`Trainer::resume`]; the weights' own is the executor's).
    states_transient_bytes: u64,
}

fn optimizer_name(kind: OptimizerKind) -> &'static str {
    match kind {
        OptimizerKind::Sgd => "sgd",
        OptimizerKind::Adam => "adam",
        OptimizerKind::AdamW => "adamw",
    }
}

/// The module's inputs the loop keeps across runs and starts at zero: optimizer states and
/// gradient accumulators.
fn zeroed_inputs(train: &CompiledTrain) -> impl Iterator<Item = &str> {
    train
        .params
        .iter()
        .flat_map(|p| p.states.iter().map(String::as_str))
        .chain(train.accumulators.iter().map(String::as_str))
}

/// The module's data inputs — the model's inputs and the train's labels — by name, with types.
pub fn data_inputs(module: &Module, train: &CompiledTrain) -> Vec<(String, TensorType)> {
    let states: Vec<&str> = zeroed_inputs(train).collect();
    module
        .inputs()
        .filter(|(n, _)| {
            !states.contains(n) && !SCALAR_INPUTS.contains(n) && *n != SEED && *n != DP_INDEX
        })
        .map(|(n, v)| (n.to_string(), module.values[v as usize].ty.clone()))
        .collect()
}

impl Trainer {
    /// A loop over `data` for the step `train` run by `exec` (parameters loaded or
    /// initialised); optimizer states start at zero; `seed` draws the dropout masks.
    pub fn new(
        mut exec: Executor,
        train: &CompiledTrain,
        schedule: Schedule,
        data: Arc<Dataset>,
        shuffle: Option<u64>,
        seed: u64,
    ) -> Res<Trainer> {
        let inputs = data_inputs(exec.module(), train);
        let batch = inputs
            .first()
            .and_then(|(_, t)| t.shape.first())
            .copied()
            .unwrap_or(1) as usize;
        if data.samples < batch {
            return Err(data_error(format!(
                "--data holds {} samples, fewer than one batch of {batch}",
                data.samples
            )));
        }
        data.check_labels(exec.module())?;
        let zeroed: Vec<String> = zeroed_inputs(train).map(str::to_string).collect();
        zero_inputs(&mut exec, &zeroed)?;
        let state = LoopState {
            step: 0,
            updates: 0,
            skipped: 0,
            epoch: 0,
            batch_in_epoch: 0,
            shuffle,
            optimizer: optimizer_name(train.optimizer.kind).to_string(),
            batch: batch as u64,
            loss_scaling: train.loss_scale.to_string(),
            scale: train.loss_scale.initial(),
            seed,
        };
        let mut trainer = Trainer {
            exec,
            train: train.into(),
            schedule,
            data,
            batch,
            replica: (0, 1),
            tensor: None,
            order: Vec::new(),
            state,
            loss: f64::NAN,
            stage: None,
            stage_files: Vec::new(),
            states_transient_bytes: 0,
        };
        trainer.order = trainer.epoch_order(0);
        trainer.set_dp_index()?;
        Ok(trainer)
    }

    /// Makes this the loop of data-parallel replica `replica` of `replicas`: each global batch
    /// holds `replicas` of this step's batches, and this rank takes slice `replica` of it (the
    /// others' slices go to the other ranks). The loop state counts global batches, so a
    /// checkpoint resumes on any number of replicas.
    pub fn shard_data(&mut self, replica: usize, replicas: usize) -> Res<()> {
        let global = self.batch.saturating_mul(replicas.max(1));
        if self.data.samples < global {
            return Err(data_error(format!(
                "--data holds {} samples, fewer than one batch of {global} ({replicas} replicas × {})",
                self.data.samples, self.batch
            )));
        }
        self.replica = (replica, replicas.max(1));
        self.state.batch = global as u64;
        self.set_dp_index()
    }

    /// Tells a step that selects its slices of replicated tensors (optimizer sharding levels 1
    /// and 2) which replica this is.
    fn set_dp_index(&mut self) -> Res<()> {
        if !self.has_input(DP_INDEX) {
            return Ok(());
        }
        let array = NpyArray::from_i64(vec![], &[self.replica.0 as i64])
            .map_err(|e| data_error(e.to_string()))?;
        self.exec
            .set_input(DP_INDEX, &array)
            .map_err(|e| data_error(e.message))
    }

    /// Whether a checkpoint is a collective: the ranks' shards (tensor parallel) or slices
    /// (optimizer sharding) are gathered, so every rank calls [`Trainer::checkpoint_tensors`]
    /// at the same step.
    pub fn gathers_checkpoints(&self) -> bool {
        self.tensor.is_some() || self.train.zero.is_some() || self.stage.is_some()
    }

    /// Whether a gradient dump is a collective ([`Trainer::gathered_grads`]): a
    /// tensor-parallel group's blocks, the slices of optimizer sharding at levels 2 and 3
    /// (whose gradients are reduce-scattered) or a pipeline's stages are gathered.
    pub fn gathers_grads(&self) -> bool {
        self.tensor.is_some() || self.slices_grads() || self.stage.is_some()
    }

    /// Whether each rank holds only its slice of the gradients (optimizer sharding at levels 2
    /// and 3 reduce-scatters them over the data-parallel axis).
    fn slices_grads(&self) -> bool {
        self.train.zero.as_ref().is_some_and(|z| z.level >= 2)
    }

    /// Makes this the loop of member `part` of a tensor-parallel group of `n` ranks whose
    /// parameters `splits` (path → dim) hold 1/n of that dim: checkpoints gather them (and
    /// their optimizer states) over [`TENSOR_AXIS`], and a resume takes this member's block of
    /// each.
    pub fn shard_tensors(&mut self, splits: BTreeMap<String, usize>, (part, n): (usize, usize)) {
        self.tensor = Some((splits, (part, n)));
    }

    /// The split parameters (path → dim) and this rank's (member, group size) of its
    /// tensor-parallel group: none, and (0, 1), without tensor parallelism.
    fn tensor_share(&self) -> (BTreeMap<String, usize>, (usize, usize)) {
        self.tensor.clone().unwrap_or((BTreeMap::new(), (0, 1)))
    }

    /// Samples per global batch: this step's batch on each replica.
    fn global_batch(&self) -> usize {
        self.batch * self.replica.1
    }

    /// Batches per epoch, and samples left over at its end.
    pub fn epoch_shape(&self) -> (usize, usize) {
        let global = self.global_batch();
        (self.data.samples / global, self.data.samples % global)
    }

    /// Where the loop is.
    pub fn state(&self) -> &LoopState {
        &self.state
    }

    /// The executor (for its module and thread count).
    pub fn executor(&self) -> &Executor {
        &self.exec
    }

    /// Records what each pool thread of the step's executor does from now on, for
    /// [`Executor::profile_json`] (`mslc train --profile`).
    pub fn record_workers(&mut self, on: bool) {
        self.exec.record_workers(on);
    }

    /// The sample order of epoch `epoch`: in order, or a seeded Fisher–Yates shuffle.
    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.data.samples).collect();
        if let Some(seed) = self.state.shuffle {
            let mut rng = SplitMix(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..order.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        order
    }

    /// Runs one update: for each of its `grad_accum` micro-batches feeds the next batch, the
    /// scalars and the dropout seed and runs the step, keeping the gradient sums and running
    /// statistics of all but the last run; the last run's new parameters and states are written
    /// back — unless the loss scaling skips the update because a gradient is not finite (the
    /// running statistics are kept either way, as PyTorch's forward updates them).
    pub fn step(&mut self) -> Res<StepMetrics> {
        if self.stage.is_some() {
            return self.stage_step();
        }
        let start = std::time::Instant::now();
        let (lr, loss_scale) = self.set_update_scalars()?;
        let micro = u64::from(self.train.grad_accum);
        let mut losses = 0.0;
        let mut skipped = false;
        for m in 0..micro {
            self.feed_next_batch()?;
            if self.has_input(SEED) {
                let seed = micro_seed(self.state.seed, self.state.step * micro + m);
                let array =
                    NpyArray::from_i64(vec![], &[seed]).map_err(|e| data_error(e.to_string()))?;
                self.exec
                    .set_input(SEED, &array)
                    .map_err(|e| data_error(e.message))?;
            }
            let last = m + 1 == micro;
            let ran = if last {
                self.exec.run()
            } else {
                // An earlier micro-batch keeps its loss, gradient sums and running statistics
                // only: the norm, clipping and update that the module also computes are skipped.
                let kept: Vec<&str> = std::iter::once(LOSS)
                    .chain(self.train.accumulators.iter().map(String::as_str))
                    .chain(self.train.buffers.iter().map(String::as_str))
                    .collect();
                self.exec.run_for(&kept)
            };
            ran.map_err(|e| self.run_error(e, loss_scale))?;
            losses += self.scalar(LOSS);
            let buffers = self.train.buffers.iter().map(String::as_str);
            if !last {
                let sums = self.train.accumulators.iter().map(String::as_str);
                self.exec
                    .write_back(sums.chain(buffers))
                    .map_err(TrainRunError::of_run)?;
                continue;
            }
            // NaN (an overflow) is not 0; a module that skips nothing has no such output.
            let overflow = self
                .exec
                .output_f32(OVERFLOW)
                .is_some_and(|(_, v)| v[0] != 0.0);
            skipped = self
                .train
                .loss_scale
                .after_step(&mut self.state.scale, overflow);
            if skipped {
                self.state.skipped += 1;
                self.exec
                    .write_back(buffers)
                    .map_err(TrainRunError::of_run)?;
            } else {
                self.exec
                    .write_back(write_backs(&self.train.params).chain(buffers))
                    .map_err(TrainRunError::of_run)?;
                self.state.updates += 1;
            }
        }
        zero_inputs(&mut self.exec, &self.train.accumulators)?;
        let grad_norm = self.scalar(GRAD_NORM);
        Ok(self.step_done(
            losses / micro as f64,
            (lr, loss_scale),
            grad_norm,
            skipped,
            start,
        ))
    }

    /// Counts the step done and reports it: the mean `loss` of its micro-batches, its learning
    /// rate and loss scale, the gradients' global norm, whether it was skipped, its time since
    /// `start`.
    fn step_done(
        &mut self,
        loss: f64,
        (lr, loss_scale): (f64, f64),
        grad_norm: f64,
        skipped: bool,
        start: std::time::Instant,
    ) -> StepMetrics {
        self.loss = loss;
        self.state.step += 1;
        StepMetrics {
            step: self.state.step,
            loss,
            lr,
            loss_scale,
            grad_norm,
            skipped,
            ms: start.elapsed().as_secs_f64() * 1e3,
        }
    }

    /// Sets the update's scalars (learning rate, Adam's corrections, the loss scale) the
    /// module reads; the learning rate and the loss scale.
    fn set_update_scalars(&mut self) -> Res<(f64, f64)> {
        let k = self.state.updates;
        let opt = self.train.optimizer;
        let lr = self.schedule.lr(opt.lr, k);
        let t = (k + 1) as i32;
        let loss_scale = self.state.scale.loss_scale;
        let scalars = [
            (LR, lr),
            (STEP_SIZE, lr / (1.0 - opt.betas.0.powi(t))),
            (BC2_SQRT, (1.0 - opt.betas.1.powi(t)).sqrt()),
            (LOSS_SCALE, loss_scale),
        ];
        // A pipeline stage's update is a program of its own, the step scales its loss.
        let mut targets = vec![&mut self.exec];
        if let Some(stage) = self.stage.as_mut() {
            targets.push(&mut stage.update);
        }
        for exec in targets {
            for (name, value) in scalars {
                if exec.module().inputs().any(|(n, _)| n == name) {
                    let array = NpyArray::from_f32(vec![], &[value as f32])
                        .map_err(|e| data_error(e.to_string()))?;
                    exec.set_input(name, &array)
                        .map_err(|e| data_error(e.message))?;
                }
            }
        }
        Ok((lr, loss_scale))
    }

    /// A failed run's error; under loss scaling, a numerics report also says the loss was
    /// scaled by `loss_scale` (and that without --check-numerics the step would be skipped).
    fn run_error(&self, e: ExecError, loss_scale: f64) -> TrainRunError {
        let mut e = TrainRunError::of_run(e);
        let scaler = self.train.loss_scale;
        if let (Some(report), true) = (e.numerics.as_mut(), scaler.scales()) {
            report.help.push_str(&format!(
                "; the step's loss was scaled by {loss_scale} (loss_scale = {scaler})"
            ));
            if scaler.skips_overflow() {
                report.help.push_str(
                    ", and without --check-numerics a step whose gradients are not finite \
                     is skipped",
                );
            }
        }
        e
    }

    fn has_input(&self, name: &str) -> bool {
        self.exec.module().inputs().any(|(n, _)| n == name)
    }

    /// Scalar output `name` of the last run (NaN if absent).
    fn scalar(&self, name: &str) -> f64 {
        self.exec
            .output_f32(name)
            .map_or(f64::NAN, |(_, v)| f64::from(v[0]))
    }

    /// Feeds the next batch of the epoch, starting the next epoch when this one is used up.
    fn feed_next_batch(&mut self) -> Res<()> {
        let rows = self.next_rows();
        self.data.feed(&mut self.exec, &rows)
    }

    /// The rows of the next batch of the epoch (this replica's slice), starting the next epoch
    /// when this one is used up.
    fn next_rows(&mut self) -> Vec<usize> {
        let (per_epoch, _) = self.epoch_shape();
        if self.state.batch_in_epoch as usize >= per_epoch {
            self.state.epoch += 1;
            self.state.batch_in_epoch = 0;
            self.order = self.epoch_order(self.state.epoch);
        }
        let first =
            self.state.batch_in_epoch as usize * self.global_batch() + self.replica.0 * self.batch;
        self.state.batch_in_epoch += 1;
        self.order[first..first + self.batch].to_vec()
    }

    /// Writes the last update's raw gradients as `DIR/grads.safetensors` (f32, by parameter
    /// path; with `grad_accum`, summed over the micro-batches of `loss / grad_accum`) and its
    /// loss as `DIR/loss.npy`; the module must expose them
    /// ([`crate::train::TrainOptions::expose_grads`]).
    pub fn dump_grads(&mut self, dir: &Path) -> Res<Vec<PathBuf>> {
        let write_error = |m: String| TrainRunError::new(Code::E0600, m);
        fs::create_dir_all(dir)
            .map_err(|e| write_error(format!("cannot create `{}`: {e}", dir.display())))?;
        let path = dir.join("grads.safetensors");
        self.write_file(FileKind::Grads, &path)?;
        let loss_path = dir.join("loss.npy");
        let array = NpyArray::from_f32(vec![], &[self.loss as f32])
            .map_err(|e| write_error(e.to_string()))?;
        write_npy(&loss_path, &array).map_err(|e| write_error(e.to_string()))?;
        Ok(vec![path, loss_path])
    }

    /// A rank other than 0's part in [`Trainer::save`] when checkpoints are gathered
    /// ([`Trainer::gathers_checkpoints`]): the gathers of every tensor, in the order rank 0
    /// writes them.
    pub fn join_checkpoint(&mut self) -> Res<()> {
        self.join_file(FileKind::Model)?;
        self.join_file(FileKind::Optimizer)
    }

    /// A rank other than 0's part in [`Trainer::dump_grads`] when gradients are gathered
    /// ([`Trainer::gathers_grads`]).
    pub fn join_grads(&mut self) -> Res<()> {
        self.join_file(FileKind::Grads)
    }

    /// The most bytes this rank held beside its buffers while it read a file: its weights
    /// (`--weights`, or a checkpoint's model) or a checkpoint's optimizer states, one tensor's
    /// pages and the rank's share of it at a time. The run's peak holds it before the first
    /// step, as [`Trainer::file_staging_bytes`] between steps.
    pub fn load_transient_bytes(&self) -> u64 {
        let read = self.exec.load_transient_bytes();
        match read.max(self.states_transient_bytes) {
            0 => 0,
            // With the pages mapped around the tensor's on either side.
            most => most + 2 * mslc_io::safetensors::FAULT_AROUND_BYTES as u64,
        }
    }

    /// The bytes this rank holds beside its step while the files a run asks for are written
    /// (checkpoints when `checkpoints`, a gradient dump when `grads`), as the rank that writes
    /// them (`writes`) or as one that joins the gathers: for a file gathered one tensor at a
    /// time ([`Trainer::write_file`]), the writer holds its largest tensor whole as values and
    /// as bytes (on a pipeline's first stage, the largest of the whole file, which it receives
    /// from the other stages); a rank joining holds a tensor whole beside what it gathered it
    /// from ([`Trainer::whole`]), on a pipeline as much as the writer. Nothing for a file
    /// written from the rank's own buffers.
    pub fn file_staging_bytes(&self, checkpoints: bool, grads: bool, writes: bool) -> u64 {
        let kinds = [
            (checkpoints, FileKind::Model),
            (checkpoints, FileKind::Optimizer),
            (grads, FileKind::Grads),
        ];
        // Per tensor of the file this rank holds whole, the values it holds at once: on a
        // pipeline's first stage, every tensor of the file (those of the other stages as
        // received); elsewhere its own, made whole.
        let held = |kind: FileKind| -> Vec<usize> {
            if let Ok(StageFile::Writes(entries)) = self.stage_file(kind) {
                return (entries.iter())
                    .map(|(_, shape, _)| 2 * shape.iter().product::<usize>())
                    .collect();
            }
            let pieces = self.pieces(kind).into_iter();
            pieces
                .filter_map(|p| {
                    let whole: usize = self.whole_shape(kind, &p).ok()?.iter().product();
                    Some(match (writes, self.stage.is_some()) {
                        (false, false) => whole + self.gathered_from(kind, &p).unwrap_or(0),
                        _ => 2 * whole,
                    })
                })
                .collect()
        };
        kinds
            .into_iter()
            .filter(|&(on, kind)| on && self.gathers(kind))
            .flat_map(|(_, kind)| held(kind))
            .map(|values| 4 * values as u64)
            .max()
            .unwrap_or(0)
    }

    /// The values [`Trainer::whole`] holds `piece` as when its last gather starts (the slice or
    /// block that gather makes whole); `None` when it gathers nothing.
    fn gathered_from(&self, kind: FileKind, piece: &Piece) -> Option<usize> {
        let full = self.zero_of(kind).and_then(|z| z.shapes.get(&piece.owner));
        let split =
            (self.tensor.as_ref()).is_some_and(|(splits, _)| splits.contains_key(&piece.owner));
        let local = || self.local_shape(piece).ok().map(|s| s.iter().product());
        match (full, split) {
            (Some(full), true) => Some(full.iter().product()),
            (None, true) | (Some(_), false) => local(),
            (None, false) => None,
        }
    }

    /// Whether file `kind` is gathered from the ranks (a collective) rather than written from
    /// this rank's own values.
    fn gathers(&self, kind: FileKind) -> bool {
        match kind {
            FileKind::Model | FileKind::Optimizer => self.gathers_checkpoints(),
            FileKind::Grads => self.gathers_grads(),
        }
    }

    /// The optimizer sharding that slices file `kind`'s tensors on this rank: the states'
    /// always, the parameters' at level 3, the gradients' at levels 2 and 3.
    fn zero_of(&self, kind: FileKind) -> Option<&ZeroShard> {
        let zero = self.train.zero.as_ref();
        match kind {
            FileKind::Model => zero.filter(|z| z.shards_params()),
            FileKind::Optimizer => zero,
            FileKind::Grads => zero.filter(|_| self.slices_grads()),
        }
    }

    /// The tensors of file `kind` this rank holds, sorted by name (the order the file holds
    /// them in).
    fn pieces(&self, kind: FileKind) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = match kind {
            FileKind::Model => self
                .exec
                .param_paths()
                .map(|p| Piece::new(p, p, p, Held::Param))
                .collect(),
            FileKind::Optimizer => self
                .train
                .params
                .iter()
                .flat_map(|p| {
                    p.states
                        .iter()
                        .map(|s| Piece::new(s, s, &p.path, Held::Input))
                })
                .collect(),
            FileKind::Grads => self
                .train
                .params
                .iter()
                .map(|p| {
                    let grad = format!("{GRAD_PREFIX}{}", p.path);
                    Piece::new(&p.path, &grad, &p.path, Held::Output)
                })
                .collect(),
        };
        pieces.sort_by(|a, b| a.file.cmp(&b.file));
        pieces
    }

    /// The executor holding values of `held`: parameters in the step's, optimizer states and
    /// gradients in the update's.
    fn holder(&self, held: Held) -> &Executor {
        match held {
            Held::Param => &self.exec,
            Held::Input | Held::Output => self.updater(),
        }
    }

    /// The shape of this rank's own value of `piece`.
    fn local_shape(&self, piece: &Piece) -> Res<&[usize]> {
        self.holder(piece.held)
            .shape_of(piece.stored())
            .ok_or_else(|| run_missing(&piece.local))
    }

    /// The values of `piece` whole (of [`Trainer::whole_shape`]): this rank's value,
    /// all-gathered over the data-parallel axis from the slices of optimizer sharding, then
    /// over the tensor-parallel axis from the blocks of a split parameter; a collective, which
    /// every member of those groups calls for the same piece.
    fn whole(&mut self, kind: FileKind, piece: &Piece) -> Res<Vec<f32>> {
        let (local, mut values) = self
            .holder(piece.held)
            .value_f32(piece.stored())
            .ok_or_else(|| run_missing(&piece.local))?;
        let full = self
            .zero_of(kind)
            .and_then(|z| z.shapes.get(&piece.owner))
            .cloned();
        let split = self
            .tensor
            .as_ref()
            .and_then(|(splits, _)| splits.get(&piece.owner).copied());
        let gathered = |e: ExecError| TrainRunError::new(Code::E0973, e.message);
        if let Some(full) = &full {
            let comm = comm(&mut self.exec)?;
            values = gather_dim(comm, DATA_AXIS, 0, &[values.len()], &values).map_err(gathered)?;
            values.truncate(full.iter().product());
        }
        if let Some(d) = split {
            let block = full.unwrap_or(local);
            let comm = comm(&mut self.exec)?;
            values = gather_dim(comm, TENSOR_AXIS, d, &block, &values).map_err(gathered)?;
        }
        Ok(values)
    }

    /// The shape `piece` has whole, known before anything is gathered ([`Trainer::whole`]
    /// gathers its values): what the file's header says.
    fn whole_shape(&self, kind: FileKind, piece: &Piece) -> Res<Vec<usize>> {
        let mut shape = match self.zero_of(kind).and_then(|z| z.shapes.get(&piece.owner)) {
            Some(full) => full.clone(),
            None => self.local_shape(piece)?.to_vec(),
        };
        if let Some((splits, (_, n))) = &self.tensor {
            if let Some(d) = splits.get(&piece.owner).and_then(|&d| shape.get_mut(d)) {
                *d *= n;
            }
        }
        Ok(shape)
    }

    /// Writes file `kind` to `path` as f32, atomically, one tensor at a time: this rank's own
    /// values straight from its buffers, or, when the file is gathered, assembled as the file
    /// reaches each tensor while the other ranks join in ([`Trainer::assemble_file`]). So no
    /// rank holds more than one whole tensor beside the run.
    fn write_file(&mut self, kind: FileKind, path: &Path) -> Res<()> {
        if self.gathers(kind) {
            return self.assemble_file(kind, Some(path));
        }
        let write_error = |e: SafetensorsError| TrainRunError::new(Code::E0600, e.to_string());
        let pieces = self.pieces(kind);
        let shapes = (pieces.iter().map(|p| self.local_shape(p))).collect::<Res<Vec<_>>>()?;
        let specs: Vec<TensorSpec> = (pieces.iter().zip(shapes))
            .map(|(p, s)| f32_spec(&p.file, s))
            .collect();
        let bytes = |i: usize| {
            let p = &pieces[i];
            let held = self.holder(p.held).f32_le(p.stored());
            held.ok_or_else(|| run_missing(&p.local).message)
        };
        write_safetensors_streamed(path, &specs, &bytes).map_err(write_error)
    }

    /// A rank other than 0's part in writing file `kind` when it is gathered
    /// ([`Trainer::assemble_file`] without a file).
    fn join_file(&mut self, kind: FileKind) -> Res<()> {
        match self.gathers(kind) {
            true => self.assemble_file(kind, None),
            false => Ok(()),
        }
    }

    /// A gathered file `kind`, one tensor at a time in the file's order, written to `path` (on
    /// rank 0) or gone through without a file (every other rank, joining the gathers). Each
    /// tensor is made whole over its groups ([`Trainer::whole`]) as the file reaches it; on a
    /// pipeline, the first stage asks the stage a tensor comes from for it, and a later stage
    /// only sends ([`Trainer::send_to_first_stage`]). If rank 0 stops (a failure to write),
    /// the others stop at their next gather or exchange, as at any rank's failure.
    fn assemble_file(&mut self, kind: FileKind, path: Option<&Path>) -> Res<()> {
        let pieces = self.pieces(kind);
        let entries: Vec<(String, Vec<usize>, usize)> = match self.stage {
            Some(_) => match self.stage_file(kind)? {
                StageFile::Writes(entries) => entries.clone(),
                StageFile::Sends(taken) => {
                    let taken = taken.clone();
                    return self.send_to_first_stage(kind, &taken);
                }
            },
            None => (pieces.iter())
                .map(|p| Ok((p.file.clone(), self.whole_shape(kind, p)?, 0)))
                .collect::<Res<_>>()?,
        };
        let ranks = self.stage.as_ref().map(|s| s.ranks.clone());
        let (next, own) = (Cell::new(0), Cell::new(0));
        let me = RefCell::new(&mut *self);
        // Tensor `i`'s values whole, asked for in the file's order.
        let fetch = |i: usize| -> Res<Vec<f32>> {
            if i != next.get() {
                return Err(run_missing(&format!("tensor {i} in the file's order")));
            }
            next.set(i + 1);
            let (name, shape, from) = &entries[i];
            let mut me = me.borrow_mut();
            match (*from, &ranks) {
                (0, _) | (_, None) => {
                    let piece = pieces.get(own.get()).filter(|p| p.file == *name);
                    own.set(own.get() + 1);
                    me.whole(kind, piece.ok_or_else(|| run_missing(name))?)
                }
                (from, Some(ranks)) => me.receive_from_stage(ranks[from], shape.iter().product()),
            }
        };
        let Some(path) = path else {
            return (0..entries.len()).try_for_each(|i| fetch(i).map(drop));
        };
        let specs: Vec<TensorSpec> = entries.iter().map(|(n, s, _)| f32_spec(n, s)).collect();
        let bytes = |i: usize| {
            let values = fetch(i).map_err(|e| e.message)?;
            Ok(Cow::Owned(f32_bytes(&values)))
        };
        write_safetensors_streamed(path, &specs, &bytes)
            .map_err(|e| TrainRunError::new(Code::E0600, e.to_string()))
    }

    /// Writes `out/step-K` (K = updates done) atomically: the files go to a temporary folder
    /// beside it, which is renamed into place once complete, so a kill leaves the earlier
    /// checkpoints as they were and no partial `step-K`. When checkpoints are gathered it is a
    /// collective, which the other ranks join at the same step ([`Trainer::join_checkpoint`]).
    pub fn save(&mut self, out: &Path) -> Res<PathBuf> {
        let write_error = |m: String| TrainRunError::new(Code::E0600, m);
        let dir = out.join(format!("step-{}", self.state.step));
        let tmp = out.join(format!(".step-{}.partial", self.state.step));
        fs::create_dir_all(out)
            .map_err(|e| write_error(format!("cannot create `{}`: {e}", out.display())))?;
        if tmp.exists() {
            fs::remove_dir_all(&tmp)
                .map_err(|e| write_error(format!("cannot clear `{}`: {e}", tmp.display())))?;
        }
        fs::create_dir(&tmp)
            .map_err(|e| write_error(format!("cannot create `{}`: {e}", tmp.display())))?;
        self.write_file(FileKind::Model, &tmp.join("model.safetensors"))?;
        self.write_file(FileKind::Optimizer, &tmp.join("optimizer.safetensors"))?;
        let json =
            serde_json::to_vec_pretty(&self.state).map_err(|e| write_error(e.to_string()))?;
        mslc_io::atomic::write_atomic(&tmp.join("state.json"), |p| fs::write(p, &json))
            .map_err(|e| write_error(e.to_string()))?;
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .map_err(|e| write_error(format!("cannot replace `{}`: {e}", dir.display())))?;
        }
        fs::rename(&tmp, &dir).map_err(|e| {
            write_error(format!(
                "cannot move the checkpoint into `{}`: {e}",
                dir.display()
            ))
        })?;
        if let Ok(d) = fs::File::open(out) {
            // Best effort: make the rename durable; the checkpoint is complete either way.
            let _ = d.sync_all();
        }
        Ok(dir)
    }

    /// Restores the parameters, optimizer states and loop position of checkpoint `dir`. All
    /// three files are read and checked before anything is changed.
    pub fn resume(&mut self, dir: &Path) -> Res<()> {
        let state: LoopState = fs::read(dir.join("state.json"))
            .map_err(|e| checkpoint_error(dir, format!("state.json: {e}")))
            .and_then(|b| {
                serde_json::from_slice(&b)
                    .map_err(|e| checkpoint_error(dir, format!("state.json: {e}")))
            })?;
        if state.optimizer != self.state.optimizer || state.batch != self.state.batch {
            return Err(checkpoint_error(
                dir,
                format!(
                    "written by {} with batch {}, but this train uses {} with batch {}",
                    state.optimizer, state.batch, self.state.optimizer, self.state.batch
                ),
            ));
        }
        let (per_epoch, _) = self.epoch_shape();
        if state.batch_in_epoch as usize > per_epoch {
            return Err(checkpoint_error(
                dir,
                "its data position is past the end of this --data",
            ));
        }
        let model = SafetensorsFile::open(dir.join("model.safetensors"))
            .map_err(|e| checkpoint_error(dir, e))?;
        let optim = SafetensorsFile::open(dir.join("optimizer.safetensors"))
            .map_err(|e| checkpoint_error(dir, e))?;
        // Every optimizer state as this rank holds it, read and cut one at a time: first to
        // check that it fits, then, once the parameters have loaded, to set it. So a resume
        // holds one state beside the run, not a copy of them all.
        let mut states: Vec<(String, String)> = self
            .train
            .params
            .iter()
            .flat_map(|p| p.states.iter().map(|s| (p.path.clone(), s.clone())))
            .collect();
        // In the file's order: the pages read around each state then belong to the next.
        states.sort_by_key(|(_, name)| optim.tensor(name).map_or(0, |t| t.data.as_ptr() as usize));
        for (path, name) in &states {
            let t = optim.tensor(name).map_err(|e| checkpoint_error(dir, e))?;
            let shape = self.state_share(path, t, dir).map(|share| share.shape);
            optim.release(t.data);
            let shape = shape?;
            match self.updater().shape_of(Stored::Input(name)) {
                Some(held) if held == shape.as_slice() => {}
                Some(held) => {
                    return Err(checkpoint_error(
                        dir,
                        format!(
                        "optimizer state `{name}` is {shape:?} for this rank, which holds {held:?}"
                    ),
                    ))
                }
                None => return Err(run_missing(name)),
            }
        }
        optim.release_all();
        // A pipeline stage takes its own parameters of the whole checkpoint, each cut to this
        // rank's share as `--weights` are.
        let here: Vec<String> = self.exec.param_paths().map(str::to_string).collect();
        let staged = self.stage.is_some();
        let mine = model
            .tensors()
            .filter(|t| !staged || here.iter().any(|h| h == t.name));
        if optim.len() != states.len() && !staged {
            return Err(checkpoint_error(
                dir,
                format!(
                "optimizer.safetensors holds {} tensors, but this train has {} optimizer states",
                optim.len(),
                states.len()
            ),
            ));
        }
        // Loading checks every weight before it writes any; the states were checked above, so
        // from here nothing is refused.
        let (splits, share) = self.tensor_share();
        let zero = self.train.zero.as_ref().map(|z| (z, self.replica.0));
        crate::ranks::load_rank_weights(&mut self.exec, &model, mine, &splits, share, zero)
            .map_err(|e| checkpoint_error(dir, e.message))?;
        model.release_all();
        for (path, name) in &states {
            let t = optim.tensor(name).map_err(|e| checkpoint_error(dir, e))?;
            let share = self.state_share(path, t, dir);
            let set = share.and_then(|share| self.set_state(name, t, share, dir));
            optim.release(t.data);
            set?;
        }
        optim.release_all();
        self.state = state;
        if self.state.loss_scaling != self.train.loss_scale.to_string() {
            // Another manager (another precision): this one starts from its own initial scale.
            self.state.loss_scaling = self.train.loss_scale.to_string();
            self.state.scale = self.train.loss_scale.initial();
        }
        self.order = self.epoch_order(self.state.epoch);
        Ok(())
    }

    /// Sets optimizer state `name` to `share`, this rank's share of the checkpoint's tensor `t`
    /// (of `dir`), straight from its stored bytes when they are floats `.npy` knows, and notes
    /// what the read held beside the run: the pages of the file the cut read, the block it
    /// copied (if it did), and a slice's f32 values.
    fn set_state(
        &mut self,
        name: &str,
        t: TensorRef<'_>,
        share: StateShare,
        dir: &Path,
    ) -> Res<()> {
        let (read, copied) = crate::ranks::block_cost(t.shape, t.data.len(), share.dim, share.n);
        let slice = match &share.values {
            ShareValues::Stored(_) => 0,
            ShareValues::Slice(values) => 4 * values.len(),
        };
        let transient = (read + copied + slice) as u64;
        self.states_transient_bytes = self.states_transient_bytes.max(transient);
        let holder = match self.stage.as_mut() {
            Some(stage) => &mut stage.update,
            None => &mut self.exec,
        };
        let set = match (&share.values, npy_float(t.dtype)) {
            (ShareValues::Stored(bytes), Some(from)) => {
                holder.set_input_stored(name, &share.shape, from, bytes)
            }
            (ShareValues::Stored(bytes), None) => {
                let stored = TensorRef {
                    shape: &share.shape,
                    data: bytes,
                    ..t
                };
                let values = stored.to_f32().map_err(|e| checkpoint_error(dir, e))?;
                holder.set_input_f32(name, &share.shape, &values)
            }
            (ShareValues::Slice(values), _) => holder.set_input_f32(name, &share.shape, values),
        };
        set.map_err(|e| checkpoint_error(dir, e.message))
    }

    /// This rank's share of the whole optimizer state `t` of checkpoint `dir` (of parameter
    /// `path`): under tensor parallelism its block of the parameter's split dim, then under
    /// optimizer sharding its replica's slice (flat, as f32). The cuts are made on the stored
    /// bytes — a block in one run of them is not even copied — so only the share is ever
    /// converted: a rank never holds a whole state as f32.
    fn state_share<'t>(&self, path: &str, t: TensorRef<'t>, dir: &Path) -> Res<StateShare<'t>> {
        if !matches!(
            t.dtype,
            StDType::F32 | StDType::F16 | StDType::BF16 | StDType::F64
        ) {
            let stored = format!(
                "optimizer state `{}` is stored as {:?}, not floats",
                t.name, t.dtype
            );
            return Err(checkpoint_error(dir, stored));
        }
        let (dim, (part, n)) = match &self.tensor {
            Some((splits, share)) => (splits.get(path).copied(), *share),
            None => (None, (0, 1)),
        };
        let (shape, bytes) = crate::ranks::tensor_block(t, dim, part, n).ok_or_else(|| {
            checkpoint_error(
                dir,
                format!(
                    "`{path}` {:?} does not split into {n} blocks along dim {}, as this run's \
                     tensor parallelism splits it",
                    t.shape,
                    dim.unwrap_or_default()
                ),
            )
        })?;
        let Some(z) = &self.train.zero else {
            let values = ShareValues::Stored(bytes);
            return Ok(StateShare {
                shape,
                values,
                dim,
                n,
            });
        };
        let numel = shape.iter().product();
        let values =
            crate::ranks::zero_slice_f32(t.name, t.dtype, numel, &bytes, z, self.replica.0)
                .ok_or_else(|| {
                    checkpoint_error(dir, format!("`{}` does not hold its {shape:?}", t.name))
                })?
                .map_err(|e| checkpoint_error(dir, e))?;
        let shape = vec![values.len()];
        let values = ShareValues::Slice(values);
        Ok(StateShare {
            shape,
            values,
            dim,
            n,
        })
    }

    /// The executor of the update: it holds the optimizer states and outputs the gradients
    /// (a pipeline stage's update program; the step elsewhere).
    fn updater(&self) -> &Executor {
        self.stage.as_ref().map_or(&self.exec, |s| &s.update)
    }

    /// The trained parameters.
    pub fn params(&self) -> &[TrainedParam] {
        &self.train.params
    }
}

/// This rank's collectives, which a rank that gathers or exchanges must have (E0973
/// otherwise).
fn comm(exec: &mut Executor) -> Res<&mut (dyn Collectives + 'static)> {
    exec.collectives()
        .ok_or_else(|| TrainRunError::new(Code::E0973, "this rank has no collectives"))
}

/// Sets each of the inputs `names` to zeros.
fn zero_inputs(exec: &mut Executor, names: &[String]) -> Res<()> {
    for name in names {
        let ty = exec
            .module()
            .inputs()
            .find(|(n, _)| n == name)
            .map(|(_, v)| exec.module().values[v as usize].ty.clone());
        if let Some(ty) = ty {
            let shape: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
            let zeros = vec![0f32; shape.iter().product()];
            exec.set_input_f32(name, &shape, &zeros)
                .map_err(|e| data_error(e.message))?;
        }
    }
    Ok(())
}

/// The dropout seed of micro-batch `index` (counted over the whole run) under the train seed:
/// a pure function of the two, so a resumed run draws the masks a straight one would.
fn micro_seed(seed: u64, index: u64) -> i64 {
    SplitMix(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)).next() as i64
}

fn run_missing(name: &str) -> TrainRunError {
    TrainRunError::new(
        Code::E0603,
        format!("the training module has no value `{name}`"),
    )
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A file of whole f32 tensors that a rank writes, or joins in writing when it is gathered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    /// A checkpoint's `model.safetensors`: the parameters and buffers.
    Model,
    /// A checkpoint's `optimizer.safetensors`: the optimizer states.
    Optimizer,
    /// `--dump-grads`' `grads.safetensors`: the last update's raw gradients.
    Grads,
}

/// A rank's share of an optimizer state read from a checkpoint ([`Trainer::state_share`]).
struct StateShare<'t> {
    /// Its shape as the rank holds it.
    shape: Vec<usize>,
    values: ShareValues<'t>,
    /// The tensor-parallel cut it was made by: the split dim, if any, and the members.
    dim: Option<usize>,
    n: usize,
}

/// The values of a [`StateShare`].
enum ShareValues<'t> {
    /// Its tensor-parallel block (or the whole state) as stored: borrowed from the file when
    /// one run of it, else a copy.
    Stored(Cow<'t, [u8]>),
    /// Its optimizer-sharding slice, as f32.
    Slice(Vec<f32>),
}

/// The `.npy` element type with the bytes of floats stored as `dtype`, when there is one
/// (bf16 has none).
fn npy_float(dtype: StDType) -> Option<NpyDType> {
    match dtype {
        StDType::F32 => Some(NpyDType::F32),
        StDType::F16 => Some(NpyDType::F16),
        StDType::F64 => Some(NpyDType::F64),
        _ => None,
    }
}

/// Where a rank holds a tensor of such a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// A parameter (or buffer) of the step.
    Param,
    /// An input of the update (an optimizer state).
    Input,
    /// An output of the update (a gradient).
    Output,
}

/// One tensor of a [`FileKind`]: its name in the file, where this rank holds its share, and
/// the parameter it follows when made whole (that parameter's split and slices).
#[derive(Clone, Debug)]
struct Piece {
    file: String,
    local: String,
    owner: String,
    held: Held,
}

impl Piece {
    fn new(file: &str, local: &str, owner: &str, held: Held) -> Piece {
        Piece {
            file: file.to_string(),
            local: local.to_string(),
            owner: owner.to_string(),
            held,
        }
    }

    /// The value an executor holds of it.
    fn stored(&self) -> Stored<'_> {
        match self.held {
            Held::Param => Stored::Param(&self.local),
            Held::Input => Stored::Input(&self.local),
            Held::Output => Stored::Output(&self.local),
        }
    }
}

/// The header entry of an f32 tensor.
fn f32_spec<'a>(name: &'a str, shape: &'a [usize]) -> TensorSpec<'a> {
    TensorSpec {
        name,
        dtype: StDType::F32,
        shape,
    }
}

/// SplitMix64: a small, fixed generator, so a shuffle is the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_fixed() {
        // The first outputs of SplitMix64 seeded with 0 (Vigna's reference implementation).
        let mut r = SplitMix(0);
        assert_eq!(r.next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next(), 0x6E78_9E6A_A1B9_65F4);
    }
}
