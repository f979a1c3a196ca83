//! Whole-model confirmation. Every kernel and subgraph decision is measured on its own, but
//! what matters is the module's forward, where caches, the thread pool and neighbouring steps
//! interact. After tuning, the forward with every decision is run against the forward with the
//! defaults — alternated, repeated, outliers dropped — and its outputs are checked against the
//! default's. When it is not faster than the default's fastest round, the forwards with only the
//! kernel decisions and with only the graph-level ones are tried too; the fastest that is not
//! slower is kept and the other decisions are dropped (the caller records their defaults in the
//! knowledge base), so a tuned build is never slower than the default beyond noise. (Keeping
//! decisions that measured slower but within the default's noise left ResNet-50's tuned forward
//! 3-4 % slower than its default in `scripts/tune_figures.sh`, every round: a decision that
//! does not measure faster on the whole model has nothing to offer.)

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use mslc_artifact::Module;
use mslc_exec::{ExecOptions, Executor};
use mslc_plan::kernels::signature;

use crate::kb::{KbError, KnowledgeBase, ModelRecord};
use crate::measure::{check_output, repeat_for};
use crate::tuner::Source;

/// Which tuning decisions a forward runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kept {
    /// Every kernel and graph-level decision.
    All,
    /// The kernel decisions only (every subgraph fused, as by default).
    Kernels,
    /// The graph-level decisions only (default kernel parameters).
    Graph,
    /// None: the defaults.
    None,
}

/// A forward to confirm: a module compiled and given the decisions `kept` names.
pub struct Candidate {
    /// The decisions it runs with.
    pub kept: Kept,
    /// The module.
    pub module: Module,
}

/// One candidate's whole-model measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tried {
    /// The decisions it ran with.
    pub kept: Kept,
    /// Milliseconds per forward (the lowest of the rounds' robust medians; 0 when rejected
    /// before timing).
    pub ms: f64,
    /// Why it may not be kept, when its outputs differ from the default's or it fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// The whole-model result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Confirmation {
    /// Milliseconds per forward with the defaults.
    pub default_ms: f64,
    /// Milliseconds per forward with the decisions kept.
    pub tuned_ms: f64,
    /// The relative spread of the default's rounds, fastest to median (at least
    /// [`NOISE_FLOOR`]): how far apart two measurements of the same forward fall, reported
    /// beside the speed-up (a candidate not faster than the default's fastest is dropped).
    pub noise: f64,
    /// The decisions kept.
    pub kept: Kept,
    /// Every candidate measured, in the order tried.
    pub tried: Vec<Tried>,
}

impl Confirmation {
    /// Default time over tuned time.
    pub fn speedup(&self) -> f64 {
        if self.tuned_ms > 0.0 {
            self.default_ms / self.tuned_ms
        } else {
            1.0
        }
    }
}

/// Alternated rounds of default and candidate measurements.
const ROUNDS: usize = 3;
/// Each measurement repeats the forward for at least this long (and at least five times).
const MEASURE_TIME: Duration = Duration::from_millis(150);
/// The least relative noise assumed, however steady the default's rounds were.
pub const NOISE_FLOOR: f64 = 0.02;

/// An executor for `module` with its parameters and inputs seeded (the same seed for every
/// candidate, so they compute the same forward).
fn executor(module: &Module, threads: usize) -> Result<Executor, String> {
    let options = ExecOptions {
        threads,
        memory_limit: None,
    };
    let mut exec = Executor::new(module.clone(), &options).map_err(|e| e.message)?;
    exec.init_params(SEED);
    for input in exec.unset_inputs() {
        exec.seed_input(&input, SEED).map_err(|e| e.message)?;
    }
    Ok(exec)
}

/// The seed of the confirmation's parameters and inputs.
const SEED: u64 = 0x636f_6e66;

/// The module's float outputs after one run, in output order.
fn outputs(exec: &mut Executor) -> Result<Vec<Vec<f32>>, String> {
    exec.run().map_err(|e| e.message)?;
    let exec = &*exec;
    Ok(exec
        .module()
        .outputs
        .iter()
        .filter_map(|(n, _)| exec.output_f32(n).map(|(_, v)| v))
        .collect())
}

/// Seconds per forward of `exec`.
fn forward(exec: &mut Executor) -> Result<f64, String> {
    repeat_for(|| exec.run().map_err(|e| e.message), MEASURE_TIME)
}

/// The unit roundoff of the coarsest float dtype `module` holds a value in: how far a kernel
/// that sums in another order may move its outputs ([`check_output`]).
fn coarsest_rounding(module: &Module) -> f64 {
    module
        .values
        .iter()
        .map(|v| v.ty.dtype.unit_roundoff())
        .fold(0.0, f64::max)
}

