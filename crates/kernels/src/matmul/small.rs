//! The unpacked-A path: A is read where it lies instead of being packed into MR-row panels,
//! by row kernels of up to 12 rows (AVX-512) or 6. Decode shapes (one token, m = 1..8) take it
//! on every CPU, where panels would be mostly zero padding; on AVX-512 so does every product
//! with B packed ahead, up to [`super::default_small_m_packed_b`] rows, skipping the packing
//! pass. The work is split over column panels first (no task repacks B), then over row blocks
//! when the columns leave threads idle.
//!
//! B is read from the caller's packed panels when given ([`Gemm::pack_b`]); else, when every B
//! is row-major, straight from its rows (only a last, narrower panel is packed); else it is
//! packed first like the tiled path does. Every C element is still one chain of multiply-adds
//! over each `kc` slab, added to C slab after slab, so the bits equal the tiled path's.

use super::gemm::{block_range, Gemm, HalfType, PackedB, Problem, RightForm};
#[cfg(target_arch = "x86_64")]
use super::kernel::avx2_store;
use super::kernel::{Isa, MAX_NR};
use super::pack::pack_b_panel;
use super::prefetch;
use super::MatmulParams;
use crate::par::{self, SyncPtr};
use crate::scratch::with_scratch;

/// Rows one row-kernel call computes at most, on any ISA.
const MAX_ROWS: usize = WIDE_ROWS;
/// Rows of the AVX-512 row kernels: 24 accumulators (two vectors per row) of 32 registers,
/// leaving room for two B vectors and a broadcast.
const WIDE_ROWS: usize = 12;
/// Rows of the AVX2 and portable row kernels: 12 accumulators of 16 registers.
const NARROW_ROWS: usize = 6;

/// Rows one row-kernel call of `isa` computes at most.
fn max_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => WIDE_ROWS,
        _ => NARROW_ROWS,
    }
}

/// One row-kernel call: `rows × NR` of C (+)= A rows · one B panel over `k` steps.
#[derive(Clone, Copy)]
struct RowsCall {
    k: usize,
    /// Element (i, p) of A is at `a + i * a_rs + p * a_cs`.
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    /// Step p of the panel (NR values: f32, or 16-bit for a kernel reading half panels)
    /// starts `p * ldb` values past `b`.
    b: *const u8,
    ldb: usize,
    /// Row i of the C tile starts at `c + i * ldc`.
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
}

/// A row kernel: computes the call's `R` rows (its const parameter) for one ISA.
type RowsFn = unsafe fn(&RowsCall);

/// Panels of f32 values (a row kernel's `P` parameter).
const F32_PANELS: u8 = 0;
/// Panels of f16 bits.
const F16_PANELS: u8 = 1;
/// Panels of bf16 bits.
const BF16_PANELS: u8 = 2;

/// The row kernel for `isa` (never `Auto`) and `rows` (1..=[`max_rows`] of `isa`), reading
/// panels of `half` (f32 when `None`).
fn rows_kernel(isa: Isa, rows: usize, half: Option<HalfType>) -> RowsFn {
    match half {
        None => rows_kernel_of::<F32_PANELS>(isa, rows),
        Some(HalfType::F16) => rows_kernel_of::<F16_PANELS>(isa, rows),
        Some(HalfType::Bf16) => rows_kernel_of::<BF16_PANELS>(isa, rows),
    }
}

/// [`rows_kernel`] for panels of `P` ([`F32_PANELS`], [`F16_PANELS`], [`BF16_PANELS`]).
fn rows_kernel_of<const P: u8>(isa: Isa, rows: usize) -> RowsFn {
    macro_rules! by_rows {
        ($f:ident: $($r:literal)+) => {
            match rows {
                $($r => $f::<$r, P>,)+
                _ => unreachable!("no {isa:?} row kernel of {rows} rows"),
            }
        };
    }
    const _: () = assert!(WIDE_ROWS == 12 && NARROW_ROWS == 6, "the row lists below");
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => by_rows!(avx2_rows: 1 2 3 4 5 6),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => by_rows!(avx512_rows: 1 2 3 4 5 6 7 8 9 10 11 12),
        _ => by_rows!(portable_rows: 1 2 3 4 5 6),
    }
}

