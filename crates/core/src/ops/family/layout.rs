//! Data-movement ops: `transpose`, `reshape`, `broadcast_to`, `concat`, `slice`, `select`.

use crate::ops::attrs::{AttrKind, AttrSpec, Attrs};
use crate::ops::error::OpError;
use crate::ops::grad::unbroadcast;
use crate::ops::shape::{broadcasts_to, fmt_dims, normalize_axis, numel};
use crate::ops::spec::{
    Arity, CostRule, Emitter, GradCall, GradRule, Handle, OpCtx, OpSpec, PrecisionClass,
};
use crate::ops::{Op, TensorType};

/// A one-input op that copies data without arithmetic.
pub(super) const fn movement(
    attrs: &'static [AttrSpec],
    infer: fn(&OpCtx) -> Result<Vec<TensorType>, OpError>,
    grad: GradRule,
) -> OpSpec {
    OpSpec {
        inputs: &["x"],
        arity: Arity::Exact(1),
        attrs,
        infer,
        cost: CostRule::PerOutput(0),
        precision: PrecisionClass::FollowInput,
        elementwise: false,
        in_place: false,
        grad: Some(grad),
        shard: None,
    }
}

/// `transpose`: permutes dims by `perm`.
pub const TRANSPOSE: OpSpec = movement(
    &[AttrSpec::required("perm", AttrKind::Ints)],
    infer_transpose,
    grad_transpose,
);

/// `reshape`: same elements, new shape; one dim of `shape` may be -1 (inferred). A view of
/// its input's buffer, so it costs nothing and may alias it.
pub const RESHAPE: OpSpec = OpSpec {
    cost: CostRule::View,
    in_place: true,
    ..movement(
        &[AttrSpec::required("shape", AttrKind::Ints)],
        infer_reshape,
        grad_reshape,
    )
};

/// `broadcast_to`: stretches dims of 1 (NumPy rules) to exactly `shape`.
pub const BROADCAST_TO: OpSpec = movement(
    &[AttrSpec::required("shape", AttrKind::Ints)],
    infer_broadcast_to,
    grad_broadcast_to,
);

/// `concat`: joins one or more tensors along `axis`.
pub const CONCAT: OpSpec = OpSpec {
    inputs: &["xs"],
    arity: Arity::AtLeast(1),
    ..movement(
        &[AttrSpec::required("axis", AttrKind::Int)],
        infer_concat,
        grad_concat,
    )
};

/// `slice`: the half-open range `start..end` of `axis`.
pub const SLICE: OpSpec = movement(
    &[
        AttrSpec::required("axis", AttrKind::Int),
        AttrSpec::required("start", AttrKind::Int),
        AttrSpec::required("end", AttrKind::Int),
    ],
    infer_slice,
    grad_slice,
);

/// `select`: index `index` of `axis`, dropping that axis.
pub const SELECT: OpSpec = movement(
    &[
        AttrSpec::required("axis", AttrKind::Int),
        AttrSpec::required("index", AttrKind::Int),
    ],
    infer_select,
    grad_select,
);

/// The permutation of a `transpose` over a rank-`rank` input, negative entries normalised:
/// output dim `i` is input dim `perm[i]`.
pub fn permutation(attrs: &Attrs, rank: usize) -> Result<Vec<usize>, OpError> {
    let perm = attrs.ints("perm")?;
    let bad = || {
        OpError::new(format!(
            "`perm` {} is not a permutation of the {rank} dims of x",
            fmt_dims(&perm)
        ))
    };
    if perm.len() != rank {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(rank);
    for &p in &perm {
        let axis = normalize_axis(p, rank).map_err(|_| bad())?;
        if out.contains(&axis) {
            return Err(bad());
        }
        out.push(axis);
    }
    Ok(out)
}

/// The resolved range of a `slice`: `start..end` of dim `axis`, with `0 <= start <= end <=
/// dim`. Negative `start` / `end` count from the end of the dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRange {
    pub axis: usize,
    pub start: i64,
    pub end: i64,
}

