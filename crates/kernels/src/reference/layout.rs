//! Reference data-movement ops: transpose, reshape, broadcast_to, concat, slice, select.

use super::elementwise::broadcast_values;
use crate::error::{KernelError, KernelResult};
use crate::shape::{broadcast_shapes, check_len, for_each_offset, normalize_axis, numel, strides};
use crate::tensor::{Tensor, TensorRef};
use crate::transpose::normalize_perm;

/// `transpose`: output dim `i` is input dim `perm[i]`.
pub fn transpose(x: TensorRef<'_>, perm: &[i64]) -> KernelResult<Tensor> {
    check_len("transpose", "x", x.data.len(), x.shape)?;
    let perm = normalize_perm("transpose", perm, x.shape.len())?;
    let in_strides = strides(x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let read: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut data = Vec::with_capacity(x.data.len());
    for_each_offset(&shape, &read, |o| data.push(x.data[o]));
    Tensor::new("transpose", shape, data)
}

/// `reshape`: the same elements under a new shape of equal element count.
pub fn reshape(x: TensorRef<'_>, shape: &[usize]) -> KernelResult<Tensor> {
    check_len("reshape", "x", x.data.len(), x.shape)?;
    if numel("reshape", shape)? != x.data.len() {
        return Err(KernelError::new(
            "reshape",
            format!(
                "cannot reshape {:?} into {shape:?}: element counts differ",
                x.shape
            ),
        ));
    }
    Tensor::new("reshape", shape.to_vec(), x.data.to_vec())
}

/// `broadcast_to`: `x` repeated (NumPy rules) to exactly `shape`.
pub fn broadcast_to(x: TensorRef<'_>, shape: &[usize]) -> KernelResult<Tensor> {
    check_len("broadcast_to", "x", x.data.len(), x.shape)?;
    if x.shape.len() > shape.len() || broadcast_shapes("broadcast_to", &[x.shape, shape])? != shape
    {
        return Err(KernelError::new(
            "broadcast_to",
            format!("{:?} does not broadcast to {shape:?}", x.shape),
        ));
    }
    Tensor::new("broadcast_to", shape.to_vec(), broadcast_values(x, shape))
}

/// `concat`: joins tensors of equal rank along `axis`; other dims must agree.
pub fn concat(xs: &[TensorRef<'_>], axis: i64) -> KernelResult<Tensor> {
    let first = xs
        .first()
        .ok_or_else(|| KernelError::new("concat", "needs at least one input"))?;
    let rank = first.shape.len();
    let axis = normalize_axis("concat", axis, rank)?;
    let mut shape = first.shape.to_vec();
    shape[axis] = 0;
    for x in xs {
        check_len("concat", "input", x.data.len(), x.shape)?;
        let agrees =
            x.shape.len() == rank && (0..rank).all(|d| d == axis || x.shape[d] == first.shape[d]);
        if !agrees {
            return Err(KernelError::new(
                "concat",
                format!(
                    "shape {:?} does not match {:?} off axis {axis}",
                    x.shape, first.shape
                ),
            ));
        }
        shape[axis] += x.shape[axis];
    }
    let outer: usize = shape[..axis].iter().product();
    let mut data = Vec::with_capacity(numel("concat", &shape)?);
    for o in 0..outer {
        for x in xs {
            let run: usize = x.shape[axis..].iter().product();
            data.extend_from_slice(&x.data[o * run..(o + 1) * run]);
        }
    }
    Tensor::new("concat", shape, data)
}

/// Resolves a Python-style index (negative counts from the end) against a length, allowing the
/// one-past-the-end position when `end_ok`.
fn resolve(op: &'static str, what: &str, i: i64, len: usize, end_ok: bool) -> KernelResult<usize> {
    let l = len as i64;
    let r = if i < 0 { i + l } else { i };
    let max = if end_ok { l } else { l - 1 };
    if r < 0 || r > max {
        return Err(KernelError::new(
            op,
            format!("{what} {i} is out of range for a dimension of size {len}"),
        ));
    }
    Ok(r as usize)
}

/// `slice`: elements `start..end` (half-open; negative values count from the end) along `axis`.
pub fn slice(x: TensorRef<'_>, axis: i64, start: i64, end: i64) -> KernelResult<Tensor> {
    check_len("slice", "x", x.data.len(), x.shape)?;
    let axis = normalize_axis("slice", axis, x.shape.len())?;
    let len = x.shape[axis];
    let s = resolve("slice", "start", start, len, true)?;
    let e = resolve("slice", "end", end, len, true)?;
    if s > e {
        return Err(KernelError::new(
            "slice",
            format!("start {start} is after end {end}"),
        ));
    }
    let inner: usize = x.shape[axis + 1..].iter().product();
    let outer: usize = x.shape[..axis].iter().product();
    let mut data = Vec::new();
    for o in 0..outer {
        let base = o * len * inner;
        data.extend_from_slice(&x.data[base + s * inner..base + e * inner]);
    }
    let mut shape = x.shape.to_vec();
    shape[axis] = e - s;
    Tensor::new("slice", shape, data)
}

/// `select`: the sub-tensor at `index` (negative counts from the end) along `axis`, which is
/// removed from the shape.
pub fn select(x: TensorRef<'_>, axis: i64, index: i64) -> KernelResult<Tensor> {
    check_len("select", "x", x.data.len(), x.shape)?;
    let a = normalize_axis("select", axis, x.shape.len())?;
    let i = resolve("select", "index", index, x.shape[a], false)? as i64;
    let mut t = slice(x, axis, i, i + 1)?;
    t.shape.remove(a);
    Ok(t)
}