/// A kernel for one row over several adjacent full panels, whose starts are the slice (the
/// call's `b` is the first; each steps by `ldb`); the row's C holds all their columns.
type RowPanelsFn = unsafe fn(&RowsCall, &[*const u8]);

/// Most full panels a one-row call takes ([`row_panels_kernel`]).
const MAX_ROW_PANELS: usize = 4;

/// The one-row kernel of `isa` (never `Auto`) over `count` full panels of `half` (2 or
/// [`MAX_ROW_PANELS`]), where one exists: AVX2's. Its one-row kernel waits on two chains of
/// FMAs (four or five cycles each) per 64 bytes of B, too few loads in flight to stream a
/// decode product's weights. With four panels per call, tiny_llama's 8-layer f32 decode
/// forward (`mslc run … --dim S=1`) on a 2-core AVX2 EPYC went from 2.2 to 1.7 ms on 2
/// threads and from 3.4 to 2.1 ms on one, with the same bits (four panels rather than two:
/// 6–10 % faster). AVX-512's one row reads 128 bytes per pair of chains.
fn row_panels_kernel(isa: Isa, half: Option<HalfType>, count: usize) -> Option<RowPanelsFn> {
    macro_rules! of_width {
        ($p:expr) => {
            match count {
                MAX_ROW_PANELS => Some(avx2_row_panels::<MAX_ROW_PANELS, { $p }> as RowPanelsFn),
                2 => Some(avx2_row_panels::<2, { $p }> as RowPanelsFn),
                _ => None,
            }
        };
    }
    match (isa, half) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, None) => of_width!(F32_PANELS),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, Some(HalfType::F16)) => of_width!(F16_PANELS),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, Some(HalfType::Bf16)) => of_width!(BF16_PANELS),
        _ => None,
    }
}

