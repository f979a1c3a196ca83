//! Scalar evaluation of elementwise ops, for constant folding.

use super::Op;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// A float elementwise op evaluated on f64 operands: what constant folding (in the checker
/// and the `fold` pass) computes; `None` for ops it does not evaluate.
pub fn eval_scalar(op: Op, a: &[f64]) -> Option<f64> {
    let x = *a.first()?;
    let y = || a.get(1).copied();
    Some(match op {
        Op::Add => x + y()?,
        Op::Sub => x - y()?,
        Op::Mul => x * y()?,
        Op::Div => x / y()?,
        Op::Pow => x.powf(y()?),
        Op::Maximum => x.max(y()?),
        Op::Minimum => x.min(y()?),
        Op::Neg => -x,
        Op::Exp => x.exp(),
        Op::Log => x.ln(),
        Op::Sqrt => x.sqrt(),
        Op::Rsqrt => 1.0 / x.sqrt(),
        Op::Reciprocal => 1.0 / x,
        Op::Abs => x.abs(),
        Op::Tanh => x.tanh(),
        Op::Sigmoid => sigmoid(x),
        Op::Relu => x.max(0.0),
        Op::Silu => x * sigmoid(x),
        Op::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        _ => return None,
    })
}
