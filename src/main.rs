//! The `mslc` binary: a thin shell over [`cli`].

mod cli;

use std::process::ExitCode;

use mslc_driver::stack::on_compiler_stack;

fn main() -> ExitCode {
    match on_compiler_stack(cli::main) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(3)
        }
    }
}
