//! `mslc tune FILE.msl|FILE.mir`: search the kernel parameters of every distinct kernel
//! signature of a model on this machine, within a time budget, and keep the winners in the
//! knowledge base that `mslc build` fills the kernel table from. Prints a summary table and
//! writes `NAME.tune.json`; Ctrl-C stops early and keeps what was measured.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use mslc_artifact::write::write_all_or_nothing;
use mslc_artifact::{decode, read_mir, Module};
use mslc_check::{check_path, Checked};
use mslc_core::diag::{Code, Severity};
use mslc_driver::compile::{compile, CompileOptions, STAGE_SIZE};
use mslc_driver::select::{choose_model, compile_options, Selection};
use mslc_driver::train::{choose_train, compile_train, micro_batch_dim, TrainOptions};
use mslc_tune::budget::parse_budget;
use mslc_tune::case::Case;
use mslc_tune::confirm::{confirm_model, Kept, Model, WholeModel};
use mslc_tune::graph::{
    tune_subgraphs, unfused as graph_unfused, ExecRunner, GraphOutcome, Subgraph,
};
use mslc_tune::kb::{default_path, KnowledgeBase};
use mslc_tune::measure::KernelRunner;
use mslc_tune::tuner::{tune, Observer, Options, Outcome, Progress, Report, Source};

use super::build::whole_model_step;
use super::{source_only_flags, ModelArgs, PrecisionArg, Reporter};

/// Arguments of `mslc tune`.
#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// A model source (`.msl`) or a built artifact (`.mir`).
    pub file: PathBuf,
    /// The model to tune when the source declares several, or a `train` (its training step,
    /// as `mslc build --entry TRAIN` compiles it for one device).
    #[arg(long, value_name = "NAME")]
    pub entry: Option<String>,
    /// Wall-clock time for the whole model: `60s`, `5m`, `1h` (at most 24h).
    #[arg(long, value_name = "TIME", default_value = "60s")]
    pub budget: String,
    /// The knowledge base file (default: `$XDG_CACHE_HOME/mslc/tune-kb.json`, else
    /// `~/.cache/mslc/tune-kb.json`).
    #[arg(long, value_name = "FILE.json")]
    pub db: Option<PathBuf>,
    /// Worker threads the kernels are tuned for (default: one per core), at most 256.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Where `NAME.tune.json` goes.
    #[arg(short = 'o', long = "out-dir", default_value = "build")]
    pub out_dir: PathBuf,
    /// Compile a `.msl` without the fusion pass.
    #[arg(long)]
    pub no_fuse: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// The most worker threads `--threads` asks for (as `mslc run`).
const MAX_THREADS: usize = 256;

/// The share of the budget graph-level tuning may take (it measures two variants per fused
/// subgraph, far less than a kernel search; what it leaves goes to the kernels).
const GRAPH_SHARE: f64 = 0.5;

/// The share of the budget kept for the whole-model confirmation (a few alternated forwards
/// of the default and tuned modules).
const CONFIRM_SHARE: f64 = 0.1;

/// Set by Ctrl-C: the tuner finishes the measurement in progress, saves and reports.
static STOP: AtomicBool = AtomicBool::new(false);

/// Runs the command; 1 on errors in the input, 2 on misused flags.
pub fn run(args: &TuneArgs, reporter: &Reporter) -> u8 {
    match execute(args, reporter) {
        Ok((text, json)) => {
            reporter.result(&text, json);
            0
        }
        Err(None) => 1,
        Err(Some((code, message))) => {
            reporter.emit_plain(code, Severity::Error, &message);
            if code.exit_class() == mslc_core::diag::ExitClass::Usage {
                2
            } else {
                1
            }
        }
    }
}

/// A failure: diagnostics already printed (`None`), or one coded message to print.
type Failure = Option<(Code, String)>;

