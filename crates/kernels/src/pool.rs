//! Pooling: max_pool2d, avg_pool2d (padding counted, PyTorch's default), adaptive_avg_pool2d.

use serde::{Deserialize, Serialize};

use super::conv::window_output;
use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::rows::max_step;
use super::shape::check_len;
use super::tensor::TensorRef;

/// The attributes of `max_pool2d` / `avg_pool2d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool2dAttrs {
    /// Window (h, w); at least 1.
    pub kernel: [usize; 2],
    /// Step (h, w); at least 1.
    pub stride: [usize; 2],
    /// Implicit padding on each side (h, w); at most half the window, as PyTorch requires.
    pub padding: [usize; 2],
}

/// Which pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Maximum over the window (padding never wins).
    Max,
    /// Mean over the window, padding counted as zeros.
    Avg,
}

/// Checks `x [N, C, H, W]` against pooling attributes and returns `[N, C, oh, ow]`.
pub fn pool2d_output_shape(x: TensorRef<'_>, a: &Pool2dAttrs) -> KernelResult<[usize; 4]> {
    const OP: &str = "pool2d";
    check_len(OP, "x", x.data.len(), x.shape)?;
    let &[n, c, h, w] = x.shape else {
        return Err(KernelError::new(
            OP,
            format!("x must be [N, C, H, W], got {:?}", x.shape),
        ));
    };
    if a.kernel.contains(&0) || a.stride.contains(&0) {
        return Err(KernelError::new(
            OP,
            format!("kernel and stride must be at least 1: {a:?}"),
        ));
    }
    if a.padding[0] > a.kernel[0] / 2 || a.padding[1] > a.kernel[1] / 2 {
        return Err(KernelError::new(
            OP,
            format!("padding must be at most half the kernel: {a:?}"),
        ));
    }
    let oh = window_output(OP, h, a.padding[0], a.kernel[0], 1, a.stride[0])?;
    let ow = window_output(OP, w, a.padding[1], a.kernel[1], 1, a.stride[1])?;
    Ok([n, c, oh, ow])
}

/// Checks `x [N, C, H, W]` and an adaptive output size, returning `[N, C, oh, ow]`.
pub fn adaptive_output_shape(x: TensorRef<'_>, output: [usize; 2]) -> KernelResult<[usize; 4]> {
    const OP: &str = "adaptive_avg_pool2d";
    check_len(OP, "x", x.data.len(), x.shape)?;
    let &[n, c, h, w] = x.shape else {
        return Err(KernelError::new(
            OP,
            format!("x must be [N, C, H, W], got {:?}", x.shape),
        ));
    };
    if output.contains(&0) || h == 0 || w == 0 {
        return Err(KernelError::new(
            OP,
            format!("cannot pool {:?} to {output:?}", x.shape),
        ));
    }
    Ok([n, c, output[0], output[1]])
}

/// Input range `[start, end)` pooled into adaptive output cell `i` of `out` over `len`.
pub fn adaptive_range(i: usize, out: usize, len: usize) -> (usize, usize) {
    (i * len / out, ((i + 1) * len).div_ceil(out))
}

/// One output row of a window pooling: the window's rows `[y0, y1)` of the plane, columns from
/// each output's start (clipped to the input).
fn pool_row(
    plane: &[f32],
    w: usize,
    rows: (usize, usize),
    kind: PoolKind,
    a: &Pool2dAttrs,
    out: &mut [f32],
) {
    let divisor = (a.kernel[0] * a.kernel[1]) as f32;
    for (ox, o) in out.iter_mut().enumerate() {
        let start = ox * a.stride[1];
        let x0 = start.saturating_sub(a.padding[1]);
        let x1 = (start + a.kernel[1]).saturating_sub(a.padding[1]).min(w);
        let mut max = f32::NEG_INFINITY;
        let mut sum = 0.0f32;
        for y in rows.0..rows.1 {
            for &v in &plane[y * w + x0..y * w + x1] {
                max = max_step(max, v);
                sum += v;
            }
        }
        *o = match kind {
            PoolKind::Max => max,
            PoolKind::Avg => sum / divisor,
        };
    }
}

