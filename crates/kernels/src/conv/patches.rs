//! A convolution's patch matrices (`[C/groups·kh·kw, oh·ow]` per image and group): which
//! pieces of them are laid out at once, so that no image is too large for the scratch, and
//! how a piece is filled from the input (im2col) or walked back into it (the input gradient's
//! col2im).

use std::ops::Range;

use super::{Conv2dAttrs, Conv2dCall};
use crate::par;

/// Most f32 of patches (or patch gradients, and the rows laid out beside them) laid out at
/// once: whole images where one fits, else a run of one image's output positions.
pub(crate) const PATCH_LIMIT: usize = 1 << 23;

/// A piece of a convolution's patches laid out at once: of images `[n0, n1)`, the output
/// positions `[p0, p1)` (every position, `[0, oh·ow)`, unless one image alone exceeds
/// [`PATCH_LIMIT`]; then the piece is one image's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PatchChunk {
    /// First image.
    pub n0: usize,
    /// One past the last image.
    pub n1: usize,
    /// First output position (`oy·ow + ox`).
    pub p0: usize,
    /// One past the last output position.
    pub p1: usize,
}

impl PatchChunk {
    /// Every position of all `n` images: what a product that needs no patches laid out (a 1×1,
    /// stride-1, unpadded kernel reads its input planes as they are) covers in one call.
    pub fn whole(n: usize, plane: usize) -> Self {
        Self {
            n0: 0,
            n1: n,
            p0: 0,
            p1: plane,
        }
    }

    /// The images it covers.
    pub fn images(&self) -> usize {
        self.n1 - self.n0
    }

    /// The output positions it covers in each image.
    pub fn positions(&self) -> Range<usize> {
        self.p0..self.p1
    }
}

/// Images and positions per chunk for `n` images of `plane` output positions, each position
/// taking `per_position` f32: as many whole images as [`PATCH_LIMIT`] holds (at least one, at
/// most `n`); where one image alone is more, as many of its positions as it holds (at least
/// one). A chunk therefore holds at most `max(PATCH_LIMIT, per_position)` f32.
pub(crate) fn chunk_shape(n: usize, plane: usize, per_position: usize) -> (usize, usize) {
    let per_image = per_position.saturating_mul(plane);
    if per_image <= PATCH_LIMIT {
        ((PATCH_LIMIT / per_image.max(1)).clamp(1, n.max(1)), plane)
    } else {
        (1, (PATCH_LIMIT / per_position.max(1)).clamp(1, plane))
    }
}

/// The chunks of [`chunk_shape`], in order: images first, then each image's positions. With no
/// positions (`plane == 0`) each chunk of images still comes once, with an empty range.
pub(crate) fn patch_chunks(
    n: usize,
    plane: usize,
    per_position: usize,
) -> impl Iterator<Item = PatchChunk> {
    let (images, positions) = chunk_shape(n, plane, per_position);
    (0..n).step_by(images).flat_map(move |n0| {
        (0..plane.max(1))
            .step_by(positions.max(1))
            .map(move |p0| PatchChunk {
                n0,
                n1: (n0 + images).min(n),
                p0,
                p1: (p0 + positions).min(plane),
            })
    })
}

/// The output rows that positions `[p0, p1)` of a `ow`-wide output touch.
fn rows_of(positions: &Range<usize>, ow: usize) -> Range<usize> {
    match positions.is_empty() || ow == 0 {
        true => 0..0,
        false => positions.start / ow..positions.end.div_ceil(ow),
    }
}

/// Of positions `[p0, p1)`, those in output row `oy`: their columns `xa..xb` and the index of
/// column `xa` among the range's positions.
fn run_in_row(positions: &Range<usize>, ow: usize, oy: usize) -> (Range<usize>, usize) {
    let row = oy * ow;
    let (xa, xb) = (
        positions.start.max(row) - row,
        positions.end.min(row + ow) - row,
    );
    (xa..xb, row + xa - positions.start)
}

