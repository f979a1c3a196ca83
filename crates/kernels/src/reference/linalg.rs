//! Reference `matmul` and `fused_matmul`: triple loops accumulating in f64.

use super::elementwise::{broadcast_values, unary_scalar};
use crate::activation::Activation;
use crate::error::{KernelError, KernelResult};
use crate::matmul::matmul_output_shape;
use crate::shape::{broadcast_shapes, broadcast_strides, check_len, for_each_offset};
use crate::tensor::{Tensor, TensorRef};

/// `matmul`: `op(a) @ op(b)` with batch broadcasting.
pub fn matmul(
    a: TensorRef<'_>,
    b: TensorRef<'_>,
    transpose_a: bool,
    transpose_b: bool,
) -> KernelResult<Tensor> {
    fused_matmul(a, b, None, transpose_a, transpose_b, Activation::NONE)
}

/// `fused_matmul`: `act(op(a) @ op(b) + bias)`.
pub fn fused_matmul(
    a: TensorRef<'_>,
    b: TensorRef<'_>,
    bias: Option<TensorRef<'_>>,
    transpose_a: bool,
    transpose_b: bool,
    activation: Activation,
) -> KernelResult<Tensor> {
    check_len("matmul", "a", a.data.len(), a.shape)?;
    check_len("matmul", "b", b.data.len(), b.shape)?;
    let shape = matmul_output_shape(a.shape, b.shape, transpose_a, transpose_b)?;
    let rank = shape.len();
    let (m, n) = (shape[rank - 2], shape[rank - 1]);
    let k = if transpose_a {
        a.shape[a.shape.len() - 2]
    } else {
        a.shape[a.shape.len() - 1]
    };
    let batch = &shape[..rank - 2];
    // Element (i, p) of op(x) inside one stored matrix.
    let at = |x: &[f32], rows: usize, cols: usize, t: bool, i: usize, p: usize| {
        let (r, c) = if t { (p, i) } else { (i, p) };
        debug_assert!(r < rows && c < cols);
        x[r * cols + c]
    };
    let (a_rows, a_cols) = (a.shape[a.shape.len() - 2], a.shape[a.shape.len() - 1]);
    let (b_rows, b_cols) = (b.shape[b.shape.len() - 2], b.shape[b.shape.len() - 1]);
    let a_batch = broadcast_strides(&a.shape[..a.shape.len() - 2], batch);
    let b_batch = broadcast_strides(&b.shape[..b.shape.len() - 2], batch);
    let (mut a_idx, mut b_idx) = (Vec::new(), Vec::new());
    for_each_offset(batch, &a_batch, |o| a_idx.push(o));
    for_each_offset(batch, &b_batch, |o| b_idx.push(o));
    let mut data = Vec::with_capacity(a_idx.len() * m * n);
    for (&ai, &bi) in a_idx.iter().zip(&b_idx) {
        let am = &a.data[ai * a_rows * a_cols..][..a_rows * a_cols];
        let bm = &b.data[bi * b_rows * b_cols..][..b_rows * b_cols];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|p| {
                        at(am, a_rows, a_cols, transpose_a, i, p) as f64
                            * at(bm, b_rows, b_cols, transpose_b, p, j) as f64
                    })
                    .sum();
                data.push(s as f32);
            }
        }
    }
    if let Some(bias) = bias {
        check_len("matmul", "bias", bias.data.len(), bias.shape)?;
        if broadcast_shapes("matmul", &[&shape, bias.shape])? != shape {
            return Err(KernelError::new(
                "matmul",
                format!(
                    "bias shape {:?} does not broadcast to {shape:?}",
                    bias.shape
                ),
            ));
        }
        for (d, b) in data.iter_mut().zip(broadcast_values(bias, &shape)) {
            *d += b;
        }
    }
    if let Some(op) = activation.unary() {
        data.iter_mut().for_each(|d| *d = unary_scalar(op, *d));
    }
    Tensor::new("matmul", shape, data)
}
