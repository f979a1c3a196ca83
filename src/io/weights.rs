//! Matching a weights file to a model's parameters by path: every parameter needs a tensor of
//! the same shape in a float dtype, and the file holds nothing else. All mismatches are
//! collected, so the user sees the whole list at once.

use std::fmt;

use super::safetensors::{SafetensorsFile, StDType};

/// What a parameter expects: its path and shape.
pub type ParamShape<'a> = (&'a str, &'a [i64]);

/// Every way a weights file disagrees with the model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WeightMismatch {
    /// Parameters the file lacks.
    pub missing: Vec<String>,
    /// Tensors the model has no parameter for.
    pub extra: Vec<String>,
    /// Tensors with the wrong shape or a non-float dtype: `name: expected …, found …`.
    pub mismatched: Vec<String>,
}

impl WeightMismatch {
    /// Whether the file matches.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.mismatched.is_empty()
    }
}

impl fmt::Display for WeightMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |names: &[String]| {
            let mut s = names.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
            if names.len() > 8 {
                s.push_str(&format!(", … ({} in all)", names.len()));
            }
            s
        };
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing: {}", show(&self.missing)));
        }
        if !self.extra.is_empty() {
            parts.push(format!("not in the model: {}", show(&self.extra)));
        }
        if !self.mismatched.is_empty() {
            parts.push(format!("mismatched: {}", show(&self.mismatched)));
        }
        f.write_str(&parts.join("; "))
    }
}

/// Compares `file` with the model's parameters.
pub fn match_params(file: &SafetensorsFile, params: &[ParamShape]) -> WeightMismatch {
    let mut result = WeightMismatch::default();
    for (path, shape) in params {
        match file.tensor(path) {
            Err(_) => result.missing.push(path.to_string()),
            Ok(t) => {
                let found: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                let float = matches!(t.dtype, StDType::F32 | StDType::F16 | StDType::BF16);
                if found.as_slice() != *shape || !float {
                    result.mismatched.push(format!(
                        "{path}: expected float {:?}, found {} {:?}",
                        shape,
                        t.dtype.name(),
                        found
                    ));
                }
            }
        }
    }
    for t in file.tensors() {
        if !params.iter().any(|(p, _)| *p == t.name) {
            result.extra.push(t.name.to_string());
        }
    }
    result
}
