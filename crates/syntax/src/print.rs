//! AST → canonical source text. Parsing the printed text gives the same tree again, which the
//! round-trip tests check for every example and stdlib file. Comments are not kept.

use std::fmt::Write;

use super::ast::*;

/// Prints a whole file in canonical form.
pub fn print_file(file: &File) -> String {
    let mut p = Printer {
        out: String::new(),
        indent: 0,
    };
    for (i, item) in file.items.iter().enumerate() {
        if i > 0
            && !matches!(
                (&file.items[i - 1], item),
                (Item::Import(_), Item::Import(_))
            )
        {
            p.out.push('\n');
        }
        p.item(item);
    }
    p.out
}

/// Prints one expression.
pub fn print_expr(expr: &Expr) -> String {
    let mut p = Printer {
        out: String::new(),
        indent: 0,
    };
    p.expr(expr, 0);
    p.out
}

struct Printer {
    out: String,
    indent: usize,
}

impl Printer {
    fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn item(&mut self, item: &Item) {
        match item {
            Item::Import(import) => {
                let mut s = format!("import {}", ".".repeat(import.dots));
                let module: Vec<&str> = import.module.iter().map(|m| m.name.as_str()).collect();
                s.push_str(&module.join("."));
                if !module.is_empty() {
                    s.push('.');
                }
                let names: Vec<String> = import
                    .names
                    .iter()
                    .map(|n| match &n.alias {
                        Some(a) => format!("{} as {}", n.name.name, a.name),
                        None => n.name.name.clone(),
                    })
                    .collect();
                if import.braced {
                    let _ = write!(s, "{{{}}}", names.join(", "));
                } else {
                    s.push_str(&names.join(", "));
                }
                self.line(&s);
            }
            Item::Const(c) => {
                let s = format!("{}const {}", pub_prefix(c.public), bindings(&c.bindings));
                self.line(&s);
            }
            Item::Block(b) => self.block(b),
            Item::Model(m) => {
                self.line(&format!("model {} {{", m.name.name));
                self.stmts(&m.body);
                self.line("}");
            }
            Item::Decl(d) => {
                let mut head = format!(
                    "{}{} {}",
                    pub_prefix(d.public),
                    d.kind.keyword(),
                    d.name.name
                );
                if let Some(model) = &d.for_model {
                    let _ = write!(head, " for {}", model.name);
                }
                head.push_str(" {");
                self.line(&head);
                self.indent += 1;
                for field in &d.fields {
                    let text = match field {
                        Field::Assign { key, value, .. } => {
                            format!("{} = {}", key.name, print_expr(value))
                        }
                        Field::Shard { pattern, value, .. } => {
                            format!("shard {} = {}", quote(&pattern.name), print_expr(value))
                        }
                        Field::Typed { name, ty, .. } => {
                            format!("{}: {}", name.name, tensor_type(ty))
                        }
                    };
                    self.line(&text);
                }
                self.indent -= 1;
                self.line("}");
            }
        }
    }

    fn block(&mut self, b: &BlockItem) {
        let params: Vec<String> = b
            .params
            .iter()
            .map(|p| {
                let ty = match &p.ty {
                    ParamType::Tensor(t) => tensor_type(t),
                    ParamType::Scalar(s) => s.name.clone(),
                };
                match &p.default {
                    Some(d) => format!("{}: {ty} = {}", p.name.name, print_expr(d)),
                    None => format!("{}: {ty}", p.name.name),
                }
            })
            .collect();
        let ret = match &b.ret {
            None => String::new(),
            Some(RetType::Tensor(t)) => format!(" -> {}", tensor_type(t)),
            Some(RetType::Tuple(ts, _)) => {
                let ts: Vec<String> = ts.iter().map(tensor_type).collect();
                format!(" -> ({})", ts.join(", "))
            }
        };
        self.line(&format!(
            "{}block {}({}){ret} {{",
            pub_prefix(b.public),
            b.name.name,
            params.join(", ")
        ));
        self.stmts(&b.body);
        self.line("}");
    }

    fn stmts(&mut self, stmts: &[Stmt]) {
        self.indent += 1;
        for s in stmts {
            self.stmt(s);
        }
        self.indent -= 1;
    }

    fn stmt(&mut self, stmt: &Stmt) {
        match stmt {
            Stmt::Let {
                names,
                tuple,
                value,
                ..
            } => {
                let names: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
                let pattern = if *tuple {
                    format!("({})", names.join(", "))
                } else {
                    names.join(", ")
                };
                self.line(&format!("let {pattern} = {}", print_expr(value)));
            }
            Stmt::Assign { name, value, .. } => {
                self.line(&format!("{} = {}", name.name, print_expr(value)))
            }
            Stmt::For {
                var,
                start,
                end,
                body,
                ..
            } => {
                self.line(&format!(
                    "for {} in {}..{} {{",
                    var.name,
                    print_expr(start),
                    print_expr(end)
                ));
                self.stmts(body);
                self.line("}");
            }
            Stmt::If { .. } => {
                let mut head = String::new();
                self.if_chain(stmt, &mut head);
            }
            Stmt::Return { value, .. } => self.line(&format!("return {}", print_expr(value))),
            Stmt::Const { bindings: b, .. } => self.line(&format!("const {}", bindings(b))),
            Stmt::Dims { bindings: b, .. } => self.line(&format!("dims {}", bindings(b))),
            Stmt::Input { name, ty, .. } => {
                self.line(&format!("input {}: {}", name.name, tensor_type(ty)))
            }
            Stmt::Output { name, value, .. } => {
                self.line(&format!("output {} = {}", name.name, print_expr(value)))
            }
            Stmt::Param {
                kind,
                name,
                ty,
                init,
                ..
            } => {
                let kw = match kind {
                    ParamKind::Param => "param",
                    ParamKind::Buffer => "buffer",
                };
                let mut s = format!("{kw} {}: {}", name.name, tensor_type(ty));
                if let Some(init) = init {
                    let _ = write!(s, " ~ {}", print_expr(init));
                }
                self.line(&s);
            }
        }
    }

