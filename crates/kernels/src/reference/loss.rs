//! Reference losses: cross_entropy and mse_loss, both means returned as scalars.

use super::elementwise::broadcast_values;
use crate::error::{KernelError, KernelResult};
use crate::shape::{broadcast_shapes, check_len};
use crate::tensor::{Tensor, TensorRef};

/// Checks `logits [..., V]` against `labels [...]` and returns `(positions, V)`.
pub fn cross_entropy_dims(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
) -> KernelResult<(usize, usize)> {
    const OP: &str = "cross_entropy";
    check_len(OP, "logits", logits.data.len(), logits.shape)?;
    check_len(OP, "labels", labels.len(), labels_shape)?;
    let Some((&v, lead)) = logits.shape.split_last() else {
        return Err(KernelError::new(OP, "logits must have a class dimension"));
    };
    if lead != labels_shape {
        return Err(KernelError::new(
            OP,
            format!(
                "labels {labels_shape:?} must be logits {:?} without the last dim",
                logits.shape
            ),
        ));
    }
    if labels.is_empty() {
        return Err(KernelError::new(
            OP,
            "the mean over no positions is undefined",
        ));
    }
    if let Some(bad) = labels.iter().find(|&&l| l < 0 || l as u64 >= v as u64) {
        return Err(KernelError::new(
            OP,
            format!("label {bad} is outside 0..{v}"),
        ));
    }
    Ok((labels.len(), v))
}

/// `cross_entropy`: mean over positions of `-log_softmax(logits)[label]`.
pub fn cross_entropy(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
) -> KernelResult<Tensor> {
    let (positions, v) = cross_entropy_dims(logits, labels, labels_shape)?;
    let mut total = 0.0f64;
    for (row, &label) in logits.data.chunks(v).zip(labels) {
        let max = row
            .iter()
            .map(|&x| x as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        total += lse - row[label as usize] as f64;
    }
    Ok(Tensor {
        shape: Vec::new(),
        data: vec![(total / positions as f64) as f32],
    })
}

/// `mse_loss`: mean of `(a - b)²` over the broadcast of `a` and `b`.
pub fn mse_loss(a: TensorRef<'_>, b: TensorRef<'_>) -> KernelResult<Tensor> {
    check_len("mse_loss", "a", a.data.len(), a.shape)?;
    check_len("mse_loss", "b", b.data.len(), b.shape)?;
    let shape = broadcast_shapes("mse_loss", &[a.shape, b.shape])?;
    let (av, bv) = (broadcast_values(a, &shape), broadcast_values(b, &shape));
    if av.is_empty() {
        return Err(KernelError::new(
            "mse_loss",
            "the mean over no elements is undefined",
        ));
    }
    let sum: f64 = av
        .iter()
        .zip(&bv)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    Ok(Tensor {
        shape: Vec::new(),
        data: vec![(sum / av.len() as f64) as f32],
    })
}
