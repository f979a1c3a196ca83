//! What one file's syntax tree says to an editor: where names are defined and used (by body,
//! so locals resolve to their own model or block), `let` bindings, instance labels, policy
//! fields and the outline. Built by one walk over the tree; resolution across files uses the
//! checker's module table.

use lsp_types::SymbolKind;
use mslc_syntax::ast::{
    self, DeclKind, Dim, Expr, ExprKind, Field, Item, LabelSeg, ParamType, RetType, Span, Stmt,
};

/// A definition of a name.
#[derive(Clone, Debug)]
pub struct Def {
    /// The name.
    pub name: String,
    /// Where the name is written.
    pub span: Span,
    /// The model or block body it belongs to; `None` at the top level.
    pub body: Option<usize>,
}

/// A use of a name (an expression, a block named by an instance, an imported name).
#[derive(Clone, Debug)]
pub struct Use {
    /// The name looked up.
    pub name: String,
    /// Where it is written.
    pub span: Span,
    /// The body it is in; `None` at the top level.
    pub body: Option<usize>,
}

/// `label: Block(...)`.
#[derive(Clone, Debug)]
pub struct Instance {
    /// The label.
    pub label: Span,
    /// The whole instance expression.
    pub expr: Span,
    /// The label's path with indices as `*` (`layers.*`).
    pub pattern: String,
    /// Whether it is written in a model body (its path is then the full parameter path).
    pub in_model: bool,
}

/// A `key = value` field of a declaration.
#[derive(Clone, Debug)]
pub struct FieldKey {
    /// The declaration's kind.
    pub kind: DeclKind,
    /// The key.
    pub key: String,
    /// Where the key is written.
    pub span: Span,
}

/// One entry of the outline.
#[derive(Clone, Debug)]
pub struct Outline {
    /// Its name.
    pub name: String,
    /// What kind of symbol.
    pub kind: SymbolKind,
    /// The whole item.
    pub span: Span,
    /// Its name's span.
    pub name_span: Span,
    /// Entries inside it.
    pub children: Vec<Outline>,
}

/// Everything the editor needs from one file's tree.
#[derive(Clone, Debug, Default)]
pub struct FileIndex {
    /// Definitions.
    pub defs: Vec<Def>,
    /// Uses.
    pub uses: Vec<Use>,
    /// `let` names with the span of the value they name (single names only).
    pub lets: Vec<(Span, Span)>,
    /// Instances.
    pub instances: Vec<Instance>,
    /// Declaration fields.
    pub fields: Vec<FieldKey>,
    /// `import` module paths: (span of the path, a name it imports).
    pub import_paths: Vec<(Span, String)>,
    /// The outline.
    pub outline: Vec<Outline>,
    bodies: usize,
    in_model: bool,
}

impl FileIndex {
    /// Indexes a parsed file.
    pub fn new(file: &ast::File) -> FileIndex {
        let mut ix = FileIndex::default();
        for item in &file.items {
            ix.item(item);
        }
        ix
    }

