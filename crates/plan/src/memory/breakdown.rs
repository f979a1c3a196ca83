//! Where a training step's memory goes, by what the bytes hold: parameters, gradients,
//! optimizer states, activations and workspace — the one definition of those names, for the
//! planned module here and for estimates made elsewhere (per-device estimates of sharded
//! models use the same type).

use serde::{Deserialize, Serialize};

use mslc_artifact::{Module, Storage};
use mslc_core::units::human_bytes;
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
    /// parameter-only values, the buffers receiving the updated parameters and states, staging
    /// buffers, packed weights, one thread's kernel scratch, and the scratch the most
    /// demanding step allocates while it runs.
    pub workspace: u64,
}

impl Breakdown {
    /// The sum of the five.
    pub fn total(&self) -> u64 {
        self.rows()
            .iter()
            .fold(0u64, |t, (_, b)| t.saturating_add(*b))
    }

    /// This breakdown on `threads` executor threads: the other threads' kernel scratch added
    /// to the workspace (the five count one thread's).
    pub fn on_threads(mut self, plan: &MemoryPlan, threads: usize) -> Breakdown {
        let others = threads.saturating_sub(1) as u64;
        self.workspace = self
            .workspace
            .saturating_add(plan.scratch_bytes_per_thread.saturating_mul(others));
        self
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

    /// `parameters 1.00 MiB, gradients …, workspace … (total …)`.
    pub fn text(&self) -> String {
        format!(
            "{} (total {})",
            rows_text(&self.rows(), ", "),
            human_bytes(self.total())
        )
    }

    /// The breakdown of a planned training `module` whose loss is output `loss`; `is_state`
    /// tells the optimizer-state inputs by name. The forward is what the loss depends on.
    pub fn of_training(
        module: &Module,
        plan: &MemoryPlan,
        loss: &str,
        is_state: impl Fn(&str) -> bool,
    ) -> Breakdown {
        let (producer, forward) = forward_steps(module, loss);
        // Bytes live per step, all and forward only, as differences: each buffer's values in
        // turn (a result written in place over its operand takes the buffer from its step on).
        let n = module.steps.len();
        let mut live = vec![0i128; n + 1];
        let mut forward_live = vec![0i128; n + 1];
        for b in &plan.buffers {
            let last = b.last.min(n.saturating_sub(1));
            let starts: Vec<usize> = b
                .values
                .iter()
                .enumerate()
                .map(|(k, &v)| {
                    if k == 0 {
                        b.first
                    } else {
                        producer[v as usize]
                    }
                })
                .collect();
            for (k, &v) in b.values.iter().enumerate() {
                let (from, to) = (starts[k], starts.get(k + 1).map_or(last + 1, |&s| s));
                if from >= to || from > last {
                    continue;
                }
                let bytes = i128::from(b.bytes);
                live[from] += bytes;
                live[to] -= bytes;
                if forward[producer[v as usize]] {
                    forward_live[from] += bytes;
                    forward_live[to] -= bytes;
                }
            }
        }
        let (mut at_peak, mut forward_at_peak) = (0u64, 0u64);
        let (mut all, mut fwd) = (0i128, 0i128);
        for s in 0..n {
            all += live[s];
            fwd += forward_live[s];
            if all as u64 > at_peak {
                (at_peak, forward_at_peak) = (all as u64, fwd as u64);
            }
        }
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
                .saturating_add(plan.next_bytes)
                .saturating_add(plan.staging_bytes)
                .saturating_add(plan.packed_bytes)
                .saturating_add(plan.scratch_bytes_per_thread)
                .saturating_add(plan.scratch_bytes_while_running),
        }
    }
}

/// Named byte counts as `name 1.00 MiB`, joined by `separator`: how every memory breakdown
/// reads in reports.
pub fn rows_text(rows: &[(&str, u64)], separator: &str) -> String {
    rows.iter()
        .map(|(name, bytes)| format!("{name} {}", human_bytes(*bytes)))
        .collect::<Vec<_>>()
        .join(separator)
}

/// The step computing each value (`usize::MAX` for inputs and parameters) and, per step,
/// whether it computes a forward value: one the output `loss` depends on, or a recomputed copy
/// of one.
fn forward_steps(module: &Module, loss: &str) -> (Vec<usize>, Vec<bool>) {
    let producers = module.producers();
    let mut forward: Vec<bool> = module
        .steps
        .iter()
        .map(|s| s.origin.ends_with(RECOMPUTE_MARK))
        .collect();
    let loss_values = module.outputs.iter().filter(|(n, _)| n == loss);
    module.mark_steps_feeding(&producers, loss_values.map(|(_, v)| *v), &mut forward);
    let producer = producers.iter().map(|p| p.unwrap_or(usize::MAX)).collect();
    (producer, forward)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::plan_memory;
    use mslc_artifact::{Step, ValueInfo};
    use mslc_core::ops::{Attrs, DType, Op, TensorType};
    use mslc_core::program::Init;
    use mslc_kernels::binding::choose_kernel;

    /// `a = neg(x)`, `loss = sum(a)`, then a backward-like `b = w * a` and `b + state`.
    #[test]
    fn bytes_are_split_by_what_they_hold_and_add_up_to_the_plan() {
        let t = TensorType::new(DType::F32, [16, 16]);
        let scalar = TensorType::new(DType::F32, []);
        let value = |ty: &TensorType, storage| ValueInfo {
            ty: ty.clone(),
            storage,
        };
        let arena = || Storage::Arena { offset: 0 };
        let step = |op, inputs: Vec<u32>, out: u32, origin: &str| Step {
            op,
            attrs: Attrs::new(),
            inputs,
            outputs: vec![out],
            origin: origin.to_string(),
            loc: None,
            kernel: choose_kernel(op),
        };
        let mut m = Module {
            name: "m".into(),
            target: "cpu".into(),
            target_fingerprint: String::new(),
            values: vec![
                value(&t, Storage::Input { name: "x".into() }),
                value(
                    &t,
                    Storage::Param {
                        path: "w".into(),
                        init: Init::Zeros,
                        trainable: true,
                    },
                ),
                value(
                    &t,
                    Storage::Input {
                        name: "w.exp_avg".into(),
                    },
                ),
                value(&t, arena()),
                value(&scalar, arena()),
                value(&t, arena()),
                value(&t, arena()),
            ],
            steps: vec![
                step(Op::Neg, vec![0], 3, "f"),
                step(Op::Sum, vec![3], 4, "f"),
                step(Op::Mul, vec![1, 3], 5, "f#grad"),
                step(Op::Add, vec![5, 2], 6, "train"),
            ],
            outputs: vec![("loss".into(), 4), ("w.exp_avg".into(), 6)],
            arena_bytes: 0,
            hoisted_bytes: 0,
            guard: None,
        };
        let plan = plan_memory(&mut m, false).unwrap();
        let b = Breakdown::of_training(&m, &plan, "loss", |n| n == "w.exp_avg");
        assert_eq!(b.parameters, 1024);
        assert_eq!(b.optimizer_states, 1024);
        assert_eq!(
            b.total(),
            plan.total_bytes + plan.scratch_bytes_per_thread + plan.scratch_bytes_while_running,
            "{b:?}"
        );
        // At the peak (the mul), `a` (forward) and `a * w` (backward) are live, with the loss.
        assert_eq!(b.activations, 1024 + 1024 + 4);
        assert_eq!(b.gradients, 1024);
        let json = serde_json::to_string(&b).unwrap();
        assert!(json.contains("\"optimizer_states\":1024"), "{json}");
        assert_eq!(serde_json::from_str::<Breakdown>(&json).unwrap(), b);
    }
}
