//! `mslc run ARTIFACT.mir|FILE.msl`: execute a model on this CPU. A `.msl` is checked and
//! compiled in memory for the shapes of the given inputs, with the options `build` uses; weights come from safetensors, the
//! artifact itself, or a seeded init; outputs are written as `.npy`; the median time per
//! forward and the achieved GFLOP/s are printed. Output files are written all or nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use mslc_artifact::validate::file_in;
use mslc_artifact::write::{check_manifest, write_parts_all_or_nothing, ManifestCheck};
use mslc_artifact::{decode, read_mir, Module};
use mslc_check::{check_path, Checked};
use mslc_core::diag::{Code, Severity, Sources};
use mslc_core::units::human_bytes;
use mslc_driver::compile::STAGE_SIZE;
use mslc_driver::numerics::NumericsReport;
use mslc_driver::ranks::{
    compile_rank, compile_stage, PipelineLayout, STAGE_PIPELINE, STAGE_TENSOR_PARALLEL,
};
use mslc_driver::select::{choose_model, compile_options, dims_from_inputs, Selection};
use mslc_driver::train::TensorSplits;
use mslc_exec::limits::{available_memory, parse_size};
use mslc_exec::{ExecError, ExecErrorKind, ExecOptions, Executor, Seeded};
use mslc_io::npy::{read_npy, NpyArray, NpyView};
use mslc_io::safetensors::{SafetensorsBytes, SafetensorsFile};
use mslc_ir::shard::pipeline::StageCut;
use mslc_kernels::peak::Peak;
use mslc_plan::kernels::KernelTable;

use super::output::Failure;
use super::progress::Progress;
use super::world::{self, LaunchArgs, World};
use super::{parse_key_value, source_only_flags, ModelArgs, PrecisionArg, Reporter};

/// Arguments of `mslc run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// A built artifact (`.mir`) or a model source (`.msl`).
    pub file: PathBuf,
    /// Weights, matched to parameters by path.
    #[arg(long, value_name = "FILE.safetensors")]
    pub weights: Option<PathBuf>,
    /// Initialise parameters from their declared init with this seed instead of loading them
    /// (inputs not given are seeded too: floats N(0, 1), ids below what they index; a training
    /// step's optimizer states zero, its learning rate 0 and its other float scalars 1).
    #[arg(long, value_name = "N")]
    pub init_seed: Option<u64>,
    /// An input value: `--input tokens=tokens.npy`.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = parse_key_value)]
    pub inputs: Vec<(String, String)>,
    /// Write each output as `DIR/NAME.npy`.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Forward passes to time (the median is reported), at most 1,000,000.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=MAX_ITERATIONS))]
    pub iterations: u64,
    /// Worker threads (default: one per core), at most 256.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Refuse to run when the model needs more memory than this (e.g. `8GiB`, `512MB`); the
    /// memory the system has available is always a limit too.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<u64>,
    /// Write a Chrome trace of the last forward pass (opens in Perfetto).
    #[arg(long, value_name = "F.json")]
    pub profile: Option<PathBuf>,
    /// Take kernel choices from this table (default for a `.mir`: the `NAME.kernels.toml`
    /// beside it, when it exists), for every step whose op signature it lists.
    #[arg(long, value_name = "FILE.toml")]
    pub kernels: Option<PathBuf>,
    /// Compile a `.msl` without the fusion pass (to compare against the fused graph).
    #[arg(long)]
    pub no_fuse: bool,
    /// Check every step's result for NaN and infinity, and stop at the first op that produces
    /// one with where it was written and its operands' ranges (E0614).
    #[arg(long)]
    pub check_numerics: bool,
    /// The model to run when the source declares several.
    #[arg(long, value_name = "NAME")]
    pub entry: Option<String>,
    #[command(flatten)]
    pub launch: LaunchArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// The most forward passes `--iterations` times.
const MAX_ITERATIONS: u64 = 1_000_000;

/// The most worker threads `--threads` asks for; more only add per-thread scratch memory.
const MAX_THREADS: usize = 256;

/// Runs the command; 1 on errors in the input, 2 on misused flags.
pub fn run(args: &RunArgs, reporter: &Reporter) -> u8 {
    world::command(reporter, &args.launch, |world| {
        execute(args, world, reporter)
    })
}

/// A failure to read a file named on the command line.
pub(super) fn unreadable(m: String) -> Failure {
    Failure::Message(Code::E0602, m)
}

