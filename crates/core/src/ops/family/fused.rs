//! Ops only the fusion pass makes: `fused_matmul` and `fused_elementwise`. (The fused norms
//! share their rules with the plain ones in `norm.rs`.)

use super::matmul::{MatmulDims, TRANSPOSE_ATTRS};
use super::program::ElementwiseProgram;
use crate::ops::attrs::{AttrKind, AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::{broadcasts_to, fmt_dims};
use crate::ops::spec::{Arity, Cost, CostRule, OpCtx, OpSpec, PrecisionClass};
use crate::ops::{Op, TensorType, UnaryOp};

/// `fused_matmul`: `act(a @ b + bias) * multiplier`, the bias and the multiplier optional. The
/// multiplier (the product's shape and type) is SwiGLU's other half: `silu(x @ gate) * (x @
/// up)` runs the up product with the gate's activation as its multiplier, so the `mul` step
/// and its buffer go.
pub const FUSED_MATMUL: OpSpec = OpSpec {
    inputs: &["a", "b", "bias", "multiplier"],
    arity: Arity::Between(2, 4),
    attrs: &[
        TRANSPOSE_ATTRS[0],
        TRANSPOSE_ATTRS[1],
        AttrSpec::defaulted("has_bias", ConstAttr::Bool(false)),
        AttrSpec::defaulted("activation", ConstAttr::Str("none")),
        AttrSpec::defaulted("has_multiplier", ConstAttr::Bool(false)),
    ],
    infer: infer_fused_matmul,
    cost: CostRule::Custom(cost_fused_matmul),
    precision: PrecisionClass::LowPrecisionFriendly,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `fused_elementwise`: a chain of elementwise ops (see [`ElementwiseProgram`]) in one pass.
pub const FUSED_ELEMENTWISE: OpSpec = OpSpec {
    inputs: &["xs"],
    arity: Arity::AtLeast(1),
    attrs: &[AttrSpec::required("program", AttrKind::Str)],
    infer: infer_fused_elementwise,
    cost: CostRule::Custom(cost_fused_elementwise),
    precision: PrecisionClass::FollowInput,
    elementwise: true,
    in_place: true,
    grad: None,
    shard: None,
};

/// The activation a `fused_matmul` applies after the bias: none, or a unary op whose row in
/// the op table allows it as a matmul epilogue ([`UnaryOp::epilogue`]). The fusion pass, the
/// attribute and the GEMM kernel's epilogue all use this one type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Activation(Option<UnaryOp>);

impl Activation {
    /// No activation.
    pub const NONE: Activation = Activation(None);

    /// `op` as an epilogue, if its table row allows it.
    pub fn new(op: UnaryOp) -> Option<Activation> {
        op.epilogue().then_some(Activation(Some(op)))
    }

    /// The activation applying the registry op `op`, if it is an epilogue unary op.
    pub fn of_op(op: Op) -> Option<Activation> {
        op.unary().and_then(Activation::new)
    }

    /// The unary op it applies; `None` for no activation.
    pub fn unary(self) -> Option<UnaryOp> {
        self.0
    }

    /// The elementwise registry op it applies; `None` for no activation.
    pub fn op(self) -> Option<Op> {
        self.0.map(UnaryOp::op)
    }

    /// The attribute spelling: `"none"` or the op's name.
    pub fn name(self) -> &'static str {
        self.op().map_or("none", Op::name)
    }

    /// Every activation: none, then the epilogue ops in table order.
    pub fn all() -> impl Iterator<Item = Activation> {
        let ops = UnaryOp::ALL.iter().copied().filter_map(Activation::new);
        std::iter::once(Activation::NONE).chain(ops)
    }

    /// Reads the `activation` attribute (absent: none).
    pub fn of(attrs: &Attrs) -> Result<Activation, OpError> {
        let Some(name) = attrs.opt_str("activation")? else {
            return Ok(Activation::NONE);
        };
        Activation::all().find(|a| a.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Activation::all().map(Activation::name).collect();
            OpError::new(format!("unknown activation `{name}`"))
                .with_help(format!("expected one of: {}", names.join(", ")))
        })
    }
}

