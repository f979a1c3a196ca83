//! AST → canonical source text, at a line width, with the comments of the source kept when it is
//! given. Parsing the printed text gives the same tree again, which the round-trip tests check
//! for every example and stdlib file; printing is idempotent. [`crate::format`] is the formatter
//! on top of it (`mslc fmt`).

use std::fmt::Write;

use super::ast::*;

/// Columns a formatted line aims to stay within; a group of arguments or elements that would
/// cross it is broken one element per line, each followed by a comma.
pub const WIDTH: usize = 100;

const INDENT: &str = "    ";

/// Prints a whole file in canonical form, without comments (it has none: the tree keeps none).
pub fn print_file(file: &File) -> String {
    layout(file, "", &[])
}

/// Prints one expression on one line.
pub fn print_expr(expr: &Expr) -> String {
    let mut p = Printer::new("", &[], &[], None);
    p.expr(expr, 0);
    p.out
}

/// An instance label as written, for messages that name an instance.
pub fn print_label(label: &[LabelSeg]) -> String {
    let mut p = Printer::new("", &[], &[], None);
    p.label(label);
    p.out
}

/// Prints `file`, parsed from `source`, keeping the comments whose spans are `comments` (sorted,
/// as [`crate::trivia::comments`] returns them) and the single blank lines between elements.
///
/// A comment goes where it stood relative to the items, statements and fields around it: on its
/// own line before the next one, or at the end of the line of the one it followed on the same
/// line. A comment inside an expression moves to its own line before the statement.
pub(crate) fn layout(file: &File, source: &str, comments: &[Span]) -> String {
    let mut p = Printer::new(source, comments, &file.allows, Some(WIDTH));
    for (i, item) in file.items.iter().enumerate() {
        if i > 0
            && !matches!(
                (&file.items[i - 1], item),
                (Item::Import(_), Item::Import(_))
            )
        {
            p.force_blank = true;
        }
        let next = file
            .items
            .get(i + 1)
            .map_or(usize::MAX, |n| item_span(n).start);
        p.item(item, next);
    }
    p.comments_before(usize::MAX);
    p.out
}

fn item_span(item: &Item) -> Span {
    match item {
        Item::Import(i) => i.span,
        Item::Const(c) => c.span,
        Item::Block(b) => b.span,
        Item::Model(m) => m.span,
        Item::Decl(d) => d.span,
    }
}

struct Printer<'a> {
    out: String,
    /// Statement nesting: the indentation of the lines being written.
    indent: usize,
    /// The source the tree came from (`""` when there is none) and its comments.
    source: &'a str,
    comments: &'a [Span],
    /// Index of the next comment to write.
    next_comment: usize,
    /// The file's `@allow` attributes, in source order, and the index of the next to write.
    allows: &'a [Allow],
    next_allow: usize,
    /// Where the last element written ended in the source; `None` at the start of a body.
    last_end: Option<usize>,
    /// A blank line goes before the next element whatever the source had.
    force_blank: bool,
    /// The width to break groups at; `None` prints everything on one line.
    width: Option<usize>,
    /// Characters that follow the expression being printed on its line.
    tail: usize,
}

