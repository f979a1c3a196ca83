//! Rotary position embedding, rotate-half form (HF LLaMA), positions 0..S, on `[B, S, H, D]`.

use super::cpu::dispatch_avx2;
use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::reference::nn::dims4;
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;

#[inline(always)]
fn rotate_body(x: &[f32], out: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (x1, x2) = x.split_at(half);
    let (o1, o2) = out.split_at_mut(half);
    for i in 0..half {
        o1[i] = x1[i] * cos[i] - x2[i] * sin[i];
        o2[i] = x2[i] * cos[i] + x1[i] * sin[i];
    }
}

dispatch_avx2! {
    /// Rotates one head vector by the angles whose cosines and sines are given.
    fn rotate(x: &[f32], out: &mut [f32], cos: &[f32], sin: &[f32]) = rotate_body;
}

/// `rope(x, theta)` into `out`: for position s and i < D/2, angle `s · theta^(−2i/D)`,
/// `out[i] = x[i] cos − x[i + D/2] sin`, `out[i + D/2] = x[i + D/2] cos + x[i] sin`. The angles
/// are computed on every call; [`rope_table`] once and [`rope_cached`] give the same bits.
pub fn rope(x: TensorRef<'_>, theta: f64, params: &RowParams, out: &mut [f32]) -> KernelResult<()> {
    let [_, s, _, d] = dims4("rope", "x", x)?;
    check_len("rope", "out", out.len(), x.shape)?;
    if d % 2 != 0 {
        return Err(KernelError::new(
            "rope",
            format!("head dim {d} must be even"),
        ));
    }
    let shape = [2, s, d / 2];
    with_scratch(2 * s * (d / 2), |table| {
        rope_table(theta, s, d, table)?;
        rope_cached(
            x,
            TensorRef {
                data: table,
                shape: &shape,
            },
            params,
            out,
        )
    })
}

/// The cosines and then the sines of every position `0..positions` and frequency
/// `theta^(−2i/dim)`, `i < dim/2`, into `out` (`[2, positions, dim/2]`), each computed in f64
/// and rounded once.
pub fn rope_table(theta: f64, positions: usize, dim: usize, out: &mut [f32]) -> KernelResult<()> {
    if theta.is_nan() || theta <= 0.0 {
        return Err(KernelError::new(
            "rope",
            format!("theta {theta} must be positive"),
        ));
    }
    let half = dim / 2;
    check_len("rope_table", "out", out.len(), &[2, positions, half])?;
    let (cos, sin) = out.split_at_mut(positions * half);
    for pos in 0..positions {
        for i in 0..half {
            let angle = pos as f64 * theta.powf(-2.0 * i as f64 / dim as f64);
            cos[pos * half + i] = angle.cos() as f32;
            sin[pos * half + i] = angle.sin() as f32;
        }
    }
    Ok(())
}

/// `rope` of `x` with the angles of `table` (from [`rope_table`] for `x`'s positions and head
/// dim) into `out`.
pub fn rope_cached(
    x: TensorRef<'_>,
    table: TensorRef<'_>,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    let [_, s, h, d] = dims4("rope", "x", x)?;
    check_len("rope", "out", out.len(), x.shape)?;
    let half = d / 2;
    if d % 2 != 0 || table.shape != [2, s, half] || table.data.len() != 2 * s * half {
        return Err(KernelError::new(
            "rope",
            format!(
                "the table {:?} does not fit x {:?} (want [2, {s}, {half}])",
                table.shape, x.shape
            ),
        ));
    }
    let (cos, sin) = table.data.split_at(s * half);
    let row = h * d;
    for_each_row_group(params, x.data.len(), out, row, |first, chunk| {
        let src = &x.data[first * row..first * row + chunk.len()];
        for (r, (xr, or)) in src
            .chunks_exact(row)
            .zip(chunk.chunks_exact_mut(row))
            .enumerate()
        {
            let pos = (first + r) % s;
            let (c, sn) = (&cos[pos * half..][..half], &sin[pos * half..][..half]);
            for (xh, oh) in xr.chunks_exact(d).zip(or.chunks_exact_mut(d)) {
                rotate(xh, oh, c, sn);
            }
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
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn fast_matches_reference(
            b in 1usize..3, s in 1usize..40, h in 1usize..4, half in 1usize..40,
            theta in prop::sample::select(vec![10_000.0f64, 500_000.0, 2.0]),
            precision in prop::sample::select(Precision::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let shape = [b, s, h, 2 * half];
            let x = precision.round_vec(Rng::new(seed).vec(shape.iter().product(), 2.0));
            let t = TensorRef::new("t", &x, &shape).unwrap();
            let want = reference::rope(t, theta).unwrap();
            let params = RowParams { task_elems: 1, min_parallel_elems: 0 };
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                rope(t, theta, &params, &mut out).unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            // The table computed once gives the same bits as the angles computed per call.
            let mut table = vec![f32::NAN; 2 * s * half];
            rope_table(theta, s, 2 * half, &mut table).unwrap();
            let table_shape = [2, s, half];
            let table = TensorRef::new("table", &table, &table_shape).unwrap();
            let mut cached = vec![f32::NAN; x.len()];
            in_pool(2, || rope_cached(t, table, &params, &mut cached).unwrap());
            assert_same_bits("cached table", &one, &cached);
            // f32 cos/sin table and products: a few ulp of |x| <= 2.
            assert_close_in(precision, "rope", &one, &want.data, 2e-6, 1e-5);
            // The table's own reference (the tuner's guard for rope_cached) agrees too.
            let from_table = reference::rope_cached(t, table).unwrap();
            assert_close_in(precision, "rope_cached", &cached, &from_table.data, 2e-6, 1e-5);
        }
    }

    #[test]
    fn odd_head_dim_is_an_error() {
        let x = [0.0f32; 3];
        let mut out = [0.0; 3];
        let t = TensorRef::new("t", &x, &[1, 1, 1, 3]).unwrap();
        assert!(rope(t, 10_000.0, &RowParams::default(), &mut out).is_err());
        let t2 = TensorRef::new("t", &x[..2], &[1, 1, 1, 2]).unwrap();
        assert!(rope(t2, -1.0, &RowParams::default(), &mut out[..2]).is_err());
        // A table for another length or head dim is refused, not read out of bounds.
        let table = [1.0f32; 4];
        let wrong = TensorRef::new("table", &table, &[2, 2, 1]).unwrap();
        assert!(rope_cached(t2, wrong, &RowParams::default(), &mut out[..2]).is_err());
    }
}
