//! Fast elementwise ops over slices, in place or into another slice, compiled for AVX2+FMA when
//! the CPU has them.

use super::op::{apply_binary, BinaryOp, CastTarget, UnaryOp};
use crate::convert::{round_through_bf16, round_through_f16};
use crate::cpu::{dispatch_avx2, dispatch_avx512};
use crate::math;

/// Where an elementwise loop reads its operand: the destination itself (in place) or another
/// slice of the same length.
trait Operand {
    /// Element `i` of the operand, for destination `dst`.
    fn at(&self, dst: &[f32], i: usize) -> f32;
}

/// The destination is the operand.
struct InPlace;

impl Operand for InPlace {
    #[inline(always)]
    fn at(&self, dst: &[f32], i: usize) -> f32 {
        dst[i]
    }
}

impl Operand for &[f32] {
    #[inline(always)]
    fn at(&self, _: &[f32], i: usize) -> f32 {
        self[i]
    }
}

#[inline(always)]
fn map(src: impl Operand, dst: &mut [f32], f: impl Fn(f32) -> f32) {
    for i in 0..dst.len() {
        dst[i] = f(src.at(dst, i));
    }
}

#[inline(always)]
fn unary_body(op: UnaryOp, src: impl Operand, dst: &mut [f32]) {
    match op {
        UnaryOp::Neg => map(src, dst, |x| -x),
        UnaryOp::Exp => map(src, dst, math::exp),
        UnaryOp::Log => map(src, dst, math::log),
        UnaryOp::Sqrt => map(src, dst, f32::sqrt),
        UnaryOp::Rsqrt => map(src, dst, |x| 1.0 / x.sqrt()),
        UnaryOp::Reciprocal => map(src, dst, |x| 1.0 / x),
        UnaryOp::Abs => map(src, dst, f32::abs),
        UnaryOp::Tanh => map(src, dst, math::tanh),
        UnaryOp::Sigmoid => map(src, dst, math::sigmoid),
        UnaryOp::Relu => map(src, dst, math::relu),
        UnaryOp::Gelu => map(src, dst, math::gelu),
        UnaryOp::GeluTanh => map(src, dst, math::gelu_tanh),
        UnaryOp::Silu => map(src, dst, math::silu),
        UnaryOp::Erf => map(src, dst, math::erf),
        UnaryOp::Softplus => map(src, dst, math::softplus),
        UnaryOp::Sign => map(src, dst, math::sign),
    }
}

#[inline(always)]
fn unary_in_place_body(op: UnaryOp, xs: &mut [f32]) {
    unary_body(op, InPlace, xs)
}

#[inline(always)]
fn unary_into_body(op: UnaryOp, xs: &[f32], out: &mut [f32]) {
    unary_body(op, &xs[..out.len()], out)
}

/// True for the ops whose loops are compute-bound (the transcendental functions): they run
/// 16 lanes wide where the CPU has AVX-512; the others are bound by memory (or, hot in L1,
/// faster 8 wide).
fn compute_bound(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(
        op,
        Exp | Log | Tanh | Sigmoid | Gelu | GeluTanh | Silu | Erf | Softplus
    )
}

/// The body compiled for the baseline target only (no AVX2, FMA through the library), which a
/// CPU without AVX2 runs: tests hold the vector paths to its bits.
#[cfg(test)]
pub(super) fn unary_in_place_baseline(op: UnaryOp, xs: &mut [f32]) {
    unary_in_place_body(op, xs)
}

dispatch_avx2! {
    fn unary_in_place_avx2(op: UnaryOp, xs: &mut [f32]) = unary_in_place_body;
}

dispatch_avx512! {
    fn unary_in_place_avx512(op: UnaryOp, xs: &mut [f32]) = unary_in_place_body;
}

/// Replaces every `x` in `xs` by `op(x)`: each registry unary op's vector kernel.
pub fn unary_in_place(op: UnaryOp, xs: &mut [f32]) {
    if compute_bound(op) {
        unary_in_place_avx512(op, xs)
    } else {
        unary_in_place_avx2(op, xs)
    }
}

