//! `matmul`: batched matrix product with broadcast batch dims and optional transposes.

use crate::ops::attrs::{AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::grad::unbroadcast;
use crate::ops::shape::{broadcast, fmt_dims, numel};
use crate::ops::spec::{
    Arity, Cost, CostRule, Emitter, GradCall, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{Op, TensorType};

/// The `transpose_a` / `transpose_b` schema, shared with `fused_matmul`.
pub const TRANSPOSE_ATTRS: [AttrSpec; 2] = [
    AttrSpec::defaulted("transpose_a", ConstAttr::Bool(false)),
    AttrSpec::defaulted("transpose_b", ConstAttr::Bool(false)),
];

/// `matmul`: on MindSpore's O1 white list.
pub const MATMUL: OpSpec = OpSpec {
    inputs: &["a", "b"],
    arity: Arity::Exact(2),
    attrs: &TRANSPOSE_ATTRS,
    infer: infer_matmul,
    cost: CostRule::Custom(cost_matmul),
    precision: PrecisionClass::LowPrecisionFriendly,
    elementwise: false,
    in_place: false,
    grad: Some(grad_matmul),
    shard: None,
};

/// The geometry of one matmul, as kernels and cost rules need it: `batch` is the broadcast
/// batch shape, and each batch element computes an `[m, k] x [k, n]` product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulDims {
    pub batch: Vec<i64>,
    pub m: i64,
    pub k: i64,
    pub n: i64,
    pub transpose_a: bool,
    pub transpose_b: bool,
}

impl MatmulDims {
    /// Reads the geometry of `a @ b` (attributes `transpose_a`, `transpose_b`, default false);
    /// errors name `a` as input 0 and `b` as input 1.
    pub fn of(a: &TensorType, b: &TensorType, attrs: &Attrs) -> Result<MatmulDims, OpError> {
        let ta = attrs.opt_bool("transpose_a")?.unwrap_or(false);
        let tb = attrs.opt_bool("transpose_b")?.unwrap_or(false);
        let split = |t: &TensorType, i: usize, name: &str, layout: &str| match t.shape[..] {
            [ref batch @ .., r, c] => Ok((batch.to_vec(), r, c)),
            _ => Err(OpError::at(
                i,
                format!(
                    "expects {name} of rank at least 2 ({layout}), but {name} is {}{}",
                    t.dtype,
                    fmt_dims(&t.shape)
                ),
            )),
        };
        let (batch_a, ra, ca) = split(a, 0, "a", if ta { "[..., k, m]" } else { "[..., m, k]" })?;
        let (batch_b, rb, cb) = split(b, 1, "b", if tb { "[..., n, k]" } else { "[..., k, n]" })?;
        let (m, ka) = if ta { (ca, ra) } else { (ra, ca) };
        let (kb, n) = if tb { (cb, rb) } else { (rb, cb) };
        if ka != kb {
            let note = |t: bool, flag: &str| {
                if t {
                    format!(" with {flag}")
                } else {
                    String::new()
                }
            };
            return Err(OpError::at(
                1,
                format!(
                    "inner dims differ: a is {}{} (k = {ka}), b is {}{} (k = {kb})",
                    fmt_dims(&a.shape),
                    note(ta, "transpose_a"),
                    fmt_dims(&b.shape),
                    note(tb, "transpose_b"),
                ),
            ));
        }
        let batch = broadcast(&batch_a, &batch_b).ok_or_else(|| {
            OpError::at(
                1,
                format!(
                    "batch dims do not broadcast: a has {}, b has {}",
                    fmt_dims(&batch_a),
                    fmt_dims(&batch_b)
                ),
            )
        })?;
        Ok(MatmulDims {
            batch,
            m,
            k: ka,
            n,
            transpose_a: ta,
            transpose_b: tb,
        })
    }

    /// The output shape `[batch..., m, n]`.
    pub fn output_shape(&self) -> Vec<i64> {
        let mut s = self.batch.clone();
        s.extend([self.m, self.n]);
        s
    }

    /// `2·m·n·k` per batch element (saturating).
    pub fn flops(&self) -> u64 {
        numel(&self.batch)
            .saturating_mul(2)
            .saturating_mul(numel(&[self.m, self.n, self.k]))
    }
}

/// `matmul(a, b, transpose_a, transpose_b)` emitted by a gradient rule.
fn emit_matmul(
    em: &mut dyn Emitter,
    a: Handle,
    b: Handle,
    ta: bool,
    tb: bool,
) -> Result<Handle, OpError> {
    let attrs = Attrs::new().with("transpose_a", ta).with("transpose_b", tb);
    em.op1(Op::Matmul, attrs, &[a, b])
}

/// `matmul`: with `A = op(a)`, `B = op(b)` (`op` transposing where the flag says) and
/// `C = A B`: `dA = dC Bᵀ`, `dB = Aᵀ dC`, each one matmul with transpose flags (no explicit
/// transposes), then summed over the batch dims the operand was broadcast along. A rank-2
/// operand paired with a batched untransposed one folds the batch into the rows first, so its
/// gradient is one `[k, m·batch] x [m·batch, n]` product instead of a batched one and a sum.
pub fn grad_matmul(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let (a, b, dc) = (call.x(0), call.x(1), call.dy()?);
    let (ta_ty, tb_ty) = (em.ty(a)?, em.ty(b)?);
    let ta = call.attrs.opt_bool("transpose_a")?.unwrap_or(false);
    let tb = call.attrs.opt_bool("transpose_b")?.unwrap_or(false);
    let dc_ty = em.ty(dc)?;
    let flat = |t: &TensorType| {
        let cols = t.shape[t.rank() - 1];
        vec![t.numel() as i64 / cols.max(1), cols]
    };
    // dA: ta = false: dC op(b)ᵀ; ta = true: op(b) dCᵀ.
    let da = if !ta {
        emit_matmul(em, dc, b, false, !tb)?
    } else {
        emit_matmul(em, b, dc, tb, true)?
    };
    // dB: tb = false: op(a)ᵀ dC; tb = true: dCᵀ op(a).
    let db = if tb_ty.rank() == 2 && ta_ty.rank() > 2 && !ta {
        let a2 = em.reshape(a, &flat(&ta_ty))?;
        let dc2 = em.reshape(dc, &flat(&dc_ty))?;
        if !tb {
            emit_matmul(em, a2, dc2, true, false)?
        } else {
            emit_matmul(em, dc2, a2, true, false)?
        }
    } else if !tb {
        emit_matmul(em, a, dc, !ta, false)?
    } else {
        emit_matmul(em, dc, a, true, ta)?
    };
    Ok(vec![
        unbroadcast(em, da, &ta_ty)?,
        unbroadcast(em, db, &tb_ty)?,
    ])
}

fn infer_matmul(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let dims = MatmulDims::of(ctx.input(0), ctx.input(1), ctx.attrs)?;
    let dtype = ctx.same_dtype(0, 1)?;
    ctx.numeric_input(0)?;
    Ok(vec![TensorType::new(dtype, dims.output_shape())])
}

fn cost_matmul(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = MatmulDims::of(ctx.input(0), ctx.input(1), ctx.attrs).map_or(0, |d| d.flops());
    Cost::streaming(flops, ctx.inputs, outputs)
}

#[cfg(test)]
mod tests {
    use crate::ops::family::testing::*;
    use crate::ops::{cost, Attrs, DType, Op};

    #[test]
    fn shapes() {
        let out = ok(
            Op::Matmul,
            Attrs::new(),
            &[f32t(&[2, 1, 4, 8]), f32t(&[3, 8, 5])],
        );
        assert_eq!(out, f32t(&[2, 3, 4, 5]));
        let tb = Attrs::new().with("transpose_b", true);
        assert_eq!(
            ok(Op::Matmul, tb, &[f32t(&[4, 8]), f32t(&[5, 8])]),
            f32t(&[4, 5])
        );
        let ta = Attrs::new().with("transpose_a", true);
        assert_eq!(
            ok(Op::Matmul, ta, &[f32t(&[8, 4]), f32t(&[8, 5])]),
            f32t(&[4, 5])
        );
    }

    #[test]
    fn errors() {
        let e = err(Op::Matmul, Attrs::new(), &[f32t(&[4, 8]), f32t(&[16, 4])]);
        assert_eq!(
            e.message,
            "matmul: inner dims differ: a is [4, 8] (k = 8), b is [16, 4] (k = 16)"
        );
        assert_eq!(e.input, Some(1));
        let tb = Attrs::new().with("transpose_b", true);
        let e = err(Op::Matmul, tb, &[f32t(&[4, 8]), f32t(&[4, 16])]);
        assert_eq!(
            e.message,
            "matmul: inner dims differ: a is [4, 8] (k = 8), b is [4, 16] with transpose_b (k = 16)"
        );
        let e = err(Op::Matmul, Attrs::new(), &[f32t(&[8]), f32t(&[8, 4])]);
        assert_eq!(
            e.message,
            "matmul: expects a of rank at least 2 ([..., m, k]), but a is f32[8]"
        );
        assert_eq!(e.input, Some(0));
        let e = err(
            Op::Matmul,
            Attrs::new(),
            &[f32t(&[2, 4, 8]), f32t(&[3, 8, 4])],
        );
        assert_eq!(
            e.message,
            "matmul: batch dims do not broadcast: a has [2], b has [3]"
        );
        let e = err(
            Op::Matmul,
            Attrs::new(),
            &[f32t(&[4, 8]), t(DType::F16, &[8, 4])],
        );
        assert_eq!(e.message, "matmul: dtypes differ: a has f32, b has f16");
        assert_eq!(e.input, Some(1));
        let e = err(
            Op::Matmul,
            Attrs::new().with("transpose_a", 1i64),
            &[f32t(&[4, 8]), f32t(&[8, 4])],
        );
        assert_eq!(
            e.message,
            "matmul: attribute `transpose_a` must be a bool, got 1"
        );
    }

    #[test]
    fn flops_are_2mnk_per_batch() {
        let c = cost(
            Op::Matmul,
            &Attrs::new(),
            &[f32t(&[3, 4, 8]), f32t(&[8, 5])],
        )
        .unwrap();
        assert_eq!(c.flops, 2 * 3 * 4 * 5 * 8);
        assert_eq!(c.bytes_read, (3 * 4 * 8 + 8 * 5) * 4);
        assert_eq!(c.bytes_written, 3 * 4 * 5 * 4);
    }
}
