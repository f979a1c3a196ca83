//! What a training step recomputes under its train's `memory` policy, and whether the step then
//! fits `max_device_memory`: every candidate is planned for real (schedule and memory plan of
//! the graph with its recomputed ops duplicated, [`mslc_ir::recompute`]) and compared by its
//! [`Breakdown`] total and its cost-model flops.
//!
//! - `none`, `full`, `selective`: that choice for every layer (plus the ops marked `@recompute`).
//! - `auto`: the least extra compute that fits. If keeping everything fits, nothing is
//!   recomputed. Otherwise each layer has three options — keep, selective, full — each with the
//!   flops its copies add and the bytes of activations it stops keeping for the backward (both
//!   measured on the graph); a multiple-choice knapsack (dynamic programming over layers, the
//!   bytes in at most [`BUCKETS`] steps, rounded against the saving) picks the options of least
//!   total flops whose savings cover the excess. That choice is planned; if the plan still does
//!   not fit (a recomputed layer's copies need room while they live), the excess of the plan
//!   is added to what must be saved and the knapsack runs again, at most [`ROUNDS`] times,
//!   before full recomputation of every layer is tried. When nothing fits, E0720 says what the
//!   least memory would be.

use std::collections::BTreeMap;

use serde::Serialize;

use mslc_check::decls::Train;
use mslc_check::policy::{MemoryPolicy, Recompute};
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_core::span::Span;
use mslc_core::units::human_bytes;
use mslc_ir::passes::PipelineReport;
use mslc_ir::recompute::{recompute, Choice, Forward, LayerChoice};
use mslc_ir::Graph;
use mslc_plan::memory::Breakdown;

use crate::compile::{plan_graph, CompileError, CompileOptions, Compiled};
use crate::train::TrainError;

/// Granularity of `auto`'s knapsack: the bytes to save are measured in at most this many steps.
pub const BUCKETS: u64 = 1024;
/// How many knapsack choices `auto` plans before it tries full recomputation.
pub const ROUNDS: usize = 8;

/// A train's memory policy, as compiling its step needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryRequest {
    /// What to recompute.
    pub recompute: Recompute,
    /// The budget of one device, if any.
    pub max_device_memory: Option<u64>,
    /// The policy's file.
    pub file: FileId,
    /// Where the budget is written (the policy's name when it is not).
    pub span: Span,
}

impl MemoryRequest {
    /// The request of a checked policy.
    pub fn of(policy: &MemoryPolicy) -> MemoryRequest {
        MemoryRequest {
            recompute: policy.recompute,
            max_device_memory: policy.max_device_memory,
            file: policy.file,
            span: policy.max_device_memory_span,
        }
    }

    /// The same recompute policy with no budget, for a step no single device runs (`auto`
    /// then recomputes nothing, as when everything fits).
    pub fn without_budget(self) -> MemoryRequest {
        MemoryRequest {
            max_device_memory: None,
            ..self
        }
    }

    /// The request of `train`'s memory policy, if it names one.
    pub fn of_train(checked: &Checked, train: &Train) -> Option<MemoryRequest> {
        train
            .memory
            .and_then(|m| checked.decls.memories.get(m))
            .map(MemoryRequest::of)
    }
}

/// The policy's name in reports.
fn policy_name(r: Recompute) -> &'static str {
    match r {
        Recompute::None => "none",
        Recompute::Full => "full",
        Recompute::Selective => "selective",
        Recompute::Auto => "auto",
    }
}

/// What was chosen and what it costs, for `mslc build`'s report and `mslc train`'s summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecomputeReport {
    /// The policy asked for: `none`, `full`, `selective` or `auto`.
    pub policy: &'static str,
    /// The budget, if any.
    pub max_device_memory: Option<u64>,
    /// Each layer whose activations are recomputed, with how (`selective` or `full`).
    pub layers: BTreeMap<String, LayerChoice>,
    /// Ops duplicated to be recomputed.
    pub recomputed_ops: usize,
    /// Flops the copies add to a step (cost model).
    pub flops_added: u64,
    /// Flops of a step without recomputation (cost model).
    pub flops_without: u64,
    /// Arena bytes without recomputation.
    pub arena_bytes_without: u64,
    /// Arena bytes with it.
    pub arena_bytes: u64,
    /// The step's memory without recomputation.
    pub without: Breakdown,
    /// The step's memory as compiled.
    pub breakdown: Breakdown,
    /// Candidates planned to choose.
    pub plans: usize,
}

impl RecomputeReport {
    /// Bytes saved against keeping every activation (negative when recomputing costs memory).
    pub fn bytes_saved(&self) -> i128 {
        i128::from(self.without.total()) - i128::from(self.breakdown.total())
    }

