//! `mslc build FILE`: check, compile and plan a model, and write its artifacts — the module
//! (`NAME.mir`), the kernel table, the memory plan and a report — all or nothing.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use mslc_artifact::encode;
use mslc_artifact::write::{write_build_set, SetError};
use mslc_check::decls::Train;
use mslc_check::{check_path, Checked, Model};
use mslc_core::diag::{Code, Diagnostic, Severity};
use mslc_core::units::human_bytes;
use mslc_driver::artifacts::{artifact_files, json};
use mslc_driver::compile::{CompileOptions, Compiled};
use mslc_driver::dep_info::dep_info;
use mslc_driver::recompute::{MemoryRequest, RecomputeReport};
use mslc_driver::select::{choose_model, compile_options, root_error, Selection};
use mslc_driver::target::target_from_spec;
use mslc_driver::train::{
    batch_parts, choose_train, compile_train, micro_batch_dim, train_as_run, train_compile_options,
    TrainOptions,
};
use mslc_plan::kernels::{KernelTable, SubgraphEntry};
use mslc_plan::memory_svg::memory_svg;
use mslc_tune::device::fingerprint;
use mslc_tune::kb::{default_path, KnowledgeBase};

use super::check::group_thousands;
use super::{build_ranks, tune_decisions, ModelArgs, PrecisionArg, Reporter};

/// Extra outputs `--emit` can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// The optimized IR as text: `NAME.ir`.
    Ir,
    /// The optimized IR as Graphviz: `NAME.dot`.
    Dot,
    /// The memory plan as a picture: `NAME.memory.svg`, buffers over schedule steps × offset.
    MemorySvg,
    /// A Makefile rule naming every source file read: `NAME.d`, as `rustc --emit dep-info`.
    DepInfo,
    /// The per-device plan as a picture: `TRAIN.plan.svg`, memory per stage against the budget
    /// and the pipeline schedule.
    PlanSvg,
}

/// What `--deny` turns into errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Deny {
    /// Every warning (the checker's and the planner's).
    Warnings,
}

/// Arguments of `mslc build`.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// The `.msl` file to build.
    #[arg(required_unless_present = "passes")]
    pub file: Option<PathBuf>,
    /// List the optimization passes and exit.
    #[arg(long)]
    pub passes: bool,
    /// Turn operator fusion off.
    #[arg(long)]
    pub no_fuse: bool,
    /// The model to build (default: the file's only model, or the one its `train` names), or a
    /// `train` declaration, whose training step is built instead (f32).
    #[arg(long)]
    pub entry: Option<String>,
    /// The target to plan for (a `target` declaration: `cpu`, `ascend910b`, `a100`, `h100`, …).
    #[arg(long)]
    pub target: Option<String>,
    /// Output directory.
    #[arg(short = 'o', long = "out-dir", default_value = "build")]
    pub out_dir: PathBuf,
    /// Also write the IR as text or Graphviz, the memory plan as SVG, the dep-info, or the
    /// per-device plan as SVG: `--emit ir,dot,memory-svg,dep-info,plan-svg`.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub emit: Vec<Emit>,
    /// Print why the per-device plan is as it is: per parameter its layout, the collectives it
    /// causes and the next-best layout's cost; the large activations; memory per stage's worst
    /// rank; what-if deltas for single knobs.
    #[arg(long)]
    pub explain_plan: bool,
    /// Treat warnings as errors: `--deny warnings`.
    #[arg(long, value_enum)]
    pub deny: Vec<Deny>,
    /// Run the IR verifier after lowering and after every pass.
    #[arg(long)]
    pub verify: bool,
    /// Take kernel choices from this table (default: `NAME.kernels.toml` in the output
    /// directory, when it exists), for every step whose op signature it lists.
    #[arg(long, value_name = "FILE.toml")]
    pub kernels: Option<PathBuf>,
    /// Take tuned kernel choices from this knowledge base (default: the one `mslc tune`
    /// writes, `$XDG_CACHE_HOME/mslc/tune-kb.json` or `~/.cache/mslc/tune-kb.json`, when it
    /// exists); a table given with --kernels or beside the output still wins.
    #[arg(long, value_name = "FILE.json")]
    pub tune_db: Option<PathBuf>,
    /// Put these weights (safetensors, matched by parameter path) inside the `.mir`.
    #[arg(long, value_name = "FILE.safetensors")]
    pub embed_weights: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// The `NAME.report.json` content.
