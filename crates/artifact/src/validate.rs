//! Consistency checks on a decoded module, so the executor can trust every index, type and
//! offset in it even when the file was crafted by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mslc_core::ops::{self, DType, TensorType};

use super::module::{may_overwrite, Module, Step, Storage};
use mslc_kernels::binding::KernelParam;

/// Checks names, indices, the definition order, types (re-inferred through the op registry),
/// arena and hoisted-region bounds, that hoisted values do not overlap and are computed from
/// parameters and hoisted values alone, and that each next value replaces an input or parameter
/// of its type under its output name; the message names the first problem.
pub fn validate(module: &Module) -> Result<(), String> {
    validate_names(module)?;
    validate_next_values(module)?;
    check_tensor_sizes(module)?;
    let n = module.values.len();
    let mut defined = vec![false; n];
    let mut hoisted = Vec::new();
    for (i, v) in module.values.iter().enumerate() {
        let (offset, region, size) = match &v.storage {
            Storage::Input { .. } | Storage::Param { .. } => {
                defined[i] = true;
                (0, "", 0)
            }
            Storage::Arena { offset } => (*offset, "arena", module.arena_bytes),
            Storage::Hoisted { offset } => (*offset, "hoisted region", module.hoisted_bytes),
            Storage::Next { .. } | Storage::Overwrite { .. } => (0, "", 0),
        };
        if !region.is_empty() {
            let end = offset
                .checked_add(v.ty.bytes())
                .ok_or("value offset overflows")?;
            if offset % 64 != 0 || end > size {
                return Err(format!(
                    "value %{i} ({}) at offset {offset} does not fit the {size}-byte {region} aligned to 64",
                    v.ty
                ));
            }
            if matches!(v.storage, Storage::Hoisted { .. }) && offset < end {
                hoisted.push((offset, end, i));
            }
        }
    }
    hoisted.sort_unstable();
    for pair in hoisted.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        if start < end {
            return Err(format!("hoisted values %{a} and %{b} overlap"));
        }
    }
    let invariant = |i: usize| {
        matches!(
            module.values[i].storage,
            Storage::Param { .. } | Storage::Hoisted { .. }
        )
    };
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
            match module.values[o].storage {
                Storage::Arena { .. } | Storage::Next { .. } | Storage::Overwrite { .. } => {}
                Storage::Hoisted { .. } => {
                    if let Some(&i) = step.inputs.iter().find(|&&i| !invariant(i as usize)) {
                        return Err(format!(
                            "step {s} ({}) writes hoisted %{o} but reads %{i}, which is not \
                             a parameter or hoisted value",
                            step.op
                        ));
                    }
                }
                _ => {
                    return Err(format!(
                        "step {s} writes %{o}, which is not an arena, hoisted or next value"
                    ))
                }
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
    validate_guard(module)?;
    check_liveness(module)
}

/// The guard's flag is a one-element f32 that a step before the guarded ones computes.
fn validate_guard(module: &Module) -> Result<(), String> {
    let Some(guard) = module.guard else {
        return Ok(());
    };
    if guard.from as usize > module.steps.len() {
        return Err(format!(
            "the guard starts at step {}, past the {} steps",
            guard.from,
            module.steps.len()
        ));
    }
    let flag = module
        .values
        .get(guard.flag as usize)
        .ok_or_else(|| format!("the guard's flag %{} is no value", guard.flag))?;
    if flag.ty.dtype != DType::F32 || flag.ty.numel() != 1 {
        return Err(format!(
            "the guard's flag %{} is {}, not one f32",
            guard.flag, flag.ty
        ));
    }
    let computed = module.steps[..guard.from as usize]
        .iter()
        .any(|step| step.outputs.contains(&guard.flag));
    if !computed {
        return Err(format!(
            "the guard's flag %{} is not computed before step {}",
            guard.flag, guard.from
        ));
    }
    Ok(())
}

