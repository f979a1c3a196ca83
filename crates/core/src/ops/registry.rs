//! The op table: one line per op, naming it and pointing at its [`OpSpec`] entry; the
//! elementwise math ops' rows also carry their scalar semantics and fusion flags, from which
//! [`UnaryOp`] and [`BinaryOp`] are generated.
//!
//! Adding an op means adding a line here and its entry in the family module that holds the
//! rules it shares; no pass is edited. Adding a unary math op is one row here (the existing
//! `ew::unary_*` specs usually fit) plus its vector kernel in `mslc-kernels`, whose
//! exhaustive dispatch over [`UnaryOp`] does not compile until it is there.

use super::error::OpError;
use super::family::{
    collective, conv, elementwise as ew, fused, layout, loss, matmul, nn, norm, optim, reduce,
};
use super::scalar as s;
use super::spec::{GradRule, OpSpec, PrecisionClass, ShardRule};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

macro_rules! op_table {
    (
        $($v0:ident = $n0:literal => $s0:expr,)*
        @binary { $($bv:ident = $bn:literal => $bs:expr, eval: $be:expr;)* }
        @unary {
            $($uv:ident = $un:literal => $us:expr, eval: $ue:expr, epilogue: $uep:literal
                $(, folds: $uf:literal)?;)*
        }
        $($v1:ident = $n1:literal => $s1:expr,)*
    ) => {
        /// Every op of `docs/ops.md`, as a plain tag; its rules live in [`Op::spec`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op {
            $(#[doc = concat!("`", $n0, "`")] $v0,)*
            $(#[doc = concat!("`", $bn, "`")] $bv,)*
            $(#[doc = concat!("`", $un, "`")] $uv,)*
            $(#[doc = concat!("`", $n1, "`")] $v1,)*
        }

        impl Op {
            /// Every op, in table order.
            pub const ALL: &'static [Op] = &[$(Op::$v0,)* $(Op::$bv,)* $(Op::$uv,)* $(Op::$v1,)*];

            /// The op's name in `.msl` sources, IR dumps and artifacts (`"add"`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$v0 => $n0,)*
                    $(Op::$bv => $bn,)*
                    $(Op::$uv => $un,)*
                    $(Op::$v1 => $n1,)*
                }
            }

            /// The registry entry describing the op.
            pub fn spec(self) -> &'static OpSpec {
                match self {
                    $(Op::$v0 => { static SPEC: OpSpec = $s0; &SPEC })*
                    $(Op::$bv => { static SPEC: OpSpec = $bs; &SPEC })*
                    $(Op::$uv => { static SPEC: OpSpec = $us; &SPEC })*
                    $(Op::$v1 => { static SPEC: OpSpec = $s1; &SPEC })*
                }
            }

            /// The op as a one-input elementwise math op, if it is one.
            pub fn unary(self) -> Option<UnaryOp> {
                match self {
                    $(Op::$uv => Some(UnaryOp::$uv),)*
                    _ => None,
                }
            }

            /// The op as a two-input elementwise math op, if it is one.
            pub fn binary(self) -> Option<BinaryOp> {
                match self {
                    $(Op::$bv => Some(BinaryOp::$bv),)*
                    _ => None,
                }
            }
        }

        /// The one-input elementwise math ops (the `@unary` rows of the op table): the identity
        /// kernels dispatch on, so a new row is a compile error in each exhaustive `match` over
        /// it rather than a silent fallback.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum UnaryOp {
            $(#[doc = concat!("`", $un, "`")] $uv,)*
        }

        impl UnaryOp {
            /// Every unary op, in table order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$uv,)*];

            /// The registry op.
            pub fn op(self) -> Op {
                match self {
                    $(UnaryOp::$uv => Op::$uv,)*
                }
            }

            /// The op's exact value at `x`, computed in f64 (NaN rules: see [`super::scalar`]):
            /// what constant folding computes and what the reference kernels round to f32.
            pub fn eval(self, x: f64) -> f64 {
                match self {
                    $(UnaryOp::$uv => ($ue)(x),)*
                }
            }

            /// Whether constant folding (the checker's and the `fold` pass) computes the op at
            /// compile time with [`UnaryOp::eval`] (rows say `folds: false` to leave it to the
            /// kernels).
            pub fn folds(self) -> bool {
                match self {
                    $(UnaryOp::$uv => true $(&& $uf)?,)*
                }
            }

            /// Whether `fused_matmul` may apply the op to its product (the fusion pass folds
            /// it into a preceding matmul, and the `activation` attribute accepts its name).
            pub fn epilogue(self) -> bool {
                match self {
                    $(UnaryOp::$uv => $uep,)*
                }
            }
        }

        /// The two-input elementwise math ops (the `@binary` rows of the op table), which
        /// broadcast and promote their operands.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum BinaryOp {
            $(#[doc = concat!("`", $bn, "`")] $bv,)*
        }

        impl BinaryOp {
            /// Every binary op, in table order.
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$bv,)*];

            /// The registry op.
            pub fn op(self) -> Op {
                match self {
                    $(BinaryOp::$bv => Op::$bv,)*
                }
            }

            /// The op's exact value at `(a, b)`, computed in f64 (NaN rules: see
            /// [`super::scalar`]).
            pub fn eval(self, a: f64, b: f64) -> f64 {
                match self {
                    $(BinaryOp::$bv => ($be)(a, b),)*
                }
            }
        }
    };
}

