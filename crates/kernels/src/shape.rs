//! Shape arithmetic shared by all kernels: element counts, strides, NumPy broadcasting, axes.

use super::error::{KernelError, KernelResult};

/// Number of elements of a shape (1 for a scalar `[]`), or an error on overflow.
pub fn numel(op: &'static str, shape: &[usize]) -> KernelResult<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| KernelError::new(op, format!("shape {shape:?} has too many elements")))
    })
}

/// Row-major (C-order) strides of a shape, in elements.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut out = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        out[i] = out[i + 1] * shape[i + 1];
    }
    out
}

/// Checks that a buffer holds exactly the elements its shape says; returns that count.
pub fn check_len(op: &'static str, what: &str, len: usize, shape: &[usize]) -> KernelResult<usize> {
    let n = numel(op, shape)?;
    if n != len {
        return Err(KernelError::new(
            op,
            format!("{what} has {len} elements but its shape {shape:?} needs {n}"),
        ));
    }
    Ok(n)
}

/// The NumPy broadcast of several shapes (dimensions aligned on the right), by the registry's
/// rule.
pub fn broadcast_shapes(op: &'static str, shapes: &[&[usize]]) -> KernelResult<Vec<usize>> {
    shapes
        .iter()
        .try_fold(Vec::new(), |acc, s| mslc_core::ops::broadcast(&acc, s))
        .ok_or_else(|| KernelError::new(op, format!("shapes {shapes:?} do not broadcast")))
}

/// Strides that read a tensor of shape `shape` as if broadcast to `target` (which must be a valid
/// broadcast of it): one stride per target dim, 0 where the input is repeated.
pub fn broadcast_strides(shape: &[usize], target: &[usize]) -> Vec<usize> {
    let own = strides(shape);
    let offset = target.len() - shape.len();
    (0..target.len())
        .map(|i| {
            if i < offset || shape[i - offset] == 1 {
                0
            } else {
                own[i - offset]
            }
        })
        .collect()
}

/// Resolves a possibly negative axis against a rank, as NumPy does (the registry's rule).
pub fn normalize_axis(op: &'static str, axis: i64, rank: usize) -> KernelResult<usize> {
    mslc_core::ops::normalize_axis(axis, rank).map_err(|message| KernelError::new(op, message))
}

/// Splits a shape around `axis` into `(outer, len, inner)` element counts.
pub fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Calls `f(offset)` for every element of `shape` in row-major order, where `offset` is
/// the element's position under `strides` (e.g. broadcast strides).
pub fn for_each_offset(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    if shape.contains(&0) {
        return;
    }
    let rank = shape.len();
    let mut index = vec![0usize; rank];
    let mut offset = 0usize;
    loop {
        f(offset);
        let mut d = rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            offset += strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= strides[d] * shape[d];
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        assert_eq!(
            broadcast_shapes("t", &[&[3, 1, 5], &[4, 1]]).unwrap(),
            vec![3, 4, 5]
        );
        assert_eq!(broadcast_shapes("t", &[&[], &[2]]).unwrap(), vec![2]);
        assert!(broadcast_shapes("t", &[&[3], &[4]]).is_err());
    }

    #[test]
    fn offsets_walk_broadcast_strides() {
        let mut seen = Vec::new();
        for_each_offset(&[2, 3], &broadcast_strides(&[3], &[2, 3]), |o| seen.push(o));
        assert_eq!(seen, vec![0, 1, 2, 0, 1, 2]);
        seen.clear();
        for_each_offset(&[], &[], |o| seen.push(o));
        assert_eq!(seen, vec![0]);
    }

    #[test]
    fn axes_normalise() {
        assert_eq!(normalize_axis("t", -1, 3).unwrap(), 2);
        assert!(normalize_axis("t", 3, 3).is_err());
        assert!(normalize_axis("t", -4, 3).is_err());
    }
}
