//! Matching a weights file to a module's parameters by path: every missing, extra or
//! mismatched tensor is found before anything is loaded, and reported together. Buffers that
//! PyTorch and Hugging Face save for their own bookkeeping are recognised and left out.

use mslc_core::ops::{DType, TensorType};
use mslc_io::safetensors::{StDType, TensorRef};

/// The module dtype a safetensors element type stores.
pub fn dtype_of(st: StDType) -> DType {
    match st {
        StDType::F32 => DType::F32,
        StDType::F16 => DType::F16,
        StDType::BF16 => DType::BF16,
        StDType::F64 => DType::F64,
        StDType::I32 => DType::I32,
        StDType::I64 => DType::I64,
        StDType::Bool => DType::Bool,
    }
}

/// A weights file matched to a module's parameters.
#[derive(Debug)]
pub struct Matched<'a> {
    /// For each parameter, in order, the tensor that fills it.
    pub tensors: Vec<TensorRef<'a>>,
    /// Tensors of the file left out as framework bookkeeping: name and what it is, by name.
    pub ignored: Vec<(String, &'static str)>,
}

/// What a tensor that is no parameter of the model is, when it is one of the buffers PyTorch or
/// Hugging Face store in checkpoints for their own bookkeeping, which no forward pass reads:
/// recognised by the last part of its name and its form, so a real weight that happens to share
/// a name (a Linear labelled `attn` has an `attn.bias` of rank 1) is still reported as extra.
pub fn bookkeeping(t: &TensorRef<'_>) -> Option<&'static str> {
    let int = !dtype_of(t.dtype).is_float() && t.dtype != StDType::Bool;
    let rank = t.shape.len();
    let is = |suffix: &str| t.name == suffix || t.name.ends_with(&format!(".{suffix}"));
    if is("num_batches_tracked") && int && rank <= 1 {
        Some("torch BatchNorm's count of training batches")
    } else if is("position_ids") && int && rank <= 2 {
        Some("Hugging Face's cached position indices")
    } else if is("attn.masked_bias") && rank == 0 {
        Some("old Hugging Face GPT-2's masking constant")
    } else if is("attn.bias") && rank == 4 {
        Some("old Hugging Face GPT-2's causal mask")
    } else {
        None
    }
}

/// For each parameter `(path, type)`, the tensor of `tensors` that fills it; or every problem,
/// one per line: parameters without a tensor, tensors without a parameter, and tensors whose
/// shape differs from their parameter's or whose dtype cannot convert to it (floats convert
/// to any float dtype, as checkpoints often come in another precision; ints must match).
/// Extra tensors that are [`bookkeeping`] are no problem: they are listed as ignored.
pub fn match_weights<'a>(
    params: &[(&str, &TensorType)],
    tensors: impl IntoIterator<Item = TensorRef<'a>>,
) -> Result<Matched<'a>, String> {
    let mut found: Vec<Option<TensorRef<'a>>> = vec![None; params.len()];
    let mut problems = Vec::new();
    let mut extra = Vec::new();
    let mut ignored = Vec::new();
    for t in tensors {
        let Some(i) = params.iter().position(|(p, _)| *p == t.name) else {
            match bookkeeping(&t) {
                Some(what) => ignored.push((t.name.to_string(), what)),
                None => extra.push(t.name.to_string()),
            }
            continue;
        };
        let want = params[i].1;
        let shape_ok = want.shape.len() == t.shape.len()
            && want
                .shape
                .iter()
                .zip(t.shape)
                .all(|(&a, &b)| a as u64 == b as u64);
        let dtype = dtype_of(t.dtype);
        let dtype_ok = dtype == want.dtype || (dtype.is_float() && want.dtype.is_float());
        if !shape_ok || !dtype_ok {
            let dims: Vec<String> = t.shape.iter().map(usize::to_string).collect();
            problems.push(format!(
                "`{}` is {dtype}[{}] in the file, but the model's parameter is {want}",
                t.name,
                dims.join(",")
            ));
        }
        found[i] = Some(t);
    }
    let missing: Vec<&str> = params
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|((p, _), _)| *p)
        .collect();
    if !missing.is_empty() {
        problems.insert(0, format!("missing from the file: {}", missing.join(", ")));
    }
    if !extra.is_empty() {
        extra.sort();
        problems.push(format!(
            "in the file but not parameters of the model: {}",
            extra.join(", ")
        ));
    }
    if problems.is_empty() {
        ignored.sort();
        Ok(Matched {
            tensors: found.into_iter().flatten().collect(),
            ignored,
        })
    } else {
        Err(problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(name: &'a str, dtype: StDType, shape: &'a [usize], data: &'a [u8]) -> TensorRef<'a> {
        TensorRef {
            name,
            dtype,
            shape,
            data,
        }
    }

    #[test]
    fn all_problems_reported_together() {
        let w = TensorType::new(DType::F32, [2, 3]);
        let b = TensorType::new(DType::F32, [3]);
        let g = TensorType::new(DType::I32, [3]);
        let params = [("w", &w), ("b", &b), ("g", &g)];
        let data = [0u8; 24];
        let files = [
            t("w", StDType::F32, &[3, 2], &data),
            t("g", StDType::F32, &[3], &data[..12]),
            t("zzz", StDType::F32, &[1], &data[..4]),
        ];
        let e = match_weights(&params, files).unwrap_err();
        assert!(e.contains("missing from the file: b"), "{e}");
        assert!(
            e.contains("`w` is f32[3,2] in the file, but the model's parameter is f32[2,3]"),
            "{e}"
        );
        assert!(e.contains("`g` is f32[3]"), "{e}");
        assert!(e.contains("not parameters of the model: zzz"), "{e}");
        assert_eq!(e.lines().count(), 4);
    }

    #[test]
    fn a_matching_file_fills_every_parameter_in_order() {
        let w = TensorType::new(DType::F16, [2]);
        let b = TensorType::new(DType::F32, []);
        let data = [0u8; 4];
        let files = [
            t("b", StDType::F32, &[], &data),
            t("w", StDType::F16, &[2], &data),
        ];
        let got = match_weights(&[("w", &w), ("b", &b)], files).unwrap();
        assert_eq!(got.tensors[0].name, "w");
        assert_eq!(got.tensors[1].name, "b");
        assert!(got.ignored.is_empty());
    }

    #[test]
    fn framework_bookkeeping_buffers_are_ignored_and_listed() {
        let w = TensorType::new(DType::F32, [2]);
        let data = [0u8; 64];
        let files = [
            t("bn1.num_batches_tracked", StDType::I64, &[], &data[..8]),
            t("w", StDType::F32, &[2], &data[..8]),
            t(
                "embeddings.position_ids",
                StDType::I64,
                &[1, 2],
                &data[..16],
            ),
            t("h.0.attn.bias", StDType::F32, &[1, 1, 2, 2], &data[..16]),
            t("h.0.attn.masked_bias", StDType::F32, &[], &data[..4]),
        ];
        let got = match_weights(&[("w", &w)], files).unwrap();
        let names: Vec<&str> = got.ignored.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "bn1.num_batches_tracked",
                "embeddings.position_ids",
                "h.0.attn.bias",
                "h.0.attn.masked_bias"
            ]
        );
    }

    #[test]
    fn lookalikes_of_bookkeeping_buffers_stay_errors() {
        let w = TensorType::new(DType::F32, [2]);
        let data = [0u8; 16];
        let files = [
            t("w", StDType::F32, &[2], &data[..8]),
            // A Linear labelled `attn` has a rank-1 bias: a real weight the model lacks.
            t("h.0.attn.bias", StDType::F32, &[2], &data[..8]),
            // A float "counter" is not torch's.
            t("bn.num_batches_tracked", StDType::F32, &[], &data[..4]),
            t("num_batches_tracked_extra", StDType::I64, &[], &data[..8]),
        ];
        let e = match_weights(&[("w", &w)], files).unwrap_err();
        assert!(
            e.contains(
                "not parameters of the model: bn.num_batches_tracked, h.0.attn.bias, num_batches_tracked_extra"
            ),
            "{e}"
        );
    }
}
