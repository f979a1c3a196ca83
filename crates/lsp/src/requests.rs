//! Answers to requests on a checked document, and diagnostics in LSP form.

use std::str::FromStr;

use lsp_server::Request;
use lsp_types::{
    CodeDescription, CompletionParams, DiagnosticRelatedInformation, DiagnosticSeverity,
    DiagnosticTag, DocumentSymbol, GotoDefinitionParams, Hover, HoverContents, HoverParams,
    InlayHint, InlayHintKind, InlayHintLabel, Location, MarkupContent, MarkupKind, NumberOrString,
    ReferenceParams, SemanticTokens, TextEdit, Uri,
};
use mslc_core::diag::{FileId, Severity};
use mslc_syntax::ast::Span;
use serde_json::Value;

use crate::analysis::{show_type, Analysis, Place};
use crate::index::Outline;
use crate::text::{Document, LineIndex};
use crate::{complete, fields, tokens, CODE_DOCS_BASE};

/// The requests [`answer`] handles.
const METHODS: &[&str] = &[
    "textDocument/hover",
    "textDocument/definition",
    "textDocument/references",
    "textDocument/completion",
    "textDocument/documentSymbol",
    "textDocument/inlayHint",
    "textDocument/semanticTokens/full",
    "textDocument/formatting",
];

/// Whether `method` is a request this server answers.
pub fn known(method: &str) -> bool {
    METHODS.contains(&method)
}

/// The analysis's diagnostics grouped by the URI of their primary file, ranges converted from
/// the checker's byte spans (the CLI's) to UTF-16 positions. The root document is always
/// present, so its old diagnostics are cleared.
pub fn diagnostics(analysis: &Analysis) -> Vec<(Uri, Vec<lsp_types::Diagnostic>)> {
    let mut out: Vec<(Uri, Vec<lsp_types::Diagnostic>)> =
        vec![(analysis.uri(analysis.root()), Vec::new())];
    let lines: Vec<LineIndex> = (0..analysis.uris.len())
        .map(|i| LineIndex::new(analysis.text(FileId(i as u32))))
        .collect();
    let range = |file: FileId, span: Span| lines[file.0 as usize].range(analysis.text(file), span);
    for d in &analysis.view.checked.diagnostics {
        let related = d
            .related
            .iter()
            .map(|l| DiagnosticRelatedInformation {
                location: Location::new(analysis.uri(l.file), range(l.file, l.span)),
                message: l.message.clone(),
            })
            .collect();
        let mut message = d.message.clone();
        if !d.primary.message.is_empty() {
            message.push_str(&format!("\n{}", d.primary.message));
        }
        if let Some(help) = &d.help {
            message.push_str(&format!("\nhelp: {help}"));
        }
        let diag = lsp_types::Diagnostic {
            range: range(d.primary.file, d.primary.span),
            severity: Some(match d.severity {
                Severity::Error => DiagnosticSeverity::ERROR,
                Severity::Warning => DiagnosticSeverity::WARNING,
            }),
            code: Some(NumberOrString::String(d.code.as_str().to_string())),
            code_description: Uri::from_str(&format!("{CODE_DOCS_BASE}{}.md", d.code.as_str()))
                .ok()
                .map(|href| CodeDescription { href }),
            source: Some("mslc".to_string()),
            message,
            related_information: Some(related),
            tags: d
                .code
                .is_unused_lint()
                .then(|| vec![DiagnosticTag::UNNECESSARY]),
            data: None,
        };
        let uri = analysis.uri(d.primary.file);
        match out.iter_mut().find(|(u, _)| *u == uri) {
            Some((_, list)) => list.push(diag),
            None => out.push((uri, vec![diag])),
        }
    }
    out
}

