//! The input gradients of rms_norm and layer_norm over the last dim: each row's statistics
//! recomputed from `x` (as the forward computes them), then one fused pass, rows in parallel.

use super::cpu::dispatch_avx2;
use super::error::{KernelError, KernelResult};
use super::norm::row_stats;
use super::par::{self, for_each_row_group, RowParams, SyncPtr};
use super::rows;
use super::scratch::with_scratch;
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
        let (_, _, r) = row_stats(false, xr, eps);
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
        let n = xr.len() as f32;
        let (hi, lo, r) = row_stats(true, xr, eps);
        let r = r as f32;
        let gm = rows::sum(gr) / n;
        // r·x̂·mean(dy·x̂) = (x − mean)·r³·mean(dy·(x − mean)).
        let c = r * r * r * (dot_shifted(gr, xr, hi) - lo * rows::sum(gr)) / n;
        for ((o, &xi), &gi) in or.iter_mut().zip(xr).zip(gr) {
            *o = r * (gi - gm) - c * ((xi - hi) - lo);
        }
    })
}

/// Elements a part of [`norm_affine_grad`]'s parameter sums covers at least, and the most parts
/// a call splits into.
const MIN_PART_ELEMS: usize = 4096;
const MAX_PARTS: usize = 64;

/// `(rows per part, parts)` for `rows` rows of `d` values: fixed by the shape alone, so the
/// order of the parameter gradients' sums (their bits) never depends on the pool.
fn affine_grad_parts(rows: usize, d: usize) -> (usize, usize) {
    let per_part = rows
        .div_ceil(MAX_PARTS)
        .max(MIN_PART_ELEMS.div_ceil(d.max(1)))
        .max(1);
    (per_part, rows.div_ceil(per_part))
}

/// Scratch (in f32) [`norm_affine_grad`] asks for on `rows` rows of `d` values: the parts of
/// the parameter gradients' sums, and one row of `dy·w` per task.
pub fn norm_affine_grad_scratch(rows: usize, d: usize) -> usize {
    let (_, parts) = affine_grad_parts(rows, d);
    parts.saturating_mul(d).saturating_mul(2).saturating_add(d)
}

/// What the rows of one part of [`norm_affine_grad`] read: the norm's kind and `eps`, their
/// x and dy rows, and the per-feature w.
#[derive(Clone, Copy)]
struct AffinePart<'a> {
    centered: bool,
    eps: f64,
    x: &'a [f32],
    w: &'a [f32],
    dy: &'a [f32],
}

/// The rows of one part: their dx rows into `dx`, and their `Σ dy·n` (and, when `centered`,
/// `Σ dy`) over the rows into `dw` (and `db`), zeroed here. `dn` holds one row.
#[inline(always)]
fn affine_grad_part_body(part: AffinePart<'_>, [dn, dx, dw, db]: [&mut [f32]; 4]) {
    let AffinePart {
        centered,
        eps,
        x,
        w,
        dy,
    } = part;
    let d = w.len();
    dw.fill(0.0);
    if centered {
        db.fill(0.0);
    }
    for ((xr, gr), or) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
    {
        let (hi, lo, r) = row_stats(centered, xr, eps);
        for ((n, &g), &wi) in dn.iter_mut().zip(gr).zip(w) {
            *n = g * wi;
        }
        let sum_dn = if centered { rows::sum(dn) } else { 0.0 };
        let c =
            ((f64::from(dot_shifted(dn, xr, hi)) - f64::from(lo * sum_dn)) / d as f64 * r * r * r)
                as f32;
        let (r, gm) = (r as f32, sum_dn / d as f32);
        for i in 0..d {
            let centred = (xr[i] - hi) - lo;
            or[i] = r * (dn[i] - gm) - c * centred;
            dw[i] += gr[i] * (centred * r);
        }
        if centered {
            for (b, &g) in db.iter_mut().zip(gr) {
                *b += g;
            }
        }
    }
}

