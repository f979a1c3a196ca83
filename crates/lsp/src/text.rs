//! Open documents: their text, edited in place by incremental changes, and the conversion
//! between byte offsets (what spans hold) and LSP positions (lines and UTF-16 code units).

use lsp_types::{Position, Range, TextDocumentContentChangeEvent};
use mslc_core::span::Span;

/// Byte offsets of the starts of lines of a text.
#[derive(Clone, Debug, Default)]
pub struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    /// The line starts of `text`.
    pub fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { starts }
    }

    /// The LSP position of a byte offset (clamped to the text, rounded down to a character).
    pub fn position(&self, text: &str, offset: usize) -> Position {
        let offset = mslc_core::diag::source::floor_char_boundary(text, offset.min(text.len()));
        let line = self.starts.partition_point(|&s| s <= offset) - 1;
        let start = self.starts[line];
        let character: usize = text[start..offset].chars().map(char::len_utf16).sum();
        Position::new(line as u32, character as u32)
    }

    /// The byte offset of an LSP position; positions past a line's end or the text's end are
    /// clamped to it, as the protocol asks.
    pub fn offset(&self, text: &str, pos: Position) -> usize {
        let Some(&start) = self.starts.get(pos.line as usize) else {
            return text.len();
        };
        let end = self
            .starts
            .get(pos.line as usize + 1)
            .map_or(text.len(), |&next| next - 1);
        let mut units = 0usize;
        for (i, c) in text[start..end].char_indices() {
            if units >= pos.character as usize {
                return start + i;
            }
            units += c.len_utf16();
        }
        end
    }

    /// The LSP range of a byte span.
    pub fn range(&self, text: &str, span: Span) -> Range {
        Range::new(
            self.position(text, span.start),
            self.position(text, span.end),
        )
    }
}

/// One open document.
#[derive(Clone, Debug)]
pub struct Document {
    /// Full current text.
    pub text: String,
    /// Its line starts.
    pub lines: LineIndex,
    /// The client's version number.
    pub version: i32,
}

impl Document {
    /// A document with this text.
    pub fn new(text: String, version: i32) -> Document {
        Document {
            lines: LineIndex::new(&text),
            text,
            version,
        }
    }

    /// Applies the client's changes in order: a change with a range replaces that range, one
    /// without replaces the whole text.
    pub fn apply(&mut self, changes: Vec<TextDocumentContentChangeEvent>, version: i32) {
        for change in changes {
            match change.range {
                Some(range) => {
                    let start = self.lines.offset(&self.text, range.start);
                    let end = self.lines.offset(&self.text, range.end).max(start);
                    self.text.replace_range(start..end, &change.text);
                }
                None => self.text = change.text,
            }
            self.lines = LineIndex::new(&self.text);
        }
        self.version = version;
    }

    /// The byte offset of a position.
    pub fn offset(&self, pos: Position) -> usize {
        self.lines.offset(&self.text, pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(sl: u32, sc: u32, el: u32, ec: u32, text: &str) -> TextDocumentContentChangeEvent {
        TextDocumentContentChangeEvent {
            range: Some(Range::new(Position::new(sl, sc), Position::new(el, ec))),
            range_length: None,
            text: text.to_string(),
        }
    }

    #[test]
    fn positions_count_utf16_units() {
        let text = "aé😀b\nx";
        let lines = LineIndex::new(text);
        // `😀` is two UTF-16 units and four bytes.
        assert_eq!(lines.offset(text, Position::new(0, 4)), "aé😀".len());
        assert_eq!(lines.position(text, "aé😀".len()), Position::new(0, 4));
        assert_eq!(lines.offset(text, Position::new(0, 99)), "aé😀b".len());
        assert_eq!(lines.offset(text, Position::new(9, 0)), text.len());
        assert_eq!(lines.position(text, text.len()), Position::new(1, 1));
    }

    #[test]
    fn ranged_changes_apply_in_order() {
        let mut doc = Document::new("aé😀b\nxyz\n".to_string(), 1);
        doc.apply(
            vec![
                change(0, 4, 0, 5, "B"),
                change(1, 1, 1, 2, "Y😀"),
                change(0, 2, 0, 4, ""),
            ],
            2,
        );
        assert_eq!(doc.text, "aéB\nxY😀z\n");
        assert_eq!(doc.version, 2);
        doc.apply(
            vec![TextDocumentContentChangeEvent {
                range: None,
                range_length: None,
                text: "new".into(),
            }],
            3,
        );
        assert_eq!(doc.text, "new");
    }
}
