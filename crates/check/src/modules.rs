//! Finding, reading and parsing every file a compilation needs: the root, the standard library
//! (embedded, or `--stdlib DIR`), and relative imports; binding imported names; import cycles.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use mslc_core::diag::{Code, Diagnostic, FileId, Sources};
use mslc_syntax::ast::{self, Item, Span};

/// The standard library shipped inside the binary: (module path like `nn`, text).
const EMBEDDED_STDLIB: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/stdlib_files.rs"));

/// The names of the embedded stdlib modules, e.g. `["llm", "nn", …]`.
pub fn stdlib_modules() -> impl Iterator<Item = (&'static str, &'static str)> {
    EMBEDDED_STDLIB.iter().copied()
}

/// Largest source file mslc reads (8 MiB; the largest example is 3 kB). A bigger file, or a
/// device that never ends, is refused with E0007 instead of filling memory.
pub const MAX_SOURCE_BYTES: u64 = 8 << 20;

/// Why a source file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// Nothing at that path.
    NotFound,
    /// A directory, FIFO, device or socket (what it is, e.g. `"a directory"`).
    NotRegular(&'static str),
    /// More than [`MAX_SOURCE_BYTES`] (at least this many bytes).
    TooLarge(u64),
    /// Not UTF-8: the text with invalid bytes replaced, and the offset of the first.
    NotUtf8 {
        /// The text, lossily decoded.
        lossy: String,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// Any other failure the operating system reported (permissions, a symlink loop, …).
    Io(std::io::Error),
}

impl ReadError {
    /// The error for `shown` (the path as shown), at `span` of `file`: E0007 for a file too
    /// large, E0003 for one not UTF-8, E0100 otherwise.
    pub fn diagnostic(&self, file: FileId, span: Span, shown: &str) -> Diagnostic {
        let (code, message, help) = match self {
            ReadError::NotFound => (
                Code::E0100,
                format!("cannot read `{shown}`: no such file"),
                "check the path".to_string(),
            ),
            ReadError::NotRegular(what) => (
                Code::E0100,
                format!("cannot read `{shown}`: it is {what}, not a regular file"),
                "mslc reads sources from regular files only".to_string(),
            ),
            ReadError::TooLarge(size) => (
                Code::E0007,
                format!("`{shown}` is too large: at least {size} bytes"),
                format!("a source file may have at most {MAX_SOURCE_BYTES} bytes (8 MiB)"),
            ),
            ReadError::NotUtf8 { offset, .. } => (
                Code::E0003,
                format!("`{shown}` is not valid UTF-8"),
                format!("invalid byte at offset {offset}; save the file as UTF-8 text"),
            ),
            ReadError::Io(e) => (
                Code::E0100,
                format!("cannot read `{shown}`: {e}"),
                "check the path and its permissions".to_string(),
            ),
        };
        Diagnostic::error(code, file, span, message).with_help(help)
    }
}

/// Reads a source file: only a regular file, at most [`MAX_SOURCE_BYTES`], UTF-8. Never opens
/// a FIFO or device (which could block or never end).
pub fn read_source(path: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::NotFound,
        _ => ReadError::Io(e),
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(file_kind(&meta.file_type())));
    }
    if meta.len() > MAX_SOURCE_BYTES {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        offset: e.utf8_error().valid_up_to(),
        lossy: String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// What a non-regular file is, with its article.
fn file_kind(ty: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ty.is_fifo() {
            return "a FIFO";
        }
        if ty.is_char_device() {
            return "a character device";
        }
        if ty.is_block_device() {
            return "a block device";
        }
        if ty.is_socket() {
            return "a socket";
        }
    }
    if ty.is_dir() {
        "a directory"
    } else {
        "something other than a file"
    }
}

/// Where a module comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ModuleKey {
    /// `std.a.b` → `"a/b"`.
    Std(String),
    /// A file on disk (canonical path when it exists).
    Path(PathBuf),
}

