//! `mslc run ARTIFACT.mir|FILE.msl`: execute a model on this CPU. A `.msl` is checked and
//! compiled in memory for the shapes of the given inputs; weights come from safetensors, the
//! artifact itself, or a seeded init; outputs are written as `.npy`; the median time per
//! forward and the achieved GFLOP/s are printed. Output files are written all or nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mslc_artifact::write::write_all_or_nothing;
use mslc_artifact::{decode, Module};
use mslc_check::{check_path, CheckOptions, Checked};
use mslc_core::diag::{Code, Severity};
use mslc_driver::compile::{compile, CompileOptions};
use mslc_exec::{ExecOptions, Executor};
use mslc_io::npy::{read_npy, NpyArray};
use mslc_io::safetensors::{SafetensorsFile, StDType, TensorRef as StTensor};
use mslc_plan::kernels::KernelTable;

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
    /// Take kernel choices from this table (default for a `.mir`: the `NAME.kernels.toml`
    /// beside it, when it exists), for every step whose op signature it lists.
    #[arg(long, value_name = "FILE.toml")]
    pub kernels: Option<PathBuf>,
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
    let (mut module, embedded) = if is_mir {
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
    let beside = is_mir.then(|| args.file.with_extension("kernels.toml"));
    let table_path = args
        .kernels
        .clone()
        .or_else(|| beside.filter(|p| p.exists()));
    let mut notes = String::new();
    if let Some(path) = table_path {
        let table =
            KernelTable::read(&path).map_err(|e| Failure::Message(e.code(), e.to_string()))?;
        let applied = table.apply(&mut module);
        notes.push_str(&format!("  kernels: {}: {applied}\n", path.display()));
    }
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
        "  memory:  {:.2} MiB arena for the intermediates, {:.2} MiB for hoisted parameter-only values\n",
        exec.arena_bytes() as f64 / (1 << 20) as f64,
        exec.hoisted_bytes() as f64 / (1 << 20) as f64
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
        let st = safetensors::SafeTensors::deserialize(blob).map_err(|e| {
            unreadable(format!(
                "the weights embedded in the artifact are corrupt: {e}"
            ))
        })?;
        let mut tensors = Vec::new();
        for (name, view) in st.tensors() {
            let dtype = st_dtype(view.dtype()).ok_or_else(|| {
                format!(
                    "embedded weight `{name}` has unsupported type {:?}",
                    view.dtype()
                )
            })?;
            tensors.push((name, dtype, view.shape().to_vec(), view.data()));
        }
        let refs = tensors.iter().map(|(name, dtype, shape, data)| StTensor {
            name,
            dtype: *dtype,
            shape,
            data,
        });
        return exec
            .load_weights(refs)
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

fn st_dtype(d: safetensors::Dtype) -> Option<StDType> {
    use safetensors::Dtype;
    Some(match d {
        Dtype::F32 => StDType::F32,
        Dtype::F16 => StDType::F16,
        Dtype::BF16 => StDType::BF16,
        Dtype::F64 => StDType::F64,
        Dtype::I32 => StDType::I32,
        Dtype::I64 => StDType::I64,
        Dtype::BOOL => StDType::Bool,
        _ => return None,
    })
}

/// Checks and compiles the source for the host, with dims derived from the inputs' shapes.
fn compile_source(
    args: &RunArgs,
    arrays: &BTreeMap<String, NpyArray>,
    reporter: &Reporter,
) -> Result<Module, Failure> {
    let mut options = args.model.check_options();
    let checked = check_path(&args.file, &options);
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return Err(Failure::Reported);
    }
    let entry = entry_name(args, &checked)?;
    let derived = derive_dims(&args.file, &options, &entry, &checked, arrays)?;
    if !derived.is_empty() {
        options.overrides.dims.extend(derived);
    }
    let checked = check_path(&args.file, &options);
    if checked.has_errors() {
        reporter.emit(&checked.diagnostics, &checked.sources);
        return Err(Failure::Reported);
    }
    let model = checked
        .model(&entry)
        .ok_or_else(|| format!("model `{entry}` disappeared after setting its dims"))?;
    let target = checked
        .decls
        .target("cpu")
        .map(mslc_driver::target::target_from_spec)
        .ok_or_else(|| "the standard library in use declares no `cpu` target".to_string())?;
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

/// The model to run: `--entry`, or the only model of the file.
fn entry_name(args: &RunArgs, checked: &Checked) -> Result<String, String> {
    let names: Vec<&str> = checked.models.iter().map(|m| m.name.as_str()).collect();
    match (&args.entry, names.as_slice()) {
        (Some(e), _) if names.contains(&e.as_str()) => Ok(e.clone()),
        (Some(e), _) => Err(format!(
            "no model `{e}` in the file (models: {})",
            names.join(", ")
        )),
        (None, [one]) => Ok(one.to_string()),
        (None, []) => Err(format!("`{}` declares no model", args.file.display())),
        (None, _) => Err(format!(
            "`{}` declares several models; pick one with --entry ({})",
            args.file.display(),
            names.join(", ")
        )),
    }
}

/// Dim values implied by the input arrays: each dim not set with `--dim` is probed (checked
/// once more with its value changed) to learn which input positions it sizes, then set to the
/// array's size there.
fn derive_dims(
    file: &Path,
    options: &CheckOptions,
    entry: &str,
    checked: &Checked,
    arrays: &BTreeMap<String, NpyArray>,
) -> Result<Vec<(String, String)>, String> {
    let Some(model) = checked.model(entry) else {
        return Ok(Vec::new());
    };
    let input_shape = |m: &mslc_check::Model, name: &str| {
        m.inputs
            .iter()
            .find(|i| i.name == name)
            .map(|i| m.ty(i.value).shape.clone())
    };
    let mut derived = Vec::new();
    for (dim, value) in &model.dims {
        if options.overrides.dims.contains_key(dim) {
            continue;
        }
        let mut probe = options.clone();
        probe
            .overrides
            .dims
            .insert(dim.clone(), (value + 1).to_string());
        let probed = check_path(file, &probe);
        let Some(pm) = probed.model(entry) else {
            continue;
        };
        let mut found: Option<i64> = None;
        for (name, array) in arrays {
            let (Some(before), Some(after)) = (input_shape(model, name), input_shape(pm, name))
            else {
                continue;
            };
            if before.len() != array.shape().len() || before.len() != after.len() {
                continue;
            }
            for (p, (b, a)) in before.iter().zip(&after).enumerate() {
                if b == a {
                    continue;
                }
                let size = array.shape()[p] as i64;
                match found {
                    Some(f) if f != size => {
                        return Err(format!(
                            "the inputs disagree on dim {dim}: {f} in one place, {size} in another"
                        ))
                    }
                    _ => found = Some(size),
                }
            }
        }
        if let Some(size) = found.filter(|s| s != value) {
            derived.push((dim.clone(), size.to_string()));
        }
    }
    Ok(derived)
}

/// This machine's f32 peak (FACTS.md), used when the standard library is overridden.
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