#[derive(Serialize)]
struct Report<'a> {
    model: &'a str,
    target: &'a str,
    target_fingerprint: &'a str,
    ops_before_passes: usize,
    ops_after_passes: usize,
    steps: usize,
    parameters: u128,
    parameter_bytes: u128,
    arena_bytes: u64,
    hoisted_bytes: u64,
    lower_bound_bytes: u64,
    arena_over_lower_bound: f64,
    in_place_reuses: usize,
    memory_strategy: &'a str,
    rewrites_by_label: &'a std::collections::BTreeMap<String, usize>,
    passes: &'a [mslc_ir::passes::PassTiming],
    flops_per_forward: u64,
    estimated_seconds_per_forward: f64,
    stage_ms: StageMs,
    /// A train entry's recomputation and step memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    recompute: Option<&'a RecomputeReport>,
}

#[derive(Serialize)]
struct StageMs {
    check: f64,
    lower: f64,
    passes: f64,
    schedule: f64,
    memory: f64,
    encode: f64,
}

/// Runs the build; 0 on success, 1 on errors.
pub fn run(args: &BuildArgs, reporter: &Reporter) -> u8 {
    let Some(file) = args.file.as_deref().filter(|_| !args.passes) else {
        let passes = mslc_ir::passes::pass_descriptions();
        let list: Vec<String> = passes
            .iter()
            .map(|(name, what)| format!("{name:<14} {what}"))
            .collect();
        let json: Vec<serde_json::Value> = passes
            .iter()
            .map(|(name, what)| serde_json::json!({ "name": name, "description": what }))
            .collect();
        reporter.result(
            &(list.join("\n") + "\n"),
            serde_json::json!({ "passes": json }),
        );
        return 0;
    };
    let start = Instant::now();
    let mut options = args.model.check_options();
    let mut checked = check_path(file, &options);
    // A train's step takes one micro-batch, as `mslc train` compiles it.
    match train_micro_batch(args, &checked) {
        Ok(Some((dim, size))) => {
            options.overrides.dims.insert(dim, size.to_string());
            checked = check_path(file, &options);
        }
        Ok(None) => {}
        Err(d) => {
            reporter.emit(&checked.diagnostics, &checked.sources);
            reporter.emit(&[*d], &checked.sources);
            return 1;
        }
    }
    let check_ms = start.elapsed().as_secs_f64() * 1e3;
    deny(args, &mut checked.diagnostics);
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return 1;
    }
    match build(args, &checked, check_ms) {
        Ok((text, json, mut warnings)) => {
            deny(args, &mut warnings);
            reporter.emit(&warnings, &checked.sources);
            if warnings.iter().any(|d| d.severity == Severity::Error) {
                return 1;
            }
            reporter.result(&text, json);
            0
        }
        Err(d) => {
            reporter.emit(&[*d], &checked.sources);
            1
        }
    }
}

/// Under `--deny warnings`, makes every warning among `diags` an error.
fn deny(args: &BuildArgs, diags: &mut [Diagnostic]) {
    if args.deny.contains(&Deny::Warnings) {
        for d in diags.iter_mut().filter(|d| d.severity == Severity::Warning) {
            d.severity = Severity::Error;
        }
    }
}

