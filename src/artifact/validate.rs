//! Consistency checks on a decoded module, so the executor can trust every index, type and
//! offset in it even when the file was crafted by hand.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::ops::{self, TensorType};

use super::module::{KernelParam, Module, Step, Storage};

/// Checks names, indices, the definition order, types (re-inferred through the op registry) and
/// arena bounds; the message names the first problem.
pub fn validate(module: &Module) -> Result<(), String> {
    validate_names(module)?;
    let n = module.values.len();
    let mut defined = vec![false; n];
    for (i, v) in module.values.iter().enumerate() {
        match &v.storage {
            Storage::Input { .. } | Storage::Param { .. } => defined[i] = true,
            Storage::Arena { offset } => {
                let end = offset
                    .checked_add(v.ty.bytes())
                    .ok_or("arena offset overflows")?;
                if offset % 64 != 0 || end > module.arena_bytes {
                    return Err(format!(
                        "value %{i} ({}) at offset {offset} does not fit the {}-byte arena aligned to 64",
                        v.ty, module.arena_bytes
                    ));
                }
            }
        }
        if v.ty.checked_numel().is_none() {
            return Err(format!("value %{i} has an invalid shape"));
        }
    }
    let check = |i: u32| -> Result<usize, String> {
        let i = i as usize;
        if i < n {
            Ok(i)
        } else {
            Err(format!("value index {i} out of range ({n} values)"))
        }
    };
    for (s, step) in module.steps.iter().enumerate() {
        validate_kernel_params(s, step)?;
        let mut types: Vec<TensorType> = Vec::with_capacity(step.inputs.len());
        for &input in &step.inputs {
            let i = check(input)?;
            if !defined[i] {
                return Err(format!(
                    "step {s} ({}) reads %{i} before it is computed",
                    step.op
                ));
            }
            types.push(module.values[i].ty.clone());
        }
        let inferred = ops::infer(step.op, &step.attrs, &types)
            .map_err(|e| format!("step {s}: {}", e.message))?;
        if inferred.len() != step.outputs.len() {
            return Err(format!(
                "step {s} ({}) has {} outputs, the op gives {}",
                step.op,
                step.outputs.len(),
                inferred.len()
            ));
        }
        for (&out, ty) in step.outputs.iter().zip(&inferred) {
            let o = check(out)?;
            if defined[o] {
                return Err(format!(
                    "step {s} ({}) writes %{o}, which is already defined",
                    step.op
                ));
            }
            if !matches!(module.values[o].storage, Storage::Arena { .. }) {
                return Err(format!("step {s} writes %{o}, which is not an arena value"));
            }
            if &module.values[o].ty != ty {
                return Err(format!(
                    "step {s} ({}): %{o} is {} but the op gives {ty}",
                    step.op, module.values[o].ty
                ));
            }
            defined[o] = true;
        }
    }
    for (name, v) in &module.outputs {
        let i = check(*v)?;
        if !defined[i] {
            return Err(format!("output `{name}` is never computed"));
        }
    }
    Ok(())
}

/// Words the `.msl` grammar reserves; no identifier it accepts is one of them.
const KEYWORDS: &[&str] = &[
    "let", "for", "in", "if", "else", "return", "true", "false", "pub", "import", "as",
];

/// Whether `s` is an identifier of the `.msl` grammar: a letter or `_`, then letters, digits
/// and `_`, not a keyword. Such a name is a safe file name: no separator, never `.` or `..`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&s)
}

