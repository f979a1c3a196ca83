//! The register-blocked micro-kernels: C[MR×NR] (+)= A_panel · B_panel over packed operands.
//!
//! Every C element is one chain of multiply-adds in increasing k order, whatever tile, block or
//! thread it falls in, so results never depend on how the work is split.

use serde::{Deserialize, Serialize};

/// Rows of C computed by one micro-kernel call.
pub const MR: usize = 6;
/// Columns of C computed by one micro-kernel call.
pub const NR: usize = 16;

/// Which micro-kernel implementation runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isa {
    /// AVX2+FMA when the CPU has them (detected at run time), portable otherwise.
    #[default]
    Auto,
    /// The portable kernel, whatever the CPU (for testing and comparison).
    Portable,
}

/// Signature shared by the micro-kernels.
///
/// `kernel(k, a, b, c, ldc, accumulate)` reads `k * MR` values at `a` (k groups of MR, one per
/// row) and `k * NR` at `b` (k groups of NR, one per column), and writes the full MR×NR tile at
/// `c` with row stride `ldc`: `c = a·b`, or `c = c + a·b` when `accumulate`.
pub type MicroKernel = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

/// The micro-kernel to use for `isa` on this CPU.
pub fn select(isa: Isa) -> MicroKernel {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Auto && crate::kernels::cpu::has_avx2_fma() {
        return avx2_fma;
    }
    let _ = isa;
    portable
}

/// Portable micro-kernel (vectorised by the compiler for the baseline target).
///
/// # Safety
/// As [`MicroKernel`]: `a`, `b` valid for `k * MR` and `k * NR` reads, `c` for an MR×NR tile of
/// row stride `ldc`, no overlap between `c` and the inputs.
unsafe fn portable(
    k: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller guarantees these extents.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, k * MR),
            std::slice::from_raw_parts(b, k * NR),
        )
    };
    let mut acc = [[0.0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += ap[i] * bp[j];
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i of the tile lies at c + i * ldc and holds NR values.
        let out = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), NR) };
        for (o, &v) in out.iter_mut().zip(row) {
            *o = if accumulate { *o + v } else { v };
        }
    }
}

/// AVX2+FMA micro-kernel: 12 ymm accumulators, two B vectors and one A broadcast per k step.
///
/// # Safety
/// As [`MicroKernel`], and the CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_fma(
    k: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY: all pointer arithmetic stays within the extents the caller guarantees.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..k {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm256_broadcast_ss(&*ap.add(i));
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        for (i, row) in acc.iter().enumerate() {
            let ci = c.add(i * ldc);
            let (mut r0, mut r1) = (row[0], row[1]);
            if accumulate {
                r0 = _mm256_add_ps(_mm256_loadu_ps(ci), r0);
                r1 = _mm256_add_ps(_mm256_loadu_ps(ci.add(8)), r1);
            }
            _mm256_storeu_ps(ci, r0);
            _mm256_storeu_ps(ci.add(8), r1);
        }
    }
}
