//! Reference elementwise ops: scalar definitions (computed in f64) and broadcasting wrappers.

use crate::elementwise::op::{apply_binary, BinaryOp, CastTarget, UnaryOp};
use crate::error::KernelResult;
use crate::shape::{broadcast_shapes, broadcast_strides, check_len, for_each_offset};
use crate::tensor::{Tensor, TensorRef};
use mslc_core::ops::family::elementwise::dropout_keeps;

/// One unary op on one value: the registry's f64 definition, rounded once to f32.
pub fn unary_scalar(op: UnaryOp, x: f32) -> f32 {
    op.eval(f64::from(x)) as f32
}

/// A unary op over a tensor.
pub fn unary(op: UnaryOp, x: TensorRef<'_>) -> KernelResult<Tensor> {
    check_len("unary", "x", x.data.len(), x.shape)?;
    let data = x.data.iter().map(|&v| unary_scalar(op, v)).collect();
    Tensor::new("unary", x.shape.to_vec(), data)
}

/// A binary op with NumPy broadcasting.
pub fn binary(op: BinaryOp, a: TensorRef<'_>, b: TensorRef<'_>) -> KernelResult<Tensor> {
    check_len("binary", "a", a.data.len(), a.shape)?;
    check_len("binary", "b", b.data.len(), b.shape)?;
    let shape = broadcast_shapes("binary", &[a.shape, b.shape])?;
    let av = broadcast_values(a, &shape);
    let bv = broadcast_values(b, &shape);
    let data = av
        .iter()
        .zip(&bv)
        .map(|(&x, &y)| apply_binary(op, x, y))
        .collect();
    Tensor::new("binary", shape, data)
}

/// The values of `x` broadcast to `shape` (which must be a broadcast of `x.shape`), row-major.
pub fn broadcast_values(x: TensorRef<'_>, shape: &[usize]) -> Vec<f32> {
    let strides = broadcast_strides(x.shape, shape);
    let mut out = Vec::new();
    for_each_offset(shape, &strides, |o| out.push(x.data[o]));
    out
}

/// `constant`: a scalar holding `value` as f32.
pub fn constant(value: f64) -> Tensor {
    Tensor {
        shape: Vec::new(),
        data: vec![value as f32],
    }
}

/// `cast`: every value rounded to what `to` can hold.
pub fn cast(x: TensorRef<'_>, to: CastTarget) -> KernelResult<Tensor> {
    check_len("cast", "x", x.data.len(), x.shape)?;
    let data = x.data.iter().map(|&v| to.apply(v)).collect();
    Tensor::new("cast", x.shape.to_vec(), data)
}

/// Where a tensor sits in the tensor a dropout mask is drawn over: block `index` of `blocks`
/// equal blocks along `dim` (one rank's part of a split tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskBlock {
    /// The dim the whole tensor is split along.
    pub dim: usize,
    /// Into how many equal blocks.
    pub blocks: usize,
    /// Which block this tensor is.
    pub index: usize,
}

impl MaskBlock {
    /// The index in the whole tensor of element `i` of the block, whose shape is `shape`.
    fn whole_index(&self, shape: &[usize], i: usize) -> u64 {
        // Values from `dim` on in the block (`span`) and the whole (`span · blocks`).
        let span: usize = shape[self.dim.min(shape.len())..].iter().product();
        let (outer, within) = (i / span.max(1), i % span.max(1));
        (outer * span * self.blocks + self.index * span + within) as u64
    }
}

/// `dropout`: the identity in inference (`mask` `None`); in training (`mask` = (seed, salt))
/// each element kept as [`dropout_keeps`] draws it and scaled by `1 / (1 − p)` (in f32, as
/// PyTorch multiplies by its f32 scale), the others zero. With `block`, `x` is that block of
/// the tensor the mask is drawn over, and each element draws at its index in the whole.
pub fn dropout(
    x: TensorRef<'_>,
    p: f64,
    mask: Option<(i64, i64)>,
    block: Option<MaskBlock>,
) -> KernelResult<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(crate::KernelError::new(
            "dropout",
            format!("p = {p} is not a probability"),
        ));
    }
    let data = match mask {
        None => x.data.to_vec(),
        Some((seed, salt)) => {
            let scale = (1.0 / (1.0 - p)) as f32;
            x.data
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let at = block.map_or(i as u64, |b| b.whole_index(x.shape, i));
                    if dropout_keeps(seed, salt, at, p) {
                        v * scale
                    } else {
                        0.0
                    }
                })
                .collect()
        }
    };
    Tensor::new("dropout", x.shape.to_vec(), data)
}
