//! The stable text dump of the IR, and the print order the Graphviz dump (`dot`) shares.
//! Values are numbered densely in print order (inputs, then parameters, then ops in
//! topological order), so a dump does not change when a rewrite merely renumbers nodes.

use std::collections::HashMap;
use std::fmt::Write;

use super::graph::{Graph, NodeId, NodeKind, ValueRef};
use mslc_core::ops::family::collective::payload_bytes;
use mslc_core::program::Init;

/// Print order and value numbering shared by both dumps.
pub(crate) struct Numbering {
    /// Nodes in print order.
    pub(crate) order: Vec<NodeId>,
    names: HashMap<ValueRef, usize>,
}

/// Inputs, then parameters, then ops in topological order, with their values numbered.
pub(crate) fn number(graph: &Graph) -> Numbering {
    let topo = graph.topo_order().unwrap_or_else(|| graph.node_ids());
    let rank = |id: &NodeId| match graph.node(*id).kind {
        NodeKind::Input { .. } => 0,
        NodeKind::Param { .. } => 1,
        NodeKind::Op { .. } => 2,
    };
    let mut order = topo;
    order.sort_by_key(rank);
    let mut names = HashMap::new();
    for id in &order {
        for index in 0..graph.node(*id).outputs.len() {
            let next = names.len();
            names.insert(
                ValueRef {
                    node: *id,
                    index: index as u32,
                },
                next,
            );
        }
    }
    Numbering { order, names }
}

fn init_text(init: &Init) -> String {
    match init {
        Init::Zeros => "zeros".to_string(),
        Init::Ones => "ones".to_string(),
        Init::Constant { value } => format!("constant({value:?})"),
        Init::Normal { mean, std } => format!("normal({mean:?}, {std:?})"),
        Init::Uniform { low, high } => format!("uniform({low:?}, {high:?})"),
    }
}

/// The text form: one line per node, then the outputs.
pub fn to_text(graph: &Graph) -> String {
    let n = number(graph);
    let name = |v: &ValueRef| n.names.get(v).map_or("%?".to_string(), |i| format!("%{i}"));
    let mut out = format!("graph {} {{\n", graph.name);
    for id in &n.order {
        let node = graph.node(*id);
        let results: Vec<String> = (0..node.outputs.len())
            .map(|i| {
                name(&ValueRef {
                    node: *id,
                    index: i as u32,
                })
            })
            .collect();
        let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let _ = write!(out, "  {} = ", results.join(", "));
        match &node.kind {
            NodeKind::Input { name: input } => {
                let _ = write!(out, "input {input:?} : {}", types.join(", "));
            }
            NodeKind::Param {
                path,
                init,
                trainable,
            } => {
                let kw = if *trainable { "param" } else { "buffer" };
                let _ = write!(
                    out,
                    "{kw} {path:?} : {} ~ {}",
                    types.join(", "),
                    init_text(init)
                );
            }
            NodeKind::Op { op, attrs } => {
                let args: Vec<String> = graph.inputs(*id).iter().map(&name).collect();
                let _ = write!(out, "{op}({})", args.join(", "));
                if !attrs.is_empty() {
                    let attrs: Vec<String> =
                        attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    let _ = write!(out, " {{{}}}", attrs.join(", "));
                }
                let _ = write!(out, " : {}", types.join(", "));
                if crate::shard::is_collective(*op) {
                    let input = graph.inputs(*id).first().map(|v| graph.ty(*v).clone());
                    let bytes = input.map_or(0, |t| payload_bytes(*op, &t));
                    let _ = write!(out, " @sends({bytes} B)");
                }
                let a = &node.annotations;
                if a.recompute {
                    out.push_str(" @recompute");
                }
                if let Some(d) = a.keep_dtype {
                    let _ = write!(out, " @{d}");
                }
                if !node.origin.is_empty() {
                    let _ = write!(out, "  # {}", node.origin);
                }
            }
        }
        out.push('\n');
    }
    for (output, v) in &graph.outputs {
        let _ = writeln!(out, "  output {output} = {}", name(v));
    }
    out.push_str("}\n");
    out
}
