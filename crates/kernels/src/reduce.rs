//! `sum`, `mean`, `max` over any set of axes. Dims are merged into runs of kept / reduced dims;
//! one reduced run is reduced in place (contiguous rows with lane sums, or strided with vector
//! accumulation across the trailing kept dims); several are first transposed to the end.
//! [`square_sum`]: `Σ x²` over a whole tensor in one pass.

use serde::{Deserialize, Serialize};

use super::cpu::dispatch_avx2;
use super::error::{KernelError, KernelResult};
use super::par::{self, RowParams};
use super::rows::{self, max_step};
use super::scratch::with_scratch;
use super::shape::{check_len, normalize_axis};
use super::tensor::TensorRef;
use super::transpose::{transpose, TransposeParams};

/// Which reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// Sum (0 over nothing).
    Sum,
    /// Mean (NaN over nothing).
    Mean,
    /// Maximum (NaN if any element is NaN; an error over nothing).
    Max,
}

/// Normalises reduction axes (negative count from the end; no repeats) into a per-dim mask.
/// An empty list reduces nothing (NumPy's `axis=()`).
pub fn axes_mask(op: &'static str, axes: &[i64], rank: usize) -> KernelResult<Vec<bool>> {
    let mut mask = vec![false; rank];
    for &a in axes {
        let d = normalize_axis(op, a, rank)?;
        if std::mem::replace(&mut mask[d], true) {
            return Err(KernelError::new(
                op,
                format!("axes {axes:?} repeat axis {a}"),
            ));
        }
    }
    Ok(mask)
}

/// Output shape of a reduction: reduced dims dropped, or kept as 1 with `keepdim`.
pub fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&d, &r)| match (r, keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Runs of consecutive dims with the same reduced flag (size-1 dims dropped).
fn runs(shape: &[usize], mask: &[bool]) -> Vec<(usize, bool)> {
    let mut out: Vec<(usize, bool)> = Vec::new();
    for (&d, &r) in shape.iter().zip(mask).filter(|(&d, _)| d != 1) {
        match out.last_mut() {
            Some(last) if last.1 == r => last.0 *= d,
            _ => out.push((d, r)),
        }
    }
    out
}

#[inline(always)]
fn accumulate_body(acc: &mut [f32], x: &[f32], max: bool) {
    if max {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a = max_step(*a, v);
        }
    } else {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v;
        }
    }
}

dispatch_avx2! {
    /// acc = max(acc, x) or acc + x, elementwise.
    fn accumulate(acc: &mut [f32], x: &[f32], max: bool) = accumulate_body;
}

/// `sum` / `mean` / `max` of `x` over `axes` into `out` (shape [`reduced_shape`]).
pub fn reduce(
    x: TensorRef<'_>,
    op: ReduceOp,
    axes: &[i64],
    keepdim: bool,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "reduce";
    check_len(OP, "x", x.data.len(), x.shape)?;
    let mask = axes_mask(OP, axes, x.shape.len())?;
    check_len(
        OP,
        "out",
        out.len(),
        &reduced_shape(x.shape, &mask, keepdim),
    )?;
    let count: usize = x
        .shape
        .iter()
        .zip(&mask)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    if count == 0 {
        if op == ReduceOp::Max {
            return Err(KernelError::new(
                "max",
                "cannot take the maximum of no elements",
            ));
        }
        out.fill(if op == ReduceOp::Sum { 0.0 } else { f32::NAN });
        return Ok(());
    }
    if out.is_empty() {
        return Ok(());
    }
    let runs = runs(x.shape, &mask);
    let reduced_runs = runs.iter().filter(|r| r.1).count();
    if reduced_runs == 0 {
        out.copy_from_slice(x.data);
        return Ok(());
    }
    if reduced_runs == 1 {
        let at = runs.iter().position(|r| r.1).expect("one reduced run");
        let outer = runs[..at].iter().map(|r| r.0).product();
        let inner = runs[at + 1..].iter().map(|r| r.0).product();
        reduce3(x.data, outer, count, inner, op, params, out);
        return Ok(());
    }
    // Several reduced runs: move every reduced dim to the end, then reduce rows.
    let kept: Vec<i64> = (0..x.shape.len())
        .filter(|&d| !mask[d])
        .map(|d| d as i64)
        .collect();
    let reduced: Vec<i64> = (0..x.shape.len())
        .filter(|&d| mask[d])
        .map(|d| d as i64)
        .collect();
    let perm: Vec<i64> = kept.into_iter().chain(reduced).collect();
    let tp = TransposeParams {
        task_elems: params.task_elems,
        min_parallel_elems: params.min_parallel_elems,
        ..TransposeParams::default()
    };
    with_scratch(x.data.len(), |moved| {
        transpose(x, &perm, &tp, moved).map(|()| {
            reduce3(moved, out.len(), count, 1, op, params, out);
        })
    })
}