/// The train `--entry` names, if it names one rather than a model.
fn train_entry<'a>(args: &'a BuildArgs, checked: &Checked) -> Option<&'a str> {
    args.entry.as_deref().filter(|&e| {
        checked.model(e).is_none() && checked.decls.trains.iter().any(|t| t.spec.name.name == e)
    })
}

/// For `--entry TRAIN`, the dim override that makes its step take one micro-batch of one
/// data-parallel replica ([`micro_batch_dim`]), as each rank of `mslc train` takes it (one
/// pipeline micro-batch under a pipeline); nothing for a model entry or a source with errors.
fn train_micro_batch(
    args: &BuildArgs,
    checked: &Checked,
) -> Result<Option<(String, i64)>, Box<Diagnostic>> {
    let Some(entry) = train_entry(args, checked).filter(|_| !checked.has_errors()) else {
        return Ok(None);
    };
    let train = choose_train(checked, Some(entry))?;
    match train.model.and_then(|m| checked.models.get(m)) {
        Some(model) => {
            // The batch counts `B × dp × micro-batches (pipeline) × grad_accum`.
            let parts = batch_parts(checked, train);
            // A batch that does not split so is the plan's error (E0902), with its help.
            micro_batch_dim(train, model, &args.model.dims, parts).or_else(|e| match parts {
                1 => Err(e),
                _ => micro_batch_dim(train, model, &args.model.dims, 1),
            })
        }
        None => Ok(None),
    }
}

