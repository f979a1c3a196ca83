//! The memory plan of a scheduled module: which values depend on parameters alone and are
//! hoisted into a region of their own (computed once, kept across runs), when each other
//! intermediate must hold its value, which results may overwrite an operand in place, and where
//! in the one arena each buffer goes — and what running it adds: the staging buffers for
//! operands and results in other dtypes and the kernels' per-thread scratch, from the same
//! definition the executor allocates by. Numbers come from the scheduled steps, op by op.

use std::fmt;

use serde::Serialize;

use mslc_artifact::runtime::RuntimeNeeds;
use mslc_artifact::validate::check_overwrite;
use mslc_artifact::{Module, Storage};

use super::arena::{plan_arena, ArenaError, BufferReq};

mod breakdown;

pub use breakdown::{rows_text, Breakdown};

/// One arena buffer (one or more values sharing it through in-place reuse).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedBuffer {
    /// The first value stored in it, e.g. `%12`.
    pub name: String,
    /// The op that first writes it, with its source path.
    pub op: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its byte offset in the arena.
    pub offset: u64,
    /// First step (inclusive) during which it holds a value.
    pub first: usize,
    /// Last step (inclusive) during which it holds a value.
    pub last: usize,
    /// The values stored in it, in order.
    pub values: Vec<u32>,
}

/// The `NAME.memplan.json` content.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Arena, hoisted region, parameters, inputs, next values, staging and packed weights: every buffer the
    /// executor allocates once, exactly (it checks at setup). Each pool thread adds
    /// `scratch_bytes_per_thread`.
    pub total_bytes: u64,
    /// Arena size in bytes.
    pub arena_bytes: u64,
    /// Bytes of the region of hoisted, parameter-only values.
    pub hoisted_bytes: u64,
    /// Bytes of the staging buffers: operands converted to f32 (or copied because the result
    /// overwrites them), integer operands as i64, results stored in another dtype.
    pub staging_bytes: u64,
    /// Bytes of the weights kept packed for the GEMM: each matmul whose right operand depends
    /// on parameters alone reads it from panels packed once after the parameters change (the
    /// raw parameter is kept too: it is what weights load into and other steps may read).
    pub packed_bytes: u64,
    /// Bytes of kernel scratch (packed GEMM panels, im2col patches, tiles) each executor
    /// thread keeps, sized for the most demanding step (each buffer at most 32 MiB).
    pub scratch_bytes_per_thread: u64,
    /// Bytes of scratch the most demanding step allocates while it runs, once per executor,
    /// where it asks for more than a kept buffer holds (a GEMM over two large activations
    /// packs both whole); 0 where every request fits a kept buffer.
    pub scratch_bytes_while_running: u64,
    /// Max over the schedule of the bytes live at once: no plan for this order can do better.
    pub lower_bound_bytes: u64,
    /// `arena_bytes / lower_bound_bytes`.
    pub ratio: f64,
    /// Bytes of parameters and buffers (their own region).
    pub params_bytes: u64,
    /// Bytes of inputs (their own region).
    pub inputs_bytes: u64,
    /// Bytes of the next values of inputs and parameters (a training step's updated
    /// parameters and states), each in a buffer of its own that writing it back exchanges with
    /// the input's.
    pub next_bytes: u64,
    /// Bytes a rank running this program keeps in the threads backend's exchanges
    /// (`RuntimeNeeds::kept_message_bytes`): not allocated by the executor, so not in
    /// `total_bytes`, but part of what a rank holds.
    pub kept_message_bytes: u64,
    /// Bytes the executor keeps for the program itself once it has prepared it: each step's
    /// kernel binding, operand views and shapes ([`EXECUTOR_BYTES_PER_STEP`] a step). Not a
    /// buffer of the plan, so not in `total_bytes`, but part of what a rank holds: on a rank
    /// of a megabyte or two it is a tenth of it.
    pub program_bytes: u64,
    /// The placement strategy that won.
    pub strategy: String,
    /// Every strategy tried with the arena it needed.
    pub strategies_tried: Vec<(String, u64)>,
    /// How many results reuse an operand's buffer: written in place, or a view of it.
    pub in_place_reuses: usize,
    /// The arena buffers.
    pub buffers: Vec<PlannedBuffer>,
    /// The hoisted values, each with its own slot of the hoisted region, live from the step
    /// that computes it to the end.
    pub hoisted: Vec<PlannedBuffer>,
}

