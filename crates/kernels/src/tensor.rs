//! Plain tensor containers for kernel arguments and reference results.

use super::error::KernelResult;
use super::shape::check_len;

/// A borrowed f32 tensor: a row-major contiguous slice and its shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRef<'a> {
    /// The elements, row-major.
    pub data: &'a [f32],
    /// The dimensions; `[]` is a scalar.
    pub shape: &'a [usize],
}

impl<'a> TensorRef<'a> {
    /// Pairs a slice with its shape, checking that the element counts agree.
    pub fn new(op: &'static str, data: &'a [f32], shape: &'a [usize]) -> KernelResult<Self> {
        check_len(op, "tensor", data.len(), shape)?;
        Ok(Self { data, shape })
    }
}

/// An owned f32 tensor, as returned by the reference kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The dimensions; `[]` is a scalar.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<f32>,
}

impl Tensor {
    /// Pairs owned data with its shape, checking that the element counts agree.
    pub fn new(op: &'static str, shape: Vec<usize>, data: Vec<f32>) -> KernelResult<Self> {
        check_len(op, "tensor", data.len(), &shape)?;
        Ok(Self { shape, data })
    }

    /// A borrowed view of this tensor.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            data: &self.data,
            shape: &self.shape,
        }
    }
}
