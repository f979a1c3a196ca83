//! The gradients of conv2d, on the packed GEMM as the forward runs (im2col + GEMM):
//! - w.r.t. the input: per (image, group), the group's weights' transpose times dy gives the
//!   gradient of every patch value (`[C/groups·kh·kw, oh·ow]`, or its transpose with as few
//!   output positions as the GEMM's row kernels take), which col2im adds into the input planes
//!   they were read from, each task owning whole planes; a 1×1, stride-1, unpadded kernel's
//!   product is the input gradient itself;
//! - w.r.t. the weight: per group, dy's rows times the patches' transpose, the images laid end
//!   to end along the product's depth (in chunks, each chunk added to the last).
//!
//! Both lay out chunks of whole images, or of one image's output positions where an image's
//! patches alone exceed the limit ([`crate::conv::patches`]), so a call's scratch stays bounded
//! however large the window.
//!
//! Work is split over output tiles and planes only, so results do not depend on the thread
//! count.

use super::activation::Activation;
use super::conv::patches::{
    chunk_shape, col2im, im2col_rows, patch_chunks, PatchChunk, PATCH_PARALLEL, PATCH_TASK,
};
use super::conv::{row_blocks, Conv2dAttrs, Conv2dCall};
use super::error::{KernelError, KernelResult};
use super::matmul::gemm::{Gemm, Problem};
use super::matmul::kernel::{MAX_MR, MAX_NR};
use super::matmul::pack::MatRef;
use super::matmul::{MatmulParams, MicroKernel};
use super::par;
use super::scratch::with_scratch;
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

/// `conv2d_grad_input(dy, w)` into `out` (`[N, C, H, W]` with `size = [H, W]`):
/// `dx[n, c, iy, ix] = Σ dy[n, o, oy, ox] · w[o, c, ky, kx]` over the taps that read the cell.
pub fn conv2d_grad_input(
    dy: TensorRef<'_>,
    w: TensorRef<'_>,
    a: &Conv2dAttrs,
    size: [usize; 2],
    params: &MatmulParams,
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
    if out.is_empty() {
        return Ok(());
    }
    let groups = a.groups;
    let og = g.o / groups;
    let (kdim, plane) = (cg * g.kh * g.kw, g.oh * g.ow);
    let kernel = MicroKernel::select(params.isa)?;
    // The patch gradients transposed only where the positions are few enough for the row
    // kernels, which read A in place (the weights are not packed ahead here, as the forward's
    // may be; [`weights_right`] counts that); otherwise a 1×1 kernel's product lands in dx.
    let right = plane <= params.small_m;
    let weights: Vec<MatRef<'_>> = row_blocks(w.data, w.shape, groups)
        .into_iter()
        .map(|block| if right { block } else { block.t() })
        .collect();
    // Problem i = (image i / groups, group i % groups): dy's `og × plane` block.
    let dy_blocks = row_blocks(dy.data, &[g.n * g.o, plane], g.n * groups);
    // The patch gradients of the chunk's images at its positions into `c`: problem i's block
    // at `(i − n0·groups)·kdim·positions`, or, `into_dx`, at its group's channels of dx.
    let product = |chunk: PatchChunk, c: &mut [f32], into_dx: bool| {
        let (p0, np) = (chunk.p0, chunk.positions().len());
        // dy's columns at the chunk's positions, transposed with the weights on the right.
        let blocks: Vec<MatRef<'_>> = dy_blocks[chunk.n0 * groups..chunk.n1 * groups]
            .iter()
            .map(|&block| {
                let columns = MatRef {
                    offset: block.offset + p0,
                    cols: np,
                    ..block
                };
                if right {
                    columns.t()
                } else {
                    columns
                }
            })
            .collect();
        let problems: Vec<Problem> = (chunk.n0 * groups..chunk.n1 * groups)
            .enumerate()
            .map(|(j, i)| {
                let (a, b) = if right {
                    (j, i % groups)
                } else {
                    (i % groups, j)
                };
                let c_offset = match into_dx {
                    true => (i / groups * g.c + i % groups * cg) * plane,
                    false => j * kdim * np,
                };
                Problem {
                    a,
                    b,
                    c_offset,
                    bias_offset: 0,
                }
            })
            .collect();
        let (m, n, a, b, ldc) = match right {
            true => (np, kdim, &blocks[..], &weights[..], kdim),
            false => (kdim, np, &weights[..], &blocks[..], np),
        };
        let gemm = Gemm {
            m,
            n,
            k: og,
            a,
            b,
            problems: &problems,
            ldc,
            accumulate: false,
            bias: None,
            activation: Activation::NONE,
            multiplier: None,
            kernel,
        };
        gemm.run(c, params);
    };
    let direct = g.kh == 1 && g.kw == 1 && a.stride == [1, 1] && a.padding == [0, 0];
    if direct && !right {
        let whole = PatchChunk::whole(g.n, plane);
        product(whole, out, true);
        return Ok(());
    }
    let image_len = g.c * g.h * g.w;
    for chunk in patch_chunks(g.n, plane, groups * kdim) {
        let dx = &mut out[chunk.n0 * image_len..chunk.n1 * image_len];
        with_scratch(
            chunk.images() * groups * kdim * chunk.positions().len(),
            |cols| {
                product(chunk, cols, false);
                col2im(cols, &g, a, right, chunk, dx);
            },
        );
    }
    Ok(())
}

