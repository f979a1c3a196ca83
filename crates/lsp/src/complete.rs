//! Completion: by what the text before the cursor says — a `shard "…"` pattern, a mesh axis in a
//! shard spec, a declaration field or its value, a named argument inside a call — or else the
//! block names in scope and the ops of the registry with their signatures.

use lsp_types::{CompletionItem, CompletionItemKind};
use mslc_check::modules::ItemRef;
use mslc_core::ops::{AttrDefault, Op};
use mslc_syntax::ast::{DeclKind, ExprKind, Field, Item, ParamType};

use crate::analysis::Analysis;
use crate::fields::FIELDS;

/// Completions at byte `offset` of the root document `text`.
pub fn complete(analysis: &Analysis, text: &str, offset: usize) -> Vec<CompletionItem> {
    let offset = mslc_core::diag::source::floor_char_boundary(text, offset.min(text.len()));
    let before = &text[..offset];
    let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    if let Some(kind) = enclosing_decl(before) {
        let trimmed = line.trim_start();
        if trimmed.starts_with("shard") {
            if line.matches('"').count() % 2 == 1 {
                return param_patterns(analysis);
            }
            return mesh_axes(analysis);
        }
        if let Some((key, _)) = trimmed.split_once('=') {
            let key = key.trim().rsplit(',').next().unwrap_or("").trim();
            return FIELDS
                .iter()
                .filter(|d| d.kind == kind && d.key == key)
                .flat_map(|d| d.values)
                .map(|v| item(v, CompletionItemKind::VALUE, None))
                .collect();
        }
        return FIELDS
            .iter()
            .filter(|d| d.kind == kind)
            .map(|d| item(d.key, CompletionItemKind::FIELD, Some(d.doc.to_string())))
            .collect();
    }
    if let Some(callee) = enclosing_call(before) {
        let named = named_args(analysis, callee);
        if !named.is_empty() {
            return named;
        }
    }
    let mut out = blocks(analysis);
    out.extend(Op::ALL.iter().map(|op| {
        item(
            op.name(),
            CompletionItemKind::FUNCTION,
            Some(signature(*op)),
        )
    }));
    out
}

fn item(label: &str, kind: CompletionItemKind, detail: Option<String>) -> CompletionItem {
    CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail,
        ..CompletionItem::default()
    }
}

/// `matmul(a, b, transpose_a: bool = false)`, from the registry.
pub fn signature(op: Op) -> String {
    let spec = op.spec();
    let mut args: Vec<String> = spec.inputs.iter().map(|s| s.to_string()).collect();
    for a in spec.attrs {
        let kind = a.kind.describe();
        args.push(match a.default {
            AttrDefault::Required => format!("{}: {kind}", a.name),
            AttrDefault::Optional => format!("{}: {kind}?", a.name),
            AttrDefault::Value(v) => format!("{}: {kind} = {v:?}", a.name),
        });
    }
    format!("{}({})", op.name(), args.join(", "))
}

/// The declaration kind whose body the text ends in, judged by the last line that starts an
/// item.
fn enclosing_decl(before: &str) -> Option<DeclKind> {
    let kinds = [
        ("precision", DeclKind::Precision),
        ("parallel", DeclKind::Parallel),
        ("memory", DeclKind::Memory),
        ("train", DeclKind::Train),
        ("target", DeclKind::Target),
    ];
    for line in before.lines().rev() {
        let word = line.strip_prefix("pub ").unwrap_or(line);
        if line.starts_with('}') {
            return None;
        }
        if let Some((_, kind)) = kinds
            .iter()
            .find(|(k, _)| word.starts_with(&format!("{k} ")))
        {
            return Some(*kind);
        }
        if ["model ", "block ", "import ", "const "]
            .iter()
            .any(|k| word.starts_with(k))
        {
            return None;
        }
    }
    None
}

/// The name before the innermost unclosed `(`.
fn enclosing_call(before: &str) -> Option<&str> {
    let mut depth = 0i32;
    for (i, c) in before.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' if depth == 0 => {
                let head = before[..i].trim_end();
                let start = head
                    .char_indices()
                    .rfind(|&(_, c)| !(c.is_alphanumeric() || c == '_'))
                    .map_or(0, |(j, c)| j + c.len_utf8());
                return Some(&head[start..]).filter(|s| !s.is_empty());
            }
            '(' => depth -= 1,
            '{' | '}' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

fn named_args(analysis: &Analysis, callee: &str) -> Vec<CompletionItem> {
    if let Some(op) = Op::ALL.iter().find(|op| op.name() == callee) {
        let spec = op.spec();
        let names = spec
            .inputs
            .iter()
            .copied()
            .chain(spec.attrs.iter().map(|a| a.name));
        return names
            .map(|n| {
                item(
                    &format!("{n}:"),
                    CompletionItemKind::VARIABLE,
                    Some(signature(*op)),
                )
            })
            .collect();
    }
    let modules = &analysis.view.modules.modules;
    let Some((m, ItemRef::Block(i))) = modules[0].lookup(0, callee) else {
        return Vec::new();
    };
    let Some(Item::Block(b)) = modules[m].ast.items.get(i) else {
        return Vec::new();
    };
    b.params
        .iter()
        .map(|p| {
            let ty = match &p.ty {
                ParamType::Scalar(s) => s.name.clone(),
                ParamType::Tensor(_) => "tensor".to_string(),
            };
            item(
                &format!("{}:", p.name.name),
                CompletionItemKind::VARIABLE,
                Some(ty),
            )
        })
        .collect()
}

fn blocks(analysis: &Analysis) -> Vec<CompletionItem> {
    let root = &analysis.view.modules.modules[0];
    let mut names: Vec<&str> = root
        .visible_names()
        .filter(|n| matches!(root.lookup(0, n), Some((_, ItemRef::Block(_)))))
        .collect();
    names.sort_unstable();
    names
        .into_iter()
        .map(|n| item(n, CompletionItemKind::CLASS, Some("block".to_string())))
        .collect()
}

/// Parameter paths of the root's models with numeric segments as `*`, each once.
fn param_patterns(analysis: &Analysis) -> Vec<CompletionItem> {
    let mut patterns: Vec<String> = analysis
        .view
        .checked
        .models
        .iter()
        .flat_map(|m| &m.params)
        .map(|p| {
            p.path
                .split('.')
                .map(|s| if s.parse::<u64>().is_ok() { "*" } else { s })
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect();
    patterns.sort();
    patterns.dedup();
    patterns
        .iter()
        .map(|p| {
            item(
                p,
                CompletionItemKind::TEXT,
                Some("parameter path".to_string()),
            )
        })
        .collect()
}

/// The axes of every `mesh = { … }` of the root file, and `_`.
fn mesh_axes(analysis: &Analysis) -> Vec<CompletionItem> {
    let mut out = vec![item(
        "_",
        CompletionItemKind::VALUE,
        Some("replicated".to_string()),
    )];
    for it in &analysis.view.modules.modules[0].ast.items {
        let Item::Decl(d) = it else { continue };
        for field in &d.fields {
            if let Field::Assign { key, value, .. } = field {
                if key.name == "mesh" {
                    if let ExprKind::Record(axes) = &value.kind {
                        out.extend(axes.iter().map(|(a, _)| {
                            item(
                                &a.name,
                                CompletionItemKind::ENUM_MEMBER,
                                Some("mesh axis".to_string()),
                            )
                        }));
                    }
                }
            }
        }
    }
    out
}