/// Runs the model; the summary as text and as JSON (`None` in the ranks of an MPI world
/// other than 0).
fn execute(args: &RunArgs, world: &World, reporter: &Reporter) -> world::Outcome {
    if args.threads == Some(0) || args.launch.ranks == Some(0) {
        let flag = if args.threads == Some(0) {
            "--threads"
        } else {
            "--ranks"
        };
        return Err(Failure::Usage(format!("{flag} must be at least 1")));
    }
    if let Some(n) = args.threads.filter(|&n| n > MAX_THREADS) {
        return Err(Failure::Message(
            Code::E0605,
            format!("--threads {n}: at most {MAX_THREADS} worker threads are supported"),
        ));
    }
    if args.weights.is_some() && args.init_seed.is_some() {
        return Err(Failure::Usage(
            "give either --weights or --init-seed, not both".to_string(),
        ));
    }
    let mut arrays = BTreeMap::new();
    for (name, file) in &args.inputs {
        let array = read_npy(file).map_err(|e| unreadable(format!("input `{name}`: {e}")))?;
        if arrays.insert(name.clone(), array).is_some() {
            return Err(format!("input `{name}` is given twice").into());
        }
    }
    let is_mir = args.file.extension().is_some_and(|e| e == "mir");
    if let Some((_, launcher)) = world.started() {
        if is_mir {
            return Err(Failure::Usage(format!(
                "{launcher} runs a .msl source's parallel plan; `{}` holds one device's program",
                args.file.display()
            )));
        }
        return super::run_ranks::execute(args, world, arrays, reporter);
    }
    let mir_bytes;
    let (mut module, embedded, sources) = if is_mir {
        if let Some(m) = source_only_flags(&args.model, &args.precision) {
            return Err(Failure::Usage(m));
        }
        mir_bytes = read_mir(&args.file).map_err(unreadable)?;
        let decoded = decode(&mir_bytes)
            .map_err(|e| unreadable(format!("`{}`: {e}", args.file.display())))?;
        if let ManifestCheck::Mismatch(m) =
            check_manifest(&args.file, &decoded.module.name, &mir_bytes)
        {
            return Err(unreadable(m));
        }
        warn_if_foreign(&decoded.module, reporter);
        (decoded.module, decoded.weights, None)
    } else {
        let shapes = shapes_of(&arrays);
        let (module, sources) = compile_source(args, &shapes, None, true, reporter)?;
        warn_if_foreign(&module, reporter);
        (module, None, Some(sources))
    };
    let kernel_table = apply_kernels(args, &mut module, is_mir)?;
    let flops = module.flops();
    let name = module.name.clone();
    let mut exec = executor(args, module, args.threads.unwrap_or(0))?;
    let ignored_weights = load_params(args, &mut exec, embedded)?;
    exec.check_numerics(args.check_numerics);
    for (input, array) in &arrays {
        exec.set_input(input, array).map_err(|e| e.message)?;
    }
    let mut seeded = Vec::new();
    if let Some(seed) = args.init_seed {
        for input in exec.unset_inputs() {
            let how = exec.seed_input(&input, seed).map_err(|e| e.message)?;
            seeded.push((input, how));
        }
    }
    let times = timed_runs(args, &mut exec, sources.as_ref(), reporter, true)?;
    let peak = mslc_kernels::peak::measure(exec.threads());
    if let Some(p) = &peak {
        mslc_driver::host::remember(p);
    }
    // The outputs where they lie, written from there: a copy of each would be held beside the
    // plan (GPT-2's logits at B=8: 1.6 GB).
    let mut arrays = Vec::new();
    let written = args.output_dir.is_some().then_some(&exec.module().outputs);
    for (name, v) in written.into_iter().flatten() {
        let array = exec
            .output_view(name)
            .ok_or_else(|| format!("output `{name}` cannot be written as .npy"))?;
        let ty = exec.module().values[*v as usize].ty.to_string();
        arrays.push((name.clone(), ty, array));
    }
    let summary = RunSummary {
        pass: pass_name(exec.module()),
        model: name,
        threads: exec.threads(),
        ranks: None,
        peak,
        flops,
        times,
        arena_bytes: exec.arena_bytes(),
        hoisted_bytes: exec.hoisted_bytes(),
        kernel_table,
        seeded,
        ignored_weights,
        outputs: Vec::new(),
        profile: args.profile.clone(),
    };
    let profile = args.profile.as_ref().map(|_| exec.profile_json());
    let done = finish(args, summary, arrays, profile)?;
    warn_nonfinite(&exec, reporter);
    Ok(Some(done))
}

