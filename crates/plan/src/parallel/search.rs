//! `mode = auto`: exhaustive search over every factorisation of the device count into data ×
//! tensor × pipeline degrees (any count, not only powers of two), each with the micro-batch count
//! the batch gives, every optimizer-shard level and recompute choice and, with a tensor degree
//! above 1, sequence parallelism on and off, keeping the fastest strategy by the cost model
//! whose every stage fits the budget. An `interleaved(v)` schedule admits only stage counts
//! whose chunks divide the layers and the micro-batches. The tensor-parallel layout of
//! each degree is propagated once and shared by all strategies with that degree; per-op choices
//! (column or row parallel) come from that propagation.

use std::collections::BTreeMap;

use mslc_core::program::Model;

use super::estimate::{
    device_chunks, estimate_split, Cluster, Estimate, Recompute, Schedule, Strategy, Training,
};
use super::workload::{workload, WeightSplits, Widths, Workload};

/// What the search may vary and what it must respect.
#[derive(Clone, Debug)]
pub struct Space {
    /// Devices to use, all of them.
    pub devices: i64,
    /// Samples per optimizer step, over all devices.
    pub batch: i64,
    /// The model's batch dim: samples per micro-batch.
    pub micro_batch: i64,
    /// Only this data-parallel degree, when the mesh fixes it.
    pub dp: Option<i64>,
    /// Only this tensor-parallel degree.
    pub tp: Option<i64>,
    /// Only this stage count.
    pub pp: Option<i64>,
    /// Only this optimizer-shard level.
    pub optimizer_shard: Option<u8>,
    /// Only this recompute choice.
    pub recompute: Option<Recompute>,
    /// The pipeline schedule.
    pub schedule: Schedule,
    /// Only this sequence-parallel choice (searched where the tensor degree is above 1).
    pub sequence_parallel: Option<bool>,
    /// What a strategy with pipeline stages recomputes whatever `recompute` says, when the
    /// executor that runs the plan fixes it: mslc's bundled executor (the host target) re-runs
    /// each stage's forward in its backward, keeping only what the stage received, so its
    /// stages cost a full recompute's time.
    pub stage_recompute: Option<Recompute>,
}

impl Space {
    /// The recompute the executor fixes for a strategy of `pp` stages, whatever the policy
    /// says ([`Space::stage_recompute`]); `None` where the choice is the policy's or the
    /// search's.
    pub fn recompute_fixed_at(&self, pp: i64) -> Option<Recompute> {
        self.stage_recompute.filter(|_| pp > 1)
    }
}

/// The search's answer: the best strategy that fits (or, when none does, the one needing the
/// least memory), and how many strategies it estimated.
#[derive(Clone, Debug)]
pub struct Found {
    /// The chosen estimate.
    pub best: Estimate,
    /// Whether it fits.
    pub fits: bool,
    /// Strategies estimated.
    pub candidates: usize,
    /// The workload of the chosen tensor-parallel degree.
    pub workload: Workload,
}

/// The workload of `model` under each tensor-parallel degree, computed on demand.
pub struct Workloads<'a> {
    model: &'a Model,
    splits: WeightSplits<'a>,
    widths: Widths,
    cache: BTreeMap<i64, Workload>,
}

impl<'a> Workloads<'a> {
    /// Workloads of `model` with the weight layout `splits` and the widths of `widths`.
    pub fn new(model: &'a Model, splits: WeightSplits<'a>, widths: Widths) -> Self {
        Workloads {
            model,
            splits,
            widths,
            cache: BTreeMap::new(),
        }
    }

    /// The workload at degree `tp` with the weight layout `splits` (path → dim) instead: an
    /// alternative layout, for `--explain-plan`.
    pub fn with_splits(&self, tp: i64, splits: &BTreeMap<String, usize>) -> Workload {
        workload(
            self.model,
            &WeightSplits::Given(splits),
            Widths { tp, ..self.widths },
        )
    }

    /// The model the workloads are of.
    pub fn model(&self) -> &Model {
        self.model
    }

