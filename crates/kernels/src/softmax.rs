//! softmax and log_softmax along any axis: rows (last axis) with vectorised max/exp/sum, other
//! axes vectorised across the trailing dims.

use super::cpu::dispatch_avx512;
use super::error::KernelResult;
use super::math;
use super::par::{for_each_row_group, RowParams};
use super::rows::{self, max_step};
use super::scratch::with_scratch;
use super::shape::{check_len, normalize_axis, split_at_axis};
use super::tensor::TensorRef;

/// `softmax(x, axis)` into `out` (same shape as x).
pub fn softmax(
    x: TensorRef<'_>,
    axis: i64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    run("softmax", x, axis, false, params, out)
}

/// `log_softmax(x, axis)` into `out` (same shape as x).
pub fn log_softmax(
    x: TensorRef<'_>,
    axis: i64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    run("log_softmax", x, axis, true, params, out)
}

fn run(
    op: &'static str,
    x: TensorRef<'_>,
    axis: i64,
    log: bool,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    check_len(op, "x", x.data.len(), x.shape)?;
    check_len(op, "out", out.len(), x.shape)?;
    let axis = normalize_axis(op, axis, x.shape.len())?;
    let (_, len, inner) = split_at_axis(x.shape, axis);
    let block = len * inner;
    for_each_row_group(params, x.data.len(), out, block, |first, chunk| {
        let src = &x.data[first * block..first * block + chunk.len()];
        for (xb, ob) in src.chunks_exact(block).zip(chunk.chunks_exact_mut(block)) {
            if inner == 1 {
                row(xb, ob, log);
            } else {
                with_scratch(2 * inner, |tmp| {
                    let (max, sum) = tmp.split_at_mut(inner);
                    strided(xb, ob, inner, log, max, sum);
                });
            }
        }
    });
    Ok(())
}

/// One contiguous row.
fn row(x: &[f32], out: &mut [f32], log: bool) {
    let m = rows::max(x);
    out.copy_from_slice(x);
    let s = rows::exp_sum(out, 1.0, m);
    if log {
        out.copy_from_slice(x);
        rows::shift_scale(out, m + s.ln(), 1.0);
    } else {
        rows::scale(out, 1.0 / s);
    }
}

#[inline(always)]
fn strided_body(
    x: &[f32],
    out: &mut [f32],
    inner: usize,
    log: bool,
    max: &mut [f32],
    sum: &mut [f32],
) {
    max.fill(f32::NEG_INFINITY);
    sum.fill(0.0);
    for xr in x.chunks_exact(inner) {
        for (m, &v) in max.iter_mut().zip(xr) {
            *m = max_step(*m, v);
        }
    }
    for (xr, or) in x.chunks_exact(inner).zip(out.chunks_exact_mut(inner)) {
        for (((o, &v), &m), s) in or.iter_mut().zip(xr).zip(max.iter()).zip(sum.iter_mut()) {
            *o = math::exp(v - m);
            *s += *o;
        }
    }
    if log {
        for (m, s) in max.iter_mut().zip(sum.iter()) {
            *m += s.ln();
        }
        for (xr, or) in x.chunks_exact(inner).zip(out.chunks_exact_mut(inner)) {
            for ((o, &v), &shift) in or.iter_mut().zip(xr).zip(max.iter()) {
                *o = v - shift;
            }
        }
    } else {
        for s in sum.iter_mut() {
            *s = 1.0 / *s;
        }
        for or in out.chunks_exact_mut(inner) {
            for (o, &r) in or.iter_mut().zip(sum.iter()) {
                *o *= r;
            }
        }
    }
}

dispatch_avx512! {
    /// One `[len, inner]` block, normalised along `len` for every inner position.
    fn strided(x: &[f32], out: &mut [f32], inner: usize, log: bool, max: &mut [f32], sum: &mut [f32]) = strided_body;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close_in, on_one_and_two_threads, Precision, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn fast_matches_reference(
            shape in prop::collection::vec(1usize..9, 1..4),
            axis_pick in 0usize..4,
            log in any::<bool>(),
            precision in prop::sample::select(Precision::ALL.to_vec()),
            task in prop::sample::select(vec![1usize, 7, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let axis = (axis_pick % shape.len()) as i64 - shape.len() as i64 * (axis_pick % 2) as i64;
            let x = precision.round_vec(Rng::new(seed).vec(shape.iter().product(), 8.0));
            let t = TensorRef::new("t", &x, &shape).unwrap();
            let want = if log { reference::log_softmax(t, axis) } else { reference::softmax(t, axis) }.unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                if log { log_softmax(t, axis, &params, &mut out) } else { softmax(t, axis, &params, &mut out) }.unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            assert_close_in(precision, "softmax", &one, &want.data, 1e-6, 1e-5);
        }
    }

    #[test]
    fn masked_and_invalid_rows() {
        let x = [0.0, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY];
        let mut out = [0.0; 4];
        softmax(
            TensorRef::new("t", &x, &[2, 2]).unwrap(),
            -1,
            &RowParams::default(),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [1.0, 0.0, 1.0, 0.0]);
        assert!(softmax(
            TensorRef::new("t", &x, &[4]).unwrap(),
            1,
            &RowParams::default(),
            &mut out
        )
        .is_err());
        assert!(softmax(
            TensorRef::new("t", &x, &[4]).unwrap(),
            0,
            &RowParams::default(),
            &mut out[..3]
        )
        .is_err());
    }
}
