//! The IR's text form: one line per node, stable and diffable, readable back by
//! [`super::parse::parse_text`].
//!
//! ```text
//! %0 = input "x" : f32[1,128,256]
//! %1 = param "q_proj.weight" normal(0.0, 0.02) : f32[256,256]
//! %2 = matmul(%0, %1) {transpose_b=true} : f32[1,128,256]  # model.layers.0.self_attn
//! output "q" = %2
//! ```
//!
//! Non-trainable parameters print as `buffer`. Annotations follow the attributes:
//! `@shard([dp,_],[_,mp]) @recompute @keep(f32)`.

use super::graph::{Annotations, Graph, Init, Node, NodeKind};
use super::numbering::Numbering;
use crate::ops::quote;
use std::fmt::Write;

/// The text form of `graph`: inputs and parameters, then ops in topological order, then
/// outputs, with values numbered densely in that order.
pub fn to_text(graph: &Graph) -> String {
    let num = Numbering::new(graph);
    let mut out = String::new();
    for &id in &num.nodes {
        let Some(node) = graph.node(id) else { continue };
        let results: Vec<String> = (0..node.outputs.len())
            .map(|index| num.name(super::ValueRef { node: id, index }))
            .collect();
        let args: Vec<String> = graph
            .inputs_of(id)
            .into_iter()
            .map(|v| num.name(v))
            .collect();
        let _ = write!(out, "{} = {}", results.join(", "), head(node, &args));
        let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let _ = write!(out, " : {}", types.join(", "));
        if let Some(origin) = &node.origin {
            let _ = write!(out, "  # {}", origin_text(origin));
        }
        out.push('\n');
    }
    for (name, v) in graph.outputs() {
        let _ = writeln!(out, "output {} = {}", quote(name), num.name(*v));
    }
    out
}

/// Everything between `=` and `:`.
fn head(node: &Node, args: &[String]) -> String {
    let mut s = match &node.kind {
        NodeKind::Input { name } => format!("input {}", quote(name)),
        NodeKind::Param {
            path,
            init,
            trainable,
        } => {
            let kw = if *trainable { "param" } else { "buffer" };
            format!("{kw} {} {}", quote(path), init_text(init))
        }
        NodeKind::Op { op, attrs } => {
            let mut s = format!("{op}({})", args.join(", "));
            if !attrs.is_empty() {
                let kv: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(s, " {{{}}}", kv.join(", "));
            }
            s
        }
    };
    s.push_str(&annotations_text(&node.annotations));
    s
}

/// `zeros`, `normal(0.0, 0.02)`, ...
pub(crate) fn init_text(init: &Init) -> String {
    match init {
        Init::Zeros => "zeros".into(),
        Init::Ones => "ones".into(),
        Init::Normal { mean, std } => format!("normal({mean:?}, {std:?})"),
        Init::Uniform { low, high } => format!("uniform({low:?}, {high:?})"),
        Init::Constant { v } => format!("constant({v:?})"),
    }
}

/// ` @shard(..) @recompute @keep(..)`, each part only when set.
pub(crate) fn annotations_text(a: &Annotations) -> String {
    let mut s = String::new();
    if let Some(layouts) = &a.shard {
        let parts: Vec<String> = layouts
            .iter()
            .map(|dims| {
                let d: Vec<String> = dims
                    .iter()
                    .map(|axis| axis.as_deref().map_or_else(|| "_".to_string(), axis_text))
                    .collect();
                format!("[{}]", d.join(","))
            })
            .collect();
        let _ = write!(s, " @shard({})", parts.join(","));
    }
    if a.recompute {
        s.push_str(" @recompute");
    }
    if let Some(d) = a.keep_dtype {
        let _ = write!(s, " @keep({d})");
    }
    s
}

/// A mesh axis name: bare when it is a plain identifier other than `_`, quoted otherwise.
fn axis_text(name: &str) -> String {
    if is_ident(name) && name != "_" {
        name.to_string()
    } else {
        quote(name)
    }
}

/// An origin: bare when it reads back unchanged from a `#` comment, quoted otherwise.
fn origin_text(origin: &str) -> String {
    let plain = !origin.is_empty()
        && !origin.starts_with(|c: char| c == '"' || c.is_whitespace())
        && !origin.ends_with(char::is_whitespace)
        && !origin.chars().any(char::is_control);
    if plain {
        origin.to_string()
    } else {
        quote(origin)
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
