//! One pipeline stage's loop ([`Trainer::step`] of a step compiled by
//! [`crate::train::compile_train_stage`]) under the plan's schedule
//! ([`crate::pipeline::schedule_passes`]: PipeDream-Flush's 1F1B — stage `s` of `p` runs
//! `min(p − 1 − s, m)` forwards first, then alternates one forward with one backward, then
//! the backwards left, holding at most `p − s` micro-batches in flight — or GPipe's all
//! forwards then all backwards, or, when the stage is one chunk of a device under Megatron-LM's
//! interleaved schedule, its part of its device's order, each pass in its turn on the device
//! ([`crate::pipeline::Turns`])); the update follows the last backward. A forward runs the stage's forward program on the values received from the
//! stages before and sends what later stages read; a backward runs the stage's step on the
//! same received values (it recomputes the stage's forward, keeping only the received values
//! per micro-batch in flight) with the gradients of what it sent, accumulates its parameters'
//! gradients and sends the received values' gradients back. After the last backward each
//! stage runs its update program on its gradient sums, whose global norm and overflow check
//! sum over all stages (so clipping and loss-scale skipping agree everywhere), after the
//! stages holding a tied weight summed its gradients among them. BatchNorm's running
//! statistics are written back after each micro-batch's forward (the last stage's step). Rank 0 (the
//! first stage's) receives the loss from the last stage for the metrics, and every stage's
//! parameters and states for checkpoints.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use mslc_exec::collectives::Collectives;
use mslc_exec::Executor;
use mslc_io::npy::NpyArray;
use mslc_ir::shard::pipeline::StageCut;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{
    comm, data_error, micro_seed, run_missing, zero_inputs, FileKind, Res, StepMetrics,
    TrainRunError, Trainer,
};
use crate::pipeline::{recv_bytes, send_bytes, stage_passes, Pass, Turns};
use crate::train::{accumulator, grad_from, grad_of, write_backs, GRAD_NORM, LOSS, OVERFLOW};
use crate::train_mode::SEED;
use mslc_ir::shard::zero::DP_INDEX;
use mslc_plan::parallel::estimate::Schedule;

/// The files a pipeline gathers on its first stage, in the order they are settled.
const FILE_KINDS: [FileKind; 3] = [FileKind::Model, FileKind::Optimizer, FileKind::Grads];

/// A stage's tensors of one file, in order: each one's name and whole shape.
type Header = Vec<(String, Vec<usize>)>;

/// A stage's part in assembling a gathered file of one kind on the first stage
/// ([`Trainer::settle_stage_files`]).
#[derive(Debug)]
pub(super) enum StageFile {
    /// On the first stage: the file's tensors in order, each with its whole shape and the
    /// stage it comes from (0: this one).
    Writes(Vec<(String, Vec<usize>, usize)>),
    /// On a later stage: for each of its own tensors, in order, whether the first stage takes
    /// it from this stage (not a tied weight that a lower stage holds too).
    Sends(Vec<bool>),
}

/// What a [`Trainer`] needs to run one stage of a pipeline.
pub struct StageRuntime {
    /// The stage's forward program (every stage but the last), which runs on the step's
    /// parameters, lent to it for each run ([`Executor::swap_params`]), and holds none of its own
    /// ([`Executor::borrowing`]).
    pub forward: Option<Executor>,
    /// What crosses the stage's cuts.
    pub cut: StageCut,
    /// This stage.
    pub stage: usize,
    /// The rank of each stage in this rank's row (the same replica and tensor-parallel
    /// member), indexed by stage.
    pub ranks: Vec<usize>,
    /// The pipeline's micro-batches per batch (the plan's `micro_batches`; an update runs
    /// `grad_accum` batches).
    pub micro_batches: usize,
    /// The order of the stage's passes (GPipe, 1F1B or interleaved).
    pub schedule: Schedule,
    /// The executor of the stage's update ([`crate::train::StageStep::update`]), which holds
    /// the optimizer states and, like the forward, borrows the step's parameters to update them
    /// (the step's trained parameters are the update's).
    pub update: Executor,
    /// Under an interleaved schedule, the turns of the chunk-stages of this stage's device
    /// (shared with them), and how long it waits for its turn.
    pub turns: Option<Arc<Turns>>,
    /// How long a chunk-stage waits for its turn on its device before it stops (E0973).
    pub turn_timeout: Duration,
}

