//! Matrix multiplication (`matmul`, `fused_matmul`): batched, with transposes, bias and
//! activation, on a BLIS-style packed and blocked GEMM with AVX-512, AVX2+FMA and portable
//! micro-kernels chosen at run time.

pub(crate) mod gemm;
pub mod kernel;
pub(crate) mod pack;
mod plan;
mod prefetch;
mod small;

use mslc_core::ops::DType;
use serde::{Deserialize, Serialize};

use super::activation::Activation;
use super::error::{KernelError, KernelResult};
use super::shape::{broadcast_shapes, check_len};
use super::tensor::TensorRef;
pub use gemm::{halves_mut, panels_in, region_floats, HalfType, PackedB, RightForm};
pub use kernel::{Isa, MicroKernel};
pub use plan::{Epilogue, GemmPlan};

/// Tunable parameters of the GEMM. Every field is honoured. Results are bit-identical for any
/// `mc`, `nc`, `tasks_per_thread`, `min_parallel_flops`, `small_m` and thread count, and between the AVX2
/// and AVX-512 kernels; only `kc` and the portable kernel (no fused multiply-add) change the
/// rounding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatmulParams {
    /// Most rows of C per task; the A block `mc × kc` should sit in L2.
    pub mc: usize,
    /// Depth of a k-slab; one B micro-panel `kc × NR` (NR = 16 or 32) should sit in L1.
    pub kc: usize,
    /// Most columns of C per task; the B block `kc × nc` should sit in L2/L3.
    pub nc: usize,
    /// Thread split: tiles are cut further until there are at least this many tasks per rayon
    /// thread (each cut along rows or columns, whichever leaves the smaller largest task).
    /// 0 runs everything on the calling thread.
    pub tasks_per_thread: usize,
    /// Products with fewer flops than this run on the calling thread.
    pub min_parallel_flops: usize,
    /// Micro-kernel choice; an ISA this CPU lacks is an error.
    pub isa: Isa,
    /// Products of at most this many rows (decode shapes) read A in place instead of packing
    /// it into MR-row panels, and split their columns (then their rows) over threads; 0 never
    /// does. Same bits either way.
    pub small_m: usize,
    /// As `small_m`, for products whose B comes packed ahead (the weights, which the executor
    /// packs once per run, or once per step while training), where
    /// packing A is the only packing left to skip. The default
    /// ([`default_small_m_packed_b`]) depends on the CPU.
    #[serde(default = "default_small_m_packed_b")]
    pub small_m_packed_b: usize,
    /// Products of at most this many rows whose B is packed ahead from a weight stored in f16
    /// or bf16 keep its panels in that format, widened to f32 as the row kernels read them:
    /// exact (either widens without loss), and half the bytes a product streams from cache or
    /// memory, where few rows leave it bound by those bytes rather than by its multiply-adds;
    /// 0 never does. Only the unpacked-A path reads such panels (rows past `small_m_packed_b`
    /// never get them).
    #[serde(default = "default_half_b_rows")]
    pub half_b_rows: usize,
}

impl Default for MatmulParams {
    fn default() -> Self {
        Self {
            mc: 192,
            kc: 256,
            nc: 1024,
            // Two tasks per thread, not one: inside a forward pass the other threads often
            // wake late for a product (they slept through the sequential step before it), and
            // the thread that started takes their share meanwhile. tiny_llama's 128-token
            // forward (8 layers, 2 threads, 2-core AVX-512 Xeon) 5 % faster, bert_base 5 %;
            // decode, resnet50, mlp and the training step unchanged. Still the best with the
            // threads kept awake (`par::with_threads_awake`): 1 and 4 are 7 % and 3 % slower.
            tasks_per_thread: 2,
            // Where the executor keeps its threads awake (`par::with_threads_awake`), splitting
            // a product pays from about 2^17 flops: a decode step's products (1 token: 2^17 to
            // 2^19 flops each) on 2 threads, tiny_llama 8 layers, 1.5x faster than at 2^19.
            min_parallel_flops: 1 << 17,
            isa: Isa::Auto,
            small_m: 8,
            small_m_packed_b: default_small_m_packed_b(),
            half_b_rows: default_half_b_rows(),
        }
    }
}

/// Where the widest micro-kernel is AVX-512 (whose row kernels take 12 rows: 24 accumulators
/// of its 32 registers), a product with B packed ahead reads A in place up to 4,096 rows: no
/// packing pass, one parallel loop, measured 5-25 % faster on two threads for the products of
/// a 128-token tiny_llama forward, up to 97 % of peak, and no slower in its training step. AVX2's
/// row kernels take 6 rows (16 registers), and packing A wins there beyond decode shapes (8
/// rows). Products whose B is not packed ahead (a training step's weight gradients) keep
/// `small_m`: with their cold operands and the columns split, both threads would read all of A.
pub fn default_small_m_packed_b() -> usize {
    match MicroKernel::select(Isa::Auto) {
        Ok(kernel) if kernel.isa == Isa::Avx512 => 1 << 12,
        _ => 8,
    }
}

