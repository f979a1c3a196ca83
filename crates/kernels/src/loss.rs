//! `cross_entropy` and its gradient: per-row log-sum-exp in parallel, then (for the loss) a
//! fixed-order mean, so results never depend on the thread count.

use super::error::KernelResult;
use super::par::{self, RowParams};
use super::reference::loss::{cross_entropy_dims, CrossEntropyAttrs};
use super::rows;
use super::scratch::with_scratch;
use super::tensor::TensorRef;

/// The log-sum-exp of `row`, with `tmp` (as long as the row) as scratch.
fn lse(row: &[f32], tmp: &mut [f32]) -> f32 {
    let m = rows::max(row);
    tmp.copy_from_slice(row);
    m + rows::exp_sum(tmp, 1.0, m).ln()
}

/// `cross_entropy(logits [..., V], labels [...])`: the mean over the positions not labelled
/// `ignore_index` of `(1 - ε)·(lse(row) − row[label]) + ε·(lse(row) − mean(row))`, NaN when
/// every position is ignored. Other labels outside `0..V` are an error.
pub fn cross_entropy(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
    attrs: &CrossEntropyAttrs,
    params: &RowParams,
) -> KernelResult<f32> {
    let (positions, v, counted) = cross_entropy_dims(logits, labels, labels_shape, attrs)?;
    let eps = attrs.label_smoothing as f32;
    let per_task = params.task_elems.div_ceil(v.max(1)).max(1);
    let parallel = logits.data.len() >= params.min_parallel_elems;
    let total = with_scratch(positions, |losses| {
        par::for_each_chunk_mut(parallel, losses, per_task, |i, chunk| {
            with_scratch(v, |tmp| {
                for (r, loss) in chunk.iter_mut().enumerate() {
                    let row_index = i * per_task + r;
                    let label = labels[row_index];
                    if label == attrs.ignore_index {
                        *loss = 0.0;
                        continue;
                    }
                    let row = &logits.data[row_index * v..(row_index + 1) * v];
                    let lse = lse(row, tmp);
                    let nll = lse - row[label as usize];
                    *loss = if eps == 0.0 {
                        nll
                    } else {
                        let smooth = lse - rows::sum(row) / v as f32;
                        (1.0 - eps) * nll + eps * smooth
                    };
                }
            });
        });
        losses.iter().map(|&l| l as f64).sum::<f64>()
    });
    Ok((total / counted as f64) as f32)
}

/// `cross_entropy_grad(logits, labels, dloss)` into `out` (the logits' shape): each counted
/// row becomes `dloss / n · (softmax(row) − (1 − ε)·onehot(label) − ε / V)`, each ignored row
/// 0, `n` the number of counted rows.
pub fn cross_entropy_grad(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
    dloss: f32,
    attrs: &CrossEntropyAttrs,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    let (_, v, counted) = cross_entropy_dims(logits, labels, labels_shape, attrs)?;
    super::shape::check_len("cross_entropy_grad", "out", out.len(), logits.shape)?;
    let eps = attrs.label_smoothing as f32;
    let scale = dloss / counted as f32;
    let (off, hot) = (scale * eps / v as f32, scale * (1.0 - eps));
    par::for_each_row_group(params, out.len(), out, v, |first, chunk| {
        for (r, o) in chunk.chunks_mut(v).enumerate() {
            let row_index = first + r;
            let label = labels[row_index];
            if label == attrs.ignore_index {
                o.fill(0.0);
                continue;
            }
            let row = &logits.data[row_index * v..(row_index + 1) * v];
            let m = rows::max(row);
            o.copy_from_slice(row);
            let sum = rows::exp_sum(o, 1.0, m);
            // softmax · scale − ε·scale / V, then the label's one-hot share.
            rows::shift_scale(o, 0.0, scale / sum);
            for x in o.iter_mut() {
                *x -= off;
            }
            o[label as usize] -= hot;
        }
    });
    Ok(())
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
            // Some positions ignored (never all), some smoothing.
            let ignored = rng.below(3) as i64 - 100;
            let labels: Vec<i64> = labels.iter().enumerate()
                .map(|(i, &l)| if i > 0 && rng.below(4) == 0 { ignored } else { l })
                .collect();
            let attrs = CrossEntropyAttrs {
                ignore_index: ignored,
                label_smoothing: [0.0, 0.1, 1.0][rng.below(3)],
            };
            let want = reference::cross_entropy(t, &labels, &lead, &attrs).unwrap();
            let params = RowParams { task_elems: 1, min_parallel_elems: 0 };
            let run = || cross_entropy(t, &labels, &lead, &attrs, &params).unwrap();
            let one = in_pool(1, run);
            prop_assert_eq!(one.to_bits(), in_pool(2, run).to_bits());
            assert_close_in(precision, "cross_entropy", &[one], &want.data, 1e-5, 1e-5);
            let want = reference::cross_entropy_grad(t, &labels, &lead, 0.7, &attrs).unwrap();
            let run = || {
                let mut out = vec![0.0; logits.len()];
                cross_entropy_grad(t, &labels, &lead, 0.7, &attrs, &params, &mut out).unwrap();
                out
            };
            let one = in_pool(1, run);
            prop_assert_eq!(&one, &in_pool(2, run));
            assert_close_in(precision, "cross_entropy_grad", &one, &want.data, 1e-5, 1e-6);
        }
    }

    #[test]
    fn bad_labels_are_errors() {
        let logits = [0.0f32; 6];
        let t = TensorRef::new("t", &logits, &[2, 3]).unwrap();
        let p = RowParams::default();
        let a = CrossEntropyAttrs::default();
        assert!(cross_entropy(t, &[0, 3], &[2], &a, &p).is_err());
        assert!(cross_entropy(t, &[0, -1], &[2], &a, &p).is_err());
        assert!(cross_entropy(t, &[0], &[1], &a, &p).is_err());
        assert!((cross_entropy(t, &[0, 2], &[2], &a, &p).unwrap() - 3f32.ln()).abs() < 1e-6);
        assert!((cross_entropy(t, &[0, -100], &[2], &a, &p).unwrap() - 3f32.ln()).abs() < 1e-6);
        assert!(cross_entropy(t, &[-100, -100], &[2], &a, &p)
            .unwrap()
            .is_nan());
        let mut out = [0.0; 6];
        assert!(cross_entropy_grad(t, &[0, 7], &[2], 1.0, &a, &p, &mut out).is_err());
    }
}
