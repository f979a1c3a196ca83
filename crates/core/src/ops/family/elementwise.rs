//! Elementwise ops: the scalar literal, binary arithmetic, unary math, `cast`, `dropout`.

use crate::ops::attrs::{AttrKind, AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::grad::unbroadcast;
use crate::ops::shape::{broadcast, fmt_dims};
use crate::ops::spec::{
    Arity, CostRule, Emitter, GradCall, GradRule, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{DType, Op, TensorType};

/// `constant`: a scalar literal of a given dtype.
pub const CONSTANT: OpSpec = OpSpec {
    inputs: &[],
    arity: Arity::Exact(0),
    attrs: &[
        AttrSpec::required("value", AttrKind::Float),
        AttrSpec::required("dtype", AttrKind::DType),
    ],
    infer: infer_constant,
    cost: CostRule::PerOutput(0),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: Some(grad_none),
    shard: None,
};

/// An elementwise binary op that promotes its operands' dtypes and broadcasts their shapes,
/// costing `flops` per output element, differentiated by `grad`.
pub const fn binary(flops: u64, grad: GradRule) -> OpSpec {
    OpSpec {
        inputs: &["a", "b"],
        arity: Arity::Exact(2),
        attrs: &[],
        infer: infer_binary,
        cost: CostRule::PerOutput(flops),
        precision: PrecisionClass::FollowInput,
        elementwise: true,
        in_place: true,
        grad: Some(grad),
        shard: None,
    }
}

/// [`binary`] on the mixed-precision keep-f32 list (`pow`).
pub const fn binary_keep_f32(flops: u64, grad: GradRule) -> OpSpec {
    OpSpec {
        precision: PrecisionClass::KeepF32,
        ..binary(flops, grad)
    }
}

const fn unary(
    flops: u64,
    infer: fn(&OpCtx) -> Result<Vec<TensorType>, OpError>,
    grad: GradRule,
) -> OpSpec {
    OpSpec {
        inputs: &["x"],
        arity: Arity::Exact(1),
        attrs: &[],
        infer,
        cost: CostRule::PerOutput(flops),
        precision: PrecisionClass::FollowInput,
        elementwise: true,
        in_place: true,
        grad: Some(grad),
        shard: None,
    }
}

/// A unary op defined on any numeric dtype (`neg`, `abs`).
pub const fn unary_numeric(flops: u64, grad: GradRule) -> OpSpec {
    unary(flops, infer_unary_numeric, grad)
}

/// A unary op defined on floats only (`tanh`, `gelu`, ...).
pub const fn unary_float(flops: u64, grad: GradRule) -> OpSpec {
    unary(flops, infer_unary_float, grad)
}

/// [`unary_float`] on the mixed-precision keep-f32 list (`exp`, `log`, `rsqrt`, ...).
pub const fn unary_keep_f32(flops: u64, grad: GradRule) -> OpSpec {
    OpSpec {
        precision: PrecisionClass::KeepF32,
        ..unary_float(flops, grad)
    }
}

/// `relu`: numeric, and on MindSpore's O1 white list.
pub const RELU: OpSpec = OpSpec {
    precision: PrecisionClass::LowPrecisionFriendly,
    ..unary_numeric(1, grad_relu)
};

/// `cast`: the input with another dtype.
pub const CAST: OpSpec = OpSpec {
    attrs: &[AttrSpec::required("dtype", AttrKind::DType)],
    ..unary(1, infer_cast, grad_cast)
};

/// `dropout(x)`: the identity (inference). `dropout(x, seed)` with an integer scalar `seed` is
/// training mode, as PyTorch's `model.train()`: each element is zeroed with probability `p`
/// and the kept ones scaled by `1 / (1 − p)`, the mask drawn by [`dropout_keeps`] from
/// (`seed`, the op's `salt` (0 when absent), the element's index) — no hidden state, so a mask is the same on
/// every rank and after a resume. Not fusable (training draws random numbers).
///
/// With `axis`, `ranks` and `dim` (a sharding pass sets them), `x` is one rank's block of a
/// tensor split into `ranks` equal blocks along `dim` — block i on the rank at place i of mesh
/// axis `axis` — and each element's draw is that of its index in the whole tensor, so the
/// ranks' masks together are one device's mask.
pub const DROPOUT: OpSpec = OpSpec {
    inputs: &["x", "seed"],
    arity: Arity::Between(1, 2),
    attrs: &[
        AttrSpec::defaulted("p", ConstAttr::Float(0.5)),
        AttrSpec::optional("salt", AttrKind::Int),
        AttrSpec::optional("axis", AttrKind::Str),
        AttrSpec::optional("ranks", AttrKind::Int),
        AttrSpec::optional("dim", AttrKind::Int),
    ],
    elementwise: false,
    in_place: false,
    ..unary(1, infer_dropout, grad_dropout)
};

/// Whether training-mode `dropout` keeps element `index` of the op salted `salt` under `seed`:
/// a counter-based draw (SplitMix64's finaliser of the key and the counter), uniform on 2⁻²⁴
/// steps like PyTorch's f32 `bernoulli_`, kept when the draw is at least `p`.
pub fn dropout_keeps(seed: i64, salt: i64, index: u64, p: f64) -> bool {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    let key = mix((seed as u64) ^ mix((salt as u64).wrapping_add(GOLDEN)));
    let bits = mix(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
    let draw = (bits >> 40) as f64 / (1u64 << 24) as f64;
    draw >= p
}

fn infer_constant(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let value = ctx.attrs.float("value")?;
    let dtype = ctx.attrs.dtype("dtype")?;
    let fits = match dtype {
        d if d.is_float() => true,
        DType::Bool => value == 0.0 || value == 1.0,
        // Integers: whole and within range (the bounds are exact powers of two in f64).
        DType::I32 => value.fract() == 0.0 && (-2f64.powi(31)..2f64.powi(31)).contains(&value),
        _ => value.fract() == 0.0 && (-2f64.powi(63)..2f64.powi(63)).contains(&value),
    };
    if !fits {
        return Err(OpError::new(format!(
            "value {value:?} is not representable in {dtype}"
        )));
    }
    Ok(vec![TensorType::scalar(dtype)])
}

fn infer_binary(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let (a, b) = (ctx.input(0), ctx.input(1));
    let shape = broadcast(&a.shape, &b.shape).ok_or_else(|| {
        OpError::at(
            1,
            format!(
                "shapes do not broadcast: a is {}, b is {}",
                fmt_dims(&a.shape),
                fmt_dims(&b.shape)
            ),
        )
        .with_help("aligned from the right, each pair of dims must be equal or contain a 1")
    })?;
    Ok(vec![TensorType::new(
        DType::promote(a.dtype, b.dtype),
        shape,
    )])
}

fn infer_unary_numeric(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.numeric_input(0)?;
    Ok(vec![ctx.input(0).clone()])
}

fn infer_unary_float(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.float_input(0)?;
    Ok(vec![ctx.input(0).clone()])
}

fn infer_cast(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dtype = ctx.attrs.dtype("dtype")?;
    Ok(vec![TensorType::new(dtype, ctx.input(0).shape.clone())])
}

fn infer_dropout(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let p = ctx.attrs.float("p")?;
    if !(0.0..1.0).contains(&p) {
        return Err(OpError::new(format!("`p` must be in [0, 1), got {p:?}")));
    }
    let block = [
        ctx.attrs.opt_str("axis")?.is_some(),
        ctx.attrs.opt_int("ranks")?.is_some(),
        ctx.attrs.opt_int("dim")?.is_some(),
    ];
    if block.contains(&true) {
        if block.contains(&false) {
            return Err(OpError::new(
                "a dropout over a block of a split tensor needs `axis`, `ranks` and `dim` together",
            ));
        }
        ctx.axis("dim", 0)?;
        if ctx.attrs.int("ranks")? < 1 {
            return Err(OpError::new("`ranks` must be at least 1"));
        }
    }
    if ctx.inputs.len() == 2 {
        ctx.int_input(1)?;
        if ctx.input(1).rank() != 0 {
            return Err(OpError::at(
                1,
                format!("expects a scalar seed, but {}", ctx.describe(1)),
            ));
        }
    }
    infer_unary_float(&OpCtx {
        inputs: &ctx.inputs[..1],
        ..*ctx
    })
}

// Gradient rules. Each returns one cotangent per input; `unbroadcast` sums a binary op's
// cotangent back to each operand's shape and dtype (none for integer operands).

/// The result of a rule for an op whose inputs get no gradient (none, for `constant`).
fn grad_none(_: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    Ok(vec![None; call.inputs.len()])
}

/// `(a, b) -> (da, db)`: the per-operand products `dy * ∂y/∂a` and `dy * ∂y/∂b`, before
/// unbroadcasting (`None`: that operand gets no gradient).
fn binary_grads(
    em: &mut dyn Emitter,
    call: &GradCall,
    parts: impl FnOnce(&mut dyn Emitter, Handle, Handle, Handle) -> Result<[Handle; 2], OpError>,
) -> Result<Vec<Option<Handle>>, OpError> {
    let (a, b) = (call.x(0), call.x(1));
    let (ta, tb) = (em.ty(a)?, em.ty(b)?);
    let dy = call.dy()?;
    let [ga, gb] = parts(em, a, b, dy)?;
    Ok(vec![unbroadcast(em, ga, &ta)?, unbroadcast(em, gb, &tb)?])
}

/// `add`: `dy`, `dy`.
pub fn grad_add(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    binary_grads(em, call, |_, _, _, dy| Ok([dy, dy]))
}

/// `sub`: `dy`, `-dy`.
pub fn grad_sub(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    binary_grads(em, call, |em, _, _, dy| Ok([dy, em.neg(dy)?]))
}

/// `mul`: `dy * b`, `dy * a`.
pub fn grad_mul(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    binary_grads(em, call, |em, a, b, dy| {
        Ok([em.mul(dy, b)?, em.mul(dy, a)?])
    })
}

/// `div`: `dy / b`, `-dy * a / b²` (PyTorch's formula).
pub fn grad_div(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    binary_grads(em, call, |em, a, b, dy| {
        let ga = em.div(dy, b)?;
        let num = em.mul(dy, a)?;
        let b2 = em.mul(b, b)?;
        let q = em.div(num, b2)?;
        Ok([ga, em.neg(q)?])
    })
}

/// `pow`: `dy * b * a^(b-1)`, `dy * a^b * ln a`.
pub fn grad_pow(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let y = call.y(0);
    binary_grads(em, call, |em, a, b, dy| {
        let one = em.scalar(1.0, em.ty(b)?.dtype)?;
        let bm1 = em.sub(b, one)?;
        let p = em.op1(Op::Pow, Attrs::new(), &[a, bm1])?;
        let db = em.mul(dy, b)?;
        let ga = em.mul(db, p)?;
        let ln = em.unary(Op::Log, a)?;
        let yl = em.mul(y, ln)?;
        Ok([ga, em.mul(dy, yl)?])
    })
}

/// `maximum` / `minimum`: each operand's share `w` of `dy` is 1 where it wins, 0 where it
/// loses and 1/2 on ties (PyTorch splits a tie evenly): `w_a = (1 ± sign(a - b)) / 2`,
/// `w_b = 1 - w_a`, with `+` for `maximum`.
fn grad_extremum(
    em: &mut dyn Emitter,
    call: &GradCall,
    direction: f64,
) -> Result<Vec<Option<Handle>>, OpError> {
    binary_grads(em, call, |em, a, b, dy| {
        let d = em.sub(a, b)?;
        let s = em.unary(Op::Sign, d)?;
        let s = em.scale(s, 0.5 * direction)?;
        let half = em.scalar(0.5, em.ty(s)?.dtype)?;
        let wa = em.add(half, s)?;
        let wb = em.sub(half, s)?;
        Ok([em.mul(dy, wa)?, em.mul(dy, wb)?])
    })
}

/// `maximum`: see [`grad_extremum`].
pub fn grad_maximum(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    grad_extremum(em, call, 1.0)
}

/// `minimum`: see [`grad_extremum`].
pub fn grad_minimum(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    grad_extremum(em, call, -1.0)
}

/// A unary rule from `dy`, `x` and `y` to `dx`; integer inputs get no gradient.
fn unary_grad(
    em: &mut dyn Emitter,
    call: &GradCall,
    dx: impl FnOnce(&mut dyn Emitter, Handle, Handle, Handle) -> Result<Handle, OpError>,
) -> Result<Vec<Option<Handle>>, OpError> {
    let x = call.x(0);
    if !em.ty(x)?.dtype.is_float() {
        return Ok(vec![None]);
    }
    let dy = call.dy()?;
    Ok(vec![Some(dx(em, dy, x, call.y(0))?)])
}

/// `dropout`: `dy` in inference; in training the same mask applied to `dy` — the op itself
/// on `dy` with the same seed, salt and `p`, which redraws the mask from its counter instead
/// of saving it. The seed gets no gradient.
pub fn grad_dropout(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    match call.inputs {
        [_, seed] => {
            let dy = call.dy()?;
            let dx = em.op1(Op::Dropout, call.attrs.clone(), &[dy, *seed])?;
            Ok(vec![Some(dx), None])
        }
        _ => unary_grad(em, call, |_, dy, _, _| Ok(dy)),
    }
}

/// `neg`: `-dy`.
pub fn grad_neg(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, _| em.neg(dy))
}

/// `exp`: `dy * y`.
pub fn grad_exp(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| em.mul(dy, y))
}

/// `log`: `dy / x`.
pub fn grad_log(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| em.div(dy, x))
}

