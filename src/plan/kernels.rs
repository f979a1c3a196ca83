//! The kernel table: for every step, which kernel runs it and with which parameters (tile sizes,
//! thread split). These are the defaults for the host; a tuner replaces them with measured
//! winners. `NAME.kernels.toml` records them keyed by op signature and target fingerprint.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::artifact::{KernelChoice, KernelParam, Module};
use crate::kernels::attention::AttentionParams;
use crate::kernels::elementwise::fused::ElementwiseParams;
use crate::kernels::matmul::MatmulParams;
use crate::kernels::par::RowParams;
use crate::kernels::transpose::TransposeParams;
use crate::ops::Op;

/// The kernel families the executor runs. Each tunable one has a parameter struct in
/// `crate::kernels`; its field names and defaults are the only source of the parameters a
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
    /// pooling, losses.
    Rowwise,
    /// Tiled transpose ([`TransposeParams`]).
    Transpose,
    /// Untuned reference kernels, no parameters.
    Reference,
}

impl KernelKind {
    /// The kernel family that runs `op`.
    pub fn for_op(op: Op) -> KernelKind {
        match op {
            Op::Matmul | Op::FusedMatmul => KernelKind::Gemm,
            Op::Conv2d => KernelKind::Im2colGemm,
            Op::Attention => KernelKind::FlashAttention,
            Op::Transpose => KernelKind::Transpose,
            Op::Dropout => KernelKind::Reference,
            _ if op.spec().elementwise || op == Op::FusedElementwise => KernelKind::Elementwise,
            Op::Softmax
            | Op::LogSoftmax
            | Op::RmsNorm
            | Op::RmsNormScale
            | Op::LayerNorm
            | Op::LayerNormAffine
            | Op::Rope
            | Op::Embedding
            | Op::Sum
            | Op::Mean
            | Op::Max
            | Op::MaxPool2d
            | Op::AvgPool2d
            | Op::AdaptiveAvgPool2d
            | Op::CrossEntropy => KernelKind::Rowwise,
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

/// The op signature a tuned kernel is keyed by: op, attributes and input types.
pub fn signature(module: &Module, step: usize) -> String {
    let s = &module.steps[step];
    let inputs: Vec<String> = s
        .inputs
        .iter()
        .map(|&v| module.values[v as usize].ty.to_string())
        .collect();
    let attrs: Vec<String> = s.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if attrs.is_empty() {
        format!("{}({})", s.op, inputs.join(", "))
    } else {
        format!("{}({}) {{{}}}", s.op, inputs.join(", "), attrs.join(", "))
    }
}

/// The `NAME.kernels.toml` text: one table per distinct op signature, with the kernel, its
/// parameters and the steps that use it.
pub fn kernel_table_toml(module: &Module) -> String {
    let mut by_signature: BTreeMap<String, (KernelChoice, Vec<usize>)> = BTreeMap::new();
    for (i, step) in module.steps.iter().enumerate() {
        by_signature
            .entry(signature(module, i))
            .or_insert_with(|| (step.kernel.clone(), Vec::new()))
            .1
            .push(i);
    }
    let mut out =
        String::from("# mslc kernel table: the kernel and parameters chosen per op signature.\n");
    let _ = writeln!(out, "model = {}", toml_string(&module.name));
    let _ = writeln!(out, "target = {}", toml_string(&module.target));
    let _ = writeln!(
        out,
        "fingerprint = {}",
        toml_string(&module.target_fingerprint)
    );
    for (sig, (kernel, steps)) in &by_signature {
        let _ = writeln!(out, "\n[[kernel]]");
        let _ = writeln!(out, "signature = {}", toml_string(sig));
        let _ = writeln!(out, "name = {}", toml_string(&kernel.name));
        let steps: Vec<String> = steps.iter().map(usize::to_string).collect();
        let _ = writeln!(out, "steps = [{}]", steps.join(", "));
        let _ = writeln!(out, "tuned = false");
        if !kernel.params.is_empty() {
            let params: Vec<String> = kernel
                .params
                .iter()
                .map(|(k, v)| match v {
                    KernelParam::Int(i) => format!("{k} = {i}"),
                    KernelParam::Text(t) => format!("{k} = {}", toml_string(t)),
                })
                .collect();
            let _ = writeln!(out, "params = {{ {} }}", params.join(", "));
        }
    }
    out
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
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
