//! The `mslc` binary: a thin shell over [`cli`].

mod cli;

use std::process::ExitCode;

/// Stack for the compiler thread: deep (but bounded) nesting in user sources is checked
/// recursively, so give it room instead of trusting the platform default.
const STACK_BYTES: usize = 256 * 1024 * 1024;

fn main() -> ExitCode {
    let worker = std::thread::Builder::new()
        .stack_size(STACK_BYTES)
        .spawn(cli::main);
    let failure = match worker.map(|h| h.join()) {
        Ok(Ok(code)) => return code,
        Ok(Err(payload)) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            format!("internal compiler error (a bug in mslc, not in your input): {what}; please report it")
        }
        Err(e) => format!("internal compiler error: cannot start the compiler thread: {e}"),
    };
    let format = if cli::wants_json(std::env::args_os()) {
        cli::MessageFormat::Json
    } else {
        cli::MessageFormat::Human
    };
    let reporter = cli::Reporter {
        format,
        color: false,
    };
    reporter.emit_plain(
        mslc_core::diag::Code::E0608,
        mslc_core::diag::Severity::Error,
        &failure,
    );
    ExitCode::from(3)
}