/// A candidate ready to time, or why it may not be kept: its outputs must be the default's
/// `want`, computed with values held at `rounding` at the coarsest.
fn ready(
    c: &Candidate,
    threads: usize,
    (want, rounding): (&[Vec<f32>], f64),
) -> Result<Executor, String> {
    let mut exec = executor(&c.module, threads).map_err(|e| format!("cannot run: {e}"))?;
    let got = outputs(&mut exec).map_err(|e| format!("fails to run: {e}"))?;
    if got.len() != want.len() {
        return Err("its outputs differ from the default's".to_string());
    }
    for (g, w) in got.iter().zip(want) {
        check_output(g, w, rounding)
            .map_err(|e| format!("its outputs differ from the default's: {e}"))?;
    }
    Ok(exec)
}

/// Times `default` against `candidates` (the first with every decision, the others fallbacks
/// tried only when it is not faster) on `threads` threads and says which to keep.
/// `stop` (Ctrl-C) keeps the defaults for what is not yet confirmed.
pub fn confirm(
    default: &Module,
    candidates: &[Candidate],
    threads: usize,
    stop: &AtomicBool,
) -> Result<Confirmation, String> {
    let mut base = executor(default, threads)?;
    let (want, rounding) = (outputs(&mut base)?, coarsest_rounding(default));
    let mut defaults: Vec<f64> = Vec::new();
    let mut tried: Vec<Tried> = Vec::new();
    let mut kept = (Kept::None, f64::INFINITY);
    for (i, c) in candidates.iter().enumerate() {
        if stop.load(Ordering::Relaxed) || (i > 0 && kept.0 != Kept::None) {
            break;
        }
        let mut exec = match ready(c, threads, (&want, rounding)) {
            Ok(e) => e,
            Err(why) => {
                tried.push(Tried {
                    kept: c.kept,
                    ms: 0.0,
                    rejected: Some(why),
                });
                continue;
            }
        };
        let mut times = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            defaults.push(forward(&mut base)?);
            times.push(forward(&mut exec)?);
        }
        let t = fastest(&times);
        tried.push(Tried {
            kept: c.kept,
            ms: t * 1e3,
            rejected: None,
        });
        if t <= fastest(&defaults) && t < kept.1 {
            kept = (c.kept, t);
        }
    }
    // Every candidate rejected before timing: the default is still what the report gives.
    if defaults.is_empty() && !stop.load(Ordering::Relaxed) {
        for _ in 0..ROUNDS {
            defaults.push(forward(&mut base)?);
        }
    }
    let (d, noise) = spread(&defaults);
    Ok(Confirmation {
        default_ms: d * 1e3,
        tuned_ms: if kept.0 == Kept::None { d } else { kept.1 } * 1e3,
        noise,
        kept: kept.0,
        tried,
    })
}