/// A value received from another stage: the input it sets, its shape and its values (kept as
/// received, with no array copy beside them).
struct Message {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl Message {
    /// Sets `exec`'s input of this message's name to it.
    fn set_into(&self, exec: &mut Executor) -> Res<()> {
        exec.set_input_f32(&self.name, &self.shape, &self.values)
            .map_err(|e| data_error(e.message))
    }
}

/// Values received for one micro-batch in flight.
type Received = Vec<Message>;

impl Trainer {
    /// Makes this the loop of one pipeline stage: `runtime` its forward and update (set up by
    /// [`Executor::borrowing`]: they run on the step's parameters), cut and peers, each run of
    /// its step one micro-batch of `batch` samples. The loop takes batches of the pipeline's
    /// micro-batches × `batch` samples, as one device takes the train's batch, so its position
    /// (and checkpoints) count the same batches one device counts.
    pub fn run_as_stage(&mut self, runtime: StageRuntime, batch: usize) -> Res<()> {
        let whole = batch * runtime.micro_batches.max(1);
        if self.data.samples < whole {
            return Err(data_error(format!(
                "--data holds {} samples, fewer than one batch of {whole} ({} micro-batches × \
                 {batch})",
                self.data.samples, runtime.micro_batches
            )));
        }
        self.batch = whole;
        self.state.batch = (whole * self.replica.1) as u64;
        let mut runtime = runtime;
        let update = &mut runtime.update;
        let states: Vec<String> = (self.train.params.iter())
            .flat_map(|p| p.states.clone())
            .collect();
        zero_inputs(update, &states)?;
        // Under optimizer sharding the update works on this replica's slices.
        if update.module().inputs().any(|(n, _)| n == DP_INDEX) {
            let index = NpyArray::from_i64(vec![], &[self.replica.0 as i64])
                .map_err(|e| data_error(e.to_string()))?;
            update
                .set_input(DP_INDEX, &index)
                .map_err(|e| data_error(e.message))?;
        }
        self.stage = Some(runtime);
        self.settle_stage_files()
    }

    /// A pipeline stage's other executors (its forward's and its update's); none elsewhere.
    pub fn stage_executors(&self) -> Vec<&Executor> {
        let Some(stage) = &self.stage else {
            return Vec::new();
        };
        stage.forward.iter().chain([&stage.update]).collect()
    }

    /// One update of a stage: the 1F1B schedule over its micro-batches, then its update.
    pub(super) fn stage_step(&mut self) -> Res<StepMetrics> {
        let start = std::time::Instant::now();
        let (lr, loss_scale) = self.set_update_scalars()?;
        let micro = self.train.grad_accum as usize;
        let per_batch = self.stage.as_ref().map_or(1, |s| s.micro_batches.max(1));
        let size = (self.batch / per_batch).max(1);
        let mut rows: Vec<Vec<usize>> = Vec::with_capacity(micro);
        for _ in 0..micro / per_batch {
            rows.extend(self.next_rows().chunks(size).map(<[usize]>::to_vec));
        }
        let first = self.state.step * micro as u64;
        let seeds: Vec<i64> = (0..micro as u64)
            .map(|j| micro_seed(self.state.seed, first + j))
            .collect();
        let Some(mut stage) = self.stage.take() else {
            return Err(run_missing("the pipeline stage"));
        };
        let ran = self.run_schedule(&mut stage, &rows, &seeds, loss_scale);
        let finished = ran.and_then(|losses| {
            let (skipped, grad_norm) = self.stage_update(&mut stage)?;
            let loss = self.stage_loss(&stage, losses)?;
            Ok((loss, grad_norm, skipped))
        });
        self.stage = Some(stage);
        let (loss, grad_norm, skipped) = finished?;
        let scalars = (lr, loss_scale);
        Ok(self.step_done(loss / micro as f64, scalars, grad_norm, skipped, start))
    }

