//! One kernel signature as a tuning problem: the op, its attributes and operand types, and
//! seeded inputs of those shapes — the same bytes for every candidate, so their outputs can be
//! compared with the reference and with each other.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use mslc_artifact::{Module, Storage};
use mslc_core::ops::{Attrs, DType, Op, TensorType};
use mslc_kernels::binding::{KernelChoice, KernelKind};
use mslc_kernels::step::{prepare, StepKernel};
use mslc_kernels::{convert, TensorRef};
use mslc_plan::kernels::signature;

/// A signature to tune, with its inputs.
#[derive(Clone, Debug)]
pub struct Case {
    /// The signature, as the kernel table writes it.
    pub signature: String,
    /// The op.
    pub op: Op,
    /// Its attributes.
    pub attrs: Attrs,
    /// The operand types.
    pub inputs: Vec<TensorType>,
    /// The result type (a multi-output step's first).
    pub output: TensorType,
    /// A multi-output step's further result types, in order (`attention_grad`'s dk and dv).
    pub more_outputs: Vec<TensorType>,
    /// The steps of the module with this signature.
    pub steps: Vec<usize>,
    /// Which inputs are the module's weights ([`Module::packed_ahead`]: fixed parameters and
    /// values hoisted from them): read once per forward, from memory rather than a warm cache,
    /// and so timed cold ([`crate::measure::Candidate::time`]); a weight at input 1 is packed
    /// ahead ([`Case::b_packed_ahead`]).
    pub weights: Vec<bool>,
    /// Whether the module's step is an update in place (a train step's `adam_update`
    /// overwrites the parameter and its moments: [`StepKernel::updated_operands`]): a run then
    /// starts from those operands in its outputs ([`Case::start_state`]), as the executor's
    /// does.
    pub in_place: bool,
    /// The seeded inputs, generated when first read ([`Case::seeded`]).
    seeded: OnceLock<Seeded>,
    /// Input shapes as the kernels take them.
    shapes: Vec<Vec<usize>>,
}

/// A case's seeded inputs.
#[derive(Clone, Debug)]
struct Seeded {
    /// Input data as f32 (empty for the integer input).
    data: Vec<Vec<f32>>,
    /// The integer input's values, when the kernel reads one.
    ints: Vec<i64>,
}

impl Case {
    /// Every distinct signature of `module` whose kernel takes parameters it uses, in
    /// first-use order, with seeded inputs.
    pub fn of_module(module: &Module) -> Vec<Case> {
        let mut cases: Vec<Case> = Vec::new();
        let packed_ahead = module.packed_ahead();
        for (i, step) in module.steps.iter().enumerate() {
            if KernelKind::for_op(step.op).default_params().is_empty() {
                continue;
            }
            let sig = signature(module, i);
            if let Some(case) = cases.iter_mut().find(|c| c.signature == sig) {
                case.steps.push(i);
                continue;
            }
            let ty = |v: &u32| module.values[*v as usize].ty.clone();
            let Some(output) = step.outputs.first().map(ty) else {
                continue;
            };
            let inputs: Vec<TensorType> = step.inputs.iter().map(ty).collect();
            let mut case = Case::new(sig, step.op, step.attrs.clone(), inputs, output, i);
            case.more_outputs = step.outputs.iter().skip(1).map(ty).collect();
            case.weights = step
                .inputs
                .iter()
                .map(|&v| packed_ahead[v as usize])
                .collect();
            let kernel = case.prepare(&case.default_choice());
            // A copy (cast, reshape) or a fill runs the same whatever its parameters say.
            if let Ok(StepKernel::Copy | StepKernel::Constant(_)) = kernel {
                continue;
            }
            // An update whose results overwrite its operands runs so; a unary or binary op
            // over its operand's bytes computes the same out of place.
            let updates = kernel.is_ok_and(|k| !k.updated_operands().is_empty());
            case.in_place = updates
                && step.outputs.iter().any(|&v| {
                    matches!(module.values[v as usize].storage, Storage::Overwrite { .. })
                });
            cases.push(case);
        }
        cases
    }

