//! Reference losses: cross_entropy and mse_loss, both means returned as scalars.

use super::elementwise::broadcast_values;
use crate::error::{KernelError, KernelResult};
use crate::shape::{broadcast_shapes, check_len};
use crate::tensor::{Tensor, TensorRef};

/// The attributes of `cross_entropy` and `cross_entropy_grad` (PyTorch's): rows labelled
/// `ignore_index` are left out of the loss and the mean; `label_smoothing` (ε) mixes the
/// one-hot target with the uniform one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyAttrs {
    /// The label of positions left out (PyTorch's default -100).
    pub ignore_index: i64,
    /// ε in `[0, 1]`: the weight of the uniform target (0: none).
    pub label_smoothing: f64,
}

impl Default for CrossEntropyAttrs {
    fn default() -> Self {
        CrossEntropyAttrs {
            ignore_index: -100,
            label_smoothing: 0.0,
        }
    }
}

/// Checks `logits [..., V]` against `labels [...]` (each in `0..V` or `ignore_index`) and
/// returns `(positions, V, counted)`, `counted` the positions not ignored.
pub fn cross_entropy_dims(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
    attrs: &CrossEntropyAttrs,
) -> KernelResult<(usize, usize, usize)> {
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
    let ignored = |l: i64| l == attrs.ignore_index;
    if let Some(bad) = labels
        .iter()
        .find(|&&l| !ignored(l) && (l < 0 || l as u64 >= v as u64))
    {
        return Err(KernelError::new(
            OP,
            format!("label {bad} is outside 0..{v}"),
        ));
    }
    let counted = labels.iter().filter(|&&l| !ignored(l)).count();
    Ok((labels.len(), v, counted))
}

/// The log-sum-exp of a row, in f64.
fn lse(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .map(|&x| x as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    max + row
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// `cross_entropy`: the mean over the counted positions of
/// `(1 - ε)·(lse - row[label]) + ε·(lse - mean(row))`; NaN when none is counted (PyTorch).
pub fn cross_entropy(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
    attrs: &CrossEntropyAttrs,
) -> KernelResult<Tensor> {
    let (_, v, counted) = cross_entropy_dims(logits, labels, labels_shape, attrs)?;
    let eps = attrs.label_smoothing;
    let mut total = 0.0f64;
    for (row, &label) in logits.data.chunks(v).zip(labels) {
        if label == attrs.ignore_index {
            continue;
        }
        let lse = lse(row);
        let mean = row.iter().map(|&x| x as f64).sum::<f64>() / v as f64;
        total += (1.0 - eps) * (lse - row[label as usize] as f64) + eps * (lse - mean);
    }
    Ok(Tensor {
        shape: Vec::new(),
        data: vec![(total / counted as f64) as f32],
    })
}

/// `cross_entropy_grad`: `dloss / n · (softmax(row) - (1 - ε)·onehot(label) - ε / V)` for each
/// counted row (`n` of them), 0 for ignored rows.
pub fn cross_entropy_grad(
    logits: TensorRef<'_>,
    labels: &[i64],
    labels_shape: &[usize],
    dloss: f32,
    attrs: &CrossEntropyAttrs,
) -> KernelResult<Tensor> {
    let (_, v, counted) = cross_entropy_dims(logits, labels, labels_shape, attrs)?;
    let eps = attrs.label_smoothing;
    let scale = dloss as f64 / counted as f64;
    let mut data = vec![0.0f32; logits.data.len()];
    for ((row, out), &label) in logits.data.chunks(v).zip(data.chunks_mut(v)).zip(labels) {
        if label == attrs.ignore_index {
            continue;
        }
        let lse = lse(row);
        for (c, (o, &x)) in out.iter_mut().zip(row).enumerate() {
            let hot = if c as i64 == label { 1.0 - eps } else { 0.0 };
            *o = (scale * ((x as f64 - lse).exp() - hot - eps / v as f64)) as f32;
        }
    }
    Ok(Tensor {
        shape: logits.shape.to_vec(),
        data,
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