/// The outputs `[lo, hi)` of a window axis (`out` long) whose tap `offset` (tap index times
/// dilation) lands inside an input of `len` padded by `pad`: those before and after read
/// padding. Input index of output `o` inside: `o·stride + offset − pad`.
fn inside_range(
    out: usize,
    len: usize,
    stride: usize,
    pad: usize,
    offset: usize,
) -> (usize, usize) {
    let lo = pad.saturating_sub(offset).div_ceil(stride).min(out);
    let hi = (len + pad)
        .checked_sub(offset)
        .map_or(0, |n| n.div_ceil(stride))
        .clamp(lo, out);
    (lo, hi)
}

/// Fills rows `[first_row, first_row + dst.len() / positions.len())` of the stacked patch
/// matrices at output positions `positions`: row `r` is problem `r / kdim` (image, group),
/// kernel tap `(ci, i, j)` = `r % kdim`, one value per position. The taps advance by counting,
/// not by dividing per row, and each output row's run of positions is zeros where its window
/// reads padding and a copy (stride 1) or a strided gather between, with no test per value.
pub(crate) fn im2col_rows(
    x: &[f32],
    g: &Conv2dCall,
    a: &Conv2dAttrs,
    first_row: usize,
    positions: Range<usize>,
    dst: &mut [f32],
) {
    if positions.is_empty() {
        return;
    }
    let cg = g.c / a.groups;
    let kdim = cg * g.kh * g.kw;
    let (mut problem, tap) = (first_row / kdim, first_row % kdim);
    let (mut ci, mut i, mut j) = (tap / (g.kh * g.kw), tap / g.kw % g.kh, tap % g.kw);
    let [sy, sx] = a.stride;
    let (p0, p1) = (positions.start, positions.end);
    for row in dst.chunks_exact_mut(positions.len()) {
        let (n, grp) = (problem / a.groups, problem % a.groups);
        let channel = &x[((n * g.c + grp * cg + ci) * g.h) * g.w..][..g.h * g.w];
        let (y0, y1) = inside_range(g.oh, g.h, sy, a.padding[0], i * a.dilation[0]);
        let (x0, x1) = inside_range(g.ow, g.w, sx, a.padding[1], j * a.dilation[1]);
        // The positions in output rows whose windows read the input; those before and after
        // read padding rows.
        let reading = (y0 * g.ow).clamp(p0, p1)..(y1 * g.ow).clamp(p0, p1);
        row[..reading.start - p0].fill(0.0);
        row[reading.end - p0..].fill(0.0);
        for oy in rows_of(&reading, g.ow) {
            let (xs, at) = run_in_row(&positions, g.ow, oy);
            let run = &mut row[at..at + xs.len()];
            // The run's columns that read the input.
            let (lo, hi) = (x0.clamp(xs.start, xs.end), x1.clamp(xs.start, xs.end));
            run[..lo - xs.start].fill(0.0);
            run[hi - xs.start..].fill(0.0);
            if lo == hi {
                continue;
            }
            let iy = oy * sy + i * a.dilation[0] - a.padding[0];
            let start = iy * g.w + lo * sx + j * a.dilation[1] - a.padding[1];
            let inside = &mut run[lo - xs.start..hi - xs.start];
            if sx == 1 {
                inside.copy_from_slice(&channel[start..start + inside.len()]);
            } else {
                let src = &channel[start..=start + (inside.len() - 1) * sx];
                for (v, taps) in inside.iter_mut().zip(src.chunks(sx)) {
                    *v = taps[0];
                }
            }
        }
        j += 1;
        if j == g.kw {
            (j, i) = (0, i + 1);
            if i == g.kh {
                (i, ci) = (0, ci + 1);
                if ci == cg {
                    (ci, problem) = (0, problem + 1);
                }
            }
        }
    }
}

