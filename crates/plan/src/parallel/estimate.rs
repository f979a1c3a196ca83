//! Per-device memory and step time of one parallel strategy on a [`Workload`]: ZeRO's model
//! states per optimizer-shard level, the activations each pipeline schedule holds in flight
//! under the recompute choice, communication buffers, workspace, and a roofline-plus-collectives
//! step time (docs/parallel.md states every formula and the calibration).

use serde::Serialize;

use super::workload::{Segment, Workload};
use crate::target::Target;

/// Fraction of a device's peak FLOP/s the matmul-heavy ops reach. Calibrated once against
/// Megatron-LM's GPT-3 175B on 1,024 A100s (Narayanan et al. 2021, §5.1: 140 TFLOP/s per GPU);
/// docs/parallel.md lists the other published results it is checked against.
pub const COMPUTE_EFFICIENCY: f64 = 0.85;
/// Fraction of the memory bandwidth streaming ops reach.
pub const BANDWIDTH_EFFICIENCY: f64 = 0.8;
/// Fraction of link bandwidth a ring collective reaches (NCCL's bus bandwidth on NVLink/IB).
pub const LINK_EFFICIENCY: f64 = 0.8;
/// Per-hop latency of a collective step, seconds.
pub const HOP_LATENCY_S: f64 = 5e-6;
/// Share of the other terms kept free for allocator fragmentation (counted in `workspace`).
pub const FRAGMENTATION: f64 = 0.05;
/// The same reserve on mslc's own executor ([`super::ExecutorMemory`]), where every buffer is
/// known and so is what it keeps for its prepared programs: what a rank holds beyond both — the
/// allocator's slack and per-thread arenas, thread stacks, its loop's small state — measured
/// 0.8–4.0 % above them over the runs of `tests/it/plan_measured.rs` (one device, data, tensor
/// and pipeline parallel, optimizer sharding, an interleaved device, checkpoints written and
/// read) with this reserve, and 0.4–4.1 % under MPI (`tests/mpi_train.rs`): within the 5 %
/// above the measured peak that issue 10 asks and never below it.
pub const EXECUTOR_RESERVE: f64 = 0.03;
/// The part of the executor's reserve that does not grow with the model: what its threads'
/// stacks and the allocator's per-thread heaps touch. With the programs counted
/// ([`crate::memory::MemoryPlan::program_bytes`]) a 1.2 MiB data-parallel rank under MPI
/// (`tests/mpi_train.rs`'s classifier) measured 1.95–2.00 MB against 2.03–2.04 MB planned
/// with it (+1.3 to +4.7 %; +7.4 to +9.8 % with 192 KiB and the programs uncounted), the 2 MiB
/// tensor-parallel tiny LLaMA 2.76–2.80 MB against 2.87 (+2.4 to +4.1 %; a debug build
/// measures the least).
pub const EXECUTOR_FIXED_RESERVE: u64 = 80 * 1024;

/// What a device's process holds under MPI beyond its planned buffers and the executor's
/// reserve, for each other process on its machine ([`mpi_reserve`]): MPI's shared-memory
/// transport, which the process brings to its steady state before the first step by
/// exchanging messages with each of them (`mslc_exec::collectives::mpi::MpiWorld::warm_up`),
/// so its run holds the same after one step or a thousand. Measured with MPICH 4.0 on UCX
/// over shared memory, past the plan without it: on 2 processes the 2 MiB tensor-parallel
/// tiny LLaMA of `tests/mpi_train.rs` 750–800 KB after 1 to 400 steps (before the warm-up:
/// 92 KB after one step, 430 KB after 16 and more), a pipeline stage of it 763 KB after 600;
/// on 4 processes examples/mlp.msl (2 × 2 data and tensor parallel) 2.39–2.43 MB after 1 to
/// 400 steps. That mlp row also held the MPI backend's sum buffers (every member's copy of its
/// gradient blocks, 600 KB there), which the plan does not count; since sums go point to point
/// (`MpiRank::scatter_over`: only the others' parts of its own block, 200 KB there) the row
/// measures 0.45 MB less, and 800 KiB puts it +3.6 to +4.0 % above its measured peak, the
/// tensor-parallel tiny LLaMA +0.9 to +1.1 % and the pipeline rows +0.6 to +0.9 %
/// (`tests/mpi_train.rs`). Processes on other machines: [`MPI_NETWORK_PEER_RESERVE`].
pub const MPI_PEER_RESERVE: u64 = 800 * 1024;

/// What a device's process holds under MPI for each process on another machine
/// ([`mpi_reserve`]), reached over the network: UCX's TCP transport. Measured with MPICH 4.0 on
/// UCX 1.13 (`UCX_TLS=tcp,self`), each of examples/mlp.msl's 4 processes in a UTS namespace
/// of its own named as another machine (`unshare --uts`), so that each saw the other three
/// elsewhere and reached them over TCP: 0.78 MiB a process past the plan without it, the same
/// after 1, 100 and 400 steps (no warm-up needed), 266 KB a peer; with 320 KiB the row is
/// +2 % above its measured peak. InfiniBand and other transports are not measured.
pub const MPI_NETWORK_PEER_RESERVE: u64 = 320 * 1024;

/// [`MPI_PEER_RESERVE`] for each other of the `here` processes on a device's machine (itself
/// included), and [`MPI_NETWORK_PEER_RESERVE`] for each of the `elsewhere` on other machines.
pub fn mpi_reserve(here: usize, elsewhere: usize) -> u64 {
    MPI_PEER_RESERVE
        .saturating_mul(here.saturating_sub(1) as u64)
        .saturating_add(MPI_NETWORK_PEER_RESERVE.saturating_mul(elsewhere as u64))
}

/// The executor's reserve beside `held` planned bytes: [`EXECUTOR_RESERVE`] of them and
/// [`EXECUTOR_FIXED_RESERVE`].
pub fn executor_reserve(held: u64) -> u64 {
    ((held as f64 * EXECUTOR_RESERVE) as u64).saturating_add(EXECUTOR_FIXED_RESERVE)
}
/// The gradient bucket data-parallel reduction fills before sending (PyTorch DDP's 25 MB).
pub const GRAD_BUCKET_BYTES: u64 = 25_000_000;

