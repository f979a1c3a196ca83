//! The built-in functions of `.msl` expressions and how each becomes an op of the registry:
//! which arguments are tensors, which become attributes, and their defaults. Shape and dtype
//! rules are not here — the registry applies them when the op is emitted.

use mslc_core::ops::{AttrValue, Attrs, BinaryOp, DType, Op, UnaryOp};
use mslc_core::span::Span;

use super::eval::{attr_of, ArgValue, Elaborator, Frame};
use super::value::Value;
use mslc_core::diag::Code;
use mslc_core::program::Init;

/// A parameter's default.
#[derive(Clone, Copy)]
enum Dflt {
    /// Must be given.
    Required,
    /// May be left out (the op decides).
    Absent,
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
    /// A bool.
    Bool(bool),
    /// A pair of ints.
    Pair(i64),
    /// A dtype.
    DType(DType),
}

/// How a builtin lowers.
#[derive(Clone, Copy)]
enum Lower {
    /// The first `tensors` parameters are operands, the rest attributes of the same name.
    Op(Op, usize),
    /// A reduction: `axis` (int, list or absent = all) becomes `axes`.
    Reduce(Op),
    /// `reshape`: one `-1` is inferred.
    Reshape,
    /// `concat`: a list of tensors.
    Concat,
    /// `rope(x)` or `rope(q, k)`.
    Rope,
    /// `split(x, sizes, axis)`: a tuple of `slice`s, torch.split's pieces.
    Split,
    /// `chunk(x, n, axis)`: a tuple of `slice`s, torch.chunk's pieces.
    Chunk,
    /// An initializer.
    Init(&'static str),
}

#[derive(Clone, Copy)]
struct Builtin {
    name: &'static str,
    lower: Lower,
    params: &'static [(&'static str, Dflt)],
}

use Dflt::*;

const X: &[(&str, Dflt)] = &[("x", Required)];
const AB: &[(&str, Dflt)] = &[("a", Required), ("b", Required)];