/// `sqrt`: `dy / (2 y)`.
pub fn grad_sqrt(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| {
        let y2 = em.scale(y, 2.0)?;
        em.div(dy, y2)
    })
}

/// `rsqrt`: `-dy * y³ / 2`.
pub fn grad_rsqrt(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| {
        let y2 = em.mul(y, y)?;
        let y3 = em.mul(y2, y)?;
        let g = em.mul(dy, y3)?;
        em.scale(g, -0.5)
    })
}

/// `reciprocal`: `-dy * y²`.
pub fn grad_reciprocal(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| {
        let y2 = em.mul(y, y)?;
        let g = em.mul(dy, y2)?;
        em.neg(g)
    })
}

/// `abs`: `dy * sign(x)` (0 at 0, as PyTorch).
pub fn grad_abs(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| {
        let s = em.unary(Op::Sign, x)?;
        em.mul(dy, s)
    })
}

/// `sign`: zero almost everywhere, so no gradient flows back (as PyTorch's zeros).
pub fn grad_sign(_: &mut dyn Emitter, _: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    Ok(vec![None])
}

/// `tanh`: `dy * (1 - y²)`.
pub fn grad_tanh(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| {
        let y2 = em.mul(y, y)?;
        let one = em.scalar(1.0, em.ty(y)?.dtype)?;
        let d = em.sub(one, y2)?;
        em.mul(dy, d)
    })
}

