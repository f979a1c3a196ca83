//! What a prepared step needs besides its operands and output: how each operand reaches the
//! kernel (viewed in place, converted to f32 in a staging buffer, read as integers), the
//! staging buffers that implies, and the per-thread scratch its kernel asks for.

use mslc_core::ops::{DType, TensorType};

use super::prepare::StepKernel;
use crate::scratch::KEEP_LIMIT;

/// Scratch buffers each pool thread gets at setup (kernels nest up to this many).
pub const SCRATCH_BUFFERS: usize = 3;

/// How one step operand reaches its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandMode {
    /// Its stored f32 bytes, viewed in place.
    Direct,
    /// Converted to f32 in a staging buffer.
    Convert,
    /// Copied to a staging buffer first, because the output overwrites it.
    CopyAliased,
    /// Already in the output slice (the kernel works in place).
    InPlace,
    /// Read as integers into the integer staging buffer.
    Ints,
}

impl OperandMode {
    /// How operand `j` (of `dtype`; `aliased` when the output overwrites it) reaches `kernel`,
    /// whose output is written straight into its buffer when `out_direct` (an f32 output).
    pub fn of(
        kernel: &StepKernel,
        j: usize,
        dtype: DType,
        aliased: bool,
        out_direct: bool,
    ) -> Self {
        let is_f32 = dtype == DType::F32;
        if kernel.integer_input() == Some(j) {
            OperandMode::Ints
        } else if aliased && is_f32 && out_direct {
            if kernel.works_in_place() {
                OperandMode::InPlace
            } else {
                OperandMode::CopyAliased
            }
        } else if is_f32 {
            OperandMode::Direct
        } else {
            OperandMode::Convert
        }
    }
}

/// Bytes of the staging buffers shared by all steps: per operand position (f32), for integer
/// operands (i64), for outputs stored in another dtype (f32).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Staging {
    /// Per operand position.
    pub inputs: Vec<usize>,
    /// For integer operands.
    pub ints: usize,
    /// For a step's outputs that are not f32, one after another.
    pub out: usize,
}

impl Staging {
    /// Makes room for operand `j` of type `ty` reaching its kernel by `mode`.
    pub fn need(&mut self, mode: OperandMode, j: usize, ty: &TensorType) {
        let numel = numel(ty);
        match mode {
            OperandMode::Ints => self.ints = self.ints.max(numel.saturating_mul(8)),
            OperandMode::Convert | OperandMode::CopyAliased => {
                if self.inputs.len() <= j {
                    self.inputs.resize(j + 1, 0);
                }
                self.inputs[j] = self.inputs[j].max(numel.saturating_mul(4));
            }
            OperandMode::Direct | OperandMode::InPlace => {}
        }
    }

    /// Makes room for one step's outputs that are not stored as f32, side by side.
    pub fn need_outputs<'a>(&mut self, tys: impl IntoIterator<Item = &'a TensorType>) {
        let bytes = tys.into_iter().fold(0usize, |sum, ty| {
            sum.saturating_add(numel(ty).saturating_mul(4))
        });
        self.out = self.out.max(bytes);
    }

    /// All staging bytes.
    pub fn bytes(&self) -> u64 {
        self.inputs
            .iter()
            .chain([&self.ints, &self.out])
            .fold(0u64, |sum, &b| sum.saturating_add(b as u64))
    }
}

/// Elements of a tensor type (0 where they overflow, which validation has ruled out).
fn numel(ty: &TensorType) -> usize {
    ty.checked_numel()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
}

/// An upper bound on the scratch (in f32) one step's kernel asks for: packed GEMM operands,
/// im2col patches, register blocks of fused programs, attention tiles, moved reduction inputs —
/// all within twice the operands plus these terms — capped at what the scratch pool keeps.
/// Every pool thread gets [`SCRATCH_BUFFERS`] buffers this large at setup, so no kernel
/// allocates scratch while running.
pub fn scratch_floats(kernel: &StepKernel, inputs: &[TensorType], output: &TensorType) -> usize {
    // The kernels that take scratch at all (`with_scratch`); the others — elementwise without
    // a fused program, norms, embeddings, pooling, copies, the optimizer update — take none,
    // so a module of only those (an optimizer step) reserves none per thread.
    let takes_scratch = matches!(
        kernel,
        StepKernel::Matmul { .. }
            | StepKernel::Conv2d(..)
            | StepKernel::Fused(..)
            | StepKernel::Binary(_, Some(_), _)
            | StepKernel::Reduce(..)
            | StepKernel::Softmax(..)
            | StepKernel::Rope(..)
            | StepKernel::RopeTable(..)
            | StepKernel::RopeCached(..)
            | StepKernel::Attention { .. }
            | StepKernel::AttentionLse { .. }
            | StepKernel::AttentionGrad { .. }
            | StepKernel::CrossEntropy(..)
            | StepKernel::CrossEntropyGrad(..)
    );
    if !takes_scratch {
        return 0;
    }
    let operands = inputs
        .iter()
        .chain([output])
        .fold(0usize, |sum, t| sum.saturating_add(numel(t)));
    let extra = match kernel {
        StepKernel::Fused(program, p) | StepKernel::Binary(_, Some(program), p) => {
            (program.instrs.len() + 1).saturating_mul(p.block)
        }
        StepKernel::Conv2d(..) => {
            // im2col: every output position of every image gets C/groups·kh·kw values.
            let dim = |t: &TensorType, i: usize| t.shape.get(i).map_or(0, |&d| d as usize);
            let per_position: usize = inputs
                .get(1)
                .map_or(0, |w| w.shape.iter().skip(1).map(|&d| d as usize).product());
            per_position
                .saturating_mul(dim(output, 0))
                .saturating_mul(dim(output, 2))
                .saturating_mul(dim(output, 3))
        }
        _ => 0,
    };
    operands
        .saturating_mul(2)
        .saturating_add(extra)
        .saturating_add(1 << 16)
        .min(KEEP_LIMIT)
}

/// Bytes of scratch each pool thread holds for a module whose largest step asks for `floats`.
pub fn scratch_bytes_per_thread(floats: usize) -> u64 {
    (floats as u64) * 4 * SCRATCH_BUFFERS as u64
}
