//! mslc: compiler, planner and executor for `.msl` model descriptions.

pub mod artifact;
pub mod check;
pub mod cli;
pub mod diag;
pub mod ir;
pub mod ops;
pub mod passes;
pub mod plan;
pub mod syntax;