/// Where step 0 of B panel `jp` of operand `b` starts, and its row stride.
#[derive(Clone, Copy)]
enum PanelSource<'a> {
    /// All panels packed (`Gemm::pack_b` layout, or `Gemm::pack_b_half`'s), before the call
    /// (`ahead`: the weights, cold in L3 or memory) or by it (still in cache).
    Packed { panels: PackedB<'a>, ahead: bool },
    /// Full panels read in place from row-major B; the last, narrower panel of each B packed
    /// in `edge` (k × NR per B).
    Rows { edge: &'a [f32] },
}

/// Computes `g` into `c` on the unpacked-A path (`g.m` small).
pub(super) fn run(
    g: &Gemm<'_>,
    c: &mut [f32],
    params: &MatmulParams,
    parallel: bool,
    packed_b: Option<PackedB<'_>>,
) {
    let (n, k, nr) = (g.n, g.k, g.kernel.nr);
    let np = n.div_ceil(nr);
    let in_place = g.reads_b_in_place();
    let form = packed_b.map_or(RightForm::Raw, |p| p.form());
    with_scratch(g.scratch_parts(params, false, form).1, |buf| {
        let source = match packed_b {
            Some(panels) => PanelSource::Packed {
                panels,
                ahead: true,
            },
            None if in_place => {
                for (i, d) in buf.chunks_exact_mut((k * nr).max(1)).enumerate() {
                    pack_b_panel(g.b[i], (np - 1) * nr, nr, d);
                }
                PanelSource::Rows { edge: buf }
            }
            None => {
                g.pack_b(parallel, buf);
                PanelSource::Packed {
                    panels: PackedB::F32(buf),
                    ahead: false,
                }
            }
        };
        // Column chunks first (each reads all of A, none repacks B); row blocks too when the
        // columns alone leave threads idle.
        let max_rows = max_rows(g.kernel.isa);
        let groups = g.m.div_ceil(max_rows);
        let (chunks, row_blocks) = if parallel {
            let target = rayon::current_num_threads().saturating_mul(params.tasks_per_thread);
            let per_problem = target.div_ceil(g.problems.len());
            let chunks = per_problem.clamp(1, np);
            (chunks, per_problem.div_ceil(chunks).clamp(1, groups.max(1)))
        } else {
            (1, 1)
        };
        let kc = params.kc.max(1);
        let c_ptr = SyncPtr(c.as_mut_ptr());
        let per_problem = chunks * row_blocks;
        par::for_each_index(parallel, g.problems.len() * per_problem, |t| {
            let (jp0, jp1) = block_range(np, chunks, t % chunks);
            let (g0, g1) = block_range(groups, row_blocks, (t / chunks) % row_blocks);
            let rows = g0 * max_rows..(g1 * max_rows).min(g.m);
            // SAFETY: tasks cover disjoint row and column ranges of disjoint C blocks, all
            // inside `c` (checked by `Gemm::run_with`), and `c` outlives this parallel loop.
            unsafe { columns(g, t / per_problem, jp0..jp1, rows, source, c_ptr, kc) };
        });
    });
}

/// Computes column panels `panels` of problem `pi` over its rows `row_range`.
///
/// # Safety
/// `c` must point to the output buffer of [`Gemm::run_with`], and no other thread may touch
/// these rows and columns of this problem's C block meanwhile.
unsafe fn columns(
    g: &Gemm<'_>,
    pi: usize,
    panels: std::ops::Range<usize>,
    row_range: std::ops::Range<usize>,
    source: PanelSource<'_>,
    c: SyncPtr,
    kc: usize,
) {
    let (n, k, ldc, nr) = (g.n, g.k, g.ldc, g.kernel.nr);
    let np = n.div_ceil(nr);
    let max_rows = max_rows(g.kernel.isa);
    let prob = g.problems[pi];
    let (a, b) = (g.a[prob.a], g.b[prob.b]);
    let (col0, col1) = (panels.start * nr, (panels.end * nr).min(n));
    // SAFETY: row r (of `row_range`) of these columns is c[c_offset + r * ldc + col0 .. + col1],
    // inside the buffer and owned by this task alone.
    let row = |r: usize| unsafe {
        std::slice::from_raw_parts_mut(c.get().add(prob.c_offset + r * ldc + col0), col1 - col0)
    };
    if k == 0 && !g.accumulate {
        row_range.clone().for_each(|r| row(r).fill(0.0));
    }
    // Step p0 of B panel jp onwards, and the distance between its steps.
    let panel_at = move |jp: usize, p0: usize| -> (PackedB<'_>, usize) {
        match source {
            PanelSource::Packed { panels, .. } => {
                (panels.from(((prob.b * np + jp) * k + p0) * nr), nr)
            }
            PanelSource::Rows { edge } if n - jp * nr < nr => {
                (PackedB::F32(&edge[(prob.b * k + p0) * nr..]), nr)
            }
            PanelSource::Rows { .. } => (
                PackedB::F32(&b.data[b.offset + p0 * b.rs + jp * nr..]),
                b.rs,
            ),
        }
    };
    let groups = row_range.len().div_ceil(max_rows);
    // Worth it for cold panels (not packed by this call) that several row groups reuse: a
    // panel that one row group reads once streams well enough (decode shapes: 6 % slower).
    let cold_and_reused = groups > 1 && !matches!(source, PanelSource::Packed { ahead: false, .. });
    // One row (a decode product) takes several full panels per call where this ISA has such
    // a kernel (every panel format has one where f32 does); elsewhere no panel asks.
    let one_row = row_range.len() == 1 && row_panels_kernel(g.kernel.isa, None, 2).is_some();
    for p0 in (0..k).step_by(kc) {
        let kcs = kc.min(k - p0);
        let accumulate = g.accumulate || p0 > 0;
        // Panels after the last one called that its call computed too.
        let mut taken = 0;
        for jp in panels.clone() {
            if taken > 0 {
                taken -= 1;
                continue;
            }
            let cols = nr.min(n - jp * nr);
            let (panel, ldb) = panel_at(jp, p0);
            assert!(
                panel.len() >= (kcs - 1) * ldb + nr,
                "gemm: B panel outside its buffer"
            );
            if one_row {
                let slab = Slab {
                    p0,
                    steps: kcs,
                    accumulate,
                };
                // SAFETY: row `row_range.start` of these panels' columns is this task's.
                taken = unsafe {
                    one_row_call(g, prob, row_range.start, slab, jp..panels.end, &panel_at, c)
                };
                if taken > 0 {
                    taken -= 1;
                    continue;
                }
            }
            // The panel visited next (the next of this slab, else the first of the next slab),
            // prefetched a share before each row group's call on this one when B is cold.
            let next = prefetch::next_panel(jp, panels.clone(), p0, kc, k)
                .filter(|_| cold_and_reused)
                .map(|(j, p, steps)| (panel_at(j, p), steps));
            for (group, r0) in row_range.clone().step_by(max_rows).enumerate() {
                if let Some(((next, next_ldb), steps)) = next {
                    let (q0, q1) = block_range(steps, groups, group);
                    match next {
                        PackedB::F32(p) => prefetch::panel_steps(p, next_ldb, nr, q0..q1),
                        PackedB::Half(p, _) => prefetch::panel_steps(p, next_ldb, nr, q0..q1),
                    }
                }
                let rows = max_rows.min(row_range.end - r0);
                let last = a.offset + (r0 + rows - 1) * a.rs + (p0 + kcs - 1) * a.cs;
                assert!(last < a.data.len(), "gemm: A rows outside their buffer");
                // SAFETY: inside this task's columns (see `row`).
                let c_tile = unsafe { c.get().add(prob.c_offset + r0 * ldc + jp * nr) };
                let (b_start, half) = panel.start();
                let kernel = rows_kernel(g.kernel.isa, rows, half);
                let call = |c, ldc, accumulate| RowsCall {
                    k: kcs,
                    // SAFETY: the last element read is inside A (asserted above).
                    a: unsafe { a.data.as_ptr().add(a.offset + r0 * a.rs + p0 * a.cs) },
                    a_rs: a.rs,
                    a_cs: a.cs,
                    b: b_start,
                    ldb,
                    c,
                    ldc,
                    accumulate,
                };
                if cols == nr {
                    // SAFETY: A, B and the C tile hold what the call reads and writes (asserted
                    // above; `kernel` only picks ISAs this CPU runs).
                    unsafe { kernel(&call(c_tile, ldc, accumulate)) };
                    continue;
                }
                // A narrower last panel: the full tile into `tmp` (set up only here, not on
                // every call), then its columns into C.
                let mut tmp = [0.0f32; MAX_ROWS * MAX_NR];
                // SAFETY: as above, with `tmp` holding a full tile of row stride nr.
                unsafe { kernel(&call(tmp.as_mut_ptr(), nr, false)) };
                for (i, src) in tmp.chunks_exact(nr).take(rows).enumerate() {
                    // SAFETY: rows × cols of this tile lie inside C.
                    let dst = unsafe { std::slice::from_raw_parts_mut(c_tile.add(i * ldc), cols) };
                    for (d, &s) in dst.iter_mut().zip(src) {
                        *d = if accumulate { *d + s } else { s };
                    }
                }
            }
        }
    }
    g.epilogue(prob, row_range, col0, row);
}

/// Steps `[p0, p0 + steps)` of k, added to C when `accumulate` (C holds an earlier slab's sum).
#[derive(Clone, Copy)]
struct Slab {
    p0: usize,
    steps: usize,
    accumulate: bool,
}

/// Computes slab `slab` of row `r` of problem `prob` for the full panels from `panels.start`
/// on, as many as one call of a one-row kernel over several panels takes (they must share a
/// stride and format: [`row_panels_kernel`]); how many it computed, 0 when no such call
/// applies (no kernel for this ISA, or fewer than two full panels).
///
/// # Safety
/// `c` must point to the output buffer of [`Gemm::run_with`], and no other thread may touch
/// row `r` of these panels' columns of this problem's C block meanwhile.
unsafe fn one_row_call<'b>(
    g: &Gemm<'_>,
    prob: Problem,
    r: usize,
    slab: Slab,
    panels: std::ops::Range<usize>,
    panel_at: &impl Fn(usize, usize) -> (PackedB<'b>, usize),
    c: SyncPtr,
) -> usize {
    let (n, nr, a) = (g.n, g.kernel.nr, g.a[prob.a]);
    let Slab {
        p0,
        steps,
        accumulate,
    } = slab;
    let jp = panels.start;
    let (panel, ldb) = panel_at(jp, p0);
    let (first_start, half) = panel.start();
    let mut starts = [first_start; MAX_ROW_PANELS];
    let mut count = 0;
    while count < MAX_ROW_PANELS && jp + count < panels.end && n - (jp + count) * nr >= nr {
        let (next, next_ldb) = panel_at(jp + count, p0);
        let (next_start, next_half) = next.start();
        if next_ldb != ldb || next_half != half || next.len() < (steps - 1) * ldb + nr {
            break;
        }
        starts[count] = next_start;
        count += 1;
    }
    // The kernels take 2 or MAX_ROW_PANELS panels: of 3, two now and one alone after.
    let count = match count {
        MAX_ROW_PANELS => MAX_ROW_PANELS,
        2 | 3 => 2,
        _ => return 0,
    };
    let Some(kernel) = row_panels_kernel(g.kernel.isa, half, count) else {
        return 0;
    };
    let last = a.offset + r * a.rs + (p0 + steps - 1) * a.cs;
    assert!(last < a.data.len(), "gemm: A rows outside their buffer");
    let call = RowsCall {
        k: steps,
        // SAFETY: the last element read is inside A (asserted above).
        a: unsafe { a.data.as_ptr().add(a.offset + r * a.rs + p0 * a.cs) },
        a_rs: a.rs,
        a_cs: a.cs,
        b: first_start,
        ldb,
        // SAFETY: columns jp * nr .. (jp + count) * nr of row r are the caller's.
        c: unsafe { c.get().add(prob.c_offset + r * g.ldc + jp * nr) },
        ldc: g.ldc,
        accumulate,
    };
    // SAFETY: every panel holds the call's steps (checked above), C's row holds their
    // columns, and `kernel` only exists where this CPU runs it.
    unsafe { kernel(&call, &starts[..count]) };
    count
}

/// Step `p` of a row call's panel, as f32: the NR values there, widened from 16 bits when
/// the panels are `P`'s.
///
/// # Safety
/// The call's panel must hold step `p` (NR values of the panel's type).
#[inline(always)]
unsafe fn portable_step<const NR: usize, const P: u8>(x: &RowsCall, p: usize) -> [f32; NR] {
    // SAFETY: the caller guarantees step p's NR values.
    unsafe {
        let halves = x.b.cast::<u16>().add(p * x.ldb);
        match P {
            F16_PANELS => std::array::from_fn(|j| HalfType::F16.widen(*halves.add(j))),
            BF16_PANELS => std::array::from_fn(|j| HalfType::Bf16.widen(*halves.add(j))),
            _ => *x.b.cast::<f32>().add(p * x.ldb).cast::<[f32; NR]>(),
        }
    }
}

/// Portable row kernel (NR = 16), with the portable micro-kernel's separate multiply and add;
/// its panels of `P`.
///
/// # Safety
/// The call's pointers must be valid for what [`RowsCall`] describes with NR = 16.
unsafe fn portable_rows<const R: usize, const P: u8>(x: &RowsCall) {
    const NR: usize = 16;
    let mut acc = [[0.0f32; NR]; R];
    for p in 0..x.k {
        // SAFETY: step p of the panel holds NR values.
        let bp = unsafe { portable_step::<NR, P>(x, p) };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: element (i, p) of A is inside it.
            let ai = unsafe { *x.a.add(i * x.a_rs + p * x.a_cs) };
            for (v, &bj) in row.iter_mut().zip(&bp) {
                *v += ai * bj;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i of the tile holds NR values.
        let out = unsafe { std::slice::from_raw_parts_mut(x.c.add(i * x.ldc), NR) };
        for (o, &v) in out.iter_mut().zip(row) {
            *o = if x.accumulate { *o + v } else { v };
        }
    }
}

/// AVX2+FMA row kernel (NR = 16): two accumulators per row; its panels of `P` (f16 widened by
/// F16C, which every AVX2 CPU has: [`crate::cpu::has_avx2_fma`] checks it; bf16 by a shift).
///
/// # Safety
/// As [`portable_rows`], and the CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_rows<const R: usize, const P: u8>(x: &RowsCall) {
    use std::arch::x86_64::*;
    // SAFETY: all pointer arithmetic stays within the extents the caller guarantees.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for p in 0..x.k {
            let (b0, b1) = avx2_step::<P>(x.b, p * x.ldb);
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm256_broadcast_ss(&*x.a.add(i * x.a_rs + p * x.a_cs));
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            avx2_store(x.c.add(i * x.ldc), row, x.accumulate);
        }
    }
}

