//! The correctness guard's ground truth: the naive reference kernel of a prepared step, run on
//! the tuning inputs. Steps whose kernel has no reference here are not tuned (a candidate that
//! cannot be checked may not win).

use mslc_core::ops::{resolve_attrs, Attrs, Op};
use mslc_kernels::elementwise::BinaryOp;
use mslc_kernels::reference::AdamAttrs;
use mslc_kernels::step::StepKernel;
use mslc_kernels::{reference, Activation, KernelResult, Tensor, TensorRef};

/// The reference results of `kernel` (prepared for a step of `op` with `attrs`) on `inputs`
/// (an integer input's values in `ints`), a multi-output step's one after another, or `None`
/// when the kernel has no reference here.
pub fn reference_output(
    kernel: &StepKernel,
    op: Op,
    attrs: &Attrs,
    inputs: &[TensorRef<'_>],
    ints: &[i64],
) -> Option<Result<Vec<f32>, String>> {
    let x = |i: usize| inputs[i];
    // A scalar operand's value (NaN where the operand is empty, which the check then reports).
    let scalar = |i: usize| x(i).data.first().copied().unwrap_or(f32::NAN);
    // An update's optional gradient scale: 1 where absent.
    let g_scale = |i: usize| if i < inputs.len() { scalar(i) } else { 1.0 };
    let text = |r: KernelResult<Tensor>| r.map(|t| vec![t]).map_err(|e| e.to_string());
    let texts = |r: KernelResult<Vec<Tensor>>| r.map_err(|e| e.to_string());
    let result = match kernel {
        StepKernel::Unary(u, _) => text(reference::unary(*u, x(0))),
        StepKernel::Binary(b, _, _) => text(reference::binary(*b, x(0), x(1))),
        StepKernel::Fused(program, _) => text(reference::fused_elementwise(program, inputs)),
        StepKernel::Matmul { operands, .. } => {
            let a = resolve_attrs(op, attrs).ok()?;
            let activation = Activation::of(&a).ok()?;
            let (ta, tb) = (a.bool("transpose_a").ok()?, a.bool("transpose_b").ok()?);
            let bias = operands.bias_index().map(x);
            let product = reference::fused_matmul(x(0), x(1), bias, ta, tb, activation);
            let multiplier = operands.multiplier_index().map(x);
            text(product.and_then(|p| match multiplier {
                Some(m) => reference::binary(BinaryOp::Mul, p.view(), m),
                None => Ok(p),
            }))
        }
        StepKernel::Conv2d { attrs, .. } => text(reference::conv2d(x(0), x(1), attrs)),
        StepKernel::Attention { causal, scale, .. } => text(reference::attention(
            x(0),
            x(1),
            x(2),
            *causal,
            Some(*scale),
        )),
        StepKernel::AttentionLse { causal, scale, .. } => {
            let (q, k, v, scale) = (x(0), x(1), x(2), Some(*scale));
            texts(
                reference::attention(q, k, v, *causal, scale).and_then(|out| {
                    Ok(vec![
                        out,
                        reference::attention_lse(q, k, v, *causal, scale)?,
                    ])
                }),
            )
        }
        StepKernel::AttentionGrad { causal, scale, .. } => texts(
            (0..3)
                .map(|wrt| {
                    let [q, k, v, out, dout, lse] = [0, 1, 2, 3, 4, 5].map(x);
                    reference::attention_grad(q, k, v, out, dout, lse, *causal, Some(*scale), wrt)
                })
                .collect(),
        ),
        StepKernel::NormAffineGrad(centered, eps, _) => texts(reference::norm_affine_grad(
            *centered,
            x(0),
            x(1),
            x(2),
            *eps,
        )),
        StepKernel::Transpose(perm, _) => text(reference::transpose(x(0), perm)),
        StepKernel::Reduce(rop, axes, keepdim, _) => {
            text(reference::reduce(x(0), *rop, axes, *keepdim))
        }
        StepKernel::SquareSum(false, _) => text(reference::square_sum(x(0))),
        StepKernel::SquareSum(true, _) => texts(reference::square_sum_finite(x(0))),
        StepKernel::Softmax(axis, false, _) => text(reference::softmax(x(0), *axis)),
        StepKernel::Softmax(axis, true, _) => text(reference::log_softmax(x(0), *axis)),
        StepKernel::RmsNorm(eps, false, _) => text(reference::rms_norm(x(0), *eps)),
        StepKernel::RmsNorm(eps, true, _) => text(reference::rms_norm_scale(x(0), x(1), *eps)),
        StepKernel::LayerNorm(eps, false, _) => text(reference::layer_norm(x(0), *eps)),
        StepKernel::LayerNorm(eps, true, _) => {
            text(reference::layer_norm_affine(x(0), x(1), x(2), *eps))
        }
        StepKernel::Embedding(_) => text(reference::embedding(ints, x(0).shape, x(1))),
        StepKernel::Rope(theta, _) => text(reference::rope(x(0), *theta)),
        StepKernel::RopeCached(_) => text(reference::rope_cached(x(0), x(1))),
        StepKernel::Pool(kind, attrs, _) => text(reference::pool2d(x(0), *kind, attrs)),
        StepKernel::AdaptivePool(size, _) => text(reference::adaptive_avg_pool2d(x(0), *size)),
        StepKernel::CrossEntropy(attrs, _) => {
            text(reference::cross_entropy(x(0), ints, x(1).shape, attrs))
        }
        StepKernel::CrossEntropyGrad(attrs, _) => text(reference::cross_entropy_grad(
            x(0),
            ints,
            x(1).shape,
            scalar(2),
            attrs,
        )),
        StepKernel::BatchNorm(eps, _) => text(reference::batch_norm(x(0), x(1), x(2), *eps)),
        StepKernel::NormGrad(true, eps, _) => text(reference::rms_norm_grad(x(0), x(1), *eps)),
        StepKernel::NormGrad(false, eps, _) => text(reference::layer_norm_grad(x(0), x(1), *eps)),
        StepKernel::EmbeddingGrad(vocab, _) => {
            text(reference::embedding_grad(ints, x(0).shape, x(1), *vocab))
        }
        StepKernel::Conv2dGradInput(attrs, size, _) => {
            text(reference::conv2d_grad_input(x(0), x(1), attrs, *size))
        }
        StepKernel::Conv2dGradWeight(attrs, kernel, _) => {
            text(reference::conv2d_grad_weight(x(0), x(1), attrs, *kernel))
        }
        StepKernel::PoolGrad(kind, attrs, _) => {
            text(reference::pool2d_grad(x(0), x(1), *kind, attrs))
        }
        StepKernel::AdaptivePoolGrad(size, _) => {
            text(reference::adaptive_avg_pool2d_grad(x(0), x(1), *size))
        }
        StepKernel::AdamUpdate([beta1, beta2, eps, weight_decay], decoupled, _) => {
            let attrs = AdamAttrs {
                beta1: *beta1,
                beta2: *beta2,
                eps: *eps,
                weight_decay: *weight_decay,
                decoupled: *decoupled,
            };
            let [lr, step_size, bc2_sqrt] = [4, 5, 6].map(scalar);
            texts(reference::adam_update(
                [0, 1, 2, 3].map(x),
                [lr, step_size, bc2_sqrt, g_scale(7)],
                &attrs,
            ))
        }
        StepKernel::SgdUpdate(attrs, nesterov, _) => texts(reference::sgd_update(
            [0, 1, 2].map(x),
            *attrs,
            *nesterov,
            [scalar(3), g_scale(4)],
        )),
        _ => return None,
    };
    Some(result.map(|outputs| outputs.into_iter().flat_map(|t| t.data).collect()))
}