    /// Report lines, each `  label:  text` as the build report writes them.
    pub fn lines(&self) -> Vec<String> {
        let budget = self
            .max_device_memory
            .map_or(String::new(), |b| format!(" within {}", human_bytes(b)));
        let mut by_choice: BTreeMap<LayerChoice, Vec<&str>> = BTreeMap::new();
        for (layer, c) in &self.layers {
            by_choice.entry(*c).or_default().push(layer);
        }
        let chosen = if by_choice.is_empty() && self.recomputed_ops == 0 {
            "nothing recomputed".to_string()
        } else {
            let mut parts: Vec<String> = by_choice
                .iter()
                .map(|(c, ls)| format!("{} in {}", c.name(), layer_list(ls)))
                .collect();
            if parts.is_empty() {
                parts.push("the ops marked @recompute".to_string());
            }
            format!("{} ({} ops)", parts.join("; "), self.recomputed_ops)
        };
        let saved = self.bytes_saved();
        let saved = if saved >= 0 {
            format!("saves {}", human_bytes(saved as u64))
        } else {
            format!("costs {} more", human_bytes(saved.unsigned_abs() as u64))
        };
        let pct = 100.0 * self.flops_added as f64 / (self.flops_without.max(1) as f64);
        vec![
            format!("  recompute:  {}{budget}: {chosen}", self.policy),
            format!(
                "              {saved} of {} (arena {} → {}), +{} flops (+{pct:.1} %), {} plan(s) tried",
                human_bytes(self.without.total()),
                human_bytes(self.arena_bytes_without),
                human_bytes(self.arena_bytes),
                self.flops_added,
                self.plans
            ),
            format!("  step memory: {}", self.breakdown.text()),
        ]
    }
}

/// Layer paths for a report line, the numbered ones by their numbers' runs in numeric order:
/// `encoder.layers.0–95 (96 layers)` for GPT-3's 96, `layers.0–2, layers.5` for four.
fn layer_list(paths: &[&str]) -> String {
    // Per prefix (the path up to its last dot), the numbers of its numbered layers.
    let mut numbered: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut named: Vec<&str> = Vec::new();
    for path in paths {
        match path.rsplit_once('.').map(|(p, n)| (p, n.parse::<u64>())) {
            Some((prefix, Ok(n))) => numbered.entry(prefix).or_default().push(n),
            _ => named.push(path),
        }
    }
    let mut parts: Vec<String> = named.iter().map(|p| p.to_string()).collect();
    for (prefix, mut numbers) in numbered {
        numbers.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for n in numbers {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == n => *last = n,
                _ => runs.push((n, n)),
            }
        }
        parts.extend(runs.iter().map(|&(first, last)| match first == last {
            true => format!("{prefix}.{first}"),
            false => format!("{prefix}.{first}–{last}"),
        }));
    }
    match paths.len() {
        0..=3 => parts.join(", "),
        n => format!("{} ({n} layers)", parts.join(", ")),
    }
}

/// One way to treat a layer: the choice, the bytes of activations it stops keeping for the
/// backward, and the flops its copies add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerOption {
    /// Selective or full.
    pub choice: LayerChoice,
    /// Bytes no longer kept.
    pub saved: u64,
    /// Flops added.
    pub flops: u64,
}

/// A layer's path and its options other than keep.
pub type LayerOptions = (String, Vec<LayerOption>);

/// A planned candidate.
struct Candidate {
    compiled: Compiled,
    breakdown: Breakdown,
    layers: BTreeMap<String, LayerChoice>,
    ops: usize,
}

/// Plans candidates of one optimized training graph.
struct Planner<'a> {
    graph: &'a Graph,
    forward: Forward,
    options: &'a CompileOptions,
    passes: &'a PipelineReport,
    loss: &'a str,
    is_state: &'a dyn Fn(&str) -> bool,
    plans: usize,
}

impl Planner<'_> {
    fn plan(&mut self, choice: &Choice) -> Result<Candidate, CompileError> {
        let mut graph = self.graph.clone();
        let set = self.forward.recompute_set(&graph, choice);
        let done = recompute(&mut graph, &self.forward, &set);
        let compiled = plan_graph(graph, self.options, self.passes.clone())?;
        let breakdown =
            Breakdown::of_training(&compiled.module, &compiled.memory, self.loss, self.is_state);
        self.plans += 1;
        let layers = choice
            .layers
            .iter()
            .filter(|(_, c)| **c != LayerChoice::Keep)
            .map(|(l, c)| (l.clone(), *c))
            .collect();
        Ok(Candidate {
            compiled,
            breakdown,
            layers,
            ops: done.ops,
        })
    }

    /// Per layer, its options other than keep.
    fn options(&self) -> Vec<LayerOptions> {
        self.forward
            .layers
            .iter()
            .map(|(layer, _)| {
                let options = [LayerChoice::Selective, LayerChoice::Full]
                    .into_iter()
                    .map(|c| {
                        let choice = Choice {
                            layers: BTreeMap::from([(layer.clone(), c)]),
                            annotated: false,
                        };
                        let mut graph = self.graph.clone();
                        let set = self.forward.recompute_set(&graph, &choice);
                        let done = recompute(&mut graph, &self.forward, &set);
                        LayerOption {
                            choice: c,
                            saved: done.released_bytes,
                            flops: done.flops,
                        }
                    })
                    .collect();
                (layer.clone(), options)
            })
            .collect()
    }
}