    /// The signatures a tuning run searches: those of `graph`, the module compiled with the
    /// subgraphs `unfused` names left unfused (those fused ops no longer in it), and the fused
    /// ops of those subgraphs from `default`, the module compiled by default: should the
    /// whole-model confirmation drop the unfused decisions, the forward it keeps runs them, and
    /// tuning the model again then finds every signature known instead of searching them (and
    /// confirming) anew.
    pub fn to_tune(default: &Module, graph: &Module, unfused: &BTreeSet<String>) -> Vec<Case> {
        let mut cases = Case::of_module(graph);
        cases.retain(|c| !unfused.contains(&c.signature));
        let fused: Vec<Case> = Case::of_module(default)
            .into_iter()
            .filter(|d| !cases.iter().any(|c| c.signature == d.signature))
            .collect();
        cases.extend(fused);
        cases
    }

    /// A case for one step of `op`, its inputs seeded from the signature (generated when first
    /// read: a model whose signatures the knowledge base knows never measures them).
    pub fn new(
        signature: String,
        op: Op,
        attrs: Attrs,
        inputs: Vec<TensorType>,
        output: TensorType,
        step: usize,
    ) -> Case {
        let shapes: Vec<Vec<usize>> = inputs.iter().map(kernel_shape).collect();
        let weights = vec![false; inputs.len()];
        Case {
            signature,
            op,
            attrs,
            inputs,
            output,
            more_outputs: Vec::new(),
            steps: vec![step],
            weights,
            in_place: false,
            seeded: OnceLock::new(),
            shapes,
        }
    }

    /// The inputs seeded from the signature: the float operands as f32 (empty for the integer
    /// one) and the integer operand's values, when the kernel reads one.
    fn seeded(&self) -> &Seeded {
        self.seeded.get_or_init(|| {
            let (op, shapes) = (self.op, &self.shapes);
            let mut rng = Rng::new(
                self.signature
                    .bytes()
                    .fold(0x5EED, |h, b| h.rotate_left(5) ^ u64::from(b)),
            );
            let kernel = prepare(
                op,
                &self.attrs,
                &default_choice(op),
                &self.inputs,
                &self.output,
            )
            .ok();
            let integer = kernel.as_ref().and_then(StepKernel::integer_input);
            let mut ints = Vec::new();
            let data = shapes
                .iter()
                .enumerate()
                .map(|(j, shape)| {
                    let len: usize = shape.iter().product();
                    if Some(j) == integer {
                        // Ids index the embedding table's rows (or its gradient's), labels
                        // the logits' classes.
                        let bound = match (op, &kernel) {
                            (Op::Embedding, _) => shapes.get(1).and_then(|s| s.first()).copied(),
                            (_, Some(StepKernel::EmbeddingGrad(vocab, _))) => Some(*vocab),
                            _ => shapes.first().and_then(|s| s.last()).copied(),
                        }
                        .unwrap_or(1)
                        .max(1);
                        ints = (0..len).map(|_| rng.below(bound) as i64).collect();
                        Vec::new()
                    } else {
                        // Values the operand's dtype holds, as the executor's are (a weight
                        // stored in f16 may be packed in f16 panels, exactly).
                        // A batch norm's running variance (input 2) is never negative, nor
                        // are Adam's second moment and step scalars (inputs 3 to 6).
                        let nonnegative =
                            matches!((op, j), (Op::BatchNorm, 2) | (Op::AdamUpdate, 3..));
                        let values: Vec<f32> = (0..len)
                            .map(|_| rng.uniform())
                            .map(|v| if nonnegative { v.abs() } else { v })
                            .collect();
                        let mut held = values.clone();
                        match self.inputs[j].dtype {
                            DType::F16 => convert::round_through_f16(&values, &mut held),
                            DType::BF16 => convert::round_through_bf16(&values, &mut held),
                            _ => {}
                        }
                        held
                    }
                })
                .collect();
            Seeded { data, ints }
        })
    }

    /// The kernel family that runs this case.
    pub fn kind(&self) -> KernelKind {
        KernelKind::for_op(self.op)
    }

    /// The binding's default choice for this case's op.
    pub fn default_choice(&self) -> KernelChoice {
        default_choice(self.op)
    }

    /// The step kernel for `choice`, or why it cannot be prepared.
    pub fn prepare(&self, choice: &KernelChoice) -> Result<StepKernel, String> {
        choice.check_for(self.op)?;
        prepare(self.op, &self.attrs, choice, &self.inputs, &self.output)
    }

