//! The `fused_elementwise` program: a straight-line list of instructions over registers, one
//! register per instruction (SSA), the last one being the result. Inputs broadcast to the
//! output shape (NumPy rules).

use serde::{Deserialize, Serialize};

use super::op::{BinaryOp, CastTarget, UnaryOp};
use crate::error::{KernelError, KernelResult};
use crate::shape::broadcast_shapes;

/// One instruction; it defines the register numbered by its position in the program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instr {
    /// Input number `0` of the op, broadcast to the output shape.
    Input(usize),
    /// A constant.
    Const(f32),
    /// `op(register x)`.
    Unary {
        /// The op.
        op: UnaryOp,
        /// Its operand register.
        x: usize,
    },
    /// Register `x` rounded to what `to` holds.
    Cast {
        /// The dtype whose values it takes.
        to: CastTarget,
        /// Its operand register.
        x: usize,
    },
    /// `op(register a, register b)`.
    Binary {
        /// The op.
        op: BinaryOp,
        /// Left operand register.
        a: usize,
        /// Right operand register.
        b: usize,
    },
}

/// A chain of elementwise ops evaluated in one pass; the last instruction is the result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The instructions, in evaluation order.
    pub instrs: Vec<Instr>,
}

impl Program {
    /// Checks that the program is non-empty, reads only earlier registers and existing inputs.
    pub fn validate(&self, inputs: usize) -> KernelResult<()> {
        const OP: &str = "fused_elementwise";
        if self.instrs.is_empty() {
            return Err(KernelError::new(OP, "the program has no instructions"));
        }
        for (i, instr) in self.instrs.iter().enumerate() {
            let bad_reg = |r: usize| {
                (r >= i).then(|| {
                    KernelError::new(
                        OP,
                        format!("instruction {i} reads register {r}, not yet defined"),
                    )
                })
            };
            let err = match *instr {
                Instr::Input(n) if n >= inputs => Some(KernelError::new(
                    OP,
                    format!("instruction {i} reads input {n} of {inputs}"),
                )),
                Instr::Input(_) | Instr::Const(_) => None,
                Instr::Unary { x, .. } | Instr::Cast { x, .. } => bad_reg(x),
                Instr::Binary { a, b, .. } => bad_reg(a).or_else(|| bad_reg(b)),
            };
            if let Some(e) = err {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The output shape: the broadcast of every input's shape.
    pub fn output_shape(&self, input_shapes: &[&[usize]]) -> KernelResult<Vec<usize>> {
        broadcast_shapes("fused_elementwise", input_shapes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_catches_bad_references() {
        let ok = Program {
            instrs: vec![
                Instr::Input(0),
                Instr::Const(2.0),
                Instr::Binary {
                    op: BinaryOp::Mul,
                    a: 0,
                    b: 1,
                },
                Instr::Unary {
                    op: UnaryOp::Exp,
                    x: 2,
                },
            ],
        };
        assert!(ok.validate(1).is_ok());
        assert!(ok.validate(0).is_err());
        assert!(Program::default().validate(1).is_err());
        let forward = Program {
            instrs: vec![Instr::Unary {
                op: UnaryOp::Neg,
                x: 0,
            }],
        };
        assert!(forward.validate(1).is_err());
        let json = serde_json::to_string(&ok).unwrap();
        assert_eq!(serde_json::from_str::<Program>(&json).unwrap(), ok);
    }
}
