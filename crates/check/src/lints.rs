//! Unused-code lints: warnings for a `param`, `input`, `let`, `const`, `dims` name, import or
//! block argument that nothing reads, and for a labelled instance whose result is dropped —
//! code that still counts in the model (a forgotten position embedding keeps the parameter
//! count right) but does nothing.
//!
//! The analysis is by name over the syntax tree, per scope as the elaborator binds them: a
//! name read anywhere in its scope is used, in whichever `if` branch or instantiation, so a
//! block argument one instantiation ignores is still used. Only the user's files are linted,
//! never the standard library. A name starting with `_`, or anything inside an item or
//! statement preceded by `@allow(unused)`, is exempt.

use std::collections::{HashMap, HashSet};

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_syntax::ast::{
    self, BinOp, Dim, Expr, ExprKind, Field, Ident, Item, LabelPiece, LabelSeg, ParamKind,
    ParamType, RetType, Span, Stmt, TensorType,
};

use mslc_syntax::print::print_label;

use super::modules::{ModuleKey, Modules};

/// The warnings for every user module of `modules` (not the standard library's).
pub fn unused(modules: &Modules) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    for module in &modules.modules {
        if matches!(module.key, ModuleKey::Std(_)) {
            continue;
        }
        let mut lint = Linter {
            scopes: Vec::new(),
            top_uses: HashSet::new(),
            decl_uses: HashSet::new(),
            unused: Vec::new(),
        };
        lint.file_items(&module.ast);
        let allowed = |span: Span| {
            module.ast.allows.iter().any(|a| {
                a.lint.name == "unused" && a.target.start <= span.start && span.end <= a.target.end
            })
        };
        let mut found = std::mem::take(&mut lint.unused);
        found.sort_by_key(|(_, name)| name.span.start);
        diags.extend(
            found
                .into_iter()
                .filter(|(_, name)| !allowed(name.span))
                .map(|(kind, name)| kind.diagnostic(module.file, &name)),
        );
    }
    diags
}

/// What an unused name was declared as.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// `param` or `buffer` in a block or model.
    Param(ParamKind),
    /// `input` in a model.
    Input,
    /// `let`.
    Let,
    /// `let x = label: Block(…)`, with the instance as written (`wpe: Embedding(…)`).
    Instance(String),
    /// `const` in a model, or a file-level `const` not exported.
    Const,
    /// `dims` in a model.
    Dim,
    /// A name brought in by `import`.
    Import,
    /// A block's parameter.
    Argument,
}

impl Kind {
    fn diagnostic(&self, file: FileId, name: &Ident) -> Diagnostic {
        let n = &name.name;
        let (code, message, label, help) = match self {
            Kind::Param(kind) => {
                let what = match kind {
                    ParamKind::Param => "parameter",
                    ParamKind::Buffer => "buffer",
                };
                (
                    Code::W0005,
                    format!("{what} `{n}` is never used"),
                    "declared here, read nowhere".to_string(),
                    "it still counts in the model's size: use it, remove it, or add `@allow(unused)` before it".to_string(),
                )
            }
            Kind::Input => (
                Code::W0006,
                format!("input `{n}` is never used"),
                "no output depends on it".to_string(),
                "callers must still pass it: use it, remove it, or add `@allow(unused)` before it"
                    .to_string(),
            ),
            Kind::Let => (
                Code::W0007,
                format!("`{n}` is never used"),
                "bound here, read nowhere".to_string(),
                format!("use it, remove it, or name it `_{n}`"),
            ),
            Kind::Instance(instance) => (
                Code::W0011,
                format!("the result of instance `{instance}` is dropped: `{n}` is never used"),
                "bound here, read nowhere".to_string(),
                "the instance's parameters still count in the model: use its result, remove it, or add `@allow(unused)` before it".to_string(),
            ),
            Kind::Const => (
                Code::W0008,
                format!("constant `{n}` is never used"),
                "defined here, read nowhere".to_string(),
                format!("use it, remove it, or name it `_{n}`"),
            ),
            Kind::Dim => (
                Code::W0009,
                format!("dim `{n}` is never used"),
                "no input, parameter or expression names it".to_string(),
                format!("use it, remove it, or name it `_{n}`"),
            ),
            Kind::Import => (
                Code::W0010,
                format!("`{n}` is imported but never used"),
                "unused import".to_string(),
                "remove it from the import".to_string(),
            ),
            Kind::Argument => (
                Code::W0012,
                format!("block argument `{n}` is never used"),
                "declared here, read nowhere in the block".to_string(),
                format!("callers still pass it: use it, remove it, or name it `_{n}`"),
            ),
        };
        Diagnostic::warning(code, file, name.span, message)
            .with_label(label)
            .with_help(help)
    }
}