/// Applies the kernel table (`--kernels`, or for a `.mir` the one beside it) to `module`:
/// its path and what applying it did.
pub(super) fn apply_kernels(
    args: &RunArgs,
    module: &mut Module,
    is_mir: bool,
) -> Result<Option<(PathBuf, String)>, Failure> {
    let beside = is_mir.then(|| args.file.with_extension("kernels.toml"));
    let Some(path) = args
        .kernels
        .clone()
        .or_else(|| beside.filter(|p| p.exists()))
    else {
        return Ok(None);
    };
    let table = KernelTable::read(&path).map_err(|e| Failure::Message(e.code(), e.to_string()))?;
    let applied = table.apply(module);
    Ok(Some((path, applied.to_string())))
}

/// The executor of `module` on `threads` worker threads (0: one per core), refused (E0604)
/// when it needs more than `--max-memory` or the memory this system has available.
pub(super) fn executor(
    args: &RunArgs,
    module: Module,
    threads: usize,
) -> Result<Executor, Failure> {
    let (memory_limit, limit_source) = match (available_memory(), args.max_memory) {
        (Some(a), Some(m)) if a < m => (Some(a), "the memory this system has available now"),
        (_, Some(m)) => (Some(m), "--max-memory"),
        (a, None) => (a, "the memory this system has available now"),
    };
    let options = ExecOptions {
        threads,
        memory_limit,
    };
    Executor::new(module, &options).map_err(|e| match e.kind {
        ExecErrorKind::Memory => Failure::Message(
            Code::E0604,
            format!(
                "{} ({limit_source}); run a smaller configuration or on a bigger machine",
                e.message
            ),
        ),
        _ => e.message.into(),
    })
}

