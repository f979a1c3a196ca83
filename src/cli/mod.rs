//! The `mslc` command line: argument parsing, dispatch, and how diagnostics reach the terminal.
//! Exit codes: 0 success (warnings allowed), 1 errors in the input, 2 usage errors, 3 a bug in
//! mslc — the highest class of the codes reported ([`mslc_core::diag::Code::exit_class`]).

mod build;
mod build_ranks;
mod check;
mod explain;
mod export;
mod fmt;
mod generate;
mod inspect;
mod output;
mod param_groups;
mod progress;
mod run;
mod run_pipeline;
mod run_ranks;
mod train;
mod tune;
mod tune_decisions;
mod weights;
mod world;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use mslc_core::diag::Severity;

pub use output::Reporter;

/// mslc: check, optimize, plan and run `.msl` models.
#[derive(Parser, Debug)]
#[command(
    name = "mslc",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("MSLC_COMMIT"), ")"),
    about,
    propagate_version = true
)]
pub struct Cli {
    /// How to print diagnostics.
    #[arg(long, global = true, value_enum, default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,
    /// When to colour output (`auto`: when stderr is a terminal and NO_COLOR is unset or empty).
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
    /// Colour when stderr is a terminal and NO_COLOR is unset or empty.
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

/// The precision option of every command that compiles a model (`build`, `run`, `tune`, `train`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PrecisionArg {
    /// Compile with this precision policy instead of the one the model's `train` names (`f32`
    /// for none).
    #[arg(long, value_name = "f32|POLICY")]
    pub precision: Option<String>,
}

/// The usage error of a command given a built `.mir` with flags that only compiling a source
/// can apply; `None` when it has none of them.
pub fn source_only_flags(model: &ModelArgs, precision: &PrecisionArg) -> Option<String> {
    (!model.sets.is_empty() || !model.dims.is_empty() || precision.precision.is_some()).then(|| {
        "--set, --dim and --precision apply to .msl sources; rebuild the .mir with them".to_string()
    })
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
    /// Tune the kernels of a model on this machine: `mslc tune model.msl --budget 60s`.
    Tune(tune::TuneArgs),
    /// Train a model: `mslc train model.msl --init-seed 0 --data data/ --steps 100`.
    Train(train::TrainArgs),
    /// Export a model to another engine: `mslc export jax model.msl -o model.py`.
    Export(export::ExportArgs),
    /// Format files in place, or with `--check` print a diff for each one not formatted.
    Fmt(fmt::FmtArgs),
    /// Print a shell completion script: `mslc completions bash > /etc/bash_completion.d/mslc`.
    Completions(generate::CompletionsArgs),
    /// Print the man page (roff): `mslc man > mslc.1`.
    Man,
    /// Serve the Language Server Protocol on stdin/stdout, for editors.
    Lsp,
}

/// Whether the arguments ask for `--message-format json`, read before (and even when) the
/// command line as a whole fails to parse.
pub fn wants_json(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let mut previous_was_flag = false;
    for arg in args {
        let arg = arg.to_string_lossy();
        if arg == "--" {
            break;
        }
        if arg == "--message-format=json" || (previous_was_flag && arg == "json") {
            return true;
        }
        previous_was_flag = arg == "--message-format";
    }
    false
}

/// Whether to colour diagnostics: `auto` colours a terminal unless `NO_COLOR` is set to a
/// non-empty value (<https://no-color.org>: an empty one does not count).
fn use_color(choice: ColorChoice, no_color: Option<std::ffi::OsString>, terminal: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => terminal && no_color.is_none_or(|v| v.is_empty()),
    }
}

/// Parses the process arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // A usage error is E0609, rendered as every other error is.
            let format = if wants_json(std::env::args_os()) {
                MessageFormat::Json
            } else {
                MessageFormat::Human
            };
            let reporter = Reporter::new(format, false);
            let text = e.render().to_string();
            let message = text.trim().trim_start_matches("error: ");
            reporter.emit_plain(mslc_core::diag::Code::E0609, Severity::Error, message);
            return ExitCode::from(reporter.status());
        }
        Err(e) if wants_json(std::env::args_os()) => {
            // `--help` and `--version` asked for text; as JSON it is one object holding it.
            let json = serde_json::json!({ "help": e.render().to_string() });
            output::print_stdout(&format!("{json}\n"));
            return ExitCode::from(0);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(0);
        }
    };
    let color = use_color(
        cli.color,
        std::env::var_os("NO_COLOR"),
        std::io::stderr().is_terminal(),
    );
    let reporter = Reporter::new(cli.message_format, color);
    let code = match cli.command {
        Command::Check(args) => check::run(&args, &reporter),
        Command::Build(args) => build::run(&args, &reporter),
        Command::Inspect(args) => inspect::run(&args, &reporter),
        Command::Explain(args) => explain::run(&args, &reporter),
        Command::Run(args) => run::run(&args, &reporter),
        Command::Tune(args) => tune::run(&args, &reporter),
        Command::Train(args) => train::run(&args, &reporter),
        Command::Export(args) => export::run(&args, &reporter),
        Command::Fmt(args) => fmt::run(&args, &reporter),
        Command::Completions(args) => generate::completions(&args),
        Command::Man => generate::man(&reporter),
        Command::Lsp => match mslc_lsp::run_stdio() {
            Ok(()) => 0,
            Err(e) => {
                let message = format!("language server: {e}");
                reporter.emit_plain(mslc_core::diag::Code::E0612, Severity::Error, &message);
                1
            }
        },
    };
    // A command's own status (1 for `fmt --check` finding a difference) or its reported
    // codes' (2 for a usage error), whichever is higher.
    ExitCode::from(code.max(reporter.status()))
}

#[cfg(test)]
mod tests {
    use super::{use_color, ColorChoice};

    #[test]
    fn only_a_non_empty_no_color_turns_colour_off() {
        let auto = |v: Option<&str>| use_color(ColorChoice::Auto, v.map(Into::into), true);
        assert!(auto(None));
        assert!(auto(Some("")));
        assert!(!auto(Some("1")));
        assert!(!use_color(ColorChoice::Auto, None, false));
        assert!(use_color(ColorChoice::Always, Some("1".into()), false));
        assert!(!use_color(ColorChoice::Never, None, true));
    }
}
