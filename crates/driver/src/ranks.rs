//! Running a plan's ranks: which per-rank program a plan asks for (data and tensor
//! parallelism, optimizer sharding), the check that the world started matches the plan's device
//! count (E0970), a rank's forward program and its share of the inputs and outputs, and N ranks
//! as threads of one process, each with its own executor, talking through the threads backend of
//! [`mslc_exec::collectives`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use mslc_core::diag::Code;
use mslc_exec::collectives::threads::world_with_timeout;
use mslc_exec::collectives::{Collectives, Mesh};
use mslc_io::safetensors::{SafetensorsError, SafetensorsFile, StDType, TensorRef};
use mslc_ir::shard::pipeline::{pipeline_stage, StageCut};
use mslc_ir::shard::zero::ZeroShard;
use mslc_plan::memory::MemoryPlan;
use mslc_plan::parallel::estimate::Schedule;
use mslc_plan::parallel::workload::layer_key;
use mslc_plan::parallel::{ExecutorMemory, Held, PlanFile};

use mslc_core::program::Model;
use mslc_io::npy::NpyArray;

use crate::compile::{compile_graph, lower_verified, CompileError, CompileOptions, Compiled};
use crate::pipeline::messages::{held_message_bytes, Link};
use crate::train::{CompiledTrain, StageStep, TensorSplits, DATA_AXIS, PIPELINE_AXIS, TENSOR_AXIS};

/// The [`CompileError::stage`] of a model that Megatron's rewrite cannot split as the plan
/// asks (E0972).
pub const STAGE_TENSOR_PARALLEL: &str = "tensor parallel";

/// The [`CompileError::stage`] of a model that cannot be cut into the plan's pipeline stages
/// (E0972).
pub const STAGE_PIPELINE: &str = "pipeline";

/// What one rank allocates running `programs` (its step and, on a pipeline stage, the stage's
/// forward and update: [`crate::train::StageStep::programs`]) on `threads` executor threads:
/// each program's memory plan, the parameters once — the first program's; the others run on
/// them, lent ([`mslc_exec::Executor::swap_params`]) — and the threads' kernel scratch once,
/// the largest any program asks for (they share the rank's pool, [`Executor::borrowing`]),
/// what the executor keeps for each prepared program, and the contributions the threads
/// backend's exchanges keep, the most any program's collectives leave there (they share the
/// rank's exchanges): what `mslc train` measures against and `mslc build` reports for the host
/// target.
///
/// [`Executor::borrowing`]: mslc_exec::Executor::borrowing
pub fn rank_memory<'a>(
    programs: impl IntoIterator<Item = &'a MemoryPlan>,
    threads: usize,
) -> ExecutorMemory {
    let (mut buffers, mut scratch) = (0u64, 0u64);
    let mut held = Held::default();
    for (i, m) in programs.into_iter().enumerate() {
        let borrowed = if i == 0 { 0 } else { m.params_bytes };
        buffers = buffers.saturating_add(m.total_bytes.saturating_sub(borrowed));
        scratch = scratch.max(
            (m.scratch_bytes_per_thread.saturating_mul(threads as u64))
                .saturating_add(m.scratch_bytes_while_running),
        );
        held.programs = held.programs.saturating_add(m.program_bytes);
        held.exchanged = held.exchanged.max(m.kept_message_bytes);
    }
    held.allocated = buffers.saturating_add(scratch);
    ExecutorMemory::holding(held, threads)
}

/// The memory of each stage of a pipeline whose stages run `steps` (each one's step and cut)
/// under `pipeline`'s schedule, on `threads` executor threads: its programs
/// ([`rank_memory`]) and the most bytes of messages its device holds
/// ([`held_message_bytes`](crate::pipeline::messages::held_message_bytes); on an interleaved
/// device's first chunk, the others counting none), the values each cut carries sized as the
/// receiving step's inputs, as f32 (what the stages send).
pub fn stage_memory(
    steps: &[(CompiledTrain, StageStep)],
    pipeline: &PipelineLayout,
    threads: usize,
) -> Vec<ExecutorMemory> {
    let links: Vec<Link> = steps
        .iter()
        .enumerate()
        .flat_map(|(to, (step, cut))| {
            let module = &step.compiled.module;
            cut.cut.receives.iter().map(move |c| Link {
                from: c.peer,
                to,
                bytes: module
                    .inputs()
                    .find(|(name, _)| *name == c.name)
                    .map_or(0, |(_, v)| {
                        module.values[v as usize].ty.numel().saturating_mul(4)
                    }),
            })
        })
        .collect();
    let held = held_message_bytes(
        pipeline.schedule,
        steps.len(),
        pipeline.micro_batches,
        &links,
    );
    // A device's messages are counted on its first stage (the others of an interleaved
    // device are its later chunks).
    steps
        .iter()
        .enumerate()
        .map(|(s, (step, cut))| {
            let programs = std::iter::once(&step.compiled.memory).chain(cut.programs());
            rank_memory(programs, threads).with_pipelined(held.get(s).copied().unwrap_or(0))
        })
        .collect()
}

/// One rank's forward program of `model`: what one device compiles, rewritten first for one
/// member of a tensor-parallel group when `tensor` is given ([`TensorSplits::apply`]: tensor
/// parallel, with sequence parallelism when the plan asks). A forward runs in eval mode, so
/// its dropouts are the identity and run on a block of the sequence as well as on the whole.
pub fn compile_rank(
    model: &Model,
    options: &CompileOptions,
    tensor: Option<TensorSplits>,
) -> Result<Compiled, CompileError> {
    compile_cut(model, options, tensor, None).map(|(compiled, _)| compiled)
}

