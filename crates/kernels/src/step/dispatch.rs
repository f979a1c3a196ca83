//! Calling a prepared kernel on one step's operands: f32 views of the inputs, the integer
//! input where the op reads one, and the output slice.

use crate::elementwise::slice::{binary_in_place, binary_into, unary_in_place, unary_into};
use crate::elementwise::{fused_elementwise, ElementwiseParams};
use crate::matmul::{halves_mut, panels_in, region_floats, Epilogue, HalfType, PackedB};
use crate::par::for_each_chunk_mut;
use crate::shape::check_len;
use crate::{
    attention, attention_grad, conv, conv_grad, embedding, embedding_grad, loss, norm, norm_grad,
    optimizer, pool, pool_grad, reduce, reference, rope, softmax, transpose, KernelError,
    KernelResult, Tensor, TensorRef,
};

use super::prepare::StepKernel;

/// The most outputs one step writes (`attention_grad`'s dq, dk and dv; `adam_update`'s p, m
/// and v).
pub const MAX_OUTPUTS: usize = 3;

/// One step's operands.
pub struct Operands<'a> {
    /// The inputs as f32. When `in_place` is set, input 0's data is empty: its values are in
    /// `out` (and for `adam_update`, m's and v's are in `more_outs` too). An integer input's
    /// data is empty too: its values are in `ints`.
    pub inputs: &'a [TensorRef<'a>],
    /// The integer input's values (ids, labels), when the kernel reads one.
    pub ints: &'a [i64],
    /// Where the result goes.
    pub out: &'a mut [f32],
    /// The output's shape.
    pub out_shape: &'a [usize],
    /// `out` already holds input 0 (the result overwrites its operand; `adam_update`'s
    /// other outputs then hold m and v).
    pub in_place: bool,
    /// Where outputs 1, 2, … of a multi-output op go (`attention_lse`'s log-sum-exps,
    /// `attention_grad`'s dk and dv), in order; all `None` for every other op. (An array,
    /// not a `Vec`: a warm step allocates nothing.)
    pub more_outs: [Option<&'a mut [f32]>; MAX_OUTPUTS - 1],
}

/// The error for packing, or reading packed, the weight of a kernel that takes none so.
fn not_packed() -> KernelError {
    KernelError::new(
        "pack",
        "only a matmul or a conv2d reads its weight packed ahead",
    )
}

impl StepKernel {
    /// Runs the kernel on `io`.
    pub fn run(&self, io: Operands<'_>) -> KernelResult<()> {
        self.run_with_packed_b(io, None)
    }

    /// Floats of input 1 packed ahead for a kernel that can read it so ([`StepKernel::pack_b`]),
    /// `None` for other kernels.
    pub fn packed_b_len(&self) -> Option<KernelResult<usize>> {
        self.packed_values()
            .map(|r| r.map(|(values, half)| region_floats(values, half)))
    }

    /// Values of input 1 packed ahead, and the 16-bit format they are kept in (two per float
    /// of the region) if any, for a kernel that reads it so.
    fn packed_values(&self) -> Option<KernelResult<(usize, Option<HalfType>)>> {
        match self {
            StepKernel::Matmul {
                plan,
                params,
                half_b,
                ..
            } => Some(plan.packed_b_values(params).map(|v| (v, *half_b))),
            StepKernel::Conv2d {
                attrs,
                params,
                w_shape,
                plane,
                half_w,
            } => Some(
                conv::conv2d_packed_weight_len(w_shape, attrs.groups, *plane, params)
                    .map(|v| (v, *half_w)),
            ),
            _ => None,
        }
    }

    /// Whether the kernel, given input 1 packed ahead, reads input 1 itself too (a conv2d whose
    /// weights the small-m GEMM multiplies unpacked): where it does not, the executor need not
    /// convert a weight stored in another dtype on every run.
    pub fn reads_packed_b(&self) -> bool {
        match self {
            StepKernel::Conv2d {
                attrs,
                params,
                w_shape,
                plane,
                ..
            } => conv::conv2d_reads_packed_weight(w_shape, attrs.groups, *plane, params),
            _ => false,
        }
    }

