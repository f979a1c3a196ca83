//! The `mslc` binary: a thin shell over [`cli`].

mod cli;

use std::process::ExitCode;

use mslc_driver::stack::on_compiler_stack;

fn main() -> ExitCode {
    mslc_exec::limits::return_large_blocks();
    // Tests of a build with the cargo feature `failpoints` configure its fail points here.
    #[cfg(feature = "failpoints")]
    let _fail_points = fail::FailScenario::setup();
    let failure = match on_compiler_stack(cli::main) {
        Ok(code) => return code,
        Err(e) => e.to_string(),
    };
    let format = if cli::wants_json(std::env::args_os()) {
        cli::MessageFormat::Json
    } else {
        cli::MessageFormat::Human
    };
    let reporter = cli::Reporter::new(format, false);
    reporter.emit_plain(
        mslc_core::diag::Code::E0608,
        mslc_core::diag::Severity::Error,
        &failure,
    );
    ExitCode::from(reporter.status())
}