fn execute(args: &TuneArgs, reporter: &Reporter) -> Result<(String, serde_json::Value), Failure> {
    let budget = parse_budget(&args.budget).map_err(|m| Some((Code::E0623, m)))?;
    let threads = match args.threads {
        Some(0) => {
            return Err(Some((
                Code::E0609,
                "--threads must be at least 1".to_string(),
            )))
        }
        Some(n) if n > MAX_THREADS => {
            return Err(Some((
                Code::E0605,
                format!("--threads {n}: at most {MAX_THREADS} worker threads are supported"),
            )))
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let db = args.db.clone().or_else(default_path).ok_or_else(|| {
        Some((
            Code::E0609,
            "no cache directory (neither XDG_CACHE_HOME nor HOME is set): give --db FILE.json"
                .to_string(),
        ))
    })?;
    let mut kb = KnowledgeBase::read(&db).map_err(|e| {
        Some((
            e.code(),
            format!("{e}; move it aside or give --db another file (it is left as it is)"),
        ))
    })?;
    let loaded = load(args, reporter)?;
    let subgraphs = Subgraph::of_module(&loaded.module);
    let device = mslc_tune::device::fingerprint();
    if Case::of_module(&loaded.module).is_empty() && subgraphs.is_empty() {
        reporter.emit_plain(
            Code::W0013,
            Severity::Warning,
            &format!(
                "`{}` has no kernel with parameters to tune (only copies and reference kernels); nothing measured",
                loaded.module.name
            ),
        );
    }
    // Ctrl-C stops the search; a second handler cannot be installed, which only matters to
    // tests running the command in-process.
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::Relaxed));
    let start = std::time::Instant::now();
    let mut options = Options {
        budget: budget.mul_f64(GRAPH_SHARE),
        threads,
        device: device.clone(),
    };
    let mut bar = Bar::new(subgraphs.len() as u64);
    let kb_error = |e: mslc_tune::kb::KbError| Some((e.code(), e.to_string()));
    let graph = tune_subgraphs(
        &subgraphs,
        &mut kb,
        Some(&db),
        &options,
        &ExecRunner,
        &STOP,
        &mut bar,
    )
    .map_err(kb_error)?;
    // A subgraph left unfused runs no fused op, but each of its ops on its own kernel: those
    // are searched (block size, parallel threshold — the op's thread count) instead.
    let unfused: BTreeSet<String> = graph_unfused(&graph).into_keys().collect();
    let name = loaded.module.name.clone();
    let default = loaded.module.clone();
    let module = loaded.unfused(unfused.clone())?;
    let cases = Case::to_tune(&default, &module, &unfused);
    options.budget = budget
        .saturating_sub(start.elapsed())
        .saturating_sub(budget.mul_f64(CONFIRM_SHARE));
    let mut report = tune(
        &cases,
        &mut kb,
        Some(&db),
        &options,
        &KernelRunner,
        &STOP,
        &mut bar,
    )
    .map_err(kb_error)?;
    bar.0.set_message("confirming the whole model's forward");
    let model = Model {
        default: &default,
        graph: &module,
        unfused: &unfused,
        device: &device,
        threads,
    };
    let whole = match report.interrupted {
        true => None,
        false => confirm_model(&model, &mut kb, Some(&db), &STOP).map_err(kb_error)?,
    };
    report.seconds = start.elapsed().as_secs_f64();
    bar.0.finish_and_clear();
    let json = serde_json::json!({
        "model": name,
        "device": device,
        "threads": threads,
        "budget_seconds": budget.as_secs_f64(),
        "knowledge_base": db,
        "report": report,
        "subgraphs": graph,
        "whole_model": whole,
    });
    let path = args.out_dir.join(format!("{name}.tune.json"));
    let mut bytes = serde_json::to_string_pretty(&json).unwrap_or_default();
    bytes.push('\n');
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            write_all_or_nothing(&[(path.clone(), bytes.into_bytes())]).map_err(|e| e.to_string())
        })
        .map_err(|e| {
            Some((
                Code::E0600,
                format!(
                    "cannot write `{}`: {e} (the knowledge base `{}` is saved)",
                    path.display(),
                    db.display()
                ),
            ))
        })?;
    let text = summary(&name, &report, &graph, whole.as_ref(), threads, &db, &path);
    Ok((text, serde_json::json!({ "summary": json })))
}

/// The module to tune and, for a source, what compiles it again: the checked source, the
/// model or train entry, its options, and for a train its training options.
struct Loaded {
    module: Module,
    source: Option<(Checked, String, CompileOptions, Option<TrainOptions>)>,
}

impl Loaded {
    /// The module with the fused subgraphs `unfused` names left unfused, so that the kernels
    /// of their ops are searched too (a `.mir` is fixed: it stays as it is).
    fn unfused(self, unfused: BTreeSet<String>) -> Result<Module, Failure> {
        let Some((checked, name, mut options, train)) = self.source.filter(|_| !unfused.is_empty())
        else {
            return Ok(self.module);
        };
        options.unfused = unfused;
        if let Some(train_options) = train {
            return train_module(&checked, &name, &options, train_options);
        }
        let model = checked
            .model(&name)
            .ok_or_else(|| Some((Code::E0603, format!("model `{name}` disappeared"))))?;
        compiled(model, &options)
    }
}

/// The training step of train `entry` of `checked`, compiled with `options` and named after
/// the train, as `mslc build --entry TRAIN` names it.
fn train_module(
    checked: &Checked,
    entry: &str,
    options: &CompileOptions,
    train_options: TrainOptions,
) -> Result<Module, Failure> {
    let train =
        choose_train(checked, Some(entry)).map_err(|d| Some((d.code, d.message.clone())))?;
    compile_train(train, options, train_options)
        .map(|step| Module {
            name: entry.to_string(),
            ..step.compiled.module
        })
        .map_err(|e| {
            let d = e.diagnostic(checked);
            Some((d.code, d.message))
        })
}