    /// Packs input 1 `b` into `dst` ([`StepKernel::packed_b_len`] floats) for
    /// [`StepKernel::run_with_packed_b`]: done once for a weight that does not change.
    pub fn pack_b(&self, b: &[f32], dst: &mut [f32]) -> KernelResult<()> {
        let (values, half) = self.packed_values().ok_or_else(not_packed)??;
        check_len(
            "pack",
            "packed region",
            dst.len(),
            &[region_floats(values, half)],
        )?;
        match (self, half) {
            (StepKernel::Matmul { plan, params, .. }, None) => plan.pack_b(b, params, dst),
            (StepKernel::Matmul { plan, params, .. }, Some(half)) => {
                plan.pack_b_half(b, params, half, &mut halves_mut(dst)[..values])
            }
            (
                StepKernel::Conv2d {
                    attrs,
                    params,
                    w_shape,
                    plane,
                    ..
                },
                half,
            ) => {
                let w = TensorRef {
                    data: b,
                    shape: w_shape,
                };
                let (groups, plane) = (attrs.groups, *plane);
                match half {
                    None => conv::pack_conv2d_weight(w, groups, plane, params, dst),
                    Some(half) => conv::pack_conv2d_weight_half(
                        w,
                        groups,
                        plane,
                        params,
                        half,
                        &mut halves_mut(dst)[..values],
                    ),
                }
            }
            _ => Err(not_packed()),
        }
    }

