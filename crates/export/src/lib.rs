//! `mslc export jax`: a checked model as a self-contained Python program on JAX — the forward,
//! the training step of its `train` (loss, `jax.grad`, clipping, the optimizer with PyTorch's
//! semantics, as `mslc train` runs it), and a `jax.sharding.Mesh` with each parameter's
//! `NamedSharding` from the train's `parallel` declaration, and its plan's pipeline the GSPMD
//! way ([`layers`]) — whose numbers are checked against mslc's executor (tests/it/export.rs). A
//! second, independent engine for the same model.
//!
//! The program is generated from the graph IR as lowered, before any pass: one Python statement
//! per op ([`emit`]), around a fixed runtime (`runtime/ops.py`: the ops that take more than one
//! expression; `runtime/main.py`: weights, data, mesh, the training loop, the command line).

mod config;
mod emit;
mod layers;
mod py;

use mslc_check::decls::Train;
use mslc_check::policy::ParallelPolicy;
use mslc_check::{Checked, Model};
use mslc_core::diag::{Code, Diagnostic};
use mslc_core::ops::Op;
use mslc_driver::compile::lower_verified;
use mslc_driver::ranks::RankLayout;
use mslc_driver::select::{choose_model, compile_options, root_error, Selection};
use mslc_ir::{Graph, NodeKind};
use mslc_plan::parallel::PlanFile;

pub use emit::jnp_dtype;

/// Checks the exported source again with dim `NAME` set to `N` (the command line's other
/// `--set`/`--dim` kept).
pub type Recheck<'a> = &'a dyn Fn(&str, i64) -> Checked;

/// What to export, as chosen on the command line.
#[derive(Clone, Copy, Default)]
pub struct Request<'a> {
    /// `--entry`: a model, or a train (whose model is then exported), of the file.
    pub entry: Option<&'a str>,
    /// `--precision`: only `f32` is exported; `None` takes the train's, which must be f32.
    pub precision: Option<&'a str>,
    /// The same source checked again with dim `NAME` set to `N`: a pipeline's layers are
    /// exported at the size of one micro-batch. `None`: pipelines are not mirrored (W0050).
    pub recheck: Option<Recheck<'a>>,
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
    /// Whether the mesh and shardings are the per-device plan's (else the declaration's).
    pub planned: bool,
    /// The plan's pipeline as the program runs it ("2 stages × 4 micro-batches over mesh axis
    /// `pp`"),
    /// when it is mirrored.
    pub pipeline: Option<String>,
    /// Ops of the forward graph (one statement each).
    pub ops: usize,
}