/// Rows up to which a weight stored in f16 or bf16 is packed so ([`MatmulParams::half_b_rows`]):
/// tiny_llama's forward (2-core AVX-512 Xeon, f16 weights) is 1.85x faster at 1 row (decode),
/// alike at 128, 3 % slower at 512 and 1 % at 2,048 with 16-bit panels than with f32 ones.
pub fn default_half_b_rows() -> usize {
    HALF_B_ROWS
}

/// See [`default_half_b_rows`].
const HALF_B_ROWS: usize = 128;

/// The 16-bit format a product of `rows` rows keeps the panels of its B in, when B is packed
/// ahead from a weight stored as `dtype` ([`MatmulParams::half_b_rows`]): f16 or bf16 where
/// the weight is, and only where the unpacked-A path, whose row kernels widen them, takes it.
pub fn half_panels(rows: usize, dtype: DType, params: &MatmulParams) -> Option<HalfType> {
    let small = rows <= params.half_b_rows && rows <= params.small_m.max(params.small_m_packed_b);
    HalfType::of(dtype).filter(|_| small)
}

/// The attributes of `matmul` / `fused_matmul`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MatmulOptions<'a> {
    /// A is stored `[..., k, m]`.
    pub transpose_a: bool,
    /// B is stored `[..., n, k]`.
    pub transpose_b: bool,
    /// Added to the product; must broadcast to the output shape.
    pub bias: Option<TensorRef<'a>>,
    /// Applied after the bias.
    pub activation: Activation,
}

/// Operand dims `(batch dims, rows, cols)` of a matmul operand as used (after transposition).
fn split_operand<'s>(
    what: &str,
    shape: &'s [usize],
    transpose: bool,
) -> KernelResult<(&'s [usize], usize, usize)> {
    if shape.len() < 2 {
        return Err(KernelError::new(
            "matmul",
            format!("{what} must have at least 2 dimensions, got shape {shape:?}"),
        ));
    }
    let (batch, mat) = shape.split_at(shape.len() - 2);
    let (r, c) = if transpose {
        (mat[1], mat[0])
    } else {
        (mat[0], mat[1])
    };
    Ok((batch, r, c))
}

/// Output shape of `matmul(a, b)`: `[broadcast(batch a, batch b)..., m, n]`.
pub fn matmul_output_shape(
    a_shape: &[usize],
    b_shape: &[usize],
    transpose_a: bool,
    transpose_b: bool,
) -> KernelResult<Vec<usize>> {
    let (ab, m, ka) = split_operand("a", a_shape, transpose_a)?;
    let (bb, kb, n) = split_operand("b", b_shape, transpose_b)?;
    if ka != kb {
        return Err(KernelError::new(
            "matmul",
            format!(
                "inner dimensions differ: a {a_shape:?} gives k = {ka}, b {b_shape:?} gives k = {kb}"
            ),
        ));
    }
    let mut out = broadcast_shapes("matmul", &[ab, bb])?;
    out.extend([m, n]);
    Ok(out)
}

/// `out = activation(op(a) @ op(b) + bias)` with NumPy batch broadcasting, where `op` transposes
/// the last two dims when asked. `out` must hold [`matmul_output_shape`] elements. Plans and
/// runs in one call; a caller running the same shapes again keeps a [`GemmPlan`] instead.
pub fn matmul(
    a: TensorRef<'_>,
    b: TensorRef<'_>,
    opts: &MatmulOptions<'_>,
    params: &MatmulParams,
    out: &mut [f32],
) -> KernelResult<()> {
    check_len("matmul", "a", a.data.len(), a.shape)?;
    check_len("matmul", "b", b.data.len(), b.shape)?;
    let out_shape = matmul_output_shape(a.shape, b.shape, opts.transpose_a, opts.transpose_b)?;
    check_len("matmul", "out", out.len(), &out_shape)?;
    if let Some(bias) = opts.bias {
        check_len("matmul", "bias", bias.data.len(), bias.shape)?;
    }
    let plan = GemmPlan::new(
        a.shape,
        b.shape,
        opts.bias.map(|t| t.shape),
        opts.transpose_a,
        opts.transpose_b,
    )?;
    let epilogue = Epilogue {
        bias: opts.bias.map(|t| t.data),
        activation: opts.activation,
        multiplier: None,
    };
    plan.run(a.data, b.data, epilogue, params, out)
}

#[cfg(test)]
mod tests;
