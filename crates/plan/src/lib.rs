//! Planning a compiled graph: the schedule, the kernel table, the memory plan, the cost estimate.

pub mod arena;
pub mod cost;
pub mod kernels;
pub mod memory;
pub mod memory_svg;
pub mod parallel;
pub mod schedule;
pub mod target;