const OTHERS: &[Builtin] = &[
    Builtin {
        name: "matmul",
        lower: Lower::Op(Op::Matmul, 2),
        params: &[
            ("a", Required),
            ("b", Required),
            ("transpose_a", Bool(false)),
            ("transpose_b", Bool(false)),
        ],
    },
    Builtin {
        name: "cast",
        lower: Lower::Op(Op::Cast, 1),
        params: &[("x", Required), ("dtype", Required)],
    },
    Builtin {
        name: "transpose",
        lower: Lower::Op(Op::Transpose, 1),
        params: &[("x", Required), ("perm", Required)],
    },
    Builtin {
        name: "reshape",
        lower: Lower::Reshape,
        params: &[("x", Required), ("shape", Required)],
    },
    Builtin {
        name: "broadcast_to",
        lower: Lower::Op(Op::BroadcastTo, 1),
        params: &[("x", Required), ("shape", Required)],
    },
    Builtin {
        name: "concat",
        lower: Lower::Concat,
        params: &[("xs", Required), ("axis", Int(0))],
    },
    Builtin {
        name: "split",
        lower: Lower::Split,
        params: &[("x", Required), ("sizes", Required), ("axis", Int(0))],
    },
    Builtin {
        name: "chunk",
        lower: Lower::Chunk,
        params: &[("x", Required), ("n", Required), ("axis", Int(0))],
    },
    Builtin {
        name: "slice",
        lower: Lower::Op(Op::Slice, 1),
        params: &[
            ("x", Required),
            ("axis", Required),
            ("start", Required),
            ("end", Required),
        ],
    },
    Builtin {
        name: "select",
        lower: Lower::Op(Op::Select, 1),
        params: &[("x", Required), ("axis", Required), ("index", Required)],
    },
    Builtin {
        name: "sum",
        lower: Lower::Reduce(Op::Sum),
        params: &[("x", Required), ("axis", Absent), ("keepdim", Bool(false))],
    },
    Builtin {
        name: "mean",
        lower: Lower::Reduce(Op::Mean),
        params: &[("x", Required), ("axis", Absent), ("keepdim", Bool(false))],
    },
    Builtin {
        name: "max",
        lower: Lower::Reduce(Op::Max),
        params: &[("x", Required), ("axis", Absent), ("keepdim", Bool(false))],
    },
    Builtin {
        name: "softmax",
        lower: Lower::Op(Op::Softmax, 1),
        params: &[("x", Required), ("axis", Int(-1))],
    },
    Builtin {
        name: "log_softmax",
        lower: Lower::Op(Op::LogSoftmax, 1),
        params: &[("x", Required), ("axis", Int(-1))],
    },
    Builtin {
        name: "rms_norm",
        lower: Lower::Op(Op::RmsNorm, 1),
        params: &[("x", Required), ("eps", Float(1e-6))],
    },
    Builtin {
        name: "layer_norm",
        lower: Lower::Op(Op::LayerNorm, 1),
        params: &[("x", Required), ("eps", Float(1e-5))],
    },
    Builtin {
        name: "batch_norm",
        lower: Lower::Op(Op::BatchNorm, 3),
        params: &[
            ("x", Required),
            ("mean", Required),
            ("var", Required),
            ("eps", Float(1e-5)),
            ("momentum", Float(0.1)),
        ],
    },
    Builtin {
        name: "embedding",
        lower: Lower::Op(Op::Embedding, 2),
        params: &[("ids", Required), ("table", Required)],
    },
    Builtin {
        name: "rope",
        lower: Lower::Rope,
        params: &[("x", Required), ("k", Absent), ("theta", Float(10000.0))],
    },
    Builtin {
        name: "attention",
        lower: Lower::Op(Op::Attention, 3),
        params: &[
            ("q", Required),
            ("k", Required),
            ("v", Required),
            ("causal", Bool(false)),
            ("scale", Absent),
        ],
    },
    Builtin {
        name: "causal_mask",
        lower: Lower::Op(Op::CausalMask, 0),
        params: &[("size", Required), ("dtype", DType(DType::F32))],
    },
    Builtin {
        name: "dropout",
        lower: Lower::Op(Op::Dropout, 1),
        params: &[("x", Required), ("p", Float(0.5))],
    },
    Builtin {
        name: "conv2d",
        lower: Lower::Op(Op::Conv2d, 2),
        params: &[
            ("x", Required),
            ("w", Required),
            ("stride", Pair(1)),
            ("padding", Pair(0)),
            ("dilation", Pair(1)),
            ("groups", Int(1)),
        ],
    },
    Builtin {
        name: "max_pool2d",
        lower: Lower::Op(Op::MaxPool2d, 1),
        params: &[
            ("x", Required),
            ("kernel", Required),
            ("stride", Absent),
            ("padding", Pair(0)),
        ],
    },
    Builtin {
        name: "avg_pool2d",
        lower: Lower::Op(Op::AvgPool2d, 1),
        params: &[
            ("x", Required),
            ("kernel", Required),
            ("stride", Absent),
            ("padding", Pair(0)),
        ],
    },
    Builtin {
        name: "adaptive_avg_pool2d",
        lower: Lower::Op(Op::AdaptiveAvgPool2d, 1),
        params: &[("x", Required), ("output", Required)],
    },
    Builtin {
        name: "cross_entropy",
        lower: Lower::Op(Op::CrossEntropy, 2),
        params: &[
            ("logits", Required),
            ("labels", Required),
            ("ignore_index", Int(-100)),
            ("label_smoothing", Float(0.0)),
        ],
    },
    Builtin {
        name: "mse_loss",
        lower: Lower::Op(Op::MseLoss, 2),
        params: AB,
    },
    Builtin {
        name: "normal",
        lower: Lower::Init("normal"),
        params: &[("mean", Float(0.0)), ("std", Float(1.0))],
    },
    Builtin {
        name: "uniform",
        lower: Lower::Init("uniform"),
        params: &[("low", Float(0.0)), ("high", Float(1.0))],
    },
    Builtin {
        name: "constant",
        lower: Lower::Init("constant"),
        params: &[("value", Required)],
    },
];

/// Attributes given as one int meaning "the same for both spatial dims".
const PAIR_ATTRS: &[&str] = &["stride", "padding", "dilation", "kernel", "output"];