/// [`compile_rank`] cut to stage `stage` of `pipeline` ([`pipeline_stage`]): the stage's
/// program and what it receives, sends and outputs.
pub fn compile_stage(
    model: &Model,
    options: &CompileOptions,
    tensor: Option<TensorSplits>,
    pipeline: &PipelineLayout,
    stage: usize,
) -> Result<(Compiled, StageCut), CompileError> {
    compile_cut(model, options, tensor, Some((pipeline, stage)))
}

fn compile_cut(
    model: &Model,
    options: &CompileOptions,
    tensor: Option<TensorSplits>,
    stage: Option<(&PipelineLayout, usize)>,
) -> Result<(Compiled, StageCut), CompileError> {
    let mut graph = lower_verified(model, options)?;
    if let Some(tensor) = tensor {
        tensor.apply(&mut graph).map_err(|e| CompileError {
            stage: STAGE_TENSOR_PARALLEL,
            message: e.to_string(),
        })?;
    }
    let cut = match stage {
        Some((pipeline, stage)) => {
            cut_to_stage(&mut graph, pipeline, stage).map_err(|e| CompileError {
                stage: STAGE_PIPELINE,
                message: e.to_string(),
            })?
        }
        None => StageCut::default(),
    };
    compile_graph(graph, options).map(|compiled| (compiled, cut))
}

/// Rewrites `graph` into stage `stage`'s part of `pipeline` ([`pipeline_stage`]), each op of a
/// repeated layer on the stage the plan puts its layer on.
pub(crate) fn cut_to_stage(
    graph: &mut mslc_ir::Graph,
    pipeline: &PipelineLayout,
    stage: usize,
) -> Result<StageCut, mslc_ir::shard::ShardError> {
    let layers = layer_stages(graph, pipeline);
    let of = |origin: &str| layer_key(origin).and_then(|k| layers.get(&k).copied());
    pipeline_stage(graph, stage, pipeline.layers.len(), &of)
}

/// The stage of each repeated layer of `graph` (by [`layer_key`], numbered as the planner
/// numbers them: the repeated lists in the order they first appear, each list's layers by
/// their index — not by node order, which a rewrite such as Megatron's, reusing the ids of
/// the nodes it removed, leaves shuffled) under `pipeline`'s layer ranges.
fn layer_stages(graph: &mslc_ir::Graph, pipeline: &PipelineLayout) -> BTreeMap<String, usize> {
    let stage_of = mslc_ir::shard::pipeline::stage_of_layers(&pipeline.layers);
    let mut lists: Vec<String> = Vec::new();
    let mut keys: Vec<(usize, usize, String)> = Vec::new();
    for id in graph.node_ids() {
        let Some(key) = layer_key(&graph.node(id).origin) else {
            continue;
        };
        if keys.iter().any(|(_, _, k)| *k == key) {
            continue;
        }
        let (list, index) = key.rsplit_once('.').unwrap_or(("", key.as_str()));
        let list_rank = match lists.iter().position(|l| l == list) {
            Some(r) => r,
            None => {
                lists.push(list.to_string());
                lists.len() - 1
            }
        };
        keys.push((list_rank, index.parse().unwrap_or(usize::MAX), key));
    }
    keys.sort();
    keys.into_iter()
        .enumerate()
        .filter_map(|(i, (_, _, key))| stage_of.get(&i).map(|&s| (key, s)))
        .collect()
}

/// The inputs `arrays` of `model` as each of `replicas` data-parallel replicas takes them, in
/// replica order: every input whose first dim is the model's batch dim (the first dim of its
/// first input) cut into equal slices along it, the others whole. E0974 when the batch does
/// not split into the replicas or the model has no named batch dim.
pub fn split_inputs(
    model: &Model,
    arrays: &BTreeMap<String, NpyArray>,
    replicas: usize,
) -> Result<Vec<BTreeMap<String, NpyArray>>, RanksError> {
    if replicas <= 1 {
        return Ok(vec![arrays.clone()]);
    }
    let batch = model.batch_dim().map(str::to_string).ok_or_else(|| {
        RanksError::new(
            Code::E0974,
            format!(
                "data parallel splits the batch among {replicas} replicas, but the first \
                     input of `{}` does not start with a named batch dim",
                model.name
            ),
        )
    })?;
    let mut out = vec![BTreeMap::new(); replicas];
    for (name, array) in arrays {
        let batched = model
            .inputs
            .iter()
            .any(|i| i.name == *name && i.dims.first().and_then(Option::as_deref) == Some(&batch));
        let size = array.shape().first().copied().unwrap_or(0);
        if batched && size % replicas != 0 {
            return Err(RanksError::new(
                Code::E0974,
                format!(
                    "input `{name}` holds a batch of {size} ({batch} = {size}), which does not \
                     split into {replicas} data-parallel replicas"
                ),
            ));
        }
        let rows = size / replicas.max(1);
        let row_bytes = array.data().len() / size.max(1);
        for (r, part) in out.iter_mut().enumerate() {
            let slice = match batched {
                true => {
                    let mut shape = array.shape().to_vec();
                    shape[0] = rows;
                    let bytes =
                        array.data()[r * rows * row_bytes..(r + 1) * rows * row_bytes].to_vec();
                    NpyArray::new(array.dtype(), shape, bytes)
                        .map_err(|e| RanksError::new(Code::E0974, e.to_string()))?
                }
                false => array.clone(),
            };
            part.insert(name.clone(), slice);
        }
    }
    Ok(out)
}

/// The dim along which the data-parallel replicas' parts of an output of shape `part` make the
/// whole output of shape `whole`: the one dim `replicas` times longer, all others equal.
pub fn gather_dim(whole: &[usize], part: &[usize], replicas: usize) -> Option<usize> {
    if whole.len() != part.len() {
        return None;
    }
    let differing: Vec<usize> = (0..whole.len()).filter(|&d| whole[d] != part[d]).collect();
    match differing[..] {
        [d] if whole[d] == part[d] * replicas => Some(d),
        _ => None,
    }
}

