//! Turning one scheduled step into a ready-to-call kernel: attributes resolved and converted to
//! the kernels' argument types, tunable parameters read from the step's [`KernelChoice`], once,
//! at setup, so the run loop only dispatches.

use crate::attention::AttentionParams;
use crate::binding::{decode_params, KernelChoice, KernelKind};
use crate::conv::{conv2d_half_weight, Conv2dAttrs};
use crate::elementwise::{BinaryOp, CastTarget, ElementwiseParams, Instr, Program, UnaryOp};
use crate::matmul::{half_panels, GemmPlan, HalfType, MatmulParams};
use crate::par::RowParams;
use crate::pool::{Pool2dAttrs, PoolKind};
use crate::reduce::ReduceOp;
use crate::reference::CrossEntropyAttrs;
use crate::transpose::TransposeParams;
use crate::Activation;
use mslc_core::ops::family::conv::{pool_window, Conv2dGeometry, Window};
use mslc_core::ops::family::fused::FusedMatmulOperands;
use mslc_core::ops::family::nn::AttentionDims;
use mslc_core::ops::family::program::{ElementwiseProgram, Operand};
use mslc_core::ops::family::reduce::reduced_axes;
use mslc_core::ops::{resolve_attrs, Attrs, DType, Op, OpError, TensorType};

