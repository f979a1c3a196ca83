//! What a prepared step needs besides its operands and output: how each operand reaches the
//! kernel (viewed in place, converted to f32 in a staging buffer, read as integers), the
//! staging buffers that implies, and the per-thread scratch its kernel asks for.

use mslc_core::ops::{DType, TensorType};

use super::prepare::StepKernel;
use crate::attention_grad::split_parts_len;
use crate::conv::patches::chunk_shape;
use crate::conv_grad::conv2d_grad_scratch;
use crate::matmul::kernel::{MAX_MR, MAX_NR};
use crate::matmul::RightForm;
use crate::norm_grad::norm_affine_grad_scratch;
use crate::reduce::square_sum_scratch;
use crate::rows::LANES;
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
    /// A `[V, H]` table of which only the rows the step's integer input names are converted
    /// to f32, in their places in a staging buffer (`embedding`'s, [`StepKernel::gathers_rows`]):
    /// the integer input comes first, so its ids are staged when the table is.
    ConvertRows,
    /// Copied to a staging buffer first, because the output overwrites it.
    CopyAliased,
    /// Already in the output slice (the kernel works in place).
    InPlace,
    /// Copied into the output slice, where the kernel then works in place (`adam_update`'s p
    /// when its m and v are updated in their own buffers but p's result has a place of its
    /// own: an optimizer-sharded slice).
    CopyIn,
    /// Read as integers into the integer staging buffer.
    Ints,
}