/// What the executor keeps for each step of a program it prepares, beside the buffers of the
/// memory plan: measured with a counting allocator (`tests/exec_alloc.rs`) at 660–680 bytes a
/// step on tiny_llama (1–8 layers, f32 and bf16 under O2) and ResNet-50 — the module itself,
/// built before the executor, not counted.
pub const EXECUTOR_BYTES_PER_STEP: u64 = 700;

/// A step's output slot: its first value's name, the op with its source path, and the bytes.
fn planned(module: &Module, s: usize, o: usize, offset: u64, last: usize) -> PlannedBuffer {
    let step = &module.steps[s];
    let origin = if step.origin.is_empty() {
        String::new()
    } else {
        format!(" ({})", step.origin)
    };
    PlannedBuffer {
        name: format!("%{o}"),
        op: format!("{}{origin}", step.op),
        bytes: module.values[o].ty.bytes(),
        offset,
        first: s,
        last,
        values: vec![o as u32],
    }
}

/// Moves every value computed from parameters alone (and by input-free steps such as constants)
/// to the hoisted region, one 64-byte-aligned slot each, and returns the slots and the
/// region's size. A collective is never hoisted: it runs every step in lockstep with the other
/// ranks, and what it gathers (a level-3 sharded parameter) is meant to live only around its
/// uses, in the arena.
fn hoist(module: &mut Module) -> (Vec<PlannedBuffer>, u64) {
    let last = module.steps.len().saturating_sub(1);
    let mut invariant = module.fixed_params();
    let mut slots = Vec::new();
    let mut bytes = 0u64;
    for s in 0..module.steps.len() {
        let step = &module.steps[s];
        if !step.inputs.iter().all(|&v| invariant[v as usize])
            || mslc_ir::shard::is_collective(step.op)
        {
            continue;
        }
        for o in step.outputs.clone() {
            let o = o as usize;
            invariant[o] = true;
            slots.push(planned(module, s, o, bytes, last));
            module.values[o].storage = Storage::Hoisted { offset: bytes };
            bytes += module.values[o].ty.bytes().div_ceil(64) * 64;
        }
    }
    (slots, bytes)
}