/// Builds and writes the artifacts; the summary as text and as JSON, and the plan's warnings.
fn build(
    args: &BuildArgs,
    checked: &Checked,
    check_ms: f64,
) -> Result<(String, serde_json::Value, Vec<Diagnostic>), Box<Diagnostic>> {
    let train_entry = train_entry(args, checked);
    let ((model, mut compiled, recompute), subgraphs) = match train_entry {
        Some(entry) => build_train(args, checked, entry)?,
        None => {
            let model = choose_model(checked, args.entry.as_deref())?;
            let options = compile_options(checked, model, selection(args))?;
            let table = args.out_dir.join(format!("{}.kernels.toml", model.name));
            let decisions = tune_decisions::decisions(
                Some(args.kernels.as_deref().unwrap_or(&table)),
                tune_db(args).as_deref(),
            );
            let (compiled, applied) = tune_decisions::compile_deciding(model, options, &decisions)
                .map_err(|e| e.diagnostic(checked))?;
            ((Cow::Borrowed(model), compiled, None), applied)
        }
    };
    let model = model.as_ref();
    let name = &model.name;
    let dir = &args.out_dir;
    // The train's batch and policies were written for the declared model; a model build with
    // `--set`/`--dim` changes it (fewer layers, another batch dim), so it is not planned
    // unless the train itself is built (`--entry TRAIN`), and the summary says so.
    let overridden = !args.model.sets.is_empty() || !args.model.dims.is_empty();
    let mut planned = match train_entry.is_none() && overridden {
        true => None,
        false => parallel_plan(
            checked,
            train_entry,
            model,
            (&args.model.dims, args.explain_plan),
        )?,
    };
    // Under `--deny warnings` a plan warning stops the build before anything is written.
    if let Some(p) = &mut planned {
        deny(args, &mut p.warnings);
        if p.warnings.iter().any(|d| d.severity == Severity::Error) {
            let warnings = std::mem::take(&mut p.warnings);
            return Ok((String::new(), serde_json::Value::Null, warnings));
        }
    }
    let table_path = args
        .kernels
        .clone()
        .unwrap_or_else(|| dir.join(format!("{name}.kernels.toml")));
    let mut replaceable = std::collections::BTreeSet::new();
    let kernels = if args.kernels.is_some() || table_path.exists() {
        let table = KernelTable::read(&table_path)
            .map_err(|e| root_error(checked, e.code(), e.to_string(), table_help(&e)))?;
        let applied = table.apply(&mut compiled.module);
        replaceable = table.tuner_entries();
        Some(format!("{}: {applied}", table_path.display()))
    } else {
        None
    };
    let tuned = tuned_choices(args, &mut compiled.module, &replaceable)
        .map_err(|(code, message, help)| root_error(checked, code, message, help))?;
    if kernels.is_some() || tuned.is_some() {
        compiled
            .memory
            .account_runtime(&compiled.module)
            .map_err(|e| {
                root_error(
                    checked,
                    Code::E0621,
                    e.to_string(),
                    "fix or delete the entry the message names".to_string(),
                )
            })?;
    }
    let weights = match &args.embed_weights {
        Some(path) => Some(
            super::weights::read_matching(path, &compiled.module)
                .map_err(|(code, message, help)| root_error(checked, code, message, help))?,
        ),
        None => None,
    };
    let t = Instant::now();
    let mir = encode(&compiled.module, weights.as_deref());
    let encode_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut files = artifact_files(dir, name, &compiled, mir);
    if let Some(tuned) = &tuned {
        mark_tuned(&mut files, &compiled.module, tuned);
    }
    tune_decisions::record(&mut files, name, &subgraphs);
    for emit in &args.emit {
        let (ext, text) = match emit {
            Emit::Ir => ("ir", mslc_ir::print::to_text(&compiled.graph)),
            Emit::Dot => ("dot", mslc_ir::dot::to_dot(&compiled.graph)),
            Emit::MemorySvg => (
                "memory.svg",
                memory_svg(&compiled.memory, compiled.module.steps.len(), name),
            ),
            Emit::DepInfo => ("d", dep_info(&files[0].0, &checked.files)),
            Emit::PlanSvg => continue,
        };
        files.push((dir.join(format!("{name}.{ext}")), text.into_bytes()));
    }
    let stage_ms = StageMs {
        check: check_ms,
        lower: compiled.times.lower_ms,
        passes: compiled.times.passes_ms,
        schedule: compiled.times.schedule_ms,
        memory: compiled.times.memory_ms,
        encode: encode_ms,
    };
    let report = report(model, &compiled, stage_ms, recompute.as_ref());
    files.push((dir.join(format!("{name}.report.json")), json(&report)));
    // A parallel train's step as each rank runs it.
    let ranked = match (train_entry, &planned) {
        (Some(entry), Some(p)) => build_ranks::rank_artifacts(args, checked, entry, &p.plan)?,
        _ => None,
    };
    if let (Some(_), Some(p)) = (train_entry, &mut planned) {
        executor_memory(p, &compiled, ranked.as_ref());
    }
    if let Some(p) = &planned {
        files.push((dir.join(format!("{}.plan.json", p.train)), json(&p.plan)));
        if args.emit.contains(&Emit::PlanSvg) {
            let svg = mslc_plan::parallel::svg::plan_svg(&p.plan, &p.train);
            files.push((dir.join(format!("{}.plan.svg", p.train)), svg.into_bytes()));
        }
    }
    if let Some(r) = &ranked {
        files.extend(r.files.iter().cloned());
    }
    let named: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(path, bytes)| {
            let name = path.file_name().unwrap_or_default();
            (name.to_string_lossy().into_owned(), bytes.clone())
        })
        .collect();
    let table_name = format!("{name}.kernels.toml");
    write_build_set(dir, name, &named, &[table_name.as_str()]).map_err(|e| {
        let (code, help) = match &e {
            SetError::Locked(_) => (
                Code::E0607,
                "wait for the other build, or build into another directory with -o DIR",
            ),
            SetError::NotADirectory(_) => (Code::E0600, "give -o a directory"),
            SetError::Io(w) if !w.replaced.is_empty() => (
                Code::E0600,
                "the set is incomplete (it has no manifest): rerun the build",
            ),
            SetError::Io(_) => (Code::E0600, "choose a writable directory with -o DIR"),
        };
        root_error(checked, code, e.to_string(), help.to_string())
    })?;
    let written: Vec<serde_json::Value> = files
        .iter()
        .map(|(path, bytes)| serde_json::json!({ "path": path, "bytes": bytes.len() }))
        .collect();
    let ranks = ranked.as_ref().map(|r| &r.json);
    let json = serde_json::json!({
        "summary": { "report": &report, "files": written, "subgraphs": &subgraphs, "ranks": ranks }
    });
    let tuning = tuned.as_ref().map(|t| t.note.as_str());
    let mut text = report_text(
        &report,
        train_entry.is_some(),
        args.verify,
        kernels.as_deref(),
        tuning,
        dir,
        &files,
    );
    text.push_str(&format!(
        "    {name}.manifest.json (their SHA-256, written last)\n"
    ));
    text.extend(tune_decisions::summary_line(&subgraphs));
    if planned.is_none() && (args.emit.contains(&Emit::PlanSvg) || args.explain_plan) {
        text.push_str("  plan:       none to draw or explain: no train of this model names a target and a parallel or memory policy (or --set/--dim changed the model)\n");
    }
    if planned.is_none() && overridden && train_entry.is_none() {
        text.push_str("  plan:       not made: --set/--dim change the model its train was written for (`mslc check` without them, or --entry TRAIN, plans it)\n");
    }
    if let Some(p) = &planned {
        let explained = p.explanation.iter().flatten();
        for line in mslc_driver::parallel::summary_lines(&p.train, &p.plan)
            .iter()
            .chain(explained)
        {
            text.push_str(line);
            text.push('\n');
        }
    }
    if let Some(r) = &ranked {
        text.push_str(&r.line);
        text.push('\n');
    }
    let warnings = planned.map(|p| p.warnings).unwrap_or_default();
    Ok((text, json, warnings))
}

