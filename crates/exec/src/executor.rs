//! The executor: runs a compiled [`Module`] on the CPU. Setup allocates everything — one
//! 64-byte-aligned arena for all intermediates, one buffer per input and per parameter, staging
//! buffers for dtype conversion — and prepares every step's kernel; `run` then only converts,
//! dispatches and times. Steps the planner hoisted (their outputs depend on parameters alone: a
//! weight cast to f16 under mixed precision, a transposed weight) write the planned hoisted
//! region, run once after the parameters change and are skipped by later runs. So are the
//! weights a matmul reads packed: packed into their own region by the first run after the
//! parameters change, read from there by every run. The buffers the plan sizes are allocated
//! exactly as planned; a difference is an internal error.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use mslc_artifact::runtime::{CopyStep, PreparedStep, RuntimeNeeds};
use mslc_artifact::training::STEP_SCALES;
use mslc_artifact::validate::validate;
use mslc_artifact::{Module, Step, Storage};
use mslc_core::ops::{DType, TensorType};
use mslc_core::program::Init;
use mslc_io::npy::{NpyArray, NpyDType, NpyView};
use mslc_io::safetensors::TensorRef as StTensor;
use mslc_kernels::elementwise::{fused_elementwise, ElementwiseParams, Program};
use mslc_kernels::par;
use mslc_kernels::scratch::try_warm;
use mslc_kernels::step::needs::SCRATCH_BUFFERS;
use mslc_kernels::step::{OperandMode as Mode, Operands, StepKernel, MAX_OUTPUTS};
use mslc_kernels::KernelError;
use mslc_kernels::TensorRef;

use super::buffer::AlignedBuf;
use super::collectives::overlap::{share_bytes, CommThread, Overlap};
use super::collectives::{step::run_collective, Collectives};
use super::error::{ExecError, ExecErrorKind, ExecResult};
use super::inputs::{fill_input, fill_input_f32, fill_input_raw, fill_input_rows};
use super::limits::exact_bytes;
use super::numerics::{F32Result, NumericsFault, OperandRange};
use super::profile::{chrome_trace, StepTime, WorkerTimes};
use super::storage::{
    convert_bytes, draw_into, f32_view, load_f32, load_i64, load_rows_f32, store_f32,
};
use super::{init, weights};
use mslc_core::units::human_bytes;
use mslc_kernels::step::CollectiveStep;

/// The values [`Executor::seed_input`] gave an input not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seeded {
    /// Floats drawn from N(0, 1): a model's activations, images, embeddings.
    Normal,
    /// Integers uniform in `[0, bound)`: ids or labels, below the rows of the table or the
    /// classes they index.
    Ids(u64),
    /// Zeros: integers that index nothing.
    Zeros,
    /// Zeros for state the module carries from run to run (an output of the same name: a
    /// training step's optimizer states and gradient sums), their value before the first
    /// update; drawn values would make an Adam second moment negative and the update NaN.
    State,
    /// 0 for a training step's learning rate and Adam's step size
    /// ([`mslc_artifact::training::STEP_SCALES`]): the step computes its gradients, norm,
    /// optimizer states and update, and leaves the parameters as they are. Any other value
    /// is made up, and Adam's first update, `lr · sign(g)` where a gradient is far above
    /// `eps`, would turn the rounding of gradients near 0 into differences of the whole
    /// learning rate between two equally right kernels (what a tuner compares).
    NoStep,
    /// 1 for another float scalar (Adam's bias correction, a loss scale, which then changes
    /// nothing): positive and finite, where N(0, 1) draws would flip a correction's sign or,
    /// as a loss scale, skip the step as overflowing.
    One,
}

impl Seeded {
    /// What the input holds, for a run's summary.
    pub fn describe(self) -> String {
        match self {
            Seeded::Normal => "N(0, 1) values".to_string(),
            Seeded::Ids(bound) => format!("ids in [0, {bound})"),
            Seeded::Zeros => "zeros".to_string(),
            Seeded::State => "zeros (state the step carries, before the first update)".to_string(),
            Seeded::NoStep => "0 (the update leaves the parameters as they are)".to_string(),
            Seeded::One => "1 (a float scalar)".to_string(),
        }
    }

    /// The integer bound used, if any.
    pub fn id_bound(self) -> Option<u64> {
        match self {
            Seeded::Ids(bound) => Some(bound),
            _ => None,
        }
    }
}

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct ExecOptions {
    /// Worker threads; 0 lets rayon choose (one per core).
    pub threads: usize,
    /// Refuse to set up when everything the executor allocates (parameters, inputs, arena,
    /// hoisted values, staging and per-thread scratch) would exceed this many bytes.
    pub memory_limit: Option<u64>,
}

/// Where a value's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// At this byte offset in the arena.
    Arena(usize),
    /// At this byte offset in the region of hoisted, parameter-only values.
    Hoisted(usize),
    /// In the buffer of input number N.
    Input(usize),
    /// In the buffer of parameter number N.
    Param(usize),
    /// In next-value buffer number N (the next value of an input or parameter).
    Next(usize),
}

/// A value's type and place, in the forms the run loop needs.
#[derive(Clone, Debug)]
struct Slot {
    place: Place,
    dtype: DType,
    shape: Vec<usize>,
    numel: usize,
    bytes: usize,
}

/// A step ready to run.
struct StepPlan {
    /// Its kernel and operand modes.
    prepared: PreparedStep,
    /// Depends on parameters alone: runs only after they change.
    hoisted: bool,
    /// Hoisted and reading no parameter, even indirectly (a constant, a rope table): runs once.
    constant: bool,
    /// An all-reduce that can run while the steps after it go on ([`overlappable`]).
    overlappable: bool,
}

/// Operand views kept on the stack up to this many inputs.
const INLINE_INPUTS: usize = 8;
const NO_TENSOR: TensorRef<'static> = TensorRef {
    data: &[],
    shape: &[],
};

/// Runs one module; see the module docs.
pub struct Executor {
    /// Its program, shared with the other executors of it (one per rank of a process).
    module: Arc<Module>,
    slots: Vec<Slot>,
    plans: Vec<StepPlan>,
    arena: AlignedBuf,
    hoisted: AlignedBuf,
    /// The hoisted values and the packed weights hold the current parameters' values.
    hoisted_ready: bool,
    /// The hoisted values that read no parameter have been computed.
    constants_ready: bool,
    /// The weights matmuls read packed ([`PreparedStep::packed_b`]).
    packed: AlignedBuf,
    inputs: Vec<AlignedBuf>,
    inputs_set: Vec<bool>,
    params: Vec<AlignedBuf>,
    params_ready: bool,
    /// Per parameter buffer, the stamp of what it holds ([`new_stamp`], renewed by every
    /// write), which moves with the buffer when [`Executor::swap_params`] lends it.
    param_stamps: Vec<u64>,
    /// The parameters' stamps when the hoisted values and packed weights were last computed:
    /// they are stale when a buffer lent back holds what another program wrote.
    hoisted_stamps: Vec<u64>,
    /// The next values of inputs and parameters, each exchanged with the buffer it replaces by
    /// [`Executor::write_back`].
    next: Vec<AlignedBuf>,
    in_stage: Vec<AlignedBuf>,
    int_stage: AlignedBuf,
    out_stage: AlignedBuf,
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
    times: Vec<Option<StepTime>>,
    /// What each pool thread did per step, when [`Executor::record_workers`] asked for it.
    workers: Option<WorkerTimes>,
    /// Whether each step's result is checked for NaN and infinity ([`Executor::check_numerics`]).
    check_numerics: bool,
    /// The most bytes a weights load held beside the buffers ([`Executor::load_transient_bytes`]).
    load_transient_bytes: u64,
    /// This rank's link to the others, for the collective steps of a per-rank program.
    comm: Option<Box<dyn Collectives>>,
    /// The thread that runs the all-reduces a run overlaps with its steps, started by the
    /// first such run.
    comm_thread: Option<CommThread>,
    /// Bytes of every buffer allocated here but the parameters' (which may be lent), and of
    /// the kernels' scratch of every pool thread.
    allocated_bytes: u64,
    /// Of those, the kernel scratch this program's threads hold.
    scratch_total: u64,
    /// The parameters the last run overwrote in place (kept across runs, so that a run
    /// allocates nothing for it).
    overwritten: Vec<usize>,
    /// The f32 each of a pool thread's scratch buffers holds: the largest any step asks.
    scratch_floats: usize,
}