    /// Runs the micro-batches `rows` (with their dropout `seeds`) through this stage in its
    /// schedule's order (under an interleaved one, each pass in its turn on the device); the
    /// sum of their losses (on the last stage; 0 on the others).
    fn run_schedule(
        &mut self,
        stage: &mut StageRuntime,
        rows: &[Vec<usize>],
        seeds: &[i64],
        loss_scale: f64,
    ) -> Res<f64> {
        let mut in_flight: VecDeque<Received> = VecDeque::new();
        let mut losses = 0.0;
        let (stages, micro) = (stage.ranks.len(), rows.len());
        // Each pass, with its position in the device's order under an interleaved schedule.
        let passes = stage_passes(stage.schedule, stages, stage.stage, micro);
        let chunks = stage.schedule.chunks().max(1) as usize;
        for (position, pass) in passes {
            let turn = stage.turns.clone().zip(position);
            let waited = match &turn {
                Some((device, position)) => device
                    .wait(self.state.step, *position, stage.turn_timeout)
                    .map_err(TrainRunError::of_run),
                None => Ok(()),
            };
            let ran = waited.and_then(|()| match pass {
                Pass::Forward(j) => self
                    .stage_forward(stage, &rows[j], seeds[j])
                    .map(|received| in_flight.push_back(received)),
                Pass::Backward(i) => {
                    let last = i + 1 == micro;
                    in_flight
                        .pop_front()
                        .ok_or_else(|| run_missing("a micro-batch in flight"))
                        .and_then(|received| {
                            self.stage_backward(
                                stage, &rows[i], seeds[i], received, last, loss_scale,
                            )
                        })
                        .map(|loss| losses += loss)
                }
            });
            // A chunk that fails, waiting or running, releases its device's other chunks.
            match (&turn, ran) {
                (Some((device, _)), Err(e)) => {
                    device.abandon();
                    return Err(e);
                }
                (Some((device, _)), Ok(())) => device.pass(2 * micro * chunks),
                (None, ran) => ran?,
            }
        }
        Ok(losses)
    }

    /// The backward of one micro-batch on this stage: the step run on the values its forward
    /// `received` and the gradients of what it sent, its parameters' gradients accumulated
    /// (unless it is the update's `last`, whose sums the update reads) and the received
    /// values' gradients sent back; its loss on the last stage (0 elsewhere).
    fn stage_backward(
        &mut self,
        stage: &mut StageRuntime,
        rows: &[usize],
        seed: i64,
        received: Received,
        last: bool,
        loss_scale: f64,
    ) -> Res<f64> {
        self.data.feed(&mut self.exec, rows)?;
        set_seed(&mut self.exec, seed)?;
        for message in &received {
            message.set_into(&mut self.exec)?;
        }
        for c in &stage.cut.sends {
            let name = grad_from(&c.name, c.peer);
            receive(&mut self.exec, &name, stage.ranks[c.peer])?.set_into(&mut self.exec)?;
        }
        self.exec.run().map_err(|e| self.run_error(e, loss_scale))?;
        let mut loss = 0.0;
        if stage.cut.outputs.iter().any(|o| o == LOSS) {
            loss = self.scalar(LOSS);
            // The last stage's step is its forward: it updates its running statistics.
            let buffers = self.train.buffers.iter().map(String::as_str);
            self.exec
                .write_back(buffers)
                .map_err(TrainRunError::of_run)?;
        }
        for c in &stage.cut.receives {
            self.exec
                .send_output(&grad_of(&c.name), stage.ranks[c.peer])
                .map_err(TrainRunError::of_run)?;
        }
        if !last {
            let sums = self.train.accumulators.iter().map(String::as_str);
            self.exec.write_back(sums).map_err(TrainRunError::of_run)?;
        }
        Ok(loss)
    }

    /// The forward of one micro-batch on this stage: receives what it reads from the stages
    /// before, runs the forward program (every stage but the last) and sends what later
    /// stages read; the received values, which its backward reads again.
    fn stage_forward(
        &mut self,
        stage: &mut StageRuntime,
        rows: &[usize],
        seed: i64,
    ) -> Res<Received> {
        let mut received = Vec::with_capacity(stage.cut.receives.len());
        for c in &stage.cut.receives {
            received.push(receive(&mut self.exec, &c.name, stage.ranks[c.peer])?);
        }
        let Some(forward) = stage.forward.as_mut() else {
            return Ok(received);
        };
        self.data.feed(forward, rows)?;
        set_seed(forward, seed)?;
        for message in &received {
            message.set_into(forward)?;
        }
        // The forward's collectives (tensor parallelism within the stage) and parameters are
        // this rank's; it updates the stage's running statistics, once per micro-batch.
        let buffers = self.train.buffers.iter().map(String::as_str);
        run_on_params_of(&mut self.exec, forward, |forward| {
            forward.write_back(buffers).map_err(TrainRunError::of_run)
        })?;
        for c in &stage.cut.sends {
            let values = forward
                .output_values(&c.name)
                .ok_or_else(|| run_missing(&c.name))?;
            comm(&mut self.exec)?
                .send(stage.ranks[c.peer], &values)
                .map_err(TrainRunError::of_run)?;
        }
        Ok(received)
    }

