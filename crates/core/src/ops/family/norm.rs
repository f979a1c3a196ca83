//! Normalisations over the last dim (`rms_norm`, `layer_norm` and their fused affine forms)
//! and `batch_norm` over the channel dim.

use crate::ops::attrs::{AttrSpec, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::grad::unbroadcast;
use crate::ops::shape::{broadcasts_to, fmt_dims};
use crate::ops::spec::{
    Arity, CostRule, Emitter, GradCall, GradRule, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{Attrs, Op, TensorType};

const EPS: [AttrSpec; 1] = [AttrSpec::defaulted("eps", ConstAttr::Float(1e-5))];

/// A normalisation of `x` over its last dim, costing `flops` per element; on the keep-f32
/// list.
pub const fn normalize(flops: u64) -> OpSpec {
    OpSpec {
        inputs: &["x"],
        arity: Arity::Exact(1),
        attrs: &EPS,
        infer: infer_normalize,
        cost: CostRule::PerInput(flops),
        precision: PrecisionClass::KeepF32,
        elementwise: false,
        in_place: true,
        grad: None,
        shard: None,
    }
}

/// A fused normalisation followed by elementwise scale (and shift) parameters named after
/// `x` in `inputs`, each broadcasting to `x` and of `x`'s dtype; differentiated by `grad`.
pub const fn normalize_affine(
    inputs: &'static [&'static str],
    flops: u64,
    grad: GradRule,
) -> OpSpec {
    OpSpec {
        inputs,
        arity: Arity::Exact(inputs.len()),
        infer: infer_normalize_affine,
        grad: Some(grad),
        ..normalize(flops)
    }
}

/// `rms_norm`, differentiated by the fused `rms_norm_grad`.
pub const RMS_NORM: OpSpec = OpSpec {
    grad: Some(grad_rms_norm),
    ..normalize(4)
};

/// `layer_norm`, differentiated by the fused `layer_norm_grad`.
pub const LAYER_NORM: OpSpec = OpSpec {
    grad: Some(grad_layer_norm),
    ..normalize(6)
};

/// `batch_norm`: normalisation of `x [N, C, ...]` by per-channel `mean` and `var`. The op
/// itself uses the statistics it is given (eval mode); a training step passes the batch's and
/// updates the running ones by `momentum` (PyTorch's, default 0.1), which the op carries.
pub const BATCH_NORM: OpSpec = OpSpec {
    inputs: &["x", "mean", "var"],
    arity: Arity::Exact(3),
    attrs: &[
        AttrSpec::defaulted("eps", ConstAttr::Float(1e-5)),
        AttrSpec::defaulted("momentum", ConstAttr::Float(0.1)),
    ],
    infer: infer_batch_norm,
    grad: Some(grad_batch_norm),
    ..normalize(2)
};

/// What a gradient rule returns: one cotangent per input.
type Grads = Result<Vec<Option<Handle>>, OpError>;

/// The input gradient of a last-dim norm by its fused backward op `grad_op`, same `eps`.
fn grad_normalize(em: &mut dyn Emitter, call: &GradCall, grad_op: Op) -> Grads {
    let attrs = Attrs::new().with("eps", call.attrs.float("eps")?);
    Ok(vec![Some(em.op1(
        grad_op,
        attrs,
        &[call.x(0), call.dy()?],
    )?)])
}

fn grad_rms_norm(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    grad_normalize(em, call, Op::RmsNormGrad)
}

fn grad_layer_norm(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    grad_normalize(em, call, Op::LayerNormGrad)
}

/// The fused affine forms, `n = norm(x)`, `y = n·g (+ b)`: `dx` is the norm's gradient of
/// `dy·g`, `dg = Σ dy·n` and `db = Σ dy` over the dims the parameters were broadcast along.
/// Parameters of shape `[H]` (one per feature, as every model's norms have) get all of them
/// from one pass of `fused` (see [`normalize_affine_grad`]); others, the composition.
fn grad_normalize_affine(
    em: &mut dyn Emitter,
    call: &GradCall,
    (norm, grad_op, fused): (Op, Op, Op),
) -> Grads {
    let (x, g, dy) = (call.x(0), call.x(1), call.dy()?);
    let eps = Attrs::new().with("eps", call.attrs.float("eps")?);
    let x_ty = em.ty(x)?;
    let features = &x_ty.shape[x_ty.rank().saturating_sub(1)..];
    let mut per_feature = em.ty(dy)? == x_ty;
    for &p in &call.inputs[1..] {
        let p_ty = em.ty(p)?;
        per_feature &= p_ty.dtype == x_ty.dtype && p_ty.shape == features;
    }
    if per_feature {
        let grads = em.emit(fused, eps, &[x, g, dy])?;
        return Ok(grads
            .into_iter()
            .take(call.inputs.len())
            .map(Some)
            .collect());
    }
    let dn = em.mul(dy, g)?;
    let dx = em.op1(grad_op, eps.clone(), &[x, dn])?;
    let n = em.op1(norm, eps, &[x])?;
    let dyn_ = em.mul(dy, n)?;
    let g_ty = em.ty(g)?;
    let mut grads = vec![Some(dx), unbroadcast(em, dyn_, &g_ty)?];
    if let Some(&b) = call.inputs.get(2) {
        let b_ty = em.ty(b)?;
        grads.push(unbroadcast(em, dy, &b_ty)?);
    }
    Ok(grads)
}

/// `rms_norm_scale(x, w)`.
pub(crate) fn grad_rms_norm_scale(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let ops = (Op::RmsNorm, Op::RmsNormGrad, Op::RmsNormScaleGrad);
    grad_normalize_affine(em, call, ops)
}

/// `layer_norm_affine(x, g, b)`.
pub(crate) fn grad_layer_norm_affine(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let ops = (Op::LayerNorm, Op::LayerNormGrad, Op::LayerNormAffineGrad);
    grad_normalize_affine(em, call, ops)
}

/// `batch_norm` with given statistics, `y = (x − mean)·r`, `r = rsqrt(var + eps)` per channel:
/// `dx = dy·r`, `dmean = −Σ dy·r`, `dvar = −½·r³·Σ dy·(x − mean)`, sums over every dim but the
/// channel's.
fn grad_batch_norm(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let (x, mean, var, dy) = (call.x(0), call.x(1), call.x(2), call.dy()?);
    let xt = em.ty(x)?;
    // [C, 1, ..., 1]: broadcasts a per-channel vector against x [N, C, ...].
    let mut per_channel = vec![xt.shape[1]];
    per_channel.resize(xt.rank() - 1, 1);
    let axes: Vec<usize> = (0..xt.rank()).filter(|&a| a != 1).collect();
    let eps = em.scalar(call.attrs.float("eps")?, xt.dtype)?;
    let shifted = em.add(var, eps)?;
    let r = em.unary(Op::Rsqrt, shifted)?;
    let rb = em.reshape(r, &per_channel)?;
    let dx = em.mul(dy, rb)?;
    let dx_sum = em.reduce(Op::Sum, dx, &axes, false)?;
    let dmean = em.neg(dx_sum)?;
    let mb = em.reshape(mean, &per_channel)?;
    let centred = em.sub(x, mb)?;
    let weighted = em.mul(dy, centred)?;
    let s = em.reduce(Op::Sum, weighted, &axes, false)?;
    let r2 = em.mul(r, r)?;
    let r3 = em.mul(r2, r)?;
    let sr3 = em.mul(s, r3)?;
    let dvar = em.scale(sr3, -0.5)?;
    Ok(vec![Some(dx), Some(dmean), Some(dvar)])
}

/// `rms_norm_grad` / `layer_norm_grad`: the input gradient of a last-dim normalisation of `x`
/// given the output cotangent `dy`; the kernels recompute each row's statistics from `x` instead
/// of saving them, so the backward keeps only `x` alive.
pub const fn normalize_grad(flops: u64) -> OpSpec {
    OpSpec {
        inputs: &["x", "dy"],
        arity: Arity::Exact(2),
        infer: infer_normalize_grad,
        in_place: false,
        ..normalize(flops)
    }
}

/// `rms_norm_scale_grad` (inputs x, w, dy; outputs dx, dw) / `layer_norm_affine_grad`
/// (x, g, dy; dx, dg, db): every gradient of a fused affine norm whose parameters are `[H]`
/// from one pass over x and dy — each row's statistics recomputed, the parameter gradients
/// summed over the rows in a fixed order — instead of the five steps of the composition.
pub const fn normalize_affine_grad(inputs: &'static [&'static str], flops: u64) -> OpSpec {
    OpSpec {
        inputs,
        arity: Arity::Exact(3),
        infer: infer_normalize_affine_grad,
        in_place: false,
        ..normalize(flops)
    }
}

