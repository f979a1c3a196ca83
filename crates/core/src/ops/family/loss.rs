//! Losses: `cross_entropy` and `mse_loss`, both a scalar mean.

use crate::ops::attrs::{AttrSpec, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::fmt_dims;
use crate::ops::spec::{Arity, CostRule, Emitter, GradCall, Handle, OpCtx, OpSpec, PrecisionClass};
use crate::ops::{Op, TensorType};

/// The attributes of `cross_entropy` and its gradient, PyTorch's: positions labelled
/// `ignore_index` count neither in the loss nor in the mean, and `label_smoothing` mixes the
/// one-hot target with the uniform distribution.
const CROSS_ENTROPY_ATTRS: [AttrSpec; 2] = [
    AttrSpec::defaulted("ignore_index", ConstAttr::Int(-100)),
    AttrSpec::defaulted("label_smoothing", ConstAttr::Float(0.0)),
];

/// `cross_entropy`: mean over the positions whose label is not `ignore_index` of
/// `(1 - ε)·(-log_softmax(logits)[label]) + ε·mean_c(-log_softmax(logits)[c])` (ε the label
/// smoothing; NaN when every position is ignored, as PyTorch); about 8 flops per logit (the
/// log-softmax) and on the keep-f32 list.
pub const CROSS_ENTROPY: OpSpec = OpSpec {
    inputs: &["logits", "labels"],
    arity: Arity::Exact(2),
    attrs: &CROSS_ENTROPY_ATTRS,
    infer: infer_cross_entropy,
    cost: CostRule::PerInput(8),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: Some(grad_cross_entropy),
    shard: None,
};

/// `cross_entropy_grad(logits, labels, dloss)`: the gradient of `cross_entropy` w.r.t. its
/// logits in one pass, `dloss / n · (softmax(row) - (1 - ε)·onehot(label) - ε / V)` for each
/// counted row and 0 for ignored ones (`n` the number counted): no probability tensor or
/// one-hot is stored.
pub const CROSS_ENTROPY_GRAD: OpSpec = OpSpec {
    inputs: &["logits", "labels", "dloss"],
    arity: Arity::Exact(3),
    infer: infer_cross_entropy_grad,
    grad: None,
    ..CROSS_ENTROPY
};

/// `mse_loss`: mean of `(a - b)²` over equal shapes; on the keep-f32 list.
pub const MSE_LOSS: OpSpec = OpSpec {
    inputs: &["a", "b"],
    attrs: &[],
    infer: infer_mse,
    grad: Some(grad_mse),
    cost: CostRule::PerInput(3),
    ..CROSS_ENTROPY
};

fn infer_cross_entropy(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dtype = ctx.float_input(0)?;
    let eps = ctx.attrs.float("label_smoothing")?;
    if !(0.0..=1.0).contains(&eps) {
        return Err(OpError::new(format!(
            "`label_smoothing` must be in [0, 1], got {eps:?}"
        )));
    }
    ctx.expect_min_rank(0, 1, "[..., V]")?;
    ctx.int_input(1)?;
    let (logits, labels) = (ctx.input(0), ctx.input(1));
    let positions = &logits.shape[..logits.rank() - 1];
    if labels.shape != positions {
        return Err(OpError::at(
            1,
            format!(
                "labels {} must have the shape of logits {} without its last (class) dim, {}",
                fmt_dims(&labels.shape),
                fmt_dims(&logits.shape),
                fmt_dims(positions)
            ),
        ));
    }
    Ok(vec![TensorType::scalar(dtype)])
}

fn infer_mse(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dtype = ctx.float_input(0)?;
    ctx.same_dtype(0, 1)?;
    let (a, b) = (ctx.input(0), ctx.input(1));
    if a.shape != b.shape {
        return Err(OpError::at(
            1,
            format!(
                "shapes differ: a is {}, b is {}",
                fmt_dims(&a.shape),
                fmt_dims(&b.shape)
            ),
        ));
    }
    Ok(vec![TensorType::scalar(dtype)])
}

fn infer_cross_entropy_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let loss = infer_cross_entropy(ctx)?;
    let dloss = ctx.input(2);
    if dloss != &loss[0] {
        return Err(OpError::at(
            2,
            format!(
                "dloss must be the loss's type {}, but {}",
                loss[0],
                ctx.describe(2)
            ),
        ));
    }
    Ok(vec![ctx.input(0).clone()])
}

/// `cross_entropy`: one fused `cross_entropy_grad` for the logits; labels get none.
fn grad_cross_entropy(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    let (logits, labels, dl) = (call.x(0), call.x(1), call.dy()?);
    let g = em.op1(
        Op::CrossEntropyGrad,
        call.attrs.clone(),
        &[logits, labels, dl],
    )?;
    Ok(vec![Some(g), None])
}

/// `mse_loss`: `da = dloss * 2 (a - b) / n`, `db = -da`.
fn grad_mse(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let (a, b, dl) = (call.x(0), call.x(1), call.dy()?);
    let n = em.ty(a)?.numel();
    let d = em.sub(a, b)?;
    let d = em.scale(d, 2.0 / n as f64)?;
    let da = em.mul(d, dl)?;
    Ok(vec![Some(da), Some(em.neg(da)?)])
}

#[cfg(test)]
mod tests {
    use crate::ops::family::testing::*;
    use crate::ops::{Attrs, DType, Op, PrecisionClass};

    #[test]
    fn cross_entropy() {
        let out = ok(
            Op::CrossEntropy,
            Attrs::new(),
            &[f32t(&[2, 5, 11]), t(DType::I32, &[2, 5])],
        );
        assert_eq!(out, f32t(&[]));
        let e = err(
            Op::CrossEntropy,
            Attrs::new(),
            &[f32t(&[2, 5, 11]), t(DType::I32, &[2, 11])],
        );
        assert_eq!(
            e.message,
            "cross_entropy: labels [2, 11] must have the shape of logits [2, 5, 11] without \
             its last (class) dim, [2, 5]"
        );
        assert_eq!(e.input, Some(1));
        let e = err(
            Op::CrossEntropy,
            Attrs::new(),
            &[f32t(&[2, 11]), f32t(&[2])],
        );
        assert!(e
            .message
            .contains("expects an integer tensor, but labels is f32[2]"));
        assert_eq!(Op::CrossEntropy.spec().precision, PrecisionClass::KeepF32);
    }

    #[test]
    fn mse() {
        assert_eq!(
            ok(Op::MseLoss, Attrs::new(), &[f32t(&[3, 2]), f32t(&[3, 2])]),
            f32t(&[])
        );
        let e = err(Op::MseLoss, Attrs::new(), &[f32t(&[3, 2]), f32t(&[2])]);
        assert_eq!(e.message, "mse_loss: shapes differ: a is [3, 2], b is [2]");
    }
}