/// Each next value is the module's output of its name, and an input or parameter of that name
/// has its type: writing it back exchanges the two buffers, so they must be interchangeable.
/// A value that overwrites its input or parameter ([`Storage::Overwrite`]) is computed by the
/// last step that reads it, which reads it once, at an operand that output may overwrite
/// ([`may_overwrite`]), or by a step after that one ([`check_overwrite`]), and nothing else
/// outputs it.
fn validate_next_values(module: &Module) -> Result<(), String> {
    for (i, v) in module.values.iter().enumerate() {
        let (Storage::Next { name } | Storage::Overwrite { name }) = &v.storage else {
            continue;
        };
        if !module
            .outputs
            .iter()
            .any(|(n, o)| n == name && *o as usize == i)
        {
            return Err(format!(
                "value %{i}, the next value of `{name}`, is not the output `{name}`"
            ));
        }
        let Some(r) = module
            .replaced(name)
            .filter(|&r| module.values[r].ty == v.ty)
        else {
            return Err(format!(
                "value %{i} ({}) is the next value of `{name}`, but no input or parameter `{name}` has its type",
                v.ty
            ));
        };
        if matches!(v.storage, Storage::Overwrite { .. }) {
            check_overwrite(module, i, r)
                .map_err(|why| format!("value %{i} overwrites `{name}` (%{r}), but {why}"))?;
        }
    }
    Ok(())
}

/// Why value `v` may not overwrite value `r` (an input or parameter) in its buffer, if it may
/// not: the step computing `v` must read `r` once, at an operand that output may overwrite
/// ([`may_overwrite`]), or not at all (it writes into a buffer nothing reads any more:
/// an optimizer-sharded update's all-gathered parameter); no later step may read `r`, and `r`
/// may not be an output.
pub fn check_overwrite(module: &Module, v: usize, r: usize) -> Result<(), String> {
    let (r32, v32) = (r as u32, v as u32);
    if module.outputs.iter().any(|&(_, o)| o == r32) {
        return Err("that value is an output".to_string());
    }
    let Some(s) = module.steps.iter().position(|st| st.outputs.contains(&v32)) else {
        return Err("no step computes it".to_string());
    };
    let step = &module.steps[s];
    let k = step.outputs.iter().position(|&o| o == v32).unwrap_or(0);
    let operand = step.inputs.iter().position(|&i| i == r32);
    match step.inputs.iter().filter(|&&i| i == r32).count() {
        0 => {}
        1 if operand.is_some_and(|j| may_overwrite(module, step, k, j)) => {}
        1 => {
            return Err(format!(
                "step {s} ({}) cannot write its output {k} over that operand",
                step.op
            ))
        }
        _ => return Err(format!("step {s} ({}) reads it twice", step.op)),
    }
    if let Some(later) =
        (s + 1..module.steps.len()).find(|&t| module.steps[t].inputs.contains(&r32))
    {
        return Err(format!(
            "step {later} ({}) reads it after step {s} overwrote it",
            module.steps[later].op
        ));
    }
    Ok(())
}