fn check_eps(ctx: &OpCtx) -> Result<(), OpError> {
    let eps = ctx.attrs.float("eps")?;
    if eps >= 0.0 && eps.is_finite() {
        Ok(())
    } else {
        Err(OpError::new(format!(
            "`eps` must be a finite non-negative number, got {eps:?}"
        )))
    }
}

fn infer_normalize(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    check_eps(ctx)?;
    ctx.float_input(0)?;
    ctx.expect_min_rank(0, 1, "[..., H]")?;
    Ok(vec![ctx.input(0).clone()])
}

/// Checks that input `dy` (an output cotangent) has x's dtype and shape.
fn expect_like_x(ctx: &OpCtx, dy: usize) -> Result<(), OpError> {
    ctx.same_dtype(0, dy)?;
    if ctx.input(dy).shape != ctx.input(0).shape {
        return Err(OpError::at(
            dy,
            format!(
                "dy {} must have the shape of x {}",
                fmt_dims(&ctx.input(dy).shape),
                fmt_dims(&ctx.input(0).shape)
            ),
        ));
    }
    Ok(())
}

fn infer_normalize_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let out = infer_normalize(ctx)?;
    expect_like_x(ctx, 1)?;
    Ok(out)
}

fn infer_normalize_affine_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let mut out = infer_normalize(ctx)?;
    let x = ctx.input(0);
    let h = x.shape[x.rank() - 1];
    ctx.same_dtype(0, 1)?;
    if ctx.input(1).shape != [h] {
        return Err(OpError::at(
            1,
            format!(
                "{} {} must be [{h}] (one per feature of x {})",
                ctx.arg_name(1),
                fmt_dims(&ctx.input(1).shape),
                fmt_dims(&x.shape)
            ),
        ));
    }
    expect_like_x(ctx, 2)?;
    // dx, then dw (and db for the layer norm), each of w's type.
    let param_grads = if ctx.op == Op::LayerNormAffineGrad {
        2
    } else {
        1
    };
    out.extend(std::iter::repeat_n(ctx.input(1).clone(), param_grads));
    Ok(out)
}