    /// Whether the module's executor reads input 1 packed ahead (a weight), so candidates are
    /// timed without packing it per call.
    pub fn b_packed_ahead(&self) -> bool {
        self.weights.get(1) == Some(&true)
    }

    /// Input 1 packed for `kernel` as the executor packs a weight once at load, when this
    /// case's executor does ([`Case::b_packed_ahead`]) and the kernel reads it so; `None`
    /// otherwise (each call packs what it needs).
    pub fn pack_ahead(&self, kernel: &StepKernel) -> Result<Option<Vec<f32>>, String> {
        if !self.b_packed_ahead() {
            return Ok(None);
        }
        let len = match kernel.packed_b_len() {
            Some(len) => len.map_err(|e| e.to_string())?,
            None => return Ok(None),
        };
        let (Some(b), true) = (self.seeded().data.get(1), len > 0) else {
            return Ok(None);
        };
        let mut packed = vec![0.0; len];
        kernel.pack_b(b, &mut packed).map_err(|e| e.to_string())?;
        Ok(Some(packed))
    }

    /// The inputs as kernel views.
    pub fn views(&self) -> Vec<TensorRef<'_>> {
        self.seeded()
            .data
            .iter()
            .zip(&self.shapes)
            .map(|(data, shape)| TensorRef { data, shape })
            .collect()
    }

    /// The integer input's values (empty when the kernel reads none).
    pub fn ints(&self) -> &[i64] {
        &self.seeded().ints
    }

    /// Elements of the results, which a candidate writes one after another.
    pub fn output_len(&self) -> usize {
        self.output_lens().sum()
    }

    /// Elements of each result, in order.
    pub fn output_lens(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(&self.output)
            .chain(&self.more_outputs)
            .map(|t| kernel_dims(t).product())
    }

    /// Puts into `out` (the case's outputs one after another) what an update in place finds
    /// there before it runs ([`Case::in_place`]): the operands `kernel` overwrites, output by
    /// output ([`StepKernel::updated_operands`]). Nothing for a case that is not in place.
    pub fn start_state(&self, kernel: &StepKernel, out: &mut [f32]) {
        if !self.in_place {
            return;
        }
        let data = &self.seeded().data;
        let mut at = 0;
        for (&j, len) in kernel.updated_operands().iter().zip(self.output_lens()) {
            if let (Some(dst), Some(src)) = (out.get_mut(at..at + len), data.get(j)) {
                let n = len.min(src.len());
                dst[..n].copy_from_slice(&src[..n]);
            }
            at += len;
        }
    }

    /// The (first) result's shape.
    pub fn output_shape(&self) -> Vec<usize> {
        kernel_shape(&self.output)
    }
}

/// A type's dims as the kernels take them.
fn kernel_dims(t: &TensorType) -> impl Iterator<Item = usize> + '_ {
    t.shape.iter().map(|&d| d.max(0) as usize)
}

/// A type's shape as the kernels take it.
fn kernel_shape(t: &TensorType) -> Vec<usize> {
    kernel_dims(t).collect()
}

/// The binding's default kernel for `op`.
fn default_choice(op: Op) -> KernelChoice {
    mslc_kernels::binding::choose_kernel(op)
}

/// A small seeded generator (xorshift64*) for tuning inputs and the search's random choices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; zero is remapped, as xorshift cannot leave it).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform in [0, n) (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Listing a model's signatures seeds no inputs (re-tuning a known model measures nothing,
    /// so it must not fill a 30522×768 embedding table either); the first read seeds them, the
    /// same values for a clone listed apart.
    #[test]
    fn inputs_are_seeded_when_first_read() {
        let f16 = |shape: Vec<i64>| TensorType::new(DType::F16, shape);
        let case = || {
            Case::new(
                "mul(f16[4096,1024], f16[4096,1024])".into(),
                Op::Mul,
                Attrs::new(),
                vec![f16(vec![4096, 1024]), f16(vec![4096, 1024])],
                f16(vec![4096, 1024]),
                0,
            )
        };
        let (listed, other) = (case(), case());
        assert!(listed.seeded.get().is_none());
        let views = listed.views();
        assert!(listed.seeded.get().is_some());
        assert_eq!(views[0].data.len(), 4096 * 1024);
        assert_eq!(views[1].data, other.views()[1].data);
    }
}