/// Gives every output that is the next value of an input or parameter of its name and type
/// (a training step's updated parameters, optimizer states, gradient sums and running
/// statistics) a buffer of its own instead of an arena slot, so writing it back for the next
/// run exchanges buffers instead of copying (`Storage::Next`); returns their bytes. A value
/// output under several names keeps its arena slot. With `overwrite` (the caller keeps every
/// run's next values: an update never skipped), a next value whose step may compute it over the
/// replaced value's own buffer does so instead (`Storage::Overwrite`, as `torch.optim` updates
/// in place): no buffer at all. `adam_update` overwrites its m and v together or neither, and
/// its p only with them.
fn carry_next_values(module: &mut Module, overwrite: bool) -> u64 {
    let mut replaced = std::collections::HashMap::new();
    for (i, v) in module.values.iter().enumerate() {
        if let Storage::Input { name: n } | Storage::Param { path: n, .. } = &v.storage {
            replaced.insert(n.clone(), i);
        }
    }
    // The next values, each with the value it replaces and whether it may overwrite it.
    let mut next = Vec::new();
    for (name, v) in &module.outputs {
        let v = *v as usize;
        let once = module
            .outputs
            .iter()
            .filter(|(_, o)| *o as usize == v)
            .count()
            == 1;
        let value = &module.values[v];
        let Some(&r) = replaced.get(name) else {
            continue;
        };
        if once && matches!(value.storage, Storage::Arena { .. }) && module.values[r].ty == value.ty
        {
            let over = overwrite && check_overwrite(module, v, r).is_ok();
            next.push((name.clone(), v, over));
        }
    }
    // A step's outputs after the first (adam_update's m and v) overwrite together or not at
    // all, and its first (p) only with them; with them alone, p is copied into its own place
    // and updated there (under optimizer sharding the update's p is a slice, not a parameter).
    let overwriting: std::collections::HashSet<usize> = next
        .iter()
        .filter(|&&(_, _, over)| over)
        .map(|&(_, v, _)| v)
        .collect();
    for step in &module.steps {
        let over = |o: &u32| overwriting.contains(&(*o as usize));
        let Some((first, rest)) = step.outputs.split_first() else {
            continue;
        };
        let rest_all = rest.iter().all(over);
        if (rest.iter().any(over) || over(first)) && !rest_all {
            for entry in next.iter_mut() {
                entry.2 &= !step.outputs.contains(&(entry.1 as u32));
            }
        }
    }
    let mut bytes = 0;
    for (name, v, over) in next {
        let value = &mut module.values[v];
        value.storage = match over {
            true => Storage::Overwrite { name },
            false => {
                bytes += value.ty.bytes();
                Storage::Next { name }
            }
        };
    }
    bytes
}