/// A name bound in a scope, and whether anything read it.
struct Decl {
    /// `None` for loop variables and shape-pattern dims: bound, never reported (a pattern dim
    /// checks agreement between arguments even when nothing reads it).
    kind: Option<Kind>,
    name: Ident,
    used: bool,
}

/// Walks one file, scope by scope.
struct Linter {
    /// Innermost last; each maps a name to its declaration.
    scopes: Vec<HashMap<String, Decl>>,
    /// Names read where no local binding has them: file-level consts, imports, blocks.
    top_uses: HashSet<String>,
    /// Names the policy, train and target declarations read: a model's dims, say, in
    /// `labels: i32[B, S]`.
    decl_uses: HashSet<String>,
    /// What was found unused so far.
    unused: Vec<(Kind, Ident)>,
}

impl Linter {
    fn file_items(&mut self, file: &ast::File) {
        // Declarations read model names (`labels: i32[B, S]`), so they are walked first.
        for item in &file.items {
            if let Item::Decl(d) = item {
                if let Some(model) = &d.for_model {
                    self.top_uses.insert(model.name.clone());
                }
                for field in &d.fields {
                    match field {
                        Field::Assign { value, .. } | Field::Shard { value, .. } => {
                            self.expr(value)
                        }
                        Field::Typed { ty, .. } => self.tensor_type(ty),
                    }
                }
            }
        }
        self.decl_uses = std::mem::take(&mut self.top_uses);
        for item in &file.items {
            match item {
                Item::Const(c) => c.bindings.iter().for_each(|b| self.expr(&b.value)),
                Item::Block(b) => self.block(b),
                Item::Model(m) => {
                    self.scopes.push(HashMap::new());
                    self.stmts(&m.body);
                    self.close_scope();
                }
                Item::Import(_) | Item::Decl(_) => {}
            }
        }
        for item in &file.items {
            match item {
                Item::Import(import) => {
                    for name in &import.names {
                        self.report_top(Kind::Import, name.local());
                    }
                }
                Item::Const(c) if !c.public => {
                    for b in &c.bindings {
                        self.report_top(Kind::Const, &b.name);
                    }
                }
                _ => {}
            }
        }
    }

    fn report_top(&mut self, kind: Kind, name: &Ident) {
        let read = self.top_uses.contains(&name.name) || self.decl_uses.contains(&name.name);
        if !read && !name.name.starts_with('_') {
            self.unused.push((kind, name.clone()));
        }
    }

    fn block(&mut self, b: &ast::BlockItem) {
        self.scopes.push(HashMap::new());
        for p in &b.params {
            if let Some(default) = &p.default {
                self.expr(default);
            }
            if let ParamType::Tensor(ty) = &p.ty {
                self.pattern(ty);
            }
            self.declare(Some(Kind::Argument), &p.name);
        }
        match &b.ret {
            Some(RetType::Tensor(ty)) => self.tensor_type(ty),
            Some(RetType::Tuple(tys, _)) => tys.iter().for_each(|t| self.tensor_type(t)),
            None => {}
        }
        self.stmts(&b.body);
        self.close_scope();
    }

    /// A block argument's shape pattern: a bare name not yet bound binds a dim.
    fn pattern(&mut self, ty: &TensorType) {
        for dim in &ty.dims {
            if let Dim::Expr(e) = dim {
                match &e.kind {
                    ExprKind::Name(n) if self.lookup(n).is_none() => {
                        self.top_uses.insert(n.clone());
                        self.declare(
                            None,
                            &Ident {
                                name: n.clone(),
                                span: e.span,
                            },
                        );
                    }
                    _ => self.expr(e),
                }
            }
        }
    }

    fn tensor_type(&mut self, ty: &TensorType) {
        for dim in &ty.dims {
            if let Dim::Expr(e) = dim {
                self.expr(e);
            }
        }
    }

    fn stmts(&mut self, stmts: &[Stmt]) {
        for stmt in stmts {
            self.stmt(stmt);
        }
    }

    fn stmt(&mut self, stmt: &Stmt) {
        match stmt {
            Stmt::Let {
                names,
                tuple,
                value,
                ..
            } => {
                self.expr(value);
                let kind = match instance(value) {
                    Some(written) if !*tuple => Kind::Instance(written),
                    _ => Kind::Let,
                };
                names
                    .iter()
                    .for_each(|n| self.declare(Some(kind.clone()), n));
            }
            Stmt::Assign { value, .. } => self.expr(value),
            Stmt::For {
                var,
                start,
                end,
                body,
                ..
            } => {
                self.expr(start);
                self.expr(end);
                self.scopes.push(HashMap::new());
                self.declare(None, var);
                self.stmts(body);
                self.close_scope();
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                ..
            } => {
                self.expr(cond);
                for branch in std::iter::once(then).chain(otherwise) {
                    self.scopes.push(HashMap::new());
                    self.stmts(branch);
                    self.close_scope();
                }
            }
            Stmt::Return { value, .. } | Stmt::Output { value, .. } => self.expr(value),
            Stmt::Const { bindings, .. } | Stmt::Dims { bindings, .. } => {
                let kind = match stmt {
                    Stmt::Const { .. } => Kind::Const,
                    _ => Kind::Dim,
                };
                for b in bindings {
                    self.expr(&b.value);
                    self.declare(Some(kind.clone()), &b.name);
                }
            }
            Stmt::Input { name, ty, .. } => {
                self.tensor_type(ty);
                self.declare(Some(Kind::Input), name);
            }
            Stmt::Param {
                kind,
                name,
                ty,
                init,
                ..
            } => {
                self.tensor_type(ty);
                if let Some(init) = init {
                    self.expr(init);
                }
                self.declare(Some(Kind::Param(*kind)), name);
            }
        }
    }