dispatch_avx2! {
    fn unary_into_avx2(op: UnaryOp, xs: &[f32], out: &mut [f32]) = unary_into_body;
}

dispatch_avx512! {
    fn unary_into_avx512(op: UnaryOp, xs: &[f32], out: &mut [f32]) = unary_into_body;
}

/// Writes `op(xs[i])` to `out[i]` (`xs` at least as long as `out`).
pub fn unary_into(op: UnaryOp, xs: &[f32], out: &mut [f32]) {
    if compute_bound(op) {
        unary_into_avx512(op, xs, out)
    } else {
        unary_into_avx2(op, xs, out)
    }
}

/// One loop per target, the target chosen outside it: a per-element match on it kept the
/// loop from vectorising (and the closure from inlining).
#[inline(always)]
fn cast_into_body(to: CastTarget, xs: &[f32], out: &mut [f32]) {
    let xs = &xs[..out.len()];
    match to {
        CastTarget::I64 => map(xs, out, |x| CastTarget::I64.apply(x)),
        CastTarget::I32 => map(xs, out, |x| CastTarget::I32.apply(x)),
        CastTarget::Bool => map(xs, out, |x| CastTarget::Bool.apply(x)),
        other => map(xs, out, |x| other.apply(x)),
    }
}

dispatch_avx2! {
    fn cast_generic(to: CastTarget, xs: &[f32], out: &mut [f32]) = cast_into_body;
}

/// Writes the value `to` holds for `xs[i]` to `out[i]` (`xs` at least as long as `out`); f16
/// and bf16 round with the CPU's conversion instructions where it has them.
pub fn cast_into(to: CastTarget, xs: &[f32], out: &mut [f32]) {
    match to {
        CastTarget::F16 => round_through_f16(xs, out),
        CastTarget::Bf16 => round_through_bf16(xs, out),
        // Every f32 value is an f32 (and an f64) value: a copy.
        CastTarget::F32 | CastTarget::F64 => out.copy_from_slice(&xs[..out.len()]),
        _ => cast_generic(to, xs, out),
    }
}

#[inline(always)]
fn zip(lhs: impl Operand, rhs: &[f32], dst: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let n = dst.len().min(rhs.len());
    for i in 0..n {
        dst[i] = f(lhs.at(dst, i), rhs[i]);
    }
}

#[inline(always)]
fn binary_body(op: BinaryOp, lhs: impl Operand, rhs: &[f32], dst: &mut [f32]) {
    match op {
        BinaryOp::Add => zip(lhs, rhs, dst, |a, b| a + b),
        BinaryOp::Sub => zip(lhs, rhs, dst, |a, b| a - b),
        BinaryOp::Mul => zip(lhs, rhs, dst, |a, b| a * b),
        BinaryOp::Div => zip(lhs, rhs, dst, |a, b| a / b),
        other => zip(lhs, rhs, dst, |a, b| apply_binary(other, a, b)),
    }
}

#[inline(always)]
fn binary_in_place_body(op: BinaryOp, acc: &mut [f32], rhs: &[f32]) {
    binary_body(op, InPlace, rhs, acc)
}

#[inline(always)]
fn binary_into_body(op: BinaryOp, lhs: &[f32], rhs: &[f32], out: &mut [f32]) {
    let n = out.len();
    binary_body(op, &lhs[..n], &rhs[..n], out)
}

dispatch_avx2! {
    /// Replaces `acc[i]` by `op(acc[i], rhs[i])` over the common length.
    pub fn binary_in_place(op: BinaryOp, acc: &mut [f32], rhs: &[f32]) = binary_in_place_body;
}

dispatch_avx2! {
    /// Writes `op(lhs[i], rhs[i])` to `out[i]` (both operands at least as long as `out`).
    pub fn binary_into(op: BinaryOp, lhs: &[f32], rhs: &[f32], out: &mut [f32]) = binary_into_body;
}
