//! The values policy fields hold, and the small evaluator that computes them from expressions:
//! literals, quantities with units, names used as words, lists, tuples, records, calls with
//! named arguments and integer/float arithmetic. Anything else is reported, never evaluated.

use mslc_core::diag::{Code, Diagnostic};
use mslc_syntax::ast::{BinOp, Expr, ExprKind, Ident, Span, UnOp};

use super::report::Reporter;

/// What a quantity measures; its amount is kept in the base unit (bytes, bytes/s, FLOP/s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// `B KB MB GB TB KiB MiB GiB TiB`
    Bytes,
    /// `B/s KB/s MB/s GB/s TB/s`
    BytesPerSecond,
    /// `FLOPS GFLOPS TFLOPS PFLOPS`
    Flops,
}

impl Unit {
    /// The unit a suffix denotes and the factor to the base unit.
    fn parse(suffix: &str) -> Option<(Unit, f64)> {
        const KIBI: f64 = 1024.0;
        Some(match suffix {
            "B" => (Unit::Bytes, 1.0),
            "KB" => (Unit::Bytes, 1e3),
            "MB" => (Unit::Bytes, 1e6),
            "GB" => (Unit::Bytes, 1e9),
            "TB" => (Unit::Bytes, 1e12),
            "KiB" => (Unit::Bytes, KIBI),
            "MiB" => (Unit::Bytes, KIBI * KIBI),
            "GiB" => (Unit::Bytes, KIBI * KIBI * KIBI),
            "TiB" => (Unit::Bytes, KIBI * KIBI * KIBI * KIBI),
            "B/s" => (Unit::BytesPerSecond, 1.0),
            "KB/s" => (Unit::BytesPerSecond, 1e3),
            "MB/s" => (Unit::BytesPerSecond, 1e6),
            "GB/s" => (Unit::BytesPerSecond, 1e9),
            "TB/s" => (Unit::BytesPerSecond, 1e12),
            "FLOPS" => (Unit::Flops, 1.0),
            "GFLOPS" => (Unit::Flops, 1e9),
            "TFLOPS" => (Unit::Flops, 1e12),
            "PFLOPS" => (Unit::Flops, 1e15),
            _ => return None,
        })
    }

    /// How a value of this unit is called in messages.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Unit::Bytes => "a size",
            Unit::BytesPerSecond => "a bandwidth",
            Unit::Flops => "a compute rate",
        }
    }
}

/// An evaluated field value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// An amount in the unit's base unit.
    Quantity(Unit, f64),
    /// `O2`, `semi_auto`, `std.targets.cpu`: a word or a dotted path of words.
    Name(Vec<Ident>),
    /// `_` in a list.
    Wildcard,
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Record(Vec<(Ident, Value)>),
    /// `f(a, key: b)`
    Call(Ident, Vec<(Option<Ident>, Value)>),
}

/// A value with the span of the expression it came from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Value {
    pub val: Val,
    pub span: Span,
}

impl Value {
    /// The single word this value is, if it is one.
    pub(crate) fn word(&self) -> Option<&Ident> {
        match &self.val {
            Val::Name(path) if path.len() == 1 => path.first(),
            _ => None,
        }
    }

    /// The value as a number, if it is an integer or a float.
    pub(crate) fn number(&self) -> Option<f64> {
        match self.val {
            Val::Int(i) => Some(i as f64),
            Val::Float(f) => Some(f),
            _ => None,
        }
    }

    /// What the value is, for "expected …, found …" messages.
    pub(crate) fn describe(&self) -> String {
        match &self.val {
            Val::Int(i) => format!("the integer `{i}`"),
            Val::Float(f) => format!("the number `{f}`"),
            Val::Bool(b) => format!("`{b}`"),
            Val::Str(s) => format!("the string {s:?}"),
            Val::Quantity(unit, _) => unit.noun().to_string(),
            Val::Name(path) => {
                let names: Vec<&str> = path.iter().map(|i| i.name.as_str()).collect();
                format!("the name `{}`", names.join("."))
            }
            Val::Wildcard => "`_`".to_string(),
            Val::List(_) => "a list".to_string(),
            Val::Tuple(_) => "a tuple".to_string(),
            Val::Record(_) => "a record".to_string(),
            Val::Call(name, _) => format!("a call to `{}`", name.name),
        }
    }
}

