//! Block instances: binding arguments to a block's parameters, matching tensor arguments
//! against shape patterns (binding symbolic dims, checking them where already bound), running
//! the body under the instance's path, and checking the result against the declared type.
//! Also parameter declarations, whose paths are the instance labels joined by `.`.

use mslc_core::diag::Code;
use mslc_core::ops::{DType, TensorType};
use mslc_syntax::ast::{self, Dim, ExprKind, LabelPiece, LabelSeg, ParamKind, ParamType, Span};

use super::eval::{ArgValue, Elaborator, Frame, MAX_INSTANCE_DEPTH, NODE_STEPS};
use super::modules::ItemRef;
use super::suggest;
use super::value::Value;
use mslc_core::program::{Init, Loc, Param};

impl Elaborator<'_> {
    /// A call `f(args)`: a builtin, or an unlabelled block instance.
    pub fn call(
        &mut self,
        frame: &mut Frame,
        callee: &ast::Expr,
        args: Vec<ArgValue>,
        span: Span,
    ) -> Value {
        let ExprKind::Name(name) = &callee.kind else {
            return self.fail(
                frame,
                Code::E0202,
                callee.span,
                "only named functions and blocks can be called",
                "not callable",
            );
        };
        let modules = self.modules;
        let module = &modules.modules[frame.module];
        if let Some((_, ItemRef::Block(_))) = module.lookup(frame.module, name) {
            let ident = ast::Ident {
                name: name.clone(),
                span: callee.span,
            };
            return self.instance(frame, None, &ident, args, span);
        }
        if let Some(v) = self.call_builtin(frame, name, args, span) {
            return v;
        }
        let modules = self.modules;
        let module = &modules.modules[frame.module];
        let blocks: Vec<&str> = module
            .visible_names()
            .filter(|n| matches!(module.lookup(frame.module, n), Some((_, ItemRef::Block(_)))))
            .collect();
        let mut d = self
            .error(
                frame,
                Code::E0202,
                callee.span,
                format!("unknown function `{name}`"),
            )
            .with_label("not a builtin or a block in scope");
        let mut candidates: Vec<&str> = super::builtins::builtin_names().collect();
        candidates.extend(blocks);
        if let Some(s) = suggest::closest(name, candidates) {
            d = d.with_help(format!("did you mean `{s}`?"));
        } else if name.starts_with(|c: char| c.is_ascii_uppercase()) {
            d = d.with_help(format!("import the block: `import std.nn.{name}`"));
        }
        self.report(frame, d);
        Value::Error
    }

    /// `label: Block(args)` (or `Block(args)` with no label).
    pub fn instance(
        &mut self,
        frame: &mut Frame,
        label: Option<(&[LabelSeg], Span)>,
        block: &ast::Ident,
        args: Vec<ArgValue>,
        span: Span,
    ) -> Value {
        let modules = self.modules;
        let module = &modules.modules[frame.module];
        let Some((block_module, ItemRef::Block(item))) = module.lookup(frame.module, &block.name)
        else {
            if module.failed_imports.contains(&block.name) {
                self.poisoned = true;
                return Value::Error;
            }
            let blocks: Vec<&str> = module
                .visible_names()
                .filter(|n| matches!(module.lookup(frame.module, n), Some((_, ItemRef::Block(_)))))
                .collect();
            let mut d = self
                .error(
                    frame,
                    Code::E0201,
                    block.span,
                    format!("cannot find block `{}`", block.name),
                )
                .with_label("no such block in scope");
            d = match suggest::closest(&block.name, blocks.iter().copied()) {
                Some(s) => d.with_help(format!("did you mean `{s}`?")),
                None => d.with_help(format!(
                    "define it with `block {}(…)`, or import it: `import std.nn.{}`",
                    block.name, block.name
                )),
            };
            self.report(frame, d);
            return Value::Error;
        };
        let mut prefix = frame.prefix.clone();
        if let Some((segs, _)) = label {
            for seg in segs {
                match seg {
                    LabelSeg::Name(n) => prefix.push(n.name.clone()),
                    LabelSeg::Index(e) => match self.eval_int(frame, e) {
                        Some(i) => prefix.push(i.to_string()),
                        None => return Value::Error,
                    },
                    LabelSeg::Template(pieces) => {
                        let mut name = String::new();
                        for piece in pieces {
                            match piece {
                                LabelPiece::Text(t) => name.push_str(&t.name),
                                LabelPiece::Hole(e) => match self.eval_int(frame, e) {
                                    Some(i) => name.push_str(&i.to_string()),
                                    None => return Value::Error,
                                },
                            }
                        }
                        prefix.push(name);
                    }
                }
            }
        }
        if args.iter().any(|a| a.value.contains_error()) {
            return Value::Error;
        }
        if self.depth >= MAX_INSTANCE_DEPTH {
            let d = self
                .error(
                    frame,
                    Code::E0211,
                    span,
                    format!("blocks nested more than {MAX_INSTANCE_DEPTH} deep"),
                )
                .with_label("instantiated here")
                .with_help("a block that instantiates itself never ends");
            self.report(frame, d);
            return Value::Error;
        }
        let params_before = self.model.params.len();
        self.depth += 1;
        let result = self.instantiate(frame, block_module, item, prefix, args, span);
        self.depth -= 1;
        if label.is_none() && self.model.params.len() > params_before {
            let d = self
                .error(
                    frame,
                    Code::E0205,
                    span,
                    format!(
                        "this instance of `{}` has parameters but no label",
                        block.name
                    ),
                )
                .with_label("unlabelled instance")
                .with_help(format!(
                    "name it, so its parameters get paths: `name: {}(…)`",
                    block.name
                ));
            self.report(frame, d);
        }
        result
    }

    fn instantiate(
        &mut self,
        caller: &mut Frame,
        module: usize,
        item: usize,
        prefix: Vec<String>,
        args: Vec<ArgValue>,
        span: Span,
    ) -> Value {
        let modules = self.modules;
        let ast::Item::Block(block) = &modules.modules[module].ast.items[item] else {
            return Value::Error;
        };
        let file = modules.modules[module].file;
        let mut frame = Frame {
            prefix,
            call_site: Some(Loc {
                file: caller.file,
                span,
            }),
            block: Some(block.name.name.clone()),
            ..Frame::top(module, file)
        };
        let Some(bound) = self.bind_block_args(caller, block, file, args, span) else {
            return Value::Error;
        };
        for (param, arg) in block.params.iter().zip(bound) {
            let (value, arg_span) = match arg {
                Some(a) => a,
                None => {
                    let Some(default) = &param.default else {
                        return Value::Error;
                    };
                    (self.eval(&mut frame, default), default.span)
                }
            };
            if value.is_error() {
                return Value::Error;
            }
            if !self.check_param(caller, &mut frame, param, &value, arg_span) {
                return Value::Error;
            }
            frame.bind(&param.name.name, value, param.name.span);
        }
        self.exec_block(&mut frame, &block.body);
        let Some((value, ret_span)) = frame.returned.take() else {
            if block.ret.is_some() && !self.out_of_steps() {
                let d = self
                    .error(
                        &frame,
                        Code::E0209,
                        block.name.span,
                        format!("block `{}` ends without `return`", block.name.name),
                    )
                    .with_label("declares a result but returns nothing")
                    .with_help("end the block with `return …`");
                self.report(&frame, d);
                return Value::Error;
            }
            return Value::Tuple(Vec::new());
        };
        if let Some(ret) = &block.ret {
            self.check_return(&mut frame, ret, &value, ret_span);
        }
        value
    }

    /// Binds call arguments to block parameters: `Some(arg)` per given one, `None` for defaults.
    #[allow(clippy::type_complexity)]
    fn bind_block_args(
        &mut self,
        caller: &Frame,
        block: &ast::BlockItem,
        block_file: mslc_core::diag::FileId,
        args: Vec<ArgValue>,
        span: Span,
    ) -> Option<Vec<Option<(Value, Span)>>> {
        let mut bound: Vec<Option<(Value, Span)>> = vec![None; block.params.len()];
        let mut ok = true;
        let mut positional = 0;
        for arg in args {
            let slot = match &arg.name {
                None => {
                    positional += 1;
                    if positional > block.params.len() {
                        let d = self
                            .error(
                                caller,
                                Code::E0203,
                                arg.span,
                                format!(
                                    "`{}` takes {} arguments, this is one more",
                                    block.name.name,
                                    block.params.len()
                                ),
                            )
                            .with_label("extra argument")
                            .with_related(block_file, block.name.span, "block defined here");
                        self.report(caller, d);
                        ok = false;
                        continue;
                    }
                    positional - 1
                }
                Some(n) => match block.params.iter().position(|p| p.name.name == n.name) {
                    Some(slot) => slot,
                    None => {
                        let mut d = self
                            .error(
                                caller,
                                Code::E0204,
                                n.span,
                                format!("`{}` has no parameter `{}`", block.name.name, n.name),
                            )
                            .with_label("unknown parameter")
                            .with_related(block_file, block.name.span, "block defined here");
                        if let Some(s) = suggest::closest(
                            &n.name,
                            block.params.iter().map(|p| p.name.name.as_str()),
                        ) {
                            d = d.with_help(format!("did you mean `{s}`?"));
                        }
                        self.report(caller, d);
                        ok = false;
                        continue;
                    }
                },
            };
            if bound[slot].is_some() {
                let d = self
                    .error(
                        caller,
                        Code::E0204,
                        arg.span,
                        format!(
                            "parameter `{}` is given twice",
                            block.params[slot].name.name
                        ),
                    )
                    .with_label("given again here");
                self.report(caller, d);
                ok = false;
                continue;
            }
            bound[slot] = Some((arg.value, arg.span));
        }
        for (param, slot) in block.params.iter().zip(&bound) {
            if slot.is_none() && param.default.is_none() {
                let d = self
                    .error(
                        caller,
                        Code::E0203,
                        span,
                        format!(
                            "missing argument `{}` of `{}`",
                            param.name.name, block.name.name
                        ),
                    )
                    .with_label("in this instance")
                    .with_related(block_file, param.name.span, "parameter declared here");
                self.report(caller, d);
                ok = false;
            }
        }
        ok.then_some(bound)
    }

    /// Checks an argument against its parameter's declared type; binds pattern dims in `frame`.
    fn check_param(
        &mut self,
        caller: &Frame,
        frame: &mut Frame,
        param: &ast::BlockParam,
        value: &Value,
        span: Span,
    ) -> bool {
        match &param.ty {
            ParamType::Scalar(kind) => {
                let ok = matches!(
                    (kind.name.as_str(), value),
                    ("int", Value::Int(_))
                        | ("float", Value::Float(_) | Value::Int(_))
                        | ("bool", Value::Bool(_))
                        | ("str", Value::Str(_))
                        | ("dtype", Value::DType(_))
                        | ("shape", Value::List(_))
                );
                if !ok {
                    let d = self
                        .error(
                            caller,
                            Code::E0305,
                            span,
                            format!(
                                "`{}` expects {} {}, found {}",
                                param.name.name,
                                article(&kind.name),
                                kind.name,
                                value.describe()
                            ),
                        )
                        .with_label(format!("this is {}", value.describe()))
                        .with_related(frame.file, kind.span, "expected because of this");
                    self.report(caller, d);
                }
                ok
            }
            ParamType::Tensor(pattern) => {
                let Value::Tensor(t) = value else {
                    let d = self
                        .error(
                            caller,
                            Code::E0305,
                            span,
                            format!(
                                "`{}` expects a tensor, found {}",
                                param.name.name,
                                value.describe()
                            ),
                        )
                        .with_label(format!("this is {}", value.describe()))
                        .with_related(frame.file, pattern.span, "expected because of this");
                    self.report(caller, d);
                    return false;
                };
                let ty = self.model.ty(*t).clone();
                self.match_pattern(
                    caller,
                    frame,
                    pattern,
                    &ty,
                    span,
                    &format!("`{}`", param.name.name),
                )
            }
        }
    }

    /// Matches `ty` against `pattern`, binding names not yet bound. Reports at `span` (the caller).
    fn match_pattern(
        &mut self,
        caller: &Frame,
        frame: &mut Frame,
        pattern: &ast::TensorType,
        ty: &TensorType,
        span: Span,
        what: &str,
    ) -> bool {
        if let Some(d) = &pattern.dtype {
            if DType::parse(&d.name) != Some(ty.dtype) {
                let diag = self
                    .error(
                        caller,
                        Code::E0306,
                        span,
                        format!("{what} must be {}, found {}", d.name, ty.dtype.name()),
                    )
                    .with_label(format!("this is {ty}"))
                    .with_related(frame.file, d.span, "expected because of this")
                    .with_help(format!("convert it: `cast(x, {})`", d.name));
                self.report(caller, diag);
                return false;
            }
        }
        let ellipsis = pattern
            .dims
            .iter()
            .position(|d| matches!(d, Dim::Ellipsis(_)));
        let fixed = pattern.dims.len() - usize::from(ellipsis.is_some());
        let rank = ty.rank();
        if rank < fixed || (ellipsis.is_none() && rank != fixed) {
            let expected = if ellipsis.is_some() {
                format!("at least {fixed}")
            } else {
                fixed.to_string()
            };
            let d = self
                .error(
                    caller,
                    Code::E0300,
                    span,
                    format!("{what} expects {expected} dims, found {rank}: {ty}"),
                )
                .with_label(format!("this is {ty}"))
                .with_related(frame.file, pattern.span, "expected because of this pattern");
            self.report(caller, d);
            return false;
        }
        for (i, dim) in pattern.dims.iter().enumerate() {
            let actual_index = match ellipsis {
                Some(e) if i > e => rank - (pattern.dims.len() - i),
                _ => i,
            };
            let expr = match dim {
                Dim::Ellipsis(_) | Dim::Wildcard(_) => continue,
                Dim::Expr(e) => e,
            };
            // An `...` may match no dim at all (a scalar against `[...]`): read a size only
            // where the pattern names one.
            let actual = ty.shape[actual_index];
            if let ExprKind::Name(name) = &expr.kind {
                match frame.lookup(name).cloned() {
                    None => {
                        frame.bind(name, Value::Int(actual), expr.span);
                        continue;
                    }
                    Some(b) => {
                        if b.value != Value::Int(actual) && !b.value.is_error() {
                            let shown = match &b.value {
                                Value::Int(v) => v.to_string(),
                                other => other.describe().to_string(),
                            };
                            let d = self
                                .error(caller, Code::E0301, span, format!("dim `{name}` is {shown}, but {what} has {actual} there ({ty})"))
                                .with_label(format!("this is {ty}"))
                                .with_related(frame.file, expr.span, format!("`{name}` must be {shown} here"))
                                .with_related(frame.file, b.span, format!("`{name}` bound to {shown} here"));
                            self.report(caller, d);
                            return false;
                        }
                        continue;
                    }
                }
            }
            match self.eval(frame, expr) {
                Value::Int(v) if v == actual => {}
                Value::Error => return false,
                Value::Int(v) => {
                    let d = self
                        .error(
                            caller,
                            Code::E0300,
                            span,
                            format!(
                                "{what} must have {v} at dim {actual_index}, found {actual} ({ty})"
                            ),
                        )
                        .with_label(format!("this is {ty}"))
                        .with_related(
                            frame.file,
                            expr.span,
                            format!("expected {v} because of this"),
                        );
                    self.report(caller, d);
                    return false;
                }
                other => {
                    let d = self
                        .error(
                            frame,
                            Code::E0305,
                            expr.span,
                            format!("a dimension must be an int, found {}", other.describe()),
                        )
                        .with_label("not an int");
                    self.report(frame, d);
                    return false;
                }
            }
        }
        true
    }

    fn check_return(&mut self, frame: &mut Frame, ret: &ast::RetType, value: &Value, span: Span) {
        let patterns: Vec<&ast::TensorType> = match ret {
            ast::RetType::Tensor(t) => vec![t],
            ast::RetType::Tuple(ts, _) => ts.iter().collect(),
        };
        let values: Vec<Value> = match (ret, value) {
            (_, Value::Error) => return,
            (ast::RetType::Tensor(_), v) => vec![v.clone()],
            (ast::RetType::Tuple(..), Value::Tuple(items)) => items.clone(),
            (ast::RetType::Tuple(..), other) => vec![other.clone()],
        };
        if values.len() != patterns.len() {
            let d = self
                .error(
                    frame,
                    Code::E0304,
                    span,
                    format!(
                        "returns {} values, the signature declares {}",
                        values.len(),
                        patterns.len()
                    ),
                )
                .with_label("returned here");
            self.report(frame, d);
            return;
        }
        for (pattern, v) in patterns.into_iter().zip(values) {
            let Value::Tensor(t) = v else {
                if !v.is_error() {
                    let d = self
                        .error(
                            frame,
                            Code::E0304,
                            span,
                            format!("returns {}, the signature declares a tensor", v.describe()),
                        )
                        .with_label("returned here")
                        .with_related(frame.file, pattern.span, "declared here");
                    self.report(frame, d);
                }
                continue;
            };
            let ty = self.model.ty(t).clone();
            // Match against a copy, so names the result binds do not leak into the block.
            let mut scratch = frame.clone();
            let before = self.diags.len();
            if !self.match_pattern(frame, &mut scratch, pattern, &ty, span, "the result") {
                for d in &mut self.diags[before..] {
                    d.code = Code::E0304;
                }
            }
        }
    }

    /// `param name: [dims] ~ init` (or `buffer`): creates the parameter at the instance path.
    pub fn declare_param(
        &mut self,
        frame: &mut Frame,
        kind: ParamKind,
        name: &ast::Ident,
        ty: &ast::TensorType,
        init: Option<&ast::Expr>,
        span: Span,
    ) {
        let mut shape = Vec::new();
        for dim in &ty.dims {
            let Dim::Expr(e) = dim else {
                let s = match dim {
                    Dim::Ellipsis(s) | Dim::Wildcard(s) => *s,
                    Dim::Expr(e) => e.span,
                };
                let d = self
                    .error(
                        frame,
                        Code::E0309,
                        s,
                        "a parameter's dims must all be known",
                    )
                    .with_label("not a size");
                self.report(frame, d);
                return;
            };
            match self.eval_int(frame, e) {
                Some(v) if v >= 0 => shape.push(v),
                Some(v) => {
                    let d = self
                        .error(
                            frame,
                            Code::E0309,
                            e.span,
                            format!("dimension {v} is negative"),
                        )
                        .with_label("must be ≥ 0");
                    self.report(frame, d);
                    return;
                }
                None => return,
            }
        }
        let dtype = match &ty.dtype {
            Some(d) => DType::parse(&d.name).unwrap_or(DType::F32),
            None => DType::F32,
        };
        let init = match init {
            None if kind == ParamKind::Buffer => Init::Zeros,
            None => Init::Normal {
                mean: 0.0,
                std: 0.02,
            },
            Some(e) => match self.eval(frame, e) {
                Value::Init(i) => i,
                Value::Error => return,
                other => {
                    let d = self
                        .error(frame, Code::E0305, e.span, format!("expected an initializer, found {}", other.describe()))
                        .with_label("not an initializer")
                        .with_help("use `zeros`, `ones`, `normal(mean, std)`, `uniform(low, high)` or `constant(v)`");
                    self.report(frame, d);
                    return;
                }
            },
        };
        let mut path = frame.prefix.clone();
        path.push(name.name.clone());
        let path = path.join(".");
        let loc = Loc {
            file: frame.file,
            span,
        };
        if let Some(first) = self.param_paths.get(&path).copied() {
            let d = self
                .error(
                    frame,
                    Code::E0206,
                    name.span,
                    format!("parameter `{path}` is defined twice"),
                )
                .with_label("defined again here")
                .with_related(first.file, first.span, "first defined here")
                .with_help("give the instances different labels");
            self.report(frame, d);
            frame.bind(&name.name, Value::Error, name.span);
            return;
        }
        if !self.tick(frame, span, NODE_STEPS) {
            frame.bind(&name.name, Value::Error, name.span);
            return;
        }
        self.param_paths.insert(path.clone(), loc);
        let value = self.model.new_value(TensorType::new(dtype, shape));
        self.model.params.push(Param {
            path,
            value,
            init,
            trainable: kind == ParamKind::Param,
            loc,
        });
        frame.bind(&name.name, Value::Tensor(value), name.span);
    }
}