    /// The workload at degree `tp`.
    pub fn at(&mut self, tp: i64) -> &Workload {
        let (model, splits, widths) = (self.model, &self.splits, self.widths);
        self.cache
            .entry(tp)
            .or_insert_with(|| workload(model, splits, Widths { tp, ..widths }))
    }
}

/// Searches `space` for the fastest strategy that fits `cluster`'s budget.
pub fn search(
    workloads: &mut Workloads,
    space: &Space,
    train: Training,
    cluster: &Cluster,
) -> Option<Found> {
    let n = space.devices.max(1);
    let levels: Vec<u8> = space.optimizer_shard.map_or(vec![0, 1, 2, 3], |l| vec![l]);
    let recomputes = space.recompute.map_or(
        vec![Recompute::None, Recompute::Selective, Recompute::Full],
        |r| vec![r],
    );
    let mut best: Option<(Estimate, bool, i64)> = None;
    let mut candidates = 0usize;
    for tp in divisors(n) {
        if space.tp.is_some_and(|t| t != tp) {
            continue;
        }
        let w = workloads.at(tp).clone();
        let layers = w.layers.len().max(1) as i64;
        // A degree that splits nothing only replicates work.
        if tp > 1
            && w.layers
                .iter()
                .chain([&w.head, &w.tail])
                .all(|l| l.split_params == 0)
        {
            continue;
        }
        for pp in divisors(n / tp) {
            let dp = n / tp / pp;
            if pp > layers || space.pp.is_some_and(|p| p != pp) || space.dp.is_some_and(|d| d != dp)
            {
                continue;
            }
            let per_replica = space.micro_batch.saturating_mul(dp);
            if per_replica <= 0 || space.batch % per_replica != 0 {
                continue;
            }
            let m = space.batch / per_replica;
            if pp > 1 && m < pp {
                continue;
            }
            // Megatron-LM's interleaved schedule needs whole chunks and whole rounds.
            let v = space.schedule.chunks();
            let chunks = pp.saturating_mul(v);
            if v > 1 && (chunks > layers || layers % chunks != 0 || m % pp != 0) {
                continue;
            }
            let sps: &[bool] = match (space.sequence_parallel, tp > 1) {
                (Some(sp), true) => &[sp][..],
                (None, true) => &[false, true],
                (_, false) => &[false],
            };
            for &sequence_parallel in sps {
                let base = Strategy {
                    dp,
                    tp,
                    pp,
                    micro_batches: m,
                    schedule: space.schedule,
                    optimizer_shard: 0,
                    recompute: Recompute::None,
                    sequence_parallel,
                };
                let bounds = device_chunks(&w, &base);
                for &level in &levels {
                    if dp == 1 && level > 0 && space.optimizer_shard.is_none() {
                        continue;
                    }
                    let forced = space.recompute_fixed_at(pp);
                    let here = forced
                        .as_ref()
                        .map_or(&recomputes[..], std::slice::from_ref);
                    for &recompute in here {
                        let strategy = Strategy {
                            optimizer_shard: level,
                            recompute,
                            ..base
                        };
                        let e = estimate_split(&w, &bounds, strategy, train, cluster);
                        candidates += 1;
                        let fits = e.peak_bytes() <= cluster.budget;
                        let better = match &best {
                            None => true,
                            Some((b, bfits, _)) => match (fits, *bfits) {
                                (true, false) => true,
                                (false, true) => false,
                                (true, true) => e.step_time_s < b.step_time_s,
                                (false, false) => e.peak_bytes() < b.peak_bytes(),
                            },
                        };
                        if better {
                            best = Some((e, fits, tp));
                        }
                    }
                }
            }
        }
    }
    let (best, fits, tp) = best?;
    Some(Found {
        best,
        fits,
        candidates,
        workload: workloads.at(tp).clone(),
    })
}

/// The divisors of `n`, ascending.
pub fn divisors(n: i64) -> Vec<i64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1i64;
    while d.saturating_mul(d) <= n {
        if n % d == 0 {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}
