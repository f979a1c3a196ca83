//! Whole-graph cast cleanup, exact by construction. MindSpore only removes adjacent cast
//! pairs; here, in one topological sweep:
//!
//! - a cast to the value's own dtype is dropped;
//! - `cast(cast(y, A), B)` becomes `cast(y, B)` (or `y` when `B` is `y`'s dtype) whenever
//!   the first cast is exact (`A` holds every value of `y`'s dtype): the second cast then
//!   sees `y`'s very value. This covers a wider intermediate (`f16 → f32 → bf16`), round trips
//!   (`f16 → f32 → f16`) and `cast(cast(cast(x, bf16), f32), bf16)` → `cast(x, bf16)`;
//! - the same holds across single-use layout ops (reshape, transpose, slice, select,
//!   broadcast_to), which commute with casts: `cast(reshape(cast(y, f32)), f16)` with `y` in
//!   f16 becomes `reshape(y)`, removing the round trip O1 leaves between two matmuls;
//! - otherwise a cast moves above the single-use reshapes, transposes and broadcasts it
//!   follows (converting no more elements, fewer for a broadcast), so `cast(transpose(w))`
//!   becomes `transpose(cast(w))` and the transpose can fold into a matmul;
//! - identical casts of one value are merged.
//!
//! A cast that rounds is never removed or moved past another rounding.

use std::collections::HashMap;

use super::rewrite::{add_helper, add_like, out0, producer, replace_with, single_use};
use super::{Pass, PassContext, PassError, PassStats};
use crate::{Graph, NodeId, ValueRef};
use mslc_core::ops::{Attrs, DType, Op, OpError};

/// The `cast_cleanup` pass.
pub struct CastCleanup;

const NAME: &str = "cast_cleanup";

/// Whether every value of dtype `from` is exactly a value of dtype `to`.
fn exact(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || matches!(
            (from, to),
            (Bool, _) | (F16 | BF16, F32 | F64) | (F32, F64) | (I32, I64 | F64)
        )
}

/// Ops that move elements without looking at them, so they commute with casts (what may
/// lie inside a collapsible chain).
fn is_layout(op: Op) -> bool {
    is_hoistable(op) || matches!(op, Op::Slice | Op::Select)
}

/// Layout ops a cast may move above without converting more elements than before.
fn is_hoistable(op: Op) -> bool {
    matches!(op, Op::Reshape | Op::Transpose | Op::BroadcastTo)
}

/// What lies above a cast: single-use layout ops (topmost first), then `base`.
struct Chain {
    layout: Vec<NodeId>,
    base: ValueRef,
    /// `base` is the operand of an exact cast, which the chain skips.
    exact: bool,
}

/// Walks up from the cast's operand `v` through single-use layout ops. Ending at an exact
/// cast, the whole chain collapses; otherwise the cast can still move above the hoistable
/// layout ops next to it.
fn chain(g: &Graph, mut v: ValueRef) -> Option<Chain> {
    let mut layout = Vec::new();
    loop {
        match producer(g, v) {
            Some((Op::Cast, _)) => {
                let input = *g.inputs(v.node).first()?;
                if exact(g.ty(input).dtype, g.ty(v).dtype) {
                    layout.reverse();
                    return Some(Chain {
                        layout,
                        base: input,
                        exact: true,
                    });
                }
                break;
            }
            Some((op, _)) if is_layout(op) && single_use(g, v) => {
                layout.push(v.node);
                v = *g.inputs(v.node).first()?;
            }
            _ => break,
        }
    }
    let hoistable = layout
        .iter()
        .take_while(|n| g.node(**n).op().is_some_and(is_hoistable))
        .count();
    layout.truncate(hoistable);
    let top = *layout.last()?;
    let base = *g.inputs(top).first()?;
    layout.reverse();
    Some(Chain {
        layout,
        base,
        exact: false,
    })
}

struct Cleaner<'a> {
    g: &'a mut Graph,
    /// The first cast of each (value, dtype) seen.
    casts: HashMap<(ValueRef, DType), ValueRef>,
    stats: PassStats,
}

impl Cleaner<'_> {
    /// `v` cast to `to`, reusing a cast already made.
    fn cast(&mut self, v: ValueRef, to: DType, at: NodeId) -> Result<ValueRef, OpError> {
        if self.g.ty(v).dtype == to {
            return Ok(v);
        }
        if let Some(c) = self.casts.get(&(v, to)) {
            return Ok(*c);
        }
        let c = add_helper(self.g, at, Op::Cast, Attrs::new().with("dtype", to), &[v])?;
        self.casts.insert((v, to), c);
        Ok(c)
    }

    fn visit(&mut self, id: NodeId) -> Result<(), OpError> {
        let g = &*self.g;
        if g.node(id).op() != Some(Op::Cast) {
            return Ok(());
        }
        let (Some(&x), Some(out)) = (g.inputs(id).first(), g.node(id).outputs.first()) else {
            return Ok(());
        };
        let to = out.dtype;
        if g.ty(x).dtype == to {
            replace_with(self.g, id, x);
            self.stats.record(NAME, "identity");
            return Ok(());
        }
        if let Some(Chain {
            layout,
            base,
            exact,
        }) = chain(g, x)
        {
            let label = match (exact, layout.is_empty()) {
                (true, true) => "chain",
                (true, false) => "chain_through_layout",
                (false, _) => "hoist",
            };
            let mut v = self.cast(base, to, id)?;
            for &m in &layout {
                let node = self.g.node(m);
                let (op, attrs) = (node.op(), node.attrs().cloned());
                if let (Some(op), Some(attrs)) = (op, attrs) {
                    v = add_like(self.g, m, op, attrs, &[v])?;
                }
            }
            replace_with(self.g, id, v);
            for m in layout.into_iter().rev() {
                self.g.remove_node(m);
            }
            self.stats.record(NAME, label);
            return Ok(());
        }
        match self.casts.get(&(x, to)) {
            Some(&first) => {
                replace_with(self.g, id, first);
                self.stats.record(NAME, "merged");
            }
            None => {
                self.casts.insert((x, to), out0(id));
            }
        }
        Ok(())
    }
}

impl Pass for CastCleanup {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "remove no-op casts, collapse exact cast chains (also across layout ops), merge \
         duplicate casts"
    }

    fn run(&self, g: &mut Graph, _cx: &PassContext) -> Result<PassStats, PassError> {
        let order = g
            .topo_order()
            .ok_or_else(|| PassError::new(NAME, "the graph has a cycle"))?;
        let mut cleaner = Cleaner {
            g,
            casts: HashMap::new(),
            stats: PassStats::default(),
        };
        for id in order {
            if cleaner.g.contains(id) {
                cleaner.visit(id).map_err(|e| PassError::from_op(NAME, e))?;
            }
        }
        Ok(cleaner.stats)
    }
}