/// Exports the model (and train) `request` chooses from `checked`.
pub fn export_jax(checked: &Checked, request: &Request) -> Result<Exported, Box<Diagnostic>> {
    let (model, train) = choose(checked, request.entry)?;
    refuse_unmirrored(checked, train, request.precision)?;
    let (forward, train_graph) = lowered(checked, model, train)?;
    if let (Some(t), Some(g)) = (train, &train_graph) {
        refuse_training_mode(t, g)?;
    }
    let parallel = train
        .and_then(|t| t.parallel)
        .map(|i| &checked.decls.parallels[i]);
    // The per-device plan the program mirrors (its mesh, shardings, optimizer sharding and
    // pipeline); without one, the declaration's mesh and shard rules.
    let plan = match (train, parallel) {
        (Some(t), Some(_)) => match mslc_driver::parallel::plan_train(checked, t) {
            Ok(plan) => plan.ok_or_else(|| "the train has no per-device plan".to_string()),
            Err(d) => Err(format!("the train has no plan ({})", d.message)),
        },
        _ => Err("the train has no per-device plan".to_string()),
    };
    let layout = plan.as_ref().map_err(String::clone).and_then(|plan| {
        let devices = usize::try_from(plan.devices).unwrap_or(0);
        mslc_driver::ranks::layout(Some(plan), devices, "the export").map_err(|e| e.message)
    });
    let resizer = match train {
        Some(t) => Resizer::new(request, model, t, &forward),
        None => Err("there is no train".to_string()),
    };
    // Under the plan, the step runs on the train's whole batch: the model's (one replica's
    // micro-batch) × replicas × micro-batches.
    let (mut forward, mut train_graph) = (forward, train_graph);
    if let (Ok(layout), Ok(resizer)) = (&layout, &resizer) {
        let times = layout.dp * layout.pipeline.as_ref().map_or(1, |p| p.micro_batches);
        if times > 1 {
            if let Ok((f, g)) = resizer.lowered(times)? {
                (forward, train_graph) = (f, Some(g));
            }
        }
    }
    let mut warnings = Vec::new();
    let mut pipelined = None;
    if let (Some(policy), Some(pipeline)) = (parallel, parallel.and_then(|p| p.pipeline)) {
        let parts = match (&plan, &layout, &resizer) {
            (Ok(plan), Ok(layout), Ok(resizer)) => pipeline_parts(resizer, model, plan, layout)?,
            (Err(why), ..) | (_, Err(why), _) | (.., Err(why)) => Err(why.clone()),
        };
        match parts {
            Ok(parts) => pipelined = Some(parts),
            Err(why) => warnings.push(
                Diagnostic::warning(
                    Code::W0050,
                    policy.file,
                    pipeline.span,
                    format!(
                        "the JAX export does not mirror the pipeline of `{}` ({} stages, {} micro-batches): {why}",
                        policy.name.name, pipeline.stages, pipeline.micro_batches
                    ),
                )
                .with_label("not mirrored")
                .with_help("every device of the mesh runs all the layers; the numbers are the same"),
            ),
        }
    }
    let sharding = Sharding {
        parallel,
        plan: plan.as_ref().ok(),
        pipelined: pipelined.as_ref(),
    };
    let program = program(
        checked,
        model,
        &forward,
        train,
        train_graph.as_ref(),
        &sharding,
    )?;
    Ok(Exported {
        program,
        warnings,
        model: model.name.clone(),
        train: train.map(|t| t.spec.name.name.clone()),
        parallel: parallel.map(|p| p.name.name.clone()),
        planned: plan.as_ref().is_ok_and(|p| p.devices > 1),
        pipeline: pipelined.map(|p| p.summary),
        ops: forward.op_count(),
    })
}

/// The forward graph of `model` and the graph of `train` (model, labels and loss), lowered
/// in f32 and verified, as exported.
fn lowered(
    checked: &Checked,
    model: &Model,
    train: Option<&Train>,
) -> Result<(Graph, Option<Graph>), Box<Diagnostic>> {
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
    Ok((forward, train_graph))
}

/// A pipeline as the program mirrors it: the `PIPELINE` facts and the pipelined forms of the
/// forward and of the train's graph ([`layers::emit_pipelined`]).
struct Pipelined {
    /// In words, for the summary.
    summary: String,
    facts: String,
    forward: String,
    train: String,
}

/// The model and its train lowered again with the batch dim at another size (`request.recheck`):
/// the plan's model batch dim is one replica's micro-batch, while the program runs the step on
/// the train's whole batch and a pipeline's layers on the replicas' micro-batches side by side.
struct Resizer<'a> {
    recheck: Recheck<'a>,
    train: &'a str,
    /// The batch dim's name and its size in the model as checked.
    dim: String,
    batch: i64,
}

impl<'a> Resizer<'a> {
    /// The resizer of `model` (whose lowered forward is `forward`) and train `train`; why not
    /// when there is no recheck or the model's first input has no named batch dim.
    fn new(
        request: &Request<'a>,
        model: &Model,
        train: &'a Train,
        forward: &Graph,
    ) -> Result<Resizer<'a>, String> {
        let recheck = request
            .recheck
            .ok_or("this export was asked for without other batch sizes")?;
        let first = model.inputs.first();
        let dim = model.batch_dim().map(str::to_string);
        let batch = first.and_then(|i| {
            forward
                .node_ids()
                .into_iter()
                .find_map(|id| match &forward.node(id).kind {
                    NodeKind::Input { name } if *name == i.name => {
                        forward.node(id).outputs[0].shape.first().copied()
                    }
                    _ => None,
                })
        });
        let (Some(dim), Some(batch)) = (dim, batch) else {
            return Err("the model's first input has no named batch dim".into());
        };
        Ok(Resizer {
            recheck,
            train: &train.spec.name.name,
            dim,
            batch,
        })
    }

    /// The forward and the train's graph with the batch dim at `times` × its size.
    fn lowered(&self, times: usize) -> Result<Result<(Graph, Graph), String>, Box<Diagnostic>> {
        let (name, size) = (self.train, self.batch * times as i64);
        let again = (self.recheck)(&self.dim, size);
        let Ok((m, Some(t))) = choose(&again, Some(name)) else {
            return Ok(Err(format!(
                "train `{name}` does not check with {} = {size}",
                self.dim
            )));
        };
        match lowered(&again, m, Some(t))? {
            (forward, Some(graph)) => Ok(Ok((forward, graph))),
            _ => Ok(Err(format!("train `{name}` has no graph"))),
        }
    }
}

