//! The elaborator: runs a model's statements at compile time — binding names, unrolling loops,
//! inlining block instances — and emits every tensor operation, with its shape and dtype
//! checked by the op registry, into a flat [`Model`]. Errors become diagnostics and poison
//! values, so one mistake is reported once and checking goes on.

use std::collections::{HashMap, HashSet};

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_core::ops::{self, AttrValue, Attrs, DType, Op, TensorType};
use mslc_syntax::ast::{self, BinOp, Expr, ExprKind, Span, Stmt, UnOp};

use super::modules::{ItemRef, Modules};
use super::suggest;
use super::value::Value;
use mslc_core::program::{Loc, Model, Node, ValueId};

/// Most evaluation steps one model may take, so a runaway loop ends with a diagnostic (E0211)
/// instead of hanging. A step is one expression evaluated or one loop iteration begun; an op
/// emitted or a parameter declared costs [`NODE_STEPS`], as those are what take time and memory
/// later. The largest example, GPT-3 175B (96 layers), takes about 70,000; the limit is reached
/// in well under a second.
pub const MAX_STEPS: u64 = 1_000_000;
/// Steps charged for one emitted op or declared parameter.
pub const NODE_STEPS: u64 = 10;
/// Deepest nesting of block instances.
pub const MAX_INSTANCE_DEPTH: usize = 64;

/// Per expression (file and span), the first tensor value it evaluated to: what an editor
/// shows on hover. A block instantiated many times keeps its first instance's types.
pub type ExprTypes = HashMap<(FileId, Span), ValueId>;

/// A name bound in a scope.
#[derive(Clone, Debug)]
pub struct Binding {
    /// Its value.
    pub value: Value,
    /// Where it was bound.
    pub span: Span,
}

/// The evaluation context of one model body or block instance.
#[derive(Clone)]
pub struct Frame {
    /// Module whose top-level names are visible.
    pub module: usize,
    /// File the statements are in.
    pub file: FileId,
    /// Innermost scope last.
    pub scopes: Vec<HashMap<String, Binding>>,
    /// Instance path, e.g. `["model", "layers", "0", "self_attn"]`.
    pub prefix: Vec<String>,
    /// Where this block instance was created, for "in this instance" labels.
    pub call_site: Option<Loc>,
    /// Name of the block being instantiated; `None` in a model body.
    pub block: Option<String>,
    /// Value of the first `return` executed, with the statement's span.
    pub returned: Option<(Value, Span)>,
}

impl Frame {
    /// A fresh top-level frame in `module`'s file: no instance path, no call site.
    pub fn top(module: usize, file: FileId) -> Frame {
        Frame {
            module,
            file,
            scopes: vec![HashMap::new()],
            prefix: Vec::new(),
            call_site: None,
            block: None,
            returned: None,
        }
    }

    /// Looks a name up from the innermost scope outwards.
    pub fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    /// Binds a name in the innermost scope.
    pub fn bind(&mut self, name: &str, value: Value, span: Span) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), Binding { value, span });
        }
    }

    /// Rebinds an existing name where it lives; false when it is not bound anywhere.
    pub fn rebind(&mut self, name: &str, value: Value) -> bool {
        for scope in self.scopes.iter_mut().rev() {
            if let Some(b) = scope.get_mut(name) {
                b.value = value;
                return true;
            }
        }
        false
    }

    /// The instance path as a dotted string.
    pub fn origin(&self) -> String {
        self.prefix.join(".")
    }

    fn loc(&self, span: Span) -> Loc {
        Loc {
            file: self.file,
            span,
        }
    }
}

/// An evaluated call argument.
#[derive(Clone, Debug)]
pub struct ArgValue {
    /// `name:` if named.
    pub name: Option<ast::Ident>,
    /// The value.
    pub value: Value,
    /// The argument expression's span.
    pub span: Span,
}

/// Elaborates models of a set of loaded modules.
pub struct Elaborator<'a> {
    /// All modules.
    pub modules: &'a Modules,
    /// Diagnostics found so far (deduplicated when taken).
    pub diags: Vec<Diagnostic>,
    /// The model under construction.
    pub model: Model,
    /// Parameter paths defined so far, with where.
    pub param_paths: HashMap<String, Loc>,
    /// Current instance depth.
    pub depth: usize,
    /// Command-line overrides of consts and dims.
    pub overrides: super::model::Overrides,
    /// Whether an `output` statement ran (even one whose value failed).
    pub saw_output: bool,
    /// Overrides applied so far: (is a dim, name).
    pub used_overrides: HashSet<(bool, String)>,
    /// The model's `const`, `dims`, `input` and `output` names so far: what each is, and where.
    pub model_names: HashMap<String, (&'static str, Loc)>,
    /// The first tensor each expression evaluated to, by where it is written (for editors).
    pub expr_types: ExprTypes,
    /// Whether a name whose import failed was used: the model is incomplete though that error
    /// was reported elsewhere.
    pub poisoned: bool,
    const_cache: HashMap<(usize, String), Value>,
    const_busy: HashSet<(usize, String)>,
    steps: u64,
    out_of_steps: bool,
}