/// `max_pool2d` / `avg_pool2d` of `x [N, C, H, W]` into `out` (`[N, C, oh, ow]`), planes in
/// parallel.
pub fn pool2d(
    x: TensorRef<'_>,
    kind: PoolKind,
    attrs: &Pool2dAttrs,
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    let shape = pool2d_output_shape(x, attrs)?;
    check_len("pool2d", "out", out.len(), &shape)?;
    let [_, _, oh, ow] = shape;
    let (h, w) = (x.shape[2], x.shape[3]);
    // Tasks are sized by the input they read (a plane's output is a quarter of it or less).
    let planes_per_task = (params.task_elems / (h * w).max(1)).max(1);
    let task = RowParams {
        task_elems: planes_per_task * oh * ow,
        ..params.clone()
    };
    for_each_row_group(&task, x.data.len(), out, oh * ow, |first, chunk| {
        // On the stack: a warm step allocates nothing.
        let mut columns = [0.0f32; MAX_ROW_COLUMNS];
        for (p, dst) in chunk.chunks_exact_mut(oh * ow).enumerate() {
            let plane = &x.data[(first + p) * h * w..][..h * w];
            for (oy, row) in dst.chunks_exact_mut(ow).enumerate() {
                let start = oy * attrs.stride[0];
                let y0 = start.saturating_sub(attrs.padding[0]);
                let y1 = (start + attrs.kernel[0])
                    .saturating_sub(attrs.padding[0])
                    .min(h);
                match kind {
                    PoolKind::Max if w <= MAX_ROW_COLUMNS => {
                        max_row(plane, w, (y0, y1), attrs, &mut columns[..w], row)
                    }
                    _ => pool_row(plane, w, (y0, y1), kind, attrs, row),
                }
            }
        }
    });
    Ok(())
}

/// Widest input row [`max_row`] takes (its column maxima live on the stack); wider ones are
/// pooled a window at a time.
const MAX_ROW_COLUMNS: usize = 1024;

/// One output row of a max pooling, the window's rows reduced first into `columns` (one
/// maximum per input column, over whole rows at a time, which vectorizes), then each output's
/// columns of it. The maximum of a set is the same whatever the order (a NaN wins either way),
/// so this is [`pool_row`]'s result.
fn max_row(
    plane: &[f32],
    w: usize,
    rows: (usize, usize),
    a: &Pool2dAttrs,
    columns: &mut [f32],
    out: &mut [f32],
) {
    columns.fill(f32::NEG_INFINITY);
    for y in rows.0..rows.1 {
        for (c, &v) in columns.iter_mut().zip(&plane[y * w..][..w]) {
            *c = max_step(*c, v);
        }
    }
    for (ox, o) in out.iter_mut().enumerate() {
        let start = ox * a.stride[1];
        let x0 = start.saturating_sub(a.padding[1]);
        let x1 = (start + a.kernel[1]).saturating_sub(a.padding[1]).min(w);
        *o = columns[x0..x1]
            .iter()
            .fold(f32::NEG_INFINITY, |m, &v| max_step(m, v));
    }
}