/// A step's kernel with everything it needs except the operands.
#[derive(Clone, Debug)]
pub enum StepKernel {
    /// Fill with one value.
    Constant(f32),
    /// The values unchanged (`reshape`, inference `dropout`, `cast`, whose rounding the store
    /// into the output's dtype performs).
    Copy,
    /// One-input elementwise op, output shape = input shape.
    Unary(UnaryOp, ElementwiseParams),
    /// Two-input elementwise op; `program` evaluates it with broadcasting when the shapes
    /// differ, `None` when both inputs already have the output's shape.
    Binary(BinaryOp, Option<Program>, ElementwiseParams),
    /// A fused elementwise chain.
    Fused(Program, ElementwiseParams),
    /// `matmul` / `fused_matmul`.
    Matmul {
        /// Batch layout, broadcasting and bias strides, resolved for the step's shapes.
        plan: GemmPlan,
        /// Which inputs after `a` and `b` are a bias and a multiplier.
        operands: FusedMatmulOperands,
        /// Epilogue.
        activation: Activation,
        /// GEMM tiling.
        params: MatmulParams,
        /// The 16-bit format B's panels are kept in when packed ahead
        /// ([`crate::matmul::half_panels`]).
        half_b: Option<HalfType>,
    },
    /// `transpose`.
    Transpose(Vec<i64>, TransposeParams),
    /// `sum` / `mean` / `max`.
    Reduce(ReduceOp, Vec<i64>, bool, RowParams),
    /// `softmax` (false) / `log_softmax` (true) along an axis.
    Softmax(i64, bool, RowParams),
    /// `rms_norm` / `rms_norm_scale` (with a weight input).
    RmsNorm(f64, bool, RowParams),
    /// `layer_norm` / `layer_norm_affine` (with gain and bias inputs).
    LayerNorm(f64, bool, RowParams),
    /// `embedding` (input 0 read as integers).
    Embedding(RowParams),
    /// `rope` with its theta.
    Rope(f64, RowParams),
    /// `rope_table`: theta, positions, head dim.
    RopeTable(f64, usize, usize),
    /// `rope_cached` (input 1 is the table).
    RopeCached(RowParams),
    /// `attention`.
    Attention {
        /// Causal mask.
        causal: bool,
        /// Score scale.
        scale: f64,
        /// Tiles.
        params: AttentionParams,
    },
    /// `conv2d`.
    Conv2d {
        /// Stride, padding, dilation, groups.
        attrs: Conv2dAttrs,
        /// The GEMM's tiling.
        params: MatmulParams,
        /// The weight's shape `[O, C/groups, kh, kw]`, for packing it ahead in the layout the
        /// product takes.
        w_shape: [usize; 4],
        /// Output positions per image (oh·ow), which decide that layout.
        plane: usize,
        /// The 16-bit format the weight's panels are kept in when packed ahead
        /// ([`crate::conv::conv2d_half_weight`]).
        half_w: Option<HalfType>,
    },
    /// `max_pool2d` / `avg_pool2d`.
    Pool(PoolKind, Pool2dAttrs, RowParams),
    /// `adaptive_avg_pool2d`.
    AdaptivePool([usize; 2], RowParams),
    /// `cross_entropy` (input 1 read as integers).
    CrossEntropy(CrossEntropyAttrs, RowParams),
    /// `cross_entropy_grad` (input 1 read as integers, input 2 the loss's cotangent).
    CrossEntropyGrad(CrossEntropyAttrs, RowParams),
    /// `broadcast_to` (reference kernel).
    BroadcastTo,
    /// `concat` along an axis (reference kernel).
    Concat(i64),
    /// `slice` (reference kernel).
    Slice(i64, i64, i64),
    /// `select` (reference kernel).
    Select(i64, i64),
    /// `batch_norm` with its eps.
    BatchNorm(f64, RowParams),
    /// Training-mode `dropout(x, seed)` (input 1 read as the integer seed): `p`, the op's
    /// `salt`, and where `x` sits in a split tensor when it is one rank's block of it.
    Dropout(f64, i64, Option<DropoutBlock>),
    /// `causal_mask` (reference kernel).
    CausalMask(usize),
    /// `mse_loss` (reference kernel).
    MseLoss,
    /// `rms_norm_grad` (true) / `layer_norm_grad` (false) with eps.
    NormGrad(bool, f64, RowParams),
    /// `layer_norm_affine_grad` (true) / `rms_norm_scale_grad` (false) with eps: dx, then the
    /// parameter gradients as outputs 1 (and 2).
    NormAffineGrad(bool, f64, RowParams),
    /// `square_sum`: `Σ x²` over the whole input; `square_sum_finite` (`true`): and the
    /// overflow check `Σ x·0` from the same pass, a second output.
    SquareSum(bool, RowParams),
    /// `embedding_grad` (input 0 read as integers) into a table of this many rows.
    EmbeddingGrad(usize, RowParams),
    /// `attention_lse`: the output and, as output 1, the log-sum-exps.
    AttentionLse {
        /// Causal mask.
        causal: bool,
        /// Score scale.
        scale: f64,
        /// Tiles and thread split.
        params: AttentionParams,
    },
    /// `adam_update` with β1, β2, eps, weight decay and decoupled (its attributes; the step's
    /// scalars are read from inputs 4–6 when it runs): p, and m and v as outputs 1 and 2.
    AdamUpdate([f64; 4], bool, ElementwiseParams),
    /// `sgd_update`: `[momentum, weight_decay]`, nesterov, block size.
    SgdUpdate([f64; 2], bool, ElementwiseParams),
    /// `attention_grad`: dq, and dk and dv as outputs 1 and 2.
    AttentionGrad {
        /// Causal mask.
        causal: bool,
        /// Score scale.
        scale: f64,
        /// Tiles and thread split.
        params: AttentionParams,
    },
    /// `conv2d_grad_input` with the input's spatial size and its GEMM's tiling.
    Conv2dGradInput(Conv2dAttrs, [usize; 2], MatmulParams),
    /// `conv2d_grad_weight` with the kernel's spatial size and its GEMM's tiling.
    Conv2dGradWeight(Conv2dAttrs, [usize; 2], MatmulParams),
    /// `max_pool2d_grad` / `avg_pool2d_grad`.
    PoolGrad(PoolKind, Pool2dAttrs, RowParams),
    /// `adaptive_avg_pool2d_grad`.
    AdaptivePoolGrad([usize; 2], RowParams),
    /// `all_reduce` / `all_gather` / `reduce_scatter` / `rank_slice`: run by the executor
    /// through its collectives, not by a kernel.
    Collective(CollectiveStep),
}

