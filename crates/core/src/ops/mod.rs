//! The op registry: every op of `docs/ops.md` described once, with everything the stages
//! need — argument and attribute schema, shape and dtype rule, cost, mixed-precision class,
//! elementwise-ness, in-place reuse, and slots for gradient and sharding rules.
//!
//! Conventions all rules share: shapes are fully known `Vec<i64>` with non-negative dims;
//! negative axes count from the end; broadcasting follows NumPy; only the elementwise binary
//! ops promote mixed dtypes (`DType::promote`), every other op with several data inputs
//! requires them to agree, so kernels see one dtype. Kernels live elsewhere and are linked
//! by op name; the family modules expose what they need (resolved geometry, programs).

mod attrs;
mod dtype;
mod error;
pub mod family;
pub mod grad;
mod registry;
pub mod scalar;
mod shape;
mod spec;
mod tensor_type;

pub use attrs::{quote, resolve, AttrDefault, AttrKind, AttrSpec, AttrValue, Attrs, ConstAttr};
pub use dtype::DType;
pub use error::OpError;
pub use grad::unbroadcast;
pub use registry::{BinaryOp, Op, UnaryOp};
pub use scalar::eval_scalar;
pub use shape::{broadcast, broadcasts_to, fmt_dims, normalize_axes, normalize_axis, numel};
pub use spec::{
    Arity, Cost, CostRule, DimLayout, Emitter, GradCall, GradRule, Handle, OpCtx, OpSpec,
    PrecisionClass, ShardRule,
};
pub use tensor_type::TensorType;

/// The op signature kernel choices and tuning decisions are keyed by: the op, its input types
/// and its attributes, e.g. `matmul(f32[2, 3], f32[3, 4])` or `softmax(f32[4, 8]) {axis=-1}`
/// (the kernel table's key, and the fusion pass's for a fused subgraph).
pub fn signature<'a>(
    op: Op,
    inputs: impl IntoIterator<Item = &'a TensorType>,
    attrs: &Attrs,
) -> String {
    let inputs: Vec<String> = inputs.into_iter().map(TensorType::to_string).collect();
    let attrs: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if attrs.is_empty() {
        format!("{op}({})", inputs.join(", "))
    } else {
        format!("{op}({}) {{{}}}", inputs.join(", "), attrs.join(", "))
    }
}

/// Checks `attrs` against the op's schema and returns them complete (defaults filled in,
/// ints widened to floats where floats are declared); errors name the op.
pub fn resolve_attrs(op: Op, attrs: &Attrs) -> Result<Attrs, OpError> {
    resolve(op.spec().attrs, attrs).map_err(|e| e.context(op.name()))
}

/// The output types of `op` applied to `inputs` with `attrs`: validates arity, input shapes
/// and attributes, then applies the op's shape and dtype rule. Every error names the op, and
/// `input` points at the argument at fault where there is one.
pub fn infer(op: Op, attrs: &Attrs, inputs: &[TensorType]) -> Result<Vec<TensorType>, OpError> {
    let spec = op.spec();
    if !spec.arity.accepts(inputs.len()) {
        return Err(OpError::new(format!(
            "{op}: expects {}, got {}",
            spec.arity.describe(),
            inputs.len()
        )));
    }
    for (i, t) in inputs.iter().enumerate() {
        well_formed(t).map_err(|m| OpError::at(i, format!("{op}: input {i} {m}")))?;
    }
    let attrs = resolve_attrs(op, attrs)?;
    let ctx = OpCtx {
        op,
        attrs: &attrs,
        inputs,
    };
    let outputs = (spec.infer)(&ctx).map_err(|e| e.context(op.name()))?;
    for t in &outputs {
        well_formed(t).map_err(|m| OpError::new(format!("{op}: the result {m}")))?;
    }
    Ok(outputs)
}

/// Flops and bytes moved by `op` on `inputs` (inferring its outputs first).
pub fn cost(op: Op, attrs: &Attrs, inputs: &[TensorType]) -> Result<Cost, OpError> {
    let outputs = infer(op, attrs, inputs)?;
    let attrs = resolve_attrs(op, attrs)?;
    let ctx = OpCtx {
        op,
        attrs: &attrs,
        inputs,
    };
    Ok(match op.spec().cost {
        CostRule::PerOutput(k) => {
            let n = outputs.iter().map(TensorType::numel).sum::<u64>();
            Cost::streaming(n.saturating_mul(k), inputs, &outputs)
        }
        CostRule::PerInput(k) => {
            let n = inputs.first().map_or(0, TensorType::numel);
            Cost::streaming(n.saturating_mul(k), inputs, &outputs)
        }
        CostRule::View => Cost::default(),
        CostRule::Custom(f) => f(&ctx, &outputs),
    })
}

