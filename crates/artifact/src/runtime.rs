//! What running a module takes besides the buffers its plan places (arena, hoisted region,
//! parameters, inputs): every step's prepared kernel, how each operand reaches it, the staging
//! buffers for operands and results in other dtypes, the weights packed once for the GEMM, and
//! the per-thread kernel scratch. One definition, which the executor allocates by and
//! `NAME.memplan.json` reports.

use std::ops::Range;

use mslc_core::ops::{DType, TensorType};
use mslc_kernels::convert;
use mslc_kernels::step::needs::{
    scratch_bytes_per_thread, scratch_bytes_while_running, scratch_floats,
};
use mslc_kernels::step::{prepare, OperandMode, Staging, StepKernel};

use crate::{Module, Step, Storage};

/// One step ready to run.
#[derive(Clone, Debug)]
pub struct PreparedStep {
    /// Its kernel with attributes and parameters resolved.
    pub kernel: StepKernel,
    /// How each input reaches the kernel.
    pub modes: Vec<OperandMode>,
    /// Output 0 is f32 and written straight into its buffer (else through staging).
    pub out_direct: bool,
    /// Per output after the first (of a multi-output op): f32 and written straight into its
    /// buffer (else through staging, after output 0's).
    pub more_direct: Vec<bool>,
    /// How the step moves its bytes without a kernel, where it is a copy (a reshape, a cast, an
    /// inference-mode dropout) that can.
    pub copy: Option<CopyStep>,
    /// Where in the packed-weights region input 1 is kept packed (floats), when it depends on
    /// parameters alone (a parameter, or a hoisted value) and the kernel reads it packed: it
    /// is packed after the parameters change, not on every call. Steps applying the same op
    /// and kernel to the same weight share one range.
    pub packed_b: Option<Range<usize>>,
}

/// A copy step that needs no kernel and no staging. Through staging, a value stored in f16
/// was widened, copied and narrowed: three passes, for what is none or one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyStep {
    /// Output 0 is input 0's bytes as they stand (a reshape, or a copy of the same dtype, whose
    /// output the plan places over its operand): nothing to run.
    Unchanged,
    /// Input 0's bytes converted straight into the output's own buffer in one pass: the same
    /// dtype (a byte copy), or one side f32 (a widening or a narrowing).
    Convert,
}

/// Every step prepared, with the staging and scratch they need.
#[derive(Clone, Debug)]
pub struct RuntimeNeeds {
    /// Per step, in schedule order.
    pub steps: Vec<PreparedStep>,
    /// Staging buffers shared by all steps.
    pub staging: Staging,
    /// The largest scratch (in f32) any step's kernel asks for.
    pub scratch_floats: usize,
    /// Floats of the packed-weights region (every [`PreparedStep::packed_b`] range inside it,
    /// each starting on a 64-byte line).
    pub packed_floats: usize,
    /// Over the mesh axes, the sum of the largest contribution the axis's collectives copy
    /// into the threads backend's exchange ([`CollectiveStep::copied_floats`]).
    pub message_floats: usize,
}