/// `"an"` before a word starting with a vowel, else `"a"`.
pub(super) fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

#[cfg(test)]
mod tests {
    use crate::{check_source, CheckOptions};

    fn check(body: &str) -> crate::Checked {
        let src = format!(
            "import std.nn.LayerNorm\n\nmodel M {{\n    input x: f32[2, 4]\n{body}\n    output o = x\n}}\n"
        );
        check_source("m.msl", &src, &CheckOptions::default())
    }

    fn paths(body: &str) -> Vec<String> {
        let checked = check(body);
        assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
        checked.models[0]
            .params
            .iter()
            .map(|p| p.path.clone())
            .collect()
    }

    #[test]
    fn label_templates_splice_ints_into_a_segment() {
        let body = "for i in 0..2 {\n    x = enc.blk{2 * i}_{i}x.ln: LayerNorm(x)\n}";
        assert_eq!(
            paths(body),
            [
                "enc.blk0_0x.ln.weight",
                "enc.blk0_0x.ln.bias",
                "enc.blk2_1x.ln.weight",
                "enc.blk2_1x.ln.bias"
            ]
        );
    }

    #[test]
    fn dotted_params_have_their_path_and_are_used_by_it() {
        let body = "param encoder.pos_embedding: [1, 4] ~ zeros\nx = x + encoder.pos_embedding";
        assert_eq!(paths(body), ["encoder.pos_embedding"]);
        // The same path from an instance is a duplicate.
        let twice = "param ln.weight: [4] ~ ones\nx = ln: LayerNorm(x)";
        let codes: Vec<&str> = check(twice)
            .diagnostics
            .iter()
            .map(|d| d.code.as_str())
            .collect();
        assert_eq!(codes, ["E0206"]);
    }
}
