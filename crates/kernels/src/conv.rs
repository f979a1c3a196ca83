//! `conv2d` as im2col + the packed GEMM, and the attribute checks shared with the reference.
//! [`patches`] lays out (and, for the input gradient, walks back) the patch matrices.

use serde::{Deserialize, Serialize};

use mslc_core::ops::family::conv::window_len;
use mslc_core::ops::DType;

use super::activation::Activation;
use super::error::{KernelError, KernelResult};
use super::matmul::gemm::{Gemm, Problem};
use super::matmul::pack::MatRef;
use super::matmul::{half_panels, HalfType, MatmulParams, MicroKernel, PackedB};
use super::par;
use super::scratch::with_scratch;
use super::shape::check_len;
use super::tensor::TensorRef;
use super::transpose::{transpose, TransposeParams};

pub(crate) mod patches;
use patches::{im2col_rows, patch_chunks, PatchChunk, PATCH_PARALLEL, PATCH_TASK};

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

/// `blocks` equal blocks of rows of the row-major matrix `w` of `shape` (the first dim its rows,
/// the rest its columns): a conv2d's weights (`[O, C/groups, kh, kw]`) per group, its
/// `[O/groups, C/groups·kh·kw]` GEMM operand; or a gradient's dy rows per (image, group).
pub(crate) fn row_blocks<'a>(w: &'a [f32], shape: &[usize], blocks: usize) -> Vec<MatRef<'a>> {
    let (og, kdim) = (shape[0] / blocks.max(1), shape[1..].iter().product());
    (0..blocks)
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

/// Whether a conv2d of `plane` output positions per image multiplies the patches by the
/// weights (positions as the GEMM's rows, weights packed as its right operand, read by the
/// unpacked-A row kernels) rather than the weights by the patches (positions as columns).
/// Few positions — the last stages of a network on a small image — fill a micro-tile's
/// columns poorly (2×2 positions use 4 of 16 lanes) while the output channels fill them
/// all; the row kernels take up to `small_m_packed_b` rows.
pub(crate) fn weights_right(plane: usize, params: &MatmulParams) -> bool {
    plane <= WEIGHTS_RIGHT_PLANE.min(params.small_m.max(params.small_m_packed_b))
}

/// Most output positions per image for which [`weights_right`] holds. The row kernels read
/// the weights' panels once per 12 positions and no packing of the patches, and a weight
/// stored in f16 keeps f16 panels there ([`conv2d_half_weight`]): ResNet-50's forward (2-core
/// AVX-512 Xeon, default f16 weights) is 1.3x faster at B = 1 on a 64×64 image with its
/// 8×8, 4×4 and 2×2 stages so laid out than with only the 2×2 one (the bound was 8), 1.2x at
/// B = 4, 1.07x on a 224×224 image (its 7×7 stage); with f32 weights 1.0-1.15x. At 256
/// positions (16×16) it is no faster.
const WEIGHTS_RIGHT_PLANE: usize = 64;

/// How a conv2d's weights enter its GEMM, for a given number of output positions per image
/// ([`weights_right`]): one definition for packing them ahead and for the product.
struct WeightLayout<'a> {
    /// The weights are the right operand (the output positions are the rows).
    right: bool,
    /// The micro-kernel, which fixes the packed geometry.
    kernel: MicroKernel,
    /// Per group, its `[O/groups, C/groups·kh·kw]` block of rows ([`row_blocks`]), or that
    /// block transposed when the weights are on the right.
    operands: Vec<MatRef<'a>>,
}

impl<'a> WeightLayout<'a> {
    fn new(
        w: &'a [f32],
        shape: &[usize],
        groups: usize,
        plane: usize,
        params: &MatmulParams,
    ) -> KernelResult<Self> {
        let kernel = MicroKernel::select(params.isa)?;
        let right = weights_right(plane, params);
        let blocks = row_blocks(w, shape, groups);
        let operands = match right {
            false => blocks,
            true => (blocks.into_iter())
                .map(|b| MatRef {
                    rs: b.cs,
                    cs: b.rs,
                    rows: b.cols,
                    cols: b.rows,
                    ..b
                })
                .collect(),
        };
        Ok(Self {
            right,
            kernel,
            operands,
        })
    }

