//! Scheduling: the optimized graph becomes the module's step list — a deterministic topological
//! order, every value numbered (inputs, parameters, then results in order), each step with the
//! kernel chosen for it. Memory offsets are filled in afterwards by the memory planner.

use std::collections::HashMap;

use mslc_artifact::{Guard, Module, SourceLoc, Step, Storage, ValueInfo};
use mslc_ir::recompute::is_recomputed;
use mslc_ir::{Graph, NodeId, NodeKind, ValueRef};

use super::target::Target;
use mslc_kernels::binding::choose_kernel;

/// Builds the (not yet memory-planned) module of `graph` for `target`. `None` if the graph has
/// a cycle, which the verifier rules out.
pub fn schedule(graph: &Graph, target: &Target) -> Option<Module> {
    let order = schedule_order(graph)?;
    let mut values = Vec::new();
    let mut index: HashMap<ValueRef, u32> = HashMap::new();
    fn number(
        v: ValueRef,
        info: ValueInfo,
        values: &mut Vec<ValueInfo>,
        index: &mut HashMap<ValueRef, u32>,
    ) {
        index.insert(v, values.len() as u32);
        values.push(info);
    }
    let leaves = |want_input: bool| {
        order
            .iter()
            .copied()
            .filter(move |id| matches!(graph.node(*id).kind, NodeKind::Input { .. }) == want_input)
    };
    for id in leaves(true).chain(leaves(false)) {
        let node = graph.node(id);
        let storage = match &node.kind {
            NodeKind::Input { name } => Storage::Input { name: name.clone() },
            NodeKind::Param {
                path,
                init,
                trainable,
            } => Storage::Param {
                path: path.clone(),
                init: init.clone(),
                trainable: *trainable,
            },
            NodeKind::Op { .. } => continue,
        };
        number(
            ValueRef { node: id, index: 0 },
            ValueInfo {
                ty: node.outputs[0].clone(),
                storage,
            },
            &mut values,
            &mut index,
        );
    }
    let mut steps = Vec::new();
    for id in &order {
        let node = graph.node(*id);
        let NodeKind::Op { op, attrs } = &node.kind else {
            continue;
        };
        let operands = graph.inputs(*id);
        let inputs: Vec<u32> = operands.iter().map(|v| index[v]).collect();
        let mut outputs = Vec::new();
        for (i, ty) in node.outputs.iter().enumerate() {
            let v = ValueRef {
                node: *id,
                index: i as u32,
            };
            outputs.push(values.len() as u32);
            number(
                v,
                ValueInfo {
                    ty: ty.clone(),
                    storage: Storage::Arena { offset: 0 },
                },
                &mut values,
                &mut index,
            );
        }
        let kernel = choose_kernel(*op);
        steps.push(Step {
            op: *op,
            attrs: attrs.clone(),
            inputs,
            outputs,
            origin: node.origin.clone(),
            loc: node.loc.map(SourceLoc::from),
            kernel,
        });
    }
    let outputs = graph
        .outputs
        .iter()
        .map(|(n, v)| (n.clone(), index[v]))
        .collect();
    Some(Module {
        name: graph.name.clone(),
        target: target.name.clone(),
        target_fingerprint: target.fingerprint(),
        values,
        steps,
        outputs,
        arena_bytes: 0,
        hoisted_bytes: 0,
        guard: None,
    })
}

/// A deterministic order that computes every value just before it is first needed: a
/// depth-first walk from the outputs (in declaration order) through each node's operands in
/// slot order, emitting a node after its operands. Work that depends only on parameters —
/// mixed precision's weight casts, constants, masks — lands right before its consumer instead
/// of being hoisted to the start and kept alive across the schedule. Among a node's operands,
/// recomputed copies ([`mslc_ir::recompute`]) are computed last. Nodes no output needs come
/// last, in topological order.
fn schedule_order(graph: &Graph) -> Option<Vec<NodeId>> {
    let topo = graph.topo_order()?;
    let roots = graph
        .outputs
        .iter()
        .map(|(_, v)| v.node)
        .chain(topo.iter().copied());
    // Recomputed copies are computed last among a node's operands, right before it:
    // otherwise a backward op whose incoming gradient is a long chain would recompute its
    // activations before that chain and keep them alive across it.
    Some(graph.demand_order(roots, |n| is_recomputed(graph, n)))
}

/// The guard of `module`'s update ([`Guard`]): the steps no output outside `updates` needs,
/// which must be the last ones, and the output `flag` that skips them. An error says why the
/// schedule cannot skip its update that way (a kept output computed after the update begins,
/// or no output `flag` before it); the caller orders the outputs so that it can: a schedule
/// computes the outputs in their order ([`schedule`]).
pub fn guard_updates(
    module: &Module,
    flag: &str,
    updates: impl Fn(&str) -> bool,
) -> Result<Guard, String> {
    let kept = module
        .outputs
        .iter()
        .filter(|(name, _)| !updates(name))
        .map(|&(_, v)| v);
    let mut needed = vec![false; module.steps.len()];
    module.mark_steps_feeding(&module.producers(), kept, &mut needed);
    let from = needed.iter().take_while(|&&n| n).count();
    if let Some(late) = needed[from..].iter().position(|&n| n) {
        return Err(format!(
            "step {} computes a kept output after the update begins at step {from}",
            from + late
        ));
    }
    let &(_, flag_value) = module
        .outputs
        .iter()
        .find(|(name, _)| name == flag)
        .ok_or_else(|| format!("no output `{flag}` guards the update"))?;
    if updates(flag) {
        return Err(format!("the update's flag `{flag}` is an update"));
    }
    Ok(Guard {
        flag: flag_value,
        from: from as u32,
    })
}