    /// The panels of input 1 kept in `region` ([`StepKernel::pack_b`]), as the GEMM reads
    /// them.
    fn panels<'r>(&self, region: &'r [f32]) -> KernelResult<PackedB<'r>> {
        let (values, half) = self.packed_values().ok_or_else(not_packed)??;
        panels_in(region, values, half).ok_or_else(|| {
            KernelError::new(
                "pack",
                format!(
                    "a packed region of {} floats holds no {values} packed values",
                    region.len()
                ),
            )
        })
    }

    /// Runs the kernel on `io`, reading input 1 from `packed_b` (made by
    /// [`StepKernel::pack_b`]) instead of its view when given. Same bits as [`StepKernel::run`].
    pub fn run_with_packed_b(
        &self,
        io: Operands<'_>,
        packed_b: Option<&[f32]>,
    ) -> KernelResult<()> {
        let Operands {
            inputs,
            ints,
            out,
            out_shape,
            in_place,
            more_outs,
        } = io;
        let x = |i: usize| inputs[i];
        // A scalar operand's value; an update's optional gradient scale is 1 where absent (the
        // gradient read as it is).
        let scalar = |i: usize| x(i).data.first().copied().unwrap_or(f32::NAN);
        let g_scale = |i: usize| if i < inputs.len() { scalar(i) } else { 1.0 };
        match self {
            StepKernel::Constant(v) => out.fill(*v),
            StepKernel::Copy => {
                if !in_place {
                    copy_into("reshape", out, x(0).data)?;
                }
            }
            StepKernel::Unary(op, p) => chunked(p, out, |start, chunk| {
                if in_place {
                    unary_in_place(*op, chunk);
                } else {
                    unary_into(*op, &x(0).data[start..start + chunk.len()], chunk);
                }
            })?,
            StepKernel::Binary(op, None, p) => chunked(p, out, |start, chunk| {
                let rhs = &x(1).data[start..start + chunk.len()];
                if in_place {
                    binary_in_place(*op, chunk, rhs);
                } else {
                    binary_into(*op, &x(0).data[start..start + chunk.len()], rhs, chunk);
                }
            })?,
            StepKernel::Binary(_, Some(program), p) | StepKernel::Fused(program, p) => {
                fused_elementwise(program, inputs, p, out)?
            }
            StepKernel::Matmul {
                plan,
                operands,
                activation,
                params,
                ..
            } => {
                let epilogue = Epilogue {
                    bias: operands.bias_index().map(|i| x(i).data),
                    activation: *activation,
                    multiplier: operands.multiplier_index().map(|i| x(i).data),
                };
                match packed_b {
                    Some(region) => {
                        let packed = self.panels(region)?;
                        plan.run_prepacked(x(0).data, packed, epilogue, params, out)?
                    }
                    None => plan.run(x(0).data, x(1).data, epilogue, params, out)?,
                }
            }
            StepKernel::Transpose(perm, p) => transpose::transpose(x(0), perm, p, out)?,
            StepKernel::Reduce(op, axes, keepdim, p) => {
                reduce::reduce(x(0), *op, axes, *keepdim, p, out)?
            }
            StepKernel::Softmax(axis, false, p) => softmax::softmax(x(0), *axis, p, out)?,
            StepKernel::Softmax(axis, true, p) => softmax::log_softmax(x(0), *axis, p, out)?,
            StepKernel::RmsNorm(eps, scale, p) => {
                norm::rms_norm(x(0), scale.then(|| x(1)), *eps, p, out)?
            }
            StepKernel::LayerNorm(eps, affine, p) => {
                norm::layer_norm(x(0), affine.then(|| (x(1), x(2))), *eps, p, out)?
            }
            StepKernel::Embedding(p) => embedding::embedding(ints, x(0).shape, x(1), p, out)?,
            StepKernel::Rope(theta, p) => rope::rope(x(0), *theta, p, out)?,
            StepKernel::RopeTable(theta, positions, dim) => {
                rope::rope_table(*theta, *positions, *dim, out)?
            }
            StepKernel::RopeCached(p) => rope::rope_cached(x(0), x(1), p, out)?,
            StepKernel::Attention {
                causal,
                scale,
                params,
            } => attention::attention(x(0), x(1), x(2), *causal, Some(*scale), params, out)?,
            StepKernel::Conv2d { attrs, params, .. } => {
                let packed = packed_b.map(|region| self.panels(region)).transpose()?;
                conv::conv2d(x(0), x(1), attrs, params, packed, out)?
            }
            StepKernel::Pool(kind, attrs, p) => pool::pool2d(x(0), *kind, attrs, p, out)?,
            StepKernel::AdaptivePool(size, p) => pool::adaptive_avg_pool2d(x(0), *size, p, out)?,
            StepKernel::CrossEntropy(attrs, p) => {
                let v = loss::cross_entropy(x(0), ints, x(1).shape, attrs, p)?;
                copy_into("cross_entropy", out, &[v])?
            }
            StepKernel::CrossEntropyGrad(attrs, p) => {
                let dloss = x(2).data.first().copied().unwrap_or(f32::NAN);
                loss::cross_entropy_grad(x(0), ints, x(1).shape, dloss, attrs, p, out)?
            }
            StepKernel::BroadcastTo => copy_tensor(out, reference::broadcast_to(x(0), out_shape)?)?,
            StepKernel::Concat(axis) => copy_tensor(out, reference::concat(inputs, *axis)?)?,
            StepKernel::Slice(axis, start, end) => {
                copy_tensor(out, reference::slice(x(0), *axis, *start, *end)?)?
            }
            StepKernel::Select(axis, index) => {
                copy_tensor(out, reference::select(x(0), *axis, *index)?)?
            }
            StepKernel::Dropout(p, salt, block) => {
                let seed = ints.first().copied().unwrap_or(0);
                let block = match block {
                    Some(b) => Some(reference::MaskBlock {
                        dim: b.dim,
                        blocks: b.ranks,
                        index: b.index.ok_or_else(|| {
                            KernelError::new(
                                "dropout",
                                format!(
                                    "runs on one rank's block of a tensor split over mesh axis \
                                     `{}`, but this program was given no rank on it",
                                    b.axis
                                ),
                            )
                        })?,
                    }),
                    None => None,
                };
                let t = reference::dropout(x(0), *p, Some((seed, *salt)), block)?;
                copy_tensor(out, t)?
            }
            StepKernel::BatchNorm(eps, p) => norm::batch_norm(x(0), x(1), x(2), *eps, p, out)?,
            StepKernel::CausalMask(size) => copy_tensor(out, reference::causal_mask(*size))?,
            StepKernel::MseLoss => copy_tensor(out, reference::mse_loss(x(0), x(1))?)?,
            StepKernel::Collective(c) => {
                return Err(KernelError::new(
                    c.op.name(),
                    "a collective runs through the executor's collectives, not a kernel",
                ))
            }
            StepKernel::NormGrad(true, eps, p) => {
                norm_grad::rms_norm_grad(x(0), x(1), *eps, p, out)?
            }
            StepKernel::NormGrad(false, eps, p) => {
                norm_grad::layer_norm_grad(x(0), x(1), *eps, p, out)?
            }
            StepKernel::SquareSum(false, p) => copy_into(
                "square_sum",
                out,
                &[reduce::square_sum(x(0).data, false, p).0],
            )?,
            StepKernel::SquareSum(true, p) => {
                let [finite] = more_outputs("square_sum_finite", more_outs)?;
                let (total, check) = reduce::square_sum(x(0).data, true, p);
                copy_into("square_sum_finite", out, &[total])?;
                copy_into("square_sum_finite", finite, &[check])?
            }
            StepKernel::NormAffineGrad(false, eps, p) => {
                let [dw] = more_outputs("rms_norm_scale_grad", more_outs)?;
                norm_grad::norm_affine_grad(false, x(0), x(1).data, x(2), *eps, p, out, dw, None)?
            }
            StepKernel::NormAffineGrad(true, eps, p) => {
                let [dg, db] = more_outputs("layer_norm_affine_grad", more_outs)?;
                let (x0, g, dy) = (x(0), x(1).data, x(2));
                norm_grad::norm_affine_grad(true, x0, g, dy, *eps, p, out, dg, Some(db))?
            }
            StepKernel::EmbeddingGrad(vocab, p) => {
                embedding_grad::embedding_grad(ints, x(0).shape, x(1), *vocab, p, out)?
            }
            StepKernel::AttentionLse {
                causal,
                scale,
                params,
            } => {
                let [lse] = more_outputs("attention_lse", more_outs)?;
                attention::attention_lse(x(0), x(1), x(2), *causal, Some(*scale), params, out, lse)?
            }
            StepKernel::AdamUpdate([beta1, beta2, eps, wd], decoupled, p) => {
                let scalars = [scalar(4), scalar(5), scalar(6), g_scale(7)];
                let step = optimizer::AdamStep::new(*beta1, *beta2, *eps, *wd, *decoupled, scalars);
                let [m, v] = more_outputs("adam_update", more_outs)?;
                match in_place {
                    // The outputs already hold p, m and v (an update in place).
                    true => optimizer::adam_update_in_place(&step, x(1).data, p, [out, m, v])?,
                    false => {
                        let inputs = [x(0).data, x(1).data, x(2).data, x(3).data];
                        optimizer::adam_update(&step, inputs, p, [out, m, v])?
                    }
                }
            }
            StepKernel::SgdUpdate([momentum, wd], nesterov, p) => {
                let scalars = [scalar(3), g_scale(4)];
                let step = optimizer::SgdStep::new(*momentum, *wd, *nesterov, scalars);
                let [buf] = more_outputs("sgd_update", more_outs)?;
                match in_place {
                    true => optimizer::sgd_update_in_place(&step, x(1).data, p, [out, buf])?,
                    false => {
                        let inputs = [x(0).data, x(1).data, x(2).data];
                        optimizer::sgd_update(&step, inputs, p, [out, buf])?
                    }
                }
            }
            StepKernel::AttentionGrad {
                causal,
                scale,
                params,
            } => {
                let [dk, dv] = more_outputs("attention_grad", more_outs)?;
                attention_grad::attention_grad(
                    x(0),
                    x(1),
                    x(2),
                    x(3),
                    x(4),
                    x(5),
                    *causal,
                    Some(*scale),
                    params,
                    out,
                    dk,
                    dv,
                )?
            }
            StepKernel::Conv2dGradInput(attrs, size, p) => {
                conv_grad::conv2d_grad_input(x(0), x(1), attrs, *size, p, out)?
            }
            StepKernel::Conv2dGradWeight(attrs, kernel, p) => {
                conv_grad::conv2d_grad_weight(x(0), x(1), attrs, *kernel, p, out)?
            }
            StepKernel::PoolGrad(kind, attrs, p) => {
                pool_grad::pool2d_grad(x(0), x(1), *kind, attrs, p, out)?
            }
            StepKernel::AdaptivePoolGrad(size, p) => {
                pool_grad::adaptive_avg_pool2d_grad(x(0), x(1), *size, p, out)?
            }
        }
        Ok(())
    }
}