dispatch_avx2! {
    fn affine_grad_part(part: AffinePart<'_>, out: [&mut [f32]; 4]) = affine_grad_part_body;
}

/// `rms_norm_scale_grad` (`centered` false) / `layer_norm_affine_grad` (true): the gradients
/// of `y = norm(x)·w (+ b)` for a per-feature `w` (`[H]`) in one pass — `dx` into `dx` (the
/// norm's input gradient of `dy·w`), `dw = Σ dy·norm(x)` over the rows into `dw`, and for the
/// layer norm `db = Σ dy` into `db`. Rows run in parts fixed by the shape; the parts' sums are
/// added in order, so every result is bit-identical for any thread count.
#[allow(clippy::too_many_arguments)]
pub fn norm_affine_grad(
    centered: bool,
    x: TensorRef<'_>,
    w: &[f32],
    dy: TensorRef<'_>,
    eps: f64,
    params: &RowParams,
    dx: &mut [f32],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
) -> KernelResult<()> {
    let op = if centered {
        "layer_norm_affine_grad"
    } else {
        "rms_norm_scale_grad"
    };
    let d = grad_row_len(op, x, dy, dx)?;
    if w.len() != d || dw.len() != d || db.as_ref().is_some_and(|b| b.len() != d) {
        return Err(KernelError::new(
            op,
            format!("w and its gradients must hold one value per feature ({d})"),
        ));
    }
    if centered != db.is_some() {
        return Err(KernelError::new(
            op,
            "a layer norm has a bias gradient, an RMS norm none",
        ));
    }
    if d == 0 {
        dw.fill(0.0);
        if let Some(db) = db {
            db.fill(0.0);
        }
        return Ok(());
    }
    let rows = x.data.len() / d;
    let (per_part, parts) = affine_grad_parts(rows, d);
    let parallel = 2 * x.data.len() >= params.min_parallel_elems;
    with_scratch(2 * parts * d, |sums| {
        let (dw_parts, db_parts) = sums.split_at_mut(parts * d);
        let (dx_ptr, dw_ptr, db_ptr) = (
            SyncPtr(dx.as_mut_ptr()),
            SyncPtr(dw_parts.as_mut_ptr()),
            SyncPtr(db_parts.as_mut_ptr()),
        );
        par::for_each_index(parallel, parts, |part| {
            let first = part * per_part;
            let at = first * d..(first + per_part).min(rows) * d;
            // SAFETY: part `part` owns rows `at` of dx and row `part` of both part sums, each
            // inside its buffer (rows·d values, parts·d values) and disjoint from other parts'.
            let (dx, dw, db) = unsafe {
                (
                    std::slice::from_raw_parts_mut(dx_ptr.get().add(at.start), at.len()),
                    std::slice::from_raw_parts_mut(dw_ptr.get().add(part * d), d),
                    std::slice::from_raw_parts_mut(db_ptr.get().add(part * d), d),
                )
            };
            let part = AffinePart {
                centered,
                eps,
                x: &x.data[at.clone()],
                w,
                dy: &dy.data[at],
            };
            with_scratch(d, |dn| affine_grad_part(part, [dn, dx, dw, db]));
        });
        let add_parts = |out: &mut [f32], parts_sums: &[f32]| {
            out.copy_from_slice(&parts_sums[..d]);
            for part in parts_sums.chunks_exact(d).skip(1) {
                for (o, &p) in out.iter_mut().zip(part) {
                    *o += p;
                }
            }
        };
        add_parts(dw, dw_parts);
        if let Some(db) = db {
            add_parts(db, db_parts);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close, assert_same_bits, in_pool, on_one_and_two_threads, Rng};
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
            let one = on_one_and_two_threads(run);
            // dx is O(r·|dy|); r reaches 1/√eps for constant rows, hence the relative part.
            let scale = want.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert_close("norm grad", &one, &want.data, 5e-5 * scale, 1e-4);
        }

        /// The fused affine gradients against the f64 reference, on up to 300 rows (so the
        /// parameter sums span several parts) and 1 and 2 threads (bit-identical between them).
        #[test]
        fn affine_matches_reference(
            rows in 1usize..300,
            d in 1usize..80,
            centered in any::<bool>(),
            offset in -3.0f32..3.0,
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let x: Vec<f32> = rng.vec(rows * d, 2.0).into_iter().map(|v| v + offset).collect();
            let g = rng.vec(rows * d, 1.0);
            let w = rng.vec(d, 1.5);
            let shape = [rows, d];
            let xt = TensorRef::new("t", &x, &shape).unwrap();
            let gt = TensorRef::new("t", &g, &shape).unwrap();
            let wt = TensorRef::new("w", &w, &shape[1..]).unwrap();
            let eps = 1e-5;
            let want = reference::norm_affine_grad(centered, xt, wt, gt, eps).unwrap();
            let params = RowParams { task_elems: 1, min_parallel_elems: 0 };
            let run = || {
                let mut dx = vec![f32::NAN; x.len()];
                let (mut dw, mut db) = (vec![f32::NAN; d], vec![f32::NAN; d]);
                let db_out = centered.then_some(&mut db[..]);
                norm_affine_grad(centered, xt, &w, gt, eps, &params, &mut dx, &mut dw, db_out)
                    .unwrap();
                [dx, dw, db]
            };
            let one = in_pool(1, run);
            let two = in_pool(2, run);
            for (name, a, b) in [("dx", &one[0], &two[0]), ("dw", &one[1], &two[1])] {
                assert_same_bits(name, a, b);
            }
            let scale = |t: &[f32]| t.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert_close("dx", &one[0], &want[0].data, 5e-5 * scale(&want[0].data), 1e-4);
            // Sums of up to 300 terms, each O(|dy|·|x̂|).
            let sum_tol = 2e-6 * rows as f32;
            assert_close("dw", &one[1], &want[1].data, sum_tol * scale(&want[1].data), 1e-4);
            if centered {
                assert_same_bits("db", &one[2], &two[2]);
                assert_close("db", &one[2], &want[2].data, sum_tol * scale(&want[2].data), 1e-4);
            }
        }
    }

    #[test]
    fn affine_grad_checks_its_operands() {
        let x = [1.0f32; 6];
        let (mut dx, mut dw, mut db) = ([0.0f32; 6], [0.0f32; 3], [0.0f32; 3]);
        let t = TensorRef::new("t", &x, &[2, 3]).unwrap();
        let p = RowParams::default();
        let mut call = |centered: bool, w: usize, with_db: bool| {
            let db = with_db.then_some(&mut db[..]);
            norm_affine_grad(centered, t, &x[..w], t, 1e-5, &p, &mut dx, &mut dw, db).is_ok()
        };
        // w of the wrong length, a bias gradient for an RMS norm, none for a layer norm.
        assert!(!call(false, 2, false));
        assert!(!call(false, 3, true));
        assert!(!call(true, 3, false));
        assert!(call(true, 3, true));
        assert!(call(false, 3, false));
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
