//! The table gradient of `embedding`: a scatter-add of the output cotangent rows into the rows
//! their ids name, split over table rows so that no two threads write one row.

use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::reference::nn_grad::embedding_grad_width;
use super::tensor::TensorRef;

/// `embedding_grad(ids, dy)` into `out` (`[vocab, H]`): row v is the sum, in position order, of
/// the `dy` rows whose id is v. Each task owns a range of table rows and scans every id for
/// those in its range, so repeated ids add up without races and the result does not depend on
/// the thread count. An id outside `0..vocab` is an error and nothing is written.
pub fn embedding_grad(
    ids: &[i64],
    ids_shape: &[usize],
    dy: TensorRef<'_>,
    vocab: usize,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "embedding_grad";
    let h = embedding_grad_width(OP, ids, ids_shape, dy, vocab)?;
    if vocab.checked_mul(h) != Some(out.len()) {
        return Err(KernelError::new(
            OP,
            format!("out has {} elements, expected {vocab} × {h}", out.len()),
        ));
    }
    if h == 0 {
        return Ok(());
    }
    let work = out.len().saturating_add(dy.data.len());
    for_each_row_group(params, work, out, h, |first, chunk| {
        chunk.fill(0.0);
        let rows = first..first + chunk.len() / h;
        for (p, &id) in ids.iter().enumerate() {
            let r = id as usize;
            if rows.contains(&r) {
                let dst = &mut chunk[(r - first) * h..][..h];
                for (o, &g) in dst.iter_mut().zip(&dy.data[p * h..][..h]) {
                    *o += g;
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close, on_one_and_two_threads, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Few vocab rows and many ids, so ids repeat; 1 and 2 threads give the same bits, and
        /// the f32 sums of at most 40 rows agree with the f64 reference to 1e-5.
        #[test]
        fn scatter_adds_like_the_reference(
            v in 1usize..12, h in 1usize..20, n in 0usize..40,
            task in prop::sample::select(vec![1usize, 7, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let dy = rng.vec(n * h, 1.0);
            let ids: Vec<i64> = (0..n).map(|_| rng.below(v) as i64).collect();
            let shape = [n, h];
            let g = TensorRef::new("t", &dy, &shape).unwrap();
            let want = reference::embedding_grad(&ids, &[n], g, v).unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; v * h];
                embedding_grad(&ids, &[n], g, v, &params, &mut out).unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            assert_close("embedding_grad", &one, &want.data, 1e-5, 1e-5);
        }
    }

    #[test]
    fn out_of_range_ids_are_errors() {
        let dy = [1.0f32; 2];
        let g = TensorRef::new("t", &dy, &[1, 2]).unwrap();
        let mut out = [7.0; 6];
        for id in [-1i64, 3] {
            assert!(embedding_grad(&[id], &[1], g, 3, &RowParams::default(), &mut out).is_err());
            assert!(reference::embedding_grad(&[id], &[1], g, 3).is_err());
        }
        assert_eq!(out, [7.0; 6]);
    }
}