impl<'a> Elaborator<'a> {
    /// An elaborator filling `model`.
    pub fn new(modules: &'a Modules, model: Model) -> Self {
        Elaborator {
            modules,
            diags: Vec::new(),
            model,
            param_paths: HashMap::new(),
            depth: 0,
            overrides: Default::default(),
            saw_output: false,
            used_overrides: HashSet::new(),
            model_names: HashMap::new(),
            expr_types: ExprTypes::new(),
            poisoned: false,
            const_cache: HashMap::new(),
            const_busy: HashSet::new(),
            steps: 0,
            out_of_steps: false,
        }
    }

    /// Whether elaboration stopped at [`MAX_STEPS`] (what is missing after that is no news).
    pub fn out_of_steps(&self) -> bool {
        self.out_of_steps
    }

    /// Charges `cost` steps for work at `span`; false (with one E0211 per model) once the
    /// budget is spent.
    pub fn tick(&mut self, frame: &Frame, span: Span, cost: u64) -> bool {
        if self.out_of_steps {
            return false;
        }
        self.steps += cost;
        if self.steps <= MAX_STEPS {
            return true;
        }
        self.out_of_steps = true;
        let d = self
            .error(
                frame,
                Code::E0211,
                span,
                format!("elaboration took more than {MAX_STEPS} steps"),
            )
            .with_label("still evaluating here")
            .with_help("check loop bounds; models this large are not supported");
        self.report(frame, d);
        false
    }

    /// Records a diagnostic found while evaluating `frame`, noting the instance it is in.
    pub fn report(&mut self, frame: &Frame, mut diag: Diagnostic) {
        if let (Some(site), Some(block)) = (frame.call_site, &frame.block) {
            if !frame.prefix.is_empty() || site.file != diag.primary.file {
                diag = diag.with_related(
                    site.file,
                    site.span,
                    format!("in this instance of `{block}` ({})", frame.origin()),
                );
            } else {
                diag = diag.with_related(site.file, site.span, format!("in this use of `{block}`"));
            }
        }
        self.diags.push(diag);
    }

    /// Reports an error at `span` with `label` under it and gives the poison value.
    pub fn fail(
        &mut self,
        frame: &Frame,
        code: Code,
        span: Span,
        message: impl Into<String>,
        label: impl Into<String>,
    ) -> Value {
        let d = Diagnostic::error(code, frame.file, span, message).with_label(label);
        self.report(frame, d);
        Value::Error
    }

    /// An error at `span` of the frame's file.
    pub fn error(
        &mut self,
        frame: &Frame,
        code: Code,
        span: Span,
        message: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic::error(code, frame.file, span, message)
    }

    // ------------------------------------------------------------------ statements

    /// Runs statements until the end or a `return`.
    pub fn exec_block(&mut self, frame: &mut Frame, stmts: &[Stmt]) {
        for stmt in stmts {
            if frame.returned.is_some() || self.out_of_steps {
                return;
            }
            self.exec(frame, stmt);
        }
    }