/// The pipelined functions of `layout`'s pipeline for `model`, exported at the size of the
/// replicas' micro-batches side by side; `Ok(Err)` says why the pipeline cannot be mirrored.
fn pipeline_parts(
    resizer: &Resizer,
    model: &Model,
    plan: &PlanFile,
    layout: &RankLayout,
) -> Result<Result<Pipelined, String>, Box<Diagnostic>> {
    let Some(stages) = &layout.pipeline else {
        return Ok(Err("the plan has a single stage".into()));
    };
    let (micro_batches, replicas) = (stages.micro_batches, layout.dp);
    let (micro_forward, micro_graph) = match resizer.lowered(replicas)? {
        Ok(graphs) => graphs,
        Err(why) => return Ok(Err(why)),
    };
    let doc = format!("The forward of `{}`: the outputs by name.", model.name);
    let forward = match layers::emit_pipelined(&micro_forward, "forward", &doc)? {
        Ok(text) => text,
        Err(why) => return Ok(Err(why)),
    };
    let doc = "The model with the train's labels and loss: `loss` (and nothing else).";
    let train_text = match layers::emit_pipelined(&micro_graph, "train_graph", doc)? {
        Ok(text) => text,
        Err(why) => return Ok(Err(why)),
    };
    let ranges = stages.layers.iter().map(|r| {
        let [first, end] = r.first().copied().unwrap_or_default();
        format!("({first}, {end})")
    });
    let facts = format!(
        "# The plan's pipeline: its mesh axis, stages (each a range of layers), micro-batches per\n\
         # step of each of the data-parallel replicas.\n\
         PIPELINE = {{\"axis\": {}, \"stage_layers\": {}, \"micro_batches\": {micro_batches}, \"replicas\": {replicas}}}\n",
        py::py_str(plan.axis_name("pp")),
        py::py_list(ranges),
    );
    Ok(Ok(Pipelined {
        summary: format!(
            "{} stages × {micro_batches} micro-batches over mesh axis `{}`",
            stages.layers.len(),
            plan.axis_name("pp")
        ),
        facts,
        forward,
        train: train_text,
    }))
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
/// How the program spreads over devices: the train's parallel declaration, its per-device
/// plan (when it has one that holds) and the pipeline as mirrored (when it is).
struct Sharding<'a> {
    parallel: Option<&'a ParallelPolicy>,
    plan: Option<&'a PlanFile>,
    pipelined: Option<&'a Pipelined>,
}

fn program(
    checked: &Checked,
    model: &Model,
    forward: &Graph,
    train: Option<&Train>,
    train_graph: Option<&Graph>,
    sharding: &Sharding,
) -> Result<String, Box<Diagnostic>> {
    let Sharding {
        parallel,
        plan,
        pipelined,
    } = *sharding;
    let source = checked
        .files
        .first()
        .map_or(String::new(), |f| f.display().to_string());
    let planned = plan.is_some_and(|p| p.devices > 1);
    let mut text = config::docstring(
        &source,
        model,
        train,
        parallel,
        planned,
        pipelined.is_some(),
    );
    text.push_str(config::IMPORTS);
    text.push_str(include_str!("runtime/ops.py"));
    text.push('\n');
    text.push_str(&config::facts(
        forward,
        train,
        train_graph,
        parallel,
        plan,
        pipelined.is_some(),
    ));
    match pipelined {
        Some(p) => text.push_str(&p.facts),
        None => text.push_str("PIPELINE = None\n"),
    }
    text.push('\n');
    match pipelined {
        Some(p) => text.push_str(&p.forward),
        None => text.push_str(&emit::emit_function(
            forward,
            "forward",
            &format!("The forward of `{}`: the outputs by name.", model.name),
        )?),
    }
    if let Some(g) = train_graph {
        text.push('\n');
        match pipelined {
            Some(p) => text.push_str(&p.train),
            None => text.push_str(&emit::emit_function(
                g,
                "train_graph",
                "The model with the train's labels and loss: `loss` (and nothing else).",
            )?),
        }
    }
    text.push('\n');
    text.push_str(include_str!("runtime/main.py"));
    Ok(text)
}