impl<'a> Printer<'a> {
    fn new(
        source: &'a str,
        comments: &'a [Span],
        allows: &'a [Allow],
        width: Option<usize>,
    ) -> Printer<'a> {
        Printer {
            out: String::new(),
            indent: 0,
            source,
            comments,
            next_comment: 0,
            allows,
            next_allow: 0,
            last_end: None,
            force_blank: false,
            width,
            tail: 0,
        }
    }

    // ------------------------------------------------------------ lines, comments, blank lines

    /// Starts a line for an element (comment or node) that begins at `start` in the source,
    /// after a blank line when the source had one there or one is forced.
    fn begin_line(&mut self, start: usize) {
        if let Some(end) = self.last_end {
            if self.force_blank || self.blank_between(end, start) {
                self.out.push('\n');
            }
        }
        self.force_blank = false;
        for _ in 0..self.indent {
            self.out.push_str(INDENT);
        }
    }

    /// Whether the source between two elements is only whitespace (and separating commas)
    /// holding an empty line.
    fn blank_between(&self, from: usize, to: usize) -> bool {
        self.source.get(from..to).is_some_and(|gap| {
            gap.chars().all(|c| c.is_whitespace() || c == ',') && gap.matches('\n').count() >= 2
        })
    }

    /// Where the code of a node spanning `span` ends: its span can run on over the whitespace
    /// and comments that follow its last token.
    fn code_end(&self, span: Span) -> usize {
        let mut end = span.end;
        loop {
            let code = self.source.get(span.start..end).unwrap_or("").trim_end();
            end = span.start + code.len();
            let inside = self.comments.partition_point(|c| c.end < end);
            match self.comments.get(inside) {
                Some(c) if c.start >= span.start && c.start < end && end <= c.end => end = c.start,
                _ => return end,
            }
        }
    }

    fn comment_text(&self, span: Span) -> &'a str {
        self.source
            .get(span.start..span.end)
            .unwrap_or("")
            .trim_end()
    }

    /// Writes every comment that starts before `pos`, each on its own line.
    fn comments_before(&mut self, pos: usize) {
        while let Some(&span) = self.comments.get(self.next_comment) {
            if span.start >= pos {
                break;
            }
            self.next_comment += 1;
            self.begin_line(span.start);
            let text = self.comment_text(span);
            self.out.push_str(text);
            self.out.push('\n');
            self.last_end = Some(span.end);
        }
    }

    /// Writes the `@allow` attributes of the node that starts at `start`, each on its own line.
    fn allows_before(&mut self, start: usize) {
        while let Some(allow) = self.allows.get(self.next_allow) {
            if allow.target.start > start {
                break;
            }
            self.next_allow += 1;
            self.comments_before(allow.span.start);
            self.begin_line(allow.span.start);
            let _ = writeln!(self.out, "@allow({})", allow.lint.name);
            self.last_end = Some(allow.span.end);
        }
    }

    /// Appends to the line just written the comments that follow `end` on its source line and
    /// start before `bound` (the next element).
    fn trailing_comments(&mut self, end: usize, bound: usize) {
        while let Some(&span) = self.comments.get(self.next_comment) {
            let same_line = self
                .source
                .get(end..span.start)
                .is_some_and(|gap| !gap.contains('\n'));
            if span.start < end || span.start >= bound || !same_line {
                break;
            }
            self.next_comment += 1;
            self.out.pop();
            let text = self.comment_text(span);
            // Keep the column the comment stood at (comments aligned by hand stay aligned) when
            // the code leaves room and the line fits; else one space after the code.
            let line_start = self.source[..span.start].rfind('\n').map_or(0, |i| i + 1);
            let was_at = self.source[line_start..span.start].chars().count();
            let at = self.column() + 1;
            let fits = was_at + text.chars().count() <= self.width.unwrap_or(0);
            let pad = if was_at > at && fits {
                was_at - at + 1
            } else {
                1
            };
            let _ = writeln!(self.out, "{:pad$}{text}", "");
            self.last_end = Some(span.end);
        }
    }

    /// Writes one line-sized node spanning `span`: its leading comments, the comments inside it
    /// (moved before it), the line(s) `write` produces, and its trailing comments.
    fn simple(&mut self, span: Span, bound: usize, write: impl FnOnce(&mut Self)) {
        let end = self.code_end(span);
        self.comments_before(end);
        self.begin_line(span.start);
        self.tail = 0;
        write(self);
        self.out.push('\n');
        self.last_end = Some(end);
        self.trailing_comments(end, bound);
    }

    /// Writes a node with a body: `head` writes its first line (without the newline), `body`
    /// the lines inside the braces, given where the closing brace ends; comments inside go to
    /// the body's statements.
    fn compound(
        &mut self,
        span: Span,
        bound: usize,
        head: impl FnOnce(&mut Self),
        body: impl FnOnce(&mut Self, usize),
    ) {
        self.comments_before(span.start);
        self.begin_line(span.start);
        self.tail = 2;
        head(self);
        self.out.push_str(" {\n");
        let end = self.code_end(span);
        body(self, end);
        self.close("}");
        self.last_end = Some(end);
        self.trailing_comments(end, bound);
    }

    /// Writes a closing line (`}` or `} else {`) at the current indentation.
    fn close(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str(INDENT);
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn column(&self) -> usize {
        let line = self.out.rsplit('\n').next().unwrap_or("");
        line.chars().count()
    }

    /// Writes the indented lines of a body (statements or fields) whose closing brace comes
    /// before `end`, with the comments between them.
    fn body<T>(
        &mut self,
        nodes: &[T],
        end: usize,
        span: impl Fn(&T) -> Span,
        mut write: impl FnMut(&mut Self, &T, usize),
    ) {
        self.indent += 1;
        self.last_end = None;
        for (i, node) in nodes.iter().enumerate() {
            let next = nodes.get(i + 1).map_or(end, |n| span(n).start);
            write(self, node, next);
        }
        self.comments_before(end);
        self.indent -= 1;
    }

    fn stmts(&mut self, stmts: &[Stmt], end: usize) {
        self.body(stmts, end, Stmt::span, |p, s, next| p.stmt(s, next));
    }

    /// Prints `text` and returns the number of characters it printed, then takes them back.
    fn measure(&mut self, print: impl FnOnce(&mut Self)) -> usize {
        let mark = self.out.len();
        let width = self.width.take();
        print(self);
        self.width = width;
        let n = self.out[mark..].chars().count();
        self.out.truncate(mark);
        n
    }

    // ------------------------------------------------------------ items and statements

    /// Writes one item; `bound` is where the next one starts.
    fn item(&mut self, item: &Item, bound: usize) {
        self.allows_before(item_span(item).start);
        match item {
            Item::Import(import) => self.simple(import.span, bound, |p| p.import(import)),
            Item::Const(c) => self.simple(c.span, bound, |p| {
                p.out.push_str(pub_prefix(c.public));
                p.out.push_str("const ");
                p.bindings(&c.bindings);
            }),
            Item::Block(b) => self.compound(
                b.span,
                bound,
                |p| p.block_head(b),
                |p, end| p.stmts(&b.body, end),
            ),
            Item::Model(m) => self.compound(
                m.span,
                bound,
                |p| {
                    let _ = write!(p.out, "model {}", m.name.name);
                },
                |p, end| p.stmts(&m.body, end),
            ),
            Item::Decl(d) => self.compound(
                d.span,
                bound,
                |p| {
                    let _ = write!(
                        p.out,
                        "{}{} {}",
                        pub_prefix(d.public),
                        d.kind.keyword(),
                        d.name.name
                    );
                    if let Some(model) = &d.for_model {
                        let _ = write!(p.out, " for {}", model.name);
                    }
                },
                |p, end| {
                    p.body(&d.fields, end, Field::span, |p, field, next| {
                        if !p.join_field(field, next) {
                            p.simple(field.span(), next, |p| p.field(field));
                        }
                    })
                },
            ),
        }
    }

    /// Appends `field` to the line of the field before it when the source had them on one
    /// line (`memory = 64GB, bandwidth = 1600GB/s`) and the line still fits; `false` when it
    /// does not join.
    fn join_field(&mut self, field: &Field, bound: usize) -> bool {
        let span = field.span();
        let (Some(width), Some(prev_end)) = (self.width, self.last_end) else {
            return false;
        };
        let same_line = self.source.get(prev_end..span.start).is_some_and(|gap| {
            !gap.is_empty() && gap.chars().all(|c| c == ' ' || c == '\t' || c == ',')
        });
        // A comment inside the field goes on a line of its own before it.
        let end = self.code_end(span);
        let comment_inside = self
            .comments
            .get(self.next_comment)
            .is_some_and(|c| c.start < end);
        if !same_line || comment_inside || !self.out.ends_with('\n') {
            return false;
        }
        let mark = self.out.len();
        self.out.pop();
        self.out.push_str(", ");
        let line_start = self.out.len();
        self.tail = 0;
        self.field(field);
        if self.out[line_start..].contains('\n') || self.column() > width {
            self.out.truncate(mark - 1);
            self.out.push('\n');
            return false;
        }
        self.out.push('\n');
        self.last_end = Some(end);
        self.trailing_comments(end, bound);
        true
    }

    fn import(&mut self, import: &Import) {
        let _ = write!(self.out, "import {}", ".".repeat(import.dots));
        for m in &import.module {
            let _ = write!(self.out, "{}.", m.name);
        }
        let name = |p: &mut Self, n: &ImportName| {
            p.out.push_str(&n.name.name);
            if let Some(a) = &n.alias {
                let _ = write!(p.out, " as {}", a.name);
            }
        };
        if import.braced {
            self.group("{", &import.names, "}", Pad::None, name);
        } else {
            for (i, n) in import.names.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(", ");
                }
                name(self, n);
            }
        }
    }

    fn field(&mut self, field: &Field) {
        match field {
            Field::Assign { key, value, .. } => {
                let _ = write!(self.out, "{} = ", key.name);
                self.expr(value, 0);
            }
            Field::Shard { pattern, value, .. } => {
                let _ = write!(self.out, "shard {} = ", quote(&pattern.name));
                self.expr(value, 0);
            }
            Field::Typed { name, ty, .. } => {
                let _ = write!(self.out, "{}: {}", name.name, tensor_type(ty));
            }
        }
    }

    fn block_head(&mut self, b: &BlockItem) {
        let ret = match &b.ret {
            None => String::new(),
            Some(RetType::Tensor(t)) => format!(" -> {}", tensor_type(t)),
            Some(RetType::Tuple(ts, _)) => {
                let ts: Vec<String> = ts.iter().map(tensor_type).collect();
                format!(" -> ({})", ts.join(", "))
            }
        };
        let _ = write!(self.out, "{}block {}", pub_prefix(b.public), b.name.name);
        self.tail += ret.chars().count();
        self.group("(", &b.params, ")", Pad::None, |p, param| {
            let _ = write!(p.out, "{}: ", param.name.name);
            match &param.ty {
                ParamType::Tensor(t) => p.out.push_str(&tensor_type(t)),
                ParamType::Scalar(s) => p.out.push_str(&s.name),
            }
            if let Some(d) = &param.default {
                p.out.push_str(" = ");
                p.expr(d, 0);
            }
        });
        self.out.push_str(&ret);
    }

    fn bindings(&mut self, list: &[Binding]) {
        for (i, b) in list.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let _ = write!(self.out, "{} = ", b.name.name);
            self.expr(&b.value, 0);
        }
    }

    /// Writes one statement; `bound` is where the next one (or the closing brace) starts.
    fn stmt(&mut self, stmt: &Stmt, bound: usize) {
        let span = stmt.span();
        self.allows_before(span.start);
        match stmt {
            Stmt::Let {
                names,
                tuple,
                value,
                ..
            } => self.simple(span, bound, |p| {
                let names: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
                if *tuple {
                    let _ = write!(p.out, "let ({}) = ", names.join(", "));
                } else {
                    let _ = write!(p.out, "let {} = ", names.join(", "));
                }
                p.expr(value, 0);
            }),
            Stmt::Assign { name, value, .. } => self.simple(span, bound, |p| {
                let _ = write!(p.out, "{} = ", name.name);
                p.expr(value, 0);
            }),
            Stmt::For {
                var,
                start,
                end,
                body,
                ..
            } => self.compound(
                span,
                bound,
                |p| {
                    let _ = write!(p.out, "for {} in ", var.name);
                    p.expr(start, 0);
                    p.out.push_str("..");
                    p.expr(end, 0);
                },
                |p, end| p.stmts(body, end),
            ),
            Stmt::If {
                cond,
                then,
                otherwise,
                ..
            } => {
                let end = self.code_end(span);
                self.comments_before(span.start);
                self.begin_line(span.start);
                self.if_chain(cond, then, otherwise.as_deref(), end);
                self.last_end = Some(end);
                self.trailing_comments(end, bound);
            }
            Stmt::Return { value, .. } => self.simple(span, bound, |p| {
                p.out.push_str("return ");
                p.expr(value, 0);
            }),
            Stmt::Const { bindings, .. } => self.simple(span, bound, |p| {
                p.out.push_str("const ");
                p.bindings(bindings);
            }),
            Stmt::Dims { bindings, .. } => self.simple(span, bound, |p| {
                p.out.push_str("dims ");
                p.bindings(bindings);
            }),
            Stmt::Input { name, ty, .. } => self.simple(span, bound, |p| {
                let _ = write!(p.out, "input {}: {}", name.name, tensor_type(ty));
            }),
            Stmt::Output { name, value, .. } => self.simple(span, bound, |p| {
                let _ = write!(p.out, "output {} = ", name.name);
                p.expr(value, 0);
            }),
            Stmt::Param {
                kind,
                name,
                ty,
                init,
                ..
            } => self.simple(span, bound, |p| {
                let kw = match kind {
                    ParamKind::Param => "param",
                    ParamKind::Buffer => "buffer",
                };
                let _ = write!(p.out, "{kw} {}: {}", name.name, tensor_type(ty));
                if let Some(init) = init {
                    p.out.push_str(" ~ ");
                    p.expr(init, 0);
                }
            }),
        }
    }

    /// Writes `if … { } else if … { } else { }` from `if` on (the line is started), for a chain
    /// that ends at `end` in the source.
    fn if_chain(&mut self, cond: &Expr, then: &[Stmt], otherwise: Option<&[Stmt]>, end: usize) {
        self.out.push_str("if ");
        self.tail = 2;
        self.expr(cond, 0);
        self.out.push_str(" {\n");
        let then_end = match otherwise {
            Some([first, ..]) => first.span().start,
            _ => end,
        };
        self.stmts(then, then_end);
        match otherwise {
            None => self.close("}"),
            Some(
                [Stmt::If {
                    cond,
                    then,
                    otherwise,
                    ..
                }],
            ) => {
                for _ in 0..self.indent {
                    self.out.push_str(INDENT);
                }
                self.out.push_str("} else ");
                self.if_chain(cond, then, otherwise.as_deref(), end);
            }
            Some(body) => {
                self.close("} else {");
                self.stmts(body, end);
                self.close("}");
            }
        }
    }

    // ------------------------------------------------------------ expressions

    /// Writes a bracketed, comma-separated group: on the current line when it fits (with the
    /// `tail` that follows it), else one element per line, each followed by a comma.
    fn group<T>(
        &mut self,
        open: &str,
        items: &[T],
        close: &str,
        pad: Pad,
        mut elem: impl FnMut(&mut Self, &T),
    ) {
        let tail = self.tail;
        let mark = self.out.len();
        let col = self.column();
        let width = self.width.take();
        self.out.push_str(open);
        let padded = pad == Pad::Spaces && !items.is_empty();
        if padded {
            self.out.push(' ');
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            elem(self, item);
        }
        if pad == Pad::OneTuple && items.len() == 1 {
            self.out.push(',');
        }
        if padded {
            self.out.push(' ');
        }
        self.out.push_str(close);
        self.width = width;
        let Some(width) = width else {
            return;
        };
        if items.is_empty() || col + self.out[mark..].chars().count() + tail <= width {
            return;
        }
        self.out.truncate(mark);
        self.out.push_str(open);
        self.out.push('\n');
        self.indent += 1;
        for item in items {
            for _ in 0..self.indent {
                self.out.push_str(INDENT);
            }
            self.tail = 1;
            elem(self, item);
            self.out.push_str(",\n");
        }
        self.indent -= 1;
        for _ in 0..self.indent {
            self.out.push_str(INDENT);
        }
        self.out.push_str(close);
        self.tail = tail;
    }

    fn expr(&mut self, expr: &Expr, min_prec: u8) {
        let tail = self.tail;
        match &expr.kind {
            ExprKind::Int(v) => {
                let _ = write!(self.out, "{v}");
            }
            ExprKind::Float(v) => {
                let written = self.source.get(expr.span.start..expr.span.end);
                match written.filter(|w| w.parse::<f64>() == Ok(*v)) {
                    Some(w) => self.out.push_str(w),
                    None => self.out.push_str(&float_text(*v)),
                }
            }
            ExprKind::Bool(b) => {
                let _ = write!(self.out, "{b}");
            }
            ExprKind::Str(s) => self.out.push_str(&quote(s)),
            ExprKind::Quantity { text, unit, .. } => {
                let _ = write!(self.out, "{text}{unit}");
            }
            ExprKind::Name(n) => self.out.push_str(n),
            ExprKind::Wildcard => self.out.push('_'),
            ExprKind::List(items) => self.group("[", items, "]", Pad::None, |p, e| p.expr(e, 0)),
            ExprKind::Tuple(items) => {
                self.group("(", items, ")", Pad::OneTuple, |p, e| p.expr(e, 0))
            }
            ExprKind::Paren(inner) => {
                self.out.push('(');
                self.tail += 1;
                self.expr(inner, 0);
                self.out.push(')');
            }
            ExprKind::Record(fields) => self.group("{", fields, "}", Pad::Spaces, |p, (k, v)| {
                let _ = write!(p.out, "{}: ", k.name);
                p.expr(v, 0);
            }),
            ExprKind::Unary { op, expr: inner } => {
                let wrap = min_prec > 7;
                if wrap {
                    self.out.push('(');
                    self.tail += 1;
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
                    self.tail += 1;
                }
                let col = self.column();
                let fits = match self.width {
                    None => true,
                    Some(width) => col + self.measure(|p| p.expr(expr, prec)) + tail <= width,
                };
                if fits {
                    let width = self.width.take();
                    self.expr(lhs, prec);
                    let _ = write!(self.out, " {} ", op.symbol());
                    self.expr(rhs, prec + 1);
                    self.width = width;
                } else {
                    self.chain(expr, prec);
                }
                if wrap {
                    self.out.push(')');
                }
            }
            ExprKind::Call { callee, args } => {
                self.expr(callee, 8);
                self.tail = tail;
                self.args(args);
            }
            ExprKind::Instance {
                label, block, args, ..
            } => {
                self.label(label);
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
                self.tail += 1;
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
                    self.tail += 1;
                }
                let after = self.tail;
                let suffix = self.measure(|p| p.annotation(annotation));
                self.tail += suffix;
                let nested = matches!(inner.kind, ExprKind::Annotated { .. });
                self.expr(inner, if nested { 0 } else { 1 });
                self.tail = after;
                self.annotation(annotation);
                if wrap {
                    self.out.push(')');
                }
            }
        }
        self.tail = tail;
    }

    /// Writes a chain of operators of one precedence (`a |> f |> g`) that does not fit on the
    /// line: the first operand, then each operator and its operand on a line of its own, one
    /// level deeper.
    fn chain(&mut self, expr: &Expr, prec: u8) {
        let tail = self.tail;
        let mut rest = Vec::new();
        let mut first = expr;
        while let ExprKind::Binary { op, lhs, rhs } = &first.kind {
            if op.precedence() != prec {
                break;
            }
            rest.push((*op, rhs));
            first = lhs;
        }
        self.tail = 0;
        self.expr(first, prec);
        self.indent += 1;
        for (i, (op, operand)) in rest.iter().rev().enumerate() {
            self.out.push('\n');
            for _ in 0..self.indent {
                self.out.push_str(INDENT);
            }
            let _ = write!(self.out, "{} ", op.symbol());
            self.tail = if i + 1 == rest.len() { tail } else { 0 };
            self.expr(operand, prec + 1);
        }
        self.indent -= 1;
        self.tail = tail;
    }

    fn annotation(&mut self, annotation: &Annotation) {
        let _ = write!(self.out, " @{}", annotation.name.name);
        if let Some(args) = &annotation.args {
            self.args(args);
        }
    }

    /// An instance label, `model.layers[i].encoder_layer_{i}`.
    fn label(&mut self, label: &[LabelSeg]) {
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
                LabelSeg::Template(pieces) => {
                    if i > 0 {
                        self.out.push('.');
                    }
                    for piece in pieces {
                        match piece {
                            LabelPiece::Text(t) => self.out.push_str(&t.name),
                            LabelPiece::Hole(e) => {
                                self.out.push('{');
                                self.expr(e, 0);
                                self.out.push('}');
                            }
                        }
                    }
                }
            }
        }
    }

    fn args(&mut self, args: &[Arg]) {
        self.group("(", args, ")", Pad::None, |p, a| {
            if let Some(n) = &a.name {
                let _ = write!(p.out, "{}: ", n.name);
            }
            p.expr(&a.value, 0);
        });
    }
}

/// How a group is written on one line besides its elements.
#[derive(Clone, Copy, PartialEq)]
enum Pad {
    /// `[a, b]`
    None,
    /// `{ a: 1 }`
    Spaces,
    /// `(a,)` for a tuple of one.
    OneTuple,
}

fn pub_prefix(public: bool) -> &'static str {
    if public {
        "pub "
    } else {
        ""
    }
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