    fn exec(&mut self, frame: &mut Frame, stmt: &Stmt) {
        match stmt {
            Stmt::Let {
                names,
                tuple,
                value,
                ..
            } => {
                let v = self.eval(frame, value);
                if !*tuple {
                    frame.bind(&names[0].name, v, names[0].span);
                    return;
                }
                match v {
                    Value::Tuple(items) if items.len() == names.len() => {
                        for (n, item) in names.iter().zip(items) {
                            frame.bind(&n.name, item, n.span);
                        }
                    }
                    other => {
                        if !other.is_error() {
                            let found = match &other {
                                Value::Tuple(items) => format!("a tuple of {}", items.len()),
                                v => v.describe().to_string(),
                            };
                            let d = self
                                .error(
                                    frame,
                                    Code::E0305,
                                    value.span,
                                    format!("expected a tuple of {}, found {found}", names.len()),
                                )
                                .with_label(format!("this is {found}"))
                                .with_related(
                                    frame.file,
                                    stmt.span(),
                                    format!("{} names are bound here", names.len()),
                                );
                            self.report(frame, d);
                        }
                        for n in names {
                            frame.bind(&n.name, Value::Error, n.span);
                        }
                    }
                }
            }
            Stmt::Assign { name, value, .. } => {
                let v = self.eval(frame, value);
                if !frame.rebind(&name.name, v.clone()) {
                    let mut d = self
                        .error(
                            frame,
                            Code::E0207,
                            name.span,
                            format!("`{}` is assigned before it is defined", name.name),
                        )
                        .with_label("not defined yet");
                    d = d.with_help(format!("define it first: `let {} = …`", name.name));
                    self.report(frame, d);
                    frame.bind(&name.name, v, name.span);
                }
            }
            Stmt::For {
                var,
                start,
                end,
                body,
                ..
            } => {
                let (Some(lo), Some(hi)) = (self.eval_int(frame, start), self.eval_int(frame, end))
                else {
                    return;
                };
                let range = start.span.to(end.span);
                // One scope for the loop, emptied on each iteration (cheaper than a new one).
                frame.scopes.push(HashMap::new());
                for i in lo..hi {
                    if frame.returned.is_some() || !self.tick(frame, range, 1) {
                        break;
                    }
                    if let Some(scope) = frame.scopes.last_mut() {
                        scope.clear();
                    }
                    frame.bind(&var.name, Value::Int(i), var.span);
                    self.exec_block(frame, body);
                }
                frame.scopes.pop();
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                ..
            } => {
                let c = self.eval(frame, cond);
                let branch = match c {
                    Value::Bool(true) => Some(then.as_slice()),
                    Value::Bool(false) => otherwise.as_deref(),
                    Value::Error => None,
                    other => {
                        let d = self
                            .error(
                                frame,
                                Code::E0210,
                                cond.span,
                                format!(
                                    "an `if` condition must be a compile-time bool, found {}",
                                    other.describe()
                                ),
                            )
                            .with_label("not a bool");
                        self.report(frame, d);
                        None
                    }
                };
                if let Some(stmts) = branch {
                    frame.scopes.push(HashMap::new());
                    self.exec_block(frame, stmts);
                    frame.scopes.pop();
                }
            }
            Stmt::Return { value, span } => {
                if frame.block.is_none() {
                    let d = self
                        .error(frame, Code::E0208, *span, "`return` outside a block")
                        .with_label("models declare results with `output`")
                        .with_help("write `output name = …`");
                    self.report(frame, d);
                    return;
                }
                let v = self.eval(frame, value);
                frame.returned = Some((v, *span));
            }
            Stmt::Param {
                kind,
                name,
                ty,
                init,
                span,
            } => self.declare_param(frame, *kind, name, ty, init.as_ref(), *span),
            Stmt::Const { span, .. }
            | Stmt::Dims { span, .. }
            | Stmt::Input { span, .. }
            | Stmt::Output { span, .. } => self.exec_model_stmt(frame, stmt, *span),
        }
    }

    // ------------------------------------------------------------------ expressions

    /// Evaluates an expression that must be an int.
    pub fn eval_int(&mut self, frame: &mut Frame, e: &Expr) -> Option<i64> {
        match self.eval(frame, e) {
            Value::Int(v) => Some(v),
            Value::Error => None,
            other => {
                let d = self
                    .error(
                        frame,
                        Code::E0210,
                        e.span,
                        format!("expected a compile-time int, found {}", other.describe()),
                    )
                    .with_label("not an int");
                self.report(frame, d);
                None
            }
        }
    }

    /// Evaluates one expression, noting its type for [`Elaborator::expr_types`].
    pub fn eval(&mut self, frame: &mut Frame, e: &Expr) -> Value {
        let v = self.eval_kind(frame, e);
        if let Value::Tensor(t) = v {
            self.expr_types.entry((frame.file, e.span)).or_insert(t);
        }
        v
    }

    fn eval_kind(&mut self, frame: &mut Frame, e: &Expr) -> Value {
        if !self.tick(frame, e.span, 1) {
            return Value::Error;
        }
        match &e.kind {
            ExprKind::Int(v) => Value::Int(*v),
            ExprKind::Float(v) => Value::Float(*v),
            ExprKind::Bool(v) => Value::Bool(*v),
            ExprKind::Str(s) => Value::Str(s.clone()),
            ExprKind::Quantity { value, unit, .. } => match value * unit_scale(unit) {
                v if v.is_finite() => Value::Quantity(v),
                _ => self.fail(
                    frame,
                    Code::E0308,
                    e.span,
                    "quantity out of range",
                    "infinite in base units",
                ),
            },
            ExprKind::Name(name) => self.eval_name(frame, name, e.span),
            ExprKind::Wildcard => self.fail(
                frame,
                Code::E0305,
                e.span,
                "`_` is only allowed in shard specs and shape patterns",
                "not a value here",
            ),
            ExprKind::List(items) => {
                Value::List(items.iter().map(|i| self.eval(frame, i)).collect())
            }
            ExprKind::Tuple(items) => {
                Value::Tuple(items.iter().map(|i| self.eval(frame, i)).collect())
            }
            ExprKind::Paren(inner) => self.eval(frame, inner),
            ExprKind::Record(fields) => Value::Record(
                fields
                    .iter()
                    .map(|(k, v)| (k.name.clone(), self.eval(frame, v)))
                    .collect(),
            ),
            ExprKind::Unary { op, expr } => {
                let v = self.eval(frame, expr);
                self.unary(frame, *op, v, e.span, expr.span)
            }
            ExprKind::Binary {
                op: BinOp::Pipe,
                lhs,
                rhs,
            } => self.pipe(frame, lhs, rhs),
            ExprKind::Binary { op, lhs, rhs } => {
                let a = self.eval(frame, lhs);
                let b = self.eval(frame, rhs);
                self.binary(frame, *op, (a, lhs.span), (b, rhs.span), e.span)
            }
            ExprKind::Call { callee, args } => {
                let args = self.eval_args(frame, args);
                self.call(frame, callee, args, e.span)
            }
            ExprKind::Instance {
                label,
                label_span,
                block,
                args,
            } => {
                let args = self.eval_args(frame, args);
                self.instance(frame, Some((label, *label_span)), block, args, e.span)
            }
            ExprKind::Field { base, name } => {
                if let Some(b) = e.dotted_name().and_then(|path| frame.lookup(&path)) {
                    return b.value.clone();
                }
                let v = self.eval(frame, base);
                self.field(frame, v, name, e.span)
            }
            ExprKind::Index { base, index } => {
                let v = self.eval(frame, base);
                let i = self.eval(frame, index);
                self.index(frame, v, i, index.span)
            }
            ExprKind::Annotated { expr, annotation } => {
                let first = self.model.nodes.len();
                let v = self.eval(frame, expr);
                self.annotate(frame, &v, annotation, expr.span, first);
                v
            }
        }
    }

