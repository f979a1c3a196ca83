//! Transformer building blocks: `embedding`, `rope` (and the `rope_table` / `rope_cached` pair
//! the fusion pass splits it into), `attention`, `causal_mask`.

use crate::ops::attrs::{AttrKind, AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::shape::{fmt_dims, numel};
use crate::ops::spec::{
    Arity, Cost, CostRule, Emitter, GradCall, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{DType, Op, TensorType};

/// `embedding`: rows of `table [V, H]` gathered by integer `ids [...]` into `[..., H]`.
pub const EMBEDDING: OpSpec = OpSpec {
    inputs: &["ids", "table"],
    arity: Arity::Exact(2),
    attrs: &[],
    infer: infer_embedding,
    cost: CostRule::Custom(cost_embedding),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: Some(grad_embedding),
    shard: None,
};

/// `rope`: rotary position embedding (rotate-half form) of `x [B, S, heads, D]`, positions
/// `0..S`, frequencies `theta^(-2i/D)`.
pub const ROPE: OpSpec = OpSpec {
    inputs: &["x"],
    arity: Arity::Exact(1),
    attrs: &[AttrSpec::defaulted("theta", ConstAttr::Float(10000.0))],
    infer: infer_rope,
    cost: CostRule::PerOutput(4),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: Some(grad_rope),
    shard: None,
};

/// `rope_table`: the cosines (row 0) and sines (row 1) of every position `0..positions` and
/// frequency `theta^(-2i/dim)`, `i < dim/2`, as `f32 [2, positions, dim/2]` — made by the
/// fusion pass from a `rope`, so the table depends on nothing and is computed once per module.
pub const ROPE_TABLE: OpSpec = OpSpec {
    inputs: &[],
    arity: Arity::Exact(0),
    attrs: &[
        AttrSpec::required("theta", AttrKind::Float),
        AttrSpec::required("positions", AttrKind::Int),
        AttrSpec::required("dim", AttrKind::Int),
    ],
    infer: infer_rope_table,
    cost: CostRule::PerOutput(20),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `rope_cached`: `rope` of `x [B, S, heads, D]` with the angles read from a `rope_table` of
/// `S` positions and `D` dims instead of computed.
pub const ROPE_CACHED: OpSpec = OpSpec {
    inputs: &["x", "table"],
    arity: Arity::Exact(2),
    attrs: &[],
    infer: infer_rope_cached,
    cost: CostRule::PerOutput(4),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: Some(grad_rope_cached),
    shard: None,
};

/// `attention`: scaled dot-product attention with grouped-query heads.
pub const ATTENTION: OpSpec = OpSpec {
    inputs: &["q", "k", "v"],
    arity: Arity::Exact(3),
    attrs: &ATTENTION_ATTRS,
    infer: infer_attention,
    cost: CostRule::Custom(cost_attention),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: Some(grad_attention),
    shard: None,
};

/// The attributes `attention` and its backward ops share.
const ATTENTION_ATTRS: [AttrSpec; 2] = [
    AttrSpec::defaulted("causal", ConstAttr::Bool(false)),
    AttrSpec::optional("scale", AttrKind::Float),
];

/// `embedding_grad`: the gradient of an `embedding` table `[vocab, H]` from the ids and the
/// output cotangent `dy [..ids, H]`: row `v` sums `dy` over every position whose id is `v`
/// (repeated ids accumulate); the ids get no gradient.
pub const EMBEDDING_GRAD: OpSpec = OpSpec {
    inputs: &["ids", "dy"],
    arity: Arity::Exact(2),
    attrs: &[AttrSpec::required("vocab", AttrKind::Int)],
    infer: infer_embedding_grad,
    cost: CostRule::PerInput(0),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `attention_lse`: `attention`'s output and, as a second output from the same pass, the natural
/// log of each query row's softmax denominator (scaled scores, max-shifted), as f32
/// `[B, S, Hq]` — what `attention_grad` needs to rebuild the attention weights tile by tile
/// instead of storing the S×T matrix. A row that sees no key gets -inf. In a training step it
/// replaces the forward's `attention` (CSE), so the forward runs once.
pub const ATTENTION_LSE: OpSpec = OpSpec {
    inputs: &["q", "k", "v"],
    arity: Arity::Exact(3),
    attrs: &ATTENTION_ATTRS,
    infer: infer_attention_lse,
    cost: CostRule::Custom(cost_attention),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `attention_grad`: the gradients of `attention(q, k, v)` with respect to q, k and v (three
/// outputs), from the forward output `out`, its cotangent `dout` and the `attention_lse` rows;
/// the weights are rebuilt tile by tile from q, k and lse, once for all three. For k and v, the
/// query heads sharing a kv head (GQA) add up.
pub const ATTENTION_GRAD: OpSpec = OpSpec {
    inputs: &["q", "k", "v", "out", "dout", "lse"],
    arity: Arity::Exact(6),
    attrs: &ATTENTION_ATTRS,
    infer: infer_attention_grad,
    cost: CostRule::Custom(cost_attention_grad),
    precision: PrecisionClass::KeepF32,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// `causal_mask`: `[size, size]`, 0 on and below the diagonal, -inf above.
pub const CAUSAL_MASK: OpSpec = OpSpec {
    inputs: &[],
    arity: Arity::Exact(0),
    attrs: &[
        AttrSpec::required("size", AttrKind::Int),
        AttrSpec::required("dtype", AttrKind::DType),
    ],
    infer: infer_causal_mask,
    cost: CostRule::PerOutput(0),
    precision: PrecisionClass::FollowInput,
    elementwise: false,
    in_place: false,
    grad: None,
    shard: None,
};

/// The geometry of one `attention`, as kernels and the cost rule need it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDims {
    /// Batch.
    pub b: i64,
    /// Query length.
    pub s: i64,
    /// Key / value length.
    pub t: i64,
    /// Query heads.
    pub hq: i64,
    /// Key / value heads; query head `h` reads kv head `h / (hq / hkv)`.
    pub hkv: i64,
    /// Head dim.
    pub d: i64,
    /// Query `i` sees keys `0..=i + (t - s)` (the last query aligns with the last key).
    pub causal: bool,
    /// Multiplies the scores; `1/√d` unless the `scale` attribute says otherwise.
    pub scale: f64,
}

impl AttentionDims {
    /// Reads and checks `q [B, S, Hq, D]`, `k [B, T, Hkv, D]`, `v [B, T, Hkv, D]`.
    pub fn of(
        q: &TensorType,
        k: &TensorType,
        v: &TensorType,
        attrs: &Attrs,
    ) -> Result<AttentionDims, OpError> {
        let rank4 = |t: &TensorType, i: usize, name: &str, layout: &str| match t.shape[..] {
            [a, b, c, d] => Ok([a, b, c, d]),
            _ => Err(OpError::at(
                i,
                format!(
                    "expects {name} of rank 4 ({layout}), but {name} is {}{}",
                    t.dtype,
                    fmt_dims(&t.shape)
                ),
            )),
        };
        let [b, s, hq, d] = rank4(q, 0, "q", "[B, S, Hq, D]")?;
        let [kb, t, hkv, kd] = rank4(k, 1, "k", "[B, T, Hkv, D]")?;
        rank4(v, 2, "v", "[B, T, Hkv, D]")?;
        if kb != b || kd != d {
            return Err(OpError::at(
                1,
                format!(
                    "k {} does not match q {}: batch and head dim must agree",
                    fmt_dims(&k.shape),
                    fmt_dims(&q.shape)
                ),
            ));
        }
        if v.shape != k.shape {
            return Err(OpError::at(
                2,
                format!(
                    "v {} must have the shape of k {}",
                    fmt_dims(&v.shape),
                    fmt_dims(&k.shape)
                ),
            ));
        }
        if hkv == 0 || hq % hkv != 0 {
            return Err(OpError::at(
                1,
                format!("k has {hkv} heads, which must divide the {hq} heads of q"),
            )
            .with_help("grouped-query attention shares each kv head among Hq / Hkv query heads"));
        }
        let scale = match attrs.opt_float("scale")? {
            Some(x) if !x.is_finite() => {
                return Err(OpError::new(format!("`scale` must be finite, got {x:?}")))
            }
            Some(x) => x,
            None => 1.0 / (d.max(1) as f64).sqrt(),
        };
        Ok(AttentionDims {
            b,
            s,
            t,
            hq,
            hkv,
            d,
            causal: attrs.opt_bool("causal")?.unwrap_or(false),
            scale,
        })
    }

    /// `4·B·Hq·S·T·D`: two matmuls over the full score matrix (saturating).
    pub fn flops(&self) -> u64 {
        numel(&[self.b, self.hq, self.s, self.t, self.d]).saturating_mul(4)
    }
}

/// What a gradient rule returns: one cotangent per input.
type Grads = Result<Vec<Option<Handle>>, OpError>;

/// `embedding`: the table's gradient is a scatter-add of `dy` by id; the ids get none.
fn grad_embedding(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let vocab = em.ty(call.x(1))?.shape[0];
    let attrs = Attrs::new().with("vocab", vocab);
    let dtable = em.op1(Op::EmbeddingGrad, attrs, &[call.x(0), call.dy()?])?;
    Ok(vec![None, Some(dtable)])
}

/// A rope table with its sine row negated: rotating by it undoes the rotation by `table` (the
/// transpose of a rotation is the rotation by the negative angle).
fn inverse_rope_table(em: &mut dyn Emitter, table: Handle) -> Result<Handle, OpError> {
    let row = |i: i64| {
        Attrs::new()
            .with("axis", 0i64)
            .with("start", i)
            .with("end", i + 1)
    };
    let cos = em.op1(Op::Slice, row(0), &[table])?;
    let sin = em.op1(Op::Slice, row(1), &[table])?;
    let neg_sin = em.neg(sin)?;
    em.op1(Op::Concat, Attrs::new().with("axis", 0i64), &[cos, neg_sin])
}

/// `rope`: `dy` rotated back, by a table of the negative angles (hoisted like the forward's).
fn grad_rope(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let x = em.ty(call.x(0))?;
    let attrs = Attrs::new()
        .with("theta", call.attrs.float("theta")?)
        .with("positions", x.shape[1])
        .with("dim", x.shape[3]);
    let table = em.op1(Op::RopeTable, attrs, &[])?;
    let inverse = inverse_rope_table(em, table)?;
    let dx = em.op1(Op::RopeCached, Attrs::new(), &[call.dy()?, inverse])?;
    Ok(vec![Some(dx)])
}

/// `rope_cached`: as `rope`; the table is a constant of the positions and gets no gradient.
fn grad_rope_cached(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let inverse = inverse_rope_table(em, call.x(1))?;
    let dx = em.op1(Op::RopeCached, Attrs::new(), &[call.dy()?, inverse])?;
    Ok(vec![Some(dx), None])
}

/// `attention`: one `attention_lse` for the log-sum-exps (CSE then lets it compute the forward
/// output too) and one `attention_grad` for all three gradients, rebuilding the weights from q,
/// k and the lse.
fn grad_attention(em: &mut dyn Emitter, call: &GradCall) -> Grads {
    let mut attrs = Attrs::new().with("causal", call.attrs.opt_bool("causal")?.unwrap_or(false));
    if let Some(scale) = call.attrs.opt_float("scale")? {
        attrs.insert("scale", scale);
    }
    let qkv = [call.x(0), call.x(1), call.x(2)];
    let lse = em.emit(Op::AttentionLse, attrs.clone(), &qkv)?[1];
    let inputs = [qkv[0], qkv[1], qkv[2], call.y(0), call.dy()?, lse];
    Ok(em
        .emit(Op::AttentionGrad, attrs, &inputs)?
        .into_iter()
        .map(Some)
        .collect())
}

fn infer_embedding(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.int_input(0)?;
    ctx.expect_rank(1, 2, "[V, H]")?;
    let table = ctx.input(1);
    let mut shape = ctx.input(0).shape.clone();
    shape.push(table.shape[1]);
    Ok(vec![TensorType::new(table.dtype, shape)])
}

fn cost_embedding(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let written = outputs.iter().map(TensorType::bytes).sum::<u64>();
    Cost {
        flops: 0,
        bytes_read: ctx.input(0).bytes().saturating_add(written),
        bytes_written: written,
    }
}

fn infer_rope(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let out = infer_rope_shape(ctx)?;
    check_theta(ctx.attrs.float("theta")?)?;
    Ok(out)
}

/// `x`'s type when it is a float `[B, S, heads, D]` with an even `D`.
fn infer_rope_shape(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.float_input(0)?;
    ctx.expect_rank(0, 4, "[B, S, heads, D]")?;
    let d = ctx.input(0).shape[3];
    if d % 2 != 0 {
        return Err(OpError::at(
            0,
            format!("the head dim of x must be even to rotate halves, got {d}"),
        ));
    }
    Ok(vec![ctx.input(0).clone()])
}

fn check_theta(theta: f64) -> Result<(), OpError> {
    if theta > 0.0 && theta.is_finite() {
        Ok(())
    } else {
        Err(OpError::new(format!(
            "`theta` must be a finite positive number, got {theta:?}"
        )))
    }
}

fn infer_attention(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    AttentionDims::of(ctx.input(0), ctx.input(1), ctx.input(2), ctx.attrs)?;
    let dtype = ctx.float_input(0)?;
    ctx.same_dtype(0, 1)?;
    ctx.same_dtype(0, 2)?;
    Ok(vec![TensorType::new(dtype, ctx.input(0).shape.clone())])
}

fn cost_attention(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = AttentionDims::of(ctx.input(0), ctx.input(1), ctx.input(2), ctx.attrs)
        .map_or(0, |d| d.flops());
    Cost::streaming(flops, ctx.inputs, outputs)
}

fn infer_embedding_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    ctx.int_input(0)?;
    let dtype = ctx.float_input(1)?;
    let vocab = ctx.attrs.int("vocab")?;
    if vocab < 1 {
        return Err(OpError::new(format!(
            "`vocab` must be positive, got {vocab}"
        )));
    }
    let (ids, dy) = (&ctx.input(0).shape, &ctx.input(1).shape);
    if dy.len() != ids.len() + 1 || dy[..ids.len()] != ids[..] {
        return Err(OpError::at(
            1,
            format!(
                "dy {} must be the ids' shape {} plus one feature dim",
                fmt_dims(dy),
                fmt_dims(ids)
            ),
        ));
    }
    Ok(vec![TensorType::new(dtype, [vocab, dy[ids.len()]])])
}

fn infer_attention_lse(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let out = infer_attention(ctx)?.remove(0);
    let d = AttentionDims::of(ctx.input(0), ctx.input(1), ctx.input(2), ctx.attrs)?;
    Ok(vec![out, TensorType::new(DType::F32, [d.b, d.s, d.hq])])
}

fn infer_attention_grad(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let lse = infer_attention_lse(ctx)?.remove(1);
    for i in [3, 4] {
        ctx.same_dtype(0, i)?;
        if ctx.input(i).shape != ctx.input(0).shape {
            return Err(OpError::at(
                i,
                format!(
                    "{} {} must have the shape of q {}",
                    ctx.arg_name(i),
                    fmt_dims(&ctx.input(i).shape),
                    fmt_dims(&ctx.input(0).shape)
                ),
            ));
        }
    }
    if ctx.input(5) != &lse {
        return Err(OpError::at(
            5,
            format!(
                "lse must be {lse} (from attention_lse), got {}",
                ctx.input(5)
            ),
        ));
    }
    Ok(vec![
        ctx.input(0).clone(),
        ctx.input(1).clone(),
        ctx.input(2).clone(),
    ])
}

/// Five products the size of the score product: the scores and `dout·vᵀ` again, then one each
/// for dq, dk and dv.
fn cost_attention_grad(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = AttentionDims::of(ctx.input(0), ctx.input(1), ctx.input(2), ctx.attrs)
        .map_or(0, |d| d.flops() / 2);
    Cost::streaming(flops.saturating_mul(5), ctx.inputs, outputs)
}

fn infer_rope_table(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    check_theta(ctx.attrs.float("theta")?)?;
    let positions = ctx.attrs.int("positions")?;
    let dim = ctx.attrs.int("dim")?;
    if positions < 0 || dim < 0 || dim % 2 != 0 {
        return Err(OpError::new(format!(
            "`positions` must be non-negative and `dim` even and non-negative, got {positions} and {dim}"
        )));
    }
    Ok(vec![TensorType::new(DType::F32, [2, positions, dim / 2])])
}

fn infer_rope_cached(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let out = infer_rope_shape(ctx)?;
    let x = ctx.input(0);
    let want = TensorType::new(DType::F32, [2, x.shape[1], x.shape[3] / 2]);
    if ctx.input(1) != &want {
        return Err(OpError::at(
            1,
            format!("the table must be {want} for x {x}, got {}", ctx.input(1)),
        ));
    }
    Ok(out)
}

fn infer_causal_mask(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let size = ctx.attrs.int("size")?;
    let dtype = ctx.attrs.dtype("dtype")?;
    if size < 0 {
        return Err(OpError::new(format!(
            "`size` must be non-negative, got {size}"
        )));
    }
    if !dtype.is_float() {
        return Err(OpError::new(format!(
            "`dtype` must be a float dtype to hold -inf, got {dtype}"
        )));
    }
    Ok(vec![TensorType::new(dtype, [size, size])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::family::testing::*;
    use crate::ops::{cost, infer, DType, Op};

    #[test]
    fn embedding() {
        let out = ok(
            Op::Embedding,
            Attrs::new(),
            &[t(DType::I32, &[2, 7]), t(DType::BF16, &[100, 16])],
        );
        assert_eq!(out, t(DType::BF16, &[2, 7, 16]));
        let e = err(Op::Embedding, Attrs::new(), &[f32t(&[2]), f32t(&[10, 4])]);
        assert_eq!(
            e.message,
            "embedding: expects an integer tensor, but ids is f32[2]"
        );
        assert_eq!(e.input, Some(0));
        let e = err(
            Op::Embedding,
            Attrs::new(),
            &[t(DType::I64, &[2]), f32t(&[10])],
        );
        assert_eq!(
            e.message,
            "embedding: expects table of rank 2 ([V, H]), but table is f32[10]"
        );
        let c = cost(
            Op::Embedding,
            &Attrs::new(),
            &[t(DType::I32, &[3]), f32t(&[1000, 4])],
        )
        .unwrap();
        assert_eq!((c.bytes_read, c.bytes_written), (12 + 48, 48));
    }

    #[test]
    fn rope() {
        let x = [f32t(&[1, 5, 2, 8])];
        assert_eq!(ok(Op::Rope, Attrs::new(), &x), x[0]);
        assert!(err(Op::Rope, Attrs::new(), &[f32t(&[1, 5, 2, 7])])
            .message
            .contains("must be even"));
        assert!(err(Op::Rope, Attrs::new(), &[f32t(&[5, 8])])
            .message
            .contains("rank 4 ([B, S, heads, D])"));
        let a = Attrs::new().with("theta", 0.0);
        assert!(err(Op::Rope, a, &x).message.contains("`theta` must be"));
    }

    #[test]
    fn attention_shapes_and_gqa() {
        let q = f32t(&[2, 5, 8, 16]);
        let kv = f32t(&[2, 7, 2, 16]);
        let out = ok(
            Op::Attention,
            Attrs::new(),
            &[q.clone(), kv.clone(), kv.clone()],
        );
        assert_eq!(out, q);
        let bad_heads = f32t(&[2, 7, 3, 16]);
        let e = err(
            Op::Attention,
            Attrs::new(),
            &[q.clone(), bad_heads.clone(), bad_heads],
        );
        assert_eq!(
            e.message,
            "attention: k has 3 heads, which must divide the 8 heads of q"
        );
        let e = err(
            Op::Attention,
            Attrs::new(),
            &[q.clone(), kv.clone(), f32t(&[2, 6, 2, 16])],
        );
        assert_eq!(
            e.message,
            "attention: v [2, 6, 2, 16] must have the shape of k [2, 7, 2, 16]"
        );
        assert_eq!(e.input, Some(2));
        let e = err(
            Op::Attention,
            Attrs::new(),
            &[q.clone(), f32t(&[2, 7, 2, 8]), kv.clone()],
        );
        assert!(e.message.contains("batch and head dim must agree"));
        let kv16 = t(DType::F16, &[2, 7, 2, 16]);
        let e = err(
            Op::Attention,
            Attrs::new(),
            &[q.clone(), kv16.clone(), kv16],
        );
        assert_eq!(e.message, "attention: dtypes differ: q has f32, k has f16");
    }

    #[test]
    fn attention_dims_and_cost() {
        let (q, kv) = (f32t(&[2, 5, 8, 16]), f32t(&[2, 7, 2, 16]));
        let d = AttentionDims::of(&q, &kv, &kv, &Attrs::new()).unwrap();
        assert_eq!((d.hq / d.hkv, d.causal), (4, false));
        assert!((d.scale - 0.25).abs() < 1e-15, "scale {}", d.scale);
        let a = Attrs::new().with("causal", true).with("scale", 0.5);
        let d = AttentionDims::of(&q, &kv, &kv, &a).unwrap();
        assert_eq!((d.causal, d.scale), (true, 0.5));
        let c = cost(Op::Attention, &a, &[q.clone(), kv.clone(), kv.clone()]).unwrap();
        assert_eq!(c.flops, 4 * 2 * 8 * 5 * 7 * 16);
        let a = Attrs::new().with("scale", f64::INFINITY);
        assert!(err(Op::Attention, a, &[q, kv.clone(), kv])
            .message
            .contains("finite"));
    }

    #[test]
    fn embedding_grad() {
        let a = Attrs::new().with("vocab", 100);
        let out = ok(
            Op::EmbeddingGrad,
            a.clone(),
            &[t(DType::I64, &[2, 7]), f32t(&[2, 7, 16])],
        );
        assert_eq!(out, f32t(&[100, 16]));
        let e = err(
            Op::EmbeddingGrad,
            a,
            &[t(DType::I64, &[2, 7]), f32t(&[2, 6, 16])],
        );
        assert_eq!(
            e.message,
            "embedding_grad: dy [2, 6, 16] must be the ids' shape [2, 7] plus one feature dim"
        );
        let a = Attrs::new().with("vocab", 0);
        assert!(
            err(Op::EmbeddingGrad, a, &[t(DType::I64, &[2]), f32t(&[2, 3])])
                .message
                .contains("`vocab` must be positive")
        );
    }

    #[test]
    fn attention_backward_shapes() {
        let q = f32t(&[2, 5, 8, 16]);
        let kv = f32t(&[2, 7, 2, 16]);
        let outs = infer(
            Op::AttentionLse,
            &Attrs::new(),
            &[q.clone(), kv.clone(), kv.clone()],
        )
        .unwrap();
        assert_eq!(outs, [q.clone(), f32t(&[2, 5, 8])]);
        let lse = outs[1].clone();
        let ins = [q.clone(), kv.clone(), kv.clone(), q.clone(), q.clone(), lse];
        let grads = infer(Op::AttentionGrad, &Attrs::new(), &ins).unwrap();
        assert_eq!(grads, [q.clone(), kv.clone(), kv.clone()]);
        let mut bad = ins.clone();
        bad[5] = f32t(&[2, 8, 5]);
        let e = err(Op::AttentionGrad, Attrs::new(), &bad);
        assert_eq!(e.input, Some(5));
        let forward = 4 * 2 * 8 * 5 * 7 * 16;
        let c = cost(Op::AttentionLse, &Attrs::new(), &ins[..3]).unwrap();
        assert_eq!(c.flops, forward);
        let c = cost(Op::AttentionGrad, &Attrs::new(), &ins).unwrap();
        assert_eq!(c.flops, forward / 2 * 5);
    }

    #[test]
    fn causal_mask() {
        let a = Attrs::new().with("size", 4).with("dtype", DType::F32);
        assert_eq!(ok(Op::CausalMask, a, &[]), f32t(&[4, 4]));
        let a = Attrs::new().with("size", 4).with("dtype", DType::I32);
        assert_eq!(
            err(Op::CausalMask, a, &[]).message,
            "causal_mask: `dtype` must be a float dtype to hold -inf, got i32"
        );
        let a = Attrs::new().with("size", -1).with("dtype", DType::F32);
        assert!(err(Op::CausalMask, a, &[]).message.contains("non-negative"));
    }
}
