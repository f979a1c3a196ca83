//! The register-blocked micro-kernels: C[MR×NR] (+)= A_panel · B_panel over packed operands.
//!
//! Every C element is one chain of multiply-adds in increasing k order, whatever tile, block or
//! thread it falls in, so results never depend on how the work is split. The AVX2 and AVX-512
//! kernels both use fused multiply-adds, so they give identical bits too.

use serde::{Deserialize, Serialize};

use crate::error::{KernelError, KernelResult};

/// Largest MR of any kernel (sizes the edge-tile buffer).
pub const MAX_MR: usize = 12;
/// Largest NR of any kernel.
pub const MAX_NR: usize = 32;

/// Which micro-kernel implementation runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isa {
    /// The best the CPU offers (detected at run time): AVX-512, else AVX2+FMA, else portable.
    #[default]
    Auto,
    /// 12×32 AVX-512F kernel.
    Avx512,
    /// 6×16 AVX2+FMA kernel.
    Avx2,
    /// 6×16 portable kernel (vectorised by the compiler for the baseline target).
    Portable,
}

/// Signature shared by the micro-kernels.
///
/// `kernel(k, a, b, c, ldc, accumulate)` reads `k * MR` values at `a` (k groups of MR, one per
/// row) and `k * NR` at `b` (k groups of NR, one per column), and writes the full MR×NR tile at
/// `c` with row stride `ldc`: `c = a·b`, or `c = c + a·b` when `accumulate`.
pub type KernelFn = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

/// A chosen micro-kernel with its tile geometry.
#[derive(Clone, Copy, Debug)]
pub struct MicroKernel {
    /// The implementation (never [`Isa::Auto`]).
    pub isa: Isa,
    /// Rows per tile.
    pub mr: usize,
    /// Columns per tile.
    pub nr: usize,
    /// The kernel itself.
    pub run: KernelFn,
}

impl MicroKernel {
    /// The kernel for `isa`; an error when this CPU cannot run it.
    pub fn select(isa: Isa) -> KernelResult<Self> {
        let portable = Self {
            isa: Isa::Portable,
            mr: 6,
            nr: 16,
            run: portable::<6, 16>,
        };
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = Self {
                isa: Isa::Avx2,
                mr: 6,
                nr: 16,
                run: avx2_fma,
            };
            let avx512 = Self {
                isa: Isa::Avx512,
                mr: 12,
                nr: 32,
                run: avx512,
            };
            let has_avx512 = std::arch::is_x86_feature_detected!("avx512f");
            let has_avx2 = crate::cpu::has_avx2_fma();
            match isa {
                Isa::Auto if has_avx512 => return Ok(avx512),
                Isa::Auto if has_avx2 => return Ok(avx2),
                Isa::Avx512 if has_avx512 => return Ok(avx512),
                Isa::Avx2 if has_avx2 => return Ok(avx2),
                _ => {}
            }
        }
        match isa {
            Isa::Auto | Isa::Portable => Ok(portable),
            other => Err(KernelError::new(
                "matmul",
                format!("this CPU cannot run the {other:?} micro-kernel"),
            )),
        }
    }
}

/// Portable micro-kernel.
///
/// # Safety
/// As [`KernelFn`]: `a`, `b` valid for `k * MR` and `k * NR` reads, `c` for an MR×NR tile of
/// row stride `ldc`, no overlap between `c` and the inputs.
unsafe fn portable<const MR: usize, const NR: usize>(
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

/// AVX2+FMA micro-kernel, 6×16: 12 ymm accumulators, two B vectors and one A broadcast per k.
///
/// # Safety
/// As [`KernelFn`] with MR = 6, NR = 16, and the CPU must support AVX2 and FMA.
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
    const MR: usize = 6;
    const NR: usize = 16;
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
            avx2_store(c.add(i * ldc), row, accumulate);
        }
    }
}

/// Writes one row's two accumulators to the 16 values at `c`, added to what is there when
/// `accumulate`.
///
/// # Safety
/// `c` must hold 16 values, and the CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn avx2_store(
    c: *mut f32,
    row: &[std::arch::x86_64::__m256; 2],
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the 16 values.
    unsafe {
        let (mut r0, mut r1) = (row[0], row[1]);
        if accumulate {
            r0 = _mm256_add_ps(_mm256_loadu_ps(c), r0);
            r1 = _mm256_add_ps(_mm256_loadu_ps(c.add(8)), r1);
        }
        _mm256_storeu_ps(c, r0);
        _mm256_storeu_ps(c.add(8), r1);
    }
}

/// AVX-512F micro-kernel, 12×32: 24 zmm accumulators, two B vectors and one A broadcast per k.
///
/// # Safety
/// As [`KernelFn`] with MR = 12, NR = 32, and the CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(
    k: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    const MR: usize = 12;
    const NR: usize = 32;
    // SAFETY: all pointer arithmetic stays within the extents the caller guarantees.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..k {
            let b0 = _mm512_loadu_ps(bp);
            let b1 = _mm512_loadu_ps(bp.add(16));
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*ap.add(i));
                row[0] = _mm512_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm512_fmadd_ps(ai, b1, row[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        for (i, row) in acc.iter().enumerate() {
            let ci = c.add(i * ldc);
            let (mut r0, mut r1) = (row[0], row[1]);
            if accumulate {
                r0 = _mm512_add_ps(_mm512_loadu_ps(ci), r0);
                r1 = _mm512_add_ps(_mm512_loadu_ps(ci.add(16)), r1);
            }
            _mm512_storeu_ps(ci, r0);
            _mm512_storeu_ps(ci.add(16), r1);
        }
    }
}
