//! Checking the policy declarations of a `.msl` file — `precision`, `parallel`, `memory`,
//! `train` and `target` — into typed settings with MindSpore's semantics and defaults. Every
//! check collects all its diagnostics; the returned values hold defaults where a field was
//! missing or invalid, so they are meaningful only when no error was reported.

mod args;
mod fields;
mod parallel;
mod pattern;
mod precision;
mod report;
mod shard;
mod suggest;
#[cfg(test)]
mod testing;
mod value;

pub use parallel::{
    check_parallel, OptimizerShard, ParallelMode, ParallelPolicy, Pipeline, PipelineSchedule,
};
pub use pattern::{pattern_matches, PatternError, ShardPattern};
pub use precision::{check_precision, AmpLevel, LossScale, LowPrecision, PrecisionPolicy};
pub use shard::{check_shards_against_params, ShardRule};
