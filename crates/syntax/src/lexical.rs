//! A pre-pass over the raw text that catches what would make the parser misbehave or report
//! badly: unterminated strings and comments, nesting deep enough to exhaust the stack, and line
//! breaks the grammar does not see.

use super::ast::Span;

/// Deepest bracket nesting accepted; real models stay far below it.
pub const MAX_NESTING: usize = 64;

/// A problem found before parsing.
#[derive(Clone, Debug, PartialEq)]
pub enum LexProblem {
    /// A `"` with no closing quote on its line.
    UnterminatedString(Span),
    /// A `/*` with no `*/`.
    UnterminatedComment(Span),
    /// Brackets nested deeper than [`MAX_NESTING`]; the span is the opening bracket too many.
    TooDeep(Span),
    /// A line break other than `\n` or `\r\n` (a lone `\r`, U+0085, U+2028, U+2029): editors
    /// show a new line where the grammar sees none, so a `//` comment would run on unseen.
    LineBreak(Span, char),
}

/// Scans `text` once and reports the first problem, if any.
pub fn scan(text: &str) -> Option<LexProblem> {
    if let Some((i, c)) = text.char_indices().find(|&(i, c)| {
        matches!(c, '\u{85}' | '\u{2028}' | '\u{2029}')
            || (c == '\r' && !text[i + 1..].starts_with('\n'))
    }) {
        return Some(LexProblem::LineBreak(Span::new(i, i + c.len_utf8()), c));
    }
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = memchr(bytes, i, b'\n').unwrap_or(bytes.len());
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => match text[i + 2..].find("*/") {
                Some(end) => i += end + 4,
                None => return Some(LexProblem::UnterminatedComment(Span::new(i, i + 2))),
            },
            b'"' => match string_end(bytes, i) {
                Some(end) => i = end,
                None => {
                    let line_end = memchr(bytes, i, b'\n').unwrap_or(bytes.len());
                    return Some(LexProblem::UnterminatedString(Span::new(i, line_end)));
                }
            },
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(LexProblem::TooDeep(Span::new(i, i + 1)));
                }
                i += 1;
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// Index just past the closing quote of the string starting at `start`; `None` when the line
/// (or the file) ends first.
pub(crate) fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            b'\n' => break,
            _ => i += 1,
        }
    }
    None
}

pub(crate) fn memchr(bytes: &[u8], from: usize, needle: u8) -> Option<usize> {
    bytes[from..]
        .iter()
        .position(|&b| b == needle)
        .map(|p| from + p)
}