/// AVX2+FMA kernel for one row over W adjacent full panels (NR = 16 each; [`RowPanelsFn`]):
/// 2·W accumulator chains, W times [`avx2_rows`]' for one row. Each C element is still one
/// chain of FMAs in k order, so the bits are those of W `avx2_rows::<1, P>` calls.
///
/// # Safety
/// As [`avx2_rows`] with R = 1 for each panel; every panel holds the call's k steps at stride
/// `ldb`, and the row of C holds 16·W values at `x.c`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_row_panels<const W: usize, const P: u8>(x: &RowsCall, panels: &[*const u8]) {
    use std::arch::x86_64::*;
    // SAFETY: all pointer arithmetic stays within the extents the caller guarantees.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; W];
        for p in 0..x.k {
            let ai = _mm256_broadcast_ss(&*x.a.add(p * x.a_cs));
            for (w, row) in acc.iter_mut().enumerate() {
                let (b0, b1) = avx2_step::<P>(panels[w], p * x.ldb);
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
        }
        for (w, row) in acc.iter().enumerate() {
            avx2_store(x.c.add(16 * w), row, x.accumulate);
        }
    }
}

/// The 16 values at `offset` values past `b` (a panel step: f32s, or 16-bit values of `P`
/// widened: f16 by F16C, bf16 by a shift) as two f32 vectors.
///
/// # Safety
/// The 16 values must be readable, and the CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn avx2_step<const P: u8>(
    b: *const u8,
    offset: usize,
) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the 16 values.
    unsafe {
        let halves = b.cast::<u16>().add(offset);
        match P {
            F16_PANELS => (
                _mm256_cvtph_ps(_mm_loadu_si128(halves.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(halves.add(8).cast())),
            ),
            BF16_PANELS => {
                // A bf16 is an f32's upper half: widen each to 32 bits, shift it up.
                let w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128(halves.cast()));
                let w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128(halves.add(8).cast()));
                (
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w0)),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w1)),
                )
            }
            _ => {
                let bp = b.cast::<f32>().add(offset);
                (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)))
            }
        }
    }
}