/// What a top-level name refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemRef {
    /// `items[i]` is a block.
    Block(usize),
    /// `items[i]` is a const item; its binding `j`.
    Const(usize, usize),
    /// `items[i]` is a model.
    Model(usize),
    /// `items[i]` is a policy, train or target declaration.
    Decl(usize),
}

/// A name brought in by an import.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The module it comes from.
    pub module: usize,
    /// What it is there.
    pub item: ItemRef,
    /// The import statement's span.
    pub span: Span,
}

/// One loaded file.
#[derive(Debug)]
pub struct Module {
    /// Where it came from.
    pub key: ModuleKey,
    /// Its source file.
    pub file: FileId,
    /// Its syntax tree.
    pub ast: ast::File,
    /// Names it defines (public or not), with the span of the defining name.
    pub items: HashMap<String, (ItemRef, Span, bool)>,
    /// Names it imports.
    pub imports: HashMap<String, Imported>,
    /// Names whose import failed (already reported): a use of one is poisoned, not unknown,
    /// so it raises no second error.
    pub failed_imports: HashSet<String>,
}

impl Module {
    /// Finds a name defined here or imported.
    pub fn lookup(&self, this: usize, name: &str) -> Option<(usize, ItemRef)> {
        if let Some((item, _, _)) = self.items.get(name) {
            return Some((this, *item));
        }
        self.imports.get(name).map(|i| (i.module, i.item))
    }

    /// Every name visible at the top level, for did-you-mean.
    pub fn visible_names(&self) -> impl Iterator<Item = &str> {
        self.items
            .keys()
            .chain(self.imports.keys())
            .map(String::as_str)
    }
}

/// All loaded modules of a compilation; `modules[0]` is the root.
#[derive(Debug, Default)]
pub struct Modules {
    /// Loaded modules.
    pub modules: Vec<Module>,
    by_key: HashMap<ModuleKey, usize>,
    /// Whether `--stdlib DIR` named no standard library directory (reported once): `std.*`
    /// names are poisoned.
    pub stdlib_missing: bool,
}

impl Modules {
    /// The files read from disk, in the order they were loaded: the root (when it is a file)
    /// and every imported file, including the stdlib's when it came from `stdlib_dir`; the
    /// embedded stdlib has no files.
    pub fn disk_files(&self, stdlib_dir: Option<&Path>) -> Vec<PathBuf> {
        self.modules
            .iter()
            .filter_map(|m| match (&m.key, stdlib_dir) {
                (ModuleKey::Path(p), _) => Some(p.clone()),
                (ModuleKey::Std(name), Some(dir)) => {
                    Some(canonical(&dir.join(format!("{name}.msl"))))
                }
                (ModuleKey::Std(_), None) => None,
            })
            .filter(|p| p.is_file())
            .collect()
    }
}

/// Reads sources from disk or the embedded stdlib.
pub struct Loader<'a> {
    /// Overrides the embedded stdlib.
    pub stdlib_dir: Option<&'a Path>,
    /// Files read so far.
    pub sources: &'a mut Sources,
    /// Problems found.
    pub diags: &'a mut Vec<Diagnostic>,
    modules: Modules,
    /// Modules being loaded (for cycle detection), with the import span that led to each.
    stack: Vec<(usize, Option<(FileId, Span)>)>,
}

impl<'a> Loader<'a> {
    /// A loader writing into `sources` and `diags`.
    pub fn new(
        stdlib_dir: Option<&'a Path>,
        sources: &'a mut Sources,
        diags: &'a mut Vec<Diagnostic>,
    ) -> Self {
        Loader {
            stdlib_dir,
            sources,
            diags,
            modules: Modules::default(),
            stack: Vec::new(),
        }
    }

    /// Loads the root module from text already read, and everything it imports.
    pub fn load_root(mut self, name: &str, text: &str) -> Modules {
        let key = ModuleKey::Path(canonical(Path::new(name)));
        let file = self.sources.add(name, text);
        self.finish_load(key, file, text, None);
        // Targets are named by path (`std.targets.cpu`, `--target cpu`) without an import.
        let targets = ModuleKey::Std("targets".to_string());
        if !self.modules.by_key.contains_key(&targets) {
            if let Ok(text) = self.read_std("targets") {
                let file = self.sources.add("std/targets.msl", text.as_str());
                self.finish_load(targets, file, &text, None);
            }
        }
        self.modules
    }

