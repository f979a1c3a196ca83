//! Model bodies: constants and dims (with command-line overrides), inputs, outputs, and the
//! driver that elaborates one model declaration into a [`Model`].

use std::collections::BTreeMap;

use mslc_core::diag::{Code, Diagnostic};
use mslc_core::ops::{DType, TensorType};
use mslc_syntax::ast::{self, Dim, Span, Stmt};

use super::eval::{Elaborator, ExprTypes, Frame};
use super::instance::article;
use super::modules::Modules;
use super::value::Value;
use mslc_core::program::{Input, Loc, Model, Output};

/// `--set NAME=V` and `--dim NAME=N` values, with which were used.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Const overrides by name.
    pub sets: BTreeMap<String, String>,
    /// Dim overrides by name.
    pub dims: BTreeMap<String, String>,
}

impl Elaborator<'_> {
    /// Statements only a model body may contain.
    pub fn exec_model_stmt(&mut self, frame: &mut Frame, stmt: &Stmt, span: Span) {
        if frame.block.is_some() {
            let what = match stmt {
                Stmt::Const { .. } => "`const` inside a block",
                Stmt::Dims { .. } => "`dims` inside a block",
                Stmt::Input { .. } => "`input` inside a block",
                _ => "`output` inside a block",
            };
            let d = self
                .error(frame, Code::E0208, span, what.to_string())
                .with_label("only models declare this")
                .with_help("blocks take values as parameters and give one back with `return`");
            self.report(frame, d);
            return;
        }
        match stmt {
            Stmt::Const { bindings, .. } => {
                for b in bindings {
                    if !self.claim(frame, &b.name, "const") {
                        continue;
                    }
                    let v = match self.overridden(&b.name, false) {
                        Some(v) => v,
                        None => self.eval(frame, &b.value),
                    };
                    let shown = show(&v);
                    self.model.consts.push((b.name.name.clone(), shown));
                    frame.bind(&b.name.name, v, b.name.span);
                }
            }
            Stmt::Dims { bindings, .. } => {
                for b in bindings {
                    if !self.claim(frame, &b.name, "dim") {
                        continue;
                    }
                    let v = match self.overridden(&b.name, true) {
                        Some(v) => v,
                        None => self.eval(frame, &b.value),
                    };
                    let v = match v {
                        Value::Int(n) if n > 0 => {
                            self.model.dims.push((b.name.name.clone(), n));
                            v
                        }
                        Value::Error => v,
                        other => self.fail(
                            frame,
                            Code::E0309,
                            b.value.span,
                            format!(
                                "dim `{}` must be a positive int, found {}",
                                b.name.name,
                                show(&other)
                            ),
                            "not a positive size",
                        ),
                    };
                    frame.bind(&b.name.name, v, b.name.span);
                }
            }
            Stmt::Input { name, ty, span } => {
                if !self.claim(frame, name, "input") {
                    return;
                }
                let dims = self.dim_names(ty);
                let Some(ty) = self.concrete_type(frame, ty) else {
                    frame.bind(&name.name, Value::Error, name.span);
                    return;
                };
                let value = self.model.new_value(ty);
                self.model.inputs.push(Input {
                    name: name.name.clone(),
                    value,
                    dims,
                    loc: Loc {
                        file: frame.file,
                        span: *span,
                    },
                });
                frame.bind(&name.name, Value::Tensor(value), name.span);
            }
            Stmt::Output { name, value, span } => {
                self.saw_output = true;
                let v = self.eval(frame, value);
                if !self.claim(frame, name, "output") {
                    return;
                }
                match v {
                    Value::Tensor(t) => self.model.outputs.push(Output {
                        name: name.name.clone(),
                        value: t,
                        loc: Loc {
                            file: frame.file,
                            span: *span,
                        },
                    }),
                    Value::Error => {}
                    other => {
                        let d = self
                            .error(
                                frame,
                                Code::E0305,
                                value.span,
                                format!("an output must be a tensor, found {}", other.describe()),
                            )
                            .with_label("not a tensor");
                        self.report(frame, d);
                    }
                }
            }
            _ => {}
        }
    }

    /// Claims `name` for a model declaration of `kind` (`"const"`, `"dim"`, `"input"`,
    /// `"output"`); false, with an E0404, when the model already declared it — or when the same
    /// statement runs again, inside a loop.
    fn claim(&mut self, frame: &Frame, name: &ast::Ident, kind: &'static str) -> bool {
        let here = Loc {
            file: frame.file,
            span: name.span,
        };
        let Some(&(first_kind, first)) = self.model_names.get(&name.name) else {
            self.model_names.insert(name.name.clone(), (kind, here));
            return true;
        };
        let d = if first == here {
            self.error(
                frame,
                Code::E0404,
                name.span,
                format!(
                    "{kind} `{}` is declared again on each loop iteration",
                    name.name
                ),
            )
            .with_label("runs more than once")
            .with_help("declare it before the loop")
        } else {
            let message = if first_kind == kind {
                format!("{kind} `{}` is declared twice", name.name)
            } else {
                format!(
                    "`{}` is declared as {} {first_kind} and as {} {kind}",
                    name.name,
                    article(first_kind),
                    article(kind)
                )
            };
            self.error(frame, Code::E0404, name.span, message)
                .with_label("declared again here")
                .with_related(first.file, first.span, "first declared here")
        };
        self.report(frame, d);
        false
    }

    /// A declared tensor type with every dim evaluated.
    pub fn concrete_type(&mut self, frame: &mut Frame, ty: &ast::TensorType) -> Option<TensorType> {
        let dtype = match &ty.dtype {
            Some(d) => DType::parse(&d.name)?,
            None => DType::F32,
        };
        let mut shape = Vec::new();
        for dim in &ty.dims {
            match dim {
                Dim::Expr(e) => match self.eval_int(frame, e) {
                    Some(v) if v > 0 => shape.push(v),
                    Some(v) => {
                        let d = self
                            .error(
                                frame,
                                Code::E0309,
                                e.span,
                                format!("dimension {v} is not positive"),
                            )
                            .with_label("must be ≥ 1");
                        self.report(frame, d);
                        return None;
                    }
                    None => return None,
                },
                Dim::Ellipsis(s) | Dim::Wildcard(s) => {
                    let d = self
                        .error(frame, Code::E0309, *s, "inputs need every dim known")
                        .with_label("not a size")
                        .with_help("declare the size in `dims` and use its name");
                    self.report(frame, d);
                    return None;
                }
            }
        }
        Some(TensorType::new(dtype, shape))
    }

    /// Per position of a declared input type, the model dim written there, if it is one.
    pub fn dim_names(&self, ty: &ast::TensorType) -> Vec<Option<String>> {
        ty.dims
            .iter()
            .map(|dim| match dim {
                Dim::Expr(ast::Expr {
                    kind: ast::ExprKind::Name(name),
                    ..
                }) if self.model.dims.iter().any(|(d, _)| d == name) => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    fn overridden(&mut self, name: &ast::Ident, is_dim: bool) -> Option<Value> {
        let table = if is_dim {
            &self.overrides.dims
        } else {
            &self.overrides.sets
        };
        let text = table.get(&name.name)?.clone();
        self.used_overrides.insert((is_dim, name.name.clone()));
        match parse_override(&text) {
            Some(v) => Some(v),
            None => {
                let flag = if is_dim { "--dim" } else { "--set" };
                let d = Diagnostic::error(
                    Code::E0402,
                    self.model.loc.file,
                    name.span,
                    format!("{flag} {}={text}: not a number or bool", name.name),
                )
                .with_label("overridden here")
                .with_help(format!("write e.g. `{flag} {}=8`", name.name));
                self.diags.push(d);
                Some(Value::Error)
            }
        }
    }
}

/// An override's text as a value: int, float or bool.
fn parse_override(text: &str) -> Option<Value> {
    let t = text.trim();
    if let Ok(i) = t.parse::<i64>() {
        return Some(Value::Int(i));
    }
    if let Ok(f) = t.parse::<f64>() {
        return f.is_finite().then_some(Value::Float(f));
    }
    match t {
        "true" => Some(Value::Bool(true)),
        "false" => Some(Value::Bool(false)),
        _ => None,
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => format!("{s:?}"),
        Value::DType(d) => d.name().to_string(),
        other => other.describe().to_string(),
    }
}

/// One model, elaborated.
pub struct Elaborated {
    /// What was understood of it.
    pub model: Model,
    /// Its diagnostics.
    pub diags: Vec<Diagnostic>,
    /// The overrides it used: (is a dim, name).
    pub used: Vec<(bool, String)>,
    /// The first tensor each expression evaluated to.
    pub expr_types: ExprTypes,
    /// Whether it is incomplete: it had errors, or used a name whose import failed.
    pub poisoned: bool,
}

/// Elaborates the model `item` of module `module`.
pub fn elaborate_model(
    modules: &Modules,
    module: usize,
    item: &ast::ModelItem,
    overrides: &Overrides,
) -> Elaborated {
    let file = modules.modules[module].file;
    let model = Model {
        name: item.name.name.clone(),
        loc: Loc {
            file,
            span: item.name.span,
        },
        consts: Vec::new(),
        dims: Vec::new(),
        values: Vec::new(),
        inputs: Vec::new(),
        params: Vec::new(),
        nodes: Vec::new(),
        outputs: Vec::new(),
    };
    let mut elab = Elaborator::new(modules, model);
    elab.overrides = overrides.clone();
    let mut frame = Frame::top(module, file);
    elab.exec_block(&mut frame, &item.body);
    if !elab.saw_output && !elab.out_of_steps() {
        let d = Diagnostic::error(
            Code::E0400,
            file,
            item.name.span,
            format!("model `{}` has no output", item.name.name),
        )
        .with_label("declares no `output`")
        .with_help("add `output name = …` for each result");
        elab.diags.push(d);
    }
    let used = elab.used_overrides.iter().cloned().collect();
    let Elaborator {
        model,
        diags,
        expr_types,
        poisoned,
        ..
    } = elab;
    Elaborated {
        poisoned: poisoned || mslc_core::diag::has_errors(&diags),
        model,
        diags,
        used,
        expr_types,
    }
}