/// On the host target, fills each device group of `plan` with what the bundled executor
/// allocates on its ranks: the compiled per-rank programs (`ranked`, one per stage), or on one
/// device the train's step `compiled`. Left empty for other targets, and for a plan whose
/// programs were not written (E0972).
fn executor_memory(
    planned: &mut Planned,
    compiled: &Compiled,
    ranked: Option<&build_ranks::RankArtifacts>,
) {
    if !planned.on_host {
        return;
    }
    let per_stage = match ranked {
        Some(r) => r.memory.clone(),
        None => {
            let threads = mslc_driver::ranks::threads_per_rank(None, 1);
            vec![mslc_driver::ranks::rank_memory([&compiled.memory], threads)]
        }
    };
    for group in &mut planned.plan.per_device {
        group.executor = usize::try_from(group.stage)
            .ok()
            .and_then(|s| per_stage.get(s).copied());
    }
}

/// A train's per-device plan, its warnings and, under `--explain-plan`, its explanation.
struct Planned {
    train: String,
    /// Whether the train's target is the host, whose ranks run mslc's own executor.
    on_host: bool,
    plan: mslc_plan::parallel::PlanFile,
    warnings: Vec<Diagnostic>,
    explanation: Option<Vec<String>>,
}

/// The per-device plan of the train this build is for: the `--entry` train, or the first
/// train of the built model; `None` when there is none or it names nothing to plan for. The
/// `--entry` train is planned as its steps run `model` ([`train_as_run`], with the `--dim`
/// overrides `given`).
fn parallel_plan(
    checked: &Checked,
    train_entry: Option<&str>,
    model: &Model,
    (given, explain): (&[(String, String)], bool),
) -> Result<Option<Planned>, Box<Diagnostic>> {
    let Some(declared) = checked.decls.trains.iter().find(|t| match train_entry {
        Some(entry) => t.spec.name.name == entry,
        None => t.spec.model.name == model.name,
    }) else {
        return Ok(None);
    };
    let (train, as_run) = match train_entry {
        Some(_) => train_as_run(declared, model, given, batch_parts(checked, declared)),
        None => (Cow::Borrowed(declared), None),
    };
    let train = train.as_ref();
    use mslc_driver::parallel::{explain_lines, explain_train, plan_train, plan_warnings};
    Ok(plan_train(checked, train)?.map(|plan| {
        let name = &train.spec.name.name;
        let explanation = explain
            .then(|| explain_train(checked, train, &plan))
            .flatten()
            .map(|e| explain_lines(name, &plan, &e));
        let target = train
            .target
            .map(|i| target_from_spec(&checked.decls.targets[i]));
        Planned {
            train: name.clone(),
            on_host: target.is_some_and(|t| t.is_host()),
            warnings: as_run
                .into_iter()
                .chain(plan_warnings(checked, train, &plan))
                .collect(),
            plan,
            explanation,
        }
    }))
}

