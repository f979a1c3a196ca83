//! The `--check-numerics` diagnostic (E0614), the same for every command that runs a module: which
//! op first produced a NaN or an infinity, where it was written, its operands' ranges, and —
//! for an op computed in f16/bf16 — whether computing it in f32 stays finite.

use mslc_core::diag::{Code, Diagnostic};
use mslc_core::ops::DType;
use mslc_core::program::Loc;
use mslc_exec::numerics::NumericsFault;
use mslc_ir::autodiff::GRAD_MARK;

/// What to tell the user about a fault: the diagnostic's message, label and help, and where the
/// op was written when the module knows.
#[derive(Clone, Debug, PartialEq)]
pub struct NumericsReport {
    /// The first line: op, instance path, how many elements.
    pub message: String,
    /// What the operands held and what to try.
    pub help: String,
    /// Where the op was written.
    pub loc: Option<Loc>,
}

impl NumericsReport {
    /// The report of `fault`.
    pub fn of(fault: &NumericsFault) -> NumericsReport {
        let operands: Vec<String> = fault
            .inputs
            .iter()
            .enumerate()
            .map(|(i, range)| format!("operand {i} {range}"))
            .collect();
        let poisoned = fault.inputs.iter().any(|r| r.nonfinite > 0);
        let verdict = match (&fault.in_f32, poisoned) {
            (_, true) => "an operand already holds NaN or infinity: it came in with an input or \
                 a parameter (this is the first step whose result is not finite)"
                .to_string(),
            (Some(f32_result), false) if f32_result.nonfinite == 0 => format!(
                "computed in f32 on the same operands the result stays finite (abs max {}), \
                 beyond the range of {}: keep this op in f32 (the policy's `keep_f32`, or `@f32` \
                 on the call) or lower the loss scale",
                f32_result
                    .abs_max
                    .map_or("–".to_string(), |m| format!("{m:e}")),
                match fault.result.ty.dtype {
                    d @ (DType::F16 | DType::BF16) => d.to_string(),
                    _ => "its f16/bf16 steps".to_string(),
                }
            ),
            (Some(_), false) => {
                "computed in f32 on the same operands it is not finite either: the operands \
                 are finite but the op's math overflows or is undefined on them"
                    .to_string()
            }
            (None, false) => {
                "the operands are finite: the op's math overflows or is undefined on them"
                    .to_string()
            }
        };
        // A backward step's origin is its forward op's, marked.
        let (origin, pass) = match fault.origin.strip_suffix(GRAD_MARK) {
            Some(forward) => (forward, "backward"),
            None => (fault.origin.as_str(), "forward"),
        };
        let place = if origin.is_empty() {
            String::new()
        } else {
            format!(" in `{origin}`")
        };
        NumericsReport {
            message: format!(
                "`{}`{place} produced NaN or infinity ({pass}, step {}): {} of its {} elements, the first at index {}",
                fault.op,
                fault.step,
                fault.result.nonfinite,
                fault.result.ty.numel(),
                fault.first_index
            ),
            help: format!("{}; {verdict}", operands.join("; ")),
            loc: fault.loc.map(|l| l.loc()),
        }
    }

    /// The diagnostic pointing at the op's source, when the module knows where it was written.
    pub fn diagnostic(&self) -> Option<Diagnostic> {
        let loc = self.loc?;
        Some(
            Diagnostic::error(Code::E0614, loc.file, loc.span, self.message.clone())
                .with_label("the first non-finite value comes from this op")
                .with_help(self.help.clone()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mslc_artifact::SourceLoc;
    use mslc_core::ops::{DType, Op, TensorType};
    use mslc_exec::numerics::{F32Result, OperandRange};

    fn range(dtype: DType, abs_max: f32, nonfinite: usize) -> OperandRange {
        OperandRange {
            ty: TensorType::new(dtype, vec![4]),
            min: Some(-abs_max),
            max: Some(abs_max),
            abs_max: Some(abs_max),
            nonfinite,
        }
    }

    fn fault(in_f32: Option<F32Result>, operand_nonfinite: usize) -> NumericsFault {
        NumericsFault {
            step: 7,
            op: Op::Matmul,
            origin: "model.layers.3.mlp.down_proj".to_string(),
            loc: Some(SourceLoc {
                file: 0,
                start: 10,
                end: 20,
            }),
            result: range(DType::F16, 1.0, 2),
            first_index: 1,
            inputs: vec![range(DType::F16, 300.0, operand_nonfinite)],
            in_f32,
        }
    }

    #[test]
    fn says_whether_f32_would_have_stayed_finite() {
        let overflow = NumericsReport::of(&fault(
            Some(F32Result {
                nonfinite: 0,
                abs_max: Some(90000.0),
            }),
            0,
        ));
        assert!(overflow
            .message
            .starts_with("`matmul` in `model.layers.3.mlp.down_proj` produced NaN or infinity (forward, step 7): 2 of its 4 elements"));
        assert!(overflow
            .help
            .contains("stays finite (abs max 9e4), beyond the range of f16"));
        let d = overflow.diagnostic().expect("has a location");
        assert_eq!(d.code, Code::E0614);
        let math = NumericsReport::of(&fault(
            Some(F32Result {
                nonfinite: 2,
                abs_max: None,
            }),
            0,
        ));
        assert!(math.help.contains("it is not finite either"));
        let poisoned = NumericsReport::of(&fault(None, 1));
        assert!(poisoned.help.contains("an operand already holds NaN"));
        let mut backward = fault(None, 0);
        backward.origin.push_str(GRAD_MARK);
        assert!(NumericsReport::of(&backward)
            .message
            .starts_with("`matmul` in `model.layers.3.mlp.down_proj` produced NaN or infinity (backward, step 7)"));
    }
}