impl SliceRange {
    /// Reads and checks the range of a `slice` of `x`.
    pub fn of(x: &TensorType, attrs: &Attrs) -> Result<SliceRange, OpError> {
        let axis = axis_of(x, attrs)?;
        let dim = x.shape[axis];
        let at = |name: &str| -> Result<i64, OpError> {
            let v = attrs.int(name)?;
            let n = if v < 0 { v.saturating_add(dim) } else { v };
            if (0..=dim).contains(&n) {
                Ok(n)
            } else {
                Err(OpError::new(format!(
                    "`{name}` {v} is out of range for axis {axis} of size {dim}"
                )))
            }
        };
        let (start, end) = (at("start")?, at("end")?);
        if start > end {
            return Err(OpError::new(format!(
                "`start` {start} is after `end` {end} on axis {axis}"
            )));
        }
        Ok(SliceRange { axis, start, end })
    }
}

/// The resolved `(axis, index)` of a `select` on `x`; a negative index counts from the end.
pub fn select_index(x: &TensorType, attrs: &Attrs) -> Result<(usize, i64), OpError> {
    let axis = axis_of(x, attrs)?;
    let dim = x.shape[axis];
    let index = attrs.int("index")?;
    let n = if index < 0 {
        index.saturating_add(dim)
    } else {
        index
    };
    if (0..dim).contains(&n) {
        Ok((axis, n))
    } else {
        Err(OpError::new(format!(
            "`index` {index} is out of range for axis {axis} of size {dim}"
        )))
    }
}

/// The normalised `axis` attribute against the rank of `x`.
fn axis_of(x: &TensorType, attrs: &Attrs) -> Result<usize, OpError> {
    normalize_axis(attrs.int("axis")?, x.rank()).map_err(|m| OpError::new(format!("axis: {m}")))
}

fn infer_transpose(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let perm = permutation(ctx.attrs, x.rank())?;
    let shape = perm.iter().map(|&p| x.shape[p]).collect::<Vec<_>>();
    Ok(vec![TensorType::new(x.dtype, shape)])
}

fn infer_reshape(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let mut shape = ctx.attrs.ints("shape")?;
    if let Some(&d) = shape.iter().find(|&&d| d < -1) {
        return Err(OpError::new(format!(
            "`shape` {} has a negative dim {d} (only one -1, to infer, is allowed)",
            fmt_dims(&shape)
        )));
    }
    let wildcards = shape.iter().filter(|&&d| d == -1).count();
    if wildcards > 1 {
        return Err(OpError::new(format!(
            "`shape` {} has more than one -1",
            fmt_dims(&shape)
        )));
    }
    let total = x.numel();
    if wildcards == 1 {
        let known = numel(
            &shape
                .iter()
                .map(|&d| if d == -1 { 1 } else { d })
                .collect::<Vec<_>>(),
        );
        if known == 0 || !total.is_multiple_of(known) {
            return Err(OpError::new(format!(
                "cannot reshape {} ({total} elements) to {}: no whole dim fits the -1",
                fmt_dims(&x.shape),
                fmt_dims(&shape)
            )));
        }
        let fill = i64::try_from(total / known).map_err(|_| OpError::new("shape too large"))?;
        shape
            .iter_mut()
            .filter(|d| **d == -1)
            .for_each(|d| *d = fill);
    }
    if numel(&shape) != total {
        return Err(OpError::new(format!(
            "cannot reshape {} ({total} elements) to {} ({} elements)",
            fmt_dims(&x.shape),
            fmt_dims(&shape),
            numel(&shape)
        )));
    }
    Ok(vec![TensorType::new(x.dtype, shape)])
}

fn infer_broadcast_to(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let shape = ctx.attrs.ints("shape")?;
    if !broadcasts_to(&x.shape, &shape) {
        return Err(OpError::at(
            0,
            format!(
                "cannot broadcast x {} to {}",
                fmt_dims(&x.shape),
                fmt_dims(&shape)
            ),
        )
        .with_help("aligned from the right, each dim of x must equal the target's or be 1"));
    }
    Ok(vec![TensorType::new(x.dtype, shape)])
}