/// `sigmoid`: `dy * y * (1 - y)`.
pub fn grad_sigmoid(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| {
        let one = em.scalar(1.0, em.ty(y)?.dtype)?;
        let c = em.sub(one, y)?;
        let d = em.mul(y, c)?;
        em.mul(dy, d)
    })
}

/// `relu`: `dy` where `y > 0`, else 0 (0 at 0, as PyTorch): `dy * sign(y)`.
pub fn grad_relu(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, _, y| {
        let s = em.unary(Op::Sign, y)?;
        em.mul(dy, s)
    })
}

/// `gelu` (exact): `dy * (Φ(x) + x φ(x))`, `Φ(x) = (1 + erf(x/√2))/2`,
/// `φ(x) = e^(-x²/2)/√(2π)`.
pub fn grad_gelu(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| {
        let dtype = em.ty(x)?.dtype;
        let xs = em.scale(x, std::f64::consts::FRAC_1_SQRT_2)?;
        let e = em.unary(Op::Erf, xs)?;
        let half = em.scalar(0.5, dtype)?;
        let e = em.scale(e, 0.5)?;
        let cdf = em.add(half, e)?;
        let x2 = em.mul(x, x)?;
        let x2 = em.scale(x2, -0.5)?;
        let pdf = em.unary(Op::Exp, x2)?;
        let pdf = em.scale(pdf, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        let xp = em.mul(x, pdf)?;
        let d = em.add(cdf, xp)?;
        em.mul(dy, d)
    })
}

