//! `cross_entropy`: per-row log-sum-exp in parallel, then a fixed-order mean.

use super::error::KernelResult;
use super::par::{self, RowParams};
use super::reference::loss::cross_entropy_dims;
use super::rows;
use super::scratch::with_scratch;
use super::tensor::TensorRef;

/// `cross_entropy(logits [..., V], labels [...])`: the mean over positions of
/// `logsumexp(row) − row[label]`. Labels outside `0..V` are an error.
pub fn cross_entropy(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
    params: &RowParams,
) -> KernelResult<f32> {
    let (positions, v) = cross_entropy_dims(logits, labels, labels_shape)?;
    let per_task = params.task_elems.div_ceil(v).max(1);
    let parallel = logits.data.len() >= params.min_parallel_elems;
    let total = with_scratch(positions, |losses| {
        par::for_each_chunk_mut(parallel, losses, per_task, |i, chunk| {
            with_scratch(v, |tmp| {
                for (r, loss) in chunk.iter_mut().enumerate() {
                    let row_index = i * per_task + r;
                    let row = &logits.data[row_index * v..(row_index + 1) * v];
                    let m = rows::max(row);
                    tmp.copy_from_slice(row);
                    let lse = m + rows::exp_sum(tmp, 1.0, m).ln();
                    *loss = lse - row[labels[row_index] as usize];
                }
            });
        });
        losses.iter().map(|&l| l as f64).sum::<f64>()
    });
    Ok((total / positions as f64) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close_in, in_pool, Precision, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn fast_matches_reference(
            lead in prop::collection::vec(1usize..5, 1..3),
            v in 1usize..70,
            precision in prop::sample::select(Precision::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let positions: usize = lead.iter().product();
            let mut shape = lead.clone();
            shape.push(v);
            let logits = precision.round_vec(rng.vec(positions * v, 6.0));
            let labels: Vec<i64> = (0..positions).map(|_| rng.below(v) as i64).collect();
            let t = TensorRef::new("t", &logits, &shape).unwrap();
            let want = reference::cross_entropy(t, &labels, &lead).unwrap();
            let params = RowParams { task_elems: 1, min_parallel_elems: 0 };
            let run = || cross_entropy(t, &labels, &lead, &params).unwrap();
            let one = in_pool(1, run);
            prop_assert_eq!(one.to_bits(), in_pool(2, run).to_bits());
            assert_close_in(precision, "cross_entropy", &[one], &want.data, 1e-5, 1e-5);
        }
    }

    #[test]
    fn bad_labels_are_errors() {
        let logits = [0.0f32; 6];
        let t = TensorRef::new("t", &logits, &[2, 3]).unwrap();
        let p = RowParams::default();
        assert!(cross_entropy(t, &[0, 3], &[2], &p).is_err());
        assert!(cross_entropy(t, &[0, -1], &[2], &p).is_err());
        assert!(cross_entropy(t, &[0], &[1], &p).is_err());
        assert!((cross_entropy(t, &[0, 2], &[2], &p).unwrap() - 3f32.ln()).abs() < 1e-6);
    }
}
