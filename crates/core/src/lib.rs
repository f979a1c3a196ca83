//! What every stage of mslc shares: the op registry (one entry per op), dtypes and tensor
//! types, source spans, diagnostics as values, the checked program the checker hands to the
//! IR, and the mixed-precision choices. Nothing here parses, renders or runs.

pub mod diag;
pub mod ops;
pub mod paths;
pub mod precision;
pub mod program;
pub mod span;
pub mod units;