/// AVX-512F row kernel (NR = 32): two accumulators per row; its panels of `P`.
///
/// # Safety
/// As [`portable_rows`] with NR = 32, and the CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_rows<const R: usize, const P: u8>(x: &RowsCall) {
    use std::arch::x86_64::*;
    // SAFETY: all pointer arithmetic stays within the extents the caller guarantees.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for p in 0..x.k {
            let halves = x.b.cast::<u16>().add(p * x.ldb);
            let (b0, b1) = match P {
                F16_PANELS => (
                    _mm512_cvtph_ps(_mm256_loadu_si256(halves.cast())),
                    _mm512_cvtph_ps(_mm256_loadu_si256(halves.add(16).cast())),
                ),
                BF16_PANELS => {
                    // A bf16 is an f32's upper half: widen each to 32 bits, shift it up.
                    let w0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(halves.cast()));
                    let w1 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(halves.add(16).cast()));
                    (
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w0)),
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w1)),
                    )
                }
                _ => {
                    let bp = x.b.cast::<f32>().add(p * x.ldb);
                    (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)))
                }
            };
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*x.a.add(i * x.a_rs + p * x.a_cs));
                row[0] = _mm512_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm512_fmadd_ps(ai, b1, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let ci = x.c.add(i * x.ldc);
            let (mut r0, mut r1) = (row[0], row[1]);
            if x.accumulate {
                r0 = _mm512_add_ps(_mm512_loadu_ps(ci), r0);
                r1 = _mm512_add_ps(_mm512_loadu_ps(ci.add(16)), r1);
            }
            _mm512_storeu_ps(ci, r0);
            _mm512_storeu_ps(ci.add(16), r1);
        }
    }
}