// One row per op. The elementwise math ops sit in the `@binary` and `@unary` sections, each
// row carrying the op's scalar semantics (`eval`, in f64) and, for unary ops, whether it may
// be a matmul epilogue and (when not) `folds: false`; the spec holds the rest (dtype rule, cost, precision class, gradient
// slot). Adding a unary op is one row here plus its vector kernel in the kernels crate
// (`elementwise/slice.rs`, an exhaustive match that fails to compile until it is there).
op_table! {
    Constant = "constant" => ew::CONSTANT,
    @binary {
        Add = "add" => ew::binary(1, ew::grad_add), eval: |a, b| a + b;
        Sub = "sub" => ew::binary(1, ew::grad_sub), eval: |a, b| a - b;
        Mul = "mul" => ew::binary(1, ew::grad_mul), eval: |a, b| a * b;
        Div = "div" => ew::binary(1, ew::grad_div), eval: |a, b| a / b;
        Pow = "pow" => ew::binary_keep_f32(4, ew::grad_pow), eval: f64::powf;
        Maximum = "maximum" => ew::binary(1, ew::grad_maximum), eval: s::maximum;
        Minimum = "minimum" => ew::binary(1, ew::grad_minimum), eval: s::minimum;
    }
    @unary {
        Neg = "neg" => ew::unary_numeric(1, ew::grad_neg), eval: |x: f64| -x, epilogue: false;
        Exp = "exp" => ew::unary_keep_f32(4, ew::grad_exp), eval: f64::exp, epilogue: false;
        Log = "log" => ew::unary_keep_f32(4, ew::grad_log), eval: f64::ln, epilogue: false;
        Sqrt = "sqrt" => ew::unary_float(1, ew::grad_sqrt), eval: f64::sqrt, epilogue: false;
        Rsqrt = "rsqrt" => ew::unary_keep_f32(2, ew::grad_rsqrt), eval: |x: f64| 1.0 / x.sqrt(), epilogue: false;
        Reciprocal = "reciprocal" => ew::unary_keep_f32(1, ew::grad_reciprocal), eval: |x: f64| 1.0 / x, epilogue: false;
        Abs = "abs" => ew::unary_numeric(1, ew::grad_abs), eval: f64::abs, epilogue: false;
        Tanh = "tanh" => ew::unary_float(4, ew::grad_tanh), eval: f64::tanh, epilogue: true;
        Sigmoid = "sigmoid" => ew::unary_float(5, ew::grad_sigmoid), eval: s::sigmoid, epilogue: false;
        Relu = "relu" => ew::RELU, eval: s::relu, epilogue: true;
        Gelu = "gelu" => ew::unary_float(8, ew::grad_gelu), eval: s::gelu, epilogue: true, folds: false;
        GeluTanh = "gelu_tanh" => ew::unary_float(8, ew::grad_gelu_tanh), eval: s::gelu_tanh, epilogue: true;
        Silu = "silu" => ew::unary_float(6, ew::grad_silu), eval: s::silu, epilogue: true;
        Erf = "erf" => ew::unary_float(4, ew::grad_erf), eval: libm::erf, epilogue: false, folds: false;
        // PyTorch's defaults (beta 1, threshold 20): the identity above 20.
        Softplus = "softplus" => ew::unary_float(8, ew::grad_softplus),
            eval: |x: f64| if x > 20.0 { x } else { x.exp().ln_1p() }, epilogue: false;
        Sign = "sign" => ew::unary_numeric(1, ew::grad_sign), eval: s::sign, epilogue: false;
    }
    Cast = "cast" => ew::CAST,
    Matmul = "matmul" => matmul::MATMUL,
    Transpose = "transpose" => layout::TRANSPOSE,
    Reshape = "reshape" => layout::RESHAPE,
    BroadcastTo = "broadcast_to" => layout::BROADCAST_TO,
    Concat = "concat" => layout::CONCAT,
    Slice = "slice" => layout::SLICE,
    Select = "select" => layout::SELECT,
    Sum = "sum" => reduce::reduction(PrecisionClass::KeepF32, reduce::grad_sum),
    Mean = "mean" => reduce::reduction(PrecisionClass::KeepF32, reduce::grad_mean),
    Max = "max" => reduce::reduction(PrecisionClass::FollowInput, reduce::grad_max),
    Softmax = "softmax" => reduce::SOFTMAX,
    LogSoftmax = "log_softmax" => reduce::LOG_SOFTMAX,
    RmsNorm = "rms_norm" => norm::RMS_NORM,
    LayerNorm = "layer_norm" => norm::LAYER_NORM,
    BatchNorm = "batch_norm" => norm::BATCH_NORM,
    Embedding = "embedding" => nn::EMBEDDING,
    Rope = "rope" => nn::ROPE,
    Attention = "attention" => nn::ATTENTION,
    CausalMask = "causal_mask" => nn::CAUSAL_MASK,
    Dropout = "dropout" => ew::DROPOUT,
    Conv2d = "conv2d" => conv::CONV2D,
    MaxPool2d = "max_pool2d" => conv::MAX_POOL2D,
    AvgPool2d = "avg_pool2d" => conv::AVG_POOL2D,
    AdaptiveAvgPool2d = "adaptive_avg_pool2d" => conv::ADAPTIVE_AVG_POOL2D,
    CrossEntropy = "cross_entropy" => loss::CROSS_ENTROPY,
    MseLoss = "mse_loss" => loss::MSE_LOSS,
    FusedMatmul = "fused_matmul" => fused::FUSED_MATMUL,
    FusedElementwise = "fused_elementwise" => fused::FUSED_ELEMENTWISE,
    RmsNormScale = "rms_norm_scale" =>
        norm::normalize_affine(&["x", "w"], 5, norm::grad_rms_norm_scale),
    LayerNormAffine = "layer_norm_affine" =>
        norm::normalize_affine(&["x", "g", "b"], 8, norm::grad_layer_norm_affine),
    RopeTable = "rope_table" => nn::ROPE_TABLE,
    RopeCached = "rope_cached" => nn::ROPE_CACHED,
    // Backward ops (math)
    CrossEntropyGrad = "cross_entropy_grad" => loss::CROSS_ENTROPY_GRAD,
    // Backward ops (neural-net)
    RmsNormGrad = "rms_norm_grad" => norm::normalize_grad(10),
    LayerNormGrad = "layer_norm_grad" => norm::normalize_grad(14),
    RmsNormScaleGrad = "rms_norm_scale_grad" =>
        norm::normalize_affine_grad(&["x", "w", "dy"], 14),
    LayerNormAffineGrad = "layer_norm_affine_grad" =>
        norm::normalize_affine_grad(&["x", "g", "dy"], 20),
    EmbeddingGrad = "embedding_grad" => nn::EMBEDDING_GRAD,
    AttentionLse = "attention_lse" => nn::ATTENTION_LSE,
    AttentionGrad = "attention_grad" => nn::ATTENTION_GRAD,
    Conv2dGradInput = "conv2d_grad_input" => conv::CONV2D_GRAD_INPUT,
    Conv2dGradWeight = "conv2d_grad_weight" => conv::CONV2D_GRAD_WEIGHT,
    MaxPool2dGrad = "max_pool2d_grad" => conv::POOL2D_GRAD,
    AvgPool2dGrad = "avg_pool2d_grad" => conv::POOL2D_GRAD,
    AdaptiveAvgPool2dGrad = "adaptive_avg_pool2d_grad" => conv::ADAPTIVE_AVG_POOL2D_GRAD,
    // Optimizer updates (a training step builds them)
    AdamUpdate = "adam_update" => optim::ADAM_UPDATE,
    SgdUpdate = "sgd_update" => optim::SGD_UPDATE,
    SquareSum = "square_sum" => optim::SQUARE_SUM,
    SquareSumFinite = "square_sum_finite" => optim::SQUARE_SUM_FINITE,
    // Collectives (the sharding pass inserts them; the executor runs them)
    AllReduce = "all_reduce" => collective::ALL_REDUCE,
    ParallelCopy = "parallel_copy" => collective::PARALLEL_COPY,
    AllGather = "all_gather" => collective::ALL_GATHER,
    ReduceScatter = "reduce_scatter" => collective::REDUCE_SCATTER,
    RankSlice = "rank_slice" => collective::RANK_SLICE,
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

/// Serde for [`UnaryOp`] and [`BinaryOp`]: the op's name, as for [`Op`].
macro_rules! serde_by_name {
    ($ty:ident, $from_op:ident) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.op().serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                let op = Op::deserialize(d)?;
                op.$from_op().ok_or_else(|| {
                    serde::de::Error::custom(format!("`{op}` is not a {}", stringify!($ty)))
                })
            }
        }
    };
}

