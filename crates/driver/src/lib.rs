//! The mslc pipeline as one call, for every front end alike (the CLI, build scripts, the
//! language server): check a file, choose the entry, target, dims and precision once, lower,
//! optimize and plan — and render what went wrong.

pub mod artifacts;
pub mod compile;
pub mod dep_info;
pub mod host;
pub mod loss_scale;
pub mod numerics;
pub mod parallel;
pub mod pipeline;
pub mod ranks;
pub mod recompute;
pub mod render;
pub mod select;
pub mod snippet;
pub mod stack;
pub mod target;
pub mod train;
pub mod train_mode;
pub mod trainer;