/// `gelu_tanh`: with `u = c (x + 0.044715 x³)`, `t = tanh u`, `c = √(2/π)`:
/// `dy * ((1 + t)/2 + x (1 - t²) c (1 + 3·0.044715 x²) / 2)`.
pub fn grad_gelu_tanh(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| {
        let dtype = em.ty(x)?.dtype;
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let one = em.scalar(1.0, dtype)?;
        let x2 = em.mul(x, x)?;
        let x3 = em.mul(x2, x)?;
        let k = em.scale(x3, 0.044715)?;
        let inner = em.add(x, k)?;
        let u = em.scale(inner, c)?;
        let t = em.unary(Op::Tanh, u)?;
        let first = em.add(one, t)?;
        let first = em.scale(first, 0.5)?;
        let t2 = em.mul(t, t)?;
        let sech2 = em.sub(one, t2)?;
        let du = em.scale(x2, 3.0 * 0.044715)?;
        let du = em.add(one, du)?;
        let du = em.scale(du, 0.5 * c)?;
        let second = em.mul(sech2, du)?;
        let second = em.mul(x, second)?;
        let d = em.add(first, second)?;
        em.mul(dy, d)
    })
}

/// `silu`: `dy * s (1 + x (1 - s))` with `s = sigmoid(x)`.
pub fn grad_silu(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| {
        let s = em.unary(Op::Sigmoid, x)?;
        let one = em.scalar(1.0, em.ty(x)?.dtype)?;
        let c = em.sub(one, s)?;
        let xc = em.mul(x, c)?;
        let f = em.add(one, xc)?;
        let d = em.mul(s, f)?;
        em.mul(dy, d)
    })
}