/// A dropout over one rank's block of a split tensor (`dropout {axis, ranks, dim}`): the
/// block's place is the rank's place on mesh axis `axis`, which the executor learns from its
/// collectives ([`StepKernel::place_on`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropoutBlock {
    /// The mesh axis whose group splits the tensor.
    pub axis: String,
    /// The group's size: blocks of the tensor.
    pub ranks: usize,
    /// The dim the tensor is split along.
    pub dim: usize,
    /// This rank's place on `axis`, once known.
    pub index: Option<usize>,
}

/// A collective step as the executor runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveStep {
    /// `all_reduce`, `all_gather`, `reduce_scatter` or `rank_slice`.
    pub op: Op,
    /// The mesh axis whose group it runs over.
    pub axis: String,
    /// The group's size the step was compiled for.
    pub ranks: usize,
    /// The dim gathered, scattered or sliced (0 for `all_reduce`).
    pub dim: usize,
}

/// Collectives of at least this many values per member run in place on the threads backend
/// (an all-reduce's member sums a slice of every member's own buffer; a gather, scatter or
/// all-to-all reads the members' inputs where they are); smaller ones, where a second meeting
/// costs more than the copies, through copies.
pub const IN_PLACE_COLLECTIVE_MIN: usize = 1 << 14;

/// Whether the threads backend runs a collective of `numel` values per member over a group of
/// `ranks` in place, on the members' own buffers, rather than through copies.
pub fn runs_in_place(numel: usize, ranks: usize) -> bool {
    numel >= IN_PLACE_COLLECTIVE_MIN && ranks > 1
}

impl CollectiveStep {
    /// Values of kernel scratch the step reorders its blocks through: a gather or scatter
    /// along a dim with more than one row before it (of input shape `shape`: the gathered
    /// output, `ranks` blocks of the input, or the scattered input) arranges them rank-major.
    pub fn reorder_floats(&self, shape: &[usize]) -> usize {
        let outer: usize = shape.iter().take(self.dim).product();
        let numel: usize = shape.iter().product();
        match self.op {
            Op::AllGather if outer > 1 => numel.saturating_mul(self.ranks),
            Op::ReduceScatter if outer > 1 => numel,
            _ => 0,
        }
    }

    /// Values of this step's contribution (its input, of `numel` values) that the threads
    /// backend copies into its group's exchange, which keeps them for the next rounds: every
    /// contribution but those it reads in place.
    pub fn copied_floats(&self, numel: usize) -> usize {
        match self.op {
            _ if runs_in_place(numel, self.ranks) => 0,
            // A slice of this rank's own input involves no exchange.
            Op::RankSlice => 0,
            _ => numel,
        }
    }
}

impl StepKernel {
    /// Whether the kernel can run with its output in input 0's buffer (the output slice then
    /// already holds input 0).
    pub fn works_in_place(&self) -> bool {
        matches!(
            self,
            StepKernel::Copy | StepKernel::Unary(..) | StepKernel::Binary(_, None, _)
        )
    }

    /// The operands an update in place finds in its outputs and overwrites there, output by
    /// output (`adam_update`'s p, m and v, `sgd_update`'s p and buf, run with
    /// `Operands::in_place`); none for any other kernel.
    pub fn updated_operands(&self) -> &'static [usize] {
        match self {
            StepKernel::AdamUpdate(..) => &[0, 2, 3],
            StepKernel::SgdUpdate(..) => &[0, 2],
            _ => &[],
        }
    }

    /// Tells a step that depends on the rank's place on a mesh axis (a dropout over a block
    /// of a split tensor) that place: `place(axis)`, `None` when the mesh has no such axis.
    pub fn place_on(&mut self, place: &dyn Fn(&str) -> Option<usize>) {
        if let StepKernel::Dropout(_, _, Some(block)) = self {
            block.index = place(&block.axis);
        }
    }

    /// Which inputs the kernel reads as integers (ids, labels).
    pub fn integer_input(&self) -> Option<usize> {
        match self {
            StepKernel::Embedding(_) | StepKernel::EmbeddingGrad(..) => Some(0),
            StepKernel::CrossEntropy(..) | StepKernel::CrossEntropyGrad(..) => Some(1),
            StepKernel::Dropout(..) => Some(1),
            _ => None,
        }
    }

    /// Whether the kernel reads only the rows of input 1 (a `[V, H]` table) that its integer
    /// input names (`embedding`): a table stored in another dtype need only have those rows
    /// converted.
    pub fn gathers_rows(&self) -> bool {
        matches!(self, StepKernel::Embedding(_))
    }
}

