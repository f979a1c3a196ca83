//! The error every registry rule returns.

use std::fmt;

/// Why an op cannot be applied to the given inputs or attributes.
///
/// `input` is the index of the argument at fault, so the type checker can underline it;
/// `help` is an optional suggestion shown under the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub message: String,
    pub input: Option<usize>,
    pub help: Option<String>,
}

impl OpError {
    /// An error about the op as a whole (attributes, arity).
    pub fn new(message: impl Into<String>) -> OpError {
        OpError {
            message: message.into(),
            input: None,
            help: None,
        }
    }

    /// An error about argument `input`.
    pub fn at(input: usize, message: impl Into<String>) -> OpError {
        OpError {
            input: Some(input),
            ..OpError::new(message)
        }
    }

    /// Adds a suggestion.
    pub fn with_help(mut self, help: impl Into<String>) -> OpError {
        self.help = Some(help.into());
        self
    }

    /// Prefixes the message with `context: ` (the op name, the pass name, ...).
    pub fn context(mut self, context: &str) -> OpError {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_displays() {
        let e = OpError::at(1, "bad dim")
            .with_help("reshape it")
            .context("matmul");
        assert_eq!(e.to_string(), "matmul: bad dim");
        assert_eq!(e.input, Some(1));
        assert_eq!(e.help.as_deref(), Some("reshape it"));
        assert_eq!(OpError::new("x").input, None);
    }
}