/// Arena values alive at the same time occupy disjoint bytes. A value lives from the step
/// that computes it to the last step that reads it (outputs to the end); the exceptions are a
/// view (a `reshape`) of its step's input 0, which may share exactly its bytes while both live,
/// and a result written in place over input 0's bytes when every value there dies at that step
/// and no other operand reads them. One sweep over the steps, keeping the live byte ranges
/// ordered by offset, each with the values sharing it: as the ranges are pairwise disjoint, a
/// new one only has to be checked against its neighbours. Indices must already be validated.
fn check_liveness(module: &Module) -> Result<(), String> {
    let steps = module.steps.len();
    let n = module.values.len();
    let mut last = vec![0usize; n];
    for (s, step) in module.steps.iter().enumerate() {
        for &v in step.inputs.iter().chain(&step.outputs) {
            last[v as usize] = s;
        }
    }
    for &(_, v) in &module.outputs {
        last[v as usize] = steps.saturating_sub(1);
    }
    let range = |v: u32| match module.values[v as usize].storage {
        Storage::Arena { offset } => Some((offset, offset + module.values[v as usize].ty.bytes())),
        _ => None,
    };
    // Live ranges by offset: offset -> (end, the values sharing it).
    let mut live: BTreeMap<u64, (u64, Vec<u32>)> = BTreeMap::new();
    let mut expiring: Vec<Vec<(u64, u32)>> = vec![Vec::new(); steps];
    for (s, step) in module.steps.iter().enumerate() {
        if let Some(prev) = s.checked_sub(1) {
            for (offset, v) in std::mem::take(&mut expiring[prev]) {
                // Unless a result computed in place over it has taken its place.
                if let Some((_, values)) = live.get_mut(&offset) {
                    values.retain(|&w| w != v);
                    if values.is_empty() {
                        live.remove(&offset);
                    }
                }
            }
        }
        for &o in &step.outputs {
            let Some((start, end)) = range(o).filter(|(a, b)| a < b) else {
                continue;
            };
            // The live values at exactly these bytes, when input 0 is one of them.
            let input0 = step.inputs.first().copied();
            let sharing = input0
                .filter(|&i| range(i) == Some((start, end)))
                .and_then(|i| {
                    live.get(&start)
                        .filter(|(e, vs)| *e == end && vs.contains(&i))
                });
            if let Some((_, values)) = sharing {
                if step.op.spec().is_view() {
                    live.get_mut(&start).expect("shared").1.push(o);
                    expiring[last[o as usize]].push((start, o));
                    continue;
                }
                let others_read = step.inputs[1..]
                    .iter()
                    .any(|&j| range(j) == Some((start, end)));
                if !others_read && values.iter().all(|&w| last[w as usize] == s) {
                    live.remove(&start);
                }
            }
            let before = live.range(..=start).next_back();
            let after = live.range(start..).next();
            for (&other_start, (other_end, others)) in before.into_iter().chain(after) {
                if other_start < end && start < *other_end {
                    return Err(format!(
                        "%{o} (bytes {start}..{end}, computed by step {s}) overlaps %{} (bytes {other_start}..{other_end}), which is still alive",
                        others[0]
                    ));
                }
            }
            live.insert(start, (end, vec![o]));
            expiring[last[o as usize]].push((start, o));
        }
    }
    Ok(())
}

/// The most elements one tensor may have (2^40, 4 TiB of f32): far beyond any model this
/// executor runs, and small enough that no size computed from it overflows.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

/// Every value's element count is defined (no negative dim, no i64 overflow) and at most
/// [`MAX_TENSOR_ELEMENTS`]; the message names the first value that is not and says what it is.
pub fn check_tensor_sizes(module: &Module) -> Result<(), String> {
    for (i, v) in module.values.iter().enumerate() {
        if v.ty
            .checked_numel()
            .is_some_and(|n| n <= MAX_TENSOR_ELEMENTS)
        {
            continue;
        }
        let what = match &v.storage {
            Storage::Input { name } => format!("input `{name}`"),
            Storage::Param { path, .. } => format!("parameter `{path}`"),
            Storage::Arena { .. }
            | Storage::Hoisted { .. }
            | Storage::Next { .. }
            | Storage::Overwrite { .. } => format!("value %{i}"),
        };
        return Err(format!(
            "{what} is {}, more than the {MAX_TENSOR_ELEMENTS} elements a tensor may have",
            v.ty
        ));
    }
    Ok(())
}

/// Words the `.msl` grammar reserves (the `keyword` rule of `grammar/msl.pest`); no identifier
/// it accepts is one of them.
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

/// Whether `s` may name an input or output: an identifier, or a dotted path like a parameter's
/// (a training module's optimizer states and new parameters, `layers.0.weight.exp_avg`), which
/// stays a plain file name.
fn is_value_name(s: &str) -> bool {
    is_identifier(s) || is_param_path(s)
}