/// `model` compiled with `options`, or the coded reason it cannot be.
fn compiled(model: &mslc_check::Model, options: &CompileOptions) -> Result<Module, Failure> {
    let compiled = compile(model, options).map_err(|e| {
        let code = if e.stage == STAGE_SIZE {
            Code::E0606
        } else {
            Code::E0603
        };
        Some((code, format!("cannot compile `{}`: {e}", model.name)))
    })?;
    Ok(compiled.module)
}

/// The module to tune: a `.mir` decoded, or a `.msl` checked and compiled as `mslc build`
/// would.
fn load(args: &TuneArgs, reporter: &Reporter) -> Result<Loaded, Failure> {
    if args.file.extension().is_some_and(|e| e == "mir") {
        if let Some(m) = source_only_flags(&args.model, &args.precision) {
            return Err(Some((Code::E0609, m)));
        }
        let unreadable = |m: String| Some((Code::E0602, m));
        let bytes = read_mir(&args.file).map_err(unreadable)?;
        let decoded =
            decode(&bytes).map_err(|e| unreadable(format!("`{}`: {e}", args.file.display())))?;
        return Ok(Loaded {
            module: decoded.module,
            source: None,
        });
    }
    let mut options = args.model.check_options();
    let mut checked = check_path(&args.file, &options);
    let selection = Selection {
        precision: args.precision.precision.as_deref(),
        fuse: !args.no_fuse,
        ..Selection::default()
    };
    // A train's step, as one device runs it: the batch dim set to one micro-batch.
    let train = args
        .entry
        .as_deref()
        .filter(|e| checked.decls.trains.iter().any(|t| t.spec.name.name == *e));
    if let (Some(entry), false) = (train, checked.has_errors()) {
        let dim = choose_train(&checked, Some(entry)).and_then(|t| {
            match t.model.and_then(|m| checked.models.get(m)) {
                Some(model) => micro_batch_dim(t, model, &args.model.dims, 1),
                None => Ok(None),
            }
        });
        match dim {
            Ok(Some((name, size))) => {
                options.overrides.dims.insert(name, size.to_string());
                checked = check_path(&args.file, &options);
            }
            Ok(None) => {}
            Err(d) => {
                reporter.emit(&[*d], &checked.sources);
                return Err(None);
            }
        }
    }
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return Err(None);
    }
    let reported = |d: Box<mslc_core::diag::Diagnostic>| {
        reporter.emit(&[*d], &checked.sources);
        None
    };
    if let Some(entry) = train {
        let (_, _, options, train_options) =
            whole_model_step(selection, &checked, entry).map_err(reported)?;
        let module = train_module(&checked, entry, &options, train_options)?;
        return Ok(Loaded {
            module,
            source: Some((checked, entry.to_string(), options, Some(train_options))),
        });
    }
    let model = choose_model(&checked, args.entry.as_deref()).map_err(reported)?;
    let options = compile_options(&checked, model, selection).map_err(reported)?;
    let module = compiled(model, &options)?;
    let name = model.name.clone();
    Ok(Loaded {
        module,
        source: Some((checked, name, options, None)),
    })
}

/// The progress bar on stderr (only on a terminal): signatures done, best speed-up so far,
/// budget left.
struct Bar(ProgressBar);

impl Bar {
    fn new(total: u64) -> Bar {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} signatures  {msg}") {
            bar.set_style(style);
        }
        Bar(bar)
    }
}

impl Observer for Bar {
    fn progress(&mut self, p: &Progress<'_>) {
        self.0.set_length(p.total as u64);
        self.0.set_position(p.done as u64);
        let mut current: String = p.current.chars().take(48).collect();
        if current.len() < p.current.len() {
            current.push('…');
        }
        self.0.set_message(format!(
            "best {:.2}x, {:.0}s left  {current}",
            p.best_speedup,
            p.left.as_secs_f64()
        ));
    }
}

