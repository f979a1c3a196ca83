//! The one op → kernel binding: which kernel family runs each op, the parameters each family
//! takes (from its parameter struct, field by field) and how a kernel choice is read back. The
//! planner chooses by it, the executor looks up by the same key, and `NAME.kernels.toml`
//! records it.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use mslc_core::ops::Op;

use crate::attention::AttentionParams;
use crate::elementwise::fused::ElementwiseParams;
use crate::matmul::MatmulParams;
use crate::par::RowParams;
use crate::transpose::TransposeParams;

/// One tunable kernel parameter's value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum KernelParam {
    /// A size or count.
    Int(i64),
    /// A choice, e.g. the micro-kernel ISA.
    Text(String),
}

/// The kernel chosen for a step and its tunable parameters.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct KernelChoice {
    /// Kernel name, e.g. `gemm` or `flash_attention`.
    pub name: String,
    /// Tile sizes, thread split and the like, by the field names of the kernel's parameter
    /// struct.
    pub params: BTreeMap<String, KernelParam>,
}

/// The kernel families the executor runs. Each tunable one has a parameter struct in
/// this crate; its field names and defaults are the only source of the parameters a
/// [`KernelChoice`] carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// Packed GEMM ([`MatmulParams`]): `matmul`, `fused_matmul`.
    Gemm,
    /// Convolution lowered onto the packed GEMM ([`MatmulParams`]): `conv2d`.
    Im2colGemm,
    /// Tiled online-softmax attention ([`AttentionParams`]).
    FlashAttention,
    /// Blocked elementwise programs ([`ElementwiseParams`]).
    Elementwise,
    /// Row-parallel kernels ([`RowParams`]): softmax, norms, rope, embedding, reductions,
    /// pooling, losses, and the neural-net backward ops (split over output rows).
    Rowwise,
    /// Tiled transpose ([`TransposeParams`]).
    Transpose,
    /// Untuned reference kernels, no parameters.
    Reference,
}

impl KernelKind {
    /// Every kernel family.
    pub const ALL: [KernelKind; 7] = [
        KernelKind::Gemm,
        KernelKind::Im2colGemm,
        KernelKind::FlashAttention,
        KernelKind::Elementwise,
        KernelKind::Rowwise,
        KernelKind::Transpose,
        KernelKind::Reference,
    ];

    /// The family recorded as `name` in a module or kernel table, if any.
    pub fn from_name(name: &str) -> Option<KernelKind> {
        KernelKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The family a step of `op` recorded as running on kernel `name` runs on: the binding's
    /// family for `op`, or an error naming both when `name` is unknown or another family.
    pub fn bound(op: Op, name: &str) -> Result<KernelKind, String> {
        let expected = KernelKind::for_op(op);
        match KernelKind::from_name(name) {
            Some(kind) if kind == expected => Ok(kind),
            Some(_) => Err(format!(
                "asks for kernel `{name}`, but `{op}` runs on `{}`",
                expected.name()
            )),
            None => {
                let known: Vec<&str> = KernelKind::ALL.iter().map(|k| k.name()).collect();
                Err(format!(
                    "asks for kernel `{name}`, which does not exist (kernels: {})",
                    known.join(", ")
                ))
            }
        }
    }

    /// The kernel family that runs `op`.
    pub fn for_op(op: Op) -> KernelKind {
        match op {
            Op::Matmul | Op::FusedMatmul => KernelKind::Gemm,
            Op::Conv2d | Op::Conv2dGradInput | Op::Conv2dGradWeight => KernelKind::Im2colGemm,
            Op::Attention | Op::AttentionLse | Op::AttentionGrad => KernelKind::FlashAttention,
            Op::Transpose => KernelKind::Transpose,
            Op::Dropout => KernelKind::Reference,
            _ if op.spec().elementwise
                || matches!(op, Op::FusedElementwise | Op::AdamUpdate | Op::SgdUpdate) =>
            {
                KernelKind::Elementwise
            }
            Op::Softmax
            | Op::LogSoftmax
            | Op::RmsNorm
            | Op::RmsNormScale
            | Op::BatchNorm
            | Op::LayerNorm
            | Op::LayerNormAffine
            | Op::Rope
            | Op::RopeCached
            | Op::Embedding
            | Op::Sum
            | Op::SquareSum
            | Op::SquareSumFinite
            | Op::Mean
            | Op::Max
            | Op::MaxPool2d
            | Op::AvgPool2d
            | Op::AdaptiveAvgPool2d
            | Op::CrossEntropy
            | Op::CrossEntropyGrad
            | Op::RmsNormGrad
            | Op::LayerNormGrad
            | Op::RmsNormScaleGrad
            | Op::LayerNormAffineGrad
            | Op::EmbeddingGrad
            | Op::MaxPool2dGrad
            | Op::AvgPool2dGrad
            | Op::AdaptiveAvgPool2dGrad => KernelKind::Rowwise,
            _ => KernelKind::Reference,
        }
    }

    /// The name recorded in modules and kernel tables.
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Gemm => "gemm",
            KernelKind::Im2colGemm => "im2col_gemm",
            KernelKind::FlashAttention => "flash_attention",
            KernelKind::Elementwise => "elementwise",
            KernelKind::Rowwise => "rowwise",
            KernelKind::Transpose => "transpose",
            KernelKind::Reference => "reference",
        }
    }

    /// The default parameters, field by field, from the kernel's parameter struct.
    pub fn default_params(self) -> BTreeMap<String, KernelParam> {
        match self {
            KernelKind::Gemm | KernelKind::Im2colGemm => to_params(&MatmulParams::default()),
            KernelKind::FlashAttention => to_params(&AttentionParams::default()),
            KernelKind::Elementwise => to_params(&ElementwiseParams::default()),
            KernelKind::Rowwise => to_params(&RowParams::default()),
            KernelKind::Transpose => to_params(&TransposeParams::default()),
            KernelKind::Reference => BTreeMap::new(),
        }
    }
}