/// Elements per part of [`square_sum`]: parts fixed by the length alone, so the sum's order
/// (its bits) never depends on the pool.
const SQUARE_SUM_PART: usize = 1 << 15;

/// Scratch (in f32) [`square_sum`] asks for on `len` elements: one partial sum per part, and
/// one overflow check per part.
pub fn square_sum_scratch(len: usize) -> usize {
    2 * len.div_ceil(SQUARE_SUM_PART)
}

/// `square_sum`: `Σ x²` over all of `x` (0 for none), parts of [`SQUARE_SUM_PART`] elements
/// summed with lane sums, in parallel when `params` allow, the parts added in order in f64.
/// With `check`, also `Σ x·0` from the same pass ([`rows::sum_times_zero`] of each part while
/// it is in cache): 0, or NaN where any element is infinite or NaN (`square_sum_finite`); 0
/// without.
pub fn square_sum(x: &[f32], check: bool, params: &RowParams) -> (f32, f32) {
    let parts = x.len().div_ceil(SQUARE_SUM_PART);
    let parallel = x.len() >= params.min_parallel_elems;
    with_scratch(2 * parts, |sums| {
        par::for_each_chunk_mut(parallel, sums, 2, |part, sum| {
            let at = part * SQUARE_SUM_PART;
            let chunk = &x[at..(at + SQUARE_SUM_PART).min(x.len())];
            sum[0] = rows::sum_sq_dev(chunk, 0.0);
            sum[1] = if check {
                rows::sum_times_zero(chunk)
            } else {
                0.0
            };
        });
        let total = sums.iter().step_by(2).map(|&s| f64::from(s)).sum::<f64>() as f32;
        let finite = sums.iter().skip(1).step_by(2).fold(0.0, |a, &c| a + c);
        (total, finite)
    })
}