/// Gathers `data` (a tensor of `shape`, of any dtype) from every member of the group of mesh
/// axis `axis` and concatenates the members' tensors along `dim`, in group order: how the
/// data-parallel replicas' parts of an output become the whole. The bytes travel as f32
/// words, which the collectives copy bit for bit.
pub fn gather_bytes(
    comm: &mut dyn Collectives,
    axis: &str,
    dim: usize,
    shape: &[usize],
    data: &[u8],
) -> mslc_exec::ExecResult<Vec<u8>> {
    let a = comm.mesh().axis(axis)?;
    let members = comm.mesh().axes()[a].1;
    let words = data.len().div_ceil(4);
    let mut padded = data.to_vec();
    padded.resize(words * 4, 0);
    let send: Vec<f32> = padded
        .chunks_exact(4)
        .map(|b| f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect();
    let mut recv = vec![0.0f32; words * members];
    comm.all_gather(a, &send, &mut recv)?;
    let bytes: Vec<u8> = recv
        .iter()
        .flat_map(|w| w.to_bits().to_le_bytes())
        .collect();
    let outer: usize = shape[..dim.min(shape.len())].iter().product();
    let parts: Vec<&[u8]> = (0..members)
        .map(|m| &bytes[m * words * 4..m * words * 4 + data.len()])
        .collect();
    Ok(crate::pipeline::join_bytes(&parts, outer))
}

/// A coded refusal to run a plan's ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct RanksError {
    /// E0970 (world size), E0972 (layout not runnable) or E0973 (a rank stopped).
    pub code: Code,
    /// What is wrong, with the numbers.
    pub message: String,
}

impl RanksError {
    fn new(code: Code, message: impl Into<String>) -> RanksError {
        RanksError {
            code,
            message: message.into(),
        }
    }
}

/// Checks that `world` ranks (started by `launcher`, for the message) are the `devices` a
/// plan has (E0970).
pub fn check_world(devices: i64, world: usize, launcher: &str) -> Result<(), RanksError> {
    let devices = devices.max(1) as usize;
    if world != devices {
        let alone = if world == 1 && launcher.starts_with("mpiexec") {
            " (a binary started without mpiexec, or by another MPI's launcher, sees one rank)"
        } else {
            ""
        };
        return Err(RanksError::new(
            Code::E0970,
            format!(
                "{launcher} started {world} rank(s), but the plan has {devices} device(s){alone}"
            ),
        ));
    }
    Ok(())
}

/// How `world` ranks run a plan: the pipeline stages, data-parallel replicas and
/// tensor-parallel degree (ranks numbered stage-major, then replica, then tensor-parallel
/// member, as the plan numbers them) and the parameters the tensor-parallel ranks split.
#[derive(Clone, Debug, PartialEq)]
pub struct RankLayout {
    /// Data-parallel replicas.
    pub dp: usize,
    /// Ranks of each tensor-parallel group.
    pub tp: usize,
    /// Split parameters (path → dim), when `tp` > 1.
    pub splits: BTreeMap<String, usize>,
    /// The `optimizer_shard` level (0–3) over the `dp` replicas.
    pub optimizer_shard: u8,
    /// The pipeline, when the plan has more than one stage.
    pub pipeline: Option<PipelineLayout>,
    /// Whether the ops between the layers' matmuls run on a block of the sequence (the plan's
    /// `sequence_parallel`, when `tp` > 1).
    pub sequence_parallel: bool,
}

/// A plan's pipeline as its ranks run it.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineLayout {
    /// Each stage's layers, `[first, end)` ranges (the plan's): under an interleaved schedule
    /// a stage is one chunk of a device's, in layer order.
    pub layers: Vec<Vec<[usize; 2]>>,
    /// The devices the stages run on (stage `k` on device `k mod devices`): as many as the
    /// stages but under an interleaved schedule, whose devices each hold several.
    pub devices: usize,
    /// Micro-batches per step of each replica.
    pub micro_batches: usize,
    /// The order each stage runs its micro-batches' passes in (GPipe, 1F1B or interleaved).
    pub schedule: Schedule,
}

impl PipelineLayout {
    /// Whether the stages are chunks of an interleaved schedule, several per device.
    pub fn interleaved(&self) -> bool {
        self.layers.len() > self.devices
    }

    /// The pipeline device that runs stage `stage`: itself, or for a chunk its device.
    pub fn device_of(&self, stage: usize) -> usize {
        stage % self.devices.max(1)
    }
}

/// Where one rank sits in a [`RankLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankCoords {
    /// Its pipeline stage.
    pub stage: usize,
    /// Its data-parallel replica.
    pub replica: usize,
    /// Its member index in the tensor-parallel group.
    pub part: usize,
}

impl RankLayout {
    /// The layout of one device.
    pub fn one() -> RankLayout {
        RankLayout {
            dp: 1,
            tp: 1,
            splits: BTreeMap::new(),
            optimizer_shard: 0,
            pipeline: None,
            sequence_parallel: false,
        }
    }

    /// The devices of the plan: the ranks but under an interleaved schedule, whose devices
    /// each run several chunk-stages as ranks of their own.
    pub fn devices(&self) -> usize {
        let stages = self.pipeline.as_ref().map_or(1, |p| p.devices);
        stages * self.dp * self.tp
    }