/// The summary table: per signature its default and tuned time, speed-up, candidates tried
/// and where the result came from.
fn summary(
    model: &str,
    report: &Report,
    graph: &[GraphOutcome],
    whole: Option<&WholeModel>,
    threads: usize,
    db: &std::path::Path,
    json: &std::path::Path,
) -> String {
    let mut lines = vec![format!(
        "tuned {model} on {threads} thread(s) in {:.1} s{}",
        report.seconds,
        if report.interrupted {
            " (interrupted: what was measured is saved)"
        } else {
            ""
        }
    )];
    lines.push(format!(
        "  {:>10} {:>10} {:>8} {:>6}  {:<10} signature",
        "default", "tuned", "speedup", "tried", "result"
    ));
    for o in &report.outcomes {
        lines.push(row(o));
    }
    if !graph.is_empty() {
        lines.push(format!(
            "  {:>10} {:>10} {:>8} {:>6}  {:<10} fused subgraph",
            "fused", "unfused", "speedup", "choice", "result"
        ));
        lines.extend(graph.iter().map(graph_row));
    }
    for o in graph {
        if let Some(why) = &o.rejected {
            lines.push(format!("  rejected unfused {}: {why}", o.signature));
        }
    }
    for o in &report.outcomes {
        for r in &o.rejected {
            lines.push(format!(
                "  rejected for {}: {} {}",
                o.signature,
                params_text(&r.params),
                r.reason
            ));
        }
    }
    lines.push(whole_line(whole));
    lines.push(format!("  knowledge base: {}", db.display()));
    lines.push(format!("  wrote {}", json.display()));
    lines.join("\n") + "\n"
}

/// Which decisions a confirmed forward was given, in words.
fn decisions(kept: &Kept) -> &'static str {
    match kept {
        Kept::All => "every decision",
        Kept::Kernels => "the kernel decisions only",
        Kept::Graph => "the graph-level decisions only",
        Kept::None => "no decision",
    }
}

/// The whole-model line: the default and tuned run of the module (a forward, or a training
/// step), the speed-up, what was kept and what dropped.
fn whole_line(whole: Option<&WholeModel>) -> String {
    let Some(w) = whole else {
        return "  whole model: no decision changes the module (tuned = default)".to_string();
    };
    let c = &w.confirmation;
    if let Source::Skipped(why) = &w.source {
        return format!("  whole model: not confirmed ({why}); decisions kept as measured");
    }
    let kept = match c.kept {
        Kept::All => "every decision kept",
        Kept::Kernels => "kernel decisions kept, graph-level ones dropped",
        Kept::Graph => "graph-level decisions kept, kernel ones dropped",
        Kept::None => "every decision dropped: the defaults are kept",
    };
    let mut line = format!(
        "  whole model: default {:.3} ms, tuned {:.3} ms per run, {:.2}x ({kept}; noise {:.1} %; {})",
        c.default_ms,
        c.tuned_ms,
        c.speedup(),
        c.noise * 100.0,
        result(&w.source)
    );
    for t in &c.tried {
        match &t.rejected {
            Some(why) => line.push_str(&format!(
                "\n    the forward with {} rejected: {why}",
                decisions(&t.kept)
            )),
            None if t.kept != c.kept => line.push_str(&format!(
                "\n    the forward with {} {:.3} ms: slower than the default beyond noise",
                decisions(&t.kept),
                t.ms
            )),
            None => {}
        }
    }
    if !w.dropped_kernels.is_empty() || !w.dropped_subgraphs.is_empty() {
        line.push_str(&format!(
            "\n    dropped from the knowledge base: {} kernel decision(s), {} unfused subgraph(s)",
            w.dropped_kernels.len(),
            w.dropped_subgraphs.len()
        ));
    }
    line
}

/// A time in microseconds, or `-` when not measured.
fn time(us: f64) -> String {
    if us > 0.0 {
        format!("{us:.1}us")
    } else {
        "-".to_string()
    }
}

/// Where a result came from, as the summary says it.
fn result(source: &Source) -> String {
    match source {
        Source::Measured => "measured".to_string(),
        Source::Interrupted => "partial".to_string(),
        Source::KnowledgeBase => "known".to_string(),
        Source::Skipped(why) => format!("skipped ({why})"),
    }
}

fn graph_row(o: &GraphOutcome) -> String {
    format!(
        "  {:>10} {:>10} {:>7.2}x {:>6}  {:<10} {}",
        time(o.fused_us),
        time(o.unfused_us),
        o.speedup(),
        if o.fused { "fused" } else { "split" },
        result(&o.source),
        o.signature
    )
}

fn row(o: &Outcome) -> String {
    format!(
        "  {:>10} {:>10} {:>7.2}x {:>6}  {:<10} {}",
        time(o.default_us),
        time(o.tuned_us),
        o.speedup(),
        o.candidates,
        result(&o.source),
        o.signature
    )
}

fn params_text(
    params: &std::collections::BTreeMap<String, mslc_kernels::binding::KernelParam>,
) -> String {
    params
        .iter()
        .map(|(k, v)| match v {
            mslc_kernels::binding::KernelParam::Int(i) => format!("{k}={i}"),
            mslc_kernels::binding::KernelParam::Text(t) => format!("{k}={t}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}