impl RuntimeNeeds {
    /// Prepares every step of the validated `module`; an error names the step that cannot
    /// run (an op or kernel parameter the kernels reject, an output overlapping an input).
    pub fn of(module: &Module) -> Result<RuntimeNeeds, String> {
        let mut staging = Staging::default();
        let mut scratch = 0;
        let mut packed_floats = 0usize;
        // Steps that own a range of the packed-weights region.
        let mut packers: Vec<usize> = Vec::new();
        let mut steps: Vec<PreparedStep> = Vec::with_capacity(module.steps.len());
        // Per mesh axis, the largest contribution its collectives copy.
        let mut messages: std::collections::BTreeMap<String, usize> = Default::default();
        // Weights that stay the same across runs (parameters no run replaces, values hoisted
        // from them) are packed once, ahead; the others where each GEMM reads them.
        let fixed = module.packed_ahead();
        for (s, step) in module.steps.iter().enumerate() {
            let at = |m: String| format!("step {s} ({}{}): {m}", step.op, origin_suffix(step));
            let Some((&o, more)) = step.outputs.split_first() else {
                return Err(at("a step has at least one output".to_string()));
            };
            let ty = |v: u32| &module.values[v as usize].ty;
            let types: Vec<TensorType> = step.inputs.iter().map(|&v| ty(v).clone()).collect();
            let out = ty(o);
            for &m in more {
                if output_aliases_input0(module, step, m).map_err(at)? {
                    return Err(at("only its first output may overwrite input 0".into()));
                }
            }
            let kernel = prepare(step.op, &step.attrs, &step.kernel, &types, out).map_err(at)?;
            // The operands the outputs overwrite in their own buffers (validated pairs).
            let overwritten: Vec<usize> = step
                .outputs
                .iter()
                .filter_map(|&v| overwritten_operand(module, step, v))
                .collect();
            let in_arena = output_aliases_input0(module, step, o).map_err(at)?;
            // The operand output 0 is computed over: input 0's bytes in the arena, or the
            // input or parameter it overwrites (validated: one it may).
            let aliased = match in_arena {
                true => Some(0),
                false => overwritten.first().copied(),
            };
            // An update overwrites its states together (adam_update's m and v, sgd_update's
            // buf), and p with them or else p's copy in the first output's own place, all f32,
            // or none of them.
            let updated = kernel.updated_operands();
            let updates_in_place = !updated.is_empty() && !overwritten.is_empty();
            let copies_p = updated.get(1..) == Some(overwritten.as_slice()) && !in_arena;
            if updates_in_place
                && (!(overwritten == updated || copies_p)
                    || types.iter().any(|t| t.dtype != DType::F32))
            {
                return Err(at(
                    "an update in place overwrites its states together, and p with \
                     them or in a place of its own, all f32"
                        .into(),
                ));
            }
            // p's copy is made into output 0 before the kernel updates it there.
            if updates_in_place && copies_p && types[0].numel() != out.numel() {
                return Err(at(format!(
                    "an update in place copies p ({} values) into its first output ({} values)",
                    types[0].numel(),
                    out.numel()
                )));
            }
            let out_direct = out.dtype == DType::F32;
            let copy = match (&kernel, types.as_slice()) {
                (StepKernel::Copy, [x]) if more.is_empty() => match aliased {
                    Some(0) if in_arena && x.dtype == out.dtype => Some(CopyStep::Unchanged),
                    None if convert::one_pass(x.dtype, out.dtype) => Some(CopyStep::Convert),
                    _ => None,
                },
                _ => None,
            };
            let modes = types
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    let mode = match (updates_in_place, overwritten.contains(&j)) {
                        (true, true) => OperandMode::InPlace,
                        (true, false) if j == 0 => OperandMode::CopyIn,
                        _ => OperandMode::of(&kernel, j, t.dtype, aliased == Some(j), out_direct),
                    };
                    // A copy step reads its operand's bytes as they are.
                    if copy.is_none() {
                        staging.need(mode, j, t);
                    }
                    mode
                })
                .collect();
            let more_direct: Vec<bool> = more.iter().map(|&m| ty(m).dtype == DType::F32).collect();
            let staged = std::iter::once((o, out_direct))
                .chain(more.iter().copied().zip(more_direct.iter().copied()))
                .filter(|&(_, direct)| !direct && copy.is_none())
                .map(|(v, _)| ty(v));
            staging.need_outputs(staged);
            let packed_b = match kernel.packed_b_len() {
                // A kernel this CPU cannot run has no layout; running it reports that.
                Some(Ok(len)) if len > 0 && fixed[step.inputs[1] as usize] => {
                    // A step like an earlier one (a recomputed copy) reads the same weight
                    // packed the same way: it shares that range.
                    let twin = packers.iter().find(|&&t| {
                        let other = &module.steps[t];
                        other.inputs[1] == step.inputs[1]
                            && other.op == step.op
                            && other.attrs == step.attrs
                            && other.kernel == step.kernel
                    });
                    match twin.and_then(|&t| steps[t].packed_b.clone()) {
                        Some(range) if range.len() == len => Some(range),
                        _ => {
                            packers.push(s);
                            let start = packed_floats;
                            packed_floats =
                                start.checked_add(len.next_multiple_of(16)).ok_or_else(|| {
                                    at("the packed weights do not fit in memory".into())
                                })?;
                            Some(start..start + len)
                        }
                    }
                }
                _ => None,
            };
            let packed_ahead = packed_b.is_some();
            scratch = scratch.max(scratch_floats(&kernel, &types, out, packed_ahead));
            if let StepKernel::Collective(c) = &kernel {
                let copied = c.copied_floats(types.first().map_or(0, |t| t.numel() as usize));
                let largest = messages.entry(c.axis.clone()).or_insert(0);
                *largest = (*largest).max(copied);
            }
            steps.push(PreparedStep {
                kernel,
                modes,
                out_direct,
                more_direct,
                copy,
                packed_b,
            });
        }
        Ok(RuntimeNeeds {
            steps,
            staging,
            scratch_floats: scratch,
            packed_floats,
            message_floats: messages.values().sum(),
        })
    }

    /// Bytes of the packed-weights region.
    pub fn packed_bytes(&self) -> u64 {
        (self.packed_floats as u64).saturating_mul(4)
    }

    /// Bytes a rank running this program keeps in the threads backend's exchanges: each axis's
    /// group keeps the contributions of its last two rounds (the one members read, and the
    /// one before, whose buffers the next round reuses), two of the largest per member.
    pub fn kept_message_bytes(&self) -> u64 {
        (self.message_floats as u64).saturating_mul(2 * 4)
    }

    /// Bytes of the kernel scratch buffers each pool thread keeps.
    pub fn scratch_bytes_per_thread(&self) -> u64 {
        scratch_bytes_per_thread(self.scratch_floats)
    }

    /// Bytes of scratch a step asking for more than a kept buffer allocates while it runs.
    pub fn scratch_bytes_while_running(&self) -> u64 {
        scratch_bytes_while_running(self.scratch_floats)
    }
}

