//! The compiled module: what `NAME.mir` holds and what the executor runs. A scheduled list of
//! steps over numbered values, every value's type and where it lives (an input, a parameter, a
//! slot of the one intermediate arena, a slot of the region of hoisted parameter-only values, or
//! a buffer holding the next value of an input or parameter), and the kernel chosen for each step.

use serde::{Deserialize, Serialize};

use mslc_core::diag::FileId;
use mslc_core::ops::{Attrs, Cost, Op, TensorType};
use mslc_core::program::{Init, Loc};
use mslc_core::span::Span;
use mslc_kernels::binding::KernelChoice;

/// Where a value's bytes live at run time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Storage {
    /// A model input, supplied by the caller.
    Input {
        /// Input name.
        name: String,
    },
    /// A parameter or buffer, loaded from weights or initialised.
    Param {
        /// Dotted path.
        path: String,
        /// How to initialise it without a weights file.
        init: Init,
        /// `param` (true) or `buffer` (false).
        trainable: bool,
    },
    /// An intermediate, at `offset` bytes into the arena.
    Arena {
        /// Byte offset in the arena (64-byte aligned).
        offset: u64,
    },
    /// A value computed from parameters alone (a weight cast to f16, a transposed weight, a
    /// constant), at `offset` bytes into the hoisted region: computed once after the
    /// parameters change and kept, so later runs skip its step.
    Hoisted {
        /// Byte offset in the hoisted region (64-byte aligned).
        offset: u64,
    },
    /// The next value of the input or parameter `name` (a training step's updated parameter,
    /// optimizer state, gradient sum or running statistic), output under that name: a buffer
    /// of its own, the same size as that input's, so writing it back for the next run
    /// exchanges the two buffers instead of copying one over the other.
    Next {
        /// The input or parameter it replaces (and the output's name).
        name: String,
    },
    /// The next value of the input or parameter `name`, output under that name, computed over
    /// that input's own buffer by the last step that reads it (an optimizer's update written in
    /// place, as `torch.optim` does), or by a step after that one (an all-gathered parameter):
    /// no second buffer, and nothing to exchange after the run.
    /// Only where the caller keeps every run's next value, or where a run that is not to keep
    /// it ends before computing it ([`Guard`]).
    Overwrite {
        /// The input or parameter it overwrites (and the output's name).
        name: String,
    },
}

/// Whether output `output` of `step` may overwrite its operand `operand`
/// ([`Storage::Overwrite`]): input 0 for a step of one output (elementwise or not: a kernel
/// that cannot work in place reads a copy), for a fused elementwise program any operand of the
/// output's type (not broadcast; read from a copy: a gradient sum `acc + g` whose program
/// numbers `acc` last), `adam_update`'s p, m and v for its new p, m and v, `sgd_update`'s p and
/// buf for its new p and buf.
pub fn may_overwrite(module: &Module, step: &Step, output: usize, operand: usize) -> bool {
    let ty = |v: u32| &module.values[v as usize].ty;
    match (step.op, step.outputs.len(), output) {
        (Op::AdamUpdate, 3, k) => [0, 2, 3].get(k) == Some(&operand),
        (Op::SgdUpdate, 2, k) => [0, 2].get(k) == Some(&operand),
        (Op::FusedElementwise, 1, 0) => step
            .inputs
            .get(operand)
            .is_some_and(|&v| ty(v) == ty(step.outputs[0])),
        (_, 1, 0) => operand == 0,
        _ => false,
    }
}

/// One value of the module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueInfo {
    /// Its type.
    pub ty: TensorType,
    /// Where it lives.
    pub storage: Storage,
}

/// One op application in schedule order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The op.
    pub op: Op,
    /// Its complete attributes.
    pub attrs: Attrs,
    /// Operand value indices.
    pub inputs: Vec<u32>,
    /// Result value indices.
    pub outputs: Vec<u32>,
    /// Source instance path, for profiles and reports.
    pub origin: String,
    /// Where its op was written, when a source line wrote it.
    pub loc: Option<SourceLoc>,
    /// Kernel choice.
    pub kernel: KernelChoice,
}

/// Where in the model's source a step's op was written: the file's index among those the checker
/// read (the root file first, then its imports in the order read) and the byte range. A run of the
/// `.msl` points its run-time diagnostics (`--check-numerics`) at the line; a `.mir` keeps it for
/// tools that have the sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceLoc {
    /// Index of the file.
    pub file: u32,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl From<Loc> for SourceLoc {
    fn from(loc: Loc) -> SourceLoc {
        SourceLoc {
            file: loc.file.0,
            start: loc.span.start as u64,
            end: loc.span.end as u64,
        }
    }
}

impl SourceLoc {
    /// The checker's location, for a diagnostic against the files it read.
    pub fn loc(self) -> Loc {
        Loc {
            file: FileId(self.file),
            span: Span::new(self.start as usize, self.end as usize),
        }
    }
}

/// A compiled, scheduled, memory-planned model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Module {
    /// Model name.
    pub name: String,
    /// Target name the module was built for.
    pub target: String,
    /// Fingerprint of the target's kernel-relevant features.
    pub target_fingerprint: String,
    /// Every value.
    pub values: Vec<ValueInfo>,
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// Named outputs.
    pub outputs: Vec<(String, u32)>,
    /// Size of the intermediate arena in bytes.
    pub arena_bytes: u64,
    /// Size of the region of hoisted, parameter-only values in bytes.
    pub hoisted_bytes: u64,
    /// Where a run ends early when its update is to be skipped (a training step under loss
    /// scaling), if it may.
    pub guard: Option<Guard>,
}