    fn finish_load(
        &mut self,
        key: ModuleKey,
        file: FileId,
        text: &str,
        from: Option<(FileId, Span)>,
    ) -> usize {
        let (ast, diags) = mslc_syntax::parse(file, text);
        self.diags.extend(diags);
        let index = self.modules.modules.len();
        let items = self.define_items(file, &ast);
        self.modules.modules.push(Module {
            key: key.clone(),
            file,
            ast,
            items,
            imports: HashMap::new(),
            failed_imports: HashSet::new(),
        });
        self.modules.by_key.insert(key, index);
        self.stack.push((index, from));
        self.resolve_imports(index);
        self.stack.pop();
        index
    }

    fn define_items(
        &mut self,
        file: FileId,
        ast: &ast::File,
    ) -> HashMap<String, (ItemRef, Span, bool)> {
        let mut items: HashMap<String, (ItemRef, Span, bool)> = HashMap::new();
        let mut define =
            |name: &ast::Ident, item: ItemRef, public: bool, diags: &mut Vec<Diagnostic>| {
                if let Some((_, first, _)) = items.get(&name.name) {
                    diags.push(
                        Diagnostic::error(
                            Code::E0104,
                            file,
                            name.span,
                            format!("`{}` is defined twice", name.name),
                        )
                        .with_label("defined again here")
                        .with_related(file, *first, "first defined here")
                        .with_help("rename one of them"),
                    );
                } else {
                    items.insert(name.name.clone(), (item, name.span, public));
                }
            };
        for (i, item) in ast.items.iter().enumerate() {
            match item {
                Item::Import(_) => {}
                Item::Const(c) => {
                    for (j, b) in c.bindings.iter().enumerate() {
                        define(&b.name, ItemRef::Const(i, j), c.public, self.diags);
                    }
                }
                Item::Block(b) => define(&b.name, ItemRef::Block(i), b.public, self.diags),
                Item::Model(m) => define(&m.name, ItemRef::Model(i), false, self.diags),
                Item::Decl(d) => {
                    let public = d.public || d.kind != ast::DeclKind::Train;
                    define(&d.name, ItemRef::Decl(i), public, self.diags)
                }
            }
        }
        items
    }

