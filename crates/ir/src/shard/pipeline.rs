//! Pipeline parallelism (GPipe, Huang et al. 2019; PipeDream-Flush's 1F1B, Narayanan et al.
//! 2021) as a cut of one device's forward graph into the graph each stage runs. Every op of a
//! repeated layer runs on the stage its layer is planned on; an op outside the layers runs on
//! the latest stage among its operands' (the embedding before the layers on the first, the
//! final norm, head and loss on the last). What depends on no activation — parameters, the
//! model's inputs (each stage's rank reads them itself) and what is computed from those alone,
//! such as a rope table or a cast weight — is copied into every stage that reads it rather
//! than sent. A value made on one stage and read on a later one is an output of the first
//! (sent) and an input of the second (received), named alike ([`boundary_name`]) so both
//! sides of the cut agree without talking.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::ShardError;
use crate::graph::{Graph, NodeId, NodeKind, ValueRef};

/// One value crossing a cut between two stages: its name on both sides and the other stage.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crossing {
    /// The input (receiving side) and output (sending side) name of the value.
    pub name: String,
    /// The stage it comes from (for a receive) or goes to (for a send).
    pub peer: usize,
}

/// What a stage's graph exchanges with the others, in the order both sides send and receive
/// (by [`Crossing::name`], then peer).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageCut {
    /// The values this stage receives before it runs.
    pub receives: Vec<Crossing>,
    /// The values this stage sends after it runs (one entry per receiving stage).
    pub sends: Vec<Crossing>,
    /// The model outputs this stage computes (the others compute none of them).
    pub outputs: Vec<String>,
    /// Trained parameters this stage reads that another stage reads too (tied weights, such
    /// as an output head sharing the embedding's table): each stage has a copy, whose
    /// gradients the stages sum before they update their copies alike.
    pub shared: Vec<SharedParam>,
}

/// A trained parameter several stages read (a tied weight), and which stages.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharedParam {
    /// Its path.
    pub path: String,
    /// Every stage that reads it, this one included, in ascending order.
    pub stages: Vec<usize>,
}

/// The input and output name of value `v` of the whole graph where it crosses a cut.
pub fn boundary_name(v: ValueRef) -> String {
    format!("pipeline.{}.{}", v.node.index(), v.index)
}

/// Rewrites `graph` (one device's whole forward) into stage `stage`'s part of a pipeline of
/// `stages` stages, where `layer_stage` gives the stage of an op by its instance path (`None`
/// outside the repeated layers). An error names an op that would run before a value it reads
/// (a layer planned on an earlier stage than an op it depends on) or a stage out of range.
pub fn pipeline_stage(
    graph: &mut Graph,
    stage: usize,
    stages: usize,
    layer_stage: &dyn Fn(&str) -> Option<usize>,
) -> Result<StageCut, ShardError> {
    if stage >= stages {
        return Err(ShardError(format!(
            "stage {stage} of a pipeline of {stages} stages"
        )));
    }
    let order = graph
        .topo_order()
        .ok_or_else(|| ShardError("the graph has a cycle".to_string()))?;
    let placed = place(graph, &order, stages, layer_stage)?;
    let stage_of = |v: ValueRef| placed.get(&v.node).copied();
    let (keep, received, outputs) = needed(graph, &order, &placed, stages, stage)?;
    // Trained parameters another stage reads too (tied weights), with every stage reading them.
    let mut shared: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for other in (0..stages).filter(|&t| t != stage) {
        let (theirs, ..) = needed(graph, &order, &placed, stages, other)?;
        for id in keep.intersection(&theirs) {
            if let NodeKind::Param {
                path,
                trainable: true,
                ..
            } = &graph.node(*id).kind
            {
                shared
                    .entry(path.clone())
                    .or_insert_with(|| BTreeSet::from([stage]))
                    .insert(other);
            }
        }
    }
    let mut keep = keep;
    // Values of this stage that later stages read, each once per reading stage.
    let mut sends: BTreeSet<(ValueRef, usize)> = BTreeSet::new();
    for &n in &order {
        let Some(&reader) = placed.get(&n) else {
            continue;
        };
        if reader <= stage {
            continue;
        }
        for v in graph.inputs(n) {
            if stage_of(v) == Some(stage) {
                sends.insert((v, reader));
            }
        }
    }
    let mut cut = StageCut {
        outputs: outputs.clone(),
        shared: shared
            .into_iter()
            .map(|(path, stages)| SharedParam {
                path,
                stages: stages.into_iter().collect(),
            })
            .collect(),
        ..StageCut::default()
    };
    for v in &received {
        let name = boundary_name(*v);
        let ty = graph.ty(*v).clone();
        let input = graph.add_input(&name, ty);
        for (user, slot) in graph.users(*v) {
            if keep.contains(&user) {
                graph.set_input(user, slot, input);
            }
        }
        keep.insert(input.node);
        cut.receives.push(Crossing {
            name,
            peer: stage_of(*v).unwrap_or(0),
        });
    }
    let kept_outputs: Vec<(String, ValueRef)> = graph
        .outputs
        .iter()
        .filter(|(name, _)| outputs.contains(name))
        .cloned()
        .collect();
    graph.outputs = kept_outputs;
    for &(v, reader) in &sends {
        let name = boundary_name(v);
        if !graph.outputs.iter().any(|(n, _)| *n == name) {
            graph.set_output(&name, v);
        }
        cut.sends.push(Crossing { name, peer: reader });
    }
    for id in graph.node_ids() {
        if !keep.contains(&id) {
            graph.remove_node(id);
        }
    }
    cut.receives.sort();
    cut.sends.sort();
    Ok(cut)
}

