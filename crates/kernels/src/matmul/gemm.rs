//! The blocked, packed, parallel GEMM driver shared by matmul, attention and conv2d.
//!
//! All A and B panels are packed once per call (in parallel; B not at all when the caller hands
//! it over already packed, see [`Gemm::pack_b`]), then C is cut into tiles of at most `mc` rows
//! × `nc` columns, each a rayon task that walks k in slabs of `kc`: for each slab, each
//! NR-column B micro-panel (kept in L1) meets every MR-row A micro-panel of the tile (kept in
//! L2). Bias and activation are applied to a tile once its last slab is done. Products of at
//! most `small_m` rows take the unpacked-A path of [`super::small`] instead.

use mslc_core::ops::DType;

use super::kernel::{MicroKernel, MAX_MR, MAX_NR};
use super::pack::{pack_a_panel, pack_b_panel, MatRef};
use super::prefetch;
use super::{small, MatmulParams};
use crate::activation::{apply_in_place, Activation};
use crate::elementwise::slice::binary_in_place;
use crate::elementwise::BinaryOp;
use crate::par::{self, SyncPtr};
use crate::scratch::with_scratch;

/// A bias read with strides: element `(i, j)` of a product is
/// `data[problem.bias_offset + i * rs + j * cs]` (strides may be 0 to broadcast).
#[derive(Clone, Copy, Debug)]
pub struct BiasRef<'a> {
    /// Backing storage.
    pub data: &'a [f32],
    /// Distance between rows.
    pub rs: usize,
    /// Distance between columns.
    pub cs: usize,
}

/// One product of a batch: which A and B, where its C (and bias) start.
#[derive(Clone, Copy, Debug)]
pub struct Problem {
    /// Index into [`Gemm::a`].
    pub a: usize,
    /// Index into [`Gemm::b`].
    pub b: usize,
    /// Position of C's element (0, 0) in the output buffer.
    pub c_offset: usize,
    /// Position of the bias element for (0, 0), when there is a bias.
    pub bias_offset: usize,
}

/// A batch of `m × k` by `k × n` products into row-major C blocks of row stride `ldc`.
#[derive(Clone, Copy, Debug)]
pub struct Gemm<'a> {
    /// Rows of every C.
    pub m: usize,
    /// Columns of every C.
    pub n: usize,
    /// The shared inner dimension.
    pub k: usize,
    /// The distinct left operands, each `m × k`.
    pub a: &'a [MatRef<'a>],
    /// The distinct right operands, each `k × n`.
    pub b: &'a [MatRef<'a>],
    /// The products to compute; their C blocks must not overlap.
    pub problems: &'a [Problem],
    /// Row stride of C.
    pub ldc: usize,
    /// When set, C += A·B instead of C = A·B.
    pub accumulate: bool,
    /// Optional bias, added after the product.
    pub bias: Option<BiasRef<'a>>,
    /// Applied after the bias.
    pub activation: Activation,
    /// Optional multiplier laid out as C (each problem's at its `c_offset`, row stride
    /// `ldc`), multiplying after the activation: SwiGLU's gate on its up product.
    pub multiplier: Option<&'a [f32]>,
    /// The micro-kernel (and so the packing geometry) to use.
    pub kernel: MicroKernel,
}

/// A 16-bit float format B's panels are kept in, for a weight stored in it
/// ([`super::MatmulParams::half_b_rows`]): narrowing its values loses nothing, and the row
/// kernels widen them exactly as they read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfType {
    /// IEEE binary16 (widened by vcvtph2ps).
    F16,
    /// bfloat16: an f32's upper 16 bits (widened by a shift).
    Bf16,
}

impl HalfType {
    /// The format a weight stored as `dtype` keeps its panels in, if a 16-bit one.
    pub fn of(dtype: DType) -> Option<HalfType> {
        match dtype {
            DType::F16 => Some(HalfType::F16),
            DType::BF16 => Some(HalfType::Bf16),
            _ => None,
        }
    }

    /// `v`'s bits in this format (exact when `v` is one of its values).
    pub fn narrow(self, v: f32) -> u16 {
        match self {
            HalfType::F16 => half::f16::from_f32(v).to_bits(),
            HalfType::Bf16 => half::bf16::from_f32(v).to_bits(),
        }
    }

