//! Reference convolution and pooling: direct loops over every output and every tap.

use crate::conv::{Conv2dAttrs, Conv2dCall};
use crate::error::KernelResult;
use crate::pool::{
    adaptive_output_shape, adaptive_range, pool2d_output_shape, Pool2dAttrs, PoolKind,
};
use crate::tensor::{Tensor, TensorRef};

/// `conv2d`: `out[n, o, y, x] = Σ_{c in o's group, i, j} x[n, c, y·s + i·d - p, x·s + j·d - p] ·
/// w[o, c, i, j]`, zero outside the input.
pub fn conv2d(x: TensorRef<'_>, w: TensorRef<'_>, a: &Conv2dAttrs) -> KernelResult<Tensor> {
    let g = Conv2dCall::new(x, w, a)?;
    let (cg, og) = (g.c / a.groups, g.o / a.groups);
    let mut data = Vec::with_capacity(g.output_shape().iter().product());
    for n in 0..g.n {
        for o in 0..g.o {
            let group = o / og;
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let mut acc = 0.0f64;
                    for ci in 0..cg {
                        let c = group * cg + ci;
                        for i in 0..g.kh {
                            let Some(iy) = Conv2dCall::input_index(
                                oy,
                                i,
                                a.stride[0],
                                a.dilation[0],
                                a.padding[0],
                                g.h,
                            ) else {
                                continue;
                            };
                            for j in 0..g.kw {
                                let Some(ix) = Conv2dCall::input_index(
                                    ox,
                                    j,
                                    a.stride[1],
                                    a.dilation[1],
                                    a.padding[1],
                                    g.w,
                                ) else {
                                    continue;
                                };
                                let xv = x.data[((n * g.c + c) * g.h + iy) * g.w + ix];
                                let wv = w.data[((o * cg + ci) * g.kh + i) * g.kw + j];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    data.push(acc as f32);
                }
            }
        }
    }
    Tensor::new("conv2d", g.output_shape().to_vec(), data)
}

/// `max_pool2d` / `avg_pool2d`.
pub fn pool2d(x: TensorRef<'_>, kind: PoolKind, a: &Pool2dAttrs) -> KernelResult<Tensor> {
    let shape = pool2d_output_shape(x, a)?;
    let [n, c, oh, ow] = shape;
    let (h, w) = (x.shape[2], x.shape[3]);
    let mut data = Vec::with_capacity(shape.iter().product());
    for plane in 0..n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut max = f64::NEG_INFINITY;
                let mut sum = 0.0f64;
                for i in 0..a.kernel[0] {
                    for j in 0..a.kernel[1] {
                        let iy = (oy * a.stride[0] + i).checked_sub(a.padding[0]);
                        let ix = (ox * a.stride[1] + j).checked_sub(a.padding[1]);
                        if let (Some(iy), Some(ix)) = (iy, ix) {
                            if iy < h && ix < w {
                                let v = x.data[(plane * h + iy) * w + ix] as f64;
                                max = if v.is_nan() || max.is_nan() {
                                    f64::NAN
                                } else {
                                    max.max(v)
                                };
                                sum += v;
                            }
                        }
                    }
                }
                data.push(match kind {
                    PoolKind::Max => max as f32,
                    PoolKind::Avg => (sum / (a.kernel[0] * a.kernel[1]) as f64) as f32,
                });
            }
        }
    }
    Tensor::new("pool2d", shape.to_vec(), data)
}

/// `adaptive_avg_pool2d`: output cell (i, j) averages rows `[⌊iH/oh⌋, ⌈(i+1)H/oh⌉)` and the
/// matching columns.
pub fn adaptive_avg_pool2d(x: TensorRef<'_>, output: [usize; 2]) -> KernelResult<Tensor> {
    let shape = adaptive_output_shape(x, output)?;
    let [n, c, oh, ow] = shape;
    let (h, w) = (x.shape[2], x.shape[3]);
    let mut data = Vec::with_capacity(shape.iter().product());
    for plane in 0..n * c {
        for oy in 0..oh {
            let (y0, y1) = adaptive_range(oy, oh, h);
            for ox in 0..ow {
                let (x0, x1) = adaptive_range(ox, ow, w);
                let mut sum = 0.0f64;
                for iy in y0..y1 {
                    for ix in x0..x1 {
                        sum += x.data[(plane * h + iy) * w + ix] as f64;
                    }
                }
                data.push((sum / ((y1 - y0) * (x1 - x0)) as f64) as f32);
            }
        }
    }
    Tensor::new("adaptive_avg_pool2d", shape.to_vec(), data)
}
