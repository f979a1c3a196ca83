//! The typed syntax tree of a `.msl` file. Every node carries the byte span it came from, so the
//! checker can point at the source; nothing here knows about pest.

pub use mslc_core::span::Span;

/// A name as written, with where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    /// The name.
    pub name: String,
    /// Where it stands.
    pub span: Span,
}

/// One parsed file.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct File {
    /// Top-level items in source order.
    pub items: Vec<Item>,
    /// The `@allow(…)` attributes written before items and statements, in source order. They
    /// sit beside the tree, keyed by the span of what they precede, since only lints read them.
    pub allows: Vec<Allow>,
}

/// `@allow(unused)` before an item or statement: the lint it silences there.
#[derive(Clone, Debug, PartialEq)]
pub struct Allow {
    /// The lint's name (`unused`).
    pub lint: Ident,
    /// The attribute itself.
    pub span: Span,
    /// The item or statement it precedes; the lint is silent for everything inside.
    pub target: Span,
}

/// A top-level declaration.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// `import std.nn.{Linear}`
    Import(Import),
    /// `pub const a = 1, b = 2`
    Const(ConstItem),
    /// `pub block Name(...) -> [...] { ... }`
    Block(BlockItem),
    /// `model Name { ... }`
    Model(ModelItem),
    /// `precision | parallel | memory | train | target` declarations: named field lists.
    Decl(DeclItem),
}

/// An import of one or more items from a module.
#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    /// Leading dots: 0 = absolute (`std.…`), 1 = this file's folder, 2 = its parent, ….
    pub dots: usize,
    /// Module path segments (`std`, `nn`).
    pub module: Vec<Ident>,
    /// Imported names with optional aliases.
    pub names: Vec<ImportName>,
    /// Whether the names were written in braces.
    pub braced: bool,
    /// The whole import.
    pub span: Span,
}

/// `Name` or `Name as Alias` in an import.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportName {
    /// The exported name.
    pub name: Ident,
    /// The local alias, if any.
    pub alias: Option<Ident>,
}

impl ImportName {
    /// The name the importing file sees.
    pub fn local(&self) -> &Ident {
        self.alias.as_ref().unwrap_or(&self.name)
    }
}

/// `name = value`
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    /// Bound name.
    pub name: Ident,
    /// Its value.
    pub value: Expr,
}

/// File-level constants.
#[derive(Clone, Debug, PartialEq)]
pub struct ConstItem {
    /// Exported?
    pub public: bool,
    /// The constants.
    pub bindings: Vec<Binding>,
    /// The whole declaration.
    pub span: Span,
}

/// A reusable, shape-polymorphic block of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockItem {
    /// Exported?
    pub public: bool,
    /// Block name.
    pub name: Ident,
    /// Parameters in order.
    pub params: Vec<BlockParam>,
    /// Declared result type.
    pub ret: Option<RetType>,
    /// Statements.
    pub body: Vec<Stmt>,
    /// The whole block.
    pub span: Span,
}

/// One parameter of a block.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockParam {
    /// Parameter name.
    pub name: Ident,
    /// Its type.
    pub ty: ParamType,
    /// Default value.
    pub default: Option<Expr>,
}

/// The type of a block parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    /// A tensor with a shape pattern.
    Tensor(TensorType),
    /// `int`, `float`, `bool`, `str`, `dtype` or `shape`.
    Scalar(Ident),
}

/// `f32[B, S, ...]` as written.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorType {
    /// Element type, if written.
    pub dtype: Option<Ident>,
    /// Dimension patterns.
    pub dims: Vec<Dim>,
    /// The whole type.
    pub span: Span,
}

/// One element of a shape pattern.
#[derive(Clone, Debug, PartialEq)]
pub enum Dim {
    /// `...`: any number of dims.
    Ellipsis(Span),
    /// `_`: any one dim.
    Wildcard(Span),
    /// A name (binds or checks) or an expression (checks).
    Expr(Expr),
}