/// Evaluates a field expression. Every problem is reported; `None` means at least one was.
pub(crate) fn eval(expr: &Expr, rep: &mut Reporter) -> Option<Value> {
    let span = expr.span;
    let val = match &expr.kind {
        ExprKind::Int(i) => Val::Int(*i),
        ExprKind::Float(f) => Val::Float(*f),
        ExprKind::Bool(b) => Val::Bool(*b),
        ExprKind::Str(s) => Val::Str(s.clone()),
        ExprKind::Wildcard => Val::Wildcard,
        ExprKind::Quantity { value, unit, .. } => {
            let Some((unit, factor)) = Unit::parse(unit) else {
                rep.push(
                    rep.error(Code::E0502, span, format!("unknown unit `{unit}`"))
                        .with_label("not a unit of size, bandwidth or compute"),
                );
                return None;
            };
            Val::Quantity(unit, value * factor)
        }
        ExprKind::Name(_) | ExprKind::Field { .. } => match path(expr) {
            Some(path) => Val::Name(path),
            None => return unsupported(expr, rep),
        },
        ExprKind::Paren(inner) => return eval(inner, rep).map(|v| Value { span, ..v }),
        ExprKind::List(items) => Val::List(eval_all(items.iter(), rep)?),
        ExprKind::Tuple(items) => Val::Tuple(eval_all(items.iter(), rep)?),
        ExprKind::Record(fields) => {
            let values = eval_all(fields.iter().map(|(_, e)| e), rep)?;
            Val::Record(fields.iter().map(|(k, _)| k.clone()).zip(values).collect())
        }
        ExprKind::Call { callee, args } => {
            let name = match &callee.kind {
                ExprKind::Name(name) => Ident {
                    name: name.clone(),
                    span: callee.span,
                },
                _ => return unsupported(callee, rep),
            };
            let values = eval_all(args.iter().map(|a| &a.value), rep)?;
            Val::Call(
                name,
                args.iter().map(|a| a.name.clone()).zip(values).collect(),
            )
        }
        ExprKind::Unary { op, expr: operand } => {
            let operand = eval(operand, rep)?;
            return unary(*op, operand, span, rep);
        }
        ExprKind::Binary { op, lhs, rhs } => {
            let (lhs, rhs) = (eval(lhs, rep), eval(rhs, rep));
            return binary(*op, lhs?, rhs?, span, rep);
        }
        ExprKind::Index { .. } | ExprKind::Instance { .. } | ExprKind::Annotated { .. } => {
            return unsupported(expr, rep)
        }
    };
    Some(Value { val, span })
}

/// Evaluates every expression, reporting all problems; `None` if any failed.
fn eval_all<'e>(exprs: impl Iterator<Item = &'e Expr>, rep: &mut Reporter) -> Option<Vec<Value>> {
    let values: Vec<Option<Value>> = exprs.map(|e| eval(e, rep)).collect();
    values.into_iter().collect()
}

/// `a.b.c` as a list of words, if the expression is one.
fn path(expr: &Expr) -> Option<Vec<Ident>> {
    match &expr.kind {
        ExprKind::Name(name) => Some(vec![Ident {
            name: name.clone(),
            span: expr.span,
        }]),
        ExprKind::Field { base, name } => {
            let mut path = path(base)?;
            path.push(name.clone());
            Some(path)
        }
        _ => None,
    }
}

fn unsupported(expr: &Expr, rep: &mut Reporter) -> Option<Value> {
    rep.push(
        rep.error(
            Code::E0502,
            expr.span,
            "this expression cannot be a field value",
        )
        .with_label("not a constant")
        .with_help(
            "field values are literals, sizes like `31GB`, words, lists, tuples, records, \
                 calls like `dynamic(init: 1024)` and integer or float arithmetic",
        ),
    );
    None
}

fn unary(op: UnOp, operand: Value, span: Span, rep: &mut Reporter) -> Option<Value> {
    let val = match (op, &operand.val) {
        (UnOp::Neg, Val::Int(i)) => match i.checked_neg() {
            Some(n) => Val::Int(n),
            None => return overflow(span, rep),
        },
        (UnOp::Neg, Val::Float(f)) => Val::Float(-f),
        (UnOp::Neg, Val::Quantity(unit, amount)) => Val::Quantity(*unit, -amount),
        (UnOp::Not, Val::Bool(b)) => Val::Bool(!b),
        _ => {
            let symbol = if op == UnOp::Neg { "-" } else { "!" };
            rep.push(
                rep.error(
                    Code::E0502,
                    span,
                    format!("`{symbol}` cannot be applied to {}", operand.describe()),
                )
                .with_label("invalid operand"),
            );
            return None;
        }
    };
    Some(Value { val, span })
}