/// Prepares a step of `op` with attributes `attrs` on the kernel `k` (bound to the op and
/// parameterised by the kernel table), whose inputs have types `inputs` and whose output has
/// type `output`.
pub fn prepare(
    op: Op,
    attrs: &Attrs,
    k: &KernelChoice,
    inputs: &[TensorType],
    output: &TensorType,
) -> Result<StepKernel, String> {
    KernelKind::bound(op, &k.name)?;
    let a = resolve_attrs(op, attrs).map_err(|e| e.message)?;
    let err = |e: OpError| e.message;
    let usize_of = |v: i64, what: &str| {
        usize::try_from(v).map_err(|_| format!("`{what}` must be non-negative, got {v}"))
    };
    if let Some(u) = op.unary() {
        return Ok(StepKernel::Unary(u, decode_params(k)?));
    }
    if let Some(b) = op.binary() {
        let same = inputs.iter().all(|t| t.shape == output.shape);
        let program = (!same).then(|| Program {
            instrs: vec![
                Instr::Input(0),
                Instr::Input(1),
                Instr::Binary { op: b, a: 0, b: 1 },
            ],
        });
        return Ok(StepKernel::Binary(b, program, decode_params(k)?));
    }
    Ok(match op {
        Op::Constant => StepKernel::Constant(a.float("value").map_err(err)? as f32),
        // A cast is a copy here: storing into the output's dtype rounds (floats, to nearest
        // even), truncates with saturation (ints) or tests for non-zero (bool) exactly as the
        // cast does.
        Op::Dropout if inputs.len() == 2 => {
            let block = match (
                a.opt_str("axis").map_err(err)?,
                a.opt_int("ranks").map_err(err)?,
            ) {
                (Some(axis), Some(ranks)) => Some(DropoutBlock {
                    axis,
                    ranks: usize_of(ranks, "ranks")?,
                    dim: mslc_core::ops::normalize_axis(
                        a.int("dim").map_err(err)?,
                        inputs[0].rank(),
                    )?,
                    index: None,
                }),
                _ => None,
            };
            StepKernel::Dropout(
                a.float("p").map_err(err)?,
                a.opt_int("salt").map_err(err)?.unwrap_or(0),
                block,
            )
        }
        Op::Reshape | Op::Dropout | Op::Cast | Op::ParallelCopy => StepKernel::Copy,
        Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::RankSlice => {
            let dim = match op {
                Op::AllReduce => 0,
                _ => mslc_core::ops::normalize_axis(a.int("dim").map_err(err)?, inputs[0].rank())?,
            };
            StepKernel::Collective(CollectiveStep {
                op,
                axis: a.str("axis").map_err(err)?,
                ranks: usize_of(a.int("ranks").map_err(err)?, "ranks")?,
                dim,
            })
        }
        Op::FusedElementwise => {
            let text = a.str("program").map_err(err)?;
            let program = ElementwiseProgram::parse(&text).map_err(err)?;
            StepKernel::Fused(lower_program(&program, inputs)?, decode_params(k)?)
        }
        Op::Matmul | Op::FusedMatmul => {
            let activation = Activation::of(&a).map_err(err)?;
            let operands = FusedMatmulOperands::of(&a);
            if inputs.len() != operands.count() {
                return Err(format!(
                    "{}: {} inputs where its attributes ask for {}",
                    op.name(),
                    inputs.len(),
                    operands.count()
                ));
            }
            let dims =
                |i: usize| -> Vec<usize> { inputs[i].shape.iter().map(|&d| d as usize).collect() };
            let bias_shape = operands.bias_index().map(dims);
            let plan = GemmPlan::new(
                &dims(0),
                &dims(1),
                bias_shape.as_deref(),
                a.bool("transpose_a").map_err(err)?,
                a.bool("transpose_b").map_err(err)?,
            )
            .map_err(|e| e.to_string())?;
            let params: MatmulParams = decode_params(k)?;
            let half_b = half_panels(plan.rows(), inputs[1].dtype, &params);
            StepKernel::Matmul {
                plan,
                operands,
                activation,
                params,
                half_b,
            }
        }
        Op::Transpose => StepKernel::Transpose(a.ints("perm").map_err(err)?, decode_params(k)?),
        Op::Sum | Op::Mean | Op::Max => {
            let rop = match op {
                Op::Sum => ReduceOp::Sum,
                Op::Mean => ReduceOp::Mean,
                _ => ReduceOp::Max,
            };
            let axes = reduced_axes(&a, inputs[0].rank()).map_err(err)?;
            let axes = axes.into_iter().map(|x| x as i64).collect();
            StepKernel::Reduce(
                rop,
                axes,
                a.bool("keepdim").map_err(err)?,
                decode_params(k)?,
            )
        }
        Op::Softmax | Op::LogSoftmax => StepKernel::Softmax(
            a.int("axis").map_err(err)?,
            op == Op::LogSoftmax,
            decode_params(k)?,
        ),
        Op::RmsNorm | Op::RmsNormScale => StepKernel::RmsNorm(
            a.float("eps").map_err(err)?,
            op == Op::RmsNormScale,
            decode_params(k)?,
        ),
        Op::LayerNorm | Op::LayerNormAffine => StepKernel::LayerNorm(
            a.float("eps").map_err(err)?,
            op == Op::LayerNormAffine,
            decode_params(k)?,
        ),
        Op::Embedding => StepKernel::Embedding(decode_params(k)?),
        Op::Rope => StepKernel::Rope(a.float("theta").map_err(err)?, decode_params(k)?),
        Op::RopeTable => StepKernel::RopeTable(
            a.float("theta").map_err(err)?,
            usize_of(a.int("positions").map_err(err)?, "positions")?,
            usize_of(a.int("dim").map_err(err)?, "dim")?,
        ),
        Op::RopeCached => StepKernel::RopeCached(decode_params(k)?),
        Op::Attention => {
            let dims = AttentionDims::of(&inputs[0], &inputs[1], &inputs[2], &a).map_err(err)?;
            StepKernel::Attention {
                causal: dims.causal,
                scale: dims.scale,
                params: decode_params(k)?,
            }
        }
        Op::Conv2d => {
            let g = Conv2dGeometry::of(&inputs[0], &inputs[1], &a).map_err(err)?;
            let w_shape: [usize; 4] = inputs[1]
                .shape
                .iter()
                .map(|&d| usize_of(d, "weight dim"))
                .collect::<Result<Vec<_>, _>>()?
                .try_into()
                .map_err(|_| "conv2d weights must be [O, C/groups, kh, kw]".to_string())?;
            let plane = (g.window.out.iter())
                .map(|&d| usize_of(d, "output size"))
                .product::<Result<usize, _>>()?;
            let params: MatmulParams = decode_params(k)?;
            let half_w = conv2d_half_weight(plane, inputs[1].dtype, &params);
            StepKernel::Conv2d {
                attrs: conv_attrs(&g.window, g.groups)?,
                params,
                w_shape,
                plane,
                half_w,
            }
        }
        Op::Conv2dGradInput | Op::Conv2dGradWeight => {
            let (x, w) = if op == Op::Conv2dGradInput {
                (output.clone(), inputs[1].clone())
            } else {
                (inputs[0].clone(), output.clone())
            };
            let g = Conv2dGeometry::of(&x, &w, &a).map_err(err)?;
            let attrs = conv_attrs(&g.window, g.groups)?;
            let p = decode_params(k)?;
            if op == Op::Conv2dGradInput {
                StepKernel::Conv2dGradInput(attrs, pair_of(&x.shape[2..], "size")?, p)
            } else {
                StepKernel::Conv2dGradWeight(attrs, pair_of(&w.shape[2..], "kernel")?, p)
            }
        }
        Op::MaxPool2d | Op::AvgPool2d | Op::MaxPool2dGrad | Op::AvgPool2dGrad => {
            let w = pool_window(&inputs[0], &a).map_err(err)?;
            let attrs = Pool2dAttrs {
                kernel: pair_of(&w.kernel, "kernel")?,
                stride: pair_of(&w.stride, "stride")?,
                padding: pair_of(&w.padding, "padding")?,
            };
            let kind = if matches!(op, Op::MaxPool2d | Op::MaxPool2dGrad) {
                PoolKind::Max
            } else {
                PoolKind::Avg
            };
            if matches!(op, Op::MaxPool2d | Op::AvgPool2d) {
                StepKernel::Pool(kind, attrs, decode_params(k)?)
            } else {
                StepKernel::PoolGrad(kind, attrs, decode_params(k)?)
            }
        }
        Op::AdaptiveAvgPool2d | Op::AdaptiveAvgPool2dGrad => {
            let size = pair_of(&a.ints("output").map_err(err)?, "output")?;
            if op == Op::AdaptiveAvgPool2d {
                StepKernel::AdaptivePool(size, decode_params(k)?)
            } else {
                StepKernel::AdaptivePoolGrad(size, decode_params(k)?)
            }
        }
        Op::CrossEntropy | Op::CrossEntropyGrad => {
            let attrs = CrossEntropyAttrs {
                ignore_index: a.int("ignore_index").map_err(err)?,
                label_smoothing: a.float("label_smoothing").map_err(err)?,
            };
            if op == Op::CrossEntropy {
                StepKernel::CrossEntropy(attrs, decode_params(k)?)
            } else {
                StepKernel::CrossEntropyGrad(attrs, decode_params(k)?)
            }
        }
        Op::BroadcastTo => StepKernel::BroadcastTo,
        Op::Concat => StepKernel::Concat(a.int("axis").map_err(err)?),
        Op::Slice => StepKernel::Slice(
            a.int("axis").map_err(err)?,
            a.int("start").map_err(err)?,
            a.int("end").map_err(err)?,
        ),
        Op::Select => StepKernel::Select(a.int("axis").map_err(err)?, a.int("index").map_err(err)?),
        Op::BatchNorm => StepKernel::BatchNorm(a.float("eps").map_err(err)?, decode_params(k)?),
        Op::CausalMask => StepKernel::CausalMask(usize_of(a.int("size").map_err(err)?, "size")?),
        Op::MseLoss => StepKernel::MseLoss,
        Op::RmsNormGrad | Op::LayerNormGrad => StepKernel::NormGrad(
            op == Op::RmsNormGrad,
            a.float("eps").map_err(err)?,
            decode_params(k)?,
        ),
        Op::SquareSum | Op::SquareSumFinite => {
            StepKernel::SquareSum(op == Op::SquareSumFinite, decode_params(k)?)
        }
        Op::RmsNormScaleGrad | Op::LayerNormAffineGrad => StepKernel::NormAffineGrad(
            op == Op::LayerNormAffineGrad,
            a.float("eps").map_err(err)?,
            decode_params(k)?,
        ),
        Op::EmbeddingGrad => StepKernel::EmbeddingGrad(
            usize_of(a.int("vocab").map_err(err)?, "vocab")?,
            decode_params(k)?,
        ),
        Op::AdamUpdate => StepKernel::AdamUpdate(
            ["beta1", "beta2", "eps", "weight_decay"]
                .map(|name| a.float(name))
                .into_iter()
                .collect::<Result<Vec<f64>, _>>()
                .map_err(err)?
                .try_into()
                .map_err(|_| "four attributes".to_string())?,
            a.bool("decoupled").map_err(err)?,
            decode_params(k)?,
        ),
        Op::SgdUpdate => StepKernel::SgdUpdate(
            [
                a.float("momentum").map_err(err)?,
                a.float("weight_decay").map_err(err)?,
            ],
            a.bool("nesterov").map_err(err)?,
            decode_params(k)?,
        ),
        Op::AttentionLse | Op::AttentionGrad => {
            let dims = AttentionDims::of(&inputs[0], &inputs[1], &inputs[2], &a).map_err(err)?;
            let params = decode_params(k)?;
            if op == Op::AttentionLse {
                StepKernel::AttentionLse {
                    causal: dims.causal,
                    scale: dims.scale,
                    params,
                }
            } else {
                StepKernel::AttentionGrad {
                    causal: dims.causal,
                    scale: dims.scale,
                    params,
                }
            }
        }
        _ => return Err(format!("the executor has no kernel for `{op}`")),
    })
}