/// Every builtin: one per elementwise math op of the op table (named like the op, its
/// operands `x` or `a, b`), then the others.
fn all() -> impl Iterator<Item = Builtin> {
    let op = |op: Op, params: &'static [(&'static str, Dflt)]| Builtin {
        name: op.name(),
        lower: Lower::Op(op, params.len()),
        params,
    };
    let unary = UnaryOp::ALL.iter().map(move |u| op(u.op(), X));
    let binary = BinaryOp::ALL.iter().map(move |b| op(b.op(), AB));
    unary.chain(binary).chain(OTHERS.iter().copied())
}

fn find(name: &str) -> Option<Builtin> {
    all().find(|b| b.name == name)
}

/// Every builtin function name, for did-you-mean.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    all().map(|b| b.name)
}

/// Names that denote values without a call: dtypes and the argument-less initializers.
pub fn named_value(name: &str) -> Option<Value> {
    if let Some(d) = DType::parse(name) {
        return Some(Value::DType(d));
    }
    match name {
        "zeros" => Some(Value::Init(Init::Zeros)),
        "ones" => Some(Value::Init(Init::Ones)),
        _ => None,
    }
}

/// Arguments bound to a builtin's parameters, by position in its parameter list.
type Bound = Vec<Option<(Value, Span)>>;