/// Runs the forward `--iterations` times (the last recording the workers for `--profile`),
/// with a progress bar when `progress`; the seconds each took.
pub(super) fn timed_runs(
    args: &RunArgs,
    exec: &mut Executor,
    sources: Option<&Sources>,
    reporter: &Reporter,
    progress: bool,
) -> Result<Vec<f64>, Failure> {
    let mut times = Vec::new();
    let mut bar = progress.then(|| Progress::new(args.iterations));
    for i in 0..args.iterations {
        if args.profile.is_some() && i + 1 == args.iterations {
            exec.record_workers(true);
        }
        let start = Instant::now();
        exec.run().map_err(|e| run_failure(e, sources, reporter))?;
        times.push(start.elapsed().as_secs_f64());
        if let Some(bar) = bar.as_mut() {
            bar.set(i + 1);
        }
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    Ok(times)
}

/// Writes the outputs `arrays` (name, type, value) as `--output-dir`/NAME.npy and the profile,
/// all or nothing, into `summary`; the summary as text and JSON.
pub(super) fn finish(
    args: &RunArgs,
    mut summary: RunSummary,
    arrays: Vec<(String, String, NpyView<'_>)>,
    profile: Option<String>,
) -> Result<(String, serde_json::Value), Failure> {
    // Each output's header and its data where it lies, written without a copy of either.
    let mut headers = Vec::new();
    if let Some(dir) = &args.output_dir {
        if dir.exists() && !dir.is_dir() {
            return Err(Failure::Message(
                Code::E0600,
                format!(
                    "--output-dir `{}` exists and is not a directory; nothing was written",
                    dir.display()
                ),
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            Failure::Message(
                Code::E0600,
                format!("cannot create `{}`: {e}", dir.display()),
            )
        })?;
        for (name, ty, array) in &arrays {
            let path = file_in(dir, name, "npy").map_err(|m| format!("output `{name}`: {m}"))?;
            summary
                .outputs
                .push((name.clone(), ty.clone(), path.clone()));
            headers.push((path, array.header_bytes(), array.data()));
        }
    }
    let mut files: Vec<(PathBuf, Vec<&[u8]>)> = (headers.iter())
        .map(|(path, header, data)| (path.clone(), vec![header.as_slice(), *data]))
        .collect();
    if let (Some(path), Some(json)) = (&args.profile, &profile) {
        files.push((path.clone(), vec![json.as_bytes()]));
    }
    write_parts_all_or_nothing(&files).map_err(|e| Failure::Message(Code::E0600, e.to_string()))?;
    Ok((summary.text(), summary.json()))
}

/// W0003 when an output of the last forward holds NaN or infinite values.
pub(super) fn warn_nonfinite(exec: &Executor, reporter: &Reporter) {
    let bad = exec.nonfinite_outputs();
    if !bad.is_empty() {
        reporter.emit_plain(
            Code::W0003,
            Severity::Warning,
            &format!(
                "output(s) {} hold NaN or infinite values (--check-numerics finds the op that \
                 produced the first)",
                bad.iter()
                    .map(|b| format!("`{b}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
}

/// What one run of `module` is, for the summary: a forward pass, or a training step's update.
pub(super) fn pass_name(module: &Module) -> &'static str {
    match module.is_training_step() {
        true => "training step",
        false => "forward",
    }
}

/// What a run did, for the summary.
pub(super) struct RunSummary {
    pub model: String,
    /// What one run is: `forward`, or `training step` for a module that replaces parameters.
    pub pass: &'static str,
    pub threads: usize,
    /// Under `--ranks`/`--mpi`: how many ranks ran the forward, how (data × tensor parallel)
    /// and by what launcher; the times and memory are rank 0's.
    pub ranks: Option<(usize, String)>,
    /// This machine's f32 peak on the run's thread count, measured after the timed runs.
    pub peak: Option<Peak>,
    pub flops: u64,
    /// Seconds per forward pass.
    pub times: Vec<f64>,
    pub arena_bytes: usize,
    /// Bytes of the planned region of hoisted, parameter-only values.
    pub hoisted_bytes: usize,
    /// The kernel table read, and what applying it did.
    pub kernel_table: Option<(PathBuf, String)>,
    /// Inputs not given and seeded, with what they were given.
    pub seeded: Vec<(String, Seeded)>,
    /// Framework bookkeeping buffers of the weights file left out: name, what they are.
    pub ignored_weights: Vec<(String, &'static str)>,
    /// Name, type and file of every written output.
    pub outputs: Vec<(String, String, PathBuf)>,
    pub profile: Option<PathBuf>,
}

impl RunSummary {
    /// Median and best seconds per forward.
    fn median_best(&self) -> (f64, f64) {
        let mut times = self.times.clone();
        times.sort_by(f64::total_cmp);
        (times[times.len() / 2], times[0])
    }

    /// The human summary: timing lines, memory, notes, written files.
    fn text(&self) -> String {
        let (median, best) = self.median_best();
        let rate = self.flops as f64 / median;
        let versus = self.peak.as_ref().map_or(String::new(), |p| {
            format!(
                " = {:.1}% of the {}",
                100.0 * rate / p.flops_per_s,
                p.describe()
            )
        });
        let mut s = format!(
            "ran {} on {} thread(s), {} iteration(s)\n  time:    {:.3} ms per {} (median; best {:.3} ms)\n  compute: {:.3} GFLOP per {}, {:.1} GFLOP/s{versus}\n",
            self.model,
            self.threads,
            self.times.len(),
            median * 1e3,
            self.pass,
            best * 1e3,
            self.flops as f64 / 1e9,
            self.pass,
            rate / 1e9,
        );
        if let Some((n, how)) = &self.ranks {
            s.push_str(&format!(
                "  ranks:   {n} ({how}); time and memory of rank 0\n"
            ));
        }
        s.push_str(&format!(
            "  memory:  {} arena for the intermediates, {} for hoisted parameter-only values\n",
            human_bytes(self.arena_bytes as u64),
            human_bytes(self.hoisted_bytes as u64)
        ));
        if let Some((path, applied)) = &self.kernel_table {
            s.push_str(&format!("  kernels: {}: {applied}\n", path.display()));
        }
        for (input, how) in &self.seeded {
            let what = how.describe();
            s.push_str(&format!("  input:   {input} not given: seeded {what}\n"));
        }
        for (what, names) in group_ignored(&self.ignored_weights) {
            let more = if names.len() > 1 { ", …" } else { "" };
            s.push_str(&format!(
                "  weights: ignored {} tensor(s) of framework bookkeeping, {what} ({}{more})\n",
                names.len(),
                names[0]
            ));
        }
        for (name, ty, path) in &self.outputs {
            s.push_str(&format!("  output:  {name} {ty} -> {}\n", path.display()));
        }
        if let Some(path) = &self.profile {
            s.push_str(&format!("  profile: {}\n", path.display()));
        }
        s
    }

    /// The same as one JSON object.
    fn json(&self) -> serde_json::Value {
        let (median, best) = self.median_best();
        let seeded: Vec<_> = self
            .seeded
            .iter()
            .map(|(name, how)| {
                serde_json::json!({
                    "input": name,
                    "values": how.describe(),
                    "id_bound": how.id_bound(),
                })
            })
            .collect();
        let outputs: Vec<_> = self
            .outputs
            .iter()
            .map(|(name, ty, path)| serde_json::json!({ "name": name, "type": ty, "path": path }))
            .collect();
        serde_json::json!({ "summary": {
            "model": self.model,
            "threads": self.threads,
            "ranks": self.ranks.as_ref().map(|(n, how)| serde_json::json!({ "ranks": n, "layout": how })),
            "iterations": self.times.len(),
            "median_ms": median * 1e3,
            "best_ms": best * 1e3,
            "flops_per_forward": self.flops,
            "gflops_per_s": self.flops as f64 / median / 1e9,
            "peak": self.peak.as_ref().map(|p| serde_json::json!({
                "gflops_per_s": p.flops_per_s / 1e9,
                "threads": p.threads,
                "isa": p.isa,
                "cpu": p.cpu,
            })),
            "arena_bytes": self.arena_bytes,
            "hoisted_bytes": self.hoisted_bytes,
            "kernel_table": self.kernel_table.as_ref().map(|(path, applied)| {
                serde_json::json!({ "path": path, "applied": applied })
            }),
            "seeded_inputs": seeded,
            "ignored_weights": self
                .ignored_weights
                .iter()
                .map(|(name, what)| serde_json::json!({ "name": name, "what": what }))
                .collect::<Vec<_>>(),
            "outputs": outputs,
            "profile": self.profile,
        }})
    }
}

/// The ignored weights by what they are, in order of first appearance.
fn group_ignored<'a>(ignored: &'a [(String, &'static str)]) -> Vec<(&'static str, Vec<&'a str>)> {
    let mut groups: Vec<(&'static str, Vec<&str>)> = Vec::new();
    for (name, what) in ignored {
        match groups.iter_mut().find(|(w, _)| w == what) {
            Some((_, names)) => names.push(name.as_str()),
            None => groups.push((what, vec![name.as_str()])),
        }
    }
    groups
}

/// Parameters from `--weights`, `--init-seed`, or the weights embedded in the artifact; the
/// framework bookkeeping buffers of the weights left out.
pub(super) fn load_params(
    args: &RunArgs,
    exec: &mut Executor,
    embedded: Option<&[u8]>,
) -> Result<Vec<(String, &'static str)>, Failure> {
    if let Some(path) = &args.weights {
        let file = SafetensorsFile::open(path)
            .map_err(|e| unreadable(format!("cannot read weights: {e}")))?;
        let loaded = exec.load_weights_with(file.tensors(), |t| file.release(t.data));
        return loaded.map_err(|e| {
            Failure::Message(Code::E0601, format!("{}: {}", path.display(), e.message))
        });
    }
    if let Some(seed) = args.init_seed {
        exec.init_params(seed);
        return Ok(Vec::new());
    }
    if let Some(blob) = embedded {
        let st = SafetensorsBytes::parse(blob).map_err(|e| {
            unreadable(format!(
                "the weights embedded in the artifact are corrupt: {e}"
            ))
        })?;
        return exec
            .load_weights(st.tensors())
            .map_err(|e| Failure::Message(Code::E0601, e.message));
    }
    if exec.module().params().next().is_some() {
        return Err(Failure::Usage(
            "the model has parameters: give --weights FILE.safetensors or --init-seed N"
                .to_string(),
        ));
    }
    Ok(Vec::new())
}

/// Warns when a module was planned for another target than this CPU (`cpu` is the host
/// target, `Target::is_host`, the only one this executor is): it runs, with that target's plan.
pub(super) fn warn_if_foreign(module: &Module, reporter: &Reporter) {
    if module.target != "cpu" {
        reporter.emit_plain(
            Code::W0004,
            Severity::Warning,
            &format!(
                "`{}` was built for target `{}`; it runs on this CPU instead, with a plan made for that target",
                module.name, module.target
            ),
        );
    }
}

/// A failed run: a `--check-numerics` fault as its diagnostic (at the op's source when the
/// sources are at hand), a collective that could not complete as E0973, any other error as
/// its message.
pub(super) fn run_failure(e: ExecError, sources: Option<&Sources>, reporter: &Reporter) -> Failure {
    let Some(fault) = &e.fault else {
        return match e.kind {
            // Another rank left (or handed a collective a buffer of another size).
            ExecErrorKind::Collective => Failure::Message(Code::E0973, e.message),
            _ => e.message.into(),
        };
    };
    reporter.emit_numerics(&NumericsReport::of(fault), sources);
    Failure::Reported
}

/// The shape of every input array, by name.
pub(super) fn shapes_of(arrays: &BTreeMap<String, NpyArray>) -> BTreeMap<String, Vec<usize>> {
    arrays
        .iter()
        .map(|(name, a)| (name.clone(), a.shape().to_vec()))
        .collect()
}

/// Checks the source with dims derived from the inputs' shapes (once more with them, when
/// they change any): the checked files and the model's name. The first check's diagnostics
/// are reported when `report` (a ranked run has reported them already).
pub(super) fn check_for_inputs(
    args: &RunArgs,
    shapes: &BTreeMap<String, Vec<usize>>,
    report: bool,
    reporter: &Reporter,
) -> Result<(Checked, String), Failure> {
    let mut options = args.model.check_options();
    let mut checked = check_path(&args.file, &options);
    if report || checked.has_errors() {
        reporter.emit(&checked.diagnostics, &checked.sources);
    }
    if checked.has_errors() {
        return Err(Failure::Reported);
    }
    let model = choose_model(&checked, args.entry.as_deref()).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    let entry = model.name.clone();
    let derived = dims_from_inputs(model, shapes, &options.overrides.dims)?;
    if !derived.is_empty() {
        options.overrides.dims.extend(derived);
        checked = check_path(&args.file, &options);
        if checked.has_errors() {
            reporter.emit(&checked.diagnostics, &checked.sources);
            return Err(Failure::Reported);
        }
    }
    Ok((checked, entry))
}

/// Checks ([`check_for_inputs`]) and compiles the source with the options `mslc build` would
/// use (the `train`'s precision policy and target) for inputs of `shapes` — as one member of
/// a tensor-parallel group when `tensor` is given (E0972 when the model does not split so),
/// reporting the first check's diagnostics when `report`; the module and the files it was compiled from.
pub(super) fn compile_source(
    args: &RunArgs,
    shapes: &BTreeMap<String, Vec<usize>>,
    tensor: Option<TensorSplits>,
    report: bool,
    reporter: &Reporter,
) -> Result<(Module, Sources), Failure> {
    compile_source_stage(args, shapes, tensor, None, report, reporter)
        .map(|(module, sources, _)| (module, sources))
}

/// [`compile_source`], cut to one stage of a pipeline when `stage` is given (E0972 when the
/// model does not cut so); also what the stage receives, sends and outputs.
pub(super) fn compile_source_stage(
    args: &RunArgs,
    shapes: &BTreeMap<String, Vec<usize>>,
    tensor: Option<TensorSplits>,
    stage: Option<(&PipelineLayout, usize)>,
    report: bool,
    reporter: &Reporter,
) -> Result<(Module, Sources, StageCut), Failure> {
    let (checked, entry) = check_for_inputs(args, shapes, report, reporter)?;
    let model = checked
        .model(&entry)
        .ok_or_else(|| format!("model `{entry}` disappeared after setting its dims"))?;
    let selection = Selection {
        precision: args.precision.precision.as_deref(),
        fuse: !args.no_fuse,
        ..Selection::default()
    };
    let mut options = compile_options(&checked, model, selection).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    options.unfused = super::tune_decisions::table_unfused(args.kernels.as_deref());
    let compiled = match stage {
        Some((pipeline, stage)) => compile_stage(model, &options, tensor, pipeline, stage),
        None => compile_rank(model, &options, tensor).map(|c| (c, StageCut::default())),
    };
    let (compiled, cut) = compiled.map_err(|e| {
        let code = match e.stage {
            STAGE_SIZE => Code::E0606,
            STAGE_TENSOR_PARALLEL | STAGE_PIPELINE => Code::E0972,
            _ => Code::E0603,
        };
        Failure::Message(code, format!("cannot compile `{entry}`: {e}"))
    })?;
    Ok((compiled.module, checked.sources, cut))
}