    /// Evaluates call arguments, keeping their names and spans.
    pub fn eval_args(&mut self, frame: &mut Frame, args: &[ast::Arg]) -> Vec<ArgValue> {
        args.iter()
            .map(|a| ArgValue {
                name: a.name.clone(),
                value: self.eval(frame, &a.value),
                span: a.value.span,
            })
            .collect()
    }

    fn pipe(&mut self, frame: &mut Frame, lhs: &Expr, rhs: &Expr) -> Value {
        let first = ArgValue {
            name: None,
            value: self.eval(frame, lhs),
            span: lhs.span,
        };
        let span = lhs.span.to(rhs.span);
        match &rhs.kind {
            ExprKind::Call { callee, args } => {
                let mut all = vec![first];
                all.extend(self.eval_args(frame, args));
                self.call(frame, callee, all, span)
            }
            ExprKind::Instance {
                label,
                label_span,
                block,
                args,
            } => {
                let mut all = vec![first];
                all.extend(self.eval_args(frame, args));
                self.instance(frame, Some((label, *label_span)), block, all, span)
            }
            ExprKind::Name(_) => self.call(frame, rhs, vec![first], span),
            _ => {
                let d = self
                    .error(
                        frame,
                        Code::E0305,
                        rhs.span,
                        "the right side of `|>` must be a call",
                    )
                    .with_label("not a call")
                    .with_help("write `x |> f(y)`, meaning `f(x, y)`");
                self.report(frame, d);
                Value::Error
            }
        }
    }

    fn eval_name(&mut self, frame: &mut Frame, name: &str, span: Span) -> Value {
        if let Some(b) = frame.lookup(name) {
            return b.value.clone();
        }
        let module = &self.modules.modules[frame.module];
        match module.lookup(frame.module, name) {
            Some((m, ItemRef::Const(i, j))) => return self.module_const(frame, m, i, j, span),
            Some((_, ItemRef::Block(_))) => {
                let d = self
                    .error(
                        frame,
                        Code::E0305,
                        span,
                        format!("`{name}` is a block, not a value"),
                    )
                    .with_label("used as a value")
                    .with_help(format!("instantiate it: `label: {name}(…)`"));
                self.report(frame, d);
                return Value::Error;
            }
            Some(_) => {
                return self.fail(
                    frame,
                    Code::E0305,
                    span,
                    format!("`{name}` is a declaration, not a value"),
                    "used as a value",
                );
            }
            None => {}
        }
        if let Some(v) = super::builtins::named_value(name) {
            return v;
        }
        if module.failed_imports.contains(name) {
            self.poisoned = true;
            return Value::Error;
        }
        let locals: Vec<String> = frame
            .scopes
            .iter()
            .flat_map(|s| s.keys().cloned())
            .collect();
        let module = &self.modules.modules[frame.module];
        let candidates = locals
            .iter()
            .map(String::as_str)
            .chain(module.visible_names());
        let mut d = self
            .error(
                frame,
                Code::E0200,
                span,
                format!("cannot find `{name}` in this scope"),
            )
            .with_label("not found");
        if let Some(s) = suggest::closest(name, candidates) {
            d = d.with_help(format!("did you mean `{s}`?"));
        }
        self.report(frame, d);
        Value::Error
    }