fn infer_fused_matmul(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dims = MatmulDims::of(ctx.input(0), ctx.input(1), ctx.attrs)?;
    let dtype = ctx.same_dtype(0, 1)?;
    ctx.float_input(0)?;
    Activation::of(ctx.attrs)?;
    let operands = FusedMatmulOperands {
        bias: ctx.attrs.bool("has_bias")?,
        multiplier: ctx.attrs.bool("has_multiplier")?,
    };
    if ctx.inputs.len() != operands.count() {
        return Err(OpError::new(format!(
            "`has_bias` is {} and `has_multiplier` {} but {} inputs are given",
            operands.bias,
            operands.multiplier,
            ctx.inputs.len()
        )));
    }
    let out = dims.output_shape();
    if let Some(at) = operands.bias_index() {
        ctx.same_dtype(0, at)?;
        let bias = &ctx.input(at).shape;
        if !broadcasts_to(bias, &out) {
            return Err(OpError::at(
                at,
                format!(
                    "bias {} does not broadcast to the product {}",
                    fmt_dims(bias),
                    fmt_dims(&out)
                ),
            ));
        }
    }
    if let Some(at) = operands.multiplier_index() {
        ctx.same_dtype(0, at)?;
        let multiplier = &ctx.input(at).shape;
        if *multiplier != out {
            return Err(OpError::at(
                at,
                format!(
                    "multiplier {} is not the product's shape {}",
                    fmt_dims(multiplier),
                    fmt_dims(&out)
                ),
            ));
        }
    }
    Ok(vec![TensorType::new(dtype, out)])
}

/// Which optional operands a `fused_matmul` takes and where they sit: after `a` and `b` the
/// bias, then the multiplier. The one reading of `has_bias` and `has_multiplier` for the op's
/// rules, its kernels and the tuner (a plain `matmul` has neither).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FusedMatmulOperands {
    /// Whether a bias is added.
    pub bias: bool,
    /// Whether the result is multiplied by a tensor of its shape.
    pub multiplier: bool,
}

impl FusedMatmulOperands {
    /// The operands `attrs` ask for; an unreadable flag reads as absent (the op's inference
    /// reports it).
    pub fn of(attrs: &Attrs) -> Self {
        let flag = |name| attrs.opt_bool(name).ok().flatten().unwrap_or(false);
        Self {
            bias: flag("has_bias"),
            multiplier: flag("has_multiplier"),
        }
    }

    /// How many inputs the op takes.
    pub fn count(self) -> usize {
        2 + usize::from(self.bias) + usize::from(self.multiplier)
    }

    /// The bias's input index, if there is one.
    pub fn bias_index(self) -> Option<usize> {
        self.bias.then_some(2)
    }

    /// The multiplier's input index, if there is one (the last).
    pub fn multiplier_index(self) -> Option<usize> {
        self.multiplier.then_some(2 + usize::from(self.bias))
    }
}

fn cost_fused_matmul(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let matmul = MatmulDims::of(ctx.input(0), ctx.input(1), ctx.attrs).map_or(0, |d| d.flops());
    let operands = FusedMatmulOperands::of(ctx.attrs);
    let (bias, multiplier) = (u64::from(operands.bias), u64::from(operands.multiplier));
    let act = Activation::of(ctx.attrs)
        .ok()
        .and_then(Activation::op)
        .and_then(|op| op.spec().flops_per_element())
        .unwrap_or(0);
    let out = outputs.iter().map(TensorType::numel).sum::<u64>();
    Cost::streaming(
        matmul.saturating_add(out.saturating_mul(bias + act + multiplier)),
        ctx.inputs,
        outputs,
    )
}

fn infer_fused_elementwise(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let program = ElementwiseProgram::parse(&ctx.attrs.str("program")?)?;
    let mut types = program.step_types(ctx.inputs)?;
    Ok(types.pop().into_iter().collect())
}

