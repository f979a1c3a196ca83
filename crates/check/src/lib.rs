//! The checker: loads a file and its imports, elaborates every model (names, blocks, shapes,
//! dtypes, parameter paths), checks the policy declarations against them, and returns the
//! checked program together with every diagnostic — it never stops at the first.

mod builtins;
pub mod decls;
mod eval;
mod instance;
mod lints;
mod model;
pub mod modules;
pub mod policy;

pub(crate) mod suggest;
mod value;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use mslc_core::diag::{Code, Diagnostic, FileId, Sources};
use mslc_syntax::ast::{self, Span};

pub use eval::ExprTypes;
pub use model::Overrides;
pub use mslc_core::program::Model;

/// How to check.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Read `std.*` from this folder instead of the embedded standard library.
    pub stdlib_dir: Option<PathBuf>,
    /// `--set` / `--dim` values.
    pub overrides: Overrides,
}

/// The result of checking: what was understood, and everything wrong with it.
#[derive(Debug, Default)]
pub struct Checked {
    /// Every file read.
    pub sources: Sources,
    /// The root file's models, elaborated, in source order.
    pub models: Vec<Model>,
    /// Policies, targets and trainings, checked against the models.
    pub decls: decls::Declarations,
    /// All diagnostics, errors and warnings, without duplicates.
    pub diagnostics: Vec<Diagnostic>,
    /// The files read from disk (canonical paths, in the order read): the root and everything
    /// it imports, for dep-info and `rerun-if-changed`. The embedded stdlib has none.
    pub files: Vec<PathBuf>,
}

impl Checked {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        mslc_core::diag::has_errors(&self.diagnostics)
    }

    /// The model named `name`.
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }
}

/// Checks the file at `path` (a regular file of at most [`modules::MAX_SOURCE_BYTES`]).
pub fn check_path(path: &Path, options: &CheckOptions) -> Checked {
    let mut read = Sources::new();
    match read_source(path, &mut read) {
        Ok((_, text)) => check_source(&path.display().to_string(), &text, options),
        Err(diagnostic) => Checked {
            sources: read,
            diagnostics: vec![*diagnostic],
            ..Checked::default()
        },
    }
}

/// Reads the file at `path` as source text (a regular file of at most
/// [`modules::MAX_SOURCE_BYTES`]) and adds it to `sources` under its displayed path: its id and
/// text, or the coded diagnostic (E0100 unreadable or not a regular file, E0007 too large,
/// E0003 not UTF-8) pointing into what was added.
pub fn read_source(
    path: &Path,
    sources: &mut Sources,
) -> Result<(FileId, String), Box<Diagnostic>> {
    let name = path.display().to_string();
    let error = match modules::read_source(path) {
        Ok(text) => return Ok((sources.add(name, text.as_str()), text)),
        Err(e) => e,
    };
    let (text, span) = match &error {
        modules::ReadError::NotUtf8 { lossy, offset } => {
            (lossy.clone(), Span::new(*offset, offset + 1))
        }
        _ => (String::new(), Span::default()),
    };
    let file = sources.add(name.clone(), text);
    let mut d = error.diagnostic(file, span, &name);
    if let modules::ReadError::NotUtf8 { offset, .. } = error {
        d = d.with_label(format!("invalid byte at offset {offset}"));
    }
    Err(Box::new(d))
}

/// Checks source text already in memory (`name` is shown in diagnostics and anchors relative
/// imports).
pub fn check_source(name: &str, text: &str, options: &CheckOptions) -> Checked {
    check_source_for_editor(name, text, options).checked
}

/// What an editor needs beyond [`Checked`]: the loaded modules (syntax trees, names, imports)
/// and, per model, the type of every expression.
#[derive(Debug)]
pub struct EditorView {
    /// The checking result, as [`check_source`] gives it.
    pub checked: Checked,
    /// Every file loaded, parsed, with its names and imports; `modules[0]` is the root.
    pub modules: modules::Modules,
    /// Per model of `checked.models`, the first tensor each expression evaluated to.
    pub expr_types: Vec<eval::ExprTypes>,
}

/// [`check_source`], keeping the modules and expression types for an editor.
pub fn check_source_for_editor(name: &str, text: &str, options: &CheckOptions) -> EditorView {
    let mut sources = Sources::new();
    let mut diags = Vec::new();
    let modules = modules::Loader::new(options.stdlib_dir.as_deref(), &mut sources, &mut diags)
        .load_root(name, text);
    let mut models = Vec::new();
    let mut expr_types = Vec::new();
    let mut poisoned = Vec::new();
    let mut used: HashSet<(bool, String)> = HashSet::new();
    let root = &modules.modules[0];
    for item in &root.ast.items {
        if let ast::Item::Model(m) = item {
            let done = model::elaborate_model(&modules, 0, m, &options.overrides);
            poisoned.push(done.poisoned);
            diags.extend(done.diags);
            used.extend(done.used);
            models.push(done.model);
            expr_types.push(done.expr_types);
        }
    }
    report_unused_overrides(&options.overrides, &used, &models, root.file, &mut diags);
    let decls = decls::check_declarations(&modules, &models, &poisoned, &mut diags);
    // Unused code is no news while the file has errors: a typo makes a name look unused.
    if !mslc_core::diag::has_errors(&diags) {
        diags.extend(lints::unused(&modules));
    }
    let checked = Checked {
        files: modules.disk_files(options.stdlib_dir.as_deref()),
        sources,
        models,
        decls,
        diagnostics: dedup(diags),
    };
    EditorView {
        checked,
        modules,
        expr_types,
    }
}

fn report_unused_overrides(
    overrides: &Overrides,
    used: &HashSet<(bool, String)>,
    models: &[Model],
    file: mslc_core::diag::FileId,
    diags: &mut Vec<Diagnostic>,
) {
    let span = models.first().map_or(Span::default(), |m| m.loc.span);
    for (is_dim, table) in [(false, &overrides.sets), (true, &overrides.dims)] {
        for name in table.keys() {
            if used.contains(&(is_dim, name.clone())) {
                continue;
            }
            let (flag, what) = if is_dim {
                ("--dim", "dim")
            } else {
                ("--set", "const")
            };
            let known: Vec<&str> = models
                .iter()
                .flat_map(|m| {
                    if is_dim {
                        m.dims.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
                    } else {
                        m.consts.iter().map(|(n, _)| n.as_str()).collect()
                    }
                })
                .collect();
            let mut d = Diagnostic::error(
                Code::E0401,
                file,
                span,
                format!("{flag} {name}: no model declares a {what} `{name}`"),
            )
            .with_label("in this file");
            d = match suggest::closest(name, known.iter().copied()) {
                Some(s) => d.with_help(format!("did you mean `{flag} {s}=…`?")),
                None if known.is_empty() => {
                    d.with_help(format!("this file's models declare no {what}s"))
                }
                None => d.with_help(format!("{what}s here: {}", known.join(", "))),
            };
            diags.push(d);
        }
    }
}

/// Drops repeats: the same problem inside a block used by 80 layers is reported once.
fn dedup(diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut seen = HashSet::new();
    diags
        .into_iter()
        .filter(|d| {
            seen.insert((
                d.code,
                d.primary.file,
                d.primary.span.start,
                d.primary.span.end,
                d.message.clone(),
            ))
        })
        .collect()
}
