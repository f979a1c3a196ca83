//! The `mslc` command line: argument parsing, dispatch, and how diagnostics reach the terminal.
//! Exit codes: 0 success (warnings allowed), 1 errors in the input, 2 usage errors.

mod build;
mod check;
mod explain;
mod inspect;
mod output;
mod run;
mod weights;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

pub use output::Reporter;

/// mslc: check, optimize, plan and run `.msl` models.
#[derive(Parser, Debug)]
#[command(name = "mslc", version, about, propagate_version = true)]
pub struct Cli {
    /// How to print diagnostics.
    #[arg(long, global = true, value_enum, default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,
    /// When to colour output (NO_COLOR in the environment also turns it off).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Diagnostic output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MessageFormat {
    /// Rendered reports with source excerpts.
    Human,
    /// One JSON object per line per diagnostic.
    Json,
}

/// Colour choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// Colour when stderr is a terminal and NO_COLOR is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// Options every command that reads a model shares.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// Override a model constant: `--set layers=8`.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub sets: Vec<(String, String)>,
    /// Override a model dim: `--dim S=512`.
    #[arg(long = "dim", value_name = "NAME=N", value_parser = parse_key_value)]
    pub dims: Vec<(String, String)>,
    /// Read `std.*` from this folder instead of the built-in standard library.
    #[arg(long, value_name = "DIR")]
    pub stdlib: Option<PathBuf>,
}

impl ModelArgs {
    /// The checker options these arguments mean.
    pub fn check_options(&self) -> mslc_check::CheckOptions {
        mslc_check::CheckOptions {
            stdlib_dir: self.stdlib.clone(),
            overrides: mslc_check::Overrides {
                sets: self.sets.iter().cloned().collect(),
                dims: self.dims.iter().cloned().collect(),
            },
        }
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
            Ok((k.trim().to_string(), v.trim().to_string()))
        }
        _ => Err(format!("expected NAME=VALUE, found `{s}`")),
    }
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check files and report every problem.
    Check(check::CheckArgs),
    /// Compile a model and write its artifacts.
    Build(build::BuildArgs),
    /// Print a compiled `.mir` module as text.
    Inspect(inspect::InspectArgs),
    /// Explain a diagnostic code, e.g. `mslc explain E0301`.
    Explain(explain::ExplainArgs),
    /// Run a model on this CPU: `mslc run model.msl --init-seed 1 --iterations 20`.
    Run(run::RunArgs),
    /// Serve the Language Server Protocol on stdin/stdout, for editors.
    Lsp,
}

/// Parses the process arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let color = match cli.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
        }
    };
    let reporter = Reporter {
        format: cli.message_format,
        color,
    };
    let code = match cli.command {
        Command::Check(args) => check::run(&args, &reporter),
        Command::Build(args) => build::run(&args, &reporter),
        Command::Inspect(args) => inspect::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Run(args) => run::run(&args, &reporter),
        Command::Lsp => match mslc_lsp::run_stdio() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: language server: {e}");
                1
            }
        },
    };
    ExitCode::from(code)
}