/// A block's declared result.
#[derive(Clone, Debug, PartialEq)]
pub enum RetType {
    /// One tensor.
    Tensor(TensorType),
    /// Several tensors.
    Tuple(Vec<TensorType>, Span),
}

/// `model Name { ... }`
#[derive(Clone, Debug, PartialEq)]
pub struct ModelItem {
    /// Model name.
    pub name: Ident,
    /// Statements.
    pub body: Vec<Stmt>,
    /// The whole model.
    pub span: Span,
}

/// Which declaration a field list belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeclKind {
    /// `precision`
    Precision,
    /// `parallel`
    Parallel,
    /// `memory`
    Memory,
    /// `train`
    Train,
    /// `target`
    Target,
}

impl DeclKind {
    /// The keyword introducing it.
    pub fn keyword(self) -> &'static str {
        match self {
            DeclKind::Precision => "precision",
            DeclKind::Parallel => "parallel",
            DeclKind::Memory => "memory",
            DeclKind::Train => "train",
            DeclKind::Target => "target",
        }
    }
}

/// A policy, training or target declaration.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclItem {
    /// Which kind.
    pub kind: DeclKind,
    /// Exported? (targets only)
    pub public: bool,
    /// Declaration name.
    pub name: Ident,
    /// `train X for Model`: the model.
    pub for_model: Option<Ident>,
    /// Fields in source order.
    pub fields: Vec<Field>,
    /// The whole declaration.
    pub span: Span,
}

/// One field of a declaration.
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    /// `key = value`
    Assign { key: Ident, value: Expr, span: Span },
    /// `shard "pattern" = [mp, _]`
    Shard {
        pattern: Ident,
        value: Expr,
        span: Span,
    },
    /// `labels: i32[B, S]`
    Typed {
        name: Ident,
        ty: TensorType,
        span: Span,
    },
}

impl Field {
    /// The whole field.
    pub fn span(&self) -> Span {
        match self {
            Field::Assign { span, .. } | Field::Shard { span, .. } | Field::Typed { span, .. } => {
                *span
            }
        }
    }
}

/// Parameters (trainable) or buffers (not trainable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// `param`
    Param,
    /// `buffer`
    Buffer,
}

/// A statement in a block or model body.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `let x = e` or `let (a, b) = e`
    Let {
        names: Vec<Ident>,
        tuple: bool,
        value: Expr,
        span: Span,
    },
    /// `x = e`
    Assign {
        name: Ident,
        value: Expr,
        span: Span,
    },
    /// `for i in a..b { ... }`
    For {
        var: Ident,
        start: Expr,
        end: Expr,
        body: Vec<Stmt>,
        span: Span,
    },
    /// `if c { ... } else { ... }`
    If {
        cond: Expr,
        then: Vec<Stmt>,
        otherwise: Option<Vec<Stmt>>,
        span: Span,
    },
    /// `return e`
    Return { value: Expr, span: Span },
    /// `const a = 1, b = 2`
    Const { bindings: Vec<Binding>, span: Span },
    /// `dims B = 1, S = 128`
    Dims { bindings: Vec<Binding>, span: Span },
    /// `input tokens: i32[B, S]`
    Input {
        name: Ident,
        ty: TensorType,
        span: Span,
    },
    /// `output logits = e`
    Output {
        name: Ident,
        value: Expr,
        span: Span,
    },
    /// `param w: [o, i] ~ init` / `buffer …`; the name may be dotted (`encoder.pos_embedding`)
    /// to give a parameter a path below the current label without a block around it.
    Param {
        kind: ParamKind,
        name: Ident,
        ty: TensorType,
        init: Option<Expr>,
        span: Span,
    },
}

impl Stmt {
    /// The whole statement.
    pub fn span(&self) -> Span {
        match self {
            Stmt::Let { span, .. }
            | Stmt::Assign { span, .. }
            | Stmt::For { span, .. }
            | Stmt::If { span, .. }
            | Stmt::Return { span, .. }
            | Stmt::Const { span, .. }
            | Stmt::Dims { span, .. }
            | Stmt::Input { span, .. }
            | Stmt::Output { span, .. }
            | Stmt::Param { span, .. } => *span,
        }
    }
}

