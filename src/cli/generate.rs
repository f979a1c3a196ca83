//! `mslc completions SHELL` and `mslc man`: shell completions and a man page, both generated
//! from the command-line definition, so they list exactly the commands and options there are.

use clap::CommandFactory;

use mslc_core::diag::{Code, Severity};

use super::output::print_stdout;
use super::{Cli, Reporter};

/// Arguments of `mslc completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Prints the completion script for the shell to stdout.
pub fn completions(args: &CompletionsArgs) -> u8 {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "mslc", &mut out);
    print_stdout(&String::from_utf8_lossy(&out));
    0
}

/// Prints the man page (roff) to stdout; rendering into memory failing is a bug (E0608).
pub fn man(reporter: &Reporter) -> u8 {
    let mut out = Vec::new();
    match clap_mangen::Man::new(Cli::command()).render(&mut out) {
        Ok(()) => {
            print_stdout(&String::from_utf8_lossy(&out));
            0
        }
        Err(e) => {
            let message = format!("internal error: cannot render the man page: {e}");
            reporter.emit_plain(Code::E0608, Severity::Error, &message);
            1
        }
    }
}