    fn module_const(
        &mut self,
        frame: &Frame,
        module: usize,
        item: usize,
        binding: usize,
        span: Span,
    ) -> Value {
        let ast::Item::Const(c) = &self.modules.modules[module].ast.items[item] else {
            return Value::Error;
        };
        let b = &c.bindings[binding];
        let key = (module, b.name.name.clone());
        if let Some(v) = self.const_cache.get(&key) {
            return v.clone();
        }
        if !self.const_busy.insert(key.clone()) {
            return self.fail(
                frame,
                Code::E0210,
                span,
                format!("constant `{}` depends on itself", b.name.name),
                "used here while being computed",
            );
        }
        let file = self.modules.modules[module].file;
        let mut const_frame = Frame::top(module, file);
        let value = self.eval(&mut const_frame, &b.value);
        let value = if matches!(value, Value::Tensor(_)) {
            let d = Diagnostic::error(
                Code::E0305,
                file,
                b.value.span,
                "a constant cannot be a tensor",
            )
            .with_label("computes a tensor")
            .with_help("constants hold numbers, shapes and dtypes");
            self.diags.push(d);
            Value::Error
        } else {
            value
        };
        self.const_busy.remove(&key);
        self.const_cache.insert(key, value.clone());
        value
    }

    fn unary(
        &mut self,
        frame: &mut Frame,
        op: UnOp,
        v: Value,
        span: Span,
        arg_span: Span,
    ) -> Value {
        match (op, v) {
            (_, Value::Error) => Value::Error,
            (UnOp::Neg, Value::Int(i)) => match i.checked_neg() {
                Some(n) => Value::Int(n),
                None => self.overflow(frame, span),
            },
            (UnOp::Neg, Value::Float(f)) => Value::Float(-f),
            (UnOp::Neg, Value::Tensor(t)) => {
                self.emit1(frame, Op::Neg, Attrs::new(), &[(t, arg_span)], span)
            }
            (UnOp::Not, Value::Bool(b)) => Value::Bool(!b),
            (op, other) => {
                let sym = if op == UnOp::Neg { "-" } else { "!" };
                self.fail(
                    frame,
                    Code::E0305,
                    arg_span,
                    format!("cannot apply `{sym}` to {}", other.describe()),
                    format!("this is {}", other.describe()),
                )
            }
        }
    }

    fn overflow(&mut self, frame: &Frame, span: Span) -> Value {
        self.fail(
            frame,
            Code::E0308,
            span,
            "integer overflow",
            "the result does not fit in 64 bits",
        )
    }

