//! Embedding lookup: rows of a `[V, H]` table gathered by integer ids, checked first.

use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::shape::check_len;
use super::tensor::TensorRef;

/// `embedding(ids, table)` into `out` (`[..ids, H]`); any id outside `0..V` is an error and
/// nothing is written.
pub fn embedding(
    ids: &[i64],
    ids_shape: &[usize],
    table: TensorRef<'_>,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "embedding";
    check_len(OP, "ids", ids.len(), ids_shape)?;
    check_len(OP, "table", table.data.len(), table.shape)?;
    let &[v, h] = table.shape else {
        return Err(KernelError::new(
            OP,
            format!("table must be [V, H], got {:?}", table.shape),
        ));
    };
    if ids.len().checked_mul(h) != Some(out.len()) {
        return Err(KernelError::new(
            OP,
            format!(
                "out has {} elements, expected {} ids × {h}",
                out.len(),
                ids.len()
            ),
        ));
    }
    if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as u64 >= v as u64) {
        return Err(KernelError::new(
            OP,
            format!("id {bad} is outside the table of {v} rows"),
        ));
    }
    for_each_row_group(params, out.len(), out, h, |first, chunk| {
        for (row, &id) in chunk.chunks_exact_mut(h).zip(&ids[first..]) {
            let r = id as usize;
            row.copy_from_slice(&table.data[r * h..(r + 1) * h]);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_same_bits, on_one_and_two_threads, Precision, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn gathers_like_the_reference(
            v in 1usize..50, h in 1usize..20, n in 0usize..30,
            precision in prop::sample::select(Precision::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let table = precision.round_vec(rng.vec(v * h, 1.0));
            let ids: Vec<i64> = (0..n).map(|_| rng.below(v) as i64).collect();
            let shape = [v, h];
            let t = TensorRef::new("t", &table, &shape).unwrap();
            let want = reference::embedding(&ids, &[n], t).unwrap();
            let params = RowParams { task_elems: 1, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; n * h];
                embedding(&ids, &[n], t, &params, &mut out).unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            assert_same_bits("reference", &one, &want.data);
        }
    }

    #[test]
    fn out_of_range_ids_are_errors() {
        let table = [0.0f32; 6];
        let t = TensorRef::new("t", &table, &[3, 2]).unwrap();
        let mut out = [0.0; 2];
        for id in [-1i64, 3] {
            assert!(embedding(&[id], &[1], t, &RowParams::default(), &mut out).is_err());
            assert!(reference::embedding(&[id], &[1], t).is_err());
        }
    }
}
