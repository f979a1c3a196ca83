//! `mslc build FILE`: check, compile and plan a model, and write its artifacts — the module
//! (`NAME.mir`), the kernel table, the memory plan and a report — all or nothing.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use mslc_artifact::{encode, write::write_all_or_nothing};
use mslc_check::{check_path, Checked, Model};
use mslc_core::diag::{Code, Diagnostic};
use mslc_driver::compile::{amp_for, compile, CompileOptions, Compiled};
use mslc_driver::dep_info::dep_info;
use mslc_driver::select::{choose_model, choose_target, root_error};
use mslc_plan::kernels::kernel_table_toml;

use super::check::group_thousands;
use super::output::print_stdout;
use super::{ModelArgs, Reporter};

/// Extra outputs `--emit` can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// The optimized IR as text: `NAME.ir`.
    Ir,
    /// The optimized IR as Graphviz: `NAME.dot`.
    Dot,
    /// A Makefile rule naming every source file read: `NAME.d`, as `rustc --emit dep-info`.
    DepInfo,
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
    /// The model to build (default: the file's only model, or the one its `train` names).
    #[arg(long)]
    pub entry: Option<String>,
    /// The target to plan for (a `target` declaration: `cpu`, `ascend910b`, `a100`, `h100`, …).
    #[arg(long)]
    pub target: Option<String>,
    /// Output directory.
    #[arg(short = 'o', long = "out-dir", default_value = "build")]
    pub out_dir: PathBuf,
    /// Also write the IR as text or Graphviz, or the dep-info: `--emit ir,dot,dep-info`.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub emit: Vec<Emit>,
    /// Run the IR verifier after lowering and after every pass.
    #[arg(long)]
    pub verify: bool,
    /// Put these weights (safetensors, matched by parameter path) inside the `.mir`.
    #[arg(long, value_name = "FILE.safetensors")]
    pub embed_weights: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
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
    parameters: u64,
    parameter_bytes: u64,
    arena_bytes: u64,
    lower_bound_bytes: u64,
    arena_over_lower_bound: f64,
    in_place_reuses: usize,
    memory_strategy: &'a str,
    rewrites_by_label: &'a std::collections::BTreeMap<String, usize>,
    passes: &'a [mslc_ir::passes::PassTiming],
    flops_per_forward: u64,
    estimated_seconds_per_forward: f64,
    stage_ms: StageMs,
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
        let list: Vec<String> = mslc_ir::passes::pass_descriptions()
            .iter()
            .map(|(name, what)| format!("{name:<14} {what}"))
            .collect();
        print_stdout(&(list.join("\n") + "\n"));
        return 0;
    };
    let start = Instant::now();
    let checked = check_path(file, &args.model.check_options());
    let check_ms = start.elapsed().as_secs_f64() * 1e3;
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return 1;
    }
    match build(args, &checked, check_ms) {
        Ok(text) => {
            print_stdout(&text);
            0
        }
        Err(d) => {
            reporter.emit(&[*d], &checked.sources);
            1
        }
    }
}

fn build(args: &BuildArgs, checked: &Checked, check_ms: f64) -> Result<String, Box<Diagnostic>> {
    let model = choose_model(checked, args.entry.as_deref())?;
    let target = choose_target(checked, model, args.target.as_deref())?;
    let options = CompileOptions {
        target,
        verify: args.verify,
        fuse: !args.no_fuse,
        amp: amp_for(checked, model),
    };
    let compiled = compile(model, &options).map_err(|e| {
        root_error(
            checked,
            Code::E0600,
            format!("internal compiler error in {e}"),
            "this is a bug in mslc; please report it with the file".to_string(),
        )
    })?;
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
    let name = &model.name;
    let dir = &args.out_dir;
    let mut files = vec![
        (dir.join(format!("{name}.mir")), mir),
        (
            dir.join(format!("{name}.kernels.toml")),
            kernel_table_toml(&compiled.module).into_bytes(),
        ),
        (
            dir.join(format!("{name}.memplan.json")),
            json(&compiled.memory),
        ),
    ];
    for emit in &args.emit {
        let (ext, text) = match emit {
            Emit::Ir => ("ir", mslc_ir::print::to_text(&compiled.graph)),
            Emit::Dot => ("dot", mslc_ir::print::to_dot(&compiled.graph)),
            Emit::DepInfo => ("d", dep_info(&files[0].0, &checked.files)),
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
    let report = report(model, &compiled, stage_ms);
    files.push((dir.join(format!("{name}.report.json")), json(&report)));
    write_outputs(dir, &files).map_err(|(path, e)| {
        root_error(
            checked,
            Code::E0600,
            format!("cannot write {}: {e}", path.display()),
            "choose a writable directory with -o DIR; nothing was written".to_string(),
        )
    })?;
    Ok(report_text(&report, dir, &files))
}

fn write_outputs(
    dir: &Path,
    files: &[(PathBuf, Vec<u8>)],
) -> Result<(), (PathBuf, std::io::Error)> {
    std::fs::create_dir_all(dir).map_err(|e| (dir.to_path_buf(), e))?;
    write_all_or_nothing(files)
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text.into_bytes()
}

fn report<'a>(model: &'a Model, c: &'a Compiled, stage_ms: StageMs) -> Report<'a> {
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
        lower_bound_bytes: c.memory.lower_bound_bytes,
        arena_over_lower_bound: c.memory.ratio,
        in_place_reuses: c.memory.in_place_reuses,
        memory_strategy: &c.memory.strategy,
        rewrites_by_label: &c.passes.rewrites_by_label,
        passes: &c.passes.passes,
        flops_per_forward: c.cost.flops,
        estimated_seconds_per_forward: c.cost.seconds,
        stage_ms,
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

fn report_text(r: &Report, dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let s = &r.stage_ms;
    let mut lines = vec![
        format!("built {} for {} ({})", r.model, r.target, r.target_fingerprint),
        format!("  ops:        {} after lowering, {} after passes, {} steps", r.ops_before_passes, r.ops_after_passes, r.steps),
        format!("  parameters: {} ({:.1} MiB)", group_thousands(r.parameters), mib(r.parameter_bytes)),
        format!("  rewrites:   {}", rewrites_text(r.rewrites_by_label)),
        format!(
            "  arena:      {:.2} MiB, lower bound {:.2} MiB, ratio {:.4} ({}, {} in-place)",
            mib(r.arena_bytes),
            mib(r.lower_bound_bytes),
            r.arena_over_lower_bound,
            r.memory_strategy,
            r.in_place_reuses
        ),
        format!("  compute:    {:.3} GFLOP per forward, ~{:.3} ms on {}", r.flops_per_forward as f64 / 1e9, r.estimated_seconds_per_forward * 1e3, r.target),
        format!(
            "  time:       check {:.1} ms, lower {:.1} ms, passes {:.1} ms, schedule {:.1} ms, memory {:.1} ms, encode {:.1} ms",
            s.check, s.lower, s.passes, s.schedule, s.memory, s.encode
        ),
        format!("  wrote to {}:", dir.display()),
    ];
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
