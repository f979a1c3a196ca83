//! Pooling: max_pool2d, avg_pool2d (padding counted, PyTorch's default), adaptive_avg_pool2d.

use serde::{Deserialize, Serialize};

use super::conv::window_output;
use super::error::{KernelError, KernelResult};
use super::shape::check_len;
use super::tensor::TensorRef;

/// The attributes of `max_pool2d` / `avg_pool2d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool2dAttrs {
    /// Window (h, w); at least 1.
    pub kernel: [usize; 2],
    /// Step (h, w); at least 1.
    pub stride: [usize; 2],
    /// Implicit padding on each side (h, w); at most half the window, as PyTorch requires.
    pub padding: [usize; 2],
}

/// Which pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Maximum over the window (padding never wins).
    Max,
    /// Mean over the window, padding counted as zeros.
    Avg,
}

/// Checks `x [N, C, H, W]` against pooling attributes and returns `[N, C, oh, ow]`.
pub fn pool2d_output_shape(x: TensorRef<'_>, a: &Pool2dAttrs) -> KernelResult<[usize; 4]> {
    const OP: &str = "pool2d";
    check_len(OP, "x", x.data.len(), x.shape)?;
    let &[n, c, h, w] = x.shape else {
        return Err(KernelError::new(OP, format!("x must be [N, C, H, W], got {:?}", x.shape)));
    };
    if a.kernel.contains(&0) || a.stride.contains(&0) {
        return Err(KernelError::new(OP, format!("kernel and stride must be at least 1: {a:?}")));
    }
    if a.padding[0] > a.kernel[0] / 2 || a.padding[1] > a.kernel[1] / 2 {
        return Err(KernelError::new(OP, format!("padding must be at most half the kernel: {a:?}")));
    }
    let oh = window_output(OP, h, a.padding[0], a.kernel[0], a.stride[0])?;
    let ow = window_output(OP, w, a.padding[1], a.kernel[1], a.stride[1])?;
    Ok([n, c, oh, ow])
}

/// Checks `x [N, C, H, W]` and an adaptive output size, returning `[N, C, oh, ow]`.
pub fn adaptive_output_shape(x: TensorRef<'_>, output: [usize; 2]) -> KernelResult<[usize; 4]> {
    const OP: &str = "adaptive_avg_pool2d";
    check_len(OP, "x", x.data.len(), x.shape)?;
    let &[n, c, h, w] = x.shape else {
        return Err(KernelError::new(OP, format!("x must be [N, C, H, W], got {:?}", x.shape)));
    };
    if output.contains(&0) || h == 0 || w == 0 {
        return Err(KernelError::new(OP, format!("cannot pool {:?} to {output:?}", x.shape)));
    }
    Ok([n, c, output[0], output[1]])
}

/// Input range `[start, end)` pooled into adaptive output cell `i` of `out` over `len`.
pub fn adaptive_range(i: usize, out: usize, len: usize) -> (usize, usize) {
    (i * len / out, ((i + 1) * len).div_ceil(out))
}