    /// Prints `if … { } else if … { } else { }` with `prefix` (`""` or `"} else "`) before `if`.
    fn if_chain(&mut self, stmt: &Stmt, prefix: &mut String) {
        let Stmt::If {
            cond,
            then,
            otherwise,
            ..
        } = stmt
        else {
            return;
        };
        self.line(&format!("{prefix}if {} {{", print_expr(cond)));
        self.stmts(then);
        match otherwise.as_deref() {
            None => self.line("}"),
            Some([nested @ Stmt::If { .. }]) => {
                let mut p = "} else ".to_string();
                self.if_chain(nested, &mut p);
            }
            Some(body) => {
                self.line("} else {");
                self.stmts(body);
                self.line("}");
            }
        }
    }

    fn expr(&mut self, expr: &Expr, min_prec: u8) {
        match &expr.kind {
            ExprKind::Int(v) => {
                let _ = write!(self.out, "{v}");
            }
            ExprKind::Float(v) => self.out.push_str(&float_text(*v)),
            ExprKind::Bool(b) => {
                let _ = write!(self.out, "{b}");
            }
            ExprKind::Str(s) => self.out.push_str(&quote(s)),
            ExprKind::Quantity { text, unit, .. } => {
                let _ = write!(self.out, "{text}{unit}");
            }
            ExprKind::Name(n) => self.out.push_str(n),
            ExprKind::Wildcard => self.out.push('_'),
            ExprKind::List(items) => {
                self.out.push('[');
                self.comma_list(items);
                self.out.push(']');
            }
            ExprKind::Tuple(items) => {
                self.out.push('(');
                self.comma_list(items);
                if items.len() == 1 {
                    self.out.push(',');
                }
                self.out.push(')');
            }
            ExprKind::Paren(inner) => {
                self.out.push('(');
                self.expr(inner, 0);
                self.out.push(')');
            }
            ExprKind::Record(fields) => {
                self.out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    let _ = write!(self.out, "{}: ", k.name);
                    self.expr(v, 0);
                }
                self.out.push('}');
            }
            ExprKind::Unary { op, expr: inner } => {
                let wrap = min_prec > 7;
                if wrap {
                    self.out.push('(');
                }
                self.out.push(if *op == UnOp::Neg { '-' } else { '!' });
                self.expr(inner, 7);
                if wrap {
                    self.out.push(')');
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let prec = op.precedence();
                let wrap = prec < min_prec;
                if wrap {
                    self.out.push('(');
                }
                self.expr(lhs, prec);
                let _ = write!(self.out, " {} ", op.symbol());
                self.expr(rhs, prec + 1);
                if wrap {
                    self.out.push(')');
                }
            }
            ExprKind::Call { callee, args } => {
                self.expr(callee, 8);
                self.args(args);
            }
            ExprKind::Instance {
                label, block, args, ..
            } => {
                for (i, seg) in label.iter().enumerate() {
                    match seg {
                        LabelSeg::Name(n) => {
                            if i > 0 {
                                self.out.push('.');
                            }
                            self.out.push_str(&n.name);
                        }
                        LabelSeg::Index(e) => {
                            self.out.push('[');
                            self.expr(e, 0);
                            self.out.push(']');
                        }
                    }
                }
                let _ = write!(self.out, ": {}", block.name);
                self.args(args);
            }
            ExprKind::Field { base, name } => {
                self.expr(base, 8);
                let _ = write!(self.out, ".{}", name.name);
            }
            ExprKind::Index { base, index } => {
                self.expr(base, 8);
                self.out.push('[');
                self.expr(index, 0);
                self.out.push(']');
            }
            ExprKind::Annotated {
                expr: inner,
                annotation,
            } => {
                let wrap = min_prec > 0;
                if wrap {
                    self.out.push('(');
                }
                let nested = matches!(inner.kind, ExprKind::Annotated { .. });
                self.expr(inner, if nested { 0 } else { 1 });
                let _ = write!(self.out, " @{}", annotation.name.name);
                if let Some(args) = &annotation.args {
                    self.args(args);
                }
                if wrap {
                    self.out.push(')');
                }
            }
        }
    }

    fn comma_list(&mut self, items: &[Expr]) {
        for (i, e) in items.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            self.expr(e, 0);
        }
    }

    fn args(&mut self, args: &[Arg]) {
        self.out.push('(');
        for (i, a) in args.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            if let Some(n) = &a.name {
                let _ = write!(self.out, "{}: ", n.name);
            }
            self.expr(&a.value, 0);
        }
        self.out.push(')');
    }
}

fn pub_prefix(public: bool) -> &'static str {
    if public {
        "pub "
    } else {
        ""
    }
}

fn bindings(list: &[Binding]) -> String {
    let parts: Vec<String> = list
        .iter()
        .map(|b| format!("{} = {}", b.name.name, print_expr(&b.value)))
        .collect();
    parts.join(", ")
}

fn tensor_type(t: &TensorType) -> String {
    let dims: Vec<String> = t
        .dims
        .iter()
        .map(|d| match d {
            Dim::Ellipsis(_) => "...".to_string(),
            Dim::Wildcard(_) => "_".to_string(),
            Dim::Expr(e) => print_expr(e),
        })
        .collect();
    let dtype = t.dtype.as_ref().map_or("", |d| d.name.as_str());
    format!("{dtype}[{}]", dims.join(", "))
}

/// A float that reads back as the same value and as a float, not an int.
fn float_text(v: f64) -> String {
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