serde_by_name!(UnaryOp, unary);
serde_by_name!(BinaryOp, binary);

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
        assert_eq!(Op::ALL.len(), 79);
        assert_eq!(Op::from_name("Add"), None);
        assert!(serde_json::from_str::<Op>("\"frobnicate\"")
            .unwrap_err()
            .to_string()
            .contains("unknown op `frobnicate`"));
    }

    #[test]
    fn missing_rules_are_errors() {
        // The ops only the fusion pass makes (after autodiff) have no gradient rule, and no
        // op has a sharding rule yet; asking says so instead of panicking.
        let e = Op::FusedMatmul.grad_rule().map(|_| ()).unwrap_err();
        assert_eq!(
            e.message,
            "the gradient of `fused_matmul` is not defined yet"
        );
        let e = Op::Add.shard_rule().map(|_| ()).unwrap_err();
        assert_eq!(e.message, "the sharding rule of `add` is not defined yet");
    }

    /// The words (letters, digits, `_`) of a docs table cell.
    fn words(cell: &str) -> HashSet<&str> {
        cell.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect()
    }

    #[test]
    fn docs_list_every_op_with_its_signature() {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ops.md"));
        let mut documented = HashSet::new();
        for row in doc.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let (names, inputs, attrs) = (cells[1], cells[2], cells[3]);
            for name in names.trim_matches('`').split_whitespace() {
                let op = Op::from_name(name)
                    .unwrap_or_else(|| panic!("docs/ops.md lists `{name}`, not in the registry"));
                assert!(documented.insert(op), "docs/ops.md lists `{name}` twice");
                let spec = op.spec();
                let (input_words, attr_words) = (words(inputs), words(attrs));
                assert_eq!(
                    spec.inputs.is_empty(),
                    inputs == "–",
                    "{op}: inputs `{inputs}`"
                );
                for i in spec.inputs {
                    assert!(
                        input_words.contains(i),
                        "{op}: input `{i}` not in `{inputs}`"
                    );
                }
                assert_eq!(
                    spec.attrs.is_empty(),
                    attrs == "–",
                    "{op}: attributes `{attrs}`"
                );
                for a in spec.attrs {
                    assert!(
                        attr_words.contains(a.name),
                        "{op}: `{}` not in `{attrs}`",
                        a.name
                    );
                }
            }
        }
        let missing: Vec<&str> = Op::ALL
            .iter()
            .filter(|op| !documented.contains(op))
            .map(|op| op.name())
            .collect();
        assert!(missing.is_empty(), "not in docs/ops.md: {missing:?}");
        let mut activations: Vec<&str> = fused::Activation::all().map(|a| a.name()).collect();
        let listed = doc
            .split("activation: ")
            .nth(1)
            .and_then(|r| r.split('`').next());
        let mut listed: Vec<&str> = listed.expect("the activations").split('/').collect();
        listed.sort_unstable();
        activations.sort_unstable();
        assert_eq!(
            listed, activations,
            "fused_matmul activations in docs/ops.md"
        );
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
