//! The executor's one error type: what went wrong, said so a user can act on it.

use std::fmt;

use crate::numerics::NumericsFault;

/// Which stage of running a module failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecErrorKind {
    /// The module itself is inconsistent (a crafted or corrupted artifact).
    Module,
    /// Weights are missing, extra, or do not match the parameters.
    Weights,
    /// An input is missing, unknown, or has the wrong shape or dtype.
    Input,
    /// A kernel refused its operands at run time (an out-of-range id, for one).
    Kernel,
    /// The thread pool could not be built.
    Threads,
    /// Running would need more memory than may be used.
    Memory,
    /// The executor disagrees with the module's plan (a bug in mslc, not in the module).
    Internal,
    /// A step produced a NaN or an infinity (checked only when asked: `check_numerics`).
    Numerics,
    /// A collective could not complete: a peer left, or members disagreed on sizes.
    Collective,
}

/// Why a module could not be set up or run.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecError {
    /// The stage that failed.
    pub kind: ExecErrorKind,
    /// What was wrong; may span several lines when several problems are reported together.
    pub message: String,
    /// For [`ExecErrorKind::Numerics`]: the step, its operands' ranges and where it was written.
    pub fault: Option<Box<NumericsFault>>,
}

impl ExecError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ExecErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            fault: None,
        }
    }

    /// The error of a run stopped by `check_numerics` at `fault`.
    pub fn numerics(fault: NumericsFault) -> Self {
        Self {
            kind: ExecErrorKind::Numerics,
            message: fault.to_string(),
            fault: Some(Box::new(fault)),
        }
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExecError {}

/// Result of an executor operation.
pub type ExecResult<T> = Result<T, ExecError>;
