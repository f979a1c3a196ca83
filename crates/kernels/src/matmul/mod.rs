//! Matrix multiplication (`matmul`, `fused_matmul`): batched, with transposes, bias and
//! activation, on a BLIS-style packed and blocked GEMM with AVX-512, AVX2+FMA and portable
//! micro-kernels chosen at run time.

pub mod gemm;
pub mod kernel;
pub mod pack;

use serde::{Deserialize, Serialize};

use super::activation::Activation;
use super::error::{KernelError, KernelResult};
use super::shape::{broadcast_shapes, broadcast_strides, check_len, for_each_offset, numel};
use super::tensor::TensorRef;
use gemm::{BiasRef, Gemm, Problem};
pub use kernel::{Isa, MicroKernel};
use pack::MatRef;

/// Tunable parameters of the GEMM. Every field is honoured. Results are bit-identical for any
/// `mc`, `nc`, `tasks_per_thread`, `min_parallel_flops` and thread count, and between the AVX2
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
}

impl Default for MatmulParams {
    fn default() -> Self {
        Self {
            mc: 96,
            kc: 256,
            nc: 1024,
            tasks_per_thread: 1,
            min_parallel_flops: 1 << 19,
            isa: Isa::Auto,
        }
    }
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

/// The matrices of an operand's batch, each `rows × cols` after the optional transposition.
fn operand_mats<'a>(data: &'a [f32], shape: &[usize], transpose: bool) -> Vec<MatRef<'a>> {
    let (sr, sc) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let stored = |offset| MatRef {
        data,
        offset,
        rs: sc,
        cs: 1,
        rows: sr,
        cols: sc,
    };
    let count = shape[..shape.len() - 2].iter().product::<usize>();
    (0..count)
        .map(|i| {
            let m = stored(i * sr * sc);
            if transpose {
                m.t()
            } else {
                m
            }
        })
        .collect()
}

/// `out = activation(op(a) @ op(b) + bias)` with NumPy batch broadcasting, where `op` transposes
/// the last two dims when asked. `out` must hold [`matmul_output_shape`] elements.
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
    let rank = out_shape.len();
    let (m, n) = (out_shape[rank - 2], out_shape[rank - 1]);
    let k = split_operand("a", a.shape, opts.transpose_a)?.2;
    let bias_strides = match opts.bias {
        None => None,
        Some(bias) => {
            check_len("matmul", "bias", bias.data.len(), bias.shape)?;
            if broadcast_shapes("matmul", &[&out_shape, bias.shape])? != out_shape {
                return Err(KernelError::new(
                    "matmul",
                    format!(
                        "bias shape {:?} does not broadcast to the output shape {out_shape:?}",
                        bias.shape
                    ),
                ));
            }
            Some(broadcast_strides(bias.shape, &out_shape))
        }
    };
    let batch_shape = &out_shape[..rank - 2];
    let mut a_mats = operand_mats(a.data, a.shape, opts.transpose_a);
    let b_mats = operand_mats(b.data, b.shape, opts.transpose_b);
    let bias_batch_free = bias_strides
        .as_ref()
        .is_none_or(|s| s[..rank - 1].iter().all(|&x| x == 0));
    // A batch of row-major A against one B is a single taller product.
    let fold = b_mats.len() == 1 && !opts.transpose_a && a_mats.len() > 1 && bias_batch_free;
    let (gm, problems) = if fold {
        let rows = a_mats.len() * m;
        a_mats = vec![MatRef {
            data: a.data,
            offset: 0,
            rs: k,
            cs: 1,
            rows,
            cols: k,
        }];
        let one = Problem {
            a: 0,
            b: 0,
            c_offset: 0,
            bias_offset: 0,
        };
        (rows, vec![one])
    } else {
        (
            m,
            batch_problems(
                batch_shape,
                a.shape,
                b.shape,
                bias_strides.as_deref(),
                m * n,
            )?,
        )
    };
    let kernel = MicroKernel::select(params.isa)?;
    let bias = opts
        .bias
        .zip(bias_strides.as_ref())
        .map(|(bias, s)| BiasRef {
            data: bias.data,
            rs: s[rank - 2],
            cs: s[rank - 1],
        });
    Gemm {
        m: gm,
        n,
        k,
        a: &a_mats,
        b: &b_mats,
        problems: &problems,
        ldc: n,
        accumulate: false,
        bias,
        activation: opts.activation,
        kernel,
    }
    .run(out, params);
    Ok(())
}

/// One [`Problem`] per output batch index, with the A, B and bias each broadcast to it.
fn batch_problems(
    batch_shape: &[usize],
    a_shape: &[usize],
    b_shape: &[usize],
    bias_strides: Option<&[usize]>,
    c_size: usize,
) -> KernelResult<Vec<Problem>> {
    let count = numel("matmul", batch_shape)?;
    let operand_index = |shape: &[usize]| {
        let strides = broadcast_strides(&shape[..shape.len() - 2], batch_shape);
        let mut idx = Vec::with_capacity(count);
        for_each_offset(batch_shape, &strides, |o| idx.push(o));
        idx
    };
    let a_idx = operand_index(a_shape);
    let b_idx = operand_index(b_shape);
    let mut bias_off = Vec::with_capacity(count);
    match bias_strides {
        Some(s) => for_each_offset(batch_shape, &s[..batch_shape.len()], |o| bias_off.push(o)),
        None => bias_off.resize(count, 0),
    }
    Ok((0..count)
        .map(|i| Problem {
            a: a_idx[i],
            b: b_idx[i],
            c_offset: i * c_size,
            bias_offset: bias_off[i],
        })
        .collect())
}

#[cfg(test)]
mod tests;
