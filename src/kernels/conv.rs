//! `conv2d` as im2col + the packed GEMM, and the attribute checks shared with the reference.

use serde::{Deserialize, Serialize};

use super::error::{KernelError, KernelResult};
use super::shape::check_len;
use super::tensor::TensorRef;

/// The attributes of `conv2d` (PyTorch semantics, NCHW, no bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conv2dAttrs {
    /// Step between output positions, (h, w); at least 1.
    pub stride: [usize; 2],
    /// Zero padding on each side, (h, w).
    pub padding: [usize; 2],
    /// Spacing between kernel taps, (h, w); at least 1.
    pub dilation: [usize; 2],
    /// Channel groups; divides both C and O.
    pub groups: usize,
}

impl Default for Conv2dAttrs {
    fn default() -> Self {
        Self {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Output size of a sliding window along one axis: `(len + 2 pad - span) / stride + 1`, or an
/// error when the window does not fit.
pub fn window_output(
    op: &'static str,
    len: usize,
    pad: usize,
    span: usize,
    stride: usize,
) -> KernelResult<usize> {
    let padded = len + 2 * pad;
    if span > padded {
        return Err(KernelError::new(
            op,
            format!("window of {span} does not fit an input of {len} padded by {pad}"),
        ));
    }
    Ok((padded - span) / stride + 1)
}

/// The geometry of one conv2d call, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dGeometry {
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub o: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
}

impl Conv2dGeometry {
    /// Checks `x [N, C, H, W]`, `w [O, C/groups, kh, kw]` and the attributes.
    pub fn new(x: TensorRef<'_>, w: TensorRef<'_>, a: &Conv2dAttrs) -> KernelResult<Self> {
        const OP: &str = "conv2d";
        check_len(OP, "x", x.data.len(), x.shape)?;
        check_len(OP, "w", w.data.len(), w.shape)?;
        let (&[n, c, h, wd], &[o, cg, kh, kw]) = (x.shape, w.shape) else {
            return Err(KernelError::new(
                OP,
                format!("x {:?} must be [N, C, H, W] and w {:?} [O, C/groups, kh, kw]", x.shape, w.shape),
            ));
        };
        if a.stride.contains(&0) || a.dilation.contains(&0) || a.groups == 0 {
            return Err(KernelError::new(OP, format!("stride, dilation and groups must be at least 1: {a:?}")));
        }
        if c % a.groups != 0 || o % a.groups != 0 || cg != c / a.groups {
            return Err(KernelError::new(
                OP,
                format!("groups {} do not fit {c} input channels, {o} output channels and w {:?}", a.groups, w.shape),
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(KernelError::new(OP, "kernel must be at least 1×1"));
        }
        let oh = window_output(OP, h, a.padding[0], a.dilation[0] * (kh - 1) + 1, a.stride[0])?;
        let ow = window_output(OP, wd, a.padding[1], a.dilation[1] * (kw - 1) + 1, a.stride[1])?;
        Ok(Self { n, c, h, w: wd, o, kh, kw, oh, ow })
    }

    /// `[N, O, oh, ow]`.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.oh, self.ow]
    }

    /// Input row/column read by output position `out` and tap `tap` along one axis, or `None`
    /// in the padding.
    pub fn input_index(
        out: usize,
        tap: usize,
        stride: usize,
        dilation: usize,
        pad: usize,
        len: usize,
    ) -> Option<usize> {
        (out * stride + tap * dilation)
            .checked_sub(pad)
            .filter(|&i| i < len)
    }
}
