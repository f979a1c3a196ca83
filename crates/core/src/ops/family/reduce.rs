//! Reductions (`sum`, `mean`, `max`) and the normalising reductions `softmax`, `log_softmax`.

use crate::ops::attrs::{AttrKind, AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::{normalize_axes, normalize_axis};
use crate::ops::spec::{
    Arity, CostRule, Emitter, GradCall, GradRule, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{Op, TensorType};

const REDUCTION_ATTRS: [AttrSpec; 2] = [
    AttrSpec::optional("axes", AttrKind::Ints),
    AttrSpec::defaulted("keepdim", ConstAttr::Bool(false)),
];

/// A reduction over `axes` (absent: every axis; `[]`: none), keeping reduced dims as 1 when
/// `keepdim`. One flop per input element.
pub const fn reduction(precision: PrecisionClass, grad: GradRule) -> OpSpec {
    OpSpec {
        inputs: &["x"],
        arity: Arity::Exact(1),
        attrs: &REDUCTION_ATTRS,
        infer: infer_reduction,
        cost: CostRule::PerInput(1),
        precision,
        elementwise: false,
        in_place: false,
        grad: Some(grad),
        shard: None,
    }
}

/// `softmax` (and, with its own gradient, `log_softmax`) over `axis` (default -1): max, subtract, exp, sum, divide —
/// about 8 flops per element; on the keep-f32 list.
pub const SOFTMAX: OpSpec = OpSpec {
    inputs: &["x"],
    arity: Arity::Exact(1),
    attrs: &[AttrSpec::defaulted("axis", ConstAttr::Int(-1))],
    infer: infer_softmax,
    cost: CostRule::PerInput(8),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: true,
    grad: Some(grad_softmax),
    shard: None,
};

/// `log_softmax`: [`SOFTMAX`]'s rules but its own gradient.
pub const LOG_SOFTMAX: OpSpec = OpSpec {
    grad: Some(grad_log_softmax),
    ..SOFTMAX
};

/// The axes a reduction of a rank-`rank` tensor reduces, ascending: all of them when `axes`
/// is absent.
pub fn reduced_axes(attrs: &Attrs, rank: usize) -> Result<Vec<usize>, OpError> {
    match attrs.opt_ints("axes")? {
        None => Ok((0..rank).collect()),
        Some(axes) => {
            let mut v =
                normalize_axes(&axes, rank).map_err(|m| OpError::new(format!("axes: {m}")))?;
            v.sort_unstable();
            Ok(v)
        }
    }
}

fn infer_reduction(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let dtype = match ctx.op {
        Op::Mean => ctx.float_input(0)?,
        Op::Sum => ctx.numeric_input(0)?,
        _ => x.dtype,
    };
    let axes = reduced_axes(ctx.attrs, x.rank())?;
    if ctx.op == Op::Max {
        if let Some(&a) = axes.iter().find(|&&a| x.shape[a] == 0) {
            return Err(OpError::at(
                0,
                format!("cannot take the max over axis {a}, which is empty"),
            ));
        }
    }
    let keepdim = ctx.attrs.bool("keepdim")?;
    let shape = x
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect::<Vec<_>>();
    Ok(vec![TensorType::new(dtype, shape)])
}

fn infer_softmax(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.float_input(0)?;
    ctx.axis("axis", 0)?;
    Ok(vec![ctx.input(0).clone()])
}

// Gradient rules.

/// The axes a reduction reduced, and `dy` shaped to broadcast back to the input (reduced
/// dims kept as 1 unless they lead), for a float input (`None` for an integer one, which gets no gradient).
fn kept_cotangent(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Option<(TensorType, Vec<usize>, Handle)>, OpError> {
    let t = em.ty(call.x(0))?;
    if !t.dtype.is_float() {
        return Ok(None);
    }
    let axes = reduced_axes(call.attrs, t.rank())?;
    let kept: Vec<i64> = (0..t.rank())
        .map(|i| if axes.contains(&i) { 1 } else { t.shape[i] })
        .collect();
    // Reduced leading axes need no reshape: the cotangent broadcasts back from the right.
    let leading = axes.iter().enumerate().all(|(i, &a)| i == a);
    let dy = call.dy()?;
    let dy = if leading && !call.attrs.bool("keepdim")? {
        dy
    } else {
        em.reshape(dy, &kept)?
    };
    Ok(Some((t, axes, dy)))
}

/// `sum`: `dy` broadcast back over the reduced axes.
pub fn grad_sum(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let Some((t, _, dy)) = kept_cotangent(em, call)? else {
        return Ok(vec![None]);
    };
    Ok(vec![Some(em.broadcast_to(dy, &t.shape)?)])
}

/// `mean`: `dy / n` broadcast back, `n` the number of elements averaged.
pub fn grad_mean(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let Some((t, axes, dy)) = kept_cotangent(em, call)? else {
        return Ok(vec![None]);
    };
    let n: i64 = axes.iter().map(|&a| t.shape[a]).product();
    let scaled = em.scale(dy, 1.0 / n as f64)?;
    Ok(vec![Some(em.broadcast_to(scaled, &t.shape)?)])
}

/// `max` (as `torch.amax`): `dy` shared evenly by the elements equal to the maximum,
/// `dy * m / sum(m)` with the mask `m = 1 - |sign(x - max)|`.
pub fn grad_max(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let Some((t, axes, dy)) = kept_cotangent(em, call)? else {
        return Ok(vec![None]);
    };
    let shape: Vec<i64> = em.ty(dy)?.shape;
    let y = em.reshape(call.y(0), &shape)?;
    let d = em.sub(call.x(0), y)?;
    let s = em.unary(Op::Sign, d)?;
    let a = em.unary(Op::Abs, s)?;
    let one = em.scalar(1.0, t.dtype)?;
    let mask = em.sub(one, a)?;
    let count = em.reduce(Op::Sum, mask, &axes, true)?;
    let share = em.div(dy, count)?;
    Ok(vec![Some(em.mul(mask, share)?)])
}

/// The normalised `axis` of a softmax's input.
fn softmax_axis(em: &mut dyn Emitter, call: &GradCall) -> Result<usize, OpError> {
    let rank = em.ty(call.x(0))?.rank();
    normalize_axis(call.attrs.int("axis")?, rank).map_err(|m| OpError::new(format!("axis: {m}")))
}

/// `softmax`: `y * (dy - sum(dy * y))`, the sum over the axis.
pub fn grad_softmax(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let axis = softmax_axis(em, call)?;
    let (y, dy) = (call.y(0), call.dy()?);
    let dot = em.sum_product(dy, y, &[axis])?;
    let c = em.sub(dy, dot)?;
    Ok(vec![Some(em.mul(y, c)?)])
}

/// `log_softmax`: `dy - exp(y) * sum(dy)`, the sum over the axis.
pub fn grad_log_softmax(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    let axis = softmax_axis(em, call)?;
    let (y, dy) = (call.y(0), call.dy()?);
    let total = em.reduce(Op::Sum, dy, &[axis], true)?;
    let p = em.unary(Op::Exp, y)?;
    let pt = em.mul(p, total)?;
    Ok(vec![Some(em.sub(dy, pt)?)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::family::testing::*;
    use crate::ops::{cost, DType};

    #[test]
    fn reductions() {
        let x = [f32t(&[2, 3, 4])];
        assert_eq!(ok(Op::Sum, Attrs::new(), &x), f32t(&[]));
        let a = Attrs::new().with("axes", vec![-1, 0]);
        assert_eq!(ok(Op::Mean, a, &x), f32t(&[3]));
        let a = Attrs::new().with("axes", vec![1]).with("keepdim", true);
        assert_eq!(ok(Op::Max, a, &x), f32t(&[2, 1, 4]));
        let a = Attrs::new().with("axes", vec![]);
        assert_eq!(ok(Op::Sum, a, &x), f32t(&[2, 3, 4]));
        let i = [t(DType::I32, &[5])];
        assert_eq!(ok(Op::Sum, Attrs::new(), &i), t(DType::I32, &[]));
        assert_eq!(
            err(Op::Mean, Attrs::new(), &i).message,
            "mean: expects a float tensor, but x is i32[5]"
        );
        let a = Attrs::new().with("axes", vec![1, -2]);
        assert_eq!(
            err(Op::Sum, a, &x).message,
            "sum: axes: axis -2 is listed twice (as 1)"
        );
        assert!(err(Op::Max, Attrs::new(), &[f32t(&[2, 0])])
            .message
            .contains("axis 1, which is empty"));
        let a = Attrs::new().with("axes", vec![0]);
        assert_eq!(ok(Op::Sum, a, &[f32t(&[0, 2])]), f32t(&[2]));
    }

    #[test]
    fn softmax() {
        assert_eq!(
            ok(Op::Softmax, Attrs::new(), &[f32t(&[2, 5])]),
            f32t(&[2, 5])
        );
        let a = Attrs::new().with("axis", 0);
        assert_eq!(ok(Op::LogSoftmax, a, &[f32t(&[2, 5])]), f32t(&[2, 5]));
        let a = Attrs::new().with("axis", 2);
        assert!(err(Op::Softmax, a, &[f32t(&[2, 5])])
            .message
            .contains("out of range"));
        assert!(err(Op::Softmax, Attrs::new(), &[f32t(&[])])
            .message
            .contains("rank-0"));
        let c = cost(Op::Softmax, &Attrs::new(), &[f32t(&[2, 5])]).unwrap();
        assert_eq!(c.flops, 80);
        assert_eq!(Op::Sum.spec().precision, PrecisionClass::KeepF32);
        assert_eq!(Op::Max.spec().precision, PrecisionClass::FollowInput);
    }
}