/// `erf`: `dy * 2/√π e^(-x²)`.
pub fn grad_erf(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| {
        let x2 = em.mul(x, x)?;
        let nx2 = em.neg(x2)?;
        let e = em.unary(Op::Exp, nx2)?;
        let d = em.scale(e, std::f64::consts::FRAC_2_SQRT_PI)?;
        em.mul(dy, d)
    })
}

/// `softplus` (beta 1, threshold 20): `dy * sigmoid(x)`, and `dy` above 20 where the op is
/// the identity: `s + m (1 - s)` with the mask `m = relu(sign(x - 20))`.
pub fn grad_softplus(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    unary_grad(em, call, |em, dy, x, _| {
        let dtype = em.ty(x)?.dtype;
        let s = em.unary(Op::Sigmoid, x)?;
        let twenty = em.scalar(20.0, dtype)?;
        let over = em.sub(x, twenty)?;
        let m = em.unary(Op::Sign, over)?;
        let m = em.unary(Op::Relu, m)?;
        let one = em.scalar(1.0, dtype)?;
        let rest = em.sub(one, s)?;
        let mr = em.mul(m, rest)?;
        let d = em.add(s, mr)?;
        em.mul(dy, d)
    })
}

/// `cast`: the cotangent cast back to the input's dtype; an integer or bool input gets none.
fn grad_cast(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let x = call.x(0);
    let dtype = em.ty(x)?.dtype;
    if !dtype.is_float() {
        return Ok(vec![None]);
    }
    let dy = call.dy()?;
    Ok(vec![Some(em.cast(dy, dtype)?)])
}

#[cfg(test)]
mod tests {
    use crate::ops::family::testing::*;
    use crate::ops::{cost, Attrs, DType, Op, PrecisionClass};

    #[test]
    fn constant() {
        let a = Attrs::new().with("value", 0.5).with("dtype", DType::BF16);
        assert_eq!(ok(Op::Constant, a, &[]), t(DType::BF16, &[]));
        let a = Attrs::new().with("value", 3i64).with("dtype", DType::I32);
        assert_eq!(ok(Op::Constant, a, &[]), t(DType::I32, &[]));
        let a = Attrs::new().with("value", 0.5).with("dtype", DType::I64);
        assert_eq!(
            err(Op::Constant, a, &[]).message,
            "constant: value 0.5 is not representable in i64"
        );
        let a = Attrs::new()
            .with("value", 2f64.powi(31))
            .with("dtype", DType::I32);
        assert!(err(Op::Constant, a, &[])
            .message
            .contains("not representable in i32"));
        let a = Attrs::new().with("value", 2.0).with("dtype", DType::Bool);
        assert!(err(Op::Constant, a, &[]).message.contains("in bool"));
        let a = Attrs::new()
            .with("value", f64::NEG_INFINITY)
            .with("dtype", DType::F16);
        assert_eq!(ok(Op::Constant, a, &[]), t(DType::F16, &[]));
        let e = err(Op::Constant, Attrs::new().with("value", 1.0), &[]);
        assert_eq!(e.message, "constant: missing attribute `dtype` (a dtype)");
    }

    #[test]
    fn binary_broadcasts_and_promotes() {
        let out = ok(
            Op::Add,
            Attrs::new(),
            &[t(DType::F16, &[4, 1, 3]), t(DType::BF16, &[5, 1])],
        );
        assert_eq!(out, t(DType::F32, &[4, 5, 3]));
        let out = ok(Op::Mul, Attrs::new(), &[t(DType::I32, &[2]), f32t(&[])]);
        assert_eq!(out, f32t(&[2]));
        let e = err(Op::Sub, Attrs::new(), &[f32t(&[2, 3]), f32t(&[4, 3])]);
        assert_eq!(
            e.message,
            "sub: shapes do not broadcast: a is [2, 3], b is [4, 3]"
        );
        assert_eq!(e.input, Some(1));
        assert!(e.help.is_some());
    }