/// The lowest of `times` (infinite for none).
fn fastest(times: &[f64]) -> f64 {
    times.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The lowest of `times` and their relative spread, from the lowest to the median (at least
/// [`NOISE_FLOOR`]): one round disturbed by another process (on a shared machine, 20× the
/// others) does not widen it.
fn spread(times: &[f64]) -> (f64, f64) {
    let low = fastest(times);
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let noise = if low.is_finite() && low > 0.0 {
        (median - low) / low
    } else {
        0.0
    };
    (
        if low.is_finite() { low } else { 0.0 },
        noise.max(NOISE_FLOOR),
    )
}

/// A key naming the forward `module` computes with its kernel choices: the model's name and
/// every step's signature and kernel, hashed. A confirmation is reused while the key is the
/// same (nothing was re-tuned since).
pub fn key(module: &Module) -> String {
    let mut h = Sha256::new();
    h.update(module.name.as_bytes());
    for (i, step) in module.steps.iter().enumerate() {
        h.update(signature(module, i).as_bytes());
        h.update(serde_json::to_vec(&step.kernel).unwrap_or_default());
    }
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A model's whole-model result, as `mslc tune` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct WholeModel {
    /// The measurement and the decisions kept.
    #[serde(flatten)]
    pub confirmation: Confirmation,
    /// Measured in this run, or known from the knowledge base.
    pub source: Source,
    /// Kernel signatures whose decision was dropped in this run.
    pub dropped_kernels: Vec<String>,
    /// Subgraphs whose unfused decision was dropped in this run.
    pub dropped_subgraphs: Vec<String>,
}

/// What a model's confirmation starts from: the module compiled by default, the module
/// compiled with the subgraphs `unfused` names left unfused (the same module when none is),
/// and where the decisions are kept.
pub struct Model<'a> {
    /// The module as compiled by default.
    pub default: &'a Module,
    /// The module compiled with the unfused decisions.
    pub graph: &'a Module,
    /// The subgraphs decided unfused.
    pub unfused: &'a BTreeSet<String>,
    /// The device fingerprint the decisions are keyed by.
    pub device: &'a str,
    /// Worker threads the decisions are keyed by and the forward runs with.
    pub threads: usize,
}

/// Confirms the tuned forward of `model` with the decisions of `kb` against the default's
/// ([`confirm`]), drops from `kb` the decisions not kept and records the result there (saved
/// to `db`, when given); reuses a recorded result when the tuned forward is the one it
/// confirmed. `None` when no decision changes the forward.
pub fn confirm_model(
    model: &Model<'_>,
    kb: &mut KnowledgeBase,
    db: Option<&Path>,
    stop: &AtomicBool,
) -> Result<Option<WholeModel>, KbError> {
    let (device, threads) = (model.device, model.threads);
    let with_kernels = |kb: &KnowledgeBase, m: &Module| {
        let mut m = m.clone();
        kb.apply(&mut m, device, threads, &BTreeSet::new());
        m
    };
    let all = with_kernels(kb, model.graph);
    let known = |confirmation: Confirmation| WholeModel {
        confirmation,
        source: Source::KnowledgeBase,
        dropped_kernels: Vec::new(),
        dropped_subgraphs: Vec::new(),
    };
    if let Some(r) = kb.model(device, threads, &key(&all)) {
        return Ok(Some(known(r.confirmation.clone())));
    }
    if all == *model.default {
        return Ok(None);
    }
    // The kernel decisions of both forwards: dropping them leaves each on its defaults.
    let kernels = with_kernels(kb, model.default);
    let mut kernels_changed = changed(&all, model.graph);
    kernels_changed.extend(changed(&kernels, model.default));
    let mut candidates = vec![Candidate {
        kept: Kept::All,
        module: all.clone(),
    }];
    if !kernels_changed.is_empty() && !model.unfused.is_empty() {
        candidates.push(Candidate {
            kept: Kept::Kernels,
            module: kernels,
        });
        candidates.push(Candidate {
            kept: Kept::Graph,
            module: model.graph.clone(),
        });
    }
    let confirmation = match confirm(model.default, &candidates, threads, stop) {
        Ok(c) => c,
        Err(why) => {
            return Ok(Some(WholeModel {
                source: Source::Skipped(format!("the default forward fails: {why}")),
                ..known(unmeasured())
            }))
        }
    };
    if stop.load(Ordering::Relaxed) {
        return Ok(Some(WholeModel {
            source: Source::Skipped("interrupted before it was confirmed".to_string()),
            ..known(confirmation)
        }));
    }
    let kept = confirmation.kept;
    let mut dropped_kernels = Vec::new();
    let mut dropped_subgraphs = Vec::new();
    if matches!(kept, Kept::Graph | Kept::None) {
        kb.drop_kernels(device, threads, &kernels_changed);
        dropped_kernels.extend(kernels_changed);
    }
    if matches!(kept, Kept::Kernels | Kept::None) {
        kb.drop_unfused(device, threads, model.unfused);
        dropped_subgraphs.extend(model.unfused.iter().cloned());
    }
    let confirmed = match kept {
        Kept::All => all,
        Kept::Kernels | Kept::None => with_kernels(kb, model.default),
        Kept::Graph => with_kernels(kb, model.graph),
    };
    kb.insert_model(ModelRecord {
        device: device.to_string(),
        threads,
        key: key(&confirmed),
        model: model.default.name.clone(),
        confirmation: confirmation.clone(),
    });
    if let Some(db) = db {
        kb.save(db)?;
    }
    Ok(Some(WholeModel {
        confirmation,
        source: Source::Measured,
        dropped_kernels,
        dropped_subgraphs,
    }))
}

/// The signatures of the steps whose kernel choice differs between `tuned` and `base`, two
/// compilations of one module.
fn changed(tuned: &Module, base: &Module) -> BTreeSet<String> {
    (0..tuned.steps.len())
        .filter(|&i| base.steps.get(i).map(|s| &s.kernel) != Some(&tuned.steps[i].kernel))
        .map(|i| signature(tuned, i))
        .collect()
}

/// A confirmation with nothing measured (the defaults kept).
fn unmeasured() -> Confirmation {
    Confirmation {
        default_ms: 0.0,
        tuned_ms: 0.0,
        noise: 0.0,
        kept: Kept::None,
        tried: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_relative_to_the_fastest_round_and_never_below_the_floor() {
        let (low, noise) = spread(&[1.0, 1.1, 1.05]);
        assert_eq!(low, 1.0);
        assert!((noise - 0.05).abs() < 1e-12, "{noise}");
        assert_eq!(spread(&[2.0, 2.0]), (2.0, NOISE_FLOOR));
        // One round 20x slow (measured: another process took the cores) leaves it as it was.
        let (low, noise) = spread(&[1.0, 20.0, 1.05]);
        assert_eq!(low, 1.0);
        assert!((noise - 0.05).abs() < 1e-12, "{noise}");
    }
}