    /// The device (in the plan's numbering, stage-major as the ranks) that runs the rank at
    /// `coords`: its own, but for a chunk-stage of an interleaved schedule its device's.
    pub fn device(&self, coords: RankCoords) -> usize {
        let stage = self
            .pipeline
            .as_ref()
            .map_or(0, |p| p.device_of(coords.stage));
        (stage * self.dp + coords.replica) * self.tp + coords.part
    }

    /// The device of each rank, in rank order ([`RankLayout::device`]): the process of an
    /// MPI world that runs it.
    pub fn rank_devices(&self) -> Vec<usize> {
        (0..self.ranks())
            .map(|rank| self.device(self.coords(rank)))
            .collect()
    }

    /// Whether the stages are chunks of an interleaved schedule, several per device.
    pub fn interleaved(&self) -> bool {
        self.pipeline
            .as_ref()
            .is_some_and(PipelineLayout::interleaved)
    }

    /// The ranks: `pp` × `dp` × `tp` (under an interleaved schedule more than the devices).
    pub fn ranks(&self) -> usize {
        self.pp() * self.dp * self.tp
    }

    /// Pipeline stages (1 without a pipeline).
    pub fn pp(&self) -> usize {
        self.pipeline.as_ref().map_or(1, |p| p.layers.len())
    }

    /// The device mesh of the ranks: `pp` × `dp` × `tp`.
    pub fn mesh(&self) -> Result<Mesh, RanksError> {
        Mesh::new(vec![
            (PIPELINE_AXIS.to_string(), self.pp()),
            (DATA_AXIS.to_string(), self.dp),
            (TENSOR_AXIS.to_string(), self.tp),
        ])
        .map_err(|e| RanksError::new(Code::E0970, e.message))
    }

    /// Where `rank` sits.
    pub fn coords(&self, rank: usize) -> RankCoords {
        let per_stage = (self.dp * self.tp).max(1);
        let within = rank % per_stage;
        RankCoords {
            stage: rank / per_stage,
            replica: within / self.tp.max(1),
            part: within % self.tp.max(1),
        }
    }

    /// The rank at `coords`.
    pub fn rank(&self, coords: RankCoords) -> usize {
        (coords.stage * self.dp + coords.replica) * self.tp + coords.part
    }

    /// The group a rank's tensor-parallel rewrite splits over: the `tp` ranks of its row.
    pub fn tensor_group(&self) -> mslc_ir::shard::Group {
        mslc_ir::shard::Group::new(TENSOR_AXIS, self.tp)
    }

    /// How a rank splits its forward over `group` (its [`RankLayout::tensor_group`]); `None`
    /// when `tp` is 1.
    pub fn tensor<'a>(&'a self, group: &'a mslc_ir::shard::Group) -> Option<TensorSplits<'a>> {
        (self.tp > 1).then_some(TensorSplits {
            splits: &self.splits,
            group,
            sequence_parallel: self.sequence_parallel,
        })
    }
}

/// How each of `world` ranks runs `plan` (no plan: one device). An error when `world` differs
/// from the plan's device count, or when the plan asks for what is planned but not run yet
/// (a parameter split along two dims).
pub fn layout(
    plan: Option<&PlanFile>,
    world: usize,
    launcher: &str,
) -> Result<RankLayout, RanksError> {
    let (dp, tp, pp) = degrees(plan, world, launcher)?;
    let splits = match plan {
        Some(p) if tp > 1 => tensor_splits(p)?,
        _ => BTreeMap::new(),
    };
    let pipeline = match plan {
        Some(p) if pp > 1 => Some(pipeline_layout(p, pp)?),
        _ => None,
    };
    Ok(RankLayout {
        dp,
        tp,
        splits,
        optimizer_shard: plan.map_or(0, |p| p.optimizer_shard),
        pipeline,
        sequence_parallel: tp > 1 && plan.is_some_and(|p| p.sequence_parallel),
    })
}

/// The stages of `plan`'s pipeline of `pp` devices. Under an interleaved schedule of `v`
/// chunks per device the stages are the `pp × v` chunks in layer order (chunk `k` on device
/// `k mod pp`), each run as a rank of its own that takes turns with its device's other chunks
/// in Megatron-LM's order ([`crate::pipeline::device_order`]); that order needs the
/// micro-batches to be a multiple of the devices (E0972 otherwise).
fn pipeline_layout(plan: &PlanFile, pp: usize) -> Result<PipelineLayout, RanksError> {
    let chunks = usize::try_from(plan.schedule.chunks().max(1)).unwrap_or(1);
    let micro_batches = usize::try_from(plan.micro_batches.max(1)).unwrap_or(1);
    let mut ranges = vec![Vec::new(); pp];
    for group in &plan.per_device {
        if let Some(stage) = usize::try_from(group.stage).ok().filter(|&s| s < pp) {
            ranges[stage] = group.layers.clone();
        }
    }
    if ranges.iter().any(|l| l.len() != chunks) {
        return Err(RanksError::new(
            Code::E0972,
            format!("the plan does not give each of its {pp} stages {chunks} chunk(s) of layers"),
        ));
    }
    if chunks > 1 && micro_batches % pp != 0 {
        return Err(RanksError::new(
            Code::E0972,
            format!(
                "the interleaved schedule runs a multiple of the {pp} stages' micro-batches \
                 (Megatron-LM's order), not {micro_batches}"
            ),
        ));
    }
    // Chunk j of device s is the (j·pp + s)-th range of layers.
    let layers = (0..chunks * pp)
        .map(|k| vec![ranges[k % pp][k / pp]])
        .collect();
    Ok(PipelineLayout {
        layers,
        devices: pp,
        micro_batches,
        schedule: plan.schedule,
    })
}

