//! Fast in-place elementwise ops over slices, compiled for AVX2+FMA when the CPU has them.

use super::op::{apply_binary, BinaryOp, CastTarget, UnaryOp};
use crate::cpu::dispatch_avx2;
use crate::math;

#[inline(always)]
fn map(xs: &mut [f32], f: impl Fn(f32) -> f32) {
    for x in xs {
        *x = f(*x);
    }
}

#[inline(always)]
fn unary_body(op: UnaryOp, xs: &mut [f32]) {
    match op {
        UnaryOp::Neg => map(xs, |x| -x),
        UnaryOp::Exp => map(xs, math::exp),
        UnaryOp::Log => map(xs, math::log),
        UnaryOp::Sqrt => map(xs, f32::sqrt),
        UnaryOp::Rsqrt => map(xs, |x| 1.0 / x.sqrt()),
        UnaryOp::Reciprocal => map(xs, |x| 1.0 / x),
        UnaryOp::Abs => map(xs, f32::abs),
        UnaryOp::Tanh => map(xs, math::tanh),
        UnaryOp::Sigmoid => map(xs, math::sigmoid),
        UnaryOp::Relu => map(xs, math::relu),
        UnaryOp::Gelu => map(xs, math::gelu),
        UnaryOp::GeluTanh => map(xs, math::gelu_tanh),
        UnaryOp::Silu => map(xs, math::silu),
        UnaryOp::Erf => map(xs, math::erf),
        UnaryOp::Softplus => map(xs, math::softplus),
        UnaryOp::Sign => map(xs, math::sign),
    }
}

dispatch_avx2! {
    /// Replaces every `x` in `xs` by `op(x)`: each registry unary op's vector kernel.
    pub fn unary_in_place(op: UnaryOp, xs: &mut [f32]) = unary_body;
}

#[inline(always)]
fn cast_body(to: CastTarget, xs: &mut [f32]) {
    map(xs, |x| to.apply(x));
}

dispatch_avx2! {
    /// Replaces every `x` in `xs` by the value `to` holds for it.
    pub fn cast_in_place(to: CastTarget, xs: &mut [f32]) = cast_body;
}

#[inline(always)]
fn zip(acc: &mut [f32], rhs: &[f32], f: impl Fn(f32, f32) -> f32) {
    for (a, &b) in acc.iter_mut().zip(rhs) {
        *a = f(*a, b);
    }
}

#[inline(always)]
fn binary_body(op: BinaryOp, acc: &mut [f32], rhs: &[f32]) {
    match op {
        BinaryOp::Add => zip(acc, rhs, |a, b| a + b),
        BinaryOp::Sub => zip(acc, rhs, |a, b| a - b),
        BinaryOp::Mul => zip(acc, rhs, |a, b| a * b),
        BinaryOp::Div => zip(acc, rhs, |a, b| a / b),
        other => zip(acc, rhs, |a, b| apply_binary(other, a, b)),
    }
}

dispatch_avx2! {
    /// Replaces `acc[i]` by `op(acc[i], rhs[i])` over the common length.
    pub fn binary_in_place(op: BinaryOp, acc: &mut [f32], rhs: &[f32]) = binary_body;
}