    fn binary(
        &mut self,
        frame: &mut Frame,
        op: BinOp,
        a: (Value, Span),
        b: (Value, Span),
        span: Span,
    ) -> Value {
        use Value::*;
        match (&a.0, &b.0) {
            (Error, _) | (_, Error) => Error,
            (Tensor(_), _) | (_, Tensor(_)) => self.tensor_binary(frame, op, a, b, span),
            (Int(x), Int(y)) => self.int_binary(frame, op, *x, *y, b.1, span),
            (Int(_) | Float(_), Int(_) | Float(_)) => {
                let (x, y) = (a.0.as_f64().unwrap_or(0.0), b.0.as_f64().unwrap_or(0.0));
                let finite = |elab: &mut Self, r: f64| {
                    if r.is_finite() {
                        Float(r)
                    } else if y == 0.0 && matches!(op, BinOp::Div | BinOp::Rem) {
                        elab.fail(frame, Code::E0308, b.1, "division by zero", "this is 0")
                    } else {
                        elab.fail(
                            frame,
                            Code::E0308,
                            span,
                            "floating-point overflow",
                            "the result is infinite",
                        )
                    }
                };
                match op {
                    BinOp::Add => finite(self, x + y),
                    BinOp::Sub => finite(self, x - y),
                    BinOp::Mul => finite(self, x * y),
                    BinOp::Div => finite(self, x / y),
                    BinOp::Rem => finite(self, x % y),
                    BinOp::Eq => Bool(x == y),
                    BinOp::Ne => Bool(x != y),
                    BinOp::Lt => Bool(x < y),
                    BinOp::Le => Bool(x <= y),
                    BinOp::Gt => Bool(x > y),
                    BinOp::Ge => Bool(x >= y),
                    _ => self.bad_operands(frame, op, &a, &b, span),
                }
            }
            (Bool(x), Bool(y)) => match op {
                BinOp::And => Bool(*x && *y),
                BinOp::Or => Bool(*x || *y),
                BinOp::Eq => Bool(x == y),
                BinOp::Ne => Bool(x != y),
                _ => self.bad_operands(frame, op, &a, &b, span),
            },
            (Str(x), Str(y)) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                Bool((x == y) == (op == BinOp::Eq))
            }
            (DType(x), DType(y)) if matches!(op, BinOp::Eq | BinOp::Ne) => {
                Bool((x == y) == (op == BinOp::Eq))
            }
            _ => self.bad_operands(frame, op, &a, &b, span),
        }
    }

    fn bad_operands(
        &mut self,
        frame: &Frame,
        op: BinOp,
        a: &(Value, Span),
        b: &(Value, Span),
        span: Span,
    ) -> Value {
        let d = self
            .error(
                frame,
                Code::E0305,
                span,
                format!(
                    "cannot apply `{}` to {} and {}",
                    op.symbol(),
                    a.0.describe(),
                    b.0.describe()
                ),
            )
            .with_label("unsupported operands")
            .with_related(frame.file, a.1, format!("this is {}", a.0.describe()))
            .with_related(frame.file, b.1, format!("this is {}", b.0.describe()));
        self.report(frame, d);
        Value::Error
    }

    fn int_binary(
        &mut self,
        frame: &Frame,
        op: BinOp,
        x: i64,
        y: i64,
        rhs_span: Span,
        span: Span,
    ) -> Value {
        let result = match op {
            BinOp::Add => x.checked_add(y),
            BinOp::Sub => x.checked_sub(y),
            BinOp::Mul => x.checked_mul(y),
            BinOp::Div | BinOp::Rem if y == 0 => {
                return self.fail(
                    frame,
                    Code::E0308,
                    rhs_span,
                    "division by zero",
                    "this is 0",
                );
            }
            BinOp::Div if x.checked_rem(y).is_some_and(|r| r != 0) => {
                let d = self
                    .error(
                        frame,
                        Code::E0302,
                        span,
                        format!("{x} / {y} is not exact: {x} = {} × {y} + {}", x / y, x % y),
                    )
                    .with_label("must divide exactly")
                    .with_help(
                        "sizes divided with `/` must be multiples; use `%` to compute a remainder",
                    );
                self.report(frame, d);
                return Value::Error;
            }
            BinOp::Div => x.checked_div(y),
            BinOp::Rem => x.checked_rem(y),
            BinOp::Eq => return Value::Bool(x == y),
            BinOp::Ne => return Value::Bool(x != y),
            BinOp::Lt => return Value::Bool(x < y),
            BinOp::Le => return Value::Bool(x <= y),
            BinOp::Gt => return Value::Bool(x > y),
            BinOp::Ge => return Value::Bool(x >= y),
            _ => {
                return self.fail(
                    frame,
                    Code::E0305,
                    span,
                    format!("cannot apply `{}` to two ints", op.symbol()),
                    "unsupported operands",
                );
            }
        };
        match result {
            Some(v) => Value::Int(v),
            None => self.overflow(frame, span),
        }
    }

    fn tensor_binary(
        &mut self,
        frame: &mut Frame,
        op: BinOp,
        a: (Value, Span),
        b: (Value, Span),
        span: Span,
    ) -> Value {
        let op = match op {
            BinOp::Add => Op::Add,
            BinOp::Sub => Op::Sub,
            BinOp::Mul => Op::Mul,
            BinOp::Div => Op::Div,
            BinOp::MatMul => Op::Matmul,
            _ => return self.bad_operands(frame, op, &a, &b, span),
        };
        let dtype_hint = [&a.0, &b.0].iter().find_map(|v| match v {
            Value::Tensor(t) => Some(self.model.ty(*t).dtype),
            _ => None,
        });
        let (Some(x), Some(y)) = (
            self.as_tensor(frame, &a.0, a.1, dtype_hint),
            self.as_tensor(frame, &b.0, b.1, dtype_hint),
        ) else {
            return Value::Error;
        };
        self.emit1(frame, op, Attrs::new(), &[(x, a.1), (y, b.1)], span)
    }

    /// A tensor for `v`: itself, or a scalar constant for a number (weakly typed: it takes the
    /// other operand's dtype, or f32 for a float beside an int tensor).
    pub fn as_tensor(
        &mut self,
        frame: &mut Frame,
        v: &Value,
        span: Span,
        hint: Option<DType>,
    ) -> Option<ValueId> {
        match v {
            Value::Tensor(t) => Some(*t),
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
                let hint = hint.unwrap_or(DType::F32);
                let (value, dtype) = match v {
                    Value::Int(i) => (*i as f64, hint),
                    Value::Float(f) if hint.is_float() => (*f, hint),
                    Value::Float(f) => (*f, DType::F32),
                    Value::Bool(b) => (f64::from(u8::from(*b)), hint),
                    _ => unreachable!(),
                };
                let attrs = Attrs::new().with("value", value).with("dtype", dtype);
                match self.emit1(frame, Op::Constant, attrs, &[], span) {
                    Value::Tensor(t) => Some(t),
                    _ => None,
                }
            }
            Value::Error => None,
            other => {
                let d = self
                    .error(
                        frame,
                        Code::E0305,
                        span,
                        format!("expected a tensor, found {}", other.describe()),
                    )
                    .with_label(format!("this is {}", other.describe()));
                self.report(frame, d);
                None
            }
        }
    }

    /// Emits an op node after checking it with the registry; returns its single result (or a
    /// tuple for several), or `Error` with a diagnostic pointing at the offending argument.
    pub fn emit1(
        &mut self,
        frame: &Frame,
        op: Op,
        attrs: Attrs,
        inputs: &[(ValueId, Span)],
        span: Span,
    ) -> Value {
        let types: Vec<TensorType> = inputs
            .iter()
            .map(|(v, _)| self.model.ty(*v).clone())
            .collect();
        if !self.tick(frame, span, NODE_STEPS) {
            return Value::Error;
        }
        let attrs = match ops::resolve_attrs(op, &attrs) {
            Ok(a) => a,
            Err(e) => return self.op_error(frame, e, inputs, span),
        };
        match ops::infer(op, &attrs, &types) {
            Ok(outs) => {
                let outputs: Vec<ValueId> =
                    outs.into_iter().map(|t| self.model.new_value(t)).collect();
                self.model.nodes.push(Node {
                    op,
                    attrs,
                    inputs: inputs.iter().map(|(v, _)| *v).collect(),
                    outputs: outputs.clone(),
                    origin: frame.origin(),
                    loc: frame.loc(span),
                    annotations: Default::default(),
                });
                match outputs.as_slice() {
                    [one] => Value::Tensor(*one),
                    many => Value::Tuple(many.iter().map(|v| Value::Tensor(*v)).collect()),
                }
            }
            Err(e) => self.op_error(frame, e, inputs, span),
        }
    }

    fn op_error(
        &mut self,
        frame: &Frame,
        e: ops::OpError,
        inputs: &[(ValueId, Span)],
        span: Span,
    ) -> Value {
        let mut d = self
            .error(frame, Code::E0303, span, e.message.clone())
            .with_label("in this operation");
        for (i, (v, s)) in inputs.iter().enumerate() {
            let ty = self.model.ty(*v);
            let prefix = if e.input == Some(i) {
                "this operand is at fault: "
            } else {
                ""
            };
            d = d.with_related(frame.file, *s, format!("{prefix}{ty}"));
        }
        if let Some(h) = e.help {
            d = d.with_help(h);
        }
        self.report(frame, d);
        Value::Error
    }

    fn field(&mut self, frame: &mut Frame, v: Value, name: &ast::Ident, span: Span) -> Value {
        match (&v, name.name.as_str()) {
            (Value::Error, _) => Value::Error,
            (Value::Tensor(t), "T") => {
                let rank = self.model.ty(*t).rank() as i64;
                if rank < 2 {
                    return self.fail(
                        frame,
                        Code::E0303,
                        name.span,
                        format!("`.T` needs at least 2 dims, the tensor has {rank}"),
                        "transposes the last two dims",
                    );
                }
                let mut perm: Vec<i64> = (0..rank).collect();
                perm.swap(rank as usize - 2, rank as usize - 1);
                self.emit1(
                    frame,
                    Op::Transpose,
                    Attrs::new().with("perm", perm),
                    &[(*t, span)],
                    span,
                )
            }
            (Value::Tensor(t), "shape") => Value::List(
                self.model
                    .ty(*t)
                    .shape
                    .iter()
                    .map(|d| Value::Int(*d))
                    .collect(),
            ),
            (Value::Tensor(t), "dtype") => Value::DType(self.model.ty(*t).dtype),
            (Value::Tensor(t), "rank") => Value::Int(self.model.ty(*t).rank() as i64),
            (Value::Record(fields), key) => match fields.iter().find(|(k, _)| k == key) {
                Some((_, v)) => v.clone(),
                None => self.fail(
                    frame,
                    Code::E0200,
                    name.span,
                    format!("the record has no field `{key}`"),
                    "unknown field",
                ),
            },
            (other, key) => {
                let d = self
                    .error(
                        frame,
                        Code::E0200,
                        name.span,
                        format!("{} has no field `{key}`", other.describe()),
                    )
                    .with_label("unknown field")
                    .with_help(if matches!(other, Value::Tensor(_)) {
                        "tensors have `.T`, `.shape`, `.dtype` and `.rank`"
                    } else {
                        "only tensors and records have fields"
                    });
                self.report(frame, d);
                Value::Error
            }
        }
    }

    fn index(&mut self, frame: &mut Frame, v: Value, i: Value, span: Span) -> Value {
        match (v, i) {
            (Value::Error, _) | (_, Value::Error) => Value::Error,
            (Value::List(items) | Value::Tuple(items), Value::Int(i)) => {
                let n = items.len() as i64;
                let k = if i < 0 { i + n } else { i };
                if (0..n).contains(&k) {
                    items[k as usize].clone()
                } else {
                    self.fail(
                        frame,
                        Code::E0305,
                        span,
                        format!("index {i} is out of range for {n} elements"),
                        "out of range",
                    )
                }
            }
            (Value::Tensor(_), _) => {
                let d = self
                    .error(frame, Code::E0305, span, "tensors are not indexed with `[]`")
                    .with_label("indexing a tensor")
                    .with_help("use `select(x, axis: a, index: i)` or `slice(x, axis: a, start: s, end: e)`");
                self.report(frame, d);
                Value::Error
            }
            (v, i) => self.fail(
                frame,
                Code::E0305,
                span,
                format!("cannot index {} with {}", v.describe(), i.describe()),
                "bad index",
            ),
        }
    }

    /// Applies `ann` to the op that produced `v`; `@recompute` to every op the annotated
    /// expression added (nodes from `first` on, a whole instance for an instance call).
    fn annotate(
        &mut self,
        frame: &mut Frame,
        v: &Value,
        ann: &ast::Annotation,
        expr_span: Span,
        first: usize,
    ) {
        let &Value::Tensor(t) = v else {
            if !v.is_error() {
                let d = self
                    .error(
                        frame,
                        Code::E0305,
                        ann.span,
                        format!("annotations apply to tensors, not to {}", v.describe()),
                    )
                    .with_label("nothing to annotate");
                self.report(frame, d);
            }
            return;
        };
        let Some(node) = self
            .model
            .nodes
            .iter()
            .rposition(|n| n.outputs.contains(&t))
        else {
            let d = self
                .error(
                    frame,
                    Code::E0305,
                    ann.span,
                    "only values computed by an op can be annotated",
                )
                .with_label("annotation here")
                .with_related(frame.file, expr_span, "this is an input or parameter")
                .with_help(
                    "shard parameters with a `shard \"path\" = [...]` rule in a parallel policy",
                );
            self.report(frame, d);
            return;
        };
        let name = ann.name.name.as_str();
        match (name, &ann.args) {
            ("recompute", None) => {
                // The expression's own ops, or the producer alone when it computed none.
                let ops = if node >= first {
                    first..self.model.nodes.len()
                } else {
                    node..node + 1
                };
                for n in &mut self.model.nodes[ops] {
                    n.annotations.recompute = true;
                }
            }
            ("f32" | "f16" | "bf16", None) => {
                self.model.nodes[node].annotations.keep_dtype = DType::parse(name);
            }
            ("shard", Some(args)) => {
                let n_inputs = self.model.nodes[node].inputs.len();
                let mut specs = Vec::new();
                for a in args {
                    match shard_spec(&a.value) {
                        Some(spec) => specs.push(spec),
                        None => {
                            let d = self
                                .error(
                                    frame,
                                    Code::E0305,
                                    a.value.span,
                                    "a shard spec is a list of mesh axes and `_`",
                                )
                                .with_label("not a shard spec")
                                .with_help("e.g. `@shard([dp, _], [_, mp])`, one list per input");
                            self.report(frame, d);
                            return;
                        }
                    }
                }
                if specs.len() != n_inputs {
                    let op = self.model.nodes[node].op;
                    let d = self
                        .error(
                            frame,
                            Code::E0505,
                            ann.span,
                            format!(
                                "`{op}` has {n_inputs} inputs but the annotation gives {} specs",
                                specs.len()
                            ),
                        )
                        .with_label("one spec per input expected");
                    self.report(frame, d);
                    return;
                }
                let inputs = self.model.nodes[node].inputs.clone();
                for (spec, (input, arg)) in specs.iter().zip(inputs.iter().zip(args)) {
                    let rank = self.model.ty(*input).rank();
                    if spec.len() != rank {
                        let d = self
                            .error(
                                frame,
                                Code::E0505,
                                arg.value.span,
                                format!(
                                    "shard spec has {} entries but the input has {rank} dims",
                                    spec.len()
                                ),
                            )
                            .with_label(format!("input is {}", self.model.ty(*input)));
                        self.report(frame, d);
                        return;
                    }
                }
                self.model.nodes[node].annotations.shard = Some(specs);
            }
            _ => {
                let d = self
                    .error(
                        frame,
                        Code::E0305,
                        ann.span,
                        format!(
                            "`@{name}` takes {}",
                            if name == "shard" {
                                "one spec per input: `@shard([dp, _], …)`"
                            } else {
                                "no arguments"
                            }
                        ),
                    )
                    .with_label("malformed annotation");
                self.report(frame, d);
            }
        }
    }
}

