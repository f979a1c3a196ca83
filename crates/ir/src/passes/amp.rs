//! Automatic mixed precision, following MindSpore's levels (`mindspore/train/amp.py`, see
//! docs/semantics.md): each op gets a compute dtype and casts are inserted in front of its float
//! operands; parameters stay f32 masters and are cast where they are used.
//!
//! - O0: nothing changes.
//! - O1: the white list (ops of class `LowPrecisionFriendly`: matmul, convolutions, relu, ...)
//!   runs in the compute dtype, each result cast straight back to its original dtype.
//! - O2: everything runs in the compute dtype except ops of class `KeepF32`, the `keep_f32`
//!   list, layer norm (MindSpore's black list) and, with `keep_batchnorm_f32`, batch norm;
//!   the model outputs are cast back to their original dtypes.
//! - O3: everything in the compute dtype except the `keep_f32` list and, with
//!   `keep_batchnorm_f32`, batch norm; outputs cast back as in O2.
//!
//! A node's `@f32` / `@f16` / `@bf16` annotation overrides its level's choice (except at O0).
//! `f64` operands are deliberate and never cast; `cast`, `constant` and `causal_mask` keep
//! their declared dtypes (the `fold` pass folds casts of the latter two).

use std::collections::HashMap;

use serde::Serialize;

use super::rewrite::{add_helper, add_like, rebuild};
use super::{Pass, PassContext, PassError, PassStats};
use crate::{Graph, Node, NodeId, ValueRef};
use mslc_core::ops::family::program::ElementwiseProgram;
use mslc_core::ops::{self, Attrs, DType, Op, OpError, PrecisionClass, TensorType};

pub use mslc_core::precision::AmpLevel;

/// A mixed-precision policy, as a `precision` declaration states it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AmpConfig {
    /// The level.
    pub level: AmpLevel,
    /// The low-precision dtype: `f16` or `bf16`.
    pub compute: DType,
    /// Ops to keep in f32 whatever the level (fused forms follow their plain op).
    pub keep_f32: Vec<Op>,
    /// Keep `batch_norm` in f32 at O2 and O3.
    pub keep_batchnorm_f32: bool,
}

impl AmpConfig {
    /// `level` with `compute` and MindSpore's defaults: no extra `keep_f32` ops,
    /// `keep_batchnorm_f32` only at O2.
    pub fn new(level: AmpLevel, compute: DType) -> AmpConfig {
        AmpConfig {
            level,
            compute,
            keep_f32: Vec::new(),
            keep_batchnorm_f32: level == AmpLevel::O2,
        }
    }
}

/// The `amp` pass (does nothing without a policy in the context).
pub struct Amp;

const NAME: &str = "amp";

/// The plain op a fused op stands for, for matching the `keep_f32` list.
fn base_op(op: Op) -> Op {
    match op {
        Op::RmsNormScale => Op::RmsNorm,
        Op::LayerNormAffine => Op::LayerNorm,
        Op::FusedMatmul => Op::Matmul,
        op => op,
    }
}

/// The ops a node computes: its own, or the steps of a fused elementwise program.
fn computed_ops(node: &Node, op: Op) -> Vec<Op> {
    if op != Op::FusedElementwise {
        return vec![base_op(op)];
    }
    node.attrs()
        .and_then(|a| a.str("program").ok())
        .and_then(|p| ElementwiseProgram::parse(&p).ok())
        .map_or_else(|| vec![op], |p| p.steps.iter().map(|s| s.op).collect())
}

/// The dtype node `node` should compute in under `cfg`, or `None` to leave it alone.
fn target(cfg: &AmpConfig, node: &Node) -> Option<DType> {
    let op = node.op()?;
    if matches!(op, Op::Cast | Op::Constant | Op::CausalMask) || cfg.level == AmpLevel::O0 {
        return None;
    }
    if let Some(d) = node.annotations.keep_dtype {
        return Some(d);
    }
    let ops = computed_ops(node, op);
    let listed = ops.iter().any(|o| cfg.keep_f32.contains(o));
    let batch_norm = cfg.keep_batchnorm_f32 && ops.contains(&Op::BatchNorm);
    let class = |c| ops.iter().any(|o| o.spec().precision == c);
    match cfg.level {
        AmpLevel::O0 => None,
        AmpLevel::O1 => {
            (!listed && class(PrecisionClass::LowPrecisionFriendly)).then_some(cfg.compute)
        }
        AmpLevel::O2 => {
            let black = ops.contains(&Op::LayerNorm);
            let sensitive = ops
                .iter()
                .any(|o| *o != Op::BatchNorm && o.spec().precision == PrecisionClass::KeepF32);
            Some(if listed || black || batch_norm || sensitive {
                DType::F32
            } else {
                cfg.compute
            })
        }
        AmpLevel::O3 => Some(if listed || batch_norm {
            DType::F32
        } else {
            cfg.compute
        }),
    }
}

