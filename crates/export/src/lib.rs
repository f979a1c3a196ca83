//! `mslc export jax`: a checked model as a self-contained Python program on JAX — the forward,
//! the training step of its `train` (loss, `jax.grad`, clipping, the optimizer with PyTorch's
//! semantics, as `mslc train` runs it), and a `jax.sharding.Mesh` with each parameter's
//! `NamedSharding` from the train's `parallel` declaration — whose numbers are checked against
//! mslc's executor (tests/it/export.rs). A second, independent engine for the same model.
//!
//! The program is generated from the graph IR as lowered, before any pass: one Python statement
//! per op ([`emit`]), around a fixed runtime (`runtime/ops.py`: the ops that take more than one
//! expression; `runtime/main.py`: weights, data, mesh, the training loop, the command line).

mod config;
mod emit;
mod py;

use mslc_check::decls::Train;
use mslc_check::policy::ParallelPolicy;
use mslc_check::{Checked, Model};
use mslc_core::diag::{Code, Diagnostic};
use mslc_core::ops::Op;
use mslc_driver::compile::lower_verified;
use mslc_driver::select::{choose_model, compile_options, root_error, Selection};
use mslc_ir::Graph;

pub use emit::jnp_dtype;

/// What to export, as chosen on the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    /// `--entry`: a model, or a train (whose model is then exported), of the file.
    pub entry: Option<&'a str>,
    /// `--precision`: only `f32` is exported; `None` takes the train's, which must be f32.
    pub precision: Option<&'a str>,
}

/// An exported program and what it holds.
#[derive(Debug)]
pub struct Exported {
    /// The Python program.
    pub program: String,
    /// Warnings about what the program does not mirror (W0050).
    pub warnings: Vec<Diagnostic>,
    /// The model's name.
    pub model: String,
    /// The train whose step the program holds, if any.
    pub train: Option<String>,
    /// The parallel declaration whose mesh and shardings the program uses, if any.
    pub parallel: Option<String>,
    /// Ops of the forward graph (one statement each).
    pub ops: usize,
}

/// Exports the model (and train) `request` chooses from `checked`.
pub fn export_jax(checked: &Checked, request: &Request) -> Result<Exported, Box<Diagnostic>> {
    let (model, train) = choose(checked, request.entry)?;
    refuse_unmirrored(checked, train, request.precision)?;
    let selection = Selection {
        precision: Some("f32"),
        verify: true,
        ..Selection::default()
    };
    let options = compile_options(checked, model, selection)?;
    let lower = |m: &Model| lower_verified(m, &options).map_err(|e| e.diagnostic(checked));
    let forward = lower(model)?;
    let train_graph = match train.and_then(|t| t.graph.as_ref()) {
        Some(g) => Some(lower(g)?),
        None => None,
    };
    if let (Some(t), Some(g)) = (train, &train_graph) {
        refuse_training_mode(t, g)?;
    }
    let parallel = train
        .and_then(|t| t.parallel)
        .map(|i| &checked.decls.parallels[i]);
    let mut warnings = Vec::new();
    if let Some((policy, pipeline)) = parallel.and_then(|p| Some((p, p.pipeline?))) {
        warnings.push(
            Diagnostic::warning(
                Code::W0050,
                policy.file,
                pipeline.span,
                format!(
                    "the JAX export ignores the pipeline of `{}` ({} stages, {} micro-batches)",
                    policy.name.name, pipeline.stages, pipeline.micro_batches
                ),
            )
            .with_label("not mirrored")
            .with_help("every device of the mesh runs all the layers; the numbers are the same"),
        );
    }
    let program = program(
        checked,
        model,
        &forward,
        train,
        train_graph.as_ref(),
        parallel,
    )?;
    Ok(Exported {
        program,
        warnings,
        model: model.name.clone(),
        train: train.map(|t| t.spec.name.name.clone()),
        parallel: parallel.map(|p| p.name.name.clone()),
        ops: forward.op_count(),
    })
}

