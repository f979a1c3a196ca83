//! The formatter behind `mslc fmt` (and a language server's formatting request): source text in,
//! canonical source text out, comments kept. Idempotent: formatting formatted text changes
//! nothing. Lines break at [`WIDTH`] columns: a bracketed group that would cross it gets one
//! element per line, each followed by a comma.

pub use super::print::WIDTH;

use super::{parse, print, trivia};
use mslc_core::diag::{Diagnostic, FileId, Severity};

/// Formats the text of one file. A file that does not parse is not formatted: the parser's
/// diagnostics come back instead (`file` is the id they point into).
pub fn format_source(file: FileId, text: &str) -> Result<String, Vec<Diagnostic>> {
    let (tree, diagnostics) = parse(file, text);
    if diagnostics.iter().any(|d| d.severity == Severity::Error) {
        return Err(diagnostics);
    }
    Ok(print::layout(&tree, text, &trivia::comments(text)))
}
