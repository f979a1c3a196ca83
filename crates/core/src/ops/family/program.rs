//! The `program` of a `fused_elementwise` op: a chain of elementwise ops over the fused op's
//! inputs, evaluated in one pass. Text form (what the attribute holds):
//!
//! ```text
//! silu(x0); mul(t0, x1); cast<bf16>(t1)
//! ```
//!
//! `xN` reads input N of the fused op, `tN` the result of step N; the last step is the
//! output. Only ops the registry marks elementwise and without attributes may appear, plus
//! `cast<DTYPE>`. Types are inferred step by step with the registry's own rules.

use crate::ops::attrs::Attrs;
use crate::ops::error::OpError;
use crate::ops::{infer, DType, Op, TensorType};
use std::fmt;

/// Where a step reads an argument from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// Input `N` of the fused op (`xN`).
    Input(usize),
    /// The result of an earlier step (`tN`).
    Step(usize),
}

/// One elementwise op application inside a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    /// The target dtype of a `cast`; `None` for every other op.
    pub cast_to: Option<DType>,
    pub args: Vec<Operand>,
}

impl Step {
    /// The attributes the step's op is applied with.
    pub fn attrs(&self) -> Attrs {
        match self.cast_to {
            Some(d) => Attrs::new().with("dtype", d),
            None => Attrs::new(),
        }
    }
}

/// A parsed `fused_elementwise` program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementwiseProgram {
    pub steps: Vec<Step>,
}

impl ElementwiseProgram {
    /// Parses the text form, checking ops, arities and that every `tN` names an earlier step.
    pub fn parse(text: &str) -> Result<ElementwiseProgram, OpError> {
        let mut steps = Vec::new();
        for (i, part) in text.split(';').enumerate() {
            let step = parse_step(part.trim(), i)
                .map_err(|m| OpError::new(format!("program step {i} `{}`: {m}", part.trim())))?;
            steps.push(step);
        }
        Ok(ElementwiseProgram { steps })
    }

