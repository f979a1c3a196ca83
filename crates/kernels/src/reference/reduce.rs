//! Reference reductions (`sum`, `mean`, `max`, `square_sum`, `square_sum_finite`) and
//! `softmax` / `log_softmax`.

use crate::error::{KernelError, KernelResult};
use crate::reduce::{axes_mask, reduced_shape, ReduceOp};
use crate::shape::{check_len, normalize_axis, split_at_axis, strides};
use crate::tensor::{Tensor, TensorRef};

/// `square_sum`: `Σ x²` over every element, in f64, as a scalar.
pub fn square_sum(x: TensorRef<'_>) -> KernelResult<Tensor> {
    check_len("square_sum", "x", x.data.len(), x.shape)?;
    let total: f64 = x.data.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    Tensor::new("square_sum", vec![], vec![total as f32])
}

/// `square_sum_finite`: [`square_sum`] and `Σ x·0` in f64 (0 where every element is finite,
/// NaN where any is not), two scalars.
pub fn square_sum_finite(x: TensorRef<'_>) -> KernelResult<Vec<Tensor>> {
    let check: f64 = x.data.iter().map(|&v| f64::from(v) * 0.0).sum();
    let check = Tensor::new("square_sum_finite", vec![], vec![check as f32])?;
    Ok(vec![square_sum(x)?, check])
}

/// `sum` / `mean` / `max` over `axes`.
pub fn reduce(x: TensorRef<'_>, op: ReduceOp, axes: &[i64], keepdim: bool) -> KernelResult<Tensor> {
    check_len("reduce", "x", x.data.len(), x.shape)?;
    let mask = axes_mask("reduce", axes, x.shape.len())?;
    let count: usize = x
        .shape
        .iter()
        .zip(&mask)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    if op == ReduceOp::Max && count == 0 {
        return Err(KernelError::new(
            "max",
            "cannot take the maximum of no elements",
        ));
    }
    // Output strides over the input's dims: 0 on reduced dims.
    let kept: Vec<usize> = x
        .shape
        .iter()
        .zip(&mask)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let kept_strides = strides(&kept);
    let in_strides = strides(x.shape);
    let out_len: usize = kept.iter().product();
    let mut acc: Vec<Vec<f64>> = vec![Vec::new(); out_len];
    for (i, &v) in x.data.iter().enumerate() {
        let mut o = 0;
        for d in 0..x.shape.len() {
            let idx = i / in_strides[d] % x.shape[d];
            if !mask[d] {
                o += idx * kept_strides[d];
            }
        }
        acc[o].push(v as f64);
    }
    let data = acc
        .iter()
        .map(|vals| {
            let r = match op {
                ReduceOp::Sum => vals.iter().sum::<f64>(),
                ReduceOp::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
                ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, |m, v| {
                    if m.is_nan() || v.is_nan() {
                        f64::NAN
                    } else {
                        m.max(v)
                    }
                }),
            };
            r as f32
        })
        .collect();
    Tensor::new("reduce", reduced_shape(x.shape, &mask, keepdim), data)
}

/// softmax along `axis` when `log` is false, log_softmax when it is (max-subtracted, in f64).
pub fn softmax_general(x: TensorRef<'_>, axis: i64, log: bool) -> KernelResult<Tensor> {
    check_len("softmax", "x", x.data.len(), x.shape)?;
    let axis = normalize_axis("softmax", axis, x.shape.len())?;
    let (outer, len, inner) = split_at_axis(x.shape, axis);
    let mut data = vec![0.0f32; x.data.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| o * len * inner + l * inner + i;
            let max = (0..len)
                .map(|l| x.data[at(l)] as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..len).map(|l| (x.data[at(l)] as f64 - max).exp()).sum();
            for l in 0..len {
                let z = x.data[at(l)] as f64 - max;
                data[at(l)] = if log { z - sum.ln() } else { z.exp() / sum } as f32;
            }
        }
    }
    Tensor::new("softmax", x.shape.to_vec(), data)
}

/// `softmax` along `axis`.
pub fn softmax(x: TensorRef<'_>, axis: i64) -> KernelResult<Tensor> {
    softmax_general(x, axis, false)
}

/// `log_softmax` along `axis`.
pub fn log_softmax(x: TensorRef<'_>, axis: i64) -> KernelResult<Tensor> {
    softmax_general(x, axis, true)
}
