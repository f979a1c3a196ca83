//! The one error type every kernel returns.

use std::fmt;

/// A kernel refused its arguments: wrong lengths, incompatible shapes, an attribute out of range,
/// an index outside a table. Kernels never panic on such input; they return this instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelError {
    /// The op (or helper) that refused, e.g. `"matmul"`.
    pub op: &'static str,
    /// What was wrong, in words a user can act on.
    pub message: String,
}

impl KernelError {
    /// Builds an error for `op` with a message.
    pub fn new(op: &'static str, message: impl Into<String>) -> Self {
        Self {
            op,
            message: message.into(),
        }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for KernelError {}

/// Result of a kernel call.
pub type KernelResult<T> = Result<T, KernelError>;