    /// The type of every step's result for the given inputs (the last is the output);
    /// errors name the step and point at the fused op's input when a step argument is one.
    pub fn step_types(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, OpError> {
        let mut used = vec![false; inputs.len()];
        let mut types: Vec<TensorType> = Vec::with_capacity(self.steps.len());
        for (i, step) in self.steps.iter().enumerate() {
            let mut args = Vec::with_capacity(step.args.len());
            for &a in &step.args {
                args.push(match a {
                    Operand::Input(n) => {
                        let t = inputs.get(n).ok_or_else(|| {
                            OpError::new(format!(
                                "program step {i} `{step}` reads x{n}, but only {} inputs are \
                                 given",
                                inputs.len()
                            ))
                        })?;
                        used[n] = true;
                        t.clone()
                    }
                    Operand::Step(n) => types[n].clone(),
                });
            }
            let out = infer(step.op, &step.attrs(), &args).map_err(|e| OpError {
                message: format!("program step {i} `{step}`: {}", e.message),
                input: e.input.and_then(|slot| match step.args.get(slot) {
                    Some(Operand::Input(n)) => Some(*n),
                    _ => None,
                }),
                help: e.help,
            })?;
            types.extend(out);
        }
        if let Some(n) = used.iter().position(|u| !u) {
            return Err(OpError::at(n, format!("program never reads x{n}")));
        }
        Ok(types)
    }

    /// Flops of one evaluation: each step's flops per element times its element count.
    pub fn flops(&self, step_types: &[TensorType]) -> u64 {
        self.steps
            .iter()
            .zip(step_types)
            .map(|(s, t)| {
                let k = s.op.spec().flops_per_element().unwrap_or(0);
                k.saturating_mul(t.numel())
            })
            .fold(0u64, u64::saturating_add)
    }
}

fn parse_step(text: &str, index: usize) -> Result<Step, String> {
    let open = text.find('(').ok_or("expected `op(args)`")?;
    let body = text[open + 1..]
        .strip_suffix(')')
        .ok_or("expected `)` at the end")?;
    let head = text[..open].trim();
    let (name, cast_to) = match head.split_once('<') {
        Some((name, rest)) => {
            let d = rest
                .strip_suffix('>')
                .ok_or("expected `>` after the dtype")?;
            let dtype =
                DType::parse(d.trim()).ok_or_else(|| format!("unknown dtype `{}`", d.trim()))?;
            (name.trim(), Some(dtype))
        }
        None => (head, None),
    };
    let op = Op::from_name(name).ok_or_else(|| format!("unknown op `{name}`"))?;
    let spec = op.spec();
    let allowed = spec.elementwise && (op == Op::Cast || spec.attrs.is_empty());
    if !allowed {
        return Err(format!("`{name}` cannot appear in an elementwise program"));
    }
    if (op == Op::Cast) != cast_to.is_some() {
        return Err("only `cast` takes a dtype, written `cast<f32>(..)`".into());
    }
    let args = body
        .split(',')
        .map(|a| parse_operand(a.trim(), index))
        .collect::<Result<Vec<_>, _>>()?;
    if !spec.arity.accepts(args.len()) {
        return Err(format!(
            "`{name}` takes {}, got {}",
            spec.arity.describe(),
            args.len()
        ));
    }
    Ok(Step { op, cast_to, args })
}

fn parse_operand(text: &str, step: usize) -> Result<Operand, String> {
    let number = |s: &str| s.parse::<usize>().ok();
    match (text.get(..1), text.get(1..).and_then(number)) {
        (Some("x"), Some(n)) => Ok(Operand::Input(n)),
        (Some("t"), Some(n)) if n < step => Ok(Operand::Step(n)),
        (Some("t"), Some(n)) => Err(format!("t{n} is not an earlier step")),
        _ => Err(format!("expected `xN` or `tN`, got `{text}`")),
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Input(n) => write!(f, "x{n}"),
            Operand::Step(n) => write!(f, "t{n}"),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.op.name())?;
        if let Some(d) = self.cast_to {
            write!(f, "<{d}>")?;
        }
        f.write_str("(")?;
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for ElementwiseProgram {
    /// The canonical text form, which [`ElementwiseProgram::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::family::testing::*;

    #[test]
    fn parses_and_prints_canonically() {
        let p = ElementwiseProgram::parse(" silu( x0 );mul(t0,x1) ; cast<bf16>(t1)").unwrap();
        assert_eq!(p.to_string(), "silu(x0); mul(t0, x1); cast<bf16>(t1)");
        assert_eq!(ElementwiseProgram::parse(&p.to_string()).unwrap(), p);
        assert_eq!(p.steps[2].cast_to, Some(DType::BF16));
    }

    #[test]
    fn rejects_malformed_programs() {
        let msg = |s: &str| ElementwiseProgram::parse(s).unwrap_err().message;
        assert_eq!(msg(""), "program step 0 ``: expected `op(args)`");
        assert_eq!(
            msg("exp(x0); foo(t0)"),
            "program step 1 `foo(t0)`: unknown op `foo`"
        );
        assert_eq!(
            msg("matmul(x0, x1)"),
            "program step 0 `matmul(x0, x1)`: `matmul` cannot appear in an elementwise program"
        );
        assert!(msg("exp(t0)").contains("t0 is not an earlier step"));
        assert!(msg("exp(y0)").contains("expected `xN` or `tN`, got `y0`"));
        assert!(msg("add(x0)").contains("`add` takes 2 inputs, got 1"));
        assert!(msg("cast(x0)").contains("only `cast` takes a dtype"));
        assert!(msg("exp<f32>(x0)").contains("only `cast` takes a dtype"));
        assert!(msg("cast<f8>(x0)").contains("unknown dtype `f8`"));
        assert!(msg("exp(x0").contains("expected `)`"));
    }

    #[test]
    fn infers_step_types_with_registry_rules() {
        let p = ElementwiseProgram::parse("silu(x0); mul(t0, x1); cast<f16>(t1)").unwrap();
        let types = p.step_types(&[f32t(&[2, 8]), f32t(&[8])]).unwrap();
        assert_eq!(
            types,
            vec![f32t(&[2, 8]), f32t(&[2, 8]), t(DType::F16, &[2, 8])]
        );
        assert_eq!(p.flops(&types), 6 * 16 + 16 + 16);
        let e = p.step_types(&[f32t(&[2, 8]), f32t(&[3])]).unwrap_err();
        assert_eq!(
            e.message,
            "program step 1 `mul(t0, x1)`: mul: shapes do not broadcast: a is [2, 8], b is [3]"
        );
        assert_eq!(e.input, Some(1));
        let e = p.step_types(&[f32t(&[2, 8])]).unwrap_err();
        assert!(e.message.contains("reads x1, but only 1 inputs are given"));
        let e = p
            .step_types(&[f32t(&[2]), f32t(&[2]), f32t(&[2])])
            .unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.input),
            ("program never reads x2", Some(2))
        );
    }
}