/// Answers one request of [`METHODS`] on `doc` (the analysis's root document).
pub fn answer(analysis: &Analysis, doc: &Document, req: &Request) -> Result<Value, String> {
    let root = analysis.root();
    let params = req.params.clone();
    let bad = |e: serde_json::Error| format!("invalid params: {e}");
    let json = |v: serde_json::Result<Value>| v.map_err(|e| e.to_string());
    match req.method.as_str() {
        "textDocument/hover" => {
            let p: HoverParams = serde_json::from_value(params).map_err(bad)?;
            let offset = doc.offset(p.text_document_position_params.position);
            json(serde_json::to_value(hover(analysis, doc, root, offset)))
        }
        "textDocument/definition" => {
            let p: GotoDefinitionParams = serde_json::from_value(params).map_err(bad)?;
            let offset = doc.offset(p.text_document_position_params.position);
            let loc = analysis
                .definition(root, offset)
                .map(|pl| location(analysis, pl));
            json(serde_json::to_value(loc))
        }
        "textDocument/references" => {
            let p: ReferenceParams = serde_json::from_value(params).map_err(bad)?;
            let offset = doc.offset(p.text_document_position.position);
            let refs: Vec<Location> = analysis
                .definition(root, offset)
                .map(|def| analysis.references(def))
                .unwrap_or_default()
                .into_iter()
                .map(|pl| location(analysis, pl))
                .collect();
            json(serde_json::to_value(refs))
        }
        "textDocument/completion" => {
            let p: CompletionParams = serde_json::from_value(params).map_err(bad)?;
            let offset = doc.offset(p.text_document_position.position);
            json(serde_json::to_value(complete::complete(
                analysis, &doc.text, offset,
            )))
        }
        "textDocument/documentSymbol" => {
            let outline = analysis
                .file_index(root)
                .map(|ix| {
                    ix.outline
                        .iter()
                        .map(|o| symbol(doc, o))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            json(serde_json::to_value(outline))
        }
        "textDocument/inlayHint" => json(serde_json::to_value(inlay_hints(analysis, doc))),
        "textDocument/semanticTokens/full" => json(serde_json::to_value(SemanticTokens {
            result_id: None,
            data: tokens::tokens(analysis, doc),
        })),
        "textDocument/formatting" => json(serde_json::to_value(format_edits(root, doc))),
        other => Err(format!("unknown request `{other}`")),
    }
}

/// `mslc fmt`'s layout as one edit over the whole document; none when the document is already
/// formatted or has a syntax error (left as it is, as `mslc fmt` leaves such a file).
fn format_edits(root: FileId, doc: &Document) -> Vec<TextEdit> {
    match mslc_syntax::format::format_source(root, &doc.text) {
        Ok(formatted) if formatted != doc.text => vec![TextEdit {
            range: doc.lines.range(&doc.text, Span::new(0, doc.text.len())),
            new_text: formatted,
        }],
        _ => Vec::new(),
    }
}

fn location(analysis: &Analysis, place: Place) -> Location {
    let text = analysis.text(place.file);
    Location::new(
        analysis.uri(place.file),
        LineIndex::new(text).range(text, place.span),
    )
}

/// Hover: a policy field's meaning; an instance's type, parameter count and paths; a `let`
/// name's type; or the smallest checked expression's type.
fn hover(analysis: &Analysis, doc: &Document, file: FileId, offset: usize) -> Option<Hover> {
    let ix = analysis.file_index(file)?;
    let at = |s: Span| s.start <= offset && offset <= s.end;
    let (text, span) = if let Some(f) = ix.fields.iter().find(|f| at(f.span)) {
        let d = fields::field(f.kind, &f.key)?;
        (
            format!("`{}.{}`: {}", f.kind.keyword(), d.key, d.doc),
            f.span,
        )
    } else if let Some(inst) = ix.instances.iter().find(|i| at(i.label)) {
        let (model, ty) = analysis.type_of(file, inst.expr)?;
        let matches = |path: &str| {
            if inst.in_model {
                glob_prefix(&inst.pattern, path)
            } else {
                std::iter::once(0)
                    .chain(path.match_indices('.').map(|(i, _)| i + 1))
                    .any(|i| glob_prefix(&inst.pattern, &path[i..]))
            }
        };
        let params: Vec<_> = model.params.iter().filter(|p| matches(&p.path)).collect();
        let count: u64 = params.iter().map(|p| model.ty(p.value).numel()).sum();
        let mut s = format!(
            "```\n{}\n```\n{count} parameter elements in {} tensors\n",
            show_type(model, ty),
            params.len()
        );
        for p in params.iter().take(50) {
            s.push_str(&format!(
                "\n- `{}`: {}",
                p.path,
                show_type(model, model.ty(p.value))
            ));
        }
        if params.len() > 50 {
            s.push_str(&format!("\n- … {} more", params.len() - 50));
        }
        (s, inst.label)
    } else if let Some((name, value)) = ix.lets.iter().find(|(n, _)| at(*n)) {
        let (model, ty) = analysis.type_of(file, *value)?;
        (format!("```\n{}\n```", show_type(model, ty)), *name)
    } else {
        let (model, ty, span) = analysis.type_at(file, Span::new(offset, offset))?;
        (format!("```\n{}\n```", show_type(model, ty)), span)
    };
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value: text,
        }),
        range: Some(doc.lines.range(&doc.text, span)),
    })
}

/// Whether `path` starts with the segments of `pattern` (`*` matching one segment) followed by
/// at least one more segment.
fn glob_prefix(pattern: &str, path: &str) -> bool {
    let mut segs = path.split('.');
    for want in pattern.split('.') {
        match segs.next() {
            Some(seg) if want == "*" || want == seg => {}
            _ => return false,
        }
    }
    segs.next().is_some()
}

#[allow(deprecated)] // `DocumentSymbol::deprecated` must be written, though deprecated.
fn symbol(doc: &Document, o: &Outline) -> DocumentSymbol {
    DocumentSymbol {
        name: o.name.clone(),
        detail: None,
        kind: o.kind,
        tags: None,
        deprecated: None,
        range: doc.lines.range(&doc.text, o.span),
        selection_range: doc.lines.range(&doc.text, o.name_span),
        children: Some(o.children.iter().map(|c| symbol(doc, c)).collect()),
    }
}

/// After each single-name `let`, the type of its value.
fn inlay_hints(analysis: &Analysis, doc: &Document) -> Vec<InlayHint> {
    let root = analysis.root();
    let Some(ix) = analysis.file_index(root) else {
        return Vec::new();
    };
    ix.lets
        .iter()
        .filter_map(|(name, value)| {
            let (model, ty) = analysis.type_of(root, *value)?;
            Some(InlayHint {
                position: doc.lines.position(&doc.text, name.end),
                label: InlayHintLabel::String(format!(": {}", show_type(model, ty))),
                kind: Some(InlayHintKind::TYPE),
                text_edits: None,
                tooltip: None,
                padding_left: None,
                padding_right: Some(true),
                data: None,
            })
        })
        .collect()
}