/// `adaptive_avg_pool2d` of `x [N, C, H, W]` into `out` (`[N, C, oh, ow]`), planes in parallel.
pub fn adaptive_avg_pool2d(
    x: TensorRef<'_>,
    output: [usize; 2],
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    let shape = adaptive_output_shape(x, output)?;
    check_len("adaptive_avg_pool2d", "out", out.len(), &shape)?;
    let (h, w) = (x.shape[2], x.shape[3]);
    let [oh, ow] = output;
    for_each_row_group(params, x.data.len(), out, oh * ow, |first, chunk| {
        for (p, dst) in chunk.chunks_exact_mut(oh * ow).enumerate() {
            let plane = &x.data[(first + p) * h * w..][..h * w];
            for (oy, row) in dst.chunks_exact_mut(ow).enumerate() {
                let (y0, y1) = adaptive_range(oy, oh, h);
                for (ox, o) in row.iter_mut().enumerate() {
                    let (x0, x1) = adaptive_range(ox, ow, w);
                    let sum: f32 = (y0..y1)
                        .map(|y| plane[y * w + x0..y * w + x1].iter().sum::<f32>())
                        .sum();
                    *o = sum / ((y1 - y0) * (x1 - x0)) as f32;
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
    use crate::testing::{
        assert_close_in, assert_same_bits, on_one_and_two_threads, Precision, Rng,
    };
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn pooling_matches_reference(
            n in 1usize..3, c in 1usize..3, h in 1usize..12, w in 1usize..12,
            kernel in (1usize..4, 1usize..4), stride in (1usize..4, 1usize..4), pad in (0usize..2, 0usize..2),
            max in any::<bool>(),
            adaptive in (1usize..6, 1usize..6),
            precision in prop::sample::select(Precision::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let shape = [n, c, h, w];
            let x = precision.round_vec(Rng::new(seed).vec(shape.iter().product(), 2.0));
            let t = TensorRef::new("t", &x, &shape).unwrap();
            let attrs = Pool2dAttrs { kernel: [kernel.0, kernel.1], stride: [stride.0, stride.1], padding: [pad.0, pad.1] };
            let kind = if max { PoolKind::Max } else { PoolKind::Avg };
            let params = RowParams { task_elems: 1, min_parallel_elems: 0 };
            match reference::pool2d(t, kind, &attrs) {
                Err(_) => prop_assert!(pool2d(t, kind, &attrs, &params, &mut [0.0]).is_err()),
                Ok(want) => {
                    let run = || {
                        let mut out = vec![f32::NAN; want.data.len()];
                        pool2d(t, kind, &attrs, &params, &mut out).unwrap();
                        out
                    };
                    let one = on_one_and_two_threads(run);
                    assert_close_in(precision, "pool2d", &one, &want.data, 1e-6, 1e-6);
                }
            }
            let output = [adaptive.0, adaptive.1];
            let want = reference::adaptive_avg_pool2d(t, output).unwrap();
            let run = || {
                let mut out = vec![f32::NAN; want.data.len()];
                adaptive_avg_pool2d(t, output, &params, &mut out).unwrap();
                out
            };
            let one = on_one_and_two_threads(run);
            assert_close_in(precision, "adaptive", &one, &want.data, 1e-6, 1e-6);
        }
    }

    #[test]
    fn a_nan_in_a_max_window_wins_wherever_it_stands() {
        // 1 x 1 x 4 x 4, 3 x 3 windows, stride 2, padding 1: 2 x 2 outputs, the NaN at (2, 3)
        // in the windows of outputs (1, 1) only — in a column the row reduction keeps.
        let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        x[2 * 4 + 3] = f32::NAN;
        let t = TensorRef::new("t", &x, &[1, 1, 4, 4]).unwrap();
        let attrs = Pool2dAttrs {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
        };
        let mut out = [0.0; 4];
        let params = RowParams::default();
        pool2d(t, PoolKind::Max, &attrs, &params, &mut out).unwrap();
        assert_eq!(out[..3], [5.0, 7.0, 13.0]);
        assert!(out[3].is_nan());
    }

    #[test]
    fn rows_wider_than_the_stack_buffer_are_pooled_a_window_at_a_time() {
        let (h, w) = (3, MAX_ROW_COLUMNS + 3);
        let (x, shape) = (Rng::new(7).vec(h * w, 2.0), [1, 1, h, w]);
        let t = TensorRef::new("t", &x, &shape).unwrap();
        let attrs = Pool2dAttrs {
            kernel: [2, 3],
            stride: [1, 2],
            padding: [1, 1],
        };
        let want = reference::pool2d(t, PoolKind::Max, &attrs).unwrap();
        let mut out = vec![f32::NAN; want.data.len()];
        pool2d(t, PoolKind::Max, &attrs, &RowParams::default(), &mut out).unwrap();
        assert_same_bits("wide rows", &out, &want.data);
    }

    #[test]
    fn oversized_padding_is_an_error() {
        let x = [0.0f32; 4];
        let t = TensorRef::new("t", &x, &[1, 1, 2, 2]).unwrap();
        let attrs = Pool2dAttrs {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [2, 0],
        };
        assert!(pool2d(
            t,
            PoolKind::Max,
            &attrs,
            &RowParams::default(),
            &mut [0.0; 4]
        )
        .is_err());
        assert!(adaptive_avg_pool2d(t, [0, 1], &RowParams::default(), &mut []).is_err());
    }
}