/// A (height, width) pair of non-negative sizes as `usize`.
fn pair_of(p: &[i64], what: &str) -> Result<[usize; 2], String> {
    let one =
        |v: i64| usize::try_from(v).map_err(|_| format!("`{what}` must be non-negative, got {v}"));
    match *p {
        [h, w] => Ok([one(h)?, one(w)?]),
        _ => Err(format!("`{what}` must have two sizes, got {p:?}")),
    }
}

/// The kernels' form of a checked convolution window.
fn conv_attrs(w: &Window, groups: i64) -> Result<Conv2dAttrs, String> {
    Ok(Conv2dAttrs {
        stride: pair_of(&w.stride, "stride")?,
        padding: pair_of(&w.padding, "padding")?,
        dilation: pair_of(&w.dilation, "dilation")?,
        groups: usize::try_from(groups).map_err(|_| format!("bad `groups` {groups}"))?,
    })
}

/// The rounding a cast to `dtype` applies to an f32 value (what storing it in `dtype` does).
pub fn cast_target(dtype: DType) -> CastTarget {
    match dtype {
        DType::F64 => CastTarget::F64,
        DType::F32 => CastTarget::F32,
        DType::F16 => CastTarget::F16,
        DType::BF16 => CastTarget::Bf16,
        DType::I64 => CastTarget::I64,
        DType::I32 => CastTarget::I32,
        DType::Bool => CastTarget::Bool,
    }
}