    /// The stage's update after its last backward: the step's gradient sums handed to the
    /// update program, run on this rank's parameters and with its collectives (the global
    /// norm and overflow check sum over every stage), the new parameters and states kept
    /// (unless the loss scaling skips the update: every stage sees the same overflow) in the
    /// buffers the step and the forward borrow. Whether the update was skipped, and the global
    /// norm.
    fn stage_update(&mut self, stage: &mut StageRuntime) -> Res<(bool, f64)> {
        for name in &self.train.accumulators {
            let (shape, mut values) = self
                .exec
                .output_f32(name)
                .ok_or_else(|| run_missing(name))?;
            let tied = stage
                .cut
                .shared
                .iter()
                .find(|p| accumulator(&p.path) == *name);
            if let Some(tied) = tied {
                values = sum_over_stages(&mut self.exec, stage, &tied.stages, values)?;
            }
            let array =
                NpyArray::from_f32(shape, &values).map_err(|e| data_error(e.to_string()))?;
            stage
                .update
                .set_input(name, &array)
                .map_err(|e| data_error(e.message))?;
        }
        zero_inputs(&mut self.exec, &self.train.accumulators)?;
        let update = &mut stage.update;
        let trained = &self.train.params;
        let skipped = run_on_params_of(&mut self.exec, update, |update| {
            let overflow = update
                .output_f32(OVERFLOW)
                .is_some_and(|(_, v)| v[0] != 0.0);
            let skipped = self
                .train
                .loss_scale
                .after_step(&mut self.state.scale, overflow);
            if !skipped {
                update
                    .write_back(write_backs(trained))
                    .map_err(TrainRunError::of_run)?;
            }
            Ok(skipped)
        })?;
        let norm = update
            .output_f32(GRAD_NORM)
            .map_or(f64::NAN, |(_, v)| f64::from(v[0]));
        if skipped {
            self.state.skipped += 1;
            return Ok((true, norm));
        }
        self.state.updates += 1;
        Ok((false, norm))
    }

    /// The update's loss sum on the first stage, which receives it from the last; this
    /// stage's own (0 but on the last) elsewhere.
    fn stage_loss(&mut self, stage: &StageRuntime, losses: f64) -> Res<f64> {
        let last = stage.ranks.len() - 1;
        let comm = comm(&mut self.exec)?;
        match stage.stage {
            s if s == last => {
                if s != 0 {
                    send_bytes(comm, stage.ranks[0], &losses.to_le_bytes())
                        .map_err(TrainRunError::of_run)?;
                }
                Ok(losses)
            }
            0 => {
                let bytes = recv_bytes(comm, stage.ranks[last]).map_err(TrainRunError::of_run)?;
                let bytes: [u8; 8] = bytes
                    .try_into()
                    .map_err(|_| data_error("the last stage's loss is not one f64".to_string()))?;
                Ok(f64::from_le_bytes(bytes))
            }
            _ => Ok(losses),
        }
    }

