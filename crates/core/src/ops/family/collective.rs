//! Collective ops: the communication a per-rank program does over one axis of the device mesh
//! (`all_reduce`, `all_gather`, `reduce_scatter`), Megatron's `parallel_copy` (its `f`) and
//! `rank_slice` (this rank's block of a tensor every member holds whole).
//! The sharding pass inserts them; `.msl` sources cannot call them. Every one carries the mesh
//! axis it runs over (`axis`) and the size of that axis's group (`ranks`), so its types, cost
//! and bytes follow from the graph alone; the executor runs them through its collectives.
//!
//! The gradient rules are the conjugate pairs of Megatron-LM (Shoeybi et al. 2019, §3) and of
//! sequence parallelism (Korthikanti et al. 2022): a rank's downstream computation is
//! replicated over the group, so the gradient of `all_reduce` (`g`) is the identity, that of
//! `parallel_copy` (`f`) an `all_reduce`, and `all_gather` and `reduce_scatter` along a dim are
//! each other's gradient. Where a gathered tensor feeds computation every member repeats (the
//! head after a sequence-parallel region), the members' cotangents are equal rather than
//! partial: such an `all_gather` (`replicated_grad = true`) and `rank_slice` are each other's
//! gradient instead (Megatron's `gather_from_sequence_parallel_region` without
//! `tensor_parallel_output_grad`, and `scatter_to_sequence_parallel_region`).

use crate::ops::attrs::{AttrKind, AttrSpec, Attrs, ConstAttr};
use crate::ops::error::OpError;
use crate::ops::family::layout::movement;
use crate::ops::spec::{Cost, CostRule, Emitter, GradCall, GradRule, Handle, OpCtx, OpSpec};
use crate::ops::{Op, TensorType};

const AXIS: AttrSpec = AttrSpec::required("axis", AttrKind::Str);
const RANKS: AttrSpec = AttrSpec::required("ranks", AttrKind::Int);
const DIM: AttrSpec = AttrSpec::defaulted("dim", ConstAttr::Int(0));
const REPLICATED_GRAD: AttrSpec = AttrSpec::defaulted("replicated_grad", ConstAttr::Bool(false));

const fn collective(
    attrs: &'static [AttrSpec],
    infer: fn(&OpCtx) -> Result<Vec<TensorType>, OpError>,
    grad: GradRule,
) -> OpSpec {
    OpSpec {
        cost: CostRule::Custom(cost),
        ..movement(attrs, infer, grad)
    }
}

/// `all_reduce(x) {axis, ranks}`: the sum of `x` over the group; every member gets it.
pub const ALL_REDUCE: OpSpec = collective(&[AXIS, RANKS], infer_same, grad_all_reduce);

/// `parallel_copy(x) {axis, ranks}`: `x` itself, whose gradient is summed over the group
/// (Megatron's `f`, in front of a column-parallel layer).
pub const PARALLEL_COPY: OpSpec = collective(&[AXIS, RANKS], infer_same, grad_parallel_copy);

/// `all_gather(x) {axis, ranks, dim, replicated_grad}`: the members' `x` concatenated along
/// `dim` in group order. Its gradient is the `reduce_scatter` of the members' cotangents, or,
/// with `replicated_grad` (every member's cotangent is the same), this rank's block of it.
pub const ALL_GATHER: OpSpec = collective(
    &[AXIS, RANKS, DIM, REPLICATED_GRAD],
    infer_gather,
    grad_all_gather,
);

/// `reduce_scatter(x) {axis, ranks, dim}`: the sum of `x` over the group, cut along `dim` into
/// `ranks` equal blocks, member i keeping block i.
pub const REDUCE_SCATTER: OpSpec =
    collective(&[AXIS, RANKS, DIM], infer_scatter, grad_reduce_scatter);

/// `rank_slice(x) {axis, ranks, dim}`: block i of `x` cut along `dim` into `ranks` equal
/// blocks, i this rank's place in the group; `x` is the same on every member, so nothing
/// moves. Its gradient gathers the members' cotangents (`all_gather` with `replicated_grad`).
pub const RANK_SLICE: OpSpec = collective(&[AXIS, RANKS, DIM], infer_scatter, grad_rank_slice);

/// The group size, at least 1.
fn ranks(ctx: &OpCtx) -> Result<i64, OpError> {
    let n = ctx.attrs.int("ranks")?;
    if n < 1 {
        return Err(OpError::new(format!("`ranks` must be at least 1, got {n}")));
    }
    Ok(n)
}

fn float_type(ctx: &OpCtx) -> Result<TensorType, OpError> {
    ctx.float_input(0)?;
    ranks(ctx)?;
    Ok(ctx.input(0).clone())
}

fn infer_same(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    Ok(vec![float_type(ctx)?])
}