    #[test]
    fn unary_dtype_rules() {
        assert_eq!(
            ok(Op::Neg, Attrs::new(), &[t(DType::I32, &[3])]),
            t(DType::I32, &[3])
        );
        assert_eq!(ok(Op::Relu, Attrs::new(), &[f32t(&[3])]), f32t(&[3]));
        let e = err(Op::Exp, Attrs::new(), &[t(DType::I64, &[3])]);
        assert_eq!(e.message, "exp: expects a float tensor, but x is i64[3]");
        assert_eq!(
            e.help.as_deref(),
            Some("cast it first, e.g. cast(x, dtype: f32)")
        );
        let e = err(Op::Abs, Attrs::new(), &[t(DType::Bool, &[3])]);
        assert_eq!(e.message, "abs: expects a numeric tensor, but x is bool[3]");
    }

    #[test]
    fn cast_and_dropout() {
        let out = ok(
            Op::Cast,
            Attrs::new().with("dtype", DType::F16),
            &[f32t(&[2, 2])],
        );
        assert_eq!(out, t(DType::F16, &[2, 2]));
        assert_eq!(ok(Op::Dropout, Attrs::new(), &[f32t(&[2])]), f32t(&[2]));
        let e = err(Op::Dropout, Attrs::new().with("p", 1.0), &[f32t(&[2])]);
        assert_eq!(e.message, "dropout: `p` must be in [0, 1), got 1.0");
        let e = err(Op::Dropout, Attrs::new().with("p", f64::NAN), &[f32t(&[2])]);
        assert!(e.message.contains("got NaN"));
        // Training mode: an integer scalar seed.
        let seeded = [f32t(&[2]), t(DType::I64, &[])];
        assert_eq!(ok(Op::Dropout, Attrs::new(), &seeded), f32t(&[2]));
        // A rank's block of a split tensor: all three of axis, ranks, dim, dim in range.
        let block = Attrs::new().with("axis", "tp").with("ranks", 2i64);
        let e = err(Op::Dropout, block.clone(), &seeded);
        assert!(
            e.message.contains("`axis`, `ranks` and `dim` together"),
            "{}",
            e.message
        );
        assert_eq!(
            ok(Op::Dropout, block.clone().with("dim", 0i64), &seeded),
            f32t(&[2])
        );
        assert!(err(Op::Dropout, block.with("dim", 1i64), &seeded)
            .message
            .contains("dim"));
        let e = err(Op::Dropout, Attrs::new(), &[f32t(&[2]), f32t(&[])]);
        assert!(
            e.message.contains("expects an integer tensor"),
            "{}",
            e.message
        );
        let e = err(
            Op::Dropout,
            Attrs::new(),
            &[f32t(&[2]), t(DType::I64, &[1])],
        );
        assert!(e.message.contains("expects a scalar seed"), "{}", e.message);
    }

    #[test]
    fn classes_follow_mindspore_lists() {
        use PrecisionClass::*;
        for (op, class) in [
            (Op::Relu, LowPrecisionFriendly),
            (Op::Exp, KeepF32),
            (Op::Log, KeepF32),
            (Op::Pow, KeepF32),
            (Op::Rsqrt, KeepF32),
            (Op::Reciprocal, KeepF32),
            (Op::Add, FollowInput),
            (Op::Gelu, FollowInput),
        ] {
            assert_eq!(op.spec().precision, class, "{op}");
        }
        assert!(Op::Silu.spec().elementwise && !Op::Dropout.spec().elementwise);
        assert_eq!(Op::Tanh.spec().flops_per_element(), Some(4));
        assert_eq!(Op::Dropout.spec().flops_per_element(), None);
    }

    #[test]
    fn transcendental_costs_more() {
        let x = [f32t(&[10])];
        let flops = |op| cost(op, &Attrs::new(), &x).unwrap().flops;
        assert_eq!(flops(Op::Neg), 10);
        assert_eq!(flops(Op::Gelu), 80);
        assert!(flops(Op::Exp) > flops(Op::Neg));
    }
}