/// The tuner's results this build uses: the knowledge base they come from and what it said.
struct Tuned {
    kb: KnowledgeBase,
    device: String,
    threads: usize,
    note: String,
}

/// Gives the module's steps the knowledge base's tuned choices for this device and the
/// executor's default thread count, where no kernel table edit chose otherwise
/// (`replaceable`: the table's entries that hold an earlier tuning result). `None` when there is no knowledge base to read; a base
/// with no result for this device changes nothing, and the note says so.
fn tuned_choices(
    args: &BuildArgs,
    module: &mut mslc_artifact::Module,
    replaceable: &std::collections::BTreeSet<String>,
) -> Result<Option<Tuned>, (Code, String, String)> {
    let Some(path) = tune_db(args) else {
        return Ok(None);
    };
    let kb = KnowledgeBase::read(&path).map_err(|e| {
        (
            e.code(),
            e.to_string(),
            "move the file aside (nothing in it is changed) or give --tune-db another one"
                .to_string(),
        )
    })?;
    let device = fingerprint();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let applied = kb.apply(module, &device, threads, replaceable);
    let note = if !applied.is_empty() {
        format!("{} signatures from {}", applied.len(), path.display())
    } else if kb.count_for(&device) == 0 && kb.records().next().is_some() {
        format!(
            "{} has results for other devices only (this one is `{device}`); default kernels",
            path.display()
        )
    } else {
        format!(
            "{} has no result for this model's signatures on {threads} threads; default kernels (run `mslc tune`)",
            path.display()
        )
    };
    Ok(Some(Tuned {
        kb,
        device,
        threads,
        note,
    }))
}

/// The knowledge base this build reads: `--tune-db`, else the default one when it exists.
fn tune_db(args: &BuildArgs) -> Option<PathBuf> {
    args.tune_db
        .clone()
        .or_else(|| default_path().filter(|p| p.exists()))
}

/// Rewrites the kernel table among `files` so that every entry whose choice is the tuner's
/// says `tuned = true` with the time measured for it.
fn mark_tuned(files: &mut [(PathBuf, Vec<u8>)], module: &mslc_artifact::Module, tuned: &Tuned) {
    let mut table = KernelTable::of(module);
    let measured: std::collections::BTreeMap<String, f64> = table
        .kernels
        .iter()
        .filter_map(|e| {
            let r = tuned.kb.get(&tuned.device, tuned.threads, &e.signature)?;
            (r.choice() == e.choice()).then(|| (e.signature.clone(), r.tuned_us))
        })
        .collect();
    table.mark_tuned(&measured);
    let file = format!("{}.kernels.toml", module.name);
    if let Some(entry) = files.iter_mut().find(|(p, _)| p.ends_with(&file)) {
        entry.1 = table.to_toml().into_bytes();
    }
}

/// A compiled model or training step, with its recompute report (a training step's).
type Built<'c> = (Cow<'c, Model>, Compiled, Option<RecomputeReport>);

