//! rms_norm (+scale) and layer_norm (+affine) over the last dim, one vectorised pass per
//! statistic, rows in parallel; batch_norm with given statistics over channel planes.

use super::cpu::dispatch_avx2;
use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::rows;
use super::shape::check_len;
use super::tensor::TensorRef;

/// The per-feature vector of a norm's parameter: shape `[D]` (or `[1, ..., D]`).
fn feature_vector<'a>(
    op: &'static str,
    what: &str,
    p: TensorRef<'a>,
    d: usize,
) -> KernelResult<&'a [f32]> {
    check_len(op, what, p.data.len(), p.shape)?;
    let ok = p.shape.last() == Some(&d) && p.shape.iter().rev().skip(1).all(|&x| x == 1);
    if !ok {
        return Err(KernelError::new(
            op,
            format!(
                "{what} must have shape [{d}] (one value per feature), got {:?}",
                p.shape
            ),
        ));
    }
    Ok(p.data)
}

/// Last-dim length of `x`, checking `out` against it.
fn row_len(op: &'static str, x: TensorRef<'_>, out: &[f32]) -> KernelResult<usize> {
    check_len(op, "x", x.data.len(), x.shape)?;
    check_len(op, "out", out.len(), x.shape)?;
    x.shape
        .last()
        .copied()
        .ok_or_else(|| KernelError::new(op, "x needs at least one dimension"))
}

#[inline(always)]
fn scale_into_body(x: &[f32], out: &mut [f32], s: f32, w: &[f32]) {
    if w.is_empty() {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v * s;
        }
    } else {
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
            *o = v * s * g;
        }
    }
}

#[inline(always)]
fn normalize_into_body(
    x: &[f32],
    out: &mut [f32],
    (hi, lo): (f32, f32),
    inv: f32,
    g: &[f32],
    b: &[f32],
) {
    if g.is_empty() {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = ((v - hi) - lo) * inv;
        }
    } else {
        for (((o, &v), &gi), &bi) in out.iter_mut().zip(x).zip(g).zip(b) {
            *o = ((v - hi) - lo) * inv * gi + bi;
        }
    }
}

dispatch_avx2! {
    /// out = x · s (· w when w is non-empty).
    fn scale_into(x: &[f32], out: &mut [f32], s: f32, w: &[f32]) = scale_into_body;
}
dispatch_avx2! {
    /// out = (x − hi − lo) · inv (· g + b when g is non-empty), the mean split as in
    /// [`row_stats`].
    fn normalize_into(x: &[f32], out: &mut [f32], mean: (f32, f32), inv: f32, g: &[f32], b: &[f32]) = normalize_into_body;
}

/// `rms_norm` (weight `None`) or `rms_norm_scale` (weight `[D]`):
/// `x · rsqrt(mean(x²) + eps) [· w]` over the last dim.
pub fn rms_norm(
    x: TensorRef<'_>,
    weight: Option<TensorRef<'_>>,
    eps: f64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "rms_norm";
    let d = row_len(OP, x, out)?;
    let w = weight
        .map(|w| feature_vector(OP, "weight", w, d))
        .transpose()?
        .unwrap_or(&[]);
    for_each_row_group(params, x.data.len(), out, d, |first, chunk| {
        let src = &x.data[first * d..first * d + chunk.len()];
        for (xr, or) in src.chunks_exact(d).zip(chunk.chunks_exact_mut(d)) {
            let (_, _, inv) = row_stats(false, xr, eps);
            scale_into(xr, or, inv as f32, w);
        }
    });
    Ok(())
}

/// `layer_norm` (affine `None`) or `layer_norm_affine` (gain and bias `[D]`):
/// `(x − mean) · rsqrt(var + eps) [· g + b]` over the last dim, biased variance.
pub fn layer_norm(
    x: TensorRef<'_>,
    affine: Option<(TensorRef<'_>, TensorRef<'_>)>,
    eps: f64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "layer_norm";
    let d = row_len(OP, x, out)?;
    let (g, b): (&[f32], &[f32]) = match affine {
        Some((g, b)) => (
            feature_vector(OP, "gain", g, d)?,
            feature_vector(OP, "bias", b, d)?,
        ),
        None => (&[], &[]),
    };
    for_each_row_group(params, x.data.len(), out, d, |first, chunk| {
        let src = &x.data[first * d..first * d + chunk.len()];
        for (xr, or) in src.chunks_exact(d).zip(chunk.chunks_exact_mut(d)) {
            let (hi, lo, inv) = row_stats(true, xr, eps);
            normalize_into(xr, or, (hi, lo), inv as f32, g, b);
        }
    });
    Ok(())
}

