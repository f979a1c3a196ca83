//! Comments, the trivia the grammar skips: found again by one scan of the text so the formatter
//! can keep them where they stood.

use super::ast::Span;
use super::lexical::{memchr, string_end};

/// The spans of every `// …` and `/* … */` comment in `text`, in order. A line comment's span
/// stops before its newline. Strings are skipped, so `"//"` is not a comment; an unterminated
/// string or comment ends the scan (the parser reports it).
pub fn comments(text: &str) -> Vec<Span> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let end = memchr(bytes, i, b'\n').unwrap_or(bytes.len());
                found.push(Span::new(i, end));
                i = end;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => match text[i + 2..].find("*/") {
                Some(len) => {
                    found.push(Span::new(i, i + len + 4));
                    i += len + 4;
                }
                None => break,
            },
            b'"' => match string_end(bytes, i) {
                Some(end) => i = end,
                None => break,
            },
            _ => i += 1,
        }
    }
    found
}
