//! The Graphviz DOT dump of the IR (`mslc build --emit dot`): one box per node labelled with
//! its op, attributes and origin; one cluster per layer (the op's instance path up to its layer
//! index, `model.layers.3`); and, so that a 70B graph stays readable, a run of identical layers
//! drawn as its first and last layer with one `× N more` node between them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;

use mslc_core::paths::split_index;

use super::graph::{Graph, NodeId, NodeKind};
use super::print::number;

/// Runs of at least this many identical layers are elided down to their first and last layer.
const MIN_ELIDED_RUN: usize = 4;

/// Longest attribute value shown in a label; longer ones (fused elementwise programs) end in `…`.
const MAX_ATTR_CHARS: usize = 60;

/// A layer: the path before its index (`model.layers.`) and the index.
type Layer = (String, u64);

/// The DOT text of `graph`.
pub fn to_dot(graph: &Graph) -> String {
    let order = number(graph).order;
    let layer_of: HashMap<NodeId, Layer> = order
        .iter()
        .filter_map(|id| {
            let node = graph.node(*id);
            let path = match &node.kind {
                NodeKind::Input { .. } => return None,
                NodeKind::Param { path, .. } => path.as_str(),
                NodeKind::Op { .. } => node.origin.as_str(),
            };
            split_index(path).map(|(head, index, _)| (*id, (head.to_string(), index)))
        })
        .collect();
    let elided = elided_runs(graph, &order, &layer_of);
    let placeholder = |id: &NodeId| {
        let layer = layer_of.get(id)?;
        elided.iter().position(|run| run.hides(layer))
    };

    let mut out = format!(
        "digraph {} {{\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n  edge [fontname=\"monospace\", fontsize=10];\n",
        quoted(&graph.name)
    );
    let mut clusters: BTreeMap<&Layer, Vec<String>> = BTreeMap::new();
    for id in &order {
        if placeholder(id).is_some() {
            continue;
        }
        let line = node_line(graph, *id);
        match layer_of.get(id) {
            Some(layer) => clusters.entry(layer).or_default().push(line),
            None => out.push_str(&line),
        }
    }
    for (i, ((head, index), lines)) in clusters.iter().enumerate() {
        let _ = writeln!(
            out,
            "  subgraph cluster_{i} {{\n    label={};\n    style=rounded;\n    color=gray60;",
            quoted(&format!("{head}{index}"))
        );
        for line in lines {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push_str("  }\n");
    }
    for (i, run) in elided.iter().enumerate() {
        let hidden = run.last - run.first - 1;
        let label = format!(
            "{}{{{}..{}}}\n× {hidden} more identical layers",
            run.head,
            run.first + 1,
            run.last - 1
        );
        let _ = writeln!(
            out,
            "  more_{i} [label={}, shape=box3d, style=dashed];",
            quoted(&label)
        );
    }
    let end = |id: NodeId| match placeholder(&id) {
        Some(i) => format!("more_{i}"),
        None => format!("n{}", id.index()),
    };
    let mut drawn = HashSet::new();
    for id in &order {
        for v in graph.inputs(*id) {
            let (from, to) = (end(v.node), end(*id));
            let touches_elided = from.starts_with("more_") || to.starts_with("more_");
            if from == to || (touches_elided && !drawn.insert((from.clone(), to.clone()))) {
                continue;
            }
            if touches_elided {
                let _ = writeln!(out, "  {from} -> {to} [style=dashed];");
            } else {
                let ty = graph.ty(v).to_string();
                let _ = writeln!(out, "  {from} -> {to} [label={}];", quoted(&ty));
            }
        }
    }
    for (name, v) in &graph.outputs {
        let _ = writeln!(
            out,
            "  out_{} [label={}, shape=ellipse];",
            out_id(name),
            quoted(&format!("output {name}"))
        );
        let _ = writeln!(out, "  {} -> out_{};", end(v.node), out_id(name));
    }
    out.push_str("}\n");
    out
}

/// A run of identical layers whose middle is elided: `head{first..=last}`.
struct Run {
    head: String,
    first: u64,
    last: u64,
}

impl Run {
    /// Whether `layer` is one of the run's hidden (middle) layers.
    fn hides(&self, (head, index): &Layer) -> bool {
        *head == self.head && *index > self.first && *index < self.last
    }
}

/// The runs of at least [`MIN_ELIDED_RUN`] consecutive layers whose nodes are the same ops with
/// the same attributes and result types, in the same order.
fn elided_runs(graph: &Graph, order: &[NodeId], layer_of: &HashMap<NodeId, Layer>) -> Vec<Run> {
    let mut shapes: BTreeMap<&Layer, Vec<String>> = BTreeMap::new();
    for id in order {
        if let Some(layer) = layer_of.get(id) {
            shapes.entry(layer).or_default().push(signature(graph, *id));
        }
    }
    let mut runs = Vec::new();
    let mut layers = shapes.iter().peekable();
    while let Some(((head, first), shape)) = layers.next() {
        let mut last = *first;
        while let Some(((h, i), s)) = layers.peek() {
            if h != head || Some(*i) != last.checked_add(1) || *s != shape {
                break;
            }
            last = *i;
            layers.next();
        }
        if last - first + 1 >= MIN_ELIDED_RUN as u64 {
            runs.push(Run {
                head: head.clone(),
                first: *first,
                last,
            });
        }
    }
    runs
}

/// What a node is, without its layer: two layers are identical when their signatures agree.
fn signature(graph: &Graph, id: NodeId) -> String {
    let node = graph.node(id);
    let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
    let what = match &node.kind {
        NodeKind::Op { op, attrs } => {
            let attrs: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{op}{{{}}}", attrs.join(","))
        }
        NodeKind::Param { trainable, .. } => format!("param {trainable}"),
        NodeKind::Input { name } => format!("input {name}"),
    };
    format!("{what}:{}", types.join(","))
}

/// One node's statement: its label (op, attributes one per line, origin) and shape.
fn node_line(graph: &Graph, id: NodeId) -> String {
    let node = graph.node(id);
    let (label, style) = match &node.kind {
        NodeKind::Input { name } => (format!("input {name}"), "shape=ellipse"),
        NodeKind::Param { path, .. } => (path.clone(), "shape=note"),
        NodeKind::Op { op, attrs } => {
            let mut label = op.to_string();
            for (k, v) in attrs.iter() {
                let mut value = v.to_string();
                if value.chars().count() > MAX_ATTR_CHARS {
                    value = value.chars().take(MAX_ATTR_CHARS - 1).collect::<String>() + "…";
                }
                let _ = write!(label, "\n{k}={value}");
            }
            if !node.origin.is_empty() {
                let _ = write!(label, "\n{}", node.origin);
            }
            let style = if op.name().starts_with("fused_") {
                "shape=box, style=filled, fillcolor=lightyellow"
            } else {
                "shape=box"
            };
            (label, style)
        }
    };
    format!("  n{} [label={}, {style}];\n", id.index(), quoted(&label))
}

/// An output's node id: its name with anything DOT would not take in an id replaced.
fn out_id(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `s` as a DOT quoted string: `"` and `\` escaped, newlines as DOT's `\n` line break, other
/// control characters dropped.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_once() {
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
        assert_eq!(quoted("say \"x\\y\""), "\"say \\\"x\\\\y\\\"\"");
        assert_eq!(out_id("logits.0"), "logits_0");
    }
}