fn infer_normalize_affine(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let out = infer_normalize(ctx)?;
    let x = ctx.input(0);
    for i in 1..ctx.inputs.len() {
        ctx.same_dtype(0, i)?;
        let p = ctx.input(i);
        if !broadcasts_to(&p.shape, &x.shape) {
            return Err(OpError::at(
                i,
                format!(
                    "{} {} does not broadcast to x {}",
                    ctx.arg_name(i),
                    fmt_dims(&p.shape),
                    fmt_dims(&x.shape)
                ),
            ));
        }
    }
    Ok(out)
}

fn infer_batch_norm(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    check_eps(ctx)?;
    let momentum = ctx.attrs.float("momentum")?;
    if !(0.0..=1.0).contains(&momentum) {
        return Err(OpError::new(format!(
            "`momentum` must be in [0, 1], got {momentum:?}"
        )));
    }
    ctx.float_input(0)?;
    ctx.expect_min_rank(0, 2, "[N, C, ...]")?;
    let c = ctx.input(0).shape[1];
    for i in 1..3 {
        ctx.same_dtype(0, i)?;
        if ctx.input(i).shape != [c] {
            return Err(OpError::at(
                i,
                format!(
                    "{} must be [{c}] (one per channel of x), got {}",
                    ctx.arg_name(i),
                    fmt_dims(&ctx.input(i).shape)
                ),
            ));
        }
    }
    Ok(vec![ctx.input(0).clone()])
}

#[cfg(test)]
mod tests {
    use crate::ops::family::testing::*;
    use crate::ops::{Attrs, DType, Op, PrecisionClass};

    #[test]
    fn last_dim_norms() {
        let x = [f32t(&[2, 8])];
        assert_eq!(ok(Op::RmsNorm, Attrs::new(), &x), f32t(&[2, 8]));
        let a = Attrs::new().with("eps", 1e-6);
        assert_eq!(ok(Op::LayerNorm, a, &x), f32t(&[2, 8]));
        let a = Attrs::new().with("eps", -1.0);
        assert_eq!(
            err(Op::RmsNorm, a, &x).message,
            "rms_norm: `eps` must be a finite non-negative number, got -1.0"
        );
        assert_eq!(
            err(Op::LayerNorm, Attrs::new(), &[f32t(&[])]).message,
            "layer_norm: expects x of rank at least 1 ([..., H]), but x is f32[]"
        );
        assert!(err(Op::RmsNorm, Attrs::new(), &[t(DType::I32, &[3])])
            .message
            .contains("expects a float tensor"));
        assert_eq!(Op::LayerNorm.spec().precision, PrecisionClass::KeepF32);
    }

