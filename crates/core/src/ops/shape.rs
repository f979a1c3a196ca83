//! Shape arithmetic shared by the rules: NumPy broadcasting, axis normalisation, and the
//! `[4, 8]` spelling error messages use.

/// `[4, 8]`: how error messages show a shape (with spaces, unlike the compact IR spelling).
pub fn fmt_dims(dims: &[i64]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// The element count of `dims`, saturating at `u64::MAX`; a negative dim counts as 0.
pub fn numel(dims: &[i64]) -> u64 {
    dims.iter().fold(1u64, |n, &d| {
        n.saturating_mul(u64::try_from(d).unwrap_or(0))
    })
}

/// The NumPy broadcast of two shapes (align right; a dim of 1 stretches), or `None` when some
/// aligned pair differs and neither is 1. Generic over the dim type, so the checker's `i64`
/// shapes and the kernels' `usize` shapes broadcast by one rule.
pub fn broadcast<D: Copy + Eq + From<u8>>(a: &[D], b: &[D]) -> Option<Vec<D>> {
    let one = D::from(1);
    let rank = a.len().max(b.len());
    let dim = |s: &[D], i: usize| {
        let pad = rank - s.len();
        if i < pad {
            one
        } else {
            s[i - pad]
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (x, y) if x == one => Some(y),
            (x, y) if y == one => Some(x),
            _ => None,
        })
        .collect()
}

/// True when `from` broadcasts to exactly `to` (as `broadcast_to` requires).
pub fn broadcasts_to(from: &[i64], to: &[i64]) -> bool {
    from.len() <= to.len() && broadcast(from, to).as_deref() == Some(to)
}

/// The index of `axis` in a tensor of rank `rank`, where negative axes count from the end;
/// an error message when it is out of range.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = i64::try_from(rank).unwrap_or(i64::MAX);
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!(
            "axis {axis} is out of range for a rank-{rank} tensor (valid: {} to {})",
            -r,
            r - 1
        ))
    }
}

/// Normalises a list of axes, rejecting duplicates (after normalisation).
pub fn normalize_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut out: Vec<usize> = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(a, rank)?;
        if out.contains(&n) {
            return Err(format!("axis {a} is listed twice (as {n})"));
        }
        out.push(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast(&[4, 1, 3], &[5, 1]), Some(vec![4, 5, 3]));
        assert_eq!(broadcast(&[], &[2, 3]), Some(vec![2, 3]));
        assert_eq!(broadcast(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast(&[2, 3], &[3, 3]), None);
        assert!(broadcasts_to(&[1, 3], &[4, 2, 3]));
        assert!(!broadcasts_to(&[2, 3], &[1, 3]));
        assert!(!broadcasts_to(&[1, 1, 3], &[1, 3]));
    }

    #[test]
    fn axes() {
        assert_eq!(normalize_axis(-1, 3), Ok(2));
        assert_eq!(normalize_axis(0, 3), Ok(0));
        assert_eq!(
            normalize_axis(3, 3),
            Err("axis 3 is out of range for a rank-3 tensor (valid: -3 to 2)".into())
        );
        assert!(normalize_axis(0, 0).is_err());
        assert_eq!(normalize_axes(&[0, -1], 2), Ok(vec![0, 1]));
        assert_eq!(
            normalize_axes(&[1, -1], 2),
            Err("axis -1 is listed twice (as 1)".into())
        );
        assert_eq!(fmt_dims(&[4, 8]), "[4, 8]");
        assert_eq!(fmt_dims(&[]), "[]");
    }

    proptest! {
        #[test]
        fn broadcast_is_symmetric_and_absorbs_ones(
            a in proptest::collection::vec(1i64..4, 0..4),
            b in proptest::collection::vec(1i64..4, 0..4),
        ) {
            prop_assert_eq!(broadcast(&a, &b), broadcast(&b, &a));
            if let Some(c) = broadcast(&a, &b) {
                prop_assert!(broadcasts_to(&a, &c) && broadcasts_to(&b, &c));
            }
            let ones = vec![1; a.len()];
            prop_assert_eq!(broadcast(&a, &ones), Some(a.clone()));
        }
    }
}
