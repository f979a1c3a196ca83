//! Semantic checks on the syntax tree: every check collects all its diagnostics, never stopping
//! at the first.

pub mod policy;
