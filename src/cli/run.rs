//! `mslc run ARTIFACT.mir|FILE.msl`: execute a model on this CPU. A `.msl` is checked and
//! compiled in memory for the shapes of the given inputs; weights come from safetensors, the
//! artifact itself, or a seeded init; outputs are written as `.npy`; the median time per
//! forward and the achieved GFLOP/s are printed. Output files are written all or nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use mslc_artifact::write::write_all_or_nothing;
use mslc_artifact::{decode, Module};
use mslc_check::check_path;
use mslc_core::diag::{Code, Severity};
use mslc_driver::compile::{compile, CompileOptions};
use mslc_driver::select::{choose_model, choose_target, dims_from_inputs};
use mslc_exec::{ExecOptions, Executor};
use mslc_io::npy::{read_npy, NpyArray};
use mslc_io::safetensors::{SafetensorsBytes, SafetensorsFile};

use super::{parse_key_value, ModelArgs, Reporter};

/// Arguments of `mslc run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// A built artifact (`.mir`) or a model source (`.msl`).
    pub file: PathBuf,
    /// Weights, matched to parameters by path.
    #[arg(long, value_name = "FILE.safetensors")]
    pub weights: Option<PathBuf>,
    /// Initialise parameters from their declared init with this seed instead of loading them
    /// (inputs not given are seeded too).
    #[arg(long, value_name = "N")]
    pub init_seed: Option<u64>,
    /// An input value: `--input tokens=tokens.npy`.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = parse_key_value)]
    pub inputs: Vec<(String, String)>,
    /// Write each output as `DIR/NAME.npy`.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Forward passes to time (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub iterations: usize,
    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Write a Chrome trace of the last forward pass (opens in Perfetto).
    #[arg(long, value_name = "F.json")]
    pub profile: Option<PathBuf>,
    /// Compile a `.msl` without the fusion pass (to compare against the fused graph).
    #[arg(long)]
    pub no_fuse: bool,
    /// The model to run when the source declares several.
    #[arg(long, value_name = "NAME")]
    pub entry: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Runs the command; 1 on any error.
pub fn run(args: &RunArgs, reporter: &Reporter) -> u8 {
    match execute(args, reporter) {
        Ok(report) => {
            super::output::print_stdout(&report);
            0
        }
        Err(Failure::Reported) => 1,
        Err(Failure::Usage(m)) => {
            eprintln!("error: {m}");
            2
        }
        Err(Failure::Message(code, m)) => {
            reporter.emit_plain(code, Severity::Error, &m);
            1
        }
    }
}

/// How `run` failed: diagnostics already printed, a misuse of the flags (exit 2), or one coded
/// message to print.
enum Failure {
    Reported,
    Usage(String),
    Message(Code, String),
}

impl From<String> for Failure {
    /// A failure while running the module.
    fn from(m: String) -> Self {
        Failure::Message(Code::E0603, m)
    }
}

/// A failure to read a file named on the command line.
fn unreadable(m: String) -> Failure {
    Failure::Message(Code::E0602, m)
}

