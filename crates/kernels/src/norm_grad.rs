//! The input gradients of rms_norm and layer_norm over the last dim: each row's statistics
//! recomputed from `x` (as the forward computes them), then one fused pass, rows in parallel.

use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::rows;
use super::shape::check_len;
use super::tensor::TensorRef;

/// Last-dim length of `x`, checking `dy` and `out` against it.
fn grad_row_len(
    op: &'static str,
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    out: &[f32],
) -> KernelResult<usize> {
    check_len(op, "x", x.data.len(), x.shape)?;
    check_len(op, "out", out.len(), x.shape)?;
    if dy.shape != x.shape || dy.data.len() != x.data.len() {
        return Err(KernelError::new(
            op,
            format!("dy {:?} must have x's shape {:?}", dy.shape, x.shape),
        ));
    }
    x.shape
        .last()
        .copied()
        .ok_or_else(|| KernelError::new(op, "x needs at least one dimension"))
}

/// `Σ a·(b − shift)` over two equal-length rows, eight lanes at a time.
pub(crate) fn dot_shifted(a: &[f32], b: &[f32], shift: f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += xa[l] * (xb[l] - shift);
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * (y - shift)).sum();
    lanes.iter().sum::<f32>() + tail
}

/// Calls `row(x_row, dy_row, dx_row)` for every last-dim row of a norm's gradient, in row
/// groups across the pool (each row's statistics are recomputed from `x`).
fn for_each_grad_row(
    op: &'static str,
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    params: &RowParams,
    out: &mut [f32],
    row: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
) -> KernelResult<()> {
    let d = grad_row_len(op, x, dy, out)?;
    for_each_row_group(params, 2 * x.data.len(), out, d, |first, chunk| {
        let at = first * d..first * d + chunk.len();
        let (xs, gs) = (&x.data[at.clone()], &dy.data[at]);
        for ((xr, gr), or) in xs
            .chunks_exact(d)
            .zip(gs.chunks_exact(d))
            .zip(chunk.chunks_exact_mut(d))
        {
            row(xr, gr, or);
        }
    });
    Ok(())
}

/// `rms_norm_grad`: `dx = r·dy − x·r³·mean(dy·x)` with `r = rsqrt(mean(x²) + eps)` per row.
pub fn rms_norm_grad(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    eps: f64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    for_each_grad_row("rms_norm_grad", x, dy, params, out, |xr, gr, or| {
        let d = xr.len();
        let ms = rows::sum_sq_dev(xr, 0.0) as f64 / d as f64;
        let r = 1.0 / (ms + eps).sqrt();
        let c = (dot_shifted(gr, xr, 0.0) as f64 / d as f64 * r * r * r) as f32;
        let r = r as f32;
        for ((o, &xi), &gi) in or.iter_mut().zip(xr).zip(gr) {
            *o = r * gi - c * xi;
        }
    })
}

/// `layer_norm_grad`: `dx = r·(dy − mean(dy) − x̂·mean(dy·x̂))` with `x̂ = (x − mean)·r`,
/// `r = rsqrt(var + eps)` (biased variance) per row.
pub fn layer_norm_grad(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    eps: f64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    for_each_grad_row("layer_norm_grad", x, dy, params, out, |xr, gr, or| {
        let d = xr.len();
        let n = d as f32;
        // The mean as an f32 `hi` plus the small `lo` f32 cannot hold: when |mean| ≫ the
        // spread, `x − hi` is exact and `lo` keeps the deviations accurate, so a row of close
        // values (where the gradient is a small difference of large terms) loses no digits.
        let hi = rows::sum(xr) / n;
        let lo = rows::sum_dev(xr, hi) / n;
        let var = rows::sum_sq_dev(xr, hi) as f64 / d as f64 - f64::from(lo) * f64::from(lo);
        let r = (1.0 / (var.max(0.0) + eps).sqrt()) as f32;
        let gm = rows::sum(gr) / n;
        // r·x̂·mean(dy·x̂) = (x − mean)·r³·mean(dy·(x − mean)).
        let c = r * r * r * (dot_shifted(gr, xr, hi) - lo * rows::sum(gr)) / n;
        for ((o, &xi), &gi) in or.iter_mut().zip(xr).zip(gr) {
            *o = r * (gi - gm) - c * ((xi - hi) - lo);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close, assert_same_bits, in_pool, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Against the f64 reference on 1 and 2 threads (bit-identical between them); the
        /// tolerance covers f32 sums of up to 100 terms of O(1) values.
        #[test]
        fn fast_matches_reference(
            rows in 1usize..20,
            d in 1usize..100,
            rms in any::<bool>(),
            offset in -3.0f32..3.0,
            task in prop::sample::select(vec![1usize, 50, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let x: Vec<f32> = rng.vec(rows * d, 2.0).into_iter().map(|v| v + offset).collect();
            let g = rng.vec(rows * d, 1.0);
            let shape = [rows, d];
            let xt = TensorRef::new("t", &x, &shape).unwrap();
            let gt = TensorRef::new("t", &g, &shape).unwrap();
            let eps = 1e-5;
            let want = if rms {
                reference::rms_norm_grad(xt, gt, eps)
            } else {
                reference::layer_norm_grad(xt, gt, eps)
            }.unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                if rms {
                    rms_norm_grad(xt, gt, eps, &params, &mut out).unwrap();
                } else {
                    layer_norm_grad(xt, gt, eps, &params, &mut out).unwrap();
                }
                out
            };
            let one = in_pool(1, run);
            assert_same_bits("threads", &one, &in_pool(2, run));
            // dx is O(r·|dy|); r reaches 1/√eps for constant rows, hence the relative part.
            let scale = want.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert_close("norm grad", &one, &want.data, 5e-5 * scale, 1e-4);
        }
    }

    #[test]
    fn dy_must_match_x() {
        let x = [1.0f32; 6];
        let mut out = [0.0; 6];
        let t = TensorRef::new("t", &x, &[2, 3]).unwrap();
        let g = TensorRef::new("t", &x, &[3, 2]).unwrap();
        let p = RowParams::default();
        assert!(rms_norm_grad(t, g, 1e-5, &p, &mut out).is_err());
        assert!(layer_norm_grad(t, g, 1e-5, &p, &mut out).is_err());
        assert!(reference::layer_norm_grad(t, g, 1e-5).is_err());
    }
}