/// A stage's nodes, the values it receives and its outputs' names ([`needed`]).
type Needed = (BTreeSet<NodeId>, BTreeSet<ValueRef>, Vec<String>);

/// What stage `stage` computes: its placed ops, the outputs placed on it (an output computed
/// from inputs and parameters alone is the last stage's), and the copies they read; the values
/// it receives from earlier stages; the names of its outputs.
fn needed(
    graph: &Graph,
    order: &[NodeId],
    placed: &HashMap<NodeId, usize>,
    stages: usize,
    stage: usize,
) -> Result<Needed, ShardError> {
    let stage_of = |v: ValueRef| placed.get(&v.node).copied();
    let mut keep: BTreeSet<NodeId> = BTreeSet::new();
    let mut stack: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|n| placed.get(n) == Some(&stage))
        .collect();
    let mut outputs = Vec::new();
    for (name, v) in &graph.outputs {
        if stage_of(*v).unwrap_or(stages - 1) == stage {
            outputs.push(name.clone());
            stack.push(v.node);
        }
    }
    let mut received: BTreeSet<ValueRef> = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !keep.insert(n) {
            continue;
        }
        for v in graph.inputs(n) {
            match stage_of(v) {
                Some(s) if s == stage => stack.push(v.node),
                Some(s) if s < stage => {
                    received.insert(v);
                }
                Some(s) => {
                    return Err(ShardError(format!(
                        "`{}` on stage {stage} reads a value of stage {s}",
                        graph.node(n).origin
                    )))
                }
                None => stack.push(v.node),
            }
        }
    }
    Ok((keep, received, outputs))
}

/// The stage of every node that depends on an activation (the others are copied where read):
/// a layer's op on its layer's stage, any other on the latest of its operands'.
fn place(
    graph: &Graph,
    order: &[NodeId],
    stages: usize,
    layer_stage: &dyn Fn(&str) -> Option<usize>,
) -> Result<HashMap<NodeId, usize>, ShardError> {
    let mut placed: HashMap<NodeId, usize> = HashMap::new();
    for &id in order {
        let node = graph.node(id);
        if !matches!(node.kind, NodeKind::Op { .. }) {
            continue;
        }
        let operands: Vec<usize> = graph
            .inputs(id)
            .iter()
            .filter_map(|v| placed.get(&v.node).copied())
            .collect();
        let latest = operands.iter().copied().max();
        let own = layer_stage(&node.origin);
        let stage = match (own, latest) {
            (Some(s), Some(l)) if s < l => {
                return Err(ShardError(format!(
                    "`{}` is planned on stage {s} but reads a value of stage {l}: a layer's \
                     stage must not come before the layers it depends on",
                    node.origin
                )))
            }
            (Some(s), _) if s >= stages => {
                return Err(ShardError(format!(
                    "`{}` is planned on stage {s} of a pipeline of {stages} stages",
                    node.origin
                )))
            }
            (Some(s), _) => s,
            (None, Some(l)) => l,
            (None, None) if depends_on_activation(graph, id, &placed) => 0,
            (None, None) => continue,
        };
        placed.insert(id, stage);
    }
    Ok(placed)
}

/// Whether op `id`, none of whose operands is placed, reads a model input directly (the
/// embedding of the token ids): it is the first stage's work, not copied.
fn depends_on_activation(graph: &Graph, id: NodeId, placed: &HashMap<NodeId, usize>) -> bool {
    graph.inputs(id).iter().any(|v| {
        placed.contains_key(&v.node) || matches!(graph.node(v.node).kind, NodeKind::Input { .. })
    })
}

