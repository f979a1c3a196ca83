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

    /// The same math with every rounding to f16 or bf16 left out (those casts become the f32
    /// identity), for `--check-numerics` to say whether the program stays finite in f32; `None`
    /// when the program rounds to neither.
    pub fn widened(&self) -> Option<Program> {
        let narrow = |to: CastTarget| matches!(to, CastTarget::F16 | CastTarget::Bf16);
        let rounds = self
            .instrs
            .iter()
            .any(|i| matches!(*i, Instr::Cast { to, .. } if narrow(to)));
        rounds.then(|| Program {
            instrs: self
                .instrs
                .iter()
                .map(|i| match *i {
                    Instr::Cast { to, x } if narrow(to) => Instr::Cast {
                        to: CastTarget::F32,
                        x,
                    },
                    ref other => other.clone(),
                })
                .collect(),
        })
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

    #[test]
    fn widening_drops_only_low_precision_roundings() {
        let cast = |to, x| Instr::Cast { to, x };
        let program = Program {
            instrs: vec![
                Instr::Input(0),
                cast(CastTarget::F16, 0),
                Instr::Unary {
                    op: UnaryOp::Exp,
                    x: 1,
                },
                cast(CastTarget::Bf16, 2),
                cast(CastTarget::I32, 3),
            ],
        };
        let wide = program.widened().expect("it rounds to f16 and bf16");
        assert_eq!(wide.instrs[1], cast(CastTarget::F32, 0));
        assert_eq!(wide.instrs[3], cast(CastTarget::F32, 2));
        assert_eq!(wide.instrs[4], cast(CastTarget::I32, 3));
        assert_eq!(
            (wide.instrs[0].clone(), wide.instrs[2].clone()),
            (program.instrs[0].clone(), program.instrs[2].clone())
        );
        let f32_only = Program {
            instrs: vec![Instr::Input(0), cast(CastTarget::F64, 0)],
        };
        assert_eq!(f32_only.widened(), None);
    }
}
