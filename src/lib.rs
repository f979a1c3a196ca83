//! mslc: compiler, planner and executor for `.msl` model descriptions.
pub mod kernels;
