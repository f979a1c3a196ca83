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

#[cfg(test)]
mod tests {
    use super::comments;

    #[test]
    fn finds_line_and_block_comments_but_not_inside_strings() {
        let text = "a // one\nshard \"x//y/*z\" = 1 /* two\n */ b //three";
        let found: Vec<&str> = comments(text)
            .iter()
            .map(|c| &text[c.start..c.end])
            .collect();
        assert_eq!(found, ["// one", "/* two\n */", "//three"]);
    }

    #[test]
    fn an_unterminated_comment_or_string_ends_the_scan() {
        assert_eq!(comments("a /* open").len(), 0);
        assert_eq!(comments("\"open // no").len(), 0);
    }
}
