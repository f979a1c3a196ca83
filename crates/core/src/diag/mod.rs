//! Diagnostics as values: what every stage reports to the user, with a code, spans and help.
//! Rendering (human via miette, or JSON lines) lives in the driver; the code registry in [`codes`].

pub mod codes;
pub mod source;

pub use codes::{Code, ExitClass};
pub use source::{FileId, SourceFile, Sources};

use crate::span::Span;

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Compilation fails.
    Error,
    /// Worth reading; compilation goes on.
    Warning,
}

/// A span in a particular file with a message.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    /// The file the span is in.
    pub file: FileId,
    /// The bytes it points at.
    pub span: Span,
    /// What to say there.
    pub message: String,
}

/// One problem found in the user's input.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// Registry code, e.g. `E0001`.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// One-line statement of the problem.
    pub message: String,
    /// Where the problem is.
    pub primary: Label,
    /// Related places ("defined here", "expected because of this").
    pub related: Vec<Label>,
    /// How to fix it, where that can be said.
    pub help: Option<String>,
}

impl Diagnostic {
    /// An error at `span` of `file`; the primary label's text defaults to empty.
    pub fn error(code: Code, file: FileId, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            primary: Label {
                file,
                span,
                message: String::new(),
            },
            related: Vec::new(),
            help: None,
        }
    }

    /// A warning at `span` of `file`.
    pub fn warning(code: Code, file: FileId, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, file, span, message)
        }
    }

    /// Sets the text under the primary span.
    pub fn with_label(mut self, message: impl Into<String>) -> Self {
        self.primary.message = message.into();
        self
    }

    /// Adds a related span.
    pub fn with_related(mut self, file: FileId, span: Span, message: impl Into<String>) -> Self {
        self.related.push(Label {
            file,
            span,
            message: message.into(),
        });
        self
    }

    /// Adds a help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Whether this stops compilation.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Whether any diagnostic in the list is an error.
pub fn has_errors(diags: &[Diagnostic]) -> bool {
    diags.iter().any(Diagnostic::is_error)
}
