//! Semantic tokens: a small scan of the text for comments, strings, numbers and words, each
//! word classed as a keyword (the grammar's, and the words that start items and statements), a
//! block, a dim of a model, a declaration field, a call, or a plain name.

use lsp_types::{SemanticToken, SemanticTokenType, SemanticTokensLegend};
use mslc_check::modules::ItemRef;

use crate::analysis::Analysis;
use crate::text::Document;

/// The token types, in legend order.
const TYPES: &[SemanticTokenType] = &[
    SemanticTokenType::KEYWORD,
    SemanticTokenType::TYPE,
    SemanticTokenType::TYPE_PARAMETER,
    SemanticTokenType::PROPERTY,
    SemanticTokenType::FUNCTION,
    SemanticTokenType::VARIABLE,
    SemanticTokenType::STRING,
    SemanticTokenType::NUMBER,
    SemanticTokenType::COMMENT,
];

/// Words highlighted as keywords: `grammar/msl.pest`'s `keyword` rule plus the words that
/// introduce items, statements and fields.
const KEYWORDS: &[&str] = &[
    "let",
    "for",
    "in",
    "if",
    "else",
    "return",
    "true",
    "false",
    "pub",
    "import",
    "as",
    "model",
    "block",
    "const",
    "dims",
    "input",
    "output",
    "param",
    "buffer",
    "precision",
    "parallel",
    "memory",
    "train",
    "target",
    "shard",
];

/// The legend announced in the capabilities.
pub fn legend() -> SemanticTokensLegend {
    SemanticTokensLegend {
        token_types: TYPES.to_vec(),
        token_modifiers: Vec::new(),
    }
}

fn type_index(t: &SemanticTokenType) -> u32 {
    TYPES.iter().position(|x| x == t).unwrap_or(0) as u32
}

/// The tokens of `doc`, delta-encoded as the protocol wants.
pub fn tokens(analysis: &Analysis, doc: &Document) -> Vec<SemanticToken> {
    let text = doc.text.as_str();
    let bytes = text.as_bytes();
    let root = &analysis.view.modules.modules[0];
    let fields = analysis.file_index(analysis.root()).map(|ix| &ix.fields);
    let is_dim = |w: &str| {
        analysis
            .view
            .checked
            .models
            .iter()
            .any(|m| m.dims.iter().any(|(n, _)| n == w))
    };
    let mut out = Vec::new();
    let (mut prev_line, mut prev_start) = (0u32, 0u32);
    let mut push = |start: usize, end: usize, ty: &SemanticTokenType| {
        let a = doc.lines.position(text, start);
        let b = doc.lines.position(text, end);
        if a.line != b.line || b.character <= a.character {
            return;
        }
        let delta_start = if a.line == prev_line {
            a.character - prev_start
        } else {
            a.character
        };
        out.push(SemanticToken {
            delta_line: a.line - prev_line,
            delta_start,
            length: b.character - a.character,
            token_type: type_index(ty),
            token_modifiers_bitset: 0,
        });
        (prev_line, prev_start) = (a.line, a.character);
    };
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        if text[i..].starts_with("//") {
            i += text[i..].find('\n').unwrap_or(text.len() - i);
            push(start, i, &SemanticTokenType::COMMENT);
        } else if c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
            push(start, i, &SemanticTokenType::STRING);
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let ty = if c.is_ascii_digit() {
                SemanticTokenType::NUMBER
            } else if KEYWORDS.contains(&word) {
                SemanticTokenType::KEYWORD
            } else if matches!(root.lookup(0, word), Some((_, ItemRef::Block(_)))) {
                SemanticTokenType::TYPE
            } else if is_dim(word) {
                SemanticTokenType::TYPE_PARAMETER
            } else if fields.is_some_and(|f| f.iter().any(|f| f.span.start == start)) {
                SemanticTokenType::PROPERTY
            } else if text[i..].trim_start().starts_with('(') {
                SemanticTokenType::FUNCTION
            } else {
                SemanticTokenType::VARIABLE
            };
            push(start, i, &ty);
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}
