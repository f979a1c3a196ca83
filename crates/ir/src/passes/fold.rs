//! Constant folding: an elementwise op or `cast` whose operands are all scalar `constant`s
//! becomes one `constant`, and a `cast` of a `causal_mask` to another float dtype becomes a
//! mask of that dtype (its values, 0 and -inf, are exact in every float dtype).
//!
//! Floats are evaluated in f64 from operands first rounded to the result dtype (as promotion
//! converts them), then rounded once to the result dtype: exact for `+ - * /` and `sqrt`
//! (f64 carries more than twice the bits of f32), within an ulp for the transcendental ops.
//! Integers are folded with overflow checks. A result that would be NaN, an integer that
//! overflows, `erf` / `gelu` (no exact reference here) and float-to-int casts of non-whole
//! values are left for the kernels.

use half::{bf16, f16};

use super::rewrite::{add_like, producer, replace_with, scalar_constant};
use super::{Pass, PassContext, PassError, PassStats};
use crate::{Graph, NodeId};
use mslc_core::ops::{self, Attrs, DType, Op};

/// The `fold` pass.
pub struct Fold;

/// `v` rounded to the nearest value of the float dtype `d`.
fn round_float(v: f64, d: DType) -> f64 {
    match d {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// Largest integer magnitude every f64 holds exactly.
const EXACT_INT: f64 = 9_007_199_254_740_992.0;

/// `v` as an integer of dtype `d`, when it is whole and in range (and exact in an f64).
fn as_int(v: f64, d: DType) -> Option<i64> {
    let (lo, hi) = match d {
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        _ => (-EXACT_INT, EXACT_INT),
    };
    (v.fract() == 0.0 && (lo..=hi).contains(&v)).then_some(v as i64)
}

/// An integer elementwise op with overflow checks; `None` for ops not folded or overflow.
fn eval_int(op: Op, a: &[i64]) -> Option<i64> {
    let x = *a.first()?;
    let y = || a.get(1).copied();
    match op {
        Op::Add => x.checked_add(y()?),
        Op::Sub => x.checked_sub(y()?),
        Op::Mul => x.checked_mul(y()?),
        Op::Maximum => Some(x.max(y()?)),
        Op::Minimum => Some(x.min(y()?)),
        Op::Neg => x.checked_neg(),
        Op::Abs => x.checked_abs(),
        _ => None,
    }
}

/// `value` (exact in its dtype `from`) converted to dtype `to`, when the conversion's result
/// does not depend on kernel conventions.
fn convert(value: f64, to: DType) -> Option<f64> {
    match to {
        d if d.is_float() => Some(round_float(value, d)),
        DType::Bool => (!value.is_nan()).then_some(if value != 0.0 { 1.0 } else { 0.0 }),
        d => as_int(value, d).map(|i| i as f64),
    }
}

/// The folded value of op node `id`, when all its operands are scalar constants.
fn fold_scalar(g: &Graph, id: NodeId) -> Option<(f64, DType)> {
    let node = g.node(id);
    let op = node.op()?;
    let out = node.outputs.first()?.dtype;
    let inputs = g.inputs(id);
    if inputs.is_empty() {
        return None;
    }
    let values: Vec<f64> = inputs
        .iter()
        .map(|v| scalar_constant(g, *v))
        .collect::<Option<_>>()?;
    let result = if op == Op::Cast {
        convert(values[0], out)?
    } else if !op.spec().elementwise {
        return None;
    } else if out.is_float() {
        let rounded: Vec<f64> = values.iter().map(|v| round_float(*v, out)).collect();
        round_float(ops::eval_scalar(op, &rounded)?, out)
    } else if out.is_int() {
        let ints: Vec<i64> = values
            .iter()
            .map(|v| as_int(*v, out))
            .collect::<Option<_>>()?;
        let r = eval_int(op, &ints)?;
        as_int(r as f64, out)? as f64
    } else {
        return None;
    };
    (!result.is_nan()).then_some((result, out))
}

/// The `causal_mask` a `cast` node amounts to, when it casts a mask to a float dtype.
fn fold_mask_cast(g: &Graph, id: NodeId) -> Option<Attrs> {
    let node = g.node(id);
    if node.op()? != Op::Cast {
        return None;
    }
    let to = node.outputs.first()?.dtype;
    let input = *g.inputs(id).first()?;
    match producer(g, input)? {
        (Op::CausalMask, attrs) if to.is_float() => Some(
            Attrs::new()
                .with("size", attrs.int("size").ok()?)
                .with("dtype", to),
        ),
        _ => None,
    }
}

impl Pass for Fold {
    fn name(&self) -> &'static str {
        "fold"
    }

    fn description(&self) -> &'static str {
        "fold elementwise ops and casts of scalar constants, and casts of causal masks"
    }

    fn run(&self, g: &mut Graph, _cx: &PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let order = g
            .topo_order()
            .ok_or_else(|| PassError::new(self.name(), "the graph has a cycle"))?;
        for id in order {
            let (op, attrs, label) = if let Some((value, dtype)) = fold_scalar(g, id) {
                let attrs = Attrs::new().with("value", value).with("dtype", dtype);
                (Op::Constant, attrs, "constant")
            } else if let Some(attrs) = fold_mask_cast(g, id) {
                (Op::CausalMask, attrs, "mask_cast")
            } else {
                continue;
            };
            let new =
                add_like(g, id, op, attrs, &[]).map_err(|e| PassError::from_op(self.name(), e))?;
            replace_with(g, id, new);
            stats.record(self.name(), label);
        }
        Ok(stats)
    }
}