fn binary(op: BinOp, lhs: Value, rhs: Value, span: Span, rep: &mut Reporter) -> Option<Value> {
    let val = match (&lhs.val, &rhs.val) {
        (Val::Int(a), Val::Int(b)) => return int_arith(op, *a, *b, span, rep),
        (Val::Quantity(u, a), Val::Quantity(v, b)) if u == v => match op {
            BinOp::Add => Val::Quantity(*u, a + b),
            BinOp::Sub => Val::Quantity(*u, a - b),
            _ => return bad_operands(op, &lhs, &rhs, span, rep),
        },
        (Val::Quantity(u, a), _) if rhs.number().is_some() => {
            let b = rhs.number().unwrap_or(1.0);
            match op {
                BinOp::Mul => Val::Quantity(*u, a * b),
                BinOp::Div if b != 0.0 => Val::Quantity(*u, a / b),
                BinOp::Div => return division_by_zero(span, rep),
                _ => return bad_operands(op, &lhs, &rhs, span, rep),
            }
        }
        (_, Val::Quantity(u, b)) if lhs.number().is_some() && op == BinOp::Mul => {
            Val::Quantity(*u, lhs.number().unwrap_or(1.0) * b)
        }
        _ => match (lhs.number(), rhs.number()) {
            (Some(a), Some(b)) => Val::Float(match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a * b,
                BinOp::Div | BinOp::Rem if b == 0.0 => return division_by_zero(span, rep),
                BinOp::Div => a / b,
                BinOp::Rem => a % b,
                _ => return bad_operands(op, &lhs, &rhs, span, rep),
            }),
            _ => return bad_operands(op, &lhs, &rhs, span, rep),
        },
    };
    let finite = match val {
        Val::Float(f) | Val::Quantity(_, f) => f.is_finite(),
        _ => true,
    };
    if !finite {
        return overflow(span, rep);
    }
    Some(Value { val, span })
}

fn int_arith(op: BinOp, a: i64, b: i64, span: Span, rep: &mut Reporter) -> Option<Value> {
    let result = match op {
        BinOp::Add => a.checked_add(b),
        BinOp::Sub => a.checked_sub(b),
        BinOp::Mul => a.checked_mul(b),
        BinOp::Div | BinOp::Rem if b == 0 => return division_by_zero(span, rep),
        BinOp::Div => match a.checked_rem(b) {
            Some(0) | None => a.checked_div(b),
            Some(remainder) => {
                rep.push(
                    rep.error(Code::E0302, span, format!("{a} / {b} is not exact"))
                        .with_label(format!("leaves a remainder of {remainder}"))
                        .with_help(
                            "integer division must be exact; write a float (`1.0`) to divide",
                        ),
                );
                return None;
            }
        },
        BinOp::Rem => a.checked_rem(b),
        _ => {
            let (lhs, rhs) = (Val::Int(a), Val::Int(b));
            let wrap = |val| Value { val, span };
            return bad_operands(op, &wrap(lhs), &wrap(rhs), span, rep);
        }
    };
    match result {
        Some(i) => Some(Value {
            val: Val::Int(i),
            span,
        }),
        None => overflow(span, rep),
    }
}

fn bad_operands(
    op: BinOp,
    lhs: &Value,
    rhs: &Value,
    span: Span,
    rep: &mut Reporter,
) -> Option<Value> {
    let message = format!(
        "`{}` cannot combine {} and {}",
        op.symbol(),
        lhs.describe(),
        rhs.describe()
    );
    rep.push(
        rep.error(Code::E0502, span, message)
            .with_label("invalid operands")
            .with_help(
                "field values allow `+ - * / %` on numbers, and scaling a quantity by a number",
            ),
    );
    None
}

fn overflow(span: Span, rep: &mut Reporter) -> Option<Value> {
    rep.push(diag(
        rep,
        Code::E0308,
        span,
        "arithmetic overflow",
        "the result is out of range",
    ));
    None
}

fn division_by_zero(span: Span, rep: &mut Reporter) -> Option<Value> {
    rep.push(diag(
        rep,
        Code::E0308,
        span,
        "division by zero",
        "the divisor is zero",
    ));
    None
}

