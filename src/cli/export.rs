//! `mslc export jax FILE.msl -o model.py`: write the model (its forward, its train's step and
//! the declared sharding) as a self-contained Python program on JAX (docs/export-jax.md).

use std::path::PathBuf;

use mslc_check::check_path;
use mslc_core::diag::Code;
use mslc_export::{export_jax, Request};

use super::output::Failure;
use super::{ModelArgs, PrecisionArg, Reporter};

/// Arguments of `mslc export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The engine to export for.
    #[command(subcommand)]
    pub engine: Engine,
}

/// The engines a model exports to.
#[derive(clap::Subcommand, Debug)]
pub enum Engine {
    /// A Python program on JAX: `python model.py --weights W.safetensors --input NAME=X.npy`.
    Jax(JaxArgs),
}

/// Arguments of `mslc export jax`.
#[derive(clap::Args, Debug)]
pub struct JaxArgs {
    /// The model source.
    pub file: PathBuf,
    /// The model, or the train (with its model), to export when the source declares several.
    #[arg(long, value_name = "NAME")]
    pub entry: Option<String>,
    /// Where to write the program.
    #[arg(short = 'o', long = "output", value_name = "model.py")]
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub precision: PrecisionArg,
}

/// Runs the command; 1 on errors in the input, 2 on misused flags.
pub fn run(args: &ExportArgs, reporter: &Reporter) -> u8 {
    match &args.engine {
        Engine::Jax(args) => reporter.finish(jax(args, reporter)),
    }
}

fn jax(args: &JaxArgs, reporter: &Reporter) -> Result<(String, serde_json::Value), Failure> {
    let checked = check_path(&args.file, &args.model.check_options());
    reporter.emit(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        return Err(Failure::Reported);
    }
    let recheck = |dim: &str, size: i64| {
        let mut options = args.model.check_options();
        options
            .overrides
            .dims
            .insert(dim.to_string(), size.to_string());
        check_path(&args.file, &options)
    };
    let request = Request {
        entry: args.entry.as_deref(),
        precision: args.precision.precision.as_deref(),
        recheck: Some(&recheck),
    };
    let exported = export_jax(&checked, &request).map_err(|d| {
        reporter.emit(&[*d], &checked.sources);
        Failure::Reported
    })?;
    reporter.emit(&exported.warnings, &checked.sources);
    mslc_io::atomic::write_atomic(&args.output, |p| std::fs::write(p, &exported.program)).map_err(
        |e: std::io::Error| {
            Failure::Message(
                Code::E0600,
                format!("cannot write `{}`: {e}", args.output.display()),
            )
        },
    )?;
    let mut text = format!(
        "exported {} ({} ops) to {}\n",
        exported.model,
        exported.ops,
        args.output.display()
    );
    if let Some(t) = &exported.train {
        text.push_str(&format!(
            "  train:   {t} (python {} --train --data …)\n",
            args.output.display()
        ));
    }
    if let Some(p) = &exported.parallel {
        text.push_str(&format!(
            "  mesh:    {p} (shardings from {})\n",
            if exported.planned {
                "the per-device plan"
            } else {
                "the declaration"
            }
        ));
    }
    if let Some(p) = &exported.pipeline {
        text.push_str(&format!(
            "  pipeline: {p} (GSPMD: layers stacked by stage, collective-permutes between stages)\n"
        ));
    }
    let json = serde_json::json!({
        "model": exported.model,
        "ops": exported.ops,
        "train": exported.train,
        "parallel": exported.parallel,
        "pipeline": exported.pipeline,
        "written": args.output,
    });
    Ok((text, json))
}
