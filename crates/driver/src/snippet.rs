//! Making untrusted text safe to show: source quoted in a report and strings taken from a file
//! (names, literals, paths) may hold terminal escape sequences, bidirectional overrides or lines
//! hundreds of thousands of columns wide. Escapes would let a file retitle or clear the terminal
//! of whoever checks it; miette panics on a line past display column 65,535.

use std::borrow::Cow;

/// Widest line (in display columns, roughly) quoted as is; a wider one is clipped around the
/// first label on it.
pub const MAX_LINE_COLUMNS: usize = 160;
/// Columns kept before the first label on a clipped line.
const CONTEXT_COLUMNS: usize = 40;
/// Marks the clipped part of a line.
const ELLIPSIS: &str = "…";

/// Whether a character must not reach a terminal raw: control characters (C0 and C1, DEL),
/// bidirectional overrides and isolates, and the Unicode line and paragraph separators.
pub fn is_hazard(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Escapes hazardous characters of a message, name or path as `\u{1b}`; line feeds stay.
pub fn escape(text: &str) -> Cow<'_, str> {
    let escaped = |c: char| c != '\n' && is_hazard(c);
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A visible stand-in for a hazardous character in quoted source: the Unicode control picture
/// for C0 and DEL (`␛`, `␇`), the replacement character otherwise.
fn picture(c: char) -> char {
    match c as u32 {
        n @ 0..=0x1f => char::from_u32(0x2400 + n).unwrap_or('\u{fffd}'),
        0x7f => '\u{2421}',
        _ => '\u{fffd}',
    }
}

/// A source text prepared for quoting, with the map from original byte offsets to its own.
#[derive(Debug)]
pub struct Snippet {
    /// The text to hand to the renderer.
    pub text: String,
    /// Pieces copied from the original: (original start, original end, start in `text`),
    /// in order.
    pieces: Vec<(usize, usize, usize)>,
}

impl Snippet {
    /// Prepares `source` for quoting; `points` are the byte offsets labels start and end at,
    /// which a clipped line keeps in view.
    pub fn new(source: &str, points: &[usize]) -> Snippet {
        let mut snippet = Snippet {
            text: String::with_capacity(source.len().min(1 << 20)),
            pieces: Vec::new(),
        };
        let mut start = 0;
        while start < source.len() {
            let end = source[start..]
                .find('\n')
                .map_or(source.len(), |i| start + i + 1);
            snippet.line(source, start, end, points);
            start = end;
        }
        snippet
    }

    fn line(&mut self, source: &str, start: usize, end: usize, points: &[usize]) {
        let line = &source[start..end];
        if line.len() <= MAX_LINE_COLUMNS / 4 || columns(line.chars()) <= MAX_LINE_COLUMNS {
            return self.copy(source, start, end);
        }
        let first = points
            .iter()
            .copied()
            .filter(|p| (start..end).contains(p))
            .min()
            .map_or(start, |p| floor(source, p));
        let from = first - width_within(source[start..first].chars().rev(), CONTEXT_COLUMNS);
        let to = from + width_within(source[from..end].chars(), MAX_LINE_COLUMNS);
        if from > start {
            self.text.push_str(ELLIPSIS);
        }
        self.copy(source, from, to);
        if to < end {
            self.text.push_str(ELLIPSIS);
            if source[..end].ends_with('\n') {
                self.copy(source, end - 1, end);
            }
        }
    }

    /// Copies `source[from..to]`, replacing hazardous characters by visible stand-ins.
    fn copy(&mut self, source: &str, from: usize, to: usize) {
        let mut run = from;
        for (i, c) in source[from..to].char_indices() {
            let at = from + i;
            let keep = !is_hazard(c)
                || matches!(c, '\n' | '\t')
                || (c == '\r' && source[at + 1..].starts_with('\n'));
            if keep {
                continue;
            }
            self.piece(source, run, at);
            self.pieces.push((at, at + c.len_utf8(), self.text.len()));
            self.text.push(picture(c));
            run = at + c.len_utf8();
        }
        self.piece(source, run, to);
    }

    fn piece(&mut self, source: &str, from: usize, to: usize) {
        if from < to {
            self.pieces.push((from, to, self.text.len()));
            self.text.push_str(&source[from..to]);
        }
    }

    /// Where an original byte offset lies in [`Snippet::text`]: an offset in a clipped part
    /// moves to the nearest kept piece before it (or the start).
    pub fn map(&self, offset: usize) -> usize {
        let i = self
            .pieces
            .partition_point(|&(start, _, _)| start <= offset);
        let Some(&(start, end, at)) = i.checked_sub(1).and_then(|i| self.pieces.get(i)) else {
            return 0;
        };
        let mapped = at + offset.min(end) - start;
        floor(&self.text, mapped.min(self.text.len()))
    }
}

/// Display columns of some text, roughly: a tab takes 4, a non-ASCII character 2.
fn columns(chars: impl Iterator<Item = char>) -> usize {
    chars.map(column_width).sum()
}

fn column_width(c: char) -> usize {
    match c {
        '\t' => 4,
        c if c.is_ascii() => 1,
        _ => 2,
    }
}

/// Bytes of the longest prefix of `chars` that fits in `budget` columns.
fn width_within(chars: impl Iterator<Item = char>, budget: usize) -> usize {
    let mut used = 0;
    let mut bytes = 0;
    for c in chars {
        used += column_width(c);
        if used > budget {
            break;
        }
        bytes += c.len_utf8();
    }
    bytes
}

fn floor(text: &str, offset: usize) -> usize {
    mslc_core::diag::source::floor_char_boundary(text, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_control_and_bidi_characters() {
        assert_eq!(escape("a\u{1b}]0;x\u{7}b"), "a\\u{1b}]0;x\\u{7}b");
        assert_eq!(escape("x\u{202e}y\u{9b}"), "x\\u{202e}y\\u{9b}");
        assert!(matches!(escape("plain `text` 中\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn short_lines_keep_their_offsets() {
        let s = Snippet::new("ab\r\ncd\n", &[4]);
        assert_eq!(s.text, "ab\r\ncd\n");
        assert_eq!(s.map(4), 4);
    }

    #[test]
    fn hazards_become_pictures_and_offsets_follow() {
        let s = Snippet::new("a\u{1b}b\rc", &[]);
        assert_eq!(s.text, "a\u{241b}b\u{240d}c");
        assert_eq!(&s.text[s.map(2)..], "b\u{240d}c");
        assert_eq!(&s.text[s.map(4)..], "c");
    }

    #[test]
    fn long_lines_are_clipped_around_the_label() {
        let line = format!(
            "{}target{}\nnext\n",
            "\t".repeat(70_000),
            "中".repeat(40_000)
        );
        let at = 70_000;
        let s = Snippet::new(&line, &[at, at + 6]);
        assert!(columns(s.text.chars()) < 2 * MAX_LINE_COLUMNS);
        assert!(s.text.starts_with(ELLIPSIS));
        assert_eq!(&s.text[s.map(at)..s.map(at + 6)], "target");
        assert!(s.text.ends_with("…\nnext\n"));
        assert_eq!(&s.text[s.map(line.len() - 5)..], "next\n");
    }
}