    fn item(&mut self, item: &Item) {
        match item {
            Item::Import(import) => {
                if let (Some(first), Some(last), Some(name)) = (
                    import.module.first(),
                    import.module.last(),
                    import.names.first(),
                ) {
                    self.import_paths
                        .push((first.span.to(last.span), name.local().name.clone()));
                }
                for n in &import.names {
                    let local = n.local().name.clone();
                    self.uses.push(Use {
                        name: local.clone(),
                        span: n.name.span,
                        body: None,
                    });
                    if let Some(alias) = &n.alias {
                        self.uses.push(Use {
                            name: local,
                            span: alias.span,
                            body: None,
                        });
                    }
                }
            }
            Item::Const(c) => {
                for b in &c.bindings {
                    self.expr(&b.value, None);
                    self.outline.push(leaf(
                        &b.name,
                        SymbolKind::CONSTANT,
                        b.name.span.to(b.value.span),
                    ));
                }
            }
            Item::Block(b) => {
                let body = Some(self.new_body());
                for p in &b.params {
                    match &p.ty {
                        ParamType::Tensor(t) => self.pattern(t, body),
                        ParamType::Scalar(_) => {}
                    }
                    if let Some(d) = &p.default {
                        self.expr(d, body);
                    }
                    self.def(&p.name, body);
                }
                match &b.ret {
                    Some(RetType::Tensor(t)) => self.pattern(t, body),
                    Some(RetType::Tuple(ts, _)) => ts.iter().for_each(|t| self.pattern(t, body)),
                    None => {}
                }
                let start = self.outline.len();
                self.stmts(&b.body, body);
                let children = self.outline.split_off(start);
                self.outline.push(Outline {
                    children,
                    ..leaf(&b.name, SymbolKind::FUNCTION, b.span)
                });
            }
            Item::Model(m) => {
                let body = Some(self.new_body());
                self.in_model = true;
                let start = self.outline.len();
                self.stmts(&m.body, body);
                self.in_model = false;
                let children = self.outline.split_off(start);
                self.outline.push(Outline {
                    children,
                    ..leaf(&m.name, SymbolKind::CLASS, m.span)
                });
            }
            Item::Decl(d) => {
                if let Some(m) = &d.for_model {
                    self.use_ident(m, None);
                }
                let mut children = Vec::new();
                for f in &d.fields {
                    match f {
                        Field::Assign { key, value, span } => {
                            self.fields.push(FieldKey {
                                kind: d.kind,
                                key: key.name.clone(),
                                span: key.span,
                            });
                            self.expr(value, None);
                            children.push(leaf(key, SymbolKind::FIELD, *span));
                        }
                        Field::Shard { value, .. } => self.expr(value, None),
                        Field::Typed { name, ty, span } => {
                            self.pattern(ty, None);
                            children.push(leaf(name, SymbolKind::FIELD, *span));
                        }
                    }
                }
                self.outline.push(Outline {
                    children,
                    ..leaf(&d.name, SymbolKind::STRUCT, d.span)
                });
            }
        }
    }

    fn new_body(&mut self) -> usize {
        self.bodies += 1;
        self.bodies - 1
    }

    fn def(&mut self, name: &ast::Ident, body: Option<usize>) {
        self.defs.push(Def {
            name: name.name.clone(),
            span: name.span,
            body,
        });
    }

    fn use_ident(&mut self, name: &ast::Ident, body: Option<usize>) {
        self.uses.push(Use {
            name: name.name.clone(),
            span: name.span,
            body,
        });
    }

    /// A shape pattern: in a block signature a name not yet bound binds a dim.
    fn pattern(&mut self, t: &ast::TensorType, body: Option<usize>) {
        for d in &t.dims {
            let Dim::Expr(e) = d else { continue };
            match &e.kind {
                ExprKind::Name(n)
                    if body.is_some()
                        && !self.defs.iter().any(|d| d.body == body && &d.name == n) =>
                {
                    self.defs.push(Def {
                        name: n.clone(),
                        span: e.span,
                        body,
                    });
                }
                _ => self.expr(e, body),
            }
        }
    }

    fn stmts(&mut self, stmts: &[Stmt], body: Option<usize>) {
        for s in stmts {
            self.stmt(s, body);
        }
    }

