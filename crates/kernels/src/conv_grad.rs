//! The gradients of conv2d: w.r.t. its input (a transposed convolution, each task owning input
//! planes) and w.r.t. its weight (each task owning output channels' weight rows). Work is split
//! over outputs only, so results do not depend on the thread count.

use super::conv::{Conv2dAttrs, Conv2dCall};
use super::error::{KernelError, KernelResult};
use super::par::{for_each_row_group, RowParams};
use super::shape::check_len;
use super::tensor::TensorRef;

/// Checks `dy` against the forward's output shape.
fn check_dy(op: &'static str, dy: TensorRef<'_>, call: &Conv2dCall) -> KernelResult<()> {
    check_len(op, "dy", dy.data.len(), dy.shape)?;
    if dy.shape != call.output_shape() {
        return Err(KernelError::new(
            op,
            format!(
                "dy {:?} must be the convolution's output {:?}",
                dy.shape,
                call.output_shape()
            ),
        ));
    }
    Ok(())
}

/// For output positions `0..out` along one axis and tap `tap`, the range of output positions
/// whose input index `o·stride + tap·dilation − pad` lies in `0..len`, and that index for the
/// first of them.
fn valid_outputs(
    out: usize,
    tap: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    len: usize,
) -> std::ops::Range<usize> {
    let offset = tap * dilation;
    // o·stride + offset ≥ pad  ⇔  o ≥ ceil((pad − offset) / stride).
    let lo = pad.saturating_sub(offset).div_ceil(stride);
    // o·stride + offset − pad < len  ⇔  o < ceil((len + pad − offset) / stride).
    let hi = (len + pad).saturating_sub(offset).div_ceil(stride).min(out);
    lo..hi.max(lo)
}

