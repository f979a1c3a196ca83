//! Elementwise ops: the scalar literal, binary arithmetic, unary math, `cast`, `dropout`.

use crate::ops::attrs::{AttrKind, AttrSpec, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::{broadcast, fmt_dims};
use crate::ops::spec::{Arity, CostRule, OpCtx, OpSpec, PrecisionClass};
use crate::ops::{DType, TensorType};

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
    grad: None,
    shard: None,
};

/// An elementwise binary op that promotes its operands' dtypes and broadcasts their shapes,
/// costing `flops` per output element.
pub const fn binary(flops: u64) -> OpSpec {
    OpSpec {
        inputs: &["a", "b"],
        arity: Arity::Exact(2),
        attrs: &[],
        infer: infer_binary,
        cost: CostRule::PerOutput(flops),
        precision: PrecisionClass::FollowInput,
        elementwise: true,
        in_place: true,
        grad: None,
        shard: None,
    }
}

/// [`binary`] on the mixed-precision keep-f32 list (`pow`).
pub const fn binary_keep_f32(flops: u64) -> OpSpec {
    OpSpec {
        precision: PrecisionClass::KeepF32,
        ..binary(flops)
    }
}

const fn unary(flops: u64, infer: fn(&OpCtx) -> Result<Vec<TensorType>, OpError>) -> OpSpec {
    OpSpec {
        inputs: &["x"],
        arity: Arity::Exact(1),
        attrs: &[],
        infer,
        cost: CostRule::PerOutput(flops),
        precision: PrecisionClass::FollowInput,
        elementwise: true,
        in_place: true,
        grad: None,
        shard: None,
    }
}

/// A unary op defined on any numeric dtype (`neg`, `abs`).
pub const fn unary_numeric(flops: u64) -> OpSpec {
    unary(flops, infer_unary_numeric)
}

/// A unary op defined on floats only (`tanh`, `gelu`, ...).
pub const fn unary_float(flops: u64) -> OpSpec {
    unary(flops, infer_unary_float)
}

/// [`unary_float`] on the mixed-precision keep-f32 list (`exp`, `log`, `rsqrt`, ...).
pub const fn unary_keep_f32(flops: u64) -> OpSpec {
    OpSpec {
        precision: PrecisionClass::KeepF32,
        ..unary_float(flops)
    }
}

/// `relu`: numeric, and on MindSpore's O1 white list.
pub const RELU: OpSpec = OpSpec {
    precision: PrecisionClass::LowPrecisionFriendly,
    ..unary_numeric(1)
};

/// `cast`: the input with another dtype.
pub const CAST: OpSpec = OpSpec {
    attrs: &[AttrSpec::required("dtype", AttrKind::DType)],
    ..unary(1, infer_cast)
};

/// `dropout`: identity in inference; not fusable (training draws random numbers).
pub const DROPOUT: OpSpec = OpSpec {
    attrs: &[AttrSpec::defaulted("p", ConstAttr::Float(0.5))],
    elementwise: false,
    ..unary(1, infer_dropout)
};

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
    infer_unary_float(ctx)
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
