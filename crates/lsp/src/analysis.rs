//! One check of one open document, with what editors ask of it: the file of a URI and back,
//! name resolution across files, hover text and inlay hints.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use lsp_types::Uri;
use mslc_check::modules::ModuleKey;
use mslc_check::{CheckOptions, EditorView};
use mslc_core::diag::FileId;
use mslc_core::ops::TensorType;
use mslc_core::program::Model;
use mslc_syntax::ast::Span;

use crate::index::FileIndex;

/// The URI scheme of embedded standard-library files: `mslc-std:///std/nn.msl`. Their text is
/// served by the `mslc/stdlibSource` request.
pub const STD_SCHEME: &str = "mslc-std";

/// A place in a file of the analysis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The file.
    pub file: FileId,
    /// The bytes.
    pub span: Span,
}

/// A checked document and the indexes of every file it loaded.
pub struct Analysis {
    /// The checker's result with modules and expression types.
    pub view: EditorView,
    /// Per module (same order as `view.modules.modules`), its index.
    pub index: Vec<FileIndex>,
    /// Per file id, its URI.
    pub uris: Vec<Uri>,
}

impl Analysis {
    /// Checks `text`, the document at `uri`.
    pub fn new(uri: &Uri, text: &str) -> Analysis {
        let name =
            path_of(uri).map_or_else(|| uri.as_str().to_string(), |p| p.display().to_string());
        let view = mslc_check::check_source_for_editor(&name, text, &CheckOptions::default());
        let index = view
            .modules
            .modules
            .iter()
            .map(|m| FileIndex::new(&m.ast))
            .collect();
        let mut uris = vec![uri.clone(); view.checked.sources.len()];
        for m in view.modules.modules.iter().skip(1) {
            let target = match &m.key {
                ModuleKey::Std(n) => std_uri(n),
                ModuleKey::Path(p) => file_uri(p),
            };
            if let (Some(slot), Some(u)) = (uris.get_mut(m.file.0 as usize), target) {
                *slot = u;
            }
        }
        Analysis { view, index, uris }
    }

    /// The root file's id.
    pub fn root(&self) -> FileId {
        self.view.modules.modules[0].file
    }

    /// The text of a file.
    pub fn text(&self, file: FileId) -> &str {
        &self.view.checked.sources.get(file).text
    }

    /// The URI of a file.
    pub fn uri(&self, file: FileId) -> Uri {
        self.uris[file.0 as usize].clone()
    }

    fn module_of(&self, file: FileId) -> Option<usize> {
        self.view
            .modules
            .modules
            .iter()
            .position(|m| m.file == file)
    }

    /// What the name at `offset` of `file` refers to: its definition.
    pub fn definition(&self, file: FileId, offset: usize) -> Option<Place> {
        let m = self.module_of(file)?;
        let ix = &self.index[m];
        if let Some(d) = ix.defs.iter().find(|d| contains(d.span, offset)) {
            return Some(Place { file, span: d.span });
        }
        if let Some((_, name)) = ix.import_paths.iter().find(|(s, _)| contains(*s, offset)) {
            let imported = self.view.modules.modules[m].imports.get(name)?;
            let target = self.view.modules.modules[imported.module].file;
            return Some(Place {
                file: target,
                span: Span::default(),
            });
        }
        if let Some((_, (_, span, _))) = self.view.modules.modules[m]
            .items
            .iter()
            .find(|(_, (_, s, _))| contains(*s, offset))
        {
            return Some(Place { file, span: *span });
        }
        let u = ix.uses.iter().find(|u| contains(u.span, offset))?;
        self.resolve(m, &u.name, u.body, u.span.start)
    }

    /// Resolves a name used in module `m`: locals of its body first, then the module's names,
    /// then its imports.
    fn resolve(&self, m: usize, name: &str, body: Option<usize>, at: usize) -> Option<Place> {
        let module = &self.view.modules.modules[m];
        if body.is_some() {
            let mut local = self.index[m]
                .defs
                .iter()
                .filter(|d| d.body == body && d.name == name);
            let first = local.clone().next();
            if let Some(d) = local.rfind(|d| d.span.start <= at).or(first) {
                return Some(Place {
                    file: module.file,
                    span: d.span,
                });
            }
        }
        if let Some((_, span, _)) = module.items.get(name) {
            return Some(Place {
                file: module.file,
                span: *span,
            });
        }
        let imported = module.imports.get(name)?;
        let target = &self.view.modules.modules[imported.module];
        target
            .items
            .values()
            .find(|(item, _, _)| *item == imported.item)
            .map(|(_, span, _)| Place {
                file: target.file,
                span: *span,
            })
    }