/// Adds the patch gradients of `chunk`'s images at its positions back into the input planes
/// they were read from: `cols` holds, per (image, group), the `[C/groups·kh·kw, positions]`
/// gradients (their transpose when `right`); `dx` is the chunk's images. The chunk starting an
/// image's positions (`p0 == 0`) writes its planes, later ones add. Each task owns whole
/// planes of `dx` and adds their taps in one order, so the sums do not depend on the thread
/// count.
pub(crate) fn col2im(
    cols: &[f32],
    g: &Conv2dCall,
    a: &Conv2dAttrs,
    right: bool,
    chunk: PatchChunk,
    dx: &mut [f32],
) {
    let cg = g.c / a.groups;
    let positions = chunk.positions();
    let (kdim, np, area) = (cg * g.kh * g.kw, positions.len(), g.h * g.w);
    // Where tap t's value at the chunk's position p lies in its problem's block.
    let (tap_step, position_step) = if right { (1, kdim) } else { (np, 1) };
    let out_rows = rows_of(&positions, g.ow);
    let parallel = dx.len().saturating_mul(g.kh * g.kw) >= PATCH_PARALLEL;
    let planes = (PATCH_TASK / area.max(1)).max(1);
    par::for_each_chunk_mut(parallel, dx, planes * area, |task, planes_of_task| {
        for (k, dst) in planes_of_task.chunks_exact_mut(area).enumerate() {
            let index = task * planes + k;
            let (image, channel) = (index / g.c, index % g.c);
            let (group, ci) = (channel / cg, channel % cg);
            let block = (image * a.groups + group) * kdim * np;
            if chunk.p0 == 0 {
                dst.fill(0.0);
            }
            for ky in 0..g.kh {
                let (y0, y1) =
                    inside_range(g.oh, g.h, a.stride[0], a.padding[0], ky * a.dilation[0]);
                let oys = y0.max(out_rows.start)..y1.min(out_rows.end);
                for kx in 0..g.kw {
                    let (x0, x1) =
                        inside_range(g.ow, g.w, a.stride[1], a.padding[1], kx * a.dilation[1]);
                    let tap = block + ((ci * g.kh + ky) * g.kw + kx) * tap_step;
                    for oy in oys.clone() {
                        let (xs, at) = run_in_row(&positions, g.ow, oy);
                        let iy = oy * a.stride[0] + ky * a.dilation[0] - a.padding[0];
                        let row = &mut dst[iy * g.w..][..g.w];
                        let from = tap + at * position_step;
                        for ox in x0.max(xs.start)..x1.min(xs.end) {
                            let ix = ox * a.stride[1] + kx * a.dilation[1] - a.padding[1];
                            row[ix] += cols[from + (ox - xs.start) * position_step];
                        }
                    }
                }
            }
        }
    });
}

/// col2im work (input values), or patch values laid out, below which it runs on the calling
/// thread.
pub(crate) const PATCH_PARALLEL: usize = 1 << 15;

/// Input values per col2im task (whole planes), or patch values per task laying them out (whole
/// rows); at least one plane or row.
pub(crate) const PATCH_TASK: usize = 1 << 13;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_image_and_position_once() {
        // Whole images, three to a chunk.
        let per_position = PATCH_LIMIT / 3 / 100;
        let chunks: Vec<_> = patch_chunks(7, 100, per_position).collect();
        let images: Vec<_> = chunks.iter().map(|c| (c.n0, c.n1, c.p0, c.p1)).collect();
        assert_eq!(images, [(0, 3, 0, 100), (3, 6, 0, 100), (6, 7, 0, 100)]);
        // One image is more than the limit: runs of its positions, each within it.
        let per_position = PATCH_LIMIT / 40;
        let chunks: Vec<_> = patch_chunks(2, 100, per_position).collect();
        assert_eq!(chunks.len(), 6);
        for (k, c) in chunks.iter().enumerate() {
            assert_eq!((c.n0, c.n1), (k / 3, k / 3 + 1));
            assert_eq!(c.p0, k % 3 * 40);
            assert!(c.positions().len() * per_position <= PATCH_LIMIT);
        }
        assert_eq!(chunks[2].p1, 100);
        // A position alone over the limit: one at a time.
        assert_eq!(chunk_shape(3, 5, PATCH_LIMIT * 2), (1, 1));
        // No positions: each chunk of images once, empty.
        let empty: Vec<_> = patch_chunks(2, 0, 5)
            .map(|c| (c.n0, c.n1, c.p0, c.p1))
            .collect();
        assert_eq!(empty, [(0, 2, 0, 0)]);
    }

    #[test]
    fn runs_cut_positions_at_output_rows() {
        let positions = 5..19;
        let runs: Vec<_> = rows_of(&positions, 6)
            .map(|oy| run_in_row(&positions, 6, oy))
            .collect();
        assert_eq!(runs, [(5..6, 0), (0..6, 1), (0..6, 7), (0..1, 13)]);
        assert!(rows_of(&(4..4), 6).is_empty());
    }
}