/// Which activations are recomputed in the backward instead of kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    /// Keep every activation.
    None,
    /// Recompute the attention scores (Korthikanti et al.'s selective recompute).
    Selective,
    /// Keep only each layer's input; recompute the layer in the backward.
    Full,
}

/// How pipeline stages order micro-batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// All forwards, then all backwards: every micro-batch's activations alive at once.
    GPipe,
    /// One forward, one backward: stage `i` of `p` holds at most `p − i` micro-batches.
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// 1F1B over `v` model chunks per device (Narayanan et al. 2021, §2.2.2): device `i` runs
    /// chunks `i, i + p, …`; the bubble shrinks to (p − 1)/(m·v), and device `i` holds up to
    /// `v·p + p − 1 − 2i` chunk-micro-batches (Megatron-LM's warm-up count + 1).
    Interleaved(i64),
}

impl Schedule {
    /// Model chunks per device: `v` interleaved, else 1.
    pub fn chunks(self) -> i64 {
        match self {
            Schedule::Interleaved(v) => v.max(1),
            _ => 1,
        }
    }

    /// The `.msl` spelling.
    pub fn name(self) -> String {
        match self {
            Schedule::GPipe => "gpipe".into(),
            Schedule::OneFOneB => "1f1b".into(),
            Schedule::Interleaved(v) => format!("interleaved({v})"),
        }
    }
}

/// One parallel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Strategy {
    /// Data-parallel degree.
    pub dp: i64,
    /// Tensor-parallel degree.
    pub tp: i64,
    /// Pipeline stages.
    pub pp: i64,
    /// Micro-batches per step on each data-parallel replica.
    pub micro_batches: i64,
    /// The pipeline schedule.
    pub schedule: Schedule,
    /// Optimizer-shard level: 0 none, 1–3 ZeRO stages (MindSpore level1–level3).
    pub optimizer_shard: u8,
    /// What the backward recomputes.
    pub recompute: Recompute,
    /// Sequence parallelism (Korthikanti et al. 2022) over the tensor-parallel axis: the
    /// activations outside the split matmuls (norms, dropout, residuals) split along the
    /// sequence, each tensor-parallel all-reduce an all-gather/reduce-scatter pair.
    pub sequence_parallel: bool,
}

impl Strategy {
    /// Devices the strategy uses.
    pub fn devices(&self) -> i64 {
        self.dp.saturating_mul(self.tp).saturating_mul(self.pp)
    }
}

/// How training stores each parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Training {
    /// Bytes of a parameter as the forward reads it (2 under O2/O3 f16/bf16, else 4).
    pub param_bytes: u64,
    /// Bytes of a gradient.
    pub grad_bytes: u64,
    /// Bytes per parameter of optimizer state: an f32 master copy when parameters are
    /// low-precision, plus the optimizer's moments (Adam: 8).
    pub state_bytes: u64,
    /// Bytes per activation element.
    pub act_bytes: u64,
}

/// The per-device memory breakdown, bytes: what one rank of a stage holds at its peak — the
/// five parts every training step has ([`crate::memory::Breakdown`], their one definition) and
/// what only a sharded step adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// Parameters (their shard), gradients, optimizer states (master weights included),
    /// activations kept for the backward for every micro-batch in flight, and workspace (the
    /// largest op's transient and its gradient).
    #[serde(flatten)]
    pub step: crate::memory::Breakdown,
    /// Communication buffers: gradient buckets, all-reduce and pipeline send/recv buffers,
    /// gathered parameters under level 3.
    pub communication: u64,
    /// Kept free for the allocator's fragmentation: [`FRAGMENTATION`] of the rest.
    pub fragmentation: u64,
    /// The sum.
    pub total: u64,
}

impl Breakdown {
    /// `step` with `communication` and the fragmentation reserve added, totalled.
    pub fn of(step: crate::memory::Breakdown, communication: u64) -> Breakdown {
        let rest = step.total().saturating_add(communication);
        let fragmentation = (rest as f64 * FRAGMENTATION) as u64;
        Breakdown {
            step,
            communication,
            fragmentation,
            total: rest.saturating_add(fragmentation),
        }
    }

    /// The seven parts, named for reports, in order: the step's five with communication before
    /// the workspace, then the fragmentation reserve.
    pub fn rows(&self) -> [(&'static str, u64); 7] {
        let [p, g, o, a, w] = self.step.rows();
        [
            p,
            g,
            o,
            a,
            ("communication", self.communication),
            w,
            ("fragmentation reserve", self.fragmentation),
        ]
    }

    /// `parameters 650 GiB + gradients … + fragmentation reserve …`.
    pub fn text(&self) -> String {
        crate::memory::rows_text(&self.rows(), " + ")
    }
}

/// What one pipeline stage holds and takes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageEstimate {
    /// Stage index.
    pub stage: i64,
    /// The layers it runs, as `[first, end)` indices into the workload's layers: one range,
    /// or one per model chunk under the interleaved schedule.
    pub layers: Vec<(usize, usize)>,
    /// Memory of its worst rank.
    pub memory: Breakdown,
    /// Forward plus backward compute per micro-batch, seconds.
    pub compute_s: f64,
    /// Tensor-parallel and pipeline communication per micro-batch, seconds.
    pub communication_s: f64,
}

/// A collective a step performs on every device of a stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Collective {
    /// `all_reduce`, `all_gather`, `reduce_scatter`, `send_recv`.
    pub kind: &'static str,
    /// The mesh axis: `tp`, `dp`, `pp`.
    pub axis: &'static str,
    /// Bytes per call.
    pub bytes: u64,
    /// Calls per step.
    pub count: u64,
}

