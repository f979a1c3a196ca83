//! Packing: copying operand blocks into the contiguous, zero-padded panel layout the
//! micro-kernels stream through.
//!
//! A packed A panel holds MR rows over all k: `dst[p * MR + i] = A[r0 + i][p]`.
//! A packed B panel holds NR columns over all k: `dst[p * NR + j] = B[p][c0 + j]`.
//! A k-slab `[p0, p1)` of a panel is then the contiguous range `[p0 * MR, p1 * MR)`.
//! MR and NR are those of the micro-kernel in use (see [`super::kernel::MicroKernel`]).

/// A read-only strided matrix: element `(r, c)` is `data[offset + r * rs + c * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// Backing storage.
    pub data: &'a [f32],
    /// Position of element (0, 0).
    pub offset: usize,
    /// Distance between rows.
    pub rs: usize,
    /// Distance between columns.
    pub cs: usize,
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
}

impl MatRef<'_> {
    /// The same matrix with rows and columns exchanged (no copy).
    pub fn t(self) -> Self {
        Self {
            rs: self.cs,
            cs: self.rs,
            rows: self.cols,
            cols: self.rows,
            ..self
        }
    }
}

/// Packs rows `[r0, r0 + mr)` of `a` (rows × k) into `dst` (`k * mr` values); rows past the end
/// are zero. `mr` is a kernel's tile height (6 or 12).
pub fn pack_a_panel(a: MatRef<'_>, r0: usize, mr: usize, dst: &mut [f32]) {
    match mr {
        6 => pack_a::<6>(a, r0, dst),
        12 => pack_a::<12>(a, r0, dst),
        _ => unreachable!("no micro-kernel has MR = {mr}"),
    }
}

/// Packs columns `[c0, c0 + nr)` of `b` (k × cols) into `dst` (`k * nr` values); columns past
/// the end are zero. `nr` is a kernel's tile width (16 or 32).
pub fn pack_b_panel(b: MatRef<'_>, c0: usize, nr: usize, dst: &mut [f32]) {
    match nr {
        16 => pack_b::<16>(b, c0, dst),
        32 => pack_b::<32>(b, c0, dst),
        _ => unreachable!("no micro-kernel has NR = {nr}"),
    }
}

fn pack_a<const MR: usize>(a: MatRef<'_>, r0: usize, dst: &mut [f32]) {
    let k = a.cols;
    debug_assert_eq!(dst.len(), k * MR);
    let rows = MR.min(a.rows - r0);
    if rows < MR {
        dst.fill(0.0);
    }
    if a.cs == 1 && rows == MR {
        // Row-major A (activations): each of the MR rows is a contiguous run over k.
        let starts: [usize; MR] = std::array::from_fn(|i| a.offset + (r0 + i) * a.rs);
        pack_runs(a.data, &starts, k, dst);
    } else if a.rs == 1 {
        // A stored transposed (a weight gradient's dyᵀ): each k step is a contiguous run.
        for (p, d) in dst.chunks_exact_mut(MR).enumerate() {
            let start = a.offset + p * a.cs + r0;
            d[..rows].copy_from_slice(&a.data[start..start + rows]);
        }
    } else {
        for (p, d) in dst.chunks_exact_mut(MR).enumerate() {
            let base = a.offset + p * a.cs + r0 * a.rs;
            for (i, v) in d[..rows].iter_mut().enumerate() {
                *v = a.data[base + i * a.rs];
            }
        }
    }
}

fn pack_b<const NR: usize>(b: MatRef<'_>, c0: usize, dst: &mut [f32]) {
    let k = b.rows;
    debug_assert_eq!(dst.len(), k * NR);
    let cols = NR.min(b.cols - c0);
    if cols < NR {
        dst.fill(0.0);
    }
    if b.cs == 1 {
        for (p, d) in dst.chunks_exact_mut(NR).enumerate() {
            let start = b.offset + p * b.rs + c0;
            if cols == NR {
                let d: &mut [f32; NR] = d.try_into().expect("NR values");
                *d = b.data[start..start + NR].try_into().expect("NR values");
            } else {
                d[..cols].copy_from_slice(&b.data[start..start + cols]);
            }
        }
    } else if b.rs == 1 {
        let start = |j: usize| b.offset + (c0 + j) * b.cs;
        let starts: [usize; NR] = std::array::from_fn(start);
        if cols == NR {
            pack_runs(b.data, &starts, k, dst);
        } else {
            interleave(b.data, &starts[..cols], k, NR, dst);
        }
    } else {
        for (p, d) in dst.chunks_exact_mut(NR).enumerate() {
            let base = b.offset + p * b.rs + c0 * b.cs;
            for (j, v) in d[..cols].iter_mut().enumerate() {
                *v = b.data[base + j * b.cs];
            }
        }
    }
}

