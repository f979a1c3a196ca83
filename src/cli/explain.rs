//! `mslc explain CODE`: the Markdown page of a diagnostic code.

use mslc_core::diag::{Code, Severity};

use super::Reporter;

/// Arguments of `mslc explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The code, e.g. E0301.
    pub code: String,
}

/// Prints the page; exit 2 for an unknown code.
pub fn run(args: &ExplainArgs, reporter: &Reporter) -> u8 {
    match args.code.parse::<Code>() {
        Ok(code) => {
            let json = serde_json::json!({
                "explain": { "code": code.as_str(), "title": code.title(), "page": code.page() }
            });
            reporter.result(code.page(), json);
            0
        }
        Err(()) => {
            reporter.emit_plain(
                Code::E0609,
                Severity::Error,
                &format!(
                    "`{}` is not a diagnostic code; codes look like E0301",
                    args.code
                ),
            );
            2
        }
    }
}
