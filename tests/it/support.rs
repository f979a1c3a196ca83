//! Helpers shared by the CLI tests: running the binary and reading the codes of its JSON
//! diagnostics.

use std::process::{Command, Output};

/// Runs the `mslc` binary with `args` on one executor thread.
pub fn mslc(args: &[&str]) -> Output {
    mslc_command(args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("run mslc")
}

/// The command running the `mslc` binary under test with `args`, isolated from the user's
/// environment: no tuning knowledge base of the user's changes what a build chooses.
pub fn mslc_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mslc"));
    command.args(args).env(
        "XDG_CACHE_HOME",
        std::env::temp_dir().join("mslc-tests-no-cache"),
    );
    command
}

/// The codes of the JSON objects on stdout that carry one, in order.
pub fn codes(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["code"].as_str().map(str::to_string))
        .collect()
}