/// The train `entry` of `checked`, its model (labels and loss included), and how a step of it
/// compiles for one device (the whole model's, [`whole_model_step`], or a rank's): the compile
/// options of the `selected` target, precision and fusion, and the training options (no
/// exposed gradients, one replica, the memory policy's budget).
pub(super) fn train_step<'c>(
    selected: Selection,
    checked: &'c Checked,
    entry: &str,
) -> Result<(&'c Train, &'c Model, CompileOptions, TrainOptions), Box<Diagnostic>> {
    let train = choose_train(checked, Some(entry))?;
    let model = train.graph.as_ref().ok_or_else(|| {
        root_error(
            checked,
            Code::E0608,
            format!("train `{entry}` did not check"),
            "fix the errors `mslc check` reports".to_string(),
        )
    })?;
    let (options, loss_scale) = train_compile_options(checked, train, model, selected)?;
    let train_options = TrainOptions {
        expose_grads: false,
        loss_scale,
        memory: MemoryRequest::of_train(checked, train),
        data_parallel: 1,
        optimizer_shard: 0,
    };
    Ok((train, model, options, train_options))
}

/// [`train_step`] for the step of the whole model on one device that `mslc build --entry
/// TRAIN` writes and `mslc tune` tunes. A train planned over several devices is held to
/// `max_device_memory` per device, by its per-device plan and its per-rank programs; its
/// whole-model step is no device's program (GPT-3 175B fits 1,024 devices, not one), so it is
/// compiled without the budget.
pub(super) fn whole_model_step<'c>(
    selected: Selection,
    checked: &'c Checked,
    entry: &str,
) -> Result<(&'c Train, &'c Model, CompileOptions, TrainOptions), Box<Diagnostic>> {
    let (train, model, options, mut train_options) = train_step(selected, checked, entry)?;
    let devices = train
        .parallel
        .map_or(1, |p| checked.decls.parallels[p].devices);
    if devices > 1 {
        train_options.memory = train_options.memory.map(MemoryRequest::without_budget);
    }
    Ok((train, model, options, train_options))
}

/// Compiles the training step of train `entry` (docs/mir-format.md, "Training modules"), in
/// f32: the module and the train's model (labels and loss included) are named after the train;
/// with what its memory policy recomputes, and the graph-level tuning decisions applied.
fn build_train<'c>(
    args: &BuildArgs,
    checked: &'c Checked,
    entry: &str,
) -> Result<(Built<'c>, Vec<SubgraphEntry>), Box<Diagnostic>> {
    let (train, model, options, train_options) = whole_model_step(selection(args), checked, entry)?;
    // The graph-level tuning decisions that name a fused subgraph of the training step apply
    // as they do to the forward.
    let table = args.out_dir.join(format!("{entry}.kernels.toml"));
    let decisions = tune_decisions::decisions(
        Some(args.kernels.as_deref().unwrap_or(&table)),
        tune_db(args).as_deref(),
    );
    let (train, applied) = tune_decisions::deciding(
        options,
        &decisions,
        |o| compile_train(train, o, train_options),
        |t| &t.compiled.module,
    )
    .map_err(|e| e.diagnostic(checked))?;
    let mut compiled = train.compiled;
    compiled.module.name = entry.to_string();
    let mut model = model.clone();
    model.name = entry.to_string();
    Ok((
        (Cow::Owned(model), compiled, Some(train.recompute)),
        applied,
    ))
}

/// How the flags ask to compile.
pub(super) fn selection(args: &BuildArgs) -> Selection<'_> {
    Selection {
        target: args.target.as_deref(),
        precision: args.precision.precision.as_deref(),
        fuse: !args.no_fuse,
        verify: args.verify,
    }
}

/// What to do about a kernel table that cannot be used.
fn table_help(e: &mslc_plan::kernels::KernelTableError) -> String {
    match e.code() {
        Code::E0602 => "give a readable file to --kernels".to_string(),
        _ => {
            "fix the entry, or delete the table to start again from the default kernels".to_string()
        }
    }
}