fn infer_concat(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let first = ctx.input(0);
    let axis = ctx.axis("axis", 0)?;
    let mut shape = first.shape.clone();
    for (i, x) in ctx.inputs.iter().enumerate().skip(1) {
        ctx.same_dtype(0, i)?;
        let mismatch = x.rank() != first.rank()
            || (0..x.rank()).any(|d| d != axis && x.shape[d] != first.shape[d]);
        if mismatch {
            return Err(OpError::at(
                i,
                format!(
                    "{} is {} but {} is {}; all dims but axis {axis} must agree",
                    ctx.arg_name(i),
                    fmt_dims(&x.shape),
                    ctx.arg_name(0),
                    fmt_dims(&first.shape)
                ),
            ));
        }
        shape[axis] = shape[axis]
            .checked_add(x.shape[axis])
            .ok_or_else(|| OpError::new("concatenated dim overflows an i64"))?;
    }
    Ok(vec![TensorType::new(first.dtype, shape)])
}

fn infer_slice(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let r = SliceRange::of(x, ctx.attrs)?;
    let mut shape = x.shape.clone();
    shape[r.axis] = r.end - r.start;
    Ok(vec![TensorType::new(x.dtype, shape)])
}

fn infer_select(ctx: &OpCtx) -> Result<Vec<TensorType>, OpError> {
    let x = ctx.input(0);
    let (axis, _) = select_index(x, ctx.attrs)?;
    let mut shape = x.shape.clone();
    shape.remove(axis);
    Ok(vec![TensorType::new(x.dtype, shape)])
}

// Gradient rules: each moves the cotangent back to where its elements came from.

/// A cotangent for a float `x` built by `f`; integer and bool inputs get none.
fn float_only(
    em: &mut dyn Emitter,
    x: Handle,
    f: impl FnOnce(&mut dyn Emitter, &TensorType) -> Result<Handle, OpError>,
) -> Result<Option<Handle>, OpError> {
    let t = em.ty(x)?;
    if t.dtype.is_float() {
        f(em, &t).map(Some)
    } else {
        Ok(None)
    }
}

/// `transpose`: `dy` transposed by the inverse permutation.
fn grad_transpose(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let dy = call.dy()?;
    let g = float_only(em, call.x(0), |em, t| {
        let perm = permutation(call.attrs, t.rank())?;
        let mut inverse = vec![0i64; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i as i64;
        }
        em.op1(Op::Transpose, Attrs::new().with("perm", inverse), &[dy])
    })?;
    Ok(vec![g])
}

/// `reshape`: `dy` reshaped back.
fn grad_reshape(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let dy = call.dy()?;
    Ok(vec![float_only(em, call.x(0), |em, t| {
        em.reshape(dy, &t.shape)
    })?])
}

/// `broadcast_to`: `dy` summed over the stretched dims.
fn grad_broadcast_to(
    em: &mut dyn Emitter,
    call: &GradCall,
) -> Result<Vec<Option<Handle>>, OpError> {
    let t = em.ty(call.x(0))?;
    Ok(vec![unbroadcast(em, call.dy()?, &t)?])
}

/// `concat`: each input's range of `dy` along the axis.
fn grad_concat(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let dy = call.dy()?;
    let rank = em.ty(dy)?.rank();
    let axis = normalize_axis(call.attrs.int("axis")?, rank)
        .map_err(|m| OpError::new(format!("axis: {m}")))?;
    let mut start = 0i64;
    let mut grads = Vec::with_capacity(call.inputs.len());
    for &x in call.inputs {
        let len = em.ty(x)?.shape[axis];
        grads.push(float_only(em, x, |em, _| {
            slice(em, dy, axis, start, start + len)
        })?);
        start += len;
    }
    Ok(grads)
}

/// `slice(x, axis, start, end)` emitted by a rule.
fn slice(
    em: &mut dyn Emitter,
    x: Handle,
    axis: usize,
    start: i64,
    end: i64,
) -> Result<Handle, OpError> {
    let attrs = Attrs::new()
        .with("axis", axis as i64)
        .with("start", start)
        .with("end", end);
    em.op1(Op::Slice, attrs, &[x])
}

