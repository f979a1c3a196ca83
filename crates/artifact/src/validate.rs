//! Consistency checks on a decoded module, so the executor can trust every index, type and
//! offset in it even when the file was crafted by hand.

use mslc_core::ops::{self, TensorType};

use super::module::{Module, Storage};

/// Checks indices, the definition order, types (re-inferred through the op registry), arena and
/// hoisted-region bounds, that hoisted values do not overlap and are computed from parameters
/// and hoisted values alone; the message names the first problem.
pub fn validate(module: &Module) -> Result<(), String> {
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
        if v.ty.checked_numel().is_none() {
            return Err(format!("value %{i} has an invalid shape"));
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
                Storage::Arena { .. } => {}
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
                        "step {s} writes %{o}, which is not an arena or hoisted value"
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
    Ok(())
}
