//! Fusion: rewrites op patterns into the registry's fused ops, so kernels read and write
//! memory once where the plain graph would make several passes. Patterns, in the order they
//! are tried (each may expose the next):
//!
//! 1. a transpose of the last two dims feeding a matmul → the matmul's `transpose_a/b` flag;
//! 2. explicit attention, `softmax(q @ k.T * scale [+ causal_mask]) @ v` over `[B, N, S, D]`
//!    → `attention` between transposes to and from its `[B, S, N, D]` layout;
//! 3. matmul + bias add (+ an activation: a unary op marked `epilogue` in the op table)
//!    (× a tensor of the product's type: SwiGLU's gate) → `fused_matmul`;
//! 4. `rms_norm(x) * w` → `rms_norm_scale`, `layer_norm(x) * g + b` → `layer_norm_affine`;
//! 5. chains of elementwise ops of one output shape → `fused_elementwise`;
//!
//! except, in rules 3–5, a pattern whose fused op's signature is in `cx.unfused` (tuning found
//! its ops faster on their own): it is left as it is, and may still match a later rule;
//!
//! 6. `rope(x)` → `rope_cached(x, rope_table)`, the table shared by ropes of one shape and
//!    theta and computed once per module (it depends on nothing, so the planner hoists it).
//!
//! An intermediate is only absorbed when nothing else reads it and it is not a model output,
//! so no work is duplicated; the fused op keeps the origin and annotations of the pattern's
//! root (its last op).

mod attention;
mod elementwise;
mod matmul;
mod norm;
mod rope;
mod transpose;

use super::{Pass, PassContext, PassError, PassStats};
use crate::Graph;
use mslc_core::ops::OpError;

/// The `fuse` pass (does nothing when `cx.fuse` is false).
pub struct Fuse;

/// The pass name, the prefix of every fusion label.
const NAME: &str = "fuse";

/// One fusion rule: one sweep over the graph, recording a label per rewrite.
type Rule = fn(&mut Graph, &PassContext, &mut PassStats) -> Result<(), OpError>;

const RULES: [Rule; 6] = [
    transpose::run,
    attention::run,
    matmul::run,
    norm::run,
    elementwise::run,
    rope::run,
];

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "fuse transposes into matmuls, explicit attention, matmul+bias+activation(*multiplier), \
         norm+affine and elementwise chains; give ropes a table computed once"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<PassStats, PassError> {
        run_rules(&RULES, g, cx)
    }
}

/// Runs `rules` in order (none when `cx.fuse` is false).
fn run_rules(rules: &[Rule], g: &mut Graph, cx: &PassContext) -> Result<PassStats, PassError> {
    let mut stats = PassStats::default();
    if cx.fuse {
        for rule in rules {
            rule(g, cx, &mut stats).map_err(|e| PassError::from_op(NAME, e))?;
        }
    }
    Ok(stats)
}

/// Rule 4 alone (each norm with its scale, and shift, except those `cx.unfused` names; nothing
/// when `cx.fuse` is false). A training step runs it on its forward graph before
/// differentiating it, so autodiff differentiates the fused norm — every gradient of a norm from
/// one pass (`rms_norm_scale_grad`, `layer_norm_affine_grad`) — and the forward keeps no
/// normalised value alive for the backward.
pub struct FuseNorms;

impl Pass for FuseNorms {
    fn name(&self) -> &'static str {
        "fuse_norms"
    }

    fn description(&self) -> &'static str {
        "fuse each norm with its scale and shift (a training step's forward, before autodiff)"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<PassStats, PassError> {
        run_rules(&[norm::run], g, cx)
    }
}

/// The graph's nodes in topological order, or an error naming the problem.
fn topo(g: &Graph) -> Result<Vec<crate::NodeId>, OpError> {
    g.topo_order()
        .ok_or_else(|| OpError::new("the graph has a cycle"))
}

/// Whether the fused op `node` just added must be left unfused: its signature, as the kernel
/// table and the tuner key it, is in `cx.unfused`.
fn left_unfused(g: &Graph, cx: &PassContext, node: crate::NodeId) -> bool {
    !cx.unfused.is_empty() && g.signature(node).is_some_and(|s| cx.unfused.contains(&s))
}