/// Outputs 1..=N of a multi-output `op`; an error when the caller gave another number.
fn more_outputs<'a, const N: usize>(
    op: &'static str,
    outs: [Option<&'a mut [f32]>; MAX_OUTPUTS - 1],
) -> KernelResult<[&'a mut [f32]; N]> {
    let given = outs.iter().flatten().count();
    if given != N {
        return Err(KernelError::new(
            op,
            format!("has {} outputs, but {} were given", N + 1, given + 1),
        ));
    }
    let mut outs = outs.into_iter().flatten();
    Ok(std::array::from_fn(|_| outs.next().unwrap_or_default()))
}

/// Runs `f(start, chunk)` over `block`-long chunks of `out`, in parallel for large outputs.
fn chunked(
    p: &ElementwiseParams,
    out: &mut [f32],
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> KernelResult<()> {
    if p.block == 0 {
        return Err(KernelError::new("elementwise", "block must be at least 1"));
    }
    let parallel = out.len() >= p.min_parallel_elems;
    for_each_chunk_mut(parallel, out, p.block, |i, chunk| f(i * p.block, chunk));
    Ok(())
}

fn copy_into(op: &'static str, out: &mut [f32], src: &[f32]) -> KernelResult<()> {
    if out.len() != src.len() {
        return Err(KernelError::new(
            op,
            format!(
                "result has {} elements, the output {}",
                src.len(),
                out.len()
            ),
        ));
    }
    out.copy_from_slice(src);
    Ok(())
}

fn copy_tensor(out: &mut [f32], t: Tensor) -> KernelResult<()> {
    copy_into("reference", out, &t.data)
}