/// A row's statistics, shared by the norms and their gradients: for a layer norm (`centered`)
/// the mean split as `hi + lo` and `r = rsqrt(var + eps)` (biased variance), for an RMS norm
/// `(0, 0, rsqrt(mean(x²) + eps))`. The mean as an f32 `hi` plus the small `lo` f32 cannot hold:
/// when |mean| ≫ the spread, `x − hi` is exact and `lo` keeps the deviations accurate, so a row
/// of close values (where the gradient is a small difference of large terms) loses no digits.
pub(crate) fn row_stats(centered: bool, xr: &[f32], eps: f64) -> (f32, f32, f64) {
    let d = xr.len() as f64;
    if !centered {
        let ms = rows::sum_sq_dev(xr, 0.0) as f64 / d;
        return (0.0, 0.0, 1.0 / (ms + eps).sqrt());
    }
    let n = xr.len() as f32;
    let hi = rows::sum(xr) / n;
    let lo = rows::sum_dev(xr, hi) / n;
    let var = rows::sum_sq_dev(xr, hi) as f64 / d - f64::from(lo) * f64::from(lo);
    (hi, lo, 1.0 / (var.max(0.0) + eps).sqrt())
}

#[inline(always)]
fn standardize_body(src: &[f32], dst: &mut [f32], mean: f64, std: f64) {
    for (o, &v) in dst.iter_mut().zip(src) {
        *o = ((f64::from(v) - mean) / std) as f32;
    }
}

dispatch_avx2! {
    /// `dst[i] = (src[i] − mean) / std`, computed in f64 and rounded once.
    fn standardize(src: &[f32], dst: &mut [f32], mean: f64, std: f64) = standardize_body;
}