    /// Every place, in every loaded file, that names the definition `def` (itself included).
    pub fn references(&self, def: Place) -> Vec<Place> {
        let mut out = vec![def];
        for (m, ix) in self.index.iter().enumerate() {
            let file = self.view.modules.modules[m].file;
            for u in &ix.uses {
                if self.resolve(m, &u.name, u.body, u.span.start) == Some(def) {
                    out.push(Place { file, span: u.span });
                }
            }
        }
        out.dedup();
        out
    }

    /// The type of the smallest checked expression of `file` covering `span`'s start and end,
    /// with the model it was found in.
    pub fn type_at(&self, file: FileId, span: Span) -> Option<(&Model, &TensorType, Span)> {
        let mut best: Option<(usize, mslc_core::program::ValueId, Span)> = None;
        for (i, types) in self.view.expr_types.iter().enumerate() {
            for (&(f, s), &v) in types {
                if f == file
                    && s.start <= span.start
                    && span.end <= s.end
                    && best.is_none_or(|(_, _, b)| s.len() < b.len())
                {
                    best = Some((i, v, s));
                }
            }
        }
        let (i, v, s) = best?;
        let model = &self.view.checked.models[i];
        Some((model, model.ty(v), s))
    }

    /// The type of exactly the expression at `span`.
    pub fn type_of(&self, file: FileId, span: Span) -> Option<(&Model, &TensorType)> {
        self.view
            .expr_types
            .iter()
            .enumerate()
            .find_map(|(i, types)| {
                let model = &self.view.checked.models[i];
                types.get(&(file, span)).map(|&v| (model, model.ty(v)))
            })
    }

    /// The index of `file`.
    pub fn file_index(&self, file: FileId) -> Option<&FileIndex> {
        self.module_of(file).map(|m| &self.index[m])
    }
}

/// Shows a type with symbolic dims: a size equal to the value of one or more of the model's
/// `dims` is written `NAME=size` (several names joined by `|`); other sizes are plain.
/// `f32[B=1, S=128, 256]`.
pub fn show_type(model: &Model, ty: &TensorType) -> String {
    let dims: Vec<String> = ty
        .shape
        .iter()
        .map(|&n| {
            let names: Vec<&str> = model
                .dims
                .iter()
                .filter(|(_, v)| *v == n)
                .map(|(name, _)| name.as_str())
                .collect();
            if names.is_empty() {
                n.to_string()
            } else {
                format!("{}={n}", names.join("|"))
            }
        })
        .collect();
    format!("{}[{}]", ty.dtype, dims.join(", "))
}

fn contains(span: Span, offset: usize) -> bool {
    span.start <= offset && offset <= span.end
}

/// The path of a `file:` URI.
pub fn path_of(uri: &Uri) -> Option<PathBuf> {
    let rest = uri.as_str().strip_prefix("file://")?;
    let decoded = percent_decode(rest)?;
    Some(PathBuf::from(decoded))
}

/// The URI of an embedded stdlib module (`nn` → `mslc-std:///std/nn.msl`).
pub fn std_uri(module: &str) -> Option<Uri> {
    Uri::from_str(&format!("{STD_SCHEME}:///std/{module}.msl")).ok()
}

/// The embedded text a `mslc-std:` URI names.
pub fn std_text(uri: &str) -> Option<&'static str> {
    let module = uri
        .strip_prefix(STD_SCHEME)?
        .strip_prefix(":///std/")?
        .strip_suffix(".msl")?;
    mslc_check::modules::stdlib_modules()
        .find(|(name, _)| *name == module)
        .map(|(_, text)| text)
}

/// The `file:` URI of a path.
pub fn file_uri(path: &Path) -> Option<Uri> {
    let mut s = String::from("file://");
    for b in path.display().to_string().bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    Uri::from_str(&s).ok()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
