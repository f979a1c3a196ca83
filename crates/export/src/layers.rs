//! A pipeline in the exported program: the graph cut into what runs before the repeated
//! layers (the head: embedding, rope tables), one function that every layer is an instance of,
//! and what runs after (the tail: final norm, output head, loss) — the shape GSPMD pipelining
//! needs (Xu et al. 2021, §3.3): the layers' parameters stacked along a stage axis sharded over
//! the mesh's pipeline axis, each stage applying its layers to one micro-batch per tick, and
//! the micro-batches shifted to the next stage between ticks (`runtime/main.py`,
//! `pipelined`), which XLA compiles to collective-permutes over that axis.
//!
//! The layers are told apart by instance path as the planner counts them
//! ([`mslc_plan::parallel::workload::layer_key`]: `model.layers.3`), numbered in the order they first
//! appear. Every layer must be the same computation on its own parameters — the same ops on
//! the same shapes, reading the previous layer's outputs (the carry) and values made before
//! the layers (the context), and nothing of layers further back — which the emitter checks by
//! writing each layer with canonical names and comparing the texts. When that does not hold
//! the reason is returned and the export mirrors no pipeline (W0050).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

use mslc_core::diag::Diagnostic;
use mslc_ir::{Graph, NodeId, NodeKind, ValueRef};

use crate::emit::{leaf_expr, statement, topo_order, value_name};
use crate::py::{py_list, py_str};

/// Where a node runs relative to the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    /// A model input or parameter (read where it is used).
    Leaf,
    /// Before the layers.
    Head,
    /// Inside layer `i`.
    Layer(usize),
    /// After the layers.
    Tail,
}

/// One repeated layer: its instance path and its ops in graph order.
struct Layer {
    key: String,
    ops: Vec<NodeId>,
}

/// The graph cut around its layers, with what flows between the parts.
struct Cut {
    head: Vec<NodeId>,
    layers: Vec<Layer>,
    tail: Vec<NodeId>,
    region: HashMap<NodeId, Region>,
    /// Values the first layer continues (made before the layers), in order.
    carry_in: Vec<ValueRef>,
    /// Values every layer reads from before the layers (inputs included), in order.
    context: Vec<ValueRef>,
    /// Each layer's values read after it (by the next layer, or the tail for the last), in
    /// the layer's op order: the next layer's carry.
    carry_out: Vec<Vec<ValueRef>>,
}

/// `graph`'s forward as the three functions of a pipelined part named `name` —
/// `NAME_head(p, x)`, `NAME_layer(q, s, p)`, `NAME_tail(p, x, e, c)` — their description
/// `NAME_PARTS` for the runtime, and `NAME(p, x)` running them with `pipelined`. `Ok(Err)`
/// says why the graph's layers cannot be pipelined; `Err` is an op without a translation.
pub fn emit_pipelined(
    graph: &Graph,
    name: &str,
    doc: &str,
) -> Result<Result<String, String>, Box<Diagnostic>> {
    let order = topo_order(graph)?;
    let cut = match cut(graph, &order) {
        Ok(c) => c,
        Err(why) => return Ok(Err(why)),
    };
    let mut texts = Vec::new();
    for i in 0..cut.layers.len() {
        texts.push(layer_body(graph, &cut, i)?);
    }
    if let Some(i) = (1..texts.len()).find(|&i| texts[i] != texts[0]) {
        return Ok(Err(format!(
            "`{}` is not the same computation as `{}`",
            cut.layers[i].key, cut.layers[0].key
        )));
    }
    let mut out = String::new();
    out.push_str(&head_function(graph, &cut, name)?);
    writeln!(
        out,
        "\ndef {name}_layer(q, s, p):\n    \"One layer of `{name}`: q its parameters (relative paths), s the stream (carry, then context).\"\n{}",
        texts[0]
    )
    .expect("String");
    out.push_str(&tail_function(graph, &cut, name)?);
    out.push_str(&parts_literal(graph, &cut, name));
    write!(
        out,
        "\n\ndef {name}(p, x):\n    {}\n    return pipelined({name}_PARTS, p, x)\n",
        py_str(doc)
    )
    .expect("String");
    Ok(Ok(out))
}