/// `g` placed at `start..` of `axis` in zeros of shape `shape`: the zeros before and after it
/// concatenated around it (the adjoint of a slice).
fn pad_along(
    em: &mut dyn Emitter,
    g: Handle,
    shape: &[i64],
    axis: usize,
    start: i64,
) -> Result<Handle, OpError> {
    let t = em.ty(g)?;
    let after = shape[axis] - start - t.shape[axis];
    let zero = em.scalar(0.0, t.dtype)?;
    let mut parts = Vec::with_capacity(3);
    for (len, is_g) in [(start, false), (t.shape[axis], true), (after, false)] {
        if is_g {
            parts.push(g);
        } else if len > 0 {
            let mut s = t.shape.clone();
            s[axis] = len;
            parts.push(em.broadcast_to(zero, &s)?);
        }
    }
    if parts.len() == 1 {
        return Ok(g);
    }
    em.op1(Op::Concat, Attrs::new().with("axis", axis as i64), &parts)
}

/// `slice`: `dy` padded with zeros back to the input's extent.
fn grad_slice(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let dy = call.dy()?;
    Ok(vec![float_only(em, call.x(0), |em, t| {
        let r = SliceRange::of(t, call.attrs)?;
        pad_along(em, dy, &t.shape, r.axis, r.start)
    })?])
}