    /// The f32 of bits `h` in this format.
    pub fn widen(self, h: u16) -> f32 {
        match self {
            HalfType::F16 => half::f16::from_bits(h).to_f32(),
            HalfType::Bf16 => half::bf16::from_bits(h).to_f32(),
        }
    }
}

/// B packed ahead ([`Gemm::pack_b`], [`Gemm::pack_b_half`]): the panels as f32, or the same
/// panels narrowed to a 16-bit format.
#[derive(Clone, Copy, Debug)]
pub enum PackedB<'a> {
    /// f32 panels.
    F32(&'a [f32]),
    /// 16-bit panels, widened exactly as they are read.
    Half(&'a [u16], HalfType),
}

/// The form B reaches a product in: what decides, with its rows, the product's path and the
/// scratch it asks for ([`Gemm::scratch_parts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RightForm {
    /// B's own rows or columns, packed by the call where it packs.
    Raw,
    /// f32 panels packed ahead.
    PackedF32,
    /// 16-bit panels packed ahead (widened into scratch on the packed-A path).
    PackedHalf,
}

impl PackedB<'_> {
    /// The form these panels give B.
    pub fn form(&self) -> RightForm {
        match self {
            PackedB::F32(_) => RightForm::PackedF32,
            PackedB::Half(..) => RightForm::PackedHalf,
        }
    }

    /// Values in the panels.
    pub fn len(&self) -> usize {
        match self {
            PackedB::F32(p) => p.len(),
            PackedB::Half(p, _) => p.len(),
        }
    }

    /// Whether there are no panels.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The panels from value `at` on.
    pub(super) fn from(self, at: usize) -> Self {
        match self {
            PackedB::F32(p) => PackedB::F32(&p[at..]),
            PackedB::Half(p, half) => PackedB::Half(&p[at..], half),
        }
    }

    /// Where the panels start, and their 16-bit format (`None`: f32), for a row kernel.
    pub(super) fn start(self) -> (*const u8, Option<HalfType>) {
        match self {
            PackedB::F32(p) => (p.as_ptr().cast(), None),
            PackedB::Half(p, half) => (p.as_ptr().cast(), Some(half)),
        }
    }
}

/// Floats of a region of f32s that keeps `values` packed values: one per float, or two 16-bit
/// values per float when `half` (the executor's packed-weights region is f32s).
pub fn region_floats(values: usize, half: Option<HalfType>) -> usize {
    match half {
        Some(_) => values.div_ceil(2),
        None => values,
    }
}

/// The first `values` packed values kept in `region` ([`region_floats`]), as the GEMM reads
/// them; `None` when the region is too small.
pub fn panels_in(region: &[f32], values: usize, half: Option<HalfType>) -> Option<PackedB<'_>> {
    if region.len() < region_floats(values, half) {
        return None;
    }
    Some(match half {
        None => PackedB::F32(&region[..values]),
        // SAFETY: the region's bytes hold at least `values` u16s (checked above), u16's
        // alignment divides f32's, and every bit pattern is a valid u16.
        Some(kind) => PackedB::Half(
            unsafe { std::slice::from_raw_parts(region.as_ptr().cast::<u16>(), values) },
            kind,
        ),
    })
}

/// `region` as the u16s [`Gemm::pack_b_half`] writes into.
pub fn halves_mut(region: &mut [f32]) -> &mut [u16] {
    // SAFETY: the same bytes, u16's alignment divides f32's, every bit pattern is valid for
    // both, and the borrow of `region` is moved into the result.
    unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr().cast::<u16>(), region.len() * 2) }
}

/// The one problem of a product of one A and one B into C at offset 0.
const SINGLE: [Problem; 1] = [Problem {
    a: 0,
    b: 0,
    c_offset: 0,
    bias_offset: 0,
}];

impl<'a> Gemm<'a> {
    /// `c (+)= a · b` for one A (`m × k`) and one B (`k × n`), C of row stride `ldc`, with
    /// no bias or activation: the building block of the attention kernels' tile products.
    pub fn single(
        a: &'a [MatRef<'a>; 1],
        b: &'a [MatRef<'a>; 1],
        ldc: usize,
        accumulate: bool,
        kernel: MicroKernel,
    ) -> Self {
        Self {
            m: a[0].rows,
            n: b[0].cols,
            k: b[0].rows,
            a,
            b,
            problems: &SINGLE,
            ldc,
            accumulate,
            bias: None,
            activation: Activation::NONE,
            multiplier: None,
            kernel,
        }
    }
}

