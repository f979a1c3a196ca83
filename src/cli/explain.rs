//! `mslc explain CODE`: the Markdown page of a diagnostic code.

use mslc_core::diag::Code;

/// Arguments of `mslc explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The code, e.g. E0301.
    pub code: String,
}

/// Prints the page; exit 2 for an unknown code.
pub fn run(args: &ExplainArgs) -> u8 {
    match args.code.parse::<Code>() {
        Ok(code) => {
            super::output::print_stdout(code.page());
            0
        }
        Err(()) => {
            eprintln!(
                "error: `{}` is not a diagnostic code; codes look like E0301",
                args.code
            );
            2
        }
    }
}
