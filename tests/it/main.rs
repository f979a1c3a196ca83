//! The integration tests, in one test binary (one link instead of one per file): the CLI,
//! UI snapshots, pass snapshots, the executor against references, and robustness. The
//! allocation-counting test stays its own binary (`tests/exec_alloc.rs`), since a global
//! allocator is process-wide.

mod build;
mod build_script;
mod cargo_mslc;
#[path = "../shared/checkpoints.rs"]
mod checkpoints;
mod cli_check;
mod exec;
mod exit_status;
mod export;
mod fmt;
mod fuzz_replay;
mod grad;
mod hardening;
mod hostile_front;
mod layering;
mod lints;
mod lsp;
mod param_counts;
mod passes;
mod pictures;
mod pipeline;
mod plan;
mod plan_measured;
mod ranks;
mod readable;
mod readme;
mod recompute;
mod robustness;
mod round_trip;
mod support;
#[path = "../shared/tolerance.rs"]
mod tolerance;
mod train;
mod train_amp;
mod train_mode;
mod ui;
