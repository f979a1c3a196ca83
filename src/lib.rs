//! mslc: compiler, planner and executor for `.msl` model descriptions.

pub mod check;
pub mod diag;
pub mod syntax;