/// Whether `s` is a parameter path: identifiers and indices joined by dots (`layers.0.wq`).
pub fn is_param_path(s: &str) -> bool {
    s.split('.').all(|part| {
        is_identifier(part) || (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Every name the module carries (model, inputs, outputs, parameter paths) is one the `.msl`
/// grammar allows (or, for inputs and outputs, a parameter-like path), and no two inputs, outputs or parameters share a name. Names become file
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
                if !is_value_name(name) {
                    return Err(format!(
                        "input %{i} has the name {name:?}, not an identifier or a parameter path"
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
            Storage::Arena { .. }
            | Storage::Hoisted { .. }
            | Storage::Next { .. }
            | Storage::Overwrite { .. } => {}
        }
    }
    let mut outputs = BTreeSet::new();
    for (name, _) in &module.outputs {
        if !is_value_name(name) {
            return Err(format!(
                "output name {name:?} is not an identifier or a parameter path"
            ));
        }
        if !outputs.insert(name.as_str()) {
            return Err(format!("two outputs are named `{name}`"));
        }
    }
    Ok(())
}

/// `DIR/NAME.EXT` for a name read from a module, refused unless `name` is an identifier or a
/// parameter-like path (a training step's `lm_head.weight.exp_avg`: no separator, no empty or
/// dot-only part), so the path stays inside `dir` whatever the module says.
pub fn file_in(dir: &Path, name: &str, ext: &str) -> Result<PathBuf, String> {
    if !is_value_name(name) {
        return Err(format!(
            "{name:?} is neither an identifier nor a parameter path, so it cannot name a file in {}",
            dir.display()
        ));
    }
    Ok(dir.join(format!("{name}.{ext}")))
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
    // GEMM rows up to which A is read unpacked (decode shapes; with B packed ahead).
    ("small_m", 0, 1 << 12),
    ("small_m_packed_b", 0, 1 << 12),
    // GEMM rows up to which a weight stored in f16 is packed as f16.
    ("half_b_rows", 0, 1 << 12),
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

/// The bounds a module accepts for the integer kernel parameter `name` (a field of a kernels'
/// parameter struct), or `None` for a name it does not accept; a tuner searches within them.
pub fn kernel_param_bounds(name: &str) -> Option<(i64, i64)> {
    KERNEL_PARAM_BOUNDS
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|&(_, low, high)| (low, high))
}

/// Every integer kernel parameter is a known one within its bounds (text parameters, such as
/// the micro-kernel ISA, are checked when the kernel is prepared).
fn validate_kernel_params(s: usize, step: &Step) -> Result<(), String> {
    for (name, value) in &step.kernel.params {
        let KernelParam::Int(v) = value else { continue };
        let Some((low, high)) = kernel_param_bounds(name) else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_the_grammars() {
        let grammar = include_str!("../../../grammar/msl.pest");
        let rule = grammar
            .lines()
            .find(|l| l.starts_with("keyword"))
            .expect("the grammar has a `keyword` rule");
        let mut in_grammar: Vec<&str> = rule.split('"').skip(1).step_by(2).collect();
        let mut here = KEYWORDS.to_vec();
        in_grammar.sort_unstable();
        here.sort_unstable();
        assert_eq!(
            here, in_grammar,
            "KEYWORDS must copy grammar/msl.pest's `keyword` rule"
        );
    }

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
        assert_eq!(
            file_in(dir, "layers.0.weight.exp_avg", "npy").unwrap(),
            Path::new("od/layers.0.weight.exp_avg.npy")
        );
        for bad in [
            "../../x", "/abs/x", "..", ".", "", "a/b", "a..b", ".a", "a.",
        ] {
            assert!(file_in(dir, bad, "npy").is_err(), "{bad:?}");
        }
    }
}