    fn expr(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Name(n) => self.read(n),
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Bool(_)
            | ExprKind::Str(_)
            | ExprKind::Quantity { .. }
            | ExprKind::Wildcard => {}
            ExprKind::List(items) | ExprKind::Tuple(items) => {
                items.iter().for_each(|i| self.expr(i))
            }
            ExprKind::Record(fields) => fields.iter().for_each(|(_, v)| self.expr(v)),
            ExprKind::Paren(inner) | ExprKind::Unary { expr: inner, .. } => self.expr(inner),
            ExprKind::Field { base, .. } => {
                // A dotted `param encoder.pos_embedding` is read by its whole path.
                match e.dotted_name().filter(|path| self.lookup(path).is_some()) {
                    Some(path) => self.read(&path),
                    None => self.expr(base),
                }
            }
            ExprKind::Binary { lhs, rhs, .. } => {
                self.expr(lhs);
                self.expr(rhs);
            }
            ExprKind::Call { callee, args } => {
                self.expr(callee);
                args.iter().for_each(|a| self.expr(&a.value));
            }
            ExprKind::Instance {
                label, block, args, ..
            } => {
                for seg in label {
                    match seg {
                        LabelSeg::Name(_) => {}
                        LabelSeg::Index(i) => self.expr(i),
                        LabelSeg::Template(pieces) => {
                            for piece in pieces {
                                if let LabelPiece::Hole(e) = piece {
                                    self.expr(e);
                                }
                            }
                        }
                    }
                }
                self.top_uses.insert(block.name.clone());
                args.iter().for_each(|a| self.expr(&a.value));
            }
            ExprKind::Index { base, index } => {
                self.expr(base);
                self.expr(index);
            }
            ExprKind::Annotated { expr, annotation } => {
                self.expr(expr);
                for a in annotation.args.iter().flatten() {
                    self.expr(&a.value);
                }
            }
        }
    }

    fn lookup(&mut self, name: &str) -> Option<&mut Decl> {
        self.scopes.iter_mut().rev().find_map(|s| s.get_mut(name))
    }

    fn read(&mut self, name: &str) {
        match self.lookup(name) {
            Some(decl) => decl.used = true,
            None => {
                self.top_uses.insert(name.to_string());
            }
        }
    }

    /// Binds `name` in the innermost scope; a name bound again there ends the first binding.
    fn declare(&mut self, kind: Option<Kind>, name: &Ident) {
        let decl = Decl {
            kind,
            name: name.clone(),
            used: false,
        };
        let old = self
            .scopes
            .last_mut()
            .and_then(|s| s.insert(name.name.clone(), decl));
        if let Some(old) = old {
            self.finish(old);
        }
    }

    fn close_scope(&mut self) {
        let Some(scope) = self.scopes.pop() else {
            return;
        };
        let mut decls: Vec<Decl> = scope.into_values().collect();
        decls.sort_by_key(|d| d.name.span.start);
        for decl in decls {
            self.finish(decl);
        }
    }

    fn finish(&mut self, decl: Decl) {
        let Some(kind) = decl.kind else {
            return;
        };
        // A model's own names (its scope just closed) may be read by a declaration.
        let read_by_decl = self.scopes.is_empty()
            && matches!(kind, Kind::Const | Kind::Dim | Kind::Input)
            && self.decl_uses.contains(&decl.name.name);
        if !decl.used && !read_by_decl && !decl.name.name.starts_with('_') {
            self.unused.push((kind, decl.name));
        }
    }
}

/// `label: Block(…)` when `e` is a labelled instance, possibly piped into or annotated.
fn instance(e: &Expr) -> Option<String> {
    match &e.kind {
        ExprKind::Instance { label, block, .. } => {
            let written = print_label(label);
            Some(format!("{written}: {}(…)", block.name))
        }
        ExprKind::Paren(inner) | ExprKind::Annotated { expr: inner, .. } => instance(inner),
        ExprKind::Binary {
            op: BinOp::Pipe,
            rhs,
            ..
        } => instance(rhs),
        _ => None,
    }
}
