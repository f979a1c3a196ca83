//! `conv2d` as im2col + the packed GEMM, and the attribute checks shared with the reference.

use serde::{Deserialize, Serialize};

use mslc_core::ops::family::conv::window_len;

use super::activation::Activation;
use super::error::{KernelError, KernelResult};
use super::matmul::gemm::{Gemm, Problem};
use super::matmul::pack::MatRef;
use super::matmul::{MatmulParams, MicroKernel};
use super::par;
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;

/// The attributes of `conv2d` (PyTorch semantics, NCHW, no bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conv2dAttrs {
    /// Step between output positions, (h, w); at least 1.
    pub stride: [usize; 2],
    /// Zero padding on each side, (h, w).
    pub padding: [usize; 2],
    /// Spacing between kernel taps, (h, w); at least 1.
    pub dilation: [usize; 2],
    /// Channel groups; divides both C and O.
    pub groups: usize,
}

impl Default for Conv2dAttrs {
    fn default() -> Self {
        Self {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Output size of a sliding window of `kernel` taps `dilation` apart along one axis, by the
/// registry's rule ([`window_len`]), or an error when the window does not fit (or the sizes
/// overflow).
pub fn window_output(
    op: &'static str,
    len: usize,
    pad: usize,
    kernel: usize,
    dilation: usize,
    stride: usize,
) -> KernelResult<usize> {
    let int = |v: usize| i64::try_from(v).ok();
    let out = match (int(len), int(kernel), int(stride), int(pad), int(dilation)) {
        (Some(l), Some(k), Some(s), Some(p), Some(d)) => window_len(l, k, s, p, d),
        _ => None,
    };
    out.and_then(|o| usize::try_from(o).ok()).ok_or_else(|| {
        KernelError::new(
            op,
            format!(
                "a window of {kernel} taps {dilation} apart does not fit an input of {len} \
                 padded by {pad}"
            ),
        )
    })
}

/// One conv2d call's buffers checked against each other and the attributes at run time (the
/// registry's `Conv2dGeometry` checks the types at compile time), with output sizes by the
/// same window rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dCall {
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub o: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
}

impl Conv2dCall {
    /// Checks `x [N, C, H, W]`, `w [O, C/groups, kh, kw]` and the attributes.
    pub fn new(x: TensorRef<'_>, w: TensorRef<'_>, a: &Conv2dAttrs) -> KernelResult<Self> {
        const OP: &str = "conv2d";
        check_len(OP, "x", x.data.len(), x.shape)?;
        check_len(OP, "w", w.data.len(), w.shape)?;
        Self::of_shapes(OP, x.shape, w.shape, a)
    }

    /// Checks the shapes of `x [N, C, H, W]` and `w [O, C/groups, kh, kw]` against the
    /// attributes, for `op` (conv2d or one of its backward ops, whose buffers have other shapes).
    pub fn of_shapes(
        op: &'static str,
        x: &[usize],
        w: &[usize],
        a: &Conv2dAttrs,
    ) -> KernelResult<Self> {
        let (&[n, c, h, wd], &[o, cg, kh, kw]) = (x, w) else {
            return Err(KernelError::new(
                op,
                format!("x {x:?} must be [N, C, H, W] and w {w:?} [O, C/groups, kh, kw]"),
            ));
        };
        if a.stride.contains(&0) || a.dilation.contains(&0) || a.groups == 0 {
            return Err(KernelError::new(
                op,
                format!("stride, dilation and groups must be at least 1: {a:?}"),
            ));
        }
        if c % a.groups != 0 || o % a.groups != 0 || cg != c / a.groups {
            return Err(KernelError::new(
                op,
                format!(
                    "groups {} do not fit {c} input channels, {o} output channels and w {:?}",
                    a.groups, w
                ),
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(KernelError::new(op, "kernel must be at least 1×1"));
        }
        let oh = window_output(op, h, a.padding[0], kh, a.dilation[0], a.stride[0])?;
        let ow = window_output(op, wd, a.padding[1], kw, a.dilation[1], a.stride[1])?;
        Ok(Self {
            n,
            c,
            h,
            w: wd,
            o,
            kh,
            kw,
            oh,
            ow,
        })
    }

    /// `[N, O, oh, ow]`.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.oh, self.ow]
    }

    /// Input row/column read by output position `out` and tap `tap` along one axis, or `None`
    /// in the padding.
    pub fn input_index(
        out: usize,
        tap: usize,
        stride: usize,
        dilation: usize,
        pad: usize,
        len: usize,
    ) -> Option<usize> {
        (out * stride + tap * dilation)
            .checked_sub(pad)
            .filter(|&i| i < len)
    }
}

/// The GEMM left operands of `w` (`[O, C/groups, kh, kw]`): per group, its `[O/groups,
/// C/groups·kh·kw]` block of rows.
fn weight_blocks<'a>(w: &'a [f32], shape: &[usize], groups: usize) -> Vec<MatRef<'a>> {
    let (og, kdim) = (shape[0] / groups.max(1), shape[1..].iter().product());
    (0..groups)
        .map(|grp| MatRef {
            data: w,
            offset: grp * og * kdim,
            rs: kdim,
            cs: 1,
            rows: og,
            cols: kdim,
        })
        .collect()
}

/// A product over the weight blocks alone, for packing them: `m × k` per group, no B yet.
fn weight_gemm<'a>(weights: &'a [MatRef<'a>], kernel: MicroKernel) -> Gemm<'a> {
    Gemm {
        m: weights.first().map_or(0, |w| w.rows),
        n: 0,
        k: weights.first().map_or(0, |w| w.cols),
        a: weights,
        b: &[],
        problems: &[],
        ldc: 0,
        accumulate: false,
        bias: None,
        activation: Activation::NONE,
        kernel,
    }
}

/// Floats of `w` (shape `w_shape`, `groups` groups) packed ahead by [`pack_conv2d_weight`]
/// for the micro-kernel `params` choose.
pub fn conv2d_packed_weight_len(
    w_shape: &[usize],
    groups: usize,
    params: &MatmulParams,
) -> KernelResult<usize> {
    let kernel = MicroKernel::select(params.isa)?;
    let blocks = weight_blocks(&[], w_shape, groups);
    Ok(weight_gemm(&blocks, kernel).packed_a_len())
}

/// Packs `w` into `dst` ([`conv2d_packed_weight_len`] floats) as [`conv2d`] packs it on every
/// call, so that a weight which does not change is packed once.
pub fn pack_conv2d_weight(
    w: TensorRef<'_>,
    groups: usize,
    params: &MatmulParams,
    dst: &mut [f32],
) -> KernelResult<()> {
    let kernel = MicroKernel::select(params.isa)?;
    if w.shape.len() != 4 || groups == 0 || !w.shape[0].is_multiple_of(groups) {
        return Err(KernelError::new(
            "conv2d",
            format!(
                "w {:?} is not [O, C/groups, kh, kw] for {groups} groups",
                w.shape
            ),
        ));
    }
    check_len("conv2d", "w", w.data.len(), w.shape)?;
    let blocks = weight_blocks(w.data, w.shape, groups);
    let gemm = weight_gemm(&blocks, kernel);
    check_len("conv2d", "packed weight", dst.len(), &[gemm.packed_a_len()])?;
    gemm.pack_a(true, dst);
    Ok(())
}

/// `conv2d(x, w)` into `out` (`[N, O, oh, ow]`): per (image, group), the input patches are laid
/// out as a `[C/groups·kh·kw, oh·ow]` matrix (skipped for 1×1, stride-1, unpadded kernels, where
/// the input already is that matrix) and multiplied by the group's weights on the packed GEMM —
/// read from `packed_w` ([`pack_conv2d_weight`]) when given, same bits either way.
pub fn conv2d(
    x: TensorRef<'_>,
    w: TensorRef<'_>,
    attrs: &Conv2dAttrs,
    params: &MatmulParams,
    packed_w: Option<&[f32]>,
    out: &mut [f32],
) -> KernelResult<()> {
    let g = Conv2dCall::new(x, w, attrs)?;
    check_len("conv2d", "out", out.len(), &g.output_shape())?;
    let kernel = MicroKernel::select(params.isa)?;
    let groups = attrs.groups;
    let (cg, og) = (g.c / groups, g.o / groups);
    let (kdim, plane) = (cg * g.kh * g.kw, g.oh * g.ow);
    if out.is_empty() {
        return Ok(());
    }
    let weights = weight_blocks(w.data, w.shape, groups);
    if let Some(p) = packed_w {
        check_len(
            "conv2d",
            "packed weight",
            p.len(),
            &[weight_gemm(&weights, kernel).packed_a_len()],
        )?;
    }
    let direct = g.kh == 1 && g.kw == 1 && attrs.stride == [1, 1] && attrs.padding == [0, 0];
    // Multiplies images [n0, n1): problem i = (image, group) reads its patches at
    // `cols[(i - n0·groups)·col_offset..]`.
    let mut run = |cols: &[f32], col_offset: usize, n0: usize, n1: usize| {
        let problems: Vec<Problem> = (0..(n1 - n0) * groups)
            .map(|j| {
                let i = n0 * groups + j;
                Problem {
                    a: i % groups,
                    b: j,
                    c_offset: (i / groups * g.o + i % groups * og) * plane,
                    bias_offset: 0,
                }
            })
            .collect();
        let patches: Vec<MatRef<'_>> = (0..problems.len())
            .map(|j| MatRef {
                data: cols,
                offset: j * col_offset,
                rs: plane,
                cs: 1,
                rows: kdim,
                cols: plane,
            })
            .collect();
        Gemm {
            m: og,
            n: plane,
            k: kdim,
            a: &weights,
            b: &patches,
            problems: &problems,
            ldc: plane,
            accumulate: false,
            bias: None,
            activation: Activation::NONE,
            kernel,
        }
        .run_packed(out, params, packed_w, None);
    };
    if direct {
        // Image n, group grp starts at channel grp·cg of image n: offset i·cg·H·W.
        run(x.data, cg * plane, 0, g.n);
        return Ok(());
    }
    let per_image = groups * kdim * plane;
    let images = (IM2COL_LIMIT / per_image.max(1)).clamp(1, g.n);
    for n0 in (0..g.n).step_by(images) {
        let n1 = (n0 + images).min(g.n);
        with_scratch((n1 - n0) * per_image, |cols| {
            let parallel = cols.len() >= IM2COL_PARALLEL;
            par::for_each_chunk_mut(parallel, cols, plane, |row, dst| {
                im2col_row(x.data, &g, attrs, n0 * groups * kdim + row, dst);
            });
            run(cols, kdim * plane, n0, n1);
        });
    }
    Ok(())
}

/// im2col buffers smaller than this are filled on the calling thread.
const IM2COL_PARALLEL: usize = 1 << 15;
/// Most f32 of patches laid out at once (whole images; at least one).
const IM2COL_LIMIT: usize = 1 << 23;

/// Fills row `row` of the stacked patch matrices: problem `row / kdim` (image, group), kernel
/// tap `(ci, i, j)` = `row % kdim`, one value per output position.
fn im2col_row(x: &[f32], g: &Conv2dCall, a: &Conv2dAttrs, row: usize, dst: &mut [f32]) {
    let cg = g.c / a.groups;
    let kdim = cg * g.kh * g.kw;
    let (problem, tap) = (row / kdim, row % kdim);
    let (n, grp) = (problem / a.groups, problem % a.groups);
    let (ci, i, j) = (tap / (g.kh * g.kw), tap / g.kw % g.kh, tap % g.kw);
    let channel = &x[((n * g.c + grp * cg + ci) * g.h) * g.w..][..g.h * g.w];
    for (oy, out_row) in dst.chunks_exact_mut(g.ow).enumerate() {
        let Some(iy) =
            Conv2dCall::input_index(oy, i, a.stride[0], a.dilation[0], a.padding[0], g.h)
        else {
            out_row.fill(0.0);
            continue;
        };
        let src = &channel[iy * g.w..(iy + 1) * g.w];
        for (ox, v) in out_row.iter_mut().enumerate() {
            *v = Conv2dCall::input_index(ox, j, a.stride[1], a.dilation[1], a.padding[1], g.w)
                .map_or(0.0, |ix| src[ix]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{assert_close_in, assert_same_bits, in_pool, Precision, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn fast_matches_reference(
            n in 1usize..3, cg in 1usize..4, og in 1usize..4, groups in 1usize..3,
            h in 1usize..10, w in 1usize..10, kh in 1usize..4, kw in 1usize..4,
            stride in (1usize..3, 1usize..3), padding in (0usize..3, 0usize..3),
            dilation in (1usize..3, 1usize..3),
            precision in prop::sample::select(Precision::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let attrs = Conv2dAttrs {
                stride: [stride.0, stride.1],
                padding: [padding.0, padding.1],
                dilation: [dilation.0, dilation.1],
                groups,
            };
            let (c, o) = (cg * groups, og * groups);
            let mut rng = Rng::new(seed);
            let xs = [n, c, h, w];
            let ws = [o, cg, kh, kw];
            let x = precision.round_vec(rng.vec(xs.iter().product(), 1.0));
            let wt = precision.round_vec(rng.vec(ws.iter().product(), 1.0));
            let (xt, wtt) = (TensorRef::new("t", &x, &xs).unwrap(), TensorRef::new("t", &wt, &ws).unwrap());
            match reference::conv2d(xt, wtt, &attrs) {
                Err(_) => {
                    let mut out = vec![0.0; 1];
                    prop_assert!(conv2d(xt, wtt, &attrs, &MatmulParams::default(), None, &mut out).is_err());
                }
                Ok(want) => {
                    let params = MatmulParams { min_parallel_flops: 0, ..MatmulParams::default() };
                    let run = || {
                        let mut out = vec![f32::NAN; want.data.len()];
                        conv2d(xt, wtt, &attrs, &params, None, &mut out).unwrap();
                        out
                    };
                    let one = in_pool(1, run);
                    assert_same_bits("threads", &one, &in_pool(2, run));
                    // The weights packed once give the same bits.
                    let len = conv2d_packed_weight_len(&ws, groups, &params).unwrap();
                    let mut packed = vec![f32::NAN; len];
                    pack_conv2d_weight(wtt, groups, &params, &mut packed).unwrap();
                    let mut prepacked = vec![f32::NAN; want.data.len()];
                    in_pool(2, || conv2d(xt, wtt, &attrs, &params, Some(&packed), &mut prepacked).unwrap());
                    assert_same_bits("packed weights", &one, &prepacked);
                    let k = (cg * kh * kw) as f32;
                    assert_close_in(precision, "conv2d", &one, &want.data, 1e-6 * (k + 1.0), 1e-5);
                }
            }
        }
    }

    #[test]
    fn large_images_are_laid_out_one_chunk_at_a_time() {
        // Each padded image has more patch values than half of IM2COL_LIMIT: two chunks.
        let side = 2047;
        let xs = [2, 1, side, side];
        let x = Rng::new(9).vec(xs.iter().product(), 1.0);
        let xt = TensorRef::new("t", &x, &xs).unwrap();
        let wt = TensorRef::new("t", &[0.5, -2.0], &[2, 1, 1, 1]).unwrap();
        let attrs = Conv2dAttrs {
            padding: [1, 1],
            ..Conv2dAttrs::default()
        };
        assert!((side + 2) * (side + 2) > IM2COL_LIMIT / 2);
        let want = reference::conv2d(xt, wt, &attrs).unwrap();
        let mut out = vec![f32::NAN; want.data.len()];
        conv2d(xt, wt, &attrs, &MatmulParams::default(), None, &mut out).unwrap();
        assert_same_bits("chunked conv2d", &out, &want.data);
    }

    #[test]
    fn bad_geometry_is_an_error() {
        let x = [0.0f32; 16];
        let xt = TensorRef::new("t", &x, &[1, 1, 4, 4]).unwrap();
        let w3 = TensorRef::new("t", &x[..9], &[1, 1, 3, 3]).unwrap();
        let mut out = [0.0f32; 4];
        let p = MatmulParams::default();
        let zero_stride = Conv2dAttrs {
            stride: [0, 1],
            ..Conv2dAttrs::default()
        };
        assert!(conv2d(xt, w3, &zero_stride, &p, None, &mut out).is_err());
        let huge = Conv2dAttrs {
            padding: [usize::MAX, 0],
            dilation: [usize::MAX, 1],
            ..Conv2dAttrs::default()
        };
        assert!(conv2d(xt, w3, &huge, &p, None, &mut out).is_err());
        let groups = Conv2dAttrs {
            groups: 2,
            ..Conv2dAttrs::default()
        };
        assert!(conv2d(xt, w3, &groups, &p, None, &mut out).is_err());
        let big = TensorRef::new("t", &x, &[1, 1, 4, 4]).unwrap();
        let tiny = TensorRef::new("t", &x[..4], &[1, 1, 2, 2]).unwrap();
        assert!(conv2d(tiny, big, &Conv2dAttrs::default(), &p, None, &mut out).is_err());
        assert!(conv2d(xt, w3, &Conv2dAttrs::default(), &p, None, &mut out[..3]).is_err());
        assert!(conv2d(xt, w3, &Conv2dAttrs::default(), &p, None, &mut out).is_ok());
        // Packed weights of another size are refused, not read out of bounds.
        let short = [0.0f32; 3];
        assert!(conv2d(xt, w3, &Conv2dAttrs::default(), &p, Some(&short), &mut out).is_err());
        assert!(pack_conv2d_weight(w3, 2, &p, &mut [0.0; 64]).is_err());
    }
}