impl Elaborator<'_> {
    /// Calls the builtin `name`; `None` when there is no such builtin.
    pub fn call_builtin(
        &mut self,
        frame: &mut Frame,
        name: &str,
        args: Vec<ArgValue>,
        span: Span,
    ) -> Option<Value> {
        let builtin = find(name)?;
        let args = match builtin.lower {
            Lower::Concat => match self.gather_variadic(frame, args) {
                Some(args) => args,
                None => return Some(Value::Error),
            },
            _ => args,
        };
        let Some(bound) = self.bind_builtin_args(frame, &builtin, args, span) else {
            return Some(Value::Error);
        };
        if bound.iter().flatten().any(|(v, _)| v.contains_error()) {
            return Some(Value::Error);
        }
        Some(self.lower_builtin(frame, &builtin, bound, span))
    }

    /// `concat(a, b, c, axis: 1)`: positional tensors become the one list `concat([a, b, c])`
    /// takes. In that form `axis` must be named; a positional non-tensor is reported and `None`
    /// returned.
    fn gather_variadic(&mut self, frame: &Frame, args: Vec<ArgValue>) -> Option<Vec<ArgValue>> {
        let positional = args.iter().take_while(|a| a.name.is_none()).count();
        let first_is_tensor = matches!(args.first(), Some(a) if a.name.is_none() && matches!(a.value, Value::Tensor(_)));
        if !first_is_tensor {
            return Some(args);
        }
        let mut args = args;
        let rest = args.split_off(positional);
        if let Some(bad) = args
            .iter()
            .find(|a| !matches!(a.value, Value::Tensor(_) | Value::Error))
        {
            let d = self
                .error(
                    frame,
                    Code::E0305,
                    bad.span,
                    format!("`concat` joins tensors; this argument is {}", bad.value.describe()),
                )
                .with_label("not a tensor")
                .with_help("name the axis when listing tensors: `concat(a, b, axis: 1)`, or pass a list: `concat([a, b], 1)`");
            self.report(frame, d);
            return None;
        }
        let span = args[0].span.to(args[positional - 1].span);
        let list = ArgValue {
            name: None,
            value: Value::List(args.into_iter().map(|a| a.value).collect()),
            span,
        };
        Some(std::iter::once(list).chain(rest).collect())
    }

    fn bind_builtin_args(
        &mut self,
        frame: &Frame,
        b: &Builtin,
        args: Vec<ArgValue>,
        span: Span,
    ) -> Option<Bound> {
        let mut bound: Bound = vec![None; b.params.len()];
        let mut ok = true;
        let mut next_positional = 0;
        for arg in args {
            let slot = match &arg.name {
                None => {
                    let slot = next_positional;
                    next_positional += 1;
                    if slot >= b.params.len() {
                        let d = self
                            .error(
                                frame,
                                Code::E0203,
                                arg.span,
                                format!("`{}` takes at most {} arguments", b.name, b.params.len()),
                            )
                            .with_label("extra argument")
                            .with_help(signature(b));
                        self.report(frame, d);
                        ok = false;
                        continue;
                    }
                    slot
                }
                Some(n) => match b.params.iter().position(|(p, _)| *p == n.name) {
                    Some(slot) => slot,
                    None => {
                        let mut d = self
                            .error(
                                frame,
                                Code::E0204,
                                n.span,
                                format!("`{}` has no parameter `{}`", b.name, n.name),
                            )
                            .with_label("unknown parameter")
                            .with_help(signature(b));
                        if let Some(s) =
                            super::suggest::closest(&n.name, b.params.iter().map(|(p, _)| *p))
                        {
                            d = d.with_help(format!("did you mean `{s}`? {}", signature(b)));
                        }
                        self.report(frame, d);
                        ok = false;
                        continue;
                    }
                },
            };
            if bound[slot].is_some() {
                let d = self
                    .error(
                        frame,
                        Code::E0204,
                        arg.span,
                        format!("`{}` is given twice", b.params[slot].0),
                    )
                    .with_label("given again here");
                self.report(frame, d);
                ok = false;
                continue;
            }
            bound[slot] = Some((arg.value, arg.span));
        }
        for (slot, (pname, default)) in b.params.iter().enumerate() {
            if bound[slot].is_some() {
                continue;
            }
            bound[slot] = match default {
                Required => {
                    let d = self
                        .error(
                            frame,
                            Code::E0203,
                            span,
                            format!("`{}` is missing its argument `{pname}`", b.name),
                        )
                        .with_label("in this call")
                        .with_help(signature(b));
                    self.report(frame, d);
                    ok = false;
                    None
                }
                Absent => None,
                Int(v) => Some((Value::Int(*v), span)),
                Float(v) => Some((Value::Float(*v), span)),
                Bool(v) => Some((Value::Bool(*v), span)),
                Pair(v) => Some((Value::List(vec![Value::Int(*v), Value::Int(*v)]), span)),
                DType(d) => Some((Value::DType(*d), span)),
            };
        }
        ok.then_some(bound)
    }

    fn lower_builtin(&mut self, frame: &mut Frame, b: &Builtin, bound: Bound, span: Span) -> Value {
        if let (Lower::Op(op, 1), [Some((v, _))]) = (b.lower, bound.as_slice()) {
            if let Some(folded) = v.as_f64().and_then(|x| fold_scalar(op, x)) {
                return Value::Float(folded);
            }
        }
        match b.lower {
            Lower::Op(op, n) => {
                let hint = bound.iter().take(n).flatten().find_map(|(v, _)| match v {
                    Value::Tensor(t) => Some(self.model.ty(*t).dtype),
                    _ => None,
                });
                let mut inputs = Vec::new();
                for (v, s) in bound.iter().take(n).flatten() {
                    match self.as_tensor(frame, v, *s, hint) {
                        Some(t) => inputs.push((t, *s)),
                        None => return Value::Error,
                    }
                }
                let Some(attrs) = self.attrs_from(frame, b, &bound[n..], n) else {
                    return Value::Error;
                };
                let attrs = if op == Op::MaxPool2d || op == Op::AvgPool2d {
                    default_stride_to_kernel(attrs)
                } else {
                    attrs
                };
                self.emit1(frame, op, attrs, &inputs, span)
            }
            Lower::Reduce(op) => {
                let (Value::Tensor(x), xs) = bound[0].clone().unwrap_or((Value::Error, span))
                else {
                    return self.expect_tensor(frame, &bound[0], span);
                };
                let rank = self.model.ty(x).rank() as i64;
                let axes = match &bound[1] {
                    None => (0..rank).collect(),
                    Some((Value::Int(a), _)) => vec![*a],
                    Some((v, s)) => match v.as_ints() {
                        Some(list) => list,
                        None => {
                            return self.bad_arg(frame, "axis", "an int or a list of ints", v, *s)
                        }
                    },
                };
                let keepdim = matches!(bound[2], Some((Value::Bool(true), _)));
                let attrs = Attrs::new().with("axes", axes).with("keepdim", keepdim);
                self.emit1(frame, op, attrs, &[(x, xs)], span)
            }
            Lower::Reshape => {
                let (Some((Value::Tensor(x), xs)), Some((shape_v, shape_span))) =
                    (&bound[0], &bound[1])
                else {
                    return self.expect_tensor(frame, &bound[0], span);
                };
                let Some(mut shape) = shape_v.as_ints() else {
                    return self.bad_arg(frame, "shape", "a list of ints", shape_v, *shape_span);
                };
                let numel = self.model.ty(*x).numel() as i64;
                let holes = shape.iter().filter(|&&d| d == -1).count();
                if holes == 1 {
                    let known: i64 = shape.iter().filter(|&&d| d != -1).product();
                    if known > 0 && numel % known == 0 {
                        let fill = numel / known;
                        shape
                            .iter_mut()
                            .filter(|d| **d == -1)
                            .for_each(|d| *d = fill);
                    }
                }
                let attrs = Attrs::new().with("shape", shape);
                self.emit1(frame, Op::Reshape, attrs, &[(*x, *xs)], span)
            }
            Lower::Concat => {
                let Some((list, list_span)) = &bound[0] else {
                    return Value::Error;
                };
                let items = match list {
                    Value::List(items) | Value::Tuple(items) => items.clone(),
                    other => {
                        return self.bad_arg(frame, "xs", "a list of tensors", other, *list_span)
                    }
                };
                let mut inputs = Vec::new();
                for item in &items {
                    match self.as_tensor(frame, item, *list_span, None) {
                        Some(t) => inputs.push((t, *list_span)),
                        None => return Value::Error,
                    }
                }
                let Some(attrs) = self.attrs_from(frame, b, &bound[1..], 1) else {
                    return Value::Error;
                };
                self.emit1(frame, Op::Concat, attrs, &inputs, span)
            }
            Lower::Rope => {
                let theta = bound[2]
                    .as_ref()
                    .and_then(|(v, _)| v.as_f64())
                    .unwrap_or(10000.0);
                let attrs = Attrs::new().with("theta", theta);
                let mut results = Vec::new();
                for slot in bound[..2].iter().flatten() {
                    let Value::Tensor(t) = slot.0 else {
                        return self.expect_tensor(frame, &Some(slot.clone()), span);
                    };
                    results.push(self.emit1(frame, Op::Rope, attrs.clone(), &[(t, slot.1)], span));
                }
                if results.len() == 1 {
                    results.pop().unwrap_or(Value::Error)
                } else {
                    Value::Tuple(results)
                }
            }
            Lower::Split | Lower::Chunk => self.lower_split(frame, b, &bound, span),
            Lower::Init(kind) => {
                let num = |i: usize| bound[i].as_ref().and_then(|(v, _)| v.as_f64());
                let (Some(a), b2) = (num(0), bound.get(1).and_then(|_| num(1))) else {
                    let (v, s) = bound[0].clone().unwrap_or((Value::Error, span));
                    return self.bad_arg(frame, b.params[0].0, "a number", &v, s);
                };
                Value::Init(match kind {
                    "normal" => Init::Normal {
                        mean: a,
                        std: b2.unwrap_or(1.0),
                    },
                    "uniform" => Init::Uniform {
                        low: a,
                        high: b2.unwrap_or(1.0),
                    },
                    _ => Init::Constant { value: a },
                })
            }
        }
    }

    /// `split(x, sizes, axis)` and `chunk(x, n, axis)` as PyTorch defines them: `sizes` is a list
    /// that must add up to the axis, or one int, the size of every piece but a shorter last one;
    /// `chunk` cuts `n` pieces of ceil(size / n), so it may return fewer than `n`. Each piece is a
    /// `slice`, and the result a tuple, to be destructured with `let (q, k, v) = …`.
    fn lower_split(&mut self, frame: &mut Frame, b: &Builtin, bound: &Bound, span: Span) -> Value {
        let (Some((Value::Tensor(x), xs)), Some((how, how_span)), Some((axis_v, axis_span))) =
            (&bound[0], &bound[1], &bound[2])
        else {
            return self.expect_tensor(frame, &bound[0], span);
        };
        let shape = self.model.ty(*x).shape.clone();
        let rank = shape.len() as i64;
        let Value::Int(axis) = axis_v else {
            return self.bad_arg(frame, "axis", "an int", axis_v, *axis_span);
        };
        if !(-rank..rank).contains(axis) {
            return self.fail(
                frame,
                Code::E0310,
                *axis_span,
                format!("axis {axis} is out of range for a tensor of rank {rank}"),
                "no such axis",
            );
        }
        let (written, axis) = (*axis, axis.rem_euclid(rank));
        let size = shape[axis as usize];
        let sizes = match (b.lower, how) {
            (Lower::Chunk, Value::Int(n)) if *n > 0 => {
                let step = size / n + i64::from(size % n != 0);
                split_even(size, step.max(1))
            }
            (Lower::Split, Value::Int(step)) if *step > 0 => split_even(size, *step),
            (Lower::Split, Value::List(_)) => match how.as_ints() {
                Some(list) if list.iter().all(|&s| s >= 0) => {
                    let total = list.iter().try_fold(0i64, |t, &s| t.checked_add(s));
                    if total == Some(size) {
                        list
                    } else {
                        let total = total.map_or("more than 2^63".to_string(), |t| t.to_string());
                        let d = self
                            .error(
                                frame,
                                Code::E0310,
                                *how_span,
                                format!(
                                    "the sizes add up to {total}, but axis {written} has {size}"
                                ),
                            )
                            .with_label(format!("{} pieces", list.len()))
                            .with_help("the pieces must cover the axis exactly");
                        self.report(frame, d);
                        return Value::Error;
                    }
                }
                _ => return self.bad_arg(frame, "sizes", "a list of sizes ≥ 0", how, *how_span),
            },
            (Lower::Chunk, Value::Int(_)) | (Lower::Split, Value::Int(_)) => {
                return self.fail(
                    frame,
                    Code::E0310,
                    *how_span,
                    format!("`{}` needs a positive count or size", b.name),
                    "must be at least 1",
                )
            }
            (Lower::Chunk, other) => return self.bad_arg(frame, "n", "an int", other, *how_span),
            (_, other) => {
                return self.bad_arg(frame, "sizes", "an int or a list of ints", other, *how_span)
            }
        };
        let mut start = 0;
        let mut pieces = Vec::with_capacity(sizes.len());
        for len in sizes {
            let attrs = Attrs::new()
                .with("axis", axis)
                .with("start", start)
                .with("end", start + len);
            pieces.push(self.emit1(frame, Op::Slice, attrs, &[(*x, *xs)], span));
            start += len;
        }
        Value::Tuple(pieces)
    }

    /// Attributes from the non-tensor parameters `params[first..]`, bound in `values`.
    fn attrs_from(
        &mut self,
        frame: &Frame,
        b: &Builtin,
        values: &[Option<(Value, Span)>],
        first: usize,
    ) -> Option<Attrs> {
        let mut attrs = Attrs::new();
        for ((name, _), slot) in b.params[first..].iter().zip(values) {
            let Some((v, s)) = slot else { continue };
            let v = match v {
                Value::Int(i) if PAIR_ATTRS.contains(name) => Value::List(vec![Value::Int(*i); 2]),
                other => other.clone(),
            };
            match attr_of(&v) {
                Some(a) => attrs.insert(name, a),
                None => {
                    self.bad_arg(frame, name, "a number, bool, dtype or list of ints", &v, *s);
                    return None;
                }
            }
        }
        Some(attrs)
    }

    fn bad_arg(
        &mut self,
        frame: &Frame,
        name: &str,
        expected: &str,
        found: &Value,
        span: Span,
    ) -> Value {
        if !found.is_error() {
            let d = self
                .error(
                    frame,
                    Code::E0305,
                    span,
                    format!("`{name}` must be {expected}, found {}", found.describe()),
                )
                .with_label(format!("this is {}", found.describe()));
            self.report(frame, d);
        }
        Value::Error
    }

    fn expect_tensor(&mut self, frame: &Frame, slot: &Option<(Value, Span)>, span: Span) -> Value {
        let (v, s) = slot.clone().unwrap_or((Value::Error, span));
        self.bad_arg(frame, "x", "a tensor", &v, s)
    }
}

