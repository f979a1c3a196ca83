//! The op table: one line per op, naming it and pointing at its [`OpSpec`] entry.
//!
//! Adding an op means adding a line here and its entry in the family module that holds the
//! rules it shares; no pass is edited.

use super::error::OpError;
use super::family::{conv, elementwise as ew, fused, layout, loss, matmul, nn, norm, reduce};
use super::spec::{GradRule, OpSpec, PrecisionClass, ShardRule};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

macro_rules! op_table {
    ($($variant:ident = $name:literal => $spec:expr,)*) => {
        /// Every op of `docs/ops.md`, as a plain tag; its rules live in [`Op::spec`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
        }

        impl Op {
            /// Every op, in table order.
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];

            /// The op's name in `.msl` sources, IR dumps and artifacts (`"add"`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$variant => $name,)*
                }
            }

            /// The registry entry describing the op.
            pub fn spec(self) -> &'static OpSpec {
                match self {
                    $(Op::$variant => {
                        static SPEC: OpSpec = $spec;
                        &SPEC
                    })*
                }
            }
        }
    };
}

op_table! {
    Constant = "constant" => ew::CONSTANT,
    Add = "add" => ew::binary(1),
    Sub = "sub" => ew::binary(1),
    Mul = "mul" => ew::binary(1),
    Div = "div" => ew::binary(1),
    Pow = "pow" => ew::binary_keep_f32(4),
    Maximum = "maximum" => ew::binary(1),
    Minimum = "minimum" => ew::binary(1),
    Neg = "neg" => ew::unary_numeric(1),
    Exp = "exp" => ew::unary_keep_f32(4),
    Log = "log" => ew::unary_keep_f32(4),
    Sqrt = "sqrt" => ew::unary_float(1),
    Rsqrt = "rsqrt" => ew::unary_keep_f32(2),
    Reciprocal = "reciprocal" => ew::unary_keep_f32(1),
    Abs = "abs" => ew::unary_numeric(1),
    Tanh = "tanh" => ew::unary_float(4),
    Sigmoid = "sigmoid" => ew::unary_float(5),
    Relu = "relu" => ew::RELU,
    Gelu = "gelu" => ew::unary_float(8),
    GeluTanh = "gelu_tanh" => ew::unary_float(8),
    Silu = "silu" => ew::unary_float(6),
    Erf = "erf" => ew::unary_float(4),
    Cast = "cast" => ew::CAST,
    Matmul = "matmul" => matmul::MATMUL,
    Transpose = "transpose" => layout::TRANSPOSE,
    Reshape = "reshape" => layout::RESHAPE,
    BroadcastTo = "broadcast_to" => layout::BROADCAST_TO,
    Concat = "concat" => layout::CONCAT,
    Slice = "slice" => layout::SLICE,
    Select = "select" => layout::SELECT,
    Sum = "sum" => reduce::reduction(PrecisionClass::KeepF32),
    Mean = "mean" => reduce::reduction(PrecisionClass::KeepF32),
    Max = "max" => reduce::reduction(PrecisionClass::FollowInput),
    Softmax = "softmax" => reduce::SOFTMAX,
    LogSoftmax = "log_softmax" => reduce::SOFTMAX,
    RmsNorm = "rms_norm" => norm::normalize(4),
    LayerNorm = "layer_norm" => norm::normalize(6),
    BatchNorm = "batch_norm" => norm::BATCH_NORM,
    Embedding = "embedding" => nn::EMBEDDING,
    Rope = "rope" => nn::ROPE,
    Attention = "attention" => nn::ATTENTION,
    CausalMask = "causal_mask" => nn::CAUSAL_MASK,
    Dropout = "dropout" => ew::DROPOUT,
    Conv2d = "conv2d" => conv::CONV2D,
    MaxPool2d = "max_pool2d" => conv::POOL2D,
    AvgPool2d = "avg_pool2d" => conv::POOL2D,
    AdaptiveAvgPool2d = "adaptive_avg_pool2d" => conv::ADAPTIVE_AVG_POOL2D,
    CrossEntropy = "cross_entropy" => loss::CROSS_ENTROPY,
    MseLoss = "mse_loss" => loss::MSE_LOSS,
    FusedMatmul = "fused_matmul" => fused::FUSED_MATMUL,
    FusedElementwise = "fused_elementwise" => fused::FUSED_ELEMENTWISE,
    RmsNormScale = "rms_norm_scale" => norm::normalize_affine(&["x", "w"], 5),
    LayerNormAffine = "layer_norm_affine" => norm::normalize_affine(&["x", "g", "b"], 8),
}

impl Op {
    /// The op called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.name() == name)
    }
}

impl Op {
    /// The op's gradient rule, or an error saying it has none yet (autodiff reports it).
    pub fn grad_rule(self) -> Result<GradRule, OpError> {
        self.spec()
            .grad
            .ok_or_else(|| OpError::new(format!("the gradient of `{self}` is not defined yet")))
    }

    /// The op's sharding propagation rule, or an error saying it has none yet.
    pub fn shard_rule(self) -> Result<ShardRule, OpError> {
        self.spec().shard.ok_or_else(|| {
            OpError::new(format!("the sharding rule of `{self}` is not defined yet"))
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Op {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        let name = String::deserialize(d)?;
        Op::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown op `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Arity;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = HashSet::new();
        for &op in Op::ALL {
            assert!(seen.insert(op.name()), "duplicate name {}", op.name());
            assert_eq!(Op::from_name(op.name()), Some(op));
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.name()));
            assert_eq!(serde_json::from_str::<Op>(&json).unwrap(), op);
        }
        assert_eq!(Op::ALL.len(), 53);
        assert_eq!(Op::from_name("Add"), None);
        assert!(serde_json::from_str::<Op>("\"frobnicate\"")
            .unwrap_err()
            .to_string()
            .contains("unknown op `frobnicate`"));
    }

    #[test]
    fn missing_rules_are_errors() {
        // No op has a gradient or sharding rule yet; asking says so instead of panicking.
        let e = Op::Matmul.grad_rule().map(|_| ()).unwrap_err();
        assert_eq!(e.message, "the gradient of `matmul` is not defined yet");
        let e = Op::Add.shard_rule().map(|_| ()).unwrap_err();
        assert_eq!(e.message, "the sharding rule of `add` is not defined yet");
    }

    #[test]
    fn every_entry_is_consistent() {
        for &op in Op::ALL {
            let spec = op.spec();
            match spec.arity {
                Arity::AtLeast(_) => assert_eq!(spec.inputs.len(), 1, "{op}"),
                Arity::Exact(n) => assert_eq!(spec.inputs.len(), n, "{op}"),
                Arity::Between(_, hi) => assert_eq!(spec.inputs.len(), hi, "{op}"),
            }
            let mut names = HashSet::new();
            assert!(spec.attrs.iter().all(|a| names.insert(a.name)), "{op}");
            if spec.elementwise {
                assert!(spec.in_place, "{op} is elementwise but not in place");
            }
        }
    }
}
