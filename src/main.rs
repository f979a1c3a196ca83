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
    match worker.map(|h| h.join()) {
        Ok(Ok(code)) => code,
        Ok(Err(_)) => {
            eprintln!("error: internal compiler error (a bug in mslc, not in your input); please report it");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("error: cannot start the compiler thread: {e}");
            ExitCode::from(3)
        }
    }
}
