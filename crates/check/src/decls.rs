//! The declarations of a file checked together with its models: every policy and target is
//! checked once; each `train` resolves its model, policies and target, has its shard rules
//! checked against the model's parameters, and its loss elaborated over the model's outputs
//! and its labels into a training graph.

use std::collections::HashMap;

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_core::ops::Op;
use mslc_syntax::ast::{self, DeclKind, Item};

use super::eval::{Elaborator, Frame};
use super::modules::{ItemRef, ModuleKey, Modules};
use super::policy::{self, MemoryPolicy, ParallelPolicy, PrecisionPolicy, TargetSpec, TrainSpec};
use super::value::Value;
use mslc_core::program::{Input, Loc, Model, Output};

/// A checked `train` declaration.
#[derive(Clone, Debug)]
pub struct Train {
    /// Its fields.
    pub spec: TrainSpec,
    /// Index of its model in [`Declarations::models`]' owner (`Checked::models`).
    pub model: Option<usize>,
    /// Index into [`Declarations::precisions`].
    pub precision: Option<usize>,
    /// Index into [`Declarations::parallels`].
    pub parallel: Option<usize>,
    /// Index into [`Declarations::memories`].
    pub memory: Option<usize>,
    /// Index into [`Declarations::targets`].
    pub target: Option<usize>,
    /// The model plus its labels as inputs and the loss as output `loss`.
    pub graph: Option<Model>,
}

/// Every checked declaration.
#[derive(Clone, Debug, Default)]
pub struct Declarations {
    /// Precision policies.
    pub precisions: Vec<PrecisionPolicy>,
    /// Parallel policies.
    pub parallels: Vec<ParallelPolicy>,
    /// Memory policies.
    pub memories: Vec<MemoryPolicy>,
    /// Targets (the root file's, then the standard library's).
    pub targets: Vec<TargetSpec>,
    /// Trainings.
    pub trains: Vec<Train>,
}

impl Declarations {
    /// A target by name: the root file's first, then `std.targets`.
    pub fn target(&self, name: &str) -> Option<&TargetSpec> {
        self.targets.iter().find(|t| t.name.name == name)
    }
}

/// Checks the declarations of `modules` (root first) against the elaborated `models`.
/// `poisoned[i]` says model `i` had errors: it may lack parameters and outputs, so what
/// follows from their absence is not reported again (one root cause, one diagnostic).
pub fn check_declarations(
    modules: &Modules,
    models: &[Model],
    poisoned: &[bool],
    diags: &mut Vec<Diagnostic>,
) -> Declarations {
    let mut decls = Declarations::default();
    let mut index: HashMap<(usize, usize), usize> = HashMap::new();
    let std_targets = modules
        .modules
        .iter()
        .position(|m| m.key == ModuleKey::Std("targets".to_string()));
    let checked_modules = std::iter::once(0).chain(std_targets);
    for m in checked_modules.collect::<Vec<_>>() {
        let module = &modules.modules[m];
        for (i, item) in module.ast.items.iter().enumerate() {
            let Item::Decl(d) = item else { continue };
            let file = module.file;
            // The root's policies and targets, and the standard library's targets; imported
            // policies are checked when a `train` names them.
            if m != 0 && d.kind != DeclKind::Target {
                continue;
            }
            if let Some(slot) = check_decl(&mut decls, d, file, diags) {
                index.insert((m, i), slot);
            }
        }
    }
    let root = &modules.modules[0];
    for item in &root.ast.items {
        let Item::Decl(d) = item else { continue };
        if d.kind != DeclKind::Train {
            continue;
        }
        let spec = policy::check_train(d, root.file, diags);
        let train = resolve_train(
            modules, models, poisoned, &mut decls, &mut index, spec, diags,
        );
        decls.trains.push(train);
    }
    decls
}

/// Finds a policy of `kind` named `name` as seen from the root module, checking imported ones
/// on first use.
fn resolve_policy(
    modules: &Modules,
    decls: &mut Declarations,
    index: &mut HashMap<(usize, usize), usize>,
    kind: DeclKind,
    name: &ast::Ident,
    diags: &mut Vec<Diagnostic>,
) -> Option<usize> {
    let root = &modules.modules[0];
    let found = root.lookup(0, &name.name).and_then(|(m, item)| match item {
        ItemRef::Decl(i) => match &modules.modules[m].ast.items[i] {
            Item::Decl(d) if d.kind == kind => Some((m, i, d)),
            _ => None,
        },
        _ => None,
    });
    let Some((m, i, d)) = found else {
        let known: Vec<&str> = root
            .ast
            .items
            .iter()
            .filter_map(|it| match it {
                Item::Decl(d) if d.kind == kind => Some(d.name.name.as_str()),
                _ => None,
            })
            .collect();
        diags.push(policy::unknown_reference(
            name,
            kind.keyword(),
            &known,
            root.file,
        ));
        return None;
    };
    if let Some(slot) = index.get(&(m, i)) {
        return Some(*slot);
    }
    let slot = check_decl(decls, d, modules.modules[m].file, diags)?;
    index.insert((m, i), slot);
    Some(slot)
}

