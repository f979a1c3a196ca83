//! Helpers for the unit tests of the policy checks: parsing snippets and locating spans.

use mslc_core::diag::FileId;
use mslc_syntax::ast::{DeclItem, Expr, Field, Item, Span};
use mslc_syntax::parse;

/// Every declaration of a snippet that must parse cleanly.
pub(crate) fn decls(src: &str) -> Vec<DeclItem> {
    let (file, diags) = parse(FileId(0), src);
    assert!(diags.is_empty(), "snippet does not parse: {diags:?}");
    file.items
        .into_iter()
        .filter_map(|item| match item {
            Item::Decl(decl) => Some(decl),
            _ => None,
        })
        .collect()
}

/// The only declaration of a snippet.
pub(crate) fn decl(src: &str) -> DeclItem {
    let mut all = decls(src);
    assert_eq!(all.len(), 1, "expected one declaration");
    all.remove(0)
}

/// What [`field_expr`] puts in front of the value it parses.
const FIELD_PREFIX: &str = "memory M { x = ";

/// The expression `src` parsed as a field value; locate its parts with [`field_span`].
pub(crate) fn field_expr(src: &str) -> Expr {
    let decl = decl(&format!("{FIELD_PREFIX}{src} }}"));
    let Some(Field::Assign { value, .. }) = decl.fields.into_iter().next() else {
        panic!("no field")
    };
    value
}

/// The span of the `nth` occurrence of `needle` in a value parsed by [`field_expr`].
pub(crate) fn field_span(src: &str, needle: &str, nth: usize) -> Span {
    let span = span_of(src, needle, nth);
    Span::new(
        span.start + FIELD_PREFIX.len(),
        span.end + FIELD_PREFIX.len(),
    )
}

/// The span of the `nth` (from 0) occurrence of `needle` in `src`.
pub(crate) fn span_of(src: &str, needle: &str, nth: usize) -> Span {
    let start = src
        .match_indices(needle)
        .nth(nth)
        .unwrap_or_else(|| panic!("`{needle}` occurs fewer than {} times", nth + 1))
        .0;
    Span::new(start, start + needle.len())
}