/// Floats [`pack_operand`] writes for a B of `cols` columns over `depth` (its k).
pub fn packed_len(cols: usize, depth: usize, kernel: MicroKernel) -> usize {
    cols.div_ceil(kernel.nr) * depth * kernel.nr
}

/// Packs `b` alone into `dst` as [`Gemm::pack_b`] does and returns the packed floats. Its first
/// `⌈n / NR⌉` panels are the packing of b's first `n` columns, so one packing serves every
/// product over a prefix of the columns ([`Gemm::run_on_packed_prefix`]): the keys a causal
/// query tile sees.
pub fn pack_operand<'d>(b: MatRef<'_>, kernel: MicroKernel, dst: &'d mut [f32]) -> &'d [f32] {
    let b = [b];
    let g = Gemm {
        m: 0,
        ..Gemm::single(&b, &b, 0, false, kernel)
    };
    let packed = &mut dst[..g.packed_b_len()];
    g.pack_b(false, packed);
    packed
}

/// How C is cut into tasks: per problem, `rb × cb` tiles over `mp` row and `np` column panels.
#[derive(Clone, Copy, Debug)]
struct Grid {
    mp: usize,
    np: usize,
    rb: usize,
    cb: usize,
}

impl Grid {
    fn new(g: &Gemm<'_>, params: &MatmulParams, parallel: bool) -> Self {
        let (mr, nr) = (g.kernel.mr, g.kernel.nr);
        let mp = g.m.div_ceil(mr);
        let np = g.n.div_ceil(nr);
        let mut rb = mp.div_ceil((params.mc / mr).max(1));
        let mut cb = np.div_ceil((params.nc / nr).max(1));
        if parallel {
            let threads = rayon::current_num_threads();
            let target = threads.saturating_mul(params.tasks_per_thread);
            // The largest task, in micro-tiles, for a given cut.
            let largest = |rb: usize, cb: usize| mp.div_ceil(rb) * np.div_ceil(cb);
            while g.problems.len() * rb * cb < target && (rb < mp || cb < np) {
                // Cut the dimension that leaves the smaller largest task (rows on a tie).
                if cb >= np || (rb < mp && largest(rb + 1, cb) <= largest(rb, cb + 1)) {
                    rb += 1;
                } else {
                    cb += 1;
                }
            }
            // Then balance the threads: 3 equal tasks on 2 threads finish in 2 task-times
            // where 4 smaller ones take 1.33. Among slightly finer cuts, take the one whose
            // busiest thread does the least (in micro-tiles), when that is at least 10 % less
            // (a finer cut streams B more often, which the count of micro-tiles does not see).
            let makespan = |rb: usize, cb: usize| {
                (g.problems.len() * rb * cb).div_ceil(threads) * largest(rb, cb)
            };
            let (mut best_rb, mut best_cb) = (rb, cb);
            for r in rb..=(rb + threads).min(mp) {
                for c in cb..=(cb + threads).min(np) {
                    if makespan(r, c) * 10 < makespan(best_rb, best_cb) * 9 {
                        (best_rb, best_cb) = (r, c);
                    }
                }
            }
            (rb, cb) = (best_rb, best_cb);
        }
        Self { mp, np, rb, cb }
    }

    fn tasks(&self, problems: usize) -> usize {
        problems * self.rb * self.cb
    }
}

/// The operands a call's tiles read, packed.
#[derive(Clone, Copy)]
struct Packed<'p> {
    a: &'p [f32],
    b: &'p [f32],
    /// Whether B came packed before the call (the weights, packed once at load: cold in L3 or
    /// memory, so worth prefetching) rather than by it (still in cache).
    b_ahead: bool,
}

/// Panels `[lo, hi)` of block `i` when `total` panels are shared evenly by `blocks` blocks.
pub(super) fn block_range(total: usize, blocks: usize, i: usize) -> (usize, usize) {
    (i * total / blocks, (i + 1) * total / blocks)
}