/// Cuts `graph` (nodes in `order`) into head, layers and tail, checking what each reads.
fn cut(graph: &Graph, order: &[NodeId]) -> Result<Cut, String> {
    let mut region: HashMap<NodeId, Region> = HashMap::new();
    let mut layers: Vec<Layer> = Vec::new();
    let (mut head, mut tail) = (Vec::new(), Vec::new());
    for &id in order {
        let node = graph.node(id);
        if !matches!(node.kind, NodeKind::Op { .. }) {
            region.insert(id, Region::Leaf);
            continue;
        }
        let r = match mslc_plan::parallel::workload::layer_key(&node.origin) {
            Some(key) => {
                let i = match layers.iter().position(|l| l.key == key) {
                    Some(i) => i,
                    None => {
                        layers.push(Layer {
                            key,
                            ops: Vec::new(),
                        });
                        layers.len() - 1
                    }
                };
                layers[i].ops.push(id);
                Region::Layer(i)
            }
            None => {
                let after = graph
                    .inputs(id)
                    .iter()
                    .any(|v| matches!(region[&v.node], Region::Layer(_) | Region::Tail));
                if after {
                    tail.push(id);
                    Region::Tail
                } else {
                    head.push(id);
                    Region::Head
                }
            }
        };
        region.insert(id, r);
    }
    let n = layers.len();
    if n < 2 {
        return Err(format!("the model has {n} repeated layer(s) to split"));
    }
    // What each part may read: a layer its own values, the previous layer's, and what was made
    // before the layers; the tail the last layer's and the head's.
    for &id in order {
        let here = region[&id];
        for v in graph.inputs(id) {
            let from = region[&v.node];
            let fine = match (here, from) {
                (_, Region::Leaf | Region::Head) => true,
                (Region::Layer(i), Region::Layer(j)) => j == i || j + 1 == i,
                (Region::Tail, Region::Layer(j)) => j + 1 == n,
                (Region::Tail, Region::Tail) => true,
                _ => false,
            };
            if !fine {
                return Err(format!(
                    "`{}` reads a value of `{}`",
                    describe(graph, &layers, here, id),
                    describe(graph, &layers, from, v.node)
                ));
            }
        }
    }
    if let Some((out, _)) = graph
        .outputs
        .iter()
        .find(|(_, v)| region[&v.node] != Region::Tail)
    {
        return Err(format!("output `{out}` is not computed after the layers"));
    }
    // Each layer's reads from outside itself, in order of first use.
    let outside = |i: usize| -> Vec<ValueRef> {
        let mut seen = Vec::new();
        for &id in &layers[i].ops {
            for v in graph.inputs(id) {
                let leaf_param = matches!(graph.node(v.node).kind, NodeKind::Param { .. });
                if region[&v.node] != Region::Layer(i) && !leaf_param && !seen.contains(&v) {
                    seen.push(v);
                }
            }
        }
        seen
    };
    let before = |v: &ValueRef| matches!(region[&v.node], Region::Leaf | Region::Head);
    let context: Vec<ValueRef> = outside(1).into_iter().filter(before).collect();
    let first = outside(0);
    let carry_in: Vec<ValueRef> = first
        .iter()
        .filter(|v| !context.contains(v))
        .copied()
        .collect();
    let first_context: Vec<ValueRef> = first
        .iter()
        .filter(|v| context.contains(v))
        .copied()
        .collect();
    if first_context != context {
        return Err(format!(
            "`{}` reads values made before the layers that `{}` does not",
            layers[1].key, layers[0].key
        ));
    }
    let mut carry_out = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let mine: BTreeSet<NodeId> = layer.ops.iter().copied().collect();
        let mut read_after = Vec::new();
        for &id in &layer.ops {
            for (index, _) in graph.node(id).outputs.iter().enumerate() {
                let v = ValueRef {
                    node: id,
                    index: index as u32,
                };
                let used_after = graph.users(v).iter().any(|(u, _)| !mine.contains(u));
                if used_after {
                    read_after.push(v);
                }
            }
        }
        if i > 0 {
            let theirs: Vec<ValueRef> = outside(i)
                .into_iter()
                .filter(|v| !context.contains(v))
                .collect();
            let prev: &Vec<ValueRef> = &carry_out[i - 1];
            if theirs.len() != prev.len() || theirs.iter().any(|v| !prev.contains(v)) {
                return Err(format!(
                    "`{}` reads from before the layers what `{}` does not",
                    layer.key, layers[0].key
                ));
            }
        }
        let types_in: Vec<_> = match i {
            0 => carry_in.iter().map(|v| graph.ty(*v).clone()).collect(),
            _ => carry_out[i - 1]
                .iter()
                .map(|v: &ValueRef| graph.ty(*v).clone())
                .collect(),
        };
        let types_out: Vec<_> = read_after.iter().map(|v| graph.ty(*v).clone()).collect();
        if types_in != types_out {
            return Err(format!(
                "`{}` passes on other values than it takes ({} in, {} out)",
                layer.key,
                types_in.len(),
                types_out.len()
            ));
        }
        carry_out.push(read_after);
    }
    Ok(Cut {
        head,
        layers,
        tail,
        region,
        carry_in,
        context,
        carry_out,
    })
}