/// A training step's skippable update: once the step computing `flag` (a one-element f32) has
/// run, a flag other than 0 (NaN included) ends the run before step `from`. The steps from
/// there on compute only updated parameters and optimizer states (nothing else the caller
/// keeps), so the parameters and states an update would overwrite in place keep their values,
/// as MindSpore's `TrainOneStepWithLossScaleCell` does not call its optimizer on overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// The value whose non-zero skips the update (the overflow check's sum, NaN on overflow).
    pub flag: u32,
    /// The first step of the update.
    pub from: u32,
}

impl Guard {
    /// Whether a run of only the steps `needed` marks reaches a guarded step, and so must
    /// compute the flag and stop there when it is not 0.
    pub fn guards_any(&self, needed: &[bool]) -> bool {
        needed
            .get(self.from as usize..)
            .is_some_and(|guarded| guarded.contains(&true))
    }
}

impl Module {
    /// Input values in declaration order: (name, value index).
    pub fn inputs(&self) -> impl Iterator<Item = (&str, u32)> {
        self.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match &v.storage {
                Storage::Input { name } => Some((name.as_str(), i as u32)),
                _ => None,
            })
    }

    /// Parameter values: (path, value index).
    pub fn params(&self) -> impl Iterator<Item = (&str, u32)> {
        self.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match &v.storage {
                Storage::Param { path, .. } => Some((path.as_str(), i as u32)),
                _ => None,
            })
    }

    /// The input or parameter named `name`: the value a next value of that name replaces.
    pub fn replaced(&self, name: &str) -> Option<usize> {
        self.values.iter().position(|v| match &v.storage {
            Storage::Input { name: n } | Storage::Param { path: n, .. } => n == name,
            _ => false,
        })
    }

    /// Whether a run replaces parameters (outputs named by their paths): a training step, whose
    /// run is one update rather than a forward pass.
    pub fn is_training_step(&self) -> bool {
        self.fixed_params()
            .iter()
            .zip(&self.values)
            .any(|(fixed, v)| !fixed && matches!(v.storage, Storage::Param { .. }))
    }

    /// Per value, whether it is a parameter that no run replaces (no output of its path): what
    /// values computed once and kept across runs (hoisted, packed ahead) may derive from. A
    /// training step replaces its trained parameters every run, so anything derived from them
    /// is computed where the run needs it instead of kept beside them.
    pub fn fixed_params(&self) -> Vec<bool> {
        let replaced: std::collections::HashSet<&str> =
            self.outputs.iter().map(|(n, _)| n.as_str()).collect();
        self.values
            .iter()
            .map(|v| matches!(&v.storage, Storage::Param { path, .. } if !replaced.contains(path.as_str())))
            .collect()
    }

    /// Per value, whether a GEMM or convolution reading it as its right operand reads it packed
    /// once, ahead of its calls: a parameter no run replaces ([`Module::fixed_params`]) or a
    /// value hoisted from parameters. The executor packs these at load (`runtime`), and the
    /// tuner times candidates the same way.
    pub fn packed_ahead(&self) -> Vec<bool> {
        let mut fixed = self.fixed_params();
        for (f, v) in fixed.iter_mut().zip(&self.values) {
            *f |= matches!(v.storage, Storage::Hoisted { .. });
        }
        fixed
    }

    /// The step that computes each value (`None` for inputs, parameters and values no step
    /// writes): where a walk back from an output to the steps it needs starts.
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut producer = vec![None; self.values.len()];
        for (s, step) in self.steps.iter().enumerate() {
            for &o in &step.outputs {
                producer[o as usize] = Some(s);
            }
        }
        producer
    }

    /// Marks in `marked` (one flag per step) every step the values `roots` depend on, walking
    /// back through the steps' inputs from `producers` ([`Module::producers`]); a step marked
    /// already is not walked through (what it reads counts as computed elsewhere).
    pub fn mark_steps_feeding(
        &self,
        producers: &[Option<usize>],
        roots: impl IntoIterator<Item = u32>,
        marked: &mut [bool],
    ) {
        let mut pending: Vec<u32> = roots.into_iter().collect();
        while let Some(v) = pending.pop() {
            if let Some(s) = producers[v as usize] {
                if !std::mem::replace(&mut marked[s], true) {
                    pending.extend(&self.steps[s].inputs);
                }
            }
        }
    }

    /// The registry's cost of step `i` (flops and bytes moved) for the step's operand types;
    /// `None` where the registry cannot cost it.
    pub fn step_cost(&self, i: usize) -> Option<Cost> {
        let step = &self.steps[i];
        let inputs: Vec<TensorType> = step
            .inputs
            .iter()
            .map(|&v| self.values[v as usize].ty.clone())
            .collect();
        mslc_core::ops::cost(step.op, &step.attrs, &inputs).ok()
    }

    /// Bytes of every buffer the plan sizes: the arena, the hoisted region, the parameters,
    /// the inputs and the next values of inputs and parameters (saturating, for a crafted
    /// module's sizes).
    pub fn planned_bytes(&self) -> u64 {
        self.values
            .iter()
            .filter(|v| {
                matches!(
                    v.storage,
                    Storage::Input { .. } | Storage::Param { .. } | Storage::Next { .. }
                )
            })
            .fold(
                self.arena_bytes.saturating_add(self.hoisted_bytes),
                |sum, v| sum.saturating_add(v.ty.bytes()),
            )
    }

    /// Total floating-point work of one forward pass, from the registry's cost rules.
    pub fn flops(&self) -> u64 {
        (0..self.steps.len())
            .filter_map(|i| self.step_cost(i))
            .map(|c| c.flops)
            .sum()
    }
}
