//! Reference `fused_elementwise`: every input broadcast in full, then the program run one
//! element at a time with the reference scalar ops.

use super::elementwise::{broadcast_values, unary_scalar};
use crate::elementwise::op::apply_binary;
use crate::elementwise::program::{Instr, Program};
use crate::error::KernelResult;
use crate::shape::check_len;
use crate::tensor::{Tensor, TensorRef};

/// Evaluates `program` over `inputs` broadcast together.
pub fn fused_elementwise(program: &Program, inputs: &[TensorRef<'_>]) -> KernelResult<Tensor> {
    program.validate(inputs.len())?;
    for x in inputs {
        check_len("fused_elementwise", "input", x.data.len(), x.shape)?;
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(|x| x.shape).collect();
    let shape = program.output_shape(&shapes)?;
    let values: Vec<Vec<f32>> = inputs
        .iter()
        .map(|&x| broadcast_values(x, &shape))
        .collect();
    let count: usize = shape.iter().product();
    let mut regs = Vec::with_capacity(program.instrs.len());
    let data = (0..count)
        .map(|e| {
            regs.clear();
            for instr in &program.instrs {
                let v = match *instr {
                    Instr::Input(n) => values[n][e],
                    Instr::Const(c) => c,
                    Instr::Unary { op, x } => unary_scalar(op, regs[x]),
                    Instr::Cast { to, x } => to.apply(regs[x]),
                    Instr::Binary { op, a, b } => apply_binary(op, regs[a], regs[b]),
                };
                regs.push(v);
            }
            *regs.last().expect("validated: non-empty")
        })
        .collect();
    Tensor::new("fused_elementwise", shape, data)
}