/// An op for an error message: its name and instance path.
fn describe(graph: &Graph, layers: &[Layer], region: Region, id: NodeId) -> String {
    let node = graph.node(id);
    match (region, &node.kind) {
        (Region::Layer(i), _) => layers[i].key.clone(),
        (_, NodeKind::Op { op, .. }) => format!("{op} in {}", node.origin),
        (_, NodeKind::Input { name }) => format!("input {name}"),
        (_, NodeKind::Param { path, .. }) => path.clone(),
    }
}

/// The body of layer `i`'s function in canonical names: its stream `s` (carry, then context),
/// its own parameters `q[REL]`, other parameters `p[PATH]`, its values `l0`, `l1`, … in op
/// order — the same text for every instance of one layer.
fn layer_body(graph: &Graph, cut: &Cut, i: usize) -> Result<String, Box<Diagnostic>> {
    let layer = &cut.layers[i];
    let carry = match i {
        0 => &cut.carry_in,
        _ => &cut.carry_out[i - 1],
    };
    let mut names: HashMap<ValueRef, String> = HashMap::new();
    for (j, v) in carry.iter().chain(&cut.context).enumerate() {
        names.insert(*v, format!("s[{j}]"));
    }
    for (k, &id) in layer.ops.iter().enumerate() {
        for index in 0..graph.node(id).outputs.len() {
            let local = match index {
                0 => format!("l{k}"),
                _ => format!("l{k}_{index}"),
            };
            names.insert(
                ValueRef {
                    node: id,
                    index: index as u32,
                },
                local,
            );
        }
    }
    let prefix = format!("{}.", layer.key);
    let name = |v: ValueRef| -> String {
        if let Some(n) = names.get(&v) {
            return n.clone();
        }
        match &graph.node(v.node).kind {
            NodeKind::Param { path, .. } => match path.strip_prefix(&prefix) {
                Some(rel) => format!("q[{}]", py_str(rel)),
                None => format!("p[{}]", py_str(path)),
            },
            _ => value_name(v),
        }
    };
    let mut body = String::new();
    for &id in &layer.ops {
        let target = name(ValueRef { node: id, index: 0 });
        writeln!(body, "    {}", statement(graph, id, &target, &name, false)?).expect("String");
    }
    let passed: Vec<String> = cut.carry_out[i]
        .iter()
        .map(|v| name(*v))
        .chain((0..cut.context.len()).map(|j| format!("s[{}]", carry.len() + j)))
        .collect();
    write!(body, "    return ({},)", passed.join(", ")).expect("String");
    Ok(body)
}