    /// A product over the weights alone, for packing them: `m × k` per group as A, or `k × n`
    /// as B; no other operand.
    fn packing(&self) -> Gemm<'_> {
        let (rows, cols) = (self.operands.first()).map_or((0, 0), |w| (w.rows, w.cols));
        let (m, n, k, a, b): (_, _, _, &[MatRef<'_>], &[MatRef<'_>]) = match self.right {
            false => (rows, 0, cols, &self.operands, &[]),
            true => (0, cols, rows, &[], &self.operands),
        };
        Gemm {
            m,
            n,
            k,
            a,
            b,
            problems: &[],
            ldc: 0,
            accumulate: false,
            bias: None,
            activation: Activation::NONE,
            multiplier: None,
            kernel: self.kernel,
        }
    }

    /// Floats of the weights packed ahead.
    fn packed_len(&self) -> usize {
        match self.right {
            true => self.packing().packed_b_len(),
            false => self.packing().packed_a_len(),
        }
    }
}

/// Values of `w` (shape `w_shape`, `groups` groups) packed ahead by [`pack_conv2d_weight`]
/// for the micro-kernel `params` choose and a conv2d of `plane` output positions per image
/// (which decides how the product is laid out: [`weights_right`]).
pub fn conv2d_packed_weight_len(
    w_shape: &[usize],
    groups: usize,
    plane: usize,
    params: &MatmulParams,
) -> KernelResult<usize> {
    Ok(WeightLayout::new(&[], w_shape, groups, plane, params)?.packed_len())
}

/// Whether [`conv2d`] given its weights packed ahead still reads the weights themselves: on
/// the patches' left, with few enough output channels per group for the GEMM's small-m path,
/// which multiplies its left operand unpacked ([`Gemm::run_packed`]).
pub fn conv2d_reads_packed_weight(
    w_shape: &[usize],
    groups: usize,
    plane: usize,
    params: &MatmulParams,
) -> bool {
    let og = w_shape.first().copied().unwrap_or(0) / groups.max(1);
    !weights_right(plane, params) && og <= params.small_m
}

/// The 16-bit format a conv2d of `plane` output positions per image whose weights are stored
/// as `dtype` packs them ahead in ([`pack_conv2d_weight_half`]): where they are the right
/// operand of a product the unpacked-A path takes ([`half_panels`]).
pub fn conv2d_half_weight(plane: usize, dtype: DType, params: &MatmulParams) -> Option<HalfType> {
    half_panels(plane, dtype, params).filter(|_| weights_right(plane, params))
}

/// Packs `w` into `dst` ([`conv2d_packed_weight_len`] floats) as [`conv2d`] packs it on every
/// call, so that a weight which does not change is packed once.
pub fn pack_conv2d_weight(
    w: TensorRef<'_>,
    groups: usize,
    plane: usize,
    params: &MatmulParams,
    dst: &mut [f32],
) -> KernelResult<()> {
    let layout = packing_layout(w, groups, plane, params, dst.len())?;
    match layout.right {
        true => layout.packing().pack_b(true, dst),
        false => layout.packing().pack_a(true, dst),
    }
    Ok(())
}

/// The error for weights in 16-bit panels on the left of the product, where the tiled
/// micro-kernels read f32 panels only: packing them so, or handing them to [`conv2d`].
fn half_panels_on_the_left() -> KernelError {
    KernelError::new(
        "conv2d",
        "16-bit panels are for weights on the right of the product only",
    )
}

/// As [`pack_conv2d_weight`], into panels of `half`, where [`conv2d_half_weight`] says so
/// (the weights on the right): exact for weights stored in that format.
pub fn pack_conv2d_weight_half(
    w: TensorRef<'_>,
    groups: usize,
    plane: usize,
    params: &MatmulParams,
    half: HalfType,
    dst: &mut [u16],
) -> KernelResult<()> {
    let layout = packing_layout(w, groups, plane, params, dst.len())?;
    if !layout.right {
        return Err(half_panels_on_the_left());
    }
    layout.packing().pack_b_half(true, half, dst);
    Ok(())
}

