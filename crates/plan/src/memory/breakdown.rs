//! Where a training step's memory goes, by what the bytes hold: parameters, gradients,
//! optimizer states, activations and workspace — the one definition of those names, for the
//! planned module here and for estimates made elsewhere (per-device estimates of sharded
//! models use the same type).

use serde::{Deserialize, Serialize};

use mslc_artifact::{Module, Storage};
use mslc_ir::recompute::RECOMPUTE_MARK;

use super::MemoryPlan;

/// Bytes of one device's memory for a training step, by what they hold. The five add up to
/// what the executor allocates with one thread ([`Breakdown::total`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breakdown {
    /// The parameters and buffers.
    pub parameters: u64,
    /// Values the backward and the optimizer update compute (parameter and activation
    /// gradients, update temporaries), live in the arena at its peak.
    pub gradients: u64,
    /// The optimizer's state inputs (`PATH.exp_avg`, …).
    pub optimizer_states: u64,
    /// The batch (the module's other inputs) and the values the forward computes (recomputed
    /// copies included), live in the arena at its peak.
    pub activations: u64,
    /// Everything else: arena bytes free at the peak (fragmentation), the hoisted region of
    /// parameter-only values, staging buffers, packed weights and one thread's kernel scratch.
    pub workspace: u64,
}

impl Breakdown {
    /// The sum of the five.
    pub fn total(&self) -> u64 {
        self.rows()
            .iter()
            .fold(0u64, |t, (_, b)| t.saturating_add(*b))
    }

    /// The five, named for reports, in order.
    pub fn rows(&self) -> [(&'static str, u64); 5] {
        [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer states", self.optimizer_states),
            ("activations", self.activations),
            ("workspace", self.workspace),
        ]
    }

    /// The breakdown of a planned training `module` whose loss is output `loss`; `is_state`
    /// tells the optimizer-state inputs by name. The forward is what the loss depends on.
    pub fn of_training(
        module: &Module,
        plan: &MemoryPlan,
        loss: &str,
        is_state: impl Fn(&str) -> bool,
    ) -> Breakdown {
        let forward = forward_steps(module, loss);
        let mut live = vec![0u64; module.steps.len()];
        let mut forward_live = vec![0u64; module.steps.len()];
        for b in &plan.buffers {
            for s in b.first..=b.last.min(live.len().saturating_sub(1)) {
                live[s] += b.bytes;
                if forward[b.first] {
                    forward_live[s] += b.bytes;
                }
            }
        }
        let peak = (0..live.len()).max_by_key(|&s| (live[s], std::cmp::Reverse(s)));
        let (at_peak, forward_at_peak) = peak.map_or((0, 0), |s| (live[s], forward_live[s]));
        let (mut states, mut batch) = (0u64, 0u64);
        for v in &module.values {
            if let Storage::Input { name } = &v.storage {
                if is_state(name) {
                    states += v.ty.bytes();
                } else {
                    batch += v.ty.bytes();
                }
            }
        }
        Breakdown {
            parameters: plan.params_bytes,
            gradients: at_peak - forward_at_peak,
            optimizer_states: states,
            activations: batch + forward_at_peak,
            workspace: (plan.arena_bytes.saturating_sub(at_peak))
                .saturating_add(plan.hoisted_bytes)
                .saturating_add(plan.staging_bytes)
                .saturating_add(plan.packed_bytes)
                .saturating_add(plan.scratch_bytes_per_thread),
        }
    }
}

/// Per step, whether it computes a forward value: one the output `loss` depends on, or a
/// recomputed copy of one.
fn forward_steps(module: &Module, loss: &str) -> Vec<bool> {
    let mut producer = vec![usize::MAX; module.values.len()];
    for (s, step) in module.steps.iter().enumerate() {
        for &o in &step.outputs {
            producer[o as usize] = s;
        }
    }
    let mut forward: Vec<bool> = module
        .steps
        .iter()
        .map(|s| s.origin.ends_with(RECOMPUTE_MARK))
        .collect();
    let mut stack: Vec<u32> = module
        .outputs
        .iter()
        .filter(|(n, _)| n == loss)
        .map(|(_, v)| *v)
        .collect();
    while let Some(v) = stack.pop() {
        let s = producer[v as usize];
        if s != usize::MAX && !std::mem::replace(&mut forward[s], true) {
            stack.extend(&module.steps[s].inputs);
        }
    }
    forward
}