/// Pieces of `step` covering `size`, the last one shorter when `step` does not divide it.
fn split_even(size: i64, step: i64) -> Vec<i64> {
    (0..size)
        .step_by(step as usize)
        .map(|start| step.min(size - start))
        .collect()
}

/// A unary math builtin applied to a plain number is computed now, so `rsqrt(D)` stays a weak
/// scalar instead of becoming an f32 tensor.
fn fold_scalar(op: Op, x: f64) -> Option<f64> {
    mslc_core::ops::eval_scalar(op, &[x]).filter(|y| y.is_finite())
}

/// Pooling with no stride given moves by the kernel size (PyTorch's default).
fn default_stride_to_kernel(mut attrs: Attrs) -> Attrs {
    if attrs.get("stride").is_none() {
        if let Some(AttrValue::Ints(k)) = attrs.get("kernel").cloned() {
            attrs.insert("stride", AttrValue::Ints(k));
        }
    }
    attrs
}

fn signature(b: &Builtin) -> String {
    let params: Vec<String> = b
        .params
        .iter()
        .map(|(n, d)| match d {
            Required => n.to_string(),
            _ => format!("{n}: …"),
        })
        .collect();
    format!("signature: {}({})", b.name, params.join(", "))
}

#[cfg(test)]
mod tests {
    use crate::{check_source, CheckOptions};

