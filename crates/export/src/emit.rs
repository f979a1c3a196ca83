//! One graph as one Python function: a statement per node, in topological order, each op with
//! the exact meaning of its registry entry (docs/ops.md; the reference kernels are the ground
//! truth). Ops without a translation — the fused and backward ops, which a lowered model never
//! holds — are a coded error at the op's source location (E0960), never other code.

use std::fmt::Write;

use mslc_core::diag::{Code, Diagnostic, FileId};
use mslc_core::ops::{normalize_axis, AttrValue, Attrs, DType, Op, OpError, TensorType};
use mslc_core::span::Span;
use mslc_ir::{Graph, NodeId, NodeKind, ValueRef};

use crate::py::{py_float, py_str};

/// The Python dtype expression of `d` (`jnp.float32`).
pub fn jnp_dtype(d: DType) -> &'static str {
    match d {
        DType::F64 => "jnp.float64",
        DType::F32 => "jnp.float32",
        DType::F16 => "jnp.float16",
        DType::BF16 => "jnp.bfloat16",
        DType::I64 => "jnp.int64",
        DType::I32 => "jnp.int32",
        DType::Bool => "jnp.bool_",
    }
}

/// `def NAME(p, x):` computing `graph`: `p` maps parameter paths to arrays, `x` input names to
/// arrays; it returns a dict of the graph's outputs by name.
pub fn emit_function(graph: &Graph, name: &str, doc: &str) -> Result<String, Box<Diagnostic>> {
    let order = topo_order(graph)?;
    let mut out = format!("def {name}(p, x):\n    {}\n", py_str(doc));
    for id in order {
        let target = value_name(ValueRef { node: id, index: 0 });
        let line = statement(graph, id, &target, &value_name, true)?;
        writeln!(out, "    {line}").expect("writing to a String");
    }
    out.push_str("    return {");
    for (i, (name, v)) in graph.outputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write!(out, "{}: {}", py_str(name), value_name(*v)).expect("writing to a String");
    }
    out.push_str("}\n");
    Ok(out)
}

/// `graph`'s nodes in an order where each follows its inputs; E0608 for a cycle.
pub(crate) fn topo_order(graph: &Graph) -> Result<Vec<NodeId>, Box<Diagnostic>> {
    graph.topo_order().ok_or_else(|| {
        Box::new(Diagnostic::error(
            Code::E0608,
            FileId(0),
            Span::default(),
            format!("the graph of `{}` has a cycle", graph.name),
        ))
    })
}

/// What a model input or parameter node reads (`x["tokens"]`, `p["lm_head.weight"]`); `None`
/// for an op.
pub(crate) fn leaf_expr(graph: &Graph, id: NodeId) -> Option<String> {
    match &graph.node(id).kind {
        NodeKind::Input { name } => Some(format!("x[{}]", py_str(name))),
        NodeKind::Param { path, .. } => Some(format!("p[{}]", py_str(path))),
        NodeKind::Op { .. } => None,
    }
}

/// `TARGET = EXPR` for node `id` (an op's operands named by `name`), with an op's instance
/// path as a comment when `comment`; E0960 at the op's source for an op without a translation.
pub(crate) fn statement(
    graph: &Graph,
    id: NodeId,
    target: &str,
    name: &dyn Fn(ValueRef) -> String,
    comment: bool,
) -> Result<String, Box<Diagnostic>> {
    let node = graph.node(id);
    let (op, attrs) = match (&node.kind, leaf_expr(graph, id)) {
        (NodeKind::Op { op, attrs }, _) => (op, attrs),
        (_, leaf) => return Ok(format!("{target} = {}", leaf.unwrap_or_default())),
    };
    let expr = op_expr(graph, id, *op, attrs, name).map_err(|e| {
        let loc = node.loc;
        let (file, span) = loc.map_or((FileId(0), Span::default()), |l| (l.file, l.span));
        Box::new(
            Diagnostic::error(Code::E0960, file, span, e)
                .with_label("this op")
                .with_help(
                    "the export covers the forward ops and losses of docs/ops.md; \
                     report the model if a forward op is refused",
                ),
        )
    })?;
    Ok(match comment && !node.origin.is_empty() {
        true => format!("{target} = {expr}  # {}", node.origin),
        false => format!("{target} = {expr}"),
    })
}

