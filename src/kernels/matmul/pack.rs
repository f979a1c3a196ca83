//! Packing: copying operand blocks into the contiguous, zero-padded panel layout the
//! micro-kernels stream through.
//!
//! A packed A panel holds MR rows over all k: `dst[p * MR + i] = A[r0 + i][p]`.
//! A packed B panel holds NR columns over all k: `dst[p * NR + j] = B[p][c0 + j]`.
//! A k-slab `[p0, p1)` of a panel is then the contiguous range `[p0 * MR, p1 * MR)`.

use super::kernel::{MR, NR};

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

/// Packs rows `[r0, r0 + MR)` of `a` (rows × k) into `dst` (`k * MR` values); rows past the end
/// are zero.
pub fn pack_a_panel(a: MatRef<'_>, r0: usize, dst: &mut [f32]) {
    let k = a.cols;
    debug_assert_eq!(dst.len(), k * MR);
    let rows = MR.min(a.rows - r0);
    if rows < MR {
        dst.fill(0.0);
    }
    if a.cs == 1 {
        for i in 0..rows {
            let start = a.offset + (r0 + i) * a.rs;
            let src = &a.data[start..start + k];
            for (d, &s) in dst[i..].iter_mut().step_by(MR).zip(src) {
                *d = s;
            }
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

/// Packs columns `[c0, c0 + NR)` of `b` (k × cols) into `dst` (`k * NR` values); columns past
/// the end are zero.
pub fn pack_b_panel(b: MatRef<'_>, c0: usize, dst: &mut [f32]) {
    let k = b.rows;
    debug_assert_eq!(dst.len(), k * NR);
    let cols = NR.min(b.cols - c0);
    if cols < NR {
        dst.fill(0.0);
    }
    if b.cs == 1 {
        for (p, d) in dst.chunks_exact_mut(NR).enumerate() {
            let start = b.offset + p * b.rs + c0;
            d[..cols].copy_from_slice(&b.data[start..start + cols]);
        }
    } else if b.rs == 1 {
        for j in 0..cols {
            let start = b.offset + (c0 + j) * b.cs;
            let src = &b.data[start..start + k];
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