/// The data-, tensor- and pipeline-parallel degrees of [`layout`].
fn degrees(
    plan: Option<&PlanFile>,
    world: usize,
    launcher: &str,
) -> Result<(usize, usize, usize), RanksError> {
    let layout = plan.map(|p| Layout {
        devices: p.devices,
        mesh: &p.mesh,
    });
    degree_of(layout, world, launcher)
}

/// What of a plan decides the per-rank program.
struct Layout<'a> {
    devices: i64,
    mesh: &'a BTreeMap<String, i64>,
}

/// The data-, tensor- and pipeline-parallel degrees `world` ranks run a plan with.
fn degree_of(
    plan: Option<Layout>,
    world: usize,
    launcher: &str,
) -> Result<(usize, usize, usize), RanksError> {
    check_world(plan.as_ref().map_or(1, |p| p.devices), world, launcher)?;
    let Some(plan) = plan else {
        return Ok((1, 1, 1));
    };
    let degree = |axis: &str| plan.mesh.get(axis).copied().unwrap_or(1).max(1);
    let others: Vec<String> = plan
        .mesh
        .iter()
        .filter(|(axis, &n)| !matches!(axis.as_str(), "dp" | "tp" | "pp") && n > 1)
        .map(|(axis, n)| format!("{axis} = {n}"))
        .collect();
    if !others.is_empty() {
        return Err(RanksError::new(
            Code::E0972,
            format!(
                "the plan asks for {}; the executor runs data, tensor (and sequence) and pipeline \
                 parallelism",
                others.join(", ")
            ),
        ));
    }
    Ok((
        degree("dp") as usize,
        degree("tp") as usize,
        degree("pp") as usize,
    ))
}

/// The parameters `plan` splits, each with the one dim it splits (what
/// [`mslc_ir::shard::tensor::tensor_parallel`] takes); an error for a parameter split along
/// more than one dim (not run yet).
pub fn tensor_splits(plan: &PlanFile) -> Result<BTreeMap<String, usize>, RanksError> {
    let mut splits = BTreeMap::new();
    for (path, spec) in &plan.shardings {
        let dims: Vec<usize> = spec
            .iter()
            .enumerate()
            .filter_map(|(d, a)| a.as_ref().map(|_| d))
            .collect();
        match dims[..] {
            [] => {}
            [d] => {
                splits.insert(path.clone(), d);
            }
            _ => {
                return Err(RanksError::new(
                    Code::E0972,
                    format!("`{path}` is split along {} dims; one is run", dims.len()),
                ))
            }
        }
    }
    Ok(splits)
}

/// The collectives of the ranks of `mesh` as threads of this process, of `threads` worker
/// threads each, in rank order, each waiting at most `timeout` in a collective.
pub fn thread_world(
    mesh: Mesh,
    timeout: std::time::Duration,
    threads: usize,
) -> Vec<Box<dyn Collectives>> {
    world_with_timeout(mesh, timeout, threads)
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn Collectives>)
        .collect()
}

/// A weight as a rank loads it: name, shape, dtype, bytes (borrowed from the file where the
/// rank loads the tensor whole, so a load makes no copy of what it does not cut).
pub type RankTensor<'a> = (String, Vec<usize>, StDType, Cow<'a, [u8]>);

/// Weight `t` as tensor-parallel rank `index` of `n` holds it: cut to its block when it is a
/// parameter of `splits` (E0972 when its dim does not split into `n`), else borrowed whole.
fn shard_weight<'a>(
    t: TensorRef<'a>,
    splits: &BTreeMap<String, usize>,
    index: usize,
    n: usize,
) -> Result<RankTensor<'a>, RanksError> {
    let dim = splits.get(t.name).copied();
    let (shape, data) = tensor_block(t, dim, index, n).ok_or_else(|| {
        RanksError::new(
            Code::E0972,
            format!(
                "weight `{}` {:?} does not split into {n} blocks along dim {}",
                t.name,
                t.shape,
                dim.unwrap_or_default()
            ),
        )
    })?;
    Ok((t.name.to_string(), shape, t.dtype, data))
}

/// Tensor `t` cut to tensor-parallel member `index`'s block of `n` along `dim` ([`shard_block`],
/// on the stored bytes, whatever their type; borrowed when the block is one run of them), or
/// borrowed whole when `dim` is `None`; `None` when that dim does not split into `n`.
pub fn tensor_block<'a>(
    t: TensorRef<'a>,
    dim: Option<usize>,
    index: usize,
    n: usize,
) -> Option<(Vec<usize>, Cow<'a, [u8]>)> {
    let Some(dim) = dim else {
        return Some((t.shape.to_vec(), Cow::Borrowed(t.data)));
    };
    if !one_run(t.shape, dim) {
        let (shape, data) = shard_block(t.shape, t.data, dim, index, n)?;
        return Some((shape, Cow::Owned(data)));
    }
    let (shape, mut runs) = block_runs(t.shape, t.data.len(), dim, index, n)?;
    Some((shape, Cow::Borrowed(&t.data[runs.next()?])))
}

/// Weight `w` as data-parallel member `index` holds it under level-3 optimizer sharding: its
/// f32 slice ([`zero_slice_f32`]) when it is a trained parameter of `zero`, else as it is.
fn zero_slice<'a>(w: RankTensor<'a>, zero: &ZeroShard, index: usize) -> RankTensor<'a> {
    let (name, shape, dtype, data) = w;
    if !zero.slices_param(&name) {
        return (name, shape, dtype, data);
    }
    let numel: usize = shape.iter().product();
    match zero_slice_f32(&name, dtype, numel, &data, zero, index) {
        Some(Ok(slice)) => {
            let bytes = slice.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name, vec![slice.len()], StDType::F32, Cow::Owned(bytes))
        }
        _ => (name, shape, dtype, data),
    }
}