fn origin_suffix(step: &Step) -> String {
    if step.origin.is_empty() {
        String::new()
    } else {
        format!(" at {}", step.origin)
    }
}

/// The operand of `step` that its output `out` overwrites in that operand's own buffer
/// ([`Storage::Overwrite`]), if it does.
fn overwritten_operand(module: &Module, step: &Step, out: u32) -> Option<usize> {
    let Storage::Overwrite { name } = &module.values[out as usize].storage else {
        return None;
    };
    let replaced = module.replaced(name)?;
    step.inputs.iter().position(|&v| v as usize == replaced)
}

/// Whether `step`'s output `out` occupies exactly input 0's bytes (the result overwrites its
/// operand); an error when it overlaps any input in another way (only a crafted module can).
fn output_aliases_input0(module: &Module, step: &Step, out: u32) -> Result<bool, String> {
    let arena = |v: u32| {
        let info = &module.values[v as usize];
        match info.storage {
            Storage::Arena { offset } => Some((offset, info.ty.bytes())),
            _ => None,
        }
    };
    let Some((o, out_bytes)) = arena(out) else {
        return Ok(false);
    };
    let mut aliased = false;
    for (j, &v) in step.inputs.iter().enumerate() {
        let Some((i, bytes)) = arena(v) else {
            continue;
        };
        let disjoint = bytes == 0
            || out_bytes == 0
            || i.saturating_add(bytes) <= o
            || o.saturating_add(out_bytes) <= i;
        if disjoint {
            continue;
        }
        if j == 0 && i == o && bytes == out_bytes {
            aliased = true;
        } else {
            return Err(format!("its output overlaps input {j} in the arena"));
        }
    }
    Ok(aliased)
}