    fn resolve_imports(&mut self, index: usize) {
        let file = self.modules.modules[index].file;
        let imports: Vec<ast::Import> = self.modules.modules[index]
            .ast
            .items
            .iter()
            .filter_map(|i| {
                if let Item::Import(imp) = i {
                    Some(imp.clone())
                } else {
                    None
                }
            })
            .collect();
        for import in imports {
            let Some(target) = self.load_import(index, file, &import) else {
                self.poison(index, import.names.iter());
                continue;
            };
            for name in &import.names {
                let found = self.modules.modules[target]
                    .items
                    .get(&name.name.name)
                    .copied();
                let item = match found {
                    Some((item, _, true)) => item,
                    Some((_, def, false)) => {
                        let def_file = self.modules.modules[target].file;
                        self.diags.push(
                            Diagnostic::error(
                                Code::E0102,
                                file,
                                name.name.span,
                                format!("`{}` is not public", name.name.name),
                            )
                            .with_label("private item")
                            .with_related(def_file, def, "defined here without `pub`")
                            .with_help("mark it `pub` in its module to export it"),
                        );
                        self.poison(index, std::iter::once(name));
                        continue;
                    }
                    None => {
                        let module = &self.modules.modules[target];
                        let exported: Vec<&str> = module
                            .items
                            .iter()
                            .filter(|(_, (_, _, public))| *public)
                            .map(|(n, _)| n.as_str())
                            .collect();
                        let mut d = Diagnostic::error(
                            Code::E0102,
                            file,
                            name.name.span,
                            format!(
                                "module `{}` has no item `{}`",
                                module_display(&import),
                                name.name.name
                            ),
                        )
                        .with_label("not found in this module");
                        if let Some(s) =
                            super::suggest::closest(&name.name.name, exported.iter().copied())
                        {
                            d = d.with_help(format!("did you mean `{s}`?"));
                        }
                        self.diags.push(d);
                        self.poison(index, std::iter::once(name));
                        continue;
                    }
                };
                let local = name.local();
                let module = &mut self.modules.modules[index];
                if let Some((_, first, _)) = module.items.get(&local.name) {
                    let first = *first;
                    self.diags.push(
                        Diagnostic::error(
                            Code::E0104,
                            file,
                            local.span,
                            format!("`{}` is imported but also defined in this file", local.name),
                        )
                        .with_label("imported here")
                        .with_related(file, first, "defined here")
                        .with_help(format!(
                            "import it under another name: `{} as …`",
                            name.name.name
                        )),
                    );
                    continue;
                }
                if let Some(previous) = module.imports.get(&local.name) {
                    let first = previous.span;
                    self.diags.push(
                        Diagnostic::error(
                            Code::E0104,
                            file,
                            local.span,
                            format!("`{}` is imported twice", local.name),
                        )
                        .with_label("imported again here")
                        .with_related(file, first, "first imported here"),
                    );
                    continue;
                }
                module.imports.insert(
                    local.name.clone(),
                    Imported {
                        module: target,
                        item,
                        span: import.span,
                    },
                );
            }
        }
    }