    /// Settles, once the stage is set up, how each gathered file is assembled (a collective
    /// of the row's stages): every stage sends the first stage its tensors' names and whole
    /// shapes for each [`FileKind`] (none for a kind whose shapes it cannot know: a gradient
    /// dump when the update does not expose its gradients); the first stage orders the file,
    /// takes a tied weight (its states, its gradient sum) from the lowest stage holding it, and
    /// tells each other stage which of its tensors it takes. So a save streams the file one
    /// tensor at a time ([`Trainer::assemble_file`]) and the plan knows the largest tensor
    /// the first stage receives ([`Trainer::file_staging_bytes`]).
    pub(super) fn settle_stage_files(&mut self) -> Res<()> {
        let Some((me, ranks)) = (self.stage.as_ref()).map(|s| (s.stage, s.ranks.clone())) else {
            return Ok(());
        };
        let headers: Vec<Option<Header>> = FILE_KINDS
            .iter()
            .map(|&kind| {
                let pieces = self.pieces(kind);
                let shapes = pieces
                    .iter()
                    .map(|p| Ok((p.file.clone(), self.whole_shape(kind, p)?)));
                shapes.collect::<Res<Vec<_>>>().ok()
            })
            .collect();
        let comm = comm(&mut self.exec)?;
        if me != 0 {
            send_json(comm, ranks[0], &headers)?;
            let taken: Vec<Option<Vec<bool>>> = recv_json(comm, ranks[0])?;
            self.stage_files = (FILE_KINDS.into_iter().zip(taken))
                .filter_map(|(kind, taken)| Some((kind, StageFile::Sends(taken?))))
                .collect();
            return Ok(());
        }
        let mut all = vec![headers];
        for &rank in &ranks[1..] {
            all.push(recv_json(comm, rank)?);
        }
        let mut taken: Vec<Vec<Option<Vec<bool>>>> = vec![Vec::new(); ranks.len()];
        let mut files = Vec::new();
        for (k, kind) in FILE_KINDS.into_iter().enumerate() {
            let lists: Option<Vec<&Header>> = all
                .iter()
                .map(|h| h.get(k).and_then(Option::as_ref))
                .collect();
            let Some(lists) = lists else {
                taken.iter_mut().for_each(|t| t.push(None));
                continue;
            };
            // Each name from the lowest stage holding it.
            let mut from: BTreeMap<&str, (usize, &[usize])> = BTreeMap::new();
            for (s, list) in lists.iter().enumerate() {
                for (name, shape) in list.iter() {
                    from.entry(name).or_insert((s, shape));
                }
            }
            for (s, list) in lists.iter().enumerate() {
                let mine = list
                    .iter()
                    .map(|(name, _)| from.get(name.as_str()).map(|f| f.0) == Some(s));
                taken[s].push(Some(mine.collect()));
            }
            let entries = (from.into_iter())
                .map(|(name, (s, shape))| (name.to_string(), shape.to_vec(), s))
                .collect();
            files.push((kind, StageFile::Writes(entries)));
        }
        for (s, &rank) in ranks.iter().enumerate().skip(1) {
            send_json(comm, rank, &taken[s])?;
        }
        self.stage_files = files;
        Ok(())
    }

    /// How this stage takes part in assembling file `kind` ([`Trainer::settle_stage_files`]).
    pub(super) fn stage_file(&self, kind: FileKind) -> Res<&StageFile> {
        let found = self.stage_files.iter().find(|(k, _)| *k == kind);
        found
            .map(|(_, file)| file)
            .ok_or_else(|| run_missing(&format!("the stages' layout of the {kind:?} file")))
    }

    /// A later stage's part in assembling file `kind` on the first stage
    /// ([`Trainer::assemble_file`]): each of its tensors made whole in order (the gathers of
    /// its groups), and those the first stage takes (`taken`) sent to it when it asks, so that
    /// the stage never runs ahead of the file.
    pub(super) fn send_to_first_stage(&mut self, kind: FileKind, taken: &[bool]) -> Res<()> {
        let first = match &self.stage {
            Some(stage) => stage.ranks[0],
            None => return Err(run_missing("the pipeline stage")),
        };
        for (piece, &take) in self.pieces(kind).iter().zip(taken) {
            let values = self.whole(kind, piece)?;
            if take {
                let comm = comm(&mut self.exec)?;
                comm.recv(first, &mut []).map_err(TrainRunError::of_run)?;
                comm.send(first, &values).map_err(TrainRunError::of_run)?;
            }
        }
        Ok(())
    }

