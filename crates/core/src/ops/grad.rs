//! Building blocks for gradient rules: short emit helpers on any [`Emitter`] (scalar
//! constants, arithmetic, reshapes, casts) and [`unbroadcast`], which sums a cotangent back to
//! the shape of an operand that was broadcast. Rules in every op family use these, so that a
//! rule reads as the formula it implements.

use super::attrs::Attrs;
use super::dtype::DType;
use super::error::OpError;
use super::registry::Op;
use super::spec::{Emitter, GradCall, Handle};
use super::tensor_type::TensorType;

impl dyn Emitter + '_ {
    /// Emits a one-output op and returns its result.
    pub fn op1(&mut self, op: Op, attrs: Attrs, inputs: &[Handle]) -> Result<Handle, OpError> {
        self.emit(op, attrs, inputs)?
            .into_iter()
            .next()
            .ok_or_else(|| OpError::new(format!("{op} returned no result")))
    }

    /// A rank-0 constant `value` of `dtype`.
    pub fn scalar(&mut self, value: f64, dtype: DType) -> Result<Handle, OpError> {
        let attrs = Attrs::new().with("value", value).with("dtype", dtype);
        self.op1(Op::Constant, attrs, &[])
    }

    /// `a + b` (broadcasting).
    pub fn add(&mut self, a: Handle, b: Handle) -> Result<Handle, OpError> {
        self.op1(Op::Add, Attrs::new(), &[a, b])
    }

    /// `a - b` (broadcasting).
    pub fn sub(&mut self, a: Handle, b: Handle) -> Result<Handle, OpError> {
        self.op1(Op::Sub, Attrs::new(), &[a, b])
    }

    /// `a * b` (broadcasting).
    pub fn mul(&mut self, a: Handle, b: Handle) -> Result<Handle, OpError> {
        self.op1(Op::Mul, Attrs::new(), &[a, b])
    }

    /// `a / b` (broadcasting).
    pub fn div(&mut self, a: Handle, b: Handle) -> Result<Handle, OpError> {
        self.op1(Op::Div, Attrs::new(), &[a, b])
    }

    /// `-x`.
    pub fn neg(&mut self, x: Handle) -> Result<Handle, OpError> {
        self.op1(Op::Neg, Attrs::new(), &[x])
    }

    /// `x * c` for a constant `c` in `x`'s dtype.
    pub fn scale(&mut self, x: Handle, c: f64) -> Result<Handle, OpError> {
        let dtype = self.ty(x)?.dtype;
        let c = self.scalar(c, dtype)?;
        self.mul(x, c)
    }

    /// A one-input op without attributes (`exp(x)`, `sign(x)`, ...).
    pub fn unary(&mut self, op: Op, x: Handle) -> Result<Handle, OpError> {
        self.op1(op, Attrs::new(), &[x])
    }

    /// `x` reshaped to `shape` (nothing emitted when it already has that shape).
    pub fn reshape(&mut self, x: Handle, shape: &[i64]) -> Result<Handle, OpError> {
        if self.ty(x)?.shape == shape {
            return Ok(x);
        }
        self.op1(Op::Reshape, Attrs::new().with("shape", shape), &[x])
    }

    /// `x` broadcast to `shape` (nothing emitted when it already has that shape).
    pub fn broadcast_to(&mut self, x: Handle, shape: &[i64]) -> Result<Handle, OpError> {
        if self.ty(x)?.shape == shape {
            return Ok(x);
        }
        self.op1(Op::BroadcastTo, Attrs::new().with("shape", shape), &[x])
    }

    /// `x` cast to `dtype` (nothing emitted when it already has it).
    pub fn cast(&mut self, x: Handle, dtype: DType) -> Result<Handle, OpError> {
        if self.ty(x)?.dtype == dtype {
            return Ok(x);
        }
        self.op1(Op::Cast, Attrs::new().with("dtype", dtype), &[x])
    }

    /// `op` (`sum`, `mean`, `max`) of `x` over `axes`, keeping them as dims of 1 when `keepdim`.
    pub fn reduce(
        &mut self,
        op: Op,
        x: Handle,
        axes: &[usize],
        keepdim: bool,
    ) -> Result<Handle, OpError> {
        let axes: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let attrs = Attrs::new().with("axes", axes).with("keepdim", keepdim);
        self.op1(op, attrs, &[x])
    }

    /// `sum(x * y)` over `axes`, kept as dims of 1: the row dot product softmax-style rules
    /// need.
    pub fn sum_product(&mut self, x: Handle, y: Handle, axes: &[usize]) -> Result<Handle, OpError> {
        let p = self.mul(x, y)?;
        self.reduce(Op::Sum, p, axes, true)
    }
}

/// Sums the cotangent `grad` of a broadcast result back to the type `to` of the operand that
/// was broadcast: over the leading dims `to` lacks and the dims where `to` has 1, then reshaped
/// to `to`'s shape and cast to its dtype (a promoted operand gets its gradient in its own
/// dtype). Integer and bool operands get no gradient (`None`).
pub fn unbroadcast(
    em: &mut dyn Emitter,
    grad: Handle,
    to: &TensorType,
) -> Result<Option<Handle>, OpError> {
    if !to.dtype.is_float() {
        return Ok(None);
    }
    let from = em.ty(grad)?;
    let lead = from.rank().checked_sub(to.rank()).ok_or_else(|| {
        OpError::new(format!(
            "cannot unbroadcast a rank-{} gradient to rank {}",
            from.rank(),
            to.rank()
        ))
    })?;
    let axes: Vec<usize> = (0..from.rank())
        .filter(|&i| i < lead || (to.shape[i - lead] == 1 && from.shape[i] != 1))
        .collect();
    let summed = if axes.is_empty() {
        grad
    } else {
        em.reduce(Op::Sum, grad, &axes, false)?
    };
    let shaped = em.reshape(summed, &to.shape)?;
    em.cast(shaped, to.dtype).map(Some)
}

impl GradCall<'_> {
    /// The cotangent of output 0: the walk calls a one-output op's rule only when its
    /// result reaches the loss, so it is always set there.
    pub fn dy(&self) -> Result<Handle, OpError> {
        self.cotangents
            .first()
            .copied()
            .flatten()
            .ok_or_else(|| OpError::new("the rule was called without a cotangent"))
    }

    /// Input `i`.
    pub fn x(&self, i: usize) -> Handle {
        self.inputs[i]
    }

    /// Output `i`.
    pub fn y(&self, i: usize) -> Handle {
        self.outputs[i]
    }
}
