//! Scheduling: the optimized graph becomes the module's step list — a deterministic topological
//! order, every value numbered (inputs, parameters, then results in order), each step with the
//! kernel chosen for it. Memory offsets are filled in afterwards by the memory planner.

use std::collections::HashMap;

use mslc_artifact::{Guard, Module, SourceLoc, Step, Storage, ValueInfo};
use mslc_core::ops::Op;
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
    let order = graph.demand_order(roots, |n| is_recomputed(graph, n));
    Some(sink_after_all_reduces(graph, order))
}

/// Values of at most this many bytes (scalars: a gradient's square sum, the running total of
/// a norm) may be kept alive longer so that what computes them waits for an all-reduce.
const SINKABLE_BYTES: u64 = 64;

/// How many single-use results in a row may move along with the node that reads them (the
/// overflow check's `g · 0` before its sum).
const SINKABLE_CHAIN: usize = 4;

/// Moves the computations that read an all-reduce's result — each gradient's unscaling, its
/// square sum for the global norm and its overflow check, right after the gradient's
/// all-reduce in the demand order — to just before their first consumer, so that the steps in
/// between (the rest of the backward) run while the all-reduce does: the executor overlaps an
/// all-reduce with every later step that does not touch its result. A node moved later holds
/// its results for less time; it moves only where its operands live no longer for it: each is
/// small (a scalar), alive past the new place anyway, a single-use result that moves along
/// with it, or read last by it and together no heavier than its results. So no step holds more
/// than it did, and the memory plan holds what it held.
fn sink_after_all_reduces(graph: &Graph, order: Vec<NodeId>) -> Vec<NodeId> {
    if !order.iter().any(|&id| is_all_reduce(graph, id)) {
        return order;
    }
    let mut sinking = Sinking::new(graph, &order);
    for i in (0..order.len()).rev() {
        let id = order[i];
        let outputs =
            (0..graph.node(id).outputs.len() as u32).map(|index| ValueRef { node: id, index });
        if !sinking.downstream[i] || outputs.clone().any(|v| graph.is_output(v)) {
            continue;
        }
        let consumers = graph.consumers(id);
        let at = |c: &NodeId| sinking.position.get(c).copied();
        let Some(first) = consumers
            .iter()
            .filter_map(at)
            .map(|c| sinking.place(c))
            .min()
        else {
            continue;
        };
        // Not for a move past nothing but what the next node brings along.
        if first.0 <= i + 1 {
            continue;
        }
        // Moved later, its results live no longer; its operands must not either — except
        // those it reads last, as long as they weigh no more than its results (the unscaling
        // of an all-reduced gradient: the reduced sum then lives instead of the unscaled one).
        let inputs = graph.inputs(id);
        let last_read = |v: &ValueRef| {
            graph.node(v.node).op().is_some()
                && !graph.is_output(*v)
                && graph.users(*v).iter().all(|(u, _)| *u == id)
        };
        let read_last: u64 = (inputs.iter())
            .filter(|v| last_read(v))
            .map(|v| graph.ty(*v).bytes())
            .sum();
        let made: u64 = graph.node(id).outputs.iter().map(|t| t.bytes()).sum();
        let alive = |v: &ValueRef| {
            (read_last <= made && last_read(v))
                || sinking.stays_alive(*v, id, first, SINKABLE_CHAIN)
        };
        if inputs.iter().all(alive) {
            sinking.attach(i, first);
        }
    }
    let mut sunk = Vec::with_capacity(order.len());
    for (i, &id) in order.iter().enumerate() {
        if sinking.anchor[i] == i {
            sunk.extend(sinking.before[i].iter().map(|&p| order[p]));
            sunk.push(id);
        }
    }
    sunk
}

/// Whether node `id` of `graph` is an all-reduce.
fn is_all_reduce(graph: &Graph, id: NodeId) -> bool {
    graph.node(id).op() == Some(Op::AllReduce)
}