fn diag(rep: &Reporter, code: Code, span: Span, message: &str, label: &str) -> Diagnostic {
    rep.error(code, span, message).with_label(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::field_expr;
    use mslc_core::diag::FileId;

    fn run(src: &str) -> (Option<Val>, Vec<Diagnostic>) {
        let expr = field_expr(src);
        let mut diags = Vec::new();
        let value = eval(&expr, &mut Reporter::new(FileId(0), &mut diags));
        (value.map(|v| v.val), diags)
    }

    fn ok(src: &str) -> Val {
        let (value, diags) = run(src);
        assert!(diags.is_empty(), "{src}: {diags:?}");
        value.expect("a value")
    }

    fn codes(src: &str) -> Vec<Code> {
        run(src).1.iter().map(|d| d.code).collect()
    }

    #[test]
    fn literals_and_arithmetic() {
        assert_eq!(ok("2 * 4 + 1"), Val::Int(9));
        assert_eq!(ok("-1"), Val::Int(-1));
        assert_eq!(ok("12 / 4"), Val::Int(3));
        assert_eq!(ok("7 % 4"), Val::Int(3));
        assert_eq!(ok("1 / 2.0"), Val::Float(0.5));
        assert_eq!(ok("(3)"), Val::Int(3));
        assert_eq!(ok("!true"), Val::Bool(false));
        assert_eq!(ok("\"x\""), Val::Str("x".into()));
    }

    #[test]
    fn quantities_use_decimal_and_binary_prefixes() {
        assert_eq!(ok("31GB"), Val::Quantity(Unit::Bytes, 31e9));
        assert_eq!(ok("512MiB"), Val::Quantity(Unit::Bytes, 512.0 * 1048576.0));
        assert_eq!(
            ok("2 * 16GiB"),
            Val::Quantity(Unit::Bytes, 32.0 * 1073741824.0)
        );
        assert_eq!(ok("1TB - 1GB"), Val::Quantity(Unit::Bytes, 999e9));
        assert_eq!(ok("1.6TB/s"), Val::Quantity(Unit::BytesPerSecond, 1.6e12));
        assert_eq!(ok("312TFLOPS / 2"), Val::Quantity(Unit::Flops, 156e12));
    }

    #[test]
    fn structures_keep_names_and_spans() {
        let Val::Call(name, args) = ok("dynamic(init: 65536, factor: 2)") else {
            panic!("not a call")
        };
        assert_eq!(name.name, "dynamic");
        assert_eq!(args.len(), 2);
        assert_eq!(args[0].0.as_ref().map(|i| i.name.as_str()), Some("init"));
        let Val::Name(path) = ok("std.targets.ascend910b") else {
            panic!("not a path")
        };
        assert_eq!(path.len(), 3);
        assert!(matches!(ok("[mp, _]"), Val::List(v) if v[1].val == Val::Wildcard));
        assert!(matches!(ok("{dp: 2}"), Val::Record(v) if v[0].1.val == Val::Int(2)));
        assert!(matches!(ok("(0.9, 0.95)"), Val::Tuple(v) if v.len() == 2));
        assert!(matches!(ok("1f1b"), Val::Name(p) if p[0].name == "1f1b"));
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        assert_eq!(codes("7 / 2"), vec![Code::E0302]);
        assert_eq!(codes("1 / 0"), vec![Code::E0308]);
        assert_eq!(codes("1.0 % 0"), vec![Code::E0308]);
        assert_eq!(codes("9223372036854775807 + 1"), vec![Code::E0308]);
        assert_eq!(codes("(-9223372036854775807 - 1) / -1"), vec![Code::E0308]);
        assert_eq!(codes("(-9223372036854775807 - 1) % -1"), vec![Code::E0308]);
        assert_eq!(codes("1GB + 1TB/s"), vec![Code::E0502]);
        assert_eq!(codes("true + 1"), vec![Code::E0502]);
        assert_eq!(codes("x[0]"), vec![Code::E0502]);
        assert_eq!(codes("-\"s\""), vec![Code::E0502]);
        assert_eq!(codes("a.b(1)"), vec![Code::E0502]);
        // Every failing element is reported, not only the first.
        assert_eq!(codes("[1 / 0, 3 / 2]"), vec![Code::E0308, Code::E0302]);
    }
}
