//! Reference normalisations: rms_norm(+scale), layer_norm(+affine), batch_norm (inference).

use super::elementwise::binary;
use crate::elementwise::op::BinaryOp;
use crate::error::{KernelError, KernelResult};
use crate::shape::check_len;
use crate::tensor::{Tensor, TensorRef};

/// Applies `f(row) -> row` to every last-dim row, in f64.
fn per_row(
    op: &'static str,
    x: TensorRef<'_>,
    f: impl Fn(&[f64]) -> Vec<f64>,
) -> KernelResult<Tensor> {
    check_len(op, "x", x.data.len(), x.shape)?;
    let d = *x
        .shape
        .last()
        .ok_or_else(|| KernelError::new(op, "needs at least one dimension"))?;
    let mut data = Vec::with_capacity(x.data.len());
    if d > 0 {
        for row in x.data.chunks(d) {
            let r: Vec<f64> = row.iter().map(|&v| v as f64).collect();
            data.extend(f(&r).into_iter().map(|v| v as f32));
        }
    }
    Tensor::new(op, x.shape.to_vec(), data)
}

/// `rms_norm`: `x * rsqrt(mean(x², -1) + eps)`.
pub fn rms_norm(x: TensorRef<'_>, eps: f64) -> KernelResult<Tensor> {
    per_row("rms_norm", x, |r| {
        let ms = r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        r.iter().map(|v| v * inv).collect()
    })
}

/// `layer_norm`: `(x - mean) * rsqrt(var + eps)` over the last dim, biased variance.
pub fn layer_norm(x: TensorRef<'_>, eps: f64) -> KernelResult<Tensor> {
    per_row("layer_norm", x, |r| {
        let n = r.len() as f64;
        let mean = r.iter().sum::<f64>() / n;
        let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let inv = 1.0 / (var + eps).sqrt();
        r.iter().map(|v| (v - mean) * inv).collect()
    })
}

/// `binary(op, a, b)` that must keep `a`'s shape (the second operand only broadcasts in).
fn apply_keeping_shape(
    op_name: &'static str,
    op: BinaryOp,
    a: &Tensor,
    b: TensorRef<'_>,
) -> KernelResult<Tensor> {
    let r = binary(op, a.view(), b)?;
    if r.shape != a.shape {
        return Err(KernelError::new(
            op_name,
            format!(
                "parameter of shape {:?} does not broadcast to {:?}",
                b.shape, a.shape
            ),
        ));
    }
    Ok(r)
}

/// `rms_norm_scale`: `rms_norm(x) * w`.
pub fn rms_norm_scale(x: TensorRef<'_>, w: TensorRef<'_>, eps: f64) -> KernelResult<Tensor> {
    let n = rms_norm(x, eps)?;
    apply_keeping_shape("rms_norm_scale", BinaryOp::Mul, &n, w)
}

/// `layer_norm_affine`: `layer_norm(x) * g + b`.
pub fn layer_norm_affine(
    x: TensorRef<'_>,
    g: TensorRef<'_>,
    b: TensorRef<'_>,
    eps: f64,
) -> KernelResult<Tensor> {
    let n = layer_norm(x, eps)?;
    let scaled = apply_keeping_shape("layer_norm_affine", BinaryOp::Mul, &n, g)?;
    apply_keeping_shape("layer_norm_affine", BinaryOp::Add, &scaled, b)
}

/// `batch_norm` (inference, no affine): `(x - mean[c]) / sqrt(var[c] + eps)` for x `[N, C, ...]`.
pub fn batch_norm(
    x: TensorRef<'_>,
    mean: TensorRef<'_>,
    var: TensorRef<'_>,
    eps: f64,
) -> KernelResult<Tensor> {
    check_len("batch_norm", "x", x.data.len(), x.shape)?;
    if x.shape.len() < 2 {
        return Err(KernelError::new("batch_norm", "x must be [N, C, ...]"));
    }
    let c = x.shape[1];
    for (what, t) in [("mean", mean), ("var", var)] {
        check_len("batch_norm", what, t.data.len(), t.shape)?;
        if t.shape != [c] {
            return Err(KernelError::new(
                "batch_norm",
                format!("{what} has shape {:?}, expected [{c}]", t.shape),
            ));
        }
    }
    let spatial: usize = x.shape[2..].iter().product();
    let data = x
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let ch = i / spatial.max(1) % c;
            ((v as f64 - mean.data[ch] as f64) / (var.data[ch] as f64 + eps).sqrt()) as f32
        })
        .collect();
    Tensor::new("batch_norm", x.shape.to_vec(), data)
}