/// Whether `s` is a parameter path: identifiers and indices joined by dots (`layers.0.wq`).
pub fn is_param_path(s: &str) -> bool {
    s.split('.').all(|part| {
        is_identifier(part) || (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Every name the module carries (model, inputs, outputs, parameter paths) is one the `.msl`
/// grammar allows, and no two inputs, outputs or parameters share a name. Names become file
/// names (`--output-dir DIR` writes `DIR/NAME.npy`), so this is what keeps a crafted module
/// from writing outside the directory.
fn validate_names(module: &Module) -> Result<(), String> {
    if !is_identifier(&module.name) {
        return Err(format!("model name {:?} is not an identifier", module.name));
    }
    let mut inputs = BTreeSet::new();
    let mut params = BTreeSet::new();
    for (i, v) in module.values.iter().enumerate() {
        match &v.storage {
            Storage::Input { name } => {
                if !is_identifier(name) {
                    return Err(format!(
                        "input %{i} has the name {name:?}, not an identifier"
                    ));
                }
                if !inputs.insert(name.as_str()) {
                    return Err(format!("two inputs are named `{name}`"));
                }
            }
            Storage::Param { path, .. } => {
                if !is_param_path(path) {
                    return Err(format!(
                        "parameter %{i} has the path {path:?}, not dot-separated identifiers and indices"
                    ));
                }
                if !params.insert(path.as_str()) {
                    return Err(format!("two parameters have the path `{path}`"));
                }
            }
            Storage::Arena { .. } => {}
        }
    }
    let mut outputs = BTreeSet::new();
    for (name, _) in &module.outputs {
        if !is_identifier(name) {
            return Err(format!("output name {name:?} is not an identifier"));
        }
        if !outputs.insert(name.as_str()) {
            return Err(format!("two outputs are named `{name}`"));
        }
    }
    Ok(())
}

/// `DIR/NAME.EXT` for a name read from a module, refused unless `name` is an identifier, so the
/// path stays inside `dir` whatever the module says.
pub fn file_in(dir: &Path, name: &str, ext: &str) -> Result<PathBuf, String> {
    if !is_identifier(name) {
        return Err(format!(
            "{name:?} is not an identifier, so it cannot name a file in {}",
            dir.display()
        ));
    }
    Ok(dir.join(format!("{name}.{ext}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_identifiers_and_paths_dotted_identifiers_or_indices() {
        for good in ["x", "_t0", "Mlp", "logits"] {
            assert!(is_identifier(good), "{good}");
        }
        for bad in [
            "", ".", "..", "../../x", "/abs/x", "a/b", "a.b", "0x", "let", "a-b", "é",
        ] {
            assert!(!is_identifier(bad), "{bad:?}");
        }
        for good in ["w", "layers.0.attn.wq", "model.embed_tokens.weight"] {
            assert!(is_param_path(good), "{good}");
        }
        for bad in ["", ".", "a..b", "a.", ".a", "a/b", "a.-1", "../x"] {
            assert!(!is_param_path(bad), "{bad:?}");
        }
    }

    #[test]
    fn file_in_keeps_paths_inside_the_directory() {
        let dir = Path::new("od");
        assert_eq!(file_in(dir, "y", "npy").unwrap(), Path::new("od/y.npy"));
        for bad in ["../../x", "/abs/x", "..", ".", ""] {
            assert!(file_in(dir, bad, "npy").is_err(), "{bad:?}");
        }
    }
}

/// The bounds of every kernel parameter (by its field name in the kernels' parameter structs):
/// tile and block sizes at least 1 and small enough that their buffers are modest, thread
/// splits and thresholds non-negative. Generous for any tuner, fatal for none.
const KERNEL_PARAM_BOUNDS: &[(&str, i64, i64)] = &[
    // Elementwise register block, in elements per task.
    ("block", 1, 1 << 20),
    // GEMM tiles: packed blocks of mc·kc and kc·nc values.
    ("mc", 1, 1 << 12),
    ("kc", 1, 1 << 12),
    ("nc", 1, 1 << 14),
    // Attention tiles: a block_q × block_k score tile per task.
    ("block_q", 1, 1 << 12),
    ("block_k", 1, 1 << 12),
    // Transpose tile side.
    ("tile", 1, 1 << 12),
    ("task_elems", 1, 1 << 40),
    ("tasks_per_thread", 0, 1 << 10),
    ("min_parallel_elems", 0, 1 << 62),
    ("min_parallel_flops", 0, 1 << 62),
];

/// Every integer kernel parameter is a known one within its bounds (text parameters, such as
/// the micro-kernel ISA, are checked when the kernel is prepared).
fn validate_kernel_params(s: usize, step: &Step) -> Result<(), String> {
    for (name, value) in &step.kernel.params {
        let KernelParam::Int(v) = value else { continue };
        let Some(&(_, low, high)) = KERNEL_PARAM_BOUNDS.iter().find(|(n, ..)| n == name) else {
            return Err(format!(
                "step {s} ({}): kernel `{}` has no integer parameter `{name}`",
                step.op, step.kernel.name
            ));
        };
        if !(low..=high).contains(v) {
            return Err(format!(
                "step {s} ({}): kernel parameter `{name}` = {v} is outside {low}..={high}",
                step.op
            ));
        }
    }
    Ok(())
}
