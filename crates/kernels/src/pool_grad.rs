//! The input gradients of the pools: each task owns whole input planes and adds every output
//! cell's cotangent of its planes into the cells its window covers, so no two threads write one
//! value and the order of the additions never depends on the thread count.

use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::pool::{
    adaptive_output_shape, adaptive_range, pool2d_output_shape, Pool2dAttrs, PoolKind,
};
use super::shape::check_len;
use super::tensor::TensorRef;

/// Checks `dy` against the pool's output and `out` against `x`.
fn check(
    op: &'static str,
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    y: [usize; 4],
    out: &[f32],
) -> KernelResult<()> {
    check_len(op, "dy", dy.data.len(), dy.shape)?;
    check_len(op, "out", out.len(), x.shape)?;
    if dy.shape != y {
        return Err(KernelError::new(
            op,
            format!("dy {:?} must be the pool's output {y:?}", dy.shape),
        ));
    }
    Ok(())
}

/// `max_pool2d_grad` / `avg_pool2d_grad` into `out` (x's shape). Max: each window's cotangent
/// goes to its first maximum (a NaN takes over, as in the forward and PyTorch); a window of
/// -inf only sends it to its first cell. Average: `dy / (kh·kw)` to every cell of the window
/// inside the input (padding counted in the divisor).
pub fn pool2d_grad(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    kind: PoolKind,
    a: &Pool2dAttrs,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "pool2d_grad";
    let y = pool2d_output_shape(x, a)?;
    check(OP, x, dy, y, out)?;
    let [_, _, oh, ow] = y;
    let (h, w) = (x.shape[2], x.shape[3]);
    let divisor = (a.kernel[0] * a.kernel[1]) as f32;
    let work = dy.data.len().saturating_mul(a.kernel[0] * a.kernel[1]);
    for_each_row_group(params, work, out, h * w, |first, chunk| {
        chunk.fill(0.0);
        for (p, dx) in chunk.chunks_exact_mut(h * w).enumerate() {
            let plane = &x.data[(first + p) * h * w..][..h * w];
            let dyp = &dy.data[(first + p) * oh * ow..][..oh * ow];
            for oy in 0..oh {
                let y0 = (oy * a.stride[0]).saturating_sub(a.padding[0]);
                let y1 = (oy * a.stride[0] + a.kernel[0])
                    .saturating_sub(a.padding[0])
                    .min(h);
                for ox in 0..ow {
                    let x0 = (ox * a.stride[1]).saturating_sub(a.padding[1]);
                    let x1 = (ox * a.stride[1] + a.kernel[1])
                        .saturating_sub(a.padding[1])
                        .min(w);
                    let g = dyp[oy * ow + ox];
                    match kind {
                        PoolKind::Max => {
                            let (mut best, mut max) = (y0 * w + x0, f32::NEG_INFINITY);
                            for yy in y0..y1 {
                                for xx in x0..x1 {
                                    let v = plane[yy * w + xx];
                                    if v > max || v.is_nan() {
                                        (best, max) = (yy * w + xx, v);
                                    }
                                }
                            }
                            if y0 < y1 && x0 < x1 {
                                dx[best] += g;
                            }
                        }
                        PoolKind::Avg => {
                            let share = g / divisor;
                            for yy in y0..y1 {
                                for v in &mut dx[yy * w + x0..yy * w + x1] {
                                    *v += share;
                                }
                            }
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

/// `adaptive_avg_pool2d_grad` into `out` (x's shape): each output cell's cotangent divided by
/// its bin's size and added to every cell of the bin (PyTorch's bin edges).
pub fn adaptive_avg_pool2d_grad(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    output: [usize; 2],
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "adaptive_avg_pool2d_grad";
    let y = adaptive_output_shape(x, output)?;
    check(OP, x, dy, y, out)?;
    let [oh, ow] = output;
    let (h, w) = (x.shape[2], x.shape[3]);
    for_each_row_group(params, 2 * x.data.len(), out, h * w, |first, chunk| {
        chunk.fill(0.0);
        for (p, dx) in chunk.chunks_exact_mut(h * w).enumerate() {
            let dyp = &dy.data[(first + p) * oh * ow..][..oh * ow];
            for oy in 0..oh {
                let (y0, y1) = adaptive_range(oy, oh, h);
                for ox in 0..ow {
                    let (x0, x1) = adaptive_range(ox, ow, w);
                    let share = dyp[oy * ow + ox] / ((y1 - y0) * (x1 - x0)) as f32;
                    for yy in y0..y1 {
                        for v in &mut dx[yy * w + x0..yy * w + x1] {
                            *v += share;
                        }
                    }
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
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// All three pools against the f64 reference, values drawn from a few levels so windows
        /// have tied maxima; 1 and 2 threads agree bit for bit.
        #[test]
        fn fast_matches_reference(
            n in 1usize..3, c in 1usize..3, h in 1usize..9, w in 1usize..9,
            kh in 1usize..4, kw in 1usize..4, sh in 1usize..3, sw in 1usize..3,
            ph in 0usize..2, pw in 0usize..2, oh in 1usize..5, ow in 1usize..5,
            task in prop::sample::select(vec![1usize, 20, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let xs = [n, c, h, w];
            let x: Vec<f32> = (0..n * c * h * w).map(|_| rng.below(4) as f32).collect();
            let xt = TensorRef::new("t", &x, &xs).unwrap();
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let a = Pool2dAttrs {
                kernel: [kh, kw],
                stride: [sh, sw],
                padding: [ph.min(kh / 2), pw.min(kw / 2)],
            };
            if let Ok(y) = pool2d_output_shape(xt, &a) {
                let dy = rng.vec(y.iter().product(), 1.0);
                let dyt = TensorRef::new("t", &dy, &y).unwrap();
                for kind in [PoolKind::Max, PoolKind::Avg] {
                    let want = reference::pool2d_grad(xt, dyt, kind, &a).unwrap();
                    let run = || {
                        let mut out = vec![f32::NAN; x.len()];
                        pool2d_grad(xt, dyt, kind, &a, &params, &mut out).unwrap();
                        out
                    };
                    let one = on_one_and_two_threads(run);
                    assert_close("pool grad", &one, &want.data, 1e-5, 1e-5);
                }
            }
            let y = [n, c, oh, ow];
            let dy = rng.vec(y.iter().product(), 1.0);
            let dyt = TensorRef::new("t", &dy, &y).unwrap();
            let want = reference::adaptive_avg_pool2d_grad(xt, dyt, [oh, ow]).unwrap();
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                adaptive_avg_pool2d_grad(xt, dyt, [oh, ow], &params, &mut out).unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            assert_close("adaptive grad", &one, &want.data, 1e-5, 1e-5);
        }
    }

    #[test]
    fn ties_go_to_the_first_maximum() {
        let x = [1.0f32, 3.0, 3.0, 2.0];
        let xt = TensorRef::new("t", &x, &[1, 1, 2, 2]).unwrap();
        let dy = [5.0f32];
        let dyt = TensorRef::new("t", &dy, &[1, 1, 1, 1]).unwrap();
        let a = Pool2dAttrs {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        let mut out = [f32::NAN; 4];
        pool2d_grad(xt, dyt, PoolKind::Max, &a, &RowParams::default(), &mut out).unwrap();
        assert_eq!(out, [0.0, 5.0, 0.0, 0.0]);
    }
}