    /// The output shapes of a one-model source, which must check clean.
    fn output_shapes(body: &str) -> Vec<Vec<i64>> {
        let src = format!("model M {{\n    input x: f32[2, 10]\n{body}\n}}\n");
        let checked = check_source("m.msl", &src, &CheckOptions::default());
        assert!(checked.diagnostics.is_empty(), "{:?}", checked.diagnostics);
        let m = &checked.models[0];
        m.outputs
            .iter()
            .map(|o| m.ty(o.value).shape.clone())
            .collect()
    }

    fn codes(body: &str) -> Vec<&'static str> {
        let src = format!("model M {{\n    input x: f32[2, 10]\n{body}\n    output o = x\n}}\n");
        let checked = check_source("m.msl", &src, &CheckOptions::default());
        // Errors only: the unused-code lints warn about the test's throwaway `let p`.
        checked
            .diagnostics
            .iter()
            .filter(|d| d.severity == mslc_core::diag::Severity::Error)
            .map(|d| d.code.as_str())
            .collect()
    }

    #[test]
    fn chunk_and_split_cut_as_torch_does() {
        // torch.chunk(10, 3) -> 4, 4, 2; torch.split(10, 4) -> 4, 4, 2.
        let chunked =
            "let (a, b, c) = chunk(x, 3, axis: 1)\noutput a = a\noutput b = b\noutput c = c";
        assert_eq!(output_shapes(chunked), [[2, 4], [2, 4], [2, 2]]);
        let split =
            "let (a, b, c) = split(x, 4, axis: -1)\noutput a = a\noutput b = b\noutput c = c";
        assert_eq!(output_shapes(split), [[2, 4], [2, 4], [2, 2]]);
        // torch.chunk may give fewer pieces than asked: 10 in 4 -> 3, 3, 3, 1; 2 rows in 3 -> 2.
        let rows = "let (a, b) = chunk(x, 3)\noutput a = a\noutput b = b";
        assert_eq!(output_shapes(rows), [[1, 10], [1, 10]]);
        let listed = "let (a, b) = split(x, [7, 3], axis: 1)\noutput a = a\noutput b = b";
        assert_eq!(output_shapes(listed), [[2, 7], [2, 3]]);
    }

    #[test]
    fn concat_takes_a_list_or_the_tensors() {
        let both = "output l = concat([x, x], 1)\noutput v = concat(x, x, x, axis: 1)";
        assert_eq!(output_shapes(both), [[2, 20], [2, 30]]);
    }

    #[test]
    fn cuts_that_do_not_fit_are_e0310() {
        assert_eq!(codes("let p = split(x, [3, 3], axis: 1)"), ["E0310"]);
        assert_eq!(codes("let p = chunk(x, 0, axis: 1)"), ["E0310"]);
        assert_eq!(codes("let p = split(x, 2, axis: 2)"), ["E0310"]);
        assert_eq!(codes("let p = split(x, [11, -1], axis: 1)"), ["E0305"]);
        let huge = "let p = split(x, [9223372036854775807, 9223372036854775807], axis: 1)";
        assert_eq!(codes(huge), ["E0310"]);
        assert_eq!(
            codes("let p = chunk(x, 9223372036854775807, axis: 1)").len(),
            0
        );
    }
}
