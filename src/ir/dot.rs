//! Graphviz DOT dump of the IR, numbered like the text form so the two can be read together.

use super::graph::{Graph, NodeKind, ValueRef};
use super::numbering::Numbering;
use super::text::{annotations_text, init_text};
use std::fmt::Write;

/// The graph as a DOT digraph: inputs and parameters as ellipses, ops as boxes labelled with
/// their attributes, annotations, result types and origin, outputs as plain labels.
pub fn to_dot(graph: &Graph) -> String {
    let num = Numbering::new(graph);
    let mut out = String::from(
        "digraph mslc {\n  node [shape=box, fontname=\"monospace\"];\n  edge [fontname=\"monospace\"];\n",
    );
    let mut ids = std::collections::HashMap::new();
    for (i, &id) in num.nodes.iter().enumerate() {
        ids.insert(id, i);
        let Some(node) = graph.node(id) else { continue };
        let results: Vec<String> = (0..node.outputs.len())
            .map(|index| num.name(ValueRef { node: id, index }))
            .collect();
        let mut lines = vec![];
        let shape = match &node.kind {
            NodeKind::Input { name } => {
                lines.push(format!("{} input {name}", results.join(", ")));
                "ellipse"
            }
            NodeKind::Param {
                path,
                init,
                trainable,
            } => {
                let kw = if *trainable { "param" } else { "buffer" };
                lines.push(format!("{} {kw} {path}", results.join(", ")));
                lines.push(init_text(init));
                "ellipse"
            }
            NodeKind::Op { op, attrs } => {
                lines.push(format!("{} {op}", results.join(", ")));
                lines.extend(attrs.iter().map(|(k, v)| format!("{k}={v}")));
                "box"
            }
        };
        let notes = annotations_text(&node.annotations);
        if !notes.is_empty() {
            lines.push(notes.trim_start().to_string());
        }
        lines.extend(node.outputs.iter().map(|t| t.to_string()));
        if let Some(origin) = &node.origin {
            lines.push(origin.clone());
        }
        let _ = writeln!(out, "  n{i} [label=\"{}\", shape={shape}];", label(&lines));
    }
    for &id in &num.nodes {
        let slots = graph.input_slots(id);
        for &(slot, v) in &slots {
            let (Some(from), Some(to)) = (ids.get(&v.node), ids.get(&id)) else {
                continue;
            };
            let many_outputs = graph.node(v.node).is_some_and(|n| n.outputs.len() > 1);
            let text = match (many_outputs, slots.len() > 1) {
                (true, _) => format!("{}→{slot}", num.name(v)),
                (false, true) => slot.to_string(),
                (false, false) => String::new(),
            };
            let attr = if text.is_empty() {
                String::new()
            } else {
                format!(" [label=\"{}\"]", label(&[text]))
            };
            let _ = writeln!(out, "  n{from} -> n{to}{attr};");
        }
    }
    for (k, (name, v)) in graph.outputs().iter().enumerate() {
        let _ = writeln!(
            out,
            "  out{k} [label=\"{}\", shape=plaintext];",
            label(&[format!("output {name}")])
        );
        if let Some(from) = ids.get(&v.node) {
            let _ = writeln!(out, "  n{from} -> out{k};");
        }
    }
    out.push_str("}\n");
    out
}

/// Lines joined by DOT's `\n`, each escaped for a double-quoted DOT string.
fn label(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| {
            l.chars()
                .flat_map(|c| match c {
                    '"' => vec!['\\', '"'],
                    '\\' => vec!['\\', '\\'],
                    '\n' => vec!['\\', 'n'],
                    c => vec![c],
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\\n")
}