/// Everything the cost model says about one strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The strategy.
    pub strategy: Strategy,
    /// Per stage.
    pub stages: Vec<StageEstimate>,
    /// Estimated seconds per optimizer step.
    pub step_time_s: f64,
    /// Compute on the critical path.
    pub compute_s: f64,
    /// Communication not hidden behind compute.
    pub communication_s: f64,
    /// Idle share of the pipeline.
    pub bubble_fraction: f64,
    /// Collectives per step of the slowest stage's device.
    pub collectives: Vec<Collective>,
}

impl Estimate {
    /// The largest total over the stages.
    pub fn peak_bytes(&self) -> u64 {
        self.stages
            .iter()
            .map(|s| s.memory.total)
            .max()
            .unwrap_or(0)
    }
}

/// A device cluster: the target's devices and the budget each may use.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The device.
    pub target: Target,
    /// Bytes one device may use.
    pub budget: u64,
}

impl Cluster {
    /// The one-way bandwidth of a ring over `group` ranks spaced `stride` apart: the
    /// intra-node link when the ring stays inside a node, the network otherwise (targets quote
    /// both directions summed, hence the half).
    fn link(&self, group: i64, stride: i64) -> f64 {
        let node = self.target.devices_per_node.max(1);
        let inside = group.saturating_mul(stride) <= node;
        LINK_EFFICIENCY / 2.0
            * if inside {
                self.target.interconnect
            } else {
                self.target.network
            }
    }

    /// Seconds of a ring all-reduce of `bytes` over `group` ranks (2(n−1)/n of the bytes each
    /// way); an all-gather or a reduce-scatter is half of it.
    pub fn all_reduce_s(&self, bytes: u64, group: i64, stride: i64) -> f64 {
        if group <= 1 {
            return 0.0;
        }
        let n = group as f64;
        2.0 * (n - 1.0) / n * bytes as f64 / self.link(group, stride).max(1.0)
            + 2.0 * (n - 1.0) * HOP_LATENCY_S
    }
}

/// Splits the layers into `pp` contiguous stages minimising the slowest stage's time (the
/// first stage also runs the head, the last the tail); `[first, end)` per stage. For the
/// interleaved schedule `pp` is the stage count × the chunks per device.
pub fn split_stages(w: &Workload, tp: i64, sp: bool, pp: i64) -> Vec<(usize, usize)> {
    let l = w.layers.len();
    let p = (pp.max(1) as usize).min(l.max(1));
    let seg_time = |s: &Segment| seg_time(s, tp, sp);
    let t: Vec<f64> = w.layers.iter().map(seg_time).collect();
    let mut prefix = vec![0.0; l + 1];
    for i in 0..l {
        prefix[i + 1] = prefix[i] + t[i];
    }
    let (head, tail) = (seg_time(&w.head), seg_time(&w.tail));
    let cost = |s: usize, a: usize, b: usize| {
        prefix[b] - prefix[a]
            + if s == 0 { head } else { 0.0 }
            + if s + 1 == p { tail } else { 0.0 }
    };
    // best[s][i]: the least max-stage time of stages 0..=s covering layers 0..i.
    let mut best = vec![vec![f64::INFINITY; l + 1]; p];
    let mut cut = vec![vec![0usize; l + 1]; p];
    for (i, b) in best[0].iter_mut().enumerate().skip(1) {
        *b = cost(0, 0, i);
    }
    for s in 1..p {
        for i in s + 1..=l {
            for j in s..i {
                let v = best[s - 1][j].max(cost(s, j, i));
                if v < best[s][i] {
                    best[s][i] = v;
                    cut[s][i] = j;
                }
            }
        }
    }
    let mut bounds = vec![(0, l); p];
    let mut end = l;
    for s in (0..p).rev() {
        let start = if s == 0 { 0 } else { cut[s][end] };
        bounds[s] = (start, end);
        end = start;
    }
    bounds
}

/// Forward seconds of a segment at tensor-parallel degree `tp`, with sequence parallelism
/// splitting the unsplit ops on sequence-long tensors too.
fn seg_time(s: &Segment, tp: i64, sp: bool) -> f64 {
    let t = tp.max(1) as f64;
    let seq = if sp { s.seq_seconds } else { 0.0 };
    s.rep_seconds - seq + (s.split_seconds + seq) / t
}

/// Activation bytes a segment keeps per micro-batch without recompute (the split ones as
/// split; under sequence parallelism the sequence-long ones split too).
pub fn kept_bytes(s: &Segment, tp: i64, sp: bool) -> u64 {
    let seq = if sp { s.seq_acts } else { 0 };
    s.rep_acts - seq + seq.div_ceil(tp.max(1) as u64) + s.split_acts
}

/// The bytes of a segment's inputs (what full recompute keeps), split along the sequence
/// under sequence parallelism.
pub fn input_bytes(s: &Segment, tp: i64, sp: bool) -> u64 {
    let seq = if sp { s.seq_input_bytes } else { 0 };
    s.input_bytes - seq + seq.div_ceil(tp.max(1) as u64)
}

/// The layer ranges of each device: `pp` contiguous stages, or under the interleaved schedule
/// `pp × v` chunks dealt round-robin (device `i` runs chunks `i, i + pp, …`).
pub fn device_chunks(w: &Workload, strategy: &Strategy) -> Vec<Vec<(usize, usize)>> {
    let v = strategy.schedule.chunks();
    let chunks = split_stages(w, strategy.tp, strategy.sequence_parallel, strategy.pp * v);
    let p = (chunks.len() as i64 / v).max(1) as usize;
    let mut devices = vec![Vec::new(); p];
    for (i, c) in chunks.into_iter().enumerate() {
        devices[i % p].push(c);
    }
    devices
}

/// Megatron-LM's scatter/gather of pipeline sends (Narayanan et al. 2021, §4.1): with tensor
/// parallelism the `tp` ranks of a stage hold the same boundary activation, so each sends
/// only its 1/tp slice over the inter-node link and the next stage all-gathers the slices
/// over the intra-node link. Returns the bytes each rank sends of a `boundary`-byte
/// activation and whether the receiver gathers; under sequence parallelism the activation
/// is already split along the sequence and is sent as it is.
pub fn scatter_gather(boundary: u64, tp: i64, sp: bool) -> (u64, bool) {
    if tp > 1 && !sp {
        (boundary.div_ceil(tp as u64), true)
    } else {
        (boundary, false)
    }
}