fn execute(args: &RunArgs, reporter: &Reporter) -> Result<String, Failure> {
    if args.iterations == 0 {
        return Err(Failure::Usage(
            "--iterations must be at least 1".to_string(),
        ));
    }
    if args.threads == Some(0) {
        return Err(Failure::Usage("--threads must be at least 1".to_string()));
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
    let mir_bytes;
    let (module, embedded) = if is_mir {
        if !args.model.sets.is_empty() || !args.model.dims.is_empty() {
            return Err(
                "--set and --dim apply to .msl sources; rebuild the .mir with them"
                    .to_string()
                    .into(),
            );
        }
        mir_bytes = std::fs::read(&args.file)
            .map_err(|e| unreadable(format!("cannot read `{}`: {e}", args.file.display())))?;
        let decoded = decode(&mir_bytes)
            .map_err(|e| unreadable(format!("`{}`: {e}", args.file.display())))?;
        (decoded.module, decoded.weights)
    } else {
        (compile_source(args, &arrays, reporter)?, None)
    };
    let options = ExecOptions {
        threads: args.threads.unwrap_or(0),
    };
    let flops = module.flops();
    let name = module.name.clone();
    let mut exec = Executor::new(module, &options).map_err(|e| e.message)?;
    load_params(args, &mut exec, embedded)?;
    for (input, array) in &arrays {
        exec.set_input(input, array).map_err(|e| e.message)?;
    }
    let mut notes = String::new();
    if let Some(seed) = args.init_seed {
        for input in exec.unset_inputs() {
            let bound = exec.seed_input(&input, seed).map_err(|e| e.message)?;
            let what = bound.map_or("N(0, 1) values".to_string(), |b| format!("ids in [0, {b})"));
            notes.push_str(&format!("  input:   {input} not given: seeded {what}\n"));
        }
    }
    let mut times = Vec::with_capacity(args.iterations);
    for _ in 0..args.iterations {
        let start = Instant::now();
        exec.run().map_err(|e| e.message)?;
        times.push(start.elapsed().as_secs_f64());
    }
    let mut report = summary(&name, flops, exec.threads(), &mut times);
    report.push_str(&format!(
        "  memory:  {:.2} MiB arena for every intermediate (one allocation)\n",
        exec.arena_bytes() as f64 / (1 << 20) as f64
    ));
    report.push_str(&notes);
    let mut files = Vec::new();
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
        for (name, v) in &exec.module().outputs {
            let array = exec
                .output_npy(name)
                .ok_or_else(|| format!("output `{name}` cannot be written as .npy"))?;
            let path = dir.join(format!("{name}.npy"));
            let ty = &exec.module().values[*v as usize].ty;
            report.push_str(&format!("  output:  {name} {ty} -> {}\n", path.display()));
            files.push((path, array.to_npy_bytes()));
        }
    }
    if let Some(path) = &args.profile {
        report.push_str(&format!("  profile: {}\n", path.display()));
        files.push((path.clone(), exec.profile_json().into_bytes()));
    }
    write_all_or_nothing(&files).map_err(|(path, e)| {
        Failure::Message(
            Code::E0600,
            format!("cannot write `{}`: {e}", path.display()),
        )
    })?;
    let bad = exec.nonfinite_outputs();
    if !bad.is_empty() {
        reporter.emit_plain(
            Code::W0003,
            Severity::Warning,
            &format!(
                "output(s) {} hold NaN or infinite values",
                bad.iter()
                    .map(|b| format!("`{b}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    Ok(report)
}

/// Parameters from `--weights`, `--init-seed`, or the weights embedded in the artifact.
fn load_params(
    args: &RunArgs,
    exec: &mut Executor,
    embedded: Option<&[u8]>,
) -> Result<(), Failure> {
    if let Some(path) = &args.weights {
        let file = SafetensorsFile::open(path)
            .map_err(|e| unreadable(format!("cannot read weights: {e}")))?;
        return exec.load_weights(file.tensors()).map_err(|e| {
            Failure::Message(Code::E0601, format!("{}: {}", path.display(), e.message))
        });
    }
    if let Some(seed) = args.init_seed {
        exec.init_params(seed);
        return Ok(());
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
    Ok(())
}

/// Checks and compiles the source for the host, with dims derived from the inputs' shapes
/// (checked once more with them, when they change any).
fn compile_source(
    args: &RunArgs,
    arrays: &BTreeMap<String, NpyArray>,
    reporter: &Reporter,
) -> Result<Module, Failure> {
    let mut options = args.model.check_options();
    let mut checked = check_path(&args.file, &options);
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return Err(Failure::Reported);
    }
    let shapes = arrays
        .iter()
        .map(|(name, a)| (name.clone(), a.shape().to_vec()))
        .collect();
    let model = choose_model(&checked, args.entry.as_deref()).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    let entry = model.name.clone();
    let derived = dims_from_inputs(model, &shapes, &options.overrides.dims)?;
    if !derived.is_empty() {
        options.overrides.dims.extend(derived);
        checked = check_path(&args.file, &options);
        if checked.has_errors() {
            reporter.emit(&checked.diagnostics, &checked.sources);
            return Err(Failure::Reported);
        }
    }
    let model = checked
        .model(&entry)
        .ok_or_else(|| format!("model `{entry}` disappeared after setting its dims"))?;
    let target = choose_target(&checked, model, Some("cpu")).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    let compiled = compile(
        model,
        &CompileOptions {
            target,
            verify: false,
            fuse: !args.no_fuse,
            amp: None,
        },
    )
    .map_err(|e| format!("cannot compile `{entry}`: {e}"))?;
    Ok(compiled.module)
}

/// This machine's f32 peak (docs/semantics.md), used when the standard library is overridden.
const HOST_PEAK_F32: f64 = 157e9;

/// The timing lines: median and best time per forward, GFLOP/s and fraction of peak.
fn summary(name: &str, flops: u64, threads: usize, times: &mut [f64]) -> String {
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let peak = mslc_driver::target::standard_target("cpu").map_or(HOST_PEAK_F32, |t| t.peak_f32);
    let rate = flops as f64 / median;
    format!(
        "ran {name} on {threads} thread(s), {} iteration(s)\n  time:    {:.3} ms per forward (median; best {:.3} ms)\n  compute: {:.3} GFLOP per forward, {:.1} GFLOP/s = {:.1}% of the {:.0} GFLOP/s peak\n",
        times.len(),
        median * 1e3,
        times[0] * 1e3,
        flops as f64 / 1e9,
        rate / 1e9,
        100.0 * rate / peak,
        peak / 1e9
    )
}