    /// Records the local names of failed imports in module `index`.
    fn poison<'n>(&mut self, index: usize, names: impl Iterator<Item = &'n ast::ImportName>) {
        let failed = &mut self.modules.modules[index].failed_imports;
        failed.extend(names.map(|n| n.local().name.clone()));
    }

    /// Loads the module an import names; `None` (with a diagnostic) when it can't.
    fn load_import(&mut self, from: usize, file: FileId, import: &ast::Import) -> Option<usize> {
        let span = import.span;
        let key = self.import_key(from, import)?;
        if let Some(&index) = self.modules.by_key.get(&key) {
            if let Some(pos) = self.stack.iter().position(|(m, _)| *m == index) {
                let mut d = Diagnostic::error(
                    Code::E0103,
                    file,
                    span,
                    format!(
                        "import cycle: `{}` imports a module that imports it back",
                        self.sources.get(file).name
                    ),
                )
                .with_label("this import closes the cycle")
                .with_help("move the shared items into a module that both import");
                for (_, via) in &self.stack[pos + 1..] {
                    if let Some((f, s)) = via {
                        d = d.with_related(*f, *s, "imported here");
                    }
                }
                self.diags.push(d);
                return None;
            }
            return Some(index);
        }
        if let (ModuleKey::Std(_), Some(dir)) = (&key, self.stdlib_dir) {
            let holds_std = || {
                EMBEDDED_STDLIB
                    .iter()
                    .any(|(n, _)| dir.join(format!("{n}.msl")).is_file())
            };
            if !dir.is_dir() || !holds_std() {
                self.stdlib_dir_missing(dir, file, span);
                return None;
            }
        }
        let text = match &key {
            ModuleKey::Std(name) => self.read_std(name),
            ModuleKey::Path(path) => read_source(path),
        };
        let name = match &key {
            ModuleKey::Std(n) => format!("std/{n}.msl"),
            ModuleKey::Path(p) => display_path(p),
        };
        match text {
            Ok(text) => {
                let new_file = self.sources.add(name, text.as_str());
                Some(self.finish_load(key, new_file, &text, Some((file, span))))
            }
            Err(ReadError::NotFound) => {
                let mut d = Diagnostic::error(
                    Code::E0101,
                    file,
                    span,
                    format!("module `{}` not found", module_display(import)),
                )
                .with_label(match &key {
                    ModuleKey::Std(_) => "no such standard library module".to_string(),
                    ModuleKey::Path(p) => format!("no file {}", display_path(p)),
                });
                if let ModuleKey::Std(name) = &key {
                    let names: Vec<&str> = EMBEDDED_STDLIB.iter().map(|(n, _)| *n).collect();
                    if let Some(s) = super::suggest::closest(name, names.iter().copied()) {
                        d = d.with_help(format!("did you mean `std.{}`?", s.replace('/', ".")));
                    }
                }
                self.diags.push(d);
                None
            }
            Err(e) => {
                let d = e.diagnostic(file, span, &name).with_label("imported here");
                self.diags.push(d);
                None
            }
        }
    }

    /// One error for a `--stdlib` directory that does not exist or holds none of the standard
    /// library's modules (a wrong path), at the first import that needs it; later `std.*`
    /// imports and `std.targets` references fail silently.
    fn stdlib_dir_missing(&mut self, dir: &Path, file: FileId, span: Span) {
        if self.modules.stdlib_missing {
            return;
        }
        self.modules.stdlib_missing = true;
        let what = if dir.is_dir() {
            "holds no standard library module (`nn.msl`, `llm.msl`, …)"
        } else if dir.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        self.diags.push(
            Diagnostic::error(
                Code::E0101,
                file,
                span,
                format!("standard library directory `{}` {what}", dir.display()),
            )
            .with_label("needs the standard library")
            .with_help(
                "fix the `--stdlib` path, or leave it out to use the built-in standard library",
            ),
        );
    }

    fn import_key(&mut self, from: usize, import: &ast::Import) -> Option<ModuleKey> {
        let segments: Vec<&str> = import.module.iter().map(|i| i.name.as_str()).collect();
        if import.dots == 0 {
            return match segments.split_first() {
                Some((&"std", rest)) if !rest.is_empty() => Some(ModuleKey::Std(rest.join("/"))),
                _ => {
                    let file = self.modules.modules[from].file;
                    self.diags.push(
                        Diagnostic::error(Code::E0101, file, import.span, "import path must start with `std.` or `.`")
                            .with_label("neither a standard library nor a relative import")
                            .with_help("write `import std.nn.Linear`, or `import .my_file.Name` for ./my_file.msl"),
                    );
                    None
                }
            };
        }
        let base = match &self.modules.modules[from].key {
            ModuleKey::Path(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
            ModuleKey::Std(name) => {
                let dir = self
                    .stdlib_dir
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("std"));
                dir.join(name)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default()
            }
        };
        let mut dir = base;
        for _ in 1..import.dots {
            dir.pop();
        }
        let mut path = dir;
        for s in &segments {
            path.push(s);
        }
        path.set_extension("msl");
        if let ModuleKey::Std(name) = &self.modules.modules[from].key {
            if self.stdlib_dir.is_none() {
                let rel = Path::new(name)
                    .parent()
                    .unwrap_or(Path::new(""))
                    .join(segments.join("/"));
                return Some(ModuleKey::Std(rel.display().to_string()));
            }
        }
        Some(ModuleKey::Path(canonical(&path)))
    }

    fn read_std(&self, name: &str) -> Result<String, ReadError> {
        match self.stdlib_dir {
            Some(dir) => read_source(&dir.join(format!("{name}.msl"))),
            None => EMBEDDED_STDLIB
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.to_string())
                .ok_or(ReadError::NotFound),
        }
    }
}

/// A path as shown to users: relative to the working directory when it lies below it, so
/// messages (and snapshots of them) do not depend on where the project is checked out.
fn display_path(path: &Path) -> String {
    let cwd = std::env::current_dir().ok().map(|d| canonical(&d));
    match cwd.as_deref().and_then(|cwd| path.strip_prefix(cwd).ok()) {
        Some(rel) => rel.display().to_string(),
        None => path.display().to_string(),
    }
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

fn module_display(import: &ast::Import) -> String {
    let names: Vec<&str> = import.module.iter().map(|i| i.name.as_str()).collect();
    format!("{}{}", ".".repeat(import.dots), names.join("."))
}