/// Estimates `strategy` on workload `w` (propagated for `strategy.tp`).
pub fn estimate(w: &Workload, strategy: Strategy, train: Training, cluster: &Cluster) -> Estimate {
    let bounds = device_chunks(w, &strategy);
    estimate_split(w, &bounds, strategy, train, cluster)
}

/// [`estimate`] with each device's layers given (from [`device_chunks`]).
pub fn estimate_split(
    w: &Workload,
    bounds: &[Vec<(usize, usize)>],
    strategy: Strategy,
    train: Training,
    cluster: &Cluster,
) -> Estimate {
    let Strategy {
        dp,
        tp,
        micro_batches: m,
        ..
    } = strategy;
    let p = bounds.len() as i64;
    let mut stages = Vec::with_capacity(bounds.len());
    let mut collectives: Vec<Collective> = Vec::new();
    let mut slowest = (0.0f64, 0.0f64, 0usize);
    for (s, ranges) in bounds.iter().enumerate() {
        let mut segs: Vec<&Segment> = ranges.iter().flat_map(|&(a, b)| &w.layers[a..b]).collect();
        if s == 0 {
            segs.insert(0, &w.head);
        }
        if s + 1 == bounds.len() {
            segs.push(&w.tail);
        }
        let (memory, compute, comm, calls) = stage(&segs, s as i64, p, strategy, train, cluster, w);
        if compute + comm > slowest.0 + slowest.1 {
            slowest = (compute, comm, s);
            collectives = calls;
        }
        stages.push(StageEstimate {
            stage: s as i64,
            layers: ranges.clone(),
            memory,
            compute_s: compute,
            communication_s: comm,
        });
    }
    let m_f = m.max(1) as f64;
    let per_mb = slowest.0 + slowest.1;
    // A device's v chunks each take 1/v of its micro-batch time, so the fill and drain
    // (p − 1 chunk slots) shrink by v.
    let bubble = (p - 1) as f64 / strategy.schedule.chunks() as f64;
    let pipeline = (m_f + bubble) * per_mb;
    // Gradient synchronisation over the data-parallel axis: all-reduce (levels 0–1), or
    // reduce-scatter + all-gather (level 2, the same bytes), plus level 3's parameter gathers.
    let stage_params = |st: &StageEstimate| st.memory.step.parameters;
    let worst = stages
        .iter()
        .max_by_key(|st| stage_params(st))
        .map_or(0, |st| {
            let shard = if strategy.optimizer_shard >= 3 {
                dp as u64
            } else {
                1
            };
            st.memory.step.parameters * shard / train.param_bytes.max(1)
        });
    let grad_total = worst * train.grad_bytes;
    let mut dp_comm = cluster.all_reduce_s(grad_total, dp, tp);
    if dp > 1 {
        let (kind, count) = match strategy.optimizer_shard {
            0 | 1 => ("all_reduce", 1),
            _ => ("reduce_scatter", 1),
        };
        collectives.push(Collective {
            kind,
            axis: "dp",
            bytes: grad_total,
            count,
        });
        // Levels 1–2 gather the updated slices once per step; level 3 keeps its slices and
        // gathers each parameter where the forward and again where the backward reads it,
        // per micro-batch (ZeRO's 3Ψ with the reduce-scatter).
        if strategy.optimizer_shard >= 1 {
            collectives.push(Collective {
                kind: "all_gather",
                axis: "dp",
                bytes: worst * train.param_bytes,
                count: match strategy.optimizer_shard {
                    3.. => 2 * m.max(1) as u64,
                    _ => 1,
                },
            });
        }
        if strategy.optimizer_shard >= 3 {
            dp_comm *= 1.5;
        }
    }
    // Without a pipeline the reduction overlaps the last backward (DDP's buckets); after a
    // pipeline flush it does not (Megatron-LM). On the host the reduction is the cores' own
    // work (copies and sums through shared memory, or MPI's), taken from the same cores the
    // backward runs on, so it overlaps nothing (2 data-parallel ranks on 2 cores: 10.8 ms of
    // all-reduce exposed in a 117 ms step, scripts/bench_ranks.py).
    let last_backward = slowest.0 * 2.0 / 3.0;
    let exposed_dp = if p == 1 && !cluster.target.is_host() {
        (dp_comm - last_backward).max(0.0)
    } else {
        dp_comm
    };
    let tied_s = tied_exchange(w, bounds, strategy, train, cluster, &mut collectives);
    let opt_bytes = worst
        / if strategy.optimizer_shard >= 1 {
            dp.max(1) as u64
        } else {
            1
        }
        * (2 * train.state_bytes + train.grad_bytes + train.param_bytes);
    let optimizer = opt_bytes as f64 / (cluster.target.bandwidth * BANDWIDTH_EFFICIENCY).max(1.0);
    let step = pipeline + exposed_dp + tied_s + optimizer;
    Estimate {
        strategy,
        stages,
        step_time_s: step,
        compute_s: m_f * slowest.0 + optimizer,
        communication_s: m_f * slowest.1 + exposed_dp + tied_s,
        bubble_fraction: bubble / m_f,
        collectives,
    }
}

