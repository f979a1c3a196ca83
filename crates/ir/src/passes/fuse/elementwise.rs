//! Chains of elementwise ops → one `fused_elementwise` whose `program` replays them. Starting
//! from the last op of a chain (visiting the graph from its outputs back), an operand joins
//! the chain when an elementwise op produces it, only the chain reads it, it is not a model
//! output and it has the chain's output shape; existing `fused_elementwise` ops are inlined,
//! so fusing again only merges. A chain whose fused op's signature is in `cx.unfused` (a
//! tuning decision) is left as it is, and none of its ops joins another chain. A fused chain
//! reads a `broadcast_to`'s operand rather than its expanded copy wherever its operands still
//! broadcast to the chain's output shape (the program broadcasts them itself); the copy is
//! then dead.

use std::collections::{HashMap, HashSet};

use super::{left_unfused, topo, NAME};
use crate::passes::rewrite::{add_like, replace_with};
use crate::passes::{PassContext, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::family::program::{ElementwiseProgram, Operand, Step};
use mslc_core::ops::{broadcast, Attrs, Op, OpError};

/// Whether node `id` can be a step (or, when fused already, several steps) of a program.
fn fusable(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let Some(op) = node.op() else {
        return false;
    };
    let spec = op.spec();
    node.outputs.len() == 1
        && spec.elementwise
        && (op == Op::Cast || op == Op::FusedElementwise || spec.attrs.is_empty())
}

/// The chain ending at `root`, in topological order (root last): every elementwise producer
/// of the chain's output shape, not `kept` unfused, all of whose readers are already in the
/// chain, grown until nothing more joins.
fn chain(
    g: &Graph,
    root: NodeId,
    position: &HashMap<NodeId, usize>,
    kept: &HashSet<NodeId>,
) -> Vec<NodeId> {
    let shape = &g.node(root).outputs[0].shape;
    let mut members: HashSet<NodeId> = HashSet::from([root]);
    loop {
        let mut joined = Vec::new();
        for n in &members {
            for v in g.inputs(*n) {
                let joins = !members.contains(&v.node)
                    && !joined.contains(&v.node)
                    && position.contains_key(&v.node)
                    && !kept.contains(&v.node)
                    && fusable(g, v.node)
                    && &g.ty(v).shape == shape
                    && !g.is_output(v)
                    && g.users(v).iter().all(|(u, _)| members.contains(u));
                if joins {
                    joined.push(v.node);
                }
            }
        }
        if joined.is_empty() {
            break;
        }
        members.extend(joined);
    }
    let mut members: Vec<NodeId> = members.into_iter().collect();
    members.sort_by_key(|n| position.get(n).copied().unwrap_or(usize::MAX));
    members
}

/// Builds the program computing `members` (in topological order) and the fused op's
/// operands.
fn program(g: &Graph, members: &[NodeId]) -> Result<(ElementwiseProgram, Vec<ValueRef>), OpError> {
    let mut inputs: Vec<ValueRef> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    // The step computing each member's result.
    let mut result: HashMap<NodeId, usize> = HashMap::new();
    let member_set: HashSet<NodeId> = members.iter().copied().collect();
    for &m in members {
        let mut args: Vec<Operand> = Vec::new();
        for v in g.inputs(m) {
            args.push(if member_set.contains(&v.node) {
                let step = result.get(&v.node).copied().ok_or_else(|| {
                    OpError::new("an elementwise chain is not in topological order")
                })?;
                Operand::Step(step)
            } else {
                let i = inputs.iter().position(|x| *x == v).unwrap_or_else(|| {
                    inputs.push(v);
                    inputs.len() - 1
                });
                Operand::Input(i)
            });
        }
        let node = g.node(m);
        let attrs = node.attrs().cloned().unwrap_or_default();
        match node.op() {
            Some(Op::FusedElementwise) => {
                let inner = ElementwiseProgram::parse(&attrs.str("program")?)?;
                let base = steps.len();
                for s in inner.steps {
                    let args = s
                        .args
                        .iter()
                        .map(|a| match *a {
                            Operand::Input(n) => args.get(n).copied().ok_or_else(|| {
                                OpError::new(format!("program reads x{n}, which is not given"))
                            }),
                            Operand::Step(n) => Ok(Operand::Step(base + n)),
                        })
                        .collect::<Result<_, _>>()?;
                    steps.push(Step { args, ..s });
                }
            }
            Some(op) => {
                let cast_to = if op == Op::Cast {
                    Some(attrs.dtype("dtype")?)
                } else {
                    None
                };
                steps.push(Step { op, cast_to, args });
            }
            None => return Err(OpError::new("a chain member is not an op")),
        }
        result.insert(m, steps.len() - 1);
    }
    Ok((ElementwiseProgram { steps }, inputs))
}

/// Reads each of a fused op's `inputs` that a `broadcast_to` produced from that op's own
/// operand instead, where the program's own broadcasting gives the same values: the operands
/// must still broadcast to the chain's output `shape` exactly. The expanded copy is then never
/// written (a reduction's gradient, such as batch norm's, broadcasts per-channel values over
/// a whole activation only to combine them elementwise).
fn read_before_broadcasts(g: &Graph, inputs: &mut [ValueRef], shape: &[i64]) {
    for i in 0..inputs.len() {
        let v = inputs[i];
        if g.node(v.node).op() != Some(Op::BroadcastTo) {
            continue;
        }
        let Some(&operand) = g.inputs(v.node).first() else {
            continue;
        };
        let unchanged = inputs
            .iter()
            .enumerate()
            .try_fold(Vec::new(), |acc, (j, x)| {
                let x = if j == i { operand } else { *x };
                broadcast(&acc, &g.ty(x).shape)
            });
        if unchanged.as_deref() == Some(shape) {
            inputs[i] = operand;
        }
    }
}

/// Fuses every chain of two or more elementwise ops, except the chains `cx.unfused` names.
pub(super) fn run(g: &mut Graph, cx: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    let order = topo(g)?;
    let position: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut kept: HashSet<NodeId> = HashSet::new();
    for &root in order.iter().rev() {
        if !g.contains(root) || kept.contains(&root) || !fusable(g, root) {
            continue;
        }
        let members = chain(g, root, &position, &kept);
        if members.len() < 2 {
            continue;
        }
        let (program, mut inputs) = program(g, &members)?;
        let shape = g.node(root).outputs[0].shape.clone();
        read_before_broadcasts(g, &mut inputs, &shape);
        let attrs = Attrs::new().with("program", program.to_string().as_str());
        let fused = add_like(g, root, Op::FusedElementwise, attrs, &inputs)?;
        if left_unfused(g, cx, fused.node) {
            g.remove_node(fused.node);
            kept.extend(members);
            stats.record(NAME, "elementwise_left_unfused");
            continue;
        }
        replace_with(g, root, fused);
        for &m in &members[..members.len() - 1] {
            g.remove_node(m);
        }
        stats.record(NAME, "elementwise");
    }
    Ok(())
}
