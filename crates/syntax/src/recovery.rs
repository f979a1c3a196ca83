//! Error recovery for the parser. After a syntax error the file is cut at item boundaries and
//! each piece is parsed alone, so one broken item does not hide the errors of the next; and the
//! delimiters of a broken piece are matched, so a missing `]` is reported as such, with its
//! opening bracket, instead of as whatever the parser expected where it gave up.

use super::ast::Span;
use super::lexical::{memchr, string_end};

/// Words that start an item; one at the start of a line (column 0) starts a new piece.
const ITEM_KEYWORDS: &[&str] = &[
    "import",
    "const",
    "block",
    "model",
    "precision",
    "parallel",
    "memory",
    "train",
    "target",
    "pub",
];

/// The first unbalanced delimiter of a piece of source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelimProblem {
    /// The delimiter at `open` is never closed: the piece ends at `at`, or `at` holds the closer
    /// of an outer delimiter, on a later line.
    Unclosed {
        /// The opening delimiter.
        open: Span,
        /// `(`, `[` or `{`.
        delim: char,
        /// Where it should have been closed at the latest.
        at: usize,
    },
    /// The closer at `close` does not close the innermost open delimiter, at `open`.
    Mismatched {
        /// The wrong closer.
        close: Span,
        /// What it is.
        found: char,
        /// The innermost open delimiter.
        open: Span,
        /// Its opener.
        delim: char,
    },
    /// A closer with no delimiter open.
    Unexpected {
        /// The closer.
        close: Span,
        /// What it is.
        found: char,
    },
}

impl DelimProblem {
    /// The first offset where the parser can have stopped because of this problem: after an
    /// unclosed opener, at or after a wrong closer. A parser error before it is another problem.
    pub fn start(&self) -> usize {
        match self {
            DelimProblem::Unclosed { open, .. } => open.end,
            DelimProblem::Mismatched { close, .. } | DelimProblem::Unexpected { close, .. } => {
                close.start
            }
        }
    }
}

/// The closer of an opening delimiter.
pub fn closer(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

fn opener(close: u8) -> u8 {
    match close {
        b')' => b'(',
        b']' => b'[',
        _ => b'{',
    }
}

/// The byte ranges of the pieces of `text`: a new piece starts at every line that begins with
/// an item keyword followed by a space (outside comments and strings). The pieces cover the
/// whole text, in order.
pub fn pieces(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut starts = vec![0];
    for (i, _) in CodeBytes::new(bytes) {
        if i > 0 && bytes[i - 1] == b'\n' && starts_item(&text[i..]) {
            starts.push(i);
        }
    }
    let ends = starts.iter().skip(1).copied().chain([text.len()]);
    starts.iter().copied().zip(ends).collect()
}

fn starts_item(rest: &str) -> bool {
    ITEM_KEYWORDS.iter().any(|k| {
        rest.strip_prefix(k)
            .is_some_and(|after| after.starts_with([' ', '\t']))
    })
}

/// The first delimiter problem of `text[start..end]`, if any.
pub fn first_problem(text: &str, start: usize, end: usize) -> Option<DelimProblem> {
    let bytes = &text.as_bytes()[..end];
    let mut open: Vec<(usize, u8)> = Vec::new();
    let mut code = CodeBytes::new(bytes);
    code.i = start;
    for (i, b) in code {
        match b {
            b'(' | b'[' | b'{' => open.push((i, b)),
            b')' | b']' | b'}' => match open.last() {
                Some(&(_, o)) if o == opener(b) => {
                    open.pop();
                }
                Some(&(o_at, o)) => {
                    let outer = open.iter().any(|&(_, d)| d == opener(b));
                    let open_span = Span::new(o_at, o_at + 1);
                    return Some(if outer && bytes[o_at..i].contains(&b'\n') {
                        DelimProblem::Unclosed {
                            open: open_span,
                            delim: o as char,
                            at: i,
                        }
                    } else {
                        DelimProblem::Mismatched {
                            close: Span::new(i, i + 1),
                            found: b as char,
                            open: open_span,
                            delim: o as char,
                        }
                    });
                }
                None => {
                    return Some(DelimProblem::Unexpected {
                        close: Span::new(i, i + 1),
                        found: b as char,
                    })
                }
            },
            _ => {}
        }
    }
    open.last().map(|&(o_at, o)| DelimProblem::Unclosed {
        open: Span::new(o_at, o_at + 1),
        delim: o as char,
        at: end,
    })
}

/// The bytes of source code outside comments and strings, with their offsets. The lexical
/// pre-pass has rejected unterminated strings and comments; one that is cut off anyway (at the
/// end of a piece) ends the code.
struct CodeBytes<'a> {
    bytes: &'a [u8],
    i: usize,
}

impl<'a> CodeBytes<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        CodeBytes { bytes, i: 0 }
    }
}

