//! mslc: compiler, planner and executor for `.msl` model descriptions.

pub mod artifact;
pub mod check;
pub mod cli;
pub mod compile;
pub mod diag;
pub mod exec;
pub mod io;
pub mod ir;
pub mod kernels;
pub mod ops;
pub mod passes;
pub mod plan;
pub mod syntax;