/// Checks a precision, parallel, memory or target declaration into `decls`; its index there
/// (`None` for a `train`, which [`resolve_train`] checks against its model).
fn check_decl(
    decls: &mut Declarations,
    d: &ast::DeclItem,
    file: FileId,
    diags: &mut Vec<Diagnostic>,
) -> Option<usize> {
    Some(match d.kind {
        DeclKind::Precision => {
            let op_names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
            let is_op = |n: &str| Op::from_name(n).is_some();
            decls
                .precisions
                .push(policy::check_precision(d, file, &is_op, &op_names, diags));
            decls.precisions.len() - 1
        }
        DeclKind::Parallel => {
            decls.parallels.push(policy::check_parallel(d, file, diags));
            decls.parallels.len() - 1
        }
        DeclKind::Memory => {
            decls.memories.push(policy::check_memory(d, file, diags));
            decls.memories.len() - 1
        }
        DeclKind::Target => {
            decls.targets.push(policy::check_target(d, file, diags));
            decls.targets.len() - 1
        }
        DeclKind::Train => return None,
    })
}

fn resolve_train(
    modules: &Modules,
    models: &[Model],
    poisoned: &[bool],
    decls: &mut Declarations,
    index: &mut HashMap<(usize, usize), usize>,
    spec: TrainSpec,
    diags: &mut Vec<Diagnostic>,
) -> Train {
    let file = modules.modules[0].file;
    let model = models.iter().position(|m| m.name == spec.model.name);
    if model.is_none() {
        let known: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        let mut d = Diagnostic::error(
            Code::E0403,
            file,
            spec.model.span,
            format!("no model `{}` in this file", spec.model.name),
        )
        .with_label("trains this");
        if let Some(s) = super::suggest::closest(&spec.model.name, known.iter().copied()) {
            d = d.with_help(format!("did you mean `{s}`?"));
        }
        diags.push(d);
    }
    let mut policy_of = |kind, name: &Option<ast::Ident>, diags: &mut Vec<Diagnostic>| {
        name.as_ref()
            .and_then(|n| resolve_policy(modules, decls, index, kind, n, diags))
    };
    let precision = policy_of(DeclKind::Precision, &spec.precision, diags);
    let parallel = policy_of(DeclKind::Parallel, &spec.parallel, diags);
    let memory = policy_of(DeclKind::Memory, &spec.memory, diags);
    let target = spec
        .target
        .as_ref()
        .and_then(|path| resolve_target_path(modules, decls, path, file, diags));
    if let Some(m) = model.filter(|&m| !poisoned.get(m).copied().unwrap_or(false)) {
        let paths: Vec<&str> = models[m].params.iter().map(|p| p.path.as_str()).collect();
        policy::check_no_decay_against_params(&spec, &paths, diags);
    }
    if let (Some(m), Some(p)) = (model, parallel) {
        let params: Vec<(String, Vec<i64>)> = models[m]
            .params
            .iter()
            .map(|p| (p.path.clone(), models[m].ty(p.value).shape.clone()))
            .collect();
        let complete = !poisoned.get(m).copied().unwrap_or(false);
        policy::check_shards_against_params(&decls.parallels[p], &params, complete, diags);
    }
    policy::check_train_against(
        &spec,
        parallel.map(|p| &decls.parallels[p]),
        memory.map(|m| &decls.memories[m]),
        target.map(|t| &decls.targets[t]),
        diags,
    );
    let graph = model.and_then(|m| {
        let poisoned = poisoned.get(m).copied().unwrap_or(false);
        let failed = match poisoned {
            true => failed_outputs(modules, &models[m]),
            false => Vec::new(),
        };
        training_graph(modules, &models[m], &failed, poisoned, &spec, diags)
    });
    Train {
        spec,
        model,
        precision,
        parallel,
        memory,
        target,
        graph,
    }
}