/// What [`sink_after_all_reduces`] knows of the order it moves nodes in, and where it moved
/// them: each moved node sits right before a node that stays, among the others moved there.
struct Sinking<'g> {
    graph: &'g Graph,
    position: HashMap<NodeId, usize>,
    /// Per position, whether the node may move: it reads an all-reduce's result, directly or
    /// through other such nodes, and no all-reduce reads what it computes.
    downstream: Vec<bool>,
    /// Per position, the node that stays in place which it now comes right before (itself
    /// when it did not move).
    anchor: Vec<usize>,
    /// Per position of a node that stays, the moved nodes right before it, in order.
    before: Vec<Vec<usize>>,
}

impl<'g> Sinking<'g> {
    fn new(graph: &'g Graph, order: &[NodeId]) -> Sinking<'g> {
        let position: HashMap<NodeId, usize> =
            order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let is_all_reduce = |id: NodeId| is_all_reduce(graph, id);
        // What an all-reduce reads, directly or not: moved later, it would hold the
        // all-reduce back.
        let mut feeds = vec![false; order.len()];
        for (i, &id) in order.iter().enumerate().rev() {
            feeds[i] = graph
                .consumers(id)
                .iter()
                .any(|c| is_all_reduce(*c) || position.get(c).is_some_and(|&p| feeds[p]));
        }
        let mut downstream = vec![false; order.len()];
        for (i, &id) in order.iter().enumerate() {
            downstream[i] = !is_all_reduce(id)
                && graph.inputs(id).iter().any(|v| {
                    is_all_reduce(v.node) || position.get(&v.node).is_some_and(|&p| downstream[p])
                });
        }
        for (d, f) in downstream.iter_mut().zip(feeds) {
            *d &= !f;
        }
        Sinking {
            graph,
            position,
            downstream,
            anchor: (0..order.len()).collect(),
            before: vec![Vec::new(); order.len()],
        }
    }

    /// Where the node at position `p` now is: the node it comes right before that stays, and
    /// its place among those moved there (the staying node itself after all of them).
    fn place(&self, p: usize) -> (usize, usize) {
        let anchor = self.anchor[p];
        let group = &self.before[anchor];
        (
            anchor,
            group.iter().position(|&q| q == p).unwrap_or(group.len()),
        )
    }

    /// Moves the node at position `p` right before the one at `place`.
    fn attach(&mut self, p: usize, (anchor, at): (usize, usize)) {
        self.anchor[p] = anchor;
        self.before[anchor].insert(at, p);
    }

    /// Whether operand `v` of `reader`, moved right before the node at `to`, lives no longer
    /// for it: small, an output or a leaf (alive throughout), read at or after `to` by another
    /// node, or (up to `chain` deep) read by `reader` alone and computed by a node that can
    /// move along.
    fn stays_alive(&self, v: ValueRef, reader: NodeId, to: (usize, usize), chain: usize) -> bool {
        let graph = self.graph;
        let users = graph.users(v);
        let at = |n: &NodeId| self.position.get(n).copied();
        graph.ty(v).bytes() <= SINKABLE_BYTES
            || graph.is_output(v)
            || graph.node(v.node).op().is_none()
            || (users.iter())
                .any(|(u, _)| *u != reader && at(u).is_some_and(|p| self.place(p) >= to))
            || (chain > 0
                && at(&v.node).is_some_and(|p| self.downstream[p])
                && users.iter().all(|(u, _)| *u == reader)
                && (graph.inputs(v.node).iter())
                    .all(|w| self.stays_alive(*w, v.node, to, chain - 1)))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use mslc_core::ops::{Attrs, DType, TensorType};
    use mslc_ir::shard::Group;

    /// Two gradients of a data-parallel backward, each all-reduced, with the global norm's
    /// square sums over the reduced ones: `(graph, g2, s1)` — the second gradient and the
    /// first square sum.
    fn two_gradients() -> (Graph, NodeId, NodeId) {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, vec![64, 64]);
        let (a, b) = (g.add_input("a", ty.clone()), g.add_input("b", ty));
        let op = |g: &mut Graph, op: Op, attrs: Attrs, inputs: &[ValueRef]| {
            g.add_op(op, attrs, inputs, "t").unwrap()[0]
        };
        let dp = Group::new("dp", 2).attrs();
        let g1 = op(&mut g, Op::Mul, Attrs::new(), &[a, b]);
        let r1 = op(&mut g, Op::AllReduce, dp.clone(), &[g1]);
        // The earlier layer's backward, which the first all-reduce can overlap.
        let h = op(&mut g, Op::Exp, Attrs::new(), &[a]);
        let g2 = op(&mut g, Op::Mul, Attrs::new(), &[h, b]);
        let r2 = op(&mut g, Op::AllReduce, dp, &[g2]);
        let s1 = op(&mut g, Op::SquareSum, Attrs::new(), &[r1]);
        let s2 = op(&mut g, Op::SquareSum, Attrs::new(), &[r2]);
        let total = op(&mut g, Op::Add, Attrs::new(), &[s1, s2]);
        g.set_output("norm", total);
        // The update reads the reduced gradients last.
        g.set_output("r1", r1);
        g.set_output("r2", r2);
        (g, g2.node, s1.node)
    }

    #[test]
    fn what_reads_a_reduced_gradient_waits_for_the_next_gradient() {
        let (g, g2, s1) = two_gradients();
        let demand = g.demand_order(g.outputs.iter().map(|(_, v)| v.node), |_| false);
        let at = |order: &[NodeId], n: NodeId| order.iter().position(|&m| m == n).unwrap();
        // The demand order squares the first reduced gradient right after its all-reduce.
        assert!(at(&demand, s1) < at(&demand, g2));
        let order = schedule_order(&g).unwrap();
        assert!(at(&order, s1) > at(&order, g2), "{order:?}");
        assert_eq!(order.len(), demand.len());
    }

    /// The least arena `order` of `g` needs: each op's results from where it runs to their
    /// last reader (to the end for an output).
    fn lower_bound_of(g: &Graph, order: &[NodeId]) -> u64 {
        let at = |n: NodeId| order.iter().position(|&m| m == n).unwrap();
        let mut reqs = Vec::new();
        for &id in order.iter().filter(|&&id| g.node(id).op().is_some()) {
            for (index, ty) in g.node(id).outputs.iter().enumerate() {
                let v = ValueRef {
                    node: id,
                    index: index as u32,
                };
                let last = match g.is_output(v) {
                    true => order.len(),
                    false => g
                        .users(v)
                        .iter()
                        .map(|(u, _)| at(*u))
                        .max()
                        .unwrap_or(at(id)),
                };
                reqs.push(crate::arena::BufferReq {
                    bytes: ty.bytes(),
                    first: at(id),
                    last,
                });
            }
        }
        crate::arena::lower_bound(&reqs).unwrap()
    }

    /// Moving what reads a reduced gradient later keeps no larger value alive for longer.
    #[test]
    fn sinking_needs_no_more_memory_than_the_demand_order() {
        let (g, _, _) = two_gradients();
        let demand = g.demand_order(g.outputs.iter().map(|(_, v)| v.node), |_| false);
        let order = schedule_order(&g).unwrap();
        assert_ne!(order, demand);
        assert!(lower_bound_of(&g, &order) <= lower_bound_of(&g, &demand));
    }

    #[test]
    fn an_order_without_all_reduces_is_the_demand_order() {
        let (mut g, _, _) = two_gradients();
        for id in g.node_ids() {
            if g.node(id).op() == Some(Op::AllReduce) {
                let input = g.inputs(id)[0];
                g.replace_all_uses(ValueRef { node: id, index: 0 }, input);
                g.remove_node(id);
            }
        }
        let demand = g.demand_order(g.outputs.iter().map(|(_, v)| v.node), |_| false);
        assert_eq!(schedule_order(&g).unwrap(), demand);
    }
}