/// Seconds of summing the gradients of the weights that several pipeline stages read (a
/// tied embedding: GPT-2's head reads the input embedding's table) among those stages once per
/// update, after the flush and before the update, so exposed — Megatron-LM's all-reduce over
/// its embedding group, and what the executor's stages exchange. Each is added to
/// `collectives` as an all-reduce over the `pp` axis; none without a pipeline.
fn tied_exchange(
    w: &Workload,
    bounds: &[Vec<(usize, usize)>],
    strategy: Strategy,
    train: Training,
    cluster: &Cluster,
    collectives: &mut Vec<Collective>,
) -> f64 {
    let p = bounds.len();
    // Per weight: its elements, whether split, and the stages reading it.
    let mut readers: std::collections::BTreeMap<usize, (u64, bool, Vec<usize>)> =
        std::collections::BTreeMap::new();
    for (s, ranges) in bounds.iter().enumerate() {
        let head = (s == 0).then_some(&w.head);
        let tail = (s + 1 == p).then_some(&w.tail);
        let layers = ranges.iter().flat_map(|&(a, b)| &w.layers[a..b]);
        for g in head.into_iter().chain(layers).chain(tail) {
            for &(index, n, split) in &g.weights {
                let entry = readers.entry(index).or_insert((n, split, Vec::new()));
                if entry.2.last() != Some(&s) {
                    entry.2.push(s);
                }
            }
        }
    }
    let (dp, tp) = (strategy.dp.max(1), strategy.tp.max(1));
    let mut seconds = 0.0;
    for (n, split, stages) in readers.into_values().filter(|r| r.2.len() > 1) {
        let elements = if split { n.div_ceil(tp as u64) } else { n };
        let mut bytes = elements * train.grad_bytes;
        // From level 2 each replica holds (and sums) its slice of the gradients.
        if strategy.optimizer_shard >= 2 {
            bytes = bytes.div_ceil(dp as u64);
        }
        let span = (stages[stages.len() - 1] - stages[0]) as i64;
        let stride = dp * tp * span.max(1) / (stages.len() as i64 - 1).max(1);
        seconds += cluster.all_reduce_s(bytes, stages.len() as i64, stride);
        collectives.push(Collective {
            kind: "all_reduce",
            axis: "pp",
            bytes,
            count: 1,
        });
    }
    seconds
}

