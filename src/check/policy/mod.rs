//! Checking the policy declarations of a `.msl` file — `precision`, `parallel`, `memory`,
//! `train` and `target` — into typed settings with MindSpore's semantics and defaults. Every
//! check collects all its diagnostics; the returned values hold defaults where a field was
//! missing or invalid, so they are meaningful only when no error was reported.

mod args;
mod fields;
mod memory;
mod optimizer;
mod parallel;
mod pattern;
mod precision;
mod report;
mod shard;
mod suggest;
mod target;
#[cfg(test)]
mod testing;
mod train;
mod value;

pub use memory::{check_memory, MemoryPolicy, Recompute};
pub use optimizer::{Optimizer, OptimizerKind};
pub use parallel::{
    check_parallel, OptimizerShard, ParallelMode, ParallelPolicy, Pipeline, PipelineSchedule,
};
pub use pattern::{pattern_matches, PatternError, ShardPattern};
pub use precision::{check_precision, AmpLevel, LossScale, LowPrecision, PrecisionPolicy};
pub use shard::{check_shards_against_params, ShardRule};
pub use target::{check_target, PeakFlops, TargetSpec};
pub use train::{check_train, check_train_against, unknown_reference, TrainSpec};