/// Member `index`'s slice ([`ZeroShard::slice`]: its range, zero past the tensor's end) of a
/// flat tensor of `numel` elements stored as `dtype` bytes. Only the slice's elements are
/// converted to f32: the rank never holds the whole as f32. `None` when `data` does not hold
/// `numel` elements.
pub fn zero_slice_f32(
    name: &str,
    dtype: StDType,
    numel: usize,
    data: &[u8],
    zero: &ZeroShard,
    index: usize,
) -> Option<Result<Vec<f32>, SafetensorsError>> {
    let (chunk, range) = (zero.chunk(numel), zero.range(numel, index));
    let size = dtype.size();
    let part = data
        .get(range.start * size..range.end * size)
        .filter(|_| data.len() == numel * size)?;
    let values = TensorRef {
        name,
        dtype,
        shape: &[range.len()],
        data: part,
    }
    .to_f32();
    Some(values.map(|mut slice| {
        slice.resize(chunk, 0.0);
        slice
    }))
}

/// Weight `t` (whole, as one device holds it) as one rank holds it: when it is a parameter
/// of `splits`, cut to tensor-parallel member `part`'s block of `tp`; then under level-3
/// optimizer sharding (`zero`: the sharding and this rank's replica), when it is sliced, cut
/// to its slice; else borrowed whole.
pub fn rank_share<'a>(
    t: TensorRef<'a>,
    splits: &BTreeMap<String, usize>,
    (part, tp): (usize, usize),
    zero: Option<(&ZeroShard, usize)>,
) -> Result<RankTensor<'a>, RanksError> {
    let share = shard_weight(t, splits, part, tp)?;
    Ok(match zero {
        Some((z, replica)) => zero_slice(share, z, replica),
        None => share,
    })
}

/// Bytes of `t`'s stored data that cutting this rank's share of it ([`rank_share`]) reads: its
/// tensor-parallel block's ([`block_cost`]), a level-3 slice of an uncut weight its range, a
/// weight held whole all of them.
fn share_span(
    t: TensorRef<'_>,
    splits: &BTreeMap<String, usize>,
    (_, tp): (usize, usize),
    zero: Option<(&ZeroShard, usize)>,
) -> usize {
    let dim = splits.get(t.name).copied();
    match zero {
        Some((z, replica)) if dim.is_none() && z.slices_param(t.name) => {
            let numel = t.shape.iter().product();
            z.range(numel, replica).len() * t.dtype.size()
        }
        _ => block_cost(t.shape, t.data.len(), dim, tp).0,
    }
}

/// What cutting a tensor-parallel block of `n` along `dim` ([`tensor_block`]) from a tensor of
/// `shape` stored in `len` bytes costs in memory: the stored bytes it reads, and those it
/// copies. A block in one run is read in place; one spread over the rows reads them all and
/// copies the block; no split reads all and copies nothing.
pub fn block_cost(shape: &[usize], len: usize, dim: Option<usize>, n: usize) -> (usize, usize) {
    match dim {
        None => (len, 0),
        Some(d) if one_run(shape, d) => (len / n.max(1), 0),
        Some(_) => (len, len / n.max(1)),
    }
}

/// Whether every block along `dim` of a tensor of `shape` is one run of its stored bytes: no
/// dim before `dim` is longer than 1.
fn one_run(shape: &[usize], dim: usize) -> bool {
    shape.iter().take(dim).all(|&d| d <= 1)
}

/// Loads into `exec` the weights `tensors` of `file` (whole, as one device holds them) as one
/// rank holds them ([`rank_share`]). Every share is cut once to learn its shape, so that all
/// are checked against the program before any is written, then again, one at a time, as the
/// executor copies it; and each tensor's pages of the file are dropped once read
/// ([`SafetensorsFile::release`]). So the rank holds one share beside its parameters, not a
/// copy of them. The framework bookkeeping tensors the file has are returned (E0601 when the
/// weights do not fit the program).
pub fn load_rank_weights<'a>(
    exec: &mut mslc_exec::Executor,
    file: &'a SafetensorsFile,
    tensors: impl IntoIterator<Item = TensorRef<'a>>,
    splits: &BTreeMap<String, usize>,
    share: (usize, usize),
    zero: Option<(&ZeroShard, usize)>,
) -> Result<Vec<(String, &'static str)>, RanksError> {
    let whole: Vec<TensorRef<'a>> = tensors.into_iter().collect();
    let mut shapes = Vec::with_capacity(whole.len());
    for &t in &whole {
        let (_, shape, dtype, data) = rank_share(t, splits, share, zero)?;
        if let Cow::Owned(_) = data {
            file.release(t.data);
        }
        shapes.push((shape, dtype));
    }
    let specs = whole
        .iter()
        .zip(&shapes)
        .map(|(t, (shape, dtype))| TensorRef {
            name: t.name,
            dtype: *dtype,
            shape,
            data: t.data,
        });
    let by_name: BTreeMap<&str, TensorRef<'a>> = whole.iter().map(|t| (t.name, *t)).collect();
    let fetch = |spec: TensorRef| {
        let t = by_name[spec.name];
        let (_, _, _, data) = rank_share(t, splits, share, zero).map_err(|e| e.message)?;
        Ok((data, share_span(t, splits, share, zero)))
    };
    exec.load_weights_fetched(specs, fetch, |spec| file.release(spec.data))
        .map_err(|e| RanksError::new(Code::E0601, e.message))
}