impl OperandMode {
    /// How operand `j` (of `dtype`; `aliased` when the output overwrites it) reaches `kernel`,
    /// whose output is written straight into its buffer when `out_direct` (an f32 output). A
    /// kernel works in place over its operand 0 only; any other is copied.
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
            if kernel.works_in_place() && j == 0 {
                OperandMode::InPlace
            } else {
                OperandMode::CopyAliased
            }
        } else if is_f32 {
            OperandMode::Direct
        } else if j == 1 && kernel.gathers_rows() {
            OperandMode::ConvertRows
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
            OperandMode::Convert | OperandMode::ConvertRows | OperandMode::CopyAliased => {
                if self.inputs.len() <= j {
                    self.inputs.resize(j + 1, 0);
                }
                self.inputs[j] = self.inputs[j].max(numel.saturating_mul(4));
            }
            OperandMode::Direct | OperandMode::InPlace | OperandMode::CopyIn => {}
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

/// An upper bound on the largest scratch (in f32) one step's kernel asks for at once (kernels
/// nest requests, each at most this, their sum too): the packed operands of a GEMM, a fused
/// program's registers, an attention's tiles (and the GEMMs on them), a reduction's moved
/// input, a softmax's strided row, a cross-entropy's losses or row, im2col patches; a right
/// operand the executor keeps packed (`packed_ahead`: a weight) is not packed again. Every pool
/// thread gets [`SCRATCH_BUFFERS`] buffers this large (at most what the scratch pool keeps) at
/// setup, so no kernel allocates scratch while running unless it asks for more than the pool
/// keeps (`scratch::largest_request` checks it): [`scratch_bytes_per_thread`] and
/// [`scratch_bytes_while_running`] count the two.
pub fn scratch_floats(
    kernel: &StepKernel,
    inputs: &[TensorType],
    output: &TensorType,
    packed_ahead: bool,
) -> usize {
    let dim = |t: &TensorType, i: usize| t.shape.get(i).map_or(0, |&d| d.max(0) as usize);
    let input = |j: usize| inputs.get(j).map_or(0, numel);
    let floats = match kernel {
        // What the GEMM's path packs: B's panels (or its edge) with few rows, A and B
        // otherwise, a right operand packed ahead not again.
        StepKernel::Matmul {
            plan,
            params,
            half_b,
            ..
        } => {
            let form = match (packed_ahead, half_b) {
                (false, _) => RightForm::Raw,
                (true, None) => RightForm::PackedF32,
                (true, Some(_)) => RightForm::PackedHalf,
            };
            // A kernel no ISA of this machine runs was refused when the step was prepared.
            plan.scratch_floats(params, form).unwrap_or(0)
        }
        StepKernel::Fused(program, p) | StepKernel::Binary(_, Some(program), p) => {
            (program.instrs.len() + 1).saturating_mul(p.block)
        }
        // The gradient's row sums of every query (and its split groups' parts), and inside
        // them one thread's tile or task and a GEMM over a pair of tiles.
        StepKernel::Attention { params, .. }
        | StepKernel::AttentionLse { params, .. }
        | StepKernel::AttentionGrad { params, .. } => {
            let (q, k) = (&inputs[0], &inputs[1]);
            let (s, t, d) = (dim(q, 1), dim(k, 1), dim(q, 3));
            let (bq, bk) = (params.block_q, params.block_k);
            // A tile's (or a head's width's) side, padded to micro-tiles: a product over a
            // pair of tiles packs both operands at most this square.
            let side = bq.max(bk).max(d).saturating_add(MAX_MR.max(MAX_NR));
            let product = side.saturating_mul(side).saturating_mul(2);
            // A forward tile: its packed queries, its scores, accumulators and statistics.
            let tile = side.saturating_mul(d).saturating_add(
                (bk.saturating_add(4 + LANES))
                    .saturating_mul(bq)
                    .saturating_add(bq.saturating_mul(d)),
            );
            // A gradient task: its kv head's dk and dv, a query head's dq, one pair of tiles'
            // weights and score gradients, a key tile packed twice.
            let task = (t.saturating_mul(2).saturating_add(s))
                .saturating_mul(d)
                .saturating_add(bq.saturating_mul(bk).saturating_mul(2))
                .saturating_add(side.saturating_mul(d).saturating_mul(2));
            let rows = dim(q, 0).saturating_mul(s).saturating_mul(dim(q, 2));
            // The gradient's dk and dv parts of split query-head groups, beside the rows.
            let parts = match kernel {
                StepKernel::AttentionGrad { .. } => {
                    split_parts_len(dim(q, 0), dim(q, 2), dim(k, 2), t, d)
                }
                _ => 0,
            };
            (rows.saturating_add(parts))
                .saturating_add(tile.max(task))
                .saturating_add(product)
        }
        StepKernel::Reduce(..) => input(0),
        StepKernel::Softmax(axis, ..) => {
            let rank = inputs[0].rank() as i64;
            let axis = if *axis < 0 { axis + rank } else { *axis }.clamp(0, rank) as usize;
            let inner: usize = inputs[0].shape[(axis + 1).min(inputs[0].rank())..]
                .iter()
                .map(|&d| d.max(0) as usize)
                .product();
            2 * inner
        }
        StepKernel::Rope(..) => dim(&inputs[0], 1) * dim(&inputs[0], 3),
        StepKernel::SquareSum(..) => square_sum_scratch(input(0)),
        StepKernel::NormAffineGrad(..) => {
            let d = dim(&inputs[0], inputs[0].rank().saturating_sub(1));
            norm_affine_grad_scratch(input(0).checked_div(d).unwrap_or(0), d)
        }
        StepKernel::CrossEntropy(..) | StepKernel::CrossEntropyGrad(..) => {
            let v = dim(&inputs[0], inputs[0].rank().saturating_sub(1));
            input(0).checked_div(v).unwrap_or(0).max(v)
        }
        // im2col: every output position of a chunk of images (or of one image's positions)
        // gets C·kh·kw values; the GEMM over them packs the patches (and the weights, when not
        // packed ahead), padded to micro-tiles; with the weights on the right, its result is
        // turned into the output.
        StepKernel::Conv2d {
            attrs,
            params,
            plane,
            ..
        } => {
            let kdim: usize = inputs.get(1).map_or(0, |w| {
                w.shape.iter().skip(1).map(|&d| d.max(0) as usize).product()
            });
            let n = dim(output, 0);
            let per_position = kdim.saturating_mul(attrs.groups);
            let (images, positions) = chunk_shape(n, *plane, per_position);
            let patches = images
                .saturating_mul(positions)
                .saturating_mul(per_position);
            let problems = n.saturating_mul(attrs.groups) + attrs.groups;
            let pad = MAX_MR
                .max(MAX_NR)
                .saturating_mul(kdim)
                .saturating_mul(problems);
            let weights = if packed_ahead { 0 } else { input(1) };
            let turned = match crate::conv::weights_right(*plane, params) {
                true => output.checked_numel().map_or(usize::MAX, |n| n as usize),
                false => 0,
            };
            patches
                .saturating_add(weights)
                .saturating_add(pad)
                .saturating_add(turned)
                + 16
        }
        StepKernel::Conv2dGradInput(attrs, ..) | StepKernel::Conv2dGradWeight(attrs, ..) => {
            let shape = |t: &TensorType| -> Vec<usize> {
                t.shape.iter().map(|&d| d.max(0) as usize).collect()
            };
            let weight = matches!(kernel, StepKernel::Conv2dGradWeight(..));
            let (w, dy) = match weight {
                true => (output, &inputs[1]),
                false => (&inputs[1], &inputs[0]),
            };
            conv2d_grad_scratch(weight, &shape(w), &shape(dy), attrs.groups)
        }
        StepKernel::Collective(c) => {
            let shape: Vec<usize> = inputs
                .first()
                .map(|t| t.shape.iter().map(|&d| d.max(0) as usize).collect())
                .unwrap_or_default();
            match c.reorder_floats(&shape) {
                0 => return 0,
                n => n,
            }
        }
        // The others (elementwise without a program, norms, embeddings, pooling, copies, rope
        // from its table, the optimizer update) take none, so a module of only those (an
        // optimizer step) reserves none per thread.
        _ => return 0,
    };
    floats.saturating_add(1 << 16)
}

/// Bytes of the scratch buffers each pool thread keeps for a module whose largest step asks
/// for `floats` ([`scratch_floats`]): [`SCRATCH_BUFFERS`] of them, each at most what the pool
/// keeps ([`KEEP_LIMIT`]).
pub fn scratch_bytes_per_thread(floats: usize) -> u64 {
    (floats.min(KEEP_LIMIT) as u64).saturating_mul(4 * SCRATCH_BUFFERS as u64)
}

/// Bytes a step asking for more scratch than a kept buffer holds allocates while it runs,
/// beside the kept buffers: its whole request, once (steps run one at a time, and their large
/// requests are made by the thread running the step: a GEMM's packed operands, a
/// convolution's patches); 0 where every request fits a kept buffer.
pub fn scratch_bytes_while_running(floats: usize) -> u64 {
    match floats > KEEP_LIMIT {
        true => (floats as u64).saturating_mul(4),
        false => 0,
    }
}