/// The stage of each repeated layer, in order, from the plan's `[first, end)` layer ranges per
/// stage: `layers[s]` are stage `s`'s.
pub fn stage_of_layers(layers: &[Vec<[usize; 2]>]) -> BTreeMap<usize, usize> {
    let mut out = BTreeMap::new();
    for (stage, ranges) in layers.iter().enumerate() {
        for &[first, end] in ranges {
            for layer in first..end {
                out.insert(layer, stage);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use mslc_core::ops::{Attrs, DType, Op, TensorType};

    use super::*;
    use mslc_core::program::Init;

    /// x → embedding-like op (no layer) → layer 0 → layer 1 → head, with a weight per layer
    /// and a table computed from nothing that both layers read.
    fn chain() -> Graph {
        let mut g = Graph::new("chain");
        let ty = TensorType::new(DType::F32, vec![2, 4]);
        let x = g.add_input("x", ty.clone());
        let t = g.add_param("table", ty.clone(), Init::Zeros, false);
        let table = g.add_op(Op::Neg, Attrs::new(), &[t], "table").unwrap()[0];
        let mut h = g.add_op(Op::Neg, Attrs::new(), &[x], "embed").unwrap()[0];
        for layer in 0..2 {
            let w = g.add_param(&format!("layers.{layer}.w"), ty.clone(), Init::Ones, true);
            let origin = format!("layers.{layer}");
            let a = g.add_op(Op::Mul, Attrs::new(), &[h, w], &origin).unwrap()[0];
            h = g
                .add_op(Op::Add, Attrs::new(), &[a, table], &origin)
                .unwrap()[0];
        }
        let out = g.add_op(Op::Neg, Attrs::new(), &[h], "head").unwrap()[0];
        g.set_output("y", out);
        g
    }

    fn layer_of(origin: &str) -> Option<usize> {
        origin.strip_prefix("layers.")?.parse().ok()
    }

    fn names(g: &Graph) -> Vec<String> {
        let mut out: Vec<String> = g
            .node_ids()
            .into_iter()
            .map(|id| match &g.node(id).kind {
                NodeKind::Input { name } => format!("input {name}"),
                NodeKind::Param { path, .. } => format!("param {path}"),
                NodeKind::Op { op, .. } => format!("{} {}", op.name(), g.node(id).origin),
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn each_stage_runs_its_layers_and_receives_what_it_reads() {
        let mut first = chain();
        let cut = pipeline_stage(&mut first, 0, 2, &layer_of).unwrap();
        assert!(cut.receives.is_empty() && cut.outputs.is_empty());
        assert_eq!(cut.sends.len(), 1);
        assert_eq!(cut.sends[0].peer, 1);
        assert_eq!(
            names(&first),
            [
                "add layers.0",
                "input x",
                "mul layers.0",
                "neg embed",
                "neg table",
                "param layers.0.w",
                "param table"
            ]
        );
        let mut second = chain();
        let cut1 = pipeline_stage(&mut second, 1, 2, &layer_of).unwrap();
        assert_eq!(
            cut1.receives,
            cut.sends
                .iter()
                .map(|c| Crossing {
                    name: c.name.clone(),
                    peer: 0
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(cut1.outputs, ["y"]);
        // The table is copied, not sent; x and layer 0's weight are not read here.
        let n = names(&second);
        assert!(n.contains(&"neg table".to_string()));
        assert!(!n.iter().any(|s| s == "input x" || s == "param layers.0.w"));
        assert_eq!(second.outputs.len(), 1);
    }

    /// A weight both layers read is each stage's copy, and each says it shares it.
    #[test]
    fn a_weight_two_stages_read_is_shared() {
        let mut g = chain();
        let shared = g.node_ids().into_iter().find(
            |&id| matches!(&g.node(id).kind, NodeKind::Param { path, .. } if path == "layers.0.w"),
        );
        let w0 = ValueRef {
            node: shared.unwrap(),
            index: 0,
        };
        // Layer 1 reads layer 0's weight too.
        let h = g.outputs[0].1;
        let tied = g
            .add_op(Op::Mul, Attrs::new(), &[h, w0], "layers.1")
            .unwrap()[0];
        g.outputs[0].1 = tied;
        let mut second = g.clone();
        let both = [SharedParam {
            path: "layers.0.w".to_string(),
            stages: vec![0, 1],
        }];
        assert_eq!(
            pipeline_stage(&mut g, 0, 2, &layer_of).unwrap().shared,
            both
        );
        let cut = pipeline_stage(&mut second, 1, 2, &layer_of).unwrap();
        assert_eq!(cut.shared, both);
        assert!(pipeline_stage(&mut chain(), 0, 2, &layer_of)
            .unwrap()
            .shared
            .is_empty());
    }

    #[test]
    fn a_layer_before_what_it_reads_or_past_the_last_stage_is_refused() {
        let backwards = |origin: &str| layer_of(origin).map(|l| 1 - l);
        let e = pipeline_stage(&mut chain(), 0, 2, &backwards).unwrap_err();
        assert!(e.0.contains("must not come before"), "{e}");
        let e = pipeline_stage(&mut chain(), 0, 1, &layer_of).unwrap_err();
        assert!(e.0.contains("of a pipeline of 1 stages"), "{e}");
        assert!(pipeline_stage(&mut chain(), 2, 2, &layer_of).is_err());
    }

    #[test]
    fn the_plan_s_ranges_give_each_layer_its_stage() {
        let map = stage_of_layers(&[vec![[0, 3]], vec![[3, 4]]]);
        assert_eq!(
            map.into_iter().collect::<Vec<_>>(),
            [(0, 0), (1, 0), (2, 0), (3, 1)]
        );
    }
}