/// Checks that a type has non-negative dims and an element count that fits in an `i64`.
fn well_formed(t: &TensorType) -> Result<(), String> {
    if let Some(d) = t.shape.iter().find(|&&d| d < 0) {
        return Err(format!("has a negative dim {d} in {}", fmt_dims(&t.shape)));
    }
    if t.checked_numel().is_none() {
        return Err(format!(
            "has more elements than fit in an i64: {}",
            fmt_dims(&t.shape)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::family::testing::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn generic_checks_name_the_op_and_input() {
        let e = err(Op::Add, Attrs::new(), &[f32t(&[2])]);
        assert_eq!(e.message, "add: expects 2 inputs, got 1");
        let e = err(Op::Neg, Attrs::new(), &[f32t(&[2, -3])]);
        assert_eq!(e.message, "neg: input 0 has a negative dim -3 in [2, -3]");
        assert_eq!(e.input, Some(0));
        let e = err(Op::Neg, Attrs::new(), &[f32t(&[1 << 40, 1 << 40])]);
        assert!(
            e.message.contains("more elements than fit"),
            "{}",
            e.message
        );
        let e = err(Op::Neg, Attrs::new().with("axis", 1), &[f32t(&[2])]);
        assert_eq!(e.message, "neg: unknown attribute `axis`");
        let e = err(
            Op::BroadcastTo,
            Attrs::new().with("shape", vec![1 << 40, 1 << 40]),
            &[f32t(&[1])],
        );
        assert!(e.message.starts_with("broadcast_to: the result has more"));
    }

    fn any_value() -> impl Strategy<Value = AttrValue> {
        let int = prop_oneof![-3i64..8, Just(i64::MAX), Just(i64::MIN)];
        prop_oneof![
            int.clone().prop_map(AttrValue::Int),
            prop_oneof![Just(0.5), Just(-1.0), Just(f64::NAN), Just(1e300)]
                .prop_map(AttrValue::Float),
            any::<bool>().prop_map(AttrValue::Bool),
            proptest::collection::vec(int, 0..5).prop_map(AttrValue::Ints),
            proptest::sample::select(DType::ALL).prop_map(AttrValue::DType),
            prop_oneof![Just("relu"), Just("exp(x0)"), Just("add(x0, t9)"), Just("")]
                .prop_map(|s| AttrValue::Str(s.to_string())),
        ]
    }

    fn any_call() -> impl Strategy<Value = (Op, Attrs, Vec<TensorType>)> {
        let ty = (
            proptest::sample::select(DType::ALL),
            proptest::collection::vec(prop_oneof![0i64..6, Just(i64::MAX / 2)], 0..5),
        )
            .prop_map(|(d, s)| TensorType::new(d, s));
        (
            proptest::sample::select(Op::ALL),
            proptest::collection::vec(ty, 0..4),
            proptest::collection::vec((0usize..8, any_value()), 0..6),
        )
            .prop_map(|(op, inputs, picks)| {
                // Mostly the op's own attribute names, so rules get past the schema.
                let names = op.spec().attrs;
                let attrs = picks
                    .into_iter()
                    .map(|(i, v)| (names.get(i).map_or("zz", |a| a.name), v))
                    .collect();
                (op, attrs, inputs)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn rules_never_panic((op, attrs, inputs) in any_call()) {
            if let Ok(outputs) = infer(op, &attrs, &inputs) {
                prop_assert!(outputs.iter().all(|t| t.checked_numel().is_some()));
                prop_assert!(cost(op, &attrs, &inputs).is_ok());
            }
        }
    }

    #[test]
    fn elementwise_cost() {
        let c = cost(Op::Exp, &Attrs::new(), &[f32t(&[4, 8])]).unwrap();
        assert_eq!(
            c,
            Cost {
                flops: 128,
                bytes_read: 128,
                bytes_written: 128
            }
        );
        let c = cost(Op::Add, &Attrs::new(), &[f32t(&[4, 8]), f32t(&[8])]).unwrap();
        assert_eq!((c.flops, c.bytes_read, c.bytes_written), (32, 160, 128));
        let c = cost(
            Op::Reshape,
            &Attrs::new().with("shape", vec![32]),
            &[f32t(&[4, 8])],
        )
        .unwrap();
        assert_eq!(c, Cost::default());
    }
}