/// Initialises the parameters of `exec`'s program from their declared init under `seed` as
/// one rank holds them, so a sharded run starts from the weights `--init-seed` gives one
/// device: the rank's values of each parameter — the whole tensor, its tensor-parallel block
/// (its dim `tp` times the rank's), and of that its level-3 slice under `zero` (zero past
/// the end) — are drawn where one device draws them ([`mslc_exec::init::fill_at`]), and no
/// other value is: a rank never holds a whole parameter it does not keep.
pub fn init_rank_weights(
    exec: &mut mslc_exec::Executor,
    seed: u64,
    splits: &BTreeMap<String, usize>,
    (part, tp): (usize, usize),
    zero: Option<(&ZeroShard, usize)>,
) -> Result<(), RanksError> {
    exec.init_params_with(|path, init, ty, values| {
        let sliced = zero.filter(|(z, _)| z.slices_param(path));
        // The rank's tensor-parallel block (or the whole parameter): per index of the dims
        // before the split dim, one run of `block` values of a whole row of `row`.
        let shape: Vec<usize> = match sliced {
            Some((z, _)) => z.shapes[path].clone(),
            None => ty.shape.iter().map(|&d| d.max(0) as usize).collect(),
        };
        let dim = splits.get(path).copied().filter(|&d| d < shape.len());
        let (outer, block, row, part) = match dim {
            Some(d) => {
                let block: usize = shape[d..].iter().product();
                (shape[..d].iter().product(), block, block * tp, part)
            }
            None => {
                let numel: usize = shape.iter().product();
                (1, numel, numel, 0)
            }
        };
        let numel: usize = outer * block;
        // Of the block's flat values, the rank's range: its level-3 slice, or all of them.
        let (range, held) = match sliced {
            Some((z, replica)) => (z.range(numel, replica), z.chunk(numel)),
            None => (0..numel, numel),
        };
        let (start, end) = (range.start, range.end);
        if held != values.len() {
            return Err(RanksError::new(
                Code::E0601,
                format!(
                    "`{path}`: this rank's share has {held} values, but its program holds {}",
                    values.len()
                ),
            ));
        }
        values[end - start..].fill(0.0);
        let mut j = start;
        while j < end {
            let (o, within) = (j / block, j % block);
            let run = (block - within).min(end - j);
            let out = &mut values[j - start..j - start + run];
            mslc_exec::init::fill_at(init, seed, path, o * row + part * block + within, out);
            j += run;
        }
        Ok(())
    })
}

/// Rank `index`'s block of `data` (of shape `shape`), cut along `dim` into `n` equal blocks:
/// what a tensor-parallel rank holds of a whole weight. `None` when the dim does not split.
pub fn shard_block(
    shape: &[usize],
    data: &[u8],
    dim: usize,
    index: usize,
    n: usize,
) -> Option<(Vec<usize>, Vec<u8>)> {
    let (local, runs) = block_runs(shape, data.len(), dim, index, n)?;
    Some((local, runs.flat_map(|r| &data[r]).copied().collect()))
}

/// Member `index`'s block of `n` along `dim` of a tensor of `shape` stored in `len` bytes: its
/// shape, and the byte ranges it takes, one per index of the dims before `dim`. `None` when
/// `dim` does not split into `n`.
fn block_runs(
    shape: &[usize],
    len: usize,
    dim: usize,
    index: usize,
    n: usize,
) -> Option<(Vec<usize>, impl Iterator<Item = std::ops::Range<usize>>)> {
    let size = *shape.get(dim)?;
    if n == 0 || size % n != 0 || len == 0 {
        return None;
    }
    let outer: usize = shape[..dim].iter().product();
    let row = len / outer.max(1);
    let block = row / n;
    let mut local = shape.to_vec();
    local[dim] = size / n;
    let runs = (0..outer).map(move |o| {
        let start = o * row + index * block;
        start..start + block
    });
    Some((local, runs))
}

/// Worker threads per rank when `--threads` is not given: the cores shared among the ranks.
pub fn threads_per_rank(given: Option<usize>, ranks: usize) -> usize {
    given.unwrap_or_else(|| {
        let cores = mslc_kernels::par::cores();
        (cores / ranks.max(1)).max(1)
    })
}

