//! The choices every front end makes the same way before compiling: which model of a file is
//! the entry, which target it is planned for, and which dims the caller's input arrays imply.

use std::collections::BTreeMap;

use mslc_check::policy::PrecisionPolicy;
use mslc_check::Checked;
use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_core::ops::{DType, Op};
use mslc_core::precision::LowPrecision;
use mslc_core::program::Model;
use mslc_core::span::Span;
use mslc_ir::passes::AmpConfig;
use mslc_plan::target::Target;

use crate::compile::{CompileOptions, UpdatePlacement};
use crate::target::target_from_spec;

/// A problem with a choice made outside the source (a flag, a build-script setting), reported
/// against the root file's first model.
pub fn root_error(checked: &Checked, code: Code, message: String, help: String) -> Box<Diagnostic> {
    let span = checked
        .models
        .first()
        .map_or(Span::default(), |m| m.loc.span);
    Box::new(
        // The root file is always the first one read.
        Diagnostic::error(code, FileId(0), span, message)
            .with_label("in this file")
            .with_help(help),
    )
}

/// The entry model: `entry` when given, else the file's only model, else the one model its
/// `train` declarations name.
pub fn choose_model<'a>(
    checked: &'a Checked,
    entry: Option<&str>,
) -> Result<&'a Model, Box<Diagnostic>> {
    let names: Vec<&str> = checked.models.iter().map(|m| m.name.as_str()).collect();
    if let Some(entry) = entry {
        return checked.model(entry).ok_or_else(|| {
            root_error(
                checked,
                Code::E0611,
                format!("--entry {entry}: no model `{entry}` in this file"),
                format!("models here: {}", names.join(", ")),
            )
        });
    }
    let mut trained: Vec<&str> = checked
        .decls
        .trains
        .iter()
        .map(|t| t.spec.model.name.as_str())
        .collect();
    trained.sort_unstable();
    trained.dedup();
    match (checked.models.as_slice(), trained.as_slice()) {
        ([only], _) => Ok(only),
        ([], _) => Err(root_error(
            checked,
            Code::E0403,
            "this file declares no model".to_string(),
            "declare one with `model Name { … }`".to_string(),
        )),
        (_, [one]) => checked.model(one).ok_or_else(|| {
            root_error(
                checked,
                Code::E0403,
                format!("no model `{one}`"),
                String::new(),
            )
        }),
        _ => Err(root_error(
            checked,
            Code::E0611,
            "this file declares several models".to_string(),
            format!("choose one with --entry: {}", names.join(", ")),
        )),
    }
}

/// The target to plan `model` for: `name` when given, else the target of the `train` that
/// names the model, else `cpu` (the bundled executor).
pub fn choose_target(
    checked: &Checked,
    model: &Model,
    name: Option<&str>,
) -> Result<Target, Box<Diagnostic>> {
    let from_train = checked
        .decls
        .trains
        .iter()
        .find(|t| t.spec.model.name == model.name)
        .and_then(|t| t.target)
        .map(|i| checked.decls.targets[i].name.name.as_str());
    let flag = name.is_some();
    let name = name.or(from_train).unwrap_or("cpu");
    let spec = checked.decls.target(name).ok_or_else(|| {
        let known: Vec<&str> = checked
            .decls
            .targets
            .iter()
            .map(|t| t.name.name.as_str())
            .collect();
        // A name from the command line is a usage error; the default `cpu` can be missing only
        // from a `--stdlib` folder without it.
        let (code, message) = if flag {
            (Code::E0610, format!("--target {name}: no such target"))
        } else {
            (Code::E0509, format!("no target `{name}` to build for"))
        };
        root_error(
            checked,
            code,
            message,
            format!("targets: {}", known.join(", ")),
        )
    })?;
    Ok(target_from_spec(spec))
}

/// The choices a caller makes on the command line (or in a build script) about how to compile a
/// model, each `None` to take the file's own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Selection<'a> {
    /// `--target NAME`: the target to plan for.
    pub target: Option<&'a str>,
    /// `--precision NAME`: `f32`, or the name of a `precision` declaration to compile with
    /// instead of the one the model's `train` names.
    pub precision: Option<&'a str>,
    /// Whether the fusion pass runs.
    pub fuse: bool,
    /// Whether the IR verifier runs after every pass.
    pub verify: bool,
}