/// `conv2d_grad_weight(x, dy)` into `out` (`[O, C/groups, kh, kw]` with `kernel = [kh, kw]`):
/// `dw[o, c, ky, kx] = Σ_{n, oy, ox} dy[n, o, oy, ox] · x[n, c, oy·s + ky·d − p, ox·s + kx·d − p]`.
pub fn conv2d_grad_weight(
    x: TensorRef<'_>,
    dy: TensorRef<'_>,
    a: &Conv2dAttrs,
    kernel: [usize; 2],
    params: &MatmulParams,
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
    let groups = a.groups;
    let og = g.o / groups;
    let (kdim, plane) = (cg * g.kh * g.kw, g.oh * g.ow);
    let micro = MicroKernel::select(params.isa)?;
    // No image or no output position: nothing reaches the weights.
    if plane == 0 || g.n == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let per_position = groups * kdim + g.o;
    for (index, chunk) in patch_chunks(g.n, plane, per_position).enumerate() {
        let (n0, p0, np) = (chunk.n0, chunk.p0, chunk.positions().len());
        let depth = chunk.images() * np;
        with_scratch(depth * per_position, |buf| {
            let (patches, rows) = buf.split_at_mut(groups * kdim * depth);
            // Patch row (group, tap) of every image, end to end; whole rows per task.
            let parallel = patches.len() >= PATCH_PARALLEL;
            let rows_per_task = (PATCH_TASK / depth).max(1);
            par::for_each_chunk_mut(parallel, patches, rows_per_task * depth, |task, dst| {
                for (r, dst) in dst.chunks_exact_mut(depth).enumerate() {
                    let row = task * rows_per_task + r;
                    let (group, tap) = (row / kdim, row % kdim);
                    for (k, image) in dst.chunks_exact_mut(np).enumerate() {
                        let first_row = ((n0 + k) * groups + group) * kdim + tap;
                        im2col_rows(x.data, &g, a, first_row, chunk.positions(), image);
                    }
                }
            });
            // dy's row of each output channel at the chunk's positions, the images end to end.
            for (channel, dst) in rows.chunks_exact_mut(depth).enumerate() {
                for (k, image) in dst.chunks_exact_mut(np).enumerate() {
                    let first = ((n0 + k) * g.o + channel) * plane + p0;
                    image.copy_from_slice(&dy.data[first..][..np]);
                }
            }
            let (patches, rows) = (&*patches, &*rows);
            let dy_rows = row_blocks(rows, &[g.o, depth], groups);
            let patch_columns: Vec<MatRef<'_>> =
                row_blocks(patches, &[groups * kdim, depth], groups)
                    .into_iter()
                    .map(MatRef::t)
                    .collect();
            let problems: Vec<Problem> = (0..groups)
                .map(|group| Problem {
                    a: group,
                    b: group,
                    c_offset: group * og * kdim,
                    bias_offset: 0,
                })
                .collect();
            let gemm = Gemm {
                m: og,
                n: kdim,
                k: depth,
                a: &dy_rows,
                b: &patch_columns,
                problems: &problems,
                ldc: kdim,
                // The first chunk writes the gradient, each later one adds to it.
                accumulate: index > 0,
                bias: None,
                activation: Activation::NONE,
                multiplier: None,
                kernel: micro,
            };
            gemm.run(out, params);
        });
    }
    Ok(())
}