/// `select`: `dy` with the selected axis restored as a dim of 1, padded with zeros.
fn grad_select(em: &mut dyn Emitter, call: &GradCall) -> Result<Vec<Option<Handle>>, OpError> {
    let dy = call.dy()?;
    Ok(vec![float_only(em, call.x(0), |em, t| {
        let (axis, index) = select_index(t, call.attrs)?;
        let mut kept = t.shape.clone();
        kept[axis] = 1;
        let g = em.reshape(dy, &kept)?;
        pad_along(em, g, &t.shape, axis, index)
    })?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::family::testing::*;
    use crate::ops::{cost, DType, Op};

    #[test]
    fn transpose() {
        let a = Attrs::new().with("perm", vec![0, 2, 1]);
        assert_eq!(ok(Op::Transpose, a, &[f32t(&[2, 3, 4])]), f32t(&[2, 4, 3]));
        let a = Attrs::new().with("perm", vec![-1, 0]);
        assert_eq!(ok(Op::Transpose, a, &[f32t(&[2, 3])]), f32t(&[3, 2]));
        let a = Attrs::new().with("perm", vec![0, 0]);
        assert_eq!(
            err(Op::Transpose, a, &[f32t(&[2, 3])]).message,
            "transpose: `perm` [0, 0] is not a permutation of the 2 dims of x"
        );
        let a = Attrs::new().with("perm", vec![1, 0]);
        assert!(err(Op::Transpose, a, &[f32t(&[2, 3, 4])])
            .message
            .contains("3 dims"));
    }

    #[test]
    fn reshape() {
        let a = Attrs::new().with("shape", vec![4, -1]);
        assert_eq!(ok(Op::Reshape, a, &[f32t(&[2, 3, 4])]), f32t(&[4, 6]));
        let a = Attrs::new().with("shape", vec![4, 2]);
        assert_eq!(
            err(Op::Reshape, a, &[f32t(&[2, 3])]).message,
            "reshape: cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)"
        );
        let a = Attrs::new().with("shape", vec![-1, -1]);
        assert!(err(Op::Reshape, a, &[f32t(&[6])])
            .message
            .contains("more than one -1"));
        let a = Attrs::new().with("shape", vec![4, -1]);
        assert!(err(Op::Reshape, a, &[f32t(&[6])])
            .message
            .contains("no whole dim"));
        let a = Attrs::new().with("shape", vec![0, -1]);
        assert!(err(Op::Reshape, a, &[f32t(&[0, 3])])
            .message
            .contains("no whole dim"));
        let a = Attrs::new().with("shape", vec![2, -3]);
        assert!(err(Op::Reshape, a, &[f32t(&[6])])
            .message
            .contains("negative dim -3"));
        let a = Attrs::new().with("shape", vec![]);
        assert_eq!(ok(Op::Reshape, a, &[f32t(&[1, 1])]), f32t(&[]));
    }

    #[test]
    fn broadcast_to() {
        let a = Attrs::new().with("shape", vec![4, 2, 3]);
        assert_eq!(ok(Op::BroadcastTo, a, &[f32t(&[1, 3])]), f32t(&[4, 2, 3]));
        let a = Attrs::new().with("shape", vec![4, 3]);
        assert_eq!(
            err(Op::BroadcastTo, a, &[f32t(&[2, 3])]).message,
            "broadcast_to: cannot broadcast x [2, 3] to [4, 3]"
        );
    }

    #[test]
    fn concat() {
        let a = Attrs::new().with("axis", -1);
        let out = ok(
            Op::Concat,
            a.clone(),
            &[f32t(&[2, 3]), f32t(&[2, 5]), f32t(&[2, 0])],
        );
        assert_eq!(out, f32t(&[2, 8]));
        assert_eq!(ok(Op::Concat, a.clone(), &[f32t(&[2, 3])]), f32t(&[2, 3]));
        let e = err(Op::Concat, a.clone(), &[f32t(&[2, 3]), f32t(&[3, 3])]);
        assert_eq!(
            e.message,
            "concat: xs[1] is [3, 3] but xs[0] is [2, 3]; all dims but axis 1 must agree"
        );
        assert_eq!(e.input, Some(1));
        let e = err(Op::Concat, a.clone(), &[f32t(&[2]), t(DType::F16, &[2])]);
        assert_eq!(
            e.message,
            "concat: dtypes differ: xs[0] has f32, xs[1] has f16"
        );
        assert_eq!(
            err(Op::Concat, a, &[]).message,
            "concat: expects at least 1 input, got 0"
        );
        let e = err(Op::Concat, Attrs::new().with("axis", 2), &[f32t(&[2, 3])]);
        assert_eq!(
            e.message,
            "concat: axis: axis 2 is out of range for a rank-2 tensor (valid: -2 to 1)"
        );
    }

    #[test]
    fn slice_and_select() {
        let s = |start: i64, end: i64| {
            Attrs::new()
                .with("axis", 1)
                .with("start", start)
                .with("end", end)
        };
        assert_eq!(ok(Op::Slice, s(1, 3), &[f32t(&[2, 4])]), f32t(&[2, 2]));
        assert_eq!(ok(Op::Slice, s(-2, 4), &[f32t(&[2, 4])]), f32t(&[2, 2]));
        assert_eq!(ok(Op::Slice, s(2, 2), &[f32t(&[2, 4])]), f32t(&[2, 0]));
        assert_eq!(
            err(Op::Slice, s(0, 5), &[f32t(&[2, 4])]).message,
            "slice: `end` 5 is out of range for axis 1 of size 4"
        );
        assert_eq!(
            err(Op::Slice, s(3, 1), &[f32t(&[2, 4])]).message,
            "slice: `start` 3 is after `end` 1 on axis 1"
        );
        let r = SliceRange::of(&f32t(&[2, 4]), &s(-3, -1)).unwrap();
        assert_eq!(
            r,
            SliceRange {
                axis: 1,
                start: 1,
                end: 3
            }
        );

        let sel = |i: i64| Attrs::new().with("axis", 0).with("index", i);
        assert_eq!(ok(Op::Select, sel(1), &[f32t(&[2, 4])]), f32t(&[4]));
        assert_eq!(select_index(&f32t(&[2, 4]), &sel(-1)).unwrap(), (0, 1));
        assert_eq!(
            err(Op::Select, sel(2), &[f32t(&[2, 4])]).message,
            "select: `index` 2 is out of range for axis 0 of size 2"
        );
    }

    #[test]
    fn movement_costs_bytes_not_flops() {
        let a = Attrs::new().with("perm", vec![1, 0]);
        let c = cost(Op::Transpose, &a, &[f32t(&[2, 3])]).unwrap();
        assert_eq!((c.flops, c.bytes_read, c.bytes_written), (0, 24, 24));
    }
}