impl Gemm<'_> {
    /// Computes every problem into `c`. Panics only on internal misuse (a C block outside `c`).
    pub fn run(&self, c: &mut [f32], params: &MatmulParams) {
        self.run_with(c, params, None);
    }

    /// Whether a call with B in `form` multiplies A unpacked (few rows: the small-m path).
    fn unpacked_a(&self, params: &MatmulParams, form: RightForm) -> bool {
        let small_m = match form {
            RightForm::Raw => params.small_m,
            _ => params.small_m.max(params.small_m_packed_b),
        };
        self.m <= small_m
    }

    /// Whether the unpacked-A path reads B's full panels in place from its rows.
    pub(super) fn reads_b_in_place(&self) -> bool {
        self.b.iter().all(|b| b.cs == 1)
    }

    /// The scratch (f32) a call with B in `form` asks for, in one request, as A's part and
    /// B's: on the unpacked-A path, B's packing (none when packed ahead, only each B's last,
    /// narrower panel where its rows are read in place); otherwise A's packing (none when
    /// `packed_a`) and B's (none when packed ahead in f32; 16-bit panels are widened),
    /// B's part starting on a 16-float line. What the memory plan reserves for a matmul.
    pub fn scratch_parts(
        &self,
        params: &MatmulParams,
        packed_a: bool,
        form: RightForm,
    ) -> (usize, usize) {
        if self.m == 0 || self.n == 0 || self.problems.is_empty() {
            return (0, 0);
        }
        if self.unpacked_a(params, form) {
            let nr = self.kernel.nr;
            let b = match form {
                RightForm::Raw if self.reads_b_in_place() => {
                    usize::from(!self.n.is_multiple_of(nr)) * self.b.len() * self.k * nr
                }
                RightForm::Raw => self.packed_b_len(),
                RightForm::PackedF32 | RightForm::PackedHalf => 0,
            };
            return (0, b);
        }
        let a = if packed_a { 0 } else { self.packed_a_len() };
        let b = match form {
            RightForm::PackedF32 => 0,
            RightForm::Raw | RightForm::PackedHalf => self.packed_b_len(),
        };
        (a, b)
    }

    /// The floats of [`Gemm::scratch_parts`] as one request.
    pub fn scratch_len(&self, params: &MatmulParams, packed_a: bool, form: RightForm) -> usize {
        let (a, b) = self.scratch_parts(params, packed_a, form);
        a.next_multiple_of(16).saturating_add(b)
    }

    /// Floats of every B operand packed whole by [`Gemm::pack_b`]: per B, its NR-column panels
    /// over all k, in the micro-kernel's geometry. The layout depends on the kernel's NR only,
    /// not on `mc`, `kc` or `nc`.
    pub fn packed_b_len(&self) -> usize {
        self.b.len() * packed_len(self.n, self.k, self.kernel)
    }

    /// Packs every B operand into `dst` ([`Gemm::packed_b_len`] floats), exactly as a call
    /// packs it, so that [`Gemm::run_with`] can skip that work.
    pub fn pack_b(&self, parallel: bool, dst: &mut [f32]) {
        let np = self.n.div_ceil(self.kernel.nr);
        let (k, nr) = (self.k, self.kernel.nr);
        if k == 0 || dst.is_empty() {
            return;
        }
        par::for_each_chunk_mut(parallel, dst, k * nr, |i, d| {
            pack_b_panel(self.b[i / np], (i % np) * nr, nr, d)
        });
    }

    /// As [`Gemm::pack_b`], each value narrowed to `half`: exact where B's values are that
    /// format's (a weight stored in it), for the row kernels that widen them as they read.
    pub fn pack_b_half(&self, parallel: bool, half: HalfType, dst: &mut [u16]) {
        let np = self.n.div_ceil(self.kernel.nr);
        let (k, nr) = (self.k, self.kernel.nr);
        if k == 0 || dst.is_empty() {
            return;
        }
        // Each panel is packed a slab of steps at a time on the stack, then narrowed: no
        // scratch buffer (which would outgrow what the module plans per thread) is asked for.
        const SLAB: usize = 64;
        par::for_each_chunk_mut(parallel, dst, k * nr, |i, d| {
            let b = self.b[i / np];
            let mut slab = [0.0f32; SLAB * MAX_NR];
            for p0 in (0..k).step_by(SLAB) {
                let steps = SLAB.min(k - p0);
                let rows = MatRef {
                    offset: b.offset + p0 * b.rs,
                    rows: steps,
                    ..b
                };
                let slab = &mut slab[..steps * nr];
                pack_b_panel(rows, (i % np) * nr, nr, slab);
                for (h, &v) in d[p0 * nr..][..steps * nr].iter_mut().zip(&*slab) {
                    *h = half.narrow(v);
                }
            }
        });
    }

    /// Floats of every A operand packed whole by [`Gemm::pack_a`]: per A, its MR-row panels
    /// over all k, in the micro-kernel's geometry (independent of `mc`, `kc` and `nc`).
    pub fn packed_a_len(&self) -> usize {
        self.a.len() * self.m.div_ceil(self.kernel.mr) * self.k * self.kernel.mr
    }

    /// Packs every A operand into `dst` ([`Gemm::packed_a_len`] floats), exactly as a call
    /// packs it, so that [`Gemm::run_packed`] can skip that work (a conv2d's weights).
    pub fn pack_a(&self, parallel: bool, dst: &mut [f32]) {
        let (k, mr) = (self.k, self.kernel.mr);
        let mp = self.m.div_ceil(mr);
        if k == 0 || dst.is_empty() {
            return;
        }
        par::for_each_chunk_mut(parallel, dst, k * mr, |i, d| {
            pack_a_panel(self.a[i / mp], (i % mp) * mr, mr, d)
        });
    }

    /// As [`Gemm::run`], reading B from `packed_b` (laid out by [`Gemm::pack_b`]) when given.
    /// Same bits either way.
    pub fn run_with(&self, c: &mut [f32], params: &MatmulParams, packed_b: Option<&[f32]>) {
        self.run_packed(c, params, None, packed_b.map(PackedB::F32));
    }

    /// As [`Gemm::run`], reading A from `packed_a` ([`Gemm::pack_a`]) and B from `packed_b`
    /// ([`Gemm::pack_b`], [`Gemm::pack_b_half`]) when given. Same bits either way. 16-bit panels
    /// are for the unpacked-A path; a product too tall for it widens them first.
    pub fn run_packed(
        &self,
        c: &mut [f32],
        params: &MatmulParams,
        packed_a: Option<&[f32]>,
        packed_b: Option<PackedB<'_>>,
    ) {
        if self.m == 0 || self.n == 0 || self.problems.is_empty() {
            return;
        }
        if let Some(p) = packed_a {
            assert_eq!(
                p.len(),
                self.packed_a_len(),
                "gemm: packed A of the wrong size"
            );
        }
        if let Some(p) = packed_b {
            assert_eq!(
                p.len(),
                self.packed_b_len(),
                "gemm: packed B of the wrong size"
            );
        }
        for p in self.problems {
            assert!(
                p.c_offset + (self.m - 1) * self.ldc + self.n <= c.len(),
                "gemm: C block outside the output buffer"
            );
        }
        let flops = [self.m, self.n, self.k, self.problems.len()]
            .iter()
            .fold(2usize, |f, &x| f.saturating_mul(x));
        let parallel = params.tasks_per_thread > 0
            && rayon::current_num_threads() > 1
            && flops >= params.min_parallel_flops;
        let form = packed_b.map_or(RightForm::Raw, |p| p.form());
        if self.unpacked_a(params, form) {
            return small::run(self, c, params, parallel, packed_b);
        }
        let grid = Grid::new(self, params, parallel);
        let (a_len, b_len) = self.scratch_parts(params, packed_a.is_some(), form);
        let ahead_b = match packed_b {
            Some(PackedB::F32(p)) => Some(p),
            _ => None,
        };
        let b_start = a_len.next_multiple_of(16);
        with_scratch(b_start + b_len, |buf| {
            let (own_a, own_b) = buf.split_at_mut(b_start);
            let own_a = &mut own_a[..a_len];
            if let Some(PackedB::Half(panels, half)) = packed_b {
                for (w, &h) in own_b.iter_mut().zip(panels) {
                    *w = half.widen(h);
                }
            }
            if self.k > 0 {
                let pack_a = packed_a.is_none().then_some(&mut *own_a);
                let pack_b = packed_b.is_none().then_some(&mut *own_b);
                self.pack(parallel, pack_a, pack_b);
            }
            let packed = Packed {
                a: packed_a.unwrap_or(own_a),
                b: ahead_b.unwrap_or(own_b),
                b_ahead: ahead_b.is_some(),
            };
            let kc = params.kc.max(1);
            let c_ptr = SyncPtr(c.as_mut_ptr());
            par::for_each_index(parallel, grid.tasks(self.problems.len()), |t| {
                // SAFETY: tasks cover disjoint tiles of disjoint C blocks, all inside `c`
                // (checked above), and `c` outlives this parallel loop.
                unsafe { self.tile(t, &grid, packed, c_ptr, kc) };
            });
        });
    }

    /// As [`Gemm::run`] for a single product (see [`Gemm::single`]) whose B is the first
    /// columns of the operand `packed` holds ([`pack_operand`]). Same bits as [`Gemm::run`].
    pub fn run_on_packed_prefix(&self, c: &mut [f32], params: &MatmulParams, packed: &[f32]) {
        let packed = PackedB::F32(&packed[..self.packed_b_len()]);
        self.run_packed(c, params, None, Some(packed));
    }

    /// Packs, when given, every A panel into `packed_a` and every B panel into `packed_b`.
    fn pack(&self, parallel: bool, packed_a: Option<&mut [f32]>, packed_b: Option<&mut [f32]>) {
        match (packed_a, packed_b) {
            (Some(a), Some(b)) if parallel => {
                rayon::join(|| self.pack_a(true, a), || self.pack_b(true, b));
            }
            (a, b) => {
                if let Some(a) = a {
                    self.pack_a(parallel, a);
                }
                if let Some(b) = b {
                    self.pack_b(parallel, b);
                }
            }
        }
    }

    /// Computes tile `t` of the grid.
    ///
    /// # Safety
    /// `c` must point to the output buffer of [`Gemm::run`], and no other thread may touch this
    /// tile's elements meanwhile.
    unsafe fn tile(&self, t: usize, grid: &Grid, packed: Packed<'_>, c: SyncPtr, kc: usize) {
        let (m, n, k, ldc) = (self.m, self.n, self.k, self.ldc);
        let (mr, nr, kernel) = (self.kernel.mr, self.kernel.nr, self.kernel.run);
        let prob = self.problems[t / (grid.rb * grid.cb)];
        let (ip0, ip1) = block_range(grid.mp, grid.rb, (t / grid.cb) % grid.rb);
        let (jp0, jp1) = block_range(grid.np, grid.cb, t % grid.cb);
        let (row0, row1) = (ip0 * mr, (ip1 * mr).min(m));
        let (col0, col1) = (jp0 * nr, (jp1 * nr).min(n));
        // SAFETY: row r of this tile is c[c_offset + r * ldc + col0 .. + col1], inside the
        // buffer and owned by this task alone.
        let row = |r: usize| unsafe {
            std::slice::from_raw_parts_mut(c.get().add(prob.c_offset + r * ldc + col0), col1 - col0)
        };
        if k == 0 && !self.accumulate {
            (row0..row1).for_each(|r| row(r).fill(0.0));
        }
        // Step p0 of B panel jp onwards.
        let panel_at = |jp: usize, p0: usize| &packed.b[((prob.b * grid.np + jp) * k + p0) * nr..];
        for p0 in (0..k).step_by(kc) {
            let kcs = kc.min(k - p0);
            let acc = self.accumulate || p0 > 0;
            for jp in jp0..jp1 {
                let b_panel = &panel_at(jp, p0)[..kcs * nr];
                let cols = nr.min(n - jp * nr);
                // The panel visited next, prefetched a share before each A panel's call when B
                // comes packed ahead, cold (one this call packed is still in cache), and several
                // A panels reuse it (see `prefetch`).
                let next = prefetch::next_panel(jp, jp0..jp1, p0, kc, k)
                    .filter(|_| packed.b_ahead && ip1 - ip0 >= 2)
                    .map(|(j, p, steps)| (panel_at(j, p), steps));
                for ip in ip0..ip1 {
                    if let Some((next, steps)) = next {
                        let (q0, q1) = block_range(steps, ip1 - ip0, ip - ip0);
                        prefetch::panel_steps(next, nr, nr, q0..q1);
                    }
                    let a_panel = &packed.a[((prob.a * grid.mp + ip) * k + p0) * mr..][..kcs * mr];
                    let rows = mr.min(m - ip * mr);
                    // SAFETY: inside this task's tile (see `row`).
                    let c_tile = unsafe { c.get().add(prob.c_offset + ip * mr * ldc + jp * nr) };
                    if rows == mr && cols == nr {
                        // SAFETY: a full mr×nr tile of C; panels hold kcs steps.
                        unsafe {
                            kernel(kcs, a_panel.as_ptr(), b_panel.as_ptr(), c_tile, ldc, acc)
                        };
                    } else {
                        let mut tmp = [0.0f32; MAX_MR * MAX_NR];
                        // SAFETY: `tmp` holds a full mr×nr tile of row stride nr.
                        unsafe {
                            kernel(
                                kcs,
                                a_panel.as_ptr(),
                                b_panel.as_ptr(),
                                tmp.as_mut_ptr(),
                                nr,
                                false,
                            )
                        };
                        for (i, src) in tmp.chunks_exact(nr).take(rows).enumerate() {
                            // SAFETY: rows × cols of this tile lie inside C.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(c_tile.add(i * ldc), cols)
                            };
                            for (d, &s) in dst.iter_mut().zip(src) {
                                *d = if acc { *d + s } else { s };
                            }
                        }
                    }
                }
            }
        }
        self.epilogue(prob, row0..row1, col0, row);
    }

    /// Adds the bias, applies the activation and multiplies by the multiplier in rows `rows`
    /// (columns from `col0`) of a tile.
    pub(super) fn epilogue<'c>(
        &self,
        prob: Problem,
        rows: std::ops::Range<usize>,
        col0: usize,
        row: impl Fn(usize) -> &'c mut [f32],
    ) {
        if self.bias.is_none() && self.activation == Activation::NONE && self.multiplier.is_none() {
            return;
        }
        for r in rows {
            let out = row(r);
            if let Some(bias) = self.bias {
                let base = prob.bias_offset + r * bias.rs + col0 * bias.cs;
                if bias.cs == 1 {
                    binary_in_place(BinaryOp::Add, out, &bias.data[base..]);
                } else {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o += bias.data[base + j * bias.cs];
                    }
                }
            }
            apply_in_place(self.activation, out);
            if let Some(multiplier) = self.multiplier {
                let base = prob.c_offset + r * self.ldc + col0;
                binary_in_place(BinaryOp::Mul, out, &multiplier[base..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::Isa;
    use crate::testing::in_pool;

    /// The (row, column) blocks the default parameters with `mc = 96` cut an `m × 64` by
    /// `64 × n` product into, on 2 threads, with the 6×16 kernel.
    fn blocks(m: usize, n: usize) -> (usize, usize) {
        let kernel = MicroKernel::select(Isa::Portable).unwrap();
        let shape = |rows, cols| MatRef {
            data: &[],
            offset: 0,
            rs: cols,
            cs: 1,
            rows,
            cols,
        };
        let (a, b) = ([shape(m, 64)], [shape(64, n)]);
        let problems = [Problem {
            a: 0,
            b: 0,
            c_offset: 0,
            bias_offset: 0,
        }];
        let g = Gemm {
            m,
            n,
            k: 64,
            a: &a,
            b: &b,
            problems: &problems,
            ldc: n,
            accumulate: false,
            bias: None,
            activation: Activation::NONE,
            multiplier: None,
            kernel,
        };
        in_pool(2, || {
            let params = MatmulParams {
                mc: 96,
                ..MatmulParams::default()
            };
            let grid = Grid::new(&g, &params, true);
            (grid.rb, grid.cb)
        })
    }

    /// 3 row blocks on 2 threads (the busiest does 2 of 3) are cut into an even number of
    /// tasks; 6 blocks already balance and stay, since a finer cut saves under 10 %.
    #[test]
    fn the_thread_split_balances_the_threads() {
        let (rb, cb) = blocks(256, 688);
        assert!(rb * cb > 3 && (rb * cb).is_multiple_of(2), "{rb} × {cb}");
        assert_eq!(blocks(512, 688), (6, 1));
    }
}
