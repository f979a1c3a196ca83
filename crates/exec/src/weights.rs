//! Matching a weights file to a module's parameters by path: every missing, extra or
//! mismatched tensor is found before anything is loaded, and reported together.

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

/// For each parameter `(path, type)`, the tensor of `tensors` that fills it; or every problem,
/// one per line: parameters without a tensor, tensors without a parameter, and tensors whose
/// shape differs from their parameter's or whose dtype cannot convert to it (floats convert
/// to any float dtype, as checkpoints often come in another precision; ints must match).
pub fn match_weights<'a>(
    params: &[(&str, &TensorType)],
    tensors: impl IntoIterator<Item = TensorRef<'a>>,
) -> Result<Vec<TensorRef<'a>>, String> {
    let mut found: Vec<Option<TensorRef<'a>>> = vec![None; params.len()];
    let mut problems = Vec::new();
    let mut extra = Vec::new();
    for t in tensors {
        let Some(i) = params.iter().position(|(p, _)| *p == t.name) else {
            extra.push(t.name.to_string());
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
        Ok(found.into_iter().flatten().collect())
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
        assert_eq!(got[0].name, "w");
        assert_eq!(got[1].name, "b");
    }
}