/// Inserts casts in one sweep, sharing one cast per (value, dtype).
struct Caster<'a> {
    g: &'a mut Graph,
    casts: HashMap<(ValueRef, DType), ValueRef>,
    stats: PassStats,
}

impl Caster<'_> {
    /// `v` cast to `to`, made next to node `at`, reusing an earlier identical cast.
    fn cast(
        &mut self,
        v: ValueRef,
        to: DType,
        at: NodeId,
        label: &str,
    ) -> Result<ValueRef, OpError> {
        if let Some(c) = self.casts.get(&(v, to)) {
            return Ok(*c);
        }
        let c = add_helper(self.g, at, Op::Cast, Attrs::new().with("dtype", to), &[v])?;
        self.casts.insert((v, to), c);
        self.stats.record(NAME, label);
        Ok(c)
    }

    /// Runs node `id` in dtype `to`: casts its float operands and, when `cast_back`, its
    /// results back to their former dtypes for every reader.
    fn retarget(&mut self, id: NodeId, to: DType, cast_back: bool) -> Result<(), OpError> {
        let inputs = self.g.inputs(id);
        let mut new_inputs = Vec::with_capacity(inputs.len());
        for v in &inputs {
            let d = self.g.ty(*v).dtype;
            let casts = d.is_float() && d != to && d != DType::F64;
            new_inputs.push(if casts {
                self.cast(*v, to, id, "cast_input")?
            } else {
                *v
            });
        }
        let node = self.g.node(id);
        let (op, attrs) = (node.op(), node.attrs().cloned());
        let (Some(op), Some(attrs)) = (op, attrs) else {
            return Ok(());
        };
        if new_inputs == inputs {
            // No cast needed, but an operand may have changed dtype upstream.
            let types: Vec<TensorType> = inputs.iter().map(|v| self.g.ty(*v).clone()).collect();
            if ops::infer(op, &attrs, &types)? != self.g.node(id).outputs {
                rebuild(self.g, id, op, attrs, &inputs)?;
            }
            return Ok(());
        }
        let before: Vec<DType> = node.outputs.iter().map(|t| t.dtype).collect();
        if !cast_back {
            rebuild(self.g, id, op, attrs, &new_inputs)?;
            return Ok(());
        }
        let new = add_like(self.g, id, op, attrs, &new_inputs)?.node;
        for (index, was) in before.into_iter().enumerate() {
            let (old_v, new_v) = (
                ValueRef {
                    node: id,
                    index: index as u32,
                },
                ValueRef {
                    node: new,
                    index: index as u32,
                },
            );
            let back = if self.g.ty(new_v).dtype == was {
                new_v
            } else {
                self.cast(new_v, was, id, "cast_back")?
            };
            self.g.replace_all_uses(old_v, back);
        }
        self.g.remove_node(id);
        Ok(())
    }
}

impl Pass for Amp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "mixed precision (MindSpore O0-O3): cast operands to each op's compute dtype, keep \
         f32 masters, cast results back"
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<PassStats, PassError> {
        let Some(cfg) = &cx.amp else {
            return Ok(PassStats::default());
        };
        if !matches!(cfg.compute, DType::F16 | DType::BF16) {
            return Err(PassError::new(
                NAME,
                format!("the compute dtype must be f16 or bf16, got {}", cfg.compute),
            ));
        }
        let order = g
            .topo_order()
            .ok_or_else(|| PassError::new(NAME, "the graph has a cycle"))?;
        let outputs: Vec<DType> = g.outputs.iter().map(|(_, v)| g.ty(*v).dtype).collect();
        let mut caster = Caster {
            g,
            casts: HashMap::new(),
            stats: PassStats::default(),
        };
        let per_op = cfg.level == AmpLevel::O1;
        for id in order {
            if let Some(to) = target(cfg, caster.g.node(id)) {
                caster
                    .retarget(id, to, per_op)
                    .map_err(|e| PassError::from_op(NAME, e))?;
            }
        }
        for (i, was) in outputs.into_iter().enumerate() {
            let v = caster.g.outputs[i].1;
            if caster.g.ty(v).dtype != was {
                let at = v.node;
                let back = caster
                    .cast(v, was, at, "cast_output")
                    .map_err(|e| PassError::from_op(NAME, e))?;
                caster.g.outputs[i].1 = back;
            }
        }
        Ok(caster.stats)
    }
}