    #[test]
    fn norm_grads() {
        let x = [f32t(&[2, 8]), f32t(&[2, 8])];
        assert_eq!(ok(Op::RmsNormGrad, Attrs::new(), &x), f32t(&[2, 8]));
        assert_eq!(ok(Op::LayerNormGrad, Attrs::new(), &x), f32t(&[2, 8]));
        let e = err(
            Op::LayerNormGrad,
            Attrs::new(),
            &[f32t(&[2, 8]), f32t(&[8])],
        );
        assert_eq!(
            e.message,
            "layer_norm_grad: dy [8] must have the shape of x [2, 8]"
        );
        assert_eq!(e.input, Some(1));
    }

    #[test]
    fn fused_affine_grads() {
        let ins = [f32t(&[2, 3, 8]), f32t(&[8]), f32t(&[2, 3, 8])];
        let out = crate::ops::infer(Op::RmsNormScaleGrad, &Attrs::new(), &ins).unwrap();
        assert_eq!(out, [f32t(&[2, 3, 8]), f32t(&[8])]);
        let out = crate::ops::infer(Op::LayerNormAffineGrad, &Attrs::new(), &ins).unwrap();
        assert_eq!(out, [f32t(&[2, 3, 8]), f32t(&[8]), f32t(&[8])]);
        let e = err(
            Op::RmsNormScaleGrad,
            Attrs::new(),
            &[f32t(&[2, 8]), f32t(&[1, 8]), f32t(&[2, 8])],
        );
        assert_eq!(
            e.message,
            "rms_norm_scale_grad: w [1, 8] must be [8] (one per feature of x [2, 8])"
        );
        assert_eq!(e.input, Some(1));
        let e = err(
            Op::LayerNormAffineGrad,
            Attrs::new(),
            &[f32t(&[2, 8]), f32t(&[8]), f32t(&[8])],
        );
        assert_eq!(e.input, Some(2));
    }

    #[test]
    fn fused_affine_forms() {
        let out = ok(Op::RmsNormScale, Attrs::new(), &[f32t(&[2, 8]), f32t(&[8])]);
        assert_eq!(out, f32t(&[2, 8]));
        let out = ok(
            Op::LayerNormAffine,
            Attrs::new(),
            &[f32t(&[2, 8]), f32t(&[8]), f32t(&[1, 8])],
        );
        assert_eq!(out, f32t(&[2, 8]));
        let e = err(
            Op::LayerNormAffine,
            Attrs::new(),
            &[f32t(&[2, 8]), f32t(&[8]), f32t(&[4])],
        );
        assert_eq!(
            e.message,
            "layer_norm_affine: b [4] does not broadcast to x [2, 8]"
        );
        assert_eq!(e.input, Some(2));
        let e = err(
            Op::RmsNormScale,
            Attrs::new(),
            &[f32t(&[2, 8]), t(DType::BF16, &[8])],
        );
        assert_eq!(
            e.message,
            "rms_norm_scale: dtypes differ: x has f32, w has bf16"
        );
    }

    #[test]
    fn batch_norm() {
        let x = f32t(&[2, 3, 4, 4]);
        let out = ok(
            Op::BatchNorm,
            Attrs::new(),
            &[x.clone(), f32t(&[3]), f32t(&[3])],
        );
        assert_eq!(out, x);
        let e = err(
            Op::BatchNorm,
            Attrs::new(),
            &[x.clone(), f32t(&[3]), f32t(&[4])],
        );
        assert_eq!(
            e.message,
            "batch_norm: var must be [3] (one per channel of x), got [4]"
        );
        assert_eq!(e.input, Some(2));
        let e = err(
            Op::BatchNorm,
            Attrs::new(),
            &[f32t(&[3]), f32t(&[3]), f32t(&[3])],
        );
        assert!(e.message.contains("rank at least 2 ([N, C, ...])"));
    }
}