/// Interleaves W runs of k contiguous values: `dst[p * W + j] = data[starts[j] + p]` (A's rows
/// of a row-major A, B's columns of a transposed B). A transpose in registers where the CPU
/// has AVX2, element by element otherwise; the same values either way.
fn pack_runs<const W: usize>(data: &[f32], starts: &[usize; W], k: usize, dst: &mut [f32]) {
    assert!(
        starts.iter().all(|&s| s + k <= data.len()) && dst.len() == k * W,
        "pack: a panel outside its buffer"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2_fma() {
        // SAFETY: AVX2 is present; every run holds k values and `dst` k * W (checked above).
        unsafe { pack_runs_avx2(data, starts, k, dst) };
        return;
    }
    interleave(data, starts, k, W, dst);
}

/// [`pack_runs`] element by element, for any number of runs (at most `width`): run `j` goes to
/// `dst[p * width + j]`.
fn interleave(data: &[f32], starts: &[usize], k: usize, width: usize, dst: &mut [f32]) {
    for (j, &start) in starts.iter().enumerate() {
        for (d, &s) in dst[j..]
            .iter_mut()
            .step_by(width)
            .zip(&data[start..start + k])
        {
            *d = s;
        }
    }
}

/// [`pack_runs`] through 8×8 register transposes, eight runs at a time; a last group of fewer
/// than eight runs is transposed with zero rows, and only its own lanes stored (but for a
/// panel of fewer than eight runs, whose steps lie back to back: see the stores).
///
/// # Safety
/// AVX2 must be available, every `starts[j] + k <= data.len()`, and `dst.len() == k * W`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_runs_avx2<const W: usize>(
    data: &[f32],
    starts: &[usize; W],
    k: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    let src = data.as_ptr();
    let out = dst.as_mut_ptr();
    let full = k - k % 8;
    // SAFETY: reads stay below starts[j] + full <= data.len(); writes below full * W.
    unsafe {
        for p in (0..full).step_by(8) {
            for group in (0..W).step_by(8) {
                let width = (W - group).min(8);
                let r: [__m256; 8] = std::array::from_fn(|i| {
                    if i < width {
                        _mm256_loadu_ps(src.add(starts[group + i] + p))
                    } else {
                        _mm256_setzero_ps()
                    }
                });
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let rows = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (q, row) in rows.iter().enumerate() {
                    let at = out.add((p + q) * W + group);
                    // A panel narrower than 8 (AVX2's 6 rows) stores its steps as full vectors
                    // in order, each spilling into the next step's lanes, which the next
                    // store overwrites; only the last step stores its own lanes alone.
                    if width == 8 || (W < 8 && q < 7) {
                        _mm256_storeu_ps(at, *row);
                    } else {
                        let lanes: [f32; 8] = std::mem::transmute(*row);
                        std::ptr::copy_nonoverlapping(lanes.as_ptr(), at, width);
                    }
                }
            }
        }
    }
    for p in full..k {
        for (j, &s) in starts.iter().enumerate() {
            dst[p * W + j] = data[s + p];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every panel width of the micro-kernels, with k on and off the transpose's 8-step, from
    /// runs at scattered starts: the packed panel is the definition's, whichever path ran.
    #[test]
    fn runs_pack_into_the_panel_layout() {
        fn check<const W: usize>(k: usize) {
            let data: Vec<f32> = (0..W * (k + 3) + 5).map(|i| i as f32).collect();
            let starts: [usize; W] = std::array::from_fn(|j| ((j * 7) % W) * (k + 3) + j % 3);
            let mut dst = vec![f32::NAN; k * W];
            pack_runs(&data, &starts, k, &mut dst);
            for p in 0..k {
                for (j, &s) in starts.iter().enumerate() {
                    assert_eq!(dst[p * W + j], data[s + p], "W {W}, k {k}, p {p}, run {j}");
                }
            }
        }
        for k in [1, 7, 8, 19, 64] {
            check::<6>(k);
            check::<12>(k);
            check::<16>(k);
            check::<32>(k);
        }
    }
}