/// An expression with its span.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Where it is.
    pub span: Span,
}

impl Expr {
    /// `encoder.pos_embedding` written as names joined by fields: the name a dotted `param`
    /// declaration binds, which a use must match whole.
    pub fn dotted_name(&self) -> Option<String> {
        match &self.kind {
            ExprKind::Name(n) => Some(n.clone()),
            ExprKind::Field { base, name } => {
                Some(format!("{}.{}", base.dotted_name()?, name.name))
            }
            _ => None,
        }
    }
}

/// Binary operators, lowest precedence first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    /// `|>`
    Pipe,
    /// `||`
    Or,
    /// `&&`
    And,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
    /// `@`
    MatMul,
}

impl BinOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Pipe => "|>",
            BinOp::Or => "||",
            BinOp::And => "&&",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::MatMul => "@",
        }
    }

    /// Binding strength: higher binds tighter.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Pipe => 1,
            BinOp::Or => 2,
            BinOp::And => 3,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 4,
            BinOp::Add | BinOp::Sub => 5,
            BinOp::Mul | BinOp::Div | BinOp::Rem | BinOp::MatMul => 6,
        }
    }
}

/// Prefix operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    /// `-`
    Neg,
    /// `!`
    Not,
}

/// A call argument, positional or named.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// `name:` if named.
    pub name: Option<Ident>,
    /// The value.
    pub value: Expr,
}

/// One segment of an instance label path.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelSeg {
    /// `.name` (or the first name)
    Name(Ident),
    /// `[i]`
    Index(Expr),
    /// `.encoder_layer_{i}`: text with compile-time ints spliced in, one segment.
    Template(Vec<LabelPiece>),
}

/// A piece of a [`LabelSeg::Template`].
#[derive(Clone, Debug, PartialEq)]
pub enum LabelPiece {
    /// Literal text, `encoder_layer_`.
    Text(Ident),
    /// `{i}`: an int expression, written in decimal.
    Hole(Expr),
}

/// `@shard(...)`, `@recompute`, `@f32`
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    /// Annotation name without `@`.
    pub name: Ident,
    /// Arguments, if written with parentheses.
    pub args: Option<Vec<Arg>>,
    /// The whole annotation.
    pub span: Span,
}

/// Expression forms.
#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// `128`
    Int(i64),
    /// `1e-6`
    Float(f64),
    /// `true`
    Bool(bool),
    /// `"text"` (unescaped)
    Str(String),
    /// `31GB`: the number and its unit as written.
    Quantity {
        value: f64,
        text: String,
        unit: String,
    },
    /// A name, or a word such as `1f1b`.
    Name(String),
    /// `_` inside a list.
    Wildcard,
    /// `[a, b]`
    List(Vec<Expr>),
    /// `(a, b)`
    Tuple(Vec<Expr>),
    /// `(a)`
    Paren(Box<Expr>),
    /// `{dp: 2, mp: 4}`
    Record(Vec<(Ident, Expr)>),
    /// `-x`, `!x`
    Unary { op: UnOp, expr: Box<Expr> },
    /// `a + b`, `a |> f(b)`
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// `f(args)`
    Call { callee: Box<Expr>, args: Vec<Arg> },
    /// `label.path[i]: Block(args)`
    Instance {
        label: Vec<LabelSeg>,
        label_span: Span,
        block: Ident,
        args: Vec<Arg>,
    },
    /// `x.name` (incl. `.T`)
    Field { base: Box<Expr>, name: Ident },
    /// `x[i]`
    Index { base: Box<Expr>, index: Box<Expr> },
    /// `e @annotation`
    Annotated {
        expr: Box<Expr>,
        annotation: Annotation,
    },
}