/// `[dp, _]` → `[Some("dp"), None]`.
fn shard_spec(e: &Expr) -> Option<Vec<Option<String>>> {
    let ExprKind::List(items) = &e.kind else {
        return None;
    };
    items
        .iter()
        .map(|i| match &i.kind {
            ExprKind::Wildcard => Some(None),
            ExprKind::Name(n) => Some(Some(n.clone())),
            _ => None,
        })
        .collect()
}

/// Base-unit multiplier of a quantity unit (bytes, bytes/s or FLOP/s).
pub fn unit_scale(unit: &str) -> f64 {
    let base = unit
        .trim_end_matches("/s")
        .trim_end_matches("FLOPS")
        .trim_end_matches('B');
    match base {
        "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => 1.0,
    }
}

/// An int attribute from a value, if it is one.
pub fn attr_of(v: &Value) -> Option<AttrValue> {
    match v {
        Value::Int(i) => Some(AttrValue::Int(*i)),
        Value::Float(f) => Some(AttrValue::Float(*f)),
        Value::Bool(b) => Some(AttrValue::Bool(*b)),
        Value::DType(d) => Some(AttrValue::DType(*d)),
        Value::Str(s) => Some(AttrValue::Str(s.clone())),
        Value::List(_) | Value::Tuple(_) => v.as_ints().map(AttrValue::Ints),
        _ => None,
    }
}