/// `NAME_head(p, x)`: the ops before the layers, returning what the layers and the tail read
/// of them (and of the inputs) by variable name.
fn head_function(graph: &Graph, cut: &Cut, name: &str) -> Result<String, Box<Diagnostic>> {
    let global = |v: ValueRef| leaf_expr(graph, v.node).unwrap_or_else(|| value_name(v));
    let mut out = format!(
        "def {name}_head(p, x):\n    \"What `{name}` computes before its layers, by name.\"\n"
    );
    for &id in &cut.head {
        let target = value_name(ValueRef { node: id, index: 0 });
        writeln!(out, "    {}", statement(graph, id, &target, &global, true)?).expect("String");
    }
    let exported: Vec<String> = head_values(graph, cut)
        .into_iter()
        .map(|v| format!("{}: {}", py_str(&value_name(v)), global(v)))
        .collect();
    writeln!(out, "    return {{{}}}\n", exported.join(", ")).expect("String");
    Ok(out)
}

/// The values made before the layers (inputs included) that the layers or the tail read, in
/// graph order.
fn head_values(graph: &Graph, cut: &Cut) -> Vec<ValueRef> {
    let mut values: BTreeSet<ValueRef> = cut.carry_in.iter().chain(&cut.context).copied().collect();
    for &id in &cut.tail {
        for v in graph.inputs(id) {
            if cut.region[&v.node] == Region::Head {
                values.insert(v);
            }
        }
    }
    values.into_iter().collect()
}

/// `NAME_tail(p, x, e, c)`: the ops after the layers, from the head's values `e` and the last
/// layer's carry `c`, returning the graph's outputs.
fn tail_function(graph: &Graph, cut: &Cut, name: &str) -> Result<String, Box<Diagnostic>> {
    let last = cut.carry_out.last().map(Vec::as_slice).unwrap_or_default();
    let name_of = |v: ValueRef| -> String {
        if let Some(j) = last.iter().position(|c| *c == v) {
            return format!("c[{j}]");
        }
        match cut.region[&v.node] {
            Region::Head => format!("e[{}]", py_str(&value_name(v))),
            _ => leaf_expr(graph, v.node).unwrap_or_else(|| value_name(v)),
        }
    };
    let mut out = format!(
        "\ndef {name}_tail(p, x, e, c):\n    \"What `{name}` computes after its layers: its outputs.\"\n"
    );
    for &id in &cut.tail {
        let target = value_name(ValueRef { node: id, index: 0 });
        writeln!(
            out,
            "    {}",
            statement(graph, id, &target, &name_of, true)?
        )
        .expect("String");
    }
    let outputs: Vec<String> = graph
        .outputs
        .iter()
        .map(|(n, v)| format!("{}: {}", py_str(n), name_of(*v)))
        .collect();
    writeln!(out, "    return {{{}}}\n", outputs.join(", ")).expect("String");
    Ok(out)
}