/// The layout of `w` for packing it into `dst_len` values, checked.
fn packing_layout<'a>(
    w: TensorRef<'a>,
    groups: usize,
    plane: usize,
    params: &MatmulParams,
    dst_len: usize,
) -> KernelResult<WeightLayout<'a>> {
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
    let layout = WeightLayout::new(w.data, w.shape, groups, plane, params)?;
    check_len("conv2d", "packed weight", dst_len, &[layout.packed_len()])?;
    Ok(layout)
}

/// `conv2d(x, w)` into `out` (`[N, O, oh, ow]`): per (image, group), the input patches are laid
/// out as a `[C/groups·kh·kw, oh·ow]` matrix (skipped for 1×1, stride-1, unpadded kernels, where
/// the input already is that matrix) and multiplied by the group's weights on the packed GEMM —
/// read from `packed_w` ([`pack_conv2d_weight`], [`pack_conv2d_weight_half`]) when given, same
/// bits either way. With few output positions ([`weights_right`]) the product is the patches'
/// transpose times the weights' and its result is turned into `out`'s layout. Patches are laid
/// out a chunk at a time ([`patches::patch_chunks`]): whole images, or runs of one image's
/// positions where its patches alone exceed the limit.
pub fn conv2d(
    x: TensorRef<'_>,
    w: TensorRef<'_>,
    attrs: &Conv2dAttrs,
    params: &MatmulParams,
    packed_w: Option<PackedB<'_>>,
    out: &mut [f32],
) -> KernelResult<()> {
    check_len("conv2d", "x", x.data.len(), x.shape)?;
    let g = Conv2dCall::of_shapes("conv2d", x.shape, w.shape, attrs)?;
    check_len("conv2d", "out", out.len(), &g.output_shape())?;
    let groups = attrs.groups;
    let (cg, og) = (g.c / groups, g.o / groups);
    let (kdim, plane) = (cg * g.kh * g.kw, g.oh * g.ow);
    // With the weights packed ahead only their shape is read, but where the GEMM multiplies
    // them unpacked.
    if packed_w.is_none() || conv2d_reads_packed_weight(w.shape, groups, plane, params) {
        check_len("conv2d", "w", w.data.len(), w.shape)?;
    }
    let layout = WeightLayout::new(w.data, w.shape, groups, plane, params)?;
    if out.is_empty() {
        return Ok(());
    }
    let (right, kernel, weights) = (layout.right, layout.kernel, &layout.operands);
    if let Some(p) = packed_w {
        check_len("conv2d", "packed weight", p.len(), &[layout.packed_len()])?;
    }
    let (packed_a, packed_b) = match (right, packed_w) {
        (true, b) => (None, b),
        (false, None) => (None, None),
        (false, Some(PackedB::F32(a))) => (Some(a), None),
        (false, Some(PackedB::Half(..))) => return Err(half_panels_on_the_left()),
    };
    let direct = g.kh == 1 && g.kw == 1 && attrs.stride == [1, 1] && attrs.padding == [0, 0];
    // Where problem i's `og × plane` block of `out` starts.
    let out_offset = |i: usize| (i / groups * g.o + i % groups * og) * plane;
    // Multiplies the chunk's images and positions: problem i = (image, group) reads its
    // patches (`kdim × positions`) at `cols[(i − n0·groups)·col_offset..]`; with the weights
    // on the right, into `turned` (`positions × og` per problem), then turned into `out`'s
    // `og × plane`.
    let mut run = |cols: &[f32], col_offset: usize, chunk: PatchChunk, turned: &mut [f32]| {
        let (n0, p0, np) = (chunk.n0, chunk.p0, chunk.positions().len());
        let count = chunk.images() * groups;
        let problems: Vec<Problem> = (0..count)
            .map(|j| {
                let i = n0 * groups + j;
                let c_offset = match right {
                    true => j * np * og,
                    false => out_offset(i) + p0,
                };
                let (weight, patch) = (i % groups, j);
                let (a, b) = if right {
                    (patch, weight)
                } else {
                    (weight, patch)
                };
                Problem {
                    a,
                    b,
                    c_offset,
                    bias_offset: 0,
                }
            })
            .collect();
        // Patches as `kdim × positions` (weights on the left) or their transpose.
        let patches: Vec<MatRef<'_>> = (0..count)
            .map(|j| {
                let (rs, cs, rows, cols_) = match right {
                    true => (1, np, np, kdim),
                    false => (np, 1, kdim, np),
                };
                MatRef {
                    data: cols,
                    offset: j * col_offset,
                    rs,
                    cs,
                    rows,
                    cols: cols_,
                }
            })
            .collect();
        let (m, n, a, b, ldc) = match right {
            true => (np, og, &patches[..], &weights[..], og),
            false => (og, np, &weights[..], &patches[..], plane),
        };
        let gemm = Gemm {
            m,
            n,
            k: kdim,
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
        if !right {
            gemm.run_packed(out, params, packed_a, packed_b);
            return Ok(());
        }
        gemm.run_packed(turned, params, packed_a, packed_b);
        let shape = [plane, og];
        for (j, block) in turned.chunks_exact(np * og).enumerate() {
            let dst = &mut out[out_offset(n0 * groups + j)..][..og * plane];
            if np == plane {
                let block = TensorRef::new("conv2d", block, &shape)?;
                transpose(block, &[1, 0], &TransposeParams::default(), dst)?;
                continue;
            }
            for (r, channel) in dst.chunks_exact_mut(plane).enumerate() {
                for (p, v) in channel[p0..p0 + np].iter_mut().enumerate() {
                    *v = block[p * og + r];
                }
            }
        }
        Ok(())
    };
    let turned_len = |chunk: &PatchChunk| match right {
        true => chunk.images() * groups * chunk.positions().len() * og,
        false => 0,
    };
    if direct {
        // Image n, group grp starts at channel grp·cg of image n: offset i·cg·H·W.
        let whole = PatchChunk::whole(g.n, plane);
        return with_scratch(turned_len(&whole), |turned| {
            run(x.data, cg * plane, whole, turned)
        });
    }
    for chunk in patch_chunks(g.n, plane, groups * kdim) {
        let np = chunk.positions().len();
        let cols_len = chunk.images() * groups * kdim * np;
        with_scratch(cols_len + turned_len(&chunk), |buf| {
            let (cols, turned) = buf.split_at_mut(cols_len);
            let parallel = cols.len() >= PATCH_PARALLEL;
            let rows = (PATCH_TASK / np).max(1);
            par::for_each_chunk_mut(parallel, cols, rows * np, |task, dst| {
                let first_row = chunk.n0 * groups * kdim + task * rows;
                im2col_rows(x.data, &g, attrs, first_row, chunk.positions(), dst);
            });
            run(cols, kdim * np, chunk, turned)
        })?;
    }
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
            n in 1usize..3, cg in 1usize..4, og in 1usize..4, groups in 1usize..3,
            h in 1usize..10, w in 1usize..10, kh in 1usize..4, kw in 1usize..4,
            stride in (1usize..3, 1usize..3), padding in (0usize..5, 0usize..5),
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
                    let one = on_one_and_two_threads(run);
                    // The weights packed once give the same bits.
                    let plane = want.shape[2] * want.shape[3];
                    let len = conv2d_packed_weight_len(&ws, groups, plane, &params).unwrap();
                    let mut packed = vec![f32::NAN; len];
                    pack_conv2d_weight(wtt, groups, plane, &params, &mut packed).unwrap();
                    let mut prepacked = vec![f32::NAN; want.data.len()];
                    in_pool(2, || conv2d(xt, wtt, &attrs, &params, Some(PackedB::F32(&packed)), &mut prepacked).unwrap());
                    assert_same_bits("packed weights", &one, &prepacked);
                    let k = (cg * kh * kw) as f32;
                    assert_close_in(precision, "conv2d", &one, &want.data, 1e-6 * (k + 1.0), 1e-5);
                }
            }
        }
    }

    #[test]
    fn few_output_positions_put_the_weights_on_the_right() {
        // ResNet-50's last stage on a 64×64 image: 2×2 positions, 3×3 taps over 24 channels.
        // Up to 64 positions where the row kernels take products of B packed ahead on many
        // rows (AVX-512), up to `small_m_packed_b` (8 on AVX2) where they do not.
        let wide_rows = MatmulParams {
            small_m_packed_b: 1 << 12,
            ..MatmulParams::default()
        };
        assert!(weights_right(64, &wide_rows) && !weights_right(65, &wide_rows));
        let few_rows = MatmulParams {
            small_m_packed_b: 8,
            ..MatmulParams::default()
        };
        assert!(weights_right(8, &few_rows) && !weights_right(9, &few_rows));
        let p = MatmulParams::default();
        assert!(weights_right(4, &p) && !weights_right(256, &p));
        let (xs, ws) = ([2, 24, 2, 2], [40, 24, 3, 3]);
        let mut rng = Rng::new(5);
        // The weights' values are f16's (stored in f16), so that f16 panels hold them exactly.
        let w: Vec<f32> = rng.vec(40 * 24 * 9, 1.0);
        let w: Vec<f32> = w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let x = rng.vec(96 * 2, 1.0);
        let (xt, wt) = (
            TensorRef::new("x", &x, &xs).unwrap(),
            TensorRef::new("w", &w, &ws).unwrap(),
        );
        let attrs = Conv2dAttrs {
            padding: [1, 1],
            ..Conv2dAttrs::default()
        };
        let want = reference::conv2d(xt, wt, &attrs).unwrap();
        let len = conv2d_packed_weight_len(&ws, 1, 4, &p).unwrap();
        // Packed as the right operand: output channels in NR-wide panels.
        let nr = MicroKernel::select(p.isa).unwrap().nr;
        assert_eq!(len, 40usize.div_ceil(nr) * nr * 24 * 9);
        let mut packed = vec![f32::NAN; len];
        pack_conv2d_weight(wt, 1, 4, &p, &mut packed).unwrap();
        // And in f16 panels, as a weight stored in f16 is.
        let f16 = Some(HalfType::F16);
        assert_eq!(conv2d_half_weight(4, DType::F16, &p), f16);
        assert_eq!(conv2d_half_weight(4, DType::F32, &p), None);
        let mut halves = vec![u16::MAX; len];
        pack_conv2d_weight_half(wt, 1, 4, &p, HalfType::F16, &mut halves).unwrap();
        let run = |packed_w: Option<PackedB<'_>>| {
            let mut out = vec![f32::NAN; want.data.len()];
            in_pool(2, || {
                conv2d(xt, wt, &attrs, &p, packed_w, &mut out).unwrap()
            });
            out
        };
        let unpacked = run(None);
        assert_close_in(
            Precision::F32,
            "conv2d",
            &unpacked,
            &want.data,
            1e-6 * 217.0,
            1e-5,
        );
        for packed_w in [PackedB::F32(&packed), PackedB::Half(&halves, HalfType::F16)] {
            assert_same_bits("packed weights", &unpacked, &run(Some(packed_w)));
        }
        // 16-bit panels are for the weights on the right only.
        let wide = [2, 24, 16, 16];
        let x = rng.vec(wide.iter().product(), 1.0);
        let xt = TensorRef::new("x", &x, &wide).unwrap();
        assert_eq!(conv2d_half_weight(256, DType::F16, &p), None);
        let mut out = vec![0.0; 2 * 40 * 256];
        let len = conv2d_packed_weight_len(&ws, 1, 256, &p).unwrap();
        let mut halves = vec![0; len];
        assert!(pack_conv2d_weight_half(wt, 1, 256, &p, HalfType::F16, &mut halves).is_err());
        let packed_w = Some(PackedB::Half(&halves, HalfType::F16));
        assert!(conv2d(xt, wt, &attrs, &p, packed_w, &mut out).is_err());
    }

    #[test]
    fn large_images_are_laid_out_one_chunk_at_a_time() {
        // Each padded image has more patch values than half of PATCH_LIMIT: two chunks.
        let side = 2047;
        let xs = [2, 1, side, side];
        let x = Rng::new(9).vec(xs.iter().product(), 1.0);
        let xt = TensorRef::new("t", &x, &xs).unwrap();
        let wt = TensorRef::new("t", &[0.5, -2.0], &[2, 1, 1, 1]).unwrap();
        let attrs = Conv2dAttrs {
            padding: [1, 1],
            ..Conv2dAttrs::default()
        };
        assert!((side + 2) * (side + 2) > patches::PATCH_LIMIT / 2);
        let want = reference::conv2d(xt, wt, &attrs).unwrap();
        let mut out = vec![f32::NAN; want.data.len()];
        conv2d(xt, wt, &attrs, &MatmulParams::default(), None, &mut out).unwrap();
        assert_same_bits("chunked conv2d", &out, &want.data);
    }

    /// An image whose patches alone exceed the limit is laid out a run of its positions at a
    /// time, the runs starting and ending inside output rows: with many positions (weights on
    /// the left, the product into `out`'s columns) and with few (weights on the right, each
    /// run's product turned into its columns), packed ahead or not; the first in two groups.
    /// Tolerance: f32 sums of 18 and of 2.4 M products of values in [-1, 1).
    #[test]
    fn an_image_too_large_is_laid_out_in_runs_of_positions() {
        let mut rng = Rng::new(21);
        let many = ([2, 4, 1000, 700], [4, 2, 3, 3], [2, 1], 1, 2, 1e-4);
        let few = ([1, 9, 513, 513], [2, 9, 512, 512], [1, 1], 0, 1, 2e-2);
        for (xs, ws, stride, pad, groups, atol) in [many, few] {
            let attrs = Conv2dAttrs {
                stride,
                padding: [pad; 2],
                groups,
                ..Conv2dAttrs::default()
            };
            let g = Conv2dCall::of_shapes("t", &xs, &ws, &attrs).unwrap();
            let (kdim, plane) = (ws[1] * ws[2] * ws[3], g.oh * g.ow);
            let (images, positions) = patches::chunk_shape(xs[0], plane, groups * kdim);
            assert_eq!(images, 1);
            assert!(positions < plane && plane % positions != 0);
            let (x, w) = (
                rng.vec(xs.iter().product(), 1.0),
                rng.vec(ws.iter().product(), 1.0),
            );
            let (xt, wt) = (
                TensorRef::new("t", &x, &xs).unwrap(),
                TensorRef::new("t", &w, &ws).unwrap(),
            );
            let want = reference::conv2d(xt, wt, &attrs).unwrap();
            let p = MatmulParams::default();
            let len = conv2d_packed_weight_len(&ws, groups, plane, &p).unwrap();
            let mut packed = vec![0.0; len];
            pack_conv2d_weight(wt, groups, plane, &p, &mut packed).unwrap();
            for packed_w in [None, Some(PackedB::F32(&packed))] {
                let run = || {
                    let mut out = vec![f32::NAN; want.data.len()];
                    conv2d(xt, wt, &attrs, &p, packed_w, &mut out).unwrap();
                    out
                };
                let one = on_one_and_two_threads(run);
                assert_close_in(Precision::F32, "runs", &one, &want.data, atol, 1e-4);
                // The memory plan's per-thread scratch covers what a run of positions asks.
                let asked = in_pool(1, || {
                    let _ = run();
                    crate::scratch::largest_request()
                });
                let kernel = crate::step::prepare::StepKernel::Conv2d {
                    attrs,
                    params: p.clone(),
                    w_shape: ws,
                    plane,
                    half_w: None,
                };
                let ty = |shape: &[usize]| {
                    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                    mslc_core::ops::TensorType::new(mslc_core::ops::DType::F32, shape)
                };
                let ys = [xs[0], ws[0], g.oh, g.ow];
                let bound = crate::step::needs::scratch_floats(
                    &kernel,
                    &[ty(&xs), ty(&ws)],
                    &ty(&ys),
                    packed_w.is_some(),
                );
                assert!(asked <= bound, "asked {asked} of {bound}");
            }
        }
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
        assert!(conv2d(
            xt,
            w3,
            &Conv2dAttrs::default(),
            &p,
            Some(PackedB::F32(&short)),
            &mut out
        )
        .is_err());
        assert!(pack_conv2d_weight(w3, 2, 4, &p, &mut [0.0; 64]).is_err());
    }
}
