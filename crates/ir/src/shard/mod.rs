//! Per-rank programs: the passes that turn one device's graph into the graph each rank of a
//! device mesh runs, with the collectives between them as explicit ops carrying their mesh
//! axis ([`data`]: data parallelism; [`tensor`]: Megatron's tensor parallelism; [`sequence`]:
//! its sequence parallelism; [`zero`]: optimizer sharding; [`pipeline`]: a stage's part of the
//! graph, and what crosses its cuts).

pub mod data;
pub mod pipeline;
pub mod sequence;
pub mod tensor;
pub mod zero;

use std::fmt;

use mslc_core::ops::family::collective::payload_bytes;
use mslc_core::ops::{Attrs, DType, Op, TensorType};

use crate::graph::{Graph, NodeId, NodeKind};

/// The group of ranks a collective runs over: one axis of the device mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The mesh axis (`dp`).
    pub axis: String,
    /// Its size.
    pub ranks: usize,
}

impl Group {
    /// The group of `ranks` ranks along mesh axis `axis`.
    pub fn new(axis: &str, ranks: usize) -> Group {
        Group {
            axis: axis.to_string(),
            ranks,
        }
    }

    /// The attributes every collective over this group carries.
    pub fn attrs(&self) -> Attrs {
        Attrs::new()
            .with("axis", self.axis.as_str())
            .with("ranks", self.ranks as i64)
    }

    /// The attributes of a collective along `dim` over this group (`all_gather`,
    /// `reduce_scatter`, `rank_slice`).
    pub fn along(&self, dim: usize) -> Attrs {
        self.attrs().with("dim", dim as i64)
    }

    /// `attrs` of a `dropout` made to run on this rank's block, along `dim`, of a tensor split
    /// over the group: marked with [`Group::along`], so its mask is the whole tensor's.
    pub fn split_dropout(&self, mut attrs: Attrs, dim: usize) -> Attrs {
        for (name, value) in self.along(dim).iter() {
            attrs.insert(name, value.clone());
        }
        attrs
    }
}

/// Why a graph cannot be made into a per-rank program.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardError(pub String);

impl fmt::Display for ShardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShardError {}

/// Bytes one rank hands each collective of `graph`, in print order of the nodes: (op, axis,
/// bytes) — what `mslc inspect` and the IR dump show.
pub fn collectives(graph: &Graph) -> Vec<(Op, String, u64)> {
    let mut out = Vec::new();
    for id in graph.topo_order().unwrap_or_default() {
        let node = graph.node(id);
        let (Some(op), Some(attrs)) = (node.op(), node.attrs()) else {
            continue;
        };
        if !is_collective(op) {
            continue;
        }
        let input: TensorType = graph
            .inputs(id)
            .first()
            .map_or_else(|| TensorType::scalar(DType::F32), |v| graph.ty(*v).clone());
        let axis = attrs.str("axis").unwrap_or_default();
        let bytes = payload_bytes(op, &input);
        out.push((op, axis, bytes));
    }
    out
}

/// Whether `op` talks to other ranks (or, for `parallel_copy` and `rank_slice`, its gradient
/// does; `rank_slice` also depends on which rank runs it, so it is never hoisted).
pub fn is_collective(op: Op) -> bool {
    matches!(
        op,
        Op::AllReduce | Op::ParallelCopy | Op::AllGather | Op::ReduceScatter | Op::RankSlice
    )
}

/// Makes node `id` the op `op` with `attrs`, its result types inferred from its operands now.
pub(crate) fn retype(
    graph: &mut Graph,
    id: NodeId,
    op: Op,
    attrs: Attrs,
) -> Result<(), ShardError> {
    let origin = graph.node(id).origin.clone();
    let attrs = mslc_core::ops::resolve_attrs(op, &attrs).map_err(|e| ShardError(e.message))?;
    let types: Vec<_> = graph
        .inputs(id)
        .iter()
        .map(|v| graph.ty(*v).clone())
        .collect();
    let outputs = mslc_core::ops::infer(op, &attrs, &types)
        .map_err(|e| ShardError(format!("`{op}` in `{origin}`: {}", e.message)))?;
    let node = graph.node_mut(id);
    node.outputs = outputs;
    node.kind = NodeKind::Op { op, attrs };
    Ok(())
}