/// `NAME_PARTS`: the three functions and what the runtime needs to run them — the stream's
/// names in the head's result, how many lead it as the carry, each layer's path prefix, the
/// parameters each layer has (relative paths), and how each output of a micro-batch joins the
/// others (`rows`: along the batch, `mean`: a scalar loss averaged).
fn parts_literal(graph: &Graph, cut: &Cut, name: &str) -> String {
    let stream = py_list(
        cut.carry_in
            .iter()
            .chain(&cut.context)
            .map(|v| py_str(&value_name(*v))),
    );
    let prefixes = py_list(cut.layers.iter().map(|l| py_str(&format!("{}.", l.key))));
    let prefix = format!("{}.", cut.layers[0].key);
    let params: BTreeSet<String> = cut.layers[0]
        .ops
        .iter()
        .flat_map(|&id| graph.inputs(id))
        .filter_map(|v| match &graph.node(v.node).kind {
            NodeKind::Param { path, .. } => path.strip_prefix(&prefix).map(str::to_string),
            _ => None,
        })
        .collect();
    let params = py_list(params.iter().map(|p| py_str(p)));
    let outputs: Vec<String> = graph
        .outputs
        .iter()
        .map(|(n, v)| {
            let join = if graph.ty(*v).rank() == 0 {
                "mean"
            } else {
                "rows"
            };
            format!("{}: \"{join}\"", py_str(n))
        })
        .collect();
    format!(
        "{name}_PARTS = ({name}_head, {name}_layer, {name}_tail, {{\"stream\": {stream}, \"carry\": {}, \"layers\": {prefixes}, \"params\": {params}, \"outputs\": {{{}}}}})",
        cut.carry_in.len(),
        outputs.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use mslc_core::ops::{Attrs, DType, Op, TensorType};
    use mslc_core::program::Init;

    use super::*;

    /// `x → tanh(x · w_i) + x` for `layers` layers, then a mean; `skip` makes the last layer
    /// also add the output of the layer two back; `odd` makes layer 1 a `relu` instead.
    fn stack(layers: usize, skip: bool, odd: bool) -> Graph {
        let t = TensorType::new(DType::F32, vec![2, 4]);
        let mut g = Graph::new("M");
        let x = g.add_input("x", t.clone());
        let mut h = g.add_op(Op::Neg, Attrs::new(), &[x], "embed").unwrap()[0];
        let mut outs = Vec::new();
        for i in 0..layers {
            let origin = format!("layers.{i}");
            let sq = TensorType::new(DType::F32, vec![4, 4]);
            let w = g.add_param(&format!("layers.{i}.w"), sq, Init::Zeros, true);
            let y = g
                .add_op(Op::Matmul, Attrs::new(), &[h, w], &origin)
                .unwrap()[0];
            let act = if odd && i == 1 { Op::Relu } else { Op::Tanh };
            let a = g.add_op(act, Attrs::new(), &[y], &origin).unwrap()[0];
            let mut sum = g.add_op(Op::Add, Attrs::new(), &[a, h], &origin).unwrap()[0];
            if skip && i == layers - 1 {
                let back = outs[i - 2];
                sum = g
                    .add_op(Op::Add, Attrs::new(), &[sum, back], &origin)
                    .unwrap()[0];
            }
            outs.push(sum);
            h = sum;
        }
        let attrs = Attrs::new()
            .with("axes", vec![0i64, 1])
            .with("keepdim", false);
        let loss = g.add_op(Op::Mean, attrs, &[h], "loss").unwrap()[0];
        g.set_output("loss", loss);
        g
    }

    #[test]
    fn identical_layers_become_one_function() {
        let text = emit_pipelined(&stack(3, false, false), "f", "doc")
            .unwrap()
            .unwrap();
        assert!(text.contains("def f_layer(q, s, p):"), "{text}");
        assert!(text.contains("l0 = jnp.matmul(s[0], q[\"w\"])"), "{text}");
        assert!(text.contains("return (l2,)"), "{text}");
        assert!(
            text.contains("\"layers\": [\"layers.0.\", \"layers.1.\", \"layers.2.\"]"),
            "{text}"
        );
        assert!(text.contains("\"outputs\": {\"loss\": \"mean\"}"), "{text}");
        assert!(text.contains("return pipelined(f_PARTS, p, x)"), "{text}");
    }

    #[test]
    fn layers_that_differ_or_reach_back_are_refused_with_the_reason() {
        let why = emit_pipelined(&stack(3, false, true), "f", "doc")
            .unwrap()
            .unwrap_err();
        assert_eq!(why, "`layers.1` is not the same computation as `layers.0`");
        let why = emit_pipelined(&stack(3, true, false), "f", "doc")
            .unwrap()
            .unwrap_err();
        assert_eq!(why, "`layers.2` reads a value of `layers.0`");
        let why = emit_pipelined(&stack(1, false, false), "f", "doc")
            .unwrap()
            .unwrap_err();
        assert_eq!(why, "the model has 1 repeated layer(s) to split");
    }
}
