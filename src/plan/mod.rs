//! Planning a compiled graph: the schedule, the memory plan, the cost estimate.

pub mod arena;
pub mod memory;
