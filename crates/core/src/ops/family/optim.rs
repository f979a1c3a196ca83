//! Fused optimizer updates: one op per parameter that reads the parameter, its gradient and its
//! states once and writes the new ones, instead of a chain of elementwise steps that each write
//! a tensor (as MindSpore's `AdamWeightDecay` and PyTorch's fused AdamW do). A training step
//! builds them; they have no gradient. Beside them, the reduction the gradient norm is made of.

use crate::ops::attrs::{AttrKind, AttrSpec, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::fmt_dims;
use crate::ops::spec::{Arity, CostRule, OpCtx, OpSpec, PrecisionClass};
use crate::ops::{DType, TensorType};

/// `adam_update(p, g, m, v, lr, step_size, bc2_sqrt[, g_scale])`: one Adam / AdamW step of
/// parameter `p` with gradient `g` (times the scalar `g_scale` where given: the clipping
/// coefficient and the loss scale's reciprocal, read with the gradient rather than in a pass
/// of their own) and moments `m`, `v`, giving the new `p`, `m`, `v` (three outputs), as
/// `torch.optim.Adam` / `AdamW` compute it: with `decoupled` (AdamW) `p ← p − lr·wd·p`, else
/// `g ← g + wd·p`; `m ← β1·m + (1−β1)·g`, `v ← β2·v + (1−β2)·g²`,
/// `p ← p − step_size · m / (√v / bc2_sqrt + eps)`, where the scalar inputs carry the step's
/// learning rate, `lr / (1 − β1^t)` and `√(1 − β2^t)`.
pub const ADAM_UPDATE: OpSpec = OpSpec {
    inputs: &["p", "g", "m", "v", "lr", "step_size", "bc2_sqrt", "g_scale"],
    arity: Arity::Between(7, 8),
    attrs: &[
        AttrSpec::required("beta1", AttrKind::Float),
        AttrSpec::required("beta2", AttrKind::Float),
        AttrSpec::required("eps", AttrKind::Float),
        AttrSpec::defaulted("weight_decay", ConstAttr::Float(0.0)),
        AttrSpec::defaulted("decoupled", ConstAttr::Bool(true)),
    ],
    infer: infer_adam_update,
    cost: CostRule::PerInput(14),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `sgd_update(p, g, buf, lr[, g_scale])`: one step of SGD with momentum of parameter `p` with
/// gradient `g` (times the scalar `g_scale` where given) and momentum buffer `buf`, giving the
/// new `p` and `buf` (two outputs), as `torch.optim.SGD` computes it (dampening 0; MindSpore's
/// `ApplyMomentum`): `g ← g + wd·p`, `buf ← momentum·buf + g`, `p ← p − lr·d` with `d = buf`,
/// or `g + momentum·buf` with `nesterov`.
pub const SGD_UPDATE: OpSpec = OpSpec {
    inputs: &["p", "g", "buf", "lr", "g_scale"],
    arity: Arity::Between(4, 5),
    attrs: &[
        AttrSpec::required("momentum", AttrKind::Float),
        AttrSpec::defaulted("weight_decay", ConstAttr::Float(0.0)),
        AttrSpec::defaulted("nesterov", ConstAttr::Bool(false)),
    ],
    infer: infer_sgd_update,
    cost: CostRule::PerInput(6),
    ..ADAM_UPDATE
};

/// `square_sum(x)`: `Σ x²` over every element, a scalar of x's (float) dtype — one term of the
/// global gradient norm (MindSpore's `SquareSumAll`, used by its `clip_by_global_norm`), read in
/// one pass instead of a squared copy and its sum. A training step builds it; no gradient.
pub const SQUARE_SUM: OpSpec = OpSpec {
    inputs: &["x"],
    arity: Arity::Exact(1),
    attrs: &[],
    infer: infer_square_sum,
    cost: CostRule::PerInput(2),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `square_sum_finite(x)`: `square_sum(x)` and the loss scaling's overflow check of `x` from
/// the same pass: `Σ x²` and `Σ x·0` (0, or NaN where any element is infinite or NaN: the
/// check PyTorch's `GradScaler` and MindSpore's overflow status make), two scalars of x's
/// (float) dtype. A training step that skips overflowing steps builds it; no gradient.
pub const SQUARE_SUM_FINITE: OpSpec = OpSpec {
    infer: infer_square_sum_finite,
    cost: CostRule::PerInput(4),
    ..SQUARE_SUM
};

fn infer_square_sum(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.float_input(0)?;
    Ok(vec![TensorType::new(ctx.input(0).dtype, Vec::<i64>::new())])
}

fn infer_square_sum_finite(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let sum = infer_square_sum(ctx)?;
    Ok([sum.clone(), sum].concat())
}

fn infer_adam_update(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let p = infer_update(ctx, 4)?;
    Ok(vec![p.clone(), p.clone(), p])
}

fn infer_sgd_update(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let p = infer_update(ctx, 3)?;
    Ok(vec![p.clone(), p])
}

/// Checks an update's inputs: f32 all, the first `tensors` of p's shape, the rest scalars;
/// returns p's type.
fn infer_update(ctx: &OpCtx, tensors: usize) -> Result<TensorType, OpError> {
    for i in 0..ctx.inputs.len() {
        if ctx.input(i).dtype != DType::F32 {
            return Err(OpError::at(
                i,
                format!("{} must be f32, got {}", ctx.arg_name(i), ctx.input(i)),
            ));
        }
    }
    let p = ctx.input(0);
    for i in 1..tensors {
        if ctx.input(i).shape != p.shape {
            return Err(OpError::at(
                i,
                format!(
                    "{} {} must have the shape of p {}",
                    ctx.arg_name(i),
                    fmt_dims(&ctx.input(i).shape),
                    fmt_dims(&p.shape)
                ),
            ));
        }
    }
    for i in tensors..ctx.inputs.len() {
        ctx.expect_rank(i, 0, "a scalar")?;
    }
    Ok(p.clone())
}

#[cfg(test)]
mod tests {
    use crate::ops::family::testing::*;
    use crate::ops::{cost, infer, Attrs, DType, Op};

    fn attrs() -> Attrs {
        Attrs::new()
            .with("beta1", 0.9)
            .with("beta2", 0.999)
            .with("eps", 1e-8)
    }

    #[test]
    fn square_sum_is_a_scalar_of_a_float_input() {
        assert_eq!(ok(Op::SquareSum, Attrs::new(), &[f32t(&[4, 3])]), f32t(&[]));
        assert_eq!(
            ok(Op::SquareSum, Attrs::new(), &[t(DType::F16, &[2])]),
            t(DType::F16, &[])
        );
        assert!(err(Op::SquareSum, Attrs::new(), &[t(DType::I32, &[2])])
            .message
            .contains("expects a float tensor"));
        let both = infer(Op::SquareSumFinite, &Attrs::new(), &[t(DType::F16, &[2])]).unwrap();
        assert_eq!(both, [t(DType::F16, &[]), t(DType::F16, &[])]);
        assert!(
            err(Op::SquareSumFinite, Attrs::new(), &[t(DType::I32, &[2])])
                .message
                .contains("expects a float tensor")
        );
    }

    #[test]
    fn adam_update_gives_three_tensors_of_the_parameter() {
        let p = f32t(&[4, 3]);
        let s = f32t(&[]);
        let ins = [
            p.clone(),
            p.clone(),
            p.clone(),
            p.clone(),
            s.clone(),
            s.clone(),
            s,
        ];
        let outs = infer(Op::AdamUpdate, &attrs(), &ins).unwrap();
        assert_eq!(outs, [p.clone(), p.clone(), p.clone()]);
        assert_eq!(cost(Op::AdamUpdate, &attrs(), &ins).unwrap().flops, 12 * 14);
        let mut bad = ins.clone();
        bad[3] = f32t(&[3, 4]);
        let e = err(Op::AdamUpdate, attrs(), &bad);
        assert_eq!(e.input, Some(3));
        let mut bad = ins.clone();
        bad[1] = t(DType::F16, &[4, 3]);
        assert!(err(Op::AdamUpdate, attrs(), &bad)
            .message
            .contains("must be f32"));
        let mut bad = ins.clone();
        bad[5] = f32t(&[1]);
        assert_eq!(err(Op::AdamUpdate, attrs(), &bad).input, Some(5));
        // The optional gradient scale: a scalar f32 like the others.
        let mut scaled = ins.to_vec();
        scaled.push(f32t(&[]));
        assert_eq!(infer(Op::AdamUpdate, &attrs(), &scaled).unwrap().len(), 3);
        scaled[7] = f32t(&[2]);
        assert_eq!(err(Op::AdamUpdate, attrs(), &scaled).input, Some(7));
        scaled[7] = t(DType::F16, &[]);
        assert_eq!(err(Op::AdamUpdate, attrs(), &scaled).input, Some(7));
    }

    #[test]
    fn sgd_update_gives_the_parameter_and_its_buffer() {
        let (p, s) = (f32t(&[4, 3]), f32t(&[]));
        let momentum = Attrs::new().with("momentum", 0.9);
        for ins in [
            vec![p.clone(), p.clone(), p.clone(), s.clone()],
            vec![p.clone(), p.clone(), p.clone(), s.clone(), s.clone()],
        ] {
            let outs = infer(Op::SgdUpdate, &momentum, &ins).unwrap();
            assert_eq!(outs, [p.clone(), p.clone()]);
        }
        let bad = [p.clone(), p.clone(), f32t(&[3, 4]), s.clone()];
        assert_eq!(err(Op::SgdUpdate, momentum.clone(), &bad).input, Some(2));
        let bad = [p.clone(), p.clone(), p.clone(), f32t(&[2])];
        assert_eq!(err(Op::SgdUpdate, momentum.clone(), &bad).input, Some(3));
        assert!(infer(Op::SgdUpdate, &Attrs::new(), &[p.clone(), p.clone(), p, s]).is_err());
    }
}