/// The model and train to export: `entry` naming a train takes it and its model; otherwise the
/// model is chosen as every command chooses it, with the first train declared for it.
fn choose<'a>(
    checked: &'a Checked,
    entry: Option<&str>,
) -> Result<(&'a Model, Option<&'a Train>), Box<Diagnostic>> {
    let trains = &checked.decls.trains;
    if let Some(t) = entry.and_then(|e| trains.iter().find(|t| t.spec.name.name == e)) {
        let model = t.model.and_then(|m| checked.models.get(m)).ok_or_else(|| {
            root_error(
                checked,
                Code::E0608,
                format!("the model of train `{}` did not check", t.spec.name.name),
                String::new(),
            )
        })?;
        return Ok((model, Some(t)));
    }
    let model = choose_model(checked, entry)?;
    let train = trains.iter().find(|t| t.spec.model.name == model.name);
    Ok((model, train))
}

/// Refuses (E0961) a train whose step behaves differently in training mode — a live dropout
/// (`p` > 0) or a `batch_norm` (batch statistics): the exported program computes eval mode, so
/// its training step would silently differ from `mslc train`'s.
fn refuse_training_mode(train: &Train, graph: &Graph) -> Result<(), Box<Diagnostic>> {
    let changes = graph.node_ids().into_iter().find_map(|id| {
        let node = graph.node(id);
        let op = node.op()?;
        let live = match op {
            Op::Dropout => node
                .attrs()
                .and_then(|a| a.float("p").ok())
                .is_some_and(|p| p > 0.0),
            Op::BatchNorm => true,
            _ => false,
        };
        live.then(|| (op, node.origin.clone()))
    });
    let Some((op, origin)) = changes else {
        return Ok(());
    };
    let spec = &train.spec;
    Err(Box::new(
        Diagnostic::error(
            Code::E0961,
            spec.file,
            spec.name.span,
            format!(
                "train `{}` runs `{op}` at `{origin}` in training mode, which the JAX export \
                 does not mirror (it computes eval mode)",
                spec.name.name
            ),
        )
        .with_label("this train")
        .with_help("export the model alone (--entry MODEL), or set the dropout's p to 0"),
    ))
}

/// Refuses (E0961) what the exported program cannot reproduce: a precision other than f32 and
/// gradient accumulation.
fn refuse_unmirrored(
    checked: &Checked,
    train: Option<&Train>,
    precision: Option<&str>,
) -> Result<(), Box<Diagnostic>> {
    if let Some(p) = precision.filter(|&p| p != "f32") {
        return Err(root_error(
            checked,
            Code::E0961,
            format!("--precision {p}: the JAX export computes in f32 only"),
            "leave out --precision, or give --precision f32".to_string(),
        ));
    }
    let Some(train) = train else {
        return Ok(());
    };
    let spec = &train.spec;
    let refuse = |message: String, help: &str| {
        Err(Box::new(
            Diagnostic::error(Code::E0961, spec.file, spec.name.span, message)
                .with_label("this train")
                .with_help(help),
        ))
    };
    if let (None, Some(policy)) = (precision, &spec.precision) {
        return refuse(
            format!(
                "train `{}` computes in precision `{}`, and the JAX export is f32 only",
                spec.name.name, policy.name
            ),
            "export its f32 step with --precision f32 (what `mslc train --precision f32` runs)",
        );
    }
    if spec.grad_accum > 1 {
        return refuse(
            format!(
                "train `{}` accumulates {} micro-steps, which the JAX export does not mirror",
                spec.name.name, spec.grad_accum
            ),
            "use `grad_accum = 1` and a batch of the accumulated size",
        );
    }
    Ok(())
}

/// The whole program's text.
fn program(
    checked: &Checked,
    model: &Model,
    forward: &Graph,
    train: Option<&Train>,
    train_graph: Option<&Graph>,
    parallel: Option<&ParallelPolicy>,
) -> Result<String, Box<Diagnostic>> {
    let source = checked
        .files
        .first()
        .map_or(String::new(), |f| f.display().to_string());
    let mut text = config::docstring(&source, model, train, parallel);
    text.push_str(config::IMPORTS);
    text.push_str(include_str!("runtime/ops.py"));
    text.push('\n');
    text.push_str(&config::facts(forward, train, train_graph, parallel));
    text.push('\n');
    text.push_str(&emit::emit_function(
        forward,
        "forward",
        &format!("The forward of `{}`: the outputs by name.", model.name),
    )?);
    if let Some(g) = train_graph {
        text.push('\n');
        text.push_str(&emit::emit_function(
            g,
            "train_graph",
            "The model with the train's labels and loss: `loss` (and nothing else).",
        )?);
    }
    text.push('\n');
    text.push_str(include_str!("runtime/main.py"));
    Ok(text)
}