/// `batch_norm(x [N, C, ...], mean [C], var [C])`: `(x − mean) / √(var + eps)` per channel,
/// in f64 rounded once (exactly the reference's values), channel planes in parallel.
pub fn batch_norm(
    x: TensorRef<'_>,
    mean: TensorRef<'_>,
    var: TensorRef<'_>,
    eps: f64,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "batch_norm";
    check_len(OP, "x", x.data.len(), x.shape)?;
    check_len(OP, "out", out.len(), x.shape)?;
    if x.shape.len() < 2 {
        return Err(KernelError::new(OP, "x must be [N, C, ...]"));
    }
    let c = x.shape[1];
    for (what, t) in [("mean", mean), ("var", var)] {
        check_len(OP, what, t.data.len(), t.shape)?;
        if t.shape != [c] {
            return Err(KernelError::new(
                OP,
                format!("{what} has shape {:?}, expected [{c}]", t.shape),
            ));
        }
    }
    let plane: usize = x.shape[2..].iter().product();
    for_each_row_group(params, x.data.len(), out, plane, |first, chunk| {
        let src = &x.data[first * plane..first * plane + chunk.len()];
        for (p, (xs, os)) in src
            .chunks_exact(plane)
            .zip(chunk.chunks_exact_mut(plane))
            .enumerate()
        {
            let ch = (first + p) % c;
            let std = (f64::from(var.data[ch]) + eps).sqrt();
            standardize(xs, os, f64::from(mean.data[ch]), std);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{
        assert_close_in, assert_same_bits, in_pool, on_one_and_two_threads, Precision, Rng,
    };
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn fast_matches_reference(
            rows in 1usize..20,
            d in 1usize..100,
            affine in any::<bool>(),
            rms in any::<bool>(),
            offset in -3.0f32..3.0,
            precision in prop::sample::select(Precision::ALL.to_vec()),
            task in prop::sample::select(vec![1usize, 50, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let x: Vec<f32> = rng.vec(rows * d, 2.0).into_iter().map(|v| v + offset).collect();
            let x = precision.round_vec(x);
            let g = precision.round_vec(rng.vec(d, 1.5));
            let b = precision.round_vec(rng.vec(d, 1.0));
            let shape = [rows, d];
            let xt = TensorRef::new("t", &x, &shape).unwrap();
            let gv = TensorRef::new("t", &g, std::slice::from_ref(&d)).unwrap();
            let bv = TensorRef::new("t", &b, std::slice::from_ref(&d)).unwrap();
            let eps = 1e-5;
            let want = match (rms, affine) {
                (true, false) => reference::rms_norm(xt, eps),
                (true, true) => reference::rms_norm_scale(xt, gv, eps),
                (false, false) => reference::layer_norm(xt, eps),
                (false, true) => reference::layer_norm_affine(xt, gv, bv, eps),
            }.unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                if rms {
                    rms_norm(xt, affine.then_some(gv), eps, &params, &mut out).unwrap();
                } else {
                    layer_norm(xt, affine.then_some((gv, bv)), eps, &params, &mut out).unwrap();
                }
                out
            };
            let one = on_one_and_two_threads(run);
            assert_close_in(precision, "norm", &one, &want.data, 2e-5, 1e-5);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn batch_norm_gives_the_reference_bits(
            shape in prop::collection::vec(1usize..6, 2..5),
            task in prop::sample::select(vec![1usize, 7, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let c = shape[1];
            let x = rng.vec(shape.iter().product(), 3.0);
            let mean = rng.vec(c, 1.0);
            let var: Vec<f32> = rng.vec(c, 2.0).into_iter().map(f32::abs).collect();
            let xt = TensorRef::new("t", &x, &shape).unwrap();
            let channels = [c];
            let mt = TensorRef::new("t", &mean, &channels).unwrap();
            let vt = TensorRef::new("t", &var, &channels).unwrap();
            let want = reference::batch_norm(xt, mt, vt, 1e-5).unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                batch_norm(xt, mt, vt, 1e-5, &params, &mut out).unwrap();
                out
            };
            assert_same_bits("batch_norm, 1 thread", &in_pool(1, run), &want.data);
            assert_same_bits("batch_norm, 2 threads", &in_pool(2, run), &want.data);
        }
    }

    /// Rows of two close values far from zero: the f32 mean alone cannot hold their midpoint,
    /// and `x − mean` is then divided by a spread of a few ulps' worth of the offset.
    #[test]
    fn close_values_far_from_zero_normalize_to_the_reference() {
        let mut rng = Rng::new(7);
        let x: Vec<f32> = rng
            .vec(400, 3e-3)
            .into_iter()
            .enumerate()
            .map(|(i, v)| 2.5 + (i / 2 % 7) as f32 * 0.07 + v)
            .collect();
        let shape = [200, 2];
        let xt = TensorRef::new("t", &x, &shape).unwrap();
        let want = reference::layer_norm(xt, 1e-5).unwrap();
        let mut out = vec![f32::NAN; x.len()];
        layer_norm(xt, None, 1e-5, &RowParams::default(), &mut out).unwrap();
        assert_close_in(Precision::F32, "layer_norm", &out, &want.data, 4e-6, 1e-6);
    }

    #[test]
    fn parameters_must_be_per_feature() {
        let x = [1.0f32; 6];
        let mut out = [0.0; 6];
        let t = TensorRef::new("t", &x, &[2, 3]).unwrap();
        let w = TensorRef::new("t", &x[..2], &[2]).unwrap();
        assert!(rms_norm(t, Some(w), 1e-5, &RowParams::default(), &mut out).is_err());
        let w13 = TensorRef::new("t", &x[..3], &[1, 3]).unwrap();
        assert!(rms_norm(t, Some(w13), 1e-5, &RowParams::default(), &mut out).is_ok());
        let s = TensorRef::new("t", &x[..1], &[]).unwrap();
        assert!(layer_norm(s, None, 1e-5, &RowParams::default(), &mut out[..1]).is_err());
    }
}