/// An upper bound on the largest scratch (f32) one call of [`conv2d_grad_weight`] (`weight`)
/// or [`conv2d_grad_input`] asks for at once, for the convolution of weight shape `w`
/// (`[O, C/groups, kh, kw]`) and output shape `dy` with `groups` groups: the
/// patch gradients (or the patches and dy's rows) of a chunk of images, or the GEMM's packed
/// operands — each dy block and weight block, or each chunk's dy rows and patches, padded to
/// micro-tiles.
pub fn conv2d_grad_scratch(weight: bool, w: &[usize], dy: &[usize], groups: usize) -> usize {
    let dim = |s: &[usize], i: usize| s.get(i).copied().unwrap_or(0);
    let kdim: usize = w.iter().skip(1).product();
    let (n, channels) = (dim(dy, 0), dim(dy, 1));
    let plane = dim(dy, 2).saturating_mul(dim(dy, 3));
    let tile = MAX_MR.max(MAX_NR);
    let (cols, packed) = if weight {
        let per_position = groups.saturating_mul(kdim).saturating_add(channels);
        let (images, positions) = chunk_shape(n, plane, per_position);
        let depth = images.saturating_mul(positions);
        let cols = depth.saturating_mul(per_position);
        (
            cols,
            cols.saturating_add(tile.saturating_mul(depth).saturating_mul(2 * groups)),
        )
    } else {
        let per_position = groups.saturating_mul(kdim);
        let (images, positions) = chunk_shape(n, plane, per_position);
        let cols = images
            .saturating_mul(positions)
            .saturating_mul(per_position);
        // A 1×1 kernel's product takes every image at once.
        let operands: usize = [w, dy].iter().map(|s| s.iter().product::<usize>()).sum();
        let blocks = n.saturating_mul(groups).saturating_add(groups);
        let pads = tile
            .saturating_mul(channels.max(kdim))
            .saturating_mul(blocks);
        (cols, operands.saturating_add(pads))
    };
    cols.max(packed).saturating_add(16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::patches::PATCH_LIMIT;
    use crate::reference;
    use crate::tensor::Tensor;
    use crate::testing::{assert_close, assert_same_bits, in_pool, Rng};
    use proptest::prelude::*;

    /// GEMM tilings that take each path: the defaults; no small-m path (the patch gradients
    /// never transposed); tiny blocks that cut every product into several k-slabs and tasks.
    fn tilings() -> [MatmulParams; 3] {
        let tiny = MatmulParams {
            mc: 12,
            kc: 8,
            nc: 32,
            tasks_per_thread: 4,
            min_parallel_flops: 0,
            ..MatmulParams::default()
        };
        let no_small_m = MatmulParams {
            small_m: 0,
            small_m_packed_b: 0,
            ..MatmulParams::default()
        };
        [MatmulParams::default(), no_small_m, tiny]
    }

    /// Random input, weights and output gradient of a convolution (their owner).
    struct Operands {
        shapes: [[usize; 4]; 3],
        values: [Vec<f32>; 3],
    }

    impl Operands {
        /// Values in [-1, 1) for a convolution of `xs` by `ws` with `a`; `None` where the
        /// window does not fit.
        fn random(xs: [usize; 4], ws: [usize; 4], a: &Conv2dAttrs, rng: &mut Rng) -> Option<Self> {
            let ys = Conv2dCall::of_shapes("t", &xs, &ws, a).ok()?.output_shape();
            let shapes = [xs, ws, ys];
            let values = shapes.map(|s| rng.vec(s.iter().product(), 1.0));
            Some(Operands { shapes, values })
        }

        /// x, w and dy.
        fn views(&self) -> (TensorRef<'_>, TensorRef<'_>, TensorRef<'_>) {
            let [x, w, dy] = [0, 1, 2].map(|i| TensorRef {
                data: &self.values[i],
                shape: &self.shapes[i],
            });
            (x, w, dy)
        }
    }

    /// The input and weight gradients of a convolution of `x` by `w` with output gradient `dy`
    /// against the f64 reference within the f32 sums' rounding, and the same bits on 1 and 2
    /// threads.
    fn check_both(
        (x, w, dy): (TensorRef<'_>, TensorRef<'_>, TensorRef<'_>),
        a: &Conv2dAttrs,
        params: &MatmulParams,
    ) {
        let (size, kernel) = ([x.shape[2], x.shape[3]], [w.shape[2], w.shape[3]]);
        let check = |what: &str, want: Tensor, grad: &(dyn Fn(&mut [f32]) + Sync)| {
            let run = || {
                let mut out = vec![f32::NAN; want.data.len()];
                grad(&mut out);
                out
            };
            let one = in_pool(1, run);
            assert_same_bits(what, &one, &in_pool(2, run));
            assert_close(what, &one, &want.data, 1e-4, 1e-4);
        };
        check(
            "dx",
            reference::conv2d_grad_input(dy, w, a, size).unwrap(),
            &|out| conv2d_grad_input(dy, w, a, size, params, out).unwrap(),
        );
        check(
            "dw",
            reference::conv2d_grad_weight(x, dy, a, kernel).unwrap(),
            &|out| conv2d_grad_weight(x, dy, a, kernel, params, out).unwrap(),
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Both gradients against the f64 reference, with stride, padding, dilation and groups,
        /// on every path of the GEMM. Tolerance: f32 sums of at most a few hundred products of
        /// O(1) values.
        #[test]
        fn fast_matches_reference(
            n in 1usize..4, cg in 1usize..3, og in 1usize..3, groups in 1usize..3,
            h in 1usize..8, w in 1usize..8, kh in 1usize..4, kw in 1usize..4,
            stride in (1usize..3, 1usize..3), padding in (0usize..3, 0usize..3),
            dilation in (1usize..3, 1usize..3),
            tiling in 0usize..3,
            seed in any::<u64>(),
        ) {
            let a = Conv2dAttrs {
                stride: [stride.0, stride.1],
                padding: [padding.0, padding.1],
                dilation: [dilation.0, dilation.1],
                groups,
            };
            let (c, o) = (cg * groups, og * groups);
            let operands = Operands::random([n, c, h, w], [o, cg, kh, kw], &a, &mut Rng::new(seed));
            let Some(operands) = operands else {
                return Ok(()); // the window does not fit
            };
            check_both(operands.views(), &a, &tilings()[tiling]);
        }
    }

    /// ResNet's shapes: a 1×1 kernel over 1×1 and 7×7 planes (transposed and added back, or
    /// the product straight into dx), a strided 3×3 and the 7×7 stem, 2 images; wide enough
    /// that the GEMM splits over both threads.
    #[test]
    fn network_shapes_match_the_reference() {
        let mut rng = Rng::new(11);
        let shapes = [
            ([2, 64, 1, 1], [96, 64, 1, 1], 1, 0),
            ([2, 32, 7, 7], [48, 32, 1, 1], 1, 0),
            ([2, 16, 9, 9], [24, 16, 3, 3], 2, 1),
            ([2, 3, 20, 20], [16, 3, 7, 7], 2, 3),
        ];
        for (xs, ws, stride, pad) in shapes {
            let a = Conv2dAttrs {
                stride: [stride; 2],
                padding: [pad; 2],
                ..Conv2dAttrs::default()
            };
            let operands = Operands::random(xs, ws, &a, &mut rng).unwrap();
            for params in &tilings() {
                check_both(operands.views(), &a, params);
            }
        }
    }

    /// Images too many to lay out at once go in chunks (3 of 4 images, then the last): the
    /// input gradient's col2im lands each chunk in its images, the weight gradient adds each
    /// chunk's product to the last.
    #[test]
    fn images_are_laid_out_in_chunks() {
        let mut rng = Rng::new(17);
        let (xs, ws) = ([4, 64, 64, 64], [8, 64, 3, 3]);
        let a = Conv2dAttrs {
            padding: [1, 1],
            ..Conv2dAttrs::default()
        };
        let (kdim, plane) = (64 * 9, 64 * 64);
        assert_eq!(chunk_shape(4, plane, kdim), (3, plane));
        assert_eq!(chunk_shape(4, plane, kdim + 8), (3, plane));
        let operands = Operands::random(xs, ws, &a, &mut rng).unwrap();
        check_both(operands.views(), &a, &MatmulParams::default());
    }

    /// An image whose patches (or patch gradients) alone exceed the limit goes a run of its
    /// positions at a time, the runs starting and ending inside output rows: col2im adds each
    /// run into the planes the first one wrote, the weight gradient adds each run's product.
    /// With many positions (the patch gradients as `kdim × positions`) and with few (their
    /// transpose); a strided window reads by gather; the first in two groups. Both within the
    /// scratch bound.
    #[test]
    fn an_image_too_large_is_laid_out_in_runs_of_positions() {
        let mut rng = Rng::new(23);
        let many = ([2, 4, 1000, 700], [4, 2, 3, 3], [2, 1], 1, 2);
        let few = ([1, 9, 513, 513], [1, 9, 512, 512], [1, 1], 0, 1);
        for (xs, ws, stride, pad, groups) in [many, few] {
            let a = Conv2dAttrs {
                stride,
                padding: [pad; 2],
                groups,
                ..Conv2dAttrs::default()
            };
            let operands = Operands::random(xs, ws, &a, &mut rng).unwrap();
            let (xt, wt, dyt) = operands.views();
            let (kdim, plane) = (ws[1] * ws[2] * ws[3], dyt.shape[2] * dyt.shape[3]);
            for per_position in [groups * kdim, groups * kdim + ws[0]] {
                let (images, positions) = chunk_shape(xs[0], plane, per_position);
                assert_eq!(images, 1);
                assert!(positions < plane && plane % positions != 0);
            }
            check_both((xt, wt, dyt), &a, &MatmulParams::default());
            let p = MatmulParams::default();
            let asked = in_pool(1, || {
                let mut dw = vec![0.0; wt.data.len()];
                conv2d_grad_weight(xt, dyt, &a, [ws[2], ws[3]], &p, &mut dw).unwrap();
                let mut dx = vec![0.0; xt.data.len()];
                conv2d_grad_input(dyt, wt, &a, [xs[2], xs[3]], &p, &mut dx).unwrap();
                crate::scratch::largest_request()
            });
            let bound = conv2d_grad_scratch(true, &ws, dyt.shape, groups)
                .max(conv2d_grad_scratch(false, &ws, dyt.shape, groups));
            assert!(asked <= bound, "asked {asked} of {bound}");
            assert!(asked < 4 * PATCH_LIMIT);
        }
    }

    /// The scratch bound covers the largest request of either gradient, whatever the tiling.
    #[test]
    fn requests_stay_within_the_scratch_bound() {
        let mut rng = Rng::new(5);
        let (xs, ws) = ([3, 24, 6, 6], [40, 12, 3, 3]);
        let a = Conv2dAttrs {
            padding: [1, 1],
            groups: 2,
            ..Conv2dAttrs::default()
        };
        let operands = Operands::random(xs, ws, &a, &mut rng).unwrap();
        let (xt, wt, dyt) = operands.views();
        let ys = dyt.shape;
        for params in &tilings() {
            let asked = in_pool(1, || {
                let mut dx = vec![0.0; xt.data.len()];
                conv2d_grad_input(dyt, wt, &a, [6, 6], params, &mut dx).unwrap();
                crate::scratch::largest_request()
            });
            assert!(
                asked <= conv2d_grad_scratch(false, &ws, ys, 2),
                "dx asked {asked}"
            );
            let asked = in_pool(1, || {
                let mut dw = vec![0.0; wt.data.len()];
                conv2d_grad_weight(xt, dyt, &a, [3, 3], params, &mut dw).unwrap();
                crate::scratch::largest_request()
            });
            assert!(
                asked <= conv2d_grad_scratch(true, &ws, ys, 2),
                "dw asked {asked}"
            );
        }
    }

    #[test]
    fn dy_must_be_the_forward_output() {
        let x = [1.0f32; 16];
        let xt = TensorRef::new("t", &x, &[1, 1, 4, 4]).unwrap();
        let dy = TensorRef::new("t", &x[..4], &[1, 1, 2, 2]).unwrap();
        let mut out = [0.0; 9];
        let a = Conv2dAttrs::default();
        let p = MatmulParams::default();
        assert!(conv2d_grad_weight(xt, dy, &a, [2, 2], &p, &mut out[..4]).is_err());
        assert!(conv2d_grad_weight(xt, dy, &a, [3, 3], &p, &mut out[..4]).is_err());
        assert!(conv2d_grad_weight(xt, dy, &a, [3, 3], &p, &mut out).is_ok());
    }
}