fn cost_fused_elementwise(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = ctx
        .attrs
        .str("program")
        .and_then(|p| ElementwiseProgram::parse(&p))
        .and_then(|p| Ok(p.flops(&p.step_types(ctx.inputs)?)))
        .unwrap_or(0);
    Cost::streaming(flops, ctx.inputs, outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::family::testing::*;
    use crate::ops::{cost, DType};

    #[test]
    fn fused_matmul() {
        let a = Attrs::new()
            .with("has_bias", true)
            .with("activation", "gelu")
            .with("transpose_b", true);
        let out = ok(
            Op::FusedMatmul,
            a.clone(),
            &[f32t(&[4, 8]), f32t(&[5, 8]), f32t(&[5])],
        );
        assert_eq!(out, f32t(&[4, 5]));
        let c = cost(
            Op::FusedMatmul,
            &a,
            &[f32t(&[4, 8]), f32t(&[5, 8]), f32t(&[5])],
        )
        .unwrap();
        assert_eq!(c.flops, 2 * 4 * 5 * 8 + 20 * (1 + 8));
        let plain = ok(
            Op::FusedMatmul,
            Attrs::new(),
            &[f32t(&[4, 8]), f32t(&[8, 5])],
        );
        assert_eq!(plain, f32t(&[4, 5]));
        // SwiGLU's up product times the gate's activation: bias and multiplier, in that order.
        let gated = a.clone().with("has_multiplier", true);
        let inputs = [f32t(&[4, 8]), f32t(&[5, 8]), f32t(&[5]), f32t(&[4, 5])];
        assert_eq!(ok(Op::FusedMatmul, gated.clone(), &inputs), f32t(&[4, 5]));
        let c = cost(Op::FusedMatmul, &gated, &inputs).unwrap();
        assert_eq!(c.flops, 2 * 4 * 5 * 8 + 20 * (1 + 8 + 1));
        let both = FusedMatmulOperands::of(&gated);
        assert_eq!((both.bias, both.multiplier), (true, true));
        assert_eq!(
            (both.bias_index(), both.multiplier_index()),
            (Some(2), Some(3))
        );
        assert_eq!(
            FusedMatmulOperands::of(&Attrs::new()),
            FusedMatmulOperands::default()
        );
    }

    #[test]
    fn fused_matmul_errors() {
        let x = [f32t(&[4, 8]), f32t(&[8, 5])];
        let e = err(
            Op::FusedMatmul,
            Attrs::new().with("activation", "swish"),
            &x,
        );
        assert_eq!(e.message, "fused_matmul: unknown activation `swish`");
        assert_eq!(
            e.help.as_deref(),
            Some("expected one of: none, tanh, relu, gelu, gelu_tanh, silu")
        );
        let e = err(Op::FusedMatmul, Attrs::new().with("has_bias", true), &x);
        assert_eq!(
            e.message,
            "fused_matmul: `has_bias` is true and `has_multiplier` false but 2 inputs are given"
        );
        let e = err(
            Op::FusedMatmul,
            Attrs::new().with("has_multiplier", true),
            &[f32t(&[4, 8]), f32t(&[8, 5]), f32t(&[5])],
        );
        assert_eq!(
            e.message,
            "fused_matmul: multiplier [5] is not the product's shape [4, 5]"
        );
        assert_eq!(e.input, Some(2));
        let with_bias = [f32t(&[4, 8]), f32t(&[8, 5]), f32t(&[4])];
        let e = err(
            Op::FusedMatmul,
            Attrs::new().with("has_bias", true),
            &with_bias,
        );
        assert_eq!(
            e.message,
            "fused_matmul: bias [4] does not broadcast to the product [4, 5]"
        );
        assert_eq!(e.input, Some(2));
        let e = err(Op::FusedMatmul, Attrs::new().with("activation", 3i64), &x);
        assert!(e.message.contains("must be a string"));
    }

    #[test]
    fn fused_elementwise() {
        let a = Attrs::new().with("program", "silu(x0); mul(t0, x1)");
        let out = ok(
            Op::FusedElementwise,
            a.clone(),
            &[f32t(&[2, 8]), f32t(&[2, 8])],
        );
        assert_eq!(out, f32t(&[2, 8]));
        let c = cost(Op::FusedElementwise, &a, &[f32t(&[2, 8]), f32t(&[2, 8])]).unwrap();
        assert_eq!((c.flops, c.bytes_read, c.bytes_written), (16 * 7, 128, 64));
        let e = err(
            Op::FusedElementwise,
            a,
            &[f32t(&[2, 8]), t(DType::I32, &[3])],
        );
        assert!(
            e.message.starts_with("fused_elementwise: program step 1"),
            "{}",
            e.message
        );
        assert_eq!(e.input, Some(1));
        let e = err(Op::FusedElementwise, Attrs::new(), &[f32t(&[2])]);
        assert_eq!(
            e.message,
            "fused_elementwise: missing attribute `program` (a string)"
        );
    }
}