impl Iterator for CodeBytes<'_> {
    type Item = (usize, u8);

    fn next(&mut self) -> Option<(usize, u8)> {
        let bytes = self.bytes;
        while self.i < bytes.len() {
            let i = self.i;
            match bytes[i] {
                b'/' if bytes.get(i + 1) == Some(&b'/') => {
                    self.i = memchr(bytes, i, b'\n').unwrap_or(bytes.len());
                }
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    self.i = bytes[i + 2..]
                        .windows(2)
                        .position(|w| w == b"*/")
                        .map_or(bytes.len(), |p| i + 2 + p + 2);
                }
                b'"' => self.i = string_end(bytes, i).unwrap_or(bytes.len()),
                b => {
                    self.i += 1;
                    return Some((i, b));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_start_at_item_keywords_in_column_zero_outside_comments() {
        let text = "import std.nn.Linear\n/*\nmodel X {\n*/\nmodel M {\n  const a = 1\n}\npub block B() {}\nmodels\n";
        let starts: Vec<&str> = pieces(text)
            .iter()
            .map(|&(s, e)| text[s..e].lines().next().unwrap_or(""))
            .collect();
        assert_eq!(
            starts,
            ["import std.nn.Linear", "model M {", "pub block B() {}"]
        );
    }

    #[test]
    fn a_closer_of_an_outer_delimiter_on_a_later_line_leaves_the_inner_one_unclosed() {
        let text = "model M {\n  input x: f32[4\n  output y = x\n}";
        assert_eq!(
            first_problem(text, 0, text.len()),
            Some(DelimProblem::Unclosed {
                open: Span::new(24, 25),
                delim: '[',
                at: text.len() - 1
            })
        );
    }

    #[test]
    fn a_wrong_closer_on_the_same_line_is_mismatched() {
        let text = "f([1, 2) // ]\n";
        assert_eq!(
            first_problem(text, 0, text.len()),
            Some(DelimProblem::Mismatched {
                close: Span::new(7, 8),
                found: ')',
                open: Span::new(2, 3),
                delim: '['
            })
        );
        let text = "f(x]";
        assert!(matches!(
            first_problem(text, 0, text.len()),
            Some(DelimProblem::Mismatched {
                found: ']',
                delim: '(',
                ..
            })
        ));
    }

    #[test]
    fn unclosed_at_the_end_and_unexpected_closers() {
        let text = "model M { \"}\"";
        assert_eq!(
            first_problem(text, 0, text.len()),
            Some(DelimProblem::Unclosed {
                open: Span::new(8, 9),
                delim: '{',
                at: text.len()
            })
        );
        assert_eq!(
            first_problem("a) b", 0, 4),
            Some(DelimProblem::Unexpected {
                close: Span::new(1, 2),
                found: ')'
            })
        );
        assert_eq!(first_problem("(a) [b] {c}", 0, 11), None);
    }

    /// Brackets left open by 70 broken items add up past the nesting limit; each item is still
    /// reported for its own bracket, and truly deep nesting still is E0002.
    #[test]
    fn brackets_left_open_by_many_items_are_not_nesting() {
        use mslc_core::diag::{Code, FileId};
        let text: String = (0..70)
            .map(|i| format!("model M{i} {{\n  input x: f32[4\n  output y = x\n}}\n"))
            .collect();
        let (_, diags) = crate::parse(FileId(0), &text);
        assert_eq!(diags.len(), 70);
        assert!(diags.iter().all(|d| d.code == Code::E0009), "{diags:?}");
        let deep = format!(
            "model M {{ output y = {}x{} }}",
            "(".repeat(70),
            ")".repeat(70)
        );
        let (_, diags) = crate::parse(FileId(0), &deep);
        assert_eq!(
            diags.iter().map(|d| d.code).collect::<Vec<_>>(),
            [Code::E0002]
        );
    }

    /// A file of 150 broken items reports the first 100 and then E0012 at the 101st, which
    /// keeps reporting (and rendering) bounded whatever the file.
    #[test]
    fn reporting_stops_after_a_hundred_syntax_errors() {
        use mslc_core::diag::{Code, FileId};
        let item = |i: usize| format!("model M{i} {{\n  input x: f32[4\n  output y = x\n}}\n");
        let text: String = (0..150).map(item).collect();
        let (_, diags) = crate::parse(FileId(0), &text);
        assert_eq!(diags.len(), 101);
        assert!(diags[..100].iter().all(|d| d.code == Code::E0009));
        let last = &diags[100];
        assert_eq!(last.code, Code::E0012);
        let stopped_at = (0..100).map(item).collect::<String>().len();
        assert_eq!(last.primary.span, Span::new(stopped_at, stopped_at + 1));
    }

    /// Every closing bracket of an example, deleted in turn: the parser reports a delimiter
    /// error (and nothing else for that item), with spans inside the text.
    #[test]
    fn each_deleted_closer_of_an_example_is_reported_as_a_delimiter_error() {
        use mslc_core::diag::{Code, FileId};
        let text = include_str!("../../../examples/tiny_llama.msl");
        let pieces = pieces(text).len();
        for (i, _) in CodeBytes::new(text.as_bytes()).filter(|(_, b)| b")]}".contains(b)) {
            let broken = format!("{}{}", &text[..i], &text[i + 1..]);
            let (_, diags) = crate::parse(FileId(0), &broken);
            assert!(
                matches!(diags[0].code, Code::E0009 | Code::E0010 | Code::E0011),
                "deleting byte {i}: {diags:?}"
            );
            assert!(diags.len() <= pieces, "deleting byte {i}: {diags:?}");
            for d in &diags {
                let spans = std::iter::once(d.primary.span).chain(d.related.iter().map(|r| r.span));
                assert!(spans
                    .into_iter()
                    .all(|s| s.start <= s.end && s.end <= broken.len()));
            }
        }
    }
}