/// How to compile `model`: the target ([`choose_target`]: the selected one when given, else its
/// `train`'s, else `cpu`) and the mixed precision ([`choose_precision`]: the selected policy, else
/// its `train`'s). Every front end that compiles a model (`mslc build`, `mslc run FILE.msl`, build
/// scripts) takes its options from here, so one file compiles to one module, and gives the same
/// numbers, whichever command compiled it.
pub fn compile_options(
    checked: &Checked,
    model: &Model,
    selection: Selection,
) -> Result<CompileOptions, Box<Diagnostic>> {
    Ok(CompileOptions {
        target: choose_target(checked, model, selection.target)?,
        verify: selection.verify,
        fuse: selection.fuse,
        amp: choose_precision(checked, model, selection.precision)?,
        unfused: Default::default(),
        updates: UpdatePlacement::Beside,
    })
}

/// The mixed precision to compile `model` with: none for `--precision f32`, the named policy
/// for `--precision NAME`, else the policy of the `train` that trains `model`, if it names one.
pub fn choose_precision(
    checked: &Checked,
    model: &Model,
    name: Option<&str>,
) -> Result<Option<AmpConfig>, Box<Diagnostic>> {
    Ok(choose_policy(checked, model, name)?.map(amp_config))
}

/// The `precision` policy [`choose_precision`] compiles with, for the choices beyond cast
/// placement (a training step's loss scaling).
pub fn choose_policy<'c>(
    checked: &'c Checked,
    model: &Model,
    name: Option<&str>,
) -> Result<Option<&'c PrecisionPolicy>, Box<Diagnostic>> {
    let precisions = &checked.decls.precisions;
    Ok(match name {
        Some("f32") => None,
        Some(name) => Some(
            precisions
                .iter()
                .find(|p| p.name.name == name)
                .ok_or_else(|| {
                    let mut known = vec!["f32"];
                    known.extend(precisions.iter().map(|p| p.name.name.as_str()));
                    root_error(
                        checked,
                        Code::E0613,
                        format!("--precision {name}: no such precision policy"),
                        format!("policies: {}", known.join(", ")),
                    )
                })?,
        ),
        None => checked
            .decls
            .trains
            .iter()
            .find(|t| t.spec.model.name == model.name)
            .and_then(|t| t.precision)
            .map(|i| &precisions[i]),
    })
}

/// The cast placement a checked policy asks for.
pub fn amp_config(p: &PrecisionPolicy) -> AmpConfig {
    let compute = match p.compute {
        LowPrecision::F16 => DType::F16,
        LowPrecision::BF16 => DType::BF16,
    };
    AmpConfig {
        level: p.level,
        compute,
        keep_f32: p.keep_f32.iter().filter_map(|n| Op::from_name(n)).collect(),
        keep_batchnorm_f32: p.keep_batchnorm_f32,
    }
}

/// The dims the caller's input arrays imply (`shapes` by input name), from the model's symbolic
/// input dims: a dim written at some position of an input takes the array's size there. Dims
/// in `fixed` (set explicitly) and dims that keep their value are left out. Two arrays that
/// disagree on a dim are an error naming both.
pub fn dims_from_inputs(
    model: &Model,
    shapes: &BTreeMap<String, Vec<usize>>,
    fixed: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, String> {
    let mut found: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for input in &model.inputs {
        let Some(shape) = shapes.get(&input.name) else {
            continue;
        };
        if shape.len() != input.dims.len() {
            continue;
        }
        for (dim, &size) in input.dims.iter().zip(shape) {
            let Some(dim) = dim.as_deref().filter(|d| !fixed.contains_key(*d)) else {
                continue;
            };
            match found.get(dim) {
                Some(&(other, by)) if other != size => {
                    return Err(format!(
                        "the inputs disagree on dim {dim}: `{by}` gives {other}, `{}` gives {size}",
                        input.name
                    ))
                }
                Some(_) => {}
                None => {
                    found.insert(dim, (size, &input.name));
                }
            }
        }
    }
    Ok(model
        .dims
        .iter()
        .filter_map(|(dim, value)| {
            let &(size, _) = found.get(dim.as_str())?;
            (size as i64 != *value).then(|| (dim.clone(), size.to_string()))
        })
        .collect())
}