fn infer_gather(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let mut t = float_type(ctx)?;
    let d = ctx.axis("dim", 0)?;
    t.shape[d] = t.shape[d]
        .checked_mul(ranks(ctx)?)
        .ok_or_else(|| OpError::new("the gathered dim overflows"))?;
    Ok(vec![t])
}

fn infer_scatter(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let mut t = float_type(ctx)?;
    let d = ctx.axis("dim", 0)?;
    let n = ranks(ctx)?;
    if t.shape[d] % n != 0 {
        return Err(OpError::at(
            0,
            format!(
                "dim {d} of size {} does not split into {n} equal blocks",
                t.shape[d]
            ),
        ));
    }
    t.shape[d] /= n;
    Ok(vec![t])
}

/// The bytes one rank hands the collective: its whole input (sum, gather, scatter), none for
/// `parallel_copy` and `rank_slice`, whose forwards move nothing.
pub fn payload_bytes(op: Op, input: &TensorType) -> u64 {
    match op {
        Op::ParallelCopy | Op::RankSlice => 0,
        _ => input.bytes(),
    }
}

fn cost(ctx: &OpCtx, outputs: &[TensorType]) -> Cost {
    let flops = match ctx.op {
        Op::AllReduce | Op::ReduceScatter => ctx.input(0).numel(),
        _ => 0,
    };
    Cost::streaming(flops, ctx.inputs, outputs)
}

/// The same collective attributes with `dim` set (gather and scatter).
fn same_group(attrs: &Attrs, dim: Option<i64>) -> Result<Attrs, OpError> {
    let a = Attrs::new()
        .with("axis", attrs.str("axis")?.as_str())
        .with("ranks", attrs.int("ranks")?);
    Ok(match dim {
        Some(d) => a.with("dim", d),
        None => a,
    })
}

fn grad_all_reduce(_: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    Ok(vec![Some(call.dy()?)])
}

fn grad_parallel_copy(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    let attrs = same_group(call.attrs, None)?;
    Ok(vec![Some(em.op1(Op::AllReduce, attrs, &[call.dy()?])?)])
}

fn grad_all_gather(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let attrs = same_group(call.attrs, Some(call.attrs.int("dim")?))?;
    let op = match call.attrs.opt_bool("replicated_grad")? {
        Some(true) => Op::RankSlice,
        _ => Op::ReduceScatter,
    };
    Ok(vec![Some(em.op1(op, attrs, &[call.dy()?])?)])
}

fn grad_rank_slice(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let attrs = same_group(call.attrs, Some(call.attrs.int("dim")?))?.with("replicated_grad", true);
    Ok(vec![Some(em.op1(Op::AllGather, attrs, &[call.dy()?])?)])
}

fn grad_reduce_scatter(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    let attrs = same_group(call.attrs, Some(call.attrs.int("dim")?))?;
    Ok(vec![Some(em.op1(Op::AllGather, attrs, &[call.dy()?])?)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{infer, resolve_attrs, DType};

    fn group(dim: Option<i64>) -> Attrs {
        let a = Attrs::new().with("axis", "mp").with("ranks", 2i64);
        match dim {
            Some(d) => a.with("dim", d),
            None => a,
        }
    }

    #[test]
    fn shapes_follow_the_group_size() {
        let x = TensorType::new(DType::F32, [4, 6]);
        let out = |op: Op, a: Attrs| {
            let a = resolve_attrs(op, &a).unwrap();
            infer(op, &a, std::slice::from_ref(&x))
        };
        assert_eq!(out(Op::AllReduce, group(None)).unwrap(), vec![x.clone()]);
        assert_eq!(out(Op::ParallelCopy, group(None)).unwrap(), vec![x.clone()]);
        let gathered = out(Op::AllGather, group(Some(1))).unwrap();
        assert_eq!(gathered[0].shape, vec![4, 12]);
        let scattered = out(Op::ReduceScatter, group(Some(0))).unwrap();
        assert_eq!(scattered[0].shape, vec![2, 6]);
        let sliced = out(Op::RankSlice, group(Some(1))).unwrap();
        assert_eq!(sliced[0].shape, vec![4, 3]);
        let odd = Attrs::new().with("axis", "mp").with("ranks", 4i64);
        let e = out(Op::ReduceScatter, odd.with("dim", 1i64)).unwrap_err();
        assert!(e.message.contains("does not split into 4"), "{}", e.message);
        let ids = TensorType::new(DType::I64, [4]);
        let a = resolve_attrs(Op::AllReduce, &group(None)).unwrap();
        assert!(infer(Op::AllReduce, &a, &[ids]).is_err());
    }

    #[test]
    fn payload_is_the_input_except_for_the_copy() {
        let x = TensorType::new(DType::F32, [4, 6]);
        assert_eq!(payload_bytes(Op::AllReduce, &x), 96);
        assert_eq!(payload_bytes(Op::ParallelCopy, &x), 0);
        assert_eq!(payload_bytes(Op::RankSlice, &x), 0);
    }
}