/// The local variable holding value `v`.
pub(crate) fn value_name(v: ValueRef) -> String {
    match v.index {
        0 => format!("v{}", v.node.index()),
        i => format!("v{}_{i}", v.node.index()),
    }
}

/// A Python tuple literal of ints.
fn tuple(xs: &[i64]) -> String {
    match xs {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            xs.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The expression computing op node `id`; an error message when the op has no translation.
fn op_expr(
    graph: &Graph,
    id: NodeId,
    op: Op,
    attrs: &Attrs,
    name: &dyn Fn(ValueRef) -> String,
) -> Result<String, String> {
    let inputs = graph.inputs(id);
    let args: Vec<String> = inputs.iter().map(|v| name(*v)).collect();
    let ty = |i: usize| -> &TensorType { graph.ty(inputs[i]) };
    let out = &graph.node(id).outputs[0];
    let a = |i: usize| args[i].as_str();
    let bad = |e: OpError| format!("{op}: {}", e.message);
    let axis = |name: &str, rank: usize| -> Result<usize, String> {
        let raw = attrs.int(name).map_err(bad)?;
        normalize_axis(raw, rank).map_err(|m| format!("{op}: {m}"))
    };
    let pair = |name: &str| -> Result<String, String> {
        let v = attrs.ints(name).map_err(bad)?;
        Ok(tuple(&v))
    };
    if let Some(b) = op.binary() {
        let f = match b.op() {
            Op::Add => "jnp.add",
            Op::Sub => "jnp.subtract",
            Op::Mul => "jnp.multiply",
            Op::Div => "jnp.divide",
            Op::Pow => "jnp.power",
            Op::Maximum => "jnp.maximum",
            _ => "jnp.minimum",
        };
        return Ok(format!("{f}({}, {})", a(0), a(1)));
    }
    if let Some(u) = op.unary() {
        let x = a(0);
        return Ok(match u.op() {
            Op::Neg => format!("jnp.negative({x})"),
            Op::Exp => format!("jnp.exp({x})"),
            Op::Log => format!("jnp.log({x})"),
            Op::Sqrt => format!("jnp.sqrt({x})"),
            Op::Rsqrt => format!("jax.lax.rsqrt({x})"),
            Op::Reciprocal => format!("jnp.reciprocal({x})"),
            Op::Abs => format!("jnp.abs({x})"),
            Op::Tanh => format!("jnp.tanh({x})"),
            Op::Sigmoid => format!("jax.nn.sigmoid({x})"),
            Op::Relu => format!("jax.nn.relu({x})"),
            Op::Gelu => format!("jax.nn.gelu({x}, approximate=False)"),
            Op::GeluTanh => format!("jax.nn.gelu({x}, approximate=True)"),
            Op::Silu => format!("jax.nn.silu({x})"),
            Op::Erf => format!("jax.lax.erf({x})"),
            Op::Softplus => format!("_softplus({x})"),
            Op::Sign => format!("jnp.sign({x})"),
            other => return Err(format!("the JAX export does not cover op `{other}`")),
        });
    }
    Ok(match op {
        Op::Constant => {
            let value = attrs.float("value").map_err(bad)?;
            let dtype = attrs.dtype("dtype").map_err(bad)?;
            format!(
                "jnp.asarray({}, dtype={})",
                py_float(value),
                jnp_dtype(dtype)
            )
        }
        Op::Cast => format!("{}.astype({})", a(0), jnp_dtype(out.dtype)),
        Op::Matmul => {
            let swap = |x: &str, t: bool| {
                if t {
                    format!("jnp.swapaxes({x}, -1, -2)")
                } else {
                    x.to_string()
                }
            };
            let ta = attrs.bool("transpose_a").map_err(bad)?;
            let tb = attrs.bool("transpose_b").map_err(bad)?;
            format!("jnp.matmul({}, {})", swap(a(0), ta), swap(a(1), tb))
        }
        Op::Transpose => format!(
            "jnp.transpose({}, {})",
            a(0),
            tuple(&attrs.ints("perm").map_err(bad)?)
        ),
        Op::Reshape => format!("jnp.reshape({}, {})", a(0), tuple(&out.shape)),
        Op::BroadcastTo => format!("jnp.broadcast_to({}, {})", a(0), tuple(&out.shape)),
        Op::Concat => format!(
            "jnp.concatenate([{}], axis={})",
            args.join(", "),
            axis("axis", ty(0).shape.len())?
        ),
        Op::Slice => {
            let rank = ty(0).shape.len();
            let ax = axis("axis", rank)?;
            let n = ty(0).shape[ax];
            let at = |name: &str| -> Result<i64, String> {
                let v = attrs.int(name).map_err(bad)?;
                Ok(if v < 0 { v + n } else { v })
            };
            format!(
                "jax.lax.slice_in_dim({}, {}, {}, axis={ax})",
                a(0),
                at("start")?,
                at("end")?
            )
        }
        Op::Select => {
            let ax = axis("axis", ty(0).shape.len())?;
            let n = ty(0).shape[ax];
            let i = attrs.int("index").map_err(bad)?;
            let i = if i < 0 { i + n } else { i };
            format!(
                "jax.lax.index_in_dim({}, {i}, axis={ax}, keepdims=False)",
                a(0)
            )
        }
        Op::Sum | Op::Mean | Op::Max => {
            let rank = ty(0).shape.len();
            let axes = match attrs.get("axes") {
                Some(AttrValue::Ints(v)) => {
                    let mut norm = Vec::new();
                    for &x in v {
                        let x = normalize_axis(x, rank).map_err(|m| format!("{op}: {m}"))?;
                        norm.push(x as i64);
                    }
                    tuple(&norm)
                }
                _ => "None".to_string(),
            };
            let keep = attrs.opt_bool("keepdim").map_err(bad)?.unwrap_or(false);
            let f = match op {
                Op::Sum => "jnp.sum",
                Op::Mean => "jnp.mean",
                _ => "jnp.max",
            };
            let k = if keep { "True" } else { "False" };
            format!(
                "{f}({}, axis={axes}, keepdims={k}).astype({})",
                a(0),
                jnp_dtype(out.dtype)
            )
        }
        Op::Softmax | Op::LogSoftmax => {
            let f = if op == Op::Softmax {
                "softmax"
            } else {
                "log_softmax"
            };
            let ax = axis("axis", ty(0).shape.len())?;
            format!("jax.nn.{f}({}, axis={ax})", a(0))
        }
        Op::RmsNorm => format!("_rms_norm({}, {})", a(0), eps(attrs).map_err(bad)?),
        Op::LayerNorm => format!("_layer_norm({}, {})", a(0), eps(attrs).map_err(bad)?),
        Op::BatchNorm => format!(
            "_batch_norm({}, {}, {}, {})",
            a(0),
            a(1),
            a(2),
            eps(attrs).map_err(bad)?
        ),
        Op::Embedding => format!("jnp.take({}, {}, axis=0)", a(1), a(0)),
        Op::Rope => format!(
            "_rope({}, {})",
            a(0),
            py_float(attrs.float("theta").map_err(bad)?)
        ),
        Op::Attention => {
            let causal = attrs.bool("causal").map_err(bad)?;
            let d = ty(0).shape.last().copied().unwrap_or(1);
            let scale = attrs
                .opt_float("scale")
                .map_err(bad)?
                .unwrap_or(1.0 / (d as f64).sqrt());
            format!(
                "_attention({}, {}, {}, {}, {})",
                a(0),
                a(1),
                a(2),
                if causal { "True" } else { "False" },
                py_float(scale)
            )
        }
        Op::CausalMask => format!(
            "_causal_mask({}, {})",
            attrs.int("size").map_err(bad)?,
            jnp_dtype(out.dtype)
        ),
        // Eval mode: dropout is the identity (training-mode dropout is not exported yet).
        Op::Dropout => a(0).to_string(),
        Op::Conv2d => {
            let p = attrs.ints("padding").map_err(bad)?;
            format!(
                "jax.lax.conv_general_dilated({}, {}, window_strides={}, padding=(({}, {}), ({}, {})), rhs_dilation={}, dimension_numbers=(\"NCHW\", \"OIHW\", \"NCHW\"), feature_group_count={}, precision=jax.lax.Precision.HIGHEST)",
                a(0),
                a(1),
                pair("stride")?,
                p[0],
                p[0],
                p[1],
                p[1],
                pair("dilation")?,
                attrs.int("groups").map_err(bad)?
            )
        }
        Op::MaxPool2d | Op::AvgPool2d => {
            let kernel = attrs.ints("kernel").map_err(bad)?;
            let stride = attrs
                .opt_ints("stride")
                .map_err(bad)?
                .unwrap_or(kernel.clone());
            let padding = attrs
                .opt_ints("padding")
                .map_err(bad)?
                .unwrap_or(vec![0, 0]);
            let f = if op == Op::MaxPool2d {
                "_max_pool2d"
            } else {
                "_avg_pool2d"
            };
            format!(
                "{f}({}, {}, {}, {})",
                a(0),
                tuple(&kernel),
                tuple(&stride),
                tuple(&padding)
            )
        }
        Op::AdaptiveAvgPool2d => format!("_adaptive_avg_pool2d({}, {})", a(0), pair("output")?),
        Op::CrossEntropy => format!(
            "_cross_entropy({}, {}, {}, {})",
            a(0),
            a(1),
            attrs.int("ignore_index").map_err(bad)?,
            py_float(attrs.float("label_smoothing").map_err(bad)?)
        ),
        Op::MseLoss => format!("jnp.mean(jnp.square({} - {}))", a(0), a(1)),
        other => return Err(format!("the JAX export does not cover op `{other}`")),
    })
}

fn eps(attrs: &Attrs) -> Result<String, OpError> {
    Ok(py_float(attrs.float("eps")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32t(shape: &[i64]) -> TensorType {
        TensorType::new(DType::F32, shape.to_vec())
    }

    #[test]
    fn ops_become_one_statement_each() {
        let mut g = Graph::new("M");
        let x = g.add_input("x", f32t(&[2, 3]));
        let attrs = Attrs::new().with("transpose_b", true);
        let w = g.add_param("w", f32t(&[4, 3]), mslc_core::program::Init::Zeros, true);
        let y = g.add_op(Op::Matmul, attrs, &[x, w], "lin").unwrap()[0];
        let z = g
            .add_op(
                Op::Slice,
                Attrs::new()
                    .with("axis", -1)
                    .with("start", -2)
                    .with("end", 4),
                &[y],
                "",
            )
            .unwrap()[0];
        g.set_output("z", z);
        let text = emit_function(&g, "forward", "doc").unwrap();
        assert!(
            text.contains("jnp.matmul(v0, jnp.swapaxes(v1, -1, -2))  # lin"),
            "{text}"
        );
        assert!(
            text.contains("jax.lax.slice_in_dim(v2, 2, 4, axis=1)"),
            "{text}"
        );
        assert!(text.ends_with("    return {\"z\": v3}\n"), "{text}");
    }

    #[test]
    fn an_op_without_translation_is_e0960() {
        let mut g = Graph::new("M");
        let x = g.add_input("x", f32t(&[2]));
        let attrs = Attrs::new().with("program", "neg(x0)");
        let y = g.add_op(Op::FusedElementwise, attrs, &[x], "").unwrap()[0];
        g.set_output("y", y);
        let d = emit_function(&g, "forward", "doc").unwrap_err();
        assert_eq!(d.code, Code::E0960);
        assert!(d.message.contains("`fused_elementwise`"), "{}", d.message);
    }
}