/// `conv2d_grad_input(dy, w)` into `out` (`[N, C, H, W]` with `size = [H, W]`):
/// `dx[n, c, iy, ix] = Σ dy[n, o, oy, ox] · w[o, c, ky, kx]` over the taps that read the cell.
pub fn conv2d_grad_input(
    dy: TensorRef<'_>,
    w: TensorRef<'_>,
    a: &Conv2dAttrs,
    size: [usize; 2],
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "conv2d_grad_input";
    check_len(OP, "w", w.data.len(), w.shape)?;
    let (&[n, ..], &[_, cg, ..]) = (dy.shape, w.shape) else {
        return Err(KernelError::new(OP, "dy and w must be rank 4"));
    };
    let xs = [n, cg.saturating_mul(a.groups), size[0], size[1]];
    let g = Conv2dCall::of_shapes(OP, &xs, w.shape, a)?;
    check_dy(OP, dy, &g)?;
    check_len(OP, "out", out.len(), &xs)?;
    let og = g.o / a.groups;
    let plane = g.h * g.w;
    let work = out
        .len()
        .saturating_add(dy.data.len())
        .saturating_mul(g.kh * g.kw);
    for_each_row_group(params, work, out, plane, |first, chunk| {
        chunk.fill(0.0);
        for (p, dx) in chunk.chunks_exact_mut(plane).enumerate() {
            let (ni, ic) = ((first + p) / g.c, (first + p) % g.c);
            let (group, ci) = (ic / cg, ic % cg);
            for oc in group * og..(group + 1) * og {
                let dyp = &dy.data[(ni * g.o + oc) * g.oh * g.ow..][..g.oh * g.ow];
                for ky in 0..g.kh {
                    let ys = valid_outputs(g.oh, ky, a.stride[0], a.dilation[0], a.padding[0], g.h);
                    for kx in 0..g.kw {
                        let wv = w.data[((oc * cg + ci) * g.kh + ky) * g.kw + kx];
                        let xs =
                            valid_outputs(g.ow, kx, a.stride[1], a.dilation[1], a.padding[1], g.w);
                        for oy in ys.clone() {
                            let iy = oy * a.stride[0] + ky * a.dilation[0] - a.padding[0];
                            let src = &dyp[oy * g.ow..][..g.ow];
                            let dst = &mut dx[iy * g.w..][..g.w];
                            for ox in xs.clone() {
                                let ix = ox * a.stride[1] + kx * a.dilation[1] - a.padding[1];
                                dst[ix] += src[ox] * wv;
                            }
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

/// `conv2d_grad_weight(x, dy)` into `out` (`[O, C/groups, kh, kw]` with `kernel = [kh, kw]`):
/// `dw[o, c, ky, kx] = Σ_{n, oy, ox} dy[n, o, oy, ox] · x[n, c, oy·s + ky·d − p, ox·s + kx·d − p]`.
pub fn conv2d_grad_weight(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    a: &Conv2dAttrs,
    kernel: [usize; 2],
    params: &RowParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "conv2d_grad_weight";
    check_len(OP, "x", x.data.len(), x.shape)?;
    let (&[_, c, ..], &[_, o, ..]) = (x.shape, dy.shape) else {
        return Err(KernelError::new(OP, "x and dy must be rank 4"));
    };
    if a.groups == 0 || c % a.groups != 0 {
        return Err(KernelError::new(
            OP,
            format!("groups {} must divide the {c} input channels", a.groups),
        ));
    }
    let cg = c / a.groups;
    let ws = [o, cg, kernel[0], kernel[1]];
    let g = Conv2dCall::of_shapes(OP, x.shape, &ws, a)?;
    check_dy(OP, dy, &g)?;
    check_len(OP, "out", out.len(), &ws)?;
    let og = g.o / a.groups;
    let row = cg * g.kh * g.kw;
    let work = dy.data.len().saturating_mul(row);
    for_each_row_group(params, work, out, row, |first, chunk| {
        for (r, dw) in chunk.chunks_exact_mut(row).enumerate() {
            let oc = first + r;
            let group = oc / og;
            for (tap, slot) in dw.iter_mut().enumerate() {
                let (ci, ky, kx) = (tap / (g.kh * g.kw), tap / g.kw % g.kh, tap % g.kw);
                let ic = group * cg + ci;
                let ys = valid_outputs(g.oh, ky, a.stride[0], a.dilation[0], a.padding[0], g.h);
                let xs = valid_outputs(g.ow, kx, a.stride[1], a.dilation[1], a.padding[1], g.w);
                let mut acc = 0.0f32;
                for ni in 0..g.n {
                    let dyp = &dy.data[(ni * g.o + oc) * g.oh * g.ow..][..g.oh * g.ow];
                    let xp = &x.data[(ni * g.c + ic) * g.h * g.w..][..g.h * g.w];
                    for oy in ys.clone() {
                        let iy = oy * a.stride[0] + ky * a.dilation[0] - a.padding[0];
                        let src = &dyp[oy * g.ow..][..g.ow];
                        let xr = &xp[iy * g.w..][..g.w];
                        for ox in xs.clone() {
                            acc +=
                                src[ox] * xr[ox * a.stride[1] + kx * a.dilation[1] - a.padding[1]];
                        }
                    }
                }
                *slot = acc;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close, assert_same_bits, in_pool, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Both gradients against the f64 reference, with stride, padding, dilation and groups;
        /// 1 and 2 threads agree bit for bit. Tolerance: f32 sums of at most a few hundred
        /// products of O(1) values.
        #[test]
        fn fast_matches_reference(
            n in 1usize..3, cg in 1usize..3, og in 1usize..3, groups in 1usize..3,
            h in 1usize..8, w in 1usize..8, kh in 1usize..4, kw in 1usize..4,
            stride in (1usize..3, 1usize..3), padding in (0usize..3, 0usize..3),
            dilation in (1usize..3, 1usize..3),
            task in prop::sample::select(vec![1usize, 30, 1 << 14]),
            seed in any::<u64>(),
        ) {
            let a = Conv2dAttrs {
                stride: [stride.0, stride.1],
                padding: [padding.0, padding.1],
                dilation: [dilation.0, dilation.1],
                groups,
            };
            let (c, o) = (cg * groups, og * groups);
            let xs = [n, c, h, w];
            let ws = [o, cg, kh, kw];
            let Ok(call) = Conv2dCall::of_shapes("t", &xs, &ws, &a) else {
                return Ok(()); // the window does not fit
            };
            let ys = call.output_shape();
            let mut rng = Rng::new(seed);
            let x = rng.vec(xs.iter().product(), 1.0);
            let wv = rng.vec(ws.iter().product(), 1.0);
            let dy = rng.vec(ys.iter().product(), 1.0);
            let (xt, wt, dyt) = (
                TensorRef::new("t", &x, &xs).unwrap(),
                TensorRef::new("t", &wv, &ws).unwrap(),
                TensorRef::new("t", &dy, &ys).unwrap(),
            );
            let params = RowParams { task_elems: task, min_parallel_elems: 0 };
            let want = reference::conv2d_grad_input(dyt, wt, &a, [h, w]).unwrap();
            let run = || {
                let mut out = vec![f32::NAN; x.len()];
                conv2d_grad_input(dyt, wt, &a, [h, w], &params, &mut out).unwrap();
                out
            };
            let one = in_pool(1, run);
            assert_same_bits("dx threads", &one, &in_pool(2, run));
            assert_close("dx", &one, &want.data, 1e-4, 1e-4);
            let want = reference::conv2d_grad_weight(xt, dyt, &a, [kh, kw]).unwrap();
            let run = || {
                let mut out = vec![f32::NAN; wv.len()];
                conv2d_grad_weight(xt, dyt, &a, [kh, kw], &params, &mut out).unwrap();
                out
            };
            let one = in_pool(1, run);
            assert_same_bits("dw threads", &one, &in_pool(2, run));
            assert_close("dw", &one, &want.data, 1e-4, 1e-4);
        }
    }

    #[test]
    fn dy_must_be_the_forward_output() {
        let x = [1.0f32; 16];
        let xt = TensorRef::new("t", &x, &[1, 1, 4, 4]).unwrap();
        let dy = TensorRef::new("t", &x[..4], &[1, 1, 2, 2]).unwrap();
        let mut out = [0.0; 9];
        let a = Conv2dAttrs::default();
        let p = RowParams::default();
        assert!(conv2d_grad_weight(xt, dy, &a, [2, 2], &p, &mut out[..4]).is_err());
        assert!(conv2d_grad_weight(xt, dy, &a, [3, 3], &p, &mut out[..4]).is_err());
        assert!(conv2d_grad_weight(xt, dy, &a, [3, 3], &p, &mut out).is_ok());
    }
}
