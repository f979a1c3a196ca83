//! `rope(x)` → `rope_cached(x, rope_table)`: the cosines and sines of every position, which the
//! plain `rope` kernel computes on every call, become a value that depends on nothing, so the
//! planner hoists it and it is computed once per module. Ropes of one length, head dim and
//! theta (the queries and keys of every layer) share one table.

use std::collections::HashMap;

use super::{topo, NAME};
use crate::passes::rewrite::{add_like, replace_with};
use crate::passes::{PassContext, PassStats};
use crate::{Graph, ValueRef};
use mslc_core::ops::{resolve_attrs, AttrValue, Attrs, Op, OpError};

/// Rewrites every `rope` onto a shared `rope_table`.
pub(super) fn run(g: &mut Graph, _: &PassContext, stats: &mut PassStats) -> Result<(), OpError> {
    let mut tables: HashMap<(u64, i64, i64), ValueRef> = HashMap::new();
    for node in topo(g)? {
        if g.node(node).op() != Some(Op::Rope) {
            continue;
        }
        let x = *g
            .inputs(node)
            .first()
            .ok_or_else(|| OpError::new("rope has no input"))?;
        let attrs = g.node(node).attrs().cloned().unwrap_or_default();
        let theta = resolve_attrs(Op::Rope, &attrs)?.float("theta")?;
        let shape = g.ty(x).shape.clone();
        let [_, positions, _, dim] = shape[..] else {
            return Err(OpError::new("rope's input is not [B, S, heads, D]"));
        };
        let key = (theta.to_bits(), positions, dim);
        let table = match tables.get(&key) {
            Some(&table) => table,
            None => {
                let mut attrs = Attrs::new();
                attrs.insert("theta", AttrValue::Float(theta));
                attrs.insert("positions", AttrValue::Int(positions));
                attrs.insert("dim", AttrValue::Int(dim));
                // Shared by every layer, so it belongs to none.
                let table = *g
                    .add_op(Op::RopeTable, attrs, &[], "")?
                    .first()
                    .ok_or_else(|| OpError::new("rope_table made no result"))?;
                tables.insert(key, table);
                table
            }
        };
        let cached = add_like(g, node, Op::RopeCached, Attrs::new(), &[x, table])?;
        replace_with(g, node, cached);
        stats.record(NAME, "rope_table");
    }
    Ok(())
}