/// `std.targets.X` or a local `X`.
fn resolve_target_path(
    modules: &Modules,
    decls: &Declarations,
    path: &[ast::Ident],
    file: mslc_core::diag::FileId,
    diags: &mut Vec<Diagnostic>,
) -> Option<usize> {
    let last = path.last()?;
    let is_std = path.len() == 3 && path[0].name == "std" && path[1].name == "targets";
    let found = decls
        .targets
        .iter()
        .position(|t| t.name.name == last.name && (is_std || path.len() == 1));
    // A missing `--stdlib` directory was reported once; its targets are not unknown.
    if found.is_none() && !(is_std && modules.stdlib_missing) {
        let known: Vec<&str> = decls.targets.iter().map(|t| t.name.name.as_str()).collect();
        diags.push(policy::unknown_reference(last, "target", &known, file));
    }
    found
}

/// The outputs the root file's declaration of `model` names that elaboration did not produce
/// (their errors were reported): the loss may use them without a second error.
fn failed_outputs<'m>(modules: &'m Modules, model: &Model) -> Vec<&'m ast::Ident> {
    fn walk<'a>(stmts: &'a [ast::Stmt], out: &mut Vec<&'a ast::Ident>) {
        for stmt in stmts {
            match stmt {
                ast::Stmt::Output { name, .. } => out.push(name),
                ast::Stmt::For { body, .. } => walk(body, out),
                ast::Stmt::If {
                    then, otherwise, ..
                } => {
                    walk(then, out);
                    walk(otherwise.as_deref().unwrap_or_default(), out);
                }
                _ => {}
            }
        }
    }
    let mut declared = Vec::new();
    for item in &modules.modules[0].ast.items {
        if let Item::Model(m) = item {
            if m.name.name == model.name {
                walk(&m.body, &mut declared);
            }
        }
    }
    declared.retain(|n| !model.outputs.iter().any(|o| o.name == n.name));
    declared
}

/// The model with the labels as extra inputs and the loss as output `loss`; `failed` outputs
/// are poisoned names, so a loss using one is not elaborated (nor reported) again, and a label
/// shape of a `poisoned` model (whose dims may have failed) is not reported either.
fn training_graph(
    modules: &Modules,
    model: &Model,
    failed: &[&ast::Ident],
    poisoned: bool,
    spec: &TrainSpec,
    diags: &mut Vec<Diagnostic>,
) -> Option<Model> {
    let loss = spec.loss.as_ref()?;
    let mut elab = Elaborator::new(modules, model.clone());
    let mut frame = Frame::top(0, spec.file);
    for (name, size) in &model.dims {
        frame.bind(name, Value::Int(*size), model.loc.span);
    }
    // Scalar constants, which labels' shapes may name (`teacher: f32[B, S, hidden]`).
    for (name, shown) in &model.consts {
        let value = (shown.parse().map(Value::Int))
            .or_else(|_| shown.parse().map(Value::Float))
            .or_else(|_| shown.parse().map(Value::Bool));
        if let Ok(v) = value {
            frame.bind(name, v, model.loc.span);
        }
    }
    for i in &model.inputs {
        frame.bind(&i.name, Value::Tensor(i.value), i.loc.span);
    }
    for o in &model.outputs {
        frame.bind(&o.name, Value::Tensor(o.value), o.loc.span);
    }
    for name in failed {
        frame.bind(&name.name, Value::Error, name.span);
    }
    for (name, ty_decl) in &spec.labels {
        let Some(ty) = elab.concrete_type(&mut frame, ty_decl) else {
            if !poisoned {
                diags.extend(std::mem::take(&mut elab.diags));
            }
            return None;
        };
        let value = elab.model.new_value(ty);
        let dims = elab.dim_names(ty_decl);
        elab.model.inputs.push(Input {
            name: name.name.clone(),
            value,
            dims,
            loc: Loc {
                file: spec.file,
                span: name.span,
            },
        });
        frame.bind(&name.name, Value::Tensor(value), name.span);
    }
    let v = elab.eval(&mut frame, loss);
    let result = match v {
        Value::Tensor(t) if elab.model.ty(t).shape.is_empty() => {
            elab.model.outputs.push(Output {
                name: "loss".to_string(),
                value: t,
                loc: Loc {
                    file: spec.file,
                    span: loss.span,
                },
            });
            Some(elab.model)
        }
        Value::Tensor(t) => {
            let ty = elab.model.ty(t).clone();
            elab.diags.push(
                Diagnostic::error(
                    Code::E0502,
                    spec.file,
                    loss.span,
                    format!("the loss must be a scalar, this is {ty}"),
                )
                .with_label("not a scalar")
                .with_help("reduce it, e.g. `mean(…)`; cross_entropy already averages"),
            );
            None
        }
        _ => None,
    };
    diags.extend(std::mem::take(&mut elab.diags));
    result
}