/// The error to report when ranks failed: the first that is not a rank stopping because
/// another one left (E0973), which names the real cause; else the first.
pub fn root_cause<E>(errors: Vec<E>, code: impl Fn(&E) -> Option<Code>) -> Option<E> {
    let first_real = errors.iter().position(|e| code(e) != Some(Code::E0973));
    let mut errors = errors;
    match first_real {
        Some(i) => Some(errors.swap_remove(i)),
        None => errors.into_iter().next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The degree `world` ranks run a plan of `mesh` with.
    fn run(
        mesh: &[(&str, i64)],
        world: usize,
        launcher: &str,
    ) -> Result<(usize, usize, usize), RanksError> {
        let mesh: BTreeMap<String, i64> = mesh.iter().map(|(a, n)| (a.to_string(), *n)).collect();
        let layout = Layout {
            devices: mesh.values().product(),
            mesh: &mesh,
        };
        degree_of(Some(layout), world, launcher)
    }

    #[test]
    fn the_world_must_match_the_plan() {
        let dp = [("dp", 2), ("tp", 1), ("pp", 1)];
        assert_eq!(run(&dp, 2, "--ranks"), Ok((2, 1, 1)));
        let e = run(&dp, 4, "--ranks").unwrap_err();
        assert_eq!(e.code, Code::E0970);
        assert!(e.message.contains("started 4 rank(s), but the plan has 2"));
        let e = run(&dp, 1, "mpiexec").unwrap_err();
        assert!(e.message.contains("without mpiexec"), "{}", e.message);
        assert_eq!(degrees(None, 1, "--ranks"), Ok((1, 1, 1)));
    }

    #[test]
    fn an_axis_the_executor_does_not_know_is_refused() {
        assert_eq!(
            run(&[("dp", 1), ("tp", 2), ("pp", 2)], 4, "--ranks"),
            Ok((1, 2, 2))
        );
        let e = run(&[("dp", 1), ("ep", 2)], 2, "--ranks").unwrap_err();
        assert_eq!(e.code, Code::E0972);
        assert!(e.message.contains("ep = 2"), "{}", e.message);
    }

    /// Ranks are numbered stage-major, then replica, then tensor-parallel member.
    #[test]
    fn a_rank_and_its_coords_agree() {
        let layout = RankLayout {
            dp: 2,
            tp: 2,
            pipeline: Some(PipelineLayout {
                layers: vec![vec![[0, 1]], vec![[1, 2]]],
                devices: 2,
                micro_batches: 4,
                schedule: Schedule::OneFOneB,
            }),
            ..RankLayout::one()
        };
        let c = layout.coords(6);
        assert_eq!((c.stage, c.replica, c.part), (1, 1, 0));
        for rank in 0..8 {
            assert_eq!(layout.rank(layout.coords(rank)), rank);
        }
        assert_eq!(layout.mesh().unwrap().coords(6), [1, 1, 0]);
    }

    /// Two replicas' parts of a `[2, 3]` tensor of 2-byte values (an odd number of f32 words
    /// each) gathered along dim 1 give the `[2, 6]` whole, row by row, on both members.
    #[test]
    fn gathered_parts_concatenate_along_their_dim() {
        let mesh = Mesh::line(DATA_AXIS, 2).unwrap();
        let parts: Vec<Vec<u8>> = (0..2u8)
            .map(|m| (0..12).map(|i| m * 100 + i).collect())
            .collect();
        let got: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let handles: Vec<_> = thread_world(mesh, mslc_exec::collectives::DEFAULT_TIMEOUT, 1)
                .into_iter()
                .zip(&parts)
                .map(|(mut comm, part)| {
                    scope.spawn(move || gather_bytes(comm.as_mut(), DATA_AXIS, 1, &[2, 3], part))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        let want: Vec<u8> = [
            &parts[0][..6],
            &parts[1][..6],
            &parts[0][6..],
            &parts[1][6..],
        ]
        .concat();
        assert_eq!(got, vec![want.clone(), want]);
        assert_eq!(gather_dim(&[2, 6], &[2, 3], 2), Some(1));
        assert_eq!(gather_dim(&[5], &[5], 2), None);
    }

    /// A tensor-parallel block in one run of the stored bytes (split on the first dim longer
    /// than 1) is borrowed from them; one spread over rows is copied; both hold the block's
    /// bytes, and [`block_cost`] says what each reads and copies.
    #[test]
    fn a_block_in_one_run_is_borrowed_and_a_spread_one_copied() {
        let bytes: Vec<u8> = (0..24).collect();
        let t = |shape: &'static [usize]| TensorRef {
            name: "w",
            dtype: StDType::Bool,
            shape,
            data: &bytes,
        };
        let (shape, first) = tensor_block(t(&[1, 4, 6]), Some(1), 1, 2).unwrap();
        assert_eq!(shape, [1, 2, 6]);
        assert!(matches!(first, Cow::Borrowed(_)));
        assert_eq!(&first[..], &bytes[12..]);
        assert_eq!(block_cost(&[1, 4, 6], 24, Some(1), 2), (12, 0));
        let (shape, spread) = tensor_block(t(&[4, 6]), Some(1), 1, 2).unwrap();
        assert_eq!(shape, [4, 3]);
        assert!(matches!(spread, Cow::Owned(_)));
        let want: Vec<u8> = (0..4).flat_map(|r| r * 6 + 3..r * 6 + 6).collect();
        assert_eq!(&spread[..], &want[..]);
        assert_eq!(block_cost(&[4, 6], 24, Some(1), 2), (24, 12));
        assert_eq!(block_cost(&[4, 6], 24, None, 2), (24, 0));
        assert!(tensor_block(t(&[4, 6]), Some(0), 0, 3).is_none());
    }

    /// A level-3 slice of a weight stored as f16 (7 values over 2 replicas: the second slice
    /// padded) is the slice of the whole converted to f32, converting only the slice's bytes;
    /// a tensor the sharding does not slice is handed back as it is.
    #[test]
    fn a_level3_slice_converts_only_its_own_values() {
        let zero = ZeroShard {
            level: 3,
            group: mslc_ir::shard::Group::new(DATA_AXIS, 2),
            shapes: BTreeMap::from([("w".to_string(), vec![7])]),
        };
        let values = [0.5f32, -1.0, 2.0, 3.5, -0.25, 8.0, 1.5];
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let slices: Vec<Vec<f32>> = (0..2)
            .map(|replica| {
                let w = (
                    "w".to_string(),
                    vec![7],
                    StDType::F16,
                    Cow::Borrowed(&bytes[..]),
                );
                let (_, shape, dtype, data) = zero_slice(w, &zero, replica);
                assert_eq!((shape, dtype), (vec![4], StDType::F32));
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            })
            .collect();
        assert_eq!(slices, [zero.slice(&values, 0), zero.slice(&values, 1)]);
        let other = (
            "b".to_string(),
            vec![7],
            StDType::F16,
            Cow::Borrowed(&bytes[..]),
        );
        assert_eq!(zero_slice(other, &zero, 1).3, &bytes[..]);
    }

    #[test]
    fn the_root_cause_is_not_a_rank_that_stopped() {
        let errors = vec![(Code::E0973, "left"), (Code::E0601, "bad weights")];
        let e = root_cause(errors, |e| Some(e.0)).unwrap();
        assert_eq!(e.1, "bad weights");
        assert_eq!(
            root_cause(vec![(Code::E0973, "x")], |e| Some(e.0))
                .unwrap()
                .1,
            "x"
        );
    }
}