/// Translates a registry program (`silu(x0); mul(t0, x1)`) into the kernels' register form:
/// one register per input first, then one per step. Each step's result is rounded to its
/// dtype when that is narrower than f32, as storing it would.
fn lower_program(program: &ElementwiseProgram, inputs: &[TensorType]) -> Result<Program, String> {
    let types = program.step_types(inputs).map_err(|e| e.message)?;
    let mut instrs: Vec<Instr> = (0..inputs.len()).map(Instr::Input).collect();
    let mut step_reg = Vec::with_capacity(program.steps.len());
    for (step, ty) in program.steps.iter().zip(&types) {
        let reg = |o: &Operand| match *o {
            Operand::Input(n) => n,
            Operand::Step(n) => step_reg[n],
        };
        let instr = if let Some(u) = step.op.unary() {
            Instr::Unary {
                op: u,
                x: reg(&step.args[0]),
            }
        } else if let Some(b) = step.op.binary() {
            Instr::Binary {
                op: b,
                a: reg(&step.args[0]),
                b: reg(&step.args[1]),
            }
        } else if step.op == Op::Cast {
            Instr::Cast {
                to: cast_target(ty.dtype),
                x: reg(&step.args[0]),
            }
        } else {
            return Err(format!("`{}` cannot run inside a fused program", step.op));
        };
        instrs.push(instr);
        if matches!(ty.dtype, DType::F16 | DType::BF16) && step.op != Op::Cast {
            let x = instrs.len() - 1;
            instrs.push(Instr::Cast {
                to: cast_target(ty.dtype),
                x,
            });
        }
        step_reg.push(instrs.len() - 1);
    }
    Ok(Program { instrs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::choose_kernel;

    /// A `fused_matmul` whose inputs are not the ones its `has_bias` and `has_multiplier` ask
    /// for (a damaged artifact) is refused with both counts, not read out of bounds.
    #[test]
    fn a_fused_matmul_with_operands_its_attributes_do_not_ask_for_is_refused() {
        let f32s = |shape: &[i64]| TensorType::new(DType::F32, shape.to_vec());
        let attrs = Attrs::new().with("has_multiplier", true);
        let choice = choose_kernel(Op::FusedMatmul);
        let two = [f32s(&[4, 8]), f32s(&[8, 5])];
        let Err(e) = prepare(Op::FusedMatmul, &attrs, &choice, &two, &f32s(&[4, 5])) else {
            panic!("two inputs where three are asked for were accepted");
        };
        assert_eq!(e, "fused_matmul: 2 inputs where its attributes ask for 3");
        let three = [f32s(&[4, 8]), f32s(&[8, 5]), f32s(&[4, 5])];
        assert!(prepare(Op::FusedMatmul, &attrs, &choice, &three, &f32s(&[4, 5])).is_ok());
    }

    /// A weight stored in f16 or bf16 and read by a product of few rows keeps 16-bit panels
    /// (half the packed region); one of more rows than `half_b_rows`, or stored in f32, keeps
    /// f32 panels. An embedding's table stored in f16 has only its rows converted.
    #[test]
    fn weights_stored_in_16_bits_keep_16_bit_panels_where_rows_are_few() {
        use super::super::needs::OperandMode;
        use crate::matmul::HalfType;
        let ty = |dtype, shape: &[i64]| TensorType::new(dtype, shape.to_vec());
        let matmul = |rows: i64, dtype| {
            let inputs = [ty(DType::F32, &[rows, 64]), ty(dtype, &[64, 96])];
            let choice = choose_kernel(Op::Matmul);
            let out = ty(DType::F32, &[rows, 96]);
            prepare(Op::Matmul, &Attrs::new(), &choice, &inputs, &out).unwrap()
        };
        let half = |k: &StepKernel| match k {
            StepKernel::Matmul { half_b, .. } => *half_b,
            _ => unreachable!("a matmul"),
        };
        // The most rows the unpacked-A path takes with B packed ahead (4,096 on AVX-512, 8 on
        // AVX2), at most `half_b_rows`.
        let p = MatmulParams::default();
        let rows = p.half_b_rows.min(p.small_m.max(p.small_m_packed_b)) as i64;
        assert_eq!(half(&matmul(1, DType::F16)), Some(HalfType::F16));
        assert_eq!(half(&matmul(rows, DType::BF16)), Some(HalfType::Bf16));
        assert_eq!(half(&matmul(rows + 1, DType::F16)), None);
        assert_eq!(half(&matmul(1, DType::F32)), None);
        let len = |k: StepKernel| k.packed_b_len().unwrap().unwrap();
        assert_eq!(2 * len(matmul(1, DType::F16)), len(matmul(1, DType::F32)));
        let table = |dtype| {
            let inputs = [ty(DType::I64, &[1, 4]), ty(dtype, &[100, 16])];
            let choice = choose_kernel(Op::Embedding);
            let out = ty(DType::F32, &[1, 4, 16]);
            let kernel = prepare(Op::Embedding, &Attrs::new(), &choice, &inputs, &out).unwrap();
            OperandMode::of(&kernel, 1, dtype, false, true)
        };
        assert_eq!(table(DType::F16), OperandMode::ConvertRows);
        assert_eq!(table(DType::F32), OperandMode::Direct);
    }
}