    fn stmt(&mut self, stmt: &Stmt, body: Option<usize>) {
        match stmt {
            Stmt::Let {
                names,
                tuple,
                value,
                ..
            } => {
                self.expr(value, body);
                if let (false, Some(name)) = (tuple, names.first()) {
                    self.lets.push((name.span, value.span));
                }
                for n in names {
                    self.def(n, body);
                    self.outline.push(leaf(n, SymbolKind::VARIABLE, n.span));
                }
            }
            Stmt::Assign { name, value, .. } => {
                self.expr(value, body);
                self.use_ident(name, body);
            }
            Stmt::For {
                var,
                start,
                end,
                body: stmts,
                ..
            } => {
                self.expr(start, body);
                self.expr(end, body);
                self.def(var, body);
                self.stmts(stmts, body);
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                ..
            } => {
                self.expr(cond, body);
                self.stmts(then, body);
                if let Some(o) = otherwise {
                    self.stmts(o, body);
                }
            }
            Stmt::Return { value, .. } => self.expr(value, body),
            Stmt::Const { bindings, .. } | Stmt::Dims { bindings, .. } => {
                let symbol = match stmt {
                    Stmt::Dims { .. } => SymbolKind::TYPE_PARAMETER,
                    _ => SymbolKind::CONSTANT,
                };
                for b in bindings {
                    self.expr(&b.value, body);
                    self.def(&b.name, body);
                    self.outline
                        .push(leaf(&b.name, symbol, b.name.span.to(b.value.span)));
                }
            }
            Stmt::Input { name, ty, span } => {
                self.shape_uses(ty, body);
                self.def(name, body);
                self.outline.push(leaf(name, SymbolKind::VARIABLE, *span));
            }
            Stmt::Output { name, value, span } => {
                self.expr(value, body);
                self.outline.push(leaf(name, SymbolKind::PROPERTY, *span));
            }
            Stmt::Param { name, ty, init, .. } => {
                self.shape_uses(ty, body);
                if let Some(i) = init {
                    self.expr(i, body);
                }
                self.def(name, body);
            }
        }
    }

    /// Shapes of inputs and `param`s only use names.
    fn shape_uses(&mut self, t: &ast::TensorType, body: Option<usize>) {
        for d in &t.dims {
            if let Dim::Expr(e) = d {
                self.expr(e, body);
            }
        }
    }

    fn expr(&mut self, e: &Expr, body: Option<usize>) {
        match &e.kind {
            ExprKind::Name(n) => self.uses.push(Use {
                name: n.clone(),
                span: e.span,
                body,
            }),
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Bool(_)
            | ExprKind::Str(_)
            | ExprKind::Quantity { .. }
            | ExprKind::Wildcard => {}
            ExprKind::List(items) | ExprKind::Tuple(items) => {
                items.iter().for_each(|i| self.expr(i, body));
            }
            ExprKind::Paren(inner) => self.expr(inner, body),
            ExprKind::Record(fields) => fields.iter().for_each(|(_, v)| self.expr(v, body)),
            ExprKind::Unary { expr, .. } => self.expr(expr, body),
            ExprKind::Binary { lhs, rhs, .. } => {
                self.expr(lhs, body);
                self.expr(rhs, body);
            }
            ExprKind::Call { callee, args } => {
                // A callee that is a plain name is a builtin, not a variable.
                if !matches!(callee.kind, ExprKind::Name(_)) {
                    self.expr(callee, body);
                }
                args.iter().for_each(|a| self.expr(&a.value, body));
            }
            ExprKind::Instance {
                label,
                label_span,
                block,
                args,
            } => {
                let pattern: Vec<String> = label
                    .iter()
                    .map(|seg| match seg {
                        LabelSeg::Name(n) => n.name.clone(),
                        LabelSeg::Index(i) => {
                            self.expr(i, body);
                            "*".to_string()
                        }
                        // `encoder_layer_{i}` matches any one segment, as `[i]` does.
                        LabelSeg::Template(pieces) => {
                            for piece in pieces {
                                if let ast::LabelPiece::Hole(h) = piece {
                                    self.expr(h, body);
                                }
                            }
                            "*".to_string()
                        }
                    })
                    .collect();
                self.instances.push(Instance {
                    label: *label_span,
                    expr: e.span,
                    pattern: pattern.join("."),
                    in_model: self.in_model,
                });
                self.use_ident(block, None);
                args.iter().for_each(|a| self.expr(&a.value, body));
            }
            ExprKind::Field { base, .. } => self.expr(base, body),
            ExprKind::Index { base, index } => {
                self.expr(base, body);
                self.expr(index, body);
            }
            ExprKind::Annotated { expr, annotation } => {
                self.expr(expr, body);
                for a in annotation.args.iter().flatten() {
                    self.expr(&a.value, body);
                }
            }
        }
    }
}

fn leaf(name: &ast::Ident, kind: SymbolKind, span: Span) -> Outline {
    Outline {
        name: name.name.clone(),
        kind,
        span: span.to(name.span),
        name_span: name.span,
        children: Vec::new(),
    }
}
