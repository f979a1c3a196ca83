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
        let row = |i: usize| &a.data[a.offset + (r0 + i) * a.rs..][..k];
        let rows: [&[f32]; MR] = std::array::from_fn(row);
        for (p, d) in dst.chunks_exact_mut(MR).enumerate() {
            for (v, r) in d.iter_mut().zip(&rows) {
                *v = r[p];
            }
        }
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
        #[cfg(target_arch = "x86_64")]
        if cols == NR && crate::cpu::has_avx2_fma() {
            let starts: [usize; NR] = std::array::from_fn(start);
            assert!(
                starts[NR - 1] + k <= b.data.len(),
                "pack: B panel outside its buffer"
            );
            // SAFETY: AVX2 is present; all NR source columns hold k values (checked above) and
            // `dst` holds k * NR values.
            unsafe { pack_b_transposed_avx2(b.data, &starts, k, dst) };
            return;
        }
        for j in 0..cols {
            let src = &b.data[start(j)..start(j) + k];
            for (d, &s) in dst[j..].iter_mut().step_by(NR).zip(src) {
                *d = s;
            }
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

/// Packs NR columns stored as contiguous runs (`data[starts[j] + p]` is B[p][j]) through 8×8
/// register transposes.
///
/// # Safety
/// AVX2 must be available, every `starts[j] + k <= data.len()`, and `dst.len() == k * NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_transposed_avx2<const NR: usize>(
    data: &[f32],
    starts: &[usize; NR],
    k: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    let src = data.as_ptr();
    let out = dst.as_mut_ptr();
    let full = k - k % 8;
    // SAFETY: reads stay below starts[j] + full <= data.len(); writes below full * NR.
    unsafe {
        for p in (0..full).step_by(8) {
            for block in 0..NR / 8 {
                let r: [__m256; 8] =
                    std::array::from_fn(|i| _mm256_loadu_ps(src.add(starts[block * 8 + i] + p)));
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
                    _mm256_storeu_ps(out.add((p + q) * NR + block * 8), *row);
                }
            }
        }
    }
    for p in full..k {
        for (j, &s) in starts.iter().enumerate() {
            dst[p * NR + j] = data[s + p];
        }
    }
}