/// A value [`Executor::f32_le`] reads: a parameter (or buffer) by path, an input by name, or
/// an output of the last run by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored<'a> {
    /// A parameter or buffer, by path.
    Param(&'a str),
    /// An input, by name (a training step's optimizer states are inputs).
    Input(&'a str),
    /// An output of the last run, by name.
    Output(&'a str),
}

/// The value in `bytes`, stored as `slot` says, as f32.
fn slot_f32(slot: &Slot, bytes: &[u8]) -> Vec<f32> {
    let mut values = vec![0f32; slot.numel];
    load_f32(slot.dtype, bytes, &mut values);
    values
}

fn module_error(message: impl Into<String>) -> ExecError {
    ExecError::new(ExecErrorKind::Module, message)
}

/// A stamp no parameter buffer has held yet (0 is an empty buffer's).
fn new_stamp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn alloc(bytes: usize, what: &str) -> ExecResult<AlignedBuf> {
    AlignedBuf::zeroed(bytes).ok_or_else(|| {
        module_error(format!(
            "cannot allocate {bytes} bytes for {what}: out of memory"
        ))
    })
}

impl Executor {
    /// Checks `module` (indices, types, arena bounds, that no step's output overlaps its
    /// inputs except in place over input 0), prepares every step and allocates all buffers.
    /// `module` may be shared (an `Arc`), so that the ranks of one process hold one program.
    pub fn new(module: impl Into<Arc<Module>>, options: &ExecOptions) -> ExecResult<Executor> {
        Self::set_up(module.into(), options, None)
    }

    /// As [`Executor::new`], for a program that runs on `lender`'s parameters, lent for each
    /// run ([`Executor::swap_params`]) — a pipeline stage's forward and update beside its step
    /// — so it allocates no parameter buffer, and cannot run until it borrows them. It runs on
    /// `lender`'s threads too (the two never run at once): one pool per rank, whose threads
    /// keep the scratch the largest of its programs asks for (`options.threads` is the
    /// lender's).
    pub fn borrowing(
        module: impl Into<Arc<Module>>,
        lender: &Executor,
        options: &ExecOptions,
    ) -> ExecResult<Executor> {
        Self::set_up(module.into(), options, Some(Arc::clone(&lender.pool)))
    }

    /// Sets up `module` on a pool of its own and its own parameters, or on a lender's pool
    /// and parameters (`lender_pool`).
    fn set_up(
        module: Arc<Module>,
        options: &ExecOptions,
        lender_pool: Option<Arc<rayon::ThreadPool>>,
    ) -> ExecResult<Executor> {
        let own_params = lender_pool.is_none();
        validate(&module).map_err(|m| module_error(format!("invalid module: {m}")))?;
        let region = |bytes: u64, what: &str| {
            usize::try_from(bytes)
                .map_err(|_| module_error(format!("{what} does not fit in memory")))
        };
        let arena_bytes = region(module.arena_bytes, "the arena")?;
        let hoisted_bytes = region(module.hoisted_bytes, "the hoisted region")?;
        let slots = slots_of(&module)?;
        let needs =
            RuntimeNeeds::of(&module).map_err(|m| module_error(format!("invalid module: {m}")))?;
        let pool = match lender_pool {
            Some(pool) => pool,
            None => Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(options.threads)
                    .build()
                    .map_err(|e| {
                        ExecError::new(ExecErrorKind::Threads, format!("cannot start threads: {e}"))
                    })?,
            ),
        };
        let threads = pool.current_num_threads();
        let scratch_bytes = needs.scratch_bytes_per_thread();
        // The parameters' bytes when they are borrowed, not allocated here.
        let borrowed: u64 = (module.values.iter())
            .filter(|v| !own_params && matches!(v.storage, Storage::Param { .. }))
            .map(|v| v.ty.bytes())
            .sum();
        let planned = module.planned_bytes().saturating_sub(borrowed);
        let staging = needs.staging.bytes();
        let packed_bytes = needs.packed_bytes();
        if let Some(limit) = options.memory_limit {
            // The plan's buffers (parameters, inputs, arena, hoisted region), its staging, and
            // the kernels' scratch for each of this run's threads, with what the most
            // demanding step allocates while it runs.
            let scratch_total = scratch_bytes
                .saturating_mul(threads as u64)
                .saturating_add(needs.scratch_bytes_while_running());
            let need = planned
                .saturating_add(staging)
                .saturating_add(packed_bytes)
                .saturating_add(scratch_total);
            if need > limit {
                return Err(ExecError::new(
                    ExecErrorKind::Memory,
                    format!(
                        "running `{}` needs {} (planned buffers {}, staging {}, packed weights {}, scratch {} for {threads} threads), but only {} may be used",
                        module.name,
                        exact_bytes(need),
                        human_bytes(planned),
                        human_bytes(staging),
                        human_bytes(packed_bytes),
                        human_bytes(scratch_total),
                        exact_bytes(limit)
                    ),
                ));
            }
        }
        let buffers = |pick: fn(&Storage) -> bool, what: &str| -> ExecResult<Vec<AlignedBuf>> {
            module
                .values
                .iter()
                .zip(&slots)
                .filter(|(v, _)| pick(&v.storage))
                .map(|(_, s)| alloc(s.bytes, what))
                .collect()
        };
        let inputs = buffers(|s| matches!(s, Storage::Input { .. }), "an input")?;
        let params = match own_params {
            true => buffers(|s| matches!(s, Storage::Param { .. }), "a parameter")?,
            false => (module.values.iter())
                .filter(|v| matches!(v.storage, Storage::Param { .. }))
                .map(|_| AlignedBuf::empty())
                .collect(),
        };
        let next = buffers(|s| matches!(s, Storage::Next { .. }), "an updated value")?;
        let warmed = pool.broadcast(|_| try_warm(needs.scratch_floats, SCRATCH_BUFFERS));
        if !warmed.iter().all(|&ok| ok) {
            return Err(module_error(format!(
                "cannot allocate {scratch_bytes} bytes of scratch for each of {threads} threads: out of memory"
            )));
        }
        let arena = alloc(arena_bytes, "the arena")?;
        let hoisted = alloc(hoisted_bytes, "parameter-only values")?;
        let in_stage = needs
            .staging
            .inputs
            .iter()
            .map(|&b| alloc(b, "staging"))
            .collect::<ExecResult<Vec<_>>>()?;
        let int_stage = alloc(needs.staging.ints, "staging")?;
        let out_stage = alloc(needs.staging.out, "staging")?;
        let packed = alloc(
            region(packed_bytes, "the packed weights")?,
            "packed weights",
        )?;
        let allocated = [&arena, &hoisted, &int_stage, &out_stage, &packed]
            .into_iter()
            .chain(&inputs)
            .chain(&params)
            .chain(&next)
            .chain(&in_stage)
            .map(|b| b.len() as u64)
            .sum();
        check_allocation(
            allocated,
            planned.saturating_add(staging).saturating_add(packed_bytes),
        )?;
        // Without the parameters', which `allocated_bytes()` adds as they are lent and returned.
        let own_param_bytes: u64 = params.iter().map(|b| b.len() as u64).sum();
        let scratch_total = scratch_bytes.saturating_mul(threads as u64);
        let allocated_bytes = (allocated - own_param_bytes).saturating_add(scratch_total);
        let mut reads_params: Vec<bool> = module
            .values
            .iter()
            .map(|v| matches!(v.storage, Storage::Param { .. }))
            .collect();
        let plans = needs
            .steps
            .into_iter()
            .zip(&module.steps)
            .enumerate()
            .map(|(s, (prepared, step))| {
                let params = step.inputs.iter().any(|&i| reads_params[i as usize]);
                for &o in &step.outputs {
                    reads_params[o as usize] = params;
                }
                let hoisted = matches!(slots[step.outputs[0] as usize].place, Place::Hoisted(_));
                let next = module.steps.get(s + 1);
                StepPlan {
                    overlappable: overlappable(&prepared, step, next, &slots),
                    prepared,
                    hoisted,
                    constant: hoisted && !params,
                }
            })
            .collect();
        Ok(Executor {
            slots,
            plans,
            arena,
            hoisted,
            hoisted_ready: false,
            constants_ready: false,
            packed,
            inputs_set: vec![false; inputs.len()],
            inputs,
            params_ready: params.is_empty(),
            param_stamps: params
                .iter()
                .map(|_| if own_params { new_stamp() } else { 0 })
                .collect(),
            hoisted_stamps: Vec::new(),
            params,
            next,
            in_stage,
            int_stage,
            out_stage,
            pool,
            threads,
            times: vec![None; module.steps.len()],
            workers: None,
            check_numerics: false,
            load_transient_bytes: 0,
            comm: None,
            comm_thread: None,
            scratch_floats: needs.scratch_floats,
            module,
            allocated_bytes,
            scratch_total,
            overwritten: Vec::new(),
        })
    }

    /// The memory this executor holds, measured from its allocations: every buffer (arena,
    /// hoisted region, parameters, inputs, updated values, staging, packed weights) and each
    /// pool thread's kernel scratch — what one rank of a parallel run holds.
    pub fn allocated_bytes(&self) -> u64 {
        let params: u64 = self.params.iter().map(|b| b.len() as u64).sum();
        self.allocated_bytes.saturating_add(params)
    }

    /// What `executors` sharing one pool (a rank's step and, on a pipeline stage, its forward
    /// and update) allocate together: each one's buffers, the pool's scratch once — the
    /// largest any of them holds ready.
    pub fn allocated_together(executors: &[&Executor]) -> u64 {
        let buffers: u64 = (executors.iter())
            .map(|e| e.allocated_bytes() - e.scratch_total)
            .sum();
        let scratch = executors.iter().map(|e| e.scratch_total).max();
        buffers.saturating_add(scratch.unwrap_or(0))
    }

    /// Exchanges the buffers of the parameters `other`'s module reads with this executor's of
    /// the same path and type, buffers not copies: lends this executor's parameters to `other`
    /// (a program sharing them, set up by [`Executor::borrowing`] without its own), and
    /// the same call gives them back. A run of either updates what both see; each recomputes
    /// its hoisted values and packed weights when the buffers it holds were written since its
    /// last run. An executor whose parameters are lent out refuses to run. Fails, exchanging
    /// nothing, when a parameter of `other` has no match here.
    pub fn swap_params(&mut self, other: &mut Executor) -> ExecResult<()> {
        // Each parameter's path and type, in buffer order.
        fn index(m: &Module) -> Vec<(&str, &mslc_core::ops::TensorType)> {
            (m.values.iter())
                .filter_map(|v| match &v.storage {
                    Storage::Param { path, .. } => Some((path.as_str(), &v.ty)),
                    _ => None,
                })
                .collect()
        }
        let mine = index(&self.module);
        let mut pairs = Vec::new();
        for (j, (path, ty)) in index(&other.module).into_iter().enumerate() {
            let found = mine.iter().position(|&(p, t)| p == path && t == ty);
            let Some(i) = found else {
                return Err(module_error(format!(
                    "parameter `{path}` ({ty}) of the borrowing program has no match to lend"
                )));
            };
            pairs.push((i, j));
        }
        for (i, j) in pairs {
            std::mem::swap(&mut self.params[i], &mut other.params[j]);
            std::mem::swap(&mut self.param_stamps[i], &mut other.param_stamps[j]);
        }
        other.params_ready |= self.params_ready;
        Ok(())
    }

    /// Fails when a parameter buffer is lent to another program ([`Executor::swap_params`]) or
    /// was never had ([`Executor::borrowing`]): nothing may read or write the parameters here.
    fn params_here(&self) -> ExecResult<()> {
        let lent = self.slots.iter().any(|s| match s.place {
            Place::Param(i) => self.params[i].len() != s.bytes,
            _ => false,
        });
        match lent {
            true => Err(ExecError::new(
                ExecErrorKind::Weights,
                "the parameters are lent to another program (swap_params them back first)",
            )),
            false => Ok(()),
        }
    }

    /// The largest scratch request (f32) the memory plan counts for the module's steps, and
    /// the largest a kernel has asked of a pool thread so far: a request above the first would
    /// allocate outside the memory plan.
    pub fn scratch_floats(&self) -> (usize, usize) {
        let asked = self
            .pool
            .broadcast(|_| mslc_kernels::scratch::largest_request())
            .into_iter()
            .max()
            .unwrap_or(0);
        (self.scratch_floats, asked)
    }

    /// Gives the run the collectives its per-rank program's collective steps go through (this
    /// rank of a threads world, or of an MPI world); the steps that depend on this rank's place
    /// on a mesh axis (a dropout over its block of a split tensor) learn it from them.
    pub fn set_collectives(&mut self, comm: Box<dyn Collectives>) {
        let mesh = comm.mesh();
        let place = |axis: &str| Some(mesh.coord(comm.rank(), mesh.axis(axis).ok()?));
        for plan in &mut self.plans {
            plan.prepared.kernel.place_on(&place);
        }
        self.comm = Some(comm);
    }

    /// The collectives given by [`Executor::set_collectives`], if any.
    pub fn collectives(&mut self) -> Option<&mut (dyn Collectives + 'static)> {
        self.comm.as_deref_mut()
    }

    /// Takes the collectives back (to lend them to another executor of the same rank, such as
    /// a pipeline stage's forward).
    pub fn take_collectives(&mut self) -> Option<Box<dyn Collectives>> {
        self.comm.take()
    }

    /// The module being run.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Worker threads of the pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Bytes of the intermediate arena (one allocation).
    pub fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    /// Bytes of the region of hoisted, parameter-only values (one allocation).
    pub fn hoisted_bytes(&self) -> usize {
        self.hoisted.len()
    }

    /// Loads every parameter from `tensors` (e.g. a safetensors file), matched by path. Any
    /// missing, extra or mismatched tensor fails the whole load, all of them named at once;
    /// framework bookkeeping buffers are skipped and returned (name, what it is).
    pub fn load_weights<'a>(
        &mut self,
        tensors: impl IntoIterator<Item = StTensor<'a>>,
    ) -> ExecResult<Vec<(String, &'static str)>> {
        self.load_weights_with(tensors, |_| {})
    }

    /// [`Executor::load_weights`], calling `copied` with each tensor once its bytes are in
    /// their parameter: a file's tensors can then leave resident memory one at a time
    /// ([`mslc_io::safetensors::SafetensorsFile::release`]), so a load holds one tensor of the
    /// file beside the parameters, not all of it.
    pub fn load_weights_with<'a>(
        &mut self,
        tensors: impl IntoIterator<Item = StTensor<'a>>,
        copied: impl FnMut(StTensor<'a>),
    ) -> ExecResult<Vec<(String, &'static str)>> {
        self.load_weights_fetched(
            tensors,
            |t| Ok((Cow::Borrowed(t.data), t.data.len())),
            copied,
        )
    }

    /// [`Executor::load_weights_with`] where each tensor's bytes are had from `fetch` only
    /// when it is copied, once every tensor has been matched to its parameter by name, type
    /// and shape (which `tensors` give; their `data` is what `fetch` reads): a rank's share of
    /// a weight is then cut from the file one at a time, not all before loading. `fetch` also
    /// says how many bytes of `data` it read (the file's pages the share holds resident until
    /// `copied`). Bytes of the wrong size, or a `fetch` failure, stop the load there.
    pub fn load_weights_fetched<'s, 'd>(
        &mut self,
        tensors: impl IntoIterator<Item = StTensor<'s>>,
        mut fetch: impl FnMut(StTensor<'s>) -> Result<(Cow<'d, [u8]>, usize), String>,
        mut copied: impl FnMut(StTensor<'s>),
    ) -> ExecResult<Vec<(String, &'static str)>> {
        let params: Vec<(&str, &mslc_core::ops::TensorType)> = self
            .module
            .values
            .iter()
            .filter_map(|v| match &v.storage {
                Storage::Param { path, .. } => Some((path.as_str(), &v.ty)),
                _ => None,
            })
            .collect();
        self.params_here()?;
        let weights_error = |m: String| ExecError::new(ExecErrorKind::Weights, m);
        let found = weights::match_weights(&params, tensors)
            .map_err(|m| weights_error(format!("the weights do not fit the model:\n{m}")))?;
        self.param_stamps.iter_mut().for_each(|s| *s = new_stamp());
        self.params_ready = false;
        for ((buf, t), (_, ty)) in self.params.iter_mut().zip(found.tensors).zip(&params) {
            let dtype = weights::dtype_of(t.dtype);
            let (bytes, read) =
                fetch(t).map_err(|m| weights_error(format!("`{}`: {m}", t.name)))?;
            let numel = t.shape.iter().product::<usize>();
            let want = numel * t.dtype.size();
            if bytes.len() != want {
                return Err(weights_error(format!(
                    "`{}` has {} bytes, but {} {:?} takes {want}",
                    t.name,
                    bytes.len(),
                    t.dtype,
                    t.shape
                )));
            }
            // Beside the buffers now: the pages of the file `fetch` read, the share it cut
            // from them, and the f32 values of a conversion.
            let cut = match &bytes {
                Cow::Owned(b) => b.len(),
                Cow::Borrowed(_) => 0,
            };
            let converted = if dtype == ty.dtype {
                buf.bytes_mut().copy_from_slice(&bytes);
                0
            } else {
                let mut values = vec![0f32; numel];
                load_f32(dtype, &bytes, &mut values);
                store_f32(ty.dtype, &values, buf.bytes_mut());
                4 * numel
            };
            let held = (read + cut + converted) as u64;
            self.load_transient_bytes = self.load_transient_bytes.max(held);
            drop(bytes);
            copied(t);
        }
        self.params_ready = true;
        self.hoisted_ready = false;
        Ok(found.ignored)
    }

    /// The most bytes any weights load into this executor held beside its buffers at once
    /// (one tensor's pages of the file, the rank's share cut from them, their conversion): a
    /// transient of the run that its memory plan adds ([`Executor::load_weights_fetched`]).
    pub fn load_transient_bytes(&self) -> u64 {
        self.load_transient_bytes
    }

    /// Initialises every parameter from its declared `init`, deterministically from `seed`.
    pub fn init_params(&mut self, seed: u64) {
        let drawn = self.init_params_with(|path, how, _, values| {
            init::fill(how, seed, path, values);
            Ok::<(), std::convert::Infallible>(())
        });
        match drawn {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// Sets every parameter, one at a time, to the f32 values `fill(path, init, type, values)`
    /// writes into a buffer of its type's element count: what a rank draws as its share of a
    /// parameter drawn whole, with one parameter's values beside the buffers at a time. The
    /// first error `fill` returns stops it (the parameters are then not ready to run). `fill`
    /// runs on this executor's threads, where [`init::fill`] draws in parallel.
    pub fn init_params_with<E: Send>(
        &mut self,
        fill: impl FnMut(&str, &Init, &TensorType, &mut [f32]) -> Result<(), E> + Send,
    ) -> Result<(), E> {
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.init_params_on_this_thread(fill))
    }

    /// [`Executor::init_params_with`] on the calling thread.
    fn init_params_on_this_thread<E>(
        &mut self,
        mut fill: impl FnMut(&str, &Init, &TensorType, &mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let params = self.module.values.iter().filter_map(|v| match &v.storage {
            Storage::Param { path, init, .. } => Some((path, init, &v.ty)),
            _ => None,
        });
        self.param_stamps.iter_mut().for_each(|s| *s = new_stamp());
        self.params_ready = false;
        for ((path, how, ty), buf) in params.zip(self.params.iter_mut()) {
            draw_into(ty, buf.bytes_mut(), |values| fill(path, how, ty, values))?;
        }
        self.params_ready = true;
        self.hoisted_ready = false;
        Ok(())
    }

    /// Sets input `name` from an array of its shape (ids as i32 or i64, floats as f16, f32 or
    /// f64, converted to the input's dtype).
    pub fn set_input(&mut self, name: &str, array: &NpyArray) -> ExecResult<()> {
        self.fill_input_with(name, |ty, dst| fill_input(name, ty, array, dst))
    }

    /// Sets float input `name` to `values` of shape `shape` (converted to the input's dtype),
    /// straight into its buffer: a resumed optimizer state, with no array copy beside it.
    pub fn set_input_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> ExecResult<()> {
        self.fill_input_with(name, |ty, dst| fill_input_f32(name, ty, shape, values, dst))
    }

    /// Sets input `name` to the `from` elements `bytes` of shape `shape` (a checkpoint's stored
    /// values, read in place), converted to the input's dtype as [`Executor::set_input`]
    /// converts an array's.
    pub fn set_input_stored(
        &mut self,
        name: &str,
        shape: &[usize],
        from: NpyDType,
        bytes: &[u8],
    ) -> ExecResult<()> {
        self.fill_input_with(name, |ty, dst| {
            fill_input_raw(name, ty, shape, from, bytes, dst)
        })
    }

    /// Sets input `name` to the samples `rows` of `array` (along its first axis), read
    /// straight into the input's buffer: a training batch drawn from a dataset.
    pub fn set_input_rows(
        &mut self,
        name: &str,
        array: &NpyArray,
        rows: &[usize],
    ) -> ExecResult<()> {
        self.fill_input_with(name, |ty, dst| fill_input_rows(name, ty, array, rows, dst))
    }

    /// Fills input `name`'s buffer with `fill` (given the input's type) and marks it set.
    fn fill_input_with(
        &mut self,
        name: &str,
        fill: impl FnOnce(&TensorType, &mut [u8]) -> Result<(), String>,
    ) -> ExecResult<()> {
        let (k, v) = self.input_index(name)?;
        let ty = &self.module.values[v as usize].ty;
        fill(ty, self.inputs[k].bytes_mut())
            .map_err(|m| ExecError::new(ExecErrorKind::Input, m))?;
        self.inputs_set[k] = true;
        Ok(())
    }

    /// The position of input `name` among the inputs, and its value.
    fn input_index(&self, name: &str) -> ExecResult<(usize, u32)> {
        self.module
            .inputs()
            .enumerate()
            .find(|(_, (n, _))| *n == name)
            .map(|(k, (_, v))| (k, v))
            .ok_or_else(|| {
                let names: Vec<&str> = self.module.inputs().map(|(n, _)| n).collect();
                ExecError::new(
                    ExecErrorKind::Input,
                    format!(
                        "the model has no input `{name}` (its inputs: {})",
                        names.join(", ")
                    ),
                )
            })
    }

    /// Inputs not set yet, by name.
    pub fn unset_inputs(&self) -> Vec<String> {
        self.module
            .inputs()
            .zip(&self.inputs_set)
            .filter(|(_, set)| !**set)
            .map(|((n, _), _)| n.to_string())
            .collect()
    }

    /// Sets input `name` to deterministic values from `seed`, for a run without data (timing,
    /// profiling, tuning): what [`Seeded`] says, by what the input is to the module.
    pub fn seed_input(&mut self, name: &str, seed: u64) -> ExecResult<Seeded> {
        let (k, v) = self.input_index(name)?;
        let ty = &self.module.values[v as usize].ty;
        let carried = self.module.outputs.iter().any(|(n, _)| n == name);
        let how = match (carried, ty.dtype.is_float(), ty.rank()) {
            (true, ..) => Seeded::State,
            (false, true, 0) if STEP_SCALES.contains(&name) => Seeded::NoStep,
            (false, true, 0) => Seeded::One,
            (false, true, _) => Seeded::Normal,
            (false, false, _) => self.index_bound(v).map_or(Seeded::Zeros, Seeded::Ids),
        };
        draw_into(ty, self.inputs[k].bytes_mut(), |values| match how {
            Seeded::State | Seeded::Zeros | Seeded::NoStep => values.fill(0.0),
            Seeded::One => values.fill(1.0),
            Seeded::Normal => {
                let normal = mslc_core::program::Init::Normal {
                    mean: 0.0,
                    std: 1.0,
                };
                init::fill(&normal, seed, name, values);
            }
            Seeded::Ids(b) => {
                let uniform = mslc_core::program::Init::Uniform {
                    low: 0.0,
                    high: b as f64,
                };
                init::fill(&uniform, seed, name, values);
                values
                    .iter_mut()
                    .for_each(|x| *x = x.floor().min((b - 1) as f32));
            }
        });
        self.inputs_set[k] = true;
        Ok(how)
    }

    /// The number of rows (embedding) or classes (cross-entropy) value `v` indexes.
    fn index_bound(&self, v: u32) -> Option<u64> {
        self.module
            .steps
            .iter()
            .zip(&self.plans)
            .find_map(|(step, plan)| {
                let j = plan.prepared.kernel.integer_input()?;
                if step.inputs.get(j) != Some(&v) {
                    return None;
                }
                let table = &self.module.values[step.inputs[1 - j] as usize].ty;
                let size = if j == 0 {
                    table.shape.first()
                } else {
                    table.shape.last()
                };
                size.map(|&s| s as u64).filter(|&s| s > 0)
            })
    }

    /// Runs every step once. Inputs must be set and parameters loaded or initialised.
    pub fn run(&mut self) -> ExecResult<()> {
        self.run_steps(None)
    }

    /// Runs only the steps the outputs `names` depend on (and the hoisted values, when stale):
    /// a training loop's earlier micro-batches, which keep their gradient sums and loss and
    /// not the update that the same module computes. The other outputs keep whatever they held.
    pub fn run_for(&mut self, names: &[&str]) -> ExecResult<()> {
        let needed = self.steps_for(names)?;
        self.run_steps(Some(&needed))
    }

    /// Per step, whether an output named in `names` depends on it.
    fn steps_for(&self, names: &[&str]) -> ExecResult<Vec<bool>> {
        let module = &self.module;
        let mut roots = Vec::with_capacity(names.len());
        for name in names {
            match module.outputs.iter().find(|(n, _)| n == name) {
                Some(&(_, v)) => roots.push(v),
                None => return Err(module_error(format!("no output `{name}` to compute"))),
            }
        }
        let mut needed = vec![false; module.steps.len()];
        let producers = module.producers();
        module.mark_steps_feeding(&producers, roots, &mut needed);
        // A guarded step runs only after its guard's flag is known.
        if let Some(g) = module.guard.filter(|g| g.guards_any(&needed)) {
            module.mark_steps_feeding(&producers, [g.flag], &mut needed);
        }
        Ok(needed)
    }

    /// Runs every step, or only those `needed` marks (hoisted steps whenever their values are
    /// stale, since the next run counts on them); a run whose guard's flag is not 0 ends
    /// before the guarded steps ([`mslc_artifact::Guard`]: the update is skipped).
    fn run_steps(&mut self, needed: Option<&[bool]>) -> ExecResult<()> {
        let missing = self.unset_inputs();
        if !missing.is_empty() {
            return Err(ExecError::new(
                ExecErrorKind::Input,
                format!("no value given for input(s): {}", missing.join(", ")),
            ));
        }
        if !self.params_ready {
            return Err(ExecError::new(
                ExecErrorKind::Weights,
                "the parameters have no values: load weights or initialise them from a seed",
            ));
        }
        self.params_here()?;
        if self.hoisted_stamps != self.param_stamps {
            self.hoisted_ready = false;
        }
        let Executor {
            module,
            slots,
            plans,
            arena,
            hoisted,
            hoisted_ready,
            constants_ready,
            packed,
            inputs,
            params,
            next,
            in_stage,
            int_stage,
            out_stage,
            pool,
            times,
            workers,
            threads,
            check_numerics,
            comm,
            comm_thread,
            overwritten,
            ..
        } = self;
        let threads = *threads;
        let busy_now = || -> Vec<u64> { (0..threads).map(par::busy_nanos).collect() };
        if let Some(w) = workers.as_mut() {
            w.busy = vec![Vec::new(); module.steps.len()];
        }
        par::record_busy(workers.is_some());
        overwritten.clear();
        // The guard of a run that computes a guarded step (and so the flag, `steps_for`).
        let guard = module
            .guard
            .filter(|g| needed.is_none_or(|n| g.guards_any(n)));
        let result = pool.install(|| {
            let mut mem = Memory {
                slots,
                arena: arena.as_mut_ptr(),
                hoisted: hoisted.as_mut_ptr(),
                packed: packed.f32s_mut(packed.len() / 4),
                repack: !*hoisted_ready,
                inputs: inputs.as_mut_ptr(),
                params: params.as_mut_ptr(),
                next: next.iter_mut().map(|b| b.as_mut_ptr()).collect(),
                overwritten,
            };
            let run_start = Instant::now();
            if let Some(w) = workers.as_mut() {
                w.loop_worker = rayon::current_thread_index().unwrap_or(0);
            }
            // A run with an all-reduce it need not wait for at once lends its collectives to the
            // executor's communication thread: not when every result is checked as it comes,
            // nor on one worker thread, which is never idle, so that the communication thread
            // could only take time from it (2 ranks of one thread on 2 cores: 0.97x).
            let comm = comm.as_deref_mut();
            let overlaps = !*check_numerics
                && threads > 1
                && comm.as_ref().is_some_and(|c| c.callable_from_any_thread())
                && plans.iter().any(|p| p.overlappable);
            let thread = match overlaps {
                true => Some(&*comm_thread.get_or_insert_with(CommThread::start))
                    .filter(|t| t.is_running()),
                false => None,
            };
            let at = |s: usize, e: ExecError| {
                let step = &module.steps[s];
                let at = format!("step {s} ({}{})", step.op, origin_suffix(&step.origin));
                ExecError::new(e.kind, format!("{at}: {}", e.message))
            };
            let mut touched = Vec::new();
            // Runs the steps, with the all-reduces overlapping them through `overlap`; whether
            // every step ran (not stopped by the guard).
            let mut run = |mut overlap: Option<&mut Overlap<'_>>,
                           mut comm: Option<&mut (dyn Collectives + 'static)>|
             -> ExecResult<bool> {
                for (s, (plan, step)) in plans.iter().zip(&module.steps).enumerate() {
                    if let Some(g) = guard.filter(|g| g.from as usize == s) {
                        if let Some(o) = overlap.as_mut() {
                            touched.clear();
                            // SAFETY: between steps no mutable view of the arena exists.
                            touched.push(unsafe { mem.address_range(g.flag) });
                            o.wait_touching(&touched).map_err(|e| at(s, e))?;
                        }
                        let mut flag = [0f32];
                        // SAFETY: between steps no mutable view of the arena exists.
                        load_f32(DType::F32, unsafe { mem.bytes(g.flag) }, &mut flag);
                        if flag[0] != 0.0 {
                            times[s..].fill(None);
                            // What the skipped steps would hoist is still to compute.
                            return Ok(false);
                        }
                    }
                    let ready = if plan.constant {
                        *constants_ready
                    } else {
                        *hoisted_ready
                    };
                    if (plan.hoisted && ready)
                        || (!plan.hoisted && needed.is_some_and(|n| !n[s]))
                        || plan.prepared.copy == Some(CopyStep::Unchanged)
                    {
                        times[s] = None;
                        continue;
                    }
                    if let Some(o) = overlap.as_mut() {
                        if o.has_pending() {
                            touched.clear();
                            let values = step.inputs.iter().chain(&step.outputs);
                            // SAFETY: between steps no mutable view of the arena exists.
                            touched.extend(values.map(|&v| unsafe { mem.address_range(v) }));
                            o.wait_touching(&touched).map_err(|e| at(s, e))?;
                        }
                        if let (true, StepKernel::Collective(c)) =
                            (plan.overlappable, &plan.prepared.kernel)
                        {
                            // Its time is known once it has run, at the end.
                            times[s] = None;
                            // SAFETY: as `run_step`'s; the output is left to the
                            // communication thread until a step touching it waits.
                            unsafe { mem.issue_all_reduce(plan, step, s, c, o) }
                                .map_err(|e| at(s, e))?;
                            continue;
                        }
                    }
                    let before = workers.as_ref().map(|_| busy_now());
                    // The operands the step writes over, kept as they were for its report.
                    let overwritten_operands = match *check_numerics {
                        // SAFETY: between steps no mutable view of the arena exists.
                        true => unsafe { mem.operands_written_over(step) },
                        false => Vec::new(),
                    };
                    // A collective on this thread takes the collectives back once the
                    // all-reduces before it are done.
                    let step_comm = match (&mut overlap, &plan.prepared.kernel) {
                        (Some(o), StepKernel::Collective(_)) => {
                            Some(o.collectives().map_err(|e| at(s, e))?)
                        }
                        _ => comm.as_deref_mut(),
                    };
                    let start = Instant::now();
                    // SAFETY: `new` validated that every arena value lies inside the arena
                    // and that a step's output overlaps none of its inputs except input 0
                    // exactly, which the plan's modes never view while the output is
                    // borrowed.
                    unsafe {
                        mem.run_step(
                            plan,
                            &step.inputs,
                            &step.outputs,
                            step_comm,
                            in_stage,
                            int_stage,
                            out_stage,
                        )
                    }
                    .map_err(|e| at(s, e))?;
                    if *check_numerics {
                        // SAFETY: the step is done; no mutable view of the arena exists.
                        let operands = CheckedOperands {
                            step,
                            saved: &overwritten_operands,
                        };
                        if let Some(fault) =
                            unsafe { mem.fault(s, plan, operands, module, out_stage) }
                        {
                            return Err(ExecError::numerics(fault));
                        }
                    }
                    times[s] = Some(StepTime {
                        start: start - run_start,
                        duration: start.elapsed(),
                        overlapped: false,
                    });
                    if let (Some(w), Some(before)) = (workers.as_mut(), before) {
                        w.busy[s] = busy_now()
                            .iter()
                            .zip(&before)
                            .map(|(after, before)| after.saturating_sub(*before))
                            .collect();
                    }
                }
                Ok(true)
            };
            // With the executor's communication thread taking the all-reduces, when it has one.
            let (every_step, spans) = match (thread, comm) {
                (Some(thread), Some(c)) => {
                    let mut overlap = Overlap::start(thread, c, run_start);
                    let stepped = run(Some(&mut overlap), None);
                    let (spans, waited) = overlap.finish();
                    (stepped.and_then(|every| waited.map(|()| every)), spans)
                }
                // Alone (no collectives to wait on, no rank beside it), the other threads stay
                // awake between the steps' parallel loops.
                (_, None) => (par::with_threads_awake(|| run(None, None)), Vec::new()),
                (_, c) => (run(None, c), Vec::new()),
            };
            for span in spans {
                times[span.step] = Some(StepTime {
                    start: span.start,
                    duration: span.duration,
                    overlapped: span.overlapped,
                });
            }
            if every_step? {
                *hoisted_ready = true;
                *constants_ready = true;
            }
            Ok(())
        });
        if result.is_ok() {
            self.hoisted_stamps.clone_from(&self.param_stamps);
        }
        // Values hoisted from (and weights packed of) a parameter the run overwrote, however it
        // ended, are stale.
        for &p in &self.overwritten {
            self.param_stamps[p] = new_stamp();
        }
        par::record_busy(false);
        result
    }

    /// From the next run on, checks every step's result for NaN and infinity and stops the run
    /// at the first that holds one, with an [`ExecErrorKind::Numerics`] error describing it
    /// (`--check-numerics`; costs one pass over each result).
    pub fn check_numerics(&mut self, on: bool) {
        self.check_numerics = on;
    }

    /// Records, from the next run on, how long each pool thread works in each step's parallel
    /// tasks, for the profile's one track per thread (costs two clock reads per task).
    pub fn record_workers(&mut self, on: bool) {
        self.workers = on.then(WorkerTimes::default);
    }

    /// The bytes of output `name` as stored (its dtype), or `None` for an unknown name.
    fn output_slot(&self, name: &str) -> Option<(&Slot, &[u8])> {
        let &(_, v) = self.module.outputs.iter().find(|(n, _)| n == name)?;
        let slot = &self.slots[v as usize];
        let bytes = match slot.place {
            Place::Arena(off) => &self.arena.bytes()[off..off + slot.bytes],
            Place::Hoisted(off) => &self.hoisted.bytes()[off..off + slot.bytes],
            Place::Input(i) => self.inputs[i].bytes(),
            Place::Param(i) => self.params[i].bytes(),
            Place::Next(i) => self.next[i].bytes(),
        };
        Some((slot, bytes))
    }

    /// Output `name` of the last run as f32, with its shape.
    pub fn output_f32(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        self.value_f32(Stored::Output(name))
    }

    /// Output `name` of the last run as f32 values: borrowed where it is stored as f32,
    /// converted otherwise; `None` for an unknown name. What a pipeline stage sends, with no
    /// copy beside the message.
    pub fn output_values(&self, name: &str) -> Option<Cow<'_, [f32]>> {
        let (slot, bytes) = self.stored_slot(Stored::Output(name))?;
        Some(match (slot.dtype, f32_view(bytes)) {
            (DType::F32, Some(values)) => Cow::Borrowed(values),
            _ => Cow::Owned(slot_f32(slot, bytes)),
        })
    }

    /// Sends output `name` of the last run to rank `to` over this executor's collectives
    /// ([`Executor::output_values`]: straight from its buffer where it is stored as f32).
    pub fn send_output(&mut self, name: &str, to: usize) -> ExecResult<()> {
        let mut comm = self.comm.take().ok_or_else(|| {
            ExecError::new(
                ExecErrorKind::Input,
                format!("no collectives to send `{name}` over"),
            )
        })?;
        let sent = match self.output_values(name) {
            Some(values) => comm.send(to, &values),
            None => Err(ExecError::new(
                ExecErrorKind::Input,
                format!("no output `{name}` to send"),
            )),
        };
        self.comm = Some(comm);
        sent
    }

    /// The current value of `which` as f32, with its shape; `None` for an unknown name.
    pub fn value_f32(&self, which: Stored<'_>) -> Option<(Vec<usize>, Vec<f32>)> {
        let (slot, bytes) = self.stored_slot(which)?;
        Some((slot.shape.clone(), slot_f32(slot, bytes)))
    }

    /// The current value of `which` as little-endian f32 bytes: borrowed where it is stored as
    /// f32, converted otherwise; `None` for an unknown name. What a checkpoint writes tensor by
    /// tensor, so that saving needs no copy of the model.
    pub fn f32_le(&self, which: Stored<'_>) -> Option<Cow<'_, [u8]>> {
        let (slot, bytes) = self.stored_slot(which)?;
        Some(match slot.dtype {
            DType::F32 => Cow::Borrowed(bytes),
            _ => Cow::Owned(
                slot_f32(slot, bytes)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        })
    }

    /// The shape of `which`; `None` for an unknown name.
    pub fn shape_of(&self, which: Stored<'_>) -> Option<&[usize]> {
        self.stored_slot(which)
            .map(|(slot, _)| slot.shape.as_slice())
    }

    /// The slot of `which` and its bytes as stored.
    fn stored_slot(&self, which: Stored<'_>) -> Option<(&Slot, &[u8])> {
        match which {
            Stored::Output(name) => self.output_slot(name),
            Stored::Input(name) => {
                let (k, v) = self.input_index(name).ok()?;
                Some((&self.slots[v as usize], self.inputs[k].bytes()))
            }
            Stored::Param(path) => {
                let (slot, i) = self.param_slot(path)?;
                Some((slot, self.params[i].bytes()))
            }
        }
    }

    /// The slot and parameter buffer of the parameter at `path`.
    fn param_slot(&self, path: &str) -> Option<(&Slot, usize)> {
        self.module
            .values
            .iter()
            .zip(&self.slots)
            .find_map(|(v, slot)| match (&v.storage, slot.place) {
                (Storage::Param { path: p, .. }, Place::Param(i)) if p == path => Some((slot, i)),
                _ => None,
            })
    }

    /// Every parameter and buffer's path, in module order.
    pub fn param_paths(&self) -> impl Iterator<Item = &str> {
        self.module.values.iter().filter_map(|v| match &v.storage {
            Storage::Param { path, .. } => Some(path.as_str()),
            _ => None,
        })
    }

    /// Output `name` of the last run as an array in its own dtype (bf16, which `.npy` lacks,
    /// widened to f32).
    pub fn output_npy(&self, name: &str) -> Option<NpyArray> {
        self.output_view(name).map(NpyView::into_array)
    }

    /// Output `name` of the last run where it lies, in its own dtype, to be written without a
    /// copy; bf16, which `.npy` lacks, widened to f32 in a copy of its own.
    pub fn output_view(&self, name: &str) -> Option<NpyView<'_>> {
        let (slot, bytes) = self.output_slot(name)?;
        let npy = match slot.dtype {
            DType::F32 => NpyDType::F32,
            DType::F16 => NpyDType::F16,
            DType::F64 => NpyDType::F64,
            DType::I32 => NpyDType::I32,
            DType::I64 => NpyDType::I64,
            DType::Bool => NpyDType::Bool,
            DType::BF16 => {
                let (shape, values) = self.output_f32(name)?;
                return NpyArray::from_f32(shape, &values).ok().map(NpyView::from);
            }
        };
        NpyView::new(npy, slot.shape.clone(), bytes).ok()
    }

    /// Makes each output `name` of the last run the value of the input or parameter of the same
    /// name (a training step's new parameters and optimizer states, docs/mir-format.md,
    /// "Training modules"), so the next run reads them; values derived from parameters (hoisted
    /// values, weights packed ahead) are recomputed when a parameter is written, and kept when
    /// only inputs are (a gradient accumulator). A next value (`Storage::Next`) changes buffers
    /// with the input it replaces, so that output then reads the replaced value; a value that
    /// overwrites its input (`Storage::Overwrite`) is there already; any other output is
    /// copied over it.
    pub fn write_back<'n>(&mut self, names: impl IntoIterator<Item = &'n str>) -> ExecResult<()> {
        for name in names {
            let Some(&(_, src)) = self.module.outputs.iter().find(|(n, _)| n == name) else {
                return Err(module_error(format!("no output `{name}` to write back")));
            };
            let dst = self.module.replaced(name);
            let Some(dst) =
                dst.filter(|&d| self.module.values[d].ty == self.module.values[src as usize].ty)
            else {
                return Err(module_error(format!(
                    "output `{name}` has no input or parameter of its name and type to write back to"
                )));
            };
            // Hoisted values and packed weights read parameters alone, never inputs.
            if let Place::Param(i) = self.slots[dst].place {
                self.hoisted_ready = false;
                self.param_stamps[i] = new_stamp();
            }
            // Computed over its input's own buffer: already in place.
            if let Storage::Overwrite { .. } = self.module.values[src as usize].storage {
                continue;
            }
            let slot = &self.slots[src as usize];
            if let Place::Next(n) = slot.place {
                match self.slots[dst].place {
                    Place::Input(i) => std::mem::swap(&mut self.inputs[i], &mut self.next[n]),
                    Place::Param(i) => std::mem::swap(&mut self.params[i], &mut self.next[n]),
                    _ => return Err(module_error(format!("`{name}` has no buffer of its own"))),
                }
                continue;
            }
            let bytes = match slot.place {
                Place::Arena(off) => &self.arena.bytes()[off..off + slot.bytes],
                Place::Hoisted(off) => &self.hoisted.bytes()[off..off + slot.bytes],
                Place::Input(_) | Place::Param(_) | Place::Next(_) => {
                    return Err(module_error(format!(
                        "output `{name}` is not computed by a step"
                    )))
                }
            };
            match self.slots[dst].place {
                Place::Input(i) => self.inputs[i].bytes_mut().copy_from_slice(bytes),
                Place::Param(i) => self.params[i].bytes_mut().copy_from_slice(bytes),
                Place::Arena(_) | Place::Hoisted(_) | Place::Next(_) => {
                    return Err(module_error(format!("`{name}` has no buffer of its own")))
                }
            }
        }
        Ok(())
    }

    /// Every parameter and buffer as f32: (path, shape, values), in module order.
    pub fn params_f32(&self) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        self.module
            .values
            .iter()
            .zip(&self.slots)
            .filter_map(|(v, slot)| match (&v.storage, slot.place) {
                (Storage::Param { path, .. }, Place::Param(i)) => Some((
                    path.clone(),
                    slot.shape.clone(),
                    slot_f32(slot, self.params[i].bytes()),
                )),
                _ => None,
            })
            .collect()
    }

    /// The current value of input `name` as f32, with its shape.
    pub fn input_f32(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        self.value_f32(Stored::Input(name))
    }

    /// Names of the float outputs of the last run holding a NaN or an infinity.
    pub fn nonfinite_outputs(&self) -> Vec<String> {
        self.module
            .outputs
            .iter()
            .filter(|(name, _)| {
                self.output_values(name)
                    .is_some_and(|v| v.iter().any(|x| !x.is_finite()))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Per-step timings of the last run (`None` for the steps it skipped: hoisted ones already
    /// computed, those the run does not need, and copies with nothing to do
    /// ([`CopyStep::Unchanged`])).
    pub fn step_times(&self) -> &[Option<StepTime>] {
        &self.times
    }

    /// The last run as a Chrome trace-event JSON document.
    pub fn profile_json(&self) -> String {
        chrome_trace(
            &self.module,
            &self.times,
            self.workers.as_ref(),
            self.threads,
        )
    }
}

/// Every value's type and place: inputs and parameters numbered in order, arena values at
/// their offsets, a value that overwrites an input or parameter in that one's buffer.
fn slots_of(module: &Module) -> ExecResult<Vec<Slot>> {
    let (mut n_inputs, mut n_params, mut n_next) = (0, 0, 0);
    let mut slots = Vec::with_capacity(module.values.len());
    for (i, v) in module.values.iter().enumerate() {
        let bytes = usize::try_from(v.ty.bytes())
            .map_err(|_| module_error(format!("value %{i} does not fit in memory")))?;
        let place = match &v.storage {
            Storage::Arena { offset } => Place::Arena(*offset as usize),
            Storage::Hoisted { offset } => Place::Hoisted(*offset as usize),
            Storage::Input { .. } => {
                n_inputs += 1;
                Place::Input(n_inputs - 1)
            }
            Storage::Param { .. } => {
                n_params += 1;
                Place::Param(n_params - 1)
            }
            Storage::Next { .. } => {
                n_next += 1;
                Place::Next(n_next - 1)
            }
            // The replaced value's buffer, once its place is known (below).
            Storage::Overwrite { .. } => Place::Arena(0),
        };
        slots.push(Slot {
            place,
            dtype: v.ty.dtype,
            shape: v.ty.shape.iter().map(|&d| d as usize).collect(),
            numel: v.ty.checked_numel().unwrap_or(0) as usize,
            bytes,
        });
    }
    for (i, v) in module.values.iter().enumerate() {
        let Storage::Overwrite { name } = &v.storage else {
            continue;
        };
        let Some(r) = module.replaced(name) else {
            return Err(module_error(format!(
                "value %{i} overwrites `{name}`, which is no input or parameter"
            )));
        };
        slots[i].place = slots[r].place;
    }
    Ok(slots)
}

/// The executor's buffers sized by the plan (arena, hoisted region, parameters, inputs,
/// staging) must add up to exactly the planned bytes, which `NAME.memplan.json` reports.
fn check_allocation(allocated: u64, planned: u64) -> ExecResult<()> {
    if allocated == planned {
        Ok(())
    } else {
        Err(ExecError::new(
            ExecErrorKind::Internal,
            format!(
                "internal error: the executor allocated {allocated} bytes where the memory plan \
                 has {planned}; this is a bug in mslc"
            ),
        ))
    }
}

fn origin_suffix(origin: &str) -> String {
    if origin.is_empty() {
        String::new()
    } else {
        format!(" at {origin}")
    }
}

/// A step's operands as `--check-numerics` reports them: those it wrote over as they were
/// before it ran ([`Memory::operands_written_over`]), the others where they are.
#[derive(Clone, Copy)]
struct CheckedOperands<'s> {
    step: &'s Step,
    /// Copies of the operands the step wrote over, by value.
    saved: &'s [(u32, Vec<u8>)],
}

impl<'s> CheckedOperands<'s> {
    /// The bytes of operand `v`: its copy when the step wrote over it, else `stored()`.
    fn bytes<'b>(&self, v: u32, stored: impl FnOnce() -> &'b [u8]) -> &'b [u8]
    where
        's: 'b,
    {
        match self.saved.iter().find(|(saved, _)| *saved == v) {
            Some((_, bytes)) => bytes,
            None => stored(),
        }
    }
}

/// Whether `step` (prepared as `prepared`, followed by `next`) is an all-reduce that can run
/// while the steps after it go on ([`Overlap`]): its f32 operand viewed in place or already in
/// its output, its one output written directly, as f32, and the next step not reading or
/// writing that output at once.
fn overlappable(prepared: &PreparedStep, step: &Step, next: Option<&Step>, slots: &[Slot]) -> bool {
    let waited_for = |out: u32| {
        next.is_some_and(|n| {
            (n.inputs.iter().chain(&n.outputs)).any(|&v| values_share_bytes(slots, out, v))
        })
    };
    matches!(&prepared.kernel, StepKernel::Collective(c) if c.op == mslc_core::ops::Op::AllReduce)
        && step.outputs.len() == 1
        && prepared.out_direct
        && matches!(prepared.modes.first(), Some(Mode::Direct | Mode::InPlace))
        && !waited_for(step.outputs[0])
}

/// Whether values `a` and `b` share any byte: in the same buffer, their ranges overlapping.
fn values_share_bytes(slots: &[Slot], a: u32, b: u32) -> bool {
    let (a, b) = (&slots[a as usize], &slots[b as usize]);
    match (a.place, b.place) {
        (Place::Arena(x), Place::Arena(y)) | (Place::Hoisted(x), Place::Hoisted(y)) => {
            share_bytes(&(x..x + a.bytes), &(y..y + b.bytes))
        }
        (Place::Input(i), Place::Input(j))
        | (Place::Param(i), Place::Param(j))
        | (Place::Next(i), Place::Next(j)) => i == j,
        _ => false,
    }
}

/// Where the run loop reads and writes values.
struct Memory<'a> {
    slots: &'a [Slot],
    arena: *mut u8,
    hoisted: *mut u8,
    /// The packed weights, each step's in its own range.
    packed: &'a mut [f32],
    /// The parameters changed since the weights were packed: pack them before use.
    repack: bool,
    /// The inputs' buffers (a value computed over its input writes there): the executor's,
    /// which the run neither adds to nor removes from.
    inputs: *mut AlignedBuf,
    /// The parameters' buffers (as the inputs').
    params: *mut AlignedBuf,
    /// Where each next-value buffer starts.
    next: Vec<*mut u8>,
    /// The parameters a step of this run overwrote (their buffers changed).
    overwritten: &'a mut Vec<usize>,
}

impl<'a> Memory<'a> {
    /// The addresses value `v` is stored at, to tell whether two values share bytes (a step
    /// and what an all-reduce still writes, an update and the operands it writes over).
    ///
    /// # Safety
    /// As [`Memory::bytes`].
    unsafe fn address_range(&self, v: u32) -> std::ops::Range<usize> {
        // SAFETY: the caller's.
        let bytes = unsafe { self.bytes(v) };
        bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len()
    }

    /// Hands the all-reduce `collective` of `step` (step `s`, [`StepPlan::overlappable`]) to the
    /// communication thread: its operand copied into its output, which the thread then sums
    /// over the group in place.
    ///
    /// # Safety
    /// As [`Memory::run_step`]'s.
    unsafe fn issue_all_reduce(
        &mut self,
        plan: &StepPlan,
        step: &Step,
        s: usize,
        collective: &CollectiveStep,
        overlap: &mut Overlap<'_>,
    ) -> ExecResult<()> {
        let slot = &self.slots[step.outputs[0] as usize];
        let dst = self.output_ptr(slot.place);
        if let Place::Param(p) = slot.place {
            self.overwritten.push(p);
        }
        // SAFETY: inside its region (validated), an f32 output written directly; no view of
        // it exists (input 0 is viewed only when it lies elsewhere).
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<f32>(), slot.numel) };
        if plan.prepared.modes.first() == Some(&Mode::Direct) {
            // SAFETY: input 0 does not overlap the output (validated), and nothing writes it.
            let x = f32_view(unsafe { self.bytes(step.inputs[0]) }).unwrap_or(&[]);
            if x.len() != out.len() {
                return Err(module_error(format!(
                    "an all-reduce of {} values into {}",
                    x.len(),
                    out.len()
                )));
            }
            out.copy_from_slice(x);
        }
        overlap.issue(s, collective, out)
    }

    /// The stored bytes of value `v`.
    ///
    /// # Safety
    /// An arena value's bytes must not be mutably borrowed while the result lives.
    unsafe fn bytes(&self, v: u32) -> &'a [u8] {
        let slot = &self.slots[v as usize];
        match slot.place {
            // SAFETY: inside its region (validated); the caller rules out a live `&mut`.
            Place::Arena(off) => unsafe {
                std::slice::from_raw_parts(self.arena.add(off), slot.bytes)
            },
            // SAFETY: as above.
            Place::Hoisted(off) => unsafe {
                std::slice::from_raw_parts(self.hoisted.add(off), slot.bytes)
            },
            // SAFETY: buffer i of the run's inputs (validated indices); the caller rules out a
            // live pointer to write it.
            Place::Input(i) => unsafe { (*self.inputs.add(i)).bytes() },
            // SAFETY: as above (a lent parameter buffer is back: a run checks it first).
            Place::Param(i) => unsafe { (*self.params.add(i)).bytes() },
            // SAFETY: as above.
            Place::Next(i) => unsafe { std::slice::from_raw_parts(self.next[i], slot.bytes) },
        }
    }

    /// Copies of the operands of `step` whose bytes its outputs share (an update or a fused
    /// program written over what it reads), taken before it runs: what `--check-numerics`
    /// reports as the step's operands.
    ///
    /// # Safety
    /// No arena value may be mutably borrowed.
    unsafe fn operands_written_over(&self, step: &Step) -> Vec<(u32, Vec<u8>)> {
        let outputs: Vec<std::ops::Range<usize>> = step
            .outputs
            .iter()
            // SAFETY: the caller rules out a live `&mut`; only the addresses are read.
            .map(|&o| unsafe { self.address_range(o) })
            .collect();
        step.inputs
            .iter()
            .filter_map(|&v| {
                // SAFETY: as above.
                let range = unsafe { self.address_range(v) };
                let shared = outputs.iter().any(|o| share_bytes(o, &range));
                // SAFETY: as above.
                shared.then(|| (v, unsafe { self.bytes(v) }.to_vec()))
            })
            .collect()
    }

    /// What `check_numerics` reports for step `s` if its result holds a NaN or an infinity:
    /// the operands' ranges (as they were before the step, for those it wrote over) and, for a
    /// result stored in f16/bf16, the kernel's f32 result (still in `out_stage`) before
    /// rounding — or, for a fused program that rounds to f16/bf16 on the way, the program's
    /// result without those roundings.
    ///
    /// # Safety
    /// No arena value may be mutably borrowed (the step has finished).
    unsafe fn fault(
        &self,
        s: usize,
        plan: &StepPlan,
        operands: CheckedOperands,
        module: &Module,
        out_stage: &mut AlignedBuf,
    ) -> Option<NumericsFault> {
        let step = operands.step;
        // SAFETY (all `bytes` calls): the caller rules out a live `&mut`.
        let (out, first_index) = step.outputs.iter().find_map(|&o| {
            let ty = &module.values[o as usize].ty;
            NumericsFault::first_nonfinite(ty, unsafe { self.bytes(o) }).map(|i| (o, i))
        })?;
        let ty = &module.values[out as usize].ty;
        let low_precision = matches!(ty.dtype, DType::F16 | DType::BF16);
        let in_f32 = match &plan.prepared.kernel {
            // Only output 0's f32 result is kept in `out_stage` as it is.
            _ if out != step.outputs[0] => None,
            // A copy converts its operand's bytes as they are: an f32 operand is its f32 result.
            _ if plan.prepared.copy.is_some() => {
                let x = step.inputs[0];
                let f32_operand = module.values[x as usize].ty.dtype == DType::F32;
                // SAFETY: as above.
                let bytes = operands.bytes(x, || unsafe { self.bytes(x) });
                (low_precision && f32_operand)
                    .then(|| f32_view(bytes).map(F32Result::of))
                    .flatten()
            }
            // A program rounds its low-precision steps inside the kernel: evaluate it again
            // without those roundings.
            StepKernel::Fused(program, params) | StepKernel::Binary(_, Some(program), params) => {
                // SAFETY: as above.
                let wide = program.widened();
                wide.and_then(|wide| unsafe { self.widened_result(&wide, params, &operands) })
            }
            _ => (low_precision && !plan.prepared.out_direct)
                .then(|| F32Result::of(out_stage.f32s_mut(self.slots[out as usize].numel))),
        };
        Some(NumericsFault {
            step: s,
            op: step.op,
            origin: step.origin.clone(),
            loc: step.loc,
            result: OperandRange::of(ty, unsafe { self.bytes(out) }),
            first_index,
            inputs: step
                .inputs
                .iter()
                .map(|&v| {
                    let bytes = operands.bytes(v, || unsafe { self.bytes(v) });
                    OperandRange::of(&module.values[v as usize].ty, bytes)
                })
                .collect(),
            in_f32,
        })
    }

    /// `program` (a step's fused program, widened to f32) evaluated on the step's operands, as
    /// stored: what the step computes without rounding to f16/bf16.
    ///
    /// # Safety
    /// As [`Memory::fault`].
    unsafe fn widened_result(
        &self,
        program: &Program,
        params: &ElementwiseParams,
        step_operands: &CheckedOperands,
    ) -> Option<F32Result> {
        let step = step_operands.step;
        let operands: Vec<Vec<f32>> = step
            .inputs
            .iter()
            .map(|&v| {
                let slot = &self.slots[v as usize];
                let mut values = vec![0f32; slot.numel];
                // SAFETY: the caller rules out a live `&mut`.
                let bytes = step_operands.bytes(v, || unsafe { self.bytes(v) });
                load_f32(slot.dtype, bytes, &mut values);
                values
            })
            .collect();
        let views: Vec<TensorRef> = operands
            .iter()
            .zip(&step.inputs)
            .map(|(data, &v)| TensorRef {
                data,
                shape: &self.slots[v as usize].shape,
            })
            .collect();
        let mut out = vec![0f32; self.slots[step.outputs[0] as usize].numel];
        fused_elementwise(program, &views, params, &mut out).ok()?;
        Some(F32Result::of(&out))
    }

    /// Where a step output's bytes start (outputs live in the arena, the hoisted region, a
    /// next-value buffer, or the buffer of the input or parameter they overwrite).
    fn output_ptr(&self, place: Place) -> *mut u8 {
        match place {
            // SAFETY: offsets are inside their regions (validated).
            Place::Arena(off) => unsafe { self.arena.add(off) },
            // SAFETY: as above.
            Place::Hoisted(off) => unsafe { self.hoisted.add(off) },
            Place::Next(i) => self.next[i],
            // SAFETY: buffer i of the run's inputs (validated indices); no view of it exists
            // (an operand it overwrites is never viewed).
            Place::Input(i) => unsafe { (*self.inputs.add(i)).as_mut_ptr() },
            // SAFETY: as above.
            Place::Param(i) => unsafe { (*self.params.add(i)).as_mut_ptr() },
        }
    }

    /// Runs a [`CopyStep::Convert`] step: input `x`'s bytes converted straight into output `y`'s
    /// own buffer.
    ///
    /// # Safety
    /// As [`Memory::run_step`]'s; `x` and `y` do not overlap (a copy step converts only
    /// between buffers of their own).
    unsafe fn convert_copy(&mut self, x: u32, y: u32) -> ExecResult<()> {
        let (from, slot) = (self.slots[x as usize].dtype, &self.slots[y as usize]);
        let dst = self.output_ptr(slot.place);
        if let Place::Param(p) = slot.place {
            self.overwritten.push(p);
        }
        // SAFETY: both inside their regions (validated) and disjoint; no other view exists.
        let (src, dst) = unsafe {
            (
                self.bytes(x),
                std::slice::from_raw_parts_mut(dst, slot.bytes),
            )
        };
        if convert_bytes(from, src, slot.dtype, dst) {
            Ok(())
        } else {
            Err(module_error(format!(
                "a copy from {from} to {} that is not one conversion",
                slot.dtype
            )))
        }
    }

    /// Runs one step.
    ///
    /// # Safety
    /// The step's arena ranges must satisfy what `Executor::new` validates.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_step(
        &mut self,
        plan: &StepPlan,
        step_inputs: &[u32],
        outputs: &[u32],
        comm: Option<&mut (dyn Collectives + 'static)>,
        in_stage: &mut [AlignedBuf],
        int_stage: &mut AlignedBuf,
        out_stage: &mut AlignedBuf,
    ) -> ExecResult<()> {
        if plan.prepared.copy == Some(CopyStep::Convert) {
            return self.convert_copy(step_inputs[0], outputs[0]);
        }
        let mut inline = [NO_TENSOR; INLINE_INPUTS];
        let mut spilled = Vec::new();
        let views: &mut [TensorRef<'_>] = if step_inputs.len() <= INLINE_INPUTS {
            &mut inline[..step_inputs.len()]
        } else {
            spilled.resize(step_inputs.len(), NO_TENSOR);
            &mut spilled
        };
        let mut ints: &[i64] = &[];
        let mut stages = in_stage.iter_mut();
        // A weight packed ahead that the kernel reads only packed is not converted (it is when
        // it is packed again): the kernel reads the weight's view only for its shape.
        let packed_already = plan.prepared.packed_b.is_some()
            && !self.repack
            && !plan.prepared.kernel.reads_packed_b();
        let inputs = views.iter_mut().zip(step_inputs).zip(&plan.prepared.modes);
        for (j, ((view, &v), &mode)) in inputs.enumerate() {
            let slot = &self.slots[v as usize];
            let stage = stages.next();
            // SAFETY (all `bytes` calls): no output slice exists yet.
            let data: &[f32] = match (mode, stage) {
                (Mode::Direct | Mode::CopyIn, _) => {
                    f32_view(unsafe { self.bytes(v) }).unwrap_or(&[])
                }
                (Mode::Convert, _) if j == 1 && packed_already => &[],
                (Mode::ConvertRows, Some(stage)) => {
                    let buf = stage.f32s_mut(slot.numel);
                    load_rows_f32(slot.dtype, unsafe { self.bytes(v) }, &slot.shape, ints, buf);
                    buf
                }
                (Mode::Convert, Some(stage)) => {
                    let buf = stage.f32s_mut(slot.numel);
                    load_f32(slot.dtype, unsafe { self.bytes(v) }, buf);
                    buf
                }
                (Mode::CopyAliased, Some(stage)) => {
                    let buf = stage.f32s_mut(slot.numel);
                    load_f32(DType::F32, unsafe { self.bytes(v) }, buf);
                    buf
                }
                (Mode::Ints, _) => {
                    let buf = int_stage.i64s_mut(slot.numel);
                    load_i64(slot.dtype, unsafe { self.bytes(v) }, buf);
                    ints = buf;
                    &[]
                }
                _ => &[],
            };
            *view = TensorRef {
                data,
                shape: &slot.shape,
            };
        }
        // Each output's bytes, and whether it is written there directly (f32) or staged in
        // `out_stage` (output 0 first, then the others, side by side) and stored after.
        // (Fixed arrays: a warm step allocates nothing.)
        if outputs.len() > MAX_OUTPUTS {
            return Err(module_error(format!(
                "a step writes {} outputs; no op has more than {MAX_OUTPUTS}",
                outputs.len()
            )));
        }
        let mut places: [Option<(*mut u8, &Slot, bool)>; MAX_OUTPUTS] = [None; MAX_OUTPUTS];
        for (i, &o) in outputs.iter().enumerate() {
            let slot = &self.slots[o as usize];
            let dst = self.output_ptr(slot.place);
            if let Place::Param(p) = slot.place {
                self.overwritten.push(p);
            }
            let direct = match i {
                0 => plan.prepared.out_direct,
                _ => plan.prepared.more_direct[i - 1],
            };
            places[i] = Some((dst, slot, direct));
        }
        let Some((_, out_slot, _)) = places[0] else {
            return Ok(());
        };
        let staged: usize = places
            .iter()
            .flatten()
            .filter(|(_, _, direct)| !direct)
            .map(|(_, slot, _)| slot.numel)
            .sum();
        let mut stage = out_stage.f32s_mut(staged);
        let mut slices: [Option<&mut [f32]>; MAX_OUTPUTS] = Default::default();
        for (slice, &(dst, slot, direct)) in slices.iter_mut().zip(places.iter().flatten()) {
            *slice = Some(if direct {
                // SAFETY: inside its region; disjoint from every input view and every other
                // output (validated), input 0 included unless output 0 is `InPlace`, in which
                // case no view of it exists.
                unsafe { std::slice::from_raw_parts_mut(dst.cast::<f32>(), slot.numel) }
            } else {
                let (mine, rest) = std::mem::take(&mut stage).split_at_mut(slot.numel);
                stage = rest;
                mine
            });
        }
        let [out, more_outs @ ..] = slices;
        let out = out.unwrap_or_default();
        let mut in_place = plan.prepared.modes.first() == Some(&Mode::InPlace);
        if plan.prepared.modes.first() == Some(&Mode::CopyIn) {
            // The kernel updates input 0's copy in the output (checked when the step was
            // prepared: of its size, and not overlapping it).
            out.copy_from_slice(views[0].data);
            views[0].data = &[];
            in_place = true;
        }
        let kernel_error = |e: KernelError| ExecError::new(ExecErrorKind::Kernel, e.to_string());
        if let StepKernel::Collective(c) = &plan.prepared.kernel {
            let x = views[0];
            run_collective(c, comm, x.data, x.shape, out)?;
        } else {
            let packed_b = match &plan.prepared.packed_b {
                Some(range) => {
                    let dst = &mut self.packed[range.clone()];
                    if self.repack {
                        plan.prepared
                            .kernel
                            .pack_b(views[1].data, dst)
                            .map_err(kernel_error)?;
                    }
                    Some(&*dst)
                }
                None => None,
            };
            plan.prepared
                .kernel
                .run_with_packed_b(
                    Operands {
                        inputs: views,
                        ints,
                        out,
                        out_shape: &out_slot.shape,
                        in_place,
                        more_outs,
                    },
                    packed_b,
                )
                .map_err(kernel_error)?;
        }
        let mut stage = out_stage.f32s_mut(staged);
        for (dst, slot, direct) in places.into_iter().flatten() {
            if direct {
                continue;
            }
            let (mine, rest) = std::mem::take(&mut stage).split_at_mut(slot.numel);
            stage = rest;
            // SAFETY: the kernel is done; no view of the arena is used after this point.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst, slot.bytes) };
            store_f32(slot.dtype, mine, dst);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_other_than_the_plan_is_an_internal_error() {
        assert!(check_allocation(4096, 4096).is_ok());
        let e = check_allocation(4160, 4096).unwrap_err();
        assert_eq!(e.kind, ExecErrorKind::Internal);
        assert!(
            e.message.contains("4160") && e.message.contains("4096"),
            "{e}"
        );
    }
}