fn report<'a>(
    model: &'a Model,
    c: &'a Compiled,
    stage_ms: StageMs,
    recompute: Option<&'a RecomputeReport>,
) -> Report<'a> {
    Report {
        model: &model.name,
        target: &c.module.target,
        target_fingerprint: &c.module.target_fingerprint,
        ops_before_passes: c.ops_before,
        ops_after_passes: c.graph.op_count(),
        steps: c.module.steps.len(),
        parameters: model.param_count(),
        parameter_bytes: model.param_bytes(),
        arena_bytes: c.memory.arena_bytes,
        hoisted_bytes: c.memory.hoisted_bytes,
        lower_bound_bytes: c.memory.lower_bound_bytes,
        arena_over_lower_bound: c.memory.ratio,
        in_place_reuses: c.memory.in_place_reuses,
        memory_strategy: &c.memory.strategy,
        rewrites_by_label: &c.passes.rewrites_by_label,
        passes: &c.passes.passes,
        flops_per_forward: c.cost.flops,
        estimated_seconds_per_forward: c.cost.seconds,
        stage_ms,
        recompute,
    }
}

fn rewrites_text(by_label: &std::collections::BTreeMap<String, usize>) -> String {
    if by_label.is_empty() {
        return "none".to_string();
    }
    by_label
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report_text(
    r: &Report,
    training_step: bool,
    verified: bool,
    kernels: Option<&str>,
    tuning: Option<&str>,
    dir: &Path,
    files: &[(PathBuf, Vec<u8>)],
) -> String {
    let s = &r.stage_ms;
    let mut lines = vec![
        format!("built {} for {} ({})", r.model, r.target, r.target_fingerprint),
        format!("  ops:        {} after lowering, {} after passes, {} steps", r.ops_before_passes, r.ops_after_passes, r.steps),
        format!("  parameters: {} ({})", group_thousands(r.parameters), human_bytes(u64::try_from(r.parameter_bytes).unwrap_or(u64::MAX))),
        format!("  rewrites:   {}", rewrites_text(r.rewrites_by_label)),
        format!(
            "  arena:      {}, lower bound {}, ratio {:.4} ({}, {} in-place)",
            human_bytes(r.arena_bytes),
            human_bytes(r.lower_bound_bytes),
            r.arena_over_lower_bound,
            r.memory_strategy,
            r.in_place_reuses
        ),
        format!(
            "  hoisted:    {} of parameter-only values, computed once per parameter change",
            human_bytes(r.hoisted_bytes)
        ),
        format!(
            "  compute:    {:.3} GFLOP per {}, ~{:.3} ms on {}",
            r.flops_per_forward as f64 / 1e9,
            if training_step { "training step" } else { "forward" },
            r.estimated_seconds_per_forward * 1e3,
            r.target
        ),
        format!(
            "  time:       check {:.1} ms, lower {:.1} ms, passes {:.1} ms, schedule {:.1} ms, memory {:.1} ms, encode {:.1} ms",
            s.check, s.lower, s.passes, s.schedule, s.memory, s.encode
        ),
    ];
    if verified {
        lines.push(format!(
            "  verified:   the IR after lowering and after each of {} passes: acyclic, every op input connected once, result types as the op registry infers, outputs present",
            r.passes.len()
        ));
    }
    if let Some(recompute) = r.recompute {
        lines.extend(recompute.lines());
    }
    if let Some(tuning) = tuning {
        lines.push(format!("  tuning:     {tuning}"));
    }
    if let Some(kernels) = kernels {
        lines.push(format!("  kernels:    {kernels}"));
    }
    lines.push(format!("  wrote to {}:", dir.display()));
    for (path, bytes) in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        lines.push(format!(
            "    {name} ({} bytes)",
            group_thousands(bytes.len() as u64)
        ));
    }
    lines.join("\n") + "\n"
}