/// One stage's memory, its compute and communication per micro-batch, and its collectives.
fn stage(
    segs: &[&Segment],
    s: i64,
    p: i64,
    strategy: Strategy,
    train: Training,
    cluster: &Cluster,
    w: &Workload,
) -> (Breakdown, f64, f64, Vec<Collective>) {
    let Strategy {
        dp,
        tp,
        micro_batches: m,
        ..
    } = strategy;
    let (dpu, tpu) = (dp.max(1) as u64, tp.max(1) as u64);
    let weights: std::collections::BTreeMap<usize, (u64, bool)> = segs
        .iter()
        .flat_map(|g| g.weights.iter().map(|&(p, n, split)| (p, (n, split))))
        .collect();
    let params: u64 = weights
        .values()
        .map(|&(n, split)| if split { n.div_ceil(tpu) } else { n })
        .sum();
    let level = strategy.optimizer_shard;
    let shard = |bytes: u64, from: u8| {
        if level >= from {
            bytes.div_ceil(dpu)
        } else {
            bytes
        }
    };
    let parameters = shard(params * train.param_bytes, 3);
    let gradients = shard(params * train.grad_bytes, 2);
    let optimizer_states = shard(params * train.state_bytes, 1);
    let sp = strategy.sequence_parallel && tp > 1;
    let m = m.max(1);
    // Micro-batches in flight, in chunk units: `v` chunks make one micro-batch of the
    // device's layers.
    let v = strategy.schedule.chunks();
    let in_flight = match strategy.schedule {
        Schedule::GPipe => m,
        Schedule::OneFOneB => (p - s).min(m),
        Schedule::Interleaved(_) => (v * p + p - 1 - 2 * s).clamp(1, m * v),
    } as u64;
    let full = |g: &Segment| kept_bytes(g, tp, sp);
    let (kept, working): (u64, u64) = match strategy.recompute {
        Recompute::None => (segs.iter().map(|g| full(g)).sum(), 0),
        Recompute::Selective => (
            segs.iter()
                .map(|g| full(g).saturating_sub(g.score_acts))
                .sum(),
            0,
        ),
        Recompute::Full => (
            segs.iter().map(|g| input_bytes(g, tp, sp)).sum(),
            segs.iter().map(|g| full(g)).max().unwrap_or(0),
        ),
    };
    let activations = (kept as u128 * in_flight as u128 / v as u128) as u64 + working;
    let largest_message = segs
        .iter()
        .flat_map(|g| g.forward_all_reduces.iter().chain(&g.backward_all_reduces))
        .copied()
        .max()
        .unwrap_or(0);
    let mut communication = 0;
    if dp > 1 {
        communication += GRAD_BUCKET_BYTES.min(gradients) * 2;
    }
    if tp > 1 {
        communication += largest_message;
    }
    let boundary = if sp {
        w.boundary_bytes.div_ceil(tpu)
    } else {
        w.boundary_bytes
    };
    if p > 1 {
        communication += 2 * boundary;
    }
    if level >= 3 {
        let largest_layer = segs.iter().map(|g| g.params).max().unwrap_or(0);
        communication += 2 * largest_layer * train.param_bytes / tpu;
    }
    let largest = segs.iter().map(|g| g.largest_act).max().unwrap_or(0);
    let workspace = 2 * largest;
    let memory = Breakdown::of(
        crate::memory::Breakdown {
            parameters,
            gradients,
            optimizer_states,
            activations,
            workspace,
        },
        communication,
    );
    // Time per micro-batch.
    let forward: f64 = segs.iter().map(|g| seg_time(g, tp, sp)).sum();
    let extra = match strategy.recompute {
        Recompute::None => 0.0,
        Recompute::Selective => segs.iter().map(|g| g.score_seconds / tp as f64).sum(),
        Recompute::Full => forward,
    };
    let compute = 3.0 * forward + extra;
    let mut calls: Vec<Collective> = Vec::new();
    let mut comm = 0.0;
    let repeat = if strategy.recompute == Recompute::Full {
        2
    } else {
        1
    };
    let mut add = |kind: &'static str, axis: &'static str, bytes: u64, count: u64, secs: f64| {
        comm += secs * count as f64;
        let n = count * m as u64;
        match calls
            .iter_mut()
            .find(|c| c.kind == kind && c.axis == axis && c.bytes == bytes)
        {
            Some(c) => c.count += n,
            None => calls.push(Collective {
                kind,
                axis,
                bytes,
                count: n,
            }),
        }
    };
    if tp > 1 {
        for g in segs {
            // Sequence parallel: the same bytes as a reduce-scatter after the split ops and
            // an all-gather before the next (Korthikanti et al. 2022, §4.2.2), each half an
            // all-reduce's time.
            for (&b, n) in g
                .forward_all_reduces
                .iter()
                .map(|b| (b, repeat))
                .chain(g.backward_all_reduces.iter().map(|b| (b, 1)))
            {
                let t = cluster.all_reduce_s(b, tp, 1);
                if sp {
                    add("reduce_scatter", "tp", b, n, t / 2.0);
                    add("all_gather", "tp", b, n, t / 2.0);
                } else {
                    add("all_reduce", "tp", b, n, t);
                }
            }
            for (_, b) in &g.all_gathers {
                add(
                    "all_gather",
                    "tp",
                    *b,
                    repeat,
                    cluster.all_reduce_s(*b, tp, 1) / 2.0,
                );
            }
        }
    }
    if p > 1 {
        // Interleaved chunks wrap around: the last device sends to the first.
        let neighbours = if v == 1 && (s == 0 || s + 1 == p) {
            1
        } else {
            2
        };
        let bw = cluster.link(2, dp * tp);
        let sends = 2 * neighbours * v as u64;
        let (bytes, gather) = scatter_gather(boundary, tp, sp);
        add(
            "send_recv",
            "pp",
            bytes,
            sends,
            bytes as f64 / bw.max(1.0) + HOP_LATENCY_S,
        );
        if gather {
            // Each received slice is all-gathered over the tensor group, inside the node.
            add(
                "all_gather",
                "tp",
                boundary,
                sends,
                cluster.all_reduce_s(boundary, tp, 1) / 2.0,
            );
        }
    }
    (memory, compute, comm, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process reserves for every other process of the world: over shared memory for those
    /// on its machine, over the network for those elsewhere; none when it is alone.
    #[test]
    fn mpi_reserve_counts_the_peers_on_this_machine_and_elsewhere() {
        assert_eq!(mpi_reserve(1, 0), 0);
        assert_eq!(mpi_reserve(4, 0), 3 * MPI_PEER_RESERVE);
        assert_eq!(mpi_reserve(1, 3), 3 * MPI_NETWORK_PEER_RESERVE);
        assert_eq!(
            mpi_reserve(2, 6),
            MPI_PEER_RESERVE + 6 * MPI_NETWORK_PEER_RESERVE
        );
    }

    fn layer(index: usize, params: u64, acts: u64) -> Segment {
        Segment {
            params,
            weights: vec![(index, params, false)],
            rep_acts: acts,
            input_bytes: acts / 10,
            rep_seconds: 1e-3,
            ..Default::default()
        }
    }

    fn workload(layers: usize, params: u64, acts: u64) -> Workload {
        Workload {
            head: Segment::default(),
            layers: (0..layers).map(|i| layer(i, params, acts)).collect(),
            tail: Segment::default(),
            params: params * layers as u64,
            boundary_bytes: acts / 10,
            tp: 1,
            shardings: Default::default(),
            undivided: Vec::new(),
            activations: Vec::new(),
            caused: Default::default(),
            moved: Vec::new(),
        }
    }

    fn a100(budget: u64) -> Cluster {
        Cluster {
            target: Target {
                name: "a100".into(),
                peak_f32: 19.5e12,
                peak_f16: 312e12,
                peak_bf16: 312e12,
                memory_bytes: 80_000_000_000,
                bandwidth: 2039e9,
                interconnect: 600e9,
                network: 50e9,
                devices_per_node: 8,
                compute_efficiency: COMPUTE_EFFICIENCY,
            },
            budget,
        }
    }

    const MIXED_ADAM: Training = Training {
        param_bytes: 2,
        grad_bytes: 2,
        state_bytes: 12,
        act_bytes: 2,
    };

    fn strategy(dp: i64, pp: i64, m: i64, level: u8) -> Strategy {
        Strategy {
            dp,
            tp: 1,
            pp,
            micro_batches: m,
            schedule: Schedule::OneFOneB,
            optimizer_shard: level,
            recompute: Recompute::None,
            sequence_parallel: false,
        }
    }

    /// ZeRO (Rajbhandari et al. 2020) Table 1: a 7.5B-parameter model on N_d = 64 with
    /// mixed-precision Adam needs 120 GB of model states per device without sharding, 31.4 GB
    /// with P_os, 16.6 GB with P_os+g and 1.88 GB with P_os+g+p — exactly 16Ψ, 4Ψ + 12Ψ/N_d,
    /// 2Ψ + 14Ψ/N_d and 16Ψ/N_d.
    #[test]
    fn optimizer_shard_levels_reproduce_zero_table_1() {
        let psi = 7_500_000_000u64;
        let w = workload(1, psi, 0);
        let table_gb = [120.0, 31.4, 16.6, 1.88];
        let exact = [
            16 * psi,
            4 * psi + 12 * psi / 64,
            2 * psi + 14 * psi / 64,
            16 * psi / 64,
        ];
        for level in 0..4u8 {
            let e = estimate(&w, strategy(64, 1, 1, level), MIXED_ADAM, &a100(u64::MAX));
            let m = e.stages[0].memory;
            let states = m.step.parameters + m.step.gradients + m.step.optimizer_states;
            assert_eq!(states, exact[level as usize], "level {level}");
            let gb = states as f64 / 1e9;
            assert!(
                (gb - table_gb[level as usize]).abs() < 0.05,
                "level {level}: {gb} GB"
            );
        }
    }

    /// A data-parallel gradient all-reduce hides behind the last backward on an accelerator
    /// (DDP's buckets), but on the host it is the cores' own work and adds to the step.
    #[test]
    fn the_host_exposes_its_gradient_all_reduce() {
        let w = workload(4, 10_000_000, 0);
        let accelerator = a100(u64::MAX);
        let mut host = a100(u64::MAX);
        host.target.name = "cpu".into();
        let grads = 4 * 10_000_000 * MIXED_ADAM.grad_bytes;
        let all_reduce = host.all_reduce_s(grads, 2, 1);
        // The accelerator's last backward (2/3 of 4 layers' 1 ms) hides all of it.
        assert!(
            all_reduce > 0.0 && all_reduce < 4e-3 * 2.0 / 3.0,
            "{all_reduce}"
        );
        let hidden = estimate(&w, strategy(2, 1, 1, 0), MIXED_ADAM, &accelerator);
        assert_eq!(hidden.communication_s, 0.0);
        assert_eq!(hidden.step_time_s, hidden.compute_s);
        let exposed = estimate(&w, strategy(2, 1, 1, 0), MIXED_ADAM, &host);
        assert!((exposed.communication_s - all_reduce).abs() < 1e-12);
        assert_eq!(exposed.compute_s, hidden.compute_s);
        assert!((exposed.step_time_s - (hidden.step_time_s + all_reduce)).abs() < 1e-12);
    }

    /// 1F1B keeps at most p − i micro-batches on stage i; GPipe keeps all m everywhere.
    #[test]
    fn schedules_hold_their_micro_batches_in_flight() {
        let acts = 1_000_000;
        let w = workload(8, 1000, acts);
        let s = strategy(1, 4, 8, 0);
        let one = estimate(&w, s, MIXED_ADAM, &a100(u64::MAX));
        let gpipe = estimate(
            &w,
            Strategy {
                schedule: Schedule::GPipe,
                ..s
            },
            MIXED_ADAM,
            &a100(u64::MAX),
        );
        let per_stage = 2 * acts; // two layers per stage
        for (i, st) in one.stages.iter().enumerate() {
            assert_eq!(st.layers, vec![(2 * i, 2 * i + 2)]);
            assert_eq!(st.memory.step.activations, (4 - i as u64) * per_stage);
            assert_eq!(gpipe.stages[i].memory.step.activations, 8 * per_stage);
        }
        assert_eq!(one.bubble_fraction, 3.0 / 8.0);
        // Full recompute keeps each layer's input per micro-batch plus one layer's working set.
        let full = estimate(
            &w,
            Strategy {
                recompute: Recompute::Full,
                ..s
            },
            MIXED_ADAM,
            &a100(u64::MAX),
        );
        assert_eq!(
            full.stages[0].memory.step.activations,
            4 * 2 * (acts / 10) + acts
        );
    }

    /// Stages balance time, not layer counts: a costly head makes the first stage shorter.
    #[test]
    fn stages_balance_time() {
        let mut w = workload(8, 1000, 0);
        assert_eq!(split_stages(&w, 1, false, 2), vec![(0, 4), (4, 8)]);
        w.head.rep_seconds = 4e-3;
        assert_eq!(split_stages(&w, 1, false, 2), vec![(0, 2), (2, 8)]);
        assert_eq!(split_stages(&w, 1, false, 1), vec![(0, 8)]);
    }

    /// A weight two stages read (a tied embedding: the head reads the input table) costs an
    /// all-reduce of its gradient between them per update, over the network when they sit on
    /// different nodes; one device, or both reads on one stage, costs nothing.
    #[test]
    fn a_weight_tied_across_stages_sums_its_gradient_between_them() {
        let table = 50_000_000u64;
        // The same tables, tied (one weight) or not (two).
        let with_tables = |tail: usize| {
            let mut w = workload(8, 1000, 0);
            w.head.weights = vec![(100, table, false)];
            w.tail.weights = vec![(tail, table, false)];
            w
        };
        let (w, untied) = (with_tables(100), with_tables(101));
        let c = a100(u64::MAX);
        let cost = |w: &Workload, dp: i64, pp: i64| {
            let e = estimate(w, strategy(dp, pp, 4, 0), MIXED_ADAM, &c);
            let tied: Vec<Collective> = e
                .collectives
                .iter()
                .filter(|k| k.kind == "all_reduce" && k.axis == "pp")
                .cloned()
                .collect();
            (e.step_time_s, tied)
        };
        let bytes = table * MIXED_ADAM.grad_bytes;
        let (with, calls) = cost(&w, 1, 2);
        let (without, none) = cost(&untied, 1, 2);
        assert!(none.is_empty());
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].bytes, calls[0].count), (bytes, 1));
        let inside = c.all_reduce_s(bytes, 2, 1);
        assert!(
            ((with - without) - inside).abs() < 1e-12,
            "{with} {without}"
        );
        // 8 replicas put the two stages on different nodes: the network's bandwidth.
        let (with, _) = cost(&w, 8, 2);
        let (without, _) = cost(&untied, 8, 2);
        let across = c.all_reduce_s(bytes, 2, 8);
        assert!(across > 5.0 * inside);
        assert!(((with - without) - across).abs() < 1e-12);
        // From level 2 each replica sums only its slice of the table's gradient.
        let sliced = estimate(&w, strategy(8, 2, 4, 2), MIXED_ADAM, &c);
        let tied = sliced
            .collectives
            .iter()
            .find(|k| k.kind == "all_reduce" && k.axis == "pp")
            .expect("the tied all-reduce");
        assert_eq!(tied.bytes, bytes / 8);
        // On one device the table is read twice and held (and summed) once.
        let mut once = with_tables(100);
        once.tail.weights.clear();
        let (one, none) = cost(&w, 1, 1);
        assert!(none.is_empty());
        assert_eq!(one, cost(&once, 1, 1).0);
    }

    /// Interleaving v chunks per device (Narayanan et al. 2021; Korthikanti et al. 2022,
    /// §4.2.3): the bubble is (p − 1)/(m·v), device i runs chunks i, i + p, …, and the first
    /// device holds L(1 + (p − 1)/(p·v)) layers' activations — v·p + p − 1 chunk-micro-batches
    /// of L/(p·v) layers each.
    #[test]
    fn interleaving_shrinks_the_bubble_and_holds_more_in_flight() {
        let acts = 1_000_000;
        let (l, p, m, v) = (16u64, 4i64, 8i64, 2i64);
        let w = workload(l as usize, 1000, acts);
        let s = Strategy {
            schedule: Schedule::Interleaved(v),
            ..strategy(1, p, m, 0)
        };
        let e = estimate(&w, s, MIXED_ADAM, &a100(u64::MAX));
        assert_eq!(e.bubble_fraction, 3.0 / 16.0);
        assert_eq!(e.stages[0].layers, vec![(0, 2), (8, 10)]);
        assert_eq!(e.stages[3].layers, vec![(6, 8), (14, 16)]);
        // Korthikanti's factor: L·(1 + (p − 1)/(p·v)) layers on the first device.
        let layers_held = l as f64 * (1.0 + (p - 1) as f64 / (p * v) as f64);
        assert_eq!(
            e.stages[0].memory.step.activations,
            (layers_held * acts as f64) as u64
        );
        // The last device: v·p + p − 1 − 2(p − 1) = 5 chunk-micro-batches of 2 layers
        // (Megatron-LM's (p − i − 1)·2 + (v − 1)·p warm-up forwards, plus one).
        assert_eq!(e.stages[3].memory.step.activations, 5 * 2 * acts);
        // Against plain 1F1B: the bubble shrinks by v at the cost of the extra activations.
        let plain = estimate(&w, strategy(1, p, m, 0), MIXED_ADAM, &a100(u64::MAX));
        assert_eq!(plain.bubble_fraction, 3.0 / 8.0);
        assert_eq!(plain.stages[0].memory.step.activations, l * acts);
        assert!(e.step_time_s < plain.step_time_s);
    }

    /// Sequence parallelism splits the sequence-long unsplit activations and the ops making
    /// them by t, and turns each tensor-parallel all-reduce into a reduce-scatter and an
    /// all-gather of the same bytes.
    #[test]
    fn sequence_parallel_splits_the_rest_and_pairs_the_collectives() {
        let mut w = workload(2, 1000, 0);
        for g in &mut w.layers {
            g.rep_acts = 800;
            g.seq_acts = 600;
            g.split_acts = 400;
            g.forward_all_reduces = vec![64, 64];
            g.backward_all_reduces = vec![64, 64];
            g.split_params = 1000;
            g.seq_seconds = 0.5e-3;
        }
        let base = Strategy {
            tp: 4,
            ..strategy(1, 1, 1, 0)
        };
        let sp = Strategy {
            sequence_parallel: true,
            ..base
        };
        let (a, b) = (
            estimate(&w, base, MIXED_ADAM, &a100(u64::MAX)),
            estimate(&w, sp, MIXED_ADAM, &a100(u64::MAX)),
        );
        assert_eq!(a.stages[0].memory.step.activations, 2 * 1200);
        assert_eq!(b.stages[0].memory.step.activations, 2 * (200 + 150 + 400));
        let kinds = |e: &Estimate| {
            e.collectives
                .iter()
                .filter(|c| c.axis == "tp")
                .map(|c| (c.kind, c.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(&a), vec![("all_reduce", 8)]);
        assert_eq!(kinds(&b), vec![("reduce_scatter", 8), ("all_gather", 8)]);
        assert!(b.compute_s < a.compute_s);
    }

    /// Narayanan et al. 2021, §4.1: with tensor parallel 8 across 2 stages on different
    /// nodes, each rank sends 1/8 of the boundary activation over the network and the slices
    /// are all-gathered over NVLink — 8× fewer inter-node bytes, traded for an intra-node
    /// gather; under sequence parallelism the activation is already split and sent as is.
    #[test]
    fn pipeline_sends_scatter_over_the_network_and_gather_inside_the_node() {
        let boundary = 64_000_000u64;
        let mut w = workload(4, 1000, 0);
        w.boundary_bytes = boundary;
        let c = a100(u64::MAX);
        let s = Strategy {
            tp: 8,
            ..strategy(1, 2, 1, 0)
        };
        let e = estimate(&w, s, MIXED_ADAM, &c);
        let calls = |e: &Estimate, kind: &str, axis: &str| {
            e.collectives
                .iter()
                .find(|x| x.kind == kind && x.axis == axis)
                .map(|x| (x.bytes, x.count))
        };
        // Each end stage sends its activation forward or its gradient back: 2 calls.
        assert_eq!(calls(&e, "send_recv", "pp"), Some((boundary / 8, 2)));
        assert_eq!(calls(&e, "all_gather", "tp"), Some((boundary, 2)));
        // The stride of 8 devices leaves the node: the sends cross the network.
        let network = 50e9 * LINK_EFFICIENCY / 2.0;
        let per_send = (boundary / 8) as f64 / network + HOP_LATENCY_S;
        let gather = c.all_reduce_s(boundary, 8, 1) / 2.0;
        assert!((e.stages[0].communication_s - 2.0 * (per_send + gather)).abs() < 1e-12);
        let unsplit = boundary as f64 / network + HOP_LATENCY_S;
        assert!(
            per_send + gather < unsplit / 4.0,
            "{per_send} + {gather} vs {unsplit}"
        );
        // Sequence parallel: the boundary is already 1/8 per rank, sent as is, no gather.
        let sp = estimate(
            &w,
            Strategy {
                sequence_parallel: true,
                ..s
            },
            MIXED_ADAM,
            &c,
        );
        assert_eq!(calls(&sp, "send_recv", "pp"), Some((boundary / 8, 2)));
        assert_eq!(calls(&sp, "all_gather", "tp"), None);
        assert_eq!(scatter_gather(boundary, 1, false), (boundary, false));
    }

    #[test]
    fn ring_all_reduce_moves_twice_the_data_once() {
        let c = a100(0);
        let bytes = 1_000_000_000;
        let inside = c.all_reduce_s(bytes, 8, 1);
        let link = 600e9 * LINK_EFFICIENCY / 2.0;
        let expected = 2.0 * 7.0 / 8.0 * bytes as f64 / link + 14.0 * HOP_LATENCY_S;
        assert!((inside - expected).abs() < 1e-12);
        // Across nodes the network is the bottleneck.
        assert!(c.all_reduce_s(bytes, 8, 8) > 10.0 * inside);
        assert_eq!(c.all_reduce_s(bytes, 1, 1), 0.0);
    }
}