impl KernelChoice {
    /// Checks that a step of `op` may run on this choice: the kernel is the binding's family
    /// for `op` and every parameter is one its parameter struct has, with a legal value.
    pub fn check_for(&self, op: Op) -> Result<(), String> {
        match KernelKind::bound(op, &self.name)? {
            KernelKind::Gemm | KernelKind::Im2colGemm => {
                decode_params::<MatmulParams>(self).map(drop)
            }
            KernelKind::FlashAttention => decode_params::<AttentionParams>(self).map(drop),
            KernelKind::Elementwise => decode_params::<ElementwiseParams>(self).map(drop),
            KernelKind::Rowwise => decode_params::<RowParams>(self).map(drop),
            KernelKind::Transpose => decode_params::<TransposeParams>(self).map(drop),
            KernelKind::Reference if self.params.is_empty() => Ok(()),
            KernelKind::Reference => Err(format!("kernel `{}` takes no parameters", self.name)),
        }
    }
}

/// The default kernel for `op` and its default parameters (a tuner replaces them per op
/// signature and target).
pub fn choose_kernel(op: Op) -> KernelChoice {
    let kind = KernelKind::for_op(op);
    KernelChoice {
        name: kind.name().to_string(),
        params: kind.default_params(),
    }
}

/// A parameter struct as a [`KernelChoice`] parameter map (ints and text fields).
fn to_params<T: Serialize>(params: &T) -> BTreeMap<String, KernelParam> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(params) else {
        return BTreeMap::new();
    };
    fields
        .into_iter()
        .filter_map(|(k, v)| {
            let p = match v {
                serde_json::Value::Number(n) => KernelParam::Int(n.as_i64()?),
                serde_json::Value::String(s) => KernelParam::Text(s),
                _ => return None,
            };
            Some((k, p))
        })
        .collect()
}

/// Reads a kernel's parameter struct from `choice`: every field it names overrides the
/// default; an unknown name or a value of the wrong kind is an error naming it.
pub fn decode_params<T: Serialize + DeserializeOwned + Default>(
    choice: &KernelChoice,
) -> Result<T, String> {
    let mut fields = match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => return Err(format!("kernel `{}` has no parameter table", choice.name)),
    };
    for (name, value) in &choice.params {
        if !fields.contains_key(name) {
            let known: Vec<&str> = fields.keys().map(String::as_str).collect();
            return Err(format!(
                "kernel `{}` has no parameter `{name}` (it takes {})",
                choice.name,
                known.join(", ")
            ));
        }
        let value = match value {
            KernelParam::Int(i) => serde_json::Value::from(*i),
            KernelParam::Text(t) => serde_json::Value::from(t.as_str()),
        };
        fields.insert(name.clone(), value);
    }
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| format!("kernel `{}`: bad parameter value: {e}", choice.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_the_parameter_map() {
        let choice = KernelChoice {
            name: "gemm".into(),
            params: KernelKind::Gemm.default_params(),
        };
        assert!(choice.params.contains_key("mc") && choice.params.contains_key("isa"));
        let p: MatmulParams = decode_params(&choice).unwrap();
        assert_eq!(p, MatmulParams::default());
    }

    #[test]
    fn names_round_trip_and_bind_to_their_ops() {
        for kind in KernelKind::ALL {
            assert_eq!(KernelKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(KernelKind::bound(Op::Matmul, "gemm"), Ok(KernelKind::Gemm));
        let e = KernelKind::bound(Op::Matmul, "rowwise").unwrap_err();
        assert!(e.contains("runs on `gemm`"), "{e}");
        let e = KernelKind::bound(Op::Matmul, "blas").unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn choices_are_checked_against_the_op() {
        assert_eq!(
            choose_kernel(Op::Attention).check_for(Op::Attention),
            Ok(())
        );
        assert!(choose_kernel(Op::Attention).check_for(Op::Matmul).is_err());
        let mut bad = choose_kernel(Op::Matmul);
        bad.params
            .insert("mc".into(), KernelParam::Text("big".into()));
        assert!(bad.check_for(Op::Matmul).is_err());
        let mut extra = choose_kernel(Op::Dropout);
        extra.params.insert("mc".into(), KernelParam::Int(4));
        assert!(extra.check_for(Op::Dropout).is_err());
    }

    #[test]
    fn overrides_apply_and_unknown_names_fail() {
        let mut params = BTreeMap::new();
        params.insert("block_q".to_string(), KernelParam::Int(16));
        let choice = KernelChoice {
            name: "flash_attention".into(),
            params,
        };
        let p: AttentionParams = decode_params(&choice).unwrap();
        assert_eq!(p.block_q, 16);
        assert_eq!(p.block_k, AttentionParams::default().block_k);
        let mut bad = choice.clone();
        bad.params.insert("q_tile".into(), KernelParam::Int(4));
        let e = decode_params::<AttentionParams>(&bad).unwrap_err();
        assert!(e.contains("no parameter `q_tile`"), "{e}");
        let mut wrong = choice;
        wrong.params.insert("block_k".into(), KernelParam::Int(-3));
        assert!(decode_params::<AttentionParams>(&wrong).is_err());
    }
}