/// The options (one per layer, keep costing nothing and saving nothing) of least total flops
/// whose savings add up to `need` bytes; `None` when even the largest savings fall short.
pub fn cheapest_cover(layers: &[LayerOptions], need: u64) -> Option<BTreeMap<String, LayerChoice>> {
    let q = need.div_ceil(BUCKETS).max(1);
    let target = need.div_ceil(q) as usize;
    // best[j]: least flops reaching j buckets (capped at target); parents per layer.
    let mut best: Vec<Option<u64>> = vec![None; target + 1];
    best[0] = Some(0);
    let mut parents: Vec<Vec<(usize, LayerChoice)>> = Vec::with_capacity(layers.len());
    for (_, options) in layers {
        let mut next: Vec<Option<u64>> = best.clone();
        let mut parent: Vec<(usize, LayerChoice)> =
            (0..=target).map(|j| (j, LayerChoice::Keep)).collect();
        for (j, flops) in best.iter().enumerate() {
            let Some(flops) = *flops else { continue };
            for o in options {
                let k = (j + (o.saved / q) as usize).min(target);
                let f = flops.saturating_add(o.flops);
                if next[k].is_none_or(|g| f < g) {
                    next[k] = Some(f);
                    parent[k] = (j, o.choice);
                }
            }
        }
        best = next;
        parents.push(parent);
    }
    best[target]?;
    let mut chosen = BTreeMap::new();
    let mut j = target;
    for ((layer, _), parent) in layers.iter().zip(&parents).rev() {
        let (from, c) = parent[j];
        if c != LayerChoice::Keep {
            chosen.insert(layer.clone(), c);
        }
        j = from;
    }
    Some(chosen)
}

/// Chooses what the optimized training `graph` recomputes under `request` (nothing without
/// one), duplicates it and plans the result. `loss` names the loss output; `is_state` tells
/// the optimizer-state inputs.
pub fn plan_training(
    graph: &Graph,
    options: &CompileOptions,
    passes: &PipelineReport,
    loss: &str,
    is_state: &dyn Fn(&str) -> bool,
    request: Option<MemoryRequest>,
) -> Result<(Compiled, RecomputeReport), TrainError> {
    let loss_value = graph
        .outputs
        .iter()
        .find(|(n, _)| n == loss)
        .map(|(_, v)| *v)
        .ok_or_else(|| CompileError {
            stage: "recompute",
            message: format!("the training graph has no `{loss}` output"),
        })?;
    let forward = Forward::of(graph, loss_value).ok_or_else(|| CompileError {
        stage: "recompute",
        message: "the graph has a cycle".to_string(),
    })?;
    let mut planner = Planner {
        graph,
        forward,
        options,
        passes,
        loss,
        is_state,
        plans: 0,
    };
    let policy = request.map_or(Recompute::None, |r| r.recompute);
    let budget = request.and_then(|r| r.max_device_memory);
    let fits = |c: &Candidate| budget.is_none_or(|b| c.breakdown.total() <= b);
    let baseline = planner.plan(&Choice::default())?;
    let uniform = |planner: &Planner, c| Choice::uniform(&planner.forward, c);
    let first = match policy {
        Recompute::None | Recompute::Auto => uniform(&planner, LayerChoice::Keep),
        Recompute::Full => uniform(&planner, LayerChoice::Full),
        Recompute::Selective => uniform(&planner, LayerChoice::Selective),
    };
    let without = (
        baseline.breakdown,
        baseline.compiled.cost.flops,
        baseline.compiled.memory.arena_bytes,
    );
    let mut chosen = if planner.forward.recompute_set(graph, &first).is_empty() {
        baseline
    } else {
        planner.plan(&first)?
    };
    if policy == Recompute::Auto && !fits(&chosen) {
        let budget = budget.unwrap_or(u64::MAX);
        let layers = planner.options();
        let mut need = chosen.breakdown.total().saturating_sub(budget);
        for _ in 0..ROUNDS {
            let Some(cover) = cheapest_cover(&layers, need) else {
                break;
            };
            let candidate = planner.plan(&Choice {
                layers: cover,
                annotated: true,
            })?;
            let excess = candidate.breakdown.total().saturating_sub(budget);
            chosen = candidate;
            if excess == 0 {
                break;
            }
            need = need.saturating_add(excess);
        }
        if !fits(&chosen) {
            chosen = planner.plan(&uniform(&planner, LayerChoice::Full))?;
        }
    }
    if let (Some(r), Some(b)) = (request, budget) {
        if !fits(&chosen) {
            let full = match policy {
                Recompute::Full | Recompute::Auto => chosen.breakdown,
                _ => {
                    planner
                        .plan(&uniform(&planner, LayerChoice::Full))?
                        .breakdown
                }
            };
            return Err(TrainError::Train(Box::new(no_fit(
                r,
                b,
                &chosen.breakdown,
                &full,
            ))));
        }
    }
    let report = RecomputeReport {
        policy: policy_name(policy),
        max_device_memory: budget,
        layers: chosen.layers,
        recomputed_ops: chosen.ops,
        flops_added: chosen.compiled.cost.flops.saturating_sub(without.1),
        flops_without: without.1,
        arena_bytes_without: without.2,
        arena_bytes: chosen.compiled.memory.arena_bytes,
        without: without.0,
        breakdown: chosen.breakdown,
        plans: planner.plans,
    };
    Ok((chosen.compiled, report))
}

