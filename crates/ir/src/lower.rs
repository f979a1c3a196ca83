//! Lowering: a checked, elaborated model becomes a graph — one node per input, parameter and op.

use std::collections::HashMap;

use mslc_core::ops::OpError;
use mslc_core::program::{Model, ValueId};

use super::graph::{Graph, ValueRef};

/// Builds the graph of `model`. Fails only if the checker let an ill-typed op through, which
/// is a bug; the error says which op.
pub fn lower(model: &Model) -> Result<Graph, OpError> {
    let mut graph = Graph::new(model.name.clone());
    let mut values: HashMap<ValueId, ValueRef> = HashMap::new();
    for input in &model.inputs {
        values.insert(
            input.value,
            graph.add_input(&input.name, model.ty(input.value).clone()),
        );
    }
    for p in &model.params {
        let v = graph.add_param(
            &p.path,
            model.ty(p.value).clone(),
            p.init.clone(),
            p.trainable,
        );
        values.insert(p.value, v);
    }
    for node in &model.nodes {
        let inputs: Vec<ValueRef> = node
            .inputs
            .iter()
            .map(|v| {
                values.get(v).copied().ok_or_else(|| {
                    OpError::new(format!("{}: operand %{} is undefined", node.op, v.0))
                })
            })
            .collect::<Result<_, _>>()?;
        let outs = graph.add_op(node.op, node.attrs.clone(), &inputs, &node.origin)?;
        if let Some(first) = outs.first() {
            let lowered = graph.node_mut(first.node);
            lowered.annotations = node.annotations.clone();
            lowered.loc = Some(node.loc);
        }
        for (id, v) in node.outputs.iter().zip(outs) {
            values.insert(*id, v);
        }
    }
    for o in &model.outputs {
        if let Some(v) = values.get(&o.value) {
            graph.set_output(&o.name, *v);
        }
    }
    Ok(graph)
}