/// Reduces the middle dim of a `[outer, len, inner]` block into `[outer, inner]`.
fn reduce3(
    x: &[f32],
    outer: usize,
    len: usize,
    inner: usize,
    op: ReduceOp,
    params: &RowParams,
    out: &mut [f32],
) {
    let finish = |v: f32| {
        if op == ReduceOp::Mean {
            v / len as f32
        } else {
            v
        }
    };
    let max = op == ReduceOp::Max;
    let parallel = x.len() >= params.min_parallel_elems;
    if inner == 1 {
        let per_task = params.task_elems.div_ceil(len).max(1);
        par::for_each_chunk_mut(parallel, out, per_task, |i, chunk| {
            for (o, dst) in chunk.iter_mut().enumerate() {
                let row = &x[(i * per_task + o) * len..][..len];
                *dst = finish(if max { rows::max(row) } else { rows::sum(row) });
            }
        });
        return;
    }
    // Tasks own column segments of one output row each, so even outer = 1 splits.
    let seg = params.task_elems.div_ceil(len).clamp(1, inner);
    let segs = inner.div_ceil(seg);
    let out_ptr = par::SyncPtr(out.as_mut_ptr());
    par::for_each_index(parallel, outer * segs, |task| {
        let (o, c0) = (task / segs, task % segs * seg);
        let c1 = (c0 + seg).min(inner);
        // SAFETY: segment [c0, c1) of output row o belongs to this task alone, inside `out`.
        let acc =
            unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(o * inner + c0), c1 - c0) };
        let block = &x[o * len * inner..(o + 1) * len * inner];
        acc.copy_from_slice(&block[c0..c1]);
        for l in 1..len {
            accumulate(acc, &block[l * inner + c0..l * inner + c1], max);
        }
        if op == ReduceOp::Mean {
            rows::scale(acc, 1.0 / len as f32);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close_in, assert_same_bits, in_pool, Precision, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn fast_matches_reference(
            shape in prop::collection::vec(0usize..6, 0..5),
            axes_bits in any::<u8>(),
            keepdim in any::<bool>(),
            op in prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]),
            precision in prop::sample::select(Precision::ALL.to_vec()),
            task in prop::sample::select(vec![1usize, 5, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let axes: Vec<i64> = (0..shape.len() as i64).filter(|a| axes_bits >> a & 1 == 1).collect();
            let x = precision.round_vec(Rng::new(seed).vec(shape.iter().product(), 4.0));
            let t = TensorRef::new("t", &x, &shape).unwrap();
            let want = reference::reduce(t, op, &axes, keepdim);
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let mask = axes_mask("t", &axes, shape.len()).unwrap();
            let out_len: usize = reduced_shape(&shape, &mask, keepdim).iter().product();
            let run = || {
                let mut out = vec![f32::NAN; out_len];
                reduce(t, op, &axes, keepdim, &params, &mut out).map(|()| out)
            };
            match want {
                Err(_) => prop_assert!(run().is_err()),
                Ok(want) => {
                    let one = in_pool(1, run).unwrap();
                    assert_same_bits("threads", &one, &in_pool(2, run).unwrap());
                    // Sums of up to ~700 values of size <= 4, accumulated in f32.
                    assert_close_in(precision, "reduce", &one, &want.data, 1e-4, 1e-5);
                }
            }
        }
    }

    /// Against the f64 sum, on lengths from none to several parts, 1 and 2 threads giving the
    /// same bits; the tolerance covers f32 lane sums of up to 2^15 positive terms.
    #[test]
    fn square_sum_matches_reference() {
        let mut rng = Rng::new(17);
        let params = RowParams {
            min_parallel_elems: 0,
            ..RowParams::default()
        };
        for len in [
            0,
            1,
            7,
            100,
            SQUARE_SUM_PART,
            SQUARE_SUM_PART + 1,
            5 * SQUARE_SUM_PART - 3,
        ] {
            let x = rng.vec(len, 3.0);
            let (one, finite) = in_pool(1, || square_sum(&x, true, &params));
            let two = in_pool(2, || square_sum(&x, false, &params)).0;
            assert_eq!(one.to_bits(), two.to_bits(), "length {len}");
            assert_eq!(finite.to_bits(), 0, "length {len}");
            let shape = [len];
            let want = reference::square_sum(TensorRef::new("x", &x, &shape).unwrap()).unwrap();
            let tol = 1e-5 * want.data[0].max(1.0);
            assert!(
                (one - want.data[0]).abs() <= tol,
                "length {len}: {one} vs {}",
                want.data[0]
            );
        }
    }

    /// The overflow check finds an infinite or NaN element in any part (its square sum is
    /// infinite or NaN too), and only those: finite elements whose squares overflow leave it 0.
    #[test]
    fn square_sum_checks_for_non_finite_elements() {
        let params = RowParams {
            min_parallel_elems: 0,
            ..RowParams::default()
        };
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            for at in [0, 5, SQUARE_SUM_PART + 3] {
                let mut x = vec![-1.5; 2 * SQUARE_SUM_PART];
                x[at] = bad;
                let (total, finite) = in_pool(2, || square_sum(&x, true, &params));
                assert!(finite.is_nan(), "{bad} at {at}");
                assert!(!total.is_finite(), "{bad} at {at}");
                assert_eq!(square_sum(&x, false, &params).1, 0.0);
            }
        }
        let (total, finite) = square_sum(&[3e38, -3e38, 1.0], true, &params);
        assert_eq!((total, finite.to_bits()), (f32::INFINITY, 0));
    }

    #[test]
    fn max_propagates_nan_and_rejects_empty() {
        let x = [1.0, f32::NAN, 3.0, 4.0];
        let t = TensorRef::new("t", &x, &[2, 2]).unwrap();
        let mut out = [0.0; 2];
        reduce(
            t,
            ReduceOp::Max,
            &[1],
            false,
            &RowParams::default(),
            &mut out,
        )
        .unwrap();
        assert!(out[0].is_nan());
        assert_eq!(out[1], 4.0);
        let e = TensorRef::new("t", &[], &[0, 2]).unwrap();
        assert!(reduce(
            e,
            ReduceOp::Max,
            &[0],
            false,
            &RowParams::default(),
            &mut out
        )
        .is_err());
        assert!(reduce(
            t,
            ReduceOp::Sum,
            &[1, 1],
            false,
            &RowParams::default(),
            &mut out
        )
        .is_err());
    }
}