/// E0720: the step needs `needs` under the policy, `full` with every layer recomputed.
fn no_fit(r: MemoryRequest, budget: u64, needs: &Breakdown, full: &Breakdown) -> Diagnostic {
    let policy = policy_name(r.recompute);
    let fix = if full.total() <= budget {
        format!(
            "`recompute = full` fits ({}), and `recompute = auto` recomputes the least that does",
            human_bytes(full.total())
        )
    } else {
        format!(
            "even recomputing every layer needs {}: raise `max_device_memory` to at least {}B, or train on a smaller batch",
            human_bytes(full.total()),
            full.total()
        )
    };
    Diagnostic::error(
        Code::E0720,
        r.file,
        r.span,
        format!(
            "the training step needs {} with `recompute = {policy}`, more than `max_device_memory` ({})",
            human_bytes(needs.total()),
            human_bytes(budget)
        ),
    )
    .with_label(format!(
        "{} over this budget",
        human_bytes(needs.total() - budget)
    ))
    .with_help(format!("{fix}\nthe step's memory: {}", needs.text()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, selective: (u64, u64), full: (u64, u64)) -> LayerOptions {
        let option = |choice, (saved, flops)| LayerOption {
            choice,
            saved,
            flops,
        };
        (
            name.to_string(),
            vec![
                option(LayerChoice::Selective, selective),
                option(LayerChoice::Full, full),
            ],
        )
    }

    #[test]
    fn the_cover_of_least_flops_wins() {
        // Selective saves 40 for 1 flop, full 100 for 30.
        let layers = vec![
            layer("a", (40, 1), (100, 30)),
            layer("b", (40, 1), (100, 30)),
        ];
        let pick = |need| cheapest_cover(&layers, need);
        assert_eq!(pick(0), Some(BTreeMap::new()));
        // Either layer, selective (ties go to the earlier layer).
        assert_eq!(
            pick(40),
            Some(BTreeMap::from([("a".to_string(), LayerChoice::Selective)]))
        );
        assert_eq!(
            pick(80).map(|m| m.values().copied().collect::<Vec<_>>()),
            Some(vec![LayerChoice::Selective; 2])
        );
        // 120 needs a full layer; full + selective (31 flops) beats two full (60).
        let c = pick(120).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.values().filter(|&&c| c == LayerChoice::Full).count(), 1);
        assert_eq!(
            pick(200).map(|m| m.values().copied().collect::<Vec<_>>()),
            Some(vec![LayerChoice::Full; 2])
        );
        assert_eq!(pick(201), None);
    }

    #[test]
    fn layer_lists_name_runs_of_numbered_layers_in_numeric_order() {
        let gpt3: Vec<String> = (0..96).map(|i| format!("encoder.layers.{i}")).collect();
        let mut paths: Vec<&str> = gpt3.iter().map(String::as_str).collect();
        paths.sort_unstable();
        assert_eq!(layer_list(&paths), "encoder.layers.0–95 (96 layers)");
        assert_eq!(
            layer_list(&["layers.10", "layers.2", "layers.0", "layers.1"]),
            "layers.0–2, layers.10 (4 layers)"
        );
        assert_eq!(layer_list(&["head", "layers.3"]), "head, layers.3");
    }

    #[test]
    fn savings_round_against_the_cover() {
        // 3000 bytes in buckets of 3: a layer saving 2 counts for nothing.
        let layers = vec![layer("a", (2, 1), (2, 1))];
        assert_eq!(cheapest_cover(&layers, 3000), None);
        assert!(cheapest_cover(&[layer("a", (3000, 5), (3000, 9))], 3000).is_some());
    }
}