    /// On a pipeline's first stage, asks stage `from` (`rank`) for its next tensor of the
    /// file, of `len` values ([`Trainer::send_to_first_stage`]).
    pub(super) fn receive_from_stage(&mut self, rank: usize, len: usize) -> Res<Vec<f32>> {
        let comm = comm(&mut self.exec)?;
        let mut values = vec![0f32; len];
        comm.send(rank, &[]).map_err(TrainRunError::of_run)?;
        comm.recv(rank, &mut values)
            .map_err(TrainRunError::of_run)?;
        Ok(values)
    }
}

/// A tied weight's gradient sum `mine` summed over `stages` (every stage holding the weight,
/// ascending), in stage order so that each of them gets the same bits: exchanged with each
/// other stage — the lower of a pair sends first, so blocking sends cannot wait on each other.
fn sum_over_stages(
    exec: &mut Executor,
    stage: &StageRuntime,
    stages: &[usize],
    mine: Vec<f32>,
) -> Res<Vec<f32>> {
    let mut parts: Vec<(usize, Vec<f32>)> = Vec::with_capacity(stages.len());
    for &other in stages.iter().filter(|&&t| t != stage.stage) {
        let comm = comm(exec)?;
        let peer = stage.ranks[other];
        let mut theirs = vec![0f32; mine.len()];
        if stage.stage < other {
            comm.send(peer, &mine).map_err(TrainRunError::of_run)?;
            comm.recv(peer, &mut theirs)
                .map_err(TrainRunError::of_run)?;
        } else {
            comm.recv(peer, &mut theirs)
                .map_err(TrainRunError::of_run)?;
            comm.send(peer, &mine).map_err(TrainRunError::of_run)?;
        }
        parts.push((other, theirs));
    }
    parts.push((stage.stage, mine));
    parts.sort_by_key(|(s, _)| *s);
    let mut parts = parts.into_iter().map(|(_, p)| p);
    let mut total = parts.next().unwrap_or_default();
    for part in parts {
        for (t, p) in total.iter_mut().zip(&part) {
            *t += p;
        }
    }
    Ok(total)
}

/// Receives the value of input `name` of `exec`'s module (of its shape, as f32) from `from`.
fn receive(exec: &mut Executor, name: &str, from: usize) -> Res<Message> {
    let shape: Vec<usize> = exec
        .module()
        .inputs()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| {
            let ty = &exec.module().values[v as usize].ty;
            ty.shape.iter().map(|&d| d.max(0) as usize).collect()
        })
        .ok_or_else(|| run_missing(name))?;
    let mut values = vec![0f32; shape.iter().product()];
    comm(exec)?
        .recv(from, &mut values)
        .map_err(TrainRunError::of_run)?;
    Ok(Message {
        name: name.to_string(),
        shape,
        values,
    })
}

fn set_seed(exec: &mut Executor, seed: i64) -> Res<()> {
    if !exec.module().inputs().any(|(n, _)| n == SEED) {
        return Ok(());
    }
    let array = NpyArray::from_i64(vec![], &[seed]).map_err(|e| data_error(e.to_string()))?;
    exec.set_input(SEED, &array)
        .map_err(|e| data_error(e.message))
}

/// Runs `program` (a stage's forward or update) on what `rank` holds: its parameters, lent
/// for the run and for `then` (the update's write-back of the new values), and its
/// collectives; both handed back whether or not the run and `then` succeed.
fn run_on_params_of<T>(
    rank: &mut Executor,
    program: &mut Executor,
    then: impl FnOnce(&mut Executor) -> Res<T>,
) -> Res<T> {
    rank.swap_params(program).map_err(TrainRunError::of_run)?;
    if let Some(comm) = rank.take_collectives() {
        program.set_collectives(comm);
    }
    let ran = program
        .run()
        .map_err(TrainRunError::of_run)
        .and_then(|()| then(program));
    if let Some(comm) = program.take_collectives() {
        rank.set_collectives(comm);
    }
    rank.swap_params(program).map_err(TrainRunError::of_run)?;
    ran
}

/// `value` as JSON to `to`.
fn send_json(comm: &mut dyn Collectives, to: usize, value: &impl Serialize) -> Res<()> {
    let json = serde_json::to_vec(value).map_err(|e| data_error(e.to_string()))?;
    send_bytes(comm, to, &json).map_err(TrainRunError::of_run)
}

/// The value [`send_json`] sent from `from`.
fn recv_json<T: DeserializeOwned>(comm: &mut dyn Collectives, from: usize) -> Res<T> {
    let json = recv_bytes(comm, from).map_err(TrainRunError::of_run)?;
    serde_json::from_slice(&json).map_err(|e| data_error(e.to_string()))
}