/// Why a module's memory cannot be planned.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryError {
    /// The arena cannot be placed.
    Arena(ArenaError),
    /// A step cannot be prepared to run, so its staging and scratch are unknown.
    Step(String),
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryError::Arena(e) => e.fmt(f),
            MemoryError::Step(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for MemoryError {}

impl MemoryPlan {
    /// Sizes the staging buffers and the per-thread scratch for `module` as its kernels are
    /// chosen now (again after a kernel table changes them), and the total.
    pub fn account_runtime(&mut self, module: &Module) -> Result<(), MemoryError> {
        let needs = RuntimeNeeds::of(module).map_err(MemoryError::Step)?;
        self.staging_bytes = needs.staging.bytes();
        self.scratch_bytes_per_thread = needs.scratch_bytes_per_thread();
        self.scratch_bytes_while_running = needs.scratch_bytes_while_running();
        self.packed_bytes = needs.packed_bytes();
        self.kept_message_bytes = needs.kept_message_bytes();
        self.program_bytes = EXECUTOR_BYTES_PER_STEP.saturating_mul(module.steps.len() as u64);
        self.total_bytes = module
            .planned_bytes()
            .saturating_add(self.staging_bytes)
            .saturating_add(self.packed_bytes);
        Ok(())
    }
}

/// Plans the hoisted region and the arena of `module`, writing each value's place and both
/// sizes into it, then sizes what running it adds ([`MemoryPlan::account_runtime`]). With
/// `overwrite`, next values are computed over what they replace where they can (see
/// [`carry_next_values`]): for a caller that keeps every run's next values.
pub fn plan_memory(module: &mut Module, overwrite: bool) -> Result<MemoryPlan, MemoryError> {
    let (hoisted, hoisted_bytes) = hoist(module);
    let next_bytes = carry_next_values(module, overwrite);
    let steps = module.steps.len();
    let n = module.values.len();
    let mut last_use = vec![0usize; n];
    for (s, step) in module.steps.iter().enumerate() {
        for &o in &step.outputs {
            last_use[o as usize] = s;
        }
        for &i in &step.inputs {
            last_use[i as usize] = last_use[i as usize].max(s);
        }
    }
    let mut is_output = vec![false; n];
    for (_, v) in &module.outputs {
        is_output[*v as usize] = true;
        last_use[*v as usize] = steps.saturating_sub(1);
    }

    // Buffers: one per arena value, except results written in place over a dying operand and
    // views (reshapes) of an operand, which share its buffer and extend its life.
    let mut buffer_of = vec![usize::MAX; n];
    let mut buffers: Vec<PlannedBuffer> = Vec::new();
    let mut reqs: Vec<BufferReq> = Vec::new();
    // Whether a buffer holds a module output (never overwritten in place).
    let mut holds_output: Vec<bool> = Vec::new();
    let mut in_place_reuses = 0;
    for (s, step) in module.steps.iter().enumerate() {
        let spec = step.op.spec();
        // The buffer of input 0 when output 0 may take it: same bytes, and for an in-place
        // write, every value in that buffer dies at this step and no other operand reads it.
        let shared = step
            .inputs
            .first()
            .filter(|_| spec.in_place && step.outputs.len() == 1)
            .map(|&i| (i as usize, buffer_of[i as usize]))
            .filter(|&(i, b)| {
                b != usize::MAX
                    && module.values[i].ty.bytes()
                        == module.values[step.outputs[0] as usize].ty.bytes()
                    && (spec.is_view()
                        || (reqs[b].last == s
                            && !holds_output[b]
                            && step.inputs[1..].iter().all(|&j| buffer_of[j as usize] != b)))
            })
            .map(|(_, b)| b);
        for &o in &step.outputs {
            let o = o as usize;
            if !matches!(module.values[o].storage, Storage::Arena { .. }) {
                continue;
            }
            if let Some(b) = shared {
                buffer_of[o] = b;
                buffers[b].values.push(o as u32);
                reqs[b].last = reqs[b].last.max(last_use[o]);
                buffers[b].last = reqs[b].last;
                holds_output[b] |= is_output[o];
                in_place_reuses += 1;
                continue;
            }
            buffer_of[o] = buffers.len();
            let buffer = planned(module, s, o, 0, last_use[o]);
            reqs.push(BufferReq {
                bytes: buffer.bytes,
                first: buffer.first,
                last: buffer.last,
            });
            buffers.push(buffer);
            holds_output.push(is_output[o]);
        }
    }

    let plan = plan_arena(&reqs).map_err(MemoryError::Arena)?;
    for (b, offset) in buffers.iter_mut().zip(&plan.offsets) {
        b.offset = *offset;
    }
    for (v, info) in module.values.iter_mut().enumerate() {
        if let Storage::Arena { offset } = &mut info.storage {
            if let Some(b) = buffers.get(buffer_of[v]) {
                *offset = b.offset;
            }
        }
    }
    module.arena_bytes = plan.arena_bytes;
    module.hoisted_bytes = hoisted_bytes;
    let region = |pick: fn(&Storage) -> bool| -> u64 {
        module
            .values
            .iter()
            .filter(|v| pick(&v.storage))
            .map(|v| v.ty.bytes())
            .sum()
    };
    let params_bytes = region(|s| matches!(s, Storage::Param { .. }));
    let inputs_bytes = region(|s| matches!(s, Storage::Input { .. }));
    let mut memory = MemoryPlan {
        total_bytes: 0,
        arena_bytes: plan.arena_bytes,
        hoisted_bytes,
        staging_bytes: 0,
        packed_bytes: 0,
        scratch_bytes_per_thread: 0,
        scratch_bytes_while_running: 0,
        lower_bound_bytes: plan.lower_bound_bytes,
        ratio: plan.ratio(),
        params_bytes,
        inputs_bytes,
        next_bytes,
        kept_message_bytes: 0,
        program_bytes: 0,
        strategy: plan.strategy.to_string(),
        strategies_tried: plan
            .strategies_tried
            .iter()
            .map(|(n, b)| (n.to_string(), *b))
            .collect(),
        in_place_reuses,
        buffers,
        hoisted,
    };
    memory.account_runtime(module)?;
    Ok(memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mslc_artifact::{Step, ValueInfo};
    use mslc_core::ops::{Attrs, DType, Op, TensorType};
    use mslc_core::program::Init;
    use mslc_kernels::binding::choose_kernel;

    /// `y = neg(x + cast(neg(w)))`: `neg(w)` and its cast read the parameter alone.
    fn module() -> Module {
        let f32t = TensorType::new(DType::F32, [4, 8]);
        let f16t = TensorType::new(DType::F16, [4, 8]);
        let value = |ty: &TensorType, storage| ValueInfo {
            ty: ty.clone(),
            storage,
        };
        let arena = || Storage::Arena { offset: 0 };
        let step = |op, attrs, inputs: Vec<u32>, out: u32| Step {
            op,
            attrs,
            inputs,
            outputs: vec![out],
            origin: String::new(),
            loc: None,
            kernel: choose_kernel(op),
        };
        let cast = Attrs::new().with("dtype", DType::F16);
        Module {
            name: "m".into(),
            target: "cpu".into(),
            target_fingerprint: String::new(),
            values: vec![
                value(&f16t, Storage::Input { name: "x".into() }),
                value(
                    &f32t,
                    Storage::Param {
                        path: "w".into(),
                        init: Init::Zeros,
                        trainable: true,
                    },
                ),
                value(&f32t, arena()),
                value(&f16t, arena()),
                value(&f16t, arena()),
                value(&f16t, arena()),
            ],
            steps: vec![
                step(Op::Neg, Attrs::new(), vec![1], 2),
                step(Op::Cast, cast, vec![2], 3),
                step(Op::Add, Attrs::new(), vec![0, 3], 4),
                step(Op::Neg, Attrs::new(), vec![4], 5),
            ],
            outputs: vec![("y".into(), 5)],
            arena_bytes: 0,
            hoisted_bytes: 0,
            guard: None,
        }
    }

    #[test]
    fn parameter_only_values_get_their_own_region() {
        let mut m = module();
        let plan = plan_memory(&mut m, false).unwrap();
        let storage: Vec<&Storage> = m.values[2..].iter().map(|v| &v.storage).collect();
        assert_eq!(
            storage,
            [
                &Storage::Hoisted { offset: 0 },
                &Storage::Hoisted { offset: 128 },
                &Storage::Arena { offset: 0 },
                &Storage::Arena { offset: 0 },
            ]
        );
        assert_eq!((m.hoisted_bytes, plan.hoisted_bytes), (192, 192));
        assert_eq!(plan.hoisted.len(), 2);
        // The add's result is overwritten in place by the last neg; nothing hoisted is.
        assert_eq!((plan.buffers.len(), plan.in_place_reuses), (1, 1));
        assert_eq!(plan.arena_bytes, 64);
        // Staging: the f16 operands of the add, converted to f32 (input 0 and input 1, 32
        // values each), and the f16 results computed in f32 first (32 values).
        assert_eq!(plan.staging_bytes, 3 * 32 * 4);
        assert_eq!(plan.total_bytes, 64 + 192 + 128 + 64 + 384);
        assert_eq!(plan.total_bytes, m.planned_bytes() + plan.staging_bytes);
        // Negations and an add without a fused program take no kernel scratch, so the module
        // reserves none per thread.
        assert_eq!(plan.scratch_bytes_per_thread, 0);
        assert_eq!(plan.scratch_bytes_while_running, 0);
    }

    #[test]
    fn next_values_of_inputs_get_buffers_of_their_own() {
        // The module's result output as `x` (x's type): the next value of input `x`, off the
        // arena and counted in the plan; output under two names, it keeps its arena slot.
        let mut m = module();
        m.outputs = vec![("x".into(), 5)];
        let plan = plan_memory(&mut m, false).unwrap();
        assert_eq!(m.values[5].storage, Storage::Next { name: "x".into() });
        assert_eq!(plan.next_bytes, m.values[5].ty.bytes());
        assert_eq!(plan.total_bytes, m.planned_bytes() + plan.staging_bytes);
        let mut m = module();
        m.outputs = vec![("x".into(), 5), ("y".into(), 5)];
        let plan = plan_memory(&mut m, false).unwrap();
        assert!(matches!(m.values[5].storage, Storage::Arena { .. }));
        assert_eq!(plan.next_bytes, 0);
    }

    #[test]
    fn a_next_value_its_step_may_compute_over_its_input_does_so_when_asked() {
        // `x + cast(neg(w))` output as `x`: the add reads x once, at input 0, and last; the
        // neg after it reads the new x, in x's buffer.
        let mut m = module();
        m.outputs = vec![("x".into(), 4), ("y".into(), 5)];
        let plan = plan_memory(&mut m, true).unwrap();
        assert_eq!(m.values[4].storage, Storage::Overwrite { name: "x".into() });
        assert_eq!(plan.next_bytes, 0);
        assert_eq!(plan.total_bytes, m.planned_bytes() + plan.staging_bytes);
        mslc_artifact::validate::validate(&m).unwrap();
        // Not asked (an update that may be skipped): a buffer of its own.
        let mut m = module();
        m.outputs = vec![("x".into(), 4), ("y".into(), 5)];
        let plan = plan_memory(&mut m, false).unwrap();
        assert_eq!(m.values[4].storage, Storage::Next { name: "x".into() });
        assert_eq!(plan.next_bytes, m.values[4].ty.bytes());
        // The last neg, which does not read x, writes into x's buffer: nothing reads x after
        // the add.
        let mut m = module();
        m.outputs = vec![("x".into(), 5)];
        plan_memory(&mut m, true).unwrap();
        assert_eq!(m.values[5].storage, Storage::Overwrite { name: "x".into() });
        mslc_artifact::validate::validate(&m).unwrap();
    }

    /// `y = x @ w` and `z = y @ x2`: the parameter `w` is packed once for the GEMM (counted in
    /// the plan); an input operand is not.
    #[test]
    fn weights_a_matmul_reads_are_packed_once_and_counted() {
        let t = |shape: [i64; 2]| TensorType::new(DType::F32, shape);
        let value = |ty: TensorType, storage| ValueInfo { ty, storage };
        let step = |inputs: Vec<u32>, out: u32| Step {
            op: Op::Matmul,
            attrs: Attrs::new(),
            inputs,
            outputs: vec![out],
            origin: String::new(),
            loc: None,
            kernel: choose_kernel(Op::Matmul),
        };
        let mut m = Module {
            name: "m".into(),
            target: "cpu".into(),
            target_fingerprint: String::new(),
            values: vec![
                value(t([3, 8]), Storage::Input { name: "x".into() }),
                value(
                    t([8, 20]),
                    Storage::Param {
                        path: "w".into(),
                        init: Init::Zeros,
                        trainable: true,
                    },
                ),
                value(t([3, 20]), Storage::Arena { offset: 0 }),
                value(t([20, 5]), Storage::Input { name: "x2".into() }),
                value(t([3, 5]), Storage::Arena { offset: 0 }),
            ],
            steps: vec![step(vec![0, 1], 2), step(vec![2, 3], 4)],
            outputs: vec![("z".into(), 4)],
            arena_bytes: 0,
            hoisted_bytes: 0,
            guard: None,
        };
        let plan = plan_memory(&mut m, false).unwrap();
        let nr = mslc_kernels::matmul::MicroKernel::select(Default::default())
            .unwrap()
            .nr as u64;
        let packed = (20u64.div_ceil(nr) * 8 * nr).next_multiple_of(16) * 4;
        assert_eq!(plan.packed_bytes, packed);
        assert_eq!(
            plan.total_bytes,
            m.planned_bytes() + plan.staging_bytes + packed
        );
    }
}
